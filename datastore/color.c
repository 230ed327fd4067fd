/*
 * Gray <-> RGB conversions of packed 8-bit pixels, shared by the decoder and
 * the in-memory sources.
 *
 * rgb2gray uses the ITU-R BT.601 luma weights (0.299, 0.587, 0.114) in 16-bit
 * fixed point, rounded to nearest: (19595 R + 38470 G + 7471 B + 32768) >> 16.
 * The weights sum to 65536, so a gray pixel (R = G = B) maps to itself. This
 * is the rounding of Pillow's convert("L") and within one level of MATLAB's
 * rgb2gray. Both loops are plain counted loops over restrict pointers, with
 * no call or branch per pixel, so that the compiler vectorises them. The
 * stride-3 loads need byte shuffles (SSSE3), which the x86-64 baseline lacks,
 * so on x86-64 each loop is also compiled for SSSE3 and AVX2 and the loader
 * picks the best one the CPU has.
 */
#include "internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DSRT_CLONES __attribute__((target_clones("avx2", "ssse3", "default")))
#else
#define DSRT_CLONES
#endif

// ----------------------------------------------------------------------------
// Conversions

DSRT_CLONES
void dsrt__rgb_to_gray(const uint8_t *restrict rgb, uint8_t *restrict gray, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint32_t r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
        gray[i] = (uint8_t)((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
    }
}

DSRT_CLONES
void dsrt__gray_to_rgb(const uint8_t *restrict gray, uint8_t *restrict rgb, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint8_t v = gray[i];
        rgb[3 * i] = v;
        rgb[3 * i + 1] = v;
        rgb[3 * i + 2] = v;
    }
}
