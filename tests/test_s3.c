/*
 * Object storage against a real S3-compatible server: moto's S3 on
 * 127.0.0.1 with signatures checked (tests/s3_server.py, from the virtual
 * environment scripts/s3-venv.sh makes), behind a proxy that adds latency
 * and injects throttling, server errors, resets and stalls. The server is
 * started once for the whole program and ended with it.
 *
 * A local folder and its copy in the bucket must give the same index (every
 * label mode, sub-folders or not, extensions, empty class folders, images in
 * the root) and the same batches; manifests of URLs, a manifest at a URL,
 * ranged reads, credentials from the environment, a profile and a session
 * token, anonymous requests, virtual-host addressing, the connection cap,
 * and what happens when things go wrong (wrong keys, a missing object, a
 * non-image object, faults that are retried, a store that keeps failing,
 * the server killed under dstrain). No outcome depends on timing: faults
 * are counted, and waits are for files or processes, with deadlines orders
 * of magnitude above the work.
 *
 * Skips (77) only when the server's packages cannot be installed.
 */
#include <dsrt.h>

#include "datastore/remote.h"
#include "task.h"
#include "testimg.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[PATH_MAX];  /* this program's temporary folder */
static char local[PATH_MAX]; /* the folder uploaded as s3://bkt/data */
static char clean[PATH_MAX]; /* good images only, as s3://bkt/clean */

static struct {
    pid_t pid;
    FILE *in, *out;
    char endpoint[128], proxy[128];
    char key[128], secret[128], session_key[128], session_secret[128], token[2048];
} srv;

// ----------------------------------------------------------------------------
// The server

/* The string value of "name" in the server's JSON line. */
static void json_get(const char *line, const char *name, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", name);
    const char *p = strstr(line, pat);
    out[0] = '\0';
    if (!p) return;
    p += strlen(pat);
    const char *e = strchr(p, '"');
    if (!e) return;
    snprintf(out, cap, "%.*s", (int)(e - p), p);
}

/* Sends one command to the server and returns its answer line. */
static const char *server(const char *fmt, ...) {
    static char reply[512];
    va_list ap;
    va_start(ap, fmt);
    vfprintf(srv.in, fmt, ap);
    va_end(ap);
    fputc('\n', srv.in);
    fflush(srv.in);
    if (!fgets(reply, sizeof reply, srv.out)) snprintf(reply, sizeof reply, "(no answer)");
    reply[strcspn(reply, "\n")] = '\0';
    return reply;
}

static unsigned long long server_count(const char *what) {
    const char *r = server("requests");
    const char *p = strstr(r, what);
    return p ? strtoull(p + strlen(what) + 1, NULL, 10) : 0;
}

/* The python of the server's environment, made if need be; NULL to skip. */
static int find_python(char *py, size_t cap) {
    const char *src = getenv("DSRT_SOURCE_DIR");
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/s3-venv.sh' 2>&1", src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[PATH_MAX] = "";
    py[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '/' && access(line, X_OK) == 0) snprintf(py, cap, "%s", line);
    }
    int st = pclose(p);
    if (st != 0 || !py[0]) {
        fprintf(stderr, "skip: the S3 test server could not be installed: %s\n", line);
        return -1;
    }
    return 0;
}

static int server_start(void) {
    char py[PATH_MAX], script[PATH_MAX], up1[PATH_MAX], up2[PATH_MAX];
    if (find_python(py, sizeof py) != 0) return TEST_SKIP;
    const char *src = getenv("DSRT_SOURCE_DIR");
    snprintf(script, sizeof script, "%s/tests/s3_server.py", src ? src : ".");
    snprintf(up1, sizeof up1, "%s", local);
    snprintf(up2, sizeof up2, "%s", clean);
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return 1;
    srv.pid = fork();
    if (srv.pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl(py, py, script, "--upload", up1, "bkt/data", "--upload", up2, "bkt/clean", "--upload",
              up2, "pub/clean", "--public", "pub", "--fill", "bkt/many", "2500", (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    srv.in = fdopen(to[1], "w");
    srv.out = fdopen(from[0], "r");
    char line[8192];
    if (!fgets(line, sizeof line, srv.out)) {
        fprintf(stderr, "the S3 test server did not start\n");
        return 1;
    }
    json_get(line, "endpoint", srv.endpoint, sizeof srv.endpoint);
    json_get(line, "proxy", srv.proxy, sizeof srv.proxy);
    json_get(line, "key", srv.key, sizeof srv.key);
    json_get(line, "secret", srv.secret, sizeof srv.secret);
    json_get(line, "session_key", srv.session_key, sizeof srv.session_key);
    json_get(line, "session_secret", srv.session_secret, sizeof srv.session_secret);
    json_get(line, "session_token", srv.token, sizeof srv.token);
    return srv.endpoint[0] && srv.key[0] ? 0 : 1;
}

static void server_kill(void) {
    if (srv.pid > 0) {
        kill(srv.pid, SIGKILL);
        waitpid(srv.pid, NULL, 0);
        srv.pid = 0;
    }
}

/* The environment of an ordinary run: the user's keys, moto's endpoint
 * (or the proxy), nothing from files. */
static void env_default(int via_proxy) {
    setenv("AWS_ACCESS_KEY_ID", srv.key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", srv.secret, 1);
    unsetenv("AWS_SESSION_TOKEN");
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("AWS_ENDPOINT_URL", via_proxy ? srv.proxy : srv.endpoint, 1);
    unsetenv("AWS_ENDPOINT_URL_S3");
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_NO_SIGN_REQUEST");
    unsetenv("DSRT_S3_ADDRESSING");
    unsetenv("DSRT_S3_MAX_CONNECTIONS");
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
    setenv("AWS_CONFIG_FILE", "/nonexistent/config", 1);
}

/* No credential of the test may be in a message. */
static void check_no_secret(const char *msg) {
    const char *secrets[] = {srv.secret, srv.session_secret, srv.token, srv.key, srv.session_key};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(secrets); k++)
        if (secrets[k][0] && strstr(msg, secrets[k])) {
            fprintf(stderr, "a credential appears in: %s\n", msg);
            test_failures++;
        }
}

// ----------------------------------------------------------------------------
// The data

static void put(const char *rel, const uint8_t *buf, size_t len) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", local, rel);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = '\0';
    REQUIRE(timg_mkdirs(dir) == 0);
    REQUIRE(timg_write_file(p, buf, len) == 0);
}

static void make_data(void) {
    uint32_t seed = 1;
    static const char *const jpegs[] = {
        "cat/a.jpg",     "cat/b.jpg", "cat/c.jpeg",       "cat/sub/d.jpg",  "cat/sub/deeper/e.jpg",
        "dog/f.jpg",     "dog/g.JPG", "dog/h.jpg",        "dog/pups/i.jpg", "emu/j.jpg",
        "emu/cat/k.jpg", "root.jpg",  "dog/z odd (1).jpg"};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(jpegs); k++) {
        size_t len;
        int w = 40 + (int)(k % 5) * 7, h = 36 + (int)(k % 3) * 5;
        uint8_t *j = timg_make_jpeg(TIMG_JPEG_420, w, h, seed++, &len);
        REQUIRE(j);
        put(jpegs[k], j, len);
        free(j);
    }
    static const char *const pngs[] = {"cat/sub/l.png", "dog/m.png", "emu/n.png"};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(pngs); k++) {
        size_t len;
        uint8_t *png = timg_make_png(5, 33, 29, seed++, &len, NULL);
        REQUIRE(png);
        put(pngs[k], png, len);
        free(png);
    }
    put("dog/bad.jpg", (const uint8_t *)"not an image at all", 19); /* a bad file */
    put("notes/readme.txt", (const uint8_t *)"hello", 5);           /* a class without images */
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/empty", local); /* an empty class folder: a marker in the bucket */
    REQUIRE(timg_mkdirs(p) == 0);

    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 8; i++) {
            size_t len;
            uint8_t *j = timg_make_jpeg(TIMG_JPEG_420, 40, 40, 100 + (uint32_t)(c * 8 + i), &len);
            REQUIRE(j);
            snprintf(p, sizeof p, "%s/c%d", clean, c);
            REQUIRE(timg_mkdirs(p) == 0);
            snprintf(p, sizeof p, "%s/c%d/%d.jpg", clean, c, i);
            REQUIRE(timg_write_file(p, j, len) == 0);
            free(j);
        }
}

// ----------------------------------------------------------------------------
// Comparisons

/* The two datastores index the same relative paths, labels and classes. */
static void check_same_index(const dsrt_datastore *a, const char *aroot, const dsrt_datastore *b,
                             const char *broot, const char *what) {
    CHECK_EQ(dsrt_datastore_count(a), dsrt_datastore_count(b));
    CHECK_EQ(dsrt_datastore_num_classes(a), dsrt_datastore_num_classes(b));
    CHECK_EQ(dsrt_datastore_warning_count(a), dsrt_datastore_warning_count(b));
    if (dsrt_datastore_count(a) != dsrt_datastore_count(b) ||
        dsrt_datastore_num_classes(a) != dsrt_datastore_num_classes(b)) {
        fprintf(stderr, "  (%s)\n", what);
        return;
    }
    for (size_t c = 0; c < dsrt_datastore_num_classes(a); c++)
        CHECK_STR_EQ(dsrt_datastore_class_name(a, c), dsrt_datastore_class_name(b, c));
    for (size_t i = 0; i < dsrt_datastore_count(a); i++) {
        CHECK_EQ(dsrt_datastore_label(a, i), dsrt_datastore_label(b, i));
        CHECK_STR_EQ(dsrt_datastore_path(a, i) + strlen(aroot),
                     dsrt_datastore_path(b, i) + strlen(broot));
    }
}

typedef struct {
    uint64_t hash, batches, bad;
    dsrt_pipeline_statistics st;
    int rc;
    char msg[1024];
    char bad_msgs[DSRT_PIPELINE_BAD_MESSAGES][512]; /* copies: the stats' point into the pipeline */
} run_out;

/* Runs 2 epochs of 32x32 batches of 4 and hashes everything delivered. */
static run_out run(const dsrt_datastore *ds, const dsrt_reader_options *ro, unsigned threads) {
    run_out r = {.hash = 1469598103934665603ULL};
    dsrt_augment_options aug;
    dsrt_augment_preset_32(&aug);
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = 4;
    po.prefetch = 2;
    po.threads = threads;
    po.epochs = 2;
    po.seed = 7;
    po.pin = 0;
    if (ro) po.reader = *ro;
    dsrt_pipeline *p;
    r.rc = dsrt_pipeline_open(&p, ds, &aug, &po);
    if (r.rc != 0) {
        snprintf(r.msg, sizeof r.msg, "%s", dsrt_last_error());
        return r;
    }
    dsrt_batch *b;
    while ((r.rc = dsrt_pipeline_next(p, &b)) == 0) {
        const uint8_t *d = b->data;
        for (size_t i = 0; i < b->count * b->sample_stride; i++)
            r.hash = (r.hash ^ d[i]) * 1099511628211ULL;
        for (size_t i = 0; i < b->count; i++) r.hash = (r.hash ^ (uint64_t)b->labels[i]) * 31;
        r.batches++;
        dsrt_batch_release(p, b);
    }
    snprintf(r.msg, sizeof r.msg, "%s", dsrt_last_error());
    if (r.rc == DSRT_EEOF) r.rc = 0;
    dsrt_pipeline_stats(p, &r.st);
    r.bad = r.st.bad_samples;
    for (unsigned i = 0; i < r.st.bad_message_count; i++) {
        check_no_secret(r.st.bad_messages[i]);
        snprintf(r.bad_msgs[i], sizeof r.bad_msgs[i], "%s", r.st.bad_messages[i]);
    }
    r.st.cpus = r.st.io_fallback = NULL;
    dsrt_pipeline_close(p);
    check_no_secret(r.msg);
    return r;
}

static dsrt_datastore *open_ok(const char *path, const dsrt_datastore_options *o) {
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, path, o);
    if (rc != 0) {
        fprintf(stderr, "open %s: %s\n", path, dsrt_last_error());
        test_failures++;
    }
    return ds;
}

// ----------------------------------------------------------------------------
// Cases

static void test_signature_vector(void) {
    /* AWS's documented example: GET /test.txt, Range bytes=0-9, 2013-05-24. */
    const char *canonical =
        "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
        "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
        "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    char sig[65];
    CHECK_OK(dsrt__s3_sign("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", "20130524",
                           "20130524T000000Z", canonical, sig));
    CHECK_STR_EQ(sig, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");

    char d[256];
    dsrt__url_display("https://user:pw@host/a/b.jpg?X-Amz-Signature=abc", d, sizeof d);
    CHECK_STR_EQ(d, "https://host/a/b.jpg?...");
}

static void test_same_index(void) {
    env_default(0);
    static const dsrt_label_source modes[] = {DSRT_LABEL_FOLDER_NAMES, DSRT_LABEL_PARENT_FOLDER,
                                              DSRT_LABEL_NONE};
    static const char *const exts[] = {NULL, "jpg", "png,jpeg"};
    for (size_t m = 0; m < 3; m++)
        for (int sub = 0; sub < 2; sub++)
            for (size_t e = 0; e < 3; e++)
                for (int drop = 0; drop < 2; drop++) {
                    dsrt_datastore_options o = dsrt_datastore_defaults();
                    o.label_source = modes[m];
                    o.include_subfolders = sub;
                    o.extensions = exts[e];
                    o.drop_empty_classes = drop;
                    char what[128];
                    snprintf(what, sizeof what, "labels %d, subfolders %d, extensions %s, drop %d",
                             (int)modes[m], sub, exts[e] ? exts[e] : "default", drop);
                    dsrt_datastore *a = NULL, *b = NULL;
                    int ra = dsrt_datastore_open(&a, local, &o);
                    int rb = dsrt_datastore_open(&b, "s3://bkt/data/", &o);
                    /* No image at all with some choices: both refuse. */
                    CHECK_EQ(ra, rb);
                    if (ra != rb) fprintf(stderr, "  (%s: %s)\n", what, dsrt_last_error());
                    if (a && b) {
                        check_same_index(a, local, b, "s3://bkt/data", what);
                        CHECK(dsrt_datastore_remote(b));
                        CHECK(!dsrt_datastore_remote(a));
                    }
                    dsrt_datastore_close(a);
                    dsrt_datastore_close(b);
                }
    /* A prefix that is the whole bucket's "data" folder without the slash,
     * and the listing of 2500 keys over three pages. */
    dsrt_datastore *many = open_ok("s3://bkt/many", NULL);
    if (many) {
        CHECK_EQ(dsrt_datastore_count(many), 2500);
        CHECK_EQ(dsrt_datastore_num_classes(many), 100);
        CHECK_STR_EQ(dsrt_datastore_class_name(many, 99), "c099");
        CHECK_STR_EQ(dsrt_datastore_path(many, 0), "s3://bkt/many/c000/00000000.jpg");
        CHECK_STR_EQ(dsrt_datastore_path(many, 2499), "s3://bkt/many/c099/00002499.jpg");
    }
    dsrt_datastore_close(many);
}

static void test_same_batches(void) {
    env_default(0);
    dsrt_datastore *a = open_ok(local, NULL), *b = open_ok("s3://bkt/data", NULL);
    if (!a || !b) goto out;
    run_out ra = run(a, NULL, 2), rb = run(b, NULL, 2), rb1 = run(b, NULL, 1);
    CHECK_EQ(ra.rc, 0);
    CHECK_EQ(rb.rc, 0);
    CHECK_EQ(ra.hash, rb.hash);
    CHECK_EQ(rb.hash, rb1.hash);
    CHECK_EQ(ra.batches, rb.batches);
    CHECK_EQ(ra.bad, 1); /* dog/bad.jpg, a bad file in both */
    CHECK_EQ(rb.bad, 1);
    CHECK_GT(rb.st.remote_requests, 0);
    CHECK_EQ(rb.st.remote_retries, 0);
    /* The bad object is named like the bad file. */
    CHECK(rb.st.bad_message_count == 1 &&
          strstr(rb.bad_msgs[0], "s3://bkt/data/dog/bad.jpg: decode:") != NULL);
out:
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
}

/* A latency of 40 ms a request: every batch still comes, the same ones. */
static void test_slow_server(void) {
    env_default(1);
    dsrt_datastore *a = open_ok(local, NULL), *b = open_ok("s3://bkt/data", NULL);
    if (!a || !b) goto out;
    CHECK_STR_EQ(server("latency 40"), "ok");
    dsrt_reader_options ro = dsrt_reader_defaults();
    ro.remote.depth = 8;
    run_out ra = run(a, NULL, 2), rb = run(b, &ro, 2);
    CHECK_STR_EQ(server("latency 0"), "ok");
    CHECK_EQ(rb.rc, 0);
    CHECK_EQ(ra.hash, rb.hash);
    CHECK_EQ(ra.batches, rb.batches);
out:
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
}

/* Throttling, server errors, resets and a stall are retried: same batches,
 * no bad sample for them. */
static void test_faults_retried(void) {
    env_default(1);
    dsrt_datastore *a = open_ok(local, NULL), *b = open_ok("s3://bkt/data", NULL);
    if (!a || !b) goto out;
    run_out ra = run(a, NULL, 2);
    server("fail 503 3");
    server("reset 2");
    server("fail 429 2");
    server("fail 500 1");
    server("stall 1");
    dsrt_reader_options ro = dsrt_reader_defaults();
    ro.remote.timeout_s = 1; /* the stalled request is dropped after 1 s */
    run_out rb = run(b, &ro, 2);
    CHECK_EQ(rb.rc, 0);
    CHECK_EQ(ra.hash, rb.hash);
    CHECK_EQ(rb.bad, 1);
    CHECK_GE(rb.st.remote_retries, 9);
    CHECK_STR_EQ(server("clear"), "ok");
out:
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
}

/* A store that keeps failing stops the run with the cause after the
 * deadline, before any batch, and marks nothing bad. */
static void test_deadline(void) {
    env_default(1);
    dsrt_datastore *b = open_ok("s3://bkt/data", NULL);
    if (!b) return;
    server("fail 503 1000000");
    dsrt_reader_options ro = dsrt_reader_defaults();
    ro.remote.retry_deadline_s = 0.5;
    run_out rb = run(b, &ro, 2);
    CHECK_EQ(rb.rc, DSRT_EREMOTE);
    CHECK_EQ(rb.batches, 0);
    CHECK_EQ(rb.bad, 0);
    CHECK_CONTAINS(rb.msg, "HTTP 503 SlowDown");
    CHECK_CONTAINS(rb.msg, "retry deadline");
    CHECK_CONTAINS(rb.msg, "s3://bkt/data/");
    CHECK_STR_EQ(server("clear"), "ok");
    dsrt_datastore_close(b);
}

static void test_wrong_keys(void) {
    env_default(0);
    dsrt_datastore *ds = NULL;
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789", 1);
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://bkt/data", NULL), DSRT_EREMOTE);
    CHECK_CONTAINS(dsrt_last_error(), "SignatureDoesNotMatch");
    CHECK_CONTAINS(dsrt_last_error(), "AWS_SECRET_ACCESS_KEY");
    CHECK(!strstr(dsrt_last_error(), "wrong-secret"));
    check_no_secret(dsrt_last_error());
    setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000", 1);
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://bkt/data", NULL), DSRT_EREMOTE);
    CHECK_CONTAINS(dsrt_last_error(), "InvalidAccessKeyId");
    CHECK_CONTAINS(dsrt_last_error(), "AWS_ACCESS_KEY_ID");
    CHECK(!strstr(dsrt_last_error(), "AKIANOSUCHKEY"));
    unsetenv("AWS_SECRET_ACCESS_KEY");
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://bkt/data", NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "AWS_SECRET_ACCESS_KEY");
    env_default(0);
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://nosuchbucket/x", NULL), DSRT_EREMOTE);
    CHECK_CONTAINS(dsrt_last_error(), "nosuchbucket");
    CHECK_CONTAINS(dsrt_last_error(), "does not exist");

    /* Keys that go bad between the listing and the reads: the run stops at
     * once with the cause, before any batch. */
    ds = open_ok("s3://bkt/data", NULL);
    if (!ds) return;
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789", 1);
    run_out r = run(ds, NULL, 2);
    CHECK_EQ(r.rc, DSRT_EREMOTE);
    CHECK_EQ(r.batches, 0);
    CHECK_EQ(r.bad, 0);
    CHECK_CONTAINS(r.msg, "SignatureDoesNotMatch");
    CHECK(!strstr(r.msg, "wrong-secret"));
    dsrt_datastore_close(ds);
    env_default(0);
}

static void test_manifests(void) {
    env_default(0);
    char lpath[PATH_MAX], upath[PATH_MAX];
    snprintf(lpath, sizeof lpath, "%s/local.csv", root);
    snprintf(upath, sizeof upath, "%s/urls.csv", root);
    static const char *const files[][2] = {{"cat/a.jpg", "cat"},     {"dog/f.jpg", "dog"},
                                           {"emu/n.png", "emu"},     {"dog/bad.jpg", "dog"},
                                           {"cat/sub/l.png", "cat"}, {"dog/missing.jpg", "dog"}};
    FILE *fl = fopen(lpath, "w"), *fu = fopen(upath, "w");
    REQUIRE(fl && fu);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(files); k++) {
        fprintf(fl, "%s/%s,%s\n", local, files[k][0], files[k][1]);
        fprintf(fu, "s3://bkt/data/%s,%s\n", files[k][0], files[k][1]);
    }
    fclose(fl);
    fclose(fu);
    dsrt_datastore *a = open_ok(lpath, NULL), *b = open_ok(upath, NULL);
    if (a && b) {
        CHECK(dsrt_datastore_remote(b));
        run_out ra = run(a, NULL, 2), rb = run(b, NULL, 2);
        CHECK_EQ(ra.rc, 0);
        CHECK_EQ(ra.hash, rb.hash);
        CHECK_EQ(rb.bad, 2); /* not an image, and no such object */
        int named = 0;
        for (unsigned i = 0; i < rb.st.bad_message_count; i++)
            named += strstr(rb.bad_msgs[i], "s3://bkt/data/dog/missing.jpg") &&
                     strstr(rb.bad_msgs[i], "no such object");
        CHECK_EQ(named, 1);
    }
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
}

/* A manifest that is itself an object, with paths relative to it. */
static void test_manifest_at_url(void) {
    env_default(0);
    char lpath[PATH_MAX];
    snprintf(lpath, sizeof lpath, "%s/labels.csv", local);
    dsrt_datastore *a = open_ok(lpath, NULL), *b = open_ok("s3://bkt/data/labels.csv", NULL);
    if (a && b) {
        check_same_index(a, local, b, "s3://bkt/data", "manifest at a URL");
        run_out ra = run(a, NULL, 2), rb = run(b, NULL, 1);
        CHECK_EQ(ra.hash, rb.hash);
    }
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
    dsrt_datastore *ds = NULL;
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://bkt/data/nosuch.csv", NULL), -ENOENT);
    CHECK_CONTAINS(dsrt_last_error(), "s3://bkt/data/nosuch.csv");
    CHECK_EQ(dsrt_datastore_open(&ds, "https://127.0.0.1:1/folder", NULL), DSRT_EFORMAT);
}

static void test_ranges(void) {
    env_default(0);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/cat/a.jpg", local);
    uint8_t *whole;
    size_t n;
    REQUIRE(dsrt__read_whole_file(path, 1 << 20, &whole, &n) == 0);
    dsrt_reader *r;
    REQUIRE(dsrt_reader_create(&r, NULL) == 0);
    uint8_t a[4096], b[4096], c[4096], d[16];
    CHECK_OK(dsrt_reader_submit_range(r, "s3://bkt/data/cat/a.jpg", 10, 100, a, sizeof a, 1));
    CHECK_OK(dsrt_reader_submit_range(r, path, 10, 100, b, sizeof b, 2));
    CHECK_OK(dsrt_reader_submit_range(r, "s3://bkt/data/cat/a.jpg", n - 50, 0, c, sizeof c, 3));
    CHECK_OK(dsrt_reader_submit_range(r, "s3://bkt/data/cat/a.jpg", 0, 0, d, sizeof d, 4));
    CHECK_OK(dsrt_reader_submit_range(r, path, n - 5, 10, c + 2048, 16, 5));
    int seen = 0;
    dsrt_read_result res;
    while (dsrt_reader_collect(r, &res, 1) == 1) {
        seen |= 1 << res.tag;
        switch (res.tag) {
        case 1:
        case 2:
            CHECK_EQ(res.status, 0);
            CHECK_EQ(res.size, 100);
            CHECK(memcmp(res.buf, whole + 10, 100) == 0);
            break;
        case 3:
            CHECK_EQ(res.status, 0);
            CHECK_EQ(res.size, 50);
            CHECK(memcmp(res.buf, whole + n - 50, 50) == 0);
            break;
        case 4: /* larger than its buffer: the size says how large */
            CHECK_EQ(res.status, DSRT_ETOOBIG);
            CHECK_EQ(res.size, n);
            break;
        case 5:
            CHECK_EQ(res.status, DSRT_ETRUNCATED);
            break;
        }
    }
    CHECK_EQ(seen, 0x3e);
    dsrt_reader_destroy(r);
    free(whole);
}

/* Credentials from a profile of the AWS files, and temporary ones with a
 * session token (signed, so moto checks it is the one it issued). */
static void test_credentials(void) {
    char cred[PATH_MAX], conf[PATH_MAX];
    snprintf(cred, sizeof cred, "%s/credentials", root);
    snprintf(conf, sizeof conf, "%s/config", root);
    FILE *f = fopen(cred, "w");
    REQUIRE(f);
    fprintf(f,
            "[default]\naws_access_key_id = AKIAWRONGDEFAULT\naws_secret_access_key = x\n\n"
            "[dsrt]\naws_access_key_id = %s\naws_secret_access_key = %s\n",
            srv.key, srv.secret);
    fclose(f);
    f = fopen(conf, "w");
    REQUIRE(f);
    fprintf(f,
            "[profile dsrt]\nregion = us-east-1\ns3 =\n  endpoint_url = %s\n"
            "  addressing_style = path\n",
            srv.endpoint);
    fclose(f);
    env_default(0);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_ENDPOINT_URL");
    setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
    setenv("AWS_CONFIG_FILE", conf, 1);
    setenv("AWS_PROFILE", "dsrt", 1);
    dsrt_datastore *ds = open_ok("s3://bkt/clean", NULL);
    if (ds) CHECK_EQ(dsrt_datastore_count(ds), 24);
    dsrt_datastore_close(ds);
    setenv("AWS_PROFILE", "nosuchprofile", 1);
    CHECK_EQ(dsrt_datastore_open(&ds, "s3://bkt/clean", NULL), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "nosuchprofile");

    env_default(0);
    setenv("AWS_ACCESS_KEY_ID", srv.session_key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", srv.session_secret, 1);
    setenv("AWS_SESSION_TOKEN", srv.token, 1);
    ds = open_ok("s3://bkt/clean", NULL);
    if (ds) {
        run_out r = run(ds, NULL, 1);
        CHECK_EQ(r.rc, 0);
        CHECK_EQ(r.batches, 12);
    }
    dsrt_datastore_close(ds);
    env_default(0);
}

/* Virtual-host addressing (bkt.localhost), and anonymous requests. */
static void test_addressing_and_anonymous(void) {
    env_default(0);
    char ep[160];
    snprintf(ep, sizeof ep, "http://localhost:%s", strrchr(srv.endpoint, ':') + 1);
    setenv("AWS_ENDPOINT_URL", ep, 1);
    setenv("DSRT_S3_ADDRESSING", "virtual", 1);
    dsrt_datastore *a = open_ok("s3://bkt/clean", NULL), *b = NULL;
    if (a) CHECK_EQ(dsrt_datastore_count(a), 24);
    unsetenv("DSRT_S3_ADDRESSING");
    b = open_ok("s3://bkt/clean", NULL);
    if (a && b) {
        run_out ra = run(a, NULL, 1), rb = run(b, NULL, 1);
        CHECK_EQ(ra.rc, 0);
        CHECK_EQ(ra.hash, rb.hash);
    }
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);

    /* Anonymous: no credentials anywhere, a public bucket. moto answers
     * unsigned requests only while it does not check signatures. */
    CHECK_STR_EQ(server("auth off"), "ok");
    env_default(1);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsigned long long signed0 = server_count("signed"), req0 = server_count("requests");
    a = open_ok("s3://pub/clean", NULL);
    if (a) {
        run_out r = run(a, NULL, 2);
        CHECK_EQ(r.rc, 0);
        CHECK_EQ(r.batches, 12);
    }
    dsrt_datastore_close(a);
    CHECK_EQ(server_count("signed"), signed0);
    CHECK_GT(server_count("requests"), req0 + 24);
    /* Plain https/http URLs in a manifest are fetched as they are. */
    char m[PATH_MAX];
    snprintf(m, sizeof m, "%s/http.csv", root);
    FILE *f = fopen(m, "w");
    REQUIRE(f);
    for (int i = 0; i < 8; i++) fprintf(f, "%s/pub/clean/c1/%d.jpg,c1\n", srv.proxy, i);
    fclose(f);
    a = open_ok(m, NULL);
    if (a) {
        run_out r = run(a, NULL, 1);
        CHECK_EQ(r.rc, 0);
        CHECK_EQ(r.batches, 4);
        CHECK_EQ(r.bad, 0);
    }
    dsrt_datastore_close(a);
    CHECK_STR_EQ(server("auth on"), "ok");
    env_default(0);
}

/* Connections are kept alive and capped per host. */
static void test_connections(void) {
    env_default(1);
    dsrt_datastore *ds = open_ok("s3://bkt/clean", NULL);
    if (!ds) return;
    server("clear");
    unsigned long long c0 = server_count("connections");
    dsrt_reader_options ro = dsrt_reader_defaults();
    ro.remote.depth = 16;
    ro.remote.max_connections = 2;
    CHECK_STR_EQ(server("latency 5"), "ok");
    run_out r = run(ds, &ro, 1);
    CHECK_STR_EQ(server("latency 0"), "ok");
    CHECK_EQ(r.rc, 0);
    CHECK_LE(server_count("most_open"), 2);
    CHECK_LE(server_count("connections") - c0, 2);
    CHECK_LE(r.st.remote_connections, 2);
    CHECK_EQ(r.st.remote_requests, 48);
    dsrt_datastore_close(ds);
}

// ----------------------------------------------------------------------------
// The tools

static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *path) {
    uint8_t *d;
    size_t n;
    return dsrt__read_whole_file(path, 1 << 24, &d, &n) == 0 ? (char *)d : NULL;
}

static void test_dsbench(void) {
    const char *bin = getenv("DSRT_BIN_DIR");
    if (!bin) return;
    env_default(0);
    char out[PATH_MAX], out2[PATH_MAX];
    snprintf(out, sizeof out, "%s/dsbench.json", root);
    snprintf(out2, sizeof out2, "%s/dsbench-local.json", root);
    CHECK_EQ(sh("'%s/tools/dsbench' s3://bkt/data --pipeline 32 --epochs 2 --batch 4 --checksum "
                "--json > '%s' 2>&1",
                bin, out),
             0);
    CHECK_EQ(sh("'%s/tools/dsbench' '%s' --pipeline 32 --epochs 2 --batch 4 --checksum --json "
                "> '%s' 2>&1",
                bin, local, out2),
             0);
    char *a = slurp(out), *b = slurp(out2);
    if (a && b) {
        const char *ca = strstr(a, "\"checksum\":"), *cb = strstr(b, "\"checksum\":");
        CHECK(ca && cb && strncmp(ca, cb, 30) == 0);
        CHECK_CONTAINS(a, "\"remote\":{\"requests\":");
        check_no_secret(a);
    }
    free(a);
    free(b);
    /* Wrong keys: a clear error before any batch, no key in it. */
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789", 1);
    CHECK_EQ(sh("'%s/tools/dsbench' s3://bkt/data --pipeline 32 --json > '%s' 2>&1", bin, out), 1);
    a = slurp(out);
    if (a) {
        CHECK_CONTAINS(a, "SignatureDoesNotMatch");
        CHECK(!strstr(a, "\"epoch\""));
        CHECK(!strstr(a, "wrong-secret"));
        check_no_secret(a);
    }
    free(a);
    env_default(0);
}

/* Two ranks under mpirun read disjoint shares: the store serves each image
 * of the epoch once (and each rank's listing). */
static void test_mpirun(void) {
    const char *bin = getenv("DSRT_BIN_DIR"), *mpi = getenv("DSRT_MPIEXEC");
    if (!bin || !mpi || !*mpi || access(mpi, X_OK) != 0) {
        fprintf(stderr, "  (no mpirun: skipped)\n");
        return;
    }
    env_default(1);
    server("clear");
    unsigned long long r0 = server_count("requests");
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/mpi.out", root);
    int rc = sh("'%s' --allow-run-as-root --oversubscribe -np 2 -x AWS_ACCESS_KEY_ID -x "
                "AWS_SECRET_ACCESS_KEY -x AWS_ENDPOINT_URL -x AWS_REGION '%s/tools/dstrain' train "
                "--data s3://bkt/clean --net cifar --epochs 1 --batch 8 --threads 1 --workers 1 "
                "--execution-environment parallel --json > '%s' 2>&1",
                mpi, bin, out);
    CHECK_EQ(rc, 0);
    unsigned long long got = server_count("requests") - r0;
    CHECK_EQ(got, 24 + 2);
    char *o = slurp(out);
    if (rc != 0 && o) fprintf(stderr, "%s\n", o);
    if (o) CHECK_CONTAINS(o, "\"images\": 24");
    free(o);
    env_default(0);
}

/* The server dies mid-epoch under dstrain: the requests are retried, the
 * run fails with the cause, the last checkpoint stays whole. The second
 * epoch's requests are held unanswered until the first epoch's checkpoint
 * is on disk; then the server is killed. */
static void test_dstrain_server_killed(void) {
    const char *bin = getenv("DSRT_BIN_DIR");
    if (!bin) return;
    env_default(1);
    server("clear");
    server("hold-after 25"); /* the listing, then the 24 images of epoch 1 */
    char ck[PATH_MAX], out[PATH_MAX], ckfile[PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck", root);
    snprintf(out, sizeof out, "%s/dstrain.out", root);
    mkdir(ck, 0755);
    pid_t pid = fork();
    if (pid == 0) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "exec '%s/tools/dstrain' train --data s3://bkt/clean --net cifar --epochs 3 "
                 "--batch 8 --threads 1 --workers 1 --checkpoint-dir '%s' --retry-deadline 1 "
                 "--json > '%s' 2>&1",
                 bin, ck, out);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* Wait for the first epoch's checkpoint (minutes of slack). */
    ckfile[0] = '\0';
    for (int i = 0; i < 6000 && !ckfile[0]; i++) {
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "ls '%s' 2>/dev/null | grep '\\.dsrt$' | head -1", ck);
        FILE *p = popen(cmd, "r");
        char name[512] = "";
        if (p && fgets(name, sizeof name, p)) {
            name[strcspn(name, "\n")] = '\0';
            if (name[0]) snprintf(ckfile, sizeof ckfile, "%s/%s", ck, name);
        }
        if (p) pclose(p);
        if (!ckfile[0]) usleep(20000);
    }
    CHECK(ckfile[0]);
    struct stat before;
    int have = ckfile[0] && stat(ckfile, &before) == 0;
    server_kill();
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    char *o = slurp(out);
    if (!o || !strstr(o, "did not answer after")) {
        fprintf(stderr, "dstrain's output (status %d):\n%s\n", st, o ? o : "(none)");
        sh("ls -la '%s' >&2", ck);
    }
    if (o) {
        CHECK_CONTAINS(o, "did not answer after");
        CHECK_CONTAINS(o, "s3://bkt/clean/");
        check_no_secret(o);
    }
    free(o);
    struct stat after;
    if (have && stat(ckfile, &after) == 0) {
        CHECK_EQ(after.st_size, before.st_size);
        CHECK_EQ(after.st_mtime, before.st_mtime);
        /* ... and it resumes on the local copy of the data. */
        CHECK_EQ(sh("'%s/tools/dstrain' train --data '%s' --net cifar --epochs 3 --batch 8 "
                    "--threads 1 --workers 1 --resume '%s' > '%s.resume' 2>&1",
                    bin, clean, ckfile, out),
                 0);
    } else {
        CHECK(0 && "the checkpoint is gone");
    }
}

// ----------------------------------------------------------------------------

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(timg_tmpdir("s3", root, sizeof root) == 0);
    snprintf(local, sizeof local, "%s/data", root);
    snprintf(clean, sizeof clean, "%s/clean", root);
    REQUIRE(timg_mkdirs(local) == 0 && timg_mkdirs(clean) == 0);
    make_data();
    /* A manifest with paths relative to itself, uploaded with the folder. */
    char mpath[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/labels.csv", local);
    FILE *f = fopen(mpath, "w");
    REQUIRE(f);
    fprintf(f, "path,label\ncat/a.jpg,cat\ndog/f.jpg,dog\nemu/n.png,emu\ncat/sub/l.png,cat\n");
    fclose(f);

    RUN(test_signature_vector);
    int rc = server_start();
    if (rc != 0) {
        server_kill();
        return rc == TEST_SKIP && test_failures == 0 ? TEST_SKIP : 1;
    }
    RUN(test_same_index);
    RUN(test_same_batches);
    RUN(test_manifests);
    RUN(test_manifest_at_url);
    RUN(test_ranges);
    RUN(test_credentials);
    RUN(test_addressing_and_anonymous);
    RUN(test_connections);
    RUN(test_slow_server);
    RUN(test_faults_retried);
    RUN(test_deadline);
    RUN(test_wrong_keys);
    RUN(test_dsbench);
    RUN(test_mpirun);
    RUN(test_dstrain_server_killed); /* last: it kills the server */
    server_kill();
    return test_failures ? 1 : 0;
}
