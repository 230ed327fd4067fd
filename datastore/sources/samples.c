/*
 * Reading samples whatever their source (source.h): a reader of sample
 * bytes for one thread, the feed of a pipeline, one sample on the calling
 * thread, the folders samples come from. Each asks the source's table
 * entry, and where the source reads nothing of its own (its samples are
 * whole files by path), does the files' part itself: a dsrt_reader on the
 * paths, a read of the file or object.
 */
#include "datastore/sources/source.h"

#include "datastore/bytes/cache.h"
#include "datastore/bytes/http.h"
#include "datastore/bytes/url.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dsrt_sample_reader {
    const dsrt_sample_reader_ops *ops;
    void *impl;
};

// ----------------------------------------------------------------------------
// Whole files by path: a dsrt_reader

typedef struct {
    dsrt_reader *r;
    const dsrt_datastore *ds;
} path_reader;

static int path_submit(void *r, uint32_t pos, uint64_t epoch, void *buf, size_t cap, uint64_t tag) {
    path_reader *p = r;
    const char *path = dsrt_datastore_path(p->ds, pos);
    /* Objects of a listing: their versions, for a cache; the epoch, for
     * its eviction. */
    const uint64_t *v = p->ds->index->versions;
    return dsrt__reader_submit_sample(p->r, path, v ? v[dsrt__pos(p->ds, pos)] : 0, epoch, buf, cap,
                                      tag);
}
static int path_collect(void *r, dsrt_read_result *res, int wait) {
    return dsrt_reader_collect(((path_reader *)r)->r, res, wait);
}
static void path_cancel(void *r) {
    dsrt_reader_cancel(((path_reader *)r)->r);
}
static size_t path_need(const void *r, uint32_t pos) {
    (void)r, (void)pos;
    return 0; /* learnt from a first read */
}
static dsrt_io path_io(const void *r) {
    return dsrt_reader_io(((const path_reader *)r)->r);
}
static const char *path_fallback(const void *r) {
    return dsrt_reader_fallback_reason(((const path_reader *)r)->r);
}
static uint64_t path_direct_refused(const void *r) {
    return dsrt_reader_direct_refused(((const path_reader *)r)->r);
}
static void path_remote_stats(const void *r, dsrt_remote_stats *s) {
    dsrt_reader_remote_stats(((const path_reader *)r)->r, s);
}
static void path_destroy(void *r) {
    path_reader *p = r;
    if (!p) return;
    dsrt_reader_destroy(p->r);
    free(p);
}

static const dsrt_sample_reader_ops PATH_OPS = {
    .submit = path_submit,
    .collect = path_collect,
    .cancel = path_cancel,
    .need = path_need,
    .io = path_io,
    .fallback = path_fallback,
    .direct_refused = path_direct_refused,
    .remote_stats = path_remote_stats,
    .destroy = path_destroy,
};

int dsrt__path_reader(void **impl, const dsrt_sample_reader_ops **ops, const dsrt_datastore *ds,
                      const dsrt_reader_options *o) {
    path_reader *p = dsrt__calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->ds = ds;
    int rc = dsrt_reader_create(&p->r, o);
    if (rc != 0) {
        free(p);
        return rc;
    }
    *impl = p;
    *ops = &PATH_OPS;
    return 0;
}

// ----------------------------------------------------------------------------
// The reader, whatever the source

int dsrt__sample_reader_create(dsrt_sample_reader **out, const dsrt_datastore *ds,
                               const dsrt_reader_options *o, dsrt_feed *feed) {
    *out = NULL;
    const dsrt_source_ops *src = dsrt__source_of(ds);
    dsrt_sample_reader *r = dsrt__calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    int rc;
    if (src && src->reader) {
        rc = src->reader(&r->impl, &r->ops, ds, o, feed);
    } else {
        rc = dsrt__path_reader(&r->impl, &r->ops, ds, o);
    }
    if (rc != 0) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void dsrt__sample_reader_destroy(dsrt_sample_reader *r) {
    if (!r) return;
    r->ops->destroy(r->impl);
    free(r);
}

int dsrt__sample_submit(dsrt_sample_reader *r, uint32_t pos, uint64_t epoch, void *buf, size_t cap,
                        uint64_t tag) {
    return r->ops->submit(r->impl, pos, epoch, buf, cap, tag);
}

int dsrt__sample_collect(dsrt_sample_reader *r, dsrt_read_result *res, int wait) {
    return r->ops->collect(r->impl, res, wait);
}

void dsrt__sample_cancel(dsrt_sample_reader *r) {
    r->ops->cancel(r->impl);
}

size_t dsrt__sample_need(const dsrt_sample_reader *r, uint32_t pos) {
    return r->ops->need(r->impl, pos);
}

dsrt_io dsrt__sample_io(const dsrt_sample_reader *r) {
    return r->ops->io(r->impl);
}

const char *dsrt__sample_fallback(const dsrt_sample_reader *r) {
    return r->ops->fallback(r->impl);
}

uint64_t dsrt__sample_direct_refused(const dsrt_sample_reader *r) {
    return r->ops->direct_refused(r->impl);
}

void dsrt__sample_remote_stats(const dsrt_sample_reader *r, dsrt_remote_stats *s) {
    r->ops->remote_stats(r->impl, s);
}

// ----------------------------------------------------------------------------
// The feed

int dsrt__feed_open(dsrt_feed **f, const dsrt_datastore *ds, const dsrt_feed_options *o) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    *f = NULL;
    return src && src->feed ? src->feed(f, ds, o) : 0;
}

void dsrt__feed_destroy(dsrt_feed *f) {
    if (!f) return;
    f->ops->destroy(f->impl);
    free(f);
}

// ----------------------------------------------------------------------------
// One sample on the calling thread

/* A file at path: open, measure, read. */
static int file_read(const char *path, size_t max, dsrt_buf_fn buf, void *ctx, uint8_t **data,
                     size_t *size, int64_t *mtime) {
    int rc, fd;
    struct stat st;
    if ((rc = dsrt__open_regular(path, &fd, &st)) != 0) return dsrt__fail_prefix(rc, "read");
    if (mtime) *mtime = (int64_t)st.st_mtime;
    if ((uint64_t)st.st_size > max) {
        rc = dsrt__fail(DSRT_ETOOBIG, "read: %s: %lld bytes, more than %zu", path,
                        (long long)st.st_size, max);
        goto out;
    }
    size_t got = 0, want = (size_t)st.st_size;
    uint8_t *b = buf(ctx, want ? want : 1);
    if (!b) {
        rc = -ENOMEM;
        goto out;
    }
    while (got < want) {
        ssize_t r = pread(fd, b + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dsrt__fail(-errno, "read: %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0) break; /* the file shrank after fstat */
        got += (size_t)r;
    }
    *data = b;
    *size = got;
    rc = 0;
out:
    close(fd);
    return rc;
}

/* An object at a URL, fetched whole. */
static int object_read(const char *url, size_t max, dsrt_buf_fn buf, void *ctx, uint8_t **data,
                       size_t *size) {
    uint8_t *tmp;
    size_t len;
    int rc = dsrt__remote_read_whole(url, max, &tmp, &len);
    if (rc != 0) return dsrt__fail_prefix(rc, "read");
    uint8_t *b = buf(ctx, len ? len : 1);
    if (b) memcpy(b, tmp, len);
    free(tmp);
    if (!b) return -ENOMEM;
    *data = b;
    *size = len;
    return 0;
}

int dsrt__sample_read(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                      uint8_t **data, size_t *size, int64_t *mtime) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    const char *path = dsrt_datastore_path(ds, i);
    *data = NULL;
    *size = 0;
    if (mtime) *mtime = 0;
    if (src && src->read) return src->read(ds, i, max, buf, ctx, data, size, mtime);
    if (!path) return dsrt__fail(DSRT_EUNSUPPORTED, "read: sample %zu is pixels in memory", i);
    if (dsrt__is_url(path)) return object_read(path, max, buf, ctx, data, size);
    return file_read(path, max, buf, ctx, data, size, mtime);
}

// ----------------------------------------------------------------------------
// Folders

int dsrt__sample_folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir),
                         void *ctx) {
    const dsrt_source_ops *src = dsrt__source_of(ds);
    const dsrt_index *ix = ds->index;
    if (src && src->folders) return src->folders(ds, each, ctx);
    char dir[4096], prev[4096] = "";
    int rc = 0;
    for (size_t i = 0; rc == 0 && ix->paths && i < ix->n; i++) {
        if (dsrt__is_url(ix->paths[i])) continue;
        dsrt__dir_of(ix->paths[i], dir, sizeof dir);
        if (strcmp(dir, prev) != 0) rc = each(ctx, dir);
        memcpy(prev, dir, sizeof dir);
    }
    return rc;
}
