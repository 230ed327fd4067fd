/*
 * Running dsrt's command-line tools from a test, as a user runs them: each
 * is started as a child process (from $DSRT_BIN_DIR/tools) in the test's
 * folder, with stdout and stderr to files there and optional limits on open
 * files and address space; a child that outlives its deadline is killed and
 * counts as a failure. Also small readers of their JSON lines and the image
 * folders the tests give them. For test programs only (static functions).
 */
#ifndef DSRT_TESTS_TOOLRUN_H
#define DSRT_TESTS_TOOLRUN_H

#include <dsrt.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"
#include "testimg.h"

static char bin_train[4096], bin_bench[4096], root[4096];

typedef struct {
    int status;  /* exit status, or 128 + the signal that killed it */
    int timeout; /* killed at the deadline */
    char *out, *err;
} result;

static inline char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    char *s = malloc(1 << 20);
    size_t n = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (s) s[n] = '\0';
    return s;
}

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    pid_t pid;
    char out[4300], err[4300];
} child;

/* Starts argv (NULL-terminated) in root, stdout and stderr to files; with
 * nofile or as_kb > 0 under those limits. */
static inline child spawn(char *const *argv, long nofile, long as_kb) {
    static int seq;
    child c;
    snprintf(c.out, sizeof c.out, "%s/out.%d", root, seq);
    snprintf(c.err, sizeof c.err, "%s/err.%d", root, seq++);
    fflush(NULL);
    c.pid = fork();
    REQUIRE(c.pid >= 0);
    if (c.pid == 0) {
        int o = open(c.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(c.err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0 || chdir(root) != 0) _exit(126);
        dup2(in, 0);
        dup2(o, 1);
        dup2(e, 2);
        close(in);
        close(o);
        close(e);
        if (nofile > 0) {
            struct rlimit r = {(rlim_t)nofile, (rlim_t)nofile};
            if (setrlimit(RLIMIT_NOFILE, &r) != 0) _exit(125);
        }
        if (as_kb > 0) {
            struct rlimit r = {(rlim_t)as_kb << 10, (rlim_t)as_kb << 10};
            if (setrlimit(RLIMIT_AS, &r) != 0) _exit(125);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return c;
}

/* Waits for c at most seconds, killing it then. */
static inline result finish(child c, double seconds) {
    result r = {0};
    double end = now() + seconds;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(c.pid, &st, WNOHANG);
        if (w == c.pid) break;
        if (now() > end) {
            kill(c.pid, SIGKILL);
            waitpid(c.pid, &st, 0);
            r.timeout = 1;
            break;
        }
        usleep(10000);
    }
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(c.out);
    r.err = slurp(c.err);
    if (r.timeout) fprintf(stderr, "  %s: killed after %.0f s\n", c.out, seconds);
    return r;
}

static inline result run_limited(char *const *argv, double seconds, long nofile, long as_kb) {
    return finish(spawn(argv, nofile, as_kb), seconds);
}

static inline result run(char *const *argv, double seconds) {
    return run_limited(argv, seconds, 0, 0);
}

static inline void result_free(result *r) {
    free(r->out);
    free(r->err);
}

/* Lines in the file at path. */
static inline int count_lines(const char *path) {
    char *s = slurp(path);
    int n = 0;
    for (char *c = s; c && *c; c++) n += *c == '\n';
    free(s);
    return n;
}

/* Waits until file path holds needle (or the child ended, or seconds passed). */
static inline int wait_for(const child *c, const char *path, const char *needle, double seconds) {
    double end = now() + seconds;
    while (now() < end) {
        char *s = slurp(path);
        int hit = s && strstr(s, needle);
        free(s);
        if (hit) return 1;
        if (waitpid(c->pid, NULL, WNOHANG) == c->pid) return 0;
        usleep(5000);
    }
    return 0;
}

#define ARGV(...) ((char *const[]){__VA_ARGS__, NULL})

/* The unsigned value after "key": in a JSON line, or -1. */
static inline long long json_int(const char *s, const char *key) {
    char k[128];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = s ? strstr(s, k) : NULL;
    if (!p) return -1;
    p += strlen(k);
    while (*p == ' ') p++;
    return strtoll(p, NULL, 10);
}

/* 1 when s is valid UTF-8 throughout. */
static inline int valid_utf8(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = *p < 0x80             ? 1
                : (*p & 0xe0) == 0xc0 ? 2
                : (*p & 0xf0) == 0xe0 ? 3
                : (*p & 0xf8) == 0xf0 ? 4
                                      : 0;
        if (!n) return 0;
        for (int i = 1; i < n; i++)
            if ((p[i] & 0xc0) != 0x80) return 0;
        p += n;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// Data

/* dir/<class>/<i>.png, 28 x 28 gray, per images a class; class k draws
 * pattern k so that a small net can tell them apart. */
static inline void make_images(const char *dir, const char *const *classes, int n, int per) {
    uint8_t px[28 * 28];
    for (int k = 0; k < n; k++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, classes[k]);
        REQUIRE(timg_mkdirs(sub) == 0);
        for (int i = 0; i < per; i++) {
            for (int y = 0; y < 28; y++)
                for (int x = 0; x < 28; x++) {
                    int v = k == 0   ? (y / 3 % 2) * 200
                            : k == 1 ? (x / 3 % 2) * 200
                                     : ((x + y) / 4 % 2) * 200;
                    px[y * 28 + x] =
                        (uint8_t)(v + (int)(timg_hash((uint32_t)(i * 977 + y * 28 + x)) % 40));
                }
            char path[4600];
            snprintf(path, sizeof path, "%s/%03d.png", sub, i);
            dsrt_image img = {px, 28, 28, 1, 28};
            REQUIRE(dsrt_png_write(path, &img) == 0);
        }
    }
}

static const char *const ABC[] = {"alpha", "beta", "gamma"};

/* Finds the tools and makes the test's folder (name: its prefix). Returns
 * 0, or TEST_SKIP (after saying why) when the tools are not built. */
static inline int toolrun_init(const char *name) {
    const char *bin = getenv("DSRT_BIN_DIR");
    if (!bin || !*bin) {
        printf("DSRT_BIN_DIR is not set: no tools to run\n");
        return TEST_SKIP;
    }
    snprintf(bin_train, sizeof bin_train, "%s/tools/dstrain", bin);
    snprintf(bin_bench, sizeof bin_bench, "%s/tools/dsbench", bin);
    if (access(bin_train, X_OK) != 0 || access(bin_bench, X_OK) != 0) {
        printf("%s or %s missing: tools not built\n", bin_train, bin_bench);
        return TEST_SKIP;
    }
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(timg_tmpdir(name, root, sizeof root) == 0);
    return 0;
}

/* good: root/good, 3 classes of 20 images; model: a net trained on it for
 * one epoch, saved there. */
static inline void toolrun_good_model(char *good, size_t good_cap, char *model, size_t model_cap) {
    snprintf(good, good_cap, "%s/good", root);
    snprintf(model, model_cap, "%s/good.dsrt", root);
    make_images(good, ABC, 3, 20);
    result r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "16",
                        "--quiet", "--save", model),
                   300);
    if (r.status != 0) fprintf(stderr, "training the model: %s\n", r.err);
    REQUIRE(r.status == 0);
    result_free(&r);
}

#endif
