/*
 * libFuzzer target for version-2 model files (networks that are graphs)
 * whose every checksum is right, so that what is fuzzed is the part behind
 * the checksums: the description of a graph (inputs=, add, concat) and the
 * sizes the header claims. A mutated byte of a real file is refused by its
 * CRC before it reaches the description parser, which fuzz_model only
 * partly gets past; here the input is the description itself, spliced onto
 * the first lines of a built-in graph so that mutations start from a valid
 * one, and the target writes the container around it.
 *
 * Input: byte 0 picks the input size and whether the header's sizes are the
 * built net's or taken from the input; byte 1 how many lines of the
 * built-in graph come first; the rest is appended to them as the
 * description. A load that succeeds must give back the net the description
 * builds, with the very parameters written; a refusal must say why and
 * leave nothing behind.
 */
#include "nn/internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Appends a section (tag, payload of len bytes) at *at of out. */
static void section(uint8_t *out, size_t *at, const char *tag, const void *payload, size_t len) {
    uint8_t *h = out + *at;
    memcpy(h, tag, 4);
    put32(h + 4, 0);
    put64(h + 8, len);
    put32(h + 16, (uint32_t)crc32(0, payload, (uInt)len));
    put32(h + 20, (uint32_t)crc32(0, h, 20));
    if (len) memcpy(h + 24, payload, len);
    size_t padded = (len + 7) & ~(size_t)7;
    memset(h + 24 + len, 0, padded - len);
    *at += 24 + padded;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > (1u << 16)) return 0;
    const uint8_t flags = data[0];
    static const int sizes[4][3] = {{32, 32, 3}, {28, 28, 1}, {16, 16, 3}, {8, 8, 2}};
    const int *hwc = sizes[flags & 3];
    const int classes = 2 + (flags >> 4);

    /* The description: the first data[1] lines of resnet20, then the input. */
    const char *base = dsrt_net_builtin("resnet20", NULL);
    size_t keep = 0;
    for (unsigned lines = 0; base[keep] && lines < data[1]; keep++)
        if (base[keep] == '\n') lines++;
    size_t dlen = keep + size - 2;
    char *desc = malloc(dlen + 1);
    if (!desc) return 0;
    memcpy(desc, base, keep);
    memcpy(desc + keep, data + 2, size - 2);
    desc[dlen] = '\0';

    /* The sizes: the net's when it builds (and byte 0 says so), else any. */
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    dsrt_net *built = NULL;
    uint64_t np = flags & 4 ? 1 : 0, ns = flags & 8 ? 3 : 0;
    if (!memchr(desc, 0, dlen) &&
        dsrt_net_create(&built, desc, hwc[0], hwc[1], hwc[2], classes, &o) == 0 && !(flags & 4)) {
        np = built->n_params;
        ns = built->n_state;
    }
    if (np > (1u << 20) || ns > (1u << 20)) {
        dsrt_net_destroy(built);
        free(desc);
        return 0;
    }
    float *parm = malloc((size_t)(np + ns + 1) * sizeof *parm);
    size_t cap = 64 + 3 * 32 + dlen + (size_t)(np + ns) * 4 + 64;
    uint8_t *file = calloc(cap, 1);
    if (!parm || !file) goto out;
    uint32_t s = (uint32_t)size * 2654435761u;
    for (uint64_t i = 0; i < np + ns; i++) {
        s = s * 1664525u + 1013904223u;
        parm[i] = (float)((int32_t)s >> 8) * 1e-7f;
    }

    uint8_t *hd = file;
    memcpy(hd, "DSRTMODL", 8);
    put32(hd + 8, 2);
    put32(hd + 12, 1);
    put32(hd + 16, 64);
    put32(hd + 20, 3);
    put32(hd + 24, (uint32_t)hwc[0]);
    put32(hd + 28, (uint32_t)hwc[1]);
    put32(hd + 32, (uint32_t)hwc[2]);
    put32(hd + 36, (uint32_t)classes);
    put64(hd + 40, np);
    put64(hd + 48, ns);
    put32(hd + 56, 0);
    put32(hd + 60, (uint32_t)crc32(0, hd, 60));
    size_t at = 64;
    section(file, &at, "DESC", desc, dlen);
    section(file, &at, "PARM", parm, (size_t)np * 4);
    section(file, &at, "STAT", parm + np, (size_t)ns * 4);

    dsrt_net *net = NULL;
    dsrt_optimizer *opt = NULL;
    dsrt_train_position pos;
    int rc = dsrt__model_read(file, at, "fuzz", &net, &opt, &pos, &o);
    if (rc == 0) {
        /* What was written comes back: the sizes and every value. */
        size_t n, m;
        const float *p = dsrt_net_params(net, &n), *st = dsrt_net_state(net, &m);
        if (n != np || m != ns || memcmp(p, parm, n * 4) != 0 || memcmp(st, parm + np, m * 4) != 0)
            abort();
        if (!built) abort(); /* a description that does not build loaded */
    } else if (net || opt || !dsrt_last_error()[0]) {
        abort(); /* a refusal must leave nothing behind and say why */
    }
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(net);
out:
    dsrt_net_destroy(built);
    free(parm);
    free(file);
    free(desc);
    return 0;
}
