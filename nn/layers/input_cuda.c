/*
 * input on the GPU: the staged batch (uint8 NHWC pipeline slots or float
 * NCHW) normalised straight into the first activation, NHWC in the
 * activations' type. See nn/layers/input.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/input_kernels.h"

/* The input stage: the staged batch, normalised into layer 0's output
 * (NHWC, the activations' type) straight from the slot. */
static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const stage_slot *s = p->slot;
    const dsrt_layer *L = &be->net->layers[0];
    const dsrt_k_desc *yd = &p->gl[0].kd;
    const float *stats = L->o.norm != DSRT_NORM_NONE ? be->state + L->s_off : NULL;
    if (s->layout == DSRT_INPUT_U8_NHWC) {
        dsrt_k_pixel pix;
        memcpy(pix.sub, s->sub, sizeof pix.sub);
        memcpy(pix.div, s->div, sizeof pix.div);
        CU(dsrt_k_input_u8(s->x, &pix, L->o.norm, stats, yd, p->gl[0].y, be->compute));
    } else {
        CU(dsrt_k_input_f32(s->x, L->o.norm, stats, yd, p->gl[0].y, be->compute));
    }
    return 0;
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_input = {
    .forward = forward,
};
