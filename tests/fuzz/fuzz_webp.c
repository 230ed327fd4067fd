/*
 * libFuzzer target for the WebP codec (datastore/codecs/webp.c). The input
 * is decoded twice: as it is (a whole file: the seeds in
 * tests/fuzz/seeds/fuzz_webp/ are small WebPs of each kind, lossy, lossless,
 * with alpha, animated), and wrapped by this target in a RIFF container
 * whose one chunk (VP8, VP8L, or VP8X then ALPH and VP8, chosen by the first
 * byte) holds the rest of the input, so that mutations reach libwebp's
 * bitstream parsers without having to keep the container's sizes right.
 * max_pixels is 2048*2048 to keep memory sane.
 *
 * Checked, for each: a failure has a negative code and a message; a
 * success has the header's size, RGB into a destination of exactly that
 * size (ASan catches a write past it), and, for a WebP, gray equal to
 * rgb2gray of that RGB; a decode succeeds only where the header
 * (dsrt_decoder_info) did, and the header's format is the sniffed one.
 */
#include "datastore/codecs/codecs.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SIDE 2048

static dsrt_decoder *decoder(void) {
    static dsrt_decoder *d;
    if (!d) {
        dsrt_decoder_options o = dsrt_decoder_defaults();
        o.max_pixels = MAX_SIDE * MAX_SIDE;
        if (dsrt_decoder_create(&d, &o) != 0) __builtin_trap();
    }
    return d;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* A chunk: tag, size, payload, pad byte. Returns the bytes written. */
static size_t chunk(uint8_t *out, const char *tag, const uint8_t *p, size_t n) {
    memcpy(out, tag, 4);
    put32(out + 4, (uint32_t)n);
    if (n) memcpy(out + 8, p, n);
    if (n & 1) out[8 + n] = 0;
    return 8 + n + (n & 1);
}

/* The input's tail in a RIFF container (see the top); a malloc'd buffer. */
static uint8_t *wrap(const uint8_t *data, size_t size, size_t *len) {
    if (size < 2) return NULL;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    uint8_t *out = malloc(n + 64);
    if (!out) return NULL;
    size_t at = 12;
    switch (data[0] % 3) {
    case 0:
        at += chunk(out + at, "VP8 ", p, n);
        break;
    case 1:
        at += chunk(out + at, "VP8L", p, n);
        break;
    default: {
        /* VP8X with alpha, 16x16, then an ALPH chunk of the first half and
         * a VP8 chunk of the rest. */
        uint8_t vp8x[10] = {0x10, 0, 0, 0, 15, 0, 0, 15, 0, 0};
        at += chunk(out + at, "VP8X", vp8x, sizeof vp8x);
        at += chunk(out + at, "ALPH", p, n / 2);
        at += chunk(out + at, "VP8 ", p + n / 2, n - n / 2);
    }
    }
    memcpy(out, "RIFF", 4);
    put32(out + 4, (uint32_t)(at - 8));
    memcpy(out + 8, "WEBP", 4);
    *len = at;
    return out;
}

/* Reads every byte, so that ASan checks the whole buffer is really there. */
static void touch(const uint8_t *p, size_t n) {
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++) s ^= p[i];
    __asm__ volatile("" : : "r"(s));
}

static void check_one(const uint8_t *buf, size_t len) {
    dsrt_decoder *d = decoder();
    dsrt_image_info info;
    dsrt__clear_error();
    int info_rc = dsrt_decoder_info(d, buf, len, &info);
    if (info_rc != 0) {
        if (info_rc > 0 || !dsrt_last_error()[0]) __builtin_trap();
    } else {
        if (info.format != dsrt_detect_format(buf, len)) __builtin_trap();
        if (info.width <= 0 || info.height <= 0) __builtin_trap();
        if ((uint64_t)info.width * info.height > MAX_SIDE * MAX_SIDE) __builtin_trap();
    }
    /* RGB into a destination of exactly the header's size. */
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = 3;
    uint8_t *rgb = NULL;
    size_t pixels = 0;
    if (info_rc == 0) {
        pixels = (size_t)info.width * info.height;
        rgb = malloc(pixels * 3);
        if (!rgb) return;
        r.dst = rgb;
        r.dst_cap = pixels * 3;
    }
    dsrt_image img;
    dsrt__clear_error();
    int rc = dsrt_decode(d, buf, len, &r, &img);
    if (rc != 0) {
        if (rc > 0 || !dsrt_last_error()[0]) __builtin_trap();
        free(rgb);
        return;
    }
    if (info_rc != 0) __builtin_trap();
    if (img.data != rgb || img.width != info.width || img.height != info.height ||
        img.channels != 3 || img.stride != (size_t)info.width * 3)
        __builtin_trap();
    touch(img.data, pixels * 3);
    if (info.format != DSRT_FORMAT_WEBP) { /* a JPEG's gray is its luma */
        free(rgb);
        return;
    }
    /* Gray: rgb2gray of the same RGB (the decode is deterministic). */
    r.channels = 1;
    r.dst = NULL;
    r.dst_cap = 0;
    uint8_t *want = malloc(pixels ? pixels : 1);
    if (!want) {
        free(rgb);
        return;
    }
    dsrt__rgb_to_gray(rgb, want, pixels);
    rc = dsrt_decode(d, buf, len, &r, &img);
    if (rc != 0 || img.channels != 1 || memcmp(img.data, want, pixels) != 0) __builtin_trap();
    free(want);
    free(rgb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_one(data, size);
    size_t len;
    uint8_t *wrapped = wrap(data, size, &len);
    if (wrapped) {
        check_one(wrapped, len);
        free(wrapped);
    }
    return 0;
}
