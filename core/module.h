/*
 * Modules: the parts of dsrt that need a large or optional library (the CUDA
 * runtime, cuBLAS and cuDNN, NCCL, MPI) are shared objects that the backend
 * and communicator tables load with dlopen the first time a run asks for
 * them, so that a program that only reads images maps none of those
 * libraries, and a machine without them runs everything else.
 *
 * A module is the file dsrt_<name>.so, exporting one entry, the constant
 * dsrt_module_<name> (DSRT_MODULE_DEFINE), whose ops are the module's table
 * (a dsrt_backend_ops, a communicator engine, the pinned-memory calls). It
 * is looked for in each folder of $DSRT_MODULE_PATH (colon-separated) when
 * that is set, else in the folder dsrt/ beside the library or program that
 * holds this loader (lib/dsrt/ for an install, build/dsrt/ in the build
 * tree) and then beside it, then in the install's module folder. A module
 * not found, or one whose libraries the loader cannot load, is one error
 * naming the module, the library and the package that provides it.
 *
 * Modules that call into dsrt link libdsrt (and libdsrt_train), and the
 * loader checks that the module bound those calls to the copy of dsrt that
 * loaded it: a program that links dsrt statically must export its symbols
 * (-Wl,--export-dynamic) for a module to use them.
 */
#ifndef DSRT_CORE_MODULE_H
#define DSRT_CORE_MODULE_H

#include "core/internal.h"

/* The layout of dsrt_module_entry and of every module's ops table: a module
 * built with another number is refused. */
#define DSRT_MODULE_ABI 1

/* What a module exports. */
typedef struct {
    int abi;          /* DSRT_MODULE_ABI */
    int version;      /* DSRT_VERSION_NUMBER of its build */
    const char *name; /* "cuda" */
    const void *ops;  /* the module's table */
    /* dsrt__fail as the module bound it (NULL: it calls nothing of dsrt),
     * and one libdsrt_train function likewise (NULL: none). */
    const void *core_anchor;
    const void *train_anchor;
} dsrt_module_entry;

#define DSRT_MODULE_EXPORT __attribute__((visibility("default")))

/* Every module file carries an ELF note (name "dsrt", type
 * DSRT_MODULE_NOTE_TYPE) with its interface, version and name, read from
 * the file before it is loaded: a module of another build is refused
 * without running any of its code (a constructor would run at dlopen). */
#define DSRT_MODULE_NOTE_TYPE 0x44535254u /* "DSRT" */

typedef struct {
    uint32_t namesz, descsz, type; /* the ELF note header: 5, sizeof desc, the type */
    char name[8];                  /* "dsrt", padded to 4 bytes */
    struct {
        int32_t abi, version; /* DSRT_MODULE_ABI, DSRT_VERSION_NUMBER */
        char module[24];      /* "cuda" */
    } desc;
} dsrt_module_note;

/* Where the note goes: its own section, kept though nothing refers to it. */
#define DSRT_MODULE_NOTE_SECTION __attribute__((section(".note.dsrt"), aligned(4), used))

#define DSRT_MODULE_NOTE(id)                                                                       \
    DSRT_MODULE_NOTE_SECTION static const dsrt_module_note dsrt_module_note_##id = {               \
        5,                                                                                         \
        sizeof(dsrt_module_note) - 20,                                                             \
        DSRT_MODULE_NOTE_TYPE,                                                                     \
        "dsrt",                                                                                    \
        {DSRT_MODULE_ABI, DSRT_VERSION_NUMBER, #id}}

/* Defines the entry of module `id` with its ops table; train_fn is a
 * libdsrt_train function the module calls, or NULL. */
#define DSRT_MODULE_DEFINE(id, ops_table, train_fn)                                                \
    DSRT_MODULE_NOTE(id);                                                                          \
    DSRT_MODULE_EXPORT const dsrt_module_entry dsrt_module_##id = {                                \
        .abi = DSRT_MODULE_ABI,                                                                    \
        .version = DSRT_VERSION_NUMBER,                                                            \
        .name = #id,                                                                               \
        .ops = (ops_table),                                                                        \
        .core_anchor = (const void *)dsrt__fail,                                                   \
        .train_anchor = (const void *)(train_fn),                                                  \
    }

/* A module as the tables that load it know it. */
typedef struct {
    const char *name;  /* file dsrt_<name>.so, entry dsrt_module_<name> */
    const char *what;  /* for messages: "the GPU backend" */
    const char *needs; /* the libraries it loads: "libcudart.so.13, libcudnn.so.9" */
    /* 0: this build of dsrt made no such module, for the reason `unbuilt`
     * ("this dsrt was built without MPI: install libopenmpi-dev and
     * rebuild"). */
    int built;
    const char *unbuilt;
    /* The libdsrt_train function the module must have bound to this
     * process's copy (the loader checks dsrt__fail itself); NULL: none. */
    const void *train_anchor;
    int uses_dsrt; /* the module calls into libdsrt */
} dsrt_module_spec;

/* Loads spec's module the first time, and gives its ops table. Thread-safe;
 * every later call gives the same table, or fails again with the same
 * message. 0, or DSRT_EUNSUPPORTED (not built) or DSRT_EMODULE with the
 * message. */
int dsrt__module_load(const dsrt_module_spec *spec, const void **ops);

/* The ops table of spec's module when it is loaded already: 0, else -1
 * (nothing is loaded, no message is set). */
int dsrt__module_loaded(const dsrt_module_spec *spec, const void **ops);

/* The folders a module is looked for in, separated by ':' (for messages and
 * tests). */
int dsrt__module_path(char *buf, size_t size);

#endif
