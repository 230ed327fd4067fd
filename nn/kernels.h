/*
 * The CUDA kernels the GPU backend needs beside cuDNN and cuBLAS: the input
 * stage (pipeline bytes to normalised activations, NHWC), explicit padding
 * and cropping (and layout changes), leaky ReLU, the bias with the ReLU
 * after it, the bias gradient with the ReLU's backward folded in, pooling,
 * local response normalisation, dropout with the CPU backend's masks,
 * element-wise products (mul and scale layers) and their gradients, layer
 * normalisation, stochastic depth, softmax with cross-entropy, synchronised batch normalisation's
 * sums and statistics, the fused optimizer step, the per-step scalars in device memory, and float32
 * <-> bfloat16 conversions. Each one computes exactly what the CPU backend (nn/backend_cpu.c) or
 * the optimizer (nn/optim.c) computes; the definitions they share live in nn/arith.h.
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
// Activations and biases

/* y = x > 0 ? x : x * leak over n elements of type t (leak 0: ReLU). In place
 * (y == x) allowed. */
cudaError_t dsrt_k_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak,
                            cudaStream_t stream);

/* dx = y > 0 ? dy : dy * leak, from the forward's output y (as oneDNN's
 * relu_use_dst_for_bwd). In place (dx == dy) allowed. */
cudaError_t dsrt_k_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n,
                            float leak, cudaStream_t stream);

/* y = f(x) over n elements of type t, f the activation a (clip, sigmoid,
 * hardsigmoid, hardswish, SiLU, GELU: nn/kernels_body.h dsrt_k_act_fn
 * says what each computes, as PyTorch). In place (y == x) allowed. */
cudaError_t dsrt_k_act_fwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y, size_t n,
                           cudaStream_t stream);

/* Its backward: dx from the forward's input x, its output y (which sigmoid
 * reads) and dy, with PyTorch's gradients at the kinks. In place (dx == dy)
 * allowed. */
cudaError_t dsrt_k_act_bwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                           const void *dy, void *dx, size_t n, cudaStream_t stream);

/* A convolution's or fully connected layer's output (d: any layout and
 * type; a fully connected layer's is (n, out, 1, 1)): y = x + b[channel]
 * (b NULL: none), then with relu y < 0 ? y * leak : y, in float and rounded
 * once, as the CPU backend's fused step. In place (y == x) allowed. */
cudaError_t dsrt_k_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y, int relu,
                            float leak, cudaStream_t stream);

/* Bytes of workspace dsrt_k_bias_grad needs for d. */
size_t dsrt_k_bias_grad_work(const dsrt_k_desc *d);

/*
 * db (d->c floats) = the per-channel sums of dy (d: NHWC, or h = w = 1),
 * in a fixed order (run to run identical). With y (the layer's output, of
 * d) the ReLU's backward is folded in: dy becomes y > 0 ? dy : dy * leak,
 * in place, in the same pass, so the convolution's or matrix product's
 * backward that follows reads the gradient behind the ReLU. work: a device
 * buffer of dsrt_k_bias_grad_work(d) bytes.
 */
cudaError_t dsrt_k_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak, float *db,
                             void *work, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Pooling and local response normalisation

/* Max or average pooling, y from x (nn/kernels_body.h dsrt_k_pool says
 * how), padding included; every element of y is written. For max pooling
 * with arg given (one byte an element of y; windows of at most 255,
 * dsrt_kb_pool_arg_ok), each window's winner as its offset in the window. */
cudaError_t dsrt_k_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg,
                            cudaStream_t stream);

/* Its backward: dx (p->xd) from dy (p->yd); max pooling reads the winners
 * from arg (the forward's), or, arg NULL, finds them again in the forward's
 * input x (the first largest, as the forward); every element of dx is
 * written, in a fixed order. */
cudaError_t dsrt_k_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg, const void *dy,
                            void *dx, cudaStream_t stream);

/* Local response normalisation across channels of x (d: any layout and
 * type) into y, in float, each element's scale (k + alpha / size * sum of
 * squares) kept in scale (float, one an element) when given; and its
 * backward from x, y, dy and the forward's scale (NULL: computed again)
 * into dx. */
cudaError_t dsrt_k_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                           float *scale, cudaStream_t stream);
cudaError_t dsrt_k_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, const void *y,
                           const void *dy, const float *scale, void *dx, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Graphs

/* y = the sum of s's inputs (count elements of type t each, added in order
 * in float), the ReLU after it when relu (leak: slope below zero); y may
 * be one of the inputs. The add layer, and a gradient adding another
 * layer's share (y = x[0]). */
cudaError_t dsrt_k_sum_fwd(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu,
                           float leak, cudaStream_t stream);

/* x (xd) to channels c0 .. c0 + xd->c of y (yd: one n, h, w) when to_y (a
 * concat's input into its output), else those channels of y to x, added to
 * x when accumulate (the input's share of the gradient). */
cudaError_t dsrt_k_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y, int c0,
                            int to_y, int accumulate, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Direct convolution

/* Convolution p (nn/kernels_body.h dsrt_k_conv) of x with the filters w
 * (cuDNN's NHWC filter order, x's type) into y; the gradient of its input,
 * dx from w and dy; the gradient of its filters, dw (of type dwt, in the
 * filters' order) from x and dy. Each overwrites its output, summing in
 * double in a fixed order (deterministic). The fallback for a convolution
 * cuDNN has no algorithm for: correct for any shape, not fast. */
cudaError_t dsrt_k_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y,
                            cudaStream_t stream);
cudaError_t dsrt_k_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy, void *dx,
                                 cudaStream_t stream);
cudaError_t dsrt_k_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy, void *dw,
                                   dsrt_k_type dwt, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Dropout

/*
 * y = x * mask over the tensor d (any layout, either type), the mask of layer
 * `layer` at training step `iteration` of a net seeded with `seed`, for drop
 * probability p: element (i, ch, r, col) takes dsrt_dropout_mask (nn/arith.h)
 * of its logical NCHW index, whatever d's layout, so masks are the CPU
 * backend's bit for bit. With iteration_dev (device memory) the step is read
 * from there when the kernel runs, not from `iteration`. The forward passes
 * the layer's input as x; the backward passes dy as x and gets dx, with the
 * same key. In place allowed.
 */
cudaError_t dsrt_k_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                           uint64_t iteration, const uint64_t *iteration_dev, int layer, float p,
                           cudaStream_t stream);

// ----------------------------------------------------------------------------
// Softmax and cross-entropy

/* Bytes of device workspace dsrt_k_softmax_xent_fwd (and, with soft
 * targets, the backward after it) needs for n images. */
size_t dsrt_k_softmax_xent_work(int n);

/*
 * Softmax of the logits z (n, k, of type zt) into probs (n, k, float32), as
 * the CPU backend: in double after subtracting the row's maximum, rounded to
 * float. With labels
 * (n int32 in [0, k)), *loss (device double) receives the mean cross-entropy
 * over the batch and *correct (device int32) how many rows have their label
 * as first maximum; loss or correct may be NULL. A row whose maximum is not
 * finite (or a label out of range) makes the loss NaN. work: a device
 * buffer of dsrt_k_softmax_xent_work(n) bytes. The sums run in a fixed
 * order: the results are identical from run to run. With soft (n, k float32
 * targets, mixed or smoothed labels; labels still count the correct rows)
 * the loss is the cross-entropy against them, and work keeps each row's sum
 * of targets for the backward.
 */
cudaError_t dsrt_k_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                                    const float *soft, int n, int k, float *probs, double *loss,
                                    int32_t *correct, void *work, cudaStream_t stream);

/* dz (n, k, of type dzt) = (probs - onehot(labels)) * scale, rounded as the
 * CPU backend (probs * scale, then minus scale at the label). scale is 1 / n
 * for the batch mean, 1 / (n * ranks) for a data-parallel average; with
 * scale_dev (device memory) it is read from there when the kernel runs.
 * With soft targets (and work, as the forward left it): (probs * sum of the
 * row's targets - targets) * scale, in double, rounded once. */
cudaError_t dsrt_k_softmax_xent_bwd(const float *probs, const int32_t *labels, const float *soft,
                                    const void *work, int n, int k, float scale,
                                    const float *scale_dev, void *dz, dsrt_k_type dzt,
                                    cudaStream_t stream);

// ----------------------------------------------------------------------------
// Synchronised batch normalisation
//
// The tensors x, dy, y and dx are of xd (either layout, either type);
// statistics and parameters are float32, a value a channel (c = xd->c).

/*
 * The sums of synchronised batchnorm (dsrt_bn_sums in include/dsrt/nn.h)
 * over x: sums[ch] = sum of x, sums[c + ch] = sum of x^2 over channel ch,
 * sums[2c] = n h w. A tiled reduction (nn/kernels_body.h says how: float
 * compensated sums in tiles, the tiles added in double), each channel in
 * one fixed order (identical from run to run). sums: 2c + 1 device doubles;
 * work: dsrt_kb_bn_work(xd) device floats.
 */
cudaError_t dsrt_k_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work,
                           cudaStream_t stream);

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
 * The backward sums over dy and x with the layer's mean and inv (xhat = (x
 * - mean) * inv): sums[ch] = sum of dy, sums[c + ch] = sum of dy * xhat,
 * tiled as the forward's (work the same size), each channel in a fixed
 * order; with y (the layer's output) dy is
 * read through the ReLU the layer computes after it (y > 0 ? dy : dy *
 * leak). dshift and dscale (c floats each; may be NULL) receive the same
 * sums rounded to float: this worker's gradients of the shift and the
 * scale. sums: 2c device doubles.
 */
cudaError_t dsrt_k_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                               float leak, const float *mean, const float *inv, double *sums,
                               float *dscale, float *dshift, float *work, cudaStream_t stream);

/*
 * The input gradient with the global terms, as the CPU backend's
 * synchronised batchnorm: with a = scale * inv, M = *count (the summed
 * count, a device double) and S1, S2 the summed backward sums (2c),
 *     dx = a dy - a S1 / M - (x - mean) a inv S2 / M,
 * in double, rounded to xd's type; dy through the folded ReLU as for the
 * sums. dx may not alias x, dy or y.
 */
cudaError_t dsrt_k_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                             float leak, const float *mean, const float *inv, const float *scale,
                             const double *sums, const double *count, void *dx,
                             cudaStream_t stream);

/*
 * Batchnorm's output: y = (x - mean) inv scale + shift per channel, in
 * double, rounded to xd's type, then the ReLU after it when relu (leaky
 * with leak). With inv NULL, inv = 1 / sqrt(var + eps) (the running
 * statistics, at inference). In place (y == x) allowed.
 */
cudaError_t dsrt_k_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean,
                            const float *inv, const float *var, float eps, const float *scale,
                            const float *shift, int relu, float leak, void *y, cudaStream_t stream);

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
 * st decides which kernels run (the solver, whether a norm is clipped); with
 * st_dev (device memory holding the same solver and clipping method) the
 * kernels read the step's scalars from there when they run.
 */
cudaError_t dsrt_k_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st,
                                const dsrt_k_step *st_dev, float *w, float *g, float *buf0,
                                float *buf1, dsrt_bf16 *w16, cudaStream_t stream);

/* Writes v into the device's per-step scalars *dst (one small kernel, whose
 * argument is v: queued on the stream before the step that reads them, it
 * is what changes from one replay of a recorded step to the next). */
cudaError_t dsrt_k_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Products, layer normalisation, stochastic depth

/* y (ad) = a (ad) times b (bd: a's channels; along n, h and w a's size or
 * 1, where it broadcasts), in float, rounded once to ad's type: a mul
 * layer (b its second input, or a gate (n, c, 1, 1)), a scale layer (b its
 * factors, float32 (1, c, 1, 1)), and their input gradients (a = dy). y may
 * be a, not b. */
cudaError_t dsrt_k_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd, const void *b,
                       void *y, cudaStream_t stream);

/* The gradient of a gate b of y = a * b (bd: a's n and c, one pixel): db =
 * the sum of dy a over the pixels of each image and channel (dy and a of
 * ad), in double in a fixed order (nn/kernels_body.h), rounded to bd's
 * type. */
cudaError_t dsrt_k_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a,
                            const dsrt_k_desc *bd, void *db, cudaStream_t stream);

/* The gradients of a factor and an offset a channel over d's every pixel:
 * dscale[ch] = the sum of dy v, dshift[ch] = the sum of dy (c floats each;
 * either may be NULL), v being x, or with per-pixel statistics (mean and
 * rstd: n h w floats each, as dsrt_k_ln_fwd keeps them) (x - mean) rstd.
 * Batchnorm's tiled reduction (its order fixed); work:
 * dsrt_kb_bn_work(d) device floats. */
cudaError_t dsrt_k_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy,
                              const float *mean, const float *rstd, float *dscale, float *dshift,
                              float *work, cudaStream_t stream);

/* Layer normalisation over the channels of each pixel of x (d: either
 * layout and type): y = (x - mean) rstd gamma + beta (gamma, beta: c
 * floats), each pixel's mean and rstd = 1 / sqrt(var + eps) kept in mean
 * and rstd (n h w floats each) unless NULL. nn/kernels_body.h says in what
 * order and precision. y may not alias x. */
cudaError_t dsrt_k_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma,
                          const float *beta, float eps, void *y, float *mean, float *rstd,
                          cudaStream_t stream);

/* Its input gradient from x, dy and the forward's mean and rstd: dx =
 * rstd (g - mean of g - xhat mean of g xhat) over each pixel's channels,
 * g = dy gamma, xhat = (x - mean) rstd. dx may not alias x or dy. */
cudaError_t dsrt_k_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy, const float *gamma,
                          const float *mean, const float *rstd, void *dx, cudaStream_t stream);

/* y = x times the factor of its image over the tensor d (any layout, either
 * type): 0 for an image dropped with probability p, 1 / (1 - p) for one
 * kept, drawn for layer `layer` at training step `iteration` of a net
 * seeded with `seed` (nn/arith.h dsrt_drop_path_mask), as the CPU backend
 * draws them. iteration_dev, x and y as dsrt_k_dropout's; forward and
 * backward alike. */
cudaError_t dsrt_k_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                             uint64_t iteration, const uint64_t *iteration_dev, int layer, float p,
                             cudaStream_t stream);

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
