/*
 * Embedding dsrt's pipeline in a C program: open a folder of class
 * sub-folders, make batches of 32 x 32 augmented samples in background
 * threads (torchvision's Resize(32), RandomHorizontalFlip, RandomCrop(32,
 * padding=4), ToTensor), and take one epoch of them, printing each batch's
 * size and a checksum of its pixels and labels. The checksum of a run is the
 * same whatever the number of threads: every random choice is keyed by
 * (seed, epoch, sample).
 *
 *   pipeline FOLDER [BATCH] [THREADS]
 */
#include <dsrt.h>

#include <stdio.h>
#include <stdlib.h>

/* FNV-1a, 64 bits. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FOLDER [BATCH] [THREADS]\n", argv[0]);
        return 2;
    }
    dsrt_datastore *ds = NULL;
    dsrt_pipeline *p = NULL;
    int status = 1;

    if (dsrt_datastore_open(&ds, argv[1], NULL) != 0) goto fail;

    dsrt_augment_options aug;
    dsrt_augment_preset_32(&aug);
    dsrt_pipeline_options po = dsrt_pipeline_defaults();
    po.batch = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 32;
    po.threads = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 0; /* 0: one per core */
    po.epochs = 1;
    po.seed = 42;
    if (dsrt_pipeline_open(&p, ds, &aug, &po) != 0) goto fail;

    printf("%s: %zu images, %zu classes, %llu batches of up to %zu (dsrt %s)\n", argv[1],
           dsrt_datastore_count(ds), dsrt_datastore_num_classes(ds),
           (unsigned long long)dsrt_pipeline_batches_per_epoch(p), po.batch, dsrt_version_string());
    uint64_t total = 0xcbf29ce484222325ULL;
    size_t images = 0;
    dsrt_batch *b;
    int rc;
    while ((rc = dsrt_pipeline_next(p, &b)) == 0) {
        /* b->data: (count, 3, 32, 32) floats in [0, 1]; b->labels: (count) class indices. */
        uint64_t h = fnv1a(0xcbf29ce484222325ULL, b->data, b->count * b->sample_bytes);
        h = fnv1a(h, b->labels, b->count * sizeof *b->labels);
        total = fnv1a(total, &h, sizeof h);
        images += b->count;
        printf("batch %llu: %zu images, shape (%d, %d, %d, %d), first label %d, checksum %016llx\n",
               (unsigned long long)b->index, b->count, b->shape[0], b->shape[1], b->shape[2],
               b->shape[3], b->labels[0], (unsigned long long)h);
        dsrt_batch_release(p, b);
    }
    if (rc != DSRT_EEOF) goto fail;

    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    printf("%zu images in %llu batches, %llu bad images skipped, %u threads, io %s, "
           "checksum %016llx\n",
           images, (unsigned long long)s.batches, (unsigned long long)s.bad_samples, s.threads,
           dsrt_io_name(s.io), (unsigned long long)total);
    for (unsigned i = 0; i < s.bad_message_count; i++) printf("  skipped: %s\n", s.bad_messages[i]);
    status = 0;
fail:
    if (status) fprintf(stderr, "error: %s\n", dsrt_last_error());
    dsrt_pipeline_close(p);
    dsrt_datastore_close(ds);
    return status;
}
