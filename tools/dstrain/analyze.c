/*
 * dstrain analyze: a network layer by layer, as MATLAB's analyzeNetwork
 * shows it: name, type, inputs, output shape and learnables.
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
    const char *net;
    int classes, json;
    onnx_args onnx;
} analyze;

static const option ANALYZE_OPTIONS[] = {
    {"net", OPT_STR, &analyze.net},
    {"num-classes", OPT_INT, &analyze.classes},
    ONNX_OPTIONS(analyze.onnx),
    {"json", OPT_FLAG, &analyze.json},
    {NULL, 0, NULL},
};

static void analyze_usage(FILE *f) {
    fprintf(f,
            "usage: %s analyze --net NAME|FILE [--classes N] [--json]\n\n"
            "Builds the network (refusing a bad description with the messages train gives) and\n"
            "prints it layer by layer, as MATLAB's analyzeNetwork: name, type, the layers it\n"
            "takes, its output (height x width x channels) and learnables, then the totals.\n\n"
            "options:\n",
            prog);
    print_options(f, "analyze", ANALYZE_OPTIONS);
}

int cmd_analyze(int argc, char **argv) {
    int rc = parse_options("analyze", argc, argv, ANALYZE_OPTIONS, analyze_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (!analyze.net) {
        fprintf(stderr, "%s analyze: --net is required (see %s analyze --help)\n", prog, prog);
        return 2;
    }
    const char *name = analyze.net;
    if ((rc = onnx_flags_alone("analyze", &analyze.onnx, name, NULL))) return rc;
    /* torchvision's nets count their learnables with ImageNet's 1000. */
    int imagenet = !strcmp(name, "resnet18") || !strcmp(name, "resnet50") ||
                   !strncmp(name, "mobilenet_", 10) || !strcmp(name, "efficientnet_b0");
    int classes = analyze.classes            ? analyze.classes
                  : imagenet                 ? 1000
                  : !strcmp(name, "alexnet") ? 55
                                             : 10;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    char *text = NULL;
    if (is_model_file(name) || is_onnx_file(name)) {
        if ((rc = load_model("analyze", name, name, &analyze.onnx, &no, &net))) return rc;
    } else {
        if (!dsrt_net_builtin(name, NULL)) {
            char why[256];
            if (!(text = read_net_text(name, why, sizeof why))) {
                return net_unknown("analyze", name, why);
            }
        }
        if (dsrt_net_create(&net, text ? text : name, 0, 0, 0, classes, &no) != 0) {
            fprintf(stderr, "%s analyze: %s\n", prog, dsrt_last_error());
            free(text);
            return 2;
        }
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    /* The columns as wide as their longest entry (imported models' layer
     * names run long); the inputs, of any length, last. */
    int wname = (int)strlen("layer"), wtype = (int)strlen("type");
    for (int i = 0; i < info.layers; i++) {
        dsrt_layer_info l;
        dsrt_net_layer(net, i, &l);
        if ((int)strlen(l.name) > wname) wname = (int)strlen(l.name);
        if ((int)strlen(l.type) > wtype) wtype = (int)strlen(l.type);
    }
    if (analyze.json) {
        printf("{\"net\": ");
        tool_json_string(stdout, name);
        printf(", \"layers\": [");
    } else
        printf("%s: %d layers, %d classes, input %dx%dx%d\n\n  %-4s %-*s %-*s %-14s %-10s %s\n",
               name, info.layers, info.classes, info.height, info.width, info.channels, "#", wname,
               "layer", wtype, "type", "output", "learnables", "inputs");
    for (int i = 0; i < info.layers; i++) {
        dsrt_layer_info l;
        dsrt_net_layer(net, i, &l);
        char inputs[512] = "", out[48];
        size_t at = 0;
        for (int k = 0; k < l.n_inputs && at < sizeof inputs; k++) {
            dsrt_layer_info in;
            dsrt_net_layer(net, l.inputs[k], &in);
            at += (size_t)snprintf(inputs + at, sizeof inputs - at, "%s%s", k ? "," : "", in.name);
        }
        snprintf(out, sizeof out, "%dx%dx%d", l.out_height, l.out_width, l.out_channels);
        size_t learn = l.weights_count + l.bias_count;
        int fused_away = 0;
        if (i > 0 && (!strcmp(l.type, "relu") || !strcmp(l.type, "leakyrelu"))) {
            dsrt_layer_info p;
            dsrt_net_layer(net, l.inputs[0], &p);
            /* The layer it takes computes it (its only taker). */
            fused_away = p.fused && strcmp(p.type, "add") != 0;
        }
        if (analyze.json) {
            printf("%s{\"name\": ", i ? ", " : "");
            tool_json_string(stdout, l.name);
            printf(", \"type\": ");
            tool_json_string(stdout, l.type);
            printf(", \"inputs\": ");
            tool_json_string(stdout, inputs);
            printf(", \"output\": [%d, %d, %d], \"learnables\": %zu}", l.out_height, l.out_width,
                   l.out_channels, learn);
        } else
            printf("  %-4d %-*s %-*s %-14s %-10zu %s%s\n", i, wname, l.name, wtype, l.type, out,
                   learn, l.n_inputs ? inputs : "-",
                   fused_away ? "   (computed by the layer it takes)" : "");
    }
    char gf[32];
    if (analyze.json)
        printf("], \"learnables\": %zu, \"state\": %zu, \"forward_gflop\": %s}\n", info.learnable,
               info.state, tool_json_number(gf, "%.4f", info.forward_flops * 1e-9));
    else
        printf("\n  total: %zu learnables, %zu state values (running and input statistics), %.3f "
               "GFLOP "
               "forward an image\n",
               info.learnable, info.state, info.forward_flops * 1e-9);
    dsrt_net_destroy(net);
    free(text);
    return 0;
}
