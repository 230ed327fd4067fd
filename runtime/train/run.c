/*
 * The training run: a pipeline makes batches in the background on the
 * worker cores while the calling thread and its OpenMP team, pinned to the
 * compute cores, run forward, backward and the optimizer step on each batch
 * as soon as it is ready. Around it: validation passes on a second
 * pipeline, patience, the best-validation network, atomic checkpoints with
 * the loop's own state beside them, exact resume (the pipeline restarts at
 * the checkpoint's batch, the net's iteration counter keys dropout) and a
 * stop on a non-finite loss; and several GPUs of one machine, a worker on a
 * thread of its own each. The options and their checks, the split of the
 * cores and evaluation are in options.c, checkpoints in checkpoint.c, what
 * several workers do together in parallel.c and job.c, events in events.c:
 * this file calls them, none of them calls it.
 *
 * dsrt_train reads as four parts: run_open (device, optimizer, resume,
 * cores, pipelines, position), run_step (one iteration, repeated),
 * run_finish (the last checkpoint and validation, the best weights) and
 * run_close (the result, the END event, freeing).
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

#include "runtime/train/internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Batches, events, validation

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
    in.soft_labels = b->soft_labels;
    in.n = (int)b->count;
    /* Gradients summed over the workers: each scales by its share. */
    in.global_n = R->comm && !R->averaging ? (int)b->global_count : 0;
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
    if (a->erase_probability > 0.0) return 0; /* erasing writes normalised floats */
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

/* One pass over the validation data: each readable sample once (the
 * pipeline leaves bad ones out rather than repeat another). */
static int validate(run *R, double *loss, double *acc) {
    double t = dsrt__now_s(), lsum = 0;
    uint64_t images = 0, correct = 0;
    /* Every worker validates the same net, each its part of the data. */
    int rc = dsrt__dp_sync(R);
    if (rc) return rc;
    for (uint64_t k = 0; k < R->vbpe && !rc; k++) {
        dsrt_batch *b;
        rc = dsrt_pipeline_next(R->vp, &b);
        if (rc) {
            dsrt__fail_prefix(rc, "train: validation");
            break;
        }
        if (b->count == 0) { /* every sample of the batch bad, or an empty part */
            dsrt_batch_release(R->vp, b);
            continue;
        }
        for (size_t i = 0; i < b->count; i++) R->vlabels[i] = R->vmap[b->labels[i]];
        float l = 0;
        int c = 0;
        rc = dsrt_net_predict(R->net, b->data, (int)b->count, NULL, R->vlabels, &l, &c);
        size_t n = b->count;
        dsrt_batch_release(R->vp, b);
        if (rc) {
            dsrt__fail_prefix(rc, "train: validation");
            break;
        }
        lsum += (double)l * (double)n;
        correct += (uint64_t)c;
        images += n;
    }
    double x[3] = {lsum, (double)correct, (double)images};
    if ((rc = dsrt__dp_agree(R, rc, x, 3))) return rc;
    lsum = x[0];
    correct = (uint64_t)x[1];
    images = (uint64_t)x[2];
    *loss = images ? lsum / (double)images : NAN;
    *acc = images ? (double)correct / (double)images : NAN;
    R->val_s += dsrt__now_s() - t;
    R->val_left_out += dsrt_datastore_count(R->o->validation) - images;
    return 0;
}

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

// ----------------------------------------------------------------------------
// Open: the device, the optimizer, the checkpoint to resume, the cores, the
// pipelines and the position

/* Mixup or cutmix asked for: the batches are mixed as floats. */
static int train_mixing(const dsrt_train_options *o) {
    return o->mixup_alpha > 0 || o->cutmix_alpha > 0 || o->cutmix_minmax[1] > 0;
}

/* The net computes where the execution environment says. Nothing to undo
 * when this fails. */
static int run_device(run *R) {
    int device = DSRT_DEVICE_CPU, rc;
    if ((rc = dsrt__train_resolve_device(R->o, &device))) return rc;
    if ((rc = dsrt_net_set_device(R->net, device))) return dsrt__fail_prefix(rc, "train");
    dsrt_net_device_time(R->net, &R->busy0, &R->idle0);
    dsrt_net_get_info(R->net, &R->ni);
    return 0;
}

/* The training pipeline and, with validation data, the validation one, on
 * the worker cores. */
static int open_pipelines(run *R, const dsrt_augment_options *aug,
                          const dsrt_augment_options *vaug) {
    const dsrt_train_options *o = R->o;
    int rc;
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = (size_t)o->batch;
    po.prefetch = o->prefetch;
    po.threads = R->cp.workers;
    po.cpus = R->cp.worker_cpus;
    po.pin = o->pin;
    po.drop_last = o->drop_last;
    po.shuffle = o->shuffle;
    po.seed = R->r->seed;
    po.epochs = (uint64_t)o->max_epochs;
    po.fail_on_error = o->fail_on_error;
    po.gpu = R->ni.device;
    po.parts = (unsigned)R->world;
    po.part = (unsigned)R->rank;
    po.mixup_alpha = o->mixup_alpha;
    po.cutmix_alpha = o->cutmix_alpha;
    po.cutmix_minmax[0] = o->cutmix_minmax[0];
    po.cutmix_minmax[1] = o->cutmix_minmax[1];
    po.mix_prob = o->mix_prob;
    po.mix_switch_prob = o->mix_switch_prob;
    po.label_smoothing = o->label_smoothing;
    po.classes = (size_t)R->ni.classes;
    po.sample_weights = o->sample_weights;
    po.epoch_samples = o->epoch_samples;
    if (o->read_depth) po.reader.depth = o->read_depth;
    dsrt__remote_apply(&po.reader.remote, &o->remote);
    if ((rc = dsrt_pipeline_open(&R->p, R->train, aug, &po))) return dsrt__fail_prefix(rc, "train");
    if (!(R->step_ids = dsrt__calloc(po.batch, sizeof *R->step_ids))) return -ENOMEM;
    if (!o->validation) return 0;
    dsrt_pipeline_options vo = po;
    R->vbatch = o->validation_batch ? o->validation_batch : o->batch;
    vo.batch = (size_t)R->vbatch;
    vo.prefetch = 2;
    vo.drop_last = 0;
    vo.shuffle = DSRT_SHUFFLE_NEVER;
    vo.epochs = 0;
    vo.drop_bad = 1;
    /* Validation scores the images as they are, against the hard labels. */
    vo.mixup_alpha = vo.cutmix_alpha = vo.label_smoothing = 0;
    vo.cutmix_minmax[0] = vo.cutmix_minmax[1] = 0;
    /* and walks its data once. */
    vo.sample_weights = NULL;
    vo.epoch_samples = 0;
    if ((rc = dsrt_pipeline_open(&R->vp, o->validation, vaug, &vo)))
        return dsrt__fail_prefix(rc, "train: validation");
    R->vbpe = dsrt_pipeline_batches_per_epoch(R->vp);
    R->vlabels = dsrt__calloc((size_t)R->vbatch, sizeof *R->vlabels);
    return R->vlabels ? 0 : -ENOMEM;
}

/* Everything a run holds, up to the first step; the pipeline stands at the
 * position to start from (a checkpoint's, or the first batch). */
static int run_open(run *R) {
    const dsrt_train_options *o = R->o;
    dsrt_train_result *r = R->r;
    dsrt_net *net = R->net;
    int rc;
    dsrt_net_params(net, &R->n_params);
    dsrt_net_state(net, &R->n_state);
    R->ls.batch = o->batch;
    R->ls.samples = (int64_t)(o->epoch_samples ? o->epoch_samples : dsrt_datastore_count(R->train));
    R->ls.drop_last = o->drop_last;
    snprintf(R->ls.order, sizeof R->ls.order, "%s",
             dsrt_shard_order_name(dsrt_datastore_shard_order(R->train)));
    R->ls.shuffle_buffer = (int64_t)dsrt_datastore_shuffle_buffer(R->train);
    dsrt__train_sampling(o, R->train, R->ls.sampling, sizeof R->ls.sampling);
    R->ls.workers = R->world;
    dsrt_augment_options aug, vaug;
    dsrt__train_resolve_augment(&o->augment, &R->ni, &aug, "train");
    vaug = aug;
    dsrt__train_fixed_augment(&vaug);
    R->u8 = (o->uint8_batches == 1 || (o->uint8_batches < 0 && R->ni.device >= 0)) &&
            !train_mixing(o) && u8_transfer(&aug, R->sub_div);

    /* What each worker opens for itself, then agreed: a worker that could
     * not fails every worker here, before any step. */
    rc = dsrt_optimizer_create(&R->opt, net, &o->optimizer);
    if (!rc && o->output_network == DSRT_OUTPUT_BEST_VALIDATION) {
        R->best_params = dsrt__malloc(R->n_params * sizeof(float) + 1);
        R->best_state = dsrt__malloc(R->n_state * sizeof(float) + 1);
        if (!R->best_params || !R->best_state) rc = -ENOMEM;
    }
    if (!rc && o->validation)
        rc = dsrt__train_class_map(net, o->validation, R->train, R->ni.classes,
                                   "train: validation data", &R->vmap);

    /* The position: a checkpoint's, or the start. */
    dsrt_train_position pos = {0, 0, o->seed};
    if (!rc && o->resume) {
        rc = dsrt__train_load_resume(R, &pos, r->checkpoint, sizeof r->checkpoint);
        if (!rc) r->seed = pos.seed;
    }
    if (!rc && o->checkpoint_path && R->rank == 0) rc = dsrt__train_make_dir(o->checkpoint_path);
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) return rc;
    if (o->resume && (rc = dsrt__dp_same_position(R, &pos))) return rc;

    /* Cores (a share of them when workers share this process's), then the
     * pipelines on the worker cores. */
    if ((rc = dsrt__dp_cpus(R))) return rc;
    rc = dsrt__cores_open(&R->cp, R->cpus ? R->cpus : o->cpus, o->pin, o->workers,
                          o->compute_threads, &R->ni, net, "train");
    if (!rc) rc = open_pipelines(R, &aug, &vaug);
    int64_t epoch0 = pos.epoch;
    if (!rc) {
        R->bpe = (int64_t)dsrt_pipeline_batches_per_epoch(R->p);
        R->max_it = R->bpe * o->max_epochs;
        R->it = pos.iteration;
        int64_t in_epoch = R->it - epoch0 * R->bpe;
        if (o->resume && (epoch0 < 0 || in_epoch < 0 || in_epoch >= R->bpe || R->it > R->max_it))
            rc = dsrt__fail(DSRT_EOPTION,
                            "train: resume: %s: epoch %lld, iteration %lld do not fit %lld "
                            "batches an epoch and max_epochs %d",
                            r->checkpoint, (long long)epoch0, (long long)R->it, (long long)R->bpe,
                            o->max_epochs);
        else if (o->resume && R->it < R->max_it)
            /* Workers of the run that wrote the checkpoint: another number
             * of them finishes its epoch's batches, re-striped. */
            rc = dsrt_pipeline_resume(R->p, (uint64_t)epoch0, (uint64_t)in_epoch,
                                      (unsigned)r->resume_workers);
    }
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) return rc;
    /* Every worker from worker 0's weights, gradients summed as backward
     * goes (or parameters averaged). */
    if ((rc = dsrt__dp_attach(R))) return rc;
    r->start_iteration = R->it;
    r->iterations = R->it;
    r->epochs = epoch0;
    R->ckpt_it = o->resume ? R->it : -1;
    return 0;
}

/* Takes the batch for iteration it and starts it on its way to the device;
 * a failure is kept in R->pending, reported when the batch is due. */
static void take_next(run *R, int64_t it) {
    R->copied = 0;
    int rn = take_batch(R, &R->b, it, R->bpe);
    if (rn == 0 && (rn = stage_batch(R, R->b, &R->copied)) != 0) {
        dsrt_batch_release(R->p, R->b);
        R->b = NULL;
    }
    if (rn) {
        R->pending = rn;
        snprintf(R->pending_msg, sizeof R->pending_msg, "%s", dsrt_last_error());
    }
}

/* Pins the compute threads, tells the START event and takes the first batch. */
static int run_start(run *R) {
    dsrt_train_result *r = R->r;
    dsrt__cores_start_compute(&R->cp);
    r->workers = R->cp.workers;
    r->compute_threads = R->cp.threads;
    r->pinned = R->cp.team_pinned;

    R->t0 = dsrt__now_s();
    dsrt_train_event *ev = &R->ev;
    int64_t epoch0 = r->epochs;
    ev->max_epochs = R->o->max_epochs;
    ev->iterations_per_epoch = R->bpe;
    ev->max_iterations = R->max_it;
    ev->iteration = R->it;
    ev->epoch = epoch0 + (R->it < R->max_it ? 1 : 0);
    ev->batch_in_epoch = R->it - epoch0 * R->bpe;
    ev->learn_rate = dsrt_optimizer_learn_rate(R->opt, (int)epoch0);
    ev->loss = ev->accuracy = ev->val_loss = ev->val_accuracy = NAN;
    ev->workers = R->cp.workers;
    ev->compute_threads = R->cp.threads;
    ev->pinned = R->cp.team_pinned;
    ev->rank = R->rank;
    ev->world = R->world;
    /* A stop asked by any worker's callback stops every worker. */
    double stop = dsrt__train_emit(R, DSRT_EVENT_START);
    int rc = dsrt__dp_agree(R, 0, &stop, 1);
    if (rc) return rc;
    if (stop != 0) R->stop = DSRT_STOP_CALLBACK + 1;
    if (R->it < R->max_it) take_next(R, R->it);
    return 0;
}

// ----------------------------------------------------------------------------
// Step: forward and backward on the batch taken, the next one taken
// meanwhile, the optimizer step, then validation, events and checkpoints

/* Forward and backward on b while the next batch is taken and staged; the
 * loss and correct count of b into *loss and *correct. b is released. */
static int forward_backward(run *R, dsrt_batch *b, float *loss, int *correct) {
    dsrt_net *net = R->net;
    int rc = 0;
    dsrt_net_batch in = net_batch(R, b);
    R->b = NULL;
    if (R->copied) {
        /* The copy is done: the slot goes back to the workers now. */
        rc = dsrt_net_stage_wait(net);
        dsrt_batch_release(R->p, b);
        b = NULL;
    }
    if (rc == 0) rc = dsrt_net_train_start(net, &in);
    if (rc == 0) {
        /* While the step runs: the next batch, on its way to the device.
         * A failure to take it is reported when it is due. */
        R->copied = 0;
        if (R->it + 1 < R->max_it) take_next(R, R->it + 1);
        rc = dsrt_net_train_finish(net, loss, correct);
    }
    if (b) dsrt_batch_release(R->p, b);
    return rc;
}

/* A checkpoint after iteration it, epochs_done epochs: every worker holds
 * the same net first; worker 0 writes it. */
static int checkpoint(run *R, int64_t epochs_done, int64_t it) {
    R->ckpt_it = it;
    dp_states st;
    int rc = dsrt__dp_sync(R);
    if (rc) return rc;
    if ((rc = dsrt__dp_gather_states(R, &st))) return rc;
    if (R->rank == 0) rc = dsrt__train_save_checkpoint(R, epochs_done, it, &st);
    dsrt__dp_states_free(&st);
    return rc;
}

/* After the optimizer step of iteration R->it (batch `index` of epoch
 * `epoch`): validation when due, the events, the checkpoint when due, then
 * the workers agree on stopping. */
static int after_step(run *R, int64_t epoch, int64_t index) {
    const dsrt_train_options *o = R->o;
    dsrt_train_result *r = R->r;
    dsrt_train_event *ev = &R->ev;
    int64_t it = R->it;
    int end_of_epoch = index == R->bpe - 1;
    int rc = 0;
    int validate_now =
        R->vp && ((o->validation_frequency > 0 && it % o->validation_frequency == 0) ||
                  (o->validation_frequency == 0 && end_of_epoch) || it == R->max_it);
    if (validate_now) {
        double vl, va;
        if ((rc = validate(R, &vl, &va))) return rc;
        /* Validation staged batches of its own where the next training
         * batch waits on the device: that batch goes again (its slot is
         * still held), or the step would read what validation left. */
        if (R->b && R->copied && (rc = stage_batch(R, R->b, &R->copied))) return rc;
        after_validation(R, vl, va, it);
        ev->val_loss = r->val_loss = vl;
        ev->val_accuracy = r->val_accuracy = va;
    }
    R->validated_last = validate_now;
    ev->verbose = it == r->start_iteration + 1 || it % o->verbose_frequency == 0 ||
                  it == R->max_it || validate_now;
    R->stop_request = 0;
    if ((rc = dsrt__dp_share_bad(R)) < 0) return rc;
    if (rc) R->stop_request = 1;
    int patience = 0;
    if (dsrt__train_emit(R, DSRT_EVENT_ITERATION)) R->stop_request = 1;
    if (validate_now) {
        if (dsrt__train_emit(R, DSRT_EVENT_VALIDATION)) R->stop_request = 1;
        patience = o->validation_patience > 0 && R->ls.bad_count >= o->validation_patience;
    }
    if (end_of_epoch) {
        r->epochs = epoch + 1;
        if (dsrt__train_emit(R, DSRT_EVENT_EPOCH)) R->stop_request = 1;
    }
    int ckpt = o->checkpoint_path &&
               ((o->checkpoint_unit == DSRT_UNIT_EPOCH && end_of_epoch &&
                 (epoch + 1) % o->checkpoint_frequency == 0) ||
                (o->checkpoint_unit == DSRT_UNIT_ITERATION && it % o->checkpoint_frequency == 0));
    if (ckpt) rc = checkpoint(R, end_of_epoch ? epoch + 1 : epoch, it);
    /* A stop asked on any worker stops them all; patience is the same on
     * every worker (the validation figures are). */
    double stop = R->stop_request;
    if ((rc = dsrt__dp_agree(R, rc, &stop, 1))) return rc;
    if (stop != 0)
        R->stop = DSRT_STOP_CALLBACK + 1;
    else if (patience)
        R->stop = DSRT_STOP_PATIENCE + 1;
    return 0;
}

/* One iteration on the batch taken: forward and backward, the gradients
 * summed over the workers, the figures agreed, the optimizer step. */
static int run_step(run *R) {
    dsrt_train_result *r = R->r;
    dsrt_train_event *ev = &R->ev;
    dsrt_batch *b = R->b;
    int64_t epoch = R->it / R->bpe, index = R->it % R->bpe;
    size_t count = 0, b_count = 0;
    float loss = 0;
    int correct = 0, rc;
    if (!b) {
        /* Taking this batch failed during the last step. */
        rc = dsrt__fail(R->pending, "%s", R->pending_msg);
    } else {
        epoch = (int64_t)b->epoch;
        index = (int64_t)b->index;
        count = b->count;
        b_count = count;
        if (R->step_ids) memcpy(R->step_ids, b->ids, count * sizeof *R->step_ids);
        rc = forward_backward(R, b, &loss, &correct);
        if (rc == DSRT_ENAN) {
            loss = NAN;
            rc = 0;
        }
        if (rc)
            dsrt__fail_prefix(rc, "train: epoch %lld, iteration %lld", (long long)epoch + 1,
                              (long long)R->it + 1);
    }
    double dloss = loss;
    if (R->comm) {
        if (!R->averaging) {
            int cr = dsrt_comm_grads_wait(R->comm);
            if (cr)
                return rc ? rc
                          : dsrt__fail_prefix(cr, "train: epoch %lld, iteration %lld: gradients",
                                              (long long)epoch + 1, (long long)R->it + 1);
        }
        double x[3] = {(double)loss * (double)count, (double)correct, (double)count};
        if ((rc = dsrt__dp_agree(R, rc, x, 3))) return rc;
        dloss = x[2] > 0 ? x[0] / x[2] : NAN;
        correct = (int)x[1];
        count = (size_t)x[2];
    }
    if (rc) return rc;
    if (!isfinite(dloss))
        return dsrt__fail(DSRT_ENAN,
                          "train: epoch %lld, iteration %lld: the loss is not finite (%g): "
                          "training stopped (learn rate %g too high? try a lower one or a "
                          "gradient threshold); %s%s",
                          (long long)epoch + 1, (long long)R->it + 1, dloss,
                          dsrt_optimizer_learn_rate(R->opt, (int)epoch),
                          r->checkpoint[0] ? "the last good checkpoint is "
                                           : "no checkpoint was written",
                          r->checkpoint);
    if ((rc = dsrt_optimizer_step(R->opt, R->net, (int)epoch))) return rc;
    R->it++;
    if ((rc = dsrt__dp_after_step(R, R->it))) return rc;
    r->images += count;
    r->iterations = R->it;
    r->loss = dloss;
    r->accuracy = (double)correct / (double)count;
    ev->images = r->images;
    ev->iteration = R->it;
    ev->epoch = epoch + 1;
    ev->batch_in_epoch = index + 1;
    ev->learn_rate = dsrt_optimizer_learn_rate(R->opt, (int)epoch);
    ev->loss = dloss;
    ev->accuracy = r->accuracy;
    ev->val_loss = ev->val_accuracy = NAN;
    ev->ids = R->step_ids;
    ev->ids_count = R->step_ids ? b_count : 0;
    rc = after_step(R, epoch, index);
    ev->ids = NULL;
    ev->ids_count = 0;
    return rc;
}

// ----------------------------------------------------------------------------
// Finish and close

/* After the last iteration: every worker holds the same net; the final
 * checkpoint (unless one was just written), then a validation if the run
 * stopped early without one (or was resumed with none left). It only
 * reports: the checkpoint holds the state of the loop as the uninterrupted
 * run has it. Then the best weights, when asked for. */
static int run_finish(run *R) {
    const dsrt_train_options *o = R->o;
    dsrt_train_result *r = R->r;
    int64_t it = R->it;
    int rc;
    if ((rc = dsrt__dp_sync(R))) return rc;
    if (o->checkpoint_path && it > r->start_iteration && R->ckpt_it != it) {
        R->stop_request = 0;
        rc = checkpoint(R, it / R->bpe, it);
        if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) return rc;
        if (R->stop_request) R->stop = DSRT_STOP_CALLBACK + 1;
    }
    /* (Also a resumed run with nothing left to train: what it reports is
     * measured now, never the checkpoint's figures.) */
    if (R->vp && !R->validated_last) {
        double vl, va;
        if ((rc = validate(R, &vl, &va))) return rc;
        R->ev.val_loss = r->val_loss = vl;
        R->ev.val_accuracy = r->val_accuracy = va;
        if ((rc = dsrt__dp_share_bad(R)) < 0) return rc;
        rc = 0;
        dsrt__train_emit(R, DSRT_EVENT_VALIDATION);
    }
    if (R->best_params && !isnan(R->ls.best_val_loss) && R->ls.best_iteration != it) {
        memcpy(dsrt_net_params(R->net, NULL), R->best_params, R->n_params * sizeof(float));
        memcpy(dsrt_net_state(R->net, NULL), R->best_state, R->n_state * sizeof(float));
        dsrt_net_params_changed(R->net);
    }
    if ((rc = dsrt__dp_check_weights(R))) return rc;
    r->stop = R->stop ? (dsrt_stop_reason)(R->stop - 1) : DSRT_STOP_MAX_EPOCHS;
    return 0;
}

/* Fills the result's figures, tells the END event (once the loop started)
 * and frees everything. Returns rc. */
static int run_close(run *R, int rc) {
    dsrt_train_result *r = R->r;
    dsrt_net *net = R->net;
    /* The failure's message, kept through what follows (callbacks may call
     * dsrt). */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc ? dsrt_last_error() : "");
    /* A batch taken ahead of a stop or failure goes back unused. */
    if (R->b) {
        if (R->copied) dsrt_net_stage_wait(net);
        dsrt_batch_release(R->p, R->b);
        R->b = NULL;
    }
    double wall = R->t0 > 0 ? dsrt__now_s() - R->t0 : 0;
    r->val_s = R->val_s;
    r->train_s = wall - R->val_s;
    r->images_per_s = r->train_s > 0 ? (double)r->images / r->train_s : 0;
    r->best_val_loss = R->ls.best_val_loss;
    r->best_iteration = R->ls.best_iteration;
    /* Bad samples: each once, whichever workers found it (the last found
     * here told first); skips summed over the workers. */
    if (R->p) dsrt__train_emit_bad(R, R->p, 0);
    if (R->vp) dsrt__train_emit_bad(R, R->vp, 1);
    if (R->p) {
        dsrt_pipeline_statistics s;
        dsrt_pipeline_stats(R->p, &s);
        r->consumer_wait_s = s.consumer_wait_s;
        r->remote_requests = s.remote_requests;
        r->remote_bytes = s.remote_bytes;
        r->cache_hits = s.cache_hits;
        r->cache_bytes = s.cache_bytes;
        r->cache_misses = s.cache_misses;
        r->cache_evictions = s.cache_evictions;
        r->skipped = R->comm ? R->skipped_all : s.skipped;
        r->bad_samples = R->bad_ids[0].n;
    }
    if (R->vp) {
        r->val_skipped = R->val_left_out; /* not the pipeline's: that counts prefetched passes */
        r->val_bad_samples = R->bad_ids[1].n;
    }
    r->weights_checksum = dsrt_weights_checksum(net);
    r->rank = R->rank;
    r->world = R->world;
    r->device = R->ni.device;
    dsrt_net_device_time(net, &r->device_busy_s, &r->device_idle_s);
    r->device_busy_s -= R->busy0;
    r->device_idle_s -= R->idle0;
    if (rc) r->stop = DSRT_STOP_ERROR;
    if (R->t0 > 0) {
        R->ev.status = rc;
        R->ev.val_loss = r->val_loss;
        R->ev.val_accuracy = r->val_accuracy;
        if (rc) dsrt__fail(rc, "%s", msg);
        dsrt__train_emit(R, DSRT_EVENT_END);
    }
    if (R->comm) {
        /* The net leaves the communicator (a broken one keeps it until
         * dsrt_comm_close). */
        dsrt_comm_attach(R->comm, NULL);
        dsrt_comm_sync_batchnorm(R->comm, net, 0);
    }
    dsrt_pipeline_close(R->vp);
    dsrt_pipeline_close(R->p);
    dsrt__cores_close(&R->cp);
    dsrt_optimizer_destroy(R->opt);
    free(R->best_params);
    free(R->best_state);
    free(R->vmap);
    free(R->vlabels);
    free(R->step_ids);
    free(R->cpus);
    dsrt__id_set_free(&R->bad_ids[0]);
    dsrt__id_set_free(&R->bad_ids[1]);
    if (rc) dsrt__fail(rc, "%s", msg);
    return rc;
}

/* The result of a run that has not begun: a failure, nothing measured. */
static void result_init(dsrt_train_result *r, const dsrt_train_options *o) {
    memset(r, 0, sizeof *r);
    r->stop = DSRT_STOP_ERROR;
    r->val_loss = r->val_accuracy = r->best_val_loss = NAN;
    r->best_iteration = -1;
    r->seed = o->seed;
    r->loss = r->accuracy = NAN;
    r->world = 1;
}

int dsrt__train_worker(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *o,
                       dsrt_train_result *r) {
    result_init(r, o);

    run R;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.net = net;
    R.train = train;
    R.r = r;
    dsrt__loop_state_init(&R.ls);
    dsrt__dp_setup(&R);
    int rc = dsrt_train_check(o, net, train);
    if (rc == 0) rc = run_device(&R);
    /* Options refused or the device missing on any worker: every worker
     * fails, before any work; so does every worker when they do not all
     * run the same job. */
    if ((rc = dsrt__dp_agree(&R, rc, NULL, 0))) return rc;
    if ((rc = dsrt__dp_same_job(&R))) return rc;
    r->rank = R.rank;
    r->world = R.world;
    rc = run_open(&R);
    if (rc == 0) rc = run_start(&R);
    while (rc == 0 && !R.stop && R.it < R.max_it) rc = run_step(&R);
    if (rc == 0) rc = run_finish(&R);
    return run_close(&R, rc);
}

// ----------------------------------------------------------------------------
// Multi-gpu: one worker a GPU, a thread each

typedef struct {
    dsrt_net *net;
    const dsrt_datastore *train;
    dsrt_train_options o;
    dsrt_train_result r;
    int rc;
    char msg[1024];
    pthread_t thread;
    int started;
} gpu_worker;

static void *gpu_worker_main(void *arg) {
    gpu_worker *w = arg;
    w->rc = dsrt__train_worker(w->net, w->train, &w->o, &w->r);
    if (w->rc) snprintf(w->msg, sizeof w->msg, "%s", dsrt_last_error());
    return NULL;
}

/* A copy of net on device: through a model file, which keeps everything
 * the net needs (description, weights, state, input statistics). */
static int copy_net(const dsrt_net *net, int device, const char *tmp, dsrt_net **out) {
    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    dsrt_net_options no = dsrt_net_defaults();
    no.device = device;
    no.precision = ni.precision;
    int rc = dsrt_model_load(out, tmp, &no);
    return rc ? dsrt__fail_prefix(rc, "train: multi-gpu: a copy of the net for GPU %d", device) : 0;
}

static int train_multi_gpu(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *o,
                           dsrt_train_result *r) {
    int rc = dsrt_train_check(o, net, train);
    if (rc) return rc;
    int n = o->gpus ? o->gpus : dsrt_gpu_count();
    gpu_worker *w = dsrt__calloc((size_t)n, sizeof *w);
    dsrt_comm **comms = dsrt__calloc((size_t)n, sizeof *comms);
    int *devices = dsrt__calloc((size_t)n, sizeof *devices);
    char tmp[4096] = "";
    if (!w || !comms || !devices) {
        rc = -ENOMEM;
        goto out;
    }
    for (int k = 0; k < n; k++) devices[k] = k;
    if ((rc = dsrt_comm_open_local(comms, n, devices, &o->comm_options))) {
        dsrt__fail_prefix(rc, "train: multi-gpu");
        goto out;
    }
    if (n > 1) {
        const char *dir = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/dsrt-multi-gpu-%ld.dsrt", dir && *dir ? dir : "/tmp",
                 (long)getpid());
        if ((rc = dsrt_model_save(tmp, net))) {
            dsrt__fail_prefix(rc, "train: multi-gpu: copying the net");
            tmp[0] = '\0';
            goto out;
        }
    }
    for (int k = 0; k < n; k++) {
        w[k].train = train;
        w[k].o = *o;
        w[k].o.execution = DSRT_EXEC_PARALLEL;
        w[k].o.comm = comms[k];
        w[k].o.gpu = devices[k];
        if (k > 0) {
            w[k].o.callback = NULL; /* the calling thread's worker tells */
            if ((rc = copy_net(net, devices[k], tmp, &w[k].net))) goto out;
        } else {
            w[k].net = net;
        }
    }
    for (int k = 1; k < n; k++) {
        int e = pthread_create(&w[k].thread, NULL, gpu_worker_main, &w[k]);
        if (e) {
            /* The workers started would wait for this one: the
             * communicator's timeout ends them. */
            rc = dsrt__fail(-e, "train: multi-gpu: starting the worker of GPU %d: %s", k,
                            strerror(e));
            break;
        }
        w[k].started = 1;
    }
    if (rc == 0) {
        gpu_worker_main(&w[0]);
        rc = w[0].rc;
    }
    for (int k = 1; k < n; k++)
        if (w[k].started) pthread_join(w[k].thread, NULL);
    if (rc == 0)
        for (int k = 1; k < n && !rc; k++)
            if (w[k].rc) rc = dsrt__fail(w[k].rc, "%s", w[k].msg);
    if (w[0].rc) dsrt__fail(w[0].rc, "%s", w[0].msg);
    *r = w[0].r;
out:
    if (tmp[0]) unlink(tmp);
    /* The communicators first (they are attached to the nets, and the last
     * one closed finalises every member's NCCL communicator together, in
     * one group, from this thread), then the workers' nets. */
    if (comms)
        for (int k = 0; k < n; k++) dsrt_comm_close(comms[k]);
    if (w)
        for (int k = 1; k < n; k++) dsrt_net_destroy(w[k].net);
    free(w);
    free(comms);
    free(devices);
    return rc;
}

int dsrt_train(dsrt_net *net, const dsrt_datastore *train, const dsrt_train_options *options,
               dsrt_train_result *res) {
    dsrt_train_options defaults = dsrt_train_defaults();
    const dsrt_train_options *o = options ? options : &defaults;
    dsrt_train_result local;
    dsrt_train_result *r = res ? res : &local;
    if (o->execution != DSRT_EXEC_MULTI_GPU) return dsrt__train_worker(net, train, o, r);
    result_init(r, o);
    return train_multi_gpu(net, train, o, r);
}
