/*
 * The io engine (io.h): one io_uring ring a thread, or pread where the
 * kernel refuses io_uring; opening files for reading; the handling of reads
 * that must be issued again; a cache of open descriptors.
 *
 * With a ring, a submitted read becomes an SQE at once and the SQEs written
 * since the last reap go to the kernel together at the next reap or flush;
 * when nothing is done yet, the same system call waits for the first
 * completion. Without one, submitted reads wait in a FIFO and each is done
 * with pread (preadv for iovecs) when reaped, so a caller that submits
 * several reads and then reaps them sees the same order of events either
 * way, less the overlap.
 */
#include "datastore/bytes/io.h"

#include <assert.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One read asks for at most this many bytes; callers split larger ones. */
#define IO_MAX_LEN (1u << 30)

struct dsrt_io_engine {
    dsrt_io kind;
    int have_ring;
    struct io_uring ring;
    unsigned sq_pending;     /* SQEs written that the kernel has not taken yet */
    unsigned in_kernel;      /* reads the kernel has taken whose CQE is not reaped */
    dsrt_io_op *head, *tail; /* pread: reads waiting, oldest first */
    unsigned queued;
    char fallback[192]; /* why io_uring is not in use; "" when it is or was not asked for */
};

// ----------------------------------------------------------------------------
// Create and destroy

/* Sets up the ring, or leaves the reason in e->fallback and returns the code. */
static int ring_init(dsrt_io_engine *e, unsigned entries) {
    int rc = io_uring_queue_init(entries, &e->ring, 0);
    if (rc < 0) {
        int n = snprintf(e->fallback, sizeof e->fallback, "io_uring_queue_init: %s", strerror(-rc));
        /* The sysctl explains EPERM better than the errno does. */
        FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "re");
        int disabled = 0;
        if (f) {
            if (fscanf(f, "%d", &disabled) != 1) disabled = 0;
            fclose(f);
        }
        if (disabled && n > 0 && (size_t)n < sizeof e->fallback)
            snprintf(e->fallback + n, sizeof e->fallback - (size_t)n,
                     " (kernel.io_uring_disabled = %d)", disabled);
        return rc;
    }
    /* IORING_OP_READ came with Linux 5.6, as did the probe itself. */
    struct io_uring_probe *probe = io_uring_get_probe_ring(&e->ring);
    int ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
             io_uring_opcode_supported(probe, IORING_OP_READV);
    if (probe) io_uring_free_probe(probe);
    if (!ok) {
        io_uring_queue_exit(&e->ring);
        snprintf(e->fallback, sizeof e->fallback,
                 "io_uring: the kernel lacks IORING_OP_READ (Linux 5.6 or later needed)");
        return DSRT_EUNSUPPORTED;
    }
    e->have_ring = 1;
    return 0;
}

int dsrt__io_create(dsrt_io_engine **out, dsrt_io want, unsigned entries, const char *who) {
    *out = NULL;
    dsrt_io_engine *e = dsrt__calloc(1, sizeof *e);
    if (!e) return -ENOMEM;
    e->kind = DSRT_IO_PREAD;
    if (want != DSRT_IO_PREAD) {
        int rc = ring_init(e, entries ? entries : 1);
        if (rc == 0) {
            e->kind = DSRT_IO_URING;
        } else if (want == DSRT_IO_URING) {
            dsrt__fail(rc, "%s: %s", who, e->fallback);
            free(e);
            return rc;
        }
    }
    *out = e;
    return 0;
}

void dsrt__io_destroy(dsrt_io_engine *e) {
    if (!e) return;
    if (e->have_ring) {
        /* SQEs not yet submitted are dropped with the ring. */
        while (e->in_kernel > 0) {
            struct io_uring_cqe *cqe;
            int rc = io_uring_wait_cqe(&e->ring, &cqe);
            if (rc == -EINTR) continue;
            if (rc < 0) break;
            io_uring_cqe_seen(&e->ring, cqe);
            e->in_kernel--;
        }
        io_uring_queue_exit(&e->ring);
    }
    free(e);
}

dsrt_io dsrt__io_kind(const dsrt_io_engine *e) {
    return e->kind;
}

const char *dsrt__io_fallback(const dsrt_io_engine *e) {
    return e->fallback[0] ? e->fallback : NULL;
}

int dsrt__io_fd(const dsrt_io_engine *e) {
    return e->have_ring ? e->ring.ring_fd : -1;
}

unsigned dsrt__io_pending(const dsrt_io_engine *e) {
    return e->queued + e->sq_pending + e->in_kernel;
}

// ----------------------------------------------------------------------------
// Submit and reap

/* Hands the written SQEs to the kernel, and with wait_nr waits for that
 * many completions. */
static int ring_submit(dsrt_io_engine *e, unsigned wait_nr) {
    int rc;
    do rc = io_uring_submit_and_wait(&e->ring, wait_nr);
    while (rc == -EINTR);
    if (rc >= 0) {
        unsigned n = DSRT_MIN((unsigned)rc, e->sq_pending);
        e->sq_pending -= n;
        e->in_kernel += n;
        return 0;
    }
    /* Short of memory for now: go on reaping what the kernel already has. */
    if ((rc == -EAGAIN || rc == -EBUSY) && e->in_kernel > 0) return 0;
    return dsrt__fail(rc, "read: io_uring_submit: %s", strerror(-rc));
}

int dsrt__io_submit(dsrt_io_engine *e, dsrt_io_op *op) {
    assert(op->niov > 0 || op->len <= IO_MAX_LEN);
    if (!e->have_ring) {
        op->next = NULL;
        if (e->tail)
            e->tail->next = op;
        else
            e->head = op;
        e->tail = op;
        e->queued++;
        return 0;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    if (DSRT_UNLIKELY(!sqe)) {
        /* Cannot happen with the ring sized for the reads; make room all the same. */
        ring_submit(e, 0);
        sqe = io_uring_get_sqe(&e->ring);
        if (!sqe) return dsrt__fail(-EBUSY, "read: io_uring submission queue full");
    }
    if (op->niov > 0)
        io_uring_prep_readv(sqe, op->fd, op->iov, op->niov, op->off);
    else
        io_uring_prep_read(sqe, op->fd, op->buf, (unsigned)op->len, op->off);
    io_uring_sqe_set_data(sqe, op);
    e->sq_pending++;
    return 0;
}

int dsrt__io_flush(dsrt_io_engine *e) {
    return e->have_ring && e->sq_pending > 0 ? ring_submit(e, 0) : 0;
}

/* The oldest queued read, done now with pread. */
static dsrt_io_op *pread_next(dsrt_io_engine *e) {
    dsrt_io_op *op = e->head;
    e->head = op->next;
    if (!e->head) e->tail = NULL;
    e->queued--;
    ssize_t n;
    do
        n = op->niov > 0 ? preadv(op->fd, op->iov, (int)op->niov, (off_t)op->off)
                         : pread(op->fd, op->buf, op->len, (off_t)op->off);
    while (n < 0 && errno == EINTR);
    op->res = n < 0 ? -(long long)errno : (long long)n;
    return op;
}

int dsrt__io_reap(dsrt_io_engine *e, dsrt_io_op **out, uint64_t wait_ns) {
    *out = NULL;
    if (!e->have_ring) {
        if (!e->head) return 0;
        *out = pread_next(e);
        return 1;
    }
    struct io_uring_cqe *cqe = NULL;
    int rc;
    if (e->sq_pending > 0) {
        /* Reads submitted since the last call start now, all in one go; when
         * nothing is done yet the same call waits for the first. */
        unsigned wait_nr = wait_ns == DSRT_IO_FOREVER && io_uring_cq_ready(&e->ring) == 0;
        if ((rc = ring_submit(e, wait_nr)) < 0) return rc;
    }
    if (e->in_kernel == 0) return 0;
    rc = io_uring_peek_cqe(&e->ring, &cqe);
    if (rc == -EAGAIN && wait_ns == DSRT_IO_FOREVER) {
        do rc = io_uring_wait_cqe(&e->ring, &cqe);
        while (rc == -EINTR);
    } else if (rc == -EAGAIN && wait_ns > 0) {
        struct __kernel_timespec ts = {(long long)(wait_ns / 1000000000u),
                                       (long long)(wait_ns % 1000000000u)};
        rc = io_uring_wait_cqe_timeout(&e->ring, &cqe, &ts);
        if (rc == -ETIME || rc == -EINTR) return 0;
    }
    if (rc == -EAGAIN) return 0;
    if (rc < 0) return dsrt__fail(rc, "read: io_uring_wait_cqe: %s", strerror(-rc));
    dsrt_io_op *op = io_uring_cqe_get_data(cqe);
    op->res = cqe->res;
    io_uring_cqe_seen(&e->ring, cqe);
    e->in_kernel--;
    *out = op;
    return 1;
}

// ----------------------------------------------------------------------------
// Files

/* Clears one status flag (O_NONBLOCK, O_DIRECT) of an open file. */
static int clear_flag(int fd, int flag) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~flag) < 0) return -errno;
    return 0;
}

int dsrt__io_open(const char *path, int direct, dsrt_io_file *f) {
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    memset(f, 0, sizeof *f);
    int fd = open(path, flags | (direct ? O_DIRECT : 0));
    f->direct = direct != 0;
    if (fd < 0 && direct && errno == EINVAL) {
        /* tmpfs before Linux 6.6, overlayfs on some hosts, FUSE... */
        fd = open(path, flags);
        f->direct = 0;
        f->refused = fd >= 0;
    }
    f->fd = -1;
    if (fd < 0) return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if (S_ISDIR(st.st_mode))
        rc = -EISDIR;
    else if (!S_ISREG(st.st_mode))
        rc = DSRT_EFORMAT;
    if (rc == 0 || rc == DSRT_EFORMAT || rc == -EISDIR) f->mode = (unsigned)st.st_mode;
    if (rc != 0) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    f->nonblock = 1;
    f->size = (uint64_t)st.st_size;
    f->mtime = (int64_t)st.st_mtime;
    return 0;
}

int dsrt__io_again(int fd, long long res, dsrt_io_flags *fl) {
    if (res == -EINTR) return 1;
    if (res == -EAGAIN && fl->retries < DSRT_IO_RETRIES) {
        fl->retries++;
        if (fl->nonblock && clear_flag(fd, O_NONBLOCK) == 0) fl->nonblock = 0;
        return 1;
    }
    if (res == -EINVAL && fl->direct && clear_flag(fd, O_DIRECT) == 0) {
        fl->direct = 0;
        return 1;
    }
    return 0;
}

void dsrt__io_unalign(int fd, uint64_t off, uint8_t *direct) {
    if (*direct && off % DSRT_DIRECT_ALIGN != 0 && clear_flag(fd, O_DIRECT) == 0) *direct = 0;
}

// ----------------------------------------------------------------------------
// Descriptor cache

int dsrt__fdcache_init(dsrt_io_fdcache *c, unsigned n) {
    assert(n > 0 && n <= 64);
    c->e = dsrt__calloc(n, sizeof *c->e);
    if (!c->e) return -ENOMEM;
    c->n = n;
    c->clock = 0;
    for (unsigned k = 0; k < n; k++) c->e[k].fd = -1;
    return 0;
}

void dsrt__fdcache_free(dsrt_io_fdcache *c) {
    for (unsigned k = 0; c->e && k < c->n; k++)
        if (c->e[k].fd >= 0) close(c->e[k].fd);
    free(c->e);
    c->e = NULL;
    c->n = 0;
}

int dsrt__fdcache_get(dsrt_io_fdcache *c, uint32_t key, const char *path, int direct,
                      uint64_t *refused) {
    int victim = -1;
    for (unsigned k = 0; k < c->n; k++) {
        dsrt_io_fdent *f = &c->e[k];
        if (f->fd >= 0 && f->key == key) {
            f->used = ++c->clock;
            return (int)k;
        }
        if (f->fd >= 0 && f->busy) continue;
        /* An empty entry, else the least recently used idle one. */
        if (victim < 0 || (c->e[victim].fd >= 0 && (f->fd < 0 || f->used < c->e[victim].used)))
            victim = (int)k;
    }
    if (victim < 0) return -EMFILE; /* every entry has reads in flight: try again later */
    dsrt_io_fdent *f = &c->e[victim];
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    dsrt_io_file file;
    int rc = dsrt__io_open(path, direct, &file);
    if (refused && file.refused) (*refused)++;
    if (rc == DSRT_EFORMAT || rc == -EISDIR)
        return dsrt__fail(DSRT_EFORMAT, "read: %s: is %s, not a regular file", path,
                          dsrt__file_kind(file.mode));
    if (rc != 0) return rc;
    /* Known regular: reads may block as reads of files do. */
    clear_flag(file.fd, O_NONBLOCK);
    f->fd = file.fd;
    f->key = key;
    f->direct = (uint8_t)file.direct;
    f->busy = 0;
    f->used = ++c->clock;
    return victim;
}
