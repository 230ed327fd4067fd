/*
 * JPEGs taken apart, edited and written, for the tests and fuzzers of the
 * decoders: hostile files are made in the test code from valid ones (made
 * with TurboJPEG or libjpeg), so that no binary file is committed. Every
 * function is static inline; buffers returned are malloc'd and freed by the
 * caller with free(); NULL on failure.
 *
 * Pieces
 *   jk_pieces(j, len, out, max)  the file as a list of pieces: each marker
 *                                and its segment (SOI, RSTn and EOI too),
 *                                and each run of other bytes (the
 *                                entropy-coded data after a scan header,
 *                                or junk), JK_DATA
 *   jk_find(j, len, code, nth, &at, &n)
 *                                the nth piece (from 0) of marker code
 *   jk_splice(j, len, at, drop, ins, ins_len, &out_len)
 *                                a copy with bytes [at, at + drop) replaced
 *                                by ins_len bytes of ins
 *   jk_without(j, len, code, &out_len)
 *                                a copy without any segment of marker code
 *   jk_dht(cls, id, counts, vals, &len)
 *                                a DHT segment of one table (cls 0: DC, 1: AC)
 *   jk_table(j, len, cls, id, counts, vals)
 *                                the last table cls/id a DHT of j defines
 *
 * Synthetic files
 *   jk_synth(&spec, model, model_len, &len)
 *                                a baseline or progressive JPEG with any
 *                                sampling factors, restart interval and
 *                                scan layout, written here with the first
 *                                quantisation table and the luminance
 *                                Huffman tables of model (a TurboJPEG
 *                                file): a DC term of each block from the
 *                                seed, and a few AC terms a block. Its
 *                                interleaved scans may hold more blocks
 *                                than libjpeg allows (10): such files are
 *                                the ones libjpeg refuses.
 */
#ifndef DSRT_TEST_JPEGKIT_H
#define DSRT_TEST_JPEGKIT_H

#include "testimg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Pieces

#define JK_DATA 0 /* the code of a piece of bytes that are not a marker's */

typedef struct {
    int code;       /* marker code (0xC0 ...), or JK_DATA */
    size_t at, len; /* bytes of the file, from the marker's 0xFF */
} jk_piece;

static inline int jk_be16(const uint8_t *p) {
    return p[0] << 8 | p[1];
}

/* Markers without a length: SOI, EOI, RSTn, TEM. */
static inline int jk_bare(int code) {
    return code == 0xd8 || code == 0xd9 || (code >= 0xd0 && code <= 0xd7) || code == 0x01;
}

/* The pieces of j, at most max of them; their count. Bytes that are not a
 * marker run to the next marker (0xFF followed by neither 0x00 nor 0xFF),
 * so a scan's data holds its stuffed zeros and restart markers. */
static inline int jk_pieces(const uint8_t *j, size_t len, jk_piece *out, int max) {
    int n = 0;
    size_t pos = 0;
    int in_scan = 0;
    while (pos < len && n < max) {
        int marker = pos + 1 < len && j[pos] == 0xff && j[pos + 1] != 0x00 && j[pos + 1] != 0xff;
        if (marker && in_scan && j[pos + 1] >= 0xd0 && j[pos + 1] <= 0xd7) marker = 0;
        if (!marker) {
            size_t e = pos + 1;
            while (e + 1 < len && !(j[e] == 0xff && j[e + 1] != 0x00 && j[e + 1] != 0xff &&
                                    !(in_scan && j[e + 1] >= 0xd0 && j[e + 1] <= 0xd7)))
                e++;
            if (e + 1 >= len) e = len;
            out[n++] = (jk_piece){JK_DATA, pos, e - pos};
            pos = e;
            continue;
        }
        int code = j[pos + 1];
        size_t seg = 2;
        if (!jk_bare(code)) seg = pos + 4 <= len ? 2 + (size_t)jk_be16(j + pos + 2) : len - pos;
        if (seg > len - pos) seg = len - pos;
        out[n++] = (jk_piece){code, pos, seg};
        pos += seg;
        in_scan = code == 0xda ? 1 : jk_bare(code) && code != 0xd9 ? in_scan : 0;
        if (code == 0xd9) break;
    }
    return n;
}

/* The nth piece (from 0) with marker code: 0 and its bytes in *at, *n, or
 * -1 when there is none. */
static inline int jk_find(const uint8_t *j, size_t len, int code, int nth, size_t *at, size_t *n) {
    jk_piece p[512];
    int count = jk_pieces(j, len, p, 512);
    for (int i = 0; i < count; i++) {
        if (p[i].code != code || nth-- > 0) continue;
        *at = p[i].at;
        *n = p[i].len;
        return 0;
    }
    return -1;
}

static inline uint8_t *jk_splice(const uint8_t *j, size_t len, size_t at, size_t drop,
                                 const void *ins, size_t ins_len, size_t *out_len) {
    if (at > len || drop > len - at) return NULL;
    uint8_t *o = malloc(len - drop + ins_len + 1);
    if (!o) return NULL;
    memcpy(o, j, at);
    if (ins_len) memcpy(o + at, ins, ins_len);
    memcpy(o + at + ins_len, j + at + drop, len - at - drop);
    *out_len = len - drop + ins_len;
    return o;
}

static inline uint8_t *jk_without(const uint8_t *j, size_t len, int code, size_t *out_len) {
    uint8_t *o = malloc(len + 1);
    if (!o) return NULL;
    jk_piece p[512];
    int count = jk_pieces(j, len, p, 512);
    size_t n = 0, end = 0;
    for (int i = 0; i < count; i++) {
        if (p[i].code != code) memcpy(o + n, j + p[i].at, p[i].len), n += p[i].len;
        end = p[i].at + p[i].len;
    }
    memcpy(o + n, j + end, len - end); /* anything after the pieces */
    *out_len = n + len - end;
    return o;
}

static inline uint8_t *jk_dht(int cls, int id, const uint8_t counts[16], const uint8_t *vals,
                              size_t *len) {
    size_t nv = 0;
    for (int i = 0; i < 16; i++) nv += counts[i];
    size_t n = 2 + 2 + 1 + 16 + nv;
    uint8_t *o = malloc(n);
    if (!o) return NULL;
    o[0] = 0xff;
    o[1] = 0xc4;
    o[2] = (uint8_t)((n - 2) >> 8);
    o[3] = (uint8_t)(n - 2);
    o[4] = (uint8_t)(cls << 4 | id);
    memcpy(o + 5, counts, 16);
    memcpy(o + 21, vals, nv);
    *len = n;
    return o;
}

/* The last table of class cls (0 DC, 1 AC) and id that a DHT of j defines:
 * 0 and its counts and values (vals holds 256), or -1. */
static inline int jk_table(const uint8_t *j, size_t len, int cls, int id, uint8_t counts[16],
                           uint8_t *vals) {
    int found = -1;
    size_t at, n;
    for (int k = 0; jk_find(j, len, 0xc4, k, &at, &n) == 0; k++) {
        const uint8_t *p = j + at + 4, *end = j + at + n;
        while (p + 17 <= end) {
            size_t nv = 0;
            for (int i = 0; i < 16; i++) nv += p[1 + i];
            if (nv > 256 || p + 17 + nv > end) break;
            if (p[0] == (cls << 4 | id)) {
                memcpy(counts, p + 1, 16);
                memcpy(vals, p + 17, nv);
                found = 0;
            }
            p += 17 + nv;
        }
    }
    return found;
}

// ----------------------------------------------------------------------------
// Synthetic files

typedef struct {
    int w, h, ncomp; /* ncomp 1 or 3 */
    int samp[3][2];  /* (h, v) of each component: 1..4 */
    int restart;     /* MCUs (blocks, in one-component scans) an interval; 0: none */
    int progressive; /* DC scans, then one AC scan a component, stepping over terms 1..63 */
    int interleave;  /* 0: one scan a component; 1: all in one scan; 2: Y, then Cb and Cr */
    int ac_terms;    /* baseline: nonzero AC terms a block, at most */
    int dc_al;       /* progressive: the first DC scans' Al (0 or 1: 1 adds refinement scans) */
    uint32_t seed;
} jk_spec;

typedef struct {
    uint8_t *p;
    size_t len, cap;
    int failed;
} jk_buf;

static inline void jk_put(jk_buf *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n) c *= 2;
        uint8_t *p = realloc(b->p, c);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static inline void jk_byte(jk_buf *b, int v) {
    uint8_t c = (uint8_t)v;
    jk_put(b, &c, 1);
}

static inline void jk_put16(jk_buf *b, int v) {
    jk_byte(b, v >> 8);
    jk_byte(b, v);
}

/* Entropy-coded bits, most significant first, 0xFF bytes stuffed. */
typedef struct {
    jk_buf *b;
    uint64_t acc;
    int n;
} jk_bits;

static inline void jk_bits_put(jk_bits *w, uint32_t v, int n) {
    if (n <= 0) return;
    w->acc = w->acc << n | (v & (uint32_t)((1ull << n) - 1));
    w->n += n;
    while (w->n >= 8) {
        int byte = (int)(w->acc >> (w->n - 8)) & 255;
        jk_byte(w->b, byte);
        if (byte == 0xff) jk_byte(w->b, 0);
        w->n -= 8;
    }
}

/* Pads the last byte with ones (as encoders do). */
static inline void jk_bits_flush(jk_bits *w) {
    if (w->n % 8) jk_bits_put(w, 0xff, 8 - w->n % 8);
}

typedef struct {
    uint16_t code[256];
    uint8_t size[256]; /* 0: the symbol has no code */
} jk_huff;

static inline void jk_huff_make(const uint8_t counts[16], const uint8_t *vals, jk_huff *h) {
    memset(h, 0, sizeof *h);
    uint32_t code = 0;
    int k = 0;
    for (int l = 1; l <= 16; l++, code <<= 1)
        for (int i = 0; i < counts[l - 1] && k < 256; i++, k++, code++) {
            h->code[vals[k]] = (uint16_t)code;
            h->size[vals[k]] = (uint8_t)l;
        }
}

static inline int jk_category(int v) {
    int a = v < 0 ? -v : v, s = 0;
    while (a) s++, a >>= 1;
    return s;
}

/* Symbol sym's code, then the value v in s bits (JPEG's ones' complement
 * for negative values). */
static inline void jk_code(jk_bits *w, const jk_huff *h, int sym, int v, int s) {
    jk_bits_put(w, h->code[sym], h->size[sym]);
    if (s) jk_bits_put(w, (uint32_t)(v < 0 ? v - 1 : v), s);
}

static inline uint32_t jk_rand(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return timg_hash(*state);
}

/* The scan kinds jk_scan writes. */
enum { JK_SEQ, JK_DC_FIRST, JK_DC_REFINE, JK_AC_FIRST };

typedef struct {
    const jk_spec *s;
    jk_huff dc, ac;
    int mcux, mcuy, hmax, vmax;
    int bw[3], bh[3], cw[3], ch[3]; /* blocks: whole MCUs, and the component's own */
    int16_t *dcv[3];                /* (bh, bw) each block's DC term */
    uint32_t rng;
} jk_writer;

static inline void jk_block(jk_writer *k, jk_bits *w, int kind, int c, int bx, int by, int *pred) {
    int al = k->s->dc_al;
    int dc = k->dcv[c][(size_t)by * (size_t)k->bw[c] + (size_t)bx];
    if (kind == JK_DC_REFINE) {
        jk_bits_put(w, (uint32_t)(dc >> (al - 1)) & 1, 1);
        return;
    }
    if (kind == JK_AC_FIRST) {
        jk_code(w, &k->ac, 0x00, 0, 0); /* an end-of-band run of one block */
        return;
    }
    int v = kind == JK_DC_FIRST ? dc >> al : dc;
    int diff = v - *pred, s = jk_category(diff);
    *pred = v;
    jk_code(w, &k->dc, s, diff, s);
    if (kind != JK_SEQ) return;
    int at = 1,
        terms = k->s->ac_terms ? (int)(jk_rand(&k->rng) % (uint32_t)(k->s->ac_terms + 1)) : 0;
    for (int t = 0; t < terms; t++) {
        uint32_t r = jk_rand(&k->rng);
        if (r % 11 == 0 && at + 17 <= 63 && k->ac.size[0xf0]) { /* sixteen zeros */
            jk_code(w, &k->ac, 0xf0, 0, 0);
            at += 16;
        }
        int run = (int)(r >> 4) % 6, size = 1 + (int)(r >> 8) % 6;
        if (at + run > 63) break;
        int sym = run << 4 | size;
        if (!k->ac.size[sym]) continue;
        int mag = (1 << (size - 1)) + (int)((r >> 12) % (uint32_t)(1 << (size - 1)));
        jk_code(w, &k->ac, sym, r >> 20 & 1 ? -mag : mag, size);
        at += run + 1;
    }
    if (at < 64) jk_code(w, &k->ac, 0x00, 0, 0); /* end of block */
}

/* One scan of the n components comps (indices), of kind. */
static inline void jk_scan(jk_writer *k, jk_buf *b, const int *comps, int n, int kind) {
    static const int ss[] = {0, 0, 0, 1}, se[] = {63, 0, 0, 63};
    int al = k->s->dc_al;
    int ahal = kind == JK_DC_FIRST ? al : kind == JK_DC_REFINE ? al << 4 | (al - 1) : 0;
    jk_byte(b, 0xff);
    jk_byte(b, 0xda);
    jk_put16(b, 6 + 2 * n);
    jk_byte(b, n);
    for (int i = 0; i < n; i++) {
        jk_byte(b, comps[i] + 1);
        jk_byte(b, 0x00);
    }
    jk_byte(b, ss[kind]);
    jk_byte(b, se[kind]);
    jk_byte(b, ahal);
    jk_bits w = {b, 0, 0};
    int c0 = comps[0];
    size_t units =
        n == 1 ? (size_t)k->cw[c0] * (size_t)k->ch[c0] : (size_t)k->mcux * (size_t)k->mcuy;
    int pred[3] = {0, 0, 0}, rst = 0;
    for (size_t u = 0; u < units; u++) {
        if (k->s->restart && u && u % (size_t)k->s->restart == 0) {
            jk_bits_flush(&w);
            jk_byte(b, 0xff);
            jk_byte(b, 0xd0 + (rst++ & 7));
            memset(pred, 0, sizeof pred);
        }
        if (n == 1) {
            jk_block(k, &w, kind, c0, (int)(u % (size_t)k->cw[c0]), (int)(u / (size_t)k->cw[c0]),
                     &pred[0]);
            continue;
        }
        int mx = (int)(u % (size_t)k->mcux), my = (int)(u / (size_t)k->mcux);
        for (int i = 0; i < n; i++) {
            int c = comps[i], h = k->s->samp[c][0], v = k->s->samp[c][1];
            for (int y = 0; y < v; y++)
                for (int x = 0; x < h; x++)
                    jk_block(k, &w, kind, c, mx * h + x, my * v + y, &pred[i]);
        }
    }
    jk_bits_flush(&w);
}

static inline uint8_t *jk_synth(const jk_spec *s, const uint8_t *model, size_t model_len,
                                size_t *len) {
    jk_writer k;
    memset(&k, 0, sizeof k);
    k.s = s;
    k.rng = s->seed * 2654435761u + 1;
    uint8_t dcc[16], dcv[256], acc[16], acv[256];
    size_t qat, qn;
    if (s->ncomp != 1 && s->ncomp != 3) return NULL;
    if (jk_table(model, model_len, 0, 0, dcc, dcv) || jk_table(model, model_len, 1, 0, acc, acv) ||
        jk_find(model, model_len, 0xdb, 0, &qat, &qn) || qn < 69 || model[qat + 4] != 0x00)
        return NULL;
    jk_huff_make(dcc, dcv, &k.dc);
    jk_huff_make(acc, acv, &k.ac);
    k.hmax = k.vmax = 1;
    for (int c = 0; c < s->ncomp; c++) {
        if (s->samp[c][0] < 1 || s->samp[c][0] > 4 || s->samp[c][1] < 1 || s->samp[c][1] > 4)
            return NULL;
        k.hmax = s->samp[c][0] > k.hmax ? s->samp[c][0] : k.hmax;
        k.vmax = s->samp[c][1] > k.vmax ? s->samp[c][1] : k.vmax;
    }
    k.mcux = (s->w + 8 * k.hmax - 1) / (8 * k.hmax);
    k.mcuy = (s->h + 8 * k.vmax - 1) / (8 * k.vmax);
    jk_buf b = {0};
    uint8_t *out = NULL;
    for (int c = 0; c < s->ncomp; c++) {
        k.bw[c] = k.mcux * s->samp[c][0];
        k.bh[c] = k.mcuy * s->samp[c][1];
        k.cw[c] = ((s->w * s->samp[c][0] + k.hmax - 1) / k.hmax + 7) / 8;
        k.ch[c] = ((s->h * s->samp[c][1] + k.vmax - 1) / k.vmax + 7) / 8;
        k.dcv[c] = malloc((size_t)k.bw[c] * (size_t)k.bh[c] * sizeof(int16_t));
        if (!k.dcv[c]) goto done;
        for (int y = 0; y < k.bh[c]; y++)
            for (int x = 0; x < k.bw[c]; x++) {
                uint32_t r = timg_hash(s->seed ^ (uint32_t)c * 0x9e3779b9u ^
                                       (uint32_t)(x / 2) * 7919u ^ (uint32_t)(y / 2) * 104729u);
                k.dcv[c][(size_t)y * (size_t)k.bw[c] + (size_t)x] = (int16_t)((int)(r % 161) - 80);
            }
    }
    jk_put(&b, "\xff\xd8", 2);
    jk_put(&b, model + qat, 69); /* table 0 */
    if (s->restart) {
        jk_put(&b, "\xff\xdd\x00\x04", 4);
        jk_put16(&b, s->restart);
    }
    jk_byte(&b, 0xff);
    jk_byte(&b, s->progressive ? 0xc2 : 0xc0);
    jk_put16(&b, 8 + 3 * s->ncomp);
    jk_byte(&b, 8);
    jk_put16(&b, s->h);
    jk_put16(&b, s->w);
    jk_byte(&b, s->ncomp);
    for (int c = 0; c < s->ncomp; c++) {
        jk_byte(&b, c + 1);
        jk_byte(&b, s->samp[c][0] << 4 | s->samp[c][1]);
        jk_byte(&b, 0);
    }
    size_t n;
    uint8_t *seg = jk_dht(0, 0, dcc, dcv, &n);
    if (seg) jk_put(&b, seg, n);
    free(seg);
    seg = jk_dht(1, 0, acc, acv, &n);
    if (seg) jk_put(&b, seg, n);
    free(seg);
    if (!seg) b.failed = 1;
    /* The scans' component groups. */
    int groups[3][3], sizes[3], ng = 0;
    if (s->ncomp == 1 || s->interleave == 0) {
        for (int c = 0; c < s->ncomp; c++) groups[ng][0] = c, sizes[ng++] = 1;
    } else if (s->interleave == 1) {
        for (int c = 0; c < 3; c++) groups[0][c] = c;
        sizes[ng++] = 3;
    } else {
        groups[0][0] = 0, sizes[ng++] = 1;
        groups[1][0] = 1, groups[1][1] = 2, sizes[ng++] = 2;
    }
    for (int g = 0; g < ng; g++)
        jk_scan(&k, &b, groups[g], sizes[g], s->progressive ? JK_DC_FIRST : JK_SEQ);
    if (s->progressive) {
        if (s->dc_al > 0)
            for (int g = 0; g < ng; g++) jk_scan(&k, &b, groups[g], sizes[g], JK_DC_REFINE);
        for (int c = 0; c < s->ncomp; c++) jk_scan(&k, &b, &c, 1, JK_AC_FIRST);
    }
    jk_put(&b, "\xff\xd9", 2);
    if (!b.failed) {
        out = b.p;
        *len = b.len;
        b.p = NULL;
    }
done:
    for (int c = 0; c < 3; c++) free(k.dcv[c]);
    free(b.p);
    return out;
}

#endif
