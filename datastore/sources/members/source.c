/*
 * The reader (reader.c) and the stream as what a source of members puts in
 * its table entry: a reader of sample bytes for one thread, with the stream
 * as its feed, and the stream as the feed of a set read in the shard order.
 */
#include "datastore/sources/members/members.h"

#include <stdlib.h>

static int reader_submit(void *r, uint32_t pos, uint64_t epoch, void *buf, size_t cap,
                         uint64_t tag) {
    return dsrt__shard_reader_submit(r, pos, epoch, buf, cap, tag);
}
static int reader_collect(void *r, dsrt_read_result *res, int wait) {
    return dsrt__shard_reader_collect(r, res, wait);
}
static void reader_cancel(void *r) {
    dsrt__shard_reader_cancel(r);
}
static size_t reader_need(const void *r, uint32_t pos) {
    return dsrt__shard_reader_need(r, pos);
}
static dsrt_io reader_io(const void *r) {
    return dsrt__shard_reader_io(r);
}
static const char *reader_fallback(const void *r) {
    return dsrt__shard_reader_fallback_reason(r);
}
static uint64_t reader_direct_refused(const void *r) {
    return dsrt__shard_reader_direct_refused(r);
}
static void reader_remote_stats(const void *r, dsrt_remote_stats *st) {
    dsrt__shard_reader_remote_stats(r, st);
}
static void reader_destroy(void *r) {
    dsrt__shard_reader_destroy(r);
}

static const dsrt_sample_reader_ops READER_OPS = {
    .submit = reader_submit,
    .collect = reader_collect,
    .cancel = reader_cancel,
    .need = reader_need,
    .io = reader_io,
    .fallback = reader_fallback,
    .direct_refused = reader_direct_refused,
    .remote_stats = reader_remote_stats,
    .destroy = reader_destroy,
};

int dsrt__members_reader(void **impl, const dsrt_sample_reader_ops **ops, const dsrt_datastore *ds,
                         const dsrt_reader_options *o, dsrt_feed *feed) {
    dsrt_shard_reader *r;
    int rc = dsrt__shard_reader_create(&r, ds, o, feed ? feed->impl : NULL);
    if (rc != 0) return rc;
    *impl = r;
    *ops = &READER_OPS;
    return 0;
}

static void feed_run(void *f) {
    dsrt__shard_stream_run(f);
}
static void feed_stop(void *f) {
    dsrt__shard_stream_stop(f);
}
static void feed_seek(void *f, uint64_t epoch, uint64_t place, unsigned from_parts) {
    dsrt__shard_stream_seek(f, epoch, place, from_parts);
}
static int feed_order(void *f, uint64_t key, unsigned from_parts, uint32_t *order) {
    return dsrt__shard_stream_order(f, key, from_parts, order);
}
static void feed_stats(void *f, dsrt_feed_stats *st) {
    dsrt_shard_stream_stats ss;
    dsrt__shard_stream_stats(f, &ss);
    st->bytes = ss.bytes;
    st->served = ss.served;
    st->ranged = ss.ranged;
    dsrt__shard_stream_remote_stats(f, &st->remote);
}
static void feed_destroy(void *f) {
    dsrt__shard_stream_destroy(f);
}

static const dsrt_feed_ops FEED_OPS = {
    .run = feed_run,
    .stop = feed_stop,
    .seek = feed_seek,
    .order = feed_order,
    .stats = feed_stats,
    .destroy = feed_destroy,
};

int dsrt__members_feed(dsrt_feed **out, const dsrt_datastore *ds, const dsrt_feed_options *o) {
    *out = NULL;
    if (dsrt__shardset_of(ds)->order != DSRT_SHARD_ORDER_SHARD) return 0;
    dsrt_shard_plan_options po = {.shuffle = o->shuffle,
                                  .seed = o->seed,
                                  .batch = o->batch,
                                  .drop_last = o->drop_last,
                                  .parts = o->parts,
                                  .part = o->part};
    /* The stream keeps the samples of every epoch a worker may still ask
     * for: as many as the pipeline's epoch orders span. */
    dsrt_shard_stream_options so = {
        .reader = o->reader, .epochs = o->epochs, .open_epochs = o->open_epochs};
    dsrt_feed *f = dsrt__calloc(1, sizeof *f);
    if (!f) return -ENOMEM;
    dsrt_shard_stream *s;
    int rc = dsrt__shard_stream_create(&s, ds, &po, &so);
    if (rc != 0) {
        free(f);
        return rc;
    }
    f->ops = &FEED_OPS;
    f->impl = s;
    *out = f;
    return 0;
}
