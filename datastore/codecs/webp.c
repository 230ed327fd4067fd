/*
 * The WebP codec (codecs.h), on libwebp: still WebP images, lossy (VP8)
 * and lossless (VP8L), with or without alpha, in memory -> 8-bit gray or
 * RGB pixels, always the whole image at its stored size (libwebp's scaling
 * resamples a whole decode: nothing is saved).
 *
 * Conventions, as Pillow gives them (its WebP plugin decodes with the same
 * libwebp, to RGBA or RGBX, and convert("RGB") drops the fourth byte):
 * - alpha is dropped, not composited, as PNG's is: libwebp decodes to RGB,
 *   so the alpha plane of a lossy file is not even decoded;
 * - libwebp's defaults: fancy upsampling of the chroma, no dithering;
 * - gray is rgb2gray of the RGB, as for a colour PNG.
 *
 * Bad input is data. The header is read with WebPGetFeatures, which checks
 * the RIFF and VP8X chunks and that the canvas is the bitstream's size; the
 * decoder checks the pixel count against max_pixels before any pixel memory
 * is taken (libwebp's own bound is 16383 a side). A file whose RIFF header
 * claims more bytes than there are is truncated at begin, before anything is
 * allocated. Animated files (a VP8X header with the animation flag, ANIM
 * and ANMF chunks) are refused (DSRT_EUNSUPPORTED, a bad file like any
 * other): a sample is one image. libwebp running out of memory on an image
 * is that image's failure (DSRT_ETOOBIG), not the run's: its lossless
 * decoder takes memory in proportion to the pixels the header claims.
 */
#include "datastore/codecs/codecs.h"

#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>

/* RIFF header: "RIFF", the size of what follows (little-endian), "WEBP". */
#define RIFF_HEADER 12

/* A decoder's WebP side: the image between begin and decode. */
typedef struct {
    const uint8_t *buf;
    size_t len;
    dsrt_image_info info;
} webp_state;

/* A libwebp status as a dsrt failure. */
static int webp_failed(VP8StatusCode s, const dsrt_image_info *info) {
    switch (s) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
    case VP8_STATUS_SUSPENDED:
        return dsrt__fail(DSRT_ETRUNCATED, "decode: WebP: not enough data (truncated file)");
    case VP8_STATUS_OUT_OF_MEMORY:
        if (info && info->width > 0)
            return dsrt__fail(DSRT_ETOOBIG, "decode: WebP: libwebp is out of memory for %dx%d",
                              info->width, info->height);
        return dsrt__fail(DSRT_ETOOBIG, "decode: WebP: libwebp is out of memory");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode: WebP: a feature libwebp does not support");
    default: /* BITSTREAM_ERROR, INVALID_PARAM, USER_ABORT */
        return dsrt__fail(DSRT_ECORRUPT, "decode: WebP: bitstream error (corrupt data)");
    }
}

static int webp_sniff(const uint8_t *buf, size_t len) {
    static const uint8_t riff[4] = {'R', 'I', 'F', 'F'}, webp[4] = {'W', 'E', 'B', 'P'};
    if (memcmp(buf, riff, DSRT_MIN(len, sizeof riff)) != 0) return DSRT_SNIFF_NO;
    if (len > 8 && memcmp(buf + 8, webp, DSRT_MIN(len - 8, sizeof webp)) != 0) return DSRT_SNIFF_NO;
    return len >= RIFF_HEADER ? DSRT_SNIFF_YES : DSRT_SNIFF_SHORT;
}

static int webp_create(void **state, const dsrt_decoder_options *o) {
    (void)o;
    webp_state *st = dsrt__calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    *state = st;
    return 0;
}

static void webp_destroy(void *state) {
    free(state);
}

static void webp_close(void *state) {
    webp_state *st = state;
    st->buf = NULL;
    st->len = 0;
}

static int webp_begin(void *state, const uint8_t *buf, size_t len, dsrt_image_info *info) {
    webp_state *st = state;
    st->buf = buf;
    st->len = len;
    /* sniff took the RIFF header: its size is there. */
    uint64_t riff =
        (uint64_t)buf[4] | (uint64_t)buf[5] << 8 | (uint64_t)buf[6] << 16 | (uint64_t)buf[7] << 24;
    if (riff + 8 > len)
        return dsrt__fail(DSRT_ETRUNCATED,
                          "decode: WebP: the RIFF header says %llu bytes, there are %zu "
                          "(truncated file)",
                          (unsigned long long)riff + 8, len);
    WebPBitstreamFeatures f;
    VP8StatusCode s = WebPGetFeatures(buf, len, &f);
    if (s != VP8_STATUS_OK) return webp_failed(s, NULL);
    if (f.has_animation)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "decode: WebP: an animation (%dx%d canvas): only "
                          "still images are decoded",
                          f.width, f.height);
    if (f.width <= 0 || f.height <= 0)
        return dsrt__fail(DSRT_ECORRUPT, "decode: WebP: %dx%d image", f.width, f.height);
    info->format = DSRT_FORMAT_WEBP;
    info->width = f.width;
    info->height = f.height;
    info->channels = f.has_alpha ? 4 : 3;
    info->bit_depth = 8;
    info->cmyk = 0;
    st->info = *info;
    return 0;
}

static int webp_decode(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req, int ch,
                       dsrt_image *out) {
    webp_state *st = state;
    int w = st->info.width, h = st->info.height;
    uint8_t *dst;
    int rc = dsrt__codec_target(sc, req->dst, req->dst_cap, w, h, ch, &dst);
    if (rc != 0) return rc;
    size_t pixels = (size_t)w * (size_t)h, bytes = pixels * 3;
    uint8_t *rgb = ch == 3 ? dst : dsrt__codec_work(sc, bytes);
    if (!rgb) return -ENOMEM;
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg))
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode: WebP: libwebp's decoder is of another "
                                             "version than its header");
    cfg.output.colorspace = MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = rgb;
    cfg.output.u.RGBA.stride = w * 3;
    cfg.output.u.RGBA.size = bytes;
    VP8StatusCode s = WebPDecode(st->buf, st->len, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (s != VP8_STATUS_OK) return webp_failed(s, &st->info);
    if (cfg.output.width != w || cfg.output.height != h)
        return dsrt__fail(DSRT_ECORRUPT, "decode: WebP: decoded %dx%d of a %dx%d header",
                          cfg.output.width, cfg.output.height, w, h);
    if (ch == 1) dsrt__rgb_to_gray(rgb, dst, pixels);
    out->data = dst;
    out->width = w;
    out->height = h;
    out->channels = ch;
    out->stride = (size_t)w * (size_t)ch;
    return 0;
}

const dsrt_codec_ops dsrt__codec_webp = {
    .format = DSRT_FORMAT_WEBP,
    .what = "WebP",
    .extensions = "webp",
    .sniff = webp_sniff,
    .create = webp_create,
    .destroy = webp_destroy,
    .begin = webp_begin,
    .close = webp_close,
    .decode = webp_decode,
};
