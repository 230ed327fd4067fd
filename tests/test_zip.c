/*
 * Tests of the ZIP source: an archive of a folder opens as the folder does
 * (every label mode, sub-folders or not, extensions; stored and deflated
 * members, ZIP64, a top folder, bytes before the archive, macOS's
 * __MACOSX/), reads every member's bytes as they are, and gives the
 * folder's batches in the exact order and every sample once an epoch in
 * the shard order. Hostile archives are refused or their members are bad
 * samples, named, never a crash: overlapping members, sizes past the end,
 * names with "..", an absolute path or a NUL byte, a directory that lies,
 * compression-ratio bombs, members that inflate past what they claim, a
 * wrong CRC, encryption, other methods, a local header that disagrees.
 *
 * Against a trusted implementation: archives that Python's zipfile writes
 * at random (stored and deflated, ZIP64, streamed with data descriptors,
 * comments, UTF-8 names, folders, members that are no image) and extracts
 * must give dsrt the extracted folder's index and bytes. And an archive in
 * an S3 bucket (moto, as test_s3) opens and reads as the local one; that
 * case skips where the server's packages cannot be installed.
 */
#include <dsrt.h>

#include "datastore/sources/source.h"
#include "datastore/sources/zip/zip.h"
#include "task.h"
#include "testimg.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static char root[4096];

// ----------------------------------------------------------------------------
// Files and archives

typedef struct {
    char name[256]; /* relative to the folder */
    uint8_t *data;
    size_t len;
} file;

typedef struct {
    file *f;
    size_t n;
} fileset;

static void fileset_free(fileset *s) {
    for (size_t i = 0; i < s->n; i++) free(s->f[i].data);
    free(s->f);
}

/* n images in dir/class<c>/[sub/]img<NNN>.jpg|png, and a text file. */
static fileset make_folder(const char *dir, size_t n, int classes) {
    fileset s = {calloc(n + 1, sizeof(file)), 0};
    REQUIRE(s.f);
    for (size_t i = 0; i <= n; i++) {
        int c = (int)(i * (size_t)classes / (n + 1));
        file *f = &s.f[s.n++];
        uint32_t h = timg_hash((uint32_t)i + 11);
        int w = 40 + (int)(h % 50), ht = 36 + (int)((h >> 8) % 40);
        if (i == n) {
            snprintf(f->name, sizeof f->name, "class0/notes.txt");
            f->data = (uint8_t *)strdup("not an image\n");
            f->len = strlen((char *)f->data);
        } else if (i % 5 == 2) {
            f->data = timg_make_png(TIMG_PNG_RGB8, w, ht, (uint32_t)i, &f->len, NULL);
            snprintf(f->name, sizeof f->name, "class%d/img%03zu.png", c, i);
        } else {
            f->data =
                timg_make_jpeg(i % 2 ? TIMG_JPEG_420 : TIMG_JPEG_444, w, ht, (uint32_t)i, &f->len);
            snprintf(f->name, sizeof f->name, "class%d/%simg%03zu.jpg", c, i % 3 ? "" : "sub/", i);
        }
        REQUIRE(f->data);
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        char *slash = strrchr(path, '/');
        *slash = '\0';
        REQUIRE(timg_mkdirs(path) == 0);
        *slash = '/';
        REQUIRE(timg_write_file(path, f->data, f->len) == 0);
    }
    return s;
}

typedef struct {
    uint8_t *b;
    size_t len, cap;
} zbuf;

static void put(zbuf *z, const void *p, size_t n) {
    if (z->len + n > z->cap) {
        z->cap = (z->len + n) * 2 + 4096;
        z->b = realloc(z->b, z->cap);
        REQUIRE(z->b);
    }
    memcpy(z->b + z->len, p, n);
    z->len += n;
}
static void put16(zbuf *z, unsigned v) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(z, b, 2);
}
static void put32(zbuf *z, uint32_t v) {
    put16(z, v & 0xffff);
    put16(z, v >> 16);
}
static void put64(zbuf *z, uint64_t v) {
    put32(z, (uint32_t)v);
    put32(z, (uint32_t)(v >> 32));
}

/* One member to write: method 0 stored, 8 deflated. */
typedef struct {
    const char *name;
    const uint8_t *data;
    size_t len;
    int method;
} zent;

/* Where each member's fields lie in the archive, for tests that damage them. */
typedef struct {
    size_t local, central; /* offsets of its local header and central entry */
} zplace;

/* An archive of n members (ZIP64 records and extra fields when zip64), with
 * prefix bytes before it. */
static uint8_t *zip_make(const zent *e, size_t n, int zip64, size_t prefix, size_t *len,
                         zplace *places) {
    zbuf z = {0}, cd = {0};
    for (size_t i = 0; i < prefix; i++) put(&z, "#", 1);
    for (size_t k = 0; k < n; k++) {
        uLong crc = crc32(0, e[k].data, (uInt)e[k].len);
        uint8_t *data = (uint8_t *)e[k].data;
        size_t clen = e[k].len;
        uint8_t *comp = NULL;
        if (e[k].method == 8) {
            z_stream s = {0};
            REQUIRE(deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
            comp = malloc(deflateBound(&s, e[k].len));
            s.next_in = (Bytef *)e[k].data;
            s.avail_in = (uInt)e[k].len;
            s.next_out = comp;
            s.avail_out = (uInt)deflateBound(&s, e[k].len);
            REQUIRE(deflate(&s, Z_FINISH) == Z_STREAM_END);
            clen = s.total_out;
            deflateEnd(&s);
            data = comp;
        }
        size_t nl = strlen(e[k].name);
        uint64_t lho = z.len;
        if (places) places[k].local = z.len;
        put32(&z, 0x04034b50u);
        put16(&z, zip64 ? 45 : 20);
        put16(&z, 0);
        put16(&z, (unsigned)e[k].method);
        put32(&z, 0);
        put32(&z, (uint32_t)crc);
        put32(&z, zip64 ? 0xffffffffu : (uint32_t)clen);
        put32(&z, zip64 ? 0xffffffffu : (uint32_t)e[k].len);
        put16(&z, (unsigned)nl);
        put16(&z, zip64 ? 20 : 0);
        put(&z, e[k].name, nl);
        if (zip64) {
            put16(&z, 1);
            put16(&z, 16);
            put64(&z, e[k].len);
            put64(&z, clen);
        }
        put(&z, data, clen);
        if (places) places[k].central = cd.len;
        put32(&cd, 0x02014b50u);
        put16(&cd, 0x031e);
        put16(&cd, zip64 ? 45 : 20);
        put16(&cd, 0);
        put16(&cd, (unsigned)e[k].method);
        put32(&cd, 0);
        put32(&cd, (uint32_t)crc);
        put32(&cd, zip64 ? 0xffffffffu : (uint32_t)clen);
        put32(&cd, zip64 ? 0xffffffffu : (uint32_t)e[k].len);
        put16(&cd, (unsigned)nl);
        put16(&cd, zip64 ? 28 : 0);
        put16(&cd, 0);
        put16(&cd, 0);
        put16(&cd, 0);
        put32(&cd, 0);
        put32(&cd, zip64 ? 0xffffffffu : (uint32_t)(lho - prefix));
        put(&cd, e[k].name, nl);
        if (zip64) {
            put16(&cd, 1);
            put16(&cd, 24);
            put64(&cd, e[k].len);
            put64(&cd, clen);
            put64(&cd, lho - prefix);
        }
        free(comp);
    }
    uint64_t cd_at = z.len - prefix;
    if (places)
        for (size_t k = 0; k < n; k++) places[k].central += z.len;
    put(&z, cd.b, cd.len);
    if (zip64) {
        uint64_t eocd64 = z.len - prefix;
        put32(&z, 0x06064b50u);
        put64(&z, 44);
        put16(&z, 45);
        put16(&z, 45);
        put32(&z, 0);
        put32(&z, 0);
        put64(&z, n);
        put64(&z, n);
        put64(&z, cd.len);
        put64(&z, cd_at);
        put32(&z, 0x07064b50u);
        put32(&z, 0);
        put64(&z, eocd64);
        put32(&z, 1);
    }
    put32(&z, 0x06054b50u);
    put32(&z, 0);
    put16(&z, zip64 ? 0xffff : (unsigned)n);
    put16(&z, zip64 ? 0xffff : (unsigned)n);
    put32(&z, zip64 ? 0xffffffffu : (uint32_t)cd.len);
    put32(&z, zip64 ? 0xffffffffu : (uint32_t)cd_at);
    put16(&z, 0);
    free(cd.b);
    *len = z.len;
    return z.b;
}

/* The archive of a fileset, each name prefixed with top (may be ""). */
static void zip_folder(const char *path, const fileset *s, const char *top, int method, int zip64,
                       size_t prefix, int junk) {
    zent *e = calloc(s->n + 4, sizeof *e);
    char(*names)[300] = calloc(s->n + 4, sizeof *names);
    REQUIRE(e && names);
    size_t n = 0;
    if (top[0]) {
        snprintf(names[n], sizeof names[n], "%s", top);
        e[n] = (zent){names[n], (const uint8_t *)"", 0, 0};
        n++;
    }
    for (size_t i = 0; i < s->n; i++) {
        snprintf(names[n], sizeof names[n], "%s%s", top, s->f[i].name);
        e[n] = (zent){names[n], s->f[i].data, s->f[i].len, method};
        n++;
    }
    if (junk) {
        snprintf(names[n], sizeof names[n], "__MACOSX/%s._img.jpg", top);
        e[n] = (zent){names[n], (const uint8_t *)"resource fork", 13, 0};
        n++;
    }
    size_t len;
    uint8_t *z = zip_make(e, n, zip64, prefix, &len, NULL);
    REQUIRE(timg_write_file(path, z, len) == 0);
    free(z);
    free(e);
    free(names);
}

static dsrt_datastore *open_with(const char *path, const dsrt_datastore_options *o) {
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, path, o);
    if (rc != 0) fprintf(stderr, "open %s: %s\n", path, dsrt_last_error());
    REQUIRE(rc == 0);
    return ds;
}

static uint8_t *malloc_fn(void *ctx, size_t need) {
    (void)ctx;
    return malloc(need);
}

/* The bytes of sample i (malloc'd), or NULL with *rc. */
static uint8_t *sample_bytes(const dsrt_datastore *ds, size_t i, size_t *len, int *rc) {
    uint8_t *data = NULL;
    *rc = dsrt__sample_read(ds, i, (size_t)1 << 30, malloc_fn, NULL, &data, len, NULL);
    if (*rc != 0) {
        free(data);
        return NULL;
    }
    return data;
}

/* The part of a sample's path after its root: "cls/x.jpg". */
static const char *rel(const char *path, const char *root_end) {
    const char *p = strstr(path, root_end);
    return p ? p + strlen(root_end) : path;
}

/* Checks that a and b have the same classes, labels, member names and
 * bytes, position by position. */
static void same_index(const dsrt_datastore *a, const char *ra, const dsrt_datastore *b,
                       const char *rb) {
    CHECK_EQ(dsrt_datastore_count(a), dsrt_datastore_count(b));
    CHECK_EQ(dsrt_datastore_num_classes(a), dsrt_datastore_num_classes(b));
    if (dsrt_datastore_count(a) != dsrt_datastore_count(b)) return;
    for (size_t c = 0; c < dsrt_datastore_num_classes(a); c++)
        CHECK_STR_EQ(dsrt_datastore_class_name(a, c), dsrt_datastore_class_name(b, c));
    int bad = 0;
    for (size_t i = 0; i < dsrt_datastore_count(a) && bad < 3; i++) {
        const char *pa = rel(dsrt_datastore_path(a, i), ra),
                   *pb = rel(dsrt_datastore_path(b, i), rb);
        size_t la, lb;
        int rca, rcb;
        uint8_t *da = sample_bytes(a, i, &la, &rca), *db = sample_bytes(b, i, &lb, &rcb);
        int ok = dsrt_datastore_label(a, i) == dsrt_datastore_label(b, i) && !strcmp(pa, pb) &&
                 da && db && la == lb && memcmp(da, db, la) == 0;
        if (!ok) {
            fprintf(stderr, "sample %zu: %s (%d, %s) against %s (%d, %s)\n", i,
                    dsrt_datastore_path(a, i), dsrt_datastore_label(a, i), da ? "read" : "unread",
                    dsrt_datastore_path(b, i), dsrt_datastore_label(b, i), db ? "read" : "unread");
            bad++;
        }
        CHECK(ok);
        free(da);
        free(db);
    }
}

// ----------------------------------------------------------------------------
// An archive of a folder opens as the folder

static void test_equals_folder(void) {
    char dir[4300], zp[4300];
    snprintf(dir, sizeof dir, "%s/folder", root);
    fileset s = make_folder(dir, 60, 3);
    struct {
        const char *top;
        int method, zip64, junk;
        size_t prefix;
    } kinds[] = {{"", 0, 0, 0, 0},        {"", 8, 0, 0, 0},        {"", 8, 1, 0, 0},
                 {"photos/", 0, 0, 1, 0}, {"photos/", 8, 1, 0, 0}, {"", 0, 0, 0, 777}};
    dsrt_label_source modes[] = {DSRT_LABEL_FOLDER_NAMES, DSRT_LABEL_PARENT_FOLDER,
                                 DSRT_LABEL_NONE};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(kinds); k++) {
        snprintf(zp, sizeof zp, "%s/a%zu.zip", root, k);
        zip_folder(zp, &s, kinds[k].top, kinds[k].method, kinds[k].zip64, kinds[k].prefix,
                   kinds[k].junk);
        char zroot[4400];
        snprintf(zroot, sizeof zroot, ".zip:%s", kinds[k].top);
        for (size_t m = 0; m < DSRT_ARRAY_SIZE(modes); m++)
            for (int sub = 0; sub < 2; sub++) {
                dsrt_datastore_options o = dsrt_datastore_defaults();
                o.label_source = modes[m];
                o.include_subfolders = sub;
                if (k == 1 && m == 0) o.extensions = "png";
                /* (Parent-folder labels without sub-folders take the files of
                 * the root: there are none, and both say so.) */
                dsrt_datastore *f = NULL, *z = NULL;
                int rf = dsrt_datastore_open(&f, dir, &o), rz = dsrt_datastore_open(&z, zp, &o);
                CHECK_EQ(rz, rf);
                if (rz == 0 && rf == 0) {
                    CHECK_EQ(dsrt_datastore_source(z), DSRT_SOURCE_ZIP);
                    same_index(z, zroot, f, "folder/");
                    if (kinds[k].junk) CHECK_CONTAINS(dsrt_datastore_warnings(z), "__MACOSX/");
                }
                dsrt_datastore_close(z);
                dsrt_datastore_close(f);
            }
    }
    /* Detected by its first bytes whatever its name; a set of one shard,
     * each sample the record of its member. */
    char odd[4300];
    snprintf(odd, sizeof odd, "%s/archive.bin", root);
    snprintf(zp, sizeof zp, "%s/a0.zip", root);
    REQUIRE(rename(zp, odd) == 0);
    dsrt_datastore *z = open_with(odd, NULL);
    CHECK_EQ(dsrt_datastore_source(z), DSRT_SOURCE_ZIP);
    CHECK_EQ(dsrt_datastore_shard_count(z), 1);
    CHECK_STR_EQ(dsrt_datastore_shard_path(z, 0), odd);
    dsrt_sample_location loc;
    CHECK_OK(dsrt_datastore_location(z, 1, &loc));
    CHECK_EQ(loc.shard, 0);
    CHECK_STR_EQ(loc.member, strchr(dsrt_datastore_path(z, 1), ':') + 1);
    CHECK_GT(loc.offset, 0);
    dsrt_datastore_close(z);
    fileset_free(&s);
}

// ----------------------------------------------------------------------------
// Batches

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* The hash of each of nb batches of a pipeline on ds, and the ids seen. */
static void run(const dsrt_datastore *ds, dsrt_shard_order order, size_t nb, uint64_t *hash,
                uint32_t *seen) {
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.batch = 8;
    o.prefetch = 2;
    o.threads = 2;
    o.pin = 0;
    o.seed = 5;
    (void)order;
    dsrt_augment_options a = dsrt_augment_defaults();
    a.output_height = a.output_width = 16;
    a.rand_x_reflection = 1;
    dsrt_pipeline *p;
    REQUIRE(dsrt_pipeline_open(&p, ds, &a, &o) == 0);
    for (size_t k = 0; k < nb; k++) {
        dsrt_batch *b;
        REQUIRE(dsrt_pipeline_next(p, &b) == 0);
        uint64_t h = fnv(0xcbf29ce484222325ULL, b->data, b->count * b->sample_stride);
        hash[k] = fnv(h, b->labels, b->count * sizeof *b->labels);
        for (size_t i = 0; seen && i < b->count; i++) seen[b->ids[i]]++;
        dsrt_batch_release(p, b);
    }
    dsrt_pipeline_close(p);
}

static void test_batches(void) {
    char dir[4300], zp[4300];
    snprintf(dir, sizeof dir, "%s/batches", root);
    fileset s = make_folder(dir, 48, 4);
    snprintf(zp, sizeof zp, "%s/batches.zip", root);
    zip_folder(zp, &s, "", 8, 0, 0, 0);
    dsrt_datastore_options o = dsrt_datastore_defaults();
    dsrt_datastore *f = open_with(dir, &o);
    o.shard_order = DSRT_SHARD_ORDER_EXACT;
    dsrt_datastore *z = open_with(zp, &o);
    size_t n = dsrt_datastore_count(f), nb = 2 * ((n + 7) / 8);
    uint64_t *ha = calloc(nb, 8), *hb = calloc(nb, 8);
    run(f, 0, nb, ha, NULL);
    run(z, 0, nb, hb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(ha[k], hb[k]);
    dsrt_datastore_close(z);
    /* The shard order: one shard read front to back through the shuffle
     * buffer; every sample once an epoch. */
    o.shard_order = DSRT_SHARD_ORDER_SHARD;
    o.shuffle_buffer = 8;
    z = open_with(zp, &o);
    CHECK_EQ(dsrt_datastore_shard_order(z), DSRT_SHARD_ORDER_SHARD);
    uint32_t *seen = calloc(n, sizeof *seen);
    run(z, 0, nb, hb, seen);
    for (size_t i = 0; i < n; i++) CHECK_EQ(seen[i], 2);
    free(seen);
    dsrt_datastore_close(z);
    dsrt_datastore_close(f);
    free(ha);
    free(hb);
    fileset_free(&s);
}

// ----------------------------------------------------------------------------
// Hostile archives

static void wr16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    wr16(p, v & 0xffff);
    wr16(p + 2, v >> 16);
}

/* Writes a two-image archive (the second deflated), lets damage change it,
 * and opens it: the open's code (the message is the thread's). */
static int hostile(const char *name, void (*damage)(uint8_t *z, size_t *len, const zplace *pl),
                   dsrt_datastore **out) {
    static const char *const names[] = {"cls/a.jpg", "cls/b.jpg"};
    size_t la = 0, lb = 0;
    uint8_t *a = timg_make_jpeg(TIMG_JPEG_420, 40, 30, 1, &la);
    uint8_t *b = timg_make_jpeg(TIMG_JPEG_444, 50, 30, 2, &lb);
    zent e[2] = {{names[0], a, la, 0}, {names[1], b, lb, 8}};
    zplace pl[2];
    size_t len;
    uint8_t *z = zip_make(e, 2, 0, 0, &len, pl);
    if (damage) damage(z, &len, pl);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s.zip", root, name);
    REQUIRE(timg_write_file(path, z, len) == 0);
    free(z);
    free(a);
    free(b);
    *out = NULL;
    return dsrt_datastore_open(out, path, NULL);
}

static void overlap(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr32(z + pl[1].central + 42, 0); /* b's data is a's */
}
static void past_end(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr32(z + pl[1].central + 20, 0x7fffffff); /* b's compressed size */
}
static void dotdot(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    memcpy(z + pl[1].central + 46, "../b.jpg", 8); /* 9 bytes long, the same as "cls/b.jpg" */
    z[pl[1].central + 46 + 8] = 'x';
}
static void absolute(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    z[pl[0].central + 46] = '/';
}
static void nul_name(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    z[pl[0].central + 46 + 3] = '\0';
}
static void cd_past_end(uint8_t *z, size_t *len, const zplace *pl) {
    (void)pl;
    wr32(z + *len - 22 + 16, 0x10000000); /* the directory's offset */
}
static void truncated(uint8_t *z, size_t *len, const zplace *pl) {
    (void)z, (void)pl;
    *len -= 30;
}
static void many(uint8_t *z, size_t *len, const zplace *pl) {
    (void)pl;
    wr16(z + *len - 22 + 8, 60000);
    wr16(z + *len - 22 + 10, 60000);
}
static void bomb(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr32(z + pl[1].central + 24, 0x7ffffff0); /* 2 GiB from a few KiB */
}
static void inflates_past(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr32(z + pl[1].central + 24, 100); /* claims 100 bytes */
}
static void bad_crc(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    z[pl[1].central + 16] ^= 0x55;
}
static void encrypted(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr16(z + pl[1].central + 8, 1);
}
static void lzma(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    wr16(z + pl[1].central + 10, 14);
    wr16(z + pl[1].local + 8, 14);
}
static void local_name(uint8_t *z, size_t *len, const zplace *pl) {
    (void)len;
    z[pl[1].local + 30 + 4] = 'x';
}

static void test_hostile(void) {
    struct {
        const char *name;
        void (*damage)(uint8_t *, size_t *, const zplace *);
        int code;
        const char *says;
    } refused[] = {
        {"overlap", overlap, DSRT_ECORRUPT, "overlap (as in a zip bomb)"},
        {"past_end", past_end, DSRT_ECORRUPT, "runs past the end"},
        {"dotdot", dotdot, DSRT_ECORRUPT, "'..' component"},
        {"absolute", absolute, DSRT_ECORRUPT, "an absolute path"},
        {"nul_name", nul_name, DSRT_ECORRUPT, "NUL byte"},
        {"cd_past_end", cd_past_end, DSRT_ECORRUPT, "lies past the end of the archive"},
        {"truncated", truncated, DSRT_EFORMAT, "no end of central directory"},
        {"many", many, DSRT_ECORRUPT, "60000 members in a central directory"},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(refused); k++) {
        dsrt_datastore *ds;
        int rc = hostile(refused[k].name, refused[k].damage, &ds);
        if (rc != refused[k].code)
            fprintf(stderr, "%s: %d %s\n", refused[k].name, rc, dsrt_last_error());
        CHECK_EQ(rc, refused[k].code);
        CHECK(ds == NULL);
        CHECK_CONTAINS(dsrt_last_error(), refused[k].name);
        CHECK_CONTAINS(dsrt_last_error(), refused[k].says);
    }
    /* Archives that open, with one bad member: named when read, and
     * skipped by a pipeline, which names it. */
    struct {
        const char *name;
        void (*damage)(uint8_t *, size_t *, const zplace *);
        int code;
        const char *says;
    } bad[] = {
        {"bomb", bomb, DSRT_ECORRUPT, "a compression-ratio bomb"},
        {"inflates_past", inflates_past, DSRT_ECORRUPT, "inflates past the 100 bytes"},
        {"bad_crc", bad_crc, DSRT_ECHECKSUM, "CRC-32"},
        {"encrypted", encrypted, DSRT_EUNSUPPORTED, "encrypted"},
        {"lzma", lzma, DSRT_EUNSUPPORTED, "method 14 (LZMA)"},
        {"local_name", local_name, DSRT_ECORRUPT, "local header disagrees"},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bad); k++) {
        dsrt_datastore *ds;
        int rc = hostile(bad[k].name, bad[k].damage, &ds);
        if (rc != 0) fprintf(stderr, "%s: %s\n", bad[k].name, dsrt_last_error());
        REQUIRE(rc == 0);
        CHECK_EQ(dsrt_datastore_count(ds), 2);
        size_t len;
        uint8_t *a = sample_bytes(ds, 0, &len, &rc);
        CHECK(a != NULL);
        free(a);
        uint8_t *b = sample_bytes(ds, 1, &len, &rc);
        CHECK(b == NULL);
        CHECK_EQ(rc, bad[k].code);
        CHECK_CONTAINS(dsrt_last_error(), "cls/b.jpg");
        CHECK_CONTAINS(dsrt_last_error(), bad[k].says);
        /* A pipeline skips it and names it. */
        dsrt_pipeline_options po = dsrt_pipeline_defaults();
        po.batch = 2;
        po.threads = 1;
        po.pin = 0;
        po.epochs = 1;
        po.drop_bad = 1;
        dsrt_augment_options ao = dsrt_augment_defaults();
        ao.output_height = ao.output_width = 8;
        dsrt_pipeline *p;
        REQUIRE(dsrt_pipeline_open(&p, ds, &ao, &po) == 0);
        dsrt_batch *bt;
        REQUIRE(dsrt_pipeline_next(p, &bt) == 0);
        CHECK_EQ(bt->count, 1);
        dsrt_batch_release(p, bt);
        dsrt_bad_sample s;
        CHECK_EQ(dsrt_pipeline_bad_samples(p, 0, &s, 1), 1);
        CHECK_CONTAINS(s.path, "cls/b.jpg");
        CHECK_CONTAINS(s.error, bad[k].says);
        dsrt_pipeline_close(p);
        dsrt_datastore_close(ds);
    }
}

/* Random bytes and cut or flipped archives: refused or read, never a crash
 * (the fuzzer, tests/fuzz/fuzz_zip.c, goes much further). */
static void test_mangled(void) {
    size_t la = 0;
    uint8_t *a = timg_make_jpeg(TIMG_JPEG_420, 40, 30, 3, &la);
    zent e[3] = {{"x/a.jpg", a, la, 8}, {"x/b.png", a, la, 0}, {"y/c.jpg", a, la, 8}};
    size_t len;
    uint8_t *z = zip_make(e, 3, 1, 0, &len, NULL);
    uint8_t *m = malloc(len);
    for (uint32_t t = 0; t < 400; t++) {
        memcpy(m, z, len);
        size_t cut = len;
        uint32_t h = timg_hash(t);
        if (t % 3 == 0) cut = h % (len + 1);
        for (int f = 0; f < 1 + (int)(h % 4); f++)
            m[timg_hash(t * 7 + (uint32_t)f) % len] ^= 1u << (h % 8);
        dsrt_index ix = {0};
        dsrt_datastore_options o = dsrt_datastore_defaults();
        if (dsrt__zip_open_memory(&ix, "m.zip", m, cut, &o) == 0 && ix.data) {
            const dsrt_shardset *s = ix.data;
            for (size_t i = 0; i < ix.n; i++) {
                size_t need = (size_t)DSRT_MAX(s->size[i], s->codec->decoded_size(s, (uint32_t)i));
                if (s->offset[i] > cut || s->size[i] > cut - s->offset[i] || need > (64u << 20))
                    continue;
                uint8_t *b = malloc(need ? need : 1);
                memcpy(b, m + s->offset[i], (size_t)s->size[i]);
                size_t got;
                s->codec->decode(s, (uint32_t)i, ix.paths[i], b, need, (size_t)s->size[i], &got);
                free(b);
            }
        }
        free(ix.paths);
        free(ix.labels);
        free(ix.classes);
        free(ix.warnings);
        if (ix.data_free) ix.data_free(ix.data);
        dsrt__arena_free(&ix.arena);
    }
    free(m);
    free(z);
    free(a);
}

// ----------------------------------------------------------------------------
// Against Python's zipfile

static const char *python_writer =
    "import io, os, random, sys, zipfile\n"
    "out, seed = sys.argv[1], int(sys.argv[2])\n"
    "rng = random.Random(seed)\n"
    "imgs = [open(p, 'rb').read() for p in sys.argv[3:]]\n"
    "top = rng.choice(['', '', 'data/'])\n"
    "classes = rng.sample(['cat', 'dog', 'b\\u00e9b\\u00e9', 'x y', '0', 'zz'], rng.randint(1, "
    "4))\n"
    "raw = io.BytesIO()\n"
    "with zipfile.ZipFile(raw, 'w') as z:\n"
    "    if rng.random() < 0.5: z.comment = b'made by zipfile'\n"
    "    for c in classes:\n"
    "        if rng.random() < 0.5: z.writestr(top + c + '/', b'')\n"
    "        for k in range(rng.randint(1, 12)):\n"
    "            sub = rng.choice(['', '', 'deep/', 'deep/er/'])\n"
    "            ext = rng.choice(['.jpg', '.png', '.JPG', '.txt'])\n"
    "            name = top + c + '/' + sub + 'f%d_%d%s' % (seed, k, ext)\n"
    "            data = rng.choice(imgs) + bytes(rng.randrange(256) for _ in range(rng.randint(0, "
    "9)))\n"
    "            method = rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])\n"
    "            info = zipfile.ZipInfo(name, date_time=(2024, 1, 2, 3, 4, 6))\n"
    "            info.compress_type = method\n"
    "            if rng.random() < 0.3: info.extra = b'\\xfe\\xca\\x04\\x00abcd'\n"
    "            if rng.random() < 0.3:\n"
    "                with z.open(info, 'w', force_zip64=rng.random() < 0.5) as w: w.write(data)\n"
    "            else:\n"
    "                z.writestr(info, data, compresslevel=rng.choice([1, 6, 9]))\n"
    "data = raw.getvalue()\n"
    "if rng.random() < 0.3:\n"
    "    # streamed to a pipe: data descriptors, sizes only in the directory\n"
    "    class Pipe(io.RawIOBase):\n"
    "        def __init__(self): self.b = bytearray()\n"
    "        def writable(self): return True\n"
    "        def write(self, d): self.b += d; return len(d)\n"
    "    p = Pipe()\n"
    "    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(p, 'w') as dst:\n"
    "        for i in src.infolist():\n"
    "            with dst.open(zipfile.ZipInfo(i.filename, i.date_time), 'w') as w:\n"
    "                w.write(src.read(i))\n"
    "    data = bytes(p.b)\n"
    "open(out, 'wb').write(data)\n"
    "with zipfile.ZipFile(out) as z:\n"
    "    bad = z.testzip()\n"
    "    assert bad is None, bad\n"
    "    z.extractall(out + '.d')\n";

static void test_python_zipfile(void) {
    if (system("python3 -c 'import zipfile' 2>/dev/null") != 0) {
        fprintf(stderr, "python3 with zipfile not found: the differential case is skipped\n");
        return;
    }
    char script[4400], imgs[3][4400];
    snprintf(script, sizeof script, "%s/writer.py", root);
    REQUIRE(timg_write_file(script, python_writer, strlen(python_writer)) == 0);
    for (int k = 0; k < 3; k++) {
        size_t len;
        uint8_t *b = k == 2 ? timg_make_png(TIMG_PNG_RGB8, 30, 20, 9, &len, NULL)
                            : timg_make_jpeg(k ? TIMG_JPEG_444 : TIMG_JPEG_420, 33, 21, k, &len);
        snprintf(imgs[k], sizeof imgs[k], "%s/src%d.img", root, k);
        REQUIRE(b && timg_write_file(imgs[k], b, len) == 0);
        free(b);
    }
    for (int seed = 1; seed <= 24; seed++) {
        char zp[4400], dir[4500], cmd[20000];
        snprintf(zp, sizeof zp, "%s/py%d.zip", root, seed);
        snprintf(cmd, sizeof cmd, "python3 '%s' '%s' %d '%s' '%s' '%s'", script, zp, seed, imgs[0],
                 imgs[1], imgs[2]);
        REQUIRE(system(cmd) == 0);
        snprintf(dir, sizeof dir, "%s.d", zp);
        /* An archive of one top folder that holds sub-folders is opened at
         * that folder, as on disk: the extracted copy is too. */
        char top[4600], probe[9000];
        const char *folder = dir;
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && [ $(ls -A | wc -l) = 1 ] && d=$(ls -A) && [ -d \"$d\" ] && "
                 "find \"$d\" -mindepth 2 -type f | grep -q . && printf %%s \"$d\"",
                 dir);
        FILE *fp = popen(cmd, "r");
        REQUIRE(fp);
        size_t got = fread(probe, 1, sizeof probe - 1, fp);
        probe[got] = '\0';
        int one = pclose(fp) == 0 && got > 0;
        if (one) {
            snprintf(top, sizeof top, "%s/%s", dir, probe);
            folder = top;
        }
        for (int m = 0; m < 3; m++) {
            dsrt_datastore_options o = dsrt_datastore_defaults();
            o.label_source = (dsrt_label_source)m;
            dsrt_datastore *z = NULL, *f = NULL;
            int rz = dsrt_datastore_open(&z, zp, &o), rf = dsrt_datastore_open(&f, folder, &o);
            CHECK_EQ(rz, rf);
            if (rz == 0 && rf == 0) {
                char zroot[9100], froot[9100];
                snprintf(zroot, sizeof zroot, ".zip:%s%s", one ? probe : "", one ? "/" : "");
                snprintf(froot, sizeof froot, ".d/%s%s", one ? probe : "", one ? "/" : "");
                same_index(z, zroot, f, froot);
            }
            dsrt_datastore_close(z);
            dsrt_datastore_close(f);
        }
    }
}

// ----------------------------------------------------------------------------
// In a bucket

static struct {
    pid_t pid;
    FILE *in, *out;
    char endpoint[128], key[128], secret[128];
} srv;

static void json_get(const char *line, const char *name, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", name);
    const char *p = strstr(line, pat);
    out[0] = '\0';
    if (!p) return;
    p += strlen(pat);
    const char *e = strchr(p, '"');
    if (e) snprintf(out, cap, "%.*s", (int)(e - p), p);
}

/* moto's S3 with dir uploaded as bkt/zips; 0, or TEST_SKIP. */
static int server_start(const char *dir) {
    const char *src = getenv("DSRT_SOURCE_DIR");
    char cmd[8192], py[4096] = "", line[8192] = "";
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/s3-venv.sh' 2>&1", src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return TEST_SKIP;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '/' && access(line, X_OK) == 0) snprintf(py, sizeof py, "%s", line);
    }
    if (pclose(p) != 0 || !py[0]) {
        fprintf(stderr, "skip: the S3 test server could not be installed: %s\n", line);
        return TEST_SKIP;
    }
    char script[4200];
    snprintf(script, sizeof script, "%s/tests/s3_server.py", src ? src : ".");
    int to[2], from[2];
    REQUIRE(pipe(to) == 0 && pipe(from) == 0);
    srv.pid = fork();
    if (srv.pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl(py, py, script, "--upload", dir, "bkt/zips", (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    srv.in = fdopen(to[1], "w");
    srv.out = fdopen(from[0], "r");
    if (!fgets(line, sizeof line, srv.out)) return 1;
    json_get(line, "endpoint", srv.endpoint, sizeof srv.endpoint);
    json_get(line, "key", srv.key, sizeof srv.key);
    json_get(line, "secret", srv.secret, sizeof srv.secret);
    return srv.endpoint[0] && srv.key[0] ? 0 : 1;
}

static void test_s3(void) {
    char dir[4300], zdir[4300], zp[4400];
    snprintf(dir, sizeof dir, "%s/s3src", root);
    snprintf(zdir, sizeof zdir, "%s/s3zips", root);
    fileset s = make_folder(dir, 30, 3);
    REQUIRE(timg_mkdirs(zdir) == 0);
    snprintf(zp, sizeof zp, "%s/photos.zip", zdir);
    zip_folder(zp, &s, "photos/", 8, 0, 0, 0);
    int rc = server_start(zdir);
    if (rc == TEST_SKIP) {
        fileset_free(&s);
        return;
    }
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        setenv("AWS_ACCESS_KEY_ID", srv.key, 1);
        setenv("AWS_SECRET_ACCESS_KEY", srv.secret, 1);
        setenv("AWS_REGION", "us-east-1", 1);
        setenv("AWS_ENDPOINT_URL", srv.endpoint, 1);
        setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
        setenv("AWS_CONFIG_FILE", "/nonexistent/config", 1);
        dsrt_datastore_options o = dsrt_datastore_defaults();
        o.shard_order = DSRT_SHARD_ORDER_EXACT;
        dsrt_datastore *l = open_with(zp, &o), *r = open_with("s3://bkt/zips/photos.zip", &o);
        CHECK_EQ(dsrt_datastore_source(r), DSRT_SOURCE_ZIP);
        CHECK(dsrt_datastore_remote(r));
        same_index(r, ".zip:", l, ".zip:");
        /* The pipeline's ranged GETs give the local archive's batches. */
        size_t nb = 2 * ((dsrt_datastore_count(l) + 7) / 8);
        uint64_t *ha = calloc(nb, 8), *hb = calloc(nb, 8);
        run(l, 0, nb, ha, NULL);
        run(r, 0, nb, hb, NULL);
        for (size_t k = 0; k < nb; k++) CHECK_EQ(ha[k], hb[k]);
        free(ha);
        free(hb);
        dsrt_datastore_close(r);
        dsrt_datastore_close(l);
        /* Detected by its name at a URL; the shard order streams it. */
        dsrt_datastore *a = open_with("s3://bkt/zips/photos.zip", NULL);
        CHECK_EQ(dsrt_datastore_shard_order(a), DSRT_SHARD_ORDER_SHARD);
        uint32_t *seen = calloc(dsrt_datastore_count(a), sizeof *seen);
        size_t n = dsrt_datastore_count(a);
        uint64_t *h = calloc((n + 7) / 8, 8);
        run(a, 0, (n + 7) / 8, h, seen);
        for (size_t i = 0; i < n; i++) CHECK_EQ(seen[i], 1);
        free(seen);
        free(h);
        dsrt_datastore_close(a);
    }
    if (srv.pid > 0) {
        kill(srv.pid, SIGKILL);
        waitpid(srv.pid, NULL, 0);
    }
    fileset_free(&s);
}

int main(void) {
    REQUIRE(timg_tmpdir("zip", root, sizeof root) == 0);
    RUN(test_equals_folder);
    RUN(test_batches);
    RUN(test_hostile);
    RUN(test_mangled);
    RUN(test_python_zipfile);
    RUN(test_s3);
    return TEST_RESULT();
}
