/*
 * The codecs: one table of them (codec.c, made from DSRT_FORMATS in the
 * public header), each a dsrt_codec_ops that its own file fills (jpeg.c,
 * png.c, webp.c). A codec tells its bytes from others', reads a header,
 * and decodes: the whole image, and where the format can do less, a
 * smaller scale (JPEG's DCT scaling) or a region (JPEG's crop decode).
 *
 * Above the table, nothing knows a format: the decoder (decode.c) sniffs
 * the bytes through it, checks what every format shares (the pixel limit,
 * the request, the destination) and calls the codec; the folder rules take
 * the formats' extensions from it as the default list
 * (dsrt__codec_extensions), and the shard writer names a member by it. The
 * codecs call down only, into the scratch the decoder lends them
 * (scratch.c), never into the decoder or the table.
 *
 * Here too: what the decoder keeps for the layers above it (scratch for a
 * file's bytes and for pixels), the pixel conversions it shares with the
 * in-memory sources (color.c), and the PNG encoder the writers use. The DC-term JPEG decoder has
 * its own header, jpeg_dc.h. Nothing here reads files: bytes come in memory.
 */
#ifndef DSRT_DATASTORE_CODECS_H
#define DSRT_DATASTORE_CODECS_H

#include <dsrt/datastore.h>

#include "core/internal.h"

// ----------------------------------------------------------------------------
// Scratch (scratch.c): what the decoder lends a codec

/* Makes *buf hold at least need bytes aligned to align (a power of two);
 * the old contents are not kept. NULL and a message when out of memory. */
uint8_t *dsrt__scratch(uint8_t **buf, size_t *cap, size_t need, size_t align);

/* Alignment of the pixel scratch buffers: cache lines. */
#define DSRT_PIXEL_ALIGN 64

/* A decoder's pixel buffers, grown on demand and kept between images: the
 * pixels a decode returns when the caller gives no destination, and
 * intermediate pixels (CMYK, RGB on its way to gray). */
typedef struct dsrt_codec_scratch {
    uint8_t *pixels; /* (pixels_cap) */
    size_t pixels_cap;
    uint8_t *work; /* (work_cap) */
    size_t work_cap;
} dsrt_codec_scratch;

/* The pixel buffer, at least need bytes; NULL and a message when out of
 * memory. */
uint8_t *dsrt__codec_pixels(dsrt_codec_scratch *sc, size_t need);
/* The intermediate buffer, the same way. */
uint8_t *dsrt__codec_work(dsrt_codec_scratch *sc, size_t need);
/* Where a decode of w x h x ch packed pixels goes: dst when the caller gave
 * one (failing with DSRT_ETOOBIG when cap is short), else the pixel
 * buffer. */
int dsrt__codec_target(dsrt_codec_scratch *sc, uint8_t *dst, size_t cap, int w, int h, int ch,
                       uint8_t **out);
void dsrt__codec_scratch_free(dsrt_codec_scratch *sc);

// ----------------------------------------------------------------------------
// The table

/* What sniff says of the first bytes of a buffer. */
enum {
    DSRT_SNIFF_NO = 0,
    DSRT_SNIFF_YES = 1,
    DSRT_SNIFF_SHORT = 2, /* too few bytes to tell, and those there are match */
};

/*
 * A codec. Its state (create; NULL create: none) belongs to one decoder,
 * so to one thread. An image is begun (its header read, kept open in the
 * state), then decoded by one of the decode calls, which the decoder
 * chooses: decode_region when the request has a region and the codec has
 * one, else decode_scaled when scale gives more than 1, else decode. Each
 * writes ch channels (1 or 3) into req->dst (req->dst_cap bytes) or, when
 * that is NULL, the decoder's pixel scratch (dsrt__codec_target does both;
 * sc is the decoder's scratch), and fails with a DSRT_E* code and a message starting "decode: ".
 * The decoder closes the image after any of them, and before another
 * begin; close must take an image already closed.
 */
typedef struct dsrt_codec_ops {
    dsrt_format format;     /* its name is the third field of DSRT_FORMATS */
    const char *what;       /* for messages: "JPEG" */
    const char *extensions; /* its share of the default extensions: "jpg,jpeg,jpe,jfif" */
    /* DSRT_SNIFF_YES when buf[0..len) starts as this format does (len > 0). */
    int (*sniff)(const uint8_t *buf, size_t len);
    int (*create)(void **state, const dsrt_decoder_options *o);
    void (*destroy)(void *state);
    /* Reads the header of buf[0..len) into info (format, size, channels,
     * depth), every field checked, no pixel memory taken; buf stays valid
     * until the image is closed. */
    int (*begin)(void *state, const uint8_t *buf, size_t len, dsrt_image_info *info);
    void (*close)(void *state);
    /* 1 when the open image stays gray for allow_gray (stored gray, 8 bits
     * at most: its RGB would replicate the same bytes); NULL: never. */
    int (*stays_gray)(const void *state);
    /* The whole open image at its stored size. */
    int (*decode)(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req, int ch,
                  dsrt_image *out);
    /* Scaled decode, where the format has one (both NULL: it has none):
     * the denominator (1, 2, 4 or 8) of the smallest scale whose size,
     * ceil(w / s) x ceil(h / s), is still at least min_w x min_h; the whole
     * image at scale s > 1. */
    int (*scale)(int w, int h, int min_w, int min_h);
    int (*decode_scaled)(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                         int ch, int s, dsrt_image *out);
    /* Region decode, where the format has one (NULL: the whole image is
     * decoded): a window of the image at scale s that holds the request's
     * region, its pixels inside the region a whole decode's; *win says
     * where it lies. */
    int (*decode_region)(void *state, dsrt_codec_scratch *sc, const dsrt_decode_request *req,
                         int ch, int s, dsrt_image *out, dsrt_window *win);
} dsrt_codec_ops;

/* The codecs, in DSRT_FORMATS order: count, and the k-th. */
size_t dsrt__codec_count(void);
const dsrt_codec_ops *dsrt__codec_at(size_t k);
/* The codec of format f, or NULL (RAW, UNKNOWN). */
const dsrt_codec_ops *dsrt__codec_ops(dsrt_format f);
/* The codec of the bytes in buf, or NULL; *short_ (may be NULL) is set to 1
 * when buf is too short to tell and matches the start of some format. */
const dsrt_codec_ops *dsrt__codec_sniff(const uint8_t *buf, size_t len, int *short_);
/* "JPEG, PNG or WebP": the formats, for messages, into out. */
void dsrt__codec_names(char *out, size_t cap);
/* The default extensions: calls each with every extension of every codec
 * (without the dot), in table order; stops at and returns the first
 * non-zero return. */
int dsrt__codec_extensions(int (*each)(void *ctx, const char *ext, size_t len), void *ctx);

// ----------------------------------------------------------------------------
// What the decoder keeps for the layers above

/* A buffer of at least need bytes owned by the decoder for holding a file's
 * bytes (grown on demand, kept between calls); NULL and a message on failure. */
uint8_t *dsrt__decoder_file_buffer(dsrt_decoder *d, size_t need);
/* The decoder's pixel scratch (the one dsrt_decode uses when req->dst is
 * NULL), at least need bytes. */
uint8_t *dsrt__decoder_pixel_buffer(dsrt_decoder *d, size_t need);

// ----------------------------------------------------------------------------
// Pixels and writing

/* rgb2gray with ITU-R BT.601 weights (as MATLAB's rgb2gray and Pillow's
 * convert("L")), rounded; and gray2rgb. Rows are packed. In place is not
 * allowed. */
void dsrt__rgb_to_gray(const uint8_t *rgb, uint8_t *gray, size_t pixels);
void dsrt__gray_to_rgb(const uint8_t *gray, uint8_t *rgb, size_t pixels);

/* Encodes img as a PNG in a new buffer (*png, freed with free); name is for
 * messages. */
int dsrt__png_encode(const dsrt_image *img, const char *name, void **png, size_t *size);

#endif
