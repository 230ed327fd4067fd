/*
 * Manifest sources: a CSV file listing "path,label" one sample a line, for
 * data sets whose labels do not follow the folders (a labelling tool's
 * export, a cleaned subset, several roots in one list).
 *
 * The CSV dialect is RFC 4180's: a field may be quoted with double quotes,
 * and then holds commas, line breaks and doubled quotes ("" for one quote).
 * Lines end in LF or CRLF; a UTF-8 byte-order mark at the start is skipped;
 * blank lines are skipped; blanks around an unquoted field are trimmed (quote
 * the field to keep them). The first line may be a header: the caller says so,
 * or asks for a guess, which takes the first line as a header when its second
 * field is "label" or "class" in any case.
 *
 * The classes are the distinct label strings, sorted: by numeric value when
 * every label is a non-negative integer (so "10" comes after "9"), otherwise
 * by byte order, which for UTF-8 is code-point order, the order of Python's
 * sorted() on the same strings. Labels are gathered in a hash table as the
 * lines are read, so a manifest of millions of lines costs one pass and one
 * sort of the distinct labels.
 *
 * Paths may be URLs of objects (s3://, https://), and the manifest itself
 * may sit at a URL (fetched whole by the HTTP client); a relative path is taken
 * relative to the manifest's folder or URL.
 *
 * The files a manifest names are not checked at open: a missing or
 * unreadable one is a per-sample read error when it is read, counted and
 * reported with its path like any other bad file. Stat-ing millions of files
 * up front would make opening as slow as a pass over the data.
 */
#include "datastore/sources/manifest/manifest.h"

#include "datastore/bytes/http.h"
#include "datastore/bytes/url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Largest manifest we read. */
#define MANIFEST_MAX_BYTES ((size_t)4 << 30)

// ----------------------------------------------------------------------------
// The set of distinct labels

typedef struct {
    const char *s; /* NUL-terminated, in the set's arena */
    size_t len;
    uint64_t hash;
} label_str;

typedef struct {
    label_str *items; /* (n) in order of first appearance */
    size_t n, cap;
    uint32_t *slots; /* (nslots) item index + 1, or 0 for empty; open addressing */
    size_t nslots;
    dsrt_arena arena;
} label_set;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return dsrt__mix64(h);
}

static int label_set_rehash(label_set *ls, size_t nslots) {
    uint32_t *slots = dsrt__calloc(nslots, sizeof *slots);
    if (!slots) return -ENOMEM;
    for (size_t i = 0; i < ls->n; i++) {
        size_t at = ls->items[i].hash & (nslots - 1);
        while (slots[at]) at = (at + 1) & (nslots - 1);
        slots[at] = (uint32_t)i + 1;
    }
    free(ls->slots);
    ls->slots = slots;
    ls->nslots = nslots;
    return 0;
}

/* The id of label s[0..n), added if new. */
static int label_set_id(label_set *ls, const char *s, size_t n, uint32_t *id) {
    int rc;
    if ((ls->n + 1) * 2 > ls->nslots &&
        (rc = label_set_rehash(ls, ls->nslots ? ls->nslots * 2 : 1024)) != 0)
        return rc;
    uint64_t h = hash_bytes(s, n);
    size_t at = h & (ls->nslots - 1);
    for (; ls->slots[at]; at = (at + 1) & (ls->nslots - 1)) {
        const label_str *e = &ls->items[ls->slots[at] - 1];
        if (e->hash == h && e->len == n && memcmp(e->s, s, n) == 0) {
            *id = ls->slots[at] - 1;
            return 0;
        }
    }
    void *items = ls->items;
    if ((rc = dsrt__grow(&items, &ls->cap, ls->n + 1, sizeof *ls->items)) != 0) return rc;
    ls->items = items;
    char *copy = dsrt__arena_strndup(&ls->arena, s, n);
    if (!copy) return -ENOMEM;
    ls->items[ls->n] = (label_str){copy, n, h};
    ls->slots[at] = (uint32_t)ls->n + 1;
    *id = (uint32_t)ls->n++;
    return 0;
}

static void label_set_free(label_set *ls) {
    free(ls->items);
    free(ls->slots);
    dsrt__arena_free(&ls->arena);
}

static int is_uint(const label_str *l) {
    for (size_t i = 0; i < l->len; i++)
        if (l->s[i] < '0' || l->s[i] > '9') return 0;
    return l->len > 0;
}

static int cmp_bytes(const void *a, const void *b) {
    const label_str *x = *(const label_str *const *)a, *y = *(const label_str *const *)b;
    int c = memcmp(x->s, y->s, DSRT_MIN(x->len, y->len));
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Non-negative integers of any length by value; equal values ("7", "07") by bytes. */
static int cmp_numeric(const void *a, const void *b) {
    const label_str *x = *(const label_str *const *)a, *y = *(const label_str *const *)b;
    size_t i = 0, j = 0;
    while (i + 1 < x->len && x->s[i] == '0') i++;
    while (j + 1 < y->len && y->s[j] == '0') j++;
    size_t xl = x->len - i, yl = y->len - j;
    if (xl != yl) return xl < yl ? -1 : 1;
    int c = memcmp(x->s + i, y->s + j, xl);
    return c ? c : cmp_bytes(a, b);
}

// ----------------------------------------------------------------------------
// CSV

typedef struct {
    const char *text;
    size_t len, pos;
    size_t line; /* physical line of pos, from 1 */
    const char *name;
} csv_reader;

typedef struct {
    const char *p;
    size_t n;
    int quoted;
} csv_field;

static int is_blank(char c) {
    return c == ' ' || c == '\t';
}

/*
 * Reads the field at c->pos, leaving c->pos on the ',' or line break after
 * it, or at the end. Quoted fields are unescaped into *scratch. rec_line is
 * the line the record starts on, for messages.
 */
static int csv_read_field(csv_reader *c, size_t rec_line, char **scratch, size_t *scap,
                          csv_field *f) {
    const char *t = c->text;
    while (c->pos < c->len && is_blank(t[c->pos])) c->pos++;
    if (c->pos < c->len && t[c->pos] == '"') {
        size_t out = 0;
        c->pos++;
        for (;;) {
            const char *q = memchr(t + c->pos, '"', c->len - c->pos);
            if (!q)
                return dsrt__fail(DSRT_ECORRUPT,
                                  "manifest: %s:%zu: a quoted field is not closed before the end "
                                  "of the file",
                                  c->name, rec_line);
            size_t seg = (size_t)(q - (t + c->pos));
            if (memchr(t + c->pos, '\0', seg))
                return dsrt__fail(DSRT_ECORRUPT, "manifest: %s:%zu: NUL byte in a field", c->name,
                                  rec_line);
            void *buf = *scratch;
            int rc = dsrt__grow(&buf, scap, out + seg + 2, 1);
            if (rc != 0) return rc;
            *scratch = buf;
            memcpy(*scratch + out, t + c->pos, seg);
            for (size_t k = 0; k < seg; k++) c->line += t[c->pos + k] == '\n';
            out += seg;
            c->pos += seg + 1;
            if (c->pos < c->len && t[c->pos] == '"') { /* "" inside quotes: one quote */
                (*scratch)[out++] = '"';
                c->pos++;
                continue;
            }
            break;
        }
        (*scratch)[out] = '\0';
        while (c->pos < c->len && is_blank(t[c->pos])) c->pos++;
        if (c->pos < c->len && t[c->pos] != ',' && t[c->pos] != '\n' && t[c->pos] != '\r')
            return dsrt__fail(DSRT_ECORRUPT,
                              "manifest: %s:%zu: text after the closing quote of a field "
                              "(quotes inside a quoted field are written \"\")",
                              c->name, c->line);
        *f = (csv_field){*scratch, out, 1};
        return 0;
    }
    size_t start = c->pos;
    while (c->pos < c->len) {
        char ch = t[c->pos];
        if (ch == ',' || ch == '\n' || ch == '\r') break;
        if (ch == '\0')
            return dsrt__fail(DSRT_ECORRUPT, "manifest: %s:%zu: NUL byte in a field", c->name,
                              rec_line);
        c->pos++;
    }
    size_t end = c->pos;
    while (end > start && is_blank(t[end - 1])) end--;
    *f = (csv_field){t + start, end - start, 0};
    return 0;
}

/* Whether a first line is a header, for header = -1. */
static int looks_like_header(const csv_field *label) {
    return (label->n == 5 && strncasecmp(label->p, "label", 5) == 0) ||
           (label->n == 5 && strncasecmp(label->p, "class", 5) == 0);
}

// ----------------------------------------------------------------------------
// Parsing

int dsrt__manifest_parse(dsrt_index *ix, const char *text, size_t len, const char *name,
                         const char *base_dir, int header) {
    label_set ls = {0};
    csv_reader c = {text, len, 0, 1, name};
    char *scratch[3] = {NULL, NULL, NULL};
    size_t scap[3] = {0, 0, 0}, paths_cap = 0, labels_cap = 0;
    const label_str **sorted = NULL;
    const char **names = NULL;
    uint32_t *rank = NULL;
    int rc = 0;

    size_t base_len = base_dir ? strlen(base_dir) : 0;
    int base_slash = base_len > 0 && base_dir[base_len - 1] == '/';
    ix->source = DSRT_SOURCE_MANIFEST;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) c.pos = 3;

    while (c.pos < c.len) {
        size_t rec_line = c.line, nf = 0;
        csv_field f[2] = {{"", 0, 0}, {"", 0, 0}};
        for (;;) {
            csv_field cur;
            size_t k = DSRT_MIN(nf, (size_t)2);
            if ((rc = csv_read_field(&c, rec_line, &scratch[k], &scap[k], &cur)) != 0) goto fail;
            if (nf < 2) f[nf] = cur;
            nf++;
            if (c.pos < c.len && text[c.pos] == ',') {
                c.pos++;
                continue;
            }
            if (c.pos < c.len && text[c.pos] == '\r') c.pos++;
            if (c.pos < c.len && text[c.pos] == '\n') c.pos++;
            c.line++;
            break;
        }
        if (nf == 1 && !f[0].quoted && f[0].n == 0) continue; /* blank line */
        if (header != 0) {
            int skip = header == 1 || (nf >= 2 && looks_like_header(&f[1]));
            header = 0;
            if (skip) continue;
        }
        if (nf > 2) {
            rc = dsrt__fail(DSRT_ECORRUPT, "manifest: %s:%zu: %zu fields; expected 2 (path,label)",
                            name, rec_line, nf);
            goto fail;
        }
        if (nf < 2) {
            rc = dsrt__fail(DSRT_ECORRUPT, "manifest: %s:%zu: no label field; expected path,label",
                            name, rec_line);
            goto fail;
        }
        if (f[0].n == 0 || f[1].n == 0) {
            rc = dsrt__fail(DSRT_ECORRUPT, "manifest: %s:%zu: empty %s", name, rec_line,
                            f[0].n == 0 ? "path" : "label");
            goto fail;
        }
        if (ix->n >= UINT32_MAX) {
            rc = dsrt__fail(DSRT_ETOOBIG, "manifest: %s:%zu: more than 2^32-1 samples", name,
                            rec_line);
            goto fail;
        }

        void *paths = (void *)ix->paths, *labels = ix->labels;
        if ((rc = dsrt__grow(&paths, &paths_cap, ix->n + 1, sizeof *ix->paths)) != 0) goto fail;
        ix->paths = paths;
        if ((rc = dsrt__grow(&labels, &labels_cap, ix->n + 1, sizeof *ix->labels)) != 0) goto fail;
        ix->labels = labels;

        char *p;
        int url = dsrt__is_url_n(f[0].p, f[0].n);
        ix->remote |= url;
        if (base_len && f[0].p[0] != '/' && !url) {
            size_t n = base_len + !base_slash + f[0].n;
            if (!(p = dsrt__arena_alloc(&ix->arena, n + 1, 1))) goto nomem;
            memcpy(p, base_dir, base_len);
            if (!base_slash) p[base_len] = '/';
            memcpy(p + base_len + !base_slash, f[0].p, f[0].n);
            p[n] = '\0';
        } else if (!(p = dsrt__arena_strndup(&ix->arena, f[0].p, f[0].n))) {
            goto nomem;
        }
        uint32_t id;
        if ((rc = label_set_id(&ls, f[1].p, f[1].n, &id)) != 0) goto fail;
        ix->paths[ix->n] = p;
        ix->labels[ix->n] = (int32_t)id; /* first-appearance id until the classes are sorted */
        ix->n++;
    }

    /* Sort the distinct labels and renumber the samples. */
    if (ls.n > 0) {
        sorted = dsrt__malloc(ls.n * sizeof *sorted);
        rank = dsrt__malloc(ls.n * sizeof *rank);
        names = dsrt__malloc(ls.n * sizeof *names);
        if (!sorted || !rank || !names) goto nomem;
        int numeric = 1;
        for (size_t i = 0; i < ls.n; i++) {
            sorted[i] = &ls.items[i];
            numeric &= is_uint(&ls.items[i]);
        }
        dsrt__sort(sorted, ls.n, sizeof *sorted, numeric ? cmp_numeric : cmp_bytes);
        for (size_t r = 0; r < ls.n; r++) {
            rank[sorted[r] - ls.items] = (uint32_t)r;
            names[r] = sorted[r]->s;
        }
        for (size_t i = 0; i < ix->n; i++) ix->labels[i] = (int32_t)rank[ix->labels[i]];
    }
    rc = dsrt__index_set_classes(ix, names, ls.n);
    goto out;
nomem:
    rc = -ENOMEM;
fail:
out:
    free(names);
    free(rank);
    free(sorted);
    for (int k = 0; k < 3; k++) free(scratch[k]);
    label_set_free(&ls);
    return rc;
}

// ----------------------------------------------------------------------------
// Loading

int dsrt__manifest_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    uint8_t *text;
    size_t len;
    int rc = dsrt__read_whole_file(path, MANIFEST_MAX_BYTES, &text, &len);
    if (rc != 0) return dsrt__fail_prefix(rc, "manifest");

    /* Relative paths are relative to the manifest's folder; a manifest in
     * the current folder keeps them as they are. */
    char *dir = dsrt__strdup(path);
    if (!dir) {
        free(text);
        return -ENOMEM;
    }
    char *slash = strrchr(dir, '/');
    if (!slash)
        dir[0] = '\0';
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    rc = dsrt__manifest_parse(ix, (const char *)text, len, path, dir, o ? o->manifest_header : -1);
    free(dir);
    free(text);
    return rc;
}

int dsrt__remote_manifest_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    uint8_t *text = NULL;
    size_t len;
    ix->remote = 1;
    dsrt_http *h = NULL;
    int rc = dsrt__http_create_opening(&h, o, 1);
    if (rc == 0) rc = dsrt__http_fetch(h, url, NULL, (size_t)4 << 30, &text, &len);
    dsrt__http_destroy(h);
    if (rc != 0) return dsrt__fail_prefix(rc, "manifest");
    /* Relative paths are relative to the manifest's "folder": the URL up to
     * its last '/' (query left out). */
    char *dir = dsrt__strdup(url);
    if (!dir) {
        free(text);
        return -ENOMEM;
    }
    char *q = strchr(dir, '?');
    if (q) *q = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    char display[512];
    dsrt_text_redact(url, display, sizeof display);
    rc = dsrt__manifest_parse(ix, (const char *)text, len, display, dir,
                              o ? o->manifest_header : -1);
    free(dir);
    free(text);
    return rc;
}

// ----------------------------------------------------------------------------
// The source

static int named(const char *name) {
    return dsrt__ends_with_ci(name, ".csv") || dsrt__ends_with_ci(name, ".txt") ||
           dsrt__ends_with_ci(name, ".lst");
}

static int detect(const dsrt_probe *p) {
    return p->exists && !p->folder && named(p->path);
}

/* A manifest at a URL by its name, the query left out. */
static int detect_url(const char *url, const dsrt_datastore_options *o) {
    (void)o;
    char name[1024];
    const char *q = strchr(url, '?');
    snprintf(name, sizeof name, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
    return named(name);
}

const dsrt_source_ops dsrt__source_manifest = {
    .kind = DSRT_SOURCE_MANIFEST,
    .what = "a .csv manifest",
    .detect = detect,
    .detect_url = detect_url,
    .open = dsrt__manifest_load,
    .open_url = dsrt__remote_manifest_load,
};
