/*
 * stochastic_depth (drop path, torchvision's StochasticDepth in mode
 * "row"): in training each image of the batch is dropped whole with
 * probability p and the others scaled by 1 / (1 - p), from a generator
 * keyed by (seed, iteration, layer) so that every backend drops the same
 * images (nn/arith.h dsrt_drop_path_mask); the identity at inference, where
 * ONNX sees no node. It sits on a residual branch, before the add.
 *
 *   p= (required: the probability an image is dropped)
 */
#include "nn/arith.h"
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"p", OPT_FLOAT, NULL, DSRT_O(p), 0, 0, 0.999999, NULL},
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"stochastic_depth", OPTS, "drops whole images in training (drop path)"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    l->out = *in;
    return 0;
}

// ----------------------------------------------------------------------------
// CPU backend

/* What the layer keeps: each image's factor of the last training forward,
 * the floats an image takes in the layout it works in, and where backward
 * writes the input's gradient in that layout. */
typedef struct {
    float *mask; /* (n) 0 or 1 / (1 - p) */
    size_t per;
    dnnl_memory_t dx;
} sd_own;

static void own_free(void *own) {
    sd_own *o = own;
    if (o) free(o->mask);
    free(o);
}

/* Whether md keeps each image in one range of per floats (oneDNN's layouts
 * keep the batch outermost: plain, channels-last and channel-blocked). */
static int images_contiguous(const dnnl_memory_desc_t *md, int n, size_t *per) {
    size_t bytes = dnnl_memory_desc_get_size(md);
    if (md->format_kind != dnnl_blocked || md->ndims < 1 || md->dims[0] != n || n < 1) return 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    for (int k = 0; k < b->inner_nblks; k++)
        if (b->inner_idxs[k] == 0) return 0;
    *per = bytes / sizeof(float) / (size_t)n;
    return (size_t)b->strides[0] * (size_t)n * sizeof(float) == bytes;
}

static int step_sd_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    sd_own *o = lp->own;
    const float *x = dsrt__cpu_handle(lp->src);
    float *y = dsrt__cpu_handle(lp->out.mem);
    uint32_t thresh = dsrt_dropout_threshold(l->o.p);
    float keep = dsrt_dropout_scale(l->o.p);
    dsrt_rng rng = dsrt_drop_path_rng(net->opts.seed, (uint64_t)net->iteration, (uint64_t)i);
    for (int b = 0; b < p->n; b++)
        o->mask[b] = dsrt_drop_path_mask(&rng, (uint64_t)b, thresh, keep);
    dsrt__cpu_mul_rows(be, (size_t)p->n, o->per, x, o->mask, y);
    return 0;
}

static int step_sd_bwd(cpu_backend *be, cpu_plan *p, int i) {
    layer_plan *lp = &p->lp[i];
    const sd_own *o = lp->own;
    const float *dy = dsrt__cpu_handle(lp->out.diff);
    float *dx = dsrt__cpu_handle(o->dx);
    dsrt__cpu_mul_rows(be, (size_t)p->n, o->per, dy, o->mask, dx);
    return 0;
}

/* In training a C step each way in the input's layout (reordered to plain
 * when an image is not one range of it), the images shared by the threads;
 * at inference the input itself. */
static int plan_sd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    if (!p->train) {
        lp->out = *in;
        return 0;
    }
    sd_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    lp->own_free = own_free;
    if (!(o->mask = dsrt__calloc((size_t)p->n, sizeof *o->mask))) return -ENOMEM;
    dnnl_memory_desc_t md = in->md;
    if (!images_contiguous(&md, p->n, &o->per)) {
        if (dsrt__cpu_md_plain_like(&md, &in->md) || !images_contiguous(&md, p->n, &o->per))
            return dsrt__cpu_fail(dnnl_invalid_arguments, "stochastic_depth", L);
    }
    int rc = dsrt__cpu_ensure(p, be, in->mem, &md, 0, i, &lp->src, L);
    if (!rc) rc = dsrt__cpu_output(be, p, i, &md);
    if (!rc) rc = dsrt__cpu_c_step(p, 0, step_sd_fwd, i);
    if (rc || !dsrt__net_need_diff(be->net, L->inputs[0])) return rc;
    dnnl_memory_t tmp, tgt, acc;
    if ((rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    if ((rc = dsrt__cpu_deliver(p, be, tgt, &md, &o->dx, &tmp, L))) return rc;
    if ((rc = dsrt__cpu_c_step(p, 1, step_sd_bwd, i))) return rc;
    if (tmp && (rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
        return rc;
    return dsrt__cpu_grad_add(be, p, i, in->diff, acc);
}

// ----------------------------------------------------------------------------
// ONNX export

/* The identity at inference: no node, its input's value. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    int j = l->inputs[0];
    snprintf(out, DSRT_ONNX_VALUE_MAX, "%s", e->value[j]);
    e->rank[i] = e->rank[j];
    return 0;
}

/* No ONNX operator is stochastic depth: an exported model has none. */
static const dsrt_onnx_op ONNX_OPS[] = {
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_stochastic_depth = {
    .name = "stochastic_depth",
    .types = TYPES,
    .flags = DSRT_LAYER_F_INFER_IDENTITY,
    .min_inputs = 1,
    .max_inputs = 1,
    .build = build,
    .cpu_plan = plan_sd,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=4x4x2\nconv name=a filters=3 size=1\nconv filters=3 size=3 pad=1\n"
               "stochastic_depth name=s p=0.3\nadd inputs=a,s\nfc outputs=3\nsoftmax\n",
};
