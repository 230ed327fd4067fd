/*
 * The NCCL engine of the communicators: gradient buckets on device memory,
 * and the in-process group of dsrt_comm_open_local.
 *
 * Each bucket's sum is ordered after backward without the host waiting: the
 * gradient hook records an event on the net's compute stream the moment
 * backward has queued the bucket's last gradient, the communication stream
 * waits for that event, and ncclAllReduce (in place) is queued there,
 * followed by a done event. grads_wait only makes the compute stream wait
 * for the last done event, so the optimizer and the next forward are
 * queued behind the sums at once, and the host goes on. The deadline is
 * kept where the host does wait for the device: the net's backend polls
 * (net->wait_check) and this engine's check fails the wait once a sum (or a
 * batchnorm sum) has been queued for longer than the timeout, aborting the
 * NCCL communicator (ncclCommAbort, which is what NCCL offers to get out of
 * a collective that cannot complete), so that a peer that never arrives
 * makes the step fail instead of hanging. Events come in two sets, for
 * alternate steps: a set is reused only once its sums are seen done, and
 * then gives the timeline of its step (device times between a bucket's
 * ready and done events).
 *
 * Across processes the communicator is created non-blocking
 * (ncclConfig_t.blocking = 0) from a unique id that rank 0 makes and MPI
 * broadcasts, so its set-up has the deadline too; the MPI side stays open
 * for the small host sums and the heartbeats that name missing ranks. In one
 * process (the multi-gpu mode) the members are made non-blocking too, by
 * ncclCommInitRankConfig for every device inside one ncclGroupStart/End (a
 * thread driving several devices must group their calls), each then driven
 * by a thread of its own; their host sums meet in a small group structure
 * in the process (a mutex, a condition variable, sums in member order so
 * every member gets the same bits). They are finalised and destroyed
 * together, inside one group again, by whichever thread closes the last of
 * them, and aborted together when that fails.
 *
 * It is the module dsrt_nccl.so (core/module.h), which comm.c loads when a
 * communicator first asks for it.
 */
#include "runtime/comm/comm_internal.h"
#include "core/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DSRT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

/* One of the two sets of bucket events, for alternate steps. */
typedef struct {
    cudaEvent_t *ready, *done; /* (n_bk) each; timing enabled */
    double *queued_s;          /* (n_bk) when the host queued each sum */
    int64_t *bucket_seq;       /* (n_bk) heartbeat position (MPI) */
    int *order;                /* (n_bk) the buckets in the order they were queued */
    int n_started;
    int open;  /* sums queued whose completion is not yet seen */
    int ended; /* its step's grads_wait has returned */
    int64_t step;
    double bw_start, bw_end, wait_end;
} bucket_set;

struct comm_nccl {
    ncclComm_t comm;
    int have_comm;
    int device;
    cudaStream_t stream; /* communication stream */
    bucket_set set[2];
    int cur; /* the set of the step in progress */
    int n_events;
    int64_t steps;
    int64_t last_step; /* the step c->last holds */
    /* The last batchnorm sum queued on the compute stream. */
    cudaEvent_t bn_done;
    double bn_queued_s;
    int bn_open;
    double next_watch_s;
    int err; /* a CUDA or NCCL failure in start, for wait */
    char errmsg[256];
};

static int cuda_fail(cudaError_t e, const char *what) {
    return dsrt__fail(DSRT_EBACKEND, "comm: %s: CUDA: %s", what, cudaGetErrorString(e));
}

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    return dsrt__fail(DSRT_EBACKEND, "comm: %s: NCCL: %s%s%s", what, ncclGetErrorString(r),
                      last && *last ? ": " : "", last && *last ? last : "");
}

static void nap(void) {
    struct timespec t = {0, 20000};
    nanosleep(&t, NULL);
}

/* Waits until a non-blocking communicator's pending call is done, until
 * `deadline`: 0, -ETIMEDOUT (nothing aborted), or NCCL's failure. */
static int settle_until(ncclComm_t comm, double deadline, const char *what) {
    for (;;) {
        ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return nccl_fail(r, comm, what);
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_fail(st, comm, what);
        if (dsrt__comm_now() > deadline) return -ETIMEDOUT;
        nap();
    }
}

/* Fails c for good after a collective ran out of time: its NCCL
 * communicator aborted, the message naming what and, with MPI, the ranks
 * the heartbeats say are missing (seq: the collective's position on chan). */
static int time_out(dsrt_comm *c, int chan, int64_t seq, const char *what) {
    comm_nccl *g = c->nccl;
    if (g->have_comm) ncclCommAbort(g->comm);
    g->have_comm = 0;
    if (c->mpi) return dsrt__comm_mpi_timeout(c, chan, seq, what);
    dsrt__comm_break(c);
    return dsrt__fail(-ETIMEDOUT, "comm: %s: not complete after %g s on member %d of %d", what,
                      c->o.timeout_s, c->rank, c->size);
}

/* A pending call of c's non-blocking communicator (a collective being
 * queued, set-up, finalisation), with the deadline. */
static int nccl_settle(dsrt_comm *c, const char *what) {
    comm_nccl *g = c->nccl;
    int rc = settle_until(g->comm, dsrt__comm_now() + c->o.timeout_s, what);
    return rc == -ETIMEDOUT ? time_out(c, CHAN_COLL, INT64_MAX, what) : rc;
}

// ----------------------------------------------------------------------------
// Gradient buckets

static void free_events(comm_nccl *g) {
    for (int p = 0; p < 2; p++) {
        bucket_set *s = &g->set[p];
        for (int k = 0; k < g->n_events; k++) {
            if (s->ready && s->ready[k]) cudaEventDestroy(s->ready[k]);
            if (s->done && s->done[k]) cudaEventDestroy(s->done[k]);
        }
        free(s->ready);
        free(s->done);
        free(s->queued_s);
        free(s->bucket_seq);
        free(s->order);
        memset(s, 0, sizeof *s);
    }
    if (g->bn_done) cudaEventDestroy(g->bn_done);
    g->bn_done = NULL;
    g->bn_open = 0;
    g->n_events = 0;
}

/* Set p's sums are done: its step's timeline becomes the last one (unless
 * a later step's already is). */
static void close_set(dsrt_comm *c, int p) {
    comm_nccl *g = c->nccl;
    bucket_set *s = &g->set[p];
    if (s->step > g->last_step && c->last_times) {
        for (int k = 0; k < c->n_bk; k++) {
            float ms = 0;
            dsrt_comm_bucket_time *t = &c->last_times[k];
            t->bytes = c->bk[k].count * sizeof(float);
            t->ready_s = s->queued_s[k];
            t->done_s = s->queued_s[k];
            if (cudaEventElapsedTime(&ms, s->ready[k], s->done[k]) == cudaSuccess)
                t->done_s += ms / 1e3;
            else
                (void)cudaGetLastError();
        }
        c->last = (dsrt_comm_timeline){s->bw_start, s->bw_end, s->wait_end, c->n_bk, c->last_times};
        c->have_last = 1;
        g->last_step = s->step;
    }
    s->open = 0;
    s->n_started = 0;
    s->ended = 0;
}

/*
 * Checks set p's sums, waiting for them when wait is set: 0 once they are
 * all done (an ended set then gives its timeline and may be reused), 1 while
 * some still run, or the failure: NCCL's error, or a sum queued for longer
 * than the timeout, which aborts the communicator.
 */
static int poll_set(dsrt_comm *c, int p, int wait) {
    comm_nccl *g = c->nccl;
    bucket_set *s = &g->set[p];
    while (s->open) {
        cudaError_t e = cudaEventQuery(s->done[s->order[s->n_started - 1]]);
        if (e == cudaSuccess) {
            if (!s->ended) return 0;
            close_set(c, p);
            return 0;
        }
        if (e != cudaErrorNotReady) return cuda_fail(e, "gradient all-reduce");
        ncclResult_t st = ncclSuccess;
        if (g->have_comm) ncclCommGetAsyncError(g->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            dsrt__comm_break(c);
            return nccl_fail(st, g->comm, "gradient all-reduce");
        }
        double now = dsrt__comm_now();
        for (int i = 0; i < s->n_started; i++) {
            int k = s->order[i];
            if (cudaEventQuery(s->done[k]) == cudaSuccess) continue;
            (void)cudaGetLastError();
            if (now <= s->queued_s[k] + c->o.timeout_s) break;
            char what[64];
            snprintf(what, sizeof what, "gradient bucket %d (NCCL)", k);
            return time_out(c, CHAN_GRAD, s->bucket_seq[k], what);
        }
        if (!wait) return 1;
        nap();
    }
    return 0;
}

/* The check the net's backend calls while the host waits on the device:
 * every 5 ms at most, the sums of both sets (the older first) and the last
 * batchnorm sum against their deadline. */
static int nccl_watch(void *ctx) {
    dsrt_comm *c = ctx;
    comm_nccl *g = c->nccl;
    if (atomic_load(&c->broken)) {
        /* The run is failing: NCCL's kernels must not hold the device. */
        if (g->have_comm) ncclCommAbort(g->comm);
        g->have_comm = 0;
        return 0;
    }
    double now = dsrt__comm_now();
    if (now < g->next_watch_s) return 0;
    g->next_watch_s = now + 0.005;
    int older = g->set[0].step <= g->set[1].step ? 0 : 1;
    for (int i = 0; i < 2; i++) {
        int rc = poll_set(c, i ? older ^ 1 : older, 0);
        if (rc < 0) return rc;
    }
    if (g->bn_open) {
        cudaError_t e = cudaEventQuery(g->bn_done);
        if (e == cudaSuccess)
            g->bn_open = 0;
        else if (e != cudaErrorNotReady)
            return cuda_fail(e, "batchnorm sums");
        else if (now > g->bn_queued_s + c->o.timeout_s)
            return time_out(c, CHAN_COLL, INT64_MAX, "batchnorm sums (NCCL)");
    }
    return 0;
}

static int nccl_attach(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    free_events(g);
    int n = c->n_bk;
    cudaError_t e = cudaSetDevice(g->device);
    for (int p = 0; p < 2; p++) {
        bucket_set *s = &g->set[p];
        s->ready = dsrt__calloc((size_t)n + 1, sizeof *s->ready);
        s->done = dsrt__calloc((size_t)n + 1, sizeof *s->done);
        s->queued_s = dsrt__calloc((size_t)n + 1, sizeof *s->queued_s);
        s->bucket_seq = dsrt__calloc((size_t)n + 1, sizeof *s->bucket_seq);
        s->order = dsrt__calloc((size_t)n + 1, sizeof *s->order);
        if (!s->ready || !s->done || !s->queued_s || !s->bucket_seq || !s->order) {
            g->n_events = n;
            return -ENOMEM;
        }
    }
    g->n_events = n;
    for (int p = 0; p < 2; p++)
        for (int k = 0; e == cudaSuccess && k < n; k++) {
            e = cudaEventCreate(&g->set[p].ready[k]);
            if (e == cudaSuccess) e = cudaEventCreate(&g->set[p].done[k]);
        }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->bn_done, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_fail(e, "attach");
    g->cur = 0;
    g->last_step = 0;
    g->err = 0;
    /* The net's backend checks the deadline of the sums while it waits. */
    c->net->wait_check = nccl_watch;
    c->net->wait_ctx = c;
    return 0;
}

static void nccl_detach(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    /* The sums still running write into the net's gradients: let them end
     * (a broken communicator was aborted: nothing runs). */
    if (!atomic_load(&c->broken) && g->have_comm) {
        int older = g->set[0].step <= g->set[1].step ? 0 : 1;
        for (int i = 0; i < 2; i++) {
            bucket_set *s = &g->set[i ? older ^ 1 : older];
            s->ended = 1;
            if (poll_set(c, i ? older ^ 1 : older, 1) < 0) break;
        }
    }
    if (c->net && c->net->wait_ctx == c) {
        c->net->wait_check = NULL;
        c->net->wait_ctx = NULL;
    }
    free_events(g);
}

static void nccl_start(dsrt_comm *c, int k) {
    comm_nccl *g = c->nccl;
    if (g->err) return;
    bucket_set *s = &g->set[g->cur];
    if (s->n_started == 0) {
        /* The first sum of a step: this set last served the step two back,
         * whose sums the device has normally long finished. */
        if (s->open) {
            s->ended = 1;
            int rc = poll_set(c, g->cur, 1);
            if (rc) {
                g->err = 1;
                snprintf(g->errmsg, sizeof g->errmsg, "%s", dsrt_last_error());
                return;
            }
        }
        s->step = ++g->steps;
    }
    dsrt_range r = c->bk[k];
    cudaStream_t compute = (cudaStream_t)c->mem.stream;
    cudaError_t e = cudaSetDevice(g->device);
    if (e == cudaSuccess) e = cudaEventRecord(s->ready[k], compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->stream, s->ready[k], 0);
    if (e != cudaSuccess) {
        g->err = 1;
        snprintf(g->errmsg, sizeof g->errmsg, "CUDA: %s", cudaGetErrorString(e));
        return;
    }
    if (c->mpi) s->bucket_seq[k] = dsrt__comm_mpi_enter(c, CHAN_GRAD);
    float *x = c->mem.grads + r.offset;
    ncclResult_t nr = ncclAllReduce(x, x, r.count, ncclFloat32, ncclSum, g->comm, g->stream);
    /* A non-blocking communicator may answer before the work is on the
     * stream: the done event must come after it. */
    if (nr == ncclInProgress && nccl_settle(c, "gradient all-reduce") == 0) nr = ncclSuccess;
    if (nr != ncclSuccess) {
        g->err = 1;
        snprintf(g->errmsg, sizeof g->errmsg, "%s", dsrt_last_error());
        if (nr != ncclInProgress)
            snprintf(g->errmsg, sizeof g->errmsg, "NCCL: %s", ncclGetErrorString(nr));
        return;
    }
    if ((e = cudaEventRecord(s->done[k], g->stream)) != cudaSuccess) {
        g->err = 1;
        snprintf(g->errmsg, sizeof g->errmsg, "CUDA: %s", cudaGetErrorString(e));
        return;
    }
    s->queued_s[k] = c->times[k].ready_s;
    s->order[s->n_started++] = k;
    s->open = 1;
}

/* The compute stream waits for the step's last sum (the sums run in order
 * on the communication stream), and the host goes on. Returns 1: the
 * engine gives the step's timeline itself once its sums are seen done. */
static int nccl_wait(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    if (g->err) {
        dsrt__comm_break(c);
        return dsrt__fail(DSRT_EBACKEND, "comm: gradient all-reduce: %s", g->errmsg);
    }
    bucket_set *s = &g->set[g->cur];
    if (s->n_started) {
        cudaError_t e = cudaSetDevice(g->device);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent((cudaStream_t)c->mem.stream,
                                    s->done[s->order[s->n_started - 1]], 0);
        if (e != cudaSuccess) return cuda_fail(e, "gradient all-reduce");
        double now = dsrt__comm_now();
        s->ended = 1;
        s->bw_start = c->bw_start;
        s->bw_end = c->bw_end ? c->bw_end : now;
        s->wait_end = now;
        g->cur ^= 1;
    }
    /* The step before: its timeline when it is done, its deadline if not. */
    int rc = poll_set(c, g->cur, 0);
    return rc < 0 ? rc : 1;
}

static int nccl_sum_device(dsrt_comm *c, double *x, size_t n, void *stream) {
    comm_nccl *g = c->nccl;
    ncclResult_t r = ncclAllReduce(x, x, n, ncclFloat64, ncclSum, g->comm, (cudaStream_t)stream);
    if (r == ncclInProgress) {
        int rc = nccl_settle(c, "batchnorm sums");
        if (rc) return rc;
    } else if (r != ncclSuccess) {
        return nccl_fail(r, g->comm, "batchnorm sums");
    }
    cudaError_t e = g->bn_done ? cudaEventRecord(g->bn_done, (cudaStream_t)stream) : cudaSuccess;
    if (e != cudaSuccess) return cuda_fail(e, "batchnorm sums");
    g->bn_queued_s = dsrt__comm_now();
    g->bn_open = g->bn_done != NULL;
    return 0;
}

static const comm_grad_ops nccl_grad_ops = {
    .name = "nccl",
    .attach = nccl_attach,
    .detach = nccl_detach,
    .start = nccl_start,
    .wait = nccl_wait,
    .sum_device = nccl_sum_device,
};

static int nccl_prepare(dsrt_comm *c, int device) {
    comm_nccl *g = dsrt__calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    c->nccl = g;
    g->device = device;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device < 0 || device >= count)
        return dsrt__fail(DSRT_ENODEVICE, "comm: NCCL on CUDA device %d: %s", device,
                          e != cudaSuccess ? cudaGetErrorString(e) : "no such device");
    if ((e = cudaSetDevice(device)) != cudaSuccess) return cuda_fail(e, "open");
    if ((e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(e, "open");
    c->grad = &nccl_grad_ops;
    return 0;
}

static void close_group_comms(comm_group *gr, double timeout_s);

/* Releases what c's engine holds; a member of an in-process group leaves
 * its NCCL communicator to the group, which the last member to close
 * finalises with the others'. */
static void release(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    free_events(g);
    if (g->stream) {
        cudaSetDevice(g->device);
        cudaStreamDestroy(g->stream);
    }
    free(g);
    c->nccl = NULL;
}

static int group_leave(dsrt_comm *c);

void dsrt__comm_nccl_close(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    if (!g) return;
    if (c->group) {
        if (group_leave(c)) close_group_comms(c->group, c->o.timeout_s);
        release(c);
        return;
    }
    if (g->have_comm) {
        cudaSetDevice(g->device);
        int ok = 0;
        if (!atomic_load(&c->broken)) {
            /* Flushes what is queued; settle aborts it if that never ends. */
            ncclResult_t r = ncclCommFinalize(g->comm);
            ok = (r == ncclSuccess || r == ncclInProgress) && nccl_settle(c, "close") == 0;
        }
        if (g->have_comm) {
            if (ok)
                ncclCommDestroy(g->comm);
            else
                ncclCommAbort(g->comm);
        }
        g->have_comm = 0;
    }
    release(c);
}

#ifdef DSRT_HAVE_MPI
int dsrt__comm_nccl_open(dsrt_comm *c) {
    int rc = nccl_prepare(c, c->o.device);
    /* Every rank takes part in the broadcast, even one that failed, so that
     * the others are not left waiting; a zeroed id tells them. */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0 && !rc) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) rc = nccl_fail(r, NULL, "open: unique id");
    }
    int brc = c->host->bcast(c, &id, sizeof id, 0, "open: NCCL unique id");
    if (brc) return brc;
    double ok = rc ? 0 : 1;
    int src = c->host->sum(c, &ok, 1, 1, "open");
    if (src) return src;
    if (rc) return rc;
    if (ok != c->size)
        return dsrt__fail(DSRT_EBACKEND, "comm: open: NCCL could not be set up on %d of %d ranks",
                          c->size - (int)ok, c->size);
    comm_nccl *g = c->nccl;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&g->comm, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, NULL, "open");
    g->have_comm = 1;
    return nccl_settle(c, "open: ncclCommInitRankConfig");
}
#else
int dsrt__comm_nccl_open(dsrt_comm *c) {
    return dsrt__fail(DSRT_EUNSUPPORTED, "comm: NCCL across processes needs MPI, which this "
                                         "dsrt was built without");
}
#endif

// ----------------------------------------------------------------------------
// The in-process group (multi-gpu mode)

struct comm_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    int refs;
    /* One collective at a time: members post their buffer, the last to
     * arrive computes, then all copy out and leave. */
    uint64_t gen;
    int arrived, left;
    void **ptr; /* (n) each member's buffer */
    int *in;    /* (n) 1 once the member posted */
    double *acc;
    size_t acc_cap;
    int err;
    /* The members' NCCL communicators, finalised together when the last
     * member closes (NULL: none, or aborted). */
    ncclComm_t *nc; /* (n) */
    int *dev;       /* (n) their devices */
    int open;       /* members whose NCCL side is not closed yet */
    int failed;     /* a member broke: abort rather than finalise */
    /* Each member has a one-rank communicator of its own instead of one
     * rank of a common one (dsrt__comm_nccl_open_local_split): NCCL refuses
     * two ranks of one communicator on one GPU, but a one-GPU machine can
     * then still close several communicators as one group from one thread. */
    int split;
};

/* Waits on the group's condition for at most 10 ms (deadlines are checked
 * by the callers). */
static void wait_a_little(comm_group *gr) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10000000;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&gr->cv, &gr->mu, &ts);
}

/* A collective of the group: fn runs on the last member to arrive, with
 * every member's buffer posted; out then runs on each member and may read
 * only its own buffer and the group's (another member may already have
 * returned and freed its buffer). */
static int group_run(dsrt_comm *c, void *x, const char *what, void (*fn)(comm_group *gr, void *arg),
                     void *arg, void (*out)(comm_group *gr, int member, void *arg)) {
    comm_group *gr = c->group;
    double deadline = dsrt__comm_now() + c->o.timeout_s;
    int rc = 0;
    pthread_mutex_lock(&gr->mu);
    /* Wait for the previous collective's members to leave. */
    while (gr->left > 0 && !rc) {
        wait_a_little(gr);
        if (dsrt__comm_now() > deadline) rc = -ETIMEDOUT;
    }
    uint64_t gen = gr->gen;
    gr->ptr[c->member] = x;
    gr->in[c->member] = 1;
    if (++gr->arrived == gr->n) {
        fn(gr, arg);
        gr->arrived = 0;
        gr->left = gr->n;
        gr->gen++;
        pthread_cond_broadcast(&gr->cv);
    }
    while (gr->gen == gen && !rc) {
        wait_a_little(gr);
        if (gr->gen == gen && dsrt__comm_now() > deadline) rc = -ETIMEDOUT;
    }
    if (rc) {
        char who[256];
        size_t at = 0;
        who[0] = 0;
        for (int m = 0; m < gr->n; m++)
            if (!gr->in[m] && at < sizeof who)
                at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? ", " : "", m);
        pthread_mutex_unlock(&gr->mu);
        dsrt__comm_break(c);
        return dsrt__fail(-ETIMEDOUT,
                          "comm: %s: not complete after %g s: member(s) %s of %d "
                          "did not arrive",
                          what, c->o.timeout_s, who[0] ? who : "?", gr->n);
    }
    out(gr, c->member, arg);
    gr->in[c->member] = 0;
    if (--gr->left == 0) pthread_cond_broadcast(&gr->cv);
    pthread_mutex_unlock(&gr->mu);
    return 0;
}

typedef struct {
    size_t n;
    int f64;
    int root;
    size_t bytes;
} group_arg;

static void sum_fn(comm_group *gr, void *arg) {
    group_arg *a = arg;
    if (gr->acc_cap < a->n) {
        double *p = realloc(gr->acc, a->n * sizeof *p);
        if (!p) {
            gr->err = 1;
            return;
        }
        gr->acc = p;
        gr->acc_cap = a->n;
    }
    gr->err = 0;
    for (size_t i = 0; i < a->n; i++) {
        double s = 0;
        if (a->f64) {
            for (int m = 0; m < gr->n; m++) s += ((const double *)gr->ptr[m])[i];
        } else {
            float f = 0;
            for (int m = 0; m < gr->n; m++) f += ((const float *)gr->ptr[m])[i];
            s = f;
        }
        gr->acc[i] = s;
    }
}

static void sum_out(comm_group *gr, int member, void *arg) {
    group_arg *a = arg;
    if (gr->err) return;
    for (size_t i = 0; i < a->n; i++) {
        if (a->f64)
            ((double *)gr->ptr[member])[i] = gr->acc[i];
        else
            ((float *)gr->ptr[member])[i] = (float)gr->acc[i];
    }
}

static int group_sum(dsrt_comm *c, void *x, size_t n, int f64, const char *what) {
    group_arg a = {n, f64, 0, 0};
    int rc = group_run(c, x, what, sum_fn, &a, sum_out);
    if (!rc && c->group->err) rc = dsrt__fail(-ENOMEM, "comm: %s: out of memory", what);
    return rc;
}

/* Every copy is made here, while all members wait: the root may return and
 * free its buffer as soon as the generation turns, before the others run
 * their out step. */
static void bcast_fn(comm_group *gr, void *arg) {
    group_arg *a = arg;
    for (int m = 0; m < gr->n; m++)
        if (m != a->root) memcpy(gr->ptr[m], gr->ptr[a->root], a->bytes);
}

static void bcast_out(comm_group *gr, int member, void *arg) {}

static int group_bcast(dsrt_comm *c, void *buf, size_t bytes, int root, const char *what) {
    group_arg a = {0, 0, root, bytes};
    return group_run(c, buf, what, bcast_fn, &a, bcast_out);
}

static void group_free(comm_group *gr);

static void group_close(dsrt_comm *c) {
    comm_group *gr = c->group;
    if (!gr) return;
    pthread_mutex_lock(&gr->mu);
    int last = --gr->refs == 0;
    pthread_mutex_unlock(&gr->mu);
    c->group = NULL;
    if (last) group_free(gr);
}

static const comm_host_ops group_host_ops = {
    .sum = group_sum,
    .bcast = group_bcast,
    .close = group_close,
};

/* A member's NCCL side leaves the group: its communicator stays with the
 * group. Returns 1 for the last member, who then closes them all. */
static int group_leave(dsrt_comm *c) {
    comm_group *gr = c->group;
    comm_nccl *g = c->nccl;
    pthread_mutex_lock(&gr->mu);
    gr->nc[c->member] = g->have_comm ? g->comm : NULL;
    if (atomic_load(&c->broken)) gr->failed = 1;
    g->have_comm = 0;
    int last = --gr->open == 0;
    pthread_mutex_unlock(&gr->mu);
    return last;
}

/* ncclCommAbort of every member left, from this one thread: one group. */
static void abort_group(comm_group *gr) {
    ncclGroupStart();
    for (int m = 0; m < gr->n; m++)
        if (gr->nc[m]) {
            cudaSetDevice(gr->dev[m]);
            ncclCommAbort(gr->nc[m]);
            gr->nc[m] = NULL;
        }
    ncclGroupEnd();
}

/*
 * The members' communicators, closed from one thread: ncclCommFinalize of
 * every member inside one ncclGroupStart/End (each must reach the others'
 * finalisation, which one thread can only give them as a group), their
 * completion awaited with the deadline, then ncclCommDestroy of every
 * member inside one group; ncclCommAbort of every member, in one group,
 * when a member broke or finalising fails or runs out of time.
 */
static void close_group_comms(comm_group *gr, double timeout_s) {
    int ok = !gr->failed, any = 0;
    for (int m = 0; m < gr->n; m++) any |= gr->nc[m] != NULL;
    if (!any) return;
    if (ok) {
        ncclGroupStart();
        for (int m = 0; m < gr->n; m++) {
            if (!gr->nc[m]) continue;
            cudaSetDevice(gr->dev[m]);
            ncclResult_t r = ncclCommFinalize(gr->nc[m]);
            if (r != ncclSuccess && r != ncclInProgress) ok = 0;
        }
        ncclResult_t r = ncclGroupEnd();
        if (r != ncclSuccess && r != ncclInProgress) ok = 0;
        double deadline = dsrt__comm_now() + timeout_s;
        for (int m = 0; ok && m < gr->n; m++)
            if (gr->nc[m]) ok = settle_until(gr->nc[m], deadline, "close") == 0;
    }
    if (!ok) {
        abort_group(gr);
        return;
    }
    ncclGroupStart();
    for (int m = 0; m < gr->n; m++)
        if (gr->nc[m]) {
            cudaSetDevice(gr->dev[m]);
            ncclCommDestroy(gr->nc[m]);
            gr->nc[m] = NULL;
        }
    ncclGroupEnd();
}

static void group_free(comm_group *gr) {
    pthread_mutex_destroy(&gr->mu);
    pthread_cond_destroy(&gr->cv);
    free(gr->ptr);
    free(gr->in);
    free(gr->acc);
    free(gr->nc);
    free(gr->dev);
    free(gr);
}

/*
 * The members' NCCL communicators, made by one thread for every device:
 * non-blocking ncclCommInitRankConfig calls inside one group, then each
 * awaited with the deadline; on any failure every member made is aborted
 * (one group).
 */
static int init_group(comm_group *gr, const int *devices, const dsrt_comm_options *o) {
    int n = gr->n;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(r, NULL, "open_local: unique id");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    int rc = 0;
    r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(r, NULL, "open_local: ncclGroupStart");
    for (int m = 0; m < n && !rc; m++) {
        cudaError_t e = cudaSetDevice(devices[m]);
        if (e != cudaSuccess) {
            rc = cuda_fail(e, "open_local");
            break;
        }
        if (gr->split && m > 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
            rc = nccl_fail(r, NULL, "open_local: unique id");
            break;
        }
        r = gr->split ? ncclCommInitRankConfig(&gr->nc[m], 1, id, 0, &cfg)
                      : ncclCommInitRankConfig(&gr->nc[m], n, id, m, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            gr->nc[m] = NULL;
            rc = nccl_fail(r, NULL, "open_local: ncclCommInitRankConfig");
        }
    }
    r = ncclGroupEnd();
    if (!rc && r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(r, NULL, "open_local: ncclGroupEnd");
    double deadline = dsrt__comm_now() + o->timeout_s;
    for (int m = 0; m < n && !rc; m++) {
        rc = settle_until(gr->nc[m], deadline, "open_local: ncclCommInitRankConfig");
        if (rc == -ETIMEDOUT)
            rc = dsrt__fail(-ETIMEDOUT,
                            "comm: open_local: GPU %d's communicator not set up "
                            "after %g s",
                            devices[m], o->timeout_s);
    }
    if (rc) abort_group(gr);
    return rc;
}

static int open_local(dsrt_comm **comms, int n, const int *devices, const dsrt_comm_options *o,
                      int split) {
    for (int i = 0; i < n; i++) comms[i] = NULL;
    comm_group *gr = dsrt__calloc(1, sizeof *gr);
    if (!gr) return -ENOMEM;
    pthread_mutex_init(&gr->mu, NULL);
    pthread_cond_init(&gr->cv, NULL);
    gr->n = n;
    gr->split = split;
    gr->ptr = dsrt__calloc((size_t)n, sizeof *gr->ptr);
    gr->in = dsrt__calloc((size_t)n, sizeof *gr->in);
    gr->nc = dsrt__calloc((size_t)n, sizeof *gr->nc);
    gr->dev = dsrt__calloc((size_t)n, sizeof *gr->dev);
    int rc = gr->ptr && gr->in && gr->nc && gr->dev ? 0 : -ENOMEM;
    for (int i = 0; !rc && i < n; i++) {
        dsrt_comm *c = dsrt__calloc(1, sizeof *c);
        if (!c) {
            rc = -ENOMEM;
            break;
        }
        comms[i] = c;
        c->o = *o;
        c->o.device = devices[i];
        c->rank = c->local_rank = c->member = i;
        c->size = n;
        c->group = gr;
        gr->refs++;
        gr->dev[i] = devices[i];
        c->host = &group_host_ops;
        rc = nccl_prepare(c, devices[i]);
        if (c->nccl) gr->open++;
    }
    if (!rc) rc = init_group(gr, devices, o);
    if (!rc)
        for (int i = 0; i < n; i++) {
            comms[i]->nccl->comm = gr->nc[i];
            comms[i]->nccl->have_comm = 1;
            gr->nc[i] = NULL;
        }
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dsrt_last_error());
        int none = gr->refs == 0; /* else the last close frees the group */
        for (int i = 0; i < n; i++) {
            dsrt_comm_close(comms[i]);
            comms[i] = NULL;
        }
        if (none) group_free(gr);
        return dsrt__fail(rc, "%s", msg);
    }
    return 0;
}

int dsrt__comm_nccl_open_local(dsrt_comm **comms, int n, const int *devices,
                               const dsrt_comm_options *o) {
    return open_local(comms, n, devices, o, 0);
}

int dsrt__comm_nccl_open_local_split(dsrt_comm **comms, int n, const int *devices,
                                     const dsrt_comm_options *o) {
    return open_local(comms, n, devices, o, 1);
}

// ----------------------------------------------------------------------------
// The module's entry

static const comm_nccl_engine nccl_engine = {
    .open = dsrt__comm_nccl_open,
    .open_local = dsrt__comm_nccl_open_local,
    .open_local_split = dsrt__comm_nccl_open_local_split,
    .close = dsrt__comm_nccl_close,
};

DSRT_MODULE_DEFINE(nccl, &nccl_engine, dsrt__comm_now);

#endif
