/*
 * dsrt nn: networks, their training arithmetic, optimizers and model files.
 *
 * A network (dsrt_net) is a plain chain of layers built from a text
 * description (or from the name of a built-in one: "digits", "cifar",
 * "alexnet") for an input shape and a class count. All its learnable
 * parameters live in ONE flat float buffer and their gradients in another of
 * the same length; layers are views into them. The gradient of the last layer
 * sits at the end of the buffer, so the gradient "buckets" that a data-
 * parallel trainer reduces while backward is still running are contiguous
 * ranges of the gradient buffer, handed out in reverse layer order.
 *
 * The arithmetic runs on a backend: oneDNN on the CPU today. Inputs are
 * batches of float32 images in NCHW order (n, channels, height, width) with
 * int32 labels in [0, classes).
 *
 * A training step is:
 *
 *     dsrt_net_forward_backward(net, x, labels, n, &loss, &correct);
 *     (optionally all-reduce dsrt_net_grads(net) here, bucket by bucket)
 *     dsrt_optimizer_step(opt, net, epoch);
 *
 * Threads: a dsrt_net and a dsrt_optimizer belong to one thread at a time;
 * different nets may run on different threads at once. The compute itself is
 * spread over dsrt_net_options.threads threads by the backend.
 */
#ifndef DSRT_NN_H
#define DSRT_NN_H

#include <dsrt/core.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsrt_net dsrt_net;
typedef struct dsrt_optimizer dsrt_optimizer;

// ----------------------------------------------------------------------------
// Networks

/* How the weights of convolution and fully connected layers are drawn when a
 * layer does not name its own initialiser. Biases always start at zero,
 * batch-normalisation scales at one and offsets at zero. */
typedef enum {
    DSRT_INIT_GLOROT = 0, /* uniform in +-sqrt(6 / (fan_in + fan_out)), MATLAB's default */
    DSRT_INIT_HE,         /* normal with standard deviation sqrt(2 / fan_in) */
} dsrt_init;

typedef struct {
    int threads;    /* compute threads; 0 leaves the OpenMP default (all cores) */
    uint64_t seed;  /* weight initialisation and dropout masks; default 0 */
    dsrt_init init; /* default initialiser; DSRT_INIT_GLOROT */
    int fuse;       /* 1 (default): fold a ReLU into the convolution, fully
                     * connected or batch-normalisation layer before it */
    int device;     /* -1 (default): the CPU; GPU indices later */
} dsrt_net_options;

/* The default options. */
DSRT_API dsrt_net_options dsrt_net_defaults(void);

/*
 * The description text of a built-in network ("digits", "cifar", "alexnet"),
 * or NULL for an unknown name. The string is static. With names != NULL,
 * *names receives a NULL-terminated static list of the built-in names.
 */
DSRT_API const char *dsrt_net_builtin(const char *name, const char *const **names);

/*
 * Builds a network. spec is the name of a built-in network or a description
 * (see nn/parse.c for the format: one layer a line, named options). height,
 * width and channels give the input image size; 0 takes it from the
 * description's input line. classes gives the number of classes, which
 * a layer refers to as "classes" (fc outputs=classes); 0 leaves it to the
 * description. Weights are initialised from options->seed (NULL: defaults).
 *
 * Returns 0 and sets *net, or a negative code (DSRT_EOPTION for a bad
 * description, with the line and option in dsrt_last_error()).
 */
DSRT_API int dsrt_net_create(dsrt_net **net, const char *spec, int height, int width, int channels,
                             int classes, const dsrt_net_options *options);

/* Frees a network; NULL is accepted. */
DSRT_API void dsrt_net_destroy(dsrt_net *net);

/* What a network is. */
typedef struct {
    int layers;                  /* number of layers, the input layer included */
    int height, width, channels; /* input image size */
    int classes;                 /* number of scores the net outputs */
    size_t params;               /* length of the parameter and gradient buffers */
    size_t learnable;            /* parameters proper (params less alignment gaps) */
    size_t state;                /* non-learnable state (running statistics) */
    double forward_flops;        /* multiply-adds x 2 of one image's forward pass */
    double train_flops;          /* forward + backward (data and weights) of one image */
    const char *backend;         /* "cpu-onednn" */
} dsrt_net_info;

DSRT_API void dsrt_net_get_info(const dsrt_net *net, dsrt_net_info *info);

/* One layer, as dsrt_net_layer() describes it. Strings belong to the net. */
typedef struct {
    const char *name; /* unique in the net, e.g. "conv_1" */
    const char *type; /* the description keyword: "conv", "batchnorm", ... */
    int out_channels, out_height, out_width;
    size_t weights_offset, weights_count; /* in the flat buffers; count 0: none */
    size_t bias_offset, bias_count;
    int fused; /* 1: a ReLU computed inside the layer before it */
} dsrt_layer_info;

/* Describes layer i (0 is the input layer). Returns 0 or -EINVAL. */
DSRT_API int dsrt_net_layer(const dsrt_net *net, int i, dsrt_layer_info *info);

/* The description the network was built from (NUL-terminated, owned by it). */
DSRT_API const char *dsrt_net_description(const dsrt_net *net);

/*
 * Sets the per-channel statistics the input layer normalises with:
 * zerocenter subtracts mean, zscore also divides by std, rescale maps
 * [min, max] to [0, 1] and rescale-symmetric to [-1, 1]. Each array holds
 * `channels` values; NULL leaves that statistic as it is. Saved in model files.
 */
DSRT_API int dsrt_net_set_input_stats(dsrt_net *net, const float *mean, const float *std,
                                      const float *min, const float *max);

// ----------------------------------------------------------------------------
// Running a network

/*
 * One training pass over a batch: forward in training mode (batch
 * statistics, dropout), softmax cross-entropy loss averaged over the batch,
 * and backward. The gradients overwrite the gradient buffer; batch-norm
 * running averages are updated. x holds n images (n, channels, height,
 * width) in float32; labels n values in [0, classes). *loss (may be NULL)
 * receives the mean loss, *correct (may be NULL) how many images scored
 * their label highest. Returns 0, DSRT_EOPTION for a label out of range,
 * DSRT_ENAN for a non-finite loss (gradients are still written), or another
 * negative code. The first call with a new batch size plans the layers for
 * it (slow); later calls with that size reuse the plan.
 */
DSRT_API int dsrt_net_forward_backward(dsrt_net *net, const float *x, const int32_t *labels, int n,
                                       float *loss, int *correct);

/*
 * Inference: forward with running statistics and no dropout. scores (n x
 * classes, may be NULL) receives the softmax probabilities. With labels !=
 * NULL, *loss and *correct are computed as for training (either may be NULL).
 */
DSRT_API int dsrt_net_predict(dsrt_net *net, const float *x, int n, float *scores,
                              const int32_t *labels, float *loss, int *correct);

/*
 * The training-step counter: it keys dropout masks (with the seed and the
 * layer), and forward_backward increments it. Set it when resuming.
 */
DSRT_API void dsrt_net_set_iteration(dsrt_net *net, int64_t iteration);
DSRT_API int64_t dsrt_net_iteration(const dsrt_net *net);

// ----------------------------------------------------------------------------
// Flat parameters and gradients

/*
 * The parameter buffer (*count floats, 64-byte aligned), owned by the net:
 * every layer's weights in plain layout (conv: (filters, channels/groups,
 * kh, kw); fc: (outputs, in_c, in_h, in_w); batchnorm: scale (c), offset
 * (c)), in layer order. After writing into it, call dsrt_net_params_changed.
 */
DSRT_API float *dsrt_net_params(dsrt_net *net, size_t *count);
DSRT_API void dsrt_net_params_changed(dsrt_net *net);

/* The gradient buffer: same length and layout as the parameters. */
DSRT_API float *dsrt_net_grads(dsrt_net *net, size_t *count);

/* Non-learnable state (batch-norm running mean and variance, input
 * statistics), saved in model files. Call dsrt_net_params_changed after
 * writing it. */
DSRT_API float *dsrt_net_state(dsrt_net *net, size_t *count);

/* A range of the gradient buffer, in floats. */
typedef struct {
    size_t offset, count;
} dsrt_range;

/*
 * Splits the gradient buffer into buckets of whole layers, each at least
 * min_bytes (the last may be smaller), in the order backward completes them:
 * bucket 0 is the end of the buffer (the last layers). Writes at most cap
 * ranges into out and returns how many buckets there are.
 */
DSRT_API int dsrt_net_buckets(const dsrt_net *net, size_t min_bytes, dsrt_range *out, int cap);

/*
 * Called during backward as soon as bucket `bucket` (as dsrt_net_buckets
 * with the same min_bytes numbers them) holds its final gradients, on the
 * thread that called forward_backward. fn may start reducing that range; it
 * must not touch other ranges of the buffer. fn NULL removes the callback.
 */
typedef void (*dsrt_grad_ready_fn)(void *ctx, int bucket, dsrt_range range);
DSRT_API int dsrt_net_set_grad_ready(dsrt_net *net, size_t min_bytes, dsrt_grad_ready_fn fn,
                                     void *ctx);

// ----------------------------------------------------------------------------
// Optimizers

typedef enum {
    DSRT_SOLVER_SGDM = 0, /* stochastic gradient descent with momentum */
    DSRT_SOLVER_ADAM,
    DSRT_SOLVER_RMSPROP,
} dsrt_solver;

typedef enum {
    DSRT_LR_NONE = 0,  /* constant learning rate */
    DSRT_LR_PIECEWISE, /* multiplied by drop_factor every drop_period epochs */
} dsrt_lr_schedule;

typedef enum {
    DSRT_CLIP_L2NORM = 0,    /* each parameter tensor's gradient scaled to norm <= threshold */
    DSRT_CLIP_GLOBAL_L2NORM, /* all gradients scaled together to norm <= threshold */
    DSRT_CLIP_ABSOLUTE,      /* each gradient value clamped to [-threshold, threshold] */
} dsrt_grad_clip;

/* MATLAB trainingOptions names in brackets. */
typedef struct {
    dsrt_solver solver;
    double learn_rate;         /* InitialLearnRate: 0.01 SGDM, 0.001 Adam and RMSProp */
    double momentum;           /* Momentum (SGDM): 0.9 */
    double l2;                 /* L2Regularization: 1e-4 */
    double gradient_decay;     /* GradientDecayFactor (Adam beta1): 0.9 */
    double sq_gradient_decay;  /* SquaredGradientDecayFactor: 0.999 Adam, 0.9 RMSProp */
    double epsilon;            /* Epsilon: 1e-8 */
    dsrt_lr_schedule schedule; /* LearnRateSchedule: none */
    double drop_factor;        /* LearnRateDropFactor: 0.1 */
    int drop_period;           /* LearnRateDropPeriod: 10 epochs */
    dsrt_grad_clip clip;       /* GradientThresholdMethod: l2norm */
    double grad_threshold;     /* GradientThreshold: INFINITY (no clipping) */
} dsrt_optimizer_options;

/* MATLAB's defaults for a solver. */
DSRT_API dsrt_optimizer_options dsrt_optimizer_defaults(dsrt_solver solver);

/*
 * Creates an optimizer for net's parameters (its state buffers are as long as
 * the parameter buffer). Each layer's learn-rate and L2 factors (options wlr,
 * blr, wl2, bl2 of the description) scale the rate and the L2 term of its
 * weights and biases; a factor 0 learn rate freezes them.
 */
DSRT_API int dsrt_optimizer_create(dsrt_optimizer **opt, const dsrt_net *net,
                                   const dsrt_optimizer_options *options);
DSRT_API void dsrt_optimizer_destroy(dsrt_optimizer *opt);

/*
 * Updates net's parameters from its gradient buffer: gradient clipping, L2,
 * then the solver's rule at the learning rate of epoch (0-based, for the
 * schedule). Returns 0 or a negative code.
 */
DSRT_API int dsrt_optimizer_step(dsrt_optimizer *opt, dsrt_net *net, int epoch);

/* The learning rate the schedule gives for epoch (0-based). */
DSRT_API double dsrt_optimizer_learn_rate(const dsrt_optimizer *opt, int epoch);

/* The options the optimizer runs with. */
DSRT_API dsrt_optimizer_options dsrt_optimizer_get_options(const dsrt_optimizer *opt);

// ----------------------------------------------------------------------------
// Model files and checkpoints

/* Where a training run stands, as a checkpoint records it. */
typedef struct {
    int64_t epoch;     /* epochs completed */
    int64_t iteration; /* training steps completed */
    uint64_t seed;     /* the run's seed */
} dsrt_train_position;

/*
 * Saves the network (description, input size, classes, parameters, running
 * statistics) to path, atomically: the file is complete or absent.
 */
DSRT_API int dsrt_model_save(const char *path, const dsrt_net *net);

/*
 * Loads a model or checkpoint file into a new network. options (NULL:
 * defaults) sets threads and the like; the weights come from the file.
 * A damaged, truncated or foreign file is refused with DSRT_EFORMAT,
 * DSRT_ECORRUPT, DSRT_ECHECKSUM, DSRT_ETRUNCATED or DSRT_EUNSUPPORTED and a
 * message naming the file and the fault.
 */
DSRT_API int dsrt_model_load(dsrt_net **net, const char *path, const dsrt_net_options *options);

/*
 * Saves what resuming a training run needs: the model, the optimizer's
 * options and state (may be NULL), and the position (may be NULL).
 */
DSRT_API int dsrt_checkpoint_save(const char *path, const dsrt_net *net, const dsrt_optimizer *opt,
                                  const dsrt_train_position *pos);

/*
 * Loads a checkpoint: a new network, a new optimizer with the saved options
 * and state (opt may be NULL; *opt is NULL when the file holds none), and the
 * position (pos may be NULL; zeros when the file holds none). The net's
 * iteration counter is set from the position.
 */
DSRT_API int dsrt_checkpoint_load(const char *path, dsrt_net **net, dsrt_optimizer **opt,
                                  dsrt_train_position *pos, const dsrt_net_options *options);

#ifdef __cplusplus
}
#endif
#endif
