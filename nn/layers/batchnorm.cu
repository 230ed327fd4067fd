/*
 * Batch normalisation's own kernels (nn/layers/batchnorm_kernels.h): the
 * sums in tiles (a block 32 channels of a tile, a warp 32 neighbouring
 * channels of a position, the lanes' tree in shared memory), then the
 * tiles' partials added one thread a channel; the statistics one thread a
 * channel; the output and the input gradient one thread an element.
 */
#include "nn/layers/batchnorm_kernels.h"

#ifdef __CUDACC__
/* Tile blockIdx.x, channels blockIdx.y * 32 + threadIdx.x: lane threadIdx.y's
 * share, the lanes' tree, the tile's partial into part. */
__global__ void bn_tile_kernel(bn_tile_args a) {
    int ch = (int)blockIdx.y * DSRT_KB_BN_CHANS + (int)threadIdx.x;
    size_t t = blockIdx.x;
    float s = 0.0f, q = 0.0f;
    if (ch < a.d.c)
        dsrt_kb_bn_lane(&a.d, a.x, a.dy, a.y, a.leak, a.dy ? a.mean[ch] : 0.0f,
                        a.dy ? a.inv[ch] : 0.0f, t, ch, (int)threadIdx.y, &s, &q);
    tile_part(s, q, a.part, t, a.d.c, ch);
}

/* Channel ch's totals: the forward's sums (and the count), or the
 * backward's with the parameter gradients. */
__global__ void bn_total_kernel(bn_total_args a) {
    for (size_t ch = tid(); ch < (size_t)a.c; ch += stride()) {
        double s, q;
        dsrt_kb_bn_total(a.part, a.tiles, a.c, (int)ch, &s, &q);
        a.sums[ch] = s;
        a.sums[a.c + ch] = q;
        if (a.dshift) a.dshift[ch] = (float)s;
        if (a.dscale) a.dscale[ch] = (float)q;
        if (ch == 0 && a.count >= 0) a.sums[2 * a.c] = a.count;
    }
}

__global__ void bn_stats_kernel(bn_stats_args a) {
    for (size_t k = tid(); k < (size_t)a.c; k += stride())
        dsrt_kb_bn_stats(a.sums, a.c, a.eps, a.momentum, a.mean, a.var, a.inv, a.run_mean,
                         a.run_var, k);
}

__global__ void bn_bwd_dx_kernel(bn_bwd_dx_args a) {
    double inv_m = 1.0 / *a.count;
    for (size_t i = tid(); i < a.total; i += stride())
        dsrt_kb_bn_bwd_dx(&a.d, a.x, a.dy, a.y, a.leak, a.mean, a.inv, a.scale, a.sums, inv_m, a.dx,
                          i);
}

__global__ void bn_apply_kernel(bn_apply_args a) {
    for (size_t i = tid(); i < a.total; i += stride())
        dsrt_kb_bn_apply(&a.d, a.x, a.mean, a.inv, a.var, a.eps, a.scale, a.shift, a.relu, a.leak,
                         a.y, i);
}
#endif

/* The sums forward (dy NULL) or backward: the tiles, then their totals. */
static cudaError_t bn_tiles(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                            float leak, const float *mean, const float *inv, double *sums,
                            float *dscale, float *dshift, float *work, cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd) || !work) return cudaErrorInvalidValue;
    if (!xd->c) return cudaSuccess;
    bn_tile_args a = {*xd, x, dy, y, leak, mean, inv, work};
    bn_total_args t = {work,
                       dsrt_kb_bn_tiles(xd),
                       xd->c,
                       sums,
                       dy ? -1.0 : (double)((size_t)xd->n * xd->h * xd->w),
                       dscale,
                       dshift};
    cudaError_t e = DSRT_K_LAUNCH(
        bn_tile_kernel,
        dim3((unsigned)t.tiles, (unsigned)((xd->c + DSRT_KB_BN_CHANS - 1) / DSRT_KB_BN_CHANS)),
        dim3(DSRT_KB_BN_CHANS, DSRT_KB_BN_LANES), stream, a);
    if (e != cudaSuccess) return e;
    return DSRT_K_LAUNCH(bn_total_kernel, grid_for((size_t)xd->c), THREADS, stream, t);
}

cudaError_t dsrt_k_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work,
                           cudaStream_t stream) {
    return bn_tiles(xd, x, NULL, NULL, 0.0f, NULL, NULL, sums, NULL, NULL, work, stream);
}

cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                            float *var, float *inv, float *run_mean, float *run_var,
                            cudaStream_t stream) {
    if (c < 0) return cudaErrorInvalidValue;
    if (!c) return cudaSuccess;
    bn_stats_args a = {sums, c, eps, momentum, mean, var, inv, run_mean, run_var};
    return DSRT_K_LAUNCH(bn_stats_kernel, grid_for((size_t)c), THREADS, stream, a);
}

cudaError_t dsrt_k_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                               float leak, const float *mean, const float *inv, double *sums,
                               float *dscale, float *dshift, float *work, cudaStream_t stream) {
    if (!dy || !mean || !inv) return cudaErrorInvalidValue;
    return bn_tiles(xd, x, dy, y, leak, mean, inv, sums, dscale, dshift, work, stream);
}

cudaError_t dsrt_k_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                             float leak, const float *mean, const float *inv, const float *scale,
                             const double *sums, const double *count, void *dx,
                             cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd)) return cudaErrorInvalidValue;
    bn_bwd_dx_args a = {*xd, x, dy, y, leak, mean, inv, scale, sums, count, dsrt_kb_count(xd), dx};
    if (!a.total) return cudaSuccess;
    return DSRT_K_LAUNCH(bn_bwd_dx_kernel, grid_for(a.total), THREADS, stream, a);
}

cudaError_t dsrt_k_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean,
                            const float *inv, const float *var, float eps, const float *scale,
                            const float *shift, int relu, float leak, void *y,
                            cudaStream_t stream) {
    if (!dsrt_kb_bn_ok(xd) || (!inv && !var)) return cudaErrorInvalidValue;
    bn_apply_args a = {*xd, x, mean, inv, var, eps, scale, shift, relu, leak, y, dsrt_kb_count(xd)};
    if (!a.total) return cudaSuccess;
    return DSRT_K_LAUNCH(bn_apply_kernel, grid_for(a.total), THREADS, stream, a);
}
