/*
 * A shard set (members.h): made and freed, its read order settled, parts
 * of whole shards, a sample read on the calling thread.
 */
#include "datastore/sources/members/members.h"

#include "datastore/bytes/http.h"
#include "datastore/bytes/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// The set

static void shardset_free(void *p) {
    dsrt_shardset *s = p;
    if (!s) return;
    free(s->shards);
    free(s->offset);
    free(s->size);
    free(s->shard_of);
    free(s->member);
    if (s->codec_free) s->codec_free(s->codec_data);
    free(s);
}

dsrt_shardset *dsrt__shardset_new(dsrt_index *ix, size_t nshards, size_t n) {
    dsrt_shardset *s = dsrt__calloc(1, sizeof *s);
    if (!s) return NULL;
    ix->data = s;
    ix->data_free = shardset_free;
    s->nshards = nshards;
    s->shards = dsrt__calloc(nshards ? nshards : 1, sizeof *s->shards);
    s->offset = dsrt__calloc(n ? n : 1, sizeof *s->offset);
    s->size = dsrt__calloc(n ? n : 1, sizeof *s->size);
    s->shard_of = dsrt__calloc(n ? n : 1, sizeof *s->shard_of);
    s->member = dsrt__calloc(n ? n : 1, sizeof *s->member);
    if (!s->shards || !s->offset || !s->size || !s->shard_of || !s->member) return NULL;
    return s;
}

/* 1 when the shard files lie on a disk the kernel calls rotational. */
static int on_rotational(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    char p[128];
    unsigned ma = major(st.st_dev), mi = minor(st.st_dev);
    const char *forms[] = {"/sys/dev/block/%u:%u/queue/rotational",
                           "/sys/dev/block/%u:%u/../queue/rotational"};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, forms[k], ma, mi);
        FILE *f = fopen(p, "re");
        if (!f) continue;
        int v = 0;
        int got = fscanf(f, "%d", &v);
        fclose(f);
        if (got == 1) return v == 1;
    }
    return 0;
}

void dsrt__shardset_settle(dsrt_shardset *s, const dsrt_datastore_options *o,
                           const char *first_shard) {
    s->rotational = !s->remote && on_rotational(first_shard);
    s->shuffle_buffer = o->shuffle_buffer ? o->shuffle_buffer : 1000;
    s->order = o->shard_order;
    if (s->order == DSRT_SHARD_ORDER_AUTO)
        s->order = s->indexed && !s->rotational && !s->remote ? DSRT_SHARD_ORDER_EXACT
                                                              : DSRT_SHARD_ORDER_SHARD;
}

dsrt_shard_order dsrt__members_order(const dsrt_datastore *ds) {
    return dsrt__shardset_of(ds)->order;
}

size_t dsrt__members_shuffle_buffer(const dsrt_datastore *ds) {
    return dsrt__shardset_of(ds)->shuffle_buffer;
}

size_t dsrt__members_shard_count(const dsrt_datastore *ds) {
    return dsrt__shardset_of(ds)->nshards;
}

const char *dsrt__members_shard_path(const dsrt_datastore *ds, size_t k) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    return k < s->nshards ? s->shards[k].path : NULL;
}

int dsrt__members_location(const dsrt_datastore *ds, size_t i, dsrt_sample_location *loc) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    uint32_t p = dsrt__pos(ds, i);
    loc->shard = s->shard_of[p];
    loc->offset = s->offset[p];
    loc->size = s->size[p];
    loc->member = ds->index->paths[p] + s->member[p];
    return 0;
}

uint64_t dsrt__shard_sample_size(const dsrt_datastore *ds, uint32_t pos) {
    return dsrt__shardset_of(ds)->size[dsrt__pos(ds, pos)];
}

int dsrt__members_folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir),
                          void *ctx) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    char dir[4096], prev[4096] = "";
    int rc = 0;
    for (size_t k = 0; rc == 0 && !s->remote && k < s->nshards; k++) {
        dsrt__dir_of(s->shards[k].path, dir, sizeof dir);
        if (strcmp(dir, prev) != 0) rc = each(ctx, dir);
        memcpy(prev, dir, sizeof dir);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// Parts of whole shards

int dsrt__shards_partition(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order,
                           size_t *count) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    size_t ns = s->nshards;
    size_t *per = dsrt__calloc(ns + 1, sizeof *per);
    size_t *occ = dsrt__calloc(ns + 1, sizeof *occ);
    uint8_t *mine = dsrt__calloc(ns ? ns : 1, 1);
    int rc = -ENOMEM;
    *order = NULL;
    *count = 0;
    if (!per || !occ || !mine) goto out;
    for (size_t v = 0; v < ds->n; v++) per[s->shard_of[dsrt__pos(ds, v)]]++;
    /* The shards that hold samples of the view, in shard order. */
    size_t nocc = 0;
    for (size_t k = 0; k < ns; k++)
        if (per[k]) occ[nocc++] = k;
    if (nocc < n) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "partition: the samples lie in %zu shard%s, too few for %zu parts of whole "
                        "shards",
                        nocc, nocc == 1 ? "" : "s", n);
        goto out;
    }
    /* Cut j before the shard where the running count comes closest to
     * total * j / n, leaving every part a shard at least. */
    size_t lo = 0, hi = nocc, run = 0, j = 0, k = 0;
    for (size_t p = 1; p <= i + 1 && p <= n; p++) {
        size_t cut = nocc;
        if (p < n) {
            double want = (double)ds->n * (double)p / (double)n;
            while (k < nocc && (double)(run + per[occ[k]]) <= want) run += per[occ[k++]];
            cut = k;
            if (k < nocc && want - (double)run > (double)(run + per[occ[k]]) - want) {
                run += per[occ[k++]];
                cut = k;
            }
            cut = DSRT_MAX(cut, j + 1);
            cut = DSRT_MIN(cut, nocc - (n - p));
            while (k < cut) run += per[occ[k++]];
            while (k > cut) run -= per[occ[--k]];
        }
        if (p == i) lo = cut;
        if (p == i + 1) hi = cut;
        j = cut;
    }
    size_t m = 0;
    for (size_t q = lo; q < hi; q++) {
        mine[occ[q]] = 1;
        m += per[occ[q]];
    }
    *order = dsrt__malloc((m ? m : 1) * sizeof **order);
    if (!*order) goto out;
    for (size_t v = 0; v < ds->n; v++) {
        uint32_t p = dsrt__pos(ds, v);
        if (mine[s->shard_of[p]]) (*order)[(*count)++] = p;
    }
    rc = 0;
out:
    free(per);
    free(occ);
    free(mine);
    return rc;
}

// ----------------------------------------------------------------------------
// One sample on the calling thread

/* The range [off, off + want) of shard into buf: *got bytes of it (fewer
 * when the shard ends first), *mtime the shard's. */
static int range_read(const dsrt_shardset *s, const char *shard, const char *path, uint64_t off,
                      size_t want, uint8_t *buf, size_t *got, int64_t *mtime) {
    int rc = 0;
    *got = 0;
    if (s->remote) {
        /* A ranged GET with a client of its own. */
        rc = dsrt__remote_read_range(shard, off, want, buf, got);
        return rc == DSRT_ETRUNCATED ? 0 : rc;
    }
    int fd;
    struct stat st;
    if ((rc = dsrt__open_regular(shard, &fd, &st)) != 0) return dsrt__fail_prefix(rc, "read");
    if (mtime) *mtime = (int64_t)st.st_mtime;
    while (*got < want) {
        ssize_t r = pread(fd, buf + *got, want - *got, (off_t)(off + *got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dsrt__fail(-errno, "read: %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    close(fd);
    return rc;
}

int dsrt__members_read(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                       uint8_t **data, size_t *size, int64_t *mtime) {
    const dsrt_shardset *s = dsrt__shardset_of(ds);
    uint32_t p = dsrt__pos(ds, i);
    const char *shard = s->shards[s->shard_of[p]].path, *path = ds->index->paths[p];
    size_t want = (size_t)s->size[p], got = 0;
    size_t need = s->codec ? (size_t)DSRT_MAX((uint64_t)want, s->codec->decoded_size(s, p)) : want;
    if (mtime) *mtime = 0;
    if (need > max)
        return dsrt__fail(DSRT_ETOOBIG, "read: %s: %zu bytes, more than %zu", path, need, max);
    uint8_t *b = buf(ctx, need ? need : 1);
    if (!b) return -ENOMEM;
    *data = b;
    *size = 0;
    if (want == 0) return dsrt__fail(DSRT_EEMPTY, "read: %s: empty member", path);
    int rc = range_read(s, shard, path, s->offset[p], want, b, &got, mtime);
    if (rc != 0) return rc;
    if (got < want)
        return dsrt__fail(DSRT_ETRUNCATED,
                          "read: %s: member cut short (%zu of %zu bytes): the shard is truncated",
                          path, got, want);
    *size = want;
    return s->codec ? s->codec->decode(s, p, path, b, need ? need : 1, want, size) : 0;
}
