/*
 * An element-wise function as the layer kinds describe it at inference
 * (dsrt_act, nn/internal.h: what a convolution computes of the activation
 * after it) and as dsrt's kernels compute it (dsrt_k_act,
 * nn/kernels_body.h): the GPU engine's inference plan hands a kind's
 * infer_act to a convolution's bias kernel through it, and the kernels'
 * test checks that kernel against the CPU backend's activation layers
 * through it too.
 */
#ifndef DSRT_NN_ACT_KERNEL_H
#define DSRT_NN_ACT_KERNEL_H

#include "nn/internal.h"
#include "nn/kernels_body.h"

/* act as dsrt's kernels compute it, into *k: 1, or 0 where they have no
 * such function (a swish of another slope than SiLU's). */
static inline int dsrt__act_kernel_of(const dsrt_act *act, dsrt_k_act *k) {
    int fn;
    switch (act->fn) {
    case DSRT_ACT_RELU:
        fn = DSRT_K_ACT_RELU;
        break;
    case DSRT_ACT_CLIP:
        fn = DSRT_K_ACT_CLIP;
        break;
    case DSRT_ACT_LOGISTIC:
        fn = DSRT_K_ACT_SIGMOID;
        break;
    case DSRT_ACT_HARDSIGMOID:
        fn = DSRT_K_ACT_HARDSIGMOID;
        break;
    case DSRT_ACT_HARDSWISH:
        fn = DSRT_K_ACT_HARDSWISH;
        break;
    case DSRT_ACT_SWISH:
        if (act->alpha != 1.0f) return 0;
        fn = DSRT_K_ACT_SILU;
        break;
    case DSRT_ACT_GELU_ERF:
        fn = DSRT_K_ACT_GELU;
        break;
    case DSRT_ACT_GELU_TANH:
        fn = DSRT_K_ACT_GELU_TANH;
        break;
    default:
        return 0;
    }
    *k = (dsrt_k_act){fn, act->alpha, act->beta};
    return 1;
}

#endif
