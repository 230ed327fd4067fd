/*
 * The training loop's options and their checks, the split of the cores
 * between pipeline workers and compute threads, and evaluation. The run
 * itself is run.c; its checkpoints checkpoint.c.
 *
 * The split of the cores. The pipeline's share of the work per image is
 * estimated from the sample size (loading) and the net's train_flops
 * (computing); see dsrt_train_options.workers. The net's compute threads are
 * bound to their cores once at the start (dsrt_net_run_on_threads: the CPU
 * backend's team keeps its threads for the whole run) and given back the
 * caller's affinity at the end. On a GPU the calling thread only queues work:
 * it keeps one core and the workers, pinned to the cores nearest the device,
 * get the others.
 */
#include "runtime/train/internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    o.comm = NULL;
    o.gpus = 0;
    o.comm_options = dsrt_comm_defaults();
    o.averaging_frequency = 0;
    o.average_optimizer_state = 0;
    o.bn_statistics = DSRT_BN_AVERAGE;
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
    o.mix_prob = 1.0;
    o.mix_switch_prob = 0.5;
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

/* The device the options' execution environment means: DSRT_DEVICE_CPU or a
 * GPU index. Fails, naming the option, when it is not there. */
int dsrt__train_resolve_device(const dsrt_train_options *o, int *device) {
    /* Only auto and multi-gpu count the devices: cpu loads no GPU library. */
    int auto_or_multi = o->execution == DSRT_EXEC_AUTO || o->execution == DSRT_EXEC_MULTI_GPU;
    int n = auto_or_multi ? dsrt_gpu_count() : 0, want = o->gpu < 0 ? 0 : o->gpu, dev;
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
    case DSRT_EXEC_PARALLEL: {
        /* The worker computes where its communicator works: gpu, or the CPU. */
        if (!o->comm)
            return dsrt__fail(DSRT_EOPTION,
                              "train: execution_environment (ExecutionEnvironment) 'parallel': "
                              "no communicator (comm: dsrt_comm_open in every process of the MPI "
                              "job)");
        int rc = o->gpu >= 0 ? dsrt_gpu_check(o->gpu) : 0;
        if (rc)
            return dsrt__fail_prefix(rc,
                                     "train: execution_environment (ExecutionEnvironment) "
                                     "'parallel': gpu %d",
                                     o->gpu);
        dev = o->gpu >= 0 ? o->gpu : DSRT_DEVICE_CPU;
        break;
    }
    case DSRT_EXEC_MULTI_GPU: {
        int rc = dsrt_comm_available(DSRT_COMM_NCCL);
        if (rc)
            return dsrt__fail_prefix(rc, "train: execution_environment (ExecutionEnvironment) "
                                         "'multi-gpu'");
        if (n < 1)
            return dsrt__fail(DSRT_ENODEVICE,
                              "train: execution_environment (ExecutionEnvironment) 'multi-gpu': "
                              "no CUDA device is visible (see CUDA_VISIBLE_DEVICES); use cpu, "
                              "or parallel under mpirun for CPU workers");
        if (o->gpus > n)
            return dsrt__fail(DSRT_ENODEVICE, "train: gpus: %d: only %d CUDA device%s visible",
                              o->gpus, n, n == 1 ? " is" : "s are");
        dev = 0;
        break;
    }
    default:
        return dsrt__fail(DSRT_EOPTION,
                          "train: execution_environment (ExecutionEnvironment): %d: "
                          "unknown",
                          (int)o->execution);
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
#undef BAD

/* The augment options with the net's input size filled in and checked. */
int dsrt__train_resolve_augment(const dsrt_augment_options *in, const dsrt_net_info *ni,
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

/* The same without random transforms (geometric, colour, erasing):
 * validation and evaluation samples. */
void dsrt__train_fixed_augment(dsrt_augment_options *a) {
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
    /* The random-resized crop evaluates as torchvision's recipe does:
     * Resize(256) then CenterCrop(224), scaled to the output. */
    if (a->size_mode == DSRT_AUGMENT_RANDRESIZEDCROP) {
        a->size_mode = DSRT_AUGMENT_CENTERCROP;
        int side = a->output_height < a->output_width ? a->output_height : a->output_width;
        if (a->resize_shorter == 0) a->resize_shorter = (int)lround(side * 256.0 / 224.0);
    }
    memcpy(a->brightness, d.brightness, sizeof a->brightness);
    memcpy(a->contrast, d.contrast, sizeof a->contrast);
    memcpy(a->saturation, d.saturation, sizeof a->saturation);
    memcpy(a->hue, d.hue, sizeof a->hue);
    a->grayscale_probability = 0.0;
    a->erase_probability = 0.0;
}

/*
 * map[c] = the net's class for class c of ds: by name when the net's
 * description names its classes, else by name against ref (the training
 * data), else by index. Fails with DSRT_EOPTION naming an unknown class.
 */
int dsrt__train_class_map(const dsrt_net *net, const dsrt_datastore *ds, const dsrt_datastore *ref,
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

/* The checks' failure: the option and why, prefixed "train: ". */
#define BADO(cond, fmt, ...)                                                                       \
    if (!(cond)) return dsrt__fail(DSRT_EOPTION, "train: " fmt, __VA_ARGS__)

/* Refuses the loop's state file kept beside a checkpoint given where the
 * checkpoint is meant, naming the checkpoint. */
static int check_not_state(const char *path) {
    char head[sizeof STATE_MAGIC] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0; /* the load says why */
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    if (n != sizeof head - 1 || memcmp(head, STATE_MAGIC, n) != 0) return 0;
    size_t len = strlen(path), ns = strlen(STATE_SUFFIX);
    if (len > ns && !strcmp(path + len - ns, STATE_SUFFIX))
        return dsrt__fail(DSRT_EOPTION,
                          "train: resume: %s: the state of the training loop kept beside a "
                          "checkpoint, not the checkpoint: give %.*s",
                          path, (int)(len - ns), path);
    return dsrt__fail(DSRT_EOPTION,
                      "train: resume: %s: the state of the training loop kept beside a "
                      "checkpoint, not the checkpoint",
                      path);
}

/* The options of the loop: epochs, batches, optimizer, validation,
 * checkpoints, resume. */
static int check_loop(const dsrt_train_options *o) {
    int rc;
    BADO(o->max_epochs >= 1 && o->max_epochs <= MAX_EPOCHS,
         "max_epochs (MaxEpochs): %d: not in [1, %d]", o->max_epochs, MAX_EPOCHS);
    BADO(o->batch >= 1 && o->batch <= MAX_BATCH, "batch (MiniBatchSize): %d: not in [1, %d]",
         o->batch, MAX_BATCH);
    BADO((unsigned)o->shuffle <= DSRT_SHUFFLE_EVERY_EPOCH, "shuffle: %d: unknown", (int)o->shuffle);
    BADO(o->drop_last == 0 || o->drop_last == 1, "drop_last: %d: not 0 or 1", o->drop_last);
    BADO(o->mixup_alpha >= 0 && isfinite(o->mixup_alpha), "mixup_alpha: %g: must be 0 or positive",
         o->mixup_alpha);
    BADO(o->cutmix_alpha >= 0 && isfinite(o->cutmix_alpha),
         "cutmix_alpha: %g: must be 0 or positive", o->cutmix_alpha);
    BADO((o->cutmix_minmax[0] == 0 && o->cutmix_minmax[1] == 0) ||
             (o->cutmix_minmax[0] > 0 && o->cutmix_minmax[0] < o->cutmix_minmax[1] &&
              o->cutmix_minmax[1] <= 1),
         "cutmix_minmax: [%g, %g]: need 0 < min < max <= 1, or both 0", o->cutmix_minmax[0],
         o->cutmix_minmax[1]);
    BADO(o->mix_prob >= 0 && o->mix_prob <= 1, "mix_prob: %g: not in [0, 1]", o->mix_prob);
    BADO(o->mix_switch_prob >= 0 && o->mix_switch_prob <= 1, "mix_switch_prob: %g: not in [0, 1]",
         o->mix_switch_prob);
    BADO(o->label_smoothing >= 0 && o->label_smoothing < 1, "label_smoothing: %g: not in [0, 1)",
         o->label_smoothing);
    rc = check_optimizer(&o->optimizer);
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
        if (S_ISREG(st.st_mode) && (rc = check_not_state(o->resume))) return rc;
    }
    return 0;
}

/* Where it runs: devices, workers, averaging. */
static int check_execution(const dsrt_train_options *o) {
    BADO((unsigned)o->execution <= DSRT_EXEC_PARALLEL,
         "execution_environment (ExecutionEnvironment): %d: unknown", (int)o->execution);
    BADO(o->gpu >= -1, "gpu: %d: not a device index (-1: the first)", o->gpu);
    BADO(o->uint8_batches >= -1 && o->uint8_batches <= 1, "uint8_batches: %d: not -1, 0 or 1",
         o->uint8_batches);
    BADO(o->gpus >= 0, "gpus: %d: must be >= 0 (0: every visible GPU)", o->gpus);
    BADO(o->averaging_frequency >= 0,
         "averaging_frequency: %d: must be >= 0 (0: gradients summed at every step)",
         o->averaging_frequency);
    BADO(o->average_optimizer_state == 0 || o->average_optimizer_state == 1,
         "average_optimizer_state: %d: not 0 or 1", o->average_optimizer_state);
    BADO(!o->average_optimizer_state || o->averaging_frequency > 0,
         "average_optimizer_state: %d: goes with averaging_frequency (parameter averaging)",
         o->average_optimizer_state);
    BADO((unsigned)o->bn_statistics <= DSRT_BN_SYNC, "bn_statistics: %d: unknown",
         (int)o->bn_statistics);
    BADO(o->bn_statistics != DSRT_BN_SYNC || o->averaging_frequency == 0,
         "bn_statistics: sync: goes with gradients summed at every step, not with "
         "averaging_frequency %d",
         o->averaging_frequency);
    return 0;
}

/* The pipeline's options. */
static int check_reading(const dsrt_train_options *o) {
    BADO(o->workers <= 1024, "workers: %u: not in [0, 1024]", o->workers);
    BADO(o->compute_threads >= 0 && o->compute_threads <= 4096,
         "compute_threads: %d: not in [0, 4096]", o->compute_threads);
    BADO(o->pin == 0 || o->pin == 1, "pin: %d: not 0 or 1", o->pin);
    BADO(o->prefetch >= 1 && o->prefetch <= 1024, "prefetch: %u: not in [1, 1024]", o->prefetch);
    BADO(o->read_depth <= 4096, "read_depth: %u: not in [0, 4096]", o->read_depth);
    BADO(o->fail_on_error == 0 || o->fail_on_error == 1, "fail_on_error: %d: not 0 or 1",
         o->fail_on_error);

    return 0;
}

/* The data against the net and the options: samples, classes and their
 * names, batches that leave every one of world workers a sample. */
static int check_data(const dsrt_train_options *o, const dsrt_net *net, const dsrt_datastore *train,
                      int world) {
    int rc;
    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    dsrt_augment_options aug;
    if ((rc = dsrt__train_resolve_augment(&o->augment, &ni, &aug, "train"))) return rc;
    size_t n = dsrt_datastore_count(train), nc = dsrt_datastore_num_classes(train);
    BADO(n >= 1, "training data: %s", "no samples");
    BADO((int)nc == ni.classes,
         "training data: %zu classes, the net has %d (build the net for the data's classes, or "
         "use transfer learning)",
         nc, ni.classes);
    size_t per_epoch = o->epoch_samples ? o->epoch_samples : n;
    BADO(!o->drop_last || (size_t)o->batch <= per_epoch,
         "batch (MiniBatchSize): %d: more than the %zu training samples with drop_last", o->batch,
         per_epoch);
    /* Every worker gets at least one sample of every batch. */
    BADO(o->batch >= world,
         "batch (MiniBatchSize): %d: fewer than the %d workers (the batch is the global "
         "mini-batch, split between them)",
         o->batch, world);
    size_t last = n % (size_t)o->batch;
    BADO(o->drop_last || last == 0 || last >= (size_t)world,
         "batch (MiniBatchSize): %d: the last batch of each epoch would hold %zu samples, fewer "
         "than the %d workers (give drop_last, or a batch that leaves each worker a sample)",
         o->batch, last, world);
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
        if ((rc = dsrt__train_class_map(net, o->validation, train, ni.classes,
                                        "train: validation data", &map)))
            return rc;
        free(map);
    }
    return 0;
}

int dsrt_train_check(const dsrt_train_options *o, const dsrt_net *net,
                     const dsrt_datastore *train) {
    if (!o || !net || !train) return dsrt__fail(-EINVAL, "train: no options, net or data");
    int rc;
    if ((rc = check_loop(o)) || (rc = check_execution(o))) return rc;
    if ((rc = dsrt__train_resolve_device(o, NULL))) return rc;
    int world = o->execution == DSRT_EXEC_PARALLEL    ? dsrt_comm_size(o->comm)
                : o->execution == DSRT_EXEC_MULTI_GPU ? (o->gpus ? o->gpus : dsrt_gpu_count())
                                                      : 1;
    if ((rc = check_reading(o)) || (rc = check_data(o, net, train, world))) return rc;
    if (o->cpus) {
        dsrt_cpus *c;
        unsigned t = 0;
        if ((rc = dsrt__cpus_open(&c, o->cpus, -1, &t))) return dsrt__fail_prefix(rc, "train");
        dsrt__cpus_close(c);
    }
    return 0;
}
#undef BADO

// ----------------------------------------------------------------------------
// Cores: the split between pipeline workers and compute threads, and pinning

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

/* Of C cores: the workers loading needs and the threads left to compute
 * (dsrt_train_options says how). */
static void split_cores(const dsrt_net_info *ni, unsigned C, unsigned *workers, int *threads) {
    if (ni->device >= 0) {
        *workers = C > 1 ? C - 1 : 1;
        *threads = 1;
        return;
    }
    double values = (double)ni->height * ni->width * ni->channels;
    double load = LOAD_FIXED_S + LOAD_VALUE_S * values;
    double compute = ni->train_flops / CORE_FLOPS;
    double L = C * load / (load + compute);
    *workers = (unsigned)DSRT_MIN((double)C, DSRT_MAX(1.0, ceil(L - 1e-9)));
    *threads = (int)DSRT_MAX(1.0, (double)C - floor(L));
}

int dsrt_cores_split(const dsrt_net_info *ni, const char *cpus, unsigned *workers,
                     int *compute_threads) {
    if (!ni || !workers || !compute_threads)
        return dsrt__fail(DSRT_EOPTION, "cores_split: a NULL argument");
    dsrt_cpus *set;
    unsigned t = 0;
    int rc = dsrt__cpus_open(&set, cpus, ni->device, &t);
    if (rc) return dsrt__fail_prefix(rc, "cores_split");
    split_cores(ni, dsrt__cpus_cores(set), workers, compute_threads);
    dsrt__cpus_close(set);
    return 0;
}

/*
 * Chooses the split for a net whose samples have `values` output values, and
 * the CPU list of the worker cores. workers / threads 0: automatic. device:
 * the net's (a GPU computes: one core queues its work, the workers get the
 * rest, nearest the device first).
 */
int dsrt__cores_open(cores_plan *cp, const char *list, int pin, unsigned workers, int threads,
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
    split_cores(ni, C, &w, &T);
    cp->workers = w = workers ? workers : w;
    cp->threads = T = threads ? threads : T;

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
void dsrt__cores_start_compute(cores_plan *cp) {
    dsrt_net_set_threads(cp->net, cp->threads);
    if (!cp->pin) return;
    cp->team_bound = 1;
    cp->team_pinned = dsrt_net_run_on_threads(cp->net, bind_member, cp) == 0;
}

void dsrt__cores_close(cores_plan *cp) {
    if (cp->team_bound && cp->saved_mask_ok) dsrt_net_run_on_threads(cp->net, unbind_member, cp);
    if (cp->saved_mask_ok) sched_setaffinity(0, sizeof cp->saved_mask, &cp->saved_mask);
    if (cp->net) dsrt_net_set_threads(cp->net, cp->saved_net_threads);
    dsrt__cpus_close(cp->cpus);
    free(cp->worker_cpus);
    memset(cp, 0, sizeof *cp);
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
    int rc = dsrt__train_resolve_augment(&o->augment, &ni, &aug, "evaluate");
    if (rc) return rc;
    dsrt__train_fixed_augment(&aug);
    int32_t *map = NULL, *labels = NULL;
    float *scores = NULL;
    dsrt_pipeline *p = NULL;
    cores_plan cp;
    memset(&cp, 0, sizeof cp);
    if ((rc = dsrt__train_class_map(net, ds, NULL, ni.classes, "evaluate: data", &map))) return rc;
    int C = ni.classes;
    r->classes = C;
    r->confusion = dsrt__calloc((size_t)C * (size_t)C, sizeof *r->confusion);
    labels = dsrt__calloc((size_t)o->batch, sizeof *labels);
    scores = dsrt__malloc((size_t)o->batch * (size_t)C * sizeof *scores);
    if (!r->confusion || !labels || !scores) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = dsrt__cores_open(&cp, o->cpus, o->pin, o->workers, o->compute_threads, &ni, net,
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
    dsrt__remote_apply(&po.reader.remote, &o->remote);
    if ((rc = dsrt_pipeline_open(&p, ds, &aug, &po))) {
        dsrt__fail_prefix(rc, "evaluate");
        goto out;
    }
    dsrt__cores_start_compute(&cp);
    double t0 = dsrt__now_s(), lsum = 0;
    dsrt_batch *b;
    while ((rc = dsrt_pipeline_next(p, &b)) == 0) {
        int n = (int)b->count;
        if (n == 0) { /* every sample of the batch bad */
            dsrt_batch_release(p, b);
            continue;
        }
        for (int i = 0; i < n; i++) labels[i] = map[b->labels[i]];
        float l = 0;
        rc = dsrt_net_predict(net, b->data, n, scores, labels, &l, NULL);
        dsrt_batch_release(p, b);
        if (rc) {
            dsrt__fail_prefix(rc, "evaluate");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            const float *s = scores + (size_t)i * C;
            int best = 0, finite = isfinite(s[0]) != 0;
            for (int k = 1; k < C; k++) {
                finite &= isfinite(s[k]) != 0;
                if (s[k] > s[best]) best = k;
            }
            /* NaN scores name no class: counted wrong, in no cell. */
            if (!finite) {
                r->not_finite++;
                continue;
            }
            r->confusion[(size_t)labels[i] * C + best]++;
            r->correct += best == labels[i];
        }
        lsum += (double)l * n;
        r->images += (uint64_t)n;
    }
    if (rc != DSRT_EEOF) {
        dsrt__fail_prefix(rc, "evaluate");
        goto out;
    }
    if ((rc = copy_bad(p, r))) goto out;
    r->seconds = dsrt__now_s() - t0;
    r->images_per_s = r->seconds > 0 ? (double)r->images / r->seconds : 0;
    r->accuracy = r->images ? (double)r->correct / (double)r->images : NAN;
    r->loss = r->images ? lsum / (double)r->images : NAN;
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    r->skipped = s.skipped;
out:
    dsrt_pipeline_close(p);
    dsrt__cores_close(&cp);
    free(map);
    free(labels);
    free(scores);
    if (rc) dsrt_eval_result_free(r);
    return rc;
}
