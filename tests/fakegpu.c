/*
 * A CPU stand-in for the CUDA runtime, cuDNN and cuBLAS calls of the GPU
 * backend (nn/backend_cuda.c) and for dsrt's kernels (nn/kernels.h), so that
 * test_gpu_backend can run the backend's own host code (plans, tensor
 * aliasing, padding copies, staging slots, the optimizer hand-off, the
 * read-backs) against the CPU backend on a machine without a GPU. Built only
 * with -DDSRT_FAKE_GPU_TEST=ON (test_fakegpu_backend); it proves the
 * plumbing, not cuDNN: each call computes what its documentation says
 * (naive loops, sums in double), memory is host memory, streams are
 * synchronous, and every search offers one deterministic algorithm.
 *
 * bfloat16 tensors are rounded as the device rounds them, and with
 * DSRT_FAKEGPU_TF32=1 the inputs of convolutions and matrix products that
 * allow TensorFloat-32 are rounded to its 10-bit mantissa, which shows how
 * far reduced-precision gradients may move from the CPU's.
 */
#include "nn/internal.h"
#include "nn/arith.h"
#include "nn/kernels.h"
#include "nnref.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct CUstream_st {
    int x;
};
struct CUevent_st {
    double t;
    int rec;
};
struct cudnnContext {
    int x;
};
struct cublasContext {
    int x;
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
};
struct cudnnPoolingStruct {
    cudnnPoolingMode_t mode;
    int wh, ww, ph, pw, sh, sw;
};
struct cudnnLRNStruct {
    unsigned n;
    double a, b, k;
};

static double clk;
static int blas_tf32;
static float tf32(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &u, 4);
    return v;
}
static long allocs;

/* ---- runtime */
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return cudaSuccess;
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
    return "fake error";
}
cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = calloc(1, n + 256);
    allocs++;
    if (*p) memset(*p, 0x7f, n); /* garbage-ish: NaN-free large floats */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    allocs--;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = calloc(1, n);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    *f = 1 << 28;
    *t = 1 << 30;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = calloc(1, sizeof **s);
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
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
    clk += 0.001;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = calloc(1, sizeof **e);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
    *e = calloc(1, sizeof **e);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    clk += 0.5;
    e->t = clk;
    e->rec = 1;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a->rec || !b->rec) return cudaErrorInvalidResourceHandle;
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
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
    blas_tf32 = m == CUBLAS_TF32_TENSOR_OP_MATH;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return "fake blas error";
}

static int round_tf32;
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
    round_tf32 = blas_tf32;
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

/* ---- dsrt kernels */
static float kget(dsrt_k_type t, const void *p, size_t i) {
    return ld(p, i, t == DSRT_K_BF16);
}
static void kset(dsrt_k_type t, void *p, size_t i, float v) {
    if (t == DSRT_K_BF16)
        ((uint16_t *)p)[i] = dsrt_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}
static size_t kat(const dsrt_k_desc *d, int n, int c, int h, int w) {
    return d->nhwc ? (((size_t)n * d->h + h) * d->w + w) * d->c + c
                   : (((size_t)n * d->c + c) * d->h + h) * d->w + w;
}
cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                            const dsrt_k_desc *yd, void *y, cudaStream_t s) {
    for (int n = 0; n < yd->n; n++)
        for (int c = 0; c < yd->c; c++) {
            float a, o;
            dsrt_input_affine(norm, stats, yd->c, c, &a, &o);
            for (int h = 0; h < yd->h; h++)
                for (int w = 0; w < yd->w; w++) {
                    float v = ((float)x[(((size_t)n * yd->h + h) * yd->w + w) * yd->c + c] -
                               pix->sub[c]) /
                              pix->div[c];
                    kset(yd->type, y, kat(yd, n, c, h, w), dsrt_input_apply(a, o, v));
                }
        }
    return cudaSuccess;
}
cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                             void *y, cudaStream_t s) {
    for (int n = 0; n < yd->n; n++)
        for (int c = 0; c < yd->c; c++) {
            float a, o;
            dsrt_input_affine(norm, stats, yd->c, c, &a, &o);
            for (int h = 0; h < yd->h; h++)
                for (int w = 0; w < yd->w; w++)
                    kset(yd->type, y, kat(yd, n, c, h, w),
                         dsrt_input_apply(a, o,
                                          x[(((size_t)n * yd->c + c) * yd->h + h) * yd->w + w]));
        }
    return cudaSuccess;
}
cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                       int top, int left, float fill, int accumulate, cudaStream_t s) {
    if (xd->n != yd->n || xd->c != yd->c) return cudaErrorInvalidValue;
    for (int n = 0; n < yd->n; n++)
        for (int c = 0; c < yd->c; c++)
            for (int h = 0; h < yd->h; h++)
                for (int w = 0; w < yd->w; w++) {
                    int sh = h - top, sw = w - left;
                    float v = sh >= 0 && sw >= 0 && sh < xd->h && sw < xd->w
                                  ? kget(xd->type, x, kat(xd, n, c, sh, sw))
                                  : fill;
                    size_t k = kat(yd, n, c, h, w);
                    kset(yd->type, y, k, accumulate ? kget(yd->type, y, k) + v : v);
                }
    return cudaSuccess;
}
cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t s) {
    for (size_t i = 0; i < n; i++) {
        float v = kget(t, x, i);
        kset(t, y, i, v > 0 ? v : v * leak);
    }
    return cudaSuccess;
}
cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) {
        float d = kget(t, dy, i);
        kset(t, dx, i, kget(t, y, i) > 0 ? d : d * leak);
    }
    return cudaSuccess;
}
cudaError_t dsrt_k_bias_act(const float *x, const float *b, float *y, int n, int out, int relu,
                            float leak, cudaStream_t s) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            float v = x[(size_t)i * out + o] + (b ? b[o] : 0.0f);
            if (relu && v < 0) v *= leak;
            y[(size_t)i * out + o] = v;
        }
    return cudaSuccess;
}
cudaError_t dsrt_k_bias_grad(const float *dy, float *db, int n, int out, cudaStream_t s) {
    for (int o = 0; o < out; o++) {
        double a = 0;
        for (int i = 0; i < n; i++) a += dy[(size_t)i * out + o];
        db[o] = (float)a;
    }
    return cudaSuccess;
}
cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed, uint64_t it,
                           int layer, float p, cudaStream_t s) {
    dsrt_rng r = dsrt_dropout_rng(seed, it, (uint64_t)layer);
    uint32_t th = dsrt_dropout_threshold(p);
    float sc = dsrt_dropout_scale(p);
    size_t j = 0;
    for (int n = 0; n < d->n; n++)
        for (int c = 0; c < d->c; c++)
            for (int h = 0; h < d->h; h++)
                for (int w = 0; w < d->w; w++, j++) {
                    size_t k = kat(d, n, c, h, w);
                    kset(d->type, y, k, kget(d->type, x, k) * dsrt_dropout_mask(&r, j, th, sc));
                }
    return cudaSuccess;
}
size_t dsrt_k_softmax_xent_work(int n) {
    return 16 * (size_t)n + 16;
}
cudaError_t dsrt_k_softmax_xent_fwd(const float *z, const int32_t *labels, int n, int k,
                                    float *probs, double *loss, int32_t *correct, void *work,
                                    cudaStream_t s) {
    int32_t *any = labels ? NULL : calloc((size_t)n, sizeof *any);
    double l;
    int ok;
    ref_softmax_xent(z, labels ? labels : any, n, k, probs, &l, &ok);
    free(any);
    if (loss) *loss = l;
    if (correct) *correct = ok;
    return cudaSuccess;
}
cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, int n, int k,
                                    float scale, float *dz, cudaStream_t s) {
    for (int b = 0; b < n; b++) {
        for (int j = 0; j < k; j++) dz[(size_t)b * k + j] = probs[(size_t)b * k + j] * scale;
        dz[(size_t)b * k + labels[b]] -= scale;
    }
    return cudaSuccess;
}
cudaError_t dsrt_k_bn_sums(const float *x, int n, int c, int hw, double *sums, cudaStream_t s) {
    ref_bn_sums(x, n, c, hw, sums);
    return cudaSuccess;
}
cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                            float *var, float *inv, float *run_mean, float *run_var,
                            cudaStream_t s) {
    ref_bn_stats(sums, c, eps, momentum, mean, var, inv, run_mean, run_var);
    return cudaSuccess;
}
cudaError_t dsrt_k_bn_bwd_sums(const float *x, const float *dy, const float *mean, const float *inv,
                               int n, int c, int hw, double *sums, float *dscale, float *dshift,
                               cudaStream_t s) {
    ref_bn_bwd_sums(x, dy, mean, inv, n, c, hw, sums, dscale, dshift);
    return cudaSuccess;
}
cudaError_t dsrt_k_bn_bwd_dx(const float *x, const float *dy, const float *mean, const float *inv,
                             const float *scale, const double *sums, const double *count, int n,
                             int c, int hw, float *dx, cudaStream_t s) {
    ref_bn_bwd_dx(x, dy, mean, inv, scale, sums, *count, n, c, hw, dx);
    return cudaSuccess;
}
size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks) {
    uint32_t b = 0;
    for (int k = 0; k < n_seg; k++) {
        seg[k].block0 = b;
        seg[k].blocks = (uint32_t)((seg[k].n + 1023) / 1024);
        b += seg[k].blocks;
    }
    *blocks = b;
    return (size_t)(b ? b : 1) * 8 + 8;
}
cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st, float *w, float *g,
                                float *buf0, float *buf1, dsrt_bf16 *w16, cudaStream_t s) {
    dsrt_segment *seg = calloc((size_t)o->n_seg + 1, sizeof *seg);
    size_t end = 0;
    for (int k = 0; k < o->n_seg; k++) {
        seg[k].off = o->seg[k].off;
        seg[k].n = o->seg[k].n;
        seg[k].lr = o->seg[k].lr;
        seg[k].l2 = o->seg[k].l2;
        if (seg[k].off + seg[k].n > end) end = seg[k].off + seg[k].n;
    }
    dsrt_optim_step t;
    memset(&t, 0, sizeof t);
    t.solver = st->solver;
    t.lr = st->lr;
    t.l2 = st->l2;
    t.momentum = st->momentum;
    t.b1 = st->decay;
    t.b2 = st->sq_decay;
    t.c1 = st->c1;
    t.c2 = st->c2;
    t.eps = st->eps;
    t.clip = st->clip;
    t.threshold = st->threshold;
    t.seg = seg;
    t.n_seg = o->n_seg;
    t.buf[0] = buf0;
    t.buf[1] = buf1;
    if (!o->work) return cudaErrorInvalidValue;
    dsrt__optim_host(w, g, &t);
    if (w16)
        for (size_t i = 0; i < end; i++) w16[i] = dsrt_bf16_from_f32(w[i]);
    free(seg);
    return cudaSuccess;
}
void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o, double lr,
                              int64_t t) {
    *st = (dsrt_k_step){(int)o->solver,
                        (int)o->clip,
                        o->grad_threshold,
                        lr,
                        o->l2,
                        (float)o->momentum,
                        (float)o->gradient_decay,
                        (float)o->sq_gradient_decay,
                        (float)(1.0 / (1.0 - pow(o->gradient_decay, (double)t))),
                        (float)(1.0 / (1.0 - pow(o->sq_gradient_decay, (double)t))),
                        (float)o->epsilon};
}
cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) y[i] = v;
    return cudaSuccess;
}
cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) y[i] = a * x[i];
    return cudaSuccess;
}
cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) y[i] = dsrt_bf16_from_f32(x[i]);
    return cudaSuccess;
}
cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) y[i] = dsrt_f32_from_bf16(x[i]);
    return cudaSuccess;
}
