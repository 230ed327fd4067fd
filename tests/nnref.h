/*
 * Plain C references of the CPU backend's definitions (nn/backend_cpu.c),
 * written out as that backend computes them, for tests of the other
 * implementations: dropout masks drawn sequentially, one draw a pair of
 * elements, and softmax with cross-entropy in double.
 */
#ifndef DSRT_TEST_NNREF_H
#define DSRT_TEST_NNREF_H

#include "core/internal.h"

#include <math.h>

/* The mask (0 or 1 / (1 - p)) of n elements in logical NCHW order of layer
 * `layer` at step `iter` of a net seeded with `seed`. */
static inline void ref_dropout_mask(float *m, size_t n, uint64_t seed, uint64_t iter,
                                    uint64_t layer, float p) {
    float keep = 1.0f / (1.0f - p);
    uint32_t thresh = (uint32_t)fmin(4294967295.0, ldexp((double)p, 32));
    dsrt_rng rng = dsrt_rng_init(seed, iter, layer, 0x44524f50u /* "DROP" */);
    for (size_t k = 0; k < n; k += 2) {
        uint64_t r = dsrt_rng_u64(&rng);
        m[k] = (uint32_t)r >= thresh ? keep : 0.0f;
        if (k + 1 < n) m[k + 1] = (uint32_t)(r >> 32) >= thresh ? keep : 0.0f;
    }
}

/* Softmax of z (n, k) into probs, the mean cross-entropy against labels and
 * the count of rows whose first maximum is the label. */
static inline void ref_softmax_xent(const float *z, const int32_t *labels, int n, int k,
                                    float *probs, double *loss_out, int *correct_out) {
    double loss = 0;
    int correct = 0;
    for (int b = 0; b < n; b++) {
        const float *zb = z + (size_t)b * k;
        float *pb = probs + (size_t)b * k;
        float mx = zb[0];
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (zb[j] > mx) mx = zb[j], arg = j;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += exp((double)zb[j] - mx);
        double inv = 1.0 / sum, lse = log(sum);
        for (int j = 0; j < k; j++) pb[j] = (float)(exp((double)zb[j] - mx) * inv);
        int y = labels[b];
        loss += lse - ((double)zb[y] - mx);
        correct += arg == y;
        if (!isfinite(mx)) loss = NAN;
    }
    *loss_out = loss / n;
    *correct_out = correct;
}

#endif
