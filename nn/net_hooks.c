/*
 * What a backend calls while it runs a net, below both net.c (which picks
 * and drives the backends) and the backends themselves, so that backends
 * call downwards only: which layers' output gradients backward produces,
 * the gradient buckets' readiness as layers finish, the host clock's pieces
 * of a profiled step, and a uint8 batch converted as the pipeline would.
 * Nothing here calls into net.c or a backend.
 */
#include "internal.h"

// ----------------------------------------------------------------------------
// Gradients

int dsrt__net_need_diff(const dsrt_net *net, int i) {
    return net->need_diff && net->need_diff[i];
}

void dsrt__net_grads_ready(dsrt_net *net, int layer) {
    int k = net->layer_bucket[layer];
    if (net->ready_fn && k >= 0) net->ready_fn(net->ready_ctx, k, net->buckets[k]);
}

// ----------------------------------------------------------------------------
// Profile

void dsrt__prof_piece(dsrt_net *net, int layer, int backward, double t0, double t1) {
    dsrt_net_prof *pr = dsrt__prof_on(net);
    if (!pr) return;
    if (!pr->open) {
        pr->open = 1;
        pr->step_t0 = t0;
    } else {
        if (t0 > pr->prev_t1) pr->gap_s += t0 - pr->prev_t1;
        pr->gaps++;
    }
    pr->prev_t1 = t1;
    if (backward)
        pr->bwd_s[layer] += t1 - t0;
    else
        pr->fwd_s[layer] += t1 - t0;
}

void dsrt__prof_step_end(dsrt_net *net) {
    dsrt_net_prof *pr = dsrt__prof_on(net);
    if (!pr || !pr->open) return;
    pr->span_s += pr->prev_t1 - pr->step_t0;
    pr->steps++;
    pr->open = 0;
}

// ----------------------------------------------------------------------------
// Batches

void dsrt__batch_u8_to_f32(const uint8_t *src, float *dst, int n, int c, int h, int w,
                           const float *sub, const float *div) {
    size_t hw = (size_t)h * w;
    for (int ch = 0; ch < c; ch++) {
        /* The value of each byte, computed as the pipeline computes it. */
        float lut[256];
        for (int x = 0; x < 256; x++) lut[x] = ((float)x - sub[ch]) / div[ch];
        for (int b = 0; b < n; b++) {
            const uint8_t *s = src + (size_t)b * hw * c + ch;
            float *d = dst + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) d[k] = lut[s[k * c]];
        }
    }
}
