/*
 * The codecs' internal side: what the decoder (decode.c) keeps for the
 * layers above it (scratch buffers for a file's bytes and for pixels), the
 * pixel conversions it shares with the in-memory sources (color.c), and the
 * PNG encoder the writers use. The DC-term JPEG decoder has its own header,
 * jpeg_dc.h. Nothing here reads files: bytes come in memory.
 */
#ifndef DSRT_DATASTORE_CODECS_H
#define DSRT_DATASTORE_CODECS_H

#include <dsrt/datastore.h>

#include "core/internal.h"

/* rgb2gray with ITU-R BT.601 weights (as MATLAB's rgb2gray and Pillow's
 * convert("L")), rounded; and gray2rgb. Rows are packed. In place is not
 * allowed. */
void dsrt__rgb_to_gray(const uint8_t *rgb, uint8_t *gray, size_t pixels);
void dsrt__gray_to_rgb(const uint8_t *gray, uint8_t *rgb, size_t pixels);

/* A buffer of at least need bytes owned by the decoder for holding a file's
 * bytes (grown on demand, kept between calls); NULL and a message on failure. */
uint8_t *dsrt__decoder_file_buffer(dsrt_decoder *d, size_t need);
/* The decoder's pixel scratch (the one dsrt_decode uses when req->dst is
 * NULL), at least need bytes. */
uint8_t *dsrt__decoder_pixel_buffer(dsrt_decoder *d, size_t need);

/* Encodes img as a PNG in a new buffer (*png, freed with free); name is for
 * messages. */
int dsrt__png_encode(const dsrt_image *img, const char *name, void **png, size_t *size);

#endif
