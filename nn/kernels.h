/*
 * The CUDA kernels the GPU backend needs beside cuDNN and cuBLAS: the input
 * stage (pipeline bytes to normalised floats), explicit padding and
 * cropping, leaky ReLU, the fully connected bias, dropout with the CPU
 * backend's masks, softmax with cross-entropy, synchronised batch
 * normalisation's sums and statistics, the fused optimizer step, and
 * float32 <-> bfloat16 conversions. Each one computes exactly what the CPU
 * backend (nn/backend_cpu.c) or the optimizer (nn/optim.c) computes; the
 * definitions they share live in nn/arith.h.
 *
 * Plain C: every entry point is an extern "C" launcher taking device
 * pointers, sizes and a stream. A launcher queues its kernel(s) on the stream
 * and returns cudaGetLastError() (cudaSuccess, or the launch's error); it
 * never synchronises, allocates or copies, and an empty tensor launches
 * nothing. Pointers are device pointers unless a comment says otherwise;
 * tensors are dense. Included by C files, compiled by gcc. The types, and
 * the arithmetic of every kernel (which the host runs too), are in
 * nn/kernels_body.h.
 */
#ifndef DSRT_NN_KERNELS_H
#define DSRT_NN_KERNELS_H

#include "nn/kernels_body.h"

#include <cuda_runtime_api.h>
#include <dsrt/nn.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Input

/*
 * The input stage from the pipeline's uint8 batch x (yd->n, yd->h, yd->w,
 * yd->c), NHWC, to y (yd: any layout and type): each byte through pix, then
 * the input layer's normalisation y = a x + o (nn/arith.h
 * dsrt_input_affine) with norm a dsrt_norm and stats the layer's state in
 * device memory (mean, std, min, max: 4 yd->c floats; NULL when norm is
 * DSRT_NORM_NONE). yd->c is at most DSRT_K_PIXEL_CH_MAX. With float32
 * output, no normalisation and pix = x / 255, y holds the very floats the
 * pipeline's float output would (for whole-pixel augmentations).
 */
cudaError_t dsrt_k_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                            const dsrt_k_desc *yd, void *y, cudaStream_t stream);

/* The same from a float32 NCHW batch x (yd->n, yd->c, yd->h, yd->w): y = a x
 * + o, as the CPU backend's input layer. */
cudaError_t dsrt_k_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd,
                             void *y, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Padding and cropping

/*
 * y (yd) = x (xd) placed with its top-left pixel at (top, left) of y, fill
 * everywhere else; negative offsets crop. xd and yd have the same n and c
 * and may differ in layout and type. With accumulate, y += that instead
 * (fill included). For convolutions and pooling with asymmetric or 'same'
 * padding: pad with 0 (convolution, average pooling, which counts the
 * padding like the CPU backend) or -INFINITY (max pooling), then run cuDNN
 * unpadded. The backward is the crop of the gradient: dx = dy at (-top,
 * -left), with accumulate where dx already holds a contribution.
 */
cudaError_t dsrt_k_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y,
                       int top, int left, float fill, int accumulate, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Activations and the fully connected bias

/* y = x > 0 ? x : x * leak over n elements of type t (leak 0: ReLU). In place
 * (y == x) allowed. */
cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t stream);

/* dx = y > 0 ? dy : dy * leak, from the forward's output y (as oneDNN's
 * relu_use_dst_for_bwd). In place (dx == dy) allowed. */
cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t stream);

/* Fully connected output: y (n, out) = x (n, out) + b (out; NULL: none),
 * then with relu y < 0 ? y * leak : y, as the CPU backend's fully connected
 * step. In place (y == x) allowed. */
cudaError_t dsrt_k_bias_act(const float *x, const float *b, float *y, int n, int out, int relu,
                            float leak, cudaStream_t stream);

/* db (out) = the column sums of dy (n, out), in a fixed order (run to run
 * identical). */
cudaError_t dsrt_k_bias_grad(const float *dy, float *db, int n, int out, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Dropout

/*
 * y = x * mask over the tensor d (any layout, either type), the mask of layer
 * `layer` at training step `iteration` of a net seeded with `seed`, for drop
 * probability p: element (i, ch, r, col) takes dsrt_dropout_mask (nn/arith.h)
 * of its logical NCHW index, whatever d's layout, so masks are the CPU
 * backend's bit for bit. The forward passes the layer's input as x; the
 * backward passes dy as x and gets dx, with the same key. In place allowed.
 */
cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                           uint64_t iteration, int layer, float p, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

/* Bytes of device workspace dsrt_k_softmax_xent_fwd needs for n images. */
size_t dsrt_k_softmax_xent_work(int n);

/*
 * Softmax of the logits z (n, k) into probs (n, k), as the CPU backend: in
 * double after subtracting the row's maximum, rounded to float. With labels
 * (n int32 in [0, k)), *loss (device double) receives the mean cross-entropy
 * over the batch and *correct (device int32) how many rows have their label
 * as first maximum; loss or correct may be NULL. A row whose maximum is not
 * finite (or a label out of range) makes the loss NaN. work: a device
 * buffer of dsrt_k_softmax_xent_work(n) bytes. The sums run in a fixed
 * order: the results are identical from run to run.
 */
cudaError_t dsrt_k_softmax_xent_fwd(const float *z, const int32_t *labels, int n, int k,
                                    float *probs, double *loss, int32_t *correct, void *work,
                                    cudaStream_t stream);

/* dz (n, k) = (probs - onehot(labels)) * scale, rounded as the CPU backend
 * (probs * scale, then minus scale at the label). scale is 1 / n for the
 * batch mean, 1 / (n * ranks) for a data-parallel average. */
cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, int n, int k,
                                    float scale, float *dz, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Synchronised batch normalisation

/*
 * The sums of synchronised batchnorm (dsrt_bn_sums in include/dsrt/nn.h),
 * in double, over x (n, c, hw) float32 NCHW: sums[ch] = sum of x,
 * sums[c + ch] = sum of x^2 over channel ch, sums[2c] = n * hw. Each channel
 * is summed in a fixed order (identical from run to run). sums: 2c + 1
 * device doubles.
 */
cudaError_t dsrt_k_bn_sums(const float *x, int n, int c, int hw, double *sums, cudaStream_t stream);

/*
 * The batch statistics from the summed sums (over every worker, 2c + 1),
 * as the CPU backend's synchronised batchnorm: with M = sums[2c], mean =
 * sums[ch] / M and the biased variance var = sums[c + ch] / M - mean^2
 * (0 where rounding makes it negative), each rounded to float, and inv =
 * 1 / sqrt(var + eps). Then the running statistics (run_mean, run_var: c
 * floats each, updated in place) as the CPU backend updates them:
 * r = (1 - momentum) r + momentum batch, the variance times M / (M - 1)
 * (1 for M <= 1). A count that is not positive (a broken hook) makes mean,
 * var and inv NaN and leaves the running statistics alone.
 */
cudaError_t dsrt_k_bn_stats(const double *sums, int c, float eps, float momentum, float *mean,
                            float *var, float *inv, float *run_mean, float *run_var,
                            cudaStream_t stream);

/*
 * The backward sums over dy and x (n, c, hw) with the layer's mean and inv
 * (c each; xhat = (x - mean) * inv): sums[ch] = sum of dy, sums[c + ch] =
 * sum of dy * xhat, in double, each channel in a fixed order. dshift and
 * dscale (c floats each; may be NULL) receive the same sums rounded to
 * float: this worker's gradients of the shift and the scale. sums: 2c
 * device doubles.
 */
cudaError_t dsrt_k_bn_bwd_sums(const float *x, const float *dy, const float *mean, const float *inv,
                               int n, int c, int hw, double *sums, float *dscale, float *dshift,
                               cudaStream_t stream);

/*
 * The input gradient with the global terms, as the CPU backend's
 * synchronised batchnorm: with a = scale * inv, M = *count (the summed
 * count, a device double) and S1, S2 the summed backward sums (2c),
 *     dx = a dy - a S1 / M - (x - mean) a inv S2 / M,
 * in double, rounded to float. dx may not alias x or dy.
 */
cudaError_t dsrt_k_bn_bwd_dx(const float *x, const float *dy, const float *mean, const float *inv,
                             const float *scale, const double *sums, const double *count, int n,
                             int c, int hw, float *dx, cudaStream_t stream);

// ----------------------------------------------------------------------------
// The optimizer

/*
 * Lays out the step's grids over the segments seg (host memory, n_seg of
 * them, in flat-buffer order): fills their block0 and blocks, sets *blocks to
 * the total and returns the bytes of device workspace the step needs. Call
 * once per net, then copy seg to the device.
 */
size_t dsrt_k_optim_layout(dsrt_k_segment *seg, int n_seg, uint32_t *blocks);

/* Host: the scalars of step number t (1 for the first step) at learning rate
 * lr (dsrt_optimizer_learn_rate of the epoch), as dsrt_optimizer_step. */
void dsrt_k_optim_step_params(dsrt_k_step *st, const dsrt_optimizer_options *o, double lr,
                              int64_t t);

/*
 * One optimizer step over the flat buffers w (weights), g (gradients, which
 * are clipped in place as nn/optim.c clips them) and the state buffers
 * buf0 (SGDM velocity, Adam first moment, RMSProp mean square) and buf1
 * (Adam second moment; NULL otherwise), each as long as the flat buffers.
 * Gradient clipping by l2norm (each segment) or global-l2norm (the
 * non-frozen segments together) reduces the norms on the device in a fixed
 * order, then updates: no host round trip, identical from run to run. w16,
 * when not NULL, receives the updated weights in bfloat16 (every segment,
 * frozen ones included). Agrees with nn/optim.c to rounding: bit for bit
 * without norm clipping (on a CPU build without FMA contraction), within a
 * few float ulps with it (the norm is summed in double in another order).
 */
cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st, float *w, float *g,
                                float *buf0, float *buf1, dsrt_bf16 *w16, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Conversions and helpers

cudaError_t dsrt_k_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n, cudaStream_t stream);
cudaError_t dsrt_k_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n, cudaStream_t stream);

/* y = v over n floats. */
cudaError_t dsrt_k_fill(float *y, size_t n, float v, cudaStream_t stream);

/* y = a * x over n floats (in place allowed): loss scaling, averaging. */
cudaError_t dsrt_k_scale(const float *x, float *y, size_t n, float a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
