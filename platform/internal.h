/*
 * The platform layer: the cores threads run on (hwloc), CUDA devices as the
 * input side sees them, and page-locked host memory for batch slots (mmap,
 * then cudaHostRegister through the CUDA host module for a pipeline that
 * feeds a GPU, else mlock). It stands on core/ alone, below everything that
 * makes threads or fills memory: the pipeline (runtime/pipeline/), the
 * networks' backend table (nn/) and the training loop (runtime/train/).
 * Nothing here is public; names carry a double underscore.
 */
#ifndef DSRT_PLATFORM_INTERNAL_H
#define DSRT_PLATFORM_INTERNAL_H

#include <stddef.h>

#include "core/internal.h"

// ----------------------------------------------------------------------------
// Cores

/* The cores chosen for a team of threads, and the topology to bind them. */
typedef struct dsrt_cpus dsrt_cpus;

/*
 * Picks the cores for `threads` threads (0: one per core). list is an OS CPU
 * list ("0-3,8") or NULL: the cores near CUDA device gpu (>= 0, when the
 * CUDA host module loads and the device is there), else every core this
 * process may run on. Fails with DSRT_EOPTION ("cpus: ...") when the list is malformed or
 * names no CPU the process may use. *threads is set to the team's size.
 */
int dsrt__cpus_open(dsrt_cpus **c, const char *list, int gpu, unsigned *threads);
/* Binds the calling thread to the core of worker w. Returns 0 or -errno. */
int dsrt__cpus_bind(dsrt_cpus *c, unsigned w);
/* The CPUs in use, in list form. */
const char *dsrt__cpus_list(const dsrt_cpus *c);
/* Cores among them. */
unsigned dsrt__cpus_cores(const dsrt_cpus *c);
void dsrt__cpus_close(dsrt_cpus *c);

/* Bytes of the data (or unified) cache of the given level (1 to 3) that
 * the calling thread's CPU has, as one core group shares it (Linux's
 * /sys/devices/system/cpu/cpuN/cache, which says 32 MiB for a Zen core
 * complex's L3 where sysconf sums the package's); 0 when unknown. */
size_t dsrt__cache_bytes(int level);

// ----------------------------------------------------------------------------
// CUDA devices and host memory

/* The CUDA host module's table (platform/cuda_host/hostmem_cuda.c): the CUDA runtime
 * calls of the input side, loaded when a pipeline names a device. */
typedef struct {
    /* Devices visible; 0 with a sentence in why[size] (why may be NULL). */
    int (*devices)(char *why, size_t size);
    /* Page-locks [p, p + bytes) for every device (portable), device made
     * current meanwhile. 0, or -ENOMEM with the reason in why. */
    int (*host_register)(void *p, size_t bytes, int device, char *why, size_t size);
    void (*host_unregister)(void *p);
    /* "0000:3b:00.0": 0 or -ENODEV. */
    int (*pci_bus_id)(int device, char *buf, size_t size);
} dsrt_cuda_host_ops;

/* Loads the CUDA host module on first use: 0 and its table, or the loader's
 * error (the module, the library, the package). */
int dsrt__cuda_host(const dsrt_cuda_host_ops **ops);

/* CUDA devices visible, through the CUDA host module: 0 when it cannot be
 * loaded or the driver has none, with the reason in why (may be NULL). Never
 * fails otherwise. */
int dsrt__cuda_devices(char *why, size_t size);
int dsrt__cuda_device_count(void);

/* Host memory for slots: page-aligned, zeroed. */
typedef struct {
    void *ptr;
    size_t bytes;
    int cuda;   /* registered with CUDA (cudaHostRegister) */
    int locked; /* page-locked: registered, or mlock succeeded */
} dsrt_host_mem;

/*
 * Allocates bytes of host memory with mmap, page-locked: for CUDA device gpu
 * (>= 0) registered with CUDA (portable: pinned for every device) when the
 * CUDA host module loads and the device is there, else (and for gpu -1)
 * mlock'ed where the limits allow (EPERM and ENOMEM from mlock are not
 * errors: locked stays 0). Returns 0 or -ENOMEM.
 */
int dsrt__host_alloc(dsrt_host_mem *m, size_t bytes, int gpu);
/* Frees what dsrt__host_alloc gave. A zeroed m is accepted. */
void dsrt__host_free(dsrt_host_mem *m);

#endif
