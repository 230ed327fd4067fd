/*
 * Options from the library's tables for the tools; see tool_options.h.
 */
#include "tool_options.h"

#include "tool_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const dsrt_option *tool_option_find(const tool_tables *t, const char *name, unsigned where,
                                    int *old) {
    for (size_t k = 0; k < 2; k++) {
        if (!t->groups[k]) continue;
        const dsrt_option *o = dsrt_option_find(t->groups[k], t->count[k], name, where, old);
        if (o) return o;
    }
    return NULL;
}

static const char *tool_option_nearest(const tool_tables *t, const char *name, unsigned where) {
    for (size_t k = 0; k < 2; k++) {
        if (!t->groups[k]) continue;
        const char *n = dsrt_option_nearest(t->groups[k], t->count[k], name, where);
        if (n) return n;
    }
    return NULL;
}

int tool_option_read(const tool_tables *t, unsigned where, int argc, char **argv, int *i,
                     tool_arg *out, void (*err)(const char *fmt, ...)) {
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') return 1;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    snprintf(out->spelled, sizeof out->spelled, "%.*s", (int)len, a);
    int old = 0;
    const dsrt_option *o = tool_option_find(t, out->spelled, where, &old);
    if (!o) {
        const char *near = tool_option_nearest(t, out->spelled, where);
        if (near) err("unknown option '%s': did you mean --%s?", out->spelled, near);
        err("unknown option '%s'", out->spelled);
    }
    if (old) fprintf(stderr, "%s: note: %s is now --%s\n", tool_program(), out->spelled, o->name);
    out->row = o;
    out->value = NULL;
    out->number = 0;
    if (o->type == DSRT_OPTION_FLAG && old && strncmp(o->name, "no-", 3) == 0 &&
        strcmp(o->old, o->name + 3) == 0) {
        /* --decode-dc 0|1 became --no-decode-dc: the older one's value. */
        const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
        if (!v || (strcmp(v, "0") && strcmp(v, "1")))
            err("%s: '%s' is not 0 or 1", out->spelled, v ? v : "");
        out->value = v;
        return 0;
    }
    if (o->type == DSRT_OPTION_FLAG) {
        if (eq) err("%s takes no value", out->spelled);
        return 0;
    }
    const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!v || !*v) err("%s needs a value (%s)", out->spelled, o->arg ? o->arg : "VALUE");
    const char *renamed = NULL;
    if (dsrt_option_value(o, out->spelled, v, &out->number, &renamed) != 0)
        err("%s", dsrt_last_error());
    if (renamed) {
        fprintf(stderr, "%s: note: %s %s is now %s %s\n", tool_program(), out->spelled, v,
                out->spelled, renamed);
        v = renamed;
    }
    out->value = v;
    return 0;
}

/* Writes text from column col on, wrapped at 80 columns with lines after
 * the first indented by indent. */
static void wrap(FILE *f, const char *text, int col, int indent) {
    for (const char *p = text; *p;) {
        size_t w = strcspn(p, " ");
        if (col > indent && col + 1 + (int)w > 80) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, w, f);
        col += (int)w;
        p += w;
        while (*p == ' ') p++;
    }
    fputc('\n', f);
}

void tool_option_help_row(FILE *f, const dsrt_option *o) {
    char left[64], text[2048];
    snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    size_t at = (size_t)snprintf(text, sizeof text, "%s", o->help);
    if (o->choice && o->choice(0)) {
        at += (size_t)snprintf(text + at, sizeof text - at, " (");
        for (int k = 0, shown = 0; o->choice(k) && at < sizeof text; k++)
            if (*o->choice(k))
                at += (size_t)snprintf(text + at, sizeof text - at, "%s%s", shown++ ? ", " : "",
                                       o->choice(k));
        if (at < sizeof text) at += (size_t)snprintf(text + at, sizeof text - at, ")");
    }
    if (o->def && at < sizeof text) snprintf(text + at, sizeof text - at, " [%s]", o->def);
    int col = fprintf(f, "  %-24s", left);
    if (col > 26) {
        fprintf(f, "\n%26s", "");
        col = 26;
    }
    wrap(f, text, col, 26);
}

void tool_option_help(FILE *f, const tool_tables *t, unsigned where) {
    for (size_t k = 0; k < 2; k++)
        for (size_t g = 0; t->groups[k] && g < t->count[k]; g++) {
            const dsrt_option_group *grp = &t->groups[k][g];
            int head = 0;
            for (size_t r = 0; r < grp->count; r++) {
                if (!(grp->options[r].where & where)) continue;
                if (!head++) fprintf(f, "\n%s:\n", grp->title);
                tool_option_help_row(f, &grp->options[r]);
            }
        }
    fprintf(f, "\n  %-24s this help\n", "-h, --help");
}
