/*
 * Options from the library's tables (dsrt/options.h) for the tools: one
 * parser, one help printer and one set of messages for dstrain and dsbench,
 * so that an option is spelled, checked and explained the same in both.
 */
#ifndef DSRT_TOOL_OPTIONS_H
#define DSRT_TOOL_OPTIONS_H

#include <dsrt.h>
#include <stdio.h>

/* The tables a tool reads: the groups of libdsrt, and for dstrain those of
 * libdsrt_train after them. */
typedef struct {
    const dsrt_option_group *groups[2];
    size_t count[2];
} tool_tables;

/* One option read from argv: its row, the value (NULL for a flag), the
 * value as a number (INT, NUMBER, SIZE; a CHOICE's index), the value's
 * current name when an older one was given, and how the user spelled it. */
typedef struct {
    const dsrt_option *row;
    const char *value;
    double number;
    char spelled[64];
} tool_arg;

/* The row named name that applies where, or NULL. */
const dsrt_option *tool_option_find(const tool_tables *t, const char *name, unsigned where,
                                    int *old);

/*
 * Reads the option at argv[*i] ("--name", "--name=value" or "--name
 * value", advancing *i past its value) against the tables for the places
 * in where. An unknown option, a missing value, or a value outside the
 * row's range or names ends the program through err (with "did you mean"
 * when a name is a slip away); an older spelling of an option or a value is
 * taken with a note on stderr. Returns 0, or 1 when argv[*i] is not an
 * option ("-" alone, or no leading '-').
 */
int tool_option_read(const tool_tables *t, unsigned where, int argc, char **argv, int *i,
                     tool_arg *out, void (*err)(const char *fmt, ...));

/*
 * Prints the options for where, a line each ("  --name ARG  help [default]",
 * wrapped at 80 columns), under each group's title; a CHOICE lists its
 * names from the library's name table.
 */
void tool_option_help(FILE *f, const tool_tables *t, unsigned where);

/* One row's help line, as tool_option_help prints it. */
void tool_option_help_row(FILE *f, const dsrt_option *o);

#endif
