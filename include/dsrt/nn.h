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
 * The arithmetic runs on a backend chosen by dsrt_net_options.device: oneDNN
 * on the CPU, or cuDNN and cuBLAS on an NVIDIA GPU in a build with the GPU
 * backend. Inputs are batches of float32 images in NCHW order (n, channels,
 * height, width), or of uint8 pixels in NHWC order, with int32 labels in
 * [0, classes).
 *
 * A training step is:
 *
 *     dsrt_net_forward_backward(net, x, labels, n, &loss, &correct);
 *     (optionally all-reduce the gradients here, bucket by bucket)
 *     dsrt_optimizer_step(opt, net, epoch);
 *
 * On a GPU the same step overlaps the copy of the next batch with the
 * compute of this one: dsrt_net_stage() starts the copy, and
 * dsrt_net_train_start() / dsrt_net_train_finish() split the step so the
 * caller can fetch and stage the next batch while the device computes.
 *
 * Where the numbers live. The flat buffers (parameters, gradients, state)
 * have one layout on every backend. A GPU backend keeps its own copies on
 * the device; dsrt_net_params(), dsrt_net_grads() and dsrt_net_state() bring
 * the device's values back to the host when it has newer ones, so the
 * pointers they return hold the values of that moment (call them again after
 * more steps). Host writes are sent to the device by
 * dsrt_net_params_changed().
 *
 * Threads: a dsrt_net and a dsrt_optimizer belong to one thread at a time;
 * different nets may run on different threads at once. On the CPU the
 * compute itself is spread over dsrt_net_options.threads threads by the
 * backend (see dsrt_net_set_threads).
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
 * layer does not name its own initialiser. Biases start at zero (but with
 * DSRT_INIT_UNIFORM), batch-normalisation scales at one and offsets at zero. */
typedef enum {
    DSRT_INIT_GLOROT = 0, /* uniform in +-sqrt(6 / (fan_in + fan_out)), MATLAB's default */
    DSRT_INIT_HE,         /* normal with standard deviation sqrt(2 / fan_in) */
    /* uniform in +-1 / sqrt(fan_in), weights and biases: PyTorch's default
     * for Conv2d and Linear (kaiming_uniform_ with a = sqrt(5)) */
    DSRT_INIT_UNIFORM,
} dsrt_init;

/* The arithmetic of a GPU backend (MATLAB and PyTorch defaults differ; dsrt
 * takes PyTorch's cuDNN default). The CPU backend computes in float32 for
 * fp32 and tf32 and refuses bf16. */
typedef enum {
    DSRT_PRECISION_DEFAULT = 0, /* tf32 on a GPU, fp32 on the CPU */
    DSRT_PRECISION_FP32,        /* float32 throughout */
    DSRT_PRECISION_TF32,        /* float32 storage, TensorFloat-32 products in convolutions and
                                   matrix products (10-bit mantissa inputs, float32 sums) */
    DSRT_PRECISION_BF16,        /* mixed: activations and their gradients stored in
                                   bfloat16, products summed in float32; float32 master
                                   weights, weight gradients, batchnorm statistics, loss
                                   and optimizer state */
} dsrt_precision;

/* Where a net computes: the CPU, or a CUDA device index. */
#define DSRT_DEVICE_CPU (-1)

typedef struct {
    int threads;              /* CPU compute threads; 0 leaves the OpenMP default (all cores) */
    uint64_t seed;            /* weight initialisation and dropout masks; default 0 */
    dsrt_init init;           /* default initialiser; DSRT_INIT_GLOROT */
    int fuse;                 /* 1: fold a ReLU into the convolution, fully connected or
                               * batch-normalisation layer before it; 2 (default): that,
                               * and at inference fold batchnorm into the convolution or
                               * fully connected layer before it and compute activations
                               * and residual sums as its post-ops, and in training (CPU)
                               * normalise a batchnorm's input inside the add that alone
                               * takes its output; 0: neither */
    int device;               /* DSRT_DEVICE_CPU (-1, default), or a CUDA device index (a build with
                               * the GPU backend and a visible device; see dsrt_gpu_count) */
    dsrt_precision precision; /* default DSRT_PRECISION_DEFAULT */
    int deterministic;        /* 1: only algorithms whose results do not depend on
                               * scheduling (GPU: no atomics-based cuDNN algorithms);
                               * the CPU backend always is, for a given thread count */
    int cuda_graphs;          /* GPU: 1 (default) records a training step's work as CUDA
                               * graphs once its shape has run twice and replays them;
                               * 0 launches every kernel of every step */
} dsrt_net_options;

/* The default options. */
DSRT_API dsrt_net_options dsrt_net_defaults(void);

/* CUDA devices the GPU backend can use: 0 in a build without it, without a
 * driver, without a device, or without the CUDA runtime (counted through
 * dsrt's small CUDA host module; the GPU backend's own libraries are not
 * loaded). Never fails. */
DSRT_API int dsrt_gpu_count(void);

/* Whether a net can compute on CUDA device `device`: 0, or DSRT_ENODEVICE
 * with dsrt_last_error() saying why not (no GPU backend in this build, no
 * driver or device visible, no such device), or DSRT_EMODULE when the GPU
 * backend's module or a library it needs (cuBLAS, cuDNN) cannot be loaded:
 * the message names the module, the library and the package to install.
 * Loads the GPU backend's module when the device is there. */
DSRT_API int dsrt_gpu_check(int device);

/* The name of a precision ("default", "fp32", "tf32", "bf16"), or NULL. */
DSRT_API const char *dsrt_precision_name(dsrt_precision p);

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
    const char *backend;         /* "cpu-onednn" or "cuda-cudnn" */
    int device;                  /* DSRT_DEVICE_CPU or the CUDA device */
    dsrt_precision precision;    /* as resolved for the backend (never DEFAULT) */
    /* 1: an imported ONNX model that says nothing of how its input is made
     * from pixels (no input scale, mean or std given, no dsrt metadata, no
     * normalisation in its graph): it is given pixels scaled to [0, 1],
     * which is right only if that is what it was trained on (torchvision's
     * models want dsrt_onnx_preprocess_torchvision). 0 otherwise. */
    int input_assumed;
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
    /* The layers (indices) whose outputs it takes: the layer above it, or
     * what its inputs= names (add, concat: two or more); none for the input
     * layer. */
    int n_inputs;
    const int *inputs;
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

/*
 * Moves the net to device (DSRT_DEVICE_CPU or a CUDA device index), keeping
 * its weights and state: the backend of the other side is created and the
 * old one destroyed. Returns 0, DSRT_ENODEVICE when the device is not there
 * (the message says why), or another negative code; on failure the net is
 * where it was. An optimizer used with the net keeps its state.
 */
DSRT_API int dsrt_net_set_device(dsrt_net *net, int device);

/*
 * CPU compute threads: how many the backend spreads its work over (0: the
 * OpenMP default). A GPU backend launches work from the calling thread
 * alone and ignores the count.
 *
 * Signals: while the CPU backend computes on a thread, that thread holds
 * every asynchronous signal (faults excepted), and the OpenMP team working
 * for it holds them always: some of oneDNN's kernels move the stack pointer
 * into the heap, where a signal frame would corrupt memory. A signal to the
 * process reaches another thread at once; one sent to the computing thread
 * (pthread_kill, a profiler's per-thread timer) when its pass ends.
 */
DSRT_API void dsrt_net_set_threads(dsrt_net *net, int threads);
DSRT_API int dsrt_net_threads(const dsrt_net *net);

/*
 * Runs fn(ctx, member) once on each of the threads that compute for the net,
 * member from 0: on the CPU every thread of the OpenMP team of the calling
 * thread (as many as dsrt_net_threads), on a GPU the calling thread alone.
 * For binding them to cores: the team keeps its threads between calls.
 * Returns how many calls of fn returned non-zero (0: all succeeded).
 */
DSRT_API int dsrt_net_run_on_threads(dsrt_net *net, int (*fn)(void *ctx, int member), void *ctx);

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

/* The layout of a batch handed to a net. The values equal those of
 * dsrt_augment_layout, so a pipeline batch's layout can be passed on. */
typedef enum {
    DSRT_INPUT_F32_NCHW = 0, /* float (n, c, h, w), as the input layer normalises it */
    DSRT_INPUT_U8_NHWC,      /* uint8 (n, h, w, c): converted to (x - sub[c]) / div[c]
                              * first, exactly as the pipeline's float output is made */
} dsrt_input_layout;

/* A batch for the split training step (dsrt_net_stage, dsrt_net_train_start). */
typedef struct {
    const void *data;         /* n images of the net's input size, in host memory */
    dsrt_input_layout layout; /* DSRT_INPUT_F32_NCHW (0) or DSRT_INPUT_U8_NHWC */
    const int32_t *labels;    /* (n) in [0, classes) */
    int n;
    /* Images of the global batch this one is part of, for data-parallel
     * training: the loss gradient is averaged over global_n so that summing
     * the workers' gradients gives the global mean. 0: n. */
    int global_n;
    /* uint8 only, per channel (at most 4): the value the net sees is
     * (x - sub[c]) / div[c]; {0, 255} gives [0, 1]. div must be positive. */
    float sub[4], div[4];
    /* Soft targets (n, classes), or NULL: the loss is then the cross-entropy
     * against these rows (-sum_j t_j log p_j, as for mixup, cutmix or label
     * smoothing: a pipeline batch's soft_labels), labels still count the
     * correct ones. Rows should sum to 1; values must be finite and not
     * negative. Used only with labels. */
    const float *soft_labels;
} dsrt_net_batch;

/*
 * Starts moving batch b where the net computes. On a GPU the copy runs
 * asynchronously on a copy stream (into one of two device buffers, so it
 * overlaps the step in progress); b's memory may be reused once
 * dsrt_net_stage_wait() returns. On the CPU nothing is copied: the next
 * dsrt_net_train_start() with the same data reads it in place, and it must
 * stay until dsrt_net_train_finish().
 *
 * Returns 1 when the batch is being copied, 0 when it will be read in place,
 * or a negative code (a label out of range: DSRT_EOPTION).
 */
DSRT_API int dsrt_net_stage(dsrt_net *net, const dsrt_net_batch *b);

/* Waits until the memory of the last staged batch may be reused. */
DSRT_API int dsrt_net_stage_wait(dsrt_net *net);

/*
 * dsrt_net_forward_backward in two halves. train_start runs (on a GPU:
 * queues) forward and backward on b, which the caller may have staged with
 * dsrt_net_stage (then the staged copy is used and b's memory is not read
 * again: it may be reused once dsrt_net_stage_wait returns; else it is
 * staged now).
 * Gradient buckets are announced as backward produces them.
 * train_finish waits for the step and gives its loss and correct count
 * (either may be NULL), with forward_backward's return codes. Between the
 * two the caller may do host work, such as fetching and staging the next
 * batch.
 */
DSRT_API int dsrt_net_train_start(dsrt_net *net, const dsrt_net_batch *b);
DSRT_API int dsrt_net_train_finish(dsrt_net *net, float *loss, int *correct);

/* Waits until every piece of work queued for the net is done (on the CPU
 * there is none). For timing. */
DSRT_API int dsrt_net_sync(dsrt_net *net);

/* Seconds a GPU spent computing and waiting between steps since the net
 * was created or moved (idle: from the end of one training step's work to
 * the start of the next's, which is the time it waited for the host and its
 * data). Zero on the CPU. */
DSRT_API void dsrt_net_device_time(dsrt_net *net, double *busy_s, double *idle_s);

/*
 * Memory of the plan the last passes of batch size n (train 1: training,
 * 0: inference) ran: *held the bytes it keeps for the layers' outputs
 * (and, where it reuses them, the temporaries between layers), *each what
 * those would take each with bytes of its own. An inference plan of the
 * full fusion (fuse 2) reuses the bytes of an output once no later layer
 * reads it, on the CPU and on a GPU, so *held is a few layers' outputs; a
 * training plan keeps every output for backward (its gradients are pooled
 * the same way, and not counted here). The CPU runs an inference batch of a
 * net bound by memory (MobileNet, EfficientNet) in pieces that keep the
 * activations in the last-level cache: a piece's plan is the one told.
 * Returns 0, -ENOENT when no pass of that size ran (or its plan gave way to
 * others), or DSRT_EUNSUPPORTED when the backend does not say.
 */
DSRT_API int dsrt_net_activation_bytes(dsrt_net *net, int n, int train, size_t *held, size_t *each);

// ----------------------------------------------------------------------------
// Profile

/* One layer's share of a training step (dsrt_net_profile_read). */
typedef struct {
    const char *name, *type;        /* the layer's (owned by the net) */
    double forward_ms, backward_ms; /* mean a step; 0 for a ReLU the layer before computes */
    int relu_fused;                 /* 1: the layer computes the ReLU after it */
} dsrt_layer_profile;

/* Where the time of the timed training steps went. */
typedef struct {
    int64_t steps;        /* training steps timed (forward and backward) */
    int device_events;    /* 1: timed with device events (a GPU); 0: the host's clock */
    double step_ms;       /* mean span of a step: its first layer's start to its last one's end */
    double layers_ms;     /* mean sum of the layers' forward and backward times */
    double optimizer_ms;  /* mean optimizer step */
    double gaps_ms;       /* mean idle time between consecutive layers of a step: on a GPU the
                           * launch gaps, where the device waited for the host's next kernel */
    double gaps_per_step; /* intervals between consecutive layers, a step */
    int64_t graph_steps;  /* of the steps timed, those replayed from recorded CUDA graphs */
    int64_t captures;     /* steps recorded as CUDA graphs since the net was made */
    int graphs;           /* 1: the backend records steps as CUDA graphs */
    int fused_library;    /* layers fused by the vendor library (cuDNN: convolution + bias +
                           * ReLU, batchnorm + ReLU) */
    int fused_kernel;     /* layers whose bias and ReLU run in one dsrt kernel */
    const char *note;     /* what the backend says of how it runs (why CUDA graphs went off),
                           * "" when nothing; owned by the net */
} dsrt_net_profile;

/*
 * Starts timing every layer of each training step (forward, backward, the
 * optimizer), from zero: on a GPU with events on the device around each
 * layer (recorded into the CUDA graphs too), on the CPU with the clock.
 * Timing costs a little (a device event or a clock read a layer), so time
 * steps of their own. Returns 0 or -ENOMEM.
 */
DSRT_API int dsrt_net_profile_start(dsrt_net *net);

/* Stops timing; what was measured stays readable. */
DSRT_API void dsrt_net_profile_stop(dsrt_net *net);

/*
 * What the timed steps took: *p the step's totals, layers[i] (up to cap
 * entries, may be NULL) layer i's means, the input layer first (on a GPU
 * its forward is the input stage). Waits for the device's queued work.
 * Returns the number of layers, or a negative code (-ENOENT: never
 * started).
 */
DSRT_API int dsrt_net_profile_read(dsrt_net *net, dsrt_net_profile *p, dsrt_layer_profile *layers,
                                   int cap);

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
 * On a GPU the device's values are copied back first; NULL (with the
 * message) when that fails.
 */
DSRT_API float *dsrt_net_params(dsrt_net *net, size_t *count);
DSRT_API void dsrt_net_params_changed(dsrt_net *net);

/* The gradient buffer: same length and layout as the parameters (on a GPU a
 * copy of the device's, for reading). */
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

/*
 * dsrt_net_buckets with a first bucket of its own size: bucket 0 (the last
 * layers, which backward finishes first) holds at least first_bytes, every
 * later one at least min_bytes. A small first bucket starts communication
 * early; larger later ones keep the per-call overhead low (PyTorch DDP's
 * 1 MiB then 25 MiB). first_bytes == min_bytes is dsrt_net_buckets.
 */
DSRT_API int dsrt_net_buckets_sized(const dsrt_net *net, size_t first_bytes, size_t min_bytes,
                                    dsrt_range *out, int cap);

/* The gradient hook of a data-parallel trainer. */
typedef struct {
    size_t first_bytes, min_bytes; /* bucket sizes, as dsrt_net_buckets_sized */
    dsrt_grad_ready_fn ready;      /* bucket k is final (as dsrt_net_set_grad_ready) */
    /* Called with end 0 just before backward starts and with end 1 when it
     * has returned (on the CPU: done; on a GPU: queued), on the thread of
     * the training step. May be NULL. */
    void (*backward)(void *ctx, int end);
    void *ctx;
} dsrt_grad_hook;

/* Installs hook (copied), replacing dsrt_net_set_grad_ready's; NULL removes
 * it. Returns 0 or -ENOMEM. */
DSRT_API int dsrt_net_set_grad_hook(dsrt_net *net, const dsrt_grad_hook *hook);

/*
 * Synchronised batch normalisation. With a hook set, every batchnorm layer
 * in a training forward and backward hands its per-channel sums to fn,
 * which must replace them by their sums over every worker of the global
 * batch (an all-reduce) before returning; the layer then normalises with
 * the global mean and variance, and its backward uses the global means of
 * the gradient terms. The running statistics follow the global batch too.
 *
 * Forward sums (n = 2c + 1 doubles): sum of x per channel (c), sum of x^2
 * per channel (c), and the number of values per channel. Backward sums
 * (n = 2c): sum of dy per channel (c), sum of dy * xhat per channel (c),
 * with dy the gradient after the layer's fused ReLU, if any, and xhat the
 * normalised input.
 *
 * Where the sums live: the CPU backend passes host memory (device
 * DSRT_DEVICE_CPU, stream NULL). A device backend passes memory of its
 * CUDA device (device >= 0) with the stream the layer's work is queued on;
 * fn must queue its reduction on that stream (NCCL does) and may return
 * before it runs. fn returns 0 or a negative code, which fails the step.
 */
typedef struct {
    int layer;    /* the batchnorm layer, as dsrt_net_layer numbers it */
    int backward; /* 0: forward sums; 1: backward sums */
    int channels;
    double *sums; /* (n) see above */
    size_t n;
    int device;   /* DSRT_DEVICE_CPU: host memory; else that CUDA device's */
    void *stream; /* cudaStream_t on a device, NULL on the CPU */
} dsrt_bn_sums;

typedef int (*dsrt_bn_sync_fn)(void *ctx, dsrt_bn_sums *sums);

/* Sets (fn != NULL) or removes the synchronised batchnorm hook. Returns 0,
 * or DSRT_EUNSUPPORTED when the net's backend does not support it. */
DSRT_API int dsrt_net_set_bn_sync(dsrt_net *net, dsrt_bn_sync_fn fn, void *ctx);

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

/*
 * Copies the state of src (moments and the step count) into opt, which
 * must have the same solver and parameter count: resuming into an
 * optimizer made with new options. Returns 0 or DSRT_EOPTION.
 */
DSRT_API int dsrt_optimizer_copy_state(dsrt_optimizer *opt, dsrt_optimizer *src);

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
 * iteration counter is set from the position. A checkpoint of a
 * data-parallel run that holds one optimizer state a worker (see
 * dsrt_train_options.resume) gives the mean of those states.
 */
DSRT_API int dsrt_checkpoint_load(const char *path, dsrt_net **net, dsrt_optimizer **opt,
                                  dsrt_train_position *pos, const dsrt_net_options *options);

// ----------------------------------------------------------------------------
// ONNX

/* Channels that per-channel input statistics may be given for. */
#define DSRT_ONNX_CHANNELS_MAX 16

/*
 * How an imported model's input is made from pixels, and its class names.
 * dsrt hands a net's input layer pixels scaled to [0, 1] (x / 255 for x in
 * [0, 255]: the pipeline's, dstrain classify's and eval's batches); the
 * model expects (x * input_scale - mean[c]) / std[c]. The import writes that
 * into the input layer as its z-score (with mean and std scaled by 255 *
 * input_scale), so the imported net gives the model's answer on raw images.
 * torchvision's models: input_scale 1/255, mean 0.485, 0.456, 0.406, std
 * 0.229, 0.224, 0.225 (dsrt_onnx_preprocess_torchvision). A normalisation
 * the graph itself applies to its input before any layer (Add, Sub, Mul and
 * Div of constants, one value or one a channel, as dsrt_onnx_export writes
 * it) is composed into the same z-score.
 */
typedef struct {
    double input_scale; /* 0 (default): the model's metadata_props "dsrt.input_scale" (1 for a
                         * model dsrt exported: it takes pixels as they are), else 1/255 */
    int n_mean, n_std;  /* 0: none (mean 0, std 1), 1: every channel, or one a channel */
    float mean[DSRT_ONNX_CHANNELS_MAX], std[DSRT_ONNX_CHANNELS_MAX];
    /* The classes' names in class order (n_class_names of them, which must
     * be the model's class count), or NULL: the model's own, from its
     * metadata_props entry "classes" (one name a line), when it has one. */
    const char *const *class_names;
    int n_class_names;
    /* The input's height and width where the model leaves them symbolic
     * (0: such a model is refused). */
    int height, width;
} dsrt_onnx_import_options;

/* The defaults: no normalisation beyond [0, 1], the model's class names. */
DSRT_API dsrt_onnx_import_options dsrt_onnx_import_defaults(void);

/* Sets o's input scale, mean and std to torchvision's ImageNet ones. */
DSRT_API void dsrt_onnx_preprocess_torchvision(dsrt_onnx_import_options *o);

/*
 * Imports an ONNX model (opsets 7 to 21) as a new network: its graph becomes
 * a dsrt description (layer names from the nodes', made unique; inputs= where
 * the graph branches), built for the model's input size, and its tensors are
 * copied into the net's parameter buffer and running statistics. The file
 * is mapped, not read into memory; float32, float16 and bfloat16 tensors are
 * read from raw_data, typed fields or external data files beside the model
 * (a location that is absolute or holds ".." is refused).
 *
 * Operators: Conv, Gemm, MatMul (with the Add of its bias), Relu, LeakyRelu,
 * MaxPool, AveragePool, GlobalAveragePool, BatchNormalization (inference
 * form), LRN, Dropout, Flatten, Reshape to 2-D, Softmax, Add, Concat,
 * Identity and Constant, and Sub, Mul and Div of constants as the input
 * normalisation. A model with any other operator, or an attribute
 * or shape that dsrt's layers cannot reproduce exactly, is refused before
 * any weight is read, with DSRT_EUNSUPPORTED and a message naming the node,
 * its operator and the opset; a damaged file with DSRT_ECORRUPT or
 * DSRT_ETRUNCATED and where it is. A model that ends in logits gets dsrt's
 * softmax (the classification output) appended.
 *
 * o: NULL for the defaults. options: as for dsrt_net_create (NULL:
 * defaults). Returns 0 and sets *net, or a negative code with
 * dsrt_last_error() saying why.
 */
DSRT_API int dsrt_onnx_import(dsrt_net **net, const char *path, const dsrt_onnx_import_options *o,
                              const dsrt_net_options *options);

/* What dsrt_onnx_export writes. */
typedef struct {
    int opset;          /* the default domain's opset, 7 to 21; default 13 */
    double input_scale; /* what the net's input layer was given per pixel value: 1/255 (default)
                         * for dsrt's [0, 1] batches */
} dsrt_onnx_export_options;

DSRT_API dsrt_onnx_export_options dsrt_onnx_export_defaults(void);

/*
 * Writes net as an ONNX model to path (atomically: the file is complete or
 * absent): its inference graph (batch normalisation in inference form with
 * the running statistics, dropout removed, the softmax output as
 * "probabilities"), the input normalisation as the first nodes, so that the
 * model takes raw pixels ("pixels": float32, NCHW, values 0 to 255, the
 * net's channels, any batch size), and the class names in metadata_props
 * ("classes", one a line; "dsrt.input_scale" says it takes pixels as they
 * are). The weights are written as float32 raw_data, so
 * dsrt_onnx_import gives them back bit for bit. o: NULL for the defaults.
 * Returns 0 or a negative code.
 */
DSRT_API int dsrt_onnx_export(dsrt_net *net, const char *path, const dsrt_onnx_export_options *o);

#ifdef __cplusplus
}
#endif
#endif
