/*
 * A CPU stand-in for the CUDA runtime, cuDNN, cuBLAS and NCCL calls of the
 * GPU backend (nn/backend_cuda.c) and the NCCL communicator
 * (runtime/comm/nccl/comm_nccl.c), and for the launches of dsrt's kernels
 * (nn/kernels.h), so that the tests can run the library's own host code
 * (plans, tensor aliasing, NHWC and bfloat16 tensors, padding copies, fused
 * calls and their fallbacks, staging slots, the optimizer hand-off, recorded
 * steps and their replays, the read-backs, gradient buckets, multi-GPU
 * groups and their shutdown) against the CPU backend on a machine without a
 * GPU. Built only with -DDSRT_FAKE_GPU_TEST=ON (the test_fakegpu_*
 * programs).
 *
 * It proves the plumbing, not cuDNN: each cuDNN and cuBLAS call computes
 * what its documentation says (naive loops, sums in double) in the layout
 * (NCHW or NHWC tensors and filters) and type (float32 or bfloat16,
 * rounded when stored as the device rounds) its descriptors give, memory is
 * host memory, and every search offers one deterministic algorithm
 * (IMPLICIT_PRECOMP_GEMM forward). dsrt's own kernels are their real
 * launchers (the .cu files, compiled as C), whose launches come here
 * (dsrt_k_launch) with their host runs: the kernels' grids walked over
 * their real bodies, knowing no kernel but by name. NCCL's all-reduce sums
 * over the members of an in-process clique, one thread a member.
 *
 * Streams run their work at once, except while a stream is being captured
 * (cudaStreamBeginCapture): then every call queued on it (a kernel, a cuDNN
 * or cuBLAS call on a handle bound to it, a copy, an event record) is
 * recorded with its arguments by value (descriptors too) instead of run, and
 * cudaGraphLaunch runs the recorded calls in order, so that a replayed step
 * computes what the launched one did. As on a device: waiting on a stream or
 * an event, allocating or freeing memory from the capturing thread
 * invalidates the capture; a captured wait on an event recorded outside the
 * capture is an isolation error (unless external); an event recorded inside
 * a capture without cudaEventRecordExternal is not recorded by a replay, and
 * the stand-in counts host waits on such stale events.
 *
 * It also watches what a device would punish and the tests assert on it
 * (tests/fakegpu.h): cudaMalloc returns 256-byte aligned memory as CUDA
 * does, and the stand-in counts allocations made after the first
 * collective while a communicator lives, an optimizer kernel reading a
 * segment table last written on another stream, convolutions run on other
 * pointers than their algorithm search saw, NCCL finalize, destroy and
 * abort calls of one clique not grouped together, host waits, waits on
 * work that could never finish (fakegpu_hang_collectives), and capture
 * violations. fakegpu_refuse() makes cuDNN refuse the fused calls, so that
 * the backend's fallbacks run.
 *
 * With DSRT_FAKEGPU_TF32=1 the inputs of convolutions and matrix products
 * that allow TensorFloat-32 are rounded to its 10-bit mantissa, which shows
 * how far reduced-precision gradients may move from the CPU's.
 */
#include "nn/internal.h"
#include "nn/arith.h"
#include "nn/kernels.h"
#include "fakegpu.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#ifdef DSRT_HAVE_NCCL
#include <nccl.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT  0x4556454eu
#define FK_KERNELS   256 /* dsrt's kernels counted by name */

// ----------------------------------------------------------------------------
// Recorded calls

/* One call queued on a stream: its arguments by value after this header,
 * run now or recorded into a capture and run by each launch of the graph
 * (s: the stream it runs on). */
typedef struct fk_op fk_op;
struct fk_op {
    void (*run)(fk_op *op, cudaStream_t s);
    size_t size;
    fk_op *next;
};

typedef struct {
    fk_op *head, *tail;
    int n;
} fk_list;

/* A capture in progress on one stream. */
typedef struct {
    fk_list ops;
    int invalid;                  /* a forbidden call happened: EndCapture fails */
    struct CUevent_st **recorded; /* events recorded in it (waits on them are inside) */
    int n_recorded, cap_recorded;
} fk_capture;

struct CUstream_st {
    unsigned magic;
    int hung; /* behind a collective that never finishes */
    fk_capture *cap;
    struct CUstream_st *next;
};
struct CUevent_st {
    unsigned magic;
    double t;
    int rec;
    int never;    /* recorded behind a hung collective */
    int internal; /* last recorded inside a capture, as a dependency only */
    struct CUevent_st *next;
};
struct CUgraph_st {
    fk_list ops;
};
struct CUgraphExec_st {
    fk_list ops;
};
struct cudnnContext {
    cudaStream_t s;
};
struct cublasContext {
    int tf32;
    cudaStream_t s;
    void *ws;
    size_t wss;
};
struct cudnnTensorStruct {
    cudnnDataType_t dt;
    int nhwc;
    int n, c, h, w;
};
struct cudnnFilterStruct {
    cudnnDataType_t dt;
    int nhwc;
    int k, c, h, w;
};
struct cudnnConvolutionStruct {
    int ph, pw, sh, sw, dh, dw, groups;
    cudnnMathType_t m;
    /* The pointers each search (forward, backward data, backward filter) was
     * given, in the order of the call's tensors. */
    const void *sp[3][3];
    int searched[3];
};
struct cudnnActivationStruct {
    cudnnActivationMode_t mode;
    double coef;
};

/* A live device allocation, and the stream of the last copy or memset that
 * wrote into it (NULL: the legacy stream, or a synchronous call). */
typedef struct alloc_rec {
    char *p;
    size_t n;
    int written;
    cudaStream_t writer;
    struct alloc_rec *next;
} alloc_rec;

/* Everything the stand-in keeps. Tests are its only users: one per process. */
static struct {
    pthread_mutex_t mu;
    int devices;
    double clk;
    fakegpu_stats st;
    long last_close_group; /* the group of the last close call (-1: none) */
    alloc_rec *allocs;
    struct CUstream_st *streams;
    struct CUevent_st *events;
    int hang;
    int live_comms;
    unsigned refuse;
    /* dsrt's kernels launched (by name) and how many times, since the last
     * reset */
    const char *kernels[FK_KERNELS];
    long launches[FK_KERNELS];
    int n_kernels;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .devices = 1};

/* The capture this thread runs, if any. */
static _Thread_local fk_capture *my_capture;
static _Thread_local int round_tf32;

static void lock(void) {
    pthread_mutex_lock(&fk.mu);
}

static void unlock(void) {
    pthread_mutex_unlock(&fk.mu);
}

fakegpu_stats fakegpu_get_stats(void) {
    lock();
    fakegpu_stats s = fk.st;
    unlock();
    return s;
}

void fakegpu_reset_stats(void) {
    lock();
    memset(&fk.st, 0, sizeof fk.st);
    fk.last_close_group = 0;
    fk.n_kernels = 0;
    memset(fk.launches, 0, sizeof fk.launches);
    unlock();
}

void fakegpu_set_devices(int n) {
    fk.devices = n;
}

void fakegpu_hang_collectives(int on) {
    fk.hang = on;
}

void fakegpu_refuse(unsigned what) {
    fk.refuse = what;
}

static void bump(long *counter) {
    lock();
    (*counter)++;
    unlock();
}

static float tf32(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &u, 4);
    return v;
}

static void list_add(fk_list *l, fk_op *op) {
    op->next = NULL;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
    l->n++;
}

static void list_free(fk_list *l) {
    for (fk_op *o = l->head, *nx; o; o = nx) {
        nx = o->next;
        free(o);
    }
    memset(l, 0, sizeof *l);
}

/* A call from this thread that a capturing thread may not make (a host
 * wait, an allocation): it invalidates the capture, as on a device. */
static int capture_violation(void) {
    if (!my_capture) return 0;
    my_capture->invalid = 1;
    bump(&fk.st.capture_violations);
    return 1;
}

/* Runs op on s now, or records a copy of it (size bytes) when s is being
 * captured. */
static void submit(cudaStream_t s, fk_op *op, size_t size) {
    fk_capture *c = s ? s->cap : NULL;
    op->size = size;
    if (!c) {
        op->run(op, s);
        return;
    }
    fk_op *copy = malloc(size);
    if (!copy) {
        c->invalid = 1;
        return;
    }
    memcpy(copy, op, size);
    list_add(&c->ops, copy);
}

/* An allocation or a free: counted, and counted again when a communicator
 * lives and has run a collective (a device would risk a hang there). */
static void count_alloc(long *counter) {
    capture_violation();
    lock();
    (*counter)++;
    if (fk.st.collectives && fk.live_comms) fk.st.allocs_after_collective++;
    unlock();
}

/* The live allocation holding p, or NULL (host memory). Under the lock. */
static alloc_rec *alloc_of(const void *p) {
    for (alloc_rec *a = fk.allocs; a; a = a->next)
        if ((const char *)p >= a->p && (const char *)p < a->p + a->n) return a;
    return NULL;
}

static void record_copy(const void *dst, size_t n, cudaStream_t s) {
    lock();
    alloc_rec *a = alloc_of(dst);
    if (a) {
        a->written = 1;
        a->writer = s;
    }
    unlock();
}

/* The stream of the last copy that wrote into p's allocation, or
 * (cudaStream_t)-1 when none did. */
static cudaStream_t last_writer(const void *p) {
    lock();
    alloc_rec *a = alloc_of(p);
    cudaStream_t w = a && a->written ? a->writer : (cudaStream_t)-1;
    unlock();
    return w;
}

static int stream_ok(cudaStream_t s) {
    if (!s || s->magic == MAGIC_STREAM) return 1;
    lock();
    fk.st.bad_handles++;
    unlock();
    return 0;
}

static int event_ok(cudaEvent_t e) {
    if (e && e->magic == MAGIC_EVENT) return 1;
    lock();
    fk.st.bad_handles++;
    unlock();
    return 0;
}

// ----------------------------------------------------------------------------
// Runtime

cudaError_t cudaGetDeviceCount(int *n) {
    *n = fk.devices;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return d >= 0 && d < fk.devices ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned f) {
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
    snprintf(id, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaErrorNotReady:
        return "fake: device not ready";
    case cudaErrorInvalidResourceHandle:
        return "fake: invalid resource handle";
    case cudaErrorLaunchTimeout:
        return "fake: a wait on work that never finishes (a hung collective)";
    case cudaErrorStreamCaptureUnsupported:
        return "fake: operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "fake: the capture was invalidated";
    case cudaErrorStreamCaptureIsolation:
        return "fake: a captured wait on work outside the capture";
    case cudaErrorIllegalState:
        return "fake: the operation cannot be performed in the present state";
    default:
        return "fake error";
    }
}
/* The thread's last error, as the runtime keeps it: set by a failed call
 * (only the calls whose failures the backend must not see again at its next
 * launch check set it here), returned and reset by cudaGetLastError. */
static _Thread_local cudaError_t last_error;

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    if (my_capture) {
        capture_violation();
        return cudaErrorStreamCaptureUnsupported;
    }
    /* Device allocations are 256-byte aligned. */
    alloc_rec *a = calloc(1, sizeof *a);
    *p = aligned_alloc(256, (n + 511) & ~(size_t)255);
    if (!*p || !a) {
        free(*p);
        free(a);
        return cudaErrorMemoryAllocation;
    }
    memset(*p, 0x7f, n); /* garbage-ish: NaN-free large floats */
    a->p = *p;
    a->n = n ? n : 1;
    lock();
    a->next = fk.allocs;
    fk.allocs = a;
    unlock();
    count_alloc(&fk.st.mallocs);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (my_capture) {
        capture_violation();
        return cudaErrorStreamCaptureUnsupported;
    }
    lock();
    for (alloc_rec **q = &fk.allocs; *q; q = &(*q)->next)
        if ((*q)->p == p) {
            alloc_rec *a = *q;
            *q = a->next;
            free(a);
            break;
        }
    unlock();
    free(p);
    count_alloc(&fk.st.frees);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = calloc(1, n);
    count_alloc(&fk.st.host_allocs);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    count_alloc(&fk.st.host_frees);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    *f = 1 << 28;
    *t = 1 << 30;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    memcpy(d, s, n);
    record_copy(d, n, NULL);
    return cudaSuccess;
}

typedef struct {
    fk_op op;
    void *d;
    const void *s;
    size_t n;
    int value, set;
} copy_op;

static void copy_run(fk_op *o, cudaStream_t s) {
    copy_op *a = (copy_op *)o;
    if (a->set)
        memset(a->d, a->value, a->n);
    else
        memcpy(a->d, a->s, a->n);
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
    if (!stream_ok(st)) return cudaErrorInvalidResourceHandle;
    copy_op a = {{copy_run, 0, NULL}, d, s, n, 0, 0};
    submit(st, &a.op, sizeof a);
    record_copy(d, n, st);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    if (!stream_ok(st)) return cudaErrorInvalidResourceHandle;
    copy_op a = {{copy_run, 0, NULL}, d, NULL, n, v, 1};
    submit(st, &a.op, sizeof a);
    record_copy(d, n, st);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    memset(d, v, n);
    record_copy(d, n, NULL);
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU stand-in (tests/fakegpu.c)");
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    *s = calloc(1, sizeof **s);
    if (!*s) return cudaErrorMemoryAllocation;
    (*s)->magic = MAGIC_STREAM;
    lock();
    (*s)->next = fk.streams;
    fk.streams = *s;
    unlock();
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, 0);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!stream_ok(s) || !s) return cudaErrorInvalidResourceHandle;
    lock();
    for (struct CUstream_st **p = &fk.streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    unlock();
    s->magic = 0;
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!stream_ok(s)) return cudaErrorInvalidResourceHandle;
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    lock();
    fk.st.host_waits++;
    int dead = s && s->hung;
    if (dead) fk.st.deadlocks++;
    unlock();
    return dead ? cudaErrorLaunchTimeout : cudaSuccess;
}

typedef struct {
    fk_op op;
    cudaEvent_t e;
} wait_op;

static void wait_run(fk_op *o, cudaStream_t s) {
    wait_op *a = (wait_op *)o;
    lock();
    fk.clk += 0.001;
    if (a->e->never && s) s->hung = 1;
    unlock();
}

/* Whether e was recorded in capture c. */
static int recorded_in(const fk_capture *c, cudaEvent_t e) {
    for (int k = 0; k < c->n_recorded; k++)
        if (c->recorded[k] == e) return 1;
    return 0;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
    if (!stream_ok(s) || !event_ok(e)) return cudaErrorInvalidResourceHandle;
    fk_capture *c = s ? s->cap : NULL;
    if (c && !recorded_in(c, e)) {
        /* A captured wait on work outside the capture. */
        if (!(f & cudaEventWaitExternal)) {
            c->invalid = 1;
            bump(&fk.st.capture_violations);
            return cudaErrorStreamCaptureIsolation;
        }
    } else if (c) {
        return cudaSuccess; /* an edge inside the graph */
    }
    wait_op a = {{wait_run, 0, NULL}, e};
    submit(s, &a.op, sizeof a);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
    *e = calloc(1, sizeof **e);
    if (!*e) return cudaErrorMemoryAllocation;
    (*e)->magic = MAGIC_EVENT;
    lock();
    (*e)->next = fk.events;
    fk.events = *e;
    unlock();
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, 0);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
    lock();
    for (struct CUevent_st **p = &fk.events; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    unlock();
    e->magic = 0;
    free(e);
    return cudaSuccess;
}

typedef struct {
    fk_op op;
    cudaEvent_t e;
} record_op;

static void record_run(fk_op *o, cudaStream_t s) {
    record_op *a = (record_op *)o;
    lock();
    fk.clk += 0.5;
    a->e->t = fk.clk;
    a->e->rec = 1;
    a->e->internal = 0;
    a->e->never = s && s->hung;
    unlock();
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned f) {
    if (!event_ok(e) || !stream_ok(s)) return cudaErrorInvalidResourceHandle;
    fk_capture *c = s ? s->cap : NULL;
    /* The external flag makes an event node of a capture; outside one the
     * runtime refuses it. */
    if ((f & cudaEventRecordExternal) && !c) return last_error = cudaErrorIllegalState;
    if (c) {
        if (c->n_recorded == c->cap_recorded) {
            int cap = c->cap_recorded ? 2 * c->cap_recorded : 16;
            struct CUevent_st **r = realloc(c->recorded, (size_t)cap * sizeof *r);
            if (!r) return cudaErrorMemoryAllocation;
            c->recorded = r;
            c->cap_recorded = cap;
        }
        c->recorded[c->n_recorded++] = e;
        if (!(f & cudaEventRecordExternal)) {
            /* A dependency inside the graph: a replay does not record it. */
            lock();
            e->internal = 1;
            unlock();
            return cudaSuccess;
        }
    }
    record_op a = {{record_run, 0, NULL}, e};
    submit(s, &a.op, sizeof a);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    return cudaEventRecordWithFlags(e, s, 0);
}

/* A host wait on e: counted; stale when its last record was a capture's
 * internal dependency (a replay never records it). */
static void host_wait_on(cudaEvent_t e) {
    lock();
    if (e->internal) fk.st.stale_event_waits++;
    unlock();
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    host_wait_on(e);
    lock();
    fk.st.event_queries++;
    int never = e->never;
    unlock();
    return never ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
    if (capture_violation()) return cudaErrorStreamCaptureUnsupported;
    host_wait_on(e);
    lock();
    fk.st.host_waits++;
    int dead = e->never;
    if (dead) fk.st.deadlocks++;
    unlock();
    return dead ? cudaErrorLaunchTimeout : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!event_ok(a) || !event_ok(b)) return cudaErrorInvalidResourceHandle;
    if (!a->rec || !b->rec || a->never || b->never) return cudaErrorNotReady;
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}

/* A communicator was aborted: NCCL's kernels quit, and the work behind
 * them completes. */
static void release_hung(void) {
    lock();
    for (struct CUstream_st *s = fk.streams; s; s = s->next) s->hung = 0;
    for (struct CUevent_st *e = fk.events; e; e = e->next) e->never = 0;
    unlock();
}

// ----------------------------------------------------------------------------
// Graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    if (!stream_ok(s) || !s) return cudaErrorInvalidResourceHandle;
    if (s->cap || my_capture) return cudaErrorStreamCaptureUnsupported;
    fk_capture *c = calloc(1, sizeof *c);
    if (!c) return cudaErrorMemoryAllocation;
    s->cap = c;
    my_capture = c;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
    if (!stream_ok(s)) return cudaErrorInvalidResourceHandle;
    *st = s && s->cap ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    if (!stream_ok(s) || !s) return cudaErrorInvalidResourceHandle;
    fk_capture *c = s->cap;
    *g = NULL;
    if (!c) return cudaErrorIllegalState;
    s->cap = NULL;
    if (my_capture == c) my_capture = NULL;
    int invalid = c->invalid;
    struct CUgraph_st *graph = invalid ? NULL : calloc(1, sizeof *graph);
    if (graph)
        graph->ops = c->ops;
    else
        list_free(&c->ops);
    free(c->recorded);
    free(c);
    if (invalid) return cudaErrorStreamCaptureInvalidated;
    if (!graph) return cudaErrorMemoryAllocation;
    bump(&fk.st.captures);
    *g = graph;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
    *x = NULL;
    if (!g) return cudaErrorInvalidValue;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e) return cudaErrorMemoryAllocation;
    for (fk_op *o = g->ops.head; o; o = o->next) {
        fk_op *copy = malloc(o->size);
        if (!copy) {
            list_free(&e->ops);
            free(e);
            return cudaErrorMemoryAllocation;
        }
        memcpy(copy, o, o->size);
        list_add(&e->ops, copy);
    }
    bump(&fk.st.graph_instantiations);
    *x = e;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    if (!g) return cudaSuccess;
    list_free(&g->ops);
    free(g);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    if (!x) return cudaSuccess;
    list_free(&x->ops);
    free(x);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
    if (!x || !stream_ok(s)) return cudaErrorInvalidResourceHandle;
    if (s && s->cap) return cudaErrorStreamCaptureUnsupported;
    lock();
    fk.st.graph_launches++;
    fk.st.graph_ops += x->ops.n;
    unlock();
    for (fk_op *o = x->ops.head; o; o = o->next) o->run(o, s);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// cuDNN's algorithm search: which pointers it saw, and whether the run uses
// the same ones.

static void searched(cudnnConvolutionDescriptor_t cd, int k, const void *a, const void *b,
                     const void *c) {
    cd->sp[k][0] = a;
    cd->sp[k][1] = b;
    cd->sp[k][2] = c;
    cd->searched[k] = 1;
}

static void used(cudnnConvolutionDescriptor_t cd, int k, const void *a, const void *b,
                 const void *c) {
    if (!cd->searched[k]) return;
    lock();
    fk.st.search_checked++;
    if (cd->sp[k][0] != a || cd->sp[k][1] != b || cd->sp[k][2] != c) fk.st.search_mismatches++;
    unlock();
}

// ----------------------------------------------------------------------------
// cuBLAS

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = calloc(1, sizeof **h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    h->tf32 = m == CUBLAS_TF32_TENSOR_OP_MATH;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t n) {
    h->ws = ws;
    h->wss = n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return "fake blas error";
}

static float ld(const void *p, size_t i, int bf) {
    float v = bf ? dsrt_f32_from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
    return round_tf32 && !bf ? tf32(v) : v;
}

typedef struct {
    fk_op op;
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    int abf, bbf, cbf, lda, ldb, ldc, tf32;
} gemm_op;

static void gemm_run(fk_op *o, cudaStream_t s) {
    gemm_op *a = (gemm_op *)o;
    round_tf32 = a->tf32;
    for (int i = 0; i < a->m; i++)
        for (int j = 0; j < a->n; j++) {
            double sum = 0;
            for (int p = 0; p < a->k; p++) {
                float x = a->ta == CUBLAS_OP_N ? ld(a->A, (size_t)p * a->lda + i, a->abf)
                                               : ld(a->A, (size_t)i * a->lda + p, a->abf);
                float y = a->tb == CUBLAS_OP_N ? ld(a->B, (size_t)j * a->ldb + p, a->bbf)
                                               : ld(a->B, (size_t)p * a->ldb + j, a->bbf);
                sum += (double)x * y;
            }
            size_t at = (size_t)j * a->ldc + i;
            round_tf32 = 0;
            float old = a->beta != 0 ? ld(a->C, at, a->cbf) : 0;
            round_tf32 = a->tf32;
            float v = a->alpha * (float)sum + (a->beta != 0 ? a->beta * old : 0);
            if (a->cbf)
                ((uint16_t *)a->C)[at] = dsrt_bf16_from_f32(v);
            else
                ((float *)a->C)[at] = v;
        }
    round_tf32 = 0;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float *alpha, const float *A, int lda,
                              const float *B, int ldb, const float *beta, float *C, int ldc) {
    gemm_op a = {{gemm_run, 0, NULL},
                 ta,
                 tb,
                 m,
                 n,
                 k,
                 *alpha,
                 *beta,
                 A,
                 B,
                 C,
                 0,
                 0,
                 0,
                 lda,
                 ldb,
                 ldc,
                 h->tf32};
    submit(h->s, &a.op, sizeof a);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t ctp,
                            cublasGemmAlgo_t al) {
    if (ct != CUDA_R_32F && ct != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    gemm_op a = {{gemm_run, 0, NULL},
                 ta,
                 tb,
                 m,
                 n,
                 k,
                 *(const float *)alpha,
                 *(const float *)beta,
                 A,
                 B,
                 C,
                 at == CUDA_R_16BF,
                 bt == CUDA_R_16BF,
                 ct == CUDA_R_16BF,
                 lda,
                 ldb,
                 ldc,
                 0};
    submit(h->s, &a.op, sizeof a);
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// cuDNN descriptors

const char *cudnnGetErrorString(cudnnStatus_t s) {
    return s == CUDNN_STATUS_NOT_SUPPORTED ? "fake cudnn: not supported" : "fake cudnn error";
}
void cudnnGetLastErrorString(char *m, size_t n) {
    if (n) *m = 0;
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = calloc(1, sizeof **h);
    return 0;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    free(h);
    return 0;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    h->s = s;
    return 0;
}
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return 0;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w) {
    if ((f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC) || n < 1 || c < 1 || h < 1 || w < 1 ||
        (t != CUDNN_DATA_FLOAT && t != CUDNN_DATA_BFLOAT16))
        return CUDNN_STATUS_BAD_PARAM;
    d->dt = t;
    d->nhwc = f == CUDNN_TENSOR_NHWC;
    d->n = n;
    d->c = c;
    d->h = h;
    d->w = w;
    return 0;
}
cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t d, cudnnTensorDescriptor_t x,
                                            cudnnBatchNormMode_t mode) {
    return cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, x->c, 1, 1);
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return 0;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w) {
    if (f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
    d->dt = t;
    d->nhwc = f == CUDNN_TENSOR_NHWC;
    d->k = k;
    d->c = c;
    d->h = h;
    d->w = w;
    return 0;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    (*d)->groups = 1;
    return 0;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int u,
                                              int v, int dh, int dw, cudnnConvolutionMode_t m,
                                              cudnnDataType_t t) {
    if (m != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
    d->ph = ph;
    d->pw = pw;
    d->sh = u;
    d->sw = v;
    d->dh = dh;
    d->dw = dw;
    return 0;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int g) {
    d->groups = g;
    return 0;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
    d->m = m;
    return 0;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t c,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int *n, int *k,
                                                    int *h, int *ww) {
    *n = x->n;
    *k = w->k;
    *h = (x->h + 2 * c->ph - ((w->h - 1) * c->dh + 1)) / c->sh + 1;
    *ww = (x->w + 2 * c->pw - ((w->w - 1) * c->dw + 1)) / c->sw + 1;
    if (x->c != w->c * c->groups) return CUDNN_STATUS_BAD_PARAM;
    return 0;
}
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return 0;
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d, cudnnActivationMode_t m,
                                           cudnnNanPropagation_t nan, double coef) {
    if (m != CUDNN_ACTIVATION_RELU && m != CUDNN_ACTIVATION_IDENTITY) return CUDNN_STATUS_BAD_PARAM;
    d->mode = m;
    d->coef = coef;
    return 0;
}

/* ---- algorithm search: one algorithm, a little workspace */
/* The one algorithm every search offers: deterministic, the descriptor's
 * math type; forward's is IMPLICIT_PRECOMP_GEMM (1). Refused (its status
 * NOT_SUPPORTED) with FAKEGPU_REFUSE_CONV_ALGOS, as cuDNN answers for a
 * convolution it has no algorithm for. */
#define ONE_ALGO(r, cd, got)                                                                       \
    do {                                                                                           \
        memset(&(r)[0], 0, sizeof(r)[0]);                                                          \
        (r)[0].algo = 1;                                                                           \
        (r)[0].determinism = CUDNN_DETERMINISTIC;                                                  \
        (r)[0].mathType = (cd)->m;                                                                 \
        if (fk.refuse & FAKEGPU_REFUSE_CONV_ALGOS) (r)[0].status = CUDNN_STATUS_NOT_SUPPORTED;     \
        *(got) = 1;                                                                                \
        return CUDNN_STATUS_SUCCESS;                                                               \
    } while (0)
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
    const cudnnTensorDescriptor_t yd, void *y, const int req, int *got,
    cudnnConvolutionFwdAlgoPerf_t *r, void *ws, size_t wss) {
    if (capture_violation()) return CUDNN_STATUS_NOT_SUPPORTED;
    if (xd->dt != wd->dt || xd->dt != yd->dt) return CUDNN_STATUS_BAD_PARAM;
    searched(cd, 0, x, w, y);
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnFilterDescriptor_t wd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t yd, const int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *r) {
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const void *w,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnConvolutionDescriptor_t cd,
    const cudnnTensorDescriptor_t dxd, void *dx, const int req, int *got,
    cudnnConvolutionBwdDataAlgoPerf_t *r, void *ws, size_t wss) {
    if (capture_violation()) return CUDNN_STATUS_NOT_SUPPORTED;
    searched(cd, 1, w, dy, dx);
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t dxd, const int req,
    int *got, cudnnConvolutionBwdDataAlgoPerf_t *r) {
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnConvolutionDescriptor_t cd,
    const cudnnFilterDescriptor_t dwd, void *dw, const int req, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *r, void *ws, size_t wss) {
    if (capture_violation()) return CUDNN_STATUS_NOT_SUPPORTED;
    searched(cd, 2, x, dy, dw);
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnFilterDescriptor_t dwd, const int req,
    int *got, cudnnConvolutionBwdFilterAlgoPerf_t *r) {
    ONE_ALGO(r, cd, got);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h,
                                                      const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t c,
                                                      const cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *s) {
    *s = 64;
    return 0;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t a, size_t *s) {
    *s = 128;
    return 0;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t a, size_t *s) {
    *s = 32;
    return 0;
}

// ----------------------------------------------------------------------------
// cuDNN's arithmetic, on tensors of either layout and type

typedef struct cudnnTensorStruct tdesc;
typedef struct cudnnFilterStruct fdesc;

static size_t tcount(const tdesc *d) {
    return (size_t)d->n * d->c * d->h * d->w;
}
static float getv(cudnnDataType_t t, const void *p, size_t i) {
    return ld(p, i, t == CUDNN_DATA_BFLOAT16);
}
static void setv(cudnnDataType_t t, void *p, size_t i, float v, float alpha, float beta) {
    float old = beta != 0 ? getv(t, p, i) : 0;
    float r = alpha * v + beta * old;
    if (t == CUDNN_DATA_BFLOAT16)
        ((uint16_t *)p)[i] = dsrt_bf16_from_f32(r);
    else
        ((float *)p)[i] = r;
}
static size_t at4(const tdesc *d, int n, int c, int h, int w) {
    if (d->nhwc) return (((size_t)n * d->h + h) * d->w + w) * d->c + c;
    return (((size_t)n * d->c + c) * d->h + h) * d->w + w;
}
/* Filter element (k, c, r, s) in its layout. */
static size_t fat(const fdesc *d, int k, int c, int r, int s) {
    if (d->nhwc) return (((size_t)k * d->h + r) * d->w + s) * d->c + c;
    return (((size_t)k * d->c + c) * d->h + r) * d->w + s;
}

/* A convolution's arguments by value. */
typedef struct {
    fk_op op;
    tdesc xd, yd;
    fdesc wd;
    struct cudnnConvolutionStruct cd;
    const void *a, *b; /* forward: x, w; data: w, dy; filter: x, dy */
    void *c;           /* forward: y; data: dx; filter: dw */
    float alpha, beta;
    int tf32;
    /* Forward fused with bias and activation. */
    const void *bias;
    cudnnDataType_t bias_dt;
    int relu;
} conv_op;

/* The window sweep of a convolution: calls fn for every (image, out
 * channel, output pixel, in channel, tap) with the x and y indices. */
#define CONV_LOOP(a, body)                                                                         \
    do {                                                                                           \
        const tdesc *xd_ = &(a)->xd, *yd_ = &(a)->yd;                                              \
        const fdesc *wd_ = &(a)->wd;                                                               \
        const struct cudnnConvolutionStruct *cd_ = &(a)->cd;                                       \
        int Kg_ = wd_->k / cd_->groups, Cg_ = wd_->c;                                              \
        for (int n_ = 0; n_ < yd_->n; n_++)                                                        \
            for (int k_ = 0; k_ < yd_->c; k_++)                                                    \
                for (int oh_ = 0; oh_ < yd_->h; oh_++)                                             \
                    for (int ow_ = 0; ow_ < yd_->w; ow_++) {                                       \
                        int g_ = k_ / Kg_;                                                         \
                        size_t yi = at4(yd_, n_, k_, oh_, ow_);                                    \
                        (void)yi;                                                                  \
                        for (int c_ = 0; c_ < Cg_; c_++)                                           \
                            for (int r_ = 0; r_ < wd_->h; r_++)                                    \
                                for (int q_ = 0; q_ < wd_->w; q_++) {                              \
                                    int ih_ = oh_ * cd_->sh - cd_->ph + r_ * cd_->dh,              \
                                        iw_ = ow_ * cd_->sw - cd_->pw + q_ * cd_->dw;              \
                                    if (ih_ < 0 || iw_ < 0 || ih_ >= xd_->h || iw_ >= xd_->w)      \
                                        continue;                                                  \
                                    size_t xi = at4(xd_, n_, g_ * Cg_ + c_, ih_, iw_),             \
                                           wi = fat(wd_, k_, c_, r_, q_);                          \
                                    body;                                                          \
                                }                                                                  \
                    }                                                                              \
    } while (0)

static void conv_fwd_run(fk_op *o, cudaStream_t s) {
    conv_op *a = (conv_op *)o;
    double *acc = calloc(tcount(&a->yd), sizeof *acc);
    if (!acc) return;
    round_tf32 = a->tf32;
    CONV_LOOP(a, acc[yi] += (double)getv(a->xd.dt, a->a, xi) * getv(a->wd.dt, a->b, wi));
    round_tf32 = 0;
    for (int n = 0; n < a->yd.n; n++)
        for (int k = 0; k < a->yd.c; k++)
            for (int h = 0; h < a->yd.h; h++)
                for (int w = 0; w < a->yd.w; w++) {
                    size_t i = at4(&a->yd, n, k, h, w);
                    float v = a->alpha * (float)acc[i];
                    if (a->bias) {
                        v += getv(a->bias_dt, a->bias, (size_t)k);
                        if (a->relu && v < 0) v = 0;
                        setv(a->yd.dt, a->c, i, v, 1, 0);
                    } else {
                        setv(a->yd.dt, a->c, i, (float)acc[i], a->alpha, a->beta);
                    }
                }
    free(acc);
}

static int conv_tf32(const struct cudnnConvolutionStruct *cd) {
    return cd->m != CUDNN_FMA_MATH && getenv("DSRT_FAKEGPU_TF32") != NULL;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      const cudnnTensorDescriptor_t xd, const void *x,
                                      const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cd,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t wss,
                                      const void *beta, const cudnnTensorDescriptor_t yd, void *y) {
    used(cd, 0, x, w, y);
    if (wss < 64 || !ws) return CUDNN_STATUS_BAD_PARAM;
    if (xd->nhwc != yd->nhwc || xd->dt != wd->dt || xd->dt != yd->dt) return CUDNN_STATUS_BAD_PARAM;
    conv_op a = {
        {conv_fwd_run, 0, NULL}, *xd,           *yd,  *wd, *cd, x, w, y, *(const float *)alpha,
        *(const float *)beta,    conv_tf32(cd), NULL, 0,   0};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

/* y = act(alpha1 conv(x) + alpha2 z + bias): ReLU or identity, identity
 * with IMPLICIT_PRECOMP_GEMM only (cuDNN's rule); alpha2 must be 0 here,
 * z then unread. */
cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t h, const void *alpha1, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
    cudnnConvolutionFwdAlgo_t algo, void *ws, size_t wss, const void *alpha2,
    const cudnnTensorDescriptor_t zd, const void *z, const cudnnTensorDescriptor_t bd,
    const void *bias, const cudnnActivationDescriptor_t act, const cudnnTensorDescriptor_t yd,
    void *y) {
    if (fk.refuse & FAKEGPU_REFUSE_FUSED_CONV) return CUDNN_STATUS_NOT_SUPPORTED;
    if (act->mode == CUDNN_ACTIVATION_IDENTITY &&
        algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (*(const float *)alpha2 != 0 || !bias || bd->c != yd->c) return CUDNN_STATUS_BAD_PARAM;
    if (wss < 64 || !ws) return CUDNN_STATUS_BAD_PARAM;
    /* As cuDNN on an H100: a float bias with bfloat16 data is refused (not
     * among its documented configurations); a bfloat16 bias is taken, read
     * 16 bytes at a time. */
    if (xd->dt == CUDNN_DATA_BFLOAT16 && bd->dt != CUDNN_DATA_BFLOAT16)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if ((uintptr_t)bias & 15) bump(&fk.st.misaligned_bias);
    used(cd, 0, x, w, y);
    conv_op a = {{conv_fwd_run, 0, NULL},
                 *xd,
                 *yd,
                 *wd,
                 *cd,
                 x,
                 w,
                 y,
                 *(const float *)alpha1,
                 0,
                 conv_tf32(cd),
                 bias,
                 bd->dt,
                 act->mode == CUDNN_ACTIVATION_RELU};
    submit(h->s, &a.op, sizeof a);
    bump(&fk.st.fused_convs);
    if (bd->dt == CUDNN_DATA_BFLOAT16) bump(&fk.st.fused_convs_bias16);
    return 0;
}

static void conv_data_run(fk_op *o, cudaStream_t s) {
    conv_op *a = (conv_op *)o;
    /* a: w, b: dy, c: dx; xd is dx's, yd dy's */
    double *acc = calloc(tcount(&a->xd), sizeof *acc);
    if (!acc) return;
    round_tf32 = a->tf32;
    CONV_LOOP(a, acc[xi] += (double)getv(a->yd.dt, a->b, yi) * getv(a->wd.dt, a->a, wi));
    round_tf32 = 0;
    for (size_t i = 0; i < tcount(&a->xd); i++)
        setv(a->xd.dt, a->c, i, (float)acc[i], a->alpha, a->beta);
    free(acc);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           const cudnnFilterDescriptor_t wd, const void *w,
                                           const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *ws, size_t wss,
                                           const void *beta, const cudnnTensorDescriptor_t dxd,
                                           void *dx) {
    used(cd, 1, w, dy, dx);
    if (wss < 128 || !ws) return CUDNN_STATUS_BAD_PARAM;
    conv_op a = {
        {conv_data_run, 0, NULL}, *dxd,          *dyd, *wd, *cd, w, dy, dx, *(const float *)alpha,
        *(const float *)beta,     conv_tf32(cd), NULL, 0,   0};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

static void conv_filter_run(fk_op *o, cudaStream_t s) {
    conv_op *a = (conv_op *)o;
    /* a: x, b: dy, c: dw */
    size_t wn = (size_t)a->wd.k * a->wd.c * a->wd.h * a->wd.w;
    double *acc = calloc(wn, sizeof *acc);
    if (!acc) return;
    round_tf32 = a->tf32;
    CONV_LOOP(a, acc[wi] += (double)getv(a->yd.dt, a->b, yi) * getv(a->xd.dt, a->a, xi));
    round_tf32 = 0;
    for (size_t i = 0; i < wn; i++) setv(a->wd.dt, a->c, i, (float)acc[i], a->alpha, a->beta);
    free(acc);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             const cudnnTensorDescriptor_t xd, const void *x,
                                             const cudnnTensorDescriptor_t dyd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cd,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws,
                                             size_t wss, const void *beta,
                                             const cudnnFilterDescriptor_t wd, void *dw) {
    used(cd, 2, x, dy, dw);
    if (wss < 32 || !ws) return CUDNN_STATUS_BAD_PARAM;
    conv_op a = {
        {conv_filter_run, 0, NULL}, *xd,           *dyd, *wd, *cd, x, dy, dw, *(const float *)alpha,
        *(const float *)beta,       conv_tf32(cd), NULL, 0,   0};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

/* C = alpha A + beta C, A broadcast over C (the batchnorm's per-channel
 * tensors), or C *= alpha (scale). */
typedef struct {
    fk_op op;
    tdesc ad, cd;
    const void *A;
    void *C;
    float alpha, beta;
    int scale;
} tensor_op;

static void tensor_run(fk_op *o, cudaStream_t s) {
    tensor_op *a = (tensor_op *)o;
    const tdesc *ad = &a->ad, *cd = &a->cd;
    if (a->scale) {
        for (size_t i = 0; i < tcount(cd); i++)
            setv(cd->dt, a->C, i, getv(cd->dt, a->C, i) * a->alpha, 1, 0);
        return;
    }
    for (int n = 0; n < cd->n; n++)
        for (int c = 0; c < cd->c; c++)
            for (int y = 0; y < cd->h; y++)
                for (int x = 0; x < cd->w; x++) {
                    size_t ai = at4(ad, ad->n == 1 ? 0 : n, ad->c == 1 ? 0 : c, ad->h == 1 ? 0 : y,
                                    ad->w == 1 ? 0 : x);
                    setv(cd->dt, a->C, at4(cd, n, c, y, x), getv(ad->dt, a->A, ai), a->alpha,
                         a->beta);
                }
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t ad,
                             const void *A, const void *beta, const cudnnTensorDescriptor_t cdd,
                             void *C) {
    tensor_op a = {{tensor_run, 0, NULL}, *ad, *cdd, A, C, *(const float *)alpha,
                   *(const float *)beta,  0};
    submit(h->s, &a.op, sizeof a);
    return 0;
}
cudnnStatus_t cudnnScaleTensor(cudnnHandle_t h, const cudnnTensorDescriptor_t yd, void *y,
                               const void *alpha) {
    tensor_op a = {{tensor_run, 0, NULL}, *yd, *yd, NULL, y, *(const float *)alpha, 0, 1};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

/* ---- batchnorm */

/* A batchnorm Ex call's arguments by value: forward (training) or
 * backward, with the ReLU after it when act. */
typedef struct {
    fk_op op;
    tdesc xd;
    const void *x, *dy, *y, *scale, *bias, *mean, *var;
    void *out, *dx, *dscale, *dbias, *rm, *rv, *sm, *si;
    double f, eps;
    int train, act;
} bn_op;

static void bn_fwd_run(fk_op *o, cudaStream_t s) {
    bn_op *a = (bn_op *)o;
    const tdesc *xd = &a->xd;
    const float *S = a->scale, *B = a->bias;
    size_t M = (size_t)xd->n * xd->h * xd->w;
    for (int c = 0; c < xd->c; c++) {
        double sum = 0, q = 0;
        for (int n = 0; n < xd->n; n++)
            for (int y = 0; y < xd->h; y++)
                for (int x = 0; x < xd->w; x++) sum += getv(xd->dt, a->x, at4(xd, n, c, y, x));
        double mean = sum / M;
        for (int n = 0; n < xd->n; n++)
            for (int y = 0; y < xd->h; y++)
                for (int x = 0; x < xd->w; x++) {
                    double d = getv(xd->dt, a->x, at4(xd, n, c, y, x)) - mean;
                    q += d * d;
                }
        double var = q / M, inv = 1.0 / sqrt(var + a->eps);
        for (int n = 0; n < xd->n; n++)
            for (int y = 0; y < xd->h; y++)
                for (int x = 0; x < xd->w; x++) {
                    size_t k = at4(xd, n, c, y, x);
                    float v = (float)(S[c] * (getv(xd->dt, a->x, k) - mean) * inv + B[c]);
                    if (a->act && v < 0) v = 0;
                    setv(xd->dt, a->out, k, v, 1, 0);
                }
        if (a->rm) {
            float *rm = a->rm, *rv = a->rv;
            rm[c] = (float)((1 - a->f) * rm[c] + a->f * mean);
            rv[c] = (float)((1 - a->f) * rv[c] + a->f * var * M / (M - 1));
        }
        if (a->sm) {
            ((float *)a->sm)[c] = (float)mean;
            ((float *)a->si)[c] = (float)inv;
        }
    }
}

static void bn_bwd_run(fk_op *o, cudaStream_t s) {
    bn_op *a = (bn_op *)o;
    const tdesc *xd = &a->xd;
    const float *S = a->scale, *MEAN = a->mean, *INV = a->var;
    size_t M = (size_t)xd->n * xd->h * xd->w;
    for (int c = 0; c < xd->c; c++) {
        double db = 0, ds = 0;
        for (int n = 0; n < xd->n; n++)
            for (int y = 0; y < xd->h; y++)
                for (int x = 0; x < xd->w; x++) {
                    size_t k = at4(xd, n, c, y, x);
                    double g = getv(xd->dt, a->dy, k);
                    if (a->act && !(getv(xd->dt, a->y, k) > 0)) g = 0;
                    db += g;
                    ds += g * (getv(xd->dt, a->x, k) - MEAN[c]) * INV[c];
                }
        ((float *)a->dscale)[c] = (float)ds;
        ((float *)a->dbias)[c] = (float)db;
        for (int n = 0; n < xd->n; n++)
            for (int y = 0; y < xd->h; y++)
                for (int x = 0; x < xd->w; x++) {
                    size_t k = at4(xd, n, c, y, x);
                    double g = getv(xd->dt, a->dy, k);
                    if (a->act && !(getv(xd->dt, a->y, k) > 0)) g = 0;
                    double xh = (getv(xd->dt, a->x, k) - MEAN[c]) * INV[c];
                    setv(xd->dt, a->dx, k, (float)(S[c] * INV[c] / M * (M * g - db - xh * ds)), 1,
                         0);
                }
    }
}

static cudnnStatus_t bn_fwd(cudnnHandle_t h, const tdesc *xd, const tdesc *yd, const void *x,
                            void *y, const void *scale, const void *bias, double f, void *rm,
                            void *rv, double eps, void *sm, void *si, int act) {
    if ((rm == NULL) != (rv == NULL) || x == y || xd->nhwc != yd->nhwc || xd->dt != yd->dt)
        return CUDNN_STATUS_BAD_PARAM;
    bn_op a = {{bn_fwd_run, 0, NULL},
               *xd,
               x,
               NULL,
               NULL,
               scale,
               bias,
               NULL,
               NULL,
               y,
               NULL,
               NULL,
               NULL,
               rm,
               rv,
               sm,
               si,
               f,
               eps,
               1,
               act};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

static cudnnStatus_t bn_bwd(cudnnHandle_t h, const tdesc *xd, const void *x, const void *y,
                            const void *dy, void *dx, const void *scale, void *dscale, void *dbias,
                            double eps, const void *sm, const void *si, int act) {
    if (!sm || !si || x == dx) return CUDNN_STATUS_BAD_PARAM;
    bn_op a = {{bn_bwd_run, 0, NULL},
               *xd,
               x,
               dy,
               y,
               scale,
               NULL,
               sm,
               si,
               NULL,
               dx,
               dscale,
               dbias,
               NULL,
               NULL,
               NULL,
               NULL,
               0,
               eps,
               1,
               act};
    submit(h->s, &a.op, sizeof a);
    return 0;
}

/* The Ex calls: NHWC persistent only (as on a device), a plain ReLU the
 * one activation; their workspace and reserve space are sizes the
 * stand-in asks for and checks. */
#define BN_EX_WS      96
#define BN_EX_RESERVE 48

/* cuDNN's persistent NHWC batchnorm kernels read a pixel's channels 16
 * bytes at a time: its queries and calls accept any channel count, but on a
 * device a row of channels that is not a multiple of 16 bytes (6 fp32
 * channels, say) faults with misaligned reads once the kernel runs (seen on
 * an H100). The stand-in computes and counts it (bn_ex_misaligned). */
static int bn_ex_row_misaligned(const tdesc *xd) {
    size_t el = xd->dt == CUDNN_DATA_FLOAT ? 4 : 2;
    return ((size_t)xd->c * el) % 16 != 0;
}

/* Its per-channel vectors (scale, bias, their gradients, running and saved
 * statistics) are read the same way: each must start on 16 bytes. */
static int bn_ex_vectors_misaligned(const void *a, const void *b, const void *c, const void *d,
                                    const void *e, const void *f) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e |
             (uintptr_t)f) &
            15) != 0;
}

static cudnnStatus_t bn_ex_ok(cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const tdesc *xd,
                              const struct cudnnActivationStruct *act) {
    if (fk.refuse & FAKEGPU_REFUSE_BN_EX) return CUDNN_STATUS_NOT_SUPPORTED;
    if ((fk.refuse & FAKEGPU_REFUSE_BN_EX_RELU) && ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT || !xd->nhwc) return CUDNN_STATUS_NOT_SUPPORTED;
    if (ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION && (!act || act->mode != CUDNN_ACTIVATION_RELU))
        return CUDNN_STATUS_BAD_PARAM;
    if (ops != CUDNN_BATCHNORM_OPS_BN && ops != CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
        return CUDNN_STATUS_NOT_SUPPORTED;
    return 0;
}

cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
    const cudnnTensorDescriptor_t xd, const cudnnTensorDescriptor_t zd,
    const cudnnTensorDescriptor_t yd, const cudnnTensorDescriptor_t bd,
    const cudnnActivationDescriptor_t act, size_t *size) {
    *size = BN_EX_WS;
    return bn_ex_ok(mode, ops, xd, act);
}

cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
    const cudnnTensorDescriptor_t xd, const cudnnTensorDescriptor_t yd,
    const cudnnTensorDescriptor_t dyd, const cudnnTensorDescriptor_t dzd,
    const cudnnTensorDescriptor_t dxd, const cudnnTensorDescriptor_t bd,
    const cudnnActivationDescriptor_t act, size_t *size) {
    *size = BN_EX_WS;
    return bn_ex_ok(mode, ops, xd, act);
}

cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
    const cudnnActivationDescriptor_t act, const cudnnTensorDescriptor_t xd, size_t *size) {
    *size = BN_EX_RESERVE;
    return bn_ex_ok(mode, ops, xd, act);
}

cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t zd, const void *z, const cudnnTensorDescriptor_t yd, void *y,
    const cudnnTensorDescriptor_t bd, const void *scale, const void *bias, double f, void *rm,
    void *rv, double eps, void *sm, void *si, cudnnActivationDescriptor_t act, void *ws, size_t wss,
    void *reserve, size_t rss) {
    cudnnStatus_t st = bn_ex_ok(mode, ops, xd, act);
    if (st) return st;
    if (bn_ex_row_misaligned(xd) || bn_ex_vectors_misaligned(scale, bias, rm, rv, sm, si))
        bump(&fk.st.bn_ex_misaligned);
    if (!ws || wss < BN_EX_WS || !reserve || rss < BN_EX_RESERVE || z)
        return CUDNN_STATUS_BAD_PARAM;
    st = bn_fwd(h, xd, yd, x, y, scale, bias, f, rm, rv, eps, sm, si,
                ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION);
    if (!st) bump(&fk.st.bn_ex_calls);
    if (!st && ops == CUDNN_BATCHNORM_OPS_BN) bump(&fk.st.bn_ex_plain);
    return st;
}

cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const void *a1,
    const void *b1, const void *a2, const void *b2, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t yd, const void *y, const cudnnTensorDescriptor_t dyd,
    const void *dy, const cudnnTensorDescriptor_t dzd, void *dz, const cudnnTensorDescriptor_t dxd,
    void *dx, const cudnnTensorDescriptor_t bd, const void *scale, const void *bias, void *dscale,
    void *dbias, double eps, const void *sm, const void *si, cudnnActivationDescriptor_t act,
    void *ws, size_t wss, void *reserve, size_t rss) {
    cudnnStatus_t st = bn_ex_ok(mode, ops, xd, act);
    if (st) return st;
    if (bn_ex_row_misaligned(xd) || bn_ex_vectors_misaligned(scale, bias, dscale, dbias, sm, si))
        bump(&fk.st.bn_ex_misaligned);
    int relu = ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    if (!ws || wss < BN_EX_WS || !reserve || rss < BN_EX_RESERVE || dz || (relu && (!y || !bias)))
        return CUDNN_STATUS_BAD_PARAM;
    st = bn_bwd(h, xd, x, y, dy, dx, scale, dscale, dbias, eps, sm, si, relu);
    if (!st) bump(&fk.st.bn_ex_calls);
    if (!st && ops == CUDNN_BATCHNORM_OPS_BN) bump(&fk.st.bn_ex_plain);
    return st;
}

// ----------------------------------------------------------------------------
// dsrt's kernels: each launch (DSRT_K_LAUNCH in nn/kernels.h, from the .cu
// files compiled as C) queued like any call on its stream, its host run
// (the kernel's grid walked over its real bodies) given a copy of its
// arguments

typedef struct {
    fk_op op;
    void (*run)(const void *args);
    max_align_t args[]; /* the launch's arguments, by value */
} k_launch;

static void k_run(fk_op *o, cudaStream_t s) {
    k_launch *k = (k_launch *)o;
    k->run(k->args);
}

/* A launch of the kernel named `kernel`: counted, and watched where a
 * device would punish it. The optimizer's kernel reads its segment table
 * on s: the copy that wrote it must be ordered before it, on s itself. */
static void watch_launch(cudaStream_t s, const char *kernel, const void *args) {
    int optim = !strcmp(kernel, "optim_update_kernel");
    cudaStream_t wr = optim ? last_writer(((const optim_update_args *)args)->seg) : s;
    lock();
    int k = 0;
    while (k < fk.n_kernels && strcmp(fk.kernels[k], kernel)) k++;
    if (k == fk.n_kernels && k < FK_KERNELS) fk.kernels[fk.n_kernels++] = kernel;
    if (k < FK_KERNELS) fk.launches[k]++;
    if (optim) {
        fk.st.optim_launches++;
        if (wr != s) fk.st.seg_table_races++;
    }
    unlock();
}

cudaError_t dsrt_k_launch(cudaStream_t s, const char *kernel, void (*run)(const void *args),
                          const void *args, size_t size) {
    if (!stream_ok(s)) return cudaErrorInvalidResourceHandle;
    watch_launch(s, kernel, args);
    size_t total = offsetof(k_launch, args) + size;
    k_launch *k = malloc(total);
    if (!k) return cudaErrorMemoryAllocation;
    k->op.run = k_run;
    k->run = run;
    memcpy(k->args, args, size);
    submit(s, &k->op, total);
    free(k);
    return cudaSuccess;
}

long fakegpu_launches(const char *kernel) {
    long n = 0;
    lock();
    for (int k = 0; k < fk.n_kernels; k++)
        if (!strcmp(fk.kernels[k], kernel)) n = fk.launches[k];
    unlock();
    return n;
}

// ----------------------------------------------------------------------------
// NCCL: cliques of in-process members, one thread a member

#ifdef DSRT_HAVE_NCCL

#define MAGIC_COMM 0x434f4d4du
#define CLIQUES    16

/* The members that share a unique id. A collective: every member posts its
 * buffer, the last to arrive sums them in member order into each. */
typedef struct {
    char id[NCCL_UNIQUE_ID_BYTES];
    int used;
    int n, members; /* ranks, and members created so far */
    pthread_cond_t cv;
    uint64_t gen;
    int arrived;
    void *buf[8];
    size_t count;
    ncclDataType_t type;
    long close_group[3]; /* the group of the last finalize, destroy, abort */
    int close_seen[3];
} clique;

struct ncclComm {
    unsigned magic;
    clique *cl;
    int rank;
    int blocking;
};

static clique cliques[CLIQUES];
static long next_id, group_serial;
static _Thread_local int group_depth;
static _Thread_local long group_now;

static clique *clique_for(const ncclUniqueId *id, int n) {
    lock();
    clique *found = NULL;
    for (int k = 0; k < CLIQUES && !found; k++)
        if (cliques[k].used && !memcmp(cliques[k].id, id->internal, NCCL_UNIQUE_ID_BYTES))
            found = &cliques[k];
    for (int k = 0; k < CLIQUES && !found; k++)
        if (!cliques[k].used) {
            found = &cliques[k];
            memset(found, 0, sizeof *found);
            memcpy(found->id, id->internal, NCCL_UNIQUE_ID_BYTES);
            found->used = 1;
            found->n = n;
            pthread_cond_init(&found->cv, NULL);
        }
    unlock();
    return found;
}

const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "fake NCCL error";
}
const char *ncclGetLastError(ncclComm_t comm) {
    return "";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    lock();
    long k = ++next_id;
    unlock();
    snprintf(id->internal, sizeof id->internal, "fake-%ld-%ld", (long)getpid(), k);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    if (nranks < 1 || nranks > 8 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    clique *cl = clique_for(&id, nranks);
    if (!cl || cl->n != nranks) return ncclInvalidUsage;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->magic = MAGIC_COMM;
    c->cl = cl;
    c->rank = rank;
    c->blocking = !config || config->blocking != 0;
    lock();
    cl->members++;
    fk.live_comms++;
    unlock();
    *comm = c;
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devs) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    for (int i = 0; i < n; i++) {
        ncclResult_t r = ncclCommInitRank(&comms[i], n, id, i);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
    if (group_depth++ == 0) {
        lock();
        group_now = ++group_serial;
        unlock();
    }
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth == 0) {
        lock();
        fk.st.groups++;
        unlock();
    }
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *st) {
    if (!comm || comm->magic != MAGIC_COMM) return ncclInvalidArgument;
    *st = ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *n) {
    *n = comm->cl->n;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *r) {
    *r = comm->rank;
    return ncclSuccess;
}

static size_t type_size(ncclDataType_t t) {
    return t == ncclFloat64 ? 8 : 4;
}

/* The sum over the clique, in member order, into every member's buffer. */
static void sum_members(clique *cl) {
    size_t n = cl->count;
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        float f = 0;
        for (int m = 0; m < cl->n; m++) {
            if (cl->type == ncclFloat64)
                s += ((const double *)cl->buf[m])[i];
            else
                f += ((const float *)cl->buf[m])[i];
        }
        for (int m = 0; m < cl->n; m++) {
            if (cl->type == ncclFloat64)
                ((double *)cl->buf[m])[i] = s;
            else
                ((float *)cl->buf[m])[i] = f;
        }
    }
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (!comm || comm->magic != MAGIC_COMM || op != ncclSum ||
        (type != ncclFloat32 && type != ncclFloat64) || group_depth)
        return ncclInvalidUsage;
    if (stream && stream->cap) {
        /* NCCL stays outside dsrt's recorded steps. */
        bump(&fk.st.capture_violations);
        return ncclInvalidUsage;
    }
    if (send != recv) memcpy(recv, send, count * type_size(type));
    clique *cl = comm->cl;
    int ok = 1;
    lock();
    if (fk.hang) {
        /* A peer that never comes: the work behind this stays undone. */
        if (stream) stream->hung = 1;
        fk.st.collectives++;
        unlock();
        return ncclSuccess;
    }
    uint64_t gen = cl->gen;
    cl->buf[comm->rank] = recv;
    cl->count = count;
    cl->type = type;
    if (++cl->arrived == cl->n) {
        sum_members(cl);
        cl->arrived = 0;
        cl->gen++;
        fk.st.collectives++;
        pthread_cond_broadcast(&cl->cv);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 120;
    while (cl->gen == gen && ok) ok = pthread_cond_timedwait(&cl->cv, &fk.mu, &until) == 0;
    unlock();
    return ok ? ncclSuccess : ncclSystemError;
}

/* A finalize, destroy or abort of comm (kind 0, 1, 2): counted with its
 * group. The members of a clique closed by one thread must share one
 * group for each kind of call. */
static void count_close(ncclComm_t comm, int kind, long *counter) {
    lock();
    (*counter)++;
    long g = group_depth ? group_now : -1;
    if (g < 0) fk.st.ungrouped_closes++;
    if (g >= 0 && g != fk.last_close_group) fk.st.close_groups++;
    fk.last_close_group = g;
    clique *cl = comm->cl;
    if (cl->n > 1 && (g < 0 || (cl->close_seen[kind] && cl->close_group[kind] != g)))
        fk.st.split_closes++;
    cl->close_group[kind] = g;
    cl->close_seen[kind] = 1;
    unlock();
}

static void free_comm(ncclComm_t comm) {
    lock();
    fk.live_comms--;
    if (--comm->cl->members == 0) {
        pthread_cond_destroy(&comm->cl->cv);
        comm->cl->used = 0;
    }
    unlock();
    comm->magic = 0;
    free(comm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm || comm->magic != MAGIC_COMM) return ncclInvalidArgument;
    count_close(comm, 0, &fk.st.finalizes);
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm || comm->magic != MAGIC_COMM) return ncclInvalidArgument;
    count_close(comm, 1, &fk.st.destroys);
    free_comm(comm);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm || comm->magic != MAGIC_COMM) return ncclInvalidArgument;
    count_close(comm, 2, &fk.st.aborts);
    free_comm(comm);
    release_hung();
    return ncclSuccess;
}

#endif
