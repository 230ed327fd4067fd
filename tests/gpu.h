/*
 * What the GPU tests share: a die-on-error check of CUDA runtime calls, and
 * the decision to run or skip. A test_gpu_* program calls gpu_skip() first
 * and returns its value when it is not 0: 77 (skipped) where no CUDA device
 * is visible, or 1 (failed) then if the environment sets DSRT_REQUIRE_GPU
 * (the device kit does, so that a broken driver cannot pass as a skip); and
 * the choice of tests to run (DSRT_TEST_ONLY).
 */
#ifndef DSRT_TEST_GPU_H
#define DSRT_TEST_GPU_H

#include "task.h"

#include <cuda_runtime_api.h>
#include <string.h>

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline int gpu_skip(void) {
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e == cudaSuccess && devices > 0) {
        struct cudaDeviceProp prop;
        int runtime = 0, driver = 0;
        CU(cudaGetDeviceProperties(&prop, 0));
        CU(cudaRuntimeGetVersion(&runtime));
        CU(cudaDriverGetVersion(&driver));
        fprintf(stderr,
                "device 0 of %d: %s, compute capability %d.%d; CUDA runtime %d, driver %d\n",
                devices, prop.name, prop.major, prop.minor, runtime, driver);
        return 0;
    }
    const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "no device";
    if (getenv("DSRT_REQUIRE_GPU")) {
        fprintf(stderr, "DSRT_REQUIRE_GPU is set but no CUDA device is usable: %s\n", why);
        return 1;
    }
    fprintf(stderr, "no CUDA device (%s): skipped\n", why);
    return TEST_SKIP;
}

/* DSRT_TEST_ONLY=name,name runs only those tests (the device kit runs a
 * subset under compute-sanitizer's slower tools; the CPU stand-in of the
 * GPU runs the ones it can stand in for). */
static inline int gpu_test_wanted(const char *name) {
    const char *only = getenv("DSRT_TEST_ONLY");
    if (!only || !*only) return 1;
    size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

#define RUN_WANTED(fn)                                                                             \
    do {                                                                                           \
        if (gpu_test_wanted(#fn)) RUN(fn);                                                         \
    } while (0)

#endif
