/*
 * dstrain's terminal: the training table (MATLAB's verbose output), JSON
 * lines, the progress bar on stderr, the --log and --order-log lines, and
 * the signals that stop a run after its current step. The training loop
 * reports through dsrt_train_event; everything here only shows it.
 */
#include "dstrain.h"
#include "train.h"

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

double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void print_hms(FILE *f, double s) {
    long t = (long)(s + 0.5);
    fprintf(f, "%02ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* A name in a text column: escaped (tool_text_field), padded to width. */
void print_padded(const char *s, int width) {
    tool_text_field(stdout, s);
    int used = 0; /* columns: escapes as written, a UTF-8 character as one */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        used += *p == '\t' || *p == '\n' || *p == '\r' || *p == '\\' ? 2
                : *p < 0x20 || *p == 0x7f                            ? 4
                : (*p & 0xc0) == 0x80                                ? 0
                                                                     : 1;
    for (int i = used; i < width; i++) putchar(' ');
}

/* A number for JSON: null when it is not finite. buf holds 32 bytes. */
const char *jnum(char *buf, double v) {
    return tool_json_number(buf, "%.6g", v);
}

/* SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session): the first
 * stops training after the current step, a second exits at once. The
 * handler may run on any thread (the one training holds signals while the
 * CPU computes), hence an atomic, lock-free and so safe in a handler. */
static atomic_int stop_signal;

static const struct {
    int sig;
    const char *name;
} stop_signals[] = {{SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}};

const char *signal_name(int sig) {
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        if (stop_signals[i].sig == sig) return stop_signals[i].name;
    return "a signal";
}

static void on_stop_signal(int sig) {
    if (atomic_exchange(&stop_signal, sig) != 0) _exit(128 + sig);
    static const char msg[] = "\ndstrain: stopping after this step (again to quit at once)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaction(stop_signals[i].sig, &sa, NULL);
}

int stop_signal_seen(void) {
    return atomic_load(&stop_signal);
}

void bar_clear(train_ui *u) {
    if (u->bar_shown) {
        fprintf(stderr, "\r\033[K");
        u->bar_shown = 0;
    }
}

static void table_rule(void) {
    printf("|");
    for (int i = 0; i < 118; i++) putchar('=');
    printf("|\n");
}

static void table_head(void) {
    table_rule();
    printf("|  Epoch  |  Iteration  |  Time Elapsed  |  Mini-batch  |  Validation  |  Mini-batch  "
           "|  Validation  |  Base Learning  |\n");
    printf("|         |             |   (hh:mm:ss)   |   Accuracy   |   Accuracy   |     Loss     "
           "|     Loss     |      Rate       |\n");
    table_rule();
}

static void fmt_pct(char *b, size_t n, double v) {
    if (isnan(v))
        snprintf(b, n, "%s", "");
    else
        snprintf(b, n, "%.2f%%", 100 * v);
}

static void fmt_loss(char *b, size_t n, double v) {
    if (isnan(v))
        snprintf(b, n, "%s", "");
    else
        snprintf(b, n, "%.4f", v);
}

/* A line of the --log file (CSV or JSON lines) for an iteration. */
static void train_log(train_ui *u, const dsrt_train_event *e) {
    char b[5][32];
    if (u->log_json)
        fprintf(u->log,
                "{\"epoch\": %lld, \"iteration\": %lld, \"time_s\": %s, \"loss\": "
                "%s, \"accuracy\": %s, \"learn_rate\": %s%s",
                (long long)e->epoch, (long long)e->iteration,
                tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->loss),
                jnum(b[2], e->accuracy), jnum(b[3], e->learn_rate),
                isnan(e->val_accuracy) ? "}\n" : "");
    else
        fprintf(u->log, "%lld,%lld,%.3f,%.6g,%.6g,%.6g,", (long long)e->epoch,
                (long long)e->iteration, e->elapsed_s, e->loss, e->accuracy, e->learn_rate);
    /* (A validation's accuracy is a count, finite even where its loss is not.) */
    if (!isnan(e->val_accuracy)) {
        if (u->log_json)
            fprintf(u->log, ", \"val_loss\": %s, \"val_accuracy\": %s}\n", jnum(b[0], e->val_loss),
                    jnum(b[1], e->val_accuracy));
        else
            fprintf(u->log, "%.6g,%.6g\n", e->val_loss, e->val_accuracy);
    } else if (!u->log_json) {
        fprintf(u->log, ",\n");
    }
}

/* The progress bar on stderr, at most ten times a second. */
static void train_bar(train_ui *u, const dsrt_train_event *e) {
    double t = now();
    if (t - u->last_bar > 0.1 || e->batch_in_epoch == e->iterations_per_epoch) {
        u->last_bar = t;
        int width = 30, fill = (int)(width * e->batch_in_epoch /
                                     (e->iterations_per_epoch ? e->iterations_per_epoch : 1));
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        double left = e->images_per_s > 0 && e->iteration > 0
                          ? (double)(e->max_iterations - e->iteration) *
                                ((double)e->images / (double)e->iteration) / e->images_per_s
                          : 0;
        fprintf(stderr, "\repoch %lld/%lld [%s] %lld/%lld  %.0f images/s  ", (long long)e->epoch,
                (long long)e->max_epochs, bar, (long long)e->batch_in_epoch,
                (long long)e->iterations_per_epoch, e->images_per_s);
        fprintf(stderr, "left ");
        print_hms(stderr, left);
        fprintf(stderr, "\033[K");
        u->bar_shown = 1;
    }
}

int train_event(void *ctx, const dsrt_train_event *e) {
    train_ui *u = ctx;
    char b[5][32];
    if (u->hist) dsrt_train_history_add(u->hist, e);
    switch (e->kind) {
    case DSRT_EVENT_START:
        u->ipe = e->iterations_per_epoch;
        if (u->table) {
            printf("%lld iterations a epoch, %lld in all; %u pipeline worker%s, %d compute "
                   "thread%s%s\n",
                   (long long)e->iterations_per_epoch, (long long)e->max_iterations, e->workers,
                   e->workers == 1 ? "" : "s", e->compute_threads,
                   e->compute_threads == 1 ? "" : "s", e->pinned ? " (pinned)" : "");
            table_head();
        }
        if (u->json)
            printf("{\"event\": \"start\", \"iteration\": %lld, \"iterations_per_epoch\": %lld, "
                   "\"max_iterations\": %lld, \"workers\": %u, \"compute_threads\": %d, "
                   "\"pinned\": %d}\n",
                   (long long)e->iteration, (long long)e->iterations_per_epoch,
                   (long long)e->max_iterations, e->workers, e->compute_threads, e->pinned);
        break;
    case DSRT_EVENT_ITERATION:
        if (u->log) train_log(u, e);
        if (u->order) {
            fprintf(u->order, "%lld %lld:", (long long)e->epoch - 1,
                    (long long)e->batch_in_epoch - 1);
            for (size_t i = 0; i < e->ids_count; i++) fprintf(u->order, " %u", e->ids[i]);
            fputc('\n', u->order);
        }
        if (e->verbose && u->table) {
            bar_clear(u);
            char a[16], va[16], l[16], vl[16];
            fmt_pct(a, sizeof a, e->accuracy);
            fmt_pct(va, sizeof va, e->val_accuracy);
            fmt_loss(l, sizeof l, e->loss);
            fmt_loss(vl, sizeof vl, e->val_loss);
            printf("| %7lld | %11lld |       ", (long long)e->epoch, (long long)e->iteration);
            print_hms(stdout, e->elapsed_s);
            printf(" | %12s | %12s | %12s | %12s | %15.4g |\n", a, va, l, vl, e->learn_rate);
            fflush(stdout);
        }
        if (e->verbose && u->json)
            printf("{\"event\": \"iteration\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": "
                   "%s, \"loss\": %s, \"accuracy\": %s, \"learn_rate\": %s, "
                   "\"images_per_s\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->loss),
                   jnum(b[2], e->accuracy), jnum(b[3], e->learn_rate),
                   tool_json_number(b[4], "%.1f", e->images_per_s));
        if (u->progress) train_bar(u, e);
        break;
    case DSRT_EVENT_VALIDATION:
        if (u->json)
            printf("{\"event\": \"validation\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": "
                   "%s, \"val_loss\": %s, \"val_accuracy\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s), jnum(b[1], e->val_loss),
                   jnum(b[2], e->val_accuracy));
        break;
    case DSRT_EVENT_EPOCH:
        if (u->json)
            printf("{\"event\": \"epoch\", \"epoch\": %lld, \"iteration\": %lld, \"time_s\": %s, "
                   "\"images_per_s\": %s}\n",
                   (long long)e->epoch, (long long)e->iteration,
                   tool_json_number(b[0], "%.3f", e->elapsed_s),
                   tool_json_number(b[1], "%.1f", e->images_per_s));
        if (u->plot && u->hist && dsrt_train_history_svg(u->hist, u->plot, u->title) != 0) {
            bar_clear(u);
            fprintf(stderr, "%s train: --plot: %s\n", prog, dsrt_last_error());
            u->plot_failed = 1;
        }
        if (u->log) fflush(u->log);
        break;
    case DSRT_EVENT_CHECKPOINT:
        if (u->json) {
            printf("{\"event\": \"checkpoint\", \"iteration\": %lld, \"path\": ",
                   (long long)e->iteration);
            tool_json_string(stdout, e->checkpoint);
            printf("}\n");
        }
        break;
    case DSRT_EVENT_END:
        bar_clear(u);
        if (u->table) table_rule();
        break;
    case DSRT_EVENT_BAD_SAMPLE:
        tool_bad_add(&u->bad[e->validation != 0], e->bad_sample);
        break;
    }
    if (u->json) fflush(stdout);
    return atomic_load(&stop_signal) != 0;
}
