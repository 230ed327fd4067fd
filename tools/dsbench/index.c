/*
 * dsbench DATA --index: scans the dataset and reports its classes, their
 * counts and the scan's time.
 */
#include "dsbench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// dsbench DATA --index

void print_warnings(const dsrt_datastore *ds) {
    size_t n = dsrt_datastore_warning_count(ds);
    if (n == 0) return;
    fprintf(stderr, "dsbench: %zu warning%s while indexing:\n%s", n, n > 1 ? "s" : "",
            dsrt_datastore_warnings(ds));
    if (n > 20) fprintf(stderr, "  ... and %zu more\n", n - 20);
}

/* Opens DATA: one datastore, or the mix of several (--mix). */
int open_data(const options *o, dsrt_datastore **ds) {
    return dsrt_datastore_open_mix(ds, o->paths, o->npaths, o->mix, &o->ds, &o->mo);
}

int run_index(const options *o) {
    dsrt_datastore *ds;
    double t0 = now_s();
    int rc = open_data(o, &ds);
    double scan_s = now_s() - t0;
    if (rc != 0) tool_die("%s", dsrt_last_error());
    print_warnings(ds);

    size_t nc = dsrt_datastore_num_classes(ds), n = dsrt_datastore_count(ds);
    size_t *counts = calloc(nc ? nc : 1, sizeof *counts);
    if (!counts) tool_die("out of memory");
    dsrt_datastore_class_counts(ds, counts);
    if (o->json) {
        printf("{\"source\":\"%s\",\"classes\":[", dsrt_source_name(dsrt_datastore_source(ds)));
        for (size_t c = 0; c < nc; c++) {
            if (c) putchar(',');
            tool_json_string(stdout, dsrt_datastore_class_name(ds, c));
        }
        printf("],\"counts\":[");
        for (size_t c = 0; c < nc; c++) printf("%s%zu", c ? "," : "", counts[c]);
        char b[32];
        printf("],\"images\":%zu,\"scan_s\":%s,\"warnings\":%zu", n,
               tool_json_number(b, "%.6f", scan_s), dsrt_datastore_warning_count(ds));
        if (dsrt_datastore_shard_count(ds))
            printf(",\"shards\":%zu,\"order\":\"%s\",\"shuffle_buffer\":%zu",
                   dsrt_datastore_shard_count(ds),
                   dsrt_shard_order_name(dsrt_datastore_shard_order(ds)),
                   dsrt_datastore_shuffle_buffer(ds));
        printf("}\n");
    } else {
        printf("%s: %zu images in %zu classes (%s source), indexed in %.3f s\n", o->shown, n, nc,
               dsrt_source_name(dsrt_datastore_source(ds)), scan_s);
        if (dsrt_datastore_shard_count(ds))
            printf("%zu shards, read in the %s order (shuffle buffer %zu)\n",
                   dsrt_datastore_shard_count(ds),
                   dsrt_shard_order_name(dsrt_datastore_shard_order(ds)),
                   dsrt_datastore_shuffle_buffer(ds));
        printf("%6s  %10s  %s\n", "class", "images", "name");
        for (size_t c = 0; c < nc; c++)
            printf("%6zu  %10zu  %s\n", c, counts[c], dsrt_datastore_class_name(ds, c));
    }
    free(counts);
    dsrt_datastore_close(ds);
    return 0;
}
