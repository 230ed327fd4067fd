/*
 * Rewrites of an ONNX graph before it is mapped: the expansions exporters
 * write for operators that older opsets lack, put back as the one operator
 * a dsrt layer computes. PyTorch (and dsrt's export) write GELU before
 * opset 20 as x * 0.5 * (1 + erf(x / sqrt 2)), LayerNorm before opset 17 as
 * its arithmetic (ReduceMean, Sub, Pow or Mul, ReduceMean, Add, Sqrt, Div,
 * then the scale and shift), HardSwish before opset 14 as x *
 * HardSigmoid(x) with alpha 1/6 and beta 1/2, and SiLU, which ONNX lacks,
 * as x * Sigmoid(x): each such subgraph, matched exactly (its constants,
 * its axes, and no value inside it used elsewhere), becomes a Gelu,
 * LayerNormalization, HardSwish or Silu node (the last, dsrt's own name,
 * flagged as made here so that no node of a file can claim it) with the
 * last node's output, and its other nodes go. A subgraph that does not
 * match stays as it is: its operators map one by one, or the importer
 * names the first one dsrt does not compute.
 */
#include "nn/onnx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    onnx_import *c;
    int n;
    int *dead; /* (n) nodes a rewrite took */
    int *uses; /* (n) for each node, how many inputs (and graph outputs) take its output 0 */
    int *prod; /* hash of output names: node index + 1, 0 free */
    size_t slots;
} graph;

static uint32_t hash_str(onnx_str s) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++) h = (h ^ s.p[i]) * 16777619u;
    return h;
}

/* The node whose output 0 is name, or -1. */
static int producer(const graph *g, onnx_str name) {
    if (!name.n) return -1;
    const onnx_model *m = &g->c->m;
    for (size_t h = hash_str(name) & (g->slots - 1);; h = (h + 1) & (g->slots - 1)) {
        int k = g->prod[h];
        if (!k) return -1;
        if (m->nodes[k - 1].n_out && onnx_same(m->nodes[k - 1].out[0], name)) return k - 1;
    }
}

static int build(graph *g) {
    onnx_model *m = &g->c->m;
    g->n = m->n_nodes;
    g->slots = 16;
    while (g->slots < 2 * (size_t)g->n + 2) g->slots *= 2;
    g->dead = dsrt__calloc((size_t)g->n + 1, sizeof *g->dead);
    g->uses = dsrt__calloc((size_t)g->n + 1, sizeof *g->uses);
    g->prod = dsrt__calloc(g->slots, sizeof *g->prod);
    if (!g->dead || !g->uses || !g->prod) return -ENOMEM;
    for (int i = 0; i < g->n; i++) {
        const onnx_node *nd = &m->nodes[i];
        if (!nd->n_out || !nd->out[0].n || producer(g, nd->out[0]) >= 0) continue;
        size_t h = hash_str(nd->out[0]) & (g->slots - 1);
        while (g->prod[h]) h = (h + 1) & (g->slots - 1);
        g->prod[h] = i + 1;
    }
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < m->nodes[i].n_in; k++) {
            int p = producer(g, m->nodes[i].in[k]);
            if (p >= 0) g->uses[p]++;
        }
    for (int o = 0; o < m->n_outputs; o++) {
        int p = producer(g, m->outputs[o].name);
        if (p >= 0) g->uses[p]++;
    }
    return 0;
}

static void graph_free(graph *g) {
    free(g->dead);
    free(g->uses);
    free(g->prod);
}

/* The one node that takes node i's output 0 (it has exactly one taker), or
 * -1. */
static int only_taker(const graph *g, int i) {
    if (g->uses[i] != 1) return -1;
    const onnx_model *m = &g->c->m;
    for (int j = i + 1; j < g->n; j++)
        for (int k = 0; k < m->nodes[j].n_in; k++)
            if (onnx_same(m->nodes[j].in[k], m->nodes[i].out[0])) return g->dead[j] ? -1 : j;
    return -1;
}

static int is_op(const graph *g, int i, const char *op) {
    const onnx_node *nd = &g->c->m.nodes[i];
    return i >= 0 && !g->dead[i] && (!nd->domain.n || onnx_is(nd->domain, "ai.onnx")) &&
           onnx_is(nd->op, op) && nd->n_out >= 1;
}

/* The single value of the constant called name (an initializer, or a
 * Constant node's value, of rank 0 or 1), as a double; 0 when it is not
 * one. */
static int const_value(const graph *g, onnx_str name, double *v) {
    onnx_import *c = g->c;
    const onnx_model *m = &c->m;
    const onnx_tensor *t = NULL;
    for (int k = 0; k < m->n_inits && !t; k++)
        if (onnx_same(m->inits[k].name, name)) t = &m->inits[k];
    if (!t) {
        int p = producer(g, name);
        if (p < 0 || !is_op(g, p, "Constant")) return 0;
        const onnx_node *nd = &m->nodes[p];
        for (int a = 0; a < nd->n_attr; a++) {
            const onnx_attr *at = &nd->attr[a];
            if (onnx_is(at->name, "value") && at->t) t = at->t;
            if (onnx_is(at->name, "value_float") && at->has_f) {
                *v = at->f;
                return 1;
            }
        }
    }
    /* One value of rank 0 or 1: a constant of more dimensions would raise
     * the rank of what it meets (and move the axes of a softmax after). */
    if (!t || t->count != 1 || t->ndims > 1 || t->external) return 0;
    if (t->dtype != ONNX_FLOAT && t->dtype != ONNX_DOUBLE && t->dtype != ONNX_FLOAT16 &&
        t->dtype != ONNX_BFLOAT16)
        return 0;
    float f;
    if (dsrt__onnx_tensor_floats(c, t, &f)) {
        c->err = 0;
        dsrt__clear_error();
        return 0;
    }
    *v = f;
    return 1;
}

/* Whether name is a constant tensor: an initializer or a Constant's, or
 * an Identity of one (exporters share equal initializers that way). */
static int is_const(const graph *g, onnx_str name) {
    const onnx_model *m = &g->c->m;
    for (int hops = 0; hops < 8; hops++) {
        for (int k = 0; k < m->n_inits; k++)
            if (onnx_same(m->inits[k].name, name)) return 1;
        int p = producer(g, name);
        if (p < 0) return 0;
        if (is_op(g, p, "Constant")) return 1;
        if (!is_op(g, p, "Identity") || m->nodes[p].n_in != 1) return 0;
        name = m->nodes[p].in[0];
    }
    return 0;
}

/* For a binary node i taking x and a constant: the constant's value, and
 * whether the other input is x (any order when commutative). */
static int with_const(const graph *g, int i, onnx_str x, int commutative, double *v) {
    const onnx_node *nd = &g->c->m.nodes[i];
    if (nd->n_in != 2) return 0;
    for (int k = 0; k < (commutative ? 2 : 1); k++)
        if (onnx_same(nd->in[k], x) && const_value(g, nd->in[1 - k], v)) return 1;
    return 0;
}

/* The input of binary node i that is not x (x one of them), or an empty
 * name. */
static onnx_str other_input(const onnx_node *nd, onnx_str x) {
    onnx_str none = {NULL, 0};
    if (nd->n_in != 2) return none;
    if (onnx_same(nd->in[0], x)) return nd->in[1];
    if (onnx_same(nd->in[1], x)) return nd->in[0];
    return none;
}

/* ReduceMean over the last axis of a 4-D value, keeping it. */
static int mean_over_last(const graph *g, int i) {
    const onnx_node *nd = &g->c->m.nodes[i];
    int axes_ok = 0, keep = 1;
    for (int a = 0; a < nd->n_attr; a++) {
        const onnx_attr *at = &nd->attr[a];
        if (onnx_is(at->name, "axes"))
            axes_ok = at->n_ints == 1 && (at->ints[0] == -1 || at->ints[0] == 3);
        else if (onnx_is(at->name, "keepdims"))
            keep = at->has_i && at->i != 0;
        else
            return 0;
    }
    return axes_ok && keep && nd->n_in == 1;
}

/* Turns node i into op over ins (n_in) with attrs, node i keeping its
 * output; the nodes in took (n) go. */
static int become(graph *g, int i, const char *op, const onnx_str *ins, int n_in,
                  const onnx_attr *attrs, int n_attr, const int *took, int n) {
    onnx_model *m = &g->c->m;
    onnx_node *nd = &m->nodes[i];
    onnx_str *in = dsrt__arena_alloc(&m->arena, (size_t)n_in * sizeof *in, 8);
    onnx_attr *at = n_attr ? dsrt__arena_alloc(&m->arena, (size_t)n_attr * sizeof *at, 8) : NULL;
    if (!in || (n_attr && !at)) return -ENOMEM;
    memcpy(in, ins, (size_t)n_in * sizeof *in);
    if (n_attr) memcpy(at, attrs, (size_t)n_attr * sizeof *at);
    nd->op = (onnx_str){(const uint8_t *)op, strlen(op)};
    nd->domain = (onnx_str){NULL, 0};
    nd->in = in;
    nd->n_in = n_in;
    nd->attr = at;
    nd->n_attr = n_attr;
    nd->made = 1;
    for (int k = 0; k < n; k++) g->dead[took[k]] = 1;
    return 0;
}

static onnx_str lit(const char *s) {
    return (onnx_str){(const uint8_t *)s, strlen(s)};
}

// ----------------------------------------------------------------------------
// The patterns

/* GELU from Erf node e: x / sqrt 2 -> Erf -> + 1 -> * x -> * 0.5, or
 * (x * 0.5) * (1 + erf). */
static int gelu_at(graph *g, int e) {
    const onnx_model *m = &g->c->m;
    const onnx_node *E = &m->nodes[e];
    double v;
    if (E->n_in != 1) return 0;
    int d = producer(g, E->in[0]);
    if (d < 0 || !is_op(g, d, "Div") || g->uses[d] != 1 || m->nodes[d].n_in != 2 ||
        !const_value(g, m->nodes[d].in[1], &v) || fabs(v - M_SQRT2) > 1e-6)
        return 0;
    onnx_str x = m->nodes[d].in[0];
    int f = only_taker(g, e);
    if (f < 0 || !is_op(g, f, "Add") || !with_const(g, f, E->out[0], 1, &v) || v != 1.0) return 0;
    int a = only_taker(g, f);
    if (a < 0 || !is_op(g, a, "Mul")) return 0;
    onnx_str other = other_input(&m->nodes[a], m->nodes[f].out[0]);
    int last, took[5] = {d, e, f, a, -1}, n = 4;
    if (onnx_same(other, x)) {
        /* (x * (1 + erf)) * 0.5 */
        last = only_taker(g, a);
        if (last < 0 || !is_op(g, last, "Mul") || !with_const(g, last, m->nodes[a].out[0], 1, &v) ||
            v != 0.5)
            return 0;
    } else {
        /* (x * 0.5) * (1 + erf) */
        int h = producer(g, other);
        if (h < 0 || !is_op(g, h, "Mul") || g->uses[h] != 1 || !with_const(g, h, x, 1, &v) ||
            v != 0.5)
            return 0;
        last = a;
        took[3] = h;
    }
    onnx_str in[1] = {x};
    int rc = become(g, last, "Gelu", in, 1, NULL, 0, took, n);
    return rc ? rc : 1;
}

/* LayerNorm over the last axis from ReduceMean node r: mean, x - mean,
 * (x - mean)^2, its mean + eps, sqrt, (x - mean) / that, * scale + shift. */
static int layernorm_at(graph *g, int r) {
    const onnx_model *m = &g->c->m;
    double v, eps;
    if (!mean_over_last(g, r)) return 0;
    onnx_str x = m->nodes[r].in[0];
    int s = only_taker(g, r);
    if (s < 0 || !is_op(g, s, "Sub") || m->nodes[s].n_in != 2 || !onnx_same(m->nodes[s].in[0], x))
        return 0;
    onnx_str diff = m->nodes[s].out[0];
    /* diff's two takers: Pow(diff, 2) and Div(diff, sqrt) */
    int p = -1, q = -1, square = 0;
    for (int j = s + 1; j < g->n; j++)
        for (int k = 0; k < m->nodes[j].n_in; k++)
            if (onnx_same(m->nodes[j].in[k], diff)) {
                if (is_op(g, j, "Pow") && k == 0)
                    p = j;
                else if (is_op(g, j, "Mul") && k == 0 && m->nodes[j].n_in == 2 &&
                         onnx_same(m->nodes[j].in[1], diff))
                    p = j, square = 1;
                else if (is_op(g, j, "Div") && k == 0)
                    q = j;
            }
    if (p < 0 || q < 0 || g->uses[s] != 2 + square) return 0;
    if (!square && (!with_const(g, p, diff, 0, &v) || v != 2.0)) return 0;
    int r2 = only_taker(g, p);
    if (r2 < 0 || !is_op(g, r2, "ReduceMean") || !mean_over_last(g, r2)) return 0;
    int a = only_taker(g, r2);
    if (a < 0 || !is_op(g, a, "Add") || !with_const(g, a, m->nodes[r2].out[0], 1, &eps) ||
        !(eps > 0))
        return 0;
    int sq = only_taker(g, a);
    if (sq < 0 || !is_op(g, sq, "Sqrt") || only_taker(g, sq) != q ||
        !onnx_same(m->nodes[q].in[1], m->nodes[sq].out[0]))
        return 0;
    int mul = only_taker(g, q);
    if (mul < 0 || !is_op(g, mul, "Mul")) return 0;
    onnx_str scale = other_input(&m->nodes[mul], m->nodes[q].out[0]);
    if (!scale.n || !is_const(g, scale)) return 0;
    int add = only_taker(g, mul);
    if (add < 0 || !is_op(g, add, "Add")) return 0;
    onnx_str shift = other_input(&m->nodes[add], m->nodes[mul].out[0]);
    if (!shift.n || !is_const(g, shift)) return 0;
    onnx_attr at[2];
    memset(at, 0, sizeof at);
    at[0].name = lit("epsilon");
    at[0].type = ONNX_ATTR_FLOAT;
    at[0].f = (float)eps;
    at[0].has_f = 1;
    at[1].name = lit("axis");
    at[1].type = ONNX_ATTR_INT;
    at[1].i = -1;
    at[1].has_i = 1;
    onnx_str in[3] = {x, scale, shift};
    int took[8] = {r, s, p, r2, a, sq, q, mul};
    int rc = become(g, add, "LayerNormalization", in, 3, at, 2, took, 8);
    return rc ? rc : 1;
}

/* x * act(x) from the activation node a (Sigmoid, or HardSigmoid with
 * PyTorch's 1/6 and 1/2) whose only taker is the product: Silu or
 * HardSwish. */
static int gated_at(graph *g, int a, const char *op) {
    const onnx_model *m = &g->c->m;
    const onnx_node *A = &m->nodes[a];
    if (A->n_in != 1 || !A->in[0].n) return 0;
    if (!strcmp(op, "HardSwish")) {
        double alpha = 0.2, beta = 0.5;
        for (int k = 0; k < A->n_attr; k++) {
            const onnx_attr *at = &A->attr[k];
            if (onnx_is(at->name, "alpha") && at->has_f)
                alpha = at->f;
            else if (onnx_is(at->name, "beta") && at->has_f)
                beta = at->f;
            else
                return 0;
        }
        if (alpha != (double)(1.0f / 6) || beta != 0.5) return 0;
    } else if (A->n_attr) {
        return 0;
    }
    onnx_str x = A->in[0];
    int mul = only_taker(g, a);
    if (mul < 0 || !is_op(g, mul, "Mul")) return 0;
    onnx_str other = other_input(&m->nodes[mul], A->out[0]);
    if (!onnx_same(other, x)) return 0;
    onnx_str in[1] = {x};
    int took[1] = {a};
    int rc = become(g, mul, op, in, 1, NULL, 0, took, 1);
    return rc ? rc : 1;
}

int dsrt__onnx_rewrite(onnx_import *c) {
    graph g = {c, 0, NULL, NULL, NULL, 0};
    int rc = build(&g), folded = 0;
    onnx_model *m = &c->m;
    for (int i = 0; !rc && i < g.n; i++) {
        if (g.dead[i]) continue;
        if (is_op(&g, i, "Erf"))
            rc = gelu_at(&g, i);
        else if (is_op(&g, i, "ReduceMean"))
            rc = layernorm_at(&g, i);
        else if (is_op(&g, i, "Sigmoid"))
            rc = gated_at(&g, i, "Silu");
        else if (is_op(&g, i, "HardSigmoid"))
            rc = gated_at(&g, i, "HardSwish");
        if (rc > 0) folded += rc, rc = 0;
    }
    if (!rc && folded) {
        /* The nodes taken go; the rest keep their order. */
        int n = 0;
        for (int i = 0; i < g.n; i++)
            if (!g.dead[i]) {
                m->nodes[n] = m->nodes[i];
                m->nodes[n].index = n;
                n++;
            }
        m->n_nodes = n;
    }
    graph_free(&g);
    return rc < 0 ? dsrt__fail(rc, "onnx: %s: out of memory", c->file) : 0;
}
