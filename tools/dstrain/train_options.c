/*
 * dstrain train's options: their bindings, its --help, and how they become
 * the library's dsrt_train_options (choices by name, numbers given as text,
 * ranges, the presets and recipes, the data-parallel settings), checked
 * before any work.
 */
#include "dstrain.h"
#include "train.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// train

train_args tr;

static const option TRAIN_OPTIONS[] = {
    {"data", OPT_STRS, &tr.data},
    {"mix", OPT_STR, &tr.mix},
    {"mix-labels", OPT_STR, &tr.mix_labels},
    {"mix-replacement", OPT_FLAG, &tr.mix_replacement},
    {"sample-weights", OPT_STR, &tr.sample_weights},
    {"epoch-samples", OPT_U64, &tr.epoch_samples},
    {"val", OPT_STR, &tr.val},
    {"net", OPT_STR, &tr.net},
    {"epochs", OPT_INT, &tr.epochs},
    {"batch", OPT_INT, &tr.batch},
    {"lr", OPT_STR, &tr.lr},
    {"seed", OPT_U64, &tr.seed},
    {"threads", OPT_INT, &tr.threads},
    {"workers", OPT_INT, &tr.workers},
    {"cpus", OPT_STR, &tr.cpus},
    {"no-pin", OPT_FLAG, &tr.no_pin},
    {"prefetch", OPT_INT, &tr.prefetch},
    {"io-depth", OPT_INT, &tr.depth},
    REMOTE_OPTIONS(tr.remote),
    {"solver", OPT_STR, &tr.solver},
    {"momentum", OPT_STR, &tr.momentum},
    {"l2", OPT_STR, &tr.l2},
    {"shuffle", OPT_STR, &tr.shuffle},
    {"drop-last", OPT_FLAG, &tr.drop_last},
    {"lr-schedule", OPT_STR, &tr.lr_schedule},
    {"lr-drop-factor", OPT_STR, &tr.lr_drop_factor},
    {"lr-drop-period", OPT_INT, &tr.lr_drop_period},
    {"gradient-threshold", OPT_STR, &tr.grad_threshold},
    {"gradient-threshold-method", OPT_STR, &tr.grad_threshold_method},
    {"mixup-alpha", OPT_STR, &tr.mixup},
    {"cutmix-alpha", OPT_STR, &tr.cutmix},
    {"cutmix-minmax", OPT_STR, &tr.cutmix_minmax},
    {"mix-prob", OPT_STR, &tr.mix_prob},
    {"mix-switch-prob", OPT_STR, &tr.mix_switch_prob},
    {"label-smoothing", OPT_STR, &tr.label_smoothing},
    {"val-frequency", OPT_INT, &tr.val_frequency},
    {"val-patience", OPT_INT, &tr.val_patience},
    {"val-batch", OPT_INT, &tr.val_batch},
    {"output-network", OPT_STR, &tr.output_network},
    {"checkpoint-dir", OPT_STR, &tr.checkpoint_dir},
    {"checkpoint-frequency", OPT_INT, &tr.checkpoint_frequency},
    {"checkpoint-unit", OPT_STR, &tr.checkpoint_unit},
    {"resume", OPT_STR, &tr.resume},
    DEVICE_OPTIONS(tr.dev),
    {"averaging-frequency", OPT_INT, &tr.averaging_frequency},
    {"average-optimizer-state", OPT_FLAG, &tr.average_optimizer_state},
    {"bucket-size", OPT_STR, &tr.bucket_size},
    {"bn-statistics", OPT_STR, &tr.bn_statistics},
    {"comm-timeout", OPT_STR, &tr.comm_timeout},
    {"gpus", OPT_INT, &tr.gpus},
    {"uint8-batches", OPT_INT, &tr.uint8_batches},
    {"rand-x-reflection", OPT_FLAG, &tr.rand_x_reflection},
    {"no-rand-x-reflection", OPT_FLAG, &tr.no_rand_x_reflection},
    {"rand-y-reflection", OPT_FLAG, &tr.rand_y_reflection},
    {"no-decode-dc", OPT_FLAG, &tr.no_decode_dc},
    {"rand-rotation", OPT_STR, &tr.rand_rotation},
    {"rand-scale", OPT_STR, &tr.rand_scale},
    {"rand-translation", OPT_STR, &tr.rand_translation},
    {"rand-x-translation", OPT_STR, &tr.rand_x_translation},
    {"rand-y-translation", OPT_STR, &tr.rand_y_translation},
    {"rand-x-shear", OPT_STR, &tr.rand_x_shear},
    {"rand-y-shear", OPT_STR, &tr.rand_y_shear},
    {"size-mode", OPT_STR, &tr.size_mode},
    {"resize-shorter", OPT_INT, &tr.resize_shorter},
    {"preset", OPT_STR, &tr.preset},
    {"rand-resized-crop", OPT_FLAG, &tr.rand_resized_crop},
    {"crop-scale", OPT_STR, &tr.crop_scale},
    {"crop-ratio", OPT_STR, &tr.crop_ratio},
    {"brightness", OPT_STR, &tr.brightness},
    {"contrast", OPT_STR, &tr.contrast},
    {"saturation", OPT_STR, &tr.saturation},
    {"hue", OPT_STR, &tr.hue},
    {"rand-grayscale", OPT_STR, &tr.rand_grayscale},
    {"random-erasing", OPT_STR, &tr.random_erasing},
    {"erase-scale", OPT_STR, &tr.erase_scale},
    {"erase-ratio", OPT_STR, &tr.erase_ratio},
    {"erase-value", OPT_STR, &tr.erase_value},
    {"transfer", OPT_STR, &tr.transfer},
    ONNX_OPTIONS(tr.onnx),
    ONNX_CLASSES_OPTION(tr.onnx),
    {"lr-factor", OPT_STR, &tr.lr_factor},
    {"new-lr-factor", OPT_STR, &tr.new_lr_factor},
    {"transfer-layer", OPT_STR, &tr.layer},
    {"save", OPT_STR, &tr.save},
    {"plot", OPT_STR, &tr.plot},
    {"log", OPT_STR, &tr.log},
    {"order-log", OPT_STR, &tr.order_log},
    {"verbose-frequency", OPT_INT, &tr.verbose_frequency},
    {"fail-on-error", OPT_FLAG, &tr.fail_on_error},
    {"bad-list", OPT_STR, &tr.bad_list},
    {"drop-empty-classes", OPT_FLAG, &tr.drop_empty_classes},
    {"order", OPT_STR, &tr.order},
    {"shuffle-buffer", OPT_INT, &tr.shuffle_buffer},
    {"quiet", OPT_FLAG, &tr.quiet},
    {"no-progress", OPT_FLAG, &tr.no_progress},
    {"json", OPT_FLAG, &tr.json},
    {NULL, 0, NULL},
};

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: %s train --data DIR [--val DIR] [--net NAME|FILE] [options]\n\n"
            "Trains a network on a folder of class sub-folders with MATLAB trainingOptions'\n"
            "semantics: SGD with momentum 0.9, L2 1e-4, learning rate 0.01, batch 128, shuffled\n"
            "every epoch, random left-right reflection, float input in [0, 1] at the net's\n"
            "input size (gray or RGB as the net takes). For digits on Fashion-MNIST (a folder\n"
            "made by `dsbench convert`) the usual recipe is 3 epochs of batch 128 at learning\n"
            "rate 0.01, validated on the test split after each epoch:\n\n"
            "  %s train --data fm/train --val fm/test --net digits --epochs 3\n\n"
            "Batches are made in the background on pipeline workers while compute threads\n"
            "train; both are pinned. By default the pipeline gets ceil(L) workers on the last\n"
            "cores and the compute every core but floor(L), L being the cores loading needs\n"
            "(estimated from the sample size against the net's arithmetic: for digits, 0.03\n"
            "on 2 cores, so 1 worker sharing a core with the compute). Validation runs at the\n"
            "end of each epoch unless --val-frequency says otherwise. A non-finite loss stops\n"
            "the run (exit status 1) and leaves the last checkpoint as it was. With --resume,\n"
            "the seed and the position come from the checkpoint.\n\n"
            "Several --data make a mix (WebDataset's and MosaicML Streaming's weighted\n"
            "sources): --mix 0.7,0.3 gives each epoch (--epoch-samples N, default all the\n"
            "samples) 70%% of its samples from the first and 30%% from the second, interleaved\n"
            "at random, classes merged by name (--mix-labels separate keeps them apart);\n"
            "--mix FILE reads PATH,WEIGHT[,PRESET] lines instead. --sample-weights class-balanced\n"
            "draws every class equally often from one --data. The draws are keyed by the\n"
            "seed and the epoch: resumes and data-parallel workers see the same batches.\n\n"
            "Images that cannot be read or decoded are skipped (a training place takes the\n"
            "next image; validation leaves them out) and named at the end, on stderr and in\n"
            "the JSON summary (the first %d; --bad-list writes all). Ctrl-C, SIGTERM or SIGHUP\n"
            "(to any worker) stops after the current step, writes a checkpoint (with\n"
            "--checkpoint-dir) and the model (with --save), says what was kept and exits with\n"
            "130, 143 or 129 (every worker); a second one exits at once. Output paths (--save,\n"
            "--plot, --log, --bad-list) are checked before any work; if --save cannot be\n"
            "written at the end, the weights go to a file in the current folder (or /tmp) and\n"
            "the exit status is 1.\n\n"
            "Data parallel: `mpirun -np N %s train --execution-environment parallel ...` runs\n"
            "N workers (CPU, or one GPU each), `--execution-environment multi-gpu` one worker a\n"
            "GPU of this machine. --batch is the global mini-batch, split between the workers;\n"
            "gradients are summed in buckets while backward runs (or, with\n"
            "--averaging-frequency N, parameters averaged every N iterations); every worker\n"
            "stops at the same iteration, worker 0 alone prints and writes, and a worker that\n"
            "dies or hangs is named by the others after --comm-timeout seconds.\n\n"
            "options:\n",
            prog, prog, TOOL_BAD_SHOWN, prog);
    print_options(f, "train", TRAIN_OPTIONS);
}

/* The options that name one of a list, and where the index goes. */
typedef struct {
    const char *option;
    const char *const *value;
    int *out;
} train_choice;

/* The options given as numbers in text, checked against [min, max]. */
typedef struct {
    const char *option;
    const char *const *value;
    double min, max;
    double *out;
} train_number;

static void train_set_defaults(void) {
    memset(&tr, 0, sizeof tr);
    tr.epochs = 30;
    tr.batch = 128;
    tr.verbose_frequency = 50;
    tr.checkpoint_frequency = 1;
    tr.lr_drop_period = 10;
    tr.prefetch = 4;
    tr.uint8_batches = -1;
    tr.resize_shorter = -1; /* not given: the preset's, or 0 */
}

/* The choices among names (solver first: its defaults are the optimizer's
 * starting point). Returns 0, or 2 after a message. */
static int resolve_choices(dsrt_train_options *o) {
    const char *cmd = "train";
    int solver = -1;
    if (tr.solver && (solver = parse_choice(cmd, "solver", tr.solver)) < 0) return 2;
    if (solver >= 0) o->optimizer = dsrt_optimizer_defaults((dsrt_solver)solver);
    int shuffle = o->shuffle, schedule = o->optimizer.schedule, clip = o->optimizer.clip,
        output = o->output_network, unit = o->checkpoint_unit, mode = o->augment.size_mode,
        bn = o->bn_statistics;
    const train_choice choices[] = {
        {"shuffle", &tr.shuffle, &shuffle},
        {"lr-schedule", &tr.lr_schedule, &schedule},
        {"gradient-threshold-method", &tr.grad_threshold_method, &clip},
        {"output-network", &tr.output_network, &output},
        {"checkpoint-unit", &tr.checkpoint_unit, &unit},
        {"size-mode", &tr.size_mode, &mode},
        {"bn-statistics", &tr.bn_statistics, &bn},
    };
    for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++) {
        const train_choice *c = &choices[i];
        if (*c->value && (*c->out = parse_choice(cmd, c->option, *c->value)) < 0) return 2;
    }
    o->shuffle = (dsrt_shuffle)shuffle;
    o->optimizer.schedule = (dsrt_lr_schedule)schedule;
    o->optimizer.clip = (dsrt_grad_clip)clip;
    o->output_network = (dsrt_output_network)output;
    o->checkpoint_unit = (dsrt_frequency_unit)unit;
    o->augment.size_mode = (dsrt_augment_size_mode)mode;
    o->bn_statistics = (dsrt_bn_statistics)bn;
    return 0;
}

/* The augment ranges. Symmetric ranges take V as [-V, V]; --rand-translation
 * sets both shifts, the axis options given after it in this table override
 * it. What a range may hold is the library's one check (dsrt_augment_check),
 * asked here for each option alone so that the message names it. Returns 0,
 * or 2 after a message. */
static int resolve_ranges(dsrt_train_options *o) {
    const char *cmd = "train";
    const struct {
        const char *option;
        const char *const *value;
        double *out;
        int symmetric;
    } ranges[] = {
        {"rand-rotation", &tr.rand_rotation, o->augment.rand_rotation, 1},
        {"rand-scale", &tr.rand_scale, o->augment.rand_scale, 0},
        {"rand-translation", &tr.rand_translation, o->augment.rand_x_translation, 1},
        {"rand-translation", &tr.rand_translation, o->augment.rand_y_translation, 1},
        {"rand-x-translation", &tr.rand_x_translation, o->augment.rand_x_translation, 1},
        {"rand-y-translation", &tr.rand_y_translation, o->augment.rand_y_translation, 1},
        {"rand-x-shear", &tr.rand_x_shear, o->augment.rand_x_shear, 1},
        {"rand-y-shear", &tr.rand_y_shear, o->augment.rand_y_shear, 1},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (!*ranges[i].value) continue;
        if (parse_range(cmd, ranges[i].option, *ranges[i].value, ranges[i].symmetric,
                        ranges[i].out))
            return 2;
        dsrt_augment_options probe = dsrt_augment_defaults();
        size_t at = (size_t)((char *)ranges[i].out - (char *)&o->augment);
        memcpy((char *)&probe + at, ranges[i].out, 2 * sizeof(double));
        if (dsrt_augment_check(&probe) != 0) {
            fprintf(stderr, "%s %s: --%s %s: %s\n", prog, cmd, ranges[i].option, *ranges[i].value,
                    dsrt_last_error());
            return 2;
        }
    }
    return 0;
}

/* --cutmix-minmax, and the mixing options that need another. Returns 0,
 * or 2 after a message. */
static int resolve_mixing(dsrt_train_options *o) {
    if (parse_range("train", "cutmix-minmax", tr.cutmix_minmax, 0, o->cutmix_minmax)) return 2;
    const double *mm = o->cutmix_minmax;
    if (tr.cutmix_minmax && !(mm[0] > 0 && mm[0] < mm[1] && mm[1] <= 1)) {
        fprintf(stderr, "%s train: --cutmix-minmax %s: need 0 < LO < HI <= 1\n", prog,
                tr.cutmix_minmax);
        return 2;
    }
    int mixing = o->mixup_alpha > 0 || o->cutmix_alpha > 0 || tr.cutmix_minmax;
    if ((tr.mix_prob || tr.mix_switch_prob) && !mixing) {
        fprintf(stderr, "%s train: --%s goes with --mixup-alpha A or --cutmix-alpha A\n", prog,
                tr.mix_prob ? "mix-prob" : "mix-switch-prob");
        return 2;
    }
    return 0;
}

/* The augmentation preset (--preset), before every other augment option.
 * Returns 0, or 2 after a message. */
static int resolve_preset(dsrt_train_options *o) {
    if (!tr.preset) return 0;
    dsrt_augment_options a;
    if (dsrt_augment_preset_from_name(tr.preset, &a) != 0) {
        fprintf(stderr, "%s train: --%s\n", prog, dsrt_last_error());
        return 2;
    }
    a.output_height = a.output_width = a.output_channels = 0; /* the net's */
    o->augment = a;
    return 0;
}

/* The random-resized crop, colour and erasing options, each checked alone
 * by dsrt_augment_check so that a message names it. Returns 0, or 2 after
 * a message. */
static int resolve_recipe(dsrt_train_options *o) {
    const char *cmd = "train";
    dsrt_augment_options *a = &o->augment;
    if (tr.rand_resized_crop) a->size_mode = DSRT_AUGMENT_RANDRESIZEDCROP;
    const struct {
        const char *option;
        const char *const *value;
        double *out;
        int kind; /* 0: LO,HI; 1: a factor V: [max(0, 1 - V), 1 + V]; 2: V: [-V, V]; 3: one */
    } fields[] = {
        {"crop-scale", &tr.crop_scale, a->crop_scale, 0},
        {"crop-ratio", &tr.crop_ratio, a->crop_ratio, 0},
        {"brightness", &tr.brightness, a->brightness, 1},
        {"contrast", &tr.contrast, a->contrast, 1},
        {"saturation", &tr.saturation, a->saturation, 1},
        {"hue", &tr.hue, a->hue, 2},
        {"rand-grayscale", &tr.rand_grayscale, &a->grayscale_probability, 3},
        {"random-erasing", &tr.random_erasing, &a->erase_probability, 3},
        {"erase-scale", &tr.erase_scale, a->erase_scale, 0},
        {"erase-ratio", &tr.erase_ratio, a->erase_ratio, 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *v = *fields[i].value;
        if (!v) continue;
        int kind = fields[i].kind;
        double r[2];
        if (kind == 3) {
            if (parse_double(cmd, fields[i].option, v, -INFINITY, INFINITY, &r[0])) return 2;
        } else {
            if (parse_range(cmd, fields[i].option, v, kind == 2, r)) return 2;
            if (kind == 1 && !strchr(v, ','))
                r[0] = 1.0 - r[1] > 0.0 ? 1.0 - r[1] : 0.0, r[1] = 1.0 + r[1];
        }
        dsrt_augment_options probe = dsrt_augment_defaults();
        size_t at = (size_t)((char *)fields[i].out - (char *)a), n = kind == 3 ? 1 : 2;
        memcpy((char *)&probe + at, r, n * sizeof(double));
        if (dsrt_augment_check(&probe) != 0) {
            fprintf(stderr, "%s %s: --%s %s: %s\n", prog, cmd, fields[i].option, v,
                    dsrt_last_error());
            return 2;
        }
        memcpy(fields[i].out, r, n * sizeof(double));
    }
    if (tr.erase_value && !strcmp(tr.erase_value, "random")) {
        a->erase_random = 1;
    } else if (tr.erase_value) {
        double v[3];
        const char *at = tr.erase_value;
        char *end = NULL;
        int k = 0, ok = 1;
        while (k < 3) {
            v[k] = strtod(at, &end);
            if (end == at || !isfinite(v[k])) {
                ok = 0;
                break;
            }
            k++;
            if (*end == '\0') break;
            if (*end != ',') {
                ok = 0;
                break;
            }
            at = end + 1;
        }
        if (!ok || *end != '\0' || (k != 1 && k != 3)) {
            fprintf(stderr,
                    "%s %s: --erase-value: expected V, R,G,B (numbers) or random, got '%s'\n", prog,
                    cmd, tr.erase_value);
            return 2;
        }
        a->erase_random = 0;
        for (int c = 0; c < 3; c++) a->erase_value[c] = (float)v[k == 1 ? 0 : c];
    }
    return 0;
}

/* The options that go with others (transfer learning, data-parallel
 * execution), and the data-parallel ones. Returns 0, or 2 after a message. */
static int resolve_parallel(dsrt_train_options *o, double bucket_mib) {
    if ((tr.lr_factor || tr.new_lr_factor || tr.layer) && !tr.transfer) {
        fprintf(stderr,
                "%s train: --lr-factor, --new-lr-factor and --transfer-layer go with "
                "--transfer MODEL\n",
                prog);
        return 2;
    }
    int dp = o->execution == DSRT_EXEC_PARALLEL || o->execution == DSRT_EXEC_MULTI_GPU;
    if (!dp && (tr.averaging_frequency || tr.average_optimizer_state || tr.bucket_size ||
                tr.bn_statistics || tr.comm_timeout || tr.gpus)) {
        fprintf(stderr,
                "%s train: --averaging-frequency, --average-optimizer-state, --bucket-size, "
                "--bn-statistics, --comm-timeout and --gpus go with --execution-environment "
                "parallel or multi-gpu\n",
                prog);
        return 2;
    }
    if (tr.gpus && o->execution != DSRT_EXEC_MULTI_GPU) {
        fprintf(stderr, "%s train: --gpus goes with --execution-environment multi-gpu\n", prog);
        return 2;
    }
    if (tr.average_optimizer_state && !tr.averaging_frequency) {
        fprintf(stderr, "%s train: --average-optimizer-state goes with --averaging-frequency N\n",
                prog);
        return 2;
    }
    o->averaging_frequency = tr.averaging_frequency;
    o->average_optimizer_state = tr.average_optimizer_state;
    o->gpus = tr.gpus;
    o->comm_options.bucket_bytes = (size_t)(bucket_mib * (1 << 20));
    if (o->comm_options.first_bucket_bytes > o->comm_options.bucket_bytes)
        o->comm_options.first_bucket_bytes = o->comm_options.bucket_bytes;
    if (tr.resume && !strcmp(tr.resume, "auto") && !tr.checkpoint_dir) {
        fprintf(stderr, "%s train: --resume auto looks in --checkpoint-dir DIR: give it\n", prog);
        return 2;
    }
    if (tr.transfer && tr.resume && !strcmp(tr.resume, "auto")) {
        fprintf(stderr,
                "%s train: --resume auto and --transfer: a resumed run would not start "
                "from the transferred model; give one\n",
                prog);
        return 2;
    }
    if (tr.transfer && (tr.net || tr.resume)) {
        fprintf(stderr,
                "%s train: --transfer makes the net: give neither --net nor --resume "
                "with it\n",
                prog);
        return 2;
    }
    return 0;
}

/* The mix options --mix-replacement and --mix-labels give: 0, or -1 when
 * --mix-labels names no choice (dsrt_last_error says which there are). */
int train_mix(dsrt_mix_options *mo) {
    *mo = dsrt_mix_defaults();
    mo->replacement = tr.mix_replacement;
    return tr.mix_labels && dsrt_mix_labels_from_name(tr.mix_labels, &mo->labels) != 0 ? -1 : 0;
}

/*
 * Turns the parsed flags into the train and net options, through the tables
 * above: every choice, number and range checked before anything is opened.
 * Returns 0, or 2 after a message.
 */
int train_resolve_options(train_job *j) {
    const char *cmd = "train";
    dsrt_train_options *o = &j->o;
    *o = dsrt_train_defaults();
    if (!tr.data.n && !tr.mix) {
        fprintf(stderr, "%s train: --data DIR is required (see %s train --help)\n", prog, prog);
        return 2;
    }
    dsrt_mix_options mo;
    if (train_mix(&mo) != 0) {
        fprintf(stderr, "%s train: --mix-labels: %s\n", prog, dsrt_last_error());
        return 2;
    }
    if (tr.epoch_samples > UINT32_MAX) {
        fprintf(stderr, "%s train: --epoch-samples: %llu: more than 2^32 - 1\n", prog,
                (unsigned long long)tr.epoch_samples);
        return 2;
    }
    o->sample_weights = tr.sample_weights;
    o->epoch_samples = (size_t)tr.epoch_samples;
    if (resolve_preset(o)) return 2;
    if (resolve_choices(o)) return 2;
    if (tr.resize_shorter >= 0) o->augment.resize_shorter = tr.resize_shorter;

    j->no = dsrt_net_defaults();
    int rc = resolve_device_args(cmd, &tr.dev, &j->no, &o->execution);
    if (rc) return rc;
    o->gpu = tr.dev.gpu;
    o->uint8_batches = tr.uint8_batches;

    j->lr_factor = 1;
    j->new_lr_factor = 20;
    double bucket_mib = (double)o->comm_options.bucket_bytes / (1 << 20);
    const train_number numbers[] = {
        {"lr", &tr.lr, 1e-300, 1e6, &o->optimizer.learn_rate},
        {"momentum", &tr.momentum, 0, 0.999999, &o->optimizer.momentum},
        {"l2", &tr.l2, 0, 1e6, &o->optimizer.l2},
        {"lr-drop-factor", &tr.lr_drop_factor, 0, 1, &o->optimizer.drop_factor},
        {"gradient-threshold", &tr.grad_threshold, 1e-300, INFINITY, &o->optimizer.grad_threshold},
        {"lr-factor", &tr.lr_factor, 0, 1e6, &j->lr_factor},
        {"new-lr-factor", &tr.new_lr_factor, 0, 1e6, &j->new_lr_factor},
        {"bucket-size", &tr.bucket_size, 1.0 / 1024, 4096, &bucket_mib},
        {"comm-timeout", &tr.comm_timeout, 1, 86400, &o->comm_options.timeout_s},
        {"mixup-alpha", &tr.mixup, 0, 1e6, &o->mixup_alpha},
        {"cutmix-alpha", &tr.cutmix, 0, 1e6, &o->cutmix_alpha},
        {"mix-prob", &tr.mix_prob, 0, 1, &o->mix_prob},
        {"mix-switch-prob", &tr.mix_switch_prob, 0, 1, &o->mix_switch_prob},
        {"label-smoothing", &tr.label_smoothing, 0, 0.999999, &o->label_smoothing},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        const train_number *n = &numbers[i];
        if (parse_double(cmd, n->option, *n->value, n->min, n->max, n->out)) return 2;
    }
    if (tr.rand_x_reflection && tr.no_rand_x_reflection) {
        fprintf(stderr, "%s train: --rand-x-reflection and --no-rand-x-reflection contradict\n",
                prog);
        return 2;
    }
    if (tr.no_rand_x_reflection || tr.rand_x_reflection || !tr.preset)
        o->augment.rand_x_reflection = !tr.no_rand_x_reflection;
    if (tr.rand_y_reflection) o->augment.rand_y_reflection = 1;
    o->augment.decode_dc = !tr.no_decode_dc;
    if (resolve_ranges(o)) return 2;
    if (resolve_mixing(o)) return 2;
    if (resolve_recipe(o)) return 2;
    if (resolve_parallel(o, bucket_mib)) return 2;
    o->max_epochs = tr.epochs;
    o->batch = tr.batch;
    o->drop_last = tr.drop_last;
    o->optimizer.drop_period = tr.lr_drop_period;
    o->validation_frequency = tr.val_frequency;
    o->validation_patience = tr.val_patience;
    o->validation_batch = tr.val_batch;
    o->verbose_frequency = tr.verbose_frequency;
    o->checkpoint_path = tr.checkpoint_dir;
    o->checkpoint_frequency = tr.checkpoint_frequency;
    o->resume = tr.resume;
    o->seed = tr.seed;
    o->workers = (unsigned)tr.workers;
    o->compute_threads = tr.threads;
    o->cpus = tr.cpus;
    o->pin = !tr.no_pin;
    o->prefetch = (unsigned)tr.prefetch;
    o->read_depth = (unsigned)tr.depth;
    remote_set(&o->remote, &tr.remote);
    o->fail_on_error = tr.fail_on_error;
    return 0;
}

int train_parse(int argc, char **argv) {
    train_set_defaults();
    return parse_options("train", argc, argv, TRAIN_OPTIONS, train_usage);
}
