/*
 * Augmentation: the random geometric transforms of MATLAB's
 * imageDataAugmenter, the output sizing of augmentedImageDatastore, and the
 * normalised write of one sample into its place in a batch.
 *
 * Every geometric step of a sample (decode scale, shorter-side resize,
 * reflection, rotation, scale, shear, translation, crop or resize) is
 * composed into one affine map from output pixels to decoded pixels, so the
 * pixels are resampled once. Two resamplers carry it out:
 *
 *   - separable, when the map keeps the axes (no rotation or shear): each
 *     axis gets a table of taps per output index (Pillow's triangle filter,
 *     stretched when shrinking, so it antialiases), a vertical pass over
 *     contiguous source rows, then a horizontal pass that writes the output
 *     row. Axes whose taps are single whole pixels (flips, whole-pixel
 *     shifts, crops) skip the filter: rows are copied, reversed or filled.
 *   - affine, otherwise: a bilinear sample per output pixel, out-of-image
 *     neighbours counting as the fill value (MATLAB's imwarp). When the map
 *     shrinks the source, the source is first resized with the separable
 *     resampler to the output's density, so the warp does not alias.
 *
 * Random choices come from dsrt_rng_init(seed, epoch, sample id, stream),
 * one stream per option, and are drawn from the full (header) size only, so
 * they never depend on the decode scale, the thread or the call order.
 */
#include "internal.h"

/* The kernels of resample_x86.c repeat this file's arithmetic to the bit:
 * no product here may be fused into a multiply-add either, whatever -march
 * the library is built with. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define COLOR_AVX2 1
#endif

#define DEG2RAD (3.14159265358979323846 / 180.0)

// ----------------------------------------------------------------------------
// Options

dsrt_augment_options dsrt_augment_defaults(void) {
    dsrt_augment_options o;
    memset(&o, 0, sizeof o);
    o.output_height = 224;
    o.output_width = 224;
    o.output_channels = 3;
    o.size_mode = DSRT_AUGMENT_RESIZE;
    o.reflection_probability = 0.5;
    o.rand_scale[0] = o.rand_scale[1] = 1.0;
    o.rand_x_scale[0] = o.rand_x_scale[1] = 1.0;
    o.rand_y_scale[0] = o.rand_y_scale[1] = 1.0;
    o.translation_units = DSRT_AUGMENT_UNITS_INPUT;
    o.layout = DSRT_AUGMENT_F32_NCHW;
    o.norm = DSRT_AUGMENT_NORM_RESCALE;
    for (int c = 0; c < 3; c++) o.std[c] = 1.0f;
    o.decode_oversample = 1.0;
    o.decode_dc = 1;
    o.crop_scale[0] = 0.08;
    o.crop_scale[1] = 1.0;
    o.crop_ratio[0] = 3.0 / 4.0;
    o.crop_ratio[1] = 4.0 / 3.0;
    o.brightness[0] = o.brightness[1] = 1.0;
    o.contrast[0] = o.contrast[1] = 1.0;
    o.saturation[0] = o.saturation[1] = 1.0;
    o.erase_scale[0] = 0.02;
    o.erase_scale[1] = 0.33;
    o.erase_ratio[0] = 0.3;
    o.erase_ratio[1] = 3.3;
    return o;
}

static const char *const LAYOUT_NAMES[2][2] = {
    {[DSRT_AUGMENT_F32_NCHW] = "nchw", [DSRT_AUGMENT_U8_NHWC] = "nhwc"},
    {[DSRT_AUGMENT_F32_NCHW] = "float32", [DSRT_AUGMENT_U8_NHWC] = "uint8"}};

const char *dsrt_augment_layout_name(dsrt_augment_layout l) {
    return (unsigned)l < 2 ? LAYOUT_NAMES[0][l] : "unknown";
}

const char *dsrt_augment_layout_dtype(dsrt_augment_layout l) {
    return (unsigned)l < 2 ? LAYOUT_NAMES[1][l] : "unknown";
}

int dsrt_augment_layout_from_name(const char *name, int dtype, dsrt_augment_layout *l) {
    int v;
    int rc = dsrt__name_lookup(LAYOUT_NAMES[dtype != 0], 2, name, 1, &v);
    if (rc == 0) *l = (dsrt_augment_layout)v;
    return rc;
}

void dsrt_augment_preset_227(dsrt_augment_options *o) {
    *o = dsrt_augment_defaults();
    o->output_height = o->output_width = 227;
    o->resize_shorter = 256;
    o->size_mode = DSRT_AUGMENT_RANDCROP;
    o->rand_x_reflection = 1;
}

void dsrt_augment_preset_32(dsrt_augment_options *o) {
    *o = dsrt_augment_defaults();
    o->output_height = o->output_width = 32;
    o->size_mode = DSRT_AUGMENT_RESIZE;
    o->rand_x_reflection = 1;
    o->rand_x_translation[0] = o->rand_y_translation[0] = -4;
    o->rand_x_translation[1] = o->rand_y_translation[1] = 4;
    o->translation_units = DSRT_AUGMENT_UNITS_OUTPUT;
    o->translation_whole_pixels = 1;
    o->decode_oversample = 1.0;
}

/* torchvision's Normalize with ImageNet's mean and std, in [0, 255] units. */
static void imagenet_norm(dsrt_augment_options *o) {
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    o->norm = DSRT_AUGMENT_NORM_ZSCORE;
    for (int c = 0; c < 3; c++) {
        o->mean[c] = 255.0f * mean[c];
        o->std[c] = 255.0f * std[c];
    }
}

void dsrt_augment_preset_imagenet(dsrt_augment_options *o) {
    *o = dsrt_augment_defaults();
    o->output_height = o->output_width = 224;
    o->size_mode = DSRT_AUGMENT_RANDRESIZEDCROP;
    o->rand_x_reflection = 1;
    o->brightness[0] = o->contrast[0] = o->saturation[0] = 0.6;
    o->brightness[1] = o->contrast[1] = o->saturation[1] = 1.4;
    imagenet_norm(o);
}

void dsrt_augment_preset_imagenet_val(dsrt_augment_options *o) {
    *o = dsrt_augment_defaults();
    o->output_height = o->output_width = 224;
    o->resize_shorter = 256;
    o->size_mode = DSRT_AUGMENT_CENTERCROP;
    imagenet_norm(o);
}

static void preset_default(dsrt_augment_options *o) {
    *o = dsrt_augment_defaults();
}

/* The presets by name, in the order the tools list them. */
static const struct {
    const char *name;
    void (*set)(dsrt_augment_options *o);
} PRESETS[] = {{"default", preset_default},
               {"227", dsrt_augment_preset_227},
               {"32", dsrt_augment_preset_32},
               {"imagenet", dsrt_augment_preset_imagenet},
               {"imagenet-val", dsrt_augment_preset_imagenet_val}};

const char *dsrt_augment_preset_name(int i) {
    return i >= 0 && (size_t)i < DSRT_ARRAY_SIZE(PRESETS) ? PRESETS[i].name : NULL;
}

int dsrt_augment_preset_from_name(const char *name, dsrt_augment_options *o) {
    const char *names[DSRT_ARRAY_SIZE(PRESETS)];
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(PRESETS); i++) names[i] = PRESETS[i].name;
    int v;
    int rc = dsrt__name_lookup(names, DSRT_ARRAY_SIZE(PRESETS), name, 0, &v);
    if (rc != 0) return dsrt__fail_prefix(rc, "preset");
    PRESETS[v].set(o);
    return 0;
}

static int check_range(const char *name, const double r[2], double min, double max) {
    if (!isfinite(r[0]) || !isfinite(r[1]))
        return dsrt__fail(DSRT_EOPTION, "augment: %s: [%g, %g]: not finite", name, r[0], r[1]);
    if (r[0] > r[1])
        return dsrt__fail(DSRT_EOPTION, "augment: %s: [%g, %g]: low is above high", name, r[0],
                          r[1]);
    if (r[0] < min || r[1] > max)
        return dsrt__fail(DSRT_EOPTION, "augment: %s: [%g, %g]: outside [%g, %g]", name, r[0], r[1],
                          min, max);
    return 0;
}

/* A fraction range within (0, 1]. */
static int check_fraction(const char *name, const double r[2]) {
    int rc = check_range(name, r, 0.0, 1.0);
    if (rc == 0 && !(r[0] > 0.0))
        return dsrt__fail(DSRT_EOPTION, "augment: %s: [%g, %g]: low is not above 0", name, r[0],
                          r[1]);
    return rc;
}

static int check_probability(const char *name, double p) {
    if (!(p >= 0.0 && p <= 1.0))
        return dsrt__fail(DSRT_EOPTION, "augment: %s: %g: not in [0, 1]", name, p);
    return 0;
}

/* The options of the random-resized crop, the colour and the erasing. */
static int check_recipe(const dsrt_augment_options *o) {
    int rc;
    const double rmin = DSRT_AUGMENT_RATIO_MIN, rmax = DSRT_AUGMENT_RATIO_MAX,
                 cmax = DSRT_AUGMENT_COLOR_MAX;
    if ((rc = check_fraction("crop_scale", o->crop_scale)) ||
        (rc = check_range("crop_ratio", o->crop_ratio, rmin, rmax)) ||
        (rc = check_range("brightness", o->brightness, 0.0, cmax)) ||
        (rc = check_range("contrast", o->contrast, 0.0, cmax)) ||
        (rc = check_range("saturation", o->saturation, 0.0, cmax)) ||
        (rc = check_range("hue", o->hue, -0.5, 0.5)) ||
        (rc = check_probability("grayscale_probability", o->grayscale_probability)) ||
        (rc = check_probability("erase_probability", o->erase_probability)) ||
        (rc = check_fraction("erase_scale", o->erase_scale)) ||
        (rc = check_range("erase_ratio", o->erase_ratio, rmin, rmax)))
        return rc;
    if (o->erase_random != 0 && o->erase_random != 1)
        return dsrt__fail(DSRT_EOPTION, "augment: erase_random: %d: not 0 or 1", o->erase_random);
    for (int c = 0; c < o->output_channels; c++)
        if (!isfinite(o->erase_value[c]))
            return dsrt__fail(DSRT_EOPTION, "augment: erase_value[%d]: %g: not finite", c,
                              (double)o->erase_value[c]);
    if (o->erase_probability > 0.0 && o->layout != DSRT_AUGMENT_F32_NCHW)
        return dsrt__fail(DSRT_EOPTION,
                          "augment: erase_probability: %g: erasing writes normalised values, "
                          "float output only (layout DSRT_AUGMENT_F32_NCHW)",
                          o->erase_probability);
    return 0;
}

int dsrt_augment_check(const dsrt_augment_options *o) {
    int rc;
    if (!o) return dsrt__fail(DSRT_EOPTION, "augment: options: NULL");
    if (o->output_height <= 0 || o->output_height > 65535)
        return dsrt__fail(DSRT_EOPTION, "augment: output_height: %d: not in [1, 65535]",
                          o->output_height);
    if (o->output_width <= 0 || o->output_width > 65535)
        return dsrt__fail(DSRT_EOPTION, "augment: output_width: %d: not in [1, 65535]",
                          o->output_width);
    if (o->output_channels != 1 && o->output_channels != 3)
        return dsrt__fail(DSRT_EOPTION, "augment: output_channels: %d: not 1 or 3",
                          o->output_channels);
    if ((unsigned)o->size_mode > DSRT_AUGMENT_RANDRESIZEDCROP)
        return dsrt__fail(DSRT_EOPTION, "augment: size_mode: %d: unknown", (int)o->size_mode);
    if (o->resize_shorter < 0 || o->resize_shorter > 65535)
        return dsrt__fail(DSRT_EOPTION, "augment: resize_shorter: %d: not in [0, 65535]",
                          o->resize_shorter);
    if (o->rand_x_reflection != 0 && o->rand_x_reflection != 1)
        return dsrt__fail(DSRT_EOPTION, "augment: rand_x_reflection: %d: not 0 or 1",
                          o->rand_x_reflection);
    if (o->rand_y_reflection != 0 && o->rand_y_reflection != 1)
        return dsrt__fail(DSRT_EOPTION, "augment: rand_y_reflection: %d: not 0 or 1",
                          o->rand_y_reflection);
    if (!(o->reflection_probability >= 0.0 && o->reflection_probability <= 1.0))
        return dsrt__fail(DSRT_EOPTION, "augment: reflection_probability: %g: not in [0, 1]",
                          o->reflection_probability);
    /* Closed ranges within which no combination fails at a sample: scales
     * far from 0 (a tiny one made resampling tables of hundreds of GB),
     * shears far from 90 degrees (the transform became singular). */
    const double smin = DSRT_AUGMENT_SCALE_MIN, smax = DSRT_AUGMENT_SCALE_MAX,
                 shear = DSRT_AUGMENT_SHEAR_MAX, rot = DSRT_AUGMENT_ROTATION_MAX,
                 shift = DSRT_AUGMENT_TRANSLATION_MAX;
    if ((rc = check_range("rand_rotation", o->rand_rotation, -rot, rot))) return rc;
    if ((rc = check_range("rand_scale", o->rand_scale, smin, smax))) return rc;
    if ((rc = check_range("rand_x_scale", o->rand_x_scale, smin, smax))) return rc;
    if ((rc = check_range("rand_y_scale", o->rand_y_scale, smin, smax))) return rc;
    if ((rc = check_range("rand_x_shear", o->rand_x_shear, -shear, shear))) return rc;
    if ((rc = check_range("rand_y_shear", o->rand_y_shear, -shear, shear))) return rc;
    if ((rc = check_range("rand_x_translation", o->rand_x_translation, -shift, shift))) return rc;
    if ((rc = check_range("rand_y_translation", o->rand_y_translation, -shift, shift))) return rc;
    if ((unsigned)o->translation_units > DSRT_AUGMENT_UNITS_OUTPUT)
        return dsrt__fail(DSRT_EOPTION, "augment: translation_units: %d: unknown",
                          (int)o->translation_units);
    if (o->translation_whole_pixels != 0 && o->translation_whole_pixels != 1)
        return dsrt__fail(DSRT_EOPTION, "augment: translation_whole_pixels: %d: not 0 or 1",
                          o->translation_whole_pixels);
    if (o->translation_whole_pixels) {
        const char *names[2] = {"rand_x_translation", "rand_y_translation"};
        const double *r[2] = {o->rand_x_translation, o->rand_y_translation};
        for (int i = 0; i < 2; i++)
            if (ceil(r[i][0]) > floor(r[i][1]))
                return dsrt__fail(DSRT_EOPTION,
                                  "augment: %s: [%g, %g]: holds no whole number of pixels "
                                  "(translation_whole_pixels is set)",
                                  names[i], r[i][0], r[i][1]);
    }
    for (int c = 0; c < o->output_channels; c++)
        if (!(o->fill_value[c] >= 0.0f && o->fill_value[c] <= 255.0f))
            return dsrt__fail(DSRT_EOPTION, "augment: fill_value[%d]: %g: not in [0, 255]", c,
                              (double)o->fill_value[c]);
    if ((unsigned)o->layout > DSRT_AUGMENT_U8_NHWC)
        return dsrt__fail(DSRT_EOPTION, "augment: layout: %d: unknown", (int)o->layout);
    if ((unsigned)o->norm > DSRT_AUGMENT_NORM_ZSCORE)
        return dsrt__fail(DSRT_EOPTION, "augment: norm: %d: unknown", (int)o->norm);
    if (o->layout == DSRT_AUGMENT_U8_NHWC && o->norm != DSRT_AUGMENT_NORM_NONE)
        return dsrt__fail(DSRT_EOPTION,
                          "augment: norm: %d: uint8 output (layout DSRT_AUGMENT_U8_NHWC) takes "
                          "no normalisation (DSRT_AUGMENT_NORM_NONE)",
                          (int)o->norm);
    for (int c = 0; c < o->output_channels; c++) {
        if (o->norm >= DSRT_AUGMENT_NORM_ZEROCENTER && !isfinite(o->mean[c]))
            return dsrt__fail(DSRT_EOPTION, "augment: mean[%d]: %g: not finite", c,
                              (double)o->mean[c]);
        if (o->norm == DSRT_AUGMENT_NORM_ZSCORE && !(o->std[c] > 0.0f && isfinite(o->std[c])))
            return dsrt__fail(DSRT_EOPTION, "augment: std[%d]: %g: not a positive number", c,
                              (double)o->std[c]);
    }
    if (o->decode_dc != 0 && o->decode_dc != 1)
        return dsrt__fail(DSRT_EOPTION, "augment: decode_dc: %d: not 0 or 1", o->decode_dc);
    if (!(o->decode_oversample >= 1.0 && o->decode_oversample <= 64.0))
        return dsrt__fail(DSRT_EOPTION, "augment: decode_oversample: %g: not in [1, 64]",
                          o->decode_oversample);
    return check_recipe(o);
}

size_t dsrt_augment_sample_bytes(const dsrt_augment_options *o) {
    size_t n = (size_t)o->output_height * (size_t)o->output_width * (size_t)o->output_channels;
    return o->layout == DSRT_AUGMENT_F32_NCHW ? n * sizeof(float) : n;
}

// ----------------------------------------------------------------------------
// Random choices and decode size

/* One generator stream per random choice ("augm" + index), so that setting
 * one option never changes the draws of another. */
enum {
    STREAM_X_REFLECT = 1,
    STREAM_Y_REFLECT,
    STREAM_ROTATION,
    STREAM_SCALE,
    STREAM_X_SCALE,
    STREAM_Y_SCALE,
    STREAM_X_SHEAR,
    STREAM_Y_SHEAR,
    STREAM_X_TRANSLATION,
    STREAM_Y_TRANSLATION,
    STREAM_CROP_X,
    STREAM_CROP_Y,
    STREAM_RESIZED_CROP,
    STREAM_BRIGHTNESS,
    STREAM_CONTRAST,
    STREAM_SATURATION,
    STREAM_HUE,
    STREAM_COLOR_ORDER,
    STREAM_GRAYSCALE,
    STREAM_ERASE,
};
#define STREAM_BASE 0x6175676d00000000ULL

/* The working image: the stored image, or its shorter-side resize (the long
 * side truncated, as torchvision's Resize(int) computes it). */
static void working_size(const dsrt_augment_options *o, int w, int h, int *ww, int *wh) {
    w = DSRT_MAX(w, 1); /* callers check; this keeps a bad size from dividing by 0 */
    h = DSRT_MAX(h, 1);
    *ww = w;
    *wh = h;
    if (o->resize_shorter <= 0) return;
    double s = o->resize_shorter;
    if (w <= h) {
        *ww = o->resize_shorter;
        *wh = (int)(s * h / w);
    } else {
        *wh = o->resize_shorter;
        *ww = (int)(s * w / h);
    }
    if (*ww < 1) *ww = 1;
    if (*wh < 1) *wh = 1;
}

static dsrt_rng stream(uint64_t seed, uint64_t epoch, uint64_t id, uint64_t s) {
    return dsrt_rng_init(seed, epoch, id, STREAM_BASE + s);
}

static double draw_range(const double r[2], uint64_t seed, uint64_t epoch, uint64_t id,
                         uint64_t s) {
    if (r[0] == r[1]) return r[0];
    dsrt_rng g = stream(seed, epoch, id, s);
    return r[0] + (r[1] - r[0]) * dsrt_rng_uniform(&g);
}

static double draw_translation(const dsrt_augment_options *o, const double r[2], uint64_t seed,
                               uint64_t epoch, uint64_t id, uint64_t s) {
    if (!o->translation_whole_pixels) return draw_range(r, seed, epoch, id, s);
    double lo = ceil(r[0]), hi = floor(r[1]);
    if (hi <= lo) return lo;
    dsrt_rng g = stream(seed, epoch, id, s);
    return lo + (double)dsrt_rng_below(&g, (uint64_t)(hi - lo) + 1);
}

/* Offset of the output window in the working image along one axis. */
static int draw_crop(const dsrt_augment_options *o, int work, int out, uint64_t seed,
                     uint64_t epoch, uint64_t id, uint64_t s) {
    if (o->size_mode == DSRT_AUGMENT_RESIZE) return 0;
    int spare = work - out;
    if (o->size_mode == DSRT_AUGMENT_RANDCROP && spare > 0) {
        dsrt_rng g = stream(seed, epoch, id, s);
        return (int)dsrt_rng_below(&g, (uint64_t)spare + 1);
    }
    return spare >= 0 ? spare / 2 : -((1 - spare) / 2); /* floor(spare / 2) */
}

/* Python's round(): to the nearest whole number, halves to even (the
 * default rounding mode). */
static int round_even(double x) {
    return (int)nearbyint(x);
}

/* torchvision 0.14's RandomResizedCrop.get_params on a w x h image: ten
 * tries at a random area and aspect, then the central window clamped to the
 * aspect range. */
static void draw_resized_crop(const dsrt_augment_options *o, int w, int h, dsrt_rng *g,
                              dsrt_augment_params *p) {
    double area = (double)w * h;
    double lr0 = log(o->crop_ratio[0]), lr1 = log(o->crop_ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target =
            area * (o->crop_scale[0] + (o->crop_scale[1] - o->crop_scale[0]) * dsrt_rng_uniform(g));
        double aspect = exp(lr0 + (lr1 - lr0) * dsrt_rng_uniform(g));
        int cw = round_even(sqrt(target * aspect)), ch = round_even(sqrt(target / aspect));
        if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            p->crop_y = (int)dsrt_rng_below(g, (uint64_t)(h - ch) + 1);
            p->crop_x = (int)dsrt_rng_below(g, (uint64_t)(w - cw) + 1);
            p->crop_width = cw;
            p->crop_height = ch;
            return;
        }
    }
    double in_ratio = (double)w / h;
    int cw = w, ch = h;
    if (in_ratio < o->crop_ratio[0]) {
        ch = round_even(cw / o->crop_ratio[0]);
    } else if (in_ratio > o->crop_ratio[1]) {
        cw = round_even(ch * o->crop_ratio[1]);
    }
    cw = DSRT_MAX(1, DSRT_MIN(cw, w));
    ch = DSRT_MAX(1, DSRT_MIN(ch, h));
    p->crop_width = cw;
    p->crop_height = ch;
    p->crop_x = (w - cw) / 2;
    p->crop_y = (h - ch) / 2;
}

/* 1 when the colour adjustment's range is not the identity. */
static int color_on(const dsrt_augment_options *o, int op) {
    switch (op) {
    case DSRT_AUGMENT_BRIGHTNESS:
        return o->brightness[0] != 1.0 || o->brightness[1] != 1.0;
    case DSRT_AUGMENT_CONTRAST:
        return o->contrast[0] != 1.0 || o->contrast[1] != 1.0;
    case DSRT_AUGMENT_SATURATION:
        return o->saturation[0] != 1.0 || o->saturation[1] != 1.0;
    default:
        return o->hue[0] != 0.0 || o->hue[1] != 0.0;
    }
}

/* ColorJitter's choices: a factor per adjustment (each its own stream), the
 * order a random permutation (Fisher-Yates); RandomGrayscale's coin. */
static void draw_color(const dsrt_augment_options *o, uint64_t seed, uint64_t epoch, uint64_t id,
                       dsrt_augment_params *p) {
    p->brightness = draw_range(o->brightness, seed, epoch, id, STREAM_BRIGHTNESS);
    p->contrast = draw_range(o->contrast, seed, epoch, id, STREAM_CONTRAST);
    p->saturation = draw_range(o->saturation, seed, epoch, id, STREAM_SATURATION);
    p->hue = draw_range(o->hue, seed, epoch, id, STREAM_HUE);
    for (int i = 0; i < 4; i++) p->color_order[i] = i;
    int any = 0;
    for (int i = 0; i < 4; i++) any |= color_on(o, i);
    if (any) {
        dsrt_rng g = stream(seed, epoch, id, STREAM_COLOR_ORDER);
        for (int i = 3; i > 0; i--) {
            int j = (int)dsrt_rng_below(&g, (uint64_t)i + 1), t = p->color_order[i];
            p->color_order[i] = p->color_order[j];
            p->color_order[j] = t;
        }
    }
    if (o->grayscale_probability > 0.0) {
        dsrt_rng g = stream(seed, epoch, id, STREAM_GRAYSCALE);
        p->grayscale = dsrt_rng_uniform(&g) < o->grayscale_probability;
    }
}

/* torchvision 0.14's RandomErasing: the coin, then ten tries at a box of
 * random area and aspect (height / width) strictly inside the output. */
static void draw_erase(const dsrt_augment_options *o, uint64_t seed, uint64_t epoch, uint64_t id,
                       dsrt_augment_params *p) {
    if (!(o->erase_probability > 0.0)) return;
    dsrt_rng g = stream(seed, epoch, id, STREAM_ERASE);
    if (!(dsrt_rng_uniform(&g) < o->erase_probability)) return;
    int oh = o->output_height, ow = o->output_width;
    double area = (double)oh * ow;
    double lr0 = log(o->erase_ratio[0]), lr1 = log(o->erase_ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (o->erase_scale[0] +
                                (o->erase_scale[1] - o->erase_scale[0]) * dsrt_rng_uniform(&g));
        double aspect = exp(lr0 + (lr1 - lr0) * dsrt_rng_uniform(&g));
        int h = round_even(sqrt(target * aspect)), w = round_even(sqrt(target / aspect));
        if (!(h < oh && w < ow)) continue;
        p->erase_y = (int)dsrt_rng_below(&g, (uint64_t)(oh - h) + 1);
        p->erase_x = (int)dsrt_rng_below(&g, (uint64_t)(ow - w) + 1);
        p->erase_height = h;
        p->erase_width = w;
        p->erase_key = dsrt_rng_u64(&g);
        return;
    }
}

void dsrt_augment_draw(const dsrt_augment_options *o, int full_w, int full_h, uint64_t seed,
                       uint64_t epoch, uint64_t id, dsrt_augment_params *p) {
    int ww, wh;
    working_size(o, full_w, full_h, &ww, &wh);
    memset(p, 0, sizeof *p);
    if (o->rand_x_reflection) {
        dsrt_rng g = stream(seed, epoch, id, STREAM_X_REFLECT);
        p->x_reflect = dsrt_rng_uniform(&g) < o->reflection_probability;
    }
    if (o->rand_y_reflection) {
        dsrt_rng g = stream(seed, epoch, id, STREAM_Y_REFLECT);
        p->y_reflect = dsrt_rng_uniform(&g) < o->reflection_probability;
    }
    p->rotation = draw_range(o->rand_rotation, seed, epoch, id, STREAM_ROTATION);
    if (o->rand_scale[0] != 1.0 || o->rand_scale[1] != 1.0) {
        p->x_scale = p->y_scale = draw_range(o->rand_scale, seed, epoch, id, STREAM_SCALE);
    } else {
        p->x_scale = draw_range(o->rand_x_scale, seed, epoch, id, STREAM_X_SCALE);
        p->y_scale = draw_range(o->rand_y_scale, seed, epoch, id, STREAM_Y_SCALE);
    }
    p->x_shear = draw_range(o->rand_x_shear, seed, epoch, id, STREAM_X_SHEAR);
    p->y_shear = draw_range(o->rand_y_shear, seed, epoch, id, STREAM_Y_SHEAR);
    if (o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) {
        dsrt_rng g = stream(seed, epoch, id, STREAM_RESIZED_CROP);
        draw_resized_crop(o, ww, wh, &g, p);
    } else {
        p->crop_x = draw_crop(o, ww, o->output_width, seed, epoch, id, STREAM_CROP_X);
        p->crop_y = draw_crop(o, wh, o->output_height, seed, epoch, id, STREAM_CROP_Y);
    }
    /* Translation units to working-image pixels. */
    double kx, ky;
    if (o->translation_units == DSRT_AUGMENT_UNITS_INPUT) {
        kx = (double)ww / full_w;
        ky = (double)wh / full_h;
    } else if (o->size_mode == DSRT_AUGMENT_RESIZE) {
        kx = (double)ww / o->output_width;
        ky = (double)wh / o->output_height;
    } else if (o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) {
        kx = (double)p->crop_width / o->output_width;
        ky = (double)p->crop_height / o->output_height;
    } else {
        kx = ky = 1.0;
    }
    p->x_translation =
        kx * draw_translation(o, o->rand_x_translation, seed, epoch, id, STREAM_X_TRANSLATION);
    p->y_translation =
        ky * draw_translation(o, o->rand_y_translation, seed, epoch, id, STREAM_Y_TRANSLATION);
    draw_color(o, seed, epoch, id, p);
    draw_erase(o, seed, epoch, id, p);
}

/* The random-resized crop's smallest window on a w x h working image, per
 * axis: the least area at the most extreme aspect (never below 1 pixel). */
static void smallest_crop(const dsrt_augment_options *o, int w, int h, int *cw, int *ch) {
    double least = o->crop_scale[0] * w * h;
    *cw = DSRT_MAX(1, DSRT_MIN(w, (int)floor(sqrt(least * o->crop_ratio[0]))));
    *ch = DSRT_MAX(1, DSRT_MIN(h, (int)floor(sqrt(least / o->crop_ratio[1]))));
}

/* The decoded pixels per stored pixel that keep full quality, *kx and *ky
 * (at most 1 is needed, more may come out), for a sample whose window
 * (the random-resized crop's) is cw x ch working-image pixels. */
static void decode_density(const dsrt_augment_options *o, int full_w, int full_h, int cw, int ch,
                           double *kxo, double *kyo) {
    int ww, wh;
    working_size(o, full_w, full_h, &ww, &wh);
    /* Output pixels per stored pixel along each axis. */
    double kx = (double)ww / full_w, ky = (double)wh / full_h;
    if (o->size_mode == DSRT_AUGMENT_RESIZE) {
        kx *= (double)o->output_width / ww;
        ky *= (double)o->output_height / wh;
    } else if (o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) {
        kx *= (double)o->output_width / DSRT_MAX(cw, 1);
        ky *= (double)o->output_height / DSRT_MAX(ch, 1);
    }
    double sx, sy;
    if (o->rand_scale[0] != 1.0 || o->rand_scale[1] != 1.0) {
        sx = sy = o->rand_scale[1];
    } else {
        sx = o->rand_x_scale[1];
        sy = o->rand_y_scale[1];
    }
    kx *= sx;
    ky *= sy;
    int turns = o->rand_rotation[0] != 0.0 || o->rand_rotation[1] != 0.0 ||
                o->rand_x_shear[0] != 0.0 || o->rand_x_shear[1] != 0.0 ||
                o->rand_y_shear[0] != 0.0 || o->rand_y_shear[1] != 0.0;
    if (turns) kx = ky = DSRT_MAX(kx, ky);
    *kxo = kx * o->decode_oversample;
    *kyo = ky * o->decode_oversample;
}

void dsrt_augment_decode_size(const dsrt_augment_options *o, int full_w, int full_h, int *min_w,
                              int *min_h) {
    if (full_w <= 0 || full_h <= 0) {
        *min_w = *min_h = 0;
        return;
    }
    int ww, wh, cw = 0, ch = 0;
    working_size(o, full_w, full_h, &ww, &wh);
    if (o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) smallest_crop(o, ww, wh, &cw, &ch);
    double kx, ky;
    decode_density(o, full_w, full_h, cw, ch, &kx, &ky);
    double w = ceil(full_w * kx - 1e-9), h = ceil(full_h * ky - 1e-9);
    *min_w = w >= full_w ? full_w : w < 1 ? 1 : (int)w;
    *min_h = h >= full_h ? full_h : h < 1 ? 1 : (int)h;
}

// ----------------------------------------------------------------------------
// The map: output pixel coordinates to decoded-image coordinates

/* x' = m[0] x + m[1] y + m[2], y' = m[3] x + m[4] y + m[5]. */
typedef struct {
    double m[6];
} affine;

/* a after b: (a . b)(p) = a(b(p)). */
static affine compose(affine a, affine b) {
    affine r;
    r.m[0] = a.m[0] * b.m[0] + a.m[1] * b.m[3];
    r.m[1] = a.m[0] * b.m[1] + a.m[1] * b.m[4];
    r.m[2] = a.m[0] * b.m[2] + a.m[1] * b.m[5] + a.m[2];
    r.m[3] = a.m[3] * b.m[0] + a.m[4] * b.m[3];
    r.m[4] = a.m[3] * b.m[1] + a.m[4] * b.m[4];
    r.m[5] = a.m[3] * b.m[2] + a.m[4] * b.m[5] + a.m[5];
    return r;
}

static affine linear(double a, double b, double c, double d) {
    affine r = {{a, b, 0.0, c, d, 0.0}};
    return r;
}

static affine shift(double tx, double ty) {
    affine r = {{1.0, 0.0, tx, 0.0, 1.0, ty}};
    return r;
}

/*
 * The map from continuous output coordinates (pixel centres at u + 0.5) to
 * continuous coordinates in the decoded image. Fails when the augmentation
 * is singular or not finite.
 */
static int sample_map(const dsrt_augment_options *o, int full_w, int full_h, int dec_w, int dec_h,
                      const dsrt_augment_params *p, affine *out) {
    int ww, wh;
    working_size(o, full_w, full_h, &ww, &wh);
    /* Output -> augmented working image. */
    affine t;
    int rrc = o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP;
    if (o->size_mode == DSRT_AUGMENT_RESIZE) {
        t = linear((double)ww / o->output_width, 0, 0, (double)wh / o->output_height);
    } else if (rrc) {
        /* The window resized to the output, flipped within itself. */
        if (p->crop_width <= 0 || p->crop_height <= 0)
            return dsrt__fail(DSRT_EOPTION, "augment: params: crop %d x %d: not positive",
                              p->crop_width, p->crop_height);
        double sx = (double)p->crop_width / o->output_width;
        double sy = (double)p->crop_height / o->output_height;
        t = linear(p->x_reflect ? -sx : sx, 0, 0, p->y_reflect ? -sy : sy);
        t = compose(shift(p->crop_x + (p->x_reflect ? p->crop_width : 0),
                          p->crop_y + (p->y_reflect ? p->crop_height : 0)),
                    t);
    } else {
        t = shift(p->crop_x, p->crop_y);
    }
    /* The augmentation, forward: F (reflection, but for the random-resized
     * crop's, done above), then R, S, X shear, Y shear, about the centre,
     * then the translation. Its inverse takes the augmented image back to
     * the working image. */
    double c = cos(p->rotation * DEG2RAD), s = sin(p->rotation * DEG2RAD);
    affine m = linear(!rrc && p->x_reflect ? -1.0 : 1.0, 0, 0, !rrc && p->y_reflect ? -1.0 : 1.0);
    if (p->rotation != 0.0) m = compose(linear(c, s, -s, c), m);
    m = compose(linear(p->x_scale, 0, 0, p->y_scale), m);
    if (p->x_shear != 0.0) m = compose(linear(1, tan(p->x_shear * DEG2RAD), 0, 1), m);
    if (p->y_shear != 0.0) m = compose(linear(1, 0, tan(p->y_shear * DEG2RAD), 1), m);
    double det = m.m[0] * m.m[4] - m.m[1] * m.m[3];
    if (!isfinite(det) || fabs(det) < 1e-12)
        return dsrt__fail(DSRT_EOPTION,
                          "augment: params: rotation %g, scale %g x %g, shear %g, %g: singular "
                          "transform",
                          p->rotation, p->x_scale, p->y_scale, p->x_shear, p->y_shear);
    affine inv = linear(m.m[4] / det, -m.m[1] / det, -m.m[3] / det, m.m[0] / det);
    double cx = 0.5 * ww, cy = 0.5 * wh;
    t = compose(shift(-cx - p->x_translation, -cy - p->y_translation), t);
    t = compose(inv, t);
    t = compose(shift(cx, cy), t);
    /* Working image -> stored image -> decoded image. */
    t = compose(linear((double)dec_w / ww, 0, 0, (double)dec_h / wh), t);
    for (int i = 0; i < 6; i++)
        if (!isfinite(t.m[i]))
            return dsrt__fail(DSRT_EOPTION, "augment: params: the transform is not finite");
    *out = t;
    return 0;
}

// ----------------------------------------------------------------------------
// Scratch

typedef dsrt__axis axis;
typedef dsrt__sink sink;

struct dsrt_augmenter {
    const dsrt__resample_ops *ops;
    axis ax, ay;
    float *tmp;   // (source row width * channels): the vertical pass
    float *row;   // (output width, channels): one output row before the write
    float *pre;   // (pre_h, pre_w, channels): the source shrunk before a warp
    uint8_t *rgb; // (h, w, 3): a gray image as RGB, for a warp
    size_t cap_tmp, cap_row, cap_pre, cap_rgb;
    /* The normalised value of every byte per channel, for the sub and div
     * it was made with (rebuilt when they change). */
    float lut[3 * 256]; // (3, 256)
    float lut_sub[3], lut_div[3];
    int lut_ok;
    float *col; // (channels, output height, width): the sample through the colour steps
    size_t cap_col;
    float lut_id[3 * 256]; // (3, 256): each byte's value, the colour steps' input
};

// ----------------------------------------------------------------------------
// Kernels: scalar, AVX2, AVX-512

static const dsrt__resample_ops scalar_ops = {"scalar",          0, 0, dsrt__row_scalar,
                                              dsrt__copy_scalar, 0};

static const dsrt__resample_ops *resample_scalar(void) {
    return &scalar_ops;
}

/* Every kernel set, from the least to the most the CPU must have. */
static const struct {
    const char *name;
    const dsrt__resample_ops *(*get)(void);
} isas[] = {
    {"scalar", resample_scalar},
    {"avx2", dsrt__resample_avx2},
    {"avx512", dsrt__resample_avx512},
};

static int isa_index(const char *name) {
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(isas); i++)
        if (strcmp(name, isas[i].name) == 0) return (int)i;
    return -1;
}

/* The kernels named isa, or (NULL) the best this CPU has up to
 * DSRT_MAX_CPU_ISA. */
static int pick_ops(const char *isa, const dsrt__resample_ops **out) {
    if (isa) {
        int i = isa_index(isa);
        if (i < 0)
            return dsrt__fail(DSRT_EOPTION,
                              "augment: instruction set '%s' is not scalar, avx2 or "
                              "avx512",
                              isa);
        if (!(*out = isas[i].get()))
            return dsrt__fail(DSRT_EUNSUPPORTED, "augment: this CPU has no %s", isa);
        return 0;
    }
    const char *cap = getenv("DSRT_MAX_CPU_ISA");
    int top = (int)DSRT_ARRAY_SIZE(isas) - 1;
    if (cap && cap[0] && (top = isa_index(cap)) < 0)
        return dsrt__fail(DSRT_EOPTION,
                          "augment: DSRT_MAX_CPU_ISA: '%s' is not scalar, avx2 or avx512", cap);
    for (int i = top; i >= 0; i--)
        if ((*out = isas[i].get())) return 0;
    return dsrt__fail(DSRT_EUNSUPPORTED, "augment: no kernels"); /* not reached: scalar */
}

int dsrt__augmenter_set_isa(dsrt_augmenter *a, const char *isa) {
    return pick_ops(isa, &a->ops);
}

const char *dsrt_augmenter_isa(const dsrt_augmenter *a) {
    return a->ops->name;
}

int dsrt_augmenter_create(dsrt_augmenter **out) {
    *out = NULL;
    const dsrt__resample_ops *ops;
    int rc = pick_ops(NULL, &ops);
    if (rc) return rc;
    dsrt_augmenter *a = dsrt__calloc(1, sizeof *a);
    if (!a) return -ENOMEM;
    a->ops = ops;
    *out = a;
    return 0;
}

static void axis_free(axis *t) {
    free(t->start);
    free(t->count);
    free(t->w);
    free(t->bbase);
    free(t->bidx);
    free(t->bw);
    free(t->bmode);
}

void dsrt_augmenter_destroy(dsrt_augmenter *a) {
    if (!a) return;
    axis_free(&a->ax);
    axis_free(&a->ay);
    free(a->tmp);
    free(a->row);
    free(a->pre);
    free(a->rgb);
    free(a->col);
    free(a);
}

/* Makes *buf hold at least n elements of size elem (contents not kept). */
static int reserve(void **buf, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return 0;
    void *p = dsrt__malloc(n * elem);
    if (!p) return -ENOMEM;
    free(*buf);
    *buf = p;
    *cap = n;
    return 0;
}

/* The vertical pass's scratch, at least n floats, zeroed when it grows (the
 * kernels read whole vectors past what they need: never anything
 * uninitialised). */
static int tmp_reserve(dsrt_augmenter *a, size_t n) {
    if (n <= a->cap_tmp) return 0;
    int rc = reserve((void **)&a->tmp, &a->cap_tmp, n, sizeof(float));
    if (rc == 0) memset(a->tmp, 0, n * sizeof(float));
    return rc;
}

// ----------------------------------------------------------------------------
// Axis tables

/* floor(x) as an int, for x well inside int's range: the same value,
 * without a call into libm (the x86-64 baseline has no rounding
 * instruction). */
static inline int ifloor(double x) {
    if (!(x > -1e9 && x < 1e9)) return (int)floor(x);
    int i = (int)x; /* truncated towards zero */
    return i - (x < (double)i);
}

static inline double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* The source pixels [*c0, *c1) of a len-pixel axis that n outputs mapped
 * by a, b may read: the whole axis, but for the random-resized crop the
 * window's pixels alone (Pillow crops, then resizes: its filter stops at
 * the window's edges), those it covers in part included (a decode at a DCT
 * scale). */
static void axis_span(const dsrt_augment_options *o, int n, double a, double b, int len, int *c0,
                      int *c1) {
    *c0 = 0;
    *c1 = len;
    if (o->size_mode != DSRT_AUGMENT_RANDRESIZEDCROP) return;
    double e0 = b, e1 = a * n + b;
    if (e0 > e1) {
        double x = e0;
        e0 = e1;
        e1 = x;
    }
    double lo = floor(e0 + 1e-6), hi = ceil(e1 - 1e-6);
    *c0 = lo <= 0 ? 0 : lo >= len ? len : (int)lo;
    *c1 = hi <= *c0 ? *c0 : hi >= len ? len : (int)hi;
}

/*
 * Fills the taps of n outputs whose centres map to a * (i + 0.5) + b in a
 * source of len pixels, of which only [c0, c1) is read (the whole, 0 and
 * len, or a window): Pillow's resampling (the triangle filter, stretched
 * by |a| when shrinking; taps outside the pixels read dropped and the
 * weights renormalised), an output whose centre lies outside [c0, c1) being
 * fill. With |a| = 1 and centres on pixel centres every tap is a single
 * pixel.
 */
static int axis_build(axis *t, int n, double a, double b, int len, int c0, int c1) {
    if (t->start && t->built_n == n && t->built_len == len && t->built_a == a && t->built_b == b &&
        t->built_c0 == c0 && t->built_c1 == c1)
        return 0; /* the tables of the last call: a pure function of these */
    double fs = DSRT_MAX(fabs(a), 1.0), support = fs;
    int k = (int)ceil(support) * 2 + 1;
    t->built_n = -1;
    t->block = 0;
    if (reserve((void **)&t->start, &t->cap_start, (size_t)n, sizeof(int)) ||
        reserve((void **)&t->count, &t->cap_count, (size_t)n, sizeof(int)) ||
        reserve((void **)&t->w, &t->cap_w, (size_t)n * k, sizeof(float)))
        return -ENOMEM;
    t->built_n = n;
    t->built_len = len;
    t->built_a = a;
    t->built_b = b;
    t->built_c0 = c0;
    t->built_c1 = c1;
    t->n = n;
    t->k = k;
    t->lo = len;
    t->hi = 0;
    int whole = fabs(a) == 1.0;
    for (int i = 0; i < n; i++) {
        double centre = a * (i + 0.5) + b;
        float *w = t->w + (size_t)i * k;
        t->start[i] = 0;
        t->count[i] = 0;
        if (!(centre >= c0 && centre < c1)) continue;
        double px = centre - 0.5, r = whole ? nearbyint(px) : 0.0;
        if (whole && fabs(px - r) < 1e-6 && r >= c0 && r < c1) {
            t->start[i] = (int)r;
            t->count[i] = 1;
            w[0] = 1.0f;
        } else {
            int x0 = ifloor(centre - support + 0.5), x1 = ifloor(centre + support + 0.5);
            if (x0 < c0) x0 = c0;
            if (x1 > c1) x1 = c1;
            if (x1 - x0 > k) x1 = x0 + k; /* not reached: k bounds the support */
            double sum = 0.0;
            int j0 = -1, j1 = 0;
            for (int x = x0; x < x1; x++) {
                double v = triangle((x + 0.5 - centre) / fs);
                if (v == 0.0) continue; /* only at the ends: the filter is one bump */
                if (j0 < 0) j0 = x;
                w[x - j0] = (float)v;
                j1 = x + 1;
                sum += v;
            }
            if (j0 < 0) continue; /* not reached: the centre's own pixel has weight */
            for (int x = j0; x < j1; x++) w[x - j0] = (float)(w[x - j0] / sum);
            t->start[i] = j0;
            t->count[i] = j1 - j0;
        }
        t->lo = DSRT_MIN(t->lo, t->start[i]);
        t->hi = DSRT_MAX(t->hi, t->start[i] + t->count[i]);
    }
    if (t->hi <= t->lo) t->lo = t->hi = 0;
    /* A copy axis: single unit taps forming one run of consecutive sources,
     * fill only before and after it. */
    t->copy = 1;
    t->run_first = 0;
    t->run_len = 0;
    t->run_src = 0;
    t->run_dir = 1;
    int prev = 0;
    for (int i = 0; i < n; i++) {
        if (t->count[i] == 0) continue;
        if (t->count[i] != 1 || t->w[(size_t)i * k] != 1.0f) {
            t->copy = 0;
            break;
        }
        int src = t->start[i];
        if (t->run_len == 0) {
            t->run_first = i;
            t->run_src = src;
        } else if (t->run_first + t->run_len != i) {
            t->copy = 0;
            break;
        } else if (t->run_len == 1 && (src - prev == 1 || src - prev == -1)) {
            t->run_dir = src - prev;
        } else if (src - prev != t->run_dir) {
            t->copy = 0;
            break;
        }
        t->run_len++;
        prev = src;
    }
    /* Pad every entry to the same number of taps: zero weights, the window
     * moved left where it would leave the source. */
    int most = 0;
    for (int i = 0; i < n; i++) most = DSRT_MAX(most, t->count[i]);
    t->taps = most <= c1 - c0 ? most : 0;
    if (t->copy || !t->taps) return 0;
    t->lo = len;
    t->hi = 0;
    for (int i = 0; i < n; i++) {
        int cnt = t->count[i];
        if (cnt == 0) continue;
        if (cnt < most) {
            float *w = t->w + (size_t)i * k;
            int start = DSRT_MIN(t->start[i], c1 - most), off = t->start[i] - start;
            memmove(w + off, w, (size_t)cnt * sizeof *w);
            for (int j = 0; j < off; j++) w[j] = 0.0f;
            for (int j = off + cnt; j < most; j++) w[j] = 0.0f;
            t->start[i] = start;
            t->count[i] = most;
        }
        t->lo = DSRT_MIN(t->lo, t->start[i]);
        t->hi = DSRT_MAX(t->hi, t->start[i] + most);
    }
    return 0;
}

/*
 * The taps of t in blocks of `block` outputs for a vector kernel (see
 * dsrt__axis). A block whose taps lie within span values of its first is
 * permuted from two loads, within wide values (when wide is not 0) from
 * four; one reaching further is gathered; one with fill outputs, or an axis
 * whose tap counts differ, goes one output at a time.
 */
static int axis_blocks(axis *t, int block, int span, int wide) {
    if (t->block == block && t->span == span && t->wide == wide) return 0;
    int nb = (t->n + block - 1) / block, taps = t->taps;
    t->block = 0;
    if (reserve((void **)&t->bbase, &t->cap_bbase, (size_t)nb, sizeof(int)) ||
        reserve((void **)&t->bidx, &t->cap_bidx, (size_t)nb * block, sizeof(int32_t)) ||
        reserve((void **)&t->bw, &t->cap_bw, (size_t)nb * DSRT_MAX(taps, 1) * block,
                sizeof(float)) ||
        reserve((void **)&t->bmode, &t->cap_bmode, (size_t)nb, 1))
        return -ENOMEM;
    for (int b = 0; b < nb; b++) {
        int u0 = b * block, lanes = DSRT_MIN(block, t->n - u0);
        int base = INT32_MAX, top = 0, fill = 0;
        for (int i = 0; i < lanes; i++) {
            if (t->count[u0 + i] == 0) {
                fill = 1;
                continue;
            }
            base = DSRT_MIN(base, t->start[u0 + i]);
            top = DSRT_MAX(top, t->start[u0 + i] + taps);
        }
        t->bmode[b] = fill || !taps        ? BLOCK_SCALAR
                      : top - base <= span ? BLOCK_PERMUTE
                      : top - base <= wide ? BLOCK_WIDE
                                           : BLOCK_GATHER;
        t->bbase[b] = t->bmode[b] == BLOCK_SCALAR ? 0 : base - t->lo;
        int32_t *idx = t->bidx + (size_t)b * block;
        float *w = t->bw + (size_t)b * DSRT_MAX(taps, 1) * block;
        for (int i = 0; i < block; i++) {
            int live = t->bmode[b] != BLOCK_SCALAR && i < lanes;
            idx[i] = live ? t->start[u0 + i] - base : 0;
            for (int j = 0; j < taps; j++)
                w[(size_t)j * block + i] = live ? t->w[(size_t)(u0 + i) * t->k + j] : 0.0f;
        }
    }
    t->nb = nb;
    t->block = block;
    t->span = span;
    t->wide = wide;
    return 0;
}

// ----------------------------------------------------------------------------
// The write: one output row into the sample's place in the batch
//
// From here to the end of the resamplers the loops are meant to vectorise.
// GCC 12's -O2 uses the "very cheap" vectoriser cost model, which vectorises
// only loops whose trip count is a known multiple of the vector width, that
// is none of these; the dynamic model (-O3's) is asked for here alone.

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "fp-contract=off")
#endif

/* o[j] = (p[j * step] - sub) * inv for j < n: one channel of interleaved
 * floats into a row of its plane. One channel a loop, so the strided loads
 * vectorise. */
static void plane_f32(float *restrict o, const float *restrict p, ptrdiff_t step, int n, float sub,
                      float inv) {
    for (int j = 0; j < n; j++) o[j] = (p[j * step] - sub) * inv;
}

/* Writes output row v from row, (ow, ch) floats in [0, 255]. */
static void sink_row(const sink *s, int v, const float *restrict row) {
    int ow = s->ow;
    if (s->f32) {
        size_t plane = (size_t)ow * s->oh;
        float *o = (float *)s->dst + (size_t)v * ow;
        for (int c = 0; c < s->ch; c++)
            plane_f32(o + c * plane, row + c, s->ch, ow, s->sub[c], s->inv[c]);
    } else {
        int n = ow * s->ch;
        uint8_t *restrict o = (uint8_t *)s->dst + (size_t)v * n;
        for (int i = 0; i < n; i++) o[i] = dsrt__to_u8(row[i]);
    }
}

// ----------------------------------------------------------------------------
// Separable resampling

/* tmp[i] = sum_j w[j] * row(y0 + j)[lo + i] for i < len: the vertical pass
 * over contiguous bytes of the source rows. */
static void vpass(float *restrict tmp, const uint8_t *base, size_t stride, int y0, int n,
                  const float *w, size_t lo, size_t len) {
    const uint8_t *restrict r = base + (size_t)y0 * stride + lo;
    const float w0 = w[0];
    for (size_t i = 0; i < len; i++) tmp[i] = w0 * (float)r[i];
    for (int j = 1; j < n; j++) {
        const uint8_t *restrict rj = base + (size_t)(y0 + j) * stride + lo;
        const float wj = w[j];
        for (size_t i = 0; i < len; i++) tmp[i] += wj * (float)rj[i];
    }
}

/* The scalar row kernel: the vertical pass into interleaved floats, then
 * the horizontal pass into the sink. */
void dsrt__row_scalar(const dsrt__row_job *j) {
    const axis *ax = j->ax;
    size_t len = (size_t)(ax->hi - ax->lo) * (size_t)j->s->sch;
    vpass(j->tmp, j->src, j->stride, 0, j->n, j->w, 0, len);
    dsrt__hpass_sink(j->s, j->v, j->tmp, ax);
}

/* Fails unless the window holds every source pixel the axis tables read. */
static int check_window(const axis *ax, const axis *ay, const dsrt_image *img,
                        const dsrt_window *win) {
    if (ax->hi <= ax->lo || ay->hi <= ay->lo) return 0; /* all fill: nothing read */
    if (ax->lo >= win->x0 && ax->hi <= win->x0 + img->width && ay->lo >= win->y0 &&
        ay->hi <= win->y0 + img->height)
        return 0;
    return dsrt__fail(DSRT_EOPTION,
                      "augment: the sample reads columns %d..%d and rows %d..%d of the %dx%d "
                      "decoded image, the %dx%d window at %d,%d does not hold them",
                      ax->lo, ax->hi - 1, ay->lo, ay->hi - 1, win->decoded_width,
                      win->decoded_height, img->width, img->height, win->x0, win->y0);
}

/* The separable resampler: t keeps the axes. img is the window win of the
 * decoded image that t maps into. */
static int run_separable(dsrt_augmenter *a, const dsrt_augment_options *o, const sink *s,
                         const dsrt_image *img, const dsrt_window *win, affine t) {
    axis *ax = &a->ax, *ay = &a->ay;
    const dsrt__resample_ops *ops = a->ops;
    int ch = img->channels, rc;
    int x0, x1, y0, y1;
    axis_span(o, s->ow, t.m[0], t.m[2], win->decoded_width, &x0, &x1);
    axis_span(o, s->oh, t.m[4], t.m[5], win->decoded_height, &y0, &y1);
    if ((rc = axis_build(ax, s->ow, t.m[0], t.m[2], win->decoded_width, x0, x1)) ||
        (rc = axis_build(ay, s->oh, t.m[4], t.m[5], win->decoded_height, y0, y1)) ||
        (rc = check_window(ax, ay, img, win)))
        return rc;
    /* The kernels' scratch: three planes of the columns read, with slack for
     * whole vectors past the end; zeroed when made, so that nothing
     * uninitialised is ever read. */
    size_t plane = ((size_t)DSRT_MAX(ax->hi - ax->lo, 0) + 64 + 15) & ~(size_t)15;
    if ((rc = tmp_reserve(a, 3 * plane))) return rc;
    if (ops->block && (rc = axis_blocks(ax, ops->block, ops->span, ops->wide))) return rc;
    /* The window's first pixel stands for (win->x0, win->y0): the run of a
     * copy axis and the first column read, shifted to the window. */
    axis cx = *ax;
    cx.run_src -= win->x0;
    const uint8_t *rows = img->data;
    size_t lo = (size_t)(ax->lo - win->x0) * ch;
    dsrt__row_job job = {.s = s, .ax = ax, .stride = img->stride, .tmp = a->tmp, .plane = plane};
    for (int v = 0; v < s->oh; v++) {
        int cnt = ay->count[v], y = ay->start[v] - win->y0;
        const float *w = ay->w + (size_t)v * ay->k;
        if (cnt == 0) {
            dsrt__sink_fill(s, v, 0, s->ow);
        } else if (cnt == 1 && w[0] == 1.0f && ax->copy) {
            ops->copy(s, v, rows + (size_t)y * img->stride, &cx);
        } else {
            /* Zero weights (padding near the bottom edge) add nothing:
             * skipped, the sums are the same to the bit. */
            while (cnt > 1 && w[0] == 0.0f) w++, cnt--, y++;
            while (cnt > 1 && w[cnt - 1] == 0.0f) cnt--;
            job.v = v;
            job.src = rows + (size_t)y * img->stride + lo;
            job.n = cnt;
            job.w = w;
            ops->row(&job);
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Affine resampling

/* Four consecutive values as floats. */
static inline v4sf load4_f32(const float *p) {
    v4sf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v4sf load4_u8(const uint8_t *p) {
#if defined(__SSE2__)
    int32_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    __m128i z = _mm_setzero_si128(), v = _mm_cvtsi32_si128(bytes);
    return (v4sf)_mm_cvtepi32_ps(_mm_unpacklo_epi16(_mm_unpacklo_epi8(v, z), z));
#else
    v4sf v = {p[0], p[1], p[2], p[3]};
    return v;
#endif
}

#define load4(p) _Generic((p), const float * : load4_f32, const uint8_t * : load4_u8)(p)

/* Bilinear sample at (x, y) in pixel-index coordinates (pixel i's centre at
 * i); neighbours outside the w x h source count as the fill value.
 * 3-channel pixels are read four values at a time, the fourth ignored: vec
 * says the source has slack after its last pixel; without it only pixels
 * with another one after them on their row take that path. */
#define DEFINE_BILERP(name, type, vec)                                                             \
    static inline __attribute__((always_inline)) void name(                                        \
        float *restrict out, const type *restrict src, size_t stride, int w, int h, int ch,        \
        double x, double y, const float *fill) {                                                   \
        if (!(x > -1.0 && x < w && y > -1.0 && y < h)) {                                           \
            for (int c = 0; c < ch; c++) out[c] = fill[c];                                         \
            return;                                                                                \
        }                                                                                          \
        int x0 = (int)(x + 1.0) - 1, y0 = (int)(y + 1.0) - 1; /* floor, as x, y > -1 */            \
        float ax = (float)(x - x0), ay = (float)(y - y0);                                          \
        float w00 = (1.0f - ax) * (1.0f - ay), w01 = ax * (1.0f - ay);                             \
        float w10 = (1.0f - ax) * ay, w11 = ax * ay;                                               \
        if (x0 >= 0 && x0 + 1 < w && y0 >= 0 && y0 + 1 < h) {                                      \
            const type *p = src + (size_t)y0 * stride + (size_t)x0 * ch, *q = p + stride;          \
            if (ch == 3 && (vec || x0 + 2 < w)) { /* 4 lanes: R, G, B and one ignored */           \
                v4sf a = load4(p), b = load4(p + 3), c = load4(q), d = load4(q + 3);               \
                v4sf r = w00 * a + w01 * b + w10 * c + w11 * d;                                    \
                out[0] = r[0], out[1] = r[1], out[2] = r[2];                                       \
                return;                                                                            \
            }                                                                                      \
            for (int c = 0; c < ch; c++)                                                           \
                out[c] = w00 * p[c] + w01 * p[ch + c] + w10 * q[c] + w11 * q[ch + c];              \
            return;                                                                                \
        }                                                                                          \
        int in_x0 = x0 >= 0, in_x1 = x0 + 1 < w, in_y0 = y0 >= 0, in_y1 = y0 + 1 < h;              \
        const type *p = src + (size_t)(in_y0 ? y0 : 0) * stride;                                   \
        const type *q = src + (size_t)(in_y1 ? y0 + 1 : 0) * stride;                               \
        for (int c = 0; c < ch; c++) {                                                             \
            float f = fill[c];                                                                     \
            float v00 = in_y0 && in_x0 ? (float)p[(size_t)x0 * ch + c] : f;                        \
            float v01 = in_y0 && in_x1 ? (float)p[(size_t)(x0 + 1) * ch + c] : f;                  \
            float v10 = in_y1 && in_x0 ? (float)q[(size_t)x0 * ch + c] : f;                        \
            float v11 = in_y1 && in_x1 ? (float)q[(size_t)(x0 + 1) * ch + c] : f;                  \
            out[c] = w00 * v00 + w01 * v01 + w10 * v10 + w11 * v11;                                \
        }                                                                                          \
    }

DEFINE_BILERP(bilerp_u8, uint8_t, 0)
DEFINE_BILERP(bilerp_f32, float, 1)

/* One output row of the warp: row[u] = source at t(u + 0.5, v + 0.5). */
#define DEFINE_WARP_ROW(name, bilerp, type)                                                        \
    static void name(float *restrict row, int ow, int v, const affine *t, const type *src,         \
                     size_t stride, int w, int h, int ch, const float *fill) {                     \
        double yc = v + 0.5;                                                                       \
        double bx = t->m[1] * yc + t->m[2] - 0.5, by = t->m[4] * yc + t->m[5] - 0.5;               \
        if (ch == 3)                                                                               \
            for (int u = 0; u < ow; u++) {                                                         \
                double xc = u + 0.5;                                                               \
                bilerp(row + 3 * u, src, stride, w, h, 3, t->m[0] * xc + bx, t->m[3] * xc + by,    \
                       fill);                                                                      \
            }                                                                                      \
        else                                                                                       \
            for (int u = 0; u < ow; u++) {                                                         \
                double xc = u + 0.5;                                                               \
                bilerp(row + u, src, stride, w, h, 1, t->m[0] * xc + bx, t->m[3] * xc + by, fill); \
            }                                                                                      \
    }

DEFINE_WARP_ROW(warp_row_u8, bilerp_u8, uint8_t)
DEFINE_WARP_ROW(warp_row_f32, bilerp_f32, float)

/*
 * Rotation, scale or shear: a bilinear sample per output pixel. When the map
 * spreads output pixels more than one source pixel apart (|rows of the
 * Jacobian| > 1), the source is first resized with the antialiasing filter to
 * the output's density and the warp reads that.
 */
static int run_affine(dsrt_augmenter *a, const sink *s, const dsrt_image *img, affine t) {
    int ch = img->channels, w = img->width, h = img->height, rc;
    double fx = hypot(t.m[0], t.m[1]), fy = hypot(t.m[3], t.m[4]);
    int pw = w, ph = h;
    if (fx > 1.0 + 1e-9) pw = DSRT_MAX(1, (int)lround(w / fx));
    if (fy > 1.0 + 1e-9) ph = DSRT_MAX(1, (int)lround(h / fy));
    if ((rc = reserve((void **)&a->row, &a->cap_row, (size_t)s->ow * ch, sizeof(float)))) return rc;
    if (pw == w && ph == h) {
        for (int v = 0; v < s->oh; v++) {
            warp_row_u8(a->row, s->ow, v, &t, img->data, img->stride, w, h, ch, s->fill);
            sink_row(s, v, a->row);
        }
        return 0;
    }
    /* Only the part of the shrunk image that the output reads is made: the
     * bounding box of the output's corners, with a pixel to spare for the
     * bilinear neighbours. Outside it the warp sees fill, which is right only
     * where the box stops at the image's edge: the margin sees to it. */
    t = compose(linear((double)pw / w, 0, 0, (double)ph / h), t);
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int corner = 0; corner < 4; corner++) {
        double u = (corner & 1) ? s->ow : 0, v = (corner & 2) ? s->oh : 0;
        double x = t.m[0] * u + t.m[1] * v + t.m[2], y = t.m[3] * u + t.m[4] * v + t.m[5];
        x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
    }
    int rx0 = (int)fmax(0.0, floor(x0 - 0.5)), rx1 = (int)fmin(pw, floor(x1 - 0.5) + 2);
    int ry0 = (int)fmax(0.0, floor(y0 - 0.5)), ry1 = (int)fmin(ph, floor(y1 - 0.5) + 2);
    if (rx1 <= rx0 || ry1 <= ry0) { /* the output sees none of the image */
        for (int v = 0; v < s->oh; v++) dsrt__sink_fill(s, v, 0, s->ow);
        return 0;
    }
    int rw = rx1 - rx0, rh = ry1 - ry0;
    axis *ax = &a->ax, *ay = &a->ay;
    double sx = (double)w / pw, sy = (double)h / ph;
    if ((rc = axis_build(ax, rw, sx, rx0 * sx, w, 0, w)) ||
        (rc = axis_build(ay, rh, sy, ry0 * sy, h, 0, h)) ||
        (rc = tmp_reserve(a, (size_t)(ax->hi - ax->lo) * ch + 4)) ||
        (rc = reserve((void **)&a->pre, &a->cap_pre, (size_t)rw * rh * ch + 4, sizeof(float))))
        return rc;
    size_t lo = (size_t)ax->lo * ch, len = (size_t)(ax->hi - ax->lo) * ch;
    size_t pstride = (size_t)rw * ch;
    for (int y = 0; y < rh; y++) {
        vpass(a->tmp, img->data, img->stride, ay->start[y], ay->count[y], ay->w + (size_t)y * ay->k,
              lo, len);
        dsrt__hpass_hwc(a->pre + y * pstride, a->tmp, ax, s->fill, ch);
    }
    t = compose(shift(-rx0, -ry0), t);
    for (int v = 0; v < s->oh; v++) {
        warp_row_f32(a->row, s->ow, v, &t, a->pre, pstride, rw, rh, ch, s->fill);
        sink_row(s, v, a->row);
    }
    return 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// ----------------------------------------------------------------------------
// Colour and erasing
//
// torchvision's ColorJitter and RandomGrayscale on the PIL image, which
// works on bytes: each adjustment is PIL's blend of the sample with a
// "degenerate" image (black, the mean gray, the pixel's gray), computed in
// single precision and truncated to a byte (Pillow's ImagingBlend), the hue
// a turn of PIL's HSV. The steps run on the resampled sample held as float
// planes of whole numbers, in cache, and the last pass writes the sample's
// place with the normalisation.

static inline uint8_t clip8(int v) {
    return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
}

/* One pixel through PIL's RGB -> HSV, a hue shift of `shift` (mod 256) and
 * HSV -> RGB (Pillow's Convert.c, which follows Python's colorsys). */
static void pil_hue(uint8_t *px, uint8_t shift) {
    int r = px[0], g = px[1], b = px[2];
    int maxc = DSRT_MAX(r, DSRT_MAX(g, b)), minc = DSRT_MIN(r, DSRT_MIN(g, b));
    if (maxc == minc) return; /* saturation 0: the hue plays no part */
    float cr = (float)(maxc - minc);
    float sat = cr / (float)maxc;
    float rc = (float)(maxc - r) / cr, gc = (float)(maxc - g) / cr, bc = (float)(maxc - b) / cr;
    float hf;
    if (r == maxc)
        hf = bc - gc;
    else if (g == maxc)
        hf = (float)(2.0 + rc - bc);
    else
        hf = (float)(4.0 + gc - rc);
    hf = (float)fmod(hf / 6.0 + 1.0, 1.0);
    uint8_t h = (uint8_t)(clip8((int)(hf * 255.0)) + shift), s = clip8((int)(sat * 255.0));
    uint8_t v = (uint8_t)maxc;
    if (s == 0) {
        px[0] = px[1] = px[2] = v;
        return;
    }
    int i = (int)floor((float)h * 6.0 / 255.0);
    float f = (float)((float)h * 6.0 / 255.0 - (float)i);
    float fs = (float)((float)s / 255.0);
    uint8_t up = clip8((int)round((float)v * (1.0 - fs)));
    uint8_t uq = clip8((int)round((float)v * (1.0 - fs * f)));
    uint8_t ut = clip8((int)round((float)v * (1.0 - fs * (1.0 - f))));
    const uint8_t rgb[6][3] = {{v, ut, up}, {uq, v, up}, {up, v, ut},
                               {up, uq, v}, {ut, up, v}, {v, up, uq}};
    memcpy(px, rgb[i % 6], 3);
}

/* 1 when the sample has a colour step: an adjustment the options ask for,
 * or the grayscale the draw chose. */
static int color_any(const dsrt_augment_options *o, const dsrt_augment_params *p) {
    for (int op = 0; op < 4; op++)
        if (color_on(o, op)) return 1;
    return o->grayscale_probability > 0.0 && p->grayscale;
}

/* The sample is held as planes of floats whose values are whole numbers in
 * [0, 255], the bytes PIL holds: every step is exact in single precision
 * (the luma's fixed-point sum stays below 2^24), so four values at a time
 * (SSE2, every x86-64) compute PIL's bytes, and the scalar code the same. */

/* PIL's blend as floats: in1 + alpha d, clipped and truncated. */
static inline float blend_f(float in1, float d, float alpha) {
    float v = in1 + alpha * d;
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    return (float)(int)v;
}

/* PIL's convert("L") of whole-number floats, exactly. */
static inline float luma_f(float r, float g, float b) {
    float x = r * 19595.0f + g * 38470.0f + b * 7471.0f + 32768.0f;
    return (float)(int)(x * (1.0f / 65536.0f));
}

#if defined(__SSE2__)
static inline __m128 clip_trunc4(__m128 v) {
    v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.0f));
    return _mm_cvtepi32_ps(_mm_cvttps_epi32(v));
}

static inline __m128 blend4(__m128 in1, __m128 d, __m128 alpha) {
    return clip_trunc4(_mm_add_ps(in1, _mm_mul_ps(alpha, d)));
}

static inline __m128 luma4(__m128 r, __m128 g, __m128 b) {
    __m128 x = _mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_mul_ps(r, _mm_set1_ps(19595.0f)),
                                                _mm_mul_ps(g, _mm_set1_ps(38470.0f))),
                                     _mm_mul_ps(b, _mm_set1_ps(7471.0f))),
                          _mm_set1_ps(32768.0f));
    return _mm_cvtepi32_ps(_mm_cvttps_epi32(_mm_mul_ps(x, _mm_set1_ps(1.0f / 65536.0f))));
}
#define VEC4 4
#else
#define VEC4 0
#endif

#if defined(COLOR_AVX2)
/* The same passes eight values at a time, for CPUs with AVX2 (the
 * augmenter's kernels say so): the same exact operations. */
#define AVX2_FN __attribute__((target("avx2")))

AVX2_FN static inline __m256 clip_trunc8(__m256 v) {
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
    return _mm256_cvtepi32_ps(_mm256_cvttps_epi32(v));
}

AVX2_FN static inline __m256 luma8(__m256 r, __m256 g, __m256 b) {
    __m256 x =
        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(r, _mm256_set1_ps(19595.0f)),
                                                  _mm256_mul_ps(g, _mm256_set1_ps(38470.0f))),
                                    _mm256_mul_ps(b, _mm256_set1_ps(7471.0f))),
                      _mm256_set1_ps(32768.0f));
    return _mm256_cvtepi32_ps(
        _mm256_cvttps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(1.0f / 65536.0f))));
}

AVX2_FN static size_t round8(float *restrict v, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i,
                         clip_trunc8(_mm256_add_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(0.5f))));
    return i;
}

AVX2_FN static size_t blend8(float *restrict v, size_t n, float in1, float f) {
    size_t i = 0;
    __m256 a = _mm256_set1_ps(in1), fa = _mm256_set1_ps(f);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i,
                         clip_trunc8(_mm256_add_ps(
                             a, _mm256_mul_ps(fa, _mm256_sub_ps(_mm256_loadu_ps(v + i), a)))));
    return i;
}

AVX2_FN static size_t saturation8(float *restrict r, float *restrict g, float *restrict b, size_t n,
                                  float f) {
    size_t i = 0;
    __m256 fa = _mm256_set1_ps(f);
    for (; i + 8 <= n; i += 8) {
        __m256 vr = _mm256_loadu_ps(r + i), vg = _mm256_loadu_ps(g + i),
               vb = _mm256_loadu_ps(b + i);
        __m256 l = luma8(vr, vg, vb);
        _mm256_storeu_ps(r + i,
                         clip_trunc8(_mm256_add_ps(l, _mm256_mul_ps(fa, _mm256_sub_ps(vr, l)))));
        _mm256_storeu_ps(g + i,
                         clip_trunc8(_mm256_add_ps(l, _mm256_mul_ps(fa, _mm256_sub_ps(vg, l)))));
        _mm256_storeu_ps(b + i,
                         clip_trunc8(_mm256_add_ps(l, _mm256_mul_ps(fa, _mm256_sub_ps(vb, l)))));
    }
    return i;
}

AVX2_FN static size_t norm8(float *restrict o, const float *restrict v, size_t n, float sub,
                            float div) {
    size_t i = 0;
    __m256 sv = _mm256_set1_ps(sub), dv = _mm256_set1_ps(div);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), sv), dv));
    return i;
}
#endif

#if defined(COLOR_AVX2)
/*
 * Sixteen pixels at a time for CPUs with AVX-512 (the augmenter's kernels
 * say so), three planes and float output: the same exact operations as the
 * passes above, but every step of a pixel runs before the next pixels are
 * loaded, so values go through memory twice at most (with contrast: the
 * steps before it and the gray sum, then the rest) instead of once a step.
 * The final write streams past the cache when the sample's place is
 * aligned: a sample is read by the consumer, not by this thread.
 */
#define AVX512_FN __attribute__((target("avx512f,avx512dq")))

AVX512_FN static inline __m512 clip_trunc16(__m512 v) {
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
    return _mm512_cvtepi32_ps(_mm512_cvttps_epi32(v));
}

AVX512_FN static inline __m512 blend16(__m512 in1, __m512 v, __m512 f) {
    return clip_trunc16(_mm512_add_ps(in1, _mm512_mul_ps(f, _mm512_sub_ps(v, in1))));
}

AVX512_FN static inline __m512 luma16(__m512 r, __m512 g, __m512 b) {
    __m512 x =
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(r, _mm512_set1_ps(19595.0f)),
                                                  _mm512_mul_ps(g, _mm512_set1_ps(38470.0f))),
                                    _mm512_mul_ps(b, _mm512_set1_ps(7471.0f))),
                      _mm512_set1_ps(32768.0f));
    return _mm512_cvtepi32_ps(
        _mm512_cvttps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(1.0f / 65536.0f))));
}

/* The steps (brightness, contrast, saturation) on one vector of pixels. */
AVX512_FN static inline void steps16(const int *steps, int ns, const float *fac, __m512 mean,
                                     __m512 *r, __m512 *g, __m512 *b) {
    for (int k = 0; k < ns; k++) {
        __m512 f = _mm512_set1_ps(fac[k]);
        if (steps[k] == DSRT_AUGMENT_SATURATION) {
            __m512 l = luma16(*r, *g, *b);
            *r = blend16(l, *r, f);
            *g = blend16(l, *g, f);
            *b = blend16(l, *b, f);
        } else {
            __m512 m = steps[k] == DSRT_AUGMENT_CONTRAST ? mean : _mm512_setzero_ps();
            *r = blend16(m, *r, f);
            *g = blend16(m, *g, f);
            *b = blend16(m, *b, f);
        }
    }
}

/* The first pass with contrast: rounding, the steps before it, back into
 * the planes; returns the sum of the gray (float lanes hold whole numbers
 * below 2^24 between flushes: exact). */
AVX512_FN static double color_first16(float *const pl[3], size_t n, const int *steps, int ns,
                                      const float *fac) {
    double sum = 0.0;
    __m512 half = _mm512_set1_ps(0.5f), acc = _mm512_setzero_ps();
    size_t since = 0;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v[3];
        for (int c = 0; c < 3; c++)
            v[c] = clip_trunc16(_mm512_add_ps(_mm512_maskz_loadu_ps(k, pl[c] + i), half));
        steps16(steps, ns, fac, _mm512_setzero_ps(), &v[0], &v[1], &v[2]);
        for (int c = 0; c < 3; c++) _mm512_mask_storeu_ps(pl[c] + i, k, v[c]);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, luma16(v[0], v[1], v[2])));
        if (++since == 4096) {
            sum += (double)_mm512_reduce_add_ps(acc);
            acc = _mm512_setzero_ps();
            since = 0;
        }
    }
    float t[16];
    _mm512_storeu_ps(t, acc);
    for (int l = 0; l < 16; l++) sum += t[l];
    return sum;
}

/* The rest: (rounding, when no contrast split the passes), the steps, the
 * grayscale, the normalised float planes. */
AVX512_FN static void color_last16(float *const pl[3], size_t n, int round, const int *steps,
                                   int ns, const float *fac, float mean, int gray, const sink *s) {
    float *o = (float *)s->dst;
    int stream = ((uintptr_t)o & 63) == 0 && (n & 15) == 0;
    __m512 half = _mm512_set1_ps(0.5f), mv = _mm512_set1_ps(mean);
    __m512 sub[3], div[3];
    for (int c = 0; c < 3; c++) {
        sub[c] = _mm512_set1_ps(s->sub[c]);
        div[c] = _mm512_set1_ps(s->div[c]);
    }
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v[3];
        for (int c = 0; c < 3; c++) {
            v[c] = _mm512_maskz_loadu_ps(k, pl[c] + i);
            if (round) v[c] = clip_trunc16(_mm512_add_ps(v[c], half));
        }
        steps16(steps, ns, fac, mv, &v[0], &v[1], &v[2]);
        if (gray) v[0] = v[1] = v[2] = luma16(v[0], v[1], v[2]);
        for (int c = 0; c < 3; c++) {
            __m512 y = _mm512_div_ps(_mm512_sub_ps(v[c], sub[c]), div[c]);
            if (stream)
                _mm512_stream_ps(o + c * n + i, y);
            else if (k == 0xffff) /* plain, unmasked: faster where the line is not in cache */
                _mm512_storeu_ps(o + c * n + i, y);
            else
                _mm512_mask_storeu_ps(o + c * n + i, k, y);
        }
    }
    if (stream) _mm_sfence();
}
#endif

/* The resampled values rounded to bytes, as the byte output rounds them. */
static void round_pass(float *restrict v, size_t n, int wide) {
    size_t i = 0;
#if defined(COLOR_AVX2)
    if (wide) i = round8(v, n);
#endif
#if VEC4
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(v + i, clip_trunc4(_mm_add_ps(_mm_loadu_ps(v + i), _mm_set1_ps(0.5f))));
#endif
    for (; i < n; i++) v[i] = blend_f(v[i], 0.5f, 1.0f);
}

/* The blend of every value with the constant in1. */
static void blend_pass(float *restrict v, size_t n, float in1, float f, int wide) {
    size_t i = 0;
#if defined(COLOR_AVX2)
    if (wide) i = blend8(v, n, in1, f);
#endif
#if VEC4
    __m128 a = _mm_set1_ps(in1), fa = _mm_set1_ps(f);
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(v + i, blend4(a, _mm_sub_ps(_mm_loadu_ps(v + i), a), fa));
#endif
    for (; i < n; i++) v[i] = blend_f(in1, v[i] - in1, f);
}

/* The sum of the pixels' gray (partial sums below 2^24: exact). */
static double gray_sum(const float *restrict r, const float *restrict g, const float *restrict b,
                       size_t n) {
    double sum = 0.0;
    size_t i = 0;
#if VEC4
    while (i + 4 <= n) {
        __m128 acc = _mm_setzero_ps();
        for (int k = 0; k < 8192 && i + 4 <= n; k++, i += 4)
            acc = _mm_add_ps(acc,
                             luma4(_mm_loadu_ps(r + i), _mm_loadu_ps(g + i), _mm_loadu_ps(b + i)));
        float t[4];
        _mm_storeu_ps(t, acc);
        sum += (double)t[0] + t[1] + t[2] + t[3];
    }
#endif
    for (; i < n; i++) sum += luma_f(r[i], g[i], b[i]);
    return sum;
}

/* ImageEnhance.Color: each pixel blended with its own gray. */
static void saturation_pass(float *restrict r, float *restrict g, float *restrict b, size_t n,
                            float f, int wide) {
    size_t i = 0;
#if defined(COLOR_AVX2)
    if (wide) i = saturation8(r, g, b, n, f);
#endif
#if VEC4
    __m128 fa = _mm_set1_ps(f);
    for (; i + 4 <= n; i += 4) {
        __m128 vr = _mm_loadu_ps(r + i), vg = _mm_loadu_ps(g + i), vb = _mm_loadu_ps(b + i);
        __m128 l = luma4(vr, vg, vb);
        _mm_storeu_ps(r + i, blend4(l, _mm_sub_ps(vr, l), fa));
        _mm_storeu_ps(g + i, blend4(l, _mm_sub_ps(vg, l), fa));
        _mm_storeu_ps(b + i, blend4(l, _mm_sub_ps(vb, l), fa));
    }
#endif
    for (; i < n; i++) {
        float l = luma_f(r[i], g[i], b[i]);
        r[i] = blend_f(l, r[i] - l, f);
        g[i] = blend_f(l, g[i] - l, f);
        b[i] = blend_f(l, b[i] - l, f);
    }
}

static void gray_pass(float *restrict r, float *restrict g, float *restrict b, size_t n) {
    size_t i = 0;
#if VEC4
    for (; i + 4 <= n; i += 4) {
        __m128 l = luma4(_mm_loadu_ps(r + i), _mm_loadu_ps(g + i), _mm_loadu_ps(b + i));
        _mm_storeu_ps(r + i, l);
        _mm_storeu_ps(g + i, l);
        _mm_storeu_ps(b + i, l);
    }
#endif
    for (; i < n; i++) r[i] = g[i] = b[i] = luma_f(r[i], g[i], b[i]);
}

/* The hue step, one pixel at a time through PIL's HSV. */
static void hue_pass(float *restrict r, float *restrict g, float *restrict b, size_t n,
                     uint8_t shift) {
    for (size_t i = 0; i < n; i++) {
        uint8_t q[3] = {(uint8_t)r[i], (uint8_t)g[i], (uint8_t)b[i]};
        pil_hue(q, shift);
        r[i] = q[0], g[i] = q[1], b[i] = q[2];
    }
}

/* Colour step op of p on n values of each of the ch planes pl (the mean
 * gray m for contrast). */
static void color_step(int op, const dsrt_augment_params *p, float *const pl[3], size_t n, int ch,
                       float m, int wide) {
    if (op == DSRT_AUGMENT_BRIGHTNESS) {
        for (int c = 0; c < ch; c++) blend_pass(pl[c], n, 0.0f, (float)p->brightness, wide);
    } else if (op == DSRT_AUGMENT_CONTRAST) {
        for (int c = 0; c < ch; c++) blend_pass(pl[c], n, m, (float)p->contrast, wide);
    } else if (ch == 3 && op == DSRT_AUGMENT_SATURATION) {
        saturation_pass(pl[0], pl[1], pl[2], n, (float)p->saturation, wide);
    } else if (ch == 3 && op == DSRT_AUGMENT_HUE) {
        /* torchvision: np.uint8(hue * 255) added to PIL's hue byte. */
        hue_pass(pl[0], pl[1], pl[2], n, (uint8_t)(unsigned)(int)(p->hue * 255.0));
    }
}

/* Whole-number values to the normalised ones: ((float)x - sub) / div, the
 * value the whole-pixel table holds, bit for bit. */
static void norm_pass(float *restrict o, const float *restrict v, size_t n, float sub, float div,
                      int wide) {
    size_t i = 0;
#if defined(COLOR_AVX2)
    if (wide) i = norm8(o, v, n, sub, div);
#endif
#if VEC4
    __m128 sv = _mm_set1_ps(sub), dv = _mm_set1_ps(div);
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(o + i, _mm_div_ps(_mm_sub_ps(_mm_loadu_ps(v + i), sv), dv));
#endif
    for (; i < n; i++) o[i] = (v[i] - sub) / div;
}

static void bytes_pass(uint8_t *restrict out, const float *restrict v, size_t n, int step) {
    for (size_t i = 0; i < n; i++) out[i * step] = (uint8_t)(int)v[i];
}

/*
 * The colour steps of p, in its order, on the sample resampled (raw values
 * in [0, 255]) into the planes pl (rounded to bytes first, as PIL's resize
 * leaves them), then its write into the sample's place: normalised float
 * planes, or interleaved bytes (wide: AVX2). The steps run on tiles of a few thousand
 * pixels that stay in the first-level cache, every step of a tile before
 * the next tile: one pass over the sample, two with contrast (the steps
 * before it and the sum of the gray its mean needs, then the rest).
 */
static void color_write(const dsrt_augment_options *o, const dsrt_augment_params *p, const sink *s,
                        float *const pl[3], int wide) {
    enum { TILE = 2048 };
    int ch = s->ch;
    size_t n = (size_t)s->ow * s->oh;
    int steps[4], ns = 0, split = -1;
    for (int k = 0; k < 4; k++) {
        int op = p->color_order[k];
        if (!color_on(o, op)) continue;
        if (op == DSRT_AUGMENT_CONTRAST) split = ns;
        steps[ns++] = op;
    }
    int gray = ch == 3 && o->grayscale_probability > 0.0 && p->grayscale;
    int first_end = split >= 0 ? split : ns;
#if defined(COLOR_AVX2)
    int hue = 0;
    float fac[4];
    for (int k = 0; k < ns; k++) {
        hue |= steps[k] == DSRT_AUGMENT_HUE;
        fac[k] = (float)(steps[k] == DSRT_AUGMENT_BRIGHTNESS ? p->brightness
                         : steps[k] == DSRT_AUGMENT_CONTRAST ? p->contrast
                                                             : p->saturation);
    }
    if (wide == 2 && ch == 3 && s->f32 && !hue) {
        float mean = 0.0f;
        if (split >= 0) {
            double gsum = color_first16(pl, n, steps, split, fac);
            mean = (float)(int)(gsum / (double)n + 0.5);
        }
        int k0 = split >= 0 ? split : 0;
        color_last16(pl, n, split < 0, steps + k0, ns - k0, fac + k0, mean, gray, s);
        return;
    }
#endif
    double sum = 0.0;
    for (size_t t = 0; t < n; t += TILE) {
        size_t m = n - t < TILE ? n - t : TILE;
        float *tp[3] = {pl[0] + t, ch == 3 ? pl[1] + t : NULL, ch == 3 ? pl[2] + t : NULL};
        for (int c = 0; c < ch; c++) round_pass(tp[c], m, wide);
        for (int k = 0; k < first_end; k++) color_step(steps[k], p, tp, m, ch, 0.0f, wide);
        if (split >= 0) {
            /* ImageEnhance.Contrast: the mean of the gray image, rounded. */
            if (ch == 3)
                sum += gray_sum(tp[0], tp[1], tp[2], m);
            else
                for (size_t i = 0; i < m; i++) sum += tp[0][i];
        }
    }
    float mean = split >= 0 ? (float)(int)(sum / (double)n + 0.5) : 0.0f;
    for (size_t t = 0; t < n; t += TILE) {
        size_t m = n - t < TILE ? n - t : TILE;
        float *tp[3] = {pl[0] + t, ch == 3 ? pl[1] + t : NULL, ch == 3 ? pl[2] + t : NULL};
        for (int k = first_end; k < ns; k++) color_step(steps[k], p, tp, m, ch, mean, wide);
        if (gray) gray_pass(tp[0], tp[1], tp[2], m);
        for (int c = 0; c < ch; c++) {
            if (s->f32)
                norm_pass((float *)s->dst + c * n + t, tp[c], m, s->sub[c], s->div[c], wide);
            else
                bytes_pass((uint8_t *)s->dst + t * ch + c, tp[c], m, ch);
        }
    }
}

/* RandomErasing's box of p, after the normalisation: the constant values,
 * or standard normal ones from the box's own generator (Box-Muller). */
static void erase_write(const dsrt_augment_options *o, const dsrt_augment_params *p, float *dst) {
    if (!(o->erase_probability > 0.0) || p->erase_width <= 0 || p->erase_height <= 0) return;
    int ow = o->output_width, oh = o->output_height;
    int x0 = DSRT_MAX(p->erase_x, 0), y0 = DSRT_MAX(p->erase_y, 0);
    int x1 = DSRT_MIN(ow, p->erase_x + p->erase_width),
        y1 = DSRT_MIN(oh, p->erase_y + p->erase_height);
    if (x1 <= x0 || y1 <= y0) return;
    size_t plane = (size_t)ow * oh;
    dsrt_rng g = dsrt_rng_init(p->erase_key, 0, 0, STREAM_BASE + STREAM_ERASE);
    int have = 0;
    double spare = 0.0;
    for (int c = 0; c < o->output_channels; c++)
        for (int y = y0; y < y1; y++) {
            float *row = dst + c * plane + (size_t)y * ow;
            if (!o->erase_random) {
                for (int x = x0; x < x1; x++) row[x] = o->erase_value[c];
                continue;
            }
            for (int x = x0; x < x1; x++) {
                if (have) {
                    row[x] = (float)spare;
                    have = 0;
                    continue;
                }
                double u1 = 1.0 - dsrt_rng_uniform(&g), u2 = dsrt_rng_uniform(&g);
                double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
                row[x] = (float)(r * cos(a));
                spare = r * sin(a);
                have = 1;
            }
        }
}

// ----------------------------------------------------------------------------
// Applying

/* The image and where it lies, checked: win NULL is the whole image. */
static int check_image(const dsrt_augment_options *o, const dsrt_image *img, const dsrt_window *win,
                       dsrt_window *out) {
    if (!img || !img->data || img->width <= 0 || img->height <= 0)
        return dsrt__fail(DSRT_EOPTION, "augment: image: empty");
    if (img->channels != o->output_channels && !(img->channels == 1 && o->output_channels == 3))
        return dsrt__fail(DSRT_EOPTION,
                          "augment: image has %d channel(s), output_channels is %d: decode with "
                          "channels = %d",
                          img->channels, o->output_channels, o->output_channels);
    if (img->stride < (size_t)img->width * img->channels)
        return dsrt__fail(DSRT_EOPTION, "augment: image: stride %zu below width %d x %d channels",
                          img->stride, img->width, img->channels);
    dsrt_window whole = {0, 0, img->width, img->height};
    if (!win) win = &whole;
    if (win->x0 < 0 || win->y0 < 0 || win->decoded_width <= 0 || win->decoded_height <= 0 ||
        win->x0 > win->decoded_width - img->width || win->y0 > win->decoded_height - img->height)
        return dsrt__fail(
            DSRT_EOPTION, "augment: window: %dx%d at %d,%d does not lie in a %dx%d image",
            img->width, img->height, win->x0, win->y0, win->decoded_width, win->decoded_height);
    *out = *win;
    return 0;
}

/* A gray image as RGB, in the augmenter's scratch. */
static int gray_to_rgb(dsrt_augmenter *a, const dsrt_image *img, dsrt_image *rgb) {
    size_t row = (size_t)img->width * 3;
    int rc = reserve((void **)&a->rgb, &a->cap_rgb, row * (size_t)img->height, 1);
    if (rc) return rc;
    for (int y = 0; y < img->height; y++) {
        const uint8_t *g = img->data + (size_t)y * img->stride;
        uint8_t *o = a->rgb + (size_t)y * row;
        for (int x = 0; x < img->width; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = g[x];
    }
    *rgb = (dsrt_image){a->rgb, img->width, img->height, 3, row};
    return 0;
}

/* dsrt_augment_apply_params on options already checked, with img the
 * window win (NULL: the whole image) of the decoded image. */
static int apply_checked(dsrt_augmenter *a, const dsrt_augment_options *o, const dsrt_image *img,
                         const dsrt_window *win, int full_w, int full_h,
                         const dsrt_augment_params *p, void *dst) {
    int rc;
    dsrt_window w;
    if ((rc = check_image(o, img, win, &w))) return rc;
    if (full_w <= 0 || full_h <= 0)
        return dsrt__fail(DSRT_EOPTION, "augment: full size %d x %d: not positive", full_w, full_h);
    affine t;
    if ((rc = sample_map(o, full_w, full_h, w.decoded_width, w.decoded_height, p, &t))) return rc;
    int separable = t.m[1] == 0.0 && t.m[3] == 0.0;
    dsrt_image rgb;
    if (!separable) {
        /* The warp reads the whole image, in the output's channels. */
        if (w.x0 || w.y0 || w.decoded_width != img->width || w.decoded_height != img->height)
            return dsrt__fail(DSRT_EOPTION, "augment: a rotated or sheared sample needs the "
                                            "whole image, not a window of it");
        if (img->channels != o->output_channels) {
            if ((rc = gray_to_rgb(a, img, &rgb))) return rc;
            img = &rgb;
        }
    }
    sink s;
    memset(&s, 0, sizeof s);
    s.ch = o->output_channels;
    s.sch = img->channels;
    s.ow = o->output_width;
    s.oh = o->output_height;
    s.f32 = o->layout == DSRT_AUGMENT_F32_NCHW;
    s.dst = dst;
    for (int c = 0; c < s.ch; c++) {
        s.fill[c] = o->fill_value[c];
        s.sub[c] = 0.0f;
        s.div[c] = 1.0f;
        if (o->norm == DSRT_AUGMENT_NORM_RESCALE) s.div[c] = 255.0f;
        if (o->norm == DSRT_AUGMENT_NORM_ZEROCENTER || o->norm == DSRT_AUGMENT_NORM_ZSCORE)
            s.sub[c] = o->mean[c];
        if (o->norm == DSRT_AUGMENT_NORM_ZSCORE) s.div[c] = o->std[c];
        s.inv[c] = 1.0f / s.div[c];
    }
    if (s.f32) {
        int same = a->lut_ok;
        for (int c = 0; c < s.ch; c++)
            same = same && a->lut_sub[c] == s.sub[c] && a->lut_div[c] == s.div[c];
        if (!same) {
            for (int c = 0; c < s.ch; c++) {
                for (int x = 0; x < 256; x++)
                    a->lut[c * 256 + x] = ((float)x - s.sub[c]) / s.div[c];
                a->lut_sub[c] = s.sub[c];
                a->lut_div[c] = s.div[c];
            }
            a->lut_ok = 1;
        }
        s.lut = a->lut;
    }
    if (!color_any(o, p)) {
        rc = separable ? run_separable(a, o, &s, img, &w, t) : run_affine(a, &s, img, t);
    } else {
        /* The resampled sample as bytes (PIL's resize gives bytes), then
         * the colour steps and the normalised write. */
        for (int k = 0, seen = 0; k < 4; k++) {
            int op = p->color_order[k];
            if (op < 0 || op > 3 || (seen & (1 << op)))
                return dsrt__fail(DSRT_EOPTION,
                                  "augment: params: color_order: {%d, %d, %d, %d}: not an order "
                                  "of the four adjustments",
                                  p->color_order[0], p->color_order[1], p->color_order[2],
                                  p->color_order[3]);
            seen |= 1 << op;
        }
        size_t n = (size_t)s.ow * s.oh;
        sink b = s;
        b.f32 = 1;
        /* In the augmenter's scratch, which stays in cache from one sample
         * to the next: the sample's place is written once, at the end. */
        if ((rc = reserve((void **)&a->col, &a->cap_col, n * s.ch, sizeof(float)))) return rc;
        b.dst = a->col;
        for (int c = 0; c < s.ch; c++) {
            b.sub[c] = 0.0f;
            b.div[c] = b.inv[c] = 1.0f;
        }
        b.lut = a->lut_id;
        if (a->lut_id[255] != 255.0f)
            for (int c = 0; c < 3; c++)
                for (int x = 0; x < 256; x++) a->lut_id[c * 256 + x] = (float)x;
        rc = separable ? run_separable(a, o, &b, img, &w, t) : run_affine(a, &b, img, t);
        float *pl[3] = {(float *)b.dst, (float *)b.dst + n, (float *)b.dst + 2 * n};
        /* Eight values at a time where the augmenter's kernels have AVX2,
         * sixteen where they have AVX-512. */
        int wide = strcmp(a->ops->name, "scalar") == 0   ? 0
                   : strcmp(a->ops->name, "avx512") == 0 ? 2
                                                         : 1;
        if (rc == 0) color_write(o, p, &s, pl, wide);
    }
    if (rc == 0 && s.f32) erase_write(o, p, (float *)dst);
    return rc;
}

int dsrt_augment_apply_params(dsrt_augmenter *a, const dsrt_augment_options *o,
                              const dsrt_image *img, int full_w, int full_h,
                              const dsrt_augment_params *p, void *dst) {
    int rc = dsrt_augment_check(o);
    if (rc) return rc;
    return apply_checked(a, o, img, NULL, full_w, full_h, p, dst);
}

int dsrt_augment_apply_window(dsrt_augmenter *a, const dsrt_augment_options *o,
                              const dsrt_image *img, const dsrt_window *win, int full_w, int full_h,
                              uint64_t seed, uint64_t epoch, uint64_t sample_id, void *dst) {
    /* The options are checked once a sample, here. */
    int rc = dsrt_augment_check(o);
    if (rc) return rc;
    if (full_w <= 0 || full_h <= 0)
        return dsrt__fail(DSRT_EOPTION, "augment: full size %d x %d: not positive", full_w, full_h);
    dsrt_augment_params p;
    dsrt_augment_draw(o, full_w, full_h, seed, epoch, sample_id, &p);
    return apply_checked(a, o, img, win, full_w, full_h, &p, dst);
}

int dsrt_augment_apply(dsrt_augmenter *a, const dsrt_augment_options *o, const dsrt_image *img,
                       int full_w, int full_h, uint64_t seed, uint64_t epoch, uint64_t sample_id,
                       void *dst) {
    return dsrt_augment_apply_window(a, o, img, NULL, full_w, full_h, seed, epoch, sample_id, dst);
}

// ----------------------------------------------------------------------------
// The decode request: what of the image a sample reads

/* The DCT scale (1, 2, 4 or 8) that turns full into dec on both axes; 1 when
 * none does (a PNG, or a caller's own size). */
static int decode_scale(int full_w, int full_h, int dec_w, int dec_h) {
    for (int s = 8; s > 1; s /= 2)
        if ((full_w + s - 1) / s == dec_w && (full_h + s - 1) / s == dec_h) return s;
    return 1;
}

int dsrt_augment_decode_request(dsrt_augmenter *a, const dsrt_augment_options *o,
                                const dsrt_image_info *info, uint64_t seed, uint64_t epoch,
                                uint64_t sample_id, dsrt_decode_request *req) {
    int rc = dsrt_augment_check(o);
    if (rc) return rc;
    int fw = info->width, fh = info->height;
    req->channels = o->output_channels;
    req->allow_gray = o->output_channels == 3;
    req->dc_eighth = o->decode_dc;
    req->region_x = req->region_y = req->region_width = req->region_height = 0;
    dsrt_augment_decode_size(o, fw, fh, &req->min_width, &req->min_height);
    if (fw <= 0 || fh <= 0) return 0;
    dsrt_augment_params p;
    dsrt_augment_draw(o, fw, fh, seed, epoch, sample_id, &p);
    if (o->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) {
        /* This sample's window at the coarsest DCT scale that keeps it at
         * least as dense as the output (never below it). */
        double kx, ky;
        decode_density(o, fw, fh, p.crop_width, p.crop_height, &kx, &ky);
        int s = 8;
        while (s > 1 && (1.0 / s < kx - 1e-12 || 1.0 / s < ky - 1e-12)) s /= 2;
        req->min_width = (fw + s - 1) / s;
        req->min_height = (fh + s - 1) / s;
    }
    int dw, dh;
    dsrt_decode_size(info, req, &dw, &dh);
    affine t;
    if ((rc = sample_map(o, fw, fh, dw, dh, &p, &t))) return rc;
    if (t.m[1] != 0.0 || t.m[3] != 0.0) return 0; /* a warp: the whole image */
    axis *ax = &a->ax, *ay = &a->ay;
    int x0, x1, y0, y1;
    axis_span(o, o->output_width, t.m[0], t.m[2], dw, &x0, &x1);
    axis_span(o, o->output_height, t.m[4], t.m[5], dh, &y0, &y1);
    if ((rc = axis_build(ax, o->output_width, t.m[0], t.m[2], dw, x0, x1)) ||
        (rc = axis_build(ay, o->output_height, t.m[4], t.m[5], dh, y0, y1)))
        return rc;
    int s = decode_scale(fw, fh, dw, dh);
    if (ax->hi <= ax->lo || ay->hi <= ay->lo) {
        /* Every output pixel is fill: a pixel is decoded all the same. */
        req->region_width = req->region_height = 1;
        return 0;
    }
    req->region_x = ax->lo * s;
    req->region_width = DSRT_MIN(fw, ax->hi * s) - req->region_x;
    req->region_y = ay->lo * s;
    req->region_height = DSRT_MIN(fh, ay->hi * s) - req->region_y;
    return 0;
}
