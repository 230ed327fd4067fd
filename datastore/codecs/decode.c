/*
 * The decoder: encoded JPEG or PNG bytes in memory -> 8-bit gray or RGB
 * pixels, with DCT-domain downscaling and region decoding for JPEGs.
 *
 * A dsrt_decoder belongs to one thread. It holds a libjpeg decompressor,
 * made again for each JPEG (libjpeg keeps the tables an image defined for
 * the next one, so an image without its own would decode with the last
 * file's: every image decodes as it would alone, whatever the thread
 * decoded before), and scratch buffers that grow on demand and are kept
 * between calls: the pixels dsrt_decode returns when the caller gives no
 * destination, the intermediate pixels of conversions (CMYK, or RGB on its
 * way to gray), the row pointers libjpeg writes through, and the bytes of a
 * file for dsrt_datastore_read_image. After the first few images the
 * decoder's own allocations stop; what remains per image is libjpeg's
 * decompressor and working memory and libspng's context.
 *
 * Decoding is two steps, dsrt_decode_begin (the header) and
 * dsrt_decode_finish (the pixels), so that a caller can choose the request
 * from the header (the pipeline asks the augmenter) without the header being
 * parsed twice; dsrt_decode does both.
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
 * taken: the pixel count against max_pixels (decompression bombs), every size
 * product against overflow. libjpeg's recoverable problems ("warnings") are
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
 * - PNG, as libspng decodes to 8 bits: palettes are expanded, alpha and tRNS
 *   are dropped (not composited, as Pillow's convert("RGB")), gamma is not
 *   applied, 1/2/4-bit gray is scaled to 0..255, and 16-bit samples keep
 *   their high byte (v >> 8).
 *
 * Valid JPEGs that libjpeg-turbo 2.1 cannot decode (lossless, 12-bit) are
 * DSRT_EUNSUPPORTED.
 */
#include "datastore/codecs/codecs.h"
#include "datastore/codecs/jpeg_dc.h"

#include <assert.h>
#include <limits.h>
#include <setjmp.h>
#include <spng.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t first */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

/* Pillow's DecompressionBombError threshold. */
#define DEFAULT_MAX_PIXELS 178956970u

/* libspng limits for ancillary chunks (text, ICC profiles, Exif): one chunk,
 * and all of them kept together. Image data (IDAT) is not limited by these. */
#define PNG_CHUNK_MAX ((size_t)16 << 20)
#define PNG_CACHE_MAX ((size_t)64 << 20)

/* Alignment of the scratch buffers: pages for file bytes (usable with
 * O_DIRECT), cache lines for pixels. */
#define FILE_ALIGN  DSRT_DIRECT_ALIGN
#define PIXEL_ALIGN 64

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

/* What dsrt_decode_begin left for dsrt_decode_finish. */
enum { OPEN_NONE = 0, OPEN_JPEG, OPEN_PNG };

/* The libjpeg decompressor's state (jpeg_fresh). */
enum { JD_NONE = 0, JD_FRESH, JD_USED };

struct dsrt_decoder {
    dsrt_decoder_options opt;
    struct jpeg_decompress_struct jd;
    int jd_state; /* JD_NONE: jd to be made; JD_FRESH; JD_USED: it has read a header */
    jpeg_errors je;
    struct jpeg_progress_mgr jp;
    /* The image between begin and finish: its bytes, header and state. */
    int open;
    const uint8_t *buf;
    size_t len;
    dsrt_image_info info;
    spng_ctx *png;
    struct spng_ihdr ihdr;
    uint8_t *pixels; /* (pixels_cap) what dsrt_decode returns when req->dst is NULL */
    size_t pixels_cap;
    uint8_t *work; /* (work_cap) intermediate pixels: CMYK, or RGB before gray */
    size_t work_cap;
    uint8_t *file; /* (file_cap) a file's bytes, for dsrt_datastore_read_image */
    size_t file_cap;
    uint8_t *rows; /* (rows_cap bytes) libjpeg's row pointers, JSAMPROW */
    size_t rows_cap;
    dsrt_jpeg_dc *dc; /* 1/8 scale from DC terms (jpeg_dc.h), made on first use */
};

static const uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
static const uint8_t jpeg_signature[3] = {0xff, 0xd8, 0xff};

// ----------------------------------------------------------------------------
// Scratch memory

/* Makes *buf hold at least need bytes, aligned to align (a power of two).
 * The old contents are not kept. Grows by half again at least, so that a
 * stream of images of slowly rising sizes does not reallocate every time. */
static uint8_t *scratch(uint8_t **buf, size_t *cap, size_t need, size_t align) {
    if (need <= *cap && *buf) return *buf;
    if (need > SIZE_MAX - align) {
        dsrt__fail(-ENOMEM, "decode: out of memory: %zu bytes", need);
        return NULL;
    }
    size_t c = *cap + *cap / 2;
    if (c < need) c = need;
    if (c > SIZE_MAX - align) c = need;
    c = (c + align - 1) & ~(align - 1);
    free(*buf);
    *buf = NULL;
    *cap = 0;
    void *p = NULL;
    if (posix_memalign(&p, align, c) != 0) {
        /* The generous size failed; the exact one may not. */
        c = (need + align - 1) & ~(align - 1);
        if (posix_memalign(&p, align, c ? c : align) != 0) {
            dsrt__fail(-ENOMEM, "decode: out of memory allocating %zu bytes", need);
            return NULL;
        }
    }
    *buf = p;
    *cap = c;
    return p;
}

uint8_t *dsrt__decoder_file_buffer(dsrt_decoder *d, size_t need) {
    return scratch(&d->file, &d->file_cap, need ? need : 1, FILE_ALIGN);
}

uint8_t *dsrt__decoder_pixel_buffer(dsrt_decoder *d, size_t need) {
    return scratch(&d->pixels, &d->pixels_cap, need ? need : 1, PIXEL_ALIGN);
}

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

// ----------------------------------------------------------------------------
// Decoder lifetime

dsrt_decoder_options dsrt_decoder_defaults(void) {
    dsrt_decoder_options o;
    memset(&o, 0, sizeof o);
    o.max_pixels = DEFAULT_MAX_PIXELS;
    o.strict = 0;
    return o;
}

/* The DCT scales dsrt_decode chooses from: 1/8, 1/4, 1/2 (and 1). */
static const int scale_denoms[] = {8, 4, 2};

/*
 * Gives d a fresh libjpeg decompressor unless it has one: one that has read
 * a header is destroyed and made again. libjpeg keeps the quantisation and
 * Huffman tables a file defined in the decompressor for the next file (for
 * abbreviated streams, whose tables come apart from the images), so a JPEG
 * without its own would decode with the last file's, and its outcome would
 * depend on what the decoder decoded before. A fresh decompressor gives what
 * the file gives alone: libjpeg's standard Huffman tables where a
 * sequential file defines none, "Quantization table 0x00 was not defined"
 * where it has no DQT. It costs a few small allocations. 0, or -ENOMEM.
 */
static int jpeg_fresh(dsrt_decoder *d) {
    if (d->jd_state == JD_FRESH) return 0;
    if (d->jd_state == JD_USED) jpeg_destroy_decompress(&d->jd);
    d->jd_state = JD_NONE;
    if (setjmp(d->je.jump)) { /* only out of memory */
        jpeg_destroy_decompress(&d->jd);
        return dsrt__fail(-ENOMEM, "decoder: jpeg_create_decompress: %s", d->je.msg);
    }
    jpeg_create_decompress(&d->jd);
    d->jd.progress = &d->jp;
    d->jd_state = JD_FRESH;
    return 0;
}

int dsrt_decoder_create(dsrt_decoder **out, const dsrt_decoder_options *o) {
    assert(out);
    *out = NULL;
    dsrt_decoder_options opt = o ? *o : dsrt_decoder_defaults();
    if (opt.max_pixels == 0)
        return dsrt__fail(DSRT_EOPTION, "decoder: max_pixels must be at least 1");
    dsrt_decoder *d = dsrt__calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    d->opt = opt;
    d->jd.err = jpeg_std_error(&d->je.pub);
    d->je.pub.error_exit = jpeg_on_error;
    d->je.pub.emit_message = jpeg_on_message;
    d->je.pub.output_message = jpeg_on_output;
    d->jp.progress_monitor = jpeg_on_progress;
    int rc = jpeg_fresh(d);
    if (rc != 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* Drops the image dsrt_decode_begin opened, if any. */
static void close_image(dsrt_decoder *d) {
    if (d->open == OPEN_JPEG) jpeg_abort_decompress(&d->jd);
    spng_ctx_free(d->png);
    d->png = NULL;
    d->open = OPEN_NONE;
    d->buf = NULL;
    d->len = 0;
}

void dsrt_decoder_destroy(dsrt_decoder *d) {
    if (!d) return;
    close_image(d);
    jpeg_destroy_decompress(&d->jd);
    free(d->pixels);
    free(d->work);
    free(d->file);
    free(d->rows);
    dsrt__jpeg_dc_destroy(d->dc);
    free(d);
}

// ----------------------------------------------------------------------------
// Formats and sizes

dsrt_format dsrt_detect_format(const void *buf, size_t len) {
    const uint8_t *p = buf;
    if (!p) return DSRT_FORMAT_UNKNOWN;
    if (len >= sizeof jpeg_signature && memcmp(p, jpeg_signature, sizeof jpeg_signature) == 0)
        return DSRT_FORMAT_JPEG;
    if (len >= sizeof png_signature && memcmp(p, png_signature, sizeof png_signature) == 0)
        return DSRT_FORMAT_PNG;
    return DSRT_FORMAT_UNKNOWN;
}

/* The format of buf, or a failure: empty, cut inside a signature, or neither. */
static int check_input(const uint8_t *buf, size_t len, dsrt_format *fmt) {
    if (len == 0) return dsrt__fail(DSRT_EEMPTY, "decode: empty (0 bytes)");
    if (!buf) return dsrt__fail(DSRT_EOPTION, "decode: no buffer for %zu bytes", len);
    *fmt = dsrt_detect_format(buf, len);
    if (*fmt != DSRT_FORMAT_UNKNOWN) return 0;
    if ((len < sizeof jpeg_signature && memcmp(buf, jpeg_signature, len) == 0) ||
        (len < sizeof png_signature && memcmp(buf, png_signature, len) == 0))
        return dsrt__fail(DSRT_ETRUNCATED, "decode: truncated after %zu bytes", len);
    return dsrt__fail(DSRT_EFORMAT, "decode: not a JPEG or PNG image");
}

/* Refuses images of more than max_pixels pixels. */
static int check_pixels(const dsrt_decoder *d, const dsrt_image_info *info) {
    uint64_t px = (uint64_t)info->width * (uint64_t)info->height;
    if (px > d->opt.max_pixels)
        return dsrt__fail(DSRT_ETOOBIG, "decode: %dx%d is %llu pixels, more than the limit of %llu",
                          info->width, info->height, (unsigned long long)px,
                          (unsigned long long)d->opt.max_pixels);
    return 0;
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

void dsrt_decode_size(const dsrt_image_info *info, const dsrt_decode_request *req, int *width,
                      int *height) {
    assert(info && req && width && height);
    int w = info->width, h = info->height;
    if (info->format == DSRT_FORMAT_JPEG && w > 0 && h > 0) {
        int s = jpeg_scale(w, h, req->min_width, req->min_height);
        w = div_up(w, s);
        h = div_up(h, s);
    }
    *width = w;
    *height = h;
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
static int jpeg_outcome(dsrt_decoder *d, int stopped) {
    const jpeg_errors *e = &d->je;
    int warning = !stopped || e->stopped;
    int premature = strstr(e->msg, "Premature end of JPEG file") != NULL;
    int truncated = premature || jpeg_truncated(d->buf, d->len);
    if (stopped) close_image(d);
    if (warning && !stopped && !truncated) return 0;
    if (truncated)
        return dsrt__fail(DSRT_ETRUNCATED, premature ? "decode: %s" : "decode: %s (truncated file)",
                          e->msg);
    if (strncmp(e->msg, "Unsupported", 11) == 0 || strstr(e->msg, "Could not determine colorspace"))
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode: %s", e->msg);
    return dsrt__fail(DSRT_ECORRUPT, "decode: %s", e->msg);
}

/* Reads the header of d->buf. Called under the caller's setjmp, with a
 * fresh decompressor (jpeg_fresh). */
static void jpeg_header(dsrt_decoder *d) {
    j_decompress_ptr j = &d->jd;
    d->jd_state = JD_USED;
    d->je.msg[0] = '\0';
    d->je.stopped = 0;
    d->je.strict = d->opt.strict;
    jpeg_mem_src(j, d->buf, (unsigned long)d->len);
    jpeg_read_header(j, TRUE); /* an image, not tables only: else an error */
}

static int jpeg_begin(dsrt_decoder *d, dsrt_image_info *info) {
    j_decompress_ptr j = &d->jd;
    if (d->len > ULONG_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "decode: %zu bytes is too large for libjpeg", d->len);
    int rc = jpeg_fresh(d);
    if (rc != 0) return rc;
    d->open = OPEN_JPEG;
    if (setjmp(d->je.jump)) return jpeg_outcome(d, 1);
    jpeg_header(d);
    if (j->jpeg_color_space == JCS_UNKNOWN) {
        snprintf(d->je.msg, sizeof d->je.msg, "Could not determine colorspace of JPEG image");
        return jpeg_outcome(d, 1);
    }
    if (j->err->num_warnings) {
        rc = jpeg_outcome(d, 0);
        if (rc != 0) {
            close_image(d);
            return rc;
        }
    }
    info->format = DSRT_FORMAT_JPEG;
    info->width = (int)j->image_width;
    info->height = (int)j->image_height;
    info->bit_depth = 8;
    info->cmyk = j->jpeg_color_space == JCS_CMYK || j->jpeg_color_space == JCS_YCCK;
    info->channels = j->jpeg_color_space == JCS_GRAYSCALE ? 1 : info->cmyk ? 4 : 3;
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
static int jpeg_rows(dsrt_decoder *d, const jpeg_plan *pl, int early, int again, dsrt_image *out,
                     dsrt_window *win) {
    j_decompress_ptr j = &d->jd;
    if (again) { /* the first pass's tables must not be seen */
        int rc = jpeg_fresh(d);
        if (rc != 0) {
            close_image(d);
            return rc;
        }
    }
    if (setjmp(d->je.jump)) return jpeg_outcome(d, 1);
    if (again) jpeg_header(d);
    j->scale_num = 1;
    j->scale_denom = (unsigned)pl->scale;
    j->dct_method = JDCT_ISLOW;
    j->do_fancy_upsampling = TRUE;
    int cmyk = j->jpeg_color_space == JCS_CMYK || j->jpeg_color_space == JCS_YCCK;
    j->out_color_space = cmyk ? JCS_CMYK : pl->ch == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(j);
    if ((int)j->output_width != pl->sw || (int)j->output_height != pl->sh) {
        snprintf(d->je.msg, sizeof d->je.msg, "libjpeg scaled %dx%d to %ux%u, not %dx%d",
                 d->info.width, d->info.height, j->output_width, j->output_height, pl->sw, pl->sh);
        return jpeg_outcome(d, 1);
    }
    JDIMENSION cx = (JDIMENSION)pl->x0, cw = (JDIMENSION)(pl->x1 - pl->x0);
    if (cw < (JDIMENSION)pl->sw) jpeg_crop_scanline(j, &cx, &cw);
    int ow = (int)j->output_width, rows = pl->y1 - pl->y0;
    int in_ch = cmyk ? 4 : pl->ch;
    size_t row_bytes = (size_t)ow * (size_t)in_ch, out_row = (size_t)ow * (size_t)pl->ch;
    size_t bytes = out_row * (size_t)rows;
    uint8_t *dst = pl->dst;
    if (dst && pl->dst_cap < bytes) {
        close_image(d);
        return dsrt__fail(DSRT_ETOOBIG,
                          "decode: destination holds %zu bytes, the %dx%dx%d image needs %zu",
                          pl->dst_cap, ow, rows, pl->ch, bytes);
    }
    if (!dst && !(dst = dsrt__decoder_pixel_buffer(d, bytes))) {
        close_image(d);
        return -ENOMEM;
    }
    /* libjpeg writes into target: the destination, or CMYK scratch that
     * holds one row more, the spare; else the spare is the work scratch. It
     * takes the rows below the window when they are decoded only to be
     * seen. */
    uint8_t *target = dst, *spare;
    if (cmyk) {
        target = scratch(&d->work, &d->work_cap, row_bytes * ((size_t)rows + 1), PIXEL_ALIGN);
        spare = target ? target + (size_t)rows * row_bytes : NULL;
    } else {
        spare = scratch(&d->work, &d->work_cap, row_bytes, PIXEL_ALIGN);
    }
    uint8_t *mem = scratch(&d->rows, &d->rows_cap, (size_t)rows * sizeof(JSAMPROW), PIXEL_ALIGN);
    if (!target || !spare || !mem) {
        close_image(d);
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
        const uint8_t *end = d->buf + d->len;
        int m = jpeg_input_complete(j) ? 0xd9
                : j->unread_marker     ? j->unread_marker
                                       : jpeg_next_marker(j->src->next_input_byte, end);
        if (m == 0) {
            if (!j->err->num_warnings) {
                j->err->num_warnings = 1;
                snprintf(d->je.msg, sizeof d->je.msg, "Premature end of JPEG file");
            }
            close_image(d);
            return dsrt__fail(DSRT_ETRUNCATED,
                              strstr(d->je.msg, "Premature") ? "decode: %s"
                                                             : "decode: %s (truncated file)",
                              d->je.msg);
        }
        if (m != 0xd9) {
            jpeg_abort_decompress(j);
            return 1;
        }
    } else {
        while (j->output_scanline < j->output_height) jpeg_read_scanlines(j, &spare, 1);
    }
    if (j->output_scanline == j->output_height) jpeg_finish_decompress(j);
    int rc = j->err->num_warnings ? jpeg_outcome(d, 0) : 0;
    close_image(d);
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
 * for the upsampler (see the top of the file). */
static void jpeg_window(const dsrt_decode_request *req, jpeg_plan *pl) {
    int s = pl->scale;
    pl->x0 = 0;
    pl->x1 = pl->sw;
    pl->y0 = 0;
    pl->y1 = pl->sh;
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
static int jpeg_dc_finish(dsrt_decoder *d, const jpeg_plan *pl, dsrt_image *out, dsrt_window *win) {
    J_COLOR_SPACE cs = d->jd.jpeg_color_space;
    if (cs != JCS_YCbCr && cs != JCS_GRAYSCALE) return 1;
    if (!d->dc && !(d->dc = dsrt__jpeg_dc_create()))
        return dsrt__fail(-ENOMEM, "decode: out of memory");
    size_t row = (size_t)pl->sw * (size_t)pl->ch, bytes = row * (size_t)pl->sh;
    uint8_t *dst = pl->dst;
    if (dst && pl->dst_cap < bytes) return 1; /* libjpeg's window may be smaller */
    if (!dst && !(dst = dsrt__decoder_pixel_buffer(d, bytes))) return -ENOMEM;
    int rc =
        dsrt__jpeg_dc_decode(d->dc, d->buf, d->len, d->info.width, d->info.height, pl->ch, dst);
    if (rc < 0) return dsrt__fail(rc, "decode: out of memory");
    if (rc > 0) return 1;
    close_image(d);
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

static int jpeg_finish(dsrt_decoder *d, const dsrt_decode_request *req, int ch, dsrt_image *out,
                       dsrt_window *win) {
    jpeg_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.scale = jpeg_scale(d->info.width, d->info.height, req->min_width, req->min_height);
    pl.sw = div_up(d->info.width, pl.scale);
    pl.sh = div_up(d->info.height, pl.scale);
    pl.ch = ch;
    pl.dst = req->dst;
    pl.dst_cap = req->dst_cap;
    if (req->dc_eighth && pl.scale == 8 && !d->opt.strict) {
        int rc = jpeg_dc_finish(d, &pl, out, win);
        if (rc <= 0) return rc;
    }
    jpeg_window(req, &pl);
    int rc = jpeg_rows(d, &pl, !d->opt.strict, 0, out, win);
    if (rc == 1) /* something follows the data the window needed: decode to the end */
        rc = jpeg_rows(d, &pl, 0, 1, out, win);
    return rc;
}
// ----------------------------------------------------------------------------
// PNG

/* A libspng error as a dsrt failure. */
static int png_failed(int err, const uint8_t *buf, size_t len, const dsrt_decoder *d) {
    switch (err) {
    case SPNG_IO_EOF:
    case SPNG_EIDAT_TOO_SHORT:
        return dsrt__fail(DSRT_ETRUNCATED, "decode: PNG: %s (truncated file)", spng_strerror(err));
    case SPNG_EMEM:
        return dsrt__fail(-ENOMEM, "decode: PNG: %s", spng_strerror(err));
    case SPNG_EUSER_WIDTH:
    case SPNG_EUSER_HEIGHT:
        if (len >= 24) {
            /* libspng stopped at its per-side limit; say it as check_pixels does. */
            uint32_t w = (uint32_t)buf[16] << 24 | (uint32_t)buf[17] << 16 | buf[18] << 8 | buf[19];
            uint32_t h = (uint32_t)buf[20] << 24 | (uint32_t)buf[21] << 16 | buf[22] << 8 | buf[23];
            return dsrt__fail(DSRT_ETOOBIG,
                              "decode: %ux%u is %llu pixels, more than the limit of %llu", w, h,
                              (unsigned long long)w * h, (unsigned long long)d->opt.max_pixels);
        }
        return dsrt__fail(DSRT_ETOOBIG, "decode: PNG: %s", spng_strerror(err));
    case SPNG_ECHUNK_LIMITS:
        return dsrt__fail(DSRT_ETOOBIG, "decode: PNG: %s", spng_strerror(err));
    default:
        return dsrt__fail(DSRT_ECORRUPT, "decode: PNG: %s", spng_strerror(err));
    }
}

/* Opens buf with libspng and reads its header into info. On success *out is
 * a context the caller frees with spng_ctx_free. */
static int png_open(dsrt_decoder *d, const uint8_t *buf, size_t len, spng_ctx **out,
                    dsrt_image_info *info, struct spng_ihdr *ihdr) {
    *out = NULL;
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return dsrt__fail(-ENOMEM, "decode: PNG: out of memory");
    /* One side may reach max_pixels when the other is 1; libspng's own bound
     * is 2^31 - 1. The pixel count is checked by check_pixels. */
    uint64_t side = DSRT_MIN(d->opt.max_pixels, (uint64_t)INT32_MAX);
    int err = spng_set_image_limits(ctx, (uint32_t)side, (uint32_t)side);
    if (!err) err = spng_set_chunk_limits(ctx, PNG_CHUNK_MAX, PNG_CACHE_MAX);
    if (!err) err = spng_set_png_buffer(ctx, buf, len);
    if (!err) err = spng_get_ihdr(ctx, ihdr);
    if (err) {
        int rc = png_failed(err, buf, len, d);
        spng_ctx_free(ctx);
        return rc;
    }
    info->format = DSRT_FORMAT_PNG;
    info->width = (int)ihdr->width;
    info->height = (int)ihdr->height;
    info->bit_depth = ihdr->bit_depth;
    info->cmyk = 0;
    switch (ihdr->color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
        info->channels = 1;
        break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
        info->channels = 2;
        break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
        info->channels = 4;
        break;
    default: /* truecolour, palette */
        info->channels = 3;
        break;
    }
    *out = ctx;
    return 0;
}

static int png_decode(dsrt_decoder *d, spng_ctx *ctx, const struct spng_ihdr *ihdr,
                      const uint8_t *buf, size_t len, int w, int h, int channels, uint8_t *dst) {
    size_t pixels = (size_t)w * (size_t)h;
    /* libspng gives G8 only for gray of at most 8 bits; everything else goes
     * through RGB8. */
    int direct_gray = ihdr->color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr->bit_depth <= 8;
    int fmt = channels == 1 && direct_gray ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
    size_t fmt_bytes = fmt == SPNG_FMT_G8 ? 1 : 3;
    if (pixels > SIZE_MAX / 3) return dsrt__fail(-ENOMEM, "decode: %dx%d too large", w, h);
    size_t need = 0;
    int err = spng_decoded_image_size(ctx, fmt, &need);
    if (err) return png_failed(err, buf, len, d);
    if (need != pixels * fmt_bytes)
        return dsrt__fail(DSRT_ECORRUPT, "decode: PNG: unexpected decoded size %zu for %dx%d", need,
                          w, h);
    uint8_t *target = dst;
    if (channels == 1 && fmt == SPNG_FMT_RGB8) {
        target = scratch(&d->work, &d->work_cap, need, PIXEL_ALIGN);
        if (!target) return -ENOMEM;
    }
    err = spng_decode_image(ctx, target, need, fmt, 0);
    if (err) return png_failed(err, buf, len, d);
    if (target != dst) dsrt__rgb_to_gray(target, dst, pixels);
    return 0;
}

// ----------------------------------------------------------------------------
// Decoding

int dsrt_decode_begin(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info) {
    assert(d && info);
    close_image(d);
    memset(info, 0, sizeof *info);
    dsrt_format fmt = DSRT_FORMAT_UNKNOWN;
    int rc = check_input(buf, len, &fmt);
    if (rc != 0) return rc;
    d->buf = buf;
    d->len = len;
    if (fmt == DSRT_FORMAT_JPEG) {
        rc = jpeg_begin(d, info);
    } else {
        rc = png_open(d, buf, len, &d->png, info, &d->ihdr);
        if (rc == 0) d->open = OPEN_PNG;
    }
    if (rc == 0) rc = check_pixels(d, info);
    if (rc != 0) {
        close_image(d);
        return rc;
    }
    d->info = *info;
    return 0;
}

int dsrt_decoder_info(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info) {
    int rc = dsrt_decode_begin(d, buf, len, info);
    close_image(d);
    return rc;
}

/* The request's own checks, before any work. */
static int check_request(const dsrt_decode_request *req) {
    if (req->channels != 1 && req->channels != 3)
        return dsrt__fail(DSRT_EOPTION, "decode: channels must be 1 or 3, not %d", req->channels);
    if (req->min_width < 0 || req->min_height < 0)
        return dsrt__fail(DSRT_EOPTION, "decode: negative minimum size %dx%d", req->min_width,
                          req->min_height);
    if (req->region_x < 0 || req->region_y < 0 || req->region_width < 0 || req->region_height < 0)
        return dsrt__fail(DSRT_EOPTION, "decode: region %d,%d %dx%d: negative", req->region_x,
                          req->region_y, req->region_width, req->region_height);
    if (req->allow_gray != 0 && req->allow_gray != 1)
        return dsrt__fail(DSRT_EOPTION, "decode: allow_gray: %d: not 0 or 1", req->allow_gray);
    if (req->dc_eighth != 0 && req->dc_eighth != 1)
        return dsrt__fail(DSRT_EOPTION, "decode: dc_eighth: %d: not 0 or 1", req->dc_eighth);
    return 0;
}

/* A gray image that stays gray when allow_gray is set: a gray JPEG, or a
 * gray PNG of at most 8 bits (whose RGB would replicate the same bytes). */
static int stays_gray(const dsrt_decoder *d) {
    if (d->open == OPEN_JPEG) return d->info.channels == 1;
    return d->ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && d->ihdr.bit_depth <= 8;
}

int dsrt_decode_finish(dsrt_decoder *d, const dsrt_decode_request *req, dsrt_image *out,
                       dsrt_window *win) {
    assert(d && req && out);
    memset(out, 0, sizeof *out);
    dsrt_window spare;
    if (!win) win = &spare;
    memset(win, 0, sizeof *win);
    int rc = check_request(req);
    if (rc == 0 && d->open == OPEN_NONE)
        rc = dsrt__fail(DSRT_EOPTION, "decode: no image begun (dsrt_decode_begin)");
    if (rc == 0 && ((req->region_width > 0 && req->region_x >= d->info.width) ||
                    (req->region_height > 0 && req->region_y >= d->info.height)))
        rc = dsrt__fail(DSRT_EOPTION, "decode: region at %d,%d lies outside the %dx%d image",
                        req->region_x, req->region_y, d->info.width, d->info.height);
    int w = 0, h = 0, ch = req->channels;
    if (rc == 0) {
        if (ch == 3 && req->allow_gray && stays_gray(d)) ch = 1;
        dsrt_decode_size(&d->info, req, &w, &h);
        /* w * h <= max_pixels, but max_pixels is the caller's: check anyway. */
        if ((uint64_t)w * (uint64_t)h > SIZE_MAX / 4)
            rc = dsrt__fail(DSRT_ETOOBIG, "decode: %dx%d does not fit in memory", w, h);
    }
    if (rc != 0) {
        close_image(d);
        return rc;
    }
    if (d->open == OPEN_JPEG) return jpeg_finish(d, req, ch, out, win);

    size_t bytes = (size_t)w * (size_t)h * (size_t)ch;
    uint8_t *dst = req->dst;
    if (dst && req->dst_cap < bytes)
        rc = dsrt__fail(DSRT_ETOOBIG,
                        "decode: destination holds %zu bytes, the %dx%dx%d image needs %zu",
                        req->dst_cap, w, h, ch, bytes);
    else if (!dst && !(dst = dsrt__decoder_pixel_buffer(d, bytes)))
        rc = -ENOMEM;
    if (rc == 0) rc = png_decode(d, d->png, &d->ihdr, d->buf, d->len, w, h, ch, dst);
    close_image(d);
    if (rc != 0) return rc;
    out->data = dst;
    out->width = w;
    out->height = h;
    out->channels = ch;
    out->stride = (size_t)w * (size_t)ch;
    win->decoded_width = w;
    win->decoded_height = h;
    return 0;
}

int dsrt_decode(dsrt_decoder *d, const void *buf, size_t len, const dsrt_decode_request *req,
                dsrt_image *out) {
    assert(d && req && out);
    memset(out, 0, sizeof *out);
    int rc = check_request(req);
    if (rc != 0) return rc;
    dsrt_image_info info;
    if ((rc = dsrt_decode_begin(d, buf, len, &info)) != 0) return rc;
    return dsrt_decode_finish(d, req, out, NULL);
}

// ----------------------------------------------------------------------------
// Writing PNG

int dsrt__png_encode(const dsrt_image *img, const char *name, void **png, size_t *size) {
    assert(img && png && size);
    *png = NULL;
    *size = 0;
    if (!img->data || img->width <= 0 || img->height <= 0 ||
        (img->channels != 1 && img->channels != 3))
        return dsrt__fail(DSRT_EOPTION, "png: %s: cannot write a %dx%dx%d image", name, img->width,
                          img->height, img->channels);
    size_t row = (size_t)img->width * (size_t)img->channels;
    if (img->stride < row)
        return dsrt__fail(DSRT_EOPTION, "png: %s: stride %zu is less than a row (%zu bytes)", name,
                          img->stride, row);
    if ((size_t)img->height > SIZE_MAX / img->stride)
        return dsrt__fail(DSRT_ETOOBIG, "png: %s: image too large", name);

    int rc = 0, err;
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!ctx) return dsrt__fail(-ENOMEM, "png: %s: out of memory", name);
    struct spng_ihdr ihdr = {
        .width = (uint32_t)img->width,
        .height = (uint32_t)img->height,
        .bit_depth = 8,
        .color_type = img->channels == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR,
    };
    err = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    if (!err) err = spng_set_ihdr(ctx, &ihdr);
    if (err) goto spng_fail;
    if (img->stride == row) {
        err = spng_encode_image(ctx, img->data, row * (size_t)img->height, SPNG_FMT_PNG,
                                SPNG_ENCODE_FINALIZE);
        if (err) goto spng_fail;
    } else {
        err = spng_encode_image(ctx, NULL, 0, SPNG_FMT_PNG,
                                SPNG_ENCODE_PROGRESSIVE | SPNG_ENCODE_FINALIZE);
        if (err) goto spng_fail;
        for (int y = 0; y < img->height; y++) {
            err = spng_encode_row(ctx, img->data + (size_t)y * img->stride, row);
            if (err == SPNG_EOI) break;
            if (err) goto spng_fail;
        }
        if (err != SPNG_EOI) {
            err = SPNG_EINTERNAL;
            goto spng_fail;
        }
    }
    *png = spng_get_png_buffer(ctx, size, &err);
    if (!*png) goto spng_fail;
    goto out;
spng_fail:
    rc = err == SPNG_EMEM ? -ENOMEM : DSRT_EUNSUPPORTED;
    dsrt__fail(rc, "png: %s: %s", name, spng_strerror(err));
out:
    spng_ctx_free(ctx);
    return rc;
}

int dsrt_png_write(const char *path, const dsrt_image *img) {
    assert(path && img);
    void *png;
    size_t size;
    int rc = dsrt__png_encode(img, path, &png, &size);
    if (rc != 0) return rc;
    rc = dsrt__write_file_replace(path, png, size);
    if (rc != 0) dsrt__fail_prefix(rc, "png");
    free(png);
    return rc;
}
