/*
 * batchnorm on the GPU: in training cuDNN's persistent NHWC kernels with
 * the ReLU after it fused (cudnnBatchNormalizationForwardTrainingEx /
 * BackwardEx), tried once on the plan's tensors and replaced by dsrt's
 * batchnorm kernels (any layout and type, the ReLU folded in) where cuDNN
 * refuses; those kernels also run at inference and whenever the statistics
 * are synchronised over the workers. See nn/layers/batchnorm.c.
 */
#include "nn/backend_cuda.h"
#include "nn/layers/batchnorm_kernels.h"

/* What a batchnorm layer keeps of its plan. */
typedef struct {
    cudnnTensorDescriptor_t bd;      /* its parameters, derived from the input's */
    cudnnActivationDescriptor_t act; /* the fused ReLU */
    /* Training through cuDNN's Ex calls (NHWC persistent kernels, the ReLU
     * fused when bn_ops says so) with their reserve space; else dsrt's. */
    int bn_ex;
    cudnnBatchNormOps_t bn_ops;
    void *bn_reserve;
    size_t bn_reserve_size;
    /* The batch's mean and inverse standard deviation (c each);
     * synchronised, also its variance (c) and the sums the hook adds up over
     * the workers: forward (2c + 1) and backward (2c). */
    float *save_mean, *save_inv, *save_var;
    double *bn_sums, *bn_bsums;
} bn_own;

static void own_free(void *own) {
    bn_own *o = own;
    if (!o) return;
    if (o->bd) cudnnDestroyTensorDescriptor(o->bd);
    if (o->act) cudnnDestroyActivationDescriptor(o->act);
    free(o);
}

/* Batchnorm in training through cuDNN's Ex calls: persistent NHWC kernels,
 * the ReLU after it fused (not a leaky one). Sizes its workspaces and
 * reserve space; bn_ex stays 0 where cuDNN refuses the layer. */
static int plan_bn_ex(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    bn_own *o = p->gl[i].own;
    o->bn_ex = 0;
    if (!p->train) return 0;
    /* Its kernels read a pixel's channels 16 bytes at a time: cuDNN accepts
     * any channel count, but a row that is not a multiple of 16 bytes (6
     * fp32 channels) faults with misaligned reads once they run (seen on an
     * H100 with cuDNN 9, found by compute-sanitizer). Such layers run dsrt's
     * kernels. */
    size_t el = be->bf16 ? sizeof(uint16_t) : sizeof(float);
    if (((size_t)L->out.c * el) % 16 != 0) return 0;
    /* Its per-channel vectors are read the same way: the scale and shift,
     * their gradients (the flat buffers at the layer's offsets, the buffers
     * on 256 bytes) and the running statistics must each start on 16 bytes. */
    size_t vec = (L->w_off | L->b_off | L->s_off | (L->s_off + (size_t)L->out.c)) * sizeof(float);
    if (vec % 16 != 0) return 0;
    /* With the ReLU fused where cuDNN takes it, else batchnorm alone and the
     * ReLU by dsrt's kernel (the fused op is refused in some precisions). */
    int relu = L->fuse_relu && L->fuse_leak == 0.0f;
    size_t fws = 0, bws = 0, res = 0;
    cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    cudnnStatus_t st = CUDNN_STATUS_NOT_SUPPORTED;
    for (int fused = relu; fused >= 0 && st != CUDNN_STATUS_SUCCESS; fused--) {
        o->bn_ops = fused ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
        cudnnActivationDescriptor_t act = fused ? o->act : NULL;
        st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
            be->dnn, mode, o->bn_ops, in->yd, NULL, g->yd, o->bd, act, &fws);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                be->dnn, mode, o->bn_ops, in->yd, g->yd, g->yd, NULL, in->yd, o->bd, act, &bws);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(be->dnn, mode, o->bn_ops, act,
                                                                      in->yd, &res);
    }
    if (st != CUDNN_STATUS_SUCCESS) return 0;
    o->bn_ex = 1;
    o->bn_reserve_size = res ? res : 1;
    *need = DSRT_MAX(*need, DSRT_MAX(fws, bws));
    return 0;
}

/* Layer i's descriptors: its input's and output's, the parameters' (derived
 * from the input's), the fused ReLU; and whether training runs cuDNN's Ex
 * calls (plan_bn_ex). */
static int desc(cuda_backend *be, gpu_plan *p, int i, size_t *need) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i];
    int n = p->n;
    bn_own *o = dsrt__calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    g->own = o;
    g->own_free = own_free;
    cudnnTensorDescriptor_t xd = p->gl[g->in0].yd;
    if (!xd) {
        /* Its input was made by a layer cuDNN does not see. */
        TRY(dsrt__cuda_set_nhwc(&p->gl[g->in0].yd, be->act_dt, n, L->in.c, L->in.h, L->in.w, L));
        xd = p->gl[g->in0].yd;
    }
    TRY(dsrt__cuda_set_nhwc(&g->yd, be->act_dt, n, L->out.c, L->out.h, L->out.w, L));
    if (!o->bd) DNN(cudnnCreateTensorDescriptor(&o->bd));
    DNN(cudnnDeriveBNTensorDescriptor(o->bd, xd, CUDNN_BATCHNORM_SPATIAL));
    DNN(cudnnCreateActivationDescriptor(&o->act));
    DNN(cudnnSetActivationDescriptor(o->act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    return plan_bn_ex(be, p, i, need);
}

/* The batch's statistics and sums, cuDNN's reserve space, and the scratch
 * of dsrt's kernels' sums. */
static void layout(cuda_backend *be, gpu_plan *p, int i, carve *c, size_t *work) {
    const dsrt_layer *L = &be->net->layers[i];
    bn_own *o = p->gl[i].own;
    size_t ch = (size_t)L->out.c;
    if (!p->train) return;
    *work = DSRT_MAX(*work, dsrt_kb_bn_work(&p->gl[L->inputs[0]].kd) * sizeof(float));
    o->save_mean = dsrt__cuda_take(c, ch * sizeof(float));
    o->save_inv = dsrt__cuda_take(c, ch * sizeof(float));
    o->save_var = dsrt__cuda_take(c, ch * sizeof(float));
    o->bn_sums = dsrt__cuda_take(c, (2 * ch + 1) * sizeof(double));
    o->bn_bsums = dsrt__cuda_take(c, 2 * ch * sizeof(double));
    o->bn_reserve = o->bn_ex ? dsrt__cuda_take(c, o->bn_reserve_size) : NULL;
}

/* One trial of batchnorm i's Ex calls on the plan's tensors (running
 * statistics and parameter gradients left alone: scratch takes them);
 * bn_ex goes back to 0 where they fail. */
static void try_fused(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    bn_own *o = p->gl[i].own;
    if (!o->bn_ex) return;
    cudnnActivationDescriptor_t act =
        o->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION ? o->act : NULL;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, o->bn_ops, &ONE, &ZERO, in->yd, in->y, NULL,
        NULL, g->yd, g->y, o->bd, scale, shift, 0.0, NULL, NULL, (double)L->o.eps, o->save_mean,
        o->save_inv, act, be->ws, be->ws_size, o->bn_reserve, o->bn_reserve_size);
    if (st == CUDNN_STATUS_SUCCESS && in->dy && g->dy)
        st = cudnnBatchNormalizationBackwardEx(
            be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, o->bn_ops, &ONE, &ZERO, &ONE, &ZERO,
            in->yd, in->y, g->yd, g->y, g->yd, g->dy, NULL, NULL, in->yd, in->dy, o->bd, scale,
            shift, o->save_var, o->bn_bsums, (double)L->o.eps, o->save_mean, o->save_inv, act,
            be->ws, be->ws_size, o->bn_reserve, o->bn_reserve_size);
    (void)cudaGetLastError();
    if (st != CUDNN_STATUS_SUCCESS) o->bn_ex = 0;
    g->fuse = o->bn_ex ? FUSE_CUDNN : FUSE_NONE; /* (the profile counts cuDNN's own) */
}

/*
 * Batchnorm by dsrt's kernels: in training this batch's sums of x and x^2
 * per channel (synchronised: handed to the net's hook, which queues their
 * sum over the workers on the compute stream), the statistics and the
 * running averages from them exactly as the CPU backend makes them, then
 * the normalised output with the ReLU after it; at inference the running
 * statistics. What runs when the statistics are synchronised, when cuDNN
 * refused the layer's Ex calls, and at inference.
 */
static int fwd_batchnorm_kernels(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    bn_own *o = p->gl[i].own;
    int c = L->out.c;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *rm = be->state + L->s_off, *rv = rm + c;
    if (!p->train) {
        CU(dsrt_k_bn_apply(&in->kd, in->y, rm, NULL, rv, L->o.eps, scale, shift, L->fuse_relu,
                           L->fuse_leak, g->y, be->compute));
        return 0;
    }
    CU(dsrt_k_bn_sums(&in->kd, in->y, o->bn_sums, p->work, be->compute));
    if (p->bn_sync) TRY(dsrt__cuda_bn_callout(be, i, 0, o->bn_sums, (size_t)2 * c + 1));
    CU(dsrt_k_bn_stats(o->bn_sums, c, L->o.eps, L->o.momentum, o->save_mean, o->save_var,
                       o->save_inv, rm, rv, be->compute));
    CU(dsrt_k_bn_apply(&in->kd, in->y, o->save_mean, o->save_inv, NULL, 0.0f, scale, shift,
                       L->fuse_relu, L->fuse_leak, g->y, be->compute));
    return 0;
}

/* Batchnorm in training by cuDNN's persistent NHWC kernels (the ReLU after
 * it fused, unless leaky), else by dsrt's kernels. */
static int forward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    bn_own *o = p->gl[i].own;
    if (!p->train || !o->bn_ex || p->bn_sync) return fwd_batchnorm_kernels(be, p, i);
    int c = L->out.c;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *rm = be->state + L->s_off, *rv = rm + c;
    /* Running averages as the CPU backend keeps them: r = (1 - momentum) r +
     * momentum batch, the variance unbiased (cuDNN's definition too). One
     * value per channel has no unbiased variance: the CPU backend then
     * takes the biased one (0), done here by hand. */
    int one = (size_t)p->n * L->out.h * L->out.w == 1;
    int fused = o->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    DNN(cudnnBatchNormalizationForwardTrainingEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, o->bn_ops, &ONE, &ZERO, in->yd, in->y, NULL,
        NULL, g->yd, g->y, o->bd, scale, shift, (double)L->o.momentum, one ? NULL : rm,
        one ? NULL : rv, (double)L->o.eps, o->save_mean, o->save_inv, fused ? o->act : NULL, be->ws,
        be->ws_size, o->bn_reserve, o->bn_reserve_size));
    if (one) {
        float m = L->o.momentum, keep = 1.0f - m;
        DNN(cudnnAddTensor(be->dnn, &m, o->bd, o->save_mean, &keep, o->bd, rm));
        DNN(cudnnScaleTensor(be->dnn, o->bd, rv, &keep));
    }
    if (L->fuse_relu && !fused)
        CU(dsrt_k_relu_fwd(be->act, g->y, g->y, dsrt__cuda_out_count(L, p->n), L->fuse_leak,
                           be->compute));
    return 0;
}

static int backward(cuda_backend *be, gpu_plan *p, int i) {
    const dsrt_layer *L = &be->net->layers[i];
    gpu_layer *g = &p->gl[i], *in = &p->gl[L->inputs[0]];
    bn_own *o = p->gl[i].own;
    const float *scale = be->params + L->w_off, *shift = be->params + L->b_off;
    float *dscale = be->grads + L->w_off, *dshift = be->grads + L->b_off;
    if (!o->bn_ex || p->bn_sync) {
        /* dsrt's kernels, the ReLU's backward folded into both passes: the
         * sums of dy' and of dy' xhat are the shift's and the scale's
         * gradients (the gradient all-reduce adds them up), and, summed
         * over the workers when synchronised, give the input gradient's
         * mean and variance terms. */
        int c = L->out.c;
        const void *y = L->fuse_relu ? g->y : NULL;
        CU(dsrt_k_bn_bwd_sums(&in->kd, in->y, g->dy, y, L->fuse_leak, o->save_mean, o->save_inv,
                              o->bn_bsums, dscale, dshift, p->work, be->compute));
        if (p->bn_sync) TRY(dsrt__cuda_bn_callout(be, i, 1, o->bn_bsums, (size_t)2 * c));
        CU(dsrt_k_bn_bwd_dx(&in->kd, in->y, g->dy, y, L->fuse_leak, o->save_mean, o->save_inv,
                            scale, o->bn_bsums, o->bn_sums + 2 * c,
                            dsrt__cuda_grad_ptr(p, i, g->in0), be->compute));
        TRY(dsrt__cuda_grad_add(be, p, i, g->in0));
        return dsrt__cuda_grads_ready(be, i);
    }
    int fused = o->bn_ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    if (L->fuse_relu && !fused)
        CU(dsrt_k_relu_bwd(be->act, g->y, g->dy, g->dy, dsrt__cuda_out_count(L, p->n), L->fuse_leak,
                           be->compute));
    DNN(cudnnBatchNormalizationBackwardEx(
        be->dnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, o->bn_ops, &ONE, &ZERO, &ONE, &ZERO, in->yd,
        in->y, g->yd, g->y, g->yd, g->dy, NULL, NULL, in->yd, dsrt__cuda_grad_ptr(p, i, g->in0),
        o->bd, scale, shift, dscale, dshift, (double)L->o.eps, o->save_mean, o->save_inv,
        fused ? o->act : NULL, be->ws, be->ws_size, o->bn_reserve, o->bn_reserve_size));
    TRY(dsrt__cuda_grad_add(be, p, i, g->in0));
    return dsrt__cuda_grads_ready(be, i);
}

const dsrt_cuda_layer_ops dsrt__cuda_layer_batchnorm = {
    .flags = DSRT_CUDA_DX_ALWAYS | DSRT_CUDA_STATE,
    .desc = desc,
    .layout = layout,
    .try_fused = try_fused,
    .forward = forward,
    .backward = backward,
};
