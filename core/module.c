/*
 * The module loader (core/module.h says what a module is). It finds
 * dsrt_<name>.so, loads it with dlopen, checks its entry, and keeps it for
 * the life of the process; a failure is kept too, with its message, so that
 * a table asked again answers at once and the same way.
 *
 * A library that cannot be loaded is named as the dynamic loader names it
 * (dlerror), with the package that provides it, from one table. The loader
 * never prints and never fails at program start: only the call that asks
 * for a module can fail, with the message.
 */
#include "core/module.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set by the build: the folder an install puts the modules in. */
#ifndef DSRT_MODULE_INSTALL_DIR
#define DSRT_MODULE_INSTALL_DIR ""
#endif
#ifndef DSRT_CUDA_MAJOR
#define DSRT_CUDA_MAJOR "13"
#endif

#define MODULES_MAX 16

// ----------------------------------------------------------------------------
// Which package provides a library

static const struct {
    const char *library; /* as the dynamic loader names it, without the version */
    const char *package;
} PROVIDERS[] = {
    {"libcudart.so", "the CUDA runtime: NVIDIA's package cuda-cudart-" DSRT_CUDA_MAJOR
                     "-0, or pip install nvidia-cuda-runtime"},
    {"libcublasLt.so",
     "cuBLAS: NVIDIA's package libcublas-" DSRT_CUDA_MAJOR "-0, or pip install nvidia-cublas"},
    {"libcublas.so",
     "cuBLAS: NVIDIA's package libcublas-" DSRT_CUDA_MAJOR "-0, or pip install nvidia-cublas"},
    {"libcudnn", "cuDNN 9: NVIDIA's package libcudnn9-cuda-" DSRT_CUDA_MAJOR
                 ", or pip install nvidia-cudnn-cu" DSRT_CUDA_MAJOR},
    {"libnccl.so",
     "NCCL 2: NVIDIA's package libnccl2, or pip install nvidia-nccl-cu" DSRT_CUDA_MAJOR},
    {"libcuda.so", "the NVIDIA driver"},
    {"libmpi.so", "Open MPI: Debian's package libopenmpi3 (and openmpi-bin for mpirun)"},
    {"libopen-pal.so", "Open MPI: Debian's package libopenmpi3"},
    {"libopen-rte.so", "Open MPI: Debian's package libopenmpi3"},
    {"libdsrt_train.so", "dsrt's training library, installed beside libdsrt"},
    {"libdsrt.so", "dsrt's data library"},
};

/* The package of the first library of the table that msg names; NULL
 * when none. */
static const char *provider(const char *msg) {
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(PROVIDERS); i++)
        if (strstr(msg, PROVIDERS[i].library)) return PROVIDERS[i].package;
    return NULL;
}

// ----------------------------------------------------------------------------
// Where modules are

/* The folder of the object holding this loader: libdsrt.so, or the
 * program or extension that links dsrt statically. */
static int own_folder(char *buf, size_t size) {
    Dl_info info;
    if (!dladdr((void *)own_folder, &info) || !info.dli_fname || !info.dli_fname[0]) return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return -1;
    size_t n = (size_t)(slash - info.dli_fname);
    if (n + 1 > size) return -1;
    memcpy(buf, info.dli_fname, n);
    buf[n] = 0;
    return 0;
}

int dsrt__module_path(char *buf, size_t size) {
    const char *env = getenv("DSRT_MODULE_PATH");
    if (env) {
        int n = snprintf(buf, size, "%s", env);
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
    }
    char own[1024];
    int n;
    if (own_folder(own, sizeof own) == 0)
        n = snprintf(buf, size, "%s/dsrt:%s%s%s", own, own, DSRT_MODULE_INSTALL_DIR[0] ? ":" : "",
                     DSRT_MODULE_INSTALL_DIR);
    else
        n = snprintf(buf, size, "%s", DSRT_MODULE_INSTALL_DIR);
    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

// ----------------------------------------------------------------------------
// Loading

/* The process-wide record of the modules loaded (or refused): the dynamic
 * loader's own state is process-wide, and a module is loaded once. */
typedef struct {
    const char *name;
    const dsrt_module_entry *entry; /* NULL: it failed */
    int rc;
    char msg[3072];
} module_slot;

static pthread_mutex_t modules_mu = PTHREAD_MUTEX_INITIALIZER;
static module_slot modules[MODULES_MAX];
static int n_modules;

/* Checks an entry against the spec; 0, or the reason in msg. */
static int check_entry(const dsrt_module_spec *spec, const dsrt_module_entry *e, const char *path,
                       char *msg, size_t size) {
    if (e->abi != DSRT_MODULE_ABI || e->version != DSRT_VERSION_NUMBER || !e->name ||
        strcmp(e->name, spec->name) != 0 || !e->ops) {
        snprintf(msg, size,
                 "%s: module %s is of another build of dsrt (its version %d, interface %d; "
                 "this dsrt's %d, %d): install the modules that came with this library",
                 spec->what, path, e->version, e->abi, DSRT_VERSION_NUMBER, DSRT_MODULE_ABI);
        return -1;
    }
    int core_ok = !spec->uses_dsrt || e->core_anchor == (const void *)dsrt__fail;
    int train_ok = !spec->train_anchor || e->train_anchor == spec->train_anchor;
    if (!core_ok || !train_ok) {
        snprintf(msg, size,
                 "%s: module %s calls a second copy of dsrt, not this program's: a program that "
                 "links dsrt statically must export its symbols for modules (link it with "
                 "-Wl,--export-dynamic, CMake's ENABLE_EXPORTS), or link the shared libraries",
                 spec->what, path);
        return -1;
    }
    return 0;
}

/* A module linked into the program itself (its entry visible to dlsym). */
static const dsrt_module_entry *linked_in(const char *symbol) {
    return (const dsrt_module_entry *)dlsym(RTLD_DEFAULT, symbol);
}

/* Finds and loads the module; fills slot. */
static void load(const dsrt_module_spec *spec, module_slot *s) {
    char file[128], symbol[128], path[1024], dirs[4096];
    snprintf(file, sizeof file, "dsrt_%s.so", spec->name);
    snprintf(symbol, sizeof symbol, "dsrt_module_%s", spec->name);
    s->rc = DSRT_EMODULE;
    const dsrt_module_entry *e = linked_in(symbol);
    if (e) {
        if (check_entry(spec, e, "linked in", s->msg, sizeof s->msg) == 0) {
            s->entry = e;
            s->rc = 0;
        }
        return;
    }
    if (dsrt__module_path(dirs, sizeof dirs) != 0) {
        snprintf(s->msg, sizeof s->msg, "%s: the module path is too long", spec->what);
        return;
    }
    const char *found = NULL;
    for (char *dir = dirs, *next; dir; dir = next) {
        next = strchr(dir, ':');
        if (next) *next++ = 0;
        if (!*dir) continue;
        int n = snprintf(path, sizeof path, "%s/%s", dir, file);
        if (n > 0 && (size_t)n < sizeof path && access(path, F_OK) == 0) {
            found = path;
            break;
        }
    }
    if (!found) {
        dsrt__module_path(dirs, sizeof dirs);
        snprintf(s->msg, sizeof s->msg,
                 "%s: module %s not found in %.2048s%s; dsrt installs it in lib/dsrt/, beside "
                 "libdsrt, when it is built with %s",
                 spec->what, file, dirs[0] ? dirs : "(no folder)",
                 getenv("DSRT_MODULE_PATH") ? " (from DSRT_MODULE_PATH)" : "", spec->needs);
        return;
    }
    /* Local: a module's libraries stay out of the program's namespace. MPI
     * too: Open MPI (>= 3.0) links its own plugins against libmpi, so they
     * need no global libmpi. */
    dlerror();
    void *h = dlopen(found, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", why ? why : "unknown reason");
        const char *pkg = provider(reason);
        if (strstr(reason, "undefined symbol"))
            snprintf(s->msg, sizeof s->msg,
                     "%s: module %s cannot be loaded: %s (a library it needs is of another "
                     "version than dsrt was built with: %s)",
                     spec->what, found, reason, spec->needs);
        else if (pkg)
            snprintf(s->msg, sizeof s->msg, "%s: module %s cannot be loaded: %s; it is in %s",
                     spec->what, found, reason, pkg);
        else
            snprintf(s->msg, sizeof s->msg, "%s: module %s cannot be loaded: %s (it needs %s)",
                     spec->what, found, reason, spec->needs);
        return;
    }
    e = (const dsrt_module_entry *)dlsym(h, symbol);
    if (!e) {
        snprintf(s->msg, sizeof s->msg, "%s: %s is not a dsrt module (no %s)", spec->what, found,
                 symbol);
        dlclose(h);
        return;
    }
    if (check_entry(spec, e, found, s->msg, sizeof s->msg) != 0) {
        dlclose(h);
        return;
    }
    /* The handle stays open for the life of the process: ops tables and
     * the libraries' own state live in it. */
    s->entry = e;
    s->rc = 0;
}

int dsrt__module_load(const dsrt_module_spec *spec, const void **ops) {
    *ops = NULL;
    if (!spec->built) return dsrt__fail(DSRT_EUNSUPPORTED, "%s: %s", spec->what, spec->unbuilt);
    pthread_mutex_lock(&modules_mu);
    module_slot *s = NULL;
    for (int i = 0; i < n_modules; i++)
        if (!strcmp(modules[i].name, spec->name)) s = &modules[i];
    if (!s && n_modules < MODULES_MAX) {
        s = &modules[n_modules++];
        memset(s, 0, sizeof *s);
        s->name = spec->name;
        load(spec, s);
    }
    int rc = s ? s->rc : DSRT_EMODULE;
    if (s && s->entry) *ops = s->entry->ops;
    char msg[sizeof s->msg];
    snprintf(msg, sizeof msg, "%s", s ? s->msg : "too many modules");
    pthread_mutex_unlock(&modules_mu);
    return rc ? dsrt__fail(rc, "%s", msg) : 0;
}

int dsrt__module_loaded(const dsrt_module_spec *spec, const void **ops) {
    *ops = NULL;
    pthread_mutex_lock(&modules_mu);
    for (int i = 0; i < n_modules; i++)
        if (!strcmp(modules[i].name, spec->name) && modules[i].entry) *ops = modules[i].entry->ops;
    pthread_mutex_unlock(&modules_mu);
    return *ops ? 0 : -1;
}
