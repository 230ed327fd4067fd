/*
 * Small helpers shared by dsrt's command-line tools: dying with a message,
 * reading option values, and writing JSON strings. Tools may exit; the
 * library never does.
 */
#ifndef DSRT_TOOL_COMMON_H
#define DSRT_TOOL_COMMON_H

#include <dsrt.h>
#include <stdint.h>
#include <stdio.h>

/* The program name used in messages ("dsbench"). */
void tool_set_name(const char *name);

/* The program name used in messages. */
const char *tool_program(void);

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

/* A size in bytes: digits with an optional K, M, G or T (powers of 1024,
 * "KiB", "MB" and "M" alike); dies naming the option when it is not one or
 * lies outside [min, max]. */
uint64_t tool_bytes(const char *option, const char *value, uint64_t min, uint64_t max);

/* auto, exact or shard; dies naming the option otherwise. */
dsrt_shard_order tool_shard_order(const char *option, const char *value);

/* Writes s as a JSON string literal, with quotes and escapes; bytes that are
 * not UTF-8 become U+FFFD, so the output is always valid JSON. */
void tool_json_string(FILE *f, const char *s);

/* A number for JSON, formatted by fmt (one double conversion, "%.6g"), in
 * buf (32 bytes): "null" when v is NaN or infinite, which JSON cannot hold.
 * Returns buf or the literal "null". */
const char *tool_json_number(char *buf, const char *fmt, double v)
    __attribute__((format(printf, 2, 0)));

/* Writes s for a tab-separated text column: tab, newline, carriage return,
 * other control bytes, bytes that are not UTF-8 and backslash as C escapes
 * (\t, \n, \x01, \xe9, \\), so that a name never breaks the columns. */
void tool_text_field(FILE *f, const char *s);

/* 1 when paths a and b both name one existing file (the same device and
 * inode, whatever links or spellings lead there), else 0. */
int tool_same_file(const char *a, const char *b);

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

// ----------------------------------------------------------------------------
// Bad files: the same report in every tool

/* Bad files named in full on stderr and in JSON; the rest are counted (and
 * all written to the --bad-list file). */
#define TOOL_BAD_SHOWN 20

typedef struct {
    dsrt_bad_sample shown[TOOL_BAD_SHOWN]; /* the first ones; strings owned */
    size_t n_shown;
    uint64_t total;   /* files found bad */
    FILE *out;        /* the --bad-list file, or NULL */
    const char *data; /* "val" for the list file's "data" field, or NULL */
    int write_failed; /* a line could not be written to out */
} tool_bad_list;

/* text (a path or URL) as messages show it, in buf: credentials masked
 * (dsrt_text_redact). Returns buf. */
const char *tool_shown(const char *text, char *buf, size_t cap);

/* Counts one bad file, keeps it if among the first, writes it to l->out;
 * its path and error with credentials masked (dsrt_text_redact). */
void tool_bad_add(tool_bad_list *l, const dsrt_bad_sample *b);
void tool_bad_free(tool_bad_list *l);

/*
 * On stderr: "<who>: N bad files, skipped S times:" (or "left out" when
 * left_out is set) and one line "  PATH: error" for each kept, then
 * "  ... and K more" with a pointer to --bad-list (or to list_path when it
 * was given). Nothing when there is none.
 */
void tool_bad_print(const char *who, const char *what, const tool_bad_list *l, uint64_t skipped,
                    int left_out, const char *list_path);

/* JSON members, each preceded by ", ": "<prefix>bad_files": [{"path": P,
 * "error": E}, ...] (the kept ones; "path" null and "id" for a sample held
 * in memory), "<prefix>bad_files_total": N, "<prefix>skipped": S. */
void tool_bad_json(FILE *f, const char *prefix, const tool_bad_list *l, uint64_t skipped);

/* Opens path for writing a report (--log, --bad-list): a regular file,
 * created or truncated, or a device such as /dev/null; a FIFO without a
 * reader and a folder are refused at once. NULL with the reason in why. */
FILE *tool_open_output(const char *path, char *why, size_t why_cap);

/*
 * Checks, before any work, that a file can be written at path: its folder
 * exists and takes a new file (tried with a temporary file, removed), and
 * path is not a folder, nor (with regular set) anything but a regular file.
 * 0, or -1 with the reason in why.
 */
int tool_check_output(const char *path, int regular, char *why, size_t why_cap);

#endif
