/*
 * Protocol Buffers' wire format, as much of it as ONNX files need: a reader
 * that walks the fields of one message over bytes it never copies (and
 * checks every length and count against what is there, since the bytes come
 * from strangers), and a writer that appends fields to a growing buffer,
 * nested messages included. Field numbers and their meaning are the
 * caller's: this file knows tags, varints and lengths only.
 *
 * Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited (bytes, strings,
 * messages, packed repeated numbers), 5 fixed 32-bit. Groups (3, 4) are a
 * proto2 relic that no ONNX file uses; they are refused.
 */
#ifndef DSRT_NN_PROTOBUF_H
#define DSRT_NN_PROTOBUF_H

#include <stddef.h>
#include <stdint.h>

enum {
    DSRT_PB_VARINT = 0,
    DSRT_PB_FIXED64 = 1,
    DSRT_PB_BYTES = 2,
    DSRT_PB_FIXED32 = 5,
};

/* A slice of the input: bytes, a string (not NUL-terminated) or a message. */
typedef struct {
    const uint8_t *p;
    size_t n;
} dsrt_pb_bytes;

/* A reader over one message: at walks from its start to end. base is the
 * start of the whole input, for the byte offsets of messages. */
typedef struct {
    const uint8_t *at, *end, *base;
} dsrt_pb;

/* One field as read: its number, wire type, and value (u for the numeric
 * types, b for length-delimited ones). */
typedef struct {
    uint32_t number;
    int wire;
    uint64_t u;
    dsrt_pb_bytes b;
} dsrt_pb_field;

/* A reader over msg, a slice of the input that starts at base. */
static inline dsrt_pb dsrt__pb_open(dsrt_pb_bytes msg, const uint8_t *base) {
    dsrt_pb r = {msg.p, msg.p + msg.n, base};
    return r;
}

/*
 * Reads the next field into *f. Returns 1 (a field), 0 (the end of the
 * message), or DSRT_ECORRUPT with the reason and the byte offset in the
 * message (a varint longer than 10 bytes, a length past the end, field
 * number 0, a group or an unknown wire type).
 */
int dsrt__pb_next(dsrt_pb *r, dsrt_pb_field *f);

/* A varint from p (at most end - p bytes) into *v; the bytes it took, or 0
 * when it is malformed or runs past end. */
size_t dsrt__pb_varint(const uint8_t *p, const uint8_t *end, uint64_t *v);

/* The number of varints in a packed run; -1 when it is malformed. */
long long dsrt__pb_count_varints(dsrt_pb_bytes b);

// ----------------------------------------------------------------------------
// Writing

/* A growing output buffer; failed sticks once an allocation fails. */
typedef struct {
    uint8_t *buf;
    size_t len, cap;
    int failed;
} dsrt_pb_writer;

void dsrt__pb_put_varint(dsrt_pb_writer *w, uint32_t number, uint64_t v);
void dsrt__pb_put_fixed32(dsrt_pb_writer *w, uint32_t number, uint32_t v);
void dsrt__pb_put_float(dsrt_pb_writer *w, uint32_t number, float v);
void dsrt__pb_put_bytes(dsrt_pb_writer *w, uint32_t number, const void *p, size_t n);
void dsrt__pb_put_string(dsrt_pb_writer *w, uint32_t number, const char *s);
/* Repeated int64 (ONNX's ints, dims), one field each value as proto2
 * writes them. */
void dsrt__pb_put_int64s(dsrt_pb_writer *w, uint32_t number, const int64_t *v, size_t n);
/* Bytes already encoded as fields (another writer's). */
void dsrt__pb_append(dsrt_pb_writer *w, const void *p, size_t n);

/* A nested message: begin returns a mark to hand to end once its fields
 * are written; end writes its length in front of them. */
size_t dsrt__pb_begin(dsrt_pb_writer *w, uint32_t number);
void dsrt__pb_end(dsrt_pb_writer *w, size_t mark);

#endif
