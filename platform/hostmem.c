/*
 * Host memory for batch slots, and the CUDA devices the input side sees.
 * Slots are page-locked so that a GPU can copy from them asynchronously and
 * the kernel never pages them out: mmap'd (page-aligned, so O_DIRECT and
 * SIMD stores are happy), then, for a pipeline that feeds CUDA device N,
 * registered with CUDA through the CUDA host module (platform/cuda_host/hostmem_cuda.c,
 * loaded here on first use), else mlock'ed where RLIMIT_MEMLOCK allows.
 * Failing to lock is not an error: the memory works the same, only
 * unlocked, and the caller is told.
 */
#include "core/module.h"
#include "platform/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <dsrt/pipeline.h>

#ifndef DSRT_CUDA_MAJOR
#define DSRT_CUDA_MAJOR "13"
#endif

// ----------------------------------------------------------------------------
// CUDA, through its module

static const dsrt_module_spec CUDA_HOST = {
    .name = "cuda_host",
    .what = "the CUDA runtime",
    .needs = "the CUDA runtime (libcudart.so." DSRT_CUDA_MAJOR ")",
#ifdef DSRT_HAVE_CUDA_HOST
    .built = 1,
#endif
    .unbuilt = "this dsrt was built without the CUDA toolkit",
};

int dsrt__cuda_host(const dsrt_cuda_host_ops **ops) {
    const void *t = NULL;
    int rc = dsrt__module_load(&CUDA_HOST, &t);
    *ops = t;
    return rc;
}

int dsrt__cuda_devices(char *why, size_t size) {
    const dsrt_cuda_host_ops *ops;
    if (dsrt__cuda_host(&ops) != 0) {
        if (why && size) snprintf(why, size, "%s", dsrt_last_error());
        return 0;
    }
    return ops->devices(why, size);
}

int dsrt__cuda_device_count(void) {
    return dsrt__cuda_devices(NULL, 0);
}

/* Registers m's memory for device gpu; 0, or nonzero to fall back to mlock. */
static int cuda_register(dsrt_host_mem *m, int gpu) {
    const dsrt_cuda_host_ops *ops;
    if (dsrt__cuda_host(&ops) != 0) return -ENODEV;
    if (gpu >= ops->devices(NULL, 0)) return -ENODEV;
    if (ops->host_register(m->ptr, m->bytes, gpu, NULL, 0) != 0) return -ENOMEM;
    m->cuda = 1;
    m->locked = 1;
    return 0;
}

// ----------------------------------------------------------------------------
// Allocate and free

int dsrt__host_alloc(dsrt_host_mem *m, size_t bytes, int gpu) {
    memset(m, 0, sizeof *m);
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return dsrt__fail(-ENOMEM, "pipeline: out of memory: %zu bytes of batch slots", bytes);
    m->ptr = p;
    m->bytes = bytes;
    if (gpu >= 0 && cuda_register(m, gpu) == 0) return 0;
    /* EPERM (no CAP_IPC_LOCK) and ENOMEM (over RLIMIT_MEMLOCK) leave the
     * memory usable, only unlocked. */
    m->locked = mlock(p, bytes) == 0;
    return 0;
}

void dsrt__host_free(dsrt_host_mem *m) {
    if (!m->ptr) return;
    const dsrt_cuda_host_ops *ops;
    if (m->cuda && dsrt__cuda_host(&ops) == 0) ops->host_unregister(m->ptr);
    munmap(m->ptr, m->bytes); /* also unlocks */
    memset(m, 0, sizeof *m);
}

// ----------------------------------------------------------------------------
// Public: pinned buffers for callers

/* A page in front of the caller's bytes records how they were allocated. */
#define PINNED_HEADER 4096

void *dsrt_pinned_alloc(size_t bytes, int gpu) {
    dsrt_host_mem m;
    if (bytes > SIZE_MAX - PINNED_HEADER) {
        dsrt__fail(-ENOMEM, "pinned memory: %zu bytes is too much", bytes);
        return NULL;
    }
    if (dsrt__host_alloc(&m, bytes + PINNED_HEADER, gpu) != 0) return NULL;
    memcpy(m.ptr, &m, sizeof m);
    return (char *)m.ptr + PINNED_HEADER;
}

void dsrt_pinned_free(void *p) {
    if (!p) return;
    dsrt_host_mem m;
    memcpy(&m, (char *)p - PINNED_HEADER, sizeof m);
    dsrt__host_free(&m);
}
