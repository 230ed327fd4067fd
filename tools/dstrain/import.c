/*
 * dstrain import: an ONNX model as a dsrt model file, its preprocessing in
 * the input layer.
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
    int json;
    onnx_args onnx;
} im;

static const option IMPORT_OPTIONS[] = {
    {"output", OPT_STR, &im.output}, ONNX_OPTIONS(im.onnx), ONNX_CLASSES_OPTION(im.onnx),
    {"json", OPT_FLAG, &im.json},    {NULL, 0, NULL},
};

static void import_usage(FILE *f) {
    fprintf(f,
            "usage: %s import MODEL.onnx --output MODEL.dsrt [options]\n\n"
            "Imports an ONNX model (opsets 7 to 21: Conv, Gemm, MatMul with its bias Add, Relu,\n"
            "LeakyRelu, MaxPool, AveragePool, GlobalAveragePool, BatchNormalization, LRN,\n"
            "Dropout, Flatten, Reshape to 2-D, Softmax, Add, Concat, Identity, Constant) as a\n"
            "dsrt model file, which train, eval and classify take like any other. Anything\n"
            "else is refused, naming the node, its operator and the opset. The model's\n"
            "preprocessing goes into the input layer, so that the model gets raw images as\n"
            "it expects them: --preprocess torchvision for torchvision's models, or\n"
            "--input-scale, --mean and --std. A model that ends in logits gets dsrt's\n"
            "softmax. The --net, --model and --transfer options of the other commands take\n"
            "an ONNX model directly too, with the same options.\n\n"
            "options:\n",
            prog);
    print_options(f, "import", IMPORT_OPTIONS);
}

int cmd_import(int argc, char **argv) {
    const char *model = take_positional(&argc, argv, IMPORT_OPTIONS);
    int rc = parse_options("import", argc, argv, IMPORT_OPTIONS, import_usage);
    if (rc) return rc > 0 ? 0 : 2;
    if (model_and_output("import", "MODEL.onnx", model, im.output) != 0) return 2;
    if (is_onnx_file(im.output)) {
        fprintf(stderr,
                "%s import: --output %s: import writes a dsrt model file, which a .onnx name "
                "would have read back as ONNX (export writes ONNX)\n",
                prog, im.output);
        return 2;
    }
    dsrt_onnx_import_options o;
    char **names;
    if ((rc = onnx_resolve("import", &im.onnx, &o, &names))) return rc;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    rc = dsrt_onnx_import(&net, model, &o, &no);
    free_names(names);
    if (rc) {
        fprintf(stderr, "%s import: %s\n", prog, dsrt_last_error());
        return 1;
    }
    if (dsrt_model_save(im.output, net) != 0) {
        fprintf(stderr, "%s import: %s\n", prog, dsrt_last_error());
        dsrt_net_destroy(net);
        return 1;
    }
    dsrt_net_info info;
    dsrt_net_get_info(net, &info);
    if (im.json) {
        printf("{\"model\": ");
        tool_json_string(stdout, model);
        printf(", \"output\": ");
        tool_json_string(stdout, im.output);
        printf(", \"layers\": %d, \"input\": [%d, %d, %d], \"classes\": %d, \"learnables\": "
               "%zu}\n",
               info.layers, info.height, info.width, info.channels, info.classes, info.learnable);
    } else {
        printf("%s -> %s: %d layers, input %dx%dx%d, %d classes, %zu learnables\n", model,
               im.output, info.layers, info.height, info.width, info.channels, info.classes,
               info.learnable);
    }
    dsrt_net_destroy(net);
    return 0;
}
