/*
 * The input layer's kernels (nn/layers/input.c), which its GPU part
 * (input_cuda.c) runs on each staged batch: the pipeline's uint8 NHWC
 * bytes, or a float32 NCHW batch, to normalised activations in the
 * backend's layout and type. As nn/kernels.h lays a kernel out: the bodies,
 * the kernels' arguments, their runs on the host, and the launchers
 * (nn/layers/input.cu).
 */
#ifndef DSRT_NN_LAYERS_INPUT_KERNELS_H
#define DSRT_NN_LAYERS_INPUT_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// The input stage: one thread an element

static inline int dsrt_kb_input_ok(int norm, const float *stats, const dsrt_k_desc *yd) {
    if (!dsrt_kb_desc_ok(yd) || norm < DSRT_NORM_NONE || norm > DSRT_NORM_RESCALE_SYMMETRIC)
        return 0;
    return norm == DSRT_NORM_NONE || stats;
}

static inline int dsrt_kb_input_u8_ok(const dsrt_k_pixel *pix, int norm, const float *stats,
                                      const dsrt_k_desc *yd) {
    return pix && dsrt_kb_input_ok(norm, stats, yd) && yd->c <= DSRT_K_PIXEL_CH_MAX;
}

/* The input layer's normalisation of v, channel ch. */
static inline DSRT_HOST_DEVICE float dsrt_kb_normalise(int norm, const float *stats, int c, int ch,
                                                       float v) {
    if (norm == DSRT_NORM_NONE) return v;
    float a, o;
    dsrt_input_affine(norm, stats, c, ch, &a, &o);
    return dsrt_input_apply(a, o, v);
}

/* Element i of y (yd) from the uint8 NHWC batch x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_input_u8(const uint8_t *x, const dsrt_k_pixel *pix,
                                                     int norm, const float *stats,
                                                     const dsrt_k_desc *yd, void *y, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    uint8_t p = x[dsrt_kb_index_of(k, yd->c, yd->h, yd->w, 1)];
    float v = DSRT_FDIV(DSRT_FSUB((float)p, pix->sub[k.ch]), pix->div[k.ch]);
    dsrt_kb_store(y, yd->type, i, dsrt_kb_normalise(norm, stats, yd->c, k.ch, v));
}

/* Element i of y (yd) from the float NCHW batch x. */
static inline DSRT_HOST_DEVICE void dsrt_kb_input_f32(const float *x, int norm, const float *stats,
                                                      const dsrt_k_desc *yd, void *y, size_t i) {
    dsrt_kb_coord k = dsrt_kb_coord_of(i, yd->c, yd->h, yd->w, yd->nhwc);
    float v = x[dsrt_kb_index_of(k, yd->c, yd->h, yd->w, 0)];
    dsrt_kb_store(y, yd->type, i, dsrt_kb_normalise(norm, stats, yd->c, k.ch, v));
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    const uint8_t *x;
    dsrt_k_pixel pix;
    int norm;
    const float *stats;
    dsrt_k_desc yd;
    void *y;
    size_t count;
} input_u8_args;

typedef struct {
    const float *x;
    int norm;
    const float *stats;
    dsrt_k_desc yd;
    void *y;
    size_t count;
} input_f32_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void input_u8_kernel_host(const void *p) {
    const input_u8_args *a = (const input_u8_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_input_u8(a->x, &a->pix, a->norm, a->stats, &a->yd, a->y, i);
}

static inline void input_f32_kernel_host(const void *p) {
    const input_f32_args *a = (const input_f32_args *)p;
    for (size_t i = 0; i < a->count; i++)
        dsrt_kb_input_f32(a->x, a->norm, a->stats, &a->yd, a->y, i);
}

static inline int dsrt_kh_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm,
                                   const float *stats, const dsrt_k_desc *yd, void *y) {
    if (!dsrt_kb_input_u8_ok(pix, norm, stats, yd)) return -EINVAL;
    input_u8_args a = {x, *pix, norm, stats, *yd, y, dsrt_kb_count(yd)};
    input_u8_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_input_f32(const float *x, int norm, const float *stats,
                                    const dsrt_k_desc *yd, void *y) {
    if (!dsrt_kb_input_ok(norm, stats, yd)) return -EINVAL;
    input_f32_args a = {x, norm, stats, *yd, y, dsrt_kb_count(yd)};
    input_f32_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/*
 * The input stage from the pipeline's uint8 batch x (yd->n, yd->h, yd->w,
 * yd->c), NHWC, to y (yd: any layout and type): each byte through pix, then
 * the input layer's normalisation y = a x + o (nn/arith.h
 * dsrt_input_affine) with norm a dsrt_norm and stats the layer's state in
 * device memory (mean, std, min, max: 4 yd->c floats; NULL when norm is
 * DSRT_NORM_NONE). yd->c is at most DSRT_K_PIXEL_CH_MAX. With float32
 * output, no normalisation and pix = x / 255, y holds the very floats the
 * pipeline's float output would (for whole-pixel augmentations).
 */
cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                            const dsrt_k_desc *yd, void *y, cudaStream_t stream);

/* The same from a float32 NCHW batch x (yd->n, yd->c, yd->h, yd->w): y = a x
 * + o, as the CPU backend's input layer. */
cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                             void *y, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif
