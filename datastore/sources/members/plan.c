/*
 * Epoch orders of the shard order: which sample fills each place of an
 * epoch when shards are read front to back, computed from sample ids alone.
 *
 * An epoch's order is built in four steps, each a pure function of (seed,
 * epoch) and the view:
 *
 *  1. the shards that hold samples of the view are shuffled (kept in order
 *     with shuffle never);
 *  2. with pipeline parts (data-parallel ranks), each part takes whole
 *     shards: walking the shuffled shards, each goes to the part that has
 *     the fewest samples so far; with one part it takes them all;
 *  3. each part's stream (its shards' samples, shard after shard, in the
 *     order they lie in the shard) passes through a shuffle buffer of
 *     shuffle_buffer samples, as WebDataset's shuffle() does: once the buffer
 *     is full, each new sample takes the place of one drawn at random, which
 *     is output. A sample is output at most shuffle_buffer places after it
 *     entered, so reading the stream a bounded distance ahead of the
 *     consumer is enough;
 *  4. the places of every batch that belong to a part (the pipeline's part
 *     ranges) are filled from that part's mixed stream in turn. Shards hold
 *     different numbers of samples, so a part's stream may be a little
 *     longer or shorter than its places: the surplus of the longer ones
 *     (their last samples) fills the places the shorter ones lack, so the
 *     epoch still holds every sample exactly once.
 *
 * Since the order is known before any byte is read, the pipeline fills its
 * batch slots as it does for any datastore, with any number of threads, and
 * a resume lands on exactly the same samples.
 */
#include "datastore/sources/members/members.h"

#include <stdlib.h>
#include <string.h>

/* Random streams of the shard order, apart from those of datastore.c. */
enum { STREAM_SHARD_ORDER = 11, STREAM_SHARD_MIX = 12 };

struct dsrt_shard_plan {
    const dsrt_datastore *ds;
    dsrt_shard_plan_options o;
    size_t n;         /* samples of the view */
    size_t nocc;      /* shards holding some */
    uint32_t *occ;    /* (nocc) shard index of each */
    uint32_t *start;  /* (nocc + 1) where each one's samples start in sorted */
    uint32_t *sorted; /* (n) view positions, by shard, then by place in the shard */
    size_t buffer;    /* shuffle buffer, in samples */
};

static int by_index_pos(const void *a, const void *b, void *ctx) {
    const dsrt_datastore *ds = ctx;
    uint32_t x = dsrt__pos(ds, *(const uint32_t *)a), y = dsrt__pos(ds, *(const uint32_t *)b);
    return x < y ? -1 : x > y;
}

int dsrt__shard_plan_create(dsrt_shard_plan **out, const dsrt_datastore *ds,
                            const dsrt_shard_plan_options *o) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    *out = NULL;
    if (!s) return dsrt__fail(DSRT_EUNSUPPORTED, "shards: the datastore is not a shard set");
    dsrt_shard_plan *p = dsrt__calloc(1, sizeof *p);
    uint32_t *count = dsrt__calloc(s->nshards + 1, sizeof *count);
    int rc = -ENOMEM;
    if (!p || !count) goto fail;
    p->ds = ds;
    p->o = *o;
    if (p->o.parts == 0) p->o.parts = 1;
    p->n = ds->n;
    p->buffer = s->shuffle_buffer ? s->shuffle_buffer : 1;
    for (size_t v = 0; v < p->n; v++) count[s->shard_of[dsrt__pos(ds, v)]]++;
    for (size_t k = 0; k < s->nshards; k++) p->nocc += count[k] > 0;
    p->occ = dsrt__malloc((p->nocc ? p->nocc : 1) * sizeof *p->occ);
    p->start = dsrt__calloc(p->nocc + 1, sizeof *p->start);
    p->sorted = dsrt__malloc((p->n ? p->n : 1) * sizeof *p->sorted);
    if (!p->occ || !p->start || !p->sorted) goto fail;
    /* A counting sort by shard keeps the view's order within each shard;
     * then each shard's run goes in the order of the samples in the file. */
    uint32_t *slot = count; /* reused: next free place of each shard's run */
    size_t j = 0, at = 0;
    for (size_t k = 0; k < s->nshards; k++) {
        uint32_t c = count[k];
        if (!c) continue;
        p->occ[j] = (uint32_t)k;
        p->start[j++] = (uint32_t)at;
        slot[k] = (uint32_t)at;
        at += c;
    }
    p->start[p->nocc] = (uint32_t)at;
    for (size_t v = 0; v < p->n; v++)
        p->sorted[slot[s->shard_of[dsrt__pos(ds, v)]]++] = (uint32_t)v;
    for (size_t q = 0; q < p->nocc; q++) {
        uint32_t *run = p->sorted + p->start[q];
        size_t len = p->start[q + 1] - p->start[q];
        int in_order = 1;
        for (size_t i = 1; i < len && in_order; i++)
            in_order = dsrt__pos(ds, run[i - 1]) < dsrt__pos(ds, run[i]);
        if (!in_order) qsort_r(run, len, sizeof *run, by_index_pos, (void *)ds);
    }
    free(count);
    *out = p;
    return 0;
fail:
    free(count);
    dsrt__shard_plan_destroy(p);
    return rc;
}

void dsrt__shard_plan_destroy(dsrt_shard_plan *p) {
    if (!p) return;
    free(p->occ);
    free(p->start);
    free(p->sorted);
    free(p);
}

size_t dsrt__shard_plan_count(const dsrt_shard_plan *p) {
    return p->n;
}

/* The shuffle buffer over in[0..n), into out. */
static void mix(const uint32_t *in, size_t n, uint32_t *out, uint32_t *buf, size_t k, dsrt_rng *r) {
    size_t m = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        if (m < k) {
            buf[m++] = in[i];
            continue;
        }
        size_t j = (size_t)dsrt_rng_below(r, m);
        out[w++] = buf[j];
        buf[j] = in[i];
    }
    while (m > 0) {
        size_t j = (size_t)dsrt_rng_below(r, m);
        out[w++] = buf[j];
        buf[j] = buf[--m];
    }
}

/* Places of part r in a batch of c samples: [c * r / R, c * (r + 1) / R). */
static size_t part_lo(size_t c, unsigned r, unsigned parts) {
    return (size_t)((uint64_t)c * r / parts);
}

/*
 * Steps 1 and 2 of an epoch's plan: the shards in the epoch's order
 * (shard_order), each dealt whole to one of R lanes (lane_of, lane_n, and
 * lane_at the lanes' starts), and each lane's samples in that order laid
 * one after the other into streams. fill (R entries) is scratch.
 */
static void lay_lanes(const dsrt_shard_plan *p, uint64_t key, unsigned R, int shuffled,
                      uint32_t *shard_order, uint32_t *lane_of, size_t *lane_n, size_t *lane_at,
                      size_t *fill, uint32_t *streams) {
    for (size_t q = 0; q < p->nocc; q++) shard_order[q] = (uint32_t)q;
    if (shuffled) {
        dsrt_rng r = dsrt_rng_init(p->o.seed, key, 0, STREAM_SHARD_ORDER);
        for (size_t i = p->nocc; i > 1; i--) {
            size_t j = (size_t)dsrt_rng_below(&r, i);
            uint32_t t = shard_order[i - 1];
            shard_order[i - 1] = shard_order[j];
            shard_order[j] = t;
        }
    }
    /* Whole shards to parts: the one with the fewest samples so far. */
    for (size_t q = 0; q < p->nocc; q++) {
        uint32_t sh = shard_order[q];
        unsigned best = 0;
        for (unsigned r = 1; r < R; r++)
            if (lane_n[r] < lane_n[best]) best = r;
        lane_of[q] = best;
        lane_n[best] += p->start[sh + 1] - p->start[sh];
    }
    /* Each part's stream: its shards in the epoch's order. */
    for (unsigned r = 0; r < R; r++) lane_at[r + 1] = lane_at[r] + lane_n[r];
    for (unsigned r = 0; r < R; r++) fill[r] = lane_at[r];
    for (size_t q = 0; q < p->nocc; q++) {
        uint32_t sh = shard_order[q];
        size_t len = p->start[sh + 1] - p->start[sh];
        memcpy(streams + fill[lane_of[q]], p->sorted + p->start[sh], len * sizeof *streams);
        fill[lane_of[q]] += len;
    }
}

int dsrt__shard_plan_epoch(const dsrt_shard_plan *p, uint64_t key, unsigned from_parts,
                           uint32_t *order, uint32_t *stream, size_t *nstream, uint32_t *use) {
    /* The lanes of the run that made the order: this run's parts, or those
     * of the run a resume continues (elastic: other parts than ours). */
    const unsigned R = from_parts ? from_parts : p->o.parts;
    const int elastic = R != p->o.parts;
    const size_t n = p->n, B = p->o.batch ? p->o.batch : 1;
    const int shuffled = p->o.shuffle != DSRT_SHUFFLE_NEVER;
    int rc = -ENOMEM;
    uint32_t *shard_order = dsrt__malloc((p->nocc ? p->nocc : 1) * sizeof *shard_order);
    uint32_t *lane_of = dsrt__malloc((p->nocc ? p->nocc : 1) * sizeof *lane_of);
    size_t *lane_n = dsrt__calloc(R, sizeof *lane_n),
           *lane_at = dsrt__calloc(R + 1, sizeof *lane_at);
    size_t *take = dsrt__calloc(R, sizeof *take), *demand = dsrt__calloc(R, sizeof *demand);
    uint32_t *streams = dsrt__malloc((n ? n : 1) * sizeof *streams);
    uint32_t *mixed = dsrt__malloc((n ? n : 1) * sizeof *mixed);
    uint32_t *pool = dsrt__malloc((n ? n : 1) * sizeof *pool);
    size_t kbuf = DSRT_MIN(p->buffer, n ? n : 1);
    uint32_t *buf = dsrt__malloc(kbuf * sizeof *buf);
    if (!shard_order || !lane_of || !lane_n || !lane_at || !take || !demand || !streams || !mixed ||
        !pool || !buf)
        goto out;

    /* 1, 2. Shards in the epoch's order, dealt to the lanes. */
    lay_lanes(p, key, R, shuffled, shard_order, lane_of, lane_n, lane_at, take, streams);
    memset(take, 0, R * sizeof *take);
    /* 3. Each stream through its shuffle buffer. */
    for (unsigned r = 0; r < R; r++) {
        const uint32_t *in = streams + lane_at[r];
        uint32_t *o = mixed + lane_at[r];
        if (shuffled && kbuf > 1) {
            dsrt_rng rng = dsrt_rng_init(p->o.seed, key, r, STREAM_SHARD_MIX);
            mix(in, lane_n[r], o, buf, kbuf, &rng);
        } else {
            memcpy(o, in, lane_n[r] * sizeof *o);
        }
    }
    /* 4. The places of each part, batch by batch; a part short of samples
     * takes the surplus of the others, in order. */
    for (size_t b = 0; b * B < n; b++) {
        size_t c = DSRT_MIN(B, n - b * B);
        for (unsigned r = 0; r < R; r++) demand[r] += part_lo(c, r + 1, R) - part_lo(c, r, R);
    }
    size_t npool = 0, pool_at = 0;
    for (unsigned r = 0; r < R; r++)
        for (size_t i = demand[r]; i < lane_n[r]; i++) pool[npool++] = mixed[lane_at[r] + i];
    if (use)
        for (size_t v = 0; v < n; v++) use[v] = UINT32_MAX;
    size_t t = 0, mine = 0;
    for (size_t b = 0; b * B < n; b++) {
        size_t c = DSRT_MIN(B, n - b * B);
        for (unsigned r = 0; r < R; r++) {
            size_t places = part_lo(c, r + 1, R) - part_lo(c, r, R);
            for (size_t k = 0; k < places; k++, t++) {
                uint32_t v = take[r] < lane_n[r] ? mixed[lane_at[r] + take[r]++] : pool[pool_at++];
                order[t] = v;
                if (use && !elastic && r == p->o.part) use[v] = (uint32_t)mine++;
            }
        }
    }
    /* Elastic: this part's places of each batch, as this run stripes the
     * batches, over the order the earlier run's lanes made. */
    if (use && elastic)
        for (size_t b = 0; b * B < n; b++) {
            size_t c = DSRT_MIN(B, n - b * B);
            for (size_t k = part_lo(c, p->o.part, p->o.parts);
                 k < part_lo(c, p->o.part + 1, p->o.parts); k++)
                use[order[b * B + k]] = (uint32_t)mine++;
        }
    /* What part `part` streams: its shards' samples that it uses. Elastic:
     * none; the lanes are another run's, and this part's samples lie in
     * all of them, so each is read by offset. */
    if (stream && elastic) {
        *nstream = 0;
    } else if (stream) {
        size_t w = 0;
        unsigned me = p->o.part < R ? p->o.part : 0;
        for (size_t i = lane_at[me]; i < lane_at[me + 1]; i++)
            if (!use || use[streams[i]] != UINT32_MAX) stream[w++] = streams[i];
        *nstream = w;
    }
    rc = 0;
out:
    free(shard_order);
    free(lane_of);
    free(lane_n);
    free(lane_at);
    free(take);
    free(demand);
    free(streams);
    free(mixed);
    free(pool);
    free(buf);
    return rc;
}
