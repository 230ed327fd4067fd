/*
 * dstrain: train, evaluate and time image classifiers with dsrt.
 *
 * One program with subcommands (`dstrain bench ...`), each an entry in the
 * COMMANDS table below with its own file, option bindings and usage, so that
 * a new subcommand is one file and one line in COMMANDS. The library's
 * option tables drive parsing, validation messages and --help alike
 * (options.c).
 */
#include "dstrain.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} command;

static const command COMMANDS[] = {
    {"train", "train a network on an image folder, loading in the background", cmd_train},
    {"eval", "accuracy, per-class accuracy and confusion matrix of a model", cmd_eval},
    {"classify", "label and scores of image files or a folder", cmd_classify},
    {"bench", "time training steps on random data (no loader)", cmd_bench},
    {"scale", "predict data-parallel step time and efficiency on 8 to 512 GPUs", cmd_scale},
    {"analyze", "a network layer by layer: inputs, output shapes, learnables", cmd_analyze},
    {"import", "an ONNX model as a dsrt model file", cmd_import},
    {"export", "a dsrt model as an ONNX model", cmd_export},
};

static void usage(FILE *f) {
    fprintf(f, "usage: %s COMMAND [options]\n\ncommands:\n", prog);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f,
            "\n`%s COMMAND --help` describes a command's options. %s --version prints the "
            "library version.\n",
            prog, prog);
}

int main(int argc, char **argv) {
    tool_set_name(prog);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("dstrain (dsrt %s)\n", dsrt_version_string());
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(COMMANDS[i].name, cmd)) return COMMANDS[i].run(argc - 2, argv + 2);
    fprintf(stderr, "%s: unknown command '%s' (see %s --help)\n", prog, cmd, prog);
    return 2;
}
