/*
 * dstrain eval: accuracy, per-class accuracy and the confusion matrix of a
 * saved model on labelled data, read by the pipeline.
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
    const char *model, *data, *cpus, *bad_list;
    int batch, threads, workers, json, no_pin, depth, drop_empty_classes, shuffle_buffer;
    const char *order;
    remote_opts remote;
    device_args dev;
    onnx_args onnx;
} ev;

static const option EVAL_OPTIONS[] = {
    {"model", OPT_STR, &ev.model},
    {"data", OPT_STR, &ev.data},
    {"batch", OPT_INT, &ev.batch},
    {"threads", OPT_INT, &ev.threads},
    {"workers", OPT_INT, &ev.workers},
    {"cpus", OPT_STR, &ev.cpus},
    {"no-pin", OPT_FLAG, &ev.no_pin},
    DEVICE_OPTIONS(ev.dev),
    {"io-depth", OPT_INT, &ev.depth},
    REMOTE_OPTIONS(ev.remote),
    {"bad-list", OPT_STR, &ev.bad_list},
    {"drop-empty-classes", OPT_FLAG, &ev.drop_empty_classes},
    {"order", OPT_STR, &ev.order},
    ONNX_OPTIONS(ev.onnx),
    ONNX_CLASSES_OPTION(ev.onnx),
    {"json", OPT_FLAG, &ev.json},
    {NULL, 0, NULL},
};

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: %s eval --model FILE --data DIR [options]\n\n"
            "Runs a trained model over labelled images and reports the accuracy, the accuracy\n"
            "of each class and the confusion matrix (rows: true class, columns: predicted).\n"
            "The data's classes are matched to the model's by name. Each image that can be\n"
            "read counts once; those that cannot are left out and named (the first %d;\n"
            "--bad-list writes all).\n\noptions:\n",
            prog, TOOL_BAD_SHOWN);
    print_options(f, "eval", EVAL_OPTIONS);
}

static void eval_print_json(const dsrt_net *net, const dsrt_eval_result *r,
                            const tool_bad_list *bad, const char *shown) {
    int C = r->classes;
    char name[256];
    printf("{\"model\": ");
    tool_json_string(stdout, ev.model);
    printf(", \"data\": ");
    tool_json_string(stdout, shown);
    char b1[32], b2[32], b3[32], b4[32];
    printf(", \"images\": %llu, \"correct\": %llu, \"accuracy\": %s, \"loss\": %s, "
           "\"seconds\": %s, \"images_per_s\": %s, ",
           (unsigned long long)r->images, (unsigned long long)r->correct, jnum(b1, r->accuracy),
           jnum(b2, r->loss), tool_json_number(b3, "%.3f", r->seconds),
           tool_json_number(b4, "%.1f", r->images_per_s));
    printf("\"not_finite\": %llu, \"classes\": [", (unsigned long long)r->not_finite);
    for (int c = 0; c < C; c++) {
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            snprintf(name, sizeof name, "%d", c);
        printf(c ? ", " : "");
        tool_json_string(stdout, name);
    }
    printf("], \"per_class\": [");
    for (int c = 0; c < C; c++) {
        uint64_t n = 0;
        for (int p = 0; p < C; p++) n += r->confusion[(size_t)c * C + p];
        printf("%s%s", c ? ", " : "",
               n ? jnum(b1, (double)r->confusion[(size_t)c * C + c] / (double)n) : "null");
    }
    printf("], \"confusion\": [");
    for (int c = 0; c < C; c++) {
        printf("%s[", c ? ", " : "");
        for (int p = 0; p < C; p++)
            printf("%s%llu", p ? ", " : "", (unsigned long long)r->confusion[(size_t)c * C + p]);
        printf("]");
    }
    printf("]");
    tool_bad_json(stdout, "", bad, r->skipped);
    printf("}\n");
}

static void eval_print_text(const dsrt_net *net, const dsrt_eval_result *r,
                            const tool_bad_list *bad, const char *shown) {
    int C = r->classes;
    char name[256];
    printf("%s on %s: accuracy %.2f%% (%llu of %llu), loss %.4f, %.0f images/s\n", ev.model, shown,
           100 * r->accuracy, (unsigned long long)r->correct, (unsigned long long)r->images,
           r->loss, r->images_per_s);
    if (r->not_finite)
        printf("%llu image%s got scores that are not finite (NaN or infinite) and count%s as "
               "wrong\n",
               (unsigned long long)r->not_finite, r->not_finite == 1 ? "" : "s",
               r->not_finite == 1 ? "s" : "");
    if (r->bad_samples)
        printf("%llu image%s could not be read and %s left out (see stderr)\n",
               (unsigned long long)r->bad_samples, r->bad_samples == 1 ? "" : "s",
               r->bad_samples == 1 ? "is" : "are");
    printf("\nper class:\n");
    for (int c = 0; c < C; c++) {
        uint64_t n = 0;
        for (int p = 0; p < C; p++) n += r->confusion[(size_t)c * C + p];
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            snprintf(name, sizeof name, "%d", c);
        printf("  %3d ", c);
        print_padded(name, 20);
        if (n)
            printf(" %7.2f%%  (%llu images)\n",
                   100.0 * (double)r->confusion[(size_t)c * C + c] / (double)n,
                   (unsigned long long)n);
        else
            printf("       -  (no images)\n");
    }
    printf("\nconfusion matrix (rows: true class, columns: predicted):\n      ");
    for (int p = 0; p < C; p++) printf(" %6d", p);
    printf("\n");
    for (int c = 0; c < C; c++) {
        printf("  %3d ", c);
        for (int p = 0; p < C; p++)
            printf(" %6llu", (unsigned long long)r->confusion[(size_t)c * C + p]);
        printf("\n");
    }
    fflush(stdout);
    tool_bad_print("dstrain eval", "", bad, r->skipped, 1, ev.bad_list);
}

int cmd_eval(int argc, char **argv) {
    memset(&ev, 0, sizeof ev);
    ev.batch = 128;
    int rc = parse_options("eval", argc, argv, EVAL_OPTIONS, eval_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!ev.model || !ev.data) {
        fprintf(stderr, "%s eval: --model FILE and --data DIR are required (see %s eval --help)\n",
                prog, prog);
        return 2;
    }
    dsrt_net_options no = dsrt_net_defaults();
    if ((rc = resolve_device_args("eval", &ev.dev, &no, NULL))) return rc;
    dsrt_datastore *ds = NULL;
    dsrt_net *net = NULL;
    dsrt_eval_result r = {0};
    tool_bad_list bad = {0};
    int status = 1;
    char why[512];
    if (ev.bad_list && (tool_check_output(ev.bad_list, 0, why, sizeof why) ||
                        !(bad.out = tool_open_output(ev.bad_list, why, sizeof why)))) {
        fprintf(stderr, "%s eval: --bad-list %s: %s\n", prog, ev.bad_list, why);
        return 2;
    }
    if ((status = load_model("eval", "--model", ev.model, &ev.onnx, &no, &net))) goto out;
    status = 1;
    data_args da = {ev.drop_empty_classes, ev.order, 0, &ev.remote, NULL, dsrt_mix_defaults()};
    if (open_data("eval", "--data", &ev.data, 1, &da, &ds)) goto out;
    dsrt_eval_options eo = dsrt_eval_defaults();
    eo.batch = ev.batch;
    eo.compute_threads = ev.threads;
    eo.workers = (unsigned)ev.workers;
    eo.cpus = ev.cpus;
    eo.pin = !ev.no_pin;
    eo.read_depth = (unsigned)ev.depth;
    remote_set(&eo.remote, &ev.remote);
    if (dsrt_evaluate(net, ds, &eo, &r) != 0) {
        fprintf(stderr, "%s %s\n", prog, dsrt_last_error());
        goto out;
    }
    for (uint64_t i = 0; i < r.bad_samples; i++) tool_bad_add(&bad, &r.bad[i]);
    char shown[4096];
    tool_shown(ev.data, shown, sizeof shown);
    if (ev.json)
        eval_print_json(net, &r, &bad, shown);
    else
        eval_print_text(net, &r, &bad, shown);
    status = 0;
    if (r.not_finite) {
        fprintf(stderr,
                "%s eval: %s: the model's scores are not finite (NaN or infinite) for %llu of %llu "
                "images: its weights or input statistics are broken\n",
                prog, ev.model, (unsigned long long)r.not_finite, (unsigned long long)r.images);
        status = 1;
    }
out:
    if (bad.out && (bad.write_failed | ferror(bad.out) | fclose(bad.out))) {
        fprintf(stderr, "%s eval: --bad-list %s: the list could not be written in full\n", prog,
                ev.bad_list);
        if (status == 0) status = 1;
    }
    tool_bad_free(&bad);
    dsrt_eval_result_free(&r);
    dsrt_datastore_close(ds);
    dsrt_net_destroy(net);
    return status;
}
