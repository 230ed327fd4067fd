/*
 * The shard writer (dsrt_shards_write): the samples of any datastore, in its
 * order, into tar shards of at most shard_bytes, with dsrt's index and
 * classes.json beside them; the format is the shards source's
 * (datastore/sources/shards), the samples' bytes are read through the table
 * of sources, whatever their source.
 *
 * Each sample is <key>.cls then <key>.jpg|png|webp, ustar headers, the files'
 * bytes unchanged (in-memory pixels as PNG). The whole set (shards,
 * classes.json, index) is written into a hidden staging folder inside the
 * output folder, each file fsync'd, and moved into place only once whole:
 * the old set's index removed first (nothing then describes a mix), the
 * shards renamed over the old ones, the old set's other shards removed,
 * classes.json, the index last. Until then the set the folder held is
 * untouched, so a failed or killed write never costs the last good set; a
 * failed write removes what it staged, the next write what a killed one
 * left. The writer removes or replaces only what it made: its record in the
 * folder (RECORD_NAME), written before anything else, lists each file it
 * made there with its size, and each staging folder. A folder holding
 * anything the record does not list as it is now is refused, named, and
 * left alone, as is one that is, holds or lies inside a folder the samples
 * come from; both checks come before any change. Entries are looked at and
 * removed relative to the folder's descriptor, never through a link: an
 * entry of the writer's names that is not what it makes there (a link, a
 * folder of the user's, a file of other bytes) is refused, named, and left
 * alone too. A write holds a lock on the folder (flock) from before it looks
 * until it is done, so that two writers never take each other's staging
 * folders for a stopped write's: the second fails at once and changes
 * nothing; a killed writer's lock goes with it.
 */
#include "datastore/bytes/url.h"
#include "datastore/codecs/codecs.h"
#include "datastore/sources/shards/shards.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WRITE_BUFFER   ((size_t)4 << 20) /* bytes gathered before a write */
#define SHARD_NAME_FMT "shard-%06zu.tar"
#define STAGE_PREFIX   ".dsrt-staging-"       /* the hidden folder a set is written in */
#define RECORD_NAME    ".dsrt-shards-written" /* what the writer made in a folder */
#define RECORD_MAGIC   "dsrt shards written 1"

// ----------------------------------------------------------------------------
// Small helpers

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* What an entry is, as lstat says, for messages. */
static const char *entry_kind(mode_t mode) {
    return S_ISLNK(mode) ? "a symbolic link" : S_ISREG(mode) ? "a file" : dsrt__file_kind(mode);
}

/* Opens the folder name inside the folder dfd, never through a link; NULL
 * with errno. */
static DIR *open_dir_at(int dfd, const char *name) {
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return NULL;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return d;
}

// ----------------------------------------------------------------------------
// Writing

dsrt_shard_write_options dsrt_shard_write_defaults(void) {
    dsrt_shard_write_options o = {
        .shard_bytes = (uint64_t)256 << 20, .shard_samples = 0, .class_names = NULL};
    return o;
}

/* mkdir -p; *made is 1 when the last folder was made here. */
static int make_dirs(const char *path, int *made) {
    char *p = dsrt__strdup(path);
    if (!p) return -ENOMEM;
    int rc = 0;
    *made = 0;
    for (size_t n = strlen(p); n > 1 && p[n - 1] == '/';) p[--n] = '\0';
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        int ok = mkdir(p, 0755) == 0;
        if (!ok && errno != EEXIST) {
            rc = dsrt__fail(-errno, "shards: %s: %s", p, strerror(errno));
            break;
        }
        *s = c;
        if (!c) {
            *made = ok;
            break;
        }
    }
    free(p);
    return rc;
}

/* The real path of path (symbolic links, "." and ".." resolved) into out
 * (cap bytes), when its last components do not exist yet too: those are
 * taken as written, as mkdir -p would make them. */
static int real_path(const char *path, char *out, size_t cap) {
    char *r = realpath(path, NULL);
    if (r) {
        int n = snprintf(out, cap, "%s", r);
        free(r);
        return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
    }
    if (errno != ENOENT || !*path) return -errno;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    const char *last = path + b;
    size_t llen = n - b;
    char parent[4096];
    int pn = b == 0   ? snprintf(parent, sizeof parent, ".")
             : b == 1 ? snprintf(parent, sizeof parent, "/")
                      : snprintf(parent, sizeof parent, "%.*s", (int)(b - 1), path);
    if (pn < 0 || (size_t)pn >= sizeof parent) return -ENAMETOOLONG;
    int rc = real_path(parent, out, cap);
    if (rc != 0) return rc;
    size_t ol = strlen(out);
    if (llen == 1 && last[0] == '.') return 0;
    if (llen == 2 && last[0] == '.' && last[1] == '.') {
        char *slash = strrchr(out, '/');
        if (slash) slash[slash == out] = '\0';
        return 0;
    }
    int m = snprintf(out + ol, cap - ol, "%s%.*s", ol > 0 && out[ol - 1] == '/' ? "" : "/",
                     (int)llen, last);
    return m < 0 || (size_t)m >= cap - ol ? -ENAMETOOLONG : 0;
}

/* 1 when the real path a lies inside the real path b (not equal). */
static int path_inside(const char *a, const char *b) {
    size_t n = strlen(b);
    if (n == 1 && b[0] == '/') return a[1] != '\0';
    return strncmp(a, b, n) == 0 && a[n] == '/';
}

/* Refuses out when it is, holds or lies inside the source folder src
 * (compared as real paths; rout is out's). */
static int apart_from(const char *out, const char *rout, const char *src) {
    char rsrc[4096];
    if (real_path(src, rsrc, sizeof rsrc) != 0) return 0; /* gone: nothing there to harm */
    const char *how = !strcmp(rout, rsrc)       ? "is"
                      : path_inside(rsrc, rout) ? "contains"
                      : path_inside(rout, rsrc) ? "lies inside"
                                                : NULL;
    if (!how) return 0;
    /* Each path as given, and its real path where that differs. */
    char a[8300], b[8300];
    snprintf(a, sizeof a, strcmp(out, rout) ? "%s (really %s)" : "%s", out, rout);
    snprintf(b, sizeof b, strcmp(src, rsrc) ? "%s (really %s)" : "%s", src, rsrc);
    return dsrt__fail(DSRT_EOPTION,
                      "shards: %s %s the source's folder %s: the set would be written over or "
                      "among the data it is made from; give a folder apart from it",
                      a, how, b);
}

typedef struct {
    const char *out, *rout;
} apart;

static int apart_each(void *ctx, const char *dir) {
    const apart *a = ctx;
    return apart_from(a->out, a->rout, dir);
}

/* Refuses an out that is, holds or lies inside a local folder the samples
 * of ds come from: a shard set's folders, a folder source's root (the
 * folder all its files lie under), a manifest's files' folders. */
static int check_apart(const dsrt_datastore *ds, const char *out) {
    char rout[4096];
    int rc = real_path(out, rout, sizeof rout);
    if (rc != 0) return dsrt__fail(rc, "shards: %s: %s", out, strerror(-rc));
    apart a = {out, rout};
    return dsrt__sample_folders(ds, apart_each, &a);
}

/* 1 when name is base followed by a run of digits and then tail. */
static int digits_between(const char *name, const char *base, const char *tail) {
    size_t b = strlen(base);
    if (strncmp(name, base, b) != 0) return 0;
    const char *p = name + b;
    while (isdigit((unsigned char)*p)) p++;
    return p > name + b && strcmp(p, tail) == 0;
}

/* A name this writer makes in its staging folder: shard-NNNNNN.tar, the
 * index and classes.json and their temporary forms (NAME.tmp.TID). */
static int ours(const char *name) {
    static const char *const files[] = {DSRT_SHARD_INDEX_NAME, DSRT_SHARD_CLASSES_NAME};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(files); k++) {
        char base[64];
        snprintf(base, sizeof base, "%s.tmp.", files[k]);
        if (!strcmp(name, files[k]) || digits_between(name, base, "")) return 1;
    }
    return digits_between(name, "shard-", ".tar");
}

// ----------------------------------------------------------------------------
// The record of what the writer made in a folder

/* What a record lists: a file of the size it had when written, or a staging
 * folder. A name may be listed with two sizes while a set replaces another. */
#define RECORD_FOLDER UINT64_MAX

typedef struct {
    dsrt_strlist names;
    uint64_t *sizes; /* (names.n) bytes, or RECORD_FOLDER */
    size_t cap;
    size_t *sorted; /* (names.n) positions by name, then size; NULL until looked up */
} record;

static void record_free(record *r) {
    dsrt__strlist_free(&r->names);
    free(r->sizes);
    free(r->sorted);
    memset(r, 0, sizeof *r);
}

/* Adds an entry (a set of a million shards makes as many: no search here). */
static int record_add(record *r, const char *name, uint64_t size) {
    void *v = r->sizes;
    if (dsrt__grow(&v, &r->cap, r->names.n + 1, sizeof *r->sizes) != 0) return -ENOMEM;
    r->sizes = v;
    r->sizes[r->names.n] = size;
    free(r->sorted);
    r->sorted = NULL;
    return dsrt__strlist_add(&r->names, name, strlen(name));
}

static int record_cmp(const record *r, size_t a, const char *name, uint64_t size) {
    int c = strcmp(r->names.v[a], name);
    return c ? c : r->sizes[a] < size ? -1 : r->sizes[a] > size;
}

static int by_record_entry(const void *a, const void *b, void *ctx) {
    const record *r = ctx;
    size_t y = *(const size_t *)b;
    return record_cmp(r, *(const size_t *)a, r->names.v[y], r->sizes[y]);
}

/* The entries in order of name and size, for lookups and the file. */
static int record_sort(record *r) {
    if (r->sorted || r->names.n == 0) return 0;
    r->sorted = dsrt__malloc(r->names.n * sizeof *r->sorted);
    if (!r->sorted) return -ENOMEM;
    for (size_t k = 0; k < r->names.n; k++) r->sorted[k] = k;
    qsort_r(r->sorted, r->names.n, sizeof *r->sorted, by_record_entry, r);
    return 0;
}

/* The first sorted place whose entry is not below (name, size). */
static size_t record_lower(const record *r, const char *name, uint64_t size) {
    size_t lo = 0, hi = r->names.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (record_cmp(r, r->sorted[mid], name, size) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* 1 when the record lists name with this size (RECORD_FOLDER: as a folder);
 * the record is sorted (record_sort). */
static int record_has(const record *r, const char *name, uint64_t size) {
    size_t k = r->sorted ? record_lower(r, name, size) : r->names.n;
    return k < r->names.n && record_cmp(r, r->sorted[k], name, size) == 0;
}

/* 1 when the sorted record lists name at all. */
static int record_names(const record *r, const char *name) {
    size_t k = r->sorted ? record_lower(r, name, 0) : r->names.n;
    return k < r->names.n && !strcmp(r->names.v[r->sorted[k]], name);
}

/* Parses a record: RECORD_MAGIC, then a line a name ("SIZE NAME", or
 * "- NAME" for a staging folder). */
static int record_parse(const char *text, size_t len, const char *path, record *r) {
    size_t m = strlen(RECORD_MAGIC);
    if (len < m + 1 || memcmp(text, RECORD_MAGIC, m) != 0 || text[m] != '\n')
        return dsrt__fail(DSRT_EOPTION, "shards: %s: not a record dsrt wrote", path);
    int rc = 0;
    for (size_t at = m + 1; rc == 0 && at < len;) {
        const char *line = text + at, *nl = memchr(line, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - line) : len - at;
        const char *sp = memchr(line, ' ', ll);
        uint64_t size = 0;
        int ok = sp && sp > line && (size_t)(sp - line) <= 20 && sp + 1 < line + ll;
        if (ok && sp - line == 1 && line[0] == '-') {
            size = RECORD_FOLDER;
        } else {
            for (const char *c = line; ok && c < sp; c++) {
                ok = isdigit((unsigned char)*c) && size <= (UINT64_MAX - 9) / 10;
                size = size * 10 + (uint64_t)(*c - '0');
            }
        }
        char name[256];
        size_t nl_len = ok ? (size_t)(line + ll - sp - 1) : 0;
        ok = ok && nl_len < sizeof name && !memchr(sp + 1, '/', nl_len) &&
             !memchr(sp + 1, '\0', nl_len);
        if (ok) {
            memcpy(name, sp + 1, nl_len);
            name[nl_len] = '\0';
            ok = strcmp(name, ".") && strcmp(name, "..");
        }
        if (!ok)
            return dsrt__fail(DSRT_EOPTION, "shards: %s: line '%.*s' is not one dsrt writes", path,
                              (int)DSRT_MIN(ll, (size_t)80), line);
        rc = record_add(r, name, size);
        at += ll + 1;
    }
    return rc;
}

/* Writes the record of out (atomically, fsync'd), each entry once. */
static int record_write(const char *out, record *r) {
    dsrt_strbuf b = {0};
    int rc = record_sort(r);
    if (rc == 0) rc = dsrt__sb_printf(&b, "%s\n", RECORD_MAGIC);
    for (size_t i = 0; rc == 0 && i < r->names.n; i++) {
        size_t k = r->sorted[i];
        if (i > 0 && record_cmp(r, r->sorted[i - 1], r->names.v[k], r->sizes[k]) == 0) continue;
        rc = r->sizes[k] == RECORD_FOLDER
                 ? dsrt__sb_printf(&b, "- %s\n", r->names.v[k])
                 : dsrt__sb_printf(&b, "%llu %s\n", (unsigned long long)r->sizes[k], r->names.v[k]);
    }
    char p[8192];
    snprintf(p, sizeof p, "%s/" RECORD_NAME, out);
    if (rc == 0) rc = dsrt__write_file_atomic(p, b.s, b.len);
    free(b.s);
    return rc ? dsrt__fail_prefix(rc, "shards") : 0;
}

// ----------------------------------------------------------------------------
// The output folder

/* What the output folder holds before a write. */
typedef struct {
    int recorded;       /* it has a record */
    record rec;         /* what the record lists */
    dsrt_strlist set;   /* files of the set written there before (listed, there, unchanged) */
    dsrt_strlist stale; /* staging folders and temporary records of writes that stopped */
} out_state;

static void out_state_free(out_state *st) {
    record_free(&st->rec);
    dsrt__strlist_free(&st->set);
    dsrt__strlist_free(&st->stale);
}

/* 1 for the name of the temporary form of the record (dsrt__write_file_atomic's). */
static int record_temporary(const char *name) {
    return digits_between(name, RECORD_NAME ".tmp.", "");
}

/* Checks that the entry name of the folder dfd (path for messages), named
 * like a temporary record, is one a write left: a regular file holding the
 * start of a record, or nothing (a write stopped before it wrote any). A
 * link, a folder, a file of other bytes are not the writer's: refused,
 * named, and left alone. */
static int record_temporary_check(int dfd, const char *name, const char *path) {
    static const char head[] = RECORD_MAGIC "\n";
    struct stat sb, fb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return dsrt__fail(-errno, "shards: %s: %s", path, strerror(errno));
    char got[sizeof head];
    ssize_t n = -1;
    if (S_ISREG(sb.st_mode)) {
        int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd >= 0 && fstat(fd, &fb) == 0 && S_ISREG(fb.st_mode) && fb.st_ino == sb.st_ino &&
            fb.st_dev == sb.st_dev)
            n = pread(fd, got, sizeof head - 1, 0);
        if (fd >= 0) close(fd);
    }
    if (n >= 0 && memcmp(got, head, (size_t)n) == 0) return 0;
    return dsrt__fail(DSRT_EOPTION,
                      "shards: %s: is %s%s, not a record dsrt was writing: left alone; move it "
                      "away",
                      path, entry_kind(sb.st_mode), S_ISREG(sb.st_mode) ? " of other bytes" : "");
}

/* Checks that the staging folder name of the folder dfd (path for
 * messages) holds only what the writer makes there: regular files of its
 * names. Anything else (a link, a folder, a file of another name) is
 * refused, named, and the folder left alone. */
static int stage_check(int dfd, const char *name, const char *path) {
    DIR *d = open_dir_at(dfd, name);
    if (!d) return dsrt__fail(-errno, "shards: %s: %s", path, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *e = de->d_name;
        if (!strcmp(e, ".") || !strcmp(e, "..")) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            rc = dsrt__fail(-errno, "shards: %s/%s: %s", path, e, strerror(errno));
        else if (!ours(e) || !S_ISREG(sb.st_mode))
            rc = dsrt__fail(DSRT_EOPTION,
                            "shards: %s: holds '%s' (%s), which dsrt did not write there: left "
                            "alone; move it away",
                            path, e, entry_kind(sb.st_mode));
    }
    closedir(d);
    return rc;
}

/* Looks at the folder out (open as dfd, locked) without changing anything.
 * It must be empty, or hold only what its record says this writer made
 * there, as it made it: the files of a set, unchanged, and staging folders
 * and temporary records of writes that stopped. Anything else is refused,
 * named, and never touched. */
static int out_inspect(int dfd, const char *out, out_state *st) {
    memset(st, 0, sizeof *st);
    struct stat sb;
    char p[8192];
    int rc = 0;
    snprintf(p, sizeof p, "%s/" RECORD_NAME, out);
    if (fstatat(dfd, RECORD_NAME, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        uint8_t *text;
        size_t len;
        st->recorded = 1;
        if (!S_ISREG(sb.st_mode))
            rc = dsrt__fail(DSRT_EOPTION, "shards: %s: is %s, not a record", p,
                            entry_kind(sb.st_mode));
        else if ((rc = dsrt__read_whole_file(p, (size_t)64 << 20, &text, &len)) != 0)
            dsrt__fail_prefix(rc, "shards");
        if (rc == 0) {
            rc = record_parse((const char *)text, len, p, &st->rec);
            free(text);
        }
        if (rc == 0) rc = record_sort(&st->rec);
        if (rc != 0) {
            out_state_free(st);
            return rc;
        }
    }
    DIR *d = open_dir_at(dfd, ".");
    if (!d) {
        rc = dsrt__fail(-errno, "shards: %s: %s", out, strerror(errno));
        out_state_free(st);
        return rc;
    }
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, RECORD_NAME)) continue;
        snprintf(p, sizeof p, "%s/%s", out, name);
        if (record_temporary(name)) {
            rc = record_temporary_check(dfd, name, p);
            if (rc == 0) rc = dsrt__strlist_add(&st->stale, name, strlen(name));
            continue;
        }
        if (!record_names(&st->rec, name)) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "shards: %s: holds '%s', which dsrt did not write there (%s): give "
                            "an empty or new folder, or move it away",
                            out, name,
                            st->recorded ? "its record " RECORD_NAME " does not list it"
                                         : "the folder has no record " RECORD_NAME);
            break;
        }
        if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = dsrt__fail(-errno, "shards: %s: %s", p, strerror(errno));
        } else if (S_ISDIR(sb.st_mode) && record_has(&st->rec, name, RECORD_FOLDER)) {
            rc = stage_check(dfd, name, p);
            if (rc == 0) rc = dsrt__strlist_add(&st->stale, name, strlen(name));
        } else if (S_ISREG(sb.st_mode) && record_has(&st->rec, name, (uint64_t)sb.st_size)) {
            rc = dsrt__strlist_add(&st->set, name, strlen(name));
        } else if (S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "shards: %s: is %s of %llu bytes, not what dsrt wrote there: changed "
                            "since, so neither removed nor replaced; move it away",
                            p, entry_kind(sb.st_mode), (unsigned long long)sb.st_size);
        } else {
            rc = dsrt__fail(DSRT_EOPTION,
                            "shards: %s: is %s, not what dsrt wrote there: neither followed, "
                            "removed nor replaced; move it away",
                            p, entry_kind(sb.st_mode));
        }
    }
    closedir(d);
    if (rc != 0) out_state_free(st);
    return rc;
}

/* Removes what a stopped write left in the folder dfd (out, for messages):
 * a temporary record, or a staging folder and the files in it that this
 * writer makes. Everything is removed relative to the folder's descriptor
 * and never through a link: unlinkat removes a link itself, never what it
 * points to, and a staging folder is opened with O_NOFOLLOW. Only regular
 * files of the writer's names go; a folder holding anything else stays,
 * named. */
static int remove_staged(int dfd, const char *out, const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", out, name);
    if (record_temporary(name)) {
        if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
            return dsrt__fail(-errno, "shards: %s: %s", p, strerror(errno));
        return 0;
    }
    DIR *d = open_dir_at(dfd, name);
    if (!d) {
        if (errno == ENOENT) return 0;
        if (errno == ELOOP || errno == ENOTDIR)
            return dsrt__fail(DSRT_EOPTION,
                              "shards: %s: is no longer the folder dsrt made there: left alone; "
                              "move it away",
                              p);
        return dsrt__fail(-errno, "shards: %s: %s", p, strerror(errno));
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat sb;
        if (ours(de->d_name) && fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(sb.st_mode))
            unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        int e = errno;
        return dsrt__fail(-e, "shards: %s: %s%s", p, strerror(e),
                          e == ENOTEMPTY || e == EEXIST
                              ? ": holds what dsrt did not write there, left alone; move it away"
                              : "");
    }
    return 0;
}

/* Moves the whole set staged in the folder sname of out (open as dfd) into
 * out: the old index first, so that nothing describes a mix; the shards,
 * replacing the old ones; the old set's other files removed; classes.json;
 * the index last. files lists the new set's files (the index last). */
static int publish(int dfd, const char *out, const char *sname, const out_state *st,
                   record *files) {
    char from[8192], to[8192];
    int rc = record_sort(files);
    if (rc != 0) return rc;
    if (record_names(&st->rec, DSRT_SHARD_INDEX_NAME) &&
        unlinkat(dfd, DSRT_SHARD_INDEX_NAME, 0) != 0 && errno != ENOENT)
        return dsrt__fail(-errno, "shards: %s/" DSRT_SHARD_INDEX_NAME ": %s", out, strerror(errno));
    for (size_t k = 0; k + 2 < files->names.n; k++) {
        snprintf(from, sizeof from, "%s/%s", sname, files->names.v[k]);
        snprintf(to, sizeof to, "%s/%s", out, files->names.v[k]);
        if (renameat(dfd, from, dfd, files->names.v[k]) != 0)
            return dsrt__fail(-errno, "shards: %s: %s", to, strerror(errno));
    }
    for (size_t k = 0; k < st->set.n; k++) {
        if (record_names(files, st->set.v[k])) continue;
        snprintf(to, sizeof to, "%s/%s", out, st->set.v[k]);
        if (unlinkat(dfd, st->set.v[k], 0) != 0 && errno != ENOENT)
            return dsrt__fail(-errno, "shards: %s: %s", to, strerror(errno));
    }
    for (size_t k = files->names.n - 2; k < files->names.n; k++) {
        snprintf(from, sizeof from, "%s/%s", sname, files->names.v[k]);
        snprintf(to, sizeof to, "%s/%s", out, files->names.v[k]);
        if (renameat(dfd, from, dfd, files->names.v[k]) != 0)
            return dsrt__fail(-errno, "shards: %s: %s", to, strerror(errno));
    }
    if (fsync(dfd) != 0) return dsrt__fail(-errno, "shards: %s: fsync: %s", out, strerror(errno));
    return 0;
}

/* A shard being written, in the staging folder, and a buffer in front of it. */
typedef struct {
    int fd;
    char path[4096];
    uint8_t *buf;
    size_t used;
    uint64_t size; /* bytes written so far, the buffer included */
} shard_file;

static int sf_flush(shard_file *f) {
    size_t done = 0;
    while (done < f->used) {
        ssize_t w = write(f->fd, f->buf + done, f->used - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return dsrt__fail(-errno, "shards: %s: %s", f->path, strerror(errno));
        done += (size_t)w;
    }
    f->used = 0;
    return 0;
}

static int sf_put(shard_file *f, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        if (f->used == WRITE_BUFFER) {
            int rc = sf_flush(f);
            if (rc != 0) return rc;
        }
        size_t k = DSRT_MIN(len, WRITE_BUFFER - f->used);
        memcpy(f->buf + f->used, p, k);
        f->used += k;
        f->size += k;
        p += k;
        len -= k;
    }
    return 0;
}

/* A member: header, data, padding to the block size. */
static int sf_member(shard_file *f, const char *name, const void *data, size_t len, int64_t mtime) {
    uint8_t hdr[DSRT_TAR_BLOCK];
    static const uint8_t zeros[DSRT_TAR_BLOCK];
    int rc = dsrt__tar_header_make(hdr, name, len, mtime);
    if (rc == 0) rc = sf_put(f, hdr, sizeof hdr);
    if (rc == 0) rc = sf_put(f, data, len);
    size_t pad = (DSRT_TAR_BLOCK - len % DSRT_TAR_BLOCK) % DSRT_TAR_BLOCK;
    if (rc == 0 && pad) rc = sf_put(f, zeros, pad);
    return rc;
}

static int sf_open(shard_file *f, const char *stage, const char *name) {
    snprintf(f->path, sizeof f->path, "%s/%s", stage, name);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) return dsrt__fail(-errno, "shards: %s: %s", f->path, strerror(errno));
    f->used = 0;
    f->size = 0;
    return 0;
}

/* The end-of-archive marker, and fsync. */
static int sf_close(shard_file *f) {
    static const uint8_t zeros[2 * DSRT_TAR_BLOCK];
    int rc = sf_put(f, zeros, sizeof zeros);
    if (rc == 0) rc = sf_flush(f);
    if (rc == 0 && fsync(f->fd) != 0)
        rc = dsrt__fail(-errno, "shards: %s: fsync: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && rc == 0)
        rc = dsrt__fail(-errno, "shards: %s: close: %s", f->path, strerror(errno));
    f->fd = -1;
    return rc;
}

/* The key of sample i: its position, then the file's name without its
 * extension and with characters WebDataset splits on made '_'. */
static void make_key(char *key, size_t cap, size_t i, int width, const char *path) {
    int n = snprintf(key, cap, "%0*zu", DSRT_MIN(width, 20), i);
    if (!path || n < 0 || (size_t)n >= cap) return;
    const char *b = base_of(path);
    const char *dot = strrchr(b, '.');
    size_t len = dot && dot > b ? (size_t)(dot - b) : strlen(b);
    len = DSRT_MIN(len, (size_t)64);
    size_t at = (size_t)n;
    key[at++] = '_';
    for (size_t k = 0; k < len && at + 1 < cap; k++) {
        unsigned char c = (unsigned char)b[k];
        key[at++] = c == '.' || c == '/' || c < 0x20 || c == 0x7f ? '_' : (char)c;
    }
    key[at] = '\0';
}

/* The extension a sample's image member gets, into ext (8 bytes): its
 * codec's first (jpg, png, webp). */
static void image_ext(const uint8_t *data, size_t len, const char *path, char ext[8]) {
    const dsrt_codec_ops *c = dsrt__codec_sniff(data, len, NULL);
    const char *first = c ? c->extensions : "jpg";
    snprintf(ext, 8, "%.*s", (int)DSRT_MIN(strcspn(first, ","), (size_t)7), first);
    if (c) return;
    /* Not an image (it will be a bad sample when read): keep its own
     * extension if it is a short plain one. */
    const char *dot = path ? strrchr(base_of(path), '.') : NULL;
    if (!dot || !dot[1] || strlen(dot + 1) >= 8) return;
    for (const char *p = dot + 1; *p; p++)
        if (!isalnum((unsigned char)*p)) return;
    size_t k = 0;
    for (const char *p = dot + 1; *p; p++) ext[k++] = (char)tolower((unsigned char)*p);
    ext[k] = '\0';
}

/* Writes classes.json: a JSON array; bytes that are not UTF-8 become U+FFFD. */
static int write_classes_json(const char *out, const char *const *names, size_t n) {
    size_t cap = 16;
    for (size_t c = 0; c < n; c++) cap += 6 * strlen(names[c]) + 8;
    char *t = dsrt__malloc(cap), *w = t;
    if (!t) return -ENOMEM;
    *w++ = '[';
    for (size_t c = 0; c < n; c++) {
        if (c) *w++ = ',', *w++ = ' ';
        *w++ = '"';
        const unsigned char *s = (const unsigned char *)names[c];
        while (*s) {
            unsigned char ch = *s;
            int len = dsrt__utf8_char(s, strnlen((const char *)s, 4));
            if (!len) {
                memcpy(w, "\\ufffd", 6);
                w += 6;
                s++;
                continue;
            }
            if (ch == '"' || ch == '\\') {
                *w++ = '\\';
                *w++ = (char)ch;
            } else if (ch < 0x20) {
                w += sprintf(w, "\\u%04x", ch);
            } else {
                memcpy(w, s, (size_t)len);
                w += len;
            }
            s += len;
        }
        *w++ = '"';
    }
    *w++ = ']';
    *w++ = '\n';
    char p[4096 + 32];
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_CLASSES_NAME, out);
    int rc = dsrt__write_file_atomic(p, t, (size_t)(w - t));
    free(t);
    return rc ? dsrt__fail_prefix(rc, "shards") : 0;
}

static uint8_t *malloc_fn(void *ctx, size_t need) {
    (void)ctx;
    return dsrt__malloc(need);
}

/* The bytes of sample i: the file's (or the object's, the member's), or its
 * pixels as a PNG. */
static int sample_bytes(const dsrt_datastore *ds, size_t i, uint8_t **data, size_t *len,
                        int64_t *mtime, void **owned) {
    *owned = NULL;
    *mtime = 0;
    if (!dsrt_datastore_path(ds, i)) {
        dsrt_image img;
        int rc = dsrt_datastore_pixels(ds, i, &img);
        if (rc == 0) rc = dsrt__png_encode(&img, "shards", owned, len);
        *data = *owned;
        return rc;
    }
    int rc = dsrt__sample_read(ds, i, (size_t)1 << 33, malloc_fn, NULL, data, len, mtime);
    *owned = *data;
    return rc ? dsrt__fail_prefix(rc, "shards") : 0;
}

/* One write of a set: what it made so far, so that a failure undoes it. */
typedef struct {
    const dsrt_datastore *ds;
    dsrt_shard_write_options opt;
    const char *out;
    int dfd;                  /* out, open and locked for this write */
    const char *const *names; /* the class names written */
    out_state st;             /* what out held */
    int width;                /* digits of a key's position */
    dsrt_shard_index x;       /* the index, filled as samples are written */
    dsrt_strlist shard_names, members;
    size_t nshards, cap_shards;
    shard_file f;
    char sname[64];   /* the staging folder's name in out */
    char stage[4096]; /* its path, "" once gone */
    char p[8192];     /* scratch for paths */
    int made;         /* out was made by this write (and goes if it fails) */
    int recorded;     /* its record lists the staging folder */
    int publishing;   /* files are being moved into out */
    record during;    /* the record while writing */
    record files;     /* the new set's files */
} writing;

/* Opens out as w->dfd, making it (and the folders above it) when absent,
 * and locks it for this write (flock, exclusive): a second writer into the
 * same folder would take the first one's staging folder for a stopped
 * write's and remove it, and the first would then remove the second's. So
 * a writer that finds the lock taken fails at once with -EBUSY, having
 * changed nothing. The lock goes with the descriptor: a killed writer's is
 * gone with it, and the next write removes what that one left, as before.
 * A file system that cannot lock a folder (NFS answers EBADF or ENOLCK) is
 * written unlocked. */
static int out_open(writing *w) {
    for (int tries = 0;; tries++) {
        struct stat sb;
        int rc = 0;
        if (stat(w->out, &sb) != 0) {
            if (errno != ENOENT)
                return dsrt__fail(-errno, "shards: %s: %s", w->out, strerror(errno));
            if ((rc = make_dirs(w->out, &w->made)) != 0) return rc;
        } else if (!S_ISDIR(sb.st_mode)) {
            return dsrt__fail(-ENOTDIR, "shards: %s: is %s, not a folder", w->out,
                              dsrt__file_kind(sb.st_mode));
        }
        w->dfd = open(w->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (w->dfd < 0) {
            /* Removed meanwhile, by a write into it that failed: again. */
            if (errno == ENOENT && tries < 8) continue;
            return dsrt__fail(-errno, "shards: %s: %s", w->out, strerror(errno));
        }
        if (flock(w->dfd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                w->made = 0; /* the other writer's now */
                return dsrt__fail(-EBUSY,
                                  "shards: %s: another dsrt writer is at work in this folder (it "
                                  "holds the folder's lock): nothing changed; write again once it "
                                  "is done, or give another folder",
                                  w->out);
            }
            if (e != EBADF && e != ENOLCK && e != EOPNOTSUPP && e != EINVAL)
                return dsrt__fail(-e, "shards: %s: lock: %s", w->out, strerror(e));
        }
        /* Removed between the open and the lock, by a write that failed
         * and so removed the folder it had made: again. */
        if (fstat(w->dfd, &sb) != 0)
            return dsrt__fail(-errno, "shards: %s: %s", w->out, strerror(errno));
        if (sb.st_nlink > 0) return 0;
        close(w->dfd);
        w->dfd = -1;
        if (tries >= 8) return dsrt__fail(-ENOENT, "shards: %s: removed as it was opened", w->out);
    }
}

/* Makes the hidden folder the set is written into, inside out: until the
 * set is moved into place the set out held stays as it was. The record
 * lists that folder before it is made, so that whatever happens, out
 * holds nothing its record does not account for. */
static int stage_open(writing *w) {
    int rc = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (unsigned k = 0;; k++) {
        struct stat sb;
        snprintf(w->sname, sizeof w->sname, STAGE_PREFIX "%ld-%lx-%u", (long)getpid(),
                 (long)ts.tv_nsec, k);
        if (fstatat(w->dfd, w->sname, &sb, AT_SYMLINK_NOFOLLOW) != 0) break;
    }
    for (size_t k = 0; rc == 0 && k < w->st.rec.names.n; k++)
        rc = record_add(&w->during, w->st.rec.names.v[k], w->st.rec.sizes[k]);
    if (rc == 0) rc = record_add(&w->during, w->sname, RECORD_FOLDER);
    if (rc == 0) rc = record_write(w->out, &w->during);
    if (rc != 0) return rc;
    w->recorded = 1;
    for (size_t k = 0; k < w->st.stale.n; k++)
        if ((rc = remove_staged(w->dfd, w->out, w->st.stale.v[k])) != 0) return rc;
    snprintf(w->stage, sizeof w->stage, "%s/%s", w->out, w->sname);
    if (mkdirat(w->dfd, w->sname, 0700) != 0) {
        rc = dsrt__fail(-errno, "shards: %s: %s", w->stage, strerror(errno));
        w->stage[0] = '\0';
        return rc;
    }
    return 0;
}

/* Starts the next shard. */
static int shard_next(writing *w) {
    char name[64];
    snprintf(name, sizeof name, SHARD_NAME_FMT, w->nshards);
    int rc = dsrt__strlist_add(&w->shard_names, name, strlen(name));
    if (rc == 0) rc = sf_open(&w->f, w->stage, name);
    if (rc != 0) return rc;
    void *v = w->x.shard_count;
    if (dsrt__grow(&v, &w->cap_shards, w->nshards + 1, sizeof *w->x.shard_count) != 0)
        return -ENOMEM;
    w->x.shard_count = v;
    uint64_t *sizes = dsrt__realloc(w->x.shard_size, w->cap_shards * sizeof *sizes);
    if (!sizes) return -ENOMEM;
    w->x.shard_size = sizes;
    w->x.shard_count[w->nshards] = 0;
    w->nshards++;
    return 0;
}

/* Writes every sample, <key>.cls then <key>.jpg|png|webp, into shards of at most
 * shard_bytes (and shard_samples). */
static int write_samples(writing *w) {
    const dsrt_datastore *ds = w->ds;
    const dsrt_index *ix = ds->index;
    uint64_t in_shard = 0;
    int rc = 0;
    for (size_t i = 0; i < ds->n && rc == 0; i++) {
        uint8_t *data;
        size_t len;
        int64_t mtime;
        void *owned;
        if ((rc = sample_bytes(ds, i, &data, &len, &mtime, &owned)) != 0) return rc;
        const char *path = dsrt_datastore_path(ds, i);
        char key[128], member[160], cls[16], ext[8];
        make_key(key, sizeof key, i, w->width, ix->source == DSRT_SOURCE_SHARDS ? NULL : path);
        image_ext(data, len, path, ext);
        int32_t label = ix->labels[dsrt__pos(ds, i)];
        int cl = snprintf(cls, sizeof cls, "%d", (int)label);
        uint64_t need = 3 * DSRT_TAR_BLOCK + ((len + DSRT_TAR_BLOCK - 1) & ~(uint64_t)511);
        if (w->f.fd >= 0 && (w->f.size + need + 2 * DSRT_TAR_BLOCK > w->opt.shard_bytes ||
                             (w->opt.shard_samples && in_shard >= w->opt.shard_samples)))
            rc = sf_close(&w->f);
        if (rc == 0 && w->f.fd < 0 && (rc = shard_next(w)) == 0) in_shard = 0;
        if (rc == 0) {
            snprintf(member, sizeof member, "%s.cls", key);
            rc = sf_member(&w->f, member, cls, (size_t)cl, mtime);
            snprintf(member, sizeof member, "%s.%s", key, ext);
            w->x.offset[i] = w->f.size + DSRT_TAR_BLOCK;
            w->x.size[i] = len;
            w->x.label[i] = label;
        }
        if (rc == 0) rc = sf_member(&w->f, member, data, len, mtime);
        if (rc == 0) rc = dsrt__strlist_add(&w->members, member, strlen(member));
        free(owned);
        if (rc == 0) {
            w->x.shard_count[w->nshards - 1]++;
            in_shard++;
        }
    }
    if (rc == 0 && w->f.fd >= 0) rc = sf_close(&w->f);
    return rc;
}

/* Writes classes.json and the index beside the staged shards, and the
 * record of the old set and the new one while one replaces the other. */
static int write_index(writing *w) {
    int rc;
    /* Sizes as they lie on disk. */
    for (size_t k = 0; k < w->nshards; k++) {
        struct stat sb;
        snprintf(w->p, sizeof w->p, "%s/%s", w->sname, w->shard_names.v[k]);
        if (fstatat(w->dfd, w->p, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            return dsrt__fail(-errno, "shards: %s/%s: %s", w->out, w->p, strerror(errno));
        w->x.shard_size[k] = (uint64_t)sb.st_size;
    }
    const dsrt_index *ix = w->ds->index;
    if ((rc = write_classes_json(w->stage, w->names, ix->num_classes)) != 0) return rc;
    w->x.nshards = w->nshards;
    w->x.n = w->ds->n;
    w->x.nclasses = ix->num_classes;
    w->x.shard_names = (const char **)w->shard_names.v;
    w->x.member = (const char **)w->members.v;
    w->x.classes = (const char **)w->names;
    snprintf(w->p, sizeof w->p, "%s/" DSRT_SHARD_INDEX_NAME, w->stage);
    if ((rc = dsrt__shard_index_write(w->p, &w->x)) != 0) return rc;
    for (size_t k = 0; rc == 0 && k < w->nshards; k++)
        rc = record_add(&w->files, w->shard_names.v[k], w->x.shard_size[k]);
    static const char *const last[] = {DSRT_SHARD_CLASSES_NAME, DSRT_SHARD_INDEX_NAME};
    for (size_t k = 0; rc == 0 && k < DSRT_ARRAY_SIZE(last); k++) {
        struct stat sb;
        snprintf(w->p, sizeof w->p, "%s/%s", w->sname, last[k]);
        rc = fstatat(w->dfd, w->p, &sb, AT_SYMLINK_NOFOLLOW) != 0
                 ? dsrt__fail(-errno, "shards: %s/%s: %s", w->out, w->p, strerror(errno))
                 : record_add(&w->files, last[k], (uint64_t)sb.st_size);
    }
    for (size_t k = 0; rc == 0 && k < w->files.names.n; k++)
        rc = record_add(&w->during, w->files.names.v[k], w->files.sizes[k]);
    if (rc == 0) rc = record_write(w->out, &w->during);
    return rc;
}

/* Moves the staged set into out; the record then lists the new one alone. */
static int write_publish(writing *w) {
    int rc;
    w->publishing = 1;
    if ((rc = publish(w->dfd, w->out, w->sname, &w->st, &w->files)) != 0) return rc;
    if (unlinkat(w->dfd, w->sname, AT_REMOVEDIR) == 0)
        w->stage[0] = '\0';
    else if ((rc = record_add(&w->files, w->sname, RECORD_FOLDER)) != 0)
        return rc;
    return record_write(w->out, &w->files);
}

/* After a failure: what was staged goes, and the record is as it was (none
 * if there was none); a folder this write made goes too. A write that failed
 * while moving files into out leaves the record of both sets. */
static void write_undo(writing *w, int rc) {
    if (!(w->stage[0] || w->recorded || w->made)) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dsrt_last_error());
    if (w->stage[0] && remove_staged(w->dfd, w->out, w->sname) == 0) w->stage[0] = '\0';
    if (w->recorded && !w->publishing && !w->stage[0]) {
        if (w->st.recorded)
            record_write(w->out, &w->st.rec);
        else
            unlinkat(w->dfd, RECORD_NAME, 0);
    }
    if (w->made) rmdir(w->out);
    dsrt__fail(rc, "%s", msg);
}

static void writing_free(writing *w) {
    if (w->f.fd >= 0) close(w->f.fd);
    if (w->dfd >= 0) close(w->dfd); /* and the lock with it */
    out_state_free(&w->st);
    record_free(&w->during);
    record_free(&w->files);
    free(w->f.buf);
    free(w->x.offset);
    free(w->x.size);
    free(w->x.label);
    free(w->x.shard_count);
    free(w->x.shard_size);
    dsrt__strlist_free(&w->shard_names);
    dsrt__strlist_free(&w->members);
}

int64_t dsrt_shards_write(const dsrt_datastore *ds, const char *out,
                          const dsrt_shard_write_options *o, uint64_t *written) {
    dsrt_shard_write_options opt = o ? *o : dsrt_shard_write_defaults();
    if (written) *written = 0;
    if (!ds || !out || !*out) return dsrt__fail(DSRT_EOPTION, "shards: no datastore or no folder");
    if (opt.shard_bytes < 4 * DSRT_TAR_BLOCK)
        return dsrt__fail(DSRT_EOPTION, "shards: shard_bytes %llu: at least %d",
                          (unsigned long long)opt.shard_bytes, 4 * DSRT_TAR_BLOCK);
    const dsrt_index *ix = ds->index;
    const char *const *names = opt.class_names ? opt.class_names : ix->classes;
    for (size_t c = 0; c < ix->num_classes; c++)
        if (!names[c]) return dsrt__fail(DSRT_EOPTION, "shards: class %zu has no name", c);
    /* Everything is checked before anything is changed. */
    int rc = check_apart(ds, out);
    if (rc != 0) return rc;
    writing w = {
        .ds = ds, .opt = opt, .out = out, .dfd = -1, .names = names, .width = 6, .f = {.fd = -1}};
    size_t n = ds->n;
    for (size_t m = n; m >= 1000000; m /= 10) w.width++;
    /* The folder is made if absent and locked, then looked at; nothing in
     * it changes before both. */
    if ((rc = out_open(&w)) == 0) rc = out_inspect(w.dfd, out, &w.st);
    if (rc == 0) {
        w.f.buf = dsrt__malloc(WRITE_BUFFER);
        w.x.offset = dsrt__malloc((n ? n : 1) * sizeof *w.x.offset);
        w.x.size = dsrt__malloc((n ? n : 1) * sizeof *w.x.size);
        w.x.label = dsrt__malloc((n ? n : 1) * sizeof *w.x.label);
        rc = !w.f.buf || !w.x.offset || !w.x.size || !w.x.label ? -ENOMEM : 0;
    }
    if (rc == 0) rc = stage_open(&w);
    if (rc == 0) rc = write_samples(&w);
    if (rc == 0) rc = write_index(&w);
    if (rc == 0) rc = write_publish(&w);
    if (rc != 0) write_undo(&w, rc);
    if (rc == 0 && written) *written = n;
    int64_t result = rc ? rc : (int64_t)w.nshards;
    writing_free(&w);
    return result;
}
