/*
 * Views (index.h): the order functions of the public API. Each returns a
 * new datastore that shares its index and holds only an array of index
 * positions: split per label, shuffle, a part of contiguous ranges, a
 * subset. The random choices are keyed by their seed alone, in streams of
 * their own, so that they never share numbers.
 */
#include "datastore/index/index.h"

#include <stdlib.h>
#include <string.h>

/* Random streams of the order functions, so that they never share numbers. */
enum { STREAM_SHUFFLE = 1, STREAM_SPLIT = 2 };

void dsrt_shuffle_indices(uint32_t *idx, size_t n, uint64_t seed, uint64_t epoch) {
    dsrt_rng r = dsrt_rng_init(seed, epoch, 0, STREAM_SHUFFLE);
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)dsrt_rng_below(&r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

int dsrt_datastore_subset(const dsrt_datastore *ds, const uint32_t *idx, size_t n,
                          dsrt_datastore **out) {
    *out = NULL;
    uint32_t *order = dsrt__malloc(n * sizeof *order);
    if (!order) return -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        if (idx[k] >= ds->n) {
            free(order);
            return dsrt__fail(DSRT_EOPTION,
                              "subset: position %u (entry %zu) out of range (%zu "
                              "samples)",
                              idx[k], k, ds->n);
        }
        order[k] = dsrt__pos(ds, idx[k]);
    }
    return dsrt__view_new(ds->index, order, n, out);
}

int dsrt_datastore_shuffle(const dsrt_datastore *ds, uint64_t seed, dsrt_datastore **out) {
    *out = NULL;
    uint32_t *order = dsrt__malloc(ds->n * sizeof *order);
    if (!order) return -ENOMEM;
    for (size_t i = 0; i < ds->n; i++) order[i] = (uint32_t)i;
    dsrt_shuffle_indices(order, ds->n, seed, 0);
    for (size_t i = 0; i < ds->n; i++) order[i] = dsrt__pos(ds, order[i]);
    return dsrt__view_new(ds->index, order, ds->n, out);
}

int dsrt__view_ranges(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order,
                      size_t *count) {
    size_t begin = (size_t)((__uint128_t)ds->n * i / n);
    size_t end = (size_t)((__uint128_t)ds->n * (i + 1) / n);
    *count = 0;
    if (!(*order = dsrt__malloc((end - begin ? end - begin : 1) * sizeof **order))) return -ENOMEM;
    for (size_t k = begin; k < end; k++) (*order)[k - begin] = dsrt__pos(ds, k);
    *count = end - begin;
    return 0;
}

int dsrt_datastore_split_each_label(const dsrt_datastore *ds, const dsrt_split_options *o,
                                    dsrt_datastore **first, dsrt_datastore **rest) {
    const dsrt_index *ix = ds->index;
    size_t nc = ix->num_classes, n = ds->n;
    size_t *count = NULL, *start = NULL, *fill = NULL;
    uint32_t *by_class = NULL, *a = NULL, *b = NULL;
    uint8_t *chosen = NULL;
    int rc = -ENOMEM;
    if (first) *first = NULL;
    if (rest) *rest = NULL;
    if (!(o->fraction > 0 && o->fraction <= 1) && !(o->fraction == 0 && o->count > 0))
        return dsrt__fail(DSRT_EOPTION,
                          "split_each_label: give a fraction in (0, 1] or a count > 0 (fraction "
                          "%g, count %zu)",
                          o->fraction, o->count);

    /* Positions of each class, in view order (a counting sort). */
    count = dsrt__calloc(nc, sizeof *count);
    start = dsrt__calloc(nc + 1, sizeof *start);
    fill = dsrt__calloc(nc, sizeof *fill);
    by_class = dsrt__malloc(n * sizeof *by_class);
    chosen = dsrt__calloc(n, 1);
    a = dsrt__malloc(n * sizeof *a);
    b = dsrt__malloc(n * sizeof *b);
    if (!count || !start || !fill || !by_class || !chosen || !a || !b) goto out;
    for (size_t i = 0; i < n; i++) count[ix->labels[dsrt__pos(ds, i)]]++;
    for (size_t c = 0; c < nc; c++) start[c + 1] = start[c] + count[c];
    for (size_t i = 0; i < n; i++) {
        int32_t c = ix->labels[dsrt__pos(ds, i)];
        by_class[start[c] + fill[c]++] = (uint32_t)i;
    }

    /* Choose the first part of each class: its first k, or k at random. */
    for (size_t c = 0; c < nc; c++) {
        size_t nk = count[c];
        size_t k =
            o->fraction > 0 ? (size_t)(o->fraction * (double)nk + 0.5) : DSRT_MIN(o->count, nk);
        uint32_t *list = by_class + start[c];
        if (o->randomized) {
            /* A partial Fisher-Yates: the first k entries become a random choice. */
            dsrt_rng r = dsrt_rng_init(o->seed, 0, c, STREAM_SPLIT);
            for (size_t j = 0; j < k; j++) {
                size_t pick = j + (size_t)dsrt_rng_below(&r, nk - j);
                uint32_t t = list[j];
                list[j] = list[pick];
                list[pick] = t;
            }
        }
        for (size_t j = 0; j < k; j++) chosen[list[j]] = 1;
    }

    /* Both parts keep the view's order. */
    size_t na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        if (chosen[i])
            a[na++] = dsrt__pos(ds, i);
        else
            b[nb++] = dsrt__pos(ds, i);
    }
    rc = 0;
    if (first) {
        rc = dsrt__view_new(ds->index, a, na, first);
        a = NULL;
    }
    if (rc == 0 && rest) {
        rc = dsrt__view_new(ds->index, b, nb, rest);
        b = NULL;
    }
    if (rc != 0 && first) {
        dsrt_datastore_close(*first);
        *first = NULL;
    }
out:
    free(count);
    free(start);
    free(fill);
    free(by_class);
    free(chosen);
    free(a);
    free(b);
    return rc;
}
