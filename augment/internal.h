/*
 * What augment.c shares with the vectorised resamplers of resample_x86.c:
 * the resampling tables of an axis, the sink (where and how a sample is
 * written), one output row of the separable resampler as a job, and the
 * table of kernels an augmenter runs (scalar, AVX2 or AVX-512, chosen when
 * it is created).
 *
 * Every kernel computes the same arithmetic as the scalar one, operation for
 * operation: products and sums of single floats in the same order (no fused
 * multiply-add: this file's users are compiled with fp-contract off), so the
 * bytes written are the same whatever kernel runs them. The tests compare
 * every kernel the machine has on the same inputs.
 */
#ifndef DSRT_AUGMENT_INTERNAL_H
#define DSRT_AUGMENT_INTERNAL_H

#include <dsrt/augment.h>

#include "core/internal.h"

/* Resampling taps of one axis: output index i reads source indices
 * start[i] .. start[i] + count[i] - 1 with weights w[i * k ...], or is fill
 * (count 0) when its centre falls outside the source. */
typedef struct {
    int *start; // (n)
    int *count; // (n)
    float *w;   // (n, k)
    size_t cap_start, cap_count, cap_w;
    int n, k;
    int lo, hi; // source indices read: [lo, hi)
    /* Every tap is one whole pixel: the non-fill outputs are the run
     * [run_first, run_first + run_len), reading run_src + dir * j. */
    int copy;
    int run_first, run_len, run_src, run_dir;
    /* Every non-fill output has taps taps (padded with zero weights), so
     * the horizontal pass can unroll; 0 when they differ. */
    int taps;
    /* What the tables were built for, so that the same axis is not built
     * twice in a row (a batch of images of one size). */
    int built_n, built_len, built_c0, built_c1;
    double built_a, built_b;
    /* The same taps in blocks of `block` consecutive outputs, for a vector
     * kernel (built when one asks; block 0: not built). Block b's lane i is
     * output b * block + i; it reads the source from bbase[b] (relative to
     * lo) on: tap j at bidx[b][i] + j with weight bw[b][j][i]. bmode says
     * how the kernel gets the taps. Lanes past n have weight 0 and index 0. */
    int block, span; // span: how far a block's taps may reach to be permuted
    int wide;        // how far from four loads (BLOCK_WIDE; 0: none)
    int nb;
    int *bbase;     // (nb)
    int32_t *bidx;  // (nb, block)
    float *bw;      // (nb, taps, block)
    uint8_t *bmode; // (nb) BLOCK_*
    size_t cap_bbase, cap_bidx, cap_bw, cap_bmode;
} dsrt__axis;

enum {
    BLOCK_PERMUTE = 0, /* every tap within span values of bbase: permutes of two loads */
    BLOCK_GATHER,      /* the taps reach further: gathers */
    BLOCK_SCALAR,      /* fill outputs, or tap counts that differ: one output at a time */
    BLOCK_WIDE,        /* within wide values (kernels that say so): permutes of four loads */
};

/*
 * Where and how a sample is written. Float output is (x - sub[c]) / div[c],
 * x in [0, 255]. Whole pixels (the copy path) go through lut, that value
 * computed exactly for each byte (x / 255 for rescaling, bit for bit as
 * torchvision's ToTensor); resampled values are multiplied by inv[c] =
 * 1 / div[c], within an ulp of the division.
 */
typedef struct {
    int ch, ow, oh;
    int sch;          // channels of the source: ch, or 1 for a gray source replicated
    int f32;          // 1: float NCHW, 0: uint8 NHWC
    float sub[3];     // (ch)
    float div[3];     // (ch)
    float inv[3];     // (ch) 1 / div
    float fill[3];    // (ch) fill value, [0, 255]
    const float *lut; // (ch, 256) normalised value of each byte, float output only
    void *dst;
} dsrt__sink;

/* Four floats in one SSE register (GCC and clang vector extension): the
 * scalar kernel's pixel of up to 3 channels and a lane to spare. */
typedef float v4sf __attribute__((vector_size(16)));

/* The byte a value in [0, 255] is written as: rounded half up, clamped. */
static inline uint8_t dsrt__to_u8(float x) {
    x += 0.5f;
    x = x < 0.0f ? 0.0f : x > 255.0f ? 255.0f : x;
    return (uint8_t)x;
}

/* One output row v of the separable resampler: the vertical pass over n
 * source rows (src, src + stride, ...: bytes of source pixel ax->lo on, sch
 * channels interleaved) with weights w, then the horizontal pass through ax
 * into the sink. tmp holds 3 * plane floats (plane >= ax->hi - ax->lo + 64),
 * for the kernel's own use. */
typedef struct {
    const dsrt__sink *s;
    int v;
    const dsrt__axis *ax;
    const uint8_t *src;
    size_t stride;
    int n;
    const float *w;
    float *tmp;
    size_t plane;
} dsrt__row_job;

/* A set of kernels. */
typedef struct {
    const char *name; /* "scalar", "avx2", "avx512" */
    int block, span;  /* the axis blocks the row kernel wants (0: none) */
    void (*row)(const dsrt__row_job *j);
    /* Output row v as whole source pixels: ax's copy run read from src (the
     * source row's pixel 0), fill around it. */
    void (*copy)(const dsrt__sink *s, int v, const uint8_t *src, const dsrt__axis *ax);
    /* How far a block's taps may reach to be permuted from four loads
     * (BLOCK_WIDE) rather than gathered; 0: the kernel has no such blocks. */
    int wide;
} dsrt__resample_ops;

/* The scalar kernels (augment.c), which the others fall back on. */
void dsrt__row_scalar(const dsrt__row_job *j);
/* Its horizontal pass (sink.c), from tmp: the vertical pass's sums with the
 * channels interleaved, source pixel ax->lo first, one float of slack after
 * them; into output row v of the sink, or as floats (ax->n, ch) into hwc. */
void dsrt__hpass_sink(const dsrt__sink *s, int v, const float *tmp, const dsrt__axis *ax);
void dsrt__hpass_hwc(float *hwc, const float *tmp, const dsrt__axis *ax, const float *fill, int ch);
void dsrt__copy_scalar(const dsrt__sink *s, int v, const uint8_t *src, const dsrt__axis *ax);
/* Output columns [u0, u1) of row v set to the fill value. */
void dsrt__sink_fill(const dsrt__sink *s, int v, int u0, int u1);
/* Outputs [u0, u1) of row v of a row job, one at a time, from the planes of
 * the vertical pass (sch of them, plane floats apart, source pixel ax->lo
 * first): the scalar arithmetic, for blocks a vector kernel cannot take.
 * They go to out: for float output, the row of channel 0, channel c's
 * ostride floats further; for bytes, the interleaved row. */
void dsrt__hpass_outputs(const dsrt__row_job *j, const float *planes, int u0, int u1, void *out,
                         size_t ostride);

/* The vectorised kernels (resample_x86.c), or NULL where this CPU or build
 * has no such instructions. */
const dsrt__resample_ops *dsrt__resample_avx2(void);
const dsrt__resample_ops *dsrt__resample_avx512(void);

/* The kernels an augmenter uses: isa names them ("scalar", "avx2",
 * "avx512"); NULL takes the best this CPU has, capped by the environment
 * variable DSRT_MAX_CPU_ISA. Fails with DSRT_EOPTION for a name that is not
 * one of those, and with DSRT_EUNSUPPORTED for one this CPU lacks. For tests
 * that compare kernels. */
int dsrt__augmenter_set_isa(dsrt_augmenter *a, const char *isa);

#endif
