/*
 * ONNX import: a model's graph mapped onto a dsrt description, the net built
 * from it, and the model's tensors copied into the net's flat buffers.
 *
 * The mapping walks the nodes in the file's (topological) order, keeping for
 * each named value what it is: the image input, a constant (an initializer,
 * a Constant's value, an Identity of one), or the output of a dsrt layer
 * with its shape and whether ONNX sees it flattened to (N, K). Only the
 * nodes the graph's output depends on become layers. Every operator is one
 * entry of the table below with its attributes; anything else (an operator,
 * an attribute, a shape or a mode that dsrt's layers would compute
 * differently) is refused before any weight is read, naming the node, its
 * operator and the opset, never imported as a different network.
 *
 * Weights are copied straight from the model's bytes (read into memory of
 * the import's own, whose pages are released as soon as a tensor is copied,
 * so an import holds the weights about once) or read with pread from the
 * external data files into the net's parameter buffer, tensor by tensor
 * (onnx_tensors.c; the node's values and attributes: onnx_values.c).
 * No file is mapped: a mapped file that shrinks kills its reader with
 * SIGBUS. External data must lie in the model's folder, and a link that
 * leads out of it is refused, since the file comes from a stranger.
 */
#include "nn/onnx.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX raw_data is little-endian; add byte swapping for this target"
#endif

#define OPSET_MIN 7
#define OPSET_MAX 21

dsrt_onnx_import_options dsrt_onnx_import_defaults(void) {
    dsrt_onnx_import_options o;
    memset(&o, 0, sizeof o);
    o.input_scale = 0; /* the model's metadata, else 1/255 */
    return o;
}

void dsrt_onnx_preprocess_torchvision(dsrt_onnx_import_options *o) {
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    o->input_scale = 1.0 / 255.0;
    o->n_mean = o->n_std = 3;
    memcpy(o->mean, mean, sizeof mean);
    memcpy(o->std, std, sizeof std);
}

// ----------------------------------------------------------------------------
// The state of one import

// ----------------------------------------------------------------------------
// Layers

/* Names l base, or base_2, base_3, ... : the first not taken. A name's value
 * in the set is the suffix to try next when it comes again as a base, so
 * that n layers of one name take n steps, not n^2. */
static int unique_name(onnx_import *c, onnx_layer *l, const char *base) {
    int *next = dsrt__layer_names_find(&c->names, base);
    snprintf(l->name, sizeof l->name, "%s", base);
    if (next) {
        int k = *next;
        do snprintf(l->name, sizeof l->name, "%s_%d", base, k++);
        while (dsrt__layer_names_find(&c->names, l->name));
        *next = k;
    }
    int rc = dsrt__layer_names_add(&c->names, l->name, 2);
    if (rc < 0) c->err = rc;
    return rc < 0 ? rc : 0;
}

/* A new layer taking the given values' layers, named after the node; NULL
 * with c->err when there are too many or no memory. */
onnx_layer *dsrt__onnx_add_layer(onnx_import *c, const char *type, onnx_val *const *ins, int n_in) {
    if (c->nL == DSRT_LAYERS_MAX) {
        dsrt__onnx_fail(c, DSRT_ETOOBIG, "more than %d layers", DSRT_LAYERS_MAX);
        return NULL;
    }
    if (c->nL == c->Lcap) {
        size_t cap = (size_t)c->Lcap;
        if ((c->err = dsrt__grow((void **)&c->L, &cap, (size_t)c->nL + 1, sizeof *c->L)))
            return NULL;
        c->Lcap = (int)cap;
    }
    onnx_layer *l = &c->L[c->nL];
    memset(l, 0, sizeof *l);
    l->type = type;
    if (!dsrt__layer_type_find(type, &l->kind)) {
        c->err = dsrt__fail(DSRT_EUNSUPPORTED, "onnx: %s: no layer type '%s'", c->file, type);
        return NULL;
    }
    l->node = c->cur ? c->cur->index : -1;
    l->w_scale = l->b_scale = 1.0f;
    for (int k = 0; k < n_in; k++) l->in[l->n_in++] = ins[k]->layer;
    /* The name: the node's (or its first output's, or its operator's), in
     * the letters a dsrt name takes ('/' of scoped names as '.', others as
     * '_'), its end kept when it is long, made unique. */
    onnx_str src = {(const uint8_t *)type, strlen(type)};
    if (c->cur && c->cur->name.n)
        src = c->cur->name;
    else if (c->cur && c->cur->n_out && c->cur->out[0].n)
        src = c->cur->out[0];
    char all[ONNX_NAME_MAX + 1], base[41], scoped[ONNX_NAME_MAX + 1];
    /* A scoped name repeats each scope in the next ("/features/features.1/
     * features.1.0/Conv", as PyTorch's exporter writes them): each scope
     * keeps what it adds to the one before ("features.1.0.Conv"). */
    size_t sn = 0;
    const uint8_t *prev = NULL;
    size_t prev_n = 0;
    for (size_t i = 0; i < src.n;) {
        size_t j = i;
        while (j < src.n && src.p[j] != '/') j++;
        const uint8_t *seg = src.p + i;
        size_t n = j - i;
        const uint8_t *whole = seg;
        size_t whole_n = n;
        if (prev && n > prev_n + 1 && !memcmp(seg, prev, prev_n) && seg[prev_n] == '.')
            seg += prev_n + 1, n -= prev_n + 1;
        if (whole_n) prev = whole, prev_n = whole_n;
        if (n && sn) scoped[sn++] = '/';
        memcpy(scoped + sn, seg, n);
        sn += n;
        i = j + 1;
    }
    if (sn) src = (onnx_str){(const uint8_t *)scoped, sn};
    size_t k = 0;
    for (size_t i = 0; i < src.n; i++) {
        char ch = (char)src.p[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == '-';
        ch = ok ? ch : ch == '/' ? '.' : '_';
        if (ch == '.' && (k == 0 || all[k - 1] == '.')) continue;
        all[k++] = ch;
    }
    all[k] = '\0';
    const char *from = all;
    if (k > sizeof base - 1) {
        from = all + k - (sizeof base - 1);
        const char *dot = strchr(from, '.');
        if (dot && dot[1] && dot - from < 12) from = dot + 1;
    }
    if (!*from) from = "x";
    size_t len = DSRT_MIN(strlen(from), sizeof base - 1);
    memcpy(base, from, len);
    base[len] = '\0';
    if (unique_name(c, l, base)) return NULL;
    c->nL++;
    return l;
}

void dsrt__onnx_opt(onnx_layer *l, const char *fmt, ...) {
    size_t at = strlen(l->opts);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->opts + at, sizeof l->opts - at, fmt, ap);
    va_end(ap);
}

/* Output 0 of the node is layer l's output. */
void dsrt__onnx_produce(onnx_import *c, onnx_layer *l, int flat) {
    onnx_val *o = dsrt__onnx_output(c, 0);
    if (!o) return;
    o->kind = ONNX_V_LAYER;
    o->layer = (int)(l - c->L);
    o->flat = flat;
    o->nhwc = !flat && (c->op_flags & ONNX_OP_ELEMENTWISE ? c->in_nhwc : c->out_nhwc);
}

/* Whether the node has input k (an empty name is an input left out). */
int dsrt__onnx_has_input(onnx_import *c, int k) {
    return k < c->cur->n_in && c->cur->in[k].n > 0;
}

/* A computed input (not a constant): the image or a layer's output. */
onnx_val *dsrt__onnx_data_input(onnx_import *c, int k, const char *what) {
    if (!dsrt__onnx_has_input(c, k)) {
        dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s input is missing", what);
        return NULL;
    }
    onnx_val *v = dsrt__onnx_input(c, k);
    if (!v) return NULL;
    if (v->kind == ONNX_V_CONST) {
        dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                        "its %s input '%s' is a constant (dsrt computes layers of "
                        "the image, not of constants)",
                        what, ONNX_SHOWN(v->name));
        return NULL;
    }
    if (v->nhwc && !(c->op_flags & (ONNX_OP_ELEMENTWISE | ONNX_OP_NHWC))) {
        dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                        "its %s input '%s' is channels-last (N, H, W, C) after a Transpose: dsrt "
                        "takes this operator on (N, C, H, W) only",
                        what, ONNX_SHOWN(v->name));
        return NULL;
    }
    if (k == 0) c->in_nhwc = v->nhwc;
    if (v->kind == ONNX_V_INPUT) {
        if (v->stage != c->stage) {
            dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED,
                "it takes the image '%s' as it was before the normalisation that other nodes "
                "apply (dsrt's net has one input normalisation)",
                ONNX_SHOWN(v->name));
            return NULL;
        }
        c->frozen = 1;
    }
    return v;
}

/* A constant input (an initializer); only called for inputs given. */
onnx_tensor *dsrt__onnx_const_input(onnx_import *c, int k, const char *what) {
    if (!dsrt__onnx_has_input(c, k)) {
        dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s input is missing", what);
        return NULL;
    }
    onnx_val *v = dsrt__onnx_input(c, k);
    if (!v) return NULL;
    if (v->kind != ONNX_V_CONST) {
        dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                        "its %s '%s' is computed, not a constant (an initializer)", what,
                        ONNX_SHOWN(v->name));
        return NULL;
    }
    return v->t;
}

/* An image input (4-D in ONNX: not flattened). */
onnx_val *dsrt__onnx_image_input(onnx_import *c) {
    onnx_val *v = dsrt__onnx_data_input(c, 0, "first");
    if (v && v->flat) {
        dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                        "its input '%s' is flattened to (N, K); this operator takes "
                        "(N, C, H, W) images",
                        ONNX_SHOWN(v->name));
        return NULL;
    }
    return v;
}

/* Whether a value may be used where a (k, 1, 1) dsrt shape is meant by
 * ONNX's (N, K): flattened from a layer with one pixel, or a 4-D (N, C, 1, 1)
 * seen as 2-D is not the same value. */
int dsrt__onnx_flat_is_channels(onnx_import *c, const onnx_val *v) {
    dsrt_shape s = dsrt__onnx_shape_of(c, v);
    return s.h == 1 && s.w == 1;
}

/* The shape of a layer's output, in 64 bits until it is known to fit:
 * refused, naming the node, when its images would have more values than
 * an int indexes. */
int dsrt__onnx_out_shape(onnx_import *c, int64_t ch, int64_t h, int64_t w, dsrt_shape *out) {
    if (dsrt__volume(ch, h, w) > INT32_MAX)
        return dsrt__onnx_fail(
            c, DSRT_ETOOBIG,
            "its output would be (N, %lld, %lld, %lld): more than 2^31 - 1 values an "
            "image",
            (long long)ch, (long long)h, (long long)w);
    *out = (dsrt_shape){(int)ch, (int)h, (int)w};
    return 0;
}

// ----------------------------------------------------------------------------
// Windows: convolution and pooling geometry

static int one_axis(int in, int k, int s, int d, int p0, int p1, int64_t *out) {
    int64_t keff = (int64_t)(k - 1) * d + 1, span = (int64_t)in + p0 + p1 - keff;
    if (span < 0) return -1;
    *out = span / s + 1;
    return 0;
}

/* Reads kernel_shape (or takes kernel), strides, dilations, pads and
 * auto_pad into w for input s. */
int dsrt__onnx_geometry(onnx_import *c, const dsrt_shape *s, const int *kernel, int dilations,
                        onnx_window *w) {
    int64_t ks[2] = {kernel ? kernel[0] : 0, kernel ? kernel[1] : 0}, st[2] = {1, 1},
            dl[2] = {1, 1}, pads[4] = {0, 0, 0, 0};
    int rc;
    if ((rc = dsrt__onnx_get_ints(c, "kernel_shape", 2, ks)) < 0) return rc;
    if (!rc && !kernel)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute 'kernel_shape' is required");
    if (rc && kernel && (ks[0] != kernel[0] || ks[1] != kernel[1]))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT,
                               "kernel_shape %lldx%lld disagrees with the weights' %dx%d",
                               (long long)ks[0], (long long)ks[1], kernel[0], kernel[1]);
    if ((rc = dsrt__onnx_get_ints(c, "strides", 2, st)) < 0) return rc;
    if ((rc = dsrt__onnx_get_ints(c, "dilations", 2, dl)) < 0) return rc;
    if ((rc = dsrt__onnx_get_ints(c, "pads", 4, pads)) < 0) return rc;
    if (!dilations && (dl[0] != 1 || dl[1] != 1))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "dilations %lldx%lld: dsrt's pooling has none",
                               (long long)dl[0], (long long)dl[1]);
    for (int i = 0; i < 2; i++)
        if (ks[i] < 1 || ks[i] > 4096 || st[i] < 1 || st[i] > 4096 || dl[i] < 1 || dl[i] > 4096)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "kernel %lldx%lld, strides %lldx%lld, dilations "
                                   "%lldx%lld: each must be 1 to 4096",
                                   (long long)ks[0], (long long)ks[1], (long long)st[0],
                                   (long long)st[1], (long long)dl[0], (long long)dl[1]);
    for (int i = 0; i < 4; i++)
        if (pads[i] < 0 || pads[i] > 4096)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "pads %lld: each must be 0 to 4096",
                                   (long long)pads[i]);
    char ap[32];
    if ((rc = dsrt__onnx_get_string(c, "auto_pad", "NOTSET", ap, sizeof ap))) return rc;
    *w = (onnx_window){(int)ks[0], (int)ks[1], (int)st[0], (int)st[1], (int)dl[0], (int)dl[1],
                       /* ONNX: [top, left, bottom, right] */
                       (int)pads[0], (int)pads[2], (int)pads[1], (int)pads[3], 0, 0};
    if (!strcmp(ap, "VALID")) {
        w->pt = w->pb = w->pl = w->pr = 0;
    } else if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
        int ins[2] = {s->h, s->w}, *p0[2] = {&w->pt, &w->pl}, *p1[2] = {&w->pb, &w->pr};
        int kk[2] = {w->kh, w->kw}, ss[2] = {w->sh, w->sw}, dd[2] = {w->dh, w->dw};
        for (int i = 0; i < 2; i++) {
            int64_t out = ((int64_t)ins[i] + ss[i] - 1) / ss[i];
            int64_t total = (out - 1) * ss[i] + (int64_t)(kk[i] - 1) * dd[i] + 1 - ins[i];
            /* Less than none (a stride past the window): convolutions
             * agree on none; pooling's windows the runtimes place apart
             * (onnxruntime's average pooling one row in, its max pooling
             * refuses), and ONNX does not say. */
            if (total < 0 && c->cur && !onnx_is(c->cur->op, "Conv"))
                return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                       "auto_pad %s with %s %d past its window of %d: where "
                                       "the windows lie is not defined",
                                       ap, i ? "stride across" : "stride down", ss[i], kk[i]);
            if (total < 0) total = 0;
            int small = (int)(total / 2), large = (int)(total - total / 2);
            *p0[i] = ap[5] == 'U' ? small : large; /* UPPER: the extra one at the end */
            *p1[i] = ap[5] == 'U' ? large : small;
        }
    } else if (strcmp(ap, "NOTSET") != 0) {
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "auto_pad '%s' is not NOTSET, VALID, SAME_UPPER or "
                               "SAME_LOWER",
                               ap);
    }
    if (one_axis(s->h, w->kh, w->sh, w->dh, w->pt, w->pb, &w->oh) ||
        one_axis(s->w, w->kw, w->sw, w->dw, w->pl, w->pr, &w->ow))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "a %dx%d window does not fit the %dx%d input",
                               w->kh, w->kw, s->h, s->w);
    return 0;
}

void dsrt__onnx_window_opts(onnx_layer *l, const onnx_window *w) {
    dsrt__onnx_opt(l, " size=%dx%d stride=%dx%d pad=%d,%d,%d,%d", w->kh, w->kw, w->sh, w->sw, w->pt,
                   w->pb, w->pl, w->pr);
}

// ----------------------------------------------------------------------------
// Operators

static int map_flatten(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    int64_t axis;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "axis", 1, &axis))) return rc;
    int rank = x->flat ? 2 : 4;
    if (axis < 0) axis += rank;
    if (axis != 1)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "axis %lld: dsrt flattens each image (axis 1)",
                               (long long)axis);
    dsrt_shape sh = dsrt__onnx_shape_of(c, x);
    if (x->nhwc && !(sh.h == 1 && sh.w == 1))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "it flattens a channels-last image of %dx%d pixels, whose values "
                               "come in another order than dsrt's (N, C, H, W)",
                               sh.h, sh.w);
    dsrt__onnx_alias(c, x, 1);
    return 0;
}

/* Transpose of a computed value: (N, C, H, W) to channels-last (N, H, W, C),
 * perm (0, 2, 3, 1), and back, perm (0, 3, 1, 2), are the same dsrt value
 * seen in the other order (ConvNeXt's blocks, tf2onnx's NHWC input); any
 * other permutation is refused. */
static int map_transpose(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    int64_t perm[4];
    int rc = dsrt__onnx_get_ints(c, "perm", 4, perm);
    if (rc < 0) return rc;
    int to_last = rc && perm[0] == 0 && perm[1] == 2 && perm[2] == 3 && perm[3] == 1;
    int to_first = rc && perm[0] == 0 && perm[1] == 3 && perm[2] == 1 && perm[3] == 2;
    if (x->flat || !(x->nhwc ? to_first : to_last)) {
        char text[64] = "reversed";
        if (rc)
            snprintf(text, sizeof text, "%lld, %lld, %lld, %lld", (long long)perm[0],
                     (long long)perm[1], (long long)perm[2], (long long)perm[3]);
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "perm (%s) of a %s value: dsrt transposes only between (N, C, H, W) "
                               "and channels-last (N, H, W, C)",
                               text,
                               x->flat   ? "(N, K)"
                               : x->nhwc ? "channels-last"
                                         : "(N, C, H, W)");
    }
    onnx_val *o = dsrt__onnx_output(c, 0);
    dsrt__onnx_alias(c, x, 0);
    if (o) o->nhwc = !x->nhwc;
    return 0;
}

/* An operator dsrt folds only (shape arithmetic), met with a computed
 * input: refused naming it. */
static int map_fold_only(onnx_import *c) {
    return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                           "dsrt computes %s only on constants and the static shapes of values "
                           "(shape arithmetic, folded at import), and an input here is computed",
                           ONNX_SHOWN(c->cur->op));
}

static int map_reshape(onnx_import *c) {
    onnx_val *x = dsrt__onnx_data_input(c, 0, "first");
    if (!x) return c->err;
    const onnx_tensor *t = dsrt__onnx_const_input(c, 1, "shape");
    if (!t) return c->err;
    int64_t shape[8], allow;
    int rc, n = dsrt__onnx_tensor_ints(c, t, shape, 8);
    if (n < 0) return n;
    if ((rc = dsrt__onnx_get_int(c, "allowzero", 0, &allow))) return rc;
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    int64_t k = (int64_t)s.c * s.h * s.w, d1 = x->flat ? k : x->nhwc ? s.h : s.c;
    /* The leading dimension: the batch (0 copies it, -1 infers it, a folded
     * Shape gives it as ONNX_BATCH, or the model's fixed batch). */
    int batch = n >= 1 && (shape[0] == ONNX_BATCH || (shape[0] == 0 && !allow) ||
                           (c->batch > 0 && shape[0] == c->batch));
    int ok = n == 2 && (batch || shape[0] == -1) && !(allow && shape[1] == 0);
    if (ok) {
        int64_t b = shape[1] == 0 ? d1 : shape[1];
        ok = b == k || (b == -1 && batch);
    }
    /* (N, C, 1, 1) of a flat value with one pixel, or of an image with one:
     * the same value as an image. */
    if (!ok && n == 4 && batch && s.h == 1 && s.w == 1 && (shape[1] == s.c || shape[1] == -1) &&
        shape[2] == 1 && shape[3] == 1) {
        dsrt__onnx_alias(c, x, 0);
        return 0;
    }
    /* A flattened value with one pixel back to (N, C, 1, 1) is handled above;
     * a channels-last value flattens like a channels-first one only with
     * one pixel. */
    if (ok && x->nhwc && !(s.h == 1 && s.w == 1)) ok = 0;
    if (!ok) {
        char text[160] = "";
        for (int i = 0, at = 0; i < n && at < (int)sizeof text - 24; i++)
            at +=
                snprintf(text + at, sizeof text - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "shape (%s): dsrt reshapes only to (N, %lld), each image flattened",
                               text, (long long)k);
    }
    dsrt__onnx_alias(c, x, 1);
    return 0;
}

int dsrt__onnx_affine(onnx_import *c);

/*
 * Add, Sub, Mul or Div of a constant (one value: shape (), (1), (1, 1, 1,
 * 1); or one a channel: (C, 1, 1), (1, C, 1, 1)) on the image before any
 * layer: the input's normalisation, composed into na x + nb per channel. A
 * (C) is not one a channel: ONNX broadcasts it along the width.
 */
int dsrt__onnx_affine(onnx_import *c) {
    const onnx_node *n = c->cur;
    if (n->n_in != 2) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "%d inputs", n->n_in);
    onnx_val *x = NULL, *k = NULL;
    int xi = -1;
    for (int i = 0; i < 2; i++) {
        onnx_val *v = dsrt__onnx_input(c, i);
        if (!v) return c->err ? c->err : dsrt__onnx_fail(c, DSRT_ECORRUPT, "an input is missing");
        if (v->kind == ONNX_V_CONST)
            k = v;
        else
            x = v, xi = i;
    }
    int add = onnx_is(n->op, "Add"), mul = onnx_is(n->op, "Mul"), sub = onnx_is(n->op, "Sub");
    if (!x || !k || x->kind != ONNX_V_INPUT || (xi != 0 && !add && !mul))
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "dsrt takes Add, Sub, Mul and Div of a constant only on the image before "
            "any layer (the input normalisation: x %s constant)",
            add   ? "+"
            : sub ? "-"
            : mul ? "*"
                  : "/");
    if (c->frozen || x->stage != c->stage)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "it normalises the image after a layer took it");
    /* ONNX broadcasts as numpy does: the constant's axes line up with the
     * image's last ones, (C) with the width. dsrt's normalisation is one
     * value, or one a channel: 1 on every axis but the channels'. */
    const onnx_tensor *t = k->t;
    int ch = c->in_c, rank = x->flat ? 2 : 4, per = 0;
    int64_t axes[4] = {1, 1, 1, 1};
    int ok = t->ndims <= rank;
    for (int d = 0; ok && d < t->ndims; d++) axes[rank - t->ndims + d] = t->dims[d];
    int chan = x->nhwc ? 3 : 1; /* the channels' axis */
    for (int a = 0; ok && a < rank; a++) {
        if (a == chan && axes[a] == ch && ch > 1) /* flattened: channels only when H = W = 1 */
            ok = per = !x->flat || (c->in_h == 1 && c->in_w == 1);
        else
            ok = axes[a] == 1;
    }
    if (!ok) {
        char dims[160] = "";
        for (int d = 0, at = 0; d < t->ndims && at < (int)sizeof dims - 24; d++)
            at += snprintf(dims + at, sizeof dims - (size_t)at, "%s%lld", d ? ", " : "",
                           (long long)t->dims[d]);
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "constant '%s' of shape (%s): ONNX broadcasts it along the last axes of the "
            "%s image, where dsrt's input normalisation takes one value, or one a "
            "channel ((%d, 1, 1) or (1, %d, 1, 1))",
            ONNX_SHOWN(t->name), dims, x->flat ? "(N, K) flattened" : "(N, C, H, W)", ch, ch);
    }
    float *v = dsrt__malloc((size_t)t->count * sizeof *v);
    if (!v) return -ENOMEM;
    int rc = dsrt__onnx_tensor_floats(c, t, v);
    /* pixels / 255 in every channel: what dsrt hands its input onnx_layer
     * (a divisor of 255 in some channels only is a normalisation). */
    int pixels = !rc && c->stage == 0 && !add && !sub && !mul && c->scale == 1.0 && !c->user_stats;
    for (int i = 0; pixels && i < ch; i++) pixels = v[per ? i : 0] == 255.0f;
    for (int i = 0; !rc && i < ch; i++) {
        double q = v[per ? i : 0];
        if (!isfinite(q) || (!add && !sub && !mul && q == 0)) {
            rc = dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "constant '%s' holds %g",
                                 ONNX_SHOWN(t->name), q);
            break;
        }
        if (pixels)
            c->pixel_div = 1;
        else if (add)
            c->nb[i] += q;
        else if (sub)
            c->nb[i] -= q;
        else if (mul)
            c->na[i] *= q, c->nb[i] *= q;
        else
            c->na[i] /= q, c->nb[i] /= q;
    }
    free(v);
    if (rc) return rc;
    onnx_val *o = dsrt__onnx_output(c, 0);
    c->stage++;
    if (o) {
        o->kind = ONNX_V_INPUT;
        o->layer = 0;
        o->stage = c->stage;
        o->flat = x->flat;
        o->nhwc = x->nhwc;
    }
    return 0;
}

static int map_identity(onnx_import *c) {
    if (!dsrt__onnx_has_input(c, 0))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its input is missing");
    onnx_val *x = dsrt__onnx_input(c, 0);
    if (!x) return c->err;
    dsrt__onnx_alias(c, x, x->flat);
    return 0;
}

/* Constant: its value as a constant tensor. */
static int map_constant(onnx_import *c) {
    onnx_val *o = dsrt__onnx_output(c, 0);
    if (!o) return 0;
    onnx_tensor *t = dsrt__arena_alloc(&c->m.arena, sizeof *t, 8);
    if (!t) return -ENOMEM;
    memset(t, 0, sizeof *t);
    t->name = o->name;
    const onnx_attr *a;
    if ((a = dsrt__onnx_get_attr(c, "value"))) {
        if (!a->t) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute 'value' is not a tensor");
        *t = *a->t;
        t->name = o->name;
    } else if ((a = dsrt__onnx_get_attr(c, "value_float")) ||
               (a = dsrt__onnx_get_attr(c, "value_floats"))) {
        int many = onnx_is(a->name, "value_floats");
        if (many ? !a->floats && a->n_floats : !a->has_f)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute '%s' holds no floats",
                                   ONNX_SHOWN(a->name));
        float *f = dsrt__arena_alloc(&c->m.arena, sizeof(float) * (many ? a->n_floats + 1 : 1), 8);
        if (!f) return -ENOMEM;
        if (many)
            memcpy(f, a->floats, a->n_floats * sizeof *f);
        else
            f[0] = a->f;
        t->dtype = ONNX_FLOAT;
        t->count = many ? a->n_floats : 1;
        t->ndims = many;
        t->dims[0] = (int64_t)t->count;
        t->made_f = f;
    } else if ((a = dsrt__onnx_get_attr(c, "value_int")) ||
               (a = dsrt__onnx_get_attr(c, "value_ints"))) {
        int many = onnx_is(a->name, "value_ints");
        if (!many && !a->has_i)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute 'value_int' holds no integer");
        int64_t *v =
            dsrt__arena_alloc(&c->m.arena, sizeof(int64_t) * (many ? a->n_ints + 1 : 1), 8);
        if (!v) return -ENOMEM;
        if (many)
            memcpy(v, a->ints, a->n_ints * sizeof *v);
        else
            v[0] = a->i;
        t->dtype = ONNX_INT64;
        t->count = many ? a->n_ints : 1;
        t->ndims = many;
        t->dims[0] = (int64_t)t->count;
        t->made_i = v;
    } else {
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "a Constant without value, value_float(s) or "
                               "value_int(s)");
    }
    o->kind = ONNX_V_CONST;
    o->t = t;
    return 0;
}

/* The operators the import itself maps (no layer, or the input's
 * normalisation); every other comes from a kind's onnx_ops. */
static const dsrt_onnx_op OPS[] = {
    {"Flatten", map_flatten, "axis", ONNX_OP_NHWC},
    {"Reshape", map_reshape, "allowzero", ONNX_OP_NHWC},
    {"Transpose", map_transpose, "perm", ONNX_OP_NHWC},
    {"Identity", map_identity, "", ONNX_OP_ELEMENTWISE},
    {"Sub", dsrt__onnx_affine, "", 0},
    {"Div", dsrt__onnx_affine, "", 0},
    {"Constant", map_constant, "value,value_float,value_floats,value_int,value_ints", 0},
    /* Shape arithmetic, folded (onnx_fold.c) */
    {"Shape", map_fold_only, "end,start", 0},
    {"Gather", map_fold_only, "axis", 0},
    {"Unsqueeze", map_fold_only, "axes", 0},
    {"Squeeze", map_fold_only, "axes", 0},
    {"Slice", map_fold_only, "axes,ends,starts", 0},
    {"Cast", map_fold_only, "saturate,to", 0},
    {"ConstantOfShape", map_fold_only, "value", 0},
    {"Range", map_fold_only, "", 0},
    {"Expand", map_fold_only, "", 0},
    {"Pow", map_fold_only, "", 0},
    {"Sqrt", map_fold_only, "", 0},
    {"Neg", map_fold_only, "", 0},
    {"Floor", map_fold_only, "", 0},
    {"Ceil", map_fold_only, "", 0},
    {"Abs", map_fold_only, "", 0},
    {"Reciprocal", map_fold_only, "", 0},
    {"Mod", map_fold_only, "fmod", 0},
    {"Max", map_fold_only, "", 0},
    {"Min", map_fold_only, "", 0},
    {"Equal", map_fold_only, "", 0},
    {"Less", map_fold_only, "", 0},
    {"Greater", map_fold_only, "", 0},
    {"Where", map_fold_only, "", 0},
    {"Not", map_fold_only, "", 0},
    {"And", map_fold_only, "", 0},
    {"Or", map_fold_only, "", 0},
    {"Xor", map_fold_only, "", 0},
    {NULL, NULL, NULL, 0},
};

/* Node n's operator: the import's own, or a kind's; NULL when none maps it. */
static const dsrt_onnx_op *op_of(const onnx_node *n) {
    if (n->domain.n && !onnx_is(n->domain, "ai.onnx")) return NULL;
    for (const dsrt_onnx_op *o = OPS; o->op; o++)
        if (onnx_is(n->op, o->op)) return o;
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_onnx_op *o = dsrt__layers[k]->onnx_ops; o && o->op; o++)
            if (onnx_is(n->op, o->op) && (n->made || !(o->flags & ONNX_OP_MADE))) return o;
    return NULL;
}

/* "A, B, C": every operator the import maps, into buf. */
static void op_list(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = -1; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_onnx_op *o = k < 0 ? OPS : dsrt__layers[k]->onnx_ops; o && o->op; o++)
            if (at < cap && !(o->flags & ONNX_OP_MADE))
                at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? ", " : "", o->op);
}

// ----------------------------------------------------------------------------
// The graph

/* Checks the opset and every node's operator before anything else. */
static int check_operators(onnx_import *c) {
    const onnx_model *m = &c->m;
    if (!m->opset)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: the model imports no opset of the default "
                          "domain",
                          c->file);
    if (m->opset < OPSET_MIN || m->opset > OPSET_MAX)
        return dsrt__fail(DSRT_EUNSUPPORTED, "onnx: %s: opset %lld: dsrt imports opsets %d to %d",
                          c->file, (long long)m->opset, OPSET_MIN, OPSET_MAX);
    if (m->sparse_inits)
        return dsrt__fail(DSRT_EUNSUPPORTED, "onnx: %s: sparse initializers", c->file);
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *n = &m->nodes[i];
        if (op_of(n)) continue;
        char list[1024];
        op_list(list, sizeof list);
        c->cur = n;
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "operator '%s%s%s' is not supported (dsrt imports %s)",
                               n->domain.n ? ONNX_SHOWN(n->domain) : "", n->domain.n ? "." : "",
                               ONNX_SHOWN(n->op), list);
    }
    return 0;
}

/* The image: the one graph input that is not an initializer, float
 * (N, C, H, W) with its channels, height and width known (a symbolic size
 * from the options). Sets the net's input size; *out is the input. */
/* Whether the image is channels-last (N, H, W, C), as models converted from
 * TensorFlow take it: the first node that takes it, past element-wise
 * normalisation by constants (Add, Sub, Mul, Div, Cast, Identity), is a
 * Transpose to (N, C, H, W). */
static int image_is_nhwc(onnx_import *c, onnx_str image) {
    const onnx_model *m = &c->m;
    onnx_str seen[64];
    int n = 0;
    seen[n++] = image;
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *nd = &m->nodes[i];
        int takes = 0;
        for (int k = 0; k < nd->n_in && !takes; k++)
            for (int j = 0; j < n && !takes; j++) takes = onnx_same(nd->in[k], seen[j]);
        if (!takes) continue;
        if (onnx_is(nd->op, "Transpose")) {
            for (int a = 0; a < nd->n_attr; a++) {
                const onnx_attr *at = &nd->attr[a];
                if (onnx_is(at->name, "perm") && at->n_ints == 4)
                    return at->ints[0] == 0 && at->ints[1] == 3 && at->ints[2] == 1 &&
                           at->ints[3] == 2;
            }
            return 0;
        }
        int affine = onnx_is(nd->op, "Add") || onnx_is(nd->op, "Sub") || onnx_is(nd->op, "Mul") ||
                     onnx_is(nd->op, "Div") || onnx_is(nd->op, "Cast") ||
                     onnx_is(nd->op, "Identity");
        if (!affine || nd->n_out < 1 || n == 64) return 0;
        seen[n++] = nd->out[0];
    }
    return 0;
}

static int graph_image(onnx_import *c, const dsrt_onnx_import_options *o, const onnx_value **out) {
    onnx_model *m = &c->m;
    const onnx_value *img = NULL;
    for (int i = 0; i < m->n_inputs; i++) {
        if (dsrt__onnx_find(c, m->inputs[i].name)) continue;
        if (img)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "onnx: %s: inputs '%s' and '%s': dsrt takes one "
                              "input, the images",
                              c->file, ONNX_SHOWN(img->name), ONNX_SHOWN(m->inputs[i].name));
        img = &m->inputs[i];
    }
    if (!img) return dsrt__fail(DSRT_EUNSUPPORTED, "onnx: %s: the graph has no input", c->file);
    if (img->elem_type != ONNX_FLOAT || img->ndims != 4)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: input '%s' is %s with %d dimensions: dsrt takes float images "
                          "(N, C, H, W)",
                          c->file, ONNX_SHOWN(img->name), dsrt__onnx_dtype_name(img->elem_type),
                          img->ndims);
    /* Channels-last: (N, H, W, C) read as dsrt's (N, C, H, W). */
    c->in_nhwc = image_is_nhwc(c, img->name);
    int64_t dims[4] = {img->dims[0], img->dims[1], img->dims[2], img->dims[3]};
    if (c->in_nhwc) {
        dims[1] = img->dims[3];
        dims[2] = img->dims[1];
        dims[3] = img->dims[2];
    }
    int64_t h = dims[2] > 0 ? dims[2] : o->height, w = dims[3] > 0 ? dims[3] : o->width;
    if (dims[1] > 0 && h > 0 && w > 0 && dsrt__volume(dims[1], h, w) > INT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG,
                          "onnx: %s: input '%s' is (N, %lld, %lld, %lld): more than 2^31 - 1 "
                          "values an image",
                          c->file, ONNX_SHOWN(img->name), (long long)dims[1], (long long)h,
                          (long long)w);
    if (dims[1] > 65536 || h > 65536 || w > 65536)
        return dsrt__fail(DSRT_ETOOBIG,
                          "onnx: %s: input '%s' is (N, %lld, %lld, %lld): dsrt's images have at "
                          "most 65536 channels, rows and columns",
                          c->file, ONNX_SHOWN(img->name), (long long)dims[1], (long long)h,
                          (long long)w);
    if (dims[1] < 1 || h < 1 || w < 1 || (o->height && dims[2] > 0 && dims[2] != o->height) ||
        (o->width && dims[3] > 0 && dims[3] != o->width))
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: input '%s' is (N, %lld, %lld, %lld)%s: dsrt needs its "
                          "channels, height and width (a symbolic size is given by the height and "
                          "width options, a fixed one cannot change)",
                          c->file, ONNX_SHOWN(img->name), (long long)dims[1], (long long)dims[2],
                          (long long)dims[3], o->height || o->width ? " for the size asked" : "");
    c->in_c = (int)dims[1];
    c->in_h = (int)h;
    c->in_w = (int)w;
    c->batch = img->dims[0];
    *out = img;
    return 0;
}

/* What the model takes: the caller's scale, else its own metadata's (a
 * model dsrt wrote takes pixels as they are), else [0, 1]. */
static int input_scale(onnx_import *c, const dsrt_onnx_import_options *o) {
    onnx_model *m = &c->m;
    c->user_stats = o->n_mean || o->n_std;
    c->scale = o->input_scale;
    c->scale_said = o->input_scale > 0;
    for (int i = 0; !(c->scale > 0) && i < m->n_meta; i++) {
        onnx_str v = m->meta[i].value;
        char num[32];
        if (!onnx_is(m->meta[i].key, "dsrt.input_scale") || v.n == 0 || v.n >= sizeof num) continue;
        memcpy(num, v.p, v.n);
        num[v.n] = '\0';
        char *end;
        double s = strtod(num, &end);
        if (*end || !(s > 0) || !isfinite(s))
            return dsrt__fail(DSRT_ECORRUPT, "onnx: %s: metadata dsrt.input_scale '%s'", c->file,
                              ONNX_SHOWN(v));
        c->scale = s;
        c->scale_said = 1;
    }
    if (!(c->scale > 0)) c->scale = 1.0 / 255.0;
    return 0;
}

/* The one output, the class scores, and the nodes it needs: nodes are in
 * topological order, so walking back, each live node makes its inputs'
 * producers live. Counts each value's uses. */
static int mark_live(onnx_import *c) {
    onnx_model *m = &c->m;
    if (m->n_outputs != 1)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: %d outputs: dsrt's net has one, the class "
                          "scores",
                          c->file, m->n_outputs);
    onnx_val *out = dsrt__onnx_find(c, m->outputs[0].name);
    if (!out || out->producer < 0)
        return dsrt__fail(DSRT_EUNSUPPORTED, "onnx: %s: output '%s' is not made by a node", c->file,
                          ONNX_SHOWN(m->outputs[0].name));
    out->uses = 1;
    c->live[out->producer] = 1;
    for (int i = m->n_nodes - 1; i >= 0; i--) {
        if (!c->live[i]) continue;
        const onnx_node *nd = &m->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            if (!nd->in[k].n) continue;
            onnx_val *v = dsrt__onnx_find(c, nd->in[k]);
            if (!v) {
                c->cur = nd;
                return dsrt__onnx_fail(c, DSRT_ECORRUPT, "input '%s' is not defined in the graph",
                                       ONNX_SHOWN(nd->in[k]));
            }
            v->uses++;
            if (v->producer >= 0) {
                if (v->producer >= i) {
                    c->cur = nd;
                    return dsrt__onnx_fail(
                        c, DSRT_ECORRUPT,
                        "input '%s' is made by node %d, below it (the graph must be in "
                        "topological order)",
                        ONNX_SHOWN(nd->in[k]), c->m.nodes[v->producer].number);
                }
                c->live[v->producer] = 1;
            }
        }
    }
    return 0;
}

/* The values table: initializers, the image input, every node's outputs;
 * the nodes the output depends on (live) and how often each value is used
 * on the way. */
static int make_values(onnx_import *c, const dsrt_onnx_import_options *o) {
    onnx_model *m = &c->m;
    size_t n = (size_t)m->n_inits + (size_t)m->n_inputs + 1;
    for (int i = 0; i < m->n_nodes; i++) n += (size_t)m->nodes[i].n_out;
    c->vcap = n;
    c->slots = 16;
    while (c->slots < 2 * n) c->slots *= 2;
    c->v = dsrt__calloc(n, sizeof *c->v);
    c->slot = dsrt__calloc(c->slots, sizeof *c->slot);
    c->live = dsrt__calloc((size_t)m->n_nodes + 1, sizeof *c->live);
    c->absorbed = dsrt__calloc((size_t)m->n_nodes + 1, sizeof *c->absorbed);
    if (!c->v || !c->slot || !c->live || !c->absorbed) return -ENOMEM;
    for (int i = 0; i < m->n_inits; i++) {
        onnx_val *v = dsrt__onnx_define(c, m->inits[i].name, ONNX_V_CONST);
        if (!v) return DSRT_ECORRUPT;
        v->t = &m->inits[i];
    }
    const onnx_value *img = NULL;
    int rc = graph_image(c, o, &img);
    if (rc) return rc;
    c->na = dsrt__malloc((size_t)c->in_c * sizeof *c->na);
    c->nb = dsrt__calloc((size_t)c->in_c, sizeof *c->nb);
    if (!c->na || !c->nb) return -ENOMEM;
    for (int i = 0; i < c->in_c; i++) c->na[i] = 1.0;
    if ((rc = input_scale(c, o))) return rc;
    onnx_val *iv = dsrt__onnx_define(c, img->name, ONNX_V_INPUT);
    if (!iv) return DSRT_ECORRUPT;
    iv->layer = 0;
    iv->nhwc = c->in_nhwc;
    c->in_nhwc = 0;
    /* Every node's outputs, undefined (kind 0) until it is mapped. */
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *nd = &m->nodes[i];
        c->cur = nd;
        for (int k = 0; k < nd->n_out; k++) {
            if (!nd->out[k].n) continue;
            onnx_val *v = dsrt__onnx_define(c, nd->out[k], 0);
            if (!v) return DSRT_ECORRUPT;
            v->producer = i;
        }
    }
    c->cur = NULL;
    return mark_live(c);
}

/* Maps every node in order (live ones become layers; constants are
 * followed everywhere), then appends the softmax a model of logits lacks. */
static int map_graph(onnx_import *c) {
    onnx_model *m = &c->m;
    c->cur = NULL;
    onnx_layer *in = dsrt__onnx_add_layer(c, "input", NULL, 0);
    if (!in) return c->err;
    snprintf(in->name, sizeof in->name, "%s", "input");
    in->out = (dsrt_shape){c->in_c, c->in_h, c->in_w};
    for (int i = 0; i < m->n_nodes; i++) {
        const onnx_node *n = &m->nodes[i];
        const dsrt_onnx_op *op = op_of(n);
        c->cur = n;
        int constant = onnx_is(n->op, "Constant");
        if (!c->live[i] && !constant) {
            /* Identity of a constant (initializers shared by name) may feed
             * live nodes through another name. */
            if (onnx_is(n->op, "Identity") && n->n_in == 1) {
                onnx_val *x = dsrt__onnx_find(c, n->in[0]);
                if (x && x->kind == ONNX_V_CONST) dsrt__onnx_alias(c, x, 0);
            }
            continue;
        }
        c->op_flags = op->flags;
        c->in_nhwc = c->out_nhwc = 0;
        int rc = dsrt__onnx_check_attrs(c, op->attrs);
        if (!rc) rc = dsrt__onnx_fold(c);
        if (rc == 1) continue; /* a constant now */
        if (!rc) rc = op->map(c);
        if (rc) return rc == -ENOMEM ? dsrt__fail(-ENOMEM, "onnx: %s: out of memory", c->file) : rc;
    }
    c->cur = NULL;
    onnx_val *out = dsrt__onnx_find(c, m->outputs[0].name);
    if (!out || out->kind != ONNX_V_LAYER)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: output '%s' is not computed from the "
                          "image",
                          c->file, ONNX_SHOWN(m->outputs[0].name));
    if (!(dsrt__layers[c->L[out->layer].kind]->flags & DSRT_LAYER_F_OUTPUT)) {
        dsrt_shape s = c->L[out->layer].out;
        if (!out->flat && (s.h != 1 || s.w != 1))
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "onnx: %s: output '%s' is (N, %d, %d, %d), not class scores (N, K)",
                              c->file, ONNX_SHOWN(out->name), s.c, s.h, s.w);
        /* The classification output's (first) keyword. */
        const char *kw = NULL;
        for (int k = 0; k < DSRT_LAYER_KIND_COUNT && !kw; k++)
            if (dsrt__layers[k]->flags & DSRT_LAYER_F_OUTPUT) kw = dsrt__layers[k]->types[0].name;
        onnx_layer *sm = dsrt__onnx_add_layer(c, kw, &out, 1);
        if (!sm) return c->err;
        int taken = dsrt__layer_names_find(&c->names, "output") != NULL;
        if (unique_name(c, sm, taken ? "dsrt_output" : "output")) return c->err;
        sm->out = (dsrt_shape){(int)dsrt__volume(s.c, s.h, s.w), 1, 1}; /* fits: s does */
    }
    return 0;
}

/* A layer that is the only taker of a layer whose kind takes on what it
 * computes (onnx_absorb: an add, a ReLU after it, as dsrt's residual
 * networks write relu=1; an export writes it back as Add and Relu) goes. */
static int fold_layers(onnx_import *c) {
    int *takers = dsrt__calloc((size_t)c->nL, sizeof *takers);
    int *at = dsrt__calloc((size_t)c->nL, sizeof *at);
    if (!takers || !at) {
        free(takers);
        free(at);
        return -ENOMEM;
    }
    for (int i = 0; i < c->nL; i++)
        for (int k = 0; k < c->L[i].n_in; k++) takers[c->L[i].in[k]]++;
    int n = 0;
    for (int i = 0; i < c->nL; i++) {
        onnx_layer l = c->L[i];
        for (int k = 0; k < l.n_in; k++) l.in[k] = at[l.in[k]];
        if (l.n_in == 1 && takers[c->L[i].in[0]] == 1) {
            onnx_layer *a = &c->L[l.in[0]];
            const dsrt_layer_ops *ops = dsrt__layers[a->kind];
            if (ops->onnx_absorb && ops->onnx_absorb(a, &l)) {
                at[i] = l.in[0];
                continue;
            }
        }
        at[i] = n;
        c->L[n++] = l;
    }
    c->nL = n;
    free(takers);
    free(at);
    return 0;
}

// ----------------------------------------------------------------------------
// The description, the net, the weights

typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} text;

static void put(text *t, const char *fmt, ...) DSRT_PRINTF(2, 3);
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0 || t->failed) return;
    if (dsrt__grow((void **)&t->s, &t->cap, t->len + (size_t)n + 1, 1)) {
        t->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        memcpy(t->s + t->len, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    t->len += (size_t)n;
}

/* The class names: the caller's, else the model's metadata "classes". */
static int class_names(onnx_import *c, const dsrt_onnx_import_options *o, int classes, text *d) {
    if (o->class_names) {
        if (o->n_class_names != classes)
            return dsrt__fail(DSRT_EOPTION, "onnx: %s: %d class names for a model of %d classes",
                              c->file, o->n_class_names, classes);
        for (int i = 0; i < classes; i++) {
            const char *nm = o->class_names[i];
            if (!nm || strpbrk(nm, "\r\n"))
                return dsrt__fail(DSRT_EOPTION,
                                  "onnx: %s: class name %d is missing or holds a "
                                  "line break",
                                  c->file, i);
            put(d, "%s%s\n", DSRT_CLASS_LINE, nm);
        }
        return 0;
    }
    const onnx_meta *mt = NULL;
    for (int i = 0; i < c->m.n_meta; i++)
        if (onnx_is(c->m.meta[i].key, "classes")) mt = &c->m.meta[i];
    if (!mt) return 0;
    onnx_str v = mt->value;
    size_t n = v.n;
    while (n && (v.p[n - 1] == '\n' || v.p[n - 1] == '\r')) n--;
    int count = n ? 1 : 0;
    for (size_t i = 0; i < n; i++) count += v.p[i] == '\n';
    if (count != classes || memchr(v.p, 0, n) || memchr(v.p, '\r', n))
        return dsrt__fail(DSRT_ECORRUPT,
                          "onnx: %s: metadata 'classes' holds %d lines for a model of %d classes",
                          c->file, count, classes);
    for (size_t at = 0; at < n;) {
        const uint8_t *e = memchr(v.p + at, '\n', n - at);
        size_t len = e ? (size_t)(e - (v.p + at)) : n - at;
        put(d, "%s%.*s\n", DSRT_CLASS_LINE, (int)len, (const char *)v.p + at);
        at += len + 1;
    }
    return 0;
}

/* The float whose reciprocal (as dsrt_input_affine divides) is a, or the
 * nearest; and the mean whose -mean * a is o. */
static float std_for(float a) {
    float s = (float)(1.0 / (double)a), best = s;
    for (int k = 0; k < 16; k++) {
        float t = s;
        for (int j = 0; j < k / 2; j++) t = nextafterf(t, k % 2 ? INFINITY : 0.0f);
        if (1.0f / t == a) return t;
    }
    return best;
}

static float mean_for(float a, float o) {
    float m = (float)(-(double)o / (double)a);
    for (int k = 0; k < 16; k++) {
        float t = m;
        for (int j = 0; j < k / 2; j++) t = nextafterf(t, k % 2 ? INFINITY : -INFINITY);
        if (-t * a == o) return t;
    }
    return m;
}

/* The input layer's line: the model's preprocessing (the caller's scale,
 * mean and std, then the normalisation in the graph) as dsrt's z-score of
 * the [0, 1] pixels it is given. */
static int input_line(onnx_import *c, const dsrt_onnx_import_options *o, text *d) {
    int ch = c->in_c;
    const int *counts[2] = {&o->n_mean, &o->n_std};
    for (int k = 0; k < 2; k++)
        if (*counts[k] != 0 && *counts[k] != 1 && *counts[k] != ch)
            return dsrt__fail(DSRT_EOPTION, "onnx: %s: %d %s values for an input of %d channels",
                              c->file, *counts[k], k ? "std" : "mean", ch);
    for (int i = 0; i < o->n_std; i++)
        if (!(o->std[i] > 0) || !isfinite(o->std[i]))
            return dsrt__fail(DSRT_EOPTION, "onnx: std %g: must be positive", (double)o->std[i]);
    for (int i = 0; i < o->n_mean; i++)
        if (!isfinite(o->mean[i]))
            return dsrt__fail(DSRT_EOPTION, "onnx: mean %g: must be finite", (double)o->mean[i]);
    if (!isfinite(c->scale))
        return dsrt__fail(DSRT_EOPTION, "onnx: input scale %g: must be positive", c->scale);
    /* y = A x' + B for the x' = pixel / 255 that dsrt gives its input
     * layer: the model's input is m = 255 x' scale, then (m - mean) / std,
     * then na () + nb. */
    float fa[DSRT_ONNX_CHANNELS_MAX], fo[DSRT_ONNX_CHANNELS_MAX];
    int same = 1, identity = 1;
    for (int i = 0; i < ch; i++) {
        double mean = o->n_mean ? o->mean[o->n_mean > 1 ? i : 0] : 0.0;
        double sd = o->n_std ? o->std[o->n_std > 1 ? i : 0] : 1.0;
        double a = c->pixel_div ? c->na[i] : c->na[i] * 255.0 * c->scale / sd;
        double b = c->pixel_div ? c->nb[i] : c->nb[i] - c->na[i] * mean / sd;
        if (!(a > 0) || !isfinite(a) || !isfinite(b) || a > 1e30 || a < 1e-30)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "onnx: %s: the input normalisation scales channel %d by %g: dsrt's "
                              "takes a positive factor",
                              c->file, i, a);
        identity &= (float)a == 1.0f && (float)b == 0.0f;
        if (i >= DSRT_ONNX_CHANNELS_MAX) {
            same &= (float)a == fa[0] && (float)b == fo[0];
            continue;
        }
        fa[i] = (float)a;
        fo[i] = (float)b;
        same &= fa[i] == fa[0] && fo[i] == fo[0];
    }
    if (!same && ch > DSRT_ONNX_CHANNELS_MAX)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "onnx: %s: per-channel normalisation of %d channels, "
                          "at most %d",
                          c->file, ch, DSRT_ONNX_CHANNELS_MAX);
    put(d, "input name=input size=%dx%dx%d", c->in_h, c->in_w, ch);
    if (identity) {
        put(d, "\n");
        return 0;
    }
    int per = same ? 1 : ch;
    put(d, " normalization=zscore mean=");
    for (int i = 0; i < per; i++) put(d, "%s%.9g", i ? "," : "", (double)mean_for(fa[i], fo[i]));
    put(d, " std=");
    for (int i = 0; i < per; i++) put(d, "%s%.9g", i ? "," : "", (double)std_for(fa[i]));
    put(d, "\n");
    return 0;
}

static int make_description(onnx_import *c, const dsrt_onnx_import_options *o, text *d,
                            int **line_of) {
    char b1[100], b2[100];
    const char *base = strrchr(c->file, '/');
    put(d, "# imported from the ONNX model ");
    for (const char *p = base ? base + 1 : c->file; *p; p++)
        put(d, "%c", *p == '\n' || *p == '\r' || *p == '#' ? '_' : *p);
    put(d, " (%s %s, opset %lld)\n",
        c->m.producer.n ? dsrt__onnx_shown(c->m.producer, b1, sizeof b1) : "-",
        dsrt__onnx_shown(c->m.producer_version, b2, sizeof b2), (long long)c->m.opset);
    int *lines = dsrt__calloc((size_t)c->nL + 1, sizeof *lines);
    if (!lines) return -ENOMEM;
    *line_of = lines;
    int line = 2;
    int rc = input_line(c, o, d);
    if (rc) return rc;
    for (int i = 1; i < c->nL; i++) {
        const onnx_layer *l = &c->L[i];
        lines[i] = ++line;
        put(d, "%s name=%s", l->type, l->name);
        if (l->n_in != 1 || l->in[0] != i - 1) {
            put(d, " inputs=");
            for (int k = 0; k < l->n_in; k++) put(d, "%s%s", k ? "," : "", c->L[l->in[k]].name);
        }
        put(d, "%s\n", l->opts);
    }
    const onnx_layer *last = &c->L[c->nL - 1];
    if ((rc = class_names(c, o, last->out.c, d))) return rc;
    return d->failed ? -ENOMEM : 0;
}

/* A build error on line N of the description, told as the node's. */
static int build_failed(onnx_import *c, int rc, const int *line_of) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dsrt_last_error());
    const char *at = strstr(msg, ": line ");
    int line = at ? atoi(at + 7) : 0;
    const char *rest = at ? strchr(at + 7, ':') : NULL;
    for (int i = 1; rest && i < c->nL; i++)
        if (line_of[i] == line && c->L[i].node >= 0) {
            c->cur = &c->m.nodes[c->L[i].node];
            return dsrt__onnx_fail(c, rc == DSRT_EOPTION ? DSRT_EUNSUPPORTED : rc,
                                   "as dsrt's %s layer:%s", c->L[i].type, rest + 1);
        }
    return dsrt__fail(rc, "%s", msg);
}

/* t's values into dst, as one of the copies of it the import makes. */
static int copy_tensor(onnx_import *c, onnx_tensor *t, float *dst) {
    int rc = dsrt__onnx_tensor_floats(c, t, dst);
    if (!rc) dsrt__onnx_copied(c, t);
    return rc;
}

/* The weights of layer i from its tensors. */
static int copy_layer(onnx_import *c, dsrt_net *net, int i) {
    const onnx_layer *l = &c->L[i];
    const dsrt_layer *dl = &net->layers[i];
    c->cur = l->node >= 0 ? &c->m.nodes[l->node] : NULL;
    int rc = 0;
    if (l->w) {
        if (l->w->count != dl->w_n)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "weight '%s': %llu values, the layer has %zu",
                                   ONNX_SHOWN(l->w->name), (unsigned long long)l->w->count,
                                   dl->w_n);
        float *dst = net->params + dl->w_off;
        if (l->w_rows) {
            /* (rows = inputs, cols = outputs) to dsrt's (outputs, inputs). */
            float *tmp = dsrt__malloc(dl->w_n * sizeof *tmp);
            if (!tmp) return -ENOMEM;
            /* In tiles, so that neither side is walked a row of floats
             * apart (a large Linear's, whole cache lines a value). */
            enum { T = 32 };
            int64_t rows = l->w_rows, cols = l->w_cols;
            if (!(rc = copy_tensor(c, l->w, tmp)))
                for (int64_t r0 = 0; r0 < rows; r0 += T)
                    for (int64_t q0 = 0; q0 < cols; q0 += T) {
                        int64_t r1 = r0 + T < rows ? r0 + T : rows;
                        int64_t q1 = q0 + T < cols ? q0 + T : cols;
                        for (int64_t q = q0; q < q1; q++)
                            for (int64_t r = r0; r < r1; r++) dst[q * rows + r] = tmp[r * cols + q];
                    }
            free(tmp);
        } else {
            rc = copy_tensor(c, l->w, dst);
        }
        if (rc) return rc;
        if (l->w_scale != 1.0f)
            for (size_t k = 0; k < dl->w_n; k++) dst[k] *= l->w_scale;
    }
    if (l->b) {
        float *dst = net->params + dl->b_off;
        if (l->b->count == 1 && dl->b_n > 1) {
            if ((rc = copy_tensor(c, l->b, dst))) return rc;
            for (size_t k = 1; k < dl->b_n; k++) dst[k] = dst[0];
        } else {
            if (l->b->count != dl->b_n)
                return dsrt__onnx_fail(
                    c, DSRT_ECORRUPT, "bias '%s': %llu values, the layer has %zu",
                    ONNX_SHOWN(l->b->name), (unsigned long long)l->b->count, dl->b_n);
            if ((rc = copy_tensor(c, l->b, dst))) return rc;
        }
        if (l->b_scale != 1.0f)
            for (size_t k = 0; k < dl->b_n; k++) dst[k] *= l->b_scale;
    }
    size_t share = l->n_s ? dl->s_n / (size_t)l->n_s : 0;
    for (int k = 0; k < l->n_s; k++) {
        float *to = net->state + dl->s_off + (size_t)k * share;
        if (l->s[k]->count != share)
            return dsrt__onnx_fail(
                c, DSRT_ECORRUPT, "tensor '%s': %llu values, the layer takes %zu",
                ONNX_SHOWN(l->s[k]->name), (unsigned long long)l->s[k]->count, share);
        if ((rc = copy_tensor(c, l->s[k], to))) return rc;
        for (size_t q = 0; (l->s_nonneg >> k & 1) && q < share; q++)
            if (!(to[q] >= 0) || !isfinite(to[q]))
                return dsrt__onnx_fail(c, DSRT_ECORRUPT, "tensor '%s' holds %g",
                                       ONNX_SHOWN(l->s[k]->name), (double)to[q]);
    }
    return 0;
}

/* Checks every weight tensor's type and storage before the net is made,
 * and counts the copies of each that will be made. */
static int check_weights(onnx_import *c) {
    for (int i = 1; i < c->nL; i++) {
        const onnx_layer *l = &c->L[i];
        onnx_tensor *ts[6] = {l->w, l->b, l->s[0], l->s[1], l->s[2], l->s[3]};
        c->cur = l->node >= 0 ? &c->m.nodes[l->node] : NULL;
        for (int k = 0; k < 6; k++) {
            onnx_tensor *t = ts[k];
            if (t) t->reads++;
            if (!t || t->made_f) continue;
            int d = t->dtype;
            if (d != ONNX_FLOAT && d != ONNX_FLOAT16 && d != ONNX_BFLOAT16 && d != ONNX_DOUBLE)
                return dsrt__onnx_fail(
                    c, DSRT_EUNSUPPORTED,
                    "tensor '%s' holds %s values (dsrt reads float32, float16 and "
                    "bfloat16 weights)",
                    ONNX_SHOWN(t->name), dsrt__onnx_dtype_name(d));
            onnx_ext_file *x;
            int rc = t->external ? dsrt__onnx_external_span(c, t, &x) : 0;
            if (rc) return rc;
        }
    }
    c->cur = NULL;
    return 0;
}

static void imp_free(onnx_import *c) {
    for (int i = 0; i < c->n_ext; i++) {
        free(c->ext[i].location);
        free(c->ext[i].path);
    }
    free(c->ext);
    free(c->real_dir);
    dsrt__layer_names_free(&c->names);
    free(c->v);
    free(c->slot);
    free(c->live);
    free(c->absorbed);
    free(c->na);
    free(c->nb);
    free(c->L);
    dsrt__onnx_model_free(&c->m);
    if (c->own_map && c->map) munmap((void *)c->map, c->map_size);
}

int dsrt__onnx_import_memory(dsrt_net **out, const uint8_t *data, size_t size, const char *file,
                             const char *dir, int own_map, const dsrt_onnx_import_options *o,
                             const dsrt_net_options *options) {
    onnx_import c;
    memset(&c, 0, sizeof c);
    c.file = file;
    c.dir = dir;
    c.map = data;
    c.map_size = size;
    c.own_map = own_map;
    text d = {0};
    int *line_of = NULL;
    dsrt_net *net = NULL;
    dsrt_onnx_import_options defaults = dsrt_onnx_import_defaults();
    if (!o) o = &defaults;
    *out = NULL;
    int rc = dsrt__onnx_parse(&c.m, data, size, file);
    if (!rc) rc = dsrt__onnx_rewrite(&c);
    if (!rc) rc = check_operators(&c);
    if (!rc) rc = make_values(&c, o);
    if (!rc) rc = map_graph(&c);
    if (!rc) rc = fold_layers(&c);
    if (!rc) rc = check_weights(&c);
    if (!rc) rc = make_description(&c, o, &d, &line_of);
    if (rc == -ENOMEM) dsrt__fail(-ENOMEM, "onnx: %s: out of memory", file);
    if (rc) goto fail;
    char source[300];
    snprintf(source, sizeof source, "onnx: %s: the description made of it", file);
    dsrt_desc desc;
    if ((rc = dsrt__desc_parse(&desc, d.s, source)) ||
        (rc = dsrt__net_build(&net, &desc, d.s, source, 0, 0, 0, 0, options, 0, NULL))) {
        rc = build_failed(&c, rc, line_of);
        goto fail;
    }
    if (net->n_layers != c.nL) {
        rc = dsrt__fail(DSRT_ECORRUPT, "onnx: %s: the net has %d layers, the mapping %d", file,
                        net->n_layers, c.nL);
        goto fail;
    }
    dsrt__layer_ops(&net->layers[0])->init(&net->layers[0], net->params, net->state, NULL, 0);
    for (int i = 1; i < c.nL; i++)
        if ((rc = copy_layer(&c, net, i))) goto fail;
    net->version++;
    /* Nothing said how the model's input is made from pixels: neither the
     * caller, nor dsrt's metadata, nor a normalisation in the graph. */
    net->input_assumed = !c.scale_said && !c.user_stats && c.stage == 0;
    *out = net;
    net = NULL;
fail:
    dsrt_net_destroy(net);
    free(d.s);
    free(line_of);
    imp_free(&c);
    return rc;
}

/*
 * The model file is read, not mapped: a mapped file that shrinks while it
 * is read kills the process with SIGBUS, a read only comes up short. Its
 * bytes go into an anonymous mapping whose pages are given back as the
 * tensors in them are copied, so the import still holds the weights about
 * once.
 */
int dsrt_onnx_import(dsrt_net **net, const char *path, const dsrt_onnx_import_options *o,
                     const dsrt_net_options *options) {
    if (!net || !path) return dsrt__fail(-EINVAL, "onnx: no path");
    *net = NULL;
    int fd;
    struct stat st;
    int rc = dsrt__open_regular(path, &fd, &st);
    if (rc) return dsrt__fail_prefix(rc, "onnx");
    size_t size = (size_t)st.st_size, got = 0;
    uint8_t *p = NULL;
    char *dir = NULL;
    if (size == 0) {
        rc = dsrt__fail(DSRT_ETRUNCATED, "onnx: %s: empty file", path);
        goto fail;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        rc = dsrt__fail(-ENOMEM, "onnx: %s: out of memory for its %zu bytes", path, size);
        goto fail;
    }
    p = m;
    while (got < size) {
        ssize_t r = pread(fd, p + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = dsrt__fail(-errno, "onnx: %s: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0) {
            rc = dsrt__fail(DSRT_ETRUNCATED,
                            "onnx: %s: the file ends after %zu of its %zu bytes (it changed "
                            "while it was read)",
                            path, got, size);
            goto fail;
        }
        got += (size_t)r;
    }
    close(fd);
    fd = -1;
    mprotect(p, size, PROT_READ);
    if (!(dir = dsrt__strdup(path))) {
        rc = -ENOMEM;
        goto fail;
    }
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        strcpy(dir, ".");
    rc = dsrt__onnx_import_memory(net, p, size, path, dir, 1, o, options);
    free(dir);
    return rc;
fail:
    if (fd >= 0) close(fd);
    if (p) munmap(p, size);
    return rc;
}
