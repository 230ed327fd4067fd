/*
 * The decoder: encoded JPEG or PNG bytes in memory -> 8-bit gray or RGB
 * pixels, with DCT-domain downscaling for JPEGs.
 *
 * A dsrt_decoder belongs to one thread. It holds one TurboJPEG handle and
 * three scratch buffers that grow on demand and are kept between calls: the
 * pixels dsrt_decode returns when the caller gives no destination, the
 * intermediate pixels of conversions (CMYK, or RGB on its way to gray), and
 * the bytes of a file for dsrt_datastore_read_image. After the first few
 * images the decoder's own allocations stop; what remains per image is
 * libjpeg's working memory and libspng's context.
 *
 * Bad input is data. Every header is checked before any pixel memory is
 * taken: the pixel count against max_pixels (decompression bombs), every size
 * product against overflow. libjpeg's recoverable problems ("warnings") are
 * accepted unless the options ask for strictness, but a truncated image is
 * always an error: libjpeg says so itself ("Premature end of JPEG file") when
 * that is its first warning, and otherwise a scan of the markers finds that
 * the data ends before the end-of-image marker.
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
 * - PNG, as libspng decodes to 8 bits: palettes are expanded, alpha and tRNS
 *   are dropped (not composited, as Pillow's convert("RGB")), gamma is not
 *   applied, 1/2/4-bit gray is scaled to 0..255, and 16-bit samples keep
 *   their high byte (v >> 8).
 *
 * TurboJPEG 2.1 leaves a handle in a bad state after a failed call (the next
 * call on it can fail or succeed wrongly), so the handle is replaced after any
 * failure; failures are rare enough that this costs nothing. Its header call
 * also refuses sampling factors it has no name for (tjDecompressHeader3:
 * "Could not determine subsampling type"), which libjpeg decodes well: the
 * decoder takes the size from that call anyway and goes on. Valid JPEGs that
 * libjpeg-turbo 2.1 cannot decode (lossless, 12-bit) are DSRT_EUNSUPPORTED.
 */
#include "internal.h"

#include <assert.h>
#include <limits.h>
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

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

/* libjpeg's messages are at most JMSG_LENGTH_MAX (200) bytes. */
#define TJ_MESSAGE_MAX 256

struct dsrt_decoder {
    dsrt_decoder_options opt;
    tjhandle tj;     /* NULL after a failed re-creation; made again on the next call */
    uint8_t *pixels; /* (pixels_cap) what dsrt_decode returns when req->dst is NULL */
    size_t pixels_cap;
    uint8_t *work; /* (work_cap) intermediate pixels: CMYK, or RGB before gray */
    size_t work_cap;
    uint8_t *file; /* (file_cap) a file's bytes, for dsrt_datastore_read_image */
    size_t file_cap;
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

/* 1 when TurboJPEG offers every scale in scale_denoms. */
static int scales_available(void) {
    int n = 0;
    const tjscalingfactor *sf = tjGetScalingFactors(&n);
    if (!sf) return 0;
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(scale_denoms); k++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (sf[i].num * scale_denoms[k] == sf[i].denom) found = 1;
        if (!found) return 0;
    }
    return 1;
}

int dsrt_decoder_create(dsrt_decoder **out, const dsrt_decoder_options *o) {
    assert(out);
    *out = NULL;
    dsrt_decoder_options opt = o ? *o : dsrt_decoder_defaults();
    if (opt.max_pixels == 0)
        return dsrt__fail(DSRT_EOPTION, "decoder: max_pixels must be at least 1");
    if (!scales_available())
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "decoder: this TurboJPEG lacks the scales 1/2, 1/4 and 1/8");
    dsrt_decoder *d = dsrt__calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    d->opt = opt;
    d->tj = tjInitDecompress();
    if (!d->tj) {
        int rc = dsrt__fail(-ENOMEM, "decoder: tjInitDecompress: %s", tjGetErrorStr2(NULL));
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void dsrt_decoder_destroy(dsrt_decoder *d) {
    if (!d) return;
    if (d->tj) tjDestroy(d->tj);
    free(d->pixels);
    free(d->work);
    free(d->file);
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

void dsrt_decode_size(const dsrt_image_info *info, const dsrt_decode_request *req, int *width,
                      int *height) {
    assert(info && req && width && height);
    int w = info->width, h = info->height;
    if (info->format == DSRT_FORMAT_JPEG && w > 0 && h > 0) {
        int s = jpeg_scale(w, h, req->min_width, req->min_height);
        w = (int)(((int64_t)w + s - 1) / s);
        h = (int)(((int64_t)h + s - 1) / s);
    }
    *width = w;
    *height = h;
}

// ----------------------------------------------------------------------------
// JPEG

/* Makes a fresh TurboJPEG handle, after a failure or on first use. */
static int jpeg_handle(dsrt_decoder *d) {
    if (d->tj) return 0;
    d->tj = tjInitDecompress();
    if (!d->tj) return dsrt__fail(-ENOMEM, "decode: tjInitDecompress: %s", tjGetErrorStr2(NULL));
    return 0;
}

static void jpeg_reset(dsrt_decoder *d) {
    if (d->tj) tjDestroy(d->tj);
    d->tj = tjInitDecompress(); /* NULL is retried by jpeg_handle on the next call */
}

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
 * After a TurboJPEG call returned -1: 0 when the problem is one the options
 * accept (a warning, the pixels being complete; or a header whose sampling
 * factors TurboJPEG has no name for, which libjpeg still decodes), else the
 * failure: truncated, unsupported ("Unsupported JPEG process", 12-bit data)
 * or corrupt. Replaces the handle either way.
 */
static int jpeg_failed(dsrt_decoder *d, const uint8_t *buf, size_t len, int may_accept) {
    char msg[TJ_MESSAGE_MAX];
    int warning = tjGetErrorCode(d->tj) == TJERR_WARNING;
    snprintf(msg, sizeof msg, "%s", tjGetErrorStr2(d->tj));
    jpeg_reset(d);
    int premature = strstr(msg, "Premature end of JPEG file") != NULL;
    int truncated = premature || jpeg_truncated(buf, len);
    int odd_sampling = strstr(msg, "Could not determine subsampling type") != NULL;
    if (may_accept && !truncated && (odd_sampling || (warning && !d->opt.strict))) return 0;
    if (truncated)
        return dsrt__fail(DSRT_ETRUNCATED, premature ? "decode: %s" : "decode: %s (truncated file)",
                          msg);
    if (strncmp(msg, "Unsupported", 11) == 0 || strstr(msg, "Could not determine colorspace"))
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode: %s", msg);
    return dsrt__fail(DSRT_ECORRUPT, "decode: %s", msg);
}

static int jpeg_info(dsrt_decoder *d, const uint8_t *buf, size_t len, dsrt_image_info *info) {
    int rc = jpeg_handle(d);
    if (rc != 0) return rc;
    int w = 0, h = 0, subsamp = -1, colorspace = -1;
    if (tjDecompressHeader3(d->tj, buf, (unsigned long)len, &w, &h, &subsamp, &colorspace) != 0) {
        /* A warning in the header ("extraneous bytes before marker") and
         * unnamed sampling factors still give the header's values. */
        rc = jpeg_failed(d, buf, len, w > 0 && h > 0 && colorspace >= 0);
        if (rc != 0) return rc;
    }
    if (w <= 0 || h <= 0) {
        /* Tables only, no frame header: TurboJPEG says nothing. */
        jpeg_reset(d);
        return dsrt__fail(jpeg_truncated(buf, len) ? DSRT_ETRUNCATED : DSRT_ECORRUPT,
                          "decode: JPEG datastream contains no image");
    }
    info->format = DSRT_FORMAT_JPEG;
    info->width = w;
    info->height = h;
    info->bit_depth = 8;
    info->cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
    info->channels = colorspace == TJCS_GRAY ? 1 : info->cmyk ? 4 : 3;
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

static int jpeg_decode(dsrt_decoder *d, const uint8_t *buf, size_t len, const dsrt_image_info *info,
                       int w, int h, int channels, uint8_t *dst) {
    int flags = TJFLAG_LIMITSCANS | (d->opt.strict ? TJFLAG_STOPONWARNING : 0);
    int rc = jpeg_handle(d);
    if (rc != 0) return rc;
    size_t pixels = (size_t)w * (size_t)h;
    if (info->cmyk) {
        if (pixels > SIZE_MAX / 4) return dsrt__fail(-ENOMEM, "decode: %dx%d CMYK too large", w, h);
        uint8_t *cmyk = scratch(&d->work, &d->work_cap, pixels * 4, PIXEL_ALIGN);
        if (!cmyk) return -ENOMEM;
        if (tjDecompress2(d->tj, buf, (unsigned long)len, cmyk, w, w * 4, h, TJPF_CMYK, flags) !=
            0) {
            rc = jpeg_failed(d, buf, len, 1);
            if (rc != 0) return rc;
        }
        if (channels == 3)
            cmyk_to_rgb(cmyk, dst, pixels);
        else
            cmyk_to_gray(cmyk, dst, pixels);
        return 0;
    }
    int pf = channels == 1 ? TJPF_GRAY : TJPF_RGB;
    if (tjDecompress2(d->tj, buf, (unsigned long)len, dst, w, w * channels, h, pf, flags) != 0)
        return jpeg_failed(d, buf, len, 1);
    return 0;
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

int dsrt_decoder_info(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info) {
    assert(d && info);
    memset(info, 0, sizeof *info);
    dsrt_format fmt = DSRT_FORMAT_UNKNOWN;
    int rc = check_input(buf, len, &fmt);
    if (rc != 0) return rc;
    if (fmt == DSRT_FORMAT_JPEG) {
        rc = jpeg_info(d, buf, len, info);
    } else {
        spng_ctx *ctx = NULL;
        struct spng_ihdr ihdr;
        rc = png_open(d, buf, len, &ctx, info, &ihdr);
        spng_ctx_free(ctx);
    }
    if (rc != 0) return rc;
    return check_pixels(d, info);
}

int dsrt_decode(dsrt_decoder *d, const void *buf, size_t len, const dsrt_decode_request *req,
                dsrt_image *out) {
    assert(d && req && out);
    memset(out, 0, sizeof *out);
    if (req->channels != 1 && req->channels != 3)
        return dsrt__fail(DSRT_EOPTION, "decode: channels must be 1 or 3, not %d", req->channels);
    if (req->min_width < 0 || req->min_height < 0)
        return dsrt__fail(DSRT_EOPTION, "decode: negative minimum size %dx%d", req->min_width,
                          req->min_height);
    const uint8_t *p = buf;
    dsrt_format fmt = DSRT_FORMAT_UNKNOWN;
    int rc = check_input(p, len, &fmt);
    if (rc != 0) return rc;

    dsrt_image_info info;
    memset(&info, 0, sizeof info);
    spng_ctx *ctx = NULL;
    struct spng_ihdr ihdr;
    if (fmt == DSRT_FORMAT_JPEG)
        rc = jpeg_info(d, p, len, &info);
    else
        rc = png_open(d, p, len, &ctx, &info, &ihdr);
    if (rc != 0) goto fail;
    rc = check_pixels(d, &info);
    if (rc != 0) goto fail;

    int w, h, ch = req->channels;
    dsrt_decode_size(&info, req, &w, &h);
    /* w * h <= max_pixels, but max_pixels is the caller's: check anyway. */
    if ((uint64_t)w * (uint64_t)h > SIZE_MAX / (size_t)ch) {
        rc = dsrt__fail(DSRT_ETOOBIG, "decode: %dx%d does not fit in memory", w, h);
        goto fail;
    }
    size_t bytes = (size_t)w * (size_t)h * (size_t)ch;
    uint8_t *dst = req->dst;
    if (dst) {
        if (req->dst_cap < bytes) {
            rc = dsrt__fail(DSRT_ETOOBIG,
                            "decode: destination holds %zu bytes, the %dx%dx%d image needs %zu",
                            req->dst_cap, w, h, ch, bytes);
            goto fail;
        }
    } else if (!(dst = dsrt__decoder_pixel_buffer(d, bytes))) {
        rc = -ENOMEM;
        goto fail;
    }

    if (fmt == DSRT_FORMAT_JPEG)
        rc = jpeg_decode(d, p, len, &info, w, h, ch, dst);
    else
        rc = png_decode(d, ctx, &ihdr, p, len, w, h, ch, dst);
    if (rc != 0) goto fail;
    spng_ctx_free(ctx);
    out->data = dst;
    out->width = w;
    out->height = h;
    out->channels = ch;
    out->stride = (size_t)w * (size_t)ch;
    return 0;
fail:
    spng_ctx_free(ctx);
    return rc;
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
