/*
 * What the communicator tests share: a program launches itself under
 * mpirun (--allow-run-as-root --oversubscribe -np N, one compute thread a
 * rank) and passes on the job's exit status; under mpirun it is a worker.
 */
#ifndef DSRT_TEST_COMMTEST_H
#define DSRT_TEST_COMMTEST_H

#include "tests/task.h"

#include <dsrt/comm.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The launcher: $DSRT_MPIEXEC, else mpirun or mpiexec on PATH; NULL when
 * there is none. */
static const char *comm_test_mpirun(void) {
    static char found[4096];
    const char *env = getenv("DSRT_MPIEXEC");
    if (env && *env && access(env, X_OK) == 0) return env;
    const char *path = getenv("PATH");
    const char *names[] = {"mpirun", "mpiexec"};
    for (int k = 0; k < 2; k++)
        for (const char *p = path; p && *p;) {
            const char *end = strchr(p, ':');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            snprintf(found, sizeof found, "%.*s/%s", (int)len, p, names[k]);
            if (len && access(found, X_OK) == 0) return found;
            p = end ? end + 1 : NULL;
        }
    return NULL;
}

/* Runs argv with a deadline, its output into the file `output` (NULL: as
 * this program's); returns its exit status (1 when a signal killed it, 124
 * when it was still running at the deadline, which is only a guard against
 * a hang: set it far beyond what the job needs) and the seconds it took in
 * *took_s (may be NULL; for reports, not for deciding a test). */
static int comm_test_run_to(char **argv, double limit_s, const char *output, double *took_s) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        setpgid(0, 0);
        if (output) {
            FILE *f = freopen(output, "w", stdout);
            if (!f || dup2(fileno(stdout), 2) < 0) _exit(126);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (took_s)
            *took_s = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
        if (w == pid) {
            if (WIFEXITED(st)) return WEXITSTATUS(st);
            fprintf(stderr, "%s: killed by signal %d\n", argv[0], WTERMSIG(st));
            return 1;
        }
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > limit_s) {
            fprintf(stderr, "%s: still running after %g s: killed\n", argv[0], limit_s);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return 124;
        }
        usleep(20000);
    }
}

static int comm_test_run(char **argv, double limit_s) {
    return comm_test_run_to(argv, limit_s, NULL, NULL);
}

/* The environment MPI jobs of the tests inherit: one compute thread a rank,
 * and under ASan the slow unwinder, without which the leaks Open MPI leaves
 * cannot be told apart from dsrt's (tests/lsan.supp names frames deep in
 * their stacks that the fast unwinder does not reach through Open MPI's
 * code). Only MPI jobs pay for it: it slows every allocation. Call before
 * starting them. */
static void comm_test_env(void) {
    static char asan[1024];
    setenv("OMP_NUM_THREADS", "1", 1);
    const char *a = getenv("ASAN_OPTIONS");
    if (a && !strstr(a, "fast_unwind_on_malloc")) {
        snprintf(asan, sizeof asan, "%s:fast_unwind_on_malloc=0", a);
        setenv("ASAN_OPTIONS", asan, 1);
    }
}

/* The mpirun command line for np ranks of this program with --worker and
 * extra, in args (room for 32). Returns 0, or 77 when MPI or mpirun is
 * missing. */
static int comm_test_command(char **args, int np, const char *const *extra) {
    static char self[4096], nps[16];
    if (dsrt_comm_available(DSRT_COMM_MPI) != 0) {
        fprintf(stderr, "skipped: %s\n", dsrt_last_error());
        return TEST_SKIP;
    }
    const char *mpirun = comm_test_mpirun();
    if (!mpirun) {
        fprintf(stderr, "skipped: no mpirun on PATH (install openmpi-bin)\n");
        return TEST_SKIP;
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 1;
    self[len] = 0;
    snprintf(nps, sizeof nps, "%d", np);
    int k = 0;
    args[k++] = (char *)mpirun;
    args[k++] = "--allow-run-as-root";
    args[k++] = "--oversubscribe";
    args[k++] = "-np";
    args[k++] = nps;
    args[k++] = self;
    args[k++] = "--worker";
    for (int i = 0; extra && extra[i] && k < 31; i++) args[k++] = (char *)extra[i];
    args[k] = NULL;
    comm_test_env();
    return 0;
}

/*
 * In the launcher (no --worker argument): runs this program under mpirun
 * with np ranks and `--worker extra...`, returning the job's status, or 77
 * when MPI or mpirun is missing. In a worker: initialises MPI and returns -1
 * (go on and run the cases).
 */
static int comm_test_launch_args(int argc, char **argv, int np, const char *const *extra) {
    if (argc >= 2 && !strcmp(argv[1], "--worker")) {
        if (dsrt_comm_init(&argc, &argv) != 0) {
            fprintf(stderr, "dsrt_comm_init: %s\n", dsrt_last_error());
            exit(1);
        }
        return -1;
    }
    char *args[32];
    int rc = comm_test_command(args, np, extra);
    return rc ? rc : comm_test_run(args, 300);
}

static inline int comm_test_launch(int argc, char **argv, int np) {
    return comm_test_launch_args(argc, argv, np, NULL);
}

static inline int comm_test_finish(void) {
    dsrt_comm_finalize();
    return TEST_RESULT();
}

#endif
