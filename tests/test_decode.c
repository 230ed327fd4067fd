/*
 * Tests of the decoder (datastore/codecs/decode.c) and the gray/RGB conversions
 * (datastore/codecs/color.c).
 *
 * JPEG results are checked byte for byte against libjpeg-turbo's own decode
 * of the same bytes (tjDecompress2 called here directly) for every kind of
 * JPEG the test images cover and at every DCT scale; PNG results against the
 * pixels that were encoded. Bad input (empty, not an image, truncated at
 * every byte, corrupted, decompression bombs, destinations too small) must
 * give a negative code and a message, never a crash, and must leave the
 * decoder usable. Region decodes must give a whole decode's pixels inside the
 * region, for every kind of JPEG, scale and many regions, and must still see
 * what follows the rows they need (truncation, a second scan, warnings of a
 * strict decoder).
 *
 * The 16-bit PNG rule, checked here on values where it matters: libspng's
 * SPNG_FMT_RGB8 keeps the high byte of each sample (0x30FF -> 0x30), it
 * does not round (which would give 0x31).
 *
 * With DSRT_WRITE_CORPUS=dir set, every image made here (good and bad) is
 * also written into dir, as a seed corpus for tests/fuzz/fuzz_decode.c.
 */
#include "core/internal.h"
#include "datastore/codecs/codecs.h"
#include "datastore/index/index.h"
#include "jpegkit.h"
#include "task.h"
#include "testimg.h"

#include <dlfcn.h>
#include <jpeglib.h>
#include <malloc.h>

static const char *corpus_dir;
static int corpus_count;

/* Saves buf as a corpus file when DSRT_WRITE_CORPUS is set. */
static void corpus(const char *what, const void *buf, size_t len) {
    if (!corpus_dir || len == 0 || len > 64 * 1024) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%04d-%s", corpus_dir, corpus_count++, what);
    timg_write_file(path, buf, len);
}

/* libjpeg-turbo's own decode of jpeg at w x h in pixel format pf. */
static uint8_t *tj_reference(const uint8_t *jpeg, size_t len, int w, int h, int pf) {
    tjhandle tj = tjInitDecompress();
    REQUIRE(tj);
    uint8_t *px = malloc((size_t)w * h * tjPixelSize[pf]);
    REQUIRE(px);
    int rc = tjDecompress2(tj, jpeg, (unsigned long)len, px, w, 0, h, pf, 0);
    if (rc != 0) fprintf(stderr, "tjDecompress2: %s\n", tjGetErrorStr2(tj));
    REQUIRE(rc == 0);
    tjDestroy(tj);
    return px;
}

/* The plain reference of rgb2gray: BT.601 in double, rounded. Differs from
 * the fixed-point result by at most 1. */
static int gray_double(int r, int g, int b) {
    return (int)floor(0.299 * r + 0.587 * g + 0.114 * b + 0.5);
}

/* The fixed-point rule written out in 64-bit arithmetic with a division. */
static uint8_t gray_exact(int r, int g, int b) {
    return (uint8_t)(((uint64_t)19595 * r + (uint64_t)38470 * g + (uint64_t)7471 * b + 32768) /
                     65536);
}

static void rgb_to_gray_ref(const uint8_t *rgb, uint8_t *gray, size_t n) {
    for (size_t i = 0; i < n; i++) gray[i] = gray_exact(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]);
}

/* Index of the first differing byte, or -1. */
static long first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long)i;
    return -1;
}

/* Offset of the first marker FF code in jpeg after its first two bytes, or
 * 0 when there is none. */
static size_t find_marker(const uint8_t *jpeg, size_t len, uint8_t code) {
    for (size_t i = 2; i + 1 < len; i++)
        if (jpeg[i] == 0xff && jpeg[i + 1] == code) return i;
    return 0;
}

/* A call that must fail with code (or any negative code when code is 0) and
 * leave a message. */
#define CHECK_FAILS(call, code)                                                                    \
    do {                                                                                           \
        dsrt__clear_error();                                                                       \
        int rc__ = (call);                                                                         \
        if ((code) != 0)                                                                           \
            CHECK_EQ(rc__, (code));                                                                \
        else                                                                                       \
            CHECK_LT(rc__, 0);                                                                     \
        CHECK(dsrt_last_error()[0] != '\0');                                                       \
    } while (0)

static dsrt_decode_request request(int channels, int min_w, int min_h) {
    dsrt_decode_request r;
    memset(&r, 0, sizeof r);
    r.channels = channels;
    r.min_width = min_w;
    r.min_height = min_h;
    return r;
}

// ----------------------------------------------------------------------------
// Conversions

static void test_color(void) {
    /* Every gray level survives gray -> rgb -> gray. */
    uint8_t g[256], rgb[768], back[256];
    for (int i = 0; i < 256; i++) g[i] = (uint8_t)i;
    dsrt__gray_to_rgb(g, rgb, 256);
    for (int i = 0; i < 256; i++) {
        CHECK_EQ(rgb[3 * i], i);
        CHECK_EQ(rgb[3 * i + 1], i);
        CHECK_EQ(rgb[3 * i + 2], i);
    }
    dsrt__rgb_to_gray(rgb, back, 256);
    CHECK_EQ(first_diff(g, back, 256), -1);

    /* Every length up to 100 (vector bodies and tails), then a large buffer,
     * against the fixed-point rule written plainly and against BT.601 in
     * double (within 1). */
    size_t big = 100003;
    uint8_t *src = malloc(big * 3), *out = malloc(big + 1), *ref = malloc(big),
            *o3 = malloc(big * 3);
    REQUIRE(src && out && ref && o3);
    timg_noise(src, big * 3, 42);
    for (size_t n = 0; n <= 100; n++) {
        out[n] = 0xAB;
        dsrt__rgb_to_gray(src, out, n);
        rgb_to_gray_ref(src, ref, n);
        CHECK_EQ(first_diff(out, ref, n), -1);
        CHECK_EQ(out[n], 0xAB); /* nothing written past the end */
    }
    dsrt__rgb_to_gray(src, out, big);
    rgb_to_gray_ref(src, ref, big);
    CHECK_EQ(first_diff(out, ref, big), -1);
    int worst = 0;
    for (size_t i = 0; i < big; i++) {
        int d = abs(out[i] - gray_double(src[3 * i], src[3 * i + 1], src[3 * i + 2]));
        if (d > worst) worst = d;
    }
    CHECK_LE(worst, 1);
    dsrt__gray_to_rgb(src, o3, big);
    for (size_t i = 0; i < big; i++)
        if (o3[3 * i] != src[i] || o3[3 * i + 1] != src[i] || o3[3 * i + 2] != src[i]) {
            CHECK(0 && "gray_to_rgb");
            break;
        }
    /* Pure primaries. */
    uint8_t prim[9] = {255, 0, 0, 0, 255, 0, 0, 0, 255}, pg[3];
    dsrt__rgb_to_gray(prim, pg, 3);
    CHECK_EQ(pg[0], 76);
    CHECK_EQ(pg[1], 150);
    CHECK_EQ(pg[2], 29);
    free(src);
    free(out);
    free(ref);
    free(o3);
}

// ----------------------------------------------------------------------------
// Formats, options, sizes

static void test_detect_and_options(void) {
    CHECK_EQ(dsrt_detect_format("\xff\xd8\xff\xe0", 4), DSRT_FORMAT_JPEG);
    CHECK_EQ(dsrt_detect_format("\xff\xd8", 2), DSRT_FORMAT_UNKNOWN);
    CHECK_EQ(dsrt_detect_format("\x89PNG\r\n\x1a\n", 8), DSRT_FORMAT_PNG);
    CHECK_EQ(dsrt_detect_format("\x89PNG\r\n\x1a", 7), DSRT_FORMAT_UNKNOWN);
    CHECK_EQ(dsrt_detect_format("GIF89a", 6), DSRT_FORMAT_UNKNOWN);
    CHECK_EQ(dsrt_detect_format(NULL, 0), DSRT_FORMAT_UNKNOWN);

    dsrt_decoder_options o = dsrt_decoder_defaults();
    CHECK_EQ(o.max_pixels, 178956970);
    CHECK_EQ(o.strict, 0);
    dsrt_decoder *d = (dsrt_decoder *)1;
    o.max_pixels = 0;
    CHECK_FAILS(dsrt_decoder_create(&d, &o), DSRT_EOPTION);
    CHECK(d == NULL);
    CHECK_OK(dsrt_decoder_create(&d, NULL));
    dsrt_decoder_destroy(d);
    dsrt_decoder_destroy(NULL);

    /* Scratch buffers: aligned, large enough, kept. */
    CHECK_OK(dsrt_decoder_create(&d, NULL));
    uint8_t *f = dsrt__decoder_file_buffer(d, 10000);
    REQUIRE(f);
    CHECK_EQ((uintptr_t)f % DSRT_DIRECT_ALIGN, 0);
    memset(f, 1, 10000);
    CHECK(dsrt__decoder_file_buffer(d, 5000) == f);
    uint8_t *p = dsrt__decoder_pixel_buffer(d, 3 * 1000 * 1000);
    REQUIRE(p);
    memset(p, 2, 3 * 1000 * 1000);
    CHECK(p != f);
    CHECK(dsrt__decoder_pixel_buffer(d, 1) == p);
    dsrt_decoder_destroy(d);
}

static void test_scale_choice(void) {
    dsrt_image_info info = {DSRT_FORMAT_JPEG, 500, 375, 3, 8, 0};
    struct {
        int min_w, min_h, w, h;
    } cases[] = {
        {0, 0, 500, 375},       /* full size */
        {256, 256, 500, 375},   /* 1/2 gives 250x188: too small */
        {100, 100, 250, 188},   /* 1/4 gives 125x94: too small */
        {63, 47, 63, 47},       /* 1/8 */
        {64, 47, 125, 94},      /* 1/8 is 63 wide: 1/4 */
        {1, 1, 63, 47},         /* the smallest */
        {1000, 1000, 500, 375}, /* never upscaled */
        {100, 0, 125, 94},      /* width alone */
        {0, 95, 250, 188},      /* height alone */
        {250, 188, 250, 188},   /* exactly 1/2 */
        {251, 188, 500, 375},
    };
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(cases); i++) {
        dsrt_decode_request r = request(3, cases[i].min_w, cases[i].min_h);
        int w = -1, h = -1;
        dsrt_decode_size(&info, &r, &w, &h);
        if (w != cases[i].w || h != cases[i].h)
            fprintf(stderr, "min %dx%d: got %dx%d, want %dx%d\n", cases[i].min_w, cases[i].min_h, w,
                    h, cases[i].w, cases[i].h);
        CHECK_EQ(w, cases[i].w);
        CHECK_EQ(h, cases[i].h);
    }
    /* PNGs always decode at full size. */
    dsrt_image_info png = {DSRT_FORMAT_PNG, 500, 375, 3, 8, 0};
    dsrt_decode_request r = request(3, 10, 10);
    int w, h;
    dsrt_decode_size(&png, &r, &w, &h);
    CHECK_EQ(w, 500);
    CHECK_EQ(h, 375);

    /* The real thing: a 500x375 JPEG decoded with min 100x100 is 250x188 and
     * identical to TurboJPEG's own half-size decode. */
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_420, 500, 375, 7, &len);
    REQUIRE(jpeg);
    dsrt_image img;
    r = request(3, 100, 100);
    CHECK_OK(dsrt_decode(d, jpeg, len, &r, &img));
    CHECK_EQ(img.width, 250);
    CHECK_EQ(img.height, 188);
    CHECK_EQ(img.stride, 750);
    uint8_t *ref = tj_reference(jpeg, len, 250, 188, TJPF_RGB);
    CHECK_EQ(first_diff(img.data, ref, 250 * 188 * 3), -1);
    free(ref);
    free(jpeg);
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// JPEG against libjpeg-turbo

/* Decodes jpeg with d as (channels, min size) asks and compares with
 * TurboJPEG's own decode at the size the request implies. */
static void check_jpeg(dsrt_decoder *d, const uint8_t *jpeg, size_t len, int kind, int channels,
                       int min_w, int min_h, int use_dst) {
    dsrt_image_info info;
    CHECK_OK(dsrt_decoder_info(d, jpeg, len, &info));
    dsrt_decode_request r = request(channels, min_w, min_h);
    int w, h;
    dsrt_decode_size(&info, &r, &w, &h);
    size_t n = (size_t)w * h, bytes = n * channels;
    uint8_t *dst = NULL;
    if (use_dst) {
        dst = malloc(bytes + 16);
        REQUIRE(dst);
        memset(dst, 0xEE, bytes + 16);
        r.dst = dst;
        r.dst_cap = bytes;
    }
    dsrt_image img;
    int rc = dsrt_decode(d, jpeg, len, &r, &img);
    CHECK_OK(rc);
    if (rc != 0) {
        free(dst);
        return;
    }
    CHECK_EQ(img.width, w);
    CHECK_EQ(img.height, h);
    CHECK_EQ(img.channels, channels);
    CHECK_EQ(img.stride, (size_t)w * channels);
    if (use_dst) {
        CHECK(img.data == dst);
        for (int i = 0; i < 16; i++) CHECK_EQ(dst[bytes + i], 0xEE);
    }

    uint8_t *ref;
    if (kind == TIMG_JPEG_CMYK) {
        /* Adobe-inverted CMYK: R = C*K/255 rounded, on TurboJPEG's samples. */
        uint8_t *cmyk = tj_reference(jpeg, len, w, h, TJPF_CMYK);
        uint8_t *rgb = malloc(n * 3);
        REQUIRE(rgb);
        for (size_t i = 0; i < n; i++)
            for (int c = 0; c < 3; c++)
                rgb[3 * i + c] = (uint8_t)floor(cmyk[4 * i + c] * cmyk[4 * i + 3] / 255.0 + 0.5);
        free(cmyk);
        if (channels == 3) {
            ref = rgb;
        } else {
            ref = malloc(n);
            REQUIRE(ref);
            rgb_to_gray_ref(rgb, ref, n);
            free(rgb);
        }
    } else {
        ref = tj_reference(jpeg, len, w, h, channels == 1 ? TJPF_GRAY : TJPF_RGB);
    }
    long at = first_diff(img.data, ref, bytes);
    if (at >= 0)
        fprintf(stderr, "%s %dx%d ch %d min %dx%d: byte %ld differs (%d vs %d)\n",
                timg_jpeg_kind_name(kind), info.width, info.height, channels, min_w, min_h, at,
                img.data[at], ref[at]);
    CHECK_EQ(at, -1);
    free(ref);
    free(dst);
}

static void test_jpeg_kinds(void) {
    static const int sizes[][2] = {{37, 23}, {64, 48}, {1, 1}, {17, 100}, {333, 2}, {9, 9}};
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_JPEG_KINDS; kind++) {
        for (size_t s = 0; s < DSRT_ARRAY_SIZE(sizes); s++) {
            int w = sizes[s][0], h = sizes[s][1];
            size_t len;
            uint8_t *jpeg = timg_make_jpeg(kind, w, h, (uint32_t)(kind * 100 + s), &len);
            REQUIRE(jpeg);
            char name[64];
            snprintf(name, sizeof name, "%s-%dx%d.jpg", timg_jpeg_kind_name(kind), w, h);
            corpus(name, jpeg, len);

            dsrt_image_info info;
            CHECK_OK(dsrt_decoder_info(d, jpeg, len, &info));
            CHECK_EQ(info.format, DSRT_FORMAT_JPEG);
            CHECK_EQ(info.width, w);
            CHECK_EQ(info.height, h);
            CHECK_EQ(info.bit_depth, 8);
            CHECK_EQ(info.channels, kind == TIMG_JPEG_GRAY ? 1 : kind == TIMG_JPEG_CMYK ? 4 : 3);
            CHECK_EQ(info.cmyk, kind == TIMG_JPEG_CMYK);

            /* Every scale: a minimum of exactly the scaled size picks it. */
            for (int denom = 1; denom <= 8; denom *= 2) {
                int mw = (w + denom - 1) / denom, mh = (h + denom - 1) / denom;
                for (int ch = 1; ch <= 3; ch += 2) {
                    check_jpeg(d, jpeg, len, kind, ch, denom == 1 ? 0 : mw, denom == 1 ? 0 : mh, 0);
                    check_jpeg(d, jpeg, len, kind, ch, mw, mh, 1);
                }
            }
            free(jpeg);
        }
    }
    dsrt_decoder_destroy(d);
}

/* A larger image once, with every scale, so that the scaled decodes are not
 * all single blocks. */
static void test_jpeg_large(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_JPEG_KINDS; kind++) {
        size_t len;
        uint8_t *jpeg = timg_make_jpeg(kind, 641, 479, 99, &len);
        REQUIRE(jpeg);
        for (int denom = 1; denom <= 8; denom *= 2)
            for (int ch = 1; ch <= 3; ch += 2)
                check_jpeg(d, jpeg, len, kind, ch, (641 + denom - 1) / denom,
                           (479 + denom - 1) / denom, 0);
        free(jpeg);
    }
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// JPEGs with sampling factors TurboJPEG has no name for

/*
 * Compresses an RGB image with the given per-component sampling factors
 * (h, v), through libjpeg's own API. TurboJPEG can only make its named
 * subsamplings and libturbojpeg does not export the libjpeg API, so
 * libjpeg.so.62 is opened at run time; NULL when it is not there.
 */
static uint8_t *jpeg_with_sampling(const uint8_t *rgb, int w, int h, const int samp[3][2],
                                   int restart_rows, int progressive, size_t *len) {
    void *lib = dlopen("libjpeg.so.62", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return NULL;
    struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *) = dlsym(lib, "jpeg_std_error");
    void (*create)(j_compress_ptr, int, size_t) = dlsym(lib, "jpeg_CreateCompress");
    void (*mem_dest)(j_compress_ptr, unsigned char **, unsigned long *) =
        dlsym(lib, "jpeg_mem_dest");
    void (*set_defaults)(j_compress_ptr) = dlsym(lib, "jpeg_set_defaults");
    void (*set_quality)(j_compress_ptr, int, boolean) = dlsym(lib, "jpeg_set_quality");
    void (*start)(j_compress_ptr, boolean) = dlsym(lib, "jpeg_start_compress");
    JDIMENSION(*write)
    (j_compress_ptr, JSAMPARRAY, JDIMENSION) = dlsym(lib, "jpeg_write_scanlines");
    void (*finish)(j_compress_ptr) = dlsym(lib, "jpeg_finish_compress");
    void (*destroy)(j_compress_ptr) = dlsym(lib, "jpeg_destroy_compress");
    void (*simple_progression)(j_compress_ptr) = dlsym(lib, "jpeg_simple_progression");
    if (!std_error || !create || !mem_dest || !set_defaults || !set_quality || !start || !write ||
        !finish || !destroy || !simple_progression) {
        dlclose(lib);
        return NULL;
    }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    unsigned char *mem = NULL;
    unsigned long size = 0;
    c.err = std_error(&err);
    create(&c, JPEG_LIB_VERSION, sizeof c);
    mem_dest(&c, &mem, &size);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    set_defaults(&c);
    set_quality(&c, 90, TRUE);
    for (int i = 0; i < 3; i++) {
        c.comp_info[i].h_samp_factor = samp[i][0];
        c.comp_info[i].v_samp_factor = samp[i][1];
    }
    c.restart_in_rows = restart_rows;
    if (progressive) simple_progression(&c);
    start(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
        write(&c, &row, 1);
    }
    finish(&c);
    destroy(&c);
    uint8_t *out = malloc(size);
    if (out) {
        memcpy(out, mem, size);
        *len = size;
    }
    free(mem); /* jpeg_mem_dest allocates with malloc */
    dlclose(lib);
    return out;
}

/* tjDecompressHeader3 refuses sampling factors it has no name for; the
 * decoder goes on, and libjpeg decodes them. */
static void test_jpeg_odd_sampling(void) {
    static const int samplings[][3][2] = {
        {{2, 2}, {2, 1}, {1, 1}},
        {{1, 2}, {1, 1}, {1, 2}},
        {{3, 1}, {1, 1}, {1, 1}},
    };
    int w = 53, h = 35;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    timg_pattern(rgb, w, h, 3, 77);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(samplings); i++) {
        size_t len;
        uint8_t *jpeg = jpeg_with_sampling(rgb, w, h, samplings[i], 0, 0, &len);
        if (!jpeg) {
            fprintf(stderr, "libjpeg.so.62 not found: odd sampling not tested\n");
            break;
        }
        char name[64];
        snprintf(name, sizeof name, "sampling%zu.jpg", i);
        corpus(name, jpeg, len);
        tjhandle tj = tjInitDecompress();
        int tw, th, ts, tc;
        CHECK_EQ(tjDecompressHeader3(tj, jpeg, len, &tw, &th, &ts, &tc), -1); /* still refused */
        tjDestroy(tj);
        dsrt_image_info info;
        CHECK_OK(dsrt_decoder_info(d, jpeg, len, &info));
        CHECK_EQ(info.width, w);
        CHECK_EQ(info.channels, 3);
        for (int denom = 1; denom <= 8; denom *= 2)
            for (int ch = 1; ch <= 3; ch += 2)
                check_jpeg(d, jpeg, len, TIMG_JPEG_444, ch, (w + denom - 1) / denom,
                           (h + denom - 1) / denom, denom == 2);
        free(jpeg);
    }
    dsrt_decoder_destroy(d);
    free(rgb);
}

// ----------------------------------------------------------------------------
// PNG against the encoded pixels

static void test_png_kinds(void) {
    static const int sizes[][2] = {{37, 23}, {1, 1}, {8, 8}, {100, 3}, {3, 61}, {64, 64}};
    static const int channels_of[] = {1, 1, 1, 1, 1, 3, 3, 4, 4, 2, 2, 3, 3, 3, 1};
    static const int depth_of[] = {1, 2, 4, 8, 16, 8, 16, 8, 16, 8, 16, 8, 2, 8, 4};
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_PNG_KINDS; kind++) {
        for (size_t s = 0; s < DSRT_ARRAY_SIZE(sizes); s++) {
            int w = sizes[s][0], h = sizes[s][1];
            size_t n = (size_t)w * h, len;
            uint8_t *expect = malloc(n * 3), *gray = malloc(n);
            REQUIRE(expect && gray);
            uint8_t *png = timg_make_png(kind, w, h, (uint32_t)(kind * 1000 + s), &len, expect);
            REQUIRE(png);
            rgb_to_gray_ref(expect, gray, n);
            char name[64];
            snprintf(name, sizeof name, "%s-%dx%d.png", timg_png_kind_name(kind), w, h);
            corpus(name, png, len);

            dsrt_image_info info;
            CHECK_OK(dsrt_decoder_info(d, png, len, &info));
            CHECK_EQ(info.format, DSRT_FORMAT_PNG);
            CHECK_EQ(info.width, w);
            CHECK_EQ(info.height, h);
            CHECK_EQ(info.channels, channels_of[kind]);
            CHECK_EQ(info.bit_depth, depth_of[kind]);
            CHECK_EQ(info.cmyk, 0);

            for (int ch = 1; ch <= 3; ch += 2) {
                /* A minimum size changes nothing for PNG. */
                dsrt_decode_request r = request(ch, w / 2, h / 2);
                dsrt_image img;
                int rc = dsrt_decode(d, png, len, &r, &img);
                CHECK_OK(rc);
                if (rc != 0) continue;
                CHECK_EQ(img.width, w);
                CHECK_EQ(img.height, h);
                CHECK_EQ(img.channels, ch);
                long at = first_diff(img.data, ch == 3 ? expect : gray, n * ch);
                if (at >= 0)
                    fprintf(stderr, "%s %dx%d ch %d: byte %ld: %d, want %d\n",
                            timg_png_kind_name(kind), w, h, ch, at, img.data[at],
                            (ch == 3 ? expect : gray)[at]);
                CHECK_EQ(at, -1);
            }
            free(png);
            free(expect);
            free(gray);
        }
    }
    dsrt_decoder_destroy(d);
}

/* The 16-bit rule on values where truncation and rounding disagree. */
static void test_png_16bit_rule(void) {
    uint16_t px[2][3] = {{0x30FF, 0x0080, 0xFFFF}, {0x7F80, 0x00FF, 0x8000}};
    size_t len;
    uint8_t *png = timg_png(px, 2, 1, SPNG_COLOR_TYPE_TRUECOLOR, 16, 0, NULL, NULL, &len);
    REQUIRE(png);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    CHECK_OK(dsrt_decode(d, png, len, &r, &img));
    uint8_t want[6] = {0x30, 0x00, 0xFF, 0x7F, 0x00, 0x80};
    CHECK_EQ(first_diff(img.data, want, 6), -1);
    free(png);

    uint16_t g[3] = {0x30FF, 0x0080, 0xFFFF};
    png = timg_png(g, 3, 1, SPNG_COLOR_TYPE_GRAYSCALE, 16, 0, NULL, NULL, &len);
    REQUIRE(png);
    r = request(1, 0, 0);
    CHECK_OK(dsrt_decode(d, png, len, &r, &img));
    CHECK_EQ(img.data[0], 0x30);
    CHECK_EQ(img.data[1], 0x00);
    CHECK_EQ(img.data[2], 0xFF);
    free(png);
    dsrt_decoder_destroy(d);
}

static void test_png_write(void) {
    char dir[4096], path[8192];
    REQUIRE(timg_tmpdir("decode_png_write", dir, sizeof dir) == 0);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int ch = 1; ch <= 3; ch += 2) {
        for (int strided = 0; strided < 2; strided++) {
            int w = 29, h = 17;
            size_t stride = (size_t)w * ch + (strided ? 13 : 0);
            uint8_t *px = malloc(stride * h);
            REQUIRE(px);
            timg_noise(px, stride * h, (uint32_t)(ch * 10 + strided));
            dsrt_image img = {px, w, h, ch, stride};
            snprintf(path, sizeof path, "%s/img-%d-%d.png", dir, ch, strided);
            CHECK_OK(dsrt_png_write(path, &img));
            uint8_t *data;
            size_t size;
            REQUIRE(dsrt__read_whole_file(path, 1 << 20, &data, &size) == 0);
            dsrt_image_info info;
            CHECK_OK(dsrt_decoder_info(d, data, size, &info));
            CHECK_EQ(info.channels, ch);
            CHECK_EQ(info.bit_depth, 8);
            dsrt_decode_request r = request(ch, 0, 0);
            dsrt_image out;
            CHECK_OK(dsrt_decode(d, data, size, &r, &out));
            CHECK_EQ(out.width, w);
            CHECK_EQ(out.height, h);
            for (int y = 0; y < h; y++)
                CHECK_EQ(first_diff(out.data + (size_t)y * w * ch, px + y * stride, (size_t)w * ch),
                         -1);
            free(data);
            free(px);
        }
    }
    /* No temporary file is left behind. */
    snprintf(path, sizeof path, "ls -a '%s' | grep -c tmp > /dev/null", dir);
    CHECK(system(path) != 0);

    uint8_t px[12] = {0};
    dsrt_image bad = {px, 2, 2, 2, 4};
    snprintf(path, sizeof path, "%s/bad.png", dir);
    CHECK_FAILS(dsrt_png_write(path, &bad), DSRT_EOPTION);
    dsrt_image short_stride = {px, 2, 2, 3, 5};
    CHECK_FAILS(dsrt_png_write(path, &short_stride), DSRT_EOPTION);
    dsrt_image ok = {px, 2, 2, 3, 6};
    snprintf(path, sizeof path, "%s/no/such/folder/x.png", dir);
    CHECK_FAILS(dsrt_png_write(path, &ok), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "png");
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// Bad input

/* d must still decode a good image correctly after a failure. */
static void check_still_works(dsrt_decoder *d, const uint8_t *jpeg, size_t len, int kind) {
    check_jpeg(d, jpeg, len, kind, 3, 0, 0, 0);
    check_jpeg(d, jpeg, len, kind, 1, 8, 8, 0);
}

static void test_empty_and_not_images(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t good_len;
    uint8_t *good = timg_make_jpeg(TIMG_JPEG_420, 40, 30, 5, &good_len);
    REQUIRE(good);
    dsrt_image_info info;
    dsrt_image img;
    dsrt_decode_request r = request(3, 0, 0);

    CHECK_FAILS(dsrt_decoder_info(d, good, 0, &info), DSRT_EEMPTY);
    CHECK_FAILS(dsrt_decode(d, good, 0, &r, &img), DSRT_EEMPTY);
    CHECK(img.data == NULL);

    const char *text = "This is a text file, not an image.\nSecond line.\n";
    corpus("text.txt", text, strlen(text));
    CHECK_FAILS(dsrt_decoder_info(d, text, strlen(text), &info), DSRT_EFORMAT);
    CHECK_FAILS(dsrt_decode(d, text, strlen(text), &r, &img), DSRT_EFORMAT);
    CHECK_CONTAINS(dsrt_last_error(), "not a JPEG, PNG or WebP image");

    uint8_t noise[4096];
    timg_noise(noise, sizeof noise, 3);
    noise[0] = 0x42;
    CHECK_FAILS(dsrt_decode(d, noise, sizeof noise, &r, &img), DSRT_EFORMAT);
    /* Signatures followed by noise. */
    memcpy(noise, "\xff\xd8\xff", 3);
    corpus("jpeg-noise.jpg", noise, sizeof noise);
    CHECK_FAILS(dsrt_decode(d, noise, sizeof noise, &r, &img), 0);
    check_still_works(d, good, good_len, TIMG_JPEG_420);
    memcpy(noise, "\x89PNG\r\n\x1a\n", 8);
    corpus("png-noise.png", noise, sizeof noise);
    CHECK_FAILS(dsrt_decode(d, noise, sizeof noise, &r, &img), 0);

    /* Bad requests. */
    r.channels = 2;
    CHECK_FAILS(dsrt_decode(d, good, good_len, &r, &img), DSRT_EOPTION);
    r = request(3, -1, 5);
    CHECK_FAILS(dsrt_decode(d, good, good_len, &r, &img), DSRT_EOPTION);
    check_still_works(d, good, good_len, TIMG_JPEG_420);
    free(good);
    dsrt_decoder_destroy(d);
}

/* Every cut of a JPEG is ETRUNCATED, through info or decode. */
static void test_truncated_jpeg(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_JPEG_KINDS; kind++) {
        size_t len;
        uint8_t *jpeg = timg_make_jpeg(kind, 48, 40, (uint32_t)kind, &len);
        REQUIRE(jpeg);
        int bad = 0;
        for (size_t cut = 1; cut < len; cut++) {
            uint8_t *copy = malloc(cut); /* exact size: ASan sees any over-read */
            REQUIRE(copy);
            memcpy(copy, jpeg, cut);
            dsrt_image img;
            for (int ch = 1; ch <= 3; ch += 2) {
                dsrt_decode_request r = request(ch, cut % 3 ? 0 : 10, cut % 3 ? 0 : 10);
                dsrt__clear_error();
                int rc = dsrt_decode(d, copy, cut, &r, &img);
                if (rc != DSRT_ETRUNCATED || !dsrt_last_error()[0]) {
                    if (bad++ < 5)
                        fprintf(stderr, "%s cut at %zu of %zu: %d (%s) \"%s\"\n",
                                timg_jpeg_kind_name(kind), cut, len, rc, dsrt_strerror(rc),
                                dsrt_last_error());
                }
            }
            if (cut == len / 2 || cut == 300) {
                char name[64];
                snprintf(name, sizeof name, "%s-cut%zu.jpg", timg_jpeg_kind_name(kind), cut);
                corpus(name, copy, cut);
            }
            free(copy);
        }
        CHECK_EQ(bad, 0);
        check_still_works(d, jpeg, len, kind);
        free(jpeg);
    }
    /* Strict decoders too. */
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.strict = 1;
    dsrt_decoder *s;
    REQUIRE(dsrt_decoder_create(&s, &o) == 0);
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_PROGRESSIVE, 48, 40, 1, &len);
    REQUIRE(jpeg);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    CHECK_FAILS(dsrt_decode(s, jpeg, len - 100, &r, &img), DSRT_ETRUNCATED);
    CHECK_CONTAINS(dsrt_last_error(), "decode: ");
    free(jpeg);
    dsrt_decoder_destroy(s);
    dsrt_decoder_destroy(d);
}

/* Every cut of a PNG before the end of its image data is ETRUNCATED; cuts
 * after it (in the last CRC or IEND) may decode, the pixels being complete. */
static void test_truncated_png(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    int kinds[] = {TIMG_PNG_GRAY8, TIMG_PNG_RGB16, TIMG_PNG_PALETTE8, TIMG_PNG_RGB8_INTERLACED,
                   TIMG_PNG_GRAY1};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(kinds); k++) {
        size_t len;
        uint8_t *png = timg_make_png(kinds[k], 40, 30, 9, &len, NULL);
        REQUIRE(png);
        /* IEND is the last 12 bytes, after the last IDAT's CRC: libspng
         * does not wait for that CRC once the image data is complete. */
        size_t data_end = len - 12 - 4;
        int bad = 0;
        for (size_t cut = 1; cut < len; cut++) {
            uint8_t *copy = malloc(cut);
            REQUIRE(copy);
            memcpy(copy, png, cut);
            for (int ch = 1; ch <= 3; ch += 2) {
                dsrt_decode_request r = request(ch, 0, 0);
                dsrt_image img;
                dsrt__clear_error();
                int rc = dsrt_decode(d, copy, cut, &r, &img);
                int ok = cut >= data_end ? rc == 0 || rc == DSRT_ETRUNCATED
                                         : rc == DSRT_ETRUNCATED && dsrt_last_error()[0];
                if (!ok && bad++ < 5)
                    fprintf(stderr, "%s cut at %zu of %zu: %d (%s) \"%s\"\n",
                            timg_png_kind_name(kinds[k]), cut, len, rc, dsrt_strerror(rc),
                            dsrt_last_error());
            }
            if (cut == len / 2) {
                char name[64];
                snprintf(name, sizeof name, "%s-cut%zu.png", timg_png_kind_name(kinds[k]), cut);
                corpus(name, copy, cut);
            }
            free(copy);
        }
        CHECK_EQ(bad, 0);
        free(png);
    }
    dsrt_decoder_destroy(d);
}

/* Bytes changed anywhere: any result, but a failure has a code and a
 * message, and nothing crashes or reads outside the buffer. */
static void test_corrupt(void) {
    dsrt_decoder *d, *s;
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.strict = 1;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    REQUIRE(dsrt_decoder_create(&s, &o) == 0);
    size_t good_len;
    uint8_t *good = timg_make_jpeg(TIMG_JPEG_420, 40, 30, 5, &good_len);
    REQUIRE(good);
    static const uint8_t values[] = {0x00, 0xff, 0x01, 0x80};
    for (int which = 0; which < 3; which++) {
        size_t len;
        uint8_t *img = which == 0   ? timg_make_jpeg(TIMG_JPEG_PROGRESSIVE, 40, 30, 1, &len)
                       : which == 1 ? timg_make_jpeg(TIMG_JPEG_422, 40, 30, 2, &len)
                                    : timg_make_png(TIMG_PNG_RGB8, 40, 30, 3, &len, NULL);
        REQUIRE(img);
        int failures = 0, bad = 0;
        uint8_t *copy = malloc(len);
        REQUIRE(copy);
        for (size_t pos = 0; pos < len; pos++) {
            for (size_t v = 0; v < DSRT_ARRAY_SIZE(values) + 1; v++) {
                memcpy(copy, img, len);
                copy[pos] = v < DSRT_ARRAY_SIZE(values) ? values[v] : (uint8_t)(copy[pos] ^ 0x55);
                if (copy[pos] == img[pos]) continue;
                for (int strict = 0; strict < 2; strict++) {
                    dsrt_decode_request r = request(pos % 2 ? 1 : 3, pos % 5 ? 0 : 12, 0);
                    dsrt_image out;
                    dsrt__clear_error();
                    int rc = dsrt_decode(strict ? s : d, copy, len, &r, &out);
                    if (rc != 0) {
                        failures++;
                        if (rc > 0 || !dsrt_last_error()[0]) bad++;
                    }
                }
            }
            if (pos % 97 == 0 && which < 2) {
                char name[64];
                snprintf(name, sizeof name, "corrupt%d-%zu.jpg", which, pos);
                corpus(name, copy, len);
            }
        }
        CHECK_GT(failures, 0);
        CHECK_EQ(bad, 0);
        free(copy);
        free(img);
    }
    check_still_works(d, good, good_len, TIMG_JPEG_420);
    check_still_works(s, good, good_len, TIMG_JPEG_420);

    /* A PNG with a byte flipped in its image data fails its CRC. */
    size_t len;
    uint8_t *png = timg_make_png(TIMG_PNG_RGB8, 40, 30, 3, &len, NULL);
    png[len / 2] ^= 0x55;
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image out;
    CHECK_FAILS(dsrt_decode(d, png, len, &r, &out), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "decode: PNG: ");
    free(png);
    free(good);
    dsrt_decoder_destroy(s);
    dsrt_decoder_destroy(d);
}

/* Valid JPEGs libjpeg-turbo 2.1 does not decode: EUNSUPPORTED, not corrupt. */
static void test_jpeg_unsupported(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_444, 32, 32, 3, &len);
    REQUIRE(jpeg);
    size_t sof = find_marker(jpeg, len, 0xc0);
    REQUIRE(sof > 0);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    jpeg[sof + 1] = 0xc3; /* lossless */
    corpus("lossless.jpg", jpeg, len);
    CHECK_FAILS(dsrt_decode(d, jpeg, len, &r, &img), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "decode: Unsupported JPEG process");
    jpeg[sof + 1] = 0xc0;
    jpeg[sof + 4] = 12; /* 12-bit samples */
    CHECK_FAILS(dsrt_decoder_info(d, jpeg, len, &(dsrt_image_info){0}), DSRT_EUNSUPPORTED);
    CHECK_CONTAINS(dsrt_last_error(), "precision 12");
    jpeg[sof + 4] = 8;
    check_still_works(d, jpeg, len, TIMG_JPEG_444);
    free(jpeg);
    dsrt_decoder_destroy(d);
}

/* Extraneous bytes before a marker: a libjpeg warning, accepted by default
 * (same pixels as without them), an error when strict. */
static void test_jpeg_warning(void) {
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_420, 64, 48, 11, &len);
    REQUIRE(jpeg);
    size_t sos = find_marker(jpeg, len, 0xda);
    REQUIRE(sos > 0);
    uint8_t *junk = malloc(len + 3);
    REQUIRE(junk);
    memcpy(junk, jpeg, sos);
    memcpy(junk + sos, "\x01\x02\x03", 3);
    memcpy(junk + sos + 3, jpeg + sos, len - sos);
    corpus("extraneous.jpg", junk, len + 3);

    dsrt_decoder *d, *s;
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.strict = 1;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    REQUIRE(dsrt_decoder_create(&s, &o) == 0);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    dsrt_image_info info;
    CHECK_OK(dsrt_decoder_info(d, junk, len + 3, &info));
    CHECK_EQ(info.width, 64);
    CHECK_OK(dsrt_decode(d, junk, len + 3, &r, &img));
    uint8_t *ref = tj_reference(jpeg, len, 64, 48, TJPF_RGB);
    CHECK_EQ(first_diff(img.data, ref, 64 * 48 * 3), -1);
    CHECK_FAILS(dsrt_decoder_info(s, junk, len + 3, &info), DSRT_ECORRUPT);
    CHECK_FAILS(dsrt_decode(s, junk, len + 3, &r, &img), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "decode: Corrupt JPEG data: 3 extraneous bytes");
    /* ... and a strict decoder still decodes clean files. */
    CHECK_OK(dsrt_decode(s, jpeg, len, &r, &img));
    CHECK_EQ(first_diff(img.data, ref, 64 * 48 * 3), -1);

    /* Junk and truncation: the truncation wins, strict or not. */
    CHECK_FAILS(dsrt_decode(d, junk, len + 3 - 200, &r, &img), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode(s, junk, len + 3 - 200, &r, &img), 0);
    free(ref);
    free(junk);
    free(jpeg);
    dsrt_decoder_destroy(s);
    dsrt_decoder_destroy(d);
}

/* Bytes the heap holds now (main arena plus mmap'd blocks). */
static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void test_bombs(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    dsrt_image_info info;

    /* A PNG claiming 100000 x 100000. */
    size_t len;
    uint8_t *png = timg_make_png(TIMG_PNG_RGB8, 16, 16, 1, &len, NULL);
    REQUIRE(png && timg_png_set_size(png, len, 100000, 100000) == 0);
    corpus("bomb.png", png, len);
    size_t before = heap_in_use();
    CHECK_FAILS(dsrt_decoder_info(d, png, len, &info), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "100000x100000");
    CHECK_CONTAINS(dsrt_last_error(), "10000000000");
    CHECK_EQ(info.width, 100000); /* the header is still reported */
    CHECK_FAILS(dsrt_decode(d, png, len, &r, &img), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "100000x100000");
    CHECK_LT(heap_in_use(), before + (1 << 20)); /* nothing large taken */
    free(png);

    /* A JPEG claiming 60000 x 60000 (JPEG sizes stop at 65535). */
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_420, 16, 16, 1, &len);
    REQUIRE(jpeg && timg_jpeg_set_size(jpeg, len, 60000, 60000) == 0);
    corpus("bomb.jpg", jpeg, len);
    before = heap_in_use();
    CHECK_FAILS(dsrt_decoder_info(d, jpeg, len, &info), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "60000x60000");
    CHECK_FAILS(dsrt_decode(d, jpeg, len, &r, &img), DSRT_ETOOBIG);
    CHECK_LT(heap_in_use(), before + (1 << 20));
    free(jpeg);

    /* The limit is inclusive and applies to the file's size, not the scaled
     * one. */
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.max_pixels = 37 * 23;
    dsrt_decoder *small;
    REQUIRE(dsrt_decoder_create(&small, &o) == 0);
    size_t jlen;
    jpeg = timg_make_jpeg(TIMG_JPEG_444, 37, 23, 1, &jlen);
    png = timg_make_png(TIMG_PNG_GRAY8, 37, 23, 1, &len, NULL);
    REQUIRE(jpeg && png);
    CHECK_OK(dsrt_decode(small, jpeg, jlen, &r, &img));
    CHECK_OK(dsrt_decode(small, png, len, &r, &img));
    dsrt_decoder_destroy(small);
    o.max_pixels = 37 * 23 - 1;
    REQUIRE(dsrt_decoder_create(&small, &o) == 0);
    r = request(3, 5, 5);
    CHECK_FAILS(dsrt_decode(small, jpeg, jlen, &r, &img), DSRT_ETOOBIG);
    CHECK_FAILS(dsrt_decode(small, png, len, &r, &img), DSRT_ETOOBIG);
    /* libspng's own per-side limit gives the same answer. */
    o.max_pixels = 30;
    dsrt_decoder_destroy(small);
    REQUIRE(dsrt_decoder_create(&small, &o) == 0);
    CHECK_FAILS(dsrt_decode(small, png, len, &r, &img), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "37x23");
    dsrt_decoder_destroy(small);
    free(jpeg);
    free(png);
    dsrt_decoder_destroy(d);
}

static void test_dst_too_small(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t jlen, plen;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_CMYK, 37, 23, 1, &jlen);
    uint8_t *png = timg_make_png(TIMG_PNG_RGB16, 37, 23, 1, &plen, NULL);
    REQUIRE(jpeg && png);
    uint8_t dst[37 * 23 * 3 + 8];
    memset(dst, 0x5A, sizeof dst);
    dsrt_decode_request r = request(3, 0, 0);
    r.dst = dst;
    r.dst_cap = 37 * 23 * 3 - 1;
    dsrt_image img;
    CHECK_FAILS(dsrt_decode(d, jpeg, jlen, &r, &img), DSRT_ETOOBIG);
    CHECK_CONTAINS(dsrt_last_error(), "destination");
    CHECK_FAILS(dsrt_decode(d, png, plen, &r, &img), DSRT_ETOOBIG);
    CHECK_EQ(dst[0], 0x5A); /* nothing written */
    r.dst_cap = 37 * 23 * 3;
    CHECK_OK(dsrt_decode(d, jpeg, jlen, &r, &img));
    CHECK(img.data == dst);
    CHECK_OK(dsrt_decode(d, png, plen, &r, &img));
    for (int i = 0; i < 8; i++) CHECK_EQ(dst[37 * 23 * 3 + i], 0x5A);
    /* Enough for the scaled size is enough. */
    r.min_width = 5;
    r.min_height = 3;
    r.dst_cap = 5 * 3 * 3;
    CHECK_OK(dsrt_decode(d, jpeg, jlen, &r, &img));
    CHECK_EQ(img.width, 5);
    CHECK_EQ(img.height, 3);
    free(jpeg);
    free(png);
    dsrt_decoder_destroy(d);
}

/* The pixel scratch is reused across sizes, and the gray path of PNG (RGB
 * then rgb2gray) does not disturb a destination that is the scratch itself. */
static void test_scratch_reuse(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    int sizes[][2] = {{300, 200}, {10, 10}, {310, 210}, {50, 400}};
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(sizes); i++) {
        int w = sizes[i][0], h = sizes[i][1];
        size_t n = (size_t)w * h, len;
        uint8_t *expect = malloc(n * 3), *gray = malloc(n);
        uint8_t *png = timg_make_png(TIMG_PNG_RGBA8, w, h, (uint32_t)i, &len, expect);
        REQUIRE(png && expect && gray);
        rgb_to_gray_ref(expect, gray, n);
        dsrt_decode_request r = request(1, 0, 0);
        r.dst = dsrt__decoder_pixel_buffer(d, n);
        r.dst_cap = n;
        dsrt_image img;
        CHECK_OK(dsrt_decode(d, png, len, &r, &img));
        CHECK_EQ(first_diff(img.data, gray, n), -1);
        r = request(3, 0, 0);
        CHECK_OK(dsrt_decode(d, png, len, &r, &img));
        CHECK_EQ(first_diff(img.data, expect, n * 3), -1);
        free(png);
        free(expect);
        free(gray);
    }
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// Regions: a window of the scaled image whose region is the whole decode's

/* The full-image region [x, x + w) x [y, y + h) (w or h 0: all), scaled by
 * 1/denom: [*x0, *x1) x [*y0, *y1) of the sw x sh decode. */
static void scaled_region(int x, int y, int w, int h, int denom, int sw, int sh, int *x0, int *x1,
                          int *y0, int *y1) {
    *x0 = w ? x / denom : 0;
    *x1 = w ? DSRT_MIN((x + w + denom - 1) / denom, sw) : sw;
    *y0 = h ? y / denom : 0;
    *y1 = h ? DSRT_MIN((y + h + denom - 1) / denom, sh) : sh;
}

/* Decodes region (x, y, w, h) of the image with d, at the scale min (sw x
 * sh) picks, and compares the region's pixels with whole, the whole decode.
 * Returns the number of pixels the window holds. */
static size_t check_region(dsrt_decoder *d, const uint8_t *buf, size_t len, int channels, int denom,
                           const uint8_t *whole, int sw, int sh, int x, int y, int w, int h,
                           const char *what) {
    dsrt_image_info info;
    CHECK_OK(dsrt_decode_begin(d, buf, len, &info));
    dsrt_decode_request r = request(channels, denom == 1 ? 0 : sw, denom == 1 ? 0 : sh);
    r.region_x = x, r.region_y = y, r.region_width = w, r.region_height = h;
    dsrt_image img;
    dsrt_window win;
    int rc = dsrt_decode_finish(d, &r, &img, &win);
    CHECK_OK(rc);
    if (rc != 0) return 0;
    CHECK_EQ(win.decoded_width, sw);
    CHECK_EQ(win.decoded_height, sh);
    CHECK_EQ(img.channels, channels);
    int x0, x1, y0, y1;
    scaled_region(x, y, w, h, denom, sw, sh, &x0, &x1, &y0, &y1);
    CHECK_LE(win.x0, x0);
    CHECK_LE(win.y0, y0);
    CHECK_GE(win.x0 + img.width, x1);
    CHECK_GE(win.y0 + img.height, y1);
    CHECK_LE(win.x0 + img.width, sw);
    CHECK_LE(win.y0 + img.height, sh);
    long bad = 0;
    for (int yy = y0; yy < y1 && yy - win.y0 < img.height; yy++) {
        const uint8_t *got =
            img.data + (size_t)(yy - win.y0) * img.stride + (size_t)(x0 - win.x0) * channels;
        const uint8_t *want = whole + ((size_t)yy * sw + x0) * channels;
        if (memcmp(got, want, (size_t)(x1 - x0) * channels) != 0) bad++;
    }
    if (bad)
        fprintf(stderr, "%s: %dx%d at 1/%d, %d channel(s), region %d,%d %dx%d: %ld rows differ\n",
                what, info.width, info.height, denom, channels, x, y, w, h, bad);
    CHECK_EQ(bad, 0);
    return (size_t)img.width * img.height;
}

/* Every kind of JPEG, at every scale, in both channel counts, over fixed
 * and random regions: the pixels of a region are a whole decode's, and
 * small regions decode less. */
static void check_regions(dsrt_decoder *d, const uint8_t *jpeg, size_t len, const char *what,
                          uint64_t key) {
    dsrt_image_info info;
    CHECK_OK(dsrt_decoder_info(d, jpeg, len, &info));
    int W = info.width, H = info.height;
    for (int denom = 1; denom <= 8; denom *= 2)
        for (int ch = 1; ch <= 3; ch += 2) {
            int sw = (W + denom - 1) / denom, sh = (H + denom - 1) / denom;
            dsrt_decode_request r = request(ch, denom == 1 ? 0 : sw, denom == 1 ? 0 : sh);
            dsrt_image img;
            CHECK_OK(dsrt_decode(d, jpeg, len, &r, &img));
            if (img.width != sw || img.height != sh) continue;
            size_t n = (size_t)sw * sh * ch;
            uint8_t *whole = malloc(n);
            REQUIRE(whole);
            memcpy(whole, img.data, n);
            int fixed[][4] = {{0, 0, 1, 1},
                              {W - 1, H - 1, 1, 1},
                              {W / 3, H / 4, W / 2, H / 3},
                              {0, H / 2, W, 0},
                              {W / 2, 0, 0, H / 2},
                              {0, 0, 0, 0},
                              {W / 5, H / 5, W - W / 5, H - H / 5}};
            for (size_t k = 0; k < DSRT_ARRAY_SIZE(fixed); k++)
                check_region(d, jpeg, len, ch, denom, whole, sw, sh, fixed[k][0], fixed[k][1],
                             fixed[k][2], fixed[k][3], what);
            for (int k = 0; k < 12; k++) {
                uint64_t m = dsrt__mix64(key * 7919 + (uint64_t)(denom * 4 + ch) * 131 + k);
                int x = (int)(m % W), y = (int)((m >> 16) % H);
                int w = 1 + (int)((m >> 32) % (W - x)), h = 1 + (int)((m >> 48) % (H - y));
                check_region(d, jpeg, len, ch, denom, whole, sw, sh, x, y, w, h, what);
            }
            /* A small region of a large image decodes a small window. */
            if (sw >= 256 && sh >= 256) {
                size_t px = check_region(d, jpeg, len, ch, denom, whole, sw, sh, W / 2, H / 2,
                                         denom, denom, what);
                CHECK_LT(px, (size_t)sw * sh / 4);
            }
            free(whole);
        }
}

static void test_regions(void) {
    static const int sizes[][2] = {{641, 479}, {37, 23}, {333, 2}, {17, 100}, {1, 1}, {300, 301}};
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_JPEG_KINDS; kind++)
        for (size_t s = 0; s < DSRT_ARRAY_SIZE(sizes); s++) {
            size_t len;
            uint8_t *jpeg =
                timg_make_jpeg(kind, sizes[s][0], sizes[s][1], (uint32_t)(kind * 31 + s), &len);
            REQUIRE(jpeg);
            check_regions(d, jpeg, len, timg_jpeg_kind_name(kind), (uint64_t)kind * 100 + s);
            free(jpeg);
        }
    /* Sampling factors TurboJPEG has no name for. */
    static const int samplings[][3][2] = {
        {{2, 2}, {2, 1}, {1, 1}},
        {{1, 2}, {1, 1}, {1, 2}},
        {{3, 1}, {1, 1}, {1, 1}},
    };
    int w = 213, h = 157;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    timg_pattern(rgb, w, h, 3, 78);
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(samplings); i++) {
        size_t len;
        uint8_t *jpeg = jpeg_with_sampling(rgb, w, h, samplings[i], 0, 0, &len);
        if (!jpeg) break;
        check_regions(d, jpeg, len, "odd sampling", 1000 + i);
        free(jpeg);
    }
    free(rgb);
    /* PNGs decode whole, the window being the image. */
    size_t len;
    uint8_t *png = timg_make_png(TIMG_PNG_RGB8, 40, 30, 3, &len, NULL);
    dsrt_image_info info;
    CHECK_OK(dsrt_decode_begin(d, png, len, &info));
    dsrt_decode_request r = request(3, 0, 0);
    r.region_x = 10, r.region_y = 5, r.region_width = 3, r.region_height = 4;
    dsrt_image img;
    dsrt_window win;
    CHECK_OK(dsrt_decode_finish(d, &r, &img, &win));
    CHECK_EQ(img.width, 40);
    CHECK_EQ(win.x0, 0);
    CHECK_EQ(win.decoded_width, 40);
    free(png);
    dsrt_decoder_destroy(d);
}

/* What follows the rows a region needs is still looked at: a truncated file
 * is an error, a second scan where none may be is the error it is for a
 * whole decode, and a strict decoder still sees a warning there. */
static void test_region_rest(void) {
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_420, 641, 479, 12, &len);
    REQUIRE(jpeg);
    dsrt_decoder *d, *s;
    dsrt_decoder_options o = dsrt_decoder_defaults();
    o.strict = 1;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    REQUIRE(dsrt_decoder_create(&s, &o) == 0);
    dsrt_decode_request top = request(3, 0, 0);
    top.region_width = 641, top.region_height = 40;
    dsrt_decode_request all = request(3, 0, 0);
    dsrt_image img;
    dsrt_image_info info;

    /* Cut in the rows below the region. */
    CHECK_FAILS(dsrt_decode(d, jpeg, len * 9 / 10, &all, &img), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode(d, jpeg, len * 9 / 10, &top, &img), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode(s, jpeg, len * 9 / 10, &top, &img), DSRT_ETRUNCATED);

    /* Junk before the end-of-image marker (more than the entropy decoder
     * reads ahead): a warning. */
    uint8_t *junk = malloc(len + 100);
    REQUIRE(junk);
    memcpy(junk, jpeg, len - 2);
    memset(junk + len - 2, 0x55, 100);
    memcpy(junk + len + 98, "\xff\xd9", 2);
    CHECK_OK(dsrt_decode(d, junk, len + 100, &all, &img));
    CHECK_OK(dsrt_decode(d, junk, len + 100, &top, &img));
    CHECK_FAILS(dsrt_decode(s, junk, len + 100, &all, &img), DSRT_ECORRUPT);
    CHECK_FAILS(dsrt_decode(s, junk, len + 100, &top, &img), DSRT_ECORRUPT);
    CHECK_CONTAINS(dsrt_last_error(), "extraneous bytes before marker 0xd9");
    free(junk);

    /* A second scan in a single-scan image, after the first. */
    size_t sos = find_marker(jpeg, len, 0xda);
    REQUIRE(sos > 0);
    size_t seg = 2 + ((size_t)jpeg[sos + 2] << 8 | jpeg[sos + 3]);
    uint8_t *two = malloc(len + seg + 16);
    REQUIRE(two);
    memcpy(two, jpeg, len - 2);
    memcpy(two + len - 2, jpeg + sos, seg);
    memset(two + len - 2 + seg, 0, 16);
    memcpy(two + len - 2 + seg + 14, "\xff\xd9", 2);
    size_t two_len = len - 2 + seg + 16;
    corpus("second-scan.jpg", two, two_len);
    dsrt__clear_error();
    int whole_rc = dsrt_decode(d, two, two_len, &all, &img);
    char whole_msg[256];
    snprintf(whole_msg, sizeof whole_msg, "%s", dsrt_last_error());
    CHECK_LT(whole_rc, 0);
    CHECK_FAILS(dsrt_decode(d, two, two_len, &top, &img), whole_rc);
    CHECK_STR_EQ(dsrt_last_error(), whole_msg);
    free(two);

    /* The decoders go on. */
    CHECK_OK(dsrt_decode_begin(d, jpeg, len, &info));
    CHECK_OK(dsrt_decode_finish(d, &top, &img, NULL));
    CHECK_EQ(img.height, 40);
    CHECK_OK(dsrt_decode(s, jpeg, len, &top, &img));
    free(jpeg);
    dsrt_decoder_destroy(s);
    dsrt_decoder_destroy(d);
}

/* begin and finish used wrongly; bad regions and flags. */
static void test_begin_finish(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    size_t len, len2;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_444, 64, 48, 3, &len);
    uint8_t *other = timg_make_jpeg(TIMG_JPEG_GRAY, 20, 10, 4, &len2);
    REQUIRE(jpeg && other);
    dsrt_decode_request r = request(3, 0, 0);
    dsrt_image img;
    dsrt_image_info info;
    CHECK_FAILS(dsrt_decode_finish(d, &r, &img, NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "no image begun");
    /* A second begin drops the first; a finish closes the image. */
    CHECK_OK(dsrt_decode_begin(d, jpeg, len, &info));
    CHECK_OK(dsrt_decode_begin(d, other, len2, &info));
    CHECK_EQ(info.width, 20);
    CHECK_OK(dsrt_decode_finish(d, &r, &img, NULL));
    CHECK_EQ(img.width, 20);
    CHECK_FAILS(dsrt_decode_finish(d, &r, &img, NULL), DSRT_EOPTION);
    /* Bad requests fail and close the image. */
    int bad[][5] = {
        {-1, 0, 1, 1, 0}, {0, 0, -2, 1, 0}, {64, 0, 1, 1, 0}, {0, 48, 1, 1, 0}, {0, 0, 1, 1, 2}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bad); k++) {
        CHECK_OK(dsrt_decode_begin(d, jpeg, len, &info));
        dsrt_decode_request b = r;
        b.region_x = bad[k][0], b.region_y = bad[k][1];
        b.region_width = bad[k][2], b.region_height = bad[k][3];
        b.allow_gray = bad[k][4];
        CHECK_FAILS(dsrt_decode_finish(d, &b, &img, NULL), DSRT_EOPTION);
        CHECK_FAILS(dsrt_decode_finish(d, &r, &img, NULL), DSRT_EOPTION);
    }
    /* A region reaching past the image is cut to it. */
    r.region_x = 60, r.region_y = 40, r.region_width = 100, r.region_height = 100;
    dsrt_window win;
    CHECK_OK(dsrt_decode_begin(d, jpeg, len, &info));
    CHECK_OK(dsrt_decode_finish(d, &r, &img, &win));
    CHECK_EQ(win.x0 + img.width, 64);
    CHECK_EQ(win.y0 + img.height, 48);
    /* A bad file fails at begin, and finish then has nothing. */
    CHECK_FAILS(dsrt_decode_begin(d, jpeg, 10, &info), DSRT_ETRUNCATED);
    CHECK_FAILS(dsrt_decode_finish(d, &r, &img, NULL), DSRT_EOPTION);
    check_still_works(d, jpeg, len, TIMG_JPEG_444);
    free(jpeg);
    free(other);
    dsrt_decoder_destroy(d);
}

/* allow_gray: gray files stay gray (the same bytes as a gray decode, whose
 * replication is the RGB decode); colour files and 16-bit gray PNGs do not. */
static void test_allow_gray(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    struct {
        int jpeg, kind, stays;
    } cases[] = {
        {1, TIMG_JPEG_GRAY, 1},  {1, TIMG_JPEG_420, 0},  {1, TIMG_JPEG_CMYK, 0},
        {0, TIMG_PNG_GRAY8, 1},  {0, TIMG_PNG_GRAY1, 1}, {0, TIMG_PNG_GRAY4_INTERLACED, 1},
        {0, TIMG_PNG_GRAY16, 0}, {0, TIMG_PNG_RGB8, 0},  {0, TIMG_PNG_GA8, 0},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        size_t len;
        uint8_t *buf = cases[k].jpeg ? timg_make_jpeg(cases[k].kind, 61, 37, 9, &len)
                                     : timg_make_png(cases[k].kind, 61, 37, 9, &len, NULL);
        REQUIRE(buf);
        size_t n = 61 * 37;
        dsrt_decode_request r = request(3, 0, 0);
        dsrt_image img;
        CHECK_OK(dsrt_decode(d, buf, len, &r, &img));
        uint8_t *rgb = malloc(n * 3);
        REQUIRE(rgb);
        memcpy(rgb, img.data, n * 3);
        r.allow_gray = 1;
        CHECK_OK(dsrt_decode(d, buf, len, &r, &img));
        CHECK_EQ(img.channels, cases[k].stays ? 1 : 3);
        if (cases[k].stays) {
            CHECK_EQ(img.stride, (size_t)61);
            long bad = 0;
            for (size_t i = 0; i < n; i++)
                for (int c = 0; c < 3; c++) bad += img.data[i] != rgb[3 * i + c];
            CHECK_EQ(bad, 0);
        } else {
            CHECK_EQ(first_diff(img.data, rgb, n * 3), -1);
        }
        free(rgb);
        free(buf);
    }
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// 1/8 scale from the DC terms

/* Decodes at 1/8 with dc_eighth 0 and 1 and compares: the luma (ch 1), and
 * RGB when exact (no chroma subsampling, or chroma constant over each MCU),
 * must be equal; else RGB only near libjpeg's (a mean of 24 levels: these
 * test patterns change colour every few pixels, so the chroma's resolution
 * shows; on photos the mean is about 2). Returns the dc decode's code,
 * having checked that it is libjpeg's too. */
static int check_dc(dsrt_decoder *d, const uint8_t *jpeg, size_t len, int ch, int exact,
                    const char *what) {
    dsrt_image_info info;
    int rc = dsrt_decoder_info(d, jpeg, len, &info);
    if (rc != 0) return rc;
    dsrt_decode_request r = request(ch, (info.width + 7) / 8, (info.height + 7) / 8);
    dsrt_image a, b;
    int rc0 = dsrt_decode(d, jpeg, len, &r, &a);
    size_t n = rc0 == 0 ? a.stride * (size_t)a.height : 0;
    uint8_t *ref = malloc(n ? n : 1);
    REQUIRE(ref);
    if (n) memcpy(ref, a.data, n);
    r.dc_eighth = 1;
    int rc1 = dsrt_decode(d, jpeg, len, &r, &b);
    if (rc1 != rc0)
        fprintf(stderr, "%s ch %d: dc_eighth gives %d, libjpeg %d\n", what, ch, rc1, rc0);
    CHECK_EQ(rc1, rc0);
    if (rc0 == 0 && rc1 == 0) {
        CHECK_EQ(b.width, a.width);
        CHECK_EQ(b.height, a.height);
        CHECK_EQ(b.channels, a.channels);
        if (ch == 1 || exact) {
            long at = first_diff(b.data, ref, n);
            if (at >= 0)
                fprintf(stderr, "%s ch %d: byte %ld: %d, libjpeg %d\n", what, ch, at, b.data[at],
                        ref[at]);
            CHECK_EQ(at, -1);
        } else {
            double sad = 0;
            for (size_t i = 0; i < n; i++) sad += abs((int)b.data[i] - (int)ref[i]);
            if (sad / (double)n > 24.0)
                fprintf(stderr, "%s: mean difference %.2f\n", what, sad / (double)n);
            CHECK(sad / (double)n <= 24.0);
        }
    }
    free(ref);
    return rc1;
}

/* Every kind and size the other tests use, and the layouts libjpeg writes
 * that TurboJPEG does not: odd sampling factors, restart markers (also with
 * a progressive file), colour constant over each MCU (where 4:2:0 is exact). */
static void test_dc_eighth(void) {
    static const int sizes[][2] = {{37, 23}, {1, 1}, {17, 100}, {333, 2}, {641, 479}, {64, 64}};
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (int kind = 0; kind < TIMG_JPEG_KINDS; kind++) {
        for (size_t s = 0; s < DSRT_ARRAY_SIZE(sizes); s++) {
            size_t len;
            uint8_t *jpeg = timg_make_jpeg(kind, sizes[s][0], sizes[s][1], (uint32_t)s, &len);
            REQUIRE(jpeg);
            int exact = kind == TIMG_JPEG_GRAY || kind == TIMG_JPEG_444 || kind == TIMG_JPEG_CMYK;
            for (int ch = 1; ch <= 3; ch += 2)
                CHECK_OK(check_dc(d, jpeg, len, ch, exact, timg_jpeg_kind_name(kind)));
            free(jpeg);
        }
    }
    static const int samplings[][3][2] = {
        {{1, 1}, {1, 1}, {1, 1}}, {{2, 2}, {1, 1}, {1, 1}}, {{2, 1}, {1, 1}, {1, 1}},
        {{2, 2}, {2, 1}, {1, 1}}, {{1, 2}, {1, 1}, {1, 2}}, {{4, 1}, {1, 1}, {1, 1}},
    };
    int w = 211, h = 75;
    uint8_t *rgb = malloc((size_t)w * h * 3), *flat = malloc((size_t)w * h * 3);
    REQUIRE(rgb && flat);
    timg_pattern(rgb, w, h, 3, 5);
    for (int y = 0; y < h; y++) /* constant over 32 x 32 tiles: DC-only chroma */
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                flat[((size_t)y * w + x) * 3 + c] =
                    (uint8_t)timg_hash((uint32_t)((y / 32) * 97 + (x / 32) * 13 + c));
    int tested = 0;
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(samplings); i++) {
        for (int variant = 0; variant < 6; variant++) {
            int restart = variant % 3, progressive = variant >= 3;
            for (int pic = 0; pic < 2; pic++) {
                size_t len;
                uint8_t *jpeg = jpeg_with_sampling(pic ? flat : rgb, w, h, samplings[i], restart,
                                                   progressive, &len);
                if (!jpeg) break;
                tested++;
                char what[96];
                snprintf(what, sizeof what, "sampling %zu restart %d progressive %d %s", i, restart,
                         progressive, pic ? "flat" : "pattern");
                int exact = i == 0 || pic;
                for (int ch = 1; ch <= 3; ch += 2)
                    CHECK_OK(check_dc(d, jpeg, len, ch, exact, what));
                free(jpeg);
            }
        }
    }
    if (!tested) fprintf(stderr, "libjpeg.so.62 not found: libjpeg's layouts not tested\n");
    free(rgb);
    free(flat);
    dsrt_decoder_destroy(d);
}

/* Damaged files: whatever the DC decoder does not take goes to libjpeg, so
 * every outcome (the code; the luma) is libjpeg's: files cut at many
 * lengths, and bytes of the entropy-coded data changed. */
static void test_dc_eighth_damaged(void) {
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    static const int kinds[] = {TIMG_JPEG_420, TIMG_JPEG_PROGRESSIVE, TIMG_JPEG_GRAY};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(kinds); k++) {
        size_t len;
        uint8_t *jpeg = timg_make_jpeg(kinds[k], 120, 88, 3, &len);
        REQUIRE(jpeg);
        const char *name = timg_jpeg_kind_name(kinds[k]);
        for (size_t cut = 2; cut < len; cut += 1 + cut / 16) {
            int rc = check_dc(d, jpeg, cut, 1, 1, name);
            CHECK(rc != 0 || cut >= len - 2); /* only the end-of-image marker may go */
        }
        size_t sos = find_marker(jpeg, len, 0xda);
        REQUIRE(sos);
        uint8_t *bad = malloc(len);
        REQUIRE(bad);
        for (uint32_t t = 0; t < 200; t++) {
            memcpy(bad, jpeg, len);
            size_t at = sos + 16 + timg_hash(t * 3 + (uint32_t)k) % (len - sos - 18);
            bad[at] = (uint8_t)timg_hash(t * 7 + 1);
            check_dc(d, bad, len, 1, 1, name);
        }
        free(bad);
        free(jpeg);
    }
    dsrt_decoder_destroy(d);
}

// ----------------------------------------------------------------------------
// Hostile files at 1/8: exactly what a fresh libjpeg says

/* What a decode at 1/8 gave: its code, its message, its pixels. */
typedef struct {
    int rc;
    char msg[512];
    uint8_t *px; /* (n) */
    size_t n;
} outcome;

static void decode_eighth(dsrt_decoder *d, const uint8_t *buf, size_t len, int ch, int dc,
                          outcome *o) {
    dsrt_decode_request r = request(ch, 1, 1);
    r.dc_eighth = dc;
    dsrt_image img;
    dsrt__clear_error();
    o->rc = dsrt_decode(d, buf, len, &r, &img);
    snprintf(o->msg, sizeof o->msg, "%s", o->rc ? dsrt_last_error() : "");
    o->n = o->rc ? 0 : img.stride * (size_t)img.height;
    o->px = malloc(o->n ? o->n : 1);
    REQUIRE(o->px);
    if (o->n) memcpy(o->px, img.data, o->n);
}

/* Compares a with b (the reference): the code, the message, and the
 * pixels when exact. */
static void check_same(const outcome *a, const outcome *b, int exact, const char *what) {
    if (a->rc != b->rc || strcmp(a->msg, b->msg) != 0)
        fprintf(stderr, "%s: %d (%s), libjpeg alone %d (%s)\n", what, a->rc, a->msg, b->rc, b->msg);
    CHECK_EQ(a->rc, b->rc);
    CHECK_STR_EQ(a->msg, b->msg);
    if (a->rc == 0 && b->rc == 0 && exact) {
        CHECK_EQ(a->n, b->n);
        long at = first_diff(a->px, b->px, DSRT_MIN(a->n, b->n));
        if (at >= 0)
            fprintf(stderr, "%s: byte %ld: %d, libjpeg %d\n", what, at, a->px[at], b->px[at]);
        CHECK_EQ(at, -1);
    }
}

/* Decodes buf at 1/8 from the DC terms with d (which may have decoded
 * other files before) and checks the outcome against libjpeg's 1/8 decode
 * in a fresh decoder: the same code and message, and the same luma (ch 1),
 * or RGB when exact. Leaves dsrt_last_error() to d's decode; returns its
 * code. */
static int check_dc_fresh(dsrt_decoder *d, const uint8_t *buf, size_t len, int ch, int exact,
                          const char *what) {
    dsrt_decoder *f;
    REQUIRE(dsrt_decoder_create(&f, NULL) == 0);
    outcome ref, got;
    decode_eighth(f, buf, len, ch, 0, &ref);
    dsrt_decoder_destroy(f);
    decode_eighth(d, buf, len, ch, 1, &got);
    check_same(&got, &ref, ch == 1 || exact, what);
    if (got.rc) dsrt__fail(got.rc, "%s", got.msg);
    free(ref.px);
    free(got.px);
    return got.rc;
}

/* A copy of jpeg with seg inserted before its first scan header. */
static uint8_t *before_scan(const uint8_t *jpeg, size_t len, const uint8_t *seg, size_t n,
                            size_t *out_len) {
    size_t at, sn;
    REQUIRE(jk_find(jpeg, len, 0xda, 0, &at, &sn) == 0);
    uint8_t *o = jk_splice(jpeg, len, at, 0, seg, n, out_len);
    REQUIRE(o);
    return o;
}

/* A DHT segment of one table with counts codes of each length, values
 * 0, 1, 2 ... (or first + i), inserted before the first scan. */
static uint8_t *with_table(const uint8_t *jpeg, size_t len, int cls, int id,
                           const uint8_t counts[16], size_t *out_len) {
    uint8_t vals[256];
    for (int i = 0; i < 256; i++) vals[i] = (uint8_t)(cls ? i : i % 12);
    size_t n;
    uint8_t *seg = jk_dht(cls, id, counts, vals, &n);
    REQUIRE(seg);
    uint8_t *o = before_scan(jpeg, len, seg, n, out_len);
    free(seg);
    return o;
}

/* Huffman tables with more codes of a length than fit: libjpeg's header
 * reader takes them, and libjpeg refuses one when a scan uses it ("Bogus
 * Huffman table definition"). The DC decoder must neither write past its
 * tables (3 codes of length 1 in the last table ran over into the
 * decoder's own pointers, so the next image crashed; 255 wrote about 520 KB
 * past them) nor decode what libjpeg refuses. */
static void test_dc_huffman_overfull(void) {
    size_t len, n;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_444, 48, 40, 3, &len);
    REQUIRE(jpeg);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    /* Table AC 3, which no scan uses: the file is good. */
    uint8_t three[16] = {3};
    uint8_t *bad = with_table(jpeg, len, 1, 3, three, &n);
    corpus("overfull-unused.jpg", bad, n);
    CHECK_EQ(check_dc_fresh(d, bad, n, 1, 1, "unused over-full table"), 0);
    CHECK_EQ(check_dc_fresh(d, jpeg, len, 3, 1, "the next image"), 0);
    free(bad);
    /* Tables the scan uses: one code of each length below l, then more at
     * l than the rest of the code space holds. */
    static const uint8_t used[][4] = {
        {1, 0, 1, 255}, {0, 0, 1, 3}, {1, 1, 2, 3},   {0, 1, 3, 5},
        {1, 0, 11, 3},  {0, 0, 9, 3}, {1, 0, 8, 200}, {1, 0, 16, 3},
    }; /* class, id, l, codes of length l */
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(used); k++) {
        uint8_t counts[16] = {0};
        int l = used[k][2];
        for (int i = 0; i < l - 1; i++) counts[i] = 1;
        counts[l - 1] = used[k][3];
        bad = with_table(jpeg, len, used[k][0], used[k][1], counts, &n);
        char what[64];
        snprintf(what, sizeof what, "over-full table %d/%d: %d codes of length %d", used[k][0],
                 used[k][1], used[k][3], l);
        corpus("overfull.jpg", bad, n);
        for (int ch = 1; ch <= 3; ch += 2) {
            CHECK_EQ(check_dc_fresh(d, bad, n, ch, 1, what), DSRT_ECORRUPT);
            CHECK_CONTAINS(dsrt_last_error(), "Bogus Huffman table definition");
        }
        CHECK_EQ(check_dc_fresh(d, jpeg, len, 3, 1, "the next image"), 0);
        free(bad);
    }
    /* Full but not over-full: 2^l - 1 codes of a length (no all-ones code)
     * are taken. */
    uint8_t full[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    bad = with_table(jpeg, len, 1, 0, full, &n);
    check_dc_fresh(d, bad, n, 1, 1, "a complete table");
    free(bad);
    dsrt_decoder_destroy(d);
    free(jpeg);
}

/* libjpeg refuses an interleaved scan of more than 10 blocks an MCU
 * ("Sampling factors too large for interleaved scan"), though its frame
 * reader takes every sampling factor up to 4x4; one-component scans of such
 * a frame are fine. The DC decoder's zero padding after a scan's data
 * covers one MCU of 10 blocks: with 48, a scan whose codes are long (one
 * AC code of 16 bits and a 15-bit value a term) read about 12 KB past it. */
static void test_dc_mcu_blocks(void) {
    size_t mlen, n;
    uint8_t *model = timg_make_jpeg(TIMG_JPEG_420, 16, 16, 1, &mlen);
    REQUIRE(model);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    static const struct {
        int samp[3][2], interleave, blocks;
    } cases[] = {
        {{{4, 4}, {4, 4}, {4, 4}}, 1, 48}, {{{4, 4}, {4, 4}, {4, 4}}, 0, 1},
        {{{3, 3}, {1, 1}, {1, 1}}, 1, 11}, {{{2, 4}, {1, 1}, {1, 1}}, 1, 10},
        {{{4, 2}, {2, 2}, {1, 1}}, 2, 5},  {{{1, 1}, {4, 4}, {2, 2}}, 2, 20},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        for (int progressive = 0; progressive < 2; progressive++) {
            jk_spec s = {.w = 70, .h = 45, .ncomp = 3, .ac_terms = 4};
            s.interleave = cases[k].interleave;
            s.progressive = progressive;
            s.restart = (int)k % 3;
            s.seed = (uint32_t)k;
            memcpy(s.samp, cases[k].samp, sizeof s.samp);
            uint8_t *jpeg = jk_synth(&s, model, mlen, &n);
            REQUIRE(jpeg);
            char what[64];
            snprintf(what, sizeof what, "%d blocks an MCU%s", cases[k].blocks,
                     progressive ? ", progressive" : "");
            corpus("mcu-blocks.jpg", jpeg, n);
            int rc = check_dc_fresh(d, jpeg, n, 1, 1, what);
            if (cases[k].blocks > 10) {
                CHECK_EQ(rc, DSRT_ECORRUPT);
                CHECK_CONTAINS(dsrt_last_error(), "Sampling factors too large");
            } else {
                CHECK_EQ(rc, 0);
            }
            free(jpeg);
        }
    }
    /* One MCU of 48 blocks, one byte of data, codes of 31 bits a term. */
    jk_spec s = {.w = 32, .h = 32, .ncomp = 3, .samp = {{4, 4}, {4, 4}, {4, 4}}, .interleave = 1};
    uint8_t *jpeg = jk_synth(&s, model, mlen, &n);
    REQUIRE(jpeg);
    uint8_t *t = jk_without(jpeg, n, 0xc4, &n);
    free(jpeg);
    uint8_t dc[16] = {1}, ac[16] = {0}, dcv[1] = {0}, acv[1] = {0x0f};
    ac[15] = 1;
    size_t n1, n2;
    uint8_t *s1 = jk_dht(0, 0, dc, dcv, &n1), *s2 = jk_dht(1, 0, ac, acv, &n2);
    REQUIRE(s1 && s2);
    uint8_t *t1 = before_scan(t, n, s1, n1, &n);
    uint8_t *t2 = before_scan(t1, n, s2, n2, &n);
    /* The scan's data: one zero byte, then the end of the image. */
    size_t sos, sosn;
    REQUIRE(jk_find(t2, n, 0xda, 0, &sos, &sosn) == 0);
    size_t cut = sos + sosn;
    uint8_t *long_codes = jk_splice(t2, n, cut, n - cut, "\x00\xff\xd9", 3, &n);
    REQUIRE(long_codes);
    corpus("mcu-long-codes.jpg", long_codes, n);
    CHECK_EQ(check_dc_fresh(d, long_codes, n, 1, 1, "48 blocks of long codes"), DSRT_ECORRUPT);
    free(long_codes);
    free(t2);
    free(t1);
    free(s1);
    free(s2);
    free(t);
    dsrt_decoder_destroy(d);
    free(model);
}

/* A progressive AC scan naming a Huffman table the file never defines:
 * libjpeg refuses it ("Huffman table 0x02 was not defined"), though the DC
 * decoder never reads that scan's data. Tables 0 and 1, which a fresh
 * libjpeg fills with the standard ones, give whatever libjpeg gives. */
static void test_dc_ac_scan_table(void) {
    size_t len;
    uint8_t *jpeg = timg_make_jpeg(TIMG_JPEG_PROGRESSIVE, 64, 48, 2, &len);
    REQUIRE(jpeg);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    int changed = 0;
    for (int table = 1; table <= 3; table++) {
        for (int k = 0;; k++) {
            size_t at, n;
            if (jk_find(jpeg, len, 0xda, k, &at, &n) != 0) break;
            int nc = jpeg[at + 4];
            if (jpeg[at + 5 + 2 * nc] == 0) continue; /* a DC scan */
            uint8_t *bad = malloc(len);
            REQUIRE(bad);
            memcpy(bad, jpeg, len);
            bad[at + 6] = (uint8_t)((bad[at + 6] & 0xf0) | table);
            if (bad[at + 6] == jpeg[at + 6]) {
                free(bad);
                continue;
            }
            changed++;
            char what[64];
            snprintf(what, sizeof what, "AC scan %d with table %d", k, table);
            corpus("ac-table.jpg", bad, len);
            int rc = check_dc_fresh(d, bad, len, 1, 1, what);
            if (table >= 2) {
                CHECK_EQ(rc, DSRT_ECORRUPT);
                CHECK_CONTAINS(dsrt_last_error(), "was not defined");
            }
            free(bad);
        }
    }
    CHECK_GT(changed, 0);
    dsrt_decoder_destroy(d);
    free(jpeg);
}

/*
 * Luma that is not the most sampled component: at 1/8 libjpeg scales a
 * component's inverse DCT up (2x2, 4x4) while its factors are half the
 * largest ones or less, so its luma then comes from AC terms too; where it
 * is not scaled up it is repeated, as the DC decoder repeats it. Every
 * file is decoded as libjpeg decodes it.
 */
static void test_dc_luma_idct(void) {
    static const int samplings[][3][2] = {
        {{1, 1}, {2, 2}, {2, 2}}, /* luma 2x2 from its AC terms */
        {{1, 1}, {4, 2}, {1, 1}}, /* 2x2 */
        {{1, 1}, {2, 1}, {2, 1}}, /* repeated 2x1 */
        {{1, 2}, {2, 2}, {1, 1}}, /* repeated 2x1 */
        {{1, 1}, {3, 1}, {1, 1}}, /* repeated 3x1 */
        {{1, 1}, {2, 4}, {1, 1}}, /* 2x2 */
        {{1, 1}, {1, 1}, {2, 2}}, /* 2x2 */
    };
    int w = 101, h = 67;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    REQUIRE(rgb);
    timg_pattern(rgb, w, h, 3, 41);
    dsrt_decoder *d;
    REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(samplings); i++) {
        for (int variant = 0; variant < 3; variant++) {
            size_t len;
            uint8_t *jpeg =
                jpeg_with_sampling(rgb, w, h, samplings[i], variant == 1, variant == 2, &len);
            if (!jpeg) {
                fprintf(stderr, "libjpeg.so.62 not found: luma scaled up not tested\n");
                break;
            }
            char what[64];
            snprintf(what, sizeof what, "sampling %zu variant %d", i, variant);
            corpus("luma-idct.jpg", jpeg, len);
            CHECK_OK(check_dc(d, jpeg, len, 1, 1, what));
            CHECK_OK(check_dc(d, jpeg, len, 3, 0, what));
            CHECK_OK(check_dc_fresh(d, jpeg, len, 1, 1, what));
            free(jpeg);
        }
    }
    dsrt_decoder_destroy(d);
    free(rgb);
}

/*
 * A decoder keeps one libjpeg decompressor, and libjpeg keeps the tables
 * an image defined for the next one (abbreviated streams): a JPEG without
 * its own quantisation or Huffman tables decoded with the last file's. So
 * every image must decode as in a fresh decoder, whatever came before:
 * B without tables after A (progressive: its last Huffman tables are not
 * the standard ones; another quality) gives what B alone gives (a fresh
 * libjpeg takes the standard Huffman tables for B without DHT, and refuses
 * B without DQT), at every scale, from the DC terms or not.
 */
static void test_decode_tables_alone(void) {
    int w = 64, h = 48;
    size_t alen, blen;
    uint8_t *a = timg_make_jpeg(TIMG_JPEG_PROGRESSIVE, w, h, 1, &alen);
    uint8_t *px = malloc((size_t)w * h * 3);
    REQUIRE(a && px);
    timg_pattern(px, w, h, 3, 9);
    uint8_t *b = timg_jpeg(px, w, h, TJPF_RGB, TJSAMP_420, 50, 0, &blen);
    REQUIRE(b);
    size_t n1, n2, n3;
    uint8_t *no_dht = jk_without(b, blen, 0xc4, &n1);
    uint8_t *no_dqt = jk_without(b, blen, 0xdb, &n2);
    uint8_t *none = jk_without(no_dht, n1, 0xdb, &n3);
    REQUIRE(no_dht && no_dqt && none);
    corpus("no-dht.jpg", no_dht, n1);
    corpus("no-dqt.jpg", no_dqt, n2);
    const struct {
        const uint8_t *buf;
        size_t len;
        const char *name;
        int rc;
    } bs[] = {{no_dht, n1, "no DHT", 0},
              {no_dqt, n2, "no DQT", DSRT_ECORRUPT},
              {none, n3, "no tables", DSRT_ECORRUPT}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(bs); k++) {
        for (int mode = 0; mode < 4; mode++) {
            int ch = mode & 1 ? 3 : 1, min = mode & 2 ? 0 : 1;
            for (int dc = 0; dc < 2; dc++) {
                dsrt_decode_request r = request(ch, min, min);
                r.dc_eighth = dc;
                outcome alone, after;
                dsrt_decoder *f, *d;
                REQUIRE(dsrt_decoder_create(&f, NULL) == 0);
                REQUIRE(dsrt_decoder_create(&d, NULL) == 0);
                dsrt_image img;
                for (int step = 0; step < 2; step++) {
                    outcome *o = step ? &after : &alone;
                    if (step) CHECK_OK(dsrt_decode(d, a, alen, &r, &img));
                    dsrt__clear_error();
                    o->rc = dsrt_decode(step ? d : f, bs[k].buf, bs[k].len, &r, &img);
                    snprintf(o->msg, sizeof o->msg, "%s", o->rc ? dsrt_last_error() : "");
                    o->n = o->rc ? 0 : img.stride * (size_t)img.height;
                    o->px = malloc(o->n ? o->n : 1);
                    REQUIRE(o->px);
                    if (o->n) memcpy(o->px, img.data, o->n);
                }
                char what[96];
                snprintf(what, sizeof what, "%s after a progressive file, ch %d, %s, dc %d",
                         bs[k].name, ch, min ? "1/8" : "full size", dc);
                check_same(&after, &alone, 1, what);
                CHECK_EQ(alone.rc, bs[k].rc);
                free(alone.px);
                free(after.px);
                dsrt_decoder_destroy(f);
                dsrt_decoder_destroy(d);
            }
        }
    }
    /* Without DHT, a fresh libjpeg takes the standard tables, which are
     * TurboJPEG's own: the pixels are B's. */
    dsrt_decoder *f;
    REQUIRE(dsrt_decoder_create(&f, NULL) == 0);
    outcome with, without;
    decode_eighth(f, b, blen, 1, 0, &with);
    decode_eighth(f, no_dht, n1, 1, 0, &without);
    check_same(&without, &with, 1, "no DHT against B");
    free(with.px);
    free(without.px);
    dsrt_decoder_destroy(f);
    free(none);
    free(no_dqt);
    free(no_dht);
    free(b);
    free(px);
    free(a);
}

int main(void) {
    corpus_dir = getenv("DSRT_WRITE_CORPUS");
    if (corpus_dir && timg_mkdirs(corpus_dir) != 0) corpus_dir = NULL;
    RUN(test_color);
    RUN(test_detect_and_options);
    RUN(test_scale_choice);
    RUN(test_jpeg_kinds);
    RUN(test_jpeg_large);
    RUN(test_jpeg_odd_sampling);
    RUN(test_png_kinds);
    RUN(test_png_16bit_rule);
    RUN(test_png_write);
    RUN(test_empty_and_not_images);
    RUN(test_truncated_jpeg);
    RUN(test_truncated_png);
    RUN(test_corrupt);
    RUN(test_jpeg_warning);
    RUN(test_jpeg_unsupported);
    RUN(test_bombs);
    RUN(test_dst_too_small);
    RUN(test_scratch_reuse);
    RUN(test_regions);
    RUN(test_region_rest);
    RUN(test_dc_eighth);
    RUN(test_dc_eighth_damaged);
    RUN(test_dc_huffman_overfull);
    RUN(test_dc_mcu_blocks);
    RUN(test_dc_ac_scan_table);
    RUN(test_dc_luma_idct);
    RUN(test_decode_tables_alone);
    RUN(test_begin_finish);
    RUN(test_allow_gray);
    return TEST_RESULT();
}
