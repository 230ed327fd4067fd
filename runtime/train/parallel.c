/*
 * The training run with several workers: agreement, cores, joining the net
 * to the communicator, averaging, the bad samples every worker hears of.
 *
 * Every worker makes the same collective calls in the same order, whatever
 * happened to it locally: a step that failed on one worker still reaches
 * the sum of the gradients (dsrt_comm_grads_wait reduces the buckets the
 * hook did not announce) and the agreement that follows, where each worker
 * says whether it failed; the first one that did broadcasts its message, so
 * every worker fails at the same point with the same reason. A worker that
 * died or hangs is found by the communicator's timeout, which names it.
 *
 * Multi-gpu is the same run: one worker a GPU, each on a thread of its own
 * with its own copy of the net and a communicator joining the GPUs of this
 * process (dsrt_comm_open_local), exactly as the processes of an MPI job
 * with one GPU each.
 */
#include "runtime/train/internal.h"

#include "nn/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DP_MSG 512 /* bytes of a failing worker's message broadcast to the others */

void dsrt__dp_setup(run *R) {
    const dsrt_train_options *o = R->o;
    R->comm = o->execution == DSRT_EXEC_PARALLEL ? o->comm : NULL;
    R->rank = R->comm ? dsrt_comm_rank(R->comm) : 0;
    R->world = R->comm ? dsrt_comm_size(R->comm) : 1;
    R->averaging = R->comm && o->averaging_frequency > 0;
}

// ----------------------------------------------------------------------------
// Agreement

int dsrt__dp_agree(run *R, int rc, double *x, size_t n) {
    if (!R->comm) return rc;
    /* x, then one failure flag a worker. */
    size_t m = n + (size_t)R->world;
    double *v = dsrt__calloc(m, sizeof *v);
    if (!v) return rc ? rc : -ENOMEM;
    if (n) memcpy(v, x, n * sizeof *v);
    v[n + (size_t)R->rank] = rc ? 1 : 0;
    char msg[DP_MSG];
    snprintf(msg, sizeof msg, "%s", rc ? dsrt_last_error() : "");
    int cr = dsrt_comm_sum_f64(R->comm, v, m);
    if (cr) {
        free(v);
        return rc ? dsrt__fail(rc, "%s", msg) : dsrt__fail_prefix(cr, "train");
    }
    int first = -1, failed = 0;
    for (int k = 0; k < R->world; k++)
        if (v[n + (size_t)k] != 0) {
            if (first < 0) first = k;
            failed++;
        }
    if (n) memcpy(x, v, n * sizeof *v);
    free(v);
    if (first < 0) return 0;
    /* The first failing worker tells the others why, and its code. */
    double c = rc;
    char told[DP_MSG];
    snprintf(told, sizeof told, "%s", msg);
    if ((cr = dsrt_comm_bcast(R->comm, told, sizeof told, first)) ||
        (cr = dsrt_comm_bcast(R->comm, &c, sizeof c, first)))
        return rc ? dsrt__fail(rc, "%s", msg) : dsrt__fail_prefix(cr, "train");
    if (rc) return dsrt__fail(rc, "%s", msg);
    told[sizeof told - 1] = '\0';
    return dsrt__fail(c != 0 ? (int)c : DSRT_ECLOSED, "train: worker %d of %d failed%s: %s", first,
                      R->world, failed > 1 ? " (and others)" : "", told);
}

// ----------------------------------------------------------------------------
// Cores

/* The number of processes of this job on this node, as the launcher says
 * (Open MPI, MPICH's Hydra, Slurm), or 0 when it does not. */
static int launcher_local_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                       "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(vars); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 0;
}

int dsrt__dp_cpus(run *R) {
    if (!R->comm || R->world < 2 || R->o->cpus || R->ni.device >= 0) return 0;
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    double *v = dsrt__calloc(CPU_SETSIZE, sizeof *v);
    if (!v) return -ENOMEM;
    for (int c = 0; c < CPU_SETSIZE; c++) v[c] = CPU_ISSET(c, &mine) ? 1 : 0;
    int rc = dsrt_comm_sum_f64(R->comm, v, CPU_SETSIZE);
    if (rc) {
        free(v);
        return dsrt__fail_prefix(rc, "train: cores");
    }
    /* Workers that share this process's CPUs: the most that share any of
     * them (on this node: the sums add every node's ranks). */
    int sharers = 0, m = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine)) {
            sharers = DSRT_MAX(sharers, (int)v[c]);
            m++;
        }
    free(v);
    int local = launcher_local_size();
    if (local > 0) sharers = DSRT_MIN(sharers, local);
    if (sharers < 2 || m < sharers) return 0; /* bound by the launcher, or too few to split */
    int slot = dsrt_comm_local_rank(R->comm) % sharers;
    int lo = m * slot / sharers, hi = m * (slot + 1) / sharers, k = 0;
    size_t size = (size_t)(hi - lo) * 8 + 1;
    R->cpus = dsrt__calloc(1, size);
    if (!R->cpus) return -ENOMEM;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &mine)) continue;
        if (k >= lo && k < hi) {
            size_t at = strlen(R->cpus);
            snprintf(R->cpus + at, size - at, "%s%d", at ? "," : "", c);
        }
        k++;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// The net and the communicator

/* Adds to shapes (n of them, at most DSRT_RESERVE_SHAPES) this worker's
 * share of the batches of `batch` samples over `count` (the pipeline's
 * parts: places [all * rank / world, all * (rank + 1) / world) of a batch
 * of `all`): the full batches' and the last one's. */
static void add_shapes(const run *R, size_t count, size_t batch, int drop_last, int *shapes,
                       int *n) {
    size_t all[2] = {DSRT_MIN(batch, count), drop_last || count < batch ? 0 : count % batch};
    for (int k = 0; k < 2; k++) {
        size_t r = (size_t)R->rank, w = (size_t)R->world;
        int part = (int)(all[k] * (r + 1) / w - all[k] * r / w), seen = 0;
        for (int j = 0; j < *n; j++) seen |= shapes[j] == part;
        if (part > 0 && !seen && *n < DSRT_RESERVE_SHAPES) shapes[(*n)++] = part;
    }
}

/* Before the first collective: every batch shape this worker's steps and
 * validation passes take, so that a device backend allocates nothing once
 * NCCL kernels may be in flight (dsrt__net_reserve). */
static int reserve(run *R) {
    const dsrt_train_options *o = R->o;
    dsrt_net_reserve r;
    memset(&r, 0, sizeof r);
    add_shapes(R, o->epoch_samples ? o->epoch_samples : dsrt_datastore_count(R->train),
               (size_t)o->batch, o->drop_last, r.train_n, &r.n_train);
    if (o->validation && R->vbatch > 0)
        add_shapes(R, dsrt_datastore_count(o->validation), (size_t)R->vbatch, 0, r.infer_n,
                   &r.n_infer);
    r.layout = R->u8 ? DSRT_INPUT_U8_NHWC : DSRT_INPUT_F32_NCHW;
    r.infer_layout = DSRT_INPUT_F32_NCHW; /* validation batches are floats */
    r.opt_buffers = R->opt ? dsrt__optimizer_n_buffers(R->opt) : 0;
    int rc = dsrt__net_reserve(R->net, &r);
    return rc ? dsrt__fail_prefix(rc, "train: reserving device memory") : 0;
}

int dsrt__dp_attach(run *R) {
    /* A worker that could not reserve fails every worker here. */
    int rc = dsrt__dp_agree(R, reserve(R), NULL, 0);
    if (rc || !R->comm) return rc;
    if (!R->averaging) {
        /* Worker 0's weights to every worker, and the gradient hook. */
        if ((rc = dsrt_comm_attach(R->comm, R->net))) return dsrt__fail_prefix(rc, "train");
    } else {
        size_t np, ns;
        float *p = dsrt_net_params(R->net, &np), *s = dsrt_net_state(R->net, &ns);
        if ((rc = dsrt_comm_bcast(R->comm, p, np * sizeof *p, 0)) ||
            (ns && (rc = dsrt_comm_bcast(R->comm, s, ns * sizeof *s, 0))))
            return dsrt__fail_prefix(rc, "train");
        dsrt_net_params_changed(R->net);
    }
    if (R->o->bn_statistics == DSRT_BN_SYNC && (rc = dsrt_comm_sync_batchnorm(R->comm, R->net, 1)))
        return dsrt__fail_prefix(rc, "train: bn_statistics sync");
    return 0;
}

int dsrt__dp_sync(run *R) {
    if (!R->comm) return 0;
    int rc = 0;
    if (R->averaging)
        rc = dsrt_comm_average(R->comm, R->net, R->o->average_optimizer_state ? R->opt : NULL);
    if (!rc && R->n_state && R->o->bn_statistics == DSRT_BN_AVERAGE)
        rc = dsrt_comm_average_state(R->comm, R->net);
    return rc ? dsrt__fail_prefix(rc, "train: averaging over the workers") : 0;
}

int dsrt__dp_after_step(run *R, int64_t it) {
    if (!R->averaging || it % R->o->averaging_frequency != 0) return 0;
    int rc = dsrt_comm_average(R->comm, R->net, R->o->average_optimizer_state ? R->opt : NULL);
    return rc ? dsrt__fail_prefix(rc, "train: iteration %lld: parameter averaging", (long long)it)
              : 0;
}

// ----------------------------------------------------------------------------
// Optimizer states for checkpoints

void dsrt__dp_states_free(dp_states *st) {
    free(st->buf);
    free(st->states);
    free(st->steps);
    memset(st, 0, sizeof *st);
    st->ws.workers = 1;
}

int dsrt__dp_gather_states(run *R, dp_states *st) {
    memset(st, 0, sizeof *st);
    st->ws.workers = 1;
    if (!dsrt__dp_own_states(R)) return 0;
    int rc = dsrt__optimizer_host(R->opt);
    int nb = dsrt__optimizer_n_buffers(R->opt), others = R->world - 1;
    size_t n = R->n_params;
    /* Worker 0 keeps every other worker's buffers; the others need room for
     * one buffer as it passes. */
    size_t keep = R->rank == 0 ? (size_t)others * (size_t)nb * n : n;
    if (!rc) {
        st->buf = dsrt__malloc(keep * sizeof(float) + 1);
        st->states = dsrt__calloc((size_t)others, sizeof *st->states);
        st->steps = dsrt__calloc((size_t)others, sizeof *st->steps);
        if (!st->buf || !st->states || !st->steps) rc = -ENOMEM;
    }
    /* A worker without the memory still takes part (every worker makes the
     * same calls): agreed first. */
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) goto fail;
    for (int k = 1; k <= others; k++) {
        if (R->rank == 0) st->states[k - 1] = st->buf + (size_t)(k - 1) * (size_t)nb * n;
        for (int b = 0; b < nb; b++) {
            float *at = R->rank == 0 ? st->states[k - 1] + (size_t)b * n : st->buf;
            if (R->rank == k) at = (float *)dsrt__optimizer_state(R->opt, b);
            if ((rc = dsrt_comm_bcast(R->comm, at, n * sizeof(float), k))) {
                dsrt__fail_prefix(rc, "train: checkpoint: worker %d's optimizer state", k);
                goto fail;
            }
        }
        /* Every worker steps at every iteration: the same count. */
        st->steps[k - 1] = dsrt__optimizer_steps(R->opt);
    }
    st->ws.workers = R->world;
    st->ws.states = (const float *const *)st->states;
    st->ws.steps = st->steps;
    return 0;
fail:
    dsrt__dp_states_free(st);
    return rc;
}

// ----------------------------------------------------------------------------
// Bad samples

/* A bad sample on the wire: this header, then the path (when has_path) and
 * the reason, each ending in a NUL. */
typedef struct {
    uint32_t id;
    int32_t code;
    uint8_t validation, has_path;
} bad_head;

/* A growing buffer of packed bad samples. */
typedef struct {
    char *b;
    size_t len, cap;
} bad_pack;

/* Appends n bytes at data. */
static int put(bad_pack *k, const void *data, size_t n) {
    if (k->len + n > k->cap) {
        size_t c = DSRT_MAX(k->cap * 2, k->len + n + 4096);
        char *m = realloc(k->b, c);
        if (!m) return -ENOMEM;
        k->b = m;
        k->cap = c;
    }
    memcpy(k->b + k->len, data, n);
    k->len += n;
    return 0;
}

static int pack_one(void *ctx, const dsrt_bad_sample *s, int validation) {
    bad_pack *k = ctx;
    bad_head h = {s->id, s->code, (uint8_t)validation, s->path != NULL};
    const char *err = s->error ? s->error : "";
    if (put(k, &h, sizeof h) || (h.has_path && put(k, s->path, strlen(s->path) + 1)) ||
        put(k, err, strlen(err) + 1))
        return -ENOMEM;
    return 0;
}

/* Tells the callback the samples worker w packed into b (len bytes).
 * Returns 1 when it asked to stop. */
static int tell_bad(run *R, int w, const char *b, size_t len) {
    int stop = 0;
    size_t at = 0;
    while (at + sizeof(bad_head) <= len) {
        bad_head h;
        memcpy(&h, b + at, sizeof h);
        at += sizeof h;
        dsrt_bad_sample s = {h.id, NULL, h.code, NULL};
        const char *end = memchr(b + at, 0, len - at);
        if (h.has_path) {
            if (!end) break;
            s.path = b + at;
            at = (size_t)(end - b) + 1;
            end = at < len ? memchr(b + at, 0, len - at) : NULL;
        }
        if (!end) break;
        s.error = b + at;
        at = (size_t)(end - b) + 1;
        stop |= dsrt__train_tell_bad(R, &s, h.validation, w);
    }
    return stop;
}

int dsrt__dp_share_bad(run *R) {
    if (!R->comm) return 0;
    bad_pack mine = {0};
    char *theirs = NULL;
    int stop = 0;
    /* Bytes each worker has to tell, then the training skips of all. */
    double *bytes = dsrt__calloc((size_t)R->world + 1, sizeof *bytes);
    int rc = bytes ? 0 : -ENOMEM;
    dsrt_pipeline *ps[2] = {R->p, R->vp};
    for (int v = 0; v < 2 && rc == 0; v++)
        if (ps[v]) rc = dsrt__train_each_bad(ps[v], &R->bad_sent[v], v, pack_one, &mine);
    /* Who has how much (one sum, nearly always of zeros), then a broadcast
     * from each worker that has some. */
    if (bytes) {
        dsrt_pipeline_statistics st;
        dsrt_pipeline_stats(R->p, &st);
        bytes[R->rank] = (double)mine.len;
        bytes[R->world] = (double)st.skipped;
    }
    if ((rc = dsrt__dp_agree(R, rc, bytes, bytes ? (size_t)R->world + 1 : 0))) goto out;
    R->skipped_all = (uint64_t)bytes[R->world];
    for (int k = 0; k < R->world && rc == 0; k++) {
        size_t n = (size_t)bytes[k];
        if (n == 0) continue;
        char *b = mine.b;
        if (k != R->rank) {
            if (!(b = realloc(theirs, n))) {
                rc = -ENOMEM;
                break;
            }
            theirs = b;
        }
        if ((rc = dsrt_comm_bcast(R->comm, b, n, k))) {
            rc = dsrt__fail_prefix(rc, "train: telling the workers of bad samples");
            break;
        }
        if (k != R->rank) stop |= tell_bad(R, k, b, n);
    }
out:
    free(bytes);
    free(mine.b);
    free(theirs);
    return rc ? rc : stop;
}

int dsrt__dp_check_weights(run *R) {
    if (!R->comm) return 0;
    uint64_t h = dsrt_weights_checksum(R->net);
    double x[2] = {(double)(h >> 32), (double)(h & 0xffffffffu)};
    int rc = dsrt_comm_sum_f64(R->comm, x, 2);
    if (rc) return dsrt__fail_prefix(rc, "train: comparing the weights");
    if (x[0] != (double)(h >> 32) * R->world || x[1] != (double)(h & 0xffffffffu) * R->world)
        return dsrt__fail(DSRT_ECORRUPT,
                          "train: worker %d: its weights (checksum %016llx) differ from the other "
                          "workers'",
                          R->rank, (unsigned long long)h);
    return 0;
}
