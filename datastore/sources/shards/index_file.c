/*
 * The index of a shard set and its class names, on disk.
 *
 * dsrt-shards.index lets a shard set open without reading its shards: one
 * read of one file gives every shard's name, size and sample count, and every
 * sample's offset, size, label and member name. It is binary, little-endian,
 * and checked by a CRC-32 over everything before its last 8 bytes, so a
 * damaged index is refused (and the shards scanned) rather than trusted:
 *
 *   header   64 bytes: "DSRTSHRD", u32 version (1), u32 0, u64 shards,
 *            u64 samples, u64 classes, u64 string bytes, u64 0, u64 0
 *   shards   24 bytes each: u64 size, u32 samples, u32 name, u64 0
 *   samples  24 bytes each: u64 offset, u64 size, i32 label, u32 member name
 *   classes  4 bytes each: u32 name
 *   strings  NUL-terminated, addressed by byte offset
 *   trailer  u32 CRC-32 of all the above, "DSRT"
 *
 * Within a shard, samples are in the order of their offsets. A million
 * samples make a 24 MB table and their names; reading and checking it takes
 * a few tens of milliseconds.
 *
 * classes.json beside it is for other tools: a JSON array of the class
 * names in class-index order. The index holds the exact bytes of the names
 * (JSON cannot hold names that are not UTF-8).
 */
#include "datastore/sources/shards/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define INDEX_MAGIC   "DSRTSHRD"
#define INDEX_VERSION 1
#define INDEX_HEADER  64
#define INDEX_SHARD   24
#define INDEX_SAMPLE  24
#define INDEX_TRAILER 8
/* Largest index read: 2^32 samples would need 100 GB; 16 GiB is plenty. */
#define INDEX_MAX ((size_t)16 << 30)

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* CRC-32 of a buffer of any size (zlib takes lengths as uInt). */
static uint32_t crc_of(const uint8_t *p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt k = (uInt)DSRT_MIN(n, (size_t)1 << 30);
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

// ----------------------------------------------------------------------------
// Writing

int dsrt__shard_index_write(const char *path, const dsrt_shard_index *x) {
    /* Strings first: their total size fixes the layout. */
    size_t strings = 0;
    for (size_t k = 0; k < x->nshards; k++) strings += strlen(x->shard_names[k]) + 1;
    for (size_t i = 0; i < x->n; i++) strings += strlen(x->member[i]) + 1;
    for (size_t c = 0; c < x->nclasses; c++) strings += strlen(x->classes[c]) + 1;
    if (strings > UINT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "shards: index %s: %zu bytes of names, more than 4 GiB",
                          path, strings);
    size_t total = INDEX_HEADER + x->nshards * INDEX_SHARD + x->n * INDEX_SAMPLE + x->nclasses * 4 +
                   strings + INDEX_TRAILER;
    uint8_t *buf = dsrt__calloc(1, total);
    if (!buf) return -ENOMEM;
    uint8_t *p = buf;
    memcpy(p, INDEX_MAGIC, 8);
    put32(p + 8, INDEX_VERSION);
    put64(p + 16, x->nshards);
    put64(p + 24, x->n);
    put64(p + 32, x->nclasses);
    put64(p + 40, strings);
    p += INDEX_HEADER;
    uint8_t *shards = p, *samples = shards + x->nshards * INDEX_SHARD;
    uint8_t *classes = samples + x->n * INDEX_SAMPLE, *str = classes + x->nclasses * 4;
    uint32_t at = 0;
#define ADD_STRING(s)                                                                              \
    do {                                                                                           \
        size_t l_ = strlen(s) + 1;                                                                 \
        memcpy(str + at, (s), l_);                                                                 \
        at += (uint32_t)l_;                                                                        \
    } while (0)
    for (size_t k = 0; k < x->nshards; k++) {
        uint8_t *q = shards + k * INDEX_SHARD;
        put64(q, x->shard_size[k]);
        put32(q + 8, x->shard_count[k]);
        put32(q + 12, at);
        ADD_STRING(x->shard_names[k]);
    }
    for (size_t i = 0; i < x->n; i++) {
        uint8_t *q = samples + i * INDEX_SAMPLE;
        put64(q, x->offset[i]);
        put64(q + 8, x->size[i]);
        put32(q + 16, (uint32_t)x->label[i]);
        put32(q + 20, at);
        ADD_STRING(x->member[i]);
    }
    for (size_t c = 0; c < x->nclasses; c++) {
        put32(classes + 4 * c, at);
        ADD_STRING(x->classes[c]);
    }
#undef ADD_STRING
    uint8_t *trailer = str + strings;
    put32(trailer, crc_of(buf, (size_t)(trailer - buf)));
    memcpy(trailer + 4, "DSRT", 4);
    int rc = dsrt__write_file_atomic(path, buf, total);
    free(buf);
    return rc ? dsrt__fail_prefix(rc, "shards: index") : 0;
}

// ----------------------------------------------------------------------------
// Reading

void dsrt__shard_index_clear(dsrt_shard_index *x) {
    free(x->shard_names);
    free(x->shard_size);
    free(x->shard_count);
    free(x->offset);
    free(x->size);
    free(x->label);
    free(x->member);
    free(x->classes);
    memset(x, 0, sizeof *x);
}

/* The string at offset at of the string table, or NULL when it is not one. */
static const char *string_at(const uint8_t *str, size_t len, uint32_t at) {
    if (at >= len) return NULL;
    if (!memchr(str + at, '\0', DSRT_MIN(len - at, (size_t)DSRT_TAR_NAME_MAX + 1))) return NULL;
    return (const char *)str + at;
}

int dsrt__shard_index_parse(const uint8_t *buf, size_t len, const char *name, dsrt_shard_index *x,
                            dsrt_arena *arena) {
    memset(x, 0, sizeof *x);
#define BAD(...) dsrt__fail(DSRT_ECORRUPT, "shards: index " __VA_ARGS__)
    if (len < INDEX_HEADER + INDEX_TRAILER || memcmp(buf, INDEX_MAGIC, 8) != 0)
        return BAD("%s: not a dsrt shard index", name);
    if (get32(buf + 8) != INDEX_VERSION)
        return BAD("%s: version %u, this dsrt reads version %d", name, get32(buf + 8),
                   INDEX_VERSION);
    uint64_t ns = get64(buf + 16), n = get64(buf + 24), nc = get64(buf + 32),
             strings = get64(buf + 40);
    if (ns > len / INDEX_SHARD || n > len / INDEX_SAMPLE || nc > len / 4 || strings > len)
        return BAD("%s: counts larger than the file", name);
    uint64_t want =
        INDEX_HEADER + ns * INDEX_SHARD + n * INDEX_SAMPLE + nc * 4 + strings + INDEX_TRAILER;
    if (want != len)
        return BAD("%s: %zu bytes where its counts say %llu", name, len, (unsigned long long)want);
    const uint8_t *trailer = buf + len - INDEX_TRAILER;
    if (memcmp(trailer + 4, "DSRT", 4) != 0 || get32(trailer) != crc_of(buf, len - INDEX_TRAILER))
        return dsrt__fail(DSRT_ECHECKSUM, "shards: index %s: checksum mismatch (damaged)", name);
    if (n > UINT32_MAX)
        return BAD("%s: %llu samples, more than 2^32-1", name, (unsigned long long)n);

    const uint8_t *shards = buf + INDEX_HEADER, *samples = shards + ns * INDEX_SHARD;
    const uint8_t *classes = samples + n * INDEX_SAMPLE, *str = classes + nc * 4;
    int rc = -ENOMEM;
    x->nshards = (size_t)ns;
    x->n = (size_t)n;
    x->nclasses = (size_t)nc;
    x->shard_names = dsrt__calloc(ns ? ns : 1, sizeof *x->shard_names);
    x->shard_size = dsrt__calloc(ns ? ns : 1, sizeof *x->shard_size);
    x->shard_count = dsrt__calloc(ns ? ns : 1, sizeof *x->shard_count);
    x->offset = dsrt__malloc((n ? n : 1) * sizeof *x->offset);
    x->size = dsrt__malloc((n ? n : 1) * sizeof *x->size);
    x->label = dsrt__malloc((n ? n : 1) * sizeof *x->label);
    x->member = dsrt__malloc((n ? n : 1) * sizeof *x->member);
    x->classes = dsrt__calloc(nc ? nc : 1, sizeof *x->classes);
    if (!x->shard_names || !x->shard_size || !x->shard_count || !x->offset || !x->size ||
        !x->label || !x->member || !x->classes)
        goto fail;
    /* The string table is kept whole in the arena; names point into it. */
    uint8_t *table = dsrt__arena_alloc(arena, strings ? strings : 1, 1);
    if (!table) goto fail;
    memcpy(table, str, strings);

    uint64_t total = 0;
    for (size_t k = 0; k < ns; k++) {
        const uint8_t *q = shards + k * INDEX_SHARD;
        x->shard_size[k] = get64(q);
        x->shard_count[k] = get32(q + 8);
        const char *s = string_at(table, strings, get32(q + 12));
        if (!s || !*s || strchr(s, '/')) {
            rc = BAD("%s: shard %zu has no valid file name", name, k);
            goto fail;
        }
        x->shard_names[k] = s;
        total += x->shard_count[k];
    }
    if (total != n) {
        rc = BAD("%s: the shards hold %llu samples, the header says %llu", name,
                 (unsigned long long)total, (unsigned long long)n);
        goto fail;
    }
    for (size_t c = 0; c < nc; c++) {
        const char *s = string_at(table, strings, get32(classes + 4 * c));
        if (!s) {
            rc = BAD("%s: class %zu has no valid name", name, c);
            goto fail;
        }
        x->classes[c] = s;
    }
    size_t i = 0;
    for (size_t k = 0; k < ns; k++) {
        uint64_t prev_end = 0;
        for (uint32_t j = 0; j < x->shard_count[k]; j++, i++) {
            const uint8_t *q = samples + i * INDEX_SAMPLE;
            uint64_t off = get64(q), size = get64(q + 8);
            int32_t label = (int32_t)get32(q + 16);
            const char *m = string_at(table, strings, get32(q + 20));
            if (off < prev_end || size > x->shard_size[k] || off > x->shard_size[k] - size) {
                rc = BAD("%s: sample %zu lies outside its shard or overlaps the one before", name,
                         i);
                goto fail;
            }
            if (label < 0 || (uint64_t)label >= (nc ? nc : 1) || !m || !*m) {
                rc = BAD("%s: sample %zu has a bad label (%d) or no member name", name, i,
                         (int)label);
                goto fail;
            }
            prev_end = off + size;
            x->offset[i] = off;
            x->size[i] = size;
            x->label[i] = label;
            x->member[i] = m;
        }
    }
    return 0;
#undef BAD
fail:
    dsrt__shard_index_clear(x);
    return rc;
}

int dsrt__shard_index_read(const char *path, dsrt_shard_index *x, dsrt_arena *arena) {
    uint8_t *data;
    size_t size;
    memset(x, 0, sizeof *x);
    int rc = dsrt__read_whole_file(path, INDEX_MAX, &data, &size);
    if (rc != 0) return rc;
    rc = dsrt__shard_index_parse(data, size, path, x, arena);
    free(data);
    return rc;
}

// ----------------------------------------------------------------------------
// classes.json

/* Appends the UTF-8 form of code point cp. */
static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int hex4(const char *s, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

typedef struct {
    const char *s, *end, *start, *name;
} json_in;

static void skip_ws(json_in *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r'))
        j->s++;
}

/* A JSON string at j->s (after skip_ws) into the arena. */
static int json_string(json_in *j, dsrt_arena *arena, const char **out) {
    if (j->s >= j->end || *j->s != '"')
        return dsrt__fail(DSRT_EFORMAT, "shards: %s: a string expected at byte %zu", j->name,
                          (size_t)(j->s - j->start));
    const char *p = ++j->s;
    size_t cap = 0;
    while (p < j->end && *p != '"') p += *p == '\\' && p + 1 < j->end ? 2 : 1;
    if (p >= j->end) return dsrt__fail(DSRT_EFORMAT, "shards: %s: unterminated string", j->name);
    cap = (size_t)(p - j->s) + 1;
    char *o = dsrt__arena_alloc(arena, cap, 1), *w = o;
    if (!o) return -ENOMEM;
    while (j->s < p) {
        char c = *j->s++;
        if (c != '\\') {
            if ((unsigned char)c < 0x20)
                return dsrt__fail(DSRT_EFORMAT, "shards: %s: control character in a string",
                                  j->name);
            *w++ = c;
            continue;
        }
        c = *j->s++;
        switch (c) {
        case '"':
            *w++ = '"';
            break;
        case '\\':
            *w++ = '\\';
            break;
        case '/':
            *w++ = '/';
            break;
        case 'b':
            *w++ = '\b';
            break;
        case 'f':
            *w++ = '\f';
            break;
        case 'n':
            *w++ = '\n';
            break;
        case 'r':
            *w++ = '\r';
            break;
        case 't':
            *w++ = '\t';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (p - j->s < 4 || hex4(j->s, &cp) != 0)
                return dsrt__fail(DSRT_EFORMAT, "shards: %s: bad \\u escape", j->name);
            j->s += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p - j->s >= 6 && j->s[0] == '\\' && j->s[1] == 'u' &&
                hex4(j->s + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                j->s += 6;
            } else if (cp >= 0xd800 && cp < 0xe000) {
                cp = 0xfffd;
            }
            /* An escape is 6 or 12 bytes; its UTF-8 at most 4: it fits. */
            w += utf8_put(w, cp);
            break;
        }
        default:
            return dsrt__fail(DSRT_EFORMAT, "shards: %s: bad escape \\%c", j->name, c);
        }
    }
    *w = '\0';
    j->s = p + 1;
    *out = o;
    return 0;
}

int dsrt__classes_json_parse(const char *text, size_t len, const char *name, dsrt_arena *arena,
                             const char ***names, size_t *count) {
    json_in j = {text, text + len, text, name};
    const char **list = NULL;
    size_t n = 0, cap = 0;
    int rc, object = 0;
    *names = NULL;
    *count = 0;
    skip_ws(&j);
    if (j.s < j.end && *j.s == '{') {
        /* {"classes": [...]} */
        j.s++;
        skip_ws(&j);
        const char *key;
        if ((rc = json_string(&j, arena, &key)) != 0) return rc;
        skip_ws(&j);
        if (strcmp(key, "classes") != 0 || j.s >= j.end || *j.s != ':')
            return dsrt__fail(DSRT_EFORMAT, "shards: %s: expected {\"classes\": [...]}", name);
        j.s++;
        skip_ws(&j);
        object = 1;
    }
    if (j.s >= j.end || *j.s != '[')
        return dsrt__fail(DSRT_EFORMAT, "shards: %s: expected a JSON array of class names", name);
    j.s++;
    skip_ws(&j);
    if (j.s < j.end && *j.s == ']') {
        j.s++;
    } else {
        for (;;) {
            skip_ws(&j);
            const char *s;
            if ((rc = json_string(&j, arena, &s)) != 0) goto fail;
            void *l = list;
            if ((rc = dsrt__grow(&l, &cap, n + 1, sizeof *list)) != 0) goto fail;
            list = l;
            list[n++] = s;
            skip_ws(&j);
            if (j.s < j.end && *j.s == ',') {
                j.s++;
                continue;
            }
            if (j.s < j.end && *j.s == ']') {
                j.s++;
                break;
            }
            rc =
                dsrt__fail(DSRT_EFORMAT, "shards: %s: expected ',' or ']' in the class list", name);
            goto fail;
        }
    }
    skip_ws(&j);
    if (object) {
        if (j.s >= j.end || *j.s != '}') {
            rc = dsrt__fail(DSRT_EFORMAT, "shards: %s: expected '}'", name);
            goto fail;
        }
        j.s++;
        skip_ws(&j);
    }
    if (j.s != j.end) {
        rc = dsrt__fail(DSRT_EFORMAT, "shards: %s: text after the class list", name);
        goto fail;
    }
    *names = list;
    *count = n;
    return 0;
fail:
    free(list);
    return rc;
}
