/*
 * Tests of sampling: mixes of datastores in proportions and weighted
 * sampling within one. A mix's classes are merged by name or kept apart;
 * an epoch gives each source its share exactly, interleaved at random
 * (the first half of an epoch within a binomial bound), each source walked
 * in permutations without replacement (every sample once before any
 * again, across epochs) or uniformly with replacement (a chi-square bound);
 * class-balanced draws give every class its share within a chi-square
 * bound; the batches are the same for any worker count and any parts
 * count, and after a reset mid-epoch; a mix that reads one source from tar
 * shards gives the batches of the same mix of folders; bad options are
 * refused, naming the value. The bounds are at a false-failure probability
 * under 1e-8, and the seeds are fixed.
 *
 * Images are made on the spot (tests/testimg.h) under $DSRT_TEST_TMP.
 */
#include <dsrt/pipeline.h>
#include <stdarg.h>
#include <unistd.h>

#include "task.h"
#include "testimg.h"

static char base_dir[4096], dir_a[4096], dir_b[4096], dir_c[4096];

// ----------------------------------------------------------------------------
// Datasets

/* Writes counts[c] small JPEGs into dir/names[c]/ for each class c. */
static void make_folder(const char *dir, const char *const *names, const size_t *counts,
                        size_t classes, uint32_t seed) {
    for (size_t c = 0; c < classes; c++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[c]);
        REQUIRE(timg_mkdirs(path) == 0);
        for (size_t i = 0; i < counts[c]; i++) {
            size_t len = 0;
            uint8_t *buf = timg_make_jpeg(TIMG_JPEG_420, 20 + (int)(i % 7), 18 + (int)(c % 5),
                                          seed + (uint32_t)(c * 1000 + i), &len);
            REQUIRE(buf);
            snprintf(path, sizeof path, "%s/%s/%03zu.jpg", dir, names[c], i);
            REQUIRE(timg_write_file(path, buf, len) == 0);
            free(buf);
        }
    }
}

static dsrt_datastore *open_path(const char *path) {
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, path, NULL);
    if (rc != 0) fprintf(stderr, "open %s: %s\n", path, dsrt_last_error());
    REQUIRE(rc == 0);
    return ds;
}

/* A mix of a and b with weights wa, wb. */
static dsrt_datastore *mix_of(const char *a, const char *b, double wa, double wb, int replacement) {
    dsrt_datastore *src[2] = {open_path(a), open_path(b)}, *mix = NULL;
    double w[2] = {wa, wb};
    dsrt_mix_options mo = dsrt_mix_defaults();
    mo.replacement = replacement;
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, &mo));
    REQUIRE(mix);
    dsrt_datastore_close(src[0]);
    dsrt_datastore_close(src[1]);
    return mix;
}

static dsrt_augment_options tiny(void) {
    dsrt_augment_options a = dsrt_augment_defaults();
    a.output_height = a.output_width = 8;
    a.rand_x_reflection = 1;
    return a;
}

static dsrt_pipeline_options opts(size_t batch, size_t epoch_samples) {
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.batch = batch;
    o.prefetch = 2;
    o.threads = 2;
    o.seed = 11;
    o.epochs = 2;
    o.epoch_samples = epoch_samples;
    return o;
}

// ----------------------------------------------------------------------------
// Runs

#define FNV0 0xcbf29ce484222325ULL
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* What a run delivered: each place's id, source and label, in order, and
 * a hash of each batch's pixels. */
typedef struct {
    size_t n, cap, batches;
    uint32_t *ids;
    int32_t *sources, *labels;
    uint64_t hash[256];
} run_rec;

static void rec_free(run_rec *r) {
    free(r->ids);
    free(r->sources);
    free(r->labels);
    memset(r, 0, sizeof *r);
}

static void rec_batch(run_rec *r, const dsrt_batch *b) {
    if (r->n + b->count > r->cap) {
        r->cap = (r->n + b->count) * 2;
        r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
        r->sources = realloc(r->sources, r->cap * sizeof *r->sources);
        r->labels = realloc(r->labels, r->cap * sizeof *r->labels);
        REQUIRE(r->ids && r->sources && r->labels);
    }
    memcpy(r->ids + r->n, b->ids, b->count * sizeof *b->ids);
    memcpy(r->sources + r->n, b->sources, b->count * sizeof *b->sources);
    memcpy(r->labels + r->n, b->labels, b->count * sizeof *b->labels);
    r->n += b->count;
    REQUIRE(b->global < 256);
    uint64_t h = r->hash[b->global] ? r->hash[b->global] : FNV0;
    for (size_t i = 0; i < b->count; i++)
        h = fnv(h, (const char *)b->data + i * b->sample_stride, b->sample_bytes);
    r->hash[b->global] = h;
    r->batches++;
}

/* Takes up to max batches (0: to the end) from a new pipeline. */
static void run(run_rec *r, const dsrt_datastore *ds, const dsrt_pipeline_options *o, size_t max) {
    dsrt_augment_options a = tiny();
    dsrt_pipeline *p = NULL;
    int rc = dsrt_pipeline_open(&p, ds, &a, o);
    if (rc != 0) fprintf(stderr, "pipeline: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    dsrt_batch *b;
    for (size_t k = 0; (max == 0 || k < max) && dsrt_pipeline_next(p, &b) == 0; k++) {
        rec_batch(r, b);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    dsrt_pipeline_close(p);
}

static int rec_equal(const run_rec *x, const run_rec *y) {
    return x->n == y->n && memcmp(x->ids, y->ids, x->n * sizeof *x->ids) == 0 &&
           memcmp(x->sources, y->sources, x->n * sizeof *x->sources) == 0 &&
           memcmp(x->labels, y->labels, x->n * sizeof *x->labels) == 0;
}

// ----------------------------------------------------------------------------
// Classes

static void test_labels(void) {
    dsrt_datastore *src[2] = {open_path(dir_a), open_path(dir_b)}, *mix = NULL;
    double w[2] = {1, 1};
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, NULL));
    REQUIRE(mix);
    CHECK_EQ(dsrt_datastore_source(mix), DSRT_SOURCE_MIX);
    CHECK_STR_EQ(dsrt_source_name(DSRT_SOURCE_MIX), "mix");
    CHECK_EQ(dsrt_datastore_count(mix),
             dsrt_datastore_count(src[0]) + dsrt_datastore_count(src[1]));
    CHECK_EQ(dsrt_datastore_mix_sources(mix), 2);
    CHECK(fabs(dsrt_datastore_mix_weight(mix, 0) - 0.5) < 1e-12);
    /* Merged by name: cat, dog (in both), eel. */
    CHECK_EQ(dsrt_datastore_num_classes(mix), 3);
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, 0), "cat");
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, 1), "dog");
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, 2), "eel");
    size_t bad = 0;
    for (size_t i = 0; i < dsrt_datastore_count(mix); i++) {
        const char *path = dsrt_datastore_path(mix, i);
        const char *name = dsrt_datastore_class_name(mix, (size_t)dsrt_datastore_label(mix, i));
        char want[64];
        snprintf(want, sizeof want, "/%s/", name);
        bad += strstr(path, want) == NULL;
        size_t k = dsrt_datastore_mix_source(mix, i);
        bad += strncmp(path, k ? dir_b : dir_a, strlen(dir_a)) != 0;
    }
    CHECK_EQ(bad, 0);
    size_t counts[3];
    dsrt_datastore_class_counts(mix, counts);
    CHECK_EQ(counts[1], 10 + 5); /* dog of both */
    dsrt_datastore_close(mix);

    /* Kept apart: each source's classes, prefixed by its number. */
    dsrt_mix_options mo = dsrt_mix_defaults();
    mo.labels = DSRT_MIX_LABELS_SEPARATE;
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, &mo));
    REQUIRE(mix);
    CHECK_EQ(dsrt_datastore_num_classes(mix), 4);
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, 1), "0:dog");
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, 2), "1:dog");
    size_t last = dsrt_datastore_count(mix) - 1;
    CHECK_STR_EQ(dsrt_datastore_class_name(mix, (size_t)dsrt_datastore_label(mix, last)), "1:eel");
    dsrt_mix_labels l;
    CHECK_OK(dsrt_mix_labels_from_name("separate", &l));
    CHECK_EQ(l, DSRT_MIX_LABELS_SEPARATE);
    CHECK_EQ(dsrt_mix_labels_from_name("both", &l), DSRT_EOPTION);
    dsrt_datastore_close(mix);
    dsrt_datastore_close(src[0]);
    dsrt_datastore_close(src[1]);
}

// ----------------------------------------------------------------------------
// Proportions

/* How often each id came in r's places [lo, hi). */
static void id_counts(const run_rec *r, size_t lo, size_t hi, size_t *counts, size_t n) {
    memset(counts, 0, n * sizeof *counts);
    for (size_t i = lo; i < hi; i++) {
        REQUIRE(r->ids[i] < n);
        counts[r->ids[i]]++;
    }
}

static void test_proportions(void) {
    dsrt_datastore *mix = mix_of(dir_a, dir_b, 0.7, 0.3, 0);
    size_t na = 30, n = dsrt_datastore_count(mix), E = 1000;
    dsrt_pipeline_options o = opts(50, E);
    run_rec r = {0};
    run(&r, mix, &o, 0);
    CHECK_EQ(r.n, 2 * E);
    /* Each epoch gives each source its share exactly. */
    for (size_t e = 0; e < 2; e++) {
        size_t from_a = 0;
        for (size_t i = e * E; i < (e + 1) * E; i++) from_a += r.sources[i] == 0;
        CHECK_EQ(from_a, 700);
    }
    /* Interleaved at random: the first half of an epoch holds about half
     * of each (a hypergeometric count: sd 7.2; 6 sd is p < 1e-8). */
    size_t half_a = 0;
    for (size_t i = 0; i < E / 2; i++) half_a += r.sources[i] == 0;
    CHECK_LE(labs((long)half_a - 350), 44);
    /* Ids of source 0 are its positions [0, 30); each id says its source. */
    size_t wrong = 0;
    for (size_t i = 0; i < r.n; i++) wrong += (r.ids[i] >= na) != (r.sources[i] == 1);
    CHECK_EQ(wrong, 0);
    /* Without replacement: in epoch 0 (draws 0..699 of source 0: 23 whole
     * walks of 30 and a third of one) every sample of A comes 23 or 24
     * times; over both epochs (1400 = 46 walks and 20) 46 or 47. */
    size_t *c = calloc(n, sizeof *c);
    id_counts(&r, 0, E, c, n);
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t i = 0; i < na; i++) lo = c[i] < lo ? c[i] : lo, hi = c[i] > hi ? c[i] : hi;
    CHECK_EQ(lo, 23);
    CHECK_EQ(hi, 24);
    id_counts(&r, 0, 2 * E, c, n);
    lo = SIZE_MAX, hi = 0;
    for (size_t i = 0; i < na; i++) lo = c[i] < lo ? c[i] : lo, hi = c[i] > hi ? c[i] : hi;
    CHECK_EQ(lo, 46);
    CHECK_EQ(hi, 47);
    rec_free(&r);
    dsrt_datastore_close(mix);

    /* With replacement: source 0's 700 draws uniform over its 30 samples
     * (chi-square, 29 degrees of freedom: 105 is p < 1e-8). */
    mix = mix_of(dir_a, dir_b, 0.7, 0.3, 1);
    run(&r, mix, &o, 0);
    id_counts(&r, 0, E, c, n);
    double chi = 0, expect = 700.0 / (double)na;
    size_t from_a = 0;
    for (size_t i = 0; i < na; i++) {
        chi += (c[i] - expect) * (c[i] - expect) / expect;
        from_a += c[i];
    }
    CHECK_EQ(from_a, 700);
    if (!(chi < 105)) fprintf(stderr, "chi-square %.1f\n", chi);
    CHECK(chi < 105);
    /* And not the walk: some sample comes 27 times or more, or 20 or fewer
     * (a walk gives 23 or 24 each); the chance that none does is < 1e-3 for
     * one seed, and this seed is fixed. */
    lo = SIZE_MAX, hi = 0;
    for (size_t i = 0; i < na; i++) lo = c[i] < lo ? c[i] : lo, hi = c[i] > hi ? c[i] : hi;
    CHECK(hi - lo > 1);
    rec_free(&r);
    free(c);

    /* The default epoch: the sources' samples together. */
    o = opts(16, 0);
    o.epochs = 1;
    run(&r, mix, &o, 0);
    CHECK_EQ(r.n, n);
    rec_free(&r);
    dsrt_datastore_close(mix);
}

/* Shuffled once, a mix keeps its interleave (which source each place
 * takes from) every epoch, and still walks its sources on: the second
 * epoch's samples of a source are the next ones of its walk, not the
 * first epoch's again. */
static void test_mix_shuffle_once(void) {
    dsrt_datastore *mix = mix_of(dir_a, dir_b, 0.5, 0.5, 0);
    size_t n = dsrt_datastore_count(mix), E = 10;
    dsrt_pipeline_options o = opts(5, E);
    o.shuffle = DSRT_SHUFFLE_ONCE;
    run_rec r = {0};
    run(&r, mix, &o, 0);
    CHECK_EQ(r.n, 2 * E);
    size_t same_source = 0, *c = calloc(n, sizeof *c);
    for (size_t i = 0; i < E; i++) same_source += r.sources[i] == r.sources[E + i];
    CHECK_EQ(same_source, E);
    /* 5 draws of each source an epoch, of 30 and more: ten distinct. */
    id_counts(&r, 0, 2 * E, c, n);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) distinct += c[i] == 1;
    CHECK_EQ(distinct, 2 * E);
    free(c);
    rec_free(&r);
    dsrt_datastore_close(mix);
}

// ----------------------------------------------------------------------------
// Weighted sampling

static void test_class_balanced(void) {
    dsrt_datastore *ds = open_path(dir_c); /* classes of 40, 8 and 2 */
    size_t E = 3000;
    dsrt_pipeline_options o = opts(100, E);
    o.epochs = 1;
    o.sample_weights = "class-balanced";
    run_rec r = {0};
    run(&r, ds, &o, 0);
    CHECK_EQ(r.n, E);
    size_t per[3] = {0};
    for (size_t i = 0; i < r.n; i++) per[r.labels[i]]++;
    /* Equal within sampling error: chi-square, 2 degrees of freedom: 41.4
     * is p = 1e-9. */
    double chi = 0, expect = (double)E / 3;
    for (int c = 0; c < 3; c++) chi += (per[c] - expect) * (per[c] - expect) / expect;
    if (!(chi < 41.4)) fprintf(stderr, "per class %zu %zu %zu\n", per[0], per[1], per[2]);
    CHECK(chi < 41.4);
    CHECK_EQ(r.sources[0], 0);
    rec_free(&r);

    /* The default epoch: the datastore's count. */
    o.epoch_samples = 0;
    run(&r, ds, &o, 0);
    CHECK_EQ(r.n, 50);
    rec_free(&r);

    /* A weights file: only the last class (positions 48, 49) weighs. */
    char file[4096];
    snprintf(file, sizeof file, "%s/weights.txt", base_dir);
    FILE *f = fopen(file, "w");
    REQUIRE(f);
    fprintf(f, "# one weight a sample\n");
    for (int i = 0; i < 50; i++) fprintf(f, "%s\n", i >= 48 ? "2.5" : "0");
    fclose(f);
    o.sample_weights = file;
    o.epoch_samples = 200;
    run(&r, ds, &o, 0);
    size_t outside = 0;
    for (size_t i = 0; i < r.n; i++) outside += r.ids[i] < 48;
    CHECK_EQ(r.n, 200);
    CHECK_EQ(outside, 0);
    rec_free(&r);

    /* The same weights as values. */
    double w[50] = {0};
    w[48] = w[49] = 1;
    o.sample_weights = NULL;
    o.sample_weight_values = w;
    run(&r, ds, &o, 0);
    outside = 0;
    for (size_t i = 0; i < r.n; i++) outside += r.ids[i] < 48;
    CHECK_EQ(outside, 0);
    rec_free(&r);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Determinism: workers, parts, resume

/* The union of parts pipelines' batches, in order. */
static void run_parts(run_rec *r, const dsrt_datastore *ds, dsrt_pipeline_options o,
                      unsigned parts) {
    run_rec *each = calloc(parts, sizeof *each);
    o.parts = parts;
    for (unsigned k = 0; k < parts; k++) {
        o.part = k;
        run(&each[k], ds, &o, 0);
    }
    size_t at[64] = {0};
    dsrt_augment_options a = tiny();
    dsrt_pipeline *p;
    o.parts = 1, o.part = 0;
    REQUIRE(dsrt_pipeline_open(&p, ds, &a, &o) == 0);
    uint64_t bpe = dsrt_pipeline_batches_per_epoch(p);
    dsrt_pipeline_close(p);
    for (uint64_t g = 0; g < bpe * o.epochs; g++) {
        size_t count =
            g % bpe == bpe - 1 && o.epoch_samples % o.batch ? o.epoch_samples % o.batch : o.batch;
        for (unsigned k = 0; k < parts; k++) {
            size_t lo = count * k / parts, hi = count * (k + 1) / parts;
            for (size_t i = lo; i < hi; i++) {
                dsrt_batch b = {.ids = each[k].ids + at[k],
                                .sources = each[k].sources + at[k],
                                .labels = each[k].labels + at[k],
                                .count = 1};
                /* ids, sources and labels only: pixels are compared per part. */
                if (r->n + 1 > r->cap) {
                    r->cap = (r->n + 1) * 2;
                    r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
                    r->sources = realloc(r->sources, r->cap * sizeof *r->sources);
                    r->labels = realloc(r->labels, r->cap * sizeof *r->labels);
                }
                r->ids[r->n] = b.ids[0];
                r->sources[r->n] = b.sources[0];
                r->labels[r->n] = b.labels[0];
                r->n++;
                at[k]++;
            }
        }
    }
    for (unsigned k = 0; k < parts; k++) {
        CHECK_EQ(at[k], each[k].n);
        rec_free(&each[k]);
    }
    free(each);
}

static void check_same(const dsrt_datastore *ds, dsrt_pipeline_options o) {
    run_rec one = {0}, other = {0};
    o.threads = 1;
    run(&one, ds, &o, 0);
    const unsigned threads[] = {2, 4};
    for (size_t t = 0; t < 2; t++) {
        o.threads = threads[t];
        o.chunk = 3;
        run(&other, ds, &o, 0);
        CHECK(rec_equal(&one, &other));
        CHECK(memcmp(one.hash, other.hash, sizeof one.hash) == 0);
        rec_free(&other);
    }
    o.threads = 2;
    o.chunk = 0;
    const unsigned parts[] = {2, 3, 7};
    for (size_t k = 0; k < 3; k++) {
        run_parts(&other, ds, o, parts[k]);
        CHECK(rec_equal(&one, &other));
        rec_free(&other);
    }
    /* Resume mid-epoch: reset to batch 3 of epoch 1 gives the rest. */
    dsrt_augment_options a = tiny();
    dsrt_pipeline *p;
    REQUIRE(dsrt_pipeline_open(&p, ds, &a, &o) == 0);
    CHECK_OK(dsrt_pipeline_reset(p, 1, 3));
    dsrt_batch *b;
    while (dsrt_pipeline_next(p, &b) == 0) {
        rec_batch(&other, b);
        CHECK_EQ(other.hash[b->global], one.hash[b->global]);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    dsrt_pipeline_close(p);
    size_t skip = o.epoch_samples + 3 * o.batch;
    CHECK_EQ(other.n, one.n - skip);
    CHECK(other.n == one.n - skip &&
          memcmp(other.ids, one.ids + skip, other.n * sizeof *other.ids) == 0);
    rec_free(&one);
    rec_free(&other);
}

static void test_determinism(void) {
    dsrt_datastore *mix = mix_of(dir_a, dir_b, 0.6, 0.4, 0);
    dsrt_pipeline_options o = opts(12, 100);
    check_same(mix, o);
    dsrt_datastore_close(mix);
    mix = mix_of(dir_a, dir_b, 0.2, 0.8, 1);
    check_same(mix, o);
    dsrt_datastore_close(mix);
    dsrt_datastore *ds = open_path(dir_c);
    o.sample_weights = "class-balanced";
    check_same(ds, o);
    dsrt_datastore_close(ds);
}

/* A mix reading one source from tar shards gives the batches of the same
 * mix of folders (the shards hold the folder's samples in its order). */
static void test_shards(void) {
    char shards[4096];
    snprintf(shards, sizeof shards, "%s/b-shards", base_dir);
    dsrt_datastore *b = open_path(dir_b);
    uint64_t written = 0;
    dsrt_shard_write_options wo = dsrt_shard_write_defaults();
    wo.shard_samples = 6;
    REQUIRE(dsrt_shards_write(b, shards, &wo, &written) > 0);
    dsrt_datastore_close(b);
    dsrt_datastore_options so = dsrt_datastore_defaults();
    so.shard_order = DSRT_SHARD_ORDER_EXACT;
    dsrt_datastore *src[2] = {open_path(dir_a), NULL}, *mix = NULL;
    REQUIRE(dsrt_datastore_open(&src[1], shards, &so) == 0);
    double w[2] = {0.5, 0.5};
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, NULL));
    dsrt_datastore *folders = mix_of(dir_a, dir_b, 0.5, 0.5, 0);
    dsrt_pipeline_options o = opts(10, 80);
    run_rec x = {0}, y = {0};
    run(&x, mix, &o, 0);
    run(&y, folders, &o, 0);
    CHECK(rec_equal(&x, &y));
    CHECK(memcmp(x.hash, y.hash, sizeof x.hash) == 0);
    rec_free(&x);
    rec_free(&y);
    dsrt_datastore_close(folders);
    dsrt_datastore_close(mix);
    dsrt_datastore_close(src[0]);
    dsrt_datastore_close(src[1]);
}

// ----------------------------------------------------------------------------
// The tools' description of a mix, and bad options

/* Writes a file of text made as printf makes it. */
static void write_text(const char *file, const char *fmt, ...) {
    FILE *f = fopen(file, "w");
    REQUIRE(f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void test_open_mix(void) {
    const char *paths[2] = {dir_a, dir_b};
    dsrt_datastore *ds = NULL;
    CHECK_OK(dsrt_datastore_open_mix(&ds, paths, 2, "0.7,0.3", NULL, NULL));
    REQUIRE(ds);
    CHECK(fabs(dsrt_datastore_mix_weight(ds, 0) - 0.7) < 1e-12);
    dsrt_datastore_close(ds);
    /* One path, no mix: the datastore itself. */
    CHECK_OK(dsrt_datastore_open_mix(&ds, paths, 1, NULL, NULL, NULL));
    CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_FOLDER);
    dsrt_datastore_close(ds);
    /* Several paths, no weights: their shares of the samples. */
    CHECK_OK(dsrt_datastore_open_mix(&ds, paths, 2, NULL, NULL, NULL));
    CHECK(fabs(dsrt_datastore_mix_weight(ds, 0) - 30.0 / 50.0) < 1e-12);
    dsrt_datastore_close(ds);

    /* A mix file, paths relative to its folder. */
    char file[4096];
    snprintf(file, sizeof file, "%s/data.mix", base_dir);
    write_text(file, "# path,weight\n%s,3\n\nb,1\n", dir_a);
    CHECK_OK(dsrt_datastore_open_mix(&ds, NULL, 0, file, NULL, NULL));
    REQUIRE(ds);
    CHECK(fabs(dsrt_datastore_mix_weight(ds, 1) - 0.25) < 1e-12);
    CHECK_EQ(dsrt_datastore_count(ds), 50);
    dsrt_datastore_close(ds);

    /* Refused, naming the value. */
    CHECK_EQ(dsrt_datastore_open_mix(&ds, paths, 2, "0.7", NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "1 weight (0.7) for 2 sources");
    CHECK_EQ(dsrt_datastore_open_mix(&ds, paths, 2, "0.7,-0.3", NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "weight -0.3");
    CHECK_EQ(dsrt_datastore_open_mix(&ds, paths, 2, "0,0", NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "every weight is 0");
    CHECK_EQ(dsrt_datastore_open_mix(&ds, paths, 1, "1", NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "one source");
    CHECK_EQ(dsrt_datastore_open_mix(&ds, paths, 2, file, NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "give no data path");
    /* A preset that is none: the mix keeps the name, the pipeline refuses
     * it, naming the source. */
    write_text(file, "%s,1,flip\n%s,1\n", dir_a, dir_b);
    CHECK_OK(dsrt_datastore_open_mix(&ds, NULL, 0, file, NULL, NULL));
    REQUIRE(ds);
    CHECK(strcmp(dsrt_datastore_mix_preset(ds, 0), "flip") == 0);
    CHECK(dsrt_datastore_mix_preset(ds, 1) == NULL);
    dsrt_pipeline *p = NULL;
    dsrt_augment_options a = tiny();
    dsrt_pipeline_options po = opts(5, 0);
    CHECK_EQ(dsrt_pipeline_open(&p, ds, &a, &po), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "mix source 0");
    CHECK_CONTAINS(dsrt_last_error(), "augment preset 'flip'");
    dsrt_datastore_close(ds);
    ds = NULL;
    write_text(file, "%s,1\n", dir_a);
    CHECK_EQ(dsrt_datastore_open_mix(&ds, NULL, 0, file, NULL, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "one source");
    write_text(file, "%s,1\n%s\n", dir_a, dir_b);
    CHECK_EQ(dsrt_datastore_open_mix(&ds, NULL, 0, file, NULL, NULL), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "data.mix:2:");
    CHECK(ds == NULL);
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.source = DSRT_SOURCE_MIX;
    CHECK_EQ(dsrt_datastore_open(&ds, dir_a, &o), DSRT_EOPTION);
}

/* The pipeline's options made into source k's as the pipeline makes them:
 * the preset's recipe at the pipeline's output and normalisation. */
static dsrt_augment_options with_preset(const char *preset, const dsrt_augment_options *base) {
    dsrt_augment_options a = *base;
    if (!preset) return a;
    REQUIRE(dsrt_augment_preset_from_name(preset, &a) == 0);
    a.output_height = base->output_height;
    a.output_width = base->output_width;
    a.output_channels = base->output_channels;
    a.layout = base->layout;
    a.norm = base->norm;
    memcpy(a.mean, base->mean, sizeof a.mean);
    memcpy(a.std, base->std, sizeof a.std);
    return a;
}

/* Hash of every sample of ds (shuffle never, one epoch) by path, with a. */
static void hashes_by_path(const dsrt_datastore *ds, const dsrt_augment_options *a,
                           uint64_t *hash) {
    dsrt_pipeline_options o = opts(4, 0);
    o.shuffle = DSRT_SHUFFLE_NEVER;
    o.epochs = 1;
    dsrt_pipeline *p = NULL;
    REQUIRE(dsrt_pipeline_open(&p, ds, a, &o) == 0);
    dsrt_batch *b;
    while (dsrt_pipeline_next(p, &b) == 0) {
        for (size_t i = 0; i < b->count; i++)
            hash[b->ids[i]] =
                fnv(FNV0, (const char *)b->data + i * b->sample_stride, b->sample_bytes);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    dsrt_pipeline_close(p);
}

/* A mix file's third column: source 0 augmented with its preset's recipe
 * (imagenet-val: resize the shorter side, centre crop) at the pipeline's
 * output size, source 1 with the pipeline's own (a plain resize): every
 * sample of the mix equals that of its source's own pipeline with that
 * augmentation, and the two differ. */
static void test_source_presets(void) {
    char file[4096];
    snprintf(file, sizeof file, "%s/presets.mix", base_dir);
    write_text(file, "%s,1, imagenet-val\n%s,1\n", dir_a, dir_b);
    dsrt_datastore *mix = NULL;
    CHECK_OK(dsrt_datastore_open_mix(&mix, NULL, 0, file, NULL, NULL));
    REQUIRE(mix);
    CHECK(strcmp(dsrt_datastore_mix_preset(mix, 0), "imagenet-val") == 0);
    dsrt_augment_options base = dsrt_augment_defaults();
    base.output_height = base.output_width = 8;
    const char *dirs[2] = {dir_a, dir_b}, *presets[2] = {"imagenet-val", NULL};
    uint64_t *want[2], *plain = calloc(64, sizeof *plain);
    size_t first[2] = {0, 0}; /* the mix's ids: its sources' samples in order */
    REQUIRE(plain);
    for (int k = 0; k < 2; k++) {
        dsrt_datastore *src = open_path(dirs[k]);
        if (k == 0) first[1] = dsrt_datastore_count(src);
        REQUIRE(dsrt_datastore_count(src) <= 64);
        want[k] = calloc(64, sizeof *want[k]);
        REQUIRE(want[k]);
        dsrt_augment_options a = with_preset(presets[k], &base);
        hashes_by_path(src, &a, want[k]);
        if (k == 0) hashes_by_path(src, &base, plain);
        dsrt_datastore_close(src);
    }
    dsrt_pipeline_options o = opts(6, 0);
    o.epochs = 1;
    dsrt_pipeline *p = NULL;
    REQUIRE(dsrt_pipeline_open(&p, mix, &base, &o) == 0);
    dsrt_batch *b;
    size_t seen[2] = {0}, same = 0, differ = 0;
    while (dsrt_pipeline_next(p, &b) == 0) {
        for (size_t i = 0; i < b->count; i++) {
            int k = b->sources[i];
            REQUIRE(k == 0 || k == 1);
            size_t j = b->ids[i] - first[k];
            uint64_t h = fnv(FNV0, (const char *)b->data + i * b->sample_stride, b->sample_bytes);
            same += h == want[k][j];
            if (k == 0) differ += h != plain[j];
            seen[k]++;
        }
        CHECK_OK(dsrt_batch_release(p, b));
    }
    dsrt_pipeline_close(p);
    CHECK(seen[0] > 0 && seen[1] > 0);
    CHECK_EQ(same, seen[0] + seen[1]);
    CHECK_EQ(differ, seen[0]);
    fprintf(stderr, "  %zu samples with the preset, %zu with the pipeline's: each as its own\n",
            seen[0], seen[1]);
    free(want[0]), free(want[1]), free(plain);
    dsrt_datastore_close(mix);
}

/* A weights file of n lines of 1, line bad + 1 (from 1) negative. */
static void write_weights(const char *file, int n, int bad) {
    FILE *f = fopen(file, "w");
    REQUIRE(f);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", i == bad ? "-2" : "1");
    fclose(f);
}

static void test_bad_options(void) {
    dsrt_datastore *a = open_path(dir_a), *c = open_path(dir_c), *mix = NULL;
    dsrt_datastore *src[2] = {a, c};
    double w[2] = {1, -1};
    CHECK_EQ(dsrt_datastore_mix(&mix, src, w, 2, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "weight 1 (-1)");
    CHECK_EQ(dsrt_datastore_mix(&mix, src, NULL, 1, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "1 source: a mix needs two or more");
    CHECK(mix == NULL);

    dsrt_augment_options aug = tiny();
    dsrt_pipeline *p = NULL;
    dsrt_pipeline_options o = opts(8, 100);
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "epoch_samples: 100: only with a mix or sample_weights");
    o.sample_weights = "class-balanced";
    o.shuffle = DSRT_SHUFFLE_NEVER;
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "shuffle never");
    o.shuffle = DSRT_SHUFFLE_EVERY_EPOCH;
    char file[4096];
    snprintf(file, sizeof file, "%s/short.txt", base_dir);
    write_weights(file, 29, -1);
    o.sample_weights = file;
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "short.txt: 29 weights for 30 samples");
    write_weights(file, 30, 4);
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "short.txt:5: -2: a weight must be >= 0");
    snprintf(file, sizeof file, "%s/none.txt", base_dir);
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "none.txt");
    double zero[30] = {0};
    o.sample_weights = NULL;
    o.sample_weight_values = zero;
    CHECK_EQ(dsrt_pipeline_open(&p, a, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "every weight is 0");
    /* Weights of the samples of a mix: its own weights choose. */
    src[1] = open_path(dir_b);
    w[1] = 1;
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, NULL));
    o.sample_weight_values = NULL;
    o.sample_weights = "class-balanced";
    CHECK_EQ(dsrt_pipeline_open(&p, mix, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "not with a mix");
    /* A view of the mix without source 1's samples. */
    dsrt_datastore *part = NULL;
    CHECK_OK(dsrt_datastore_partition(mix, 2, 0, &part));
    o.sample_weights = NULL;
    CHECK_EQ(dsrt_pipeline_open(&p, part, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "mix source 1");
    CHECK(p == NULL);
    dsrt_datastore_close(part);
    dsrt_datastore_close(mix);
    /* A weight whose share of the epoch rounds to nothing: refused, saying
     * how many samples an epoch would give it one. */
    w[0] = 0.004;
    w[1] = 0.996;
    CHECK_OK(dsrt_datastore_mix(&mix, src, w, 2, NULL));
    o.epoch_samples = 100;
    CHECK_EQ(dsrt_pipeline_open(&p, mix, &aug, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "mix source 0 (weight 0.004) gets no sample of an epoch of "
                                      "100, and so none ever: give epoch_samples (--epoch-samples) "
                                      "of at least 125");
    o.epoch_samples = 125;
    CHECK_OK(dsrt_pipeline_open(&p, mix, &aug, &o));
    dsrt_pipeline_close(p);
    p = NULL;
    dsrt_datastore_close(src[1]);
    dsrt_datastore_close(mix);
    dsrt_datastore_close(a);
    dsrt_datastore_close(c);
}

int main(void) {
    REQUIRE(timg_tmpdir("sampling", base_dir, sizeof base_dir) == 0);
    snprintf(dir_a, sizeof dir_a, "%s/a", base_dir);
    snprintf(dir_b, sizeof dir_b, "%s/b", base_dir);
    snprintf(dir_c, sizeof dir_c, "%s/c", base_dir);
    static const char *const names_a[] = {"cat", "dog"}, *const names_b[] = {"dog", "eel"},
                             *const names_c[] = {"big", "mid", "rare"};
    static const size_t counts_a[] = {20, 10}, counts_b[] = {5, 15}, counts_c[] = {40, 8, 2};
    make_folder(dir_a, names_a, counts_a, 2, 1);
    make_folder(dir_b, names_b, counts_b, 2, 2);
    make_folder(dir_c, names_c, counts_c, 3, 3);
    RUN(test_labels);
    RUN(test_proportions);
    RUN(test_mix_shuffle_once);
    RUN(test_class_balanced);
    RUN(test_determinism);
    RUN(test_shards);
    RUN(test_open_mix);
    RUN(test_source_presets);
    RUN(test_bad_options);
    return TEST_RESULT();
}
