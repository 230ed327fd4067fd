/*
 * The GPU libraries dsrt links, on a CUDA device: cuDNN 9's legacy C API
 * (a convolution, an activation), cuBLAS (a matrix product) and NCCL (an
 * all-reduce on a one-device communicator), each against a plain C
 * reference within 1e-5 relative in strict float32 (no TF32). Proves that a
 * build (or the device kit's prefix) finds every library and sub-library at
 * run time, and that the legacy cuDNN API compiles under -Werror. Exits 77
 * (skipped) where no device is visible, or fails then if DSRT_REQUIRE_GPU
 * is set.
 */
#include "gpu.h"

#include <cublas_v2.h>
#include <math.h>
#include <string.h>
#ifdef DSRT_HAVE_CUDNN
#include <cudnn.h>
#endif
#ifdef DSRT_HAVE_NCCL
#include <nccl.h>
#endif

static cudaStream_t S;

#define CUBLAS(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *dcopy(const void *host, size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes));
    CU(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static float value(int i, int salt) {
    return (float)((i * 37 + salt * 11) % 23 - 11) / 8.0f;
}

static int near(const float *got, const double *want, int n, const char *what) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-5 * fabs(want[i]) + 1e-6) && bad++ < 5)
            fprintf(stderr, "  %s[%d]: got %.9g, want %.9g\n", what, i, got[i], want[i]);
    return bad;
}

// ----------------------------------------------------------------------------
// cuBLAS

/* C (m x n) = A (m x k) B (k x n), row-major, as the column-major product
 * C^T = B^T A^T. */
static void test_cublas(void) {
    enum { M = 5, N = 7, K = 33 };
    float a[M * K], b[K * N], c[M * N];
    double want[M * N];
    for (int i = 0; i < M * K; i++) a[i] = value(i, 1);
    for (int i = 0; i < K * N; i++) b[i] = value(i, 2);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double t = 0;
            for (int k = 0; k < K; k++) t += (double)a[i * K + k] * b[k * N + j];
            want[i * N + j] = t;
        }
    cublasHandle_t h;
    CUBLAS(cublasCreate(&h));
    CUBLAS(cublasSetStream(h, S));
    CUBLAS(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    float *da = dcopy(a, sizeof a), *db = dcopy(b, sizeof b), *dc = NULL;
    CU(cudaMalloc((void **)&dc, sizeof c));
    const float one = 1.0f, zero = 0.0f;
    CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, db, N, da, K, &zero, dc, N));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
    CHECK_EQ(near(c, want, M * N, "sgemm"), 0);
    int version = 0;
    CUBLAS(cublasGetVersion(h, &version));
    fprintf(stderr, "  cuBLAS %d\n", version);
    CUBLAS(cublasDestroy(h));
    CU(cudaFree(da));
    CU(cudaFree(db));
    CU(cudaFree(dc));
}

// ----------------------------------------------------------------------------
// cuDNN

#ifdef DSRT_HAVE_CUDNN
#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                          \
                    cudnnGetErrorString(s_));                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A 3x3 convolution with padding 1 and stride 1 (cross-correlation, as every
 * framework), then a ReLU, through the legacy descriptors. */
static void test_cudnn(void) {
    enum { N = 2, C = 3, H = 6, W = 7, F = 4, R = 3 };
    float x[N * C * H * W], w[F * C * R * R], y[N * F * H * W];
    double want[N * F * H * W], relu[N * F * H * W];
    for (int i = 0; i < N * C * H * W; i++) x[i] = value(i, 3);
    for (int i = 0; i < F * C * R * R; i++) w[i] = value(i, 4);
    for (int b = 0; b < N; b++)
        for (int f = 0; f < F; f++)
            for (int r = 0; r < H; r++)
                for (int q = 0; q < W; q++) {
                    double t = 0;
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < R; i++)
                            for (int j = 0; j < R; j++) {
                                int rr = r + i - 1, qq = q + j - 1;
                                if (rr < 0 || rr >= H || qq < 0 || qq >= W) continue;
                                t += (double)x[((b * C + c) * H + rr) * W + qq] *
                                     w[((f * C + c) * R + i) * R + j];
                            }
                    int o = ((b * F + f) * H + r) * W + q;
                    want[o] = t;
                    relu[o] = t > 0 ? t : 0;
                }
    size_t version = cudnnGetVersion();
    fprintf(stderr, "  cuDNN %zu (built with %d), for CUDA runtime %zu\n", version, CUDNN_VERSION,
            cudnnGetCudartVersion());
    CHECK_GE(version, 90000);
    cudnnHandle_t h;
    DNN(cudnnCreate(&h));
    DNN(cudnnSetStream(h, S));
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&yd));
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnCreateActivationDescriptor(&ad));
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W));
    DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, F, H, W));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, F, C, R, R));
    DNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    DNN(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    int on, oc, oh, ow;
    DNN(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
    CHECK(on == N && oc == F && oh == H && ow == W);
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t ws_bytes = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo, &ws_bytes));
    float *dx = dcopy(x, sizeof x), *dw = dcopy(w, sizeof w), *dy = NULL;
    void *ws = NULL;
    CU(cudaMalloc((void **)&dy, sizeof y));
    if (ws_bytes) CU(cudaMalloc(&ws, ws_bytes));
    const float one = 1.0f, zero = 0.0f;
    DNN(cudnnConvolutionForward(h, &one, xd, dx, wd, dw, cd, algo, ws, ws_bytes, &zero, yd, dy));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    CHECK_EQ(near(y, want, N * F * H * W, "convolution"), 0);
    DNN(cudnnActivationForward(h, ad, &one, yd, dy, &zero, yd, dy));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    CHECK_EQ(near(y, relu, N * F * H * W, "relu"), 0);
    DNN(cudnnDestroyActivationDescriptor(ad));
    DNN(cudnnDestroyConvolutionDescriptor(cd));
    DNN(cudnnDestroyFilterDescriptor(wd));
    DNN(cudnnDestroyTensorDescriptor(yd));
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroy(h));
    CU(cudaFree(dx));
    CU(cudaFree(dw));
    CU(cudaFree(dy));
    if (ws) CU(cudaFree(ws));
}
#endif

// ----------------------------------------------------------------------------
// NCCL

#ifdef DSRT_HAVE_NCCL
#define NCCL(call)                                                                                 \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One rank: the sum is the buffer itself, out of place and in place. */
static void test_nccl(void) {
    enum { N = 1000 };
    float x[N], y[N];
    double want[N];
    for (int i = 0; i < N; i++) x[i] = value(i, 5), want[i] = x[i];
    int version = 0;
    NCCL(ncclGetVersion(&version));
    fprintf(stderr, "  NCCL %d\n", version);
    ncclComm_t comm;
    int dev = 0;
    NCCL(ncclCommInitAll(&comm, 1, &dev));
    float *dx = dcopy(x, sizeof x), *dy = NULL;
    CU(cudaMalloc((void **)&dy, sizeof y));
    NCCL(ncclAllReduce(dx, dy, N, ncclFloat, ncclSum, comm, S));
    NCCL(ncclAllReduce(dx, dx, N, ncclFloat, ncclSum, comm, S));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    CHECK_EQ(near(y, want, N, "all-reduce"), 0);
    CU(cudaMemcpy(y, dx, sizeof y, cudaMemcpyDeviceToHost));
    CHECK_EQ(near(y, want, N, "all-reduce in place"), 0);
    NCCL(ncclCommDestroy(comm));
    CU(cudaFree(dx));
    CU(cudaFree(dy));
}
#endif

int main(void) {
    int skip = gpu_skip();
    if (skip) return skip;
    /* A blocking stream: its kernels wait for the copies and memsets that the
     * tests issue on the default stream. */
    CU(cudaStreamCreate(&S));
    RUN(test_cublas);
#ifdef DSRT_HAVE_CUDNN
    RUN(test_cudnn);
#else
    fprintf(stderr, "built without cuDNN: its test is left out\n");
#endif
#ifdef DSRT_HAVE_NCCL
    RUN(test_nccl);
#else
    fprintf(stderr, "built without NCCL: its test is left out\n");
#endif
    CU(cudaStreamDestroy(S));
    return TEST_RESULT();
}
