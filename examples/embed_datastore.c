/*
 * Embedding dsrt's datastore in a C program: open a dataset (a folder of
 * class sub-folders, a manifest, IDX or CIFAR files), split it per label,
 * and decode a few samples as 3-channel images no smaller than 64x64.
 *
 *   embed_datastore DATA [N]
 */
#include <dsrt.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA [N]\n", argv[0]);
        return 2;
    }
    size_t show = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 5;
    dsrt_datastore *ds = NULL, *train = NULL, *val = NULL;
    dsrt_decoder *dec = NULL;
    int status = 1;

    if (dsrt_datastore_open(&ds, argv[1], NULL) != 0) goto fail;
    printf("%s: %zu samples, %zu classes (dsrt %s)\n", argv[1], dsrt_datastore_count(ds),
           dsrt_datastore_num_classes(ds), dsrt_version_string());

    /* 80% of each class for training, chosen at random with seed 1. */
    dsrt_split_options split = {.fraction = 0.8, .randomized = 1, .seed = 1};
    if (dsrt_datastore_split_each_label(ds, &split, &train, &val) != 0) goto fail;
    printf("train %zu, validation %zu\n", dsrt_datastore_count(train), dsrt_datastore_count(val));

    if (dsrt_decoder_create(&dec, NULL) != 0) goto fail;
    dsrt_decode_request req = {.channels = 3, .min_width = 64, .min_height = 64};
    for (size_t i = 0; i < show && i < dsrt_datastore_count(train); i++) {
        dsrt_image img;
        int label = dsrt_datastore_label(train, i);
        if (dsrt_datastore_read_image(train, i, dec, &req, &img) != 0) {
            /* A bad file is one sample's problem: report it and go on. */
            fprintf(stderr, "skipped: %s\n", dsrt_last_error());
            continue;
        }
        printf("sample %zu: %dx%dx%d, class %d (%s)\n", i, img.width, img.height, img.channels,
               label, dsrt_datastore_class_name(train, (size_t)label));
    }
    status = 0;
fail:
    if (status) fprintf(stderr, "error: %s\n", dsrt_last_error());
    dsrt_decoder_destroy(dec);
    dsrt_datastore_close(val);
    dsrt_datastore_close(train);
    dsrt_datastore_close(ds);
    return status;
}
