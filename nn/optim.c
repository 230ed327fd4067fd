/*
 * Optimizers: SGD with momentum, Adam and RMSProp over a net's flat
 * parameter and gradient buffers, with MATLAB trainingOptions' defaults and
 * semantics: L2 regularisation added to the gradient, per-layer learn-rate
 * and L2 factors, a piecewise learning-rate schedule, and gradient clipping
 * by l2norm (per parameter tensor), global-l2norm or absolute value.
 *
 * The update runs over "segments": one per parameter tensor (a layer's
 * weights or its bias), each a contiguous range of the flat buffers with its
 * own learn-rate and L2 factors. The inner loops are plain element-wise
 * loops over restrict pointers, which the compiler vectorises.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
/* sqrtf in the loops vectorises only without errno (its argument is never
 * negative here). */
#define DSRT_VECTOR_MATH __attribute__((optimize("no-math-errno")))
#else
#define DSRT_VECTOR_MATH
#endif

struct dsrt_optimizer {
    dsrt_optimizer_options o;
    size_t n_params;
    dsrt_segment *seg;
    int n_seg;
    float *buf[2]; /* SGDM: velocity; Adam: first and second moments; RMSProp: mean square */
    int n_buf;
    int64_t t;        /* steps taken */
    uint64_t version; /* bumped when buf is written from outside a step */
    /* The net whose device backend holds this state (newer than buf when
     * host_stale), or NULL. */
    dsrt_net *held_by;
    int host_stale;
};

dsrt_optimizer_options dsrt_optimizer_defaults(dsrt_solver solver) {
    dsrt_optimizer_options o;
    memset(&o, 0, sizeof o);
    o.solver = solver;
    o.learn_rate = solver == DSRT_SOLVER_SGDM ? 0.01 : 0.001;
    o.momentum = 0.9;
    o.l2 = 1e-4;
    o.gradient_decay = 0.9;
    o.sq_gradient_decay = solver == DSRT_SOLVER_RMSPROP ? 0.9 : 0.999;
    o.epsilon = 1e-8;
    o.schedule = DSRT_LR_NONE;
    o.drop_factor = 0.1;
    o.drop_period = 10;
    o.clip = DSRT_CLIP_L2NORM;
    o.grad_threshold = INFINITY;
    return o;
}

static int check_options(const dsrt_optimizer_options *o) {
#define BAD(name, cond)                                                                            \
    if (!(cond)) return dsrt__fail(DSRT_EOPTION, "optimizer: option " name " is out of range")
    BAD("solver", o->solver >= DSRT_SOLVER_SGDM && o->solver <= DSRT_SOLVER_RMSPROP);
    BAD("learn_rate", o->learn_rate > 0 && isfinite(o->learn_rate));
    BAD("momentum", o->momentum >= 0 && o->momentum < 1);
    BAD("l2", o->l2 >= 0 && isfinite(o->l2));
    BAD("gradient_decay", o->gradient_decay >= 0 && o->gradient_decay < 1);
    BAD("sq_gradient_decay", o->sq_gradient_decay >= 0 && o->sq_gradient_decay < 1);
    BAD("epsilon", o->epsilon > 0 && isfinite(o->epsilon));
    BAD("schedule", o->schedule == DSRT_LR_NONE || o->schedule == DSRT_LR_PIECEWISE);
    BAD("drop_factor", o->drop_factor >= 0 && o->drop_factor <= 1);
    BAD("drop_period", o->drop_period >= 1);
    BAD("clip", o->clip >= DSRT_CLIP_L2NORM && o->clip <= DSRT_CLIP_ABSOLUTE);
    BAD("grad_threshold", o->grad_threshold > 0);
#undef BAD
    return 0;
}

int dsrt_optimizer_create(dsrt_optimizer **out, const dsrt_net *net,
                          const dsrt_optimizer_options *options) {
    *out = NULL;
    dsrt_optimizer_options o = options ? *options : dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    int rc = check_options(&o);
    if (rc) return rc;
    dsrt_optimizer *opt = dsrt__calloc(1, sizeof *opt);
    if (!opt) return -ENOMEM;
    opt->o = o;
    opt->n_params = net->n_params;
    opt->seg = dsrt__calloc(2 * (size_t)net->n_layers, sizeof *opt->seg);
    if (!opt->seg) goto nomem;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->w_n) opt->seg[opt->n_seg++] = (dsrt_segment){l->w_off, l->w_n, l->o.wlr, l->o.wl2};
        if (l->b_n) opt->seg[opt->n_seg++] = (dsrt_segment){l->b_off, l->b_n, l->o.blr, l->o.bl2};
    }
    opt->n_buf = o.solver == DSRT_SOLVER_ADAM ? 2 : 1;
    for (int k = 0; k < opt->n_buf; k++) {
        size_t bytes = ((opt->n_params ? opt->n_params : 1) * sizeof(float) + 63) & ~(size_t)63;
        opt->buf[k] = aligned_alloc(64, bytes);
        if (!opt->buf[k]) goto nomem;
        memset(opt->buf[k], 0, bytes);
    }
    *out = opt;
    return 0;
nomem:
    dsrt_optimizer_destroy(opt);
    return dsrt__fail(-ENOMEM, "optimizer: out of memory for %zu parameters", net->n_params);
}

void dsrt_optimizer_destroy(dsrt_optimizer *opt) {
    if (!opt) return;
    if (opt->held_by) opt->held_by->opt_on_device = NULL;
    free(opt->seg);
    free(opt->buf[0]);
    free(opt->buf[1]);
    free(opt);
}

double dsrt_optimizer_learn_rate(const dsrt_optimizer *opt, int epoch) {
    double lr = opt->o.learn_rate;
    if (opt->o.schedule == DSRT_LR_PIECEWISE && epoch > 0)
        lr *= pow(opt->o.drop_factor, (double)(epoch / opt->o.drop_period));
    return lr;
}

dsrt_optimizer_options dsrt_optimizer_get_options(const dsrt_optimizer *opt) {
    return opt->o;
}

// ----------------------------------------------------------------------------
// Kernels

static double sum_squares(const float *restrict g, size_t n) {
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += g[i + k] * g[i + k];
    double s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    for (; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

static void scale(float *restrict g, size_t n, float a) {
    for (size_t i = 0; i < n; i++) g[i] *= a;
}

static void clamp(float *restrict g, size_t n, float t) {
    for (size_t i = 0; i < n; i++) g[i] = g[i] > t ? t : (g[i] < -t ? -t : g[i]);
}

/* MATLAB's SGDM: v = momentum v - lr (g + l2 w); w += v. */
static void sgdm(float *restrict w, const float *restrict g, float *restrict v, size_t n, float lr,
                 float l2, float mom) {
    for (size_t i = 0; i < n; i++) {
        float vi = mom * v[i] - lr * (g[i] + l2 * w[i]);
        v[i] = vi;
        w[i] += vi;
    }
}

DSRT_VECTOR_MATH
static void adam(float *restrict w, const float *restrict g, float *restrict m, float *restrict v,
                 size_t n, float lr, float l2, float b1, float b2, float c1, float c2, float eps) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + l2 * w[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi * c1) / (sqrtf(vi * c2) + eps);
    }
}

DSRT_VECTOR_MATH
static void rmsprop(float *restrict w, const float *restrict g, float *restrict v, size_t n,
                    float lr, float l2, float b2, float eps) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + l2 * w[i];
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        v[i] = vi;
        w[i] -= lr * gi / (sqrtf(vi) + eps);
    }
}

// ----------------------------------------------------------------------------
// A step

void dsrt__optim_host(float *w, float *g, const dsrt_optim_step *s) {
    /* Clipping, on the loss gradient before L2 is added. */
    if (isfinite(s->threshold)) {
        double t = s->threshold;
        if (s->clip == DSRT_CLIP_GLOBAL_L2NORM) {
            double sum = 0;
            for (int k = 0; k < s->n_seg; k++)
                if (s->seg[k].lr != 0) sum += sum_squares(g + s->seg[k].off, s->seg[k].n);
            double norm = sqrt(sum);
            if (norm > t)
                for (int k = 0; k < s->n_seg; k++)
                    scale(g + s->seg[k].off, s->seg[k].n, (float)(t / norm));
        } else {
            for (int k = 0; k < s->n_seg; k++) {
                const dsrt_segment *sg = &s->seg[k];
                if (s->clip == DSRT_CLIP_ABSOLUTE) {
                    clamp(g + sg->off, sg->n, (float)t);
                } else {
                    double norm = sqrt(sum_squares(g + sg->off, sg->n));
                    if (norm > t) scale(g + sg->off, sg->n, (float)(t / norm));
                }
            }
        }
    }
    for (int k = 0; k < s->n_seg; k++) {
        const dsrt_segment *sg = &s->seg[k];
        if (sg->lr == 0) continue; /* frozen */
        float slr = (float)(s->lr * sg->lr), sl2 = (float)(s->l2 * sg->l2);
        float *ws = w + sg->off;
        const float *gs = g + sg->off;
        switch (s->solver) {
        case DSRT_SOLVER_SGDM:
            sgdm(ws, gs, s->buf[0] + sg->off, sg->n, slr, sl2, s->momentum);
            break;
        case DSRT_SOLVER_ADAM:
            adam(ws, gs, s->buf[0] + sg->off, s->buf[1] + sg->off, sg->n, slr, sl2, s->b1, s->b2,
                 s->c1, s->c2, s->eps);
            break;
        case DSRT_SOLVER_RMSPROP:
            rmsprop(ws, gs, s->buf[0] + sg->off, sg->n, slr, sl2, s->b2, s->eps);
            break;
        }
    }
}

/* The step's arguments for the optimizer as it stands (t already counted). */
static dsrt_optim_step step_args(dsrt_optimizer *opt, int epoch) {
    const dsrt_optimizer_options *o = &opt->o;
    dsrt_optim_step s;
    memset(&s, 0, sizeof s);
    s.solver = o->solver;
    s.lr = dsrt_optimizer_learn_rate(opt, epoch);
    s.l2 = o->l2;
    s.momentum = (float)o->momentum;
    s.b1 = (float)o->gradient_decay;
    s.b2 = (float)o->sq_gradient_decay;
    s.c1 = (float)(1.0 / (1.0 - pow(o->gradient_decay, (double)opt->t)));
    s.c2 = (float)(1.0 / (1.0 - pow(o->sq_gradient_decay, (double)opt->t)));
    s.eps = (float)o->epsilon;
    s.clip = o->clip;
    s.threshold = o->grad_threshold;
    s.seg = opt->seg;
    s.n_seg = opt->n_seg;
    s.buf[0] = opt->buf[0];
    s.buf[1] = opt->buf[1];
    s.n_buf = opt->n_buf;
    s.owner = opt;
    s.version = opt->version;
    return s;
}

int dsrt_optimizer_step(dsrt_optimizer *opt, dsrt_net *net, int epoch) {
    if (net->n_params != opt->n_params)
        return dsrt__fail(-EINVAL, "optimizer: made for %zu parameters, the net has %zu",
                          opt->n_params, net->n_params);
    /* State held by another net's device comes home first. */
    if (opt->held_by && opt->held_by != net) dsrt__optimizer_release(opt);
    opt->t++;
    dsrt_optim_step s = step_args(opt, epoch);
    int rc = net->ops->optimize(net->be, &s);
    if (rc) {
        opt->t--;
        return rc;
    }
    if (net->ops->optim_to_host) {
        /* A device backend keeps the state: the host buffers are behind. */
        if (net->opt_on_device && net->opt_on_device != opt)
            dsrt__optimizer_release(net->opt_on_device);
        net->opt_on_device = opt;
        opt->held_by = net;
        opt->host_stale = 1;
    }
    return 0;
}

int dsrt__optimizer_host(dsrt_optimizer *opt) {
    if (!opt->held_by || !opt->host_stale) return 0;
    dsrt_net *net = opt->held_by;
    dsrt_optim_step s = step_args(opt, 0);
    int rc = net->ops->optim_to_host(net->be, &s);
    if (rc) return dsrt__fail_prefix(rc, "optimizer: reading its state back from the device");
    opt->host_stale = 0;
    return 0;
}

void dsrt__optimizer_release(dsrt_optimizer *opt) {
    dsrt_net *net = opt->held_by;
    if (!net) return;
    (void)dsrt__optimizer_host(opt);
    opt->host_stale = 0;
    opt->held_by = NULL;
    opt->version++; /* a backend that sees it again uploads it afresh */
    if (net->opt_on_device == opt) net->opt_on_device = NULL;
}

int dsrt_optimizer_copy_state(dsrt_optimizer *opt, dsrt_optimizer *src) {
    if (opt->o.solver != src->o.solver || opt->n_params != src->n_params)
        return dsrt__fail(DSRT_EOPTION,
                          "optimizer: state of solver %d over %zu parameters does not fit solver "
                          "%d over %zu",
                          (int)src->o.solver, src->n_params, (int)opt->o.solver, opt->n_params);
    int rc = dsrt__optimizer_host(src);
    if (rc) return rc;
    if (opt->held_by) dsrt__optimizer_release(opt);
    for (int k = 0; k < opt->n_buf; k++)
        memcpy(opt->buf[k], src->buf[k], opt->n_params * sizeof(float));
    opt->t = src->t;
    opt->version++;
    return 0;
}

// ----------------------------------------------------------------------------
// For model files

int dsrt__optimizer_n_buffers(const dsrt_optimizer *opt) {
    return opt->n_buf;
}

float *dsrt__optimizer_buffer(dsrt_optimizer *opt, int i) {
    if (dsrt__optimizer_host(opt)) return NULL;
    opt->version++; /* the caller may write it */
    return opt->buf[i];
}

const float *dsrt__optimizer_state(const dsrt_optimizer *opt, int i) {
    return opt->buf[i];
}

int64_t dsrt__optimizer_steps(const dsrt_optimizer *opt) {
    return opt->t;
}

void dsrt__optimizer_set_steps(dsrt_optimizer *opt, int64_t t) {
    opt->t = t;
}
