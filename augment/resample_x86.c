/*
 * The separable resampler's kernels for x86-64, AVX2 and AVX-512 (AVX512F,
 * BW, DQ and VL: the x86-64-v4 level), each function compiled for its
 * instruction set with a target attribute; the augmenter picks the best the
 * CPU has when it is created (augment.c), so one build runs everywhere.
 *
 * One output row is the vertical pass, a weighted sum of source rows of
 * bytes into floats, then the horizontal pass, a weighted sum along the row,
 * normalised and written as float planes (NCHW) or interleaved bytes (NHWC).
 * Here the vertical pass writes a plane per channel (16 or 8 pixels at a
 * time, the interleaved channels parted with permutes), and the horizontal
 * pass takes a block of 16 (8) outputs per vector: each tap of a block is a
 * permute of the two vectors that hold every source value the block reads
 * (the axis tables say which lane reads which), of four vectors where the
 * block reaches twice as far (reductions by about 2 to 4: on AMD's cores a
 * gather costs more than the four permutes and three blends), or a gather
 * where it reaches further still (AVX-512; with AVX2 such blocks take the
 * scalar code, which beats its gathers). Blocks with fill outputs go one
 * output at a time through the scalar code. Rows where most blocks are not
 * permutes (large reductions) keep the channels interleaved instead: the
 * vertical pass as one run of values, then the scalar kernel's horizontal
 * pass, a pixel's channels in one 4-lane vector. The common counts of source
 * rows (up to 6) and of taps are unrolled with their weights in registers.
 * Whole vectors are stored unmasked: a masked store to a line that is not
 * in cache (a batch's slot) costs several times a plain one on AMD's cores.
 *
 * The arithmetic is the scalar kernel's, operation for operation: every sum
 * starts with its first product and adds the others in tap order, each a
 * single-precision multiply then add. Nothing here may be contracted into a
 * fused multiply-add (the AVX-512 target has FMA), hence fp-contract off
 * for this file; the same bytes come out of every kernel.
 */
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#define AVX2   __attribute__((target("avx2")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/* Where channel c of 16 (8) interleaved pixels lies in the three vectors
 * that hold them (see the permutes below): for AVX-512, the indices of two
 * vpermt2ps, the first from vectors 0 and 1, the second from its result and
 * vector 2; for AVX2, the lanes that come from vectors 1 and 2 and the
 * permute that orders them. */
static const int32_t split16_a[3][16] = {
    {0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0},
    {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0},
    {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0},
};
static const int32_t split16_b[3][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31},
};
static const int32_t split8_perm[3][8] = {
    {0, 3, 6, 1, 4, 7, 2, 5},
    {1, 4, 7, 2, 5, 0, 3, 6},
    {2, 5, 0, 3, 6, 1, 4, 7},
};
/* _mm256_blend_ps takes its lanes as an immediate: one call per channel. */
#define SPLIT8(a, b, c, ch, m1, m2)                                                                \
    _mm256_permutevar8x32_ps(_mm256_blend_ps(_mm256_blend_ps(a, b, m1), c, m2),                    \
                             _mm256_loadu_si256((const __m256i *)split8_perm[ch]))

/* Bytes of 4 pixels packed in 32 bits (R, G, B, 0) to 12 bytes, per 128-bit
 * lane; then the lanes' 3 words each made contiguous. */
static const int8_t pack3_bytes[16] = {0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1};
static const int8_t pack1_bytes[16] = {0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};

/* Whether a row through ax is better taken with the channels interleaved:
 * the vertical pass as one run of values, then the scalar kernel's
 * horizontal pass, which takes a pixel's channels together. So it is where
 * fewer than half the blocks are ones the permutes take (the others: fill,
 * gathers in large reductions, and with AVX2 permute blocks of more than
 * `most` taps, which only a short last block has), each of which the planes
 * would give one output and channel at a time. */
static int interleaved_row(const dsrt__axis *ax, int most) {
    int vec = 0;
    for (int b = 0; b < ax->nb; b++)
        vec += ax->bmode[b] == BLOCK_WIDE || (ax->bmode[b] == BLOCK_PERMUTE && ax->taps <= most);
    return 2 * vec < ax->nb;
}

// ----------------------------------------------------------------------------
// AVX-512

AVX512 static inline __m512 load16_u8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

AVX512 static inline __m512 load16_u8_mask(const uint8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

/* Sum over the n source rows of w[j] times 16 bytes at offset o (the bytes
 * in m only, when m is not all of them). */
AVX512 static inline __m512 vsum16(const uint8_t *src, size_t stride, int n, const float *w,
                                   size_t o, __mmask16 m) {
    if (m == 0xffff) {
        __m512 acc = _mm512_mul_ps(_mm512_set1_ps(w[0]), load16_u8(src + o));
        for (int j = 1; j < n; j++)
            acc = _mm512_add_ps(
                acc, _mm512_mul_ps(_mm512_set1_ps(w[j]), load16_u8(src + (size_t)j * stride + o)));
        return acc;
    }
    __m512 acc = _mm512_mul_ps(_mm512_set1_ps(w[0]), load16_u8_mask(src + o, m));
    for (int j = 1; j < n; j++)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w[j]),
                                               load16_u8_mask(src + (size_t)j * stride + o, m)));
    return acc;
}

/* Channel c of the 16 pixels interleaved in a, b, c. */
AVX512 static inline __m512 split16(__m512 a, __m512 b, __m512 c, int ch) {
    __m512 t = _mm512_permutex2var_ps(a, _mm512_loadu_si512(split16_a[ch]), b);
    return _mm512_permutex2var_ps(t, _mm512_loadu_si512(split16_b[ch]), c);
}

static inline __mmask16 mask16(int n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* Bytes [0, n) of a 16-byte group, n possibly outside [0, 16]. */
static inline __mmask16 bytes16(int n) {
    return n <= 0 ? 0 : mask16(n);
}

/* The sums of 48 bytes at o over n rows, three side by side, each row's
 * weight broadcast once for the three. Inlined, so that where n is a
 * constant the rows unroll. */
AVX512 static inline __attribute__((always_inline)) void
vsum48(const uint8_t *src, size_t stride, int n, const float *w, size_t o, __m512 *a) {
    __m512 wj = _mm512_set1_ps(w[0]);
    a[0] = _mm512_mul_ps(wj, load16_u8(src + o));
    a[1] = _mm512_mul_ps(wj, load16_u8(src + o + 16));
    a[2] = _mm512_mul_ps(wj, load16_u8(src + o + 32));
    for (int j = 1; j < n; j++) {
        const uint8_t *r = src + (size_t)j * stride + o;
        wj = _mm512_set1_ps(w[j]);
        a[0] = _mm512_add_ps(a[0], _mm512_mul_ps(wj, load16_u8(r)));
        a[1] = _mm512_add_ps(a[1], _mm512_mul_ps(wj, load16_u8(r + 16)));
        a[2] = _mm512_add_ps(a[2], _mm512_mul_ps(wj, load16_u8(r + 32)));
    }
}

/* Every whole group of 16 pixels of 3 channels (48 bytes) into the planes.
 * Returns the pixels done. */
AVX512 static inline __attribute__((always_inline)) int vpass3_groups16(float *planes, size_t plane,
                                                                        const uint8_t *src,
                                                                        size_t stride, int n,
                                                                        const float *w, int px) {
    int i = 0;
    for (; i + 16 <= px; i += 16) {
        __m512 a[3];
        vsum48(src, stride, n, w, (size_t)3 * i, a);
        for (int ch = 0; ch < 3; ch++)
            _mm512_storeu_ps(planes + ch * plane + i, split16(a[0], a[1], a[2], ch));
    }
    return i;
}

/* The vertical pass of px pixels of sch channels into planes. */
AVX512 static void vpass_avx512(float *planes, size_t plane, const uint8_t *src, size_t stride,
                                int n, const float *w, int px, int sch) {
    int i = 0;
    if (sch == 1) {
        for (; i + 48 <= px; i += 48) {
            __m512 a[3];
            vsum48(src, stride, n, w, (size_t)i, a);
            for (int k = 0; k < 3; k++) _mm512_storeu_ps(planes + i + 16 * k, a[k]);
        }
        for (; i < px; i += 16) {
            __mmask16 m = mask16(px - i);
            _mm512_mask_storeu_ps(planes + i, m, vsum16(src, stride, n, w, (size_t)i, m));
        }
        return;
    }
    /* The common counts of rows (1 to 6) as constants. */
    switch (n) {
    case 1:
        i = vpass3_groups16(planes, plane, src, stride, 1, w, px);
        break;
    case 2:
        i = vpass3_groups16(planes, plane, src, stride, 2, w, px);
        break;
    case 3:
        i = vpass3_groups16(planes, plane, src, stride, 3, w, px);
        break;
    case 4:
        i = vpass3_groups16(planes, plane, src, stride, 4, w, px);
        break;
    case 5:
        i = vpass3_groups16(planes, plane, src, stride, 5, w, px);
        break;
    case 6:
        i = vpass3_groups16(planes, plane, src, stride, 6, w, px);
        break;
    default:
        i = vpass3_groups16(planes, plane, src, stride, n, w, px);
    }
    for (; i < px; i += 16) {
        int bytes = 3 * (px - i);
        size_t o = (size_t)3 * i;
        __mmask16 m = mask16(px - i);
        __m512 a = vsum16(src, stride, n, w, o, bytes16(bytes));
        __m512 b = vsum16(src, stride, n, w, o + 16, bytes16(bytes - 16));
        __m512 c = vsum16(src, stride, n, w, o + 32, bytes16(bytes - 32));
        for (int ch = 0; ch < 3; ch++)
            _mm512_mask_storeu_ps(planes + ch * plane + i, m, split16(a, b, c, ch));
    }
}

/* Writes the sums of outputs u0 .. u0 + lanes - 1 (acc: one vector per
 * source channel) to out (see dsrt__hpass_outputs). */
AVX512 static inline void write16(const dsrt__sink *s, void *out, size_t ostride, int u0, int lanes,
                                  const __m512 *acc) {
    int och = s->ch, sch = s->sch;
    __mmask16 m = mask16(lanes);
    if (s->f32) {
        size_t plane = ostride;
        float *o = (float *)out + u0;
        for (int c = 0; c < och; c++) {
            /* x - (+0) is x: no subtraction when there is nothing to subtract. */
            __m512 x = acc[sch == 1 ? 0 : c];
            if (!(s->sub[c] == 0.0f && !signbit(s->sub[c])))
                x = _mm512_sub_ps(x, _mm512_set1_ps(s->sub[c]));
            __m512 r = _mm512_mul_ps(x, _mm512_set1_ps(s->inv[c]));
            /* Plain stores: a masked one costs more, where the line is not
             * in cache (see the top). */
            if (lanes == 16) {
                _mm512_storeu_ps(o + c * plane, r);
            } else {
                float t[16];
                _mm512_storeu_ps(t, r);
                memcpy(o + c * plane, t, (size_t)lanes * sizeof *t);
            }
        }
        return;
    }
    __m512i q[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int c = 0; c < sch; c++) {
        __m512 x = _mm512_add_ps(acc[c], _mm512_set1_ps(0.5f));
        x = _mm512_min_ps(_mm512_max_ps(x, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
        q[c] = _mm512_cvttps_epi32(x);
    }
    uint8_t *o = (uint8_t *)out + (size_t)u0 * och;
    if (och == 1) {
        _mm512_mask_cvtepi32_storeu_epi8(o, m, q[0]);
        return;
    }
    if (sch == 1) q[1] = q[2] = q[0];
    __m512i pix = _mm512_or_si512(
        q[0], _mm512_or_si512(_mm512_slli_epi32(q[1], 8), _mm512_slli_epi32(q[2], 16)));
    __m512i bytes = _mm512_shuffle_epi8(
        pix, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pack3_bytes)));
    __m512i packed = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15, 15, 15, 15), bytes);
    if (lanes == 16) { /* 48 bytes: plain stores (see write16's floats) */
        _mm256_storeu_si256((__m256i *)o, _mm512_castsi512_si256(packed));
        _mm_storeu_si128((__m128i *)(o + 32), _mm512_extracti32x4_epi32(packed, 2));
        return;
    }
    __mmask64 bm = ((__mmask64)1 << (3 * lanes)) - 1;
    _mm512_mask_storeu_epi8(o, bm, packed);
}

/* The taps of one block for the sch planes (p: the block's first value in
 * plane 0), every tap within the 32 values from p: one permute of two
 * vectors a tap, the index vectors made once for all planes. taps is a
 * constant where it is called, so the loops unroll into registers. */
AVX512 static inline __attribute__((always_inline)) void
taps_permute16(const float *p, size_t plane, int sch, __m512i idx0, const float *wv, int taps,
               __m512 *acc) {
    __m512i idx[8];
    idx[0] = idx0;
    for (int t = 1; t < taps; t++) idx[t] = _mm512_add_epi32(idx[t - 1], _mm512_set1_epi32(1));
    for (int c = 0; c < sch; c++) {
        const float *q = p + c * plane;
        __m512 lo = _mm512_loadu_ps(q), hi = _mm512_loadu_ps(q + 16);
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(wv), _mm512_permutex2var_ps(lo, idx[0], hi));
        for (int t = 1; t < taps; t++)
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(wv + 16 * t),
                                               _mm512_permutex2var_ps(lo, idx[t], hi)));
        acc[c] = a;
    }
}

/* The same for any number of taps (up to 32), or gathered from anywhere. */
AVX512 static void taps_any16(const float *p, size_t plane, int sch, __m512i idx0, const float *wv,
                              int taps, int gather, __m512 *acc) {
    const __m512i one = _mm512_set1_epi32(1);
    for (int c = 0; c < sch; c++) {
        const float *q = p + c * plane;
        __m512 a;
        if (!gather) {
            __m512 lo = _mm512_loadu_ps(q), hi = _mm512_loadu_ps(q + 16);
            __m512i idx = idx0;
            a = _mm512_mul_ps(_mm512_loadu_ps(wv), _mm512_permutex2var_ps(lo, idx, hi));
            for (int t = 1; t < taps; t++) {
                idx = _mm512_add_epi32(idx, one);
                a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(wv + 16 * t),
                                                   _mm512_permutex2var_ps(lo, idx, hi)));
            }
        } else {
            a = _mm512_mul_ps(_mm512_loadu_ps(wv), _mm512_i32gather_ps(idx0, q, 4));
            for (int t = 1; t < taps; t++)
                a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(wv + 16 * t),
                                                   _mm512_i32gather_ps(idx0, q + t, 4)));
        }
        acc[c] = a;
    }
}

/* The taps of a block that lie within 64 values of p: bit 5 of a lane's
 * index picks the pair of vectors the two-vector permute reads. */
AVX512 static void taps_wide16(const float *p, size_t plane, int sch, __m512i idx0, const float *wv,
                               int taps, __m512 *acc) {
    const __m512i one = _mm512_set1_epi32(1), pair = _mm512_set1_epi32(32);
    for (int c = 0; c < sch; c++) {
        const float *q = p + c * plane;
        __m512 v0 = _mm512_loadu_ps(q), v1 = _mm512_loadu_ps(q + 16), v2 = _mm512_loadu_ps(q + 32),
               v3 = _mm512_loadu_ps(q + 48);
        __m512i idx = idx0;
        __m512 a = _mm512_setzero_ps();
        for (int t = 0; t < taps; t++) {
            __m512 x = _mm512_mask_blend_ps(_mm512_test_epi32_mask(idx, pair),
                                            _mm512_permutex2var_ps(v0, idx, v1),
                                            _mm512_permutex2var_ps(v2, idx, v3));
            __m512 prod = _mm512_mul_ps(_mm512_loadu_ps(wv + 16 * t), x);
            a = t == 0 ? prod : _mm512_add_ps(a, prod);
            idx = _mm512_add_epi32(idx, one);
        }
        acc[c] = a;
    }
}

AVX512 static void row_avx512(const dsrt__row_job *j) {
    const dsrt__sink *s = j->s;
    const dsrt__axis *ax = j->ax;
    int sch = s->sch, taps = ax->taps;
    if (interleaved_row(ax, INT_MAX)) {
        vpass_avx512(j->tmp, 0, j->src, j->stride, j->n, j->w, (ax->hi - ax->lo) * sch, 1);
        dsrt__hpass_sink(s, j->v, j->tmp, ax);
        return;
    }
    float *planes = j->tmp;
    vpass_avx512(planes, j->plane, j->src, j->stride, j->n, j->w, ax->hi - ax->lo, sch);
    size_t ostride = (size_t)s->ow * s->oh;
    void *out = s->f32 ? (void *)((float *)s->dst + (size_t)j->v * s->ow)
                       : (void *)((uint8_t *)s->dst + (size_t)j->v * s->ow * s->ch);
    for (int b = 0; b < ax->nb; b++) {
        int u0 = b * 16, lanes = DSRT_MIN(16, ax->n - u0);
        int mode = ax->bmode[b];
        if (mode == BLOCK_SCALAR) {
            dsrt__hpass_outputs(j, planes, u0, u0 + lanes, out, ostride);
            continue;
        }
        __m512i idx0 = _mm512_loadu_si512(ax->bidx + (size_t)b * 16);
        const float *wv = ax->bw + (size_t)b * taps * 16;
        const float *p = planes + ax->bbase[b];
        __m512 acc[3];
        if (mode == BLOCK_GATHER)
            taps_any16(p, j->plane, sch, idx0, wv, taps, 1, acc);
        else if (mode == BLOCK_WIDE)
            taps_wide16(p, j->plane, sch, idx0, wv, taps, acc);
        else if (taps == 2)
            taps_permute16(p, j->plane, sch, idx0, wv, 2, acc);
        else if (taps == 3)
            taps_permute16(p, j->plane, sch, idx0, wv, 3, acc);
        else if (taps == 4)
            taps_permute16(p, j->plane, sch, idx0, wv, 4, acc);
        else if (taps == 5)
            taps_permute16(p, j->plane, sch, idx0, wv, 5, acc);
        else
            taps_any16(p, j->plane, sch, idx0, wv, taps, 0, acc);
        write16(s, out, ostride, u0, lanes, acc);
    }
}

/* Whole source pixels into float planes: (x - sub) / div, the table's
 * value to the bit. The rest (bytes out, right to left) is scalar. */
AVX512 static void copy_avx512(const dsrt__sink *s, int v, const uint8_t *src,
                               const dsrt__axis *ax) {
    int n = ax->run_len, u0 = ax->run_first, sch = s->sch;
    if (!s->f32 || ax->run_dir < 0 || n < 16) {
        dsrt__copy_scalar(s, v, src, ax);
        return;
    }
    dsrt__sink_fill(s, v, 0, u0);
    dsrt__sink_fill(s, v, u0 + n, s->ow);
    const uint8_t *p = src + (size_t)ax->run_src * sch;
    size_t plane = (size_t)s->ow * s->oh;
    float *o = (float *)s->dst + (size_t)v * s->ow + u0;
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512 x[3];
        if (sch == 3) {
            int bytes = 3 * (n - i);
            const uint8_t *q = p + (size_t)3 * i;
            __m512 a = load16_u8_mask(q, bytes16(bytes));
            __m512 b = load16_u8_mask(q + 16, bytes16(bytes - 16));
            __m512 c = load16_u8_mask(q + 32, bytes16(bytes - 32));
            for (int ch = 0; ch < 3; ch++) x[ch] = split16(a, b, c, ch);
        } else {
            x[0] = x[1] = x[2] = load16_u8_mask(p + i, m);
        }
        for (int c = 0; c < s->ch; c++) {
            __m512 y = _mm512_div_ps(_mm512_sub_ps(x[c], _mm512_set1_ps(s->sub[c])),
                                     _mm512_set1_ps(s->div[c]));
            if (m == 0xffff)
                _mm512_storeu_ps(o + c * plane + i, y);
            else
                _mm512_mask_storeu_ps(o + c * plane + i, m, y);
        }
    }
}

// ----------------------------------------------------------------------------
// AVX2

AVX2 static inline __m256 load8_u8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

AVX2 static inline __m256 vsum8(const uint8_t *src, size_t stride, int n, const float *w,
                                size_t o) {
    __m256 acc = _mm256_mul_ps(_mm256_set1_ps(w[0]), load8_u8(src + o));
    for (int j = 1; j < n; j++)
        acc = _mm256_add_ps(
            acc, _mm256_mul_ps(_mm256_set1_ps(w[j]), load8_u8(src + (size_t)j * stride + o)));
    return acc;
}

/* The sums of 24 bytes at o over n rows, three side by side, each row's
 * weight broadcast once for the three. Inlined, so that where n is a
 * constant the rows unroll. */
AVX2 static inline __attribute__((always_inline)) void
vsum24(const uint8_t *src, size_t stride, int n, const float *w, size_t o, __m256 *a) {
    __m256 wj = _mm256_set1_ps(w[0]);
    a[0] = _mm256_mul_ps(wj, load8_u8(src + o));
    a[1] = _mm256_mul_ps(wj, load8_u8(src + o + 8));
    a[2] = _mm256_mul_ps(wj, load8_u8(src + o + 16));
    for (int j = 1; j < n; j++) {
        const uint8_t *r = src + (size_t)j * stride + o;
        wj = _mm256_set1_ps(w[j]);
        a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(wj, load8_u8(r)));
        a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(wj, load8_u8(r + 8)));
        a[2] = _mm256_add_ps(a[2], _mm256_mul_ps(wj, load8_u8(r + 16)));
    }
}

/* Every whole group of 8 pixels of 3 channels (24 bytes) into the planes.
 * Returns the pixels done. */
AVX2 static inline __attribute__((always_inline)) int vpass3_groups8(float *planes, size_t plane,
                                                                     const uint8_t *src,
                                                                     size_t stride, int n,
                                                                     const float *w, int px) {
    int i = 0;
    for (; i + 8 <= px; i += 8) {
        __m256 a[3];
        vsum24(src, stride, n, w, (size_t)3 * i, a);
        _mm256_storeu_ps(planes + i, SPLIT8(a[0], a[1], a[2], 0, 0x92, 0x24));
        _mm256_storeu_ps(planes + plane + i, SPLIT8(a[0], a[1], a[2], 1, 0x24, 0x49));
        _mm256_storeu_ps(planes + 2 * plane + i, SPLIT8(a[0], a[1], a[2], 2, 0x49, 0x92));
    }
    return i;
}

/* The vertical pass, 8 pixels at a time (values: 24 at a time for one
 * channel); the last few one value at a time, with the same arithmetic. */
AVX2 static void vpass_avx2(float *planes, size_t plane, const uint8_t *src, size_t stride, int n,
                            const float *w, int px, int sch) {
    int i = 0;
    if (sch == 1) {
        for (; i + 24 <= px; i += 24) {
            __m256 a[3];
            vsum24(src, stride, n, w, (size_t)i, a);
            for (int k = 0; k < 3; k++) _mm256_storeu_ps(planes + i + 8 * k, a[k]);
        }
        for (; i + 8 <= px; i += 8) _mm256_storeu_ps(planes + i, vsum8(src, stride, n, w, i));
    } else {
        /* The common counts of rows (1 to 6) as constants. */
        switch (n) {
        case 1:
            i = vpass3_groups8(planes, plane, src, stride, 1, w, px);
            break;
        case 2:
            i = vpass3_groups8(planes, plane, src, stride, 2, w, px);
            break;
        case 3:
            i = vpass3_groups8(planes, plane, src, stride, 3, w, px);
            break;
        case 4:
            i = vpass3_groups8(planes, plane, src, stride, 4, w, px);
            break;
        case 5:
            i = vpass3_groups8(planes, plane, src, stride, 5, w, px);
            break;
        case 6:
            i = vpass3_groups8(planes, plane, src, stride, 6, w, px);
            break;
        default:
            i = vpass3_groups8(planes, plane, src, stride, n, w, px);
        }
    }
    for (; i < px; i++)
        for (int c = 0; c < sch; c++) {
            size_t o = (size_t)i * sch + c;
            float acc = w[0] * (float)src[o];
            for (int j = 1; j < n; j++) acc += w[j] * (float)src[(size_t)j * stride + o];
            planes[c * plane + i] = acc;
        }
}

AVX2 static inline void write8(const dsrt__sink *s, void *out, size_t ostride, int u0, int lanes,
                               const __m256 *acc) {
    int och = s->ch, sch = s->sch;
    if (s->f32) {
        size_t plane = ostride;
        float *o = (float *)out + u0;
        for (int c = 0; c < och; c++) {
            /* x - (+0) is x: no subtraction when there is nothing to subtract. */
            __m256 x = acc[sch == 1 ? 0 : c];
            if (!(s->sub[c] == 0.0f && !signbit(s->sub[c])))
                x = _mm256_sub_ps(x, _mm256_set1_ps(s->sub[c]));
            __m256 r = _mm256_mul_ps(x, _mm256_set1_ps(s->inv[c]));
            if (lanes == 8) {
                _mm256_storeu_ps(o + c * plane, r);
            } else { /* plain stores (see the top) */
                float t[8];
                _mm256_storeu_ps(t, r);
                memcpy(o + c * plane, t, (size_t)lanes * sizeof *t);
            }
        }
        return;
    }
    __m256i q[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < sch; c++) {
        __m256 x = _mm256_add_ps(acc[c], _mm256_set1_ps(0.5f));
        x = _mm256_min_ps(_mm256_max_ps(x, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
        q[c] = _mm256_cvttps_epi32(x);
    }
    uint8_t *o = (uint8_t *)out + (size_t)u0 * och;
    uint8_t spill[32];
    if (och == 1) {
        __m256i b = _mm256_shuffle_epi8(
            q[0], _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pack1_bytes)));
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
        _mm256_storeu_si256((__m256i *)spill, b);
        memcpy(o, spill, (size_t)lanes);
        return;
    }
    if (sch == 1) q[1] = q[2] = q[0];
    __m256i pix = _mm256_or_si256(
        q[0], _mm256_or_si256(_mm256_slli_epi32(q[1], 8), _mm256_slli_epi32(q[2], 16)));
    __m256i b = _mm256_shuffle_epi8(
        pix, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pack3_bytes)));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7));
    if (lanes == 8) { /* 24 bytes: plain stores (see write16's floats) */
        _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(b));
        _mm_storel_epi64((__m128i *)(o + 16), _mm256_extracti128_si256(b, 1));
    } else {
        _mm256_storeu_si256((__m256i *)spill, b);
        memcpy(o, spill, (size_t)3 * lanes);
    }
}

/* The taps of one block for the sch planes, every tap within the 16 values
 * from p: a permute of each of the two vectors and a blend a tap, the
 * indices and the blends' masks made once for all planes (bit 3 of a
 * lane's index, to the sign bit, picks the vector). taps is a constant
 * where it is called. */
AVX2 static inline __attribute__((always_inline)) void taps_permute8(const float *p, size_t plane,
                                                                     int sch, __m256i idx0,
                                                                     const float *wv, int taps,
                                                                     __m256 *acc) {
    __m256i idx[4];
    __m256 high[4];
    for (int t = 0; t < taps; t++) {
        idx[t] = t == 0 ? idx0 : _mm256_add_epi32(idx[t - 1], _mm256_set1_epi32(1));
        high[t] = _mm256_castsi256_ps(_mm256_slli_epi32(idx[t], 28));
    }
    for (int c = 0; c < sch; c++) {
        const float *q = p + c * plane;
        __m256 lo = _mm256_loadu_ps(q), hi = _mm256_loadu_ps(q + 8), a = _mm256_setzero_ps();
        for (int t = 0; t < taps; t++) {
            __m256 x = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx[t]),
                                        _mm256_permutevar8x32_ps(hi, idx[t]), high[t]);
            __m256 prod = _mm256_mul_ps(_mm256_loadu_ps(wv + 8 * t), x);
            a = t == 0 ? prod : _mm256_add_ps(a, prod);
        }
        acc[c] = a;
    }
}

AVX2 static void row_avx2(const dsrt__row_job *j) {
    const dsrt__sink *s = j->s;
    const dsrt__axis *ax = j->ax;
    int sch = s->sch, taps = ax->taps;
    if (interleaved_row(ax, 4)) {
        vpass_avx2(j->tmp, 0, j->src, j->stride, j->n, j->w, (ax->hi - ax->lo) * sch, 1);
        dsrt__hpass_sink(s, j->v, j->tmp, ax);
        return;
    }
    float *planes = j->tmp;
    vpass_avx2(planes, j->plane, j->src, j->stride, j->n, j->w, ax->hi - ax->lo, sch);
    size_t ostride = (size_t)s->ow * s->oh;
    void *out = s->f32 ? (void *)((float *)s->dst + (size_t)j->v * s->ow)
                       : (void *)((uint8_t *)s->dst + (size_t)j->v * s->ow * s->ch);
    const __m256i one = _mm256_set1_epi32(1);
    for (int b = 0; b < ax->nb; b++) {
        int u0 = b * 8, lanes = DSRT_MIN(8, ax->n - u0);
        int mode = ax->bmode[b];
        /* Blocks whose taps reach further than four vectors go through the
         * scalar code, which is faster than AVX2's gathers on AMD's cores; so
         * do permute blocks of more than 4 taps (a short last block of a
         * large reduction: 8 outputs that reach no further than 16 values
         * have 4 taps at most). */
        if (mode == BLOCK_SCALAR || mode == BLOCK_GATHER || (mode == BLOCK_PERMUTE && taps > 4)) {
            dsrt__hpass_outputs(j, planes, u0, u0 + lanes, out, ostride);
            continue;
        }
        __m256i idx0 = _mm256_loadu_si256((const __m256i *)(ax->bidx + (size_t)b * 8));
        const float *wv = ax->bw + (size_t)b * taps * 8;
        __m256 acc[3];
        if (mode == BLOCK_PERMUTE) {
            const float *p = planes + ax->bbase[b];
            if (taps == 1)
                taps_permute8(p, j->plane, sch, idx0, wv, 1, acc);
            else if (taps == 2)
                taps_permute8(p, j->plane, sch, idx0, wv, 2, acc);
            else if (taps == 3)
                taps_permute8(p, j->plane, sch, idx0, wv, 3, acc);
            else
                taps_permute8(p, j->plane, sch, idx0, wv, 4, acc);
            write8(s, out, ostride, u0, lanes, acc);
            continue;
        }
        for (int c = 0; c < sch; c++) {
            /* BLOCK_WIDE: every tap lies in these 32 values: bit 3 of a
             * lane's index picks the vector of a pair, bit 4 the pair (to
             * the sign bits that blendv reads). */
            const float *p = planes + c * j->plane + ax->bbase[b];
            __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8),
                   v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
            __m256i idx = idx0;
            __m256 a = _mm256_setzero_ps();
            for (int t = 0; t < taps; t++) {
                __m256 odd = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)),
                       high = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27));
                __m256 x =
                    _mm256_blendv_ps(_mm256_blendv_ps(_mm256_permutevar8x32_ps(v0, idx),
                                                      _mm256_permutevar8x32_ps(v1, idx), odd),
                                     _mm256_blendv_ps(_mm256_permutevar8x32_ps(v2, idx),
                                                      _mm256_permutevar8x32_ps(v3, idx), odd),
                                     high);
                __m256 prod = _mm256_mul_ps(_mm256_loadu_ps(wv + 8 * t), x);
                a = t == 0 ? prod : _mm256_add_ps(a, prod);
                idx = _mm256_add_epi32(idx, one);
            }
            acc[c] = a;
        }
        write8(s, out, ostride, u0, lanes, acc);
    }
}

AVX2 static void copy_avx2(const dsrt__sink *s, int v, const uint8_t *src, const dsrt__axis *ax) {
    int n = ax->run_len, u0 = ax->run_first, sch = s->sch;
    if (!s->f32 || ax->run_dir < 0 || n < 8) {
        dsrt__copy_scalar(s, v, src, ax);
        return;
    }
    dsrt__sink_fill(s, v, 0, u0);
    dsrt__sink_fill(s, v, u0 + n, s->ow);
    const uint8_t *p = src + (size_t)ax->run_src * sch;
    size_t plane = (size_t)s->ow * s->oh;
    float *o = (float *)s->dst + (size_t)v * s->ow + u0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x[3];
        if (sch == 3) {
            const uint8_t *q = p + (size_t)3 * i;
            __m256 a = load8_u8(q), b = load8_u8(q + 8), c = load8_u8(q + 16);
            x[0] = SPLIT8(a, b, c, 0, 0x92, 0x24);
            x[1] = SPLIT8(a, b, c, 1, 0x24, 0x49);
            x[2] = SPLIT8(a, b, c, 2, 0x49, 0x92);
        } else {
            x[0] = x[1] = x[2] = load8_u8(p + i);
        }
        for (int c = 0; c < s->ch; c++)
            _mm256_storeu_ps(o + c * plane + i,
                             _mm256_div_ps(_mm256_sub_ps(x[c], _mm256_set1_ps(s->sub[c])),
                                           _mm256_set1_ps(s->div[c])));
    }
    for (; i < n; i++)
        for (int c = 0; c < s->ch; c++)
            o[c * plane + i] = s->lut[c * 256 + p[(size_t)i * sch + (sch == 3 ? c : 0)]];
}

// ----------------------------------------------------------------------------
// The tables

/* A block of 16 outputs reads at most 32 values to be permuted (two
 * vectors); of 8, 16. */
static const dsrt__resample_ops avx512_ops = {"avx512", 16, 32, row_avx512, copy_avx512, 64};
static const dsrt__resample_ops avx2_ops = {"avx2", 8, 16, row_avx2, copy_avx2, 32};

const dsrt__resample_ops *dsrt__resample_avx512(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return &avx512_ops;
    return NULL;
}

const dsrt__resample_ops *dsrt__resample_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? &avx2_ops : NULL;
}

#else

const dsrt__resample_ops *dsrt__resample_avx512(void) {
    return NULL;
}

const dsrt__resample_ops *dsrt__resample_avx2(void) {
    return NULL;
}

#endif
