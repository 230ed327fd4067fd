/*
 * JPEGs at 1/8 scale from their DC terms alone.
 *
 * At 1/8 scale every 8x8 block becomes one pixel, and libjpeg's 1x1 inverse
 * DCT of a block is its DC term: dequantised, divided by 8, level shifted.
 * The AC terms only have to be stepped over, which is most of a decoder's
 * work (the entropy decoding). This decoder does only that: it walks the
 * markers, steps over the AC terms of baseline scans with one table look-up
 * a term, never reads the AC scans of progressive files, and converts the DC
 * planes to pixels. What it gives:
 * - luma (gray output, and the Y of every colour image) equal to libjpeg's
 *   1/8 decode, bit for bit;
 * - RGB equal to libjpeg's where the chroma is not subsampled (4:4:4);
 * - where it is (4:2:0, 4:2:2), each chroma block's mean repeated over the
 *   pixels it covers, where libjpeg runs a 2x2 inverse DCT or upsamples.
 *
 * It takes only what it can do exactly as described: 8-bit Huffman-coded
 * baseline, extended or progressive JPEGs, gray or YCbCr, integer sampling
 * ratios where libjpeg's 1/8 luma is the DC term's (not where it scales the
 * luma's inverse DCT up because the chroma is sampled more), interleaved
 * scans of at most 10 blocks an MCU (libjpeg refuses more), every Huffman
 * table a scan names defined in the file (a fresh libjpeg fills some with
 * standard tables, refuses others), markers where the standard puts them,
 * every restart marker in its place, the entropy-coded data ending where
 * its last block ends and an end-of-image marker after the last scan.
 * Anything else (arithmetic coding, Adobe RGB or CMYK, junk between markers,
 * a Huffman table libjpeg refuses, a bad Huffman code, data cut short) is
 * left to libjpeg, which decides what it is; nothing this decoder sees
 * makes an image bad by itself.
 */
#ifndef DSRT_DATASTORE_JPEG_DC_H
#define DSRT_DATASTORE_JPEG_DC_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsrt_jpeg_dc dsrt_jpeg_dc;

/* Scratch memory and tables, kept between images; for one thread. NULL when
 * out of memory. */
dsrt_jpeg_dc *dsrt__jpeg_dc_create(void);
void dsrt__jpeg_dc_destroy(dsrt_jpeg_dc *s);

/*
 * Decodes the JPEG in buf (width x height, as its header says) at 1/8 scale:
 * ceil(width / 8) x ceil(height / 8) pixels of ch channels (1: luma; 3: RGB,
 * a gray image replicated), rows packed, into dst. Returns 0, 1 when the
 * image is one to leave to libjpeg (dst is then undefined), or -ENOMEM.
 */
int dsrt__jpeg_dc_decode(dsrt_jpeg_dc *s, const uint8_t *buf, size_t len, int width, int height,
                         int ch, uint8_t *dst);

#endif
