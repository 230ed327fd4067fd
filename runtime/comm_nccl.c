/*
 * The NCCL engine of the communicators: gradient buckets on device memory,
 * and the in-process group of dsrt_comm_open_local.
 *
 * Each bucket's sum is ordered after backward without the host waiting: the
 * gradient hook records an event on the net's compute stream the moment
 * backward has queued the bucket's last gradient, the communication stream
 * waits for that event, and ncclAllReduce (in place) is queued there,
 * followed by a done event. grads_wait makes the compute stream wait for the
 * last done event (so the optimizer step runs after every sum) and polls the
 * done events on the host with the deadline, so that a peer that never
 * arrives makes the step fail instead of hanging: the NCCL communicator is
 * then aborted (ncclCommAbort), which is what NCCL offers to get out of a
 * collective that cannot complete.
 *
 * Across processes the communicator is created non-blocking
 * (ncclConfig_t.blocking = 0) from a unique id that rank 0 makes and MPI
 * broadcasts, so its set-up has the deadline too; the MPI side stays open
 * for the small host sums and the heartbeats that name missing ranks. In one
 * process (the multi-gpu mode) ncclCommInitAll joins the devices, one
 * communicator per device, each then driven by a thread of its own; their
 * host sums meet in a small group structure in the process (a mutex, a
 * condition variable, sums in member order so every member gets the same
 * bits).
 *
 * It is the module dsrt_nccl.so (core/module.h), which comm.c loads when a
 * communicator first asks for it.
 */
#include "comm_internal.h"
#include "core/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DSRT_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

struct comm_nccl {
    ncclComm_t comm;
    int have_comm;
    int device;
    cudaStream_t stream;       /* communication stream */
    cudaEvent_t *ready, *done; /* (n_bk) each */
    int n_events;
    int started_any;
    int err; /* a CUDA or NCCL failure in start, for wait */
    char errmsg[256];
    int64_t *bucket_seq; /* (n_bk) heartbeat position (MPI) */
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

/* Waits for a non-blocking communicator's pending call (set-up, a
 * collective being queued, finalisation) with the deadline. */
static int nccl_settle(dsrt_comm *c, const char *what) {
    comm_nccl *g = c->nccl;
    double deadline = dsrt__comm_now() + c->o.timeout_s;
    for (;;) {
        ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(g->comm, &st);
        if (r != ncclSuccess) return nccl_fail(r, g->comm, what);
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_fail(st, g->comm, what);
        if (dsrt__comm_now() > deadline) {
            ncclCommAbort(g->comm);
            g->have_comm = 0;
            if (c->mpi) return dsrt__comm_mpi_timeout(c, CHAN_COLL, INT64_MAX, what);
            dsrt__comm_break(c);
            return dsrt__fail(-ETIMEDOUT, "comm: %s: not complete after %g s", what,
                              c->o.timeout_s);
        }
        nap();
    }
}

// ----------------------------------------------------------------------------
// Gradient buckets

static void free_events(comm_nccl *g) {
    for (int k = 0; k < g->n_events; k++) {
        if (g->ready[k]) cudaEventDestroy(g->ready[k]);
        if (g->done[k]) cudaEventDestroy(g->done[k]);
    }
    free(g->ready);
    free(g->done);
    free(g->bucket_seq);
    g->ready = g->done = NULL;
    g->bucket_seq = NULL;
    g->n_events = 0;
}

static int nccl_attach(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    free_events(g);
    int n = c->n_bk;
    g->ready = dsrt__calloc((size_t)n + 1, sizeof *g->ready);
    g->done = dsrt__calloc((size_t)n + 1, sizeof *g->done);
    g->bucket_seq = dsrt__calloc((size_t)n + 1, sizeof *g->bucket_seq);
    if (!g->ready || !g->done || !g->bucket_seq) return -ENOMEM;
    g->n_events = n;
    cudaError_t e = cudaSetDevice(g->device);
    for (int k = 0; e == cudaSuccess && k < n; k++) {
        e = cudaEventCreateWithFlags(&g->ready[k], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->done[k], cudaEventDisableTiming);
    }
    return e == cudaSuccess ? 0 : cuda_fail(e, "attach");
}

static void nccl_detach(dsrt_comm *c) {
    free_events(c->nccl);
}

static void nccl_start(dsrt_comm *c, int k) {
    comm_nccl *g = c->nccl;
    if (g->err) return;
    dsrt_range r = c->bk[k];
    cudaStream_t compute = (cudaStream_t)c->mem.stream;
    cudaError_t e = cudaSetDevice(g->device);
    if (e == cudaSuccess) e = cudaEventRecord(g->ready[k], compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->stream, g->ready[k], 0);
    if (e != cudaSuccess) {
        g->err = 1;
        snprintf(g->errmsg, sizeof g->errmsg, "CUDA: %s", cudaGetErrorString(e));
        return;
    }
    if (c->mpi) g->bucket_seq[k] = dsrt__comm_mpi_enter(c, CHAN_GRAD);
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
    if ((e = cudaEventRecord(g->done[k], g->stream)) != cudaSuccess) {
        g->err = 1;
        snprintf(g->errmsg, sizeof g->errmsg, "CUDA: %s", cudaGetErrorString(e));
    }
    g->started_any = 1;
}

static int nccl_wait(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    if (g->err) {
        dsrt__comm_break(c);
        return dsrt__fail(DSRT_EBACKEND, "comm: gradient all-reduce: %s", g->errmsg);
    }
    /* Later work on the compute stream (the optimizer) runs after the sums. */
    cudaError_t e = cudaSetDevice(g->device);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent((cudaStream_t)c->mem.stream, g->done[c->n_bk - 1], 0);
    if (e != cudaSuccess) return cuda_fail(e, "gradient all-reduce");
    double deadline = dsrt__comm_now() + c->o.timeout_s;
    for (int k = 0; k < c->n_bk;) {
        e = cudaEventQuery(g->done[k]);
        if (e == cudaSuccess) {
            c->times[k++].done_s = dsrt__comm_now();
            continue;
        }
        if (e != cudaErrorNotReady) return cuda_fail(e, "gradient all-reduce");
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(g->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            dsrt__comm_break(c);
            return nccl_fail(st, g->comm, "gradient all-reduce");
        }
        if (dsrt__comm_now() > deadline) {
            ncclCommAbort(g->comm);
            g->have_comm = 0;
            char what[64];
            snprintf(what, sizeof what, "gradient bucket %d (NCCL)", k);
            if (c->mpi) return dsrt__comm_mpi_timeout(c, CHAN_GRAD, g->bucket_seq[k], what);
            dsrt__comm_break(c);
            return dsrt__fail(-ETIMEDOUT, "comm: %s: not complete after %g s on member %d of %d",
                              what, c->o.timeout_s, c->rank, c->size);
        }
        nap();
    }
    return 0;
}

static int nccl_sum_device(dsrt_comm *c, double *x, size_t n, void *stream) {
    comm_nccl *g = c->nccl;
    ncclResult_t r = ncclAllReduce(x, x, n, ncclFloat64, ncclSum, g->comm, (cudaStream_t)stream);
    if (r == ncclInProgress) return nccl_settle(c, "batchnorm sums");
    if (r != ncclSuccess) return nccl_fail(r, g->comm, "batchnorm sums");
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

void dsrt__comm_nccl_close(dsrt_comm *c) {
    comm_nccl *g = c->nccl;
    if (!g) return;
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
    }
    free_events(g);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
    c->nccl = NULL;
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
 * every member's buffer posted. */
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

static void bcast_fn(comm_group *gr, void *arg) {}

static void bcast_out(comm_group *gr, int member, void *arg) {
    group_arg *a = arg;
    if (member != a->root) memcpy(gr->ptr[member], gr->ptr[a->root], a->bytes);
}

static int group_bcast(dsrt_comm *c, void *buf, size_t bytes, int root, const char *what) {
    group_arg a = {0, 0, root, bytes};
    return group_run(c, buf, what, bcast_fn, &a, bcast_out);
}

static void group_close(dsrt_comm *c) {
    comm_group *gr = c->group;
    if (!gr) return;
    pthread_mutex_lock(&gr->mu);
    int last = --gr->refs == 0;
    pthread_mutex_unlock(&gr->mu);
    c->group = NULL;
    if (!last) return;
    pthread_mutex_destroy(&gr->mu);
    pthread_cond_destroy(&gr->cv);
    free(gr->ptr);
    free(gr->in);
    free(gr->acc);
    free(gr);
}

static const comm_host_ops group_host_ops = {
    .sum = group_sum,
    .bcast = group_bcast,
    .close = group_close,
};

int dsrt__comm_nccl_open_local(dsrt_comm **comms, int n, const int *devices,
                               const dsrt_comm_options *o) {
    for (int i = 0; i < n; i++) comms[i] = NULL;
    comm_group *gr = dsrt__calloc(1, sizeof *gr);
    ncclComm_t *nc = dsrt__calloc((size_t)n, sizeof *nc);
    int rc = 0;
    if (!gr || !nc) {
        free(gr);
        free(nc);
        return -ENOMEM;
    }
    pthread_mutex_init(&gr->mu, NULL);
    pthread_cond_init(&gr->cv, NULL);
    gr->n = n;
    gr->ptr = dsrt__calloc((size_t)n, sizeof *gr->ptr);
    gr->in = dsrt__calloc((size_t)n, sizeof *gr->in);
    if (!gr->ptr || !gr->in) rc = -ENOMEM;
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
        c->host = &group_host_ops;
        rc = nccl_prepare(c, devices[i]);
    }
    if (!rc) {
        ncclResult_t r = ncclCommInitAll(nc, n, devices);
        if (r != ncclSuccess) rc = nccl_fail(r, NULL, "open_local: ncclCommInitAll");
    }
    if (!rc)
        for (int i = 0; i < n; i++) {
            comms[i]->nccl->comm = nc[i];
            comms[i]->nccl->have_comm = 1;
        }
    free(nc);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dsrt_last_error());
        int none = gr->refs == 0; /* else the last close frees the group */
        for (int i = 0; i < n; i++) {
            dsrt_comm_close(comms[i]);
            comms[i] = NULL;
        }
        if (none) {
            pthread_mutex_destroy(&gr->mu);
            pthread_cond_destroy(&gr->cv);
            free(gr->ptr);
            free(gr->in);
            free(gr);
        }
        return dsrt__fail(rc, "%s", msg);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// The module's entry

static const comm_nccl_engine nccl_engine = {
    .open = dsrt__comm_nccl_open,
    .open_local = dsrt__comm_nccl_open_local,
    .close = dsrt__comm_nccl_close,
};

DSRT_MODULE_DEFINE(nccl, &nccl_engine, dsrt__comm_now);

#endif
