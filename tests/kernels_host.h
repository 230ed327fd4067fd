/*
 * The GPU backend's kernels run on the host (tests/kernels_host.c): each
 * dsrt_kh_* takes the arguments of its dsrt_k_* launcher (nn/kernels.h)
 * without the stream, makes the same checks, and runs the kernel's bodies
 * (nn/kernels_body.h) in plain loops over the grid the device would run, so
 * every element, every reduction order and so every bit is what the device
 * kernel computes (up to exp and log in softmax). Pointers are host memory.
 * Each returns 0, or -EINVAL where the launcher returns
 * cudaErrorInvalidValue. Used by test_nn_kernels and by the CPU stand-in of
 * the GPU (tests/fakegpu.c).
 */
#ifndef DSRT_TEST_KERNELS_HOST_H
#define DSRT_TEST_KERNELS_HOST_H

#include "nn/kernels_body.h"

int dsrt_kh_input_u8(const uint8_t *x, const dsrt_k_pixel *pix, int norm, const float *stats,
                     const dsrt_k_desc *yd, void *y);
int dsrt_kh_input_f32(const float *x, int norm, const float *stats, const dsrt_k_desc *yd, void *y);
int dsrt_kh_pad(const dsrt_k_desc *xd, const void *x, const dsrt_k_desc *yd, void *y, int top,
                int left, float fill, int accumulate);
int dsrt_kh_relu_fwd(dsrt_k_type t, const void *x, void *y, size_t n, float leak);
int dsrt_kh_relu_bwd(dsrt_k_type t, const void *y, const void *dy, void *dx, size_t n, float leak);
int dsrt_kh_act_fwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, void *y, size_t n);
int dsrt_kh_act_bwd(dsrt_k_type t, const dsrt_k_act *a, const void *x, const void *y,
                    const void *dy, void *dx, size_t n);
int dsrt_kh_bias_act(const dsrt_k_desc *d, const void *x, const float *b, void *y, int relu,
                     float leak);
int dsrt_kh_bias_grad(const dsrt_k_desc *d, void *dy, const void *y, float leak, float *db,
                      void *work);
int dsrt_kh_pool_fwd(const dsrt_k_pool *p, const void *x, void *y, uint8_t *arg);
int dsrt_kh_pool_bwd(const dsrt_k_pool *p, const void *x, const uint8_t *arg, const void *dy,
                     void *dx);
int dsrt_kh_lrn_fwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, void *y,
                    float *scale);
int dsrt_kh_lrn_bwd(const dsrt_k_desc *d, const dsrt_k_lrn *l, const void *x, const void *y,
                    const void *dy, const float *scale, void *dx);
int dsrt_kh_sum(dsrt_k_type t, const dsrt_k_sum *s, void *y, size_t count, int relu, float leak);
int dsrt_kh_channels(const dsrt_k_desc *xd, void *x, const dsrt_k_desc *yd, void *y, int c0,
                     int to_y, int accumulate);
int dsrt_kh_conv_fwd(const dsrt_k_conv *p, const void *x, const void *w, void *y);
int dsrt_kh_conv_bwd_data(const dsrt_k_conv *p, const void *w, const void *dy, void *dx);
int dsrt_kh_conv_bwd_filter(const dsrt_k_conv *p, const void *x, const void *dy, void *dw,
                            dsrt_k_type dwt);
int dsrt_kh_dropout(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed, uint64_t iteration,
                    const uint64_t *iteration_dev, int layer, float p);
int dsrt_kh_softmax_xent_fwd(const void *z, dsrt_k_type zt, const int32_t *labels,
                             const float *soft, int n, int k, float *probs, double *loss,
                             int32_t *correct, void *work);
int dsrt_kh_softmax_xent_bwd(const float *probs, const int32_t *labels, const float *soft,
                             const void *work, int n, int k, float scale, const float *scale_dev,
                             void *dz, dsrt_k_type dzt);
int dsrt_kh_bn_sums(const dsrt_k_desc *xd, const void *x, double *sums, float *work);
int dsrt_kh_bn_stats(const double *sums, int c, float eps, float momentum, float *mean, float *var,
                     float *inv, float *run_mean, float *run_var);
int dsrt_kh_bn_bwd_sums(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                        float leak, const float *mean, const float *inv, double *sums,
                        float *dscale, float *dshift, float *work);
int dsrt_kh_bn_bwd_dx(const dsrt_k_desc *xd, const void *x, const void *dy, const void *y,
                      float leak, const float *mean, const float *inv, const float *scale,
                      const double *sums, const double *count, void *dx);
int dsrt_kh_bn_apply(const dsrt_k_desc *xd, const void *x, const float *mean, const float *inv,
                     const float *var, float eps, const float *scale, const float *shift, int relu,
                     float leak, void *y);
int dsrt_kh_optim_update(const dsrt_k_optim *o, const dsrt_k_step *st, const dsrt_k_step *st_dev,
                         float *w, float *g, float *buf0, float *buf1, dsrt_bf16 *w16);
int dsrt_kh_set_consts(dsrt_k_consts *dst, const dsrt_k_consts *v);
int dsrt_kh_mul(const dsrt_k_desc *ad, const void *a, const dsrt_k_desc *bd, const void *b,
                void *y);
int dsrt_kh_mul_grad(const dsrt_k_desc *ad, const void *dy, const void *a, const dsrt_k_desc *bd,
                     void *db);
int dsrt_kh_chan_grads(const dsrt_k_desc *d, const void *x, const void *dy, const float *mean,
                       const float *rstd, float *dscale, float *dshift, float *work);
int dsrt_kh_ln_fwd(const dsrt_k_desc *d, const void *x, const float *gamma, const float *beta,
                   float eps, void *y, float *mean, float *rstd);
int dsrt_kh_ln_bwd(const dsrt_k_desc *d, const void *x, const void *dy, const float *gamma,
                   const float *mean, const float *rstd, void *dx);
int dsrt_kh_drop_path(const dsrt_k_desc *d, const void *x, void *y, uint64_t seed,
                      uint64_t iteration, const uint64_t *iteration_dev, int layer, float p);
int dsrt_kh_f32_to_bf16(const float *x, dsrt_bf16 *y, size_t n);
int dsrt_kh_bf16_to_f32(const dsrt_bf16 *x, float *y, size_t n);
int dsrt_kh_fill(float *y, size_t n, float v);
int dsrt_kh_scale(const float *x, float *y, size_t n, float a);

#endif
