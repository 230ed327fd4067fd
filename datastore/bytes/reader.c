/*
 * The file reader: whole files (or byte ranges of them) into caller buffers,
 * several in flight at once.
 *
 * A reader belongs to one thread and reads through one io engine
 * (datastore/bytes/io.h: io_uring, or pread where the kernel refuses it, the
 * reason kept). Each submitted file is opened and measured right away (open,
 * fstat), then its read is queued on the engine; the queued reads go to the
 * kernel together, at the latest when the caller collects, so a caller that
 * submits several files in a row pays one system call for all of them.
 *
 * A file that cannot be read (missing, a directory, empty, larger than its
 * buffer, changed under us) is a result like any other: submit queues it as
 * already finished and collect delivers it with its status and a message
 * naming the path. Only programmer errors (a full reader, a misaligned
 * O_DIRECT buffer) come back from submit itself.
 *
 * A request may name a byte range (dsrt_reader_submit_range) instead of the
 * whole file: the reads then start at its offset.
 *
 * Paths that are URLs (s3://, https://) go to the reader's HTTP client
 * (datastore/bytes/http.c, made at the first URL), which keeps remote.depth
 * requests in flight on its own; collect takes finished work from both, and
 * when it must wait with both busy it waits on curl with the ring's file
 * descriptor among the ones watched.
 *
 * Memory is bounded: one array of depth request records, allocated at create.
 */
#include "datastore/bytes/cache.h"
#include "datastore/bytes/http.h"
#include "datastore/bytes/io.h"
#include "datastore/bytes/url.h"

#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Most reads a reader keeps in flight; the ring gets twice as many entries. */
#define DSRT_READER_MAX_DEPTH 4096
/* One read asks for at most this many bytes; larger files take several. */
#define DSRT_READ_CHUNK (1u << 30)

// ----------------------------------------------------------------------------
// Request records

/* One file being read. A slot is free when path is NULL. */
typedef struct {
    dsrt_io_op op;    /* the read in flight; op.fd -1 once closed (or never opened) */
    const char *path; /* as submitted; NULL when the slot is free */
    uint8_t *buf;     /* (cap) the caller's buffer */
    size_t cap;
    uint64_t tag;
    uint64_t offset;  /* of the first byte to read */
    uint64_t length;  /* bytes asked (0: to the end of the file) */
    size_t size;      /* bytes to read: the file's size (or the range's) when it was opened */
    size_t done;      /* bytes read so far */
    int status;       /* 0, or the result's status once it failed */
    unsigned mode;    /* st_mode, for the message about a file that is not regular */
    dsrt_io_flags fl; /* O_DIRECT, O_NONBLOCK, retries */
    uint8_t refused;  /* counted in direct_refused */
    uint8_t past_end; /* the range asked lies past the end of the file */
} dsrt_read_req;

struct dsrt_reader {
    unsigned depth;
    int direct;
    unsigned used; /* slots taken: submitted and not yet collected */
    uint64_t direct_refused;

    dsrt_read_req *reqs;  /* (depth) */
    uint32_t *free_slots; /* (depth) stack of free slot indices */
    unsigned free_top;
    /* (depth) FIFO of requests that failed at submit: collect hands them
     * over before it asks the engine. */
    uint32_t *failed;
    unsigned f_head, f_len;

    dsrt_io_engine *io;
    dsrt_remote_options remote;
    char *cache_dir; /* remote.cache_dir's copy */
    dsrt_http *http; /* for URLs; made at the first one */
};

static uint32_t slot_of(const dsrt_reader *r, const dsrt_read_req *q) {
    return (uint32_t)(q - r->reqs);
}

static void close_req(dsrt_read_req *q) {
    if (q->op.fd >= 0) close(q->op.fd);
    q->op.fd = -1;
}

// ----------------------------------------------------------------------------
// Options and names

dsrt_reader_options dsrt_reader_defaults(void) {
    dsrt_reader_options o = {.io = DSRT_IO_AUTO, .depth = 16, .direct = 0};
    o.remote = dsrt__remote_defaults();
    return o;
}

const char *dsrt_io_name(dsrt_io io) {
    switch (io) {
    case DSRT_IO_AUTO:
        return "auto";
    case DSRT_IO_URING:
        return "io_uring";
    case DSRT_IO_PREAD:
        return "pread";
    }
    return "unknown";
}

dsrt_io dsrt_reader_io(const dsrt_reader *r) {
    return dsrt__io_kind(r->io);
}

const char *dsrt_reader_fallback_reason(const dsrt_reader *r) {
    return dsrt__io_fallback(r->io);
}

uint64_t dsrt_reader_direct_refused(const dsrt_reader *r) {
    return r->direct_refused;
}

unsigned dsrt_reader_in_flight(const dsrt_reader *r) {
    return r->used + dsrt__http_in_flight(r->http);
}

void dsrt_reader_remote_stats(const dsrt_reader *r, dsrt_remote_stats *s) {
    dsrt__http_stats(r->http, s);
}

// ----------------------------------------------------------------------------
// Create and destroy

int dsrt_reader_create(dsrt_reader **out, const dsrt_reader_options *o) {
    assert(out);
    *out = NULL;
    dsrt_reader_options opt = o ? *o : dsrt_reader_defaults();
    if (opt.io != DSRT_IO_AUTO && opt.io != DSRT_IO_URING && opt.io != DSRT_IO_PREAD)
        return dsrt__fail(DSRT_EOPTION, "reader: io %d is not auto, io_uring or pread",
                          (int)opt.io);
    if (opt.depth < 1 || opt.depth > DSRT_READER_MAX_DEPTH)
        return dsrt__fail(DSRT_EOPTION, "reader: depth %u is not in 1..%d", opt.depth,
                          DSRT_READER_MAX_DEPTH);
    int rc = dsrt__remote_options_check(&opt.remote, "reader");
    if (rc != 0) return rc;

    rc = -ENOMEM;
    dsrt_reader *r = dsrt__calloc(1, sizeof *r);
    if (!r) goto fail;
    r->depth = opt.depth;
    r->direct = opt.direct != 0;
    r->remote = opt.remote;
    if (opt.remote.cache_dir && *opt.remote.cache_dir &&
        !(r->remote.cache_dir = r->cache_dir = dsrt__strdup(opt.remote.cache_dir)))
        goto fail;
    /* The records and both index arrays in one allocation. */
    size_t reqs_bytes = (size_t)r->depth * sizeof *r->reqs;
    size_t idx_bytes = (size_t)r->depth * sizeof *r->failed;
    r->reqs = dsrt__calloc(1, reqs_bytes + 2 * idx_bytes);
    if (!r->reqs) goto fail;
    r->free_slots = (uint32_t *)((char *)r->reqs + reqs_bytes);
    r->failed = r->free_slots + r->depth;
    for (unsigned i = 0; i < r->depth; i++) {
        r->reqs[i].op.fd = -1;
        r->free_slots[i] = r->depth - 1 - i;
    }
    r->free_top = r->depth;
    if ((rc = dsrt__io_create(&r->io, opt.io, r->depth * 2, "reader")) != 0) goto fail;
    *out = r;
    return 0;

fail:
    if (r) free(r->reqs);
    if (r) free(r->cache_dir);
    free(r);
    return rc;
}

void dsrt_reader_destroy(dsrt_reader *r) {
    if (!r) return;
    dsrt__http_destroy(r->http);
    /* Reads the kernel holds still write into the callers' buffers: the
     * engine waits for every one before they can be freed. */
    dsrt__io_destroy(r->io);
    for (unsigned i = 0; i < r->depth; i++) close_req(&r->reqs[i]);
    free(r->reqs);
    free(r->cache_dir);
    free(r);
}

// ----------------------------------------------------------------------------
// Submit

/* Opens and measures q's file. On a failure of the file, sets q->status and
 * closes it. */
static void open_req(dsrt_reader *r, dsrt_read_req *q) {
    dsrt_io_file f;
    int rc = dsrt__io_open(q->path, r->direct, &f);
    if (f.refused) {
        q->refused = 1;
        r->direct_refused++;
    }
    q->op.fd = f.fd;
    q->fl = (dsrt_io_flags){.direct = (uint8_t)f.direct, .nonblock = (uint8_t)f.nonblock};
    q->mode = f.mode;
    if (rc != 0) {
        q->status = rc;
    } else if (f.size == 0 && !q->offset && !q->length) {
        q->status = DSRT_EEMPTY;
    } else if (q->offset + q->length > f.size || (q->offset && q->offset >= f.size)) {
        q->status = DSRT_ETRUNCATED;
        q->past_end = 1;
        q->size = (size_t)DSRT_MIN(f.size, (uint64_t)SIZE_MAX);
    } else {
        uint64_t want = q->length ? q->length : f.size - q->offset;
        q->size = (size_t)DSRT_MIN(want, (uint64_t)SIZE_MAX);
        if (want > q->cap) q->status = DSRT_ETOOBIG;
    }
    if (q->status != 0) close_req(q);
}

/* Queues q's next read on the engine: from where it stopped, at most a
 * chunk. With O_DIRECT the length is rounded up to the alignment (the
 * kernel stops at the end of the file); a read that must start off the
 * alignment (the file shrank and grew again) turns O_DIRECT off for the
 * rest of the file. */
static int issue(dsrt_reader *r, dsrt_read_req *q) {
    size_t left = q->size - q->done;
    dsrt__io_unalign(q->op.fd, q->offset + q->done, &q->fl.direct);
    if (q->fl.direct) left = (size_t)dsrt__align_up(left);
    q->op.off = q->offset + q->done;
    q->op.buf = q->buf + q->done;
    q->op.len = DSRT_MIN(left, (size_t)DSRT_READ_CHUNK);
    q->op.niov = 0;
    int rc = dsrt__io_submit(r->io, &q->op);
    return rc ? dsrt__fail_prefix(rc, "read: %s", q->path) : 0;
}

int dsrt_reader_submit(dsrt_reader *r, const char *path, void *buf, size_t cap, uint64_t tag) {
    return dsrt_reader_submit_range(r, path, 0, 0, buf, cap, tag);
}

/* The reader's client for URLs, made at the first. */
static int client(dsrt_reader *r, const char *path) {
    int rc;
    if (!r->http && (rc = dsrt__http_create(&r->http, &r->remote)) != 0)
        return dsrt__fail_prefix(rc, "read: %s", path);
    return 0;
}

int dsrt__reader_submit_sample(dsrt_reader *r, const char *path, uint64_t version, uint64_t epoch,
                               void *buf, size_t cap, uint64_t tag) {
    if (!dsrt__is_url(path)) return dsrt_reader_submit(r, path, buf, cap, tag);
    int rc = client(r, path);
    if (rc != 0) return rc;
    dsrt__http_epoch(r->http, epoch);
    return dsrt__http_submit(r->http, path, version, 0, 0, buf, cap, tag);
}

int dsrt_reader_submit_range(dsrt_reader *r, const char *path, uint64_t offset, uint64_t length,
                             void *buf, size_t cap, uint64_t tag) {
    assert(r && path && (buf || cap == 0));
    if (dsrt__is_url(path)) {
        int rc = client(r, path);
        return rc ? rc : dsrt__http_submit(r->http, path, 0, offset, length, buf, cap, tag);
    }
    if (length > UINT64_MAX - offset)
        return dsrt__fail(-EINVAL, "read: %s: range %llu+%llu overflows", path,
                          (unsigned long long)offset, (unsigned long long)length);
    if (r->used == r->depth)
        return dsrt__fail(-EBUSY, "read: %s: %u reads already in flight", path, r->depth);
    if (r->direct && ((uintptr_t)buf % DSRT_DIRECT_ALIGN != 0 || cap % DSRT_DIRECT_ALIGN != 0))
        return dsrt__fail(-EINVAL,
                          "read: %s: O_DIRECT needs a buffer aligned to %d bytes and a "
                          "capacity that is a multiple of it (buffer %p, capacity %zu)",
                          path, DSRT_DIRECT_ALIGN, buf, cap);

    dsrt_read_req *q = &r->reqs[r->free_slots[--r->free_top]];
    *q = (dsrt_read_req){.op = {.fd = -1},
                         .path = path,
                         .buf = buf,
                         .cap = cap,
                         .tag = tag,
                         .offset = offset,
                         .length = length};
    r->used++;
    open_req(r, q);
    if (q->status != 0) {
        r->failed[(r->f_head + r->f_len++) % r->depth] = slot_of(r, q);
        return 0;
    }
    int rc = issue(r, q);
    if (rc < 0) {
        close_req(q);
        q->path = NULL;
        r->free_slots[r->free_top++] = slot_of(r, q);
        r->used--;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// Completing reads

/* Accounts one read of q that returned res (bytes or -errno): 1 when q
 * needs another read, 0 when it is finished (q->status says how). */
static int read_step(dsrt_reader *r, dsrt_read_req *q, long long res) {
    uint8_t was_direct = q->fl.direct;
    if (dsrt__io_again(q->op.fd, res, &q->fl)) {
        if (was_direct && !q->fl.direct && !q->refused) {
            q->refused = 1;
            r->direct_refused++;
        }
        return 1;
    }
    if (res < 0) {
        q->status = (int)res;
        return 0;
    }
    if (res == 0) {
        /* End of file before the size fstat gave: it shrank under us. */
        q->status = DSRT_ETRUNCATED;
        return 0;
    }
    /* A file that grew is read up to its size at open (and O_DIRECT may
     * bring a little more of the last block): keep that size. */
    q->done = DSRT_MIN(q->size, q->done + (size_t)res);
    return q->done < q->size;
}

/* Hands q's outcome to the caller and frees its slot. */
static void finish(dsrt_reader *r, dsrt_read_req *q, dsrt_read_result *res) {
    close_req(q);
    res->tag = q->tag;
    res->path = q->path;
    res->buf = q->buf;
    res->size = q->status == DSRT_ETOOBIG ? q->size : q->done;
    res->status = q->status;
    switch (q->status) {
    case 0:
        break;
    case DSRT_ETOOBIG:
        dsrt__fail(q->status, "read: %s: %zu bytes, larger than the buffer of %zu bytes", q->path,
                   q->size, q->cap);
        break;
    case DSRT_EEMPTY:
        dsrt__fail(q->status, "read: %s: empty file", q->path);
        break;
    case DSRT_EFORMAT:
        dsrt__fail(q->status, "read: %s: is %s, not a regular file", q->path,
                   dsrt__file_kind(q->mode));
        break;
    case DSRT_ETRUNCATED:
        if (q->past_end)
            dsrt__fail(q->status, "read: %s: range %llu+%llu lies past the end (%zu bytes)",
                       q->path, (unsigned long long)q->offset, (unsigned long long)q->length,
                       q->size);
        else
            dsrt__fail(q->status, "read: %s: file shrank while being read (%zu of %zu bytes)",
                       q->path, q->done, q->size);
        break;
    default:
        dsrt__fail(q->status, "read: %s: %s", q->path, dsrt_strerror(q->status));
        break;
    }
    q->path = NULL;
    r->free_slots[r->free_top++] = slot_of(r, q);
    r->used--;
}

/* Collects one local read (dsrt_reader_collect without URLs). */
static int local_collect(dsrt_reader *r, dsrt_read_result *res, int wait) {
    if (r->f_len > 0) {
        dsrt_read_req *q = &r->reqs[r->failed[r->f_head]];
        r->f_head = (r->f_head + 1) % r->depth;
        r->f_len--;
        finish(r, q, res);
        return 1;
    }
    for (;;) {
        dsrt_io_op *op;
        int rc = dsrt__io_reap(r->io, &op, wait ? DSRT_IO_FOREVER : DSRT_IO_NOWAIT);
        if (rc <= 0) return rc;
        dsrt_read_req *q = (dsrt_read_req *)((char *)op - offsetof(dsrt_read_req, op));
        if (read_step(r, q, op->res)) {
            rc = issue(r, q);
            if (rc == 0) continue;
            q->status = rc;
        }
        finish(r, q, res);
        return 1;
    }
}

int dsrt_reader_collect(dsrt_reader *r, dsrt_read_result *res, int wait) {
    assert(r && res);
    if (dsrt__http_in_flight(r->http) == 0) return local_collect(r, res, wait);
    if (r->used == 0) return dsrt__http_collect(r->http, res, wait, -1);
    for (;;) {
        int rc = local_collect(r, res, 0);
        if (rc == 0) rc = dsrt__http_collect(r->http, res, 0, -1);
        if (rc != 0 || !wait) return rc;
        /* Both busy: wait on curl, and on the ring for a local read. Without
         * a ring, local reads are done by local_collect itself. */
        rc = dsrt__http_collect(r->http, res, 1, dsrt__io_fd(r->io));
        if (rc != 0) return rc;
    }
}

void dsrt_reader_cancel(dsrt_reader *r) {
    dsrt__http_cancel(r->http);
    dsrt_read_result res;
    while (r->used > 0)
        if (local_collect(r, &res, 1) <= 0) break;
}
