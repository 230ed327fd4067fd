/*
 * The ZIP source: an archive of images opened as a datastore, the way
 * Kaggle and many dataset sites ship them ("dsbench photos.zip", "dstrain
 * train --data train.zip", s3://bucket/photos.zip).
 *
 * Opening reads the central directory once, from the end of the archive
 * (the end record, ZIP64's when the archive needs it, and the directory in
 * one read or one ranged GET), into the index: nothing else of the archive
 * is read. The members are labelled by the folders inside the archive as a
 * folder's files are (datastore/index/paths.c: class folders, parent
 * folders or none, the extensions, sub-folders, empty classes, ImageFolder's
 * order), so an archive of a folder gives the folder's classes, order and
 * batches. Where every member lies in one top folder that holds
 * sub-folders ("zip -r photos.zip photos"), that folder is the root, as it
 * would be opened on disk; macOS's __MACOSX/ resource forks are left out.
 *
 * Each sample is a byte range of the archive, read like a shard's member
 * (datastore/sources/members: ranges through the io engine or ranged GETs,
 * neighbours merged, the exact or the shard order): from its local header
 * to the next member, which the codec below turns into the file: the local
 * header checked against the central directory, a stored member's bytes
 * moved to the buffer's start, a deflated one inflated (zlib) and checked
 * against its CRC-32. A stored member is taken as its bytes, as a tar
 * member is; the decoder judges them.
 *
 * Hostile archives. What the central directory says is checked before
 * anything is indexed, and an archive that lies is refused, named: members
 * that overlap (zip bombs overlap them to multiply their output), members
 * or a directory past the end of the archive, names with a ".." component,
 * an absolute path or a NUL byte, counts and sizes the directory cannot
 * hold, several disks. A member that cannot be read is a bad sample like a
 * bad file, named with its archive and reason: encrypted, compressed with a
 * method other than deflate, claiming more than deflate can give from its
 * compressed size (a compression-ratio bomb: no buffer is taken for it),
 * inflating to more or less than it claims, a wrong CRC, a local header
 * that disagrees with the directory.
 */
#include "datastore/sources/zip/zip.h"

#include "datastore/bytes/http.h"
#include "datastore/bytes/url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define EOCD_SIG      0x06054b50u
#define EOCD64_SIG    0x06064b50u
#define LOC64_SIG     0x07064b50u
#define CEN_SIG       0x02014b50u
#define LOC_SIG       0x04034b50u
#define EOCD_LEN      22
#define LOC64_LEN     20
#define EOCD64_LEN    56
#define CEN_LEN       46
#define LOC_LEN       30
#define COMMENT_MAX   65535
#define CD_MAX        ((uint64_t)1 << 31) /* bytes of central directory read at most */
#define DEFLATE_RATIO 1032                /* deflate's largest ratio (runs of one byte) */
#define MACOS_JUNK    "__MACOSX/"

static uint16_t le16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

// ----------------------------------------------------------------------------
// The archive: a file, an object in a store, or memory

typedef struct {
    const char *path; /* as given */
    char display[512];
    uint64_t size;
    uint64_t version;   /* an object's ETag and size (dsrt__cache_version), 0: not known */
    int fd;             /* a local file, or -1 */
    dsrt_http *http;    /* an object, or NULL */
    const uint8_t *mem; /* memory, or NULL */
} archive;

/* Reads len bytes at off: all of them, or fails naming the archive. */
static int archive_read(archive *a, uint64_t off, void *buf, size_t len) {
    if (off > a->size || len > a->size - off)
        return dsrt__fail(DSRT_ECORRUPT, "zip: %s: a read past the end of the archive (%llu bytes)",
                          a->display, (unsigned long long)a->size);
    if (a->mem) {
        memcpy(buf, a->mem + off, len);
        return 0;
    }
    if (a->http) {
        size_t got;
        uint64_t total;
        int rc = dsrt__http_fetch_range(a->http, a->path, off, len, buf, &got, &total);
        if (rc == 0 && got != len) rc = DSRT_ETRUNCATED;
        if (rc == 0 && total != UINT64_MAX && total != a->size)
            rc = dsrt__fail(DSRT_ECORRUPT, "zip: %s: %llu bytes now, %llu when it was opened",
                            a->display, (unsigned long long)total, (unsigned long long)a->size);
        return rc ? dsrt__fail_prefix(rc, "zip") : 0;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(a->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dsrt__fail(-errno, "zip: %s: %s", a->display, strerror(errno));
        if (r == 0)
            return dsrt__fail(DSRT_ETRUNCATED, "zip: %s: shorter than it was (%llu bytes)",
                              a->display, (unsigned long long)a->size);
        got += (size_t)r;
    }
    return 0;
}

/* Opens the archive at path (a local file or a URL) for reading its end. */
static int archive_open(archive *a, const char *path, const dsrt_datastore_options *o) {
    a->path = path;
    a->fd = -1;
    dsrt_text_redact(path, a->display, sizeof a->display);
    if (!dsrt__is_url(path)) {
        struct stat st;
        int rc = dsrt__open_regular(path, &a->fd, &st);
        if (rc != 0) return dsrt__fail_prefix(rc, "zip");
        a->size = (uint64_t)st.st_size;
        return 0;
    }
    int rc = dsrt__http_create_opening(&a->http, o, 1);
    if (rc != 0) return rc;
    /* The object's size: the first answer's Content-Range. */
    uint8_t b;
    size_t got;
    uint64_t total;
    rc = dsrt__http_fetch_range(a->http, path, 0, 1, &b, &got, &total);
    if (rc != 0 && rc != DSRT_ETRUNCATED) return dsrt__fail_prefix(rc, "zip");
    if (total == UINT64_MAX)
        return dsrt__fail(DSRT_EREMOTE,
                          "zip: %s: the server does not say the object's size (no "
                          "Content-Range or Content-Length)",
                          a->display);
    a->size = total;
    a->version = dsrt__http_delivered_version(a->http);
    return 0;
}

static void archive_close(archive *a) {
    if (a->fd >= 0) close(a->fd);
    dsrt__http_destroy(a->http);
}

// ----------------------------------------------------------------------------
// The end records

/* Where the central directory is, and what it holds. */
typedef struct {
    uint64_t entries, cd_size, cd_offset; /* as the end record says */
    uint64_t shift;                       /* bytes before the archive (a self-extractor's) */
} end_record;

/* Finds the end of central directory record in the archive's last bytes,
 * and ZIP64's where there is one. */
static int find_end(archive *a, end_record *e) {
    size_t tail =
        (size_t)DSRT_MIN(a->size, (uint64_t)(EOCD_LEN + COMMENT_MAX + LOC64_LEN + EOCD64_LEN));
    if (a->size < EOCD_LEN)
        return dsrt__fail(DSRT_EFORMAT, "zip: %s: not a ZIP archive (%llu bytes)", a->display,
                          (unsigned long long)a->size);
    uint8_t *t = dsrt__malloc(tail);
    if (!t) return -ENOMEM;
    uint64_t base = a->size - tail;
    int rc = archive_read(a, base, t, tail);
    if (rc != 0) goto out;
    /* The last signature whose record fits, the comment included. */
    size_t at = SIZE_MAX;
    for (size_t i = tail - EOCD_LEN + 1; i-- > 0;)
        if (le32(t + i) == EOCD_SIG && i + EOCD_LEN + le16(t + i + 20) <= tail) {
            at = i;
            break;
        }
    if (at == SIZE_MAX) {
        rc = dsrt__fail(DSRT_EFORMAT, "zip: %s: no end of central directory: not a ZIP archive",
                        a->display);
        goto out;
    }
    const uint8_t *r = t + at;
    if (le16(r + 4) != 0 || le16(r + 6) != 0 || le16(r + 8) != le16(r + 10)) {
        rc = dsrt__fail(DSRT_EUNSUPPORTED, "zip: %s: an archive split over several disks",
                        a->display);
        goto out;
    }
    e->entries = le16(r + 10);
    e->cd_size = le32(r + 12);
    e->cd_offset = le32(r + 16);
    uint64_t cd_end = base + at; /* where the directory must end */
    if (at >= LOC64_LEN && le32(r - LOC64_LEN) == LOC64_SIG) {
        /* ZIP64: its end record lies just before the locator. */
        if (at < LOC64_LEN + EOCD64_LEN || le32(r - LOC64_LEN - EOCD64_LEN) != EOCD64_SIG) {
            rc = dsrt__fail(DSRT_ECORRUPT, "zip: %s: a ZIP64 locator without its end record",
                            a->display);
            goto out;
        }
        const uint8_t *z = r - LOC64_LEN - EOCD64_LEN;
        if (le32(z + 16) != 0 || le32(z + 20) != 0 || le64(z + 24) != le64(z + 32)) {
            rc = dsrt__fail(DSRT_EUNSUPPORTED, "zip: %s: an archive split over several disks",
                            a->display);
            goto out;
        }
        e->entries = le64(z + 32);
        e->cd_size = le64(z + 40);
        e->cd_offset = le64(z + 48);
        cd_end -= LOC64_LEN + EOCD64_LEN;
    } else if (e->entries == 0xffff || e->cd_size == 0xffffffffu || e->cd_offset == 0xffffffffu) {
        rc = dsrt__fail(DSRT_ECORRUPT, "zip: %s: ZIP64 sizes without a ZIP64 end record",
                        a->display);
        goto out;
    }
    if (e->cd_size > cd_end || e->cd_offset > cd_end - e->cd_size) {
        rc = dsrt__fail(DSRT_ECORRUPT,
                        "zip: %s: the central directory (%llu bytes at %llu) lies past the end "
                        "of the archive",
                        a->display, (unsigned long long)e->cd_size,
                        (unsigned long long)e->cd_offset);
        goto out;
    }
    e->shift = cd_end - e->cd_size - e->cd_offset;
    if (e->cd_size > CD_MAX || e->entries > e->cd_size / CEN_LEN) {
        rc = dsrt__fail(e->cd_size > CD_MAX ? DSRT_ETOOBIG : DSRT_ECORRUPT,
                        "zip: %s: %llu members in a central directory of %llu bytes", a->display,
                        (unsigned long long)e->entries, (unsigned long long)e->cd_size);
        goto out;
    }
out:
    free(t);
    return rc;
}

// ----------------------------------------------------------------------------
// The central directory

/* One member as the central directory describes it. */
typedef struct {
    const char *name; /* in the directory's bytes */
    uint16_t name_len;
    uint16_t method, flags;
    uint32_t crc;
    uint64_t csize, usize, lho; /* lho: of its local header, in the file */
} member;

/* What a sample's codec needs (by index position). */
typedef struct {
    uint64_t csize, usize;
    uint32_t crc;
    uint16_t method, flags;
} zmember;

/* The sizes and offset the ZIP64 extra field gives where the fixed fields
 * say 0xffffffff. */
static int zip64_extra(const uint8_t *x, size_t xlen, member *m, int need_u, int need_c,
                       int need_o) {
    while (xlen >= 4) {
        uint16_t id = le16(x), len = le16(x + 2);
        if ((size_t)len > xlen - 4) break;
        if (id == 0x0001) {
            const uint8_t *p = x + 4, *end = x + 4 + len;
            if (need_u) {
                if (end - p < 8) return -1;
                m->usize = le64(p);
                p += 8;
            }
            if (need_c) {
                if (end - p < 8) return -1;
                m->csize = le64(p);
                p += 8;
            }
            if (need_o) {
                if (end - p < 8) return -1;
                m->lho = le64(p);
            }
            return 0;
        }
        x += 4 + len;
        xlen -= 4 + (size_t)len;
    }
    return need_u || need_c || need_o ? -1 : 0;
}

/* 1 when a member's name may not be indexed: a NUL byte, an absolute path,
 * a ".." component (with '/' or '\\' between components). */
static int name_unsafe(const char *s, size_t n) {
    if (memchr(s, '\0', n) || (n > 0 && (s[0] == '/' || s[0] == '\\'))) return 1;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && s[j] != '/' && s[j] != '\\') j++;
        if (j - i == 2 && s[i] == '.' && s[i + 1] == '.') return 1;
        i = j + 1;
    }
    return 0;
}

/* Parses the directory's n entries into m[0..n). */
static int parse_directory(const archive *a, const uint8_t *cd, uint64_t len, const end_record *e,
                           member *m) {
    uint64_t at = 0;
    for (uint64_t k = 0; k < e->entries; k++) {
        if (len - at < CEN_LEN || le32(cd + at) != CEN_SIG)
            return dsrt__fail(DSRT_ECORRUPT, "zip: %s: central directory entry %llu is damaged",
                              a->display, (unsigned long long)k);
        const uint8_t *h = cd + at;
        uint16_t nlen = le16(h + 28), xlen = le16(h + 30), clen = le16(h + 32);
        if ((uint64_t)CEN_LEN + nlen + xlen + clen > len - at)
            return dsrt__fail(DSRT_ECORRUPT,
                              "zip: %s: central directory entry %llu runs past the directory",
                              a->display, (unsigned long long)k);
        member *x = &m[k];
        x->name = (const char *)h + CEN_LEN;
        x->name_len = nlen;
        x->flags = le16(h + 8);
        x->method = le16(h + 10);
        x->crc = le32(h + 16);
        x->csize = le32(h + 20);
        x->usize = le32(h + 24);
        x->lho = le32(h + 42);
        int nu = x->usize == 0xffffffffu, nc = x->csize == 0xffffffffu, no = x->lho == 0xffffffffu;
        if (le16(h + 34) != 0 && le16(h + 34) != 0xffff)
            return dsrt__fail(DSRT_EUNSUPPORTED, "zip: %s: %.*s: on another disk", a->display,
                              (int)nlen, x->name);
        if (zip64_extra(h + CEN_LEN + nlen, xlen, x, nu, nc, no) != 0)
            return dsrt__fail(DSRT_ECORRUPT, "zip: %s: %.*s: its ZIP64 sizes are missing",
                              a->display, (int)nlen, x->name);
        if (name_unsafe(x->name, nlen))
            return dsrt__fail(DSRT_ECORRUPT,
                              "zip: %s: member '%.*s': an absolute path, a '..' component or a "
                              "NUL byte in a name: refused",
                              a->display, (int)DSRT_MIN(nlen, 200), x->name);
        if (x->lho > UINT64_MAX - e->shift)
            return dsrt__fail(DSRT_ECORRUPT, "zip: %s: %.*s: an offset past any file", a->display,
                              (int)nlen, x->name);
        x->lho += e->shift;
        at += CEN_LEN + (uint64_t)nlen + xlen + clen;
    }
    return 0;
}

static int by_offset(const void *pa, const void *pb, void *ctx) {
    const member *m = ctx;
    uint64_t a = m[*(const uint32_t *)pa].lho, b = m[*(const uint32_t *)pb].lho;
    return a < b ? -1 : a > b;
}

/* Refuses members that overlap or lie past the directory, and gives each
 * its range: from its local header to the next member (the directory for
 * the last). sorted: the members in file order. */
static int check_ranges(const archive *a, const member *m, const uint32_t *sorted, size_t n,
                        uint64_t cd_start, uint64_t *range) {
    for (size_t i = 0; i < n; i++) {
        const member *x = &m[sorted[i]];
        uint64_t next = i + 1 < n ? m[sorted[i + 1]].lho : cd_start;
        /* The least a member takes: its local header, its name, its data. */
        uint64_t least = LOC_LEN + (uint64_t)x->name_len;
        if (x->csize > UINT64_MAX - least - x->lho || x->lho + least + x->csize > cd_start)
            return dsrt__fail(DSRT_ECORRUPT,
                              "zip: %s: member '%.*s' (%llu bytes at %llu) runs past the end of "
                              "the archive's members: refused",
                              a->display, (int)x->name_len, x->name, (unsigned long long)x->csize,
                              (unsigned long long)x->lho);
        if (x->lho + least + x->csize > next) {
            const member *y = &m[sorted[i + 1]];
            return dsrt__fail(DSRT_ECORRUPT,
                              "zip: %s: members '%.*s' and '%.*s' overlap (as in a zip bomb): "
                              "refused",
                              a->display, (int)x->name_len, x->name, (int)y->name_len, y->name);
        }
        range[sorted[i]] = next - x->lho;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Reading a member: the codec of the shard set

/* What the set keeps for its codec. */
typedef struct {
    zmember *m; /* (n) by index position */
} zip_data;

static void zip_data_free(void *p) {
    zip_data *z = p;
    if (!z) return;
    free(z->m);
    free(z);
}

/* Whether the sizes can be: a stored member is its size, a deflated one is
 * at most deflate's largest ratio of it. */
static int plausible(const zmember *m) {
    if (m->method == 0) return m->usize == m->csize;
    if (m->method == 8)
        return m->csize >= (UINT64_MAX - 1024) / DEFLATE_RATIO ||
               m->usize <= m->csize * DEFLATE_RATIO + 1024;
    return 1;
}

static uint64_t zip_decoded_size(const dsrt_shardset *s, uint32_t p) {
    const zmember *m = &((const zip_data *)s->codec_data)->m[p];
    return plausible(m) ? m->usize : 0; /* no buffer for a bomb's claim */
}

static const char *method_name(unsigned method) {
    switch (method) {
    case 9:
        return "Deflate64";
    case 12:
        return "bzip2";
    case 14:
        return "LZMA";
    case 93:
        return "Zstandard";
    case 95:
        return "XZ";
    case 99:
        return "AES";
    default:
        return "unknown";
    }
}

/* Inflates the raw deflate stream src[0..m->csize) into dst (m->usize
 * bytes), checking its length and CRC-32. */
static int inflate_member(const zmember *m, const char *path, const uint8_t *src, uint8_t *dst) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK)
        return dsrt__fail(-ENOMEM, "read: %s: out of memory for inflate", path);
    uint64_t in_left = m->csize, out_left = m->usize;
    int zr;
    z.next_in = (Bytef *)src;
    z.next_out = dst;
    for (;;) {
        /* zlib counts in uInt: a gigabyte at a time. */
        if (z.avail_in == 0 && in_left) {
            z.avail_in = (uInt)DSRT_MIN(in_left, (uint64_t)1 << 30);
            in_left -= z.avail_in;
        }
        if (z.avail_out == 0 && out_left) {
            z.avail_out = (uInt)DSRT_MIN(out_left, (uint64_t)1 << 30);
            out_left -= z.avail_out;
        }
        zr = inflate(&z, Z_NO_FLUSH);
        if (zr == Z_OK) continue;
        if (zr == Z_BUF_ERROR && ((z.avail_in == 0 && in_left) || (z.avail_out == 0 && out_left)))
            continue;
        break;
    }
    uint64_t out = z.total_out;
    int more = zr != Z_STREAM_END && z.avail_out == 0 && out_left == 0 && (z.avail_in || in_left);
    inflateEnd(&z);
    if (zr == Z_MEM_ERROR) return dsrt__fail(-ENOMEM, "read: %s: out of memory for inflate", path);
    if (more)
        return dsrt__fail(DSRT_ECORRUPT,
                          "read: %s: inflates past the %llu bytes it claims (a compression "
                          "bomb?)",
                          path, (unsigned long long)m->usize);
    if (zr != Z_STREAM_END || out != m->usize)
        return dsrt__fail(DSRT_ECORRUPT,
                          "read: %s: the deflated data is damaged (%llu of %llu bytes inflated)",
                          path, (unsigned long long)out, (unsigned long long)m->usize);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t at = 0; at < m->usize;) {
        uInt step = (uInt)DSRT_MIN(m->usize - at, (uint64_t)1 << 30);
        crc = crc32(crc, dst + at, step);
        at += step;
    }
    if ((uint32_t)crc != m->crc)
        return dsrt__fail(DSRT_ECHECKSUM, "read: %s: CRC-32 %08x, the directory says %08x", path,
                          (unsigned)crc, (unsigned)m->crc);
    return 0;
}

static int zip_decode(const dsrt_shardset *s, uint32_t p, const char *path, uint8_t *buf,
                      size_t cap, size_t got, size_t *size) {
    const zmember *m = &((const zip_data *)s->codec_data)->m[p];
    const char *name = path + s->member[p];
    size_t nlen = strlen(name);
    if (m->flags & 1)
        return dsrt__fail(DSRT_EUNSUPPORTED, "read: %s: an encrypted member: dsrt decrypts nothing",
                          path);
    if (m->method != 0 && m->method != 8)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "read: %s: compressed with method %u (%s): dsrt reads stored and "
                          "deflated members",
                          path, (unsigned)m->method, method_name(m->method));
    if (!plausible(m))
        return dsrt__fail(DSRT_ECORRUPT,
                          "read: %s: claims %llu bytes from %llu %s (a compression-ratio "
                          "bomb): not read",
                          path, (unsigned long long)m->usize, (unsigned long long)m->csize,
                          m->method ? "deflated" : "stored");
    if (got < LOC_LEN || le32(buf) != LOC_SIG)
        return dsrt__fail(DSRT_ECORRUPT,
                          "read: %s: no local header where the central directory puts it", path);
    size_t data = LOC_LEN + (size_t)le16(buf + 26) + le16(buf + 28);
    if (le16(buf + 8) != m->method || le16(buf + 26) != nlen || got < LOC_LEN + nlen ||
        memcmp(buf + LOC_LEN, name, nlen) != 0)
        return dsrt__fail(DSRT_ECORRUPT,
                          "read: %s: the local header disagrees with the central directory", path);
    if (data > got || m->csize > got - data)
        return dsrt__fail(DSRT_ETRUNCATED,
                          "read: %s: member cut short (%zu of %llu bytes): the archive is "
                          "damaged",
                          path, got > data ? got - data : 0, (unsigned long long)m->csize);
    if (m->usize > cap)
        return dsrt__fail(DSRT_ETOOBIG, "read: %s: %llu bytes, larger than the buffer", path,
                          (unsigned long long)m->usize);
    if (m->method == 0) {
        memmove(buf, buf + data, (size_t)m->csize);
        *size = (size_t)m->csize;
        return 0;
    }
    /* Deflated: out of the buffer into it, so the compressed bytes move. */
    uint8_t *src = dsrt__malloc(m->csize ? (size_t)m->csize : 1);
    if (!src) return -ENOMEM;
    memcpy(src, buf + data, (size_t)m->csize);
    int rc = inflate_member(m, path, src, buf);
    free(src);
    if (rc == 0) *size = (size_t)m->usize;
    return rc;
}

static const dsrt_member_codec ZIP_CODEC = {.decoded_size = zip_decoded_size, .decode = zip_decode};

// ----------------------------------------------------------------------------
// The index

/* 1 for a member of macOS's resource forks (__MACOSX/...). */
static int junk(const member *x) {
    size_t n = sizeof MACOS_JUNK - 1;
    return x->name_len >= n && memcmp(x->name, MACOS_JUNK, n) == 0;
}

/* The folder every member lies in when it is the root ("zip -r photos.zip
 * photos"): every name starts with one top folder and some file lies in a
 * sub-folder of it. Its length with the '/' (*first: a name that starts
 * with it), or 0. */
static size_t wrapper(const member *m, size_t n, const char **first) {
    size_t top = 0;
    int deeper = 0;
    *first = NULL;
    for (size_t k = 0; k < n; k++) {
        const char *s = m[k].name;
        size_t len = m[k].name_len;
        if (junk(&m[k])) continue;
        if (!*first) {
            const char *slash = memchr(s, '/', len);
            if (!slash || slash == s) return 0;
            *first = s;
            top = (size_t)(slash - s) + 1;
        }
        if (len < top || memcmp(s, *first, top) != 0) return 0;
        if (len > top && s[len - 1] != '/' && memchr(s + top, '/', len - top)) deeper = 1;
    }
    return deeper ? top : 0;
}

/* Indexes the members by the folder rules: the paths "ARCHIVE:MEMBER", the
 * labels, and which member each index position is (*which). */
static int index_members(dsrt_index *ix, const archive *a, const member *m, size_t n,
                         const dsrt_datastore_options *o, uint32_t **which) {
    const char *first;
    size_t top = wrapper(m, n, &first), left_out = 0;
    size_t plen = strlen(a->path);
    char *root = dsrt__malloc(plen + 1 + top + 1);
    if (!root) return -ENOMEM;
    /* The root: the archive, or its top folder, so that each path still
     * names its member whole. */
    memcpy(root, a->path, plen);
    root[plen] = ':';
    memcpy(root + plen + 1, top ? first : "", top);
    size_t rlen = top ? plen + top : plen; /* without the top folder's '/' */
    /* The folder files in the root lie in: the top folder, or the archive
     * as the folder it was made of ("photos.zip": "photos"). */
    char base[256];
    const char *file = strrchr(a->path, '/') ? strrchr(a->path, '/') + 1 : a->path;
    size_t fl = strlen(file);
    if (top)
        snprintf(base, sizeof base, "%.*s", (int)(top - 1), first);
    else
        snprintf(base, sizeof base, "%.*s", (int)(dsrt__ends_with_ci(file, ".zip") ? fl - 4 : fl),
                 file);
    dsrt_names *names;
    int rc = dsrt__names_create(&names, ix, o, root, rlen, top ? '/' : ':', base);
    for (size_t k = 0; rc == 0 && k < n; k++) {
        if (junk(&m[k])) {
            left_out++;
            continue;
        }
        if (top && m[k].name_len == top) continue; /* the top folder's own entry */
        rc = dsrt__names_take(names, m[k].name + top, m[k].name_len - top, (uint32_t)k);
    }
    if (rc == 0 && left_out)
        dsrt__index_warn(ix, "%s: %zu member%s under %s (macOS resource forks) left out",
                         a->display, left_out, left_out == 1 ? "" : "s", MACOS_JUNK);
    if (rc == 0) rc = dsrt__names_finish(names, which, NULL);
    dsrt__names_destroy(names);
    free(root);
    return rc;
}

/* Fills the shard set of ix: one shard, the archive, and each sample's
 * range and codec data. */
static int fill_set(dsrt_index *ix, const archive *a, const member *m, const uint64_t *range,
                    const uint32_t *which) {
    dsrt_shardset *s = dsrt__shardset_new(ix, 1, ix->n);
    zip_data *z = dsrt__calloc(1, sizeof *z);
    if (z) z->m = dsrt__calloc(ix->n ? ix->n : 1, sizeof *z->m);
    if (!s || !z || !z->m) {
        zip_data_free(z);
        return -ENOMEM;
    }
    s->codec = &ZIP_CODEC;
    s->codec_data = z;
    s->codec_free = zip_data_free;
    s->shards[0] =
        (dsrt_shard){.size = a->size, .first = 0, .count = (uint32_t)ix->n, .version = a->version};
    if (!(s->shards[0].path = dsrt__arena_strndup(&ix->arena, a->path, strlen(a->path))))
        return -ENOMEM;
    uint32_t member_at = (uint32_t)strlen(a->path) + 1;
    for (size_t i = 0; i < ix->n; i++) {
        const member *x = &m[which[i]];
        s->offset[i] = x->lho;
        s->size[i] = range[which[i]];
        s->shard_of[i] = 0;
        s->member[i] = member_at;
        z->m[i] = (zmember){.csize = x->csize,
                            .usize = x->usize,
                            .crc = x->crc,
                            .method = x->method,
                            .flags = x->flags};
    }
    s->indexed = 1; /* the central directory describes every member */
    s->remote = ix->remote;
    return 0;
}

/* Reads the central directory of archive a into ix. */
static int zip_index(dsrt_index *ix, archive *a, const dsrt_datastore_options *o) {
    end_record e = {0};
    uint8_t *cd = NULL;
    member *m = NULL;
    uint32_t *sorted = NULL, *which = NULL;
    uint64_t *range = NULL;
    int rc = find_end(a, &e);
    if (rc != 0) return rc;
    size_t n = (size_t)e.entries;
    if (n > UINT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "zip: %s: %zu members, more than 2^32-1", a->display, n);
    rc = -ENOMEM;
    cd = dsrt__malloc(e.cd_size ? (size_t)e.cd_size : 1);
    m = dsrt__calloc(n ? n : 1, sizeof *m);
    sorted = dsrt__malloc((n ? n : 1) * sizeof *sorted);
    range = dsrt__calloc(n ? n : 1, sizeof *range);
    if (!cd || !m || !sorted || !range) goto out;
    if ((rc = archive_read(a, e.cd_offset + e.shift, cd, (size_t)e.cd_size)) != 0) goto out;
    if ((rc = parse_directory(a, cd, e.cd_size, &e, m)) != 0) goto out;
    for (size_t k = 0; k < n; k++) sorted[k] = (uint32_t)k;
    if (n > 1) qsort_r(sorted, n, sizeof *sorted, by_offset, m);
    if ((rc = check_ranges(a, m, sorted, n, e.cd_offset + e.shift, range)) != 0) goto out;
    if ((rc = index_members(ix, a, m, n, o, &which)) != 0) goto out;
    rc = fill_set(ix, a, m, range, which);
    if (rc == 0) dsrt__shardset_settle(ix->data, o, a->path);
out:
    free(cd);
    free(m);
    free(sorted);
    free(range);
    free(which);
    return rc;
}

static int zip_open(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    archive a = {0};
    ix->remote = dsrt__is_url(path);
    int rc = archive_open(&a, path, o);
    if (rc == 0) rc = zip_index(ix, &a, o);
    archive_close(&a);
    return rc;
}

int dsrt__zip_open_memory(dsrt_index *ix, const char *name, const uint8_t *buf, size_t len,
                          const dsrt_datastore_options *o) {
    archive a = {.path = name, .fd = -1, .mem = buf, .size = len};
    snprintf(a.display, sizeof a.display, "%s", name);
    return zip_index(ix, &a, o);
}

// ----------------------------------------------------------------------------
// The source

/* An archive by its first bytes (a local header, or the end record of an
 * empty archive) or its name (a self-extractor starts with a program). */
static int detect(const dsrt_probe *p) {
    if (!p->exists || p->folder) return 0;
    int magic = p->got >= 4 && p->head[0] == 'P' && p->head[1] == 'K' &&
                ((p->head[2] == 3 && p->head[3] == 4) || (p->head[2] == 5 && p->head[3] == 6));
    return magic || dsrt__ends_with_ci(p->path, ".zip");
}

static int detect_url(const char *url, const dsrt_datastore_options *o) {
    (void)o;
    char name[1024];
    const char *q = strchr(url, '?');
    snprintf(name, sizeof name, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
    return dsrt__ends_with_ci(name, ".zip");
}

const dsrt_source_ops dsrt__source_zip = {
    .kind = DSRT_SOURCE_ZIP,
    .what = "a ZIP archive",
    .empty = "; check the extensions option",
    .detect = detect,
    .detect_url = detect_url,
    .open = zip_open,
    .open_url = zip_open,
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
