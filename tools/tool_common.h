/*
 * Small helpers shared by dsrt's command-line tools: dying with a message,
 * reading option values, and writing JSON strings. Tools may exit; the
 * library never does.
 */
#ifndef DSRT_TOOL_COMMON_H
#define DSRT_TOOL_COMMON_H

#include <stdio.h>

/* The program name used in messages ("dsbench"). */
void tool_set_name(const char *name);

/* Prints "name: message" to stderr and exits with status 1. */
void tool_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Prints "name: message" and a pointer to --help, exits with status 2. */
void tool_die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* The value of option argv[*i]: argv[*i + 1], advancing *i; dies when missing. */
const char *tool_value(int argc, char **argv, int *i);

/* Integer and floating-point option values, checked: dies naming the option
 * when the value is not a number or lies outside [min, max]. */
long long tool_int(const char *option, const char *value, long long min, long long max);
double tool_double(const char *option, const char *value, double min, double max);

/* Writes s as a JSON string literal, with quotes and escapes. */
void tool_json_string(FILE *f, const char *s);

#endif
