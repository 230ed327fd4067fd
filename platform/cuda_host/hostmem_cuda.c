/*
 * The CUDA host module (dsrt_cuda_host.so): the few CUDA runtime calls the
 * input pipeline makes when its batches go to a GPU. It counts the visible
 * devices, page-locks batch slots for a device with cudaHostRegister (so
 * the copies to the GPU run asynchronously from them) and gives a device's
 * PCI bus id (so the workers run on the cores near it).
 *
 * libdsrt loads it only when a pipeline, or dsrt_pinned_alloc, names a CUDA
 * device, so a program that only reads images never maps the CUDA runtime.
 * It calls nothing of dsrt itself, so it serves libdsrt.so and programs
 * that link dsrt statically (the Python extension) alike.
 */
#include "core/module.h"
#include "platform/internal.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

static int host_devices(char *why, size_t size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver or no device: clear the sticky error and say none. */
        (void)cudaGetLastError();
        if (why && size)
            snprintf(why, size, "no usable CUDA device (the CUDA runtime says: %s)",
                     cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why && size) snprintf(why, size, "no CUDA device is visible on this machine");
    return n;
}

/* Runs with device current, then gives the caller's current device back. */
static int host_register(void *p, size_t bytes, int device, char *why, size_t size) {
    int old = -1;
    if (cudaGetDevice(&old) != cudaSuccess) {
        (void)cudaGetLastError();
        old = -1;
    }
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (old >= 0 && old != device && cudaSetDevice(old) != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why && size) snprintf(why, size, "cudaHostRegister: %s", cudaGetErrorString(e));
        return -ENOMEM;
    }
    return 0;
}

static void host_unregister(void *p) {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

static int host_pci_bus_id(int device, char *buf, size_t size) {
    cudaError_t e = cudaDeviceGetPCIBusId(buf, (int)size, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -ENODEV;
    }
    return 0;
}

static const dsrt_cuda_host_ops cuda_host_ops = {
    .devices = host_devices,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .pci_bus_id = host_pci_bus_id,
};

/* Calls nothing of dsrt: no anchors to check. */
DSRT_MODULE_NOTE(cuda_host);
DSRT_MODULE_EXPORT const dsrt_module_entry dsrt_module_cuda_host = {
    .abi = DSRT_MODULE_ABI,
    .version = DSRT_VERSION_NUMBER,
    .name = "cuda_host",
    .ops = &cuda_host_ops,
};
