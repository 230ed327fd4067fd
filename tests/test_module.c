/*
 * The module loader against hostile module files: a module is loaded from
 * a folder of DSRT_MODULE_PATH with dlopen, which runs the file's code and
 * maps its segments, so the loader checks the file first. Each case runs
 * in a child process (the loader keeps one record a module a process) and
 * reports its result through a pipe; a child killed by a signal (SIGBUS
 * from a truncated file) or by its alarm (a FIFO that blocks the open) is a
 * failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/module.h"
#include "task.h"

static const dsrt_module_spec FIXTURE = {
    .name = "fixture",
    .what = "the fixture",
    .needs = "nothing",
    .built = 1,
};

static char fixtures[1024], tmp[1024];

typedef struct {
    int rc;         /* dsrt__module_load's */
    int ops_ok;     /* the ops table is the fixture's */
    int signalled;  /* the child died of a signal: which */
    char msg[4096]; /* dsrt_last_error() when it failed */
    char warn[4096];
} outcome;

/* Loads the fixture with DSRT_MODULE_PATH=path in a child (in folder cwd
 * when given). */
static outcome load_in_child(const char *path, const char *cwd) {
    outcome o;
    memset(&o, 0, sizeof o);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        alarm(30);
        if (cwd && chdir(cwd) != 0) _exit(3);
        setenv("DSRT_MODULE_PATH", path, 1);
        const void *ops = NULL;
        outcome r;
        memset(&r, 0, sizeof r);
        r.rc = dsrt__module_load(&FIXTURE, &ops);
        r.ops_ok = ops && *(const int *)ops == 42;
        snprintf(r.msg, sizeof r.msg, "%s", r.rc ? dsrt_last_error() : "");
        snprintf(r.warn, sizeof r.warn, "%s", dsrt_module_warnings());
        ssize_t n = write(fds[1], &r, sizeof r);
        _exit(n == (ssize_t)sizeof r ? 0 : 4);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof o) {
        ssize_t n = read(fds[0], (char *)&o + got, sizeof o - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        memset(&o, 0, sizeof o);
        o.rc = -1;
        o.signalled = WTERMSIG(status);
        fprintf(stderr, "  the child died of signal %d (%s)\n", o.signalled,
                strsignal(o.signalled));
    } else if (got != sizeof o) {
        o.rc = -1;
        snprintf(o.msg, sizeof o.msg, "(the child reported nothing: status %d)", status);
    }
    return o;
}

static void copy_file(const char *from, const char *to, long keep) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    REQUIRE(in && out);
    char buf[65536];
    long total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (keep >= 0 && total + (long)n > keep) n = (size_t)(keep - total);
        REQUIRE(fwrite(buf, 1, n, out) == n);
        total += (long)n;
        if (keep >= 0 && total >= keep) break;
    }
    fclose(in);
    REQUIRE(fclose(out) == 0);
}

static long file_size(const char *path) {
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    return (long)st.st_size;
}

/* A fresh folder under tmp. */
static void folder(char *out, size_t size, const char *name) {
    snprintf(out, size, "%s/%s", tmp, name);
    mkdir(out, 0755);
    chmod(out, 0755);
}

static void variant(char *out, size_t size, const char *v) {
    snprintf(out, size, "%s/fixture-%s/dsrt_fixture.so", fixtures, v);
}

static void test_good(void) {
    char dir[1200];
    variant(dir, sizeof dir, "good");
    *strrchr(dir, '/') = 0;
    outcome o = load_in_child(dir, NULL);
    CHECK_EQ(o.rc, 0);
    CHECK(o.ops_ok);
    CHECK_STR_EQ(o.warn, "");
    if (o.rc) fprintf(stderr, "  %s\n", o.msg);
}

static void test_truncated(void) {
    char good[1200], dir[1200], to[1300];
    variant(good, sizeof good, "good");
    long size = file_size(good);
    const long keep[] = {10, 100, size / 3, size * 2 / 3, size - 1};
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
        folder(dir, sizeof dir, "truncated");
        snprintf(to, sizeof to, "%s/dsrt_fixture.so", dir);
        copy_file(good, to, keep[k]);
        outcome o = load_in_child(dir, NULL);
        fprintf(stderr, "  %ld of %ld bytes: %s\n", keep[k], size, o.msg);
        CHECK_EQ(o.signalled, 0);
        CHECK_EQ(o.rc, DSRT_EMODULE);
        CHECK_CONTAINS(o.msg, "truncated");
        CHECK_CONTAINS(o.msg, to);
    }
}

/* A folder or a FIFO named like the module ends nothing: the search goes
 * on to the next folder (and never opens the FIFO). */
static void test_not_regular(void) {
    char good[1200], a[1200], b[1200], p[1300], path[2600];
    variant(good, sizeof good, "good");
    *strrchr(good, '/') = 0;
    folder(a, sizeof a, "dirnamed");
    snprintf(p, sizeof p, "%s/dsrt_fixture.so", a);
    mkdir(p, 0755);
    folder(b, sizeof b, "fifonamed");
    snprintf(p, sizeof p, "%s/dsrt_fixture.so", b);
    unlink(p);
    REQUIRE(mkfifo(p, 0600) == 0);
    snprintf(path, sizeof path, "%s:%s:%s", a, b, good);
    outcome o = load_in_child(path, NULL);
    CHECK_EQ(o.signalled, 0);
    CHECK_EQ(o.rc, 0);
    CHECK(o.ops_ok);
    if (o.rc) fprintf(stderr, "  %s\n", o.msg);
}

/* Another build's module is refused from its note: its constructor never
 * runs. One with no note is refused too. */
static void test_notes(void) {
    char dir[1200], marker[1200];
    snprintf(marker, sizeof marker, "%s/constructor-ran", tmp);
    unlink(marker);
    setenv("DSRT_FIXTURE_MARKER", marker, 1);
    variant(dir, sizeof dir, "other");
    *strrchr(dir, '/') = 0;
    outcome o = load_in_child(dir, NULL);
    fprintf(stderr, "  another build: %s\n", o.msg);
    CHECK_EQ(o.rc, DSRT_EMODULE);
    CHECK_CONTAINS(o.msg, "another build of dsrt");
    CHECK(access(marker, F_OK) != 0);
    unsetenv("DSRT_FIXTURE_MARKER");

    variant(dir, sizeof dir, "nonote");
    *strrchr(dir, '/') = 0;
    o = load_in_child(dir, NULL);
    fprintf(stderr, "  no note: %s\n", o.msg);
    CHECK_EQ(o.rc, DSRT_EMODULE);
    CHECK_CONTAINS(o.msg, "no dsrt note");
}

/* A module anyone could have put there loads, with a warning. */
static void test_warnings(void) {
    char good[1200], dir[1200], to[1300];
    variant(good, sizeof good, "good");
    folder(dir, sizeof dir, "open");
    snprintf(to, sizeof to, "%s/dsrt_fixture.so", dir);
    copy_file(good, to, -1);
    REQUIRE(chmod(dir, 0777) == 0);
    outcome o = load_in_child(dir, NULL);
    CHECK_EQ(o.rc, 0);
    CHECK_CONTAINS(o.warn, "every user may write to");
    chmod(dir, 0755);

    o = load_in_child("open", tmp);
    CHECK_EQ(o.rc, 0);
    CHECK_CONTAINS(o.warn, "relative folder 'open'");
}

int main(void) {
    const char *f = getenv("DSRT_FIXTURE_DIR"), *t = getenv("DSRT_TEST_TMP");
    if (!f || !t) {
        fprintf(stderr, "test_module: run it with ctest (DSRT_FIXTURE_DIR, DSRT_TEST_TMP)\n");
        return TEST_SKIP;
    }
    snprintf(fixtures, sizeof fixtures, "%s", f);
    snprintf(tmp, sizeof tmp, "%s/module", t);
    mkdir(t, 0755);
    mkdir(tmp, 0755);
    RUN(test_good);
    RUN(test_truncated);
    RUN(test_not_regular);
    RUN(test_notes);
    RUN(test_warnings);
    return TEST_RESULT();
}
