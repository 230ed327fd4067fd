/*
 * ONNX models as dsrt reads them: the parts of a ModelProto that a network
 * of dsrt's layers can come from, parsed from the protobuf wire format
 * (nn/protobuf.h) without copying anything large. Strings and tensor data
 * are slices of the file's bytes; the records that point at them live in one
 * arena. The field numbers are those of onnx.proto, which the ONNX project
 * keeps frozen.
 *
 * onnx_read.c parses and checks the encoding (every length and count against
 * the bytes that are there); onnx_import.c maps the graph onto a dsrt
 * description and copies the weights; onnx_export.c writes a net out.
 */
#ifndef DSRT_NN_ONNX_H
#define DSRT_NN_ONNX_H

#include "nn/internal.h"
#include "nn/protobuf.h"

/* TensorProto.DataType values dsrt meets. */
enum {
    ONNX_FLOAT = 1,
    ONNX_UINT8 = 2,
    ONNX_INT8 = 3,
    ONNX_INT32 = 6,
    ONNX_INT64 = 7,
    ONNX_BOOL = 9,
    ONNX_FLOAT16 = 10,
    ONNX_DOUBLE = 11,
    ONNX_BFLOAT16 = 16,
};

/* AttributeProto.AttributeType values. */
enum {
    ONNX_ATTR_FLOAT = 1,
    ONNX_ATTR_INT = 2,
    ONNX_ATTR_STRING = 3,
    ONNX_ATTR_TENSOR = 4,
    ONNX_ATTR_GRAPH = 5,
    ONNX_ATTR_FLOATS = 6,
    ONNX_ATTR_INTS = 7,
    ONNX_ATTR_STRINGS = 8,
};

#define ONNX_DIMS_MAX 8
#define ONNX_NAME_MAX 4096 /* bytes of a name, an operator or a string attribute */

/* A slice of the file: a name, an operator, a string. */
typedef dsrt_pb_bytes onnx_str;

/* A tensor: an initializer, a Constant's value, an attribute. Its values
 * are in raw (raw_data), in the typed field of its data type (msg is the
 * TensorProto, walked again to read them), or in an external file. */
typedef struct {
    onnx_str name;
    int dtype;
    int ndims;
    int64_t dims[ONNX_DIMS_MAX];
    uint64_t count; /* elements: the product of dims */
    onnx_str msg;   /* the whole TensorProto */
    int has_raw;
    onnx_str raw;
    uint64_t typed; /* values in the typed fields */
    /* data_location EXTERNAL: where the values are */
    int external;
    onnx_str location;
    uint64_t ext_offset, ext_length;
    int has_ext_length;
    /* For values dsrt made itself (a Constant's value_float, ...): NULL or
     * count values. */
    const float *made_f;
    const int64_t *made_i;
    int reads; /* the import's copies of it still to come */
} onnx_tensor;

typedef struct {
    onnx_str name;
    int type; /* ONNX_ATTR_*, or 0 when the file gives none (inferred from the field) */
    float f;
    int64_t i;
    onnx_str s;
    onnx_tensor *t;
    float *floats;
    int64_t *ints;
    size_t n_floats, n_ints;
    int has_f, has_i, has_s, n_strings, has_graph;
} onnx_attr;

typedef struct {
    int index; /* in the graph */
    onnx_str name, op, domain;
    onnx_str *in, *out;
    int n_in, n_out;
    onnx_attr *attr;
    int n_attr;
} onnx_node;

/* A graph input or output: a name and, for a float tensor, its shape (a
 * dimension < 0 is symbolic or missing). */
typedef struct {
    onnx_str name;
    int elem_type; /* 0: not a tensor, or no type */
    int ndims;     /* -1: no shape */
    int64_t dims[ONNX_DIMS_MAX];
} onnx_value;

typedef struct {
    onnx_str key, value;
} onnx_meta;

typedef struct {
    int64_t ir_version;
    int64_t opset;    /* of the default domain ("" or "ai.onnx"); 0: not imported */
    int other_opsets; /* other domains imported */
    onnx_str producer, producer_version, graph_name;
    onnx_node *nodes;
    int n_nodes;
    onnx_tensor *inits;
    int n_inits;
    onnx_value *inputs, *outputs;
    int n_inputs, n_outputs;
    onnx_meta *meta;
    int n_meta;
    int sparse_inits; /* sparse initializers (refused) */
    dsrt_arena arena;
} onnx_model;

/*
 * Parses a ModelProto from data (size bytes; name in messages). Returns 0,
 * or DSRT_ECORRUPT / DSRT_ETRUNCATED / DSRT_ETOOBIG / DSRT_EUNSUPPORTED with
 * "onnx: NAME: where: what" in the message. *m holds slices of data: it
 * must outlive m. Free m with onnx_model_free (also after a failure).
 */
int dsrt__onnx_parse(onnx_model *m, const uint8_t *data, size_t size, const char *name);
void dsrt__onnx_model_free(onnx_model *m);

/* Parses one TensorProto (msg) into *t, checking that its values are all
 * there (raw or typed; external: only the reference). where: for messages. */
int dsrt__onnx_tensor(onnx_tensor *t, onnx_str msg, const uint8_t *base, const char *where);

/* Imports a model held in memory (data, size bytes; file names it in
 * messages): dsrt_onnx_import's work. dir: the folder external data files
 * are read from, which none may lie outside, through a link or otherwise
 * (NULL: a model with external data is refused); they are read with pread,
 * so a file that changes is an error, never a signal. own_map: data is an
 * anonymous mapping (mmap) of size bytes, whose pages are released as its
 * tensors are copied, and unmapped at the end. The fuzz target's entry. */
int dsrt__onnx_import_memory(dsrt_net **net, const uint8_t *data, size_t size, const char *file,
                             const char *dir, int own_map, const dsrt_onnx_import_options *o,
                             const dsrt_net_options *options);

// ----------------------------------------------------------------------------
// Export (onnx_export.c): what a kind's onnx_export writes with

/* Bytes of the name of a layer's ONNX output value. */
#define DSRT_ONNX_VALUE_MAX (DSRT_LAYER_NAME_MAX + 16)

/* An export in progress: the graph's nodes, initializers (and, before IR 4,
 * their graph inputs) written so far, and for every layer done the name of
 * the value that holds its output and that value's rank as ONNX sees it:
 * 4 (N, C, H, W) or 2 (N, K). */
typedef struct dsrt_onnx_export {
    const dsrt_net *net;
    int opset;
    double input_scale; /* what the input layer was given per pixel value */
    dsrt_pb_writer nodes, inits, init_inputs;
    char (*value)[DSRT_ONNX_VALUE_MAX]; /* (n_layers) */
    int *rank;                          /* (n_layers) */
    int aux;                            /* auxiliary names made */
} onnx_export;

/* Writes a node's attributes for layer l into w (may be NULL in a call). */
typedef void (*dsrt_onnx_attrs_fn)(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx);

/* A node: op over inputs (n_in names) into out, named name, with its
 * attributes written by attrs (may be NULL). */
void dsrt__onnx_node(onnx_export *e, const char *op, const char *name, const char *const *in,
                     int n_in, const char *out, dsrt_onnx_attrs_fn attrs, const dsrt_layer *l,
                     const void *ctx);
void dsrt__onnx_attr_int(dsrt_pb_writer *w, const char *name, int64_t v);
void dsrt__onnx_attr_float(dsrt_pb_writer *w, const char *name, float v);
void dsrt__onnx_attr_ints(dsrt_pb_writer *w, const char *name, const int64_t *v, size_t n);
/* axis=1: Flatten's, Concat's and Softmax's. */
void dsrt__onnx_axis1_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx);
/* Initializers: float32 values (shape dims, n of them), int64 values. */
void dsrt__onnx_floats(onnx_export *e, const char *name, const int64_t *dims, int n,
                       const float *v);
void dsrt__onnx_int64s(onnx_export *e, const char *name, const int64_t *dims, int n,
                       const int64_t *v);
/* A name of its own for an auxiliary value or node: "<layer>.<what>". */
void dsrt__onnx_aux_name(char *out, size_t cap, const dsrt_layer *l, const char *what);
/* Layer j's output at the rank a node of layer l needs: as it is, or
 * through a Flatten (2) or a Reshape to (k, 1, 1) (4) written now into buf
 * (cap bytes). Returns the name to take. */
const char *dsrt__onnx_as_rank(onnx_export *e, const dsrt_layer *l, int j, int rank, char *buf,
                               size_t cap);

/* Whether s equals the C string c. */
static inline int onnx_is(onnx_str s, const char *c) {
    size_t n = 0;
    while (c[n]) n++;
    return s.n == n && (n == 0 || __builtin_memcmp(s.p, c, n) == 0);
}

/* s as printable text into buf (cap bytes): non-printable bytes as \xNN,
 * cut at 80 characters. Returns buf. */
const char *dsrt__onnx_shown(onnx_str s, char *buf, size_t cap);

/* Bytes an element of dtype takes in raw_data (0: a type dsrt does not read). */
int dsrt__onnx_dtype_size(int dtype);
const char *dsrt__onnx_dtype_name(int dtype);

#endif
