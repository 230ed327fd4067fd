/*
 * Tests of the command-line tools, run as a user runs them: dstrain and
 * dsbench are started as child processes (from $DSRT_BIN_DIR/tools) on small
 * folders made here, and their exit status, stdout and stderr are checked.
 * Each case is a way a careless or hostile user can hurt a run: files that
 * are FIFOs or devices, unreadable images, output paths that cannot be
 * written, Ctrl-C, limits on open files and address space, odd folders, and
 * names that would break JSON or columns. A child that hangs is killed after
 * a deadline and counts as a failure.
 */
#include <dsrt.h>
#include <dirent.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"
#include "testimg.h"
#include "toolrun.h"

static char good[4200], model[4200];

// ----------------------------------------------------------------------------
// Data

/* The folder dir with every other image of each class emptied; returns how many. */
static int half_bad(const char *dir, int per) {
    make_images(dir, ABC, 3, per);
    int n = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < per; i += 2) {
            char p[4600];
            snprintf(p, sizeof p, "%s/%s/%03d.png", dir, ABC[k], i);
            REQUIRE(timg_write_file(p, "", 0) == 0);
            n++;
        }
    return n;
}

// ----------------------------------------------------------------------------
// Cases

/* FIFOs and devices are refused at once, wherever a file is read. */
static void test_non_regular(void) {
    char fifo[4300], csv[4300];
    snprintf(fifo, sizeof fifo, "%s/fifo", root);
    snprintf(csv, sizeof csv, "%s/x.csv", root);
    REQUIRE(mkfifo(fifo, 0644) == 0 && mkfifo(csv, 0644) == 0);
    struct {
        char *const *argv;
        const char *says;
    } cases[] = {
        {ARGV(bin_train, "classify", "--model", fifo, good), "FIFO"},
        {ARGV(bin_train, "classify", "--model", model, fifo), "FIFO"},
        {ARGV(bin_train, "classify", "--model", model, "/dev/zero"), "character device"},
        {ARGV(bin_train, "train", "--data", good, "--net", fifo), "FIFO"},
        {ARGV(bin_train, "train", "--data", good, "--net", "/dev/zero"), "character device"},
        {ARGV(bin_train, "eval", "--model", fifo, "--data", good), "FIFO"},
        {ARGV(bin_train, "train", "--data", good, "--resume", fifo), "FIFO"},
        {ARGV(bin_train, "bench", "--net", fifo), "FIFO"},
        {ARGV(bin_bench, csv, "--source", "manifest", "--index"), "FIFO"},
        {ARGV(bin_bench, "/dev/zero", "--source", "idx", "--index"), "character device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = run(cases[i].argv, 60);
        CHECK(!r.timeout);
        CHECK_NE(r.status, 0);
        CHECK_LT(r.status, 128);
        CHECK_CONTAINS(r.err, cases[i].says);
        result_free(&r);
    }
}

/* Evaluation counts each readable image once and names the others. */
static void test_eval_counts(void) {
    char half[4300], list[4300];
    snprintf(half, sizeof half, "%s/half", root);
    snprintf(list, sizeof list, "%s/eval-bad.jsonl", root);
    int nbad = half_bad(half, 20);
    result r =
        run(ARGV(bin_train, "eval", "--model", model, "--data", half, "--json", "--bad-list", list),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "images"), 60 - nbad);
    CHECK_EQ(json_int(r.out, "bad_files_total"), nbad);
    CHECK_EQ(json_int(r.out, "skipped"), nbad);
    CHECK_CONTAINS(r.out, "\"error\": \"read: empty file\"");
    CHECK_EQ(count_lines(list), nbad);
    result_free(&r);
    r = run(ARGV(bin_train, "eval", "--model", model, "--data", half), 120);
    CHECK_EQ(r.status, 0);
    char want[64];
    snprintf(want, sizeof want, " of %d)", 60 - nbad);
    CHECK_CONTAINS(r.out, want);
    snprintf(want, sizeof want, "%d bad files left out:", nbad);
    CHECK_CONTAINS(r.err, want);
    CHECK_CONTAINS(r.err, "--bad-list FILE writes them all");
    result_free(&r);
}

/* Output paths are checked before any work; a --save or --plot that fails
 * at the end keeps the weights elsewhere and exits non-zero. */
static void test_output_paths(void) {
    /* (Never a device such as /dev/null here: a tool that failed this test
     * would rename its model over it.) */
    char fifo[4300], fifo_save[4300];
    snprintf(fifo, sizeof fifo, "%s/log.csv", root);
    snprintf(fifo_save, sizeof fifo_save, "%s/save.dsrt", root);
    REQUIRE(mkfifo(fifo, 0644) == 0 && mkfifo(fifo_save, 0644) == 0);
    const char *opts[][2] = {
        {"--save", "/nonexistent/m.dsrt"},      {"--plot", "/nonexistent/p.svg"},
        {"--log", "/nonexistent/l.csv"},        {"--log", fifo},
        {"--bad-list", "/nonexistent/b.jsonl"}, {"--save", fifo_save}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        result r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", (char *)opts[i][0],
                            (char *)opts[i][1]),
                       60);
        CHECK_EQ(r.status, 2);
        CHECK_CONTAINS(r.err, opts[i][0]);
        CHECK_CONTAINS(r.err, opts[i][1]);
        CHECK(!strstr(r.out, "Training"));
        result_free(&r);
    }

    /* The folders vanish while it trains (90 steps: seconds, where the
     * folders go within milliseconds of the start). */
    char sdir[4300], pdir[4300], save[4400], plot[4400];
    snprintf(sdir, sizeof sdir, "%s/gone-save", root);
    snprintf(pdir, sizeof pdir, "%s/gone-plot", root);
    snprintf(save, sizeof save, "%s/m.dsrt", sdir);
    snprintf(plot, sizeof plot, "%s/p.svg", pdir);
    REQUIRE(mkdir(sdir, 0755) == 0 && mkdir(pdir, 0755) == 0);
    child c = spawn(ARGV(bin_train, "train", "--data", good, "--epochs", "6", "--batch", "4",
                         "--json", "--save", save, "--plot", plot),
                    0, 0);
    CHECK(wait_for(&c, c.out, "\"event\": \"start\"", 120));
    CHECK(rmdir(sdir) == 0);
    CHECK(rmdir(pdir) == 0);
    result r = finish(c, 600); /* a guard against a hang only */
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "--save");
    CHECK_CONTAINS(r.err, "--plot");
    CHECK_CONTAINS(r.err, "written to ./dstrain-weights-");
    const char *at = strstr(r.err, "written to ");
    if (at) {
        char path[4400];
        if (sscanf(at + 11, "%4399s", path) == 1) {
            char full[8900];
            snprintf(full, sizeof full, "%s/%s", root, path);
            dsrt_net *net = NULL;
            CHECK_OK(dsrt_model_load(&net, full, NULL));
            dsrt_net_destroy(net);
        }
    }
    result_free(&r);
}

/* Bad files are named, with their reasons, in text and JSON alike, and a
 * run that gives up on them shows them. */
static void test_bad_files_named(void) {
    char dir[4300], list[4300], all_bad[4300];
    snprintf(dir, sizeof dir, "%s/manybad", root);
    snprintf(list, sizeof list, "%s/bad.jsonl", root);
    snprintf(all_bad, sizeof all_bad, "%s/allbad", root);
    int nbad = half_bad(dir, 16); /* 24 bad: more than are named in full */
    result r = run(ARGV(bin_train, "train", "--data", dir, "--epochs", "2", "--batch", "8",
                        "--quiet", "--bad-list", list),
                   120);
    CHECK_EQ(r.status, 0);
    char want[128];
    snprintf(want, sizeof want, "%d bad training files, skipped", nbad);
    CHECK_CONTAINS(r.err, want);
    CHECK_CONTAINS(r.err, "/000.png: read: empty file");
    snprintf(want, sizeof want, "... and %d more (all of them in %s)", nbad - 20, list);
    CHECK_CONTAINS(r.err, want);
    CHECK_EQ(count_lines(list), nbad);
    result_free(&r);

    r = run(ARGV(bin_train, "train", "--data", dir, "--epochs", "1", "--batch", "8", "--json"),
            120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "bad_files_total"), nbad);
    CHECK_GE(json_int(r.out, "skipped"), nbad);
    CHECK_CONTAINS(r.out, "\"bad_files\": [{\"path\": ");
    result_free(&r);

    r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "1", "--json"), 120);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "bad_files_total"), nbad);
    CHECK_CONTAINS(r.out, "\"error\": \"read: empty file\"");
    result_free(&r);

    /* Nothing readable: the run fails, naming the files. */
    make_images(all_bad, ABC, 3, 2);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 2; i++) {
            char p[4600];
            snprintf(p, sizeof p, "%s/%s/%03d.png", all_bad, ABC[k], i);
            REQUIRE(timg_write_file(p, "not an image", 12) == 0);
        }
    r = run(ARGV(bin_train, "train", "--data", all_bad, "--epochs", "1", "--quiet"), 120);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "in a row failed");
    CHECK_CONTAINS(r.err, "6 bad training files");
    CHECK_CONTAINS(r.err, "alpha/000.png: decode: ");
    result_free(&r);
}

/* The weights_checksum of a dstrain --json summary ("" when none). */
static void summary_checksum(const char *out, char *sum, size_t cap) {
    const char *w = strstr(out ? out : "", "\"weights_checksum\": \"");
    sum[0] = '\0';
    if (w) snprintf(sum, cap, "%.16s", w + strlen("\"weights_checksum\": \""));
}

/* Writes all of p to the socket c, or stops at the first error. */
static void send_all(int c, const void *p, size_t n) {
    const char *b = p;
    while (n > 0) {
        ssize_t k = write(c, b, n);
        if (k <= 0) return;
        b += k;
        n -= (size_t)k;
    }
}

/* A file server for the folder dir on 127.0.0.1 (the port is *port), in a
 * child process: GET, whole or with "Range: bytes=A-B", one request a
 * connection; 404 for a missing file. */
static pid_t serve_folder(const char *dir, int *port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    REQUIRE(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 64) == 0);
    REQUIRE(getsockname(s, (struct sockaddr *)&a, &alen) == 0);
    *port = ntohs(a.sin_port);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid > 0) {
        close(s);
        return pid;
    }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        char req[8192], name[1024], path[6000], head[512];
        size_t got = 0;
        while (got + 1 < sizeof req) {
            ssize_t k = read(c, req + got, sizeof req - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n")) break;
        }
        req[got] = '\0';
        int fd = -1;
        struct stat st;
        if (sscanf(req, "GET /%1023s ", name) == 1) {
            snprintf(path, sizeof path, "%s/%s", dir, name);
            fd = open(path, O_RDONLY);
        }
        if (fd < 0 || fstat(fd, &st) != 0) {
            const char *nf =
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            send_all(c, nf, strlen(nf));
        } else {
            long long from = 0, to = (long long)st.st_size - 1;
            const char *r = strcasestr(req, "\r\nRange: bytes=");
            int ranged = r && sscanf(r, "\r\nRange: bytes=%lld-%lld", &from, &to) >= 1;
            if (to >= (long long)st.st_size) to = (long long)st.st_size - 1;
            int n = ranged ? snprintf(head, sizeof head,
                                      "HTTP/1.1 206 Partial Content\r\nContent-Length: %lld\r\n"
                                      "Content-Range: bytes %lld-%lld/%lld\r\n"
                                      "Connection: close\r\n\r\n",
                                      to - from + 1, from, to, (long long)st.st_size)
                           : snprintf(head, sizeof head,
                                      "HTTP/1.1 200 OK\r\nContent-Length: %lld\r\n"
                                      "Connection: close\r\n\r\n",
                                      (long long)st.st_size);
            send_all(c, head, (size_t)n);
            char buf[65536];
            for (long long at = from; at <= to;) {
                long long want = to - at + 1 < (long long)sizeof buf ? to - at + 1 : sizeof buf;
                ssize_t k = pread(fd, buf, (size_t)want, at);
                if (k <= 0) break;
                send_all(c, buf, (size_t)k);
                at += k;
            }
        }
        if (fd >= 0) close(fd);
        close(c);
    }
}

/* Tar shards through the tools: dsbench convert --shards writes them, dsbench
 * reads them (the exact order with the folder's checksum), --cold says how
 * it dropped the cache, and dstrain trains on them in the shard order, resumes
 * mid-epoch to the uninterrupted run's weights and refuses a resume in
 * another order. */
static void test_shards_cli(void) {
    char dir[4300], out[4300], again[4300], ck[4300], ckpt[4400];
    snprintf(dir, sizeof dir, "%s/shardsrc", root);
    snprintf(out, sizeof out, "%s/shards", root);
    snprintf(again, sizeof again, "%s/shards2", root);
    snprintf(ck, sizeof ck, "%s/shardck", root);
    make_images(dir, ABC, 3, 24);
    result r = run(ARGV(bin_bench, "convert", dir, out, "--shards", "16K"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "wrote 72 images in 3 classes");
    result_free(&r);
    r = run(ARGV(bin_bench, out, "--index", "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.out, "\"source\":\"shards\",\"classes\":[\"alpha\",\"beta\",\"gamma\"]");
    long long nshards = json_int(r.out, "shards");
    CHECK_GE(nshards, 3);
    result_free(&r);
    /* Converted from a web server: a URL is no local path to look at first,
     * with a brace list or without. */
    int port;
    pid_t server = serve_folder(out, &port);
    char url[256], web[4400];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/shard-{000000..%06lld}.tar", port, nshards - 1);
    snprintf(web, sizeof web, "%s/fromweb", root);
    r = run(ARGV(bin_bench, "convert", url, web, "--shards", "1M"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "wrote 72 images in 3 classes");
    result_free(&r);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/shard-000000.tar", port);
    snprintf(web, sizeof web, "%s/fromweb1", root);
    r = run(ARGV(bin_bench, "convert", url, web, "--shards", "1M"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "in 3 classes to");
    CHECK_CONTAINS(r.err, "as 1 shard in");
    result_free(&r);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    /* The exact order: the folder's batches. */
    r = run(ARGV(bin_bench, dir, "--pipeline", "32", "--epochs", "2", "--checksum", "--json"), 60);
    result s = run(ARGV(bin_bench, out, "--order", "exact", "--pipeline", "32", "--epochs", "2",
                        "--checksum", "--json", "--cold", "--cold-method", "fadvise"),
                   60);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(s.status, 0);
    const char *a = strstr(r.out, "\"checksum\""), *b = strstr(s.out, "\"checksum\"");
    CHECK(a && b && strncmp(a, b, 29) == 0); /* "checksum":"<16 hex digits>" */
    CHECK_CONTAINS(s.out, "\"cold\":\"fadvise\"");
    CHECK_CONTAINS(s.out, "\"order\":\"exact\"");
    result_free(&r);
    result_free(&s);
    r = run(ARGV(bin_bench, out, "--order", "shard", "--pipeline", "32", "--epochs", "1", "--cold",
                 "--cold-method", "fadvise"),
            60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.out, "shard order (shuffle buffer 1000");
    CHECK_CONTAINS(r.out, "posix_fadvise DONTNEED on each file");
    result_free(&r);
    /* Shards of shards. */
    r = run(ARGV(bin_bench, "convert", out, again, "--shards", "1M", "--shard-samples", "30"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "as 3 shards");
    result_free(&r);
    /* Never over its own source: refused, naming both, and the set stays. */
    r = run(ARGV(bin_bench, "convert", out, out, "--shards", "16K"), 60);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "is the source's folder");
    CHECK_CONTAINS(r.err, out);
    result_free(&r);
    r = run(ARGV(bin_bench, out, "--index", "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.out, "\"images\":72");
    result_free(&r);
    /* Only what dsrt wrote is replaced: a classes.json of the user's in a
     * new folder is refused, and kept. */
    char mine[4400], user[4500];
    snprintf(mine, sizeof mine, "%s/mine", root);
    snprintf(user, sizeof user, "%s/classes.json", mine);
    REQUIRE(mkdir(mine, 0755) == 0);
    REQUIRE(timg_write_file(user, "[\"x\"]", 5) == 0);
    r = run(ARGV(bin_bench, "convert", dir, mine, "--shards", "16K"), 60);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "holds 'classes.json', which dsrt did not write there");
    result_free(&r);
    struct stat sb;
    CHECK(stat(user, &sb) == 0 && sb.st_size == 5);

    /* dstrain in the shard order: a resume mid-epoch ends as the uninterrupted
     * run; a resume in the other order is refused. */
    char full[32], resumed[32];
    r = run(ARGV(bin_train, "train", "--data", out, "--order", "shard", "--shuffle-buffer", "20",
                 "--epochs", "2", "--batch", "8", "--json", "--quiet", "--checkpoint-dir", ck,
                 "--checkpoint-unit", "iteration", "--checkpoint-frequency", "4"),
            120);
    CHECK_EQ(r.status, 0);
    summary_checksum(r.out, full, sizeof full);
    CHECK(full[0]);
    result_free(&r);
    snprintf(ckpt, sizeof ckpt, "%s/dsrt_ckpt_e000_i000000004.dsrt", ck);
    r = run(ARGV(bin_train, "train", "--data", out, "--order", "shard", "--shuffle-buffer", "20",
                 "--epochs", "2", "--batch", "8", "--json", "--quiet", "--resume", ckpt),
            120);
    CHECK_EQ(r.status, 0);
    summary_checksum(r.out, resumed, sizeof resumed);
    CHECK_STR_EQ(resumed, full);
    result_free(&r);
    r = run(ARGV(bin_train, "train", "--data", out, "--order", "exact", "--epochs", "2", "--batch",
                 "8", "--quiet", "--resume", ckpt),
            120);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "made reading the data in the shard order (shuffle buffer 20); the "
                          "options say the exact order");
    result_free(&r);
    /* Another shuffle or a mix drawn in other proportions draws other samples
     * from here on: refused too. */
    r = run(ARGV(bin_train, "train", "--data", out, "--order", "shard", "--shuffle-buffer", "20",
                 "--epochs", "2", "--batch", "8", "--quiet", "--shuffle", "once", "--resume", ckpt),
            120);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "made drawing its samples as every-epoch/");
    CHECK_CONTAINS(r.err, "the options draw them as once/");
    result_free(&r);
    char mixed[4400];
    snprintf(mixed, sizeof mixed, "%s/ck-mix", root);
    r = run(ARGV(bin_train, "train", "--data", dir, "--data", dir, "--mix", "1,3", "--epochs", "1",
                 "--epoch-samples", "40", "--batch", "8", "--quiet", "--checkpoint-dir", mixed,
                 "--checkpoint-unit", "iteration", "--checkpoint-frequency", "2"),
            120);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    snprintf(ckpt, sizeof ckpt, "%s/dsrt_ckpt_e000_i000000002.dsrt", mixed);
    r = run(ARGV(bin_train, "train", "--data", dir, "--data", dir, "--mix", "1,3", "--epochs", "1",
                 "--epoch-samples", "40", "--batch", "8", "--quiet", "--resume", ckpt),
            120);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    r = run(ARGV(bin_train, "train", "--data", dir, "--data", dir, "--mix", "3,1", "--epochs", "1",
                 "--epoch-samples", "40", "--batch", "8", "--quiet", "--resume", ckpt),
            120);
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "the options draw them as");
    result_free(&r);
    r = run(ARGV(bin_train, "train", "--data", out, "--order", "random", "--epochs", "1"), 60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "--order: 'random' is not auto, exact or shard");
    result_free(&r);
}

/* Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop after the step, keep
 * what can be kept, leave no temporary file and exit 130, 143 and 129; a
 * second Ctrl-C exits at once. */
static void test_signals(void) {
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    static const char *const said[] = {"interrupted by SIGINT", "interrupted by SIGTERM",
                                       "interrupted by SIGHUP"};
    for (int k = 0; k < 3; k++) {
        char ck[4300], save[4300];
        snprintf(ck, sizeof ck, "%s/sig-ck-%d", root, k);
        snprintf(save, sizeof save, "%s/sig-%d.dsrt", root, k);
        child c = spawn(ARGV(bin_train, "train", "--data", good, "--epochs", "100000", "--batch",
                             "4", "--json", "--checkpoint-dir", ck, "--save", save),
                        0, 0);
        CHECK(wait_for(&c, c.out, "\"event\": \"start\"", 120));
        kill(c.pid, sigs[k]);
        result r = finish(c, 120);
        CHECK_EQ(r.status, 128 + sigs[k]);
        CHECK_CONTAINS(r.out, said[k]);
        CHECK_CONTAINS(r.err, "kept the checkpoint ");
        DIR *d = opendir(ck);
        for (struct dirent *e; d && (e = readdir(d));)
            if (strstr(e->d_name, ".tmp.")) {
                fprintf(stderr, "  left behind: %s/%s\n", ck, e->d_name);
                test_failures++;
            }
        if (d) closedir(d);
        dsrt_net *net = NULL;
        CHECK_OK(dsrt_model_load(&net, save, NULL));
        dsrt_net_destroy(net);
        char latest[4400];
        CHECK_OK(dsrt_checkpoint_latest(ck, latest, sizeof latest));
        result_free(&r);
    }
    /* Twice: out at once, still with Ctrl-C's status. */
    child c = spawn(
        ARGV(bin_train, "train", "--data", good, "--epochs", "100000", "--batch", "4", "--json"), 0,
        0);
    CHECK(wait_for(&c, c.out, "\"event\": \"start\"", 120));
    kill(c.pid, SIGINT);
    CHECK(wait_for(&c, c.err, "stopping after this step", 30));
    kill(c.pid, SIGINT);
    result r = finish(c, 60);
    CHECK_EQ(r.status, 130);
    result_free(&r);
}

/* Too many open files never turns good images bad; with none to be had the
 * run fails with that reason. Little address space is enough for 28 x 28
 * images. */
static void test_process_limits(void) {
    result r = run_limited(ARGV(bin_train, "train", "--data", good, "--epochs", "2", "--batch", "8",
                                "--workers", "2", "--threads", "1", "--json"),
                           120, 37, 0);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(json_int(r.out, "bad_files_total"), 0);
    CHECK_EQ(json_int(r.out, "images"), 2 * 60);
    result_free(&r);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* (Sanitizers need descriptors and address space of their own.) */
    r = run_limited(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--workers", "2",
                         "--threads", "1", "--quiet"),
                    120, 5, 0);
    /* The scan (or, with a few more, the reads) meets the limit: either way
     * the run fails naming it, and no file is blamed. */
    CHECK(r.status == 1 || r.status == 2);
    CHECK_CONTAINS(r.err, "Too many open files");
    CHECK_CONTAINS(r.err, "a limit of the process or the system");
    CHECK(!strstr(r.err, "bad training file"));
    result_free(&r);
    r = run_limited(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--workers", "2",
                         "--io-depth", "4", "--quiet"),
                    120, 0, 600000);
    CHECK_EQ(r.status, 0);
    CHECK(!strstr(r.err, "out of memory"));
    result_free(&r);
#endif
}

/* The scan's warnings are printed, and a class without images is refused
 * (or left out with --drop-empty-classes). */
static void test_scan_warnings(void) {
    char dir[4300], p[4500], q[4500];
    snprintf(dir, sizeof dir, "%s/scan", root);
    make_images(dir, ABC, 2, 4);
    snprintf(p, sizeof p, "%s/%s/broken.png", dir, ABC[0]);
    REQUIRE(symlink("/nonexistent/x.png", p) == 0);
    snprintf(p, sizeof p, "%s/%s/loop", dir, ABC[1]);
    REQUIRE(symlink("..", p) == 0);
    snprintf(q, sizeof q, "%s/empty", dir);
    REQUIRE(mkdir(q, 0755) == 0);
    result r = run(ARGV(bin_train, "train", "--data", dir, "--epochs", "1", "--quiet"), 60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "broken symbolic link");
    CHECK_CONTAINS(r.err, "symbolic link loop");
    CHECK_CONTAINS(r.err, "classes without images: empty");
    CHECK(!strstr(r.out, "Training"));
    result_free(&r);
    r = run(
        ARGV(bin_train, "train", "--data", dir, "--epochs", "1", "--quiet", "--drop-empty-classes"),
        120);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "broken symbolic link");
    CHECK_CONTAINS(r.err, "empty: class folder holds no image file: not a class");
    result_free(&r);
}

/* An unknown option is refused before any work, naming the option a slip
 * away from it where there is one, and only then. */
static void test_option_suggestions(void) {
    static const struct {
        const char *given, *says;
    } cases[] = {{"--epoch", "did you mean --epochs?"},
                 {"--epcohs", "did you mean --epochs?"},
                 {"--nett", "did you mean --net?"},
                 {"--bogus", NULL}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char arg[32];
        snprintf(arg, sizeof arg, "%s", cases[k].given);
        result r = run(ARGV(bin_train, "train", "--data", good, arg, "1"), 60);
        CHECK_EQ(r.status, 2);
        CHECK_CONTAINS(r.err, cases[k].given);
        if (cases[k].says)
            CHECK_CONTAINS(r.err, cases[k].says);
        else
            CHECK(!strstr(r.err, "did you mean"));
        result_free(&r);
    }
}

/* classify reads the next batch while the net computes this one: the same
 * lines in the same order whatever the batch (one image a batch, batches
 * that end inside a folder, one batch for all), over files, a missing
 * path, a folder with emptied images and a file again; each bad image named
 * on stderr, the run's status 1. */
static void test_classify_streams(void) {
    char dir[4300], one[4400], missing[4400];
    snprintf(dir, sizeof dir, "%s/stream", root);
    int bad = half_bad(dir, 7);
    snprintf(one, sizeof one, "%s/beta/001.png", dir);
    snprintf(missing, sizeof missing, "%s/not-there.png", dir);
    char batches[3][4] = {"1", "3", "64"};
    char *first = NULL;
    for (int k = 0; k < 3; k++) {
        result r = run(ARGV(bin_train, "classify", "--model", model, "--batch", batches[k],
                            "--json", one, missing, dir, one),
                       120);
        CHECK_EQ(r.status, 1);
        int lines = 0;
        for (const char *c = r.out; *c; c++) lines += *c == '\n';
        CHECK_EQ(lines, 2 + 3 * 7 - bad);
        CHECK_CONTAINS(r.err, missing);
        CHECK_CONTAINS(r.err, "alpha/000.png");
        CHECK_CONTAINS(r.err, "gamma/006.png");
        /* In the order given: the file, the folder's images, the file. */
        const char *a = strstr(r.out, "beta/001.png"), *g = strstr(r.out, "gamma/005.png");
        CHECK(a && g && a < g && strstr(g, "beta/001.png"));
        /* Paths and classes (the scores of batches of other sizes may
         * differ in the last bits). */
        char *kept = strdup(r.out);
        REQUIRE(kept);
        char *w = kept;
        for (const char *c = r.out; *c;) {
            const char *end = strchr(c, '\n'), *cut = strstr(c, ", \"score\"");
            if (!end) break;
            if (!cut || cut > end) cut = end;
            memcpy(w, c, (size_t)(cut - c));
            w += cut - c;
            *w++ = '\n';
            c = end + 1;
        }
        *w = 0;
        if (!first)
            first = kept;
        else
            CHECK_STR_EQ(kept, first);
        if (kept != first) free(kept);
        result_free(&r);
    }
    free(first);
}

/* Names that are not UTF-8 give valid JSON, tabs do not break classify's
 * columns, odd --net files get a message about the file, and the help
 * describes the recipe without naming scripts users do not have. */
static void test_output_hygiene(void) {
    char dir[4300], m[4300];
    snprintf(dir, sizeof dir, "%s/names", root);
    snprintf(m, sizeof m, "%s/names.dsrt", root);
    static const char *const odd[] = {"caf\xe9", "tab\there", "plain"};
    make_images(dir, odd, 3, 4);
    result r =
        run(ARGV(bin_train, "train", "--data", dir, "--epochs", "1", "--quiet", "--save", m), 120);
    CHECK_EQ(r.status, 0);
    result_free(&r);

    r = run(ARGV(bin_train, "eval", "--model", m, "--data", dir, "--json"), 120);
    CHECK_EQ(r.status, 0);
    CHECK(valid_utf8(r.out));
    CHECK_CONTAINS(r.out, "caf\\ufffd");
    CHECK_CONTAINS(r.out, "tab\\there");
    result_free(&r);
    r = run(ARGV(bin_bench, dir, "--index", "--json"), 60);
    CHECK_EQ(r.status, 0);
    CHECK(valid_utf8(r.out));
    CHECK_CONTAINS(r.out, "caf\\ufffd");
    result_free(&r);

    char tabbed[4500];
    snprintf(tabbed, sizeof tabbed, "%s/tab\there", dir);
    r = run(ARGV(bin_train, "classify", "--model", m, "--top", "3", tabbed), 120);
    CHECK_EQ(r.status, 0);
    int lines = 0;
    for (char *line = r.out; *line;) {
        char *end = strchr(line, '\n');
        if (!end) break;
        int tabs = 0;
        for (char *c = line; c < end; c++) tabs += *c == '\t';
        CHECK_EQ(tabs, 6); /* path, then 3 x (label, score) */
        lines++;
        line = end + 1;
    }
    CHECK_EQ(lines, 4);
    CHECK_CONTAINS(r.out, "tab\\there");
    result_free(&r);

    struct {
        const char *name, *content;
        size_t len;
        const char *says;
    } nets[] = {{"empty.net", "", 0, "empty"},
                {"word.net", "digits\n", 7, "give --net digits"},
                {"binary.net", "\xff\xfe\x00\x01", 4, "binary data"}};
    for (size_t i = 0; i < 3; i++) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", root, nets[i].name);
        REQUIRE(timg_write_file(p, nets[i].content, nets[i].len) == 0);
        r = run(ARGV(bin_train, "train", "--data", good, "--net", p), 60);
        CHECK_EQ(r.status, 2);
        CHECK_CONTAINS(r.err, p);
        CHECK_CONTAINS(r.err, nets[i].says);
        CHECK(!strstr(r.err, "unknown network"));
        result_free(&r);
    }

    r = run(ARGV(bin_train, "train", "--help"), 30);
    CHECK_EQ(r.status, 0);
    CHECK(!strstr(r.out, ".py"));
    CHECK_CONTAINS(r.out, "dstrain train --data fm/train --val fm/test");
    result_free(&r);
}

/* Messages name what the user gave: --resume given a checkpoint's state
 * file says so (not --net), and a class folder whose name holds a line
 * break is blamed on --data, naming it. */
static void test_blame(void) {
    char ck[4300], nl[4300], state[4400];
    snprintf(ck, sizeof ck, "%s/blame-ck", root);
    result r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "1", "--batch", "64",
                        "--quiet", "--checkpoint-dir", ck),
                   120);
    CHECK_EQ(r.status, 0);
    result_free(&r);
    char latest[4400];
    CHECK_OK(dsrt_checkpoint_latest(ck, latest, sizeof latest));
    snprintf(state, sizeof state, "%s.state", latest);
    r = run(ARGV(bin_train, "train", "--data", good, "--resume", state), 60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "--resume ");
    CHECK_CONTAINS(r.err, "not the checkpoint: give ");
    CHECK_CONTAINS(r.err, latest);
    CHECK(!strstr(r.err, "--net"));
    result_free(&r);

    static const char *const names[] = {"one\ntwo", "three"};
    snprintf(nl, sizeof nl, "%s/newline", root);
    make_images(nl, names, 2, 2);
    r = run(ARGV(bin_train, "train", "--data", nl, "--epochs", "1"), 60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "--data ");
    CHECK_CONTAINS(r.err, "\"one\\ntwo\": a name with a line break cannot be kept in a model");
    CHECK(!strstr(r.err, "--net"));
    result_free(&r);
}

/* The string value after "key": in a JSON line (copied into v), or "". */
static const char *json_str(const char *s, const char *key, char *v, size_t cap) {
    char k[128];
    snprintf(k, sizeof k, "\"%s\":\"", key);
    const char *p = s ? strstr(s, k) : NULL;
    v[0] = '\0';
    if (!p) return v;
    p += strlen(k);
    size_t n = 0;
    while (p[n] && p[n] != '"' && n + 1 < cap) n++;
    memcpy(v, p, n);
    v[n] = '\0';
    return v;
}

/* dsbench's layouts and its limit: uint8 NHWC and gray outputs run and say
 * so, the limit is measured and each run set against it, the checksums are
 * the same whatever instruction set the augmenters use, and bad choices are
 * refused before any work. */
static void test_bench_layouts_and_limit(void) {
    char photos[4300];
    snprintf(photos, sizeof photos, "%s/photos", root);
    static const int kinds[] = {TIMG_JPEG_420, TIMG_JPEG_GRAY, TIMG_JPEG_PROGRESSIVE,
                                TIMG_JPEG_444};
    for (int i = 0; i < 24; i++) {
        char dir[4400], path[4500];
        snprintf(dir, sizeof dir, "%s/c%d", photos, i % 2);
        REQUIRE(timg_mkdirs(dir) == 0);
        size_t len;
        uint8_t *jpeg = timg_make_jpeg(kinds[i % 4], 300 + 7 * i, 260 - 3 * i, (uint32_t)i, &len);
        REQUIRE(jpeg);
        snprintf(path, sizeof path, "%s/%02d.jpg", dir, i);
        REQUIRE(timg_write_file(path, jpeg, len) == 0);
        free(jpeg);
    }
    result r = run(ARGV(bin_bench, photos, "--layout", "nhwc", "--threads", "1", "--epochs", "1",
                        "--batch", "8", "--limit", "--limit-passes", "1", "--json", "--checksum"),
                   300);
    CHECK_EQ(r.status, 0);
    char v[64];
    CHECK_STR_EQ(json_str(r.out, "layout", v, sizeof v), "nhwc");
    CHECK_STR_EQ(json_str(r.out, "dtype", v, sizeof v), "uint8");
    CHECK_CONTAINS(r.out, "\"limit\":{\"images\":24,");
    CHECK_CONTAINS(r.out, "\"of_limit\":");
    CHECK_CONTAINS(r.out, "\"load_average\":[");
    CHECK(json_str(r.out, "augment_isa", v, sizeof v)[0] != '\0');
    result_free(&r);
    r = run(ARGV(bin_bench, photos, "--channels", "1", "--threads", "1", "--epochs", "1", "--limit",
                 "--limit-passes", "1"),
            300);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.out, "limit: one core decodes 24 of these files");
    CHECK_CONTAINS(r.out, "(float32 NCHW, 1 channel)");
    CHECK_CONTAINS(r.out, "% of the limit");
    result_free(&r);

    /* The same bytes from every instruction set, float and uint8. */
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    static char *const layouts[][3] = {{"227", "nchw", "3"},      {"32", "nhwc", "3"},
                                       {"32", "nchw", "1"},       {"imagenet", "nchw", "3"},
                                       {"imagenet", "nhwc", "3"}, {"imagenet-val", "nchw", "3"}};
    for (size_t l = 0; l < (sizeof layouts / sizeof layouts[0]); l++) {
        char first[64] = "";
        for (size_t i = 0; i < (sizeof isas / sizeof isas[0]); i++) {
            setenv("DSRT_MAX_CPU_ISA", isas[i], 1);
            r = run(ARGV(bin_bench, photos, "--pipeline", layouts[l][0], "--layout", layouts[l][1],
                         "--channels", layouts[l][2], "--threads", "2", "--epochs", "1", "--batch",
                         "8", "--json", "--checksum"),
                    300);
            unsetenv("DSRT_MAX_CPU_ISA");
            CHECK_EQ(r.status, 0);
            char sum[64];
            json_str(r.out, "checksum", sum, sizeof sum);
            CHECK(sum[0] != '\0');
            if (i == 0) snprintf(first, sizeof first, "%s", sum);
            if (strcmp(sum, first) != 0)
                fprintf(stderr, "pipeline %s %s: %s gives %s, scalar %s\n", layouts[l][0],
                        layouts[l][1], isas[i], sum, first);
            CHECK_STR_EQ(sum, first);
            result_free(&r);
        }
    }

    /* Refused at once. */
    r = run(ARGV(bin_bench, photos, "--layout", "nhwc", "--dtype", "float32"), 30);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "float32 NCHW or uint8 NHWC");
    result_free(&r);
    r = run(ARGV(bin_bench, photos, "--channels", "2"), 30);
    CHECK_EQ(r.status, 2);
    result_free(&r);
    setenv("DSRT_MAX_CPU_ISA", "sse9", 1);
    r = run(ARGV(bin_bench, photos), 30);
    unsetenv("DSRT_MAX_CPU_ISA");
    CHECK_EQ(r.status, 1);
    CHECK_CONTAINS(r.err, "DSRT_MAX_CPU_ISA: 'sse9'");
    result_free(&r);
}

/* Copies file a to b, or its first `keep` bytes when keep >= 0. */
static void copy_file(const char *a, const char *b, long keep) {
    FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
    REQUIRE(in && out);
    char buf[65536];
    size_t n;
    long done = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (keep >= 0 && done + (long)n > keep) n = (size_t)(keep - done);
        fwrite(buf, 1, n, out);
        done += (long)n;
        if (keep >= 0 && done >= keep) break;
    }
    fclose(in);
    fclose(out);
}

/* --resume auto (with mixup, cutmix and label smoothing on): a fresh start
 * when the checkpoint folder is empty, the newest checkpoint when there is
 * one (a run of 1 epoch, then the same command for 2, ends with the weights
 * of an uninterrupted 2-epoch run), a truncated newest passed over and named;
 * without --checkpoint-dir refused before any work. */
static void test_resume_auto(void) {
    char ck[4400], ck2[4400], a[4600], b[4600];
    snprintf(ck, sizeof ck, "%s/auto", root);
    snprintf(ck2, sizeof ck2, "%s/auto2", root);
#define AUTO_ARGS(epochs, dir)                                                                     \
    bin_train, "train", "--data", good, "--epochs", epochs, "--batch", "8", "--json", "--quiet",   \
        "--execution-environment", "cpu", "--mixup-alpha", "0.4", "--cutmix-alpha", "1",           \
        "--label-smoothing", "0.1", "--checkpoint-dir", dir, "--checkpoint-unit", "iteration",     \
        "--checkpoint-frequency", "4", "--resume", "auto"
    char full[32], sum[32];
    result r = run(ARGV(bin_train, "train", "--data", good, "--epochs", "2", "--batch", "8",
                        "--json", "--quiet", "--execution-environment", "cpu", "--mixup-alpha",
                        "0.4", "--cutmix-alpha", "1", "--label-smoothing", "0.1"),
                   300);
    CHECK_EQ(r.status, 0);
    summary_checksum(r.out, full, sizeof full);
    CHECK(full[0]);
    result_free(&r);

    r = run(ARGV(AUTO_ARGS("1", ck)), 300);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "no complete checkpoint in");
    CHECK_CONTAINS(r.err, "starting afresh");
    summary_checksum(r.out, sum, sizeof sum);
    CHECK(strcmp(sum, full) != 0);
    result_free(&r);
    r = run(ARGV(AUTO_ARGS("2", ck)), 300);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "resuming from");
    CHECK_CONTAINS(r.err, "dsrt_ckpt_e001_i000000008.dsrt");
    summary_checksum(r.out, sum, sizeof sum);
    CHECK_STR_EQ(sum, full);
    result_free(&r);

    /* The checkpoint at 4 whole, the one at 8 cut short: 4 is taken. */
    REQUIRE(mkdir(ck2, 0755) == 0);
    snprintf(a, sizeof a, "%s/dsrt_ckpt_e000_i000000004.dsrt", ck);
    snprintf(b, sizeof b, "%s/dsrt_ckpt_e000_i000000004.dsrt", ck2);
    copy_file(a, b, -1);
    strcat(a, ".state");
    strcat(b, ".state");
    copy_file(a, b, -1);
    snprintf(a, sizeof a, "%s/dsrt_ckpt_e001_i000000008.dsrt", ck);
    snprintf(b, sizeof b, "%s/dsrt_ckpt_e001_i000000008.dsrt", ck2);
    struct stat st;
    REQUIRE(stat(a, &st) == 0);
    copy_file(a, b, (long)st.st_size / 2);
    r = run(ARGV(AUTO_ARGS("2", ck2)), 300);
    CHECK_EQ(r.status, 0);
    CHECK_CONTAINS(r.err, "passing over");
    CHECK_CONTAINS(r.err, "dsrt_ckpt_e001_i000000008.dsrt");
    CHECK_CONTAINS(r.err, "resuming from");
    CHECK_CONTAINS(r.err, "dsrt_ckpt_e000_i000000004.dsrt");
    summary_checksum(r.out, sum, sizeof sum);
    CHECK_STR_EQ(sum, full);
    result_free(&r);
#undef AUTO_ARGS

    r = run(ARGV(bin_train, "train", "--data", "/nonexistent", "--resume", "auto"), 60);
    CHECK_EQ(r.status, 2);
    CHECK_CONTAINS(r.err, "--resume auto looks in --checkpoint-dir DIR");
    result_free(&r);
}

int main(void) {
    int skip = toolrun_init("tools");
    if (skip) return skip;
    toolrun_good_model(good, sizeof good, model, sizeof model);

    RUN(test_non_regular);
    RUN(test_resume_auto);
    RUN(test_eval_counts);
    RUN(test_output_paths);
    RUN(test_bad_files_named);
    RUN(test_signals);
    RUN(test_process_limits);
    RUN(test_scan_warnings);
    RUN(test_output_hygiene);
    RUN(test_classify_streams);
    RUN(test_option_suggestions);
    RUN(test_blame);
    RUN(test_shards_cli);
    RUN(test_bench_layouts_and_limit);
    return TEST_RESULT();
}
