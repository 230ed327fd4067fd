/*
 * The kernels of the activation kinds (clip, sigmoid, hardsigmoid,
 * hardswish, silu, gelu: nn/layers/eltwise.c), which their GPU part
 * (eltwise_cuda.c) runs each way: the functions and their gradients as
 * PyTorch computes them, in float on the activations' type. As nn/kernels.h
 * lays a kernel out: the bodies, the kernels' arguments, their runs on the
 * host, and the launchers (nn/layers/eltwise.cu).
 */
#ifndef DSRT_NN_LAYERS_ELTWISE_KERNELS_H
#define DSRT_NN_LAYERS_ELTWISE_KERNELS_H

#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// The activations: one thread an element

/* The functions themselves (dsrt_k_act, dsrt_kb_act) are nn/kernels_body.h's,
 * which the bias kernel of convolutions and fully connected layers also
 * computes; here their gradients with PyTorch's conventions where a
 * function has a kink (see dsrt_k_act_fn). */

/* The gradient d (of the output) through the function at x, whose output
 * was y. */
static inline DSRT_HOST_DEVICE float dsrt_kb_act_grad(const dsrt_k_act *a, float x, float y,
                                                      float d) {
    switch (a->fn) {
    case DSRT_K_ACT_RELU:
        return x > 0.0f ? d : DSRT_FMUL(d, a->a);
    case DSRT_K_ACT_IDENTITY:
        return d;
    case DSRT_K_ACT_CLIP:
        return a->a < x && x < a->b ? d : 0.0f;
    case DSRT_K_ACT_SIGMOID:
        return DSRT_FMUL(DSRT_FMUL(d, DSRT_FSUB(1.0f, y)), y);
    case DSRT_K_ACT_HARDSIGMOID: {
        float t = DSRT_FADD(DSRT_FMUL(a->a, x), a->b);
        return 0.0f < t && t < 1.0f ? DSRT_FMUL(d, a->a) : 0.0f;
    }
    case DSRT_K_ACT_HARDSWISH:
        return x < -3.0f ? 0.0f : x <= 3.0f ? DSRT_FMUL(d, DSRT_FADD(DSRT_FDIV(x, 3.0f), 0.5f)) : d;
    case DSRT_K_ACT_SILU: {
        float s = dsrt_kb_sigmoid(x);
        return DSRT_FMUL(DSRT_FMUL(d, s), DSRT_FADD(1.0f, DSRT_FMUL(x, DSRT_FSUB(1.0f, s))));
    }
    case DSRT_K_ACT_GELU: {
        float pdf = DSRT_FMUL(expf(DSRT_FMUL(DSRT_FMUL(-0.5f, x), x)), DSRT_KB_RSQRT_2PI);
        return DSRT_FMUL(d, DSRT_FADD(dsrt_kb_gelu_cdf(x), DSRT_FMUL(x, pdf)));
    }
    default: { /* DSRT_K_ACT_GELU_TANH, as PyTorch writes it */
        float th = tanhf(dsrt_kb_gelu_u(x)), left = DSRT_FMUL(0.5f, x);
        float dleft = DSRT_FMUL(0.5f, DSRT_FADD(1.0f, th));
        float dtanh = DSRT_FSUB(1.0f, DSRT_FMUL(th, th));
        float du = DSRT_FMUL(DSRT_KB_SQRT_2_PI,
                             DSRT_FADD(1.0f, DSRT_FMUL(DSRT_KB_GELU_KAPPA_3, DSRT_FMUL(x, x))));
        return DSRT_FMUL(d, DSRT_FADD(dleft, DSRT_FMUL(DSRT_FMUL(left, dtanh), du)));
    }
    }
}

/* Element i of y = f(x) over elements of type t. */
static inline DSRT_HOST_DEVICE void dsrt_kb_act_fwd(dsrt_k_type t, const dsrt_k_act *a,
                                                    const void *x, void *y, size_t i) {
    dsrt_kb_store(y, t, i, dsrt_kb_act(a, dsrt_kb_load(x, t, i)));
}

/* Element i of dx from the forward's input x and output y and dy. */
static inline DSRT_HOST_DEVICE void dsrt_kb_act_bwd(dsrt_k_type t, const dsrt_k_act *a,
                                                    const void *x, const void *y, const void *dy,
                                                    void *dx, size_t i) {
    float yv = a->fn == DSRT_K_ACT_SIGMOID ? dsrt_kb_load(y, t, i) : 0.0f;
    dsrt_kb_store(dx, t, i, dsrt_kb_act_grad(a, dsrt_kb_load(x, t, i), yv, dsrt_kb_load(dy, t, i)));
}

// ----------------------------------------------------------------------------
// The kernels' arguments

typedef struct {
    dsrt_k_type t;
    dsrt_k_act a;
    const void *x;
    void *y;
    size_t n;
} act_fwd_args;

typedef struct {
    dsrt_k_type t;
    dsrt_k_act a;
    const void *x, *y, *dy;
    void *dx;
    size_t n;
} act_bwd_args;

// ----------------------------------------------------------------------------
// On the host

#ifndef __CUDACC__
static inline void act_fwd_kernel_host(const void *p) {
    const act_fwd_args *a = (const act_fwd_args *)p;
    for (size_t i = 0; i < a->n; i++) dsrt_kb_act_fwd(a->t, &a->a, a->x, a->y, i);
}

static inline void act_bwd_kernel_host(const void *p) {
    const act_bwd_args *a = (const act_bwd_args *)p;
    for (size_t i = 0; i < a->n; i++) dsrt_kb_act_bwd(a->t, &a->a, a->x, a->y, a->dy, a->dx, i);
}

static inline int dsrt_kh_act_fwd(dsrt_k_type t, const dsrt_k_act *act, const void *x, void *y,
                                  size_t n) {
    if (!dsrt_kb_act_ok(t, act)) return -EINVAL;
    act_fwd_args a = {t, *act, x, y, n};
    act_fwd_kernel_host(&a);
    return 0;
}

static inline int dsrt_kh_act_bwd(dsrt_k_type t, const dsrt_k_act *act, const void *x,
                                  const void *y, const void *dy, void *dx, size_t n) {
    if (!dsrt_kb_act_ok(t, act)) return -EINVAL;
    act_bwd_args a = {t, *act, x, y, dy, dx, n};
    act_bwd_kernel_host(&a);
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// The launchers

#ifdef DSRT_K_LAUNCHERS
/* y = f(x) over n elements of type t, f the activation a (clip, sigmoid,
 * hardsigmoid, hardswish, SiLU, GELU: dsrt_k_act_fn says what each
 * computes, as PyTorch). In place (y == x) allowed. */
cudaError_t dsrt_k_act_fwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y, size_t n,
                           cudaStream_t stream);

/* Its backward: dx from the forward's input x, its output y (which sigmoid
 * reads) and dy, with PyTorch's gradients at the kinks. In place (dx == dy)
 * allowed. */
cudaError_t dsrt_k_act_bwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                           const void *dy, void *dx, size_t n, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif
