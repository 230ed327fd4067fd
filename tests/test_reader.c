/*
 * Tests of the file reader: both back-ends read many files of awkward sizes
 * at several depths and return exactly their bytes, each tag once; a full
 * reader says -EBUSY; broken files (missing, a directory, empty, too big,
 * unreadable, a FIFO, shrunk or grown under the reader) come back as results
 * with the right status and a message naming the path; O_DIRECT works or is
 * counted as refused; destroying a reader with reads in flight leaks nothing.
 *
 * Files are made in a fresh folder under $DSRT_TEST_TMP (or /tmp). The
 * io_uring half is skipped with a message where the kernel refuses io_uring.
 */
#include <dirent.h>
#include <dsrt/datastore.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "task.h"

static char tmp_dir[4096];
static int uring_ok; /* the kernel lets this process use io_uring */

// ----------------------------------------------------------------------------
// Helpers

/* Byte i of the test file with key k. */
static uint8_t content_byte(uint64_t k, size_t i) {
    return (uint8_t)(dsrt__mix64(k * 0x100000001b3ULL + i) >> 56);
}

static void fill_content(uint8_t *buf, size_t n, uint64_t k) {
    for (size_t i = 0; i < n; i++) buf[i] = content_byte(k, i);
}

static void write_file(const char *path, size_t size, uint64_t k) {
    uint8_t *data = malloc(size ? size : 1);
    REQUIRE(data);
    fill_content(data, size, k);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        REQUIRE(n > 0);
        off += (size_t)n;
    }
    REQUIRE(close(fd) == 0);
    free(data);
}

static int content_ok(const uint8_t *buf, size_t n, uint64_t k) {
    for (size_t i = 0; i < n; i++)
        if (buf[i] != content_byte(k, i)) return 0;
    return 1;
}

static size_t round_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the DIR's own */
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void make_tmp_dir(void) {
    const char *base = getenv("DSRT_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmp_dir, sizeof tmp_dir, "%s/reader-XXXXXX", base);
    REQUIRE(mkdtemp(tmp_dir));
}

/* The back-ends this run exercises. */
static int n_backends(void) {
    return uring_ok ? 2 : 1;
}
static dsrt_io backend(int i) {
    return i == 0 ? DSRT_IO_PREAD : DSRT_IO_URING;
}

static dsrt_reader *make_reader(dsrt_io io, unsigned depth, int direct) {
    dsrt_reader_options o = dsrt_reader_defaults();
    o.io = io;
    o.depth = depth;
    o.direct = direct;
    dsrt_reader *r = NULL;
    int rc = dsrt_reader_create(&r, &o);
    if (rc != 0) fprintf(stderr, "dsrt_reader_create: %d: %s\n", rc, dsrt_last_error());
    REQUIRE(rc == 0 && r);
    CHECK_EQ(dsrt_reader_io(r), io);
    return r;
}

// ----------------------------------------------------------------------------
// A set of generated files

typedef struct {
    char path[4200];
    size_t size;
    uint64_t key;
    uint8_t *buf; /* (cap), aligned to DSRT_DIRECT_ALIGN */
    size_t cap;
    int seen;
} test_file;

typedef struct {
    test_file *f;
    size_t n;
} file_set;

/* Files of sizes 0, 1, 4095, 4096, 4097, 1 MiB and random ones under dir. */
static file_set make_files(const char *dir, size_t n, uint64_t seed) {
    static const size_t fixed[] = {0, 1, 4095, 4096, 4097, 1 << 20, 8191, 12288, 65537};
    file_set s = {calloc(n, sizeof(test_file)), n};
    REQUIRE(s.f);
    mkdir(dir, 0755);
    dsrt_rng rng = dsrt_rng_init(seed, 0, 0, 0);
    for (size_t i = 0; i < n; i++) {
        test_file *t = &s.f[i];
        t->size = i < DSRT_ARRAY_SIZE(fixed) ? fixed[i] : (size_t)dsrt_rng_below(&rng, 300000);
        t->key = seed * 1000 + i;
        snprintf(t->path, sizeof t->path, "%s/f%03zu.bin", dir, i);
        write_file(t->path, t->size, t->key);
        t->cap = round_up(t->size + 1, DSRT_DIRECT_ALIGN);
        REQUIRE(posix_memalign((void **)&t->buf, DSRT_DIRECT_ALIGN, t->cap) == 0);
    }
    return s;
}

static void free_files(file_set *s) {
    for (size_t i = 0; i < s->n; i++) free(s->f[i].buf);
    free(s->f);
}

/* Checks one result against the file set. */
static void check_result(file_set *s, const dsrt_read_result *res) {
    CHECK_LT(res->tag, s->n);
    if (res->tag >= s->n) return;
    test_file *t = &s->f[res->tag];
    CHECK_EQ(t->seen, 0);
    t->seen++;
    CHECK(res->path == t->path);
    CHECK(res->buf == t->buf);
    if (t->size == 0) {
        CHECK_EQ(res->status, DSRT_EEMPTY);
        CHECK_EQ(res->size, 0);
        CHECK_CONTAINS(dsrt_last_error(), t->path);
        return;
    }
    if (res->status != 0)
        fprintf(stderr, "%s: status %d: %s\n", t->path, res->status, dsrt_last_error());
    CHECK_EQ(res->status, 0);
    CHECK_EQ(res->size, t->size);
    CHECK(res->size == t->size && content_ok(t->buf, t->size, t->key));
}

/* Reads every file of s through r, keeping the reader full; checks each
 * result. Uses non-blocking collects now and then. */
static void read_all(dsrt_reader *r, file_set *s, unsigned depth) {
    for (size_t i = 0; i < s->n; i++) {
        s->f[i].seen = 0;
        memset(s->f[i].buf, 0xAA, s->f[i].cap);
    }
    size_t next = 0, got = 0, polls = 0;
    while (got < s->n) {
        while (next < s->n) {
            test_file *t = &s->f[next];
            int rc = dsrt_reader_submit(r, t->path, t->buf, t->cap, next);
            if (rc == -EBUSY) {
                CHECK_EQ(dsrt_reader_in_flight(r), depth);
                break;
            }
            CHECK_OK(rc);
            next++;
            CHECK_LE(dsrt_reader_in_flight(r), depth);
        }
        dsrt_read_result res;
        int wait = (polls++ % 3) != 0;
        int rc = dsrt_reader_collect(r, &res, wait);
        CHECK_GE(rc, 0);
        if (rc < 0) break;
        if (rc == 0) {
            CHECK(!wait);
            if (wait) break;
            continue;
        }
        check_result(s, &res);
        got++;
    }
    CHECK_EQ(dsrt_reader_in_flight(r), 0);
    dsrt_read_result res;
    CHECK_EQ(dsrt_reader_collect(r, &res, 1), 0);
    for (size_t i = 0; i < s->n; i++) CHECK_EQ(s->f[i].seen, 1);
}

// ----------------------------------------------------------------------------
// Cases

static void test_defaults_and_names(void) {
    dsrt_reader_options o = dsrt_reader_defaults();
    CHECK_EQ(o.io, DSRT_IO_AUTO);
    CHECK_EQ(o.depth, 16);
    CHECK_EQ(o.direct, 0);
    CHECK_STR_EQ(dsrt_io_name(DSRT_IO_AUTO), "auto");
    CHECK_STR_EQ(dsrt_io_name(DSRT_IO_URING), "io_uring");
    CHECK_STR_EQ(dsrt_io_name(DSRT_IO_PREAD), "pread");

    dsrt_reader *r = (dsrt_reader *)1;
    o.depth = 0;
    CHECK_EQ(dsrt_reader_create(&r, &o), DSRT_EOPTION);
    CHECK(r == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "depth");
    o = dsrt_reader_defaults();
    o.io = (dsrt_io)7;
    CHECK_EQ(dsrt_reader_create(&r, &o), DSRT_EOPTION);

    /* NULL options are the defaults; AUTO never fails for want of io_uring. */
    CHECK_OK(dsrt_reader_create(&r, NULL));
    REQUIRE(r);
    CHECK_EQ(dsrt_reader_in_flight(r), 0);
    CHECK_EQ(dsrt_reader_direct_refused(r), 0);
    if (dsrt_reader_io(r) == DSRT_IO_URING) {
        CHECK(dsrt_reader_fallback_reason(r) == NULL);
    } else {
        CHECK_EQ(dsrt_reader_io(r), DSRT_IO_PREAD);
        CHECK_CONTAINS(dsrt_reader_fallback_reason(r), "io_uring");
    }
    dsrt_read_result res;
    CHECK_EQ(dsrt_reader_collect(r, &res, 1), 0);
    CHECK_EQ(dsrt_reader_collect(r, &res, 0), 0);
    dsrt_reader_destroy(r);
    dsrt_reader_destroy(NULL);

    /* pread asked for: no fallback reason. */
    r = make_reader(DSRT_IO_PREAD, 4, 0);
    CHECK(dsrt_reader_fallback_reason(r) == NULL);
    dsrt_reader_destroy(r);
}

static void test_uring_availability(void) {
    dsrt_reader_options o = dsrt_reader_defaults();
    o.io = DSRT_IO_URING;
    dsrt_reader *r = NULL;
    int rc = dsrt_reader_create(&r, &o);
    if (rc == 0) {
        uring_ok = 1;
        CHECK_EQ(dsrt_reader_io(r), DSRT_IO_URING);
        CHECK(dsrt_reader_fallback_reason(r) == NULL);
        dsrt_reader_destroy(r);
        return;
    }
    /* Refused: the message says why, and AUTO falls back with the same reason. */
    CHECK(r == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "io_uring");
    fprintf(stderr, "io_uring refused (%s): its cases are skipped\n", dsrt_last_error());
    o.io = DSRT_IO_AUTO;
    CHECK_OK(dsrt_reader_create(&r, &o));
    REQUIRE(r);
    CHECK_EQ(dsrt_reader_io(r), DSRT_IO_PREAD);
    CHECK_CONTAINS(dsrt_reader_fallback_reason(r), "io_uring");
    dsrt_reader_destroy(r);
}

static void test_read_many(void) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/many", tmp_dir);
    file_set s = make_files(dir, 48, 1);
    static const unsigned depths[] = {1, 4, 16};
    for (int b = 0; b < n_backends(); b++) {
        for (size_t d = 0; d < DSRT_ARRAY_SIZE(depths); d++) {
            dsrt_reader *r = make_reader(backend(b), depths[d], 0);
            read_all(r, &s, depths[d]);
            /* The same reader again: slots were all given back. */
            read_all(r, &s, depths[d]);
            dsrt_reader_destroy(r);
        }
    }
    free_files(&s);
}

static void test_busy(void) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/busy", tmp_dir);
    file_set s = make_files(dir, 12, 2);
    for (int b = 0; b < n_backends(); b++) {
        dsrt_reader *r = make_reader(backend(b), 4, 0);
        for (size_t i = 1; i <= 3; i++)
            CHECK_OK(dsrt_reader_submit(r, s.f[i].path, s.f[i].buf, s.f[i].cap, i));
        /* A missing file takes a slot too. */
        CHECK_OK(dsrt_reader_submit(r, "/nonexistent/dsrt/x.jpg", s.f[4].buf, s.f[4].cap, 99));
        CHECK_EQ(dsrt_reader_in_flight(r), 4);
        CHECK_EQ(dsrt_reader_submit(r, s.f[5].path, s.f[5].buf, s.f[5].cap, 5), -EBUSY);
        CHECK_EQ(dsrt_reader_in_flight(r), 4);
        dsrt_read_result res;
        CHECK_EQ(dsrt_reader_collect(r, &res, 1), 1);
        CHECK_EQ(dsrt_reader_in_flight(r), 3);
        CHECK_OK(dsrt_reader_submit(r, s.f[5].path, s.f[5].buf, s.f[5].cap, 5));
        int n = 1;
        while (dsrt_reader_collect(r, &res, 1) == 1) n++;
        CHECK_EQ(n, 5);
        CHECK_EQ(dsrt_reader_in_flight(r), 0);
        dsrt_reader_destroy(r);
    }
    free_files(&s);
}

/* Root reads a chmod 000 file all the same: check the refusal in a child
 * that has given up root for "nobody". Skipped where that is not possible. */
static void locked_as_nobody(const char *locked) {
    /* The child must be able to reach the file: open the folders we made
     * (only those) for searching. */
    char parent[4300];
    snprintf(parent, sizeof parent, "%s", locked);
    for (char *slash;
         (slash = strrchr(parent, '/')) && (size_t)(slash - parent) >= strlen(tmp_dir);) {
        *slash = '\0';
        struct stat st;
        if (stat(parent, &st) == 0 && (st.st_mode & 0111) != 0111) chmod(parent, st.st_mode | 0111);
    }
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(TEST_SKIP);
        int bad = 0;
        for (int b = 0; b < n_backends(); b++) {
            dsrt_reader *r = make_reader(backend(b), 2, 0);
            uint8_t buf[256];
            dsrt_read_result res;
            bad |= dsrt_reader_submit(r, locked, buf, sizeof buf, 1) != 0;
            bad |= dsrt_reader_collect(r, &res, 1) != 1;
            bad |= res.status != -EACCES;
            bad |= !strstr(dsrt_last_error(), locked) || !strstr(dsrt_last_error(), "denied");
            if (bad) fprintf(stderr, "as nobody: status %d: %s\n", res.status, dsrt_last_error());
            dsrt_reader_destroy(r);
        }
        _exit(bad ? 1 : 0);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    REQUIRE(WIFEXITED(st));
    if (WEXITSTATUS(st) == TEST_SKIP)
        fprintf(stderr, "running as root and cannot become nobody: unreadable file not checked\n");
    else
        CHECK_EQ(WEXITSTATUS(st), 0);
}

static void test_bad_files(void) {
    char dir[4200], missing[4300], sub[4300], empty[4300], big[4300], locked[4300], fifo[4300],
        good[4300];
    snprintf(dir, sizeof dir, "%s/bad", tmp_dir);
    mkdir(dir, 0755);
    snprintf(missing, sizeof missing, "%s/missing.jpg", dir);
    snprintf(sub, sizeof sub, "%s/folder.jpg", dir);
    snprintf(empty, sizeof empty, "%s/empty.jpg", dir);
    snprintf(big, sizeof big, "%s/big.jpg", dir);
    snprintf(locked, sizeof locked, "%s/locked.jpg", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.jpg", dir);
    snprintf(good, sizeof good, "%s/good.jpg", dir);
    REQUIRE(mkdir(sub, 0755) == 0);
    write_file(empty, 0, 0);
    write_file(big, 10000, 5);
    write_file(locked, 100, 6);
    REQUIRE(chmod(locked, 0) == 0);
    int have_fifo = mkfifo(fifo, 0644) == 0;
    write_file(good, 5000, 7);
    int root = geteuid() == 0;

    enum { MISSING, SUB, EMPTY, BIG, LOCKED, FIFO, GOOD, N };
    const char *paths[N] = {missing, sub, empty, big, locked, fifo, good};
    const int want[N] = {-ENOENT,      -EISDIR, DSRT_EEMPTY, DSRT_ETOOBIG, root ? 0 : -EACCES,
                         DSRT_EFORMAT, 0};
    const char *why[N] = {"No such file", "directory", "empty", "10000 bytes",
                          "denied",       "FIFO",      ""};
    uint8_t *bufs[N];
    for (int i = 0; i < N; i++) REQUIRE(posix_memalign((void **)&bufs[i], 4096, 8192) == 0);

    for (int b = 0; b < n_backends(); b++) {
        dsrt_reader *r = make_reader(backend(b), 16, 0);
        for (int i = 0; i < N; i++) {
            if (i == FIFO && !have_fifo) continue;
            CHECK_OK(dsrt_reader_submit(r, paths[i], bufs[i], 8192, (uint64_t)i));
        }
        dsrt_read_result res;
        int seen[N] = {0};
        while (dsrt_reader_collect(r, &res, 1) == 1) {
            REQUIRE(res.tag < N);
            int i = (int)res.tag;
            seen[i]++;
            CHECK(res.path == paths[i]);
            CHECK_EQ(res.status, want[i]);
            if (want[i] == DSRT_ETOOBIG) {
                CHECK_EQ(res.size, 10000); /* the file's size, for a larger buffer */
            } else if (want[i] != 0) {
                CHECK_EQ(res.size, 0);
            }
            if (want[i] != 0) {
                CHECK_CONTAINS(dsrt_last_error(), "read: ");
                CHECK_CONTAINS(dsrt_last_error(), paths[i]);
                CHECK_CONTAINS(dsrt_last_error(), why[i]);
            } else {
                size_t size = i == GOOD ? 5000 : 100;
                CHECK_EQ(res.size, size);
                CHECK(content_ok(bufs[i], size, i == GOOD ? 7 : 6));
            }
        }
        for (int i = 0; i < N; i++) CHECK_EQ(seen[i], i == FIFO && !have_fifo ? 0 : 1);
        dsrt_reader_destroy(r);
    }
    if (root) locked_as_nobody(locked);
    for (int i = 0; i < N; i++) free(bufs[i]);
}

/* The file shrinks or grows between submit and the read: with pread the read
 * happens at collect; with io_uring the read is handed to the kernel at
 * collect too, so the change lands in between. */
static void test_changed_files(void) {
    char path[4300];
    snprintf(path, sizeof path, "%s/changing.bin", tmp_dir);
    uint8_t *buf;
    REQUIRE(posix_memalign((void **)&buf, 4096, 65536) == 0);
    for (int b = 0; b < n_backends(); b++) {
        dsrt_reader *r = make_reader(backend(b), 4, 0);
        dsrt_read_result res;

        write_file(path, 20000, 11);
        CHECK_OK(dsrt_reader_submit(r, path, buf, 65536, 1));
        REQUIRE(truncate(path, 7000) == 0);
        CHECK_EQ(dsrt_reader_collect(r, &res, 1), 1);
        CHECK_EQ(res.status, DSRT_ETRUNCATED);
        CHECK_EQ(res.size, 7000);
        CHECK(content_ok(buf, 7000, 11));
        CHECK_CONTAINS(dsrt_last_error(), path);
        CHECK_CONTAINS(dsrt_last_error(), "shrank");

        write_file(path, 20000, 12);
        CHECK_OK(dsrt_reader_submit(r, path, buf, 65536, 2));
        REQUIRE(truncate(path, 30000) == 0);
        CHECK_EQ(dsrt_reader_collect(r, &res, 1), 1);
        CHECK_EQ(res.status, 0);
        CHECK_EQ(res.size, 20000);
        CHECK(content_ok(buf, 20000, 12));
        dsrt_reader_destroy(r);
    }
    free(buf);
}

/* Whether files in dir accept O_DIRECT, asked directly. */
static int dir_takes_direct(const char *file) {
    int fd = open(file, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    REQUIRE(errno == EINVAL);
    return 0;
}

static void direct_in(const char *base) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/direct", base);
    file_set s = make_files(dir, 24, 3);
    int takes = dir_takes_direct(s.f[1].path);
    fprintf(stderr, "O_DIRECT in %s: %s\n", base, takes ? "taken" : "refused");
    for (int b = 0; b < n_backends(); b++) {
        static const unsigned depths[] = {1, 8};
        for (size_t d = 0; d < DSRT_ARRAY_SIZE(depths); d++) {
            dsrt_reader *r = make_reader(backend(b), depths[d], 1);
            read_all(r, &s, depths[d]);
            /* Every non-empty file opened is refused, or none is. */
            uint64_t refused = dsrt_reader_direct_refused(r);
            CHECK_EQ(refused, takes ? 0 : s.n);
            dsrt_reader_destroy(r);
        }
        /* Misaligned buffers are a programmer error, returned at once. */
        dsrt_reader *r = make_reader(backend(b), 4, 1);
        CHECK_EQ(dsrt_reader_submit(r, s.f[1].path, s.f[1].buf + 512, 4096, 0), -EINVAL);
        CHECK_CONTAINS(dsrt_last_error(), "aligned");
        CHECK_EQ(dsrt_reader_submit(r, s.f[1].path, s.f[1].buf, 4000, 0), -EINVAL);
        CHECK_EQ(dsrt_reader_in_flight(r), 0);
        dsrt_reader_destroy(r);
    }
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free_files(&s);
}

static void test_direct(void) {
    direct_in(tmp_dir);
    /* tmpfs refuses O_DIRECT before Linux 6.6. */
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0) {
        char shm[64];
        snprintf(shm, sizeof shm, "/dev/shm/dsrt-reader-XXXXXX");
        if (mkdtemp(shm)) {
            direct_in(shm);
            nftw(shm, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        }
    }
}

/* A file system that refuses O_DIRECT at open: sysfs, whose attribute files
 * also claim 4096 bytes and hold fewer (so they read as shrunk). */
static void test_direct_refused(void) {
    static const char *const candidates[] = {"/sys/kernel/mm/transparent_hugepage/enabled",
                                             "/sys/kernel/profiling", "/sys/power/state"};
    const char *path = NULL;
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(candidates) && !path; i++) {
        struct stat st;
        if (stat(candidates[i], &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) continue;
        int fd = open(candidates[i], O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            continue;
        }
        if (errno == EINVAL && access(candidates[i], R_OK) == 0) path = candidates[i];
    }
    if (!path) {
        fprintf(stderr, "no file here refuses O_DIRECT: the refusal count is not checked\n");
        return;
    }
    uint8_t *buf;
    REQUIRE(posix_memalign((void **)&buf, 4096, 8192) == 0);
    for (int b = 0; b < n_backends(); b++) {
        dsrt_reader *r = make_reader(backend(b), 4, 1);
        for (uint64_t k = 0; k < 3; k++) CHECK_OK(dsrt_reader_submit(r, path, buf, 8192, k));
        dsrt_read_result res;
        int n = 0;
        while (dsrt_reader_collect(r, &res, 1) == 1) {
            n++;
            CHECK(res.status == 0 || res.status == DSRT_ETRUNCATED);
            CHECK_GT(res.size, 0);
        }
        CHECK_EQ(n, 3);
        CHECK_EQ(dsrt_reader_direct_refused(r), 3);
        dsrt_reader_destroy(r);
    }
    free(buf);
}

static void test_destroy_in_flight(void) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/inflight", tmp_dir);
    file_set s = make_files(dir, 16, 4);
    int fds = open_fds();
    for (int b = 0; b < n_backends(); b++) {
        for (int collected = 0; collected < 2; collected++) {
            dsrt_reader *r = make_reader(backend(b), 16, 0);
            for (size_t i = 0; i < s.n; i++)
                CHECK_OK(dsrt_reader_submit(r, s.f[i].path, s.f[i].buf, s.f[i].cap, i));
            if (collected) {
                dsrt_read_result res;
                CHECK_EQ(dsrt_reader_collect(r, &res, 1), 1);
            }
            dsrt_reader_destroy(r);
            CHECK_EQ(open_fds(), fds);
        }
    }
    free_files(&s);
}

/* Two threads, each with its own reader, reading the same files. */
typedef struct {
    file_set s;
    dsrt_io io;
} thread_arg;

static void *reader_thread(void *p) {
    thread_arg *a = p;
    dsrt_reader *r = make_reader(a->io, 8, 0);
    read_all(r, &a->s, 8);
    dsrt_reader_destroy(r);
    return NULL;
}

static void test_threads(void) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/threads", tmp_dir);
    file_set s = make_files(dir, 20, 5);
    thread_arg args[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        /* Own buffers per thread, same paths. */
        args[i].io = backend(i % n_backends());
        args[i].s.n = s.n;
        args[i].s.f = calloc(s.n, sizeof(test_file));
        REQUIRE(args[i].s.f);
        for (size_t k = 0; k < s.n; k++) {
            args[i].s.f[k] = s.f[k];
            REQUIRE(posix_memalign((void **)&args[i].s.f[k].buf, 4096, s.f[k].cap) == 0);
        }
        REQUIRE(pthread_create(&th[i], NULL, reader_thread, &args[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        free_files(&args[i].s);
    }
    free_files(&s);
}

int main(void) {
    make_tmp_dir();
    RUN(test_defaults_and_names);
    RUN(test_uring_availability);
    RUN(test_read_many);
    RUN(test_busy);
    RUN(test_bad_files);
    RUN(test_changed_files);
    RUN(test_direct);
    RUN(test_direct_refused);
    RUN(test_destroy_in_flight);
    RUN(test_threads);
    nftw(tmp_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return TEST_RESULT();
}
