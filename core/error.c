/*
 * Error codes and messages. The code table is DSRT_ERRNO_MAP in core.h; the
 * message with context lives in a per-thread buffer, so a failing call on one
 * thread never overwrites the message another thread is about to read.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define DSRT_ERROR_MAX 1024

static _Thread_local char dsrt_error_buf[DSRT_ERROR_MAX];

const char *dsrt_strerror(int code) {
    switch (code) {
#define DSRT_STRERROR_CASE(name, value, text)                                                      \
    case value:                                                                                    \
        return text;
        DSRT_ERRNO_MAP(DSRT_STRERROR_CASE)
#undef DSRT_STRERROR_CASE
    case 0:
        return "success";
    default:
        break;
    }
    if (code < 0 && code > -4096) return strerror(-code);
    return "unknown error";
}

const char *dsrt_last_error(void) {
    return dsrt_error_buf;
}

int dsrt__vfail(int code, const char *fmt, va_list ap) {
    vsnprintf(dsrt_error_buf, sizeof dsrt_error_buf, fmt, ap);
    return code;
}

int dsrt__fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dsrt__vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

int dsrt__fail_prefix(int code, const char *fmt, ...) {
    char prefix[DSRT_ERROR_MAX / 4], old[DSRT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, dsrt_error_buf, sizeof old);
    if (old[0] == '\0') snprintf(old, sizeof old, "%s", dsrt_strerror(code));
    size_t n = strlen(prefix);
    memcpy(dsrt_error_buf, prefix, n);
    dsrt_error_buf[n] = ':';
    dsrt_error_buf[n + 1] = ' ';
    snprintf(dsrt_error_buf + n + 2, sizeof dsrt_error_buf - n - 2, "%s", old);
    return code;
}

void dsrt__clear_error(void) {
    dsrt_error_buf[0] = '\0';
}

unsigned dsrt_version(void) {
    return DSRT_VERSION_NUMBER;
}

#define DSRT_STR2(x) #x
#define DSRT_STR(x)  DSRT_STR2(x)

const char *dsrt_version_string(void) {
    return DSRT_STR(DSRT_VERSION_MAJOR) "." DSRT_STR(DSRT_VERSION_MINOR) "." DSRT_STR(
        DSRT_VERSION_PATCH);
}
