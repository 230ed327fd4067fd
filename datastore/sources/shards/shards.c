/*
 * The shards source: a set of tar files in WebDataset's layout opened as a
 * datastore.
 *
 * Opening. The path names the shards: a folder (its index's shards, or
 * every .tar in it), one .tar, a glob ("dir/shard-*.tar") or a brace list
 * ("dir/shard-{000000..000146}.tar", "{a,b}.tar"; at most EXPAND_MAX names
 * in all, counted before any is made). Where dsrt-shards.index lies beside
 * them, every shard it describes at its recorded size is taken from it
 * without a read; any other shard is scanned once (its tar headers
 * and .cls members, nothing else). A sample is the run of consecutive
 * members with one key; its image is the member whose extension is in the
 * extensions option (by default every codec's: jpg, jpeg, jpe, jfif, png,
 * webp), its label the text of its
 * .cls member: an integer (a class index, names from the index or
 * classes.json, else the numbers themselves, below LABELS_MAX) or a class
 * name (classes sorted). A set without any .cls member is labelled by the folders of its
 * members, like the folder source. Samples keep the order of the shards (as
 * listed, or sorted by name) and of their members, so a set written from a
 * folder has the folder's sample positions, labels and class names.
 *
 * What cannot be a sample is said in the warnings, with its shard and key: a
 * sample without an image member, or without a label where others have one,
 * a damaged header (the scan skips to the next good one). A member cut short
 * by the end of its file stays a sample: reading it fails, and the pipeline
 * names it and skips it like any bad file.
 *
 * In an object store, the shard set is a prefix ("s3://bucket/shards", its
 * .tar objects, listed) or a selection like the local ones (globs and brace
 * lists in the last component, matched against the listing; https:// URLs
 * take brace lists only, having no listing). The index and classes.json are
 * fetched from beside the shards; a shard the index does not describe is
 * fetched whole once and scanned in memory.
 *
 * Writing such sets from any datastore is datastore/write/shards.c's.
 */
#include "datastore/sources/shards/shards.h"

#include "datastore/bytes/http.h"
#include "datastore/bytes/url.h"

#include <ctype.h>
#include <fnmatch.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define CLS_MAX            256                 /* bytes of a .cls member read */
#define SCAN_WINDOW        ((size_t)64 << 10)  /* bytes read at once while scanning */
#define SCAN_WINDOW_REMOTE ((size_t)8 << 20)   /* the same, by a ranged GET, from a store */
#define EXPAND_MAX         ((size_t)1 << 20)   /* names a brace list gives in all, at most */
#define EXPAND_BYTES       ((size_t)256 << 20) /* and bytes of them */

/* Class indices below which .cls labels must lie when the set names no
 * classes (the numbers become the names: a label of 50 000 000 would make
 * 50 million of them). */
#define LABELS_MAX ((int32_t)1 << 20)

// ----------------------------------------------------------------------------
// Small helpers

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* 1 when a member's extension ext (len bytes, after the key's dot) is an
 * image's: one of the list, whole ("seg.png" is not "png", as in
 * WebDataset). The key before the dot is never empty. */
static int ext_listed(const dsrt_extensions *e, const char *ext, size_t len) {
    /* From the key's last byte: the matcher takes a name, not a lone ".jpg". */
    return !memchr(ext, '.', len) && dsrt__extensions_match_n(e, ext - 2, len + 2);
}

static int strcmp_p(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// ----------------------------------------------------------------------------
// Which shards: folders, globs, brace lists

static int has_glob(const char *s) {
    return strpbrk(s, "*?[") != NULL;
}

/* The matching '}' of the '{' at s[0], or NULL. */
static const char *brace_end(const char *s) {
    int depth = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '{') depth++;
        if (*p == '}' && --depth == 0) return p;
    }
    return NULL;
}

/* Parses "A..B" (decimal integers) in [s, e). */
static int parse_range(const char *s, const char *e, long long *a, long long *b, int *width) {
    const char *dots = NULL;
    for (const char *p = s; p + 1 < e; p++)
        if (p[0] == '.' && p[1] == '.') {
            dots = p;
            break;
        }
    if (!dots || dots == s || dots + 2 == e) return 0;
    char buf[2][32];
    size_t la = (size_t)(dots - s), lb = (size_t)(e - dots - 2);
    if (la >= 32 || lb >= 32) return 0;
    memcpy(buf[0], s, la);
    buf[0][la] = '\0';
    memcpy(buf[1], dots + 2, lb);
    buf[1][lb] = '\0';
    char *end;
    for (int k = 0; k < 2; k++) {
        const char *t = buf[k];
        if (*t == '-' || *t == '+') t++;
        if (!*t) return 0;
        for (; *t; t++)
            if (!isdigit((unsigned char)*t)) return 0;
    }
    *a = strtoll(buf[0], &end, 10);
    *b = strtoll(buf[1], &end, 10);
    int pad = (buf[0][0] == '0' && la > 1) || (buf[1][0] == '0' && lb > 1);
    *width = pad ? (int)DSRT_MAX(la, lb) : 0;
    return 1;
}

/* The size of the range "A..B" parsed by parse_range (at least 1). */
static unsigned long long range_span(long long a, long long b) {
    return (a <= b ? (unsigned long long)b - (unsigned long long)a
                   : (unsigned long long)a - (unsigned long long)b) +
           1;
}

/* Counts the commas at the top level of the group whose inside is [in, close). */
static int group_commas(const char *in, const char *close) {
    int depth = 0, commas = 0;
    for (const char *p = in; p < close; p++) {
        if (*p == '{') depth++;
        if (*p == '}') depth--;
        if (*p == ',' && depth == 0) commas++;
    }
    return commas;
}

/* pre + mid + post, in a new string. */
static char *concat3(const char *pre, size_t plen, const char *mid, size_t mlen, const char *post) {
    size_t tlen = strlen(post);
    char *t = dsrt__malloc(plen + mlen + tlen + 1);
    if (!t) return NULL;
    memcpy(t, pre, plen);
    memcpy(t + plen, mid, mlen);
    memcpy(t + plen + mlen, post, tlen + 1);
    return t;
}

/* How many names pat expands to, counted without making them: a range
 * multiplies what follows it, alternatives add up. A count above max is
 * reported as max + 1 (the count stops there); SIZE_MAX when out of memory. */
static size_t brace_count(const char *pat, size_t max) {
    const char *open = strchr(pat, '{');
    const char *close = open ? brace_end(open) : NULL;
    if (!open || !close) return 1;
    const char *post = close + 1, *in = open + 1;
    long long a, b;
    int width;
    if (parse_range(in, close, &a, &b, &width)) {
        unsigned long long span = range_span(a, b);
        size_t rest = brace_count(post, max);
        if (rest == SIZE_MAX) return SIZE_MAX;
        return span > max || rest > max / span ? max + 1 : (size_t)span * rest;
    }
    if (group_commas(in, close) == 0) return brace_count(post, max); /* "{x}": literal */
    /* An alternative without a group gives what follows the group. */
    size_t total = 0, rest = brace_count(post, max);
    if (rest == SIZE_MAX) return SIZE_MAX;
    int depth = 0;
    for (const char *s = in, *p = in; p <= close; p++) {
        if (p < close && *p == '{') depth++;
        if (p < close && *p == '}') depth--;
        if (p == close || (*p == ',' && depth == 0)) {
            size_t k = rest;
            if (memchr(s, '{', (size_t)(p - s))) {
                char *t = concat3(pat, (size_t)(open - pat), s, (size_t)(p - s), post);
                if (!t) return SIZE_MAX;
                k = brace_count(t, max);
                free(t);
                if (k == SIZE_MAX) return SIZE_MAX;
            }
            total += k;
            if (total > max) return max + 1;
            s = p + 1;
        }
    }
    return total;
}

/* Expands the first brace group of pat, then the rest recursively, as a
 * shell does: {a,b,c} and {000..146}; a group that is neither ("{x}") stays
 * as it is and the groups after it expand. The caller has counted the
 * names (brace_count). */
static int expand_braces(const char *pat, dsrt_strlist *out) {
    const char *open = strchr(pat, '{');
    const char *close = open ? brace_end(open) : NULL;
    if (!open || !close) return dsrt__strlist_add(out, pat, strlen(pat));
    size_t pre = (size_t)(open - pat);
    const char *post = close + 1, *in = open + 1;
    int rc = 0;
    long long a, b;
    int width;
    if (parse_range(in, close, &a, &b, &width)) {
        size_t cap = strlen(pat) + 64;
        char *buf = dsrt__malloc(cap + 1);
        if (!buf) return -ENOMEM;
        long long step = a <= b ? 1 : -1;
        for (long long v = a;; v += step) {
            int n = snprintf(buf, cap, "%.*s%0*lld%s", (int)pre, pat, width, v, post);
            if (n < 0 || (size_t)n >= cap) {
                rc = dsrt__fail(DSRT_EOPTION, "shards: %s: expansion too long", pat);
                break;
            }
            if ((rc = expand_braces(buf, out)) != 0) break;
            if (v == b) break;
        }
        free(buf);
        return rc;
    }
    if (group_commas(in, close) == 0) {
        /* "{x}" is no group: kept as it is, the groups after it expanded. */
        dsrt_strlist rest = {0};
        rc = expand_braces(post, &rest);
        for (size_t k = 0; rc == 0 && k < rest.n; k++) {
            char *t = concat3(pat, (size_t)(post - pat), rest.v[k], strlen(rest.v[k]), "");
            if (!t) {
                rc = -ENOMEM;
                break;
            }
            rc = dsrt__strlist_add(out, t, strlen(t));
            free(t);
        }
        dsrt__strlist_free(&rest);
        return rc;
    }
    /* Comma alternatives at the top level of the group. */
    int depth = 0;
    for (const char *s = in, *p = in; p <= close; p++) {
        if (p < close && *p == '{') depth++;
        if (p < close && *p == '}') depth--;
        if (p == close || (*p == ',' && depth == 0)) {
            char *t = concat3(pat, pre, s, (size_t)(p - s), post);
            if (!t) return -ENOMEM;
            rc = expand_braces(t, out);
            free(t);
            if (rc != 0) break;
            s = p + 1;
        }
    }
    return rc;
}

/* The names the brace list pat gives (pat itself when it has none), at most
 * EXPAND_MAX of them and EXPAND_BYTES in all, counted before any is made:
 * each group multiplies the names, so a few short groups could otherwise
 * ask for billions. name is the path the user gave, for messages. */
static int expand_list(const char *pat, const char *name, dsrt_strlist *out) {
    size_t n = brace_count(pat, EXPAND_MAX);
    if (n == SIZE_MAX) return -ENOMEM;
    /* No name is longer than the pattern. */
    if (n > EXPAND_MAX || n > EXPAND_BYTES / (strlen(pat) + 1))
        return dsrt__fail(DSRT_EOPTION,
                          "shards: %s: the brace list gives more than %zu names (or %zu MiB of "
                          "them), the most dsrt expands: name fewer shards, or their folder",
                          name, n > EXPAND_MAX ? EXPAND_MAX : EXPAND_BYTES / (strlen(pat) + 1),
                          EXPAND_BYTES >> 20);
    return expand_braces(pat, out);
}

/* The .tar files of a folder, sorted by name. */
static int list_folder(const char *dir, dsrt_strlist *out) {
    DIR *d = opendir(dir);
    if (!d) return dsrt__fail(-errno, "shards: %s: %s", dir, strerror(errno));
    dsrt_strlist names = {0};
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !ends_with(de->d_name, ".tar")) continue;
        if ((rc = dsrt__strlist_add(&names, de->d_name, strlen(de->d_name))) != 0) break;
    }
    closedir(d);
    if (rc == 0) dsrt__sort(names.v, names.n, sizeof *names.v, strcmp_p);
    for (size_t i = 0; rc == 0 && i < names.n; i++) {
        size_t len = strlen(dir) + strlen(names.v[i]) + 2;
        char *p = dsrt__malloc(len);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        snprintf(p, len, "%s/%s", dir, names.v[i]);
        rc = dsrt__strlist_add(out, p, strlen(p));
        free(p);
    }
    dsrt__strlist_free(&names);
    return rc;
}

/* The shard paths a selection names (not a folder): brace groups expanded,
 * then globs matched (sorted); a name without a glob must exist. */
static int expand_selection(const char *path, dsrt_strlist *out) {
    dsrt_strlist pats = {0};
    int rc = expand_list(path, path, &pats);
    for (size_t i = 0; rc == 0 && i < pats.n; i++) {
        const char *p = pats.v[i];
        if (!has_glob(p)) {
            rc = dsrt__strlist_add(out, p, strlen(p));
            continue;
        }
        glob_t g;
        int e = glob(p, GLOB_ERR, NULL, &g);
        if (e == GLOB_NOMATCH) {
            rc = dsrt__fail(-ENOENT, "shards: %s: no file matches", p);
        } else if (e != 0) {
            rc = dsrt__fail(-EIO, "shards: %s: cannot be matched (%s)", p,
                            e == GLOB_NOSPACE ? "out of memory" : "read error");
        } else {
            for (size_t k = 0; rc == 0 && k < g.gl_pathc; k++)
                rc = dsrt__strlist_add(out, g.gl_pathv[k], strlen(g.gl_pathv[k]));
        }
        if (e == 0 || e == GLOB_NOMATCH) globfree(&g);
    }
    dsrt__strlist_free(&pats);
    return rc;
}

int dsrt__is_shardset(const char *path, int folder) {
    if (!folder) return ends_with(path, ".tar") || has_glob(path) || strchr(path, '{') != NULL;
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_INDEX_NAME, path);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) return 1;
    /* Tar files and no sub-folder: a folder of classes it is not. */
    DIR *d = opendir(path);
    if (!d) return 0;
    int tars = 0, dirs = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && !dirs) {
        if (de->d_name[0] == '.') continue;
        if (de->d_type == DT_DIR) dirs = 1;
        if (ends_with(de->d_name, ".tar")) tars = 1;
    }
    closedir(d);
    return tars && !dirs;
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

// ----------------------------------------------------------------------------
// Scanning a shard that the index does not describe

/* One sample found by a scan. */
typedef struct {
    uint64_t offset, size;
    const char *member; /* the image member's name (scan arena) */
    const char *cls;    /* its .cls text, trimmed, or NULL */
    size_t key_len;     /* bytes of member that are the key */
} found;

typedef struct {
    dsrt_index *ix;
    const char *shard;
    dsrt_extensions ext;
    dsrt_arena *arena;
    /* Reading: through a window of the file fd, or read/read_ctx. */
    dsrt_tar_read_fn read;
    void *read_ctx;
    int fd;
    uint8_t *win;
    uint64_t win_off;
    size_t win_len;
    /* The group of members being gathered. */
    char *key;
    size_t key_len, key_cap;
    int open, members, cls_bad;
    found cur;
    /* Results. */
    found *samples;
    size_t n, cap;
    size_t no_image, two_images;
    int failed;
} scanner;

static int64_t scan_read(void *ctx, uint64_t off, void *buf, size_t len) {
    scanner *s = ctx;
    if (off >= s->win_off && off - s->win_off <= s->win_len &&
        len <= s->win_len - (off - s->win_off)) {
        memcpy(buf, s->win + (off - s->win_off), len);
        return (int64_t)len;
    }
    if (len > SCAN_WINDOW) {
        size_t got = 0;
        while (got < len) {
            ssize_t r = pread(s->fd, (char *)buf + got, len - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return dsrt__fail(-errno, "shards: %s: %s", s->shard, strerror(errno));
            if (r == 0) break;
            got += (size_t)r;
        }
        return (int64_t)got;
    }
    size_t got = 0;
    while (got < SCAN_WINDOW) {
        ssize_t r = pread(s->fd, s->win + got, SCAN_WINDOW - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dsrt__fail(-errno, "shards: %s: %s", s->shard, strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
    }
    s->win_off = off;
    s->win_len = got;
    size_t n = DSRT_MIN(len, got);
    memcpy(buf, s->win, n);
    return (int64_t)n;
}

static void scan_warn(void *ctx, const char *msg) {
    scanner *s = ctx;
    dsrt__index_warn(s->ix, "%s", msg);
}

/* Ends the group being gathered: a sample when it has an image. */
static int group_end(scanner *s) {
    if (!s->open) return 0;
    s->open = 0;
    if (!s->cur.member) {
        s->no_image++;
        return 0;
    }
    if (s->cls_bad) s->cur.cls = ""; /* present but unreadable: no label */
    void *v = s->samples;
    if (dsrt__grow(&v, &s->cap, s->n + 1, sizeof *s->samples) != 0) return -ENOMEM;
    s->samples = v;
    s->samples[s->n++] = s->cur;
    return 0;
}

static int scan_member(void *ctx, const dsrt_tar_member *m) {
    scanner *s = ctx;
    size_t key_len, ext_len;
    const char *ext;
    if (m->type != '0') return 0; /* folders, links: not part of any sample */
    const char *name = m->name;
    size_t len = m->name_len;
    while (len >= 2 && name[0] == '.' && name[1] == '/') name += 2, len -= 2;
    if (!dsrt__tar_split_key(name, len, &key_len, &ext, &ext_len)) return 0;
    if (!s->open || key_len != s->key_len || memcmp(name, s->key, key_len) != 0) {
        int rc = group_end(s);
        if (rc != 0) return rc;
        void *k = s->key;
        if (dsrt__grow(&k, &s->key_cap, key_len + 1, 1) != 0) return -ENOMEM;
        s->key = k;
        memcpy(s->key, name, key_len);
        s->key[key_len] = '\0';
        s->key_len = key_len;
        s->open = 1;
        s->cls_bad = 0;
        memset(&s->cur, 0, sizeof s->cur);
    }
    if (ext_listed(&s->ext, ext, ext_len)) {
        if (s->cur.member) {
            s->two_images++;
            return 0;
        }
        s->cur.member = dsrt__arena_strndup(s->arena, name, len);
        if (!s->cur.member) return -ENOMEM;
        s->cur.offset = m->offset;
        s->cur.size = m->size;
        s->cur.key_len = key_len;
    } else if (ext_len == 3 && strncasecmp(ext, "cls", 3) == 0 && !s->cur.cls) {
        char text[CLS_MAX + 1];
        if (m->truncated || m->size > CLS_MAX) {
            dsrt__index_warn(s->ix, "%s: %.*s: %s .cls member (%llu bytes): no label", s->shard,
                             (int)len, name, m->truncated ? "truncated" : "too long a",
                             (unsigned long long)m->size);
            s->cls_bad = 1;
            return 0;
        }
        int64_t got = s->read(s->read_ctx, m->offset, text, (size_t)m->size);
        if (got < 0) return (int)got;
        if ((uint64_t)got < m->size) {
            s->cls_bad = 1;
            return 0;
        }
        size_t a = 0, b = (size_t)got;
        while (a < b && isspace((unsigned char)text[a])) a++;
        while (b > a && isspace((unsigned char)text[b - 1])) b--;
        s->cur.cls = dsrt__arena_strndup(s->arena, text + a, b - a);
        if (!s->cur.cls) return -ENOMEM;
    }
    return 0;
}

/* Scans one shard (size bytes, read through s->read) into s->samples. */
static int scan_walk(scanner *s, const char *path, uint64_t size) {
    s->shard = path;
    s->open = 0;
    s->n = 0;
    s->no_image = s->two_images = 0;
    int rc = dsrt__tar_scan(path, size, s->read, s->read_ctx, scan_member, scan_warn, s);
    if (rc == 0) rc = group_end(s);
    if (rc != 0) return rc;
    if (s->no_image) {
        char list[DSRT_MAX_EXTENSIONS * (DSRT_MAX_EXT_LEN + 1) + 1];
        dsrt__extensions_text(&s->ext, list, sizeof list);
        dsrt__index_warn(s->ix, "%s: %zu sample%s without an image member (extensions %s) left out",
                         path, s->no_image, s->no_image == 1 ? "" : "s", list);
    }
    if (s->two_images)
        dsrt__index_warn(s->ix, "%s: %zu sample%s with more than one image member: the first taken",
                         path, s->two_images, s->two_images == 1 ? "" : "s");
    return 0;
}

/* Scans the shard file at path. */
static int scan_shard(scanner *s, const char *path, uint64_t size) {
    int rc, fd;
    struct stat st;
    if ((rc = dsrt__open_regular(path, &fd, &st)) != 0) return dsrt__fail_prefix(rc, "shards");
    s->fd = fd;
    s->win_len = 0;
    s->win_off = 0;
    s->read = scan_read;
    s->read_ctx = s;
    rc = scan_walk(s, path, size);
    close(fd);
    return rc;
}

typedef struct {
    const uint8_t *buf;
    size_t len;
} memory;

static int64_t memory_read(void *ctx, uint64_t off, void *buf, size_t len) {
    const memory *m = ctx;
    if (off >= m->len) return 0;
    size_t n = DSRT_MIN(len, m->len - (size_t)off);
    memcpy(buf, m->buf + off, n);
    return (int64_t)n;
}

int dsrt__shard_scan_memory(const uint8_t *buf, size_t len, const char *name,
                            const char *extensions, dsrt_index *ix, dsrt_shard_sample **out,
                            size_t *n) {
    dsrt_arena arena = {0};
    memory m = {buf, len};
    scanner s = {.ix = ix, .arena = &arena, .read = memory_read, .read_ctx = &m, .fd = -1};
    *out = NULL;
    *n = 0;
    int rc = dsrt__extensions_parse(&s.ext, extensions);
    if (rc == 0) rc = scan_walk(&s, name, len);
    if (rc == 0 && s.n) {
        *out = dsrt__calloc(s.n, sizeof **out);
        if (!*out) rc = -ENOMEM;
        for (size_t i = 0; rc == 0 && i < s.n; i++)
            (*out)[i] = (dsrt_shard_sample){s.samples[i].offset, s.samples[i].size,
                                            s.samples[i].cls != NULL};
        if (rc == 0) *n = s.n;
    }
    free(s.samples);
    free(s.key);
    dsrt__arena_free(&arena);
    return rc;
}

// ----------------------------------------------------------------------------
// Labels of scanned samples

/* 1 when s is a decimal integer in [0, 2^31). */
static int as_index(const char *s, int32_t *v) {
    if (!*s || strlen(s) > 10) return 0;
    long long x = 0;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p)) return 0;
        x = x * 10 + (*p - '0');
    }
    if (x > INT32_MAX) return 0;
    *v = (int32_t)x;
    return 1;
}

/* The class of a sample labelled by its folders: the first folder under the
 * common root of all keys (folder names), or the folder holding it (parent). */
static void folder_label(const found *f, size_t root, int parent, const char **name, size_t *len) {
    const char *k = f->member + root;
    size_t kl = f->key_len - root;
    const char *last = NULL;
    for (size_t i = kl; i > 0; i--)
        if (k[i - 1] == '/') {
            last = k + i - 1;
            break;
        }
    if (!last) {
        *name = "";
        *len = 0;
        return;
    }
    if (parent) {
        const char *s = last;
        while (s > k && s[-1] != '/') s--;
        *name = s;
        *len = (size_t)(last - s);
    } else {
        const char *slash = memchr(k, '/', kl);
        *name = k;
        *len = (size_t)(slash - k);
    }
}

// ----------------------------------------------------------------------------
// Opening

/* Everything gathered before the index of the datastore is built. */
typedef struct {
    dsrt_strlist shards;       /* paths */
    uint64_t *sizes;           /* (shards.n) */
    int *from_index;           /* (shards.n) index shard number, or -1: scanned */
    found **scanned;           /* (shards.n) samples of scanned shards */
    size_t *nscanned;          /* (shards.n) */
    dsrt_shard_index x;        /* the index, when there is one */
    size_t *x_first;           /* (x.nshards) first sample of each index shard */
    const char **json_classes; /* classes.json's names */
    size_t njson;
    dsrt_arena tmp; /* names of scanned samples */
    /* An object store: the client, and each shard's size from the listing
     * (UINT64_MAX when unknown: https:// has no listing). */
    dsrt_http *http;
    uint64_t *listed;
    uint64_t *listed_version;        /* (shards.n) the listing's version of each, 0: not known */
    const dsrt_datastore_options *o; /* as opened: the requests' options */
} gather;

static void gather_free(gather *g) {
    dsrt__http_destroy(g->http);
    free(g->listed);
    free(g->listed_version);
    if (g->scanned)
        for (size_t k = 0; k < g->shards.n; k++) free(g->scanned[k]);
    free(g->scanned);
    free(g->nscanned);
    free(g->sizes);
    free(g->from_index);
    free(g->x_first);
    free(g->json_classes);
    dsrt__shard_index_clear(&g->x);
    dsrt__strlist_free(&g->shards);
    dsrt__arena_free(&g->tmp);
}

/* Finds name among the index's shards (sorted copy in by_name). */
static int index_find(const gather *g, const size_t *by_name, const char *name) {
    size_t lo = 0, hi = g->x.nshards;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(g->x.shard_names[by_name[mid]], name);
        if (c == 0) return (int)by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int by_shard_name(const void *a, const void *b, void *ctx) {
    const dsrt_shard_index *x = ctx;
    return strcmp(x->shard_names[*(const size_t *)a], x->shard_names[*(const size_t *)b]);
}

// ----------------------------------------------------------------------------
// Shard sets in an object store

/* One folder's listing: the objects directly in it, with their sizes. */
typedef struct {
    size_t prefix_len; /* of the folder's key prefix, '/' included */
    dsrt_strlist names;
    uint64_t *sizes;
    uint64_t *versions; /* (names.n) dsrt__cache_version of each, 0: no ETag */
    size_t cap_sizes, cap_versions;
} listing;

static int list_one(void *ctx, const char *key, size_t len, uint64_t size, uint64_t version) {
    listing *l = ctx;
    if (len <= l->prefix_len || memchr(key + l->prefix_len, '/', len - l->prefix_len)) return 0;
    void *v = l->sizes, *w = l->versions;
    if (dsrt__grow(&v, &l->cap_sizes, l->names.n + 1, sizeof *l->sizes) != 0) return -ENOMEM;
    l->sizes = v;
    if (dsrt__grow(&w, &l->cap_versions, l->names.n + 1, sizeof *l->versions) != 0) return -ENOMEM;
    l->versions = w;
    l->sizes[l->names.n] = size;
    l->versions[l->names.n] = version;
    return dsrt__strlist_add(&l->names, key + l->prefix_len, len - l->prefix_len);
}

/* The size the listing gives name, or UINT64_MAX; *version (may be NULL)
 * its version, 0 when not listed. */
static uint64_t listed(const listing *l, const char *name, uint64_t *version) {
    for (size_t i = 0; i < l->names.n; i++)
        if (!strcmp(l->names.v[i], name)) {
            if (version) *version = l->versions[i];
            return l->sizes[i];
        }
    if (version) *version = 0;
    return UINT64_MAX;
}

static uint64_t listed_size(const listing *l, const char *name) {
    return listed(l, name, NULL);
}

/* What the start of a prefix's listing says: an index, tar objects, keys in
 * folders below. */
typedef struct {
    size_t prefix_len, keys;
    int index, tars, folders;
} peek;

static int peek_one(void *ctx, const char *key, size_t len, uint64_t size, uint64_t version) {
    peek *k = ctx;
    (void)version;
    if (len <= k->prefix_len) return 0;
    const char *rel = key + k->prefix_len;
    size_t n = len - k->prefix_len;
    if (memchr(rel, '/', n)) {
        k->folders = 1;
    } else {
        k->index |= n == strlen(DSRT_SHARD_INDEX_NAME) && !memcmp(rel, DSRT_SHARD_INDEX_NAME, n);
        k->tars |= n > 4 && !strncasecmp(rel + n - 4, ".tar", 4);
    }
    /* Enough seen (the first page tells): stop the listing. */
    return k->index || (k->tars && k->folders) || ++k->keys >= 1000 ? 1 : 0;
}

int dsrt__s3_is_shardset(const char *url, const dsrt_datastore_options *o) {
    const char *bucket, *key;
    size_t blen;
    int rc = dsrt__s3_split(url, &bucket, &blen, &key);
    if (rc != 0) return rc;
    dsrt_http *h;
    if ((rc = dsrt__http_create_opening(&h, o, 1)) != 0) return rc;
    dsrt_strbuf prefix = {0};
    size_t klen = strlen(key);
    while (klen > 0 && key[klen - 1] == '/') klen--;
    rc = -ENOMEM;
    if (!klen || (dsrt__sb_add(&prefix, key, klen) == 0 && dsrt__sb_add(&prefix, "/", 1) == 0)) {
        peek k = {.prefix_len = prefix.len};
        rc = dsrt__s3_list(h, bucket, blen, prefix.s, prefix.len, url, peek_one, &k);
        if (rc >= 0) rc = k.index || (k.tars && !k.folders);
    }
    free(prefix.s);
    dsrt__http_destroy(h);
    return rc;
}

/*
 * A shard in a store that the index does not describe is scanned through a
 * window of ranged GETs, as a local one through a window of reads, so that
 * memory stays at the window however large the object (or however long an
 * answer that never ends). Its size is the listing's; https:// has none,
 * and the first answer's (Content-Range) is taken. An object that is not of
 * that size (an answer says another, or a byte comes past it) is an error
 * naming it.
 */
typedef struct {
    dsrt_http *http;
    const char *url;
    uint64_t size; /* listed; UINT64_MAX until an answer says it */
    int told;      /* an answer gave the object's size, the listed one */
    uint8_t *win;  /* (SCAN_WINDOW_REMOTE) */
    uint64_t win_off;
    size_t win_len;
} remote_scan;

/* A ranged GET of [off, off + len) into buf: len bytes, or fewer at the
 * listed end (*got says how many). */
static int remote_get(remote_scan *r, uint64_t off, void *buf, size_t len, size_t *got) {
    uint64_t total;
    int rc = dsrt__http_fetch_range(r->http, r->url, off, len, buf, got, &total);
    if (rc != 0 && rc != DSRT_ETRUNCATED) return dsrt__fail_prefix(rc, "shards");
    if (total != UINT64_MAX) {
        if (r->size == UINT64_MAX) r->size = total;
        if (total != r->size)
            return dsrt__fail(DSRT_ECORRUPT,
                              "shards: %s: the store says %llu bytes where its listing said %llu: "
                              "changed since it was listed",
                              r->url, (unsigned long long)total, (unsigned long long)r->size);
        r->told = 1;
    }
    if (rc == DSRT_ETRUNCATED || *got < len)
        return dsrt__fail(DSRT_ETRUNCATED,
                          "shards: %s: ends at byte %llu, before the %llu bytes listed", r->url,
                          (unsigned long long)(off + *got), (unsigned long long)r->size);
    return 0;
}

static int64_t remote_read(void *ctx, uint64_t off, void *buf, size_t len) {
    remote_scan *r = ctx;
    if (off >= r->size) return 0;
    len = (size_t)DSRT_MIN((uint64_t)len, r->size - off);
    size_t got;
    int rc;
    if (off >= r->win_off && off - r->win_off <= r->win_len &&
        len <= r->win_len - (off - r->win_off)) {
        memcpy(buf, r->win + (off - r->win_off), len);
        return (int64_t)len;
    }
    if (len > SCAN_WINDOW_REMOTE) {
        rc = remote_get(r, off, buf, len, &got);
        return rc ? rc : (int64_t)got;
    }
    size_t n = (size_t)DSRT_MIN((uint64_t)SCAN_WINDOW_REMOTE, r->size - off);
    r->win_len = 0;
    if ((rc = remote_get(r, off, r->win, n, &got)) != 0) return rc;
    r->win_off = off;
    r->win_len = got;
    memcpy(buf, r->win, len);
    return (int64_t)len;
}

/* Scans the shard at url, of size bytes (UINT64_MAX: not known) through s;
 * *size gets its size. */
static int scan_remote(scanner *s, dsrt_http *http, const char *url, uint64_t *size) {
    remote_scan r = {.http = http, .url = url, .size = *size};
    int rc = -ENOMEM;
    if (!(r.win = dsrt__malloc(SCAN_WINDOW_REMOTE))) return rc;
    if (r.size == UINT64_MAX) {
        /* No listing (https://): the first answer says how large it is. */
        size_t got;
        uint64_t total;
        rc = dsrt__http_fetch_range(http, url, 0, SCAN_WINDOW_REMOTE, r.win, &got, &total);
        if (rc != 0 && rc != DSRT_ETRUNCATED) {
            dsrt__fail_prefix(rc, "shards");
            goto out;
        }
        if (total == UINT64_MAX || got != DSRT_MIN(total, (uint64_t)SCAN_WINDOW_REMOTE)) {
            rc = dsrt__fail(DSRT_EREMOTE,
                            "shards: %s: the server does not say the object's size (no "
                            "Content-Range or Content-Length): it cannot be scanned",
                            url);
            goto out;
        }
        r.size = total;
        r.told = 1;
        r.win_len = got;
    }
    s->read = remote_read;
    s->read_ctx = &r;
    if ((rc = scan_walk(s, url, r.size)) != 0) goto out;
    if (!r.told) {
        /* No answer said the size (a server that ignores ranges and sends
         * no length): a byte past the listed end means more than listed. */
        uint8_t b;
        size_t got;
        uint64_t total;
        rc = dsrt__http_fetch_range(http, url, r.size, 1, &b, &got, &total);
        if (rc == 0 && got > 0) {
            rc = dsrt__fail(DSRT_ECORRUPT,
                            "shards: %s: larger than the %llu bytes its listing says: changed "
                            "since it was listed, or a server that does not end its answer",
                            url, (unsigned long long)r.size);
            goto out;
        }
        if (rc != 0 && rc != DSRT_ETRUNCATED && rc != DSRT_EEMPTY) {
            dsrt__fail_prefix(rc, "shards");
            goto out;
        }
        dsrt__clear_error();
    }
    *size = r.size;
    rc = 0;
out:
    free(r.win);
    return rc;
}

/* A whole object into a new buffer; -ENOENT when there is none. */
static int fetch(gather *g, const char *url, size_t max, uint8_t **out, size_t *len) {
    return dsrt__http_fetch(g->http, url, NULL, max, out, len);
}

/* Adds dir/NAME for the listed names that match the glob pattern (every
 * .tar object when pattern is NULL) to the shards, sorted by name. */
static int add_listed(gather *g, const char *dir, const dsrt_strlist *names, const char *pattern) {
    dsrt_strlist pick = {0};
    char url[8192];
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < names->n; k++)
        if (pattern ? fnmatch(pattern, names->v[k], 0) == 0 : ends_with(names->v[k], ".tar"))
            rc = dsrt__strlist_add(&pick, names->v[k], strlen(names->v[k]));
    if (rc == 0) dsrt__sort(pick.v, pick.n, sizeof *pick.v, strcmp_p);
    for (size_t k = 0; rc == 0 && k < pick.n; k++) {
        snprintf(url, sizeof url, "%s/%s", dir, pick.v[k]);
        rc = dsrt__strlist_add(&g->shards, url, strlen(url));
    }
    dsrt__strlist_free(&pick);
    return rc;
}

/* The index and the class names beside the shards of folder dir (a
 * listing l when in S3), when they are there: 0, or the store's failure. */
static int fetch_beside(gather *g, dsrt_index *ix, const char *dir, int s3, const listing *l,
                        char *index_path, size_t index_cap) {
    char url[8192];
    int rc;
    uint8_t *data = NULL;
    size_t len = 0;
    snprintf(url, sizeof url, "%s/" DSRT_SHARD_INDEX_NAME, dir);
    uint64_t index_listed = s3 ? listed_size(l, DSRT_SHARD_INDEX_NAME) : UINT64_MAX;
    if (!s3 || index_listed != UINT64_MAX) {
        /* No larger than the listing says (an answer that never ends is not
         * read into memory). */
        size_t cap = (size_t)DSRT_MIN(index_listed, (uint64_t)16 << 30);
        rc = fetch(g, url, cap ? cap : 1, &data, &len);
        if (rc == 0) rc = dsrt__shard_index_parse(data, len, url, &g->x, &ix->arena);
        free(data);
        if (rc == 0) {
            size_t ul = DSRT_MIN(strlen(url), index_cap - 1); /* a path a message names */
            memcpy(index_path, url, ul);
            index_path[ul] = '\0';
        } else if (rc == -ENOMEM || (rc != -ENOENT && rc != DSRT_ECORRUPT && rc != DSRT_ECHECKSUM &&
                                     rc != DSRT_ETRUNCATED)) {
            return rc; /* the store failed: say so rather than scan every shard */
        } else if (rc != -ENOENT) {
            dsrt__index_warn(ix, "%s; the shards are scanned instead", dsrt_last_error());
        }
        dsrt__clear_error();
    }
    snprintf(url, sizeof url, "%s/" DSRT_SHARD_CLASSES_NAME, dir);
    if (!index_path[0] && (!s3 || listed_size(l, DSRT_SHARD_CLASSES_NAME) != UINT64_MAX)) {
        rc = fetch(g, url, (size_t)64 << 20, &data, &len);
        if (rc == 0)
            rc = dsrt__classes_json_parse((const char *)data, len, url, &g->tmp, &g->json_classes,
                                          &g->njson);
        free(data);
        if (rc == -ENOMEM) return rc;
        if (rc != 0 && rc != -ENOENT)
            dsrt__index_warn(ix, "%s; class names not taken from it", dsrt_last_error());
        dsrt__clear_error();
    }
    return 0;
}

/* The shards at the URL path, their sizes, and the index and classes.json
 * beside them. */
static int gather_remote(gather *g, dsrt_index *ix, const char *path, char *index_path,
                         size_t index_cap) {
    int rc;
    listing l = {0};
    dsrt_strlist pats = {0};
    char dir[4096], url[8192];
    const char *q = strchr(path, '?');
    if (q) return dsrt__fail(DSRT_EOPTION, "shards: %s: a shard set's URL takes no query", path);
    /* The folder, and in its last component a pattern or a name. */
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/') n--;
    const char *last = path + n;
    while (last > path && last[-1] != '/') last--;
    int selection = ends_with(path, ".tar") || strpbrk(last, "*?[{") != NULL;
    size_t dlen = selection ? (size_t)(last - path - 1) : n;
    snprintf(dir, sizeof dir, "%.*s", (int)dlen, path);
    int s3 = strncasecmp(path, "s3://", 5) == 0;
    if ((rc = dsrt__http_create_opening(&g->http, g->o, 1)) != 0) return rc;
    ix->remote = 1;
    if (s3) {
        const char *bucket, *key;
        size_t blen;
        if ((rc = dsrt__s3_split(dir, &bucket, &blen, &key)) != 0) return rc;
        dsrt_strbuf prefix = {0};
        rc = -ENOMEM;
        if (*key && (dsrt__sb_add(&prefix, key, strlen(key)) || dsrt__sb_add(&prefix, "/", 1)))
            goto out;
        l.prefix_len = prefix.len;
        rc = dsrt__s3_list(g->http, bucket, blen, prefix.s, prefix.len, dir, list_one, &l);
        free(prefix.s);
        if (rc != 0) goto out;
    }
    if (selection) {
        if ((rc = expand_list(last, path, &pats)) != 0) goto out;
        for (size_t i = 0; i < pats.n; i++) {
            size_t before = g->shards.n;
            if (!has_glob(pats.v[i])) {
                if (s3 && listed_size(&l, pats.v[i]) == UINT64_MAX) {
                    rc = dsrt__fail(-ENOENT, "shards: %s/%s: no such object", dir, pats.v[i]);
                    goto out;
                }
                snprintf(url, sizeof url, "%s/%s", dir, pats.v[i]);
                if ((rc = dsrt__strlist_add(&g->shards, url, strlen(url))) != 0) goto out;
                continue;
            }
            if (!s3) {
                rc = dsrt__fail(DSRT_EOPTION,
                                "shards: %s: an https:// shard set has no listing to match a "
                                "glob against: name the shards (a brace list)",
                                path);
                goto out;
            }
            if ((rc = add_listed(g, dir, &l.names, pats.v[i])) != 0) goto out;
            if (g->shards.n == before) {
                rc = dsrt__fail(-ENOENT, "shards: %s/%s: no object matches", dir, pats.v[i]);
                goto out;
            }
        }
    } else {
        if (!s3) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "shards: %s: an https:// folder cannot be listed: name its shards "
                            "(a brace list such as .../shard-{000000..000009}.tar)",
                            path);
            goto out;
        }
        if ((rc = add_listed(g, dir, &l.names, NULL)) != 0) goto out;
    }

    /* The index and the class names, when they are there. */
    if ((rc = fetch_beside(g, ix, dir, s3, &l, index_path, index_cap)) != 0) goto out;
    if (g->shards.n == 0) {
        rc = dsrt__fail(DSRT_EEMPTY, "shards: %s: no .tar object under this prefix", path);
        goto out;
    }
    rc = -ENOMEM;
    g->listed = dsrt__calloc(g->shards.n, sizeof *g->listed);
    g->listed_version = dsrt__calloc(g->shards.n, sizeof *g->listed_version);
    if (!g->listed || !g->listed_version) goto out;
    for (size_t k = 0; k < g->shards.n; k++)
        g->listed[k] = s3 ? listed(&l, base_of(g->shards.v[k]), &g->listed_version[k]) : UINT64_MAX;
    rc = 0;
out:
    dsrt__strlist_free(&pats);
    dsrt__strlist_free(&l.names);
    free(l.sizes);
    free(l.versions);
    return rc;
}

/* Which shards, and the index and class names beside them. */
static int gather_shards(gather *g, dsrt_index *ix, const char *path, char *index_path,
                         size_t index_cap) {
    struct stat st;
    int rc;
    char dir[4096];
    index_path[0] = '\0';
    if (dsrt__is_url(path)) return gather_remote(g, ix, path, index_path, index_cap);
    int folder = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (folder) {
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        snprintf(dir, sizeof dir, "%.*s", (int)n, path);
    } else {
        if ((rc = expand_selection(path, &g->shards)) != 0) return rc;
        if (g->shards.n == 0) return dsrt__fail(DSRT_EEMPTY, "shards: %s: names no shard", path);
        dsrt__dir_of(g->shards.v[0], dir, sizeof dir);
        /* An index serves only shards of its own folder. */
        for (size_t k = 1; k < g->shards.n; k++) {
            char d[4096];
            dsrt__dir_of(g->shards.v[k], d, sizeof d);
            if (strcmp(d, dir) != 0) {
                dir[0] = '\0';
                break;
            }
        }
    }

    index_path[0] = '\0';
    if (dir[0]) {
        char p[4096 + 32];
        snprintf(p, sizeof p, "%s/" DSRT_SHARD_INDEX_NAME, dir);
        if (stat(p, &st) == 0) {
            rc = dsrt__shard_index_read(p, &g->x, &ix->arena);
            if (rc == -ENOMEM) return rc;
            if (rc != 0) {
                dsrt__index_warn(ix, "%s: %s; the shards are scanned instead", p,
                                 dsrt_last_error());
                dsrt__clear_error();
            } else {
                size_t pl = strlen(p);
                memcpy(index_path, p, DSRT_MIN(pl + 1, index_cap));
                index_path[index_cap - 1] = '\0';
            }
        }
        snprintf(p, sizeof p, "%s/" DSRT_SHARD_CLASSES_NAME, dir);
        if (!index_path[0] && stat(p, &st) == 0) {
            uint8_t *text;
            size_t len;
            rc = dsrt__read_whole_file(p, (size_t)64 << 20, &text, &len);
            if (rc == 0)
                rc = dsrt__classes_json_parse((const char *)text, len, p, &g->tmp, &g->json_classes,
                                              &g->njson);
            if (rc == 0) free(text);
            if (rc == -ENOMEM) return rc;
            if (rc != 0) {
                dsrt__index_warn(ix, "%s: %s; class names not taken from it", p, dsrt_last_error());
                dsrt__clear_error();
            }
        }
    }
    if (folder) {
        if (index_path[0]) {
            /* The index's shards; other tar files in the folder are said. */
            for (size_t k = 0; k < g->x.nshards; k++) {
                char p[8192];
                snprintf(p, sizeof p, "%s/%s", dir, g->x.shard_names[k]);
                if ((rc = dsrt__strlist_add(&g->shards, p, strlen(p))) != 0) return rc;
            }
            dsrt_strlist all = {0};
            if (list_folder(dir, &all) == 0 && all.n > g->x.nshards)
                dsrt__index_warn(ix, "%s: %zu tar file%s not in the index, left out", dir,
                                 all.n - g->x.nshards, all.n - g->x.nshards == 1 ? "" : "s");
            dsrt__clear_error();
            dsrt__strlist_free(&all);
        } else if ((rc = list_folder(dir, &g->shards)) != 0) {
            return rc;
        }
        if (g->shards.n == 0)
            return dsrt__fail(DSRT_EEMPTY, "shards: %s: no .tar file in the folder", path);
    }
    return 0;
}

/* Sizes, index matches and scans of every shard. */
static int gather_samples(gather *g, dsrt_index *ix, const dsrt_datastore_options *o) {
    size_t ns = g->shards.n;
    int rc = -ENOMEM;
    g->sizes = dsrt__calloc(ns, sizeof *g->sizes);
    g->from_index = dsrt__calloc(ns, sizeof *g->from_index);
    g->scanned = dsrt__calloc(ns, sizeof *g->scanned);
    g->nscanned = dsrt__calloc(ns, sizeof *g->nscanned);
    size_t *by_name = dsrt__calloc(g->x.nshards ? g->x.nshards : 1, sizeof *by_name);
    g->x_first = dsrt__calloc(g->x.nshards ? g->x.nshards : 1, sizeof *g->x_first);
    scanner s = {.ix = ix, .arena = &g->tmp};
    if ((rc = dsrt__extensions_parse(&s.ext, o->extensions)) != 0) goto out;
    rc = -ENOMEM;
    s.win = dsrt__malloc(SCAN_WINDOW);
    if (!g->sizes || !g->from_index || !g->scanned || !g->nscanned || !by_name || !g->x_first ||
        !s.win)
        goto out;
    for (size_t k = 0, first = 0; k < g->x.nshards; k++) {
        by_name[k] = k;
        g->x_first[k] = first;
        first += g->x.shard_count[k];
    }
    qsort_r(by_name, g->x.nshards, sizeof *by_name, by_shard_name, &g->x);

    for (size_t k = 0; k < ns; k++) {
        const char *p = g->shards.v[k];
        int xi = g->x.nshards ? index_find(g, by_name, base_of(p)) : -1;
        struct stat st;
        if (g->http) {
            /* The listing's size; without one (https://), the index's. */
            g->sizes[k] = g->listed[k] != UINT64_MAX ? g->listed[k]
                          : xi >= 0                  ? g->x.shard_size[xi]
                                                     : UINT64_MAX;
        } else if (stat(p, &st) != 0) {
            rc = dsrt__fail(-errno, "shards: %s: %s", p, strerror(errno));
            goto out;
        } else if (!S_ISREG(st.st_mode)) {
            rc = dsrt__fail(DSRT_EFORMAT, "shards: %s: is %s, not a tar file", p,
                            dsrt__file_kind(st.st_mode));
            goto out;
        } else {
            g->sizes[k] = (uint64_t)st.st_size;
        }
        if (xi >= 0 && g->sizes[k] < g->x.shard_size[xi]) {
            /* Cut short since the index was written: its samples past the end
             * fail when read, each named. */
            dsrt__index_warn(ix,
                             "%s: %llu bytes where the index says %llu: truncated; samples "
                             "past its end will be skipped",
                             p, (unsigned long long)g->sizes[k],
                             (unsigned long long)g->x.shard_size[xi]);
        } else if (xi >= 0 && g->sizes[k] != g->x.shard_size[xi]) {
            dsrt__index_warn(ix,
                             "%s: %llu bytes where the index says %llu: changed since, "
                             "scanned again",
                             p, (unsigned long long)g->sizes[k],
                             (unsigned long long)g->x.shard_size[xi]);
            xi = -1;
        }
        g->from_index[k] = xi;
        if (xi >= 0) continue;
        if (g->http) {
            if ((rc = scan_remote(&s, g->http, p, &g->sizes[k])) != 0) goto out;
        } else if ((rc = scan_shard(&s, p, g->sizes[k])) != 0) {
            goto out;
        }
        g->scanned[k] = s.samples;
        g->nscanned[k] = s.n;
        s.samples = NULL;
        s.n = s.cap = 0;
    }
    rc = 0;
out:
    free(by_name);
    free(s.win);
    free(s.samples);
    free(s.key);
    return rc;
}

/* What labelling the scanned samples works with. */
typedef struct {
    gather *g;
    dsrt_index *ix;
    const dsrt_datastore_options *o;
    const char **known; /* the class names known, or made from the samples */
    size_t nknown;
    const char **list; /* names made from the samples (sorted), or NULL */
    int by_folder;     /* no .cls at all: labels from the members' folders */
    int text;          /* some .cls is a name, not an index */
    size_t root;       /* by_folder: bytes of the folders every key starts with */
    size_t unlabelled, unknown;
    int32_t max_index;
} labelling;

/* The bytes of the folders every key starts with, which are no class. */
static size_t common_root(const gather *g) {
    const found *f0 = NULL;
    for (size_t k = 0; k < g->shards.n && !f0; k++)
        if (g->nscanned[k]) f0 = &g->scanned[k][0];
    size_t root = f0->key_len;
    for (size_t k = 0; k < g->shards.n; k++)
        for (size_t j = 0; j < g->nscanned[k]; j++) {
            const found *f = &g->scanned[k][j];
            size_t m = 0;
            while (m < root && m < f->key_len && f->member[m] == f0->member[m]) m++;
            root = m;
        }
    while (root > 0 && f0->member[root - 1] != '/') root--;
    return root;
}

/* The class names the samples give (their folders, or their .cls texts),
 * distinct and sorted, as the known names. */
static int names_from_samples(labelling *L, size_t total) {
    gather *g = L->g;
    L->list = dsrt__calloc(total ? total : 1, sizeof *L->list);
    if (!L->list) return -ENOMEM;
    if (L->by_folder) L->root = common_root(g);
    size_t nlist = 0;
    for (size_t k = 0; k < g->shards.n; k++)
        for (size_t j = 0; j < g->nscanned[k]; j++) {
            const found *f = &g->scanned[k][j];
            if (L->by_folder) {
                const char *nm;
                size_t nl;
                folder_label(f, L->root, L->o->label_source == DSRT_LABEL_PARENT_FOLDER, &nm, &nl);
                if (!(L->list[nlist++] = dsrt__arena_strndup(&g->tmp, nm, nl))) return -ENOMEM;
            } else if (f->cls && f->cls[0]) {
                L->list[nlist++] = f->cls;
            }
        }
    dsrt__sort(L->list, nlist, sizeof *L->list, strcmp_p);
    size_t u = 0;
    for (size_t i = 0; i < nlist; i++)
        if (u == 0 || strcmp(L->list[u - 1], L->list[i]) != 0) L->list[u++] = L->list[i];
    L->known = L->list;
    L->nknown = u;
    return 0;
}

/* The place of the name key[0..klen) among the known names, or -1. */
static int32_t known_index(const labelling *L, const char *key, size_t klen) {
    if (L->known == L->list) {
        size_t lo = 0, hi = L->nknown;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = strncmp(L->known[mid], key, klen);
            if (c == 0 && L->known[mid][klen] != '\0') c = 1;
            if (c == 0) return (int32_t)mid;
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return -1;
    }
    for (size_t c = 0; c < L->nknown; c++)
        if (strlen(L->known[c]) == klen && memcmp(L->known[c], key, klen) == 0) return (int32_t)c;
    return -1;
}

/* The label of sample f of shard k, -1 when it gets none (said in the
 * warnings, the first few); a negative code for a set that cannot be. */
static int label_one(labelling *L, size_t k, const found *f, int32_t *label) {
    const char *shard = L->g->shards.v[k], *key = NULL;
    size_t klen = 0;
    int32_t v = -1;
    if (L->o->label_source == DSRT_LABEL_NONE) {
        v = 0;
    } else if (L->by_folder) {
        folder_label(f, L->root, L->o->label_source == DSRT_LABEL_PARENT_FOLDER, &key, &klen);
    } else if (!f->cls || !f->cls[0]) {
        if (++L->unlabelled <= 3)
            dsrt__index_warn(L->ix, "%s: %s: no .cls label, left out", shard, f->member);
    } else if (!L->text && as_index(f->cls, &v)) {
        if (L->nknown && (size_t)v >= L->nknown) {
            if (++L->unknown <= 3)
                dsrt__index_warn(L->ix, "%s: %s: label %d, but there are %zu classes; left out",
                                 shard, f->member, (int)v, L->nknown);
            v = -1;
        } else if (!L->nknown && v >= LABELS_MAX) {
            return dsrt__fail(DSRT_ETOOBIG,
                              "shards: %s: %s: label %d: without class names (an index or "
                              "classes.json beside the shards) a label is a class index below %d",
                              shard, f->member, (int)v, (int)LABELS_MAX);
        }
    } else {
        key = f->cls;
        klen = strlen(f->cls);
    }
    if (key) {
        v = known_index(L, key, klen);
        if (v < 0 && ++L->unknown <= 3)
            dsrt__index_warn(L->ix, "%s: %s: class '%.*s' is not one of the %zu classes; left out",
                             shard, f->member, (int)klen, key, L->nknown);
    }
    *label = v;
    if (v > L->max_index) L->max_index = v;
    return 0;
}

/* The class names: none's one, the known ones, or the numbers of integer
 * labels. */
static int class_names(labelling *L, const char ***names, size_t *nnames) {
    size_t nc = L->o->label_source == DSRT_LABEL_NONE ? 1
                : L->nknown                           ? L->nknown
                                                      : (size_t)(L->max_index + 1);
    *names = dsrt__calloc(nc ? nc : 1, sizeof **names);
    if (!*names) return -ENOMEM;
    *nnames = nc;
    if (L->o->label_source == DSRT_LABEL_NONE) {
        (*names)[0] = "";
    } else if (L->nknown) {
        memcpy(*names, L->known, L->nknown * sizeof *L->known);
    } else {
        for (size_t c = 0; c < nc; c++) {
            char num[24];
            snprintf(num, sizeof num, "%zu", c);
            if (!((*names)[c] = dsrt__arena_strndup(&L->g->tmp, num, strlen(num)))) return -ENOMEM;
        }
    }
    return 0;
}

/* Class names and the label of every scanned sample (labels[k][j]); samples
 * that get no label are marked -1 and left out with a warning. */
static int resolve_labels(gather *g, dsrt_index *ix, const dsrt_datastore_options *o,
                          int32_t **labels, const char ***names, size_t *nnames) {
    size_t ns = g->shards.n;
    size_t total = 0, with_cls = 0, numeric = 0;
    for (size_t k = 0; k < ns; k++)
        for (size_t j = 0; j < g->nscanned[k]; j++) {
            const found *f = &g->scanned[k][j];
            int32_t v;
            total++;
            if (f->cls && f->cls[0]) {
                with_cls++;
                numeric += as_index(f->cls, &v);
            }
        }
    /* The names known before looking at the samples. */
    labelling L = {.g = g, .ix = ix, .o = o, .max_index = -1};
    L.known = g->x.n || g->x.nshards ? g->x.classes : g->json_classes;
    L.nknown = g->x.nshards ? g->x.nclasses : g->njson;
    L.by_folder =
        with_cls == 0 && total > 0 && g->x.nshards == 0 && o->label_source != DSRT_LABEL_NONE;
    L.text = with_cls > 0 && numeric < with_cls; /* some .cls is a name */
    int rc = 0;
    /* Distinct names from the samples (text labels or folders), sorted. */
    if (o->label_source != DSRT_LABEL_NONE && (L.by_folder || (L.text && L.nknown == 0)))
        rc = names_from_samples(&L, total);
    for (size_t k = 0; rc == 0 && k < ns; k++) {
        labels[k] = dsrt__calloc(g->nscanned[k] ? g->nscanned[k] : 1, sizeof *labels[k]);
        if (!labels[k]) rc = -ENOMEM;
        for (size_t j = 0; rc == 0 && j < g->nscanned[k]; j++)
            rc = label_one(&L, k, &g->scanned[k][j], &labels[k][j]);
    }
    if (rc == 0 && L.unlabelled > 3)
        dsrt__index_warn(ix, "... %zu samples without a .cls label left out in all", L.unlabelled);
    if (rc == 0 && L.unknown > 3)
        dsrt__index_warn(ix, "... %zu samples with an unknown class left out", L.unknown);
    if (rc == 0) rc = class_names(&L, names, nnames);
    free(L.list);
    return rc;
}

/* Fills ix and its shard set from what was gathered. */
static int build_index(gather *g, dsrt_index *ix, int32_t **labels, const char **names,
                       size_t nnames) {
    size_t ns = g->shards.n, n = 0;
    for (size_t k = 0; k < ns; k++) {
        if (g->from_index[k] >= 0) {
            n += g->x.shard_count[g->from_index[k]];
        } else {
            for (size_t j = 0; j < g->nscanned[k]; j++) n += labels[k][j] >= 0;
        }
    }
    if (n > UINT32_MAX) return dsrt__fail(DSRT_ETOOBIG, "shards: %zu samples, more than 2^32-1", n);
    dsrt_shardset *s = dsrt__shardset_new(ix, ns, n);
    ix->paths = dsrt__malloc((n ? n : 1) * sizeof *ix->paths);
    ix->labels = dsrt__malloc((n ? n : 1) * sizeof *ix->labels);
    if (!s || !ix->paths || !ix->labels) return -ENOMEM;
    int rc = dsrt__index_set_classes(ix, names, nnames);
    if (rc != 0) return rc;

    size_t i = 0;
    for (size_t k = 0; k < ns; k++) {
        dsrt_shard *sh = &s->shards[k];
        sh->path = dsrt__arena_strndup(&ix->arena, g->shards.v[k], strlen(g->shards.v[k]));
        if (!sh->path) return -ENOMEM;
        sh->size = g->sizes[k];
        sh->version = g->listed_version ? g->listed_version[k] : 0;
        sh->first = (uint32_t)i;
        size_t plen = strlen(sh->path);
        int xi = g->from_index[k];
        size_t cnt = xi >= 0 ? g->x.shard_count[xi] : g->nscanned[k];
        for (size_t j = 0; j < cnt; j++) {
            const char *member;
            if (xi >= 0) {
                size_t at = g->x_first[xi] + j;
                member = g->x.member[at];
                s->offset[i] = g->x.offset[at];
                s->size[i] = g->x.size[at];
                ix->labels[i] = g->x.label[at];
            } else {
                if (labels[k][j] < 0) continue;
                const found *f = &g->scanned[k][j];
                member = f->member;
                s->offset[i] = f->offset;
                s->size[i] = f->size;
                ix->labels[i] = labels[k][j];
            }
            size_t mlen = strlen(member);
            char *p = dsrt__arena_alloc(&ix->arena, plen + mlen + 2, 1);
            if (!p) return -ENOMEM;
            memcpy(p, sh->path, plen);
            p[plen] = ':';
            memcpy(p + plen + 1, member, mlen + 1);
            ix->paths[i] = p;
            s->member[i] = (uint32_t)(plen + 1);
            s->shard_of[i] = (uint32_t)k;
            i++;
        }
        sh->count = (uint32_t)(i - sh->first);
    }
    ix->n = i;
    return 0;
}

int dsrt__shards_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    gather g;
    memset(&g, 0, sizeof g);
    g.o = o;
    int32_t **labels = NULL;
    const char **names = NULL;
    size_t nnames = 0;
    char index_path[4096]; /* the index file used, "" when none */
    int rc = gather_shards(&g, ix, path, index_path, sizeof index_path);
    if (rc == 0) rc = gather_samples(&g, ix, o);
    if (rc == 0) {
        labels = dsrt__calloc(g.shards.n, sizeof *labels);
        rc = labels ? resolve_labels(&g, ix, o, labels, &names, &nnames) : -ENOMEM;
    }
    if (rc == 0) rc = build_index(&g, ix, labels, names, nnames);
    if (rc == 0) {
        dsrt_shardset *s = ix->data;
        s->indexed = 1;
        for (size_t k = 0; k < g.shards.n; k++) s->indexed &= g.from_index[k] >= 0;
        s->remote = ix->remote;
        dsrt__shardset_settle(s, o, g.shards.v[0]);
    }
    if (labels)
        for (size_t k = 0; k < g.shards.n; k++) free(labels[k]);
    free(labels);
    free(names);
    gather_free(&g);
    return rc;
}

// ----------------------------------------------------------------------------
// The source

static int detect(const dsrt_probe *p) {
    /* A name that names nothing: only a pattern of shards is named so. */
    if (!p->exists) return strpbrk(p->path, "*?[{") != NULL;
    return dsrt__is_shardset(p->path, p->folder);
}

/* A shard set at a URL: a shard, or a glob or brace list of them, by its
 * name; or an s3:// prefix holding shards (one listing page looked at). */
static int detect_url(const char *url, const dsrt_datastore_options *o) {
    char name[1024];
    const char *q = strchr(url, '?');
    snprintf(name, sizeof name, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
    const char *last = strrchr(name, '/');
    if (dsrt__ends_with_ci(name, ".tar") || (last && strpbrk(last, "*?[{"))) return 1;
    if (strncasecmp(url, "s3://", 5) == 0) return dsrt__s3_is_shardset(url, o);
    return 0;
}

const dsrt_source_ops dsrt__source_shards = {
    .kind = DSRT_SOURCE_SHARDS,
    .what = "tar shards",
    .detect = detect,
    .detect_url = detect_url,
    .open = dsrt__shards_load,
    .open_url = dsrt__shards_load,
    .partition = dsrt__shards_partition,
    .reader = dsrt__members_reader,
    .feed = dsrt__members_feed,
    .read = dsrt__members_read,
    .order = dsrt__members_order,
    .shuffle_buffer = dsrt__members_shuffle_buffer,
    .shard_count = dsrt__members_shard_count,
    .shard_path = dsrt__members_shard_path,
    .location = dsrt__members_location,
    .folders = dsrt__members_folders,
};
