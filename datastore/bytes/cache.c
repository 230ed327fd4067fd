/*
 * The local cache of remote bytes: entries in a folder, shared by every
 * process of the machine through the file system (datastore/bytes/cache.h
 * says what an entry is and why).
 *
 * Layout. DIR/usage holds the bytes of entries as a decimal count, changed
 * only under an flock of that file; DIR/users is flocked shared by every
 * open handle, so the first one to open (it gets it exclusively) knows no
 * one else writes and may count the entries again and sweep what a killed
 * process left (temporary files). Entries live in 256 sub-folders by the
 * first byte of their name: DIR/ab/abcdef0123456789.e, files being written
 * as NAME.PID.N.tmp. The fill lock of an entry is a lock of one byte of
 * DIR/locks, at the entry's name halved (an open-file-description lock:
 * each handle's own, dropped by the kernel when its process dies); a file
 * made and removed for each fill cost more than the fetch itself (ext4
 * looks for a free inode among those recently freed).
 *
 * Entry file: a header (magic, name, version, block, object size, entry
 * size, ETag), the URL, a hash of every 64 KiB of data, the data. The
 * header, the URL and the chunk hashes are covered by a hash of their own;
 * the file's size must be the header's; each chunk read is checked. A
 * process killed while writing leaves a temporary file, never an entry.
 *
 * Room. Publishing reserves the entry's bytes in DIR/usage first. Past the
 * limit, only cold entries may go: those whose last use (their mtime, set
 * at the first hit of each epoch) is older than the start of the epoch
 * before the last one this handle read, i.e. entries that two whole passes
 * over the data did not want (those of another dataset, of an object's old
 * version). They go oldest first, and never one a reader holds (readers
 * hold an flock shared while they read; eviction takes it exclusively
 * without waiting and skips the entry when it cannot). The folder is
 * scanned for them once an epoch, at the first miss that finds too little
 * room (the count in DIR/usage, read before the fetch).
 * When they do not make room, the handle keeps nothing more until the next
 * epoch: a cache smaller than what a run reads keeps the part it holds and
 * the rest streams from the store, as cheaply as without a cache, rather
 * than evicting each entry before its next use (least-recently-used
 * eviction under a shuffled epoch larger than the cache evicts nearly
 * every entry before it is read again). Entries of an earlier run are
 * this run's too once read: a later run keeps the set an earlier one
 * filled. A crash can only leave the count too high (a reservation never
 * published), which the next lone opener corrects.
 */
#include "datastore/bytes/cache.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CACHE_MAGIC "DSRTce1\n"
#define CACHE_CHUNK ((size_t)64 << 10) /* bytes under one hash */
#define CACHE_ETAG  96                 /* bytes of an ETag kept */

typedef struct {
    char magic[8];
    uint64_t key, version, block, object_size, size;
    uint32_t chunk, url_len, etag_len, pad;
    char etag[CACHE_ETAG];
    uint64_t check; /* of this header (check 0), the URL and the chunk hashes */
} entry_head;
_Static_assert(sizeof(entry_head) == DSRT_CACHE_ENTRY_BYTES, "cache.h's DSRT_CACHE_ENTRY_BYTES");

/* An entry of the folder, as a scan finds it. */
typedef struct {
    int64_t mtime;
    uint64_t size;
    uint64_t key;
} entry_stat;

struct dsrt_cache {
    char *dir;
    uint64_t limit;
    int usage_fd, users_fd, locks_fd;
    /* Epochs told (dsrt__cache_epoch): the last, how many, and when this
     * handle's last three began (wall clock, coarse: as file times), [0]
     * the current one's. */
    uint64_t epoch;
    uint64_t epochs;
    int64_t began[3];
    int full;         /* admits nothing until the next epoch */
    uint64_t refused; /* bytes of the smallest entry refused for want of room */
    int scanned;      /* the folder was scanned for cold entries this epoch */
    entry_stat *cold; /* (ncold) cold at the scan, oldest first; [icold..) not tried */
    size_t ncold, icold;
    uint64_t seq;     /* temporary file names */
    uint8_t *scratch; /* chunks read, before they are checked */
    size_t scratch_cap;
    uint64_t hits, bytes, misses, evictions;
};

/* The wall clock as the kernel stamps files (its coarse clock): an entry
 * touched after this reading has an mtime no earlier than it. */
static int64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME_COARSE, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

// ----------------------------------------------------------------------------
// Hashing: 64-bit words in four lanes, each a multiply-rotate-multiply, then
// a finaliser; fast enough (several GB/s) to check every byte read.

#define H_P1 0x9E3779B185EBCA87ULL
#define H_P2 0xC2B2AE3D27D4EB4FULL

static inline uint64_t h_round(uint64_t acc, uint64_t v) {
    acc += v * H_P2;
    acc = (acc << 31) | (acc >> 33);
    return acc * H_P1;
}

static inline uint64_t h_final(uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
}

static uint64_t hash64(const void *data, size_t n, uint64_t seed) {
    const uint8_t *p = data;
    uint64_t a = seed + H_P1, b = seed ^ H_P2, c = seed, d = seed - H_P1;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a = h_round(a, w[0]);
        b = h_round(b, w[1]);
        c = h_round(c, w[2]);
        d = h_round(d, w[3]);
    }
    uint64_t h = ((a << 1) | (a >> 63)) + ((b << 7) | (b >> 57)) + ((c << 12) | (c >> 52)) +
                 ((d << 18) | (d >> 46)) + (uint64_t)n;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = h_round(h, w);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i < n; i++, k++) tail |= (uint64_t)p[i] << (8 * k);
    return h_final(h_round(h, tail ^ H_P1));
}

uint64_t dsrt__cache_version(const char *etag, size_t n, uint64_t size) {
    char norm[CACHE_ETAG];
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof norm; i++) {
        char ch = etag[i];
        if (ch == '"' || ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n') continue;
        norm[k++] = (char)(ch >= 'A' && ch <= 'F' ? ch + 32 : ch);
    }
    uint64_t v = hash64(norm, k, size ^ 0x65746167ULL);
    return v ? v : 1;
}

uint64_t dsrt__cache_key(const char *url, uint64_t version, uint64_t block) {
    uint64_t words[2] = {version, block};
    return hash64(words, sizeof words, hash64(url, strlen(url), 0x64737274ULL));
}

// ----------------------------------------------------------------------------
// Names

typedef struct {
    char s[PATH_MAX];
} path_buf;

static void entry_path(const dsrt_cache *c, uint64_t key, const char *ext, path_buf *p) {
    snprintf(p->s, sizeof p->s, "%s/%02x/%016llx%s", c->dir, (unsigned)(key >> 56),
             (unsigned long long)key, ext);
}

/* Makes dir and its parents (mkdir -p). */
static int make_dirs(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return -ENAMETOOLONG;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -errno;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -errno;
    return 0;
}

int dsrt__cache_check(const char *dir, uint64_t limit, const char *who) {
    (void)limit;
    if (!dir || !*dir) return 0;
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return dsrt__fail(DSRT_EOPTION, "%s: cache_dir: %s: not a folder", who, dir);
    } else {
        int rc = errno == ENOENT ? make_dirs(dir) : -errno;
        if (rc != 0)
            return dsrt__fail(DSRT_EOPTION, "%s: cache_dir: %s: cannot be made: %s", who, dir,
                              strerror(-rc));
    }
    if (access(dir, R_OK | W_OK | X_OK) != 0)
        return dsrt__fail(DSRT_EOPTION, "%s: cache_dir: %s: %s", who, dir, strerror(errno));
    return 0;
}

// ----------------------------------------------------------------------------
// The count of bytes in use

static uint64_t usage_get(const dsrt_cache *c) {
    char b[32] = "";
    ssize_t n = pread(c->usage_fd, b, sizeof b - 1, 0);
    if (n <= 0) return 0;
    b[n] = '\0';
    return strtoull(b, NULL, 10);
}

static void usage_set(const dsrt_cache *c, uint64_t v) {
    char b[32];
    int n = snprintf(b, sizeof b, "%20llu\n", (unsigned long long)v);
    if (pwrite(c->usage_fd, b, (size_t)n, 0) != n) return; /* the next lone opener counts again */
}

/* Removes the file at path of size bytes under the usage lock: an entry
 * (counted off) or a leftover. */
static void drop_file(const char *path, uint64_t size, uint64_t *usage) {
    if (unlink(path) == 0) *usage -= DSRT_MIN(*usage, size);
}

/* 1 when name is one dsrt's cache makes: an entry, 16 hex digits and
 * ".e"; with tmp, an entry's temporary file, that and ".PID.N.tmp". */
static int cache_name(const char *name, int tmp) {
    for (int i = 0; i < 16; i++)
        if (!isxdigit((unsigned char)name[i])) return 0;
    if (strncmp(name + 16, ".e", 2) != 0) return 0;
    if (!tmp) return name[18] == '\0';
    const char *s = name + 18;
    for (int part = 0; part < 2; part++) {
        if (*s++ != '.' || !isdigit((unsigned char)*s)) return 0;
        while (isdigit((unsigned char)*s)) s++;
    }
    return strcmp(s, ".tmp") == 0;
}

/* Lists every entry; with sweep, also removes temporary files (only a
 * lone opener may: no one else writes). Only regular files of the names
 * the cache makes, in sub-folders that are folders, never through a link:
 * a folder given as the cache that holds anything else keeps it. */
static int scan(dsrt_cache *c, int sweep, entry_stat **out, size_t *n_out) {
    entry_stat *v = NULL;
    size_t n = 0, cap = 0;
    for (unsigned sub = 0; sub < 256; sub++) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s/%02x", c->dir, sub);
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
        if (!dir) {
            if (dfd >= 0) close(dfd);
            continue;
        }
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            const char *name = de->d_name;
            struct stat st;
            int entry = cache_name(name, 0), tmp = !entry && sweep && cache_name(name, 1);
            if ((!entry && !tmp) || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode))
                continue;
            if (tmp) {
                unlinkat(dfd, name, 0);
                continue;
            }
            void *g = v;
            if (dsrt__grow(&g, &cap, n + 1, sizeof *v) != 0) {
                closedir(dir);
                free(v);
                return -ENOMEM;
            }
            v = g;
            v[n++] = (entry_stat){.mtime = mtime_ns(&st),
                                  .size = (uint64_t)st.st_size,
                                  .key = strtoull(name, NULL, 16)};
        }
        closedir(dir);
    }
    *out = v;
    *n_out = n;
    return 0;
}

static int by_mtime(const void *a, const void *b) {
    const entry_stat *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* Entries last used before this are cold (INT64_MIN: none is): the start
 * of the epoch before the last, once this handle has read two whole
 * epochs. */
static int64_t cold_before(const dsrt_cache *c) {
    return c->epochs >= 3 ? c->began[2] : INT64_MIN;
}

/* Cold entries oldest first into c->cold, at most once an epoch. */
static void find_cold(dsrt_cache *c, int64_t before) {
    if (c->scanned) return;
    c->scanned = 1;
    entry_stat *v;
    size_t n, k = 0;
    if (scan(c, 0, &v, &n) != 0) return;
    for (size_t i = 0; i < n; i++)
        if (v[i].mtime < before) v[k++] = v[i];
    qsort(v, k, sizeof *v, by_mtime);
    c->cold = v;
    c->ncold = k;
    c->icold = 0;
}

/* Removes cold entries, oldest first, none a reader holds nor one used
 * since the scan, until *usage + need fits the limit. The folder is
 * scanned at the first call of an epoch; the others go on down its list.
 * Under the usage lock. */
static void evict(dsrt_cache *c, uint64_t need, uint64_t *usage) {
    int64_t before = cold_before(c);
    if (before == INT64_MIN) return;
    find_cold(c, before);
    while (c->icold < c->ncold && (*usage + need > c->limit)) {
        path_buf p;
        entry_path(c, c->cold[c->icold++].key, ".e", &p);
        int fd = open(p.s, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* gone already */
        struct stat st, now;
        /* Still the file scanned (not one published since in its place),
         * still cold, and not being read. */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &st) == 0 && mtime_ns(&st) < before &&
            stat(p.s, &now) == 0 && now.st_ino == st.st_ino) {
            drop_file(p.s, (uint64_t)st.st_size, usage);
            c->evictions++;
        }
        close(fd);
    }
}

void dsrt__cache_epoch(dsrt_cache *c, uint64_t epoch) {
    if (!c || (c->epochs && epoch <= c->epoch)) return;
    c->epoch = epoch;
    c->epochs++;
    c->began[2] = c->began[1];
    c->began[1] = c->began[0];
    c->began[0] = wall_ns();
    /* Entries may have gone cold (or been evicted by others): look again. */
    c->full = 0;
    c->scanned = 0;
    free(c->cold);
    c->cold = NULL;
    c->ncold = c->icold = 0;
}

int dsrt__cache_full(dsrt_cache *c) {
    if (c->full || !c->limit) return c->full;
    /* The count (read without its lock: a hint, the put decides) leaves
     * less room than an entry this handle could not keep, or than a
     * sixty-fourth of the limit (at most a block): unless there are cold
     * entries to evict, nothing is kept. Known before the fetch, a miss
     * takes no fill lock. */
    uint64_t usage = usage_get(c), room = c->limit - DSRT_MIN(usage, c->limit);
    uint64_t least = DSRT_MIN(c->limit / 64, DSRT_CACHE_BLOCK);
    if (room >= least && (!c->refused || room >= c->refused)) return 0;
    int64_t before = cold_before(c);
    if (before != INT64_MIN) find_cold(c, before);
    if (c->icold >= c->ncold) c->full = 1;
    return c->full;
}

// ----------------------------------------------------------------------------
// Open and close

int dsrt__cache_open(dsrt_cache **out, const char *dir, uint64_t limit) {
    *out = NULL;
    int rc = dsrt__cache_check(dir, limit, "cache");
    if (rc != 0) return rc;
    dsrt_cache *c = dsrt__calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->usage_fd = c->users_fd = c->locks_fd = -1;
    c->limit = limit;
    c->began[0] = wall_ns(); /* for a handle never told an epoch */
    rc = -ENOMEM;
    if (!(c->dir = dsrt__strdup(dir))) goto fail;
    char p[PATH_MAX];
    for (unsigned sub = 0; sub < 256; sub++) {
        snprintf(p, sizeof p, "%s/%02x", dir, sub);
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = dsrt__fail(-errno, "cache: %s: %s", p, strerror(errno));
            goto fail;
        }
    }
    snprintf(p, sizeof p, "%s/users", dir);
    if ((c->users_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = dsrt__fail(-errno, "cache: %s: %s", p, strerror(errno));
        goto fail;
    }
    snprintf(p, sizeof p, "%s/locks", dir);
    if ((c->locks_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = dsrt__fail(-errno, "cache: %s: %s", p, strerror(errno));
        goto fail;
    }
    snprintf(p, sizeof p, "%s/usage", dir);
    if ((c->usage_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = dsrt__fail(-errno, "cache: %s: %s", p, strerror(errno));
        goto fail;
    }
    /* Alone: count the entries again and sweep what a killed process left. */
    if (flock(c->users_fd, LOCK_EX | LOCK_NB) == 0) {
        entry_stat *v;
        size_t n;
        flock(c->usage_fd, LOCK_EX);
        if (scan(c, 1, &v, &n) == 0) {
            uint64_t total = 0;
            for (size_t i = 0; i < n; i++) total += v[i].size;
            usage_set(c, total);
            free(v);
        }
        flock(c->usage_fd, LOCK_UN);
    }
    flock(c->users_fd, LOCK_SH);
    *out = c;
    return 0;
fail:
    dsrt__cache_close(c);
    return rc;
}

void dsrt__cache_close(dsrt_cache *c) {
    if (!c) return;
    if (c->usage_fd >= 0) close(c->usage_fd);
    if (c->users_fd >= 0) close(c->users_fd);
    if (c->locks_fd >= 0) close(c->locks_fd);
    free(c->scratch);
    free(c->cold);
    free(c->dir);
    free(c);
}

// ----------------------------------------------------------------------------
// Reading an entry

static size_t chunks_of(uint64_t size) {
    return (size_t)((size + CACHE_CHUNK - 1) / CACHE_CHUNK);
}

static uint64_t head_check(const entry_head *h, const char *url, const void *sums) {
    entry_head t = *h;
    t.check = 0;
    uint64_t x = hash64(&t, sizeof t, 0);
    x = hash64(url, h->url_len, x);
    return hash64(sums, chunks_of(h->size) * sizeof(uint64_t), x);
}

static int scratch_fit(dsrt_cache *c, size_t need) {
    if (need <= c->scratch_cap) return 0;
    uint8_t *b = realloc(c->scratch, need);
    if (!b) return -ENOMEM;
    c->scratch = b;
    c->scratch_cap = need;
    return 0;
}

/* Removes a damaged entry (the count goes down by its file's size). */
static void drop_damaged(dsrt_cache *c, const char *path, int fd) {
    struct stat st;
    uint64_t size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    flock(c->usage_fd, LOCK_EX);
    uint64_t usage = usage_get(c);
    drop_file(path, size, &usage);
    usage_set(c, usage);
    flock(c->usage_fd, LOCK_UN);
}

int dsrt__cache_read(dsrt_cache *c, uint64_t key, const char *url, uint64_t off, size_t len,
                     void *dst, size_t *got, uint64_t *size) {
    *got = 0;
    *size = 0;
    path_buf p;
    entry_path(c, key, ".e", &p);
    int fd = open(p.s, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    /* Shared: an eviction does not take an entry being read. */
    flock(fd, LOCK_SH);
    int rc = 0, damaged = 1;
    /* The header, the URL and the chunk hashes in one read where they fit
     * (an entry of up to a few MiB with a URL of usual length). */
    uint64_t first[512];
    uint8_t *meta = (uint8_t *)first, *big = NULL;
    entry_head h;
    struct stat st;
    size_t url_len = strlen(url);
    ssize_t n = fstat(fd, &st) == 0 ? pread(fd, first, sizeof first, 0) : -1;
    if (n < (ssize_t)sizeof h) goto out;
    memcpy(&h, first, sizeof h);
    if (memcmp(h.magic, CACHE_MAGIC, 8) != 0 || h.key != key || h.url_len != url_len ||
        h.chunk != CACHE_CHUNK || h.size > (uint64_t)st.st_size)
        goto out;
    size_t nch = chunks_of(h.size);
    uint64_t data_off = sizeof h + url_len + nch * sizeof(uint64_t);
    if ((uint64_t)st.st_size != data_off + h.size) goto out; /* cut short, or grown */
    if (data_off > (uint64_t)n) {
        rc = -ENOMEM;
        if (!(big = malloc((size_t)data_off))) goto out;
        rc = 0;
        if (pread(fd, big, (size_t)data_off, 0) != (ssize_t)data_off) goto out;
        meta = big;
    }
    const uint8_t *sums = meta + sizeof h + url_len; /* (nch) 64-bit, unaligned */
    if (memcmp(meta + sizeof h, url, url_len) != 0 || head_check(&h, url, sums) != h.check)
        goto out;
    damaged = 0;
    *size = h.size;
    if (off >= h.size || len == 0) {
        rc = 1;
        goto out;
    }
    uint64_t end = DSRT_MIN(h.size, off + len);
    size_t c0 = (size_t)(off / CACHE_CHUNK), c1 = chunks_of(end);
    uint64_t a = (uint64_t)c0 * CACHE_CHUNK, b = DSRT_MIN(h.size, (uint64_t)c1 * CACHE_CHUNK);
    if ((rc = scratch_fit(c, (size_t)(b - a))) != 0) goto out;
    if (pread(fd, c->scratch, (size_t)(b - a), (off_t)(data_off + a)) != (ssize_t)(b - a)) {
        damaged = 1;
        goto out;
    }
    for (size_t k = c0; k < c1; k++) {
        uint64_t s = (uint64_t)k * CACHE_CHUNK, e = DSRT_MIN(h.size, s + CACHE_CHUNK);
        uint64_t want;
        memcpy(&want, sums + k * sizeof want, sizeof want);
        if (hash64(c->scratch + (s - a), (size_t)(e - s), k) != want) {
            damaged = 1;
            goto out;
        }
    }
    memcpy(dst, c->scratch + (off - a), (size_t)(end - off));
    *got = (size_t)(end - off);
    rc = 1;
    /* Its last use, for eviction: once an epoch is enough to tell a cold
     * entry (a system call less at the other hits). */
    if (mtime_ns(&st) < c->began[0]) futimens(fd, NULL);
out:
    if (damaged && rc == 0) drop_damaged(c, p.s, fd);
    close(fd);
    free(big);
    return rc;
}

// ----------------------------------------------------------------------------
// Filling an entry

/* Locks (F_WRLCK) or unlocks (F_UNLCK) the byte of entry key's fill lock. */
static int fill_lock(const dsrt_cache *c, uint64_t key, short type) {
    struct flock fl = {
        .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)(key >> 1), .l_len = 1};
    return fcntl(c->locks_fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

int dsrt__cache_lock(dsrt_cache *c, uint64_t key) {
    int rc = fill_lock(c, key, F_WRLCK);
    return rc == -EAGAIN || rc == -EACCES ? -EWOULDBLOCK : rc;
}

void dsrt__cache_unlock(dsrt_cache *c, uint64_t key, int held) {
    /* Whoever waits on it looks for the entry again before it fills it. */
    if (held >= 0) fill_lock(c, key, F_UNLCK);
}

/* Writes the whole of an entry's file. */
static int write_all(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int dsrt__cache_put(dsrt_cache *c, uint64_t key, const dsrt_cache_entry *e, const void *data,
                    size_t len) {
    if (len == 0 || c->full) return 0;
    size_t url_len = strlen(e->url), nch = chunks_of(len);
    uint64_t file_bytes = sizeof(entry_head) + url_len + nch * 8 + len;

    /* Room first: the bytes are reserved before anything is written. */
    flock(c->usage_fd, LOCK_EX);
    uint64_t usage = usage_get(c);
    uint64_t evicted = c->evictions;
    if (c->limit && usage + file_bytes > c->limit) evict(c, file_bytes, &usage);
    int room = !c->limit || usage + file_bytes <= c->limit;
    if (room)
        usage_set(c, usage + file_bytes);
    else if (c->evictions != evicted)
        usage_set(c, usage);
    flock(c->usage_fd, LOCK_UN);
    if (!room) {
        c->full = 1; /* until the next epoch */
        if (!c->refused || file_bytes < c->refused) c->refused = file_bytes;
        return 0;
    }

    uint64_t *sums = malloc(nch * sizeof *sums);
    entry_head h = {.key = key,
                    .version = e->version,
                    .block = e->block,
                    .object_size = e->object_size,
                    .size = len,
                    .chunk = CACHE_CHUNK,
                    .url_len = (uint32_t)url_len};
    memcpy(h.magic, CACHE_MAGIC, 8);
    size_t el = DSRT_MIN(strlen(e->etag ? e->etag : ""), sizeof h.etag);
    if (el) memcpy(h.etag, e->etag, el);
    h.etag_len = (uint32_t)el;
    path_buf tmp, dst;
    entry_path(c, key, "", &tmp);
    size_t tl = strlen(tmp.s);
    snprintf(tmp.s + tl, sizeof tmp.s - tl, ".%ld.%llu.tmp", (long)getpid(),
             (unsigned long long)c->seq++);
    entry_path(c, key, ".e", &dst);
    int fd = -1, rc = -ENOMEM;
    if (!sums) goto fail;
    for (size_t k = 0; k < nch; k++) {
        size_t s = k * CACHE_CHUNK;
        sums[k] = hash64((const uint8_t *)data + s, DSRT_MIN(CACHE_CHUNK, len - s), k);
    }
    h.check = head_check(&h, e->url, sums);
    if ((fd = open(tmp.s, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0) {
        rc = -errno;
        goto fail;
    }
    struct iovec iov[4] = {
        {&h, sizeof h}, {(void *)e->url, url_len}, {sums, nch * sizeof *sums}, {(void *)data, len}};
    if ((rc = write_all(fd, iov, 4)) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        rc = -errno;
        goto fail;
    }
    fd = -1;
    /* An entry there already (a damaged one, replaced) is counted off. */
    struct stat old;
    int had = stat(dst.s, &old) == 0;
    if (rename(tmp.s, dst.s) != 0) {
        rc = -errno;
        goto fail;
    }
    if (had) {
        flock(c->usage_fd, LOCK_EX);
        uint64_t u = usage_get(c);
        usage_set(c, u - DSRT_MIN(u, (uint64_t)old.st_size));
        flock(c->usage_fd, LOCK_UN);
    }
    free(sums);
    return 1;
fail:
    /* The disk refused (full, read-only): no entry, the reservation back,
     * and no other write tried this epoch. */
    c->full = 1;
    if (fd >= 0) close(fd);
    unlink(tmp.s);
    free(sums);
    flock(c->usage_fd, LOCK_EX);
    uint64_t u = usage_get(c);
    usage_set(c, u - DSRT_MIN(u, file_bytes));
    flock(c->usage_fd, LOCK_UN);
    (void)rc;
    return 0;
}

// ----------------------------------------------------------------------------
// Counters

void dsrt__cache_count(dsrt_cache *c, int hit, uint64_t bytes) {
    if (hit) {
        c->hits++;
        c->bytes += bytes;
    } else {
        c->misses++;
    }
}

void dsrt__cache_stats(const dsrt_cache *c, dsrt_remote_stats *s) {
    if (!c) return;
    s->cache_hits += c->hits;
    s->cache_bytes += c->bytes;
    s->cache_misses += c->misses;
    s->cache_evictions += c->evictions;
}
