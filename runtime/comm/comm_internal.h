/*
 * Internals of the communicators (comm.c, comm_mpi.c, comm_nccl.c). A
 * communicator has two small ops tables: `host` sums and broadcasts small
 * host arrays (MPI, or an in-process group for the GPUs of one process), and
 * `grad` reduces the gradient buckets of the attached net (MPI's
 * communication thread on host buffers, or NCCL on device buffers). comm.c
 * holds what both share: the bucket bookkeeping, the timeline, averaging and
 * the batchnorm hook.
 */
#ifndef DSRT_COMM_INTERNAL_H
#define DSRT_COMM_INTERNAL_H

#include <dsrt/comm.h>

#include "nn/internal.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
    /* Blocking in-place sum over every worker of n values in host memory
     * (f64: double, else float). what names the call in messages. */
    int (*sum)(dsrt_comm *c, void *x, size_t n, int f64, const char *what);
    int (*bcast)(dsrt_comm *c, void *buf, size_t bytes, int root, const char *what);
    /* Releases what the engine holds (collective where the engine is). */
    void (*close)(dsrt_comm *c);
} comm_host_ops;

typedef struct {
    const char *name;
    /* The net was attached (c->net, c->bk, c->n_bk set): prepare. */
    int (*attach)(dsrt_comm *c);
    void (*detach)(dsrt_comm *c);
    /* Bucket k is ready: start its sum (on the training thread, from the
     * net's gradient hook). Failures are kept for wait. */
    void (*start)(dsrt_comm *c, int k);
    /* Waits until every started bucket holds its sum and records their done
     * times (returns 0); or, on a device, orders the net's stream after the
     * sums and returns 1 at once: the engine then checks their deadline
     * while the host waits on the device, and fills c->last itself once it
     * sees them done. A negative code on failure. */
    int (*wait)(dsrt_comm *c);
    /* In-place sum of n doubles in device memory, queued on stream (sync
     * batchnorm on a device). NULL: host memory only. */
    int (*sum_device)(dsrt_comm *c, double *x, size_t n, void *stream);
} comm_grad_ops;

typedef struct comm_mpi comm_mpi;
typedef struct comm_nccl comm_nccl;
typedef struct comm_group comm_group;

struct dsrt_comm {
    dsrt_comm_options o;
    int rank, size, local_rank;
    atomic_int broken; /* a collective timed out: every call fails */
    const comm_host_ops *host;
    const comm_grad_ops *grad;
    comm_mpi *mpi;     /* MPI state, NULL for a local group */
    comm_nccl *nccl;   /* NCCL state, NULL for MPI gradients */
    comm_group *group; /* in-process group of dsrt_comm_open_local */
    int member;        /* index in group */

    /* The attached net and its buckets (bucket 0: the end of the buffer). */
    dsrt_net *net;
    dsrt_backend_memory mem; /* where the gradients are */
    dsrt_range *bk;          /* (n_bk) */
    int n_bk;
    int *announced; /* (n_bk) 1 once the hook (or grads_wait) started bucket k */
    int n_announced;
    /* Timeline of the step in progress and of the last one finished. */
    dsrt_comm_bucket_time *times, *last_times; /* (n_bk) each */
    double bw_start, bw_end;
    dsrt_comm_timeline last;
    int have_last;
};

double dsrt__comm_now(void);

/* Fails c for good (a timeout or a lost peer): sets broken, and the
 * process-wide flag that keeps dsrt_comm_finalize from waiting on MPI. */
void dsrt__comm_break(dsrt_comm *c);

/* MPI (comm_mpi.c, the module dsrt_mpi.so): opens c->mpi over
 * MPI_COMM_WORLD and sets rank, size, local_rank, host; grad when
 * with_grads. */
int dsrt__comm_mpi_open(dsrt_comm *c, int with_grads);
int dsrt__comm_mpi_init(int *argc, char ***argv);
/* Channels of the heartbeat positions: host collectives, gradient buckets. */
#define CHAN_COLL 0
#define CHAN_GRAD 1
/* Enters the next collective on chan: returns its position (c has MPI). */
int64_t dsrt__comm_mpi_enter(dsrt_comm *c, int chan);
/* Fails a collective at position seq of chan that ran out of time, naming
 * the ranks the heartbeats say are missing; breaks c (c has MPI). */
int dsrt__comm_mpi_timeout(dsrt_comm *c, int chan, int64_t seq, const char *what);
void dsrt__comm_mpi_finalize(void);

/* NCCL (comm_nccl.c, the module dsrt_nccl.so): the gradient engine over
 * c->mpi's ranks, and the in-process group. */
int dsrt__comm_nccl_open(dsrt_comm *c);
int dsrt__comm_nccl_open_local(dsrt_comm **comms, int n, const int *devices,
                               const dsrt_comm_options *o);
/* For tests: an in-process group whose members each have a one-rank NCCL
 * communicator of their own, so that a one-GPU machine (NCCL refuses two
 * ranks of one communicator on one GPU) still closes and aborts several
 * communicators as one group from one thread. Its collectives do not join
 * the members: open, then close. dsrt__comm_open_local_split loads the
 * module and calls it. */
int dsrt__comm_nccl_open_local_split(dsrt_comm **comms, int n, const int *devices,
                                     const dsrt_comm_options *o);
int dsrt__comm_open_local_split(dsrt_comm **comms, int n, const int *devices,
                                const dsrt_comm_options *o);
void dsrt__comm_nccl_close(dsrt_comm *c);

/* The engines' tables, which their modules export (core/module.h) and
 * comm.c loads when a communicator asks for them. dsrt__comm_mpi_enter and
 * dsrt__comm_mpi_timeout (comm.c) call through the MPI table, so that the
 * NCCL module reaches the MPI module's heartbeats without linking it. */
typedef struct {
    int (*init)(int *argc, char ***argv);
    void (*finalize)(void);
    int (*open)(dsrt_comm *c, int with_grads);
    int64_t (*enter)(dsrt_comm *c, int chan);
    int (*timeout)(dsrt_comm *c, int chan, int64_t seq, const char *what);
} comm_mpi_engine;

typedef struct {
    int (*open)(dsrt_comm *c);
    int (*open_local)(dsrt_comm **comms, int n, const int *devices, const dsrt_comm_options *o);
    int (*open_local_split)(dsrt_comm **comms, int n, const int *devices,
                            const dsrt_comm_options *o);
    void (*close)(dsrt_comm *c);
} comm_nccl_engine;

#endif
