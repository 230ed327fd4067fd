/*
 * Tests of the non-folder sources: IDX (raw and gzip), CIFAR-10/100 binary
 * batches and CSV manifests, through their parsers and loaders and through
 * dsrt_datastore_open, plus the export of an in-memory source as a folder of
 * PNGs and its round trip through the folder source.
 *
 * Every input is generated in a temporary folder, good ones and each kind of
 * bad one, and every bad one must fail with its own code and a message that
 * names the file. The real Fashion-MNIST files are checked too where they are
 * installed (/usr/share/datasets/fashion-mnist).
 */
#include "datastore/sources/cifar/cifar.h"
#include "datastore/sources/idx/idx.h"
#include "datastore/sources/manifest/manifest.h"
#include "task.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_root[PATH_MAX];

// ----------------------------------------------------------------------------
// Helpers

static const char *tmp_path(const char *fmt, ...) DSRT_PRINTF(1, 2);

/* A path under the test's temporary folder; a few are valid at once. */
static const char *tmp_path(const char *fmt, ...) {
    static char bufs[8][PATH_MAX];
    static int next;
    char *p = bufs[next++ % 8];
    int n = snprintf(p, PATH_MAX, "%s/", tmp_root);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p + n, PATH_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    return p;
}

/* A tmp_path that stays valid for the whole scope. */
#define KEEP_PATH(var, ...)                                                                        \
    char var[PATH_MAX];                                                                            \
    snprintf(var, sizeof var, "%s", tmp_path(__VA_ARGS__))

static void make_dir(const char *p) {
    REQUIRE(mkdir(p, 0755) == 0 || errno == EEXIST);
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(data, 1, len, f) == len);
    REQUIRE(fclose(f) == 0);
}

static void write_text(const char *path, const char *text) {
    write_file(path, text, strlen(text));
}

/* gzip with zlib's gz* functions, as the gzip tool writes it. */
static void write_gz(const char *path, const void *data, size_t len) {
    gzFile f = gzopen(path, "wb9");
    REQUIRE(f);
    REQUIRE(gzwrite(f, data, (unsigned)len) == (int)len);
    REQUIRE(gzclose(f) == Z_OK);
}

/* gzip in memory; returns the size. */
static size_t gzip_mem(const void *data, size_t len, uint8_t *out, size_t cap) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    zs.next_in = (Bytef *)data;
    zs.avail_in = (uInt)len;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
    size_t n = zs.total_out;
    deflateEnd(&zs);
    return n;
}

/* An IDX file: header with the given type and dims, then data. */
static size_t make_idx(uint8_t *out, uint8_t type, int ndim, const uint32_t *dims,
                       const uint8_t *data, size_t len) {
    out[0] = out[1] = 0;
    out[2] = type;
    out[3] = (uint8_t)ndim;
    for (int d = 0; d < ndim; d++) {
        out[4 + 4 * d] = (uint8_t)(dims[d] >> 24);
        out[5 + 4 * d] = (uint8_t)(dims[d] >> 16);
        out[6 + 4 * d] = (uint8_t)(dims[d] >> 8);
        out[7 + 4 * d] = (uint8_t)dims[d];
    }
    if (len) memcpy(out + 4 + 4 * ndim, data, len);
    return 4 + 4 * (size_t)ndim + len;
}

/* Frees what a loader put into an index (the index itself is on the stack). */
static void index_clear(dsrt_index *ix) {
    free(ix->paths);
    free(ix->labels);
    free(ix->classes);
    free(ix->pixels);
    free(ix->warnings);
    dsrt__arena_free(&ix->arena);
    memset(ix, 0, sizeof *ix);
}

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        remove_tree(p);
    }
    closedir(d);
    return rmdir(path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// A small synthetic MNIST: N images of H x W, pixel (i, y, x) = f(i, y, x).

enum { N = 7, H = 5, W = 4 };

static uint8_t px_of(size_t i, int y, int x) {
    return (uint8_t)(i * 31 + (size_t)y * 7 + (size_t)x * 3 + 1);
}

static uint8_t label_of(size_t i) {
    return (uint8_t)((i * 5) % 3);
}

static size_t mnist_images(uint8_t *out, size_t n) {
    uint8_t data[64 * H * W];
    for (size_t i = 0; i < n; i++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) data[(i * H + y) * W + x] = px_of(i, y, x);
    uint32_t dims[3] = {(uint32_t)n, H, W};
    return make_idx(out, 0x08, 3, dims, data, n * H * W);
}

static size_t mnist_labels(uint8_t *out, size_t n) {
    uint8_t data[64];
    for (size_t i = 0; i < n; i++) data[i] = label_of(i);
    uint32_t dims[1] = {(uint32_t)n};
    return make_idx(out, 0x08, 1, dims, data, n);
}

/* dir/<prefix>-images-idx3-ubyte[.gz] and the labels, with n samples. */
static void write_mnist(const char *dir, const char *prefix, size_t n, int gz) {
    uint8_t img[8192], lab[256];
    size_t ni = mnist_images(img, n), nl = mnist_labels(lab, n);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, prefix, gz ? ".gz" : "");
    gz ? write_gz(p, img, ni) : write_file(p, img, ni);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, prefix, gz ? ".gz" : "");
    gz ? write_gz(p, lab, nl) : write_file(p, lab, nl);
}

static void check_mnist_index(const dsrt_index *ix, size_t n) {
    CHECK_EQ(ix->source, DSRT_SOURCE_IDX);
    CHECK_EQ(ix->n, n);
    CHECK_EQ(ix->width, W);
    CHECK_EQ(ix->height, H);
    CHECK_EQ(ix->channels, 1);
    CHECK_EQ(ix->num_classes, 3);
    if (ix->num_classes == 3) {
        CHECK_STR_EQ(ix->classes[0], "0");
        CHECK_STR_EQ(ix->classes[2], "2");
    }
    if (ix->n != n || !ix->pixels || !ix->labels) return;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += ix->labels[i] != label_of(i);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) bad += ix->pixels[(i * H + y) * W + x] != px_of(i, y, x);
    }
    CHECK_EQ(bad, 0);
}

// ----------------------------------------------------------------------------
// gzip

static void test_gunzip(void) {
    uint8_t data[10000], gz[12000], two[24000], *out;
    size_t out_len;
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * i >> 3);
    size_t n = gzip_mem(data, sizeof data, gz, sizeof gz);

    CHECK_OK(dsrt__gunzip(gz, n, "a.gz", 1 << 20, &out, &out_len));
    CHECK_EQ(out_len, sizeof data);
    CHECK(out && memcmp(out, data, sizeof data) == 0);
    free(out);

    /* Exactly at the limit is fine; one byte over is not. */
    CHECK_OK(dsrt__gunzip(gz, n, "a.gz", sizeof data, &out, &out_len));
    free(out);
    CHECK_EQ(dsrt__gunzip(gz, n, "a.gz", sizeof data - 1, &out, &out_len), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "a.gz");
    CHECK(out == NULL);

    /* Two members, as cat a.gz b.gz makes. */
    memcpy(two, gz, n);
    memcpy(two + n, gz, n);
    CHECK_OK(dsrt__gunzip(two, 2 * n, "two.gz", 1 << 20, &out, &out_len));
    CHECK_EQ(out_len, 2 * sizeof data);
    CHECK(out && memcmp(out, data, sizeof data) == 0 &&
          memcmp(out + sizeof data, data, sizeof data) == 0);
    free(out);

    /* Zero padding after the end is ignored; other bytes are not. */
    memcpy(two, gz, n);
    memset(two + n, 0, 100);
    CHECK_OK(dsrt__gunzip(two, n + 100, "pad.gz", 1 << 20, &out, &out_len));
    CHECK_EQ(out_len, sizeof data);
    free(out);
    two[n + 50] = 'x';
    CHECK_EQ(dsrt__gunzip(two, n + 100, "junk.gz", 1 << 20, &out, &out_len), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "junk.gz");

    /* Truncated anywhere: in the data, in the trailer, in the header. */
    size_t cuts[] = {n / 2, n - 4, n - 1, 5, 0};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cuts); k++) {
        CHECK_EQ(dsrt__gunzip(gz, cuts[k], "cut.gz", 1 << 20, &out, &out_len), DSRT_ETRUNCATED);
        CHECK_CONTAINS(dsrt_last_error(), "gzip: cut.gz: truncated");
    }

    /* A corrupt byte in the deflate data or the CRC. */
    memcpy(two, gz, n);
    two[n - 6] ^= 0x55;
    CHECK_EQ(dsrt__gunzip(two, n, "crc.gz", 1 << 20, &out, &out_len), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "crc.gz");
    memcpy(two, gz, n);
    two[3] = 0xff; /* reserved flag bits */
    CHECK_EQ(dsrt__gunzip(two, n, "hdr.gz", 1 << 20, &out, &out_len), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "hdr.gz");

    /* A forged size in the trailer does not make it allocate that much. */
    memcpy(two, gz, n);
    two[n - 1] = 0xff;
    CHECK_EQ(dsrt__gunzip(two, n, "isize.gz", (size_t)1 << 40, &out, &out_len), DSRT_ECORRUPT);
}

// ----------------------------------------------------------------------------
// IDX parser

static void test_idx_parse(void) {
    uint8_t buf[8192], gz[8192], data[60];
    dsrt_idx idx;
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i + 100);

    uint32_t d3[3] = {3, 4, 5};
    size_t n = make_idx(buf, 0x08, 3, d3, data, 60);
    CHECK_OK(dsrt__idx_parse(buf, n, "ok", 1 << 20, &idx));
    CHECK_EQ(idx.ndim, 3);
    CHECK_EQ(idx.dims[0], 3);
    CHECK_EQ(idx.dims[1], 4);
    CHECK_EQ(idx.dims[2], 5);
    CHECK_EQ(idx.size, 60);
    CHECK(idx.data && memcmp(idx.data, data, 60) == 0);
    free(idx.data);

    /* gzip gives the same. */
    size_t ng = gzip_mem(buf, n, gz, sizeof gz);
    CHECK_OK(dsrt__idx_parse(gz, ng, "ok.gz", 1 << 20, &idx));
    CHECK_EQ(idx.size, 60);
    CHECK_EQ(idx.dims[2], 5);
    CHECK(idx.data && memcmp(idx.data, data, 60) == 0);
    free(idx.data);

    /* The size limit, raw and gzip. */
    CHECK_EQ(dsrt__idx_parse(buf, n, "big", 59, &idx), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "idx: big: dimensions 3 x 4 x 5");
    CHECK_EQ(dsrt__idx_parse(gz, ng, "big.gz", 59, &idx), DSRT_ETOOBIG);

    /* Wrong magic. */
    uint8_t bad[8192];
    memcpy(bad, buf, n);
    bad[0] = 0x12;
    CHECK_EQ(dsrt__idx_parse(bad, n, "magic", 1 << 20, &idx), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "idx: magic: not an IDX file");
    CHECK(idx.data == NULL);

    /* Types other than unsigned byte. */
    memcpy(bad, buf, n);
    bad[2] = 0x0D;
    CHECK_EQ(dsrt__idx_parse(bad, n, "float", 1 << 20, &idx), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "idx: float: element type 0x0d (32-bit float)");

    /* Dimension counts. */
    memcpy(bad, buf, n);
    bad[3] = 0;
    CHECK_EQ(dsrt__idx_parse(bad, n, "ndim0", 1 << 20, &idx), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "ndim0");
    bad[3] = 5;
    CHECK_EQ(dsrt__idx_parse(bad, n, "ndim5", 1 << 20, &idx), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "ndim5");

    /* Dimensions whose product overflows. */
    uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 2};
    size_t nh = make_idx(bad, 0x08, 4, huge, NULL, 0);
    CHECK_EQ(dsrt__idx_parse(bad, nh, "overflow", SIZE_MAX, &idx), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "idx: overflow: dimensions 4294967295 x");
    CHECK_CONTAINS(dsrt_last_error(), "overflows");

    /* Truncated: in the header, in the data. */
    CHECK_EQ(dsrt__idx_parse(buf, 3, "short", 1 << 20, &idx), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "short");
    CHECK_EQ(dsrt__idx_parse(buf, 10, "hdr", 1 << 20, &idx), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "idx: hdr: truncated");
    CHECK_EQ(dsrt__idx_parse(buf, n - 1, "data", 1 << 20, &idx), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "idx: data: truncated: dimensions 3 x 4 x 5 need 60 bytes");

    /* Bytes after the data are an error: the header does not fit the data. */
    memcpy(bad, buf, n);
    bad[n] = 0;
    CHECK_EQ(dsrt__idx_parse(bad, n + 1, "trail", 1 << 20, &idx), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "idx: trail: 1 bytes after the 60 bytes");

    /* A truncated gzip names the file. */
    CHECK_EQ(dsrt__idx_parse(gz, ng - 7, "cut.gz", 1 << 20, &idx), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "cut.gz");

    /* Zero-sized dimensions are a valid, empty file. */
    uint32_t z[3] = {0, 28, 28};
    size_t nz = make_idx(bad, 0x08, 3, z, NULL, 0);
    CHECK_OK(dsrt__idx_parse(bad, nz, "empty", 1 << 20, &idx));
    CHECK_EQ(idx.size, 0);
    free(idx.data);
}

// ----------------------------------------------------------------------------
// IDX loader

/* A gzip'd IDX file whose header says 1 x 1 x 1 followed by 256 MiB of zeros
 * (about 256 KiB compressed): refused from the header, without inflating
 * the rest. Runs first, so that the peak memory is still low. */
static void test_idx_gzip_bomb(void) {
    size_t cap = (size_t)1 << 20, zeros = (size_t)256 << 20;
    uint8_t *gz = malloc(cap), *chunk = calloc(1, 1 << 20);
    REQUIRE(gz && chunk);
    uint8_t head[17];
    uint32_t dims[3] = {1, 1, 1};
    make_idx(head, 0x08, 3, dims, (const uint8_t *)"x", 1);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    zs.next_out = gz;
    zs.avail_out = (uInt)cap;
    zs.next_in = head;
    zs.avail_in = sizeof head;
    REQUIRE(deflate(&zs, Z_NO_FLUSH) == Z_OK);
    for (size_t done = 0; done < zeros; done += 1 << 20) {
        zs.next_in = chunk;
        zs.avail_in = 1 << 20;
        REQUIRE(deflate(&zs, done + (1 << 20) < zeros ? Z_NO_FLUSH : Z_FINISH) != Z_STREAM_ERROR);
    }
    size_t n = zs.total_out;
    deflateEnd(&zs);
    REQUIRE(n < cap / 2);

    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    dsrt_idx idx;
    CHECK_EQ(dsrt__idx_parse(gz, n, "bomb.gz", (size_t)8 << 30, &idx), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "bomb.gz");
    CHECK_CONTAINS(dsrt_last_error(), "1 x 1 x 1");
    CHECK(idx.data == NULL);
    getrusage(RUSAGE_SELF, &after);
    /* Inflating it all would touch 256 MiB. */
    CHECK_LT(after.ru_maxrss - before.ru_maxrss, 32 << 10);

    /* A header cut inside the compressed stream is still a truncated header. */
    CHECK_EQ(dsrt__idx_parse(gz, 12, "cut.gz", (size_t)8 << 30, &idx), DSRT_ETRUNCATED);
    free(gz);
    free(chunk);
}

static void test_idx_load(void) {
    dsrt_index ix = {0};
    dsrt_datastore_options o = dsrt_datastore_defaults();
    KEEP_PATH(dir, "mnist");
    make_dir(dir);
    write_mnist(dir, "train", N, 0);
    write_mnist(dir, "t10k", 3, 1);

    /* The folder, each split. */
    CHECK_OK(dsrt__idx_load(&ix, dir, &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);
    o.split = DSRT_SPLIT_TEST;
    CHECK_OK(dsrt__idx_load(&ix, dir, &o));
    check_mnist_index(&ix, 3);
    index_clear(&ix);
    o.split = DSRT_SPLIT_TRAIN;

    /* An images file: the labels file is derived, raw or gzip. */
    CHECK_OK(dsrt__idx_load(&ix, tmp_path("mnist/train-images-idx3-ubyte"), &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);
    CHECK_OK(dsrt__idx_load(&ix, tmp_path("mnist/t10k-images-idx3-ubyte.gz"), &o));
    check_mnist_index(&ix, 3);
    index_clear(&ix);

    /* gzip images beside raw labels: the derived name drops the .gz. */
    KEEP_PATH(mixed, "mixed");
    make_dir(mixed);
    uint8_t img[8192], lab[256];
    size_t ni = mnist_images(img, N), nl = mnist_labels(lab, N);
    write_gz(tmp_path("mixed/train-images-idx3-ubyte.gz"), img, ni);
    write_file(tmp_path("mixed/train-labels-idx1-ubyte"), lab, nl);
    CHECK_OK(dsrt__idx_load(&ix, tmp_path("mixed/train-images-idx3-ubyte.gz"), &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);
    CHECK_OK(dsrt__idx_load(&ix, mixed, &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);

    /* The dot spelling, in a folder and as a file. */
    KEEP_PATH(dot, "dot");
    make_dir(dot);
    write_file(tmp_path("dot/train-images.idx3-ubyte"), img, ni);
    write_file(tmp_path("dot/train-labels.idx1-ubyte"), lab, nl);
    CHECK_OK(dsrt__idx_load(&ix, dot, &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);
    CHECK_OK(dsrt__idx_load(&ix, tmp_path("dot/train-images.idx3-ubyte"), &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);

    /* An explicit labels_path, for names that cannot be derived. */
    write_file(tmp_path("mixed/pics.idx"), img, ni);
    CHECK_EQ(dsrt__idx_load(&ix, tmp_path("mixed/pics.idx"), &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "pics.idx: cannot derive the labels file");
    index_clear(&ix);
    o.labels_path = tmp_path("mixed/train-labels-idx1-ubyte");
    CHECK_OK(dsrt__idx_load(&ix, tmp_path("mixed/pics.idx"), &o));
    check_mnist_index(&ix, N);
    index_clear(&ix);
    o.labels_path = NULL;

    /* No labels file. */
    write_file(tmp_path("mixed/val-images-idx3-ubyte"), img, ni);
    CHECK_EQ(dsrt__idx_load(&ix, tmp_path("mixed/val-images-idx3-ubyte"), &o), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "val-labels-idx1-ubyte does not exist");
    index_clear(&ix);
    o.split = DSRT_SPLIT_TEST;
    CHECK_EQ(dsrt__idx_load(&ix, dot, &o), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "no t10k-images-idx3-ubyte[.gz] in this folder");
    index_clear(&ix);
    o.split = DSRT_SPLIT_TRAIN;

    /* Counts that differ. */
    KEEP_PATH(mis, "mismatch");
    make_dir(mis);
    write_file(tmp_path("mismatch/train-images-idx3-ubyte"), img, ni);
    nl = mnist_labels(lab, N - 1);
    write_file(tmp_path("mismatch/train-labels-idx1-ubyte"), lab, nl);
    CHECK_EQ(dsrt__idx_load(&ix, mis, &o), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "train-images-idx3-ubyte has 7 images but");
    CHECK_CONTAINS(dsrt_last_error(), "train-labels-idx1-ubyte has 6 labels");
    index_clear(&ix);

    /* Images of the wrong rank; labels of the wrong rank. */
    write_file(tmp_path("mismatch/a-labels-idx1-ubyte"), lab, nl);
    write_file(tmp_path("mismatch/a-images-idx3-ubyte"), lab, nl);
    CHECK_EQ(dsrt__idx_load(&ix, tmp_path("mismatch/a-images-idx3-ubyte"), &o), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "a-images-idx3-ubyte: images must have 3 dimensions");
    index_clear(&ix);
    write_file(tmp_path("mismatch/a-images-idx3-ubyte"), img, ni);
    write_file(tmp_path("mismatch/a-labels-idx1-ubyte"), img, ni);
    CHECK_EQ(dsrt__idx_load(&ix, tmp_path("mismatch/a-images-idx3-ubyte"), &o), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "a-labels-idx1-ubyte: labels must have 1 dimension");
    index_clear(&ix);

    /* A truncated gzip images file names the file. */
    uint8_t gz[8192];
    size_t ng = gzip_mem(img, ni, gz, sizeof gz);
    write_file(tmp_path("mismatch/b-images-idx3-ubyte.gz"), gz, ng - 10);
    write_file(tmp_path("mismatch/b-labels-idx1-ubyte"), lab, mnist_labels(lab, N));
    CHECK_EQ(dsrt__idx_load(&ix, tmp_path("mismatch/b-images-idx3-ubyte.gz"), &o), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "b-images-idx3-ubyte.gz: truncated");
    index_clear(&ix);

    /* Fashion-MNIST is named by its folder. */
    KEEP_PATH(fashion, "My-FASHION-set");
    make_dir(fashion);
    uint8_t flab[64];
    for (int i = 0; i < 20; i++) flab[i] = (uint8_t)(i % 10);
    uint32_t d1[1] = {20};
    write_file(tmp_path("My-FASHION-set/train-labels-idx1-ubyte"), lab,
               make_idx(lab, 0x08, 1, d1, flab, 20));
    write_file(tmp_path("My-FASHION-set/train-images-idx3-ubyte"), img, mnist_images(img, 20));
    CHECK_OK(dsrt__idx_load(&ix, fashion, &o));
    CHECK_EQ(ix.num_classes, 10);
    if (ix.num_classes == 10) {
        CHECK_STR_EQ(ix.classes[0], "tshirt_top");
        CHECK_STR_EQ(ix.classes[9], "ankle_boot");
    }
    index_clear(&ix);
}

// ----------------------------------------------------------------------------
// CIFAR

/* Record r of a batch: labels, then planes with pixel (c, y, x) = f(r, c, y, x). */
static uint8_t cifar_px(size_t r, int c, int y, int x) {
    return (uint8_t)(r * 13 + (size_t)c * 101 + (size_t)y * 5 + (size_t)x * 3);
}

static size_t make_cifar(uint8_t *out, size_t count, int labels_per, const uint8_t *labels) {
    size_t rec = (size_t)labels_per + 3072;
    for (size_t r = 0; r < count; r++) {
        uint8_t *p = out + r * rec;
        for (int k = 0; k < labels_per; k++) p[k] = labels[r * (size_t)labels_per + k];
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++)
                    p[labels_per + c * 1024 + y * 32 + x] = cifar_px(r, c, y, x);
    }
    return count * rec;
}

/* Pixels of ix samples [first, first + count) against records [0, count). */
static int cifar_bad_pixels(const dsrt_index *ix, size_t first, size_t count) {
    int bad = 0;
    for (size_t r = 0; r < count; r++)
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++)
                for (int c = 0; c < 3; c++)
                    bad += ix->pixels[(((first + r) * 32 + y) * 32 + x) * 3 + c] !=
                           cifar_px(r, c, y, x);
    return bad;
}

static void test_cifar_parse(void) {
    static uint8_t buf[10 * 3074];
    dsrt_index ix = {0};
    uint8_t l10[4] = {3, 0, 9, 5};
    size_t n = make_cifar(buf, 4, 1, l10);

    CHECK_OK(dsrt__cifar_parse(&ix, buf, n, "b10", DSRT_SOURCE_CIFAR10, 0));
    CHECK_EQ(ix.n, 4);
    CHECK_EQ(ix.width, 32);
    CHECK_EQ(ix.height, 32);
    CHECK_EQ(ix.channels, 3);
    CHECK_EQ(ix.labels[0], 3);
    CHECK_EQ(ix.labels[2], 9);
    CHECK_EQ(cifar_bad_pixels(&ix, 0, 4), 0);
    /* A second batch appends. */
    CHECK_OK(dsrt__cifar_parse(&ix, buf, 2 * 3073, "b10", DSRT_SOURCE_CIFAR10, 0));
    CHECK_EQ(ix.n, 6);
    CHECK_EQ(ix.labels[5], 0);
    CHECK_EQ(cifar_bad_pixels(&ix, 4, 2), 0);
    CHECK_EQ(cifar_bad_pixels(&ix, 0, 4), 0);

    /* Not a whole number of records: the message gives the numbers. */
    CHECK_EQ(dsrt__cifar_parse(&ix, buf, n - 1, "odd.bin", DSRT_SOURCE_CIFAR10, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "cifar: odd.bin: 12291 bytes is not a whole number of "
                                      "3073-byte CIFAR-10 records (3 records and 3072 bytes over)");
    CHECK_EQ(ix.n, 6);

    /* A bad label names the record, and leaves the index as it was. */
    buf[3073] = 10;
    CHECK_EQ(dsrt__cifar_parse(&ix, buf, n, "bad.bin", DSRT_SOURCE_CIFAR10, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "cifar: bad.bin: record 1 has label 10");
    CHECK_EQ(ix.n, 6);
    index_clear(&ix);

    /* CIFAR-100: coarse then fine. */
    uint8_t l100[6] = {19, 99, 0, 0, 7, 42};
    n = make_cifar(buf, 3, 2, l100);
    CHECK_OK(dsrt__cifar_parse(&ix, buf, n, "c100", DSRT_SOURCE_CIFAR100, 0));
    CHECK_EQ(ix.n, 3);
    CHECK_EQ(ix.labels[0], 99);
    CHECK_EQ(ix.labels[2], 42);
    CHECK_EQ(cifar_bad_pixels(&ix, 0, 3), 0);
    index_clear(&ix);
    CHECK_OK(dsrt__cifar_parse(&ix, buf, n, "c100", DSRT_SOURCE_CIFAR100, 1));
    CHECK_EQ(ix.labels[0], 19);
    CHECK_EQ(ix.labels[2], 7);
    index_clear(&ix);
    CHECK_EQ(dsrt__cifar_parse(&ix, buf, n, "c100-as-10", DSRT_SOURCE_CIFAR10, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "3073-byte CIFAR-10 records");
    buf[2 * 3074] = 20;
    CHECK_EQ(dsrt__cifar_parse(&ix, buf, n, "coarse.bin", DSRT_SOURCE_CIFAR100, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "cifar: coarse.bin: record 2 has coarse label 20");
    buf[2 * 3074] = 7;
    buf[3074 + 1] = 100;
    CHECK_EQ(dsrt__cifar_parse(&ix, buf, n, "fine.bin", DSRT_SOURCE_CIFAR100, 1), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "cifar: fine.bin: record 1 has fine label 100");
    CHECK_EQ(ix.n, 0);
    index_clear(&ix);

    /* Empty input adds nothing. */
    CHECK_OK(dsrt__cifar_parse(&ix, buf, 0, "empty", DSRT_SOURCE_CIFAR10, 0));
    CHECK_EQ(ix.n, 0);
    index_clear(&ix);
}

static const char cifar10_names[] = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\n"
                                    "ship\ntruck\n\n";

static void test_cifar_load(void) {
    static uint8_t buf[8 * 3074];
    dsrt_index ix = {0};
    dsrt_datastore_options o = dsrt_datastore_defaults();
    uint8_t labels[8];

    /* CIFAR-10 as unpacked: batches 1..5 with 2 records each, 3 test records. */
    KEEP_PATH(parent, "c10");
    make_dir(parent);
    KEEP_PATH(dir, "c10/cifar-10-batches-bin");
    make_dir(dir);
    for (int b = 1; b <= 5; b++) {
        labels[0] = (uint8_t)b;
        labels[1] = (uint8_t)(9 - b);
        size_t n = make_cifar(buf, 2, 1, labels);
        write_file(tmp_path("c10/cifar-10-batches-bin/data_batch_%d.bin", b), buf, n);
    }
    labels[0] = 0, labels[1] = 1, labels[2] = 2;
    write_file(tmp_path("c10/cifar-10-batches-bin/test_batch.bin"), buf,
               make_cifar(buf, 3, 1, labels));

    /* Without names: numbers. */
    CHECK_OK(dsrt__cifar_load(&ix, dir, DSRT_SOURCE_CIFAR10, &o));
    CHECK_EQ(ix.source, DSRT_SOURCE_CIFAR10);
    CHECK_EQ(ix.n, 10);
    CHECK_EQ(ix.num_classes, 10);
    if (ix.n == 10 && ix.num_classes == 10) {
        CHECK_EQ(ix.labels[0], 1);
        CHECK_EQ(ix.labels[1], 8);
        CHECK_EQ(ix.labels[8], 5);
        CHECK_EQ(ix.labels[9], 4);
        CHECK_EQ(cifar_bad_pixels(&ix, 8, 2), 0);
        CHECK_STR_EQ(ix.classes[0], "0");
        CHECK_STR_EQ(ix.classes[9], "9");
    }
    index_clear(&ix);

    /* With batches.meta.txt (a blank last line), test split, given by the parent folder. */
    write_text(tmp_path("c10/cifar-10-batches-bin/batches.meta.txt"), cifar10_names);
    o.split = DSRT_SPLIT_TEST;
    CHECK_OK(dsrt__cifar_load(&ix, parent, DSRT_SOURCE_AUTO, &o));
    CHECK_EQ(ix.source, DSRT_SOURCE_CIFAR10);
    CHECK_EQ(ix.n, 3);
    CHECK_EQ(ix.num_classes, 10);
    if (ix.n == 3 && ix.num_classes == 10) {
        CHECK_EQ(ix.labels[2], 2);
        CHECK_STR_EQ(ix.classes[0], "airplane");
        CHECK_STR_EQ(ix.classes[9], "truck");
        CHECK_EQ(cifar_bad_pixels(&ix, 0, 3), 0);
    }
    index_clear(&ix);
    o.split = DSRT_SPLIT_TRAIN;

    /* One batch file, names from beside it. */
    CHECK_OK(dsrt__cifar_load(&ix, tmp_path("c10/cifar-10-batches-bin/data_batch_3.bin"),
                              DSRT_SOURCE_AUTO, &o));
    CHECK_EQ(ix.n, 2);
    CHECK_EQ(ix.num_classes, 10);
    if (ix.n == 2) CHECK_EQ(ix.labels[0], 3);
    if (ix.num_classes == 10) CHECK_STR_EQ(ix.classes[1], "automobile");
    index_clear(&ix);

    /* A missing batch is named. */
    unlink(tmp_path("c10/cifar-10-batches-bin/data_batch_4.bin"));
    CHECK_EQ(dsrt__cifar_load(&ix, dir, DSRT_SOURCE_CIFAR10, &o), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "data_batch_4.bin");
    index_clear(&ix);

    /* A names file with the wrong count: numbers, and a warning. */
    KEEP_PATH(odd, "c10odd");
    make_dir(odd);
    write_file(tmp_path("c10odd/test_batch.bin"), buf, make_cifar(buf, 3, 1, labels));
    write_text(tmp_path("c10odd/batches.meta.txt"), "a\nb\n");
    o.split = DSRT_SPLIT_TEST;
    CHECK_OK(dsrt__cifar_load(&ix, odd, DSRT_SOURCE_CIFAR10, &o));
    CHECK_EQ(ix.num_classes, 10);
    if (ix.num_classes == 10) CHECK_STR_EQ(ix.classes[1], "1");
    CHECK_EQ(ix.warning_count, 1);
    CHECK_CONTAINS(ix.warnings, "2 class names where 10 were expected");
    index_clear(&ix);
    o.split = DSRT_SPLIT_TRAIN;

    /* CIFAR-100: train.bin, test.bin, fine and coarse names (CRLF lines). */
    KEEP_PATH(c100, "cifar-100-binary");
    make_dir(c100);
    uint8_t l100[8] = {4, 30, 1, 1, 19, 99, 0, 0};
    write_file(tmp_path("cifar-100-binary/train.bin"), buf, make_cifar(buf, 4, 2, l100));
    write_file(tmp_path("cifar-100-binary/test.bin"), buf, make_cifar(buf, 1, 2, l100 + 6));
    char fine[2000] = "", coarse[400] = "";
    for (int c = 0; c < 100; c++) sprintf(fine + strlen(fine), "fine_%d\r\n", c);
    for (int c = 0; c < 20; c++) sprintf(coarse + strlen(coarse), "  coarse_%d  \n", c);
    write_text(tmp_path("cifar-100-binary/fine_label_names.txt"), fine);
    write_text(tmp_path("cifar-100-binary/coarse_label_names.txt"), coarse);
    CHECK_OK(dsrt__cifar_load(&ix, c100, DSRT_SOURCE_AUTO, &o));
    CHECK_EQ(ix.source, DSRT_SOURCE_CIFAR100);
    CHECK_EQ(ix.n, 4);
    CHECK_EQ(ix.num_classes, 100);
    if (ix.n == 4 && ix.num_classes == 100) {
        CHECK_EQ(ix.labels[0], 30);
        CHECK_EQ(ix.labels[2], 99);
        CHECK_STR_EQ(ix.classes[30], "fine_30");
        CHECK_STR_EQ(ix.classes[99], "fine_99");
        CHECK_EQ(cifar_bad_pixels(&ix, 0, 4), 0);
    }
    index_clear(&ix);
    o.cifar100_coarse = 1;
    o.split = DSRT_SPLIT_TEST;
    CHECK_OK(dsrt__cifar_load(&ix, c100, DSRT_SOURCE_CIFAR100, &o));
    CHECK_EQ(ix.n, 1);
    CHECK_EQ(ix.num_classes, 20);
    if (ix.n == 1 && ix.num_classes == 20) {
        CHECK_EQ(ix.labels[0], 0);
        CHECK_STR_EQ(ix.classes[19], "coarse_19");
    }
    index_clear(&ix);
    o = dsrt_datastore_defaults();

    /* A folder of neither. */
    CHECK_EQ(dsrt__cifar_load(&ix, tmp_path("mnist"), DSRT_SOURCE_AUTO, &o), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "no CIFAR-10");
    index_clear(&ix);
}

// ----------------------------------------------------------------------------
// Manifest

static int parse(dsrt_index *ix, const char *text, const char *base, int header) {
    index_clear(ix);
    return dsrt__manifest_parse(ix, text, strlen(text), "m.csv", base, header);
}

static void check_classes(const dsrt_index *ix, const char *const *names, size_t n) {
    CHECK_EQ(ix->num_classes, n);
    for (size_t c = 0; c < n && c < ix->num_classes; c++) CHECK_STR_EQ(ix->classes[c], names[c]);
}

static void test_manifest_parse(void) {
    dsrt_index ix = {0};

    /* Plain, LF, relative and absolute paths, string classes sorted. */
    CHECK_OK(parse(&ix, "b.jpg,dog\n/abs/a.jpg,cat\nsub/c.png,dog\n", "/data", -1));
    CHECK_EQ(ix.source, DSRT_SOURCE_MANIFEST);
    CHECK_EQ(ix.n, 3);
    if (ix.n == 3) {
        CHECK_STR_EQ(ix.paths[0], "/data/b.jpg");
        CHECK_STR_EQ(ix.paths[1], "/abs/a.jpg");
        CHECK_STR_EQ(ix.paths[2], "/data/sub/c.png");
        CHECK_EQ(ix.labels[0], 1);
        CHECK_EQ(ix.labels[1], 0);
        CHECK_EQ(ix.labels[2], 1);
    }
    check_classes(&ix, (const char *[]){"cat", "dog"}, 2);

    /* No base folder, or one ending in a slash. */
    CHECK_OK(parse(&ix, "x.jpg,1\n", "", 0));
    if (ix.n == 1) CHECK_STR_EQ(ix.paths[0], "x.jpg");
    CHECK_OK(parse(&ix, "x.jpg,1\n", NULL, 0));
    if (ix.n == 1) CHECK_STR_EQ(ix.paths[0], "x.jpg");
    CHECK_OK(parse(&ix, "x.jpg,1\n", "/", 0));
    if (ix.n == 1) CHECK_STR_EQ(ix.paths[0], "/x.jpg");

    /* BOM, CRLF, blank lines, no newline at the end, blanks around fields. */
    CHECK_OK(parse(&ix,
                   "\xEF\xBB\xBFpath,label\r\n\r\na.jpg,cat\r\n   \r\n b.jpg , dog \r\nc.jpg,cat",
                   NULL, -1));
    CHECK_EQ(ix.n, 3);
    if (ix.n == 3) {
        CHECK_STR_EQ(ix.paths[0], "a.jpg");
        CHECK_STR_EQ(ix.paths[1], "b.jpg");
        CHECK_EQ(ix.labels[1], 1);
    }
    check_classes(&ix, (const char *[]){"cat", "dog"}, 2);

    /* Quoting: commas, doubled quotes, line breaks, blanks kept inside quotes. */
    CHECK_OK(parse(&ix,
                   "\"a,b.jpg\",\"x\"\"y\"\n"
                   "\"two\nlines.jpg\" , \" sp \"\n"
                   "\"\"\"q\"\"\",plain\n"
                   "c.jpg,\"\"\"\"\n",
                   NULL, 0));
    CHECK_EQ(ix.n, 4);
    if (ix.n == 4) {
        CHECK_STR_EQ(ix.paths[0], "a,b.jpg");
        CHECK_STR_EQ(ix.paths[1], "two\nlines.jpg");
        CHECK_STR_EQ(ix.paths[2], "\"q\"");
        CHECK_STR_EQ(ix.paths[3], "c.jpg");
    }
    check_classes(&ix, (const char *[]){" sp ", "\"", "plain", "x\"y"}, 4);

    /* A line break inside quotes counts for the line numbers of later errors. */
    CHECK_EQ(parse(&ix, "\"a\nb\",1\nc,1,extra\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:3: 3 fields");

    /* Header detection. */
    CHECK_OK(parse(&ix, "file,Class\na,1\n", NULL, -1));
    CHECK_EQ(ix.n, 1);
    CHECK_OK(parse(&ix, "file,LABEL\na,1\n", NULL, -1));
    CHECK_EQ(ix.n, 1);
    CHECK_OK(parse(&ix, "file,kind\na,1\n", NULL, -1));
    CHECK_EQ(ix.n, 2);
    check_classes(&ix, (const char *[]){"1", "kind"}, 2);
    CHECK_OK(parse(&ix, "anything,at all\na,1\n", NULL, 1));
    CHECK_EQ(ix.n, 1);
    CHECK_OK(parse(&ix, "path,label\na,1\n", NULL, 0));
    CHECK_EQ(ix.n, 2);
    check_classes(&ix, (const char *[]){"1", "label"}, 2);
    CHECK_OK(parse(&ix, "\n\npath,label\na,1\n", NULL, -1)); /* blank lines before the header */
    CHECK_EQ(ix.n, 1);

    /* Numeric classes sort by value; mixed ones by bytes (Python's sorted()). */
    CHECK_OK(parse(&ix, "a,10\nb,2\nc,1\nd,007\ne,7\nf,100000000000000000000000\n", NULL, 0));
    check_classes(&ix, (const char *[]){"1", "2", "007", "7", "10", "100000000000000000000000"}, 6);
    if (ix.n == 6) {
        CHECK_EQ(ix.labels[0], 4);
        CHECK_EQ(ix.labels[1], 1);
        CHECK_EQ(ix.labels[3], 2);
    }
    CHECK_OK(parse(&ix, "a,10\nb,2\nc,x\n", NULL, 0));
    check_classes(&ix, (const char *[]){"10", "2", "x"}, 3);
    CHECK_OK(parse(&ix, "a,b\nb,B\nc,a\nd,\xC3\xA9\ne,_\nf,-1\n", NULL, 0));
    check_classes(&ix, (const char *[]){"-1", "B", "_", "a", "b", "\xC3\xA9"}, 6);

    /* Errors name the file and line. */
    CHECK_EQ(parse(&ix, "a.jpg,cat\nb.jpg\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:2: no label field");
    CHECK_EQ(parse(&ix, "a.jpg,cat\n\nb.jpg,dog,x\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:3: 3 fields");
    CHECK_EQ(parse(&ix, "a.jpg,cat,\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:1: 3 fields");
    CHECK_EQ(parse(&ix, "a.jpg,\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:1: empty label");
    CHECK_EQ(parse(&ix, "x,y\n\"\",cat\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:2: empty path");
    CHECK_EQ(parse(&ix, "a.jpg,cat\n\"b.jpg,dog\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:2: a quoted field is not closed");
    CHECK_EQ(parse(&ix, "\"a\"b.jpg,cat\n", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:1: text after the closing quote");
    CHECK_EQ(dsrt__manifest_parse(&ix, "a\0b,c\n", 6, "m.csv", NULL, 0), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: m.csv:1: NUL byte");
    index_clear(&ix);

    /* Empty: no samples, no classes. */
    CHECK_OK(parse(&ix, "", NULL, -1));
    CHECK_EQ(ix.n, 0);
    CHECK_OK(parse(&ix, "path,label\n\n", NULL, -1));
    CHECK_EQ(ix.n, 0);
    CHECK_EQ(ix.num_classes, 0);
    index_clear(&ix);
}

/* A large manifest parses in linear time: 1M lines, 1000 classes. */
static void test_manifest_large(void) {
    enum { LINES = 1000000, CLASSES = 1000 };
    size_t cap = (size_t)LINES * 40, len = 0;
    char *text = malloc(cap);
    REQUIRE(text);
    len += (size_t)snprintf(text, cap, "path,label\n");
    for (size_t i = 0; i < LINES; i++)
        len += (size_t)snprintf(text + len, cap - len, "img/%07zu.jpg,class_%04zu\n", i,
                                (i * 7919) % CLASSES);
    dsrt_index ix = {0};
    double t0 = now_s();
    CHECK_OK(dsrt__manifest_parse(&ix, text, len, "big.csv", "/root", -1));
    double dt = now_s() - t0;
    CHECK_EQ(ix.n, LINES);
    CHECK_EQ(ix.num_classes, CLASSES);
    if (ix.n == LINES && ix.num_classes == CLASSES) {
        CHECK_STR_EQ(ix.classes[0], "class_0000");
        CHECK_STR_EQ(ix.classes[999], "class_0999");
        CHECK_EQ(ix.labels[LINES - 1], ((size_t)(LINES - 1) * 7919) % CLASSES);
        CHECK_STR_EQ(ix.paths[LINES - 1], "/root/img/0999999.jpg");
    }
    fprintf(stderr, "  manifest of %d lines parsed in %.3f s\n", LINES, dt);
    index_clear(&ix);
    free(text);
}

static void test_manifest_load(void) {
    dsrt_index ix = {0};
    dsrt_datastore_options o = dsrt_datastore_defaults();
    KEEP_PATH(dir, "man");
    make_dir(dir);
    write_text(tmp_path("man/list.csv"), "path,label\nimgs/a.jpg,cat\n/x/b.jpg,dog\n");
    CHECK_OK(dsrt__manifest_load(&ix, tmp_path("man/list.csv"), &o));
    CHECK_EQ(ix.n, 2);
    if (ix.n == 2) {
        CHECK_STR_EQ(ix.paths[0], tmp_path("man/imgs/a.jpg"));
        CHECK_STR_EQ(ix.paths[1], "/x/b.jpg");
    }
    index_clear(&ix);
    o.manifest_header = 0;
    CHECK_OK(dsrt__manifest_load(&ix, tmp_path("man/list.csv"), &o));
    CHECK_EQ(ix.n, 3);
    index_clear(&ix);
    CHECK_EQ(dsrt__manifest_load(&ix, tmp_path("man/none.csv"), &o), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "manifest: ");
    CHECK_CONTAINS(dsrt_last_error(), "none.csv");
    index_clear(&ix);
}

// ----------------------------------------------------------------------------
// Through the public API

/* Every source has its name, detection and loader in one table: the names
 * round-trip and an unknown kind is named so. */
static void test_source_names(void) {
    static const char *const names[] = {"auto",    "folder",   "manifest", "idx",
                                        "cifar10", "cifar100", "shards"};
    for (int k = 0; k <= DSRT_SOURCE_SHARDS; k++)
        CHECK_STR_EQ(dsrt_source_name((dsrt_source)k), names[k]);
    CHECK_STR_EQ(dsrt_source_name((dsrt_source)(DSRT_SOURCE_SHARDS + 1)), "unknown");
    dsrt_datastore *ds;
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.source = (dsrt_source)(DSRT_SOURCE_SHARDS + 1);
    CHECK_EQ(dsrt_datastore_open(&ds, tmp_root, &o), DSRT_EOPTION);
    /* A .bin file that starts with an IDX header is IDX, whatever its size. */
    KEEP_PATH(bin, "idxlike.bin");
    uint8_t buf[3073 * 2] = {0, 0, 8, 3};
    write_file(bin, buf, sizeof buf);
    dsrt_source kind = DSRT_SOURCE_AUTO;
    CHECK_OK(dsrt__detect_source(bin, NULL, &kind));
    CHECK_EQ(kind, DSRT_SOURCE_IDX);
    buf[2] = 9;
    write_file(bin, buf, sizeof buf);
    CHECK_OK(dsrt__detect_source(bin, NULL, &kind));
    CHECK_EQ(kind, DSRT_SOURCE_CIFAR10);
}

/* Sources given a FIFO or a device: refused at once, never waited on or
 * read until memory runs out. An alarm turns a hang into a failure. */
static void test_non_regular(void) {
    KEEP_PATH(fifo, "fifo.csv");
    unlink(fifo);
    REQUIRE(mkfifo(fifo, 0644) == 0);
    dsrt_datastore *ds = NULL;
    dsrt_datastore_options o = dsrt_datastore_defaults();
    alarm(60);
    static const dsrt_source kinds[] = {DSRT_SOURCE_AUTO, DSRT_SOURCE_MANIFEST, DSRT_SOURCE_IDX,
                                        DSRT_SOURCE_CIFAR10};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(kinds); k++) {
        o.source = kinds[k];
        CHECK_EQ(dsrt_datastore_open(&ds, fifo, &o), DSRT_EFORMAT);
        CHECK_CONTAINS(dsrt_last_error(), fifo);
        CHECK_CONTAINS(dsrt_last_error(), "FIFO");
        CHECK(ds == NULL);
        o.source = kinds[k];
        CHECK_NE(dsrt_datastore_open(&ds, "/dev/zero", &o), 0);
        CHECK_CONTAINS(dsrt_last_error(), "/dev/zero");
        CHECK(ds == NULL);
    }
    /* A manifest naming a FIFO: the sample read on the calling thread is
     * refused, naming it. */
    KEEP_PATH(man, "fifo-list.csv");
    char text[PATH_MAX + 16];
    snprintf(text, sizeof text, "%s,a\n", fifo);
    write_text(man, text);
    o.source = DSRT_SOURCE_MANIFEST;
    CHECK_OK(dsrt_datastore_open(&ds, man, &o));
    if (ds) {
        dsrt_decoder *dec;
        CHECK_OK(dsrt_decoder_create(&dec, NULL));
        dsrt_decode_request req = {.channels = 1};
        dsrt_image img;
        CHECK_EQ(dsrt_datastore_read_image(ds, 0, dec, &req, &img), DSRT_EFORMAT);
        CHECK_CONTAINS(dsrt_last_error(), "FIFO");
        dsrt_decoder_destroy(dec);
        dsrt_datastore_close(ds);
    }
    alarm(0);
    unlink(fifo);
}

static void test_open(void) {
    dsrt_datastore *ds;
    dsrt_datastore_options o = dsrt_datastore_defaults();
    dsrt_image v;

    /* IDX folder, detected. */
    CHECK_OK(dsrt_datastore_open(&ds, tmp_path("mnist"), &o));
    if (ds) {
        CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_IDX);
        CHECK_EQ(dsrt_datastore_count(ds), N);
        CHECK_EQ(dsrt_datastore_num_classes(ds), 3);
        CHECK_EQ(dsrt_datastore_label(ds, 4), label_of(4));
        CHECK(dsrt_datastore_path(ds, 0) == NULL);
        CHECK_OK(dsrt_datastore_pixels(ds, 4, &v));
        CHECK_EQ(v.width, W);
        CHECK_EQ(v.height, H);
        CHECK_EQ(v.channels, 1);
        CHECK_EQ(v.data[v.stride * 2 + 3], px_of(4, 2, 3));
        dsrt_datastore_close(ds);
    }
    /* IDX file, explicit source, test split file. */
    o.source = DSRT_SOURCE_IDX;
    CHECK_OK(dsrt_datastore_open(&ds, tmp_path("mnist/t10k-images-idx3-ubyte.gz"), &o));
    if (ds) CHECK_EQ(dsrt_datastore_count(ds), 3);
    dsrt_datastore_close(ds);
    o.source = DSRT_SOURCE_AUTO;

    /* An IDX file with no sample: empty. */
    uint8_t buf[64];
    uint32_t z3[3] = {0, 2, 2}, z1[1] = {0};
    KEEP_PATH(e, "empty");
    make_dir(e);
    write_file(tmp_path("empty/train-images-idx3-ubyte"), buf, make_idx(buf, 8, 3, z3, NULL, 0));
    write_file(tmp_path("empty/train-labels-idx1-ubyte"), buf, make_idx(buf, 8, 1, z1, NULL, 0));
    CHECK_EQ(dsrt_datastore_open(&ds, e, &o), DSRT_EEMPTY);
    CHECK(ds == NULL);

    /* CIFAR-100 folder, detected. */
    o.split = DSRT_SPLIT_TRAIN;
    CHECK_OK(dsrt_datastore_open(&ds, tmp_path("cifar-100-binary"), &o));
    if (ds) {
        CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_CIFAR100);
        CHECK_EQ(dsrt_datastore_count(ds), 4);
        CHECK_EQ(dsrt_datastore_num_classes(ds), 100);
        CHECK_STR_EQ(dsrt_datastore_class_name(ds, 99), "fine_99");
        CHECK_OK(dsrt_datastore_pixels(ds, 1, &v));
        CHECK_EQ(v.channels, 3);
        CHECK_EQ(v.data[v.stride * 5 + 7 * 3 + 2], cifar_px(1, 2, 5, 7));
        dsrt_datastore_close(ds);
    }

    /* Manifest, detected by .csv. */
    CHECK_OK(dsrt_datastore_open(&ds, tmp_path("man/list.csv"), &o));
    if (ds) {
        CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_MANIFEST);
        CHECK_EQ(dsrt_datastore_count(ds), 2);
        CHECK_STR_EQ(dsrt_datastore_path(ds, 1), "/x/b.jpg");
        CHECK_STR_EQ(dsrt_datastore_class_name(ds, 1), "dog");
        CHECK_EQ(dsrt_datastore_pixels(ds, 0, &v), DSRT_EUNSUPPORTED);
        /* Files are not exported. */
        CHECK_EQ(dsrt_datastore_export(ds, tmp_path("noexport"), NULL), DSRT_EUNSUPPORTED);
        dsrt_datastore_close(ds);
    }
    write_text(tmp_path("man/empty.csv"), "path,label\n");
    CHECK_EQ(dsrt_datastore_open(&ds, tmp_path("man/empty.csv"), &o), DSRT_EEMPTY);
    write_text(tmp_path("man/bad.csv"), "a.jpg,cat\nb.jpg\n");
    CHECK_EQ(dsrt_datastore_open(&ds, tmp_path("man/bad.csv"), &o), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "bad.csv:2: no label field");
}

// ----------------------------------------------------------------------------
// Export and its round trip through the folder source

static void test_export_roundtrip(void) {
    dsrt_datastore *ds = NULL, *back = NULL, *view = NULL;
    dsrt_datastore_options o = dsrt_datastore_defaults();
    dsrt_decoder *dec = NULL;
    KEEP_PATH(out, "export/deeper/mnist");

    CHECK_OK(dsrt_datastore_open(&ds, tmp_path("mnist"), &o));
    if (!ds) return;
    CHECK_EQ(dsrt_datastore_export(ds, out, NULL), N);
    /* Again over the same folder: existing files are overwritten. */
    CHECK_EQ(dsrt_datastore_export(ds, out, NULL), N);

    struct stat st;
    CHECK(stat(tmp_path("export/deeper/mnist/%d/00004.png", label_of(4)), &st) == 0);

    o.source = DSRT_SOURCE_FOLDER;
    CHECK_OK(dsrt_datastore_open(&back, out, &o));
    CHECK_OK(dsrt_decoder_create(&dec, NULL));
    if (back && dec) {
        CHECK_EQ(dsrt_datastore_count(back), N);
        CHECK_EQ(dsrt_datastore_num_classes(back), dsrt_datastore_num_classes(ds));
        for (size_t c = 0; c < dsrt_datastore_num_classes(back); c++)
            CHECK_STR_EQ(dsrt_datastore_class_name(back, c), dsrt_datastore_class_name(ds, c));
        /* Each file's name is its position in ds: compare pixels and classes. */
        int bad = 0;
        for (size_t i = 0; i < dsrt_datastore_count(back); i++) {
            const char *p = dsrt_datastore_path(back, i), *slash = strrchr(p, '/');
            size_t k = (size_t)strtoul(slash + 1, NULL, 10);
            REQUIRE(k < N);
            dsrt_decode_request req = {.channels = 1};
            dsrt_image img, want;
            CHECK_OK(dsrt_datastore_read_image(back, i, dec, &req, &img));
            CHECK_OK(dsrt_datastore_pixels(ds, k, &want));
            CHECK_STR_EQ(dsrt_datastore_class_name(back, dsrt_datastore_label(back, i)),
                         dsrt_datastore_class_name(ds, dsrt_datastore_label(ds, k)));
            CHECK_EQ(img.width, W);
            CHECK_EQ(img.height, H);
            for (int y = 0; y < H && img.width == W; y++)
                bad += memcmp(img.data + y * img.stride, want.data + y * want.stride, W) != 0;
        }
        CHECK_EQ(bad, 0);
    }
    dsrt_datastore_close(back);
    back = NULL;

    /* A view numbers files by view position; names can be overridden. */
    uint32_t pick[2] = {5, 1};
    CHECK_OK(dsrt_datastore_subset(ds, pick, 2, &view));
    const char *names[3] = {"zero", "one", "two"};
    if (view) {
        CHECK_EQ(dsrt_datastore_export(view, tmp_path("export/view"), names), 2);
        CHECK(stat(tmp_path("export/view/%s/00000.png", names[label_of(5)]), &st) == 0);
        CHECK(stat(tmp_path("export/view/%s/00001.png", names[label_of(1)]), &st) == 0);
        CHECK(stat(tmp_path("export/view/%s", names[0]), &st) == 0 && S_ISDIR(st.st_mode));
        const char *clash[3] = {"a", "b", "a"}, *slash[3] = {"a", "b/c", "d"};
        CHECK_EQ(dsrt_datastore_export(view, tmp_path("export/v2"), clash), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), "both named \"a\"");
        CHECK_EQ(dsrt_datastore_export(view, tmp_path("export/v2"), slash), DSRT_EOPTION);
        CHECK_CONTAINS(dsrt_last_error(), "\"b/c\" cannot be a folder name");
    }
    /* The output folder cannot be made. */
    write_text(tmp_path("export/file"), "x");
    CHECK_EQ(dsrt_datastore_export(ds, tmp_path("export/file/sub"), NULL), -ENOTDIR);
    CHECK_CONTAINS(dsrt_last_error(), "export/file");

    dsrt_datastore_close(view);
    dsrt_decoder_destroy(dec);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// The real Fashion-MNIST, where installed

static void test_fashion_mnist(void) {
    struct stat st;
    if (stat(FASHION_DIR, &st) != 0) {
        fprintf(stderr, "  %s not installed: skipped\n", FASHION_DIR);
        return;
    }
    static const char *const names[10] = {"tshirt_top", "trouser",   "pullover", "dress",
                                          "coat",       "sandal",    "shirt",    "sneaker",
                                          "bag",        "ankle_boot"};
    dsrt_datastore_options o = dsrt_datastore_defaults();
    for (int split = 0; split < 2; split++) {
        dsrt_datastore *ds = NULL;
        o.split = split ? DSRT_SPLIT_TEST : DSRT_SPLIT_TRAIN;
        double t0 = now_s();
        CHECK_OK(dsrt_datastore_open(&ds, FASHION_DIR, &o));
        if (!ds) continue;
        fprintf(stderr, "  fashion-mnist %s opened in %.3f s\n", split ? "test" : "train",
                now_s() - t0);
        size_t n = split ? 10000 : 60000;
        CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_IDX);
        CHECK_EQ(dsrt_datastore_count(ds), n);
        CHECK_EQ(dsrt_datastore_num_classes(ds), 10);
        for (size_t c = 0; c < 10 && dsrt_datastore_num_classes(ds) == 10; c++)
            CHECK_STR_EQ(dsrt_datastore_class_name(ds, c), names[c]);
        size_t counts[10] = {0};
        dsrt_datastore_class_counts(ds, counts);
        for (int c = 0; c < 10; c++) CHECK_EQ(counts[c], n / 10);
        /* The first sample of either split is an ankle boot. */
        CHECK_EQ(dsrt_datastore_label(ds, 0), 9);
        dsrt_image v;
        CHECK_OK(dsrt_datastore_pixels(ds, 0, &v));
        CHECK_EQ(v.width, 28);
        CHECK_EQ(v.height, 28);
        CHECK_EQ(v.channels, 1);
        dsrt_datastore_close(ds);
    }
}

// ----------------------------------------------------------------------------

int main(void) {
    const char *base = getenv("DSRT_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s", base);
    for (char *s = cmd + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(cmd, 0755);
            *s = '/';
        }
    mkdir(cmd, 0755);
    snprintf(tmp_root, sizeof tmp_root, "%s/sources.XXXXXX", base);
    REQUIRE(mkdtemp(tmp_root));

    RUN(test_idx_gzip_bomb);
    RUN(test_gunzip);
    RUN(test_idx_parse);
    RUN(test_idx_load);
    RUN(test_cifar_parse);
    RUN(test_cifar_load);
    RUN(test_manifest_parse);
    RUN(test_manifest_large);
    RUN(test_manifest_load);
    RUN(test_open);
    RUN(test_non_regular);
    RUN(test_source_names);
    RUN(test_export_roundtrip);
    RUN(test_fashion_mnist);

    if (!test_failures) remove_tree(tmp_root);
    return TEST_RESULT();
}
