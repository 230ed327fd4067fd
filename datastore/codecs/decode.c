/*
 * The decoder: encoded image bytes in memory -> 8-bit gray or RGB pixels,
 * through the table of codecs (codecs.h), which it knows no format of.
 *
 * A dsrt_decoder belongs to one thread. It holds each codec's state (a
 * libjpeg decompressor, ...), made when the decoder is, and scratch buffers
 * that grow on demand and are kept between calls: the pixels dsrt_decode
 * returns when the caller gives no destination, the intermediate pixels of
 * conversions (CMYK, or RGB on its way to gray), and the bytes of a file for
 * dsrt_datastore_read_image. After the first few images the decoder's own
 * allocations stop; what remains per image is the codec libraries' own.
 *
 * Decoding is two steps, dsrt_decode_begin (the header) and
 * dsrt_decode_finish (the pixels), so that a caller can choose the request
 * from the header (the pipeline asks the augmenter) without the header being
 * parsed twice; dsrt_decode does both. Begin tells the format from the first
 * bytes (the first codec of the table whose sniff takes them) and has the
 * codec read the header; finish checks the request, chooses the codec's
 * decode (a region decode when the request has a region and the codec one,
 * else a scaled decode when the codec's scale for the minimum size is more
 * than 1, else the whole image) and closes the image whatever the outcome.
 *
 * Bad input is data. Every header is checked before any pixel memory is
 * taken: the pixel count against max_pixels (decompression bombs), every size
 * product against overflow; each codec checks the rest of its own.
 */
#include "datastore/codecs/codecs.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Pillow's DecompressionBombError threshold. */
#define DEFAULT_MAX_PIXELS 178956970u

/* Alignment of the file scratch: pages (usable with O_DIRECT). */
#define FILE_ALIGN DSRT_DIRECT_ALIGN

/* The most codecs a decoder holds states for. */
#define MAX_CODECS 8

struct dsrt_decoder {
    dsrt_decoder_options opt;
    void *state[MAX_CODECS]; /* each codec's, in table order */
    /* The image between begin and finish: its codec and header. */
    const dsrt_codec_ops *open;
    void *open_state;
    dsrt_image_info info;
    dsrt_codec_scratch scratch; /* the pixels dsrt_decode returns when req->dst is NULL, and
                                 * intermediate pixels: CMYK, or RGB before gray */
    uint8_t *file;              /* (file_cap) a file's bytes, for dsrt_datastore_read_image */
    size_t file_cap;
};

// ----------------------------------------------------------------------------
// Scratch memory

uint8_t *dsrt__decoder_file_buffer(dsrt_decoder *d, size_t need) {
    return dsrt__scratch(&d->file, &d->file_cap, need ? need : 1, FILE_ALIGN);
}

uint8_t *dsrt__decoder_pixel_buffer(dsrt_decoder *d, size_t need) {
    return dsrt__codec_pixels(&d->scratch, need);
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

/* Drops the image dsrt_decode_begin opened, if any. */
static void close_image(dsrt_decoder *d) {
    if (d->open) d->open->close(d->open_state);
    d->open = NULL;
    d->open_state = NULL;
}

void dsrt_decoder_destroy(dsrt_decoder *d) {
    if (!d) return;
    close_image(d);
    for (size_t k = 0; k < dsrt__codec_count(); k++) {
        const dsrt_codec_ops *c = dsrt__codec_at(k);
        if (c->destroy && d->state[k]) c->destroy(d->state[k]);
    }
    dsrt__codec_scratch_free(&d->scratch);
    free(d->file);
    free(d);
}

int dsrt_decoder_create(dsrt_decoder **out, const dsrt_decoder_options *o) {
    assert(out);
    *out = NULL;
    dsrt_decoder_options opt = o ? *o : dsrt_decoder_defaults();
    if (opt.max_pixels == 0)
        return dsrt__fail(DSRT_EOPTION, "decoder: max_pixels must be at least 1");
    assert(dsrt__codec_count() <= MAX_CODECS);
    dsrt_decoder *d = dsrt__calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    d->opt = opt;
    for (size_t k = 0; k < dsrt__codec_count(); k++) {
        const dsrt_codec_ops *c = dsrt__codec_at(k);
        int rc = c->create ? c->create(&d->state[k], &d->opt) : 0;
        if (rc != 0) {
            dsrt_decoder_destroy(d);
            return rc;
        }
    }
    *out = d;
    return 0;
}

// ----------------------------------------------------------------------------
// Formats and sizes

/* The codec of buf, or a failure: empty, cut inside a signature, or none. */
static int check_input(const uint8_t *buf, size_t len, const dsrt_codec_ops **codec) {
    if (len == 0) return dsrt__fail(DSRT_EEMPTY, "decode: empty (0 bytes)");
    if (!buf) return dsrt__fail(DSRT_EOPTION, "decode: no buffer for %zu bytes", len);
    int cut = 0;
    *codec = dsrt__codec_sniff(buf, len, &cut);
    if (*codec) return 0;
    if (cut) return dsrt__fail(DSRT_ETRUNCATED, "decode: truncated after %zu bytes", len);
    char names[128];
    dsrt__codec_names(names, sizeof names);
    return dsrt__fail(DSRT_EFORMAT, "decode: not a %s image", names);
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

/* The scale denominator the codec of info decodes at for req (1: none). */
static int decode_scale(const dsrt_image_info *info, const dsrt_decode_request *req) {
    const dsrt_codec_ops *c = dsrt__codec_ops(info->format);
    if (!c || !c->scale || info->width <= 0 || info->height <= 0) return 1;
    return c->scale(info->width, info->height, req->min_width, req->min_height);
}

void dsrt_decode_size(const dsrt_image_info *info, const dsrt_decode_request *req, int *width,
                      int *height) {
    assert(info && req && width && height);
    int w = info->width, h = info->height, s = decode_scale(info, req);
    if (s > 1) {
        w = (int)(((int64_t)w + s - 1) / s);
        h = (int)(((int64_t)h + s - 1) / s);
    }
    *width = w;
    *height = h;
}

// ----------------------------------------------------------------------------
// Decoding

int dsrt_decode_begin(dsrt_decoder *d, const void *buf, size_t len, dsrt_image_info *info) {
    assert(d && info);
    close_image(d);
    memset(info, 0, sizeof *info);
    const dsrt_codec_ops *c = NULL;
    int rc = check_input(buf, len, &c);
    if (rc != 0) return rc;
    size_t k = 0;
    while (dsrt__codec_at(k) != c) k++;
    d->open = c;
    d->open_state = d->state[k];
    rc = c->begin(d->open_state, buf, len, info);
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

int dsrt_decode_finish(dsrt_decoder *d, const dsrt_decode_request *req, dsrt_image *out,
                       dsrt_window *win) {
    assert(d && req && out);
    memset(out, 0, sizeof *out);
    dsrt_window spare;
    if (!win) win = &spare;
    memset(win, 0, sizeof *win);
    int rc = check_request(req);
    if (rc == 0 && !d->open)
        rc = dsrt__fail(DSRT_EOPTION, "decode: no image begun (dsrt_decode_begin)");
    if (rc == 0 && ((req->region_width > 0 && req->region_x >= d->info.width) ||
                    (req->region_height > 0 && req->region_y >= d->info.height)))
        rc = dsrt__fail(DSRT_EOPTION, "decode: region at %d,%d lies outside the %dx%d image",
                        req->region_x, req->region_y, d->info.width, d->info.height);
    int w = 0, h = 0, ch = req->channels;
    const dsrt_codec_ops *c = d->open;
    if (rc == 0) {
        if (ch == 3 && req->allow_gray && c->stays_gray && c->stays_gray(d->open_state)) ch = 1;
        dsrt_decode_size(&d->info, req, &w, &h);
        /* w * h <= max_pixels, but max_pixels is the caller's: check anyway. */
        if ((uint64_t)w * (uint64_t)h > SIZE_MAX / 4)
            rc = dsrt__fail(DSRT_ETOOBIG, "decode: %dx%d does not fit in memory", w, h);
    }
    if (rc != 0) {
        close_image(d);
        return rc;
    }
    int s = decode_scale(&d->info, req);
    if (c->decode_region && (req->region_width > 0 || req->region_height > 0)) {
        rc = c->decode_region(d->open_state, &d->scratch, req, ch, s, out, win);
    } else {
        if (s > 1 && c->decode_scaled)
            rc = c->decode_scaled(d->open_state, &d->scratch, req, ch, s, out);
        else
            rc = c->decode(d->open_state, &d->scratch, req, ch, out);
        if (rc == 0) {
            win->decoded_width = out->width;
            win->decoded_height = out->height;
        }
    }
    close_image(d);
    if (rc != 0) memset(out, 0, sizeof *out);
    return rc;
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
