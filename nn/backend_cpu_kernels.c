/*
 * The CPU backend's own arithmetic, for the C steps of the kinds oneDNN 2.6
 * has no fast primitive for: products by a factor a channel (a gate of
 * squeeze-and-excitation, a layer scale), the sums a channel of their
 * gradients, element-wise products and products by a factor an image
 * (stochastic depth). Each works in the layout its tensors have (NCHW, NHWC
 * or oneDNN's channel blocks, seen as cpu_chans), so that no plain copy is
 * made, cuts its work into pieces that the OpenMP team shares
 * (dsrt__cpu_parallel), and takes every sum of a channel on one thread in
 * one order: the results do not depend on the number of threads. The loops
 * are compiled for each instruction set (DSRT_CPU_ISA_VARIANTS) and the
 * backend picks the best one this CPU has.
 */
#include "nn/backend_cpu.h"

/* Floats a piece of element-wise work takes at least. */
#define PIECE 16384
/* Channels whose sums one piece keeps. */
#define DOT_CHANNELS 64

// ----------------------------------------------------------------------------
// Layouts

/* Whether a stride fits: a dimension of 1 may have any. */
static int stride_is(dnnl_dim_t dim, dnnl_dim_t stride, dnnl_dim_t want) {
    return dim == 1 || stride == want;
}

int dsrt__cpu_chans(const dnnl_memory_desc_t *md, cpu_chans *v) {
    if (md->ndims != 4 || md->data_type != dnnl_f32 || md->format_kind != dnnl_blocked ||
        md->offset0 != 0)
        return 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    const dnnl_dim_t *d = md->dims, *st = b->strides;
    dnnl_dim_t n = d[0], c = d[1], h = d[2], w = d[3], hw = h * w;
    for (int k = 0; k < 4; k++)
        if (md->padded_offsets[k] != 0 || (k != 1 && md->padded_dims[k] != d[k])) return 0;
    memset(v, 0, sizeof *v);
    v->n = (size_t)n;
    v->c = (size_t)c;
    v->hw = (size_t)hw;
    if (b->inner_nblks == 0) {
        if (md->padded_dims[1] != c) return 0;
        if (stride_is(c, st[1], 1) && stride_is(w, st[3], c) && stride_is(h, st[2], w * c) &&
            stride_is(n, st[0], hw * c)) {
            v->blocks = 1;
            v->inner = (size_t)c;
            v->s_n = (size_t)(hw * c);
            return 1;
        }
        if (stride_is(w, st[3], 1) && stride_is(h, st[2], w) && stride_is(c, st[1], hw) &&
            stride_is(n, st[0], c * hw)) {
            v->blocks = (size_t)c;
            v->inner = 1;
            v->s_b = (size_t)hw;
            v->s_n = (size_t)(c * hw);
            return 1;
        }
        return 0;
    }
    if (b->inner_nblks != 1 || b->inner_idxs[0] != 1) return 0;
    dnnl_dim_t blk = b->inner_blks[0], cp = md->padded_dims[1];
    if (blk < 1 || cp % blk || cp < c || cp - c >= blk) return 0;
    if (!stride_is(w, st[3], blk) || !stride_is(h, st[2], w * blk) ||
        !stride_is(cp / blk, st[1], hw * blk) || !stride_is(n, st[0], cp * hw))
        return 0;
    if (hw == 1 && cp == c) { /* one pixel, no padding: (n, c) */
        v->blocks = 1;
        v->inner = (size_t)c;
        v->s_n = (size_t)c;
        return 1;
    }
    v->blocks = (size_t)(cp / blk);
    v->inner = (size_t)blk;
    v->s_b = (size_t)(hw * blk);
    v->s_n = (size_t)(cp * hw);
    return 1;
}

int dsrt__cpu_is_nc(const dnnl_memory_desc_t *md) {
    cpu_chans v;
    return dsrt__cpu_chans(md, &v) && v.hw == 1 && v.blocks == 1 && v.inner == v.c;
}

// ----------------------------------------------------------------------------
// Products by a factor a channel

typedef struct {
    const cpu_chans *v;
    const float *x, *f;
    size_t f_n;
    float *y;
    size_t pixels, pieces; /* pixels a piece, pieces an image's block */
} mul_chans_job;

DSRT_CPU_INLINE void mul_chans_range(void *ctx, size_t lo, size_t hi) {
    const mul_chans_job *j = ctx;
    const cpu_chans *v = j->v;
    size_t inner = v->inner;
    for (size_t u = lo; u < hi; u++) {
        size_t i = u / (v->blocks * j->pieces), b = u / j->pieces % v->blocks, q = u % j->pieces;
        size_t p0 = q * j->pixels, p1 = DSRT_MIN(v->hw, p0 + j->pixels);
        size_t at = i * v->s_n + b * v->s_b, c0 = b * inner;
        const float *restrict x = j->x + at;
        float *restrict y = j->y + at;
        const float *restrict f = j->f + i * j->f_n + c0;
        if (inner == 1) {
            float m = f[0];
            for (size_t p = p0; p < p1; p++) y[p] = x[p] * m;
            continue;
        }
        size_t valid = DSRT_MIN(inner, v->c - c0);
        for (size_t p = p0; p < p1; p++) {
            const float *restrict xp = x + p * inner;
            float *restrict yp = y + p * inner;
            for (size_t k = 0; k < valid; k++) yp[k] = xp[k] * f[k];
            for (size_t k = valid; k < inner; k++) yp[k] = 0.0f;
        }
    }
}
DSRT_CPU_ISA_VARIANTS(mul_chans_range);

void dsrt__cpu_mul_chans(cpu_backend *be, const cpu_chans *v, const float *x, const float *f,
                         size_t f_n, float *y) {
    mul_chans_job j = {.v = v, .x = x, .f = f, .f_n = f_n, .y = y};
    j.pixels = DSRT_MAX((size_t)1, PIECE / v->inner);
    j.pieces = (v->hw + j.pixels - 1) / j.pixels;
    dsrt__cpu_parallel(be, v->n * v->blocks * j.pieces, mul_chans_range_isa[be->isa], &j);
}

// ----------------------------------------------------------------------------
// Sums a channel

typedef struct {
    const cpu_chans *v;
    const float *a, *b;
    int per_image;
    float *out;
    size_t groups; /* groups of DOT_CHANNELS channels in a block */
} dot_chans_job;

DSRT_CPU_INLINE void dot_chans_range(void *ctx, size_t lo, size_t hi) {
    const dot_chans_job *j = ctx;
    const cpu_chans *v = j->v;
    size_t inner = v->inner, units_per_image = v->blocks * j->groups;
    for (size_t u = lo; u < hi; u++) {
        size_t i0 = 0, i1 = v->n, r = u;
        if (j->per_image) {
            i0 = u / units_per_image;
            i1 = i0 + 1;
            r = u % units_per_image;
        }
        size_t b = r / j->groups, g = r % j->groups;
        size_t k0 = g * DOT_CHANNELS, kn = DSRT_MIN((size_t)DOT_CHANNELS, inner - k0);
        size_t c0 = b * inner + k0;
        if (c0 >= v->c) continue; /* padding */
        kn = DSRT_MIN(kn, v->c - c0);
        double acc[DOT_CHANNELS] = {0};
        for (size_t i = i0; i < i1; i++) {
            size_t at = i * v->s_n + b * v->s_b + k0;
            const float *restrict a = j->a + at, *restrict bb = j->b + at;
            if (inner == 1) {
                double s = acc[0];
                for (size_t p = 0; p < v->hw; p++) s += (double)a[p] * (double)bb[p];
                acc[0] = s;
                continue;
            }
            for (size_t p = 0; p < v->hw; p++) {
                const float *restrict ap = a + p * inner, *restrict bp = bb + p * inner;
                for (size_t k = 0; k < kn; k++) acc[k] += (double)ap[k] * (double)bp[k];
            }
        }
        float *out = j->out + (j->per_image ? i0 * v->c : 0) + c0;
        for (size_t k = 0; k < kn; k++) out[k] = (float)acc[k];
    }
}
DSRT_CPU_ISA_VARIANTS(dot_chans_range);

void dsrt__cpu_dot_chans(cpu_backend *be, const cpu_chans *v, const float *a, const float *b,
                         int per_image, float *out) {
    dot_chans_job j = {.v = v, .a = a, .b = b, .per_image = per_image, .out = out};
    j.groups = (v->inner + DOT_CHANNELS - 1) / DOT_CHANNELS;
    size_t units = v->blocks * j.groups * (per_image ? v->n : 1);
    dsrt__cpu_parallel(be, units, dot_chans_range_isa[be->isa], &j);
}

// ----------------------------------------------------------------------------
// Element-wise products

typedef struct {
    const float *a, *b;
    float *y;
    size_t n;
} mul_job;

DSRT_CPU_INLINE void mul_range(void *ctx, size_t lo, size_t hi) {
    const mul_job *j = ctx;
    size_t k0 = lo * PIECE, k1 = DSRT_MIN(j->n, hi * PIECE);
    const float *restrict a = j->a, *restrict b = j->b;
    float *restrict y = j->y;
    for (size_t k = k0; k < k1; k++) y[k] = a[k] * b[k];
}
DSRT_CPU_ISA_VARIANTS(mul_range);

void dsrt__cpu_mul(cpu_backend *be, size_t n, const float *a, const float *b, float *y) {
    mul_job j = {.a = a, .b = b, .y = y, .n = n};
    dsrt__cpu_parallel(be, (n + PIECE - 1) / PIECE, mul_range_isa[be->isa], &j);
}

typedef struct {
    const float *x, *m;
    float *y;
    size_t per, pieces;
} mul_rows_job;

DSRT_CPU_INLINE void mul_rows_range(void *ctx, size_t lo, size_t hi) {
    const mul_rows_job *j = ctx;
    for (size_t u = lo; u < hi; u++) {
        size_t r = u / j->pieces, q = u % j->pieces;
        size_t k0 = q * PIECE, k1 = DSRT_MIN(j->per, k0 + PIECE);
        const float *restrict x = j->x + r * j->per;
        float *restrict y = j->y + r * j->per;
        float m = j->m[r];
        for (size_t k = k0; k < k1; k++) y[k] = x[k] * m;
    }
}
DSRT_CPU_ISA_VARIANTS(mul_rows_range);

void dsrt__cpu_mul_rows(cpu_backend *be, size_t rows, size_t per, const float *x, const float *m,
                        float *y) {
    mul_rows_job j = {.x = x, .m = m, .y = y, .per = per};
    j.pieces = DSRT_MAX((size_t)1, (per + PIECE - 1) / PIECE);
    dsrt__cpu_parallel(be, rows * j.pieces, mul_rows_range_isa[be->isa], &j);
}

// ----------------------------------------------------------------------------
// Batch statistics a channel, and normalised inputs summed

/* Pixels whose sums a float keeps before they join the double totals. */
#define STAT_RUN 64

int dsrt__cpu_stats_usable(const cpu_chans *v) {
    return v->inner == 8 || v->inner == 16;
}

typedef struct {
    const cpu_chans *v;
    const float *x;
    double *part;
} stats_job;

/* s (2 inner) = the sums of d and d^2 over hw pixels of inner channels, d
 * = x - k, k the channels' first values: a mean far from zero costs the
 * squares no precision. Four pixels at a time on four sums, so that the
 * additions do not wait on one another. */
DSRT_CPU_INLINE void stats_block(const float *restrict x, const float *restrict k, size_t hw,
                                 size_t inner, double *restrict s) {
    float fs[4][16], fq[4][16], kk[16];
    for (size_t c = 0; c < inner; c++) kk[c] = k[c];
    for (size_t c = 0; c < 2 * inner; c++) s[c] = 0;
    for (size_t p0 = 0; p0 < hw; p0 += STAT_RUN) {
        size_t p1 = DSRT_MIN(hw, p0 + STAT_RUN), p = p0;
        for (int r = 0; r < 4; r++)
            for (size_t c = 0; c < inner; c++) fs[r][c] = fq[r][c] = 0.0f;
        for (; p + 4 <= p1; p += 4)
            for (int r = 0; r < 4; r++)
                for (size_t c = 0; c < inner; c++) {
                    float d = x[(p + r) * inner + c] - kk[c];
                    fs[r][c] += d;
                    fq[r][c] += d * d;
                }
        for (; p < p1; p++)
            for (size_t c = 0; c < inner; c++) {
                float d = x[p * inner + c] - kk[c];
                fs[0][c] += d;
                fq[0][c] += d * d;
            }
        for (size_t c = 0; c < inner; c++) {
            s[c] += (fs[0][c] + fs[1][c]) + (fs[2][c] + fs[3][c]);
            s[inner + c] += (fq[0][c] + fq[1][c]) + (fq[2][c] + fq[3][c]);
        }
    }
}

DSRT_CPU_INLINE void stats_range(void *ctx, size_t lo, size_t hi) {
    const stats_job *j = ctx;
    const cpu_chans *v = j->v;
    for (size_t u = lo; u < hi; u++) {
        size_t i = u / v->blocks, b = u % v->blocks;
        const float *x = j->x + i * v->s_n + b * v->s_b, *k = j->x + b * v->s_b;
        double *s = j->part + u * 2 * v->inner;
        if (v->inner == 16)
            stats_block(x, k, v->hw, 16, s);
        else
            stats_block(x, k, v->hw, 8, s);
    }
}
DSRT_CPU_ISA_VARIANTS(stats_range);

void dsrt__cpu_stats(cpu_backend *be, const cpu_chans *v, const float *x, double *part, float *mean,
                     float *var) {
    stats_job j = {.v = v, .x = x, .part = part};
    dsrt__cpu_parallel(be, v->n * v->blocks, stats_range_isa[be->isa], &j);
    double count = (double)v->n * (double)v->hw;
    for (size_t b = 0; b < v->blocks; b++)
        for (size_t c = 0; c < v->inner && b * v->inner + c < v->c; c++) {
            double s = 0, q = 0;
            for (size_t i = 0; i < v->n; i++) {
                const double *u = part + (i * v->blocks + b) * 2 * v->inner;
                s += u[c];
                q += u[v->inner + c];
            }
            double m = s / count, d = q / count - m * m;
            mean[b * v->inner + c] = (float)(x[b * v->s_b + c] + m);
            var[b * v->inner + c] = (float)(d > 0 ? d : 0);
        }
}

typedef struct {
    const cpu_chans *v;
    int n;
    const cpu_affine *in;
    float *z;
    int relu;
    float leak;
    size_t pixels, pieces; /* pixels a piece, pieces an image's block */
} affine_sum_job;

/* 8 floats as one value (any alignment), and 8 lanes' masks. */
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));

/* Pixels [p0, p1) of a block of inner channels (8 or 16; c0 the first) at
 * offset at, 8 channels a vector: the compiler left the plain loop scalar.
 * One input: the second one's scale 0 adds 0 to each finite value. The
 * ReLU keeps s where s > 0, else s leak (without a ReLU, leak 1). */
DSRT_CPU_INLINE void affine_sum_block(const affine_sum_job *j, size_t at, size_t c0, size_t p0,
                                      size_t p1, size_t inner) {
    const cpu_affine *in0 = &j->in[0], *in1 = &j->in[j->n - 1];
    const v8f zero = {0}, leak = zero + (j->relu ? j->leak : 1.0f);
    for (size_t h = 0; h < inner; h += 8) {
        v8f m0 = *(const v8f *)(in0->mean + c0 + h), a0 = *(const v8f *)(in0->scale + c0 + h),
            b0 = *(const v8f *)(in0->shift + c0 + h), m1 = zero, a1 = zero, b1 = zero;
        if (j->n > 1) {
            m1 = *(const v8f *)(in1->mean + c0 + h);
            a1 = *(const v8f *)(in1->scale + c0 + h);
            b1 = *(const v8f *)(in1->shift + c0 + h);
        }
        const float *x0 = in0->x + at + h, *x1 = (j->n > 1 ? in1->x : in0->x) + at + h;
        float *z = j->z + at + h;
        for (size_t e = p0 * inner; e < p1 * inner; e += inner) {
            v8f s = ((*(const v8f *)(x0 + e) - m0) * a0 + b0) +
                    ((*(const v8f *)(x1 + e) - m1) * a1 + b1);
            v8i pos = s > zero;
            *(v8f *)(z + e) = (v8f)((pos & (v8i)s) | (~pos & (v8i)(s * leak)));
        }
    }
}

DSRT_CPU_INLINE void affine_sum_range(void *ctx, size_t lo, size_t hi) {
    const affine_sum_job *j = ctx;
    const cpu_chans *v = j->v;
    for (size_t u = lo; u < hi; u++) {
        size_t i = u / (v->blocks * j->pieces), b = u / j->pieces % v->blocks, q = u % j->pieces;
        size_t p0 = q * j->pixels, p1 = DSRT_MIN(v->hw, p0 + j->pixels);
        size_t at = i * v->s_n + b * v->s_b;
        if (v->inner == 16)
            affine_sum_block(j, at, b * 16, p0, p1, 16);
        else
            affine_sum_block(j, at, b * 8, p0, p1, 8);
    }
}
DSRT_CPU_ISA_VARIANTS(affine_sum_range);

void dsrt__cpu_affine_sum(cpu_backend *be, const cpu_chans *v, int n, const cpu_affine *in,
                          float *z, int relu, float leak) {
    affine_sum_job j = {.v = v, .n = n, .in = in, .z = z, .relu = relu, .leak = leak};
    j.pixels = DSRT_MAX((size_t)1, PIECE / v->inner);
    j.pieces = (v->hw + j.pixels - 1) / j.pixels;
    dsrt__cpu_parallel(be, v->n * v->blocks * j.pieces, affine_sum_range_isa[be->isa], &j);
}
