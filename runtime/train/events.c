/*
 * What a run tells its caller: the events of the loop (start, iteration,
 * validation, epoch, checkpoint, end), each after the bad samples found since
 * the last one, and each bad sample once however many workers met it (a set
 * of sample ids). The run (run.c), its checkpoints (checkpoint.c) and the
 * data-parallel exchange of bad samples (parallel.c) all tell through here.
 */
#include "runtime/train/internal.h"

#include <stdlib.h>
#include <string.h>

int dsrt__train_each_bad(dsrt_pipeline *p, size_t *from, int validation,
                         int (*fn)(void *ctx, const dsrt_bad_sample *s, int validation),
                         void *ctx) {
    int res = 0;
    dsrt_bad_sample b[16];
    for (;;) {
        size_t total = dsrt_pipeline_bad_samples(p, *from, b, DSRT_ARRAY_SIZE(b));
        if (total <= *from) break;
        size_t n = DSRT_MIN(total - *from, DSRT_ARRAY_SIZE(b));
        for (size_t i = 0; i < n; i++) {
            int r = fn(ctx, &b[i], validation);
            if (r < 0) return r;
            res |= r;
        }
        *from += n;
    }
    return res;
}

int dsrt__id_set_add(id_set *s, uint32_t id) {
    if (2 * (s->n + 1) > s->cap) { /* at most half full */
        size_t cap = s->cap ? 2 * s->cap : 64;
        uint64_t *slot = dsrt__calloc(cap, sizeof *slot);
        if (!slot) return -ENOMEM;
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->slot[i]) continue;
            size_t h = (size_t)((s->slot[i] * 0x9e3779b97f4a7c15ULL) >> 20) & (cap - 1);
            while (slot[h]) h = (h + 1) & (cap - 1);
            slot[h] = s->slot[i];
        }
        free(s->slot);
        s->slot = slot;
        s->cap = cap;
    }
    uint64_t key = (uint64_t)id + 1;
    size_t h = (size_t)((key * 0x9e3779b97f4a7c15ULL) >> 20) & (s->cap - 1);
    for (; s->slot[h]; h = (h + 1) & (s->cap - 1))
        if (s->slot[h] == key) return 0;
    s->slot[h] = key;
    s->n++;
    return 1;
}

void dsrt__id_set_free(id_set *s) {
    free(s->slot);
    memset(s, 0, sizeof *s);
}

int dsrt__train_tell_bad(run *R, const dsrt_bad_sample *s, int validation, int worker) {
    /* Told once, however many workers found it (no memory: told again). */
    if (dsrt__id_set_add(&R->bad_ids[validation != 0], s->id) == 0 || !R->o->callback) return 0;
    R->ev.kind = DSRT_EVENT_BAD_SAMPLE;
    R->ev.bad_sample = s;
    R->ev.validation = validation;
    R->ev.bad_worker = worker;
    int stop = R->o->callback(R->o->callback_ctx, &R->ev) != 0;
    R->ev.bad_sample = NULL;
    R->ev.validation = 0;
    R->ev.bad_worker = R->rank;
    return stop;
}

static int tell_own_bad(void *ctx, const dsrt_bad_sample *s, int validation) {
    run *R = ctx;
    return dsrt__train_tell_bad(R, s, validation, R->rank);
}

int dsrt__train_emit_bad(run *R, dsrt_pipeline *p, int validation) {
    return dsrt__train_each_bad(p, &R->bad_told[validation], validation, tell_own_bad, R);
}

int dsrt__train_emit(run *R, dsrt_train_event_kind kind) {
    int stop = 0;
    R->ev.elapsed_s = dsrt__now_s() - R->t0;
    double ts = R->ev.elapsed_s - R->val_s;
    R->ev.images_per_s = ts > 0 ? (double)R->ev.images / ts : 0;
    if (R->p) stop |= dsrt__train_emit_bad(R, R->p, 0);
    if (R->vp) stop |= dsrt__train_emit_bad(R, R->vp, 1);
    if (!R->o->callback) return 0;
    R->ev.kind = kind;
    dsrt_train_event ev = R->ev;
    if (kind != DSRT_EVENT_ITERATION) {
        ev.ids = NULL;
        ev.ids_count = 0;
    }
    return (R->o->callback(R->o->callback_ctx, &ev) != 0) | stop;
}
