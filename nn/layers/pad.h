/*
 * What a pad layer (nn/layers/pad.c) keeps of its options in the layer's
 * own options (DSRT_LAYER_OPTS): read by its CPU plan and ONNX mapping and
 * by its GPU part (pad_cuda.c). The padding itself is the layer's pt, pb,
 * pl and pr.
 */
#ifndef DSRT_NN_LAYERS_PAD_H
#define DSRT_NN_LAYERS_PAD_H

#include "nn/internal.h"

typedef struct {
    float value; /* what the padding holds */
} dsrt_pad_opts;

/* The value layer l pads with. */
static inline float dsrt__pad_value(const dsrt_layer *l) {
    return DSRT_LAYER_OPTS(const dsrt_pad_opts, l)->value;
}

#endif
