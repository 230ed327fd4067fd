/*
 * What the activation kinds of nn/layers/eltwise.c (clip, sigmoid,
 * hardsigmoid, hardswish, silu, gelu) keep of their options, in the layer's
 * own options (DSRT_LAYER_OPTS), and the function each is for dsrt's GPU
 * kernels (nn/layers/eltwise_kernels.h dsrt_k_act): read by the CPU plan
 * and the ONNX mapping, by the GPU part (eltwise_cuda.c) and by the tests.
 */
#ifndef DSRT_NN_LAYERS_ELTWISE_H
#define DSRT_NN_LAYERS_ELTWISE_H

#include "nn/internal.h"
#include "nn/layers/eltwise_kernels.h"

typedef struct {
    float min, max;    /* clip, relu6: the bounds (the float range: none) */
    float alpha, beta; /* hardsigmoid: max(0, min(1, alpha x + beta)) */
    int approximate;   /* gelu: 0 the erf form, 1 the tanh form */
} dsrt_act_opts;

/* Layer l's options. */
static inline const dsrt_act_opts *dsrt__act_opts(const dsrt_layer *l) {
    return (const dsrt_act_opts *)(const void *)l->o.own;
}

/* Layer l's function as dsrt's kernels compute it. */
static inline dsrt_k_act dsrt__act_kernel(const dsrt_layer *l) {
    const dsrt_act_opts *o = dsrt__act_opts(l);
    dsrt_k_act a = {DSRT_K_ACT_CLIP, 0.0f, 0.0f};
    switch (l->kind) {
    case DSRT_LAYER_CLIP:
        a.a = o->min, a.b = o->max;
        break;
    case DSRT_LAYER_SIGMOID:
        a.fn = DSRT_K_ACT_SIGMOID;
        break;
    case DSRT_LAYER_HARDSIGMOID:
        a.fn = DSRT_K_ACT_HARDSIGMOID, a.a = o->alpha, a.b = o->beta;
        break;
    case DSRT_LAYER_HARDSWISH:
        a.fn = DSRT_K_ACT_HARDSWISH;
        break;
    case DSRT_LAYER_SILU:
        a.fn = DSRT_K_ACT_SILU;
        break;
    default: /* DSRT_LAYER_GELU */
        a.fn = o->approximate ? DSRT_K_ACT_GELU_TANH : DSRT_K_ACT_GELU;
        break;
    }
    return a;
}

#endif
