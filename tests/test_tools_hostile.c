/*
 * The command-line tools given what strangers give: class folders whose
 * names hold quotes, backslashes, control bytes and bytes that are not
 * UTF-8; models whose weights are NaN; --classes files with NUL bytes and
 * control characters; outputs that name an input; a checkpoint's state file
 * where the checkpoint is meant; a resume with nothing measured. Every JSON
 * line every tool writes is read by a strict parser (RFC 8259: no NaN, no
 * raw control bytes, UTF-8 throughout), so a writer that lets a non-finite
 * number or a hostile name through fails here.
 */
#include "toolrun.h"

#include <ctype.h>
#include <math.h>

static char good[4200], model[4200], onnx[4200], hugemodel[4200], nanfile[4200];

// ----------------------------------------------------------------------------
// A strict JSON reader

typedef struct {
    const char *p, *end;
    int depth;
} jreader;

static void j_ws(jreader *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int j_value(jreader *j);

static int j_lit(jreader *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return -1;
    j->p += n;
    return 0;
}

static int j_string(jreader *j) {
    if (j->p >= j->end || *j->p != '"') return -1;
    j->p++;
    while (j->p < j->end) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (++j->p >= j->end) return -1;
            char e = *j->p++;
            if (e == 'u') {
                for (int k = 0; k < 4; k++, j->p++)
                    if (j->p >= j->end || !isxdigit((unsigned char)*j->p)) return -1;
            } else if (!strchr("\"\\/bfnrt", e)) {
                return -1;
            }
            continue;
        }
        int n = c < 0x80             ? 1
                : (c & 0xe0) == 0xc0 ? 2
                : (c & 0xf0) == 0xe0 ? 3
                : (c & 0xf8) == 0xf0 ? 4
                                     : 0;
        if (!n || j->end - j->p < n) return -1;
        uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
        for (int k = 1; k < n; k++) {
            unsigned char t = (unsigned char)j->p[k];
            if ((t & 0xc0) != 0x80) return -1;
            cp = cp << 6 | (t & 0x3fu);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (n > 1 && (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) return -1;
        j->p += n;
    }
    return -1;
}

static int j_digits(jreader *j) {
    const char *s = j->p;
    while (j->p < j->end && isdigit((unsigned char)*j->p)) j->p++;
    return j->p > s ? 0 : -1;
}

static int j_number(jreader *j) {
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p < j->end && *j->p == '0')
        j->p++;
    else if (j_digits(j))
        return -1;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j_digits(j)) return -1;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (j_digits(j)) return -1;
    }
    return 0;
}

static int j_items(jreader *j, char close, int keyed) {
    j->p++;
    if (++j->depth > 64) return -1;
    j_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return 0;
    }
    for (;;) {
        j_ws(j);
        if (keyed) {
            if (j_string(j)) return -1;
            j_ws(j);
            if (j->p >= j->end || *j->p++ != ':') return -1;
        }
        if (j_value(j)) return -1;
        j_ws(j);
        if (j->p >= j->end) return -1;
        char c = *j->p++;
        if (c == close) break;
        if (c != ',') return -1;
    }
    j->depth--;
    return 0;
}

static int j_value(jreader *j) {
    j_ws(j);
    if (j->p >= j->end) return -1;
    switch (*j->p) {
    case '{':
        return j_items(j, '}', 1);
    case '[':
        return j_items(j, ']', 0);
    case '"':
        return j_string(j);
    case 't':
        return j_lit(j, "true");
    case 'f':
        return j_lit(j, "false");
    case 'n':
        return j_lit(j, "null");
    default:
        return j_number(j);
    }
}

/* Checks that every non-empty line of text is one strict JSON value; says
 * which is not. Returns the number of lines read, or -1. */
static int json_quiet;

static int json_lines(const char *text, const char *what) {
    int n = 0;
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        const char *end = nl ? nl : line + strlen(line);
        if (end > line) {
            jreader j = {line, end, 0};
            int bad = j_value(&j);
            j_ws(&j);
            if (bad || j.p != end) {
                if (!json_quiet)
                    fprintf(stderr, "  %s: not strict JSON at byte %td: %.*s\n", what,
                            j.p - line + 1, (int)(end - line), line);
                return -1;
            }
            n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    return n;
}

/* The reader's own check: what it must refuse and accept. */
static void test_json_reader(void) {
    CHECK_EQ(json_lines("{\"a\": [1, -2.5e3, null, true, \"x\\u00e9\"]}\n", "ok"), 1);
    json_quiet = 1;
    CHECK_EQ(json_lines("{\"a\": nan}", "nan"), -1);
    CHECK_EQ(json_lines("{\"a\": NaN}", "NaN"), -1);
    CHECK_EQ(json_lines("{\"a\": inf}", "inf"), -1);
    CHECK_EQ(json_lines("{\"a\": -Infinity}", "-Infinity"), -1);
    CHECK_EQ(json_lines("{\"a\": \"caf\xe9\"}", "latin-1"), -1);
    CHECK_EQ(json_lines("{\"a\": \"tab\there\"}", "raw tab"), -1);
    CHECK_EQ(json_lines("{\"a\": \"x\"y\"}", "quote"), -1);
    CHECK_EQ(json_lines("{\"a\": 01}", "leading zero"), -1);
    CHECK_EQ(json_lines("{\"a\": 1,}", "trailing comma"), -1);
    json_quiet = 0;
}

/* Checks every line of the file at path as JSON; returns the lines. */
static int json_file(const char *path) {
    char *s = slurp(path);
    int n = json_lines(s, path);
    free(s);
    return n;
}

// ----------------------------------------------------------------------------
// Every JSON writer, on hostile names and non-finite numbers

static const char *const HOSTILE[] = {"q\"uote", "back\\slash", "ctl\x01x", "caf\xe9", "tab\there"};

static void test_json_writers(void) {
    char dir[4300], m[4300], log[4300], bad[4300], ck[4300];
    snprintf(dir, sizeof dir, "%s/hostile", root);
    snprintf(m, sizeof m, "%s/hostile.dsrt", root);
    snprintf(log, sizeof log, "%s/hostile-log.jsonl", root);
    snprintf(bad, sizeof bad, "%s/hostile-bad.jsonl", root);
    snprintf(ck, sizeof ck, "%s/hostile-ck", root);
    make_images(dir, HOSTILE, 5, 6);
    char empty[4400];
    snprintf(empty, sizeof empty, "%s/%s/bad\x02\"name.png", dir, HOSTILE[0]);
    REQUIRE(timg_write_file(empty, "", 0) == 0);

    result r = run(ARGV(bin_train, "train", "--data", dir, "--val", dir, "--epochs", "2", "--batch",
                        "8", "--json", "--log", log, "--bad-list", bad, "--save", m,
                        "--checkpoint-dir", ck, "--verbose-frequency", "1"),
                   300);
    CHECK_EQ(r.status, 0);
    CHECK_GE(json_lines(r.out, "train --json"), 8);
    CHECK_GE(json_file(log), 4);
    CHECK_GE(json_file(bad), 1);
    result_free(&r);

    /* The same model with weights that overflow: training stops at the
     * first loss, saying so in JSON. */
    r = run(ARGV(bin_train, "train", "--data", good, "--net", hugemodel, "--epochs", "1", "--batch",
                 "8", "--json", "--log", log),
            300);
    CHECK_EQ(r.status, 1);
    CHECK_GE(json_lines(r.out, "train --json (overflowing weights)"), 2);
    CHECK_CONTAINS(r.out, "the loss is not finite");
    result_free(&r);

    r = run(ARGV(bin_train, "eval", "--model", m, "--data", dir, "--json"), 120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "eval --json"), 1);
    CHECK_CONTAINS(r.out, "q\\\"uote");
    CHECK_CONTAINS(r.out, "ctl\\u0001x");
    result_free(&r);

    r = run(ARGV(bin_train, "classify", "--model", m, "--json", dir), 120);
    CHECK_EQ(r.status, 1); /* the empty file */
    CHECK_EQ(json_lines(r.out, "classify --json"), 30);
    result_free(&r);

    r = run(ARGV(bin_train, "analyze", "--net", m, "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "analyze --json"), 1);
    result_free(&r);

    r = run(ARGV(bin_train, "bench", "--net", "digits", "--batch", "4", "--steps", "2", "--warmup",
                 "1", "--json", "--profile"),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "bench --json --profile"), 1);
    result_free(&r);

    char mo[4300];
    snprintf(mo, sizeof mo, "%s/hostile.onnx", root);
    r = run(ARGV(bin_train, "export", m, "--output", mo), 60);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    char back[4300];
    snprintf(back, sizeof back, "%s/hostile-back.dsrt", root);
    r = run(ARGV(bin_train, "import", mo, "--output", back, "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "import --json"), 1);
    result_free(&r);

    r = run(ARGV(bin_bench, dir, "--index", "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "dsbench --index --json"), 1);
    result_free(&r);
    r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "2", "--json", "--bad-list", bad),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "dsbench --json"), 3);
    CHECK_GE(json_file(bad), 1);
    result_free(&r);
    r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "1", "--json", "--sweep",
                 "--threads", "1,2"),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_GE(json_lines(r.out, "dsbench --json --sweep"), 1);
    result_free(&r);
}

/* classify and eval of a model whose scores overflow: they cannot name a
 * class; each tool says so and fails, with valid JSON. A model file of NaN
 * weights is refused when loaded, naming it. */
static void test_non_finite_model(void) {
    result n = run(ARGV(bin_train, "classify", "--model", nanfile, good), 120);
    CHECK_NE(n.status, 0);
    CHECK_CONTAINS(n.err, "nan.dsrt");
    CHECK_CONTAINS(n.err, "weights are not finite");
    CHECK_EQ(n.out[0], '\0');
    result_free(&n);
    result r = run(ARGV(bin_train, "classify", "--model", hugemodel, "--json", good), 120);
    CHECK_EQ(r.status, 1);
    CHECK_EQ(json_lines(r.out, "classify --json (overflow)"), 60);
    CHECK_CONTAINS(r.out, "\"score\": null");
    CHECK(!strstr(r.out, "nan"));
    CHECK_CONTAINS(r.err, "scores are not finite");
    result_free(&r);

    r = run(ARGV(bin_train, "classify", "--model", hugemodel, good), 120);
    CHECK_EQ(r.status, 1);
    CHECK_EQ(r.out[0], '\0');
    result_free(&r);

    r = run(ARGV(bin_train, "eval", "--model", hugemodel, "--data", good, "--json"), 120);
    CHECK_EQ(r.status, 1);
    CHECK_EQ(json_lines(r.out, "eval --json (overflow)"), 1);
    CHECK_EQ(json_int(r.out, "not_finite"), 60);
    CHECK_EQ(json_int(r.out, "correct"), 0);
    CHECK_CONTAINS(r.out, "\"loss\": null");
    CHECK_CONTAINS(r.err, "not finite");
    result_free(&r);
}

// ----------------------------------------------------------------------------
// --classes files

static void test_class_name_files(void) {
    static const struct {
        const char *name, *text;
        size_t len;
        const char *says;
    } files[] = {
        {"nul.txt", "alpha\nbe\0ta\ngamma\n", 18, "line 2: a control character (U+0000)"},
        {"latin1.txt", "alpha\ncaf\xe9\ngamma\n", 17, "line 2: not UTF-8 at byte 4"},
        {"ctl.txt", "alpha\nbeta\ngam\x1bma\n", 18, "line 3: a control character (U+001B)"},
        {"c1.txt", "alpha\nbeta\n\xc2\x85gamma\n", 19, "line 3: a control character (U+0085)"},
        {"blank.txt", "alpha\n\ngamma\n", 13, "line 2: an empty name"},
        {"empty.txt", "\n\n", 2, "no names"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[4400], out[4400];
        snprintf(p, sizeof p, "%s/%s", root, files[i].name);
        snprintf(out, sizeof out, "%s/%s.dsrt", root, files[i].name);
        REQUIRE(timg_write_file(p, files[i].text, files[i].len) == 0);
        char *const *cmds[] = {
            ARGV(bin_train, "import", onnx, "--output", out, "--classes", p),
            ARGV(bin_train, "classify", "--model", onnx, "--classes", p, good),
            ARGV(bin_train, "eval", "--model", onnx, "--classes", p, "--data", good),
        };
        for (size_t c = 0; c < 3; c++) {
            result r = run(cmds[c], 60);
            CHECK_EQ(r.status, 2);
            CHECK_CONTAINS(r.err, "--classes ");
            CHECK_CONTAINS(r.err, p);
            CHECK_CONTAINS(r.err, files[i].says);
            result_free(&r);
        }
        CHECK(access(out, F_OK) != 0);
    }
    /* A good one, CRLF line ends and a tab kept. */
    char p[4400], out[4400];
    snprintf(p, sizeof p, "%s/good-names.txt", root);
    snprintf(out, sizeof out, "%s/good-names.dsrt", root);
    static const char names[] = "al\tpha\r\nb\xc3\xa9ta\r\ngamma\r\n\r\n";
    REQUIRE(timg_write_file(p, names, sizeof names - 1) == 0);
    result r = run(ARGV(bin_train, "import", onnx, "--output", out, "--classes", p), 60);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    r = run(ARGV(bin_train, "classify", "--model", out, "--json", "--top", "3", good), 120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_lines(r.out, "classify --json (class names)"), 60);
    CHECK_CONTAINS(r.out, "al\\tpha");
    CHECK_CONTAINS(r.out, "b\xc3\xa9ta");
    result_free(&r);
}

// ----------------------------------------------------------------------------
// Outputs that are inputs

/* The bytes of the file at path, hashed (0 when it cannot be read). */
static uint64_t file_hash(const char *path) {
    char *s = slurp(path);
    uint64_t h = 1469598103934665603ull;
    struct stat st;
    size_t n = stat(path, &st) == 0 ? (size_t)st.st_size : 0;
    for (size_t i = 0; i < n && i < (1u << 20) - 1; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    free(s);
    return h;
}

static void test_output_is_input(void) {
    char m[4300], o[4300], link[4300], ck[4300], jl[4300], wrong[4300];
    snprintf(wrong, sizeof wrong, "%s/model-named-onnx.onnx", root);
    snprintf(jl, sizeof jl, "%s/same.jsonl", root);
    snprintf(m, sizeof m, "%s/same.dsrt", root);
    snprintf(o, sizeof o, "%s/same.onnx", root);
    snprintf(link, sizeof link, "%s/same-link.dsrt", root);
    snprintf(ck, sizeof ck, "%s/same-ck", root);
    result r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "16",
                        "--quiet", "--save", m, "--checkpoint-dir", ck),
                   120);
    REQUIRE(r.status == 0);
    result_free(&r);
    r = run(ARGV(bin_train, "export", m, "--output", o), 60);
    REQUIRE(r.status == 0);
    result_free(&r);
    REQUIRE(symlink(m, link) == 0);
    uint64_t hm = file_hash(m), ho = file_hash(o);

    char *const *cmds[] = {
        ARGV(bin_train, "export", m, "--output", m),
        ARGV(bin_train, "export", link, "--output", m),
        ARGV(bin_train, "import", o, "--output", o),
        ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--net", m, "--save", link),
        ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--log", jl, "--bad-list", jl),
        /* A dsrt model file under a .onnx name would be read back as ONNX. */
        ARGV(bin_train, "import", o, "--output", wrong),
        ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--save", wrong),
    };
    static const char *const says[] = {"is the model read",       "is the model read",
                                       "is the model read",       "is the file --net reads",
                                       "is also --log",           "writes a dsrt model file",
                                       "writes a dsrt model file"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        r = run(cmds[i], 60);
        CHECK_EQ(r.status, 2);
        CHECK_CONTAINS(r.err, says[i]);
        result_free(&r);
    }
    CHECK(file_hash(m) == hm);
    CHECK(file_hash(o) == ho);
    CHECK(access(wrong, F_OK) != 0);

    /* --save onto the checkpoint resumed from would replace it. */
    char latest[4400];
    CHECK_OK(dsrt_checkpoint_latest(ck, latest, sizeof latest));
    uint64_t hc = file_hash(latest);
    r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "2", "--resume", latest, "--save",
                 latest),
            60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "is the file --resume reads");
    CHECK(file_hash(latest) == hc);
    result_free(&r);
}

// ----------------------------------------------------------------------------
// Resuming

static void test_resume(void) {
    char ck[4300], latest[4400], state[4500], empty[4300];
    snprintf(ck, sizeof ck, "%s/resume-ck", root);
    result r =
        run(ARGV(bin_train, "train", "--data", good, "--val", good, "--epochs", "1", "--batch",
                 "16", "--quiet", "--checkpoint-dir", ck, "--checkpoint-unit", "iteration"),
            120);
    REQUIRE(r.status == 0);
    result_free(&r);
    CHECK_OK(dsrt_checkpoint_latest(ck, latest, sizeof latest));

    /* The state file given with --net too: refused before any work. */
    snprintf(state, sizeof state, "%s.state", latest);
    r = run(
        ARGV(bin_train, "train", "--data", "/nonexistent", "--net", "digits", "--resume", state),
        60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "not the checkpoint: give ");
    CHECK_CONTAINS(r.err, latest);
    CHECK(!strstr(r.err, "bad magic"));
    result_free(&r);

    /* One iteration left (60 images, batch 16: 4 a epoch; resumed from the
     * third), no --val: no validation figures and no rate over one step. */
    char third[4400];
    snprintf(third, sizeof third, "%s/dsrt_ckpt_e000_i000000003.dsrt", ck);
    REQUIRE(access(third, R_OK) == 0);
    r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "16", "--resume",
                 third, "--json"),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_GE(json_lines(r.out, "resumed summary"), 3);
    CHECK_CONTAINS(r.out, "\"val_accuracy\": null");
    CHECK_CONTAINS(r.out, "\"val_loss\": null");
    CHECK_CONTAINS(r.out, "\"images_per_s\": null");
    CHECK_CONTAINS(r.out, "\"start_iteration\": 3");
    result_free(&r);
    r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "16", "--resume",
                 third),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.out, "resumed at iteration 3");
    CHECK_CONTAINS(r.out, "too few iterations for a rate");
    CHECK_CONTAINS(r.out, "No validation in this run");
    CHECK(!strstr(r.out, "Validation accuracy"));
    result_free(&r);

    /* Nothing left, with --val: measured now. */
    r = run(ARGV(bin_train, "train", "--data", good, "--val", good, "--epochs", "1", "--batch",
                 "16", "--resume", latest, "--json"),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_GE(json_lines(r.out, "resumed at the end"), 2);
    CHECK_CONTAINS(r.out, "\"event\": \"validation\"");
    CHECK(!strstr(r.out, "\"val_accuracy\": null"));
    result_free(&r);

    /* --resume auto in an empty checkpoint folder: a fresh start. */
    snprintf(empty, sizeof empty, "%s/resume-empty", root);
    REQUIRE(timg_mkdirs(empty) == 0);
    r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "16", "--quiet",
                 "--checkpoint-dir", empty, "--resume", "auto"),
            120);
    CHECK_EQ(r.status, 0);
    result_free(&r);
}

int main(void) {
    int skip = toolrun_init("tools-hostile");
    if (skip) return skip;
    toolrun_good_model(good, sizeof good, model, sizeof model);
    snprintf(onnx, sizeof onnx, "%s/good.onnx", root);
    snprintf(hugemodel, sizeof hugemodel, "%s/huge.dsrt", root);
    snprintf(nanfile, sizeof nanfile, "%s/nan.dsrt", root);
    result r;
    r = run(ARGV(bin_train, "export", model, "--output", onnx), 60);
    REQUIRE(r.status == 0);
    result_free(&r);
    /* The same model with weights of 1e30 (finite): its scores overflow to
     * infinities and NaN. And one with NaN weights, which no tool loads. */
    dsrt_net *net = NULL;
    REQUIRE(dsrt_model_load(&net, model, NULL) == 0);
    size_t n;
    float *w = dsrt_net_params(net, &n);
    for (size_t i = 0; i < n; i++) w[i] = 1e30f;
    dsrt_net_params_changed(net);
    REQUIRE(dsrt_model_save(hugemodel, net) == 0);
    for (size_t i = 0; i < n; i++) w[i] = NAN;
    dsrt_net_params_changed(net);
    REQUIRE(dsrt_model_save(nanfile, net) == 0);
    dsrt_net_destroy(net);

    RUN(test_json_reader);
    RUN(test_non_finite_model);
    RUN(test_class_name_files);
    RUN(test_output_is_input);
    RUN(test_resume);
    RUN(test_json_writers);
    return TEST_RESULT();
}
