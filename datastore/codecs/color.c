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
 * so on x86-64 each loop is also compiled for SSSE3 and AVX2 and every call
 * takes the best one the CPU has (one test per call, not per pixel).
 */
#include "datastore/codecs/codecs.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DSRT_X86_DISPATCH 1
#endif

// ----------------------------------------------------------------------------
// Loops, compiled once per instruction set

static inline __attribute__((always_inline)) void
rgb_to_gray_loop(const uint8_t *restrict rgb, uint8_t *restrict gray, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint32_t r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
        gray[i] = (uint8_t)((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
    }
}

static inline __attribute__((always_inline)) void
gray_to_rgb_loop(const uint8_t *restrict gray, uint8_t *restrict rgb, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint8_t v = gray[i];
        rgb[3 * i] = v;
        rgb[3 * i + 1] = v;
        rgb[3 * i + 2] = v;
    }
}

#ifdef DSRT_X86_DISPATCH
__attribute__((target("avx2"))) static void
rgb_to_gray_avx2(const uint8_t *restrict rgb, uint8_t *restrict gray, size_t pixels) {
    rgb_to_gray_loop(rgb, gray, pixels);
}
__attribute__((target("ssse3"))) static void
rgb_to_gray_ssse3(const uint8_t *restrict rgb, uint8_t *restrict gray, size_t pixels) {
    rgb_to_gray_loop(rgb, gray, pixels);
}
__attribute__((target("avx2"))) static void gray_to_rgb_avx2(const uint8_t *restrict gray,
                                                             uint8_t *restrict rgb, size_t pixels) {
    gray_to_rgb_loop(gray, rgb, pixels);
}
__attribute__((target("ssse3"))) static void
gray_to_rgb_ssse3(const uint8_t *restrict gray, uint8_t *restrict rgb, size_t pixels) {
    gray_to_rgb_loop(gray, rgb, pixels);
}
#endif

// ----------------------------------------------------------------------------
// Conversions

void dsrt__rgb_to_gray(const uint8_t *restrict rgb, uint8_t *restrict gray, size_t pixels) {
#ifdef DSRT_X86_DISPATCH
    if (__builtin_cpu_supports("avx2")) {
        rgb_to_gray_avx2(rgb, gray, pixels);
        return;
    }
    if (__builtin_cpu_supports("ssse3")) {
        rgb_to_gray_ssse3(rgb, gray, pixels);
        return;
    }
#endif
    rgb_to_gray_loop(rgb, gray, pixels);
}

void dsrt__gray_to_rgb(const uint8_t *restrict gray, uint8_t *restrict rgb, size_t pixels) {
#ifdef DSRT_X86_DISPATCH
    if (__builtin_cpu_supports("avx2")) {
        gray_to_rgb_avx2(gray, rgb, pixels);
        return;
    }
    if (__builtin_cpu_supports("ssse3")) {
        gray_to_rgb_ssse3(gray, rgb, pixels);
        return;
    }
#endif
    gray_to_rgb_loop(gray, rgb, pixels);
}
