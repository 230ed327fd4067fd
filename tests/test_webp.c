/*
 * Tests of the WebP codec (datastore/codecs/webp.c) and of WebP files
 * through every source.
 *
 * Pixels: lossless files (made here with libwebp's encoder) decode to the
 * pixels encoded, alpha dropped; lossy ones to libwebp's own simple decode
 * (WebPDecodeRGB) byte for byte; and, through another door, Pillow
 * (tests/webp_ref.py, /usr/bin/python3) decodes files of every kind it
 * writes and those written here: its RGB must equal dsrt's byte for byte
 * (both are libwebp, called differently: Pillow through WebPAnimDecoder to
 * RGBA). Gray is rgb2gray of the RGB.
 *
 * Bad input: every cut of a file is DSRT_ETRUNCATED; damaged headers are
 * DSRT_ECORRUPT, damage anywhere a negative code with a message or a
 * success, never a crash; animations (made here chunk by chunk, and by
 * Pillow) are DSRT_EUNSUPPORTED; headers over max_pixels are DSRT_ETOOBIG
 * before any pixel memory is taken, and a RIFF size past the end of the
 * bytes is truncation at the header.
 *
 * Sources: a folder of lossless WebPs gives the checksum of the folder of
 * the same pixels as PNGs through dsbench (--checksum), and so do a manifest
 * of them, tar shards written from them (their members named .webp) and a
 * ZIP archive of them; animated, corrupt and truncated WebPs in a folder are
 * named and skipped (--bad-list), or stop the run with --fail-on-error.
 */
#include "core/internal.h"
#include "datastore/codecs/codecs.h"
#include "datastore/index/index.h"
#include "toolrun.h"

#include <webp/decode.h>
#include <webp/encode.h>

static dsrt_decode_request request(int channels) {
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = channels;
    return r;
}

/* A call that must fail with code and leave a message. */
#define CHECK_FAILS(call, code)                                                                    \
    do {                                                                                           \
        dsrt__clear_error();                                                                       \
        int rc__ = (call);                                                                         \
        CHECK_EQ(rc__, (code));                                                                    \
        CHECK(dsrt_last_error()[0] != '\0');                                                       \
    } while (0)

// ----------------------------------------------------------------------------
// Making WebPs

/* px (w x h, 3 or 4 channels) as a WebP in a malloc'd buffer: lossless, or
 * lossy at quality q. */
static uint8_t *webp_encode(const uint8_t *px, int w, int h, int ch, int lossless, float q,
                            size_t *len) {
    uint8_t *out = NULL;
    size_t n;
    if (lossless)
        n = ch == 4 ? WebPEncodeLosslessRGBA(px, w, h, w * 4, &out)
                    : WebPEncodeLosslessRGB(px, w, h, w * 3, &out);
    else
        n = ch == 4 ? WebPEncodeRGBA(px, w, h, w * 4, q, &out)
                    : WebPEncodeRGB(px, w, h, w * 3, q, &out);
    REQUIRE(n > 0 && out);
    uint8_t *copy = malloc(n);
    REQUIRE(copy);
    memcpy(copy, out, n);
    WebPFree(out);
    *len = n;
    return copy;
}

/* A photo-like w x h image of ch channels; alpha, where there is one, is
 * never 0 (the lossless encoder may change the colour of transparent
 * pixels). */
static uint8_t *picture(int w, int h, int ch, uint32_t seed) {
    uint8_t *px = malloc((size_t)w * h * ch);
    REQUIRE(px);
    timg_pattern(px, w, h, ch, seed);
    if (ch == 4)
        for (size_t i = 0; i < (size_t)w * h; i++) px[4 * i + 3] |= 1;
    return px;
}

/* The RGB of RGBA pixels. */
static void drop_alpha(const uint8_t *rgba, uint8_t *rgb, size_t pixels) {
    for (size_t i = 0; i < pixels; i++) memcpy(rgb + 3 * i, rgba + 4 * i, 3);
}

static void put_chunk(uint8_t *buf, size_t *at, const char *tag, const uint8_t *p, size_t n) {
    memcpy(buf + *at, tag, 4);
    buf[*at + 4] = (uint8_t)n;
    buf[*at + 5] = (uint8_t)(n >> 8);
    buf[*at + 6] = (uint8_t)(n >> 16);
    buf[*at + 7] = (uint8_t)(n >> 24);
    memcpy(buf + *at + 8, p, n);
    *at += 8 + n;
    if (n & 1) buf[(*at)++] = 0;
}

static void put24(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
}

/* An animated WebP of two w x h lossless frames, chunk by chunk: VP8X with
 * the animation flag, ANIM, two ANMF frames each holding a VP8L chunk. */
static uint8_t *animation(int w, int h, size_t *len) {
    size_t n0, n1;
    uint8_t *p0 = picture(w, h, 3, 1), *p1 = picture(w, h, 3, 2);
    uint8_t *f0 = webp_encode(p0, w, h, 3, 1, 0, &n0), *f1 = webp_encode(p1, w, h, 3, 1, 0, &n1);
    uint8_t *buf = calloc(1, n0 + n1 + 256);
    REQUIRE(buf);
    size_t at = 12;
    uint8_t vp8x[10] = {0x02};
    put24(vp8x + 4, (uint32_t)w - 1);
    put24(vp8x + 7, (uint32_t)h - 1);
    put_chunk(buf, &at, "VP8X", vp8x, sizeof vp8x);
    uint8_t anim[6] = {255, 255, 255, 255, 0, 0};
    put_chunk(buf, &at, "ANIM", anim, sizeof anim);
    const uint8_t *frames[2] = {f0, f1};
    size_t sizes[2] = {n0, n1};
    for (int k = 0; k < 2; k++) {
        /* The frame's data is the still file's VP8L chunk (after its RIFF header). */
        size_t fn = sizes[k] - 12;
        uint8_t *anmf = calloc(1, 16 + fn);
        REQUIRE(anmf);
        put24(anmf + 6, (uint32_t)w - 1);
        put24(anmf + 9, (uint32_t)h - 1);
        put24(anmf + 12, 100);
        memcpy(anmf + 16, frames[k] + 12, fn);
        put_chunk(buf, &at, "ANMF", anmf, 16 + fn);
        free(anmf);
    }
    memcpy(buf, "RIFF", 4);
    uint32_t riff = (uint32_t)(at - 8);
    buf[4] = (uint8_t)riff;
    buf[5] = (uint8_t)(riff >> 8);
    buf[6] = (uint8_t)(riff >> 16);
    buf[7] = (uint8_t)(riff >> 24);
    memcpy(buf + 8, "WEBP", 4);
    free(p0);
    free(p1);
    free(f0);
    free(f1);
    *len = at;
    return buf;
}

// ----------------------------------------------------------------------------
// The codec

static void test_detect(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    dsrt_image img;
    dsrt_decode_request r = request(3);
    CHECK_EQ(dsrt_detect_format("RIFF\x10\0\0\0WEBPVP8L", 16), DSRT_FORMAT_WEBP);
    CHECK_EQ(dsrt_detect_format("RIFF\x10\0\0\0WAVEfmt ", 16), DSRT_FORMAT_UNKNOWN);
    CHECK_EQ(dsrt_detect_format("RIFF\x10\0\0\0WEB", 11), DSRT_FORMAT_UNKNOWN);
    /* Cut inside the signature: truncated; another RIFF: not an image. */
    CHECK_FAILS(dsrt_decode(d, "RIFF", 4, &r, &img), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode(d, "RIFF\x10\0\0\0WE", 10, &r, &img), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode(d, "RIFF\x10\0\0\0WAVEfmt ", 16, &r, &img), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "not a JPEG, PNG or WebP image");
    /* The codec table: one codec a line of DSRT_FORMATS, each with a name
     * and extensions; WebP's are in the default list. */
    CHECK_EQ(dsrt__codec_count(), 3);
    CHECK(dsrt__codec_ops(DSRT_FORMAT_WEBP) != NULL);
    CHECK(dsrt__codec_ops(DSRT_FORMAT_RAW) == NULL);
    dsrt_extensions e;
    CHECK_OK(dsrt__extensions_parse(&e, NULL));
    char list[256];
    dsrt__extensions_text(&e, list, sizeof list);
    CHECK_STR_EQ(list, "jpg,jpeg,jpe,jfif,png,webp");
    CHECK(dsrt__extensions_match(&e, "a/b/x.WebP"));
    dsrt_decoder_destroy(d);
}

/* Lossless: the pixels encoded, alpha dropped; gray is rgb2gray; every
 * request decodes the whole image. */
static void test_lossless(void) {
    static const int sizes[][2] = {{1, 1}, {3, 2}, {64, 48}, {257, 129}};
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(sizes); k++)
        for (int ch = 3; ch <= 4; ch++) {
            int w = sizes[k][0], h = sizes[k][1];
            size_t px = (size_t)w * h, len;
            uint8_t *src = picture(w, h, ch, (uint32_t)(k * 7 + ch));
            uint8_t *webp = webp_encode(src, w, h, ch, 1, 0, &len);
            uint8_t *rgb = malloc(px * 3), *gray = malloc(px);
            REQUIRE(rgb && gray);
            if (ch == 4)
                drop_alpha(src, rgb, px);
            else
                memcpy(rgb, src, px * 3);
            dsrt__rgb_to_gray(rgb, gray, px);

            dsrt_image_info info;
            CHECK_OK(dsrt_decoder_info(d, webp, len, &info));
            CHECK_EQ(info.format, DSRT_FORMAT_WEBP);
            CHECK_EQ(info.width, w);
            CHECK_EQ(info.height, h);
            CHECK_EQ(info.channels, ch);
            CHECK_EQ(info.bit_depth, 8);
            CHECK_EQ(dsrt_detect_format(webp, len), DSRT_FORMAT_WEBP);

            dsrt_image img;
            dsrt_decode_request r = request(3);
            CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
            CHECK(img.width == w && img.height == h && img.channels == 3);
            CHECK(img.stride == (size_t)w * 3 && memcmp(img.data, rgb, px * 3) == 0);
            r = request(1);
            CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
            CHECK(img.channels == 1 && memcmp(img.data, gray, px) == 0);

            /* Into a destination of exactly its size; one byte less is refused. */
            uint8_t *dst = malloc(px * 3);
            REQUIRE(dst);
            r = request(3);
            r.dst = dst;
            r.dst_cap = px * 3;
            CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
            CHECK(img.data == dst && memcmp(dst, rgb, px * 3) == 0);
            r.dst_cap--;
            CHECK_FAILS(dsrt_decode(d, webp, len, &r, &img), DSRT_ETOOBIG);

            /* A minimum size, a region and allow_gray: still the whole RGB
             * image, its window the whole image. */
            r = request(3);
            r.min_width = r.min_height = 1;
            r.allow_gray = 1;
            r.region_x = w / 2;
            r.region_y = h / 2;
            r.region_width = r.region_height = 1;
            int dw, dh;
            dsrt_decode_size(&info, &r, &dw, &dh);
            CHECK(dw == w && dh == h);
            dsrt_window win;
            CHECK_OK(dsrt_decode_begin(d, webp, len, &info));
            CHECK_OK(dsrt_decode_finish(d, &r, &img, &win));
            CHECK(img.width == w && img.height == h && img.channels == 3);
            CHECK(win.x0 == 0 && win.y0 == 0 && win.decoded_width == w && win.decoded_height == h);
            CHECK(memcmp(img.data, rgb, px * 3) == 0);
            free(dst);
            free(src);
            free(webp);
            free(rgb);
            free(gray);
        }
    dsrt_decoder_destroy(d);
}

/* Lossy: libwebp's own decode (WebPDecodeRGB), byte for byte. */
static void test_lossy(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    static const float qualities[] = {5, 50, 90, 100};
    for (int ch = 3; ch <= 4; ch++)
        for (size_t q = 0; q < DSRT_ARRAY_SIZE(qualities); q++) {
            int w = 131 + (int)q, h = 77 + ch;
            size_t len;
            uint8_t *src = picture(w, h, ch, (uint32_t)(q + 10 * ch));
            uint8_t *webp = webp_encode(src, w, h, ch, 0, qualities[q], &len);
            int rw, rh;
            uint8_t *ref = WebPDecodeRGB(webp, len, &rw, &rh);
            REQUIRE(ref && rw == w && rh == h);
            dsrt_image img;
            dsrt_decode_request r = request(3);
            CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
            CHECK(img.width == w && img.height == h);
            CHECK(memcmp(img.data, ref, (size_t)w * h * 3) == 0);
            WebPFree(ref);
            free(src);
            free(webp);
        }
    dsrt_decoder_destroy(d);
}

/* Every cut is truncation, through info or decode; the decoder goes on. */
static void test_truncated(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int lossless = 0; lossless <= 1; lossless++) {
        size_t len;
        uint8_t *src = picture(40, 30, 4, 5);
        uint8_t *webp = webp_encode(src, 40, 30, 4, lossless, 80, &len);
        dsrt_decode_request r = request(3);
        dsrt_image img;
        int bad = 0;
        for (size_t cut = 1; cut < len; cut++) {
            dsrt__clear_error();
            int rc = dsrt_decode(d, webp, cut, &r, &img);
            if (rc != DSRT_ETRUNCATED || !dsrt_last_error()[0]) {
                if (bad++ < 5)
                    fprintf(stderr, "%s cut at %zu of %zu: %d (%s)\n",
                            lossless ? "lossless" : "lossy", cut, len, rc, dsrt_last_error());
            }
        }
        CHECK_EQ(bad, 0);
        /* The header says more bytes than there are: truncated at the header. */
        dsrt_image_info info;
        CHECK_FAILS(dsrt_decoder_info(d, webp, len - 1, &info), DSRT_ETRUNCATED);
        CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
        free(src);
        free(webp);
    }
    dsrt_decoder_destroy(d);
}

/* Damaged headers are corrupt; damage anywhere never crashes and leaves a
 * message with every failure. */
static void test_corrupt(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    dsrt_decode_request r = request(3);
    dsrt_image img;
    for (int lossless = 0; lossless <= 1; lossless++) {
        size_t len;
        uint8_t *src = picture(48, 40, 3, 9);
        uint8_t *webp = webp_encode(src, 48, 40, 3, lossless, 75, &len);
        uint8_t *bad = malloc(len);
        REQUIRE(bad);
        /* The bitstream's signature: VP8L's 0x2f, VP8's start code 9d 01 2a. */
        memcpy(bad, webp, len);
        if (lossless) {
            CHECK_EQ(bad[20], 0x2f);
            bad[20] = 0x2e;
        } else {
            CHECK_EQ(bad[23], 0x9d);
            bad[23] = 0x9c;
        }
        CHECK_FAILS(dsrt_decode(d, bad, len, &r, &img), DSRT_ECORRUPT);
        CHECK_CONTAINS(dsrt_last_error(), "WebP");
        for (size_t at = 12; at < len; at++)
            for (int bit = 0; bit < 8; bit += 3) {
                memcpy(bad, webp, len);
                bad[at] ^= (uint8_t)(1u << bit);
                dsrt__clear_error();
                int rc = dsrt_decode(d, bad, len, &r, &img);
                CHECK_LE(rc, 0);
                if (rc != 0) CHECK(dsrt_last_error()[0] != '\0');
            }
        CHECK_OK(dsrt_decode(d, webp, len, &r, &img));
        CHECK(memcmp(img.data, src, lossless ? (size_t)48 * 40 * 3 : 0) == 0);
        free(bad);
        free(src);
        free(webp);
    }
    dsrt_decoder_destroy(d);
}

/* Animations are refused, naming what they are, and so are their cuts. */
static void test_animated(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t len;
    uint8_t *anim = animation(24, 16, &len);
    int w, h;
    CHECK(WebPGetInfo(anim, len, &w, &h) && w == 24 && h == 16); /* libwebp reads it */
    dsrt_image_info info;
    dsrt_image img;
    dsrt_decode_request r = request(3);
    CHECK_EQ(dsrt_detect_format(anim, len), DSRT_FORMAT_WEBP);
    CHECK_FAILS(dsrt_decoder_info(d, anim, len, &info), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "animation");
    CHECK_FAILS(dsrt_decode(d, anim, len, &r, &img), DSRT_EUNSUPPORTED);
    for (size_t cut = 1; cut < len; cut += 7) {
        dsrt__clear_error();
        int rc = dsrt_decode(d, anim, cut, &r, &img);
        CHECK_LT(rc, 0);
        CHECK(dsrt_last_error()[0] != '\0');
    }
    free(anim);
    dsrt_decoder_destroy(d);
}

/* Sizes over max_pixels are refused at the header, a lying one too. */
static void test_limits(void) {
    size_t len;
    uint8_t *src = picture(64, 48, 3, 3);
    uint8_t *webp = webp_encode(src, 64, 48, 3, 1, 0, &len);
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.max_pixels = 64 * 48 - 1;
    dsrt_decoder *small, *d;
    REQUIRE(dsrt_decoder_create(&small, &o) == 0);
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    dsrt_image_info info;
    dsrt_image img;
    dsrt_decode_request r = request(3);
    CHECK_FAILS(dsrt_decoder_info(small, webp, len, &info), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "64x48 is 3072 pixels");
    CHECK_FAILS(dsrt_decode(small, webp, len, &r, &img), DSRT_ETOOBIG);
    /* VP8L's header: 14 bits of width - 1, 14 of height - 1, after 0x2f.
     * 16383 x 16383 is over the default limit; 9000 x 9000 is under it, and
     * what follows cannot be that image. */
    uint8_t *lie = malloc(len);
    REQUIRE(lie);
    static const uint32_t sides[][2] = {{16384, 16384}, {9000, 9000}};
    for (size_t k = 0; k < 2; k++) {
        memcpy(lie, webp, len);
        uint32_t bits = (uint32_t)lie[21] | (uint32_t)lie[22] << 8 | (uint32_t)lie[23] << 16 |
                        (uint32_t)lie[24] << 24;
        bits = (bits & ~0x0fffffffu) | (sides[k][0] - 1) | (sides[k][1] - 1) << 14;
        for (int b = 0; b < 4; b++) lie[21 + b] = (uint8_t)(bits >> (8 * b));
        dsrt__clear_error();
        int rc = dsrt_decode(d, lie, len, &r, &img);
        if (k == 0) {
            CHECK_EQ(rc, DSRT_ETOOBIG);
            CHECK_CONTAINS(dsrt_last_error(), "16384x16384");
        } else {
            CHECK_LT(rc, 0);
            CHECK(rc != -ENOMEM);
        }
    }
    /* A RIFF size past the end of the bytes. */
    memcpy(lie, webp, len);
    uint32_t riff = (uint32_t)len - 8 + 4096;
    for (int b = 0; b < 4; b++) lie[4 + b] = (uint8_t)(riff >> (8 * b));
    CHECK_FAILS(dsrt_decoder_info(d, lie, len, &info), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "RIFF");
    free(lie);
    free(src);
    free(webp);
    dsrt_decoder_destroy(small);
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// Pillow, through another door

static char script[4096];

static int python(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' %s", script, args);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Every NAME.webp of dir against Pillow's NAME.rgb; returns how many. */
static int compare_dir(dsrt_decoder *d, const char *dir) {
    DIR *dp = opendir(dir);
    REQUIRE(dp);
    int n = 0;
    for (struct dirent *e; (e = readdir(dp));) {
        size_t nl = strlen(e->d_name);
        if (nl < 6 || strcmp(e->d_name + nl - 5, ".webp") != 0) continue;
        if (strcmp(e->d_name, "anim.webp") == 0) continue;
        char path[8192], ref[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(ref, sizeof ref, "%s/%.*s.rgb", dir, (int)(nl - 5), e->d_name);
        size_t len, rlen;
        uint8_t *webp = NULL, *rgb = NULL;
        REQUIRE(dsrt__read_whole_file(path, (size_t)64 << 20, &webp, &len) == 0);
        REQUIRE(dsrt__read_whole_file(ref, (size_t)64 << 20, &rgb, &rlen) == 0);
        dsrt_image img;
        dsrt_decode_request r = request(3);
        int rc = dsrt_decode(d, webp, len, &r, &img);
        if (rc != 0 || (size_t)img.width * img.height * 3 != rlen ||
            memcmp(img.data, rgb, rlen) != 0) {
            fprintf(stderr, "%s: dsrt (%d: %s) and Pillow differ\n", path, rc,
                    rc ? dsrt_last_error() : "ok");
            test_failures++;
        }
        n++;
        free(webp);
        free(rgb);
    }
    closedir(dp);
    return n;
}

static void test_pillow(void) {
    const char *src = getenv("DSRT_SOURCE_DIR");
    snprintf(script, sizeof script, "%s/tests/webp_ref.py", src && *src ? src : ".");
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'from PIL import features; "
               "assert features.check(\"webp\")' 2>/dev/null") != 0) {
        fprintf(stderr, "/usr/bin/python3 with Pillow's WebP not found: case skipped\n");
        return;
    }
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    /* Pillow's files: every kind it writes. */
    char dir[4300], args[9000];
    snprintf(dir, sizeof dir, "%s/pillow", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    snprintf(args, sizeof args, "make '%s'", dir);
    REQUIRE(python(args) == 0);
    snprintf(args, sizeof args, "decode '%s'", dir);
    REQUIRE(python(args) == 0);
    CHECK_GE(compare_dir(d, dir), 77);
    /* Its animation is refused. */
    char anim[8192];
    snprintf(anim, sizeof anim, "%s/anim.webp", dir);
    size_t len;
    uint8_t *buf;
    REQUIRE(dsrt__read_whole_file(anim, (size_t)1 << 20, &buf, &len) == 0);
    dsrt_image_info info;
    CHECK_FAILS(dsrt_decoder_info(d, buf, len, &info), DSRT_EUNSUPPORTED);
    free(buf);

    /* Files made here, decoded by Pillow. */
    snprintf(dir, sizeof dir, "%s/ours", root);
    REQUIRE(timg_mkdirs(dir) == 0);
    int made = 0;
    for (int ch = 3; ch <= 4; ch++)
        for (int q = 0; q <= 100; q += 25) {
            int w = 50 + q / 5, h = 33 + ch;
            uint8_t *px = picture(w, h, ch, (uint32_t)(q + ch));
            uint8_t *webp = webp_encode(px, w, h, ch, q == 100, (float)q, &len);
            char path[8192];
            snprintf(path, sizeof path, "%s/%s-%d-q%d.webp", dir, q == 100 ? "lossless" : "lossy",
                     ch, q);
            REQUIRE(timg_write_file(path, webp, len) == 0);
            made++;
            free(px);
            free(webp);
        }
    snprintf(args, sizeof args, "decode '%s'", dir);
    REQUIRE(python(args) == 0);
    CHECK_EQ(compare_dir(d, dir), made);
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// Sources, through dsbench

enum { CLASSES = 3, PER = 6, W = 40, H = 30 };
static const char *const NAMES[CLASSES] = {"ant", "bee", "cat"};

/* root/png and root/webp: the same pixels as PNG and lossless WebP, and a
 * manifest of each (root/png.csv, root/webp.csv). */
static void make_sets(void) {
    char csv_png[4400], csv_webp[4400];
    snprintf(csv_png, sizeof csv_png, "%s/png.csv", root);
    snprintf(csv_webp, sizeof csv_webp, "%s/webp.csv", root);
    FILE *fp = fopen(csv_png, "w"), *fw = fopen(csv_webp, "w");
    REQUIRE(fp && fw);
    for (int k = 0; k < CLASSES; k++)
        for (int i = 0; i < PER; i++) {
            uint8_t *px = picture(W + i, H + k, 3, (uint32_t)(k * 100 + i));
            char path[4600];
            snprintf(path, sizeof path, "%s/png/%s", root, NAMES[k]);
            REQUIRE(timg_mkdirs(path) == 0);
            snprintf(path, sizeof path, "%s/png/%s/%02d.png", root, NAMES[k], i);
            dsrt_image img = {px, W + i, H + k, 3, (size_t)(W + i) * 3};
            REQUIRE(dsrt_png_write(path, &img) == 0);
            fprintf(fp, "%s,%s\n", path, NAMES[k]);
            snprintf(path, sizeof path, "%s/webp/%s", root, NAMES[k]);
            REQUIRE(timg_mkdirs(path) == 0);
            snprintf(path, sizeof path, "%s/webp/%s/%02d.webp", root, NAMES[k], i);
            size_t len;
            uint8_t *webp = webp_encode(px, W + i, H + k, 3, 1, 0, &len);
            REQUIRE(timg_write_file(path, webp, len) == 0);
            fprintf(fw, "%s,%s\n", path, NAMES[k]);
            free(webp);
            free(px);
        }
    fclose(fp);
    fclose(fw);
}

/* The checksum dsbench gives data, into sum ("" when the run failed); the
 * exact order (the folder's batches) where a source has a shard order. */
static void checksum(const char *data, const char *pipeline, char *sum, size_t cap) {
    result r =
        run(ARGV(bin_bench, (char *)data, "--pipeline", (char *)pipeline, "--epochs", "2",
                 "--threads", "2", "--batch", "5", "--checksum", "--json", "--order", "exact"),
            120);
    sum[0] = '\0';
    const char *c = strstr(r.out, "\"checksum\":\"");
    if (r.status == 0 && c)
        snprintf(sum, cap, "%.16s", c + strlen("\"checksum\":\""));
    else
        fprintf(stderr, "dsbench %s: status %d: %s\n", data, r.status, r.err);
    CHECK_EQ(json_int(r.out, "bad_files_total"), 0);
    result_free(&r);
}

static void test_sources(void) {
    make_sets();
    char png[4400], webp[4400], csv_png[4400], csv_webp[4400], shards[4400], zip[4400];
    snprintf(png, sizeof png, "%s/png", root);
    snprintf(webp, sizeof webp, "%s/webp", root);
    snprintf(csv_png, sizeof csv_png, "%s/png.csv", root);
    snprintf(csv_webp, sizeof csv_webp, "%s/webp.csv", root);
    snprintf(shards, sizeof shards, "%s/shards", root);
    snprintf(zip, sizeof zip, "%s/webp.zip", root);

    /* Tar shards written from the WebP folder keep the files, named .webp. */
    result r = run(ARGV(bin_bench, "convert", webp, shards, "--shards", "64K"), 120);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    char tar[4600];
    snprintf(tar, sizeof tar, "%s/shard-000000.tar", shards);
    size_t tl;
    uint8_t *t = NULL;
    REQUIRE(dsrt__read_whole_file(tar, (size_t)64 << 20, &t, &tl) == 0);
    CHECK(memmem(t, tl, ".webp", 5) != NULL && memmem(t, tl, ".jpg", 4) == NULL);
    free(t);
    /* A ZIP archive of it, made by Python's zipfile (stored members). */
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && python3 -c 'import zipfile, os\n"
             "with zipfile.ZipFile(\"%s\", \"w\") as z:\n"
             "    for d, _, fs in sorted(os.walk(\".\")):\n"
             "        for f in sorted(fs): z.write(os.path.join(d, f))'",
             webp, zip);
    int have_zip = system(cmd) == 0;
    if (!have_zip) fprintf(stderr, "python3 zipfile not found: the ZIP case is skipped\n");

    static const char *const pipelines[] = {"32", "imagenet"};
    for (size_t p = 0; p < DSRT_ARRAY_SIZE(pipelines); p++) {
        char ref[32], sum[32];
        checksum(png, pipelines[p], ref, sizeof ref);
        CHECK(ref[0] != '\0');
        checksum(webp, pipelines[p], sum, sizeof sum);
        CHECK_STR_EQ(sum, ref);
        char man[32];
        checksum(csv_png, pipelines[p], man, sizeof man);
        checksum(csv_webp, pipelines[p], sum, sizeof sum);
        CHECK_STR_EQ(sum, man);
        checksum(shards, pipelines[p], sum, sizeof sum);
        CHECK_STR_EQ(sum, ref);
        if (have_zip) {
            checksum(zip, pipelines[p], sum, sizeof sum);
            CHECK_STR_EQ(sum, ref);
        }
    }
}

/* Animated, corrupt and truncated WebPs: named and skipped, or the end of
 * a run that asks to fail on them. */
static void test_bad_files(void) {
    char dir[4400], list[4400];
    snprintf(dir, sizeof dir, "%s/bad", root);
    snprintf(list, sizeof list, "%s/bad.jsonl", root);
    for (int k = 0; k < 2; k++) {
        char sub[4600];
        snprintf(sub, sizeof sub, "%s/%s", dir, NAMES[k]);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < 4; i++) {
            uint8_t *px = picture(W, H, 3, (uint32_t)(k * 10 + i));
            size_t len;
            uint8_t *webp = webp_encode(px, W, H, 3, i & 1, 80, &len);
            char path[4800];
            snprintf(path, sizeof path, "%s/%d.webp", sub, i);
            REQUIRE(timg_write_file(path, webp, len) == 0);
            free(px);
            free(webp);
        }
    }
    size_t len;
    uint8_t *anim = animation(W, H, &len);
    char path[4800];
    snprintf(path, sizeof path, "%s/%s/anim.webp", dir, NAMES[0]);
    REQUIRE(timg_write_file(path, anim, len) == 0);
    free(anim);
    uint8_t *px = picture(W, H, 3, 77);
    uint8_t *webp = webp_encode(px, W, H, 3, 0, 80, &len);
    snprintf(path, sizeof path, "%s/%s/short.webp", dir, NAMES[1]);
    REQUIRE(timg_write_file(path, webp, len / 2) == 0);
    webp[23] ^= 0xff; /* VP8's start code */
    snprintf(path, sizeof path, "%s/%s/broken.webp", dir, NAMES[1]);
    REQUIRE(timg_write_file(path, webp, len) == 0);
    free(px);
    free(webp);

    result r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "1", "--batch", "4",
                        "--json", "--bad-list", list),
                   120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "bad_files_total"), 3);
    char *bad = slurp(list);
    CHECK_EQ(count_lines(list), 3);
    CHECK_CONTAINS(bad, "anim.webp");
    CHECK_CONTAINS(bad, "animation");
    CHECK_CONTAINS(bad, "short.webp");
    CHECK_CONTAINS(bad, "truncated");
    CHECK_CONTAINS(bad, "broken.webp");
    CHECK_CONTAINS(bad, "corrupt");
    free(bad);
    result_free(&r);

    r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "1", "--batch", "4",
                 "--fail-on-error"),
            120);
    CHECK_NE(r.status, 0);
    CHECK(strstr(r.err, "anim.webp") || strstr(r.err, "short.webp") ||
          strstr(r.err, "broken.webp"));
    result_free(&r);
}

int main(void) {
    /* The tools' cases need the tools; the codec's run without them. */
    int tools = toolrun_init("webp") == 0;
    if (!tools) REQUIRE(timg_tmpdir("webp", root, sizeof root) == 0);
    RUN(test_detect);
    RUN(test_lossless);
    RUN(test_lossy);
    RUN(test_truncated);
    RUN(test_corrupt);
    RUN(test_animated);
    RUN(test_limits);
    RUN(test_pillow);
    if (tools) {
        RUN(test_sources);
        RUN(test_bad_files);
    }
    return TEST_RESULT();
}
