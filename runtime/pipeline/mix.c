/*
 * Batch mixing: mixup and cutmix over an assembled batch, and the soft
 * labels that go with them (label smoothing folded in), as timm's Mixup does
 * in mode 'batch'. The pipeline calls it from the worker that finishes a
 * batch's last chunk, before the batch is marked ready, so the consumer
 * never waits on it and the work is spread over the workers.
 *
 * Sample i is paired with sample count - 1 - i (timm's x.flip(0)); each pair
 * is mixed together in place, so no copy of the batch is needed. Every
 * random draw of a batch (whether to mix, cutmix or mixup, lambda, the box)
 * comes from one generator keyed by (seed, epoch, batch index, MIX_STREAM):
 * the same batch mixes the same way whichever worker finishes it, however
 * many workers there are, and after a resume.
 *
 * Lambda ~ Beta(a, a) is X / (X + Y) with X, Y ~ Gamma(a) (Marsaglia and
 * Tsang's method, with the a < 1 boost), normals by Box-Muller.
 */
#include "runtime/pipeline/mix.h"

#include "core/internal.h"

#include <math.h>
#include <string.h>

#define MIX_STREAM 0x6d69786200000000ULL /* "mixb": apart from the augmenter's streams */

int dsrt__mix_wanted(const dsrt_pipeline_options *o) {
    return o->mixup_alpha > 0 || o->cutmix_alpha > 0 || o->cutmix_minmax[1] > 0 ||
           o->label_smoothing > 0;
}

static int mixing(const dsrt_pipeline_options *o) {
    return o->mixup_alpha > 0 || o->cutmix_alpha > 0 || o->cutmix_minmax[1] > 0;
}

int dsrt__mix_check(const dsrt_pipeline_options *o, const dsrt_augment_options *a,
                    size_t ds_classes, size_t *classes) {
    *classes = 0;
    if (!(o->mixup_alpha >= 0) || !isfinite(o->mixup_alpha))
        return dsrt__fail(DSRT_EOPTION, "pipeline: mixup_alpha: %g: must be 0 (off) or positive",
                          o->mixup_alpha);
    if (!(o->cutmix_alpha >= 0) || !isfinite(o->cutmix_alpha))
        return dsrt__fail(DSRT_EOPTION, "pipeline: cutmix_alpha: %g: must be 0 (off) or positive",
                          o->cutmix_alpha);
    const double *mm = o->cutmix_minmax;
    if (!(mm[0] == 0 && mm[1] == 0) && !(mm[0] > 0 && mm[0] < mm[1] && mm[1] <= 1))
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: cutmix_minmax: [%g, %g]: need 0 < min < max <= 1, or both 0",
                          mm[0], mm[1]);
    if (!(o->mix_prob >= 0 && o->mix_prob <= 1))
        return dsrt__fail(DSRT_EOPTION, "pipeline: mix_prob: %g: not in [0, 1]", o->mix_prob);
    if (!(o->mix_switch_prob >= 0 && o->mix_switch_prob <= 1))
        return dsrt__fail(DSRT_EOPTION, "pipeline: mix_switch_prob: %g: not in [0, 1]",
                          o->mix_switch_prob);
    if (!(o->label_smoothing >= 0 && o->label_smoothing < 1))
        return dsrt__fail(DSRT_EOPTION, "pipeline: label_smoothing: %g: not in [0, 1)",
                          o->label_smoothing);
    if (!dsrt__mix_wanted(o)) return 0;
    size_t k = o->classes ? o->classes : ds_classes;
    if (k < ds_classes || k > (1u << 24))
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: classes: %zu: the datastore has %zu classes (at most 2^24)",
                          o->classes, ds_classes);
    if (k < 1) return dsrt__fail(DSRT_EOPTION, "pipeline: soft labels: the datastore has no class");
    if (mixing(o)) {
        if (a->layout != DSRT_AUGMENT_F32_NCHW)
            return dsrt__fail(DSRT_EOPTION,
                              "pipeline: mixup/cutmix: needs float NCHW batches (the augment "
                              "layout is uint8 NHWC)");
        if (o->native)
            return dsrt__fail(
                DSRT_EOPTION,
                "pipeline: mixup/cutmix: needs samples of the output size, not native");
    }
    if (o->drop_bad)
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: soft labels (mixup, cutmix, label_smoothing) and drop_bad: "
                          "drop_bad is for evaluation; turn one off");
    *classes = k;
    return 0;
}

// ----------------------------------------------------------------------------
// Draws

static double mix_normal(dsrt_rng *r) {
    double u1 = dsrt_rng_uniform(r), u2 = dsrt_rng_uniform(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

static double mix_gamma(dsrt_rng *r, double a) {
    if (a < 1) {
        double u = 1.0 - dsrt_rng_uniform(r); /* (0, 1] */
        return mix_gamma(r, a + 1) * pow(u, 1.0 / a);
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = mix_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = dsrt_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

static double mix_beta(dsrt_rng *r, double a) {
    double x = mix_gamma(r, a), y = mix_gamma(r, a);
    return x + y > 0 ? x / (x + y) : 0.5;
}

/* Uniform integer in [lo, hi), or lo when the range is empty (numpy's
 * randint would refuse it). */
static int mix_int(dsrt_rng *r, int lo, int hi) {
    return hi > lo ? lo + (int)dsrt_rng_below(r, (uint64_t)(hi - lo)) : lo;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

// ----------------------------------------------------------------------------
// Mixing a batch

/* The box as timm's rand_bbox (sides from lambda, centre anywhere, clipped)
 * or rand_bbox_minmax; box = {y0, y1, x0, x1}. */
static void cut_box(const dsrt_pipeline_options *o, dsrt_rng *r, double lam, int H, int W,
                    int box[4]) {
    if (o->cutmix_minmax[1] > 0) {
        int ch = mix_int(r, (int)(H * o->cutmix_minmax[0]), (int)(H * o->cutmix_minmax[1]));
        int cw = mix_int(r, (int)(W * o->cutmix_minmax[0]), (int)(W * o->cutmix_minmax[1]));
        int y0 = mix_int(r, 0, H - ch), x0 = mix_int(r, 0, W - cw);
        box[0] = y0, box[1] = y0 + ch, box[2] = x0, box[3] = x0 + cw;
        return;
    }
    double ratio = sqrt(1.0 - lam);
    int ch = (int)(H * ratio), cw = (int)(W * ratio);
    int cy = mix_int(r, 0, H), cx = mix_int(r, 0, W);
    box[0] = clampi(cy - ch / 2, 0, H);
    box[1] = clampi(cy + ch / 2, 0, H);
    box[2] = clampi(cx - cw / 2, 0, W);
    box[3] = clampi(cx + cw / 2, 0, W);
}

static void mix_pixels(dsrt_batch *b, double lam) {
    size_t n = b->count, per = (size_t)b->shape[1] * b->shape[2] * b->shape[3];
    float l = (float)lam, m = (float)(1.0 - lam);
    for (size_t i = 0; i < n / 2; i++) {
        float *x = (float *)((char *)b->data + i * b->sample_stride);
        float *y = (float *)((char *)b->data + (n - 1 - i) * b->sample_stride);
        for (size_t k = 0; k < per; k++) {
            float a = x[k], c = y[k];
            x[k] = a * l + c * m;
            y[k] = c * l + a * m;
        }
    }
}

static void cut_pixels(dsrt_batch *b, const int box[4]) {
    size_t n = b->count;
    int C = b->shape[1], H = b->shape[2], W = b->shape[3];
    size_t w = (size_t)(box[3] - box[2]);
    for (size_t i = 0; i < n / 2; i++) {
        float *x = (float *)((char *)b->data + i * b->sample_stride);
        float *y = (float *)((char *)b->data + (n - 1 - i) * b->sample_stride);
        for (int c = 0; c < C; c++)
            for (int r = box[0]; r < box[1]; r++) {
                size_t at = ((size_t)c * H + r) * W + box[2];
                for (size_t k = 0; k < w; k++) {
                    float t = x[at + k];
                    x[at + k] = y[at + k];
                    y[at + k] = t;
                }
            }
    }
}

/* Row i: lam * smoothed onehot(own) + (1 - lam) * smoothed onehot(partner). */
static void soft_rows(const dsrt_pipeline_options *o, dsrt_batch *b, double lam) {
    size_t k = b->classes, n = b->count;
    double e = o->label_smoothing, off = e / (double)k, peak = 1.0 - e;
    for (size_t i = 0; i < n; i++) {
        float *row = b->soft_labels + i * k;
        for (size_t j = 0; j < k; j++) row[j] = (float)off;
        int32_t own = b->labels[i], other = b->labels[n - 1 - i];
        if (own == other) {
            row[own] = (float)(off + peak);
        } else {
            row[own] = (float)(off + lam * peak);
            row[other] = (float)(off + (1.0 - lam) * peak);
        }
    }
}

void dsrt__mix_batch(const dsrt_pipeline_options *o, dsrt_batch *b) {
    double lam = 1.0;
    int cut = 0;
    b->mix_cutmix = 0;
    memset(b->mix_box, 0, sizeof b->mix_box);
    if (mixing(o)) {
        dsrt_rng r = dsrt_rng_init(o->seed, b->epoch, b->index, MIX_STREAM);
        double cut_alpha = o->cutmix_minmax[1] > 0 && o->cutmix_alpha <= 0 ? 1.0 : o->cutmix_alpha;
        if (dsrt_rng_uniform(&r) < o->mix_prob) {
            if (o->mixup_alpha > 0 && cut_alpha > 0)
                cut = dsrt_rng_uniform(&r) < o->mix_switch_prob;
            else
                cut = cut_alpha > 0;
            lam = mix_beta(&r, cut ? cut_alpha : o->mixup_alpha);
        }
        if (cut) {
            int H = b->shape[2], W = b->shape[3];
            cut_box(o, &r, lam, H, W, b->mix_box);
            lam = 1.0 - (double)(b->mix_box[1] - b->mix_box[0]) * (b->mix_box[3] - b->mix_box[2]) /
                            ((double)H * W);
            cut_pixels(b, b->mix_box);
            b->mix_cutmix = 1;
        } else if (lam != 1.0) {
            mix_pixels(b, lam);
        }
    }
    b->mix_lambda = lam;
    soft_rows(o, b, lam);
}
