/*
 * Arithmetic that every nn backend must compute bit for bit alike, as inline
 * functions that C files and CUDA kernels both include: the dropout mask of
 * an element, stochastic depth's mask of an image, the input layer's
 * per-channel normalisation, and the float32 <-> bfloat16 conversions. A
 * backend that uses these cannot drift from the others: the CPU backend and
 * the GPU kernels (nn/kernels.cu) draw the same masks and normalise inputs
 * to the same floats.
 *
 * Device code rounds each product and sum separately (__fmul_rn, __dmul_rn
 * and friends, which nvcc never contracts into a fused multiply-add), as the
 * C code does when the compiler does not fuse a multiply and an add (x86-64
 * without -march: no FMA instructions; or -ffp-contract=off).
 */
#ifndef DSRT_NN_ARITH_H
#define DSRT_NN_ARITH_H

#include "nn/internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDA_ARCH__)
#define DSRT_FMUL(a, b) __fmul_rn(a, b)
#define DSRT_FADD(a, b) __fadd_rn(a, b)
#define DSRT_FSUB(a, b) __fsub_rn(a, b)
#define DSRT_FDIV(a, b) __fdiv_rn(a, b)
#define DSRT_FSQRT(a)   __fsqrt_rn(a)
#define DSRT_DMUL(a, b) __dmul_rn(a, b)
#define DSRT_DADD(a, b) __dadd_rn(a, b)
#define DSRT_DSUB(a, b) __dsub_rn(a, b)
#else
#define DSRT_FMUL(a, b) ((a) * (b))
#define DSRT_FADD(a, b) ((a) + (b))
#define DSRT_FSUB(a, b) ((a) - (b))
#define DSRT_FDIV(a, b) ((a) / (b))
#define DSRT_FSQRT(a)   sqrtf(a)
#define DSRT_DMUL(a, b) ((a) * (b))
#define DSRT_DADD(a, b) ((a) + (b))
#define DSRT_DSUB(a, b) ((a) - (b))
#endif

// ----------------------------------------------------------------------------
// Dropout

/* The generator stream of dropout masks ("DROP"). */
#define DSRT_RNG_STREAM_DROPOUT 0x44524f50u

/* The generator of the masks of layer `layer` at training step `iteration`
 * of a net seeded with `seed`. */
static inline DSRT_HOST_DEVICE dsrt_rng dsrt_dropout_rng(uint64_t seed, uint64_t iteration,
                                                         uint64_t layer) {
    return dsrt_rng_init(seed, iteration, layer, DSRT_RNG_STREAM_DROPOUT);
}

/* An element is dropped when its 32 random bits are below p * 2^32. */
static inline DSRT_HOST_DEVICE uint32_t dsrt_dropout_threshold(float p) {
    return (uint32_t)fmin(4294967295.0, ldexp((double)p, 32));
}

/* The factor kept elements are multiplied by: 1 / (1 - p). */
static inline DSRT_HOST_DEVICE float dsrt_dropout_scale(float p) {
    return DSRT_FDIV(1.0f, DSRT_FSUB(1.0f, p));
}

/*
 * The mask value of element j (its index in logical NCHW order over the
 * whole batch): scale when kept, 0 when dropped. Elements 2i and 2i + 1 take
 * the low and high 32 bits of the generator's draw number i + 1, so a
 * sequential pass drawing once per pair of elements gives the same masks.
 * The layer's output is x * mask and its input gradient dy * mask.
 */
static inline DSRT_HOST_DEVICE float dsrt_dropout_mask(const dsrt_rng *rng, uint64_t j,
                                                       uint32_t threshold, float scale) {
    dsrt_rng r = *rng;
    r.counter += j / 2;
    uint64_t bits = dsrt_rng_u64(&r);
    uint32_t u = (j & 1) ? (uint32_t)(bits >> 32) : (uint32_t)bits;
    return u >= threshold ? scale : 0.0f;
}

// ----------------------------------------------------------------------------
// Stochastic depth (drop path)

/* The generator stream of stochastic depth's image masks ("DPTH"). */
#define DSRT_RNG_STREAM_DROP_PATH 0x44505448u

/* The generator of the image masks of layer `layer` at training step
 * `iteration` of a net seeded with `seed`. */
static inline DSRT_HOST_DEVICE dsrt_rng dsrt_drop_path_rng(uint64_t seed, uint64_t iteration,
                                                           uint64_t layer) {
    return dsrt_rng_init(seed, iteration, layer, DSRT_RNG_STREAM_DROP_PATH);
}

/*
 * The factor of image b of the batch: scale (1 / (1 - p)) when it is kept, 0
 * when dropped, drawn as dropout draws element b (images 2i and 2i + 1 take
 * the low and high 32 bits of draw i + 1, threshold and scale as
 * dsrt_dropout_threshold and dsrt_dropout_scale give them) from the stream
 * of dsrt_drop_path_rng. Every value of the image is multiplied by it, in
 * the forward and in the backward.
 */
static inline DSRT_HOST_DEVICE float dsrt_drop_path_mask(const dsrt_rng *rng, uint64_t b,
                                                         uint32_t threshold, float scale) {
    return dsrt_dropout_mask(rng, b, threshold, scale);
}

// ----------------------------------------------------------------------------
// Input normalisation

/*
 * The input layer's normalisation of channel ch as y = a x + o, from its
 * state (mean, std, min and max of each of c channels, in that order):
 * norm is a dsrt_norm; DSRT_NORM_NONE gives a = 1, o = 0.
 */
static inline DSRT_HOST_DEVICE void dsrt_input_affine(int norm, const float *state, int c, int ch,
                                                      float *a, float *o) {
    const float *mean = state, *sd = state + c, *mn = state + 2 * c, *mx = state + 3 * c;
    float aa = 1.0f, oo = 0.0f;
    switch (norm) {
    case DSRT_NORM_ZEROCENTER:
        oo = -mean[ch];
        break;
    case DSRT_NORM_ZSCORE:
        aa = DSRT_FDIV(1.0f, sd[ch]);
        oo = DSRT_FMUL(-mean[ch], aa);
        break;
    case DSRT_NORM_RESCALE:
        aa = DSRT_FDIV(1.0f, DSRT_FSUB(mx[ch], mn[ch]));
        oo = DSRT_FMUL(-mn[ch], aa);
        break;
    case DSRT_NORM_RESCALE_SYMMETRIC:
        aa = DSRT_FDIV(2.0f, DSRT_FSUB(mx[ch], mn[ch]));
        oo = DSRT_FSUB(DSRT_FMUL(-mn[ch], aa), 1.0f);
        break;
    default:
        break;
    }
    *a = aa;
    *o = oo;
}

/* a x + o, each operation rounded. */
static inline DSRT_HOST_DEVICE float dsrt_input_apply(float a, float o, float x) {
    return DSRT_FADD(DSRT_FMUL(a, x), o);
}

// ----------------------------------------------------------------------------
// bfloat16

/* The bits of a float, and back. */
static inline DSRT_HOST_DEVICE uint32_t dsrt_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static inline DSRT_HOST_DEVICE float dsrt_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* float32 to bfloat16 (the high 16 bits), rounded to nearest even; a NaN
 * stays a NaN (quiet, sign kept), infinities stay infinite. */
static inline DSRT_HOST_DEVICE uint16_t dsrt_bf16_from_f32(float f) {
    uint32_t u = dsrt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* bfloat16 to float32: exact. */
static inline DSRT_HOST_DEVICE float dsrt_f32_from_bf16(uint16_t h) {
    return dsrt_f32_from_bits((uint32_t)h << 16);
}

#endif
