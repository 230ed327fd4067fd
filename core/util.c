/*
 * Memory and file utilities used across dsrt: checked allocation that leaves
 * a message, a string arena (the datastore keeps every path of an index in a
 * few large blocks), and whole-file reads and atomic writes.
 */
#include "internal.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Allocation

void *dsrt__malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) dsrt__fail(-ENOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *dsrt__calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) dsrt__fail(-ENOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *dsrt__realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) dsrt__fail(-ENOMEM, "out of memory allocating %zu bytes", n);
    return q;
}

char *dsrt__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = dsrt__malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

// ----------------------------------------------------------------------------
// Text

int dsrt__utf8_char(const unsigned char *p, size_t n) {
    if (n == 0) return 0;
    unsigned c = p[0];
    int len = c < 0x80             ? 1
              : (c & 0xe0) == 0xc0 ? 2
              : (c & 0xf0) == 0xe0 ? 3
              : (c & 0xf8) == 0xf0 ? 4
                                   : 0;
    if (len <= 1) return len;
    if ((size_t)len > n) return 0;
    uint32_t cp = c & (0x7fu >> len);
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

int dsrt__class_name_check(const char *s, size_t n, char *why, size_t why_cap) {
    if (n == 0) {
        snprintf(why, why_cap, "an empty name");
        return -1;
    }
    if (n > 255) {
        snprintf(why, why_cap, "a name of %zu bytes (at most 255)", n);
        return -1;
    }
    const unsigned char *p = (const unsigned char *)s;
    for (size_t at = 0; at < n;) {
        int len = dsrt__utf8_char(p + at, n - at);
        if (len == 0) {
            snprintf(why, why_cap, "not UTF-8 at byte %zu (0x%02x)", at + 1, p[at]);
            return -1;
        }
        uint32_t cp = len == 1 ? p[at] : len == 2 ? (p[at] & 0x1fu) << 6 | (p[at + 1] & 0x3fu) : 0;
        if ((cp < 0x20 && cp != '\t') || (cp >= 0x7f && cp <= 0x9f)) {
            snprintf(why, why_cap, "a control character (U+%04X) at byte %zu", (unsigned)cp,
                     at + 1);
            return -1;
        }
        at += (size_t)len;
    }
    return 0;
}

void dsrt__sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
    if (n > 1) qsort(base, n, size, cmp);
}

int dsrt__grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return dsrt__fail(-ENOMEM, "out of memory: %zu items", need);
        c *= 2;
    }
    void *p = dsrt__realloc(*buf, c * elem);
    if (!p) return -ENOMEM;
    *buf = p;
    *cap = c;
    return 0;
}

// ----------------------------------------------------------------------------
// Arena

struct dsrt_arena_block {
    dsrt_arena_block *next;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

void *dsrt__arena_alloc(dsrt_arena *a, size_t n, size_t align) {
    size_t at = a->head ? (a->used + align - 1) & ~(align - 1) : 0;
    if (!a->head || at + n > a->cap) {
        size_t cap = DSRT_MAX((size_t)1 << 20, n + align);
        dsrt_arena_block *b = dsrt__malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->cap = cap;
        a->head = b;
        a->cap = cap;
        at = 0;
    }
    a->used = at + n;
    a->total += n;
    return a->head->data + at;
}

char *dsrt__arena_strndup(dsrt_arena *a, const char *s, size_t n) {
    char *p = dsrt__arena_alloc(a, n + 1, 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void dsrt__arena_free(dsrt_arena *a) {
    dsrt_arena_block *b = a->head;
    while (b) {
        dsrt_arena_block *next = b->next;
        free(b);
        b = next;
    }
    memset(a, 0, sizeof *a);
}

// ----------------------------------------------------------------------------
// Files

const char *dsrt__file_kind(unsigned mode) {
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISREG(mode)) return "a regular file";
    return "not a regular file";
}

int dsrt__open_regular(const char *path, int *fd, struct stat *st) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    *fd = -1;
    if (f < 0) return dsrt__fail(-errno, "%s: %s", path, strerror(errno));
    if (fstat(f, st) != 0) {
        int e = errno;
        close(f);
        return dsrt__fail(-e, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(f);
        return dsrt__fail(S_ISDIR(st->st_mode) ? -EISDIR : DSRT_EFORMAT,
                          "%s: is %s, not a regular file", path, dsrt__file_kind(st->st_mode));
    }
    *fd = f;
    return 0;
}

int dsrt__read_whole_file(const char *path, size_t max, uint8_t **data, size_t *size) {
    int rc, fd;
    uint8_t *buf = NULL;
    *data = NULL;
    *size = 0;
    struct stat st;
    if ((rc = dsrt__open_regular(path, &fd, &st)) != 0) return rc;
    if ((uint64_t)st.st_size > max) {
        rc = dsrt__fail(DSRT_ETOOBIG, "%s: %lld bytes, more than the limit of %zu", path,
                        (long long)st.st_size, max);
        goto fail;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = dsrt__malloc(n + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto fail;
    }
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dsrt__fail(-errno, "%s: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0) break; /* the file shrank after fstat */
        got += (size_t)r;
    }
    buf[got] = '\0';
    close(fd);
    *data = buf;
    *size = got;
    return 0;
fail:
    free(buf);
    close(fd);
    return rc;
}

static int write_file(const char *path, const void *const *parts, const size_t *sizes, int n_parts,
                      int durable) {
    /* The rename would replace whatever is there: never a device, a FIFO
     * or a folder (as root, "/dev/null" would go). */
    struct stat st;
    int there = lstat(path, &st) == 0;
    if (there && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        return dsrt__fail(S_ISDIR(st.st_mode) ? -EISDIR : DSRT_EFORMAT,
                          "%s: is %s, not a regular file: not replaced", path,
                          dsrt__file_kind(st.st_mode));
    /* A file replaced keeps its permissions (a model kept 0600 stays so). */
    mode_t keep = there && S_ISREG(st.st_mode) ? st.st_mode & 07777 : 0;
    size_t n = strlen(path);
    char *tmp = dsrt__malloc(n + 32), *dir = dsrt__strdup(path);
    int rc = 0, fd = -1;
    if (!tmp || !dir) {
        rc = -ENOMEM;
        goto out;
    }
    snprintf(tmp, n + 32, "%s.tmp.%ld", path, (long)gettid());
    /* A new file, never written through a link planted under its name; a
     * regular file there is a stopped write's and goes. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && lstat(tmp, &st) == 0 && S_ISREG(st.st_mode) &&
        unlink(tmp) == 0)
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 && keep && fchmod(fd, keep) != 0) {
        rc = dsrt__fail(-errno, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if (fd < 0) {
        int e = errno;
        if (e == EEXIST && lstat(tmp, &st) == 0)
            rc = dsrt__fail(DSRT_EFORMAT, "%s: is %s, not a file dsrt was writing: left alone", tmp,
                            dsrt__file_kind(st.st_mode));
        else
            rc = dsrt__fail(-e, "%s: %s", tmp, strerror(e));
        goto out;
    }
    for (int k = 0; k < n_parts; k++) {
        const uint8_t *p = parts[k];
        for (size_t done = 0; done < sizes[k];) {
            ssize_t w = write(fd, p + done, sizes[k] - done);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                rc = dsrt__fail(-errno, "%s: %s", tmp, strerror(errno));
                goto out;
            }
            done += (size_t)w;
        }
    }
    if (durable && fsync(fd) != 0) {
        rc = dsrt__fail(-errno, "%s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = dsrt__fail(-errno, "%s: rename: %s", path, strerror(errno));
        goto out;
    }
    int dfd = durable ? open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    free(dir);
    return rc;
}

int dsrt__write_file_atomic(const char *path, const void *data, size_t size) {
    return write_file(path, &data, &size, 1, 1);
}

int dsrt__write_parts_atomic(const char *path, const void *const *parts, const size_t *sizes,
                             int n) {
    return write_file(path, parts, sizes, n, 1);
}

int dsrt__write_file_replace(const char *path, const void *data, size_t size) {
    return write_file(path, &data, &size, 1, 0);
}

// ----------------------------------------------------------------------------
// Names

int dsrt__name_lookup(const char *const *names, size_t n, const char *name, int icase, int *value) {
    size_t count = 0, seen = 0, at = 0;
    for (size_t v = 0; v < n; v++) {
        if (!names[v]) continue;
        count++;
        if (name && (icase ? strcasecmp(name, names[v]) : strcmp(name, names[v])) == 0) {
            *value = (int)v;
            return 0;
        }
    }
    char list[512];
    list[0] = '\0';
    for (size_t v = 0; v < n && at < sizeof list; v++) {
        if (!names[v]) continue;
        seen++;
        const char *sep = seen == 1 ? "" : seen == count ? " or " : ", ";
        int w = snprintf(list + at, sizeof list - at, "%s%s", sep, names[v]);
        if (w < 0) break;
        at += (size_t)w;
    }
    const char *near = name ? dsrt__nearest(name, strlen(name), names, n) : NULL;
    if (near)
        return dsrt__fail(DSRT_EOPTION, "'%s' is not %s (did you mean %s?)", name, list, near);
    return dsrt__fail(DSRT_EOPTION, "'%s' is not %s", name ? name : "(null)", list);
}

int dsrt__edit_distance(const char *a, size_t na, const char *b, int limit) {
    size_t nb = strlen(b);
    if (na > 64 || nb > 64) return limit + 1;
    if ((na > nb ? na - nb : nb - na) > (size_t)limit) return limit + 1;
    int d[65][65];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int row_min = d[i][0];
        for (size_t j = 1; j <= nb; j++) {
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
            if (v < row_min) row_min = v;
        }
        if (row_min > limit) return limit + 1;
    }
    return d[na][nb];
}

const char *dsrt__nearest(const char *a, size_t na, const char *const *names, size_t n) {
    const char *best = NULL;
    int best_d = (na > 4 ? 2 : 1) + 1;
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) continue;
        int d = dsrt__edit_distance(a, na, names[i], best_d - 1);
        if (d < best_d) best = names[i], best_d = d;
    }
    return best;
}

int dsrt__strlist_add(dsrt_strlist *l, const char *s, size_t len) {
    void *v = l->v;
    if (dsrt__grow(&v, &l->cap, l->n + 1, sizeof *l->v) != 0) return -ENOMEM;
    l->v = v;
    char *c = dsrt__malloc(len + 1);
    if (!c) return -ENOMEM;
    memcpy(c, s, len);
    c[len] = '\0';
    l->v[l->n++] = c;
    return 0;
}

void dsrt__strlist_free(dsrt_strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void dsrt__dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}
