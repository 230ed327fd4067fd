/*
 * libFuzzer target for the ONNX importer: any bytes must be either refused
 * with a code and a message, or give a net whose layers, parameters and
 * state came from the file; never a crash, a leak, an out-of-bounds read
 * or an allocation sized by a lying count. An imported net also runs one
 * inference on a single zero image (when it is small), so that whatever
 * graph a file describes is planned and executed, not only mapped.
 *
 * External data is refused here (no model folder), so the bytes alone
 * decide. Seeds are best made with dsrt_onnx_export of a small net, or the
 * models tests/onnx_ref.py writes.
 */
#include "nn/onnx.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    dsrt_net *net = NULL;
    int rc = dsrt__onnx_import_memory(&net, data, size, "fuzz", NULL, 0, NULL, &o);
    if (rc == 0) {
        /* Keep the work bounded: plan and run only small nets. */
        size_t per = (size_t)net->input.c * net->input.h * net->input.w, act = 0;
        for (int i = 0; i < net->n_layers; i++) {
            const dsrt_layer *l = &net->layers[i];
            size_t n = (size_t)l->out.c * l->out.h * l->out.w;
            act = n > act ? n : act;
        }
        if (per <= 4096 && act <= (1u << 16) && net->n_params <= (1u << 16) &&
            net->n_layers <= 32) {
            float *x = calloc(per, sizeof *x), *scores = calloc((size_t)net->classes, sizeof *x);
            if (x && scores) dsrt_net_predict(net, x, 1, scores, NULL, NULL, NULL);
            free(x);
            free(scores);
        }
    } else if (net || !dsrt_last_error()[0]) {
        abort(); /* a refusal must leave nothing behind and say why */
    }
    dsrt_net_destroy(net);
    return 0;
}
