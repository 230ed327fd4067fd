/*
 * A module whose library is missing, as on a machine with another Open MPI
 * than the one dsrt was built with. tests/CMakeLists.txt builds this file
 * twice: as libmpi.so.99, kept where the dynamic loader never looks, and as
 * a dsrt_mpi.so linked against it, in a folder the tests give as
 * DSRT_MODULE_PATH. Loading that module must fail with one message naming
 * the module, the library (libmpi.so.99) and the package that provides it.
 */
#ifdef DSRT_FIXTURE_LIBRARY
int dsrt_fixture_absent(void) {
    return 1;
}
#else
#include "core/module.h"

/* The note a module of this build carries: the loader reads the file
 * before loading it, and then the missing library is what fails. */
DSRT_MODULE_NOTE(mpi);

int dsrt_fixture_absent(void);

int dsrt_fixture_module(void) {
    return dsrt_fixture_absent();
}
#endif
