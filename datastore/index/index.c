/*
 * The index (index.h): made by a source, immutable once opened and
 * reference-counted; every view holds a reference and an array of index
 * positions, so splitting a million-sample datastore costs four bytes a
 * sample and copies no path. And the queries on a view.
 */
#include "datastore/index/index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Warning lines kept in full; later ones are only counted. */
#define WARNING_LINES 20

// ----------------------------------------------------------------------------
// Index

dsrt_index *dsrt__index_new(dsrt_source source) {
    dsrt_index *ix = dsrt__calloc(1, sizeof *ix);
    if (!ix) return NULL;
    atomic_init(&ix->refs, 0);
    ix->source = source;
    return ix;
}

void dsrt__index_free(dsrt_index *ix) {
    if (!ix) return;
    free(ix->paths);
    free(ix->labels);
    free(ix->versions);
    free(ix->classes);
    free(ix->pixels);
    free(ix->warnings);
    if (ix->data_free) ix->data_free(ix->data);
    dsrt__arena_free(&ix->arena);
    free(ix);
}

void dsrt__index_warn(dsrt_index *ix, const char *fmt, ...) {
    ix->warning_count++;
    if (ix->warning_count > WARNING_LINES) return;
    /* Whole, however long the paths in it: the reason comes last. Redacted
     * as messages are (masking may lengthen a short secret: 2n + 8 holds
     * the worst case). */
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *raw = n >= 0 ? malloc((size_t)n + 1) : NULL;
    void *buf = ix->warnings;
    size_t room = 2 * (size_t)n + 8;
    if (raw && dsrt__grow(&buf, &ix->warnings_cap, ix->warnings_len + room + 2, 1) == 0) {
        ix->warnings = buf;
        vsnprintf(raw, (size_t)n + 1, fmt, again);
        dsrt_text_redact(raw, ix->warnings + ix->warnings_len, room + 1);
        ix->warnings_len += strlen(ix->warnings + ix->warnings_len);
        ix->warnings[ix->warnings_len++] = '\n';
        ix->warnings[ix->warnings_len] = '\0';
    }
    free(raw);
    va_end(again);
}

int dsrt__index_set_classes(dsrt_index *ix, const char *const *names, size_t count) {
    const char **classes = dsrt__calloc(count ? count : 1, sizeof *classes);
    if (!classes) return -ENOMEM;
    for (size_t c = 0; c < count; c++) {
        classes[c] = dsrt__arena_strndup(&ix->arena, names[c], strlen(names[c]));
        if (!classes[c]) {
            free(classes);
            return -ENOMEM;
        }
    }
    free(ix->classes);
    ix->classes = classes;
    ix->num_classes = count;
    return 0;
}

int dsrt__view_new(dsrt_index *ix, uint32_t *order, size_t n, dsrt_datastore **out) {
    dsrt_datastore *ds = dsrt__calloc(1, sizeof *ds);
    if (!ds) {
        free(order);
        return -ENOMEM;
    }
    atomic_fetch_add(&ix->refs, 1);
    ds->index = ix;
    ds->order = order;
    ds->n = n;
    *out = ds;
    return 0;
}

void dsrt_datastore_close(dsrt_datastore *ds) {
    if (!ds) return;
    if (atomic_fetch_sub(&ds->index->refs, 1) == 1) dsrt__index_free(ds->index);
    free(ds->order);
    free(ds);
}

// ----------------------------------------------------------------------------
// Queries

dsrt_source dsrt_datastore_source(const dsrt_datastore *ds) {
    return ds->index->source;
}

size_t dsrt_datastore_count(const dsrt_datastore *ds) {
    return ds->n;
}

int dsrt_datastore_label(const dsrt_datastore *ds, size_t i) {
    return i < ds->n ? ds->index->labels[dsrt__pos(ds, i)] : -1;
}

uint32_t dsrt_datastore_id(const dsrt_datastore *ds, size_t i) {
    return i < ds->n ? dsrt__pos(ds, i) : UINT32_MAX;
}

int dsrt_datastore_remote(const dsrt_datastore *ds) {
    return ds->index->remote;
}

const char *dsrt_datastore_path(const dsrt_datastore *ds, size_t i) {
    if (i >= ds->n || !ds->index->paths) return NULL;
    return ds->index->paths[dsrt__pos(ds, i)];
}

int dsrt_datastore_pixels(const dsrt_datastore *ds, size_t i, dsrt_image *view) {
    const dsrt_index *ix = ds->index;
    if (i >= ds->n)
        return dsrt__fail(DSRT_EOPTION, "datastore: sample %zu out of range (%zu samples)", i,
                          ds->n);
    if (!ix->pixels)
        return dsrt__fail(DSRT_EUNSUPPORTED, "datastore: sample %zu is a file, not pixels", i);
    size_t bytes = (size_t)ix->width * ix->height * ix->channels;
    view->data = ix->pixels + (size_t)dsrt__pos(ds, i) * bytes;
    view->width = ix->width;
    view->height = ix->height;
    view->channels = ix->channels;
    view->stride = (size_t)ix->width * ix->channels;
    return 0;
}

size_t dsrt_datastore_num_classes(const dsrt_datastore *ds) {
    return ds->index->num_classes;
}

const char *dsrt_datastore_class_name(const dsrt_datastore *ds, size_t c) {
    return c < ds->index->num_classes ? ds->index->classes[c] : NULL;
}

void dsrt_datastore_class_counts(const dsrt_datastore *ds, size_t *counts) {
    const dsrt_index *ix = ds->index;
    memset(counts, 0, ix->num_classes * sizeof *counts);
    for (size_t i = 0; i < ds->n; i++) counts[ix->labels[dsrt__pos(ds, i)]]++;
}

const char *dsrt_datastore_warnings(const dsrt_datastore *ds) {
    return ds->index->warnings ? ds->index->warnings : "";
}

size_t dsrt_datastore_warning_count(const dsrt_datastore *ds) {
    return ds->index->warning_count;
}
