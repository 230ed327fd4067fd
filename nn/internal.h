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

typedef enum {
    DSRT_LAYER_INPUT = 0,
    DSRT_LAYER_CONV,
    DSRT_LAYER_BATCHNORM,
    DSRT_LAYER_RELU, /* leaky when leak != 0 */
    DSRT_LAYER_MAXPOOL,
    DSRT_LAYER_AVGPOOL,
    DSRT_LAYER_GAP, /* global average pooling */
    DSRT_LAYER_FC,
    DSRT_LAYER_DROPOUT,
    DSRT_LAYER_LRN,
    DSRT_LAYER_SOFTMAX, /* softmax + cross-entropy: the classification output */
} dsrt_layer_kind;

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
#define DSRT_CLASSES_AUTO   (-1) /* "outputs=classes" */
#define DSRT_INIT_DEFAULT   (-1) /* the net's initialiser */

typedef struct {
    int c, h, w;
} dsrt_shape;

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
} dsrt_layer_opts;

typedef struct dsrt_layer_type dsrt_layer_type;

typedef struct {
    dsrt_layer_kind kind;
    const char *type;           /* description keyword, static */
    const dsrt_layer_type *def; /* the type's entry in the parser's table */
    char name[DSRT_LAYER_NAME_MAX];
    int line; /* in the description */
    dsrt_layer_opts o;
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
// Layer types (the table is in parse.c, the constructors in layers.c)

/* Infers l->out from in, resolves padding, counts parameters (w_n, b_n, s_n)
 * and flops. *classes is the net's class count (0: unknown yet); the
 * classification layer sets it. Returns 0 or DSRT_EOPTION with a message
 * (the caller prefixes the line). */
typedef int (*dsrt_layer_build_fn)(dsrt_layer *l, const dsrt_shape *in, int *classes);
/* Draws l's initial parameters into params (the net's flat buffer) and
 * state, from rng. init is the net's default dsrt_init. */
typedef void (*dsrt_layer_init_fn)(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng,
                                   int init);

struct dsrt_layer_type {
    const char *name; /* keyword */
    dsrt_layer_kind kind;
    dsrt_layer_build_fn build;
    dsrt_layer_init_fn init;          /* NULL: no parameters or state */
    const struct dsrt_opt_spec *opts; /* terminated by a NULL name */
    const char *help;
};

int dsrt__build_input(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_conv(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_batchnorm(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_same(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_pool(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_gap(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_fc(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_dropout(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_lrn(dsrt_layer *l, const dsrt_shape *in, int *classes);
int dsrt__build_softmax(dsrt_layer *l, const dsrt_shape *in, int *classes);
void dsrt__init_input(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init);
void dsrt__init_conv(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init);
void dsrt__init_batchnorm(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng,
                          int init);
void dsrt__init_fc(const dsrt_layer *l, float *params, float *state, dsrt_rng *rng, int init);

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

// ----------------------------------------------------------------------------
// Networks (net.c)

typedef struct dsrt_backend dsrt_backend;
typedef struct dsrt_backend_ops dsrt_backend_ops;

struct dsrt_net {
    dsrt_layer *layers; /* layers[0] is the input */
    int n_layers;
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
                       * the backend; backends re-derive cached copies */
    int64_t iteration;

    /* Gradient buckets announced during backward. */
    dsrt_grad_ready_fn ready_fn;
    void *ready_ctx;
    size_t ready_min_bytes;
    int *layer_bucket;   /* (n_layers) bucket a layer's gradients close, or -1 */
    dsrt_range *buckets; /* (n_buckets) */
    int n_buckets;

    const dsrt_backend_ops *ops;
    dsrt_backend *be;
};

/* Builds a net from a parsed description (takes ownership of d->layers).
 * Shapes are inferred, parameters laid out; with init, weights are drawn.
 * expect (NULL, or {params, state}) refuses with DSRT_ECORRUPT, before
 * allocating, a description whose counts differ (model files). */
int dsrt__net_build(dsrt_net **net, dsrt_desc *d, const char *text, const char *source, int h,
                    int w, int c, int classes, const dsrt_net_options *o, int init,
                    const size_t *expect);

/* Called by backends when layer i's gradients are final. */
void dsrt__net_grads_ready(dsrt_net *net, int layer);

/* Copies layer i's output for the last forward (plain NCHW, n x out.c x
 * out.h x out.w floats) into out. For tests. */
int dsrt__net_layer_output(dsrt_net *net, int layer, float *out, int train);

// ----------------------------------------------------------------------------
// Backends

/*
 * What a backend does for a net. A backend instance belongs to one net; it
 * reads the layer list and the flat buffers of the net it is created for and
 * writes gradients into net->grads and running statistics into net->state.
 */
struct dsrt_backend_ops {
    const char *name;
    int (*create)(dsrt_backend **be, dsrt_net *net);
    void (*destroy)(dsrt_backend *be);
    /* Forward over n images (x: n x c x h x w). train: batch statistics and
     * dropout, keeps what backward needs. labels may be NULL; then loss and
     * correct are not computed. probs (n x classes) may be NULL. */
    int (*forward)(dsrt_backend *be, const float *x, int n, int train, const int32_t *labels,
                   double *loss, int *correct, float *probs);
    /* Backward of the last training forward: gradients into net->grads,
     * calling dsrt__net_grads_ready as layers finish. */
    int (*backward)(dsrt_backend *be);
    /* Layer i's output of the last forward in plain NCHW. */
    int (*read_output)(dsrt_backend *be, int layer, int train, float *out);
};

extern const dsrt_backend_ops dsrt__backend_cpu;

// ----------------------------------------------------------------------------
// Optimizers (optim.c), for model files

/* Number of state buffers (each n_params floats) the optimizer keeps. */
int dsrt__optimizer_n_buffers(const dsrt_optimizer *opt);
float *dsrt__optimizer_buffer(dsrt_optimizer *opt, int i);
int64_t dsrt__optimizer_steps(const dsrt_optimizer *opt);
void dsrt__optimizer_set_steps(dsrt_optimizer *opt, int64_t t);

// ----------------------------------------------------------------------------
// Model files (model.c)

/* Reads a model or checkpoint from memory; name is used in messages. The
 * fuzz target's entry. */
int dsrt__model_read(const uint8_t *data, size_t size, const char *name, dsrt_net **net,
                     dsrt_optimizer **opt, dsrt_train_position *pos,
                     const dsrt_net_options *options);

#endif
