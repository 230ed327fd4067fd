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
 *
 * Before dlopen runs any of a module's code, its file is checked: a regular
 * file, an ELF shared object for this machine whose segments all lie inside
 * it (a truncated file would fault the loader with SIGBUS when it touches a
 * mapped page past the end), carrying dsrt's note with this build's
 * interface and version (another build's module is refused before its
 * constructors could run). A module found in a folder every user may write
 * to, or through a relative folder of DSRT_MODULE_PATH, is loaded with a
 * warning (dsrt_module_warnings).
 */
#include "core/module.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
// Checking a module's file before it is loaded

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#endif

#define MAX_PHDRS       512
#define MAX_NOTES_BYTES 65536

/* Whether [off, off + len) lies inside a file of size bytes. */
static int inside(uint64_t off, uint64_t len, uint64_t size) {
    return off <= size && len <= size - off;
}

/* Whether the notes in buf (n bytes, ELF layout) hold dsrt's; its
 * description in *out. */
static int find_note(const unsigned char *buf, size_t n, dsrt_module_note *out) {
    size_t at = 0;
    while (n - at >= sizeof(Elf64_Nhdr)) {
        Elf64_Nhdr h;
        memcpy(&h, buf + at, sizeof h);
        size_t name_pad = ((size_t)h.n_namesz + 3) & ~(size_t)3;
        size_t desc_pad = ((size_t)h.n_descsz + 3) & ~(size_t)3;
        at += sizeof h;
        if (h.n_namesz > n - at || name_pad > n - at) return 0;
        const unsigned char *name = buf + at;
        at += name_pad;
        if (h.n_descsz > n - at) return 0;
        if (h.n_type == DSRT_MODULE_NOTE_TYPE && h.n_namesz == 5 && !memcmp(name, "dsrt", 5) &&
            h.n_descsz == sizeof out->desc) {
            memcpy(&out->desc, buf + at, sizeof out->desc);
            out->desc.module[sizeof out->desc.module - 1] = 0;
            return 1;
        }
        if (desc_pad > n - at) return 0;
        at += desc_pad;
    }
    return 0;
}

/* Checks the file at path as a module for spec: 0, or -1 with the reason
 * in msg. Reads the file; loads nothing. */
static int check_file(const dsrt_module_spec *spec, const char *path, char *msg, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(msg, size, "%s: module %s cannot be opened: %s", spec->what, path,
                 strerror(errno));
        return -1;
    }
    Elf64_Phdr *ph = NULL;
    unsigned char *notes = NULL;
    int found = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(msg, size, "%s: module %s is not a regular file", spec->what, path);
        goto fail;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    Elf64_Ehdr eh;
    if (fsize < sizeof eh || pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh) {
        snprintf(msg, size,
                 "%s: module %s is truncated or not a shared object (%llu bytes, less than an "
                 "ELF header): install the modules that came with this library",
                 spec->what, path, (unsigned long long)fsize);
        goto fail;
    }
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] !=
            (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB) ||
        eh.e_type != ET_DYN) {
        snprintf(msg, size,
                 "%s: module %s is not a 64-bit shared object of this machine's byte order",
                 spec->what, path);
        goto fail;
    }
#ifdef HOST_MACHINE
    if (eh.e_machine != HOST_MACHINE) {
        snprintf(msg, size,
                 "%s: module %s is built for another processor (ELF machine %u, this one %u)",
                 spec->what, path, (unsigned)eh.e_machine, (unsigned)HOST_MACHINE);
        goto fail;
    }
#endif
    uint64_t ph_bytes = (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr);
    if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > MAX_PHDRS ||
        !inside(eh.e_phoff, ph_bytes, fsize) ||
        (eh.e_shnum && !inside(eh.e_shoff, (uint64_t)eh.e_shnum * eh.e_shentsize, fsize))) {
        snprintf(msg, size,
                 "%s: module %s is truncated or damaged: its headers lie past its end "
                 "(%llu bytes): install the modules that came with this library",
                 spec->what, path, (unsigned long long)fsize);
        goto fail;
    }
    ph = malloc(ph_bytes);
    if (!ph || pread(fd, ph, ph_bytes, (off_t)eh.e_phoff) != (ssize_t)ph_bytes) {
        snprintf(msg, size, "%s: module %s cannot be read", spec->what, path);
        goto fail;
    }
    dsrt_module_note note;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (!inside(ph[i].p_offset, ph[i].p_filesz, fsize)) {
            snprintf(msg, size,
                     "%s: module %s is truncated: its segment %d ends at byte %llu, the file "
                     "has %llu: install the modules that came with this library",
                     spec->what, path, i, (unsigned long long)(ph[i].p_offset + ph[i].p_filesz),
                     (unsigned long long)fsize);
            goto fail;
        }
        if (ph[i].p_type != PT_NOTE || found || ph[i].p_filesz > MAX_NOTES_BYTES) continue;
        unsigned char *nb = realloc(notes, ph[i].p_filesz ? ph[i].p_filesz : 1);
        if (!nb) goto fail;
        notes = nb;
        if (pread(fd, notes, ph[i].p_filesz, (off_t)ph[i].p_offset) != (ssize_t)ph[i].p_filesz)
            continue;
        found = find_note(notes, ph[i].p_filesz, &note);
    }
    if (!found) {
        snprintf(msg, size,
                 "%s: %s is not a module of this build of dsrt (it carries no dsrt note): "
                 "install the modules that came with this library",
                 spec->what, path);
        goto fail;
    }
    if (note.desc.abi != DSRT_MODULE_ABI || note.desc.version != DSRT_VERSION_NUMBER ||
        strcmp(note.desc.module, spec->name) != 0) {
        snprintf(msg, size,
                 "%s: module %s is of another build of dsrt (module '%s', version %d, interface "
                 "%d; this dsrt's '%s', %d, %d): install the modules that came with this library",
                 spec->what, path, note.desc.module, (int)note.desc.version, (int)note.desc.abi,
                 spec->name, DSRT_VERSION_NUMBER, DSRT_MODULE_ABI);
        found = 0;
        goto fail;
    }
    free(ph);
    free(notes);
    close(fd);
    return 0;
fail:
    free(ph);
    free(notes);
    close(fd);
    return -1;
}

// ----------------------------------------------------------------------------
// Warnings

static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;
static char warnings[4096];
static _Thread_local char warnings_copy[sizeof warnings];

/* Adds a line to the loader's warnings (once: a repeated line is dropped). */
static void warn(const char *line) {
    pthread_mutex_lock(&warn_mu);
    size_t n = strlen(warnings), k = strlen(line);
    if (!strstr(warnings, line) && n + k + 2 <= sizeof warnings) {
        memcpy(warnings + n, line, k);
        warnings[n + k] = '\n';
        warnings[n + k + 1] = 0;
    }
    pthread_mutex_unlock(&warn_mu);
}

const char *dsrt_module_warnings(void) {
    pthread_mutex_lock(&warn_mu);
    memcpy(warnings_copy, warnings, sizeof warnings);
    pthread_mutex_unlock(&warn_mu);
    return warnings_copy;
}

/* Warns when the module at path (found in folder dir, as the module path
 * gives it) could have been put there by anyone: a folder every user may
 * write to, or a relative folder (it depends on the working directory). */
static void check_folder(const dsrt_module_spec *spec, const char *dir, const char *path) {
    char line[1400];
    if (dir[0] != '/') {
        snprintf(line, sizeof line,
                 "%s: module %.1024s was found through the relative folder '%.128s' of the module "
                 "path: it depends on the working directory; give an absolute folder",
                 spec->what, path, dir);
        warn(line);
    }
    struct stat st;
    if (stat(dir, &st) == 0 && (st.st_mode & S_IWOTH)) {
        snprintf(line, sizeof line,
                 "%s: module %.1024s is in a folder every user may write to (%.128s): anyone "
                 "could replace it; make the folder writable by its owner only",
                 spec->what, path, dir);
        warn(line);
    }
    if (stat(path, &st) == 0 && (st.st_mode & S_IWOTH)) {
        snprintf(line, sizeof line,
                 "%s: module %.1024s is writable by every user: make it writable by its owner only",
                 spec->what, path);
        warn(line);
    }
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
    /* The first regular file of that name: a folder or a device named like
     * a module does not end the search. */
    const char *found = NULL, *found_dir = NULL;
    for (char *dir = dirs, *next; dir; dir = next) {
        next = strchr(dir, ':');
        if (next) *next++ = 0;
        if (!*dir) continue;
        int n = snprintf(path, sizeof path, "%s/%s", dir, file);
        struct stat st;
        if (n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            found = path;
            found_dir = dir;
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
    if (check_file(spec, found, s->msg, sizeof s->msg) != 0) return;
    check_folder(spec, found_dir, found);
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
