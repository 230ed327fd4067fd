/*
 * The datastore handle: options, opening a path through the table of
 * sources (datastore/sources/source.h) into an index
 * (datastore/index/index.h), the queries that depend on the source (parts,
 * the read order), and reading one decoded sample on the calling thread.
 * Nothing here knows a particular source: each is a line of the table.
 */
#include "datastore/bytes/http.h"
#include "datastore/codecs/codecs.h"
#include "datastore/sources/source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Files larger than this are refused by dsrt_datastore_read_image. */
#define READ_IMAGE_MAX ((size_t)256 << 20)

// ----------------------------------------------------------------------------
// Opening

dsrt_datastore_options dsrt_datastore_defaults(void) {
    dsrt_datastore_options o;
    memset(&o, 0, sizeof o);
    o.source = DSRT_SOURCE_AUTO;
    o.label_source = DSRT_LABEL_FOLDER_NAMES;
    o.include_subfolders = 1;
    o.follow_symlinks = 1;
    o.split = DSRT_SPLIT_TRAIN;
    o.manifest_header = -1;
    o.shard_order = DSRT_SHARD_ORDER_AUTO;
    o.shuffle_buffer = 1000;
    return o;
}

static int check_options(const dsrt_datastore_options *o) {
    if (o->source != DSRT_SOURCE_AUTO && !dsrt__source_ops(o->source))
        return dsrt__fail(DSRT_EOPTION, "datastore: source %d is not a known source", o->source);
    if (o->source == DSRT_SOURCE_MIX)
        return dsrt__fail(DSRT_EOPTION, "datastore: source mix: a mix is made from datastores "
                                        "(dsrt_datastore_mix, --mix), not opened from a path");
    if ((unsigned)o->label_source > DSRT_LABEL_NONE)
        return dsrt__fail(DSRT_EOPTION, "datastore: label_source %d is not a known label source",
                          o->label_source);
    if (o->split != DSRT_SPLIT_TRAIN && o->split != DSRT_SPLIT_TEST)
        return dsrt__fail(DSRT_EOPTION, "datastore: split %d is neither train nor test", o->split);
    if (o->manifest_header < -1 || o->manifest_header > 1)
        return dsrt__fail(DSRT_EOPTION, "datastore: manifest_header %d is not -1, 0 or 1",
                          o->manifest_header);
    if ((unsigned)o->shard_order > DSRT_SHARD_ORDER_SHARD)
        return dsrt__fail(DSRT_EOPTION, "datastore: shard_order %d is not auto, exact or shard",
                          (int)o->shard_order);
    if (o->shuffle_buffer > ((size_t)1 << 24))
        return dsrt__fail(DSRT_EOPTION,
                          "datastore: shuffle_buffer %zu is not in [1, 2^24] (0: the default)",
                          o->shuffle_buffer);
    dsrt_remote_options ro;
    return dsrt__remote_opening_options(o, &ro);
}

int dsrt_datastore_open(dsrt_datastore **ds, const char *path, const dsrt_datastore_options *o) {
    dsrt_datastore_options defaults = dsrt_datastore_defaults();
    dsrt_index *ix = NULL;
    int rc;
    *ds = NULL;
    if (!o) o = &defaults;
    if (!path || !*path) return dsrt__fail(DSRT_EOPTION, "datastore: no path given");
    if ((rc = check_options(o)) != 0) return rc;

    dsrt_source kind = o->source;
    if (kind == DSRT_SOURCE_AUTO && (rc = dsrt__detect_source(path, o, &kind)) != 0) return rc;

    ix = dsrt__index_new(kind);
    if (!ix) return -ENOMEM;
    if ((rc = dsrt__source_open(ix, kind, path, o)) != 0) goto fail;
    ix->source = kind;
    if (ix->n == 0) {
        const char *hint = dsrt__source_ops(kind)->empty;
        rc = dsrt__fail(DSRT_EEMPTY, "datastore: %s: no samples found (%s source%s)", path,
                        dsrt_source_name(kind), hint ? hint : "");
        goto fail;
    }
    if (ix->n > UINT32_MAX) {
        rc = dsrt__fail(DSRT_ETOOBIG, "datastore: %s: %zu samples, more than 2^32-1", path, ix->n);
        goto fail;
    }
    if ((rc = dsrt__view_new(ix, NULL, ix->n, ds)) != 0) goto fail;
    return 0;
fail:
    dsrt__index_free(ix);
    return rc;
}

// ----------------------------------------------------------------------------
// Parts, the read order and shards: the source's, else ranges, the exact
// order and none

int dsrt_datastore_partition(const dsrt_datastore *ds, size_t n, size_t i, dsrt_datastore **out) {
    *out = NULL;
    if (n == 0 || i >= n)
        return dsrt__fail(DSRT_EOPTION, "partition: part %zu of %zu does not exist", i, n);
    const dsrt_source_ops *src = dsrt__source_of(ds);
    uint32_t *order;
    size_t count;
    int rc = src && src->partition ? src->partition(ds, n, i, &order, &count)
                                   : dsrt__view_ranges(ds, n, i, &order, &count);
    return rc ? rc : dsrt__view_new(ds->index, order, count, out);
}

size_t dsrt_datastore_shard_count(const dsrt_datastore *ds) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    return src && src->shard_count ? src->shard_count(ds) : 0;
}

const char *dsrt_datastore_shard_path(const dsrt_datastore *ds, size_t k) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    return src && src->shard_path ? src->shard_path(ds, k) : NULL;
}

int dsrt_datastore_location(const dsrt_datastore *ds, size_t i, dsrt_sample_location *loc) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    if (!src || !src->location)
        return dsrt__fail(DSRT_EUNSUPPORTED, "datastore: a %s datastore has no shards",
                          dsrt_source_name(ds->index->source));
    if (i >= ds->n)
        return dsrt__fail(DSRT_EOPTION, "datastore: sample %zu out of range (%zu samples)", i,
                          ds->n);
    return src->location(ds, i, loc);
}

dsrt_shard_order dsrt_datastore_shard_order(const dsrt_datastore *ds) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    return src && src->order ? src->order(ds) : DSRT_SHARD_ORDER_EXACT;
}

size_t dsrt_datastore_shuffle_buffer(const dsrt_datastore *ds) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    return src && src->shuffle_buffer ? src->shuffle_buffer(ds) : 0;
}

// ----------------------------------------------------------------------------
// One decoded sample, on the calling thread

/* Converts in-memory pixels to the channels asked, into dst or the scratch. */
static int convert_pixels(const dsrt_image *src, dsrt_decoder *d, const dsrt_decode_request *req,
                          dsrt_image *out) {
    int ch = req->channels == 3 && req->allow_gray && src->channels == 1 ? 1 : req->channels;
    size_t pixels = (size_t)src->width * src->height, bytes = pixels * (size_t)ch;
    uint8_t *dst = req->dst;
    if (dst && req->dst_cap < bytes)
        return dsrt__fail(DSRT_ETOOBIG, "decode: destination holds %zu bytes, image needs %zu",
                          req->dst_cap, bytes);
    if (!dst && !(dst = dsrt__decoder_pixel_buffer(d, bytes))) return -ENOMEM;
    if (ch == src->channels)
        memcpy(dst, src->data, bytes);
    else if (ch == 1)
        dsrt__rgb_to_gray(src->data, dst, pixels);
    else
        dsrt__gray_to_rgb(src->data, dst, pixels);
    out->data = dst;
    out->width = src->width;
    out->height = src->height;
    out->channels = ch;
    out->stride = (size_t)src->width * ch;
    return 0;
}

static uint8_t *file_buffer(void *ctx, size_t need) {
    return dsrt__decoder_file_buffer(ctx, need);
}

int dsrt_datastore_read_image(const dsrt_datastore *ds, size_t i, dsrt_decoder *d,
                              const dsrt_decode_request *req, dsrt_image *out) {
    if (i >= ds->n)
        return dsrt__fail(DSRT_EOPTION, "read: sample %zu out of range (%zu samples)", i, ds->n);
    if (req->channels != 1 && req->channels != 3)
        return dsrt__fail(DSRT_EOPTION, "decode: channels must be 1 or 3, not %d", req->channels);
    if (ds->index->pixels) {
        dsrt_image view;
        dsrt_datastore_pixels(ds, i, &view);
        return convert_pixels(&view, d, req, out);
    }
    const char *path = dsrt_datastore_path(ds, i);
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = dsrt__sample_read(ds, i, READ_IMAGE_MAX, file_buffer, d, &data, &size, NULL);
    if (rc != 0) return rc;
    if (size == 0) return dsrt__fail(DSRT_EEMPTY, "read: %s: empty file", path);
    rc = dsrt_decode(d, data, size, req, out);
    if (rc != 0) {
        /* "decode: reason" from the decoder becomes "decode: PATH: reason". */
        const char *msg = dsrt_last_error();
        if (strncmp(msg, "decode: ", 8) == 0) msg += 8;
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", msg);
        return dsrt__fail(rc, "decode: %s: %s", path, reason[0] ? reason : dsrt_strerror(rc));
    }
    return 0;
}
