/*
 * Tests of the folder source and the order functions: class and sample
 * order (ImageFolder's), label sources, extension filter, symbolic links and
 * loops, unreadable folders, and the invariants of split_each_label,
 * shuffle, partition and subset (disjoint, complete, deterministic).
 */
#include <dsrt.h>

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "task.h"

static char root[4096];

static void touch(const char *rel) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    /* mkdir -p of the folders on the way */
    for (char *s = p + strlen(root) + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    }
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, "x", 1) == 1);
    close(fd);
}

static void make_root(const char *name) {
    const char *tmp = getenv("DSRT_TEST_TMP");
    char base[4096];
    snprintf(base, sizeof base, "%s", tmp ? tmp : "/tmp");
    mkdir(base, 0755);
    snprintf(root, sizeof root, "%s/ds_%s_XXXXXX", base, name);
    REQUIRE(mkdtemp(root) != NULL);
}

static dsrt_datastore *open_ok(const char *path, const dsrt_datastore_options *o) {
    dsrt_datastore *ds = NULL;
    int rc = dsrt_datastore_open(&ds, path, o);
    if (rc != 0) fprintf(stderr, "open %s: %d %s\n", path, rc, dsrt_last_error());
    REQUIRE(rc == 0 && ds);
    return ds;
}

static const char *rel(const dsrt_datastore *ds, size_t i) {
    const char *p = dsrt_datastore_path(ds, i);
    return p ? p + strlen(root) + 1 : "(null)";
}

// ----------------------------------------------------------------------------
// Folder source

static void test_folder_order(void) {
    make_root("order");
    touch("b/2.jpg");
    touch("b/10.JPG");
    touch("a/z.png");
    touch("a/sub/y.jpeg");
    touch("a/sub/x/w.jpg");
    touch("a b/q.jpg");
    touch("a/notes.txt");
    touch("a/noext");
    touch("root.jpg");
    char empty[8192];
    snprintf(empty, sizeof empty, "%s/c_empty", root);
    mkdir(empty, 0755);

    dsrt_datastore *ds = open_ok(root, NULL);
    CHECK_EQ(dsrt_datastore_source(ds), DSRT_SOURCE_FOLDER);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 4);
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 0), "a");
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 1), "a b");
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 2), "b");
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 3), "c_empty");
    CHECK_EQ(dsrt_datastore_count(ds), 6);
    /* ImageFolder: class, then folder path (sorted(os.walk)), then name. */
    static const char *const want[] = {"a/z.png",   "a/sub/y.jpeg", "a/sub/x/w.jpg",
                                       "a b/q.jpg", "b/10.JPG",     "b/2.jpg"};
    static const int labels[] = {0, 0, 0, 1, 2, 2};
    for (size_t i = 0; i < 6; i++) {
        CHECK_STR_EQ(rel(ds, i), want[i]);
        CHECK_EQ(dsrt_datastore_label(ds, i), labels[i]);
        CHECK_EQ(dsrt_datastore_id(ds, i), i);
    }
    size_t counts[4];
    dsrt_datastore_class_counts(ds, counts);
    CHECK_EQ(counts[0], 3);
    CHECK_EQ(counts[1], 1);
    CHECK_EQ(counts[2], 2);
    CHECK_EQ(counts[3], 0);
    /* The root file and the empty class are reported. */
    CHECK_EQ(dsrt_datastore_warning_count(ds), 2);
    CHECK_CONTAINS(dsrt_datastore_warnings(ds), "directly in the root");
    CHECK_CONTAINS(dsrt_datastore_warnings(ds), "c_empty");
    CHECK(dsrt_datastore_pixels(ds, 0, &(dsrt_image){0}) == DSRT_EUNSUPPORTED);
    dsrt_datastore_close(ds);

    /* A trailing slash indexes the same. */
    char slash[8192];
    snprintf(slash, sizeof slash, "%s/", root);
    ds = open_ok(slash, NULL);
    CHECK_EQ(dsrt_datastore_count(ds), 6);
    CHECK_STR_EQ(rel(ds, 0), "a/z.png");
    dsrt_datastore_close(ds);

    /* No sub-folders: only files directly inside each class folder. */
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.include_subfolders = 0;
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_count(ds), 4);
    dsrt_datastore_close(ds);

    /* Extension filter, with and without dots, any case. */
    o = dsrt_datastore_defaults();
    o.extensions = ".PNG, txt";
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_count(ds), 2);
    CHECK_STR_EQ(rel(ds, 0), "a/notes.txt");
    CHECK_STR_EQ(rel(ds, 1), "a/z.png");
    dsrt_datastore_close(ds);

    /* Parent-folder labels (MATLAB 'foldernames'): the folder holding the file. */
    o = dsrt_datastore_defaults();
    o.label_source = DSRT_LABEL_PARENT_FOLDER;
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_count(ds), 7); /* root.jpg too, labelled by the root's name */
    size_t nc = dsrt_datastore_num_classes(ds);
    CHECK_EQ(nc, 6); /* a, a b, b, sub, x, <root> */
    for (size_t i = 0; i < dsrt_datastore_count(ds); i++) {
        const char *p = dsrt_datastore_path(ds, i);
        const char *name = dsrt_datastore_class_name(ds, (size_t)dsrt_datastore_label(ds, i));
        const char *slash2 = strrchr(p, '/'), *parent = p;
        for (const char *s = p; s < slash2; s++)
            if (*s == '/') parent = s + 1;
        size_t len = (size_t)(slash2 - parent);
        CHECK(strlen(name) == len && memcmp(parent, name, len) == 0);
    }
    for (size_t c = 1; c < nc; c++)
        CHECK(strcmp(dsrt_datastore_class_name(ds, c - 1), dsrt_datastore_class_name(ds, c)) < 0);
    dsrt_datastore_close(ds);

    /* No labels: one class. */
    o = dsrt_datastore_defaults();
    o.label_source = DSRT_LABEL_NONE;
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 1);
    CHECK_EQ(dsrt_datastore_count(ds), 7);
    for (size_t i = 0; i < 7; i++) CHECK_EQ(dsrt_datastore_label(ds, i), 0);
    dsrt_datastore_close(ds);
}

static void test_folder_links(void) {
    make_root("links");
    touch("cat/1.jpg");
    touch("dog/1.jpg");
    touch("dog/deep/2.jpg");
    char a[8192], b[8192];
    /* A loop: dog/deep/up -> ../.. (the root), and cat/self -> . */
    snprintf(a, sizeof a, "%s/dog/deep/up", root);
    REQUIRE(symlink("../..", a) == 0);
    snprintf(a, sizeof a, "%s/cat/self", root);
    REQUIRE(symlink(".", a) == 0);
    /* A link to a file is followed; a broken one is reported. */
    snprintf(a, sizeof a, "%s/dog/1.jpg", root);
    snprintf(b, sizeof b, "%s/cat/link.jpg", root);
    REQUIRE(symlink(a, b) == 0);
    snprintf(b, sizeof b, "%s/cat/broken.jpg", root);
    REQUIRE(symlink("/nonexistent/file.jpg", b) == 0);
    /* A link to a class folder makes a class, like ImageFolder. */
    snprintf(a, sizeof a, "%s/dog", root);
    snprintf(b, sizeof b, "%s/hound", root);
    REQUIRE(symlink(a, b) == 0);

    dsrt_datastore *ds = open_ok(root, NULL);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 3);
    size_t counts[3];
    dsrt_datastore_class_counts(ds, counts);
    CHECK_EQ(counts[0], 2); /* cat: 1.jpg, link.jpg */
    CHECK_EQ(counts[1], 2); /* dog */
    CHECK_EQ(counts[2], 2); /* hound -> dog */
    const char *w = dsrt_datastore_warnings(ds);
    CHECK_CONTAINS(w, "loop");
    CHECK_CONTAINS(w, "broken.jpg");
    CHECK_GE(dsrt_datastore_warning_count(ds), 3);
    dsrt_datastore_close(ds);

    /* A broken link deep in folders of long names: its warning is whole,
     * the reason at its end included. */
    char deep[4096], name[256], want[4400];
    memset(name, 'n', 200);
    name[200] = '\0';
    int at = snprintf(deep, sizeof deep, "%s/cat", root);
    for (int k = 0; k < 6; k++) {
        at += snprintf(deep + at, sizeof deep - (size_t)at, "/%s%d", name, k);
        REQUIRE(mkdir(deep, 0755) == 0 || errno == EEXIST);
    }
    snprintf(b, sizeof b, "%s/gone.jpg", deep);
    REQUIRE(symlink("/nonexistent/file.jpg", b) == 0);
    ds = open_ok(root, NULL);
    snprintf(want, sizeof want, "%s: broken symbolic link (%s), skipped\n", b, strerror(ENOENT));
    CHECK(strlen(b) > 1200);
    CHECK_CONTAINS(dsrt_datastore_warnings(ds), want);
    dsrt_datastore_close(ds);
    REQUIRE(unlink(b) == 0);

    /* Not following links: no loop, no link classes. */
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.follow_symlinks = 0;
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 2);
    CHECK_EQ(dsrt_datastore_count(ds), 3);
    dsrt_datastore_close(ds);

    /* An unreadable folder is reported and skipped (root reads anything). */
    if (geteuid() != 0) {
        snprintf(a, sizeof a, "%s/dog/deep", root);
        chmod(a, 0);
        ds = open_ok(root, &o);
        CHECK_CONTAINS(dsrt_datastore_warnings(ds), "Permission denied");
        CHECK_EQ(dsrt_datastore_count(ds), 2);
        dsrt_datastore_close(ds);
        chmod(a, 0755);
    }
}

/* A class folder without images is a class of 0 samples, which the
 * warnings name; drop_empty_classes leaves it out and numbers the rest. */
static void test_empty_classes(void) {
    make_root("empty");
    touch("ant/1.jpg");
    touch("bee/notes.txt");
    touch("cow/2.jpg");
    char p[8192];
    snprintf(p, sizeof p, "%s/deer", root);
    REQUIRE(mkdir(p, 0755) == 0);
    dsrt_datastore *ds = open_ok(root, NULL);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 4);
    size_t counts[4];
    dsrt_datastore_class_counts(ds, counts);
    CHECK_EQ(counts[1], 0);
    CHECK_EQ(counts[3], 0);
    CHECK_CONTAINS(dsrt_datastore_warnings(ds), "bee: class folder holds no image file");
    CHECK_CONTAINS(dsrt_datastore_warnings(ds), "deer: class folder holds no image file");
    dsrt_datastore_close(ds);

    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.drop_empty_classes = 1;
    ds = open_ok(root, &o);
    CHECK_EQ(dsrt_datastore_num_classes(ds), 2);
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 0), "ant");
    CHECK_STR_EQ(dsrt_datastore_class_name(ds, 1), "cow");
    CHECK_EQ(dsrt_datastore_label(ds, 0), 0);
    CHECK_EQ(dsrt_datastore_label(ds, 1), 1);
    CHECK_CONTAINS(dsrt_datastore_warnings(ds),
                   "bee: class folder holds no image file: not a class");
    dsrt_datastore_close(ds);
}

/* Too many files open while scanning is the process's limit: the scan
 * fails with it instead of skipping the folders it could not open. */
static void test_scan_open_files_limit(void) {
    make_root("limit");
    touch("a/deep/1.jpg");
    touch("b/deep/2.jpg");
    int low = 0;
    {
        uint8_t used[4096] = {0};
        DIR *d = opendir("/proc/self/fd");
        REQUIRE(d);
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] != '.' && fd >= 0 && fd < 4096 && fd != dirfd(d)) used[fd] = 1;
        }
        closedir(d);
        while (low < 4096 && used[low]) low++;
    }
    struct rlimit old, lim;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
    lim = old;
    lim.rlim_cur = (rlim_t)low + 2; /* the root and a class folder, not its sub-folder */
    dsrt_datastore *ds = NULL;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    int rc = dsrt_datastore_open(&ds, root, NULL);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK_EQ(rc, -EMFILE);
    CHECK(ds == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "Too many open files");
    CHECK_CONTAINS(dsrt_last_error(), "deep");
    dsrt_datastore_close(ds);
}

static void test_open_errors(void) {
    dsrt_datastore *ds = (dsrt_datastore *)1;
    CHECK_EQ(dsrt_datastore_open(&ds, "/nonexistent/dsrt/data", NULL), -ENOENT);
    CHECK(ds == NULL);
    CHECK_CONTAINS(dsrt_last_error(), "/nonexistent/dsrt/data");

    make_root("empty");
    CHECK_EQ(dsrt_datastore_open(&ds, root, NULL), DSRT_EEMPTY);
    CHECK_CONTAINS(dsrt_last_error(), root);

    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.extensions = ",,";
    touch("a/1.jpg");
    CHECK_EQ(dsrt_datastore_open(&ds, root, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "extensions");
    o = dsrt_datastore_defaults();
    o.label_source = (dsrt_label_source)7;
    CHECK_EQ(dsrt_datastore_open(&ds, root, &o), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "label_source");
    CHECK_STR_EQ(dsrt_strerror(DSRT_EOPTION), "invalid option");
    CHECK_STR_EQ(dsrt_strerror(-ENOENT), strerror(ENOENT));
}

// ----------------------------------------------------------------------------
// Order

/* A datastore of 3 classes with 10, 7 and 1 samples (18 in all). */
static dsrt_datastore *make_classes(void) {
    make_root("split");
    static const int sizes[3] = {10, 7, 1};
    char rel_path[64];
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < sizes[c]; k++) {
            snprintf(rel_path, sizeof rel_path, "class%d/%02d.jpg", c, k);
            touch(rel_path);
        }
    return open_ok(root, NULL);
}

static int is_sorted_subsequence(const dsrt_datastore *v) {
    for (size_t i = 1; i < dsrt_datastore_count(v); i++)
        if (dsrt_datastore_id(v, i - 1) >= dsrt_datastore_id(v, i)) return 0;
    return 1;
}

static void check_split(const dsrt_datastore *ds, const dsrt_split_options *so,
                        const size_t *want_first) {
    dsrt_datastore *a, *b;
    CHECK_OK(dsrt_datastore_split_each_label(ds, so, &a, &b));
    size_t n = dsrt_datastore_count(ds);
    CHECK_EQ(dsrt_datastore_count(a) + dsrt_datastore_count(b), n);
    uint8_t *seen = calloc(n, 1);
    for (size_t i = 0; i < dsrt_datastore_count(a); i++) seen[dsrt_datastore_id(a, i)]++;
    for (size_t i = 0; i < dsrt_datastore_count(b); i++) seen[dsrt_datastore_id(b, i)]++;
    for (size_t i = 0; i < n; i++) CHECK_EQ(seen[i], 1); /* disjoint and complete */
    size_t counts[3];
    dsrt_datastore_class_counts(a, counts);
    for (int c = 0; c < 3; c++) CHECK_EQ(counts[c], want_first[c]);
    CHECK(is_sorted_subsequence(a));
    CHECK(is_sorted_subsequence(b));
    /* Labels are those of the samples. */
    for (size_t i = 0; i < dsrt_datastore_count(a); i++)
        CHECK_EQ(dsrt_datastore_label(a, i), dsrt_datastore_label(ds, dsrt_datastore_id(a, i)));
    free(seen);
    dsrt_datastore_close(a);
    dsrt_datastore_close(b);
}

static void test_split_each_label(void) {
    dsrt_datastore *ds = make_classes();
    CHECK_EQ(dsrt_datastore_count(ds), 18);
    dsrt_split_options so = {.fraction = 0.7};
    check_split(ds, &so, (size_t[]){7, 5, 1}); /* round(7.0), round(4.9), round(0.7) */
    so.randomized = 1;
    so.seed = 42;
    check_split(ds, &so, (size_t[]){7, 5, 1});
    so = (dsrt_split_options){.count = 3};
    check_split(ds, &so, (size_t[]){3, 3, 1});

    /* Not randomized: the first ones of each class. */
    dsrt_datastore *a, *b, *a2;
    so = (dsrt_split_options){.count = 2};
    CHECK_OK(dsrt_datastore_split_each_label(ds, &so, &a, NULL));
    CHECK_EQ(dsrt_datastore_id(a, 0), 0);
    CHECK_EQ(dsrt_datastore_id(a, 1), 1);
    CHECK_EQ(dsrt_datastore_id(a, 2), 10);
    CHECK_EQ(dsrt_datastore_id(a, 3), 11);
    CHECK_EQ(dsrt_datastore_id(a, 4), 17);
    dsrt_datastore_close(a);

    /* Randomized: the same seed gives the same split, another seed another. */
    so = (dsrt_split_options){.fraction = 0.5, .randomized = 1, .seed = 7};
    CHECK_OK(dsrt_datastore_split_each_label(ds, &so, &a, &b));
    CHECK_OK(dsrt_datastore_split_each_label(ds, &so, &a2, NULL));
    CHECK_EQ(dsrt_datastore_count(a), dsrt_datastore_count(a2));
    int same = 1;
    for (size_t i = 0; i < dsrt_datastore_count(a); i++)
        same &= dsrt_datastore_id(a, i) == dsrt_datastore_id(a2, i);
    CHECK(same);
    dsrt_datastore_close(a2);
    int differs = 0;
    for (uint64_t seed = 8; seed < 16 && !differs; seed++) {
        so.seed = seed;
        CHECK_OK(dsrt_datastore_split_each_label(ds, &so, &a2, NULL));
        for (size_t i = 0; i < dsrt_datastore_count(a); i++)
            differs |= dsrt_datastore_id(a, i) != dsrt_datastore_id(a2, i);
        dsrt_datastore_close(a2);
    }
    CHECK(differs);

    /* Views of views keep the identities of the original samples. */
    dsrt_datastore *p;
    CHECK_OK(dsrt_datastore_partition(b, 2, 1, &p));
    for (size_t i = 0; i < dsrt_datastore_count(p); i++) {
        uint32_t id = dsrt_datastore_id(p, i);
        CHECK_STR_EQ(dsrt_datastore_path(p, i), dsrt_datastore_path(ds, id));
    }
    dsrt_datastore_close(p);
    dsrt_datastore_close(a);
    /* b outlives ds: the index is shared and freed with the last view. */
    dsrt_datastore_close(ds);
    CHECK(dsrt_datastore_path(b, 0) != NULL);
    dsrt_datastore_close(b);

    ds = make_classes();
    so = (dsrt_split_options){.fraction = 1.5};
    CHECK_EQ(dsrt_datastore_split_each_label(ds, &so, &a, &b), DSRT_EOPTION);
    so = (dsrt_split_options){0};
    CHECK_EQ(dsrt_datastore_split_each_label(ds, &so, &a, &b), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "fraction");
    dsrt_datastore_close(ds);
}

static void test_shuffle_partition(void) {
    dsrt_datastore *ds = make_classes();
    size_t n = dsrt_datastore_count(ds);
    dsrt_datastore *s1, *s2, *s3;
    CHECK_OK(dsrt_datastore_shuffle(ds, 1, &s1));
    CHECK_OK(dsrt_datastore_shuffle(ds, 1, &s2));
    CHECK_OK(dsrt_datastore_shuffle(ds, 2, &s3));
    uint8_t seen[18] = {0};
    int same12 = 1, same13 = 1;
    for (size_t i = 0; i < n; i++) {
        seen[dsrt_datastore_id(s1, i)]++;
        same12 &= dsrt_datastore_id(s1, i) == dsrt_datastore_id(s2, i);
        same13 &= dsrt_datastore_id(s1, i) == dsrt_datastore_id(s3, i);
        CHECK_EQ(dsrt_datastore_label(s1, i), dsrt_datastore_label(ds, dsrt_datastore_id(s1, i)));
    }
    for (size_t i = 0; i < n; i++) CHECK_EQ(seen[i], 1);
    CHECK(same12);
    CHECK(!same13);
    dsrt_datastore_close(s2);
    dsrt_datastore_close(s3);

    /* Partitions cover every sample exactly once, sizes within one. */
    for (size_t parts = 1; parts <= 20; parts++) {
        uint8_t cover[18] = {0};
        size_t lo = SIZE_MAX, hi = 0;
        for (size_t i = 0; i < parts; i++) {
            dsrt_datastore *p;
            CHECK_OK(dsrt_datastore_partition(s1, parts, i, &p));
            size_t m = dsrt_datastore_count(p);
            lo = m < lo ? m : lo;
            hi = m > hi ? m : hi;
            for (size_t k = 0; k < m; k++) cover[dsrt_datastore_id(p, k)]++;
            dsrt_datastore_close(p);
        }
        for (size_t i = 0; i < n; i++) CHECK_EQ(cover[i], 1);
        CHECK_LE(hi - lo, 1);
    }
    dsrt_datastore *p;
    CHECK_EQ(dsrt_datastore_partition(ds, 3, 3, &p), DSRT_EOPTION);
    CHECK_EQ(dsrt_datastore_partition(ds, 0, 0, &p), DSRT_EOPTION);

    /* Subset: positions of the view it is taken from. */
    uint32_t idx[3] = {5, 0, 5};
    CHECK_OK(dsrt_datastore_subset(s1, idx, 3, &p));
    CHECK_EQ(dsrt_datastore_id(p, 0), dsrt_datastore_id(s1, 5));
    CHECK_EQ(dsrt_datastore_id(p, 1), dsrt_datastore_id(s1, 0));
    CHECK_EQ(dsrt_datastore_id(p, 2), dsrt_datastore_id(s1, 5));
    dsrt_datastore_close(p);
    idx[1] = 18;
    CHECK_EQ(dsrt_datastore_subset(s1, idx, 3, &p), DSRT_EOPTION);
    CHECK_CONTAINS(dsrt_last_error(), "18");
    dsrt_datastore_close(s1);
    dsrt_datastore_close(ds);
}

static void test_shuffle_indices(void) {
    enum { N = 1000 };
    static uint32_t a[N], b[N], c[N];
    for (uint32_t i = 0; i < N; i++) a[i] = b[i] = c[i] = i;
    dsrt_shuffle_indices(a, N, 99, 3);
    dsrt_shuffle_indices(b, N, 99, 3);
    dsrt_shuffle_indices(c, N, 99, 4);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    static uint8_t seen[N];
    size_t fixed = 0;
    for (uint32_t i = 0; i < N; i++) {
        seen[a[i]]++;
        fixed += a[i] == i;
    }
    for (uint32_t i = 0; i < N; i++) CHECK_EQ(seen[i], 1);
    CHECK_LT(fixed, 10); /* about one fixed point is expected of a random permutation */
    /* Every position receives every value about equally often over epochs. */
    enum { M = 8, EPOCHS = 8000 };
    static uint32_t hits[M][M];
    for (uint64_t e = 0; e < EPOCHS; e++) {
        uint32_t v[M];
        for (uint32_t i = 0; i < M; i++) v[i] = i;
        dsrt_shuffle_indices(v, M, 5, e);
        for (uint32_t i = 0; i < M; i++) hits[i][v[i]]++;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) CHECK_NEAR(hits[i][j], EPOCHS / M, 150);
}

int main(void) {
    RUN(test_folder_order);
    RUN(test_folder_links);
    RUN(test_open_errors);
    RUN(test_empty_classes);
    RUN(test_scan_open_files_limit);
    RUN(test_split_each_label);
    RUN(test_shuffle_partition);
    RUN(test_shuffle_indices);
    return TEST_RESULT();
}
