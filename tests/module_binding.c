/*
 * A program that links dsrt's objects in statically but does not export
 * their symbols (no -Wl,--export-dynamic): a module it loads would call a
 * second copy of dsrt (the shared libraries the module needs), whose error
 * messages and state this program never sees. The loader must refuse the
 * module and say what to do, instead of running with two copies.
 */
#include <dsrt.h>

#include "task.h"

int main(void) {
    int rc = dsrt_comm_available(DSRT_COMM_MPI);
    fprintf(stderr, "%s\n", dsrt_last_error());
    CHECK_EQ(rc, DSRT_EMODULE);
    CHECK_CONTAINS(dsrt_last_error(), "calls a second copy of dsrt");
    CHECK_CONTAINS(dsrt_last_error(), "--export-dynamic");
    return TEST_RESULT();
}
