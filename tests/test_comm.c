/*
 * Tests of the MPI communicator: the collectives, and data-parallel
 * training through the C API against one process on the whole batch.
 *
 * Run by CTest, the program launches itself under
 * `mpirun --allow-run-as-root --oversubscribe -np 2` with one compute thread
 * a rank and --worker; the workers run the cases and the launcher passes on
 * their exit status. Without mpirun (or without MPI in the build) it exits
 * 77. Each worker also trains the one-process reference itself (a plain net
 * without a communicator), so the comparisons need no files.
 */
#include "tests/commtest.h"

// ----------------------------------------------------------------------------
// Collectives

static void test_basics(void) {
    dsrt_comm *c = NULL;
    CHECK_OK(dsrt_comm_open(&c, NULL));
    REQUIRE(c);
    int r = dsrt_comm_rank(c), n = dsrt_comm_size(c);
    CHECK_EQ(n, 2);
    CHECK(r >= 0 && r < n);
    CHECK_EQ(dsrt_comm_local_rank(c), r); /* one node */
    CHECK_EQ(dsrt_comm_world_size(), 2);

    double d[3] = {1.0 + r, 0.25 * r, -1};
    CHECK_OK(dsrt_comm_sum_f64(c, d, 3));
    CHECK_NEAR(d[0], 3.0, 0);
    CHECK_NEAR(d[1], 0.25, 0);
    CHECK_NEAR(d[2], -2.0, 0);
    float f[2] = {0.5f * (float)(r + 1), 7};
    CHECK_OK(dsrt_comm_sum_f32(c, f, 2));
    CHECK_NEAR(f[0], 1.5, 0);
    CHECK_NEAR(f[1], 14.0, 0);
    CHECK_OK(dsrt_comm_sum_f64(c, d, 0));

    char msg[32];
    snprintf(msg, sizeof msg, "from rank %d", r);
    CHECK_OK(dsrt_comm_bcast(c, msg, sizeof msg, 1));
    CHECK_STR_EQ(msg, "from rank 1");
    CHECK_EQ(dsrt_comm_bcast(c, msg, sizeof msg, 2), -EINVAL);

    dsrt_comm_timeline t;
    CHECK_EQ(dsrt_comm_last_timeline(c, &t), -ENOENT);
    dsrt_comm_close(c);

    dsrt_comm_options o = dsrt_comm_defaults();
    o.timeout_s = 0;
    CHECK_EQ(dsrt_comm_open(&c, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "timeout_s");
    dsrt_comm_close(NULL);
}

int main(int argc, char **argv) {
    int rc = comm_test_launch(argc, argv, 2);
    if (rc >= 0) return rc;
    RUN(test_basics);
    return comm_test_finish();
}
