/*
 * What the files of the training loop share. run.c is the one that drives a
 * run (open, step, finish, close; several GPUs on threads of their own); it
 * calls the others, and none of them calls it: options.c (options, their
 * checks, the split of the cores, evaluation), checkpoint.c (checkpoints,
 * the loop's state beside them, resume), parallel.c (agreement, cores, the
 * net joined to the communicator, averaging, bad samples shared), job.c (the
 * workers agree they run the same job), events.c (telling the caller, below
 * them all); model.c and plot.c stand apart. Nothing here is public; names of
 * functions carry a double underscore.
 */
#ifndef DSRT_TRAIN_INTERNAL_H
#define DSRT_TRAIN_INTERNAL_H

#include "nn/internal.h"
#include "runtime/internal.h"

#include <dsrt/train.h>

#include <sched.h>
#include <time.h>

#define CKPT_PREFIX  "dsrt_ckpt_"
#define CKPT_SUFFIX  ".dsrt"
#define STATE_SUFFIX ".state"
#define STATE_MAGIC  "dsrt-train-state 1"
#define MAX_EPOCHS   1000000
#define MAX_BATCH    (1 << 20)
#define LOAD_FIXED_S 5e-6  /* loading a sample: fixed cost (open, read, decode headers) */
#define LOAD_VALUE_S 20e-9 /* and per output value (decode, augment, write) */
#define CORE_FLOPS   20e9  /* arithmetic one core sustains in the backend */

static inline double dsrt__now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// Options (options.c)

/* The device the options' execution environment means: DSRT_DEVICE_CPU or a
 * GPU index (device may be NULL). Fails, naming the option, when it is not
 * there. */
int dsrt__train_resolve_device(const dsrt_train_options *o, int *device);
/* The augment options with the net's input size filled in and checked;
 * who prefixes the messages. */
int dsrt__train_resolve_augment(const dsrt_augment_options *in, const dsrt_net_info *ni,
                                dsrt_augment_options *out, const char *who);
/* The same without random transforms: validation and evaluation samples. */
void dsrt__train_fixed_augment(dsrt_augment_options *a);
/* *out (malloc'd, (classes of ds)) maps each class of ds to the net's; see
 * train.c. */
int dsrt__train_class_map(const dsrt_net *net, const dsrt_datastore *ds, const dsrt_datastore *ref,
                          int classes, const char *who, int32_t **out);

// ----------------------------------------------------------------------------
// Cores: the split between pipeline workers and compute threads (options.c)

typedef struct {
    dsrt_cpus *cpus;
    unsigned ncores;
    unsigned workers;
    int threads;
    char *worker_cpus; /* CPU list of the worker cores, for the pipeline */
    int pin;
    /* What is restored at the end. */
    cpu_set_t saved_mask;
    int saved_mask_ok;
    int saved_net_threads;
    dsrt_net *net;
    int team_pinned; /* every member bound to its core */
    int team_bound;  /* members were bound (some may have failed): restore them */
} cores_plan;

/* Chooses the split for net (workers / threads 0: automatic) and the CPU
 * list of the worker cores. */
int dsrt__cores_open(cores_plan *cp, const char *list, int pin, unsigned workers, int threads,
                     const dsrt_net_info *ni, dsrt_net *net, const char *who);
/* Sets the compute thread count and pins the net's compute threads. */
void dsrt__cores_start_compute(cores_plan *cp);
/* Gives the threads back their affinity and count. A zeroed cp is accepted. */
void dsrt__cores_close(cores_plan *cp);

// ----------------------------------------------------------------------------
// The run (run.c) and its checkpoints (checkpoint.c)

/* A set of sample ids (open addressing; a slot holds id + 1, 0 when empty):
 * the bad samples told of, so that each is told once however many workers
 * found it. */
typedef struct {
    uint64_t *slot;
    size_t cap, n;
} id_set;

/* Adds id: 1 when it was not there, 0 when it was, -ENOMEM. */
int dsrt__id_set_add(id_set *s, uint32_t id);
void dsrt__id_set_free(id_set *s);

/* How the run's epochs draw their samples from ds (loop_state.sampling). */
void dsrt__train_sampling(const dsrt_train_options *o, const dsrt_datastore *ds, char *out,
                          size_t cap);

/* The loop's own state, written beside each checkpoint. */
typedef struct {
    int64_t bad_count;    /* validations in a row not below the best loss */
    double best_val_loss; /* NaN: none yet */
    int64_t best_iteration;
    double last_val_loss, last_val_accuracy;
    int64_t batch, samples;
    int drop_last;
    /* How the training data is read: "exact", or "shard" and its shuffle
     * buffer (a tar shard set's other order gives other batches). */
    char order[8];
    int64_t shuffle_buffer;
    /* Data-parallel workers of the run (0 in a state file that does not
     * say: from before resumes on other numbers of workers were told). */
    int64_t workers;
    /* How each epoch's samples are drawn: the shuffle's name and a hash of
     * the sample weights and the mix (its sources' sizes and weights,
     * replacement), "shuffle/hash"; "" in a state file from before. */
    char sampling[48];
    char best_file[256]; /* in the checkpoint folder, "" when none */
} loop_state;

void dsrt__loop_state_init(loop_state *s);

/* Everything one dsrt_train call holds. */
typedef struct {
    const dsrt_train_options *o;
    dsrt_net *net;
    const dsrt_datastore *train;
    dsrt_optimizer *opt;
    dsrt_train_result *r;
    dsrt_pipeline *p, *vp;
    cores_plan cp;
    dsrt_net_info ni;
    double busy0, idle0; /* the device's busy and idle seconds when the call began */
    int32_t *vmap, *vlabels;
    int vbatch;
    uint64_t vbpe;
    size_t n_params, n_state;
    float *best_params, *best_state;
    loop_state ls;
    int best_dirty; /* best weights newer than the last best file */
    dsrt_train_event ev;
    double t0, val_s, train_images_t;
    int stop;         /* 0, or a dsrt_stop_reason + 1 */
    int stop_request; /* a callback asked to stop during this step */
    int64_t ckpt_it;  /* iteration of the last checkpoint due (written by worker 0), or -1 */
    /* The position: batches an epoch, iterations in all, iterations done. */
    int64_t bpe, max_it, it;
    int validated_last; /* the last step ended with a validation */
    /* The batch taken for the next step, whether it was copied to the
     * device, and why taking it failed (reported when it is due). */
    dsrt_batch *b;
    uint32_t *step_ids; /* (batch) the ids of the step's batch, for the ITERATION event */
    int copied;
    int pending;
    char pending_msg[1024];
    /* Batches travel as uint8 NHWC, normalised by the net: (x - sub) / div. */
    int u8;
    float sub_div[2][4];
    size_t bad_told[2];    /* bad samples of the training and validation data told so far */
    size_t bad_sent[2];    /* ... and sent to the other workers so far */
    id_set bad_ids[2];     /* ... every worker's, each once: the distinct bad samples */
    uint64_t skipped_all;  /* data parallel: training skips summed over the workers */
    uint64_t val_left_out; /* samples left out of the validation passes, summed */
    /* Data parallel: this worker's communicator (NULL: one worker alone),
     * its rank, the workers, and whether parameters are averaged every
     * averaging_frequency iterations rather than gradients summed. */
    dsrt_comm *comm;
    int rank, world;
    int averaging;
    char *cpus; /* the cores of this worker when the workers share the process's (malloc'd) */
} run;

/* The other workers' optimizer states worker 0 writes into a checkpoint
 * when each worker keeps its own (parameter averaging without the optimizer
 * state averaged): ws.workers 1 when there are none to write. */
typedef struct {
    float *buf;     /* (workers - 1, buffers, parameters) on worker 0 */
    float **states; /* (workers - 1) pointers into buf */
    int64_t *steps; /* (workers - 1) */
    dsrt_ckpt_workers ws;
} dp_states;

/* Writes a checkpoint of the run (and the best weights, when newer) after
 * `iteration` iterations, epochs_done epochs, with the other workers'
 * optimizer states ws (NULL: none). */
int dsrt__train_save_checkpoint(run *R, int64_t epochs_done, int64_t iteration,
                                const dp_states *ws);
/* Loads the checkpoint R->o->resume names into the run: weights, state,
 * optimizer, position (*pos) and loop state; used receives its path. */
int dsrt__train_load_resume(run *R, dsrt_train_position *pos, char *used, size_t used_size);
/* Creates the checkpoint folder (one level) when missing. */
int dsrt__train_make_dir(const char *path);

// ----------------------------------------------------------------------------
// Events and bad samples (events.c)

/* Tells the callback of an event (with the bad samples found since the last
 * one first). Returns 1 when the callback asked to stop. */
int dsrt__train_emit(run *R, dsrt_train_event_kind kind);

/* BAD_SAMPLE events for the samples of pipeline p found bad since the last
 * call (validation: p is the validation pipeline). Returns 1 when the
 * callback asked to stop. */
int dsrt__train_emit_bad(run *R, dsrt_pipeline *p, int validation);
/* Calls fn for each sample of pipeline p found bad past the first *from,
 * advancing *from. Returns fn's results or'ed together, or the first
 * negative one. */
int dsrt__train_each_bad(dsrt_pipeline *p, size_t *from, int validation,
                         int (*fn)(void *ctx, const dsrt_bad_sample *s, int validation), void *ctx);
/* A BAD_SAMPLE event for s, found by worker `worker`, unless one was told
 * for that sample already (by this worker or another). Returns 1 when the
 * callback asked to stop. */
int dsrt__train_tell_bad(run *R, const dsrt_bad_sample *s, int validation, int worker);

// ----------------------------------------------------------------------------
// Data parallel (parallel.c, job.c): no-ops for one worker alone

/* The workers of a run: rank, world and mode from the options (no
 * collective). */
void dsrt__dp_setup(run *R);
/*
 * Agreement: every worker tells whether it failed (rc) while x (n doubles)
 * is summed over the workers. Returns rc on a worker that failed; on the
 * others a failure that names the first worker that failed and says its
 * message; 0 when none failed (x then holds the sums). A failure of the
 * communicator itself is returned as it is.
 */
int dsrt__dp_agree(run *R, int rc, double *x, size_t n);
/* A CPU worker whose process shares its cores with other workers (ranks
 * launched without binding) takes its share of them: R->cpus. Collective. */
int dsrt__dp_cpus(run *R);
/* Reserves the device memory of every batch shape the run takes (every
 * run, before any collective), then joins the net to the communicator:
 * every worker starts from worker 0's weights; gradients summed in buckets
 * during backward (or, averaging, not); sync batchnorm when asked.
 * Collective. */
int dsrt__dp_attach(run *R);
/* Before a validation, a checkpoint or the end: averaged batchnorm
 * statistics (DSRT_BN_AVERAGE) and, averaging, parameters, so that every
 * worker holds the same net. Collective. */
int dsrt__dp_sync(run *R);
/* After the optimizer step of iteration it (1-based): parameter averaging
 * when due. Collective. */
int dsrt__dp_after_step(run *R, int64_t it);
/* Every worker hears of the bad samples the others found since the last
 * call (BAD_SAMPLE events with bad_worker set). Returns 1 when the callback
 * asked to stop, or a negative code. Collective. */
int dsrt__dp_share_bad(run *R);
/* Whether every worker keeps an optimizer state of its own (parameter
 * averaging without the optimizer state averaged). */
static inline int dsrt__dp_own_states(const run *R) {
    return R->averaging && !R->o->average_optimizer_state && R->world > 1;
}
/* Before a checkpoint, when every worker keeps its own optimizer state:
 * worker 0 receives the others' into *st (freed by dsrt__dp_states_free).
 * Collective; st->ws.workers 1 otherwise. */
int dsrt__dp_gather_states(run *R, dp_states *st);
void dsrt__dp_states_free(dp_states *st);
/* Before any work: fails on every worker, naming the first option, class
 * or file that differs and the workers, unless every worker runs the same
 * job (options, net, data; see job.c). Collective. */
int dsrt__dp_same_job(run *R);
/* After loading the checkpoint to resume from: fails on every worker unless
 * every worker resumes at the same position. Collective. */
int dsrt__dp_same_position(run *R, const dsrt_train_position *pos);
/* At the end: fails when the weights differ between workers. Collective. */
int dsrt__dp_check_weights(run *R);
/* One worker's run (dsrt_train without the multi-gpu dispatch). */
int dsrt__train_worker(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *o,
                       dsrt_train_result *r);

#endif
