/*
 * The CPU backend, on oneDNN (the library PyTorch itself runs its CPU
 * convolutions on). It fills the nn ops table (internal.h) the way redis's
 * ae_epoll.c fills ae.c's: the layers only describe; this file plans and runs.
 *
 * For each batch size (and for training and inference separately) a plan is
 * built once: every layer becomes oneDNN primitives whose activations stay in
 * the layouts oneDNN prefers (blocked nChw16c and the like, chosen with
 * format_tag any), with reorders only where a primitive wants another layout:
 * at the input (NCHW float batches), before fully connected layers (plain,
 * so their weights are used straight from the flat buffer), and for the
 * convolution weights, which the flat buffer holds plain and the primitives
 * want blocked. Those weight reorders are cached: they run once per parameter
 * update (the net's version counter), not once per call. A ReLU after a
 * convolution or fully connected layer is an eltwise post-op of it, and after
 * batch normalisation the normalisation's own ReLU flag.
 *
 * Convolutions whose channel counts are off the 16-float block (digits' 20)
 * run in NHWC instead, which does not pad; oneDNN picks direct or Winograd
 * arithmetic per convolution. Fully connected layers with large weights run
 * forward as one sgemm in the orientation that streams the weights once.
 *
 * A plan is two lists of steps, forward and backward, each a primitive with
 * its arguments or a small C function (input normalisation, dropout, softmax
 * with cross-entropy, running averages). Every primitive shares one user
 * scratchpad. Threads come from the OpenMP runtime oneDNN is built on
 * (Debian's libdnnl 2.6 uses GNU OpenMP): the count is set on the calling
 * thread before planning and running.
 *
 * With a profile on (dsrt_net_profile_start), each layer's steps of a
 * training pass are timed with the clock (run_steps).
 *
 * Environment variables override the choices, for measurements:
 * DSRT_CPU_LAYOUT=blocked|nhwc (every convolution in that layout),
 * DSRT_CPU_CONV=direct (no Winograd), DSRT_CPU_WINO_TILE=2|4 (the output
 * tile of dsrt's own Winograd kernels) and DSRT_CPU_DEPTHWISE=onednn
 * (depthwise convolutions' weight gradients always oneDNN's, never dsrt's
 * own step), DSRT_CPU_POINTWISE=onednn (1x1 convolutions' likewise).
 * DSRT_MAX_CPU_ISA=scalar|avx2|avx512 caps the vector instructions of
 * dsrt's own C steps (nn/backend_cpu_kernels.c).
 */
#include "nn/backend_cpu.h"

#include "arith.h"
#include "platform/internal.h"

#include <limits.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* From the OpenMP runtime oneDNN loads (libgomp); weak so that the library
 * links and runs without it (then the count is OpenMP's default and the team
 * is not reached for binding). */
extern void omp_set_num_threads(int n) __attribute__((weak));
extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
    __attribute__((weak));
extern int omp_get_thread_num(void) __attribute__((weak));
extern int omp_get_max_threads(void) __attribute__((weak));
extern int omp_get_num_threads(void) __attribute__((weak));

#define PLAN_SLOTS DSRT_ARRAY_SIZE(((cpu_backend *)0)->plans)

// ----------------------------------------------------------------------------
// Failing, steps, memories

static int step_ready(cpu_backend *be, cpu_plan *p, int i) {
    dsrt__net_grads_ready(be->net, i);
    return 0;
}

int dsrt__cpu_fail(dnnl_status_t st, const char *what, const dsrt_layer *l) {
    if (l)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: layer '%s' (%s, line %d): %s: %s", l->name,
                          l->type, l->line, what, dnnl_status2str(st));
    return dsrt__fail(DSRT_EBACKEND, "cpu backend: %s: %s", what, dnnl_status2str(st));
}

static void set_threads(const dsrt_net *net) {
    if (net->opts.threads > 0 && omp_set_num_threads) omp_set_num_threads(net->opts.threads);
}

// ----------------------------------------------------------------------------
// Signals while oneDNN computes
//
// Some of oneDNN's JIT GEMM kernels (f32, AVX2 and AVX-512, used by fully
// connected layers among others) point rsp at a workspace in the heap while
// they run (fixed in oneDNN 3.11; Debian 12 ships 2.7). A signal handled on a
// thread inside one has its frame written there by the kernel: the heap is
// corrupted, and a later free aborts. So a thread holds the asynchronous
// signals while it runs oneDNN's kernels: a process-wide one (Ctrl-C, kill)
// goes at once to a thread that does not hold it, one sent to this thread
// (pthread_kill, a profiler's timer) when the pass is done. The OpenMP team
// that works for it holds them for good: its threads run nothing else.

/* Blocks on the calling thread every signal but those a fault raises on the
 * thread itself; the mask before into *old (may be NULL). */
static void block_async(sigset_t *old) {
    sigset_t s;
    sigfillset(&s);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&s, faults[i]);
    pthread_sigmask(SIG_BLOCK, &s, old);
}

static void team_hold_member(void *arg) {
    (void)arg;
    if (omp_get_thread_num() != 0) block_async(NULL); /* the caller: held only while it computes */
}

/* The OpenMP team's size for the net. */
static int team_size(const cpu_backend *be) {
    return be->net->opts.threads > 0 ? be->net->opts.threads
           : omp_get_max_threads     ? omp_get_max_threads()
                                     : 1;
}

int dsrt__cpu_team(const cpu_backend *be) {
    return team_size(be);
}

/* Holds the asynchronous signals on the calling thread (until
 * signals_release) and for good on its OpenMP team: threads the team starts
 * from now on inherit the caller's mask; those it already has are told once. */
static void signals_hold(cpu_backend *be, sigset_t *old) {
    block_async(old);
    if (!GOMP_parallel || !omp_get_thread_num) return;
    int n = team_size(be);
    pthread_t me = pthread_self();
    if (be->team_held >= n && pthread_equal(be->team_master, me)) return;
    GOMP_parallel(team_hold_member, NULL, (unsigned)n, 0);
    be->team_master = me;
    be->team_held = n;
}

static void signals_release(const sigset_t *old) {
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

static step *push_step(step **list, size_t *n, size_t *cap) {
    if (dsrt__grow((void **)list, cap, *n + 1, sizeof **list)) return NULL;
    step *s = &(*list)[(*n)++];
    memset(s, 0, sizeof *s);
    return s;
}

static step *fwd_step(cpu_plan *p) {
    return push_step(&p->fwd, &p->n_fwd, &p->cap_fwd);
}

static step *bwd_step(cpu_plan *p) {
    return push_step(&p->bwd, &p->n_bwd, &p->cap_bwd);
}

/* Adds an argument to a step; a NULL memory (no bias, no workspace) is left
 * out. */
void dsrt__cpu_arg(step *s, int what, dnnl_memory_t m) {
    if (!m) return;
    s->args[s->nargs].arg = what;
    s->args[s->nargs].memory = m;
    s->nargs++;
}

/* A memory of md: on handle (the flat buffers, user data), or allocated by
 * oneDNN when handle is NULL. Owned by the plan. */
int dsrt__cpu_mem(cpu_plan *p, const dnnl_memory_desc_t *md, dnnl_engine_t eng, void *handle,
                  dnnl_memory_t *out, const dsrt_layer *L) {
    *out = NULL;
    if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) return -ENOMEM;
    DN("memory", dnnl_memory_create(out, md, eng, handle ? handle : DNNL_MEMORY_ALLOCATE));
    p->mems[p->n_mems++] = *out;
    return 0;
}

const dnnl_memory_desc_t *dsrt__cpu_md_of(dnnl_memory_t m) {
    const dnnl_memory_desc_t *md = NULL;
    dnnl_memory_get_memory_desc(m, &md);
    return md;
}

void *dsrt__cpu_handle(dnnl_memory_t m) {
    void *h = NULL;
    dnnl_memory_get_data_handle(m, &h);
    return h;
}

// ----------------------------------------------------------------------------
// The gradients' pool (diff_entry)

static int diff_index(const cpu_plan *p, dnnl_memory_t m) {
    for (size_t k = p->n_diffs; k-- > 0;)
        if (p->diffs[k].mem == m) return (int)k;
    return -1;
}

/* 1 when gradient memories a and b take the same bytes (one is the other,
 * or a view of it). */
int dsrt__cpu_diff_same(const cpu_plan *p, dnnl_memory_t a, dnnl_memory_t b) {
    int ka = diff_index(p, a), kb = diff_index(p, b);
    return ka >= 0 && kb >= 0 && p->diffs[ka].base == p->diffs[kb].base;
}

/*
 * A gradient memory in layout md, its bytes given by diff_pool_make. With on
 * NULL it has bytes of its own, alive from layer lo's backward to layer hi's
 * (hi >= lo; backward runs from hi down to lo); else it is a view of on's
 * bytes (md may be a part of them), which then live over lo..hi too when
 * lo >= 0.
 */
int dsrt__cpu_diff(cpu_plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *md, int lo, int hi,
                   dnnl_memory_t on, dnnl_memory_t *out, const dsrt_layer *L) {
    *out = NULL;
    int base = -1;
    if (on) {
        int k = diff_index(p, on);
        if (k < 0)
            return dsrt__fail(DSRT_EBACKEND, "cpu backend: layer '%s': a view of no gradient",
                              L->name);
        base = p->diffs[k].base;
    }
    if (dsrt__grow((void **)&p->diffs, &p->cap_diffs, p->n_diffs + 1, sizeof *p->diffs))
        return -ENOMEM;
    if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) return -ENOMEM;
    DN("memory", dnnl_memory_create(out, md, eng, DNNL_MEMORY_NONE));
    p->mems[p->n_mems++] = *out;
    int k = (int)p->n_diffs++;
    p->diffs[k] = (diff_entry){.mem = *out,
                               .base = base < 0 ? k : base,
                               .lo = lo,
                               .hi = hi,
                               .size = dnnl_memory_desc_get_size(md)};
    if (base >= 0 && lo >= 0) {
        diff_entry *b = &p->diffs[base];
        b->lo = DSRT_MIN(b->lo, lo);
        b->hi = DSRT_MAX(b->hi, hi);
    }
    return 0;
}

/* An inference plan's pooled activations: each output lives on to the step
 * of the last layer that reads it (a layer a fusion took runs in the step
 * of the layer that took it); an output that is another's bytes (a sum
 * computed into its other input, an identity) is one memory, so its life
 * covers the readers of both. */
static void act_lives(const dsrt_net *net, cpu_plan *p) {
    for (int k = 0; k < net->n_layers; k++) {
        int at = p->taken_by && p->taken_by[k] >= 0 ? p->taken_by[k] : k;
        for (int q = 0; q < net->layers[k].n_inputs; q++) {
            int e = diff_index(p, p->lp[net->layers[k].inputs[q]].out.mem);
            if (e < 0) continue;
            diff_entry *b = &p->diffs[p->diffs[e].base];
            b->hi = DSRT_MAX(b->hi, at);
        }
    }
}

/* Gives every gradient memory its bytes: the bases placed largest first,
 * each at the lowest offset free over its life, in one buffer. */
static int diff_pool_make(cpu_plan *p) {
    if (!p->n_diffs) return 0;
    /* A layer may hand on the tensor of the layer before (a ReLU folded into
     * it): that gradient lives until the last taker of either. */
    for (int j = 0; j < p->n_layers; j++) {
        int k = p->lp[j].out.diff ? diff_index(p, p->lp[j].out.diff) : -1;
        if (k < 0) continue;
        diff_entry *b = &p->diffs[p->diffs[k].base];
        b->lo = DSRT_MIN(b->lo, j);
        b->hi = DSRT_MAX(b->hi, DSRT_MAX(j, p->last_use[j]));
    }
    /* The bases placed by their lives; views take their base's bytes. */
    dsrt_life *lives = dsrt__calloc(p->n_diffs, sizeof *lives);
    if (!lives) return -ENOMEM;
    for (size_t k = 0; k < p->n_diffs; k++)
        if (p->diffs[k].base == (int)k)
            lives[k] = (dsrt_life){p->diffs[k].size, 0, p->diffs[k].lo, p->diffs[k].hi};
    size_t total;
    int rc = dsrt__place_by_life(lives, p->n_diffs, 64, &total);
    for (size_t k = 0; rc == 0 && k < p->n_diffs; k++) p->diffs[k].offset = lives[k].offset;
    free(lives);
    if (rc) return rc;
    p->diff_pool_size = total;
    p->diff_pool = aligned_alloc(64, p->diff_pool_size ? p->diff_pool_size : 64);
    if (!p->diff_pool)
        return dsrt__fail(-ENOMEM, "cpu backend: out of memory for %zu bytes of gradients",
                          p->diff_pool_size);
    for (size_t k = 0; k < p->n_diffs; k++) {
        const diff_entry *b = &p->diffs[p->diffs[k].base];
        if (dnnl_memory_set_data_handle(p->diffs[k].mem, (char *)p->diff_pool + b->offset) !=
            dnnl_success)
            return dsrt__fail(DSRT_EBACKEND, "cpu backend: gradient memory");
    }
    return 0;
}

int dsrt__cpu_attr(dnnl_primitive_attr_t *attr, int relu, float leak, const dsrt_layer *L) {
    DN("attributes", dnnl_primitive_attr_create(attr));
    DN("attributes", dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user));
    if (relu) {
        dnnl_post_ops_t po;
        DN("post-ops", dnnl_post_ops_create(&po));
        dnnl_status_t st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, leak, 0.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(*attr, po);
        dnnl_post_ops_destroy(po);
        if (st != dnnl_success) return dsrt__cpu_fail(st, "post-ops", L);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Inference: layers computed by the convolution or fc before them

static void fusion_free(cpu_fusion *f) {
    if (!f) return;
    free(f->w);
    free(f->b);
    free(f);
}

/* The oneDNN eltwise post-ops act is, in order, into alg, alpha, beta:
 * how many (hardsigmoid: two; 0 for none dsrt knows). */
static int act_algs(const dsrt_act *a, int alg[2], float alpha[2], float beta[2]) {
    alpha[0] = beta[0] = 0.0f;
    switch (a->fn) {
    case DSRT_ACT_RELU:
        alg[0] = dnnl_eltwise_relu, alpha[0] = a->alpha;
        return 1;
    case DSRT_ACT_CLIP:
        alg[0] = dnnl_eltwise_clip_v2, alpha[0] = a->alpha, beta[0] = a->beta;
        return 1;
    case DSRT_ACT_LOGISTIC:
        alg[0] = dnnl_eltwise_logistic;
        return 1;
    case DSRT_ACT_HARDSIGMOID:
        alg[0] = dnnl_eltwise_linear, alpha[0] = a->alpha, beta[0] = a->beta;
        alg[1] = dnnl_eltwise_clip_v2, alpha[1] = 0.0f, beta[1] = 1.0f;
        return 2;
    case DSRT_ACT_HARDSWISH:
        alg[0] = dnnl_eltwise_hardswish;
        return 1;
    case DSRT_ACT_SWISH:
        alg[0] = dnnl_eltwise_swish, alpha[0] = a->alpha;
        return 1;
    case DSRT_ACT_GELU_ERF:
        alg[0] = dnnl_eltwise_gelu_erf;
        return 1;
    case DSRT_ACT_GELU_TANH:
        alg[0] = dnnl_eltwise_gelu_tanh;
        return 1;
    }
    return 0;
}

/*
 * Whether act may join chain f as a post-op. oneDNN 2.6's brgemm kernels
 * (NHWC 1x1 and depthwise convolutions) compute the second of two post-ops
 * of one eltwise algorithm with the first one's parameters: a leaky ReLU
 * (0.1) then a ReLU came out leaky, a clip to [0, 6] then one to [-1, 1]
 * as the first. So a chain holds one set of parameters an algorithm.
 */
static int act_joins(const cpu_fusion *f, const dsrt_act *act) {
    int alg[2], alg_k[2];
    float al[2], be[2], al_k[2], be_k[2];
    int n = act_algs(act, alg, al, be);
    for (int k = 0; k < f->n_ops; k++) {
        if (f->ops[k].sum) continue;
        int m = act_algs(&f->ops[k].act, alg_k, al_k, be_k);
        for (int q = 0; q < n; q++)
            for (int r = 0; r < m; r++)
                if (alg[q] == alg_k[r] && (al[q] != al_k[r] || be[q] != be_k[r])) return 0;
    }
    return 1;
}

/*
 * Which layers each convolution and fc computes in an inference plan
 * (cpu_fusion): along its output's one taker after another, an affine map
 * right after it, then activations, the sum of a two-input add whose other
 * input is computed before it, and that add's ReLU, through layers that are
 * the identity at inference, up to the first layer that is none of these. A layer whose chain holds
 * nothing but the ReLU it already computes (fuse_relu) keeps its plain plan.
 */
static int plan_fusion(cpu_backend *be, cpu_plan *p) {
    const dsrt_net *net = be->net;
    int n = net->n_layers;
    p->fuse = dsrt__calloc((size_t)n, sizeof *p->fuse);
    p->taken_by = dsrt__malloc((size_t)n * sizeof *p->taken_by);
    if (!p->fuse || !p->taken_by) return -ENOMEM;
    for (int j = 0; j < n; j++) p->taken_by[j] = -1;
    for (int i = 1; i < n; i++) {
        const dsrt_layer *L = &net->layers[i];
        if (!dsrt__layer_is(L, DSRT_LAYER_F_POSTOPS) || p->taken_by[i] >= 0) continue;
        cpu_fusion f = {.affine = -1, .sum = -1, .last = i};
        int more = 0; /* anything beyond the layer's own ReLU */
        if (L->fuse_relu) f.ops[f.n_ops++].act = (dsrt_act){DSRT_ACT_RELU, L->fuse_leak, 0.0f};
        for (int cur = i, j; (j = dsrt__net_only_taker(net, cur)) > 0; cur = j) {
            const dsrt_layer *J = &net->layers[j];
            const dsrt_layer_ops *o = dsrt__layer_ops(J);
            dsrt_act act;
            if (f.n_ops > CPU_FUSE_OPS - 3) break; /* room for an op, a sum and its ReLU */
            if (J->fused_away || (o->flags & DSRT_LAYER_F_INFER_IDENTITY)) {
                /* a ReLU the layer before it computes (in already), or
                 * the identity */
            } else if (o->infer_affine && J->n_inputs == 1 && f.affine < 0 && f.n_ops == 0) {
                f.affine = j;
                if (J->fuse_relu)
                    f.ops[f.n_ops++].act = (dsrt_act){DSRT_ACT_RELU, J->fuse_leak, 0.0f};
            } else if (o->infer_act && J->n_inputs == 1 && o->infer_act(J, &act)) {
                if (!act_joins(&f, &act)) break;
                f.ops[f.n_ops++].act = act;
            } else if ((o->flags & DSRT_LAYER_F_SUM) && J->n_inputs == 2 && f.sum < 0 &&
                       J->inputs[0] != J->inputs[1]) {
                int other = J->inputs[J->inputs[0] == cur];
                const dsrt_act relu = {DSRT_ACT_RELU, J->fuse_leak, 0.0f};
                if (other >= i) break; /* not computed yet when layer i runs */
                /* Images of one pixel may be 2-D on one side (a fully
                 * connected layer's) and 4-D on the other: the add's own. */
                if (L->out.h == 1 && L->out.w == 1) break;
                if (J->fuse_relu && !act_joins(&f, &relu)) break;
                f.sum = other;
                f.ops[f.n_ops++].sum = 1;
                if (J->fuse_relu)
                    f.ops[f.n_ops++].act = (dsrt_act){DSRT_ACT_RELU, J->fuse_leak, 0.0f};
            } else {
                break;
            }
            more |= !J->fused_away && !(o->flags & DSRT_LAYER_F_INFER_IDENTITY);
            f.last = j;
        }
        if (!more) continue;
        cpu_fusion *k = dsrt__malloc(sizeof *k);
        if (!k) return -ENOMEM;
        *k = f;
        p->fuse[i] = k;
        for (int j = dsrt__net_only_taker(net, i); j > 0 && j <= f.last;
             j = dsrt__net_only_taker(net, j)) {
            p->taken_by[j] = i;
            if (j == f.last) break;
        }
    }
    return 0;
}

/* The post-ops of act (hardsigmoid: two). */
static dnnl_status_t post_act(dnnl_post_ops_t po, const dsrt_act *a) {
    int alg[2];
    float alpha[2], beta[2];
    int n = act_algs(a, alg, alpha, beta);
    dnnl_status_t st = n ? dnnl_success : dnnl_invalid_arguments;
    for (int k = 0; k < n && st == dnnl_success; k++)
        st = dnnl_post_ops_append_eltwise(po, 1.0f, (dnnl_alg_kind_t)alg[k], alpha[k], beta[k]);
    return st;
}

int dsrt__cpu_pd_fused(dnnl_primitive_desc_t *pd, const void *desc, cpu_backend *be, cpu_plan *p,
                       int i, const char *what) {
    const dsrt_layer *L = &be->net->layers[i];
    const cpu_fusion *f = dsrt__cpu_fusion(p, i);
    if (!f) return dsrt__cpu_pd(pd, desc, be, L->fuse_relu, L->fuse_leak, NULL, what, L);
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    int rc = dsrt__cpu_attr(&attr, 0, 0.0f, L);
    if (rc) return rc;
    dnnl_status_t st = dnnl_post_ops_create(&po);
    for (int k = 0; k < f->n_ops && st == dnnl_success; k++)
        st = f->ops[k].sum ? dnnl_post_ops_append_sum(po, 1.0f) : post_act(po, &f->ops[k].act);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, desc, attr, be->engine, NULL);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return st == dnnl_success ? 0 : dsrt__cpu_fail(st, what, L);
}

/* The folded weights and bias of layer i: each output channel's weights
 * times the affine map's scale, its bias times the scale plus the shift. */
static int step_fold(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i], *A;
    cpu_fusion *f = p->fuse[i];
    A = &net->layers[f->affine];
    int c = L->out.c;
    float *scale = f->b + c, *shift = scale + c; /* after the bias: room for both */
    if (!dsrt__layer_ops(A)->infer_affine(A, net->params, net->state, scale, shift))
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: layer '%s': no affine map", A->name);
    size_t per = L->w_n / (size_t)c;
    const float *w = net->params + L->w_off, *b = L->b_n ? net->params + L->b_off : NULL;
    for (int o = 0; o < c; o++) {
        for (size_t k = 0; k < per; k++)
            f->w[(size_t)o * per + k] = w[(size_t)o * per + k] * scale[o];
        f->b[o] = (b ? b[o] : 0.0f) * scale[o] + shift[o];
    }
    return 0;
}

int dsrt__cpu_fused_params(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *w_plain,
                           const dnnl_memory_desc_t *b_md, dnnl_memory_t *w, dnnl_memory_t *b) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    cpu_fusion *f = p->fuse ? p->fuse[i] : NULL;
    *b = NULL;
    if (!f || f->affine < 0) {
        int rc = dsrt__cpu_mem(p, w_plain, be->engine, net->params + L->w_off, w, L);
        if (!rc && L->b_n) rc = dsrt__cpu_mem(p, b_md, be->engine, net->params + L->b_off, b, L);
        return rc;
    }
    f->w = aligned_alloc(64, (L->w_n * sizeof(float) + 63) & ~(size_t)63);
    f->b = dsrt__malloc(3 * (size_t)L->out.c * sizeof(float)); /* bias, scale, shift */
    if (!f->w || !f->b)
        return dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory", L->name);
    int rc = dsrt__cpu_mem(p, w_plain, be->engine, f->w, w, L);
    if (!rc) rc = dsrt__cpu_mem(p, b_md, be->engine, f->b, b, L);
    if (rc) return rc;
    step *s = fwd_step(p);
    if (!s) return -ENOMEM;
    s->fn = step_fold;
    s->layer = i;
    s->kind = STEP_WEIGHTS;
    f->version = UINT64_MAX;
    s->cache = &f->version;
    return 0;
}

int dsrt__cpu_fused_output(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md) {
    const dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    const cpu_fusion *f = dsrt__cpu_fusion(p, i);
    if (!f || f->sum < 0) return dsrt__cpu_output(be, p, i, md);
    tensor *out = &p->lp[i].out;
    const tensor *other = &p->lp[f->sum].out;
    /* The other input's own bytes, when they are in this layout, are not
     * the caller's batch, neither this layer (a convolution that reads
     * what it adds to) nor any layer after it reads them but the add that
     * this layer computes. */
    int own = p->pool_acts && dnnl_memory_desc_equal(&other->md, md) && other->mem != p->batch;
    for (int k = i; k < net->n_layers && own; k++) {
        if (k > i && k <= f->last && p->taken_by && p->taken_by[k] == i) continue;
        for (int q = 0; q < net->layers[k].n_inputs && own; q++) {
            int x = net->layers[k].inputs[q];
            own = !(x < i && p->lp[x].out.mem == other->mem);
        }
    }
    if (own) {
        out->md = *md;
        out->mem = other->mem;
        return 0;
    }
    int rc = dsrt__cpu_output(be, p, i, md);
    return rc ? rc
              : dsrt__cpu_reorder_step(p, be, other->mem, out->mem, 0, i, STEP_ALWAYS, NULL, L);
}

/* Creates pd from an op descriptor with the plan's attributes. */
int dsrt__cpu_pd(dnnl_primitive_desc_t *pd, const void *desc, cpu_backend *be, int relu, float leak,
                 const_dnnl_primitive_desc_t hint, const char *what, const dsrt_layer *L) {
    dnnl_primitive_attr_t attr;
    int rc = dsrt__cpu_attr(&attr, relu, leak, L);
    if (rc) return rc;
    dnnl_status_t st = dnnl_primitive_desc_create(pd, desc, attr, be->engine, hint);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dsrt__cpu_fail(st, what, L);
    return 0;
}

/* The primitive of pd, registered with the plan, and the scratchpad memory it
 * needs (NULL when none). pd stays the caller's. */
static int prim_new(cpu_plan *p, cpu_backend *be, const_dnnl_primitive_desc_t pd,
                    dnnl_primitive_t *prim, dnnl_memory_t *scratch, const dsrt_layer *L) {
    *prim = NULL;
    *scratch = NULL;
    if (dsrt__grow((void **)&p->prims, &p->cap_prims, p->n_prims + 1, sizeof *p->prims))
        return -ENOMEM;
    DN("primitive", dnnl_primitive_create(prim, pd));
    p->prims[p->n_prims++] = *prim;
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t size = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (size) {
        if (dsrt__grow((void **)&p->scratch_mems, &p->cap_scratch, p->n_scratch + 1,
                       sizeof *p->scratch_mems))
            return -ENOMEM;
        DN("scratchpad", dnnl_memory_create(scratch, smd, be->engine, DNNL_MEMORY_NONE));
        p->scratch_mems[p->n_scratch++] = *scratch;
        if (size > p->scratch_size) p->scratch_size = size;
    }
    return 0;
}

/* A step running pd's primitive; the caller adds the arguments. */
int dsrt__cpu_prim_step(cpu_plan *p, cpu_backend *be, const_dnnl_primitive_desc_t pd, int backward,
                        int layer, step **out, const dsrt_layer *L) {
    dnnl_primitive_t prim;
    dnnl_memory_t scratch;
    int rc = prim_new(p, be, pd, &prim, &scratch, L);
    if (rc) return rc;
    step *s = backward ? bwd_step(p) : fwd_step(p);
    if (!s) return -ENOMEM;
    s->prim = prim;
    s->layer = layer;
    dsrt__cpu_arg(s, DNNL_ARG_SCRATCHPAD, scratch);
    *out = s;
    return 0;
}

/* A copy between tensors of one layout, in pieces of COPY_PIECE bytes over
 * the team: oneDNN 2.6 gives such a reorder to its generic one-thread
 * kernel ("simple:any"; ResNet-50's residual gradients on AVX2 took 1.2%
 * of a training step by it). */
#define COPY_PIECE ((size_t)256 << 10)

typedef struct {
    const char *from;
    char *to;
    size_t bytes;
} copy_job;

static void copy_pieces(void *ctx, size_t lo, size_t hi) {
    const copy_job *c = ctx;
    size_t a = lo * COPY_PIECE, b = DSRT_MIN(hi * COPY_PIECE, c->bytes);
    memcpy(c->to + a, c->from + a, b - a);
}

static void copy_step(cpu_backend *be, const step *s) {
    copy_job c = {.from = dsrt__cpu_handle(s->args[0].memory),
                  .to = dsrt__cpu_handle(s->args[1].memory),
                  .bytes = dnnl_memory_desc_get_size(dsrt__cpu_md_of(s->args[0].memory))};
    if (c.from != c.to)
        dsrt__cpu_parallel(be, (c.bytes + COPY_PIECE - 1) / COPY_PIECE, copy_pieces, &c);
}

/* A reorder step from one memory to another (a copy_step where both have
 * one layout). */
int dsrt__cpu_reorder_step(cpu_plan *p, cpu_backend *be, dnnl_memory_t from, dnnl_memory_t to,
                           int backward, int layer, step_kind kind, uint64_t *cache,
                           const dsrt_layer *L) {
    if (kind == STEP_ALWAYS && dnnl_memory_desc_equal(dsrt__cpu_md_of(from), dsrt__cpu_md_of(to))) {
        step *s = backward ? bwd_step(p) : fwd_step(p);
        if (!s) return -ENOMEM;
        s->layer = layer;
        dsrt__cpu_arg(s, DNNL_ARG_FROM, from);
        dsrt__cpu_arg(s, DNNL_ARG_TO, to);
        return 0;
    }
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    int rc = dsrt__cpu_attr(&attr, 0, 0, L);
    if (rc) return rc;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, dsrt__cpu_md_of(from), be->engine,
                                                          dsrt__cpu_md_of(to), be->engine, attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dsrt__cpu_fail(st, "reorder", L);
    step *s;
    rc = dsrt__cpu_prim_step(p, be, pd, backward, layer, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_FROM, from);
    dsrt__cpu_arg(s, DNNL_ARG_TO, to);
    s->kind = kind;
    s->cache = cache;
    return 0;
}

/* have in the layout want: have itself, or a new memory filled by a reorder
 * step added now. */
int dsrt__cpu_ensure(cpu_plan *p, cpu_backend *be, dnnl_memory_t have,
                     const dnnl_memory_desc_t *want, int backward, int layer, dnnl_memory_t *out,
                     const dsrt_layer *L) {
    if (dnnl_memory_desc_equal(dsrt__cpu_md_of(have), want)) {
        *out = have;
        return 0;
    }
    int rc = p->pool_acts && !backward
                 ? dsrt__cpu_diff(p, be->engine, want, layer, layer, NULL, out, L)
                 : dsrt__cpu_mem(p, want, be->engine, NULL, out, L);
    if (rc) return rc;
    return dsrt__cpu_reorder_step(p, be, have, *out, backward, layer, STEP_ALWAYS, NULL, L);
}

/* Where a primitive producing layout `made` should write so that the result
 * lands in target: target itself, or a temporary (*tmp) that the caller
 * reorders into target after the primitive's step. */
int dsrt__cpu_deliver(cpu_plan *p, cpu_backend *be, dnnl_memory_t target,
                      const dnnl_memory_desc_t *made, dnnl_memory_t *out, dnnl_memory_t *tmp,
                      const dsrt_layer *L) {
    *tmp = NULL;
    if (dnnl_memory_desc_equal(dsrt__cpu_md_of(target), made)) {
        *out = target;
        return 0;
    }
    int layer = (int)(L - be->net->layers);
    int rc = p->pool_acts ? dsrt__cpu_diff(p, be->engine, made, layer, layer, NULL, tmp, L)
                          : dsrt__cpu_mem(p, made, be->engine, NULL, tmp, L);
    *out = *tmp;
    return rc;
}

int dsrt__cpu_md_plain(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims) {
    static const dnnl_format_tag_t tags[] = {0, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde};
    return dnnl_memory_desc_init_by_tag(md, ndims, dims, dnnl_f32, tags[ndims]) == dnnl_success
               ? 0
               : DSRT_EBACKEND;
}

int dsrt__cpu_md_any(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims) {
    return dnnl_memory_desc_init_by_tag(md, ndims, dims, dnnl_f32, dnnl_format_tag_any) ==
                   dnnl_success
               ? 0
               : DSRT_EBACKEND;
}

/* The same logical tensor as md, in plain (row-major) layout. */
int dsrt__cpu_md_plain_like(dnnl_memory_desc_t *out, const dnnl_memory_desc_t *md) {
    return dsrt__cpu_md_plain(out, md->ndims, md->dims);
}

// ----------------------------------------------------------------------------
// C steps

int dsrt__cpu_c_step(cpu_plan *p, int backward, int (*fn)(cpu_backend *, cpu_plan *, int),
                     int layer) {
    step *s = backward ? bwd_step(p) : fwd_step(p);
    if (!s) return -ENOMEM;
    s->fn = fn;
    s->layer = layer;
    return 0;
}

// ----------------------------------------------------------------------------
// Layers

int dsrt__cpu_md_is(const dnnl_memory_desc_t *md, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t t;
    if (dnnl_memory_desc_init_by_tag(&t, md->ndims, md->dims, dnnl_f32, tag) != dnnl_success)
        return 0;
    return dnnl_memory_desc_equal(md, &t);
}

/* The output tensor of layer i in layout md, and its gradient buffer when
 * backward needs it. */
static int output_make(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md,
                       int pooled) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    out->md = *md;
    /* Pooled: alive from this layer on; act_lives extends it to its last
     * reader. */
    int rc = pooled ? dsrt__cpu_diff(p, be->engine, md, i, i, NULL, &out->mem, L)
                    : dsrt__cpu_mem(p, md, be->engine, NULL, &out->mem, L);
    if (rc) return rc;
    if (!p->train || !dsrt__net_need_diff(be->net, i)) return rc;
    int key = be->net->grad_share[i] >= 0                   ? be->net->grad_share[i]
              : dsrt__layer_is(L, DSRT_LAYER_F_GRAD_PASSES) ? i
                                                            : -1;
    dnnl_memory_t first = key >= 0 ? p->share[key] : NULL;
    int hi = DSRT_MAX(i, p->last_use[i]);
    if (first && dnnl_memory_desc_equal(dsrt__cpu_md_of(first), md))
        return dsrt__cpu_diff(p, be->engine, md, i, hi, first, &out->diff, L);
    rc = dsrt__cpu_diff(p, be->engine, md, i, hi, NULL, &out->diff, L);
    if (!rc && key >= 0 && !first) p->share[key] = out->diff;
    return rc;
}

int dsrt__cpu_output(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md) {
    return output_make(be, p, i, md, p->pool_acts);
}

int dsrt__cpu_output_kept(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md) {
    return output_make(be, p, i, md, 0);
}

int dsrt__cpu_pooled(const cpu_plan *p, dnnl_memory_t m) {
    return p->pool_acts && diff_index(p, m) >= 0;
}

int dsrt__cpu_view(cpu_plan *p, cpu_backend *be, const dnnl_memory_desc_t *md, dnnl_memory_t of,
                   dnnl_memory_t *out, const dsrt_layer *L) {
    if (dsrt__cpu_pooled(p, of)) return dsrt__cpu_diff(p, be->engine, md, -1, -1, of, out, L);
    return dsrt__cpu_mem(p, md, be->engine, dsrt__cpu_handle(of), out, L);
}

/* Weights of a conv or fc layer: plain in the flat buffer, in layout want for
 * a primitive. Adds a cached reorder step when they differ. */
int dsrt__cpu_weights_for(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *plain,
                          const dnnl_memory_desc_t *want, dnnl_memory_t wplain, int backward,
                          uint64_t *cache, dnnl_memory_t *out) {
    const dsrt_layer *L = &be->net->layers[i];
    if (dnnl_memory_desc_equal(plain, want)) {
        *out = wplain;
        return 0;
    }
    int rc = dsrt__cpu_mem(p, want, be->engine, NULL, out, L);
    if (rc) return rc;
    *cache = UINT64_MAX;
    return dsrt__cpu_reorder_step(p, be, wplain, *out, backward, i, STEP_WEIGHTS, cache, L);
}

/* Backward of a ReLU fused into layer i: in place on its output gradient. */
int dsrt__cpu_fused_relu_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    dnnl_eltwise_desc_t d;
    dnnl_primitive_desc_t pd;
    DN("relu backward", dnnl_eltwise_backward_desc_init(&d, dnnl_eltwise_relu_use_dst_for_bwd,
                                                        &out->md, &out->md, L->fuse_leak, 0));
    int rc = dsrt__cpu_pd(&pd, &d, be, 0, 0, NULL, "relu backward", L);
    if (rc) return rc;
    step *s;
    rc = dsrt__cpu_prim_step(p, be, pd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_DST, out->mem);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, out->diff);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, out->diff);
    return 0;
}

/*
 * Where layer i's backward writes the gradient for its k-th input (in that
 * input's gradient layout): the gradient itself when layer i is the last
 * layer written that takes the input (backward runs last to first, so it
 * writes first), else a scratch tensor (*acc) that grad_add then adds into
 * the gradient: a layer whose output feeds several gets the sum of theirs.
 */
int dsrt__cpu_grad_target_of(cpu_backend *be, cpu_plan *p, int i, int k, const tensor *in,
                             dnnl_memory_t *out, dnnl_memory_t *acc) {
    const dsrt_layer *L = &be->net->layers[i];
    *acc = NULL;
    if (p->last_use[L->inputs[k]] == i) {
        *out = in->diff;
        return 0;
    }
    int rc = dsrt__cpu_diff(p, be->engine, &in->md, i, i, NULL, acc, L);
    *out = *acc;
    return rc;
}

int dsrt__cpu_grad_target(cpu_backend *be, cpu_plan *p, int i, int k, dnnl_memory_t *out,
                          dnnl_memory_t *acc) {
    const dsrt_layer *L = &be->net->layers[i];
    return dsrt__cpu_grad_target_of(be, p, i, k, &p->lp[L->inputs[k]].out, out, acc);
}

/* Layer L's k-th input as a 4-d tensor (n, c, h, w), for add and concat:
 * the tensor itself, or a fully connected layer's (n, c) output and its
 * gradient seen as (n, c, 1, 1), the same bytes. */
int dsrt__cpu_input4(cpu_backend *be, cpu_plan *p, const dsrt_layer *L, int k, tensor *out) {
    const tensor *t = &p->lp[L->inputs[k]].out;
    *out = *t;
    if (t->md.ndims == 4) return 0;
    const dsrt_layer *in = &be->net->layers[L->inputs[k]];
    dnnl_dims_t dims = {p->n, in->out.c, in->out.h, in->out.w};
    if (dsrt__cpu_md_plain(&out->md, 4, dims))
        return dsrt__cpu_fail(dnnl_invalid_arguments, "input view", L);
    int rc = dsrt__cpu_view(p, be, &out->md, t->mem, &out->mem, L);
    if (!rc && t->diff)
        rc = dsrt__cpu_diff(p, be->engine, &out->md, -1, -1, t->diff, &out->diff, L);
    return rc;
}
/* diff += acc (when grad_target gave a scratch tensor), a step of layer i's
 * backward. */
int dsrt__cpu_grad_add(cpu_backend *be, cpu_plan *p, int i, dnnl_memory_t diff, dnnl_memory_t acc) {
    if (!acc) return 0;
    const dsrt_layer *L = &be->net->layers[i];
    dnnl_binary_desc_t d;
    dnnl_primitive_desc_t pd;
    DN("gradient sum", dnnl_binary_desc_init(&d, dnnl_binary_add, dsrt__cpu_md_of(diff),
                                             dsrt__cpu_md_of(acc), dsrt__cpu_md_of(diff)));
    int rc = dsrt__cpu_pd(&pd, &d, be, 0, 0, NULL, "gradient sum", L);
    if (rc) return rc;
    step *s;
    rc = dsrt__cpu_prim_step(p, be, pd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_SRC_0, diff);
    dsrt__cpu_arg(s, DNNL_ARG_SRC_1, acc);
    dsrt__cpu_arg(s, DNNL_ARG_DST, diff);
    return 0;
}

/* The weights' gradient of a layer with weights and an optional bias
 * (convolution, fc), once its primitive bpd is made: written into the net's
 * gradients (through a reorder where the primitive wants another layout),
 * then the layer's gradients are ready. ensure_ddst: the output's gradient
 * is reordered to the layout bpd wants (else taken as it is). Destroys bpd. */
int dsrt__cpu_weights_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                           const dnnl_memory_desc_t *w_plain, const dnnl_memory_desc_t *b_md,
                           int ensure_ddst) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    dnnl_memory_t src_w, ddst_w = lp->out.diff, dw_plain, dw, dw_tmp, db = NULL;
    step *s;
    int rc = dsrt__cpu_ensure(
        p, be, lp->src, dnnl_primitive_desc_query_md(bpd, dnnl_query_src_md, 0), 1, i, &src_w, L);
    if (!rc && ensure_ddst)
        rc = dsrt__cpu_ensure(p, be, lp->out.diff,
                              dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_dst_md, 0), 1, i,
                              &ddst_w, L);
    if (!rc) rc = dsrt__cpu_mem(p, w_plain, be->engine, net->grads + L->w_off, &dw_plain, L);
    if (!rc)
        rc = dsrt__cpu_deliver(p, be, dw_plain,
                               dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_weights_md, 0),
                               &dw, &dw_tmp, L);
    if (!rc && L->b_n) rc = dsrt__cpu_mem(p, b_md, be->engine, net->grads + L->b_off, &db, L);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, src_w);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, ddst_w);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_WEIGHTS, dw);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_BIAS, db);
    if (dw_tmp &&
        (rc = dsrt__cpu_reorder_step(p, be, dw_tmp, dw_plain, 1, i, STEP_ALWAYS, NULL, L)))
        return rc;
    return dsrt__cpu_ready_step(p, i);
}

/* The input's gradient of a layer with weights (convolution, fc), once its
 * primitive bpd is made: the weights as forward took them (wfwd) when bpd
 * wants that layout, else reordered from the plain ones (wplain); the
 * result added into the input's gradient. ensure_ddst as weights_grad.
 * Destroys bpd. */
int dsrt__cpu_data_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                        const dnnl_memory_desc_t *w_plain, dnnl_memory_t wplain, dnnl_memory_t wfwd,
                        int ensure_ddst) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_memory_t ddst = lp->out.diff, wb, dsrc, dsrc_tmp;
    step *s;
    int rc = 0;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(bpd, dnnl_query_weights_md, 0);
    if (ensure_ddst)
        rc = dsrt__cpu_ensure(p, be, lp->out.diff,
                              dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_dst_md, 0), 1, i,
                              &ddst, L);
    if (!rc) {
        if (dnnl_memory_desc_equal(wmd, dsrt__cpu_md_of(wfwd)))
            wb = wfwd; /* fresh from forward */
        else
            rc = dsrt__cpu_weights_for(be, p, i, w_plain, wmd, wplain, 1, &lp->w_bwd_version, &wb);
    }
    dnnl_memory_t tgt = NULL, acc = NULL;
    if (!rc) rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc)
        rc = dsrt__cpu_deliver(p, be, tgt,
                               dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_src_md, 0), &dsrc,
                               &dsrc_tmp, L);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) return rc;
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, ddst);
    dsrt__cpu_arg(s, DNNL_ARG_WEIGHTS, wb);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, dsrc);
    if (dsrc_tmp) rc = dsrt__cpu_reorder_step(p, be, dsrc_tmp, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc) rc = dsrt__cpu_grad_add(be, p, i, in->diff, acc);
    return rc;
}

int dsrt__cpu_one_primitive(cpu_backend *be, cpu_plan *p, int i, const dsrt_cpu_op_desc *fd,
                            const dsrt_cpu_one_backward *b) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_primitive_desc_t fpd;
    int rc = dsrt__cpu_pd(&fpd, fd, be, 0, 0, NULL, b->what, L);
    if (rc) return rc;
    dnnl_memory_t ws = NULL;
    step *s;
    rc = dsrt__cpu_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    const dnnl_memory_desc_t *wsmd = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    if (!rc && p->train && wsmd && dnnl_memory_desc_get_size(wsmd))
        rc = dsrt__cpu_mem(p, wsmd, be->engine, NULL, &ws, L);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, fpd, 0, i, &s, L);
    if (rc) goto out;
    dsrt__cpu_arg(s, DNNL_ARG_SRC, in->mem);
    dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    dsrt__cpu_arg(s, DNNL_ARG_WORKSPACE, ws);
    if (!p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) goto out;
    dsrt_cpu_op_desc bd;
    dnnl_primitive_desc_t bpd;
    char what[64];
    snprintf(what, sizeof what, "%s backward", b->what);
    dnnl_status_t st = b->init(&bd, L, &in->md, &lp->out.md);
    if (st != dnnl_success) {
        rc = dsrt__cpu_fail(st, what, L);
        goto out;
    }
    if ((rc = dsrt__cpu_pd(&bpd, &bd, be, 0, 0, fpd, what, L))) goto out;
    dnnl_memory_t tgt = NULL, acc = NULL;
    rc = dsrt__cpu_grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc) rc = dsrt__cpu_prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) goto out;
    if (b->reads_src) dsrt__cpu_arg(s, DNNL_ARG_SRC, in->mem);
    if (b->reads_dst) dsrt__cpu_arg(s, DNNL_ARG_DST, lp->out.mem);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_DST, lp->out.diff);
    dsrt__cpu_arg(s, DNNL_ARG_WORKSPACE, ws);
    dsrt__cpu_arg(s, DNNL_ARG_DIFF_SRC, tgt);
    rc = dsrt__cpu_grad_add(be, p, i, in->diff, acc);
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

int dsrt__cpu_ready_step(cpu_plan *p, int i) {
    return dsrt__cpu_c_step(p, 1, step_ready, i);
}

// ----------------------------------------------------------------------------
// Plan lifetime

static void plan_free(cpu_plan *p) {
    if (!p) return;
    for (size_t k = 0; k < p->n_prims; k++) dnnl_primitive_destroy(p->prims[k]);
    for (size_t k = 0; k < p->n_mems; k++) dnnl_memory_destroy(p->mems[k]);
    for (size_t k = 0; k < p->n_scratch; k++) dnnl_memory_destroy(p->scratch_mems[k]);
    for (int i = 0; p->lp && i < p->n_layers; i++) {
        if (p->lp[i].own_free)
            p->lp[i].own_free(p->lp[i].own);
        else
            free(p->lp[i].own);
    }
    for (int i = 0; p->fuse && i < p->n_layers; i++) fusion_free(p->fuse[i]);
    free(p->fuse);
    free(p->taken_by);
    free(p->lp);
    free(p->last_use);
    free(p->share);
    free(p->diffs);
    free(p->diff_pool);
    free(p->fwd);
    free(p->bwd);
    free(p->mems);
    free(p->prims);
    free(p->scratch_mems);
    free(p->scratch);
    free(p->probs);
    free(p);
}

static int plan_build(cpu_backend *be, int n, int train, cpu_plan **out) {
    dsrt_net *net = be->net;
    int rc;
    *out = NULL;
    cpu_plan *p = dsrt__calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->n = n;
    p->train = train;
    p->bn_sync = train && net->bn_sync_fn != NULL;
    p->n_layers = net->n_layers;
    p->lp = dsrt__calloc((size_t)net->n_layers, sizeof *p->lp);
    p->last_use = dsrt__calloc((size_t)net->n_layers, sizeof *p->last_use);
    p->share = dsrt__calloc((size_t)net->n_layers, sizeof *p->share);
    if (!p->lp || !p->last_use || !p->share) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 1; i < net->n_layers; i++)
        for (int k = 0; k < net->layers[i].n_inputs; k++) p->last_use[net->layers[i].inputs[k]] = i;
    if (!train && net->opts.fuse >= 2 && (rc = plan_fusion(be, p))) goto fail;
    p->pool_acts = !train && net->opts.fuse >= 2 && !net->keep_outputs;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *L = &net->layers[i];
        const dsrt_layer_ops *ops = dsrt__layer_ops(L);
        if (p->taken_by && p->taken_by[i] >= 0) { /* computed by the layer whose fusion took it */
            p->lp[i].out = p->lp[p->taken_by[i]].out;
            continue;
        }
        rc = ops->cpu_plan ? ops->cpu_plan(be, p, i)
                           : dsrt__fail(DSRT_EUNSUPPORTED,
                                        "cpu backend: layer '%s' (%s, line %d): no CPU plan for %s",
                                        L->name, L->type, L->line, ops->name);
        if (rc) goto fail;
    }
    /* Backward runs the layers last to first: the steps were added per layer
     * in forward order, so reverse the layer blocks, keeping each layer's
     * own steps in order. */
    if (p->n_bwd) {
        step *r = dsrt__malloc(p->n_bwd * sizeof *r);
        if (!r) {
            rc = -ENOMEM;
            goto fail;
        }
        size_t at = 0;
        for (size_t end = p->n_bwd; end > 0;) {
            size_t begin = end;
            while (begin > 0 && p->bwd[begin - 1].layer == p->bwd[end - 1].layer) begin--;
            memcpy(r + at, p->bwd + begin, (end - begin) * sizeof *r);
            at += end - begin;
            end = begin;
        }
        free(p->bwd);
        p->bwd = r;
        p->cap_bwd = p->n_bwd;
    }
    if (p->pool_acts) act_lives(net, p);
    if ((rc = diff_pool_make(p))) goto fail;
    if (p->scratch_size) {
        p->scratch = aligned_alloc(64, (p->scratch_size + 63) & ~(size_t)63);
        if (!p->scratch) {
            rc = dsrt__fail(-ENOMEM, "cpu backend: out of memory for a %zu-byte scratchpad",
                            p->scratch_size);
            goto fail;
        }
        for (size_t k = 0; k < p->n_scratch; k++)
            if (dnnl_memory_set_data_handle(p->scratch_mems[k], p->scratch) != dnnl_success) {
                rc = dsrt__fail(DSRT_EBACKEND, "cpu backend: scratchpad");
                goto fail;
            }
    }
    *out = p;
    return 0;
fail:
    plan_free(p);
    return rc;
}

/* The plan for (n, train), built on first use; the least recently used plan
 * gives way when every slot is taken. */
static int plan_get(cpu_backend *be, int n, int train, cpu_plan **out) {
    int slot = -1;
    for (int k = 0; k < PLAN_SLOTS; k++) {
        cpu_plan *p = be->plans[k];
        if (p && p->n == n && p->train == train &&
            p->bn_sync == (train && be->net->bn_sync_fn != NULL)) {
            p->used = ++be->clock;
            *out = p;
            return 0;
        }
        if (!p) slot = slot < 0 ? k : slot;
    }
    if (slot < 0) {
        slot = 0;
        for (int k = 1; k < PLAN_SLOTS; k++)
            if (be->plans[k]->used < be->plans[slot]->used) slot = k;
        if (be->last_train == be->plans[slot]) be->last_train = NULL;
        if (be->last_infer == be->plans[slot]) be->last_infer = NULL;
        plan_free(be->plans[slot]);
        be->plans[slot] = NULL;
    }
    int rc = plan_build(be, n, train, &be->plans[slot]);
    if (rc) return rc;
    be->plans[slot]->used = ++be->clock;
    *out = be->plans[slot];
    return 0;
}

// ----------------------------------------------------------------------------
// Running

static double clock_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs a pass's steps of layers [lo, hi] (a fused chain's steps are its
 * first layer's); with a profile on and a training plan, the steps of each
 * layer are timed together (a layer's steps are consecutive). */
static int run_steps_held(cpu_backend *be, cpu_plan *p, step *steps, size_t n, int backward, int lo,
                          int hi) {
    dsrt_net *net = be->net;
    int timed = p->train && dsrt__prof_on(net), layer = -1;
    double t0 = 0, t1 = 0;
    for (size_t k = 0; k < n; k++) {
        step *s = &steps[k];
        if (s->layer < lo || s->layer > hi) continue;
        if (s->kind == STEP_WEIGHTS) {
            if (*s->cache == net->version) continue;
            *s->cache = net->version;
        }
        if (timed && s->layer != layer) {
            if (layer >= 0) dsrt__prof_piece(net, layer, backward, t0, t1);
            layer = s->layer;
            t0 = clock_s();
        }
        if (s->fn) {
            int rc = s->fn(be, p, s->layer);
            if (rc) return rc;
        } else if (!s->prim) {
            copy_step(be, s);
        } else {
            dnnl_status_t st = dnnl_primitive_execute(s->prim, be->stream, s->nargs, s->args);
            if (st != dnnl_success) {
                if (s->kind == STEP_WEIGHTS) *s->cache = UINT64_MAX;
                return dsrt__cpu_fail(st, "execute", &net->layers[s->layer]);
            }
        }
        if (timed) t1 = clock_s();
    }
    dnnl_status_t st = dnnl_stream_wait(be->stream);
    if (timed && layer >= 0) dsrt__prof_piece(net, layer, backward, t0, clock_s());
    return st == dnnl_success ? 0 : dsrt__cpu_fail(st, "stream wait", NULL);
}

/* run_steps_held with the signals held (see signals_hold). */
static int run_steps(cpu_backend *be, cpu_plan *p, step *steps, size_t n, int backward, int lo,
                     int hi) {
    sigset_t old;
    signals_hold(be, &old);
    int rc = run_steps_held(be, p, steps, n, backward, lo, hi);
    signals_release(&old);
    return rc;
}

static int cpu_stage(dsrt_backend *b, const dsrt_net_batch *batch) {
    return 0; /* read in place */
}

static int cpu_stage_wait(dsrt_backend *b) {
    return 0;
}

/*
 * Images a piece when an inference batch runs in pieces. A net whose layers
 * do little arithmetic for the bytes they read and write (depthwise and
 * 1x1 convolutions, squeeze-excitation: MobileNet, EfficientNet, about 6
 * operations a byte of the layers' inputs and outputs) is bound by memory
 * once a batch's activations leave the last-level cache: there, pieces
 * whose largest layer (its inputs and output) fits in that cache run faster
 * than the whole batch at once (batch 16 of MobileNetV2 and EfficientNet-B0,
 * 6 MB an image, against a 32 MiB L3: 1.2x in pieces of 4). Nets of dense
 * convolutions (ResNets: 40 to 80 operations a byte) lose by it (ResNet-18's
 * Winograd convolutions 0.77x) and run whole (INT_MAX). Worked out once a
 * net.
 */
#define PIECE_FLOPS_PER_BYTE 20.0

static int micro_batch(cpu_backend *be) {
    const dsrt_net *net = be->net;
    if (!be->micro) {
        double ws = 0, traffic = 0, flops = 0;
        for (int i = 0; i < net->n_layers; i++) {
            const dsrt_layer *l = &net->layers[i];
            double bytes = 4.0 * l->out.c * l->out.h * l->out.w;
            for (int j = 0; j < l->n_inputs; j++) {
                const dsrt_shape *in = &net->layers[l->inputs[j]].out;
                bytes += 4.0 * in->c * in->h * in->w;
            }
            /* A batchnorm or an activation (no flops of its own) is computed
             * within the convolution before it by an inference plan. */
            if (l->flops > 0) ws = DSRT_MAX(ws, bytes);
            traffic += bytes;
            flops += DSRT_MAX(l->flops, 0.0);
        }
        size_t llc = dsrt__cache_bytes(3);
        if (!llc) llc = dsrt__cache_bytes(2);
        int m = INT_MAX;
        if (llc && ws > 0 && flops < PIECE_FLOPS_PER_BYTE * traffic) {
            m = 1;
            while ((double)m * 2 * ws <= (double)llc && m < (1 << 20)) m *= 2;
        }
        be->micro = m;
    }
    return be->micro;
}

/* Images a piece of a batch of n: n when it runs whole (training, a plan
 * without the full fusion or keeping every output, or a net that gains
 * nothing by it). */
static int piece_size(cpu_backend *be, int n, int train) {
    const dsrt_net *net = be->net;
    if (train || net->opts.fuse < 2 || net->keep_outputs) return n;
    int m = net->infer_pieces > 0 ? net->infer_pieces : micro_batch(be);
    return DSRT_MIN(m, n);
}

static int forward_plan(cpu_backend *be, const dsrt_net_batch *batch, int train, const float *x,
                        int n, int offset);

/* An inference batch in pieces of m images: each piece's plan runs on its
 * rows of x (and labels), the results gathered as one batch's. */
static int forward_pieces(cpu_backend *be, const dsrt_net_batch *batch, const float *x, int m) {
    const dsrt_net *net = be->net;
    int n = batch->n;
    size_t per = (size_t)net->input.c * net->input.h * net->input.w;
    size_t want = (size_t)n * net->classes;
    if (want > be->piece_probs_n) {
        float *np = realloc(be->piece_probs, want * sizeof *np);
        if (!np) return dsrt__fail(-ENOMEM, "cpu backend: out of memory for a batch's scores");
        be->piece_probs = np;
        be->piece_probs_n = want;
    }
    double loss = 0;
    int correct = 0;
    for (int off = 0; off < n; off += m) {
        int k = DSRT_MIN(m, n - off);
        int rc = forward_plan(be, batch, 0, x + (size_t)off * per, k, off);
        if (rc) return rc;
        cpu_plan *p = be->last;
        loss += p->loss * k;
        correct += p->correct;
        memcpy(be->piece_probs + (size_t)off * net->classes, p->probs,
               (size_t)k * net->classes * sizeof(float));
    }
    be->piece_loss = loss / n;
    be->piece_correct = correct;
    be->piece_n = n;
    be->pieces = 1;
    return 0;
}

/*
 * A dense net's inference batch in two segments (one that runs whole by
 * micro_batch): the layers up to a cut, whose outputs over the whole batch
 * outgrow half the last-level cache, run in pieces of m images, each
 * piece's output of the cut copied into the whole batch's; the layers after
 * it run on the whole batch, where their Winograd and 1x1 convolutions
 * keep their rate (they lose it at small batches). Two cores, 32 MiB L3:
 * ResNet-50 at batch 16, its first two stages in pieces of 4, 64.8 -> 68.0
 * images/s; ResNet-18 at batch 64 1.05x.
 * The cut is a layer whose output is the only tensor the layers after it
 * read from the layers before, and no fused chain crosses it.
 */
/* Pixels a piece keeps at the cut at least: pieces of maps smaller than
 * this leave the convolutions too little work (ResNet-50 at batch 64 with
 * its third stage in pieces of 4 ran at 0.86x the whole batch's rate; up
 * to its second stage, 1.03x). */
#define SEG_MIN_PIXELS 2048.0

static int cut_valid(const cpu_plan *p, const dsrt_net *net, int c) {
    if (p->lp[c].out.md.ndims != 4 || !p->lp[c].out.mem) return 0;
    for (int j = c + 1; j < net->n_layers; j++) {
        if (p->taken_by && p->taken_by[j] >= 0 && p->taken_by[j] <= c) return 0;
        for (int q = 0; q < net->layers[j].n_inputs; q++)
            if (net->layers[j].inputs[q] < c) return 0;
    }
    return 1;
}

/* Whether tensors a (of a piece) and b (of the whole batch) have one
 * layout with the images outermost and dense, so that a piece's bytes are
 * a run of the whole's. */
static int cut_layouts_match(const dnnl_memory_desc_t *a, const dnnl_memory_desc_t *b) {
    if (a->format_kind != dnnl_blocked || b->format_kind != dnnl_blocked || a->ndims != b->ndims)
        return 0;
    const dnnl_blocking_desc_t *x = &a->format_desc.blocking, *y = &b->format_desc.blocking;
    if (x->inner_nblks != y->inner_nblks) return 0;
    for (int k = 0; k < x->inner_nblks; k++)
        if (x->inner_blks[k] != y->inner_blks[k] || x->inner_idxs[k] != y->inner_idxs[k] ||
            x->inner_idxs[k] == 0)
            return 0;
    for (int d = 1; d < a->ndims; d++)
        if (a->dims[d] != b->dims[d] || x->strides[d] != y->strides[d]) return 0;
    size_t per = dnnl_memory_desc_get_size(a) / (size_t)a->dims[0];
    return (size_t)x->strides[0] * sizeof(float) == per &&
           (size_t)y->strides[0] * sizeof(float) == per;
}

/* The cut and the piece for a batch of n under whole plan pn (cut -1:
 * none), worked out once a batch size. */
static void segments_for(cpu_backend *be, const cpu_plan *pn, int n, int *cut, int *m) {
    const dsrt_net *net = be->net;
    if (be->seg_n == n) {
        *cut = be->seg_cut;
        *m = be->seg_m;
        return;
    }
    *cut = -1;
    *m = n;
    size_t llc = net->infer_llc ? net->infer_llc : dsrt__cache_bytes(3);
    if (!llc) llc = dsrt__cache_bytes(2);
    for (int c = net->n_layers - 1; c > 0 && llc && *cut < 0; c--) {
        const dsrt_shape *o = &net->layers[c].out;
        double bytes = 4.0 * o->c * o->h * o->w, widest = 0;
        if (!(bytes * n > llc / 2.0) || !cut_valid(pn, net, c)) continue;
        for (int i = 1; i <= c; i++) {
            const dsrt_shape *q = &net->layers[i].out;
            widest = DSRT_MAX(widest, 4.0 * q->c * q->h * q->w);
        }
        /* The largest power of two whose pieces' widest output fits half
         * the cache. */
        int k = 1;
        while (k * 2 * 2 * widest <= (double)llc) k *= 2;
        if (k >= n || (double)k * o->h * o->w < SEG_MIN_PIXELS) continue;
        *cut = c;
        *m = k;
    }
    be->seg_n = n;
    be->seg_cut = *cut;
    be->seg_m = *m;
}

static int forward_segments(cpu_backend *be, const dsrt_net_batch *batch, const float *x, int cut,
                            int m, int *done) {
    const dsrt_net *net = be->net;
    int n = batch->n, rest = n % m, rc;
    cpu_plan *pm, *pr = NULL, *pn;
    *done = 0;
    /* The plans held at once: fewer than the slots, so none evicts another. */
    if ((rc = plan_get(be, m, 0, &pm)) || (rest && (rc = plan_get(be, rest, 0, &pr))) ||
        (rc = plan_get(be, n, 0, &pn)))
        return rc;
    const dnnl_memory_desc_t *whole = &pn->lp[cut].out.md;
    if (!cut_layouts_match(&pm->lp[cut].out.md, whole) ||
        (pr && !cut_layouts_match(&pr->lp[cut].out.md, whole)))
        return 0;
    size_t per = (size_t)net->input.c * net->input.h * net->input.w,
           img = dnnl_memory_desc_get_size(whole) / (size_t)n;
    char *to = dsrt__cpu_handle(pn->lp[cut].out.mem);
    for (int off = 0; off < n; off += m) {
        int k = DSRT_MIN(m, n - off);
        cpu_plan *p = k == m ? pm : pr;
        be->x = x + (size_t)off * per;
        p->labels = NULL;
        p->soft = NULL;
        if (p->batch && dnnl_memory_set_data_handle(p->batch, (void *)be->x) != dnnl_success)
            return dsrt__fail(DSRT_EBACKEND, "cpu backend: input handle");
        if ((rc = run_steps(be, p, p->fwd, p->n_fwd, 0, 0, cut))) return rc;
        memcpy(to + (size_t)off * img, dsrt__cpu_handle(p->lp[cut].out.mem), (size_t)k * img);
    }
    be->x = x;
    pn->labels = batch->labels;
    pn->soft = batch->labels && batch->soft_labels ? batch->soft_labels : NULL;
    if (pn->batch && dnnl_memory_set_data_handle(pn->batch, (void *)x) != dnnl_success)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: input handle");
    be->last_infer = be->last = pn;
    be->seg_cut_run = cut;
    *done = 1;
    return run_steps(be, pn, pn->fwd, pn->n_fwd, 0, cut + 1, INT_MAX);
}

static int cpu_forward(dsrt_backend *b, const dsrt_net_batch *batch, int train) {
    cpu_backend *be = (cpu_backend *)b;
    const dsrt_net *net = be->net;
    /* A training forward moves batchnorm's running statistics: what was
     * made from them (inference's folded weights, and what is made from
     * those) is remade at the next use, as after a step. */
    if (train) be->net->version++;
    int n = batch->n;
    set_threads(net);
    be->pieces = 0;
    be->seg_cut_run = -1;
    const float *x = batch->data;
    if (batch->layout == DSRT_INPUT_U8_NHWC) {
        const dsrt_shape *in = &net->input;
        size_t values = (size_t)n * in->c * in->h * in->w;
        if (values > be->xbuf_n) {
            float *nb = aligned_alloc(64, (values * sizeof(float) + 63) & ~(size_t)63);
            if (!nb) return dsrt__fail(-ENOMEM, "cpu backend: out of memory for a batch");
            free(be->xbuf);
            be->xbuf = nb;
            be->xbuf_n = values;
        }
        dsrt__batch_u8_to_f32(batch->data, be->xbuf, n, in->c, in->h, in->w, batch->sub,
                              batch->div);
        x = be->xbuf;
    }
    int m = piece_size(be, n, train);
    if (m < n) return forward_pieces(be, batch, x, m);
    if (!train && net->opts.fuse >= 2 && !net->keep_outputs && !net->infer_pieces && be->segments) {
        cpu_plan *pn;
        int cut, rc = plan_get(be, n, 0, &pn), done;
        if (rc) return rc;
        segments_for(be, pn, n, &cut, &m);
        if (cut > 0 && ((rc = forward_segments(be, batch, x, cut, m, &done)) || done)) return rc;
    }
    return forward_plan(be, batch, train, x, n, 0);
}

/* The plan for n images run on x, rows [offset, offset + n) of batch. */
static int forward_plan(cpu_backend *be, const dsrt_net_batch *batch, int train, const float *x,
                        int n, int offset) {
    const dsrt_net *net = be->net;
    cpu_plan *p;
    int rc = plan_get(be, n, train, &p);
    if (rc) return rc;
    be->x = x;
    be->grad_scale = 1.0f / (float)(batch->global_n > 0 ? batch->global_n : n);
    p->labels = batch->labels ? batch->labels + offset : NULL;
    p->soft = batch->labels && batch->soft_labels
                  ? batch->soft_labels + (size_t)offset * net->classes
                  : NULL;
    if (p->batch && dnnl_memory_set_data_handle(p->batch, (void *)x) != dnnl_success)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: input handle");
    if (train)
        be->last_train = p;
    else
        be->last_infer = p;
    be->last = p;
    if (train && net->prof) net->prof->open = 0; /* a new step */
    return run_steps(be, p, p->fwd, p->n_fwd, 0, 0, INT_MAX);
}

static int cpu_backward(dsrt_backend *b) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = be->last_train;
    if (!p || !p->labels) return dsrt__fail(-EINVAL, "cpu backend: backward without forward");
    set_threads(be->net);
    int rc = run_steps(be, p, p->bwd, p->n_bwd, 1, 0, INT_MAX);
    if (!rc) dsrt__prof_step_end(be->net);
    return rc;
}

static int cpu_results(dsrt_backend *b, double *loss, int *correct, float *probs) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = be->last;
    if (!p) return dsrt__fail(-EINVAL, "cpu backend: no forward pass");
    if (be->pieces) {
        if (loss) *loss = be->piece_loss;
        if (correct) *correct = be->piece_correct;
        if (probs)
            memcpy(probs, be->piece_probs, (size_t)be->piece_n * be->net->classes * sizeof(float));
        return 0;
    }
    if (loss) *loss = p->loss;
    if (correct) *correct = p->correct;
    if (probs) memcpy(probs, p->probs, (size_t)p->n * be->net->classes * sizeof(float));
    return 0;
}

static int cpu_optimize(dsrt_backend *b, const dsrt_optim_step *s) {
    cpu_backend *be = (cpu_backend *)b;
    dsrt_net_prof *pr = dsrt__prof_on(be->net);
    double t0 = pr ? clock_s() : 0;
    dsrt__optim_host(be->net->params, be->net->grads, s);
    be->net->version++;
    if (pr) {
        pr->opt_s += clock_s() - t0;
        pr->opt_steps++;
    }
    return 0;
}

/* What each member of the OpenMP team runs once. The atomics order every
 * access to the argument before the caller's next step in a way thread
 * sanitizers see (libgomp's own barriers are not instrumented). */
typedef struct {
    int (*fn)(void *, int);
    void *ctx;
    atomic_int ready, done, failures;
} team_arg;

static void team_member(void *arg) {
    team_arg *t = arg;
    (void)atomic_load_explicit(&t->ready, memory_order_acquire);
    int i = omp_get_thread_num ? omp_get_thread_num() : 0;
    if (t->fn(t->ctx, i)) atomic_fetch_add_explicit(&t->failures, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->done, 1, memory_order_release);
}

/* oneDNN runs its primitives on the OpenMP team of the thread that calls
 * it, and libgomp keeps that team's threads between parallel regions, so
 * what fn does to a member (binding it to a core) holds for the compute of
 * every later call. */
static int cpu_run_on_threads(dsrt_backend *b, int (*fn)(void *, int), void *ctx) {
    cpu_backend *be = (cpu_backend *)b;
    if (!GOMP_parallel || !omp_get_thread_num) return fn(ctx, 0) != 0;
    int n = team_size(be);
    set_threads(be->net);
    team_arg t;
    t.fn = fn;
    t.ctx = ctx;
    atomic_init(&t.done, 0);
    atomic_init(&t.failures, 0);
    atomic_init(&t.ready, 0);
    atomic_store_explicit(&t.ready, 1, memory_order_release);
    sigset_t old;
    signals_hold(be, &old);
    GOMP_parallel(team_member, &t, (unsigned)n, 0);
    signals_release(&old);
    (void)atomic_load_explicit(&t.done, memory_order_acquire);
    return atomic_load_explicit(&t.failures, memory_order_relaxed);
}

/* What each member runs in dsrt__cpu_parallel: its share of [0, n). The
 * atomics make the hand-over visible to thread sanitizers, as team_arg's. */
typedef struct {
    void (*fn)(void *, size_t, size_t);
    void *ctx;
    size_t n;
    atomic_int ready, done;
} par_arg;

static void par_member(void *arg) {
    par_arg *a = arg;
    (void)atomic_load_explicit(&a->ready, memory_order_acquire);
    size_t t = (size_t)omp_get_thread_num(), k = (size_t)omp_get_num_threads();
    size_t lo = a->n * t / k, hi = a->n * (t + 1) / k;
    if (lo < hi) a->fn(a->ctx, lo, hi);
    atomic_fetch_add_explicit(&a->done, 1, memory_order_release);
}

void dsrt__cpu_parallel(cpu_backend *be, size_t n, void (*fn)(void *ctx, size_t lo, size_t hi),
                        void *ctx) {
    if (!n) return;
    size_t t =
        GOMP_parallel && omp_get_thread_num && omp_get_num_threads ? (size_t)team_size(be) : 1;
    if (t > n) t = n;
    if (t <= 1) {
        fn(ctx, 0, n);
        return;
    }
    par_arg a = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&a.done, 0);
    atomic_init(&a.ready, 0);
    atomic_store_explicit(&a.ready, 1, memory_order_release);
    GOMP_parallel(par_member, &a, (unsigned)t, 0);
    (void)atomic_load_explicit(&a.done, memory_order_acquire);
}

/* Bytes of every memory of a plan that is a layer's output or a temporary
 * of the forward: pooled ones (their bases), else the outputs and what
 * oneDNN allocated that is neither weights nor the caller's. */
static int cpu_activation_bytes(dsrt_backend *b, int n, int train, size_t *held, size_t *each) {
    cpu_backend *be = (cpu_backend *)b;
    const cpu_plan *p = NULL;
    n = piece_size(be, n, train); /* a batch run in pieces holds a piece's */
    for (int k = 0; k < PLAN_SLOTS && !p; k++)
        if (be->plans[k] && be->plans[k]->n == n && be->plans[k]->train == train) p = be->plans[k];
    if (!p) return -ENOENT;
    *held = *each = 0;
    if (p->pool_acts) {
        for (size_t k = 0; k < p->n_diffs; k++)
            if (p->diffs[k].base == (int)k) *each += p->diffs[k].size;
        *held = p->diff_pool_size;
    }
    /* Outputs with bytes of their own (every one in a plan that pools none). */
    for (int i = 0; i < p->n_layers; i++) {
        dnnl_memory_t m = p->lp[i].out.mem;
        int first = m != NULL;
        for (int j = 0; j < i && first; j++) first = p->lp[j].out.mem != m;
        if (!first || (p->pool_acts && diff_index(p, m) >= 0) || m == p->batch) continue;
        size_t bytes = dnnl_memory_desc_get_size(dsrt__cpu_md_of(m));
        *held += bytes;
        *each += bytes;
    }
    return 0;
}

static int cpu_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cpu backend: no forward pass to read");
    const dsrt_layer *L = &be->net->layers[layer];
    if (!train && be->pieces)
        return dsrt__fail(-EINVAL,
                          "cpu backend: layer '%s': the last inference ran in pieces, whose "
                          "outputs are not kept (keep_outputs keeps the batch whole)",
                          L->name);
    if (!train && layer < be->seg_cut_run)
        return dsrt__fail(-EINVAL,
                          "cpu backend: layer '%s': the last inference ran its first layers in "
                          "pieces, whose outputs are not kept (keep_outputs keeps the batch whole)",
                          L->name);
    /* In a fused inference plan a chain's layers but the last share one
     * output, which holds the last one's values. */
    int owner = p->taken_by && p->taken_by[layer] >= 0 ? p->taken_by[layer] : layer;
    const cpu_fusion *f = dsrt__cpu_fusion(p, owner);
    if (f && f->last != layer)
        return dsrt__fail(-EINVAL,
                          "cpu backend: layer '%s': its output is fused into layer '%s''s in the "
                          "inference plan (the net option fuse = 0 keeps it)",
                          L->name, be->net->layers[f->last].name);
    /* A batchnorm's output its add normalised on the way in: written now. */
    if (p->lp[layer].defer) p->lp[layer].write_out(be, p, layer);
    dnnl_memory_t have = p->lp[layer].out.mem;
    /* A pooled output whose last reader is not the last layer shares its
     * bytes with later tensors: gone once the forward is over. */
    int e = p->pool_acts ? diff_index(p, have) : -1;
    if (e >= 0 && p->diffs[p->diffs[e].base].hi < p->n_layers - 1)
        return dsrt__fail(-EINVAL,
                          "cpu backend: layer '%s': its output's memory is reused by later layers "
                          "in the inference plan (the net option fuse = 1 keeps it)",
                          L->name);
    dnnl_memory_desc_t plain;
    if (dsrt__cpu_md_plain_like(&plain, dsrt__cpu_md_of(have))) return DSRT_EBACKEND;
    dnnl_memory_t user = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    int rc = 0;
    dnnl_status_t st = dnnl_memory_create(&user, &plain, be->engine, out);
    if (st == dnnl_success)
        st = dnnl_reorder_primitive_desc_create(&pd, dsrt__cpu_md_of(have), be->engine, &plain,
                                                be->engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&prim, pd);
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, have}, {DNNL_ARG_TO, user}};
        sigset_t old;
        signals_hold(be, &old);
        st = dnnl_primitive_execute(prim, be->stream, 2, args);
        if (st == dnnl_success) st = dnnl_stream_wait(be->stream);
        signals_release(&old);
    }
    if (st != dnnl_success) rc = dsrt__cpu_fail(st, "read output", L);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(user);
    return rc;
}

// ----------------------------------------------------------------------------
// Lifetime and the ops table

static void cpu_destroy(dsrt_backend *b) {
    cpu_backend *be = (cpu_backend *)b;
    if (!be) return;
    for (int k = 0; k < PLAN_SLOTS; k++) plan_free(be->plans[k]);
    if (be->stream) dnnl_stream_destroy(be->stream);
    if (be->engine) dnnl_engine_destroy(be->engine);
    free(be->xbuf);
    free(be->piece_probs);
    free(be->wino_scratch);
    free(be);
}

static int cpu_create(dsrt_backend **out, dsrt_net *net) {
    const dsrt_layer *L = NULL;
    if (net->opts.precision == DSRT_PRECISION_BF16)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "%s: precision bf16: the CPU backend computes in float32 only (bf16 is "
                          "for GPUs)",
                          net->source);
    /* TensorFloat-32 is a GPU product format: float32 here. */
    net->precision = DSRT_PRECISION_FP32;
    cpu_backend *be = dsrt__calloc(1, sizeof *be);
    if (!be) return -ENOMEM;
    be->net = net;
    be->grad_scale = 1.0f;
    be->block = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core ? 16 : 8;
    /* DSRT_MAX_CPU_ISA caps dsrt's own C steps as it caps augmentation. */
    const char *cap = getenv("DSRT_MAX_CPU_ISA");
    cpu_isa top = CPU_ISA_AVX512;
    if (cap && cap[0]) {
        if (!strcasecmp(cap, "scalar"))
            top = CPU_ISA_BASE;
        else if (!strcasecmp(cap, "avx2"))
            top = CPU_ISA_AVX2;
        else if (strcasecmp(cap, "avx512")) {
            free(be);
            return dsrt__fail(DSRT_EOPTION,
                              "cpu backend: DSRT_MAX_CPU_ISA: '%s' is not scalar, avx2 or avx512",
                              cap);
        }
    }
    be->isa = CPU_ISA_BASE;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (top >= CPU_ISA_AVX512 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw"))
        be->isa = CPU_ISA_AVX512;
    else if (top >= CPU_ISA_AVX2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        be->isa = CPU_ISA_AVX2;
#else
    (void)top;
#endif
    /* DSRT_CPU_LAYOUT=blocked|nhwc overrides the per-layer choice (for
     * measurements). */
    const char *lay = getenv("DSRT_CPU_LAYOUT");
    be->layout = lay && !strcmp(lay, "blocked") ? LAYOUT_BLOCKED
                 : lay && !strcmp(lay, "nhwc")  ? LAYOUT_NHWC
                                                : LAYOUT_AUTO;
    /* oneDNN chooses direct or Winograd per convolution (Winograd F(4x4,
     * 3x3) for 3x3 stride-1 layers at large batches: cifar trains 1.4x
     * faster); DSRT_CPU_CONV=direct forbids Winograd. */
    const char *alg = getenv("DSRT_CPU_CONV");
    be->conv_alg = alg && !strcmp(alg, "direct") ? dnnl_convolution_direct : dnnl_convolution_auto;
    /* DSRT_CPU_SEGMENTS=0: inference batches of dense nets whole, never in
     * segments (forward_segments). */
    const char *seg = getenv("DSRT_CPU_SEGMENTS");
    be->segments = !(seg && !strcmp(seg, "0"));
    be->seg_n = -1;
    be->seg_cut_run = -1;
    /* DSRT_CPU_WINO_TILE=2|4: the output tile of dsrt's own Winograd
     * convolutions (nn/backend_cpu_winograd.c), for measurements and the
     * tests of both. */
    const char *tile = getenv("DSRT_CPU_WINO_TILE");
    be->wino_tile = tile && !strcmp(tile, "2") ? 2 : tile && !strcmp(tile, "4") ? 4 : 0;
    /* Depthwise convolutions' weight gradients run on dsrt's own step where
     * oneDNN has no fast kernel for them (nn/layers/conv.c);
     * DSRT_CPU_DEPTHWISE=onednn leaves them all to oneDNN. */
    const char *dw = getenv("DSRT_CPU_DEPTHWISE");
    be->depthwise = !(dw && !strcmp(dw, "onednn"));
    /* 1x1 convolutions' weight gradients run on dsrt's own kernel on AVX2
     * (nn/backend_cpu_pointwise.c); DSRT_CPU_POINTWISE=onednn leaves them
     * to oneDNN. */
    const char *pw = getenv("DSRT_CPU_POINTWISE");
    be->pointwise = !(pw && !strcmp(pw, "onednn"));
    /* The same kernel takes the weights' gradient of strided convolutions
     * with larger filters a tap at a time (nn/layers/conv.c);
     * DSRT_CPU_PW_TAPS=0 leaves those to oneDNN. */
    const char *taps = getenv("DSRT_CPU_PW_TAPS");
    be->pw_taps = be->pointwise && !(taps && !strcmp(taps, "0"));
    /* A batchnorm whose one taker is an add leaves its output to the add,
     * which normalises on the way in (nn/layers/batchnorm.c);
     * DSRT_CPU_BATCHNORM=onednn keeps oneDNN's forward for every one. */
    const char *bn = getenv("DSRT_CPU_BATCHNORM");
    be->batchnorm = !(bn && !strcmp(bn, "onednn"));
    dnnl_status_t st = dnnl_engine_create(&be->engine, dnnl_cpu, 0);
    if (st == dnnl_success)
        st = dnnl_stream_create(&be->stream, be->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        cpu_destroy((dsrt_backend *)be);
        return dsrt__cpu_fail(st, "engine", L);
    }
    *out = (dsrt_backend *)be;
    return 0;
}

const dsrt_backend_ops dsrt__backend_cpu = {
    .name = "cpu-onednn",
    .device_kind = 0,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .stage = cpu_stage,
    .stage_wait = cpu_stage_wait,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .results = cpu_results,
    .optimize = cpu_optimize,
    .run_on_threads = cpu_run_on_threads,
    .read_output = cpu_read_output,
    .activation_bytes = cpu_activation_bytes,
    .bn_sync = 1,
};
