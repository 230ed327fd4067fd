/*
 * The training loop: a pipeline makes batches in the background on the
 * worker cores while the calling thread and its OpenMP team, pinned to the
 * compute cores, run forward, backward and the optimizer step on each batch
 * as soon as it is ready. Around it: option checking before any work,
 * validation passes on a second pipeline, patience, the best-validation
 * network, atomic checkpoints with the loop's own state beside them, exact
 * resume (the pipeline restarts at the checkpoint's batch, the net's
 * iteration counter keys dropout), a stop on a non-finite loss, and
 * evaluation with a confusion matrix.
 *
 * The split of the cores. The pipeline's share of the work per image is
 * estimated from the sample size (loading) and the net's train_flops
 * (computing); see dsrt_train_options.workers. The net's compute threads are
 * bound to their cores once at the start (dsrt_net_run_on_threads: the CPU
 * backend's team keeps its threads for the whole run) and given back the
 * caller's affinity at the end. On a GPU the calling thread only queues work:
 * it keeps one core and the workers, pinned to the cores nearest the device,
 * get the others.
 *
 * The step. dsrt_net_train_start queues forward and backward; while the
 * device computes, the loop takes the next batch from the pipeline and
 * stages it (a copy from its pinned slot on the device's copy stream, which
 * hands the slot back as soon as the copy is done); dsrt_net_train_finish
 * then waits for the loss. On the CPU the same calls compute in place and
 * the slot goes back after the step. Batches for a GPU travel as uint8 NHWC
 * (a quarter of the float bytes) and are normalised there, exactly as the
 * pipeline's float output would be made from the same pixels.
 */
#include "runtime/internal.h"

#include <dsrt/train.h>

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CKPT_PREFIX  "dsrt_ckpt_"
#define CKPT_SUFFIX  ".dsrt"
#define STATE_SUFFIX ".state"
#define STATE_MAGIC  "dsrt-train-state 1"
#define MAX_EPOCHS   1000000
#define MAX_BATCH    (1 << 20)
#define LOAD_FIXED_S 5e-6  /* loading a sample: fixed cost (open, read, decode headers) */
#define LOAD_VALUE_S 20e-9 /* and per output value (decode, augment, write) */
#define CORE_FLOPS   20e9  /* arithmetic one core sustains in the backend */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// Options

dsrt_train_options dsrt_train_defaults(void) {
    dsrt_train_options o;
    memset(&o, 0, sizeof o);
    o.max_epochs = 30;
    o.batch = 128;
    o.shuffle = DSRT_SHUFFLE_EVERY_EPOCH;
    o.drop_last = 0;
    o.optimizer = dsrt_optimizer_defaults(DSRT_SOLVER_SGDM);
    o.validation = NULL;
    o.validation_frequency = 0;
    o.validation_patience = 0;
    o.validation_batch = 0;
    o.verbose_frequency = 50;
    o.output_network = DSRT_OUTPUT_LAST;
    o.checkpoint_path = NULL;
    o.checkpoint_frequency = 1;
    o.checkpoint_unit = DSRT_UNIT_EPOCH;
    o.resume = NULL;
    o.execution = DSRT_EXEC_AUTO;
    o.gpu = -1;
    o.uint8_batches = -1;
    o.augment = dsrt_augment_defaults();
    o.augment.output_height = o.augment.output_width = o.augment.output_channels = 0;
    o.seed = 0;
    o.workers = 0;
    o.compute_threads = 0;
    o.cpus = NULL;
    o.pin = 1;
    o.prefetch = 4;
    o.fail_on_error = 0;
    return o;
}

dsrt_eval_options dsrt_eval_defaults(void) {
    dsrt_eval_options o;
    memset(&o, 0, sizeof o);
    o.batch = 128;
    o.pin = 1;
    o.augment = dsrt_augment_defaults();
    o.augment.output_height = o.augment.output_width = o.augment.output_channels = 0;
    return o;
}

static const char *const EXEC_NAMES[] = {"auto", "cpu", "gpu", "multi-gpu", "parallel"};

/* The device the options' execution environment means: DSRT_DEVICE_CPU or a
 * GPU index. Fails, naming the option, when it is not there. */
static int resolve_device(const dsrt_train_options *o, int *device) {
    int n = dsrt_gpu_count(), want = o->gpu < 0 ? 0 : o->gpu, dev;
    switch (o->execution) {
    case DSRT_EXEC_AUTO:
        dev = n > want ? want : DSRT_DEVICE_CPU;
        break;
    case DSRT_EXEC_CPU:
        dev = DSRT_DEVICE_CPU;
        break;
    case DSRT_EXEC_GPU: {
        int rc = dsrt_gpu_check(want);
        if (rc)
            return dsrt__fail_prefix(rc, "train: execution_environment (ExecutionEnvironment) "
                                         "'gpu'");
        dev = want;
        break;
    }
    default:
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "train: execution_environment (ExecutionEnvironment): '%s': not "
                          "available in this build (use auto, cpu or gpu)",
                          EXEC_NAMES[o->execution]);
    }
    if (device) *device = dev;
    return 0;
}

static int check_optimizer(const dsrt_optimizer_options *o) {
#define BAD(cond, fmt, ...)                                                                        \
    if (!(cond)) return dsrt__fail(DSRT_EOPTION, "train: " fmt, __VA_ARGS__)
    BAD((unsigned)o->solver <= DSRT_SOLVER_RMSPROP, "solver: %d: unknown", (int)o->solver);
    BAD(o->learn_rate > 0 && isfinite(o->learn_rate),
        "learn_rate (InitialLearnRate): %g: must be positive and finite", o->learn_rate);
    BAD(o->momentum >= 0 && o->momentum < 1, "momentum: %g: must be in [0, 1)", o->momentum);
    BAD(o->l2 >= 0 && isfinite(o->l2), "l2 (L2Regularization): %g: must be >= 0 and finite", o->l2);
    BAD(o->gradient_decay >= 0 && o->gradient_decay < 1, "gradient_decay: %g: must be in [0, 1)",
        o->gradient_decay);
    BAD(o->sq_gradient_decay >= 0 && o->sq_gradient_decay < 1,
        "sq_gradient_decay: %g: must be in [0, 1)", o->sq_gradient_decay);
    BAD(o->epsilon > 0 && isfinite(o->epsilon), "epsilon: %g: must be positive", o->epsilon);
    BAD(o->schedule == DSRT_LR_NONE || o->schedule == DSRT_LR_PIECEWISE,
        "learn_rate_schedule: %d: unknown", (int)o->schedule);
    BAD(o->drop_factor >= 0 && o->drop_factor <= 1, "learn_rate_drop_factor: %g: must be in [0, 1]",
        o->drop_factor);
    BAD(o->drop_period >= 1, "learn_rate_drop_period: %d: must be at least 1", o->drop_period);
    BAD((unsigned)o->clip <= DSRT_CLIP_ABSOLUTE, "gradient_threshold_method: %d: unknown",
        (int)o->clip);
    BAD(o->grad_threshold > 0, "gradient_threshold: %g: must be positive (inf: no clipping)",
        o->grad_threshold);
    return 0;
}

/* The augment options with the net's input size filled in and checked. */
static int resolve_augment(const dsrt_augment_options *in, const dsrt_net_info *ni,
                           dsrt_augment_options *out, const char *who) {
    *out = *in;
    if (out->output_height == 0) out->output_height = ni->height;
    if (out->output_width == 0) out->output_width = ni->width;
    if (out->output_channels == 0) out->output_channels = ni->channels;
    if (out->output_height != ni->height || out->output_width != ni->width ||
        out->output_channels != ni->channels)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: augment output size: %dx%dx%d: the net takes %dx%dx%d (leave it 0 "
                          "for the net's)",
                          who, out->output_height, out->output_width, out->output_channels,
                          ni->height, ni->width, ni->channels);
    if (out->layout != DSRT_AUGMENT_F32_NCHW)
        return dsrt__fail(DSRT_EOPTION, "%s: augment layout: %d: the net takes float NCHW", who,
                          (int)out->layout);
    int rc = dsrt_augment_check(out);
    if (rc) return dsrt__fail_prefix(rc, "%s", who);
    return 0;
}

/* The same without random transforms: validation and evaluation samples. */
static void fixed_augment(dsrt_augment_options *a) {
    dsrt_augment_options d = dsrt_augment_defaults();
    a->rand_x_reflection = a->rand_y_reflection = 0;
    memcpy(a->rand_rotation, d.rand_rotation, sizeof a->rand_rotation);
    memcpy(a->rand_scale, d.rand_scale, sizeof a->rand_scale);
    memcpy(a->rand_x_scale, d.rand_x_scale, sizeof a->rand_x_scale);
    memcpy(a->rand_y_scale, d.rand_y_scale, sizeof a->rand_y_scale);
    memcpy(a->rand_x_shear, d.rand_x_shear, sizeof a->rand_x_shear);
    memcpy(a->rand_y_shear, d.rand_y_shear, sizeof a->rand_y_shear);
    memcpy(a->rand_x_translation, d.rand_x_translation, sizeof a->rand_x_translation);
    memcpy(a->rand_y_translation, d.rand_y_translation, sizeof a->rand_y_translation);
    if (a->size_mode == DSRT_AUGMENT_RANDCROP) a->size_mode = DSRT_AUGMENT_CENTERCROP;
}

/*
 * map[c] = the net's class for class c of ds: by name when the net's
 * description names its classes, else by name against ref (the training
 * data), else by index. Fails with DSRT_EOPTION naming an unknown class.
 */
static int class_map(const dsrt_net *net, const dsrt_datastore *ds, const dsrt_datastore *ref,
                     int classes, const char *who, int32_t **out) {
    size_t n = dsrt_datastore_num_classes(ds);
    int32_t *map = dsrt__calloc(n ? n : 1, sizeof *map);
    if (!map) return -ENOMEM;
    char name[1024];
    int named = dsrt_net_class_name(net, 0, name, sizeof name) >= 0;
    int rc = 0;
    for (size_t c = 0; c < n && !rc; c++) {
        const char *want = dsrt_datastore_class_name(ds, c);
        map[c] = -1;
        if (named) {
            for (int k = 0; k < classes && map[c] < 0; k++)
                if (dsrt_net_class_name(net, k, name, sizeof name) >= 0 && !strcmp(name, want))
                    map[c] = k;
        } else if (ref) {
            for (size_t k = 0; k < dsrt_datastore_num_classes(ref) && map[c] < 0; k++)
                if (!strcmp(dsrt_datastore_class_name(ref, k), want)) map[c] = (int32_t)k;
        } else if ((int)c < classes) {
            map[c] = (int32_t)c;
        }
        if (map[c] < 0 || map[c] >= classes)
            rc = dsrt__fail(DSRT_EOPTION, "%s: class '%s' (%zu of %zu) is not one the net knows%s",
                            who, want, c, n,
                            named ? " (its description names its classes)"
                                  : (ref ? " (not a class of the training data)" : ""));
    }
    if (rc) {
        free(map);
        return rc;
    }
    *out = map;
    return 0;
}

/* Checks the checkpoint folder without creating it. */
static int check_checkpoint_path(const char *path) {
    struct stat st;
    if (!*path) return dsrt__fail(DSRT_EOPTION, "train: checkpoint_path: \"\": empty");
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return dsrt__fail(DSRT_EOPTION, "train: checkpoint_path: %s: not a folder", path);
        if (access(path, W_OK | X_OK) != 0)
            return dsrt__fail(DSRT_EOPTION, "train: checkpoint_path: %s: not writable: %s", path,
                              strerror(errno));
        return 0;
    }
    char *dir = dsrt__strdup(path);
    if (!dir) return -ENOMEM;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = '\0';
    char *slash = strrchr(dir, '/');
    const char *parent = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
    int ok = stat(parent, &st) == 0 && S_ISDIR(st.st_mode) && access(parent, W_OK | X_OK) == 0;
    int rc = ok ? 0
                : dsrt__fail(DSRT_EOPTION,
                             "train: checkpoint_path: %s: missing, and its parent %s is not a "
                             "writable folder",
                             path, parent);
    free(dir);
    return rc;
}

int dsrt_train_check(const dsrt_train_options *o, const dsrt_net *net,
                     const dsrt_datastore *train) {
    if (!o || !net || !train) return dsrt__fail(-EINVAL, "train: no options, net or data");
#define BADO(cond, fmt, ...)                                                                       \
    if (!(cond)) return dsrt__fail(DSRT_EOPTION, "train: " fmt, __VA_ARGS__)
    BADO(o->max_epochs >= 1 && o->max_epochs <= MAX_EPOCHS,
         "max_epochs (MaxEpochs): %d: not in [1, %d]", o->max_epochs, MAX_EPOCHS);
    BADO(o->batch >= 1 && o->batch <= MAX_BATCH, "batch (MiniBatchSize): %d: not in [1, %d]",
         o->batch, MAX_BATCH);
    BADO((unsigned)o->shuffle <= DSRT_SHUFFLE_EVERY_EPOCH, "shuffle: %d: unknown", (int)o->shuffle);
    BADO(o->drop_last == 0 || o->drop_last == 1, "drop_last: %d: not 0 or 1", o->drop_last);
    int rc = check_optimizer(&o->optimizer);
    if (rc) return rc;
    BADO(o->validation_frequency >= 0,
         "validation_frequency (ValidationFrequency): %d: must be >= 0 (0: every epoch)",
         o->validation_frequency);
    BADO(o->validation_patience >= 0,
         "validation_patience (ValidationPatience): %d: must be >= 0 (0: never stop)",
         o->validation_patience);
    BADO(o->validation_batch >= 0 && o->validation_batch <= MAX_BATCH,
         "validation_batch: %d: not in [0, %d]", o->validation_batch, MAX_BATCH);
    BADO(o->verbose_frequency >= 1, "verbose_frequency (VerboseFrequency): %d: must be >= 1",
         o->verbose_frequency);
    BADO((unsigned)o->output_network <= DSRT_OUTPUT_BEST_VALIDATION,
         "output_network (OutputNetwork): %d: unknown", (int)o->output_network);
    BADO(o->output_network != DSRT_OUTPUT_BEST_VALIDATION || o->validation,
         "output_network (OutputNetwork): %s: needs validation data", "best-validation");
    BADO(o->validation_patience == 0 || o->validation,
         "validation_patience (ValidationPatience): %d: needs validation data",
         o->validation_patience);
    BADO(o->checkpoint_frequency >= 1,
         "checkpoint_frequency (CheckpointFrequency): %d: must be >= 1", o->checkpoint_frequency);
    BADO((unsigned)o->checkpoint_unit <= DSRT_UNIT_ITERATION,
         "checkpoint_unit (CheckpointFrequencyUnit): %d: unknown", (int)o->checkpoint_unit);
    if (o->checkpoint_path && (rc = check_checkpoint_path(o->checkpoint_path))) return rc;
    if (o->resume) {
        struct stat st;
        BADO(*o->resume && stat(o->resume, &st) == 0, "resume: %s: %s", o->resume,
             *o->resume ? strerror(errno) : "empty");
    }
    BADO((unsigned)o->execution <= DSRT_EXEC_PARALLEL,
         "execution_environment (ExecutionEnvironment): %d: unknown", (int)o->execution);
    BADO(o->gpu >= -1, "gpu: %d: not a device index (-1: the first)", o->gpu);
    BADO(o->uint8_batches >= -1 && o->uint8_batches <= 1, "uint8_batches: %d: not -1, 0 or 1",
         o->uint8_batches);
    if ((rc = resolve_device(o, NULL))) return rc;
    BADO(o->workers <= 1024, "workers: %u: not in [0, 1024]", o->workers);
    BADO(o->compute_threads >= 0 && o->compute_threads <= 4096,
         "compute_threads: %d: not in [0, 4096]", o->compute_threads);
    BADO(o->pin == 0 || o->pin == 1, "pin: %d: not 0 or 1", o->pin);
    BADO(o->prefetch >= 1 && o->prefetch <= 1024, "prefetch: %u: not in [1, 1024]", o->prefetch);
    BADO(o->read_depth <= 4096, "read_depth: %u: not in [0, 4096]", o->read_depth);
    BADO(o->fail_on_error == 0 || o->fail_on_error == 1, "fail_on_error: %d: not 0 or 1",
         o->fail_on_error);

    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    dsrt_augment_options aug;
    if ((rc = resolve_augment(&o->augment, &ni, &aug, "train"))) return rc;
    size_t n = dsrt_datastore_count(train), nc = dsrt_datastore_num_classes(train);
    BADO(n >= 1, "training data: %s", "no samples");
    BADO((int)nc == ni.classes,
         "training data: %zu classes, the net has %d (build the net for the data's classes, or "
         "use transfer learning)",
         nc, ni.classes);
    BADO(!o->drop_last || (size_t)o->batch <= n,
         "batch (MiniBatchSize): %d: more than the %zu training samples with drop_last", o->batch,
         n);
    char name[1024];
    for (size_t c = 0; c < nc; c++)
        if (dsrt_net_class_name(net, (int)c, name, sizeof name) >= 0 &&
            strcmp(name, dsrt_datastore_class_name(train, c)) != 0)
            return dsrt__fail(DSRT_EOPTION,
                              "train: training data: class %zu is '%s', the net's class %zu is "
                              "'%s'",
                              c, dsrt_datastore_class_name(train, c), c, name);
    if (o->validation) {
        BADO(dsrt_datastore_count(o->validation) >= 1, "validation data: %s", "no samples");
        int32_t *map;
        if ((rc = class_map(net, o->validation, train, ni.classes, "train: validation data", &map)))
            return rc;
        free(map);
    }
    if (o->cpus) {
        dsrt_cpus *c;
        unsigned t = 0;
        if ((rc = dsrt__cpus_open(&c, o->cpus, -1, &t))) return dsrt__fail_prefix(rc, "train");
        dsrt__cpus_close(c);
    }
    return 0;
#undef BADO
#undef BAD
}

// ----------------------------------------------------------------------------
// Cores: the split between pipeline workers and compute threads, and pinning

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

/* Binds compute thread `member` to its core. */
static int bind_member(void *arg, int member) {
    cores_plan *cp = arg;
    return dsrt__cpus_bind(cp->cpus, (unsigned)member % cp->ncores);
}

/* Gives a compute thread the caller's affinity back. */
static int unbind_member(void *arg, int member) {
    cores_plan *cp = arg;
    return sched_setaffinity(0, sizeof cp->saved_mask, &cp->saved_mask);
}

/* Appends core k's CPUs (as this thread sees them once bound there) to the
 * list in buf. */
static int append_core_cpus(cores_plan *cp, unsigned k, char *buf, size_t size) {
    cpu_set_t set;
    if (dsrt__cpus_bind(cp->cpus, k) != 0 || sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        size_t at = strlen(buf);
        snprintf(buf + at, size - at, "%s%d", at ? "," : "", c);
    }
    return 0;
}

/*
 * Chooses the split for a net whose samples have `values` output values, and
 * the CPU list of the worker cores. workers / threads 0: automatic. device:
 * the net's (a GPU computes: one core queues its work, the workers get the
 * rest, nearest the device first).
 */
static int cores_open(cores_plan *cp, const char *list, int pin, unsigned workers, int threads,
                      const dsrt_net_info *ni, dsrt_net *net, const char *who) {
    memset(cp, 0, sizeof *cp);
    cp->pin = pin;
    cp->net = net;
    cp->saved_net_threads = dsrt_net_threads(net);
    cp->saved_mask_ok = sched_getaffinity(0, sizeof cp->saved_mask, &cp->saved_mask) == 0;
    unsigned t = 0;
    int rc = dsrt__cpus_open(&cp->cpus, list, ni->device, &t);
    if (rc) return dsrt__fail_prefix(rc, "%s", who);
    unsigned C = cp->ncores = dsrt__cpus_cores(cp->cpus);
    unsigned w;
    int T;
    if (ni->device >= 0) {
        w = workers ? workers : (C > 1 ? C - 1 : 1);
        T = threads ? threads : 1;
    } else {
        double values = (double)ni->height * ni->width * ni->channels;
        double load = LOAD_FIXED_S + LOAD_VALUE_S * values;
        double compute = ni->train_flops / CORE_FLOPS;
        double L = C * load / (load + compute);
        w = workers ? workers : (unsigned)DSRT_MAX(1.0, ceil(L - 1e-9));
        if (!workers && w > C) w = C;
        T = threads ? threads : (int)DSRT_MAX(1.0, (double)C - floor(L));
    }
    cp->workers = w;
    cp->threads = T;

    size_t size = (size_t)C * 16 * 8 + 64;
    cp->worker_cpus = dsrt__calloc(1, size);
    if (!cp->worker_cpus) return -ENOMEM;
    if (w >= C) {
        snprintf(cp->worker_cpus, size, "%s", dsrt__cpus_list(cp->cpus));
    } else {
        for (unsigned k = C - w; k < C; k++)
            if (append_core_cpus(cp, k, cp->worker_cpus, size) != 0) {
                snprintf(cp->worker_cpus, size, "%s", dsrt__cpus_list(cp->cpus));
                break;
            }
        if (cp->saved_mask_ok) sched_setaffinity(0, sizeof cp->saved_mask, &cp->saved_mask);
    }
    return 0;
}

/* Sets the compute thread count and pins the net's compute threads. */
static void cores_start_compute(cores_plan *cp) {
    dsrt_net_set_threads(cp->net, cp->threads);
    if (!cp->pin) return;
    cp->team_bound = 1;
    cp->team_pinned = dsrt_net_run_on_threads(cp->net, bind_member, cp) == 0;
}

static void cores_close(cores_plan *cp) {
    if (cp->team_bound && cp->saved_mask_ok) dsrt_net_run_on_threads(cp->net, unbind_member, cp);
    if (cp->saved_mask_ok) sched_setaffinity(0, sizeof cp->saved_mask, &cp->saved_mask);
    if (cp->net) dsrt_net_set_threads(cp->net, cp->saved_net_threads);
    dsrt__cpus_close(cp->cpus);
    free(cp->worker_cpus);
    memset(cp, 0, sizeof *cp);
}

// ----------------------------------------------------------------------------
// Checkpoints and the loop's state beside them

typedef struct {
    int64_t bad_count;    /* validations in a row not below the best loss */
    double best_val_loss; /* NaN: none yet */
    int64_t best_iteration;
    double last_val_loss, last_val_accuracy;
    int64_t batch, samples;
    int drop_last;
    char best_file[256]; /* in the checkpoint folder, "" when none */
} loop_state;

static void loop_state_init(loop_state *s) {
    memset(s, 0, sizeof *s);
    s->best_val_loss = s->last_val_loss = s->last_val_accuracy = NAN;
    s->best_iteration = -1;
}

static int write_state(const char *path, const loop_state *s, const dsrt_train_position *pos) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     STATE_MAGIC "\nepoch %lld\niteration %lld\nbatch %lld\nsamples %lld\n"
                                 "drop_last %d\nbad_count %lld\nbest_val_loss %.17g\n"
                                 "best_iteration %lld\nlast_val_loss %.17g\n"
                                 "last_val_accuracy %.17g\nbest_file %s\n",
                     (long long)pos->epoch, (long long)pos->iteration, (long long)s->batch,
                     (long long)s->samples, s->drop_last, (long long)s->bad_count, s->best_val_loss,
                     (long long)s->best_iteration, s->last_val_loss, s->last_val_accuracy,
                     s->best_file[0] ? s->best_file : "-");
    int rc = dsrt__write_file_atomic(path, buf, (size_t)n);
    return rc ? dsrt__fail_prefix(rc, "train: checkpoint state") : 0;
}

/* Reads the state file of a checkpoint; 1 when it is there and belongs to
 * the checkpoint's iteration, 0 when not. */
static int read_state(const char *path, loop_state *s, int64_t iteration) {
    uint8_t *data;
    size_t size;
    if (dsrt__read_whole_file(path, 1 << 16, &data, &size) != 0) {
        dsrt__clear_error();
        return 0;
    }
    loop_state t;
    loop_state_init(&t);
    long long it = -1, v;
    int ok = strncmp((char *)data, STATE_MAGIC "\n", sizeof STATE_MAGIC) == 0;
    for (char *line = (char *)data; ok && line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char key[32], val[256];
        if (sscanf(line, "%31s %255s", key, val) == 2) {
            if (!strcmp(key, "iteration") && sscanf(val, "%lld", &v) == 1) it = v;
            if (!strcmp(key, "batch") && sscanf(val, "%lld", &v) == 1) t.batch = v;
            if (!strcmp(key, "samples") && sscanf(val, "%lld", &v) == 1) t.samples = v;
            if (!strcmp(key, "drop_last") && sscanf(val, "%lld", &v) == 1) t.drop_last = (int)v;
            if (!strcmp(key, "bad_count") && sscanf(val, "%lld", &v) == 1) t.bad_count = v;
            if (!strcmp(key, "best_iteration") && sscanf(val, "%lld", &v) == 1)
                t.best_iteration = v;
            if (!strcmp(key, "best_val_loss")) t.best_val_loss = strtod(val, NULL);
            if (!strcmp(key, "last_val_loss")) t.last_val_loss = strtod(val, NULL);
            if (!strcmp(key, "last_val_accuracy")) t.last_val_accuracy = strtod(val, NULL);
            if (!strcmp(key, "best_file") && strcmp(val, "-") != 0 && !strchr(val, '/'))
                snprintf(t.best_file, sizeof t.best_file, "%s", val);
        }
        line = next;
    }
    free(data);
    if (!ok || it != iteration) return 0;
    *s = t;
    return 1;
}

int dsrt_checkpoint_latest(const char *dir, char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return dsrt__fail(-errno, "checkpoint: %s: %s", dir, strerror(errno));
    long long best = -1;
    char name[512] = "";
    const size_t np = strlen(CKPT_PREFIX), ns = strlen(CKPT_SUFFIX);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n <= np + ns || strncmp(e->d_name, CKPT_PREFIX, np) != 0 ||
            strcmp(e->d_name + n - ns, CKPT_SUFFIX) != 0 || n >= sizeof name)
            continue;
        const char *i = strstr(e->d_name, "_i");
        long long it;
        if (!i || sscanf(i + 2, "%lld", &it) != 1) continue;
        if (it > best) {
            best = it;
            memcpy(name, e->d_name, n + 1);
        }
    }
    closedir(d);
    if (best < 0)
        return dsrt__fail(-ENOENT, "checkpoint: %s: no %s*%s file", dir, CKPT_PREFIX, CKPT_SUFFIX);
    if ((size_t)snprintf(path, size, "%s/%s", dir, name) >= size)
        return dsrt__fail(-ENAMETOOLONG, "checkpoint: %s/%s: path too long", dir, name);
    return 0;
}

uint64_t dsrt_weights_checksum(dsrt_net *net) {
    size_t n;
    const uint8_t *p = (const uint8_t *)dsrt_net_params(net, &n);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static int all_finite(const float *x, size_t n) {
    float acc = 0;
    for (size_t i = 0; i < n; i++) acc += x[i] * 0.0f; /* NaN for any NaN or inf */
    return acc == 0.0f;
}

// ----------------------------------------------------------------------------
// The run

typedef struct {
    const dsrt_train_options *o;
    dsrt_net *net;
    dsrt_optimizer *opt;
    dsrt_train_result *r;
    dsrt_pipeline *p, *vp;
    int32_t *vmap, *vlabels;
    int vbatch;
    uint64_t vbpe;
    size_t n_params, n_state;
    float *best_params, *best_state;
    loop_state ls;
    int best_dirty; /* best weights newer than the last best file */
    dsrt_train_event ev;
    double t0, val_s, train_images_t;
    int stop;
    /* The batch taken for the next step, whether it was copied to the
     * device, and why taking it failed (reported when it is due). */
    dsrt_batch *b;
    int copied;
    int pending;
    char pending_msg[1024];
    /* Batches travel as uint8 NHWC, normalised by the net: (x - sub) / div. */
    int u8;
    float sub_div[2][4];
    size_t bad_told[2];    /* bad samples of the training and validation data told so far */
    uint64_t val_left_out; /* samples left out of the validation passes, summed */
} run;

/* Takes batch `it` (for messages) from the training pipeline. */
static int take_batch(run *R, dsrt_batch **b, int64_t it, int64_t bpe) {
    int rc = dsrt_pipeline_next(R->p, b);
    if (rc == 0) return 0;
    *b = NULL;
    if (rc == DSRT_EEOF)
        return dsrt__fail(DSRT_EEOF, "train: the pipeline ended early at iteration %lld",
                          (long long)it);
    return dsrt__fail_prefix(rc, "train: epoch %lld", (long long)(it / bpe) + 1);
}

/* A pipeline batch as the net takes it. */
static dsrt_net_batch net_batch(const run *R, const dsrt_batch *b) {
    dsrt_net_batch in;
    memset(&in, 0, sizeof in);
    in.data = b->data;
    in.layout = R->u8 ? DSRT_INPUT_U8_NHWC : DSRT_INPUT_F32_NCHW;
    in.labels = b->labels;
    in.n = (int)b->count;
    memcpy(in.sub, R->sub_div[0], sizeof in.sub);
    memcpy(in.div, R->sub_div[1], sizeof in.div);
    return in;
}

/* Starts moving b to the net's device; *copied: its slot may go back once
 * the copy is done. */
static int stage_batch(run *R, dsrt_batch *b, int *copied) {
    dsrt_net_batch in = net_batch(R, b);
    int rc = dsrt_net_stage(R->net, &in);
    if (rc < 0) return dsrt__fail_prefix(rc, "train");
    *copied = rc;
    return 0;
}

/*
 * Whether samples made with a (float NCHW) can travel as uint8 NHWC and be
 * normalised by the net to the same values: the pipeline then writes uint8
 * (a is changed) and sub_div receives the per-channel (x - sub) / div.
 */
static int u8_transfer(dsrt_augment_options *a, float sub_div[2][4]) {
    if (a->layout != DSRT_AUGMENT_F32_NCHW || a->output_channels > 3) return 0;
    for (int c = 0; c < 4; c++) {
        float sub = 0.0f, div = 1.0f;
        int k = c < a->output_channels ? c : 0;
        if (a->norm == DSRT_AUGMENT_NORM_RESCALE) div = 255.0f;
        if (a->norm == DSRT_AUGMENT_NORM_ZEROCENTER || a->norm == DSRT_AUGMENT_NORM_ZSCORE)
            sub = a->mean[k];
        if (a->norm == DSRT_AUGMENT_NORM_ZSCORE) div = a->std[k];
        sub_div[0][c] = sub;
        sub_div[1][c] = div;
    }
    a->layout = DSRT_AUGMENT_U8_NHWC;
    a->norm = DSRT_AUGMENT_NORM_NONE;
    return 1;
}

/* BAD_SAMPLE events for the samples of pipeline p found bad since the last
 * call. Returns 1 when the callback asked to stop. */
static int emit_bad(run *R, dsrt_pipeline *p, int validation) {
    int stop = 0;
    dsrt_bad_sample b[16];
    size_t *told = &R->bad_told[validation];
    for (;;) {
        size_t total = dsrt_pipeline_bad_samples(p, *told, b, DSRT_ARRAY_SIZE(b));
        if (total <= *told) break;
        size_t n = DSRT_MIN(total - *told, DSRT_ARRAY_SIZE(b));
        for (size_t i = 0; i < n; i++) {
            R->ev.kind = DSRT_EVENT_BAD_SAMPLE;
            R->ev.bad_sample = &b[i];
            R->ev.validation = validation;
            stop |= R->o->callback(R->o->callback_ctx, &R->ev) != 0;
        }
        *told += n;
    }
    R->ev.bad_sample = NULL;
    R->ev.validation = 0;
    return stop;
}

static int emit(run *R, dsrt_train_event_kind kind) {
    int stop = 0;
    R->ev.elapsed_s = now_s() - R->t0;
    double ts = R->ev.elapsed_s - R->val_s;
    R->ev.images_per_s = ts > 0 ? (double)R->ev.images / ts : 0;
    if (!R->o->callback) return 0;
    if (R->p) stop |= emit_bad(R, R->p, 0);
    if (R->vp) stop |= emit_bad(R, R->vp, 1);
    R->ev.kind = kind;
    return (R->o->callback(R->o->callback_ctx, &R->ev) != 0) | stop;
}

/* One pass over the validation data: each readable sample once (the
 * pipeline leaves bad ones out rather than repeat another). */
static int validate(run *R, double *loss, double *acc) {
    double t = now_s(), lsum = 0;
    uint64_t images = 0, correct = 0;
    for (uint64_t k = 0; k < R->vbpe; k++) {
        dsrt_batch *b;
        int rc = dsrt_pipeline_next(R->vp, &b);
        if (rc) return dsrt__fail_prefix(rc, "train: validation");
        if (b->count == 0) { /* every sample of the batch bad */
            dsrt_batch_release(R->vp, b);
            continue;
        }
        for (size_t i = 0; i < b->count; i++) R->vlabels[i] = R->vmap[b->labels[i]];
        float l = 0;
        int c = 0;
        rc = dsrt_net_predict(R->net, b->data, (int)b->count, NULL, R->vlabels, &l, &c);
        size_t n = b->count;
        dsrt_batch_release(R->vp, b);
        if (rc) return dsrt__fail_prefix(rc, "train: validation");
        lsum += (double)l * (double)n;
        correct += (uint64_t)c;
        images += n;
    }
    *loss = images ? lsum / (double)images : NAN;
    *acc = images ? (double)correct / (double)images : NAN;
    R->val_s += now_s() - t;
    R->val_left_out += dsrt_datastore_count(R->o->validation) - images;
    return 0;
}

static int save_checkpoint(run *R, int64_t epochs_done, int64_t iteration) {
    const dsrt_train_options *o = R->o;
    double t = now_s();
    size_t np = 0;
    const float *w = dsrt_net_params(R->net, &np);
    if (!all_finite(w, np))
        return dsrt__fail(DSRT_ENAN,
                          "train: epoch %lld, iteration %lld: the weights are not finite; no "
                          "checkpoint written",
                          (long long)epochs_done, (long long)iteration);
    size_t dl = strlen(o->checkpoint_path) + 96;
    char *path = dsrt__malloc(dl), *spath = dsrt__malloc(dl + 8), *bpath = dsrt__malloc(dl);
    int rc = -ENOMEM;
    if (!path || !spath || !bpath) goto out;
    dsrt_train_position pos = {epochs_done, iteration, R->r->seed};
    if (R->best_dirty && R->best_params) {
        /* The best weights so far, as a model file the state names. */
        char name[64];
        snprintf(name, sizeof name, "dsrt_best_i%09lld.dsrt", (long long)R->ls.best_iteration);
        snprintf(bpath, dl, "%s/%s", o->checkpoint_path, name);
        /* Swap the best weights in, save, swap back. */
        size_t n;
        float *pp = dsrt_net_params(R->net, &n), *ss = dsrt_net_state(R->net, NULL);
        float *keep_p = dsrt__malloc(R->n_params * sizeof(float) + 1);
        float *keep_s = dsrt__malloc(R->n_state * sizeof(float) + 1);
        if (!keep_p || !keep_s) {
            free(keep_p);
            free(keep_s);
            goto out;
        }
        memcpy(keep_p, pp, R->n_params * sizeof(float));
        memcpy(keep_s, ss, R->n_state * sizeof(float));
        memcpy(pp, R->best_params, R->n_params * sizeof(float));
        memcpy(ss, R->best_state, R->n_state * sizeof(float));
        rc = dsrt_model_save(bpath, R->net);
        memcpy(pp, keep_p, R->n_params * sizeof(float));
        memcpy(ss, keep_s, R->n_state * sizeof(float));
        free(keep_p);
        free(keep_s);
        if (rc) goto out;
        snprintf(R->ls.best_file, sizeof R->ls.best_file, "%s", name);
        R->best_dirty = 0;
    }
    snprintf(path, dl, "%s/" CKPT_PREFIX "e%03lld_i%09lld" CKPT_SUFFIX, o->checkpoint_path,
             (long long)epochs_done, (long long)iteration);
    snprintf(spath, dl + 8, "%s" STATE_SUFFIX, path);
    if ((rc = write_state(spath, &R->ls, &pos))) goto out;
    if ((rc = dsrt_checkpoint_save(path, R->net, R->opt, &pos))) goto out;
    snprintf(R->r->checkpoint, sizeof R->r->checkpoint, "%s", path);
    R->r->checkpoint_s += now_s() - t;
    R->ev.checkpoint = R->r->checkpoint;
    if (emit(R, DSRT_EVENT_CHECKPOINT)) R->stop = DSRT_STOP_CALLBACK + 1;
    R->ev.checkpoint = NULL;
out:
    free(path);
    free(spath);
    free(bpath);
    return rc;
}

/* Loads the checkpoint to resume from into the run: weights, state,
 * optimizer, position and loop state. */
static int load_resume(run *R, dsrt_train_position *pos, char *used, size_t used_size) {
    const dsrt_train_options *o = R->o;
    struct stat st;
    int rc;
    if (stat(o->resume, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((rc = dsrt_checkpoint_latest(o->resume, used, used_size)))
            return dsrt__fail_prefix(rc, "train: resume");
    } else {
        snprintf(used, used_size, "%s", o->resume);
    }
    dsrt_net *c = NULL;
    dsrt_optimizer *copt = NULL;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    if ((rc = dsrt_checkpoint_load(used, &c, &copt, pos, &no)))
        return dsrt__fail_prefix(rc, "train: resume");
    size_t cp, cs;
    float *src_p = dsrt_net_params(c, &cp), *src_s = dsrt_net_state(c, &cs);
    if (strcmp(dsrt_net_description(c), dsrt_net_description(R->net)) != 0 || cp != R->n_params ||
        cs != R->n_state) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: the checkpoint's network is not the one given "
                        "(description or size differ)",
                        used);
        goto out;
    }
    if (!copt) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: a model file, not a checkpoint (no "
                        "optimizer state)",
                        used);
        goto out;
    }
    memcpy(dsrt_net_params(R->net, NULL), src_p, cp * sizeof(float));
    memcpy(dsrt_net_state(R->net, NULL), src_s, cs * sizeof(float));
    dsrt_net_params_changed(R->net);
    dsrt_net_set_iteration(R->net, pos->iteration);
    dsrt_optimizer_options co = dsrt_optimizer_get_options(copt);
    if (co.solver != o->optimizer.solver) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: the checkpoint's solver (%d) is not the "
                        "options' (%d)",
                        used, (int)co.solver, (int)o->optimizer.solver);
        goto out;
    }
    if ((rc = dsrt_optimizer_copy_state(R->opt, copt))) {
        dsrt__fail_prefix(rc, "train: resume: %s", used);
        goto out;
    }

    /* The loop's own state, and the best weights it names. */
    char *sp = dsrt__malloc(strlen(used) + 8);
    if (!sp) {
        rc = -ENOMEM;
        goto out;
    }
    sprintf(sp, "%s" STATE_SUFFIX, used);
    loop_state s;
    if (read_state(sp, &s, pos->iteration)) {
        R->ls.bad_count = s.bad_count;
        R->ls.best_val_loss = s.best_val_loss;
        R->ls.best_iteration = s.best_iteration;
        R->ls.last_val_loss = s.last_val_loss;
        R->ls.last_val_accuracy = s.last_val_accuracy;
        memcpy(R->ls.best_file, s.best_file, sizeof s.best_file);
        if (s.batch != o->batch || s.drop_last != o->drop_last || s.samples != R->ls.samples) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "train: resume: %s: made with batch %lld, drop_last %d over %lld "
                            "samples; the options say batch %d, drop_last %d over %lld samples",
                            used, (long long)s.batch, s.drop_last, (long long)s.samples, o->batch,
                            o->drop_last, (long long)R->ls.samples);
            free(sp);
            goto out;
        }
    }
    free(sp);
    if (R->best_params && R->ls.best_file[0]) {
        char *dir = dsrt__strdup(used);
        char *bp = dir ? dsrt__malloc(strlen(used) + sizeof R->ls.best_file + 2) : NULL;
        dsrt_net *b = NULL;
        if (!dir || !bp) {
            free(dir);
            rc = -ENOMEM;
            goto out;
        }
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[1] = '\0';
        else
            dir[0] = '\0';
        sprintf(bp, "%s%s", dir, R->ls.best_file);
        if (dsrt_model_load(&b, bp, &no) == 0 && dsrt_net_params(b, NULL) &&
            strcmp(dsrt_net_description(b), dsrt_net_description(R->net)) == 0) {
            memcpy(R->best_params, dsrt_net_params(b, NULL), R->n_params * sizeof(float));
            memcpy(R->best_state, dsrt_net_state(b, NULL), R->n_state * sizeof(float));
        } else {
            /* Without the file the best so far is unknown: start afresh. */
            dsrt__clear_error();
            R->ls.best_val_loss = NAN;
            R->ls.best_iteration = -1;
            R->ls.best_file[0] = '\0';
        }
        dsrt_net_destroy(b);
        free(dir);
        free(bp);
    }
    rc = 0;
out:
    dsrt_optimizer_destroy(copt);
    dsrt_net_destroy(c);
    return rc;
}

/* Records a validation result: best weights, patience. */
static void after_validation(run *R, double vl, double va, int64_t iteration) {
    R->ls.last_val_loss = vl;
    R->ls.last_val_accuracy = va;
    if (isnan(R->ls.best_val_loss) || vl < R->ls.best_val_loss) {
        R->ls.best_val_loss = vl;
        R->ls.best_iteration = iteration;
        R->ls.bad_count = 0;
        if (R->best_params) {
            memcpy(R->best_params, dsrt_net_params(R->net, NULL), R->n_params * sizeof(float));
            memcpy(R->best_state, dsrt_net_state(R->net, NULL), R->n_state * sizeof(float));
            R->best_dirty = 1;
        }
    } else {
        R->ls.bad_count++;
    }
}

static int make_dir(const char *path) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    return dsrt__fail(-errno, "train: checkpoint_path: %s: %s", path, strerror(errno));
}

int dsrt_train(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *options,
               dsrt_train_result *res) {
    dsrt_train_options defaults = dsrt_train_defaults();
    const dsrt_train_options *o = options ? options : &defaults;
    dsrt_train_result local;
    dsrt_train_result *r = res ? res : &local;
    memset(r, 0, sizeof *r);
    r->stop = DSRT_STOP_ERROR;
    r->val_loss = r->val_accuracy = r->best_val_loss = NAN;
    r->best_iteration = -1;
    r->seed = o->seed;
    r->loss = r->accuracy = NAN;

    run R;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.net = net;
    R.r = r;
    loop_state_init(&R.ls);
    cores_plan cp;
    memset(&cp, 0, sizeof cp);
    int rc = dsrt_train_check(o, net, train);
    if (rc) return rc;

    /* The net computes where the execution environment says. */
    int device = DSRT_DEVICE_CPU;
    if ((rc = resolve_device(o, &device))) return rc;
    if ((rc = dsrt_net_set_device(net, device))) return dsrt__fail_prefix(rc, "train");
    double busy0, idle0;
    dsrt_net_device_time(net, &busy0, &idle0);

    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    dsrt_net_params(net, &R.n_params);
    dsrt_net_state(net, &R.n_state);
    R.ls.batch = o->batch;
    R.ls.samples = (int64_t)dsrt_datastore_count(train);
    R.ls.drop_last = o->drop_last;
    dsrt_augment_options aug, vaug;
    resolve_augment(&o->augment, &ni, &aug, "train");
    vaug = aug;
    fixed_augment(&vaug);
    R.u8 = (o->uint8_batches == 1 || (o->uint8_batches < 0 && ni.device >= 0)) &&
           u8_transfer(&aug, R.sub_div);

    if ((rc = dsrt_optimizer_create(&R.opt, net, &o->optimizer))) goto done;
    if (o->output_network == DSRT_OUTPUT_BEST_VALIDATION) {
        R.best_params = dsrt__malloc(R.n_params * sizeof(float) + 1);
        R.best_state = dsrt__malloc(R.n_state * sizeof(float) + 1);
        if (!R.best_params || !R.best_state) {
            rc = -ENOMEM;
            goto done;
        }
    }
    if (o->validation &&
        (rc = class_map(net, o->validation, train, ni.classes, "train: validation data", &R.vmap)))
        goto done;

    /* The position: a checkpoint's, or the start. */
    dsrt_train_position pos = {0, 0, o->seed};
    if (o->resume) {
        if ((rc = load_resume(&R, &pos, r->checkpoint, sizeof r->checkpoint))) goto done;
        r->seed = pos.seed;
    }
    if (o->checkpoint_path && (rc = make_dir(o->checkpoint_path))) goto done;

    /* Cores, then the pipelines on the worker cores. */
    if ((rc = cores_open(&cp, o->cpus, o->pin, o->workers, o->compute_threads, &ni, net, "train")))
        goto done;
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = (size_t)o->batch;
    po.prefetch = o->prefetch;
    po.threads = cp.workers;
    po.cpus = cp.worker_cpus;
    po.pin = o->pin;
    po.drop_last = o->drop_last;
    po.shuffle = o->shuffle;
    po.seed = r->seed;
    po.epochs = (uint64_t)o->max_epochs;
    po.fail_on_error = o->fail_on_error;
    po.gpu = ni.device;
    if (o->read_depth) po.reader.depth = o->read_depth;
    if ((rc = dsrt_pipeline_open(&R.p, train, &aug, &po))) {
        dsrt__fail_prefix(rc, "train");
        goto done;
    }
    if (o->validation) {
        dsrt_pipeline_options vo = po;
        R.vbatch = o->validation_batch ? o->validation_batch : o->batch;
        vo.batch = (size_t)R.vbatch;
        vo.prefetch = 2;
        vo.drop_last = 0;
        vo.shuffle = DSRT_SHUFFLE_NEVER;
        vo.epochs = 0;
        vo.drop_bad = 1;
        if ((rc = dsrt_pipeline_open(&R.vp, o->validation, &vaug, &vo))) {
            dsrt__fail_prefix(rc, "train: validation");
            goto done;
        }
        R.vbpe = dsrt_pipeline_batches_per_epoch(R.vp);
        R.vlabels = dsrt__calloc((size_t)R.vbatch, sizeof *R.vlabels);
        if (!R.vlabels) {
            rc = -ENOMEM;
            goto done;
        }
    }
    int64_t bpe = (int64_t)dsrt_pipeline_batches_per_epoch(R.p);
    int64_t max_it = bpe * o->max_epochs;
    int64_t it = pos.iteration, epoch0 = pos.epoch;
    if (o->resume) {
        int64_t in_epoch = it - epoch0 * bpe;
        if (epoch0 < 0 || in_epoch < 0 || in_epoch >= bpe || it > max_it) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "train: resume: %s: epoch %lld, iteration %lld do not fit %lld "
                            "batches an epoch and max_epochs %d",
                            r->checkpoint, (long long)epoch0, (long long)it, (long long)bpe,
                            o->max_epochs);
            goto done;
        }
        if (it < max_it && (rc = dsrt_pipeline_reset(R.p, (uint64_t)epoch0, (uint64_t)in_epoch)))
            goto done;
    }
    r->start_iteration = it;
    r->iterations = it;
    r->epochs = epoch0;

    cores_start_compute(&cp);
    r->workers = cp.workers;
    r->compute_threads = cp.threads;
    r->pinned = cp.team_pinned;

    /* The loop. */
    R.t0 = now_s();
    dsrt_train_event *ev = &R.ev;
    ev->max_epochs = o->max_epochs;
    ev->iterations_per_epoch = bpe;
    ev->max_iterations = max_it;
    ev->iteration = it;
    ev->epoch = epoch0 + (it < max_it ? 1 : 0);
    ev->batch_in_epoch = it - epoch0 * bpe;
    ev->learn_rate = dsrt_optimizer_learn_rate(R.opt, (int)epoch0);
    ev->loss = ev->accuracy = ev->val_loss = ev->val_accuracy = NAN;
    ev->workers = cp.workers;
    ev->compute_threads = cp.threads;
    ev->pinned = cp.team_pinned;
    if (emit(&R, DSRT_EVENT_START)) R.stop = DSRT_STOP_CALLBACK + 1;
    int validated_last = 0;
    if (it < max_it && (rc = take_batch(&R, &R.b, it, bpe))) goto done;
    if (R.b && (rc = stage_batch(&R, R.b, &R.copied))) goto done;
    while (!R.stop && it < max_it) {
        dsrt_batch *b = R.b;
        if (!b) {
            /* Taking this batch failed during the last step. */
            rc = dsrt__fail(R.pending, "%s", R.pending_msg);
            goto done;
        }
        int64_t epoch = (int64_t)b->epoch;
        int64_t index = (int64_t)b->index;
        int end_of_epoch = index == bpe - 1;
        size_t count = b->count;
        float loss = 0;
        int correct = 0;
        dsrt_net_batch in = net_batch(&R, b);
        R.b = NULL;
        if (R.copied) {
            /* The copy is done: the slot goes back to the workers now. */
            rc = dsrt_net_stage_wait(net);
            dsrt_batch_release(R.p, b);
            b = NULL;
        }
        if (rc == 0) rc = dsrt_net_train_start(net, &in);
        if (rc == 0) {
            /* While the step runs: the next batch, on its way to the device.
             * A failure to take it is reported when it is due. */
            R.copied = 0;
            if (it + 1 < max_it) {
                int rn = take_batch(&R, &R.b, it + 1, bpe);
                if (rn == 0 && (rn = stage_batch(&R, R.b, &R.copied)) != 0) {
                    dsrt_batch_release(R.p, R.b);
                    R.b = NULL;
                }
                if (rn) {
                    R.pending = rn;
                    snprintf(R.pending_msg, sizeof R.pending_msg, "%s", dsrt_last_error());
                }
            }
            rc = dsrt_net_train_finish(net, &loss, &correct);
        }
        if (b) dsrt_batch_release(R.p, b);
        if (rc == 0 && !isfinite(loss)) rc = DSRT_ENAN;
        if (rc == DSRT_ENAN) {
            rc = dsrt__fail(
                DSRT_ENAN,
                "train: epoch %lld, iteration %lld: the loss is not finite (%g): training "
                "stopped "
                "(learn rate %g too high? try a lower one or a gradient threshold); "
                "%s%s",
                (long long)epoch + 1, (long long)it + 1, (double)loss,
                dsrt_optimizer_learn_rate(R.opt, (int)epoch),
                r->checkpoint[0] ? "the last good checkpoint is "
                                 : "no checkpoint "
                                   "was written",
                r->checkpoint);
            goto done;
        }
        if (rc) {
            dsrt__fail_prefix(rc, "train: epoch %lld, iteration %lld", (long long)epoch + 1,
                              (long long)it + 1);
            goto done;
        }
        if ((rc = dsrt_optimizer_step(R.opt, net, (int)epoch))) goto done;
        it++;
        r->images += count;
        r->iterations = it;
        r->loss = loss;
        r->accuracy = (double)correct / (double)count;
        ev->images = r->images;
        ev->iteration = it;
        ev->epoch = epoch + 1;
        ev->batch_in_epoch = index + 1;
        ev->learn_rate = dsrt_optimizer_learn_rate(R.opt, (int)epoch);
        ev->loss = loss;
        ev->accuracy = r->accuracy;
        ev->val_loss = ev->val_accuracy = NAN;

        int validate_now =
            R.vp && ((o->validation_frequency > 0 && it % o->validation_frequency == 0) ||
                     (o->validation_frequency == 0 && end_of_epoch) || it == max_it);
        if (validate_now) {
            double vl, va;
            if ((rc = validate(&R, &vl, &va))) goto done;
            /* Validation staged batches of its own where the next training
             * batch waits on the device: that batch goes again (its slot is
             * still held), or the step would read what validation left. */
            if (R.b && R.copied && (rc = stage_batch(&R, R.b, &R.copied))) goto done;
            after_validation(&R, vl, va, it);
            ev->val_loss = r->val_loss = vl;
            ev->val_accuracy = r->val_accuracy = va;
        }
        validated_last = validate_now;
        ev->verbose = it == r->start_iteration + 1 || it % o->verbose_frequency == 0 ||
                      it == max_it || validate_now;
        if (emit(&R, DSRT_EVENT_ITERATION)) R.stop = DSRT_STOP_CALLBACK + 1;
        if (validate_now) {
            if (emit(&R, DSRT_EVENT_VALIDATION)) R.stop = DSRT_STOP_CALLBACK + 1;
            if (o->validation_patience > 0 && R.ls.bad_count >= o->validation_patience && !R.stop)
                R.stop = DSRT_STOP_PATIENCE + 1;
        }
        if (end_of_epoch) {
            r->epochs = epoch + 1;
            if (emit(&R, DSRT_EVENT_EPOCH)) R.stop = DSRT_STOP_CALLBACK + 1;
        }
        int ckpt =
            o->checkpoint_path &&
            ((o->checkpoint_unit == DSRT_UNIT_EPOCH && end_of_epoch &&
              (epoch + 1) % o->checkpoint_frequency == 0) ||
             (o->checkpoint_unit == DSRT_UNIT_ITERATION && it % o->checkpoint_frequency == 0));
        if (ckpt && (rc = save_checkpoint(&R, end_of_epoch ? epoch + 1 : epoch, it))) goto done;
    }

    /* After the last iteration: the final checkpoint (unless one was just
     * written), then a validation if the run stopped early without one. It
     * only reports: the checkpoint holds the state of the loop as the
     * uninterrupted run has it. */
    if (o->checkpoint_path && it > r->start_iteration) {
        char want[64];
        snprintf(want, sizeof want, "_i%09lld" CKPT_SUFFIX, (long long)it);
        size_t lc = strlen(r->checkpoint), lw = strlen(want);
        if (lc < lw || strcmp(r->checkpoint + lc - lw, want) != 0) {
            if ((rc = save_checkpoint(&R, it / bpe, it))) goto done;
        }
    }
    if (R.vp && !validated_last && it > r->start_iteration) {
        double vl, va;
        if ((rc = validate(&R, &vl, &va))) goto done;
        ev->val_loss = r->val_loss = vl;
        ev->val_accuracy = r->val_accuracy = va;
        emit(&R, DSRT_EVENT_VALIDATION);
    }
    if (R.best_params && !isnan(R.ls.best_val_loss) && R.ls.best_iteration != it) {
        memcpy(dsrt_net_params(net, NULL), R.best_params, R.n_params * sizeof(float));
        memcpy(dsrt_net_state(net, NULL), R.best_state, R.n_state * sizeof(float));
        dsrt_net_params_changed(net);
    }
    r->stop = R.stop ? (dsrt_stop_reason)(R.stop - 1) : DSRT_STOP_MAX_EPOCHS;
    rc = 0;

done:
    /* A batch taken ahead of a stop or failure goes back unused. */
    if (R.b) {
        if (R.copied) dsrt_net_stage_wait(net);
        dsrt_batch_release(R.p, R.b);
        R.b = NULL;
    }
    double wall = R.t0 > 0 ? now_s() - R.t0 : 0;
    r->val_s = R.val_s;
    r->train_s = wall - R.val_s;
    r->images_per_s = r->train_s > 0 ? (double)r->images / r->train_s : 0;
    r->best_val_loss = R.ls.best_val_loss;
    r->best_iteration = R.ls.best_iteration;
    if (isnan(r->val_loss)) {
        r->val_loss = R.ls.last_val_loss;
        r->val_accuracy = R.ls.last_val_accuracy;
    }
    if (R.p) {
        dsrt_pipeline_statistics s;
        dsrt_pipeline_stats(R.p, &s);
        r->consumer_wait_s = s.consumer_wait_s;
        r->skipped = s.skipped;
        r->bad_samples = s.bad_samples;
    }
    if (R.vp) {
        dsrt_pipeline_statistics s;
        dsrt_pipeline_stats(R.vp, &s);
        r->val_skipped = R.val_left_out; /* not s.skipped: that counts prefetched passes */
        r->val_bad_samples = s.bad_samples;
    }
    r->weights_checksum = dsrt_weights_checksum(net);
    r->device = ni.device;
    dsrt_net_device_time(net, &r->device_busy_s, &r->device_idle_s);
    r->device_busy_s -= busy0;
    r->device_idle_s -= idle0;
    if (rc) r->stop = DSRT_STOP_ERROR;
    if (R.t0 > 0) {
        /* The END event keeps the thread's message: callbacks may call dsrt. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dsrt_last_error());
        R.ev.status = rc;
        R.ev.val_loss = r->val_loss;
        R.ev.val_accuracy = r->val_accuracy;
        emit(&R, DSRT_EVENT_END);
        if (rc) dsrt__fail(rc, "%s", msg);
    }
    dsrt_pipeline_close(R.vp);
    dsrt_pipeline_close(R.p);
    cores_close(&cp);
    dsrt_optimizer_destroy(R.opt);
    free(R.best_params);
    free(R.best_state);
    free(R.vmap);
    free(R.vlabels);
    return rc;
}

// ----------------------------------------------------------------------------
// Evaluation

void dsrt_eval_result_free(dsrt_eval_result *r) {
    if (!r) return;
    free(r->confusion);
    r->confusion = NULL;
    free(r->bad);
    r->bad = NULL;
}

/* Copies the bad samples of p into r->bad: one block, the array followed by
 * its strings, so that the result owns them after the pipeline closes. */
static int copy_bad(dsrt_pipeline *p, dsrt_eval_result *r) {
    size_t n = dsrt_pipeline_bad_samples(p, 0, NULL, 0);
    r->bad_samples = n;
    if (n == 0) return 0;
    dsrt_bad_sample *list = dsrt__malloc(n * sizeof *list);
    if (!list) return -ENOMEM;
    n = DSRT_MIN(n, dsrt_pipeline_bad_samples(p, 0, list, n));
    size_t text = 0;
    for (size_t i = 0; i < n; i++)
        text += (list[i].path ? strlen(list[i].path) + 1 : 0) + strlen(list[i].error) + 1;
    char *block = dsrt__malloc(n * sizeof *list + text);
    if (!block) {
        free(list);
        return -ENOMEM;
    }
    dsrt_bad_sample *out = (dsrt_bad_sample *)block;
    char *at = block + n * sizeof *list;
    for (size_t i = 0; i < n; i++) {
        out[i] = list[i];
        if (list[i].path) {
            out[i].path = strcpy(at, list[i].path);
            at += strlen(at) + 1;
        }
        out[i].error = strcpy(at, list[i].error);
        at += strlen(at) + 1;
    }
    free(list);
    r->bad = out;
    r->bad_samples = n;
    return 0;
}

int dsrt_evaluate(dsrt_net *net, const dsrt_datastore *ds, const dsrt_eval_options *options,
                  dsrt_eval_result *r) {
    dsrt_eval_options defaults = dsrt_eval_defaults();
    const dsrt_eval_options *o = options ? options : &defaults;
    if (!net || !ds || !r) return dsrt__fail(-EINVAL, "evaluate: no net, data or result");
    memset(r, 0, sizeof *r);
    if (o->batch < 1 || o->batch > MAX_BATCH)
        return dsrt__fail(DSRT_EOPTION, "evaluate: batch: %d: not in [1, %d]", o->batch, MAX_BATCH);
    if (o->compute_threads < 0 || o->compute_threads > 4096 || o->workers > 1024)
        return dsrt__fail(DSRT_EOPTION, "evaluate: compute_threads %d / workers %u out of range",
                          o->compute_threads, o->workers);
    if (o->pin != 0 && o->pin != 1)
        return dsrt__fail(DSRT_EOPTION, "evaluate: pin: %d: not 0 or 1", o->pin);
    if (o->read_depth > 4096)
        return dsrt__fail(DSRT_EOPTION, "evaluate: read_depth: %u: not in [0, 4096]",
                          o->read_depth);
    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    dsrt_augment_options aug;
    int rc = resolve_augment(&o->augment, &ni, &aug, "evaluate");
    if (rc) return rc;
    fixed_augment(&aug);
    int32_t *map = NULL, *labels = NULL;
    float *scores = NULL;
    dsrt_pipeline *p = NULL;
    cores_plan cp;
    memset(&cp, 0, sizeof cp);
    if ((rc = class_map(net, ds, NULL, ni.classes, "evaluate: data", &map))) return rc;
    int C = ni.classes;
    r->classes = C;
    r->confusion = dsrt__calloc((size_t)C * (size_t)C, sizeof *r->confusion);
    labels = dsrt__calloc((size_t)o->batch, sizeof *labels);
    scores = dsrt__malloc((size_t)o->batch * (size_t)C * sizeof *scores);
    if (!r->confusion || !labels || !scores) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = cores_open(&cp, o->cpus, o->pin, o->workers, o->compute_threads, &ni, net,
                         "evaluate")))
        goto out;
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = (size_t)o->batch;
    po.threads = cp.workers;
    po.cpus = cp.worker_cpus;
    po.pin = o->pin;
    po.shuffle = DSRT_SHUFFLE_NEVER;
    po.epochs = 1;
    po.fail_on_error = o->fail_on_error;
    po.drop_bad = 1; /* each readable sample once, none in the place of a bad one */
    if (o->read_depth) po.reader.depth = o->read_depth;
    if ((rc = dsrt_pipeline_open(&p, ds, &aug, &po))) {
        dsrt__fail_prefix(rc, "evaluate");
        goto out;
    }
    cores_start_compute(&cp);
    double t0 = now_s(), lsum = 0;
    dsrt_batch *b;
    while ((rc = dsrt_pipeline_next(p, &b)) == 0) {
        int n = (int)b->count;
        if (n == 0) { /* every sample of the batch bad */
            dsrt_batch_release(p, b);
            continue;
        }
        for (int i = 0; i < n; i++) labels[i] = map[b->labels[i]];
        float l = 0;
        int c = 0;
        rc = dsrt_net_predict(net, b->data, n, scores, labels, &l, &c);
        dsrt_batch_release(p, b);
        if (rc) {
            dsrt__fail_prefix(rc, "evaluate");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            const float *s = scores + (size_t)i * C;
            int best = 0;
            for (int k = 1; k < C; k++)
                if (s[k] > s[best]) best = k;
            r->confusion[(size_t)labels[i] * C + best]++;
        }
        lsum += (double)l * n;
        r->correct += (uint64_t)c;
        r->images += (uint64_t)n;
    }
    if (rc != DSRT_EEOF) {
        dsrt__fail_prefix(rc, "evaluate");
        goto out;
    }
    if ((rc = copy_bad(p, r))) goto out;
    r->seconds = now_s() - t0;
    r->images_per_s = r->seconds > 0 ? (double)r->images / r->seconds : 0;
    r->accuracy = r->images ? (double)r->correct / (double)r->images : NAN;
    r->loss = r->images ? lsum / (double)r->images : NAN;
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    r->skipped = s.skipped;
out:
    dsrt_pipeline_close(p);
    cores_close(&cp);
    free(map);
    free(labels);
    free(scores);
    if (rc) dsrt_eval_result_free(r);
    return rc;
}
