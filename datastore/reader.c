/*
 * The file reader: whole files into caller buffers, several in flight at once.
 *
 * A reader belongs to one thread and owns one io_uring ring. Each submitted
 * file is opened and measured right away (open, fstat), then its read is
 * queued on the ring; the queued reads are handed to the kernel together, at
 * the latest when the caller collects, so a caller that submits several files
 * in a row pays one system call for all of them. Where the kernel refuses
 * io_uring (a seccomp profile, kernel.io_uring_disabled, a kernel older than
 * 5.6) the reader falls back to pread and keeps the reason: submit only
 * queues, and collect reads the oldest queued file synchronously, so callers
 * see one interface.
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
 * (datastore/http.c, made at the first URL), which keeps remote.depth
 * requests in flight on its own; collect takes finished work from both, and
 * when it must wait with both busy it waits on curl with the ring's file
 * descriptor among the ones watched.
 *
 * Memory is bounded: one array of depth request records, allocated at create.
 */
#include "datastore/remote.h"

#include <assert.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Most reads a reader keeps in flight; the ring gets twice as many entries. */
#define DSRT_READER_MAX_DEPTH 4096
/* One read asks for at most this many bytes; larger files take several. */
#define DSRT_READ_CHUNK (1u << 30)
/* Times a read answered EAGAIN is retried before it counts as failed. */
#define DSRT_READ_RETRIES 8

// ----------------------------------------------------------------------------
// Request records

/* One file being read. A slot is free when path is NULL. */
typedef struct {
    const char *path; /* as submitted; NULL when the slot is free */
    uint8_t *buf;     /* (cap) the caller's buffer */
    size_t cap;
    uint64_t tag;
    uint64_t offset;  /* of the first byte to read */
    uint64_t length;  /* bytes asked (0: to the end of the file) */
    size_t size;      /* bytes to read: the file's size (or the range's) when it was opened */
    size_t done;      /* bytes read so far */
    int fd;           /* -1 once closed (or never opened) */
    int status;       /* 0, or the result's status once it failed */
    unsigned mode;    /* st_mode, for the message about a file that is not regular */
    uint8_t direct;   /* fd has O_DIRECT */
    uint8_t refused;  /* counted in direct_refused */
    uint8_t nonblock; /* fd still has O_NONBLOCK */
    uint8_t retries;  /* EAGAIN answers so far */
    uint8_t past_end; /* the range asked lies past the end of the file */
} dsrt_read_req;

struct dsrt_reader {
    dsrt_io io; /* in use: DSRT_IO_URING or DSRT_IO_PREAD */
    unsigned depth;
    int direct;
    unsigned used; /* slots taken: submitted and not yet collected */
    uint64_t direct_refused;

    dsrt_read_req *reqs;  /* (depth) */
    uint32_t *free_slots; /* (depth) stack of free slot indices */
    unsigned free_top;
    /* (depth) FIFO of slots collect takes before asking the ring: every
     * submitted file with pread, failures found at submit with io_uring. */
    uint32_t *queue;
    unsigned q_head, q_len;

    int have_ring;
    struct io_uring ring;
    unsigned sq_pending; /* SQEs written that the kernel has not taken yet */
    unsigned in_kernel;  /* reads the kernel has taken whose CQE is not reaped */

    char fallback[192]; /* why io_uring is not in use; "" when it is or was not asked for */

    dsrt_remote_options remote;
    dsrt_http *http; /* for URLs; made at the first one */
};

static uint32_t dsrt__slot(const dsrt_reader *r, const dsrt_read_req *q) {
    return (uint32_t)(q - r->reqs);
}

static void dsrt__queue_push(dsrt_reader *r, dsrt_read_req *q) {
    assert(r->q_len < r->depth);
    r->queue[(r->q_head + r->q_len) % r->depth] = dsrt__slot(r, q);
    r->q_len++;
}

static dsrt_read_req *dsrt__queue_pop(dsrt_reader *r) {
    dsrt_read_req *q = &r->reqs[r->queue[r->q_head]];
    r->q_head = (r->q_head + 1) % r->depth;
    r->q_len--;
    return q;
}

static void dsrt__close_req(dsrt_read_req *q) {
    if (q->fd >= 0) close(q->fd);
    q->fd = -1;
}

/* Clears one status flag (O_NONBLOCK, O_DIRECT) of an open file. */
static int dsrt__clear_flag(int fd, int flag) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~flag) < 0) return -errno;
    return 0;
}

// ----------------------------------------------------------------------------
// Options and names

dsrt_reader_options dsrt_reader_defaults(void) {
    dsrt_reader_options o = {.io = DSRT_IO_AUTO, .depth = 16, .direct = 0};
    o.remote = (dsrt_remote_options){
        .depth = 64, .max_connections = 0, .retry_deadline_s = 60, .timeout_s = 30};
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
    return r->io;
}

const char *dsrt_reader_fallback_reason(const dsrt_reader *r) {
    return r->fallback[0] ? r->fallback : NULL;
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

/* Sets up the ring, or leaves the reason in r->fallback and returns the code. */
static int dsrt__ring_init(dsrt_reader *r) {
    int rc = io_uring_queue_init(r->depth * 2, &r->ring, 0);
    if (rc < 0) {
        int n = snprintf(r->fallback, sizeof r->fallback, "io_uring_queue_init: %s", strerror(-rc));
        /* The sysctl explains EPERM better than the errno does. */
        FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "re");
        int disabled = 0;
        if (f) {
            if (fscanf(f, "%d", &disabled) != 1) disabled = 0;
            fclose(f);
        }
        if (disabled && n > 0 && (size_t)n < sizeof r->fallback)
            snprintf(r->fallback + n, sizeof r->fallback - (size_t)n,
                     " (kernel.io_uring_disabled = %d)", disabled);
        return rc;
    }
    /* IORING_OP_READ came with Linux 5.6, as did the probe itself. */
    struct io_uring_probe *probe = io_uring_get_probe_ring(&r->ring);
    int has_read = probe && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe) io_uring_free_probe(probe);
    if (!has_read) {
        io_uring_queue_exit(&r->ring);
        snprintf(r->fallback, sizeof r->fallback,
                 "io_uring: the kernel lacks IORING_OP_READ (Linux 5.6 or later needed)");
        return DSRT_EUNSUPPORTED;
    }
    r->have_ring = 1;
    return 0;
}

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
    if (opt.remote.depth < 1 || opt.remote.depth > DSRT_READER_MAX_DEPTH)
        return dsrt__fail(DSRT_EOPTION, "reader: remote.depth %u is not in 1..%d", opt.remote.depth,
                          DSRT_READER_MAX_DEPTH);
    if (opt.remote.max_connections > DSRT_READER_MAX_DEPTH)
        return dsrt__fail(DSRT_EOPTION, "reader: remote.max_connections %u is not in 0..%d",
                          opt.remote.max_connections, DSRT_READER_MAX_DEPTH);
    if (!(opt.remote.retry_deadline_s >= 0 && opt.remote.retry_deadline_s <= 86400) ||
        !(opt.remote.timeout_s > 0 && opt.remote.timeout_s <= 86400))
        return dsrt__fail(DSRT_EOPTION,
                          "reader: remote.retry_deadline_s %g must be in [0, 86400] and "
                          "remote.timeout_s %g in (0, 86400]",
                          opt.remote.retry_deadline_s, opt.remote.timeout_s);

    int rc = -ENOMEM;
    dsrt_reader *r = dsrt__calloc(1, sizeof *r);
    if (!r) goto fail;
    r->depth = opt.depth;
    r->direct = opt.direct != 0;
    r->remote = opt.remote;
    /* The records and both index arrays in one allocation. */
    size_t reqs_bytes = (size_t)r->depth * sizeof *r->reqs;
    size_t idx_bytes = (size_t)r->depth * sizeof *r->queue;
    r->reqs = dsrt__calloc(1, reqs_bytes + 2 * idx_bytes);
    if (!r->reqs) goto fail;
    r->free_slots = (uint32_t *)((char *)r->reqs + reqs_bytes);
    r->queue = r->free_slots + r->depth;
    for (unsigned i = 0; i < r->depth; i++) {
        r->reqs[i].fd = -1;
        r->free_slots[i] = r->depth - 1 - i;
    }
    r->free_top = r->depth;

    r->io = DSRT_IO_PREAD;
    if (opt.io != DSRT_IO_PREAD) {
        rc = dsrt__ring_init(r);
        if (rc == 0) {
            r->io = DSRT_IO_URING;
        } else if (opt.io == DSRT_IO_URING) {
            dsrt__fail(rc, "reader: %s", r->fallback);
            goto fail;
        }
    }
    *out = r;
    return 0;

fail:
    if (r) free(r->reqs);
    free(r);
    return rc;
}

void dsrt_reader_destroy(dsrt_reader *r) {
    if (!r) return;
    dsrt__http_destroy(r->http);
    if (r->have_ring) {
        /* Reads the kernel holds still write into the callers' buffers: wait
         * for every one before they can be freed. SQEs not yet submitted are
         * dropped with the ring. */
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
    for (unsigned i = 0; i < r->depth; i++) dsrt__close_req(&r->reqs[i]);
    free(r->reqs);
    free(r);
}

// ----------------------------------------------------------------------------
// Submit

/* Opens and measures q's file. On a failure of the file, sets q->status and
 * closes it. */
static void dsrt__open_req(dsrt_reader *r, dsrt_read_req *q) {
    /* O_NONBLOCK keeps a FIFO from blocking the open; it is cleared again if
     * a read ever answers EAGAIN because of it. */
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    int fd = open(q->path, flags | (r->direct ? O_DIRECT : 0));
    q->direct = (uint8_t)r->direct;
    if (fd < 0 && r->direct && errno == EINVAL) {
        /* tmpfs before Linux 6.6, overlayfs on some hosts, FUSE... */
        fd = open(q->path, flags);
        q->direct = 0;
        if (fd >= 0) {
            q->refused = 1;
            r->direct_refused++;
        }
    }
    if (fd < 0) {
        q->status = -errno;
        return;
    }
    q->fd = fd;
    q->nonblock = 1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        q->status = -errno;
    } else if (S_ISDIR(st.st_mode)) {
        q->status = -EISDIR;
    } else if (!S_ISREG(st.st_mode)) {
        q->status = DSRT_EFORMAT;
        q->mode = (unsigned)st.st_mode;
    } else if (st.st_size == 0 && !q->offset && !q->length) {
        q->status = DSRT_EEMPTY;
    } else if (q->offset + q->length > (uint64_t)st.st_size ||
               (q->offset && q->offset >= (uint64_t)st.st_size)) {
        q->status = DSRT_ETRUNCATED;
        q->past_end = 1;
        q->size = (size_t)DSRT_MIN((uint64_t)st.st_size, (uint64_t)SIZE_MAX);
    } else {
        uint64_t want = q->length ? q->length : (uint64_t)st.st_size - q->offset;
        q->size = (size_t)DSRT_MIN(want, (uint64_t)SIZE_MAX);
        if (want > q->cap) q->status = DSRT_ETOOBIG;
    }
    if (q->status != 0) dsrt__close_req(q);
}

/* The next read of q: where into its buffer and how many bytes. With
 * O_DIRECT the length is rounded up to the alignment (the kernel stops at the
 * end of the file); a partial block read before the end (the file shrank and
 * grew again) turns O_DIRECT off for the rest of the file. */
static size_t dsrt__next_len(dsrt_read_req *q) {
    size_t left = q->size - q->done;
    if (q->direct && (q->offset + q->done) % DSRT_DIRECT_ALIGN != 0) {
        if (dsrt__clear_flag(q->fd, O_DIRECT) == 0) q->direct = 0;
    }
    if (q->direct) left = (left + DSRT_DIRECT_ALIGN - 1) / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN;
    return DSRT_MIN(left, (size_t)DSRT_READ_CHUNK);
}

/* Writes the SQE for q's next read. */
static int dsrt__prep_read(dsrt_reader *r, dsrt_read_req *q) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (DSRT_UNLIKELY(!sqe)) {
        /* Cannot happen with twice depth entries; make room all the same. */
        int rc = io_uring_submit(&r->ring);
        if (rc > 0) {
            unsigned n = DSRT_MIN((unsigned)rc, r->sq_pending);
            r->sq_pending -= n;
            r->in_kernel += n;
        }
        sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) return dsrt__fail(-EBUSY, "read: %s: io_uring submission queue full", q->path);
    }
    size_t len = dsrt__next_len(q);
    io_uring_prep_read(sqe, q->fd, q->buf + q->done, (unsigned)len, q->offset + q->done);
    io_uring_sqe_set_data(sqe, q);
    r->sq_pending++;
    return 0;
}

int dsrt_reader_submit(dsrt_reader *r, const char *path, void *buf, size_t cap, uint64_t tag) {
    return dsrt_reader_submit_range(r, path, 0, 0, buf, cap, tag);
}

int dsrt_reader_submit_range(dsrt_reader *r, const char *path, uint64_t offset, uint64_t length,
                             void *buf, size_t cap, uint64_t tag) {
    assert(r && path && (buf || cap == 0));
    if (dsrt__is_url(path)) {
        int rc;
        if (!r->http && (rc = dsrt__http_create(&r->http, &r->remote)) != 0)
            return dsrt__fail_prefix(rc, "read: %s", path);
        return dsrt__http_submit(r->http, path, offset, length, buf, cap, tag);
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
    *q = (dsrt_read_req){.path = path,
                         .buf = buf,
                         .cap = cap,
                         .tag = tag,
                         .fd = -1,
                         .offset = offset,
                         .length = length};
    r->used++;
    dsrt__open_req(r, q);
    if (q->status != 0 || r->io == DSRT_IO_PREAD) {
        dsrt__queue_push(r, q);
        return 0;
    }
    int rc = dsrt__prep_read(r, q);
    if (rc < 0) {
        dsrt__close_req(q);
        q->path = NULL;
        r->free_slots[r->free_top++] = dsrt__slot(r, q);
        r->used--;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// Completing reads

enum { DSRT_READ_DONE = 0, DSRT_READ_AGAIN = 1 };

/* Accounts one read of q that returned res (bytes or -errno). Returns
 * DSRT_READ_AGAIN when q needs another read, DSRT_READ_DONE when it is
 * finished (q->status says how). */
static int dsrt__read_step(dsrt_reader *r, dsrt_read_req *q, long long res) {
    if (res == -EINTR) return DSRT_READ_AGAIN;
    if (res == -EAGAIN && q->retries < DSRT_READ_RETRIES) {
        q->retries++;
        if (q->nonblock && dsrt__clear_flag(q->fd, O_NONBLOCK) == 0) q->nonblock = 0;
        return DSRT_READ_AGAIN;
    }
    if (res == -EINVAL && q->direct) {
        /* The file system took O_DIRECT at open but not for this read. */
        if (dsrt__clear_flag(q->fd, O_DIRECT) == 0) {
            q->direct = 0;
            if (!q->refused) {
                q->refused = 1;
                r->direct_refused++;
            }
            return DSRT_READ_AGAIN;
        }
    }
    if (res < 0) {
        q->status = (int)res;
        return DSRT_READ_DONE;
    }
    if (res == 0) {
        /* End of file before the size fstat gave: it shrank under us. */
        q->status = DSRT_ETRUNCATED;
        return DSRT_READ_DONE;
    }
    /* A file that grew is read up to its size at open (and O_DIRECT may
     * bring a little more of the last block): keep that size. */
    q->done = DSRT_MIN(q->size, q->done + (size_t)res);
    return q->done == q->size ? DSRT_READ_DONE : DSRT_READ_AGAIN;
}

/* Reads q's file with pread until it is finished. */
static void dsrt__pread_req(dsrt_reader *r, dsrt_read_req *q) {
    for (;;) {
        size_t len = dsrt__next_len(q);
        ssize_t n = pread(q->fd, q->buf + q->done, len, (off_t)(q->offset + q->done));
        if (dsrt__read_step(r, q, n < 0 ? -(long long)errno : (long long)n) == DSRT_READ_DONE)
            return;
    }
}

/* Hands q's outcome to the caller and frees its slot. */
static void dsrt__finish(dsrt_reader *r, dsrt_read_req *q, dsrt_read_result *res) {
    dsrt__close_req(q);
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
    r->free_slots[r->free_top++] = dsrt__slot(r, q);
    r->used--;
}

/* Hands the written SQEs to the kernel, and with wait_nr waits for that many
 * completions. */
static int dsrt__ring_submit(dsrt_reader *r, unsigned wait_nr) {
    int rc;
    do rc = io_uring_submit_and_wait(&r->ring, wait_nr);
    while (rc == -EINTR);
    if (rc >= 0) {
        unsigned n = DSRT_MIN((unsigned)rc, r->sq_pending);
        r->sq_pending -= n;
        r->in_kernel += n;
        return 0;
    }
    /* Short of memory for now: go on reaping what the kernel already has. */
    if ((rc == -EAGAIN || rc == -EBUSY) && r->in_kernel > 0) return 0;
    return dsrt__fail(rc, "read: io_uring_submit: %s", strerror(-rc));
}

/* Collects one local read (dsrt_reader_collect without URLs). */
static int local_collect(dsrt_reader *r, dsrt_read_result *res, int wait) {
    for (;;) {
        int rc;
        if (r->sq_pending > 0) {
            /* Reads submitted since the last call start now, all in one go;
             * when nothing is done yet the same call waits for the first. */
            unsigned wait_nr = wait && r->q_len == 0 && io_uring_cq_ready(&r->ring) == 0 ? 1 : 0;
            rc = dsrt__ring_submit(r, wait_nr);
            if (rc < 0 && r->q_len == 0) return rc;
        }
        if (r->q_len > 0) {
            dsrt_read_req *q = dsrt__queue_pop(r);
            if (q->fd >= 0) dsrt__pread_req(r, q);
            dsrt__finish(r, q, res);
            return 1;
        }
        if (!r->have_ring || r->in_kernel == 0) return 0;

        struct io_uring_cqe *cqe = NULL;
        rc = io_uring_peek_cqe(&r->ring, &cqe);
        if (rc == -EAGAIN) {
            if (!wait) return 0;
            do rc = io_uring_wait_cqe(&r->ring, &cqe);
            while (rc == -EINTR);
        }
        if (rc < 0) return dsrt__fail(rc, "read: io_uring_wait_cqe: %s", strerror(-rc));

        dsrt_read_req *q = io_uring_cqe_get_data(cqe);
        long long n = cqe->res;
        io_uring_cqe_seen(&r->ring, cqe);
        r->in_kernel--;
        if (dsrt__read_step(r, q, n) == DSRT_READ_AGAIN) {
            rc = dsrt__prep_read(r, q);
            if (rc == 0) continue;
            q->status = rc;
        }
        dsrt__finish(r, q, res);
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
        rc = dsrt__http_collect(r->http, res, 1, r->have_ring ? r->ring.ring_fd : -1);
        if (rc != 0) return rc;
    }
}

void dsrt_reader_cancel(dsrt_reader *r) {
    dsrt__http_cancel(r->http);
    dsrt_read_result res;
    while (r->used > 0)
        if (local_collect(r, &res, 1) <= 0) break;
}
