/*
 * dstrain export: a dsrt model or checkpoint as an ONNX model.
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
    const char *output;
    int opset;
} ex;

static const option EXPORT_OPTIONS[] = {
    {"output", OPT_STR, &ex.output},
    {"opset", OPT_INT, &ex.opset},
    {NULL, 0, NULL},
};

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: %s export MODEL --output MODEL.onnx [--opset N]\n\n"
            "Writes a dsrt model or checkpoint as an ONNX model: its inference graph (batch\n"
            "normalisation with the running statistics, dropout removed, the softmax output\n"
            "\"probabilities\"), taking \"pixels\", float32 NCHW images of the model's size\n"
            "and channels with values 0 to 255 as files hold them (the input normalisation\n"
            "is the model's first nodes), any batch size; the class names are in its\n"
            "metadata_props (\"classes\", one a line).\n\n"
            "options:\n",
            prog);
    print_options(f, "export", EXPORT_OPTIONS);
}

int cmd_export(int argc, char **argv) {
    const char *model = take_positional(&argc, argv, EXPORT_OPTIONS);
    int rc = parse_options("export", argc, argv, EXPORT_OPTIONS, export_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (model_and_output("export", "MODEL", model, ex.output) != 0) return 2;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    if (dsrt_model_load(&net, model, &no) != 0) {
        fprintf(stderr, "%s export: %s\n", prog, dsrt_last_error());
        return 1;
    }
    dsrt_onnx_export_options o = dsrt_onnx_export_defaults();
    if (ex.opset) o.opset = ex.opset;
    rc = dsrt_onnx_export(net, ex.output, &o);
    if (rc)
        fprintf(stderr, "%s export: %s\n", prog, dsrt_last_error());
    else
        printf("%s -> %s (opset %d)\n", model, ex.output, o.opset);
    dsrt_net_destroy(net);
    return rc ? 1 : 0;
}
