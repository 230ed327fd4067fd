/*
 * Tests of model and checkpoint files: a round trip keeps the description,
 * parameters, running statistics and predictions bit for bit; a checkpoint
 * brings back the optimizer state and position so that training continues
 * exactly; and every damaged file is refused with a message naming it: each
 * byte flipped in turn, every truncation, wrong magic, another version,
 * trailing bytes, an unknown required section (an unknown optional one is
 * skipped), a missing file.
 */
#include "nn/internal.h"
#include "task.h"
#include "testimg.h"

#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

static char dir[512];

static void path_of(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

static uint8_t *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static dsrt_net *small_net(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    o.seed = 3;
    dsrt_net *net;
    REQUIRE(dsrt_net_create(&net,
                            "# small\ninput size=6x6x2 normalization=zscore\n"
                            "conv name=c1 filters=3 size=3\nbatchnorm\nrelu\ndropout p=0.2\n"
                            "fc outputs=classes\nsoftmax\n",
                            0, 0, 0, 3, &o) == 0);
    return net;
}

static void batch(float *x, int32_t *y, int n, int seed) {
    dsrt_rng r = dsrt_rng_init((uint64_t)seed, 0, 0, 0);
    for (int i = 0; i < n * 72; i++) x[i] = (float)dsrt_rng_uniform(&r);
    for (int i = 0; i < n; i++) y[i] = i % 3;
}

static void test_round_trip(void) {
    dsrt_net *net = small_net();
    float x[4 * 72], s1[12], s2[12];
    int32_t y[4];
    batch(x, y, 4, 1);
    float mean[2] = {0.5f, 0.25f}, sd[2] = {0.3f, 0.2f};
    CHECK_OK(dsrt_net_set_input_stats(net, mean, sd, NULL, NULL));
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL)); /* running stats move */
    char path[600];
    path_of(path, sizeof path, "model.dsrt");
    CHECK_OK(dsrt_model_save(path, net));
    CHECK_EQ(chmod(path, 0600), 0);
    CHECK_OK(dsrt_model_save(path, net)); /* over an existing file, which keeps its mode */
    struct stat sm;
    CHECK(stat(path, &sm) == 0 && (sm.st_mode & 07777) == 0600);
    /* no temporary files left behind */
    DIR *d = opendir(dir);
    REQUIRE(d);
    int others = 0;
    for (struct dirent *e; (e = readdir(d));)
        others += e->d_name[0] != '.' && strstr(e->d_name, "model.dsrt") &&
                  strcmp(e->d_name, "model.dsrt");
    closedir(d);
    CHECK_EQ(others, 0);

    dsrt_net *back;
    CHECK_OK(dsrt_model_load(&back, path, NULL));
    REQUIRE(back);
    CHECK_STR_EQ(dsrt_net_description(back), dsrt_net_description(net));
    CHECK_EQ(back->n_params, net->n_params);
    CHECK_EQ(back->n_state, net->n_state);
    CHECK(memcmp(back->params, net->params, net->n_params * sizeof(float)) == 0);
    CHECK(memcmp(back->state, net->state, net->n_state * sizeof(float)) == 0);
    CHECK_EQ(back->classes, 3);
    CHECK_EQ(back->input.h, 6);
    CHECK_OK(dsrt_net_predict(net, x, 4, s1, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(back, x, 4, s2, NULL, NULL, NULL));
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    dsrt_net_destroy(back);

    /* A built-in net for another input size and class count keeps both. */
    dsrt_net *a;
    CHECK_OK(dsrt_net_create(&a, "digits", 32, 32, 1, 7, NULL));
    CHECK_OK(dsrt_model_save(path, a));
    CHECK_OK(dsrt_model_load(&back, path, NULL));
    CHECK_EQ(back->input.h, 32);
    CHECK_EQ(back->classes, 7);
    CHECK_EQ(back->n_params, a->n_params);
    dsrt_net_destroy(back);
    dsrt_net_destroy(a);
    dsrt_net_destroy(net);
}

/* A graph (a residual block, a concat) round-trips bit for bit, in format
 * version 2; a chain is still written as version 1, which older readers
 * take. */
static void test_graph_round_trip(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    o.seed = 5;
    dsrt_net *net;
    REQUIRE(
        dsrt_net_create(&net,
                        "input size=6x6x2\nconv name=a filters=4 size=3 pad=1 bias=0\n"
                        "batchnorm\nrelu name=r\nconv filters=4 size=3 pad=1\n"
                        "add name=s inputs=conv_2,r relu=1\nconv name=b filters=2 size=1 inputs=r\n"
                        "concat inputs=s,b\nfc outputs=classes\nsoftmax\n",
                        0, 0, 0, 3, &o) == 0);
    float x[4 * 72], s1[12], s2[12];
    int32_t y[4];
    batch(x, y, 4, 2);
    CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
    char path[600];
    path_of(path, sizeof path, "graph.dsrt");
    CHECK_OK(dsrt_model_save(path, net));
    size_t n;
    uint8_t *b = slurp(path, &n);
    CHECK_EQ(b[8], 2);
    free(b);
    dsrt_net *back;
    CHECK_OK(dsrt_model_load(&back, path, NULL));
    REQUIRE(back);
    CHECK(memcmp(back->params, net->params, net->n_params * sizeof(float)) == 0);
    CHECK_OK(dsrt_net_predict(net, x, 4, s1, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(back, x, 4, s2, NULL, NULL, NULL));
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    dsrt_net_destroy(back);
    dsrt_net_destroy(net);
    net = small_net();
    CHECK_OK(dsrt_model_save(path, net));
    b = slurp(path, &n);
    CHECK_EQ(b[8], 1);
    free(b);
    dsrt_net_destroy(net);
}

static void test_checkpoint(void) {
    for (int solver = 0; solver < 3; solver++) {
        dsrt_net *net = small_net();
        dsrt_optimizer_options o = dsrt_optimizer_defaults((dsrt_solver)solver);
        o.schedule = DSRT_LR_PIECEWISE;
        o.drop_period = 3;
        o.grad_threshold = 5;
        dsrt_optimizer *opt;
        CHECK_OK(dsrt_optimizer_create(&opt, net, &o));
        float x[4 * 72];
        int32_t y[4];
        for (int step = 0; step < 3; step++) {
            batch(x, y, 4, step);
            CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
            CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        }
        char path[600];
        path_of(path, sizeof path, "ckpt.dsrt");
        dsrt_train_position pos = {2, 3, 3};
        CHECK_OK(dsrt_checkpoint_save(path, net, opt, &pos));
        dsrt_net *net2;
        dsrt_optimizer *opt2;
        dsrt_train_position pos2;
        CHECK_OK(dsrt_checkpoint_load(path, &net2, &opt2, &pos2, NULL));
        REQUIRE(net2 && opt2);
        CHECK_EQ(pos2.epoch, 2);
        CHECK_EQ(pos2.iteration, 3);
        CHECK_EQ(pos2.seed, 3);
        CHECK_EQ(dsrt_net_iteration(net2), 3);
        dsrt_optimizer_options o2 = dsrt_optimizer_get_options(opt2);
        CHECK(memcmp(&o, &o2, sizeof o) == 0);
        CHECK_EQ(dsrt__optimizer_steps(opt2), 3);
        /* Both continue identically (dropout masks keyed by the same seed and
         * iteration). */
        batch(x, y, 4, 9);
        CHECK_OK(dsrt_net_forward_backward(net, x, y, 4, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 3));
        CHECK_OK(dsrt_net_forward_backward(net2, x, y, 4, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(opt2, net2, 3));
        CHECK(memcmp(net->params, net2->params, net->n_params * sizeof(float)) == 0);
        dsrt_optimizer_destroy(opt2);
        dsrt_net_destroy(net2);
        /* A model file has no optimizer: *opt comes back NULL. */
        CHECK_OK(dsrt_model_save(path, net));
        CHECK_OK(dsrt_checkpoint_load(path, &net2, &opt2, &pos2, NULL));
        CHECK(opt2 == NULL);
        CHECK_EQ(pos2.iteration, 0);
        dsrt_net_destroy(net2);
        dsrt_optimizer_destroy(opt);
        dsrt_net_destroy(net);
    }
}

/* Loads path and expects a refusal with code (0: any) naming the file. */
static int refused(const char *path, int code, const char *words) {
    dsrt_net *net = (dsrt_net *)1;
    dsrt_optimizer *opt = (dsrt_optimizer *)1;
    int rc = dsrt_checkpoint_load(path, &net, &opt, NULL, NULL);
    int ok = rc != 0 && net == NULL && opt == NULL && (code == 0 || rc == code) &&
             strstr(dsrt_last_error(), path) && (!words || strstr(dsrt_last_error(), words));
    if (!ok) {
        fprintf(stderr, "  %s: rc %d (%s), expected %d: %s\n", path, rc, dsrt_strerror(rc), code,
                dsrt_last_error());
        if (rc == 0) {
            dsrt_net_destroy(net);
            dsrt_optimizer_destroy(opt);
        }
    }
    return ok;
}

static int refused_mem(const uint8_t *data, size_t size, const char *name, int code) {
    dsrt_net *net = (dsrt_net *)1;
    dsrt_optimizer *opt = (dsrt_optimizer *)1;
    int rc = dsrt__model_read(data, size, name, &net, &opt, NULL, NULL);
    int ok = rc != 0 && net == NULL && opt == NULL && (code == 0 || rc == code) &&
             strstr(dsrt_last_error(), name);
    if (!ok) {
        fprintf(stderr, "  %zu bytes: rc %d (%s), expected %d: %s\n", size, rc, dsrt_strerror(rc),
                code, dsrt_last_error());
        if (rc == 0) {
            dsrt_net_destroy(net);
            dsrt_optimizer_destroy(opt);
        }
    }
    return ok;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_damaged(void) {
    dsrt_net *net = small_net();
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    char good[600], bad[600];
    path_of(good, sizeof good, "good.dsrt");
    path_of(bad, sizeof bad, "bad.dsrt");
    dsrt_train_position pos = {1, 2, 3};
    CHECK_OK(dsrt_checkpoint_save(good, net, opt, &pos));
    size_t n;
    uint8_t *b = slurp(good, &n);
    uint8_t *c = malloc(n + 64);
    REQUIRE(c);

    /* Every byte flipped, every truncation: through the reader on memory
     * (the file path is the same code after reading the file; rewriting one
     * file thousands of times is slow on ext4). */
    int fails = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(c, b, n);
        c[i] ^= (uint8_t)(1u << (i % 8));
        fails += !refused_mem(c, n, bad, 0);
    }
    CHECK_EQ(fails, 0);
    fprintf(stderr, "  %zu single-bit flips refused\n", n);
    fails = 0;
    for (size_t k = 0; k < n; k++) fails += !refused_mem(b, k, bad, DSRT_ETRUNCATED);
    CHECK_EQ(fails, 0);
    fprintf(stderr, "  %zu truncations refused\n", n);
    memcpy(c, b, n);
    c[1000] ^= 4;
    spit(bad, c, n);
    CHECK(refused(bad, DSRT_ECHECKSUM, "checksum mismatch"));
    spit(bad, b, 100);
    CHECK(refused(bad, DSRT_ETRUNCATED, "truncated"));
    spit(bad, b, 0);
    CHECK(refused(bad, DSRT_ETRUNCATED, "empty"));
    /* Wrong magic. */
    memcpy(c, b, n);
    memcpy(c, "\x89PNG\r\n\x1a\n", 8);
    spit(bad, c, n);
    CHECK(refused(bad, DSRT_EFORMAT, "not a dsrt model file"));
    /* Another version, with a consistent header checksum. */
    memcpy(c, b, n);
    put32(c + 8, 3);
    put32(c + 60, (uint32_t)crc32(0, c, 60));
    spit(bad, c, n);
    CHECK(refused(bad, DSRT_EUNSUPPORTED, "version 3"));
    /* Trailing bytes. */
    memcpy(c, b, n);
    memset(c + n, 0, 8);
    spit(bad, c, n + 8);
    CHECK(refused(bad, DSRT_ECORRUPT, "after the last section"));
    /* A header checksum mismatch. */
    memcpy(c, b, n);
    c[40] ^= 1;
    spit(bad, c, n);
    CHECK(refused(bad, DSRT_ECHECKSUM, "header checksum"));
    /* A payload byte: the section checksum. */
    memcpy(c, b, n);
    c[64 + 24 + 3] ^= 0x20;
    spit(bad, c, n);
    CHECK(refused(bad, DSRT_ECHECKSUM, "section 'DESC': checksum mismatch"));

    /* An extra section: refused when required, skipped when optional. */
    for (int optional = 0; optional < 2; optional++) {
        memcpy(c, b, n);
        uint8_t *s = c + n;
        memcpy(s, "XTRA", 4);
        put32(s + 4, (uint32_t)optional);
        memset(s + 8, 0, 8);
        s[8] = 8;
        memcpy(s + 24, "abcdefgh", 8);
        put32(s + 16, (uint32_t)crc32(0, s + 24, 8));
        put32(s + 20, (uint32_t)crc32(0, s, 20));
        put32(c + 20, 6); /* one more section */
        put32(c + 60, (uint32_t)crc32(0, c, 60));
        spit(bad, c, n + 32);
        if (optional) {
            dsrt_net *x;
            CHECK_OK(dsrt_model_load(&x, bad, NULL));
            dsrt_net_destroy(x);
        } else {
            CHECK(refused(bad, DSRT_EUNSUPPORTED, "section 'XTRA' is required"));
        }
    }
    /* A description that makes another net than the stored sizes. */
    {
        dsrt_net *other;
        CHECK_OK(dsrt_net_create(&other,
                                 "input size=6x6x2\nconv filters=4 size=3\nfc outputs=3\n"
                                 "softmax\n",
                                 0, 0, 0, 3, NULL));
        char p2[600];
        path_of(p2, sizeof p2, "other.dsrt");
        CHECK_OK(dsrt_model_save(p2, other));
        size_t m;
        uint8_t *o = slurp(p2, &m);
        /* the other file's DESC section spliced into this file's header */
        size_t desc_len = (size_t)o[64 + 8] | (size_t)o[64 + 9] << 8;
        size_t sect = 24 + ((desc_len + 7) & ~(size_t)7);
        size_t my_len = (size_t)b[64 + 8] | (size_t)b[64 + 9] << 8;
        size_t my_sect = 24 + ((my_len + 7) & ~(size_t)7);
        uint8_t *x = malloc(n + sect);
        REQUIRE(x);
        memcpy(x, b, 64);
        memcpy(x + 64, o + 64, sect);
        memcpy(x + 64 + sect, b + 64 + my_sect, n - 64 - my_sect);
        spit(bad, x, n - my_sect + sect);
        CHECK(refused(bad, DSRT_ECORRUPT, "parameters"));
        free(x);
        free(o);
        dsrt_net_destroy(other);
    }
    /* Missing file; not a file. */
    char missing[600];
    path_of(missing, sizeof missing, "no-such.dsrt");
    dsrt_net *x;
    CHECK_EQ(dsrt_model_load(&x, missing, NULL), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), missing);
    CHECK(dsrt_model_load(&x, dir, NULL) != 0);
    /* Saving into a folder that does not exist fails cleanly. */
    char nodir[600];
    path_of(nodir, sizeof nodir, "no/such/dir/m.dsrt");
    CHECK(dsrt_model_save(nodir, net) < 0);
    CHECK_CONTAINS(dsrt_last_error(), "m.dsrt");

    free(b);
    free(c);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
}

/* A model path that is a FIFO or a device is refused at once: never waited
 * on, never read until memory runs out. An alarm turns a hang into a failure. */
static void test_non_regular(void) {
    char dir[4096], fifo[4200];
    REQUIRE(timg_tmpdir("model-fifo", dir, sizeof dir) == 0);
    snprintf(fifo, sizeof fifo, "%s/m.dsrt", dir);
    REQUIRE(mkfifo(fifo, 0644) == 0);
    alarm(60);
    dsrt_net *net = NULL;
    CHECK_EQ(dsrt_model_load(&net, fifo, NULL), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "FIFO");
    CHECK(net == NULL);
    CHECK_NE(dsrt_model_load(&net, "/dev/zero", NULL), 0);
    CHECK_CONTAINS(dsrt_last_error(), "character device");
    dsrt_optimizer *opt = NULL;
    dsrt_train_position pos;
    CHECK_EQ(dsrt_checkpoint_load(fifo, &net, &opt, &pos, NULL), DSRT_EFORMAT);
    CHECK(net == NULL);
    alarm(0);
    /* Saving never renames over a FIFO (or a device: think of /dev/null). */
    CHECK_OK(dsrt_net_create(&net, "digits", 0, 0, 0, 10, NULL));
    if (net) {
        CHECK_EQ(dsrt_model_save(fifo, net), DSRT_EFORMAT);
        CHECK_CONTAINS(dsrt_last_error(), "not replaced");
        struct stat st;
        CHECK(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
        CHECK_EQ(dsrt_model_save(dir, net), -EISDIR);
        dsrt_net_destroy(net);
    }
}

/* A model file whose weights or running statistics hold NaN or infinity
 * (well formed otherwise, its checksums right) is refused naming both. */
static void test_not_finite(void) {
    char path[600];
    path_of(path, sizeof path, "nan.dsrt");
    for (int k = 0; k < 2; k++) {
        dsrt_net *net = small_net(), *back = NULL;
        REQUIRE(net->n_state > 0);
        if (k)
            net->state[net->n_state - 1] = NAN;
        else
            net->params[0] = INFINITY;
        CHECK_OK(dsrt_model_save(path, net));
        CHECK_EQ(dsrt_model_load(&back, path, NULL), DSRT_ECORRUPT);
        CHECK(back == NULL);
        CHECK_CONTAINS(dsrt_last_error(), "nan.dsrt");
        CHECK_CONTAINS(dsrt_last_error(), "1 of its");
        CHECK_CONTAINS(dsrt_last_error(),
                       k ? "running statistics are not finite" : "weights are not finite");
        dsrt_net_destroy(net);
    }
}

/* A model file far larger than its header's counts allow (64 MB of a
 * model of a few hundred floats, a sparse file) is refused from its header,
 * before its bytes are read; a file that is no model, from its magic. */
static void test_oversized(void) {
    char path[600];
    path_of(path, sizeof path, "big.dsrt");
    dsrt_net *net = small_net(), *back = NULL;
    CHECK_OK(dsrt_model_save(path, net));
    CHECK_EQ(truncate(path, (off_t)64 << 20), 0);
    CHECK_EQ(dsrt_model_load(&back, path, NULL), DSRT_ECORRUPT);
    CHECK(back == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "big.dsrt: 67108864 bytes, more than a model of");
    int fd = open(path, O_WRONLY);
    REQUIRE(fd >= 0);
    CHECK_EQ(pwrite(fd, "NOTAMODL", 8, 0), 8);
    close(fd);
    CHECK_EQ(dsrt_model_load(&back, path, NULL), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "not a dsrt model file");
    dsrt_net_destroy(net);
}

int main(void) {
    const char *t = getenv("DSRT_TEST_TMP");
    snprintf(dir, sizeof dir, "%s/nn_model", t ? t : "/tmp/dsrt-test");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s", t ? t : "/tmp/dsrt-test");
    mkdir(cmd, 0755);
    mkdir(dir, 0755);
    RUN(test_round_trip);
    RUN(test_graph_round_trip);
    RUN(test_checkpoint);
    RUN(test_damaged);
    RUN(test_non_regular);
    RUN(test_not_finite);
    RUN(test_oversized);
    return TEST_RESULT();
}
