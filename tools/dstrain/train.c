/*
 * dstrain train: trains a network on an image folder (or any datastore
 * source) with the pipeline making batches in the background. The job runs
 * in steps: options, the communicator of a data-parallel run, --resume
 * auto, the outputs (checked before any work), the data and the net, the
 * display, training, the report and the files it writes.
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

/* dsrt_net_create failed on the description read from file: the message
 * names the file, not "net description". */
static void net_file_error(const char *file, const char *text) {
    const char *m = dsrt_last_error();
    static const char prefix[] = "net description: ";
    if (!strncmp(m, prefix, sizeof prefix - 1)) m += sizeof prefix - 1;
    fprintf(stderr, "%s train: --net %s: %s\n", prog, file, m);
    /* A file holding only a built-in network's name. */
    char word[32];
    if (sscanf(text, " %31s", word) == 1 && dsrt_net_builtin(word, NULL)) {
        char rest[2];
        if (sscanf(text, " %*s %1s", rest) != 1)
            fprintf(stderr,
                    "  (the file names a built-in network: give --net %s for it; a description "
                    "file lists layers, one a line)\n",
                    word);
    }
}

/*
 * --execution-environment parallel: starts MPI and opens this worker's
 * communicator as the library chooses it (dsrt_train_comm_open: one GPU a
 * worker with NCCL, else CPU workers with MPI). Only worker 0 prints, logs,
 * plots and saves. Returns 0 or 2 after a message.
 */
static int train_start_comm(train_job *j) {
    j->world = 1;
    if (dsrt_train_comm_open(&j->o, &j->comm) != 0) {
        fprintf(stderr, "%s train: --execution-environment parallel: %s\n", prog,
                dsrt_last_error());
        return 2;
    }
    if (!j->comm) return 0;
    j->mpi = 1;
    j->no.device = j->o.gpu >= 0 ? j->o.gpu : DSRT_DEVICE_CPU;
    j->rank = dsrt_comm_rank(j->comm);
    j->world = dsrt_comm_size(j->comm);
    snprintf(j->worker, sizeof j->worker, " (worker %d of %d)", j->rank, j->world);
    if (j->rank != 0) {
        tr.json = 0;
        tr.quiet = 1;
        tr.no_progress = 1;
    }
    return 0;
}

/*
 * --resume auto: the newest complete checkpoint of --checkpoint-dir becomes
 * --resume, or there is none and the run starts afresh; worker 0 chooses
 * for every worker (dsrt_train_resume_auto). Newer checkpoints that do not
 * load are named and passed over. Returns 0 or 2 after a message.
 */
static int train_resolve_auto_resume(train_job *j) {
    if (!tr.resume || strcmp(tr.resume, "auto") != 0) return 0;
    char skipped[2048];
    int rc = dsrt_train_resume_auto(j->comm, tr.checkpoint_dir, j->auto_ckpt, sizeof j->auto_ckpt,
                                    skipped, sizeof skipped);
    for (char *line = skipped; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        fprintf(stderr, "%s train: --resume auto: passing over %s\n", prog, line);
        if (!end) break;
        line = end + 1;
    }
    if (rc != 0) {
        fprintf(stderr, "%s train%s: --resume auto: %s\n", prog, j->worker, dsrt_last_error());
        return 2;
    }
    if (j->rank == 0) {
        if (j->auto_ckpt[0])
            fprintf(stderr, "%s train: --resume auto: resuming from %s\n", prog, j->auto_ckpt);
        else
            fprintf(stderr,
                    "%s train: --resume auto: no complete checkpoint in %s: starting "
                    "afresh\n",
                    prog, tr.checkpoint_dir);
    }
    tr.resume = j->auto_ckpt[0] ? j->auto_ckpt : NULL;
    j->o.resume = tr.resume;
    return 0;
}

/* Every worker says whether it could start (status 0); when one could not,
 * the others stop too, naming it (dsrt_train_first_worker). Returns the
 * status to go on with. */
static int train_agree(train_job *j, int status) {
    if (!j->comm) return status;
    int first, failed;
    if (dsrt_train_first_worker(j->comm, status != 0, &first, &failed) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
        return status ? status : 1;
    }
    if (first >= 0 && !status) {
        fprintf(stderr, "%s train%s: worker %d could not start (see its message); stopping\n", prog,
                j->worker, first);
        status = 2;
    }
    return status;
}

/* Checks every output path and opens the log and the bad-file list, before
 * any work: a run must not end with nowhere to put its results. Returns 0
 * or 2 after a message. */
static int train_open_outputs(train_job *j) {
    if (tr.log) {
        size_t n = strlen(tr.log);
        if (n > 4 && !strcmp(tr.log + n - 4, ".csv"))
            j->log_json = 0;
        else if ((n > 6 && !strcmp(tr.log + n - 6, ".jsonl")) ||
                 (n > 5 && !strcmp(tr.log + n - 5, ".json")))
            j->log_json = 1;
        else {
            fprintf(stderr, "%s train: --log %s: name it .csv or .jsonl\n", prog, tr.log);
            return 2;
        }
    }
    if (tr.plot) {
        size_t n = strlen(tr.plot);
        if (n < 5 || strcmp(tr.plot + n - 4, ".svg") != 0) {
            fprintf(stderr, "%s train: --plot %s: the plot is an SVG file (name it .svg)\n", prog,
                    tr.plot);
            return 2;
        }
    }
    const struct {
        const char *option, *path;
        int regular; /* written by rename: only a regular file may be replaced */
    } out_paths[] = {{"save", tr.save, 1},
                     {"plot", tr.plot, 1},
                     {"log", tr.log, 0},
                     {"bad-list", tr.bad_list, 0}};
    /* The files read: an output that is one of them (or another output)
     * would replace it. */
    const struct {
        const char *option, *path;
    } in_paths[] = {{"resume", tr.resume}, {"net", tr.net}, {"transfer", tr.transfer}};
    char why[512];
    if (tr.save && is_onnx_file(tr.save)) {
        fprintf(stderr,
                "%s train: --save %s: it writes a dsrt model file, which a .onnx name would "
                "have read back as ONNX (dstrain export writes ONNX)\n",
                prog, tr.save);
        return 2;
    }
    for (size_t i = 0; i < sizeof out_paths / sizeof out_paths[0]; i++) {
        if (!out_paths[i].path) continue;
        if (tool_check_output(out_paths[i].path, out_paths[i].regular, why, sizeof why)) {
            fprintf(stderr, "%s train: --%s %s: %s\n", prog, out_paths[i].option, out_paths[i].path,
                    why);
            return 2;
        }
        for (size_t k = 0; k < sizeof in_paths / sizeof in_paths[0]; k++)
            if (tool_same_file(out_paths[i].path, in_paths[k].path)) {
                fprintf(stderr,
                        "%s train: --%s %s: is the file --%s reads (%s): it would be replaced; "
                        "give another name\n",
                        prog, out_paths[i].option, out_paths[i].path, in_paths[k].option,
                        in_paths[k].path);
                return 2;
            }
        for (size_t k = 0; k < i; k++)
            if (out_paths[k].path && (tool_same_file(out_paths[i].path, out_paths[k].path) ||
                                      !strcmp(out_paths[i].path, out_paths[k].path))) {
                fprintf(stderr, "%s train: --%s %s: is also --%s: give each its own file\n", prog,
                        out_paths[i].option, out_paths[i].path, out_paths[k].option);
                return 2;
            }
    }
    if (tr.order_log) {
        char path[4200];
        snprintf(path, sizeof path, j->world > 1 ? "%s.%d" : "%s", tr.order_log, j->rank);
        if (!(j->orderf = tool_open_output(path, why, sizeof why))) {
            fprintf(stderr, "%s train%s: --order-log %s: %s\n", prog, j->worker, path, why);
            return 2;
        }
    }
    if (j->rank != 0) {
        /* Checked on every worker alike; written by worker 0 only. */
        tr.save = tr.plot = tr.log = tr.bad_list = NULL;
        return 0;
    }
    if (tr.log && !(j->logf = tool_open_output(tr.log, why, sizeof why))) {
        fprintf(stderr, "%s train: --log %s: %s\n", prog, tr.log, why);
        return 2;
    }
    if (tr.bad_list && !(j->ui.bad[0].out = tool_open_output(tr.bad_list, why, sizeof why))) {
        fprintf(stderr, "%s train: --bad-list %s: %s\n", prog, tr.bad_list, why);
        return 2;
    }
    j->ui.bad[1].out = j->ui.bad[0].out;
    j->ui.bad[1].data = "val";
    return 0;
}

/* The net for --transfer: the base model with a new last layer for the
 * data's classes. Returns 0 or 1 after a message. */
static int train_transfer_net(train_job *j) {
    int rc = load_model("train", "--transfer", tr.transfer, &tr.onnx, &j->no, &j->base);
    if (rc) return rc;
    int classes = (int)dsrt_datastore_num_classes(j->train);
    dsrt_transfer_options to = dsrt_transfer_defaults();
    to.classes = classes;
    to.base_lr_factor = (float)j->lr_factor;
    to.new_weight_lr = to.new_bias_lr = (float)j->new_lr_factor;
    to.layer = tr.layer;
    const char **names = calloc((size_t)classes, sizeof *names);
    if (!names) return 1;
    for (int c = 0; c < classes; c++) names[c] = dsrt_datastore_class_name(j->train, (size_t)c);
    to.class_names = names;
    rc = dsrt_net_transfer(&j->net, j->base, &to, &j->no);
    free(names);
    if (rc) {
        fprintf(stderr, "%s train: --transfer: %s\n", prog, dsrt_last_error());
        return 1;
    }
    return 0;
}

/* The data, then the net: built, loaded, transferred or the checkpoint's.
 * Returns 0, or the exit status after a message. */
static int train_open_data_and_net(train_job *j) {
    const char *cmd = "train";
    if (onnx_flags_alone(cmd, &tr.onnx, tr.net, tr.transfer)) return 2;
    if (tr.resume) {
        /* The loop's state beside a checkpoint, given for it (with or
         * without --net): refused before any work, naming the checkpoint. */
        size_t n = strlen(tr.resume), ns = strlen(STATE_SUFFIX_TEXT);
        struct stat st;
        if (n > ns && !strcmp(tr.resume + n - ns, STATE_SUFFIX_TEXT) && stat(tr.resume, &st) == 0 &&
            S_ISREG(st.st_mode) && !is_model_file(tr.resume)) {
            fprintf(stderr,
                    "%s train: --resume %s: the state of the training loop kept beside a "
                    "checkpoint, not the checkpoint: give %.*s\n",
                    prog, tr.resume, (int)(n - ns), tr.resume);
            return 2;
        }
    }
    dsrt_mix_options mo;
    train_mix(&mo); /* checked with the other options */
    data_args da = {tr.drop_empty_classes, tr.order, tr.shuffle_buffer, &tr.remote, tr.mix, mo};
    data_args va = {tr.drop_empty_classes, tr.order, tr.shuffle_buffer, &tr.remote, NULL, mo};
    if (open_data(cmd, "--data", tr.data.v, tr.data.n, &da, &j->train) ||
        (tr.val && open_data(cmd, "--val", &tr.val, 1, &va, &j->val)))
        return 2;
    j->o.validation = j->val;
    j->no.seed = tr.seed;
    j->netname = tr.net;
    if (!j->netname && tr.resume) {
        struct stat st;
        if (stat(tr.resume, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (dsrt_checkpoint_latest(tr.resume, j->ckpt, sizeof j->ckpt) != 0) {
                fprintf(stderr, "%s train: --resume: %s\n", prog, dsrt_last_error());
                return 2;
            }
        } else {
            snprintf(j->ckpt, sizeof j->ckpt, "%s", tr.resume);
        }
        j->netname = j->ckpt;
    }
    if (!j->netname && !tr.transfer) j->netname = "digits";
    const char *netname = j->netname;
    /* Where the net comes from, for messages: --resume's checkpoint or --net. */
    const char *from = netname == j->ckpt ? "--resume" : "--net";
    if (tr.transfer) {
        if (train_transfer_net(j)) return 1;
    } else if (dsrt_net_builtin(netname, NULL)) {
        j->desc = dsrt_describe_datastore_classes(netname, j->train);
    } else if (is_model_file(netname) || is_onnx_file(netname)) {
        int rc = load_model("train", from, netname, &tr.onnx, &j->no, &j->net);
        if (rc) return rc;
    } else if (netname == j->ckpt) {
        /* --resume names something that is not a checkpoint. */
        char why[256];
        char *text = read_net_text(netname, why, sizeof why);
        free(text);
        if (!text)
            fprintf(stderr, "%s train: --resume: %s: %s\n", prog, netname, why);
        else
            fprintf(stderr,
                    "%s train: --resume %s: not a checkpoint (a dsrt checkpoint file, or a folder "
                    "of them)\n",
                    prog, netname);
        return 2;
    } else {
        char why[256];
        j->text = read_net_text(netname, why, sizeof why);
        if (!j->text) {
            if (netname == j->ckpt)
                fprintf(stderr, "%s train: --resume: %s: %s\n", prog, netname, why);
            else
                net_unknown("train", netname, why);
            return 2;
        }
        j->desc = dsrt_describe_datastore_classes(j->text, j->train);
    }
    if (!j->net && !j->desc && !strncmp(dsrt_last_error(), "class names:", 12)) {
        /* The names come from the data's class folders. */
        char shown[4096];
        fprintf(stderr, "%s train: --data %s: %s\n", prog,
                data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown), dsrt_last_error());
        return 2;
    }
    if (!j->net) {
        int classes = (int)dsrt_datastore_num_classes(j->train);
        if (!j->desc || dsrt_net_create(&j->net, j->desc, 0, 0, 0, classes, &j->no) != 0) {
            if (j->text)
                net_file_error(netname, j->text);
            else
                fprintf(stderr, "%s train: --net: %s\n", prog, dsrt_last_error());
            return 2;
        }
    }
    return 0;
}

/* The display: table, JSON lines, progress bar, log, plot. */
static int train_setup_ui(train_job *j) {
    if (j->logf && !j->log_json)
        fprintf(j->logf, "epoch,iteration,time_s,loss,accuracy,learn_rate,val_loss,val_accuracy\n");
    if ((tr.plot && dsrt_train_history_create(&j->hist) != 0)) return 1;
    train_ui *ui = &j->ui;
    ui->log = j->logf;
    ui->order = j->orderf;
    ui->log_json = j->log_json;
    ui->hist = j->hist;
    ui->plot = tr.plot;
    ui->json = tr.json;
    ui->table = !tr.json && !tr.quiet;
    ui->progress = !tr.json && !tr.no_progress && isatty(STDERR_FILENO);
    char shown[4096];
    /* A transfer run is named after the model it starts from. */
    const char *model = tr.transfer ? strrchr(tr.transfer, '/') : NULL;
    model = model ? model + 1 : tr.transfer;
    if (model)
        snprintf(j->title, sizeof j->title, "%s (transfer) on %s", model,
                 data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown));
    else
        snprintf(j->title, sizeof j->title, "%s on %s", j->netname,
                 data_shown(tr.data.v, tr.data.n, tr.mix, shown, sizeof shown));
    ui->title = j->title;
    j->o.callback = train_event;
    j->o.callback_ctx = ui;
    if (ui->table) {
        dsrt_net_info ni;
        dsrt_net_get_info(j->net, &ni);
        printf("Training %s (%zu parameters, input %dx%dx%d, %d classes) on %zu images",
               tr.transfer ? tr.transfer : j->netname, ni.learnable, ni.height, ni.width,
               ni.channels, ni.classes, dsrt_datastore_count(j->train));
        if (j->val) printf(", validating on %zu", dsrt_datastore_count(j->val));
        if (j->world > 1)
            printf(", %d workers (MPI ranks) sharing each batch of %d", j->world, j->o.batch);
        if (j->o.execution == DSRT_EXEC_MULTI_GPU) printf(", one worker a GPU");
        printf("\n");
    }
    return 0;
}

/* A failed run: the message, and the bad files met on the way. */
static void train_report_failure(train_job *j, int rc, const dsrt_train_result *r) {
    fprintf(stderr, "%s%s %s\n", prog, j->worker, dsrt_last_error());
    if (j->rank != 0) return;
    if (tr.json) {
        printf("{\"event\": \"error\", \"code\": %d, \"error\": ", rc);
        tool_json_string(stdout, dsrt_last_error());
        printf(", \"iterations\": %lld", (long long)r->iterations);
        tool_bad_json(stdout, "", &j->ui.bad[0], r->skipped);
        tool_bad_json(stdout, "val_", &j->ui.bad[1], r->val_skipped);
        printf("}\n");
    } else {
        tool_bad_print("dstrain train", "training", &j->ui.bad[0], r->skipped, 0, tr.bad_list);
        tool_bad_print("dstrain train", "validation", &j->ui.bad[1], r->val_skipped, 1,
                       tr.bad_list);
    }
}

/* The weights: to --save, or, when that fails, where they are kept anyway.
 * Returns the file holding them, or NULL (then a message said why). */
static const char *train_save(train_job *j, const dsrt_train_result *r, char *fallback,
                              size_t size) {
    if (!tr.save) return NULL;
    if (dsrt_model_save(tr.save, j->net) == 0) return tr.save;
    fprintf(stderr, "%s train: --save %s: %s\n", prog, tr.save, dsrt_last_error());
    const char *saved = NULL;
    if (r->checkpoint[0] && !strcmp(r->checkpoint + strlen(r->checkpoint) - 5, ".dsrt")) {
        fprintf(stderr, "%s train: the trained weights are in the last checkpoint, %s\n", prog,
                r->checkpoint);
        return NULL;
    }
    const char *tmp = getenv("TMPDIR");
    const char *dirs[] = {".", tmp && *tmp ? tmp : "/tmp"};
    for (int d = 0; d < 2 && !saved; d++) {
        snprintf(fallback, size, "%s/dstrain-weights-%ld.dsrt", dirs[d], (long)getpid());
        if (dsrt_model_save(fallback, j->net) == 0) saved = fallback;
    }
    if (saved)
        fprintf(stderr, "%s train: the trained weights were written to %s instead\n", prog, saved);
    else
        fprintf(stderr, "%s train: the trained weights could not be written anywhere\n", prog);
    return saved;
}

static const char *const train_stops[] = {"max epochs completed", "validation patience reached",
                                          "stopped by request", "error"};

/* Whether this run trained enough steps for its images/s to mean a rate: a
 * single step (a resumed run with one left) is mostly start-up. */
static int train_rate_known(const dsrt_train_result *r) {
    return r->iterations - r->start_iteration >= 2;
}

/* The summary as one JSON line. */
static void train_summary_json(train_job *j, const dsrt_train_result *r, const char *saved,
                               const char *interrupted) {
    dsrt_net_info ni;
    dsrt_net_get_info(j->net, &ni);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32];
    printf("{\"event\": \"summary\", \"net\": ");
    tool_json_string(stdout, tr.transfer ? tr.transfer : j->netname);
    printf(", \"stop\": \"%s\", \"epochs\": %lld, \"iterations\": %lld, \"images\": %llu, "
           "\"train_s\": %s, \"val_s\": %s, \"images_per_s\": %s, \"val_accuracy\": "
           "%s, \"val_loss\": %s, \"loss\": %s, \"accuracy\": %s, \"batch\": %d, "
           "\"workers\": %u, \"compute_threads\": %d, \"pinned\": %d, "
           "\"consumer_wait_s\": %s, \"seed\": %llu, \"weights_checksum\": \"%016llx\"",
           interrupted ? interrupted : train_stops[r->stop], (long long)r->epochs,
           (long long)r->iterations, (unsigned long long)r->images,
           tool_json_number(b5, "%.3f", r->train_s), tool_json_number(b6, "%.3f", r->val_s),
           train_rate_known(r) ? tool_json_number(b7, "%.1f", r->images_per_s) : "null",
           jnum(b1, r->val_accuracy), jnum(b2, r->val_loss), jnum(b3, r->loss),
           jnum(b4, r->accuracy), j->o.batch, r->workers, r->compute_threads, r->pinned,
           tool_json_number(b8, "%.3f", r->consumer_wait_s), (unsigned long long)r->seed,
           (unsigned long long)r->weights_checksum);
    printf(", \"start_iteration\": %lld", (long long)r->start_iteration);
    if (r->cache_hits || r->cache_misses)
        printf(", \"cache\": {\"hits\": %llu, \"misses\": %llu, \"bytes_from_cache\": %llu, "
               "\"bytes_from_store\": %llu, \"requests_to_store\": %llu, \"evictions\": %llu}",
               (unsigned long long)r->cache_hits, (unsigned long long)r->cache_misses,
               (unsigned long long)r->cache_bytes, (unsigned long long)r->remote_bytes,
               (unsigned long long)r->remote_requests, (unsigned long long)r->cache_evictions);
    tool_bad_json(stdout, "", &j->ui.bad[0], r->skipped);
    if (j->val) tool_bad_json(stdout, "val_", &j->ui.bad[1], r->val_skipped);
    if (r->checkpoint[0]) {
        printf(", \"checkpoint\": ");
        tool_json_string(stdout, r->checkpoint);
    }
    printf(", \"world\": %d, \"device\": %d, \"precision\": \"%s\"", r->world, r->device,
           dsrt_precision_name(ni.precision));
    if (r->resume_states) printf(", \"resume_states\": %d", r->resume_states);
    if (r->resume_workers) printf(", \"resume_workers\": %d", r->resume_workers);
    if (r->device >= 0) {
        double dev_s = r->device_busy_s + r->device_idle_s;
        printf(", \"device_busy_s\": %s, \"device_idle_s\": %s, \"device_idle_share\": %s",
               tool_json_number(b1, "%.3f", r->device_busy_s),
               tool_json_number(b2, "%.3f", r->device_idle_s),
               tool_json_number(b3, "%.4f", dev_s > 0 ? r->device_idle_s / dev_s : 0.0));
    }
    printf(", \"model\": ");
    if (saved)
        tool_json_string(stdout, saved);
    else
        printf("null");
    printf("}\n");
}

/* The summary as text. */
static void train_summary_text(train_job *j, const dsrt_train_result *r, const char *saved,
                               const char *interrupted) {
    dsrt_net_info ni;
    dsrt_net_get_info(j->net, &ni);
    if (interrupted)
        printf("Training %s after iteration %lld of %lld, %.1f s of training.\n", interrupted,
               (long long)r->iterations, (long long)(j->ui.ipe * j->o.max_epochs), r->train_s);
    else if (r->start_iteration > 0)
        printf("Training finished: %s. %lld epochs, %lld iterations; resumed at iteration %lld, "
               "this run trained %lld in %.1f s",
               train_stops[r->stop], (long long)r->epochs, (long long)r->iterations,
               (long long)r->start_iteration, (long long)(r->iterations - r->start_iteration),
               r->train_s);
    else
        printf("Training finished: %s. %lld epochs, %lld iterations, %.1f s of training",
               train_stops[r->stop], (long long)r->epochs, (long long)r->iterations, r->train_s);
    if (!interrupted) {
        if (train_rate_known(r))
            printf(": %.0f images/s (loading included; the compute waited %.2f s for data).\n",
                   r->images_per_s, r->consumer_wait_s);
        else
            printf(" (too few iterations for a rate).\n");
    }
    if (r->cache_hits || r->cache_misses)
        printf("Cache: %llu reads from it (%.1f MB), %llu from the store (%.1f MB in %llu "
               "requests), %llu entries evicted.\n",
               (unsigned long long)r->cache_hits, r->cache_bytes / 1e6,
               (unsigned long long)r->cache_misses, r->remote_bytes / 1e6,
               (unsigned long long)r->remote_requests, (unsigned long long)r->cache_evictions);
    if (r->device >= 0)
        printf("GPU %d (%s): busy %.1f s, idle between steps %.2f s (%.1f%%).\n", r->device,
               dsrt_precision_name(ni.precision), r->device_busy_s, r->device_idle_s,
               100 * r->device_idle_s / (r->device_busy_s + r->device_idle_s + 1e-9));
    if (!isnan(r->val_accuracy))
        printf("Validation accuracy %.2f%%, loss %.4f (validation took %.1f s).\n",
               100 * r->val_accuracy, r->val_loss, r->val_s);
    else if (!j->val && r->start_iteration > 0)
        printf("No validation in this run (give --val to measure it).\n");
    /* A checkpoint of workers with optimizer states of their own, resumed
     * other than by as many workers keeping theirs: the mean was taken. */
    int own = j->o.averaging_frequency > 0 && !j->o.average_optimizer_state &&
              r->world == r->resume_states;
    if (r->resume_workers && r->resume_workers != r->world)
        printf("Resumed from a checkpoint of %d worker%s on %d: the rest of its epoch was its "
               "batches split over %d, each sample once.\n",
               r->resume_workers, r->resume_workers == 1 ? "" : "s", r->world, r->world);
    if (r->resume_states > 1 && !own)
        printf("Resumed from a checkpoint of %d workers, each with its optimizer state: every "
               "worker started from their mean.\n",
               r->resume_states);
    printf("Weights checksum %016llx", (unsigned long long)r->weights_checksum);
    if (r->checkpoint[0]) printf("; last checkpoint %s", r->checkpoint);
    if (saved) printf("; model saved to %s", saved);
    printf("\n");
}

/* The signal that stopped the run, whichever worker it came to (every
 * worker stopped at the same step, having agreed to): the first by rank
 * that got one, *worker receiving which. 0 when none did. */
static int train_stop_signal(train_job *j, int *worker) {
    int sig = stop_signal_seen(), first, first_sig;
    *worker = j->rank;
    if (dsrt_train_first_worker(j->comm, sig, &first, &first_sig) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
        return sig;
    }
    if (first >= 0) *worker = first;
    return first >= 0 ? first_sig : sig;
}

/* Every worker exits with worker 0's status, once worker 0 has written
 * and said what it kept (a worker that exits first with a non-zero status
 * would have mpirun end the job under it). */
static int train_final_status(train_job *j, int status) {
    if (!j->comm) return status;
    int32_t st = status;
    if (dsrt_comm_bcast(j->comm, &st, sizeof st, 0) != 0) {
        fprintf(stderr, "%s train%s: %s\n", prog, j->worker, dsrt_last_error());
        return status ? status : 1;
    }
    return st;
}

/* Trains and reports. Returns the exit status. */
static int train_run(train_job *j) {
    /* From here a signal stops after the current step. */
    catch_stop_signals();

    dsrt_train_result r;
    int rc = dsrt_train(j->net, j->train, &j->o, &r);
    if (j->hist && tr.plot && dsrt_train_history_svg(j->hist, tr.plot, j->title) != 0) {
        fprintf(stderr, "%s train: --plot: %s\n", prog, dsrt_last_error());
        j->ui.plot_failed = 1;
    }
    if (rc) {
        train_report_failure(j, rc, &r);
        return 1;
    }
    int who, sig = train_stop_signal(j, &who);
    int interrupted = r.stop == DSRT_STOP_CALLBACK && sig;
    if (j->rank != 0) /* worker 0 reports and saves */
        return train_final_status(j, interrupted ? 128 + sig : 0);
    char fallback[4200] = "", how[96] = "";
    if (interrupted && j->world > 1)
        snprintf(how, sizeof how, "interrupted by %s to worker %d", signal_name(sig), who);
    else if (interrupted)
        snprintf(how, sizeof how, "interrupted by %s", signal_name(sig));
    const char *saved = train_save(j, &r, fallback, sizeof fallback);
    if (tr.json)
        train_summary_json(j, &r, saved, interrupted ? how : NULL);
    else
        train_summary_text(j, &r, saved, interrupted ? how : NULL);
    fflush(stdout);
    if (!tr.json) {
        tool_bad_print("dstrain train", "training", &j->ui.bad[0], r.skipped, 0, tr.bad_list);
        tool_bad_print("dstrain train", "validation", &j->ui.bad[1], r.val_skipped, 1, tr.bad_list);
    }
    if (interrupted) {
        if (r.checkpoint[0] || saved)
            fprintf(stderr, "%s train: %s; kept%s%s%s%s\n", prog, how,
                    r.checkpoint[0] ? " the checkpoint " : "", r.checkpoint,
                    saved ? (r.checkpoint[0] ? " and the model " : " the model ") : "",
                    saved ? saved : "");
        else
            fprintf(stderr,
                    "%s train: %s; nothing kept (give --checkpoint-dir or --save to keep the "
                    "weights of an interrupted run)\n",
                    prog, how);
    }
    int status = interrupted ? 128 + sig : 0;
    if ((tr.save && saved != tr.save) || j->ui.plot_failed) status = status ? status : 1;
    return train_final_status(j, status);
}

/* Closes what the job opened; a status 0 becomes 1 when the log or the
 * bad-file list could not be written in full. */
static int train_close(train_job *j, int status) {
    if (j->logf && (ferror(j->logf) | fclose(j->logf))) {
        fprintf(stderr, "%s train: --log %s: the log could not be written in full\n", prog, tr.log);
        if (status == 0) status = 1;
    }
    if (j->orderf && (ferror(j->orderf) | fclose(j->orderf))) {
        fprintf(stderr, "%s train: --order-log %s: not written in full\n", prog, tr.order_log);
        if (status == 0) status = 1;
    }
    FILE *bad = j->ui.bad[0].out;
    if (bad && (j->ui.bad[0].write_failed | ferror(bad) | fclose(bad))) {
        fprintf(stderr, "%s train: --bad-list %s: the list could not be written in full\n", prog,
                tr.bad_list);
        if (status == 0) status = 1;
    }
    tool_bad_free(&j->ui.bad[0]);
    tool_bad_free(&j->ui.bad[1]);
    dsrt_train_history_destroy(j->hist);
    dsrt_comm_close(j->comm); /* before the net it may still hold */
    dsrt_net_destroy(j->net);
    dsrt_net_destroy(j->base);
    dsrt_datastore_close(j->val);
    dsrt_datastore_close(j->train);
    free(j->text);
    free(j->desc);
    if (j->mpi) dsrt_comm_finalize();
    return status;
}

/* dstrain train: parse, open the outputs, the data and the net, check the
 * options against them, train, report, close. */
int cmd_train(int argc, char **argv) {
    int rc = train_parse(argc, argv);
    if (rc) return rc > 0 ? 0 : 2;
    train_job job;
    train_job *j = &job;
    memset(j, 0, sizeof *j);
    if ((rc = train_resolve_options(j))) return rc;
    /* A process that mpirun started as one of several, without
     * --execution-environment parallel, would train the whole job alone. */
    if (dsrt_train_check_launch(&j->o) != 0) {
        fprintf(stderr, "%s %s\n", prog, dsrt_last_error());
        return 2;
    }
    int status = train_start_comm(j);
    if (status == 0) status = train_resolve_auto_resume(j);
    if (status == 0) status = train_open_outputs(j);
    if (status == 0) status = train_open_data_and_net(j);
    if (status == 0 && dsrt_train_check(&j->o, j->net, j->train) != 0) {
        fprintf(stderr, "%s%s %s\n", prog, j->worker, dsrt_last_error());
        status = 2;
    }
    if (j->mpi) status = train_agree(j, status);
    if (status == 0) status = train_setup_ui(j);
    if (status == 0) status = train_run(j);
    return train_close(j, status);
}
