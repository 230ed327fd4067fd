/*
 * The JPEG codec (codecs.h): JPEG bytes in memory -> 8-bit gray or RGB
 * pixels, with DCT-domain downscaling (its scaled decode) and region
 * decoding (its region decode).
 *
 * A decoder's JPEG state holds a libjpeg decompressor, made again for each
 * JPEG (libjpeg keeps the tables an image defined for the next one, so an
 * image without its own would decode with the last file's: every image
 * decodes as it would alone, whatever the thread decoded before), and the
 * row pointers libjpeg writes through; the pixels and the intermediate
 * pixels of conversions (CMYK, or RGB on its way to gray) are the decoder's
 * scratch. What remains per image is libjpeg's decompressor and working
 * memory.
 *
 * Doing less. JPEGs go through libjpeg's own API (libjpeg-turbo), which
 * TurboJPEG's convenience calls hide the useful parts of:
 * - DCT scaling: the smallest of 1/8, 1/4, 1/2 that still covers the
 *   requested size. libjpeg-turbo also has the scales 3/8, 5/8, 6/8 and 7/8,
 *   but their inverse DCTs have no SIMD code: on 500x375 photos at 6/8 a
 *   decode takes 1.34 times as long as at full size (7/8: 1.74), so they are
 *   never used.
 * - Regions: with a region in the request only the DCT blocks that cover it
 *   are inverse transformed, upsampled and colour converted (columns:
 *   jpeg_crop_scanline; rows above: jpeg_skip_scanlines, which still
 *   entropy-decodes them; rows below are not decoded at all). Inside the
 *   region the pixels are a whole decode's, bit for bit: libjpeg's fancy
 *   upsampling treats a crop's edge columns as image edges, so one column
 *   more is decoded on each side (and at least 32 columns, below which
 *   libjpeg changes its upsampler), and rows need no margin. The window
 *   returned (a dsrt_window) starts at a block boundary to the left.
 * - Gray: gray from a colour JPEG is its luma alone (the chroma is never
 *   inverse transformed); a gray JPEG asked for RGB with allow_gray stays
 *   gray (the caller replicates it), so nothing is converted.
 *
 * Bad input is data. Every header is checked before any pixel memory is
 * taken (the decoder checks the pixel count against max_pixels, and every
 * size product against overflow). libjpeg's recoverable problems ("warnings") are
 * accepted unless the options ask for strictness, but a truncated image is
 * always an error: libjpeg says so itself ("Premature end of JPEG file") when
 * that is its first warning, and otherwise a scan of the markers finds that
 * the data ends before the end-of-image marker. A region decode that stops
 * before the last rows checks the rest the same way: the next marker after
 * the entropy-coded data must be the end of the image (else the data is
 * truncated, or something a whole decode would have looked at follows, and
 * the image is decoded to its end after all). A strict decoder always
 * decodes to the end, so every warning is seen.
 *
 * Conventions:
 * - CMYK and YCCK JPEGs are taken as Adobe (Photoshop) files, whose samples
 *   are stored inverted: R = C*K/255, G = M*K/255, B = Y*K/255 on the decoded
 *   samples, rounded to nearest (exactly Pillow's result for such files).
 *   Gray is then rgb2gray of that.
 * - Gray from a colour JPEG is the JPEG's own luma (Y), computed with the
 *   BT.601 weights when the file was made: no chroma is decoded at all.
 *   rgb2gray of the decoded RGB (Pillow's convert("L")) goes through chroma
 *   upsampling, rounding and clipping; on photos the two agree on 98% of
 *   pixels and within 2 levels on 99.7%, but differ more at saturated colour
 *   edges, where the RGB clips.
 * - JPEG decoding uses libjpeg's defaults, as TurboJPEG's tjDecompress2 does
 *   (accurate integer inverse DCT, fancy upsampling), and stops progressive
 *   images of more than 500 scans (TurboJPEG's TJFLAG_LIMITSCANS): the
 *   pixels are TurboJPEG's.
 *
 * Valid JPEGs that libjpeg-turbo 2.1 cannot decode (lossless, 12-bit) are
 * DSRT_EUNSUPPORTED.
 */
#include "datastore/codecs/codecs.h"
#include "datastore/codecs/jpeg_dc.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t first */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

/* Progressive JPEGs with more scans than this are refused (TurboJPEG's
 * TJFLAG_LIMITSCANS): each scan can make libjpeg walk every coefficient. */
#define JPEG_MAX_SCANS 500

/* Columns a JPEG region decode adds on each side (the fancy upsampler's
 * reach), and the fewest it decodes. */
#define CROP_MARGIN 1
#define CROP_MIN    32

/* libjpeg's error manager, extended: where to jump, and the message of the
 * error or of the first warning (as TurboJPEG keeps it). */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int strict;  /* jump at the first warning too */
    int stopped; /* the jump was taken at a warning */
    char msg[JMSG_LENGTH_MAX];
} jpeg_errors;

/* The libjpeg decompressor's state (jpeg_fresh). */
enum { JD_NONE = 0, JD_FRESH, JD_USED };

/* A decoder's JPEG side: its libjpeg decompressor, made again for each
 * image (jpeg_fresh), and the image between begin and finish. */
typedef struct {
    dsrt_decoder_options opt;
    struct jpeg_decompress_struct jd;
    int jd_state; /* JD_NONE: jd to be made; JD_FRESH; JD_USED: it has read a header */
    jpeg_errors je;
    struct jpeg_progress_mgr jp;
    int open; /* an image is begun: jd holds it */
    const uint8_t *buf;
    size_t len;
    dsrt_image_info info;
    uint8_t *rows; /* (rows_cap bytes) libjpeg's row pointers, JSAMPROW */
    size_t rows_cap;
    dsrt_jpeg_dc *dc; /* 1/8 scale from DC terms (jpeg_dc.h), made on first use */
} jpeg_state;

// ----------------------------------------------------------------------------
// libjpeg's callbacks: errors jump back, warnings are kept, nothing prints

static void jpeg_on_error(j_common_ptr c) {
    jpeg_errors *e = (jpeg_errors *)c->err;
    c->err->format_message(c, e->msg);
    e->stopped = 0;
    longjmp(e->jump, 1);
}

/* Warnings (level -1) are counted and the first one's message kept; trace
 * messages (level >= 0) are dropped. */
static void jpeg_on_message(j_common_ptr c, int level) {
    jpeg_errors *e = (jpeg_errors *)c->err;
    if (level >= 0) return;
    if (c->err->num_warnings++ == 0) c->err->format_message(c, e->msg);
    if (e->strict) {
        e->stopped = 1;
        longjmp(e->jump, 1);
    }
}

static void jpeg_on_output(j_common_ptr c) {
    (void)c;
}

static void jpeg_on_progress(j_common_ptr c) {
    j_decompress_ptr j = (j_decompress_ptr)c;
    if (j->input_scan_number > JPEG_MAX_SCANS) {
        jpeg_errors *e = (jpeg_errors *)c->err;
        snprintf(e->msg, sizeof e->msg, "Progressive JPEG image has more than %d scans",
                 JPEG_MAX_SCANS);
        e->stopped = 0;
        longjmp(e->jump, 1);
    }
}

/* The DCT scales dsrt_decode chooses from: 1/8, 1/4, 1/2 (and 1). */
static const int scale_denoms[] = {8, 4, 2};

/*
 * Gives st a fresh libjpeg decompressor unless it has one: one that has read
 * a header is destroyed and made again. libjpeg keeps the quantisation and
 * Huffman tables a file defined in the decompressor for the next file (for
 * abbreviated streams, whose tables come apart from the images), so a JPEG
 * without its own would decode with the last file's, and its outcome would
 * depend on what the decoder decoded before. A fresh decompressor gives what
 * the file gives alone: libjpeg's standard Huffman tables where a
 * sequential file defines none, "Quantization table 0x00 was not defined"
 * where it has no DQT. It costs a few small allocations. 0, or -ENOMEM.
 */
static int jpeg_fresh(jpeg_state *st) {
    if (st->jd_state == JD_FRESH) return 0;
    if (st->jd_state == JD_USED) jpeg_destroy_decompress(&st->jd);
    st->jd_state = JD_NONE;
    if (setjmp(st->je.jump)) { /* only out of memory */
        jpeg_destroy_decompress(&st->jd);
        return dsrt__fail(-ENOMEM, "decoder: jpeg_create_decompress: %s", st->je.msg);
    }
    jpeg_create_decompress(&st->jd);
    st->jd.progress = &st->jp;
    st->jd_state = JD_FRESH;
    return 0;
}

/* Drops the image begun, if any. */
static void jpeg_close(void *state) {
    jpeg_state *st = state;
    if (st->open) jpeg_abort_decompress(&st->jd);
    st->open = 0;
    st->buf = NULL;
    st->len = 0;
}

static int jpeg_state_create(void **state, const dsrt_decoder_options *o) {
    jpeg_state *st = dsrt__calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    st->opt = *o;
    st->jd.err = jpeg_std_error(&st->je.pub);
    st->je.pub.error_exit = jpeg_on_error;
    st->je.pub.emit_message = jpeg_on_message;
    st->je.pub.output_message = jpeg_on_output;
    st->jp.progress_monitor = jpeg_on_progress;
    int rc = jpeg_fresh(st);
    if (rc != 0) {
        free(st);
        return rc;
    }
    *state = st;
    return 0;
}

static void jpeg_state_destroy(void *state) {
    jpeg_state *st = state;
    if (!st) return;
    jpeg_close(st);
    jpeg_destroy_decompress(&st->jd);
    free(st->rows);
    dsrt__jpeg_dc_destroy(st->dc);
    free(st);
}

/* The DCT scale denominator (1, 2, 4 or 8) dsrt_decode uses for a JPEG. */
static int jpeg_scale(int w, int h, int min_w, int min_h) {
    if (min_w <= 0 && min_h <= 0) return 1;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(scale_denoms); k++) {
        int s = scale_denoms[k];
        int sw = (int)(((int64_t)w + s - 1) / s), sh = (int)(((int64_t)h + s - 1) / s);
        if (sw >= min_w && sh >= min_h) return s;
    }
    return 1;
}

/* ceil(a / s) */
static int div_up(int a, int s) {
    return (int)(((int64_t)a + s - 1) / s);
}

// ----------------------------------------------------------------------------
// JPEG

/*
 * 1 when the JPEG data ends before its end-of-image marker: the markers are
 * walked by their lengths up to the first start-of-scan, then the rest is
 * searched for FF D9 (inside entropy-coded data every FF is followed by 00
 * or a restart code, so FF D9 there is the end of the image). Only used
 * after libjpeg has complained, to tell truncation from corruption.
 */
static int jpeg_truncated(const uint8_t *buf, size_t len) {
    size_t pos = 2;
    for (;;) {
        while (pos < len && buf[pos] != 0xff) pos++; /* junk between markers */
        while (pos < len && buf[pos] == 0xff) pos++; /* fill bytes */
        if (pos >= len) return 1;
        uint8_t m = buf[pos++];
        if (m == 0xd9) return 0;                                          /* EOI before any scan */
        if (m == 0x00 || m == 0x01 || (m >= 0xd0 && m <= 0xd8)) continue; /* no length */
        if (len - pos < 2) return 1;
        size_t seg = (size_t)buf[pos] << 8 | buf[pos + 1];
        if (seg < 2) return 0; /* corrupt, not short */
        if (seg > len - pos) return 1;
        pos += seg;
        if (m == 0xda) break;
    }
    for (; pos + 1 < len; pos++)
        if (buf[pos] == 0xff && buf[pos + 1] == 0xd9) return 0;
    return 1;
}

/*
 * The marker that follows entropy-coded data from p on: its code, or 0 when
 * the data ends first. Stuffed zeros, restart markers and fill bytes are
 * part of the data.
 */
static int jpeg_next_marker(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        const uint8_t *ff = memchr(p, 0xff, (size_t)(end - p));
        if (!ff) return 0;
        p = ff + 1;
        while (p < end && *p == 0xff) p++;
        if (p >= end) return 0;
        uint8_t m = *p++;
        if (m != 0x00 && !(m >= 0xd0 && m <= 0xd7)) return m;
    }
    return 0;
}

/*
 * After libjpeg stopped (stopped: an error, or a warning of a strict
 * decoder) or finished with warnings: 0 when the outcome is one the options
 * accept (warnings only, the data not truncated, not strict), else the
 * failure: truncated, unsupported ("Unsupported JPEG process", 12-bit data,
 * a colour space libjpeg has no name for) or corrupt. Leaves the
 * decompressor reset either way when stopped.
 */
static int jpeg_outcome(jpeg_state *st, int stopped) {
    const jpeg_errors *e = &st->je;
    int warning = !stopped || e->stopped;
    int premature = strstr(e->msg, "Premature end of JPEG file") != NULL;
    int truncated = premature || jpeg_truncated(st->buf, st->len);
    if (stopped) jpeg_close(st);
    if (warning && !stopped && !truncated) return 0;
    if (truncated)
        return dsrt__fail(DSRT_ETRUNCATED, premature ? "decode: %s" : "decode: %s (truncated file)",
                          e->msg);
    if (strncmp(e->msg, "Unsupported", 11) == 0 || strstr(e->msg, "Could not determine colorspace"))
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode: %s", e->msg);
    return dsrt__fail(DSRT_ECORRUPT, "decode: %s", e->msg);
}

/* Reads the header of st->buf. Called under the caller's setjmp, with a
 * fresh decompressor (jpeg_fresh). */
static void jpeg_header(jpeg_state *st) {
    j_decompress_ptr j = &st->jd;
    st->jd_state = JD_USED;
    st->je.msg[0] = '\0';
    st->je.stopped = 0;
    st->je.strict = st->opt.strict;
    jpeg_mem_src(j, st->buf, (unsigned long)st->len);
    jpeg_read_header(j, TRUE); /* an image, not tables only: else an error */
}

static int jpeg_begin(void *state, const uint8_t *buf, size_t len, dsrt_image_info *info) {
    jpeg_state *st = state;
    j_decompress_ptr j = &st->jd;
    st->buf = buf;
    st->len = len;
    if (st->len > ULONG_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "decode: %zu bytes is too large for libjpeg", st->len);
    int rc = jpeg_fresh(st);
    if (rc != 0) return rc;
    st->open = 1;
    if (setjmp(st->je.jump)) return jpeg_outcome(st, 1);
    jpeg_header(st);
    if (j->jpeg_color_space == JCS_UNKNOWN) {
        snprintf(st->je.msg, sizeof st->je.msg, "Could not determine colorspace of JPEG image");
        return jpeg_outcome(st, 1);
    }
    if (j->err->num_warnings) {
        rc = jpeg_outcome(st, 0);
        if (rc != 0) {
            jpeg_close(st);
            return rc;
        }
    }
    info->format = DSRT_FORMAT_JPEG;
    info->width = (int)j->image_width;
    info->height = (int)j->image_height;
    info->bit_depth = 8;
    info->cmyk = j->jpeg_color_space == JCS_CMYK || j->jpeg_color_space == JCS_YCCK;
    info->channels = j->jpeg_color_space == JCS_GRAYSCALE ? 1 : info->cmyk ? 4 : 3;
    st->info = *info;
    return 0;
}

/* x * y / 255 rounded to nearest, exact for x, y in 0..255. */
static inline uint32_t mul255(uint32_t x, uint32_t y) {
    uint32_t t = x * y + 128;
    return (t + (t >> 8)) >> 8;
}

/* Adobe-inverted CMYK to RGB (see the top of the file). */
static void cmyk_to_rgb(const uint8_t *restrict cmyk, uint8_t *restrict rgb, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint32_t k = cmyk[4 * i + 3];
        rgb[3 * i] = (uint8_t)mul255(cmyk[4 * i], k);
        rgb[3 * i + 1] = (uint8_t)mul255(cmyk[4 * i + 1], k);
        rgb[3 * i + 2] = (uint8_t)mul255(cmyk[4 * i + 2], k);
    }
}

/* The same, then rgb2gray, in one pass. */
static void cmyk_to_gray(const uint8_t *restrict cmyk, uint8_t *restrict gray, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) {
        uint32_t k = cmyk[4 * i + 3];
        uint32_t r = mul255(cmyk[4 * i], k), g = mul255(cmyk[4 * i + 1], k),
                 b = mul255(cmyk[4 * i + 2], k);
        gray[i] = (uint8_t)((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
    }
}

/* What dsrt_decode_finish decodes: the scale, the output channels, and the
 * window of the scaled image, [x0, x1) x [y0, y1). */
typedef struct {
    int scale, ch, sw, sh;
    int x0, x1, y0, y1;
    uint8_t *dst; /* the caller's, or NULL */
    size_t dst_cap;
} jpeg_plan;

/*
 * Decodes the planned window. early: rows below the window may be left
 * undecoded. again: the header must be read again (a second pass). Returns
 * 0, a failure, or 1 when the data after the window must be seen after all
 * (decode again, with early 0). On success fills out; the image is closed
 * in every case but the last.
 */
static int jpeg_rows(jpeg_state *st, dsrt_codec_scratch *sc, const jpeg_plan *pl, int early,
                     int again, dsrt_image *out, dsrt_window *win) {
    j_decompress_ptr j = &st->jd;
    if (again) { /* the first pass's tables must not be seen */
        int rc = jpeg_fresh(st);
        if (rc != 0) {
            jpeg_close(st);
            return rc;
        }
    }
    if (setjmp(st->je.jump)) return jpeg_outcome(st, 1);
    if (again) jpeg_header(st);
    j->scale_num = 1;
    j->scale_denom = (unsigned)pl->scale;
    j->dct_method = JDCT_ISLOW;
    j->do_fancy_upsampling = TRUE;
    int cmyk = j->jpeg_color_space == JCS_CMYK || j->jpeg_color_space == JCS_YCCK;
    j->out_color_space = cmyk ? JCS_CMYK : pl->ch == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(j);
    if ((int)j->output_width != pl->sw || (int)j->output_height != pl->sh) {
        snprintf(st->je.msg, sizeof st->je.msg, "libjpeg scaled %dx%d to %ux%u, not %dx%d",
                 st->info.width, st->info.height, j->output_width, j->output_height, pl->sw,
                 pl->sh);
        return jpeg_outcome(st, 1);
    }
    JDIMENSION cx = (JDIMENSION)pl->x0, cw = (JDIMENSION)(pl->x1 - pl->x0);
    if (cw < (JDIMENSION)pl->sw) jpeg_crop_scanline(j, &cx, &cw);
    int ow = (int)j->output_width, rows = pl->y1 - pl->y0;
    int in_ch = cmyk ? 4 : pl->ch;
    size_t row_bytes = (size_t)ow * (size_t)in_ch, out_row = (size_t)ow * (size_t)pl->ch;
    size_t bytes = out_row * (size_t)rows;
    uint8_t *dst = pl->dst;
    if (dst && pl->dst_cap < bytes) {
        jpeg_close(st);
        return dsrt__fail(DSRT_ETOOBIG,
                          "decode: destination holds %zu bytes, the %dx%dx%d image needs %zu",
                          pl->dst_cap, ow, rows, pl->ch, bytes);
    }
    if (!dst && !(dst = dsrt__codec_pixels(sc, bytes))) {
        jpeg_close(st);
        return -ENOMEM;
    }
    /* libjpeg writes into target: the destination, or CMYK scratch that
     * holds one row more, the spare; else the spare is the work scratch. It
     * takes the rows below the window when they are decoded only to be
     * seen. */
    uint8_t *target = dst, *spare;
    if (cmyk) {
        target = dsrt__codec_work(sc, row_bytes * ((size_t)rows + 1));
        spare = target ? target + (size_t)rows * row_bytes : NULL;
    } else {
        spare = dsrt__codec_work(sc, row_bytes);
    }
    uint8_t *mem =
        dsrt__scratch(&st->rows, &st->rows_cap, (size_t)rows * sizeof(JSAMPROW), DSRT_PIXEL_ALIGN);
    if (!target || !spare || !mem) {
        jpeg_close(st);
        return -ENOMEM;
    }
    JSAMPROW *row = (JSAMPROW *)(void *)mem;
    for (int y = 0; y < rows; y++) row[y] = target + (size_t)y * row_bytes;
    if (pl->y0 > 0) jpeg_skip_scanlines(j, (JDIMENSION)pl->y0);
    while ((int)j->output_scanline < pl->y1)
        jpeg_read_scanlines(j, row + ((int)j->output_scanline - pl->y0),
                            (JDIMENSION)(pl->y1 - (int)j->output_scanline));
    if (pl->y1 < pl->sh && early) {
        /* Rows left undecoded: fine when the entropy-coded data runs to the
         * end-of-image marker (a progressive image is all read already). */
        const uint8_t *end = st->buf + st->len;
        int m = jpeg_input_complete(j) ? 0xd9
                : j->unread_marker     ? j->unread_marker
                                       : jpeg_next_marker(j->src->next_input_byte, end);
        if (m == 0) {
            if (!j->err->num_warnings) {
                j->err->num_warnings = 1;
                snprintf(st->je.msg, sizeof st->je.msg, "Premature end of JPEG file");
            }
            jpeg_close(st);
            return dsrt__fail(DSRT_ETRUNCATED,
                              strstr(st->je.msg, "Premature") ? "decode: %s"
                                                              : "decode: %s (truncated file)",
                              st->je.msg);
        }
        if (m != 0xd9) {
            jpeg_abort_decompress(j);
            return 1;
        }
    } else {
        while (j->output_scanline < j->output_height) jpeg_read_scanlines(j, &spare, 1);
    }
    if (j->output_scanline == j->output_height) jpeg_finish_decompress(j);
    int rc = j->err->num_warnings ? jpeg_outcome(st, 0) : 0;
    jpeg_close(st);
    if (rc != 0) return rc;
    size_t px = (size_t)ow * (size_t)rows;
    if (cmyk && pl->ch == 3) cmyk_to_rgb(target, dst, px);
    if (cmyk && pl->ch == 1) cmyk_to_gray(target, dst, px);
    out->data = dst;
    out->width = ow;
    out->height = rows;
    out->channels = pl->ch;
    out->stride = out_row;
    win->x0 = (int)cx;
    win->y0 = pl->y0;
    win->decoded_width = pl->sw;
    win->decoded_height = pl->sh;
    return 0;
}

/* The window of the scaled image that holds the request's region, widened
 * for the upsampler (see the top of the file); req NULL: the whole image. */
static void jpeg_window(const dsrt_decode_request *req, jpeg_plan *pl) {
    int s = pl->scale;
    pl->x0 = 0;
    pl->x1 = pl->sw;
    pl->y0 = 0;
    pl->y1 = pl->sh;
    if (!req) return;
    if (req->region_width > 0) {
        int x0 = req->region_x / s - CROP_MARGIN;
        int x1 = div_up(req->region_x + req->region_width, s) + CROP_MARGIN;
        x0 = DSRT_MAX(x0, 0);
        x1 = DSRT_MIN(x1, pl->sw);
        if (x1 - x0 < CROP_MIN) {
            x1 = DSRT_MIN(x0 + CROP_MIN, pl->sw);
            x0 = DSRT_MAX(x1 - CROP_MIN, 0);
        }
        pl->x0 = x0;
        pl->x1 = x1;
    }
    if (req->region_height > 0) {
        pl->y0 = DSRT_MIN(req->region_y / s, pl->sh - 1);
        pl->y1 =
            DSRT_MAX(DSRT_MIN(div_up(req->region_y + req->region_height, s), pl->sh), pl->y0 + 1);
    }
}

/*
 * The whole image at 1/8 scale from its DC terms (jpeg_dc.h): 0, 1 when
 * the file is one to leave to libjpeg, or a failure. The window is the
 * whole image: at 1/8 a region saves too little to be worth its margins.
 */
static int jpeg_dc_finish(jpeg_state *st, dsrt_codec_scratch *sc, const jpeg_plan *pl,
                          dsrt_image *out, dsrt_window *win) {
    J_COLOR_SPACE cs = st->jd.jpeg_color_space;
    if (cs != JCS_YCbCr && cs != JCS_GRAYSCALE) return 1;
    if (!st->dc && !(st->dc = dsrt__jpeg_dc_create()))
        return dsrt__fail(-ENOMEM, "decode: out of memory");
    size_t row = (size_t)pl->sw * (size_t)pl->ch, bytes = row * (size_t)pl->sh;
    uint8_t *dst = pl->dst;
    if (dst && pl->dst_cap < bytes) return 1; /* libjpeg's window may be smaller */
    if (!dst && !(dst = dsrt__codec_pixels(sc, bytes))) return -ENOMEM;
    int rc = dsrt__jpeg_dc_decode(st->dc, st->buf, st->len, st->info.width, st->info.height, pl->ch,
                                  dst);
    if (rc < 0) return dsrt__fail(rc, "decode: out of memory");
    if (rc > 0) return 1;
    jpeg_close(st);
    out->data = dst;
    out->width = pl->sw;
    out->height = pl->sh;
    out->channels = pl->ch;
    out->stride = row;
    win->x0 = win->y0 = 0;
    win->decoded_width = pl->sw;
    win->decoded_height = pl->sh;
    return 0;
}

/* The open image at scale 1/s, the window of the request's region when
 * region is 1, else whole. */
static int jpeg_finish(jpeg_state *st, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                       int ch, int s, int region, dsrt_image *out, dsrt_window *win) {
    jpeg_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.scale = s;
    pl.sw = div_up(st->info.width, pl.scale);
    pl.sh = div_up(st->info.height, pl.scale);
    pl.ch = ch;
    pl.dst = req->dst;
    pl.dst_cap = req->dst_cap;
    if (req->dc_eighth && pl.scale == 8 && !st->opt.strict) {
        int rc = jpeg_dc_finish(st, sc, &pl, out, win);
        if (rc <= 0) return rc;
    }
    jpeg_window(region ? req : NULL, &pl);
    int rc = jpeg_rows(st, sc, &pl, !st->opt.strict, 0, out, win);
    if (rc == 1) /* something follows the data the window needed: decode to the end */
        rc = jpeg_rows(st, sc, &pl, 0, 1, out, win);
    return rc;
}

// ----------------------------------------------------------------------------
// The codec

static int jpeg_sniff(const uint8_t *buf, size_t len) {
    static const uint8_t signature[3] = {0xff, 0xd8, 0xff};
    if (len >= sizeof signature) return memcmp(buf, signature, sizeof signature) == 0;
    return memcmp(buf, signature, len) == 0 ? DSRT_SNIFF_SHORT : DSRT_SNIFF_NO;
}

/* A gray JPEG stays gray. */
static int jpeg_stays_gray(const void *state) {
    const jpeg_state *st = state;
    return st->info.channels == 1;
}

static int jpeg_decode(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req, int ch,
                       dsrt_image *out) {
    dsrt_window win;
    return jpeg_finish(state, sc, req, ch, 1, 0, out, &win);
}

static int jpeg_decode_scaled(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                              int ch, int s, dsrt_image *out) {
    dsrt_window win;
    return jpeg_finish(state, sc, req, ch, s, 0, out, &win);
}

static int jpeg_decode_region(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                              int ch, int s, dsrt_image *out, dsrt_window *win) {
    return jpeg_finish(state, sc, req, ch, s, 1, out, win);
}

const dsrt_codec_ops dsrt__codec_jpeg = {
    .format = DSRT_FORMAT_JPEG,
    .what = "JPEG",
    .extensions = "jpg,jpeg,jpe,jfif",
    .sniff = jpeg_sniff,
    .create = jpeg_state_create,
    .destroy = jpeg_state_destroy,
    .begin = jpeg_begin,
    .close = jpeg_close,
    .stays_gray = jpeg_stays_gray,
    .decode = jpeg_decode,
    .scale = jpeg_scale,
    .decode_scaled = jpeg_decode_scaled,
    .decode_region = jpeg_decode_region,
};
