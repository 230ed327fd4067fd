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
 * Two environment variables override the choices, for measurements:
 * DSRT_CPU_LAYOUT=blocked|nhwc (every convolution in that layout) and
 * DSRT_CPU_CONV=direct (no Winograd).
 */
#include "internal.h"

#include "arith.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* From the OpenMP runtime oneDNN loads (libgomp); weak so that the library
 * links and runs without it (then the count is OpenMP's default and the team
 * is not reached for binding). */
extern void omp_set_num_threads(int n) __attribute__((weak));
extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
    __attribute__((weak));
extern int omp_get_thread_num(void) __attribute__((weak));
extern int omp_get_max_threads(void) __attribute__((weak));

#define PLAN_SLOTS 4

// ----------------------------------------------------------------------------
// Plans

typedef struct cpu_backend cpu_backend;
typedef struct cpu_plan cpu_plan;

typedef enum {
    STEP_ALWAYS = 0,
    STEP_WEIGHTS, /* a weight reorder: runs only when the parameters changed */
} step_kind;

typedef struct {
    dnnl_primitive_t prim; /* NULL: fn */
    int (*fn)(cpu_backend *be, cpu_plan *p, int layer);
    int layer;
    step_kind kind;
    uint64_t *cache; /* STEP_WEIGHTS: the version the copy was made from */
    int nargs;
    dnnl_exec_arg_t args[DSRT_INPUTS_MAX + 8];
} step;

typedef struct {
    dnnl_memory_desc_t md;
    dnnl_memory_t mem;  /* the layer's output */
    dnnl_memory_t diff; /* gradient of the loss with respect to it (training) */
} tensor;

typedef struct {
    tensor out;
    dnnl_memory_t src;       /* what the main primitive read (after a reorder) */
    dnnl_memory_t mean, var; /* batchnorm statistics of the batch */
    float *mask;             /* dropout: (size of out) 0 or 1/(1-p) */
    size_t mask_n;
    float *fc_t;              /* plain fc: (outputs, n) product before the transpose */
    dnnl_memory_t fc_w, fc_b; /* plain fc: weights and bias in the flat buffer */
    dnnl_memory_t plain_in;   /* softmax: the logits, plain (n, classes) */
    dnnl_memory_t plain_diff; /* softmax, dropout: the input gradient, plain, before a reorder */
    uint64_t w_fwd_version, w_bwd_version;
    /* Synchronised batchnorm (plain NCHW data): the gradient of the input
     * as the primitive wrote it, the sums handed to the net's hook, and
     * the values per channel over the global batch. */
    dnnl_memory_t bn_dsrc;
    double *bn_sums; /* (2c + 1) */
    double bn_count;
} layer_plan;

/*
 * A gradient tensor of a plan. Layer i's output gradient lives from the
 * backward of the last layer taking that output, which writes it first, to
 * layer i's own backward, which reads it last (the gradient an add shares
 * with its inputs: over all of their lives); a scratch tensor that sums one
 * part of a gradient lives within one layer's backward. Tensors whose lives
 * do not overlap take the same bytes of the plan's pool, so a deep net's
 * backward holds a few layers' gradients at a time, not one for every layer.
 * The memories are made without a buffer and given their bytes when the
 * plan is complete (diff_pool_make). A view (the same bytes in another
 * shape, or a part of them) takes its base's bytes.
 */
typedef struct {
    dnnl_memory_t mem;
    int base;            /* the entry whose bytes it takes: itself for a tensor of its own */
    int lo, hi;          /* its life, in layers (a base's: over every view of it) */
    size_t size, offset; /* bytes, and where they start in the pool (bases) */
} diff_entry;

struct cpu_plan {
    int n, train;
    int bn_sync; /* built for synchronised batchnorm (net->bn_sync_fn set) */
    int n_layers;
    uint64_t used; /* for least-recently-used eviction */
    layer_plan *lp;
    step *fwd, *bwd;
    size_t n_fwd, cap_fwd, n_bwd, cap_bwd;
    /* Everything created for the plan, destroyed with it. */
    dnnl_memory_t *mems;
    size_t n_mems, cap_mems;
    dnnl_primitive_t *prims;
    size_t n_prims, cap_prims;
    dnnl_memory_t *scratch_mems; /* share one buffer */
    size_t n_scratch, cap_scratch;
    void *scratch;
    size_t scratch_size;
    /* (n_layers) the last layer (in the written order) that takes layer j's
     * output: backward runs last to first, so it writes j's gradient first
     * and the others add theirs (grad_target). */
    int *last_use;
    /* (n_layers) an add's output gradient, made for the first of it and the
     * inputs sharing it (net.c's grad_share), which take its buffer when
     * their layout is the same. */
    dnnl_memory_t *share;
    /* The gradients of the layers' outputs and the scratch tensors that sum
     * a gradient's parts (diff_new): one pool of bytes. */
    diff_entry *diffs;
    size_t n_diffs, cap_diffs;
    void *diff_pool;
    size_t diff_pool_size;
    float *probs; /* (n, classes) */
    const int32_t *labels;
    const float *soft; /* (n, classes) soft targets, or NULL: one-hot labels */
    double loss;
    int correct;
};

typedef enum { LAYOUT_AUTO = 0, LAYOUT_BLOCKED, LAYOUT_NHWC } layout_mode;

struct cpu_backend {
    dsrt_net *net;
    int block;          /* channel block of oneDNN's blocked layouts: 16 (AVX-512) or 8 */
    layout_mode layout; /* of convolutions */
    dnnl_alg_kind_t conv_alg;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_plan *plans[PLAN_SLOTS];
    cpu_plan *last_train, *last_infer;
    uint64_t clock;
    const float *x;   /* the batch of the current forward */
    cpu_plan *last;   /* the plan of the last forward */
    float grad_scale; /* 1 / images the loss gradient is averaged over */
    float *xbuf;      /* uint8 batches converted to float */
    size_t xbuf_n;
    pthread_t team_master; /* the thread whose OpenMP team holds signals, */
    int team_held;         /* and that team's size (0: none yet) */
};

static int dnnl_fail(dnnl_status_t st, const char *what, const dsrt_layer *l) {
    if (l)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: layer '%s' (%s, line %d): %s: %s", l->name,
                          l->type, l->line, what, dnnl_status2str(st));
    return dsrt__fail(DSRT_EBACKEND, "cpu backend: %s: %s", what, dnnl_status2str(st));
}

#define DN(what, call)                                                                             \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) return dnnl_fail(st_, what, L);                                   \
    } while (0)

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
static void arg(step *s, int what, dnnl_memory_t m) {
    if (!m) return;
    s->args[s->nargs].arg = what;
    s->args[s->nargs].memory = m;
    s->nargs++;
}

/* A memory of md: on handle (the flat buffers, user data), or allocated by
 * oneDNN when handle is NULL. Owned by the plan. */
static int mem_new(cpu_plan *p, const dnnl_memory_desc_t *md, dnnl_engine_t eng, void *handle,
                   dnnl_memory_t *out, const dsrt_layer *L) {
    *out = NULL;
    if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) return -ENOMEM;
    DN("memory", dnnl_memory_create(out, md, eng, handle ? handle : DNNL_MEMORY_ALLOCATE));
    p->mems[p->n_mems++] = *out;
    return 0;
}

static const dnnl_memory_desc_t *md_of(dnnl_memory_t m) {
    const dnnl_memory_desc_t *md = NULL;
    dnnl_memory_get_memory_desc(m, &md);
    return md;
}

static void *handle_of(dnnl_memory_t m) {
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
static int diff_same(const cpu_plan *p, dnnl_memory_t a, dnnl_memory_t b) {
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
static int diff_new(cpu_plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *md, int lo, int hi,
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

/* The lowest offset, a multiple of 64, where base k's bytes meet no bytes
 * of a placed base whose life overlaps k's. */
static size_t diff_place(const cpu_plan *p, const int *placed, size_t n_placed, int k) {
    const diff_entry *e = &p->diffs[k];
    size_t off = 0;
    for (size_t j = 0; j < n_placed;) {
        const diff_entry *q = &p->diffs[placed[j]];
        int alive = !(q->hi < e->lo || e->hi < q->lo);
        if (alive && off < q->offset + q->size && q->offset < off + e->size) {
            off = (q->offset + q->size + 63) & ~(size_t)63;
            j = 0; /* moved: check every placed one again */
        } else {
            j++;
        }
    }
    return off;
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
    int *order = dsrt__malloc(p->n_diffs * sizeof *order);
    if (!order) return -ENOMEM;
    size_t n = 0;
    for (size_t k = 0; k < p->n_diffs; k++) {
        if (p->diffs[k].base != (int)k) continue;
        size_t at = n++; /* insertion by size, largest first; ties by index */
        while (at > 0 && p->diffs[order[at - 1]].size < p->diffs[k].size) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = (int)k;
    }
    size_t total = 0;
    for (size_t j = 0; j < n; j++) {
        diff_entry *e = &p->diffs[order[j]];
        e->offset = diff_place(p, order, j, order[j]);
        total = DSRT_MAX(total, e->offset + e->size);
    }
    free(order);
    p->diff_pool_size = (total + 63) & ~(size_t)63;
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

static int attr_new(dnnl_primitive_attr_t *attr, int relu, float leak, const dsrt_layer *L) {
    DN("attributes", dnnl_primitive_attr_create(attr));
    DN("attributes", dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user));
    if (relu) {
        dnnl_post_ops_t po;
        DN("post-ops", dnnl_post_ops_create(&po));
        dnnl_status_t st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, leak, 0.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(*attr, po);
        dnnl_post_ops_destroy(po);
        if (st != dnnl_success) return dnnl_fail(st, "post-ops", L);
    }
    return 0;
}

/* Creates pd from an op descriptor with the plan's attributes. */
static int pd_new(dnnl_primitive_desc_t *pd, const void *desc, cpu_backend *be, int relu,
                  float leak, const_dnnl_primitive_desc_t hint, const char *what,
                  const dsrt_layer *L) {
    dnnl_primitive_attr_t attr;
    int rc = attr_new(&attr, relu, leak, L);
    if (rc) return rc;
    dnnl_status_t st = dnnl_primitive_desc_create(pd, desc, attr, be->engine, hint);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dnnl_fail(st, what, L);
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
static int prim_step(cpu_plan *p, cpu_backend *be, const_dnnl_primitive_desc_t pd, int backward,
                     int layer, step **out, const dsrt_layer *L) {
    dnnl_primitive_t prim;
    dnnl_memory_t scratch;
    int rc = prim_new(p, be, pd, &prim, &scratch, L);
    if (rc) return rc;
    step *s = backward ? bwd_step(p) : fwd_step(p);
    if (!s) return -ENOMEM;
    s->prim = prim;
    s->layer = layer;
    arg(s, DNNL_ARG_SCRATCHPAD, scratch);
    *out = s;
    return 0;
}

/* A reorder step from one memory to another. */
static int reorder_step(cpu_plan *p, cpu_backend *be, dnnl_memory_t from, dnnl_memory_t to,
                        int backward, int layer, step_kind kind, uint64_t *cache,
                        const dsrt_layer *L) {
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    int rc = attr_new(&attr, 0, 0, L);
    if (rc) return rc;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, md_of(from), be->engine, md_of(to),
                                                          be->engine, attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dnnl_fail(st, "reorder", L);
    step *s;
    rc = prim_step(p, be, pd, backward, layer, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    arg(s, DNNL_ARG_FROM, from);
    arg(s, DNNL_ARG_TO, to);
    s->kind = kind;
    s->cache = cache;
    return 0;
}

/* have in the layout want: have itself, or a new memory filled by a reorder
 * step added now. */
static int ensure(cpu_plan *p, cpu_backend *be, dnnl_memory_t have, const dnnl_memory_desc_t *want,
                  int backward, int layer, dnnl_memory_t *out, const dsrt_layer *L) {
    if (dnnl_memory_desc_equal(md_of(have), want)) {
        *out = have;
        return 0;
    }
    int rc = mem_new(p, want, be->engine, NULL, out, L);
    if (rc) return rc;
    return reorder_step(p, be, have, *out, backward, layer, STEP_ALWAYS, NULL, L);
}

/* Where a primitive producing layout `made` should write so that the result
 * lands in target: target itself, or a temporary (*tmp) that the caller
 * reorders into target after the primitive's step. */
static int deliver(cpu_plan *p, cpu_backend *be, dnnl_memory_t target,
                   const dnnl_memory_desc_t *made, dnnl_memory_t *out, dnnl_memory_t *tmp,
                   const dsrt_layer *L) {
    *tmp = NULL;
    if (dnnl_memory_desc_equal(md_of(target), made)) {
        *out = target;
        return 0;
    }
    int rc = mem_new(p, made, be->engine, NULL, tmp, L);
    *out = *tmp;
    return rc;
}

static int md_plain(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims) {
    static const dnnl_format_tag_t tags[] = {0, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde};
    return dnnl_memory_desc_init_by_tag(md, ndims, dims, dnnl_f32, tags[ndims]) == dnnl_success
               ? 0
               : DSRT_EBACKEND;
}

static int md_any(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims) {
    return dnnl_memory_desc_init_by_tag(md, ndims, dims, dnnl_f32, dnnl_format_tag_any) ==
                   dnnl_success
               ? 0
               : DSRT_EBACKEND;
}

/* The same logical tensor as md, in plain (row-major) layout. */
static int md_plain_like(dnnl_memory_desc_t *out, const dnnl_memory_desc_t *md) {
    return md_plain(out, md->ndims, md->dims);
}

// ----------------------------------------------------------------------------
// C steps

static int step_normalize(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[0];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    const float *st = net->state + l->s_off;
    float *y = handle_of(p->lp[0].out.mem);
    for (int ch = 0; ch < c; ch++) {
        float a, o;
        dsrt_input_affine(l->o.norm, st, c, ch, &a, &o);
        for (int b = 0; b < p->n; b++) {
            const float *xs = be->x + ((size_t)b * c + ch) * hw;
            float *ys = y + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) ys[k] = dsrt_input_apply(a, o, xs[k]);
        }
    }
    return 0;
}

static int step_bn_running(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    int c = l->out.c;
    const float *mean = handle_of(p->lp[i].mean), *var = handle_of(p->lp[i].var);
    float *rm = net->state + l->s_off, *rv = rm + c;
    double count = p->bn_sync ? p->lp[i].bn_count : (double)p->n * l->out.h * l->out.w;
    float m = l->o.momentum, unbias = count > 1 ? (float)(count / (count - 1)) : 1.0f;
    for (int k = 0; k < c; k++) {
        rm[k] = (1.0f - m) * rm[k] + m * mean[k];
        rv[k] = (1.0f - m) * rv[k] + m * var[k] * unbias;
    }
    return 0;
}

/* Synchronised batchnorm, forward: the batch statistics over every
 * worker's batch. Sums of x and x^2 per channel over this batch's plain
 * NCHW input go through the net's hook (which sums them over the workers);
 * the mean and the biased variance come from the totals, and the primitive
 * normalises with them as given statistics. */
static int step_bn_sync_fwd(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    const float *x = handle_of(lp->src);
    double *sums = lp->bn_sums;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, q = 0;
        for (int b = 0; b < p->n; b++) {
            const float *xs = x + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) {
                s += xs[k];
                q += (double)xs[k] * xs[k];
            }
        }
        sums[ch] = s;
        sums[c + ch] = q;
    }
    sums[2 * c] = (double)p->n * (double)hw;
    dsrt_bn_sums bs = {i, 0, c, sums, (size_t)2 * c + 1, DSRT_DEVICE_CPU, NULL};
    int rc = net->bn_sync_fn(net->bn_sync_ctx, &bs);
    if (rc) return rc;
    double count = sums[2 * c];
    if (!(count > 0))
        return dsrt__fail(DSRT_EBACKEND, "%s: synchronised batchnorm: %g values over the workers",
                          l->name, count);
    lp->bn_count = count;
    float *mean = handle_of(lp->mean), *var = handle_of(lp->var);
    for (int ch = 0; ch < c; ch++) {
        double m = sums[ch] / count, v = sums[c + ch] / count - m * m;
        mean[ch] = (float)m;
        var[ch] = (float)(v > 0 ? v : 0);
    }
    return 0;
}

/* Synchronised batchnorm, backward. The primitive, run with the statistics
 * as given constants, wrote dx = scale / sigma * dy' (dy' after the fused
 * ReLU) and the local sums of dy' (the shift's gradient) and of dy' * xhat
 * (the scale's). Over the global batch of M values a channel, the gradient
 * also has the terms of the mean and variance:
 *     dx -= scale / sigma * (sum dy' + xhat * sum dy' xhat) / M
 * with the sums over every worker, which the hook gives. The parameters'
 * own gradients stay local sums: the gradient all-reduce adds them up. */
static int step_bn_sync_bwd(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    int c = l->out.c;
    size_t hw = (size_t)l->out.h * l->out.w;
    double *sums = lp->bn_sums;
    const float *x = handle_of(lp->src), *mean = handle_of(lp->mean), *var = handle_of(lp->var);
    /* The local sums of dy' (behind the fused ReLU: where the output is not
     * positive, none) and of dy' xhat, in double as the forward's: the
     * correction below cancels against scale / sigma * dy', so float sums
     * (the primitive's parameter gradients) would set how far one worker
     * and several drift apart, layer after layer. The parameter gradients
     * become these sums rounded. */
    const float *dy = handle_of(lp->out.diff), *y = handle_of(lp->out.mem);
    float *dshift = net->grads + l->b_off, *dscale = net->grads + l->w_off;
    for (int ch = 0; ch < c; ch++) {
        double inv_sigma = 1.0 / sqrt((double)var[ch] + l->o.eps), mu = mean[ch], s1 = 0, s2 = 0;
        for (int b = 0; b < p->n; b++) {
            size_t at = ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) {
                double g = dy[at + k];
                if (l->fuse_relu && !(y[at + k] > 0)) g = 0;
                s1 += g;
                s2 += g * ((x[at + k] - mu) * inv_sigma);
            }
        }
        sums[ch] = s1;
        sums[c + ch] = s2;
        dshift[ch] = (float)s1;
        dscale[ch] = (float)s2;
    }
    dsrt_bn_sums bs = {i, 1, c, sums, (size_t)2 * c, DSRT_DEVICE_CPU, NULL};
    int rc = net->bn_sync_fn(net->bn_sync_ctx, &bs);
    if (rc) return rc;
    const float *scale = net->params + l->w_off;
    float *dx = handle_of(lp->bn_dsrc);
    double inv_m = 1.0 / lp->bn_count;
    for (int ch = 0; ch < c; ch++) {
        double inv_sigma = 1.0 / sqrt((double)var[ch] + l->o.eps);
        double a = scale[ch] * inv_sigma;
        double k1 = a * sums[ch] * inv_m, k2 = a * sums[c + ch] * inv_m * inv_sigma;
        double mu = mean[ch];
        for (int b = 0; b < p->n; b++) {
            const float *xs = x + ((size_t)b * c + ch) * hw;
            float *ds = dx + ((size_t)b * c + ch) * hw;
            for (size_t k = 0; k < hw; k++) ds[k] = (float)(ds[k] - k1 - (xs[k] - mu) * k2);
        }
    }
    return 0;
}

/* Masks are indexed by the logical NCHW position of each value (the layer
 * works on the plain layout), as nn/arith.h defines them for every backend:
 * one draw of the layer's generator gives two elements' masks. */
static int step_dropout_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_net *net = be->net;
    const dsrt_layer *l = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    const float *x = handle_of(lp->src);
    float *y = handle_of(lp->out.mem), *m = lp->mask;
    size_t n = lp->mask_n;
    float keep = dsrt_dropout_scale(l->o.p);
    uint32_t thresh = dsrt_dropout_threshold(l->o.p);
    dsrt_rng rng = dsrt_dropout_rng(net->opts.seed, (uint64_t)net->iteration, (uint64_t)i);
    for (size_t k = 0; k < n; k += 2) {
        uint64_t r = dsrt_rng_u64(&rng);
        m[k] = (uint32_t)r >= thresh ? keep : 0.0f;
        if (k + 1 < n) m[k + 1] = (uint32_t)(r >> 32) >= thresh ? keep : 0.0f;
    }
    for (size_t k = 0; k < n; k++) y[k] = x[k] * m[k];
    return 0;
}

static int step_dropout_bwd(cpu_backend *be, cpu_plan *p, int i) {
    layer_plan *lp = &p->lp[i];
    const float *dy = handle_of(lp->out.diff), *m = lp->mask;
    float *dx = handle_of(lp->plain_diff);
    for (size_t k = 0; k < lp->mask_n; k++) dx[k] = dy[k] * m[k];
    return 0;
}

static int step_softmax_fwd(cpu_backend *be, cpu_plan *p, int i) {
    int k = be->net->classes;
    const float *z = handle_of(p->lp[i].plain_in);
    double loss = 0;
    int correct = 0;
    for (int b = 0; b < p->n; b++) {
        const float *zb = z + (size_t)b * k;
        float *pb = p->probs + (size_t)b * k;
        float mx = zb[0];
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (zb[j] > mx) mx = zb[j], arg = j;
        double sum = 0;
        for (int j = 0; j < k; j++) sum += exp((double)zb[j] - mx);
        double inv = 1.0 / sum, lse = log(sum);
        for (int j = 0; j < k; j++) pb[j] = (float)(exp((double)zb[j] - mx) * inv);
        if (p->soft) {
            const float *tb = p->soft + (size_t)b * k;
            for (int j = 0; j < k; j++)
                if (tb[j] != 0) loss += (double)tb[j] * (lse - ((double)zb[j] - mx));
        }
        if (p->labels) {
            int y = p->labels[b];
            if (!p->soft) loss += lse - ((double)zb[y] - mx);
            correct += arg == y;
        }
        if (!isfinite(mx)) loss = NAN;
    }
    p->loss = loss / p->n;
    p->correct = correct;
    return 0;
}

static int step_softmax_bwd(cpu_backend *be, cpu_plan *p, int i) {
    int k = be->net->classes;
    float *d = handle_of(p->lp[i].plain_diff);
    float inv = be->grad_scale;
    for (int b = 0; b < p->n; b++) {
        const float *pb = p->probs + (size_t)b * k;
        float *db = d + (size_t)b * k;
        if (p->soft) {
            /* d/dz_j of -sum_i t_i log p_i = p_j * sum_i t_i - t_j */
            const float *tb = p->soft + (size_t)b * k;
            double sum = 0;
            for (int j = 0; j < k; j++) sum += tb[j];
            for (int j = 0; j < k; j++) db[j] = (float)((pb[j] * sum - tb[j]) * inv);
            continue;
        }
        for (int j = 0; j < k; j++) db[j] = pb[j] * inv;
        db[p->labels[b]] -= inv;
    }
    return 0;
}

/* Plain fully connected forward as one sgemm, y^T (outputs x n) = W (outputs
 * x in) * x^T, then bias, ReLU and the transpose to y (n x outputs) in one
 * pass. With few images and many weights this orientation streams W once;
 * oneDNN 2.6's inner product computes x * W^T and runs 3-4x slower on such
 * shapes (AlexNet fc6: 62 ms against 15 ms on two cores). */
static int step_fc_fwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    int n = p->n, oc = L->out.c, ic = L->in.c * L->in.h * L->in.w;
    const float *x = handle_of(lp->src), *w = handle_of(lp->fc_w);
    const float *b = lp->fc_b ? handle_of(lp->fc_b) : NULL;
    float *t = lp->fc_t, *y = handle_of(lp->out.mem);
    dnnl_status_t st = dnnl_sgemm('N', 'T', oc, n, ic, 1.0f, w, ic, x, ic, 0.0f, t, n);
    if (st != dnnl_success) return dnnl_fail(st, "fc sgemm", L);
    float leak = L->fuse_leak;
    for (int o = 0; o < oc; o++) {
        float bo = b ? b[o] : 0.0f;
        const float *to = t + (size_t)o * n;
        for (int k = 0; k < n; k++) {
            float v = to[k] + bo;
            if (L->fuse_relu && v < 0) v *= leak;
            y[(size_t)k * oc + o] = v;
        }
    }
    return 0;
}

static int step_ready(cpu_backend *be, cpu_plan *p, int i) {
    dsrt__net_grads_ready(be->net, i);
    return 0;
}

static int c_step(cpu_plan *p, int backward, int (*fn)(cpu_backend *, cpu_plan *, int), int layer) {
    step *s = backward ? bwd_step(p) : fwd_step(p);
    if (!s) return -ENOMEM;
    s->fn = fn;
    s->layer = layer;
    return 0;
}

// ----------------------------------------------------------------------------
// Layers

/* Whether convolution L runs in NHWC rather than in the blocked layout that
 * format_tag any gives. The blocked layouts pad channels to the block (16
 * floats on AVX-512), which costs up to 2.5x the arithmetic for channel
 * counts like 20; oneDNN's NHWC convolutions do not pad. */
static int conv_nhwc(const cpu_backend *be, const dsrt_layer *L) {
    if (be->layout == LAYOUT_BLOCKED) return 0;
    if (be->layout == LAYOUT_NHWC) return 1;
    return L->out.c % be->block != 0 || (L->in.c > 4 && L->in.c % be->block != 0);
}

static int md_is(const dnnl_memory_desc_t *md, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t t;
    if (dnnl_memory_desc_init_by_tag(&t, md->ndims, md->dims, dnnl_f32, tag) != dnnl_success)
        return 0;
    return dnnl_memory_desc_equal(md, &t);
}

static int plan_input(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    dnnl_dims_t dims = {p->n, L->out.c, L->out.h, L->out.w};
    /* One channel: NCHW and NHWC are the same bytes; say NHWC, which the
     * convolutions that run in it then take without a copy. */
    if (dnnl_memory_desc_init_by_tag(&out->md, 4, dims, dnnl_f32,
                                     L->out.c == 1 ? dnnl_acdb : dnnl_abcd) != dnnl_success)
        return dnnl_fail(dnnl_invalid_arguments, "input", L);
    if (L->o.norm == DSRT_NORM_NONE) {
        /* The caller's batch, set as the handle at each forward. */
        DN("memory", dnnl_memory_create(&out->mem, &out->md, be->engine, DNNL_MEMORY_NONE));
        if (dsrt__grow((void **)&p->mems, &p->cap_mems, p->n_mems + 1, sizeof *p->mems)) {
            dnnl_memory_destroy(out->mem);
            return -ENOMEM;
        }
        p->mems[p->n_mems++] = out->mem;
        return 0;
    }
    int rc = mem_new(p, &out->md, be->engine, NULL, &out->mem, L);
    if (rc) return rc;
    return c_step(p, 0, step_normalize, i);
}

/* The output tensor of layer i in layout md, and its gradient buffer when
 * backward needs it. */
static int new_output(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *md) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    out->md = *md;
    int rc = mem_new(p, md, be->engine, NULL, &out->mem, L);
    if (rc) return rc;
    if (!p->train || !dsrt__net_need_diff(be->net, i)) return rc;
    int key = be->net->grad_share[i] >= 0 ? be->net->grad_share[i]
              : L->kind == DSRT_LAYER_ADD ? i
                                          : -1;
    dnnl_memory_t first = key >= 0 ? p->share[key] : NULL;
    int hi = DSRT_MAX(i, p->last_use[i]);
    if (first && dnnl_memory_desc_equal(md_of(first), md))
        return diff_new(p, be->engine, md, i, hi, first, &out->diff, L);
    rc = diff_new(p, be->engine, md, i, hi, NULL, &out->diff, L);
    if (!rc && key >= 0 && !first) p->share[key] = out->diff;
    return rc;
}

/* Weights of a conv or fc layer: plain in the flat buffer, in layout want for
 * a primitive. Adds a cached reorder step when they differ. */
static int weights_for(cpu_backend *be, cpu_plan *p, int i, const dnnl_memory_desc_t *plain,
                       const dnnl_memory_desc_t *want, dnnl_memory_t wplain, int backward,
                       uint64_t *cache, dnnl_memory_t *out) {
    const dsrt_layer *L = &be->net->layers[i];
    if (dnnl_memory_desc_equal(plain, want)) {
        *out = wplain;
        return 0;
    }
    int rc = mem_new(p, want, be->engine, NULL, out, L);
    if (rc) return rc;
    *cache = UINT64_MAX;
    return reorder_step(p, be, wplain, *out, backward, i, STEP_WEIGHTS, cache, L);
}

/* Backward of a ReLU fused into layer i: in place on its output gradient. */
static int fused_relu_bwd(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *out = &p->lp[i].out;
    dnnl_eltwise_desc_t d;
    dnnl_primitive_desc_t pd;
    DN("relu backward", dnnl_eltwise_backward_desc_init(&d, dnnl_eltwise_relu_use_dst_for_bwd,
                                                        &out->md, &out->md, L->fuse_leak, 0));
    int rc = pd_new(&pd, &d, be, 0, 0, NULL, "relu backward", L);
    if (rc) return rc;
    step *s;
    rc = prim_step(p, be, pd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    arg(s, DNNL_ARG_DST, out->mem);
    arg(s, DNNL_ARG_DIFF_DST, out->diff);
    arg(s, DNNL_ARG_DIFF_SRC, out->diff);
    return 0;
}

/*
 * Where layer i's backward writes the gradient for its k-th input (in that
 * input's gradient layout): the gradient itself when layer i is the last
 * layer written that takes the input (backward runs last to first, so it
 * writes first), else a scratch tensor (*acc) that grad_add then adds into
 * the gradient: a layer whose output feeds several gets the sum of theirs.
 */
static int grad_target_of(cpu_backend *be, cpu_plan *p, int i, int k, const tensor *in,
                          dnnl_memory_t *out, dnnl_memory_t *acc) {
    const dsrt_layer *L = &be->net->layers[i];
    *acc = NULL;
    if (p->last_use[L->inputs[k]] == i) {
        *out = in->diff;
        return 0;
    }
    int rc = diff_new(p, be->engine, &in->md, i, i, NULL, acc, L);
    *out = *acc;
    return rc;
}

static int grad_target(cpu_backend *be, cpu_plan *p, int i, int k, dnnl_memory_t *out,
                       dnnl_memory_t *acc) {
    const dsrt_layer *L = &be->net->layers[i];
    return grad_target_of(be, p, i, k, &p->lp[L->inputs[k]].out, out, acc);
}

/* Layer L's k-th input as a 4-d tensor (n, c, h, w), for add and concat:
 * the tensor itself, or a fully connected layer's (n, c) output and its
 * gradient seen as (n, c, 1, 1), the same bytes. */
static int input4(cpu_backend *be, cpu_plan *p, const dsrt_layer *L, int k, tensor *out) {
    const tensor *t = &p->lp[L->inputs[k]].out;
    *out = *t;
    if (t->md.ndims == 4) return 0;
    const dsrt_layer *in = &be->net->layers[L->inputs[k]];
    dnnl_dims_t dims = {p->n, in->out.c, in->out.h, in->out.w};
    if (md_plain(&out->md, 4, dims)) return dnnl_fail(dnnl_invalid_arguments, "input view", L);
    int rc = mem_new(p, &out->md, be->engine, handle_of(t->mem), &out->mem, L);
    if (!rc && t->diff) rc = diff_new(p, be->engine, &out->md, -1, -1, t->diff, &out->diff, L);
    return rc;
}
/* diff += acc (when grad_target gave a scratch tensor), a step of layer i's
 * backward. */
static int grad_add(cpu_backend *be, cpu_plan *p, int i, dnnl_memory_t diff, dnnl_memory_t acc) {
    if (!acc) return 0;
    const dsrt_layer *L = &be->net->layers[i];
    dnnl_binary_desc_t d;
    dnnl_primitive_desc_t pd;
    DN("gradient sum",
       dnnl_binary_desc_init(&d, dnnl_binary_add, md_of(diff), md_of(acc), md_of(diff)));
    int rc = pd_new(&pd, &d, be, 0, 0, NULL, "gradient sum", L);
    if (rc) return rc;
    step *s;
    rc = prim_step(p, be, pd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    arg(s, DNNL_ARG_SRC_0, diff);
    arg(s, DNNL_ARG_SRC_1, acc);
    arg(s, DNNL_ARG_DST, diff);
    return 0;
}

/* The weights' gradient of a layer with weights and an optional bias
 * (convolution, fc), once its primitive bpd is made: written into the net's
 * gradients (through a reorder where the primitive wants another layout),
 * then the layer's gradients are ready. ensure_ddst: the output's gradient
 * is reordered to the layout bpd wants (else taken as it is). Destroys bpd. */
static int weights_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
                        const dnnl_memory_desc_t *w_plain, const dnnl_memory_desc_t *b_md,
                        int ensure_ddst) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    dnnl_memory_t src_w, ddst_w = lp->out.diff, dw_plain, dw, dw_tmp, db = NULL;
    step *s;
    int rc = ensure(p, be, lp->src, dnnl_primitive_desc_query_md(bpd, dnnl_query_src_md, 0), 1, i,
                    &src_w, L);
    if (!rc && ensure_ddst)
        rc = ensure(p, be, lp->out.diff,
                    dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_dst_md, 0), 1, i, &ddst_w, L);
    if (!rc) rc = mem_new(p, w_plain, be->engine, net->grads + L->w_off, &dw_plain, L);
    if (!rc)
        rc = deliver(p, be, dw_plain,
                     dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_weights_md, 0), &dw, &dw_tmp,
                     L);
    if (!rc && L->b_n) rc = mem_new(p, b_md, be->engine, net->grads + L->b_off, &db, L);
    if (!rc) rc = prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) return rc;
    arg(s, DNNL_ARG_SRC, src_w);
    arg(s, DNNL_ARG_DIFF_DST, ddst_w);
    arg(s, DNNL_ARG_DIFF_WEIGHTS, dw);
    arg(s, DNNL_ARG_DIFF_BIAS, db);
    if (dw_tmp && (rc = reorder_step(p, be, dw_tmp, dw_plain, 1, i, STEP_ALWAYS, NULL, L)))
        return rc;
    return c_step(p, 1, step_ready, i);
}

/* The input's gradient of a layer with weights (convolution, fc), once its
 * primitive bpd is made: the weights as forward took them (wfwd) when bpd
 * wants that layout, else reordered from the plain ones (wplain); the
 * result added into the input's gradient. ensure_ddst as weights_grad.
 * Destroys bpd. */
static int data_grad(cpu_backend *be, cpu_plan *p, int i, dnnl_primitive_desc_t bpd,
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
        rc = ensure(p, be, lp->out.diff,
                    dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_dst_md, 0), 1, i, &ddst, L);
    if (!rc) {
        if (dnnl_memory_desc_equal(wmd, md_of(wfwd)))
            wb = wfwd; /* fresh from forward */
        else
            rc = weights_for(be, p, i, w_plain, wmd, wplain, 1, &lp->w_bwd_version, &wb);
    }
    dnnl_memory_t tgt = NULL, acc = NULL;
    if (!rc) rc = grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc)
        rc = deliver(p, be, tgt, dnnl_primitive_desc_query_md(bpd, dnnl_query_diff_src_md, 0),
                     &dsrc, &dsrc_tmp, L);
    if (!rc) rc = prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) return rc;
    arg(s, DNNL_ARG_DIFF_DST, ddst);
    arg(s, DNNL_ARG_WEIGHTS, wb);
    arg(s, DNNL_ARG_DIFF_SRC, dsrc);
    if (dsrc_tmp) rc = reorder_step(p, be, dsrc_tmp, tgt, 1, i, STEP_ALWAYS, NULL, L);
    if (!rc) rc = grad_add(be, p, i, in->diff, acc);
    return rc;
}

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
    if (md_any(&src_any, 4, sdims) || md_any(&w_any, wnd, wdims) ||
        md_plain(&w_plain, wnd, wdims) || md_plain(&b_md, 1, bdims) || md_any(&dst_any, 4, ddims))
        return dnnl_fail(dnnl_invalid_arguments, "memory descriptors", L);
    if (conv_nhwc(be, L)) {
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&src_any, 4, sdims, dnnl_f32, dnnl_acdb));
        DN("memory descriptors",
           dnnl_memory_desc_init_by_tag(&dst_any, 4, ddims, dnnl_f32, dnnl_acdb));
    }
    const dnnl_memory_desc_t *bias = L->b_n ? &b_md : NULL;
    dnnl_prop_kind_t prop = p->train ? dnnl_forward_training : dnnl_forward_inference;

    /* Forward */
    dnnl_convolution_desc_t fd;
    dnnl_primitive_desc_t fpd = NULL;
    DN("convolution",
       dnnl_dilated_convolution_forward_desc_init(&fd, prop, conv_alg, &src_any, &w_any, bias,
                                                  &dst_any, strides, dil, pad_l, pad_r));
    if ((rc = pd_new(&fpd, &fd, be, L->fuse_relu, L->fuse_leak, NULL, "convolution", L))) return rc;
    dnnl_memory_t wplain, wfwd, bmem = NULL;
    step *s;
    if ((rc = ensure(p, be, in->mem, dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), 0, i,
                     &lp->src, L)))
        goto out;
    if ((rc = mem_new(p, &w_plain, be->engine, net->params + L->w_off, &wplain, L))) goto out;
    if ((rc = weights_for(be, p, i, &w_plain,
                          dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0), wplain, 0,
                          &lp->w_fwd_version, &wfwd)))
        goto out;
    if (L->b_n && (rc = mem_new(p, &b_md, be->engine, net->params + L->b_off, &bmem, L))) goto out;
    if ((rc = new_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0))))
        goto out;
    if ((rc = prim_step(p, be, fpd, 0, i, &s, L))) goto out;
    arg(s, DNNL_ARG_SRC, lp->src);
    arg(s, DNNL_ARG_WEIGHTS, wfwd);
    arg(s, DNNL_ARG_BIAS, bmem);
    arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train) goto out;

    /* Backward: the fused ReLU, weights, then data. */
    if (L->fuse_relu && (rc = fused_relu_bwd(be, p, i))) goto out;
    {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_weights_desc_init(
            &bd, conv_alg, &src_any, &w_any, bias, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dnnl_fail(st, "convolution backward weights", L);
            goto out;
        }
        if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, "convolution backward weights", L))) goto out;
        if ((rc = weights_grad(be, p, i, bpd, &w_plain, &b_md, 1))) goto out;
    }
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        dnnl_convolution_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_dilated_convolution_backward_data_desc_init(
            &bd, conv_alg, &src_any, &w_any, &dst_any, strides, dil, pad_l, pad_r);
        if (st != dnnl_success) {
            rc = dnnl_fail(st, "convolution backward data", L);
            goto out;
        }
        if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, "convolution backward data", L))) goto out;
        rc = data_grad(be, p, i, bpd, &w_plain, wplain, wfwd, 1);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

static int plan_batchnorm(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int c = L->out.c, rc;
    dnnl_dims_t cdims = {c};
    dnnl_memory_desc_t c_md;
    if (md_plain(&c_md, 1, cdims)) return dnnl_fail(dnnl_invalid_arguments, "batchnorm", L);
    unsigned flags = dnnl_use_scale | dnnl_use_shift | (L->fuse_relu ? dnnl_fuse_norm_relu : 0);
    /* Synchronised: the statistics come from every worker (step_bn_sync_*),
     * the primitive takes them as given, and the data is plain NCHW so that
     * the C steps can walk it. */
    int sync = p->train && p->bn_sync;
    if (!p->train || sync) flags |= dnnl_use_global_stats;
    /* oneDNN 2.6 normalises NHWC with channels off the block only in a slow
     * generic kernel: such inputs are reordered to the blocked layout. */
    dnnl_memory_desc_t data_md = in->md;
    if (sync && md_plain_like(&data_md, &in->md))
        return dnnl_fail(dnnl_invalid_arguments, "batchnorm", L);
    if (sync && !(lp->bn_sums = dsrt__calloc((size_t)2 * c + 1, sizeof *lp->bn_sums)))
        return -ENOMEM;
    if (!sync && in->md.ndims == 4 && md_is(&in->md, dnnl_acdb) && c % be->block != 0)
        DN("batchnorm layout",
           dnnl_memory_desc_init_by_tag(&data_md, 4, in->md.dims, dnnl_f32,
                                        be->block == 16 ? dnnl_aBcd16b : dnnl_aBcd8b));
    if ((rc = ensure(p, be, in->mem, &data_md, 0, i, &lp->src, L))) return rc;
    dnnl_batch_normalization_desc_t fd;
    dnnl_primitive_desc_t fpd;
    DN("batchnorm", dnnl_batch_normalization_forward_desc_init(
                        &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, &data_md,
                        L->o.eps, flags));
    if ((rc = pd_new(&fpd, &fd, be, 0, 0, NULL, "batchnorm", L))) return rc;
    dnnl_memory_t scale, shift, ws = NULL;
    step *s;
    rc = mem_new(p, &c_md, be->engine, net->params + L->w_off, &scale, L);
    if (!rc) rc = mem_new(p, &c_md, be->engine, net->params + L->b_off, &shift, L);
    float *rstats = net->state + L->s_off;
    if (!rc) rc = mem_new(p, &c_md, be->engine, p->train ? NULL : rstats, &lp->mean, L);
    if (!rc) rc = mem_new(p, &c_md, be->engine, p->train ? NULL : rstats + c, &lp->var, L);
    if (!rc) rc = new_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    const dnnl_memory_desc_t *wsmd = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    if (!rc && wsmd && dnnl_memory_desc_get_size(wsmd))
        rc = mem_new(p, wsmd, be->engine, NULL, &ws, L);
    if (!rc && sync) rc = c_step(p, 0, step_bn_sync_fwd, i);
    if (!rc) rc = prim_step(p, be, fpd, 0, i, &s, L);
    if (rc) goto out;
    arg(s, DNNL_ARG_SRC, lp->src);
    arg(s, DNNL_ARG_DST, lp->out.mem);
    arg(s, DNNL_ARG_SCALE, scale);
    arg(s, DNNL_ARG_SHIFT, shift);
    arg(s, DNNL_ARG_MEAN, lp->mean);
    arg(s, DNNL_ARG_VARIANCE, lp->var);
    arg(s, DNNL_ARG_WORKSPACE, ws);
    if (!p->train) goto out;
    if ((rc = c_step(p, 0, step_bn_running, i))) goto out;

    /* Backward: gradients of scale, shift and (always computed) input. */
    {
        dnnl_batch_normalization_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_batch_normalization_backward_desc_init(
            &bd, dnnl_backward, &lp->out.md, &data_md, L->o.eps, flags);
        if (st != dnnl_success) {
            rc = dnnl_fail(st, "batchnorm backward", L);
            goto out;
        }
        if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, "batchnorm backward", L))) goto out;
        dnnl_memory_t dscale, dshift, dsrc = NULL, dsrc_tmp = NULL, tgt = NULL, acc = NULL;
        rc = mem_new(p, &c_md, be->engine, net->grads + L->w_off, &dscale, L);
        if (!rc) rc = mem_new(p, &c_md, be->engine, net->grads + L->b_off, &dshift, L);
        if (!rc && in->diff) rc = grad_target(be, p, i, 0, &tgt, &acc);
        if (!rc && in->diff)
            rc = deliver(p, be, tgt, &data_md, &dsrc, &dsrc_tmp, L);
        else if (!rc)
            rc = mem_new(p, &data_md, be->engine, NULL, &dsrc, L);
        if (!rc) rc = prim_step(p, be, bpd, 1, i, &s, L);
        dnnl_primitive_desc_destroy(bpd);
        if (rc) goto out;
        arg(s, DNNL_ARG_SRC, lp->src);
        arg(s, DNNL_ARG_MEAN, lp->mean);
        arg(s, DNNL_ARG_VARIANCE, lp->var);
        arg(s, DNNL_ARG_DIFF_DST, lp->out.diff);
        arg(s, DNNL_ARG_SCALE, scale);
        arg(s, DNNL_ARG_SHIFT, shift);
        arg(s, DNNL_ARG_WORKSPACE, ws);
        arg(s, DNNL_ARG_DIFF_SRC, dsrc);
        arg(s, DNNL_ARG_DIFF_SCALE, dscale);
        arg(s, DNNL_ARG_DIFF_SHIFT, dshift);
        /* Without a gradient to pass down there is nothing to correct. */
        lp->bn_dsrc = dsrc;
        if (sync && in->diff && (rc = c_step(p, 1, step_bn_sync_bwd, i))) goto out;
        if (dsrc_tmp && (rc = reorder_step(p, be, dsrc_tmp, tgt, 1, i, STEP_ALWAYS, NULL, L)))
            goto out;
        if ((rc = grad_add(be, p, i, in->diff, acc))) goto out;
        rc = c_step(p, 1, step_ready, i);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

/* The op descriptor of a layer that is one primitive each way. */
typedef union {
    dnnl_eltwise_desc_t eltwise;
    dnnl_pooling_v2_desc_t pool;
    dnnl_lrn_desc_t lrn;
} op_desc;

/* Such a layer's backward: how its descriptor is made once the forward
 * chose the output layout (dst), and which forward tensors it reads. */
typedef struct {
    const char *what;
    dnnl_status_t (*init)(op_desc *bd, const dsrt_layer *L, const dnnl_memory_desc_t *src,
                          const dnnl_memory_desc_t *dst);
    int reads_src, reads_dst;
} one_backward;

/*
 * ReLU, pooling and LRN: one primitive forward (descriptor fd) into a new
 * output in the layout it chooses, with its workspace when training, and
 * one backward into the input's gradient when that is needed.
 */
static int plan_one_primitive(cpu_backend *be, cpu_plan *p, int i, const op_desc *fd,
                              const one_backward *b) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_primitive_desc_t fpd;
    int rc = pd_new(&fpd, fd, be, 0, 0, NULL, b->what, L);
    if (rc) return rc;
    dnnl_memory_t ws = NULL;
    step *s;
    rc = new_output(be, p, i, dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0));
    const dnnl_memory_desc_t *wsmd = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    if (!rc && p->train && wsmd && dnnl_memory_desc_get_size(wsmd))
        rc = mem_new(p, wsmd, be->engine, NULL, &ws, L);
    if (!rc) rc = prim_step(p, be, fpd, 0, i, &s, L);
    if (rc) goto out;
    arg(s, DNNL_ARG_SRC, in->mem);
    arg(s, DNNL_ARG_DST, lp->out.mem);
    arg(s, DNNL_ARG_WORKSPACE, ws);
    if (!p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) goto out;
    op_desc bd;
    dnnl_primitive_desc_t bpd;
    char what[64];
    snprintf(what, sizeof what, "%s backward", b->what);
    dnnl_status_t st = b->init(&bd, L, &in->md, &lp->out.md);
    if (st != dnnl_success) {
        rc = dnnl_fail(st, what, L);
        goto out;
    }
    if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, what, L))) goto out;
    dnnl_memory_t tgt = NULL, acc = NULL;
    rc = grad_target(be, p, i, 0, &tgt, &acc);
    if (!rc) rc = prim_step(p, be, bpd, 1, i, &s, L);
    dnnl_primitive_desc_destroy(bpd);
    if (rc) goto out;
    if (b->reads_src) arg(s, DNNL_ARG_SRC, in->mem);
    if (b->reads_dst) arg(s, DNNL_ARG_DST, lp->out.mem);
    arg(s, DNNL_ARG_DIFF_DST, lp->out.diff);
    arg(s, DNNL_ARG_WORKSPACE, ws);
    arg(s, DNNL_ARG_DIFF_SRC, tgt);
    rc = grad_add(be, p, i, in->diff, acc);
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

static dnnl_status_t relu_backward(op_desc *bd, const dsrt_layer *L, const dnnl_memory_desc_t *src,
                                   const dnnl_memory_desc_t *dst) {
    return dnnl_eltwise_backward_desc_init(&bd->eltwise, dnnl_eltwise_relu_use_dst_for_bwd, src,
                                           dst, L->o.leak, 0);
}

static int plan_relu(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    if (L->fused_away) {
        p->lp[i].out = *in;
        return 0;
    }
    op_desc fd;
    DN("relu", dnnl_eltwise_forward_desc_init(
                   &fd.eltwise, p->train ? dnnl_forward_training : dnnl_forward_inference,
                   dnnl_eltwise_relu_use_dst_for_bwd, &in->md, L->o.leak, 0));
    static const one_backward b = {"relu", relu_backward, 0, 1};
    return plan_one_primitive(be, p, i, &fd, &b);
}

static dnnl_alg_kind_t pool_alg(const dsrt_layer *L) {
    if (L->kind == DSRT_LAYER_MAXPOOL) return dnnl_pooling_max;
    if (L->kind == DSRT_LAYER_AVGPOOL && !L->o.count_pad) return dnnl_pooling_avg_exclude_padding;
    return dnnl_pooling_avg_include_padding;
}

static dnnl_status_t pool_backward(op_desc *bd, const dsrt_layer *L, const dnnl_memory_desc_t *src,
                                   const dnnl_memory_desc_t *dst) {
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    return dnnl_pooling_v2_backward_desc_init(&bd->pool, pool_alg(L), src, dst, strides, kernel,
                                              dil, pad_l, pad_r);
}

static int plan_pool(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_dims_t ddims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_dims_t strides = {L->o.sh, L->o.sw}, kernel = {L->o.kh, L->o.kw}, dil = {0, 0};
    dnnl_dims_t pad_l = {L->pt, L->pl}, pad_r = {L->pb, L->pr};
    dnnl_memory_desc_t dst_any;
    if (md_any(&dst_any, 4, ddims)) return dnnl_fail(dnnl_invalid_arguments, "pooling", L);
    op_desc fd;
    DN("pooling", dnnl_pooling_v2_forward_desc_init(
                      &fd.pool, p->train ? dnnl_forward_training : dnnl_forward_inference,
                      pool_alg(L), &in->md, &dst_any, strides, kernel, dil, pad_l, pad_r));
    static const one_backward b = {"pooling", pool_backward, 0, 0};
    return plan_one_primitive(be, p, i, &fd, &b);
}

static dnnl_status_t lrn_backward(op_desc *bd, const dsrt_layer *L, const dnnl_memory_desc_t *src,
                                  const dnnl_memory_desc_t *dst) {
    return dnnl_lrn_backward_desc_init(&bd->lrn, dnnl_lrn_across_channels, dst, src, L->o.lrn_size,
                                       L->o.alpha, L->o.beta, L->o.k);
}

static int plan_lrn(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    op_desc fd;
    DN("lrn", dnnl_lrn_forward_desc_init(
                  &fd.lrn, p->train ? dnnl_forward_training : dnnl_forward_inference,
                  dnnl_lrn_across_channels, &in->md, L->o.lrn_size, L->o.alpha, L->o.beta, L->o.k));
    static const one_backward b = {"lrn", lrn_backward, 1, 0};
    return plan_one_primitive(be, p, i, &fd, &b);
}

/*
 * Fully connected. Two ways, whichever moves fewer bytes per step: with
 * large weights (AlexNet's fc6: 38M) the input is reordered to plain NCHW and
 * the weights and their gradient are used in place in the flat buffers; with
 * small weights (digits: 115k weights, 1.5M activations) the input stays in
 * its blocked layout and the weights are reordered to match once per step.
 */
static int plan_fc(cpu_backend *be, cpu_plan *p, int i) {
    dsrt_net *net = be->net;
    const dsrt_layer *L = &net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    int four = in->md.ndims == 4, rc;
    size_t act = (size_t)p->n * L->in.c * L->in.h * L->in.w;
    int plain = !four || L->w_n >= act || md_is(&in->md, dnnl_abcd);
    dnnl_dims_t sdims4 = {p->n, L->in.c, L->in.h, L->in.w}, sdims2 = {p->n, L->in.c};
    dnnl_dims_t wdims4 = {L->out.c, L->in.c, L->in.h, L->in.w}, wdims2 = {L->out.c, L->in.c};
    dnnl_dims_t ddims = {p->n, L->out.c}, bdims = {L->out.c};
    dnnl_memory_desc_t src_md, w_plain, w_md, b_md, dst_md;
    if (md_plain(&src_md, four ? 4 : 2, four ? sdims4 : sdims2) ||
        md_plain(&w_plain, four ? 4 : 2, four ? wdims4 : wdims2) || md_plain(&b_md, 1, bdims) ||
        md_plain(&dst_md, 2, ddims))
        return dnnl_fail(dnnl_invalid_arguments, "memory descriptors", L);
    w_md = w_plain;
    if (!plain) {
        src_md = in->md;
        md_any(&w_md, 4, wdims4);
    }
    const dnnl_memory_desc_t *bias = L->b_n ? &b_md : NULL;
    dnnl_inner_product_desc_t fd;
    dnnl_primitive_desc_t fpd;
    DN("fc", dnnl_inner_product_forward_desc_init(
                 &fd, p->train ? dnnl_forward_training : dnnl_forward_inference, &src_md, &w_md,
                 bias, &dst_md));
    if ((rc = pd_new(&fpd, &fd, be, L->fuse_relu, L->fuse_leak, NULL, "fc", L))) return rc;
    dnnl_memory_t wplain, wfwd, b = NULL;
    step *s;
    rc = ensure(p, be, in->mem, dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), 0, i,
                &lp->src, L);
    if (!rc) rc = mem_new(p, &w_plain, be->engine, net->params + L->w_off, &wplain, L);
    if (!rc)
        rc = weights_for(be, p, i, &w_plain,
                         dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0), wplain, 0,
                         &lp->w_fwd_version, &wfwd);
    if (!rc && L->b_n) rc = mem_new(p, &b_md, be->engine, net->params + L->b_off, &b, L);
    if (!rc) rc = new_output(be, p, i, &dst_md);
    if (rc) goto out;
    if (plain) {
        lp->fc_w = wplain;
        lp->fc_b = b;
        lp->fc_t = aligned_alloc(64, ((size_t)p->n * L->out.c * sizeof(float) + 63) & ~(size_t)63);
        if (!lp->fc_t) {
            rc = dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory", L->name);
            goto out;
        }
        if ((rc = c_step(p, 0, step_fc_fwd, i))) goto out;
    } else {
        if ((rc = prim_step(p, be, fpd, 0, i, &s, L))) goto out;
        arg(s, DNNL_ARG_SRC, lp->src);
        arg(s, DNNL_ARG_WEIGHTS, wfwd);
        arg(s, DNNL_ARG_BIAS, b);
        arg(s, DNNL_ARG_DST, lp->out.mem);
    }
    if (!p->train) goto out;

    if (L->fuse_relu && (rc = fused_relu_bwd(be, p, i))) goto out;
    {
        dnnl_inner_product_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_status_t st = dnnl_inner_product_backward_weights_desc_init(&bd, md_of(lp->src), &w_md,
                                                                         bias, &dst_md);
        if (st != dnnl_success) {
            rc = dnnl_fail(st, "fc backward weights", L);
            goto out;
        }
        if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, "fc backward weights", L))) goto out;
        if ((rc = weights_grad(be, p, i, bpd, &w_plain, &b_md, 0))) goto out;
    }
    if (dsrt__net_need_diff(be->net, L->inputs[0])) {
        dnnl_inner_product_desc_t bd;
        dnnl_primitive_desc_t bpd;
        dnnl_memory_desc_t dsrc_md = *md_of(lp->src);
        dnnl_status_t st =
            dnnl_inner_product_backward_data_desc_init(&bd, &dsrc_md, &w_md, &dst_md);
        if (st != dnnl_success) {
            rc = dnnl_fail(st, "fc backward data", L);
            goto out;
        }
        if ((rc = pd_new(&bpd, &bd, be, 0, 0, fpd, "fc backward data", L))) goto out;
        rc = data_grad(be, p, i, bpd, &w_plain, wplain, wfwd, 0);
    }
out:
    dnnl_primitive_desc_destroy(fpd);
    return rc;
}

/*
 * Element-wise sum of the inputs (in the first one's layout; the others are
 * reordered to it when theirs differs): two inputs as one binary primitive
 * with the ReLU as its post-op, more as a sum primitive and the ReLU after
 * it in place. Backward: the ReLU's in place on the gradient, which then
 * goes to each input unchanged (copied, or added where the input feeds
 * other layers too).
 */
static int plan_add(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor in[DSRT_INPUTS_MAX];
    dnnl_memory_t src[DSRT_INPUTS_MAX];
    int rc = 0, n = L->n_inputs;
    if (n < 1) return dnnl_fail(dnnl_invalid_arguments, "add", L); /* the parser needs 2 */
    for (int k = 0; k < n && !rc; k++) rc = input4(be, p, L, k, &in[k]);
    if (rc) return rc;
    const dnnl_memory_desc_t *md = &in[0].md;
    for (int k = 0; k < n && !rc; k++) rc = ensure(p, be, in[k].mem, md, 0, i, &src[k], L);
    if (!rc) rc = new_output(be, p, i, md);
    if (rc) return rc;
    dnnl_primitive_desc_t pd;
    step *s;
    if (n == 2) {
        dnnl_binary_desc_t d;
        DN("add", dnnl_binary_desc_init(&d, dnnl_binary_add, md, md, md));
        if ((rc = pd_new(&pd, &d, be, L->fuse_relu, L->fuse_leak, NULL, "add", L))) return rc;
        rc = prim_step(p, be, pd, 0, i, &s, L);
        dnnl_primitive_desc_destroy(pd);
        if (rc) return rc;
        arg(s, DNNL_ARG_SRC_0, src[0]);
        arg(s, DNNL_ARG_SRC_1, src[1]);
        arg(s, DNNL_ARG_DST, lp->out.mem);
    } else {
        float scales[DSRT_INPUTS_MAX];
        dnnl_memory_desc_t mds[DSRT_INPUTS_MAX];
        for (int k = 0; k < n; k++) scales[k] = 1.0f, mds[k] = *md;
        dnnl_primitive_attr_t attr;
        if ((rc = attr_new(&attr, 0, 0, L))) return rc;
        dnnl_status_t st =
            dnnl_sum_primitive_desc_create(&pd, md, n, scales, mds, attr, be->engine);
        dnnl_primitive_attr_destroy(attr);
        if (st != dnnl_success) return dnnl_fail(st, "add", L);
        rc = prim_step(p, be, pd, 0, i, &s, L);
        dnnl_primitive_desc_destroy(pd);
        if (rc) return rc;
        for (int k = 0; k < n; k++) arg(s, DNNL_ARG_MULTIPLE_SRC + k, src[k]);
        arg(s, DNNL_ARG_DST, lp->out.mem);
        if (L->fuse_relu) {
            dnnl_eltwise_desc_t d;
            DN("add relu", dnnl_eltwise_forward_desc_init(
                               &d, p->train ? dnnl_forward_training : dnnl_forward_inference,
                               dnnl_eltwise_relu_use_dst_for_bwd, md, L->fuse_leak, 0));
            if ((rc = pd_new(&pd, &d, be, 0, 0, NULL, "add relu", L))) return rc;
            rc = prim_step(p, be, pd, 0, i, &s, L);
            dnnl_primitive_desc_destroy(pd);
            if (rc) return rc;
            arg(s, DNNL_ARG_SRC, lp->out.mem);
            arg(s, DNNL_ARG_DST, lp->out.mem);
        }
    }
    if (!p->train) return 0;
    if (L->fuse_relu && lp->out.diff && (rc = fused_relu_bwd(be, p, i))) return rc;
    for (int k = 0; k < n && !rc; k++) {
        if (!dsrt__net_need_diff(be->net, L->inputs[k])) continue;
        if (diff_same(p, in[k].diff, lp->out.diff)) continue; /* shared: no copy */
        dnnl_memory_t tgt, acc;
        rc = grad_target_of(be, p, i, k, &in[k], &tgt, &acc);
        if (!rc) rc = reorder_step(p, be, lp->out.diff, tgt, 1, i, STEP_ALWAYS, NULL, L);
        if (!rc) rc = grad_add(be, p, i, in[k].diff, acc);
    }
    return rc;
}

/*
 * The inputs side by side along the channels, in plain NHWC (where any
 * channel range of the output is a view, whatever the offsets); backward
 * hands each input its channels of the gradient through such a view.
 */
static int plan_concat(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    int n = L->n_inputs, rc;
    dnnl_dims_t dims = {p->n, L->out.c, L->out.h, L->out.w};
    dnnl_memory_desc_t dst, mds[DSRT_INPUTS_MAX];
    tensor in[DSRT_INPUTS_MAX];
    DN("concat", dnnl_memory_desc_init_by_tag(&dst, 4, dims, dnnl_f32, dnnl_acdb));
    for (int k = 0; k < n; k++) {
        if ((rc = input4(be, p, L, k, &in[k]))) return rc;
        mds[k] = in[k].md;
    }
    dnnl_primitive_attr_t attr;
    if ((rc = attr_new(&attr, 0, 0, L))) return rc;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_concat_primitive_desc_create(&pd, &dst, n, 1, mds, attr, be->engine);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dnnl_fail(st, "concat", L);
    step *s;
    rc = new_output(be, p, i, &dst);
    if (!rc) rc = prim_step(p, be, pd, 0, i, &s, L);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return rc;
    for (int k = 0; k < n; k++) arg(s, DNNL_ARG_MULTIPLE_SRC + k, in[k].mem);
    arg(s, DNNL_ARG_DST, lp->out.mem);
    if (!p->train) return 0;
    int c0 = 0;
    for (int k = 0; k < n && !rc; k++) {
        int ck = be->net->layers[L->inputs[k]].out.c;
        if (dsrt__net_need_diff(be->net, L->inputs[k])) {
            dnnl_dims_t sd = {p->n, ck, L->out.h, L->out.w}, off = {0, c0, 0, 0};
            dnnl_memory_desc_t sub;
            dnnl_memory_t view, tgt, acc;
            DN("concat backward", dnnl_memory_desc_init_submemory(&sub, &dst, sd, off));
            rc = diff_new(p, be->engine, &sub, -1, -1, lp->out.diff, &view, L);
            if (!rc) rc = grad_target_of(be, p, i, k, &in[k], &tgt, &acc);
            if (!rc) rc = reorder_step(p, be, view, tgt, 1, i, STEP_ALWAYS, NULL, L);
            if (!rc) rc = grad_add(be, p, i, in[k].diff, acc);
        }
        c0 += ck;
    }
    return rc;
}

static int plan_dropout(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    if (!p->train) {
        lp->out = *in;
        return 0;
    }
    /* In plain layout, where memory order is the logical order the masks
     * are defined in. */
    dnnl_memory_desc_t plain;
    if (md_plain_like(&plain, &in->md)) return dnnl_fail(dnnl_invalid_arguments, "dropout", L);
    int rc = ensure(p, be, in->mem, &plain, 0, i, &lp->src, L);
    if (!rc) rc = new_output(be, p, i, &plain);
    if (rc) return rc;
    lp->mask_n = dnnl_memory_desc_get_size(&plain) / sizeof(float);
    lp->mask = aligned_alloc(64, (lp->mask_n * sizeof(float) + 63) & ~(size_t)63);
    if (!lp->mask) return dsrt__fail(-ENOMEM, "cpu backend: layer '%s': out of memory", L->name);
    if ((rc = c_step(p, 0, step_dropout_fwd, i))) return rc;
    if (!dsrt__net_need_diff(be->net, L->inputs[0])) return 0;
    dnnl_memory_t tmp, tgt, acc;
    if ((rc = grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    if ((rc = deliver(p, be, tgt, &plain, &lp->plain_diff, &tmp, L))) return rc;
    if ((rc = c_step(p, 1, step_dropout_bwd, i))) return rc;
    if (tmp && (rc = reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L))) return rc;
    return grad_add(be, p, i, in->diff, acc);
}

static int plan_softmax(cpu_backend *be, cpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    layer_plan *lp = &p->lp[i];
    tensor *in = &p->lp[L->inputs[0]].out;
    dnnl_memory_desc_t plain;
    if (md_plain_like(&plain, &in->md)) return dnnl_fail(dnnl_invalid_arguments, "softmax", L);
    int rc = ensure(p, be, in->mem, &plain, 0, i, &lp->plain_in, L);
    if (rc) return rc;
    dnnl_dims_t dims = {p->n, be->net->classes};
    if (md_plain(&lp->out.md, 2, dims)) return dnnl_fail(dnnl_invalid_arguments, "softmax", L);
    p->probs =
        aligned_alloc(64, ((size_t)p->n * be->net->classes * sizeof(float) + 63) & ~(size_t)63);
    if (!p->probs) return dsrt__fail(-ENOMEM, "cpu backend: out of memory");
    rc = mem_new(p, &lp->out.md, be->engine, p->probs, &lp->out.mem, L);
    if (!rc) rc = c_step(p, 0, step_softmax_fwd, i);
    if (rc || !p->train || !dsrt__net_need_diff(be->net, L->inputs[0])) return rc;
    dnnl_memory_t tmp, tgt, acc;
    if ((rc = grad_target(be, p, i, 0, &tgt, &acc))) return rc;
    if ((rc = deliver(p, be, tgt, &plain, &lp->plain_diff, &tmp, L))) return rc;
    if ((rc = c_step(p, 1, step_softmax_bwd, i))) return rc;
    if (tmp && (rc = reorder_step(p, be, tmp, tgt, 1, i, STEP_ALWAYS, NULL, L))) return rc;
    return grad_add(be, p, i, in->diff, acc);
}

// ----------------------------------------------------------------------------
// Plan lifetime

static void plan_free(cpu_plan *p) {
    if (!p) return;
    for (size_t k = 0; k < p->n_prims; k++) dnnl_primitive_destroy(p->prims[k]);
    for (size_t k = 0; k < p->n_mems; k++) dnnl_memory_destroy(p->mems[k]);
    for (size_t k = 0; k < p->n_scratch; k++) dnnl_memory_destroy(p->scratch_mems[k]);
    for (int i = 0; p->lp && i < p->n_layers; i++) {
        free(p->lp[i].mask);
        free(p->lp[i].fc_t);
        free(p->lp[i].bn_sums);
    }
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
    for (int i = 0; i < net->n_layers; i++) {
        switch (net->layers[i].kind) {
        case DSRT_LAYER_INPUT:
            rc = plan_input(be, p, i);
            break;
        case DSRT_LAYER_CONV:
            rc = plan_conv(be, p, i);
            break;
        case DSRT_LAYER_BATCHNORM:
            rc = plan_batchnorm(be, p, i);
            break;
        case DSRT_LAYER_RELU:
            rc = plan_relu(be, p, i);
            break;
        case DSRT_LAYER_MAXPOOL:
        case DSRT_LAYER_AVGPOOL:
        case DSRT_LAYER_GAP:
            rc = plan_pool(be, p, i);
            break;
        case DSRT_LAYER_FC:
            rc = plan_fc(be, p, i);
            break;
        case DSRT_LAYER_DROPOUT:
            rc = plan_dropout(be, p, i);
            break;
        case DSRT_LAYER_LRN:
            rc = plan_lrn(be, p, i);
            break;
        case DSRT_LAYER_SOFTMAX:
            rc = plan_softmax(be, p, i);
            break;
        case DSRT_LAYER_ADD:
            rc = plan_add(be, p, i);
            break;
        case DSRT_LAYER_CONCAT:
            rc = plan_concat(be, p, i);
            break;
        default:
            rc = dsrt__fail(DSRT_EUNSUPPORTED, "cpu backend: layer kind %d",
                            (int)net->layers[i].kind);
        }
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

/* Runs a pass's steps; with a profile on and a training plan, the steps
 * of each layer are timed together (a layer's steps are consecutive). */
static int run_steps_held(cpu_backend *be, cpu_plan *p, step *steps, size_t n, int backward) {
    dsrt_net *net = be->net;
    int timed = p->train && dsrt__prof_on(net), layer = -1;
    double t0 = 0, t1 = 0;
    for (size_t k = 0; k < n; k++) {
        step *s = &steps[k];
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
        } else {
            dnnl_status_t st = dnnl_primitive_execute(s->prim, be->stream, s->nargs, s->args);
            if (st != dnnl_success) {
                if (s->kind == STEP_WEIGHTS) *s->cache = UINT64_MAX;
                return dnnl_fail(st, "execute", &net->layers[s->layer]);
            }
        }
        if (timed) t1 = clock_s();
    }
    dnnl_status_t st = dnnl_stream_wait(be->stream);
    if (timed && layer >= 0) dsrt__prof_piece(net, layer, backward, t0, clock_s());
    return st == dnnl_success ? 0 : dnnl_fail(st, "stream wait", NULL);
}

/* run_steps_held with the signals held (see signals_hold). */
static int run_steps(cpu_backend *be, cpu_plan *p, step *steps, size_t n, int backward) {
    sigset_t old;
    signals_hold(be, &old);
    int rc = run_steps_held(be, p, steps, n, backward);
    signals_release(&old);
    return rc;
}

static int cpu_stage(dsrt_backend *b, const dsrt_net_batch *batch) {
    return 0; /* read in place */
}

static int cpu_stage_wait(dsrt_backend *b) {
    return 0;
}

static int cpu_forward(dsrt_backend *b, const dsrt_net_batch *batch, int train) {
    cpu_backend *be = (cpu_backend *)b;
    const dsrt_net *net = be->net;
    int n = batch->n;
    set_threads(net);
    cpu_plan *p;
    int rc = plan_get(be, n, train, &p);
    if (rc) return rc;
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
    be->x = x;
    be->grad_scale = 1.0f / (float)(batch->global_n > 0 ? batch->global_n : n);
    p->labels = batch->labels;
    p->soft = batch->labels ? batch->soft_labels : NULL;
    if (net->layers[0].o.norm == DSRT_NORM_NONE &&
        dnnl_memory_set_data_handle(p->lp[0].out.mem, (void *)x) != dnnl_success)
        return dsrt__fail(DSRT_EBACKEND, "cpu backend: input handle");
    if (train)
        be->last_train = p;
    else
        be->last_infer = p;
    be->last = p;
    if (train && net->prof) net->prof->open = 0; /* a new step */
    return run_steps(be, p, p->fwd, p->n_fwd, 0);
}

static int cpu_backward(dsrt_backend *b) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = be->last_train;
    if (!p || !p->labels) return dsrt__fail(-EINVAL, "cpu backend: backward without forward");
    set_threads(be->net);
    int rc = run_steps(be, p, p->bwd, p->n_bwd, 1);
    if (!rc) dsrt__prof_step_end(be->net);
    return rc;
}

static int cpu_results(dsrt_backend *b, double *loss, int *correct, float *probs) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = be->last;
    if (!p) return dsrt__fail(-EINVAL, "cpu backend: no forward pass");
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

static int cpu_read_output(dsrt_backend *b, int layer, int train, float *out) {
    cpu_backend *be = (cpu_backend *)b;
    cpu_plan *p = train ? be->last_train : be->last_infer;
    if (!p) return dsrt__fail(-EINVAL, "cpu backend: no forward pass to read");
    const dsrt_layer *L = &be->net->layers[layer];
    dnnl_memory_t have = p->lp[layer].out.mem;
    dnnl_memory_desc_t plain;
    if (md_plain_like(&plain, md_of(have))) return DSRT_EBACKEND;
    dnnl_memory_t user = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    int rc = 0;
    dnnl_status_t st = dnnl_memory_create(&user, &plain, be->engine, out);
    if (st == dnnl_success)
        st = dnnl_reorder_primitive_desc_create(&pd, md_of(have), be->engine, &plain, be->engine,
                                                NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&prim, pd);
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, have}, {DNNL_ARG_TO, user}};
        sigset_t old;
        signals_hold(be, &old);
        st = dnnl_primitive_execute(prim, be->stream, 2, args);
        if (st == dnnl_success) st = dnnl_stream_wait(be->stream);
        signals_release(&old);
    }
    if (st != dnnl_success) rc = dnnl_fail(st, "read output", L);
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
    dnnl_status_t st = dnnl_engine_create(&be->engine, dnnl_cpu, 0);
    if (st == dnnl_success)
        st = dnnl_stream_create(&be->stream, be->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        cpu_destroy((dsrt_backend *)be);
        return dnnl_fail(st, "engine", L);
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
    .bn_sync = 1,
};
