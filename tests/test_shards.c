/*
 * Tests of tar shard sets: the tar walk on archives built byte by byte (ustar
 * prefixes, GNU long names, pax headers, base-256 sizes, a damaged header, a
 * member cut short), the writer (layout, index, a writer killed or failing
 * mid-set, an output refused when it is the source's folder or holds what the
 * writer did not make, entries of the writer's names that it did not make
 * never followed or emptied, two writers into one folder at once), and
 * reading through the pipeline in both orders: the exact order's batches
 * equal the folder's, the shard order gives every sample once an epoch,
 * streams each shard front to back, is the same for any thread count and
 * resumes bit-exactly mid-epoch, and a worker lagging behind at an epoch's
 * end still gets its sample from the stream. Also shards made by GNU tar,
 * truncated shards, a shard replaced by a FIFO, selection by glob and brace
 * list (capped in total), bounds on labels, partition and split_each_label.
 *
 * Every data set is made in the test's temporary folder.
 */
#include "datastore/sources/shards/shards.h"
#include "task.h"
#include "testimg.h"

#include <arpa/inet.h>
#include <dsrt/pipeline.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[4096];

// ----------------------------------------------------------------------------
// Helpers

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n images in dir/class<c>/img<NNN>.jpg|png, classes in runs. */
static void make_folder(const char *dir, size_t n, int classes) {
    REQUIRE(timg_mkdirs(dir) == 0);
    for (size_t i = 0; i < n; i++) {
        int c = (int)(i * (size_t)classes / n);
        char path[4096];
        snprintf(path, sizeof path, "%s/class%d", dir, c);
        REQUIRE(timg_mkdirs(path) == 0);
        uint32_t h = timg_hash((uint32_t)i + 7);
        int w = 40 + (int)(h % 50), ht = 36 + (int)((h >> 8) % 40);
        size_t len = 0;
        uint8_t *buf;
        if (i % 7 == 3) {
            buf = timg_make_png(TIMG_PNG_RGB8, w, ht, (uint32_t)i, &len, NULL);
            snprintf(path, sizeof path, "%s/class%d/img%03zu.png", dir, c, i);
        } else {
            buf = timg_make_jpeg(i % 2 ? TIMG_JPEG_420 : TIMG_JPEG_444, w, ht, (uint32_t)i, &len);
            snprintf(path, sizeof path, "%s/class%d/img%03zu.jpg", dir, c, i);
        }
        REQUIRE(buf);
        REQUIRE(timg_write_file(path, buf, len) == 0);
        free(buf);
    }
}

static dsrt_datastore *open_ds(const char *path, dsrt_shard_order order) {
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.shard_order = order;
    o.shuffle_buffer = 16;
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, path, &o);
    if (rc != 0) fprintf(stderr, "open %s: %s\n", path, dsrt_last_error());
    REQUIRE(rc == 0);
    return ds;
}

static int64_t write_shards(const dsrt_datastore *ds, const char *out, uint64_t bytes,
                            uint64_t samples) {
    dsrt_shard_write_options o = dsrt_shard_write_defaults();
    o.shard_bytes = bytes;
    o.shard_samples = samples;
    int64_t k = dsrt_shards_write(ds, out, &o, NULL);
    if (k < 0) fprintf(stderr, "write %s: %s\n", out, dsrt_last_error());
    return k;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

typedef struct {
    uint64_t hash;
    size_t count;
    uint32_t ids[64];
} rec;

static dsrt_pipeline_options small_options(void) {
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.batch = 8;
    o.prefetch = 2;
    o.threads = 2;
    o.pin = 0;
    o.seed = 5;
    return o;
}

static dsrt_augment_options small_aug(void) {
    dsrt_augment_options a = dsrt_augment_defaults();
    a.output_height = a.output_width = 16;
    a.rand_x_reflection = 1;
    return a;
}

/* Takes max batches (fewer at the end) into recs; returns how many. */
static size_t take(dsrt_pipeline *p, rec *recs, size_t max) {
    size_t k = 0;
    while (k < max) {
        dsrt_batch *b;
        if (dsrt_pipeline_next(p, &b) != 0) break;
        uint64_t h = 0xcbf29ce484222325ULL;
        h = fnv(h, b->data, b->count * b->sample_stride);
        h = fnv(h, b->labels, b->count * sizeof *b->labels);
        recs[k].hash = fnv(h, b->ids, b->count * sizeof *b->ids);
        recs[k].count = b->count;
        memcpy(recs[k].ids, b->ids, DSRT_MIN(b->count, (size_t)64) * sizeof *b->ids);
        CHECK_OK(dsrt_batch_release(p, b));
        k++;
    }
    return k;
}

/* Runs `batches` batches of ds and returns them. */
static rec *run(const dsrt_datastore *ds, const dsrt_pipeline_options *o, size_t batches,
                dsrt_pipeline_statistics *st) {
    dsrt_augment_options a = small_aug();
    dsrt_pipeline *p = NULL;
    int rc = dsrt_pipeline_open(&p, ds, &a, o);
    if (rc != 0) fprintf(stderr, "pipeline: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    rec *r = calloc(batches, sizeof *r);
    REQUIRE(r);
    CHECK_EQ(take(p, r, batches), batches);
    if (st) dsrt_pipeline_stats(p, st);
    dsrt_pipeline_close(p);
    return r;
}

// ----------------------------------------------------------------------------
// The tar walk on archives built by hand

typedef struct {
    uint8_t *buf;
    size_t len, cap;
} arc;

static void arc_put(arc *a, const void *p, size_t n) {
    if (a->len + n > a->cap) {
        a->cap = (a->len + n) * 2 + 4096;
        a->buf = realloc(a->buf, a->cap);
        REQUIRE(a->buf);
    }
    memcpy(a->buf + a->len, p, n);
    a->len += n;
}

static void arc_pad(arc *a) {
    static const uint8_t z[512];
    if (a->len % 512) arc_put(a, z, 512 - a->len % 512);
}

static void set_checksum(uint8_t *h) {
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
}

/* A header of the given format: 'u' POSIX ustar, 'g' GNU, 'v' v7. */
static void arc_header(arc *a, char fmt, const char *name, const char *prefix, char type,
                       uint64_t size, int base256) {
    uint8_t h[512] = {0};
    memcpy(h, name, DSRT_MIN(strlen(name), (size_t)100));
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    if (base256) {
        h[124] = 0x80;
        for (int i = 0; i < 8; i++) h[135 - i] = (uint8_t)(size >> (8 * i));
    } else {
        snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    }
    memcpy(h + 136, "00000000000", 12);
    h[156] = (uint8_t)type;
    if (fmt == 'u')
        memcpy(h + 257,
               "ustar\0"
               "00",
               8);
    if (fmt == 'g') memcpy(h + 257, "ustar  \0", 8);
    if (prefix) memcpy(h + 345, prefix, strlen(prefix));
    set_checksum(h);
    arc_put(a, h, 512);
}

static void arc_file(arc *a, char fmt, const char *name, const char *data, size_t len) {
    arc_header(a, fmt, name, NULL, '0', len, 0);
    arc_put(a, data, len);
    arc_pad(a);
}

static void arc_end(arc *a) {
    static const uint8_t z[1024];
    arc_put(a, z, 1024);
}

typedef struct {
    char names[32][512];
    uint64_t off[32], size[32];
    int truncated[32];
    char type[32];
    int n;
    int warnings;
    char warning[1024];
} walk_out;

static int64_t mem_read(void *ctx, uint64_t off, void *buf, size_t len) {
    arc *a = ctx;
    if (off >= a->len) return 0;
    size_t n = DSRT_MIN(len, a->len - (size_t)off);
    memcpy(buf, a->buf + off, n);
    return (int64_t)n;
}

static int on_member(void *ctx, const dsrt_tar_member *m) {
    walk_out *w = ctx;
    if (w->n < 32) {
        snprintf(w->names[w->n], 512, "%.*s", (int)m->name_len, m->name);
        w->off[w->n] = m->offset;
        w->size[w->n] = m->size;
        w->truncated[w->n] = m->truncated;
        w->type[w->n] = m->type;
    }
    w->n++;
    return 0;
}

static void on_warn(void *ctx, const char *msg) {
    walk_out *w = ctx;
    w->warnings++;
    snprintf(w->warning, sizeof w->warning, "%s", msg);
}

static int walk(arc *a, walk_out *w) {
    memset(w, 0, sizeof *w);
    return dsrt__tar_scan("test.tar", a->len, mem_read, a, on_member, on_warn, w);
}

static void test_tar_walk(void) {
    arc a = {0};
    walk_out w;
    /* ustar with a prefix, GNU, v7, base-256 size. */
    arc_header(&a, 'u', "k1.jpg", "deep/dir", '0', 3, 0);
    arc_put(&a, "abc", 3);
    arc_pad(&a);
    arc_file(&a, 'g', "k1.cls", "2", 1);
    arc_file(&a, 'v', "k2.png", "xy", 2);
    arc_header(&a, 'g', "k3.jpg", NULL, '0', 5, 1);
    arc_put(&a, "hello", 5);
    arc_pad(&a);
    arc_header(&a, 'u', "dir/", NULL, '5', 0, 0);
    /* A GNU long name for the next member. */
    char longname[300];
    memset(longname, 'n', sizeof longname);
    memcpy(longname + 290, "/key.jpg", 9);
    arc_header(&a, 'g', "././@LongLink", NULL, 'L', strlen(longname) + 1, 0);
    arc_put(&a, longname, strlen(longname) + 1);
    arc_pad(&a);
    arc_file(&a, 'g', "short-name-ignored", "L", 1);
    /* A pax header with a path and a size. */
    const char *pax = "30 path=pax/long.name.key.png\n10 size=4\n";
    arc_header(&a, 'u', "PaxHeaders/x", NULL, 'x', strlen(pax), 0);
    arc_put(&a, pax, strlen(pax));
    arc_pad(&a);
    arc_header(&a, 'u', "ignored", NULL, '0', 999, 0); /* the pax size wins */
    arc_put(&a, "PAX!", 4);
    arc_pad(&a);
    arc_end(&a);
    CHECK_OK(walk(&a, &w));
    CHECK_EQ(w.n, 7);
    CHECK_STR_EQ(w.names[0], "deep/dir/k1.jpg");
    CHECK_EQ(w.size[0], 3);
    CHECK(memcmp(a.buf + w.off[0], "abc", 3) == 0);
    CHECK_STR_EQ(w.names[1], "k1.cls");
    CHECK_STR_EQ(w.names[2], "k2.png");
    CHECK_STR_EQ(w.names[3], "k3.jpg");
    CHECK_EQ(w.size[3], 5);
    CHECK(memcmp(a.buf + w.off[3], "hello", 5) == 0);
    CHECK_EQ(w.type[4], '5');
    CHECK_STR_EQ(w.names[5], longname);
    CHECK(memcmp(a.buf + w.off[5], "L", 1) == 0);
    CHECK_STR_EQ(w.names[6], "pax/long.name.key.png");
    CHECK_EQ(w.size[6], 4);
    CHECK(memcmp(a.buf + w.off[6], "PAX!", 4) == 0);
    CHECK_EQ(w.warnings, 0);

    /* A damaged header: warned about, and the walk goes on at the next good one. */
    arc b = {0};
    arc_file(&b, 'u', "a.jpg", "1", 1);
    size_t bad_at = b.len;
    arc_file(&b, 'u', "b.jpg", "22", 2);
    arc_file(&b, 'u', "c.jpg", "333", 3);
    arc_end(&b);
    b.buf[bad_at + 10] ^= 0x55;
    CHECK_OK(walk(&b, &w));
    CHECK_EQ(w.n, 2);
    CHECK_STR_EQ(w.names[1], "c.jpg");
    CHECK_EQ(w.warnings, 1);
    CHECK_CONTAINS(w.warning, "damaged header at byte 1024");

    /* A member cut short by the end of the file. */
    b.len = bad_at + 1024 + 512 + 2; /* c.jpg's data is at bad_at + 1536 */
    CHECK_OK(walk(&b, &w));
    CHECK_EQ(w.n, 2);
    CHECK_STR_EQ(w.names[1], "c.jpg");
    CHECK_EQ(w.truncated[1], 1);

    /* Keys, WebDataset's way. */
    size_t kl, el;
    const char *ext;
    CHECK(dsrt__tar_split_key("a/b.c/key.seg.png", 17, &kl, &ext, &el));
    CHECK_EQ(kl, 9);
    CHECK(strncmp(ext, "seg.png", el) == 0);
    CHECK(!dsrt__tar_split_key("dir.x/noext", 11, &kl, &ext, &el));
    CHECK(!dsrt__tar_split_key(".hidden", 7, &kl, &ext, &el));
    free(a.buf);
    free(b.buf);
}

// ----------------------------------------------------------------------------
// Writing, and the shards read back

static char folder[4096], shards[4096];
#define N_IMAGES 120

static void test_write_and_open(void) {
    snprintf(folder, sizeof folder, "%s/folder", root);
    snprintf(shards, sizeof shards, "%s/shards", root);
    make_folder(folder, N_IMAGES, 3);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, shards, 64 << 10, 0) > 4, 1);
    dsrt_datastore *s = open_ds(shards, DSRT_SHARD_ORDER_EXACT);
    CHECK_EQ(dsrt_datastore_source(s), DSRT_SOURCE_SHARDS);
    CHECK_EQ(dsrt_datastore_count(s), N_IMAGES);
    CHECK_EQ(dsrt_datastore_num_classes(s), 3);
    CHECK_STR_EQ(dsrt_datastore_class_name(s, 2), "class2");
    CHECK_STR_EQ(dsrt_datastore_warnings(s), "");
    for (size_t i = 0; i < N_IMAGES; i++) {
        CHECK_EQ(dsrt_datastore_label(s, i), dsrt_datastore_label(f, i));
        dsrt_sample_location loc;
        CHECK_OK(dsrt_datastore_location(s, i, &loc));
        /* The member is the file's bytes. */
        uint8_t *want;
        size_t want_len;
        REQUIRE(dsrt__read_whole_file(dsrt_datastore_path(f, i), 1 << 24, &want, &want_len) == 0);
        CHECK_EQ(loc.size, want_len);
        int fd = open(dsrt_datastore_shard_path(s, loc.shard), O_RDONLY);
        REQUIRE(fd >= 0);
        uint8_t *got = malloc(want_len);
        CHECK_EQ(pread(fd, got, want_len, (off_t)loc.offset), (ssize_t)want_len);
        CHECK(memcmp(got, want, want_len) == 0);
        close(fd);
        free(got);
        free(want);
        /* "SHARD:MEMBER", the key the position and the file's name. */
        char key[64];
        snprintf(key, sizeof key, ":%06zu_img%03zu.%s", i, i, i % 7 == 3 ? "png" : "jpg");
        CHECK_CONTAINS(dsrt_datastore_path(s, i), key);
    }
    char p[4200];
    uint8_t *text;
    size_t len;
    snprintf(p, sizeof p, "%s/classes.json", shards);
    REQUIRE(dsrt__read_whole_file(p, 1 << 20, &text, &len) == 0);
    CHECK_STR_EQ((char *)text, "[\"class0\", \"class1\", \"class2\"]\n");
    free(text);
    /* Opened from the index alone: a set with its index must not be read. */
    snprintf(p, sizeof p, "%s/shard-000000.tar", shards);
    CHECK_EQ(chmod(p, 0), 0);
    if (access(p, R_OK) != 0) { /* not root */
        dsrt_datastore *t = open_ds(shards, DSRT_SHARD_ORDER_AUTO);
        CHECK_EQ(dsrt_datastore_count(t), N_IMAGES);
        dsrt_datastore_close(t);
    }
    CHECK_EQ(chmod(p, 0644), 0);
    /* A glob, a brace list, and one file select shards; auto-detected. */
    char sel[4200];
    snprintf(sel, sizeof sel, "%s/shard-{000000..000001}.tar", shards);
    dsrt_datastore *t = open_ds(sel, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_shard_count(t), 2);
    CHECK_EQ(dsrt_datastore_id(t, 0), 0);
    size_t two = dsrt_datastore_count(t);
    dsrt_datastore_close(t);
    snprintf(sel, sizeof sel, "%s/shard-00000[01].tar", shards);
    t = open_ds(sel, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_count(t), two);
    dsrt_datastore_close(t);
    snprintf(sel, sizeof sel, "%s/shard-000002.tar", shards);
    t = open_ds(sel, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_shard_count(t), 1);
    dsrt_datastore_close(t);
    snprintf(sel, sizeof sel, "%s/shard-{000000,000999}.tar", shards);
    dsrt_datastore *bad = NULL;
    CHECK_EQ(dsrt_datastore_open(&bad, sel, NULL), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "shard-000999.tar");
    /* The simple read gives the folder's pixels. */
    dsrt_decoder *d;
    CHECK_OK(dsrt_decoder_create(&d, NULL));
    dsrt_decode_request req = {.channels = 3};
    dsrt_image a, b;
    CHECK_OK(dsrt_datastore_read_image(s, 11, d, &req, &a));
    size_t bytes = (size_t)a.width * a.height * 3;
    uint8_t *copy = malloc(bytes);
    memcpy(copy, a.data, bytes);
    CHECK_OK(dsrt_datastore_read_image(f, 11, d, &req, &b));
    CHECK(memcmp(copy, b.data, bytes) == 0);
    free(copy);
    dsrt_decoder_destroy(d);
    /* Writing again replaces the set; a foreign file in OUT is refused. */
    CHECK_EQ(write_shards(f, shards, 1 << 20, 0), 1);
    t = open_ds(shards, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_shard_count(t), 1);
    dsrt_datastore_close(t);
    const char *foreign[] = {"notes.txt", ".mydata.tmp", "shard-1.tar.bak"};
    for (size_t k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s", shards, foreign[k]);
        REQUIRE(timg_write_file(p, "x", 1) == 0);
        CHECK_EQ(write_shards(f, shards, 1 << 20, 0), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), foreign[k]);
        CHECK_EQ(access(p, F_OK), 0); /* refused, and kept */
        unlink(p);
    }
    CHECK_EQ(write_shards(f, shards, 64 << 10, 0) > 4, 1);
    dsrt_datastore_close(s);
    dsrt_datastore_close(f);
}

/* 1 when dir holds a whole set of n samples, opened from its index. */
static int set_whole(const char *dir, size_t n) {
    char p[4300];
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_INDEX_NAME, dir);
    if (access(p, F_OK) != 0) return 0;
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_CLASSES_NAME, dir);
    if (access(p, F_OK) != 0) return 0;
    dsrt_datastore *ds = NULL;
    if (dsrt_datastore_open(&ds, dir, NULL) != 0) return 0;
    int ok = dsrt_datastore_count(ds) == n && !strcmp(dsrt_datastore_warnings(ds), "");
    dsrt_datastore_close(ds);
    return ok;
}

/* A set is never written into, around or inside the folder it is made
 * from (real paths compared, links resolved): refused before any work,
 * naming both, and the source stays whole. */
static void test_write_apart(void) {
    char base[4200], set[4300], p[4400], q[4400];
    snprintf(base, sizeof base, "%s/apart", root);
    snprintf(set, sizeof set, "%s/set", base);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, set, 64 << 10, 0) > 1, 1);
    dsrt_datastore *s = open_ds(set, DSRT_SHARD_ORDER_AUTO);
    snprintf(p, sizeof p, "%s/link", base);
    REQUIRE(symlink("set", p) == 0);
    struct {
        const char *out, *how;
    } cases[] = {
        {"set", "is the source's folder"},
        {"set/", "is the source's folder"},
        {"link", "is the source's folder"},
        {"set/../set", "is the source's folder"},
        {"set/sub", "lies inside"},
        {"link/sub/deeper", "lies inside"},
        {".", "contains"},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        snprintf(p, sizeof p, "%s/%s", base, cases[k].out);
        CHECK_EQ(write_shards(s, p, 1 << 20, 0), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), p);
        CHECK_CONTAINS(dsrt_last_error(), cases[k].how);
        CHECK_CONTAINS(dsrt_last_error(), set);
        CHECK(set_whole(set, N_IMAGES));
    }
    snprintf(p, sizeof p, "%s/sub", set);
    CHECK_NE(access(p, F_OK), 0); /* nothing made */
    /* A selection of shards is a source in their folder too. */
    snprintf(p, sizeof p, "%s/shard-00000[01].tar", set);
    dsrt_datastore *sel = open_ds(p, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(sel, set, 1 << 20, 0), DSRT_EOPTION);
    CHECK(set_whole(set, N_IMAGES));
    dsrt_datastore_close(sel);
    /* A folder source: inside its root, or its root itself. */
    snprintf(p, sizeof p, "%s/shards-here", folder);
    CHECK_EQ(write_shards(f, p, 1 << 20, 0), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "lies inside the source's folder");
    CHECK_NE(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/class1/", folder);
    CHECK_EQ(write_shards(f, p, 1 << 20, 0), DSRT_EOPTION);
    /* Beside it is fine. */
    snprintf(q, sizeof q, "%s/copy", base);
    CHECK_EQ(write_shards(s, q, 1 << 20, 0), 1);
    CHECK(set_whole(q, N_IMAGES));
    dsrt_datastore_close(s);
    dsrt_datastore_close(f);
}

/* Entries of dir whose names start with prefix. */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* The bytes of a file, for checking that it was left alone. */
static char *slurp(const char *path) {
    uint8_t *data;
    size_t len;
    return dsrt__read_whole_file(path, 1 << 24, &data, &len) == 0 ? (char *)data : NULL;
}

/* The writer removes or replaces only what it made, as it made it: its
 * record in the folder lists the files of its set (and their sizes). A
 * shard-7.tar from GNU tar, a classes.json of the user's, a shard of the
 * set's name that is not the set's, a file of the set changed since: each
 * refused, named, and kept as it was. A set it wrote is replaced whole, its
 * shards beyond the new set's removed. */
static void test_write_own_only(void) {
    char out[4200], p[4300];
    snprintf(out, sizeof out, "%s/own", root);
    REQUIRE(timg_mkdirs(out) == 0);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    struct {
        const char *name, *text;
    } foreign[] = {{"shard-7.tar", "a tar of GNU tar's"},
                   {"classes.json", "[\"mine\"]"},
                   {"dsrt-shards.index", "not an index"}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(foreign); k++) {
        snprintf(p, sizeof p, "%s/%s", out, foreign[k].name);
        REQUIRE(timg_write_file(p, foreign[k].text, strlen(foreign[k].text)) == 0);
        CHECK_EQ(write_shards(f, out, 64 << 10, 0), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), foreign[k].name);
        CHECK_CONTAINS(dsrt_last_error(), "which dsrt did not write there");
        char *kept = slurp(p);
        CHECK_STR_EQ(kept, foreign[k].text);
        free(kept);
        CHECK_EQ(count_prefixed(out, "."), 2); /* nothing else made */
        unlink(p);
    }
    /* Its own set: replaced whole, the shards beyond the new set removed. */
    CHECK_GT(write_shards(f, out, 16 << 10, 0), 3);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), 1);
    CHECK(set_whole(out, N_IMAGES));
    CHECK_EQ(count_prefixed(out, "shard-"), 1);
    /* Among it, a foreign shard of the set's own naming, or a file of the set
     * changed since it was written. */
    snprintf(p, sizeof p, "%s/shard-000003.tar", out);
    REQUIRE(timg_write_file(p, "x", 1) == 0);
    CHECK_EQ(write_shards(f, out, 16 << 10, 0), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "'shard-000003.tar', which dsrt did not write there");
    CHECK_EQ(access(p, F_OK), 0);
    unlink(p);
    snprintf(p, sizeof p, "%s/classes.json", out);
    REQUIRE(timg_write_file(p, "[\"a\", \"b\", \"c\"]", 15) == 0);
    CHECK_EQ(write_shards(f, out, 16 << 10, 0), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "classes.json: is a file of 15 bytes, not what dsrt wrote");
    char *kept = slurp(p);
    CHECK_STR_EQ(kept, "[\"a\", \"b\", \"c\"]");
    free(kept);
    CHECK_EQ(count_prefixed(out, "shard-"), 1);
    dsrt_datastore_close(f);
}

/* A write that fails or dies midway leaves the set that was there whole
 * and nothing that reads as another: the new set is staged in a hidden
 * folder and moved into place only once whole. Into a new folder, a failed
 * write leaves no folder. The process killed by the file size limit (a
 * forced crash inside a shard's write) leaves a staging folder that the next
 * write removes. */
static void test_failed_write(void) {
    char src[4200], out[4200], fresh[4200], p[4300];
    snprintf(src, sizeof src, "%s/failing", root);
    snprintf(out, sizeof out, "%s/kept", root);
    snprintf(fresh, sizeof fresh, "%s/never", root);
    make_folder(src, 40, 2);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), 1);
    CHECK(set_whole(out, N_IMAGES));
    dsrt_datastore *g = open_ds(src, DSRT_SHARD_ORDER_AUTO);
    /* The last sample's file is gone: the write fails after many shards. */
    snprintf(p, sizeof p, "%s/class1/img039.jpg", src);
    REQUIRE(unlink(p) == 0);
    CHECK_EQ(write_shards(g, out, 8 << 10, 0), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "img039.jpg");
    CHECK(set_whole(out, N_IMAGES));
    snprintf(p, sizeof p, "%s/shard-000001.tar", out);
    CHECK_NE(access(p, F_OK), 0);
    CHECK_EQ(count_prefixed(out, "."), 3); /* ".", ".." and the writer's record */
    CHECK_EQ(write_shards(g, fresh, 8 << 10, 0), -ENOENT);
    CHECK_NE(access(fresh, F_OK), 0);
    dsrt_datastore_close(g);
    /* Killed inside the write of a shard. */
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct rlimit lim = {20 << 10, 20 << 10}, none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        setrlimit(RLIMIT_FSIZE, &lim);
        write_shards(f, out, 64 << 10, 0);
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    CHECK(set_whole(out, N_IMAGES));
    CHECK_EQ(count_prefixed(out, "shard-"), 1);
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 1);
    CHECK_GT(write_shards(f, out, 64 << 10, 0), 1);
    CHECK(set_whole(out, N_IMAGES));
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 0);
    dsrt_datastore_close(f);
}

/* The names of a set's files, made in dir as files of the user's (each
 * holding its own name), to see whether a write reached them. */
static const char *const bait_names[] = {"shard-000000.tar", DSRT_SHARD_CLASSES_NAME,
                                         DSRT_SHARD_INDEX_NAME};

static void make_bait(const char *dir) {
    char p[4400];
    REQUIRE(timg_mkdirs(dir) == 0);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bait_names); k++) {
        snprintf(p, sizeof p, "%s/%s", dir, bait_names[k]);
        REQUIRE(timg_write_file(p, bait_names[k], strlen(bait_names[k])) == 0);
    }
}

/* 1 when dir still holds the files make_bait made, each with its bytes. */
static int bait_kept(const char *dir) {
    char p[4400];
    int ok = 1;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bait_names); k++) {
        snprintf(p, sizeof p, "%s/%s", dir, bait_names[k]);
        char *got = slurp(p);
        ok &= got && !strcmp(got, bait_names[k]);
        free(got);
    }
    return ok;
}

/* Entries named as the writer names what it makes in a folder, but not
 * what it makes: a link to a folder elsewhere holding shard-000000.tar,
 * classes.json and dsrt-shards.index, a folder of the user's, a file of
 * other bytes, named like its temporary record; a link in place of a
 * staging folder of a killed write, and links inside one. Each is refused,
 * named, and nothing it holds or points to is touched: the writer never
 * looks or removes through a link. A temporary record a write left, and
 * the staging folder of a killed write, still go. */
static void test_write_never_through_links(void) {
    char out[4200], away[4200], aside[4200], p[4400], q[4400];
    snprintf(out, sizeof out, "%s/named", root);
    snprintf(away, sizeof away, "%s/named-away", root);
    snprintf(aside, sizeof aside, "%s/named-aside", root);
    make_bait(away);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), 1);
    snprintf(p, sizeof p, "%s/.dsrt-shards-written.tmp.4242", out);
    for (int kind = 0; kind < 4; kind++) {
        if (kind == 0) REQUIRE(symlink(away, p) == 0); /* a folder elsewhere */
        if (kind == 1) make_bait(p);                   /* a folder of the user's */
        if (kind == 2) REQUIRE(timg_write_file(p, "my notes", 8) == 0);
        if (kind == 3) { /* a file elsewhere */
            snprintf(q, sizeof q, "%s/" DSRT_SHARD_CLASSES_NAME, away);
            REQUIRE(symlink(q, p) == 0);
        }
        CHECK_EQ(write_shards(f, out, 16 << 10, 0), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), p);
        CHECK_CONTAINS(dsrt_last_error(), "left alone");
        CHECK(bait_kept(away));
        if (kind == 1) CHECK(bait_kept(p));
        if (kind == 2) {
            char *kept = slurp(p);
            CHECK_STR_EQ(kept, "my notes");
            free(kept);
        }
        CHECK(set_whole(out, N_IMAGES));
        CHECK_EQ(count_prefixed(out, "shard-"), 1);
        CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 0);
        if (kind == 1)
            for (size_t k = 0; k < DSRT_ARRAY_SIZE(bait_names); k++) {
                snprintf(q, sizeof q, "%s/%s", p, bait_names[k]);
                REQUIRE(unlink(q) == 0);
            }
        REQUIRE((kind == 1 ? rmdir(p) : unlink(p)) == 0);
    }
    /* What a write that stopped leaves there: nothing yet, or the start of
     * a record. Removed. */
    REQUIRE(timg_write_file(p, "", 0) == 0);
    snprintf(q, sizeof q, "%s/.dsrt-shards-written.tmp.4243", out);
    REQUIRE(timg_write_file(q, "dsrt shards written 1\n12", 24) == 0);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), 1);
    CHECK_NE(access(p, F_OK), 0);
    CHECK_NE(access(q, F_OK), 0);
    /* A write killed inside a shard leaves a staging folder its record
     * lists. */
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct rlimit lim = {20 << 10, 20 << 10}, none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        setrlimit(RLIMIT_FSIZE, &lim);
        write_shards(f, out, 64 << 10, 0);
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    char stage[4400] = "";
    DIR *d = opendir(out);
    REQUIRE(d);
    for (struct dirent *de; (de = readdir(d)) != NULL;)
        if (!strncmp(de->d_name, ".dsrt-staging-", 14))
            snprintf(stage, sizeof stage, "%s/%s", out, de->d_name);
    closedir(d);
    REQUIRE(stage[0]);
    /* In its place a link to a folder elsewhere. */
    REQUIRE(rename(stage, aside) == 0);
    REQUIRE(symlink(away, stage) == 0);
    CHECK_EQ(write_shards(f, out, 64 << 10, 0), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), stage);
    CHECK(bait_kept(away));
    REQUIRE(unlink(stage) == 0);
    /* A folder of its name holding links of the writer's names. */
    REQUIRE(mkdir(stage, 0700) == 0);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bait_names); k++) {
        snprintf(p, sizeof p, "%s/%s", away, bait_names[k]);
        snprintf(q, sizeof q, "%s/%s", stage, bait_names[k]);
        REQUIRE(symlink(p, q) == 0);
    }
    CHECK_EQ(write_shards(f, out, 64 << 10, 0), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), stage);
    CHECK_CONTAINS(dsrt_last_error(), "a symbolic link");
    CHECK_CONTAINS(dsrt_last_error(), "left alone");
    CHECK(bait_kept(away));
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bait_names); k++) {
        snprintf(q, sizeof q, "%s/%s", stage, bait_names[k]);
        struct stat sb;
        CHECK(lstat(q, &sb) == 0 && S_ISLNK(sb.st_mode));
        unlink(q);
    }
    REQUIRE(rmdir(stage) == 0);
    /* The killed write's own staging folder: removed by the next write. */
    REQUIRE(rename(aside, stage) == 0);
    CHECK_GT(write_shards(f, out, 64 << 10, 0), 1);
    CHECK(set_whole(out, N_IMAGES));
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 0);
    CHECK(bait_kept(away));
    dsrt_datastore_close(f);
}

/* A server of one file on 127.0.0.1 (the port is *port), in a child
 * process, that answers each GET only when the test lets it: on a request
 * it writes a byte to *arrived, and answers once it reads one from *go. */
static pid_t serve_held(const char *file, int *port, int *arrived, int *go) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    REQUIRE(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 8) == 0);
    REQUIRE(getsockname(s, (struct sockaddr *)&a, &alen) == 0);
    *port = ntohs(a.sin_port);
    int ap[2], gp[2];
    REQUIRE(pipe2(ap, O_CLOEXEC) == 0 && pipe2(gp, O_CLOEXEC) == 0);
    uint8_t *data;
    size_t len;
    REQUIRE(dsrt__read_whole_file(file, 1 << 24, &data, &len) == 0);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid > 0) {
        close(s);
        close(ap[1]);
        close(gp[0]);
        free(data);
        *arrived = ap[0];
        *go = gp[1];
        return pid;
    }
    close(ap[0]);
    close(gp[1]);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        char req[8192], head[256], byte;
        size_t got = 0;
        while (got + 1 < sizeof req) {
            ssize_t k = read(c, req + got, sizeof req - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n")) break;
        }
        if (write(ap[1], "r", 1) != 1 || read(gp[0], &byte, 1) != 1) _exit(0);
        int n =
            snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
        send(c, head, (size_t)n, MSG_NOSIGNAL);
        for (size_t at = 0; at < len;) {
            ssize_t k = send(c, data + at, len - at, MSG_NOSIGNAL);
            if (k <= 0) break;
            at += (size_t)k;
        }
        close(c);
    }
}

/* Forks a writer of ds into out; *ended is a pipe that reads its end. */
static pid_t fork_writer(const dsrt_datastore *ds, const char *out, int *ended) {
    int ep[2];
    REQUIRE(pipe2(ep, O_CLOEXEC) == 0);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(ep[0]);
        _exit(write_shards(ds, out, 1 << 20, 0) == 1 ? 0 : 1);
    }
    close(ep[1]);
    *ended = ep[0];
    return pid;
}

/* Waits until the server has the writer's request (the writer is then
 * inside its write, past its checks, its staging folder made), or the
 * writer ended without one: 1 when the request came. */
static int writer_waiting(int arrived, int ended) {
    struct pollfd fds[2] = {{.fd = arrived, .events = POLLIN}, {.fd = ended, .events = POLLIN}};
    while (poll(fds, 2, -1) < 0) REQUIRE(errno == EINTR);
    char byte;
    return (fds[0].revents & POLLIN) && read(arrived, &byte, 1) == 1;
}

/* Two writers into one new folder at once. The first reads a sample from a
 * server that holds its answer until the second has tried: the first is
 * then inside its write, for certain. The second fails at once, saying
 * that another writer is at work there, and changes nothing; the first
 * finishes and its set is whole. A writer killed there leaves its lock
 * with it: the next write goes ahead and removes its staging folder. */
static void test_two_writers(void) {
    char dir[4200], out[4200], csv[4300], img[4300], text[2048];
    snprintf(dir, sizeof dir, "%s/two", root);
    snprintf(out, sizeof out, "%s/two/out", root);
    snprintf(csv, sizeof csv, "%s/two/m.csv", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    snprintf(img, sizeof img, "%s/class0/img000.jpg", folder);
    int port, arrived, go, ended;
    pid_t server = serve_held(img, &port, &arrived, &go);
    snprintf(text, sizeof text,
             "http://127.0.0.1:%d/img000.jpg,a\n%s/class0/img001.jpg,a\n%s/class2/img081.jpg,b\n",
             port, folder, folder);
    REQUIRE(timg_write_file(csv, text, strlen(text)) == 0);
    dsrt_datastore *m = open_ds(csv, DSRT_SHARD_ORDER_AUTO);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_count(m), 3);
    pid_t first = fork_writer(m, out, &ended);
    CHECK(writer_waiting(arrived, ended));
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 1);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), -EBUSY);
    CHECK_CONTAINS(dsrt_last_error(), out);
    CHECK_CONTAINS(dsrt_last_error(), "another dsrt writer is at work in this folder");
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 1); /* the first's, kept */
    REQUIRE(write(go, "g", 1) == 1);
    int status = 0;
    REQUIRE(waitpid(first, &status, 0) == first);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(ended);
    CHECK(set_whole(out, 3));
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 0);
    CHECK_EQ(count_prefixed(out, "shard-"), 1);
    CHECK_EQ(count_prefixed(out, "."), 3); /* ".", ".." and the record */
    /* Killed while inside its write. */
    first = fork_writer(m, out, &ended);
    CHECK(writer_waiting(arrived, ended));
    kill(first, SIGKILL);
    REQUIRE(waitpid(first, NULL, 0) == first);
    close(ended);
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 1);
    CHECK_EQ(write_shards(f, out, 1 << 20, 0), 1);
    CHECK(set_whole(out, N_IMAGES));
    CHECK_EQ(count_prefixed(out, ".dsrt-staging-"), 0);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    close(arrived);
    close(go);
    dsrt_datastore_close(f);
    dsrt_datastore_close(m);
}

/* In-memory sources are written as PNGs, losslessly. */
static void test_write_pixels(void) {
    char dir[4200], out[4200];
    snprintf(dir, sizeof dir, "%s/idx", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    /* An IDX pair: 30 images of 6x5. */
    uint8_t img[16 + 30 * 30], lab[8 + 30];
    memcpy(img, "\0\0\x08\x03\0\0\0\x1e\0\0\0\x05\0\0\0\x06", 16);
    memcpy(lab, "\0\0\x08\x01\0\0\0\x1e", 8);
    for (int i = 0; i < 30 * 30; i++) img[16 + i] = (uint8_t)timg_hash((uint32_t)i);
    for (int i = 0; i < 30; i++) lab[8 + i] = (uint8_t)(i % 4);
    snprintf(out, sizeof out, "%s/train-images-idx3-ubyte", dir);
    REQUIRE(timg_write_file(out, img, sizeof img) == 0);
    snprintf(out, sizeof out, "%s/train-labels-idx1-ubyte", dir);
    REQUIRE(timg_write_file(out, lab, sizeof lab) == 0);
    snprintf(out, sizeof out, "%s/train-images-idx3-ubyte", dir);
    dsrt_datastore *m = open_ds(out, DSRT_SHARD_ORDER_AUTO);
    snprintf(out, sizeof out, "%s/idx-shards", root);
    CHECK_EQ(write_shards(m, out, 1 << 20, 7), 5);
    dsrt_datastore *s = open_ds(out, DSRT_SHARD_ORDER_EXACT);
    CHECK_EQ(dsrt_datastore_count(s), 30);
    CHECK_EQ(dsrt_datastore_num_classes(s), dsrt_datastore_num_classes(m));
    dsrt_decoder *d;
    CHECK_OK(dsrt_decoder_create(&d, NULL));
    dsrt_decode_request req = {.channels = 1};
    for (size_t i = 0; i < 30; i++) {
        dsrt_image a, b;
        CHECK_OK(dsrt_datastore_read_image(s, i, d, &req, &a));
        CHECK_OK(dsrt_datastore_pixels(m, i, &b));
        CHECK_EQ(a.width, 6);
        CHECK_EQ(a.height, 5);
        CHECK(memcmp(a.data, b.data, 30) == 0);
        CHECK_EQ(dsrt_datastore_label(s, i), dsrt_datastore_label(m, i));
        CHECK_CONTAINS(dsrt_datastore_path(s, i), ".png");
    }
    dsrt_decoder_destroy(d);
    dsrt_datastore_close(s);
    dsrt_datastore_close(m);
}

/* A writer killed at any moment leaves only complete shards under their
 * final names, and no index unless the set is whole. */
static void test_killed_writer(void) {
    char out[4200];
    snprintf(out, sizeof out, "%s/killed", root);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            for (;;) write_shards(f, out, 8 << 10, 0); /* until killed */
        }
        /* Kill it once some shard of round `round` has its final name. */
        char p[4300];
        snprintf(p, sizeof p, "%s/shard-%06d.tar", out, 3 + 4 * round);
        for (int k = 0; k < 20000 && access(p, F_OK) != 0; k++) usleep(500);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        /* Every shard with a final name is a whole tar: it ends with the
         * end-of-archive marker, and its members walk without a warning. */
        for (int k = 0;; k++) {
            snprintf(p, sizeof p, "%s/shard-%06d.tar", out, k);
            int fd = open(p, O_RDONLY);
            if (fd < 0) break;
            struct stat st;
            REQUIRE(fstat(fd, &st) == 0);
            uint8_t tail[1024], zero[1024] = {0};
            CHECK_EQ(st.st_size % 512, 0);
            CHECK_EQ(pread(fd, tail, 1024, st.st_size - 1024), 1024);
            CHECK(memcmp(tail, zero, 1024) == 0);
            close(fd);
        }
        /* Opening never sees a half-written shard: either the index (whole
         * set) or a scan of complete shards. */
        dsrt_datastore *s = NULL;
        if (dsrt_datastore_open(&s, out, NULL) == 0) {
            CHECK_STR_EQ(dsrt_datastore_warnings(s), "");
            dsrt_datastore_close(s);
        }
    }
    dsrt_datastore_close(f);
}

// ----------------------------------------------------------------------------
// Reading through the pipeline

/* The exact order gives the folder's batches, bit for bit. */
static void test_exact_equals_folder(void) {
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    dsrt_datastore *s = open_ds(shards, DSRT_SHARD_ORDER_EXACT);
    CHECK_EQ(dsrt_datastore_shard_order(s), DSRT_SHARD_ORDER_EXACT);
    dsrt_pipeline_options o = small_options();
    size_t nb = 2 * ((N_IMAGES + 7) / 8);
    rec *a = run(f, &o, nb, NULL), *b = run(s, &o, nb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
    free(b);
    /* Also with O_DIRECT, pread, and shuffle never (neighbours merged). */
    o.reader.direct = 1;
    b = run(s, &o, nb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
    free(b);
    o.reader.direct = 0;
    o.reader.io = DSRT_IO_PREAD;
    b = run(s, &o, nb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
    free(b);
    free(a);
    o = small_options();
    o.shuffle = DSRT_SHUFFLE_NEVER;
    a = run(f, &o, nb, NULL);
    b = run(s, &o, nb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
    free(a);
    free(b);
    dsrt_datastore_close(s);
    dsrt_datastore_close(f);
}

/* Every sample once an epoch, in an order that is a pure function of (seed,
 * epoch): any thread count, io back-end, O_DIRECT give the same batches. */
static void test_shard_order(void) {
    dsrt_datastore *s = open_ds(shards, DSRT_SHARD_ORDER_SHARD);
    CHECK_EQ(dsrt_datastore_shard_order(s), DSRT_SHARD_ORDER_SHARD);
    dsrt_pipeline_options o = small_options();
    size_t bpe = (N_IMAGES + 7) / 8, nb = 3 * bpe;
    dsrt_pipeline_statistics st;
    rec *a = run(s, &o, nb, &st);
    /* Each epoch is a permutation, and epochs differ. */
    for (size_t e = 0; e < 3; e++) {
        uint8_t seen[N_IMAGES] = {0};
        for (size_t k = e * bpe; k < (e + 1) * bpe; k++)
            for (size_t j = 0; j < a[k].count; j++) seen[a[k].ids[j]]++;
        for (size_t i = 0; i < N_IMAGES; i++) CHECK_EQ(seen[i], 1);
    }
    CHECK_NE(a[0].hash, a[bpe].hash);
    /* The samples came from the stream, read front to back. */
    CHECK_GE(st.stream_samples, (uint64_t)(3 * N_IMAGES * 9 / 10));
    CHECK_LE(st.stream_ranged, (uint64_t)(3 * N_IMAGES / 10));
    CHECK_GT(st.stream_bytes, 0);
    /* Shard order: consecutive samples of a batch share a shard far more
     * often than in a global shuffle (the buffer of 16 mixes neighbours). */
    size_t same = 0, pairs = 0;
    for (size_t k = 0; k < bpe; k++)
        for (size_t j = 1; j < a[k].count; j++, pairs++) {
            dsrt_sample_location x, y;
            dsrt_datastore_location(s, a[k].ids[j - 1], &x);
            dsrt_datastore_location(s, a[k].ids[j], &y);
            same += x.shard == y.shard;
        }
    CHECK_GT(same * dsrt_datastore_shard_count(s), 2 * pairs); /* a global shuffle: ~pairs */
    for (int v = 0; v < 3; v++) {
        dsrt_pipeline_options p = small_options();
        p.threads = v == 0 ? 1 : 3;
        p.reader.io = v == 1 ? DSRT_IO_PREAD : DSRT_IO_AUTO;
        p.reader.direct = v == 2;
        p.prefetch = v == 0 ? 1 : 4;
        rec *b = run(s, &p, nb, NULL);
        for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
        free(b);
    }
    /* Shuffle never keeps the set's order. */
    o.shuffle = DSRT_SHUFFLE_NEVER;
    rec *c = run(s, &o, bpe, NULL);
    for (size_t k = 0, i = 0; k < bpe; k++)
        for (size_t j = 0; j < c[k].count; j++, i++) CHECK_EQ(c[k].ids[j], i);
    free(c);
    free(a);
    dsrt_datastore_close(s);
}

/* A resume mid-epoch gives the batches of the uninterrupted run, bit for
 * bit, in both orders; so does a reset of a running pipeline. */
static void test_resume(void) {
    for (int order = DSRT_SHARD_ORDER_EXACT; order <= DSRT_SHARD_ORDER_SHARD; order++) {
        dsrt_datastore *s = open_ds(shards, (dsrt_shard_order)order);
        dsrt_pipeline_options o = small_options();
        o.epochs = 3;
        size_t bpe = (N_IMAGES + 7) / 8, nb = 3 * bpe;
        rec *a = run(s, &o, nb, NULL);
        dsrt_augment_options aug = small_aug();
        size_t starts[][2] = {{1, 5}, {0, 3}, {2, 0}, {1, bpe - 1}};
        for (size_t t = 0; t < 4; t++) {
            dsrt_pipeline *p = NULL;
            REQUIRE(dsrt_pipeline_open(&p, s, &aug, &o) == 0);
            if (t == 1) { /* a running pipeline, mid-epoch, reset */
                rec skip[2];
                CHECK_EQ(take(p, skip, 2), 2);
            }
            CHECK_OK(dsrt_pipeline_reset(p, starts[t][0], starts[t][1]));
            size_t from = starts[t][0] * bpe + starts[t][1];
            rec *b = calloc(nb, sizeof *b);
            CHECK_EQ(take(p, b, nb - from), nb - from);
            for (size_t k = 0; k < nb - from; k++) {
                CHECK_EQ(b[k].hash, a[from + k].hash);
                if (b[k].hash != a[from + k].hash) {
                    fprintf(stderr, "  order %d, start %zu/%zu: batch %zu differs\n", order,
                            starts[t][0], starts[t][1], k);
                    break;
                }
            }
            free(b);
            dsrt_pipeline_close(p);
        }
        free(a);
        dsrt_datastore_close(s);
    }
}

/* Parts (data-parallel ranks) in the shard order take whole shards; their
 * union is every sample once an epoch. */
static void test_parts(void) {
    char out[4200];
    snprintf(out, sizeof out, "%s/even", root);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 10), 12);
    dsrt_datastore *s = open_ds(out, DSRT_SHARD_ORDER_SHARD);
    size_t bpe = N_IMAGES / 8;
    uint8_t seen[N_IMAGES] = {0};
    int owner[12];
    for (int k = 0; k < 12; k++) owner[k] = -1;
    for (unsigned part = 0; part < 2; part++) {
        dsrt_pipeline_options o = small_options();
        o.parts = 2;
        o.part = part;
        dsrt_pipeline_statistics st;
        rec *r = run(s, &o, bpe, &st);
        CHECK_EQ(st.stream_ranged, 0);
        for (size_t k = 0; k < bpe; k++) {
            CHECK_EQ(r[k].count, 4);
            for (size_t j = 0; j < r[k].count; j++) {
                uint32_t id = r[k].ids[j];
                seen[id]++;
                dsrt_sample_location loc;
                dsrt_datastore_location(s, id, &loc);
                CHECK(owner[loc.shard] == -1 || owner[loc.shard] == (int)part);
                owner[loc.shard] = (int)part;
            }
        }
        free(r);
    }
    for (size_t i = 0; i < N_IMAGES; i++) CHECK_EQ(seen[i], 1);
    dsrt_datastore_close(s);
    dsrt_datastore_close(f);
}

/* The ids of every batch of `batches` from (epoch, batch) on, for each of
 * `parts` parts resumed from a run of from_parts parts, concatenated part
 * after part: batch k's ids into ids[k], its count into count[k]. */
static void run_parts(const dsrt_datastore *s, dsrt_pipeline_options o, unsigned parts,
                      unsigned from_parts, uint64_t epoch, uint64_t batch, size_t batches,
                      uint32_t (*ids)[8], size_t *count) {
    dsrt_augment_options aug = small_aug();
    memset(count, 0, batches * sizeof *count);
    rec *r = calloc(batches, sizeof *r);
    REQUIRE(r);
    for (unsigned part = 0; part < parts; part++) {
        o.parts = parts;
        o.part = part;
        dsrt_pipeline *p = NULL;
        REQUIRE(dsrt_pipeline_open(&p, s, &aug, &o) == 0);
        if (epoch || batch || from_parts)
            CHECK_OK(dsrt_pipeline_resume(p, epoch, batch, from_parts));
        CHECK_EQ(take(p, r, batches), batches);
        for (size_t k = 0; k < batches; k++)
            for (size_t j = 0; j < r[k].count && count[k] < 8; j++)
                ids[k][count[k]++] = r[k].ids[j];
        dsrt_pipeline_close(p);
    }
    free(r);
}

/* A run of 2 parts stopped mid-epoch and resumed on 1 and on 3 parts (an
 * elastic restart), in both orders: every batch from there is the batch the
 * 2 parts would have made, sample for sample, striped over the new parts, so
 * the interrupted epoch holds each sample exactly once; the next epochs are
 * those of a fresh run on the new parts. */
static void test_elastic_resume(void) {
    char out[4200];
    snprintf(out, sizeof out, "%s/elastic", root);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 10), 12);
    dsrt_datastore_close(f);
    enum { BPE = N_IMAGES / 8, AT = 6 };
    static uint32_t whole[3 * BPE][8], rest[3 * BPE][8], fresh[3 * BPE][8];
    size_t nw[3 * BPE], nr[3 * BPE], nf[3 * BPE];
    for (int order = DSRT_SHARD_ORDER_EXACT; order <= DSRT_SHARD_ORDER_SHARD; order++) {
        dsrt_datastore *s = open_ds(out, (dsrt_shard_order)order);
        dsrt_pipeline_options o = small_options();
        o.epochs = 3;
        /* The uninterrupted run on 2 parts: its epoch 1 is what the
         * interrupted one had done up to batch AT and would have done after. */
        run_parts(s, o, 2, 0, 0, 0, 3 * BPE, whole, nw);
        for (unsigned parts = 1; parts <= 3; parts += 2) {
            run_parts(s, o, parts, 2, 1, AT, 2 * BPE - AT, rest, nr);
            run_parts(s, o, parts, 0, 0, 0, 3 * BPE, fresh, nf);
            uint8_t seen[N_IMAGES] = {0};
            for (size_t k = BPE; k < BPE + AT; k++)
                for (size_t j = 0; j < nw[k]; j++) seen[whole[k][j]]++;
            int same = 1;
            for (size_t k = 0; k < BPE - AT; k++) {
                same &= nr[k] == nw[BPE + AT + k] &&
                        !memcmp(rest[k], whole[BPE + AT + k], nr[k] * sizeof rest[k][0]);
                for (size_t j = 0; j < nr[k]; j++) seen[rest[k][j]]++;
            }
            for (size_t i = 0; i < N_IMAGES; i++) CHECK_EQ(seen[i], 1);
            CHECK(same);
            /* Epoch 2: the new parts' own order. */
            for (size_t k = 0; k < BPE; k++) {
                CHECK_EQ(nr[BPE - AT + k], nf[2 * BPE + k]);
                CHECK(!memcmp(rest[BPE - AT + k], fresh[2 * BPE + k], nf[2 * BPE + k] * 4));
            }
            fprintf(stderr, "  %s order: 2 parts stopped at epoch 1 batch %d, resumed on %u: %s\n",
                    order == DSRT_SHARD_ORDER_EXACT ? "exact" : "shard", AT, parts,
                    same ? "the same batches, each sample once" : "DIFFERENT");
        }
        dsrt_datastore_close(s);
    }
}

/* Reads sample pos of epoch through r; its size, or -1 when it failed. */
static long stream_get(dsrt_shard_reader *r, uint32_t pos, uint64_t epoch, uint8_t *buf,
                       size_t cap) {
    if (dsrt__shard_reader_submit(r, pos, epoch, buf, cap, pos) != 0) return -1;
    dsrt_read_result res;
    if (dsrt__shard_reader_collect(r, &res, 1) != 1 || res.status != 0 || res.tag != pos) return -1;
    return (long)res.size;
}

static void *stream_main(void *arg) {
    dsrt__shard_stream_run(arg);
    return NULL;
}

/* A worker that lags behind the others at an epoch's end still gets its
 * sample from the stream after requests of the next two epochs made the
 * stream read on: it keeps every epoch its consumer says may be open. */
static void test_stream_lag(void) {
    dsrt_datastore *s = open_ds(shards, DSRT_SHARD_ORDER_SHARD);
    size_t n = dsrt_datastore_count(s), cap = 1 << 20;
    dsrt_shard_plan_options po = {.shuffle = DSRT_SHUFFLE_EVERY_EPOCH, .seed = 3, .batch = 8};
    dsrt_shard_stream_options so = {.reader = dsrt_reader_defaults(), .open_epochs = 3};
    dsrt_shard_stream *st = NULL;
    dsrt_shard_reader *r = NULL;
    REQUIRE(dsrt__shard_stream_create(&st, s, &po, &so) == 0);
    REQUIRE(dsrt__shard_reader_create(&r, s, &so.reader, st) == 0);
    pthread_t thread;
    REQUIRE(pthread_create(&thread, NULL, stream_main, st) == 0);
    uint32_t *order = malloc(n * sizeof *order), *first = malloc(n * sizeof *first);
    uint8_t *buf = malloc(cap);
    REQUIRE(order && first && buf);
    /* Epoch 0 but its last place, then the first place of epochs 1 and 2. */
    CHECK_OK(dsrt__shard_stream_order(st, 0, 0, first));
    for (size_t t = 0; t + 1 < n; t++)
        CHECK_EQ(stream_get(r, first[t], 0, buf, cap), (long)dsrt__shard_sample_size(s, first[t]));
    for (uint64_t e = 1; e <= 2; e++) {
        CHECK_OK(dsrt__shard_stream_order(st, e, 0, order));
        CHECK_EQ(stream_get(r, order[0], e, buf, cap), (long)dsrt__shard_sample_size(s, order[0]));
    }
    /* The straggler of epoch 0. */
    CHECK_EQ(stream_get(r, first[n - 1], 0, buf, cap),
             (long)dsrt__shard_sample_size(s, first[n - 1]));
    dsrt_shard_stream_stats ss;
    dsrt__shard_stream_stats(st, &ss);
    CHECK_EQ(ss.ranged, 0);
    CHECK_EQ(ss.served, n + 2);
    dsrt__shard_stream_stop(st);
    pthread_join(thread, NULL);
    dsrt__shard_reader_destroy(r);
    dsrt__shard_stream_destroy(st);
    free(order);
    free(first);
    free(buf);
    dsrt_datastore_close(s);
}

/* Copies the file from to to. */
static void copy_file(const char *from, const char *to) {
    uint8_t *data;
    size_t len;
    REQUIRE(dsrt__read_whole_file(from, (size_t)1 << 30, &data, &len) == 0);
    REQUIRE(timg_write_file(to, data, len) == 0);
    free(data);
}

/* Brace lists are capped in total, counted before a name is made: groups
 * multiply, each under the cap alone. A group that is no list stays as it
 * is and the groups after it still expand. */
static void test_brace_lists(void) {
    char dir[4200], p[4300], q[4300];
    snprintf(dir, sizeof dir, "%s/braces", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    const char *huge[] = {"{0..1999}{0..999}.tar", "{0..9999}{0..9999}.tar",
                          ("{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}"
                           "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}.tar"),
                          "{0..99}{x}{0..99}{,{0..199}}.tar"};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(huge); k++) {
        snprintf(p, sizeof p, "%s/%s", dir, huge[k]);
        dsrt_datastore *ds = NULL;
        CHECK_EQ(dsrt_datastore_open(&ds, p, NULL), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), p);
        CHECK_CONTAINS(dsrt_last_error(), "more than 1048576 names");
    }
    /* "{x}" is kept; the range after it expands. */
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/shard-%06d.tar", shards, k);
        snprintf(q, sizeof q, "%s/{x}-%d.tar", dir, k);
        copy_file(p, q);
    }
    snprintf(p, sizeof p, "%s/{x}-{0..1}.tar", dir);
    dsrt_datastore *ds = open_ds(p, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_shard_count(ds), 2);
    CHECK_CONTAINS(dsrt_datastore_shard_path(ds, 1), "/{x}-1.tar");
    dsrt_datastore_close(ds);
}

/* Submits sample pos of epoch 0 to r and collects it: its status. */
static int read_status(dsrt_shard_reader *r, uint32_t pos, uint8_t *buf, size_t cap) {
    REQUIRE(dsrt__shard_reader_submit(r, pos, 0, buf, cap, pos) == 0);
    dsrt_read_result res;
    REQUIRE(dsrt__shard_reader_collect(r, &res, 1) == 1);
    CHECK_EQ(res.tag, pos);
    return res.status;
}

/* A shard replaced by a FIFO after the set was opened is refused, named,
 * in both orders; its open never waits for a writer. The test holds the
 * FIFO open for writing, full, so that a reader that opened it anyway would
 * read its bytes (and fail the checks) rather than wait. */
static void test_fifo_shard(void) {
    char out[4200], p[4300];
    snprintf(out, sizeof out, "%s/fifo", root);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 10), N_IMAGES / 10);
    dsrt_datastore_close(f);
    dsrt_datastore *x = open_ds(out, DSRT_SHARD_ORDER_EXACT);
    dsrt_datastore *s = open_ds(out, DSRT_SHARD_ORDER_SHARD);
    snprintf(p, sizeof p, "%s/shard-000001.tar", out);
    REQUIRE(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    int wfd = open(p, O_RDWR | O_NONBLOCK);
    REQUIRE(wfd >= 0);
    static uint8_t fill[4096];
    while (write(wfd, fill, sizeof fill) > 0) continue;
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    REQUIRE(buf);
    /* Sample 15 lies in shard 1, sample 5 in shard 0. */
    dsrt_reader_options ro = dsrt_reader_defaults();
    dsrt_shard_reader *r = NULL;
    REQUIRE(dsrt__shard_reader_create(&r, x, &ro, NULL) == 0);
    CHECK_EQ(read_status(r, 15, buf, cap), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "shard-000001.tar: is a FIFO, not a regular file");
    CHECK_EQ(read_status(r, 5, buf, cap), 0);
    dsrt__shard_reader_destroy(r);
    /* The stream of the shard order. */
    dsrt_shard_plan_options po = {.shuffle = DSRT_SHUFFLE_EVERY_EPOCH, .seed = 3, .batch = 8};
    dsrt_shard_stream_options so = {.reader = dsrt_reader_defaults(), .block = 16 << 10};
    dsrt_shard_stream *st = NULL;
    REQUIRE(dsrt__shard_stream_create(&st, s, &po, &so) == 0);
    REQUIRE(dsrt__shard_reader_create(&r, s, &so.reader, st) == 0);
    pthread_t thread;
    REQUIRE(pthread_create(&thread, NULL, stream_main, st) == 0);
    CHECK_EQ(read_status(r, 15, buf, cap), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "shard-000001.tar: is a FIFO, not a regular file");
    CHECK_EQ(read_status(r, 5, buf, cap), 0);
    dsrt__shard_stream_stop(st);
    pthread_join(thread, NULL);
    dsrt__shard_reader_destroy(r);
    dsrt__shard_stream_destroy(st);
    close(wfd);
    free(buf);
    dsrt_datastore_close(s);
    dsrt_datastore_close(x);
}

/* partition gives whole shards; split_each_label works on shard sets. */
static void test_views(void) {
    dsrt_datastore *s = open_ds(shards, DSRT_SHARD_ORDER_SHARD);
    size_t ns = dsrt_datastore_shard_count(s), total = 0;
    uint8_t *owner = calloc(ns, 1);
    for (size_t i = 0; i < 3; i++) {
        dsrt_datastore *p = NULL;
        CHECK_OK(dsrt_datastore_partition(s, 3, i, &p));
        CHECK_GT(dsrt_datastore_count(p), N_IMAGES / 6);
        total += dsrt_datastore_count(p);
        for (size_t j = 0; j < dsrt_datastore_count(p); j++) {
            dsrt_sample_location loc;
            dsrt_datastore_location(p, j, &loc);
            CHECK(owner[loc.shard] == 0 || owner[loc.shard] == i + 1);
            owner[loc.shard] = (uint8_t)(i + 1);
        }
        /* A part reads in the shard order too. */
        dsrt_pipeline_options o = small_options();
        rec *r = run(p, &o, 2, NULL);
        free(r);
        dsrt_datastore_close(p);
    }
    CHECK_EQ(total, N_IMAGES);
    dsrt_datastore *p = NULL;
    CHECK_EQ(dsrt_datastore_partition(s, ns + 1, 0, &p), DSRT_EOPTION);
    free(owner);

    dsrt_split_options sp = {.fraction = 0.75, .randomized = 1, .seed = 3};
    dsrt_datastore *tr = NULL, *va = NULL;
    CHECK_OK(dsrt_datastore_split_each_label(s, &sp, &tr, &va));
    CHECK_EQ(dsrt_datastore_count(tr), 90);
    dsrt_pipeline_options o = small_options();
    size_t bpe = (90 + 7) / 8;
    dsrt_pipeline_statistics st;
    rec *r = run(tr, &o, bpe, &st);
    uint8_t seen[N_IMAGES] = {0};
    for (size_t k = 0; k < bpe; k++)
        for (size_t j = 0; j < r[k].count; j++) seen[r[k].ids[j]]++;
    size_t once = 0;
    for (size_t i = 0; i < N_IMAGES; i++) once += seen[i] == 1;
    CHECK_EQ(once, 90);
    free(r);
    dsrt_datastore_close(tr);
    dsrt_datastore_close(va);
    dsrt_datastore_close(s);
}

// ----------------------------------------------------------------------------
// Shards of other tools, damaged shards

static int have_tar(void) {
    return system("tar --version >/dev/null 2>&1") == 0;
}

/* GNU tar, in its own format and in pax: read, labelled by folder; sorted by
 * name, the exact order equals the folder's batches. */
static void test_gnu_tar(void) {
    if (!have_tar()) {
        fprintf(stderr, "  (no tar: skipped)\n");
        return;
    }
    char dir[4200], cmd[16384];
    snprintf(dir, sizeof dir, "%s/gnu", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    snprintf(cmd, sizeof cmd,
             "tar -C '%s' --sort=name --format=gnu -cf '%s/a.tar' . && "
             "tar -C '%s' --sort=name --format=pax -cf '%s/b.tar' class1",
             folder, dir, folder, dir);
    REQUIRE(system(cmd) == 0);
    char p[4300];
    snprintf(p, sizeof p, "%s/a.tar", dir);
    dsrt_datastore *g = open_ds(p, DSRT_SHARD_ORDER_EXACT);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_count(g), N_IMAGES);
    CHECK_EQ(dsrt_datastore_num_classes(g), 3);
    CHECK_STR_EQ(dsrt_datastore_class_name(g, 1), "class1");
    dsrt_pipeline_options o = small_options();
    size_t nb = (N_IMAGES + 7) / 8;
    rec *a = run(f, &o, nb, NULL), *b = run(g, &o, nb, NULL);
    for (size_t k = 0; k < nb; k++) CHECK_EQ(a[k].hash, b[k].hash);
    free(a);
    free(b);
    dsrt_datastore_close(g);
    dsrt_datastore_close(f);
    /* Both archives as one set (a folder without an index). */
    g = open_ds(dir, DSRT_SHARD_ORDER_SHARD);
    CHECK_EQ(dsrt_datastore_count(g), N_IMAGES + N_IMAGES / 3);
    dsrt_datastore_close(g);

    /* Long names (past ustar's 100 bytes) in both formats. */
    char deep[4200];
    snprintf(deep, sizeof deep, "%s/long", root);
    const char *longdir = "a_folder_with_a_name_long_enough_to_need_extensions/"
                          "and_another_one_below_it_that_is_also_quite_long";
    for (int c = 0; c < 2; c++) {
        snprintf(p, sizeof p, "%s/src/%s/cat%d", deep, longdir, c);
        REQUIRE(timg_mkdirs(p) == 0);
        for (int i = 0; i < 3; i++) {
            size_t len = 0;
            uint8_t *buf = timg_make_jpeg(TIMG_JPEG_420, 20, 20, (uint32_t)(i + 10 * c), &len);
            snprintf(p, sizeof p, "%s/src/%s/cat%d/an_image_file_name_of_some_length_%d.jpg", deep,
                     longdir, c, i);
            REQUIRE(timg_write_file(p, buf, len) == 0);
            free(buf);
        }
    }
    const char *formats[] = {"gnu", "pax"};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "tar -C '%s/src' --sort=name --format=%s -cf '%s/%s.tar' "
                 "a_folder_with_a_name_long_enough_to_need_extensions",
                 deep, formats[k], deep, formats[k]);
        REQUIRE(system(cmd) == 0);
        snprintf(p, sizeof p, "%s/%s.tar", deep, formats[k]);
        dsrt_datastore *l = open_ds(p, DSRT_SHARD_ORDER_AUTO);
        CHECK_EQ(dsrt_datastore_count(l), 6);
        CHECK_EQ(dsrt_datastore_num_classes(l), 2);
        CHECK_STR_EQ(dsrt_datastore_class_name(l, 1), "cat1");
        CHECK_CONTAINS(dsrt_datastore_path(l, 5), "cat1/an_image_file_name_of_some_length_2.jpg");
        CHECK_EQ(dsrt_datastore_label(l, 5), 1);
        dsrt_datastore_close(l);
    }
}

/* A shard cut short: with the index, the samples past its end are bad
 * samples named with shard and key; without it, the scan stops there. Both
 * orders skip them like bad files. */
static void test_truncated(void) {
    char out[4200], p[4300];
    snprintf(out, sizeof out, "%s/trunc", root);
    dsrt_datastore *f = open_ds(folder, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(write_shards(f, out, 1 << 20, 30), 4);
    dsrt_datastore_close(f);
    snprintf(p, sizeof p, "%s/shard-000001.tar", out);
    struct stat st;
    REQUIRE(stat(p, &st) == 0);
    dsrt_datastore *s = open_ds(out, DSRT_SHARD_ORDER_EXACT);
    dsrt_sample_location loc;
    CHECK_OK(dsrt_datastore_location(s, 45, &loc));
    CHECK_EQ(loc.shard, 1);
    dsrt_datastore_close(s);
    REQUIRE(truncate(p, (off_t)(loc.offset + 100)) == 0);
    for (int indexed = 1; indexed >= 0; indexed--) {
        if (!indexed) {
            char ix[4300];
            snprintf(ix, sizeof ix, "%s/" DSRT_SHARD_INDEX_NAME, out);
            REQUIRE(unlink(ix) == 0);
        }
        for (int order = DSRT_SHARD_ORDER_EXACT; order <= DSRT_SHARD_ORDER_SHARD; order++) {
            s = open_ds(out, (dsrt_shard_order)order);
            /* Without the index the scan of shard 1 ends in sample 45. */
            CHECK_EQ(dsrt_datastore_count(s), indexed ? N_IMAGES : N_IMAGES - 14);
            CHECK_CONTAINS(dsrt_datastore_warnings(s), indexed ? "truncated" : "");
            dsrt_pipeline_options o = small_options();
            size_t bpe = (dsrt_datastore_count(s) + 7) / 8;
            dsrt_augment_options aug = small_aug();
            dsrt_pipeline *pp = NULL;
            REQUIRE(dsrt_pipeline_open(&pp, s, &aug, &o) == 0);
            rec *r = calloc(bpe, sizeof *r);
            CHECK_EQ(take(pp, r, bpe), bpe);
            dsrt_bad_sample bad[32];
            size_t nbad = dsrt_pipeline_bad_samples(pp, 0, bad, 32);
            CHECK_EQ(nbad, indexed ? 15 : 1);
            int named = 0;
            for (size_t k = 0; k < DSRT_MIN(nbad, (size_t)32); k++) {
                named += strstr(bad[k].path, "shard-000001.tar:000045_img045.png") != NULL;
                CHECK_EQ(bad[k].code, DSRT_ETRUNCATED);
                CHECK_CONTAINS(bad[k].error, "cut short");
            }
            CHECK_EQ(named, 1);
            free(r);
            dsrt_pipeline_close(pp);
            dsrt_datastore_close(s);
        }
    }
}

/* A shard of stray bytes, a sample without label or image: warned about. */
static void test_foreign_problems(void) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s/foreign", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    arc a = {0};
    size_t len = 0;
    uint8_t *jpg = timg_make_jpeg(TIMG_JPEG_420, 24, 24, 1, &len);
    arc_file(&a, 'u', "s1.cls", "1", 1);
    arc_file(&a, 'u', "s1.jpg", (const char *)jpg, len);
    arc_file(&a, 'u', "s2.jpg", (const char *)jpg, len); /* no label */
    arc_file(&a, 'u', "s3.cls", "0", 1);                 /* no image */
    arc_file(&a, 'u', "s3.json", "{}", 2);
    arc_file(&a, 'u', "s4.cls", " 0\n", 3);
    arc_file(&a, 'u', "s4.jpg", "not a jpeg", 10); /* bad when read */
    arc_file(&a, 'u', "s5.cls", "1", 1);
    arc_file(&a, 'u', "s5.seg.png", "x", 1); /* extension "seg.png": no image */
    arc_end(&a);
    snprintf(p, sizeof p, "%s/x.tar", dir);
    REQUIRE(timg_write_file(p, a.buf, a.len) == 0);
    dsrt_datastore *s = open_ds(p, DSRT_SHARD_ORDER_AUTO);
    CHECK_EQ(dsrt_datastore_count(s), 2);
    CHECK_EQ(dsrt_datastore_num_classes(s), 2);
    CHECK_STR_EQ(dsrt_datastore_class_name(s, 1), "1");
    CHECK_EQ(dsrt_datastore_label(s, 0), 1);
    CHECK_CONTAINS(dsrt_datastore_warnings(s), "x.tar: s2.jpg: no .cls label, left out");
    CHECK_CONTAINS(dsrt_datastore_warnings(s), "2 samples without an image member");
    dsrt_pipeline_options o = small_options();
    o.batch = 2;
    o.fail_on_error = 1;
    dsrt_augment_options aug = small_aug();
    dsrt_pipeline *pp = NULL;
    REQUIRE(dsrt_pipeline_open(&pp, s, &aug, &o) == 0);
    dsrt_batch *b;
    CHECK_NE(dsrt_pipeline_next(pp, &b), 0);
    CHECK_CONTAINS(dsrt_last_error(), "x.tar:s4.jpg");
    dsrt_pipeline_close(pp);
    dsrt_datastore_close(s);
    /* classes.json names the integer labels. */
    snprintf(p, sizeof p, "%s/classes.json", dir);
    REQUIRE(timg_write_file(p, "{\"classes\": [\"zero\", \"one \\u00e9\"]}", 35) == 0);
    s = open_ds(dir, DSRT_SHARD_ORDER_AUTO);
    CHECK_STR_EQ(dsrt_datastore_class_name(s, 1), "one \xc3\xa9");
    dsrt_datastore_close(s);
    free(jpg);
    free(a.buf);
}

/* Without class names a .cls label is a class index below 2^20: a shard
 * with a larger one (50 million names, or one past INT32_MAX) is refused,
 * named; 2^20 - 1 is the largest taken. */
static void test_label_bounds(void) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s/labels", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    size_t len = 0;
    uint8_t *jpg = timg_make_jpeg(TIMG_JPEG_420, 24, 24, 1, &len);
    const char *labels[] = {"2147483647", "50000000", "1048576", "1048575"};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(labels); k++) {
        arc a = {0};
        arc_file(&a, 'u', "s0.cls", "0", 1);
        arc_file(&a, 'u', "s0.jpg", (const char *)jpg, len);
        arc_file(&a, 'u', "s1.cls", labels[k], strlen(labels[k]));
        arc_file(&a, 'u', "s1.jpg", (const char *)jpg, len);
        arc_end(&a);
        snprintf(p, sizeof p, "%s/big-%zu.tar", dir, k);
        REQUIRE(timg_write_file(p, a.buf, a.len) == 0);
        free(a.buf);
        dsrt_datastore *ds = NULL;
        int rc = dsrt_datastore_open(&ds, p, NULL);
        if (k < 3) {
            CHECK_EQ(rc, DSRT_ETOOBIG);
            CHECK_CONTAINS(dsrt_last_error(), p);
            CHECK_CONTAINS(dsrt_last_error(), "s1.jpg: label ");
            CHECK_CONTAINS(dsrt_last_error(), labels[k]);
            CHECK_CONTAINS(dsrt_last_error(), "below 1048576");
        } else {
            CHECK_OK(rc);
            CHECK_EQ(dsrt_datastore_num_classes(ds), 1048576);
            CHECK_EQ(dsrt_datastore_label(ds, 1), 1048575);
        }
        dsrt_datastore_close(ds);
    }
    free(jpg);
}

// ----------------------------------------------------------------------------
// The index

/* A large index opens fast without touching the shards (sparse files of the
 * recorded sizes here); the figure is printed, the bound is generous. */
static void test_big_index(void) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s/big", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    const size_t ns = 100, per = 2000, n = ns * per;
    dsrt_shard_index x = {.nshards = ns, .n = n, .nclasses = 10};
    x.shard_names = calloc(ns, sizeof *x.shard_names);
    x.shard_size = calloc(ns, sizeof *x.shard_size);
    x.shard_count = calloc(ns, sizeof *x.shard_count);
    x.offset = calloc(n, sizeof *x.offset);
    x.size = calloc(n, sizeof *x.size);
    x.label = calloc(n, sizeof *x.label);
    x.member = calloc(n, sizeof *x.member);
    const char *classes[10] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
    x.classes = classes;
    char(*names)[32] = calloc(ns, 32);
    char(*members)[32] = calloc(n, 32);
    for (size_t k = 0; k < ns; k++) {
        snprintf(names[k], 32, "shard-%06zu.tar", k);
        x.shard_names[k] = names[k];
        x.shard_count[k] = (uint32_t)per;
        x.shard_size[k] = per * 2048 + 1024;
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        REQUIRE(fd >= 0 && ftruncate(fd, (off_t)x.shard_size[k]) == 0);
        close(fd);
        for (size_t j = 0; j < per; j++) {
            size_t i = k * per + j;
            x.offset[i] = j * 2048 + 1536;
            x.size[i] = 500;
            x.label[i] = (int32_t)(i % 10);
            snprintf(members[i], 32, "%08zu.jpg", i);
            x.member[i] = members[i];
        }
    }
    snprintf(p, sizeof p, "%s/" DSRT_SHARD_INDEX_NAME, dir);
    CHECK_OK(dsrt__shard_index_write(p, &x));
    double t0 = now_s();
    dsrt_datastore *s = open_ds(dir, DSRT_SHARD_ORDER_AUTO);
    double dt = now_s() - t0;
    fprintf(stderr, "  opened an index of %zu samples in %zu shards in %.3f s\n", n, ns, dt);
    CHECK_LT(dt, 30.0);
    CHECK_EQ(dsrt_datastore_count(s), n);
    CHECK_EQ(dsrt_datastore_label(s, n - 1), (int)((n - 1) % 10));
    CHECK_CONTAINS(dsrt_datastore_path(s, n - 1), "shard-000099.tar:00199999.jpg");
    dsrt_datastore_close(s);
    /* A damaged index is refused and the shards are scanned instead. */
    int fd = open(p, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t byte = 0x5a;
    CHECK_EQ(pwrite(fd, &byte, 1, 5000), 1);
    close(fd);
    dsrt_shard_index y;
    dsrt_arena arena = {0};
    CHECK_EQ(dsrt__shard_index_read(p, &y, &arena), DSRT_ECHECKSUM);
    dsrt__arena_free(&arena);
    free(names);
    free(members);
    free(x.shard_names);
    free(x.shard_size);
    free(x.shard_count);
    free(x.offset);
    free(x.size);
    free(x.label);
    free(x.member);
}

int main(void) {
    REQUIRE(timg_tmpdir("shards", root, sizeof root) == 0);
    RUN(test_tar_walk);
    RUN(test_write_and_open);
    RUN(test_write_apart);
    RUN(test_write_own_only);
    RUN(test_failed_write);
    RUN(test_write_never_through_links);
    RUN(test_two_writers);
    RUN(test_write_pixels);
    RUN(test_killed_writer);
    RUN(test_exact_equals_folder);
    RUN(test_shard_order);
    RUN(test_resume);
    RUN(test_parts);
    RUN(test_elastic_resume);
    RUN(test_stream_lag);
    RUN(test_fifo_shard);
    RUN(test_views);
    RUN(test_brace_lists);
    RUN(test_gnu_tar);
    RUN(test_truncated);
    RUN(test_foreign_problems);
    RUN(test_label_bounds);
    RUN(test_big_index);
    return TEST_RESULT();
}
