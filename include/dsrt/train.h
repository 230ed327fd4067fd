/*
 * dsrt train: the training loop, evaluation, transfer learning, and the
 * records a person reads (a history that draws itself as an SVG plot).
 *
 * dsrt_train() is MATLAB's trainNetwork(imds, layers, trainingOptions(...))
 * for a dsrt_net and a datastore: a pipeline (<dsrt/pipeline.h>) makes the
 * batches in the background on its own pinned cores while the calling
 * thread, with its team of compute threads pinned to the other cores, runs
 * forward, backward and the optimizer step. The split of the cores is an
 * option (MATLAB's WorkerLoad) with an automatic default (see
 * dsrt_train_options.workers).
 *
 *   dsrt_train_options o = dsrt_train_defaults();
 *   o.max_epochs = 3;
 *   o.validation = val_ds;
 *   o.callback = print_progress;     // the library prints nothing
 *   dsrt_train_result r;
 *   if (dsrt_train(net, train_ds, &o, &r) != 0) ... dsrt_last_error() ...
 *
 * Determinism. Every random choice of a run is keyed by (seed, epoch, sample
 * id) or (seed, iteration): the order of each epoch, each sample's
 * augmentation, dropout masks. So a run resumed from a checkpoint, even in
 * the middle of an epoch, ends with the same weights, bit for bit, as the run
 * that was never interrupted (on the same machine with the same number of
 * compute threads: the backend's sums are ordered by its thread count).
 *
 * Checkpoints. With checkpoint_path set, the loop writes
 * checkpoint_path/dsrt_ckpt_e<epoch>_i<iteration>.dsrt (dsrt_checkpoint_save:
 * temporary file, fsync, rename, so a file with that name is always complete)
 * and next to it a small text file with the state of the loop itself
 * (<same name>.state: validation patience, best validation loss, batch size)
 * written the same way before it. A run stopped by a non-finite loss or
 * killed at any moment leaves every checkpoint it finished loadable.
 *
 * Data parallel (MATLAB's ExecutionEnvironment 'parallel' and 'multi-gpu',
 * PyTorch's DistributedDataParallel, DL4J's ParallelWrapper). Workers are
 * the processes of an MPI job (DSRT_EXEC_PARALLEL: each calls dsrt_train
 * with its communicator) or the GPUs of this process (DSRT_EXEC_MULTI_GPU:
 * one thread each). `batch` is the global mini-batch: every worker walks the
 * same epoch orders and trains on its share of each batch (pipeline parts),
 * so a run depends on the number of workers only through floating-point
 * rounding, and checkpoints, which hold the global position, resume with
 * any number. Gradients are summed over the workers in buckets while
 * backward runs (dsrt_comm_attach), or, with averaging_frequency N, each
 * worker steps on its own gradient and the parameters are averaged every N
 * iterations. Losses, accuracies, validation figures, stops (a non-finite
 * loss, patience, a callback asking on any worker) and failures are agreed
 * over the workers after each step, so every worker stops at the same
 * iteration; only worker 0 writes checkpoints. Each process's callback sees
 * the same figures (event rank and world say which worker it is); with
 * multi-gpu only the calling thread's worker calls it.
 *
 * Threads: dsrt_train and dsrt_evaluate run on the calling thread and
 * create their own threads, which are gone when they return; the callback
 * runs on the calling thread. The net, the datastores and the options belong
 * to the call while it runs. The other functions are thread-safe on distinct
 * objects.
 */
#ifndef DSRT_TRAIN_H
#define DSRT_TRAIN_H

#include <dsrt/comm.h>
#include <dsrt/nn.h>
#include <dsrt/pipeline.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Options

/* Where the arithmetic runs (MATLAB ExecutionEnvironment). dsrt_train moves
 * the net there (dsrt_net_set_device) and leaves it there. */
typedef enum {
    DSRT_EXEC_AUTO = 0, /* a GPU when one is usable (dsrt_gpu_count), else the CPU */
    DSRT_EXEC_CPU,
    DSRT_EXEC_GPU, /* the GPU `gpu`; refused with DSRT_ENODEVICE when it is not there */
    DSRT_EXEC_MULTI_GPU,
    DSRT_EXEC_PARALLEL,
} dsrt_execution;

/* Which weights dsrt_train leaves in the net (MATLAB OutputNetwork). */
typedef enum {
    DSRT_OUTPUT_LAST = 0,        /* those of the last iteration */
    DSRT_OUTPUT_BEST_VALIDATION, /* those with the lowest validation loss */
} dsrt_output_network;

/* Batchnorm statistics with several workers. */
typedef enum {
    /* Each worker normalises with its own share's statistics; the running
     * statistics are averaged over the workers before each validation and
     * checkpoint and at the end (MATLAB's aggregation of state). */
    DSRT_BN_AVERAGE = 0,
    /* Batch statistics over the global batch (per-channel sums summed over
     * the workers in forward and backward: dsrt_comm_sync_batchnorm). */
    DSRT_BN_SYNC,
} dsrt_bn_statistics;

/* The unit of checkpoint_frequency (MATLAB CheckpointFrequencyUnit). */
typedef enum {
    DSRT_UNIT_EPOCH = 0,
    DSRT_UNIT_ITERATION,
} dsrt_frequency_unit;

typedef struct dsrt_train_event dsrt_train_event;

/* Called by dsrt_train on its calling thread at each event (see
 * dsrt_train_event). Return 0 to go on, anything else to stop training
 * after this event (MATLAB's OutputFcn returning true): dsrt_train then
 * finishes as if the last epoch had ended, and returns 0. */
typedef int (*dsrt_train_callback)(void *ctx, const dsrt_train_event *e);

typedef struct {
    int max_epochs; /* MaxEpochs: default 30 */
    int batch;      /* MiniBatchSize: default 128 */
    /* Shuffle: DSRT_SHUFFLE_EVERY_EPOCH (default), _ONCE, _NEVER. */
    dsrt_shuffle shuffle;
    /* 1: drop each epoch's last, partial batch (MATLAB does); 0 (default):
     * train on it too (PyTorch's DataLoader does). */
    int drop_last;
    /* Solver, InitialLearnRate, LearnRateSchedule, LearnRateDropFactor,
     * LearnRateDropPeriod, Momentum, L2Regularization, GradientThreshold and
     * GradientThresholdMethod: dsrt_optimizer_defaults(DSRT_SOLVER_SGDM). */
    dsrt_optimizer_options optimizer;

    /* ValidationData: NULL (default) for none. Its classes are matched to
     * the net's (or the training data's) by name, so it may hold fewer. */
    const dsrt_datastore *validation;
    /* ValidationFrequency, in iterations; 0 (default): at the end of each
     * epoch. A validation also follows the last iteration. MATLAB's default
     * is 50 iterations: on a CPU a validation pass costs as much as a tenth
     * of an epoch of training for Fashion-MNIST, so dsrt validates per epoch. */
    int validation_frequency;
    /* ValidationPatience: stop when the validation loss has been larger
     * than or equal to the smallest so far this many times in a row; 0
     * (default): never (MATLAB's Inf). */
    int validation_patience;
    /* Images a validation batch; 0 (default): batch. */
    int validation_batch;
    /* VerboseFrequency: iterations between the events that carry verbose = 1
     * (the lines a tool prints); default 50. */
    int verbose_frequency;
    dsrt_output_network output_network; /* OutputNetwork: default DSRT_OUTPUT_LAST */

    /* CheckpointPath: a folder (created if missing, one level), or NULL
     * (default): no checkpoints. */
    const char *checkpoint_path;
    int checkpoint_frequency;            /* CheckpointFrequency: default 1 */
    dsrt_frequency_unit checkpoint_unit; /* CheckpointFrequencyUnit: default epoch */
    /* A checkpoint file to continue from, or a folder: its latest
     * dsrt_ckpt_*.dsrt. The net given to dsrt_train must have the same
     * description (its weights are replaced by the checkpoint's); the
     * optimizer's state, the position (epoch, iteration, batch within the
     * epoch) and the seed come from the checkpoint, the other options from
     * here. NULL (default): start from the net as it is, at epoch 0.
     * A checkpoint of a data-parallel run whose workers each kept their own
     * optimizer state (averaging_frequency without average_optimizer_state)
     * holds every worker's: resumed the same way by as many workers, each
     * takes its own and the run goes on bit for bit as if never stopped;
     * resumed any other way (another worker count, gradients summed, the
     * state averaged), every worker starts from the mean of those states,
     * as average_optimizer_state would have made it (result.resume_states
     * says how many there were). */
    const char *resume;

    dsrt_execution execution; /* ExecutionEnvironment: default DSRT_EXEC_AUTO */
    /* CUDA device for auto and gpu; -1 (default): the first. parallel: this
     * worker's GPU, or -1 (default) for the CPU. */
    int gpu;

    /* Data parallel (see the top of this header). */
    /* parallel: the communicator of this worker (dsrt_comm_open in every
     * process of the MPI job; its kind matches where the net computes).
     * Required for DSRT_EXEC_PARALLEL, ignored otherwise. */
    dsrt_comm *comm;
    /* multi-gpu: the GPUs used, the first `gpus` devices; 0 (default): every
     * visible one. */
    int gpus;
    /* multi-gpu: the communicators' bucket sizes and timeout (default
     * dsrt_comm_defaults()); parallel takes them from comm. */
    dsrt_comm_options comm_options;
    /* 0 (default): gradients summed over the workers at every step. N >= 1:
     * parameter averaging (DL4J): each worker steps on its own share's
     * gradient and the parameters are replaced by their mean every N
     * iterations (and before each validation, checkpoint and the end). */
    int averaging_frequency;
    /* With averaging_frequency: 1 averages the optimizer state (momentum,
     * moments) too; 0 (default) leaves each worker its own. */
    int average_optimizer_state;
    dsrt_bn_statistics bn_statistics; /* default DSRT_BN_AVERAGE */
    /* How training batches travel to the net: -1 (default): as uint8 NHWC
     * when the net is on a GPU (a quarter of the bytes over PCIe, made into
     * floats there exactly as the pipeline makes them from the same pixels;
     * resampled pixels are rounded to 8 bits first), as floats on the CPU;
     * 0: always floats; 1: uint8 on the CPU too. */
    int uint8_batches;

    /* How each training sample is made (imageDataAugmenter and
     * augmentedImageDatastore): output_height, output_width and
     * output_channels 0 (the default) take the net's input size; the
     * defaults are otherwise dsrt_augment_defaults(): no random transform,
     * float NCHW rescaled to [0, 1]. Validation samples get the same
     * options without the random transforms (random crops become centre
     * crops, a random-resized crop the centre crop of a resize to 256/224 of
     * the output, as torchvision's ImageNet evaluation; no colour jitter,
     * grayscale or erasing). */
    dsrt_augment_options augment;
    /* Keys the epoch orders and every random augmentation (the weights'
     * initialisation and dropout are keyed by the net's own seed).
     * Default 0. */
    uint64_t seed;

    /*
     * Cores. The cores (cpus, as dsrt_pipeline_options.cpus; NULL: every core
     * this process may run on) are split between the pipeline's workers and
     * the compute threads, each pinned to its core when pin is 1 (default).
     * workers and compute_threads 0 (default) choose automatically: the
     * pipeline's share of the work is estimated from the sample size and the
     * net's arithmetic (about 5 us + 20 ns per output value to load a sample,
     * against the net's train_flops at 20 GFLOP/s per core), which gives
     * L = cores x share cores of loading; workers = ceil(L) (at least 1) get
     * the last cores, and the compute threads every core but the floor(L)
     * that loading fills: the partly used core is shared, the workers
     * sleeping whenever the prefetched batches are ready. For digits on
     * Fashion-MNIST L is about 0.03 cores on 2 cores: one worker and every core
     * computing. Given values are used as they are (workers + compute
     * threads may exceed the cores: then they share).
     */
    unsigned workers;
    int compute_threads;
    const char *cpus;
    int pin;
    unsigned prefetch; /* batches made ahead (dsrt_pipeline_options.prefetch); default 4 */
    /* Reads in flight per pipeline worker (dsrt_reader_options.depth), 1 to
     * 4096; 0 (default): the reader's default, 16. */
    unsigned read_depth;
    /* Requests to an object store (s3://, https:// data): fields left 0
     * take the reader's defaults (dsrt_reader_defaults().remote). */
    dsrt_remote_options remote;
    /* 1: the first sample that cannot be read or decoded fails the run;
     * 0 (default): it is skipped and counted in the result. */
    int fail_on_error;

    dsrt_train_callback callback; /* NULL (default): none */
    void *callback_ctx;

    /*
     * Batch mixing and label smoothing of the training batches, as
     * dsrt_pipeline_options' fields of the same names say (timm's Mixup,
     * mode 'batch'): mixup_alpha, cutmix_alpha, cutmix_minmax 0 (default):
     * none; mix_prob default 1, mix_switch_prob default 0.5; label_smoothing
     * in [0, 1), default 0, with or without mixing. With any of them the
     * loss is the cross-entropy against the soft labels (validation keeps
     * the hard ones), on the CPU and on a GPU. Mixing makes the batches
     * travel as floats.
     */
    double mixup_alpha, cutmix_alpha, cutmix_minmax[2], mix_prob, mix_switch_prob;
    double label_smoothing;

    /*
     * Sampling of the training data, as dsrt_pipeline_options' fields of the
     * same names say: over a mix (dsrt_datastore_mix) each epoch draws from
     * its sources in proportion to their weights; sample_weights NULL
     * (default), "class-balanced" or the path of a weights file draws each
     * sample with replacement in proportion to its weight. epoch_samples:
     * the samples of an epoch when sampling; 0 (default): the training
     * data's count. Validation walks its data once, as always.
     */
    const char *sample_weights;
    size_t epoch_samples;
} dsrt_train_options;

/* The defaults described above. */
DSRT_API dsrt_train_options dsrt_train_defaults(void);

/*
 * Checks every option against the net and the training data without doing
 * any work (no file is written, no thread started): returns 0, or
 * DSRT_EOPTION with dsrt_last_error() naming the option and its value
 * ("train: batch: 0: must be at least 1"), or DSRT_EUNSUPPORTED for an
 * execution environment this build lacks. dsrt_train calls it first.
 */
DSRT_API int dsrt_train_check(const dsrt_train_options *o, const dsrt_net *net,
                              const dsrt_datastore *train);

// ----------------------------------------------------------------------------
// Events

typedef enum {
    DSRT_EVENT_START = 0,  /* once, before the first iteration */
    DSRT_EVENT_ITERATION,  /* after each optimizer step */
    DSRT_EVENT_VALIDATION, /* after each validation pass */
    DSRT_EVENT_EPOCH,      /* after the last iteration of each epoch */
    DSRT_EVENT_CHECKPOINT, /* after a checkpoint is written */
    DSRT_EVENT_END,        /* once, after the last (also after a failure) */
    /* A sample found bad (once each, training or validation data), before
     * the next other event: bad_sample and validation say which. */
    DSRT_EVENT_BAD_SAMPLE,
} dsrt_train_event_kind;

/* What the loop reports. Fields that do not apply to an event are 0, or
 * NaN for the floating-point measures. */
struct dsrt_train_event {
    dsrt_train_event_kind kind;
    int64_t epoch; /* 1-based: the epoch in progress (or just ended) */
    int64_t max_epochs;
    int64_t iteration; /* iterations completed, over the whole run (resumes included) */
    int64_t iterations_per_epoch;
    int64_t max_iterations;
    int64_t batch_in_epoch;        /* iterations completed in this epoch */
    double elapsed_s;              /* since this call started */
    double learn_rate;             /* base learning rate of the epoch */
    double loss, accuracy;         /* ITERATION: the mini-batch's loss and accuracy (0..1) */
    double val_loss, val_accuracy; /* VALIDATION (and END when validated): the last pass */
    double images_per_s;           /* images trained per second by this call so far, loading
                                      included, validation excluded */
    uint64_t images;               /* images trained by this call (over every worker) */
    int verbose;                   /* ITERATION: 1 on the first, every verbose_frequency-th and
                                      the last iteration */
    const char *checkpoint;        /* CHECKPOINT: the file written */
    int status;                    /* END: what dsrt_train returns */
    unsigned workers;              /* pipeline workers (every event) */
    int compute_threads;           /* compute threads (every event) */
    int pinned;                    /* 1: the compute threads are bound to their cores */
    /* BAD_SAMPLE: the sample, its path and reason (valid during the call). */
    const dsrt_bad_sample *bad_sample;
    int validation;  /* BAD_SAMPLE: 1 when it is a sample of the validation data */
    int bad_worker;  /* BAD_SAMPLE: the worker that found it (every worker hears of every
                        worker's bad samples, each once) */
    int rank, world; /* this worker and the number of workers (1 without data parallel) */
    /* ITERATION: the datastore ids (dsrt_datastore_id) of the samples this
     * worker trained on in the step, in batch order, ids_count of them
     * (valid during the call); NULL and 0 for other events. */
    const uint32_t *ids;
    size_t ids_count;
};

// ----------------------------------------------------------------------------
// Training

/* Why a run ended. */
typedef enum {
    DSRT_STOP_MAX_EPOCHS = 0, /* every epoch done */
    DSRT_STOP_PATIENCE,       /* validation_patience reached */
    DSRT_STOP_CALLBACK,       /* the callback asked */
    DSRT_STOP_ERROR,          /* a failure: see the return value */
} dsrt_stop_reason;

typedef struct {
    dsrt_stop_reason stop;
    int64_t epochs;                /* epochs completed, over the whole run */
    int64_t iterations;            /* iterations completed, over the whole run */
    int64_t start_iteration;       /* where this call began (0, or the checkpoint's) */
    uint64_t images;               /* images trained by this call (over every worker) */
    double train_s;                /* seconds of training: the loop, loading and checkpoints
                                      included, validation excluded */
    double val_s;                  /* seconds of validation */
    double checkpoint_s;           /* seconds writing checkpoints (part of train_s) */
    double images_per_s;           /* images / train_s */
    double loss, accuracy;         /* the last mini-batch's */
    double val_loss, val_accuracy; /* the last validation's in this call, NaN when none ran
                                      (a resumed run reports none of the checkpoint's) */
    double best_val_loss;          /* the lowest validation loss (the checkpoint's included),
                                      NaN when none ran */
    int64_t best_iteration;        /* where it was reached */
    double consumer_wait_s;        /* seconds the compute waited for a batch (data-bound time) */
    int device;                    /* where the net trained: DSRT_DEVICE_CPU or the CUDA device */
    double device_busy_s;          /* GPU: seconds of device work (CUDA events) */
    double device_idle_s;          /* GPU: seconds the device sat idle between steps, waiting
                                      for the host and its data */
    uint64_t skipped;              /* times a bad training sample was passed over, by every
                                      worker together */
    uint64_t bad_samples;          /* distinct training samples found bad by any worker, each
                                      once (its BAD_SAMPLE event) */
    /* Validation: distinct samples found bad, and the samples left out of
     * the passes, summed (a pass visits each readable sample exactly once). */
    uint64_t val_bad_samples, val_skipped;
    /* Training data in a store: requests to it and bytes from it; with a
     * cache (remote.cache_dir), requests answered from it and their bytes,
     * requests that went to the store for want of an entry, entries
     * removed to make room (dsrt_pipeline_statistics's, of this worker). */
    uint64_t remote_requests, remote_bytes;
    uint64_t cache_hits, cache_bytes, cache_misses, cache_evictions;
    unsigned workers;          /* pipeline workers used */
    int compute_threads;       /* compute threads used */
    int pinned;                /* 1: the compute threads were bound to their cores */
    uint64_t seed;             /* the run's seed (the checkpoint's when resuming) */
    uint64_t weights_checksum; /* dsrt_weights_checksum of the net returned */
    int rank, world;           /* this worker and the number of workers */
    char checkpoint[4096];     /* the last checkpoint written or resumed from, or "" */
    /* Resumed: the optimizer states the checkpoint held, 1 for every worker
     * alike, or one a worker of the run that wrote it (see resume); 0 when
     * the run did not resume. */
    int resume_states;
    /* Resumed: the data-parallel workers of the run that wrote the
     * checkpoint (0 when the run did not resume, or the checkpoint does not
     * say). Another number than world is an elastic resume: the rest of the
     * interrupted epoch is the batches that run would have made, each split
     * over this run's workers, so every sample of the epoch is trained on
     * exactly once over both runs (dsrt_pipeline_resume). */
    int resume_workers;
} dsrt_train_result;

/*
 * Trains net on the samples of train (labels in [0, classes of the net)) as
 * o says (NULL: the defaults). Checks every option first (dsrt_train_check).
 * Fills *r (may be NULL) also on failure, as far as the run went.
 *
 * Returns 0 when training ended normally (every epoch, patience, or the
 * callback), DSRT_ENAN when a loss or the weights became non-finite (the
 * message names the iteration and the last checkpoint, which like every
 * checkpoint already written stays as it was: no checkpoint is written with
 * non-finite weights; the net keeps the weights of the failing step), or the
 * code of another failure (options, files, the pipeline, the backend).
 */
DSRT_API int dsrt_train(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *o,
                        dsrt_train_result *r);

/*
 * FNV-1a (64-bit) of the net's flat parameter buffer as bytes: two nets
 * have the same checksum when their weights are bit-identical.
 */
DSRT_API uint64_t dsrt_weights_checksum(dsrt_net *net);

/*
 * The latest checkpoint in folder dir (the dsrt_ckpt_*.dsrt with the most
 * iterations) into path (size bytes). Returns 0, -ENOENT when there is none,
 * or another negative code.
 */
DSRT_API int dsrt_checkpoint_latest(const char *dir, char *path, size_t size);

/*
 * The newest complete checkpoint in folder dir, for a job that is started
 * again with the same command line (a requeued batch job): the
 * dsrt_ckpt_*.dsrt files from the most iterations down, the first that
 * loads whole (dsrt_checkpoint_load: format and checksums checked) into path
 * (size bytes). Each newer one that does not load (truncated, corrupt, not
 * readable) is passed over and named, "PATH: reason" a line, in skipped
 * (skipped_size bytes, cut if longer; may be NULL). Returns 0, -ENOENT when
 * the folder holds no complete checkpoint or does not exist, or another
 * negative code (the folder cannot be read, out of memory).
 */
DSRT_API int dsrt_checkpoint_latest_complete(const char *dir, char *path, size_t size,
                                             char *skipped, size_t skipped_size);

// ----------------------------------------------------------------------------
// Launching a job: what a training program decides before dsrt_train
//
// dstrain train calls these in this order; a C program that does the same
// runs a job as dstrain runs it: refused when started wrongly, on the
// communicator and device dstrain would pick, resuming the checkpoint
// dstrain would resume.

/*
 * This process's place among its launcher's processes on its node: the
 * first of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH's
 * Hydra) and SLURM_LOCALID (Slurm) that the environment sets, or 0 when none
 * is. A data-parallel worker on a machine with GPUs computes on GPU (local
 * rank modulo the GPU count). Thread-safe as getenv is.
 */
DSRT_API int dsrt_train_local_rank(void);

/*
 * Refuses, before any work, a process that an MPI launcher started as one
 * of several (OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1: Open MPI and MPICH's
 * Hydra set them, MPI library or not) while o (NULL: the defaults) does not
 * train data-parallel (execution DSRT_EXEC_PARALLEL): each process would
 * train the whole job alone into the same outputs. Returns 0, or
 * DSRT_EOPTION with a message naming the variable.
 */
DSRT_API int dsrt_train_check_launch(const dsrt_train_options *o);

/*
 * For o->execution DSRT_EXEC_PARALLEL (else *comm = NULL, nothing done):
 * starts MPI (dsrt_comm_init) and opens this worker's communicator with
 * o->comm_options: NCCL on GPU dsrt_train_local_rank() modulo
 * dsrt_gpu_count() when this machine has a GPU and the NCCL module loads,
 * else MPI with the worker on the CPU. Sets o->comm to it and o->gpu to the
 * worker's GPU or -1; the caller builds its net on that device
 * (dsrt_net_options.device: o->gpu, DSRT_DEVICE_CPU for -1). The caller
 * owns *comm: dsrt_comm_close after the run (before destroying the net),
 * then dsrt_comm_finalize. Returns 0, or a negative code with a message
 * (then MPI is finalised again and *comm is NULL). Main thread only.
 */
DSRT_API int dsrt_train_comm_open(dsrt_train_options *o, dsrt_comm **comm);

/*
 * resume "auto" (a job started again with the same command line, such as a
 * requeued batch job): worker 0 of comm (NULL: this process alone) picks the
 * newest complete checkpoint of folder dir (dsrt_checkpoint_latest_complete)
 * and tells the other workers in one broadcast, so that every worker
 * resumes the same checkpoint even where their views of the folder differ.
 * path (size bytes) gets it, or "" when there is none: start afresh. On
 * worker 0, skipped (skipped_size bytes; may be NULL) gets the newer
 * checkpoints passed over, "PATH: reason" a line; "" elsewhere. Every
 * worker of comm must call it. Returns 0, or a negative code with a message
 * on every worker (worker 0's, when the folder cannot be read).
 */
DSRT_API int dsrt_train_resume_auto(dsrt_comm *comm, const char *dir, char *path, size_t size,
                                    char *skipped, size_t skipped_size);

/*
 * The workers' agreement on who failed or was stopped: every worker of comm
 * gives value (a failure as 1, a signal's number, 0 for none) and gets in
 * *worker the lowest rank that gave one other than 0, and its value in
 * *first_value; -1 and 0 when every worker gave 0. comm NULL: this process
 * alone (*worker 0 or -1). Every worker of comm must call it. Returns 0, or
 * a negative code with a message when the workers cannot communicate (then
 * *worker and *first_value describe this worker alone: its rank or -1).
 */
DSRT_API int dsrt_train_first_worker(dsrt_comm *comm, int value, int *worker, int *first_value);

// ----------------------------------------------------------------------------
// Evaluation

typedef struct {
    int batch;                  /* images a batch; default 128 */
    unsigned workers;           /* 0 (default): as dsrt_train chooses */
    int compute_threads;        /* 0 (default): as dsrt_train chooses */
    const char *cpus;           /* NULL (default): every core */
    int pin;                    /* default 1 */
    int fail_on_error;          /* default 0 */
    unsigned read_depth;        /* reads in flight per worker; 0 (default): 16 */
    dsrt_remote_options remote; /* 0 fields: the reader's defaults */
    /* Output size 0 (default): the net's input; random options are ignored. */
    dsrt_augment_options augment;
} dsrt_eval_options;

DSRT_API dsrt_eval_options dsrt_eval_defaults(void);

typedef struct {
    uint64_t images, correct; /* correct: the likeliest class is the true one */
    /* Images whose scores were not all finite (NaN or infinite: a model with
     * broken weights): counted in images, not correct, in no confusion cell;
     * the loss is then NaN. */
    uint64_t not_finite;
    double accuracy; /* correct / images */
    double loss;     /* mean cross-entropy */
    int classes;     /* the net's */
    /* (classes, classes): confusion[t * classes + p] counts the images of
     * true class t predicted as p. Owned by the result:
     * dsrt_eval_result_free. */
    uint64_t *confusion;
    double seconds, images_per_s;
    uint64_t skipped; /* bad samples passed over: each once */
    /* (bad_samples) the samples that could not be read or decoded, with their
     * paths and reasons, in the order found. Owned by the result (strings
     * included): dsrt_eval_result_free. */
    dsrt_bad_sample *bad;
    uint64_t bad_samples;
} dsrt_eval_result;

/*
 * Runs the net in inference mode over every sample of ds and fills *r: each
 * readable sample exactly once (images counts them); a bad sample is left
 * out, counted and listed in r->bad. The data's classes are
 * matched to the net's by name when the net's description names them
 * (dsrt_net_class_name), else by index; a data class the net does not know
 * fails with DSRT_EOPTION. Returns 0 or a negative code.
 */
DSRT_API int dsrt_evaluate(dsrt_net *net, const dsrt_datastore *ds, const dsrt_eval_options *o,
                           dsrt_eval_result *r);

/* Frees what dsrt_evaluate allocated in r. A zeroed r is accepted. */
DSRT_API void dsrt_eval_result_free(dsrt_eval_result *r);

/*
 * The automatic split of the cores dsrt_train and dsrt_evaluate make when
 * workers and compute_threads are 0 (see dsrt_train_options): for the net
 * ni describes on cpus (NULL: every core this process may run on), the
 * loading workers and the compute threads. A program that loads its own
 * way (dstrain classify: one decoding thread) takes the compute threads.
 * Returns 0, or a negative code for a bad cpus list.
 */
DSRT_API int dsrt_cores_split(const dsrt_net_info *ni, const char *cpus, unsigned *workers,
                              int *compute_threads);

// ----------------------------------------------------------------------------
// Class names and transfer learning

/*
 * Returns a new description (malloc'd, the caller frees it): spec (the name
 * of a built-in network or a description text) with one comment line
 * "# dsrt-class: NAME" per class appended, in class order, after removing any
 * such lines it had. Model files keep the description, so a saved model
 * knows its class names. names[i] must not hold a newline. Returns NULL with
 * the thread's message set on failure (unknown built-in name, bad name, no
 * memory).
 */
DSRT_API char *dsrt_describe_classes(const char *spec, const char *const *names, size_t n);

/* The same with the class names of a datastore. */
DSRT_API char *dsrt_describe_datastore_classes(const char *spec, const dsrt_datastore *ds);

/*
 * Reads a list of class names, one a line, as a labels file holds them
 * (text of len bytes, not necessarily NUL-terminated; line ends LF or CRLF;
 * blank lines at the end ignored). Each name is checked: 1 to 255 bytes of
 * UTF-8 without NUL or other control characters (a tab is kept). On success
 * *names holds *count names (free with dsrt_class_names_free) and 0 is
 * returned; otherwise DSRT_EFORMAT with a message naming the line
 * ("class names: line 3: a control character (U+0001) at byte 5"), or
 * -ENOMEM. Thread-safe.
 */
DSRT_API int dsrt_class_names_parse(const char *text, size_t len, char ***names, int *count);

/* Frees what dsrt_class_names_parse gave. NULL is accepted. */
DSRT_API void dsrt_class_names_free(char **names);

/*
 * Copies the name of class c, as the net's description names it, into buf
 * (size bytes, truncated and NUL-terminated). Returns the name's length,
 * -ENOENT when the description names no classes (or not class c), or
 * -EINVAL.
 */
DSRT_API int dsrt_net_class_name(const dsrt_net *net, int c, char *buf, size_t size);

typedef struct {
    int classes; /* the new class count (required, >= 1) */
    /* Class names for the new classes (classes of them), or NULL. */
    const char *const *class_names;
    /* Learn-rate factors of the new fully connected layer's weights and
     * bias: default 20 and 20 (MATLAB's transfer-learning example). */
    float new_weight_lr, new_bias_lr;
    /* Multiplies the learn-rate factors of every layer kept from the base
     * net: 1 (default) trains them as the new one, 0.1 slows them, 0 freezes
     * them (their weights and biases never change). */
    float base_lr_factor;
    /* Name of the layer to replace; NULL (default): the last "fc". */
    const char *layer;
} dsrt_transfer_options;

DSRT_API dsrt_transfer_options dsrt_transfer_defaults(void);

/*
 * Makes *out from base for a new task: the fully connected layer before the
 * classification output is replaced by a new one with `classes` outputs and
 * the given learn-rate factors, initialised from options->seed (net options,
 * NULL: defaults), the classification layer follows the new class count, and
 * every other layer keeps base's weights and state, its learn-rate factors
 * multiplied by base_lr_factor. base is not changed. Returns 0 or a negative
 * code (DSRT_EOPTION when base has no such layer).
 */
DSRT_API int dsrt_net_transfer(dsrt_net **out, const dsrt_net *base, const dsrt_transfer_options *o,
                               const dsrt_net_options *options);

// ----------------------------------------------------------------------------
// History and plot

/* The events of a run, kept for the training-progress plot. */
typedef struct dsrt_train_history dsrt_train_history;

DSRT_API int dsrt_train_history_create(dsrt_train_history **h);
DSRT_API void dsrt_train_history_destroy(dsrt_train_history *h);

/* Records an ITERATION, VALIDATION or EPOCH event (others are ignored).
 * Returns 0 or -ENOMEM. */
DSRT_API int dsrt_train_history_add(dsrt_train_history *h, const dsrt_train_event *e);

/*
 * Writes the training-progress plot as an SVG file (replaced atomically):
 * accuracy (top) and loss (bottom) against the iteration, the mini-batch
 * values faint with a smoothed line over them, validation points joined by
 * a dashed line, epochs marked. title may be NULL. Returns 0 or a negative
 * code.
 */
DSRT_API int dsrt_train_history_svg(const dsrt_train_history *h, const char *path,
                                    const char *title);

#ifdef __cplusplus
}
#endif
#endif
