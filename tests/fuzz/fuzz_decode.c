/*
 * libFuzzer target for the decoder: the input is the encoded file itself
 * (so that real JPEGs and PNGs make the seed corpus; test_decode writes one
 * with DSRT_WRITE_CORPUS=dir). Each input goes through dsrt_decoder_info and
 * three decodes: RGB at full size into the decoder's scratch, gray with a
 * minimum of 32x32 (DCT-scaled), and RGB with a minimum of 8x8 into a
 * destination of exactly the announced size, so that ASan catches any write
 * past it; then a region decode (dsrt_decode_begin, dsrt_decode_finish with a
 * region and allow_gray taken from the input's last bytes). Odd-sized inputs
 * use a strict decoder. max_pixels is 4096*4096 to keep memory sane.
 *
 * Checked: a failure has a negative code and a message; a success has the
 * size dsrt_decode_size gives for the header dsrt_decoder_info read, and
 * every output byte is readable.
 */
#include "datastore/index/index.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every byte, so that ASan checks the whole buffer is really there. */
static void touch(const uint8_t *p, size_t n) {
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++) s ^= p[i];
    __asm__ volatile("" : : "r"(s));
}

static dsrt_decoder *decoder(int strict) {
    static dsrt_decoder *d[2];
    if (!d[strict]) {
        dsrt_decoder_options o = dsrt_decoder_defaults();
        o.max_pixels = 4096 * 4096;
        o.strict = strict;
        if (dsrt_decoder_create(&d[strict], &o) != 0) __builtin_trap();
    }
    return d[strict];
}

/* One decode; traps on a broken promise. */
static void decode_one(dsrt_decoder *d, const uint8_t *data, size_t size, int info_rc,
                       const dsrt_image_info *info, int channels, int min, int exact_dst, int dc) {
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = channels;
    r.dc_eighth = dc;
    r.min_width = r.min_height = min;
    int w = 0, h = 0;
    uint8_t *dst = NULL;
    if (info_rc == 0) {
        dsrt_decode_size(info, &r, &w, &h);
        if (w <= 0 || h <= 0) __builtin_trap();
        if (exact_dst) {
            r.dst_cap = (size_t)w * h * channels;
            dst = malloc(r.dst_cap);
            if (!dst) return;
            r.dst = dst;
        }
    }
    dsrt_image img;
    dsrt__clear_error();
    int rc = dsrt_decode(d, data, size, &r, &img);
    if (rc != 0) {
        if (rc > 0 || !dsrt_last_error()[0]) __builtin_trap();
    } else {
        /* A header info refused cannot decode. */
        if (info_rc != 0) __builtin_trap();
        if (img.width != w || img.height != h || img.channels != channels) __builtin_trap();
        if (img.stride != (size_t)w * channels) __builtin_trap();
        if (dst && img.data != dst) __builtin_trap();
        touch(img.data, img.stride * (size_t)img.height);
    }
    free(dst);
}

/* begin and finish with a region (from the input's last bytes) and
 * allow_gray, into a destination of the whole decoded size: the window lies
 * in the decoded image, holds the region, and fits. */
static void region_one(dsrt_decoder *d, const uint8_t *data, size_t size,
                       const dsrt_image_info *info) {
    uint32_t h = 2166136261u;
    for (size_t i = size > 8 ? size - 8 : 0; i < size; i++) h = (h ^ data[i]) * 16777619u;
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = 3;
    r.allow_gray = 1;
    r.dc_eighth = (int)(h >> 7 & 1);
    r.min_width = (int)(h % 3 == 0 ? 0 : info->width / (int)(1 + h % 5));
    r.region_x = (int)(h % (uint32_t)info->width);
    r.region_y = (int)((h >> 8) % (uint32_t)info->height);
    r.region_width = 1 + (int)((h >> 16) % (uint32_t)(info->width - r.region_x));
    r.region_height = 1 + (int)((h >> 24) % (uint32_t)(info->height - r.region_y));
    int w = 0, hh = 0;
    dsrt_decode_size(info, &r, &w, &hh);
    r.dst_cap = (size_t)w * hh * 3;
    uint8_t *dst = malloc(r.dst_cap ? r.dst_cap : 1);
    if (!dst) return;
    r.dst = dst;
    dsrt_image_info again;
    dsrt_image img;
    dsrt_window win;
    dsrt__clear_error();
    int rc = dsrt_decode_begin(d, data, size, &again);
    if (rc == 0) rc = dsrt_decode_finish(d, &r, &img, &win);
    if (rc != 0) {
        if (rc > 0 || !dsrt_last_error()[0]) __builtin_trap();
    } else {
        if (win.decoded_width != w || win.decoded_height != hh) __builtin_trap();
        if (win.x0 < 0 || win.y0 < 0 || win.x0 + img.width > w || win.y0 + img.height > hh)
            __builtin_trap();
        if (img.channels != 1 && img.channels != 3) __builtin_trap();
        if (img.data != dst || img.stride * (size_t)img.height > r.dst_cap) __builtin_trap();
        touch(img.data, img.stride * (size_t)img.height);
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsrt_decoder *d = decoder((int)(size & 1));
    dsrt_image_info info;
    dsrt__clear_error();
    int info_rc = dsrt_decoder_info(d, data, size, &info);
    if (info_rc != 0) {
        if (info_rc > 0 || !dsrt_last_error()[0]) __builtin_trap();
    } else {
        if (info.width <= 0 || info.height <= 0) __builtin_trap();
        if ((uint64_t)info.width * info.height > 4096 * 4096) __builtin_trap();
        if (info.channels < 1 || info.channels > 4) __builtin_trap();
        if (info.format != dsrt_detect_format(data, size)) __builtin_trap();
    }
    decode_one(d, data, size, info_rc, &info, 3, 0, 0, 0);
    decode_one(d, data, size, info_rc, &info, 1, 32, 0, 0);
    decode_one(d, data, size, info_rc, &info, 3, 8, 1, 0);
    decode_one(d, data, size, info_rc, &info, 1, 1, 0, 1); /* 1/8 from the DC terms */
    decode_one(d, data, size, info_rc, &info, 3, 1, 1, 1);
    if (info_rc == 0) region_one(d, data, size, &info);
    return 0;
}
