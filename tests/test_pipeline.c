/*
 * Tests of the pipeline: every batch is checked byte for byte against a
 * reference made on the test's own thread (read, decode at the size the
 * augment options ask, augment with the same key), whatever the thread
 * count, the io back-end, the consumer's pace or a reset in the middle;
 * batches come in order and cover each epoch exactly once; shuffles differ
 * as the option says; bad files (truncated, empty, not an image, gone after
 * the scan) are skipped, counted, named and replaced by the next sample of
 * the order, or stop the run with fail_on_error; slots are reused safely when
 * the consumer holds several; close mid-epoch joins and frees everything; bad
 * options are refused before any thread starts.
 *
 * Images are made on the spot (tests/testimg.h) under $DSRT_TEST_TMP.
 */
#include <dsrt/pipeline.h>
#include <dlfcn.h>
#include <endian.h>
#include <pthread.h>
#include <dirent.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "runtime/pipeline/mix.h"
#include "forced.h"
#include "task.h"
#include "testimg.h"

static char base_dir[4096];

// ----------------------------------------------------------------------------
// Datasets

/* Writes n images into dir/<class>/imgNNN.{jpg,png}: mostly JPEGs of several
 * kinds and sizes (some large enough for DCT scaling), a few PNGs. Labels
 * alternate between `classes` folders in runs, so folder order is file order. */
static void make_folder(const char *dir, size_t n, int classes) {
    REQUIRE(timg_mkdirs(dir) == 0);
    for (size_t i = 0; i < n; i++) {
        int c = (int)(i * classes / n);
        char path[4096];
        snprintf(path, sizeof path, "%s/class%d", dir, c);
        REQUIRE(timg_mkdirs(path) == 0);
        uint32_t h = timg_hash((uint32_t)i + 99);
        int w = 40 + (int)(h % 70), ht = 36 + (int)((h >> 8) % 60);
        if (i % 9 == 4) w = 260, ht = 190; /* decoded at 1/2 or 1/4 scale */
        size_t len = 0;
        uint8_t *buf;
        if (i % 11 == 7) {
            buf = timg_make_png(TIMG_PNG_RGB8, w, ht, (uint32_t)i, &len, NULL);
            snprintf(path, sizeof path, "%s/class%d/img%03zu.png", dir, c, i);
        } else {
            static const int kinds[] = {TIMG_JPEG_420, TIMG_JPEG_444, TIMG_JPEG_GRAY,
                                        TIMG_JPEG_PROGRESSIVE, TIMG_JPEG_422};
            buf = timg_make_jpeg(kinds[i % 5], w, ht, (uint32_t)i, &len);
            snprintf(path, sizeof path, "%s/class%d/img%03zu.jpg", dir, c, i);
        }
        REQUIRE(buf);
        REQUIRE(timg_write_file(path, buf, len) == 0);
        free(buf);
    }
}

/* Path of image i as make_folder names it. */
static void image_path(char *out, size_t cap, const char *dir, size_t i, size_t n, int classes) {
    int c = (int)(i * classes / n);
    snprintf(out, cap, "%s/class%d/img%03zu.%s", dir, c, i, i % 11 == 7 ? "png" : "jpg");
}

static dsrt_datastore *open_folder(const char *dir) {
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, dir, NULL);
    if (rc != 0) fprintf(stderr, "open %s: %s\n", dir, dsrt_last_error());
    REQUIRE(rc == 0);
    return ds;
}

// ----------------------------------------------------------------------------
// Hashes and the reference

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

#define FNV0 0xcbf29ce484222325ULL

/* Hash of a batch's samples, labels and ids. */
static uint64_t batch_hash(const dsrt_batch *b) {
    uint64_t h = FNV0;
    for (size_t i = 0; i < b->count; i++) {
        size_t bytes = b->sample_bytes;
        if (b->shape[2] == 0) { /* native */
            size_t elem = b->layout == DSRT_AUGMENT_F32_NCHW ? 4 : 1;
            bytes = (size_t)b->sizes[2 * i] * b->sizes[2 * i + 1] *
                    (b->layout == DSRT_AUGMENT_F32_NCHW ? b->shape[1] : b->shape[3]) * elem;
        }
        h = fnv(h, (const char *)b->data + i * b->sample_stride, bytes);
    }
    h = fnv(h, b->labels, b->count * sizeof *b->labels);
    return fnv(h, b->ids, b->count * sizeof *b->ids);
}

/* What the test checks of each batch. */
typedef struct {
    uint64_t hash, epoch, index, global;
    size_t count;
    uint32_t ids[64];
} rec;

/* What the test checks of batch b. */
static void rec_fill(rec *r, const dsrt_batch *b) {
    r->hash = batch_hash(b);
    r->epoch = b->epoch;
    r->index = b->index;
    r->global = b->global;
    r->count = b->count;
    memcpy(r->ids, b->ids, DSRT_MIN(b->count, (size_t)64) * sizeof(uint32_t));
}

/* Takes up to max batches (until DSRT_EEOF); returns how many, *end the
 * code that ended it. */
static size_t take(dsrt_pipeline *p, rec *out, size_t max, int *end) {
    size_t k = 0;
    *end = 0;
    while (k < max) {
        dsrt_batch *b;
        int rc = dsrt_pipeline_next(p, &b);
        if (rc != 0) {
            *end = rc;
            break;
        }
        rec_fill(&out[k], b);
        CHECK_OK(dsrt_batch_release(p, b));
        k++;
    }
    return k;
}

static dsrt_pipeline *open_pipe(const dsrt_datastore *ds, const dsrt_augment_options *a,
                                const dsrt_pipeline_options *o) {
    dsrt_pipeline *p = NULL;
    int rc = dsrt_pipeline_open(&p, ds, a, o);
    if (rc != 0) fprintf(stderr, "pipeline_open: %s\n", dsrt_last_error());
    REQUIRE(rc == 0);
    return p;
}

/* The reference: batch (epoch, index) made on this thread with the public
 * read, decode and augment calls. bad[pos] marks samples that must be
 * skipped. Returns the batch's hash and fills ids. */
typedef struct {
    const dsrt_datastore *ds;
    const dsrt_augment_options *a;
    const dsrt_pipeline_options *o;
    const uint8_t *bad;
    int native;
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    uint8_t *sample;
    size_t sample_cap;
} ref_ctx;

static void ref_sample(ref_ctx *r, uint32_t pos, uint64_t epoch, size_t *bytes) {
    const char *path = dsrt_datastore_path(r->ds, pos);
    dsrt_image img;
    int full_w, full_h;
    dsrt_decode_request req = {.channels = r->a->output_channels};
    if (!path) {
        CHECK_OK(dsrt_datastore_read_image(r->ds, pos, r->dec, &req, &img));
        full_w = img.width;
        full_h = img.height;
    } else {
        FILE *f = fopen(path, "rb");
        REQUIRE(f);
        uint8_t *buf = malloc(1 << 20);
        size_t len = fread(buf, 1, 1 << 20, f);
        fclose(f);
        dsrt_image_info info;
        CHECK_OK(dsrt_decoder_info(r->dec, buf, len, &info));
        full_w = info.width;
        full_h = info.height;
        if (!r->native)
            dsrt_augment_decode_size(r->a, full_w, full_h, &req.min_width, &req.min_height);
        CHECK_OK(dsrt_decode(r->dec, buf, len, &req, &img));
        /* img points into the decoder's scratch, not buf */
        free(buf);
    }
    dsrt_augment_options a = *r->a;
    if (r->native) {
        dsrt_augment_options n = dsrt_augment_defaults();
        n.output_channels = a.output_channels;
        n.layout = a.layout;
        n.norm = a.norm;
        memcpy(n.mean, a.mean, sizeof n.mean);
        memcpy(n.std, a.std, sizeof n.std);
        n.output_width = img.width;
        n.output_height = img.height;
        a = n;
    }
    *bytes = dsrt_augment_sample_bytes(&a);
    if (*bytes > r->sample_cap) {
        r->sample = realloc(r->sample, *bytes);
        r->sample_cap = *bytes;
    }
    CHECK_OK(dsrt_augment_apply(r->aug, &a, &img, full_w, full_h, r->o->seed, epoch,
                                dsrt_datastore_id(r->ds, pos), r->sample));
}

static uint64_t ref_batch(ref_ctx *r, uint64_t epoch, uint64_t index, size_t *count,
                          uint32_t *ids) {
    size_t n = dsrt_datastore_count(r->ds), B = r->o->batch;
    uint32_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    if (r->o->shuffle != DSRT_SHUFFLE_NEVER)
        dsrt_shuffle_indices(order, n, r->o->seed,
                             r->o->shuffle == DSRT_SHUFFLE_EVERY_EPOCH ? epoch : 0);
    size_t first = index * B, cnt = DSRT_MIN(B, n - first);
    uint64_t h = FNV0;
    int32_t labels[64];
    for (size_t j = 0; j < cnt; j++) {
        size_t k = 0;
        while (r->bad && r->bad[order[(first + j + k) % n]]) k++;
        uint32_t pos = order[(first + j + k) % n];
        size_t bytes;
        ref_sample(r, pos, epoch, &bytes);
        h = fnv(h, r->sample, bytes);
        labels[j] = dsrt_datastore_label(r->ds, pos);
        ids[j] = dsrt_datastore_id(r->ds, pos);
    }
    h = fnv(h, labels, cnt * sizeof *labels);
    h = fnv(h, ids, cnt * sizeof *ids);
    *count = cnt;
    free(order);
    return h;
}

static ref_ctx ref_open(const dsrt_datastore *ds, const dsrt_augment_options *a,
                        const dsrt_pipeline_options *o, const uint8_t *bad) {
    ref_ctx r = {.ds = ds, .a = a, .o = o, .bad = bad, .native = o->native};
    REQUIRE(dsrt_decoder_create(&r.dec, NULL) == 0);
    REQUIRE(dsrt_augmenter_create(&r.aug) == 0);
    return r;
}

static void ref_close(ref_ctx *r) {
    dsrt_decoder_destroy(r->dec);
    dsrt_augmenter_destroy(r->aug);
    free(r->sample);
}

/* Checks recs against the reference, batch by batch. */
static void check_against_ref(ref_ctx *r, const rec *recs, size_t k) {
    int bad = 0;
    for (size_t i = 0; i < k; i++) {
        size_t cnt;
        uint32_t ids[64];
        uint64_t h = ref_batch(r, recs[i].epoch, recs[i].index, &cnt, ids);
        if (h != recs[i].hash || cnt != recs[i].count) {
            if (bad++ < 3)
                fprintf(stderr,
                        "batch %zu (epoch %llu index %llu): hash %016llx, expected %016llx\n", i,
                        (unsigned long long)recs[i].epoch, (unsigned long long)recs[i].index,
                        (unsigned long long)recs[i].hash, (unsigned long long)h);
        }
    }
    CHECK_EQ(bad, 0);
}

// ----------------------------------------------------------------------------
// Tests

static char good_dir[4096];
#define GOOD_N 90

static dsrt_pipeline_options small_options(void) {
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.batch = 16;
    o.prefetch = 2;
    o.epochs = 2;
    o.seed = 7;
    o.chunk = 5;
    return o;
}

/* The same bytes with 1, 2 and 4 workers, io_uring and pread, and the
 * reference's bytes. */
static void test_determinism(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    rec first[16], got[16];
    size_t k0 = 0;
    const unsigned threads[] = {1, 2, 4};
    const dsrt_io ios[] = {DSRT_IO_AUTO, DSRT_IO_PREAD};
    for (int t = 0; t < 3; t++) {
        for (int io = 0; io < 2; io++) {
            o.threads = threads[t];
            o.reader.io = ios[io];
            o.reader.depth = io ? 3 : 16;
            dsrt_pipeline *p = open_pipe(ds, &a, &o);
            int end;
            size_t k = take(p, got, 16, &end);
            CHECK_EQ(end, DSRT_EEOF);
            CHECK_EQ(k, 12); /* 2 epochs of ceil(90 / 16) */
            dsrt_pipeline_statistics s;
            dsrt_pipeline_stats(p, &s);
            CHECK_EQ(s.samples, 2 * GOOD_N);
            CHECK_EQ(s.threads, threads[t]);
            CHECK_EQ(s.skipped, 0);
            CHECK_EQ(s.batches, 12);
            CHECK(ios[io] == DSRT_IO_PREAD ? s.io == DSRT_IO_PREAD : s.io != DSRT_IO_AUTO);
            dsrt_pipeline_close(p);
            if (t == 0 && io == 0) {
                memcpy(first, got, sizeof got);
                k0 = k;
                continue;
            }
            for (size_t i = 0; i < k && i < k0; i++) CHECK_EQ(got[i].hash, first[i].hash);
        }
    }
    ref_ctx r = ref_open(ds, &a, &o, NULL);
    check_against_ref(&r, first, k0);
    ref_close(&r);

    /* Another shape: shorter side, random crop, both flips, uint8 NHWC,
     * one channel, chunks that do not divide the batch. */
    dsrt_augment_options b = dsrt_augment_defaults();
    b.output_height = 30;
    b.output_width = 34;
    b.resize_shorter = 40;
    b.size_mode = DSRT_AUGMENT_RANDCROP;
    b.rand_x_reflection = b.rand_y_reflection = 1;
    b.layout = DSRT_AUGMENT_U8_NHWC;
    b.norm = DSRT_AUGMENT_NORM_NONE;
    b.output_channels = 1;
    o = small_options();
    o.batch = 13;
    o.chunk = 4;
    o.epochs = 1;
    o.threads = 3;
    dsrt_pipeline *p = open_pipe(ds, &b, &o);
    int end;
    size_t k = take(p, got, 16, &end);
    CHECK_EQ(k, 7);
    CHECK_EQ(got[6].count, GOOD_N - 6 * 13);
    dsrt_pipeline_close(p);
    r = ref_open(ds, &b, &o, NULL);
    check_against_ref(&r, got, k);
    ref_close(&r);
    dsrt_datastore_close(ds);
}

static int is_permutation_epoch(const rec *r, size_t k, uint64_t epoch, size_t n) {
    uint8_t *seen = calloc(n, 1);
    size_t total = 0;
    int ok = 1;
    for (size_t i = 0; i < k; i++) {
        if (r[i].epoch != epoch) continue;
        for (size_t j = 0; j < r[i].count; j++) {
            if (r[i].ids[j] >= n || seen[r[i].ids[j]])
                ok = 0;
            else
                seen[r[i].ids[j]] = 1;
            total++;
        }
    }
    free(seen);
    return ok && total == n;
}

/* Order of the ids delivered in an epoch, as one hash. */
static uint64_t epoch_order(const rec *r, size_t k, uint64_t epoch) {
    uint64_t h = FNV0;
    for (size_t i = 0; i < k; i++)
        if (r[i].epoch == epoch) h = fnv(h, r[i].ids, r[i].count * sizeof(uint32_t));
    return h;
}

/* Batches in order, each epoch exactly once, shuffles as asked. */
static void test_ordering(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    rec r[32];
    uint64_t ident = FNV0;
    for (uint32_t i = 0; i < GOOD_N; i++) ident = fnv(ident, &i, sizeof i);
    for (int sh = 0; sh < 3; sh++) {
        dsrt_pipeline_options o = small_options();
        o.batch = 32;
        o.epochs = 3;
        o.threads = 2;
        o.shuffle = (dsrt_shuffle)sh;
        dsrt_pipeline *p = open_pipe(ds, &a, &o);
        CHECK_EQ(dsrt_pipeline_batches_per_epoch(p), 3);
        int end;
        size_t k = take(p, r, 32, &end);
        CHECK_EQ(k, 9);
        CHECK_EQ(end, DSRT_EEOF);
        for (size_t i = 0; i < k; i++) {
            CHECK_EQ(r[i].global, i);
            CHECK_EQ(r[i].epoch, i / 3);
            CHECK_EQ(r[i].index, i % 3);
            CHECK_EQ(r[i].count, i % 3 == 2 ? GOOD_N - 64 : 32);
        }
        for (uint64_t e = 0; e < 3; e++) CHECK(is_permutation_epoch(r, k, e, GOOD_N));
        uint64_t e0 = epoch_order(r, k, 0), e1 = epoch_order(r, k, 1), e2 = epoch_order(r, k, 2);
        if (sh == DSRT_SHUFFLE_NEVER) {
            CHECK(e0 == ident && e1 == ident && e2 == ident);
        } else if (sh == DSRT_SHUFFLE_ONCE) {
            CHECK(e0 != ident && e0 == e1 && e1 == e2);
        } else {
            CHECK(e0 != ident && e0 != e1 && e1 != e2 && e0 != e2);
        }
        /* Augmentation differs between epochs even when the order does not. */
        if (sh != DSRT_SHUFFLE_EVERY_EPOCH) CHECK(r[0].hash != r[3].hash);
        /* Nothing after the end, again. */
        dsrt_batch *b;
        CHECK_EQ(dsrt_pipeline_next(p, &b), DSRT_EEOF);
        dsrt_pipeline_close(p);
    }
    dsrt_datastore_close(ds);
}

static void test_drop_last(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.drop_last = 1;
    o.shuffle = DSRT_SHUFFLE_NEVER;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    CHECK_EQ(dsrt_pipeline_batches_per_epoch(p), 5);
    rec r[16];
    int end;
    size_t k = take(p, r, 16, &end);
    CHECK_EQ(k, 10);
    for (size_t i = 0; i < k; i++) CHECK_EQ(r[i].count, 16);
    CHECK_EQ(r[5].ids[0], 0); /* epoch 1 starts over: samples 80..89 never appear */
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < r[i].count; j++) CHECK_LT(r[i].ids[j], 80);
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A slow consumer, a fast one, and several batches held at once: slots are
 * reused only once released, and what is held never changes. */
static void test_slots(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.threads = 2;
    o.epochs = 1;
    ref_ctx r = ref_open(ds, &a, &o, NULL);

    /* Slow: the workers fill every slot and wait. */
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    rec got[8];
    size_t k = 0;
    dsrt_batch *b;
    dsrt_pipeline_statistics s;
    /* Once the 3 slots are full, the workers can only wait for one. */
    forced_others_asleep();
    dsrt_pipeline_stats(p, &s);
    CHECK_EQ(s.samples, 3 * 16);
    while (dsrt_pipeline_next(p, &b) == 0) {
        sleep_ms(15);
        rec_fill(&got[k++], b);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    CHECK_EQ(k, 6);
    check_against_ref(&r, got, k);
    dsrt_pipeline_stats(p, &s);
    CHECK(s.slot_wait_s > 0); /* the wait for batch 0's slot, at least */
    dsrt_pipeline_close(p);

    /* Holding: prefetch 2 means 3 slots. */
    p = open_pipe(ds, &a, &o);
    dsrt_batch *held[3];
    uint64_t h[3];
    for (int i = 0; i < 3; i++) {
        CHECK_OK(dsrt_pipeline_next(p, &held[i]));
        h[i] = batch_hash(held[i]);
        CHECK_EQ(held[i]->index, i);
    }
    CHECK_EQ(dsrt_pipeline_next(p, &b), -EDEADLK);
    sleep_ms(50);
    for (int i = 0; i < 3; i++) CHECK_EQ(batch_hash(held[i]), h[i]);
    /* Batch 3 needs batch 0's slot: releasing batch 1 is not enough. */
    CHECK_OK(dsrt_batch_release(p, held[1]));
    CHECK_EQ(dsrt_batch_release(p, held[1]), DSRT_EOPTION);
    CHECK_EQ(dsrt_pipeline_next(p, &b), -EDEADLK);
    CHECK_OK(dsrt_batch_release(p, held[0]));
    CHECK_OK(dsrt_pipeline_next(p, &b)); /* batch 3 */
    CHECK_EQ(b->index, 3);
    CHECK_EQ(batch_hash(held[2]), h[2]);
    got[0].hash = batch_hash(b);
    got[0].epoch = 0;
    got[0].index = 3;
    got[0].count = b->count;
    got[1].hash = h[2];
    got[1].epoch = 0;
    got[1].index = 2;
    got[1].count = held[2]->count;
    check_against_ref(&r, got, 2);
    CHECK_OK(dsrt_batch_release(p, b));
    CHECK_OK(dsrt_batch_release(p, held[2]));
    CHECK_OK(dsrt_pipeline_next(p, &b));
    CHECK_EQ(b->index, 4);
    dsrt_batch fake = *b;
    CHECK_EQ(dsrt_batch_release(p, &fake), DSRT_EOPTION);
    CHECK_OK(dsrt_batch_release(p, b));
    dsrt_pipeline_close(p);
    ref_close(&r);
    dsrt_datastore_close(ds);
}

/* dsrt_pipeline_next_timed: -ETIMEDOUT while the batch is not ready (a file
 * of batch 0 held back), after waiting as long as asked, and nothing lost:
 * the batches taken with timeouts are those of the reference. */
static void test_next_timed(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_227(&a);
    dsrt_pipeline_options o = small_options();
    o.threads = 1;
    o.epochs = 1;
    o.shuffle = DSRT_SHUFFLE_NEVER; /* batch 0 holds sample 0 */
    ref_ctx r = ref_open(ds, &a, &o, NULL);
    int held = forced_hold(dsrt_datastore_path(ds, 0));
    if (held < 0) fprintf(stderr, "lease on %s: %s\n", dsrt_datastore_path(ds, 0), strerror(errno));
    REQUIRE(held >= 0);
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    dsrt_batch *b = (dsrt_batch *)&o;
    CHECK_EQ(dsrt_pipeline_next_timed(p, &b, 0), -ETIMEDOUT);
    CHECK(b == NULL);
    CHECK(strstr(dsrt_last_error(), "batch 0 is not ready") != NULL);
    double t0 = now_s();
    CHECK_EQ(dsrt_pipeline_next_timed(p, &b, 2), -ETIMEDOUT);
    CHECK(now_s() - t0 >= 0.002); /* a lower bound the wait itself guarantees */
    forced_let_go(held);
    /* Then every batch arrives, in order, whatever the waits. */
    CHECK_OK(dsrt_pipeline_reset(p, 0, 0));
    rec got[8];
    size_t k = 0;
    int rc;
    while ((rc = dsrt_pipeline_next_timed(p, &b, 1)) != DSRT_EEOF) {
        if (rc == -ETIMEDOUT) continue;
        CHECK_OK(rc);
        if (rc != 0 || k == 8) break;
        rec_fill(&got[k++], b);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    CHECK_EQ(k, 6);
    check_against_ref(&r, got, k);
    /* Negative: waits for ever, as dsrt_pipeline_next; the end stays the end. */
    CHECK_EQ(dsrt_pipeline_next_timed(p, &b, -1), DSRT_EEOF);
    CHECK_OK(dsrt_pipeline_reset(p, 0, 5));
    CHECK_OK(dsrt_pipeline_next_timed(p, &b, -1));
    CHECK_EQ(b->index, 5);
    CHECK_OK(dsrt_batch_release(p, b));
    dsrt_pipeline_close(p);
    /* Holding every slot is refused at once, not waited on. */
    o.epochs = 0;
    p = open_pipe(ds, &a, &o);
    dsrt_batch *lent[3];
    for (int i = 0; i < 3; i++) CHECK_OK(dsrt_pipeline_next_timed(p, &lent[i], -1));
    dsrt_pipeline_statistics s0, s1;
    dsrt_pipeline_stats(p, &s0);
    CHECK_EQ(dsrt_pipeline_next_timed(p, &b, 5000), -EDEADLK);
    dsrt_pipeline_stats(p, &s1);
    CHECK(s1.consumer_wait_s == s0.consumer_wait_s); /* not a moment's wait */
    dsrt_pipeline_close(p);
    ref_close(&r);
    dsrt_datastore_close(ds);
}

/* Reset to (epoch, batch) gives the batches of an uninterrupted run. */
static void test_reset(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.epochs = 3;
    o.threads = 2;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    rec all[32], r[32];
    int end;
    size_t k = take(p, all, 32, &end);
    CHECK_EQ(k, 18);
    dsrt_pipeline_close(p);

    p = open_pipe(ds, &a, &o);
    size_t k2 = take(p, r, 4, &end);
    CHECK_EQ(k2, 4);
    dsrt_batch *held;
    CHECK_OK(dsrt_pipeline_next(p, &held)); /* lent across the reset: taken back */
    CHECK_OK(dsrt_pipeline_reset(p, 1, 2));
    k2 = take(p, r, 32, &end);
    CHECK_EQ(end, DSRT_EEOF);
    CHECK_EQ(k2, 18 - 8);
    for (size_t i = 0; i < k2; i++) {
        CHECK_EQ(r[i].global, 8 + i);
        CHECK_EQ(r[i].hash, all[8 + i].hash);
    }
    /* Back to the start after the end; then a reset mid-flight. */
    CHECK_OK(dsrt_pipeline_reset(p, 0, 0));
    k2 = take(p, r, 2, &end);
    CHECK_EQ(r[0].hash, all[0].hash);
    CHECK_EQ(r[1].hash, all[1].hash);
    CHECK_OK(dsrt_pipeline_reset(p, 2, 5));
    k2 = take(p, r, 32, &end);
    CHECK_EQ(k2, 1);
    CHECK_EQ(r[0].hash, all[17].hash);
    CHECK_OK(dsrt_pipeline_reset(p, 3, 0)); /* exactly the end: nothing left */
    CHECK_EQ(dsrt_pipeline_next(p, &held), DSRT_EEOF);
    CHECK_EQ(dsrt_pipeline_reset(p, 3, 1), DSRT_EOPTION);
    CHECK_EQ(dsrt_pipeline_reset(p, 0, 6), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "reset");
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
}

/* Close at any moment: nothing leaks (ASan), nothing races (TSan). */
static void test_close_mid_epoch(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    for (int i = 0; i < 6; i++) {
        dsrt_pipeline_options o = small_options();
        o.epochs = 0; /* endless */
        o.threads = 1 + i % 3;
        o.prefetch = 1 + i % 2;
        dsrt_pipeline *p = open_pipe(ds, &a, &o);
        dsrt_batch *b;
        for (int j = 0; j < i; j++) {
            CHECK_OK(dsrt_pipeline_next(p, &b));
            if (j + 1 < i) CHECK_OK(dsrt_batch_release(p, b)); /* the last one stays lent */
        }
        if (i == 5) sleep_ms(20);
        dsrt_pipeline_close(p);
    }
    dsrt_pipeline_close(NULL);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Bad files

#define BAD_N 64
static const size_t bad_at[] = {5, 17, 18, 40, 63}; /* 17, 18 in a row; 63 wraps to 0 */

static void test_bad_files(void) {
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/bad", base_dir);
    make_folder(dir, BAD_N, 2);
    /* 5: truncated JPEG; 17: empty; 18: text; 40: vanishes after the scan;
     * 63: corrupt PNG... or JPEG, whichever it is. */
    image_path(path, sizeof path, dir, 5, BAD_N, 2);
    {
        FILE *f = fopen(path, "rb");
        uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        REQUIRE(timg_write_file(path, buf, len / 2) == 0);
    }
    image_path(path, sizeof path, dir, 17, BAD_N, 2);
    REQUIRE(timg_write_file(path, "", 0) == 0);
    image_path(path, sizeof path, dir, 18, BAD_N, 2);
    REQUIRE(timg_write_file(path, "hello, not an image\n", 20) == 0);
    image_path(path, sizeof path, dir, 63, BAD_N, 2);
    {
        uint8_t junk[300];
        timg_noise(junk, sizeof junk, 5);
        junk[0] = 0xff, junk[1] = 0xd8, junk[2] = 0xff; /* looks like a JPEG */
        REQUIRE(timg_write_file(path, junk, sizeof junk) == 0);
    }
    dsrt_datastore *ds = open_folder(dir);
    REQUIRE(dsrt_datastore_count(ds) == BAD_N);
    image_path(path, sizeof path, dir, 40, BAD_N, 2);
    REQUIRE(unlink(path) == 0);

    uint8_t bad[BAD_N] = {0};
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(bad_at); i++) bad[bad_at[i]] = 1;

    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.batch = 8;
    o.chunk = 3;
    o.shuffle = DSRT_SHUFFLE_NEVER;
    rec first[32];
    size_t k0 = 0;
    for (unsigned t = 1; t <= 3; t += 2) {
        o.threads = t;
        dsrt_pipeline *p = open_pipe(ds, &a, &o);
        rec r[32];
        int end;
        size_t k = take(p, r, 32, &end);
        CHECK_EQ(end, DSRT_EEOF);
        CHECK_EQ(k, 16);
        int bad_seen = 0;
        for (size_t i = 0; i < k; i++) {
            CHECK_EQ(r[i].count, 8);
            for (size_t j = 0; j < r[i].count; j++) bad_seen += bad[r[i].ids[j]];
        }
        CHECK_EQ(bad_seen, 0);
        /* Filled places: 5 <- 6, 17 and 18 <- 19, 40 <- 41, 63 <- 0. */
        CHECK_EQ(r[0].ids[5], 6);
        CHECK_EQ(r[2].ids[1], 19);
        CHECK_EQ(r[2].ids[2], 19);
        CHECK_EQ(r[5].ids[0], 41);
        CHECK_EQ(r[7].ids[7], 0);
        dsrt_pipeline_statistics s;
        dsrt_pipeline_stats(p, &s);
        CHECK_EQ(s.bad_samples, 5);
        /* Per epoch: 5, 17, 18 (place 17), 18 (place 18), 40, 63. */
        CHECK_EQ(s.skipped, 12);
        CHECK_EQ(s.samples, 2 * BAD_N);
        CHECK_EQ(s.bad_message_count, 5);
        for (size_t i = 0; i < DSRT_ARRAY_SIZE(bad_at); i++) {
            image_path(path, sizeof path, dir, bad_at[i], BAD_N, 2);
            int named = 0;
            for (unsigned m = 0; m < s.bad_message_count; m++)
                named += strncmp(s.bad_messages[m], path, strlen(path)) == 0;
            CHECK_EQ(named, 1);
        }
        for (unsigned m = 0; m < s.bad_message_count; m++) {
            if (strstr(s.bad_messages[m], "img017") || strstr(s.bad_messages[m], "img040"))
                CHECK_CONTAINS(s.bad_messages[m], ": read: ");
            else
                CHECK_CONTAINS(s.bad_messages[m], ": decode: ");
        }
        dsrt_pipeline_close(p);
        if (t == 1) {
            memcpy(first, r, sizeof r);
            k0 = k;
        } else {
            for (size_t i = 0; i < k; i++) CHECK_EQ(r[i].hash, first[i].hash);
        }
    }
    ref_ctx rc = ref_open(ds, &a, &o, bad);
    check_against_ref(&rc, first, k0);
    ref_close(&rc);

    /* fail_on_error: batches 0 (positions 0..7) holds the truncated file. */
    o.fail_on_error = 1;
    o.threads = 2;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    dsrt_batch *b;
    int code = dsrt_pipeline_next(p, &b);
    CHECK(code < 0 && code != DSRT_EEOF && code != DSRT_ESKIPPED);
    image_path(path, sizeof path, dir, 5, BAD_N, 2);
    CHECK_CONTAINS(dsrt_last_error(), path);
    CHECK_EQ(dsrt_pipeline_next(p, &b), code); /* it stays failed */
    /* Resume past it: the next failure is the empty file in batch 2. */
    CHECK_OK(dsrt_pipeline_reset(p, 0, 1));
    CHECK_OK(dsrt_pipeline_next(p, &b));
    CHECK_OK(dsrt_batch_release(p, b));
    code = dsrt_pipeline_next(p, &b);
    CHECK_EQ(code, DSRT_EEMPTY);
    image_path(path, sizeof path, dir, 17, BAD_N, 2);
    CHECK_CONTAINS(dsrt_last_error(), path);
    dsrt_pipeline_close(p);

    /* Every sample bad: give up instead of spinning, saying why. */
    dsrt_datastore *sub = NULL;
    uint32_t only_bad[] = {5, 17, 18, 40, 63, 5, 17};
    CHECK_OK(dsrt_datastore_subset(ds, only_bad, 7, &sub));
    o.fail_on_error = 0;
    o.batch = 4;
    p = open_pipe(sub, &a, &o);
    CHECK_EQ(dsrt_pipeline_next(p, &b), DSRT_ESKIPPED);
    CHECK_CONTAINS(dsrt_last_error(), "the last: ");
    CHECK_CONTAINS(dsrt_last_error(), dir);
    dsrt_pipeline_close(p);

    /* drop_bad: no replacement; every good sample once an epoch, the bad
     * ones listed with their reasons. */
    o.batch = 8;
    o.drop_bad = 1;
    o.shuffle = DSRT_SHUFFLE_EVERY_EPOCH;
    for (unsigned t = 1; t <= 3; t += 2) {
        o.threads = t;
        p = open_pipe(ds, &a, &o);
        uint8_t seen[2][BAD_N] = {{0}};
        size_t total = 0;
        for (;;) {
            int rc = dsrt_pipeline_next(p, &b);
            if (rc == DSRT_EEOF) break;
            CHECK_OK(rc);
            if (rc) break;
            CHECK_LE(b->count, 8);
            CHECK_EQ(b->shape[0], (int)b->count);
            for (size_t j = 0; j < b->count; j++) {
                CHECK_EQ(bad[b->ids[j]], 0);
                CHECK_EQ(b->labels[j], dsrt_datastore_label(ds, b->ids[j]));
                seen[b->epoch][b->ids[j]]++;
            }
            total += b->count;
            CHECK_OK(dsrt_batch_release(p, b));
        }
        CHECK_EQ(total, 2 * (BAD_N - DSRT_ARRAY_SIZE(bad_at)));
        for (int e = 0; e < 2; e++)
            for (size_t i = 0; i < BAD_N; i++) CHECK_EQ(seen[e][i], bad[i] ? 0 : 1);
        dsrt_pipeline_statistics st;
        dsrt_pipeline_stats(p, &st);
        CHECK_EQ(st.bad_samples, DSRT_ARRAY_SIZE(bad_at));
        CHECK_EQ(st.skipped, 2 * DSRT_ARRAY_SIZE(bad_at));
        dsrt_bad_sample list[8];
        size_t nb = dsrt_pipeline_bad_samples(p, 0, list, 8);
        CHECK_EQ(nb, DSRT_ARRAY_SIZE(bad_at));
        for (size_t i = 0; i < DSRT_MIN(nb, (size_t)8); i++) {
            CHECK(list[i].path != NULL);
            CHECK_EQ(bad[list[i].id], 1);
            CHECK_STR_EQ(list[i].path, dsrt_datastore_path(ds, list[i].id));
            if (list[i].id == 17) {
                CHECK_EQ(list[i].code, DSRT_EEMPTY);
                CHECK_STR_EQ(list[i].error, "read: empty file");
            }
            if (list[i].id == 40) {
                CHECK_EQ(list[i].code, -ENOENT);
                CHECK_CONTAINS(list[i].error, "read: ");
            }
            if (list[i].id == 5) CHECK_CONTAINS(list[i].error, "decode: ");
        }
        /* From an offset, and the count alone. */
        CHECK_EQ(dsrt_pipeline_bad_samples(p, 3, list, 8), nb);
        CHECK_EQ(dsrt_pipeline_bad_samples(p, 0, NULL, 0), nb);
        dsrt_pipeline_close(p);
    }
    o.drop_bad = 0;
    o.batch = 4;
    o.threads = 3;
    o.max_consecutive_bad = 2;
    o.shuffle = DSRT_SHUFFLE_NEVER;
    p = open_pipe(ds, &a, &o); /* 17, 18 in a row is 2: batch 4 fails */
    int end;
    rec r[8];
    CHECK_EQ(take(p, r, 8, &end), 4);
    CHECK_EQ(end, DSRT_ESKIPPED);
    dsrt_pipeline_close(p);
    dsrt_datastore_close(sub);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// In-memory samples and native size

static void write_idx(const char *dir, size_t n, int h, int w) {
    size_t bytes = 16 + n * (size_t)h * w;
    uint8_t *img = malloc(bytes), lab[8 + 256];
    uint32_t hdr[4] = {htobe32(0x803), htobe32((uint32_t)n), htobe32((uint32_t)h),
                       htobe32((uint32_t)w)};
    memcpy(img, hdr, 16);
    timg_noise(img + 16, n * (size_t)h * w, 3);
    uint32_t lh[2] = {htobe32(0x801), htobe32((uint32_t)n)};
    memcpy(lab, lh, 8);
    for (size_t i = 0; i < n; i++) lab[8 + i] = (uint8_t)(i % 10);
    char p[4096];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
    REQUIRE(timg_write_file(p, img, bytes) == 0);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir);
    REQUIRE(timg_write_file(p, lab, 8 + n) == 0);
    free(img);
}

static void test_memory_source(void) {
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/idx", base_dir);
    REQUIRE(timg_mkdirs(dir) == 0);
    write_idx(dir, 50, 28, 28);
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
    dsrt_datastore *ds = open_folder(path);
    REQUIRE(dsrt_datastore_count(ds) == 50);
    dsrt_augment_options a = dsrt_augment_defaults();
    a.output_height = a.output_width = 28;
    a.output_channels = 1;
    a.rand_x_translation[0] = a.rand_y_translation[0] = -3;
    a.rand_x_translation[1] = a.rand_y_translation[1] = 3;
    a.rand_rotation[0] = -10;
    a.rand_rotation[1] = 10;
    dsrt_pipeline_options o = small_options();
    rec r1[16], r3[16];
    int end;
    o.threads = 1;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    size_t k1 = take(p, r1, 16, &end);
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    CHECK_EQ(s.bytes_read, 0);
    dsrt_pipeline_close(p);
    o.threads = 3;
    p = open_pipe(ds, &a, &o);
    size_t k3 = take(p, r3, 16, &end);
    dsrt_pipeline_close(p);
    CHECK_EQ(k1, 8);
    CHECK_EQ(k3, 8);
    for (size_t i = 0; i < k1; i++) CHECK_EQ(r1[i].hash, r3[i].hash);
    ref_ctx r = ref_open(ds, &a, &o, NULL);
    check_against_ref(&r, r1, k1);
    ref_close(&r);
    dsrt_datastore_close(ds);
}

/* Native size: each sample as decoded, float CHW in [0, 1]. */
static void test_native(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_pipeline_options o = small_options();
    o.native = 1;
    o.native_max_pixels = 300 * 200;
    o.batch = 3;
    o.epochs = 1;
    o.threads = 2;
    dsrt_augment_options a = dsrt_augment_defaults();
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    rec r[32];
    int end;
    dsrt_batch *b;
    CHECK_OK(dsrt_pipeline_next(p, &b));
    CHECK_EQ(b->shape[1], 3);
    CHECK_EQ(b->shape[2], 0);
    CHECK_EQ(b->sample_stride, (size_t)300 * 200 * 3 * 4);
    /* Sample 0 against the decoder: value / 255. */
    dsrt_decoder *dec;
    REQUIRE(dsrt_decoder_create(&dec, NULL) == 0);
    dsrt_image img;
    dsrt_decode_request req = {.channels = 3};
    CHECK_OK(dsrt_datastore_read_image(ds, b->ids[0], dec, &req, &img));
    CHECK_EQ(b->sizes[0], img.height);
    CHECK_EQ(b->sizes[1], img.width);
    const float *f = b->data;
    double worst = 0;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < img.height; y++)
            for (int x = 0; x < img.width; x++) {
                double want = img.data[(size_t)y * img.stride + (size_t)x * 3 + c] / 255.0;
                double got = f[((size_t)c * img.height + y) * img.width + x];
                worst = fmax(worst, fabs(got - want));
            }
    CHECK_NEAR(worst, 0, 1e-6);
    dsrt_decoder_destroy(dec);
    CHECK_OK(dsrt_batch_release(p, b));
    size_t k = take(p, r, 32, &end);
    CHECK_EQ(k, 29);
    dsrt_pipeline_close(p);

    /* Too large for the places: skipped, the rest goes on. */
    o.native_max_pixels = 120 * 100;
    p = open_pipe(ds, &a, &o);
    k = take(p, r, 32, &end);
    CHECK_EQ(k, 30);
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    CHECK_EQ(s.bad_samples, 10); /* the 260 x 190 ones */
    CHECK(s.bad_message_count > 0 && strstr(s.bad_messages[0], "native_max_pixels"));
    ref_ctx rc = ref_open(ds, &a, &o, NULL);
    uint8_t bad[GOOD_N] = {0};
    for (size_t i = 4; i < GOOD_N; i += 9) bad[i] = 1;
    rc.bad = bad;
    check_against_ref(&rc, r, k);
    ref_close(&rc);
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Options

static void expect_option(const dsrt_datastore *ds, const dsrt_augment_options *a,
                          const dsrt_pipeline_options *o, const char *name) {
    dsrt_pipeline *p = (dsrt_pipeline *)1;
    int rc = dsrt_pipeline_open(&p, ds, a, o);
    CHECK_EQ(rc, DSRT_EOPTION);
    CHECK(p == NULL);
    CHECK_CONTAINS(dsrt_last_error(), name);
    if (rc == 0) dsrt_pipeline_close(p);
}

static void test_bad_options(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o;
#define BAD(field, value, name)                                                                    \
    o = small_options();                                                                           \
    o.field = value;                                                                               \
    expect_option(ds, &a, &o, name)
    BAD(batch, 0, "batch");
    BAD(prefetch, 0, "prefetch");
    BAD(prefetch, 5000, "prefetch");
    BAD(threads, 100000, "threads");
    BAD(cpus, "abc", "cpus");
    BAD(cpus, "", "cpus");
    BAD(cpus, "0-3;8", "cpus");
    BAD(cpus, "4000", "cpus");
    BAD(pin, 2, "pin");
    BAD(drop_last, 3, "drop_last");
    BAD(shuffle, (dsrt_shuffle)9, "shuffle");
    BAD(fail_on_error, -1, "fail_on_error");
    BAD(max_consecutive_bad, 0, "max_consecutive_bad");
    BAD(max_file_bytes, 0, "max_file_bytes");
    BAD(chunk, 100000, "chunk");
    BAD(native, 2, "native");
    BAD(gpu, -5, "gpu");
    BAD(reader.depth, 0, "depth");
    BAD(reader.io, (dsrt_io)7, "io");
    BAD(decoder.max_pixels, 0, "max_pixels");
    o = small_options();
    o.drop_last = 1;
    o.batch = 1000;
    expect_option(ds, &a, &o, "drop_last");
#undef BAD
    dsrt_augment_options bad_a = a;
    bad_a.output_channels = 2;
    o = small_options();
    expect_option(ds, &bad_a, &o, "output_channels");
    dsrt_pipeline *p = NULL;
    CHECK_EQ(dsrt_pipeline_open(&p, NULL, &a, &o), DSRT_EOPTION);

    /* Good ones: a CPU list (the first CPU this process may use), no
     * pinning, the defaults. */
    o = small_options();
    p = open_pipe(ds, &a, &o);
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    char first[16];
    snprintf(first, sizeof first, "%ld", strtol(s.cpus, NULL, 10));
    dsrt_pipeline_close(p);
    o.cpus = first;
    o.threads = 2;
    p = open_pipe(ds, &a, &o);
    dsrt_pipeline_stats(p, &s);
    CHECK_STR_EQ(s.cpus, first);
    CHECK_EQ(s.threads, 2);
    dsrt_pipeline_close(p);
    o.cpus = NULL;
    o.threads = 0;
    o.pin = 0;
    p = open_pipe(ds, &a, &o);
    dsrt_pipeline_stats(p, &s);
    CHECK_GE(s.threads, 1);
    CHECK_EQ(s.pinned_threads, 0);
    CHECK_EQ(s.slots, 3);
    CHECK_EQ(s.slot_bytes, (16 * 32 * 32 * 3 * 4 + 4095) / 4096 * 4096);
    dsrt_pipeline_close(p);
    o = dsrt_pipeline_defaults();
    o.prefetch = 1;
    p = open_pipe(ds, NULL, &o);
    dsrt_batch *b;
    CHECK_OK(dsrt_pipeline_next(p, &b));
    CHECK_EQ(b->count, GOOD_N); /* batch 128 > 90 samples */
    CHECK_EQ(b->shape[2], 224);
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Limits of the process

/* The lowest descriptor number not in use, and the highest in use. */
static void fd_span(int *lowest_free, int *highest) {
    uint8_t used[4096] = {0};
    DIR *d = opendir("/proc/self/fd");
    REQUIRE(d);
    struct dirent *e;
    int top = 0;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd < 0 || fd >= 4096 || fd == dirfd(d)) continue;
        used[fd] = 1;
        top = DSRT_MAX(top, fd);
    }
    closedir(d);
    int low = 0;
    while (low < 4096 && used[low]) low++;
    *lowest_free = low;
    *highest = top;
}

/* Too many open files is the process's limit, not the files' fault: with a
 * few descriptors left the reads wait for each other and every sample comes
 * as without the limit; with none left the run fails with the reason after
 * a few seconds, and no sample is marked bad. */
static void test_open_files_limit(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.threads = 2;
    o.reader.depth = 16;
    o.chunk = 8;
    rec want[16], got[16];
    int end;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    size_t k = take(p, want, 16, &end);
    CHECK_EQ(end, DSRT_EEOF);
    dsrt_pipeline_close(p);

    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
    /* Parked at the end (nothing to make) while the limit is set, then
     * started from the beginning under it. */
    p = open_pipe(ds, &a, &o);
    CHECK_OK(dsrt_pipeline_reset(p, o.epochs, 0));
    int low, high;
    fd_span(&low, &high);
    /* Three descriptors for 2 x 8 reads in flight. */
    struct rlimit lim = old;
    lim.rlim_cur = (rlim_t)high + 4;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    CHECK_OK(dsrt_pipeline_reset(p, 0, 0));
    size_t k2 = take(p, got, 16, &end);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK_EQ(end, DSRT_EEOF);
    CHECK_EQ(k2, k);
    for (size_t i = 0; i < DSRT_MIN(k, k2); i++) CHECK_EQ(got[i].hash, want[i].hash);
    dsrt_pipeline_statistics st;
    dsrt_pipeline_stats(p, &st);
    CHECK_EQ(st.bad_samples, 0);
    CHECK_EQ(st.skipped, 0);
    dsrt_pipeline_close(p);

    /* None left: fails, naming the reason; nothing is marked bad. */
    p = open_pipe(ds, &a, &o);
    CHECK_OK(dsrt_pipeline_reset(p, o.epochs, 0));
    fd_span(&low, &high);
    lim.rlim_cur = (rlim_t)low;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    CHECK_OK(dsrt_pipeline_reset(p, 0, 0));
    dsrt_batch *b;
    int rc = dsrt_pipeline_next(p, &b);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK_EQ(rc, -EMFILE);
    CHECK_CONTAINS(dsrt_last_error(), "Too many open files");
    CHECK_CONTAINS(dsrt_last_error(), "not a fault of the file");
    dsrt_pipeline_stats(p, &st);
    CHECK_EQ(st.bad_samples, 0);
    CHECK_EQ(dsrt_pipeline_bad_samples(p, 0, NULL, 0), 0);
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
}

/* Read buffers are sized from the data: opening reserves little address
 * space (not max_file_bytes for every read in flight), and a file larger
 * than a buffer's first size is read all the same. */
static long vm_size_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void test_read_buffers(void) {
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/big", base_dir);
    make_folder(dir, 12, 2);
    /* A 600 x 400 RGB PNG of noise: about 700 KB. */
    size_t npx = 600 * 400 * 3, len;
    uint8_t *px = malloc(npx);
    timg_noise(px, npx, 11);
    uint8_t *png = timg_png(px, 600, 400, 2, 8, 0, NULL, NULL, &len);
    REQUIRE(png && len > 600000);
    snprintf(path, sizeof path, "%s/class1/zbig.png", dir);
    REQUIRE(timg_write_file(path, png, len) == 0);
    free(png);
    free(px);
    dsrt_datastore *ds = open_folder(dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.batch = 4;
    o.threads = 4;
    o.reader.depth = 16;
    o.chunk = 16;
    long before = vm_size_kb();
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    long after = vm_size_kb();
    /* 4 workers x 4 reads of 64 MiB would be 1 GiB. */
    if (before > 0) CHECK_LT(after - before, 256 << 10);
    rec r[16];
    int end;
    size_t k = take(p, r, 16, &end);
    CHECK_EQ(end, DSRT_EEOF);
    dsrt_pipeline_statistics st;
    dsrt_pipeline_stats(p, &st);
    CHECK_EQ(st.bad_samples, 0);
    dsrt_pipeline_close(p);
    ref_ctx rc = ref_open(ds, &a, &o, NULL);
    check_against_ref(&rc, r, k);
    ref_close(&rc);

    /* Larger than max_file_bytes: a bad sample that says so. */
    o.max_file_bytes = 100000;
    o.threads = 1;
    p = open_pipe(ds, &a, &o);
    k = take(p, r, 16, &end);
    CHECK_EQ(end, DSRT_EEOF);
    dsrt_bad_sample bs[2];
    CHECK_EQ(dsrt_pipeline_bad_samples(p, 0, bs, 2), 1);
    CHECK_STR_EQ(bs[0].path, path);
    CHECK_EQ(bs[0].code, DSRT_ETOOBIG);
    CHECK_CONTAINS(bs[0].error, "max_file_bytes");
    dsrt_pipeline_close(p);

    /* The cap holds to the byte, below a page too: a cap of the smallest
     * file's size keeps that file alone (10 bytes: none). */
    size_t smallest = SIZE_MAX, n_small = 0, count = dsrt_datastore_count(ds);
    struct stat fst;
    for (size_t i = 0; i < count; i++)
        if (stat(dsrt_datastore_path(ds, i), &fst) == 0 && (size_t)fst.st_size < smallest)
            smallest = (size_t)fst.st_size;
    for (size_t i = 0; i < count; i++)
        n_small += stat(dsrt_datastore_path(ds, i), &fst) == 0 && (size_t)fst.st_size == smallest;
    REQUIRE(smallest < 4096);
    const size_t caps[2] = {10, smallest};
    for (int c = 0; c < 2; c++) {
        o.max_file_bytes = caps[c];
        o.drop_bad = 1;
        o.max_consecutive_bad = 100;
        p = open_pipe(ds, &a, &o);
        size_t samples = 0;
        dsrt_batch *b;
        while (dsrt_pipeline_next(p, &b) == 0) {
            samples += b->count;
            CHECK_OK(dsrt_batch_release(p, b));
        }
        CHECK_EQ(samples, 2 * (c ? n_small : 0)); /* 2 epochs */
        CHECK_EQ(dsrt_pipeline_bad_samples(p, 0, bs, 1), count - (c ? n_small : 0));
        CHECK_CONTAINS(bs[0].error,
                       c ? "more than max_file_bytes (" : "more than max_file_bytes (10)");
        dsrt_pipeline_close(p);
    }
    o.drop_bad = 0;
    o.max_consecutive_bad = dsrt_pipeline_defaults().max_consecutive_bad;

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* Out of address space for the buffer a 48 MB file needs: the run
     * fails with that reason, not a bare "out of memory". */
    snprintf(path, sizeof path, "%s/class0/huge.png", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && ftruncate(fileno(f), 48 << 20) == 0 && fclose(f) == 0);
    dsrt_datastore_close(ds);
    ds = open_folder(dir);
    o.max_file_bytes = (size_t)64 << 20;
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        /* The limit is set before the pipeline opens (its workers read at
         * once: a limit set after could come after the huge file's read).
         * What an open takes is measured first with files capped at 1 MB,
         * which keeps the huge one from growing a buffer; the limit leaves
         * 16 MB above that, short of its 48. */
        dsrt_pipeline_options small = o;
        small.max_file_bytes = (size_t)1 << 20;
        long before = vm_size_kb();
        p = open_pipe(ds, &a, &small);
        long opened = vm_size_kb();
        dsrt_pipeline_close(p);
        long after = vm_size_kb();
        rlim_t lim = (rlim_t)(after + (opened - before) + (16 << 10)) << 10;
        struct rlimit as = {lim, RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &as) != 0) _exit(3);
        p = open_pipe(ds, &a, &o);
        dsrt_batch *b;
        int code = 0;
        while ((code = dsrt_pipeline_next(p, &b)) == 0) dsrt_batch_release(p, b);
        int ok = code == -ENOMEM && strstr(dsrt_last_error(), "address space") &&
                 strstr(dsrt_last_error(), "huge.png");
        if (!ok) fprintf(stderr, "child: %d: %s\n", code, dsrt_last_error());
        _exit(ok ? 0 : 1);
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(path);
#endif
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Failing locks

/* TSan keeps its own books on condition variables: no fault injection there. */
#if defined(__SANITIZE_THREAD__)
#define FAULT_INJECTION 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FAULT_INJECTION 0
#endif
#endif
#ifndef FAULT_INJECTION
#define FAULT_INJECTION 1
#endif

#if FAULT_INJECTION
/* While fail_cond_at > 0, the fail_cond_at-th pthread_cond_init call from
 * then on fails with EAGAIN, as it may when the system is short of
 * resources. The executable's definition takes the place of libc's. */
static atomic_int cond_calls, fail_cond_at;

int pthread_cond_init(pthread_cond_t *restrict c, const pthread_condattr_t *restrict a) {
    int (*real)(pthread_cond_t *, const pthread_condattr_t *);
    *(void **)&real = dlsym(RTLD_NEXT, "pthread_cond_init");
    if (atomic_load(&fail_cond_at) > 0 && atomic_fetch_add(&cond_calls, 1) + 1 == fail_cond_at)
        return EAGAIN;
    return real(c, a);
}
#endif

/* Every lock the pipeline makes is checked: a failing one fails the open
 * with the reason, and nothing made is left behind. */
static void test_lock_failure(void) {
#if FAULT_INJECTION
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_pipeline_options o = small_options();
    int fired = 0;
    for (int k = 1; k <= 16; k++) {
        atomic_store(&cond_calls, 0);
        atomic_store(&fail_cond_at, k);
        dsrt_pipeline *p = NULL;
        int rc = dsrt_pipeline_open(&p, ds, NULL, &o);
        int calls = atomic_load(&cond_calls);
        atomic_store(&fail_cond_at, 0);
        if (calls < k) { /* no call of that rank: the open went through */
            CHECK_OK(rc);
            dsrt_pipeline_close(p);
            break;
        }
        fired++;
        CHECK_EQ(rc, -EAGAIN);
        CHECK(p == NULL);
        CHECK_CONTAINS(dsrt_last_error(), "pipeline");
    }
    CHECK_GE(fired, 3);
    dsrt_datastore_close(ds);
#else
    printf("  (no fault injection under TSan)\n");
#endif
}

// ----------------------------------------------------------------------------
// Parts: data-parallel shares of each batch

/* Every sample of a run, batch after batch: id and hash of its bytes. */
typedef struct {
    uint32_t id[256];
    uint64_t hash[256];
    size_t count[16], global_count[16];
    size_t n, batches;
} samples_rec;

static void take_samples(dsrt_pipeline *p, samples_rec *r) {
    dsrt_batch *b;
    memset(r, 0, sizeof *r);
    while (dsrt_pipeline_next(p, &b) == 0) {
        REQUIRE(r->batches < 16 && r->n + b->count <= 256);
        r->count[r->batches] = b->count;
        r->global_count[r->batches++] = b->global_count;
        for (size_t i = 0; i < b->count; i++, r->n++) {
            r->id[r->n] = b->ids[i];
            r->hash[r->n] =
                fnv(FNV0, (const char *)b->data + i * b->sample_stride, b->sample_bytes);
        }
        CHECK_OK(dsrt_batch_release(p, b));
    }
}

/* parts pipelines, each with its part: batch by batch, part after part,
 * their samples are the samples of one whole pipeline; every part walks
 * the same batches (empty parts included), and a reset part resumes the
 * same. */
static void check_parts(const dsrt_datastore *ds, dsrt_pipeline_options o, unsigned parts) {
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    static samples_rec whole, part[16];
    o.parts = 1;
    o.part = 0;
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    take_samples(p, &whole);
    dsrt_pipeline_close(p);
    REQUIRE(parts <= 16);
    for (unsigned k = 0; k < parts; k++) {
        o.parts = parts;
        o.part = k;
        o.threads = 1 + k % 2;
        p = open_pipe(ds, &a, &o);
        CHECK_EQ(dsrt_pipeline_batches_per_epoch(p), whole.batches / o.epochs);
        take_samples(p, &part[k]);
        CHECK_EQ(part[k].batches, whole.batches);
        /* A reset to epoch 1, batch 2 delivers what the uninterrupted part
         * delivered from there. */
        uint64_t bpe = dsrt_pipeline_batches_per_epoch(p);
        CHECK_OK(dsrt_pipeline_reset(p, 1, 2));
        samples_rec again;
        take_samples(p, &again);
        size_t skip = 0;
        for (size_t i = 0; i < bpe + 2; i++) skip += part[k].count[i];
        CHECK_EQ(again.n, part[k].n - skip);
        CHECK(memcmp(again.hash, part[k].hash + skip, again.n * sizeof again.hash[0]) == 0);
        dsrt_pipeline_close(p);
    }
    size_t at[16] = {0}, w = 0;
    for (size_t b = 0; b < whole.batches; b++) {
        for (unsigned k = 0; k < parts; k++) {
            CHECK_EQ(part[k].global_count[b], whole.count[b]);
            CHECK_EQ(part[k].count[b],
                     whole.count[b] * (k + 1) / parts - whole.count[b] * k / parts);
            for (size_t i = 0; i < part[k].count[b]; i++, w++, at[k]++) {
                CHECK_EQ(part[k].id[at[k]], whole.id[w]);
                CHECK(part[k].hash[at[k]] == whole.hash[w]);
            }
        }
    }
    CHECK_EQ(w, whole.n);
}

static void test_parts(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_pipeline_options o = small_options();
    check_parts(ds, o, 2);
    check_parts(ds, o, 3);
    /* The last batch of each epoch holds 10: parts 12 to 15 of it are empty. */
    check_parts(ds, o, 16);
    o.drop_last = 1;
    check_parts(ds, o, 2);
    dsrt_datastore_close(ds);
    /* Bad files: the fills are the same whichever part finds them. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/bad", base_dir);
    ds = open_folder(dir);
    o = small_options();
    o.batch = 8;
    o.chunk = 3;
    o.shuffle = DSRT_SHUFFLE_NEVER;
    check_parts(ds, o, 3);
    dsrt_datastore_close(ds);
    /* Bad parts. */
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    ds = open_folder(good_dir);
    o = small_options();
    o.parts = 2;
    o.part = 2;
    dsrt_pipeline *p = NULL;
    CHECK_EQ(dsrt_pipeline_open(&p, ds, &a, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "part: 2");
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// Batch mixing: mixup, cutmix, soft labels

/* A whole epoch's batches of a pipeline: the samples, labels and (when
 * there) soft labels and mix fields, copied. */
typedef struct {
    size_t count, classes, per;
    float *x, *soft;
    int32_t labels[16];
    double lambda;
    int cutmix, box[4];
    uint64_t hash;
} mixed_rec;

static size_t take_mixed(dsrt_pipeline *p, mixed_rec *out, size_t max) {
    size_t k = 0;
    dsrt_batch *b;
    while (k < max && dsrt_pipeline_next(p, &b) == 0) {
        mixed_rec *r = &out[k++];
        r->count = b->count;
        r->per = b->sample_bytes / sizeof(float);
        r->x = malloc(b->count * b->sample_bytes);
        for (size_t i = 0; i < b->count; i++)
            memcpy(r->x + i * r->per, (char *)b->data + i * b->sample_stride, b->sample_bytes);
        memcpy(r->labels, b->labels, b->count * sizeof(int32_t));
        r->classes = b->classes;
        r->soft = NULL;
        r->hash = batch_hash(b);
        if (b->soft_labels) {
            r->soft = malloc(b->count * b->classes * sizeof(float));
            memcpy(r->soft, b->soft_labels, b->count * b->classes * sizeof(float));
            r->hash = fnv(r->hash, b->soft_labels, b->count * b->classes * sizeof(float));
        }
        r->lambda = b->mix_lambda;
        r->cutmix = b->mix_cutmix;
        memcpy(r->box, b->mix_box, sizeof r->box);
        r->hash = fnv(r->hash, &r->lambda, sizeof r->lambda);
        CHECK_OK(dsrt_batch_release(p, b));
    }
    return k;
}

static void free_mixed(mixed_rec *r, size_t k) {
    for (size_t i = 0; i < k; i++) {
        free(r[i].x);
        free(r[i].soft);
    }
}

/* Row i of a batch's soft labels: sums to 1, and is the smoothed one-hots
 * of the sample and its partner weighted lambda and 1 - lambda. */
static void check_soft_rows(const mixed_rec *m, double e) {
    size_t K = m->classes;
    for (size_t i = 0; i < m->count; i++) {
        const float *row = m->soft + i * K;
        double sum = 0;
        for (size_t j = 0; j < K; j++) sum += row[j];
        CHECK_NEAR(sum, 1.0, 4 * K * 1.2e-7);
        int own = m->labels[i], other = m->labels[m->count - 1 - i];
        for (size_t j = 0; j < K; j++) {
            double want = e / K + (1 - e) * (m->lambda * ((int)j == own) +
                                             (1 - m->lambda) * ((int)j == other));
            CHECK_NEAR(row[j], want, 1e-6);
        }
    }
}

/* A mixed batch against the same batch unmixed: mixup is lambda * own +
 * (1 - lambda) * partner everywhere; cutmix is the partner inside the box,
 * own outside, and lambda is 1 - box area / image area. */
static void check_mixed_pixels(const mixed_rec *m, const mixed_rec *plain, int H, int W) {
    CHECK_EQ(m->count, plain->count);
    size_t n = m->count, per = m->per, C = per / ((size_t)H * W);
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        const float *got = m->x + i * per, *a = plain->x + i * per,
                    *b = plain->x + (n - 1 - i) * per;
        for (size_t c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    size_t at = (c * H + y) * W + x;
                    double want;
                    if (m->cutmix) {
                        int in = y >= m->box[0] && y < m->box[1] && x >= m->box[2] && x < m->box[3];
                        want = in ? b[at] : a[at];
                        same &= got[at] == (float)want;
                    } else {
                        want = m->lambda * a[at] + (1 - m->lambda) * b[at];
                        same &= fabs(got[at] - want) <= 1e-6 * (1 + fabs(want));
                    }
                }
    }
    CHECK(same);
    if (m->cutmix) {
        CHECK(m->box[0] <= m->box[1] && m->box[1] <= H && m->box[2] <= m->box[3] && m->box[3] <= W);
        double area = (double)(m->box[1] - m->box[0]) * (m->box[3] - m->box[2]);
        CHECK_NEAR(m->lambda, 1.0 - area / ((double)H * W), 1e-12);
    }
}

static void test_mixing(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    o.epochs = 1;
    o.batch = 16;
    o.threads = 1;
    enum { MAXB = 8 };
    mixed_rec plain[MAXB], mixed[MAXB], mixed3[MAXB];
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    size_t kp = take_mixed(p, plain, MAXB);
    dsrt_pipeline_close(p);
    CHECK_EQ(kp, 6);
    CHECK(plain[0].soft == NULL);

    o.mixup_alpha = 0.8;
    o.cutmix_alpha = 1.0;
    o.mix_prob = 0.9;
    o.label_smoothing = 0.1;
    p = open_pipe(ds, &a, &o);
    size_t km = take_mixed(p, mixed, MAXB);
    dsrt_pipeline_close(p);
    CHECK_EQ(km, kp);
    int seen_cut = 0, seen_mixup = 0;
    for (size_t k = 0; k < km; k++) {
        CHECK_EQ(mixed[k].classes, 3);
        CHECK(mixed[k].lambda >= 0 && mixed[k].lambda <= 1);
        CHECK_EQ(memcmp(mixed[k].labels, plain[k].labels, plain[k].count * sizeof(int32_t)), 0);
        check_soft_rows(&mixed[k], 0.1);
        check_mixed_pixels(&mixed[k], &plain[k], 32, 32);
        seen_cut += mixed[k].cutmix;
        seen_mixup += !mixed[k].cutmix && mixed[k].lambda < 1;
    }
    CHECK_GT(seen_cut, 0);
    CHECK_GT(seen_mixup, 0);

    /* Bit for bit the same with 3 workers and small chunks. */
    o.threads = 3;
    o.chunk = 2;
    p = open_pipe(ds, &a, &o);
    size_t k3 = take_mixed(p, mixed3, MAXB);
    CHECK_EQ(k3, km);
    for (size_t k = 0; k < k3; k++) CHECK_EQ(mixed3[k].hash, mixed[k].hash);
    /* A reset to the middle of the epoch mixes the same way. */
    CHECK_OK(dsrt_pipeline_reset(p, 0, 3));
    mixed_rec again[MAXB];
    size_t ka = take_mixed(p, again, MAXB);
    CHECK_EQ(ka, km - 3);
    for (size_t k = 0; k < ka; k++) CHECK_EQ(again[k].hash, mixed[k + 3].hash);
    dsrt_pipeline_close(p);
    free_mixed(again, ka);
    free_mixed(mixed3, k3);
    free_mixed(mixed, km);

    /* Cutmix alone with box sides drawn from [0.25, 0.75) of the image's. */
    dsrt_pipeline_options oc = small_options();
    oc.epochs = 1;
    oc.threads = 2;
    oc.cutmix_minmax[0] = 0.25;
    oc.cutmix_minmax[1] = 0.75;
    p = open_pipe(ds, &a, &oc);
    km = take_mixed(p, mixed, MAXB);
    dsrt_pipeline_close(p);
    CHECK_EQ(km, kp);
    for (size_t k = 0; k < km; k++) {
        CHECK_EQ(mixed[k].cutmix, 1);
        int h = mixed[k].box[1] - mixed[k].box[0], w = mixed[k].box[3] - mixed[k].box[2];
        CHECK(h >= 8 && h < 24 && w >= 8 && w < 24);
        check_soft_rows(&mixed[k], 0);
        check_mixed_pixels(&mixed[k], &plain[k], 32, 32);
    }
    free_mixed(mixed, km);

    /* Label smoothing alone: the images are untouched, lambda is 1. */
    dsrt_pipeline_options os = small_options();
    os.epochs = 1;
    os.label_smoothing = 0.2;
    p = open_pipe(ds, &a, &os);
    km = take_mixed(p, mixed, MAXB);
    dsrt_pipeline_close(p);
    for (size_t k = 0; k < km; k++) {
        CHECK_EQ(mixed[k].lambda, 1.0);
        CHECK_EQ(memcmp(mixed[k].x, plain[k].x, plain[k].count * plain[k].per * sizeof(float)), 0);
        check_soft_rows(&mixed[k], 0.2);
    }
    free_mixed(mixed, km);
    free_mixed(plain, kp);

    /* Refused: uint8 batches, probabilities and smoothing out of range, a
     * box range upside down, drop_bad, fewer classes than the data has. */
    dsrt_augment_options au8 = a;
    au8.layout = DSRT_AUGMENT_U8_NHWC;
    au8.norm = DSRT_AUGMENT_NORM_NONE;
    o = small_options();
    o.mixup_alpha = 0.2;
    expect_option(ds, &au8, &o, "needs float NCHW");
    o.mix_prob = 1.5;
    expect_option(ds, &a, &o, "mix_prob: 1.5");
    o = small_options();
    o.label_smoothing = 1;
    expect_option(ds, &a, &o, "label_smoothing: 1");
    o = small_options();
    o.cutmix_minmax[0] = 0.5;
    o.cutmix_minmax[1] = 0.4;
    expect_option(ds, &a, &o, "cutmix_minmax");
    o = small_options();
    o.mixup_alpha = -1;
    expect_option(ds, &a, &o, "mixup_alpha: -1");
    o = small_options();
    o.label_smoothing = 0.1;
    o.drop_bad = 1;
    expect_option(ds, &a, &o, "drop_bad");
    o = small_options();
    o.label_smoothing = 0.1;
    o.classes = 2;
    expect_option(ds, &a, &o, "classes: 2");
    dsrt_datastore_close(ds);
}

/* pad_last: the short last batch (10 of 16 over 4 parts) is filled to 12
 * with the first two samples of the epoch's order, every part gets 3 of
 * it, and the parts of every batch are equal, disjoint within an epoch but
 * for the padding, and cover the epoch. */
static void test_parts_padded(void) {
    dsrt_datastore *ds = open_folder(good_dir);
    dsrt_augment_options a;
    dsrt_augment_preset_32(&a);
    dsrt_pipeline_options o = small_options();
    static samples_rec whole, part[4];
    dsrt_pipeline *p = open_pipe(ds, &a, &o);
    take_samples(p, &whole);
    dsrt_pipeline_close(p);
    o.parts = 4;
    o.pad_last = 1;
    for (unsigned k = 0; k < 4; k++) {
        o.part = k;
        p = open_pipe(ds, &a, &o);
        take_samples(p, &part[k]);
        dsrt_pipeline_close(p);
        CHECK_EQ(part[k].batches, whole.batches);
    }
    size_t bpe = whole.batches / 2, w = 0, at[4] = {0};
    for (size_t b = 0; b < whole.batches; b++) {
        size_t first = w, epoch_first = b < bpe ? 0 : whole.n / 2;
        for (unsigned k = 0; k < 4; k++) {
            CHECK_EQ(part[k].count[b], part[0].count[b]);
            CHECK_EQ(part[k].count[b], b % bpe == bpe - 1 ? 3 : 4);
            for (size_t i = 0; i < part[k].count[b]; i++, at[k]++) {
                size_t pos = (size_t)(b % bpe) * 16 + k * part[k].count[b] + i;
                /* Past the epoch's 90 samples: from the start of its order. */
                size_t src =
                    pos < GOOD_N ? first - (b % bpe) * 16 + pos : epoch_first + (pos - GOOD_N);
                CHECK_EQ(part[k].id[at[k]], whole.id[src]);
            }
        }
        w += whole.count[b];
    }
    /* Without parts, or with drop_last, nothing changes. */
    o.parts = 1;
    o.part = 0;
    samples_rec one;
    p = open_pipe(ds, &a, &o);
    take_samples(p, &one);
    dsrt_pipeline_close(p);
    CHECK_EQ(one.n, whole.n);
    o.pad_last = 2;
    expect_option(ds, &a, &o, "pad_last: 2");
    dsrt_datastore_close(ds);
}

/* The draws of dsrt__mix_batch over 20000 batches of two 1 x 8 x 8 samples:
 * lambda of mixup ~ Beta(a, a) (mean 1/2, variance 1 / (4 (2a + 1))), the
 * share of batches mixed mix_prob, of cutmix mix_switch_prob, the cutmix
 * box inside the image and lambda 1 - its area / 64. Bounds: 6 standard
 * errors, on fixed draws. */
static void test_mix_draws(void) {
    float px[2 * 64];
    int32_t labels[2] = {0, 1};
    float soft[2 * 2];
    dsrt_batch b;
    memset(&b, 0, sizeof b);
    b.data = px;
    b.labels = labels;
    b.soft_labels = soft;
    b.classes = 2;
    b.count = 2;
    b.sample_stride = b.sample_bytes = 64 * sizeof(float);
    b.shape[0] = 2, b.shape[1] = 1, b.shape[2] = 8, b.shape[3] = 8;
    dsrt_pipeline_options o = dsrt_pipeline_defaults();
    o.seed = 11;
    o.mixup_alpha = 0.4;
    o.cutmix_alpha = 1.0;
    o.mix_prob = 0.7;
    o.mix_switch_prob = 0.25;
    const int N = 20000;
    double sum = 0, sq = 0;
    int mixed = 0, mixups = 0, cuts = 0;
    for (int i = 0; i < N; i++) {
        b.epoch = (uint64_t)i / 100;
        b.index = (uint64_t)i % 100;
        dsrt__mix_batch(&o, &b);
        CHECK_NEAR(soft[0] + soft[1], 1.0, 1e-6);
        if (b.mix_cutmix) {
            cuts++;
            mixed++;
            CHECK(b.mix_box[0] >= 0 && b.mix_box[0] <= b.mix_box[1] && b.mix_box[1] <= 8);
            CHECK(b.mix_box[2] >= 0 && b.mix_box[2] <= b.mix_box[3] && b.mix_box[3] <= 8);
            double area = (double)(b.mix_box[1] - b.mix_box[0]) * (b.mix_box[3] - b.mix_box[2]);
            CHECK_NEAR(b.mix_lambda, 1.0 - area / 64.0, 1e-12);
        } else if (b.mix_lambda != 1.0) {
            mixed++;
            mixups++;
            sum += b.mix_lambda;
            sq += b.mix_lambda * b.mix_lambda;
        }
    }
    double mean = sum / mixups, var = sq / mixups - mean * mean, want_var = 1.0 / (4 * 1.8);
    CHECK_NEAR(mean, 0.5, 6 * sqrt(want_var / mixups));
    CHECK_NEAR(var, want_var, 0.01);
    CHECK_NEAR((double)mixed / N, 0.7, 6 * sqrt(0.7 * 0.3 / N));
    CHECK_NEAR((double)cuts / mixed, 0.25, 6 * sqrt(0.25 * 0.75 / mixed));
    /* Alpha below 1 (the a < 1 branch of the gamma draws) and above. */
    for (double a = 0.2; a < 5; a *= 4) {
        o.mixup_alpha = a;
        o.cutmix_alpha = 0;
        o.mix_prob = 1;
        sum = sq = 0;
        for (int i = 0; i < N; i++) {
            b.epoch = 7;
            b.index = (uint64_t)i;
            dsrt__mix_batch(&o, &b);
            sum += b.mix_lambda;
            sq += b.mix_lambda * b.mix_lambda;
        }
        mean = sum / N;
        var = sq / N - mean * mean;
        want_var = 1.0 / (4 * (2 * a + 1));
        CHECK_NEAR(mean, 0.5, 6 * sqrt(want_var / N));
        CHECK_NEAR(var, want_var, 0.1 * want_var);
    }
}

int main(void) {
    REQUIRE(timg_tmpdir("pipeline", base_dir, sizeof base_dir) == 0);
    snprintf(good_dir, sizeof good_dir, "%s/good", base_dir);
    make_folder(good_dir, GOOD_N, 3);
    RUN(test_determinism);
    RUN(test_ordering);
    RUN(test_drop_last);
    RUN(test_slots);
    RUN(test_reset);
    RUN(test_next_timed);
    RUN(test_close_mid_epoch);
    RUN(test_bad_files);
    RUN(test_parts);
    RUN(test_mixing);
    RUN(test_mix_draws);
    RUN(test_parts_padded);
    RUN(test_memory_source);
    RUN(test_native);
    RUN(test_bad_options);
    RUN(test_lock_failure);
    RUN(test_open_files_limit);
    RUN(test_read_buffers);
    return TEST_RESULT();
}
