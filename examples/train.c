/*
 * Training from a C program with libdsrt_train: the built-in `digits`
 * network (28x28 gray images) on a folder of class sub-folders, 90% of each
 * class for training and 10% for validation, for a few epochs, with the
 * batches made in the background while the network computes. Prints the
 * device it trained on, images/s and the validation accuracy.
 *
 * The execution environment is cpu, gpu or auto (a GPU when one is usable):
 * the GPU backend is a module that libdsrt_train loads only when a run asks
 * for it, so this program starts and trains on the CPU on machines without
 * the CUDA libraries.
 *
 *   train FOLDER [EPOCHS] [cpu|gpu|auto]
 */
#include <dsrt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FOLDER [EPOCHS] [cpu|gpu|auto]\n", argv[0]);
        return 2;
    }
    const char *where = argc > 3 ? argv[3] : "cpu";
    dsrt_execution exec = !strcmp(where, "gpu")    ? DSRT_EXEC_GPU
                          : !strcmp(where, "auto") ? DSRT_EXEC_AUTO
                                                   : DSRT_EXEC_CPU;
    dsrt_datastore *ds = NULL, *train = NULL, *val = NULL;
    dsrt_net *net = NULL;
    char *desc = NULL;
    int rc = 1;

    if (dsrt_datastore_open(&ds, argv[1], NULL) != 0) goto fail;
    dsrt_split_options split = {.fraction = 0.9, .randomized = 1, .seed = 1};
    if (dsrt_datastore_split_each_label(ds, &split, &train, &val) != 0) goto fail;
    /* The class names go into the description; "outputs=classes" becomes
     * their count. */
    if (!(desc = dsrt_describe_datastore_classes("digits", ds))) goto fail;
    dsrt_net_options no = dsrt_net_defaults();
    no.seed = 1;
    if (dsrt_net_create(&net, desc, 0, 0, 0, (int)dsrt_datastore_num_classes(ds), &no) != 0)
        goto fail;

    dsrt_train_options o = dsrt_train_defaults();
    o.execution = exec;
    o.max_epochs = argc > 2 ? atoi(argv[2]) : 2;
    o.batch = 32;
    o.validation = val;
    o.seed = 1;
    dsrt_train_result r;
    if (dsrt_train(net, train, &o, &r) != 0) goto fail;
    printf("trained %lld iterations on %s: %.0f images/s, validation accuracy %.3f\n",
           (long long)r.iterations, r.device < 0 ? "the CPU" : "a GPU", r.images_per_s,
           r.val_accuracy);
    rc = 0;

fail:
    if (rc) fprintf(stderr, "train: %s\n", dsrt_last_error());
    dsrt_net_destroy(net);
    free(desc);
    dsrt_datastore_close(val);
    dsrt_datastore_close(train);
    dsrt_datastore_close(ds);
    return rc;
}
