/*
 * JPEGs at 1/8 scale from their DC terms alone (see jpeg_dc.h for what it
 * gives and takes).
 *
 * The entropy-coded data of a scan is first copied without its stuffed
 * zeros, restart markers noted (where each interval starts), and a few
 * kilobytes of zeros after it. The decoder then reads it through a 64-bit
 * bit buffer without a check for the data's end or its markers: the zeros
 * cover the furthest one MCU can read past the end, and the position is
 * checked against the end after every MCU.
 *
 * Huffman codes of up to FAST_BITS bits are looked up in one table indexed
 * by the next FAST_BITS bits. For a DC table an entry holds the code's
 * length and the size of the value after it; for an AC table, whose values
 * are only stepped over, it holds the bits the code and its value take
 * together and how far the coefficient index moves (the run plus one, 16
 * for a run of sixteen zeros, 64 for end of block); a second table steps
 * over up to three terms a look-up (70% of the look-ups on a photo step
 * over two terms or three: the chain of dependent look-ups is what takes
 * the time). Longer codes are found from each length's largest code.
 * Tables are built again only when a file's differ from the last file's
 * (most datasets come from a few encoders).
 *
 * Exactness, where libjpeg's result is the reference:
 * - a block's pixel is libjpeg's 1x1 inverse DCT of its DC term: the term
 *   times the quantiser, (x + 4) >> 3, level shifted and limited through
 *   the same 1024-entry range as libjpeg's table (values far outside 0..255
 *   from corrupt data wrap as they do there);
 * - DC predictions accumulate in int and are stored as 16-bit coefficients,
 *   the quantiser is latched at a component's first scan;
 * - YCbCr to RGB is the JFIF conversion in 16-bit fixed point, rounded as
 *   libjpeg rounds it;
 * - progressive files whose AC terms 1..9 are not complete at the end
 *   (libjpeg then smooths blocks, changing the pixels) are left to libjpeg.
 */
#include "datastore/codecs/jpeg_dc.h"

#include "core/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define FAST_BITS 11
#define MAX_COMPS 3
/* libjpeg's decoder in dsrt stops after this many scans (decode.c). */
#define MAX_SCANS 500
/* The most blocks an MCU of an interleaved scan holds: libjpeg refuses
 * more ("Sampling factors too large for interleaved scan",
 * D_MAX_BLOCKS_IN_MCU), though its frame reader takes 4x4 sampling on every
 * component (48 blocks). */
#define MAX_BLOCKS 10
/* Zero bytes after a scan's data: more than one MCU can read (MAX_BLOCKS
 * blocks of 64 terms of at most 31 bits each, and the reader's 8 bytes
 * ahead). */
#define PAD 4096
_Static_assert(PAD >= MAX_BLOCKS * 64 * 31 / 8 + 8, "PAD covers an MCU");
/* The AC terms whose completeness decides libjpeg's block smoothing. */
#define SMOOTH_TERMS 10

/* The decoding loop's parts, inlined so that the reader stays in registers. */
#define HOT static inline __attribute__((always_inline))

/* An AC look-up (huff_steps): bytes, so that each is one load, not a load
 * and a shift; eight of them, so that the index is scaled, not multiplied. */
typedef struct {
    uint8_t bits1, adv1; /* the first term: bits of its code and value, and advance */
    uint8_t bits2, adv2; /* it and the term after it together */
    uint8_t bits3, adv3; /* the three terms together */
    uint8_t unused[2];
} step;

typedef struct {
    uint8_t counts[16]; /* codes of each length 1..16 */
    uint8_t vals[256];
    int nvals;
    int ac;              /* the table is built for AC stepping, not DC values */
    int built;           /* counts, vals and the rest below agree */
    int32_t maxcode[17]; /* [l]: the largest code of length l, -1 when none */
    int32_t delta[17];   /* [l]: vals index of code c of length l is c + delta[l] */
    uint16_t fast[1 << FAST_BITS];
    step steps[1 << FAST_BITS];  /* AC: up to three terms a look-up (huff_steps) */
    uint8_t len[1 << FAST_BITS]; /* the length of the code that fast[i] is for */
} huff;

typedef struct {
    int id, h, v, tq;
    int bw, bh;                 /* the blocks an interleaved scan covers (whole MCUs) */
    int cw, ch;                 /* the blocks of the component's own size (one-component scans) */
    int q0;                     /* the DC quantiser, from the component's first scan on */
    int scanned;                /* it has been in a scan */
    int dc_al;                  /* progressive: Al of its last DC scan, -1 before the first */
    int8_t ac_al[SMOOTH_TERMS]; /* progressive: Al of the last scan of AC terms 1..9, -1 none */
    int16_t *dc;                /* (bw * bh) DC terms */
    uint8_t *px;                /* (bw * bh) their pixels */
} comp;

struct dsrt_jpeg_dc {
    huff dc[4], ac[4];
    uint8_t *bits; /* (bits_cap) a scan's entropy-coded data, unstuffed, then PAD zeros */
    size_t bits_cap;
    /* (rst_cap) where in bits each restart interval after the first starts */
    uint32_t *rst;
    size_t rst_cap;
    uint8_t *planes; /* (planes_cap) every component's dc and px */
    size_t planes_cap;
    int32_t cr_r[256], cb_b[256], cr_g[256], cb_g[256]; /* YCbCr to RGB, 16-bit fixed point */
};

/* One image's frame and the tables its segments defined so far. */
typedef struct {
    int width, height, progressive, ncomp, hmax, vmax, mcus_x, mcus_y;
    int restart; /* MCUs per restart interval, 0: none */
    int scans;
    comp c[MAX_COMPS];
    int dc_defined[4], ac_defined[4], q_defined[4];
    int q0[4]; /* the DC entry of each quantisation table */
} frame;

typedef struct {
    comp *c[MAX_COMPS];
    int td[MAX_COMPS];
    int ta[MAX_COMPS];
    int n, ss, se, ah, al;
} scan;

dsrt_jpeg_dc *dsrt__jpeg_dc_create(void) {
    dsrt_jpeg_dc *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    for (int i = 0; i < 256; i++) {
        int x = i - 128;
        s->cr_r[i] = (91881 * x + 32768) >> 16;  /* 1.40200 */
        s->cb_b[i] = (116130 * x + 32768) >> 16; /* 1.77200 */
        s->cr_g[i] = -46802 * x;                 /* 0.71414 */
        s->cb_g[i] = -22554 * x + 32768;         /* 0.34414, and the rounding */
    }
    return s;
}

void dsrt__jpeg_dc_destroy(dsrt_jpeg_dc *s) {
    if (!s) return;
    free(s->bits);
    free(s->rst);
    free(s->planes);
    free(s);
}

// ----------------------------------------------------------------------------
// Bits and codes

/* A bit reader over unstuffed data: the next nb bits are the highest of
 * buf, those after them the bytes from q on. Before each code it holds 32
 * bits at least, more than any code and value take; its refill is a branch,
 * so that the loads do not wait for the codes before them. */
typedef struct {
    const uint8_t *q;
    uint64_t buf;
    unsigned nb;
} reader;

HOT void reader_at(reader *r, const uint8_t *q) {
    r->q = q;
    r->buf = 0;
    r->nb = 0;
}

HOT void refill(reader *r) {
    if (r->nb < 32) {
        uint32_t v;
        memcpy(&v, r->q, sizeof v);
        r->buf |= (uint64_t)__builtin_bswap32(v) << (32 - r->nb);
        r->q += 4;
        r->nb += 32;
    }
}

HOT void consume(reader *r, unsigned n) {
    r->buf <<= n;
    r->nb -= n;
}

/* Bits read so far from base. */
static inline size_t reader_pos(const reader *r, const uint8_t *base) {
    return (size_t)(r->q - base) * 8 - r->nb;
}

/* The symbol of a code longer than FAST_BITS at the top of w, its length in
 * *len; -1 when no code of the table starts w. */
static int huff_slow(const huff *h, uint64_t w, int *len) {
    for (int l = FAST_BITS + 1; l <= 16; l++) {
        int32_t code = (int32_t)(w >> (64 - l));
        if (code <= h->maxcode[l]) {
            *len = l;
            return h->vals[code + h->delta[l]];
        }
    }
    return -1;
}

/* The fast entry of symbol v with a code of length l (see the top). */
static uint16_t fast_entry(int ac, int l, int v) {
    if (!ac) return (uint16_t)(l | v << 5);
    int run = v >> 4, size = v & 15;
    int advance = size ? run + 1 : run == 15 ? 16 : 64;
    return (uint16_t)((l + size) | advance << 5);
}

/*
 * The AC look-up table of steps: for the next FAST_BITS bits i, the first
 * term's bits and advance as in fast[i]; then those of it and the term
 * after it together when that one's code lies inside i too (its value need
 * not: it is stepped over, not read), else the first term's again; then
 * the same for a third term. A step never runs past an end of block: no
 * term after one is added. Bits 0: no code fits in i.
 */
static void huff_steps(huff *h) {
    const uint32_t mask = (1u << FAST_BITS) - 1;
    for (uint32_t i = 0; i <= mask; i++) {
        uint32_t e = h->fast[i], b1 = e & 31, a1 = e >> 5, b2 = b1, a2 = a1;
        if (e && b1 < FAST_BITS && a1 < 64) {
            uint32_t j = (i << b1) & mask, f = h->fast[j];
            if (f && h->len[j] <= FAST_BITS - b1) {
                b2 = b1 + (f & 31);
                a2 = a1 + (f >> 5);
            }
        }
        uint32_t b3 = b2, a3 = a2;
        if (b2 != b1 && b2 < FAST_BITS && a2 < 64) {
            uint32_t j = (i << b2) & mask, f = h->fast[j];
            if (f && h->len[j] <= FAST_BITS - b2) {
                b3 = b2 + (f & 31);
                a3 = a2 + (f >> 5);
            }
        }
        h->steps[i] = (step){(uint8_t)b1, (uint8_t)a1, (uint8_t)b2, (uint8_t)a2,
                             (uint8_t)b3, (uint8_t)a3, {0, 0}};
    }
}

/*
 * 0 when h's counts and vals make a table libjpeg builds, 1 when it refuses
 * it ("Bogus Huffman table definition", jpeg_make_d_derived_tbl): the codes
 * of each length must fit in that length with the all-ones code left out
 * (more codes than fit, which libjpeg's header reader takes, would index
 * past the look-up tables), and a DC table's values must be sizes up to
 * 15. Nothing is written before this says yes.
 */
static int huff_check(const huff *h) {
    int32_t code = 0;
    for (int l = 1; l <= 16; l++) {
        code += h->counts[l - 1];
        if (code >= (int32_t)1 << l) return 1;
        code <<= 1;
    }
    if (!h->ac)
        for (int k = 0; k < h->nvals; k++)
            if (h->vals[k] > 15) return 1;
    return 0;
}

/* Builds h from its counts and vals; 0, or 1 for a table libjpeg refuses. */
static int huff_build(huff *h) {
    if (huff_check(h)) return 1;
    memset(h->fast, 0, sizeof h->fast);
    int32_t code = 0;
    int k = 0;
    for (int l = 1; l <= 16; l++) {
        int n = h->counts[l - 1];
        h->delta[l] = k - code;
        h->maxcode[l] = n ? code + n - 1 : -1;
        for (int i = 0; i < n; i++, k++, code++) {
            if (l <= FAST_BITS) {
                int shift = FAST_BITS - l;
                uint16_t e = fast_entry(h->ac, l, h->vals[k]);
                for (int32_t j = code << shift; j < (code + 1) << shift; j++) {
                    h->fast[j] = e;
                    h->len[j] = (uint8_t)l;
                }
            }
        }
        code <<= 1;
    }
    if (h->ac) huff_steps(h);
    h->built = 1;
    return 0;
}

/* Reads one DHT table at p (n bytes left) into h, building it unless it is
 * the one h holds already. The bytes it took, or 0 when it is bad. */
static size_t huff_read(huff *h, int ac, const uint8_t *p, size_t n) {
    if (n < 16) return 0;
    int nvals = 0;
    for (int i = 0; i < 16; i++) nvals += p[i];
    if (nvals > 256 || (size_t)nvals > n - 16) return 0;
    if (h->built && h->ac == ac && h->nvals == nvals && memcmp(h->counts, p, 16) == 0 &&
        memcmp(h->vals, p + 16, (size_t)nvals) == 0)
        return 16 + (size_t)nvals;
    h->built = 0;
    h->ac = ac;
    h->nvals = nvals;
    memcpy(h->counts, p, 16);
    memcpy(h->vals, p + 16, (size_t)nvals);
    return huff_build(h) ? 0 : 16 + (size_t)nvals;
}

/* The DC difference coded next; *ok = 0 when no code matches. */
HOT int dc_diff(const huff *h, reader *r, int *ok) {
    refill(r);
    uint64_t w = r->buf;
    unsigned e = h->fast[w >> (64 - FAST_BITS)];
    int l, size;
    if (e) {
        l = (int)(e & 31);
        size = (int)(e >> 5);
    } else if ((size = huff_slow(h, w, &l)) < 0) {
        *ok = 0;
        return 0;
    }
    consume(r, (unsigned)(l + size));
    if (!size) return 0;
    int v = (int)((w << l) >> (64 - size));
    return v < 1 << (size - 1) ? v - (1 << size) + 1 : v;
}

/*
 * Steps over the AC terms of a block from term 1 on; 0, or 1 at a bad code.
 * Each look-up steps over up to three terms (see huff_steps); the second
 * and third are taken only while the block stays open, since a block's
 * last term may be followed by the next block's DC. The reader is copied
 * in and out so that it stays in registers.
 */
HOT int ac_skip(const huff *h, reader *rp) {
    reader r = *rp;
    for (int k = 1; k < 64;) {
        refill(&r);
        const step *e = &h->steps[r.buf >> (64 - FAST_BITS)];
        if (DSRT_UNLIKELY(e->bits1 == 0)) {
            int l, v = huff_slow(h, r.buf, &l);
            if (v < 0) return 1;
            uint16_t f = fast_entry(1, l, v);
            consume(&r, f & 31);
            k += f >> 5;
        } else if (k + e->adv2 < 64) {
            consume(&r, e->bits3);
            k += e->adv3;
        } else if (k + e->adv1 < 64) {
            consume(&r, e->bits2);
            k += e->adv2;
        } else {
            consume(&r, e->bits1);
            k += e->adv1;
        }
    }
    *rp = r;
    return 0;
}

// ----------------------------------------------------------------------------
// Entropy-coded data

/*
 * Copies the entropy-coded data from p on into s->bits without its stuffed
 * zeros and with PAD zeros after it, noting where each restart interval
 * after the first begins (their markers must count 0..7 in turn). Returns
 * the 0xFF of the marker that ends the data, or NULL when the file ends
 * first or a restart marker is out of turn; *nbytes and *nrst are what it
 * copied and noted.
 */
static const uint8_t *unstuff(dsrt_jpeg_dc *s, const uint8_t *p, const uint8_t *end, size_t *nbytes,
                              size_t *nrst, int *nomem) {
    if (dsrt__grow((void **)&s->bits, &s->bits_cap, (size_t)(end - p) + PAD, 1)) {
        *nomem = 1;
        return NULL;
    }
    size_t o = 0, r = 0;
    for (;;) {
        const uint8_t *ff = memchr(p, 0xff, (size_t)(end - p));
        if (!ff) return NULL;
        memcpy(s->bits + o, p, (size_t)(ff - p));
        o += (size_t)(ff - p);
        const uint8_t *q = ff + 1;
        while (q < end && *q == 0xff) q++; /* fill bytes */
        if (q >= end) return NULL;
        if (*q == 0x00) { /* a stuffed zero: the data byte 0xFF */
            s->bits[o++] = 0xff;
            p = q + 1;
            continue;
        }
        if (*q >= 0xd0 && *q <= 0xd7) {
            if ((*q & 7) != (r & 7)) return NULL;
            if (dsrt__grow((void **)&s->rst, &s->rst_cap, r + 1, sizeof *s->rst)) {
                *nomem = 1;
                return NULL;
            }
            s->rst[r++] = (uint32_t)o;
            p = q + 1;
            continue;
        }
        memset(s->bits + o, 0, PAD);
        *nbytes = o;
        *nrst = r;
        return q - 1;
    }
}

/* The 0xFF of the marker that ends the entropy-coded data from p on, or
 * NULL when the file ends first. */
static const uint8_t *data_end(const uint8_t *p, const uint8_t *end) {
    for (;;) {
        const uint8_t *ff = memchr(p, 0xff, (size_t)(end - p));
        if (!ff) return NULL;
        const uint8_t *q = ff + 1;
        while (q < end && *q == 0xff) q++;
        if (q >= end) return NULL;
        if (*q != 0x00 && !(*q >= 0xd0 && *q <= 0xd7)) return q - 1;
        p = q + 1;
    }
}

/* Decodes the DC terms of one block of component k of a scan into its
 * plane at (bx, by); 0, or 1 at a bad code. */
HOT int block(const frame *f, const scan *sc, int k, int bx, int by, const huff *dc, const huff *ac,
              reader *r, int32_t *pred) {
    comp *c = sc->c[k];
    int16_t *coef = c->dc + (size_t)by * (size_t)c->bw + (size_t)bx;
    int ok = 1;
    if (sc->ah) { /* a progressive DC refinement: one bit */
        refill(r);
        if (r->buf >> 63) *coef = (int16_t)(*coef | 1 << sc->al);
        consume(r, 1);
        return 0;
    }
    pred[k] = (int32_t)((uint32_t)pred[k] + (uint32_t)dc_diff(dc, r, &ok));
    if (!ok) return 1;
    *coef = (int16_t)((uint32_t)pred[k] << sc->al);
    return f->progressive ? 0 : ac_skip(ac, r);
}

/* Decodes the DC terms of a scan whose data s->bits holds; 0, or 1 when
 * the data is not what the scan needs. Compiled twice where the compiler
 * can, the second time for x86-64-v3 (BMI2's shifts, MOVBE: 4-6% less
 * time), chosen at load time; integer work, so both give the same terms.
 * Not under ThreadSanitizer: the loader runs the choosing function before
 * ThreadSanitizer's runtime is ready, and the instrumented code crashes. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
static int
scan_dc(dsrt_jpeg_dc *s, const frame *f, const scan *sc, size_t nbytes, size_t nrst) {
    const huff *dc[MAX_COMPS], *ac[MAX_COMPS];
    for (int k = 0; k < sc->n; k++) {
        dc[k] = &s->dc[sc->td[k]];
        ac[k] = &s->ac[sc->ta[k]];
    }
    size_t units = sc->n == 1 ? (size_t)sc->c[0]->cw * (size_t)sc->c[0]->ch
                              : (size_t)f->mcus_x * (size_t)f->mcus_y;
    size_t every = f->restart ? (size_t)f->restart : units;
    if (nrst != (units + every - 1) / every - 1) return 1;
    const uint8_t *b = s->bits;
    size_t interval = 0, end = (nrst ? s->rst[0] : nbytes) * 8;
    int32_t pred[MAX_COMPS] = {0};
    reader r;
    reader_at(&r, b);
    for (size_t u = 0; u < units; u++) {
        if (u && u % every == 0) { /* a restart: byte aligned, predictions reset */
            reader_at(&r, b + s->rst[interval++]);
            end = (interval < nrst ? s->rst[interval] : nbytes) * 8;
            memset(pred, 0, sizeof pred);
        }
        if (sc->n == 1) {
            int cw = sc->c[0]->cw;
            if (block(f, sc, 0, (int)(u % (size_t)cw), (int)(u / (size_t)cw), dc[0], ac[0], &r,
                      pred))
                return 1;
        } else {
            int mx = (int)(u % (size_t)f->mcus_x), my = (int)(u / (size_t)f->mcus_x);
            for (int k = 0; k < sc->n; k++) {
                const comp *c = sc->c[k];
                for (int y = 0; y < c->v; y++)
                    for (int x = 0; x < c->h; x++)
                        if (block(f, sc, k, mx * c->h + x, my * c->v + y, dc[k], ac[k], &r, pred))
                            return 1;
            }
        }
        if (reader_pos(&r, b) > end) return 1; /* past its interval's data */
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Markers

static inline int be16(const uint8_t *p) {
    return p[0] << 8 | p[1];
}

/* SOF0, SOF1, SOF2: the frame, and the planes. */
static int read_frame(dsrt_jpeg_dc *s, frame *f, int progressive, const uint8_t *p, size_t n,
                      int width, int height) {
    if (f->ncomp || n < 6 || p[0] != 8) return 1;
    if (be16(p + 1) != height || be16(p + 3) != width || width <= 0 || height <= 0) return 1;
    int nc = p[5];
    if ((nc != 1 && nc != 3) || n != 6 + 3 * (size_t)nc) return 1;
    f->width = width;
    f->height = height;
    f->progressive = progressive;
    f->hmax = f->vmax = 1;
    for (int i = 0; i < nc; i++) {
        comp *c = &f->c[i];
        memset(c, 0, sizeof *c);
        c->id = p[6 + 3 * i];
        c->h = p[7 + 3 * i] >> 4;
        c->v = p[7 + 3 * i] & 15;
        c->tq = p[8 + 3 * i];
        c->dc_al = -1;
        memset(c->ac_al, -1, sizeof c->ac_al);
        if (c->h < 1 || c->h > 4 || c->v < 1 || c->v > 4 || c->tq > 3) return 1;
        for (int j = 0; j < i; j++)
            if (f->c[j].id == c->id) return 1;
        f->hmax = c->h > f->hmax ? c->h : f->hmax;
        f->vmax = c->v > f->vmax ? c->v : f->vmax;
    }
    f->ncomp = nc;
    f->mcus_x = (width + 8 * f->hmax - 1) / (8 * f->hmax);
    f->mcus_y = (height + 8 * f->vmax - 1) / (8 * f->vmax);
    size_t total = 0;
    for (int i = 0; i < nc; i++) {
        comp *c = &f->c[i];
        if (f->hmax % c->h || f->vmax % c->v) return 1;
        int pw = (int)(((int64_t)width * c->h + f->hmax - 1) / f->hmax);
        int ph = (int)(((int64_t)height * c->v + f->vmax - 1) / f->vmax);
        c->cw = (pw + 7) / 8;
        c->ch = (ph + 7) / 8;
        c->bw = f->mcus_x * c->h;
        c->bh = f->mcus_y * c->v;
        total += (size_t)c->bw * (size_t)c->bh * 3; /* int16 terms, uint8 pixels */
    }
    /* At 1/8 libjpeg scales a component's inverse DCT up (2x2, 4x4, from
     * its AC terms too) while both its sampling factors go into the largest
     * an even number of times (jdmaster.c), and repeats its pixels where it
     * does not: luma scaled up is left to libjpeg. */
    if (f->hmax % (2 * f->c[0].h) == 0 && f->vmax % (2 * f->c[0].v) == 0) return 1;
    if (dsrt__grow((void **)&s->planes, &s->planes_cap, total, 1)) return -ENOMEM;
    /* Every component's terms first, then the pixels: the terms stay 2-byte aligned. */
    int16_t *t = (int16_t *)(void *)s->planes;
    uint8_t *q = s->planes + 2 * (total / 3);
    for (int i = 0; i < nc; i++) {
        comp *c = &f->c[i];
        size_t blocks = (size_t)c->bw * (size_t)c->bh;
        c->dc = t;
        c->px = q;
        memset(c->dc, 0, 2 * blocks);
        t += blocks;
        q += blocks;
    }
    return 0;
}

/* DQT: the DC entry of each table. */
static int read_quant(frame *f, const uint8_t *p, size_t n) {
    while (n > 0) {
        int wide = p[0] >> 4, t = p[0] & 15;
        size_t size = 1 + 64 * (size_t)(wide ? 2 : 1);
        if (wide > 1 || t > 3 || n < size) return 1;
        int q = wide ? be16(p + 1) : p[1];
        if (q > 32767) return 1; /* libjpeg multiplies in 16 bits */
        f->q0[t] = q;
        f->q_defined[t] = 1;
        p += size;
        n -= size;
    }
    return 0;
}

/* DHT */
static int read_huff(dsrt_jpeg_dc *s, frame *f, const uint8_t *p, size_t n) {
    while (n > 0) {
        int ac = p[0] >> 4, t = p[0] & 15;
        if (ac > 1 || t > 3) return 1;
        size_t used = huff_read(ac ? &s->ac[t] : &s->dc[t], ac, p + 1, n - 1);
        if (!used) return 1;
        (ac ? f->ac_defined : f->dc_defined)[t] = 1;
        p += 1 + used;
        n -= 1 + used;
    }
    return 0;
}

/* SOS: the scan's header, checked as libjpeg checks it (and more). */
static int read_scan(frame *f, scan *sc, const uint8_t *p, size_t n) {
    if (!f->ncomp || n < 1) return 1;
    sc->n = p[0];
    if (sc->n < 1 || sc->n > f->ncomp || n != 4 + 2 * (size_t)sc->n) return 1;
    for (int k = 0; k < sc->n; k++) {
        int id = p[1 + 2 * k];
        sc->c[k] = NULL;
        for (int i = 0; i < f->ncomp; i++)
            if (f->c[i].id == id) sc->c[k] = &f->c[i];
        for (int j = 0; j < k; j++)
            if (sc->c[j] == sc->c[k]) return 1;
        if (!sc->c[k]) return 1;
        sc->td[k] = p[2 + 2 * k] >> 4;
        sc->ta[k] = p[2 + 2 * k] & 15;
        if (sc->td[k] > 3 || sc->ta[k] > 3) return 1;
    }
    if (sc->n > 1) {
        int blocks = 0;
        for (int k = 0; k < sc->n; k++) blocks += sc->c[k]->h * sc->c[k]->v;
        if (blocks > MAX_BLOCKS) return 1;
    }
    const uint8_t *t = p + 1 + 2 * sc->n;
    sc->ss = t[0];
    sc->se = t[1];
    sc->ah = t[2] >> 4;
    sc->al = t[2] & 15;
    if (++f->scans > MAX_SCANS) return 1;
    for (int k = 0; k < sc->n; k++) { /* the quantiser is latched at the first scan */
        comp *c = sc->c[k];
        if (!c->scanned) {
            if (!f->q_defined[c->tq]) return 1;
            c->q0 = f->q0[c->tq];
        }
        c->scanned = 1;
    }
    if (!f->progressive) {
        if (sc->ss != 0 || sc->se != 63 || sc->ah || sc->al) return 1;
        for (int k = 0; k < sc->n; k++)
            if (!f->dc_defined[sc->td[k]] || !f->ac_defined[sc->ta[k]] || sc->c[k]->dc_al == 0)
                return 1;
        for (int k = 0; k < sc->n; k++) sc->c[k]->dc_al = 0;
        return 0;
    }
    if (sc->al > 13 || sc->ah > 13 || (sc->ah && sc->al != sc->ah - 1)) return 1;
    if (sc->ss == 0) { /* DC */
        if (sc->se != 0) return 1;
        for (int k = 0; k < sc->n; k++) {
            comp *c = sc->c[k];
            if (sc->ah ? c->dc_al != sc->ah : c->dc_al != -1) return 1;
            if (!sc->ah && !f->dc_defined[sc->td[k]]) return 1;
            c->dc_al = sc->al;
        }
        return 0;
    }
    /* AC: stepped over, only the terms libjpeg's smoothing looks at noted */
    if (sc->n != 1 || sc->se < sc->ss || sc->se > 63 || sc->c[0]->dc_al < 0) return 1;
    if (!f->ac_defined[sc->ta[0]]) return 1; /* libjpeg builds the table, though unread here */
    for (int i = sc->ss; i <= sc->se && i < SMOOTH_TERMS; i++) sc->c[0]->ac_al[i] = (int8_t)sc->al;
    return 0;
}

// ----------------------------------------------------------------------------
// Pixels

/* libjpeg's 1x1 inverse DCT of a DC term (see the top). */
static inline uint8_t dc_pixel(int16_t dc, int q) {
    int x = ((int)dc * q + 4) >> 3;
    unsigned i = (unsigned)x & 1023;
    return (uint8_t)(i < 128 ? i + 128 : i < 512 ? 255 : i < 896 ? 0 : i - 896);
}

static inline uint8_t clamp255(int x) {
    return (uint8_t)(x < 0 ? 0 : x > 255 ? 255 : x);
}

/* The planes' pixels as gray or RGB rows in dst. */
static void write_pixels(const dsrt_jpeg_dc *s, const frame *f, int ch, uint8_t *dst) {
    for (int i = 0; i < f->ncomp; i++) {
        const comp *c = &f->c[i];
        size_t blocks = (size_t)c->bw * (size_t)c->bh;
        for (size_t j = 0; j < blocks; j++) c->px[j] = dc_pixel(c->dc[j], c->q0);
    }
    int w = (f->width + 7) / 8, h = (f->height + 7) / 8;
    const comp *y = &f->c[0];
    int yx = f->hmax / y->h, yy = f->vmax / y->v;
    if (f->ncomp == 1 || ch == 1) {
        for (int r = 0; r < h; r++) {
            const uint8_t *row = y->px + (size_t)(r / yy) * (size_t)y->bw;
            uint8_t *o = dst + (size_t)r * (size_t)w * (size_t)ch;
            for (int x = 0; x < w; x++)
                for (int k = 0; k < ch; k++) o[x * ch + k] = row[x / yx];
        }
        return;
    }
    const comp *cb = &f->c[1], *cr = &f->c[2];
    int bx = f->hmax / cb->h, by = f->vmax / cb->v, rx = f->hmax / cr->h, ry = f->vmax / cr->v;
    for (int r = 0; r < h; r++) {
        const uint8_t *ly = y->px + (size_t)(r / yy) * (size_t)y->bw;
        const uint8_t *lb = cb->px + (size_t)(r / by) * (size_t)cb->bw;
        const uint8_t *lr = cr->px + (size_t)(r / ry) * (size_t)cr->bw;
        uint8_t *o = dst + (size_t)r * (size_t)w * 3;
        for (int x = 0; x < w; x++) {
            int l = ly[x / yx], u = lb[x / bx], v = lr[x / rx];
            o[3 * x] = clamp255(l + s->cr_r[v]);
            o[3 * x + 1] = clamp255(l + ((s->cb_g[u] + s->cr_g[v]) >> 16));
            o[3 * x + 2] = clamp255(l + s->cb_b[u]);
        }
    }
}

// ----------------------------------------------------------------------------
// The file

int dsrt__jpeg_dc_decode(dsrt_jpeg_dc *s, const uint8_t *buf, size_t len, int width, int height,
                         int ch, uint8_t *dst) {
    if (len < 4 || buf[0] != 0xff || buf[1] != 0xd8 || (ch != 1 && ch != 3)) return 1;
    frame f;
    memset(&f, 0, sizeof f);
    const uint8_t *p = buf + 2, *end = buf + len;
    for (;;) {
        if (p >= end || *p != 0xff) return 1; /* the end, or bytes between markers */
        while (p < end && *p == 0xff) p++;
        if (p >= end) return 1;
        int m = *p++;
        if (m == 0xd9) break;
        if (end - p < 2) return 1;
        size_t n = (size_t)be16(p);
        if (n < 2 || n > (size_t)(end - p)) return 1;
        const uint8_t *seg = p + 2;
        p += n;
        n -= 2;
        int rc = 0;
        switch (m) {
        case 0xc0: /* baseline */
        case 0xc1: /* extended, Huffman */
        case 0xc2: /* progressive, Huffman */
            rc = read_frame(s, &f, m == 0xc2, seg, n, width, height);
            break;
        case 0xc4:
            rc = read_huff(s, &f, seg, n);
            break;
        case 0xdb:
            rc = read_quant(&f, seg, n);
            break;
        case 0xdd:
            if (n != 2) return 1;
            f.restart = be16(seg);
            break;
        case 0xda: {
            scan sc;
            if ((rc = read_scan(&f, &sc, seg, n)) != 0) return rc;
            if (f.progressive && sc.ss) {
                p = data_end(p, end);
            } else {
                size_t nbytes = 0, nrst = 0;
                int nomem = 0;
                p = unstuff(s, p, end, &nbytes, &nrst, &nomem);
                if (nomem) return -ENOMEM;
                if (p && scan_dc(s, &f, &sc, nbytes, nrst)) return 1;
            }
            if (!p) return 1;
            break;
        }
        default:
            if ((m >= 0xe0 && m <= 0xef) || m == 0xfe) break; /* APPn, COM */
            return 1;
        }
        if (rc) return rc;
    }
    if (!f.ncomp) return 1;
    for (int i = 0; i < f.ncomp; i++) {
        const comp *c = &f.c[i];
        if (c->dc_al < 0) return 1;
        if (f.progressive)
            for (int k = 1; k < SMOOTH_TERMS; k++)
                if (c->ac_al[k] != 0) return 1; /* libjpeg would smooth */
    }
    write_pixels(s, &f, ch, dst);
    return 0;
}
