/*
 * Which cores the pipeline's workers run on, and binding them there, with
 * hwloc. By default a worker gets each core this process may run on (its
 * affinity mask within the cgroup's cpuset), or, for a pipeline that feeds
 * CUDA device N, each core near that device (its PCI bus's local CPUs, as
 * sysfs lists them for the bus id the CUDA host module gives), so that a
 * batch is made on the NUMA node the copy to the GPU starts from. A
 * CPU list given by the user replaces either choice. Each worker is bound to
 * all the hardware threads of its core that are in the chosen set: one
 * worker per core keeps TurboJPEG's and the augmenter's working sets in that
 * core's caches.
 */
#include "platform/internal.h"

#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctype.h>
#include <hwloc/linux.h>

struct dsrt_cpus {
    hwloc_topology_t topo;
    hwloc_bitmap_t set;    /* the chosen CPUs */
    hwloc_bitmap_t *cores; /* (ncores) each core's CPUs within set */
    unsigned ncores;
    char *list; /* set in list form */
};

// ----------------------------------------------------------------------------
// Choosing the CPUs

/* The CPUs this process may run on: its affinity within the topology's
 * allowed set (the cgroup's cpuset). */
static int process_cpus(hwloc_topology_t topo, hwloc_bitmap_t out) {
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    if (hwloc_get_cpubind(topo, out, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(out))
        hwloc_bitmap_copy(out, allowed);
    else
        hwloc_bitmap_and(out, out, allowed);
    if (hwloc_bitmap_iszero(out)) hwloc_bitmap_copy(out, hwloc_topology_get_topology_cpuset(topo));
    return hwloc_bitmap_iszero(out) ? -ENODEV : 0;
}

/* Parses the user's list strictly: digits, commas and dashes only, and
 * every CPU one the process may use. */
static int user_cpus(hwloc_topology_t topo, const char *list, hwloc_bitmap_t avail,
                     hwloc_bitmap_t out) {
    int ok = list[0] != '\0';
    for (const char *s = list; *s; s++)
        if (!((*s >= '0' && *s <= '9') || *s == ',' || *s == '-')) ok = 0;
    if (!ok || hwloc_bitmap_list_sscanf(out, list) != 0 || hwloc_bitmap_iszero(out))
        return dsrt__fail(DSRT_EOPTION, "pipeline: cpus: \"%s\": not a CPU list like \"0-3,8\"",
                          list);
    if (!hwloc_bitmap_isincluded(out, avail)) {
        char *a = NULL, *bad = NULL;
        hwloc_bitmap_t miss = hwloc_bitmap_alloc();
        if (miss) {
            hwloc_bitmap_andnot(miss, out, avail);
            hwloc_bitmap_list_asprintf(&bad, miss);
            hwloc_bitmap_free(miss);
        }
        hwloc_bitmap_list_asprintf(&a, avail);
        int rc = dsrt__fail(
            DSRT_EOPTION, "pipeline: cpus: \"%s\": CPU %s not available (this process may use %s)",
            list, bad ? bad : "?", a ? a : "?");
        free(a);
        free(bad);
        return rc;
    }
    return 0;
}

/* The CPUs near CUDA device gpu, within avail; leaves out unchanged when
 * the device is not there or the bus does not say. */
static void cuda_cpus(int gpu, hwloc_const_bitmap_t avail, hwloc_bitmap_t out) {
    const dsrt_cuda_host_ops *ops;
    char bus[64], path[160];
    if (dsrt__cuda_host(&ops) != 0 || gpu >= ops->devices(NULL, 0)) return;
    if (ops->pci_bus_id(gpu, bus, sizeof bus) != 0) return;
    for (char *c = bus; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpus", bus);
    hwloc_bitmap_t near = hwloc_bitmap_alloc();
    if (!near) return;
    if (hwloc_linux_read_path_as_cpumask(path, near) == 0) {
        hwloc_bitmap_and(near, near, avail);
        if (!hwloc_bitmap_iszero(near)) hwloc_bitmap_copy(out, near);
    }
    hwloc_bitmap_free(near);
}

// ----------------------------------------------------------------------------
// Open, bind, close

int dsrt__cpus_open(dsrt_cpus **out, const char *list, int gpu, unsigned *threads) {
    *out = NULL;
    int rc = -ENOMEM;
    hwloc_bitmap_t avail = NULL;
    dsrt_cpus *c = dsrt__calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    if (hwloc_topology_init(&c->topo) != 0) {
        c->topo = NULL;
        rc = dsrt__fail(-ENOMEM, "pipeline: hwloc_topology_init failed");
        goto fail;
    }
    if (hwloc_topology_load(c->topo) != 0) {
        rc = dsrt__fail(-errno ? -errno : -EIO, "pipeline: hwloc_topology_load: %s",
                        strerror(errno));
        goto fail;
    }
    avail = hwloc_bitmap_alloc();
    c->set = hwloc_bitmap_alloc();
    if (!avail || !c->set) goto fail;
    if ((rc = process_cpus(c->topo, avail)) != 0) {
        dsrt__fail(rc, "pipeline: hwloc finds no CPU this process may run on");
        goto fail;
    }
    if (list) {
        if ((rc = user_cpus(c->topo, list, avail, c->set)) != 0) goto fail;
    } else {
        hwloc_bitmap_copy(c->set, avail);
        if (gpu >= 0) cuda_cpus(gpu, avail, c->set);
    }
    rc = -ENOMEM;

    /* One entry per core that has a chosen CPU; PUs when hwloc knows no cores. */
    hwloc_obj_type_t type =
        hwloc_get_nbobjs_by_type(c->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int nobj = hwloc_get_nbobjs_by_type(c->topo, type);
    c->cores = dsrt__calloc((size_t)(nobj > 0 ? nobj : 1), sizeof *c->cores);
    if (!c->cores) goto fail;
    for (int i = 0; i < nobj; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(c->topo, type, (unsigned)i);
        if (!o || !o->cpuset || !hwloc_bitmap_intersects(o->cpuset, c->set)) continue;
        hwloc_bitmap_t s = hwloc_bitmap_alloc();
        if (!s) goto fail;
        hwloc_bitmap_and(s, o->cpuset, c->set);
        c->cores[c->ncores++] = s;
    }
    if (c->ncores == 0) {
        /* The set lies outside every core hwloc reports: one entry for all. */
        if (!(c->cores[0] = hwloc_bitmap_dup(c->set))) goto fail;
        c->ncores = 1;
    }
    if (hwloc_bitmap_list_asprintf(&c->list, c->set) < 0) {
        c->list = NULL;
        goto fail;
    }
    if (*threads == 0) *threads = c->ncores;
    hwloc_bitmap_free(avail);
    *out = c;
    return 0;

fail:
    if (rc == -ENOMEM) dsrt__fail(rc, "pipeline: out of memory choosing cores");
    hwloc_bitmap_free(avail);
    dsrt__cpus_close(c);
    return rc;
}

int dsrt__cpus_bind(dsrt_cpus *c, unsigned w) {
    if (hwloc_set_cpubind(c->topo, c->cores[w % c->ncores], HWLOC_CPUBIND_THREAD) != 0)
        return errno ? -errno : -EINVAL;
    return 0;
}

const char *dsrt__cpus_list(const dsrt_cpus *c) {
    return c->list;
}

unsigned dsrt__cpus_cores(const dsrt_cpus *c) {
    return c->ncores;
}

void dsrt__cpus_close(dsrt_cpus *c) {
    if (!c) return;
    for (unsigned i = 0; i < c->ncores; i++) hwloc_bitmap_free(c->cores[i]);
    free(c->cores);
    free(c->list);
    hwloc_bitmap_free(c->set);
    if (c->topo) hwloc_topology_destroy(c->topo);
    free(c);
}

// ----------------------------------------------------------------------------
// Caches

/* The first line of the file at path into buf: 0, or -1. */
static int read_line(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok ? 0 : -1;
}

size_t dsrt__cache_bytes(int level) {
    int cpu = sched_getcpu();
    if (cpu < 0) cpu = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], line[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu, i);
        if (read_line(path, line, sizeof line) != 0) break;
        if (atoi(line) != level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/type", cpu, i);
        if (read_line(path, line, sizeof line) != 0 || !strncmp(line, "Instruction", 11)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, i);
        if (read_line(path, line, sizeof line) != 0) continue;
        char *end;
        unsigned long long v = strtoull(line, &end, 10);
        size_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1;
        return (size_t)v * unit;
    }
    return 0;
}
