/*
 * Internals of the nn module: the layer records a description is parsed
 * into, the network that owns the flat parameter buffers, and the ops table
 * a compute backend fills. Layers only describe (kind, options, shapes, where
 * their parameters lie); a backend turns the list into work and runs it, so a
 * new backend (cuDNN, another device) needs no change here.
 */
#ifndef DSRT_NN_INTERNAL_H
#define DSRT_NN_INTERNAL_H

#include "core/internal.h"

#include <dsrt/nn.h>

// ----------------------------------------------------------------------------
// Layers

#include "nn/layers/list.h"

typedef enum {
#define DSRT_LAYER_ENUM(K, k) DSRT_LAYER_##K,
    DSRT_LAYER_KINDS(DSRT_LAYER_ENUM)
#undef DSRT_LAYER_ENUM
} dsrt_layer_kind;

#define DSRT_LAYER_COUNT_ONE(K, k) +1
enum { DSRT_LAYER_KIND_COUNT = 0 DSRT_LAYER_KINDS(DSRT_LAYER_COUNT_ONE) };
#undef DSRT_LAYER_COUNT_ONE

typedef enum {
    DSRT_NORM_NONE = 0,
    DSRT_NORM_ZEROCENTER,
    DSRT_NORM_ZSCORE,
    DSRT_NORM_RESCALE,           /* [min, max] -> [0, 1] */
    DSRT_NORM_RESCALE_SYMMETRIC, /* [min, max] -> [-1, 1] */
} dsrt_norm;

#define DSRT_LAYER_NAME_MAX 48
#define DSRT_STATS_MAX      16 /* channels that a description may list statistics for */
#define DSRT_LAYERS_MAX     4096
#define DSRT_INPUTS_MAX     64   /* inputs a layer may take (add, concat) */
#define DSRT_CLASSES_AUTO   (-1) /* "outputs=classes" */
#define DSRT_INIT_DEFAULT   (-1) /* the net's initialiser */
/* A class name kept in a description: this comment, then the name, one
 * line a class in class order (runtime/train/model.c writes them). */
#define DSRT_CLASS_LINE "# dsrt-class: "

typedef struct {
    int c, h, w;
} dsrt_shape;

/* Values in an image of c x h x w, in 64 bits; INT64_MAX when that
 * overflows or a size is negative. Every layer's images are kept to 2^31 - 1
 * values, which an int indexes. */
static inline int64_t dsrt__volume(int64_t c, int64_t h, int64_t w) {
    int64_t ch, chw;
    if (c < 0 || h < 0 || w < 0 || __builtin_mul_overflow(c, h, &ch) ||
        __builtin_mul_overflow(ch, w, &chw))
        return INT64_MAX;
    return chw;
}

/* Every option any layer type takes; the parser's table says which apply to
 * which type and their defaults. */
typedef struct {
    /* input */
    int in_h, in_w, in_c;
    int norm; /* dsrt_norm */
    float mean[DSRT_STATS_MAX], std[DSRT_STATS_MAX], min[DSRT_STATS_MAX], max[DSRT_STATS_MAX];
    int n_mean, n_std, n_min, n_max;
    /* conv, pooling */
    int filters;
    int kh, kw;         /* kernel */
    int sh, sw;         /* stride */
    int pt, pb, pl, pr; /* padding, top bottom left right */
    int pad_same;       /* MATLAB 'same': output = ceil(input / stride) */
    int count_pad;      /* avgpool: 1 the mean divides by the window's size (padding counts as
                         * zeros); 0 by the number of its elements inside the image */
    int dh, dw;         /* dilation (1 = none) */
    int groups;
    int bias; /* conv, fc: 1 learnable bias, 0 none */
    int init; /* dsrt_init or DSRT_INIT_DEFAULT */
    /* fc */
    int outputs; /* or DSRT_CLASSES_AUTO */
    /* relu */
    float leak; /* negative slope */
    /* dropout */
    float p;
    /* lrn */
    int lrn_size;
    float alpha, beta, k;
    /* batchnorm */
    float eps, momentum; /* running average: r = (1 - momentum) r + momentum batch */
    /* learn-rate and L2 factors of weights and biases (scale and offset for BN) */
    float wlr, blr, wl2, bl2;
    /* add */
    int relu; /* 1: a ReLU on the sum */
    /* The options of a kind that keeps them in a struct of its own
     * (DSRT_LAYER_OPTS): its file alone knows them. */
    union {
        unsigned char own[64];
        double own_align_;
    };
} dsrt_layer_opts;

/* Layer l's options of kind-specific type T, kept in l->o.own. */
#define DSRT_LAYER_OPTS(T, l) ((T *)(void *)(l)->o.own)
/* The offset of T's field f in dsrt_layer_opts, for an option table. */
#define DSRT_OWN_OPT(T, f) (offsetof(dsrt_layer_opts, own) + offsetof(T, f))

typedef struct dsrt_layer_type dsrt_layer_type;
typedef struct dsrt_layer_ops dsrt_layer_ops;

typedef struct dsrt_layer {
    dsrt_layer_kind kind;
    const char *type;           /* description keyword, static */
    const dsrt_layer_type *def; /* the type's entry in the parser's table */
    char name[DSRT_LAYER_NAME_MAX];
    int line; /* in the description */
    dsrt_layer_opts o;
    /* The graph: the layers whose outputs this one takes (indices of layers
     * above it, in the order named by inputs=; by default the line above),
     * and how many layers take this one's output. in is the shape the layer
     * sees: its input's (add: the common shape; concat: the channels
     * summed). */
    int inputs[DSRT_INPUTS_MAX];
    int n_inputs;
    int consumers;
    char *inputs_text; /* inputs= as written, until the net resolves it (owned) */
    dsrt_shape in, out;
    /* Padding resolved against the input (for 'same'). */
    int pt, pb, pl, pr;
    /* Parameters: offsets and lengths in floats into the flat buffers.
     * conv: w (filters, in_c/groups, kh, kw), b (filters)
     * fc: w (outputs, in_c, in_h, in_w), b (outputs)
     * batchnorm: w = scale (c), b = offset (c) */
    size_t w_off, w_n, b_off, b_n;
    /* State: batchnorm s (2c) = running mean (c), running variance (c);
     * input s (4c) = mean (c), std (c), min (c), max (c). */
    size_t s_off, s_n;
    /* Set when the layer computes the ReLU that follows it (which then
     * passes its input through). */
    int fuse_relu;
    float fuse_leak;
    int fused_away; /* this ReLU is computed by the layer before it */
    double flops;   /* forward multiply-adds x 2 per image */
} dsrt_layer;

// ----------------------------------------------------------------------------
// Layer kinds: one ops table each (nn/layers/*.c), listed in nn/layers/list.h

/* The kinds of option values a description may give. */
typedef enum {
    OPT_INT,     /* int */
    OPT_FLOAT,   /* float */
    OPT_BOOL,    /* int 0/1 */
    OPT_PAIR,    /* two ints: "N" or "HxW" */
    OPT_PAD,     /* four ints + pad_same: "same", "N", "HxW", "T,B,L,R" */
    OPT_SIZE3,   /* three ints h, w, c: "HxWxC" */
    OPT_ENUM,    /* int index into choices ("a|b|c") */
    OPT_FLOATS,  /* float[DSRT_STATS_MAX] + int count: "v" or "v1,v2,..." */
    OPT_OUTPUTS, /* int, or DSRT_CLASSES_AUTO for "classes" */
    OPT_INIT,    /* int: default|glorot|he|uniform */
} dsrt_opt_type;

/* One option of a layer keyword: its name, type, default, where it is
 * stored in dsrt_layer_opts and its range. */
typedef struct dsrt_opt_spec {
    const char *name;
    dsrt_opt_type type;
    const char *def; /* NULL: required */
    size_t off;      /* into dsrt_layer_opts */
    size_t off2;     /* OPT_FLOATS: the count; OPT_PAD: pad_same */
    double min, max; /* for numbers */
    const char *choices;
} dsrt_opt_spec;

#define DSRT_O(f) offsetof(dsrt_layer_opts, f)
#define DSRT_OPT_END                                                                               \
    { NULL, 0, NULL, 0, 0, 0, 0, NULL }
/* The learn-rate and L2 factors of a layer's weights and bias. */
#define DSRT_LR_OPTS(wl2_def, bl2_def)                                                             \
    {"wlr", OPT_FLOAT, "1", DSRT_O(wlr), 0, 0, 1e6, NULL},                                         \
        {"blr", OPT_FLOAT, "1", DSRT_O(blr), 0, 0, 1e6, NULL},                                     \
        {"wl2", OPT_FLOAT, wl2_def, DSRT_O(wl2), 0, 0, 1e6, NULL}, {                               \
        "bl2", OPT_FLOAT, bl2_def, DSRT_O(bl2), 0, 0, 1e6, NULL                                    \
    }

/* A keyword of the description format: the layer it makes, with its
 * options (relu and leakyrelu are one kind with two defaults). */
struct dsrt_layer_type {
    const char *name;          /* keyword; NULL ends a kind's list */
    const dsrt_opt_spec *opts; /* terminated by a NULL name */
    const char *help;
};

/* Infers l->out from in, resolves padding, counts parameters (w_n, b_n, s_n)
 * and flops. *classes is the net's class count (0: unknown yet); the
 * classification layer sets it. Returns 0 or DSRT_EOPTION with a message
 * (the caller prefixes the line). */
typedef int (*dsrt_layer_build_fn)(dsrt_layer *l, const dsrt_shape *in, int *classes);
/* Draws l's initial parameters into params (the net's flat buffer) and
 * state, from rng. init is the net's default dsrt_init. */
typedef void (*dsrt_layer_init_fn)(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng,
                                   int init);

/* What a kind is to the net (dsrt_layer_ops.flags). */
enum {
    DSRT_LAYER_F_INPUT = 1,  /* the network's input: the first layer, and only there */
    DSRT_LAYER_F_OUTPUT = 2, /* the classification output: the last layer, and only there */
    /* It can compute a ReLU that takes its output (conv, fc, add; batchnorm
     * not a leaky one), so that the ReLU passes its input through. */
    DSRT_LAYER_F_TAKES_RELU = 4,
    DSRT_LAYER_F_TAKES_RELU_PLAIN = 8,
    DSRT_LAYER_F_RELU = 16, /* a ReLU (leak o.leak) that the layer before may compute */
    /* Each input's gradient is its output's, unchanged (add): the net may
     * give them one buffer (grad_share in net.c). */
    DSRT_LAYER_F_GRAD_PASSES = 32,
    /* At inference it can compute what layers after it compute (conv, fc):
     * a per-channel affine map folded into its weights (batchnorm), the
     * element-wise functions of activations, and the sum of an add that
     * takes its output (with the add's ReLU): see infer_act, infer_affine
     * and the CPU backend's inference plan. */
    DSRT_LAYER_F_POSTOPS = 64,
    /* Its output is the sum of its inputs (then its own ReLU, fuse_relu):
     * at inference the layer before it may compute it. */
    DSRT_LAYER_F_SUM = 128,
    /* The identity at inference (dropout, drop-path): its output is its
     * input's on either backend, and a chain of layers the one before
     * computes goes on through it. */
    DSRT_LAYER_F_INFER_IDENTITY = 256,
};

/* An element-wise function, as a layer after a convolution is at inference
 * (dsrt_layer_ops.infer_act). */
typedef enum {
    DSRT_ACT_RELU,        /* max(x, 0) + alpha min(x, 0) */
    DSRT_ACT_CLIP,        /* min(max(x, alpha), beta) */
    DSRT_ACT_LOGISTIC,    /* 1 / (1 + e^-x) */
    DSRT_ACT_HARDSIGMOID, /* min(max(alpha x + beta, 0), 1) */
    DSRT_ACT_HARDSWISH,   /* x min(max(x + 3, 0), 6) / 6 */
    DSRT_ACT_SWISH,       /* x / (1 + e^-x) */
    DSRT_ACT_GELU_ERF,    /* x Phi(x) */
    DSRT_ACT_GELU_TANH,   /* its tanh form */
} dsrt_act_fn;

typedef struct {
    dsrt_act_fn fn;
    float alpha, beta;
} dsrt_act;

struct dsrt_cpu_backend;
struct dsrt_cpu_plan;
struct dsrt_onnx_export;
struct dsrt_onnx_import;
struct dsrt_onnx_layer;

/* An ONNX operator a kind is imported from: its name, the attributes it
 * knows (comma-separated), and the mapping (nn/onnx.h). */
typedef struct {
    const char *op;
    int (*map)(struct dsrt_onnx_import *c);
    const char *attrs;
    /* ONNX_OP_ELEMENTWISE: it computes element by element, so it takes a
     * value in either layout and its output keeps it; ONNX_OP_NHWC: its
     * mapping handles channels-last values itself. 0: (N, C, H, W) or (N, K)
     * values only. ONNX_OP_MADE: no ONNX operator; the name of a node the
     * import's rewrites make of several (SiLU's Sigmoid and Mul), which a
     * node read from a file never matches. */
    unsigned flags;
} dsrt_onnx_op;

enum { ONNX_OP_ELEMENTWISE = 1, ONNX_OP_NHWC = 2, ONNX_OP_MADE = 4 };

/*
 * A layer kind: everything dsrt knows of it, in its own file. The engines
 * (parse.c, net.c, the backends, ONNX import and export) reach kinds only
 * through these tables.
 */
struct dsrt_layer_ops {
    const char *name;             /* the kind's name */
    const dsrt_layer_type *types; /* its keywords, up to a NULL name */
    int min_inputs, max_inputs;   /* layers it takes (inputs=) */
    unsigned flags;               /* DSRT_LAYER_F_* */
    /* For a kind of several inputs: the shape it sees from theirs (ins[k],
     * n of them) into *out; 1 when they do not go together, with what they
     * must share ("one shape") in *must, 2 when together they would have
     * 2^31 values or more. NULL: one input, its shape. */
    int (*join)(const dsrt_shape *const *ins, int n, dsrt_shape *out, const char **must);
    dsrt_layer_build_fn build;
    dsrt_layer_init_fn init; /* NULL: no parameters or state */
    /* The CPU backend's forward and backward steps of layer i in plan p
     * (nn/backend_cpu.h). */
    int (*cpu_plan)(struct dsrt_cpu_backend *be, struct dsrt_cpu_plan *p, int i);
    /* Writes layer i of the net as ONNX nodes (nn/onnx.h); out receives the
     * name of the value that holds its output. */
    int (*onnx_export)(struct dsrt_onnx_export *e, const dsrt_layer *l, int i, char *out);
    const dsrt_onnx_op *onnx_ops; /* ONNX operators mapped to it, up to a NULL op */
    /* At import: 1 when a layer of this kind (self) takes on what its only
     * taker computes (add: a ReLU, as relu=1), which then goes. */
    int (*onnx_absorb)(struct dsrt_onnx_layer *self, const struct dsrt_onnx_layer *taker);
    /* At inference, what the layer is when the layer before it computes it
     * (DSRT_LAYER_F_POSTOPS): an element-wise function (infer_act fills
     * *act and returns 1; 0: not one for these options), or a per-channel
     * affine map y = x scale + shift (infer_affine writes the layer's
     * channels' scale and shift from its weights and state and returns 1).
     * NULL: neither. */
    int (*infer_act)(const dsrt_layer *l, dsrt_act *act);
    int (*infer_affine)(const dsrt_layer *l, const float *params, const float *state, float *scale,
                        float *shift);
    /* The first opset at which onnx_export writes the kind as operators
     * that its onnx_ops read back as one layer of the kind (the tests that
     * walk the table check the round trip from there); 0: every opset
     * (an expansion the import's rewrites put back together counts); -1:
     * none. Below it the export is an expansion into other kinds'
     * operators. */
    int onnx_round_trip;
    /* A small net (a description, its input size given) with a layer of
     * the kind in it, which the tests that walk the table check: its
     * gradients against finite differences, the GPU backend against the
     * CPU's, ONNX export and import. */
    const char *example;
};

#define DSRT_LAYER_EXTERN(K, k) extern const dsrt_layer_ops dsrt__layer_##k;
DSRT_LAYER_KINDS(DSRT_LAYER_EXTERN)
#undef DSRT_LAYER_EXTERN

/* Every kind's ops, by dsrt_layer_kind (nn/layers/common.c). */
extern const dsrt_layer_ops *const dsrt__layers[DSRT_LAYER_KIND_COUNT];

static inline const dsrt_layer_ops *dsrt__layer_ops(const dsrt_layer *l) {
    return dsrt__layers[l->kind];
}

static inline int dsrt__layer_is(const dsrt_layer *l, unsigned flag) {
    return (dsrt__layers[l->kind]->flags & flag) != 0;
}

/* The keyword's row among every kind's and its kind, or NULL (parse.c). */
const dsrt_layer_type *dsrt__layer_type_find(const char *name, dsrt_layer_kind *kind);

/* Shared by the kinds' constructors and initialisers (nn/layers/common.c). */

/* Output height and width of a window sweep (size kh x kw, stride, padding
 * o.pt.. resolved into l->pt.. for 'same'), dilation dh x dw, over in;
 * DSRT_EOPTION naming the option when the window does not fit. */
int dsrt__layer_window(dsrt_layer *l, const dsrt_shape *in, int dh, int dw);
/* DSRT_ETOOBIG when a tensor of elems values would not fit an int. */
int dsrt__layer_check_size(const dsrt_layer *l, double elems, const char *what);
/* Draws n weights of initialiser how (dsrt_init) for fan_in and fan_out. */
void dsrt__layer_draw(float *w, size_t n, int how, double fan_in, double fan_out, dsrt_rng *rng);
/* n biases: zero, or for DSRT_INIT_UNIFORM drawn as the weights are. */
void dsrt__layer_init_bias(float *b, size_t n, int how, double fan_in, dsrt_rng *rng);

// ----------------------------------------------------------------------------
// Descriptions (parse.c)

/* A parsed description: layer records with options and line numbers, shapes
 * not yet known. */
typedef struct {
    dsrt_layer *layers;
    int n;
} dsrt_desc;

/* Parses text (source names it in messages: "net 'cifar'", "model x.dsrt").
 * Returns 0 or DSRT_EOPTION with "source: line N: ..." in the message. */
int dsrt__desc_parse(dsrt_desc *d, const char *text, const char *source);
void dsrt__desc_free(dsrt_desc *d);

/* Writes the layer types and their options with defaults into buf (for
 * help texts); returns the length it needed. */
size_t dsrt__desc_help(char *buf, size_t size);

/*
 * A set of layer names, each with an int (a layer's index, a counter): a
 * hash table, so that naming thousands of layers, making their names
 * unique and finding a layer by name stay linear in the layer count. Names
 * are shorter than DSRT_LAYER_NAME_MAX. Zero-initialised, it is empty.
 */
typedef struct {
    char (*name)[DSRT_LAYER_NAME_MAX]; /* (cap) "" where free */
    int *value;                        /* (cap) */
    size_t cap, n;
} dsrt_layer_names;

/* The slot of name's value, or NULL when name is not in the set. */
int *dsrt__layer_names_find(const dsrt_layer_names *s, const char *name);
/* Adds name with value (a name already there keeps its own value). Returns
 * 0, 1 when the name was there, or -ENOMEM (with the message). */
int dsrt__layer_names_add(dsrt_layer_names *s, const char *name, int value);
void dsrt__layer_names_free(dsrt_layer_names *s);

// ----------------------------------------------------------------------------
// Networks (net.c; what backends call back: net_hooks.c)

typedef struct dsrt_backend dsrt_backend;
typedef struct dsrt_backend_ops dsrt_backend_ops;

struct dsrt_net {
    dsrt_layer *layers; /* layers[0] is the input; every layer's inputs lie above it */
    int n_layers;
    /* (n_layers) 1: backward produces the gradient of layer i's output (a
     * layer that learns lies on a path from the input to it). */
    int *need_diff;
    /* (n_layers) the add layer whose output gradient layer i's output
     * gradient can be (one buffer, no copy), or -1 (grad_share in net.c
     * says when). */
    int *grad_share;
    char *desc;   /* the description text */
    char *source; /* what the description came from, for messages */
    dsrt_shape input;
    int classes;
    dsrt_net_options opts;

    float *params; /* (n_params) every learnable tensor, plain layout, layer order */
    float *grads;  /* (n_params) */
    float *state;  /* (n_state) running statistics, input statistics */
    size_t n_params, n_state;
    uint64_t version; /* bumped whenever params or state change from outside
                       * the backend (and by the CPU backend's own training
                       * forward, whose running statistics are the host's);
                       * backends re-derive cached copies. A device backend
                       * uploads the host's values when it changes, so only
                       * the CPU backend bumps it from inside. */
    int64_t iteration;

    /* Gradient buckets announced during backward. */
    dsrt_grad_ready_fn ready_fn;
    void *ready_ctx;
    size_t ready_min_bytes;
    void (*backward_fn)(void *ctx, int end); /* around the backward pass */
    /* Synchronised batchnorm (dsrt_net_set_bn_sync): backends that support
     * it call bn_sync_fn in training forward and backward of batchnorm. */
    dsrt_bn_sync_fn bn_sync_fn;
    void *bn_sync_ctx;
    /* 1: inference plans keep every layer's output readable after the
     * forward (dsrt__net_layer_output), giving up the reuse of dead ones:
     * for checks that compare a fused plan layer by layer. Set before the
     * first inference. */
    int keep_outputs;
    /* Images a piece of an inference batch run in pieces (the CPU backend's
     * micro_batch); 0: the backend's choice. For checks of the pieces. */
    int infer_pieces;
    /* Bytes of last-level cache the CPU backend takes when it cuts a dense
     * net's inference batch into segments (forward_segments); 0: the
     * machine's. For checks of the segments. */
    size_t infer_llc;
    /* An imported model that said nothing of its input's normalisation
     * (dsrt_net_info.input_assumed). */
    int input_assumed;
    int *layer_bucket;   /* (n_layers) bucket a layer's gradients close, or -1 */
    dsrt_range *buckets; /* (n_buckets) */
    int n_buckets;
    /* Bumped by each dsrt_net_set_grad_hook: a new bucket layout may sit
     * at the old one's address, so recorded steps key on this instead. */
    uint64_t hook_gen;

    const dsrt_backend_ops *ops;
    dsrt_backend *be;
    /* DSRT_BUF_* bits: the backend's (device) copy of these buffers is newer
     * than the host's; the public accessors copy them back first. */
    unsigned host_stale;
    dsrt_precision precision; /* as the backend resolved it (never DEFAULT) */
    const void *staged;       /* data of the batch staged last, NULL when none */
    int started;              /* a train_start awaits its train_finish */
    /* The optimizer whose state a device backend holds newer than its host
     * buffers (it is brought back before the net goes away or moves). */
    dsrt_optimizer *opt_on_device;
    /* Set by a communicator whose collectives the device's queued work
     * waits for (NULL: none): while the host waits on the device, a device
     * backend calls it now and then and fails the wait with its non-zero
     * result (a collective past its deadline, the communicator aborted),
     * so that no host wait outlives the communicator's timeout. */
    int (*wait_check)(void *ctx);
    void *wait_ctx;
    /* Per-layer timing of training steps (dsrt_net_profile_start), or NULL. */
    struct dsrt_net_prof *prof;
    /* What the backend has to say of how it runs the net (why CUDA graphs
     * went off, ...), for the profile; empty when nothing. */
    char backend_note[256];
};

/*
 * Per-layer timing of training steps, summed: each layer's forward and
 * backward, the optimizer, a step's span (its first timed piece of work to
 * its last, forward and backward) and the idle gaps between consecutive
 * pieces within it (launch gaps on a device). The CPU backend times with
 * the clock, a device backend with device events.
 */
typedef struct dsrt_net_prof {
    int on;                /* steps are timed (off: what was measured stays) */
    double *fwd_s, *bwd_s; /* (n_layers) */
    double opt_s, span_s, gap_s;
    int64_t steps, opt_steps, gaps, graph_steps;
    int device; /* 1: device events; 0: the host's clock */
    /* The step being timed by the host (dsrt__prof_piece). */
    int open;
    double step_t0, prev_t1;
} dsrt_net_prof;

/* The profile of net when it is timing steps, else NULL. */
static inline dsrt_net_prof *dsrt__prof_on(const dsrt_net *net) {
    return net->prof && net->prof->on ? net->prof : NULL;
}

/* A backend timing a step with the host's clock: layer `layer`'s forward
 * (backward 0) or backward took [t0, t1] (seconds); pieces come in the
 * order they ran, and the idle time between consecutive ones is a gap. */
void dsrt__prof_piece(dsrt_net *net, int layer, int backward, double t0, double t1);
/* The step timed by pieces is complete (after its backward). */
void dsrt__prof_step_end(dsrt_net *net);

/* The flat buffers, as bits. */
enum {
    DSRT_BUF_PARAMS = 1,
    DSRT_BUF_GRADS = 2,
    DSRT_BUF_STATE = 4,
    DSRT_BUF_ALL = 7,
};

/* Builds a net from a parsed description (takes ownership of d->layers).
 * Shapes are inferred, parameters laid out; with init, weights are drawn.
 * expect (NULL, or {params, state}) refuses with DSRT_ECORRUPT, before
 * allocating, a description whose counts differ (model files). */
int dsrt__net_build(dsrt_net **net, dsrt_desc *d, const char *text, const char *source, int h,
                    int w, int c, int classes, const dsrt_net_options *o, int init,
                    const size_t *expect);

/* Whether backward produces the gradient of layer i's output. */
int dsrt__net_need_diff(const dsrt_net *net, int i);

/* Layer l's k-th input (index of a layer above it). */
static inline int dsrt__in(const dsrt_layer *l, int k) {
    return l->inputs[k];
}

/* The one layer that takes layer j's output, or -1 when none or several
 * (the backends' inference plans follow such chains). */
/* A buffer of a pool placed by its life (nn/lives.c): it lives from step
 * lo to step hi (inclusive); offset is where it starts in the pool. */
typedef struct {
    size_t size, offset;
    int lo, hi;
} dsrt_life;

/* Places b[0..n) in one span: largest first, each at the lowest offset (a
 * multiple of align) where it meets no placed buffer whose life overlaps
 * its own. *span: the bytes they take, rounded up to align. 0 or -ENOMEM. */
int dsrt__place_by_life(dsrt_life *b, size_t n, size_t align, size_t *span);

static inline int dsrt__net_only_taker(const dsrt_net *net, int j) {
    if (net->layers[j].consumers != 1) return -1;
    for (int k = j + 1; k < net->n_layers; k++)
        for (int q = 0; q < net->layers[k].n_inputs; q++)
            if (net->layers[k].inputs[q] == j) return k;
    return -1;
}

/* Called by backends when layer i's gradients are final (on a device: when
 * the work that writes them is queued). */
void dsrt__net_grads_ready(dsrt_net *net, int layer);

/* Copies the backend's newer copies of the buffers in `what` (DSRT_BUF_*)
 * to the host. Returns 0 or the backend's error. */
int dsrt__net_host(dsrt_net *net, unsigned what);

/* One forward pass over a float NCHW batch, with the loss, correct count and
 * probabilities of the backend (each may be NULL). For tests. */
int dsrt__net_forward(dsrt_net *net, const float *x, int n, int train, const int32_t *labels,
                      double *loss, int *correct, float *probs);

/* Copies layer i's output for the last forward (plain NCHW, n x out.c x
 * out.h x out.w floats) into out. For tests. */
int dsrt__net_layer_output(dsrt_net *net, int layer, float *out, int train);

/*
 * The shapes a run's steps will take, so that a device backend sizes and
 * allocates everything they need at once, before the first collective:
 * allocating or freeing device memory while another worker's NCCL kernels
 * may be in flight can hang them. A batch of another size later still
 * works (an inference pass borrows the memory of a larger one's plan);
 * growth beyond what was reserved waits for the device to be idle first.
 */
#define DSRT_RESERVE_SHAPES 4
typedef struct {
    int train_n[DSRT_RESERVE_SHAPES]; /* batch sizes of training steps */
    int n_train;
    int infer_n[DSRT_RESERVE_SHAPES]; /* batch sizes of inference passes */
    int n_infer;
    int layout;       /* dsrt_input_layout of the training batches */
    int infer_layout; /* ... and of the inference batches */
    int opt_buffers;  /* optimizer state buffers the steps use (0: no optimizer) */
} dsrt_net_reserve;

/* Reserves what the shapes in r need on the net's backend (a no-op on the
 * CPU). Returns 0 or a negative code. */
int dsrt__net_reserve(dsrt_net *net, const dsrt_net_reserve *r);

/* Checks a batch against the net: size, layout, labels, uint8 divisors.
 * staged: b is the batch staged last, whose labels were checked then; its
 * host memory is not read again (a pipeline slot goes back to the workers
 * once its copy is done, and they may be refilling it). */
int dsrt__net_check_batch(const dsrt_net *net, const dsrt_net_batch *b, int need_labels,
                          int staged);

/* dst (n, c, h, w) = (src (n, h, w, c) - sub[c]) / div[c]: a uint8 batch as
 * the pipeline's float output would hold it, bit for bit. */
void dsrt__batch_u8_to_f32(const uint8_t *src, float *dst, int n, int c, int h, int w,
                           const float *sub, const float *div);

// ----------------------------------------------------------------------------
// Optimizer steps, as a backend runs them

/* One parameter tensor (a layer's weights or its bias): a contiguous range
 * of the flat buffers with its learn-rate and L2 factors (lr 0: frozen). */
typedef struct {
    size_t off, n;
    float lr, l2;
} dsrt_segment;

/* Everything one optimizer step needs, resolved for the step. */
typedef struct {
    dsrt_solver solver;
    double lr;      /* the schedule's rate for this step (times each segment's factor) */
    double l2;      /* L2Regularization (times each segment's factor) */
    float momentum; /* SGDM */
    float b1, b2;   /* Adam: gradient decay and squared gradient decay; RMSProp: b2 */
    float c1, c2;   /* Adam's bias corrections 1 / (1 - b^t) for this step */
    float eps;
    dsrt_grad_clip clip;
    double threshold; /* INFINITY: no clipping */
    const dsrt_segment *seg;
    int n_seg;
    /* The optimizer's state on the host (n_params floats each): SGDM
     * velocity; Adam first and second moments; RMSProp mean square. */
    float *buf[2];
    int n_buf;
    /* Who owns the state, and its host version (bumped when the host
     * buffers are written from outside): a device backend keeps a copy and
     * uploads it when either differs from the last step's. */
    const dsrt_optimizer *owner;
    uint64_t version;
} dsrt_optim_step;

/* The update on host buffers: clipping, L2 and the solver's rule over
 * w (params) from g (grads, clipped in place). The CPU backend's step, and
 * the reference every other backend is tested against. */
void dsrt__optim_host(float *w, float *g, const dsrt_optim_step *s);

/* Brings the optimizer's state back from the device holding it, if any. */
int dsrt__optimizer_host(dsrt_optimizer *opt);
/* The net that holds opt's state goes away or moves: bring it back. */
void dsrt__optimizer_release(dsrt_optimizer *opt);

// ----------------------------------------------------------------------------
// Backends

/* How a backend runs a net, for the profile. */
typedef struct {
    int graphs;          /* steps may be recorded as CUDA graphs */
    int64_t graph_steps; /* steps replayed from recorded graphs */
    int64_t captures;    /* recordings made */
    int fused_cudnn;     /* layers fused by cuDNN (convolution + bias + activation, BN + ReLU) */
    int fused_kernel;    /* layers whose bias and ReLU run in one dsrt kernel */
} dsrt_backend_report;

/* Where a backend's buffers are, for a communicator reducing gradients in
 * place. */
typedef struct {
    int device;   /* DSRT_DEVICE_CPU or the CUDA device */
    float *grads; /* (n_params) where backward writes gradients: net->grads on the CPU */
    float *params;
    float *state;
    void *stream; /* cudaStream_t the step's work is queued on; NULL on the CPU */
} dsrt_backend_memory;

/*
 * What a backend does for a net. A backend instance belongs to one net and
 * reads its layer list. The CPU backend works on the net's host buffers
 * directly; a device backend keeps its own copies of them, uploads the host
 * ones whenever net->version differs from the version it last saw, and sets
 * net->host_stale bits for what it changed (state in a training forward,
 * gradients in backward, parameters in an optimizer step).
 *
 * The calls of a training step are stage (optional), forward (train = 1),
 * backward, results, then optimize; a device backend may queue the work and
 * return at once from all but results, stage_wait and the read-backs.
 */
struct dsrt_backend_ops {
    const char *name; /* "cpu-onednn", "cuda-cudnn" */
    int device_kind;  /* 0: the CPU; 1: CUDA devices */
    /* Devices this backend can use now (device backends); when none, why
     * (a sentence) into why[size] unless why is NULL. */
    int (*devices)(char *why, size_t size);
    int (*create)(dsrt_backend **be, dsrt_net *net);
    void (*destroy)(dsrt_backend *be);
    /* Starts moving batch b (checked) where the backend computes: 1 when it
     * is being copied, 0 when forward reads b->data in place. */
    int (*stage)(dsrt_backend *be, const dsrt_net_batch *b);
    /* Waits until the host memory of the last staged batch may be reused. */
    int (*stage_wait)(dsrt_backend *be);
    /* Forward over the batch staged last, which is b (net.c stages b first
     * when the caller did not; b gives n, labels and global_n again).
     * train: batch statistics and dropout, keeps what backward needs.
     * Without labels, loss and correct are not computed. */
    int (*forward)(dsrt_backend *be, const dsrt_net_batch *b, int train);
    /* Backward of the last training forward: gradients, calling
     * dsrt__net_grads_ready as layers finish. */
    int (*backward)(dsrt_backend *be);
    /* Waits for the last forward (and backward) and gives its loss (mean
     * over the batch), correct count and probabilities (n x classes);
     * each may be NULL. */
    int (*results)(dsrt_backend *be, double *loss, int *correct, float *probs);
    /* One optimizer step over the net's parameters from its gradients. */
    int (*optimize)(dsrt_backend *be, const dsrt_optim_step *s);
    /* Copies the backend's buffers in `what` (DSRT_BUF_*) to the net's host
     * buffers. NULL: the host buffers are the backend's own. */
    int (*to_host)(dsrt_backend *be, unsigned what);
    /* Copies the optimizer state it holds for s->owner into s->buf. NULL:
     * the backend works on s->buf itself. */
    int (*optim_to_host)(dsrt_backend *be, const dsrt_optim_step *s);
    /* Runs fn(ctx, member) on each compute thread; returns the failures. */
    int (*run_on_threads)(dsrt_backend *be, int (*fn)(void *, int), void *ctx);
    /* Waits for every piece of queued work. NULL: nothing is queued. */
    int (*sync)(dsrt_backend *be);
    /* Seconds of device work and of device idleness between steps. NULL:
     * not a device. */
    void (*device_time)(dsrt_backend *be, double *busy_s, double *idle_s);
    void (*memory)(dsrt_backend *be, dsrt_backend_memory *m);
    /* Layer i's output of the last forward in plain NCHW. */
    int (*read_output)(dsrt_backend *be, int layer, int train, float *out);
    /* Bytes the plan for (n, train) holds for the layers' outputs and their
     * temporaries (*held), and what they would take each with bytes of its
     * own (*each); -ENOENT when no such plan was made. NULL: not said. */
    int (*activation_bytes)(dsrt_backend *be, int n, int train, size_t *held, size_t *each);
    /* 1: the backend calls net->bn_sync_fn (synchronised batchnorm). */
    int bn_sync;
    /* Sizes and allocates what the shapes of r need (dsrt__net_reserve).
     * NULL: nothing to reserve. */
    int (*reserve)(dsrt_backend *be, const dsrt_net_reserve *r);
    /* How it runs the net (NULL: nothing to say). */
    void (*describe)(dsrt_backend *be, dsrt_backend_report *r);
};

extern const dsrt_backend_ops dsrt__backend_cpu;
#ifdef DSRT_WITH_CUDA_BACKEND
extern const dsrt_backend_ops dsrt__backend_cuda;
#endif

/* Where net's backend keeps its buffers. */
void dsrt__net_memory(dsrt_net *net, dsrt_backend_memory *m);

// ----------------------------------------------------------------------------
// Optimizers (optim.c), for model files

/* Number of state buffers (each n_params floats) the optimizer keeps. */
int dsrt__optimizer_n_buffers(const dsrt_optimizer *opt);
/* State buffer i for writing (brought back from a device first; NULL when
 * that fails), and as it stands on the host for reading. */
float *dsrt__optimizer_buffer(dsrt_optimizer *opt, int i);
const float *dsrt__optimizer_state(const dsrt_optimizer *opt, int i);
int64_t dsrt__optimizer_steps(const dsrt_optimizer *opt);
void dsrt__optimizer_set_steps(dsrt_optimizer *opt, int64_t t);

// ----------------------------------------------------------------------------
// Model files (model.c)

/* Reads a model or checkpoint from memory; name is used in messages. The
 * fuzz target's entry. */
int dsrt__model_read(const uint8_t *data, size_t size, const char *name, dsrt_net **net,
                     dsrt_optimizer **opt, dsrt_train_position *pos,
                     const dsrt_net_options *options);

/* The optimizer states of the other workers of a data-parallel run whose
 * workers each keep their own (parameter averaging without averaging the
 * optimizer state): states[k - 1] and steps[k - 1] are worker k's (k from 1
 * to workers - 1), each its optimizer's buffers one after the other. */
typedef struct {
    int workers;
    const float *const *states;
    const int64_t *steps;
} dsrt_ckpt_workers;

/* dsrt_checkpoint_save with the other workers' optimizer states (ws NULL or
 * ws->workers < 2: none), in the optional section WOPT. */
int dsrt__checkpoint_save_workers(const char *path, const dsrt_net *net, const dsrt_optimizer *opt,
                                  const dsrt_train_position *pos, const dsrt_ckpt_workers *ws);
/* dsrt_checkpoint_load for worker `rank`: from a file with one optimizer
 * state a worker, the worker's own when the file holds own_world of them
 * (own_world 0: never), else the mean of them all; *workers (may be NULL)
 * receives how many the file holds, 1 when one serves every worker. */
int dsrt__checkpoint_load_worker(const char *path, dsrt_net **net, dsrt_optimizer **opt,
                                 dsrt_train_position *pos, const dsrt_net_options *options,
                                 int rank, int own_world, int *workers);
int dsrt__model_read_worker(const uint8_t *data, size_t size, const char *name, dsrt_net **net,
                            dsrt_optimizer **opt, dsrt_train_position *pos,
                            const dsrt_net_options *options, int rank, int own_world, int *workers);

#endif
