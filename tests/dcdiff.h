/*
 * The DC-term decoder (datastore/codecs/jpeg_dc.c) against libjpeg's 1/8 decode,
 * one JPEG at a time, for the libFuzzer target tests/fuzz/fuzz_jpeg_dc.c
 * and the bounded run of test_slow_jpeg_dc.
 *
 * A case is a recipe of bytes: which family makes the file and how, then
 * the edits that damage it. The families:
 * - turbo: TurboJPEG's named subsamplings, baseline or progressive, any
 *   quality;
 * - libjpeg: libjpeg's own encoder with sampling factors 1..4 (those it
 *   takes: integral ratios, at most 10 blocks an MCU), restart intervals
 *   in MCUs or rows, progressive (a DHT before each scan), optimised or
 *   arithmetic coding;
 * - synth: files written by tests/jpegkit.h with any sampling factors 1..4
 *   (fractional ratios and MCUs libjpeg refuses too), restart intervals,
 *   baseline or progressive (a DC refinement scan), one scan a component,
 *   all in one, or Y then Cb and Cr;
 * - raw: a recipe that starts with FF D8 is the file itself (libFuzzer's
 *   own mutations of real files).
 * The edits work on marker segments (sampling factors, table selectors,
 * spectral selection and successive approximation, segments dropped,
 * moved or repeated, Huffman counts shuffled into over-full or incomplete
 * tables, restart intervals and markers, component ids, frame types,
 * quantisers, bytes between segments) and on bytes (entropy-coded data,
 * headers, truncation).
 *
 * Each file is decoded in fresh decoders at 1/8, gray and RGB, from the DC
 * terms and by libjpeg: the codes and messages must be equal, and the
 * pixels where the DC decoder promises libjpeg's (gray always, RGB where
 * every component has the luma's sampling). The same file decoded by
 * decoders that decoded every case before must give the same, bit for bit
 * (nothing carried between images), and the DC decoder called directly
 * (dsrt__jpeg_dc_decode) must take only files libjpeg decodes.
 */
#ifndef DSRT_TEST_DCDIFF_H
#define DSRT_TEST_DCDIFF_H

#include "core/internal.h"
#include "datastore/codecs/codecs.h"
#include "datastore/index/index.h"
#include "datastore/codecs/jpeg_dc.h"
#include "jpegkit.h"

#include <jpeglib.h>
#include <setjmp.h>
#include <stdio.h>

enum { DD_TURBO, DD_LIBJPEG, DD_SYNTH, DD_RAW, DD_FAMILIES };

static const char *const dd_family_names[DD_FAMILIES] = {"turbo", "libjpeg", "synth", "raw"};

/* What the cases came to, by family and whether they were edited. */
typedef struct {
    long tried[DD_FAMILIES][2];
    long dc_taken[DD_FAMILIES][2];    /* the DC decoder decoded it */
    long both_ok[DD_FAMILIES][2];     /* libjpeg decoded it too (at 1/8, gray) */
    long both_failed[DD_FAMILIES][2]; /* both refused it, with the same message */
    long no_file;                     /* the family's encoder refused the recipe */
    long mismatches;
} dd_stats;

/* The recipe's bytes, read in turn; zeros after its end. */
typedef struct {
    const uint8_t *p;
    size_t n, at;
} dd_in;

static inline uint32_t dd_byte(dd_in *in) {
    return in->at < in->n ? in->p[in->at++] : 0;
}

static inline uint32_t dd_pick(dd_in *in, uint32_t m) {
    return m ? dd_byte(in) % m : 0;
}

static inline uint32_t dd_pick16(dd_in *in) {
    uint32_t v = dd_byte(in) << 8;
    return v | dd_byte(in);
}

// ----------------------------------------------------------------------------
// Families

/* libjpeg's encoder, errors caught, and what it is asked for. */
typedef struct {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    jmp_buf jump;
    unsigned char *mem;
    unsigned long size;
    int w, h, ncomp, samp[3][2], quality, restart, every, progressive, optimize, arith;
    uint8_t *px; /* (h, w, ncomp) */
} dd_encoder;

static void dd_encode_error(j_common_ptr c) {
    dd_encoder *e = (dd_encoder *)(void *)((char *)c - offsetof(dd_encoder, c));
    longjmp(e->jump, 1);
}

static void dd_encode_quiet(j_common_ptr c) {
    (void)c;
}

/* Sampling factors libjpeg's encoder takes: each divides the largest, and
 * an MCU of every component holds at most 10 blocks. */
static inline void dd_encodable(int ncomp, int samp[3][2]) {
    for (;;) {
        int hmax = 1, vmax = 1, blocks = 0, big = 0;
        for (int c = 0; c < ncomp; c++) {
            hmax = samp[c][0] > hmax ? samp[c][0] : hmax;
            vmax = samp[c][1] > vmax ? samp[c][1] : vmax;
        }
        for (int c = 0; c < ncomp; c++) {
            while (hmax % samp[c][0]) samp[c][0]--;
            while (vmax % samp[c][1]) samp[c][1]--;
            blocks += samp[c][0] * samp[c][1];
            if (samp[c][0] * samp[c][1] > samp[big][0] * samp[big][1]) big = c;
        }
        if (ncomp == 1 || blocks <= 10) return;
        int *f = &samp[big][samp[big][0] >= samp[big][1] ? 0 : 1];
        *f = *f > 1 ? *f - 1 : 1;
    }
}

/* Runs e's encoder into e->mem; 0, or -1 when libjpeg refused. */
static int dd_encode(dd_encoder *e) {
    e->c.err = jpeg_std_error(&e->err);
    e->err.error_exit = dd_encode_error;
    e->err.output_message = dd_encode_quiet;
    if (setjmp(e->jump)) {
        jpeg_destroy_compress(&e->c);
        return -1;
    }
    jpeg_create_compress(&e->c);
    jpeg_mem_dest(&e->c, &e->mem, &e->size);
    e->c.image_width = (JDIMENSION)e->w;
    e->c.image_height = (JDIMENSION)e->h;
    e->c.input_components = e->ncomp;
    e->c.in_color_space = e->ncomp == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&e->c);
    jpeg_set_quality(&e->c, e->quality, TRUE);
    for (int c = 0; c < e->ncomp; c++) {
        e->c.comp_info[c].h_samp_factor = e->samp[c][0];
        e->c.comp_info[c].v_samp_factor = e->samp[c][1];
    }
    if (e->restart == 1) e->c.restart_interval = (unsigned)e->every;
    if (e->restart == 2) e->c.restart_in_rows = 1 + e->every % 3;
    if (e->progressive) jpeg_simple_progression(&e->c);
    e->c.optimize_coding = e->optimize ? TRUE : FALSE;
    e->c.arith_code = e->arith ? TRUE : FALSE;
    jpeg_start_compress(&e->c, TRUE);
    while (e->c.next_scanline < e->c.image_height) {
        JSAMPROW row =
            (JSAMPROW)(e->px + (size_t)e->c.next_scanline * (size_t)e->w * (size_t)e->ncomp);
        jpeg_write_scanlines(&e->c, &row, 1);
    }
    jpeg_finish_compress(&e->c);
    jpeg_destroy_compress(&e->c);
    return 0;
}

static uint8_t *dd_libjpeg(dd_in *in, size_t *len) {
    dd_encoder *e = calloc(1, sizeof *e);
    uint8_t *out = NULL;
    if (!e) return NULL;
    e->ncomp = dd_pick(in, 4) == 0 ? 1 : 3;
    for (int c = 0; c < 3; c++)
        e->samp[c][0] = 1 + (int)dd_pick(in, 4), e->samp[c][1] = 1 + (int)dd_pick(in, 4);
    dd_encodable(e->ncomp, e->samp);
    e->quality = 5 + (int)dd_pick(in, 96);
    e->restart = (int)dd_pick(in, 4);
    e->every = 1 + (int)dd_pick(in, 8);
    e->progressive = dd_pick(in, 3) == 0;
    e->optimize = (int)dd_pick(in, 2);
    e->arith = dd_pick(in, 16) == 0;
    if (e->arith) e->optimize = 0; /* the encoder refuses both */
    e->w = 1 + (int)dd_pick(in, 96);
    e->h = 1 + (int)dd_pick(in, 96);
    e->px = malloc((size_t)e->w * (size_t)e->h * 3);
    if (e->px) {
        timg_pattern(e->px, e->w, e->h, e->ncomp, dd_byte(in));
        if (dd_encode(e) == 0 && (out = malloc(e->size ? e->size : 1))) {
            memcpy(out, e->mem, e->size);
            *len = e->size;
        }
    }
    free(e->mem);
    free(e->px);
    free(e);
    return out;
}

static uint8_t *dd_turbo(dd_in *in, size_t *len) {
    static const int samps[] = {TJSAMP_444,  TJSAMP_422, TJSAMP_420,
                                TJSAMP_GRAY, TJSAMP_440, TJSAMP_411};
    int samp = samps[dd_pick(in, 6)], progressive = (int)dd_pick(in, 2);
    int quality = 5 + (int)dd_pick(in, 96);
    int w = 1 + (int)dd_pick(in, 96), h = 1 + (int)dd_pick(in, 96);
    int ch = samp == TJSAMP_GRAY ? 1 : 3;
    uint8_t *px = malloc((size_t)w * h * 3);
    if (!px) return NULL;
    timg_pattern(px, w, h, ch, dd_byte(in));
    tjhandle tj = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    uint8_t *out = NULL;
    if (tj &&
        tjCompress2(tj, px, w, 0, h, ch == 1 ? TJPF_GRAY : TJPF_RGB, &jpeg, &size, samp, quality,
                    progressive ? TJFLAG_PROGRESSIVE : 0) == 0 &&
        (out = malloc(size))) {
        memcpy(out, jpeg, size);
        *len = size;
    }
    tjFree(jpeg);
    if (tj) tjDestroy(tj);
    free(px);
    return out;
}

static uint8_t *dd_synth(dd_in *in, size_t *len) {
    jk_spec s;
    memset(&s, 0, sizeof s);
    s.ncomp = dd_pick(in, 3) == 0 ? 1 : 3;
    for (int c = 0; c < 3; c++)
        s.samp[c][0] = 1 + (int)dd_pick(in, 4), s.samp[c][1] = 1 + (int)dd_pick(in, 4);
    s.restart = dd_pick(in, 3) ? 0 : 1 + (int)dd_pick(in, 6);
    s.progressive = dd_pick(in, 3) == 0;
    s.interleave = (int)dd_pick(in, 3);
    s.ac_terms = (int)dd_pick(in, 9);
    s.dc_al = (int)dd_pick(in, 2);
    s.w = 1 + (int)dd_pick(in, 96);
    s.h = 1 + (int)dd_pick(in, 96);
    s.seed = dd_byte(in) | dd_byte(in) << 8;
    int quality = 5 + (int)dd_pick(in, 96);
    uint8_t px[16 * 16 * 3];
    timg_pattern(px, 16, 16, 3, s.seed);
    size_t mlen;
    uint8_t *model = timg_jpeg(px, 16, 16, TJPF_RGB, TJSAMP_420, quality, 0, &mlen);
    if (!model) return NULL;
    uint8_t *out = jk_synth(&s, model, mlen, len);
    free(model);
    return out;
}

// ----------------------------------------------------------------------------
// Edits

enum {
    DD_DATA_BYTE,
    DD_SOF_SAMPLING,
    DD_SOS_TABLES,
    DD_SOS_SPECTRAL,
    DD_DROP_SEGMENT,
    DD_RESTART,
    DD_MOVE_DHT,
    DD_DHT_COUNTS,
    DD_TRUNCATE,
    DD_QUANT,
    DD_REPEAT_SCAN,
    DD_RST_MARKER,
    DD_COMPONENT_ID,
    DD_FRAME_TYPE,
    DD_JUNK,
    DD_HEADER_BYTE,
    DD_STRIP_TABLES,
    DD_EDITS
};

/* The pieces of j of marker code (JK_DATA: data). */
static inline int dd_pieces_of(const uint8_t *j, size_t len, int code, jk_piece *out, int max) {
    jk_piece all[512];
    int n = jk_pieces(j, len, all, 512), k = 0;
    for (int i = 0; i < n && k < max; i++)
        if (all[i].code == code) out[k++] = all[i];
    return k;
}

/* A copy of j with one byte at at set to v. */
static inline uint8_t *dd_set(const uint8_t *j, size_t len, size_t at, uint8_t v, size_t *out_len) {
    if (at >= len) return NULL;
    uint8_t *o = jk_splice(j, len, 0, 0, NULL, 0, out_len);
    if (o) o[at] = v;
    return o;
}

/* One edit of j from the recipe; a new file, or NULL when it did nothing. */
static uint8_t *dd_edit(dd_in *in, const uint8_t *j, size_t len, size_t *out_len) {
    jk_piece p[64];
    int op = (int)dd_pick(in, DD_EDITS), n, k;
    static const int sofs[] = {0xc0, 0xc1, 0xc2, 0xc3, 0xc9, 0xca};
    switch (op) {
    case DD_DATA_BYTE:
        if (!(n = dd_pieces_of(j, len, JK_DATA, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        return dd_set(j, len, p[k].at + dd_pick16(in) % p[k].len, (uint8_t)dd_byte(in), out_len);
    case DD_SOF_SAMPLING:
    case DD_COMPONENT_ID:
    case DD_FRAME_TYPE:
        for (size_t i = 0; i < DSRT_ARRAY_SIZE(sofs); i++)
            if ((n = dd_pieces_of(j, len, sofs[i], p, 1))) break;
        if (!n || p[0].len < 10) return NULL;
        if (op == DD_FRAME_TYPE)
            return dd_set(j, len, p[0].at + 1, (uint8_t)sofs[dd_pick(in, 6)], out_len);
        k = (int)dd_pick(in, (uint32_t)(p[0].len - 10) / 3 + 1);
        if (op == DD_COMPONENT_ID)
            return dd_set(j, len, p[0].at + 10 + 3 * (size_t)k, (uint8_t)dd_pick(in, 5), out_len);
        return dd_set(j, len, p[0].at + 11 + 3 * (size_t)k,
                      (uint8_t)(dd_pick(in, 8) ? (1 + dd_pick(in, 4)) << 4 | (1 + dd_pick(in, 4))
                                               : dd_byte(in)),
                      out_len);
    case DD_SOS_TABLES:
    case DD_SOS_SPECTRAL: {
        if (!(n = dd_pieces_of(j, len, 0xda, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        if (p[k].len < 6) return NULL;
        int nc = j[p[k].at + 4];
        if (op == DD_SOS_TABLES) {
            size_t at = p[k].at + 6 + 2 * dd_pick(in, (uint32_t)nc + 1);
            return dd_set(
                j, len, at,
                (uint8_t)(dd_pick(in, 8) ? dd_pick(in, 4) << 4 | dd_pick(in, 4) : dd_byte(in)),
                out_len);
        }
        size_t at = p[k].at + 5 + 2 * (size_t)nc + dd_pick(in, 3);
        return dd_set(j, len, at, (uint8_t)(dd_pick(in, 4) ? dd_pick(in, 64) : dd_byte(in)),
                      out_len);
    }
    case DD_DROP_SEGMENT: {
        static const int codes[] = {0xc4, 0xdb, 0xdd, 0xda, JK_DATA};
        int code = codes[dd_pick(in, 5)];
        if (!(n = dd_pieces_of(j, len, code, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        return jk_splice(j, len, p[k].at, p[k].len, NULL, 0, out_len);
    }
    case DD_RESTART: {
        uint8_t dri[6] = {0xff, 0xdd, 0x00, 0x04, 0, (uint8_t)dd_pick(in, 8)};
        if (dd_pick(in, 8) == 0) dri[4] = (uint8_t)dd_byte(in);
        if ((n = dd_pieces_of(j, len, 0xdd, p, 64)) && dd_pick(in, 2))
            return jk_splice(j, len, p[0].at, p[0].len, dri, 6, out_len);
        if (!(n = dd_pieces_of(j, len, 0xda, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        return jk_splice(j, len, p[k].at, 0, dri, 6, out_len);
    }
    case DD_MOVE_DHT: {
        jk_piece s[64];
        int ns;
        if (!(n = dd_pieces_of(j, len, 0xc4, p, 64)) || !(ns = dd_pieces_of(j, len, 0xda, s, 64)))
            return NULL;
        jk_piece from = p[dd_pick(in, (uint32_t)n)], to = s[dd_pick(in, (uint32_t)ns)];
        uint8_t *seg = malloc(from.len);
        if (!seg) return NULL;
        memcpy(seg, j + from.at, from.len);
        size_t n1;
        uint8_t *t = jk_splice(j, len, to.at, 0, seg, from.len, &n1), *o = NULL;
        if (t && dd_pick(in, 4)) /* moved, not copied */
            o = jk_splice(t, n1, from.at + (from.at >= to.at ? from.len : 0), from.len, NULL, 0,
                          out_len);
        else if (t)
            o = t, t = NULL, *out_len = n1;
        free(t);
        free(seg);
        return o;
    }
    case DD_DHT_COUNTS: {
        /* codes moved from one length to another in one table: over-full,
         * incomplete or all-ones tables of the same size */
        if (!(n = dd_pieces_of(j, len, 0xc4, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        if (p[k].len < 21) return NULL;
        size_t c = p[k].at + 5;
        int from = (int)dd_pick(in, 16), to = (int)dd_pick(in, 16), moved = 1 + (int)dd_pick(in, 4);
        if (j[c + (size_t)from] < moved || j[c + (size_t)to] + moved > 255) return NULL;
        uint8_t *o = jk_splice(j, len, 0, 0, NULL, 0, out_len);
        if (o)
            o[c + (size_t)from] = (uint8_t)(o[c + (size_t)from] - moved),
                  o[c + (size_t)to] = (uint8_t)(o[c + (size_t)to] + moved);
        return o;
    }
    case DD_TRUNCATE: {
        size_t cut = len > 2 ? 2 + dd_pick16(in) % (len - 2) : 0;
        return cut ? jk_splice(j, len, cut, len - cut, NULL, 0, out_len) : NULL;
    }
    case DD_QUANT: {
        if (!(n = dd_pieces_of(j, len, 0xdb, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        if (p[k].len < 6) return NULL;
        int which = (int)dd_pick(in, 3); /* the precision and id, the DC entry, the first AC */
        uint8_t v = (uint8_t)(which == 0 ? dd_pick(in, 3) << 4 | dd_pick(in, 5) : dd_byte(in));
        return dd_set(j, len, p[k].at + 4 + (size_t)which, v, out_len);
    }
    case DD_REPEAT_SCAN: {
        jk_piece all[512];
        int na = jk_pieces(j, len, all, 512), scans[64], ns = 0;
        for (int i = 0; i < na && ns < 64; i++)
            if (all[i].code == 0xda) scans[ns++] = i;
        if (!ns) return NULL;
        int i = scans[dd_pick(in, (uint32_t)ns)];
        size_t end = all[i].at + all[i].len;
        if (i + 1 < na && all[i + 1].code == JK_DATA) end = all[i + 1].at + all[i + 1].len;
        return jk_splice(j, len, end, 0, j + all[i].at, end - all[i].at, out_len);
    }
    case DD_RST_MARKER: {
        if (!(n = dd_pieces_of(j, len, JK_DATA, p, 64))) return NULL;
        k = (int)dd_pick(in, (uint32_t)n);
        size_t rst[64];
        int nr = 0;
        for (size_t i = p[k].at; i + 1 < p[k].at + p[k].len && nr < 64; i++)
            if (j[i] == 0xff && j[i + 1] >= 0xd0 && j[i + 1] <= 0xd7) rst[nr++] = i;
        int what = (int)dd_pick(in, 3);
        if (what == 2 || !nr) { /* a restart marker where there was none */
            uint8_t m[2] = {0xff, (uint8_t)(0xd0 + dd_pick(in, 8))};
            return jk_splice(j, len, p[k].at + dd_pick16(in) % p[k].len, 0, m, 2, out_len);
        }
        size_t at = rst[dd_pick(in, (uint32_t)nr)];
        if (what == 1) return jk_splice(j, len, at, 2, NULL, 0, out_len);
        return dd_set(j, len, at + 1, (uint8_t)(0xd0 + dd_pick(in, 8)), out_len);
    }
    case DD_JUNK: {
        jk_piece all[512];
        int na = jk_pieces(j, len, all, 512);
        if (na < 2) return NULL;
        int i = 1 + (int)dd_pick(in, (uint32_t)na - 1);
        static const uint8_t segs[][8] = {{0xff, 0xfe, 0x00, 0x04, 'h', 'i'},
                                          {0xff, 0xe3, 0x00, 0x02},
                                          {0x00, 0x11, 0x22},
                                          {0xff, 0xff, 0xff},
                                          {0xff, 0xd3},
                                          {0xff, 0xd8}};
        static const size_t lens[] = {6, 4, 3, 3, 2, 2};
        int s = (int)dd_pick(in, 6);
        return jk_splice(j, len, all[i].at, 0, segs[s], lens[s], out_len);
    }
    case DD_HEADER_BYTE: {
        jk_piece all[512];
        int na = jk_pieces(j, len, all, 512), seg[512], ns = 0;
        for (int i = 0; i < na; i++)
            if (all[i].code != JK_DATA && all[i].len > 2) seg[ns++] = i;
        if (!ns) return NULL;
        jk_piece q = all[seg[dd_pick(in, (uint32_t)ns)]];
        return dd_set(j, len, q.at + 2 + dd_pick16(in) % (q.len - 2), (uint8_t)dd_byte(in),
                      out_len);
    }
    case DD_STRIP_TABLES:
        return jk_without(j, len, dd_pick(in, 2) ? 0xc4 : 0xdb, out_len);
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// The check

/* A decode at 1/8 (or full size): its code, message and pixels. */
typedef struct {
    int rc;
    char msg[256];
    uint8_t *px;
    size_t n;
} dd_outcome;

static inline void dd_decode(dsrt_decoder *d, const uint8_t *j, size_t len, int ch, int dc,
                             int eighth, dd_outcome *o) {
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = ch;
    r.min_width = r.min_height = eighth ? 1 : 0;
    r.dc_eighth = dc;
    dsrt_image img;
    dsrt__clear_error();
    o->rc = dsrt_decode(d, j, len, &r, &img);
    snprintf(o->msg, sizeof o->msg, "%s", o->rc ? dsrt_last_error() : "");
    o->n = o->rc ? 0 : img.stride * (size_t)img.height;
    o->px = o->n ? malloc(o->n) : NULL;
    if (o->px) memcpy(o->px, img.data, o->n);
}

/* 1 when a and b differ (in pixels only where exact); what says where. */
static inline int dd_differ(const dd_outcome *a, const dd_outcome *b, int exact, const char *what,
                            const char *name) {
    int bad = a->rc != b->rc || strcmp(a->msg, b->msg) != 0;
    if (!bad && a->rc == 0 && exact)
        bad = a->n != b->n || !a->px || !b->px || memcmp(a->px, b->px, a->n) != 0;
    if (bad)
        fprintf(stderr, "dcdiff: %s: %s: %d (%s) against %d (%s)\n", name, what, a->rc, a->msg,
                b->rc, b->msg);
    return bad;
}

/* Every component sampled as the luma (RGB from the DC terms is then
 * libjpeg's), read from the frame header. */
static inline int dd_unsubsampled(const uint8_t *j, size_t len) {
    static const int sofs[] = {0xc0, 0xc1, 0xc2};
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(sofs); i++) {
        size_t at, n;
        if (jk_find(j, len, sofs[i], 0, &at, &n) != 0) continue;
        if (n < 10) return 0;
        int nc = j[at + 9];
        if (n < 10 + 3 * (size_t)nc) return 0;
        for (int c = 1; c < nc; c++)
            if (j[at + 11 + 3 * (size_t)c] != j[at + 11]) return 0;
        return 1;
    }
    return 0;
}

/* Decoders kept across cases: what they decoded before must not matter. */
typedef struct {
    dsrt_decoder *d;
    dsrt_jpeg_dc *dc;
} dd_kept;

/* Checks one file (see the top); 0, or 1 when the DC decoder and libjpeg
 * differ, or a kept decoder differs from fresh ones. */
static int dd_check(const uint8_t *j, size_t len, int family, int edited, dd_kept *kept,
                    dd_stats *st, const char *name) {
    int bad = 0, exact_rgb = dd_unsubsampled(j, len);
    st->tried[family][edited]++;
    if (!kept->d && dsrt_decoder_create(&kept->d, NULL) != 0) return 1;
    if (!kept->dc && !(kept->dc = dsrt__jpeg_dc_create())) return 1;
    dd_outcome gray_ref = {0};
    for (int ch = 1; ch <= 3; ch += 2) {
        dsrt_decoder *a, *b;
        if (dsrt_decoder_create(&a, NULL) != 0 || dsrt_decoder_create(&b, NULL) != 0) return 1;
        dd_outcome ref, got, again;
        dd_decode(a, j, len, ch, 0, 1, &ref);
        dd_decode(b, j, len, ch, 1, 1, &got);
        int exact = ch == 1 || exact_rgb;
        bad |= dd_differ(&got, &ref, exact,
                         ch == 1 ? "gray from the DC terms" : "RGB from the DC terms", name);
        dd_decode(kept->d, j, len, ch, 1, 1, &again);
        bad |= dd_differ(&again, &got, 1, "a kept decoder, from the DC terms", name);
        free(again.px);
        dd_decode(kept->d, j, len, ch, 0, 1, &again);
        bad |= dd_differ(&again, &ref, 1, "a kept decoder, libjpeg at 1/8", name);
        free(again.px);
        if (ch == 3) { /* full size: libjpeg alone, fresh and kept */
            dd_outcome full, kept_full;
            dd_decode(a, j, len, 3, 0, 0, &full);
            dd_decode(kept->d, j, len, 3, 0, 0, &kept_full);
            bad |= dd_differ(&kept_full, &full, 1, "a kept decoder, full size", name);
            free(full.px);
            free(kept_full.px);
        }
        if (ch == 1) {
            gray_ref = ref;
            ref.px = NULL;
            if (got.rc == 0 && ref.rc == 0) st->both_ok[family][edited]++;
            if (got.rc != 0 && got.rc == ref.rc && !strcmp(got.msg, ref.msg))
                st->both_failed[family][edited]++;
        }
        free(ref.px);
        free(got.px);
        dsrt_decoder_destroy(a);
        dsrt_decoder_destroy(b);
    }
    /* The DC decoder alone, fresh and kept: what it takes libjpeg decodes,
     * to the same luma. */
    dsrt_image_info info;
    if (dsrt_decoder_info(kept->d, j, len, &info) == 0 && info.format == DSRT_FORMAT_JPEG &&
        info.channels != 4) {
        size_t n = (size_t)((info.width + 7) / 8) * (size_t)((info.height + 7) / 8);
        uint8_t *p1 = malloc(n), *p2 = malloc(n);
        dsrt_jpeg_dc *fresh = dsrt__jpeg_dc_create();
        if (p1 && p2 && fresh) {
            int r1 = dsrt__jpeg_dc_decode(fresh, j, len, info.width, info.height, 1, p1);
            int r2 = dsrt__jpeg_dc_decode(kept->dc, j, len, info.width, info.height, 1, p2);
            if (r1 != r2 || (r1 == 0 && memcmp(p1, p2, n) != 0)) {
                fprintf(stderr, "dcdiff: %s: the DC decoder kept gives %d, fresh %d\n", name, r2,
                        r1);
                bad = 1;
            }
            if (r1 == 0) {
                st->dc_taken[family][edited]++;
                if (gray_ref.rc != 0 || gray_ref.n != n || memcmp(gray_ref.px, p1, n) != 0) {
                    fprintf(stderr,
                            "dcdiff: %s: the DC decoder took a file libjpeg gives %d (%s)\n", name,
                            gray_ref.rc, gray_ref.msg);
                    bad = 1;
                }
            }
        }
        dsrt__jpeg_dc_destroy(fresh);
        free(p1);
        free(p2);
    }
    free(gray_ref.px);
    st->mismatches += bad;
    return bad;
}

/*
 * Makes the case of recipe (n bytes) and checks it. *file, *file_len: the
 * file checked (malloc'd; NULL when the family made none). 0, or 1 at a
 * difference.
 */
static int dd_run(const uint8_t *recipe, size_t n, dd_kept *kept, dd_stats *st, uint8_t **file,
                  size_t *file_len) {
    dd_in in = {recipe, n, 0};
    int family;
    size_t len = 0;
    uint8_t *j;
    *file = NULL;
    if (n >= 2 && recipe[0] == 0xff && recipe[1] == 0xd8) {
        family = DD_RAW;
        j = malloc(n);
        if (j) memcpy(j, recipe, n), len = n;
        in.at = n;
    } else {
        family = (int)dd_pick(&in, 3);
        j = family == DD_TURBO     ? dd_turbo(&in, &len)
            : family == DD_LIBJPEG ? dd_libjpeg(&in, &len)
                                   : dd_synth(&in, &len);
    }
    if (!j) {
        st->no_file++;
        return 0;
    }
    int edits = (int)dd_pick(&in, 6), edited = 0;
    edits = edits > 3 ? 0 : edits; /* half of the cases as made */
    for (int e = 0; e < edits; e++) {
        size_t n2;
        uint8_t *t = dd_edit(&in, j, len, &n2);
        if (!t) continue;
        free(j);
        j = t;
        len = n2;
        edited = 1;
    }
    char name[64];
    snprintf(name, sizeof name, "%s%s (%zu bytes)", dd_family_names[family],
             edited ? ", edited" : "", len);
    int bad = dd_check(j, len, family, edited, kept, st, name);
    *file = j;
    *file_len = len;
    return bad;
}

static inline void dd_kept_free(dd_kept *kept) {
    dsrt_decoder_destroy(kept->d);
    dsrt__jpeg_dc_destroy(kept->dc);
    kept->d = NULL;
    kept->dc = NULL;
}

static inline void dd_report(const dd_stats *st, FILE *f) {
    fprintf(f, "%-8s %-7s %8s %9s %8s %11s\n", "family", "edited", "tried", "dc_taken", "both_ok",
            "both_failed");
    for (int fam = 0; fam < DD_FAMILIES; fam++)
        for (int e = 0; e < 2; e++)
            if (st->tried[fam][e])
                fprintf(f, "%-8s %-7s %8ld %9ld %8ld %11ld\n", dd_family_names[fam],
                        e ? "yes" : "no", st->tried[fam][e], st->dc_taken[fam][e],
                        st->both_ok[fam][e], st->both_failed[fam][e]);
    fprintf(f, "no file made: %ld; differences: %ld\n", st->no_file, st->mismatches);
}

#endif
