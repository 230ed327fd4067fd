/*
 * Tar shard sets shared by the ranks of an MPI job (mpirun -np 2).
 *
 *   parts    each rank runs a pipeline with parts = 2, part = its rank, in
 *            the shard order: in every epoch the ranks take disjoint whole
 *            shards (each shard's samples all go to one rank, read by the
 *            rank's stream, none by offset), together every sample once;
 *            a pipeline reset mid-epoch on each rank gives that rank's
 *            batches bit for bit.
 *   dstrain  `mpirun -np 2 dstrain train --execution-environment parallel`
 *            on the shards in the exact order ends with the weights of the
 *            same run on the folder they were written from, and runs in the
 *            shard order.
 *
 * The launcher writes the data, runs the job and checks what the ranks wrote.
 * Exit 77 when this dsrt lacks MPI or mpirun is missing.
 */
#include "commtest.h"
#include "testimg.h"

#include <dsrt.h>

#define N       120
#define CLASSES 3
#define BATCH   8
#define EPOCHS  2

static char root[4096], folder[4200], shards[4200];

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

// ----------------------------------------------------------------------------
// A rank

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

/* The batches of a pipeline from its position to the end: hashes, and the
 * ids of each epoch into ids[epoch] (counts in *nid). */
static size_t take_all(dsrt_pipeline *p, uint64_t *hash, uint32_t ids[][N], size_t *nid) {
    size_t k = 0;
    dsrt_batch *b;
    while (dsrt_pipeline_next(p, &b) == 0) {
        uint64_t h = fnv(0xcbf29ce484222325ULL, b->data, b->count * b->sample_stride);
        hash[k++] = fnv(h, b->ids, b->count * sizeof *b->ids);
        if (ids)
            for (size_t j = 0; j < b->count; j++) ids[b->epoch][nid[b->epoch]++] = b->ids[j];
        dsrt_batch_release(p, b);
    }
    return k;
}

static int rank_parts(const char *out) {
    int rank = env_int("OMPI_COMM_WORLD_RANK", 0), size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.shard_order = DSRT_SHARD_ORDER_SHARD;
    o.shuffle_buffer = 12;
    dsrt_datastore *ds;
    if (dsrt_datastore_open(&ds, shards, &o) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, dsrt_last_error());
        return 1;
    }
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = BATCH;
    po.threads = 2;
    po.pin = 0;
    po.prefetch = 2;
    po.seed = 9;
    po.epochs = EPOCHS;
    po.parts = (unsigned)size;
    po.part = (unsigned)rank;
    dsrt_augment_options a = dsrt_augment_defaults();
    a.output_height = a.output_width = 12;
    a.rand_x_reflection = 1;
    static uint32_t ids[EPOCHS][N];
    size_t nid[EPOCHS] = {0};
    uint64_t hash[64], again[64];
    dsrt_pipeline *p;
    if (dsrt_pipeline_open(&p, ds, &a, &po) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, dsrt_last_error());
        return 1;
    }
    size_t nb = take_all(p, hash, ids, nid);
    dsrt_pipeline_statistics st;
    dsrt_pipeline_stats(p, &st);
    /* Resumed mid-epoch: the same batches from there. */
    size_t bpe = dsrt_pipeline_batches_per_epoch(p), from = bpe + 3;
    int resumed = dsrt_pipeline_reset(p, 1, 3) == 0 && take_all(p, again, NULL, NULL) == nb - from;
    for (size_t k = 0; resumed && k < nb - from; k++) resumed = again[k] == hash[from + k];
    dsrt_pipeline_close(p);

    char path[4300];
    snprintf(path, sizeof path, "%s/rank%d.txt", out, rank);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "batches %zu ranged %llu stream %llu resumed %d\n", nb,
            (unsigned long long)st.stream_ranged, (unsigned long long)st.stream_samples, resumed);
    for (int e = 0; e < EPOCHS; e++) {
        fprintf(f, "epoch %d %zu", e, nid[e]);
        for (size_t j = 0; j < nid[e]; j++) {
            dsrt_sample_location loc;
            dsrt_datastore_location(ds, ids[e][j], &loc);
            fprintf(f, " %u:%zu", ids[e][j], loc.shard);
        }
        fprintf(f, "\n");
    }
    fclose(f);
    dsrt_datastore_close(ds);
    return 0;
}

// ----------------------------------------------------------------------------
// The launcher

static void make_data(void) {
    snprintf(folder, sizeof folder, "%s/folder", root);
    snprintf(shards, sizeof shards, "%s/shards", root);
    for (size_t i = 0; i < N; i++) {
        char p[4400];
        int c = (int)(i * CLASSES / N);
        snprintf(p, sizeof p, "%s/c%d", folder, c);
        REQUIRE(timg_mkdirs(p) == 0);
        size_t len = 0;
        uint8_t *buf = timg_make_jpeg(TIMG_JPEG_420, 28 + (int)(i % 5), 28, (uint32_t)i, &len);
        REQUIRE(buf);
        snprintf(p, sizeof p, "%s/c%d/%03zu.jpg", folder, c, i);
        REQUIRE(timg_write_file(p, buf, len) == 0);
        free(buf);
    }
    dsrt_datastore *ds;
    REQUIRE(dsrt_datastore_open(&ds, folder, NULL) == 0);
    dsrt_shard_write_options o = dsrt_shard_write_defaults();
    o.shard_samples = 10; /* 12 shards of 10: 6 whole shards a rank */
    REQUIRE(dsrt_shards_write(ds, shards, &o, NULL) == 12);
    dsrt_datastore_close(ds);
}

static void test_parts(void) {
    const char *extra[] = {"parts", root, NULL};
    char *args[32];
    int rc = comm_test_command(args, 2, extra);
    if (rc == TEST_SKIP) exit(TEST_SKIP);
    REQUIRE(rc == 0);
    CHECK_EQ(comm_test_run(args, 300), 0);
    int owner[EPOCHS][12];
    int seen[EPOCHS][N];
    memset(owner, -1, sizeof owner);
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < 2; r++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/rank%d.txt", root, r);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL);
        if (!f) return;
        size_t nb;
        unsigned long long ranged, stream;
        int resumed;
        CHECK_EQ(fscanf(f, "batches %zu ranged %llu stream %llu resumed %d\n", &nb, &ranged,
                        &stream, &resumed),
                 4);
        CHECK_EQ(nb, EPOCHS * N / BATCH);
        CHECK_EQ(ranged, 0);
        CHECK_EQ(stream, EPOCHS * N / 2);
        CHECK_EQ(resumed, 1);
        for (int e = 0; e < EPOCHS; e++) {
            int ee;
            size_t n;
            CHECK_EQ(fscanf(f, "epoch %d %zu", &ee, &n), 2);
            CHECK_EQ(n, N / 2);
            for (size_t j = 0; j < n; j++) {
                unsigned id;
                size_t shard;
                if (fscanf(f, " %u:%zu", &id, &shard) != 2 || id >= N || shard >= 12) {
                    CHECK(0);
                    break;
                }
                seen[e][id]++;
                /* A shard's samples all go to one rank. */
                CHECK(owner[e][shard] == -1 || owner[e][shard] == r);
                owner[e][shard] = r;
            }
            if (fscanf(f, "\n") != 0) CHECK(0);
        }
        fclose(f);
    }
    for (int e = 0; e < EPOCHS; e++)
        for (int i = 0; i < N; i++) CHECK_EQ(seen[e][i], 1);
    /* The shards change hands between epochs (shuffled every epoch). */
    int moved = 0;
    for (int k = 0; k < 12; k++) moved += owner[0][k] != owner[1][k];
    CHECK_GT(moved, 0);
}

/* The summary's weights_checksum of a dstrain job's rank-0 output. */
static int dstrain_job(const char *data, const char *order, char *checksum, size_t cap) {
    const char *bin = getenv("DSRT_BIN_DIR");
    static char dstrain[4300], out[4300];
    snprintf(dstrain, sizeof dstrain, "%s/tools/dstrain", bin ? bin : ".");
    if (access(dstrain, X_OK) != 0) return TEST_SKIP;
    const char *mpirun = comm_test_mpirun();
    if (!mpirun || dsrt_comm_available(DSRT_COMM_MPI) != 0) return TEST_SKIP;
    char *args[] = {(char *)mpirun,
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-np",
                    "2",
                    dstrain,
                    "train",
                    "--data",
                    (char *)data,
                    "--order",
                    (char *)order,
                    "--net",
                    "digits",
                    "--epochs",
                    "2",
                    "--batch",
                    "16",
                    "--seed",
                    "4",
                    "--threads",
                    "1",
                    "--workers",
                    "1",
                    "--no-pin",
                    "--execution-environment",
                    "parallel",
                    "--json",
                    "--quiet",
                    NULL};
    snprintf(out, sizeof out, "%s/dstrain-%s.txt", root, order);
    comm_test_env();
    int rc = comm_test_run_to(args, 300, out, NULL);
    FILE *f = fopen(out, "r");
    if (!f) return 1;
    char line[8192];
    checksum[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        char *w = strstr(line, "\"weights_checksum\": \"");
        if (w && strstr(line, "\"summary\"")) {
            w += strlen("\"weights_checksum\": \"");
            size_t n = strcspn(w, "\"");
            snprintf(checksum, cap, "%.*s", (int)n, w);
        }
    }
    fclose(f);
    if (rc != 0 || !checksum[0]) {
        fprintf(stderr, "dstrain on %s (%s order): status %d, output in %s\n", data, order, rc,
                out);
        return 1;
    }
    return 0;
}

static void test_dstrain(void) {
    char a[128], b[128], c[128];
    int rc = dstrain_job(folder, "auto", a, sizeof a);
    if (rc == TEST_SKIP) {
        fprintf(stderr, "  (no dstrain or mpirun: skipped)\n");
        return;
    }
    CHECK_EQ(rc, 0);
    CHECK_EQ(dstrain_job(shards, "exact", b, sizeof b), 0);
    CHECK_STR_EQ(a, b);
    CHECK_EQ(dstrain_job(shards, "shard", c, sizeof c), 0);
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--worker") && !strcmp(argv[2], "parts")) {
        snprintf(root, sizeof root, "%s", argv[3]);
        snprintf(shards, sizeof shards, "%s/shards", root);
        return rank_parts(root);
    }
    REQUIRE(timg_tmpdir("comm_shards", root, sizeof root) == 0);
    make_data();
    RUN(test_parts);
    RUN(test_dstrain);
    return TEST_RESULT();
}
