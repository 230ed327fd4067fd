/*
 * What dstrain train's files share: its options as given (tr), the job
 * from parsing to exit, and the display the training loop reports to.
 */
#ifndef DSTRAIN_TRAIN_H
#define DSTRAIN_TRAIN_H

#include "dstrain.h"

/* The options of `dstrain train` as given (train_options.c binds them). */
typedef struct {
    str_list data;
    const char *mix, *mix_labels, *sample_weights;
    int mix_replacement;
    uint64_t epoch_samples;
    const char *val, *net, *resume, *checkpoint_dir, *checkpoint_unit, *solver, *shuffle;
    const char *lr, *momentum, *l2, *lr_schedule, *lr_drop_factor, *grad_threshold,
        *grad_threshold_method, *output_network, *plot, *log, *save, *transfer, *lr_factor,
        *new_lr_factor, *cpus, *rand_rotation, *rand_scale, *rand_x_translation,
        *rand_y_translation, *rand_x_shear, *rand_y_shear, *layer, *size_mode, *rand_translation,
        *bad_list, *bucket_size, *bn_statistics, *comm_timeout;
    int epochs, batch, threads, workers, val_frequency, val_patience, val_batch, verbose_frequency,
        checkpoint_frequency, lr_drop_period, prefetch, json, drop_last, no_pin, quiet, no_progress,
        rand_x_reflection, no_rand_x_reflection, rand_y_reflection, fail_on_error, resize_shorter,
        depth, drop_empty_classes, shuffle_buffer, no_decode_dc;
    const char *order;
    const char *mixup, *cutmix, *cutmix_minmax, *mix_prob, *mix_switch_prob, *label_smoothing;
    const char *order_log;
    /* The ImageNet recipe's augmentation (--preset and after). */
    const char *preset, *crop_scale, *crop_ratio, *brightness, *contrast, *saturation, *hue,
        *rand_grayscale, *random_erasing, *erase_scale, *erase_ratio, *erase_value;
    int rand_resized_crop;
    remote_opts remote;
    uint64_t seed;
    int uint8_batches, averaging_frequency, average_optimizer_state, gpus;
    device_args dev;
    onnx_args onnx;
} train_args;

extern train_args tr;

typedef struct {
    FILE *log;
    int log_json;
    dsrt_train_history *hist;
    const char *plot;
    int plot_failed; /* a plot could not be written */
    int table, json, progress;
    double last_bar;
    int bar_shown;
    int64_t ipe;
    const char *title;
    tool_bad_list bad[2]; /* training, validation */
    FILE *order;          /* --order-log */
} train_ui;

/* What one `dstrain train` holds from parsing to exit. */
typedef struct {
    dsrt_train_options o;
    dsrt_net_options no;
    double lr_factor, new_lr_factor; /* --lr-factor, --new-lr-factor */
    FILE *logf;
    FILE *orderf; /* --order-log, on every worker */
    int log_json;
    train_ui ui;
    dsrt_datastore *train, *val;
    dsrt_net *net, *base;
    char *text, *desc; /* a description file's text; the description with class names */
    dsrt_train_history *hist;
    const char *netname;
    char ckpt[4096];      /* the checkpoint --resume names, when the net comes from it */
    char auto_ckpt[4096]; /* --resume auto: the checkpoint chosen, "" to start afresh */
    char title[8400];
    /* --execution-environment parallel: this process's communicator, its
     * rank among the world's, whether MPI was started here, and " (worker K
     * of N)" for messages. */
    dsrt_comm *comm;
    int rank, world, mpi;
    char worker[48];
} train_job;

/* The loop's state file beside each checkpoint (see dsrt/train.h). */
#define STATE_SUFFIX_TEXT ".state"

/* Parses train's options into tr (defaults first). Returns 0, or 1 for
 * --help (printed); exits with status 2 after a message on a bad option. */
int train_parse(int argc, char **argv);

/* tr into the job's library options, checked before any work. Returns 0 or
 * 2 after a message. */
int train_resolve_options(train_job *j);

/* The mix options --mix-replacement and --mix-labels give: 0, or -1 when
 * --mix-labels names no choice (dsrt_last_error says which there are). */
int train_mix(dsrt_mix_options *mo);

/* The training loop's events on the display u (a train_ui): table, JSON
 * lines, bar, log, plot. Returns 1 to stop (a stop signal came). */
int train_event(void *ctx, const dsrt_train_event *e);

/* Removes the progress bar from the terminal, when shown. */
void bar_clear(train_ui *u);

/* From here on, SIGINT, SIGTERM and SIGHUP stop training after the
 * current step, and a second one exits at once. */
void catch_stop_signals(void);

/* The stop signal that came, or 0; and its name ("SIGINT"). */
int stop_signal_seen(void);
const char *signal_name(int sig);

#endif
