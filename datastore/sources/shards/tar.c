/*
 * The tar format, as far as shard sets need it: walking the members of an
 * archive made by any common tool, and writing the headers of the shards
 * dsrt makes.
 *
 * The walk reads what POSIX ustar, GNU tar and pax write: the ustar prefix
 * field, GNU long names and long link names ('L', 'K' members), pax extended
 * headers ('x', whose path and size override the next header's; 'g' global
 * ones are skipped), base-256 sizes, and the old v7 headers without a magic.
 * It never trusts a size to stay inside the file: a member whose data runs
 * past the end is reported as truncated and ends the walk. A header whose
 * checksum is wrong is reported and the walk looks for the next block that is
 * a valid header (as `tar --ignore-zeros` would find it), so one damaged
 * header costs the members up to the next good one, not the shard.
 *
 * Reading goes through a callback, so the same walk serves files (preads of
 * a window), object storage and the fuzzer (a buffer in memory).
 */
#include "datastore/sources/shards/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest pax header or GNU long name read; a larger one is skipped with a
 * warning. */
#define TAR_EXT_MAX ((size_t)1 << 20)
/* Blocks searched for a valid header after a damaged one, at most. */
#define TAR_RESYNC_MAX ((uint64_t)1 << 22)

// ----------------------------------------------------------------------------
// Header fields

/* A numeric field: octal digits (leading spaces, ended by a space or NUL) or
 * GNU's base-256 (first byte's top bit set). Returns 0, or -1 when the field
 * is not a number or is negative. */
static int tar_number(const uint8_t *f, size_t len, uint64_t *out) {
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] & 0x40) return -1; /* negative */
        v = f[0] & 0x3f;
        for (size_t i = 1; i < len; i++) {
            if (v >> 56) return -1;
            v = (v << 8) | f[i];
        }
        *out = v;
        return 0;
    }
    size_t i = 0;
    while (i < len && f[i] == ' ') i++;
    size_t digits = 0;
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v >> 61) return -1;
        v = v * 8 + (uint64_t)(f[i] - '0');
    }
    if (i < len && f[i] != ' ' && f[i] != '\0') return -1;
    if (digits == 0 && i < len && f[i] != '\0' && f[i] != ' ') return -1;
    *out = v;
    return 0;
}

static void tar_octal(uint8_t *f, size_t len, uint64_t v) {
    /* len - 1 digits and a NUL, zero-padded, as POSIX writes them. */
    f[len - 1] = '\0';
    for (size_t i = len - 1; i-- > 0;) {
        f[i] = (uint8_t)('0' + (v & 7));
        v >>= 3;
    }
}

static int is_zero_block(const uint8_t *b) {
    for (size_t i = 0; i < DSRT_TAR_BLOCK; i++)
        if (b[i]) return 0;
    return 1;
}

/* 1 when the header's checksum holds (the unsigned sum POSIX asks for, or the
 * signed one some old tars wrote). */
static int checksum_ok(const uint8_t *b) {
    uint64_t want;
    if (tar_number(b + 148, 8, &want) != 0) return 0;
    uint64_t us = 0;
    int64_t ss = 0;
    for (size_t i = 0; i < DSRT_TAR_BLOCK; i++) {
        uint8_t c = i >= 148 && i < 156 ? ' ' : b[i];
        us += c;
        ss += (int8_t)c;
    }
    return us == want || (uint64_t)ss == want;
}

/* Copies a NUL-padded field of at most len bytes; returns its length. */
static size_t field_copy(char *dst, const uint8_t *f, size_t len) {
    size_t n = strnlen((const char *)f, len);
    memcpy(dst, f, n);
    return n;
}

// ----------------------------------------------------------------------------
// The walk

typedef struct {
    const char *name;
    uint64_t file_size;
    dsrt_tar_read_fn read;
    void *read_ctx;
    dsrt_tar_warn_fn warn;
    void *ctx;

    /* What the extended headers say about the next member. */
    char *long_name; /* (DSRT_TAR_NAME_MAX + 1) */
    size_t long_len;
    int have_long;
    uint64_t pax_size;
    int have_pax_size;
    char *ext; /* (TAR_EXT_MAX) an extended header's data */
} walk;

static void warnf(walk *w, const char *fmt, ...) DSRT_PRINTF(2, 3);
static void warnf(walk *w, const char *fmt, ...) {
    if (!w->warn) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->warn(w->ctx, line);
}

/* Reads exactly len bytes at off; DSRT_ETRUNCATED when the file ends first. */
static int read_exact(walk *w, uint64_t off, void *buf, size_t len) {
    int64_t got = w->read(w->read_ctx, off, buf, len);
    if (got < 0) return (int)got;
    if ((size_t)got < len)
        return dsrt__fail(DSRT_ETRUNCATED, "tar: %s: ends at byte %llu, inside a header", w->name,
                          (unsigned long long)(off + (uint64_t)got));
    return 0;
}

/* Applies the records of a pax extended header ("LEN key=value\n"). */
static void pax_apply(walk *w, const char *d, size_t len, uint64_t at) {
    size_t i = 0;
    while (i < len) {
        size_t rec = 0, j = i;
        while (j < len && d[j] >= '0' && d[j] <= '9' && rec < TAR_EXT_MAX)
            rec = rec * 10 + (size_t)(d[j++] - '0');
        if (j == i || j >= len || d[j] != ' ' || rec <= j - i || rec > len - i ||
            d[i + rec - 1] != '\n') {
            /* Zero padding ends the records; anything else is damage. */
            if (d[i] != '\0')
                warnf(w, "%s: pax header at byte %llu: malformed record, rest ignored", w->name,
                      (unsigned long long)at);
            return;
        }
        const char *kv = d + j + 1, *end = d + i + rec - 1;
        const char *eq = memchr(kv, '=', (size_t)(end - kv));
        if (eq) {
            size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
            if (klen == 4 && memcmp(kv, "path", 4) == 0) {
                if (vlen > DSRT_TAR_NAME_MAX) {
                    warnf(w, "%s: pax path of %zu bytes at byte %llu: too long, ignored", w->name,
                          vlen, (unsigned long long)at);
                } else {
                    memcpy(w->long_name, eq + 1, vlen);
                    w->long_len = vlen;
                    w->long_name[vlen] = '\0';
                    w->have_long = 1;
                }
            } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
                uint64_t v = 0;
                int ok = vlen > 0 && vlen <= 19;
                for (size_t k = 0; ok && k < vlen; k++) {
                    char c = eq[1 + k];
                    ok = c >= '0' && c <= '9';
                    v = v * 10 + (uint64_t)(c - '0');
                }
                if (ok) {
                    w->pax_size = v;
                    w->have_pax_size = 1;
                } else {
                    warnf(w, "%s: pax size '%.*s' at byte %llu: not a number, ignored", w->name,
                          (int)DSRT_MIN(vlen, (size_t)32), eq + 1, (unsigned long long)at);
                }
            }
        }
        i += rec;
    }
}

/* Reads an extended header's data (pax or GNU long name) of size bytes at
 * off into w->ext; 1 when it was read, 0 when too large (skipped), or a
 * negative code. */
static int ext_read(walk *w, uint64_t off, uint64_t size, const char *what) {
    if (size > TAR_EXT_MAX) {
        warnf(w, "%s: %s of %llu bytes at byte %llu: too large, ignored", w->name, what,
              (unsigned long long)size, (unsigned long long)off);
        return 0;
    }
    int rc = read_exact(w, off, w->ext, (size_t)size);
    return rc ? rc : 1;
}

/* Looks for the next valid header after a damaged one at off: the first
 * block that passes the checksum and carries a ustar magic. Returns its
 * offset, or UINT64_MAX when none is found. */
static uint64_t resync(walk *w, uint64_t off) {
    uint8_t b[DSRT_TAR_BLOCK];
    for (uint64_t at = off + DSRT_TAR_BLOCK, n = 0;
         at + DSRT_TAR_BLOCK <= w->file_size && n < TAR_RESYNC_MAX; at += DSRT_TAR_BLOCK, n++) {
        if (w->read(w->read_ctx, at, b, DSRT_TAR_BLOCK) != DSRT_TAR_BLOCK) return UINT64_MAX;
        if (memcmp(b + 257, "ustar", 5) == 0 && checksum_ok(b)) return at;
    }
    return UINT64_MAX;
}

/* An extended header of type at off (its data, size bytes, at data): what
 * it says kept for the next member. 1 when the walk ends there (the header
 * runs past the file), a negative code when reading failed, else 0. */
static int extended(walk *w, char type, uint64_t off, uint64_t data, uint64_t size, int truncated) {
    if (truncated) {
        warnf(w, "%s: extended header at byte %llu runs past the end of the file", w->name,
              (unsigned long long)off);
        return 1;
    }
    if (type != 'x' && type != 'L') return 0;
    int got = ext_read(w, data, size, type == 'x' ? "pax header" : "GNU long name");
    if (got < 0) return got;
    if (got && type == 'x') pax_apply(w, w->ext, (size_t)size, off);
    if (got && type == 'L') {
        size_t n = strnlen(w->ext, (size_t)size);
        if (n > DSRT_TAR_NAME_MAX) {
            warnf(w, "%s: GNU long name of %zu bytes at byte %llu: too long, ignored", w->name, n,
                  (unsigned long long)off);
        } else {
            memcpy(w->long_name, w->ext, n);
            w->long_name[n] = '\0';
            w->long_len = n;
            w->have_long = 1;
        }
    }
    return 0;
}

/* The name of the member whose header is b, into out (NUL-terminated): an
 * extended header's, or the ustar prefix and name (GNU's format uses the
 * prefix field for other things). Returns its length. */
static size_t member_name(const walk *w, const uint8_t *b, char *out) {
    size_t len;
    if (w->have_long) {
        memcpy(out, w->long_name, w->long_len);
        len = w->long_len;
    } else {
        len = 0;
        int posix = memcmp(b + 257, "ustar\0", 6) == 0;
        if (posix && b[345]) {
            len = field_copy(out, b + 345, 155);
            out[len++] = '/';
        }
        len += field_copy(out + len, b, 100);
    }
    out[len] = '\0';
    return len;
}

int dsrt__tar_scan(const char *name, uint64_t file_size, dsrt_tar_read_fn read, void *read_ctx,
                   dsrt_tar_member_fn member, dsrt_tar_warn_fn warn, void *ctx) {
    walk w = {.name = name,
              .file_size = file_size,
              .read = read,
              .read_ctx = read_ctx,
              .warn = warn,
              .ctx = ctx};
    int rc = -ENOMEM;
    char *name_buf = dsrt__malloc(DSRT_TAR_NAME_MAX + 1);
    w.long_name = dsrt__malloc(DSRT_TAR_NAME_MAX + 1);
    w.ext = dsrt__malloc(TAR_EXT_MAX + 1);
    if (!name_buf || !w.long_name || !w.ext) goto out;

    uint8_t b[DSRT_TAR_BLOCK];
    uint64_t off = 0;
    rc = 0;
    while (off < file_size) {
        if (file_size - off < DSRT_TAR_BLOCK) {
            warnf(&w, "%s: %llu stray bytes at the end, ignored", name,
                  (unsigned long long)(file_size - off));
            break;
        }
        if ((rc = read_exact(&w, off, b, DSRT_TAR_BLOCK)) != 0) break;
        if (is_zero_block(b)) break; /* the end-of-archive marker */
        if (!checksum_ok(b)) {
            uint64_t next = resync(&w, off);
            if (next == UINT64_MAX) {
                warnf(&w,
                      "%s: damaged header at byte %llu and no valid header after it: the rest "
                      "of the shard is skipped",
                      name, (unsigned long long)off);
                break;
            }
            warnf(&w,
                  "%s: damaged header at byte %llu: skipped to the next valid header, at "
                  "byte %llu",
                  name, (unsigned long long)off, (unsigned long long)next);
            w.have_long = w.have_pax_size = 0;
            off = next;
            continue;
        }
        char type = (char)b[156];
        uint64_t size = 0;
        if (tar_number(b + 124, 12, &size) != 0) {
            warnf(&w,
                  "%s: header at byte %llu: size field is not a number: the rest of the shard "
                  "is skipped",
                  name, (unsigned long long)off);
            break;
        }
        /* Members of these types carry no data whatever their size field says. */
        int no_data =
            type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6';
        if (w.have_pax_size && !no_data) size = w.pax_size;
        if (no_data) size = 0;
        uint64_t data = off + DSRT_TAR_BLOCK;
        uint64_t padded = size > UINT64_MAX - 2 * DSRT_TAR_BLOCK
                              ? UINT64_MAX
                              : (size + DSRT_TAR_BLOCK - 1) / DSRT_TAR_BLOCK * DSRT_TAR_BLOCK;
        int truncated = size > file_size - data;

        if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
            int r = extended(&w, type, off, data, size, truncated);
            if (r != 0) {
                rc = r < 0 ? r : 0;
                break;
            }
            off = data + padded;
            continue;
        }

        size_t len = member_name(&w, b, name_buf);
        w.have_long = w.have_pax_size = 0;

        dsrt_tar_member m = {
            .name = name_buf,
            .name_len = len,
            .header = off,
            .offset = data,
            .size = size,
            .type = type == '\0' || type == '7' ? '0' : type,
            .truncated = truncated,
        };
        if ((rc = member(ctx, &m)) != 0) break;
        if (truncated) break;
        off = data + padded;
    }
out:
    free(name_buf);
    free(w.long_name);
    free(w.ext);
    return rc;
}

// ----------------------------------------------------------------------------
// Writing and names

int dsrt__tar_header_make(uint8_t block[DSRT_TAR_BLOCK], const char *name, uint64_t size,
                          int64_t mtime) {
    size_t len = strlen(name);
    if (len == 0 || len > 100)
        return dsrt__fail(DSRT_EOPTION, "tar: member name '%s' is not 1 to 100 bytes", name);
    if (size >= (uint64_t)1 << 33)
        return dsrt__fail(DSRT_ETOOBIG, "tar: member %s: %llu bytes, more than ustar's 8 GiB", name,
                          (unsigned long long)size);
    memset(block, 0, DSRT_TAR_BLOCK);
    memcpy(block, name, len);
    tar_octal(block + 100, 8, 0644);
    tar_octal(block + 108, 8, 0);
    tar_octal(block + 116, 8, 0);
    tar_octal(block + 124, 12, size);
    tar_octal(block + 136, 12, mtime > 0 && mtime < ((int64_t)1 << 33) ? (uint64_t)mtime : 0);
    block[156] = '0';
    memcpy(block + 257,
           "ustar\0"
           "00",
           8);
    uint64_t sum = 0;
    memset(block + 148, ' ', 8);
    for (size_t i = 0; i < DSRT_TAR_BLOCK; i++) sum += block[i];
    /* Six octal digits, a NUL and a space, as tar writes the checksum. */
    tar_octal(block + 148, 7, sum);
    block[155] = ' ';
    return 0;
}

int dsrt__tar_split_key(const char *name, size_t len, size_t *key_len, const char **ext,
                        size_t *ext_len) {
    size_t base = len;
    while (base > 0 && name[base - 1] != '/') base--;
    const char *dot = memchr(name + base, '.', len - base);
    if (!dot || dot == name + base || dot + 1 == name + len) return 0;
    *key_len = (size_t)(dot - name);
    *ext = dot + 1;
    *ext_len = len - *key_len - 1;
    return 1;
}
