/*
 * Communicators for data-parallel training: what every engine shares.
 *
 * This file holds the public calls and the bucket bookkeeping. A net is
 * attached through its gradient hook (nn.h): backward announces each bucket
 * the moment its last gradient is written, and the hook hands it to the
 * engine (comm_mpi.c: the communication thread's MPI_Iallreduce on host
 * memory; comm_nccl.c: ncclAllReduce on a communication stream). The
 * engines see only "bucket k is ready" and "wait for all", so the bucket
 * code, the timeline that shows the overlap, parameter averaging and the
 * synchronised batchnorm hook are the same for both.
 *
 * The engines are modules (core/module.h): dsrt_mpi.so and dsrt_nccl.so,
 * loaded from the table below when a communicator first asks for one, so a
 * program that never opens a communicator maps neither MPI nor NCCL.
 */
#include "comm_internal.h"
#include "core/module.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A communicator broke in this process: MPI holds collectives that will
 * never complete, so dsrt_comm_finalize must not call MPI_Finalize. The one
 * process-wide fact here, as MPI's own state is process-wide. */
static atomic_int any_broken;

double dsrt__comm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dsrt__comm_break(dsrt_comm *c) {
    atomic_store(&c->broken, 1);
    atomic_store(&any_broken, 1);
}

// ----------------------------------------------------------------------------
// The engines' modules

/* The communicator table: each engine's module, by dsrt_comm_kind. */
static const dsrt_module_spec ENGINES[] = {
    [DSRT_COMM_MPI] = {.name = "mpi",
                       .what = "the MPI communicator",
                       .needs = "Open MPI (libmpi)",
#ifdef DSRT_HAVE_MPI
                       .built = 1,
#endif
                       .unbuilt = "this dsrt was built without MPI (install libopenmpi-dev and "
                                  "rebuild)",
                       .train_anchor = (const void *)dsrt__comm_now,
                       .uses_dsrt = 1},
    [DSRT_COMM_NCCL] = {.name = "nccl",
                        .what = "the NCCL communicator",
                        .needs = "NCCL 2 and the CUDA runtime (libnccl.so.2, libcudart)",
#ifdef DSRT_HAVE_NCCL
                        .built = 1,
#endif
                        .unbuilt = "this dsrt was built without NCCL",
                        .train_anchor = (const void *)dsrt__comm_now,
                        .uses_dsrt = 1},
};
#define MPI_MODULE  ENGINES[DSRT_COMM_MPI]
#define NCCL_MODULE ENGINES[DSRT_COMM_NCCL]

/* The table of spec's engine, loaded the first time; NULL with *rc set
 * when it cannot be. */
static const void *engine(const dsrt_module_spec *spec, int *rc) {
    const void *ops = NULL;
    *rc = dsrt__module_load(spec, &ops);
    return ops;
}

/* The NCCL engine's calls into MPI's heartbeats: c has MPI, so its module
 * is loaded. */
int64_t dsrt__comm_mpi_enter(dsrt_comm *c, int chan) {
    int rc;
    const comm_mpi_engine *e = engine(&MPI_MODULE, &rc);
    return e ? e->enter(c, chan) : 0;
}

int dsrt__comm_mpi_timeout(dsrt_comm *c, int chan, int64_t seq, const char *what) {
    int rc;
    const comm_mpi_engine *e = engine(&MPI_MODULE, &rc);
    return e ? e->timeout(c, chan, seq, what) : rc;
}

// ----------------------------------------------------------------------------
// Options, the job, MPI itself

dsrt_comm_options dsrt_comm_defaults(void) {
    dsrt_comm_options o;
    memset(&o, 0, sizeof o);
    o.kind = DSRT_COMM_MPI;
    o.device = 0;
    o.timeout_s = 60;
    o.first_bucket_bytes = (size_t)1 << 20;
    o.bucket_bytes = (size_t)25 << 20;
    return o;
}

int dsrt_comm_available(dsrt_comm_kind kind) {
    if (kind != DSRT_COMM_MPI && kind != DSRT_COMM_NCCL)
        return dsrt__fail(-EINVAL, "comm: no engine %d", (int)kind);
    int rc;
    engine(&ENGINES[kind], &rc);
    return rc ? dsrt__fail_prefix(rc, "comm") : 0;
}

int dsrt_comm_world_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                       "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(vars); i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end;
        long n = strtol(v, &end, 10);
        if (*end == 0 && n >= 1 && n <= 1 << 24) return (int)n;
    }
    return 1;
}

int dsrt_comm_init(int *argc, char ***argv) {
    int rc;
    const comm_mpi_engine *e = engine(&MPI_MODULE, &rc);
    return e ? e->init(argc, argv) : dsrt__fail_prefix(rc, "comm: init");
}

void dsrt_comm_finalize(void) {
    /* Only a process that started MPI (so loaded its module) ends it. */
    const void *ops;
    if (atomic_load(&any_broken) || dsrt__module_loaded(&MPI_MODULE, &ops) != 0) return;
    const comm_mpi_engine *e = ops;
    e->finalize();
}

// ----------------------------------------------------------------------------
// Opening and closing

static int check_options(const dsrt_comm_options *o) {
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s))
        return dsrt__fail(DSRT_EOPTION, "comm: timeout_s %g: expected a positive number of seconds",
                          o->timeout_s);
    if (o->bucket_bytes == 0 || o->first_bucket_bytes == 0)
        return dsrt__fail(DSRT_EOPTION, "comm: bucket sizes must be positive (first %zu, then %zu)",
                          o->first_bucket_bytes, o->bucket_bytes);
    if (o->kind != DSRT_COMM_MPI && o->kind != DSRT_COMM_NCCL)
        return dsrt__fail(DSRT_EOPTION, "comm: kind %d: expected DSRT_COMM_MPI or DSRT_COMM_NCCL",
                          (int)o->kind);
    return 0;
}

int dsrt_comm_open(dsrt_comm **out, const dsrt_comm_options *options) {
    *out = NULL;
    dsrt_comm_options o = options ? *options : dsrt_comm_defaults();
    int rc = check_options(&o);
    if (rc) return rc;
    const comm_mpi_engine *mpi = engine(&MPI_MODULE, &rc);
    const comm_nccl_engine *nccl = NULL;
    if (mpi && o.kind == DSRT_COMM_NCCL) nccl = engine(&NCCL_MODULE, &rc);
    if (rc) return dsrt__fail_prefix(rc, "comm");
    dsrt_comm *c = dsrt__calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->o = o;
    rc = mpi->open(c, o.kind == DSRT_COMM_MPI);
    if (!rc && nccl) rc = nccl->open(c);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dsrt_last_error());
        dsrt_comm_close(c);
        return dsrt__fail(rc, "%s", msg);
    }
    *out = c;
    return 0;
}

static int open_local(dsrt_comm **comms, int n, const int *devices,
                      const dsrt_comm_options *options, int split) {
    dsrt_comm_options o = options ? *options : dsrt_comm_defaults();
    o.kind = DSRT_COMM_NCCL;
    int rc = check_options(&o);
    if (rc) return rc;
    if (n < 1) return dsrt__fail(-EINVAL, "comm: open_local: %d devices", n);
    const comm_nccl_engine *nccl = engine(&NCCL_MODULE, &rc);
    if (!nccl) {
        for (int i = 0; i < n; i++) comms[i] = NULL;
        return dsrt__fail_prefix(rc, "comm");
    }
    return split ? nccl->open_local_split(comms, n, devices, &o)
                 : nccl->open_local(comms, n, devices, &o);
}

int dsrt_comm_open_local(dsrt_comm **comms, int n, const int *devices,
                         const dsrt_comm_options *options) {
    return open_local(comms, n, devices, options, 0);
}

int dsrt__comm_open_local_split(dsrt_comm **comms, int n, const int *devices,
                                const dsrt_comm_options *o) {
    return open_local(comms, n, devices, o, 1);
}

static void detach(dsrt_comm *c) {
    /* Sums of a step nobody waited for finish first: they write into the
     * net's gradients. */
    if (c->grad && c->bk && c->n_announced && !atomic_load(&c->broken)) (void)c->grad->wait(c);
    if (c->net) {
        dsrt_net_set_grad_hook(c->net, NULL);
        if (c->net->bn_sync_ctx == c) dsrt_net_set_bn_sync(c->net, NULL, NULL);
    }
    if (c->grad && c->bk) c->grad->detach(c);
    free(c->bk);
    free(c->announced);
    free(c->times);
    free(c->last_times);
    c->bk = NULL;
    c->announced = NULL;
    c->times = c->last_times = NULL;
    c->n_bk = c->n_announced = 0;
    c->have_last = 0;
    c->net = NULL;
}

void dsrt_comm_close(dsrt_comm *c) {
    if (!c) return;
    detach(c);
    int rc;
    const comm_nccl_engine *nccl = c->nccl ? engine(&NCCL_MODULE, &rc) : NULL;
    if (nccl) nccl->close(c);
    if (c->host) c->host->close(c);
    free(c);
}

int dsrt_comm_rank(const dsrt_comm *c) {
    return c->rank;
}

int dsrt_comm_size(const dsrt_comm *c) {
    return c->size;
}

int dsrt_comm_local_rank(const dsrt_comm *c) {
    return c->local_rank;
}

// ----------------------------------------------------------------------------
// Host collectives

static int usable(const dsrt_comm *c, const char *what) {
    if (atomic_load(&c->broken))
        return dsrt__fail(DSRT_ECLOSED, "comm: %s: the communicator failed earlier", what);
    return 0;
}

int dsrt_comm_sum_f64(dsrt_comm *c, double *x, size_t n) {
    int rc = usable(c, "sum");
    return rc ? rc : c->host->sum(c, x, n, 1, "sum");
}

int dsrt_comm_sum_f32(dsrt_comm *c, float *x, size_t n) {
    int rc = usable(c, "sum");
    return rc ? rc : c->host->sum(c, x, n, 0, "sum");
}

int dsrt_comm_bcast(dsrt_comm *c, void *buf, size_t bytes, int root) {
    int rc = usable(c, "broadcast");
    if (rc) return rc;
    if (root < 0 || root >= c->size)
        return dsrt__fail(-EINVAL, "comm: broadcast from rank %d of %d", root, c->size);
    return c->host->bcast(c, buf, bytes, root, "broadcast");
}

// ----------------------------------------------------------------------------
// Gradient buckets

static void on_backward(void *ctx, int end) {
    dsrt_comm *c = ctx;
    if (end) {
        c->bw_end = dsrt__comm_now();
        return;
    }
    c->bw_start = dsrt__comm_now();
    c->bw_end = 0;
    /* Where backward writes this step (a device backend may have moved its
     * buffers since the last one). */
    dsrt__net_memory(c->net, &c->mem);
}

static void announce(dsrt_comm *c, int k) {
    if (c->announced[k]) return;
    c->announced[k] = 1;
    c->n_announced++;
    c->times[k].ready_s = dsrt__comm_now();
    c->times[k].done_s = 0;
    c->grad->start(c, k);
}

static void on_ready(void *ctx, int bucket, dsrt_range range) {
    dsrt_comm *c = ctx;
    if (bucket >= 0 && bucket < c->n_bk && !atomic_load(&c->broken)) announce(c, bucket);
}

int dsrt_comm_attach(dsrt_comm *c, dsrt_net *net) {
    int rc = usable(c, "attach");
    if (rc) return rc;
    detach(c);
    if (!net) return 0;
    if (!c->grad) return dsrt__fail(DSRT_EUNSUPPORTED, "comm: attach: no gradient engine");
    dsrt_backend_memory mem;
    dsrt__net_memory(net, &mem);
    int want_device = c->nccl ? c->o.device : DSRT_DEVICE_CPU;
    if (mem.device != want_device) {
        if (c->nccl)
            return dsrt__fail(DSRT_EOPTION,
                              "comm: attach: the net computes on %s, this NCCL communicator on "
                              "CUDA device %d",
                              mem.device < 0 ? "the CPU" : "another CUDA device", c->o.device);
        return dsrt__fail(DSRT_EOPTION,
                          "comm: attach: the net computes on CUDA device %d; "
                          "MPI gradients need a CPU net (use DSRT_COMM_NCCL)",
                          mem.device);
    }
    /* Every worker starts from rank 0's weights and statistics. */
    size_t np, ns;
    float *p = dsrt_net_params(net, &np);
    float *s = dsrt_net_state(net, &ns);
    if (!p || !s) return DSRT_EBACKEND;
    if (c->size > 1) {
        size_t expect[2] = {np, ns}, theirs[2] = {np, ns};
        if ((rc = c->host->bcast(c, theirs, sizeof theirs, 0, "attach"))) return rc;
        if (theirs[0] != expect[0] || theirs[1] != expect[1])
            return dsrt__fail(DSRT_EOPTION,
                              "comm: attach: rank 0's net has %zu parameters and %zu state "
                              "values, rank %d's %zu and %zu",
                              theirs[0], theirs[1], c->rank, np, ns);
        if ((rc = c->host->bcast(c, p, np * sizeof *p, 0, "attach: parameters"))) return rc;
        if ((rc = c->host->bcast(c, s, ns * sizeof *s, 0, "attach: state"))) return rc;
        dsrt_net_params_changed(net);
        dsrt__net_memory(net, &mem);
    }
    int nb = dsrt_net_buckets_sized(net, c->o.first_bucket_bytes, c->o.bucket_bytes, NULL, 0);
    c->bk = dsrt__calloc((size_t)nb + 1, sizeof *c->bk);
    c->announced = dsrt__calloc((size_t)nb + 1, sizeof *c->announced);
    c->times = dsrt__calloc((size_t)nb + 1, sizeof *c->times);
    c->last_times = dsrt__calloc((size_t)nb + 1, sizeof *c->last_times);
    if (!c->bk || !c->announced || !c->times || !c->last_times) {
        detach(c);
        return -ENOMEM;
    }
    dsrt_net_buckets_sized(net, c->o.first_bucket_bytes, c->o.bucket_bytes, c->bk, nb);
    for (int k = 0; k < nb; k++) c->times[k].bytes = c->bk[k].count * sizeof(float);
    c->n_bk = nb;
    c->net = net;
    c->mem = mem;
    if ((rc = c->grad->attach(c))) {
        detach(c);
        return rc;
    }
    dsrt_grad_hook h = {c->o.first_bucket_bytes, c->o.bucket_bytes, on_ready, on_backward, c};
    if ((rc = dsrt_net_set_grad_hook(net, &h))) {
        detach(c);
        return rc;
    }
    return 0;
}

int dsrt_comm_grads_wait(dsrt_comm *c) {
    int rc = usable(c, "gradients");
    if (rc) return rc;
    if (!c->net) return dsrt__fail(-EINVAL, "comm: grads_wait without an attached net");
    for (int k = 0; k < c->n_bk; k++) announce(c, k);
    rc = c->grad->wait(c);
    if (rc < 0) return rc;
    if (rc == 0) { /* 1: the engine gives the timeline once the sums are done */
        double end = dsrt__comm_now();
        memcpy(c->last_times, c->times, (size_t)c->n_bk * sizeof *c->times);
        c->last = (dsrt_comm_timeline){c->bw_start, c->bw_end ? c->bw_end : end, end, c->n_bk,
                                       c->last_times};
        c->have_last = 1;
    }
    memset(c->announced, 0, (size_t)c->n_bk * sizeof *c->announced);
    c->n_announced = 0;
    return 0;
}

int dsrt_comm_last_timeline(const dsrt_comm *c, dsrt_comm_timeline *t) {
    if (!c->have_last) return dsrt__fail(-ENOENT, "comm: no step has been reduced yet");
    *t = c->last;
    return 0;
}

// ----------------------------------------------------------------------------
// Averaging

/* x (n floats) replaced by its mean over the workers. */
static int mean_f32(dsrt_comm *c, float *x, size_t n, const char *what) {
    int rc = c->host->sum(c, x, n, 0, what);
    if (rc) return rc;
    float inv = 1.0f / (float)c->size;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
    return 0;
}

int dsrt_comm_average(dsrt_comm *c, dsrt_net *net, dsrt_optimizer *opt) {
    int rc = usable(c, "average");
    if (rc) return rc;
    size_t np;
    float *p = dsrt_net_params(net, &np);
    if (!p) return DSRT_EBACKEND;
    if ((rc = mean_f32(c, p, np, "average: parameters"))) return rc;
    dsrt_net_params_changed(net);
    int nb = opt ? dsrt__optimizer_n_buffers(opt) : 0;
    /* Every rank must make the same calls: the buffer count is the solver's. */
    for (int i = 0; i < nb; i++) {
        float *b = dsrt__optimizer_buffer(opt, i);
        if (!b) return DSRT_EBACKEND;
        if ((rc = mean_f32(c, b, np, "average: optimizer state"))) return rc;
    }
    return 0;
}

int dsrt_comm_average_state(dsrt_comm *c, dsrt_net *net) {
    int rc = usable(c, "average_state");
    if (rc) return rc;
    float *s = dsrt_net_state(net, NULL);
    if (!s) return DSRT_EBACKEND;
    /* Only the running statistics: the input statistics are the same on
     * every worker and must stay bit for bit what they are. */
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->kind != DSRT_LAYER_BATCHNORM || !l->s_n) continue;
        if ((rc = mean_f32(c, s + l->s_off, l->s_n, "average_state"))) return rc;
    }
    dsrt_net_params_changed(net);
    return 0;
}

// ----------------------------------------------------------------------------
// Synchronised batchnorm

static int bn_sums(void *ctx, dsrt_bn_sums *s) {
    dsrt_comm *c = ctx;
    int rc = usable(c, "batchnorm");
    if (rc) return rc;
    if (s->device == DSRT_DEVICE_CPU) return c->host->sum(c, s->sums, s->n, 1, "batchnorm sums");
    if (!c->grad || !c->grad->sum_device)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "comm: batchnorm sums in device memory need an NCCL communicator");
    return c->grad->sum_device(c, s->sums, s->n, s->stream);
}

int dsrt_comm_sync_batchnorm(dsrt_comm *c, dsrt_net *net, int on) {
    int rc = usable(c, "sync_batchnorm");
    if (rc) return rc;
    return dsrt_net_set_bn_sync(net, on ? bn_sums : NULL, c);
}
