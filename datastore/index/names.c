/*
 * The names of the datastore's choices (datastore.h): sources, label
 * sources, read orders. One table each, which the tools, the Python module
 * and the library's own messages all use; the sources' is made from
 * DSRT_SOURCES, the public list the table of sources is made from too.
 */
#include "datastore/index/index.h"

#define SOURCE_NAME_(kind, value, name) [DSRT_SOURCE_##kind] = #name,
static const char *const SOURCE_NAMES[] = {[DSRT_SOURCE_AUTO] = "auto",
                                           DSRT_SOURCES(SOURCE_NAME_)[DSRT_SOURCE_MIX] = "mix"};
#undef SOURCE_NAME_

static const char *const LABEL_NAMES[] = {[DSRT_LABEL_FOLDER_NAMES] = "folder",
                                          [DSRT_LABEL_PARENT_FOLDER] = "parent",
                                          [DSRT_LABEL_NONE] = "none"};

static const char *const MIX_LABEL_NAMES[] = {
    [DSRT_MIX_LABELS_MERGE] = "merge", [DSRT_MIX_LABELS_SEPARATE] = "separate"};

static const char *const ORDER_NAMES[] = {[DSRT_SHARD_ORDER_AUTO] = "auto",
                                          [DSRT_SHARD_ORDER_EXACT] = "exact",
                                          [DSRT_SHARD_ORDER_SHARD] = "shard"};

/* names[v], or "unknown". */
static const char *name_of(const char *const *names, size_t n, int v) {
    return v >= 0 && (size_t)v < n && names[v] ? names[v] : "unknown";
}

const char *dsrt_source_name(dsrt_source s) {
    return name_of(SOURCE_NAMES, DSRT_ARRAY_SIZE(SOURCE_NAMES), (int)s);
}

int dsrt_source_from_name(const char *name, dsrt_source *s) {
    int v;
    int rc = dsrt__name_lookup(SOURCE_NAMES, DSRT_ARRAY_SIZE(SOURCE_NAMES), name, 0, &v);
    if (rc == 0) *s = (dsrt_source)v;
    return rc;
}

const char *dsrt_label_source_name(dsrt_label_source l) {
    return name_of(LABEL_NAMES, DSRT_ARRAY_SIZE(LABEL_NAMES), (int)l);
}

int dsrt_label_source_from_name(const char *name, dsrt_label_source *l) {
    int v;
    int rc = dsrt__name_lookup(LABEL_NAMES, DSRT_ARRAY_SIZE(LABEL_NAMES), name, 0, &v);
    if (rc == 0) *l = (dsrt_label_source)v;
    return rc;
}

const char *dsrt_shard_order_name(dsrt_shard_order o) {
    return name_of(ORDER_NAMES, DSRT_ARRAY_SIZE(ORDER_NAMES), (int)o);
}

int dsrt_shard_order_from_name(const char *name, dsrt_shard_order *o) {
    int v;
    int rc = dsrt__name_lookup(ORDER_NAMES, DSRT_ARRAY_SIZE(ORDER_NAMES), name, 0, &v);
    if (rc == 0) *o = (dsrt_shard_order)v;
    return rc;
}

const char *dsrt_mix_labels_name(dsrt_mix_labels l) {
    return name_of(MIX_LABEL_NAMES, DSRT_ARRAY_SIZE(MIX_LABEL_NAMES), (int)l);
}

int dsrt_mix_labels_from_name(const char *name, dsrt_mix_labels *l) {
    int v;
    int rc = dsrt__name_lookup(MIX_LABEL_NAMES, DSRT_ARRAY_SIZE(MIX_LABEL_NAMES), name, 0, &v);
    if (rc == 0) *l = (dsrt_mix_labels)v;
    return rc;
}
