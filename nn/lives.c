/*
 * Buffers placed in one allocation by their lives: what the CPU backend's
 * pools (gradients, an inference plan's activations) and the GPU backend's
 * inference plans share. Each buffer lives over a range of steps; two whose
 * lives overlap must not share bytes, two whose lives do not may. Placing
 * the largest first, each at the lowest offset free over its life, keeps
 * the span near the largest set of buffers alive at once (a deep net's
 * forward: a few layers' outputs rather than all of them).
 */
#include "nn/internal.h"

#include <stdlib.h>

/* The lowest offset, a multiple of align, where buffer k meets no placed
 * buffer whose life overlaps its own. */
static size_t lowest_free(const dsrt_life *b, const int *placed, size_t n_placed, size_t k,
                          size_t align) {
    const dsrt_life *e = &b[k];
    size_t off = 0;
    for (size_t j = 0; j < n_placed;) {
        const dsrt_life *q = &b[placed[j]];
        int alive = !(q->hi < e->lo || e->hi < q->lo);
        if (alive && off < q->offset + q->size && q->offset < off + e->size) {
            off = (q->offset + q->size + align - 1) / align * align;
            j = 0; /* moved: check every placed one again */
        } else {
            j++;
        }
    }
    return off;
}

int dsrt__place_by_life(dsrt_life *b, size_t n, size_t align, size_t *span) {
    *span = 0;
    if (!n) return 0;
    int *order = dsrt__malloc(n * sizeof *order);
    if (!order) return -ENOMEM;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        b[k].offset = 0;
        if (!b[k].size) continue;
        size_t at = m++; /* insertion by size, largest first; ties by index */
        while (at > 0 && b[order[at - 1]].size < b[k].size) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = (int)k;
    }
    size_t total = 0;
    for (size_t j = 0; j < m; j++) {
        dsrt_life *e = &b[order[j]];
        e->offset = lowest_free(b, order, j, (size_t)order[j], align);
        total = DSRT_MAX(total, e->offset + e->size);
    }
    free(order);
    *span = (total + align - 1) / align * align;
    return 0;
}
