/*
 * The scalar writes of output pixels that every resampling kernel shares
 * (internal.h): fill, rows copied as whole source pixels, outputs computed
 * one at a time from the vertical pass's planes, and the scalar kernel's
 * horizontal pass over a row of interleaved channels. The scalar
 * kernel (augment.c) and the vector kernels (resample_x86.c) both write
 * through these, so their bytes agree.
 */
#include "internal.h"

/* As in augment.c: no product fused into a multiply-add (the kernels
 * repeat this arithmetic to the bit), and the loops vectorised with the
 * dynamic cost model GCC 12's -O2 does not use. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "fp-contract=off")
#endif

#include <string.h>

typedef dsrt__sink sink;
typedef dsrt__axis axis;

void dsrt__sink_fill(const sink *s, int v, int u0, int u1) {
    if (u1 <= u0) return;
    if (s->f32) {
        size_t plane = (size_t)s->ow * s->oh;
        for (int c = 0; c < s->ch; c++) {
            float *o = (float *)s->dst + c * plane + (size_t)v * s->ow;
            float f = (s->fill[c] - s->sub[c]) / s->div[c];
            for (int u = u0; u < u1; u++) o[u] = f;
        }
    } else {
        uint8_t *o = (uint8_t *)s->dst + (size_t)v * s->ow * s->ch;
        for (int c = 0; c < s->ch; c++) {
            uint8_t f = dsrt__to_u8(s->fill[c]);
            for (int u = u0; u < u1; u++) o[u * s->ch + c] = f;
        }
    }
}

/* The normalising write of whole pixels: byte p[j * step] of each channel
 * through its table, into the planes (step 3 or -3 reads right to left). */
static void planes3_u8(float *restrict o0, float *restrict o1, float *restrict o2,
                       const uint8_t *restrict p, ptrdiff_t step, int n,
                       const float *restrict lut) {
    const float *restrict l0 = lut, *restrict l1 = lut + 256, *restrict l2 = lut + 512;
    for (int j = 0; j < n; j++) {
        const uint8_t *q = p + j * step;
        o0[j] = l0[q[0]];
        o1[j] = l1[q[1]];
        o2[j] = l2[q[2]];
    }
}

static void plane1_u8(float *restrict o, const uint8_t *restrict p, ptrdiff_t step, int n,
                      const float *restrict lut) {
    for (int j = 0; j < n; j++) o[j] = lut[p[j * step]];
}

/* Writes output row v as whole source pixels: the copy run of ax read from
 * the source row src (uint8, interleaved), fill before and after it. No
 * interpolation: rows are copied (memcpy for uint8 output), reversed for a
 * reflection, or converted once for float output. */
void dsrt__copy_scalar(const sink *s, int v, const uint8_t *restrict src, const axis *ax) {
    int n = ax->run_len, u0 = ax->run_first;
    dsrt__sink_fill(s, v, 0, n ? u0 : s->ow);
    if (!n) return;
    dsrt__sink_fill(s, v, u0 + n, s->ow);
    int ch = s->ch, sch = s->sch;
    const uint8_t *p = src + (size_t)ax->run_src * sch;
    if (s->f32) {
        size_t plane = (size_t)s->ow * s->oh;
        float *o = (float *)s->dst + (size_t)v * s->ow + u0;
        if (sch == 3)
            planes3_u8(o, o + plane, o + 2 * plane, p, ax->run_dir * 3, n, s->lut);
        else
            for (int c = 0; c < ch; c++)
                plane1_u8(o + c * plane, p, ax->run_dir, n, s->lut + 256 * c);
    } else {
        uint8_t *restrict o = (uint8_t *)s->dst + ((size_t)v * s->ow + u0) * ch;
        if (sch != ch) {
            for (int j = 0; j < n; j++)
                for (int c = 0; c < ch; c++) o[j * ch + c] = p[j * ax->run_dir];
        } else if (ax->run_dir > 0) {
            memcpy(o, p, (size_t)n * ch);
        } else {
            for (int j = 0; j < n; j++)
                for (int c = 0; c < ch; c++) o[j * ch + c] = p[c - j * ch];
        }
    }
}

void dsrt__hpass_outputs(const dsrt__row_job *j, const float *planes, int u0, int u1, void *out,
                         size_t ostride) {
    const sink *s = j->s;
    const axis *ax = j->ax;
    int sch = s->sch, och = s->ch;
    for (int u = u0; u < u1; u++) {
        float acc[3];
        int cnt = ax->count[u];
        if (cnt == 0) {
            for (int c = 0; c < och; c++) acc[c] = s->fill[c];
        } else {
            const float *w = ax->w + (size_t)u * ax->k;
            for (int c = 0; c < sch; c++) {
                const float *p = planes + (size_t)c * j->plane + (ax->start[u] - ax->lo);
                float a = 0.0f;
                for (int t = 0; t < cnt; t++) a += w[t] * p[t];
                acc[c] = a;
            }
            if (sch == 1) acc[1] = acc[2] = acc[0];
        }
        if (s->f32) {
            float *o = (float *)out + u;
            for (int c = 0; c < och; c++) o[c * ostride] = (acc[c] - s->sub[c]) * s->inv[c];
        } else {
            uint8_t *o = (uint8_t *)out + (size_t)u * och;
            for (int c = 0; c < och; c++) o[c] = dsrt__to_u8(acc[c]);
        }
    }
}

// ----------------------------------------------------------------------------
// The scalar horizontal pass

/* Where the horizontal pass puts its results. */
enum { TO_HWC, TO_PLANES, TO_U8 };

/*
 * The horizontal pass: output u is sum_j w[u][j] * tmp[start[u] + j] (tmp
 * holding source pixels from ax->lo), or the fill value, written as floats
 * (ch, interleaved) to hwc, or straight into output row v of the sample. ch,
 * to and taps (the count of every entry, or 0 for each its own) are constants
 * at each call, so the loops specialise and unroll.
 */
static inline __attribute__((always_inline)) void
hpass_ch(const axis *ax, const float *restrict tmp, const float *fill, int ch, int och, int to,
         int taps, float *restrict hwc, const sink *s, int v) {
    const int k = ax->k;
    float *restrict pl[3] = {NULL, NULL, NULL};
    uint8_t *restrict o8 = NULL;
    v4sf sub = {0.0f, 0.0f, 0.0f, 0.0f}, inv = {1.0f, 1.0f, 1.0f, 1.0f};
    v4sf fill4 = {fill[0], och == 3 ? fill[1] : 0.0f, och == 3 ? fill[2] : 0.0f, 0.0f};
    if (to == TO_PLANES) {
        size_t plane = (size_t)s->ow * s->oh;
        for (int c = 0; c < och; c++) {
            pl[c] = (float *)s->dst + c * plane + (size_t)v * s->ow;
            sub[c] = s->sub[c];
            inv[c] = s->inv[c];
        }
    } else if (to == TO_U8) {
        o8 = (uint8_t *)s->dst + (size_t)v * s->ow * och;
    }
    for (int u = 0; u < ax->n; u++) {
        int cnt = ax->count[u];
        v4sf acc = fill4;
        if (cnt != 0) {
            const float *restrict p = tmp + (size_t)(ax->start[u] - ax->lo) * ch;
            const float *restrict w = ax->w + (size_t)u * k;
            int m = taps ? taps : cnt;
            acc = (v4sf){0.0f, 0.0f, 0.0f, 0.0f};
            if (ch == 3) {
                /* One 4-lane multiply-add per tap: lanes R, G, B and the next
                 * pixel's R (ignored; tmp has slack at its end). */
                for (int j = 0; j < m; j++) {
                    v4sf x;
                    memcpy(&x, p + 3 * j, sizeof x);
                    acc += w[j] * x;
                }
            } else {
                float a = 0.0f;
                for (int j = 0; j < m; j++) a += w[j] * p[j];
                acc[0] = acc[1] = acc[2] = a; /* a gray source gives every channel */
            }
        }
        if (to == TO_PLANES) {
            v4sf r = (acc - sub) * inv;
            for (int c = 0; c < och; c++) pl[c][u] = r[c];
        }
        for (int c = 0; c < och; c++) {
            if (to == TO_HWC) hwc[(size_t)u * och + c] = acc[c];
            if (to == TO_U8) o8[(size_t)u * och + c] = dsrt__to_u8(acc[c]);
        }
    }
}

/* hpass_ch for 3 channels with the common tap counts unrolled. */
#define HPASS3(to, hwc, s, v)                                                                      \
    switch (ax->taps) {                                                                            \
    case 2:                                                                                        \
        hpass_ch(ax, tmp, fill, 3, 3, to, 2, hwc, s, v);                                           \
        break;                                                                                     \
    case 3:                                                                                        \
        hpass_ch(ax, tmp, fill, 3, 3, to, 3, hwc, s, v);                                           \
        break;                                                                                     \
    case 4:                                                                                        \
        hpass_ch(ax, tmp, fill, 3, 3, to, 4, hwc, s, v);                                           \
        break;                                                                                     \
    default:                                                                                       \
        hpass_ch(ax, tmp, fill, 3, 3, to, 0, hwc, s, v);                                           \
    }

void dsrt__hpass_hwc(float *hwc, const float *tmp, const axis *ax, const float *fill, int ch) {
    if (ch == 3) {
        HPASS3(TO_HWC, hwc, NULL, 0)
    } else {
        hpass_ch(ax, tmp, fill, 1, 1, TO_HWC, 0, hwc, NULL, 0);
    }
}

void dsrt__hpass_sink(const sink *s, int v, const float *tmp, const axis *ax) {
    const float *fill = s->fill;
    if (s->sch == 3 && s->f32) {
        HPASS3(TO_PLANES, NULL, s, v)
    } else if (s->sch == 3) {
        HPASS3(TO_U8, NULL, s, v)
    } else if (s->ch == 3 && s->f32) {
        hpass_ch(ax, tmp, fill, 1, 3, TO_PLANES, 0, NULL, s, v);
    } else if (s->ch == 3) {
        hpass_ch(ax, tmp, fill, 1, 3, TO_U8, 0, NULL, s, v);
    } else if (s->f32) {
        hpass_ch(ax, tmp, fill, 1, 1, TO_PLANES, 0, NULL, s, v);
    } else {
        hpass_ch(ax, tmp, fill, 1, 1, TO_U8, 0, NULL, s, v);
    }
}
