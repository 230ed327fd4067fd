/*
 * The GPU backend against the CPU backend, on a machine with a CUDA device
 * (exit 77, skipped, without one): every layer's forward and backward, the
 * optimizer for every solver and gradient-threshold method, dropout masks,
 * staged and uint8 batches, synchronised batchnorm through its hook, a
 * 200-step training run, determinism, and model files and checkpoints
 * moving between the CPU and the GPU; the flat buffers' alignment, and
 * batch shapes reserved before a run (then nothing more is allocated, and
 * an inference of another size borrows a larger plan's memory); steps
 * replayed from recorded CUDA graphs against the same steps launched op by
 * op (bit for bit, across a learn-rate schedule, new batch sizes and a
 * gradient hook), and model files saved on one side giving the same
 * outputs on the other in every precision; the per-layer profile. In the
 * fake build (test_fakegpu_backend) the stand-in also checks that cuDNN's
 * algorithm search saw the very pointers the steps use, that the
 * optimizer's segment table is written on the stream its kernel reads it
 * on, that no capture makes a forbidden call or leaves an event the host
 * waits on unrecorded, that the fused calls run (and their fallbacks, when
 * cuDNN refuses them, compute the same), and counts allocations. The
 * activations at their kinks against the CPU (test_activation_kinks: the
 * same gradient conventions, element by element).
 *
 * Tolerances, as the norm of the difference over the norm of the CPU's
 * tensor: fp32 1e-4, tf32 3e-3, bf16 2e-2 (layer outputs, gradients, batch
 * statistics, probabilities and the loss). Reduced precision moves a
 * gradient far only where rounding flips a ReLU gate or a max-pool choice
 * near a tie; each layer's backward is therefore compared in isolation
 * (after the input and a 1x1 convolution, only a fully connected layer
 * after it), on a batch the CPU shows to be away from ties, and whole nets'
 * gradients in fp32 (check_layers). Layers followed by batch
 * normalisation have no bias here: its gradient is zero in theory and
 * rounding noise in practice, which no relative tolerance can compare (and
 * which Adam would turn into steps of the full learning rate). The CPU backend runs direct
 * convolutions here (DSRT_CPU_CONV=direct): its Winograd arithmetic rounds
 * differently enough to blur an fp32 comparison. Dropout masks are compared
 * bit for bit (which values are zero), as are stochastic depth's (which
 * images), and the deterministic GPU mode must
 * give bit-identical weights run after run.
 */
#include "actref.h"
#include "gpu.h"
#include "nn/internal.h"
#include "task.h"
#include "testimg.h"

#include <dsrt/train.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef DSRT_FAKE_GPU
#include "fakegpu.h"
#endif

static const double TOL[] = {0, 1e-4, 3e-3, 2e-2}; /* by dsrt_precision */
static char tmpdir[4096];
/* The device under test: GPU 0, or the CPU when DSRT_TEST_GPU_SELF_CHECK=1
 * runs every comparison with the CPU on both sides, to check the test
 * itself on a machine without a GPU. */
static int G = 0;

// ----------------------------------------------------------------------------
// Helpers

/* Nets made by make_on record their steps as CUDA graphs (1) or not. */
static int make_graphs = 1;

static dsrt_net *make_on(const char *desc, int h, int w, int c, int classes, int device,
                         dsrt_precision p, int deterministic) {
    dsrt_net_options o = dsrt_net_defaults();
    o.cuda_graphs = make_graphs;
    o.threads = 2;
    o.seed = 5;
    o.device = device;
    o.precision = p;
    /* Every layer's output is compared: the ReLUs folded, but no chains
     * computed as one at inference (test_nn_infer checks those). */
    o.fuse = 1;
    /* DSRT_TEST_DETERMINISTIC=1 (the device kit under compute-sanitizer):
     * every net takes its algorithms from cuDNN's heuristics instead of
     * timing each candidate, which the sanitizer makes minutes long. */
    o.deterministic = deterministic || getenv("DSRT_TEST_DETERMINISTIC") != NULL;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, h, w, c, classes, &o);
    if (rc) fprintf(stderr, "net_create (device %d): %s\n", device, dsrt_last_error());
    REQUIRE(rc == 0);
    return net;
}

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
    dsrt_rng r = dsrt_rng_init(seed, 9, 9, 9);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)dsrt_rng_uniform(&r);
}

static void labels_for(int32_t *y, int n, int classes, uint64_t seed) {
    dsrt_rng r = dsrt_rng_init(seed, 1, 1, 1);
    for (int i = 0; i < n; i++) y[i] = (int32_t)dsrt_rng_below(&r, (uint64_t)classes);
}

/* ||a - b|| / ||b|| (absolute when b is all but zero); reports above tol. */
static int close_to(const float *a, const float *b, size_t n, double tol, const char *what) {
    double dd = 0, bb = 0;
    size_t worst = 0;
    double wd = -1;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (!isfinite(a[i])) d = INFINITY;
        dd += d * d;
        bb += (double)b[i] * b[i];
        if (fabs(d) > wd) wd = fabs(d), worst = i;
    }
    double rel = sqrt(dd) / fmax(sqrt(bb), 1e-6);
    if (rel <= tol) return 1;
    fprintf(stderr, "  %s: relative error %.3g > %.3g (worst [%zu]: gpu %.7g, cpu %.7g, of %zu)\n",
            what, rel, tol, worst, n ? (double)a[worst] : 0.0, n ? (double)b[worst] : 0.0, n);
    return 0;
}

static size_t out_count(const dsrt_net *net, int i, int n) {
    const dsrt_shape *s = &net->layers[i].out;
    return (size_t)n * s->c * s->h * s->w;
}

/* Compares every layer's output of the last forward (train or not). */
static void compare_outputs(dsrt_net *g, dsrt_net *c, int n, int train, double tol,
                            const char *tag) {
    for (int i = 0; i < c->n_layers; i++) {
        size_t m = out_count(c, i, n);
        float *a = malloc(m * sizeof *a), *b = malloc(m * sizeof *b);
        REQUIRE(a && b);
        CHECK_OK(dsrt__net_layer_output(g, i, a, train));
        CHECK_OK(dsrt__net_layer_output(c, i, b, train));
        char what[160];
        snprintf(what, sizeof what, "%s: %s output of layer %d (%s)", tag,
                 train ? "training" : "inference", i, c->layers[i].type);
        if (!close_to(a, b, m, tol, what)) test_failures++;
        free(a);
        free(b);
    }
}

// ----------------------------------------------------------------------------
// Layers, forward and backward

typedef struct {
    const char *desc;
    int h, w, c, classes, n;
} case_net;

/* Between them, every layer type and option the CPU backend has. */
static const case_net NETS[] = {
    {"input\nconv filters=5 size=3 pad=1 bias=0\nbatchnorm\nrelu\nmaxpool size=2 stride=2\n"
     "fc outputs=4\nsoftmax\n",
     8, 8, 3, 4, 6},
    {"input\nconv filters=6 size=3x2 stride=2x1 dilation=2 pad=same groups=3\n"
     "leakyrelu leak=0.2\navgpool size=3 stride=2 pad=1\nlrn size=5 alpha=0.1 beta=0.75 k=1\n"
     "gap\nfc outputs=3\nsoftmax\n",
     9, 8, 3, 3, 4},
    {"input\nconv filters=4 size=5 stride=2 pad=2,1,0,2 bias=0\nmaxpool size=3 stride=2 pad=1\n"
     "fc outputs=16 bias=0\nbatchnorm\nrelu\ndropout p=0.4\nfc outputs=5\nsoftmax\n",
     11, 10, 2, 5, 8},
    {"input\nconv filters=20 size=3 pad=1 bias=0\nbatchnorm\nrelu\nconv filters=16 size=1 bias=0\n"
     "batchnorm eps=1e-3 momentum=0.3\nleakyrelu leak=0.1\nfc outputs=3\nsoftmax\n",
     6, 6, 1, 3, 8},
    {"input normalization=zscore mean=0.4,0.5,0.6 std=0.2,0.25,0.3\n"
     "conv filters=8 size=3 stride=2\nrelu\nconv filters=8 size=3 groups=2 pad=1\nrelu\n"
     "avgpool size=2 stride=2\nfc outputs=12\nrelu\ndropout p=0.5\nfc outputs=4\nsoftmax\n",
     13, 13, 3, 4, 5},
    {"input normalization=rescale-symmetric min=0 max=1\nconv filters=4 size=3 pad=1 "
     "bias=0\nlrn size=3 alpha=1e-2 beta=0.5 k=2\nmaxpool size=2 stride=1\nfc outputs=3\n"
     "softmax\n",
     7, 7, 1, 3, 3},
    /* A graph: a residual block (its ReLU's output feeds the sum and a
     * branch), a concat of the sum and the branch, a projected skip. */
    {"input\nconv name=c1 filters=8 size=3 pad=1 bias=0\nbatchnorm\nrelu name=r1\n"
     "conv filters=8 size=3 pad=1 bias=0\nbatchnorm name=b2\nadd name=s inputs=b2,r1 relu=1\n"
     "conv name=c3 filters=4 size=1 inputs=r1\nconcat name=j inputs=s,c3\n"
     "conv name=down filters=6 size=3 stride=2 pad=1 bias=0\nbatchnorm name=bd\n"
     "conv name=proj filters=6 size=1 stride=2 bias=0 inputs=j\nbatchnorm name=bp\n"
     "add inputs=bd,bp\nrelu\ngap\nfc outputs=3\nsoftmax\n",
     6, 6, 3, 3, 4},
    /* Joins of fully connected outputs, with each other and a pooled one. */
    {"input\nconv name=c filters=4 size=3 pad=1\nfc name=a outputs=4\nfc name=b outputs=4 "
     "inputs=c\n"
     "gap name=g inputs=c\nadd inputs=a,b,g relu=1\nfc name=d outputs=5 inputs=c\n"
     "concat inputs=add_1,d,g\nfc outputs=3\nsoftmax\n",
     4, 4, 2, 3, 3},
};

/* Each layer type on its own: after the input and a 1x1 convolution
 * (which learns, so the layer under test runs its whole backward, and has
 * no gate), followed only by a fully connected layer and the loss. The
 * gradient reaching the layer passes through no ReLU gate or max-pool
 * choice that rounding could flip, and the only ties are the layer's own:
 * its forward, its backward and the parameter gradients are compared at
 * the stated tolerances in every precision. */
static const case_net ISOLATED[] = {
    {"input\nconv filters=3 size=1\nconv filters=5 size=3 pad=1\nfc outputs=4\nsoftmax\n", 8, 8, 3,
     4, 4},
    {"input\nconv filters=3 size=1\nconv filters=6 size=3x2 stride=2x1 dilation=2 pad=same "
     "groups=3\nleakyrelu leak=0.2\nfc outputs=3\nsoftmax\n",
     9, 8, 3, 3, 2},
    {"input\nconv filters=2 size=1\nconv filters=4 size=5 stride=2 pad=2,1,0,2 bias=0\nrelu\nfc "
     "outputs=5\nsoftmax\n",
     11, 10, 2, 5, 3},
    {"input\nconv filters=3 size=1 bias=0\nbatchnorm\nrelu\nfc outputs=3\nsoftmax\n", 4, 4, 3, 3,
     4},
    {"input\nconv filters=4 size=1 bias=0\nbatchnorm eps=1e-3 momentum=0.3\nleakyrelu "
     "leak=0.1\nfc outputs=3\nsoftmax\n",
     4, 4, 4, 3, 8},
    {"input\nconv filters=2 size=1\nmaxpool size=3 stride=2 pad=1\nfc outputs=3\nsoftmax\n", 9, 8,
     2, 3, 3},
    {"input\nconv filters=1 size=1\nmaxpool size=2 stride=1\nfc outputs=3\nsoftmax\n", 7, 7, 1, 3,
     3},
    {"input\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1\nfc outputs=3\nsoftmax\n", 9, 8,
     3, 3, 4},
    {"input\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1,0,0,1 count_pad=0\nfc outputs=3\n"
     "softmax\n",
     9, 8, 3, 3, 4},
    {"input\nconv filters=6 size=1\nlrn size=5 alpha=0.1 beta=0.75 k=1\nfc outputs=3\nsoftmax\n", 5,
     4, 6, 3, 4},
    {"input\nconv filters=3 size=1\nlrn size=3 alpha=1e-2 beta=0.5 k=2\nfc outputs=3\nsoftmax\n", 5,
     5, 3, 3, 3},
    {"input\nconv filters=5 size=1\ngap\nfc outputs=3\nsoftmax\n", 6, 6, 5, 3, 4},
    {"input\nfc outputs=16 bias=0\nbatchnorm\nrelu\nfc outputs=5\nsoftmax\n", 3, 3, 2, 5, 8},
    {"input\nfc outputs=12\nrelu\nfc outputs=4 bias=0\nsoftmax\n", 3, 4, 2, 4, 5},
    /* Products, layer normalisation over many pixels, padding and
     * ceil=1's partial windows. */
    {"input name=in\nconv name=x filters=4 size=1\ngap inputs=in\nfc name=g outputs=4\n"
     "mul inputs=x,g\nfc outputs=3\nsoftmax\n",
     5, 5, 3, 3, 4},
    {"input\nconv filters=3 size=1\nscale init=0.7\nfc outputs=3\nsoftmax\n", 4, 5, 3, 3, 4},
    {"input\nconv filters=20 size=1\nlayernorm eps=1e-3\nfc outputs=3\nsoftmax\n", 5, 4, 3, 3, 4},
    {"input\nconv filters=3 size=1\npad pad=1,2,0,1 value=0.25\nfc outputs=3\nsoftmax\n", 4, 4, 2,
     3, 4},
    {"input\nconv filters=3 size=1\navgpool size=3 stride=2 pad=1 ceil=1\nfc outputs=3\n"
     "softmax\n",
     8, 9, 3, 3, 4},
    {"input\nconv filters=3 size=1\navgpool size=3 stride=2 ceil=1 count_pad=0\nfc outputs=3\n"
     "softmax\n",
     8, 8, 3, 3, 4},
    {"input\nconv filters=2 size=1\nmaxpool size=3 stride=2 ceil=1\nfc outputs=3\nsoftmax\n", 8, 8,
     2, 3, 3},
};

/* The unit roundoff of a precision's products: what one rounding of an
 * input or a weight may move it by. */
static double unit_roundoff(dsrt_precision p) {
    return p == DSRT_PRECISION_BF16 ? 1.0 / 256 : p == DSRT_PRECISION_TF32 ? 1.0 / 2048 : 0x1p-24;
}

static void make_batch(const case_net *cn, uint64_t seed, float *x, int32_t *y) {
    fill(x, (size_t)cn->n * cn->c * cn->h * cn->w, seed, -1.0f, 1.0f);
    labels_for(y, cn->n, cn->classes, seed);
}

/* Moves each value by -u, 0 or +u relative, in a fixed pattern. */
static void nudge(float *v, size_t n, double u, uint64_t salt) {
    for (size_t i = 0; i < n; i++)
        v[i] *= (float)(1.0 + u * ((double)(((i + salt) * 2654435761u) % 3) - 1.0));
}

/* How far the CPU's own parameter gradients move (the worst tensor's
 * relative change, the worst of three patterns) when the batch and the
 * weights are moved by the precision's unit roundoff: the conditioning of the test problem. A batch
 * with a pre-activation or a max-pool pair within rounding of a tie moves
 * far (the gate flips), and no tolerance could separate a correct device
 * from a wrong one on it; a batch away from ties moves by about u. */
static double conditioning_by(const case_net *cn, uint64_t seed, double u, uint64_t salt) {
    dsrt_net *a = make_on(cn->desc, cn->h, cn->w, cn->c, cn->classes, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *b = make_on(cn->desc, cn->h, cn->w, cn->c, cn->classes, -1, DSRT_PRECISION_FP32, 0);
    size_t values = (size_t)cn->n * cn->c * cn->h * cn->w, np;
    float *x = malloc(values * sizeof *x), *xb = malloc(values * sizeof *xb);
    int32_t y[16];
    REQUIRE(x && xb);
    make_batch(cn, seed, x, y);
    memcpy(xb, x, values * sizeof *x);
    nudge(xb, values, u, salt);
    float *wb = dsrt_net_params(b, &np);
    nudge(wb, np, u, salt + 1);
    dsrt_net_params_changed(b);
    CHECK_OK(dsrt_net_forward_backward(a, x, y, cn->n, NULL, NULL));
    CHECK_OK(dsrt_net_forward_backward(b, xb, y, cn->n, NULL, NULL));
    const float *ga = dsrt_net_grads(a, NULL), *gb = dsrt_net_grads(b, NULL);
    double worst = 0;
    for (int i = 1; i < a->n_layers; i++) {
        const dsrt_layer *L = &a->layers[i];
        for (int k = 0; k < 2; k++) {
            size_t off = k ? L->b_off : L->w_off, m = k ? L->b_n : L->w_n;
            double dd = 0, bb = 0;
            for (size_t j = 0; j < m; j++) {
                double d = (double)ga[off + j] - gb[off + j];
                dd += d * d;
                bb += (double)ga[off + j] * ga[off + j];
            }
            if (m && bb > 0) worst = fmax(worst, sqrt(dd / bb));
        }
    }
    free(x);
    free(xb);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    return worst;
}

/* The worst of three patterns of nudges. */
static double conditioning(const case_net *cn, uint64_t seed, double u) {
    double worst = 0;
    for (uint64_t salt = 1; salt <= 3; salt++)
        worst = fmax(worst, conditioning_by(cn, seed, u, salt));
    return worst;
}

/* The first of 32 batches whose conditioning at u is within `want`, else
 * the best one; *cond gets its conditioning. */
static uint64_t pick_batch(const case_net *cn, double u, double want, double *cond) {
    uint64_t best = 1;
    double bc = INFINITY;
    for (uint64_t seed = 1; seed <= 32 && bc > want; seed++) {
        double c = conditioning(cn, seed, u);
        if (c < bc) bc = c, best = seed;
    }
    *cond = bc;
    return best;
}

/* Two training steps and an inference of net cn on the CPU and the device
 * under test, on batch `seed`: the loss, every layer's output, the running
 * statistics and the probabilities within tol, the parameter gradients
 * within gtol (not compared when gtol < 0). */
static void check_net(const case_net *cn, dsrt_precision prec, uint64_t seed, double tol,
                      double gtol, const char *tag) {
    dsrt_net *c = make_on(cn->desc, cn->h, cn->w, cn->c, cn->classes, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *g = make_on(cn->desc, cn->h, cn->w, cn->c, cn->classes, G, prec, 0);
    size_t values = (size_t)cn->n * cn->c * cn->h * cn->w;
    float *x = malloc(values * sizeof *x);
    int32_t y[16];
    REQUIRE(x);
    make_batch(cn, seed, x, y);
    for (int step = 0; step < 2; step++) {
        dsrt_net_set_iteration(c, 7 + step);
        dsrt_net_set_iteration(g, 7 + step);
        float lc, lg;
        int cc, cg;
        CHECK_OK(dsrt_net_forward_backward(c, x, y, cn->n, &lc, &cc));
        CHECK_OK(dsrt_net_forward_backward(g, x, y, cn->n, &lg, &cg));
        if (!close_to(&lg, &lc, 1, tol, tag)) test_failures++;
        if (prec == DSRT_PRECISION_FP32) CHECK_EQ(cg, cc);
        compare_outputs(g, c, cn->n, 1, tol, tag);
        const float *gc = dsrt_net_grads(c, NULL);
        const float *gg = dsrt_net_grads(g, NULL);
        REQUIRE(gc && gg);
        for (int i = 1; gtol >= 0 && i < c->n_layers; i++) {
            const dsrt_layer *L = &c->layers[i];
            char what[192];
            if (L->w_n) {
                snprintf(what, sizeof what, "%s: weight gradient of %s", tag, L->name);
                if (!close_to(gg + L->w_off, gc + L->w_off, L->w_n, gtol, what)) test_failures++;
            }
            if (L->b_n) {
                snprintf(what, sizeof what, "%s: bias gradient of %s", tag, L->name);
                if (!close_to(gg + L->b_off, gc + L->b_off, L->b_n, gtol, what)) test_failures++;
            }
        }
        size_t ns;
        const float *sc = dsrt_net_state(c, &ns);
        const float *sg = dsrt_net_state(g, NULL);
        char what[192];
        snprintf(what, sizeof what, "%s: running statistics", tag);
        if (ns && !close_to(sg, sc, ns, tol, what)) test_failures++;
    }
    /* Inference with the running statistics the training updated. */
    float *pc = malloc((size_t)cn->n * cn->classes * sizeof *pc);
    float *pg = malloc((size_t)cn->n * cn->classes * sizeof *pg);
    REQUIRE(pc && pg);
    CHECK_OK(dsrt_net_predict(c, x, cn->n, pc, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(g, x, cn->n, pg, NULL, NULL, NULL));
    if (!close_to(pg, pc, (size_t)cn->n * cn->classes, tol, "inference probabilities"))
        test_failures++;
    compare_outputs(g, c, cn->n, 0, tol, tag);
    free(pc);
    free(pg);
    free(x);
    dsrt_net_destroy(c);
    dsrt_net_destroy(g);
}

/* Layers in isolation: the batch is picked (by the CPU alone) among those
 * whose gradients move by at most half the tolerance under the precision's
 * rounding; everything is then compared at the stated tolerance. A test
 * problem that cannot be conditioned so is a failure. Whole nets: forward
 * values, running statistics and probabilities at the stated tolerance,
 * gradients at 1e-4 in fp32. Their gradients chain ReLU gates, max-pool
 * choices and batch normalisation, and a reduced-precision device rounds
 * before every one of them: no batch keeps a whole net's gates from
 * flipping, so there the gradients are left to the isolated layers. */
static void check_layers(dsrt_precision prec) {
    double tol = TOL[prec], u = unit_roundoff(prec);
    for (size_t k = 0; k < sizeof ISOLATED / sizeof ISOLATED[0]; k++) {
        double cond = 0;
        uint64_t seed =
            prec == DSRT_PRECISION_FP32 ? 1 : pick_batch(&ISOLATED[k], u, tol / 2, &cond);
        char tag[96];
        snprintf(tag, sizeof tag, "isolated %zu, %s, batch %llu", k, dsrt_precision_name(prec),
                 (unsigned long long)seed);
        if (cond > tol / 2) {
            fprintf(stderr, "  %s: no batch of 32 is away from ties (gradients move %.3g)\n", tag,
                    cond);
            test_failures++;
        }
        check_net(&ISOLATED[k], prec, seed, tol, tol, tag);
    }
    /* Every layer kind's example net (nn/layers/<kind>.c), as an isolated
     * case. */
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++) {
        const dsrt_layer_ops *o = dsrt__layers[k];
        dsrt_net *probe = NULL;
        if (!o->example || dsrt_net_create(&probe, o->example, 0, 0, 0, 0, NULL) != 0) {
            fprintf(stderr, "  %s: no example net to run\n", o->name);
            test_failures++;
            continue;
        }
        case_net cn = {o->example,     probe->input.h, probe->input.w,
                       probe->input.c, probe->classes, 4};
        dsrt_net_destroy(probe);
        double cond = 0;
        uint64_t seed = prec == DSRT_PRECISION_FP32 ? 1 : pick_batch(&cn, u, tol / 2, &cond);
        char tag[96];
        snprintf(tag, sizeof tag, "%s's example, %s, batch %llu", o->name,
                 dsrt_precision_name(prec), (unsigned long long)seed);
        if (cond > tol / 2) {
            fprintf(stderr, "  %s: no batch of 32 is away from ties (gradients move %.3g)\n", tag,
                    cond);
            test_failures++;
        }
        check_net(&cn, prec, seed, tol, tol, tag);
    }
    for (size_t k = 0; k < sizeof NETS / sizeof NETS[0]; k++) {
        char tag[96];
        snprintf(tag, sizeof tag, "net %zu, %s", k, dsrt_precision_name(prec));
        check_net(&NETS[k], prec, k + 1, tol, prec == DSRT_PRECISION_FP32 ? tol : -1, tag);
    }
}

static void test_layers_fp32(void) {
    check_layers(DSRT_PRECISION_FP32);
}

static void test_layers_tf32(void) {
    check_layers(DSRT_PRECISION_TF32);
}

static void test_layers_bf16(void) {
    check_layers(DSRT_PRECISION_BF16);
}

/*
 * The activations at their kinks and the kinks' float neighbours
 * (tests/actref.h), one a channel of one image, through an identity fully
 * connected layer, on the GPU against the CPU: fp32 and bf16 (the values
 * rounded to bfloat16 on both sides, where the neighbours fall on the
 * kinks). The second fully connected layer weighs every channel 0.01 into
 * its first output and none into the second, the label is 1, so the first
 * layer's bias gradient is 0.01 p0 times the activation's gradient: the
 * GPU's gradient conventions at the kinks must be the CPU's (PyTorch's).
 * The outputs within 1e-5 (fp32) or 2^-8 (bf16) relative, plus 1e-6; the
 * gradients within 1e-4 or 2e-2 relative, plus 1e-4 or 4e-3 of 0.01 p0
 * (sigmoid's backward reads its output, which bfloat16 holds to 2^-8: (1 -
 * y) y moves by 60% where y is near 1). A gradient convention apart at a
 * kink is 0.5 of 0.01 p0 or more.
 */
static void test_activation_kinks(void) {
    enum { K = sizeof ACT_PROBES / sizeof ACT_PROBES[0] };
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++) {
        if (prec == DSRT_PRECISION_TF32 || (G < 0 && prec != DSRT_PRECISION_FP32)) continue;
        int bf16 = prec == DSRT_PRECISION_BF16;
        for (size_t c = 0; c < sizeof ACT_CASES / sizeof ACT_CASES[0]; c++) {
            char act[96], desc[256];
            act_desc(&ACT_CASES[c], act, sizeof act);
            snprintf(desc, sizeof desc,
                     "input size=1x1x%d\nfc outputs=%d\n%s\nfc outputs=2\nsoftmax\n", K, K, act);
            dsrt_net *nets[2] = {make_on(desc, 0, 0, 0, 0, -1, DSRT_PRECISION_FP32, 0),
                                 make_on(desc, 0, 0, 0, 0, G, (dsrt_precision)prec, 0)};
            float x[K], y[2][K], g[2][K], loss;
            int32_t label = 1;
            for (int k = 0; k < K; k++)
                x[k] = bf16 ? dsrt_f32_from_bf16(dsrt_bf16_from_f32(ACT_PROBES[k])) : ACT_PROBES[k];
            for (int b = 0; b < 2; b++) {
                dsrt_net *net = nets[b];
                size_t np;
                float *w = dsrt_net_params(net, &np);
                const dsrt_layer *f1 = &net->layers[1], *f2 = &net->layers[3];
                memset(w, 0, np * sizeof *w);
                for (int k = 0; k < K; k++) {
                    w[f1->w_off + (size_t)k * K + k] = 1.0f;
                    w[f2->w_off + k] = 0.01f;
                }
                dsrt_net_params_changed(net);
                CHECK_OK(dsrt_net_forward_backward(net, x, &label, 1, &loss, NULL));
                CHECK_OK(dsrt__net_layer_output(net, 2, y[b], 1));
                const float *gr = dsrt_net_grads(net, NULL);
                REQUIRE(gr);
                memcpy(g[b], gr + f1->b_off, sizeof g[b]);
            }
            double z0 = 0;
            for (int k = 0; k < K; k++) z0 += 0.01 * y[0][k];
            double scale = 0.01 / (1 + exp(-z0)), ry = bf16 ? 1.0 / 256 : 1e-5,
                   rg = bf16 ? 2e-2 : 1e-4, ag = (bf16 ? 4e-3 : 1e-4) * scale;
            int bad = 0;
            for (int k = 0; k < K; k++) {
                int ok = fabs(y[1][k] - y[0][k]) <= ry * fabs(y[0][k]) + 1e-6 &&
                         fabs(g[1][k] - g[0][k]) <= rg * fabs(g[0][k]) + ag;
                if (!ok && bad++ < 4)
                    fprintf(stderr,
                            "  %s, %s, at %.9g: y gpu %.9g cpu %.9g, dx gpu %.9g cpu %.9g\n", act,
                            dsrt_precision_name((dsrt_precision)prec), (double)x[k],
                            (double)y[1][k], (double)y[0][k], (double)g[1][k], (double)g[0][k]);
            }
            CHECK_EQ(bad, 0);
            dsrt_net_destroy(nets[0]);
            dsrt_net_destroy(nets[1]);
        }
    }
}

/* One small net (asymmetric padding, pooling with padding, batchnorm,
 * dropout, fully connected layers) in each precision: the device kit's
 * short run under compute-sanitizer. */
static void test_small_nets(void) {
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++) {
        if (G < 0 && prec != DSRT_PRECISION_FP32) continue;
        char tag[64];
        snprintf(tag, sizeof tag, "small net, %s", dsrt_precision_name((dsrt_precision)prec));
        check_net(&NETS[2], (dsrt_precision)prec, 3, TOL[prec],
                  prec == DSRT_PRECISION_FP32 ? TOL[prec] : -1, tag);
    }
}

/* The built-in resnet20 (skip connections, projections, adds with their
 * ReLU) against the CPU backend in every precision: two training steps and
 * an inference; the gradients too in fp32. Its 20 weighted layers round
 * activations 20 times in a reduced precision (the second step also from
 * weights the first updated with such gradients): the tolerances are those
 * of a 20-layer chain, 4x a layer's (measured on the stand-in: 4.5e-2 at the
 * last layers in bf16). */
static void test_resnet20(void) {
    const case_net r20 = {"resnet20", 32, 32, 3, 10, 4};
    static const double deep[] = {0, 1e-4, 1.2e-2, 8e-2};
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++) {
        if (G < 0 && prec != DSRT_PRECISION_FP32) continue;
        char tag[64];
        snprintf(tag, sizeof tag, "resnet20, %s", dsrt_precision_name((dsrt_precision)prec));
        check_net(&r20, (dsrt_precision)prec, 9, deep[prec],
                  prec == DSRT_PRECISION_FP32 ? deep[prec] : -1, tag);
    }
}

// ----------------------------------------------------------------------------
// Dropout masks

static void test_dropout_masks(void) {
    const char *desc = "input\nfc outputs=64\nrelu\ndropout p=0.3\nfc outputs=3\nsoftmax\n";
    const int n = 16;
    dsrt_net *c = make_on(desc, 4, 4, 2, 3, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *g = make_on(desc, 4, 4, 2, 3, G, DSRT_PRECISION_FP32, 0);
    float x[16 * 32];
    int32_t y[16];
    fill(x, sizeof x / sizeof x[0], 3, -1, 1);
    labels_for(y, n, 3, 3);
    for (int it = 0; it < 3; it++) {
        dsrt_net_set_iteration(c, 1000 + it);
        dsrt_net_set_iteration(g, 1000 + it);
        CHECK_OK(dsrt_net_forward_backward(c, x, y, n, NULL, NULL));
        CHECK_OK(dsrt_net_forward_backward(g, x, y, n, NULL, NULL));
        float in[16 * 64], a[16 * 64], b[16 * 64];
        CHECK_OK(dsrt__net_layer_output(c, 2, in, 1));
        CHECK_OK(dsrt__net_layer_output(g, 3, a, 1));
        CHECK_OK(dsrt__net_layer_output(c, 3, b, 1));
        int differ = 0, dropped = 0;
        for (int j = 0; j < 16 * 64; j++) {
            if (in[j] == 0) continue; /* ReLU zeros say nothing about the mask */
            differ += (a[j] == 0) != (b[j] == 0);
            dropped += b[j] == 0;
        }
        CHECK_EQ(differ, 0);
        CHECK_GT(dropped, 0);
    }
    dsrt_net_destroy(c);
    dsrt_net_destroy(g);
    /* Stochastic depth: the same images dropped whole; at inference its
     * output is its input on both. */
    desc = "input\nfc outputs=16\nrelu\nstochastic_depth p=0.5\nfc outputs=3\nsoftmax\n";
    c = make_on(desc, 4, 4, 2, 3, -1, DSRT_PRECISION_FP32, 0);
    g = make_on(desc, 4, 4, 2, 3, G, DSRT_PRECISION_FP32, 0);
    int dropped = 0, kept = 0;
    for (int it = 0; it < 3; it++) {
        dsrt_net_set_iteration(c, 2000 + it);
        dsrt_net_set_iteration(g, 2000 + it);
        CHECK_OK(dsrt_net_forward_backward(c, x, y, n, NULL, NULL));
        CHECK_OK(dsrt_net_forward_backward(g, x, y, n, NULL, NULL));
        float in[16 * 16], a[16 * 16], b[16 * 16];
        CHECK_OK(dsrt__net_layer_output(c, 2, in, 1));
        CHECK_OK(dsrt__net_layer_output(g, 3, a, 1));
        CHECK_OK(dsrt__net_layer_output(c, 3, b, 1));
        for (int i = 0; i < n; i++) {
            int zero_a = 1, zero_b = 1, live = 0;
            for (int j = 0; j < 16; j++) {
                live |= in[i * 16 + j] != 0;
                zero_a &= a[i * 16 + j] == 0;
                zero_b &= b[i * 16 + j] == 0;
            }
            if (!live) continue;
            CHECK_EQ(zero_a, zero_b);
            dropped += zero_b, kept += !zero_b;
        }
        if (!close_to(a, b, 16 * 16, 1e-5, "stochastic depth's output")) test_failures++;
    }
    CHECK_GT(dropped, 0);
    CHECK_GT(kept, 0);
    float p1[16 * 3], p2[16 * 3], in[16 * 16], out[16 * 16];
    CHECK_OK(dsrt_net_predict(g, x, n, p1, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(c, x, n, p2, NULL, NULL, NULL));
    if (!close_to(p1, p2, 16 * 3, 1e-5, "inference past stochastic depth")) test_failures++;
    for (int k = 0; k < 2; k++) {
        dsrt_net *net = k ? g : c;
        CHECK_OK(dsrt__net_layer_output(net, 2, in, 0));
        CHECK_OK(dsrt__net_layer_output(net, 3, out, 0));
        CHECK(!memcmp(in, out, sizeof in));
    }
    dsrt_net_destroy(c);
    dsrt_net_destroy(g);
}

// ----------------------------------------------------------------------------
// The optimizer

static void test_optimizer(void) {
    const char *desc = "input\nconv filters=6 size=3 pad=1 bias=0\nbatchnorm\nrelu\nfc outputs=8\n"
                       "relu\nfc outputs=4 wlr=2 bl2=1\nsoftmax\n";
    const int n = 8;
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    float x[8 * 3 * 6 * 6];
    int32_t y[8];
    fill(x, sizeof x / sizeof x[0], 11, 0, 1);
    labels_for(y, n, 4, 11);
    for (int solver = 0; solver < 3; solver++)
        for (int clip = -1; clip < 3; clip++) {
            dsrt_optimizer_options oo = dsrt_optimizer_defaults((dsrt_solver)solver);
            if (clip >= 0) {
                oo.clip = (dsrt_grad_clip)clip;
                oo.grad_threshold = clip == DSRT_CLIP_ABSOLUTE ? 0.01 : 0.05;
            }
            dsrt_net *c = make_on(desc, 6, 6, 3, 4, -1, DSRT_PRECISION_FP32, 0);
            dsrt_net *g = make_on(desc, 6, 6, 3, 4, G, DSRT_PRECISION_FP32, 0);
            dsrt_optimizer *oc, *og;
            CHECK_OK(dsrt_optimizer_create(&oc, c, &oo));
            CHECK_OK(dsrt_optimizer_create(&og, g, &oo));
            for (int s = 0; s < 4; s++) {
                CHECK_OK(dsrt_net_forward_backward(c, x, y, n, NULL, NULL));
                CHECK_OK(dsrt_net_forward_backward(g, x, y, n, NULL, NULL));
                CHECK_OK(dsrt_optimizer_step(oc, c, s));
                CHECK_OK(dsrt_optimizer_step(og, g, s));
            }
            char what[96];
            snprintf(what, sizeof what, "solver %d, threshold method %d: weights", solver, clip);
            size_t np;
            const float *wc = dsrt_net_params(c, &np);
            if (!close_to(dsrt_net_params(g, NULL), wc, np, 1e-4, what)) test_failures++;
            /* The optimizer state comes back from the device for a
             * checkpoint, and goes on from it on the CPU. */
            char path[4200];
            snprintf(path, sizeof path, "%s/opt.dsrt", tmpdir);
            CHECK_OK(dsrt_checkpoint_save(path, g, og, NULL));
            dsrt_net *back = NULL;
            dsrt_optimizer *ob = NULL;
            CHECK_OK(dsrt_checkpoint_load(path, &back, &ob, NULL, NULL));
            for (int k = 0; k < dsrt__optimizer_n_buffers(oc); k++) {
                snprintf(what, sizeof what, "solver %d, method %d: optimizer state %d", solver,
                         clip, k);
                if (!close_to(dsrt__optimizer_state(ob, k), dsrt__optimizer_state(oc, k), np, 1e-3,
                              what))
                    test_failures++;
            }
            CHECK_EQ(dsrt__optimizer_steps(ob), 4);
            dsrt_optimizer_destroy(ob);
            dsrt_net_destroy(back);
            dsrt_optimizer_destroy(oc);
            dsrt_optimizer_destroy(og);
            dsrt_net_destroy(c);
            dsrt_net_destroy(g);
        }
#ifdef DSRT_FAKE_GPU
    /* The segment table was copied on the stream its kernel reads it on. */
    fakegpu_stats st = fakegpu_get_stats();
    CHECK(st.optim_launches > 0);
    CHECK_EQ(st.seg_table_races, 0);
#endif
}

// ----------------------------------------------------------------------------
// Staged and uint8 batches, device facts

static void test_staging(void) {
    const char *desc = "input\nconv filters=8 size=3 pad=1\nbatchnorm\nrelu\nfc outputs=5\n"
                       "softmax\n";
    const int n = 12, c = 3, h = 8, w = 8;
    size_t values = (size_t)n * c * h * w;
    uint8_t *px = dsrt_pinned_alloc(values, 0);
    float *x = dsrt_pinned_alloc(values * sizeof(float), 0);
    int32_t y[12];
    REQUIRE(px && x);
    dsrt_rng r = dsrt_rng_init(1, 2, 3, 4);
    for (size_t i = 0; i < values; i++) px[i] = (uint8_t)dsrt_rng_u64(&r);
    labels_for(y, n, 5, 2);
    const float sub[4] = {0, 0, 0, 0}, div[4] = {255, 255, 255, 255};
    dsrt__batch_u8_to_f32(px, x, n, c, h, w, sub, div);

    dsrt_net *a = make_on(desc, h, w, c, 5, 0, DSRT_PRECISION_FP32, 1);
    dsrt_net *b = make_on(desc, h, w, c, 5, 0, DSRT_PRECISION_FP32, 1);
    dsrt_net *u = make_on(desc, h, w, c, 5, 0, DSRT_PRECISION_FP32, 1);
    float la, lb, lu;
    CHECK_OK(dsrt_net_forward_backward(a, x, y, n, &la, NULL));
    dsrt_net_batch fb = {.data = x, .layout = DSRT_INPUT_F32_NCHW, .labels = y, .n = n};
    CHECK_EQ(dsrt_net_stage(b, &fb), 1); /* copied to the device */
    CHECK_OK(dsrt_net_stage_wait(b));
    CHECK_OK(dsrt_net_train_start(b, &fb));
    CHECK_OK(dsrt_net_train_finish(b, &lb, NULL));
    CHECK(la == lb);
    dsrt_net_batch ub = {.data = px, .layout = DSRT_INPUT_U8_NHWC, .labels = y, .n = n};
    memcpy(ub.sub, sub, sizeof sub);
    memcpy(ub.div, div, sizeof div);
    CHECK_EQ(dsrt_net_stage(u, &ub), 1);
    CHECK_OK(dsrt_net_train_start(u, &ub));
    CHECK_OK(dsrt_net_train_finish(u, &lu, NULL));
    CHECK(la == lu);
    size_t np;
    const float *ga = dsrt_net_grads(a, &np);
    CHECK(memcmp(ga, dsrt_net_grads(b, NULL), np * sizeof(float)) == 0);
    CHECK(memcmp(ga, dsrt_net_grads(u, NULL), np * sizeof(float)) == 0);

    /* Half the global batch: the gradient is half. */
    dsrt_net *h2 = make_on(desc, h, w, c, 5, 0, DSRT_PRECISION_FP32, 1);
    dsrt_net_batch gb = fb;
    gb.global_n = 2 * n;
    CHECK_OK(dsrt_net_train_start(h2, &gb));
    CHECK_OK(dsrt_net_train_finish(h2, NULL, NULL));
    const float *gh = dsrt_net_grads(h2, NULL);
    size_t off = 0;
    for (size_t i = 0; i < np; i++) off += 2.0f * gh[i] != ga[i];
    CHECK_EQ(off, 0);

    /* Where the numbers are, and the device's clock. */
    dsrt_backend_memory m;
    dsrt__net_memory(a, &m);
    CHECK_EQ(m.device, 0);
    CHECK(m.grads != NULL && m.grads != a->grads && m.stream != NULL);
    dsrt_net_info ni;
    dsrt_net_get_info(a, &ni);
    CHECK_STR_EQ(ni.backend, "cuda-cudnn");
    CHECK_EQ(ni.device, 0);
    CHECK_EQ(ni.precision, DSRT_PRECISION_FP32);
    CHECK_OK(dsrt_net_sync(a));
    double busy, idle;
    dsrt_net_device_time(a, &busy, &idle);
    CHECK(busy > 0 && idle >= 0);
    dsrt_net *d = make_on(desc, h, w, c, 5, 0, DSRT_PRECISION_DEFAULT, 0);
    dsrt_net_get_info(d, &ni);
    CHECK_EQ(ni.precision, DSRT_PRECISION_TF32);
    CHECK_EQ(dsrt_gpu_check(dsrt_gpu_count()), DSRT_ENODEVICE);

    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
    dsrt_net_destroy(u);
    dsrt_net_destroy(h2);
    dsrt_net_destroy(d);
    dsrt_pinned_free(px);
    dsrt_pinned_free(x);
}

// ----------------------------------------------------------------------------
// Synchronised batchnorm

/* A batchnorm hook standing for the workers' sum: factor 1 is one worker
 * (the sums unchanged), factor 2 two workers holding the same batch. It
 * notes each call; device sums are scaled on the layer's stream's order
 * (copied to the host and back after the stream's work). */
typedef struct {
    double factor;
    int device; /* where the net runs */
    int calls, bad, last_layer, last_backward;
} bn_hook;

static int bn_hook_fn(void *ctx, dsrt_bn_sums *s) {
    bn_hook *h = ctx;
    h->calls++;
    /* Forward in layer order, then backward in reverse. */
    int order =
        h->calls == 1 || (s->backward == h->last_backward
                              ? (s->backward ? s->layer < h->last_layer : s->layer > h->last_layer)
                              : s->backward || s->layer > 0);
    int size = s->n == (size_t)2 * s->channels + (s->backward ? 0 : 1) && s->channels > 0;
    int where = s->device == h->device && (h->device < 0) == (s->stream == NULL);
    if (!order || !size || !where) {
        if (h->bad++ < 3)
            fprintf(stderr, "  hook: layer %d backward %d: %zu sums of %d channels, device %d\n",
                    s->layer, s->backward, s->n, s->channels, s->device);
    }
    h->last_layer = s->layer;
    h->last_backward = s->backward;
    if (h->factor == 1) return 0;
    if (h->factor < 0) return -EIO;
    if (s->device == DSRT_DEVICE_CPU) {
        for (size_t k = 0; k < s->n; k++) s->sums[k] *= h->factor;
        return 0;
    }
    double *t = malloc(s->n * sizeof *t);
    REQUIRE(t);
    cudaStream_t st = (cudaStream_t)s->stream;
    CU(cudaMemcpyAsync(t, s->sums, s->n * sizeof *t, cudaMemcpyDeviceToHost, st));
    CU(cudaStreamSynchronize(st));
    for (size_t k = 0; k < s->n; k++) t[k] *= h->factor;
    CU(cudaMemcpyAsync(s->sums, t, s->n * sizeof *t, cudaMemcpyHostToDevice, st));
    CU(cudaStreamSynchronize(st));
    free(t);
    return 0;
}

#define BN_NET                                                                                     \
    "input\nconv filters=6 size=3 pad=1 bias=0\nbatchnorm\nrelu\nconv filters=5 size=3 stride=2 "  \
    "bias=0\nbatchnorm eps=1e-3 momentum=0.3\nleakyrelu leak=0.1\nfc outputs=8 bias=0\n"           \
    "batchnorm\nrelu\nfc outputs=3\nsoftmax\n"

/* Three SGDM steps on fixed batches; hook NULL: not synchronised. */
static dsrt_net *bn_run(int device, bn_hook *hook) {
    const int n = 8, c = 2, h = 7, w = 6;
    dsrt_net *net = make_on(BN_NET, h, w, c, 3, device, DSRT_PRECISION_FP32, 0);
    if (hook) CHECK_OK(dsrt_net_set_bn_sync(net, bn_hook_fn, hook));
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, NULL));
    float x[8 * 2 * 7 * 6];
    int32_t y[8];
    for (int s = 0; s < 3; s++) {
        fill(x, sizeof x / sizeof x[0], 40 + s, -1, 1);
        labels_for(y, n, 3, 40 + s);
        CHECK_OK(dsrt_net_forward_backward(net, x, y, n, NULL, NULL));
        if (s < 2) CHECK_OK(dsrt_optimizer_step(opt, net, 0));
    }
    dsrt_optimizer_destroy(opt);
    return net;
}

/* Weights, the last step's gradients and the running statistics within
 * tol; returns the running statistics' relative difference. */
static double bn_compare(dsrt_net *a, dsrt_net *b, double tol, const char *what) {
    char w[128];
    size_t np, ns;
    const float *pb = dsrt_net_params(b, &np);
    snprintf(w, sizeof w, "%s: weights", what);
    if (!close_to(dsrt_net_params(a, NULL), pb, np, tol, w)) test_failures++;
    const float *gb = dsrt_net_grads(b, NULL);
    snprintf(w, sizeof w, "%s: gradients", what);
    if (!close_to(dsrt_net_grads(a, NULL), gb, np, tol, w)) test_failures++;
    const float *sa = dsrt_net_state(a, &ns), *sb = dsrt_net_state(b, NULL);
    double dd = 0, bb = 0;
    for (size_t k = 0; k < ns; k++) dd += (sa[k] - sb[k]) * (sa[k] - sb[k]), bb += sb[k] * sb[k];
    return sqrt(dd / bb);
}

static void test_bn_sync(void) {
    const double tol = TOL[DSRT_PRECISION_FP32];
    const int per_step = 2 * 3; /* three batchnorm layers, forward and backward */
    bn_hook g1 = {.factor = 1, .device = G}, c1 = {.factor = 1, .device = DSRT_DEVICE_CPU};
    bn_hook g2 = {.factor = 2, .device = G}, c2 = {.factor = 2, .device = DSRT_DEVICE_CPU};
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    dsrt_net *gu = bn_run(G, NULL);
#ifdef DSRT_FAKE_GPU
    /* BN_NET's 6 and 5 channels: cuDNN's persistent NHWC kernels would read
     * them misaligned (a device fault on an H100); dsrt's kernels run them. */
    CHECK_EQ(fakegpu_get_stats().bn_ex_misaligned, 0);
#endif
    dsrt_net *ng1 = bn_run(G, &g1), *nc1 = bn_run(DSRT_DEVICE_CPU, &c1);
    dsrt_net *ng2 = bn_run(G, &g2), *nc2 = bn_run(DSRT_DEVICE_CPU, &c2);
    bn_hook *hooks[] = {&g1, &c1, &g2, &c2};
    for (int k = 0; k < 4; k++) {
        CHECK_EQ(hooks[k]->calls, 3 * per_step);
        CHECK_EQ(hooks[k]->bad, 0);
    }
    /* One worker: the synchronised run is the plain one, and the CPU's. */
    CHECK(bn_compare(ng1, gu, tol, "synchronised, one worker, against unsynchronised") <= tol);
    CHECK(bn_compare(ng1, nc1, tol, "synchronised, one worker, against the CPU") <= tol);
    /* Two identical workers: the same statistics, so the same weights and
     * gradients; only the running variance's unbiasing sees the doubled
     * count, as on the CPU. */
    CHECK(bn_compare(ng2, nc2, tol, "two identical workers against the CPU") <= tol);
    double moved = bn_compare(ng2, ng1, tol, "two identical workers against one");
    CHECK(moved > 1e-3);
    size_t ns;
    const float *s1 = dsrt_net_state(ng1, &ns), *s2 = dsrt_net_state(ng2, NULL);
    const dsrt_layer *L = &ng1->layers[2];
    REQUIRE(L->kind == DSRT_LAYER_BATCHNORM);
    if (!close_to(s2 + L->s_off, s1 + L->s_off, (size_t)L->out.c, tol, "running mean"))
        test_failures++;

    /* A failing hook fails the step. */
    bn_hook bad = {.factor = -1, .device = G};
    dsrt_net *nb = make_on(BN_NET, 7, 6, 2, 3, G, DSRT_PRECISION_FP32, 0);
    CHECK_OK(dsrt_net_set_bn_sync(nb, bn_hook_fn, &bad));
    float x[8 * 2 * 7 * 6];
    int32_t y[8];
    fill(x, sizeof x / sizeof x[0], 1, -1, 1);
    labels_for(y, 8, 3, 1);
    CHECK(dsrt_net_forward_backward(nb, x, y, 8, NULL, NULL) != 0);
    /* Inference never calls the hook. */
    CHECK_OK(dsrt_net_set_bn_sync(nb, bn_hook_fn, &g1));
    g1.calls = 0;
    float pr[8 * 3];
    CHECK_OK(dsrt_net_predict(nb, x, 8, pr, NULL, NULL, NULL));
    CHECK_EQ(g1.calls, 0);
    dsrt_net *nets[] = {gu, ng1, nc1, ng2, nc2, nb};
    for (int k = 0; k < 6; k++) dsrt_net_destroy(nets[k]);
}

// ----------------------------------------------------------------------------
// Training runs

#define SMALL_NET                                                                                  \
    "input size=16x16x1\nconv filters=8 size=3 pad=1 bias=0\nbatchnorm\nrelu\nmaxpool size=2 "     \
    "stride=2\n"                                                                                   \
    "conv filters=16 size=3 pad=1 bias=0\nbatchnorm\nrelu\ngap\nfc outputs=4\nsoftmax\n"

/* A batch of an easy four-class problem: bright centre, stripes both ways,
 * dark; with noise. */
static void problem_batch(float *x, int32_t *y, int n, uint64_t step) {
    dsrt_rng r = dsrt_rng_init(99, step, 0, 0);
    for (int i = 0; i < n; i++) {
        int k = (int)dsrt_rng_below(&r, 4);
        y[i] = k;
        for (int p = 0; p < 256; p++) {
            int row = p / 16, col = p % 16;
            float v = k == 0   ? ((row - 8) * (row - 8) + (col - 8) * (col - 8) < 20 ? 0.9f : 0.1f)
                      : k == 1 ? (row / 2 % 2 ? 0.8f : 0.2f)
                      : k == 2 ? (col / 2 % 2 ? 0.8f : 0.2f)
                               : 0.15f;
            x[(size_t)i * 256 + p] = v + 0.2f * ((float)dsrt_rng_uniform(&r) - 0.5f);
        }
    }
}

/* Trains `steps` steps, writing each step's loss into losses (may be NULL).
 * Returns the weights' checksum. */
static uint64_t run(dsrt_net *net, dsrt_optimizer *opt, int from, int steps, float *losses) {
    float x[32 * 256];
    int32_t y[32];
    for (int s = from; s < from + steps; s++) {
        problem_batch(x, y, 32, (uint64_t)s);
        float l;
        CHECK_OK(dsrt_net_forward_backward(net, x, y, 32, &l, NULL));
        CHECK_OK(dsrt_optimizer_step(opt, net, 0));
        if (losses) losses[s] = l;
    }
    return dsrt_weights_checksum(net);
}

static void test_train_200(void) {
    float lc[200], lg[200];
    dsrt_optimizer *oc, *og;
    dsrt_net *c = make_on(SMALL_NET, 0, 0, 0, 4, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *g = make_on(SMALL_NET, 0, 0, 0, 4, G, DSRT_PRECISION_FP32, 0);
    CHECK_OK(dsrt_optimizer_create(&oc, c, NULL));
    CHECK_OK(dsrt_optimizer_create(&og, g, NULL));
    run(c, oc, 0, 200, lc);
    run(g, og, 0, 200, lg);
    /* The runs follow each other: step by step at first, then in the mean
     * of each 20 steps (rounding differences grow as training goes). */
    for (int s = 0; s < 10; s++) CHECK(fabs(lg[s] - lc[s]) <= 1e-3 * fabs(lc[s]) + 1e-5);
    for (int w = 0; w < 10; w++) {
        double mc = 0, mg = 0;
        for (int s = 20 * w; s < 20 * w + 20; s++) mc += lc[s], mg += lg[s];
        if (!(fabs(mg - mc) <= 0.1 * mc + 0.02)) {
            fprintf(stderr, "  steps %d-%d: mean loss gpu %.4f, cpu %.4f\n", 20 * w, 20 * w + 19,
                    mg / 20, mc / 20);
            test_failures++;
        }
    }
    CHECK(lg[199] < 0.5 * lg[0]);
    printf("  200 steps: loss %.4f -> %.4f on the GPU, %.4f -> %.4f on the CPU\n", lg[0], lg[199],
           lc[0], lc[199]);
    dsrt_optimizer_destroy(oc);
    dsrt_optimizer_destroy(og);
    dsrt_net_destroy(c);
    dsrt_net_destroy(g);
}

static void test_deterministic(void) {
    uint64_t sums[3];
    for (int k = 0; k < 3; k++) {
        dsrt_net *g = make_on(SMALL_NET, 0, 0, 0, 4, G, DSRT_PRECISION_FP32, 1);
        dsrt_optimizer *og;
        CHECK_OK(dsrt_optimizer_create(&og, g, NULL));
        sums[k] = run(g, og, 0, 40, NULL);
        dsrt_optimizer_destroy(og);
        dsrt_net_destroy(g);
    }
    CHECK_EQ(sums[0], sums[1]);
    CHECK_EQ(sums[0], sums[2]);
}

/* Trained on one side, saved, loaded and continued on the other: the same
 * weights (to tolerance) as going on where it was. */
static void cross(int from, int to) {
    char path[4200];
    snprintf(path, sizeof path, "%s/cross.dsrt", tmpdir);
    dsrt_net *a = make_on(SMALL_NET, 0, 0, 0, 4, from, DSRT_PRECISION_FP32, 0);
    dsrt_optimizer *oa;
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    CHECK_OK(dsrt_optimizer_create(&oa, a, &oo));
    run(a, oa, 0, 10, NULL);
    dsrt_train_position pos = {0, 10, 0};
    CHECK_OK(dsrt_checkpoint_save(path, a, oa, &pos));
    dsrt_net_options no = dsrt_net_defaults();
    no.device = to;
    no.threads = 2;
    dsrt_net *b = NULL;
    dsrt_optimizer *ob = NULL;
    CHECK_OK(dsrt_checkpoint_load(path, &b, &ob, NULL, &no));
    REQUIRE(b && ob);
    size_t np;
    const float *pa = dsrt_net_params(a, &np);
    CHECK(memcmp(pa, dsrt_net_params(b, NULL), np * sizeof(float)) == 0);
    run(a, oa, 10, 10, NULL);
    run(b, ob, 10, 10, NULL);
    char what[64];
    snprintf(what, sizeof what, "trained on %d, continued on %d", from, to);
    if (!close_to(dsrt_net_params(b, NULL), dsrt_net_params(a, NULL), np, 1e-3, what))
        test_failures++;
    /* A move keeps every number. */
    float *keep = malloc(np * sizeof *keep);
    REQUIRE(keep);
    memcpy(keep, dsrt_net_params(b, NULL), np * sizeof *keep);
    CHECK_OK(dsrt_net_set_device(b, from));
    CHECK(memcmp(keep, dsrt_net_params(b, NULL), np * sizeof *keep) == 0);
    CHECK_OK(dsrt_net_set_device(b, to));
    CHECK(memcmp(keep, dsrt_net_params(b, NULL), np * sizeof *keep) == 0);
    free(keep);
    dsrt_optimizer_destroy(oa);
    dsrt_optimizer_destroy(ob);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

/* A net trained on one side in precision prec, saved, loaded on the other:
 * the same probabilities on a batch (within the precision's tolerance),
 * before and after a move; the file holds the host's order of every
 * weight, whatever order the device keeps convolution filters in. */
static void cross_outputs(int from, int to, dsrt_precision prec) {
    char path[4200];
    snprintf(path, sizeof path, "%s/cross-out.dsrt", tmpdir);
    dsrt_net *a = make_on(SMALL_NET, 0, 0, 0, 4, from, from >= 0 ? prec : DSRT_PRECISION_FP32, 0);
    dsrt_optimizer *oa;
    CHECK_OK(dsrt_optimizer_create(&oa, a, NULL));
    run(a, oa, 0, 6, NULL);
    CHECK_OK(dsrt_model_save(path, a));
    dsrt_net_options no = dsrt_net_defaults();
    no.device = to;
    no.threads = 2;
    no.precision = to >= 0 ? prec : DSRT_PRECISION_FP32;
    dsrt_net *b = NULL;
    CHECK_OK(dsrt_model_load(&b, path, &no));
    REQUIRE(b);
    size_t np;
    const float *pa = dsrt_net_params(a, &np);
    CHECK(memcmp(pa, dsrt_net_params(b, NULL), np * sizeof(float)) == 0);
    float x[16 * 256], qa[16 * 4], qb[16 * 4];
    int32_t y[16];
    problem_batch(x, y, 16, 99);
    CHECK_OK(dsrt_net_predict(a, x, 16, qa, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(b, x, 16, qb, NULL, NULL, NULL));
    char what[96];
    snprintf(what, sizeof what, "saved on %d (%s), loaded on %d: probabilities", from,
             dsrt_precision_name(prec), to);
    if (!close_to(qb, qa, 16 * 4, TOL[prec], what)) test_failures++;
    dsrt_optimizer_destroy(oa);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

static void test_cpu_gpu_files(void) {
    cross(G, -1);
    cross(-1, G);
    if (G < 0) return;
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++) {
        cross_outputs(G, -1, (dsrt_precision)prec);
        cross_outputs(-1, G, (dsrt_precision)prec);
    }
}

// ----------------------------------------------------------------------------
// Recorded steps

#define GRAPH_NET                                                                                  \
    "input size=8x8x3\nconv filters=8 size=3 pad=1\nrelu\nconv filters=8 size=3 pad=1 bias=0\n"    \
    "batchnorm\nrelu\nmaxpool size=2 stride=2\nfc outputs=16\nrelu\ndropout p=0.3\n"               \
    "fc outputs=4\nsoftmax\n"

/* Counts a grad hook's calls. */
typedef struct {
    int ready, backward;
} hook_count;

static void count_ready(void *ctx, int bucket, dsrt_range range) {
    ((hook_count *)ctx)->ready++;
}

static void count_backward(void *ctx, int end) {
    ((hook_count *)ctx)->backward++;
}

static void report(dsrt_net *net, dsrt_backend_report *r) {
    memset(r, 0, sizeof *r);
    if (net->ops->describe) net->ops->describe(net->be, r);
}

/* The phases of a run: (batch size, steps), a gradient hook from phase 3
 * on; the learn rate changes every step (piecewise, dropping each
 * "epoch"). Returns the net; losses[] gets every step's loss. */
static dsrt_net *graph_run(int graphs, float *losses, int64_t *captures, hook_count *hc) {
    static const int phases[][2] = {{8, 12}, {5, 6}, {8, 4}, {8, 6}};
    make_graphs = graphs;
    dsrt_net *net = make_on(GRAPH_NET, 0, 0, 0, 4, G, DSRT_PRECISION_FP32, 1);
    make_graphs = 1;
    dsrt_optimizer_options oo = dsrt_optimizer_defaults(DSRT_SOLVER_ADAM);
    oo.schedule = DSRT_LR_PIECEWISE;
    oo.drop_period = 1;
    oo.drop_factor = 0.9;
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, net, &oo));
    float x[8 * 3 * 8 * 8], t[8 * 4];
    int32_t y[8];
    int step = 0;
    for (size_t ph = 0; ph < DSRT_ARRAY_SIZE(phases); ph++) {
        if (ph == 3) {
            dsrt_grad_hook h = {256, 256, count_ready, count_backward, hc};
            CHECK_OK(dsrt_net_set_grad_hook(net, &h));
        }
        for (int k = 0; k < phases[ph][1]; k++, step++) {
            int n = phases[ph][0];
            fill(x, (size_t)n * 3 * 8 * 8, 70 + (uint64_t)step, -1, 1);
            labels_for(y, n, 4, 70 + (uint64_t)step);
            dsrt_net_set_iteration(net, step);
            /* Phases 0 and 2 (one shape) train against smoothed labels. */
            for (int i = 0; i < n * 4; i++) t[i] = 0.025f + (i % 4 == y[i / 4] ? 0.9f : 0.0f);
            dsrt_net_batch b = {.data = x, .layout = DSRT_INPUT_F32_NCHW, .labels = y, .n = n};
            if (ph % 2 == 0) b.soft_labels = t;
            CHECK_OK(dsrt_net_train_start(net, &b));
            CHECK_OK(dsrt_net_train_finish(net, &losses[step], NULL));
            CHECK_OK(dsrt_optimizer_step(opt, net, step));
        }
        dsrt_backend_report r;
        report(net, &r);
        captures[ph] = r.captures;
    }
    dsrt_optimizer_destroy(opt);
    return net;
}

/*
 * Steps recorded as CUDA graphs and replayed give what the same steps
 * launched op by op give, bit for bit (deterministic algorithms), with the
 * learn rate changing every step, soft targets in some (read from device memory: no new
 * recording), dropout's step too; a new batch size records again, going
 * back to a recorded size does not; a gradient hook installed mid-run cuts
 * the recording at its buckets (a new recording) and is called as often
 * as op by op. In the fake build: no forbidden call inside a capture and
 * no host wait on an event a replay does not record.
 */
static void test_graphs(void) {
    float la[28], lb[28];
    int64_t ca[4], cb[4];
    hook_count ha = {0, 0}, hb = {0, 0};
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    dsrt_net *a = graph_run(1, la, ca, &ha);
#ifdef DSRT_FAKE_GPU
    fakegpu_stats st = fakegpu_get_stats();
    CHECK(st.captures > 0 && st.graph_launches > 0);
    CHECK_EQ(st.capture_violations, 0);
    CHECK_EQ(st.stale_event_waits, 0);
    CHECK_EQ(st.seg_table_races, 0);
#endif
    dsrt_net *b = graph_run(0, lb, cb, &hb);
    CHECK(memcmp(la, lb, sizeof la) == 0);
    size_t np;
    const float *wa = dsrt_net_params(a, &np);
    CHECK(memcmp(wa, dsrt_net_params(b, NULL), np * sizeof(float)) == 0);
    CHECK(memcmp(dsrt_net_state(a, NULL), dsrt_net_state(b, NULL), a->n_state * sizeof(float)) ==
          0);
    dsrt_backend_report ra, rb;
    report(a, &ra);
    report(b, &rb);
    if (G >= 0) {
        printf("  recordings after each phase: %lld %lld %lld %lld; %lld of 28 steps replayed\n",
               (long long)ca[0], (long long)ca[1], (long long)ca[2], (long long)ca[3],
               (long long)ra.graph_steps);
        CHECK(ca[0] > 0);       /* recorded once warm */
        CHECK(ca[1] > ca[0]);   /* a new shape records again */
        CHECK_EQ(ca[2], ca[1]); /* a recorded shape replays: schedule and all */
        CHECK(ca[3] > ca[2]);   /* the hook is part of what was recorded */
        CHECK(ra.graph_steps > 10);
        CHECK_EQ(rb.captures, 0);
        CHECK_EQ(rb.graph_steps, 0);
    }
    CHECK(ha.ready > 0 && ha.ready == hb.ready && ha.backward == hb.backward);
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

#ifdef DSRT_FAKE_GPU
/* With cuDNN refusing the fused convolution and batchnorm's Ex calls, the
 * backend's fallbacks compute the same: layers against the CPU in fp32 and
 * bf16; and without refusals the fused calls did run. */
static void test_fused_fallback(void) {
    const int nets[] = {0, 3};
    long plain_fused = 0;
    for (int refuse = 0; refuse < 3; refuse++) {
        /* 2: only batchnorm fused with its ReLU is refused: plain cuDNN
         * batchnorm then, the ReLU by dsrt's kernel. */
        fakegpu_refuse(refuse == 1   ? FAKEGPU_REFUSE_FUSED_CONV | FAKEGPU_REFUSE_BN_EX
                       : refuse == 2 ? FAKEGPU_REFUSE_BN_EX_RELU
                                     : 0);
        fakegpu_reset_stats();
        for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec += 2)
            for (size_t k = 0; k < DSRT_ARRAY_SIZE(nets); k++) {
                char tag[96];
                snprintf(tag, sizeof tag, "net %d, %s, %s", nets[k],
                         dsrt_precision_name((dsrt_precision)prec),
                         refuse == 1   ? "fused calls refused"
                         : refuse == 2 ? "batchnorm with its ReLU refused"
                                       : "fused");
                check_net(&NETS[nets[k]], (dsrt_precision)prec, (uint64_t)nets[k] + 1, TOL[prec],
                          prec == DSRT_PRECISION_FP32 ? TOL[prec] : -1, tag);
                check_net(&ISOLATED[0], (dsrt_precision)prec, 1, TOL[prec], -1, tag);
            }
        fakegpu_stats st = fakegpu_get_stats();
        if (refuse == 0) plain_fused = st.bn_ex_plain;
        if (refuse == 2) {
            /* The layers that had their ReLU fused now run batchnorm alone
             * through cuDNN (more plain calls), not dsrt's kernels. */
            CHECK(st.bn_ex_calls > 0);
            CHECK_GT(st.bn_ex_plain, plain_fused);
        } else if (refuse) {
            CHECK_EQ(st.fused_convs, 0);
            CHECK_EQ(st.bn_ex_calls, 0);
        } else {
            /* bf16's convolutions fused with their bias in bfloat16 (a
             * float bias refused as cuDNN does). */
            CHECK(st.fused_convs > 0);
            CHECK(st.fused_convs_bias16 > 0);
            CHECK(st.bn_ex_calls > 0);
        }
        CHECK_EQ(st.misaligned_bias, 0);
    }
    fakegpu_refuse(0);
}

/* With cuDNN finding no algorithm for any convolution, dsrt's direct
 * convolution kernels run them: every net and the isolated convolutions
 * against the CPU, in fp32 and bf16, and the backend says so. */
static void test_conv_fallback(void) {
    fakegpu_refuse(FAKEGPU_REFUSE_CONV_ALGOS);
    fakegpu_reset_stats();
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec += 2) {
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(NETS); k++) {
            char tag[96];
            snprintf(tag, sizeof tag, "net %zu, %s, no cuDNN algorithm", k,
                     dsrt_precision_name((dsrt_precision)prec));
            check_net(&NETS[k], (dsrt_precision)prec, (uint64_t)k + 11, TOL[prec],
                      prec == DSRT_PRECISION_FP32 ? TOL[prec] : -1, tag);
        }
        for (int k = 0; k < 3; k++)
            check_net(&ISOLATED[k], (dsrt_precision)prec, 5, TOL[prec], -1,
                      "isolated convolution, no cuDNN algorithm");
    }
    CHECK(fakegpu_launches("conv_fwd_kernel") > 0);
    dsrt_net *g = make_on(NETS[1].desc, NETS[1].h, NETS[1].w, NETS[1].c, NETS[1].classes, G,
                          DSRT_PRECISION_FP32, 0);
    float x[4 * 3 * 9 * 8];
    int32_t y[4];
    fill(x, sizeof x / sizeof x[0], 3, -1, 1);
    labels_for(y, 4, 3, 3);
    CHECK_OK(dsrt_net_forward_backward(g, x, y, 4, NULL, NULL));
    CHECK_CONTAINS(g->backend_note, "cuDNN has no forward algorithm: dsrt's direct convolution");
    dsrt_net_destroy(g);
    fakegpu_refuse(0);
}
#endif

// ----------------------------------------------------------------------------
// Inference plans: batchnorm folded into the convolution before it

/* Convolutions without and with a bias followed by batchnorm with its ReLU,
 * alone, then a leaky ReLU; a convolution that another layer takes too (its
 * batchnorm is not folded); a dropout between a convolution and its
 * batchnorm; a residual add with its ReLU after a convolution and its
 * batchnorm, the shortcut its first input; a fully connected layer with a
 * batchnorm and a hard swish after it. */
static const char FOLD_NET[] =
    "input size=8x8x3\nconv name=c1 filters=8 size=3 pad=1 bias=0\nbatchnorm name=b1\nrelu "
    "name=r1\n"
    "conv name=c2 filters=8 size=3 pad=1\nbatchnorm name=b2\nleakyrelu name=l2 leak=0.1\n"
    "conv name=c5 filters=8 size=3 pad=1 bias=0\nbatchnorm name=b5\nadd name=s5 inputs=l2,b5 "
    "relu=1\n"
    "conv name=c3 filters=6 size=1 bias=0\nbatchnorm name=b3\nadd name=s inputs=b3,c3 relu=1\n"
    "conv name=c4 filters=6 size=3 stride=2 pad=1 bias=0\ndropout name=d4 p=0.3\n"
    "batchnorm name=b4\nrelu name=r4\ngap\nfc name=f5 outputs=6\nbatchnorm name=fb\n"
    "hardswish name=fh\nfc outputs=4\nsoftmax\n";

/* What a net's fused inference plan is checked for: the layers whose
 * outputs it holds no more (the convolutions whose chains go on, and the
 * chains' layers but the last), those the CPU's plan alone may also refuse
 * (it takes on more than one activation), and in the fake build the
 * launches of up to three kernels in one inference (-1: not counted, -2:
 * some). Without names, only the scores are compared. */
typedef struct {
    const char *gone[16];
    const char *cpu_gone[4];
    struct {
        const char *kernel;
        long runs;
    } count[4];
} fold_spec;

/* FOLD_NET: only b3 runs batchnorm's kernel; the leaky ReLU after b2 is
 * computed by c2, the residual add s5 by c5, the hard swish after fb by
 * f5; only s runs the sum kernel. */
static const fold_spec FOLD_SPEC = {
    {"c1", "b1", "c2", "b2", "c5", "b5", "c4", "d4", "b4", "f5", "fb"},
    {NULL},
    {{"bn_apply_kernel", 1}, {"relu_fwd_kernel", 0}, {"act_fwd_kernel", 0}, {"sum_kernel", 1}},
};

/* A built-in net: the scores, and no batchnorm kernel. */
static const fold_spec BUILTIN_SPEC = {{NULL}, {NULL}, {{"bn_apply_kernel", 0}, {NULL, 0}}};

static int named(const char *const *names, size_t n, const char *name) {
    for (size_t k = 0; k < n && names[k]; k++)
        if (!strcmp(names[k], name)) return 1;
    return 0;
}

static dsrt_net *make_infer(const char *desc, int classes, int device, dsrt_precision p, int fuse) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 2;
    o.seed = 5;
    o.device = device;
    o.precision = p;
    o.fuse = fuse;
    o.deterministic = getenv("DSRT_TEST_DETERMINISTIC") != NULL;
    dsrt_net *net = NULL;
    int rc = dsrt_net_create(&net, desc, 0, 0, 0, classes, &o);
    if (rc) fprintf(stderr, "net_create (device %d): %s\n", device, dsrt_last_error());
    REQUIRE(rc == 0);
    return net;
}

/* Random biases and batchnorm parameters and statistics (scale, offset,
 * running mean, running variance), written into both nets. */
static void fold_randomise(dsrt_net *a, dsrt_net *b, uint64_t seed) {
    size_t np, ns;
    float *w = dsrt_net_params(a, &np), *st = dsrt_net_state(a, &ns);
    REQUIRE(w && (st || !ns));
    dsrt_rng r = dsrt_rng_init(seed, 4, 4, 4);
    for (int i = 0; i < a->n_layers; i++) {
        const dsrt_layer *l = &a->layers[i];
        for (size_t k = 0; k < l->b_n; k++) w[l->b_off + k] = (float)(dsrt_rng_uniform(&r) - 0.5);
        if (l->kind != DSRT_LAYER_BATCHNORM) continue;
        for (int k = 0; k < l->out.c; k++) {
            w[l->w_off + k] = (float)(0.6 + 0.8 * dsrt_rng_uniform(&r));
            st[l->s_off + k] = (float)(0.4 * (dsrt_rng_uniform(&r) - 0.5));
            st[l->s_off + l->out.c + k] = (float)(0.5 + dsrt_rng_uniform(&r));
        }
    }
    memcpy(dsrt_net_params(b, NULL), w, np * sizeof *w);
    if (ns) memcpy(dsrt_net_state(b, NULL), st, ns * sizeof *st);
    dsrt_net_params_changed(a);
    dsrt_net_params_changed(b);
}

/* One inference of n images on the fused net f (on the device) and the
 * reference r (the CPU, fuse 0): the scores before the softmax within tol,
 * and on a graph (spec names layers) every layer's output that f still
 * holds, those spec says are gone refused. With sync, r takes f's
 * parameters and state first (after f's forward, which folds them from the
 * device's newer copies). In the fake build: the kernels spec counts ran
 * as many times (batchnorm's: only for those not folded). */
static void fold_compare(dsrt_net *f, dsrt_net *r, int n, uint64_t seed, int sync, double tol,
                         const fold_spec *spec, const char *tag) {
    int graph = spec->gone[0] != NULL;
    /* A graph: every layer read back, so every output kept; a built-in net:
     * the scores alone, its plan reusing dead outputs' bytes. */
    f->keep_outputs = graph;
    size_t per = (size_t)f->input.c * f->input.h * f->input.w;
    int last = f->n_layers - 1;
    float *x = malloc((size_t)n * per * sizeof *x);
    REQUIRE(x);
    fill(x, (size_t)n * per, seed, -1.0f, 1.0f);
#ifdef DSRT_FAKE_GPU
    fakegpu_reset_stats();
#endif
    CHECK_OK(dsrt_net_predict(f, x, n, NULL, NULL, NULL, NULL));
#ifdef DSRT_FAKE_GPU
    for (size_t k = 0; G >= 0 && k < DSRT_ARRAY_SIZE(spec->count) && spec->count[k].kernel; k++) {
        long runs = fakegpu_launches(spec->count[k].kernel);
        if (spec->count[k].runs == -2 ? runs > 0
                                      : spec->count[k].runs < 0 || runs == spec->count[k].runs)
            continue;
        fprintf(stderr, "  %s, batch %d: %s launched %ld times, want %ld\n", tag, n,
                spec->count[k].kernel, runs, spec->count[k].runs);
        test_failures++;
    }
#endif
    if (sync) {
        size_t np, ns;
        const float *w = dsrt_net_params(f, &np), *st = dsrt_net_state(f, &ns);
        REQUIRE(w && (st || !ns));
        memcpy(dsrt_net_params(r, NULL), w, np * sizeof *w);
        if (ns) memcpy(dsrt_net_state(r, NULL), st, ns * sizeof *st);
        dsrt_net_params_changed(r);
    }
    CHECK_OK(dsrt_net_predict(r, x, n, NULL, NULL, NULL, NULL));
    if (!graph) {
        size_t held, each;
        CHECK_OK(dsrt_net_activation_bytes(f, n, 0, &held, &each));
        CHECK(held > 0 && held < each);
    }
    /* The graph: every layer; a built-in net: the scores. */
    for (int i = graph ? 1 : f->layers[last].inputs[0]; i < last; i++) {
        size_t m = out_count(f, i, n);
        float *a = malloc(m * sizeof *a), *b = malloc(m * sizeof *b);
        REQUIRE(a && b);
        int gone = graph && named(spec->gone, DSRT_ARRAY_SIZE(spec->gone), f->layers[i].name);
        int rc = dsrt__net_layer_output(f, i, a, 0);
        char what[160];
        snprintf(what, sizeof what, "%s, batch %d: inference output of layer %d (%s)", tag, n, i,
                 f->layers[i].name);
        if (rc) {
            if (!gone && !(G < 0 && named(spec->cpu_gone, DSRT_ARRAY_SIZE(spec->cpu_gone),
                                          f->layers[i].name))) {
                fprintf(stderr, "  %s: refused: %s\n", what, dsrt_last_error());
                test_failures++;
            }
            CHECK_CONTAINS(dsrt_last_error(), "fused into");
        } else {
            if (gone) {
                fprintf(stderr, "  %s: read, but the fused plan does not hold it\n", what);
                test_failures++;
            }
            CHECK_OK(dsrt__net_layer_output(r, i, b, 0));
            if (!close_to(a, b, m, tol, what)) test_failures++;
        }
        free(a);
        free(b);
    }
    free(x);
}

/* A net built for inference with fuse 2 on the device against the CPU
 * backend with nothing fused: at two batch sizes, after new parameters and
 * statistics, and after a training step on the device (the folded copies
 * made again from the device's parameters and statistics). */
static void fold_check(const char *desc, int classes, dsrt_precision prec, double tol,
                       const fold_spec *spec, const char *tag) {
    dsrt_net *f = make_infer(desc, classes, G, prec, 2);
    dsrt_net *r = make_infer(desc, classes, -1, DSRT_PRECISION_FP32, 0);
    fold_randomise(f, r, 1);
    fold_compare(f, r, 3, 21, 0, tol, spec, tag);
    fold_compare(f, r, 8, 22, 0, tol, spec, tag);
    fold_randomise(f, r, 2);
    fold_compare(f, r, 3, 23, 0, tol, spec, tag);
    dsrt_optimizer *opt;
    CHECK_OK(dsrt_optimizer_create(&opt, f, NULL));
    size_t per = (size_t)f->input.c * f->input.h * f->input.w;
    float *x = malloc(4 * per * sizeof *x);
    int32_t y[4];
    REQUIRE(x);
    fill(x, 4 * per, 31, -1.0f, 1.0f);
    labels_for(y, 4, classes, 31);
    CHECK_OK(dsrt_net_forward_backward(f, x, y, 4, NULL, NULL));
    CHECK_OK(dsrt_optimizer_step(opt, f, 0));
    fold_compare(f, r, 3, 24, 1, tol, spec, tag);
    fold_compare(f, r, 8, 25, 0, tol, spec, tag);
    free(x);
    dsrt_optimizer_destroy(opt);
    dsrt_net_destroy(f);
    dsrt_net_destroy(r);
}

/* fold_check of a graph of four classes at a layer's tolerance, in the
 * fake build also with cuDNN's fused convolution refused (the bias and
 * the activation by dsrt's kernel). */
static void fold_check_graph(const char *desc, const fold_spec *spec, dsrt_precision prec,
                             const char *name) {
    char tag[96];
    for (int refuse = 0; refuse < 2; refuse++) {
#ifdef DSRT_FAKE_GPU
        fakegpu_refuse(refuse ? FAKEGPU_REFUSE_FUSED_CONV : 0);
#else
        if (refuse) break;
#endif
        snprintf(tag, sizeof tag, "%s, %s%s", name, dsrt_precision_name(prec),
                 refuse ? ", fused convolution refused" : "");
        fold_check(desc, 4, prec, TOL[prec], spec, tag);
    }
#ifdef DSRT_FAKE_GPU
    fakegpu_refuse(0);
#endif
}

/* Batchnorm folded into the convolutions before it at inference (net
 * option fuse 2): a graph of the cases above and the built-in cifar and
 * resnet20, every precision against the CPU at the tolerances of a layer
 * (the graph) and of a deep net (test_resnet20's). In the fake build also
 * with cuDNN's fused convolution refused (the bias and ReLU by dsrt's
 * kernel), and the batchnorm kernel counted: only b3 runs. */
static void test_infer_fold(void) {
    static const double deep[] = {0, 1e-4, 1.2e-2, 8e-2};
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++) {
        if (G < 0 && prec != DSRT_PRECISION_FP32) continue;
        const char *pn = dsrt_precision_name((dsrt_precision)prec);
        char tag[96];
        fold_check_graph(FOLD_NET, &FOLD_SPEC, (dsrt_precision)prec, "folded graph");
        snprintf(tag, sizeof tag, "folded cifar, %s", pn);
        fold_check("cifar", 10, (dsrt_precision)prec, deep[prec], &BUILTIN_SPEC, tag);
        snprintf(tag, sizeof tag, "folded resnet20, %s", pn);
        fold_check("resnet20", 10, (dsrt_precision)prec, deep[prec], &BUILTIN_SPEC, tag);
    }
#ifdef DSRT_FAKE_GPU
    /* resnet20's convolutions have no bias of their own: at inference they
     * run fused with the folded one. */
    dsrt_net *f = make_infer("resnet20", 10, G, DSRT_PRECISION_FP32, 2);
    float x[2 * 3 * 32 * 32];
    fill(x, sizeof x / sizeof x[0], 41, -1.0f, 1.0f);
    fakegpu_reset_stats();
    CHECK_OK(dsrt_net_predict(f, x, 2, NULL, NULL, NULL, NULL));
    fakegpu_stats st = fakegpu_get_stats();
    CHECK_GT(st.fused_convs, 0);
    CHECK_EQ(st.search_mismatches, 0);
    dsrt_backend_report rep;
    report(f, &rep);
    CHECK_GT(rep.fused_cudnn, 0);
    dsrt_net_destroy(f);
#endif
}

/* Each activation kind after a convolution, with and without a batchnorm
 * between and a dropout (the identity at inference) before it: at
 * inference the convolution's bias kernel computes it. A sigmoid after a
 * batchnorm with its ReLU (two functions: it runs, on the CPU it is taken
 * on too) and a clip after a convolution that the add takes too run their
 * kernels. */
static const char ACT_NET[] =
    "input size=8x8x3\n"
    "conv name=c1 filters=8 size=3 pad=1 bias=0\nbatchnorm name=b1\nrelu6 name=a1\n"
    "conv name=c2 filters=8 size=3 pad=1\nhardswish name=a2\n"
    "conv name=c3 filters=8 size=1 bias=0\nbatchnorm name=b3\nsigmoid name=a3\n"
    "conv name=c4 filters=8 size=3 pad=1 bias=0\nbatchnorm name=b4\nsilu name=a4\n"
    "conv name=c5 filters=8 size=1\ndropout name=d5 p=0.2\ngelu name=a5\n"
    "conv name=c6 filters=8 size=1 bias=0\nbatchnorm name=b6\ngelu name=a6 approximate=tanh\n"
    "conv name=c7 filters=8 size=1\nhardsigmoid name=a7\n"
    "conv name=c8 filters=8 size=1\ndropout name=d8 p=0.2\nleakyrelu name=a8 leak=0.1\n"
    "conv name=c9 filters=8 size=1 bias=0\nbatchnorm name=b9\nrelu name=r9\n"
    "sigmoid name=a9\n"
    "conv name=c10 filters=8 size=1\nclip name=a10 min=-0.5 max=0.5\n"
    "add name=s inputs=a10,c10\ngap\nfc outputs=4\nsoftmax\n";

/* Only a9's and a10's activation kernels run, no ReLU or batchnorm
 * kernel; the bias kernel computes the others. */
static const fold_spec ACT_SPEC = {
    {"c1", "b1", "c2", "c3", "b3", "c4", "b4", "c5", "d5", "c6", "b6", "c7", "c8", "d8", "c9",
     "b9"},
    {"r9"},
    {{"act_fwd_kernel", 2}, {"relu_fwd_kernel", 0}, {"bias_act_kernel", -2}},
};

/* Activations computed by the convolution before them at inference (net
 * option fuse 2): ACT_NET in every precision against the CPU with nothing
 * fused, every layer's output the plan holds, at two batch sizes, after
 * new parameters and a training step (fold_check); in the fake build also
 * with cuDNN's fused convolution refused, the kernels counted. */
static void test_infer_act(void) {
    for (int prec = DSRT_PRECISION_FP32; prec <= DSRT_PRECISION_BF16; prec++)
        if (G >= 0 || prec == DSRT_PRECISION_FP32)
            fold_check_graph(ACT_NET, &ACT_SPEC, (dsrt_precision)prec, "activations");
}

// ----------------------------------------------------------------------------
// Profile

/* Every layer that computes has a forward time, every one with parameters
 * a backward time; steps and the optimizer counted, replays included. */
static void test_profile(void) {
    dsrt_net *g =
        make_on(GRAPH_NET, 0, 0, 0, 4, G, G >= 0 ? DSRT_PRECISION_BF16 : DSRT_PRECISION_FP32, 0);
    dsrt_optimizer *og;
    CHECK_OK(dsrt_optimizer_create(&og, g, NULL));
    float x[8 * 3 * 8 * 8];
    int32_t y[8];
    fill(x, sizeof x / sizeof x[0], 5, -1, 1);
    labels_for(y, 8, 4, 5);
    dsrt_net_profile pr;
    CHECK_EQ(dsrt_net_profile_read(g, &pr, NULL, 0), -ENOENT);
    for (int s = 0; s < 9; s++) {
        if (s == 2) CHECK_OK(dsrt_net_profile_start(g));
        CHECK_OK(dsrt_net_forward_backward(g, x, y, 8, NULL, NULL));
        CHECK_OK(dsrt_optimizer_step(og, g, 0));
    }
    dsrt_net_profile_stop(g);
    CHECK_OK(dsrt_net_forward_backward(g, x, y, 8, NULL, NULL)); /* not timed */
    dsrt_layer_profile lp[16];
    int n = dsrt_net_profile_read(g, &pr, lp, 16);
    REQUIRE(n == g->n_layers);
    CHECK_EQ(pr.steps, 7);
    CHECK_EQ(pr.device_events, G >= 0);
    CHECK(pr.step_ms > 0 && pr.layers_ms > 0 && pr.optimizer_ms > 0);
    CHECK(pr.gaps_per_step > 0 && pr.gaps_ms >= 0);
    for (int i = 1; i < n; i++) {
        const dsrt_layer *L = &g->layers[i];
        if (L->fused_away) {
            CHECK(lp[i].forward_ms == 0 && lp[i].backward_ms == 0);
            continue;
        }
        CHECK(lp[i].forward_ms > 0);
        if (L->w_n) CHECK(lp[i].backward_ms > 0);
    }
    if (G >= 0) {
        CHECK(pr.graph_steps > 0 && pr.captures > 0 && pr.graphs);
        /* Whether cuDNN fused the bf16 convolutions (with a bfloat16 bias)
         * or dsrt's kernel added the bias is cuDNN's choice: reported. */
        printf("  profile: %.3f ms a step (layers %.3f, optimizer %.3f), gaps %.3f ms in %.0f; "
               "%lld of %lld steps replayed; %d layers fused by cuDNN, %d by a dsrt kernel\n",
               pr.step_ms, pr.layers_ms, pr.optimizer_ms, pr.gaps_ms, pr.gaps_per_step,
               (long long)pr.graph_steps, (long long)pr.steps, (int)pr.fused_library,
               (int)pr.fused_kernel);
    }
    dsrt_optimizer_destroy(og);
    dsrt_net_destroy(g);
}

// ----------------------------------------------------------------------------
// Device memory: alignment, reserved shapes

/* params, grads and state start on 256-byte boundaries whatever the counts
 * (this net has an odd number of parameters), in fp32 and bf16; in the
 * fake build the algorithm search saw the pointers the steps use. */
static void test_flat_alignment(void) {
    const char *desc = "input\nconv filters=3 size=3 pad=1\nbatchnorm\nrelu\n"
                       "conv filters=5 size=3 stride=2\nfc outputs=7\nsoftmax\n";
    const dsrt_precision precs[] = {DSRT_PRECISION_FP32, DSRT_PRECISION_BF16};
    float x[4 * 3 * 9 * 9];
    int32_t y[4];
    fill(x, sizeof x / sizeof x[0], 5, 0, 1);
    labels_for(y, 4, 7, 5);
    for (size_t k = 0; k < (G >= 0 ? DSRT_ARRAY_SIZE(precs) : 1); k++) {
#ifdef DSRT_FAKE_GPU
        fakegpu_reset_stats();
#endif
        dsrt_net *g = make_on(desc, 9, 9, 3, 7, G, precs[k], 0);
        size_t np, ns;
        dsrt_net_params(g, &np);
        dsrt_net_state(g, &ns);
        CHECK(np % 2 == 1 && ns > 0);
        dsrt_backend_memory m;
        dsrt__net_memory(g, &m);
        if (G >= 0) {
            CHECK_EQ((uintptr_t)m.params % 256, 0);
            CHECK_EQ((uintptr_t)m.grads % 256, 0);
            CHECK_EQ((uintptr_t)m.state % 256, 0);
        }
        for (int s = 0; s < 2; s++) CHECK_OK(dsrt_net_forward_backward(g, x, y, 4, NULL, NULL));
#ifdef DSRT_FAKE_GPU
        fakegpu_stats st = fakegpu_get_stats();
        CHECK(st.search_checked >= 6); /* two convolutions, three directions */
        CHECK_EQ(st.search_mismatches, 0);
#endif
        dsrt_net_destroy(g);
    }
}

/* Shapes reserved before training (batches of 12 and a last one of 5,
 * inference of 9 and 4): steps of those sizes and an inference of 7 (in
 * the memory of the plan for 9) give the CPU's results, and in the fake
 * build nothing is allocated or freed after the reservation. */
static void test_reserve(void) {
    const char *desc = "input\nconv filters=4 size=3 pad=1 bias=0\nbatchnorm\nrelu\n"
                       "maxpool size=2 stride=2\nfc outputs=5\nsoftmax\n";
    const int h = 8, w = 8, c = 3;
    float x[12 * 3 * 8 * 8];
    int32_t y[12];
    fill(x, sizeof x / sizeof x[0], 9, 0, 1);
    labels_for(y, 12, 5, 9);
    dsrt_net *nc = make_on(desc, h, w, c, 5, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *ng = make_on(desc, h, w, c, 5, G, DSRT_PRECISION_FP32, 0);
    dsrt_net_reserve r;
    memset(&r, 0, sizeof r);
    r.train_n[0] = 12, r.train_n[1] = 5, r.n_train = 2;
    r.infer_n[0] = 9, r.infer_n[1] = 4, r.n_infer = 2;
    r.layout = r.infer_layout = DSRT_INPUT_F32_NCHW;
    r.opt_buffers = 1;
    CHECK_OK(dsrt__net_reserve(nc, &r));
    CHECK_OK(dsrt__net_reserve(ng, &r));
    r.train_n[0] = 0;
    CHECK_EQ(dsrt__net_reserve(ng, &r), -EINVAL);
    r.train_n[0] = 12;
    dsrt_optimizer *oc, *og;
    CHECK_OK(dsrt_optimizer_create(&oc, nc, NULL));
    CHECK_OK(dsrt_optimizer_create(&og, ng, NULL));
#ifdef DSRT_FAKE_GPU
    fakegpu_stats before = fakegpu_get_stats();
#endif
    const int sizes[] = {12, 5, 12, 5};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(sizes); k++) {
        float lc, lg;
        CHECK_OK(dsrt_net_forward_backward(nc, x, y, sizes[k], &lc, NULL));
        CHECK_OK(dsrt_net_forward_backward(ng, x, y, sizes[k], &lg, NULL));
        if (!close_to(&lg, &lc, 1, TOL[DSRT_PRECISION_FP32], "reserved step loss")) test_failures++;
        CHECK_OK(dsrt_optimizer_step(oc, nc, 0));
        CHECK_OK(dsrt_optimizer_step(og, ng, 0));
    }
    const int infer[] = {9, 4, 7, 9};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(infer); k++) {
        float pc[12 * 5], pg[12 * 5];
        CHECK_OK(dsrt_net_predict(nc, x, infer[k], pc, NULL, NULL, NULL));
        CHECK_OK(dsrt_net_predict(ng, x, infer[k], pg, NULL, NULL, NULL));
        char what[64];
        snprintf(what, sizeof what, "reserved inference of %d", infer[k]);
        if (!close_to(pg, pc, (size_t)infer[k] * 5, TOL[DSRT_PRECISION_FP32], what))
            test_failures++;
    }
    size_t np;
    const float *wc = dsrt_net_params(nc, &np);
    if (!close_to(dsrt_net_params(ng, NULL), wc, np, 1e-4, "reserved: weights")) test_failures++;
#ifdef DSRT_FAKE_GPU
    fakegpu_stats after = fakegpu_get_stats();
    CHECK_EQ(after.mallocs, before.mallocs);
    CHECK_EQ(after.frees, before.frees);
    CHECK_EQ(after.host_allocs, before.host_allocs);
#endif
    dsrt_optimizer_destroy(oc);
    dsrt_optimizer_destroy(og);
    dsrt_net_destroy(nc);
    dsrt_net_destroy(ng);
}

/* The loss and every parameter gradient of one training step on batch b. */
static float soft_step(dsrt_net *net, const dsrt_net_batch *b, float *grads) {
    float loss = NAN;
    int correct = -1;
    CHECK_OK(dsrt_net_train_start(net, b));
    CHECK_OK(dsrt_net_train_finish(net, &loss, &correct));
    CHECK(correct >= 0);
    size_t np;
    const float *g = dsrt_net_grads(net, &np);
    REQUIRE(g);
    memcpy(grads, g, np * sizeof *g);
    return loss;
}

/* Soft labels (mixup, cutmix, label smoothing): the device's loss and
 * gradients against mixed and smoothed targets equal the CPU backend's
 * within fp32's tolerance, two steps running; one-hot targets give what the
 * hard labels give. */
static void test_soft_labels(void) {
    const char *desc = "input\nconv filters=3 size=3 pad=1\nrelu\nfc outputs=5\nsoftmax\n";
    enum { N = 8, K = 5 };
    float x[N * 2 * 4 * 4], t[N * K], hot[N * K];
    int32_t y[N];
    fill(x, sizeof x / sizeof x[0], 3, -1, 1);
    labels_for(y, N, K, 3);
    /* Mixed with the batch reversed (timm's batch mode), then smoothed. */
    const float lam = 0.7f, eps = 0.1f;
    memset(hot, 0, sizeof hot);
    for (int i = 0; i < N; i++) {
        hot[i * K + y[i]] = 1.0f;
        for (int j = 0; j < K; j++) {
            float m = (j == y[i] ? lam : 0.0f) + (j == y[N - 1 - i] ? 1.0f - lam : 0.0f);
            t[i * K + j] = m * (1.0f - eps) + eps / K;
        }
    }
    dsrt_net *c = make_on(desc, 4, 4, 2, K, -1, DSRT_PRECISION_FP32, 0);
    dsrt_net *g = make_on(desc, 4, 4, 2, K, G, DSRT_PRECISION_FP32, 0);
    size_t np;
    REQUIRE(dsrt_net_grads(c, &np));
    float *gc = malloc(np * sizeof *gc), *gg = malloc(np * sizeof *gg);
    REQUIRE(gc && gg);
    dsrt_net_batch b = {
        .data = x, .layout = DSRT_INPUT_F32_NCHW, .labels = y, .n = N, .soft_labels = t};
    for (int step = 0; step < 2; step++) {
        float lc = soft_step(c, &b, gc), lg = soft_step(g, &b, gg);
        fprintf(stderr, "  soft targets, step %d: loss %.9g (CPU %.9g)\n", step, lg, lc);
        if (!close_to(&lg, &lc, 1, TOL[DSRT_PRECISION_FP32], "soft targets: loss")) test_failures++;
        if (!close_to(gg, gc, np, TOL[DSRT_PRECISION_FP32], "soft targets: gradients"))
            test_failures++;
    }
    /* One-hot targets: the hard labels' loss and gradients. */
    float *gh = malloc(np * sizeof *gh);
    REQUIRE(gh);
    b.soft_labels = hot;
    float ls = soft_step(g, &b, gg);
    b.soft_labels = NULL;
    float lh = soft_step(g, &b, gh);
    fprintf(stderr, "  one-hot targets: loss %.9g, hard labels %.9g\n", ls, lh);
    if (!close_to(&ls, &lh, 1, 1e-6, "one-hot targets: loss")) test_failures++;
    if (!close_to(gg, gh, np, 1e-6, "one-hot targets: gradients")) test_failures++;
    /* A negative target is refused before any work. */
    t[3] = -0.5f;
    b.soft_labels = t;
    CHECK_EQ(dsrt_net_train_start(g, &b), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "soft label 3 of image 0");
    free(gc), free(gg), free(gh);
    dsrt_net_destroy(c);
    dsrt_net_destroy(g);
}

int main(void) {
    const char *self = getenv("DSRT_TEST_GPU_SELF_CHECK");
    if (self && !strcmp(self, "1")) {
        G = DSRT_DEVICE_CPU;
    } else if (dsrt_gpu_count() == 0) {
        printf("no usable GPU: %s\n",
               dsrt_gpu_check(0) ? dsrt_last_error() : "dsrt_gpu_count says none");
        /* The device kit sets DSRT_REQUIRE_GPU: there a skip is a failure. */
        return getenv("DSRT_REQUIRE_GPU") ? 1 : TEST_SKIP;
    }
    setenv("DSRT_CPU_CONV", "direct", 1);
    REQUIRE(timg_tmpdir("gpu", tmpdir, sizeof tmpdir) == 0);
    RUN_WANTED(test_layers_fp32);
    if (G >= 0) {
        RUN_WANTED(test_layers_tf32);
        RUN_WANTED(test_layers_bf16);
    }
    RUN_WANTED(test_small_nets);
    RUN_WANTED(test_activation_kinks);
    RUN_WANTED(test_resnet20);
    RUN_WANTED(test_dropout_masks);
    RUN_WANTED(test_optimizer);
    if (G >= 0) RUN_WANTED(test_staging);
    RUN_WANTED(test_bn_sync);
    RUN_WANTED(test_train_200);
    RUN_WANTED(test_deterministic);
    RUN_WANTED(test_cpu_gpu_files);
    RUN_WANTED(test_flat_alignment);
    RUN_WANTED(test_reserve);
    RUN_WANTED(test_graphs);
    RUN_WANTED(test_infer_fold);
    RUN_WANTED(test_infer_act);
#ifdef DSRT_FAKE_GPU
    RUN_WANTED(test_fused_fallback);
    RUN_WANTED(test_conv_fallback);
#endif
    RUN_WANTED(test_profile);
    RUN_WANTED(test_soft_labels);
    return TEST_RESULT();
}
