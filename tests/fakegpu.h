/*
 * What the CPU stand-in of the GPU (tests/fakegpu.c) tells a test about the
 * calls the library made: allocations and when they came, which stream
 * wrote the optimizer's segment table, which pointers cuDNN's algorithm
 * search saw, how NCCL's finalize, destroy and abort were grouped, the
 * host's waits on the device, the recorded steps, the fused calls and the
 * launches of dsrt's kernels. Only in the fake builds (DSRT_FAKE_GPU).
 */
#ifndef DSRT_TEST_FAKEGPU_H
#define DSRT_TEST_FAKEGPU_H

typedef struct {
    /* Device and pinned host memory: cudaMalloc/cudaFree,
     * cudaMallocHost/cudaFreeHost; and how many of them came after the
     * first NCCL collective (an all-reduce, or a batchnorm sum). */
    long mallocs, frees, host_allocs, host_frees;
    long collectives;
    long allocs_after_collective;
    /* The optimizer kernel read its segment table while the last copy into
     * it was queued on another stream (or the legacy one). */
    long optim_launches, seg_table_races;
    /* cuDNN's persistent NHWC batchnorm (the Ex calls) run on a row of
     * channels that is not a multiple of 16 bytes: on a device its kernels
     * fault with misaligned reads after the call returned success. */
    long bn_ex_misaligned;
    /* Fused convolutions with a bfloat16 bias, and any bias given off 16
     * bytes. */
    long fused_convs_bias16, misaligned_bias;
    /* Convolutions run on other pointers than cuDNN's search was given for
     * the same descriptor; of those checked. */
    long search_checked, search_mismatches;
    /* NCCL: finalize, destroy and abort calls, those made outside a
     * ncclGroupStart/End, and the groups ended. One thread driving several
     * members of one clique must group them: a clique's finalize calls made
     * in more than one group, or outside one, are counted in split_closes. */
    long finalizes, destroys, aborts, ungrouped_closes, split_closes, groups;
    /* The groups those calls were made in (one for all of a kind's calls
     * made together). */
    long close_groups;
    /* Host waits: cudaEventSynchronize, cudaStreamSynchronize and
     * cudaEventQuery calls; waits on work that can never finish (a hung
     * collective) that would block for ever; invalid handles. */
    long host_waits, event_queries, deadlocks, bad_handles;
    /* Recorded steps: captures ended, graphs instantiated and launched, the
     * calls the launches ran; calls a capture forbids (a host wait, an
     * allocation, a wait on outside work, an NCCL call on a captured
     * stream); host waits on an event whose last record was a capture's
     * internal dependency (a replay never records it: the wait is stale). */
    long captures, graph_instantiations, graph_launches, graph_ops;
    long capture_violations, stale_event_waits;
    /* Fused calls run: convolution + bias + activation, batchnorm Ex. */
    long fused_convs, bn_ex_calls;
    long bn_ex_plain; /* of those, batchnorm alone (CUDNN_BATCHNORM_OPS_BN) */
} fakegpu_stats;

/* A snapshot of the counters since the start or the last reset. */
fakegpu_stats fakegpu_get_stats(void);
void fakegpu_reset_stats(void);

/* How many times dsrt's kernel named `kernel` (its __global__ function:
 * "conv_fwd_kernel") was launched since the start or the last reset. */
long fakegpu_launches(const char *kernel);

/* What cuDNN refuses (fakegpu_refuse): the fused convolution, the
 * batchnorm Ex calls. 0: nothing. */
#define FAKEGPU_REFUSE_FUSED_CONV 1u
#define FAKEGPU_REFUSE_BN_EX      2u
/* The Ex calls with the ReLU fused (CUDNN_BATCHNORM_OPS_BN_ACTIVATION) only,
 * as cuDNN does in some precisions. */
#define FAKEGPU_REFUSE_BN_EX_RELU 4u
/* Every convolution algorithm (the searches find nothing usable). */
#define FAKEGPU_REFUSE_CONV_ALGOS 8u
void fakegpu_refuse(unsigned what);

/* The CUDA devices the stand-in shows (1 unless set). */
void fakegpu_set_devices(int n);

/* With on, the next NCCL all-reduces never finish (a peer that does not
 * arrive): every event recorded behind them, on their stream or on a
 * stream that waits for one of those events, stays incomplete until a
 * communicator is aborted. */
void fakegpu_hang_collectives(int on);

#endif
