/*
 * Networks: from a parsed description to layers with shapes, one flat buffer
 * of parameters and one of gradients (layers hold offsets into them), the
 * initial weights, and a backend that runs them. Also the public calls that
 * run a net and describe it, the gradient buckets a data-parallel trainer
 * reduces while backward is still running, and the bookkeeping of where the
 * newest numbers are when a backend keeps its own copies on a device.
 *
 * Backends are chosen from one table by the kind of device (CPU or CUDA):
 * the CPU backend is built in, the CUDA backend is the module dsrt_cuda.so,
 * loaded when a net first asks for a GPU. Everything above this file talks
 * to a net through the calls here, never to a backend.
 */
#include "internal.h"

#include "core/module.h"
#include "platform/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define RNG_STREAM_INIT 0x494e4954u /* "INIT" */

// ----------------------------------------------------------------------------
// Building

dsrt_net_options dsrt_net_defaults(void) {
    dsrt_net_options o;
    memset(&o, 0, sizeof o);
    o.threads = 0;
    o.seed = 0;
    o.init = DSRT_INIT_GLOROT;
    o.fuse = 2;
    o.device = DSRT_DEVICE_CPU;
    o.precision = DSRT_PRECISION_DEFAULT;
    o.deterministic = 0;
    o.cuda_graphs = 1;
    return o;
}

// ----------------------------------------------------------------------------
// Backends

/* One entry a backend: built in (ops), or a module (core/module.h) loaded
 * the first time a net asks for its kind of device. probe counts the
 * devices without loading the module (NULL: ask the module). Adding a
 * backend is its file (filling a dsrt_backend_ops, exported with
 * DSRT_MODULE_DEFINE when it is a module) and its line here. */
typedef struct {
    int device_kind; /* 0: the CPU; 1: CUDA devices */
    const dsrt_backend_ops *ops;
    const dsrt_module_spec *module;
    int (*probe)(char *why, size_t size);
} backend_entry;

static const dsrt_module_spec CUDA_MODULE = {
    .name = "cuda",
    .what = "the GPU backend",
    .needs = "the CUDA runtime, cuBLAS and cuDNN 9",
#ifdef DSRT_WITH_CUDA_BACKEND
    .built = 1,
#endif
    .unbuilt = "this build of dsrt has no GPU backend (build it where the CUDA toolkit, cuDNN "
               "and cuBLAS are installed)",
    .train_anchor = (const void *)dsrt__net_grads_ready,
    .uses_dsrt = 1,
};

static const backend_entry BACKENDS[] = {
    {0, &dsrt__backend_cpu, NULL, NULL},
    {1, NULL, &CUDA_MODULE, dsrt__cuda_devices},
};

static const backend_entry *backend_entry_for(int device_kind) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(BACKENDS); k++)
        if (BACKENDS[k].device_kind == device_kind) return &BACKENDS[k];
    return NULL;
}

/* The entry's ops, loading its module the first time. */
static int backend_ops(const backend_entry *b, const dsrt_backend_ops **ops) {
    if (b->ops) {
        *ops = b->ops;
        return 0;
    }
    const void *t;
    int rc = dsrt__module_load(b->module, &t);
    *ops = t;
    return rc;
}

/* Devices of a kind now, with the reason when none; loads nothing that
 * the probe can answer without. */
static int kind_devices(const backend_entry *b, char *why, size_t size) {
    const dsrt_backend_ops *ops;
    if (!b || (b->module && !b->module->built)) return 0;
    if (b->probe) return b->probe(why, size);
    if (backend_ops(b, &ops) != 0) {
        if (why && size) snprintf(why, size, "%s", dsrt_last_error());
        return 0;
    }
    return ops->devices ? ops->devices(why, size) : 0;
}

int dsrt_gpu_count(void) {
    return kind_devices(backend_entry_for(1), NULL, 0);
}

const char *dsrt_precision_name(dsrt_precision p) {
    static const char *const names[] = {"default", "fp32", "tf32", "bf16"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : NULL;
}

/* The backend for device, checked: the device exists in this build and on
 * this machine, and its module loads. Messages start "GPU n: ". */
static int pick_backend(int device, const dsrt_backend_ops **out) {
    *out = NULL;
    if (device < DSRT_DEVICE_CPU)
        return dsrt__fail(DSRT_EOPTION, "device %d: not the CPU (-1) or a GPU index", device);
    const backend_entry *b = backend_entry_for(device >= 0);
    if (!b || (b->module && !b->module->built))
        return dsrt__fail(DSRT_ENODEVICE, "GPU %d: %s", device,
                          b ? b->module->unbuilt : "this build of dsrt has no GPU backend");
    const dsrt_backend_ops *ops;
    if (device >= 0) {
        char why[1024] = "";
        int n = kind_devices(b, why, sizeof why);
        if (device >= n)
            return dsrt__fail(DSRT_ENODEVICE, "GPU %d: %s", device,
                              n > 0  ? "there is no such CUDA device"
                              : *why ? why
                                     : "no CUDA device is visible on this machine");
    }
    int rc = backend_ops(b, &ops);
    if (rc) return dsrt__fail_prefix(rc, "GPU %d", device);
    *out = ops;
    return 0;
}

int dsrt_gpu_check(int device) {
    const dsrt_backend_ops *ops;
    if (device < 0) return dsrt__fail(DSRT_ENODEVICE, "GPU %d: not a device index", device);
    return pick_backend(device, &ops);
}

/* Creates net's backend for its options' device; on failure the net has
 * none. */
static int attach_backend(dsrt_net *net) {
    const dsrt_backend_ops *ops;
    int rc = pick_backend(net->opts.device, &ops);
    if (rc) return dsrt__fail_prefix(rc, "%s", net->source);
    if ((unsigned)net->opts.precision > DSRT_PRECISION_BF16)
        return dsrt__fail(DSRT_EOPTION, "%s: precision %d: unknown", net->source,
                          (int)net->opts.precision);
    if ((unsigned)net->opts.fuse > 2)
        return dsrt__fail(DSRT_EOPTION, "%s: fuse %d: not 0, 1 or 2", net->source, net->opts.fuse);
    net->ops = ops;
    net->be = NULL;
    net->host_stale = 0;
    net->staged = NULL;
    net->started = 0;
    if ((rc = ops->create(&net->be, net))) {
        net->ops = NULL;
        net->be = NULL;
    }
    return rc;
}

/* Brings every newer copy home and destroys the backend. */
static int detach_backend(dsrt_net *net) {
    int rc = 0;
    if (net->opt_on_device) dsrt__optimizer_release(net->opt_on_device);
    if (net->ops && net->be) {
        rc = dsrt__net_host(net, DSRT_BUF_ALL);
        net->ops->destroy(net->be);
    }
    net->ops = NULL;
    net->be = NULL;
    return rc;
}

/*
 * The flat buffers, zeroed and 64-byte aligned. One of a megabyte or more is
 * mapped anonymously: the kernel's zero pages become memory only where they
 * are written, so a net that is only run forward (a model loaded or imported
 * to classify) never pays for its gradient buffer, and building it does not
 * write the whole of its parameters twice.
 */
#define MAPPED_BYTES ((size_t)1 << 20)

static size_t floats_bytes(size_t n) {
    return ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
}

static float *alloc_floats(size_t n) {
    size_t bytes = floats_bytes(n);
    float *p;
    if (bytes >= MAPPED_BYTES) {
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = m == MAP_FAILED ? NULL : m;
    } else if ((p = aligned_alloc(64, bytes))) {
        memset(p, 0, bytes);
    }
    if (!p) dsrt__fail(-ENOMEM, "out of memory allocating %zu floats", n);
    return p;
}

static void free_floats(float *p, size_t n) {
    if (!p) return;
    if (floats_bytes(n) >= MAPPED_BYTES)
        munmap(p, floats_bytes(n));
    else
        free(p);
}

/* Structure: the input first, the classification output last, neither
 * elsewhere. */
static int check_structure(const dsrt_desc *d, const char *source) {
    const dsrt_layer *L = d->layers;
    if (!dsrt__layer_is(&L[0], DSRT_LAYER_F_INPUT))
        return dsrt__fail(DSRT_EOPTION, "%s: line %d: the first layer must be 'input', not '%s'",
                          source, L[0].line, L[0].type);
    for (int i = 1; i < d->n; i++) {
        if (dsrt__layer_is(&L[i], DSRT_LAYER_F_INPUT))
            return dsrt__fail(DSRT_EOPTION, "%s: line %d: '%s' may only be the first layer", source,
                              L[i].line, L[i].type);
        if (dsrt__layer_is(&L[i], DSRT_LAYER_F_OUTPUT) && i != d->n - 1)
            return dsrt__fail(DSRT_EOPTION, "%s: line %d: '%s' must be the last layer", source,
                              L[i].line, L[i].type);
    }
    if (!dsrt__layer_is(&L[d->n - 1], DSRT_LAYER_F_OUTPUT))
        return dsrt__fail(DSRT_EOPTION, "%s: line %d: the last layer must be 'softmax', not '%s'",
                          source, L[d->n - 1].line, L[d->n - 1].type);
    return 0;
}

/* Resolves layer i's inputs (inputs= names, else the layer above) to
 * indices of layers above it, counts consumers, and makes the shape the
 * layer sees: its input's, or for add and concat the one their inputs make
 * together (refused with every input's shape when they disagree). */
static int resolve_inputs(dsrt_net *net, int i, const dsrt_layer_names *names, const char *source) {
    dsrt_layer *l = &net->layers[i];
    l->n_inputs = 0;
    if (!l->inputs_text) {
        l->inputs[0] = i - 1;
        l->n_inputs = 1;
    } else {
        for (const char *p = l->inputs_text; *p;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char nm[DSRT_LAYER_NAME_MAX];
            memcpy(nm, p, len);
            nm[len] = '\0';
            p = e ? e + 1 : p + len;
            const int *at = dsrt__layer_names_find(names, nm);
            int j = at ? *at : net->n_layers;
            if (j == net->n_layers)
                return dsrt__fail(DSRT_EOPTION,
                                  "%s: line %d: %s: option 'inputs': no layer is named '%s'",
                                  source, l->line, l->type, nm);
            if (j >= i)
                return dsrt__fail(DSRT_EOPTION,
                                  "%s: line %d: %s: option 'inputs': '%s' (line %d) is not above "
                                  "this line: a layer takes the outputs of layers written before "
                                  "it (no cycles)",
                                  source, l->line, l->type, nm, net->layers[j].line);
            for (int k = 0; k < l->n_inputs; k++)
                if (l->inputs[k] == j)
                    return dsrt__fail(DSRT_EOPTION,
                                      "%s: line %d: %s: option 'inputs': '%s' is named twice",
                                      source, l->line, l->type, nm);
            l->inputs[l->n_inputs++] = j;
        }
        free(l->inputs_text);
        l->inputs_text = NULL;
    }
    const dsrt_layer_ops *ops = dsrt__layer_ops(l);
    if (l->n_inputs < ops->min_inputs || l->n_inputs > ops->max_inputs) {
        static const char *const words[] = {"no", "one", "two", "three", "four"};
        char takes[64];
        int lo = ops->min_inputs, hi = ops->max_inputs;
        const char *w = lo < 5 ? words[lo] : "several";
        if (lo == hi)
            snprintf(takes, sizeof takes, "%s input%s", w, lo == 1 ? "" : "s");
        else if (hi == DSRT_INPUTS_MAX)
            snprintf(takes, sizeof takes, "%s or more inputs", w);
        else
            snprintf(takes, sizeof takes, "%d to %d inputs", lo, hi);
        return dsrt__fail(DSRT_EOPTION, "%s: line %d: %s: option 'inputs': it takes %s, %d given%s",
                          source, l->line, l->type, takes, l->n_inputs,
                          hi == 1 ? " (add or concat join several)" : "");
    }
    for (int k = 0; k < l->n_inputs; k++) net->layers[l->inputs[k]].consumers++;
    l->in = net->layers[l->inputs[0]].out;
    if (!ops->join) return 0;
    const dsrt_shape *ins[DSRT_INPUTS_MAX];
    for (int k = 0; k < l->n_inputs; k++) ins[k] = &net->layers[l->inputs[k]].out;
    const char *must = "one shape";
    int joined = ops->join(ins, l->n_inputs, &l->in, &must);
    if (joined == 0) return 0;
    if (joined == 2) {
        int64_t channels = 0;
        for (int k = 0; k < l->n_inputs; k++) channels += ins[k]->c;
        return dsrt__fail(DSRT_ETOOBIG,
                          "%s: line %d: %s: its inputs together are %dx%dx%lld (HxWxC), more than "
                          "2^31 - 1 values an image",
                          source, l->line, l->type, ins[0]->h, ins[0]->w, (long long)channels);
    }
    char shapes[1024];
    size_t at = 0;
    for (int k = 0; k < l->n_inputs && at < sizeof shapes; k++) {
        const dsrt_layer *in = &net->layers[l->inputs[k]];
        at += (size_t)snprintf(shapes + at, sizeof shapes - at, "%s%s %dx%dx%d", k ? ", " : "",
                               in->name, in->out.h, in->out.w, in->out.c);
    }
    return dsrt__fail(DSRT_EOPTION,
                      "%s: line %d: %s: option 'inputs': the inputs must have %s (HxWxC: %s)",
                      source, l->line, l->type, must, shapes);
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
    dsrt_layer_names names = {0};
    for (int i = 0; i < net->n_layers; i++)
        if (dsrt__layer_names_add(&names, net->layers[i].name, i) < 0) {
            dsrt__layer_names_free(&names);
            return -ENOMEM;
        }
    size_t at = 0, st = 0;
    int rc = 0;
    for (int i = 0; i < net->n_layers && !rc; i++) {
        dsrt_layer *l = &net->layers[i];
        if (i && (rc = resolve_inputs(net, i, &names, source))) break;
        if (!i) l->in = s;
        rc = dsrt__layer_ops(l)->build(l, &l->in, &net->classes);
        if (rc) {
            dsrt__fail_prefix(rc, "%s: line %d", source, l->line);
            break;
        }
        /* Every layer's images fit an int, which backends index them by. */
        if (dsrt__volume(l->out.c, l->out.h, l->out.w) > INT32_MAX) {
            rc = dsrt__fail(DSRT_ETOOBIG,
                            "%s: line %d: %s: its output %dx%dx%d (HxWxC) has more than 2^31 - 1 "
                            "values an image",
                            source, l->line, l->type, l->out.h, l->out.w, l->out.c);
            break;
        }
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
            rc =
                dsrt__fail(DSRT_ETOOBIG, "%s: line %d: more than 2^34 parameters", source, l->line);
    }
    dsrt__layer_names_free(&names);
    if (rc) return rc;
    /* One output: the last layer's. */
    for (int i = 0; i + 1 < net->n_layers; i++)
        if (!net->layers[i].consumers)
            return dsrt__fail(DSRT_EOPTION,
                              "%s: line %d: the output of '%s' feeds no layer: a network has one "
                              "output, its last layer's (name it in a later layer's inputs=)",
                              source, net->layers[i].line, net->layers[i].name);
    net->input = s;
    net->n_params = at;
    net->n_state = st;
    return 0;
}

/* Marks each ReLU that the layer it takes can compute (DSRT_LAYER_F_TAKES_
 * RELU: oneDNN post-op for convolution and fully connected, the sum of an
 * add; _PLAIN: the batch-norm ReLU flag, not leaky): only where the ReLU is
 * the one layer that takes that output, since the ReLU then replaces it. A
 * kind's own ReLU (add relu=1) was set by its constructor. */
static void fuse(dsrt_net *net) {
    if (!net->opts.fuse) return;
    for (int i = 2; i < net->n_layers; i++) {
        dsrt_layer *l = &net->layers[i], *p = &net->layers[l->inputs[0]];
        if (!dsrt__layer_is(l, DSRT_LAYER_F_RELU) || l->inputs[0] == 0 || p->consumers != 1)
            continue;
        int ok = dsrt__layer_is(p, DSRT_LAYER_F_TAKES_RELU) ||
                 (dsrt__layer_is(p, DSRT_LAYER_F_TAKES_RELU_PLAIN) && l->o.leak == 0.0f);
        if (!ok || p->fuse_relu) continue;
        p->fuse_relu = 1;
        p->fuse_leak = l->o.leak;
        l->fused_away = 1;
    }
}

/*
 * Which inputs of an add can have the add's output gradient as their own
 * (the add hands its gradient to each input unchanged, so a copy is saved
 * for each). An input j qualifies when the add is the last layer that
 * takes it (backward runs last to first: the add is the first to write its
 * gradient) and it owns its buffer (not a ReLU computed by the layer
 * before it). Chosen inputs must not disturb each other: a layer c that
 * also takes a chosen j1 adds its share into the buffer when it runs, so
 * every other chosen j2 must have read it before (c < j2); and at most one
 * chosen input may change its gradient in place (a fused ReLU's backward
 * masks it), the one that runs last (the smallest index). A residual
 * block's add shares with both its inputs.
 */
static void grad_share(dsrt_net *net) {
    int n = net->n_layers;
    for (int i = 0; i < n; i++) net->grad_share[i] = -1;
    int *last = dsrt__calloc((size_t)n, sizeof *last);
    if (!last) return; /* no sharing: copies */
    for (int i = 1; i < n; i++)
        for (int k = 0; k < net->layers[i].n_inputs; k++) last[net->layers[i].inputs[k]] = i;
    for (int a = 1; a < n; a++) {
        const dsrt_layer *A = &net->layers[a];
        if (!dsrt__layer_is(A, DSRT_LAYER_F_GRAD_PASSES)) continue;
        int chosen[DSRT_INPUTS_MAX], nc = 0, modifier = -1;
        /* Largest index first: a candidate is checked against those taken. */
        int order[DSRT_INPUTS_MAX];
        for (int k = 0; k < A->n_inputs; k++) order[k] = A->inputs[k];
        for (int x = 1; x < A->n_inputs; x++)
            for (int y = x; y > 0 && order[y] > order[y - 1]; y--) {
                int t = order[y];
                order[y] = order[y - 1];
                order[y - 1] = t;
            }
        for (int k = 0; k < A->n_inputs; k++) {
            int j = order[k];
            const dsrt_layer *J = &net->layers[j];
            if (j == 0 || last[j] != a || J->fused_away || !net->need_diff[j]) continue;
            if (J->fuse_relu && modifier >= 0) continue;
            int ok = 1;
            /* j's other takers add into the buffer after the chosen (larger)
             * ones read it? they must run after: c < every chosen j2. */
            for (int c = j + 1; c < a && ok; c++) {
                const dsrt_layer *C = &net->layers[c];
                for (int q = 0; q < C->n_inputs && ok; q++)
                    if (C->inputs[q] == j)
                        for (int m = 0; m < nc; m++) ok &= c < chosen[m];
            }
            /* The chosen ones' other takers run after j reads the buffer. */
            for (int m = 0; m < nc && ok; m++)
                for (int c = chosen[m] + 1; c < a && ok; c++) {
                    const dsrt_layer *C = &net->layers[c];
                    for (int q = 0; q < C->n_inputs && ok; q++)
                        if (C->inputs[q] == chosen[m]) ok &= c < j;
                }
            if (!ok) continue;
            if (J->fuse_relu) modifier = j;
            chosen[nc++] = j;
        }
        /* The in-place modifier must be the smallest chosen index. */
        for (int m = 0; m < nc; m++)
            if (modifier >= 0 && chosen[m] < modifier) {
                for (int q = 0; q < nc; q++)
                    if (chosen[q] == modifier) chosen[q] = chosen[--nc];
                break;
            }
        for (int m = 0; m < nc; m++) net->grad_share[chosen[m]] = a;
    }
    free(last);
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
    fuse(net);
    /* Layer i's output needs a gradient when a layer that learns lies on a
     * path from the input to it (itself included). */
    net->need_diff = dsrt__calloc((size_t)net->n_layers, sizeof *net->need_diff);
    if (!net->need_diff) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        int need = l->w_n > 0 || l->b_n > 0;
        for (int k = 0; i && k < l->n_inputs; k++) need |= net->need_diff[l->inputs[k]];
        net->need_diff[i] = need;
    }
    net->grad_share = dsrt__calloc((size_t)net->n_layers, sizeof *net->grad_share);
    if (!net->grad_share) {
        rc = -ENOMEM;
        goto fail;
    }
    grad_share(net);
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
        const dsrt_layer_ops *ops = dsrt__layer_ops(l);
        if (!ops->init) continue;
        dsrt_rng rng = dsrt_rng_init(net->opts.seed, 0, (uint64_t)i, RNG_STREAM_INIT);
        ops->init(l, net->params, net->state, &rng, net->opts.init);
    }
    if ((rc = attach_backend(net))) goto fail;
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
            char list[128] = "";
            for (int i = 0; names[i]; i++) {
                size_t at = strlen(list);
                snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", names[i]);
            }
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

static void prof_free(dsrt_net_prof *pr) {
    if (!pr) return;
    free(pr->fwd_s);
    free(pr->bwd_s);
    free(pr);
}

void dsrt_net_destroy(dsrt_net *net) {
    if (!net) return;
    detach_backend(net);
    prof_free(net->prof);
    for (int i = 0; net->layers && i < net->n_layers; i++) free(net->layers[i].inputs_text);
    free(net->layers);
    free(net->need_diff);
    free(net->grad_share);
    free(net->desc);
    free(net->source);
    free_floats(net->params, net->n_params);
    free_floats(net->grads, net->n_params);
    free_floats(net->state, net->n_state);
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
    info->device = net->opts.device;
    info->precision = net->precision;
    info->input_assumed = net->input_assumed;
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
    info->n_inputs = i ? l->n_inputs : 0;
    info->inputs = l->inputs;
    return 0;
}

const char *dsrt_net_description(const dsrt_net *net) {
    return net->desc;
}

int dsrt_net_set_input_stats(dsrt_net *net, const float *mean, const float *std, const float *min,
                             const float *max) {
    const dsrt_layer *l = &net->layers[0];
    int c = l->out.c;
    int rc = dsrt__net_host(net, DSRT_BUF_ALL);
    if (rc) return rc;
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

int dsrt__net_check_batch(const dsrt_net *net, const dsrt_net_batch *b, int need_labels,
                          int staged) {
    if (!b || !b->data || b->n < 1)
        return dsrt__fail(-EINVAL, "net: empty batch (n = %d)", b ? b->n : 0);
    if (b->layout != DSRT_INPUT_F32_NCHW && b->layout != DSRT_INPUT_U8_NHWC)
        return dsrt__fail(DSRT_EOPTION, "net: batch layout %d: unknown", (int)b->layout);
    if (b->global_n != 0 && b->global_n < b->n)
        return dsrt__fail(DSRT_EOPTION, "net: global batch %d is smaller than the batch (%d)",
                          b->global_n, b->n);
    if (b->layout == DSRT_INPUT_U8_NHWC) {
        if (net->input.c > 4)
            return dsrt__fail(DSRT_EOPTION,
                              "net: uint8 batches have at most 4 channels, the net "
                              "takes %d",
                              net->input.c);
        for (int c = 0; c < net->input.c; c++)
            if (!(b->div[c] > 0) || !isfinite(b->div[c]) || !isfinite(b->sub[c]))
                return dsrt__fail(DSRT_EOPTION, "net: uint8 batch: sub[%d] = %g, div[%d] = %g", c,
                                  (double)b->sub[c], c, (double)b->div[c]);
    }
    if (need_labels && !b->labels) return dsrt__fail(-EINVAL, "net: training needs labels");
    if (b->soft_labels && !staged)
        for (size_t i = 0; i < (size_t)b->n * net->classes; i++)
            if (!(b->soft_labels[i] >= 0) || !isfinite(b->soft_labels[i]))
                return dsrt__fail(DSRT_EOPTION, "net: soft label %zu of image %zu is %g",
                                  i % net->classes, i / net->classes, (double)b->soft_labels[i]);
    if (b->labels && !staged)
        for (int i = 0; i < b->n; i++)
            if (b->labels[i] < 0 || b->labels[i] >= net->classes)
                return dsrt__fail(DSRT_EOPTION, "net: label %d of image %d is outside [0, %d)",
                                  (int)b->labels[i], i, net->classes);
    return 0;
}

static dsrt_net_batch f32_batch(const float *x, const int32_t *labels, int n) {
    dsrt_net_batch b;
    memset(&b, 0, sizeof b);
    b.data = x;
    b.layout = DSRT_INPUT_F32_NCHW;
    b.labels = labels;
    b.n = n;
    return b;
}

int dsrt_net_stage(dsrt_net *net, const dsrt_net_batch *b) {
    int rc = dsrt__net_check_batch(net, b, 0, 0);
    if (rc) return rc;
    rc = net->ops->stage(net->be, b);
    net->staged = rc >= 0 ? b->data : NULL;
    return rc;
}

int dsrt_net_stage_wait(dsrt_net *net) {
    return net->ops->stage_wait(net->be);
}

/* Forward over b: the copy staged for it, or one staged now. */
static int forward_staged(dsrt_net *net, const dsrt_net_batch *b, int train) {
    int rc = b->data == net->staged ? 0 : net->ops->stage(net->be, b);
    net->staged = NULL;
    if (rc < 0) return rc;
    return net->ops->forward(net->be, b, train);
}

int dsrt_net_train_start(dsrt_net *net, const dsrt_net_batch *b) {
    int rc = dsrt__net_check_batch(net, b, 1, b && b->data && b->data == net->staged);
    if (rc) return rc;
    if (net->started)
        return dsrt__fail(-EINVAL, "net: train_start twice without train_finish between");
    if ((rc = forward_staged(net, b, 1))) return rc;
    if (net->backward_fn) net->backward_fn(net->ready_ctx, 0);
    rc = net->ops->backward(net->be);
    if (net->backward_fn) net->backward_fn(net->ready_ctx, 1);
    if (rc) {
        net->iteration++;
        return rc;
    }
    net->started = 1;
    return 0;
}

int dsrt_net_train_finish(dsrt_net *net, float *loss, int *correct) {
    if (!net->started) return dsrt__fail(-EINVAL, "net: train_finish without train_start");
    net->started = 0;
    double l = 0;
    int ok = 0;
    int rc = net->ops->results(net->be, &l, &ok, NULL);
    net->iteration++;
    if (loss) *loss = (float)l;
    if (correct) *correct = ok;
    if (rc) return rc;
    if (!isfinite(l)) return dsrt__fail(DSRT_ENAN, "net: the loss is %g", l);
    return 0;
}

int dsrt_net_forward_backward(dsrt_net *net, const float *x, const int32_t *labels, int n,
                              float *loss, int *correct) {
    if (!labels) return dsrt__fail(-EINVAL, "net: training needs labels");
    dsrt_net_batch b = f32_batch(x, labels, n);
    int rc = dsrt_net_train_start(net, &b);
    return rc ? rc : dsrt_net_train_finish(net, loss, correct);
}

int dsrt__net_forward(dsrt_net *net, const float *x, int n, int train, const int32_t *labels,
                      double *loss, int *correct, float *probs) {
    dsrt_net_batch b = f32_batch(x, labels, n);
    int rc = dsrt__net_check_batch(net, &b, train, b.data && b.data == net->staged);
    if (rc) return rc;
    if ((rc = forward_staged(net, &b, train))) return rc;
    return net->ops->results(net->be, loss, correct, probs);
}

int dsrt_net_predict(dsrt_net *net, const float *x, int n, float *scores, const int32_t *labels,
                     float *loss, int *correct) {
    double l = 0;
    int ok = 0;
    int rc = dsrt__net_forward(net, x, n, 0, labels, &l, &ok, scores);
    if (rc) return rc;
    if (loss) *loss = labels ? (float)l : 0.0f;
    if (correct) *correct = labels ? ok : 0;
    return 0;
}

int dsrt_net_sync(dsrt_net *net) {
    return net->ops->sync ? net->ops->sync(net->be) : 0;
}

void dsrt_net_device_time(dsrt_net *net, double *busy_s, double *idle_s) {
    double b = 0, i = 0;
    if (net->ops->device_time) net->ops->device_time(net->be, &b, &i);
    if (busy_s) *busy_s = b;
    if (idle_s) *idle_s = i;
}

int dsrt_net_activation_bytes(dsrt_net *net, int n, int train, size_t *held, size_t *each) {
    *held = *each = 0;
    if (!net->ops->activation_bytes)
        return dsrt__fail(DSRT_EUNSUPPORTED, "net: activation_bytes: not said by this backend");
    return net->ops->activation_bytes(net->be, n, train ? 1 : 0, held, each);
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
// Profile

int dsrt_net_profile_start(dsrt_net *net) {
    dsrt_net_prof *pr = net->prof;
    if (!pr) {
        pr = dsrt__calloc(1, sizeof *pr);
        if (pr) {
            pr->fwd_s = dsrt__calloc((size_t)net->n_layers, sizeof *pr->fwd_s);
            pr->bwd_s = dsrt__calloc((size_t)net->n_layers, sizeof *pr->bwd_s);
        }
        if (!pr || !pr->fwd_s || !pr->bwd_s) {
            prof_free(pr);
            return dsrt__fail(-ENOMEM, "net: out of memory for a profile");
        }
        net->prof = pr;
    }
    /* Work queued before is not this profile's. */
    int rc = dsrt_net_sync(net);
    if (rc) return rc;
    double *f = pr->fwd_s, *b = pr->bwd_s;
    memset(f, 0, (size_t)net->n_layers * sizeof *f);
    memset(b, 0, (size_t)net->n_layers * sizeof *b);
    memset(pr, 0, sizeof *pr);
    pr->fwd_s = f;
    pr->bwd_s = b;
    pr->device = net->ops->device_kind;
    pr->on = 1;
    return 0;
}

void dsrt_net_profile_stop(dsrt_net *net) {
    if (net->prof) net->prof->on = 0;
}

int dsrt_net_profile_read(dsrt_net *net, dsrt_net_profile *p, dsrt_layer_profile *layers, int cap) {
    dsrt_net_prof *pr = net->prof;
    if (!pr) return dsrt__fail(-ENOENT, "net: no profile (dsrt_net_profile_start)");
    int rc = dsrt_net_sync(net); /* a device's events are read */
    if (rc) return rc;
    double steps = pr->steps > 0 ? (double)pr->steps : 1.0, ms = 1e3;
    memset(p, 0, sizeof *p);
    p->steps = pr->steps;
    p->device_events = pr->device;
    p->step_ms = ms * pr->span_s / steps;
    for (int i = 0; i < net->n_layers; i++) p->layers_ms += ms * (pr->fwd_s[i] + pr->bwd_s[i]);
    p->layers_ms /= steps;
    p->optimizer_ms = pr->opt_steps ? ms * pr->opt_s / (double)pr->opt_steps : 0;
    p->gaps_ms = ms * pr->gap_s / steps;
    p->gaps_per_step = (double)pr->gaps / steps;
    p->graph_steps = pr->graph_steps;
    p->note = net->backend_note;
    if (net->ops->describe) {
        dsrt_backend_report r;
        net->ops->describe(net->be, &r);
        p->captures = r.captures;
        p->graphs = r.graphs;
        p->fused_library = r.fused_cudnn;
        p->fused_kernel = r.fused_kernel;
    }
    for (int i = 0; layers && i < net->n_layers && i < cap; i++) {
        const dsrt_layer *l = &net->layers[i];
        layers[i].name = l->name;
        layers[i].type = l->type;
        layers[i].forward_ms = ms * pr->fwd_s[i] / steps;
        layers[i].backward_ms = ms * pr->bwd_s[i] / steps;
        layers[i].relu_fused = l->fuse_relu;
    }
    return net->n_layers;
}

// ----------------------------------------------------------------------------
// Devices and threads

int dsrt_net_set_device(dsrt_net *net, int device) {
    if (device == net->opts.device) return 0;
    const dsrt_backend_ops *ops;
    int rc = pick_backend(device, &ops);
    if (rc) return dsrt__fail_prefix(rc, "%s", net->source);
    if (net->started) return dsrt__fail(-EINVAL, "net: moved between train_start and finish");
    if (net->bn_sync_fn && !ops->bn_sync)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "net: the %s backend does not synchronise batch normalisation, which "
                          "this net does (dsrt_net_set_bn_sync)",
                          ops->name);
    /* Everything home first: while that fails the net stays where it is. */
    if (net->opt_on_device && (rc = dsrt__optimizer_host(net->opt_on_device))) return rc;
    if ((rc = dsrt__net_host(net, DSRT_BUF_ALL))) return rc;
    detach_backend(net);
    int old = net->opts.device;
    net->opts.device = device;
    net->version++;
    if ((rc = attach_backend(net)) == 0) return 0;
    /* Back where it was, from the host copies. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dsrt_last_error());
    net->opts.device = old;
    if (attach_backend(net) != 0)
        return dsrt__fail(rc, "%s (and the net could not go back: %s)", msg, dsrt_last_error());
    return dsrt__fail(rc, "%s", msg);
}

void dsrt_net_set_threads(dsrt_net *net, int threads) {
    net->opts.threads = threads < 0 ? 0 : threads;
}

int dsrt_net_threads(const dsrt_net *net) {
    return net->opts.threads;
}

int dsrt_net_run_on_threads(dsrt_net *net, int (*fn)(void *ctx, int member), void *ctx) {
    return net->ops->run_on_threads(net->be, fn, ctx);
}

void dsrt__net_memory(dsrt_net *net, dsrt_backend_memory *m) {
    memset(m, 0, sizeof *m);
    m->device = DSRT_DEVICE_CPU;
    m->grads = net->grads;
    m->params = net->params;
    m->state = net->state;
    if (net->ops->memory) net->ops->memory(net->be, m);
}

int dsrt__net_reserve(dsrt_net *net, const dsrt_net_reserve *r) {
    if (r->n_train < 0 || r->n_train > DSRT_RESERVE_SHAPES || r->n_infer < 0 ||
        r->n_infer > DSRT_RESERVE_SHAPES || r->opt_buffers < 0 || r->opt_buffers > 2 ||
        (r->layout != DSRT_INPUT_F32_NCHW && r->layout != DSRT_INPUT_U8_NHWC) ||
        (r->infer_layout != DSRT_INPUT_F32_NCHW && r->infer_layout != DSRT_INPUT_U8_NHWC))
        return dsrt__fail(-EINVAL, "net: reserve: bad shapes");
    for (int k = 0; k < r->n_train + r->n_infer; k++) {
        int n = k < r->n_train ? r->train_n[k] : r->infer_n[k - r->n_train];
        if (n < 1) return dsrt__fail(-EINVAL, "net: reserve: batch size %d", n);
    }
    return net->ops->reserve ? net->ops->reserve(net->be, r) : 0;
}

// ----------------------------------------------------------------------------
// Flat buffers and buckets

int dsrt__net_host(dsrt_net *net, unsigned what) {
    what &= net->host_stale;
    if (!what || !net->ops || !net->ops->to_host) return 0;
    int rc = net->ops->to_host(net->be, what);
    if (rc == 0) net->host_stale &= ~what;
    return rc;
}

float *dsrt_net_params(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_params;
    return dsrt__net_host(net, DSRT_BUF_PARAMS) ? NULL : net->params;
}

void dsrt_net_params_changed(dsrt_net *net) {
    /* A buffer the caller has not read since the device changed it is
     * brought home now, so the upload that follows sends its newest values;
     * the ones read (and perhaps written) are the host's. */
    (void)dsrt__net_host(net, DSRT_BUF_PARAMS | DSRT_BUF_STATE);
    net->host_stale &= ~(unsigned)(DSRT_BUF_PARAMS | DSRT_BUF_STATE);
    net->version++;
}

float *dsrt_net_grads(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_params;
    return dsrt__net_host(net, DSRT_BUF_GRADS) ? NULL : net->grads;
}

float *dsrt_net_state(dsrt_net *net, size_t *count) {
    if (count) *count = net->n_state;
    return dsrt__net_host(net, DSRT_BUF_STATE) ? NULL : net->state;
}

/* Buckets of whole layers from the last layer back, the first at least
 * first_bytes, the others min_bytes; first_layer[k] receives the lowest
 * layer of bucket k. */
static int make_buckets(const dsrt_net *net, size_t first_bytes, size_t min_bytes, dsrt_range *out,
                        int cap, int *first_layer) {
    int nb = 0;
    size_t end = net->n_params, acc = 0;
    int lowest = -1;
    for (int i = net->n_layers - 1; i >= 1; i--) {
        const dsrt_layer *l = &net->layers[i];
        if (!l->w_n && !l->b_n) continue;
        acc += (l->w_n + l->b_n) * sizeof(float);
        lowest = i;
        if (acc >= (nb == 0 ? first_bytes : min_bytes)) {
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
    return make_buckets(net, min_bytes, min_bytes, out, out ? cap : 0, NULL);
}

int dsrt_net_buckets_sized(const dsrt_net *net, size_t first_bytes, size_t min_bytes,
                           dsrt_range *out, int cap) {
    return make_buckets(net, first_bytes, min_bytes, out, out ? cap : 0, NULL);
}

int dsrt_net_set_grad_hook(dsrt_net *net, const dsrt_grad_hook *h) {
    net->hook_gen++;
    for (int i = 0; i < net->n_layers; i++) net->layer_bucket[i] = -1;
    free(net->buckets);
    net->buckets = NULL;
    net->n_buckets = 0;
    net->ready_fn = NULL;
    net->backward_fn = NULL;
    if (!h || (!h->ready && !h->backward)) return 0;
    int nb = make_buckets(net, h->first_bytes, h->min_bytes, NULL, 0, NULL);
    dsrt_range *r = dsrt__calloc((size_t)nb + 1, sizeof *r);
    int *first = dsrt__calloc((size_t)nb + 1, sizeof *first);
    if (!r || !first) {
        free(r);
        free(first);
        return -ENOMEM;
    }
    make_buckets(net, h->first_bytes, h->min_bytes, r, nb, first);
    for (int k = 0; k < nb; k++) net->layer_bucket[first[k]] = k;
    free(first);
    net->buckets = r;
    net->n_buckets = nb;
    net->ready_fn = h->ready;
    net->backward_fn = h->backward;
    net->ready_ctx = h->ctx;
    net->ready_min_bytes = h->min_bytes;
    return 0;
}

int dsrt_net_set_grad_ready(dsrt_net *net, size_t min_bytes, dsrt_grad_ready_fn fn, void *ctx) {
    if (!fn) return dsrt_net_set_grad_hook(net, NULL);
    dsrt_grad_hook h = {min_bytes, min_bytes, fn, NULL, ctx};
    return dsrt_net_set_grad_hook(net, &h);
}

int dsrt_net_set_bn_sync(dsrt_net *net, dsrt_bn_sync_fn fn, void *ctx) {
    if (fn && !net->ops->bn_sync)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "net: the %s backend does not synchronise batch normalisation",
                          net->ops->name);
    net->bn_sync_fn = fn;
    net->bn_sync_ctx = fn ? ctx : NULL;
    return 0;
}
