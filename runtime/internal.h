/*
 * runtime/ internals shared by its files: the cores the threads run on
 * (hwloc), and page-locked host memory for batch slots (cudaHostAlloc, or
 * mmap + mlock). Nothing here is public; names carry a double underscore.
 */
#ifndef DSRT_RUNTIME_INTERNAL_H
#define DSRT_RUNTIME_INTERNAL_H

#include <stddef.h>

#include "core/internal.h"

#include <dsrt/datastore.h>

// ----------------------------------------------------------------------------
// Cores

/* The cores chosen for a team of threads, and the topology to bind them. */
typedef struct dsrt_cpus dsrt_cpus;

/*
 * Picks the cores for `threads` threads (0: one per core). list is an OS CPU
 * list ("0-3,8") or NULL: the cores near CUDA device gpu (-1: the first; only
 * when built with CUDA and one is present), else every core this process may
 * run on. Fails with DSRT_EOPTION ("cpus: ...") when the list is malformed or
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

// ----------------------------------------------------------------------------
// CUDA devices and host memory

/* CUDA devices present: 0 when built without CUDA or when the driver has
 * none (never fails). */
int dsrt__cuda_device_count(void);

/* Host memory for slots: page-aligned, zeroed. */
typedef struct {
    void *ptr;
    size_t bytes;
    int cuda;   /* from cudaHostAlloc */
    int locked; /* page-locked: cudaHostAlloc, or mlock succeeded */
} dsrt_host_mem;

/*
 * Allocates bytes of host memory: with cudaHostAlloc (portable, pinned for
 * every device) when built with CUDA and a device is present (gpu: the device
 * to make current first, -1 for the first), else mmap'd and mlock'ed where
 * the limits allow (EPERM and ENOMEM from mlock are not errors: locked stays
 * 0). Returns 0 or -ENOMEM.
 */
int dsrt__host_alloc(dsrt_host_mem *m, size_t bytes, int gpu);
/* Frees what dsrt__host_alloc gave. A zeroed m is accepted. */
void dsrt__host_free(dsrt_host_mem *m);

/* Copies the fields of src that are set (non-zero) into dst: a training
 * run's object-store options over the reader's defaults. */
static inline void dsrt__remote_apply(dsrt_remote_options *dst, const dsrt_remote_options *src) {
    if (src->depth) dst->depth = src->depth;
    if (src->max_connections) dst->max_connections = src->max_connections;
    if (src->retry_deadline_s > 0) dst->retry_deadline_s = src->retry_deadline_s;
    if (src->timeout_s > 0) dst->timeout_s = src->timeout_s;
}

#endif
