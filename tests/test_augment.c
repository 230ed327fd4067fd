/*
 * Tests of augmentation: every transform against a plain reference written
 * here (per output pixel, in double: the inverse map built step by step, then
 * Pillow's triangle filter for resizes or bilinear sampling with fill for
 * warps), flips and whole-pixel shifts exact, crops within bounds, the presets'
 * shapes and values, determinism by (seed, epoch, id) and not by decode scale,
 * the normalisation modes bit for bit, and option validation. Decoding only
 * what a sample reads (dsrt_augment_decode_request, a region decode,
 * dsrt_augment_apply_window) must write the bytes of the whole decode's
 * sample, and a gray image for RGB output the bytes of its replication.
 * Every kernel this CPU has (scalar, AVX2, AVX-512) writes the same bytes.
 *
 * Tolerances: resampled values are compared in [0, 255] pixel units; float
 * weights against the double reference differ by about 3e-5 (TOL 1e-3).
 */
#include <dsrt/augment.h>

#include "augment/internal.h"
#include "core/internal.h"
#include "task.h"
#include "testimg.h"

#define TOL 1e-3 /* pixel units, float kernels against the double reference */

// ----------------------------------------------------------------------------
// Images

typedef struct {
    dsrt_image img;
    uint8_t *buf;
} test_image;

/* Random bytes: every pixel differs from its neighbours, so any misplaced
 * pixel shows. */
static test_image image_random(int w, int h, int ch, uint64_t key) {
    test_image t;
    t.buf = malloc((size_t)w * h * ch);
    REQUIRE(t.buf);
    for (size_t i = 0; i < (size_t)w * h * ch; i++)
        t.buf[i] = (uint8_t)(dsrt__mix64(key * 1000003ULL + i) >> 56);
    t.img = (dsrt_image){t.buf, w, h, ch, (size_t)w * ch};
    return t;
}

/* A smooth picture: the same scene at any size (coordinates relative to the
 * size), so an image and its reduction look alike. */
static test_image image_smooth(int w, int h, int ch) {
    test_image t;
    t.buf = malloc((size_t)w * h * ch);
    REQUIRE(t.buf);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                double fx = (x + 0.5) / w, fy = (y + 0.5) / h;
                double v = 128 + 100 * sin(6.0 * fx + 2.0 * c) * cos(4.0 * fy - c);
                t.buf[((size_t)y * w + x) * ch + c] = (uint8_t)lround(v);
            }
    t.img = (dsrt_image){t.buf, w, h, ch, (size_t)w * ch};
    return t;
}

static void image_free(test_image *t) {
    free(t->buf);
}

static double px(const dsrt_image *im, int x, int y, int c) {
    return im->data[(size_t)y * im->stride + (size_t)x * im->channels + c];
}

// ----------------------------------------------------------------------------
// The reference

/* Output continuous coordinates (uc, vc) to decoded-image coordinates,
 * undoing each step of the documented forward order one after the other. */
static void ref_map(const dsrt_augment_options *o, int fw, int fh, int dw, int dh,
                    const dsrt_augment_params *p, double uc, double vc, double *x, double *y) {
    int ww = fw, wh = fh;
    if (o->resize_shorter > 0) {
        if (fw <= fh) {
            ww = o->resize_shorter;
            wh = (int)((double)o->resize_shorter * fh / fw);
        } else {
            wh = o->resize_shorter;
            ww = (int)((double)o->resize_shorter * fw / fh);
        }
    }
    double gx, gy;
    if (o->size_mode == DSRT_AUGMENT_RESIZE) {
        gx = uc * ww / o->output_width;
        gy = vc * wh / o->output_height;
    } else {
        gx = uc + p->crop_x;
        gy = vc + p->crop_y;
    }
    gx -= ww / 2.0 + p->x_translation;
    gy -= wh / 2.0 + p->y_translation;
    const double d2r = M_PI / 180.0;
    gy -= tan(p->y_shear * d2r) * gx; /* y' = y + tan(b) x */
    gx -= tan(p->x_shear * d2r) * gy; /* x' = x + tan(a) y */
    gx /= p->x_scale;
    gy /= p->y_scale;
    double c = cos(p->rotation * d2r), s = sin(p->rotation * d2r);
    double rx = c * gx - s * gy, ry = s * gx + c * gy; /* forward [c s; -s c] */
    if (p->x_reflect) rx = -rx;
    if (p->y_reflect) ry = -ry;
    *x = (rx + ww / 2.0) * dw / ww;
    *y = (ry + wh / 2.0) * dh / wh;
}

static double tri(double x) {
    x = fabs(x);
    return x < 1 ? 1 - x : 0;
}

/* Pillow's resampling along one axis at centre c with filter scale fs:
 * weights of the in-range pixels, normalised; returns the count. */
static int ref_taps(double c, double fs, int len, int *x0, double *w, int cap) {
    int a = (int)floor(c - fs + 0.5), b = (int)floor(c + fs + 0.5);
    if (a < 0) a = 0;
    if (b > len) b = len;
    REQUIRE(b - a <= cap);
    double sum = 0;
    for (int x = a; x < b; x++) sum += w[x - a] = tri((x + 0.5 - c) / fs);
    for (int x = a; x < b; x++) w[x - a] /= sum;
    *x0 = a;
    return b - a;
}

/* The separable reference: output (u, v, c) in pixel units. */
static double ref_separable(const dsrt_augment_options *o, int fw, int fh, const dsrt_image *im,
                            const dsrt_augment_params *p, int u, int v, int c) {
    double cx, cy, x1, y1, dummy;
    ref_map(o, fw, fh, im->width, im->height, p, u + 0.5, v + 0.5, &cx, &cy);
    ref_map(o, fw, fh, im->width, im->height, p, u + 1.5, v + 0.5, &x1, &dummy);
    ref_map(o, fw, fh, im->width, im->height, p, u + 0.5, v + 1.5, &dummy, &y1);
    if (!(cx >= 0 && cx < im->width && cy >= 0 && cy < im->height)) return o->fill_value[c];
    double fsx = fmax(fabs(x1 - cx), 1.0), fsy = fmax(fabs(y1 - cy), 1.0);
    double wx[512], wy[512];
    int ax, ay;
    int nx = ref_taps(cx, fsx, im->width, &ax, wx, 512);
    int ny = ref_taps(cy, fsy, im->height, &ay, wy, 512);
    double s = 0;
    for (int j = 0; j < ny; j++)
        for (int i = 0; i < nx; i++) s += wy[j] * wx[i] * px(im, ax + i, ay + j, c);
    return s;
}

/* The warp reference: bilinear at the mapped point, fill outside. */
static double ref_bilinear(const dsrt_augment_options *o, int fw, int fh, const dsrt_image *im,
                           const dsrt_augment_params *p, int u, int v, int c) {
    double x, y;
    ref_map(o, fw, fh, im->width, im->height, p, u + 0.5, v + 0.5, &x, &y);
    x -= 0.5;
    y -= 0.5;
    double x0 = floor(x), y0 = floor(y), ax = x - x0, ay = y - y0, s = 0;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 2; i++) {
            int xi = (int)x0 + i, yj = (int)y0 + j;
            double w = (i ? ax : 1 - ax) * (j ? ay : 1 - ay);
            double val = xi >= 0 && xi < im->width && yj >= 0 && yj < im->height ? px(im, xi, yj, c)
                                                                                 : o->fill_value[c];
            s += w * val;
        }
    return s;
}

/* Output value (u, v, c) of a sample in pixel units [0, 255], for float
 * output written with DSRT_AUGMENT_NORM_NONE or uint8 output. */
static double out_px(const dsrt_augment_options *o, const void *dst, int u, int v, int c) {
    int ow = o->output_width, oh = o->output_height, ch = o->output_channels;
    if (o->layout == DSRT_AUGMENT_F32_NCHW)
        return ((const float *)dst)[(size_t)c * ow * oh + (size_t)v * ow + u];
    return ((const uint8_t *)dst)[((size_t)v * ow + u) * ch + c];
}

typedef double (*ref_fn)(const dsrt_augment_options *, int, int, const dsrt_image *,
                         const dsrt_augment_params *, int, int, int);

/* Largest difference between dst and the reference over the sample. */
static double max_error(const dsrt_augment_options *o, int fw, int fh, const dsrt_image *im,
                        const dsrt_augment_params *p, const void *dst, ref_fn ref) {
    double worst = 0;
    for (int v = 0; v < o->output_height; v++)
        for (int u = 0; u < o->output_width; u++)
            for (int c = 0; c < o->output_channels; c++) {
                double e = fabs(out_px(o, dst, u, v, c) - ref(o, fw, fh, im, p, u, v, c));
                if (e > worst) worst = e;
            }
    return worst;
}

static dsrt_augment_params identity_params(void) {
    dsrt_augment_params p;
    memset(&p, 0, sizeof p);
    p.x_scale = p.y_scale = 1.0;
    return p;
}

static void *alloc_sample(const dsrt_augment_options *o) {
    void *d = malloc(dsrt_augment_sample_bytes(o));
    REQUIRE(d);
    return d;
}

// ----------------------------------------------------------------------------
// Options

static void expect_option_error(const dsrt_augment_options *o, const char *needle) {
    int rc = dsrt_augment_check(o);
    CHECK_EQ(rc, DSRT_EOPTION);
    if (rc == DSRT_EOPTION) CHECK_CONTAINS(dsrt_last_error(), needle);
}

static void test_options(void) {
    dsrt_augment_options d = dsrt_augment_defaults(), o;
    CHECK_OK(dsrt_augment_check(&d));
    CHECK_EQ(d.output_width, 224);
    CHECK_EQ(d.output_channels, 3);
    CHECK_EQ(dsrt_augment_sample_bytes(&d), 224 * 224 * 3 * 4);
    dsrt_augment_preset_227(&o);
    CHECK_OK(dsrt_augment_check(&o));
    dsrt_augment_preset_32(&o);
    CHECK_OK(dsrt_augment_check(&o));

    o = d, o.output_height = 0;
    expect_option_error(&o, "output_height: 0");
    o = d, o.output_width = -3;
    expect_option_error(&o, "output_width: -3");
    o = d, o.output_channels = 2;
    expect_option_error(&o, "output_channels: 2");
    o = d, o.size_mode = 7;
    expect_option_error(&o, "size_mode: 7");
    o = d, o.resize_shorter = -1;
    expect_option_error(&o, "resize_shorter: -1");
    o = d, o.rand_x_reflection = 2;
    expect_option_error(&o, "rand_x_reflection: 2");
    o = d, o.reflection_probability = 1.5;
    expect_option_error(&o, "reflection_probability: 1.5");
    o = d, o.rand_rotation[0] = 30, o.rand_rotation[1] = -30;
    expect_option_error(&o, "rand_rotation: [30, -30]: low is above high");
    o = d, o.rand_scale[0] = 0;
    expect_option_error(&o, "rand_scale: [0, 1]: outside [0.001, 1000]");
    o = d, o.rand_y_scale[0] = 2, o.rand_y_scale[1] = 1;
    expect_option_error(&o, "rand_y_scale: [2, 1]");
    o = d, o.rand_x_shear[1] = 90;
    expect_option_error(&o, "rand_x_shear: [0, 90]: outside [-89, 89]");
    o = d, o.rand_y_translation[0] = NAN;
    expect_option_error(&o, "rand_y_translation");
    o = d, o.rand_x_translation[0] = 0.2, o.rand_x_translation[1] = 0.8,
    o.translation_whole_pixels = 1;
    expect_option_error(&o, "rand_x_translation: [0.2, 0.8]: holds no whole number");
    o = d, o.fill_value[1] = 300;
    expect_option_error(&o, "fill_value[1]: 300");
    o = d, o.layout = DSRT_AUGMENT_U8_NHWC;
    expect_option_error(&o, "norm: 1: uint8 output");
    o = d, o.norm = DSRT_AUGMENT_NORM_ZSCORE, o.std[2] = 0;
    expect_option_error(&o, "std[2]: 0");
    o = d, o.decode_oversample = 0.5;
    expect_option_error(&o, "decode_oversample: 0.5");
    o = d, o.decode_dc = 2;
    expect_option_error(&o, "decode_dc: 2");

    /* apply refuses them too, and an image of the wrong channel count (a
     * gray one for RGB output is replicated: see test_gray_replicated). */
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(8, 8, 3, 1);
    o = d, o.output_width = o.output_height = 8, o.output_channels = 1;
    float *dst = alloc_sample(&d);
    CHECK_EQ(dsrt_augment_apply(a, &o, &t.img, 8, 8, 1, 0, 0, dst), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "3 channel(s), output_channels is 1");
    o.output_channels = 3;
    o.rand_rotation[0] = 5;
    CHECK_EQ(dsrt_augment_apply(a, &o, &t.img, 8, 8, 1, 0, 0, dst), DSRT_EOPTION);
    CHECK_EQ(dsrt_augment_apply(a, &d, &t.img, 0, 8, 1, 0, 0, dst), DSRT_EOPTION);
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
    dsrt_augmenter_destroy(NULL);
}

/* What dsrt_augment_check accepts never fails at a sample: the random
 * transforms at the ends of their ranges, together, on images from 1 x 1 to
 * 3000 pixels long, decoded as small as dsrt_augment_decode_size allows,
 * into outputs of 1 x 1 and 224 x 224; a hair beyond a range is refused. */
static void test_limits_hold(void) {
    const double s0 = DSRT_AUGMENT_SCALE_MIN, s1 = DSRT_AUGMENT_SCALE_MAX,
                 sh = DSRT_AUGMENT_SHEAR_MAX, rot = DSRT_AUGMENT_ROTATION_MAX,
                 tr = DSRT_AUGMENT_TRANSLATION_MAX;
    dsrt_augment_options cases[8];
    for (int k = 0; k < 8; k++) cases[k] = dsrt_augment_defaults();
    cases[0].rand_scale[0] = cases[0].rand_scale[1] = s0;
    cases[1].rand_scale[0] = cases[1].rand_scale[1] = s1;
    cases[2].rand_x_scale[0] = cases[2].rand_x_scale[1] = s0;
    cases[2].rand_y_scale[0] = cases[2].rand_y_scale[1] = s1;
    cases[3].rand_x_scale[0] = cases[3].rand_x_scale[1] = s1;
    cases[3].rand_y_scale[0] = cases[3].rand_y_scale[1] = s0;
    cases[3].rand_x_shear[0] = cases[3].rand_x_shear[1] = sh;
    cases[3].rand_y_shear[0] = cases[3].rand_y_shear[1] = sh;
    cases[3].rand_rotation[0] = cases[3].rand_rotation[1] = 45;
    cases[4].rand_x_shear[0] = cases[4].rand_y_shear[0] = -sh;
    cases[4].rand_x_shear[1] = cases[4].rand_y_shear[1] = sh;
    cases[4].rand_rotation[0] = -rot, cases[4].rand_rotation[1] = rot;
    cases[4].rand_scale[0] = s0, cases[4].rand_scale[1] = s1;
    cases[5].rand_x_translation[0] = cases[5].rand_y_translation[0] = -tr;
    cases[5].rand_x_translation[1] = cases[5].rand_y_translation[1] = tr;
    cases[5].translation_units = DSRT_AUGMENT_UNITS_OUTPUT;
    cases[5].resize_shorter = 65535;
    cases[6].decode_oversample = 64;
    cases[6].rand_scale[0] = cases[6].rand_scale[1] = s1;
    cases[7].resize_shorter = 65535;
    cases[7].size_mode = DSRT_AUGMENT_RANDCROP;
    cases[7].rand_scale[0] = cases[7].rand_scale[1] = s0;
    static const int sizes[][2] = {{1, 1}, {3000, 2}, {2, 3000}, {640, 480}};
    static const int outs[] = {1, 224};
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    int failed = 0, runs = 0;
    for (int k = 0; k < 8; k++)
        for (int z = 0; z < 4; z++)
            for (int q = 0; q < 2; q++) {
                dsrt_augment_options o = cases[k];
                o.output_height = o.output_width = outs[q];
                CHECK_OK(dsrt_augment_check(&o));
                int fw = sizes[z][0], fh = sizes[z][1], dw, dh;
                dsrt_augment_decode_size(&o, fw, fh, &dw, &dh);
                test_image t = image_random(dw, dh, 3, (uint64_t)(k * 16 + z));
                void *dst = alloc_sample(&o);
                for (uint64_t id = 0; id < 3; id++, runs++)
                    if (dsrt_augment_apply(a, &o, &t.img, fw, fh, 5, 0, id, dst) != 0) {
                        if (failed++ < 5)
                            fprintf(stderr, "  case %d, %dx%d -> %d: %s\n", k, fw, fh, outs[q],
                                    dsrt_last_error());
                    }
                free(dst);
                image_free(&t);
            }
    CHECK_EQ(failed, 0);
    fprintf(stderr, "  %d samples at the limits, none failed\n", runs);
    dsrt_augmenter_destroy(a);

    dsrt_augment_options d = dsrt_augment_defaults(), o;
    o = d, o.rand_scale[0] = s0 * 0.999;
    expect_option_error(&o, "rand_scale: [0.000999, 1]: outside [0.001, 1000]");
    o = d, o.rand_x_scale[1] = s1 * 1.001;
    expect_option_error(&o, "rand_x_scale");
    o = d, o.rand_y_scale[0] = o.rand_y_scale[1] = 1e-9;
    expect_option_error(&o, "rand_y_scale: [1e-09, 1e-09]");
    o = d, o.rand_y_shear[0] = -89.01;
    expect_option_error(&o, "rand_y_shear: [-89.01, 0]: outside [-89, 89]");
    o = d, o.rand_x_translation[1] = 1.5e6;
    expect_option_error(&o, "rand_x_translation");
}

// ----------------------------------------------------------------------------
// Exact transforms: identity, flips, whole-pixel translation, crops

static void test_identity_exact(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    for (int ch = 1; ch <= 3; ch += 2) {
        test_image t = image_random(23, 17, ch, 2);
        dsrt_augment_options o = dsrt_augment_defaults();
        o.output_width = 23, o.output_height = 17, o.output_channels = ch;
        o.norm = DSRT_AUGMENT_NORM_NONE;
        float *f = alloc_sample(&o);
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 23, 17, 5, 0, 0, f));
        int bad = 0;
        for (int y = 0; y < 17; y++)
            for (int x = 0; x < 23; x++)
                for (int c = 0; c < ch; c++) bad += out_px(&o, f, x, y, c) != px(&t.img, x, y, c);
        CHECK_EQ(bad, 0);
        o.layout = DSRT_AUGMENT_U8_NHWC;
        uint8_t *u = alloc_sample(&o);
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 23, 17, 5, 0, 0, u));
        CHECK_EQ(memcmp(u, t.buf, (size_t)23 * 17 * ch), 0);
        free(u);
        free(f);
        image_free(&t);
    }
    dsrt_augmenter_destroy(a);
}

static void test_flips_exact(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(19, 11, 3, 3);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 19, o.output_height = 11, o.norm = DSRT_AUGMENT_NORM_NONE;
    o.rand_x_reflection = o.rand_y_reflection = 1;
    o.reflection_probability = 1.0; /* always */
    for (int layout = 0; layout < 2; layout++) {
        o.layout = layout ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
        void *dst = alloc_sample(&o);
        for (int fx = 0; fx < 2; fx++)
            for (int fy = 0; fy < 2; fy++) {
                dsrt_augment_params p = identity_params();
                p.x_reflect = fx, p.y_reflect = fy;
                CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, 19, 11, &p, dst));
                int bad = 0;
                for (int y = 0; y < 11; y++)
                    for (int x = 0; x < 19; x++)
                        for (int c = 0; c < 3; c++)
                            bad += out_px(&o, dst, x, y, c) !=
                                   px(&t.img, fx ? 18 - x : x, fy ? 10 - y : y, c);
                CHECK_EQ(bad, 0);
            }
        /* Probability 1 draws both reflections. */
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 19, 11, 1, 2, 3, &p);
        CHECK_EQ(p.x_reflect, 1);
        CHECK_EQ(p.y_reflect, 1);
        free(dst);
    }
    /* Probability 0.5: about half of many samples, each axis on its own. */
    o.reflection_probability = 0.5;
    int nx = 0, ny = 0, both = 0;
    for (int id = 0; id < 4000; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 19, 11, 7, 0, id, &p);
        nx += p.x_reflect, ny += p.y_reflect, both += p.x_reflect && p.y_reflect;
    }
    CHECK(nx > 1850 && nx < 2150);
    CHECK(ny > 1850 && ny < 2150);
    CHECK(both > 850 && both < 1150);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

static void test_translation_exact(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(16, 12, 3, 4);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 16, o.output_height = 12, o.norm = DSRT_AUGMENT_NORM_NONE;
    o.fill_value[0] = 10, o.fill_value[1] = 20, o.fill_value[2] = 250;
    float *dst = alloc_sample(&o);
    const int shifts[][3] = {{3, -2, 0}, {-5, 4, 1}, {0, 0, 1}, {20, 0, 0}, {-15, -11, 1}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(shifts); k++) {
        dsrt_augment_params p = identity_params();
        p.x_translation = shifts[k][0], p.y_translation = shifts[k][1];
        p.x_reflect = shifts[k][2];
        CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, 16, 12, &p, dst));
        int bad = 0;
        for (int y = 0; y < 12; y++)
            for (int x = 0; x < 16; x++)
                for (int c = 0; c < 3; c++) {
                    /* reflect, then move the content by the shift */
                    int sx = x - shifts[k][0], sy = y - shifts[k][1];
                    if (p.x_reflect) sx = 15 - sx;
                    double want = sx >= 0 && sx < 16 && sy >= 0 && sy < 12 ? px(&t.img, sx, sy, c)
                                                                           : o.fill_value[c];
                    bad += out_px(&o, dst, x, y, c) != want;
                }
        CHECK_EQ(bad, 0);
    }
    /* Whole-pixel draws: integers, within the range, every value seen. */
    o.translation_whole_pixels = 1;
    o.rand_x_translation[0] = -3.5, o.rand_x_translation[1] = 2;
    int seen[7] = {0};
    for (int id = 0; id < 700; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 16, 12, 1, 0, id, &p);
        CHECK(p.x_translation == floor(p.x_translation));
        CHECK(p.x_translation >= -3 && p.x_translation <= 2);
        if (p.x_translation >= -3 && p.x_translation <= 2) seen[(int)p.x_translation + 3]++;
    }
    for (int i = 0; i < 6; i++) CHECK_GT(seen[i], 60);
    /* Continuous draws stay within the range and are not whole. */
    o.translation_whole_pixels = 0;
    int frac = 0;
    for (int id = 0; id < 100; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 16, 12, 1, 0, id, &p);
        CHECK(p.x_translation >= -3.5 && p.x_translation <= 2);
        frac += p.x_translation != floor(p.x_translation);
    }
    CHECK_GT(frac, 95);
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

static void test_crops(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(40, 30, 3, 5);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 24, o.output_height = 20, o.norm = DSRT_AUGMENT_NORM_NONE;
    o.size_mode = DSRT_AUGMENT_RANDCROP;
    float *dst = alloc_sample(&o);
    int hit_x[17] = {0}, hit_y[11] = {0};
    for (int id = 0; id < 600; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 40, 30, 9, 1, id, &p);
        CHECK(p.crop_x >= 0 && p.crop_x <= 16);
        CHECK(p.crop_y >= 0 && p.crop_y <= 10);
        if (p.crop_x >= 0 && p.crop_x <= 16) hit_x[p.crop_x]++;
        if (p.crop_y >= 0 && p.crop_y <= 10) hit_y[p.crop_y]++;
        if (id < 20) {
            CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 40, 30, 9, 1, id, dst));
            int bad = 0;
            for (int y = 0; y < 20; y++)
                for (int x = 0; x < 24; x++)
                    for (int c = 0; c < 3; c++)
                        bad +=
                            out_px(&o, dst, x, y, c) != px(&t.img, x + p.crop_x, y + p.crop_y, c);
            CHECK_EQ(bad, 0);
        }
    }
    for (int i = 0; i <= 16; i++) CHECK_GT(hit_x[i], 10); /* both ends reachable */
    for (int i = 0; i <= 10; i++) CHECK_GT(hit_y[i], 20);
    /* Centre crop: offset floor((W - w) / 2). */
    o.size_mode = DSRT_AUGMENT_CENTERCROP;
    o.output_width = 25, o.output_height = 21;
    dsrt_augment_params p;
    dsrt_augment_draw(&o, 40, 30, 9, 1, 0, &p);
    CHECK_EQ(p.crop_x, 7);
    CHECK_EQ(p.crop_y, 4);
    /* A crop larger than the image is centred, the rest filled. */
    o.output_width = 44, o.output_height = 31, o.fill_value[0] = 99;
    o.size_mode = DSRT_AUGMENT_RANDCROP;
    dsrt_augment_draw(&o, 40, 30, 9, 1, 0, &p);
    CHECK_EQ(p.crop_x, -2);
    CHECK_EQ(p.crop_y, -1);
    free(dst);
    dst = alloc_sample(&o);
    CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 40, 30, 9, 1, 0, dst));
    CHECK_EQ(out_px(&o, dst, 0, 5, 0), 99);
    CHECK_EQ(out_px(&o, dst, 43, 5, 0), 99);
    CHECK_EQ(out_px(&o, dst, 5, 0, 0), 99);
    CHECK_EQ(out_px(&o, dst, 2, 1, 1), px(&t.img, 0, 0, 1));
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

// ----------------------------------------------------------------------------
// Resampling against the reference

static void test_resize_reference(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    struct {
        int sw, sh, ow, oh, shorter, mode, ch;
    } cases[] = {
        {37, 23, 16, 11, 0, DSRT_AUGMENT_RESIZE, 3},     /* shrink, anisotropic */
        {13, 9, 29, 17, 0, DSRT_AUGMENT_RESIZE, 3},      /* enlarge */
        {120, 90, 11, 7, 0, DSRT_AUGMENT_RESIZE, 1},     /* strong shrink, gray */
        {50, 70, 30, 30, 40, DSRT_AUGMENT_RANDCROP, 3},  /* shorter side, random crop */
        {70, 50, 33, 33, 36, DSRT_AUGMENT_CENTERCROP, 3} /* shorter side, centre crop */
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        test_image t = image_random(cases[k].sw, cases[k].sh, cases[k].ch, 10 + k);
        dsrt_augment_options o = dsrt_augment_defaults();
        o.output_width = cases[k].ow, o.output_height = cases[k].oh;
        o.output_channels = cases[k].ch;
        o.resize_shorter = cases[k].shorter;
        o.size_mode = cases[k].mode;
        o.norm = DSRT_AUGMENT_NORM_NONE;
        o.rand_x_reflection = 1;
        float *dst = alloc_sample(&o);
        for (uint64_t id = 0; id < 3; id++) {
            dsrt_augment_params p;
            dsrt_augment_draw(&o, t.img.width, t.img.height, 3, 0, id, &p);
            CHECK_OK(dsrt_augment_apply(a, &o, &t.img, t.img.width, t.img.height, 3, 0, id, dst));
            double e = max_error(&o, t.img.width, t.img.height, &t.img, &p, dst, ref_separable);
            if (e > TOL) fprintf(stderr, "resize case %zu id %d: max error %g\n", k, (int)id, e);
            CHECK(e <= TOL);
        }
        free(dst);
        image_free(&t);
    }
    /* Fractional translation on the separable path, fill of 200. */
    test_image t = image_random(21, 15, 3, 30);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 21, o.output_height = 15, o.norm = DSRT_AUGMENT_NORM_NONE;
    o.fill_value[0] = o.fill_value[1] = o.fill_value[2] = 200;
    o.rand_x_translation[0] = -3, o.rand_x_translation[1] = 3;
    o.rand_y_translation[0] = -3, o.rand_y_translation[1] = 3;
    float *dst = alloc_sample(&o);
    for (uint64_t id = 0; id < 4; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 21, 15, 4, 0, id, &p);
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 21, 15, 4, 0, id, dst));
        CHECK(max_error(&o, 21, 15, &t.img, &p, dst, ref_separable) <= TOL);
    }
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

static void test_affine_reference(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(33, 27, 3, 40);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 33, o.output_height = 27, o.norm = DSRT_AUGMENT_NORM_NONE;
    o.fill_value[0] = 7, o.fill_value[1] = 77, o.fill_value[2] = 177;
    /* Maps that never shrink the source by more than 1 (no pre-filter). */
    struct {
        double rot, sx, sy, shx, shy, tx, ty;
        int fx, fy;
    } cases[] = {
        {17, 1, 1, 0, 0, 0, 0, 0, 0},           {-45, 1, 1, 0, 0, 0, 0, 1, 0},
        {90, 1, 1, 0, 0, 0, 0, 0, 0},           {0, 1.1, 1.0, 0, 0, 0, 0, 0, 0},
        {0, 1.25, 1.3, 10, 0, 0, 0, 0, 0},      {0, 1.3, 1.25, 0, -12, 0, 0, 0, 1},
        {23, 1.4, 1.2, 8, 6, 2.5, -3.25, 1, 1}, {-130, 1.05, 1.05, 0, 0, -4, 1.5, 0, 1},
    };
    float *dst = alloc_sample(&o);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        dsrt_augment_params p = identity_params();
        p.rotation = cases[k].rot, p.x_scale = cases[k].sx, p.y_scale = cases[k].sy;
        p.x_shear = cases[k].shx, p.y_shear = cases[k].shy;
        p.x_translation = cases[k].tx, p.y_translation = cases[k].ty;
        p.x_reflect = cases[k].fx, p.y_reflect = cases[k].fy;
        CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, 33, 27, &p, dst));
        ref_fn ref =
            (p.rotation == 0 && p.x_shear == 0 && p.y_shear == 0) ? ref_separable : ref_bilinear;
        double e = max_error(&o, 33, 27, &t.img, &p, dst, ref);
        if (e > TOL) fprintf(stderr, "affine case %zu: max error %g\n", k, e);
        CHECK(e <= TOL);
    }
    /* Rotation direction: +90 degrees turns the image counter-clockwise, so
     * the top middle of the output is the right middle of the source. */
    test_image sq = image_random(8, 8, 3, 41);
    o.output_width = o.output_height = 8;
    dsrt_augment_params p = identity_params();
    p.rotation = 90;
    CHECK_OK(dsrt_augment_apply_params(a, &o, &sq.img, 8, 8, &p, dst));
    for (int c = 0; c < 3; c++) CHECK_NEAR(out_px(&o, dst, 4, 0, c), px(&sq.img, 7, 4, c), 1e-3);
    /* uint8 output: rounded reference, within one level. */
    o.output_width = 33, o.output_height = 27, o.layout = DSRT_AUGMENT_U8_NHWC;
    uint8_t *u8 = alloc_sample(&o);
    p.rotation = 31, p.x_scale = 1.2, p.y_scale = 1.1, p.x_translation = 1.7;
    CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, 33, 27, &p, u8));
    CHECK(max_error(&o, 33, 27, &t.img, &p, u8, ref_bilinear) <= 0.5 + TOL);
    free(u8);
    free(dst);
    image_free(&sq);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

/* A warp that shrinks: the source is pre-filtered, so a pattern finer than
 * the output averages out instead of aliasing; a flat image stays flat. */
static void test_affine_antialias(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    int w = 240, h = 180;
    test_image t = image_random(w, h, 1, 50);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) t.buf[y * w + x] = ((x + y) & 1) ? 255 : 0;
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 48, o.output_height = 36, o.output_channels = 1;
    o.norm = DSRT_AUGMENT_NORM_NONE;
    o.fill_value[0] = 127.5f;
    float *dst = alloc_sample(&o);
    dsrt_augment_params p = identity_params();
    p.rotation = 10;
    CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, w, h, &p, dst));
    double worst = 0;
    for (int i = 0; i < 48 * 36; i++) worst = fmax(worst, fabs(dst[i] - 127.5));
    if (worst > 2) fprintf(stderr, "checkerboard: worst deviation %g\n", worst);
    CHECK(worst <= 2); /* without the pre-filter: up to 127.5 */
    memset(t.buf, 90, (size_t)w * h);
    o.fill_value[0] = 90;
    p.rotation = -33, p.x_scale = 0.8;
    CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, w, h, &p, dst));
    worst = 0;
    for (int i = 0; i < 48 * 36; i++) worst = fmax(worst, fabs(dst[i] - 90));
    CHECK(worst <= 1e-3);
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

/* The warp of a shrinking map against its reference: the source resized
 * (Pillow's filter) to the output's density, then sampled bilinearly; the
 * windows of the crop and zoom-out cases read only part of it. */
static void test_affine_prefilter_reference(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(120, 90, 3, 51);
    struct {
        int ow, oh, mode;
        double rot, scale, tx;
    } cases[] = {
        {40, 30, DSRT_AUGMENT_RESIZE, 20, 1.0, 7.5},      /* resize, 3x */
        {40, 40, DSRT_AUGMENT_CENTERCROP, 8, 0.5, -3.0},  /* zoom out 2x, a window */
        {30, 20, DSRT_AUGMENT_CENTERCROP, -60, 0.4, 0.0}, /* 2.5x */
        {16, 16, DSRT_AUGMENT_CENTERCROP, 5, 0.25, 200},  /* moved out of sight */
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        dsrt_augment_options o = dsrt_augment_defaults();
        o.output_width = cases[k].ow, o.output_height = cases[k].oh;
        o.size_mode = cases[k].mode;
        o.norm = DSRT_AUGMENT_NORM_NONE;
        o.fill_value[0] = 30, o.fill_value[1] = 60, o.fill_value[2] = 90;
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 120, 90, 0, 0, 0, &p); /* the centre crop's offset */
        p.rotation = cases[k].rot, p.x_scale = p.y_scale = cases[k].scale;
        p.x_translation = cases[k].tx;
        float *dst = alloc_sample(&o);
        CHECK_OK(dsrt_augment_apply_params(a, &o, &t.img, 120, 90, &p, dst));
        /* The map's linear part, and the shrunk size it asks for. */
        double x00, y00, x10, y10, x01, y01;
        ref_map(&o, 120, 90, 120, 90, &p, 0, 0, &x00, &y00);
        ref_map(&o, 120, 90, 120, 90, &p, 1, 0, &x10, &y10);
        ref_map(&o, 120, 90, 120, 90, &p, 0, 1, &x01, &y01);
        double fx = hypot(x10 - x00, x01 - x00), fy = hypot(y10 - y00, y01 - y00);
        int pw = fx > 1 + 1e-9 ? (int)lround(120 / fx) : 120;
        int ph = fy > 1 + 1e-9 ? (int)lround(90 / fy) : 90;
        CHECK(pw < 120 && ph < 90);
        double *shrunk = malloc(sizeof(double) * pw * ph * 3);
        REQUIRE(shrunk);
        double sx = 120.0 / pw, sy = 90.0 / ph, wx[512], wy[512];
        for (int y = 0; y < ph; y++)
            for (int x = 0; x < pw; x++) {
                int ax, ay;
                int nx = ref_taps((x + 0.5) * sx, fmax(sx, 1), 120, &ax, wx, 512);
                int ny = ref_taps((y + 0.5) * sy, fmax(sy, 1), 90, &ay, wy, 512);
                for (int c = 0; c < 3; c++) {
                    double v = 0;
                    for (int j = 0; j < ny; j++)
                        for (int i = 0; i < nx; i++)
                            v += wy[j] * wx[i] * px(&t.img, ax + i, ay + j, c);
                    shrunk[(y * pw + x) * 3 + c] = v;
                }
            }
        double worst = 0;
        for (int v = 0; v < o.output_height; v++)
            for (int u = 0; u < o.output_width; u++) {
                double x, y;
                ref_map(&o, 120, 90, 120, 90, &p, u + 0.5, v + 0.5, &x, &y);
                x = x / sx - 0.5, y = y / sy - 0.5;
                double fx0 = floor(x), fy0 = floor(y), bx = x - fx0, by = y - fy0;
                for (int c = 0; c < 3; c++) {
                    double r = 0;
                    for (int j = 0; j < 2; j++)
                        for (int i = 0; i < 2; i++) {
                            int xi = (int)fx0 + i, yj = (int)fy0 + j;
                            double val = xi >= 0 && xi < pw && yj >= 0 && yj < ph
                                             ? shrunk[(yj * pw + xi) * 3 + c]
                                             : o.fill_value[c];
                            r += (i ? bx : 1 - bx) * (j ? by : 1 - by) * val;
                        }
                    worst = fmax(worst, fabs(out_px(&o, dst, u, v, c) - r));
                }
            }
        if (worst > TOL) fprintf(stderr, "prefilter case %zu: max error %g\n", k, worst);
        CHECK(worst <= TOL);
        /* Cases but the last see the image, the last only fill. */
        int filled = 0;
        for (int i = 0; i < o.output_width * o.output_height; i++) filled += dst[i] == 30.0f;
        if (k + 1 < DSRT_ARRAY_SIZE(cases))
            CHECK_LT(filled, o.output_width * o.output_height / 2);
        else
            CHECK_EQ(filled, o.output_width * o.output_height);
        free(shrunk);
        free(dst);
    }
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

// ----------------------------------------------------------------------------
// Normalisation and layout

static void test_normalisation(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(9, 7, 3, 60);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 11, o.output_height = 7; /* one fill column each side */
    o.size_mode = DSRT_AUGMENT_CENTERCROP;
    o.fill_value[0] = 1, o.fill_value[1] = 2, o.fill_value[2] = 3;
    o.mean[0] = 123.675f, o.mean[1] = 116.28f, o.mean[2] = 103.53f;
    o.std[0] = 58.395f, o.std[1] = 57.12f, o.std[2] = 57.375f;
    float *dst = alloc_sample(&o);
    for (int norm = 0; norm <= DSRT_AUGMENT_NORM_ZSCORE; norm++) {
        o.norm = norm;
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 9, 7, 1, 0, 0, dst));
        int bad = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 7; y++)
                for (int x = 0; x < 11; x++) {
                    float v = x == 0 || x == 10 ? o.fill_value[c] : (float)px(&t.img, x - 1, y, c);
                    float want = v;
                    if (norm == DSRT_AUGMENT_NORM_RESCALE) want = v / 255.0f;
                    if (norm == DSRT_AUGMENT_NORM_ZEROCENTER) want = v - o.mean[c];
                    if (norm == DSRT_AUGMENT_NORM_ZSCORE) want = (v - o.mean[c]) / o.std[c];
                    bad += memcmp(&dst[c * 77 + y * 11 + x], &want, sizeof want) != 0;
                }
        if (bad) fprintf(stderr, "norm %d: %d values differ\n", norm, bad);
        CHECK_EQ(bad, 0);
    }
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

// ----------------------------------------------------------------------------
// Presets

static void test_presets(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(500, 375, 3, 70);
    dsrt_augment_options o;
    int mw, mh;

    dsrt_augment_preset_227(&o);
    CHECK_EQ(o.output_width, 227);
    CHECK_EQ(o.resize_shorter, 256);
    CHECK_EQ(dsrt_augment_sample_bytes(&o), 3 * 227 * 227 * 4);
    dsrt_augment_decode_size(&o, 500, 375, &mw, &mh);
    CHECK_EQ(mw, 341);
    CHECK_EQ(mh, 256);
    dsrt_augment_decode_size(&o, 1024, 768, &mw, &mh);
    CHECK_EQ(mw, 341);
    CHECK_EQ(mh, 256);
    float *dst = alloc_sample(&o);
    int flips = 0;
    for (uint64_t id = 0; id < 8; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 500, 375, 11, 2, id, &p);
        CHECK(p.crop_x >= 0 && p.crop_x <= 341 - 227);
        CHECK(p.crop_y >= 0 && p.crop_y <= 256 - 227);
        flips += p.x_reflect;
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 500, 375, 11, 2, id, dst));
        float lo = 1, hi = 0;
        for (int i = 0; i < 3 * 227 * 227; i++) lo = fminf(lo, dst[i]), hi = fmaxf(hi, dst[i]);
        CHECK(lo >= 0.0f && hi <= 1.0f);
        if (id < 2) {
            /* Against the reference on a few rows (the whole image is slow
             * under sanitizers): torchvision's Resize(256) + crop + flip. */
            double worst = 0;
            dsrt_augment_options n = o;
            n.norm = DSRT_AUGMENT_NORM_NONE;
            for (int v = 0; v < 227; v += 37)
                for (int u = 0; u < 227; u++)
                    for (int c = 0; c < 3; c++)
                        worst = fmax(worst, fabs(255.0 * dst[c * 227 * 227 + v * 227 + u] -
                                                 ref_separable(&n, 500, 375, &t.img, &p, u, v, c)));
            CHECK(worst <= TOL * 4);
        }
    }
    CHECK(flips > 0 && flips < 8);
    free(dst);

    dsrt_augment_preset_32(&o);
    CHECK_EQ(o.output_width, 32);
    CHECK_EQ(dsrt_augment_sample_bytes(&o), 3 * 32 * 32 * 4);
    dsrt_augment_decode_size(&o, 500, 375, &mw, &mh);
    CHECK_EQ(mw, 32); /* the output size: the DCT scale low-passes */
    CHECK_EQ(mh, 32);
    dst = alloc_sample(&o);
    int seen_shift[9] = {0};
    for (uint64_t id = 0; id < 60; id++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 500, 375, 11, 2, id, &p);
        /* 4 output pixels are 4 * 500 / 32 = 62.5 source pixels in x */
        double ux = p.x_translation * 32 / 500, uy = p.y_translation * 32 / 375;
        CHECK_NEAR(ux, lround(ux), 1e-9);
        CHECK_NEAR(uy, lround(uy), 1e-9);
        CHECK(fabs(ux) <= 4 + 1e-9 && fabs(uy) <= 4 + 1e-9);
        if (fabs(ux) <= 4.5) seen_shift[lround(ux) + 4]++;
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 500, 375, 11, 2, id, dst));
        /* Exactly |shift| columns of zeros on the side the content left. */
        int sx = (int)lround(ux), sy = (int)lround(uy), bad = 0;
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 32; v++)
                for (int u = 0; u < 32; u++) {
                    float x = dst[c * 1024 + v * 32 + u];
                    int filled = u < sx || u >= 32 + sx || v < sy || v >= 32 + sy;
                    bad += filled ? x != 0.0f : !(x > 0.0f && x <= 1.0f);
                }
        CHECK_EQ(bad, 0);
        if (id < 3) {
            dsrt_augment_options n = o;
            n.norm = DSRT_AUGMENT_NORM_NONE;
            double worst = 0;
            for (int v = 0; v < 32; v++)
                for (int u = 0; u < 32; u++)
                    for (int c = 0; c < 3; c++)
                        worst = fmax(worst, fabs(255.0 * dst[c * 1024 + v * 32 + u] -
                                                 ref_separable(&n, 500, 375, &t.img, &p, u, v, c)));
            CHECK(worst <= TOL * 4);
        }
    }
    for (int i = 0; i < 9; i++) CHECK_GT(seen_shift[i], 0);
    free(dst);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

// ----------------------------------------------------------------------------
// Determinism and decode scale

static void test_determinism(void) {
    dsrt_augmenter *a, *b;
    CHECK_OK(dsrt_augmenter_create(&a));
    CHECK_OK(dsrt_augmenter_create(&b));
    test_image t = image_random(120, 90, 3, 80);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = o.output_height = 48;
    o.resize_shorter = 64;
    o.size_mode = DSRT_AUGMENT_RANDCROP;
    o.rand_x_reflection = 1;
    o.rand_rotation[0] = -10, o.rand_rotation[1] = 10;
    o.rand_x_translation[0] = -5, o.rand_x_translation[1] = 5;
    size_t n = dsrt_augment_sample_bytes(&o);
    uint8_t *d[6];
    for (int i = 0; i < 6; i++) d[i] = alloc_sample(&o);
    /* Same key on two augmenters, with other work in between: same bytes. */
    CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 120, 90, 42, 3, 17, d[0]));
    CHECK_OK(dsrt_augment_apply(b, &o, &t.img, 120, 90, 42, 3, 99, d[1]));
    CHECK_OK(dsrt_augment_apply(b, &o, &t.img, 120, 90, 42, 3, 17, d[2]));
    CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 120, 90, 42, 4, 17, d[3]));
    CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 120, 90, 43, 3, 17, d[4]));
    CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 120, 90, 42, 3, 17, d[5]));
    CHECK_EQ(memcmp(d[0], d[2], n), 0);
    CHECK_EQ(memcmp(d[0], d[5], n), 0);
    CHECK_NE(memcmp(d[0], d[1], n), 0); /* another id */
    CHECK_NE(memcmp(d[0], d[3], n), 0); /* another epoch */
    CHECK_NE(memcmp(d[0], d[4], n), 0); /* another seed */
    /* One option's draws do not move when another option is set. */
    dsrt_augment_params p, q;
    dsrt_augment_draw(&o, 120, 90, 42, 3, 17, &p);
    dsrt_augment_options o2 = o;
    o2.rand_rotation[0] = o2.rand_rotation[1] = 0;
    o2.rand_y_reflection = 1;
    o2.rand_scale[0] = 0.9, o2.rand_scale[1] = 1.2;
    dsrt_augment_draw(&o2, 120, 90, 42, 3, 17, &q);
    CHECK_EQ(p.x_reflect, q.x_reflect);
    CHECK(p.x_translation == q.x_translation);
    CHECK_EQ(p.crop_x, q.crop_x);
    CHECK_EQ(p.crop_y, q.crop_y);
    for (int i = 0; i < 6; i++) free(d[i]);
    image_free(&t);
    dsrt_augmenter_destroy(a);
    dsrt_augmenter_destroy(b);
}

/* Box-average 2 x 2 blocks: what a decoder's DCT scaling roughly gives. */
static test_image halve(const test_image *s) {
    int w = (s->img.width + 1) / 2, h = (s->img.height + 1) / 2, ch = s->img.channels;
    test_image t;
    t.buf = malloc((size_t)w * h * ch);
    REQUIRE(t.buf);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                int sum = 0, n = 0;
                for (int j = 0; j < 2; j++)
                    for (int i = 0; i < 2; i++)
                        if (2 * x + i < s->img.width && 2 * y + j < s->img.height)
                            sum += (int)px(&s->img, 2 * x + i, 2 * y + j, c), n++;
                t.buf[((size_t)y * w + x) * ch + c] = (uint8_t)((sum + n / 2) / n);
            }
    t.img = (dsrt_image){t.buf, w, h, ch, (size_t)w * ch};
    return t;
}

static void test_decode_scale(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image full = image_smooth(256, 192, 3), half = halve(&full);
    test_image quarter = halve(&half);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = 64, o.output_height = 48;
    o.norm = DSRT_AUGMENT_NORM_NONE;
    o.rand_x_reflection = o.rand_y_reflection = 1;
    o.translation_whole_pixels = 1;
    o.rand_x_translation[0] = -40, o.rand_x_translation[1] = 40; /* stored pixels */
    o.rand_y_translation[0] = -40, o.rand_y_translation[1] = 40;
    o.fill_value[0] = o.fill_value[1] = o.fill_value[2] = 255;
    int mw, mh;
    dsrt_augment_decode_size(&o, 256, 192, &mw, &mh);
    CHECK_EQ(mw, 64);
    CHECK_EQ(mh, 48);
    float *d0 = alloc_sample(&o), *d1 = alloc_sample(&o), *d2 = alloc_sample(&o);
    for (uint64_t id = 0; id < 6; id++) {
        CHECK_OK(dsrt_augment_apply(a, &o, &full.img, 256, 192, 5, 1, id, d0));
        CHECK_OK(dsrt_augment_apply(a, &o, &half.img, 256, 192, 5, 1, id, d1));
        CHECK_OK(dsrt_augment_apply(a, &o, &quarter.img, 256, 192, 5, 1, id, d2));
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 256, 192, 5, 1, id, &p);
        /* A shift of t stored pixels is t / 4 output pixels: the fill
         * border sits in the same place at every decode scale. */
        double bx = fabs(p.x_translation) / 4, by = fabs(p.y_translation) / 4, diff = 0;
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 48; v++)
                for (int u = 0; u < 64; u++) {
                    int i = c * 64 * 48 + v * 64 + u;
                    double ex = p.x_translation > 0 ? u + 0.5 : 64 - (u + 0.5);
                    double ey = p.y_translation > 0 ? v + 0.5 : 48 - (v + 0.5);
                    if (ex < bx - 0.01 || ey < by - 0.01) { /* the centre maps outside */
                        CHECK_EQ(d0[i], 255);
                        CHECK_EQ(d1[i], 255);
                        CHECK_EQ(d2[i], 255);
                    } else if (ex > bx + 1 && ey > by + 1) {
                        diff = fmax(diff, fmax(fabs(d0[i] - d1[i]), fabs(d0[i] - d2[i])));
                    }
                }
        if (diff > 6) fprintf(stderr, "decode scale: id %d: difference %g\n", (int)id, diff);
        CHECK(diff <= 6);
    }
    free(d0);
    free(d1);
    free(d2);
    image_free(&full);
    image_free(&half);
    image_free(&quarter);
    dsrt_augmenter_destroy(a);
}

/* The real flow: a JPEG's header size, dsrt_augment_decode_size, a decode
 * at the DCT scale it allows, then the preset; the result matches the one
 * from a full-size decode (same choices, close pixels). */
static void test_jpeg_flow(void) {
    test_image src = image_smooth(500, 375, 3);
    size_t len = 0;
    uint8_t *jpeg = timg_jpeg(src.buf, 500, 375, TJPF_RGB, TJSAMP_444, 95, 0, &len);
    REQUIRE(jpeg);
    dsrt_decoder *dec;
    dsrt_augmenter *a;
    CHECK_OK(dsrt_decoder_create(&dec, NULL));
    CHECK_OK(dsrt_augmenter_create(&a));
    dsrt_image_info info;
    CHECK_OK(dsrt_decoder_info(dec, jpeg, len, &info));
    dsrt_augment_options o;
    dsrt_augment_preset_32(&o);
    dsrt_decode_request req = {.channels = o.output_channels};
    dsrt_augment_decode_size(&o, info.width, info.height, &req.min_width, &req.min_height);
    int dw, dh;
    dsrt_decode_size(&info, &req, &dw, &dh);
    CHECK_EQ(dw, 63); /* 1/8 scale: the smallest that covers 32 x 32 */
    CHECK_EQ(dh, 47);
    float *small = alloc_sample(&o), *full = alloc_sample(&o);
    size_t n = 3 * 32 * 32;
    for (uint64_t id = 0; id < 4; id++) {
        dsrt_image img;
        CHECK_OK(dsrt_decode(dec, jpeg, len, &req, &img));
        CHECK_EQ(img.width, 63);
        CHECK_OK(dsrt_augment_apply(a, &o, &img, info.width, info.height, 8, 0, id, small));
        dsrt_decode_request whole = {.channels = 3};
        CHECK_OK(dsrt_decode(dec, jpeg, len, &whole, &img));
        CHECK_EQ(img.width, 500);
        CHECK_OK(dsrt_augment_apply(a, &o, &img, info.width, info.height, 8, 0, id, full));
        double worst = 0;
        int zeros_differ = 0;
        for (size_t i = 0; i < n; i++) {
            zeros_differ += (small[i] == 0.0f) != (full[i] == 0.0f);
            worst = fmax(worst, fabs(small[i] - full[i]));
        }
        CHECK_EQ(zeros_differ, 0); /* the same shift at both scales */
        if (worst > 0.03) fprintf(stderr, "jpeg flow: id %d: difference %g\n", (int)id, worst);
        CHECK(worst <= 0.03); /* 8 levels of 255 */
    }
    free(small);
    free(full);
    free(jpeg);
    image_free(&src);
    dsrt_augmenter_destroy(a);
    dsrt_decoder_destroy(dec);
}

// ----------------------------------------------------------------------------
// Decoding only what a sample reads

/* The option sets the window and gray tests run: the presets and variants
 * that keep the axes (crops, flips, translations in both units, scales,
 * fill) and two that turn. */
static int variant(int k, dsrt_augment_options *o) {
    switch (k) {
    case 0:
        dsrt_augment_preset_227(o);
        return 1;
    case 1:
        dsrt_augment_preset_32(o);
        return 1;
    case 2:
        dsrt_augment_preset_227(o);
        o->size_mode = DSRT_AUGMENT_CENTERCROP;
        o->rand_y_reflection = 1;
        return 1;
    case 3:
        *o = dsrt_augment_defaults();
        o->output_width = 97, o->output_height = 61;
        o->rand_x_translation[0] = -60, o->rand_x_translation[1] = 60;
        o->rand_y_translation[0] = -30, o->rand_y_translation[1] = 45;
        o->fill_value[0] = 10, o->fill_value[1] = 100, o->fill_value[2] = 200;
        return 1;
    case 4:
        *o = dsrt_augment_defaults();
        o->output_width = o->output_height = 64;
        o->resize_shorter = 80;
        o->size_mode = DSRT_AUGMENT_RANDCROP;
        o->rand_scale[0] = 0.7, o->rand_scale[1] = 1.4;
        o->rand_x_reflection = 1;
        o->translation_whole_pixels = 1;
        o->rand_x_translation[0] = -9, o->rand_x_translation[1] = 9;
        o->fill_value[0] = 255, o->fill_value[1] = 0, o->fill_value[2] = 50;
        return 1;
    case 5:
        dsrt_augment_preset_32(o);
        o->output_width = 20, o->output_height = 40; /* reduce x more than y */
        o->translation_units = DSRT_AUGMENT_UNITS_INPUT;
        o->translation_whole_pixels = 0;
        o->rand_x_translation[0] = -100, o->rand_x_translation[1] = 100;
        return 1;
    case 6:
        dsrt_augment_preset_227(o);
        o->rand_rotation[0] = -20, o->rand_rotation[1] = 20;
        o->fill_value[0] = 10, o->fill_value[1] = 100, o->fill_value[2] = 200;
        return 1;
    case 7:
        *o = dsrt_augment_defaults();
        o->output_width = o->output_height = 40;
        o->rand_x_shear[0] = -10, o->rand_x_shear[1] = 15;
        o->rand_scale[0] = 0.5, o->rand_scale[1] = 0.6;
        return 1;
    case 8: /* the ImageNet recipe, with a hue, grayscale and erasing */
        dsrt_augment_preset_imagenet(o);
        o->hue[0] = -0.1, o->hue[1] = 0.1;
        o->grayscale_probability = 0.5;
        o->erase_probability = 0.7;
        o->erase_random = 1;
        return 1;
    case 9: /* a random-resized crop flipped both ways, to a small output */
        *o = dsrt_augment_defaults();
        o->output_width = 64, o->output_height = 48;
        o->size_mode = DSRT_AUGMENT_RANDRESIZEDCROP;
        o->crop_scale[0] = 0.3, o->crop_scale[1] = 0.9;
        o->crop_ratio[0] = 0.5, o->crop_ratio[1] = 2.0;
        o->rand_x_reflection = o->rand_y_reflection = 1;
        o->contrast[0] = 0.5, o->contrast[1] = 1.5;
        o->erase_probability = 1.0;
        o->erase_value[0] = 0.5f, o->erase_value[1] = -1.0f, o->erase_value[2] = 2.0f;
        return 1;
    case 10: /* the recipe without a hue, then grayscale, 750 pixels: not whole
                vectors of 16 */
        dsrt_augment_preset_imagenet(o);
        o->output_width = 30, o->output_height = 25;
        o->grayscale_probability = 1.0;
        return 1;
    case 11: /* brightness and saturation alone (no contrast: one pass) */
        *o = dsrt_augment_defaults();
        o->output_width = o->output_height = 48;
        o->brightness[0] = 0.2, o->brightness[1] = 1.8;
        o->saturation[0] = 0.0, o->saturation[1] = 3.0;
        return 1;
    default:
        return 0;
    }
}

/* Three ways of writing the samples: float NCHW in [0, 1] or z-scored, and
 * uint8 NHWC. */
static void set_layout(dsrt_augment_options *o, int l) {
    o->layout = l == 2 ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
    o->norm = l == 0   ? DSRT_AUGMENT_NORM_RESCALE
              : l == 1 ? DSRT_AUGMENT_NORM_ZSCORE
                       : DSRT_AUGMENT_NORM_NONE;
    for (int c = 0; c < 3; c++) o->mean[c] = 100.0f + 20 * c, o->std[c] = 50.0f + 10 * c;
    if (l == 2) o->erase_probability = 0.0; /* erasing writes normalised floats */
}

/* The pipeline's way (begin, dsrt_augment_decode_request, a region decode,
 * apply_window) writes the bytes of the whole decode's apply, for every
 * kind of JPEG, option set, layout and sample. */
static void test_window(void) {
    dsrt_decoder *dec;
    dsrt_augmenter *a;
    CHECK_OK(dsrt_decoder_create(&dec, NULL));
    CHECK_OK(dsrt_augmenter_create(&a));
    static const int kinds[] = {TIMG_JPEG_420, TIMG_JPEG_GRAY, TIMG_JPEG_PROGRESSIVE, TIMG_JPEG_444,
                                TIMG_JPEG_CMYK};
    static const int sizes[][2] = {{500, 375}, {300, 411}, {180, 90}};
    long differ = 0, samples = 0, smaller = 0;
    for (size_t ki = 0; ki < DSRT_ARRAY_SIZE(kinds); ki++)
        for (size_t si = 0; si < DSRT_ARRAY_SIZE(sizes); si++) {
            size_t len;
            uint8_t *jpeg = timg_make_jpeg(kinds[ki], sizes[si][0], sizes[si][1],
                                           (uint32_t)(ki * 10 + si), &len);
            REQUIRE(jpeg);
            dsrt_augment_options o;
            for (int k = 0; variant(k, &o); k++)
                for (int l = 0; l < 3; l++) {
                    set_layout(&o, l);
                    size_t n = dsrt_augment_sample_bytes(&o);
                    uint8_t *x = malloc(n), *y = malloc(n);
                    REQUIRE(x && y);
                    for (uint64_t id = 0; id < 3; id++) {
                        dsrt_image_info info;
                        dsrt_image img;
                        dsrt_window win;
                        CHECK_OK(dsrt_decoder_info(dec, jpeg, len, &info));
                        /* The whole image at the scale the request picks
                         * (dsrt_augment_decode_size's, but for the
                         * random-resized crop's own window). */
                        dsrt_decode_request whole = {0}; /* dst: the decoder's scratch */
                        CHECK_OK(dsrt_augment_decode_request(a, &o, &info, 4, 1, id, &whole));
                        whole.region_x = whole.region_y = 0;
                        whole.region_width = whole.region_height = 0;
                        whole.allow_gray = 0;
                        CHECK_OK(dsrt_decode(dec, jpeg, len, &whole, &img));
                        CHECK_OK(
                            dsrt_augment_apply(a, &o, &img, info.width, info.height, 4, 1, id, x));
                        size_t whole_px = (size_t)img.width * img.height;
                        dsrt_decode_request r = {0};
                        CHECK_OK(dsrt_decode_begin(dec, jpeg, len, &info));
                        CHECK_OK(dsrt_augment_decode_request(a, &o, &info, 4, 1, id, &r));
                        CHECK_OK(dsrt_decode_finish(dec, &r, &img, &win));
                        CHECK_OK(dsrt_augment_apply_window(a, &o, &img, &win, info.width,
                                                           info.height, 4, 1, id, y));
                        smaller += (size_t)img.width * img.height < whole_px;
                        samples++;
                        if (memcmp(x, y, n) != 0) {
                            if (differ++ < 5)
                                fprintf(stderr, "%s %dx%d, options %d, layout %d, id %d differ\n",
                                        timg_jpeg_kind_name(kinds[ki]), sizes[si][0], sizes[si][1],
                                        k, l, (int)id);
                        }
                    }
                    free(x);
                    free(y);
                }
            free(jpeg);
        }
    CHECK_EQ(differ, 0);
    CHECK_GT(smaller, samples / 3); /* the crops and shifts decode less */
    dsrt_augmenter_destroy(a);
    dsrt_decoder_destroy(dec);
}

/* A window that misses pixels the sample reads, or lies outside its image,
 * is refused; so is a window for a turning sample. */
static void test_window_errors(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(100, 80, 3, 5);
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = o.output_height = 50;
    o.norm = DSRT_AUGMENT_NORM_NONE;
    float *d = alloc_sample(&o);
    dsrt_window in = {10, 10, 120, 100}, off = {30, 30, 120, 100}, big = {0, 0, 90, 80};
    CHECK_EQ(dsrt_augment_apply_window(a, &o, &t.img, &in, 120, 100, 0, 0, 0, d), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "does not hold them");
    CHECK_EQ(dsrt_augment_apply_window(a, &o, &t.img, &off, 120, 100, 0, 0, 0, d), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "does not lie in");
    CHECK_EQ(dsrt_augment_apply_window(a, &o, &t.img, &big, 120, 100, 0, 0, 0, d), DSRT_EOPTION);
    /* A window of the middle, for an output that reads only the middle. */
    o.size_mode = DSRT_AUGMENT_CENTERCROP;
    o.output_width = o.output_height = 20;
    dsrt_window mid = {10, 10, 120, 100};
    CHECK_OK(dsrt_augment_apply_window(a, &o, &t.img, &mid, 120, 100, 0, 0, 0, d));
    o.rand_rotation[0] = o.rand_rotation[1] = 5;
    CHECK_EQ(dsrt_augment_apply_window(a, &o, &t.img, &mid, 120, 100, 0, 0, 0, d), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "whole image");
    free(d);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

/* A gray image for RGB output writes the bytes of its RGB replication:
 * every option set (warps and fill of three different values included) and
 * layout. */
static void test_gray_replicated(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image g = image_random(151, 97, 1, 21), rgb = image_random(151, 97, 3, 0);
    for (size_t i = 0; i < (size_t)151 * 97; i++)
        rgb.buf[3 * i] = rgb.buf[3 * i + 1] = rgb.buf[3 * i + 2] = g.buf[i];
    dsrt_augment_options o;
    long differ = 0;
    for (int k = 0; variant(k, &o); k++)
        for (int l = 0; l < 3; l++) {
            set_layout(&o, l);
            o.decode_oversample = 1;
            size_t n = dsrt_augment_sample_bytes(&o);
            uint8_t *x = malloc(n), *y = malloc(n);
            REQUIRE(x && y);
            for (uint64_t id = 0; id < 4; id++) {
                CHECK_OK(dsrt_augment_apply(a, &o, &rgb.img, 151, 97, 2, 0, id, x));
                CHECK_OK(dsrt_augment_apply(a, &o, &g.img, 151, 97, 2, 0, id, y));
                if (memcmp(x, y, n) != 0 && differ++ < 5)
                    fprintf(stderr, "gray: options %d, layout %d, id %d differ\n", k, l, (int)id);
            }
            free(x);
            free(y);
        }
    CHECK_EQ(differ, 0);
    image_free(&g);
    image_free(&rgb);
    dsrt_augmenter_destroy(a);
}

// ----------------------------------------------------------------------------
// Every instruction set writes the same bytes

/* The sample of img under o from an augmenter on the given kernels. */
static int apply_isa(const char *isa, const dsrt_augment_options *o, const dsrt_image *img,
                     const dsrt_window *win, int fw, int fh, uint64_t id, void *dst) {
    dsrt_augmenter *a;
    REQUIRE(dsrt_augmenter_create(&a) == 0);
    int rc = dsrt__augmenter_set_isa(a, isa);
    if (rc == 0) {
        CHECK_STR_EQ(dsrt_augmenter_isa(a), isa);
        CHECK_OK(dsrt_augment_apply_window(a, o, img, win, fw, fh, 7, 2, id, dst));
    }
    dsrt_augmenter_destroy(a);
    return rc;
}

/*
 * The AVX2 and AVX-512 kernels against the scalar one, byte for byte, on
 * every option set, layout and channel count, on images of many shapes
 * (rows with slack, one pixel wide or high, large reductions that gather),
 * and on windows. Kernels this CPU lacks are skipped and said so.
 */
static void test_isa_identical(void) {
    static const char *const isas[] = {"avx2", "avx512"};
    int have[2];
    for (int i = 0; i < 2; i++) {
        dsrt_augmenter *a;
        REQUIRE(dsrt_augmenter_create(&a) == 0);
        have[i] = dsrt__augmenter_set_isa(a, isas[i]) == 0;
        dsrt_augmenter_destroy(a);
        printf("  %s: %s\n", isas[i], have[i] ? "compared with scalar" : "not on this CPU");
    }
    static const int shapes[][2] = {{500, 375}, {333, 500},   {61, 47},   {1, 40},
                                    {40, 1},    {2000, 1500}, {256, 256}, {17, 300}};
    long differ = 0, samples = 0;
    for (size_t si = 0; si < DSRT_ARRAY_SIZE(shapes); si++)
        for (int ch = 1; ch <= 3; ch += 2) {
            int w = shapes[si][0], h = shapes[si][1];
            /* Rows with 5 bytes of slack after them. */
            test_image t = image_random(w * ch + 5, h, 1, 300 + si * 3 + ch);
            dsrt_image img = {t.buf, w, h, ch, (size_t)w * ch + 5};
            dsrt_augment_options o;
            for (int k = 0; variant(k, &o); k++)
                for (int l = 0; l < 3; l++)
                    for (int och = 1; och <= 3; och += 2) {
                        if (och < ch) continue;
                        set_layout(&o, l);
                        o.output_channels = och;
                        size_t n = dsrt_augment_sample_bytes(&o);
                        /* got aligned as a batch's samples are (the
                         * colour write streams into such places). */
                        uint8_t *ref = malloc(n), *got = aligned_alloc(64, (n + 63) & ~(size_t)63);
                        REQUIRE(ref && got);
                        for (uint64_t id = 0; id < 2; id++) {
                            CHECK_OK(apply_isa("scalar", &o, &img, NULL, w, h, id, ref));
                            for (int i = 0; i < 2; i++) {
                                if (!have[i]) continue;
                                memset(got, 0xA5, n);
                                apply_isa(isas[i], &o, &img, NULL, w, h, id, got);
                                samples++;
                                if (memcmp(ref, got, n) != 0 && differ++ < 5)
                                    fprintf(stderr,
                                            "%s: %dx%dx%d, options %d, layout %d, %d channel(s), "
                                            "id %d differ\n",
                                            isas[i], w, h, ch, k, l, och, (int)id);
                            }
                        }
                        free(ref);
                        free(got);
                    }
            image_free(&t);
        }
    /* A window: the middle of a larger decoded image. */
    test_image t = image_random(300, 200, 3, 9);
    dsrt_window win = {37, 21, 400, 260};
    dsrt_augment_options o = dsrt_augment_defaults();
    o.output_width = o.output_height = 150;
    o.size_mode = DSRT_AUGMENT_CENTERCROP;
    o.resize_shorter = 240;
    size_t n = dsrt_augment_sample_bytes(&o);
    uint8_t *ref = malloc(n), *got = malloc(n);
    REQUIRE(ref && got);
    CHECK_OK(apply_isa("scalar", &o, &t.img, &win, 400, 260, 0, ref));
    for (int i = 0; i < 2; i++)
        if (have[i]) {
            CHECK_OK(apply_isa(isas[i], &o, &t.img, &win, 400, 260, 0, got));
            CHECK_EQ(memcmp(ref, got, n), 0);
        }
    free(ref);
    free(got);
    image_free(&t);
    CHECK_EQ(differ, 0);
    CHECK(samples > 0 || (!have[0] && !have[1]));
    /* Names checked. */
    dsrt_augmenter *a;
    REQUIRE(dsrt_augmenter_create(&a) == 0);
    CHECK_EQ(dsrt__augmenter_set_isa(a, "sse9"), DSRT_EOPTION);
    CHECK_OK(dsrt__augmenter_set_isa(a, "scalar"));
    dsrt_augmenter_destroy(a);
}

/*
 * The same on plain resizes of every reduction from 1 to 6.5 on either
 * axis, so that the vector kernels' paths for each count of source rows (1
 * to 14) and of horizontal taps (1 to 14: those unrolled, taps 1 to 4 with
 * AVX2 and 2 to 5 with AVX-512, rows 1 to 6, and the general ones; rows
 * with the channels interleaved where the blocks reach too far) all run,
 * for 1 and 3 source channels into 1 and 3, float and byte output, the
 * rows' last pixels short of a whole vector.
 */
static void test_isa_reductions(void) {
    static const char *const isas[] = {"avx2", "avx512"};
    static const double factors[] = {1.0, 1.15, 1.3, 1.7, 2.2, 2.6, 3.1, 4.3, 6.5};
    enum { W = 421, H = 389 };
    long differ = 0, samples = 0;
    for (int ch = 1; ch <= 3; ch += 2) {
        test_image t = image_random(W, H, ch, 77 + ch);
        for (size_t fx = 0; fx < DSRT_ARRAY_SIZE(factors); fx++)
            for (size_t fy = 0; fy < DSRT_ARRAY_SIZE(factors); fy += 2)
                for (int l = 0; l < 6; l++) {
                    int och = l < 3 ? 3 : 1;
                    if (och < ch) continue;
                    dsrt_augment_options o = dsrt_augment_defaults();
                    o.size_mode = DSRT_AUGMENT_RESIZE;
                    o.output_width = (int)(W / factors[fx]);
                    o.output_height = (int)(H / factors[(fy + fx) % DSRT_ARRAY_SIZE(factors)]);
                    o.output_channels = och;
                    set_layout(&o, l % 3);
                    size_t n = dsrt_augment_sample_bytes(&o);
                    uint8_t *ref = malloc(n), *got = malloc(n);
                    REQUIRE(ref && got);
                    CHECK_OK(apply_isa("scalar", &o, &t.img, NULL, W, H, 0, ref));
                    for (int i = 0; i < 2; i++) {
                        memset(got, 0xA5, n);
                        if (apply_isa(isas[i], &o, &t.img, NULL, W, H, 0, got) != 0) continue;
                        samples++;
                        if (memcmp(ref, got, n) != 0 && differ++ < 5)
                            fprintf(stderr, "%s: %d channel(s) to %dx%dx%d, layout %d differ\n",
                                    isas[i], ch, o.output_width, o.output_height, och, l % 3);
                    }
                    free(ref);
                    free(got);
                }
        image_free(&t);
    }
    CHECK_EQ(differ, 0);
    dsrt_augmenter *a;
    REQUIRE(dsrt_augmenter_create(&a) == 0);
    int any = dsrt__augmenter_set_isa(a, "avx2") == 0;
    dsrt_augmenter_destroy(a);
    CHECK(samples > 0 || !any); /* a vector kernel compared, where the CPU has one */
    printf("  %ld samples compared\n", samples);
}

/* DSRT_MAX_CPU_ISA caps the kernels; a name it does not know is refused. */
static void test_isa_environment(void) {
    const char *old = getenv("DSRT_MAX_CPU_ISA");
    char *saved = old ? strdup(old) : NULL;
    dsrt_augmenter *a;
    setenv("DSRT_MAX_CPU_ISA", "scalar", 1);
    REQUIRE(dsrt_augmenter_create(&a) == 0);
    CHECK_STR_EQ(dsrt_augmenter_isa(a), "scalar");
    dsrt_augmenter_destroy(a);
    setenv("DSRT_MAX_CPU_ISA", "avx2", 1);
    REQUIRE(dsrt_augmenter_create(&a) == 0);
    CHECK(strcmp(dsrt_augmenter_isa(a), "avx512") != 0);
    dsrt_augmenter_destroy(a);
    setenv("DSRT_MAX_CPU_ISA", "neon", 1);
    a = NULL;
    CHECK_EQ(dsrt_augmenter_create(&a), DSRT_EOPTION);
    CHECK(a == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "DSRT_MAX_CPU_ISA: 'neon'");
    if (saved)
        setenv("DSRT_MAX_CPU_ISA", saved, 1);
    else
        unsetenv("DSRT_MAX_CPU_ISA");
    free(saved);
}

// ----------------------------------------------------------------------------
// The ImageNet recipe: random-resized crop, colour, erasing

/* Each option of the recipe refused with its name and value. */
static void test_recipe_options(void) {
    dsrt_augment_options d = dsrt_augment_defaults(), o;
    CHECK(d.crop_scale[0] == 0.08 && d.crop_scale[1] == 1.0);
    CHECK(d.crop_ratio[0] == 0.75 && d.crop_ratio[1] == 4.0 / 3.0);
    CHECK(d.brightness[0] == 1.0 && d.hue[1] == 0.0 && d.grayscale_probability == 0.0);
    CHECK(d.erase_probability == 0.0 && d.erase_scale[0] == 0.02 && d.erase_ratio[1] == 3.3);
    o = d, o.size_mode = (dsrt_augment_size_mode)4;
    expect_option_error(&o, "size_mode: 4: unknown");
    o = d, o.crop_scale[0] = 0.0;
    expect_option_error(&o, "crop_scale: [0, 1]: low is not above 0");
    o = d, o.crop_scale[1] = 1.5;
    expect_option_error(&o, "crop_scale: [0.08, 1.5]: outside [0, 1]");
    o = d, o.crop_ratio[0] = 2.0;
    expect_option_error(&o, "crop_ratio: [2, 1.33333]: low is above high");
    o = d, o.crop_ratio[0] = 0.0;
    expect_option_error(&o, "crop_ratio: [0, 1.33333]: outside [0.001, 1000]");
    o = d, o.brightness[0] = -0.5;
    expect_option_error(&o, "brightness: [-0.5, 1]: outside [0, 1000]");
    o = d, o.contrast[1] = NAN;
    expect_option_error(&o, "contrast: [1, nan]: not finite");
    o = d, o.saturation[0] = 2.0;
    expect_option_error(&o, "saturation: [2, 1]: low is above high");
    o = d, o.hue[1] = 0.6;
    expect_option_error(&o, "hue: [0, 0.6]: outside [-0.5, 0.5]");
    o = d, o.grayscale_probability = 1.5;
    expect_option_error(&o, "grayscale_probability: 1.5: not in [0, 1]");
    o = d, o.erase_probability = -0.1;
    expect_option_error(&o, "erase_probability: -0.1: not in [0, 1]");
    o = d, o.erase_scale[0] = 0.5, o.erase_scale[1] = 0.4;
    expect_option_error(&o, "erase_scale: [0.5, 0.4]: low is above high");
    o = d, o.erase_ratio[1] = 1e4;
    expect_option_error(&o, "erase_ratio: [0.3, 10000]: outside");
    o = d, o.erase_random = 2;
    expect_option_error(&o, "erase_random: 2: not 0 or 1");
    o = d, o.erase_value[1] = INFINITY;
    expect_option_error(&o, "erase_value[1]: inf: not finite");
    o = d, o.erase_probability = 0.5, o.layout = DSRT_AUGMENT_U8_NHWC;
    o.norm = DSRT_AUGMENT_NORM_NONE;
    expect_option_error(&o, "erase_probability: 0.5: erasing writes normalised values");
    /* The presets. */
    dsrt_augment_preset_imagenet(&o);
    CHECK_OK(dsrt_augment_check(&o));
    CHECK_EQ(o.size_mode, DSRT_AUGMENT_RANDRESIZEDCROP);
    CHECK(o.output_width == 224 && o.output_height == 224 && o.rand_x_reflection == 1);
    CHECK(o.brightness[0] == 0.6 && o.contrast[1] == 1.4 && o.saturation[0] == 0.6);
    CHECK(o.hue[0] == 0.0 && o.hue[1] == 0.0);
    CHECK_EQ(o.norm, DSRT_AUGMENT_NORM_ZSCORE);
    CHECK_NEAR(o.mean[0], 255 * 0.485, 1e-4);
    CHECK_NEAR(o.std[2], 255 * 0.225, 1e-4);
    dsrt_augment_preset_imagenet_val(&o);
    CHECK_OK(dsrt_augment_check(&o));
    CHECK(o.size_mode == DSRT_AUGMENT_CENTERCROP && o.resize_shorter == 256);
    CHECK(o.output_width == 224 && o.rand_x_reflection == 0 && o.brightness[1] == 1.0);
    CHECK_NEAR(o.mean[1], 255 * 0.456, 1e-4);
}

/* The colour order is a permutation of the four, every permutation drawn;
 * factors within their ranges; grayscale as often as asked. */
static void test_color_draws(void) {
    dsrt_augment_options o;
    dsrt_augment_preset_imagenet(&o);
    o.hue[0] = -0.2, o.hue[1] = 0.1;
    o.grayscale_probability = 0.25;
    int seen[256] = {0}, gray = 0, n = 4000;
    for (int i = 0; i < n; i++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 500, 375, 3, 0, (uint64_t)i, &p);
        int mask = 0, code = 0;
        for (int k = 0; k < 4; k++) {
            mask |= 1 << p.color_order[k];
            code = code * 4 + p.color_order[k];
        }
        CHECK_EQ(mask, 15);
        seen[code & 255]++;
        CHECK(p.brightness >= 0.6 && p.brightness <= 1.4);
        CHECK(p.contrast >= 0.6 && p.contrast <= 1.4);
        CHECK(p.saturation >= 0.6 && p.saturation <= 1.4);
        CHECK(p.hue >= -0.2 && p.hue <= 0.1);
        gray += p.grayscale;
    }
    int perms = 0;
    for (int c = 0; c < 256; c++) {
        if (!seen[c]) continue;
        perms++;
        CHECK(fabs(seen[c] - n / 24.0) < 5 * sqrt(n / 24.0)); /* uniform over the 24 */
    }
    CHECK_EQ(perms, 24);
    CHECK(fabs(gray - 0.25 * n) < 5 * sqrt(n * 0.25 * 0.75));
    /* Without jitter, no draw: the identity order, factors 1 (hue 0). */
    o = dsrt_augment_defaults();
    dsrt_augment_params p;
    dsrt_augment_draw(&o, 500, 375, 3, 0, 1, &p);
    CHECK(p.color_order[0] == 0 && p.color_order[3] == 3 && p.brightness == 1.0 && p.hue == 0.0);
    /* A bad order given to apply_params is refused, dst untouched. */
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(40, 30, 3, 1);
    dsrt_augment_preset_imagenet(&o);
    dsrt_augment_draw(&o, 40, 30, 3, 0, 1, &p);
    p.color_order[1] = p.color_order[0];
    float *d = alloc_sample(&o);
    d[0] = 12345.0f;
    CHECK_EQ(dsrt_augment_apply_params(a, &o, &t.img, 40, 30, &p, d), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "color_order");
    CHECK(d[0] == 12345.0f);
    free(d);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

/* Erasing: the box inside the output, its area and aspect within the
 * ranges (up to the rounding of its sides), the pixels outside it those of
 * the sample without erasing, inside it the value or standard normal
 * values. */
static void test_erase(void) {
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    test_image t = image_random(120, 90, 3, 2);
    dsrt_augment_options o = dsrt_augment_defaults(), plain;
    o.output_width = 56, o.output_height = 40;
    o.erase_probability = 0.8;
    o.erase_value[0] = 7.0f, o.erase_value[1] = -2.0f, o.erase_value[2] = 0.0f;
    plain = o;
    plain.erase_probability = 0.0;
    float *x = alloc_sample(&o), *y = alloc_sample(&o);
    size_t plane = 56 * 40;
    int erased = 0, n = 2000;
    double area_lo = 1.0, area_hi = 0.0, sum = 0.0, sq = 0.0, cnt = 0.0;
    for (int i = 0; i < n; i++) {
        o.erase_random = i >= n / 2;
        dsrt_augment_params p;
        dsrt_augment_draw(&o, 120, 90, 5, 0, (uint64_t)i, &p);
        CHECK_OK(dsrt_augment_apply(a, &o, &t.img, 120, 90, 5, 0, (uint64_t)i, x));
        CHECK_OK(dsrt_augment_apply(a, &plain, &t.img, 120, 90, 5, 0, (uint64_t)i, y));
        if (p.erase_width == 0) {
            CHECK_EQ(memcmp(x, y, 3 * plane * sizeof *x), 0);
            continue;
        }
        erased++;
        CHECK(p.erase_x >= 0 && p.erase_y >= 0 && p.erase_width < 56 && p.erase_height < 40);
        CHECK(p.erase_x + p.erase_width <= 56 && p.erase_y + p.erase_height <= 40);
        double frac = (double)p.erase_width * p.erase_height / plane;
        area_lo = fmin(area_lo, frac), area_hi = fmax(area_hi, frac);
        /* h and w are rounded: the drawn aspect (height / width) lies
         * between what the rounding allows. */
        double h = p.erase_height, w = p.erase_width;
        CHECK((h - 0.5) / (w + 0.5) <= 3.3 * (1 + 1e-9));
        CHECK((h + 0.5) / (w - 0.5) >= 0.3 * (1 - 1e-9));
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 40; v++)
                for (int u = 0; u < 56; u++) {
                    size_t k = c * plane + (size_t)v * 56 + u;
                    int in = u >= p.erase_x && u < p.erase_x + p.erase_width && v >= p.erase_y &&
                             v < p.erase_y + p.erase_height;
                    if (!in) {
                        if (x[k] != y[k]) CHECK(x[k] == y[k]);
                    } else if (!o.erase_random) {
                        if (x[k] != o.erase_value[c]) CHECK(x[k] == o.erase_value[c]);
                    } else {
                        sum += x[k], sq += (double)x[k] * x[k], cnt++;
                    }
                }
    }
    CHECK(fabs(erased - 0.8 * n) < 5 * sqrt(n * 0.8 * 0.2));
    /* Sides rounded: the area fraction within the range, give or take. */
    CHECK(area_lo >= 0.015 && area_lo < 0.04);
    CHECK(area_hi > 0.25 && area_hi <= 0.36);
    double mean = sum / cnt, var = sq / cnt - mean * mean;
    CHECK(fabs(mean) < 0.02);
    CHECK(fabs(var - 1.0) < 0.03);
    free(x);
    free(y);
    image_free(&t);
    dsrt_augmenter_destroy(a);
}

/*
 * The random-resized crop decodes its window alone, at the coarsest DCT
 * scale that keeps the window at least as dense as the output (checked
 * against the next coarser scale), and the sample stays within the
 * documented tolerance of the same crop of the whole image decoded at full
 * size: mean absolute difference below 1 level of 255, none above 16 (the
 * scaled inverse DCT is a box-like filter where the resize is a triangle;
 * at full size the bytes are the same). Here, 0.26 and 4.
 */
static void test_resized_crop_decode(void) {
    dsrt_decoder *dec;
    dsrt_augmenter *a;
    CHECK_OK(dsrt_decoder_create(&dec, NULL));
    CHECK_OK(dsrt_augmenter_create(&a));
    static const int sizes[][2] = {{500, 375}, {1600, 1200}, {2000, 900}};
    int scales[9] = {0};
    double worst_mad = 0.0;
    int worst = 0;
    for (size_t si = 0; si < DSRT_ARRAY_SIZE(sizes); si++) {
        int W = sizes[si][0], H = sizes[si][1];
        test_image src = image_smooth(W, H, 3);
        size_t len = 0;
        uint8_t *jpeg = timg_jpeg(src.buf, W, H, TJPF_RGB, TJSAMP_420, 90, 0, &len);
        REQUIRE(jpeg);
        dsrt_augment_options o;
        dsrt_augment_preset_imagenet(&o);
        o.layout = DSRT_AUGMENT_U8_NHWC;
        o.norm = DSRT_AUGMENT_NORM_NONE;
        size_t n = dsrt_augment_sample_bytes(&o);
        uint8_t *x = malloc(n), *y = malloc(n);
        REQUIRE(x && y);
        for (uint64_t id = 0; id < 24; id++) {
            dsrt_image_info info;
            dsrt_image img;
            dsrt_window win;
            dsrt_decode_request r = {0}; /* dst: the decoder's scratch */
            CHECK_OK(dsrt_decode_begin(dec, jpeg, len, &info));
            CHECK_OK(dsrt_augment_decode_request(a, &o, &info, 9, 0, id, &r));
            CHECK_OK(dsrt_decode_finish(dec, &r, &img, &win));
            CHECK_OK(dsrt_augment_apply_window(a, &o, &img, &win, W, H, 9, 0, id, x));
            dsrt_augment_params p;
            dsrt_augment_draw(&o, W, H, 9, 0, id, &p);
            int s = (W + win.decoded_width - 1) / win.decoded_width;
            scales[s]++;
            /* Dense enough (below full size), and the next scale would
             * not be. */
            if (s > 1) CHECK(p.crop_width * (double)win.decoded_width / W >= 224.0);
            if (s > 1) CHECK(p.crop_height * (double)win.decoded_height / H >= 224.0);
            if (s < 8) CHECK(p.crop_width < 2 * s * 224 || p.crop_height < 2 * s * 224);
            /* The region: the window, to whole decoded pixels. */
            CHECK(r.region_x <= p.crop_x && r.region_x > p.crop_x - s);
            CHECK(r.region_y <= p.crop_y && r.region_y > p.crop_y - s);
            CHECK(r.region_x + r.region_width >= p.crop_x + p.crop_width);
            CHECK(r.region_x + r.region_width < p.crop_x + p.crop_width + s ||
                  r.region_x + r.region_width == W);
            CHECK(r.region_y + r.region_height < p.crop_y + p.crop_height + s ||
                  r.region_y + r.region_height == H);
            /* The whole image at full size, the same crop. */
            dsrt_decode_request whole = {.channels = 3};
            CHECK_OK(dsrt_decode(dec, jpeg, len, &whole, &img));
            CHECK_OK(dsrt_augment_apply(a, &o, &img, W, H, 9, 0, id, y));
            double sum = 0.0;
            int most = 0;
            for (size_t i = 0; i < n; i++) {
                int d = abs((int)x[i] - (int)y[i]);
                sum += d;
                most = d > most ? d : most;
            }
            if (s == 1) CHECK_EQ(most, 0);
            worst_mad = fmax(worst_mad, sum / n);
            worst = most > worst ? most : worst;
        }
        free(x);
        free(y);
        free(jpeg);
        image_free(&src);
    }
    printf("  scales 1, 2, 4, 8: %d, %d, %d, %d samples; against full size: mean difference at "
           "most %.3f, largest %d\n",
           scales[1], scales[2], scales[4], scales[8], worst_mad, worst);
    CHECK_GT(scales[1], 0);
    CHECK_GT(scales[2] + scales[4], 0);
    CHECK(worst_mad < 1.0);
    CHECK_LE(worst, 16);
    dsrt_augmenter_destroy(a);
    dsrt_decoder_destroy(dec);
}

int main(void) {
    RUN(test_options);
    RUN(test_limits_hold);
    RUN(test_identity_exact);
    RUN(test_flips_exact);
    RUN(test_translation_exact);
    RUN(test_crops);
    RUN(test_resize_reference);
    RUN(test_affine_reference);
    RUN(test_affine_antialias);
    RUN(test_affine_prefilter_reference);
    RUN(test_normalisation);
    RUN(test_presets);
    RUN(test_determinism);
    RUN(test_decode_scale);
    RUN(test_jpeg_flow);
    RUN(test_window);
    RUN(test_window_errors);
    RUN(test_gray_replicated);
    RUN(test_isa_identical);
    RUN(test_isa_reductions);
    RUN(test_isa_environment);
    RUN(test_recipe_options);
    RUN(test_color_draws);
    RUN(test_erase);
    RUN(test_resized_crop_decode);
    return TEST_RESULT();
}
