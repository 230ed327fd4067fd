/*
 * Helpers shared by dsrt's command-line tools; see tool_common.h.
 */
#include "tool_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *tool_name = "dsrt";

void tool_set_name(const char *name) {
    tool_name = name;
}

void tool_die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", tool_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

void tool_die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", tool_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", tool_name);
    exit(2);
}

const char *tool_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) tool_die_usage("option %s needs a value", argv[*i]);
    return argv[++*i];
}

long long tool_int(const char *option, const char *value, long long min, long long max) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0')
        tool_die_usage("%s: '%s' is not an integer", option, value);
    if (v < min || v > max) tool_die_usage("%s: %lld is outside [%lld, %lld]", option, v, min, max);
    return v;
}

double tool_double(const char *option, const char *value, double min, double max) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end != '\0' || !isfinite(v))
        tool_die_usage("%s: '%s' is not a number", option, value);
    if (v < min || v > max) tool_die_usage("%s: %g is outside [%g, %g]", option, v, min, max);
    return v;
}

void tool_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}
