/*
 * What the tests against onnxruntime share (test_onnx_ref, test_slow_onnx):
 * the folder they work in, the two Pythons (the system's, with Debian's
 * torch, torchvision, numpy and PIL, which makes the reference models; the
 * environment of scripts/onnx-venv.sh, with onnx and onnxruntime, which
 * checks them), tests/onnx_ref.py, dstrain, and shell commands run with
 * their status. Setup returns 77 (skip) with the reason where a Python or
 * its packages cannot be had.
 */
#ifndef DSRT_TEST_ONNX_TEST_H
#define DSRT_TEST_ONNX_TEST_H

#include "nn/internal.h"
#include "task.h"
#include "testimg.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SYS_PY "/usr/bin/python3"

static char dir[PATH_MAX], venv[PATH_MAX], script[PATH_MAX], dstrain[PATH_MAX];

/* Runs a shell command (printf-style); its exit status, -1 when it could
 * not run. A failure prints the command. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fflush(stderr);
    int st = system(cmd);
    int rc = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc) fprintf(stderr, "  exit %d: %.600s\n", rc, cmd);
    return rc;
}

/* Runs a command with stdout and stderr captured into out; its status. */
static int capture(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int capture(char *out, size_t cap, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd - 8, fmt, ap);
    va_end(ap);
    strcat(cmd, " 2>&1");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The folder, the environment and the tools; 0, or 77 to skip. */
static int onnx_test_setup(const char *name) {
    const char *src = getenv("DSRT_SOURCE_DIR"), *bin = getenv("DSRT_BIN_DIR");
    if (!src || !bin) {
        fprintf(stderr, "skip: DSRT_SOURCE_DIR and DSRT_BIN_DIR are not set (run under ctest)\n");
        return TEST_SKIP;
    }
    REQUIRE(timg_tmpdir(name, dir, sizeof dir) == 0);
    snprintf(script, sizeof script, "%s/tests/onnx_ref.py", src);
    snprintf(dstrain, sizeof dstrain, "%s/tools/dstrain", bin);
    if (access(dstrain, X_OK) != 0) {
        fprintf(stderr, "skip: %s is not built\n", dstrain);
        return TEST_SKIP;
    }
    char out[PATH_MAX * 2];
    if (sh("%s -c 'import torch, torchvision, numpy, PIL' 2>/dev/null", SYS_PY) != 0) {
        fprintf(stderr,
                "skip: %s lacks torch, torchvision, numpy or PIL (Debian's "
                "python3-torch, python3-torchvision: scripts/install-deps.sh)\n",
                SYS_PY);
        return TEST_SKIP;
    }
    int rc = capture(out, sizeof out, "bash '%s/scripts/onnx-venv.sh'", src);
    char *line = out, *last = NULL;
    for (char *p = out; *p; p++)
        if (*p == '\n') {
            *p = '\0';
            if (line[0] == '/' && access(line, X_OK) == 0) last = line;
            line = p + 1;
        }
    if (rc || !last) {
        fprintf(stderr, "skip: the onnx/onnxruntime environment could not be made: %.300s\n", line);
        return TEST_SKIP;
    }
    snprintf(venv, sizeof venv, "%s", last);
    return 0;
}

/* Two dsrt model files hold the same parameters and running statistics,
 * bit for bit. */
static void same_weights(const char *a, const char *b) {
    dsrt_net *na = NULL, *nb = NULL;
    CHECK_OK(dsrt_model_load(&na, a, NULL));
    CHECK_OK(dsrt_model_load(&nb, b, NULL));
    if (na && nb) {
        size_t pa, pb, sa, sb;
        const float *wa = dsrt_net_params(na, &pa), *wb = dsrt_net_params(nb, &pb);
        const float *ta = dsrt_net_state(na, &sa), *tb = dsrt_net_state(nb, &sb);
        CHECK_EQ(pa, pb);
        CHECK_EQ(sa, sb);
        CHECK(pa == pb && memcmp(wa, wb, pa * sizeof *wa) == 0);
        CHECK(sa == sb && memcmp(ta, tb, sa * sizeof *ta) == 0);
        fprintf(stderr, "  %s and %s: %zu parameters, %zu state values%s\n", a, b, pa, sa,
                pa == pb && !memcmp(wa, wb, pa * 4) && sa == sb && !memcmp(ta, tb, sa * 4)
                    ? ", bit for bit the same"
                    : ", NOT the same");
    }
    dsrt_net_destroy(na);
    dsrt_net_destroy(nb);
}

/* After transfer learning from base into trained: how many learnable layers
 * other than the last fully connected one kept their weights bit for bit,
 * and how many changed; the last fc must have classes outputs. */
static void kept_layers(const char *base, const char *trained, int classes, int *same,
                        int *changed) {
    dsrt_net *a = NULL, *b = NULL;
    *same = *changed = 0;
    CHECK_OK(dsrt_model_load(&a, base, NULL));
    CHECK_OK(dsrt_model_load(&b, trained, NULL));
    if (a && b) {
        dsrt_net_info ia, ib;
        dsrt_net_get_info(a, &ia);
        dsrt_net_get_info(b, &ib);
        CHECK_EQ(ia.layers, ib.layers);
        CHECK_EQ(ib.classes, classes);
        int last = -1;
        for (int i = 1; i < ib.layers; i++) {
            dsrt_layer_info l;
            dsrt_net_layer(b, i, &l);
            if (!strcmp(l.type, "fc")) last = i;
        }
        const float *pa = dsrt_net_params(a, NULL), *pb = dsrt_net_params(b, NULL);
        for (int i = 1; i < ib.layers && i < ia.layers; i++) {
            dsrt_layer_info la, lb;
            dsrt_net_layer(a, i, &la);
            dsrt_net_layer(b, i, &lb);
            if (i == last || !(la.weights_count + la.bias_count)) continue;
            CHECK_EQ(la.weights_count, lb.weights_count);
            int eq = la.weights_count == lb.weights_count && la.bias_count == lb.bias_count &&
                     !memcmp(pa + la.weights_offset, pb + lb.weights_offset,
                             la.weights_count * sizeof *pa) &&
                     !memcmp(pa + la.bias_offset, pb + lb.bias_offset, la.bias_count * sizeof *pa);
            *same += eq;
            *changed += !eq;
        }
        fprintf(stderr, "  transfer: %d learnable layers kept their weights, %d changed\n", *same,
                *changed);
    }
    dsrt_net_destroy(a);
    dsrt_net_destroy(b);
}

#endif
