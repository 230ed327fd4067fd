/*
 * A CPU stand-in for the CUDA runtime, cuDNN, cuBLAS and NCCL calls of the
 * GPU backend (nn/backend_cuda.c) and the NCCL communicator
 * (runtime/comm_nccl.c), and for dsrt's kernels (nn/kernels.h), so that the
 * tests can run the library's own host code (plans, tensor aliasing,
 * padding copies, staging slots, the optimizer hand-off, the read-backs,
 * gradient buckets, multi-GPU groups and their shutdown) against the CPU
 * backend on a machine without a GPU. Built only with
 * -DDSRT_FAKE_GPU_TEST=ON (the test_fakegpu_* programs).
 *
 * It proves the plumbing, not cuDNN: each cuDNN and cuBLAS call computes
 * what its documentation says (naive loops, sums in double), memory is host
 * memory, streams run their work at once, and every search offers one
 * deterministic algorithm. dsrt's own kernels run their real bodies
 * (nn/kernels_body.h) through tests/kernels_host.c. NCCL's all-reduce sums
 * over the members of an in-process clique, one thread a member.
 *
 * It also watches what a device would punish and the tests assert on it
 * (tests/fakegpu.h): cudaMalloc returns 256-byte aligned memory as CUDA
 * does, and the stand-in counts allocations made after the first
 * collective while a communicator lives, an optimizer kernel reading a
 * segment table last written on another stream, convolutions run on other
 * pointers than their algorithm search saw, NCCL finalize, destroy and
 * abort calls of one clique not grouped together, host waits, and waits on
 * work that could never finish (fakegpu_hang_collectives).
 *
 * bfloat16 tensors are rounded as the device rounds them, and with
 * DSRT_FAKEGPU_TF32=1 the inputs of convolutions and matrix products that
 * allow TensorFloat-32 are rounded to its 10-bit mantissa, which shows how
 * far reduced-precision gradients may move from the CPU's.
 */
#include "nn/internal.h"
#include "nn/arith.h"
#include "nn/kernels.h"
#include "fakegpu.h"
#include "kernels_host.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#ifdef DSRT_HAVE_NCCL
#include <nccl.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT  0x4556454eu

struct CUstream_st {
    unsigned magic;
    int hung; /* behind a collective that never finishes */
    struct CUstream_st *next;
};
struct CUevent_st {
    unsigned magic;
    double t;
    int rec;
    int never; /* recorded behind a hung collective */
    struct CUevent_st *next;
};
struct cudnnContext {
    int x;
};
struct cublasContext {
    int tf32;
};
struct cudnnTensorStruct {
    cudnnDataType_t dt;
    int n, c, h, w;
};
struct cudnnFilterStruct {
    cudnnDataType_t dt;
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
struct cudnnPoolingStruct {
    cudnnPoolingMode_t mode;
    int wh, ww, ph, pw, sh, sw;
};
struct cudnnLRNStruct {
    unsigned n;
    double a, b, k;
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
    alloc_rec *allocs;
    struct CUstream_st *streams;
    struct CUevent_st *events;
    int hang;
    int live_comms;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .devices = 1};

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
    unlock();
}

void fakegpu_set_devices(int n) {
    fk.devices = n;
}

void fakegpu_hang_collectives(int on) {
    fk.hang = on;
}

static float tf32(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &u, 4);
    return v;
}

/* An allocation or a free: counted, and counted again when a communicator
 * lives and has run a collective (a device would risk a hang there). */
static void count_alloc(long *counter) {
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
    default:
        return "fake error";
    }
}
cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
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
    *f = 1 << 28;
    *t = 1 << 30;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    memcpy(d, s, n);
    record_copy(d, n, NULL);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
    if (!stream_ok(st)) return cudaErrorInvalidResourceHandle;
    memcpy(d, s, n);
    record_copy(d, n, st);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    memset(d, v, n);
    record_copy(d, n, st);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
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
    lock();
    fk.st.host_waits++;
    int dead = s && s->hung;
    if (dead) fk.st.deadlocks++;
    unlock();
    return dead ? cudaErrorLaunchTimeout : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
    if (!stream_ok(s) || !event_ok(e)) return cudaErrorInvalidResourceHandle;
    lock();
    fk.clk += 0.001;
    if (e->never && s) s->hung = 1;
    unlock();
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
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!event_ok(e) || !stream_ok(s)) return cudaErrorInvalidResourceHandle;
    lock();
    fk.clk += 0.5;
    e->t = fk.clk;
    e->rec = 1;
    e->never = s && s->hung;
    unlock();
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
    lock();
    fk.st.event_queries++;
    int never = e->never;
    unlock();
    return never ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!event_ok(e)) return cudaErrorInvalidResourceHandle;
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

/* ---- cuBLAS */
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = calloc(1, sizeof **h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    h->tf32 = m == CUBLAS_TF32_TENSOR_OP_MATH;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return "fake blas error";
}

static float ld(const void *p, size_t i, int bf) {
    float v = bf ? dsrt_f32_from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
    return round_tf32 && !bf ? tf32(v) : v;
}
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const void *A, int abf, int lda, const void *B, int bbf, int ldb, float beta,
                 float *C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? ld(A, (size_t)p * lda + i, abf)
                                            : ld(A, (size_t)i * lda + p, abf);
                float b = tb == CUBLAS_OP_N ? ld(B, (size_t)j * ldb + p, bbf)
                                            : ld(B, (size_t)p * ldb + j, bbf);
                s += (double)a * b;
            }
            float *c = &C[(size_t)j * ldc + i];
            *c = alpha * (float)s + (beta != 0 ? beta * *c : 0);
        }
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float *alpha, const float *A, int lda,
                              const float *B, int ldb, const float *beta, float *C, int ldc) {
    round_tf32 = h->tf32;
    gemm(ta, tb, m, n, k, *alpha, A, 0, lda, B, 0, ldb, *beta, C, ldc);
    round_tf32 = 0;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t ctp,
                            cublasGemmAlgo_t al) {
    if (ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    gemm(ta, tb, m, n, k, *(const float *)alpha, A, at == CUDA_R_16BF, lda, B, bt == CUDA_R_16BF,
         ldb, *(const float *)beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuDNN descriptors */
const char *cudnnGetErrorString(cudnnStatus_t s) {
    return "fake cudnn error";
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
    if (f != CUDNN_TENSOR_NCHW || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
    d->dt = t;
    d->n = n;
    d->c = c;
    d->h = h;
    d->w = w;
    return 0;
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
    d->dt = t;
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
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return 0;
}
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t m,
                                          cudnnNanPropagation_t nan, int wh, int ww, int ph, int pw,
                                          int sh, int sw) {
    d->mode = m;
    d->wh = wh;
    d->ww = ww;
    d->ph = ph;
    d->pw = pw;
    d->sh = sh;
    d->sw = sw;
    return 0;
}
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t p,
                                                const cudnnTensorDescriptor_t x, int *n, int *c,
                                                int *h, int *w) {
    *n = x->n;
    *c = x->c;
    *h = (x->h + 2 * p->ph - p->wh) / p->sh + 1;
    *w = (x->w + 2 * p->pw - p->ww) / p->sw + 1;
    return 0;
}
cudnnStatus_t cudnnCreateLRNDescriptor(cudnnLRNDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return 0;
}
cudnnStatus_t cudnnDestroyLRNDescriptor(cudnnLRNDescriptor_t d) {
    free(d);
    return 0;
}
cudnnStatus_t cudnnSetLRNDescriptor(cudnnLRNDescriptor_t d, unsigned n, double a, double b,
                                    double k) {
    d->n = n;
    d->a = a;
    d->b = b;
    d->k = k;
    return 0;
}

/* ---- algorithm search: one algorithm, no workspace */
/* The one algorithm every search offers: deterministic, no workspace, the
 * descriptor's math type. */
#define ONE_ALGO(r, cd, got)                                                                       \
    do {                                                                                           \
        memset(&(r)[0], 0, sizeof(r)[0]);                                                          \
        (r)[0].algo = 1;                                                                           \
        (r)[0].determinism = CUDNN_DETERMINISTIC;                                                  \
        (r)[0].mathType = (cd)->m;                                                                 \
        *(got) = 1;                                                                                \
        return CUDNN_STATUS_SUCCESS;                                                               \
    } while (0)
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
    const cudnnTensorDescriptor_t yd, void *y, const int req, int *got,
    cudnnConvolutionFwdAlgoPerf_t *r, void *ws, size_t wss) {
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

/* ---- tensors */
static size_t tcount(const struct cudnnTensorStruct *d) {
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
static size_t at4(const struct cudnnTensorStruct *d, int n, int c, int h, int w) {
    return (((size_t)n * d->c + c) * d->h + h) * d->w + w;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      const cudnnTensorDescriptor_t xd, const void *x,
                                      const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cd,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t wss,
                                      const void *beta, const cudnnTensorDescriptor_t yd, void *y) {
    used(cd, 0, x, w, y);
    round_tf32 = cd->m != CUDNN_FMA_MATH && getenv("DSRT_FAKEGPU_TF32");
    if (wss < 64 || !ws) return CUDNN_STATUS_BAD_PARAM;
    int G = cd->groups, Kg = wd->k / G, Cg = wd->c;
    for (int n = 0; n < yd->n; n++)
        for (int k = 0; k < yd->c; k++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    int g = k / Kg;
                    double s = 0;
                    for (int c = 0; c < Cg; c++)
                        for (int r = 0; r < wd->h; r++)
                            for (int q = 0; q < wd->w; q++) {
                                int ih = oh * cd->sh - cd->ph + r * cd->dh,
                                    iw = ow * cd->sw - cd->pw + q * cd->dw;
                                if (ih < 0 || iw < 0 || ih >= xd->h || iw >= xd->w) continue;
                                s +=
                                    (double)getv(xd->dt, x, at4(xd, n, g * Cg + c, ih, iw)) *
                                    getv(wd->dt, w, (((size_t)k * Cg + c) * wd->h + r) * wd->w + q);
                            }
                    round_tf32 = 0;
                    setv(yd->dt, y, at4(yd, n, k, oh, ow), (float)s, *(const float *)alpha,
                         *(const float *)beta);
                    round_tf32 = cd->m != CUDNN_FMA_MATH && getenv("DSRT_FAKEGPU_TF32");
                }
    round_tf32 = 0;
    return 0;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           const cudnnFilterDescriptor_t wd, const void *w,
                                           const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *ws, size_t wss,
                                           const void *beta, const cudnnTensorDescriptor_t dxd,
                                           void *dx) {
    used(cd, 1, w, dy, dx);
    round_tf32 = cd->m != CUDNN_FMA_MATH && getenv("DSRT_FAKEGPU_TF32");
    if (wss < 128 || !ws) return CUDNN_STATUS_BAD_PARAM;
    double *acc = calloc(tcount(dxd), sizeof *acc);
    int G = cd->groups, Kg = wd->k / G, Cg = wd->c;
    for (int n = 0; n < dyd->n; n++)
        for (int k = 0; k < dyd->c; k++)
            for (int oh = 0; oh < dyd->h; oh++)
                for (int ow = 0; ow < dyd->w; ow++) {
                    int g = k / Kg;
                    float d = getv(dyd->dt, dy, at4(dyd, n, k, oh, ow));
                    for (int c = 0; c < Cg; c++)
                        for (int r = 0; r < wd->h; r++)
                            for (int q = 0; q < wd->w; q++) {
                                int ih = oh * cd->sh - cd->ph + r * cd->dh,
                                    iw = ow * cd->sw - cd->pw + q * cd->dw;
                                if (ih < 0 || iw < 0 || ih >= dxd->h || iw >= dxd->w) continue;
                                acc[at4(dxd, n, g * Cg + c, ih, iw)] +=
                                    (double)d *
                                    getv(wd->dt, w, (((size_t)k * Cg + c) * wd->h + r) * wd->w + q);
                            }
                }
    round_tf32 = 0;
    for (size_t i = 0; i < tcount(dxd); i++)
        setv(dxd->dt, dx, i, (float)acc[i], *(const float *)alpha, *(const float *)beta);
    free(acc);
    return 0;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             const cudnnTensorDescriptor_t xd, const void *x,
                                             const cudnnTensorDescriptor_t dyd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cd,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws,
                                             size_t wss, const void *beta,
                                             const cudnnFilterDescriptor_t wd, void *dw) {
    used(cd, 2, x, dy, dw);
    round_tf32 = cd->m != CUDNN_FMA_MATH && getenv("DSRT_FAKEGPU_TF32");
    if (wss < 32 || !ws) return CUDNN_STATUS_BAD_PARAM;
    size_t wn = (size_t)wd->k * wd->c * wd->h * wd->w;
    double *acc = calloc(wn, sizeof *acc);
    int G = cd->groups, Kg = wd->k / G, Cg = wd->c;
    for (int n = 0; n < dyd->n; n++)
        for (int k = 0; k < dyd->c; k++)
            for (int oh = 0; oh < dyd->h; oh++)
                for (int ow = 0; ow < dyd->w; ow++) {
                    int g = k / Kg;
                    float d = getv(dyd->dt, dy, at4(dyd, n, k, oh, ow));
                    for (int c = 0; c < Cg; c++)
                        for (int r = 0; r < wd->h; r++)
                            for (int q = 0; q < wd->w; q++) {
                                int ih = oh * cd->sh - cd->ph + r * cd->dh,
                                    iw = ow * cd->sw - cd->pw + q * cd->dw;
                                if (ih < 0 || iw < 0 || ih >= xd->h || iw >= xd->w) continue;
                                acc[(((size_t)k * Cg + c) * wd->h + r) * wd->w + q] +=
                                    (double)d * getv(xd->dt, x, at4(xd, n, g * Cg + c, ih, iw));
                            }
                }
    round_tf32 = 0;
    for (size_t i = 0; i < wn; i++)
        setv(wd->dt, dw, i, (float)acc[i], *(const float *)alpha, *(const float *)beta);
    free(acc);
    return 0;
}
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void *alpha,
                                           const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const void *beta, const cudnnTensorDescriptor_t dbd,
                                           void *db) {
    for (int k = 0; k < dyd->c; k++) {
        double s = 0;
        for (int n = 0; n < dyd->n; n++)
            for (int i = 0; i < dyd->h * dyd->w; i++)
                s += getv(dyd->dt, dy, at4(dyd, n, k, 0, 0) + i);
        setv(dbd->dt, db, k, (float)s, *(const float *)alpha, *(const float *)beta);
    }
    return 0;
}
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t ad,
                             const void *A, const void *beta, const cudnnTensorDescriptor_t cdd,
                             void *C) {
    for (int n = 0; n < cdd->n; n++)
        for (int c = 0; c < cdd->c; c++)
            for (int y = 0; y < cdd->h; y++)
                for (int x = 0; x < cdd->w; x++) {
                    size_t ai = at4(ad, ad->n == 1 ? 0 : n, ad->c == 1 ? 0 : c, ad->h == 1 ? 0 : y,
                                    ad->w == 1 ? 0 : x);
                    setv(cdd->dt, C, at4(cdd, n, c, y, x), getv(ad->dt, A, ai),
                         *(const float *)alpha, *(const float *)beta);
                }
    return 0;
}
cudnnStatus_t cudnnScaleTensor(cudnnHandle_t h, const cudnnTensorDescriptor_t yd, void *y,
                               const void *alpha) {
    for (size_t i = 0; i < tcount(yd); i++) ((float *)y)[i] *= *(const float *)alpha;
    return 0;
}

/* ---- batchnorm */
cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xd, const void *x, const cudnnTensorDescriptor_t yd, void *y,
    const cudnnTensorDescriptor_t bd, const void *scale, const void *bias, double f, void *rm,
    void *rv, double eps, void *sm, void *si) {
    if ((rm == NULL) != (rv == NULL)) return CUDNN_STATUS_BAD_PARAM;
    const float *X = x, *S = scale, *B = bias;
    float *Y = y;
    size_t M = (size_t)xd->n * xd->h * xd->w, hw = (size_t)xd->h * xd->w;
    for (int c = 0; c < xd->c; c++) {
        double s = 0, q = 0;
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) s += X[at4(xd, n, c, 0, 0) + i];
        double mean = s / M;
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                double d = X[at4(xd, n, c, 0, 0) + i] - mean;
                q += d * d;
            }
        double var = q / M, inv = 1.0 / sqrt(var + eps);
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = at4(xd, n, c, 0, 0) + i;
                Y[k] = (float)(S[c] * (X[k] - mean) * inv + B[c]);
            }
        if (rm) {
            ((float *)rm)[c] = (float)((1 - f) * ((float *)rm)[c] + f * mean);
            ((float *)rv)[c] = (float)((1 - f) * ((float *)rv)[c] + f * var * M / (M - 1));
        }
        if (sm) {
            ((float *)sm)[c] = (float)mean;
            ((float *)si)[c] = (float)inv;
        }
    }
    return 0;
}
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xd, const void *x, const cudnnTensorDescriptor_t yd, void *y,
    const cudnnTensorDescriptor_t bd, const void *scale, const void *bias, const void *em,
    const void *ev, double eps) {
    const float *X = x, *S = scale, *B = bias, *M = em, *V = ev;
    float *Y = y;
    size_t hw = (size_t)xd->h * xd->w;
    for (int n = 0; n < xd->n; n++)
        for (int c = 0; c < xd->c; c++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = at4(xd, n, c, 0, 0) + i;
                Y[k] = (float)(S[c] * (X[k] - M[c]) / sqrt(V[c] + eps) + B[c]);
            }
    return 0;
}
cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t h, cudnnBatchNormMode_t mode,
                                              const void *a1, const void *b1, const void *a2,
                                              const void *b2, const cudnnTensorDescriptor_t xd,
                                              const void *x, const cudnnTensorDescriptor_t dyd,
                                              const void *dy, const cudnnTensorDescriptor_t dxd,
                                              void *dx, const cudnnTensorDescriptor_t bd,
                                              const void *scale, void *dscale, void *dbias,
                                              double eps, const void *sm, const void *si) {
    const float *X = x, *DY = dy, *S = scale, *MEAN = sm, *INV = si;
    float *DX = dx;
    if (!sm || !si || x == dx) return CUDNN_STATUS_BAD_PARAM;
    size_t M = (size_t)xd->n * xd->h * xd->w, hw = (size_t)xd->h * xd->w;
    for (int c = 0; c < xd->c; c++) {
        double db = 0, ds = 0;
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = at4(xd, n, c, 0, 0) + i;
                db += DY[k];
                ds += DY[k] * (X[k] - MEAN[c]) * INV[c];
            }
        ((float *)dscale)[c] = (float)ds;
        ((float *)dbias)[c] = (float)db;
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = at4(xd, n, c, 0, 0) + i;
                double xh = (X[k] - MEAN[c]) * INV[c];
                DX[k] = (float)(S[c] * INV[c] / M * (M * DY[k] - db - xh * ds));
            }
    }
    return 0;
}

/* ---- pooling */
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t h, const cudnnPoolingDescriptor_t p,
                                  const void *alpha, const cudnnTensorDescriptor_t xd,
                                  const void *x, const void *beta, const cudnnTensorDescriptor_t yd,
                                  void *y) {
    const float *X = x;
    for (int n = 0; n < yd->n; n++)
        for (int c = 0; c < yd->c; c++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    double s = 0;
                    float mx = -INFINITY;
                    for (int r = 0; r < p->wh; r++)
                        for (int q = 0; q < p->ww; q++) {
                            int ih = oh * p->sh - p->ph + r, iw = ow * p->sw - p->pw + q;
                            if (ih < 0 || iw < 0 || ih >= xd->h || iw >= xd->w) continue;
                            float v = X[at4(xd, n, c, ih, iw)];
                            s += v;
                            if (v > mx) mx = v;
                        }
                    float v =
                        p->mode == CUDNN_POOLING_MAX || p->mode == CUDNN_POOLING_MAX_DETERMINISTIC
                            ? mx
                            : (float)(s / (p->wh * p->ww));
                    ((float *)y)[at4(yd, n, c, oh, ow)] = v;
                }
    return 0;
}
cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t h, const cudnnPoolingDescriptor_t p,
                                   const void *alpha, const cudnnTensorDescriptor_t yd,
                                   const void *y, const cudnnTensorDescriptor_t dyd, const void *dy,
                                   const cudnnTensorDescriptor_t xd, const void *x,
                                   const void *beta, const cudnnTensorDescriptor_t dxd, void *dx) {
    const float *X = x, *DY = dy;
    float *DX = dx;
    if (x == dx) return CUDNN_STATUS_BAD_PARAM;
    memset(DX, 0, tcount(dxd) * sizeof(float));
    int mx = p->mode == CUDNN_POOLING_MAX || p->mode == CUDNN_POOLING_MAX_DETERMINISTIC;
    for (int n = 0; n < yd->n; n++)
        for (int c = 0; c < yd->c; c++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    float d = DY[at4(yd, n, c, oh, ow)];
                    int bi = -1;
                    float bv = -INFINITY;
                    for (int r = 0; r < p->wh; r++)
                        for (int q = 0; q < p->ww; q++) {
                            int ih = oh * p->sh - p->ph + r, iw = ow * p->sw - p->pw + q;
                            if (ih < 0 || iw < 0 || ih >= xd->h || iw >= xd->w) continue;
                            size_t k = at4(xd, n, c, ih, iw);
                            if (mx) {
                                if (X[k] > bv) bv = X[k], bi = (int)k;
                            } else
                                DX[k] += d / (p->wh * p->ww);
                        }
                    if (mx && bi >= 0) DX[bi] += d;
                }
    return 0;
}

/* ---- LRN */
static double lrn_sum(const struct cudnnLRNStruct *L, const struct cudnnTensorStruct *d,
                      const float *X, int n, int c, int y, int x) {
    int lb = (int)(L->n - 1) / 2, la = (int)L->n - lb - 1;
    double s = 0;
    for (int j = c - lb; j <= c + la; j++)
        if (j >= 0 && j < d->c) {
            double v = X[at4(d, n, j, y, x)];
            s += v * v;
        }
    return L->k + L->a / L->n * s;
}
cudnnStatus_t cudnnLRNCrossChannelForward(cudnnHandle_t h, cudnnLRNDescriptor_t L, cudnnLRNMode_t m,
                                          const void *alpha, const cudnnTensorDescriptor_t xd,
                                          const void *x, const void *beta,
                                          const cudnnTensorDescriptor_t yd, void *y) {
    const float *X = x;
    for (int n = 0; n < xd->n; n++)
        for (int c = 0; c < xd->c; c++)
            for (int a = 0; a < xd->h; a++)
                for (int b = 0; b < xd->w; b++) {
                    size_t k = at4(xd, n, c, a, b);
                    ((float *)y)[k] = (float)(X[k] * pow(lrn_sum(L, xd, X, n, c, a, b), -L->b));
                }
    return 0;
}
cudnnStatus_t cudnnLRNCrossChannelBackward(cudnnHandle_t h, cudnnLRNDescriptor_t L,
                                           cudnnLRNMode_t m, const void *alpha,
                                           const cudnnTensorDescriptor_t yd, const void *y,
                                           const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnTensorDescriptor_t xd, const void *x,
                                           const void *beta, const cudnnTensorDescriptor_t dxd,
                                           void *dx) {
    const float *X = x, *Y = y, *DY = dy;
    int lb = (int)(L->n - 1) / 2, la = (int)L->n - lb - 1;
    for (int n = 0; n < xd->n; n++)
        for (int c = 0; c < xd->c; c++)
            for (int a = 0; a < xd->h; a++)
                for (int b = 0; b < xd->w; b++) {
                    size_t k = at4(xd, n, c, a, b);
                    double s = lrn_sum(L, xd, X, n, c, a, b), acc = 0;
                    for (int j = c - la; j <= c + lb; j++)
                        if (j >= 0 && j < xd->c) {
                            size_t kj = at4(xd, n, j, a, b);
                            acc += DY[kj] * Y[kj] / lrn_sum(L, xd, X, n, j, a, b);
                        }
                    ((float *)dx)[k] =
                        (float)(DY[k] * pow(s, -L->b) - 2.0 * L->b * L->a / L->n * X[k] * acc);
                }
    return 0;
}

// ----------------------------------------------------------------------------
// dsrt's kernels: their own bodies, on the host (tests/kernels_host.c)

static cudaError_t kr(int rc) {
    return rc ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                            const dsrt_k_desc *yd, void *y, cudaStream_t s) {
    return kr(dsrt_kh_input_u8(x, pix, norm, stats, yd, y));
}
cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                             void *y, cudaStream_t s) {
    return kr(dsrt_kh_input_f32(x, norm, stats, yd, y));
}
cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                       int top, int left, float fill, int accumulate, cudaStream_t s) {
    return kr(dsrt_kh_pad(xd, x, yd, y, top, left, fill, accumulate));
}
cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t s) {
    return kr(dsrt_kh_relu_fwd(t, x, y, n, leak));
}
cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t s) {
    return kr(dsrt_kh_relu_bwd(t, y, dy, dx, n, leak));
}
cudaError_t dsrt_k_bias_act(const float *x, const float *b, float *y, int n, int out, int relu,
                            float leak, cudaStream_t s) {
    return kr(dsrt_kh_bias_act(x, b, y, n, out, relu, leak));
}
cudaError_t dsrt_k_bias_grad(const float *dy, float *db, int n, int out, cudaStream_t s) {
    return kr(dsrt_kh_bias_grad(dy, db, n, out));
}
cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed, uint64_t it,
                           int layer, float p, cudaStream_t s) {
    return kr(dsrt_kh_dropout(d, x, y, seed, it, layer, p));
}
size_t dsrt_k_softmax_xent_work(int n) {
    return dsrt_kb_softmax_work(n);
}
cudaError_t dsrt_k_softmax_xent_fwd(const float *z, const int32_t *labels, int n, int k,
                                    float *probs, double *loss, int32_t *correct, void *work,
                                    cudaStream_t s) {
    return kr(dsrt_kh_softmax_xent_fwd(z, labels, n, k, probs, loss, correct, work));
}
cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, int n, int k,
                                    float scale, float *dz, cudaStream_t s) {
    return kr(dsrt_kh_softmax_xent_bwd(probs, labels, n, k, scale, dz));
}
cudaError_t dsrt_k_bn_sums(const float *x, int n, int c, int hw, double *sums, cudaStream_t s) {
    return kr(dsrt_kh_bn_sums(x, n, c, hw, sums));
}
cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                            float *var, float *inv, float *run_mean, float *run_var,
                            cudaStream_t s) {
    return kr(dsrt_kh_bn_stats(sums, c, eps, momentum, mean, var, inv, run_mean, run_var));
}
cudaError_t dsrt_k_bn_bwd_sums(const float *x, const float *dy, const float *mean, const float *inv,
                               int n, int c, int hw, double *sums, float *dscale, float *dshift,
                               cudaStream_t s) {
    return kr(dsrt_kh_bn_bwd_sums(x, dy, mean, inv, n, c, hw, sums, dscale, dshift));
}
cudaError_t dsrt_k_bn_bwd_dx(const float *x, const float *dy, const float *mean, const float *inv,
                             const float *scale, const double *sums, const double *count, int n,
                             int c, int hw, float *dx, cudaStream_t s) {
    return kr(dsrt_kh_bn_bwd_dx(x, dy, mean, inv, scale, sums, count, n, c, hw, dx));
}
size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks) {
    return dsrt_kb_optim_layout(seg, n_seg, blocks);
}
void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o, double lr,
                              int64_t t) {
    dsrt_kb_optim_step_params(st, o, lr, t);
}
cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st, float *w, float *g,
                                float *buf0, float *buf1, dsrt_bf16 *w16, cudaStream_t s) {
    /* The kernel reads the segment table on s: the copy that wrote it must
     * be ordered before it, on s itself. */
    if (o && o->n_seg) {
        cudaStream_t w = last_writer(o->seg);
        lock();
        fk.st.optim_launches++;
        if (w != s) fk.st.seg_table_races++;
        unlock();
    }
    return kr(dsrt_kh_optim_update(o, st, w, g, buf0, buf1, w16));
}
cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t s) {
    return kr(dsrt_kh_fill(y, n, v));
}
cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a, cudaStream_t s) {
    return kr(dsrt_kh_scale(x, y, n, a));
}
cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n, cudaStream_t s) {
    return kr(dsrt_kh_f32_to_bf16(x, y, n));
}
cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n, cudaStream_t s) {
    return kr(dsrt_kh_bf16_to_f32(x, y, n));
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
