/*
 * dstrain bench: times training steps (forward, backward, optimizer step)
 * of a network on random data with no loader: the measurement of the peer
 * benchmark torch_train_bench.py (warm-up steps excluded, median step time),
 * so that the two print comparable images/s.
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
    const char *net, *solver, *input;
    int batch, steps, warmup, threads, classes, json, no_fuse, profile, no_graphs, inference;
    uint64_t seed;
    device_args dev;
    onnx_args onnx;
} bench;

static const option BENCH_OPTIONS[] = {
    {"net", OPT_STR, &bench.net},
    {"batch", OPT_INT, &bench.batch},
    {"steps", OPT_INT, &bench.steps},
    {"warmup", OPT_INT, &bench.warmup},
    {"threads", OPT_INT, &bench.threads},
    {"num-classes", OPT_INT, &bench.classes},
    {"solver", OPT_STR, &bench.solver},
    {"seed", OPT_U64, &bench.seed},
    {"no-fuse", OPT_FLAG, &bench.no_fuse},
    {"no-cuda-graphs", OPT_FLAG, &bench.no_graphs},
    {"input", OPT_STR, &bench.input},
    {"profile", OPT_FLAG, &bench.profile},
    {"inference", OPT_FLAG, &bench.inference},
    DEVICE_OPTIONS(bench.dev),
    ONNX_OPTIONS(bench.onnx),
    {"json", OPT_FLAG, &bench.json},
    {NULL, 0, NULL},
};

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: %s bench [options]\n\n"
            "Times training steps (forward, backward, optimizer step) on random data, with no\n"
            "data loading: the median step time after the warm-up steps, as images/s. SGD with\n"
            "momentum 0.9, learning rate 0.01, L2 1e-4 unless --solver says otherwise.\n"
            "GFLOP counts the arithmetic of direct convolutions and matrix products (forward,\n"
            "backward data and weights); Winograd convolutions do less, so GFLOP/s can pass\n"
            "the machine's peak. On a GPU each step's batch (uint8 pixels, as the loader makes\n"
            "them for a GPU; --input f32 for float) is copied from pinned host memory while\n"
            "the step before computes, as in training, and each step is timed to the end of\n"
            "its work on the device. --profile adds a table of where a step's time\n"
            "goes, layer by layer (forward, backward, the optimizer, the idle gaps between\n"
            "layers), from as many steps again timed with device events on a GPU and the\n"
            "clock on the CPU. --inference times the forward pass of inference instead\n"
            "(what classify and eval run on a batch), a step being one batch.\n\n"
            "options:\n",
            prog);
    print_options(f, "bench", BENCH_OPTIONS);
}

/* The per-layer profile of net (dstrain bench --profile): a table on out,
 * or with json the object's members after a comma (on the line). */
static void print_profile(dsrt_net *net, int json) {
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    dsrt_layer_profile *lp = calloc((size_t)info.layers, sizeof *lp);
    dsrt_net_profile p;
    if (!lp || dsrt_net_profile_read(net, &p, lp, info.layers) < 0) {
        fprintf(stderr, "%s bench: profile: %s\n", prog, lp ? dsrt_last_error() : "out of memory");
        free(lp);
        return;
    }
    if (json) {
        char b[5][32];
        printf(", \"profile\": {\"steps\": %lld, \"timer\": \"%s\", \"step_ms\": %s, "
               "\"layers_ms\": %s, \"optimizer_ms\": %s, \"gaps_ms\": %s, "
               "\"gaps_per_step\": %s, \"graph_steps\": %lld, \"captures\": %lld, "
               "\"cuda_graphs\": %s, \"fused_library\": %d, \"fused_kernel\": %d, \"layers\": [",
               (long long)p.steps, p.device_events ? "device events" : "host clock",
               tool_json_number(b[0], "%.4f", p.step_ms),
               tool_json_number(b[1], "%.4f", p.layers_ms),
               tool_json_number(b[2], "%.4f", p.optimizer_ms),
               tool_json_number(b[3], "%.4f", p.gaps_ms),
               tool_json_number(b[4], "%.1f", p.gaps_per_step), (long long)p.graph_steps,
               (long long)p.captures, p.graphs ? "true" : "false", p.fused_library, p.fused_kernel);
        for (int i = 0; i < info.layers; i++) {
            printf("%s{\"name\": ", i ? ", " : "");
            tool_json_string(stdout, lp[i].name);
            printf(", \"type\": ");
            tool_json_string(stdout, lp[i].type);
            printf(", \"forward_ms\": %s, \"backward_ms\": %s, \"relu_fused\": %d}",
                   tool_json_number(b[0], "%.4f", lp[i].forward_ms),
                   tool_json_number(b[1], "%.4f", lp[i].backward_ms), lp[i].relu_fused);
        }
        printf("]");
        if (p.note && *p.note) {
            printf(", \"note\": ");
            tool_json_string(stdout, p.note);
        }
        printf("}");
        free(lp);
        return;
    }
    double total = p.layers_ms + p.optimizer_ms;
    printf("\nprofile: %lld steps timed by %s\n", (long long)p.steps,
           p.device_events ? "device events" : "the host's clock");
    printf("  %-16s %-15s %10s %10s %7s\n", "layer", "type", "fwd ms", "bwd ms", "share");
    for (int i = 0; i < info.layers; i++) {
        if (i > 0 && lp[i].forward_ms == 0 && lp[i].backward_ms == 0) continue; /* fused away */
        char type[24];
        snprintf(type, sizeof type, "%s%s", lp[i].type, lp[i].relu_fused ? "+relu" : "");
        printf("  %-16s %-15s %10.3f %10.3f %6.1f%%\n", lp[i].name, type, lp[i].forward_ms,
               lp[i].backward_ms,
               total > 0 ? 100.0 * (lp[i].forward_ms + lp[i].backward_ms) / total : 0.0);
    }
    printf("  %-16s %-15s %10.3f %10s %6.1f%%\n", "optimizer", "", p.optimizer_ms, "",
           total > 0 ? 100.0 * p.optimizer_ms / total : 0.0);
    printf("  a step: %.3f ms from its first layer to its last, %.3f ms in layers; %.3f ms of "
           "gaps between layers (%.0f intervals)\n",
           p.step_ms, p.layers_ms, p.gaps_ms, p.gaps_per_step);
    if (p.device_events)
        printf("  %lld of %lld steps replayed from CUDA graphs (%lld recordings%s); %d layers "
               "fused by cuDNN, %d by a dsrt kernel\n",
               (long long)p.graph_steps, (long long)p.steps, (long long)p.captures,
               p.graphs ? "" : ", graphs off", p.fused_library, p.fused_kernel);
    if (p.note && *p.note) printf("  note: %s\n", p.note);
    free(lp);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and returns its median. */
static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The 95th percentile of sorted v (nearest rank: the smallest value that
 * 95% of them do not pass). */
static double p95_of(const double *v, int n) {
    int k = (int)ceil(0.95 * n) - 1;
    return v[k < 0 ? 0 : k];
}

/* The --solver option's optimizer defaults; -1 when unknown. */
static int bench_solver(const char *name, dsrt_optimizer_options *oo) {
    if (!strcmp(name, "sgdm"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    else if (!strcmp(name, "adam"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    else if (!strcmp(name, "rmsprop"))
        *oo = dsrt_optimizer_defaults(DSRT_SOLVER_RMSPROP);
    else {
        fprintf(stderr, "%s bench: --solver: '%s' is not one of sgdm, adam, rmsprop\n", prog, name);
        return -1;
    }
    return 0;
}

/* Uniform [0, 1) pixels and uniform labels, like torch.rand/randint:
 * as floats, or as uint8 scaled by 1/255 on the device. */
static void bench_fill(float *x, int32_t *y, int batch, size_t per, int u8, int classes) {
    uint64_t s = bench.seed * 0x9e3779b97f4a7c15ULL + 1;
    uint8_t *px = (uint8_t *)x;
    for (size_t i = 0; i < (size_t)batch * per; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        if (u8)
            px[i] = (uint8_t)(s >> 56);
        else
            x[i] = (float)(s >> 40) * (1.0f / 16777216.0f);
    }
    for (int i = 0; i < batch; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        y[i] = (int32_t)(s % (uint64_t)classes);
    }
}

/* The warm-up and the timed steps: each step's seconds, and the optimizer's
 * share of it; the first step's (the plan's) in *plan_t. -1 on a failure. */
static int bench_steps(dsrt_net *net, dsrt_optimizer *opt, const dsrt_net_batch *in, double *times,
                       double *opt_times, double *plan_t, float *loss) {
    for (int step = 0; step < bench.warmup + bench.steps; step++) {
        double t0 = now();
        /* The next step's batch is staged while this one computes. */
        int rc = dsrt_net_train_start(net, in);
        if (rc == 0 && dsrt_net_stage(net, in) < 0) rc = -1;
        if (rc == 0) rc = dsrt_net_train_finish(net, loss, NULL);
        double t1 = now();
        if (rc == 0) rc = dsrt_optimizer_step(opt, net, 0);
        if (rc == 0) rc = dsrt_net_sync(net);
        if (rc != 0) {
            fprintf(stderr, "%s bench: step %d: %s\n", prog, step, dsrt_last_error());
            return -1;
        }
        double t = now() - t0;
        if (step == 0) *plan_t = t;
        if (step >= bench.warmup) {
            times[step - bench.warmup] = t;
            opt_times[step - bench.warmup] = t - (t1 - t0);
        }
    }
    return 0;
}

/* --inference: the warm-up and the timed batches through the forward pass
 * of inference, the scores read back; -1 on a failure. */
static int bench_inference(dsrt_net *net, const float *x, int batch, float *scores, double *times,
                           double *plan_t) {
    for (int step = 0; step < bench.warmup + bench.steps; step++) {
        double t0 = now();
        if (dsrt_net_predict(net, x, batch, scores, NULL, NULL, NULL) != 0) {
            fprintf(stderr, "%s bench: batch %d: %s\n", prog, step, dsrt_last_error());
            return -1;
        }
        double t = now() - t0;
        if (step == 0) *plan_t = t;
        if (step >= bench.warmup) times[step - bench.warmup] = t;
    }
    return 0;
}

/* The profile: as many steps again, timed layer by layer (their timing
 * costs a little, so they are not the steps measured). -1 on a failure. */
static int bench_profile(dsrt_net *net, dsrt_optimizer *opt, const dsrt_net_batch *in,
                         float *loss) {
    int prc = dsrt_net_profile_start(net);
    for (int step = 0; prc == 0 && step < bench.steps; step++) {
        prc = dsrt_net_train_start(net, in);
        if (prc == 0 && dsrt_net_stage(net, in) < 0) prc = -1;
        if (prc == 0) prc = dsrt_net_train_finish(net, loss, NULL);
        if (prc == 0) prc = dsrt_optimizer_step(opt, net, 0);
        if (prc == 0) prc = dsrt_net_sync(net);
    }
    dsrt_net_profile_stop(net);
    if (prc != 0) {
        fprintf(stderr, "%s bench: profile: %s\n", prog, dsrt_last_error());
        return -1;
    }
    return 0;
}

/* --net as a description: a file's text in *text (NULL for a built-in
 * network or an ONNX model). Returns 0, or 2 (reported) when it is none of
 * them. */

static int bench_net_text(int builtin, int onnx, char **text) {
    *text = NULL;
    if (builtin || onnx) return 0;
    char why[256];
    *text = read_net_text(bench.net, why, sizeof why);
    return *text ? 0 : net_unknown("bench", bench.net, why);
}

/* What a benchmark measured, for its report. */
typedef struct {
    int batch, threads, u8;
    double median_s, min_s, p95_s; /* a step's */
    double opt_median_s;           /* the optimizer's part of a step */
    double first_s;                /* the first step, which plans */
    float loss;
} bench_result;

/* Prints a benchmark's figures: one JSON object with --json, else lines. */
static void bench_report(dsrt_net *net, const dsrt_net_info *info, const bench_result *r) {
    double ips = r->batch / r->median_s,
           gflop = (bench.inference ? info->forward_flops : info->train_flops) * r->batch * 1e-9;
    /* The activations' memory, where the backend says it. */
    size_t held = 0, each = 0;
    int mem = dsrt_net_activation_bytes(net, r->batch, !bench.inference, &held, &each) == 0;
    if (bench.json) {
        char b[9][32];
        printf("{\"tool\": \"dstrain bench\", \"net\": ");
        tool_json_string(stdout, bench.net);
        printf(", \"mode\": \"%s\"", bench.inference ? "inference" : "training");
        printf(", \"batch\": %d, \"threads\": %d, "
               "\"steps\": %d, \"warmup\": %d, \"solver\": \"%s\", \"backend\": \"%s\", "
               "\"device\": %d, \"precision\": \"%s\", \"input\": \"%s\", "
               "\"params\": %zu, \"images_per_s\": %s, \"ms_per_step\": %s, "
               "\"ms_per_step_min\": %s, \"ms_per_step_p95\": %s, \"ms_optimizer\": %s, "
               "\"ms_first_step\": %s, "
               "\"gflop_per_step\": %s, \"gflops\": %s, \"loss\": %s",
               r->batch, r->threads, bench.steps, bench.warmup, bench.solver, info->backend,
               info->device, dsrt_precision_name(info->precision), r->u8 ? "u8" : "f32",
               info->learnable, tool_json_number(b[0], "%.1f", ips),
               tool_json_number(b[1], "%.3f", 1e3 * r->median_s),
               tool_json_number(b[2], "%.3f", 1e3 * r->min_s),
               tool_json_number(b[8], "%.3f", 1e3 * r->p95_s),
               tool_json_number(b[3], "%.3f", 1e3 * r->opt_median_s),
               tool_json_number(b[4], "%.1f", 1e3 * r->first_s),
               tool_json_number(b[5], "%.3f", gflop),
               tool_json_number(b[6], "%.1f", gflop / r->median_s),
               tool_json_number(b[7], "%.4f", (double)r->loss));
        if (mem)
            printf(", \"activation_mb\": %.1f, \"activation_mb_unshared\": %.1f", held / 1e6,
                   each / 1e6);
        if (bench.profile) print_profile(net, 1);
        printf("}\n");
    } else {
        printf("%s: %sbatch %d, %d threads, %s (%s), %zu parameters\n", bench.net,
               bench.inference ? "inference, " : "", r->batch, r->threads, info->backend,
               dsrt_precision_name(info->precision), info->learnable);
        printf("  %.1f images/s (median %.2f ms/step over %d steps, min %.2f, p95 %.2f; first "
               "step %.0f ms)\n",
               ips, 1e3 * r->median_s, bench.steps, 1e3 * r->min_s, 1e3 * r->p95_s,
               1e3 * r->first_s);
        if (bench.inference)
            printf("  %.2f GFLOP/step, %.1f GFLOP/s\n", gflop, gflop / r->median_s);
        else
            printf("  %.2f GFLOP/step, %.1f GFLOP/s; the optimizer takes %.2f ms of a step\n",
                   gflop, gflop / r->median_s, 1e3 * r->opt_median_s);
        if (mem && held < each)
            printf("  activations %.1f MB (%.1f MB without reuse of dead ones)\n", held / 1e6,
                   each / 1e6);
        else if (mem)
            printf("  activations %.1f MB\n", held / 1e6);
        if (bench.profile) print_profile(net, 0);
    }
}

int cmd_bench(int argc, char **argv) {
    bench.net = "digits";
    bench.solver = "sgdm";
    bench.steps = 20;
    bench.warmup = 3;
    int rc = parse_options("bench", argc, argv, BENCH_OPTIONS, bench_usage);
    if (rc) return rc > 0 ? 0 : 2;

    dsrt_optimizer_options oo;
    if (bench_solver(bench.solver, &oo)) return 2;
    if (bench.inference && (bench.profile || bench.input)) {
        fprintf(stderr, "%s bench: --inference takes float batches and has no --profile\n", prog);
        return 2;
    }
    if (bench.input && strcmp(bench.input, "u8") && strcmp(bench.input, "f32")) {
        fprintf(stderr, "%s bench: --input: '%s' is not one of u8, f32\n", prog, bench.input);
        return 2;
    }
    int builtin = dsrt_net_builtin(bench.net, NULL) != NULL;
    int is_alexnet = !strcmp(bench.net, "alexnet"),
        onnx = is_onnx_file(bench.net) || is_model_file(bench.net);
    char *text;
    if ((rc = bench_net_text(builtin, onnx, &text))) return rc;
    if ((rc = onnx_flags_alone("bench", &bench.onnx, bench.net, NULL))) {
        free(text);
        return rc;
    }
    int batch = bench.batch ? bench.batch : is_alexnet ? 32 : builtin ? 128 : 32;
    int classes = bench.classes ? bench.classes : is_alexnet ? 55 : 10;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = bench.threads ? bench.threads : (int)(ncpu > 0 ? ncpu : 1);

    dsrt_net_options no = dsrt_net_defaults();
    no.threads = threads;
    no.seed = bench.seed;
    if (bench.no_fuse) no.fuse = 0;
    no.cuda_graphs = !bench.no_graphs;
    if ((rc = resolve_device_args("bench", &bench.dev, &no, NULL))) {
        free(text);
        return rc;
    }
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    double *times = NULL, *opt_times = NULL;
    int status = 1;
    if (onnx) {
        if ((status = load_model("bench", "--net", bench.net, &bench.onnx, &no, &net))) goto out;
        status = 1;
    } else if (dsrt_net_create(&net, builtin ? bench.net : text, 0, 0, 0, classes, &no) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (!bench.inference && dsrt_optimizer_create(&opt, net, &oo) != 0) {
        fprintf(stderr, "%s bench: %s\n", prog, dsrt_last_error());
        goto out;
    }
    size_t per = (size_t)info.channels * info.height * info.width;
    int u8 = bench.input ? !strcmp(bench.input, "u8") : info.device >= 0;
    x = dsrt_pinned_alloc((size_t)batch * per * sizeof *x, info.device);
    y = malloc((size_t)batch * sizeof *y);
    times = malloc((size_t)bench.steps * sizeof *times);
    opt_times = malloc((size_t)bench.steps * sizeof *opt_times);
    if (!x || !y || !times || !opt_times) {
        fprintf(stderr, "%s bench: out of memory\n", prog);
        goto out;
    }
    if (bench.inference) u8 = 0;
    bench_fill(x, y, batch, per, u8, info.classes);
    double plan_t = 0;
    float loss = 0;
    if (bench.inference) {
        float *scores = malloc((size_t)batch * (size_t)info.classes * sizeof *scores);
        int irc = scores ? bench_inference(net, x, batch, scores, times, &plan_t) : -1;
        free(scores);
        if (irc) goto out;
        bench_result r = {.batch = batch, .threads = threads, .first_s = plan_t};
        r.median_s = median_of(times, bench.steps);
        r.min_s = times[0];
        r.p95_s = p95_of(times, bench.steps);
        bench_report(net, &info, &r);
        status = 0;
        goto out;
    }
    dsrt_net_batch in = {.data = x,
                         .layout = u8 ? DSRT_INPUT_U8_NHWC : DSRT_INPUT_F32_NCHW,
                         .labels = y,
                         .n = batch};
    for (int c = 0; c < 4; c++) in.sub[c] = 0, in.div[c] = 255;
    if (bench_steps(net, opt, &in, times, opt_times, &plan_t, &loss)) goto out;
    if (bench.profile && bench_profile(net, opt, &in, &loss)) goto out;
    bench_result r = {
        .batch = batch, .threads = threads, .u8 = u8, .first_s = plan_t, .loss = loss};
    r.median_s = median_of(times, bench.steps); /* sorts times: times[0] is the fastest */
    r.opt_median_s = median_of(opt_times, bench.steps);
    r.min_s = times[0];
    r.p95_s = p95_of(times, bench.steps);
    bench_report(net, &info, &r);
    status = 0;
out:
    free(times);
    free(opt_times);
    dsrt_pinned_free(x);
    free(y);
    free(text);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    return status;
}
