/*
 * Faults in a data-parallel job (mpirun -np 2): no rank waits forever.
 *
 * Each case is its own job, whose output the launcher reads:
 * - hang: rank 1 stops (SIGSTOP) before a host sum; rank 0's sum fails
 *   after the timeout (2 s) with a message naming rank 1 as not
 *   responding, and the job ends.
 * - grads: rank 1 stops in the middle of training; rank 0's grads_wait
 *   fails naming rank 1.
 * - late: rank 1 is alive but sleeps past the timeout before joining;
 *   rank 0's message says rank 1 has not arrived.
 * - kill: rank 1 is killed (SIGKILL) while rank 0 waits in a sum with a
 *   long timeout; Open MPI's mpirun sees the death and ends the job itself,
 *   naming the rank, without the communicator's timeout message.
 * A job must end by itself; the launcher's deadline (200 s) only turns a
 * hang into a failure, and no case is decided by how long it took.
 * A failing rank prints dsrt's message and exits 3 without MPI_Finalize
 * (the communicator broke); mpirun then ends the job.
 */
#include "tests/commtest.h"

#include <dsrt/nn.h>

#define TIMEOUT_S 2.0

static dsrt_comm *open_comm(double timeout_s) {
    dsrt_comm_options o = dsrt_comm_defaults();
    o.timeout_s = timeout_s;
    dsrt_comm *c = NULL;
    if (dsrt_comm_open(&c, &o) != 0) {
        fprintf(stderr, "open: %s\n", dsrt_last_error());
        exit(1);
    }
    return c;
}

/* The end of a worker whose collective failed as expected: the message for
 * the launcher, and out without finalising. */
static int report(int rc, const char *what) {
    printf("%s rc=%d (%s): %s\n", what, rc, dsrt_strerror(rc), dsrt_last_error());
    fflush(stdout);
    return rc ? 3 : 1;
}

static int worker_hang(void) {
    dsrt_comm *c = open_comm(TIMEOUT_S);
    double x = 1;
    if (dsrt_comm_sum_f64(c, &x, 1)) return report(-1, "first sum");
    if (dsrt_comm_rank(c) == 1) raise(SIGSTOP);
    /* Heartbeats have told rank 0 that rank 1 was alive; now they stop. */
    int rc = dsrt_comm_sum_f64(c, &x, 1);
    report(rc, "FAULT hang");
    /* Later calls fail at once. */
    if (rc && dsrt_comm_sum_f64(c, &x, 1) == DSRT_ECLOSED) printf("then closed\n");
    return 3;
}

static int worker_late(void) {
    dsrt_comm *c = open_comm(TIMEOUT_S);
    double x = 1;
    if (dsrt_comm_sum_f64(c, &x, 1)) return report(-1, "first sum");
    if (dsrt_comm_rank(c) == 1) {
        sleep(6);
        return 0; /* rank 0 has failed and ended the job by now */
    }
    return report(dsrt_comm_sum_f64(c, &x, 1), "FAULT late");
}

static int worker_grads(void) {
    dsrt_comm *c = open_comm(TIMEOUT_S);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    if (dsrt_net_create(&net, "digits", 0, 0, 0, 10, &no) || dsrt_comm_attach(c, net))
        return report(-1, "setup");
    enum { N = 8 };
    static float x[N * 28 * 28];
    int32_t labels[N];
    for (int k = 0; k < N; k++) labels[k] = k % 10;
    for (int step = 0; step < 3; step++) {
        if (step == 2 && dsrt_comm_rank(c) == 1) raise(SIGSTOP);
        int rc = dsrt_net_forward_backward(net, x, labels, N, NULL, NULL);
        if (!rc) rc = dsrt_comm_grads_wait(c);
        if (rc) return report(rc, "FAULT grads");
    }
    return report(0, "no fault");
}

static int worker_kill(void) {
    dsrt_comm *c = open_comm(120);
    double x = 1;
    if (dsrt_comm_sum_f64(c, &x, 1)) return report(-1, "first sum");
    if (dsrt_comm_rank(c) == 1) raise(SIGKILL);
    return report(dsrt_comm_sum_f64(c, &x, 1), "FAULT kill");
}

/* One case as its own job: it must end by itself, failing (limit_s only
 * guards against a hang), with every string of `expect` in its output and
 * none of `never`. */
static void run_case(const char *name, double limit_s, const char *const *expect,
                     const char *const *never) {
    const char *tmp = getenv("DSRT_TEST_TMP");
    char out[4200];
    snprintf(out, sizeof out, "%s/test_comm_faults.%d.%s", tmp && *tmp ? tmp : "/tmp",
             (int)getpid(), name);
    if (tmp && *tmp) mkdir(tmp, 0777);
    char *args[32];
    const char *extra[] = {name, NULL};
    if (comm_test_command(args, 2, extra)) return;
    double took = 0;
    int rc = comm_test_run_to(args, limit_s, out, &took);
    static char text[65536];
    FILE *f = fopen(out, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    unlink(out);
    int ok = rc != 0 && rc != 124;
    for (int i = 0; expect[i]; i++) ok = ok && strstr(text, expect[i]);
    for (int i = 0; never && never[i]; i++) ok = ok && !strstr(text, never[i]);
    fprintf(stderr, "%-8s exit %d after %.1f s%s\n", name, rc, took, ok ? "" : ": UNEXPECTED");
    /* The line dsrt printed, or everything when something is off. */
    const char *line = strstr(text, "FAULT");
    if (!line) line = strstr(text, "mpirun noticed");
    if (ok && line)
        fprintf(stderr, "  %.*s\n", (int)strcspn(line, "\n"), line);
    else
        fprintf(stderr, "%s\n", text);
    if (!ok) test_failures++;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--worker")) {
        comm_test_launch(argc, argv, 2);
        const char *c = argv[2];
        if (!strcmp(c, "hang")) return worker_hang();
        if (!strcmp(c, "late")) return worker_late();
        if (!strcmp(c, "grads")) return worker_grads();
        if (!strcmp(c, "kill")) return worker_kill();
        return 2;
    }
    char *args[32];
    int rc = comm_test_command(args, 2, NULL);
    if (rc) return rc;
    static const char *const hang[] = {"FAULT hang", "Connection timed out",
                                       "rank 1 not responding", "then closed", NULL};
    static const char *const late[] = {"FAULT late", "rank 1 has not arrived", NULL};
    static const char *const grads[] = {"FAULT grads", "gradient bucket", "rank 1 not responding",
                                        NULL};
    static const char *const kill[] = {"rank 1", "signal 9", NULL};
    /* Killed: mpirun ended the job, not the communicator's 120 s timeout. */
    static const char *const not_timed_out[] = {"not responding", "has not arrived",
                                                "Connection timed out", NULL};
    run_case("hang", 200, hang, NULL);
    run_case("late", 200, late, NULL);
    run_case("grads", 200, grads, NULL);
    run_case("kill", 200, kill, not_timed_out);
    return TEST_RESULT();
}
