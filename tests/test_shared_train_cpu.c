/*
 * A CPU training run maps no GPU and no MPI library. Linked against the
 * shared libraries as dstrain is, this program trains a small net for two
 * epochs on the CPU through the public API (dsrt_train, execution 'cpu'),
 * then reads its own /proc/self/maps: neither the CUDA runtime, cuBLAS,
 * cuDNN, NCCL nor Open MPI, nor any of dsrt's modules, may be there, while
 * oneDNN and libdsrt_train are (so the scan sees what the run loaded).
 *
 * Then the same net is asked for a GPU ('gpu' execution). On a machine
 * without one that fails at once with a message naming GPU 0, having loaded
 * at most the CUDA runtime to count the devices, never the GPU backend's
 * libraries; with a GPU the run is left to the GPU tests.
 */
#include <dsrt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "task.h"

#define SIDE 12
#define N    96

static const char NET[] = "input size=12x12x1\n"
                          "conv name=conv1 filters=4 size=3 pad=1\n"
                          "relu name=relu1\n"
                          "fc name=fc1 outputs=classes\n"
                          "softmax name=output\n";

/* Libraries a CPU run must not map: GPU, MPI, and dsrt's modules. */
static const char *const FORBIDDEN[] = {
    "libcudart",   "libcublas",   "libcudnn",  "libnccl",  "libcuda.so", "libmpi",
    "libopen-pal", "libopen-rte", "dsrt_cuda", "dsrt_mpi", "dsrt_nccl",
};

static void put_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    REQUIRE(fwrite(b, 1, 4, f) == 4);
}

/* Raw IDX images and labels: N images of SIDE x SIDE, 4 classes. */
static void write_idx(const char *images, const char *labels) {
    FILE *f = fopen(images, "wb");
    REQUIRE(f);
    put_be32(f, 0x803);
    put_be32(f, N);
    put_be32(f, SIDE);
    put_be32(f, SIDE);
    for (int i = 0; i < N; i++)
        for (int p = 0; p < SIDE * SIDE; p++) fputc((i % 4) * 60 + (p * 7 + i) % 30, f);
    REQUIRE(fclose(f) == 0);
    f = fopen(labels, "wb");
    REQUIRE(f);
    put_be32(f, 0x801);
    put_be32(f, N);
    for (int i = 0; i < N; i++) fputc(i % 4, f);
    REQUIRE(fclose(f) == 0);
}

/* Lines of /proc/self/maps naming any of names: the first such line into
 * hit (empty when none). Returns how many lines were read. */
static int scan_maps(const char *const *names, size_t n, char *hit, size_t size) {
    FILE *f = fopen("/proc/self/maps", "r");
    REQUIRE(f);
    char line[4096];
    int lines = 0;
    hit[0] = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        for (size_t k = 0; k < n && !hit[0]; k++)
            if (strstr(line, names[k])) snprintf(hit, size, "%s", line);
    }
    fclose(f);
    return lines;
}

int main(void) {
    const char *tmp = getenv("DSRT_TEST_TMP");
    char dir[4096], images[4200], labels[4200], hit[4096];
    snprintf(dir, sizeof dir, "%s/shared_train_cpu", tmp ? tmp : "/tmp");
    mkdir(tmp ? tmp : "/tmp", 0755);
    mkdir(dir, 0755);
    snprintf(images, sizeof images, "%s/images-idx3-ubyte", dir);
    snprintf(labels, sizeof labels, "%s/labels-idx1-ubyte", dir);
    write_idx(images, labels);

    dsrt_datastore_options so = dsrt_datastore_defaults();
    so.source = DSRT_SOURCE_IDX;
    so.labels_path = labels;
    dsrt_datastore *ds = NULL;
    REQUIRE(dsrt_datastore_open(&ds, images, &so) == 0);
    char *desc = dsrt_describe_datastore_classes(NET, ds);
    REQUIRE(desc);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    dsrt_net *net = NULL;
    REQUIRE(dsrt_net_create(&net, desc, 0, 0, 0, 4, &no) == 0);

    dsrt_train_options o = dsrt_train_defaults();
    o.execution = DSRT_EXEC_CPU;
    o.max_epochs = 2;
    o.batch = 32;
    o.workers = 1;
    o.compute_threads = 1;
    o.pin = 0;
    dsrt_train_result r;
    int rc = dsrt_train(net, ds, &o, &r);
    if (rc) fprintf(stderr, "train: %s\n", dsrt_last_error());
    CHECK_EQ(rc, 0);
    CHECK_EQ((int)r.iterations, 2 * N / 32);

    /* The scan sees the libraries the run used ... */
    static const char *const used[] = {"libdnnl", "libdsrt_train"};
    for (size_t k = 0; k < 2; k++) {
        scan_maps(&used[k], 1, hit, sizeof hit);
        CHECK(hit[0] != 0);
        if (!hit[0]) fprintf(stderr, "%s is not mapped: the scan is blind\n", used[k]);
    }
    /* ... and none it must not have loaded. */
    int lines = scan_maps(FORBIDDEN, sizeof FORBIDDEN / sizeof FORBIDDEN[0], hit, sizeof hit);
    CHECK(lines > 10);
    if (hit[0]) fprintf(stderr, "a CPU run mapped: %s", hit);
    CHECK(hit[0] == 0);

    /* Asking for a GPU where there is none fails with the reason, and the
     * GPU backend's libraries stay unloaded. */
    if (dsrt_gpu_count() == 0) {
        o.execution = DSRT_EXEC_GPU;
        rc = dsrt_train(net, ds, &o, &r);
        CHECK(rc != 0);
        CHECK_CONTAINS(dsrt_last_error(), "GPU 0");
        fprintf(stderr, "gpu without a GPU: %s\n", dsrt_last_error());
        static const char *const backend[] = {"libcudnn", "libcublas", "dsrt_cuda.so"};
        scan_maps(backend, 3, hit, sizeof hit);
        if (hit[0]) fprintf(stderr, "a refused GPU run mapped: %s", hit);
        CHECK(hit[0] == 0);
    }

    free(desc);
    dsrt_net_destroy(net);
    dsrt_datastore_close(ds);
    return TEST_RESULT();
}
