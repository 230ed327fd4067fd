/*
 * The PNG codec (codecs.h), on libspng: PNG bytes in memory -> 8-bit gray
 * or RGB pixels, always the whole image at its stored size (the format has
 * no cheaper smaller decode). And the PNG encoder the writers use
 * (dsrt__png_encode, dsrt_png_write).
 *
 * As libspng decodes to 8 bits: palettes are expanded, alpha and tRNS are
 * dropped (not composited, as Pillow's convert("RGB")), gamma is not
 * applied, 1/2/4-bit gray is scaled to 0..255, and 16-bit samples keep
 * their high byte (v >> 8). Gray from a colour PNG is rgb2gray of its RGB.
 * The header is checked before any pixel memory is taken: libspng's
 * per-side limit is the decoder's max_pixels (the decoder checks the
 * count), and ancillary chunks (text, ICC profiles, Exif) are limited in
 * size; libspng's context is made for each image.
 */
#include "datastore/codecs/codecs.h"

#include <assert.h>
#include <limits.h>
#include <spng.h>
#include <stdlib.h>
#include <string.h>

/* libspng limits for ancillary chunks (text, ICC profiles, Exif): one chunk,
 * and all of them kept together. Image data (IDAT) is not limited by these. */
#define PNG_CHUNK_MAX ((size_t)16 << 20)
#define PNG_CACHE_MAX ((size_t)64 << 20)

/* A decoder's PNG side: the image between begin and decode. */
typedef struct {
    uint64_t max_pixels;
    spng_ctx *ctx; /* NULL: no image begun */
    struct spng_ihdr ihdr;
    const uint8_t *buf;
    size_t len;
} png_state;

static const uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// ----------------------------------------------------------------------------
// Decoding

/* A libspng error as a dsrt failure. */
static int png_failed(int err, const uint8_t *buf, size_t len, uint64_t max_pixels) {
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
                              (unsigned long long)w * h, (unsigned long long)max_pixels);
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
static int png_open(uint64_t max_pixels, const uint8_t *buf, size_t len, spng_ctx **out,
                    dsrt_image_info *info, struct spng_ihdr *ihdr) {
    *out = NULL;
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return dsrt__fail(-ENOMEM, "decode: PNG: out of memory");
    /* One side may reach max_pixels when the other is 1; libspng's own bound
     * is 2^31 - 1. The pixel count is checked by check_pixels. */
    uint64_t side = DSRT_MIN(max_pixels, (uint64_t)INT32_MAX);
    int err = spng_set_image_limits(ctx, (uint32_t)side, (uint32_t)side);
    if (!err) err = spng_set_chunk_limits(ctx, PNG_CHUNK_MAX, PNG_CACHE_MAX);
    if (!err) err = spng_set_png_buffer(ctx, buf, len);
    if (!err) err = spng_get_ihdr(ctx, ihdr);
    if (err) {
        int rc = png_failed(err, buf, len, max_pixels);
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

static int png_decode(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                      int channels, dsrt_image *out) {
    png_state *st = state;
    spng_ctx *ctx = st->ctx;
    const struct spng_ihdr *ihdr = &st->ihdr;
    int w = (int)ihdr->width, h = (int)ihdr->height;
    uint8_t *dst;
    int rc = dsrt__codec_target(sc, req->dst, req->dst_cap, w, h, channels, &dst);
    if (rc != 0) return rc;
    size_t pixels = (size_t)w * (size_t)h;
    /* libspng gives G8 only for gray of at most 8 bits; everything else goes
     * through RGB8. */
    int direct_gray = ihdr->color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr->bit_depth <= 8;
    int fmt = channels == 1 && direct_gray ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
    size_t fmt_bytes = fmt == SPNG_FMT_G8 ? 1 : 3;
    if (pixels > SIZE_MAX / 3) return dsrt__fail(-ENOMEM, "decode: %dx%d too large", w, h);
    size_t need = 0;
    int err = spng_decoded_image_size(ctx, fmt, &need);
    if (err) return png_failed(err, st->buf, st->len, st->max_pixels);
    if (need != pixels * fmt_bytes)
        return dsrt__fail(DSRT_ECORRUPT, "decode: PNG: unexpected decoded size %zu for %dx%d", need,
                          w, h);
    uint8_t *target = dst;
    if (channels == 1 && fmt == SPNG_FMT_RGB8) {
        target = dsrt__codec_work(sc, need);
        if (!target) return -ENOMEM;
    }
    err = spng_decode_image(ctx, target, need, fmt, 0);
    if (err) return png_failed(err, st->buf, st->len, st->max_pixels);
    if (target != dst) dsrt__rgb_to_gray(target, dst, pixels);
    out->data = dst;
    out->width = w;
    out->height = h;
    out->channels = channels;
    out->stride = (size_t)w * (size_t)channels;
    return 0;
}

// ----------------------------------------------------------------------------
// The codec

static int png_sniff(const uint8_t *buf, size_t len) {
    if (len >= sizeof png_signature) return memcmp(buf, png_signature, sizeof png_signature) == 0;
    return memcmp(buf, png_signature, len) == 0 ? DSRT_SNIFF_SHORT : DSRT_SNIFF_NO;
}

static int png_create(void **state, const dsrt_decoder_options *o) {
    png_state *st = dsrt__calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    st->max_pixels = o->max_pixels;
    *state = st;
    return 0;
}

static void png_close(void *state) {
    png_state *st = state;
    spng_ctx_free(st->ctx);
    st->ctx = NULL;
    st->buf = NULL;
    st->len = 0;
}

static void png_destroy(void *state) {
    if (!state) return;
    png_close(state);
    free(state);
}

static int png_begin(void *state, const uint8_t *buf, size_t len, dsrt_image_info *info) {
    png_state *st = state;
    st->buf = buf;
    st->len = len;
    return png_open(st->max_pixels, buf, len, &st->ctx, info, &st->ihdr);
}

/* A gray PNG of at most 8 bits stays gray (its RGB would replicate the
 * same bytes). */
static int png_stays_gray(const void *state) {
    const png_state *st = state;
    return st->ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && st->ihdr.bit_depth <= 8;
}

const dsrt_codec_ops dsrt__codec_png = {
    .format = DSRT_FORMAT_PNG,
    .what = "PNG",
    .extensions = "png",
    .sniff = png_sniff,
    .create = png_create,
    .destroy = png_destroy,
    .begin = png_begin,
    .close = png_close,
    .stays_gray = png_stays_gray,
    .decode = png_decode,
};

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
