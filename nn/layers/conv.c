/*
 * conv {convolution2dLayer, groupedConvolution2dLayer}: 2-D convolution of
 * filters x (in_c / groups) x kh x kw weights and an optional bias, with
 * stride, padding (explicit, or MATLAB's 'same': out = ceil(in / stride))
 * and dilation. It computes a ReLU that takes its output as its own.
 *
 *   filters=N (required)  size=K|KHxKW (required)  stride=S|SHxSW [1]
 *   pad=P|PHxPW|T,B,L,R|same [0]  dilation=D|DHxDW [1]  groups=G [1]
 *   bias=0|1 [1]  init=default|glorot|he|uniform [the net's]
 *   wlr= blr= [1] learn-rate factors; wl2= [1] bl2= [0] L2 factors
 */
#include "nn/backend_cpu.h"
#include "nn/onnx.h"

static const dsrt_opt_spec OPTS[] = {
    {"filters", OPT_INT, NULL, DSRT_O(filters), 0, 1, 1 << 20, NULL},
    {"size", OPT_PAIR, NULL, DSRT_O(kh), 0, 1, 1 << 12, NULL},
    {"stride", OPT_PAIR, "1", DSRT_O(sh), 0, 1, 1 << 12, NULL},
    {"pad", OPT_PAD, "0", DSRT_O(pt), DSRT_O(pad_same), 0, 1 << 12, NULL},
    {"dilation", OPT_PAIR, "1", DSRT_O(dh), 0, 1, 1 << 12, NULL},
    {"groups", OPT_INT, "1", DSRT_O(groups), 0, 1, 1 << 20, NULL},
    {"bias", OPT_BOOL, "1", DSRT_O(bias), 0, 0, 1, NULL},
    {"init", OPT_INIT, "default", DSRT_O(init), 0, 0, 0, NULL},
    DSRT_LR_OPTS("1", "0"),
    DSRT_OPT_END,
};

static const dsrt_layer_type TYPES[] = {
    {"conv", OPTS, "2-D convolution (grouped with groups > 1)"},
    {NULL, NULL, NULL},
};

static int build(dsrt_layer *l, const dsrt_shape *in, int *classes) {
    int g = l->o.groups;
    if (in->c % g || l->o.filters % g)
        return dsrt__fail(DSRT_EOPTION,
                          "conv: option 'groups': %d does not divide the %d input channels and "
                          "the %d filters",
                          g, in->c, l->o.filters);
    int rc = dsrt__layer_window(l, in, l->o.dh, l->o.dw);
    if (rc) return rc;
    l->out.c = l->o.filters;
    double wn = (double)l->o.filters * (in->c / g) * l->o.kh * l->o.kw;
    if ((rc = dsrt__layer_check_size(l, wn, "the weights"))) return rc;
    if ((rc = dsrt__layer_check_size(l, (double)l->out.c * l->out.h * l->out.w, "an output image")))
        return rc;
    l->w_n = (size_t)wn;
    l->b_n = l->o.bias ? (size_t)l->o.filters : 0;
    l->flops = 2.0 * wn * l->out.h * l->out.w;
    return 0;
}

static void init(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int net_init) {
    int how = l->o.init == DSRT_INIT_DEFAULT ? net_init : l->o.init;
    double k = (double)l->o.kh * l->o.kw;
    double fan_in = k * (l->in.c / l->o.groups), fan_out = k * (l->o.filters / l->o.groups);
    dsrt__layer_draw(params + l->w_off, l->w_n, how, fan_in, fan_out, rng);
    dsrt__layer_init_bias(params + l->b_off, l->b_n, how, fan_in, rng);
}

// ----------------------------------------------------------------------------
// CPU backend

/* Whether convolution L runs in NHWC rather than in the blocked layout that
 * format_tag any gives. The blocked layouts pad channels to the block (16
 * floats on AVX-512), which costs up to 2.5x the arithmetic for channel
 * counts like 20; oneDNN's NHWC convolutions do not pad. */
static int conv_nhwc(const cpu_backend *be, const dsrt_layer *L) {
    if (be->layout == LAYOUT_BLOCKED) return 0;
    if (be->layout == LAYOUT_NHWC) return 1;
    return L->out.c % be->block != 0 || (L->in.c > 4 && L->in.c % be->block != 0);
}

/* Whether inference runs convolution L in oneDNN's 16-channel blocks where
 * format_tag any would give NHWC: on AVX-512, the 1x1 convolutions of a net
 * whose convolutions all fill the blocks and none is grouped (ResNets).
 * oneDNN 2.6 picks its brgemm kernel in NHWC for them, which loses a third
 * of its rate to a residual sum post-op whose tensor lies outside the cache
 * (ResNet-50's 64-to-256 expansion at 56x56, batch 16: 227 GFLOP/s against
 * 346 in blocks), and its Winograd 3x3 kernel takes blocks only, so NHWC
 * 1x1 convolutions between them cost two reorders each: ResNet-50 batch 16,
 * 58.6 -> 65.2 images/s, ResNet-18 unchanged. Strided 3x3 convolutions keep
 * NHWC, where the brgemm kernel is up to twice the blocked direct one's
 * rate. In a net of depthwise convolutions or of channels off the blocks
 * (MobileNet, EfficientNet: NHWC around them) blocks would only add
 * reorders (MobileNetV2 0.76x). */
static int infer_blocked(const cpu_backend *be, const cpu_plan *p, const dsrt_layer *L) {
    if (p->train || be->layout != LAYOUT_AUTO || be->block != 16 || L->o.kh != 1 || L->o.kw != 1)
        return 0;
    const dsrt_net *net = be->net;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *c = &net->layers[i];
        if (c->kind == DSRT_LAYER_CONV &&
            (c->o.groups != 1 || c->out.c % 16 || (c->in.c > 4 && c->in.c % 16)))
            return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// Depthwise convolutions' weight gradients (groups = channels = filters)
//
// oneDNN 2.6's jit kernels for depthwise convolutions are fast forward and
// backward data in its channel blocks and in NHWC, and backward weights for
// the shapes they take (3x3 in blocks); for the others (a 5x5 kernel, NHWC)
// its heuristics give backward weights to a gemm a channel or to the
// general jit convolution, tens to hundreds of times its forward. There a C
// step computes the weights' (and bias's) gradient in the layout oneDNN's
// forward chose (channels innermost, so that the compiler vectorises over
// them), on the OpenMP team, every sum in one order whatever the number of
// threads: each row's products in float, the rows of a piece of DW_IMAGES
// images in double, the pieces in order.

#define DW_V      16 /* channels a vector of work */
#define DW_IMAGES 4  /* images whose sums one piece takes */

/* What the step keeps. */
typedef struct {
    cpu_chans vx, vy; /* the input's and the output gradient's layouts */
    int ih, iw, oh, ow, kh, kw, dh, dw;
    size_t kk;           /* taps (kh kw) */
    size_t vecs, pieces; /* vectors a block; pieces of images */
    double *part;        /* (blocks vecs pieces, kk + 1, DW_V) the pieces' sums */
    /* Which taps meet the input: for output row oh the kernel rows
     * [r_lo, r_hi), their input rows at_h + r dh; for kernel column s the
     * output columns [ow_lo, ow_hi), their input columns at_w + s dw. */
    int *r_lo, *r_hi, *at_h, *at_w, *ow_lo, *ow_hi;
} dw_own;

static void dw_free(void *own) {
    dw_own *o = own;
    if (!o) return;
    free(o->part);
    free(o->r_lo);
    free(o);
}

typedef struct {
    const dw_own *o;
    const float *x, *dy;
} dw_job;

/* One output row of one vector of kn channels (k0 the first in its block,
 * inner the layout's pixel stride), x and dy at the image's block: each
 * tap's products summed over the row in float and added into part (kk + 1
 * vectors: the taps, then the bias) in double. */
DSRT_CPU_INLINE void dw_filter_row(const dw_own *o, const float *restrict x,
                                   const float *restrict dy, double *restrict part, size_t inner,
                                   size_t k0, size_t kn, int oh) {
    const float *restrict gr = dy + (size_t)oh * o->ow * inner + k0;
    for (int r = o->r_lo[oh]; r < o->r_hi[oh]; r++) {
        const float *restrict xr = x + (size_t)(o->at_h[oh] + r * o->dh) * o->iw * inner + k0;
        for (int s = 0; s < o->kw; s++) {
            float acc[DW_V];
            for (size_t k = 0; k < kn; k++) acc[k] = 0.0f;
            for (int ow = o->ow_lo[s]; ow < o->ow_hi[s]; ow++) {
                const float *restrict gp = gr + (size_t)ow * inner;
                const float *restrict xp = xr + (size_t)(o->at_w[ow] + s * o->dw) * inner;
                for (size_t k = 0; k < kn; k++) acc[k] += gp[k] * xp[k];
            }
            double *restrict pp = part + ((size_t)r * o->kw + s) * DW_V;
            for (size_t k = 0; k < kn; k++) pp[k] += acc[k];
        }
    }
    float acc[DW_V];
    for (size_t k = 0; k < kn; k++) acc[k] = 0.0f;
    for (int ow = 0; ow < o->ow; ow++)
        for (size_t k = 0; k < kn; k++) acc[k] += gr[(size_t)ow * inner + k];
    double *restrict pp = part + o->kk * DW_V;
    for (size_t k = 0; k < kn; k++) pp[k] += acc[k];
}

/* Where vector v of a block starts, and its channels. */
DSRT_CPU_INLINE void dw_vec(const cpu_chans *c, size_t v, size_t *k0, size_t *kn) {
    *k0 = v * DW_V;
    *kn = DSRT_MIN((size_t)DW_V, c->inner - *k0);
}

/* Units: (block, vector, piece of images), each with its own sums. */
DSRT_CPU_INLINE void dw_filter_range(void *ctx, size_t lo, size_t hi) {
    const dw_job *j = ctx;
    const dw_own *o = j->o;
    const cpu_chans *vx = &o->vx, *vy = &o->vy;
    size_t taps = (o->kk + 1) * DW_V;
    for (size_t u = lo; u < hi; u++) {
        size_t b = u / (o->vecs * o->pieces), v = u / o->pieces % o->vecs, q = u % o->pieces;
        size_t k0, kn;
        dw_vec(vx, v, &k0, &kn);
        double *restrict part = o->part + u * taps;
        for (size_t t = 0; t < taps; t++) part[t] = 0.0;
        size_t i1 = DSRT_MIN(vx->n, (q + 1) * DW_IMAGES);
        for (size_t i = q * DW_IMAGES; i < i1; i++) {
            const float *x = j->x + i * vx->s_n + b * vx->s_b;
            const float *dy = j->dy + i * vy->s_n + b * vy->s_b;
            for (int oh = 0; oh < o->oh; oh++) {
                if (kn == DW_V)
                    dw_filter_row(o, x, dy, part, vx->inner, k0, DW_V, oh);
                else
                    dw_filter_row(o, x, dy, part, vx->inner, k0, kn, oh);
            }
        }
    }
}
DSRT_CPU_ISA_VARIANTS(dw_filter_range);

/* The weights' (c, 1, kh, kw) and bias's gradients: the pieces' sums,
 * added in order. */
static int step_dw_filter(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *l = &be->net->layers[i];
    dw_own *o = p->lp[i].own;
    dw_job j = {
        .o = o, .x = dsrt__cpu_handle(p->lp[i].src), .dy = dsrt__cpu_handle(p->lp[i].out.diff)};
    size_t units = o->vx.blocks * o->vecs * o->pieces, taps = (o->kk + 1) * DW_V;
    dsrt__cpu_parallel(be, units, dw_filter_range_isa[be->isa], &j);
    float *dw = be->net->grads + l->w_off, *db = l->b_n ? be->net->grads + l->b_off : NULL;
    for (size_t b = 0; b < o->vx.blocks; b++)
        for (size_t v = 0; v < o->vecs; v++) {
            size_t k0, kn, c0 = b * o->vx.inner;
            dw_vec(&o->vx, v, &k0, &kn);
            for (size_t k = 0; k < kn && c0 + k0 + k < o->vx.c; k++)
                for (size_t t = 0; t <= o->kk; t++) {
                    double s = 0;
                    for (size_t q = 0; q < o->pieces; q++)
                        s += o->part[((b * o->vecs + v) * o->pieces + q) * taps + t * DW_V + k];
                    if (t < o->kk)
                        dw[(c0 + k0 + k) * o->kk + t] = (float)s;
                    else if (db)
                        db[c0 + k0 + k] = (float)s;
                }
        }
    return 0;
}

/* The tables of which taps meet the input (dw_own). */
static int dw_tables(dw_own *o, int sh, int sw, int pt, int pl) {
    size_t ints = 3 * (size_t)o->oh + (size_t)o->ow + 2 * (size_t)o->kw;
    int *t = o->r_lo = dsrt__calloc(ints, sizeof *t);
    if (!t) return -ENOMEM;
    o->r_hi = t + o->oh;
    o->at_h = o->r_hi + o->oh;
    o->at_w = o->at_h + o->oh;
    o->ow_lo = o->at_w + o->ow;
    o->ow_hi = o->ow_lo + o->kw;
    /* The taps of a window inside the input are one range, and so are the
     * outputs whose windows a tap sees inside it. */
    for (int y = 0; y < o->oh; y++) {
        o->at_h[y] = y * sh - pt;
        for (int r = 0; r < o->kh; r++) {
            int q = o->at_h[y] + r * o->dh;
            if (q < 0 || q >= o->ih) continue;
            if (o->r_hi[y] == o->r_lo[y]) o->r_lo[y] = r;
            o->r_hi[y] = r + 1;
        }
    }
    for (int x = 0; x < o->ow; x++) o->at_w[x] = x * sw - pl;
    for (int s = 0; s < o->kw; s++)
        for (int x = 0; x < o->ow; x++) {
            int q = o->at_w[x] + s * o->dw;
            if (q < 0 || q >= o->iw) continue;
            if (o->ow_hi[s] == o->ow_lo[s]) o->ow_lo[s] = x;
            o->ow_hi[s] = x + 1;
        }
    return 0;
}

/*
 * Whether depthwise convolution i's weight gradient is the C step's: when
 * oneDNN's choice bpd for it is not its depthwise kernel and the input
 * (lp->src) and output's gradient are in layouts the step reads. Then the
 * step and the gradients' readiness are added, and bpd destroyed.
 */
static int dw_filter_plan(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                          int *taken) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    const char *impl = NULL;
    cpu_chans vx, vy;
    *taken = 0;
    if (!be->depthwise || L->o.groups == 1 || L->o.groups != L->in.c || L->out.c != L->in.c)
        return 0;
    if (dnnl_primitive_desc_query(bpd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
        impl && strstr(impl, "dw"))
        return 0;
    if (!dsrt__cpu_chans(dsrt__cpu_md_of(lp->src), &vx) ||
        !dsrt__cpu_chans(dsrt__cpu_md_of(lp->out.diff), &vy) || vx.inner != vy.inner ||
        vx.blocks != vy.blocks || vx.inner == 1)
        return 0;
    dw_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    lp->own_free = dw_free;
    *o = (dw_own){.vx = vx,
                  .vy = vy,
                  .ih = L->in.h,
                  .iw = L->in.w,
                  .oh = L->out.h,
                  .ow = L->out.w,
                  .kh = L->o.kh,
                  .kw = L->o.kw,
                  .dh = L->o.dh,
                  .dw = L->o.dw};
    o->kk = (size_t)L->o.kh * L->o.kw;
    o->vecs = (vx.inner + DW_V - 1) / DW_V;
    o->pieces = ((size_t)p->n + DW_IMAGES - 1) / DW_IMAGES;
    size_t units = vx.blocks * o->vecs * o->pieces;
    o->part = dsrt__malloc(units * (o->kk + 1) * DW_V * sizeof *o->part);
    int rc = o->part ? dw_tables(o, L->o.sh, L->o.sw, L->pt, L->pl) : -ENOMEM;
    if (!rc) rc = dsrt__cpu_c_step(p, 1, step_dw_filter, i);
    if (!rc) rc = dsrt__cpu_ready_step(p, i);
    if (rc) return rc;
    dnnl_primitive_desc_destroy(bpd);
    *taken = 1;
    return 0;
}

// ----------------------------------------------------------------------------
// Pointwise convolutions' weight gradients (1x1, no padding or dilation,
// ungrouped) on dsrt's own kernel (nn/backend_cpu_pointwise.c), where it
// runs: on AVX2, oneDNN 2.6's 1x1 kernel takes a quarter of ResNet-50's
// step reducing over the pixels at two thirds of its forward's rate; and
// strided ones of larger filters, a tap at a time.

/* Strided convolutions of larger filters and 64 input channels or more
 * take the same kernel a tap at a time (dsrt__pw_taps_weights_grad): each
 * tap reads the output's gradient again, which pays where the channels
 * are many and the stride thins the outputs. ResNet-50's three strided 3x3
 * layers at batch 16: 116 -> 106 ms of backward; ResNet-20's 16-channel 3x3
 * layers of stride 1 ran 1.13x slower by it. */
#define PW_TAPS_MIN_C 64

typedef struct {
    cpu_chans xl, yl; /* the input's and the output gradient's layouts */
    float *tap;       /* larger filters: the taps' sums (kh kw k c floats) */
} pw_own;

static void pw_own_free(void *own) {
    pw_own *o = own;
    if (o) free(o->tap);
    free(o);
}

static int step_pw_filter(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    const pw_own *o = p->lp[i].own;
    float *g = be->net->grads, *db = L->b_n ? g + L->b_off : NULL;
    const float *x = dsrt__cpu_handle(p->lp[i].src), *dy = dsrt__cpu_handle(p->lp[i].out.diff);
    if (!o->tap) {
        dsrt__pw_weights_grad(be, x, &o->xl, dy, &o->yl, p->n, L->out.h, L->out.w, L->in.w, L->o.sh,
                              L->o.sw, L->in.c, L->out.c, g + L->w_off, db);
        return 0;
    }
    /* n, c, k, ih, iw, oh, ow, kh, kw, sh, sw, pt, pl */
    pw_taps t = {p->n,    L->in.c, L->out.c, L->in.h, L->in.w, L->out.h, L->out.w,
                 L->o.kh, L->o.kw, L->o.sh,  L->o.sw, L->pt,   L->pl};
    dsrt__pw_taps_weights_grad(be, x, &o->xl, dy, &o->yl, &t, g + L->w_off, db, o->tap);
    return 0;
}

/* Whether convolution i's weight gradient is that kernel's: then its step
 * and the gradients' readiness are added, and bpd destroyed. */
static int pw_filter_plan(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                          int *taken) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    cpu_chans xl, yl;
    *taken = 0;
    int one = L->o.kh == 1 && L->o.kw == 1 && !L->pt && !L->pb && !L->pl && !L->pr;
    int taps = be->pw_taps && (L->o.sh > 1 || L->o.sw > 1) && L->in.c >= PW_TAPS_MIN_C;
    if (L->o.groups != 1 || L->o.dh != 1 || L->o.dw != 1 || !dsrt__pw_wgrad_usable(be, L->in.c) ||
        (!one && !taps))
        return 0;
    if (!dsrt__cpu_chans(dsrt__cpu_md_of(lp->src), &xl) ||
        !dsrt__cpu_chans(dsrt__cpu_md_of(lp->out.diff), &yl) || xl.inner % 8)
        return 0;
    pw_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    lp->own = o;
    lp->own_free = pw_own_free;
    o->xl = xl;
    o->yl = yl;
    if (!one &&
        !(o->tap = dsrt__malloc((size_t)L->o.kh * L->o.kw * L->out.c * L->in.c * sizeof *o->tap)))
        return -ENOMEM;
    int rc = dsrt__cpu_c_step(p, 1, step_pw_filter, i);
    if (!rc) rc = dsrt__cpu_ready_step(p, i);
    if (rc) return rc;
    dnnl_primitive_desc_destroy(bpd);
    *taken = 1;
    return 0;
}

/*
 * At inference a 3x3 convolution of stride 1 whose channels fill the blocks
 * runs on oneDNN's Winograd F(4x4, 3x3) kernel where it has one (AVX-512),
 * in the 16-channel blocked layout that kernel takes: 36 products for each
 * 4x4 output tile where the direct method does 144, resnet18 1.4x the
 * images/s at batch 16, the scores within 1e-6 of the direct method's
 * (test_nn_infer). oneDNN's own choice (dnnl_convolution_auto) never takes
 * it at inference. *fpd stays NULL where the kernel is not there or takes
 * the layer not (DSRT_CPU_CONV=direct: never).
 */
static int winograd_pd(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t *fpd,
                       const dnnl_dims_t sdims, const dnnl_dims_t ddims,
                       const dnnl_memory_desc_t *w_any, const dnnl_memory_desc_t *bias) {
    const dsrt_layer *L = &be->net->layers[i];
    *fpd = NULL;
    if (be->conv_alg == dnnl_convolution_direct || L->o.kh != 3 || L->o.kw != 3 || L->o.sh != 1 ||
        L->o.sw != 1 || L->o.dh != 1 || L->o.dw != 1 || L->o.groups != 1 || L->in.c % 16 ||
        L->out.c % 16)
        return 0;
    dnnl_memory_desc_t src, dst;
    dnnl_convolution_desc_t d;
    dnnl_dims_t strides = {1, 1}, pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    if (dnnl_memory_desc_init_by_tag(&src, 4, sdims, dnnl_f32, dnnl_nChw16c) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&dst, 4, ddims, dnnl_f32, dnnl_nChw16c) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&d, dnnl_forward_inference, dnnl_convolution_winograd,
                                           &src, w_any, bias, &dst, strides, pad_l,
                                           pad_r) != dnnl_success)
        return 0;
    /* Refused (no kernel for this machine or these post-ops): the direct
     * method, with no error left behind. */
    int rc = dsrt__cpu_pd_fused(fpd, &d, be, p, i, "convolution");
    if (rc == -ENOMEM) return rc;
    if (rc) {
        *fpd = NULL;
        dsrt__clear_error();
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Training convolutions by Winograd's F(4x4, 3x3) (nn/backend_cpu_winograd.c)
//
// On a CPU without AVX-512, oneDNN 2.6 convolves 3x3 directly (its Winograd
// is AVX-512 only, for inference), at about the FMA units' peak: the
// minimal filtering does 36 multiplications a 4x4 patch and channel pair
// where the direct one does 144. Forward, the input's gradient and the
// weights' go through it, in the layouts oneDNN's direct primitive picks.

/* What the steps keep: the transformed filters of the weights version
 * made from, the tensors whose handles each step reads and their layouts. */
typedef struct {
    float *u, *ub; /* forward's, the input gradient's (NULL: not needed) */
    int m;         /* the output tile */
    uint64_t version;
    dnnl_memory_t src, dst, ddst, dsrc;
    cpu_chans xl, yl;
    const float *w, *b; /* the weights and bias transformed (inference: folded ones) */
    wino_epilogue e;
} wino_own;

static void wino_free(void *own) {
    wino_own *o = own;
    free(o->u);
    free(o->ub);
    free(o);
}

/* The epilogue of an inference plan's chain (cpu_fusion): ReLUs and a
 * residual's sum in the orders relu, sum, relu (each optional); 0 when the
 * chain holds anything else. */
static int wino_chain(const dsrt_layer *L, const cpu_fusion *f, wino_epilogue *e) {
    memset(e, 0, sizeof *e);
    if (!f) {
        e->relu = L->fuse_relu;
        e->leak = L->fuse_leak;
        return 1;
    }
    int stage = 0; /* 0: before the sum, 1: after it, 2: done */
    for (int k = 0; k < f->n_ops; k++) {
        if (f->ops[k].sum) {
            if (stage != 0) return 0;
            e->sum = 1;
            stage = 1;
            continue;
        }
        if (f->ops[k].act.fn != DSRT_ACT_RELU || stage == 2) return 0;
        if (stage == 0 && !e->relu) {
            e->relu = 1;
            e->leak = f->ops[k].act.alpha;
        } else if (stage == 1) {
            e->relu2 = 1;
            e->leak2 = f->ops[k].act.alpha;
            stage = 2;
        } else {
            return 0;
        }
    }
    return 1;
}

static int wino_fits(const cpu_backend *be, const cpu_plan *p, const dsrt_layer *L) {
    wino_epilogue e;
    if (!p->train && !wino_chain(L, dsrt__cpu_fusion(p, (int)(L - be->net->layers)), &e)) return 0;
    return be->conv_alg != dnnl_convolution_direct && L->o.groups == 1 && L->o.kh == 3 &&
           L->o.kw == 3 && L->o.sh == 1 && L->o.sw == 1 && L->o.dh == 1 && L->o.dw == 1 &&
           L->pt == 1 && L->pb == 1 && L->pl == 1 && L->pr == 1 &&
           dsrt__wino_usable(be, L->in.c, L->out.c, L->in.h, L->in.w);
}

/* The scratch grown to what layer L's kernels take with the team the net
 * has now (its threads may have changed since the plan was made). */
static int wino_scratch(cpu_backend *be, const dsrt_layer *L, int m) {
    size_t need = DSRT_MAX(dsrt__wino_scratch_floats(be, m, L->in.c, L->out.c),
                           dsrt__wino_wgrad_floats(m, L->in.c, L->out.c));
    if (need <= be->wino_scratch_n) return 0;
    free(be->wino_scratch);
    be->wino_scratch_n = 0;
    if (!(be->wino_scratch = aligned_alloc(64, need * sizeof(float))))
        return dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory for its scratch",
                          L->name);
    be->wino_scratch_n = need;
    return 0;
}

static int step_wino_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    wino_own *o = p->lp[i].own;
    int rc = wino_scratch(be, L, o->m);
    if (rc) return rc;
    if (o->version != net->version) {
        dsrt__wino_weights(be, o->w, o->m, L->out.c, L->in.c, 0, o->u);
        if (o->ub) dsrt__wino_weights(be, o->w, o->m, L->out.c, L->in.c, 1, o->ub);
        o->version = net->version;
    }
    dsrt__wino_conv(be, o->m, dsrt__cpu_handle(o->src), &o->xl, o->u, o->b,
                    dsrt__cpu_handle(o->dst), &o->yl, p->n, L->in.h, L->in.w, L->in.c, L->out.c,
                    &o->e, be->wino_scratch);
    return 0;
}

static int step_wino_wgrad(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    const wino_own *o = p->lp[i].own;
    int rc = wino_scratch(be, L, o->m);
    if (rc) return rc;
    dsrt__wino_weights_grad(be, o->m, dsrt__cpu_handle(o->src), &o->xl, dsrt__cpu_handle(o->ddst),
                            &o->yl, p->n, L->in.h, L->in.w, L->in.c, L->out.c,
                            net->grads + L->w_off, L->b_n ? net->grads + L->b_off : NULL,
                            be->wino_scratch);
    return 0;
}

static int step_wino_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    const wino_own *o = p->lp[i].own;
    const wino_epilogue none = {0};
    int rc = wino_scratch(be, L, o->m);
    if (rc) return rc;
    dsrt__wino_conv(be, o->m, dsrt__cpu_handle(o->ddst), &o->yl, o->ub, NULL,
                    dsrt__cpu_handle(o->dsrc), &o->xl, p->n, L->in.h, L->in.w, L->out.c, L->in.c,
                    &none, be->wino_scratch);
    return 0;
}

/* The input's gradient: the output's (in the output's layout) through the
 * turned filters, into the input's gradient (in the input's) or added to
 * it. */
static int wino_data_grad(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *src) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    wino_own *o = lp->own;
    dnnl_memory_t tgt = NULL, acc = NULL, tmp = NULL;
    int rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc) rc = dsrt__cpu_deliver(p, be, tgt, src, &o->dsrc, &tmp, L);
    if (!rc) rc = dsrt__cpu_c_step(p, 1, step_wino_bwd, i);
    if (!rc && tmp) rc = dsrt__cpu_reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc) rc = dsrt__cpu_grad_add(be, p, i, p->lp[L->inputs[0]].out.diff, acc);
    return rc;
}

/* The layer's own bytes: the transformed filters, the scratch grown to fit. */
static int wino_own_make(cpu_backend *be, cpu_plan *p, int i, int need_dx) {
    const dsrt_layer *L = &be->net->layers[i];
    int m = dsrt__wino_tile(be);
    size_t uf = (size_t)(m + 2) * (m + 2) * L->in.c * L->out.c;
    wino_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    p->lp[i].own = o;
    p->lp[i].own_free = wino_free;
    o->version = UINT64_MAX;
    o->m = m;
    o->u = aligned_alloc(64, uf * sizeof(float));
    o->ub = need_dx ? aligned_alloc(64, uf * sizeof(float)) : NULL;
    if (!o->u || (need_dx && !o->ub)) return dsrt__fail(-ENOMEM, "cpu backend: out of memory");
    return wino_scratch(be, L, m);
}

/*
 * The layer by Winograd when oneDNN's direct forward primitive for it takes
 * layouts whose channels come in runs of 8 or more (*took 0 otherwise, and
 * nothing is planned): forward, the weights' gradient and the input's, in
 * those layouts.
 */
static int plan_conv_wino(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *src_any,
                          const dnnl_memory_desc_t *dst_any, int *took) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    dnnl_dims_t wdims = {L->out.c, L->in.c, 3, 3}, bdims = {L->out.c}, one = {1, 1}, none = {0, 0};
    dnnl_memory_desc_t w_any, b_md, src, dst;
    if (dsrt__cpu_md_any(&w_any, 4, wdims) || dsrt__cpu_md_plain(&b_md, 1, bdims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "memory descriptors", L);
    const dnnl_memory_desc_t *bias = L->b_n ? &b_md : NULL;
    dnnl_convolution_desc_t fd;
    dnnl_primitive_desc_t fpd;
    DN("convolution",
       dnnl_dilated_convolution_forward_desc_init(
           &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, dnnl_convolution_direct,
           src_any, &w_any, bias, dst_any, one, none, one, one));
    int rc = dsrt__cpu_pd(&fpd, &fd, be, 0, 0.0f, NULL, "convolution", L);
    if (rc) return rc;
    src = *dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0);
    dst = *dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0);
    cpu_chans xl, yl;
    *took = dsrt__cpu_chans(&src, &xl) && dsrt__cpu_chans(&dst, &yl) && xl.inner % 8 == 0 &&
            yl.inner % 8 == 0;
    int need_dx = p->train && dsrt__net_need_diff(net, L->inputs[0]);
    if (!*took || (rc = wino_own_make(be, p, i, need_dx))) goto out;
    wino_own *o = lp->own;
    o->xl = xl;
    o->yl = yl;
    o->w = net->params + L->w_off;
    o->b = L->b_n ? net->params + L->b_off : NULL;
    wino_chain(L, dsrt__cpu_fusion(p, i), &o->e);
    tensor *in = &p->lp[L->inputs[0]].out;
    if ((rc = dsrt__cpu_ensure(p, be, in->mem, &src, 0, i, &lp->src, L))) goto out;
    if (!p->train) {
        /* The folded weights and bias where an affine map was folded in (its
         * step remakes them before this layer's), the chain's output. */
        dnnl_memory_desc_t w_plain;
        dnnl_memory_t wm, bm;
        const cpu_fusion *f = dsrt__cpu_fusion(p, i);
        if (dsrt__cpu_md_plain(&w_plain, 4, wdims)) {
            rc = dsrt__cpu_fail(dnnl_invalid_arguments, "memory descriptors", L);
            goto out;
        }
        if ((rc = dsrt__cpu_fused_params(be, p, i, &w_plain, &b_md, &wm, &bm)) ||
            (rc = dsrt__cpu_fused_output(be, p, i, &dst)))
            goto out;
        if (f && f->affine >= 0) {
            o->w = f->w;
            o->b = f->b;
        }
    } else if ((rc = dsrt__cpu_output(be, p, i, &dst))) {
        goto out;
    }
    o->src = lp->src;
    o->dst = lp->out.mem;
    if ((rc = dsrt__cpu_c_step(p, 0, step_wino_fwd, i)) || !p->train) goto out;
    if (L->fuse_relu && (rc = dsrt__cpu_fused_relu_bwd(be, p, i))) goto out;
    if ((rc = dsrt__cpu_ensure(p, be, lp->out.diff, &dst, 1, i, &o->ddst, L)) ||
        (rc = dsrt__cpu_c_step(p, 1, step_wino_wgrad, i)) || (rc = dsrt__cpu_ready_step(p, i)))
        goto out;
    if (need_dx) rc = wino_data_grad(be, p, i, &src);
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// The plan

static int plan_conv(cpu_backend *be, cpu_plan *p, int i) {
    dnnl_alg_kind_t conv_alg = be->conv_alg;
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int g = L->o.groups, rc;
    dnnl_dims_t sdims = {p->n, L->in.c, L->in.h, L->in.w};
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t wdims5 = {g, L->out.c / g, L->in.c / g, L->o.kh, L->o.kw};
    dnnl_dims_t wdims4 = {L->out.c, L->in.c, L->o.kh, L->o.kw};
    dnnl_dims_t bdims = {L->out.c};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, dil = {L->o.dh - 1, L->o.dw - 1};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    int wnd = g > 1 ? 5 : 4;
    const dnnl_dim_t *wdims = g > 1 ? wdims5 : wdims4;
    dnnl_memory_desc_t src_any, w_any, w_plain, b_md, dst_any;
    if (dsrt__cpu_md_any(&src_any, 4, sdims) || dsrt__cpu_md_any(&w_any, wnd, wdims) ||
        dsrt__cpu_md_plain(&w_plain, wnd, wdims) || dsrt__cpu_md_plain(&b_md, 1, bdims) ||
        dsrt__cpu_md_any(&dst_any, 4, ddims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "memory descriptors", L);
    if (conv_nhwc(be, L)) {
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&src_any, 4, sdims, dnnl_f32, dnnl_acdb));
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&dst_any, 4, ddims, dnnl_f32, dnnl_acdb));
    } else if (infer_blocked(be, p, L)) {
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&src_any, 4, sdims, dnnl_f32, dnnl_nChw16c));
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&dst_any, 4, ddims, dnnl_f32, dnnl_nChw16c));
    }
    if (wino_fits(be, p, L)) {
        int took = 0;
        if ((rc = plan_conv_wino(be, p, i, &src_any, &dst_any, &took)) || took) return rc;
    }
    /* At inference an affine map folded in gives a bias where there is none. */
    const cpu_fusion *fu = dsrt__cpu_fusion(p, i);
    const dnnl_memory_desc_t *bias = L->b_n || (fu && fu->affine >= 0) ? &b_md : NULL;
    dnnl_prop_kind_t prop = p->train ? dnnl_forward_training : dnnl_forward_inference;

    /* Forward */
    dnnl_convolution_desc_t fd;
    dnnl_primitive_desc_t fpd = NULL;
    if (!p->train && (rc = winograd_pd(be, p, i, &fpd, sdims, ddims, &w_any, bias))) return rc;
    if (!fpd) {
        DN("convolution",
           dnnl_dilated_convolution_forward_desc_init(&fd, prop, conv_alg, &src_any, &w_any, bias,
                                                      &dst_any, strides, dil, pad_l, pad_r));
        if ((rc = dsrt__cpu_pd_fused(&fpd, &fd, be, p, i, "convolution"))) return rc;
    }
    dnnl_memory_t wplain, wfwd, bmem = NULL;
    step *s;
    if ((rc = dsrt__cpu_ensure(p, be, in->mem,
                               dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), 0, i,
                               &lp->src, L)))
        goto out;
    if ((rc = dsrt__cpu_fused_params(be, p, i, &w_plain, &b_md, &wplain, &bmem))) goto out;
    if ((rc = dsrt__cpu_weights_for(be, p, i, &w_plain,
                                    dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0),
                                    wplain, 0, &lp->w_fwd_version, &wfwd)))
        goto out;
    if ((rc = dsrt__cpu_fused_output(be, p, i,
                                     dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0))))
        goto out;
    if ((rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L))) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, lp->src);
    dsrt__cpu_arg(s, DNNL_ARG_WEIGHTS, wfwd);
    dsrt__cpu_arg(s, DNNL_ARG_BIAS, bmem);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train) goto out;

    /* Backward: the fused ReLU, weights, then data. */
    if (L->fuse_relu && (rc = dsrt__cpu_fused_relu_bwd(be, p, i))) goto out;
    {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_weights_desc_init(
            &bd, conv_alg, &src_any, &w_any, bias, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "convolution backward weights", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "convolution backward weights", L)))
            goto out;
        int taken;
        if ((rc = dw_filter_plan(be, p, i, bpd, &taken)) ||
            (!taken && (rc = pw_filter_plan(be, p, i, bpd, &taken)))) {
            dnnl_primitive_desc_destroy(bpd);
            goto out;
        }
        if (!taken && (rc = dsrt__cpu_weights_grad(be, p, i, bpd, &w_plain, &b_md, 1))) goto out;
    }
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_data_desc_init(
            &bd, conv_alg, &src_any, &w_any, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dsrt__cpu_fail(st, "convolution backward data", L);
            goto out;
        }
        if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, "convolution backward data", L))) goto out;
        rc = dsrt__cpu_data_grad(be, p, i, bpd, &w_plain, wplain, wfwd, 1);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

// ----------------------------------------------------------------------------
// ONNX export

static void conv_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t k[2] = {l->o.kh, l->o.kw}, s[2] = {l->o.sh, l->o.sw}, d[2] = {l->o.dh, l->o.dw};
    int64_t p[4] = {l->pt, l->pl, l->pb, l->pr};
    dsrt__onnx_attr_ints(w, "kernel_shape", k, 2);
    dsrt__onnx_attr_ints(w, "strides", s, 2);
    dsrt__onnx_attr_ints(w, "pads", p, 4);
    dsrt__onnx_attr_ints(w, "dilations", d, 2);
    dsrt__onnx_attr_int(w, "group", l->o.groups);
}

/* Conv, its weights (M, C/g, kH, kW) as the flat buffer holds them. */
static int export_onnx(onnx_export *e, const dsrt_layer *l, int i, char *out) {
    const float *params = e->net->params;
    char a[DSRT_LAYER_NAME_MAX + 32], b[DSRT_LAYER_NAME_MAX + 32], x0[DSRT_LAYER_NAME_MAX + 32];
    const char *x = dsrt__onnx_as_rank(e, l, l->inputs[0], 4, x0, sizeof x0);
    int64_t w[4] = {l->o.filters, l->in.c / l->o.groups, l->o.kh, l->o.kw}, bd[1] = {l->out.c};
    dsrt__onnx_aux_name(a, sizeof a, l, "weight");
    dsrt__onnx_aux_name(b, sizeof b, l, "bias");
    dsrt__onnx_floats(e, a, w, 4, params + l->w_off);
    if (l->b_n) dsrt__onnx_floats(e, b, bd, 1, params + l->b_off);
    const char *in[3] = {x, a, b};
    dsrt__onnx_node(e, "Conv", l->name, in, l->b_n ? 3 : 2, out, conv_attrs, l, NULL);
    return 0;
}

// ----------------------------------------------------------------------------
// ONNX import

static int map_conv(onnx_import *c) {
    onnx_val *x = dsrt__onnx_image_input(c);
    if (!x) return c->err;
    onnx_tensor *w = dsrt__onnx_const_input(c, 1, "weight"), *b = NULL;
    if (!w) return c->err;
    if (dsrt__onnx_has_input(c, 2) && !(b = dsrt__onnx_const_input(c, 2, "bias"))) return c->err;
    dsrt_shape s = dsrt__onnx_shape_of(c, x);
    int64_t g;
    int rc;
    if ((rc = dsrt__onnx_get_int(c, "group", 1, &g))) return rc;
    if (w->ndims != 4)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "weight '%s' has %d dimensions: dsrt convolves 2-D "
                               "images (4-D weights)",
                               ONNX_SHOWN(w->name), w->ndims);
    int64_t m = w->dims[0];
    if (g < 1 || g > s.c || s.c % g || m < 1 || m > (1 << 20) || m % g || w->dims[1] != s.c / g)
        return dsrt__onnx_fail(
            c, DSRT_ECORRUPT,
            "weight '%s' (%lld, %lld, %lld, %lld) and group %lld do not fit %d input "
            "channels",
            ONNX_SHOWN(w->name), (long long)w->dims[0], (long long)w->dims[1],
            (long long)w->dims[2], (long long)w->dims[3], (long long)g, s.c);
    if (b && (b->ndims != 1 || b->dims[0] != m))
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "bias '%s' has %llu values for %lld filters",
                               ONNX_SHOWN(b->name), (unsigned long long)b->count, (long long)m);
    if (w->dims[2] < 1 || w->dims[3] < 1 || w->dims[2] > 4096 || w->dims[3] > 4096)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "a %lldx%lld kernel", (long long)w->dims[2],
                               (long long)w->dims[3]);
    int kernel[2] = {(int)w->dims[2], (int)w->dims[3]};
    onnx_window win;
    dsrt_shape os;
    if ((rc = dsrt__onnx_geometry(c, &s, kernel, 1, &win)) ||
        (rc = dsrt__onnx_out_shape(c, m, win.oh, win.ow, &os)))
        return rc;
    onnx_layer *l = dsrt__onnx_add_layer(c, "conv", &x, 1);
    if (!l) return c->err;
    dsrt__onnx_opt(l, " filters=%lld", (long long)m);
    dsrt__onnx_window_opts(l, &win);
    dsrt__onnx_opt(l, " dilation=%dx%d groups=%lld bias=%d", win.dh, win.dw, (long long)g,
                   b != NULL);
    l->w = w;
    l->b = b;
    l->out = os;
    dsrt__onnx_produce(c, l, 0);
    return 0;
}

static const dsrt_onnx_op ONNX_OPS[] = {
    {"Conv", map_conv, "auto_pad,dilations,group,kernel_shape,pads,strides", 0},
    {NULL, NULL, NULL, 0},
};

// ----------------------------------------------------------------------------

const dsrt_layer_ops dsrt__layer_conv = {
    .name = "conv",
    .types = TYPES,
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = DSRT_LAYER_F_TAKES_RELU | DSRT_LAYER_F_POSTOPS,
    .build = build,
    .init = init,
    .cpu_plan = plan_conv,
    .onnx_export = export_onnx,
    .onnx_ops = ONNX_OPS,
    .example = "input size=8x7x2\nconv filters=4 size=3x2 stride=2 pad=1,2,0,1\nconv filters=4 "
               "size=3 dilation=2 pad=same groups=2\nfc outputs=3\nsoftmax\n",
};
