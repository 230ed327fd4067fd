/*
 * A tiny test harness: checks that print the expression and both values,
 * and the exit codes CTest reads (0 pass, 1 fail, 77 skip). Each test
 * program calls its cases from main and returns TEST_RESULT().
 */
#ifndef DSRT_TEST_TASK_H
#define DSRT_TEST_TASK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures __attribute__((unused));

#define TEST_SKIP 77

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #expr);               \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_INT_OP(a, op, b)                                                                     \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (!(va_ op vb_)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK(%s %s %s) failed: %lld vs %lld\n", __FILE__, __LINE__,   \
                    #a, #op, #b, va_, vb_);                                                        \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b) CHECK_INT_OP(a, ==, b)
#define CHECK_NE(a, b) CHECK_INT_OP(a, !=, b)
#define CHECK_LT(a, b) CHECK_INT_OP(a, <, b)
#define CHECK_LE(a, b) CHECK_INT_OP(a, <=, b)
#define CHECK_GT(a, b) CHECK_INT_OP(a, >, b)
#define CHECK_GE(a, b) CHECK_INT_OP(a, >=, b)

/* A dsrt call that must succeed: prints the code and dsrt_last_error(). */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #call, rc_,    \
                    dsrt_strerror(rc_), dsrt_last_error());                                        \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *sa_ = (a), *sb_ = (b);                                                         \
        if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0) {                                               \
            fprintf(stderr, "%s:%d: CHECK(%s == %s) failed: \"%s\" vs \"%s\"\n", __FILE__,         \
                    __LINE__, #a, #b, sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");                 \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

/* Substring check, for error messages. */
#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!h_ || !strstr(h_, n_)) {                                                              \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,         \
                    h_ ? h_ : "(null)", n_);                                                       \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

/* |a - b| <= tol, for floating-point results against a reference. */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double da_ = (double)(a), db_ = (double)(b);                                               \
        if (!(fabs(da_ - db_) <= (tol))) {                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s ~ %s) failed: %.9g vs %.9g (tol %g)\n", __FILE__,     \
                    __LINE__, #a, #b, da_, db_, (double)(tol));                                    \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

/* A fatal setup failure: the test cannot go on. */
#define REQUIRE(expr)                                                                              \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            fprintf(stderr, "%s:%d: REQUIRE(%s) failed\n", __FILE__, __LINE__, #expr);             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        int before_ = test_failures;                                                               \
        fn();                                                                                      \
        fprintf(stderr, "%-40s %s\n", #fn, test_failures == before_ ? "ok" : "FAILED");            \
    } while (0)

#define TEST_RESULT() (test_failures ? 1 : 0)

#endif
