/*
 * Test images made on the spot, in memory or on disk, so that no test needs
 * image files in the repository. Every function is static inline: include
 * this header in any test (it needs TurboJPEG, libspng and zlib, which every
 * test links) and use what you need. Every buffer returned is malloc'd and
 * freed by the caller with free(); functions returning int give 0 or -1.
 *
 * Pixels
 *   timg_pattern(px, w, h, ch, seed)     deterministic 8-bit HWC image: smooth
 *                                        gradients plus a little texture, like
 *                                        a photo (compresses like one)
 *   timg_noise(px, n, seed)              n deterministic bytes, no structure
 *
 * JPEG (TurboJPEG tjCompress2)
 *   timg_jpeg(px, w, h, pf, subsamp, quality, flags, &len)
 *                                        px in TurboJPEG pixel format pf
 *                                        (TJPF_GRAY, TJPF_RGB, TJPF_CMYK...);
 *                                        flags e.g. TJFLAG_PROGRESSIVE
 *   timg_make_jpeg(kind, w, h, seed, &len)
 *                                        one of enum timg_jpeg_kind: gray,
 *                                        RGB 4:4:4 / 4:2:2 / 4:2:0, progressive
 *                                        4:2:0, CMYK (an Adobe YCCK file whose
 *                                        decoded samples are the CMYK values
 *                                        given, approximately)
 *   timg_jpeg_set_size(buf, len, w, h)   rewrites the frame header's size
 *
 * PNG (libspng encoder)
 *   timg_png(px, w, h, color_type, bit_depth, interlace, plte, trns, &len)
 *                                        px in libspng's SPNG_FMT_PNG layout:
 *                                        rows packed, samples of less than 8
 *                                        bits packed most significant first,
 *                                        16-bit samples host-endian; plte and
 *                                        trns may be NULL
 *   timg_make_png(kind, w, h, seed, &len, expect)
 *                                        one of enum timg_png_kind (gray of 1,
 *                                        2, 4, 8, 16 bits, RGB 8/16, RGBA,
 *                                        gray+alpha, palettes with tRNS,
 *                                        Adam7-interlaced); expect (w*h*3
 *                                        bytes, or NULL) receives the RGB8
 *                                        pixels a decoder must give: low bit
 *                                        depths scaled to 0..255 (v * 255 /
 *                                        (2^depth - 1)), 16-bit samples' high
 *                                        byte, palette looked up, alpha dropped
 *   timg_png_set_size(buf, len, w, h)    rewrites IHDR's size and its CRC
 *
 * Files
 *   timg_write_file(path, buf, len)      writes (creating or replacing) a file
 *   timg_mkdirs(path)                    mkdir -p
 *   timg_tmpdir(name, out, cap)          a fresh folder for a test under
 *                                        $DSRT_TEST_TMP (or /tmp), emptied
 */
#ifndef DSRT_TEST_TESTIMG_H
#define DSRT_TEST_TESTIMG_H

#include <errno.h>
#include <spng.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

// ----------------------------------------------------------------------------
// Pixels

static inline uint32_t timg_hash(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* n bytes of deterministic noise. */
static inline void timg_noise(uint8_t *px, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        px[i] = (uint8_t)(timg_hash((uint32_t)i * 2654435761U ^ seed) >> 7);
}

/* A w x h x ch image: per-channel gradients in different directions, a few
 * soft disks, and +-8 of texture, so that JPEG has real work to do. */
static inline void timg_pattern(uint8_t *px, int w, int h, int ch, uint32_t seed) {
    int cx = (int)(timg_hash(seed) % (uint32_t)(w > 0 ? w : 1));
    int cy = (int)(timg_hash(seed + 1) % (uint32_t)(h > 0 ? h : 1));
    int r2 = (w * w + h * h) / 16 + 1;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            int dx = x - cx, dy = y - cy;
            int disk = dx * dx + dy * dy < r2 ? 60 : 0;
            for (int c = 0; c < ch; c++) {
                int v;
                switch (c % 4) {
                case 0:
                    v = w > 1 ? x * 255 / (w - 1) : 128;
                    break;
                case 1:
                    v = h > 1 ? y * 255 / (h - 1) : 128;
                    break;
                case 2:
                    v = (w + h > 2) ? (x + y) * 255 / (w + h - 2) : 128;
                    break;
                default:
                    v = 200 - (w > 1 ? x * 150 / (w - 1) : 0);
                    break;
                }
                v = (v + disk) % 256;
                v += (int)(timg_hash((uint32_t)((y * w + x) * ch + c) ^ seed) % 17) - 8;
                px[((size_t)y * w + x) * ch + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

// ----------------------------------------------------------------------------
// JPEG

/* Compresses px (w x h, TurboJPEG pixel format pf, rows packed) into a new
 * malloc'd JPEG. NULL on failure (the reason on stderr). */
static inline uint8_t *timg_jpeg(const uint8_t *px, int w, int h, int pf, int subsamp, int quality,
                                 int flags, size_t *len) {
    tjhandle tj = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    uint8_t *out = NULL;
    if (!tj) return NULL;
    if (tjCompress2(tj, px, w, 0, h, pf, &jpeg, &size, subsamp, quality, flags) != 0) {
        fprintf(stderr, "timg_jpeg: %s\n", tjGetErrorStr2(tj));
    } else if ((out = malloc(size))) {
        memcpy(out, jpeg, size);
        *len = size;
    }
    tjFree(jpeg);
    tjDestroy(tj);
    return out;
}

enum timg_jpeg_kind {
    TIMG_JPEG_GRAY,
    TIMG_JPEG_444,
    TIMG_JPEG_422,
    TIMG_JPEG_420,
    TIMG_JPEG_PROGRESSIVE, /* 4:2:0, progressive */
    TIMG_JPEG_CMYK,        /* YCCK with an Adobe marker, 4:2:0 */
    TIMG_JPEG_KINDS
};

static inline const char *timg_jpeg_kind_name(int kind) {
    static const char *const names[] = {"gray",   "rgb444",      "rgb422",
                                        "rgb420", "progressive", "cmyk"};
    return kind >= 0 && kind < TIMG_JPEG_KINDS ? names[kind] : "?";
}

/* A JPEG of one of the kinds above, quality 90, made from timg_pattern. */
static inline uint8_t *timg_make_jpeg(int kind, int w, int h, uint32_t seed, size_t *len) {
    static const int pfs[] = {TJPF_GRAY, TJPF_RGB, TJPF_RGB, TJPF_RGB, TJPF_RGB, TJPF_CMYK};
    static const int samps[] = {TJSAMP_GRAY, TJSAMP_444, TJSAMP_422,
                                TJSAMP_420,  TJSAMP_420, TJSAMP_420};
    if (kind < 0 || kind >= TIMG_JPEG_KINDS) return NULL;
    int ch = tjPixelSize[pfs[kind]];
    uint8_t *px = malloc((size_t)w * h * ch);
    if (!px) return NULL;
    timg_pattern(px, w, h, ch, seed);
    uint8_t *jpeg = timg_jpeg(px, w, h, pfs[kind], samps[kind], 90,
                              kind == TIMG_JPEG_PROGRESSIVE ? TJFLAG_PROGRESSIVE : 0, len);
    free(px);
    return jpeg;
}

/* Rewrites the width and height in the first frame header (SOFn); -1 when
 * there is none. */
static inline int timg_jpeg_set_size(uint8_t *buf, size_t len, int w, int h) {
    size_t pos = 2;
    while (pos + 4 <= len) {
        if (buf[pos] != 0xff) return -1;
        uint8_t m = buf[pos + 1];
        size_t seg = (size_t)buf[pos + 2] << 8 | buf[pos + 3];
        if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            if (pos + 9 > len) return -1;
            buf[pos + 5] = (uint8_t)(h >> 8);
            buf[pos + 6] = (uint8_t)h;
            buf[pos + 7] = (uint8_t)(w >> 8);
            buf[pos + 8] = (uint8_t)w;
            return 0;
        }
        if (m == 0xda) return -1;
        pos += 2 + seg;
    }
    return -1;
}

// ----------------------------------------------------------------------------
// PNG

/* Encodes px (SPNG_FMT_PNG layout) into a new malloc'd PNG; NULL on failure. */
static inline uint8_t *timg_png(const void *px, int w, int h, int color_type, int bit_depth,
                                int interlace, const struct spng_plte *plte,
                                const struct spng_trns *trns, size_t *len) {
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!ctx) return NULL;
    struct spng_ihdr ihdr = {(uint32_t)w, (uint32_t)h, (uint8_t)bit_depth, (uint8_t)color_type,
                             0,           0,           (uint8_t)interlace};
    int channels = color_type == 2 ? 3 : color_type == 4 ? 2 : color_type == 6 ? 4 : 1;
    size_t row = ((size_t)w * channels * bit_depth + 7) / 8;
    void *out = NULL;
    int err = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    if (!err) err = spng_set_ihdr(ctx, &ihdr);
    if (!err && plte) err = spng_set_plte(ctx, (struct spng_plte *)plte);
    if (!err && trns) err = spng_set_trns(ctx, (struct spng_trns *)trns);
    if (!err) err = spng_encode_image(ctx, px, row * h, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    if (!err) out = spng_get_png_buffer(ctx, len, &err);
    if (err) fprintf(stderr, "timg_png: %s\n", spng_strerror(err));
    spng_ctx_free(ctx);
    return out;
}

enum timg_png_kind {
    TIMG_PNG_GRAY1,
    TIMG_PNG_GRAY2,
    TIMG_PNG_GRAY4,
    TIMG_PNG_GRAY8,
    TIMG_PNG_GRAY16,
    TIMG_PNG_RGB8,
    TIMG_PNG_RGB16,
    TIMG_PNG_RGBA8,
    TIMG_PNG_RGBA16,
    TIMG_PNG_GA8,
    TIMG_PNG_GA16,
    TIMG_PNG_PALETTE8, /* 256 colours, with tRNS */
    TIMG_PNG_PALETTE2, /* 4 colours, 2-bit indices, with tRNS */
    TIMG_PNG_RGB8_INTERLACED,
    TIMG_PNG_GRAY4_INTERLACED,
    TIMG_PNG_KINDS
};

static inline const char *timg_png_kind_name(int kind) {
    static const char *const names[] = {
        "gray1", "gray2",    "gray4",    "gray8",           "gray16",
        "rgb8",  "rgb16",    "rgba8",    "rgba16",          "ga8",
        "ga16",  "palette8", "palette2", "rgb8-interlaced", "gray4-interlaced"};
    return kind >= 0 && kind < TIMG_PNG_KINDS ? names[kind] : "?";
}

/*
 * A w x h PNG of the given kind with noise content (every sample value
 * appears). expect, when not NULL, receives w*h*3 bytes: the RGB8 pixels a
 * decoder must produce (see the top of the file).
 */
static inline uint8_t *timg_make_png(int kind, int w, int h, uint32_t seed, size_t *len,
                                     uint8_t *expect) {
    static const uint8_t types[] = {0, 0, 0, 0, 0, 2, 2, 6, 6, 4, 4, 3, 3, 2, 0};
    static const uint8_t depths[] = {1, 2, 4, 8, 16, 8, 16, 8, 16, 8, 16, 8, 2, 8, 4};
    if (kind < 0 || kind >= TIMG_PNG_KINDS) return NULL;
    int type = types[kind], depth = depths[kind];
    int interlace = kind == TIMG_PNG_RGB8_INTERLACED || kind == TIMG_PNG_GRAY4_INTERLACED;
    int channels = type == 2 ? 3 : type == 4 ? 2 : type == 6 ? 4 : 1;
    int colour = type == 2 || type == 6; /* samples 0..2 are R, G, B */
    size_t row = ((size_t)w * channels * depth + 7) / 8;
    uint8_t *px = calloc(row * h + 1, 1);
    if (!px) return NULL;
    struct spng_plte plte;
    struct spng_trns trns;
    memset(&plte, 0, sizeof plte);
    memset(&trns, 0, sizeof trns);
    if (type == 3) {
        plte.n_entries = 1u << depth;
        for (uint32_t i = 0; i < plte.n_entries; i++) {
            uint32_t r = timg_hash(seed ^ (0x5000 + i));
            plte.entries[i].red = (uint8_t)r;
            plte.entries[i].green = (uint8_t)(r >> 8);
            plte.entries[i].blue = (uint8_t)(r >> 16);
            plte.entries[i].alpha = 255;
        }
        trns.n_type3_entries = plte.n_entries / 2;
        for (uint32_t i = 0; i < trns.n_type3_entries; i++) trns.type3_alpha[i] = (uint8_t)(i * 7);
    }
    uint32_t maxv = (1u << depth) - 1;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            uint8_t rgb[3] = {0, 0, 0};
            for (int c = 0; c < channels; c++) {
                uint32_t v =
                    timg_hash(seed ^ (uint32_t)(((y * w + x) * channels + c) * 31 + 7)) & maxv;
                if (depth == 16) {
                    uint16_t s = (uint16_t)v;
                    memcpy(px + (size_t)y * row + ((size_t)x * channels + c) * 2, &s, 2);
                } else if (depth == 8) {
                    px[(size_t)y * row + (size_t)x * channels + c] = (uint8_t)v;
                } else {
                    size_t bit = ((size_t)x * channels + c) * depth;
                    px[(size_t)y * row + bit / 8] |= (uint8_t)(v << (8 - depth - bit % 8));
                }
                uint8_t v8 = depth == 16 ? (uint8_t)(v >> 8) : (uint8_t)(v * 255 / maxv);
                if (type == 3) {
                    rgb[0] = plte.entries[v].red;
                    rgb[1] = plte.entries[v].green;
                    rgb[2] = plte.entries[v].blue;
                } else if (colour && c < 3) {
                    rgb[c] = v8;
                } else if (!colour && c == 0) {
                    rgb[0] = rgb[1] = rgb[2] = v8;
                }
            }
            if (expect) memcpy(expect + ((size_t)y * w + x) * 3, rgb, 3);
        }
    }
    uint8_t *png = timg_png(px, w, h, type, depth, interlace, type == 3 ? &plte : NULL,
                            type == 3 ? &trns : NULL, len);
    free(px);
    return png;
}

/* Rewrites IHDR's width and height (and its CRC); -1 when buf is no PNG. */
static inline int timg_png_set_size(uint8_t *buf, size_t len, uint32_t w, uint32_t h) {
    if (len < 33 || memcmp(buf + 12, "IHDR", 4) != 0) return -1;
    uint8_t *d = buf + 16;
    for (int i = 0; i < 4; i++) {
        d[i] = (uint8_t)(w >> (24 - 8 * i));
        d[4 + i] = (uint8_t)(h >> (24 - 8 * i));
    }
    uint32_t crc = (uint32_t)crc32(0, buf + 12, 17);
    for (int i = 0; i < 4; i++) buf[29 + i] = (uint8_t)(crc >> (24 - 8 * i));
    return 0;
}

// ----------------------------------------------------------------------------
// Files

static inline int timg_write_file(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "timg_write_file: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int ok = (len == 0 || fwrite(buf, 1, len, f) == len);
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "timg_write_file: %s: write failed\n", path);
    return ok ? 0 : -1;
}

static inline int timg_mkdirs(const char *path) {
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == '\0') {
            char c = tmp[i];
            tmp[i] = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    }
    return 0;
}

/* The folder /tmp/dsrt-test-<pid> a test run outside ctest made, removed
 * when the process that made it exits (not by its forked children). */
static long timg_tmp_owner;

static inline void timg_tmp_remove(void) {
    if ((long)getpid() != timg_tmp_owner) return;
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/dsrt-test-%ld", timg_tmp_owner);
    if (system(cmd) != 0) fprintf(stderr, "could not remove /tmp/dsrt-test-%ld\n", timg_tmp_owner);
}

/* A fresh, empty folder $DSRT_TEST_TMP/name (or /tmp/dsrt-test-<pid>/name,
 * removed at exit: ctest sets DSRT_TEST_TMP, whose folders stay). */
static inline int timg_tmpdir(const char *name, char *out, size_t cap) {
    const char *base = getenv("DSRT_TEST_TMP");
    int n = base && base[0] ? snprintf(out, cap, "%s/%s", base, name)
                            : snprintf(out, cap, "/tmp/dsrt-test-%ld/%s", (long)getpid(), name);
    if (n < 0 || (size_t)n >= cap) return -1;
    if (!(base && base[0]) && timg_tmp_owner != (long)getpid()) {
        timg_tmp_owner = (long)getpid();
        atexit(timg_tmp_remove);
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0) return -1;
    return timg_mkdirs(out);
}

#endif
