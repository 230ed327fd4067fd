/*
 * add {additionLayer}: the element-wise sum of two or more inputs of one
 * shape, with a ReLU on the sum when relu=1 (ResNet's) or when a ReLU
 * takes its output. Each input's gradient is the sum's, unchanged, so the
 * net may give them one buffer.
 *
 *   inputs=a,b,... (two or more)  relu=0|1 [0]
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"relu", OPT_BOOL, "0", DSRT_O(relu), 0, 0, 1, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"add", OPTS, "element-wise sum of two or more inputs of one shape"},
    {NULL, NULL, NULL},
};

static int join(const dsrt_shape *const *ins, int n, dsrt_shape *out, const char **must) {
    *out = *ins[0];
    *must = "one shape";
    for (int k = 1; k < n; k++)
        if (ins[k]->c != out->c || ins[k]->h != out->h || ins[k]->w != out->w) return 1;
    return 0;
}

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    l->flops = (double)(l->n_inputs - 1) * in->c * in->h * in->w;
    if (l->o.relu) {
        l->fuse_relu = 1;
        l->fuse_leak = 0.0f;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/*
 * Element-wise sum of the inputs (in the first one's layout; the others are
 * reordered to it when theirs differs): two inputs as one binary primitive
 * with the ReLU as its post-op, more as a sum primitive and the ReLU after
 * it in place. Backward: the ReLU's on the gradient, which then goes to
 * each input unchanged (copied, or added where the input feeds other
 * layers too). Where every input's gradient has the output's layout, one
 * pass (step_add_bwd) reads the gradient and the output once and writes
 * each input's; else the ReLU's primitive runs in place and reorders copy.
 * In training, inputs that a batchnorm left unwritten (layer_plan.defer;
 * only to an add of two) are normalised on their way into the sum by one
 * pass of dsrt's own (step_add_norm) when both inputs have one layout whose
 * channels come in runs of 8 or 16; else they are written out first.
 */

/* What step_add_bwd reads and writes: the output and its gradient, and the
 * gradients it writes (one may be the output's gradient itself). */
typedef struct {
    dnnl_memory_t z, dz, to[DSRT_INPUTS_MAX];
    int n, relu;
    float leak;
} add_bwd;

/* An add's own: its backward in one pass, and its forward over inputs that
 * batchnorms left to it to normalise (layer_plan.defer): the layout, the
 * inputs, and an input as it is (mean 0, scale 1, shift 0 a channel). */
typedef struct {
    add_bwd bwd;
    cpu_chans v;
    dnnl_memory_t x[2];
    float *as_is;
} add_own;

static void add_own_free(void *own) {
    add_own *o = own;
    if (o) free(o->as_is);
    free(o);
}

static add_own *add_own_of(layer_plan *lp) {
    if (!lp->own && (lp->own = dsrt__calloc(1, sizeof(add_own)))) lp->own_free = add_own_free;
    return lp->own;
}

typedef struct {
    const float *z, *dz;
    float *to[DSRT_INPUTS_MAX];
    int n, relu;
    float leak;
    size_t count;
} add_bwd_job;

#define ADD_PIECE 16384 /* floats a unit of work */

/* A piece: the ReLU's gradient into the first target (which may be the
 * output's gradient itself: each value is read before it is written), then
 * copied from there, still in the cache, to the others. */
static void add_bwd_range(void *ctx, size_t lo, size_t hi) {
    const add_bwd_job *j = ctx;
    size_t a = lo * ADD_PIECE, b = DSRT_MIN(hi * ADD_PIECE, j->count);
    const float *z = j->z, *dz = j->dz;
    float *to = j->to[0], leak = j->leak;
    if (j->relu && leak == 0) {
        for (size_t e = a; e < b; e++) {
            float v = dz[e];
            to[e] = z[e] > 0 ? v : 0.0f;
        }
    } else if (j->relu) {
        for (size_t e = a; e < b; e++) {
            float v = dz[e];
            to[e] = z[e] > 0 ? v : v * leak;
        }
    } else if (to != dz) {
        memcpy(to + a, dz + a, (b - a) * sizeof *to);
    }
    for (int k = 1; k < j->n; k++)
        if (j->to[k] != to) memcpy(j->to[k] + a, to + a, (b - a) * sizeof *to);
}

static int step_add_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const add_bwd *o = &((const add_own *)p->lp[i].own)->bwd;
    add_bwd_job j = {.z = dsrt__cpu_handle(o->z),
                     .dz = dsrt__cpu_handle(o->dz),
                     .n = o->n,
                     .relu = o->relu,
                     .leak = o->leak,
                     .count = dnnl_memory_desc_get_size(dsrt__cpu_md_of(o->dz)) / sizeof(float)};
    for (int k = 0; k < o->n; k++) j.to[k] = dsrt__cpu_handle(o->to[k]);
    dsrt__cpu_parallel(be, (j.count + ADD_PIECE - 1) / ADD_PIECE, add_bwd_range, &j);
    return 0;
}

/* The backward in one pass when every input's gradient target has the
 * output gradient's layout (*taken 0 otherwise, nothing planned). */
static int plan_add_bwd_fused(cpu_backend *be, cpu_plan *p, int i, const tensor *in, int *taken) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    dnnl_memory_t acc[DSRT_INPUTS_MAX];
    int rc = 0, n = L->n_inputs;
    *taken = 0;
    for (int k = 0; k < n; k++) {
        acc[k] = NULL;
        if (!dsrt__net_need_diff(be->net, L->inputs[k])) continue;
        if (!dnnl_memory_desc_equal(&in[k].md, &lp->out.md)) return 0;
    }
    add_own *own = add_own_of(lp);
    if (!own) return -ENOMEM;
    add_bwd *o = &own->bwd;
    o->z = lp->out.mem;
    o->dz = lp->out.diff;
    o->relu = L->fuse_relu;
    o->leak = L->fuse_leak;
    for (int k = 0; k < n && !rc; k++) {
        if (!dsrt__net_need_diff(be->net, L->inputs[k])) continue;
        if (dsrt__cpu_diff_same(p, in[k].diff, lp->out.diff)) {
            o->to[o->n++] = lp->out.diff; /* in place */
            continue;
        }
        rc = dsrt__cpu_grad_target_of(be, p, i, k, &in[k], &o->to[o->n], &acc[k]);
        if (!rc) o->n++;
    }
    if (!rc) rc = dsrt__cpu_c_step(p, 1, step_add_bwd, i);
    for (int k = 0; k < n && !rc; k++) rc = dsrt__cpu_grad_add(be, p, i, in[k].diff, acc[k]);
    *taken = !rc;
    return rc;
}

/* The sum of two inputs of which a batchnorm left one or both to it:
 * each normalised on its way in. */
static int step_add_norm(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    const add_own *o = p->lp[i].own;
    size_t cp = o->v.blocks * o->v.inner;
    cpu_affine in[2];
    for (int k = 0; k < 2; k++) {
        const layer_plan *from = &p->lp[L->inputs[k]];
        in[k] = from->defer ? dsrt__cpu_deferred(from)
                            : (cpu_affine){dsrt__cpu_handle(o->x[k]), o->as_is + cp, o->as_is,
                                           o->as_is + cp};
    }
    dsrt__cpu_affine_sum(be, &o->v, 2, in, dsrt__cpu_handle(p->lp[i].out.mem), L->fuse_relu,
                         L->fuse_leak);
    return 0;
}

/* Inputs a batchnorm left to the add that it cannot normalise on the way
 * (the other input in another layout): written out first. */
static int step_add_defer_write(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    for (int k = 0; k < L->n_inputs; k++)
        if (p->lp[L->inputs[k]].defer) p->lp[L->inputs[k]].write_out(be, p, L->inputs[k]);
    return 0;
}

/* *taken 1 when the forward was planned as step_add_norm. */
static int plan_add_norm(cpu_backend *be, cpu_plan *p, int i, const tensor *in, int *taken) {
    const dsrt_layer *L = &be->net->layers[i];
    int n = L->n_inputs, deferred = 0, same = n == 2;
    cpu_chans v;
    *taken = 0;
    for (int k = 0; k < n; k++) {
        deferred |= p->lp[L->inputs[k]].defer != NULL;
        same &= dnnl_memory_desc_equal(&in[k].md, &in[0].md);
    }
    if (!deferred) return 0;
    if (!same || !dsrt__cpu_chans(&in[0].md, &v) || !dsrt__cpu_stats_usable(&v))
        return dsrt__cpu_c_step(p, 0, step_add_defer_write, i);
    add_own *o = add_own_of(&p->lp[i]);
    size_t cp = v.blocks * v.inner;
    if (!o || !(o->as_is = dsrt__calloc(2 * cp, sizeof *o->as_is))) return -ENOMEM;
    for (size_t c = 0; c < cp; c++) o->as_is[c] = 1.0f; /* scale; shift and mean: the zeros */
    o->v = v;
    for (int k = 0; k < 2; k++) o->x[k] = in[k].mem;
    int rc = dsrt__cpu_output(be, p, i, &in[0].md);
    if (!rc) rc = dsrt__cpu_c_step(p, 0, step_add_norm, i);
    *taken = !rc;
    return rc;
}

/* The forward by oneDNN: two inputs as a binary primitive with the ReLU
 * as its post-op, more as a sum primitive and the ReLU after it in place. */
static int plan_add_fwd(cpu_backend *be, cpu_plan *p, int i, const tensor *in) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    dnnl_memory_t src[DSRT_INPUTS_MAX];
    int rc = 0, n = L->n_inputs;
    const dnnl_memory_desc_t *md = &in[0].md;
    for (int k = 0; k < n && !rc; k++)
        rc = dsrt__cpu_ensure(p, be, in[k].mem, md, 0, i, &src[k], L);
    if (!rc) rc = dsrt__cpu_output(be, p, i, md);
    if (rc) return rc;
    dnnl_primitive_desc_t pd;
    step *s;
    if (n == 2) {
        dnnl_binary_desc_t d;
        DN("add", dnnl_binary_desc_init(&d, dnnl_binary_add, md, md, md));
        if ((rc = dsrt__cpu_pd(&pd, &d, be, L->fuse_relu, L->fuse_leak, NULL, "add", L))) return rc;
        rc = dsrt__cpu_prim_step(p, be, pd, 0, i, &s, L);
        dnnl_primitive_desc_destroy(pd);
        if (rc) return rc;
        dsrt__cpu_arg(s, DNNL_ARG_SRC_0, src[0]);
        dsrt__cpu_arg(s, DNNL_ARG_SRC_1, src[1]);
        dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
        return 0;
    }
    float scales[DSRT_INPUTS_MAX];
    dnnl_memory_desc_t mds[DSRT_INPUTS_MAX];
    for (int k = 0; k < n; k++) scales[k] = 1.0f, mds[k] = *md;
    dnnl_primitive_attr_t attr;
    if ((rc = dsrt__cpu_attr(&attr, 0, 0, L))) return rc;
    dnnl_status_t st = dnnl_sum_primitive_desc_create(&pd, md, n, scales, mds, attr, be->engine);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dsrt__cpu_fail(st, "add", L);
    rc = dsrt__cpu_prim_step(p, be, pd, 0, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    for (int k = 0; k < n; k++) dsrt__cpu_arg(s, DNNL_ARG_MULTIPLE_SRC + k, src[k]);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!L->fuse_relu) return 0;
    dnnl_eltwise_desc_t d;
    DN("add relu",
       dnnl_eltwise_forward_desc_init(&d, p->train ? dnnl_forward_training : dnnl_forward_inference,
                                      dnnl_eltwise_relu_use_dst_for_bwd, md, L->fuse_leak, 0));
    if ((rc = dsrt__cpu_pd(&pd, &d, be, 0, 0, NULL, "add relu", L))) return rc;
    rc = dsrt__cpu_prim_step(p, be, pd, 0, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->out.mem);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    return 0;
}

static int plan_add(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in[DSRT_INPUTS_MAX];
    int rc = 0, n = L->n_inputs, taken = 0;
    if (n < 1) return dsrt__cpu_fail(dnnl_invalid_arguments, "add", L); /* the parser needs 2 */
    for (int k = 0; k < n && !rc; k++) rc = dsrt__cpu_input4(be, p, L, k, &in[k]);
    if (!rc) rc = plan_add_norm(be, p, i, in, &taken);
    if (!rc && !taken) rc = plan_add_fwd(be, p, i, in);
    if (rc || !p->train) return rc;
    if (lp->out.diff && ((rc = plan_add_bwd_fused(be, p, i, in, &taken)) || taken)) return rc;
    if (L->fuse_relu && lp->out.diff && (rc = dsrt__cpu_fused_relu_bwd(be, p, i))) return rc;
    for (int k = 0; k < n && !rc; k++) {
        if (!dsrt__net_need_diff(be->net, L->inputs[k])) continue;
        if (dsrt__cpu_diff_same(p, in[k].diff, lp->out.diff)) continue; /* shared: no copy */
        dnnl_memory_t tgt, acc;
        rc = dsrt__cpu_grad_target_of(be, p, i, k, &in[k], &tgt, &acc);
        if (!rc) rc = dsrt__cpu_reorder_step(p, be, lp->out.diff, tgt, 1, i, STEP_ALWAYS, NULL, L);
        if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in[k].diff, acc);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

/* The inputs summed in order, as the backends sum them (every input at one
 * rank: 4 unless all are flat), then the ReLU of relu=1. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    char c[DSRT_LAYER_NAME_MAX + 32], d[DSRT_LAYER_NAME_MAX + 32];
    int rank = 2;
    for (int k = 0; k < l->n_inputs; k++)
        if (e->rank[l->inputs[k]] == 4) rank = 4;
    char(*names)[DSRT_LAYER_NAME_MAX + 32] = dsrt__calloc((size_t)l->n_inputs, sizeof *names);
    const char **in = dsrt__calloc((size_t)l->n_inputs, sizeof *in);
    if (!names || !in) {
        free(names);
        free(in);
        return -ENOMEM;
    }
    for (int k = 0; k < l->n_inputs; k++)
        in[k] = dsrt__onnx_as_rank(e, l, l->inputs[k], rank, names[k], sizeof names[k]);
    e->rank[i] = rank;
    const char *sum = in[0];
    for (int k = 1; k < l->n_inputs; k++) {
        int last = k == l->n_inputs - 1 && !l->o.relu;
        snprintf(c, sizeof c, "%s.sum%d", l->name, k);
        snprintf(d, sizeof d, "%s.add%d", l->name, k);
        const char *two[2] = {sum, in[k]};
        dsrt__onnx_node(e, "Add", last ? l->name : d, two, 2, last ? out : c, NULL, l, NULL);
        snprintf(names[0], sizeof names[0], "%s", c);
        sum = names[0];
    }
    if (l->o.relu) {
        const char *one[1] = {sum};
        dsrt__onnx_node(e, "Relu", l->name, one, 1, out, NULL, l, NULL);
    }
    free(names);
    free(in);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_add(onnx_import *c) {
    if (c->absorbed[c->cur->index]) return 0; /* the bias of the MatMul above */
    for (int k = 0; k < 2 && c->cur->n_in == 2; k++) {
        onnx_val *v = dsrt__onnx_find(c, c->cur->in[k]), *o = dsrt__onnx_find(c, c->cur->in[1 - k]);
        if (v && o && v->kind == ONNX_V_INPUT && o->kind == ONNX_V_CONST)
            return dsrt__onnx_affine(c);
    }
    if (c->cur->n_in != 2) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "%d inputs", c->cur->n_in);
    onnx_val *in[2];
    for (int k = 0; k < 2; k++) {
        onnx_val *v = dsrt__onnx_data_input(c, k, k ? "second" : "first");
        if (!v && c->err != DSRT_EUNSUPPORTED) return c->err;
        if (!v) v = dsrt__onnx_input(c, k);
        if (v->kind == ONNX_V_CONST)
            return dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED,
                "it adds the constant '%s': dsrt adds a constant only as the bias of a "
                "MatMul that feeds nothing else",
                ONNX_SHOWN(v->name));
        in[k] = v;
    }
    dsrt_shape a = dsrt__onnx_shape_of(c, in[0]), b = dsrt__onnx_shape_of(c, in[1]);
    if (in[0]->flat != in[1]->flat || a.c != b.c || a.h != b.h || a.w != b.w ||
        (in[0]->flat && !dsrt__onnx_flat_is_channels(c, in[0])))
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "its inputs' shapes differ (%dx%dx%d%s, %dx%dx%d%s): "
                               "dsrt adds tensors of one shape, no broadcasting",
                               a.c, a.h, a.w, in[0]->flat ? " flattened" : "", b.c, b.h, b.w,
                               in[1]->flat ? " flattened" : "");
    if (in[0]->nhwc != in[1]->nhwc)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "it adds a channels-last value to a channels-first one");
    if (in[0]->layer == in[1]->layer)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "it adds a value to itself");
    onnx_layer *l = dsrt__onnx_add_layer(c, "add", in, 2);
    if (!l) return c->err;
    l->out = a;
    dsrt__onnx_produce(c, l, in[0]->flat);
    return 0;
}

/* A ReLU (not leaky) that alone takes the sum: relu=1. */
static int absorb(onnx_layer *self, const onnx_layer *taker) {
    if (taker->kind != DSRT_LAYER_RELU || strcmp(taker->type, "relu") != 0 || taker->opts[0] ||
        strstr(self->opts, "relu=1"))
        return 0;
    dsrt__onnx_opt(self, " relu=1");
    return 1;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Add", map_add, "", ONNX_OP_ELEMENTWISE},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_add = {
    .name = "add",
    .types = TYPES,
    .min_inputs = 2,
    .max_inputs = DSRT_INPUTS_MAX,
    .flags = DSRT_LAYER_F_TAKES_RELU | DSRT_LAYER_F_GRAD_PASSES | DSRT_LAYER_F_SUM,
    .join = join,
    .build = build,
    .cpu_plan = plan_add,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .onnx_absorb = absorb,
    .example = "input name=in size=4x4x2\nconv name=a filters=3 size=1\nconv name=b filters=3 "
               "size=1 inputs=in\nadd inputs=a,b relu=1\nfc outputs=3\nsoftmax\n",
};
