/*
 * Getting sample bytes out of tar shards, for the pipeline's workers.
 *
 * The shard reader belongs to one worker thread and has the shape of
 * dsrt_reader (submit samples, collect results), so the pipeline drives
 * both the same way. Each sample is a byte range of its shard. Reads queued
 * since the last collect go to the kernel together; neighbours in the same
 * shard (a gap of at most MERGE_GAP between them: the tar headers, a .cls
 * member) become one vectored read that lands each sample in its own buffer
 * and the gaps in a scratch page, so walking a shard in order costs a few
 * large reads rather than one a sample. With O_DIRECT each sample is read
 * alone, from the block boundary before it, and moved to its buffer's start.
 * Shard files stay open in a small cache (most recently used). Reads go
 * through the io engine (datastore/bytes/io.h: io_uring or pread).
 *
 * The stream serves the shard order. One thread per pipeline reads the
 * shards of each epoch front to back in blocks of a few MiB (several in
 * flight), in the order dsrt__shard_plan_epoch gives, and keeps the bytes of
 * each sample until a worker takes them. It reads at most shuffle_buffer +
 * ahead samples past the furthest one asked for, so memory stays bounded by
 * the shuffle buffer. A sample the stream will never deliver again (taken
 * twice, as the replacement of a bad sample; left behind by a resume; lent
 * to this part by another) is read by offset instead, so every request is
 * answered whatever the timing. The stream keeps the plans (and the samples
 * not yet taken) of every epoch the consumer may still ask for, and one
 * more: the one it reads ahead into. A worker that lags behind the others
 * at an epoch's end still finds its samples there.
 *
 * Shards in an object store (s3://, https://) are read through dsrt's HTTP
 * client (datastore/bytes/http.c) the same way: each sample by a ranged GET (many
 * in flight, reader.remote.depth), the stream's blocks by ranged GETs of
 * 8 MiB, eight in flight.
 */
#include "datastore/sources/members/members.h"

#include "datastore/bytes/http.h"
#include "datastore/bytes/io.h"

#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FD_CACHE            16                 /* shard files a reader keeps open */
#define MERGE_GAP           ((size_t)64 << 10) /* bytes between neighbours read along */
#define MERGE_BYTES         ((size_t)16 << 20) /* bytes one merged read covers at most */
#define MERGE_COUNT         64                 /* samples one merged read holds at most */
#define STREAM_BLOCK        ((size_t)4 << 20)  /* default bytes a stream read */
#define STREAM_DEPTH        4                  /* stream reads in flight */
#define STREAM_BLOCK_REMOTE ((size_t)8 << 20)  /* the same from an object store */
#define STREAM_DEPTH_REMOTE 8
#define STREAM_DEPTH_MAX    8
#define REMOTE_POLL_MS      2 /* a worker waiting on both the store and the stream */
#define STREAM_FDS          4 /* shard files the stream keeps open */
#define NONE                UINT32_MAX

static size_t align_down(uint64_t x) {
    return (size_t)dsrt__align_down(x);
}

static uint64_t align_up(uint64_t x) {
    return dsrt__align_up(x);
}

/* The message of a failed sample read, on this thread. */
static void fail_msg(int status, const char *path, uint64_t got, uint64_t want) {
    switch (status) {
    case DSRT_ETRUNCATED:
        dsrt__fail(status,
                   "read: %s: member cut short (%llu of %llu bytes): the shard is truncated", path,
                   (unsigned long long)got, (unsigned long long)want);
        break;
    case DSRT_EEMPTY:
        dsrt__fail(status, "read: %s: empty member", path);
        break;
    case DSRT_ETOOBIG:
        dsrt__fail(status, "read: %s: %llu bytes, larger than the buffer", path,
                   (unsigned long long)want);
        break;
    default:
        dsrt__fail(status, "read: %s: %s", path, dsrt_strerror(status));
        break;
    }
}

// ----------------------------------------------------------------------------
// The reader

enum { REQ_FREE = 0, REQ_QUEUED, REQ_KERNEL, REQ_STREAM, REQ_DONE };

typedef struct {
    uint32_t pos; /* view position */
    uint64_t epoch;
    uint8_t *buf;
    size_t cap;
    uint64_t tag;
    const char *path; /* "SHARD:MEMBER" */
    uint32_t shard;
    uint64_t off, size; /* of the member */
    uint64_t done;      /* bytes of it in buf */
    size_t lead;        /* O_DIRECT: bytes before the member at buf's start */
    int status;
    int state;
    int next; /* the next request of its merged read, or -1 */
    int fdi;  /* its shard's cache entry while a read is in flight */
    int retries;
    char *msg; /* a failure's message (a store's, a shard not a file), or NULL */
} sreq;

/* One read in flight: a run of requests. */
typedef struct {
    dsrt_io_op op;
    int first; /* request, -1 when free */
    int fdi;
    uint64_t off; /* where the read starts */
    size_t len;
    unsigned niov;
    struct iovec iov[2 * MERGE_COUNT];
} sread;

/* The read an engine op belongs to. */
static sread *read_of(dsrt_io_op *op) {
    return (sread *)((char *)op - offsetof(sread, op));
}

struct dsrt_shard_reader {
    const dsrt_datastore *ds;
    const dsrt_shardset *set;
    dsrt_shard_stream *stream;
    dsrt_io_engine *io;
    unsigned depth;
    int direct;
    uint64_t direct_refused;

    sreq *reqs;     /* (depth) */
    int *free_reqs; /* (depth) stack */
    unsigned nfree;
    int *queued; /* (depth) requests waiting to be read, in submit order */
    unsigned nqueued;
    int *done; /* (depth) FIFO of finished requests */
    unsigned done_head, ndone;
    unsigned nstream; /* requests waiting on the stream */
    sread *reads;     /* (depth) */
    dsrt_io_fdcache fds;
    uint8_t *gap;     /* (MERGE_GAP) where the bytes between neighbours go */
    dsrt_http *http;  /* shards in an object store: the client */
    unsigned in_http; /* requests the client holds */
};

static void done_push(dsrt_shard_reader *r, int i) {
    r->reqs[i].state = REQ_DONE;
    r->done[(r->done_head + r->ndone) % r->depth] = i;
    r->ndone++;
}

dsrt_io dsrt__shard_reader_io(const dsrt_shard_reader *r) {
    return dsrt__io_kind(r->io);
}

const char *dsrt__shard_reader_fallback_reason(const dsrt_shard_reader *r) {
    return dsrt__io_fallback(r->io);
}

uint64_t dsrt__shard_reader_direct_refused(const dsrt_shard_reader *r) {
    return r->direct_refused;
}

unsigned dsrt__shard_reader_in_flight(const dsrt_shard_reader *r) {
    return r->depth - r->nfree;
}

/* Buffer bytes a range of size bytes needs (more with O_DIRECT). */
static size_t range_need(const dsrt_shard_reader *r, size_t size) {
    return r->direct ? (size_t)align_up(size + DSRT_DIRECT_ALIGN) : size;
}

/* Buffer bytes sample p (an index position) needs: its range, and its
 * decoded size where a codec decodes it in place. */
static size_t sample_need(const dsrt_shard_reader *r, uint32_t p) {
    size_t need = range_need(r, (size_t)r->set->size[p]);
    if (r->set->codec)
        need = (size_t)DSRT_MAX((uint64_t)need, r->set->codec->decoded_size(r->set, p));
    return need;
}

size_t dsrt__shard_reader_need(const dsrt_shard_reader *r, uint32_t pos) {
    return sample_need(r, dsrt__pos(r->ds, pos));
}

int dsrt__shard_reader_create(dsrt_shard_reader **out, const dsrt_datastore *ds,
                              const dsrt_reader_options *o, dsrt_shard_stream *stream) {
    dsrt_reader_options opt = o ? *o : dsrt_reader_defaults();
    *out = NULL;
    if (!ds->index->data) return dsrt__fail(DSRT_EUNSUPPORTED, "shards: not a shard set");
    if (opt.depth < 1 || opt.depth > 4096)
        return dsrt__fail(DSRT_EOPTION, "shards: reader depth %u is not in 1..4096", opt.depth);
    dsrt_shard_reader *r = dsrt__calloc(1, sizeof *r);
    int rc = -ENOMEM;
    if (!r) return rc;
    r->ds = ds;
    r->set = dsrt__shardset_of(ds);
    r->stream = stream;
    r->depth = r->set->remote ? DSRT_MAX(1u, DSRT_MIN(opt.remote.depth, 4096u)) : opt.depth;
    if (r->set->remote) {
        opt.direct = 0; /* nothing to bypass */
        opt.remote.depth = r->depth;
        if ((rc = dsrt__http_create(&r->http, &opt.remote)) != 0) goto fail;
        rc = -ENOMEM;
    }
    r->direct = opt.direct != 0;
    r->reqs = dsrt__calloc(r->depth, sizeof *r->reqs);
    r->free_reqs = dsrt__calloc(r->depth, sizeof *r->free_reqs);
    r->queued = dsrt__calloc(r->depth, sizeof *r->queued);
    r->done = dsrt__calloc(r->depth, sizeof *r->done);
    r->reads = dsrt__calloc(r->depth, sizeof *r->reads);
    r->gap = dsrt__malloc(MERGE_GAP);
    if (!r->reqs || !r->free_reqs || !r->queued || !r->done || !r->reads || !r->gap) goto fail;
    for (unsigned i = 0; i < r->depth; i++) {
        r->free_reqs[r->nfree++] = (int)(r->depth - 1 - i);
        r->reads[i].first = -1;
    }
    if ((rc = dsrt__fdcache_init(&r->fds, FD_CACHE)) != 0) goto fail;
    if ((rc = dsrt__io_create(&r->io, opt.io, r->depth * 2, "shards: reader")) != 0) goto fail;
    *out = r;
    return 0;
fail:
    dsrt__shard_reader_destroy(r);
    return rc;
}

void dsrt__shard_reader_destroy(dsrt_shard_reader *r) {
    if (!r) return;
    /* The kernel still writes into the callers' buffers: the engine waits
     * for it. */
    dsrt__io_destroy(r->io);
    dsrt__fdcache_free(&r->fds);
    dsrt__http_destroy(r->http);
    for (unsigned i = 0; r->reqs && i < r->depth; i++) free(r->reqs[i].msg);
    free(r->reqs);
    free(r->free_reqs);
    free(r->queued);
    free(r->done);
    free(r->reads);
    free(r->gap);
    free(r);
}

/* The cache entry of shard k, opening it when needed; -1 with q's status
 * set when it cannot be. */
static int fd_get(dsrt_shard_reader *r, uint32_t k, sreq *q) {
    int e = dsrt__fdcache_get(&r->fds, k, r->set->shards[k].path, r->direct, &r->direct_refused);
    if (e >= 0) return e;
    q->status = e;
    if (e == DSRT_EFORMAT) q->msg = dsrt__strdup(dsrt_last_error());
    return -1;
}

int dsrt__shard_reader_submit(dsrt_shard_reader *r, uint32_t pos, uint64_t epoch, void *buf,
                              size_t cap, uint64_t tag) {
    assert(r && (buf || cap == 0));
    if (r->nfree == 0)
        return dsrt__fail(-EBUSY, "read: %s: %u reads already in flight",
                          dsrt_datastore_path(r->ds, pos), r->depth);
    if (r->direct && ((uintptr_t)buf % DSRT_DIRECT_ALIGN != 0 || cap % DSRT_DIRECT_ALIGN != 0))
        return dsrt__fail(-EINVAL, "read: O_DIRECT needs a buffer aligned to %d bytes",
                          DSRT_DIRECT_ALIGN);
    int i = r->free_reqs[--r->nfree];
    sreq *q = &r->reqs[i];
    uint32_t p = dsrt__pos(r->ds, pos);
    free(q->msg);
    *q = (sreq){.pos = pos,
                .epoch = epoch,
                .buf = buf,
                .cap = cap,
                .tag = tag,
                .path = r->ds->index->paths[p],
                .shard = r->set->shard_of[p],
                .off = r->set->offset[p],
                .size = r->set->size[p],
                .next = -1,
                .fdi = -1};
    if (q->size == 0) {
        q->status = DSRT_EEMPTY;
        done_push(r, i);
        return 0;
    }
    if (sample_need(r, p) > cap) {
        q->status = DSRT_ETOOBIG;
        done_push(r, i);
        return 0;
    }
    if (r->stream) {
        q->state = REQ_STREAM;
        r->nstream++;
        return 0;
    }
    q->state = REQ_QUEUED;
    r->queued[r->nqueued++] = i;
    return 0;
}

/* Orders queued requests by shard, then offset. */
static int by_place(const void *a, const void *b, void *ctx) {
    const sreq *reqs = ctx;
    const sreq *x = &reqs[*(const int *)a], *y = &reqs[*(const int *)b];
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* A free read record. */
static sread *read_new(dsrt_shard_reader *r) {
    for (unsigned k = 0; k < r->depth; k++)
        if (r->reads[k].first < 0) return &r->reads[k];
    return NULL;
}

/* Builds the iovecs of read d from its requests (each from its done bytes:
 * a retried request starts where it stopped). */
static void read_layout(dsrt_shard_reader *r, sread *d) {
    d->niov = 0;
    sreq *q = &r->reqs[d->first];
    int direct = r->fds.e[d->fdi].direct;
    if (direct) {
        /* One request, from the block boundary before it. */
        if (q->done == 0) {
            q->lead = (size_t)(q->off - align_down(q->off));
            d->off = align_down(q->off);
            d->len = (size_t)align_up(q->lead + q->size);
            d->iov[0] = (struct iovec){q->buf, d->len};
        } else {
            size_t have = q->lead + (size_t)q->done;
            size_t at = align_down(have);
            d->off = align_down(q->off) + at;
            d->len = (size_t)align_up(q->lead + q->size) - at;
            d->iov[0] = (struct iovec){q->buf + at, d->len};
        }
        d->niov = 1;
        return;
    }
    d->off = q->off + q->done;
    uint64_t end = d->off;
    for (int i = d->first; i >= 0; i = r->reqs[i].next) {
        sreq *s = &r->reqs[i];
        uint64_t from = s->off + s->done;
        if (from > end) {
            d->iov[d->niov++] = (struct iovec){r->gap, (size_t)(from - end)};
        }
        d->iov[d->niov++] = (struct iovec){s->buf + s->done, (size_t)(s->size - s->done)};
        end = s->off + s->size;
    }
    d->len = (size_t)(end - d->off);
}

/* Hands read d to the engine. */
static void read_issue(dsrt_shard_reader *r, sread *d);

/* Appends request i to the list (*head, *tail) linked by next. */
static void chain_add(dsrt_shard_reader *r, int *head, int *tail, int i) {
    if (*head < 0)
        *head = i;
    else
        r->reqs[*tail].next = i;
    *tail = i;
}

/* Finishes the requests of read d after `got` bytes (or the error got < 0). */
static void read_done(dsrt_shard_reader *r, sread *d, long long got) {
    dsrt_io_fdent *f = &r->fds.e[d->fdi];
    f->busy--;
    sreq *q0 = &r->reqs[d->first];
    dsrt_io_flags fl = {.direct = f->direct, .retries = (uint8_t)q0->retries};
    if (got < 0 && dsrt__io_again(f->fd, got, &fl)) {
        q0->retries = fl.retries;
        if (f->direct && !fl.direct) {
            /* The file system took O_DIRECT at open but not for this read:
             * the file is read through the cache from now on. */
            f->direct = 0;
            r->direct_refused++;
            if (q0->done == 0) q0->lead = 0;
            /* Bytes already in place stay; what is missing is read again. */
            if (q0->lead) {
                memmove(q0->buf, q0->buf + q0->lead, (size_t)q0->done);
                q0->lead = 0;
            }
        }
        f->busy++;
        read_issue(r, d);
        return;
    }
    /* Spread the bytes over the requests in order. */
    uint64_t end = d->off + (got > 0 ? (uint64_t)got : 0);
    int again = -1, again_tail = -1;
    int direct = f->direct;
    for (int i = d->first, next; i >= 0; i = next) {
        sreq *s = &r->reqs[i];
        next = s->next;
        s->next = -1;
        if (got < 0) {
            s->status = (int)got;
        } else if (direct) {
            uint64_t have =
                (uint64_t)(d->iov[0].iov_base == s->buf ? 0
                                                        : (uint8_t *)d->iov[0].iov_base - s->buf) +
                (uint64_t)got;
            uint64_t member = have > s->lead ? have - s->lead : 0;
            s->done = DSRT_MIN(member, s->size);
            if (s->done < s->size && got > 0) {
                /* Short, not at the end: the rest in another read. */
                chain_add(r, &again, &again_tail, i);
                continue;
            }
            if (s->done < s->size) s->status = DSRT_ETRUNCATED;
        } else {
            uint64_t from = s->off + s->done;
            uint64_t got_here = end > from ? DSRT_MIN(end - from, s->size - s->done) : 0;
            s->done += got_here;
            if (s->done < s->size) {
                if (got == 0) {
                    s->status = DSRT_ETRUNCATED;
                } else {
                    /* Short: the rest in a read of its own. */
                    chain_add(r, &again, &again_tail, i);
                    continue;
                }
            }
        }
        if (s->status == 0 && direct && s->lead) memmove(s->buf, s->buf + s->lead, (size_t)s->size);
        done_push(r, i);
    }
    d->first = -1;
    /* Each unfinished request alone: a short read past the end ends at 0. */
    for (int i = again, next; i >= 0; i = next) {
        next = r->reqs[i].next;
        r->reqs[i].next = -1;
        sread *n = read_new(r);
        assert(n);
        n->first = i;
        n->fdi = r->reqs[i].fdi;
        f->busy++;
        read_issue(r, n);
    }
}

static void read_issue(dsrt_shard_reader *r, sread *d) {
    read_layout(r, d);
    d->op.fd = r->fds.e[d->fdi].fd;
    d->op.off = d->off;
    d->op.iov = d->iov;
    d->op.niov = d->niov;
    if (d->niov == 1) {
        d->op.buf = d->iov[0].iov_base;
        d->op.len = d->iov[0].iov_len;
        d->op.niov = 0;
    }
    /* Cannot fail with the engine sized for the reads; fail them rather than hang. */
    if (dsrt__io_submit(r->io, &d->op) != 0) read_done(r, d, -EBUSY);
}

/* Hands the queued requests to the object store's client: a ranged GET each. */
static void issue_remote(dsrt_shard_reader *r) {
    for (unsigned k = 0; k < r->nqueued; k++) {
        int i = r->queued[k];
        sreq *q = &r->reqs[i];
        dsrt__http_epoch(r->http, q->epoch);
        int rc = dsrt__http_submit(r->http, r->set->shards[q->shard].path,
                                   r->set->shards[q->shard].version, q->off, q->size, q->buf,
                                   q->cap, (uint64_t)i);
        if (rc != 0) {
            q->status = rc;
            q->msg = dsrt__strdup(dsrt_last_error());
            done_push(r, i);
            continue;
        }
        q->state = REQ_KERNEL;
        r->in_http++;
    }
    r->nqueued = 0;
}

/* Takes the finished GETs from the client; a negative code when the client
 * itself failed. */
static int collect_remote(dsrt_shard_reader *r, int wait) {
    dsrt_read_result hr;
    int rc;
    while (r->in_http > 0 && (rc = dsrt__http_collect(r->http, &hr, wait, -1)) != 0) {
        if (rc < 0) return rc;
        sreq *q = &r->reqs[hr.tag];
        r->in_http--;
        q->status = hr.status;
        q->done = hr.status == 0 || hr.status == DSRT_ETRUNCATED ? DSRT_MIN(hr.size, q->size) : 0;
        if (hr.status == 0 && hr.size < q->size) q->status = DSRT_ETRUNCATED;
        if (hr.status != 0 && hr.status != DSRT_ETRUNCATED)
            q->msg = dsrt__strdup(dsrt_last_error());
        done_push(r, (int)hr.tag);
        wait = 0;
    }
    return 0;
}

/* Turns the queued requests into reads: sorted by place, neighbours merged. */
static void issue_queued(dsrt_shard_reader *r) {
    if (r->nqueued == 0) return;
    if (r->http) {
        issue_remote(r);
        return;
    }
    qsort_r(r->queued, r->nqueued, sizeof *r->queued, by_place, r->reqs);
    unsigned i = 0;
    while (i < r->nqueued) {
        int first = r->queued[i];
        sreq *q = &r->reqs[first];
        int fdi = fd_get(r, q->shard, q);
        if (fdi < 0) {
            done_push(r, first);
            i++;
            continue;
        }
        sread *d = read_new(r);
        assert(d);
        d->first = first;
        d->fdi = fdi;
        r->fds.e[fdi].busy++;
        q->state = REQ_KERNEL;
        q->fdi = fdi;
        unsigned count = 1;
        uint64_t start = q->off, end = q->off + q->size;
        int last = first;
        i++;
        while (!r->fds.e[fdi].direct && i < r->nqueued && count < MERGE_COUNT) {
            sreq *s = &r->reqs[r->queued[i]];
            if (s->shard != q->shard || s->off < end || s->off - end > MERGE_GAP ||
                s->off + s->size - start > MERGE_BYTES)
                break;
            r->reqs[last].next = r->queued[i];
            last = r->queued[i];
            s->state = REQ_KERNEL;
            s->fdi = fdi;
            end = s->off + s->size;
            count++;
            i++;
        }
        read_issue(r, d);
    }
    r->nqueued = 0;
}

void dsrt__shard_reader_cancel(dsrt_shard_reader *r) {
    /* Reads the kernel holds write into the buffers: let them end. */
    while (dsrt__io_pending(r->io) > 0) {
        dsrt_io_op *op;
        if (dsrt__io_reap(r->io, &op, DSRT_IO_FOREVER) != 1) break;
        read_done(r, read_of(op), op->res);
    }
    if (r->http) dsrt__http_cancel(r->http);
    r->in_http = 0;
    for (unsigned i = 0; i < r->depth; i++) {
        sreq *q = &r->reqs[i];
        if (q->state == REQ_FREE || (q->state == REQ_KERNEL && !r->http)) continue;
        q->state = REQ_FREE;
        r->free_reqs[r->nfree++] = (int)i;
    }
    r->nstream = 0;
    r->nqueued = 0;
    r->ndone = 0;
}

/* Turns the range read for q (sample p) into the sample's file: the set's
 * codec, in q's buffer. */
static void decode(dsrt_shard_reader *r, sreq *q, uint32_t p) {
    size_t size;
    int rc = r->set->codec->decode(r->set, p, q->path, q->buf, q->cap, (size_t)q->done, &size);
    if (rc == 0) {
        q->done = size;
        return;
    }
    q->status = rc;
    free(q->msg);
    q->msg = dsrt__strdup(dsrt_last_error());
}

/* Takes what the stream has for the waiting requests; 1 when any finished.
 * wait_ms: 0 not at all, > 0 at most that long, < 0 until one finishes. */
static int stream_poll(dsrt_shard_reader *r, int wait_ms);

int dsrt__shard_reader_collect(dsrt_shard_reader *r, dsrt_read_result *res, int wait) {
    for (;;) {
        issue_queued(r);
        /* Completions the engine and the store's client have. */
        dsrt_io_op *op;
        int rc;
        while ((rc = dsrt__io_reap(r->io, &op, DSRT_IO_NOWAIT)) == 1)
            read_done(r, read_of(op), op->res);
        if (rc < 0) return rc;
        if ((rc = collect_remote(r, 0)) != 0) return rc;
        if (r->nstream) stream_poll(r, 0);
        if (r->ndone > 0) {
            int i = r->done[r->done_head];
            r->done_head = (r->done_head + 1) % r->depth;
            r->ndone--;
            sreq *q = &r->reqs[i];
            uint32_t p = dsrt__pos(r->ds, q->pos);
            if (q->status == 0 && r->set->codec) decode(r, q, p);
            res->tag = q->tag;
            res->path = q->path;
            res->buf = q->buf;
            res->size = q->status == DSRT_ETOOBIG ? sample_need(r, p) : (size_t)q->done;
            res->status = q->status;
            if (q->status && q->msg)
                dsrt__fail(q->status, "%s", q->msg);
            else if (q->status)
                fail_msg(q->status, q->path, q->done, q->size);
            q->state = REQ_FREE;
            r->free_reqs[r->nfree++] = i;
            return 1;
        }
        if (r->nqueued > 0) continue;
        unsigned in_kernel = dsrt__io_pending(r->io);
        if (in_kernel == 0 && r->in_http == 0 && r->nstream == 0) return 0;
        if (!wait) return 0;
        if (r->nstream == 0 && r->in_http == 0) {
            if ((rc = dsrt__io_reap(r->io, &op, DSRT_IO_FOREVER)) < 0) return rc;
            if (rc == 1) read_done(r, read_of(op), op->res);
        } else if (r->nstream == 0 && in_kernel == 0) {
            if ((rc = collect_remote(r, 1)) != 0) return rc;
        } else if (in_kernel > 0) {
            /* The engine and the stream: the engine briefly, then the stream. */
            if ((rc = dsrt__io_reap(r->io, &op, 1000000)) < 0) return rc;
            if (rc == 1) read_done(r, read_of(op), op->res);
        } else {
            /* The stream, and the store now and then. */
            stream_poll(r, r->in_http ? REMOTE_POLL_MS : -1);
        }
    }
}

void dsrt__shard_reader_remote_stats(const dsrt_shard_reader *r, dsrt_remote_stats *st) {
    memset(st, 0, sizeof *st);
    if (r->http) dsrt__http_stats(r->http, st);
}

// ----------------------------------------------------------------------------
// The stream

/* A sample the stream holds. */
typedef struct {
    uint64_t epoch;
    uint32_t pos;
    int state; /* ENTRY_PENDING (its block is being read), ENTRY_READY */
    int status;
    uint64_t got; /* bytes read (less than size when truncated) */
    uint8_t *data;
    char *msg; /* a failure's message (a store's, a shard not a file), or NULL */
    int next_free;
} entry;

enum { ENTRY_FREE = 0, ENTRY_PENDING, ENTRY_READY };

/* What the stream knows of one epoch. */
typedef struct {
    uint64_t epoch;
    int valid;
    uint32_t *stream; /* (n) view positions in reading order */
    size_t nstream;
    uint32_t *use;  /* (n) consumption index, or NONE */
    uint32_t *sidx; /* (n) index in stream, or NONE */
    uint32_t *slot; /* (n) entry holding the sample, or NONE */
} plan_rec;

/* One stream read. */
typedef struct {
    dsrt_io_op op;
    int busy;
    uint64_t gen; /* the stream's generation when issued */
    uint64_t epoch;
    uint32_t shard;
    int fdi;
    uint64_t off;        /* file offset of buf[0] */
    size_t len, got;     /* asked, read so far */
    size_t first, count; /* stream indices [first, first + count) of that epoch */
    uint8_t *buf;        /* (block) */
    int retries;
    char *msg; /* a failure's message (a store's, a shard not a file), or NULL */
} block;

struct dsrt_shard_stream {
    const dsrt_datastore *ds;
    const dsrt_shardset *set;
    dsrt_shard_plan *plan;
    dsrt_shard_plan_options po;
    dsrt_shard_stream_options o;
    size_t n, block_bytes, ahead, buffer;
    uint64_t epochs;       /* epochs in the run; 0: endless */
    size_t used_places;    /* consumption indices an epoch uses (drop_last leaves some) */
    size_t part_per_batch; /* this part's places in a full batch */

    pthread_mutex_t mu;
    pthread_cond_t ready; /* a sample arrived, or the position changed */
    pthread_cond_t wake;  /* the stream has something new to do */
    int stop;

    plan_rec *recs; /* (nrecs) epochs held; arrays made when first used */
    unsigned nrecs;
    uint64_t epoch; /* streamed now */
    size_t next;    /* next stream index to read */
    uint64_t gen;
    int seek_pending;
    int running; /* the thread is in dsrt__shard_stream_run */
    uint64_t seek_epoch, seek_place;
    unsigned seek_from_parts;
    /* A resume on another number of parts: the epoch that finishes the
     * order of elastic_parts parts (0: none). */
    uint64_t elastic_epoch;
    unsigned elastic_parts;
    /* The furthest request: its epoch and consumption index. */
    uint64_t want_epoch;
    size_t want_c;
    int want_any;

    entry *entries;
    size_t nentries, cap_entries;
    int free_entry;

    block blocks[STREAM_DEPTH_MAX];
    unsigned nblocks; /* reads in flight at most */
    unsigned inflight;
    dsrt_http *http; /* shards in an object store: the client, and an */
    int wake_fd;     /* eventfd that wakes the thread from waiting on it */
    dsrt_io_fdcache fds;
    dsrt_io_engine *io; /* local shards */

    dsrt_shard_stream_stats st;
    dsrt_remote_stats remote; /* the client's, as of its last answer */
};

static plan_rec *rec_for(dsrt_shard_stream *s, uint64_t epoch) {
    for (unsigned k = 0; k < s->nrecs; k++)
        if (s->recs[k].valid && s->recs[k].epoch == epoch) return &s->recs[k];
    return NULL;
}

/* The record a new epoch takes: an unused one, else the oldest epoch's,
 * which nobody can ask for any more (nrecs exceeds the epochs open at once). */
static plan_rec *rec_spare(dsrt_shard_stream *s) {
    plan_rec *old = NULL;
    for (unsigned k = 0; k < s->nrecs; k++) {
        plan_rec *r = &s->recs[k];
        if (!r->valid) return r;
        if (!old || r->epoch < old->epoch) old = r;
    }
    return old;
}

static void entry_free(dsrt_shard_stream *s, plan_rec *rec, uint32_t slot) {
    entry *e = &s->entries[slot];
    if (rec && rec->slot[e->pos] == slot) rec->slot[e->pos] = NONE;
    free(e->data);
    free(e->msg);
    e->data = NULL;
    e->msg = NULL;
    e->state = ENTRY_FREE;
    e->next_free = s->free_entry;
    s->free_entry = (int)slot;
}

static int entry_new(dsrt_shard_stream *s, uint32_t *slot) {
    if (s->free_entry < 0) {
        void *v = s->entries;
        if (dsrt__grow(&v, &s->cap_entries, s->nentries + 1, sizeof *s->entries) != 0)
            return -ENOMEM;
        s->entries = v;
        s->entries[s->nentries] = (entry){.state = ENTRY_FREE, .next_free = -1};
        s->free_entry = (int)s->nentries++;
    }
    *slot = (uint32_t)s->free_entry;
    s->free_entry = s->entries[*slot].next_free;
    return 0;
}

/* Drops every sample held for rec (its epoch is over, or a seek). */
static void rec_clear(dsrt_shard_stream *s, plan_rec *rec) {
    for (size_t k = 0; k < s->nentries; k++) {
        entry *e = &s->entries[k];
        if (e->state == ENTRY_READY && e->epoch == rec->epoch) entry_free(s, rec, (uint32_t)k);
    }
}

static void rec_free(plan_rec *rec) {
    free(rec->stream);
    free(rec->use);
    free(rec->sidx);
    free(rec->slot);
    *rec = (plan_rec){0};
}

/* Makes rec the plan of epoch (mu held, or before the thread runs). */
static int rec_fill(dsrt_shard_stream *s, plan_rec *rec, uint64_t epoch) {
    if (rec->valid) rec_clear(s, rec);
    rec->valid = 0;
    if (!rec->stream) {
        rec->stream = dsrt__malloc(s->n * sizeof *rec->stream);
        rec->use = dsrt__malloc(s->n * sizeof *rec->use);
        rec->sidx = dsrt__malloc(s->n * sizeof *rec->sidx);
        rec->slot = dsrt__malloc(s->n * sizeof *rec->slot);
        if (!rec->stream || !rec->use || !rec->sidx || !rec->slot) {
            rec_free(rec);
            return -ENOMEM;
        }
    }
    uint64_t key = s->po.shuffle == DSRT_SHUFFLE_EVERY_EPOCH ? epoch : 0;
    uint32_t *order = dsrt__malloc(s->n * sizeof *order);
    if (!order) return -ENOMEM;
    unsigned from = s->elastic_parts && epoch == s->elastic_epoch ? s->elastic_parts : 0;
    int rc =
        dsrt__shard_plan_epoch(s->plan, key, from, order, rec->stream, &rec->nstream, rec->use);
    free(order);
    if (rc != 0) return rc;
    /* drop_last: the samples of the places no batch holds are not read. */
    size_t w = 0;
    for (size_t i = 0; i < rec->nstream; i++)
        if (rec->use[rec->stream[i]] < s->used_places) rec->stream[w++] = rec->stream[i];
    rec->nstream = w;
    for (size_t v = 0; v < s->n; v++) rec->sidx[v] = rec->slot[v] = NONE;
    for (size_t i = 0; i < rec->nstream; i++) rec->sidx[rec->stream[i]] = (uint32_t)i;
    rec->epoch = epoch;
    rec->valid = 1;
    return 0;
}

int dsrt__shard_stream_create(dsrt_shard_stream **out, const dsrt_datastore *ds,
                              const dsrt_shard_plan_options *po,
                              const dsrt_shard_stream_options *o) {
    *out = NULL;
    dsrt_shard_stream *s = dsrt__calloc(1, sizeof *s);
    int rc = -ENOMEM;
    if (!s) return rc;
    s->ds = ds;
    s->set = dsrt__shardset_of(ds);
    s->po = *po;
    if (s->po.parts == 0) s->po.parts = 1;
    s->o = *o;
    s->n = ds->n;
    s->nblocks = s->set->remote ? STREAM_DEPTH_REMOTE : STREAM_DEPTH;
    s->block_bytes = (size_t)align_up(o->block         ? o->block
                                      : s->set->remote ? STREAM_BLOCK_REMOTE
                                                       : STREAM_BLOCK);
    s->epochs = o->epochs;
    s->wake_fd = -1;
    s->buffer = s->set->shuffle_buffer;
    s->free_entry = -1;
    /* Places this part fills in a full batch, and in an epoch. */
    size_t B = po->batch ? po->batch : 1;
    unsigned R = s->po.parts, me = s->po.part;
    s->part_per_batch = (size_t)((uint64_t)B * (me + 1) / R - (uint64_t)B * me / R);
    size_t batches = po->drop_last ? s->n / B : (s->n + B - 1) / B;
    for (size_t b = 0; b < batches; b++) {
        size_t c = DSRT_MIN(B, s->n - b * B);
        s->used_places += (size_t)((uint64_t)c * (me + 1) / R - (uint64_t)c * me / R);
    }
    /* Ahead: what keeps STREAM_DEPTH blocks busy, and two batches. */
    uint64_t bytes = 0;
    for (size_t v = 0; v < s->n && v < 4096; v++) bytes += dsrt__shard_sample_size(ds, (uint32_t)v);
    size_t mean = (size_t)(bytes / DSRT_MIN(s->n, (size_t)4096)) + 1024;
    s->ahead = o->ahead ? o->ahead : DSRT_MAX(2 * B, s->nblocks * s->block_bytes / mean + 64);
    if ((rc = dsrt__shard_plan_create(&s->plan, ds, &s->po)) != 0) goto fail;
    rc = -ENOMEM;
    /* The epochs open at once, and the one read ahead into. */
    s->nrecs = (o->open_epochs ? o->open_epochs : 2) + 1;
    if (!(s->recs = dsrt__calloc(s->nrecs, sizeof *s->recs))) goto fail;
    for (unsigned k = 0; k < s->nblocks; k++) {
        void *b = NULL;
        if (posix_memalign(&b, DSRT_DIRECT_ALIGN, s->block_bytes) != 0) goto fail;
        s->blocks[k].buf = b;
    }
    if (s->set->remote) {
        dsrt_remote_options ro = o->reader.remote;
        ro.depth = s->nblocks;
        if ((rc = dsrt__http_create(&s->http, &ro)) != 0) goto fail;
        s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->wake_fd < 0) {
            rc = dsrt__fail(-errno, "shards: stream: eventfd: %s", strerror(errno));
            goto fail;
        }
    } else if ((rc = dsrt__fdcache_init(&s->fds, STREAM_FDS)) != 0 ||
               (rc = dsrt__io_create(&s->io, o->reader.io, STREAM_DEPTH * 2, "shards: stream")) !=
                   0) {
        goto fail;
    }
    int e = pthread_mutex_init(&s->mu, NULL);
    if (e == 0 && (e = pthread_cond_init(&s->ready, NULL)) != 0) pthread_mutex_destroy(&s->mu);
    if (e == 0 && (e = pthread_cond_init(&s->wake, NULL)) != 0) {
        pthread_cond_destroy(&s->ready);
        pthread_mutex_destroy(&s->mu);
    }
    if (e != 0) {
        rc = dsrt__fail(-e, "shards: stream: %s", strerror(e));
        goto fail;
    }
    s->epoch = 0;
    if ((rc = rec_fill(s, &s->recs[0], 0)) != 0) {
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->ready);
        pthread_mutex_destroy(&s->mu);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    s->stop = -1; /* no lock to destroy */
    dsrt__shard_stream_destroy(s);
    return rc;
}

void dsrt__shard_stream_destroy(dsrt_shard_stream *s) {
    if (!s) return;
    dsrt__io_destroy(s->io);
    dsrt__http_destroy(s->http);
    if (s->wake_fd >= 0) close(s->wake_fd);
    dsrt__fdcache_free(&s->fds);
    for (unsigned k = 0; k < s->nblocks; k++) {
        free(s->blocks[k].buf);
        free(s->blocks[k].msg);
    }
    for (size_t k = 0; k < s->nentries; k++) {
        free(s->entries[k].data);
        free(s->entries[k].msg);
    }
    free(s->entries);
    for (unsigned k = 0; s->recs && k < s->nrecs; k++) rec_free(&s->recs[k]);
    free(s->recs);
    dsrt__shard_plan_destroy(s->plan);
    if (s->stop != -1) {
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->ready);
        pthread_mutex_destroy(&s->mu);
    }
    free(s);
}

int dsrt__shard_stream_order(dsrt_shard_stream *s, uint64_t key, unsigned from_parts,
                             uint32_t *order) {
    return dsrt__shard_plan_epoch(s->plan, key, from_parts, order, NULL, NULL, NULL);
}

void dsrt__shard_stream_stats(dsrt_shard_stream *s, dsrt_shard_stream_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    pthread_mutex_unlock(&s->mu);
}

void dsrt__shard_stream_remote_stats(dsrt_shard_stream *s, dsrt_remote_stats *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&s->mu);
    if (s->http) *st = s->remote;
    pthread_mutex_unlock(&s->mu);
}

/* Wakes the thread where it waits on the store's client. */
static void poke(dsrt_shard_stream *s) {
    if (s->wake_fd >= 0) eventfd_write(s->wake_fd, 1);
}

void dsrt__shard_stream_stop(dsrt_shard_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->wake);
    pthread_cond_broadcast(&s->ready);
    poke(s);
    pthread_mutex_unlock(&s->mu);
}

void dsrt__shard_stream_seek(dsrt_shard_stream *s, uint64_t epoch, uint64_t place,
                             unsigned from_parts) {
    pthread_mutex_lock(&s->mu);
    s->seek_pending = 1;
    s->seek_epoch = epoch;
    s->seek_place = place;
    s->seek_from_parts = from_parts == s->po.parts ? 0 : from_parts;
    s->want_any = 0;
    pthread_cond_broadcast(&s->wake);
    poke(s);
    /* When this returns no read of the old position is in flight (a caller
     * may drop the page cache, or look at the files). */
    while (s->seek_pending && !s->stop && s->running) pthread_cond_wait(&s->ready, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Raises the furthest request (mu held). */
static void want(dsrt_shard_stream *s, uint64_t epoch, size_t c) {
    if (!s->want_any || epoch > s->want_epoch || (epoch == s->want_epoch && c > s->want_c)) {
        s->want_any = 1;
        s->want_epoch = epoch;
        s->want_c = c;
        pthread_cond_signal(&s->wake);
        poke(s);
    }
}

/* What the stream says about one request. */
enum { TAKE_HAVE = 0, TAKE_WAIT, TAKE_MISS };

/* Looks for sample pos of epoch: TAKE_HAVE with its entry taken out of the
 * store (*e filled: the caller frees e->data), TAKE_WAIT when the stream
 * will bring it, TAKE_MISS when it will not (mu held). */
static int stream_take(dsrt_shard_stream *s, uint32_t pos, uint64_t epoch, entry *e) {
    if (s->seek_pending) return TAKE_WAIT;
    plan_rec *rec = rec_for(s, epoch);
    if (!rec) {
        /* An epoch the stream has not reached (it will), or has left. */
        if (epoch > s->epoch && (s->epochs == 0 || epoch < s->epochs)) {
            want(s, epoch, 0);
            return TAKE_WAIT;
        }
        return TAKE_MISS;
    }
    uint32_t slot = rec->slot[pos];
    if (slot != NONE) {
        entry *x = &s->entries[slot];
        if (x->state == ENTRY_PENDING) return TAKE_WAIT;
        *e = *x;
        x->data = NULL;
        x->msg = NULL;
        entry_free(s, rec, slot);
        return TAKE_HAVE;
    }
    uint32_t i = rec->sidx[pos];
    if (i == NONE) return TAKE_MISS;
    if (epoch == s->epoch && i >= s->next) {
        want(s, epoch, rec->use[pos]);
        return TAKE_WAIT;
    }
    return TAKE_MISS;
}

static int stream_poll(dsrt_shard_reader *r, int wait_ms) {
    dsrt_shard_stream *s = r->stream;
    int any = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        for (unsigned i = 0; i < r->depth; i++) {
            sreq *q = &r->reqs[i];
            if (q->state != REQ_STREAM) continue;
            entry e;
            int t = s->stop ? TAKE_MISS : stream_take(s, q->pos, q->epoch, &e);
            if (t == TAKE_WAIT) continue;
            r->nstream--;
            if (t == TAKE_MISS) {
                /* Read by offset, like the exact order. */
                s->st.ranged++;
                q->state = REQ_QUEUED;
                r->queued[r->nqueued++] = (int)i;
                any = 1;
                continue;
            }
            s->st.served++;
            pthread_mutex_unlock(&s->mu);
            q->status = e.status;
            q->done = DSRT_MIN(e.got, q->size);
            q->msg = e.msg;
            if (e.status == 0) memcpy(q->buf, e.data, (size_t)q->size);
            free(e.data);
            done_push(r, (int)i);
            any = 1;
            pthread_mutex_lock(&s->mu);
        }
        if (any || wait_ms == 0 || r->nstream == 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = wait_ms > 0 ? (long)wait_ms * 1000000L : 50000000L;
        ts.tv_nsec += ns;
        while (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->ready, &s->mu, &ts);
        if (wait_ms > 0) wait_ms = 0; /* one look after the wait */
    }
    pthread_mutex_unlock(&s->mu);
    return any;
}

/* The stream's file of shard k; -errno when it cannot be opened. */
static int sfd_get(dsrt_shard_stream *s, uint32_t k) {
    return dsrt__fdcache_get(&s->fds, k, s->set->shards[k].path, s->o.reader.direct, NULL);
}

/* Hands a finished block's samples to the store (mu held; let go while the
 * bytes are copied: the entries stay pending meanwhile, and workers touch
 * only entries that are ready). err < 0: the error of the read. */
static void block_deliver(dsrt_shard_stream *s, block *b, long long err) {
    plan_rec *rec = b->gen == s->gen ? rec_for(s, b->epoch) : NULL;
    s->st.bytes += b->got;
    s->st.blocks++;
    if (rec && err >= 0) {
        pthread_mutex_unlock(&s->mu);
        for (size_t i = b->first; i < b->first + b->count; i++) {
            uint32_t pos = rec->stream[i], slot = rec->slot[pos];
            if (slot == NONE) continue;
            entry *e = &s->entries[slot];
            uint32_t p = dsrt__pos(s->ds, pos);
            uint64_t off = s->set->offset[p] - b->off, size = s->set->size[p];
            e->got = b->got > off ? DSRT_MIN((uint64_t)b->got - off, size) : 0;
            e->status = e->got < size ? DSRT_ETRUNCATED : 0;
            if (e->status) continue;
            e->data = malloc(size ? size : 1);
            if (!e->data) {
                e->status = -ENOMEM;
                continue;
            }
            memcpy(e->data, b->buf + off, size);
        }
        pthread_mutex_lock(&s->mu);
    }
    for (size_t i = b->first; rec && i < b->first + b->count; i++) {
        uint32_t slot = rec->slot[rec->stream[i]];
        if (slot == NONE) continue;
        entry *e = &s->entries[slot];
        e->state = ENTRY_READY;
        if (err < 0) {
            e->status = (int)err;
            if (b->msg) e->msg = dsrt__strdup(b->msg);
        }
    }
    free(b->msg);
    b->msg = NULL;
    if (!s->http) s->fds.e[b->fdi].busy--;
    b->busy = 0;
    s->inflight--;
    pthread_cond_broadcast(&s->ready);
}

/* Starts (or continues) the read of block b. */
static void block_read(dsrt_shard_stream *s, block *b) {
    if (s->http) {
        /* A ranged GET; its answer comes from the client's collect. */
        dsrt__http_epoch(s->http, b->epoch);
        int rc = dsrt__http_submit(s->http, s->set->shards[b->shard].path,
                                   s->set->shards[b->shard].version, b->off, b->len, b->buf,
                                   s->block_bytes, (uint64_t)(b - s->blocks));
        if (rc != 0) {
            b->msg = dsrt__strdup(dsrt_last_error());
            block_deliver(s, b, rc);
        }
        return;
    }
    dsrt_io_fdent *f = &s->fds.e[b->fdi];
    dsrt__io_unalign(f->fd, b->off + b->got, &f->direct);
    b->op.fd = f->fd;
    b->op.off = b->off + b->got;
    b->op.buf = b->buf + b->got;
    b->op.len = b->len - b->got;
    b->op.niov = 0;
    /* Cannot fail with the engine sized for the blocks; fail the read rather than hang. */
    if (dsrt__io_submit(s->io, &b->op) != 0) block_deliver(s, b, -EBUSY);
}

/* A finished read of block b: n bytes, or -errno. */
static void block_complete(dsrt_shard_stream *s, block *b, long long n) {
    dsrt_io_fdent *f = &s->fds.e[b->fdi];
    dsrt_io_flags fl = {.direct = f->direct, .retries = (uint8_t)b->retries};
    if (n < 0 && dsrt__io_again(f->fd, n, &fl)) {
        b->retries = fl.retries;
        f->direct = fl.direct;
        block_read(s, b);
        return;
    }
    if (n < 0) {
        block_deliver(s, b, n);
    } else if (n == 0 || b->got + (size_t)n >= b->len) {
        b->got += (size_t)n;
        block_deliver(s, b, 0);
    } else {
        b->got += (size_t)n;
        block_read(s, b);
    }
}

/* The block an engine op belongs to. */
static block *block_of(dsrt_io_op *op) {
    return (block *)((char *)op - offsetof(block, op));
}

/* Starts the next block of the stream (mu held); 0 when none could be. */
static int block_next(dsrt_shard_stream *s, plan_rec *rec) {
    block *b = NULL;
    for (unsigned k = 0; k < s->nblocks && !b; k++)
        if (!s->blocks[k].busy) b = &s->blocks[k];
    if (!b) return 0;
    size_t i = s->next;
    uint32_t pos = rec->stream[i], p = dsrt__pos(s->ds, pos);
    uint32_t shard = s->set->shard_of[p];
    int fdi = s->http ? 0 : sfd_get(s, shard);
    if (fdi < 0) {
        /* The shard cannot be opened: its samples fail, each named. */
        uint32_t slot;
        if (entry_new(s, &slot) == 0) {
            s->entries[slot] =
                (entry){.epoch = s->epoch,
                        .pos = pos,
                        .state = ENTRY_READY,
                        .status = fdi,
                        .msg = fdi == DSRT_EFORMAT ? dsrt__strdup(dsrt_last_error()) : NULL,
                        .next_free = -1};
            rec->slot[pos] = slot;
        }
        s->next++;
        pthread_cond_broadcast(&s->ready);
        return 1;
    }
    int direct = !s->http && s->fds.e[fdi].direct;
    uint64_t start = direct ? align_down(s->set->offset[p]) : s->set->offset[p];
    uint64_t end = s->set->offset[p] + s->set->size[p];
    size_t j = i + 1;
    while (j < rec->nstream) {
        uint32_t q = dsrt__pos(s->ds, rec->stream[j]);
        uint64_t qe = s->set->offset[q] + s->set->size[q];
        if (s->set->shard_of[q] != shard || s->set->offset[q] < end ||
            s->set->offset[q] - end > MERGE_GAP ||
            (direct ? align_up(qe) : qe) - start > s->block_bytes)
            break;
        end = qe;
        j++;
    }
    uint64_t len = (direct ? align_up(end) : end) - start;
    if (len > s->block_bytes) {
        /* One sample larger than a block: read it by offset instead. */
        s->next++;
        return 1;
    }
    for (size_t k = i; k < j; k++) {
        uint32_t v = rec->stream[k], slot;
        if (entry_new(s, &slot) != 0) {
            j = k;
            break;
        }
        s->entries[slot] =
            (entry){.epoch = s->epoch, .pos = v, .state = ENTRY_PENDING, .next_free = -1};
        rec->slot[v] = slot;
    }
    if (j == i) return 0;
    *b = (block){.busy = 1,
                 .gen = s->gen,
                 .epoch = s->epoch,
                 .shard = shard,
                 .fdi = fdi,
                 .off = start,
                 .len = (size_t)len,
                 .got = 0,
                 .first = i,
                 .count = j - i,
                 .buf = b->buf};
    if (!s->http) s->fds.e[fdi].busy++;
    s->inflight++;
    s->next = j;
    block_read(s, b);
    return 1;
}

/* Applies a pending seek (mu held). */
static int seek_apply(dsrt_shard_stream *s) {
    s->seek_pending = 0;
    s->gen++;
    for (unsigned k = 0; k < s->nrecs; k++)
        if (s->recs[k].valid) {
            rec_clear(s, &s->recs[k]);
            s->recs[k].valid = 0;
        }
    s->epoch = s->seek_epoch;
    s->elastic_epoch = s->seek_epoch;
    s->elastic_parts = s->seek_from_parts;
    s->next = 0;
    s->want_any = 0;
    pthread_cond_broadcast(&s->ready);
    if (s->epochs && s->epoch >= s->epochs) return 0; /* past the run's end: nothing to read */
    int rc = rec_fill(s, &s->recs[0], s->epoch);
    if (rc != 0) return rc;
    plan_rec *rec = &s->recs[0];
    /* Start after the last stream sample used before the place: everything
     * before it that is still wanted is read by offset. */
    size_t c0 = (size_t)(s->seek_place / (s->po.batch ? s->po.batch : 1)) * s->part_per_batch;
    size_t start = 0;
    for (size_t i = rec->nstream; i-- > 0;)
        if (rec->use[rec->stream[i]] < c0) {
            start = i + 1;
            break;
        }
    s->next = start;
    s->want_any = 0;
    pthread_cond_broadcast(&s->ready);
    return 0;
}

void dsrt__shard_stream_run(dsrt_shard_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->running = 1;
    while (!s->stop) {
        if (s->seek_pending && s->inflight == 0) {
            if (seek_apply(s) != 0) {
                /* Out of memory for the plan: every request reads by offset. */
                s->epoch = UINT64_MAX;
            }
            continue;
        }
        plan_rec *rec = s->seek_pending ? NULL : rec_for(s, s->epoch);
        int issued = 0;
        if (rec && s->next >= rec->nstream && s->inflight == 0 &&
            (s->epochs == 0 || s->epoch + 1 < s->epochs) && s->want_any &&
            s->want_epoch >= s->epoch) {
            /* On to the next epoch once this one is asked for, its first
             * samples read while the last of this one are used: the record
             * of an epoch no request can come for any more goes. */
            plan_rec *old = rec_spare(s);
            s->epoch++;
            s->next = 0;
            if (rec_fill(s, old, s->epoch) != 0) s->epoch = UINT64_MAX;
            continue;
        }
        if (rec && s->next < rec->nstream) {
            size_t limit = s->want_any && s->want_epoch > s->epoch ? rec->nstream
                           : s->want_any && s->want_epoch == s->epoch
                               ? DSRT_MIN(rec->nstream, s->want_c + s->buffer + s->ahead)
                               : DSRT_MIN(rec->nstream, s->buffer + s->ahead);
            while (s->next < limit && s->inflight < s->nblocks && block_next(s, rec)) issued = 1;
        }
        if (s->io) dsrt__io_flush(s->io);
        if (issued) continue;
        if (s->inflight > 0 && s->http) {
            /* Wait for a GET, or for a poke (a request, a seek, a stop). */
            pthread_mutex_unlock(&s->mu);
            dsrt_read_result res;
            int rc = dsrt__http_collect(s->http, &res, 1, s->wake_fd);
            char msg[512] = "";
            if (rc != 0 && res.status != 0 && res.status != DSRT_ETRUNCATED)
                snprintf(msg, sizeof msg, "%s", dsrt_last_error());
            if (rc < 0) snprintf(msg, sizeof msg, "%s", dsrt_last_error());
            pthread_mutex_lock(&s->mu);
            if (rc == 1) {
                block *b = &s->blocks[res.tag];
                /* A shard cut short answers with what it has. */
                if (res.status == 0 || res.status == DSRT_ETRUNCATED) {
                    b->got = DSRT_MIN(res.size, b->len);
                    block_deliver(s, b, 0);
                } else {
                    b->msg = dsrt__strdup(msg);
                    block_deliver(s, b, res.status);
                }
            } else if (rc == 0) {
                eventfd_t v;
                eventfd_read(s->wake_fd, &v);
            } else {
                /* The client itself failed: every read in flight fails. */
                for (unsigned k = 0; k < s->nblocks; k++)
                    if (s->blocks[k].busy) {
                        s->blocks[k].msg = dsrt__strdup(msg);
                        block_deliver(s, &s->blocks[k], rc);
                    }
                dsrt__http_cancel(s->http);
            }
            dsrt__http_stats(s->http, &s->remote);
            continue;
        }
        if (s->inflight > 0 && s->io) {
            /* Wait for a read (without a ring: do it), the lock let go
             * meanwhile, waking now and then for new requests. */
            pthread_mutex_unlock(&s->mu);
            dsrt_io_op *op;
            int rc = dsrt__io_reap(s->io, &op, 2000000);
            pthread_mutex_lock(&s->mu);
            if (rc == 1) block_complete(s, block_of(op), op->res);
            continue;
        }
        pthread_cond_wait(&s->wake, &s->mu);
    }
    /* GETs in flight are dropped; reads the kernel still holds write into
     * the blocks: wait for them. */
    if (s->http) {
        dsrt__http_cancel(s->http);
        for (unsigned k = 0; k < s->nblocks; k++) s->blocks[k].busy = 0;
        s->inflight = 0;
    }
    while (s->io && s->inflight > 0) {
        pthread_mutex_unlock(&s->mu);
        dsrt_io_op *op;
        int rc = dsrt__io_reap(s->io, &op, DSRT_IO_FOREVER);
        pthread_mutex_lock(&s->mu);
        if (rc != 1) break;
        block *b = block_of(op);
        s->fds.e[b->fdi].busy--;
        b->busy = 0;
        s->inflight--;
    }
    s->running = 0;
    pthread_cond_broadcast(&s->ready);
    pthread_mutex_unlock(&s->mu);
}
