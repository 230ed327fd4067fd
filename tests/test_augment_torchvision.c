/*
 * dsrt's ImageNet recipe against torchvision 0.14 itself, run through
 * /usr/bin/python3 (tests/torchvision_ref.py): the random-resized crop's
 * draws against RandomResizedCrop.get_params (histograms of the window's
 * area fraction, aspect and offsets from 100 000 draws each, compared bin by
 * bin within 5 standard errors, and a chi-square bound), the colour steps
 * against torchvision's functional adjust_brightness, adjust_contrast,
 * adjust_saturation, adjust_hue and rgb_to_grayscale on PIL images (mean
 * absolute difference below 1 level of 255), and a whole sample (crop,
 * resize, flip, colour) against resized_crop, hflip and the same steps.
 * Skips (77) where python3 has no torch or torchvision.
 */
#include <dsrt/augment.h>

#include "core/internal.h"
#include "task.h"
#include "testimg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[4096];
static char script[4096];

/* Runs the reference script with args; 0 when it succeeded. */
static int ref(const char *args) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' %s", script, args);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "failed (%d): %s\n", rc, cmd);
    return rc;
}

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_all(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(buf, 1, len, f) == len);
    fclose(f);
}

// ----------------------------------------------------------------------------
// The random-resized crop's draws

#define BINS 24

typedef struct {
    double area[BINS], aspect[BINS], x[BINS], y[BINS];
    double n;
} crop_hist;

static int bin_of(double v, double lo, double hi) {
    int b = (int)floor((v - lo) / (hi - lo) * BINS);
    return b < 0 ? 0 : b >= BINS ? BINS - 1 : b;
}

static void hist_add(crop_hist *h, int W, int H, int top, int left, int ch, int cw) {
    h->area[bin_of((double)cw * ch / ((double)W * H), 0.0, 1.0 + 1e-9)]++;
    h->aspect[bin_of(log((double)cw / ch), log(0.7), log(1.0 / 0.7))]++;
    if (W > cw) h->x[bin_of((double)left / (W - cw), 0.0, 1.0 + 1e-9)]++;
    if (H > ch) h->y[bin_of((double)top / (H - ch), 0.0, 1.0 + 1e-9)]++;
    h->n++;
}

/* The largest two-sample z of the bins of a (na draws) and b (nb), and the
 * chi-square bound: 0 when both hold (|z| < 5 everywhere, chi-square below
 * its mean plus 5 of its standard deviations). */
static int same_distribution(const char *what, const double *a, const double *b, double na,
                             double nb, int quiet) {
    double worst = 0.0, chi = 0.0;
    int dof = 0;
    for (int k = 0; k < BINS; k++) {
        if (a[k] + b[k] < 10) continue;
        double p = (a[k] + b[k]) / (na + nb);
        double z = (a[k] / na - b[k] / nb) / sqrt(p * (1 - p) * (1 / na + 1 / nb));
        worst = fmax(worst, fabs(z));
        chi += z * z;
        dof++;
    }
    int ok = worst < 5.0 && chi < dof + 5.0 * sqrt(2.0 * dof);
    if (!quiet || !ok)
        fprintf(stderr, "  %s: largest |z| %.2f, chi-square %.1f on %d bins\n", what, worst, chi,
                dof);
    return ok ? 0 : 1;
}

/* dsrt's draws and torchvision's for a W x H image; returns the count of
 * histograms that differ. */
static int compare_crops(int W, int H, int n, const double scale[2], const double tscale[2],
                         int quiet) {
    dsrt_augment_options o = dsrt_augment_defaults();
    o.size_mode = DSRT_AUGMENT_RANDRESIZEDCROP;
    memcpy(o.crop_scale, scale, sizeof o.crop_scale);
    CHECK_OK(dsrt_augment_check(&o));
    crop_hist *d = calloc(1, sizeof *d), *t = calloc(1, sizeof *t);
    REQUIRE(d && t);
    for (int i = 0; i < n; i++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, W, H, 7, 1, (uint64_t)i, &p);
        REQUIRE(p.crop_width > 0 && p.crop_width <= W && p.crop_height > 0 && p.crop_height <= H);
        REQUIRE(p.crop_x >= 0 && p.crop_x + p.crop_width <= W);
        REQUIRE(p.crop_y >= 0 && p.crop_y + p.crop_height <= H);
        hist_add(d, W, H, p.crop_y, p.crop_x, p.crop_height, p.crop_width);
    }
    char out[4200], args[8400];
    snprintf(out, sizeof out, "%s/rrc.bin", dir);
    snprintf(args, sizeof args, "rrc '%s' %d %d %d %.17g %.17g %.17g %.17g 3", out, W, H, n,
             tscale[0], tscale[1], o.crop_ratio[0], o.crop_ratio[1]);
    REQUIRE(ref(args) == 0);
    size_t len;
    int32_t *r = read_all(out, &len);
    REQUIRE(r && len == (size_t)n * 16);
    for (int i = 0; i < n; i++)
        hist_add(t, W, H, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
    if (!quiet)
        fprintf(stderr, "%d x %d, scale [%g, %g] against torchvision's [%g, %g], %d draws:\n", W, H,
                scale[0], scale[1], tscale[0], tscale[1], n);
    int bad = same_distribution("area fraction", d->area, t->area, d->n, t->n, quiet) +
              same_distribution("aspect", d->aspect, t->aspect, d->n, t->n, quiet) +
              same_distribution("x offset", d->x, t->x, d->n, t->n, quiet) +
              same_distribution("y offset", d->y, t->y, d->n, t->n, quiet);
    free(r);
    free(d);
    free(t);
    return bad;
}

static void test_crop_draws(void) {
    const double def[2] = {0.08, 1.0}, narrow[2] = {0.25, 1.0};
    /* An ImageNet-like photo, its portrait, and a strip whose aspect lies
     * outside the range (many tries fail: the central fallback). */
    CHECK_EQ(compare_crops(500, 375, 100000, def, def, 0), 0);
    CHECK_EQ(compare_crops(333, 500, 20000, def, def, 0), 0);
    CHECK_EQ(compare_crops(900, 64, 20000, def, def, 0), 0);
    CHECK_EQ(compare_crops(40, 31, 20000, narrow, narrow, 0), 0);
    /* The comparison sees a difference in the area range. */
    CHECK_GT(compare_crops(500, 375, 20000, def, narrow, 1), 0);
}

// ----------------------------------------------------------------------------
// Colour

/* An image with both smooth areas and detail, w x h x ch. */
static uint8_t *picture(int w, int h, int ch, uint64_t key) {
    uint8_t *p = malloc((size_t)w * h * ch);
    REQUIRE(p);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                double v = 128 + 90 * sin(5.0 * x / w + 2.1 * c) * cos(3.0 * y / h - c);
                v += (double)(dsrt__mix64(key + (uint64_t)((y * w + x) * ch + c)) >> 59) - 16;
                p[((size_t)y * w + x) * ch + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return p;
}

typedef struct {
    double f[4]; /* brightness, contrast, saturation, hue */
    int on[4];
    int order[4];
    int gray;
} color_case;

static void case_line(FILE *f, const color_case *k) {
    for (int i = 0; i < 4; i++) {
        if (k->on[i])
            fprintf(f, "%.17g ", k->f[i]);
        else
            fprintf(f, "x ");
    }
    fprintf(f, "%d %d %d %d %d\n", k->order[0], k->order[1], k->order[2], k->order[3], k->gray);
}

/* Options and parameters that make dsrt do case k alone. */
static void case_options(const color_case *k, dsrt_augment_options *o, dsrt_augment_params *p) {
    double *range[4] = {o->brightness, o->contrast, o->saturation, o->hue};
    for (int i = 0; i < 4; i++)
        if (k->on[i]) {
            range[i][0] = i == 3 ? -0.5 : 0.0;
            range[i][1] = i == 3 ? 0.5 : 3.0;
        }
    o->grayscale_probability = k->gray ? 1.0 : 0.0;
    p->brightness = k->f[0];
    p->contrast = k->f[1];
    p->saturation = k->f[2];
    p->hue = k->f[3];
    memcpy(p->color_order, k->order, sizeof p->color_order);
    p->grayscale = k->gray;
}

static void random_case(dsrt_rng *g, color_case *k, int ch) {
    for (int i = 0; i < 3; i++) {
        double u = dsrt_rng_uniform(g);
        /* Mostly ColorJitter(0.4)'s range, sometimes far outside it. */
        k->f[i] = u < 0.8 ? 0.6 + 0.8 * dsrt_rng_uniform(g) : 2.5 * dsrt_rng_uniform(g);
    }
    k->f[3] = dsrt_rng_uniform(g) - 0.5;
    for (int i = 0; i < 4; i++) {
        k->on[i] = dsrt_rng_uniform(g) < 0.75;
        k->order[i] = i;
    }
    for (int i = 3; i > 0; i--) {
        int j = (int)dsrt_rng_below(g, (uint64_t)i + 1), t = k->order[i];
        k->order[i] = k->order[j];
        k->order[j] = t;
    }
    k->gray = ch == 3 && dsrt_rng_uniform(g) < 0.25;
}

static void color_cases(int ch, int ncase) {
    const int W = 61, H = 47;
    uint8_t *img = picture(W, H, ch, 99 + ch);
    char in[4200], cases[4200], out[4200], args[16000];
    snprintf(in, sizeof in, "%s/color_in.raw", dir);
    snprintf(cases, sizeof cases, "%s/color_cases.txt", dir);
    snprintf(out, sizeof out, "%s/color_out.raw", dir);
    write_all(in, img, (size_t)W * H * ch);
    color_case *ks = calloc((size_t)ncase, sizeof *ks);
    REQUIRE(ks);
    dsrt_rng g = dsrt_rng_init(5, 0, (uint64_t)ch, 0);
    FILE *f = fopen(cases, "w");
    REQUIRE(f);
    for (int i = 0; i < ncase; i++) {
        random_case(&g, &ks[i], ch);
        case_line(f, &ks[i]);
    }
    fclose(f);
    snprintf(args, sizeof args, "color '%s' %d %d %d '%s' '%s'", in, W, H, ch, cases, out);
    REQUIRE(ref(args) == 0);
    size_t len, one = (size_t)W * H * ch;
    uint8_t *want = read_all(out, &len);
    REQUIRE(want && len == one * (size_t)ncase);
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    uint8_t *got = malloc(one);
    REQUIRE(got);
    double total = 0.0;
    int exact = 0;
    for (int i = 0; i < ncase; i++) {
        dsrt_augment_options o = dsrt_augment_defaults();
        o.output_width = W;
        o.output_height = H;
        o.output_channels = ch;
        o.layout = DSRT_AUGMENT_U8_NHWC;
        o.norm = DSRT_AUGMENT_NORM_NONE;
        dsrt_augment_params p;
        memset(&p, 0, sizeof p);
        p.x_scale = p.y_scale = 1.0;
        case_options(&ks[i], &o, &p);
        dsrt_image im = {img, W, H, ch, (size_t)W * ch};
        CHECK_OK(dsrt_augment_apply_params(a, &o, &im, W, H, &p, got));
        double sum = 0.0;
        int worst = 0;
        for (size_t j = 0; j < one; j++) {
            int d = abs((int)got[j] - (int)want[(size_t)i * one + j]);
            sum += d;
            worst = d > worst ? d : worst;
        }
        double mad = sum / (double)one;
        total += mad;
        exact += worst == 0;
        if (mad >= 1.0 || worst > 2) {
            fprintf(stderr, "color case %d (%d channels): mean difference %.4f, largest %d: ", i,
                    ch, mad, worst);
            case_line(stderr, &ks[i]);
        }
        CHECK(mad < 1.0);
    }
    fprintf(stderr, "colour, %d channel(s): %d cases, %d equal to the byte, mean difference %.4f\n",
            ch, ncase, exact, total / ncase);
    free(got);
    free(want);
    free(ks);
    free(img);
    dsrt_augmenter_destroy(a);
}

static void test_color(void) {
    color_cases(3, 40);
    color_cases(1, 12);
}

// ----------------------------------------------------------------------------
// A whole sample: the ImageNet preset's crop, flip and colour

static void test_whole_sample(void) {
    const int W = 500, H = 375, N = 16;
    uint8_t *img = picture(W, H, 3, 7);
    char in[4200], cases[4200], out[4200], args[16000];
    snprintf(in, sizeof in, "%s/crop_in.raw", dir);
    snprintf(cases, sizeof cases, "%s/crop_cases.txt", dir);
    snprintf(out, sizeof out, "%s/crop_out.raw", dir);
    write_all(in, img, (size_t)W * H * 3);
    dsrt_augment_options o;
    dsrt_augment_preset_imagenet(&o);
    o.layout = DSRT_AUGMENT_U8_NHWC;
    o.norm = DSRT_AUGMENT_NORM_NONE;
    FILE *f = fopen(cases, "w");
    REQUIRE(f);
    for (int i = 0; i < N; i++) {
        dsrt_augment_params p;
        dsrt_augment_draw(&o, W, H, 11, 0, (uint64_t)i, &p);
        fprintf(f, "%d %d %d %d %d %.17g %.17g %.17g x %d %d %d %d\n", p.crop_y, p.crop_x,
                p.crop_height, p.crop_width, p.x_reflect, p.brightness, p.contrast, p.saturation,
                p.color_order[0], p.color_order[1], p.color_order[2], p.color_order[3]);
    }
    fclose(f);
    snprintf(args, sizeof args, "crop '%s' %d %d 224 224 '%s' '%s'", in, W, H, cases, out);
    REQUIRE(ref(args) == 0);
    size_t len, one = 224 * 224 * 3;
    uint8_t *want = read_all(out, &len);
    REQUIRE(want && len == one * N);
    dsrt_augmenter *a;
    CHECK_OK(dsrt_augmenter_create(&a));
    uint8_t *got = malloc(one);
    REQUIRE(got);
    dsrt_image im = {img, W, H, 3, (size_t)W * 3};
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        CHECK_OK(dsrt_augment_apply(a, &o, &im, W, H, 11, 0, (uint64_t)i, got));
        double sum = 0.0;
        int worst = 0;
        for (size_t j = 0; j < one; j++) {
            int d = abs((int)got[j] - (int)want[(size_t)i * one + j]);
            sum += d;
            worst = d > worst ? d : worst;
        }
        total += sum / (double)one;
        if (sum / (double)one >= 1.0)
            fprintf(stderr, "sample %d: mean difference %.4f, largest %d\n", i, sum / (double)one,
                    worst);
        CHECK(sum / (double)one < 1.0);
    }
    fprintf(stderr, "whole samples: %d, mean difference %.4f levels\n", N, total / N);
    free(got);
    free(want);
    free(img);
    dsrt_augmenter_destroy(a);
}

int main(void) {
    if (system("/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null") != 0) {
        fprintf(stderr, "/usr/bin/python3 has no torch or torchvision: skipped\n");
        return TEST_SKIP;
    }
    const char *src = getenv("DSRT_SOURCE_DIR");
    snprintf(script, sizeof script, "%s/tests/torchvision_ref.py", src ? src : ".");
    REQUIRE(timg_tmpdir("augment_torchvision", dir, sizeof dir) == 0);
    RUN(test_crop_draws);
    RUN(test_color);
    RUN(test_whole_sample);
    return TEST_RESULT();
}
