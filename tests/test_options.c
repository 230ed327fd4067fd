/*
 * The option tables (dsrt/options.h): every row well formed (a name, help,
 * a default within its range and among its names), one meaning per name
 * (rows of one name have one type), no two rows for one name in one place,
 * the defaults the rows state equal to the library's defaults constructors,
 * the values' checks and their "did you mean", and the README, dstrain and
 * dsbench naming no option the tables lack.
 */
#include "task.h"

#include <dsrt.h>

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dsrt_option_group *groups[2];
static size_t counts[2];

#define FOR_ROWS(o)                                                                                \
    for (size_t k_ = 0; k_ < 2; k_++)                                                              \
        for (size_t g_ = 0; g_ < counts[k_]; g_++)                                                 \
            for (const dsrt_option *o = groups[k_][g_].options;                                    \
                 o < groups[k_][g_].options + groups[k_][g_].count; o++)

/* The row for name in where, from either table. */
static const dsrt_option *find(const char *name, unsigned where) {
    for (size_t k = 0; k < 2; k++) {
        const dsrt_option *o = dsrt_option_find(groups[k], counts[k], name, where, NULL);
        if (o) return o;
    }
    return NULL;
}

static int is_choice_name(const dsrt_option *o, const char *name) {
    for (int i = 0; o->choice(i); i++)
        if (!strcmp(o->choice(i), name)) return 1;
    return 0;
}

static void test_rows_well_formed(void) {
    FOR_ROWS(o) {
        CHECK(o->name && o->name[0] && o->help && o->help[0] && o->where);
        for (const char *c = o->name; *c; c++)
            CHECK(islower((unsigned char)*c) || isdigit(*c) || *c == '-');
        CHECK((o->type == DSRT_OPTION_FLAG) == (o->arg == NULL));
        if (o->type == DSRT_OPTION_CHOICE) {
            CHECK(o->choice != NULL && o->choice(0) != NULL);
            /* A default that is a name (not a phrase) is one of them. */
            if (o->def && !strpbrk(o->def, " :;,"))
                if (!is_choice_name(o, o->def)) {
                    fprintf(stderr, "--%s: default '%s' is none of its names\n", o->name, o->def);
                    CHECK(0);
                }
        }
        /* A default that is a number (not a phrase: "auto", "--batch"). */
        if ((o->type == DSRT_OPTION_INT || o->type == DSRT_OPTION_NUMBER) && o->def &&
            isdigit((unsigned char)o->def[0]) &&
            strspn(o->def, "0123456789.e+-") == strlen(o->def)) {
            double v;
            if (dsrt_option_value(o, o->name, o->def, &v, NULL) != 0) {
                fprintf(stderr, "--%s: default: %s\n", o->name, dsrt_last_error());
                CHECK(0);
            }
        }
    }
}

static void test_one_meaning(void) {
    FOR_ROWS(a) {
        FOR_ROWS(b) {
            if (a >= b || strcmp(a->name, b->name)) continue;
            if (a->where & b->where) {
                fprintf(stderr, "--%s: two rows for one place (%#x)\n", a->name,
                        a->where & b->where);
                CHECK(0);
            }
            /* The same name means the same kind of value everywhere (a
             * count is never a file). A choice may be narrower in one place. */
            int same = a->type == b->type ||
                       (a->type == DSRT_OPTION_CHOICE) != (b->type == DSRT_OPTION_CHOICE);
            if (!same && a->type != DSRT_OPTION_TEXT && b->type != DSRT_OPTION_TEXT)
                fprintf(stderr, "--%s: a %s here, a %s there\n", a->name,
                        dsrt_option_type_name(a->type), dsrt_option_type_name(b->type));
            CHECK(same || a->type == DSRT_OPTION_TEXT || b->type == DSRT_OPTION_TEXT);
        }
    }
}

/* A row's default equals the value the library's constructor sets. */
static void check_default(const char *name, unsigned where, double want) {
    const dsrt_option *o = find(name, where);
    CHECK(o != NULL);
    CHECK(o->def != NULL);
    double v;
    if (o->type == DSRT_OPTION_TEXT) /* a number its tool parses */
        v = strtod(o->def, NULL);
    else
        CHECK_OK(dsrt_option_value(o, name, o->def, &v, NULL));
    if (v != want) fprintf(stderr, "--%s: the table says %s, the library %g\n", name, o->def, want);
    CHECK(v == want);
}

static void test_defaults_agree(void) {
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    dsrt_datastore_options ds = dsrt_datastore_defaults();
    unsigned py = DSRT_IN_PY_PIPELINE, dsb = DSRT_IN_DSBENCH;
    check_default("prefetch", py, po.prefetch);
    check_default("prefetch", dsb, po.prefetch);
    check_default("batch", dsb, (double)po.batch);
    check_default("seed", py, (double)po.seed);
    check_default("shuffle", py, po.shuffle);
    check_default("io", py, po.reader.io);
    check_default("depth", dsb, po.reader.depth);
    check_default("remote-depth", py, po.reader.remote.depth);
    check_default("retry-deadline", py, po.reader.remote.retry_deadline_s);
    check_default("request-timeout", py, po.reader.remote.timeout_s);
    check_default("shuffle-buffer", DSRT_IN_PY_DATASTORE, (double)ds.shuffle_buffer);
    check_default("order", DSRT_IN_PY_DATASTORE, ds.shard_order);
    check_default("labels", DSRT_IN_PY_DATASTORE, ds.label_source);
    check_default("source", DSRT_IN_PY_DATASTORE, ds.source);
    check_default("epochs", py, (double)po.epochs);
    check_default("max-pixels", py, (double)po.decoder.max_pixels);
    check_default("max-consecutive-bad", py, po.max_consecutive_bad);
    check_default("max-file-bytes", py, (double)po.max_file_bytes);
    check_default("chunk", py, (double)po.chunk);
    check_default("native-max-pixels", py, (double)po.native_max_pixels);
    check_default("gpu", py, po.gpu);
    check_default("mix-prob", py, po.mix_prob);
    check_default("mix-switch-prob", py, po.mix_switch_prob);
    check_default("label-smoothing", py, po.label_smoothing);
    check_default("mixup-alpha", DSRT_IN_TRAIN, po.mixup_alpha);
    dsrt_train_options to = dsrt_train_defaults();
    check_default("epochs", DSRT_IN_TRAIN, to.max_epochs);
    check_default("batch", DSRT_IN_TRAIN, to.batch);
    check_default("shuffle", DSRT_IN_TRAIN, to.shuffle);
    check_default("prefetch", DSRT_IN_TRAIN, to.prefetch);
    check_default("verbose-frequency", DSRT_IN_TRAIN, to.verbose_frequency);
}

static void test_values(void) {
    const dsrt_option *o = find("shuffle", DSRT_IN_DSBENCH);
    double v;
    const char *renamed;
    CHECK_OK(dsrt_option_value(o, "--shuffle", "every-epoch", &v, &renamed));
    CHECK_EQ((int)v, DSRT_SHUFFLE_EVERY_EPOCH);
    CHECK(renamed == NULL);
    /* The older name is taken, and says what it is now. */
    CHECK_OK(dsrt_option_value(o, "--shuffle", "epoch", &v, &renamed));
    CHECK_EQ((int)v, DSRT_SHUFFLE_EVERY_EPOCH);
    CHECK_STR_EQ(renamed, "every-epoch");
    CHECK_EQ(dsrt_option_value(o, "--shuffle", "every_epoch", &v, NULL), DSRT_EOPTION);
    CHECK(strstr(dsrt_last_error(), "did you mean every-epoch?") != NULL);
    CHECK(strstr(dsrt_last_error(), "--shuffle: 'every_epoch' is not never, once or every-epoch"));
    o = find("batch", DSRT_IN_DSBENCH);
    CHECK_EQ(dsrt_option_value(o, "batch", "0", &v, NULL), DSRT_EOPTION);
    CHECK(strstr(dsrt_last_error(), "batch: 0 is outside [1, 16777216]") != NULL);
    CHECK_EQ(dsrt_option_value(o, "--batch", "x", &v, NULL), DSRT_EOPTION);
    CHECK(strstr(dsrt_last_error(), "is not an integer") != NULL);
    o = find("shards", DSRT_IN_DSBENCH_CONVERT);
    CHECK_OK(dsrt_option_value(o, "--shards", "1M", &v, NULL));
    CHECK(v == 1048576.0);
    /* The sources' names come from the library's table: every one there. */
    o = find("source", DSRT_IN_DSBENCH);
    CHECK(is_choice_name(o, "zip") && is_choice_name(o, "shards") && is_choice_name(o, "folder"));
    /* Names with '_' and a leading "--" find their row; older spellings too. */
    int old;
    CHECK(find("--shuffle_buffer", DSRT_IN_PY_DATASTORE) != NULL);
    CHECK(dsrt_option_find(groups[0], counts[0], "threads", DSRT_IN_DSBENCH, &old) ==
          find("workers", DSRT_IN_DSBENCH));
    CHECK_EQ(old, 1);
    CHECK_STR_EQ(dsrt_option_nearest(groups[0], counts[0], "--epoch", DSRT_IN_DSBENCH), "epochs");
    CHECK(dsrt_option_nearest(groups[0], counts[0], "--zzzzzz", DSRT_IN_DSBENCH) == NULL);
    /* The library's own name lookups say "did you mean" too. */
    dsrt_source s;
    CHECK_EQ(dsrt_source_from_name("folders", &s), DSRT_EOPTION);
    CHECK(strstr(dsrt_last_error(), "did you mean folder?") != NULL);
    /* --net lists every built-in net. */
    const char *const *nets;
    dsrt_net_builtin("", &nets);
    o = find("net", DSRT_IN_TRAIN);
    for (int i = 0; nets[i]; i++) CHECK(is_choice_name(o, nets[i]));
}

/* Every "--name" in path's text names a row (or one of allowed). */
static int check_names_in(const char *path, const char *const *allowed) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot read\n", path);
        return 1;
    }
    char line[4096];
    int bad = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        for (char *p = line; (p = strstr(p, "--")); p += 2) {
            if (p > line && (isalnum((unsigned char)p[-1]) || p[-1] == '-')) continue;
            char name[64];
            size_t n = 0;
            while (n < sizeof name - 1 && (islower((unsigned char)p[2 + n]) ||
                                           isdigit((unsigned char)p[2 + n]) || p[2 + n] == '-'))
                name[n] = p[2 + n], n++;
            name[n] = '\0';
            if (n < 2 || name[n - 1] == '-') continue;
            int ok = find(name, ~0u) != NULL;
            for (size_t i = 0; !ok && allowed[i]; i++) ok = !strcmp(allowed[i], name);
            int old;
            for (size_t k = 0; !ok && k < 2; k++)
                ok = dsrt_option_find(groups[k], counts[k], name, ~0u, &old) != NULL;
            if (!ok) {
                fprintf(stderr, "%s:%d: --%s is in no option table\n", path, lineno, name);
                bad = 1;
            }
        }
    }
    fclose(f);
    return bad;
}

static void test_docs_name_rows(void) {
    const char *src = getenv("DSRT_SOURCE_DIR");
    if (!src) return;
    /* Options of other programs the README shows (cmake, mpirun, pip,
     * torchvision's scripts) and the tools' own --help and --version. */
    static const char *const allowed[] = {
        "help", "version", "build", "target", "test-dir", "output-on-failure", "oversubscribe",
        "np", "bind-to", "map-by", "user", "break-system-packages", "durations", "prefix",
        "parallel", "label-regex", "list", "dry-run", "install", "config", "preset-list",
        /* dsrt's build and test scripts */
        "sanitize", "variety", "loaders-only",
        /* pkg-config, the linker, pip, torchrun, the proxy, the peer benchmarks */
        "libs", "static", "export-dynamic", "tool", "system-site-packages", "no-build-isolation",
        "nproc-per-node", "format", "nginx-cache", "device", "channels-last", NULL};
    char path[4096];
    snprintf(path, sizeof path, "%s/README.md", src);
    CHECK_EQ(check_names_in(path, allowed), 0);
    /* Every page of docs/ likewise. */
    snprintf(path, sizeof path, "%s/docs", src);
    DIR *d = opendir(path);
    REQUIRE(d);
    int pages = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".md") != 0) continue;
        snprintf(path, sizeof path, "%s/docs/%s", src, e->d_name);
        CHECK_EQ(check_names_in(path, allowed), 0);
        pages++;
    }
    closedir(d);
    CHECK_GT(pages, 0);
}

int main(void) {
    counts[0] = dsrt_option_groups(&groups[0]);
    counts[1] = dsrt_train_option_groups(&groups[1]);
    test_rows_well_formed();
    test_one_meaning();
    test_defaults_agree();
    test_values();
    test_docs_name_rows();
    return 0;
}
