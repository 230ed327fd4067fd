/*
 * ONNX import: the values of the graph being mapped (by name, through a hash
 * of the names), the attributes and inputs of the node being mapped, and the
 * failure that names it. Below the mapping (onnx_import.c), the folds and
 * rewrites (onnx_fold.c, onnx_rewrite.c) and the layer kinds' own maps,
 * which all read a node through these.
 */
#include "nn/onnx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Messages

/* Fails naming the node being mapped: "onnx: FILE: node 'NAME' (OP, opset
 * N): ...". */
int dsrt__onnx_fail(onnx_import *c, int code, const char *fmt, ...) {
    char msg[1024], b1[100], b2[100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err = code;
    const onnx_node *n = c->cur;
    if (!n) return dsrt__fail(code, "onnx: %s: %s", c->file, msg);
    if (!n->name.n && n->n_out && n->out[0].n) /* an unnamed node: by its output */
        return dsrt__fail(code, "onnx: %s: node %d (output '%s') (%s, opset %lld): %s", c->file,
                          n->number, dsrt__onnx_shown(n->out[0], b1, sizeof b1),
                          dsrt__onnx_shown(n->op, b2, sizeof b2), (long long)c->m.opset, msg);
    return dsrt__fail(code, "onnx: %s: node %d '%s' (%s, opset %lld): %s", c->file, n->number,
                      dsrt__onnx_shown(n->name, b1, sizeof b1),
                      dsrt__onnx_shown(n->op, b2, sizeof b2), (long long)c->m.opset, msg);
}

// ----------------------------------------------------------------------------
// Values

static uint32_t hash_of(onnx_str s) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++) h = (h ^ s.p[i]) * 16777619u;
    return h;
}

onnx_val *dsrt__onnx_find(onnx_import *c, onnx_str name) {
    if (!c->slots) return NULL;
    for (size_t h = hash_of(name) & (c->slots - 1);; h = (h + 1) & (c->slots - 1)) {
        uint32_t k = c->slot[h];
        if (!k) return NULL;
        if (onnx_same(c->v[k - 1].name, name)) return &c->v[k - 1];
    }
}

/* A new value named name (refused when the name is taken). */
onnx_val *dsrt__onnx_define(onnx_import *c, onnx_str name, int kind) {
    if (dsrt__onnx_find(c, name)) {
        dsrt__onnx_fail(c, DSRT_ECORRUPT, "value '%s' is defined twice", ONNX_SHOWN(name));
        return NULL;
    }
    if (c->nv == c->vcap) {
        dsrt__fail(DSRT_ECORRUPT, "onnx: %s: more values than the graph declares", c->file);
        return NULL;
    }
    onnx_val *v = &c->v[c->nv++];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->kind = kind;
    v->producer = -1;
    size_t h = hash_of(name) & (c->slots - 1);
    while (c->slot[h]) h = (h + 1) & (c->slots - 1);
    c->slot[h] = (uint32_t)c->nv;
    return v;
}

/* Input k of the node being mapped, which must be defined above it. */
onnx_val *dsrt__onnx_input(onnx_import *c, int k) {
    const onnx_node *n = c->cur;
    if (k >= n->n_in || n->in[k].n == 0) return NULL;
    onnx_val *v = dsrt__onnx_find(c, n->in[k]);
    if (!v || !v->kind) {
        dsrt__onnx_fail(
            c, DSRT_ECORRUPT,
            "input '%s' is not made by any node above it (the graph must be in topological "
            "order)",
            ONNX_SHOWN(n->in[k]));
        return NULL;
    }
    return v;
}

/* Output k of the node being mapped. */
onnx_val *dsrt__onnx_output(onnx_import *c, int k) {
    const onnx_node *n = c->cur;
    if (k >= n->n_out || !n->out[k].n) return NULL;
    return dsrt__onnx_find(c, n->out[k]);
}

/* Whether output k of the node is used on the way to the graph's output. */
int dsrt__onnx_output_used(onnx_import *c, int k) {
    onnx_val *v = dsrt__onnx_output(c, k);
    return v && v->uses > 0;
}

/* The dsrt shape of a value made by a layer (or the input). */
dsrt_shape dsrt__onnx_shape_of(onnx_import *c, const onnx_val *v) {
    if (v->kind == ONNX_V_INPUT) return (dsrt_shape){c->in_c, c->in_h, c->in_w};
    return c->L[v->layer].out;
}

/* The node's output 0 becomes what src is (Identity, Flatten, Dropout 0). */
void dsrt__onnx_alias(onnx_import *c, const onnx_val *src, int flat) {
    onnx_val *o = dsrt__onnx_output(c, 0);
    if (!o) return;
    o->kind = src->kind;
    o->layer = src->layer;
    o->t = src->t;
    o->stage = src->stage;
    o->flat = flat;
    o->nhwc = src->nhwc && !flat;
}

// ----------------------------------------------------------------------------
// Attributes

const onnx_attr *dsrt__onnx_get_attr(onnx_import *c, const char *name) {
    const onnx_node *n = c->cur;
    for (int i = 0; i < n->n_attr; i++)
        if (onnx_is(n->attr[i].name, name)) return &n->attr[i];
    return NULL;
}

int dsrt__onnx_get_int(onnx_import *c, const char *name, int64_t def, int64_t *out) {
    const onnx_attr *a = dsrt__onnx_get_attr(c, name);
    *out = def;
    if (!a) return 0;
    if (!a->has_i)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute '%s' is not an integer", name);
    *out = a->i;
    return 0;
}

int dsrt__onnx_get_float(onnx_import *c, const char *name, float def, float *out) {
    const onnx_attr *a = dsrt__onnx_get_attr(c, name);
    *out = def;
    if (!a) return 0;
    if (!a->has_f) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute '%s' is not a float", name);
    if (!isfinite(a->f))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute '%s' is %g", name, (double)a->f);
    *out = a->f;
    return 0;
}

/* An ints attribute of exactly n values (absent: def, n values, may be
 * NULL to leave out unset). Returns 1 when given, 0 when not, < 0. */
int dsrt__onnx_get_ints(onnx_import *c, const char *name, int n, int64_t *out) {
    const onnx_attr *a = dsrt__onnx_get_attr(c, name);
    if (!a) return 0;
    if ((int64_t)a->n_ints != n)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "attribute '%s' has %zu values, not %d (2-D images only)", name,
                               a->n_ints, n);
    for (int i = 0; i < n; i++) out[i] = a->ints[i];
    return 1;
}

int dsrt__onnx_get_string(onnx_import *c, const char *name, const char *def, char *out,
                          size_t cap) {
    const onnx_attr *a = dsrt__onnx_get_attr(c, name);
    snprintf(out, cap, "%s", def);
    if (!a) return 0;
    if (!a->has_s || a->s.n >= cap || memchr(a->s.p, 0, a->s.n))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "attribute '%s' is not a short string", name);
    memcpy(out, a->s.p, a->s.n);
    out[a->s.n] = '\0';
    return 0;
}

/* Every attribute of the node must be in known (comma-separated). */
int dsrt__onnx_check_attrs(onnx_import *c, const char *known) {
    const onnx_node *n = c->cur;
    for (int i = 0; i < n->n_attr; i++) {
        onnx_str nm = n->attr[i].name;
        const char *k = known;
        int ok = 0;
        while (*k && !ok) {
            const char *e = strchr(k, ',');
            size_t len = e ? (size_t)(e - k) : strlen(k);
            ok = nm.n == len && memcmp(nm.p, k, len) == 0;
            k += len + (e != NULL);
        }
        if (!ok)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "attribute '%s' is not supported (dsrt reads %s)",
                                   ONNX_SHOWN(nm), *known ? known : "none");
    }
    return 0;
}
