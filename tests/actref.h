/*
 * Plain references of the activations (nn/layers/eltwise_kernels.h
 * dsrt_k_act, the kinds of nn/layers/eltwise.c), in double from their
 * definitions, with PyTorch's gradients at the kinks: clip's (Hardtanh's)
 * and hardsigmoid's 0 at a bound, hardswish's x / 3 + 1/2 at -3 and at 3.
 * What test_nn (the CPU backend), test_nn_kernels and test_gpu_kernels (the
 * kernels) check against; and the values they probe, kinks and their float
 * neighbours among them.
 */
#ifndef DSRT_TEST_ACTREF_H
#define DSRT_TEST_ACTREF_H

#include "nn/layers/eltwise_kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* hardsigmoid's a x + b as ONNX defines it: in float, each operation
 * rounded (a value next to a kink falls on the side the float says). */
static inline double act_ref_t(const dsrt_k_act *a, double x) {
    volatile float m = a->a * (float)x;
    return (float)(m + a->b);
}

/* f(x). */
static inline double act_ref(const dsrt_k_act *a, double x) {
    const double s2pi = 0.79788456080286535588; /* sqrt(2 / pi) */
    switch (a->fn) {
    case DSRT_K_ACT_CLIP:
        return fmin(fmax(x, a->a), a->b);
    case DSRT_K_ACT_SIGMOID:
        return 1 / (1 + exp(-x));
    case DSRT_K_ACT_HARDSIGMOID:
        return fmin(fmax(act_ref_t(a, x), 0), 1);
    case DSRT_K_ACT_HARDSWISH:
        return x * fmin(fmax(x + 3, 0), 6) / 6;
    case DSRT_K_ACT_SILU:
        return x / (1 + exp(-x));
    case DSRT_K_ACT_GELU:
        return x * erfc(-x / sqrt(2)) / 2;
    default:
        return x * (1 + tanh(s2pi * (x + 0.044715 * x * x * x))) / 2;
    }
}

/* df/dx at x (PyTorch's at the kinks); sigmoid's from its output y as the
 * layer holds it, (1 - y) y, as PyTorch's and oneDNN's backward take it
 * (where y rounds to 1, 1 - y keeps few digits). */
static inline double act_ref_grad(const dsrt_k_act *a, double x, double y) {
    const double s2pi = 0.79788456080286535588;
    switch (a->fn) {
    case DSRT_K_ACT_CLIP:
        return x > a->a && x < a->b ? 1 : 0;
    case DSRT_K_ACT_SIGMOID:
        return (1 - y) * y;
    case DSRT_K_ACT_HARDSIGMOID: {
        double t = act_ref_t(a, x);
        return t > 0 && t < 1 ? a->a : 0;
    }
    case DSRT_K_ACT_HARDSWISH:
        return x < -3 ? 0 : x <= 3 ? x / 3 + 0.5 : 1;
    case DSRT_K_ACT_SILU: {
        double s = 1 / (1 + exp(-x));
        return s * (1 + x * (1 - s));
    }
    case DSRT_K_ACT_GELU:
        return erfc(-x / sqrt(2)) / 2 + x * exp(-x * x / 2) / sqrt(2 * M_PI);
    default: {
        double th = tanh(s2pi * (x + 0.044715 * x * x * x));
        return (1 + th) / 2 + x / 2 * (1 - th * th) * s2pi * (1 + 3 * 0.044715 * x * x);
    }
    }
}

/* Every function with its parameters: PyTorch's and ONNX's defaults and
 * others. */
static const dsrt_k_act ACT_CASES[] = {
    {DSRT_K_ACT_CLIP, 0.0f, 6.0f},
    {DSRT_K_ACT_CLIP, -1.0f, 1.5f},
    {DSRT_K_ACT_CLIP, -3.40282347e38f, 2.0f},
    {DSRT_K_ACT_SIGMOID, 0.0f, 0.0f},
    {DSRT_K_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f},
    {DSRT_K_ACT_HARDSIGMOID, 0.2f, 0.5f},
    {DSRT_K_ACT_HARDSIGMOID, -0.25f, 0.75f},
    {DSRT_K_ACT_HARDSWISH, 0.0f, 0.0f},
    {DSRT_K_ACT_SILU, 0.0f, 0.0f},
    {DSRT_K_ACT_GELU, 0.0f, 0.0f},
    {DSRT_K_ACT_GELU_TANH, 0.0f, 0.0f},
};

/* The kinks of the cases above and their float neighbours, zero, large
 * values; exact in bfloat16 up to the neighbours. */
static const float ACT_PROBES[] = {
    0.0f,
    -0.0f,
    6.0f,
    -3.0f,
    3.0f,
    -1.0f,
    1.5f,
    2.0f,
    -2.5f,
    2.5f,
    1.0f,
    -1.5f,
    -6.0f,
    12.0f,
    -12.0f,
    30.0f,
    -30.0f,
    0.125f,
    -0.125f,
    2.0e-3f,
    -7.0f,
    8.0f,
    -100.0f,
    100.0f,
    0x1.7ffffep+1f, /* 3 - ulp */
    0x1.800002p+1f, /* 3 + ulp */
    -0x1.7ffffep+1f,
    -0x1.800002p+1f,
    0x1.7ffffep+2f, /* 6 - ulp */
    0x1.800002p+2f,
    0x1p-24f,
    -0x1p-24f,
};

/* The description line of the layer computing a (clip without a lower
 * bound leaves min= out: the float range is its default). */
static inline void act_desc(const dsrt_k_act *a, char *buf, size_t cap) {
    switch (a->fn) {
    case DSRT_K_ACT_CLIP:
        if (a->a > -FLT_MAX)
            snprintf(buf, cap, "clip min=%.9g max=%.9g", (double)a->a, (double)a->b);
        else
            snprintf(buf, cap, "clip max=%.9g", (double)a->b);
        break;
    case DSRT_K_ACT_SIGMOID:
        snprintf(buf, cap, "sigmoid");
        break;
    case DSRT_K_ACT_HARDSIGMOID:
        snprintf(buf, cap, "hardsigmoid alpha=%.9g beta=%.9g", (double)a->a, (double)a->b);
        break;
    case DSRT_K_ACT_HARDSWISH:
        snprintf(buf, cap, "hardswish");
        break;
    case DSRT_K_ACT_SILU:
        snprintf(buf, cap, "silu");
        break;
    case DSRT_K_ACT_GELU:
        snprintf(buf, cap, "gelu");
        break;
    default:
        snprintf(buf, cap, "gelu approximate=tanh");
        break;
    }
}

/* The elements where a kernel's outputs (y and dx, as stored, read back as
 * float) miss the reference at its inputs (x and dy, as stored): float32
 * within 4e-6 relative plus 2e-7 max(1, |x|) (times |dy| backward: the
 * cancellation in GELU's 1 + tanh, e^-x rounding in SiLU's), bfloat16
 * within half its unit (2^-8) relative plus the same (a float a few units
 * off a value halfway between two bfloat16s rounds to either). Prints the
 * first. */
static inline int act_mismatches(const char *what, const dsrt_k_act *a, dsrt_k_type t,
                                 const float *x, const float *dy, const float *y, const float *dx,
                                 size_t n) {
    double rel = (t == DSRT_K_BF16 ? 1.0 / 256 : 0) + 4e-6;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double wy = act_ref(a, x[i]), wdx = dy[i] * act_ref_grad(a, x[i], y[i]);
        double ax = 2e-7 * fmax(1, fabs(x[i]));
        int ok = fabs(y[i] - wy) <= rel * fabs(wy) + ax &&
                 fabs(dx[i] - wdx) <= rel * fabs(wdx) + ax * fabs(dy[i]);
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s at x %.9g, dy %.9g: y %.9g (want %.9g), dx %.9g (want %.9g)\n",
                    what, (double)x[i], (double)dy[i], (double)y[i], wy, (double)dx[i], wdx);
    }
    return bad;
}

/* Where an activation kernel runs: forward x into y, backward x, y and dy
 * into dx (n values of type t each, in host memory: a device's runner
 * copies them over and back). 0 or an error. */
typedef struct {
    int (*fwd)(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y, size_t n);
    int (*bwd)(void *ctx, dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
               const void *dy, void *dx, size_t n);
    void *ctx;
} act_runner;

/* Bytes of a value of type t. */
static inline size_t act_type_size(dsrt_k_type t) {
    return t == DSRT_K_BF16 ? sizeof(dsrt_bf16) : sizeof(float);
}

/* v as type t stores it, into p; and back. */
static inline void act_store(dsrt_k_type t, const float *v, void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (t == DSRT_K_BF16)
            ((dsrt_bf16 *)p)[i] = dsrt_bf16_from_f32(v[i]);
        else
            ((float *)p)[i] = v[i];
}

static inline void act_load(dsrt_k_type t, const void *p, float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        v[i] = t == DSRT_K_BF16 ? dsrt_f32_from_bf16(((const dsrt_bf16 *)p)[i])
                                : ((const float *)p)[i];
}

/* Every case of ACT_CASES in both types over the probes and n - probes
 * values drawn in [-8, 8] (a tenth in [-40, 40]), with gradients in [-1,
 * 1], through r, against the reference (act_mismatches). Returns the
 * failures (also counted in test_failures when the caller CHECKs them). */
static inline int act_kernel_check(const act_runner *r, size_t n) {
    size_t np = sizeof ACT_PROBES / sizeof ACT_PROBES[0];
    float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy), *y = malloc(n * sizeof *y),
          *dx = malloc(n * sizeof *dx);
    void *tx = malloc(n * 4), *tdy = malloc(n * 4), *ty = malloc(n * 4), *tdx = malloc(n * 4);
    int bad = 0;
    if (!x || !dy || !y || !dx || !tx || !tdy || !ty || !tdx || n < np) {
        bad = 1;
        goto out;
    }
    dsrt_rng rng = dsrt_rng_init(41, 0, 0, 0);
    for (size_t i = 0; i < n; i++) {
        double u = dsrt_rng_uniform(&rng), v = dsrt_rng_uniform(&rng);
        x[i] = i < np ? ACT_PROBES[i] : (float)((i % 10 ? 16 : 80) * (u - 0.5));
        dy[i] = (float)(2 * v - 1);
    }
    for (size_t c = 0; c < sizeof ACT_CASES / sizeof ACT_CASES[0]; c++)
        for (int t = DSRT_K_F32; t <= DSRT_K_BF16; t++) {
            const dsrt_k_act *a = &ACT_CASES[c];
            dsrt_k_type ty_ = (dsrt_k_type)t;
            char what[96];
            act_desc(a, what, sizeof what);
            snprintf(what + strlen(what), sizeof what - strlen(what), ", %s",
                     t == DSRT_K_BF16 ? "bf16" : "fp32");
            act_store(ty_, x, tx, n);
            act_store(ty_, dy, tdy, n);
            if (r->fwd(r->ctx, ty_, a, tx, ty, n) || r->bwd(r->ctx, ty_, a, tx, ty, tdy, tdx, n)) {
                fprintf(stderr, "  %s: the kernel failed\n", what);
                bad++;
                continue;
            }
            float *xs = malloc(n * sizeof *xs), *dys = malloc(n * sizeof *dys);
            if (!xs || !dys) {
                free(xs), free(dys);
                bad++;
                continue;
            }
            act_load(ty_, tx, xs, n);
            act_load(ty_, tdy, dys, n);
            act_load(ty_, ty, y, n);
            act_load(ty_, tdx, dx, n);
            bad += act_mismatches(what, a, ty_, xs, dys, y, dx, n);
            free(xs), free(dys);
        }
out:
    free(x), free(dy), free(y), free(dx), free(tx), free(tdy), free(ty), free(tdx);
    return bad;
}

#endif
