/*
 * The scalar writes of output pixels that every resampling kernel shares
 * (internal.h): fill, rows copied as whole source pixels, and outputs
 * computed one at a time from the vertical pass's planes. The scalar
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
