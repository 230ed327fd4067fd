/*
 * dstrain scale: a scaling estimate past this machine. It measures a
 * step's forward and backward here and predicts data-parallel step time
 * and efficiency on 8 to 512 GPUs from the gradient buckets' all-reduces.
 */
#include "dstrain.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static struct {
    const char *net, *gpus, *nvlink, *ib, *alpha_nvlink, *alpha_ib, *tflops, *bucket, *first;
    int batch, measure_batch, classes, steps, threads, json;
} sc;

static const option SCALE_OPTIONS[] = {
    {"net", OPT_STR, &sc.net},
    {"batch", OPT_INT, &sc.batch},
    {"num-classes", OPT_INT, &sc.classes},
    {"gpu-counts", OPT_STR, &sc.gpus},
    {"tflops", OPT_STR, &sc.tflops},
    {"nvlink", OPT_STR, &sc.nvlink},
    {"ib", OPT_STR, &sc.ib},
    {"alpha-nvlink", OPT_STR, &sc.alpha_nvlink},
    {"alpha-ib", OPT_STR, &sc.alpha_ib},
    {"bucket-size", OPT_STR, &sc.bucket},
    {"first-bucket-size", OPT_STR, &sc.first},
    {"measure-batch", OPT_INT, &sc.measure_batch},
    {"steps", OPT_INT, &sc.steps},
    {"threads", OPT_INT, &sc.threads},
    {"json", OPT_FLAG, &sc.json},
    {NULL, 0, NULL},
};

static void scale_usage(FILE *f) {
    fprintf(f,
            "usage: %s scale [--net alexnet|cifar] [options]\n\n"
            "Predicts the step time and the efficiency of data-parallel training on many GPUs\n"
            "from what can be measured on this machine. It runs training steps of the net here\n"
            "with the gradient hook dstrain train uses and records when backward finishes each\n"
            "bucket of the gradient (a small first bucket, then --bucket-size: the buckets\n"
            "that are summed while backward goes on). That timeline is scaled to the compute\n"
            "time of one GPU (the net's arithmetic at --tflops), and each bucket's all-reduce\n"
            "is costed by an alpha-beta model of a hierarchical ring: within a node of 8 GPUs\n"
            "over NVLink, then across nodes over InfiniBand, one link a GPU:\n\n"
            "  t(n, p) = 2(g-1) a_nv + 2(g-1)/g n/B_nv + 2(N-1) a_ib + 2(N-1)/N (n/g)/B_ib\n\n"
            "for n bytes on p GPUs in N nodes of g. Buckets are reduced in order, each from\n"
            "when it is ready and the one before is done; what is left after backward ends is\n"
            "exposed. Efficiency = compute / (compute + exposed communication), the batch a\n"
            "GPU fixed (weak scaling). Gradients are float32; the optimizer step and the\n"
            "input pipeline are left out.\n\n"
            "options:\n",
            prog);
    print_options(f, "scale", SCALE_OPTIONS);
}

/* What the gradient hook records of a step. */
typedef struct {
    double bwd_start, bwd_end;
    double *ready; /* (n) when bucket k was final */
    int n;
} scale_timeline;

static void scale_ready(void *ctx, int bucket, dsrt_range range) {
    scale_timeline *t = ctx;
    (void)range;
    if (bucket >= 0 && bucket < t->n) t->ready[bucket] = now();
}

static void scale_backward(void *ctx, int end) {
    scale_timeline *t = ctx;
    if (end)
        t->bwd_end = now();
    else
        t->bwd_start = now();
}

/* Seconds to all-reduce n bytes over p GPUs (8 a node), as above. */
static double allreduce_s(double n, int p, double bw_nv, double bw_ib, double a_nv, double a_ib) {
    int g = p < 8 ? p : 8, nodes = (p + 7) / 8;
    double t = 0;
    if (g > 1) t += 2.0 * (g - 1) * a_nv + 2.0 * (g - 1) / g * n / bw_nv;
    if (nodes > 1) t += 2.0 * (nodes - 1) * a_ib + 2.0 * (nodes - 1) / nodes * (n / g) / bw_ib;
    return t;
}

/* What cmd_scale measured and predicts. */
typedef struct {
    int nb, mb, threads, ngpus;
    size_t grad_bytes;
    double meas_f, meas_b, compute, f, b_end;
    double tflops, nv, ib, a_nv, a_ib, bucket, first;
    int gpus[32];
    double step[32], eff[32], exposed[32], comm[32]; /* (ngpus) */
    const double *ready; /* (nb) the measured step's buckets, s into backward */
    const dsrt_net_info *info;
} scale_report;

static void scale_print_json(const scale_report *r) {
    char b[9][32];
    printf("{\"net\": ");
    tool_json_string(stdout, sc.net);
    printf(", \"batch_per_gpu\": %d, \"gradient_bytes\": %zu, \"buckets\": %d, "
           "\"measured_forward_s\": %s, \"measured_backward_s\": %s, "
           "\"measure_batch\": %d, \"gpu_compute_s\": %s, \"tflops\": %s, "
           "\"nvlink_gbs\": %s, \"ib_gbs\": %s, \"alpha_nvlink_us\": %s, \"alpha_ib_us\": %s, "
           "\"predictions\": [",
           sc.batch, r->grad_bytes, r->nb, tool_json_number(b[0], "%.6f", r->meas_f),
           tool_json_number(b[1], "%.6f", r->meas_b), r->mb,
           tool_json_number(b[2], "%.6f", r->compute), tool_json_number(b[3], "%g", r->tflops),
           tool_json_number(b[4], "%g", r->nv), tool_json_number(b[5], "%g", r->ib),
           tool_json_number(b[6], "%g", r->a_nv), tool_json_number(b[7], "%g", r->a_ib));
    for (int i = 0; i < r->ngpus; i++)
        printf("%s{\"gpus\": %d, \"step_s\": %s, \"allreduce_s\": %s, \"exposed_s\": %s, "
               "\"efficiency\": %s, \"images_per_s\": %s}",
               i ? ", " : "", r->gpus[i], tool_json_number(b[0], "%.6f", r->step[i]),
               tool_json_number(b[1], "%.6f", r->comm[i]),
               tool_json_number(b[2], "%.6f", r->exposed[i]),
               tool_json_number(b[3], "%.4f", r->eff[i]),
               tool_json_number(b[4], "%.0f", r->gpus[i] * sc.batch / r->step[i]));
    printf("]}\n");
}

static void scale_print_text(const scale_report *r) {
    printf("Scaling estimate for %s (%zu parameters, %.1f MB of float32 gradients in %d "
           "buckets: %g MiB first, then %g MiB)\n\n",
           sc.net, r->info->learnable, r->grad_bytes / 1e6, r->nb, r->first, r->bucket);
    printf("Measured here (%d images a step, %d threads, CPU): forward %.3f s, backward "
           "%.3f s; buckets ready at (share of backward):",
           r->mb, r->threads, r->meas_f, r->meas_b);
    for (int b = 0; b < r->nb; b++) printf(" %.2f", r->meas_b > 0 ? r->ready[b] / r->meas_b : 0);
    printf("\n");
    printf("Assumed: one GPU computes %d images a step at %g TFLOP/s sustained on %.2f GFLOP "
           "an image: %.1f ms a step, backward from %.1f ms to %.1f ms; nodes of 8 GPUs, "
           "NVLink %g GB/s (%g us a step), InfiniBand %g GB/s a GPU (%g us a step); "
           "buckets reduced one after another; optimizer and input left out.\n\n",
           sc.batch, r->tflops, r->info->train_flops / 1e9, r->compute * 1e3, r->f * 1e3,
           r->b_end * 1e3, r->nv, r->a_nv, r->ib, r->a_ib);
    printf("  GPUs   step (ms)   all-reduce (ms)   exposed (ms)   efficiency   images/s\n");
    for (int i = 0; i < r->ngpus; i++)
        printf("  %4d   %9.2f   %15.2f   %12.2f   %9.1f%%   %8.0f\n", r->gpus[i], r->step[i] * 1e3,
               r->comm[i] * 1e3, r->exposed[i] * 1e3, 100 * r->eff[i],
               r->gpus[i] * sc.batch / r->step[i]);
    printf("\nFor comparison: Horovod reported about 90%% scaling efficiency on 512 GPUs "
           "(Inception V3, ResNet-101); TensorFlow's AlexNet scaled 75%% on 8 P100s.\n");
}

/* The --gpu-counts list (at most 32 counts) into gpus; -1 when malformed. */
static int scale_gpus(const char *list, int *gpus) {
    int n = 0;
    for (const char *p = list; *p && n < 32;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20 || (*end && *end != ',')) {
            fprintf(stderr, "%s scale: --gpu-counts: '%s': expected counts like 8,64,512\n", prog,
                    list);
            return -1;
        }
        gpus[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* Runs a step to warm up, then sc.steps timed ones, keeping each step's
 * forward and backward seconds and when its buckets were ready (keep, nb a
 * step). Returns the step with the median backward, or -1 on a failure. */
static int scale_measure(dsrt_net *net, const float *x, const int32_t *y, int mb,
                         scale_timeline *tl, double *keep, double *fwd, double *bwd) {
    int nb = tl->n;
    for (int k = -1; k < sc.steps; k++) {
        double t0 = now();
        int frc = dsrt_net_forward_backward(net, x, y, mb, NULL, NULL);
        if (frc != 0 && frc != DSRT_ENAN) { /* random data may overflow: the timing holds */
            fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
            return -1;
        }
        if (k < 0) continue;
        fwd[k] = tl->bwd_start - t0;
        bwd[k] = tl->bwd_end - tl->bwd_start;
        for (int b = 0; b < nb; b++) keep[(size_t)k * nb + b] = tl->ready[b] - tl->bwd_start;
    }
    int med = 0;
    for (int k = 0; k < sc.steps; k++) {
        int below = 0;
        for (int j = 0; j < sc.steps; j++) below += bwd[j] < bwd[k];
        if (below == sc.steps / 2) med = k;
    }
    return med;
}

/* The prediction for each GPU count of r, from the measured step (forward
 * meas_f, backward meas_b seconds) scaled to one GPU: the net's arithmetic
 * at r->tflops. */
static void scale_predict(scale_report *r, const dsrt_range *ranges, double meas_f, double meas_b) {
    int nb = r->nb;
    r->meas_f = meas_f;
    r->meas_b = meas_b;
    r->compute = r->info->train_flops * sc.batch / (r->tflops * 1e12);
    double scale = r->compute / (meas_f + meas_b);
    r->f = meas_f * scale;
    r->b_end = r->f + meas_b * scale;
    double bw_nv = r->nv * 1e9, bw_ib = r->ib * 1e9;
    r->grad_bytes = 0;
    for (int b = 0; b < nb; b++) r->grad_bytes += ranges[b].count * sizeof(float);
    for (int i = 0; i < r->ngpus; i++) {
        double done = 0, total = 0;
        for (int b = 0; b < nb; b++) {
            double ready = r->f + r->ready[b] * scale;
            double t = allreduce_s((double)ranges[b].count * sizeof(float), r->gpus[i], bw_nv,
                                   bw_ib, r->a_nv * 1e-6, r->a_ib * 1e-6);
            done = (done > ready ? done : ready) + t;
            total += t;
        }
        r->exposed[i] = done > r->b_end ? done - r->b_end : 0;
        r->comm[i] = total;
        r->step[i] = r->compute + r->exposed[i];
        r->eff[i] = r->compute / r->step[i];
    }
}

int cmd_scale(int argc, char **argv) {
    memset(&sc, 0, sizeof sc);
    sc.net = "alexnet";
    sc.batch = 128;
    sc.steps = 2;
    int rc = parse_options("scale", argc, argv, SCALE_OPTIONS, scale_usage);
    if (rc) return rc > 0 ? 0 : 2;
    scale_report r = {
        .tflops = 40, .nv = 450, .ib = 50, .a_nv = 5, .a_ib = 10, .bucket = 25, .first = 1};
    if (parse_double("scale", "tflops", sc.tflops, 1e-3, 1e6, &r.tflops) ||
        parse_double("scale", "nvlink", sc.nvlink, 1e-3, 1e6, &r.nv) ||
        parse_double("scale", "ib", sc.ib, 1e-3, 1e6, &r.ib) ||
        parse_double("scale", "alpha-nvlink", sc.alpha_nvlink, 0, 1e6, &r.a_nv) ||
        parse_double("scale", "alpha-ib", sc.alpha_ib, 0, 1e6, &r.a_ib) ||
        parse_double("scale", "bucket-size", sc.bucket, 1.0 / 1024, 4096, &r.bucket) ||
        parse_double("scale", "first-bucket-size", sc.first, 1.0 / 1024, 4096, &r.first))
        return 2;
    if ((r.ngpus = scale_gpus(sc.gpus ? sc.gpus : "8,64,512", r.gpus)) < 0) return 2;
    int builtin = dsrt_net_builtin(sc.net, NULL) != NULL;
    int is_alexnet = !strcmp(sc.net, "alexnet");
    char *text = NULL;
    if (!builtin) {
        char why[256];
        if (!(text = read_net_text(sc.net, why, sizeof why))) {
            return net_unknown("scale", sc.net, why);
        }
    }
    int classes = sc.classes ? sc.classes : is_alexnet ? 1000 : 10;
    int mb = r.mb = sc.measure_batch ? sc.measure_batch : is_alexnet ? 8 : 64;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = sc.threads ? sc.threads : (int)(ncpu > 0 ? ncpu : 1);
    no.device = DSRT_DEVICE_CPU;
    dsrt_net *net = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    dsrt_range *ranges = NULL;
    scale_timeline tl = {0};
    double *fwd = NULL, *bwd = NULL;
    int status = 1;
    if (dsrt_net_create(&net, builtin ? sc.net : text, 0, 0, 0, classes, &no) != 0) {
        fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
        goto out;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    size_t first_b = (size_t)(r.first * (1 << 20)), min_b = (size_t)(r.bucket * (1 << 20));
    int nb = r.nb = dsrt_net_buckets_sized(net, first_b, min_b, NULL, 0);
    size_t per = (size_t)info.channels * info.height * info.width;
    ranges = calloc((size_t)nb + 1, sizeof *ranges);
    tl.ready = calloc((size_t)nb + 1, sizeof *tl.ready);
    fwd = calloc((size_t)sc.steps, sizeof *fwd);
    bwd = calloc((size_t)sc.steps, sizeof *bwd);
    x = malloc((size_t)mb * per * sizeof *x);
    y = malloc((size_t)mb * sizeof *y);
    if (!ranges || !tl.ready || !fwd || !bwd || !x || !y) {
        fprintf(stderr, "%s scale: out of memory\n", prog);
        goto out;
    }
    tl.n = nb;
    dsrt_net_buckets_sized(net, first_b, min_b, ranges, nb);
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (size_t)mb * per; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) * (1.0f / 16777216.0f);
    }
    for (int i = 0; i < mb; i++) y[i] = (int32_t)(i % classes);
    dsrt_grad_hook hook = {first_b, min_b, scale_ready, scale_backward, &tl};
    if (dsrt_net_set_grad_hook(net, &hook) != 0) {
        fprintf(stderr, "%s scale: %s\n", prog, dsrt_last_error());
        goto out;
    }
    /* The timeline of the step with the median backward. */
    double *keep = calloc((size_t)nb * (size_t)sc.steps + 1, sizeof *keep);
    if (!keep) goto out;
    int med = scale_measure(net, x, y, mb, &tl, keep, fwd, bwd);
    if (med < 0) {
        free(keep);
        goto out;
    }
    r.threads = no.threads;
    r.info = &info;
    r.ready = keep + (size_t)med * nb;
    scale_predict(&r, ranges, fwd[med], bwd[med]);
    if (sc.json)
        scale_print_json(&r);
    else
        scale_print_text(&r);
    free(keep);
    status = 0;
out:
    dsrt_net_destroy(net);
    free(text);
    free(x);
    free(y);
    free(ranges);
    free(tl.ready);
    free(fwd);
    free(bwd);
    return status;
}
