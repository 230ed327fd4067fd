/*
 * The softmax layer's kernels (nn/layers/softmax.c), which its GPU part
 * (softmax_cuda.c) runs: softmax with cross-entropy against the labels or
 * soft targets, the loss and the correct count reduced on the device, and
 * the gradient. As nn/kernels.h lays a kernel out: the bodies, the
 * kernels' arguments, their runs on the host, and the launchers
 * (nn/layers/softmax.cu).
 */
#ifndef DSRT_NN_LAYERS_SOFTMAX_KERNELS_H
#define DSRT_NN_LAYERS_SOFTMAX_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Softmax and cross-entropy: one warp a row

/* Softmax's per-row results, in its workspace. */
typedef struct {
    double loss;
    double tsum; /* with soft targets: the row's sum of them, for the backward */
    int32_t correct;
    int32_t pad_;
} dsrt_k_row_result;

static inline int dsrt_kb_softmax_fwd_ok(int n, int k, const int32_t *labels, const float *soft,
                                         const void *work) {
    return n >= 0 && k > 0 && (!labels || work) && (!soft || labels);
}

static inline size_t dsrt_kb_softmax_work(int n) {
    return (size_t)(n > 0 ? n : 1) * sizeof(dsrt_k_row_result);
}

/* The logits of one row: k values of type t from z + base. */
typedef struct {
    const void *z;
    dsrt_k_type t;
    size_t base;
} dsrt_kb_row;

static inline DSRT_HOST_DEVICE float dsrt_kb_row_at(const dsrt_kb_row *r, int j) {
    return dsrt_kb_load(r->z, r->t, r->base + (size_t)j);
}

/* Lane `lane`: the first of its largest logits (NaN never compares larger). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_max(const dsrt_kb_row *zr, int k, int lane,
                                                        float *best, int *arg) {
    float b = -INFINITY;
    int a = 0x7fffffff;
    for (int j = lane; j < k; j += DSRT_KB_WARP) {
        float v = dsrt_kb_row_at(zr, j);
        if (v > b || (v == b && j < a)) b = v, a = j;
    }
    *best = b;
    *arg = a;
}

/* One butterfly step: the partner lane's (ob, oa) merged in, keeping the
 * larger value and on ties the lower index (the same on both lanes). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_merge(float *best, int *arg, float ob, int oa) {
    if (ob > *best || (ob == *best && oa < *arg)) *best = ob, *arg = oa;
}

/* The value subtracted from the row and its first maximum, from the
 * merged (best, *arg): what one pass from the left finds when the first
 * logit is a number; when it is NaN, the CPU's pass keeps it (index 0). */
static inline DSRT_HOST_DEVICE float dsrt_kb_sm_row_max(const dsrt_kb_row *zr, float best,
                                                        int *arg) {
    float mx = dsrt_kb_row_at(zr, 0);
    if (mx == mx) return best;
    *arg = 0;
    return mx;
}

/* Lane `lane`'s share of the sum of exp(z - max), in double. */
static inline DSRT_HOST_DEVICE double dsrt_kb_sm_lane_sumexp(const dsrt_kb_row *zr, int k, int lane,
                                                             double dm) {
    double s = 0.0;
    for (int j = lane; j < k; j += DSRT_KB_WARP)
        s = DSRT_DADD(s, exp((double)dsrt_kb_row_at(zr, j) - dm));
    return s;
}

/* Lane `lane`'s probabilities: exp(z - max) / sum, rounded to float. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_lane_store(const dsrt_kb_row *zr, float *pr, int k,
                                                          int lane, double dm, double inv) {
    for (int j = lane; j < k; j += DSRT_KB_WARP)
        pr[j] = (float)DSRT_DMUL(exp((double)dsrt_kb_row_at(zr, j) - dm), inv);
}

/* The row's loss and whether its first maximum is its label. A label out of
 * range or a maximum that is not finite gives NaN. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_row_result(const dsrt_kb_row *zr, int32_t label,
                                                          int k, float mx, double sum, int arg,
                                                          dsrt_k_row_result *res) {
    double l = NAN;
    if (label >= 0 && label < k && isfinite(mx))
        l = DSRT_DSUB(log(sum), (double)dsrt_kb_row_at(zr, label) - (double)mx);
    res->loss = l;
    res->correct = arg == label;
}

/* With soft targets t (the row's k floats): the loss is sum_j t_j (log sum -
 * (z_j - max)) over the targets that are not 0, added in order as the CPU
 * backend adds them, and the targets' sum is kept for the backward. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_row_soft(const dsrt_kb_row *zr, const float *t,
                                                        int k, float mx, double sum,
                                                        dsrt_k_row_result *res) {
    double lse = log(sum), l = 0.0, ts = 0.0;
    for (int j = 0; j < k; j++) {
        ts = DSRT_DADD(ts, (double)t[j]);
        if (t[j] != 0.0f)
            l = DSRT_DADD(l, DSRT_DMUL((double)t[j],
                                       DSRT_DSUB(lse, (double)dsrt_kb_row_at(zr, j) - (double)mx)));
    }
    res->loss = isfinite(mx) ? l : NAN;
    res->tsum = ts;
}

/* Thread t's share of the batch totals: rows t, t + THREADS, ... */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_total_part(const dsrt_k_row_result *res, int n,
                                                          int t, double *loss, int *correct) {
    double l = 0.0;
    int c = 0;
    for (int i = t; i < n; i += DSRT_KB_THREADS) {
        l = DSRT_DADD(l, res[i].loss);
        c += res[i].correct;
    }
    *loss = l;
    *correct = c;
}

static inline int dsrt_kb_softmax_bwd_ok(int n, int k, const int32_t *labels, const float *soft,
                                         const void *work) {
    return n >= 0 && k > 0 && labels && (!soft || work);
}

/* Element i of dz (type t) = (probs - onehot) * scale, rounded as the CPU
 * backend. */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_bwd(const float *probs, const int32_t *labels, int k,
                                                   float scale, void *dz, dsrt_k_type t, size_t i) {
    float d = DSRT_FMUL(probs[i], scale);
    if ((int)(i % k) == labels[i / k]) d = DSRT_FSUB(d, scale);
    dsrt_kb_store(dz, t, i, d);
}

/* With soft targets: (probs * sum(targets) - target) * scale in double,
 * rounded once, as the CPU backend (the row's sum from the forward). */
static inline DSRT_HOST_DEVICE void dsrt_kb_sm_bwd_soft(const float *probs, const float *soft,
                                                        const dsrt_k_row_result *res, int k,
                                                        float scale, void *dz, dsrt_k_type t,
                                                        size_t i) {
    double d = DSRT_DMUL(DSRT_DSUB(DSRT_DMUL((double)probs[i], res[i / k].tsum), (double)soft[i]),
                         (double)scale);
    dsrt_kb_store(dz, t, i, (float)d);
}

// ----------------------------------------------------------------------------
// The kernels' arguments

/* One warp a row (SOFT_WARPS rows a block). */
typedef struct {
    const void *z;
    dsrt_k_type zt;
    const int32_t *labels;
    const float *soft;
    int n, k;
    float *probs;
    dsrt_k_row_result *res;
} softmax_fwd_args;

/* One block. */
typedef struct {
    const dsrt_k_row_result *res;
    int n;
    double *loss;
    int32_t *correct;
} softmax_total_args;

typedef struct {
    const float *probs;
    const int32_t *labels;
    const float *soft;
    const dsrt_k_row_result *res;
    int k;
    float scale;
    const float *scale_dev;
    void *dz;
    dsrt_k_type t;
    size_t count;
} softmax_bwd_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
/* Each row: the lanes' maxima and sums merged by the warp's butterfly, as
 * __shfl_xor_sync hands them. */
static inline void softmax_fwd_kernel_host(const void *p) {
    const softmax_fwd_args *a = (const softmax_fwd_args *)p;
    int k = a->k;
    for (int row = 0; row < a->n; row++) {
        dsrt_kb_row zrow = {a->z, a->zt, (size_t)row * k};
        const dsrt_kb_row *zr = &zrow;
        float best[DSRT_KB_WARP], nb[DSRT_KB_WARP];
        int arg[DSRT_KB_WARP], na[DSRT_KB_WARP];
        double sum[DSRT_KB_WARP];
        for (int l = 0; l < DSRT_KB_WARP; l++) dsrt_kb_sm_lane_max(zr, k, l, &best[l], &arg[l]);
        for (int o = DSRT_KB_WARP / 2; o > 0; o >>= 1) {
            for (int l = 0; l < DSRT_KB_WARP; l++) {
                nb[l] = best[l], na[l] = arg[l];
                dsrt_kb_sm_merge(&nb[l], &na[l], best[l ^ o], arg[l ^ o]);
            }
            memcpy(best, nb, sizeof best);
            memcpy(arg, na, sizeof arg);
        }
        int at = arg[0];
        float mx = dsrt_kb_sm_row_max(zr, best[0], &at);
        double dm = (double)mx;
        for (int l = 0; l < DSRT_KB_WARP; l++) sum[l] = dsrt_kb_sm_lane_sumexp(zr, k, l, dm);
        double total = dsrt_kh_butterfly(sum);
        for (int l = 0; l < DSRT_KB_WARP; l++)
            dsrt_kb_sm_lane_store(zr, a->probs + (size_t)row * k, k, l, dm, 1.0 / total);
        if (a->labels) {
            dsrt_kb_sm_row_result(zr, a->labels[row], k, mx, total, at, &a->res[row]);
            if (a->soft)
                dsrt_kb_sm_row_soft(zr, a->soft + (size_t)row * k, k, mx, total, &a->res[row]);
        }
    }
}

static inline void softmax_total_kernel_host(const void *p) {
    const softmax_total_args *a = (const softmax_total_args *)p;
    double l[DSRT_KB_THREADS];
    int c[DSRT_KB_THREADS];
    for (int t = 0; t < DSRT_KB_THREADS; t++) dsrt_kb_sm_total_part(a->res, a->n, t, &l[t], &c[t]);
    dsrt_kh_tree(l, c);
    if (a->loss) *a->loss = l[0] / a->n;
    if (a->correct) *a->correct = c[0];
}

static inline void softmax_bwd_kernel_host(const void *p) {
    const softmax_bwd_args *a = (const softmax_bwd_args *)p;
    float sc = a->scale_dev ? *a->scale_dev : a->scale;
    for (size_t i = 0; i < a->count; i++) {
        if (a->soft)
            dsrt_kb_sm_bwd_soft(a->probs, a->soft, a->res, a->k, sc, a->dz, a->t, i);
        else
            dsrt_kb_sm_bwd(a->probs, a->labels, a->k, sc, a->dz, a->t, i);
    }
}

static inline int dsrt_kh_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                                           const float *soft, int n, int k, float *probs,
                                           double *loss, int32_t *correct, void *work) {
    if (!dsrt_kb_softmax_fwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(zt)) return -EINVAL;
    softmax_fwd_args a = {z, zt, labels, soft, n, k, probs, (dsrt_k_row_result *)work};
    softmax_total_args t = {a.res, n, loss, correct};
    softmax_fwd_kernel_host(&a);
    if (n && labels && (loss || correct)) softmax_total_kernel_host(&t);
    return 0;
}

static inline int dsrt_kh_softmax_xent_bwd(const float *probs, const int32_t *labels,
                                           const float *soft, const void *work, int n, int k,
                                           float scale, const float *scale_dev, void *dz,
                                           dsrt_k_type dzt) {
    if (!dsrt_kb_softmax_bwd_ok(n, k, labels, soft, work) || !dsrt_kb_type_ok(dzt)) return -EINVAL;
    softmax_bwd_args a = {probs, labels,       soft,      (const dsrt_k_row_result *)work,
                          k,     scale,        scale_dev, dz,
                          dzt,   (size_t)n * k};
    softmax_bwd_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* Bytes of device workspace dsrt_k_softmax_xent_fwd (and, with soft
 * targets, the backward after it) needs for n images. */
size_t dsrt_k_softmax_xent_work(int n);

/*
 * Softmax of the logits z (n, k, of type zt) into probs (n, k, float32), as
 * the CPU backend: in double after subtracting the row's maximum, rounded to
 * float. With labels
 * (n int32 in [0, k)), *loss (device double) receives the mean cross-entropy
 * over the batch and *correct (device int32) how many rows have their label
 * as first maximum; loss or correct may be NULL. A row whose maximum is not
 * finite (or a label out of range) makes the loss NaN. work: a device
 * buffer of dsrt_k_softmax_xent_work(n) bytes. The sums run in a fixed
 * order: the results are identical from run to run. With soft (n, k float32
 * targets, mixed or smoothed labels; labels still count the correct rows)
 * the loss is the cross-entropy against them, and work keeps each row's sum
 * of targets for the backward.
 */
cudaError_t dsrt_k_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                                    const float *soft, int n, int k, float *probs, double *loss,
                                    int32_t *correct, void *work, cudaStream_t stream);

/* dz (n, k, of type dzt) = (probs - onehot(labels)) * scale, rounded as the
 * CPU backend (probs * scale, then minus scale at the label). scale is 1 / n
 * for the batch mean, 1 / (n * ranks) for a data-parallel average; with
 * scale_dev (device memory) it is read from there when the kernel runs.
 * With soft targets (and work, as the forward left it): (probs * sum of the
 * row's targets - targets) * scale, in double, rounded once. */
cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, const float *soft,
                                    const void *work, int n, int k, float scale,
                                    const float *scale_dev, void *dz, dsrt_k_type dzt,
                                    cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif
