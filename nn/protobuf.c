/*
 * Protocol Buffers' wire format: the reader and writer of nn/protobuf.h.
 * The reader trusts nothing it reads: a length is checked against the bytes
 * left before anything is sliced, a varint stops at ten bytes, and every
 * refusal names the byte offset where the message went wrong.
 */
#include "nn/protobuf.h"

#include "core/internal.h"

#include <string.h>

// ----------------------------------------------------------------------------
// Reading

size_t dsrt__pb_varint(const uint8_t *p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (size_t i = 0; i < 10 && p + i < end; i++) {
        uint8_t b = p[i];
        if (i == 9 && b > 1) return 0; /* more than 64 bits */
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

int dsrt__pb_next(dsrt_pb *r, dsrt_pb_field *f) {
    if (r->at >= r->end) return 0;
    size_t off = (size_t)(r->at - r->base);
    uint64_t tag;
    size_t k = dsrt__pb_varint(r->at, r->end, &tag);
    if (!k)
        return dsrt__fail(DSRT_ECORRUPT, "byte %zu: a field's tag is cut off or malformed", off);
    uint64_t number = tag >> 3;
    int wire = (int)(tag & 7);
    if (number == 0 || number > 0x1fffffff)
        return dsrt__fail(DSRT_ECORRUPT, "byte %zu: field number %llu is not valid", off,
                          (unsigned long long)number);
    const uint8_t *p = r->at + k;
    size_t left = (size_t)(r->end - p);
    f->number = (uint32_t)number;
    f->wire = wire;
    f->u = 0;
    f->b = (dsrt_pb_bytes){NULL, 0};
    switch (wire) {
    case DSRT_PB_VARINT:
        if (!(k = dsrt__pb_varint(p, r->end, &f->u)))
            return dsrt__fail(DSRT_ECORRUPT,
                              "byte %zu: field %llu: a varint is cut off or longer "
                              "than 10 bytes",
                              off, (unsigned long long)number);
        r->at = p + k;
        return 1;
    case DSRT_PB_FIXED64:
    case DSRT_PB_FIXED32: {
        size_t n = wire == DSRT_PB_FIXED64 ? 8 : 4;
        if (left < n)
            return dsrt__fail(DSRT_ECORRUPT, "byte %zu: field %llu: %zu bytes of %zu are there",
                              off, (unsigned long long)number, left, n);
        for (size_t i = 0; i < n; i++) f->u |= (uint64_t)p[i] << (8 * i);
        r->at = p + n;
        return 1;
    }
    case DSRT_PB_BYTES: {
        uint64_t len;
        if (!(k = dsrt__pb_varint(p, r->end, &len)))
            return dsrt__fail(DSRT_ECORRUPT, "byte %zu: field %llu: its length is cut off", off,
                              (unsigned long long)number);
        p += k;
        left -= k;
        if (len > left)
            return dsrt__fail(DSRT_ECORRUPT,
                              "byte %zu: field %llu says it has %llu bytes, %zu are left in its "
                              "message",
                              off, (unsigned long long)number, (unsigned long long)len, left);
        f->b = (dsrt_pb_bytes){p, (size_t)len};
        r->at = p + len;
        return 1;
    }
    default:
        return dsrt__fail(DSRT_ECORRUPT, "byte %zu: field %llu has wire type %d%s", off,
                          (unsigned long long)number, wire,
                          wire == 3 || wire == 4 ? " (a group, which ONNX never uses)" : "");
    }
}

long long dsrt__pb_count_varints(dsrt_pb_bytes b) {
    long long n = 0;
    const uint8_t *p = b.p, *end = b.p + b.n;
    while (p < end) {
        uint64_t v;
        size_t k = dsrt__pb_varint(p, end, &v);
        if (!k) return -1;
        p += k;
        n++;
    }
    return n;
}

// ----------------------------------------------------------------------------
// Writing

static uint8_t *room(dsrt_pb_writer *w, size_t n) {
    if (w->failed) return NULL;
    if (dsrt__grow((void **)&w->buf, &w->cap, w->len + n, 1)) {
        w->failed = 1;
        return NULL;
    }
    return w->buf + w->len;
}

static size_t varint_to(uint8_t *p, uint64_t v) {
    size_t k = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[k++] = b | (v ? 0x80 : 0);
    } while (v);
    return k;
}

static void put_tag(dsrt_pb_writer *w, uint32_t number, int wire) {
    uint8_t *p = room(w, 10);
    if (p) w->len += varint_to(p, (uint64_t)number << 3 | (uint64_t)wire);
}

static void put_raw_varint(dsrt_pb_writer *w, uint64_t v) {
    uint8_t *p = room(w, 10);
    if (p) w->len += varint_to(p, v);
}

static void put_raw(dsrt_pb_writer *w, const void *src, size_t n) {
    uint8_t *p = room(w, n);
    if (p && n) {
        memcpy(p, src, n);
        w->len += n;
    }
}

void dsrt__pb_put_varint(dsrt_pb_writer *w, uint32_t number, uint64_t v) {
    put_tag(w, number, DSRT_PB_VARINT);
    put_raw_varint(w, v);
}

void dsrt__pb_put_fixed32(dsrt_pb_writer *w, uint32_t number, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put_tag(w, number, DSRT_PB_FIXED32);
    put_raw(w, b, 4);
}

void dsrt__pb_put_float(dsrt_pb_writer *w, uint32_t number, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    dsrt__pb_put_fixed32(w, number, u);
}

void dsrt__pb_put_bytes(dsrt_pb_writer *w, uint32_t number, const void *p, size_t n) {
    put_tag(w, number, DSRT_PB_BYTES);
    put_raw_varint(w, n);
    put_raw(w, p, n);
}

void dsrt__pb_put_string(dsrt_pb_writer *w, uint32_t number, const char *s) {
    dsrt__pb_put_bytes(w, number, s, strlen(s));
}

void dsrt__pb_put_int64s(dsrt_pb_writer *w, uint32_t number, const int64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) dsrt__pb_put_varint(w, number, (uint64_t)v[i]);
}

void dsrt__pb_append(dsrt_pb_writer *w, const void *p, size_t n) {
    put_raw(w, p, n);
}

/* A nested message's length is known only at its end: begin leaves room
 * for the longest varint, end writes the length there and moves the
 * message's bytes back over the room it did not need. */
size_t dsrt__pb_begin(dsrt_pb_writer *w, uint32_t number) {
    put_tag(w, number, DSRT_PB_BYTES);
    if (room(w, 10)) w->len += 10;
    return w->len;
}

void dsrt__pb_end(dsrt_pb_writer *w, size_t mark) {
    if (w->failed) return;
    size_t n = w->len - mark;
    uint8_t len[10];
    size_t k = varint_to(len, n);
    memcpy(w->buf + mark - 10, len, k);
    memmove(w->buf + mark - 10 + k, w->buf + mark, n);
    w->len -= 10 - k;
}
