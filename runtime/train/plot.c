/*
 * The training-progress plot: a history of a run's iterations, validations
 * and epochs, drawn as a hand-written SVG file in the manner of MATLAB's
 * training-progress window: accuracy above, loss below, against the
 * iteration; the mini-batch values faint with a smoothed line over them,
 * validation points joined by a dashed black line, epochs shaded in turn.
 * The SVG needs nothing to read but a browser; long runs are thinned to at
 * most MAX_DRAWN points a line (the mean of each span of iterations).
 */
#include "core/internal.h"

#include <dsrt/train.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DRAWN 1500
#define SMOOTHING 0.6 /* weight of the running average in the smoothed line */

typedef struct {
    int64_t iteration;
    float loss, accuracy;
} it_point;

typedef struct {
    int64_t iteration;
    float loss, accuracy;
} val_point;

struct dsrt_train_history {
    it_point *it;
    size_t n_it, cap_it;
    val_point *val;
    size_t n_val, cap_val;
    int64_t *epochs; /* iteration at which each epoch ended */
    size_t n_ep, cap_ep;
    int64_t max_iterations, iterations_per_epoch, first_iteration;
    double elapsed_s, learn_rate;
};

int dsrt_train_history_create(dsrt_train_history **h) {
    *h = dsrt__calloc(1, sizeof **h);
    if (!*h) return -ENOMEM;
    (*h)->first_iteration = -1;
    return 0;
}

void dsrt_train_history_destroy(dsrt_train_history *h) {
    if (!h) return;
    free(h->it);
    free(h->val);
    free(h->epochs);
    free(h);
}

int dsrt_train_history_add(dsrt_train_history *h, const dsrt_train_event *e) {
    h->max_iterations = e->max_iterations;
    h->iterations_per_epoch = e->iterations_per_epoch;
    h->elapsed_s = e->elapsed_s;
    if (e->kind == DSRT_EVENT_ITERATION) {
        if (dsrt__grow((void **)&h->it, &h->cap_it, h->n_it + 1, sizeof *h->it)) return -ENOMEM;
        h->it[h->n_it++] = (it_point){e->iteration, (float)e->loss, (float)e->accuracy};
        if (h->first_iteration < 0) h->first_iteration = e->iteration - 1;
        h->learn_rate = e->learn_rate;
    } else if (e->kind == DSRT_EVENT_VALIDATION) {
        if (h->n_val && h->val[h->n_val - 1].iteration == e->iteration) return 0;
        if (dsrt__grow((void **)&h->val, &h->cap_val, h->n_val + 1, sizeof *h->val)) return -ENOMEM;
        h->val[h->n_val++] = (val_point){e->iteration, (float)e->val_loss, (float)e->val_accuracy};
    } else if (e->kind == DSRT_EVENT_EPOCH) {
        if (dsrt__grow((void **)&h->epochs, &h->cap_ep, h->n_ep + 1, sizeof *h->epochs))
            return -ENOMEM;
        h->epochs[h->n_ep++] = e->iteration;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Drawing

typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} out;

static void put(out *o, const char *fmt, ...) DSRT_PRINTF(2, 3);
static void put(out *o, const char *fmt, ...) {
    if (o->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = o->cap - o->len;
        int n = vsnprintf(o->s ? o->s + o->len : NULL, o->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if (o->s && (size_t)n < room) {
            o->len += (size_t)n;
            return;
        }
        if (dsrt__grow((void **)&o->s, &o->cap, o->len + (size_t)n + 4096, 1)) {
            o->failed = 1;
            return;
        }
    }
}

/* A panel: the plot area in pixels and the data range it shows. */
typedef struct {
    double x0, y0, w, h; /* pixels: left, top, width, height */
    double xmin, xmax;   /* iterations */
    double ymin, ymax;   /* values */
} panel;

static double px(const panel *p, double x) {
    return p->x0 + (x - p->xmin) / (p->xmax - p->xmin) * p->w;
}

static double py(const panel *p, double y) {
    if (y > p->ymax) y = p->ymax;
    if (y < p->ymin) y = p->ymin;
    return p->y0 + p->h - (y - p->ymin) / (p->ymax - p->ymin) * p->h;
}

/* A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks. */
static double nice_step(double range, int ticks) {
    if (!(range > 0)) return 1;
    double raw = range / ticks, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void fmt_num(char *buf, size_t size, double v) {
    if (fabs(v) >= 1e5 || (fabs(v) < 1e-3 && v != 0))
        snprintf(buf, size, "%.0e", v);
    else
        snprintf(buf, size, "%g", v);
}

static void axes(out *o, const panel *p, const char *ylabel, int show_x) {
    put(o,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
        "stroke=\"#888\"/>\n",
        p->x0, p->y0, p->w, p->h);
    double ys = nice_step(p->ymax - p->ymin, 5);
    for (double y = ceil(p->ymin / ys) * ys; y <= p->ymax + 1e-9 * ys; y += ys) {
        char t[32];
        fmt_num(t, sizeof t, fabs(y) < 1e-12 ? 0 : y);
        put(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
            p->x0, py(p, y), p->x0 + p->w, py(p, y));
        put(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 6,
            py(p, y) + 4, t);
    }
    double xs = nice_step(p->xmax - p->xmin, 8);
    if (xs < 1) xs = 1;
    for (double x = ceil(p->xmin / xs) * xs; x <= p->xmax + 1e-9; x += xs) {
        put(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
            px(p, x), p->y0, px(p, x), p->y0 + p->h);
        if (show_x) {
            char t[32];
            fmt_num(t, sizeof t, x);
            put(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px(p, x),
                p->y0 + p->h + 16, t);
        }
    }
    put(o,
        "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
        p->x0 - 46, p->y0 + p->h / 2, ylabel);
}

/* Epochs shaded in turn, numbered at the top of the panel. */
static void epochs(out *o, const panel *p, const dsrt_train_history *h, int label) {
    int64_t ipe = h->iterations_per_epoch;
    if (ipe < 1) return;
    for (int64_t e = 0; (double)(e * ipe) < p->xmax; e++) {
        double a = DSRT_MAX((double)(e * ipe), p->xmin),
               b = DSRT_MIN((double)((e + 1) * ipe), p->xmax);
        if (b <= a) continue;
        if (e % 2)
            put(o,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f3f3f3\"/>\n",
                px(p, a), p->y0, px(p, b) - px(p, a), p->h);
        if (label && px(p, b) - px(p, a) > 40)
            put(o,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">epoch "
                "%lld</text>\n",
                (px(p, a) + px(p, b)) / 2, p->y0 + 14, (long long)e + 1);
    }
}

/* The mini-batch series (faint, thinned to means of spans) and its
 * smoothed line. which: 0 accuracy in percent, 1 loss. */
static void series(out *o, const panel *p, const dsrt_train_history *h, int which,
                   const char *faint, const char *strong) {
    if (!h->n_it) return;
    size_t n = h->n_it, per = (n + MAX_DRAWN - 1) / MAX_DRAWN;
    double scale = which == 0 ? 100.0 : 1.0;
    put(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1\" points=\"", faint);
    for (size_t i = 0; i < n; i += per) {
        double s = 0, x = 0;
        size_t k = 0;
        for (; k < per && i + k < n; k++) {
            s += which == 0 ? h->it[i + k].accuracy : h->it[i + k].loss;
            x += (double)h->it[i + k].iteration;
        }
        double v = s / (double)k * scale;
        if (isfinite(v)) put(o, "%.1f,%.1f ", px(p, x / (double)k), py(p, v));
    }
    put(o, "\"/>\n");
    put(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", strong);
    double sm = NAN;
    for (size_t i = 0; i < n; i++) {
        double v = (which == 0 ? h->it[i].accuracy : h->it[i].loss) * scale;
        if (!isfinite(v)) continue;
        /* A running average that forgets at the rate of about 2% of the run
         * (at least SMOOTHING per iteration), as MATLAB's smoothed curve. */
        double a = DSRT_MAX(SMOOTHING, 1.0 - 50.0 / (double)n);
        sm = isnan(sm) ? v : a * sm + (1 - a) * v;
        if (i % per == 0 || i == n - 1)
            put(o, "%.1f,%.1f ", px(p, (double)h->it[i].iteration), py(p, sm));
    }
    put(o, "\"/>\n");
}

static void validation(out *o, const panel *p, const dsrt_train_history *h, int which) {
    if (!h->n_val) return;
    double scale = which == 0 ? 100.0 : 1.0;
    put(o, "<polyline fill=\"none\" stroke=\"#000\" stroke-width=\"1.5\" "
           "stroke-dasharray=\"5,4\" points=\"");
    for (size_t i = 0; i < h->n_val; i++) {
        double v = (which == 0 ? h->val[i].accuracy : h->val[i].loss) * scale;
        if (isfinite(v)) put(o, "%.1f,%.1f ", px(p, (double)h->val[i].iteration), py(p, v));
    }
    put(o, "\"/>\n");
    for (size_t i = 0; i < h->n_val; i++) {
        double v = (which == 0 ? h->val[i].accuracy : h->val[i].loss) * scale;
        if (isfinite(v))
            put(o,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#000\"><title>iteration %lld: "
                "%.4g</title></circle>\n",
                px(p, (double)h->val[i].iteration), py(p, v), (long long)h->val[i].iteration, v);
    }
}

static void escape(out *o, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            put(o, "&lt;");
        else if (*s == '>')
            put(o, "&gt;");
        else if (*s == '&')
            put(o, "&amp;");
        else
            put(o, "%c", *s);
    }
}

/*
 * The top of the loss axis for losses up to lmax: lmax, or 3x the median
 * mini-batch loss where the early losses would dwarf the rest (the median
 * from a histogram of 256 bins over [0, lmax]).
 */
static double loss_axis_top(const dsrt_train_history *h, double lmax) {
    if (h->n_it <= 8 || !(lmax > 0)) return lmax;
    size_t bins[256] = {0}, m = 0, acc = 0, k = 0;
    for (size_t i = 0; i < h->n_it; i++)
        if (isfinite(h->it[i].loss) && h->it[i].loss >= 0) {
            bins[DSRT_MIN((size_t)(h->it[i].loss / lmax * 255.0), 255)]++;
            m++;
        }
    for (; k < 256 && acc < (m + 1) / 2; k++) acc += bins[k];
    double med = (double)k / 255.0 * lmax;
    return med > 0 && 3 * med < lmax ? 3 * med : lmax;
}

/* Marks a loss axis that does not reach the largest loss: a dashed line at
 * its top, where the larger values are drawn, and what it cut. */
static void clip_note(out *o, const panel *p, double largest) {
    put(o,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d9541a\" "
        "stroke-width=\"1\" stroke-dasharray=\"2,3\"/>\n",
        p->x0, p->y0, p->x0 + p->w, p->y0);
    put(o,
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#d9541a\">losses above "
        "%.3g drawn at the top (largest %.3g)</text>\n",
        p->x0 + p->w, p->y0 - 6, p->ymax, largest);
}

int dsrt_train_history_svg(const dsrt_train_history *h, const char *path, const char *title) {
    if (!h || !path) return dsrt__fail(-EINVAL, "plot: no history or path");
    const double W = 960, H = 730;
    out o = {0};
    put(&o,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
        "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
        W, H, W, H);
    put(&o, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">", W / 2);
    escape(&o, title ? title : "Training progress");
    put(&o, "</text>\n");

    double xmin = h->first_iteration > 0 ? (double)h->first_iteration : 0;
    double xmax = (double)DSRT_MAX(h->max_iterations, h->n_it ? h->it[h->n_it - 1].iteration : 1);
    if (xmax <= xmin) xmax = xmin + 1;
    double lmax = 0;
    for (size_t i = 0; i < h->n_it; i++)
        if (isfinite(h->it[i].loss)) lmax = DSRT_MAX(lmax, (double)h->it[i].loss);
    for (size_t i = 0; i < h->n_val; i++)
        if (isfinite(h->val[i].loss)) lmax = DSRT_MAX(lmax, (double)h->val[i].loss);
    /* Early losses can dwarf the rest: the axis shows up to 3x the median
     * loss, and the clip is marked (clip_note) with the largest loss. */
    const double lmax_all = lmax;
    lmax = loss_axis_top(h, lmax);
    const int clipped = lmax < lmax_all;
    if (!(lmax > 0)) lmax = 1;
    lmax *= 1.05;

    panel acc = {70, 60, W - 100, 250, xmin, xmax, 0, 100};
    panel loss = {70, 370, W - 100, 250, xmin, xmax, 0, lmax};
    epochs(&o, &acc, h, 1);
    epochs(&o, &loss, h, 0);
    axes(&o, &acc, "Accuracy (%)", 0);
    axes(&o, &loss, "Loss", 1);
    series(&o, &acc, h, 0, "#a9c8ec", "#1f5fbf");
    series(&o, &loss, h, 1, "#f6c2a0", "#d9541a");
    validation(&o, &acc, h, 0);
    validation(&o, &loss, h, 1);
    if (clipped) clip_note(&o, &loss, lmax_all);
    put(&o, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">Iteration</text>\n",
        loss.x0 + loss.w / 2, loss.y0 + loss.h + 36);

    /* The legend on a line of its own, the summary below it: a long
     * summary never runs into the legend. */
    double ly = H - 40;
    put(&o,
        "<line x1=\"70\" y1=\"%.0f\" x2=\"94\" y2=\"%.0f\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>"
        "<text x=\"100\" y=\"%.0f\">training accuracy (smoothed)</text>\n",
        ly - 4, ly - 4, ly);
    put(&o,
        "<line x1=\"300\" y1=\"%.0f\" x2=\"324\" y2=\"%.0f\" stroke=\"#d9541a\" "
        "stroke-width=\"2\"/>"
        "<text x=\"330\" y=\"%.0f\">training loss (smoothed)</text>\n",
        ly - 4, ly - 4, ly);
    put(&o,
        "<line x1=\"500\" y1=\"%.0f\" x2=\"524\" y2=\"%.0f\" stroke=\"#000\" stroke-width=\"1.5\" "
        "stroke-dasharray=\"5,4\"/><circle cx=\"512\" cy=\"%.0f\" r=\"3.5\"/>"
        "<text x=\"530\" y=\"%.0f\">validation</text>\n",
        ly - 4, ly - 4, ly - 4, ly);
    char summary[256];
    int sl = snprintf(summary, sizeof summary, "iteration %lld of %lld, %.1f s",
                      (long long)(h->n_it ? h->it[h->n_it - 1].iteration : 0),
                      (long long)h->max_iterations, h->elapsed_s);
    if (h->n_val)
        snprintf(summary + sl, sizeof summary - (size_t)sl, ", validation accuracy %.2f%%",
                 100.0 * h->val[h->n_val - 1].accuracy);
    put(&o, "<text x=\"70\" y=\"%.0f\" fill=\"#555\">%s</text>\n", H - 12, summary);
    put(&o, "</svg>\n");
    if (o.failed) {
        free(o.s);
        return dsrt__fail(-ENOMEM, "plot: %s: out of memory", path);
    }
    int rc = dsrt__write_file_replace(path, o.s, o.len);
    free(o.s);
    return rc ? dsrt__fail_prefix(rc, "plot") : 0;
}
