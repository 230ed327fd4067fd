/*
 * The built-in mobile networks (mobilenet_v2, mobilenet_v3_large and
 * _small, efficientnet_b0) through dstrain as a user runs it, on a small
 * folder of 224x224 images: analyze counts torchvision's learnables; train,
 * eval, classify, bench (training, and --inference of the trained model)
 * and --transfer run; a run checkpointed after one
 * epoch and resumed for the second ends with the weights of an
 * uninterrupted two-epoch run (dropout's, stochastic depth's and
 * batchnorm's state included); two data-parallel workers under mpirun
 * train it to about the loss of one process (skipped without mpirun).
 */
#include "commtest.h"
#include "core/internal.h"
#include "toolrun.h"

#include <math.h>

static const struct {
    const char *name;
    long long learnables; /* torchvision's, with 1000 classes */
    int resume;           /* checked for an exact resume */
} NETS[] = {
    {"mobilenet_v2", 3504872, 0},
    {"mobilenet_v3_large", 5483032, 0},
    {"mobilenet_v3_small", 2542856, 1},
    {"efficientnet_b0", 5288548, 1},
};

static char data[4200], two[4200];

static void checksum_of(const char *out, char *sum, size_t cap) {
    const char *w = strstr(out ? out : "", "\"weights_checksum\": \"");
    sum[0] = '\0';
    if (w) snprintf(sum, cap, "%.16s", w + strlen("\"weights_checksum\": \""));
}

/* The number after "key": in the summary line of out, NAN if none. */
static double summary_number(const char *out, const char *key) {
    const char *s = strstr(out ? out : "", "\"event\": \"summary\"");
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = s ? strstr(s, k) : NULL;
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

#define TRAIN(net, epochs, ...)                                                                    \
    bin_train, "train", "--data", data, "--net", net, "--epochs", epochs, "--batch", "4",          \
        "--json", "--quiet", "--threads", "2", "--workers", "1", "--execution-environment", "cpu", \
        __VA_ARGS__

static void test_analyze(void) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(NETS); k++) {
        char n[64];
        snprintf(n, sizeof n, "%s", NETS[k].name);
        result r = run(ARGV(bin_train, "analyze", "--net", n, "--json"), 120);
        CHECK_EQ(r.status, 0);
        /* The totals come last. */
        const char *last = r.out, *p;
        while ((p = strstr(last + 1, "\"learnables\":"))) last = p;
        CHECK_EQ(json_int(last, "learnables"), NETS[k].learnables);
        fprintf(stderr, "  %s: %lld learnables\n", NETS[k].name, json_int(last, "learnables"));
        result_free(&r);
    }
}

/* train, eval, classify, bench and --transfer from the trained model. */
static void test_tools(void) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(NETS); k++) {
        char n[64], model[4400], moved[4400];
        snprintf(n, sizeof n, "%s", NETS[k].name);
        snprintf(model, sizeof model, "%s/%s.dsrt", root, n);
        snprintf(moved, sizeof moved, "%s/%s-t.dsrt", root, n);
        result r = run(ARGV(TRAIN(n, "1", "--save", model)), 600);
        CHECK_EQ(r.status, 0);
        double loss = summary_number(r.out, "loss");
        CHECK(isfinite(loss));
        fprintf(stderr, "  %s: one epoch, loss %.4f\n", n, loss);
        result_free(&r);

        r = run(ARGV(bin_train, "eval", "--model", model, "--data", data, "--json", "--threads",
                     "2", "--workers", "1"),
                300);
        CHECK_EQ(r.status, 0);
        CHECK_EQ(json_int(r.out, "images"), 12);
        result_free(&r);

        char image[4400];
        snprintf(image, sizeof image, "%s/beta", data);
        r = run(ARGV(bin_train, "classify", "--model", model, "--json", image), 300);
        CHECK_EQ(r.status, 0);
        CHECK_CONTAINS(r.out, "\"label\": \"");
        result_free(&r);

        r = run(ARGV(bin_train, "bench", "--net", n, "--batch", "2", "--steps", "2", "--warmup",
                     "1", "--threads", "2", "--json"),
                300);
        CHECK_EQ(r.status, 0);
        CHECK_CONTAINS(r.out, "images_per_s");
        result_free(&r);
        r = run(ARGV(bin_train, "bench", "--net", model, "--inference", "--batch", "2", "--steps",
                     "2", "--warmup", "1", "--threads", "2", "--json"),
                300);
        CHECK_EQ(r.status, 0);
        CHECK_CONTAINS(r.out, "\"mode\": \"inference\"");
        CHECK(json_int(r.out, "images_per_s") >= 0);
        result_free(&r);

        /* A new last layer for two classes; the others frozen. */
        r = run(ARGV(bin_train, "train", "--data", two, "--transfer", model, "--lr-factor", "0",
                     "--epochs", "1", "--batch", "4", "--json", "--quiet", "--threads", "2",
                     "--workers", "1", "--save", moved),
                600);
        CHECK_EQ(r.status, 0);
        result_free(&r);
        dsrt_net *a = NULL, *b = NULL;
        CHECK_OK(dsrt_model_load(&a, model, NULL));
        CHECK_OK(dsrt_model_load(&b, moved, NULL));
        if (a && b) {
            dsrt_net_info ia, ib;
            dsrt_net_get_info(a, &ia);
            dsrt_net_get_info(b, &ib);
            CHECK_EQ(ib.classes, 2);
            CHECK_EQ(ib.layers, ia.layers);
            int kept = 0, changed = 0;
            const float *pa = dsrt_net_params(a, NULL), *pb = dsrt_net_params(b, NULL);
            for (int i = 1; i < ia.layers; i++) {
                dsrt_layer_info la, lb;
                dsrt_net_layer(a, i, &la);
                dsrt_net_layer(b, i, &lb);
                if (!strcmp(la.name, "fc") || !la.weights_count) continue;
                int same = la.weights_count == lb.weights_count &&
                           !memcmp(pa + la.weights_offset, pb + lb.weights_offset,
                                   la.weights_count * sizeof *pa);
                kept += same;
                changed += !same;
            }
            fprintf(stderr, "  %s --transfer: %d learnable layers kept, %d changed\n", n, kept,
                    changed);
            CHECK_EQ(changed, 0);
            CHECK_GT(kept, 30);
        }
        dsrt_net_destroy(a);
        dsrt_net_destroy(b);
    }
}

/* One epoch, checkpointed; the same command for two resumes from it and
 * ends where an uninterrupted two-epoch run ends. */
static void test_resume(void) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(NETS); k++) {
        if (!NETS[k].resume) continue;
        char n[64], ck[4400], full[32], sum[32];
        snprintf(n, sizeof n, "%s", NETS[k].name);
        snprintf(ck, sizeof ck, "%s/ck-%s", root, n);
        result r = run(ARGV(TRAIN(n, "2", "--seed", "3")), 600);
        CHECK_EQ(r.status, 0);
        checksum_of(r.out, full, sizeof full);
        CHECK(full[0]);
        result_free(&r);
        r = run(ARGV(TRAIN(n, "1", "--seed", "3", "--checkpoint-dir", ck, "--resume", "auto")),
                600);
        CHECK_EQ(r.status, 0);
        result_free(&r);
        r = run(ARGV(TRAIN(n, "2", "--seed", "3", "--checkpoint-dir", ck, "--resume", "auto")),
                600);
        CHECK_EQ(r.status, 0);
        CHECK_CONTAINS(r.err, "resuming from");
        checksum_of(r.out, sum, sizeof sum);
        fprintf(stderr, "  %s: two epochs %s, one and a resumed one %s\n", n, full, sum);
        CHECK_STR_EQ(sum, full);
        result_free(&r);
    }
}

/* Two workers under mpirun, one compute thread each, against one process:
 * about the same loss. */
static void test_data_parallel(void) {
    const char *mpirun = comm_test_mpirun();
    if (!mpirun) {
        fprintf(stderr, "  no mpirun: data-parallel run skipped\n");
        return;
    }
    char n[] = "mobilenet_v3_small";
    result r = run(ARGV(bin_train, "train", "--data", data, "--net", n, "--epochs", "1", "--batch",
                        "4", "--json", "--quiet", "--threads", "1", "--workers", "1"),
                   600);
    CHECK_EQ(r.status, 0);
    double one = summary_number(r.out, "loss");
    result_free(&r);
    comm_test_env(); /* as the communicator tests run their workers */
    r = run(ARGV((char *)mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", bin_train,
                 "train", "--data", data, "--net", n, "--epochs", "1", "--batch", "4", "--json",
                 "--quiet", "--threads", "1", "--workers", "1", "--execution-environment",
                 "parallel", "--bn-statistics", "sync"),
            900);
    CHECK_EQ(r.status, 0);
    if (r.status) fprintf(stderr, "%.2000s\n", r.err);
    double two_workers = summary_number(r.out, "loss");
    fprintf(stderr, "  %s: loss %.6f in one process, %.6f on two workers\n", n, one, two_workers);
    CHECK_EQ(json_int(strstr(r.out, "\"event\": \"summary\""), "world"), 2);
    /* Batchnorm over 2 images a worker (synchronised) and dropout draw
     * otherwise than over 4: close, not equal. */
    CHECK(isfinite(one) && fabs(two_workers - one) <= 0.05 * fabs(one));
    result_free(&r);
}

int main(void) {
    int skip = toolrun_init("mobile_nets");
    if (skip) return skip;
    static const char *const AB[] = {"alpha", "beta"};
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(two, sizeof two, "%s/two", root);
    make_images(data, ABC, 3, 4);
    make_images(two, AB, 2, 4);
    RUN(test_analyze);
    RUN(test_tools);
    RUN(test_resume);
    RUN(test_data_parallel);
    return TEST_RESULT();
}
