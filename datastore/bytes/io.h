/*
 * The io engine: reads at offsets of open files, many in flight, for every
 * reader of local bytes in dsrt (whole files by path, byte ranges of shard
 * and archive members, the stream of the shard order).
 *
 * An engine belongs to one thread and owns one io_uring ring, or none where
 * the kernel refuses io_uring (a seccomp profile, kernel.io_uring_disabled,
 * a kernel older than 5.6): it then does each read with pread when it is
 * reaped, and keeps the reason. Either way the caller sees one interface:
 * it fills a dsrt_io_op (a file, an offset and a buffer or iovecs), submits
 * it, and reaps it later with its result. Reads submitted since the last
 * reap go to the kernel together, in one system call.
 *
 * Beside the engine, what every reader of files needs once: opening a file
 * for reading without blocking on a FIFO and with O_DIRECT where the file
 * system takes it (dsrt__io_open), what to do with a read that failed
 * (dsrt__io_again: interrupted, EAGAIN, O_DIRECT refused late), and a small
 * cache of open descriptors for readers that go back to the same few large
 * files (dsrt_io_fdcache).
 */
#ifndef DSRT_DATASTORE_BYTES_IO_H
#define DSRT_DATASTORE_BYTES_IO_H

#include <dsrt/datastore.h>

#include "core/internal.h"

#include <sys/uio.h>

// ----------------------------------------------------------------------------
// The engine

/* One read. The caller embeds it in its own record, fills fd, off and
 * either buf/len (niov 0) or iov/niov, and gets it back from dsrt__io_reap
 * with res: the bytes read, or -errno. */
typedef struct dsrt_io_op {
    int fd;
    uint64_t off;
    void *buf;
    size_t len;
    const struct iovec *iov;
    unsigned niov;
    long long res;
    struct dsrt_io_op *next; /* the engine's, while the op is queued for pread */
} dsrt_io_op;

typedef struct dsrt_io_engine dsrt_io_engine;

/*
 * Creates an engine with room for `entries` reads in flight. With
 * DSRT_IO_AUTO it falls back to pread when io_uring is refused and keeps
 * the reason (dsrt__io_fallback); with DSRT_IO_URING that fails, with the
 * message "who: reason"; DSRT_IO_PREAD never tries io_uring.
 */
int dsrt__io_create(dsrt_io_engine **e, dsrt_io want, unsigned entries, const char *who);
/* Waits for the reads the kernel holds (they write into the callers'
 * buffers), then frees the engine. NULL is accepted. */
void dsrt__io_destroy(dsrt_io_engine *e);

/* DSRT_IO_URING or DSRT_IO_PREAD. */
dsrt_io dsrt__io_kind(const dsrt_io_engine *e);
/* Why io_uring is not in use, or NULL. */
const char *dsrt__io_fallback(const dsrt_io_engine *e);
/* Reads submitted and not reaped yet. */
unsigned dsrt__io_pending(const dsrt_io_engine *e);
/* The ring's file descriptor, readable when a read ended (for a caller that
 * waits on other descriptors too), or -1 without a ring. */
int dsrt__io_fd(const dsrt_io_engine *e);

/* Queues op; it goes to the kernel at the next dsrt__io_flush or reap (with
 * pread, it is read when reaped). Never fails with the ring sized for the
 * reads in flight; -EBUSY if the submission queue is full all the same. */
int dsrt__io_submit(dsrt_io_engine *e, dsrt_io_op *op);
/* Hands the queued reads to the kernel now. */
int dsrt__io_flush(dsrt_io_engine *e);

/* Waits this long in dsrt__io_reap: not at all, or until a read ends. */
#define DSRT_IO_NOWAIT  0
#define DSRT_IO_FOREVER UINT64_MAX

/*
 * One finished read into *op: 1 when one was reaped, 0 when none is in
 * flight or none ended within wait_ns nanoseconds (DSRT_IO_NOWAIT,
 * DSRT_IO_FOREVER or a time), or a negative code when the ring itself
 * failed (the message set).
 */
int dsrt__io_reap(dsrt_io_engine *e, dsrt_io_op **op, uint64_t wait_ns);

// ----------------------------------------------------------------------------
// Files

/* An open file, as dsrt__io_open leaves it. */
typedef struct {
    int fd;        /* -1 when the open failed */
    int direct;    /* opened with O_DIRECT */
    int refused;   /* O_DIRECT was asked and the file system refused it */
    int nonblock;  /* O_NONBLOCK is still set (cleared at a read's first EAGAIN) */
    unsigned mode; /* st_mode */
    uint64_t size;
    int64_t mtime;
} dsrt_io_file;

/*
 * Opens path for reading: O_NONBLOCK so that a FIFO does not block the open
 * (regular files ignore it), O_DIRECT when direct is set and the file
 * system takes it (else through the page cache, f->refused set), then
 * fstat. Returns 0 with f->fd open on a regular file; -errno, -EISDIR for a
 * folder, DSRT_EFORMAT for anything else that is not a regular file (f->mode
 * says what), with the descriptor closed. Sets no message.
 */
int dsrt__io_open(const char *path, int direct, dsrt_io_file *f);

/* What a read's flags are, for dsrt__io_again. */
typedef struct {
    uint8_t direct;   /* the descriptor has O_DIRECT */
    uint8_t nonblock; /* it has O_NONBLOCK */
    uint8_t retries;  /* EAGAIN answers so far */
} dsrt_io_flags;

/* Times a read answered EAGAIN is tried again before it counts as failed. */
#define DSRT_IO_RETRIES 8

/*
 * Whether a read of fd that returned res must be issued again: 1 for an
 * interrupted read, an EAGAIN (at most DSRT_IO_RETRIES times; O_NONBLOCK
 * cleared at the first), and an EINVAL under O_DIRECT (the file system took
 * O_DIRECT at open but not for this read: O_DIRECT is cleared and
 * fl->direct becomes 0, which the caller sees to count it); 0 when res is
 * the read's outcome.
 */
int dsrt__io_again(int fd, long long res, dsrt_io_flags *fl);

/* Clears O_DIRECT of fd when a read must start at an offset that is not
 * aligned (the rest of the file is read through the cache). */
void dsrt__io_unalign(int fd, uint64_t off, uint8_t *direct);

/* Rounds to DSRT_DIRECT_ALIGN. */
static inline uint64_t dsrt__align_down(uint64_t x) {
    return x / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN;
}
static inline uint64_t dsrt__align_up(uint64_t x) {
    return (x + DSRT_DIRECT_ALIGN - 1) / DSRT_DIRECT_ALIGN * DSRT_DIRECT_ALIGN;
}

// ----------------------------------------------------------------------------
// Descriptor cache

/* One open file of the cache, keyed by the caller's number for it. */
typedef struct {
    uint32_t key;
    int fd; /* -1: empty */
    uint8_t direct;
    unsigned busy; /* reads in flight on it: never closed meanwhile */
    uint64_t used; /* clock of the last use */
} dsrt_io_fdent;

typedef struct {
    dsrt_io_fdent *e; /* (n) */
    unsigned n;
    uint64_t clock;
} dsrt_io_fdcache;

/* A cache of n entries (at most 64), all empty. */
int dsrt__fdcache_init(dsrt_io_fdcache *c, unsigned n);
/* Closes every descriptor and frees the cache. */
void dsrt__fdcache_free(dsrt_io_fdcache *c);
/*
 * The entry of file key (at path), opening it in an empty entry, else in
 * the least recently used one without reads in flight. Returns the entry's
 * index; -EMFILE when every entry has reads in flight; else the open's
 * failure: -errno, or DSRT_EFORMAT with the message "read: PATH: is a FIFO,
 * not a regular file". *refused (may be NULL) is counted up when O_DIRECT
 * was asked and refused.
 */
int dsrt__fdcache_get(dsrt_io_fdcache *c, uint32_t key, const char *path, int direct,
                      uint64_t *refused);

#endif
