/*
 * Networks: from a parsed description to layers with shapes, one flat buffer
 * of parameters and one of gradients (layers hold offsets into them), the
 * initial weights, and a backend that runs them. Also the public calls that
 * run a net and describe it, and the gradient buckets a data-parallel trainer
 * reduces while backward is still running.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RNG_STREAM_INIT 0x494e4954u /* "INIT" */

// ----------------------------------------------------------------------------
// Building

dsrt_net_options dsrt_net_defaults(void) {
    dsrt_net_options o;
    memset(&o, 0, sizeof o);
    o.threads = 0;
    o.seed = 0;
    o.init = DSRT_INIT_GLOROT;
    o.fuse = 1;
    o.device = -1;
    return o;
}

static float *alloc_floats(size_t n) {
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        dsrt__fail(-ENOMEM, "out of memory allocating %zu floats", n);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

/* Structure: input first, softmax last, neither elsewhere. */
static int check_structure(const dsrt_desc *d, const char *source) {
    const dsrt_layer *L = d->layers;
    if (L[0].kind != DSRT_LAYER_INPUT)
        return dsrt__fail(DSRT_EOPTION, "%s: line %d: the first layer must be 'input', not '%s'",
                          source, L[0].line, L[0].type);
    for (int i = 1; i < d->n; i++) {
        if (L[i].kind == DSRT_LAYER_INPUT)
            return dsrt__fail(DSRT_EOPTION, "%s: line %d: 'input' may only be the first layer",
                              source, L[i].line);
        if (L[i].kind == DSRT_LAYER_SOFTMAX && i != d->n - 1)
            return dsrt__fail(DSRT_EOPTION, "%s: line %d: 'softmax' must be the last layer", source,
                              L[i].line);
    }
    if (L[d->n - 1].kind != DSRT_LAYER_SOFTMAX)
        return dsrt__fail(DSRT_EOPTION, "%s: line %d: the last layer must be 'softmax', not '%s'",
                          source, L[d->n - 1].line, L[d->n - 1].type);
    return 0;
}

/* Infers every shape and lays the parameters out, each tensor 64-byte
 * aligned, in layer order. */
static int infer(dsrt_net *net, const char *source, int h, int w, int c, int classes) {
    dsrt_layer *in = &net->layers[0];
    dsrt_shape s = {c ? c : in->o.in_c, h ? h : in->o.in_h, w ? w : in->o.in_w};
    if (s.c < 1 || s.h < 1 || s.w < 1)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: line %d: input: option 'size': the input size is not known "
                          "(give size=HxWxC or an input size)",
                          source, in->line);
    net->classes = classes;
    size_t at = 0, st = 0;
    for (int i = 0; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        l->in = i ? net->layers[i - 1].out : s;
        int rc = l->def->build(l, &l->in, &net->classes);
        if (rc) return dsrt__fail_prefix(rc, "%s: line %d", source, l->line);
        if (l->w_n) {
            at = (at + 15) & ~(size_t)15;
            l->w_off = at;
            at += l->w_n;
        }
        if (l->b_n) {
            at = (at + 15) & ~(size_t)15;
            l->b_off = at;
            at += l->b_n;
        }
        if (l->s_n) {
            l->s_off = st;
            st += l->s_n;
        }
        if (at > ((size_t)1 << 34))
            return dsrt__fail(DSRT_ETOOBIG, "%s: line %d: more than 2^34 parameters", source,
                              l->line);
    }
    net->input = s;
    net->n_params = at;
    net->n_state = st;
    return 0;
}

/* Marks each ReLU that the layer before it can compute (oneDNN post-op for
 * convolution and fully connected; the batch-norm ReLU flag, not leaky). */
static void fuse(dsrt_net *net) {
    for (int i = 2; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i], *p = &net->layers[i - 1];
        if (l->kind != DSRT_LAYER_RELU) continue;
        int ok = p->kind == DSRT_LAYER_CONV || p->kind == DSRT_LAYER_FC ||
                 (p->kind == DSRT_LAYER_BATCHNORM && l->o.leak == 0.0f);
        if (!ok || p->fuse_relu) continue;
        p->fuse_relu = 1;
        p->fuse_leak = l->o.leak;
        l->fused_away = 1;
    }
}

int dsrt__net_build(dsrt_net **out, dsrt_desc *d, const char *text, const char *source, int h,
                    int w, int c, int classes, const dsrt_net_options *o, int init,
                    const size_t *expect) {
    int rc;
    *out = NULL;
    if (h < 0 || w < 0 || c < 0 || classes < 0) {
        dsrt__desc_free(d);
        return dsrt__fail(-EINVAL, "%s: negative input size or class count", source);
    }
    if ((rc = check_structure(d, source))) {
        dsrt__desc_free(d);
        return rc;
    }
    dsrt_net *net = dsrt__calloc(1, sizeof *net);
    if (!net) {
        dsrt__desc_free(d);
        return -ENOMEM;
    }
    net->layers = d->layers;
    net->n_layers = d->n;
    d->layers = NULL;
    d->n = 0;
    net->opts = o ? *o : dsrt_net_defaults();
    net->desc = dsrt__strdup(text);
    net->source = dsrt__strdup(source);
    if (!net->desc || !net->source) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = infer(net, source, h, w, c, classes))) goto fail;
    if (expect && (expect[0] != net->n_params || expect[1] != net->n_state)) {
        rc = dsrt__fail(DSRT_ECORRUPT,
                        "%s: the description makes %zu parameters and %zu state values, the file "
                        "holds %zu and %zu",
                        source, net->n_params, net->n_state, expect[0], expect[1]);
        goto fail;
    }
    if (net->opts.fuse) fuse(net);
    net->params = alloc_floats(net->n_params);
    net->grads = alloc_floats(net->n_params);
    net->state = alloc_floats(net->n_state);
    net->layer_bucket = dsrt__calloc((size_t)net->n_layers, sizeof *net->layer_bucket);
    if (!net->params || !net->grads || !net->state || !net->layer_bucket) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < net->n_layers; i++) net->layer_bucket[i] = -1;
    for (int i = 0; init && i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i];
        if (!l->def->init) continue;
        dsrt_rng rng = dsrt_rng_init(net->opts.seed, 0, (uint64_t)i, RNG_STREAM_INIT);
        l->def->init(l, net->params, net->state, &rng, net->opts.init);
    }
    if (net->opts.device >= 0) {
        rc = dsrt__fail(DSRT_ENODEVICE, "%s: device %d: this build has only the CPU backend",
                        source, net->opts.device);
        goto fail;
    }
    net->ops = &dsrt__backend_cpu;
    if ((rc = net->ops->create(&net->be, net))) goto fail;
    *out = net;
    return 0;
fail:
    dsrt_net_destroy(net);
    return rc;
}

int dsrt_net_create(dsrt_net **net, const char *spec, int height, int width, int channels,
                    int classes, const dsrt_net_options *options) {
    if (!net || !spec) return dsrt__fail(-EINVAL, "net: no description");
    *net = NULL;
    const char *const *names;
    const char *text = dsrt_net_builtin(spec, &names);
    char source[96];
    if (text) {
        snprintf(source, sizeof source, "net '%s'", spec);
    } else {
        if (!strpbrk(spec, " \t\n=#")) {
            char list[128];
            size_t at = 0;
            for (int i = 0; names[i]; i++)
                at +=
                    (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", names[i]);
            if (!spec[0])
                return dsrt__fail(DSRT_EOPTION,
                                  "net: empty description: give a built-in network (%s) or "
                                  "layers, one a line",
                                  list);
            /* The name as it can be printed: bytes that are not printable
             * ASCII (binary data given as a name) as \xNN, cut at 40. */
            char shown[4 * 40 + 4];
            size_t k = 0;
            for (const unsigned char *c = (const unsigned char *)spec; *c && k < 4 * 40; c++)
                k += (size_t)snprintf(shown + k, sizeof shown - k,
                                      *c >= 0x20 && *c < 0x7f ? "%c" : "\\x%02x", *c);
            return dsrt__fail(DSRT_EOPTION,
                              "net: unknown network '%s%s' (built in: %s; a description lists "
                              "layers, one a line)",
                              shown, strlen(spec) > 40 ? "..." : "", list);
        }
        text = spec;
        snprintf(source, sizeof source, "net description");
    }
    dsrt_desc d;
    int rc = dsrt__desc_parse(&d, text, source);
    if (rc) return rc;
    return dsrt__net_build(net, &d, text, source, height, width, channels, classes, options, 1,
                           NULL);
}

void dsrt_net_destroy(dsrt_net *net) {
    if (!net) return;
    if (net->ops && net->be) net->ops->destroy(net->be);
    free(net->layers);
    free(net->desc);
    free(net->source);
    free(net->params);
    free(net->grads);
    free(net->state);
    free(net->layer_bucket);
    free(net->buckets);
    free(net);
}

// ----------------------------------------------------------------------------
// Describing

void dsrt_net_get_info(const dsrt_net *net, dsrt_net_info *info) {
    memset(info, 0, sizeof *info);
    info->layers = net->n_layers;
    info->height = net->input.h;
    info->width = net->input.w;
    info->channels = net->input.c;
    info->classes = net->classes;
    info->params = net->n_params;
    info->state = net->n_state;
    info->backend = net->ops->name;
    /* Backward costs the forward's flops twice (data and weights), except
     * that nothing needs the gradient of the input: the first layer with
     * parameters computes only its weight gradient. */
    int first = 1;
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        info->learnable += l->w_n + l->b_n;
        info->forward_flops += l->flops;
        info->train_flops += l->flops * (first && l->flops > 0 ? 2.0 : 3.0);
        if (l->flops > 0) first = 0;
    }
}

int dsrt_net_layer(const dsrt_net *net, int i, dsrt_layer_info *info) {
    if (!net || i < 0 || i >= net->n_layers) return -EINVAL;
    const dsrt_layer *l = &net->layers[i];
    info->name = l->name;
    info->type = l->type;
    info->out_channels = l->out.c;
    info->out_height = l->out.h;
    info->out_width = l->out.w;
    info->weights_offset = l->w_off;
    info->weights_count = l->w_n;
    info->bias_offset = l->b_off;
    info->bias_count = l->b_n;
    info->fused = l->fuse_relu;
    return 0;
}

const char *dsrt_net_description(const dsrt_net *net) {
    return net->desc;
}

int dsrt_net_set_input_stats(dsrt_net *net, const float *mean, const float *std, const float *min,
                             const float *max) {
    const dsrt_layer *l = &net->layers[0];
    int c = l->out.c;
    float *s = net->state + l->s_off;
    const float *src[] = {mean, std, min, max};
    for (int k = 0; k < 4; k++) {
        if (!src[k]) continue;
        for (int i = 0; i < c; i++)
            if (!isfinite(src[k][i]) || (k == 1 && !(src[k][i] > 0)))
                return dsrt__fail(DSRT_EOPTION, "input statistics: %s[%d] = %g is not valid",
                                  (const char *[]){"mean", "std", "min", "max"}[k], i,
                                  (double)src[k][i]);
    }
    for (int k = 0; k < 4; k++)
        if (src[k]) memcpy(s + k * c, src[k], (size_t)c * sizeof(float));
    net->version++;
    return 0;
}

// ----------------------------------------------------------------------------
// Running

static int check_batch(dsrt_net *net, const float *x, const int32_t *labels, int n) {
    if (!x || n < 1) return dsrt__fail(-EINVAL, "net: empty batch (n = %d)", n);
    if (labels)
        for (int i = 0; i < n; i++)
            if (labels[i] < 0 || labels[i] >= net->classes)
                return dsrt__fail(DSRT_EOPTION, "net: label %d of image %d is outside [0, %d)",
                                  (int)labels[i], i, net->classes);
    return 0;
}

int dsrt_net_forward_backward(dsrt_net *net, const float *x, const int32_t *labels, int n,
                              float *loss, int *correct) {
    if (!labels) return dsrt__fail(-EINVAL, "net: training needs labels");
    int rc = check_batch(net, x, labels, n);
    if (rc) return rc;
    double l = 0;
    int ok = 0;
    rc = net->ops->forward(net->be, x, n, 1, labels, &l, &ok, NULL);
    if (rc) return rc;
    rc = net->ops->backward(net->be);
    net->iteration++;
    if (loss) *loss = (float)l;
    if (correct) *correct = ok;
    if (rc) return rc;
    if (!isfinite(l)) return dsrt__fail(DSRT_ENAN, "net: the loss is %g", l);
    return 0;
}

int dsrt_net_predict(dsrt_net *net, const float *x, int n, float *scores, const int32_t *labels,
                     float *loss, int *correct) {
    int rc = check_batch(net, x, labels, n);
    if (rc) return rc;
    double l = 0;
    int ok = 0;
    rc = net->ops->forward(net->be, x, n, 0, labels, &l, &ok, scores);
    if (rc) return rc;
    if (loss) *loss = labels ? (float)l : 0.0f;
    if (correct) *correct = labels ? ok : 0;
    return 0;
}

void dsrt_net_set_iteration(dsrt_net *net, int64_t iteration) {
    net->iteration = iteration;
}

int64_t dsrt_net_iteration(const dsrt_net *net) {
    return net->iteration;
}

int dsrt__net_layer_output(dsrt_net *net, int layer, float *out, int train) {
    if (layer < 0 || layer >= net->n_layers) return -EINVAL;
    return net->ops->read_output(net->be, layer, train, out);
}

// ----------------------------------------------------------------------------
// Flat buffers and buckets

float *dsrt_net_params(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_params;
    return net->params;
}

void dsrt_net_params_changed(dsrt_net *net) {
    net->version++;
}

float *dsrt_net_grads(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_params;
    return net->grads;
}

float *dsrt_net_state(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_state;
    return net->state;
}

/* Buckets of whole layers from the last layer back; first_layer[k] receives
 * the lowest layer of bucket k. */
static int make_buckets(const dsrt_net *net, size_t min_bytes, dsrt_range *out, int cap,
                        int *first_layer) {
    int nb = 0;
    size_t end = net->n_params, acc = 0;
    int lowest = -1;
    for (int i = net->n_layers - 1; i >= 1; i--) {
        const dsrt_layer *l = &net->layers[i];
        if (!l->w_n && !l->b_n) continue;
        acc += (l->w_n + l->b_n) * sizeof(float);
        lowest = i;
        if (acc >= min_bytes) {
            size_t start = l->w_n ? l->w_off : l->b_off;
            if (nb < cap) out[nb] = (dsrt_range){start, end - start};
            if (first_layer && nb < cap) first_layer[nb] = i;
            nb++;
            end = start;
            acc = 0;
            lowest = -1;
        }
    }
    if (lowest >= 0) {
        const dsrt_layer *l = &net->layers[lowest];
        size_t start = l->w_n ? l->w_off : l->b_off;
        if (nb < cap) out[nb] = (dsrt_range){start, end - start};
        if (first_layer && nb < cap) first_layer[nb] = lowest;
        nb++;
    }
    return nb;
}

int dsrt_net_buckets(const dsrt_net *net, size_t min_bytes, dsrt_range *out, int cap) {
    return make_buckets(net, min_bytes, out, out ? cap : 0, NULL);
}

int dsrt_net_set_grad_ready(dsrt_net *net, size_t min_bytes, dsrt_grad_ready_fn fn, void *ctx) {
    for (int i = 0; i < net->n_layers; i++) net->layer_bucket[i] = -1;
    free(net->buckets);
    net->buckets = NULL;
    net->n_buckets = 0;
    net->ready_fn = NULL;
    if (!fn) return 0;
    int nb = make_buckets(net, min_bytes, NULL, 0, NULL);
    dsrt_range *r = dsrt__calloc((size_t)nb + 1, sizeof *r);
    int *first = dsrt__calloc((size_t)nb + 1, sizeof *first);
    if (!r || !first) {
        free(r);
        free(first);
        return -ENOMEM;
    }
    make_buckets(net, min_bytes, r, nb, first);
    for (int k = 0; k < nb; k++) net->layer_bucket[first[k]] = k;
    free(first);
    net->buckets = r;
    net->n_buckets = nb;
    net->ready_fn = fn;
    net->ready_ctx = ctx;
    net->ready_min_bytes = min_bytes;
    return 0;
}

void dsrt__net_grads_ready(dsrt_net *net, int layer) {
    int k = net->layer_bucket[layer];
    if (net->ready_fn && k >= 0) net->ready_fn(net->ready_ctx, k, net->buckets[k]);
}
