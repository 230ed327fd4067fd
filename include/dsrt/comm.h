/*
 * dsrt comm: communicators for data-parallel training.
 *
 * A communicator joins the workers of a data-parallel run: the ranks of an
 * MPI job (one process per CPU worker or per GPU, launched by mpirun), or
 * the GPUs of one process (dsrt_comm_open_local, one thread per GPU). It
 * sums gradients while backward is still running: dsrt_comm_attach installs
 * the net's gradient-ready hook, so each bucket (a contiguous range of the
 * flat gradient buffer, in reverse layer order: a small first one, then
 * bucket_bytes each) starts its all-reduce the moment backward has written
 * it, and dsrt_comm_grads_wait returns when every bucket holds the sum over
 * the workers.
 *
 * Two engines do the work, behind one ops table and the same bucket code:
 * MPI (Open MPI) on host buffers, with MPI_Iallreduce in place driven by a
 * communication thread of the communicator (so progress never waits for the
 * training thread), and NCCL on device buffers, each bucket's ncclAllReduce
 * queued on a communication stream that waits for the event recorded when
 * backward queued the bucket. An NCCL communicator spanning processes is
 * bootstrapped over MPI (the unique id is broadcast by rank 0).
 *
 * Averaging is exact for uneven batches: each worker scales its loss
 * gradient by n_local / global_n (dsrt_net_batch.global_n), so the sum over
 * the workers is the mean over the global batch.
 *
 * No call waits forever: a collective that has not completed within
 * dsrt_comm_options.timeout_s fails with -ETIMEDOUT and a message naming the
 * ranks that did not arrive, when the communicator knows them (each rank's
 * communication thread sends a heartbeat with its position to the others).
 * A communicator that timed out is broken: every later call fails at once
 * with DSRT_ECLOSED, and dsrt_comm_finalize does not wait for the
 * collectives that never completed (the process should then exit non-zero;
 * mpirun ends the other ranks).
 *
 * Threads: a communicator belongs to one thread at a time (the training
 * thread of its worker); its communication thread is internal. dsrt_comm_init,
 * dsrt_comm_finalize and dsrt_comm_world_size are for the main thread.
 */
#ifndef DSRT_COMM_H
#define DSRT_COMM_H

#include <dsrt/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsrt_comm dsrt_comm;

typedef enum {
    DSRT_COMM_MPI = 0, /* host buffers: the CPU backend's gradients */
    DSRT_COMM_NCCL,    /* device buffers: a net on a CUDA device */
} dsrt_comm_kind;

typedef struct {
    dsrt_comm_kind kind;       /* default DSRT_COMM_MPI */
    int device;                /* NCCL: the CUDA device of this rank; default 0 */
    double timeout_s;          /* a collective not done in this time fails, naming the
                                * rank(s) that did not arrive when known; default 60 */
    size_t first_bucket_bytes; /* the first bucket (last layers); default 1 MiB */
    size_t bucket_bytes;       /* every other bucket; default 25 MiB */
} dsrt_comm_options;

/* The default options. */
DSRT_API dsrt_comm_options dsrt_comm_defaults(void);

/*
 * Whether this build has an engine: DSRT_COMM_MPI when it was built with
 * MPI, DSRT_COMM_NCCL when also with NCCL. Returns 0, or DSRT_EUNSUPPORTED
 * with a message saying what the build lacks.
 */
DSRT_API int dsrt_comm_available(dsrt_comm_kind kind);

/*
 * How many processes the launcher (mpirun, srun) started in this job, read
 * from its environment without initialising MPI: 1 when not launched by
 * one. Lets a tool decide whether to initialise MPI at all.
 */
DSRT_API int dsrt_comm_world_size(void);

/*
 * Initialises MPI with MPI_THREAD_MULTIPLE unless it is initialised already
 * (then it must provide MPI_THREAD_MULTIPLE). argc and argv may be NULL.
 * Returns 0, or a negative code (DSRT_EUNSUPPORTED: a build without MPI, or
 * an MPI without thread support). Call once, from the main thread.
 */
DSRT_API int dsrt_comm_init(int *argc, char ***argv);

/* Finalises MPI if dsrt_comm_init initialised it and no communicator broke
 * (a broken one leaves collectives that never complete, which MPI_Finalize
 * would wait for). Communicators must be closed first. */
DSRT_API void dsrt_comm_finalize(void);

/*
 * Opens a communicator over every rank of MPI_COMM_WORLD (collective: every
 * rank calls it). dsrt_comm_init must have succeeded. options NULL: the
 * defaults. For DSRT_COMM_NCCL, rank 0 makes the NCCL unique id and MPI
 * broadcasts it; each rank uses options->device. Returns 0 and sets *c, or a
 * negative code with the message.
 */
DSRT_API int dsrt_comm_open(dsrt_comm **c, const dsrt_comm_options *o);

/*
 * Opens n communicators that join n CUDA devices of this process (NCCL, the
 * devices' communicators made together in one group; no MPI): comms[i]
 * drives devices[i] and must then be used from a thread of its own (one
 * training thread per GPU). Their ranks are 0 .. n-1. options->kind is
 * ignored. Close each once, from any thread: their NCCL communicators are
 * finalised and destroyed together (in one group) by the thread that closes
 * the last of them. Returns 0, or a negative code (DSRT_EUNSUPPORTED
 * without NCCL, DSRT_ENODEVICE for a missing device).
 */
DSRT_API int dsrt_comm_open_local(dsrt_comm **comms, int n, const int *devices,
                                  const dsrt_comm_options *o);

/* Closes a communicator (collective for MPI: every rank closes its own);
 * detaches it from its net. NULL is accepted. */
DSRT_API void dsrt_comm_close(dsrt_comm *c);

/* This worker's rank, the number of workers, and the rank among the workers
 * of this node (for picking a GPU and cores). */
DSRT_API int dsrt_comm_rank(const dsrt_comm *c);
DSRT_API int dsrt_comm_size(const dsrt_comm *c);
DSRT_API int dsrt_comm_local_rank(const dsrt_comm *c);

/*
 * Blocking sums of small host arrays over every worker, in place (metrics,
 * agreement on stopping, averaging). Every worker gets the same bits.
 * Returns 0 or a negative code (-ETIMEDOUT naming the missing ranks).
 */
DSRT_API int dsrt_comm_sum_f64(dsrt_comm *c, double *x, size_t n);
DSRT_API int dsrt_comm_sum_f32(dsrt_comm *c, float *x, size_t n);

/* Broadcasts bytes of host memory from worker root to every worker. */
DSRT_API int dsrt_comm_bcast(dsrt_comm *c, void *buf, size_t bytes, int root);

/*
 * Joins net to the communicator: rank 0's parameters and state are
 * broadcast (so every worker starts from the same weights), and the net's
 * gradient hook is installed (first bucket first_bucket_bytes, then
 * bucket_bytes) so that every bucket's sum starts the moment backward has
 * written it. The net must compute where the communicator works (MPI: the
 * CPU; NCCL: its device). One net per communicator; attaching another
 * replaces it, NULL detaches. Collective. The net must stay until it is
 * detached or the communicator closed.
 */
DSRT_API int dsrt_comm_attach(dsrt_comm *c, dsrt_net *net);

/*
 * After a training step's backward (dsrt_net_forward_backward, or
 * dsrt_net_train_start; with a device backend before or after
 * train_finish), waits until the whole gradient buffer holds the sum over
 * the workers. Buckets the hook did not announce (a step that failed part
 * way) are reduced here, so every worker makes the same calls. Returns 0 or
 * a negative code. On a GPU (NCCL) the call orders the net's stream after
 * the sums and returns at once: the optimizer step and the next forward are
 * queued behind them on the device. Their deadline holds where the host
 * next waits for that device (the net's results, read-backs,
 * synchronisation), which then fails with the communicator's message.
 */
DSRT_API int dsrt_comm_grads_wait(dsrt_comm *c);

/*
 * Parameter averaging (DL4J's ParallelWrapper): the net's parameters, and
 * with opt the optimizer's state (momentum, moments), are replaced by their
 * mean over the workers. Collective.
 */
DSRT_API int dsrt_comm_average(dsrt_comm *c, dsrt_net *net, dsrt_optimizer *opt_or_null);

/* The net's non-learnable state (batch-norm running statistics) replaced
 * by its mean over the workers. Collective. */
DSRT_API int dsrt_comm_average_state(dsrt_comm *c, dsrt_net *net);

/*
 * Synchronised batch normalisation: with on, every batchnorm layer of net
 * computes its batch statistics over the global batch in training (the
 * per-channel sums are summed over the workers in forward and backward,
 * through dsrt_net_set_bn_sync); 0 returns to per-worker statistics. Every
 * worker must set the same. Returns 0 or a negative code.
 */
DSRT_API int dsrt_comm_sync_batchnorm(dsrt_comm *c, dsrt_net *net, int on);

/*
 * The last training step's timeline, for overlap figures and scaling
 * models: per bucket its bytes, when backward made it ready and when its
 * reduction completed, and when backward began and ended and grads_wait
 * returned. Seconds on one monotonic clock (CLOCK_MONOTONIC). On a GPU the
 * timeline is that of the last step whose sums the host has seen complete
 * (usually the step before the last): ready_s is when the host queued a
 * bucket's sum, done_s that plus the device's time from the bucket's
 * gradients being ready to its sum being done (CUDA events). The bucket
 * array belongs to c and is valid until the next step. Returns 0, or
 * -ENOENT before the first step.
 */
typedef struct {
    size_t bytes;
    double ready_s, done_s;
} dsrt_comm_bucket_time;

typedef struct {
    double backward_start_s, backward_end_s, wait_end_s;
    int n;
    const dsrt_comm_bucket_time *bucket; /* (n) bucket 0 first: the last layers */
} dsrt_comm_timeline;

DSRT_API int dsrt_comm_last_timeline(const dsrt_comm *c, dsrt_comm_timeline *t);

#ifdef __cplusplus
}
#endif
#endif
