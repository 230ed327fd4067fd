/*
 * ONNX's ModelProto, read from the protobuf wire format into the records of
 * nn/onnx.h. Only the fields a dsrt network can come from are kept (the
 * graph's nodes, initializers, inputs and outputs, the opsets, the metadata);
 * the others are skipped by their wire type, as protobuf readers do.
 * Repeated fields are counted in a first walk and filled in a second, so
 * each record array is one allocation sized by what the file holds; every
 * count and length is bounded by the bytes that carry it. A field with the
 * wrong wire type, a tensor whose values do not add up to its shape, or a
 * name longer than ONNX_NAME_MAX is refused with where it is.
 */
#include "nn/onnx.h"

#include <stdio.h>
#include <string.h>

/* ModelProto */
#define MODEL_IR_VERSION       1
#define MODEL_PRODUCER         2
#define MODEL_PRODUCER_VERSION 3
#define MODEL_GRAPH            7
#define MODEL_OPSET_IMPORT     8
#define MODEL_METADATA         14
#define MODEL_FUNCTIONS        25
/* FunctionProto */
#define FUNC_NAME       1
#define FUNC_INPUT      4
#define FUNC_OUTPUT     5
#define FUNC_NODE       7
#define FUNC_DOMAIN     10
#define FUNC_ATTR_PROTO 11
#define FUNC_OVERLOAD   13
/* OperatorSetIdProto */
#define OPSET_DOMAIN  1
#define OPSET_VERSION 2
/* GraphProto */
#define GRAPH_NODE               1
#define GRAPH_NAME               2
#define GRAPH_INITIALIZER        5
#define GRAPH_INPUT              11
#define GRAPH_OUTPUT             12
#define GRAPH_SPARSE_INITIALIZER 15
/* NodeProto */
#define NODE_INPUT     1
#define NODE_OUTPUT    2
#define NODE_NAME      3
#define NODE_OP_TYPE   4
#define NODE_ATTRIBUTE 5
#define NODE_DOMAIN    7
#define NODE_OVERLOAD  8
/* AttributeProto */
#define ATTR_NAME    1
#define ATTR_F       2
#define ATTR_I       3
#define ATTR_S       4
#define ATTR_T       5
#define ATTR_G       6
#define ATTR_FLOATS  7
#define ATTR_INTS    8
#define ATTR_STRINGS 9
#define ATTR_TYPE    20
#define ATTR_REF     21
/* TensorProto */
#define TENSOR_DIMS          1
#define TENSOR_DATA_TYPE     2
#define TENSOR_SEGMENT       3
#define TENSOR_FLOAT_DATA    4
#define TENSOR_INT32_DATA    5
#define TENSOR_STRING_DATA   6
#define TENSOR_INT64_DATA    7
#define TENSOR_NAME          8
#define TENSOR_RAW_DATA      9
#define TENSOR_DOUBLE_DATA   10
#define TENSOR_UINT64_DATA   11
#define TENSOR_EXTERNAL_DATA 13
#define TENSOR_DATA_LOCATION 14
/* ValueInfoProto, TypeProto, TypeProto.Tensor, TensorShapeProto, Dimension */
#define VALUE_NAME    1
#define VALUE_TYPE    2
#define TYPE_TENSOR   1
#define TTENSOR_ELEM  1
#define TTENSOR_SHAPE 2
#define SHAPE_DIM     1
#define DIM_VALUE     1
/* StringStringEntryProto */
#define ENTRY_KEY   1
#define ENTRY_VALUE 2

/* Elements a tensor may have: more than any file could hold. */
#define MAX_ELEMENTS ((uint64_t)1 << 42)

// ----------------------------------------------------------------------------
// Helpers

const char *dsrt__onnx_shown(onnx_str s, char *buf, size_t cap) {
    size_t k = 0;
    if (!cap) return buf;
    for (size_t i = 0; i < s.n && k + 5 < cap; i++) {
        if (i == 80) {
            k += (size_t)snprintf(buf + k, cap - k, "...");
            break;
        }
        uint8_t c = s.p[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
            buf[k++] = (char)c;
        else
            k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
    }
    buf[k < cap ? k : cap - 1] = '\0';
    return buf;
}

int dsrt__onnx_dtype_size(int dtype) {
    switch (dtype) {
    case ONNX_FLOAT:
    case ONNX_INT32:
        return 4;
    case ONNX_FLOAT16:
    case ONNX_BFLOAT16:
        return 2;
    case ONNX_INT64:
    case ONNX_DOUBLE:
        return 8;
    case ONNX_UINT8:
    case ONNX_INT8:
    case ONNX_BOOL:
        return 1;
    default:
        return 0;
    }
}

const char *dsrt__onnx_dtype_name(int dtype) {
    switch (dtype) {
    case ONNX_FLOAT:
        return "float";
    case ONNX_UINT8:
        return "uint8";
    case ONNX_INT8:
        return "int8";
    case ONNX_INT32:
        return "int32";
    case ONNX_INT64:
        return "int64";
    case ONNX_BOOL:
        return "bool";
    case ONNX_FLOAT16:
        return "float16";
    case ONNX_DOUBLE:
        return "double";
    case ONNX_BFLOAT16:
        return "bfloat16";
    default:
        return "an unsupported type";
    }
}

static int wire_is(const dsrt_pb_field *f, int wire, const char *what) {
    if (f->wire == wire) return 0;
    return dsrt__fail(DSRT_ECORRUPT, "%s (field %u) has wire type %d, not %d", what, f->number,
                      f->wire, wire);
}

static int string_field(const dsrt_pb_field *f, const char *what, onnx_str *out) {
    int rc = wire_is(f, DSRT_PB_BYTES, what);
    if (rc) return rc;
    if (f->b.n > ONNX_NAME_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "%s: %zu bytes, more than %d", what, f->b.n, ONNX_NAME_MAX);
    *out = f->b;
    return 0;
}

/* Values in a repeated numeric field's occurrence: packed (wire type 2) or
 * one (its own wire type). width: 4 or 8 for fixed, 0 for varints. */
static int count_repeated(const dsrt_pb_field *f, int width, const char *what, uint64_t *n) {
    if (f->wire == DSRT_PB_BYTES) {
        if (width) {
            if (f->b.n % (size_t)width)
                return dsrt__fail(DSRT_ECORRUPT,
                                  "%s: a packed run of %zu bytes is not %d-byte "
                                  "values",
                                  what, f->b.n, width);
            *n += f->b.n / (size_t)width;
            return 0;
        }
        long long k = dsrt__pb_count_varints(f->b);
        if (k < 0)
            return dsrt__fail(DSRT_ECORRUPT, "%s: a packed run of varints is malformed", what);
        *n += (uint64_t)k;
        return 0;
    }
    int want = width == 4 ? DSRT_PB_FIXED32 : width == 8 ? DSRT_PB_FIXED64 : DSRT_PB_VARINT;
    int rc = wire_is(f, want, what);
    if (rc) return rc;
    *n += 1;
    return 0;
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ----------------------------------------------------------------------------
// Tensors

/* The first walk over a tensor's fields: everything but the external
 * data's entries. typed counts the values of each typed data field;
 * has_type says whether data_type was given. */
static int tensor_fields(onnx_tensor *t, onnx_str msg, const uint8_t *base, const char *where,
                         uint64_t *typed, int *has_type) {
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case TENSOR_DIMS: {
            if (f.wire == DSRT_PB_BYTES) {
                const uint8_t *p = f.b.p, *end = f.b.p + f.b.n;
                while (p < end) {
                    uint64_t v;
                    size_t k = dsrt__pb_varint(p, end, &v);
                    if (!k) return dsrt__fail(DSRT_ECORRUPT, "%s: dims: malformed", where);
                    if (t->ndims == ONNX_DIMS_MAX)
                        return dsrt__fail(DSRT_EUNSUPPORTED, "%s: more than %d dimensions", where,
                                          ONNX_DIMS_MAX);
                    t->dims[t->ndims++] = (int64_t)v;
                    p += k;
                }
                break;
            }
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "dims"))) goto fail;
            if (t->ndims == ONNX_DIMS_MAX)
                return dsrt__fail(DSRT_EUNSUPPORTED, "%s: more than %d dimensions", where,
                                  ONNX_DIMS_MAX);
            t->dims[t->ndims++] = (int64_t)f.u;
            break;
        }
        case TENSOR_DATA_TYPE:
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "data_type"))) goto fail;
            t->dtype = (int)(int32_t)f.u;
            *has_type = 1;
            break;
        case TENSOR_SEGMENT:
            return dsrt__fail(DSRT_EUNSUPPORTED, "%s: a tensor in segments", where);
        case TENSOR_NAME:
            if ((rc = string_field(&f, "name", &t->name))) goto fail;
            break;
        case TENSOR_RAW_DATA:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "raw_data"))) goto fail;
            t->has_raw = 1;
            t->raw = f.b;
            break;
        case TENSOR_FLOAT_DATA:
        case TENSOR_INT32_DATA:
        case TENSOR_STRING_DATA:
        case TENSOR_INT64_DATA:
        case TENSOR_DOUBLE_DATA:
        case TENSOR_UINT64_DATA: {
            /* fixed32 floats, fixed64 doubles, varints for the others */
            int width = f.number == TENSOR_FLOAT_DATA ? 4 : f.number == TENSOR_DOUBLE_DATA ? 8 : 0;
            if (f.number == TENSOR_STRING_DATA) {
                if ((rc = wire_is(&f, DSRT_PB_BYTES, "string_data"))) goto fail;
                typed[f.number]++;
                break;
            }
            if ((rc = count_repeated(&f, width, "a typed data field", &typed[f.number]))) goto fail;
            break;
        }
        case TENSOR_DATA_LOCATION:
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "data_location"))) goto fail;
            if (f.u > 1)
                return dsrt__fail(DSRT_ECORRUPT, "%s: data_location %llu is not 0 or 1", where,
                                  (unsigned long long)f.u);
            t->external = (int)f.u;
            break;
        case TENSOR_EXTERNAL_DATA:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "external_data"))) goto fail;
            break;
        default:
            break;
        }
    }
    if (rc < 0) goto fail;
    return 0;
fail:
    return dsrt__fail_prefix(rc, "%s", where);
}

/* The entries of a tensor's external_data: location, offset, length. */
static int external_entries(onnx_tensor *t, onnx_str msg, const uint8_t *base, const char *where) {
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc;
    int has_location = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        if (f.number != TENSOR_EXTERNAL_DATA) continue;
        dsrt_pb e = dsrt__pb_open(f.b, base);
        dsrt_pb_field g;
        onnx_str key = {NULL, 0}, value = {NULL, 0};
        while ((rc = dsrt__pb_next(&e, &g)) > 0) {
            if (g.number == ENTRY_KEY && (rc = string_field(&g, "external_data key", &key)))
                goto fail;
            if (g.number == ENTRY_VALUE && (rc = string_field(&g, "external_data value", &value)))
                goto fail;
        }
        if (rc < 0) goto fail;
        if (onnx_is(key, "location")) {
            t->location = value;
            has_location = 1;
            continue;
        }
        if (!onnx_is(key, "offset") && !onnx_is(key, "length")) continue;
        uint64_t v = 0;
        if (value.n == 0 || value.n > 19) goto bad_number;
        for (size_t i = 0; i < value.n; i++) {
            if (value.p[i] < '0' || value.p[i] > '9') goto bad_number;
            v = v * 10 + (uint64_t)(value.p[i] - '0');
        }
        if (onnx_is(key, "offset")) {
            t->ext_offset = v;
        } else {
            t->ext_length = v;
            t->has_ext_length = 1;
        }
        continue;
    bad_number : {
        char b[100];
        return dsrt__fail(DSRT_ECORRUPT, "%s: external data: %.*s '%s' is not a number", where,
                          (int)key.n, (const char *)key.p, dsrt__onnx_shown(value, b, sizeof b));
    }
    }
    if (rc < 0) goto fail;
    if (!has_location || !t->location.n)
        return dsrt__fail(DSRT_ECORRUPT, "%s: external data without a location", where);
    return 0;
fail:
    return dsrt__fail_prefix(rc, "%s", where);
}

int dsrt__onnx_tensor(onnx_tensor *t, onnx_str msg, const uint8_t *base, const char *where) {
    memset(t, 0, sizeof *t);
    t->msg = msg;
    int rc, has_type = 0;
    uint64_t typed[12] = {0};
    if ((rc = tensor_fields(t, msg, base, where, typed, &has_type))) return rc;
    char nm[128];
    if (t->name.n) {
        char b[100];
        snprintf(nm, sizeof nm, "%s '%s'", where, dsrt__onnx_shown(t->name, b, sizeof b));
        where = nm;
    }
    if (!has_type) return dsrt__fail(DSRT_ECORRUPT, "%s: no data_type", where);
    t->count = 1;
    for (int i = 0; i < t->ndims; i++) {
        if (t->dims[i] < 0 || (uint64_t)t->dims[i] > MAX_ELEMENTS)
            return dsrt__fail(DSRT_ECORRUPT, "%s: dimension %d is %lld", where, i,
                              (long long)t->dims[i]);
        if (t->dims[i] && t->count > MAX_ELEMENTS / (uint64_t)t->dims[i])
            return dsrt__fail(DSRT_ETOOBIG, "%s: more than 2^42 elements", where);
        t->count *= (uint64_t)t->dims[i];
    }
    int field = t->dtype == ONNX_FLOAT    ? TENSOR_FLOAT_DATA
                : t->dtype == ONNX_INT64  ? TENSOR_INT64_DATA
                : t->dtype == ONNX_DOUBLE ? TENSOR_DOUBLE_DATA
                                          : TENSOR_INT32_DATA;
    t->typed = typed[field];
    uint64_t other = 0;
    for (int k = 0; k < 12; k++) other += k == field ? 0 : typed[k];
    if (other)
        return dsrt__fail(DSRT_ECORRUPT, "%s: values in a field that is not its type's (%s)", where,
                          dsrt__onnx_dtype_name(t->dtype));
    int sources = t->has_raw + (t->typed > 0) + t->external;
    if (sources > 1)
        return dsrt__fail(DSRT_ECORRUPT,
                          "%s: its values are given twice (raw_data, typed fields, external data)",
                          where);
    if (t->external) return external_entries(t, msg, base, where);
    int size = dsrt__onnx_dtype_size(t->dtype);
    if (t->has_raw) {
        if (!size) return dsrt__fail(DSRT_EUNSUPPORTED, "%s: raw data of type %d", where, t->dtype);
        if (t->raw.n != t->count * (uint64_t)size)
            return dsrt__fail(DSRT_ECORRUPT,
                              "%s: raw_data has %zu bytes; its shape makes %llu %s values, %llu "
                              "bytes",
                              where, t->raw.n, (unsigned long long)t->count,
                              dsrt__onnx_dtype_name(t->dtype),
                              (unsigned long long)(t->count * (uint64_t)size));
        return 0;
    }
    if (t->typed != t->count)
        return dsrt__fail(DSRT_ECORRUPT, "%s: %llu values for a shape of %llu elements", where,
                          (unsigned long long)t->typed, (unsigned long long)t->count);
    return 0;
}

// ----------------------------------------------------------------------------
// Attributes and nodes

static int parse_attr(onnx_model *m, onnx_attr *a, onnx_str msg, const uint8_t *base) {
    memset(a, 0, sizeof *a);
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    uint64_t nf = 0, ni = 0;
    int rc;
    onnx_str tmsg = {NULL, 0};
    int has_t = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case ATTR_NAME:
            if ((rc = string_field(&f, "name", &a->name))) return rc;
            break;
        case ATTR_REF:
            if ((rc = string_field(&f, "ref_attr_name", &a->ref))) return rc;
            break;
        case ATTR_TYPE:
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "type"))) return rc;
            a->type = (int)(int32_t)f.u;
            break;
        case ATTR_F:
            if ((rc = wire_is(&f, DSRT_PB_FIXED32, "f"))) return rc;
            a->f = f32_of((uint32_t)f.u);
            a->has_f = 1;
            break;
        case ATTR_I:
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "i"))) return rc;
            a->i = (int64_t)f.u;
            a->has_i = 1;
            break;
        case ATTR_S:
            if ((rc = string_field(&f, "s", &a->s))) return rc;
            a->has_s = 1;
            break;
        case ATTR_T:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "t"))) return rc;
            tmsg = f.b;
            has_t = 1;
            break;
        case ATTR_G:
            a->has_graph = 1;
            break;
        case ATTR_FLOATS:
            if ((rc = count_repeated(&f, 4, "floats", &nf))) return rc;
            break;
        case ATTR_INTS:
            if ((rc = count_repeated(&f, 0, "ints", &ni))) return rc;
            break;
        case ATTR_STRINGS:
            a->n_strings++;
            break;
        default:
            break;
        }
    }
    if (rc < 0) return rc;
    if (has_t) {
        a->t = dsrt__arena_alloc(&m->arena, sizeof *a->t, 8);
        if (!a->t) return -ENOMEM;
        if ((rc = dsrt__onnx_tensor(a->t, tmsg, base, "its tensor"))) return rc;
    }
    if (!nf && !ni) return 0;
    a->floats = nf ? dsrt__arena_alloc(&m->arena, nf * sizeof(float), 8) : NULL;
    a->ints = ni ? dsrt__arena_alloc(&m->arena, ni * sizeof(int64_t), 8) : NULL;
    if ((nf && !a->floats) || (ni && !a->ints)) return -ENOMEM;
    r = dsrt__pb_open(msg, base);
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        if (f.number == ATTR_FLOATS) {
            if (f.wire == DSRT_PB_BYTES) {
                for (size_t k = 0; k + 4 <= f.b.n; k += 4) {
                    uint32_t u = (uint32_t)f.b.p[k] | (uint32_t)f.b.p[k + 1] << 8 |
                                 (uint32_t)f.b.p[k + 2] << 16 | (uint32_t)f.b.p[k + 3] << 24;
                    a->floats[a->n_floats++] = f32_of(u);
                }
            } else {
                a->floats[a->n_floats++] = f32_of((uint32_t)f.u);
            }
        } else if (f.number == ATTR_INTS) {
            if (f.wire == DSRT_PB_BYTES) {
                const uint8_t *p = f.b.p, *end = f.b.p + f.b.n;
                uint64_t v;
                size_t k;
                while (p < end && (k = dsrt__pb_varint(p, end, &v))) {
                    a->ints[a->n_ints++] = (int64_t)v;
                    p += k;
                }
            } else {
                a->ints[a->n_ints++] = (int64_t)f.u;
            }
        }
    }
    return rc < 0 ? rc : 0;
}

static int parse_node(onnx_model *m, onnx_node *nd, onnx_str msg, const uint8_t *base) {
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc;
    size_t n_in = 0, n_out = 0, n_attr = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        n_in += f.number == NODE_INPUT;
        n_out += f.number == NODE_OUTPUT;
        n_attr += f.number == NODE_ATTRIBUTE;
    }
    if (rc < 0) return rc;
    nd->in = n_in ? dsrt__arena_alloc(&m->arena, n_in * sizeof *nd->in, 8) : NULL;
    nd->out = n_out ? dsrt__arena_alloc(&m->arena, n_out * sizeof *nd->out, 8) : NULL;
    nd->attr = n_attr ? dsrt__arena_alloc(&m->arena, n_attr * sizeof *nd->attr, 8) : NULL;
    if ((n_in && !nd->in) || (n_out && !nd->out) || (n_attr && !nd->attr)) return -ENOMEM;
    r = dsrt__pb_open(msg, base);
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case NODE_INPUT:
            if ((rc = string_field(&f, "input", &nd->in[nd->n_in++]))) return rc;
            break;
        case NODE_OUTPUT:
            if ((rc = string_field(&f, "output", &nd->out[nd->n_out++]))) return rc;
            break;
        case NODE_NAME:
            if ((rc = string_field(&f, "name", &nd->name))) return rc;
            break;
        case NODE_OP_TYPE:
            if ((rc = string_field(&f, "op_type", &nd->op))) return rc;
            break;
        case NODE_DOMAIN:
            if ((rc = string_field(&f, "domain", &nd->domain))) return rc;
            break;
        case NODE_OVERLOAD:
            if ((rc = string_field(&f, "overload", &nd->overload))) return rc;
            break;
        case NODE_ATTRIBUTE:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "attribute"))) return rc;
            if ((rc = parse_attr(m, &nd->attr[nd->n_attr], f.b, base)))
                return dsrt__fail_prefix(rc, "attribute %d", nd->n_attr);
            nd->n_attr++;
            break;
        default:
            break;
        }
    }
    return rc < 0 ? rc : 0;
}

// ----------------------------------------------------------------------------
// Value infos, the graph, the model

static int parse_value(onnx_value *v, onnx_str msg, const uint8_t *base) {
    memset(v, 0, sizeof *v);
    v->ndims = -1;
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        if (f.number == VALUE_NAME && (rc = string_field(&f, "name", &v->name))) return rc;
        if (f.number != VALUE_TYPE) continue;
        if ((rc = wire_is(&f, DSRT_PB_BYTES, "type"))) return rc;
        dsrt_pb t = dsrt__pb_open(f.b, base);
        dsrt_pb_field g;
        while ((rc = dsrt__pb_next(&t, &g)) > 0) {
            if (g.number != TYPE_TENSOR) continue;
            if ((rc = wire_is(&g, DSRT_PB_BYTES, "tensor_type"))) return rc;
            dsrt_pb tt = dsrt__pb_open(g.b, base);
            dsrt_pb_field h;
            while ((rc = dsrt__pb_next(&tt, &h)) > 0) {
                if (h.number == TTENSOR_ELEM) {
                    if ((rc = wire_is(&h, DSRT_PB_VARINT, "elem_type"))) return rc;
                    v->elem_type = (int)(int32_t)h.u;
                } else if (h.number == TTENSOR_SHAPE) {
                    if ((rc = wire_is(&h, DSRT_PB_BYTES, "shape"))) return rc;
                    v->ndims = 0;
                    dsrt_pb s = dsrt__pb_open(h.b, base);
                    dsrt_pb_field d;
                    while ((rc = dsrt__pb_next(&s, &d)) > 0) {
                        if (d.number != SHAPE_DIM) continue;
                        if ((rc = wire_is(&d, DSRT_PB_BYTES, "dim"))) return rc;
                        if (v->ndims == ONNX_DIMS_MAX)
                            return dsrt__fail(DSRT_EUNSUPPORTED, "more than %d dimensions",
                                              ONNX_DIMS_MAX);
                        int64_t value = -1;
                        dsrt_pb dm = dsrt__pb_open(d.b, base);
                        dsrt_pb_field e;
                        while ((rc = dsrt__pb_next(&dm, &e)) > 0)
                            if (e.number == DIM_VALUE) {
                                if ((rc = wire_is(&e, DSRT_PB_VARINT, "dim_value"))) return rc;
                                value = (int64_t)e.u;
                            }
                        if (rc < 0) return rc;
                        v->dims[v->ndims++] = value < 0 ? -1 : value;
                    }
                    if (rc < 0) return rc;
                }
            }
            if (rc < 0) return rc;
        }
        if (rc < 0) return rc;
    }
    return rc < 0 ? rc : 0;
}

/* Allocates n records of size in the arena (NULL for none). */
static void *records(onnx_model *m, size_t n, size_t size, int *fail) {
    if (!n) return NULL;
    void *p = dsrt__arena_alloc(&m->arena, n * size, 8);
    if (!p)
        *fail = 1;
    else
        memset(p, 0, n * size);
    return p;
}

static int parse_graph(onnx_model *m, onnx_str msg, const uint8_t *base) {
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc, nomem = 0;
    size_t nn = 0, ni = 0, nin = 0, nout = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        int msgs = f.number == GRAPH_NODE || f.number == GRAPH_INITIALIZER ||
                   f.number == GRAPH_INPUT || f.number == GRAPH_OUTPUT;
        if (msgs && (rc = wire_is(&f, DSRT_PB_BYTES, "a node, tensor or value")))
            return dsrt__fail_prefix(rc, "graph");
        nn += f.number == GRAPH_NODE;
        ni += f.number == GRAPH_INITIALIZER;
        nin += f.number == GRAPH_INPUT;
        nout += f.number == GRAPH_OUTPUT;
        m->sparse_inits += f.number == GRAPH_SPARSE_INITIALIZER;
        if (f.number == GRAPH_NAME && (rc = string_field(&f, "name", &m->graph_name)))
            return dsrt__fail_prefix(rc, "graph");
    }
    if (rc < 0) return dsrt__fail_prefix(rc, "graph");
    if (nn > (1u << 20) || ni > (1u << 20))
        return dsrt__fail(DSRT_ETOOBIG, "graph: %zu nodes and %zu initializers, more than 2^20", nn,
                          ni);
    m->nodes = records(m, nn, sizeof *m->nodes, &nomem);
    m->inits = records(m, ni, sizeof *m->inits, &nomem);
    m->inputs = records(m, nin, sizeof *m->inputs, &nomem);
    m->outputs = records(m, nout, sizeof *m->outputs, &nomem);
    if (nomem) return -ENOMEM;
    r = dsrt__pb_open(msg, base);
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case GRAPH_NODE: {
            onnx_node *nd = &m->nodes[m->n_nodes];
            nd->index = nd->number = m->n_nodes;
            if ((rc = parse_node(m, nd, f.b, base)))
                return dsrt__fail_prefix(rc, "graph: node %d", m->n_nodes);
            m->n_nodes++;
            break;
        }
        case GRAPH_INITIALIZER: {
            char where[64];
            snprintf(where, sizeof where, "graph: initializer %d", m->n_inits);
            if ((rc = dsrt__onnx_tensor(&m->inits[m->n_inits], f.b, base, where))) return rc;
            m->n_inits++;
            break;
        }
        case GRAPH_INPUT:
            if ((rc = parse_value(&m->inputs[m->n_inputs], f.b, base)))
                return dsrt__fail_prefix(rc, "graph: input %d", m->n_inputs);
            m->n_inputs++;
            break;
        case GRAPH_OUTPUT:
            if ((rc = parse_value(&m->outputs[m->n_outputs], f.b, base)))
                return dsrt__fail_prefix(rc, "graph: output %d", m->n_outputs);
            m->n_outputs++;
            break;
        default:
            break;
        }
    }
    return rc < 0 ? dsrt__fail_prefix(rc, "graph") : 0;
}

// ----------------------------------------------------------------------------
// Local functions (FunctionProto), inlined

/* A function: its formal inputs and outputs, the defaults of its
 * attributes, and its body. */
typedef struct {
    onnx_str name, domain, overload;
    onnx_str *in, *out;
    int n_in, n_out;
    onnx_attr *defaults;
    int n_defaults;
    onnx_node *body;
    int n_body;
} onnx_function;

#define FUNCTION_DEPTH_MAX 16
#define NODES_MAX          (1 << 20)

static int parse_function(onnx_model *m, onnx_function *fn, onnx_str msg, const uint8_t *base) {
    dsrt_pb r = dsrt__pb_open(msg, base);
    dsrt_pb_field f;
    int rc, nomem = 0;
    size_t n_in = 0, n_out = 0, n_def = 0, n_body = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        n_in += f.number == FUNC_INPUT;
        n_out += f.number == FUNC_OUTPUT;
        n_def += f.number == FUNC_ATTR_PROTO;
        n_body += f.number == FUNC_NODE;
    }
    if (rc < 0) return rc;
    if (n_body > NODES_MAX) return dsrt__fail(DSRT_ETOOBIG, "more than 2^20 nodes");
    fn->in = records(m, n_in, sizeof *fn->in, &nomem);
    fn->out = records(m, n_out, sizeof *fn->out, &nomem);
    fn->defaults = records(m, n_def, sizeof *fn->defaults, &nomem);
    fn->body = records(m, n_body, sizeof *fn->body, &nomem);
    if (nomem) return -ENOMEM;
    r = dsrt__pb_open(msg, base);
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case FUNC_NAME:
            if ((rc = string_field(&f, "name", &fn->name))) return rc;
            break;
        case FUNC_DOMAIN:
            if ((rc = string_field(&f, "domain", &fn->domain))) return rc;
            break;
        case FUNC_OVERLOAD:
            if ((rc = string_field(&f, "overload", &fn->overload))) return rc;
            break;
        case FUNC_INPUT:
            if ((rc = string_field(&f, "input", &fn->in[fn->n_in++]))) return rc;
            break;
        case FUNC_OUTPUT:
            if ((rc = string_field(&f, "output", &fn->out[fn->n_out++]))) return rc;
            break;
        case FUNC_ATTR_PROTO:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "attribute_proto"))) return rc;
            if ((rc = parse_attr(m, &fn->defaults[fn->n_defaults], f.b, base)))
                return dsrt__fail_prefix(rc, "attribute_proto %d", fn->n_defaults);
            fn->n_defaults++;
            break;
        case FUNC_NODE: {
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "node"))) return rc;
            onnx_node *nd = &fn->body[fn->n_body];
            nd->index = nd->number = fn->n_body;
            if ((rc = parse_node(m, nd, f.b, base)))
                return dsrt__fail_prefix(rc, "node %d", fn->n_body);
            fn->n_body++;
            break;
        }
        default:
            break;
        }
    }
    return rc < 0 ? rc : 0;
}

/* The function a node calls, or NULL. */
static const onnx_function *called(const onnx_function *fns, int n, const onnx_node *nd) {
    for (int i = 0; i < n; i++)
        if (onnx_same(fns[i].name, nd->op) && onnx_same(fns[i].domain, nd->domain) &&
            onnx_same(fns[i].overload, nd->overload))
            return &fns[i];
    return NULL;
}

typedef struct {
    onnx_model *m;
    const onnx_function *fns;
    int n_fns;
    onnx_node *out; /* NULL while counting */
    size_t n;
    size_t visits; /* nodes looked at, emitted or not: bounds calls of empty functions */
} inliner;

/* A call being expanded: the function, the node calling it (its inputs,
 * outputs and attributes already the caller's), and the prefix that makes
 * the body's own values unique. */
typedef struct {
    const onnx_function *fn;
    const onnx_node *site;
    onnx_str prefix;
} call;

static onnx_str concat3(onnx_model *m, onnx_str a, const char *sep, onnx_str b, int *nomem) {
    size_t ns = strlen(sep), n = a.n + ns + b.n;
    uint8_t *p = dsrt__arena_alloc(&m->arena, n ? n : 1, 1);
    if (!p) {
        *nomem = 1;
        return (onnx_str){NULL, 0};
    }
    if (a.n) memcpy(p, a.p, a.n);
    memcpy(p + a.n, sep, ns);
    if (b.n) memcpy(p + a.n + ns, b.p, b.n);
    return (onnx_str){p, n};
}

/* A body's value name seen from the caller: a formal input or output is
 * the caller's, an omitted one stays empty, any other gets the call's
 * prefix. */
static onnx_str rename_value(inliner *x, const call *cl, onnx_str name, int *nomem) {
    if (!name.n) return name;
    const onnx_function *fn = cl->fn;
    for (int i = 0; i < fn->n_in; i++)
        if (onnx_same(fn->in[i], name))
            return i < cl->site->n_in ? cl->site->in[i] : (onnx_str){NULL, 0};
    for (int i = 0; i < fn->n_out; i++)
        if (onnx_same(fn->out[i], name))
            return i < cl->site->n_out ? cl->site->out[i] : (onnx_str){NULL, 0};
    return concat3(x->m, cl->prefix, "/", name, nomem);
}

/* The attribute a body's attribute is: itself, or the caller's (or the
 * function's default) it refers to, under its own name; NULL to leave it
 * out. */
static const onnx_attr *resolve_attr(const call *cl, const onnx_attr *a, onnx_attr *tmp) {
    if (!a->ref.n) return a;
    const onnx_attr *from = NULL;
    for (int k = 0; k < cl->site->n_attr && !from; k++)
        if (onnx_same(cl->site->attr[k].name, a->ref)) from = &cl->site->attr[k];
    for (int k = 0; k < cl->fn->n_defaults && !from; k++)
        if (onnx_same(cl->fn->defaults[k].name, a->ref)) from = &cl->fn->defaults[k];
    if (!from) return NULL;
    *tmp = *from;
    tmp->name = a->name;
    tmp->ref = (onnx_str){NULL, 0};
    return tmp;
}

static int expand(inliner *x, const onnx_node *nd, int depth, int top);

/* Emits node nd (seen from call cl, or from the graph when cl is NULL):
 * the function's body when it calls one, else the node itself. */
static int emit(inliner *x, const onnx_node *nd, const call *cl, int depth, int top) {
    int nomem = 0;
    onnx_node copy = *nd;
    if (++x->visits > 4 * (size_t)NODES_MAX)
        return dsrt__fail(DSRT_ETOOBIG,
                          "graph: node %d '%s' (%s): its functions call more than 2^22 nodes", top,
                          ONNX_SHOWN(x->m->nodes[top].name), ONNX_SHOWN(x->m->nodes[top].op));
    if (cl && x->out) {
        /* The node seen from the caller: its values renamed, its attributes
         * resolved, its name and index the call's. */
        onnx_str *in = records(x->m, (size_t)nd->n_in, sizeof *in, &nomem);
        onnx_str *out = records(x->m, (size_t)nd->n_out, sizeof *out, &nomem);
        onnx_attr *at = records(x->m, (size_t)nd->n_attr, sizeof *at, &nomem);
        if (nomem) return -ENOMEM;
        for (int k = 0; k < nd->n_in; k++) in[k] = rename_value(x, cl, nd->in[k], &nomem);
        for (int k = 0; k < nd->n_out; k++) out[k] = rename_value(x, cl, nd->out[k], &nomem);
        int n_at = 0;
        for (int k = 0; k < nd->n_attr; k++) {
            onnx_attr tmp;
            const onnx_attr *a = resolve_attr(cl, &nd->attr[k], &tmp);
            if (a) at[n_at++] = *a;
        }
        copy.in = in;
        copy.out = out;
        copy.attr = at;
        copy.n_attr = n_at;
        copy.name = concat3(x->m, cl->site->name, "/", nd->name, &nomem);
        copy.number = cl->site->number;
        if (nomem) return -ENOMEM;
    } else if (!cl) {
        for (int k = 0; k < nd->n_attr; k++)
            if (nd->attr[k].ref.n)
                return dsrt__fail(DSRT_ECORRUPT,
                                  "graph: node %d: attribute %d refers to a function's attribute "
                                  "(ref_attr_name) outside a function",
                                  nd->number, k);
    }
    if (called(x->fns, x->n_fns, &copy)) return expand(x, &copy, depth, top);
    if (x->n == NODES_MAX)
        return dsrt__fail(DSRT_ETOOBIG,
                          "graph: more than 2^20 nodes once its functions are inlined");
    if (x->out) x->out[x->n] = copy;
    x->n++;
    return 0;
}

/* Replaces the call nd by the body of the function it calls. */
static int expand(inliner *x, const onnx_node *nd, int depth, int top) {
    const onnx_function *fn = called(x->fns, x->n_fns, nd);
    if (depth == FUNCTION_DEPTH_MAX)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "graph: node %d '%s' (%s): functions call functions more than %d deep "
                          "(a function that calls itself?)",
                          top, ONNX_SHOWN(x->m->nodes[top].name), ONNX_SHOWN(x->m->nodes[top].op),
                          FUNCTION_DEPTH_MAX);
    int nomem = 0;
    call cl = {fn, nd, {NULL, 0}};
    if (x->out) {
        /* The call's first output is unique in the graph: its values are
         * named after it. */
        onnx_str base = nd->n_out && nd->out[0].n ? nd->out[0] : nd->name;
        char idx[24];
        snprintf(idx, sizeof idx, "%d", top);
        cl.prefix =
            concat3(x->m, base, "::", (onnx_str){(const uint8_t *)idx, strlen(idx)}, &nomem);
        if (nomem) return -ENOMEM;
    }
    for (int i = 0; i < fn->n_body; i++) {
        int rc = emit(x, &fn->body[i], &cl, depth + 1, top);
        if (rc) return rc;
    }
    return 0;
}

/* Inlines the local functions in msgs (n of them) where the graph calls
 * them. */
static int inline_functions(onnx_model *m, const uint8_t *data, int n) {
    int nomem = 0, rc = 0;
    onnx_function *fns = records(m, (size_t)n, sizeof *fns, &nomem);
    if (nomem) return -ENOMEM;
    dsrt_pb r = dsrt__pb_open((onnx_str){data, m->model_size}, data);
    dsrt_pb_field f;
    int k = 0;
    while (k < n && (rc = dsrt__pb_next(&r, &f)) > 0) {
        if (f.number != MODEL_FUNCTIONS) continue;
        if ((rc = wire_is(&f, DSRT_PB_BYTES, "functions")) ||
            (rc = parse_function(m, &fns[k], f.b, data)))
            return dsrt__fail_prefix(rc, "function %d", k);
        k++;
    }
    if (rc < 0) return rc;
    for (k = 0; k < n; k++)
        if (!fns[k].domain.n || onnx_is(fns[k].domain, "ai.onnx"))
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "function %d '%s' is in ONNX's own domain, whose operators it would "
                              "replace",
                              k, ONNX_SHOWN(fns[k].name));
    int any = 0;
    for (int i = 0; i < m->n_nodes && !any; i++) any = called(fns, n, &m->nodes[i]) != NULL;
    if (!any) return 0;
    inliner x = {m, fns, n, NULL, 0, 0};
    /* Counted, then written. */
    for (int pass = 0; pass < 2; pass++) {
        x.n = x.visits = 0;
        for (int i = 0; i < m->n_nodes; i++)
            if ((rc = emit(&x, &m->nodes[i], NULL, 0, i))) return rc;
        if (pass == 0) {
            x.out = records(m, x.n, sizeof *x.out, &nomem);
            if (nomem) return -ENOMEM;
        }
    }
    m->nodes = x.out;
    m->n_nodes = (int)x.n;
    for (int i = 0; i < m->n_nodes; i++) m->nodes[i].index = i;
    return 0;
}

int dsrt__onnx_parse(onnx_model *m, const uint8_t *data, size_t size, const char *name) {
    memset(m, 0, sizeof *m);
    if (size == 0) return dsrt__fail(DSRT_ETRUNCATED, "onnx: %s: empty file", name);
    onnx_str all = {data, size};
    dsrt_pb r = dsrt__pb_open(all, data);
    dsrt_pb_field f;
    int rc, graphs = 0;
    onnx_str graph = {NULL, 0};
    size_t n_meta = 0;
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        switch (f.number) {
        case MODEL_IR_VERSION:
            if ((rc = wire_is(&f, DSRT_PB_VARINT, "ir_version"))) goto fail;
            m->ir_version = (int64_t)f.u;
            break;
        case MODEL_PRODUCER:
            if ((rc = string_field(&f, "producer_name", &m->producer))) goto fail;
            break;
        case MODEL_PRODUCER_VERSION:
            if ((rc = string_field(&f, "producer_version", &m->producer_version))) goto fail;
            break;
        case MODEL_GRAPH:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "graph"))) goto fail;
            graph = f.b;
            graphs++;
            break;
        case MODEL_OPSET_IMPORT: {
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "opset_import"))) goto fail;
            dsrt_pb o = dsrt__pb_open(f.b, data);
            dsrt_pb_field g;
            onnx_str domain = {NULL, 0};
            int64_t version = 0;
            while ((rc = dsrt__pb_next(&o, &g)) > 0) {
                if (g.number == OPSET_DOMAIN && (rc = string_field(&g, "domain", &domain)))
                    goto fail;
                if (g.number == OPSET_VERSION) {
                    if ((rc = wire_is(&g, DSRT_PB_VARINT, "version"))) goto fail;
                    version = (int64_t)g.u;
                }
            }
            if (rc < 0) goto fail;
            if (domain.n == 0 || onnx_is(domain, "ai.onnx")) {
                if (m->opset)
                    return dsrt__fail(DSRT_ECORRUPT,
                                      "onnx: %s: the default opset is imported "
                                      "twice",
                                      name);
                m->opset = version > 0 ? version : -1;
            } else {
                m->other_opsets++;
            }
            break;
        }
        case MODEL_METADATA:
            if ((rc = wire_is(&f, DSRT_PB_BYTES, "metadata_props"))) goto fail;
            n_meta++;
            break;
        case MODEL_FUNCTIONS:
            m->n_functions++;
            break;
        default:
            break;
        }
    }
    if (rc < 0) goto fail;
    if (graphs != 1)
        return dsrt__fail(graphs ? DSRT_ECORRUPT : DSRT_EFORMAT, "onnx: %s: %s", name,
                          graphs ? "the model holds two graphs"
                                 : "no graph: not an ONNX model (a ModelProto)");
    if ((rc = parse_graph(m, graph, data))) goto fail;
    m->model_size = size;
    if (m->n_functions && (rc = inline_functions(m, data, m->n_functions))) goto fail;
    int nomem = 0;
    m->meta = records(m, n_meta, sizeof *m->meta, &nomem);
    if (nomem) return -ENOMEM;
    r = dsrt__pb_open(all, data);
    while ((rc = dsrt__pb_next(&r, &f)) > 0) {
        if (f.number != MODEL_METADATA) continue;
        dsrt_pb e = dsrt__pb_open(f.b, data);
        dsrt_pb_field g;
        onnx_meta *mt = &m->meta[m->n_meta++];
        while ((rc = dsrt__pb_next(&e, &g)) > 0) {
            if (g.number == ENTRY_KEY && (rc = string_field(&g, "metadata key", &mt->key)))
                goto fail;
            /* A value may be long: a class list. */
            if (g.number == ENTRY_VALUE) {
                if ((rc = wire_is(&g, DSRT_PB_BYTES, "metadata value"))) goto fail;
                mt->value = g.b;
            }
        }
        if (rc < 0) goto fail;
    }
    if (rc < 0) goto fail;
    return 0;
fail:
    if (rc == -ENOMEM) return dsrt__fail(-ENOMEM, "onnx: %s: out of memory", name);
    return dsrt__fail_prefix(rc, "onnx: %s", name);
}

void dsrt__onnx_model_free(onnx_model *m) {
    dsrt__arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}
