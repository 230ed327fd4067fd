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
 * Shard files stay open in a small cache (most recently used).
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
 * client (datastore/http.c) the same way: each sample by a ranged GET (many
 * in flight, reader.remote.depth), the stream's blocks by ranged GETs of
 * 8 MiB, eight in flight.
 */
#include "datastore/remote.h"
#include "datastore/shards.h"

#include <assert.h>
#include <fcntl.h>
#include <liburing.h>
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
#define RETRIES             8

static size_t align_down(uint64_t x) {
    return (size_t)(x / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN);
}

static uint64_t align_up(uint64_t x) {
    return (x + DSRT_DIRECT_ALIGN - 1) / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN;
}

/* Sets up a ring of entries, or leaves the reason in why. */
static int ring_init(struct io_uring *ring, unsigned entries, char *why, size_t cap) {
    int rc = io_uring_queue_init(entries, ring, 0);
    if (rc < 0) {
        snprintf(why, cap, "io_uring_queue_init: %s", strerror(-rc));
        return rc;
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(ring);
    int ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
             io_uring_opcode_supported(probe, IORING_OP_READV);
    if (probe) io_uring_free_probe(probe);
    if (!ok) {
        io_uring_queue_exit(ring);
        snprintf(why, cap, "io_uring: the kernel lacks IORING_OP_READ (Linux 5.6 or later needed)");
        return DSRT_EUNSUPPORTED;
    }
    return 0;
}

/* Opens a shard for reading, with O_DIRECT when asked and allowed. A shard
 * replaced since the set was opened by something that is not a regular file
 * is refused with DSRT_EFORMAT and a message naming it: O_NONBLOCK keeps the
 * open of a FIFO from waiting for a writer for ever (it is cleared once the
 * file is known to be regular). */
static int open_shard(const char *path, int direct, int *is_direct, int *refused) {
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    int fd = open(path, flags | (direct ? O_DIRECT : 0));
    *is_direct = direct;
    *refused = 0;
    if (fd < 0 && direct && errno == EINVAL) {
        fd = open(path, flags);
        *is_direct = 0;
        *refused = fd >= 0;
    }
    if (fd < 0) return -errno;
    struct stat st;
    int fl, rc = 0;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if (!S_ISREG(st.st_mode))
        rc = dsrt__fail(DSRT_EFORMAT, "read: %s: is %s, not a regular file", path,
                        dsrt__file_kind(st.st_mode));
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        rc = -errno;
    if (rc != 0) {
        close(fd);
        return rc;
    }
    return fd;
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

typedef struct {
    uint32_t shard;
    int fd; /* -1: empty */
    int direct;
    unsigned busy; /* reads in flight */
    uint64_t used;
} fd_entry;

/* One read the kernel holds: a run of requests. */
typedef struct {
    int first; /* request, -1 when free */
    int fdi;
    uint64_t off; /* where the read starts */
    size_t len;
    unsigned niov;
    struct iovec iov[2 * MERGE_COUNT];
} sread;

struct dsrt_shard_reader {
    const dsrt_datastore *ds;
    const dsrt_shardset *set;
    dsrt_shard_stream *stream;
    dsrt_io io;
    unsigned depth;
    int direct;
    uint64_t direct_refused;
    char fallback[192];
    int have_ring;
    struct io_uring ring;
    unsigned in_kernel;

    sreq *reqs;     /* (depth) */
    int *free_reqs; /* (depth) stack */
    unsigned nfree;
    int *queued; /* (depth) requests waiting to be read, in submit order */
    unsigned nqueued;
    int *done; /* (depth) FIFO of finished requests */
    unsigned done_head, ndone;
    unsigned nstream; /* requests waiting on the stream */
    sread *reads;     /* (depth) */
    fd_entry fds[FD_CACHE];
    uint64_t clock;
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
    return r->io;
}

const char *dsrt__shard_reader_fallback_reason(const dsrt_shard_reader *r) {
    return r->fallback[0] ? r->fallback : NULL;
}

uint64_t dsrt__shard_reader_direct_refused(const dsrt_shard_reader *r) {
    return r->direct_refused;
}

unsigned dsrt__shard_reader_in_flight(const dsrt_shard_reader *r) {
    return r->depth - r->nfree;
}

size_t dsrt__shard_reader_need(const dsrt_shard_reader *r, size_t size) {
    return r->direct ? (size_t)align_up(size + DSRT_DIRECT_ALIGN) : size;
}

int dsrt__shard_reader_create(dsrt_shard_reader **out, const dsrt_datastore *ds,
                              const dsrt_reader_options *o, dsrt_shard_stream *stream) {
    dsrt_reader_options opt = o ? *o : dsrt_reader_defaults();
    *out = NULL;
    if (!ds->index->shards) return dsrt__fail(DSRT_EUNSUPPORTED, "shards: not a shard set");
    if (opt.depth < 1 || opt.depth > 4096)
        return dsrt__fail(DSRT_EOPTION, "shards: reader depth %u is not in 1..4096", opt.depth);
    dsrt_shard_reader *r = dsrt__calloc(1, sizeof *r);
    int rc = -ENOMEM;
    if (!r) return rc;
    r->ds = ds;
    r->set = ds->index->shards;
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
    for (int k = 0; k < FD_CACHE; k++) r->fds[k].fd = -1;
    r->io = DSRT_IO_PREAD;
    if (opt.io != DSRT_IO_PREAD) {
        rc = ring_init(&r->ring, r->depth * 2, r->fallback, sizeof r->fallback);
        if (rc == 0) {
            r->have_ring = 1;
            r->io = DSRT_IO_URING;
        } else if (opt.io == DSRT_IO_URING) {
            dsrt__fail(rc, "shards: reader: %s", r->fallback);
            goto fail;
        }
    }
    *out = r;
    return 0;
fail:
    dsrt__shard_reader_destroy(r);
    return rc;
}

void dsrt__shard_reader_destroy(dsrt_shard_reader *r) {
    if (!r) return;
    if (r->have_ring) {
        /* The kernel still writes into the callers' buffers: wait for it. */
        while (r->in_kernel > 0) {
            struct io_uring_cqe *cqe;
            int rc = io_uring_wait_cqe(&r->ring, &cqe);
            if (rc == -EINTR) continue;
            if (rc < 0) break;
            io_uring_cqe_seen(&r->ring, cqe);
            r->in_kernel--;
        }
        io_uring_queue_exit(&r->ring);
    }
    for (int k = 0; k < FD_CACHE; k++)
        if (r->fds[k].fd >= 0) close(r->fds[k].fd);
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

/* The cache entry of shard k, opening it (in the least recently used free
 * entry) when needed; -1 with q's status set when it cannot be. */
static int fd_get(dsrt_shard_reader *r, uint32_t k, sreq *q) {
    int victim = -1;
    for (int e = 0; e < FD_CACHE; e++) {
        fd_entry *f = &r->fds[e];
        if (f->fd >= 0 && f->shard == k) {
            f->used = ++r->clock;
            return e;
        }
        if (f->fd >= 0 && f->busy) continue;
        /* An empty entry, else the least recently used idle one. */
        if (victim < 0 || (r->fds[victim].fd >= 0 && (f->fd < 0 || f->used < r->fds[victim].used)))
            victim = e;
    }
    if (victim < 0) {
        q->status = -EMFILE; /* every entry has reads in flight: try again later */
        return -1;
    }
    fd_entry *f = &r->fds[victim];
    if (f->fd >= 0) close(f->fd);
    int is_direct, refused;
    int fd = open_shard(r->set->shards[k].path, r->direct, &is_direct, &refused);
    r->direct_refused += (uint64_t)refused;
    f->fd = fd < 0 ? -1 : fd;
    if (fd < 0) {
        q->status = fd;
        if (fd == DSRT_EFORMAT) q->msg = dsrt__strdup(dsrt_last_error());
        return -1;
    }
    f->shard = k;
    f->direct = is_direct;
    f->busy = 0;
    f->used = ++r->clock;
    return victim;
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
    if (dsrt__shard_reader_need(r, (size_t)q->size) > cap) {
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
    int direct = r->fds[d->fdi].direct;
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

/* Puts read d in the ring (or, without one, does it at once). */
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
    fd_entry *f = &r->fds[d->fdi];
    f->busy--;
    sreq *q0 = &r->reqs[d->first];
    if (got == -EINTR || (got == -EAGAIN && q0->retries < RETRIES)) {
        q0->retries++;
        f->busy++;
        read_issue(r, d);
        return;
    }
    if (got == -EINVAL && f->direct) {
        /* The file system took O_DIRECT at open but not for this read:
         * read the file through the cache from now on. */
        int fl = fcntl(f->fd, F_GETFL);
        if (fl >= 0 && fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
            f->direct = 0;
            r->direct_refused++;
            if (q0->done == 0) q0->lead = 0;
            /* Bytes already in place stay; what is missing is read again. */
            if (q0->lead) {
                memmove(q0->buf, q0->buf + q0->lead, (size_t)q0->done);
                q0->lead = 0;
            }
            f->busy++;
            read_issue(r, d);
            return;
        }
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
    int fd = r->fds[d->fdi].fd;
    if (!r->have_ring) {
        ssize_t n;
        do n = preadv(fd, d->iov, (int)d->niov, (off_t)d->off);
        while (n < 0 && errno == EINTR);
        read_done(r, d, n < 0 ? -(long long)errno : (long long)n);
        return;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) {
        io_uring_submit(&r->ring);
        sqe = io_uring_get_sqe(&r->ring);
    }
    if (!sqe) {
        /* Cannot happen with twice depth entries; fail the reads rather than hang. */
        read_done(r, d, -EBUSY);
        return;
    }
    if (d->niov == 1)
        io_uring_prep_read(sqe, fd, d->iov[0].iov_base, (unsigned)d->iov[0].iov_len, d->off);
    else
        io_uring_prep_readv(sqe, fd, d->iov, d->niov, d->off);
    io_uring_sqe_set_data(sqe, d);
    r->in_kernel++;
}

/* Hands the queued requests to the object store's client: a ranged GET each. */
static void issue_remote(dsrt_shard_reader *r) {
    for (unsigned k = 0; k < r->nqueued; k++) {
        int i = r->queued[k];
        sreq *q = &r->reqs[i];
        int rc = dsrt__http_submit(r->http, r->set->shards[q->shard].path, q->off, q->size, q->buf,
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
        r->fds[fdi].busy++;
        q->state = REQ_KERNEL;
        q->fdi = fdi;
        unsigned count = 1;
        uint64_t start = q->off, end = q->off + q->size;
        int last = first;
        i++;
        while (!r->fds[fdi].direct && i < r->nqueued && count < MERGE_COUNT) {
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
    while (r->have_ring && r->in_kernel > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_sq_ready(&r->ring) > 0) io_uring_submit(&r->ring);
        int rc = io_uring_wait_cqe(&r->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) break;
        sread *d = io_uring_cqe_get_data(cqe);
        long long n = cqe->res;
        io_uring_cqe_seen(&r->ring, cqe);
        r->in_kernel--;
        read_done(r, d, n);
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

/* Takes what the stream has for the waiting requests; 1 when any finished.
 * wait_ms: 0 not at all, > 0 at most that long, < 0 until one finishes. */
static int stream_poll(dsrt_shard_reader *r, int wait_ms);

int dsrt__shard_reader_collect(dsrt_shard_reader *r, dsrt_read_result *res, int wait) {
    for (;;) {
        issue_queued(r);
        if (r->have_ring && io_uring_sq_ready(&r->ring) > 0) {
            int rc;
            do rc = io_uring_submit(&r->ring);
            while (rc == -EINTR);
            if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
                return dsrt__fail(rc, "read: io_uring_submit: %s", strerror(-rc));
        }
        /* Completions the kernel and the store's client have. */
        struct io_uring_cqe *cqe;
        while (r->have_ring && r->in_kernel > 0 && io_uring_peek_cqe(&r->ring, &cqe) == 0) {
            sread *d = io_uring_cqe_get_data(cqe);
            long long n = cqe->res;
            io_uring_cqe_seen(&r->ring, cqe);
            r->in_kernel--;
            read_done(r, d, n);
        }
        int rc = collect_remote(r, 0);
        if (rc != 0) return rc;
        if (r->nstream) stream_poll(r, 0);
        if (r->ndone > 0) {
            int i = r->done[r->done_head];
            r->done_head = (r->done_head + 1) % r->depth;
            r->ndone--;
            sreq *q = &r->reqs[i];
            res->tag = q->tag;
            res->path = q->path;
            res->buf = q->buf;
            res->size = q->status == DSRT_ETOOBIG ? dsrt__shard_reader_need(r, (size_t)q->size)
                                                  : (size_t)q->done;
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
        if (r->in_kernel == 0 && r->in_http == 0 && r->nstream == 0) return 0;
        if (!wait) return 0;
        if (r->nstream == 0 && r->in_http == 0) {
            do rc = io_uring_wait_cqe(&r->ring, &cqe);
            while (rc == -EINTR);
            if (rc < 0) return dsrt__fail(rc, "read: io_uring_wait_cqe: %s", strerror(-rc));
        } else if (r->nstream == 0 && r->in_kernel == 0) {
            if ((rc = collect_remote(r, 1)) != 0) return rc;
        } else if (r->in_kernel > 0) {
            /* The ring and the stream: the ring briefly, then the stream. */
            struct __kernel_timespec ts = {0, 1000000};
            rc = io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts);
            if (rc < 0 && rc != -ETIME && rc != -EINTR)
                return dsrt__fail(rc, "read: io_uring_wait_cqe: %s", strerror(-rc));
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

typedef struct {
    uint32_t shard;
    int fd, direct;
    unsigned busy;
    uint64_t used;
} sfd;

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
    sfd fds[STREAM_FDS];
    uint64_t clock;
    int have_ring;
    struct io_uring ring;
    char fallback[192];

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
    int rc = dsrt__shard_plan_epoch(s->plan, key, order, rec->stream, &rec->nstream, rec->use);
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
    s->set = ds->index->shards;
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
    for (int k = 0; k < STREAM_FDS; k++) s->fds[k].fd = -1;
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
    } else if (o->reader.io != DSRT_IO_PREAD) {
        rc = ring_init(&s->ring, STREAM_DEPTH * 2, s->fallback, sizeof s->fallback);
        if (rc == 0) {
            s->have_ring = 1;
        } else if (o->reader.io == DSRT_IO_URING) {
            dsrt__fail(rc, "shards: stream: %s", s->fallback);
            goto fail;
        }
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
    if (s->have_ring) io_uring_queue_exit(&s->ring);
    dsrt__http_destroy(s->http);
    if (s->wake_fd >= 0) close(s->wake_fd);
    for (int k = 0; k < STREAM_FDS; k++)
        if (s->fds[k].fd >= 0) close(s->fds[k].fd);
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

int dsrt__shard_stream_order(dsrt_shard_stream *s, uint64_t key, uint32_t *order) {
    return dsrt__shard_plan_epoch(s->plan, key, order, NULL, NULL, NULL);
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

void dsrt__shard_stream_seek(dsrt_shard_stream *s, uint64_t epoch, uint64_t place) {
    pthread_mutex_lock(&s->mu);
    s->seek_pending = 1;
    s->seek_epoch = epoch;
    s->seek_place = place;
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
    int victim = -1;
    for (int e = 0; e < STREAM_FDS; e++) {
        if (s->fds[e].fd >= 0 && s->fds[e].shard == k) {
            s->fds[e].used = ++s->clock;
            return e;
        }
        if (s->fds[e].busy) continue;
        if (victim < 0 || s->fds[e].fd < 0 ||
            (s->fds[victim].fd >= 0 && s->fds[e].used < s->fds[victim].used))
            victim = e;
    }
    if (victim < 0) return -EMFILE;
    sfd *f = &s->fds[victim];
    if (f->fd >= 0) close(f->fd);
    int direct, refused;
    int fd = open_shard(s->set->shards[k].path, s->o.reader.direct, &direct, &refused);
    f->fd = fd < 0 ? -1 : fd;
    if (fd < 0) return fd;
    f->shard = k;
    f->direct = direct;
    f->busy = 0;
    f->used = ++s->clock;
    return victim;
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
    if (!s->http) s->fds[b->fdi].busy--;
    b->busy = 0;
    s->inflight--;
    pthread_cond_broadcast(&s->ready);
}

/* Starts (or continues) the read of block b. */
static void block_read(dsrt_shard_stream *s, block *b) {
    if (s->http) {
        /* A ranged GET; its answer comes from the client's collect. */
        int rc = dsrt__http_submit(s->http, s->set->shards[b->shard].path, b->off, b->len, b->buf,
                                   s->block_bytes, (uint64_t)(b - s->blocks));
        if (rc != 0) {
            b->msg = dsrt__strdup(dsrt_last_error());
            block_deliver(s, b, rc);
        }
        return;
    }
    sfd *f = &s->fds[b->fdi];
    size_t len = b->len - b->got;
    if (f->direct && b->got % DSRT_DIRECT_ALIGN != 0) {
        int fl = fcntl(f->fd, F_GETFL);
        if (fl >= 0 && fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) == 0) f->direct = 0;
    }
    if (s->have_ring) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
        assert(sqe); /* twice STREAM_DEPTH entries */
        io_uring_prep_read(sqe, f->fd, b->buf + b->got, (unsigned)len, b->off + b->got);
        io_uring_sqe_set_data(sqe, b);
        return;
    }
    /* No ring: read it now, the lock let go meanwhile. */
    pthread_mutex_unlock(&s->mu);
    ssize_t n;
    do n = pread(f->fd, b->buf + b->got, len, (off_t)(b->off + b->got));
    while (n < 0 && errno == EINTR);
    pthread_mutex_lock(&s->mu);
    b->retries = 0;
    if (n < 0) {
        block_deliver(s, b, -errno);
    } else if (n == 0 || b->got + (size_t)n >= b->len) {
        b->got += (size_t)n;
        block_deliver(s, b, 0);
    } else {
        b->got += (size_t)n;
        block_read(s, b);
    }
}

/* A completion of the ring. */
static void block_complete(dsrt_shard_stream *s, block *b, long long n) {
    if ((n == -EINTR || n == -EAGAIN) && b->retries++ < RETRIES) {
        block_read(s, b);
        return;
    }
    if (n == -EINVAL && s->fds[b->fdi].direct) {
        int fl = fcntl(s->fds[b->fdi].fd, F_GETFL);
        if (fl >= 0 && fcntl(s->fds[b->fdi].fd, F_SETFL, fl & ~O_DIRECT) == 0) {
            s->fds[b->fdi].direct = 0;
            block_read(s, b);
            return;
        }
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
    int direct = !s->http && s->fds[fdi].direct;
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
    if (!s->http) s->fds[fdi].busy++;
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
        if (s->have_ring && io_uring_sq_ready(&s->ring) > 0) io_uring_submit(&s->ring);
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
        if (s->inflight > 0 && s->have_ring) {
            /* Wait for a read, waking now and then for new requests. */
            pthread_mutex_unlock(&s->mu);
            struct io_uring_cqe *cqe;
            struct __kernel_timespec ts = {0, 2000000};
            int rc = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
            pthread_mutex_lock(&s->mu);
            while (rc == 0) {
                block *b = io_uring_cqe_get_data(cqe);
                long long n = cqe->res;
                io_uring_cqe_seen(&s->ring, cqe);
                block_complete(s, b, n);
                rc = io_uring_peek_cqe(&s->ring, &cqe);
            }
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
    while (s->have_ring && s->inflight > 0) {
        if (io_uring_sq_ready(&s->ring) > 0) io_uring_submit(&s->ring);
        pthread_mutex_unlock(&s->mu);
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&s->ring, &cqe);
        pthread_mutex_lock(&s->mu);
        if (rc == -EINTR) continue;
        if (rc < 0) break;
        block *b = io_uring_cqe_get_data(cqe);
        io_uring_cqe_seen(&s->ring, cqe);
        s->fds[b->fdi].busy--;
        b->busy = 0;
        s->inflight--;
    }
    s->running = 0;
    pthread_cond_broadcast(&s->ready);
    pthread_mutex_unlock(&s->mu);
}
