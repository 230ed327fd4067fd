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

/* Writes s as a JSON string literal, with quotes and escapes; bytes that are
 * not UTF-8 become U+FFFD, so the output is always valid JSON. */
void tool_json_string(FILE *f, const char *s);

/* Writes s for a tab-separated text column: tab, newline, carriage return,
 * other control bytes and backslash as C escapes (\t, \n, \x01, \\), so
 * that a name never breaks the columns. */
void tool_text_field(FILE *f, const char *s);

/* Opens path for reading without waiting (a FIFO does not block) and
 * refuses anything but a regular file. Returns the descriptor and the size
 * in *size, or -1 with the reason in why. */
int tool_open_regular(const char *path, char *why, size_t why_cap, long long *size);

/*
 * Reads the whole file at path into a new NUL-terminated buffer (the caller
 * frees it) of *len bytes. Refuses, without waiting or reading, anything but
 * a regular file (a FIFO, a device, a folder) and files larger than max
 * bytes. Returns NULL with the reason in why (why_cap bytes): "is a FIFO,
 * not a regular file", "No such file or directory", ...
 */
char *tool_read_file(const char *path, size_t max, size_t *len, char *why, size_t why_cap);

#endif
