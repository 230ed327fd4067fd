/*
 * Host memory for batch slots, and the count of CUDA devices. Slots are
 * page-locked so that a GPU can copy from them asynchronously and the kernel
 * never pages them out: with cudaHostAlloc in a CUDA build that finds a
 * device, else with mmap (page-aligned, so O_DIRECT and SIMD stores are
 * happy) and mlock where RLIMIT_MEMLOCK allows. Failing to lock is not an
 * error: the memory works the same, only unlocked, and the caller is told.
 */
#include "runtime/internal.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <dsrt/pipeline.h>

#if defined(DSRT_WITH_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define DSRT_HOSTMEM_CUDA 1
#elif defined(DSRT_WITH_CUDA)
#warning "cuda_runtime_api.h is not on the include path: slots use mmap + mlock"
#endif

// ----------------------------------------------------------------------------
// CUDA

int dsrt__cuda_device_count(void) {
#ifdef DSRT_HOSTMEM_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver or no device: clear the sticky error and say none. */
        (void)cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

#ifdef DSRT_HOSTMEM_CUDA
/* cudaHostAlloc on device gpu; 0, or nonzero to fall back to mmap. */
static int cuda_alloc(dsrt_host_mem *m, size_t bytes, int gpu) {
    int n = dsrt__cuda_device_count();
    if (n <= 0) return -ENODEV;
    int dev = gpu < 0 ? 0 : gpu;
    if (dev >= n) return -ENODEV;
    /* The caller's current device is theirs: restore it afterwards. */
    int old = -1;
    if (cudaGetDevice(&old) != cudaSuccess) {
        (void)cudaGetLastError();
        old = -1;
    }
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -ENODEV;
    }
    void *p = NULL;
    e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (old >= 0 && old != dev && cudaSetDevice(old) != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess || !p) {
        (void)cudaGetLastError();
        return -ENOMEM;
    }
    memset(p, 0, bytes);
    m->ptr = p;
    m->bytes = bytes;
    m->cuda = 1;
    m->locked = 1;
    return 0;
}
#endif

// ----------------------------------------------------------------------------
// Allocate and free

int dsrt__host_alloc(dsrt_host_mem *m, size_t bytes, int gpu) {
    memset(m, 0, sizeof *m);
    if (bytes == 0) bytes = 1;
#ifdef DSRT_HOSTMEM_CUDA
    if (cuda_alloc(m, bytes, gpu) == 0) return 0;
#else
    (void)gpu;
#endif
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return dsrt__fail(-ENOMEM, "pipeline: out of memory: %zu bytes of batch slots", bytes);
    m->ptr = p;
    m->bytes = bytes;
    /* EPERM (no CAP_IPC_LOCK) and ENOMEM (over RLIMIT_MEMLOCK) leave the
     * memory usable, only unlocked. */
    m->locked = mlock(p, bytes) == 0;
    return 0;
}

void dsrt__host_free(dsrt_host_mem *m) {
    if (!m->ptr) return;
#ifdef DSRT_HOSTMEM_CUDA
    if (m->cuda) {
        if (cudaFreeHost(m->ptr) != cudaSuccess) (void)cudaGetLastError();
        memset(m, 0, sizeof *m);
        return;
    }
#endif
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
