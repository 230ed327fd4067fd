/*
 * libFuzzer target for the model and checkpoint loader: any bytes must be
 * either refused with a code and a message, or give a net (and optimizer)
 * whose sizes agree with the file; never a crash, a leak or an out-of-bounds
 * read. A loaded net also runs one inference on a single zero image, so that
 * whatever description a file carries is planned and executed, not only
 * parsed.
 *
 * Seeds are best made with dsrt_checkpoint_save of a small net; the
 * loader's CRC checks keep most mutations at the door, so for inputs of even
 * length the target first recomputes every CRC, which lets mutations reach
 * the section walker, the description parser and the net builder.
 */
#include "nn/internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the header and section checksums so that they match. */
static void fix_crcs(uint8_t *d, size_t n) {
    if (n < 64) return;
    put32(d + 60, (uint32_t)crc32(0, d, 60));
    size_t at = 64;
    uint32_t nsec = get32(d + 20);
    for (uint32_t k = 0; k < nsec && k < 64 && n - at >= 24; k++) {
        uint8_t *h = d + at;
        uint64_t len = get32(h + 8) | (uint64_t)get32(h + 12) << 32;
        at += 24;
        if (len > n - at) {
            put32(h + 20, (uint32_t)crc32(0, h, 20));
            return;
        }
        put32(h + 16, (uint32_t)crc32(0, d + at, (uInt)len));
        put32(h + 20, (uint32_t)crc32(0, h, 20));
        uint64_t padded = (len + 7) & ~(uint64_t)7;
        if (padded > n - at) return;
        at += (size_t)padded;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    if (size % 2 == 0) fix_crcs(copy, size);
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    dsrt_train_position pos;
    int rc = dsrt__model_read(copy, size, "fuzz", &net, &opt, &pos, &o);
    if (rc == 0) {
        /* Keep the work bounded: plan and run only small nets. */
        size_t per = (size_t)net->input.c * net->input.h * net->input.w;
        if (per <= 4096 && net->n_params <= (1u << 16) && net->n_layers <= 32) {
            float *x = calloc(per, sizeof *x), *scores = calloc((size_t)net->classes, sizeof *x);
            if (x && scores) dsrt_net_predict(net, x, 1, scores, NULL, NULL, NULL);
            free(x);
            free(scores);
        }
    } else if (net || opt || !dsrt_last_error()[0]) {
        abort(); /* a refusal must leave nothing behind and say why */
    }
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
    free(copy);
    return 0;
}
