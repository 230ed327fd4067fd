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
    onnx_str ref; /* ref_attr_name: in a function, the caller's attribute of that name */
} onnx_attr;

typedef struct {
    int index;  /* its place in the nodes (after inlining and rewrites) */
    int number; /* in the file's graph (a function's body: its caller's): messages name it */
    onnx_str name, op, domain, overload;
    onnx_str *in, *out;
    int n_in, n_out;
    onnx_attr *attr;
    int n_attr;
    int made; /* made by the import's rewrites (onnx_rewrite.c), not read */
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
    int n_functions;  /* local functions, inlined where they are called */
    size_t model_size;
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
// Import (onnx_import.c): what a kind's ONNX mappings (dsrt_onnx_op) work with

/* What a named value of the graph is. */
enum { ONNX_V_INPUT = 1, ONNX_V_LAYER, ONNX_V_CONST };

/* A named value of the graph. */
typedef struct {
    onnx_str name;
    int kind;       /* ONNX_V_*, 0 not yet made */
    int layer;      /* ONNX_V_INPUT, ONNX_V_LAYER: the dsrt layer whose output it is */
    int flat;       /* ONNX sees it as (N, K), K = c h w */
    int nhwc;       /* ONNX sees it channels-last, (N, H, W, C) (after a Transpose) */
    int stage;      /* ONNX_V_INPUT: how many normalising operations made it */
    onnx_tensor *t; /* ONNX_V_CONST */
    int producer;   /* node index, or -1 */
    int uses;       /* consumers on the way to the output */
} onnx_val;

/* A dsrt layer being made: its keyword and options, its inputs, and where
 * its parameters come from: weights w (fc: transposed from (rows, cols)
 * when w_rows) times w_scale into the layer's weights, bias b times b_scale
 * into its bias, and n_s tensors into its state, one after the other, each
 * filling an equal share of it (batchnorm: running mean, running variance);
 * bit k of s_nonneg: tensor s[k] must hold values >= 0. */
typedef struct dsrt_onnx_layer {
    const char *type; /* its keyword */
    dsrt_layer_kind kind;
    char name[DSRT_LAYER_NAME_MAX];
    char opts[400];
    int in[DSRT_INPUTS_MAX], n_in;
    int node; /* the ONNX node, -1: none */
    dsrt_shape out;
    onnx_tensor *w, *b, *s[4];
    int n_s;
    unsigned s_nonneg;
    int64_t w_rows, w_cols;
    float w_scale, b_scale;
} onnx_layer;

/* An external data file: its location as the model writes it, its path
 * with every link followed (inside the model's folder), and its size when
 * it was first opened. */
typedef struct {
    char *location;
    char *path;
    uint64_t size;
} onnx_ext_file;

/* The state of one import. */
typedef struct dsrt_onnx_import {
    onnx_model m;
    const char *file;   /* for messages */
    const char *dir;    /* the model's folder, for external data; NULL: none allowed */
    char *real_dir;     /* dir with every link followed, once external data needs it */
    const uint8_t *map; /* the model's bytes (own_map: pages released as tensors are read) */
    size_t map_size;
    int own_map;
    onnx_val *v;
    size_t nv, vcap;
    uint32_t *slot; /* hash of names: index + 1 into v, 0 free */
    size_t slots;
    onnx_layer *L;
    int nL, Lcap;
    dsrt_layer_names names; /* the layers' names; a name's value: the next suffix to try */
    int *live, *absorbed;   /* per node */
    onnx_ext_file *ext;
    int n_ext;
    int in_c, in_h, in_w;
    int64_t batch; /* the input's batch dimension, -1: symbolic */
    /* The input's normalisation in the graph: Add, Sub, Mul and Div of
     * constants on the image before any layer, y = na[c] x + nb[c] per
     * channel (stage of them so far; frozen once a layer took the image).
     * pixel_div: the first of them is a division by 255 of pixels that the
     * model takes in [0, 255], which dsrt's own [0, 1] batches already are. */
    double *na, *nb;
    int stage, frozen, pixel_div;
    double scale;         /* the model takes pixel values times this */
    int user_stats;       /* the caller gave a mean or std */
    int scale_said;       /* the caller or the model's metadata gave the scale */
    const onnx_node *cur; /* the node being mapped, for messages */
    int err;              /* the code of the last refusal */
    /* The node being mapped: its operator's ONNX_OP_* flags, the layout of
     * its first data input, and the layout its mapping gives its output
     * (for ONNX_OP_NHWC operators; an ONNX_OP_ELEMENTWISE output keeps its
     * input's). */
    unsigned op_flags;
    int in_nhwc, out_nhwc;
} onnx_import;

/* Fails naming the node being mapped: "onnx: FILE: node N 'NAME' (OP,
 * opset K): ...". Returns code (also kept in c->err). */
int dsrt__onnx_fail(onnx_import *c, int code, const char *fmt, ...) DSRT_PRINTF(3, 4);
/* A name as messages show it (non-printable bytes escaped, cut). */
#define ONNX_SHOWN(s) dsrt__onnx_shown((s), (char[100]){0}, 100)

/* The value named name, or NULL. */
onnx_val *dsrt__onnx_find(onnx_import *c, onnx_str name);
/* A new value named name of kind (ONNX_V_*), NULL after a failure (the name
 * taken, or more values than the graph declares). */
onnx_val *dsrt__onnx_define(onnx_import *c, onnx_str name, int kind);
/* Refuses an attribute of the node being mapped that is not in known
 * (comma-separated names). */
int dsrt__onnx_check_attrs(onnx_import *c, const char *known);
/* Input k of the node being mapped, which must be made above it (NULL with
 * the failure otherwise, or when the node has no input k). */
onnx_val *dsrt__onnx_input(onnx_import *c, int k);
/* Output k of the node being mapped (NULL: none, or unused). */
onnx_val *dsrt__onnx_output(onnx_import *c, int k);
/* Whether output k of the node is used on the way to the graph's output. */
int dsrt__onnx_output_used(onnx_import *c, int k);
/* Whether the node has input k (an empty name is an input left out). */
int dsrt__onnx_has_input(onnx_import *c, int k);
/* A computed input (the image or a layer's output), NULL after a failure
 * (what names it: "first"). */
onnx_val *dsrt__onnx_data_input(onnx_import *c, int k, const char *what);
/* A constant input (an initializer), NULL after a failure. */
onnx_tensor *dsrt__onnx_const_input(onnx_import *c, int k, const char *what);
/* Folds the node being mapped into a constant when its inputs are
 * constants or static shapes (shape arithmetic: Shape, Gather, Concat,
 * Slice, Unsqueeze, arithmetic, ...; onnx_fold.c). Returns 1 when folded, 0
 * when it is not a fold (an input is computed), < 0 after a failure. */
int dsrt__onnx_fold(onnx_import *c);
/* Puts back, as the one operator a layer computes, the expansions
 * exporters write for operators older opsets lack (GELU's erf form,
 * LayerNorm's arithmetic); onnx_rewrite.c. Before the operators are
 * checked. */
int dsrt__onnx_rewrite(onnx_import *c);
/* Whether the node's operator is one dsrt folds, and nothing else. */
int dsrt__onnx_fold_only(const onnx_node *n);
/* The batch size in a folded shape: symbolic. */
#define ONNX_BATCH INT64_MIN

/* Input 0 as an image: 4-D in ONNX, not flattened. */
onnx_val *dsrt__onnx_image_input(onnx_import *c);
/* The dsrt shape of a value made by a layer (or the input). */
dsrt_shape dsrt__onnx_shape_of(onnx_import *c, const onnx_val *v);
/* Whether a flattened value is the (k, 1, 1) dsrt shape its (N, K) says. */
int dsrt__onnx_flat_is_channels(onnx_import *c, const onnx_val *v);
/* The node's output 0 becomes what src is (Identity, Flatten, Dropout). */
void dsrt__onnx_alias(onnx_import *c, const onnx_val *src, int flat);
/* The input normalisation: Add, Sub, Mul or Div of a constant on the image
 * before any layer. */
int dsrt__onnx_affine(onnx_import *c);

/* Attributes of the node being mapped: the attribute, and its value of a
 * type (absent: def; the wrong type: a failure). _ints: exactly n values;
 * returns 1 when given, 0 when not, < 0 after a failure. */
const onnx_attr *dsrt__onnx_get_attr(onnx_import *c, const char *name);
int dsrt__onnx_get_int(onnx_import *c, const char *name, int64_t def, int64_t *out);
int dsrt__onnx_get_float(onnx_import *c, const char *name, float def, float *out);
int dsrt__onnx_get_ints(onnx_import *c, const char *name, int n, int64_t *out);
int dsrt__onnx_get_string(onnx_import *c, const char *name, const char *def, char *out, size_t cap);

/* A tensor's values: as floats (count of them), as integers (at most cap;
 * returns how many, or < 0), one float or bool value. */
int dsrt__onnx_tensor_floats(onnx_import *c, const onnx_tensor *t, float *dst);
int dsrt__onnx_tensor_ints(onnx_import *c, const onnx_tensor *t, int64_t *out, int cap);
int dsrt__onnx_scalar(onnx_import *c, const onnx_tensor *t, double *out);
/* One of the copies of t the import makes is made: after the last, the
 * model's pages that held it are released. */
void dsrt__onnx_copied(onnx_import *c, onnx_tensor *t);
/* t's external file, its bytes' span checked against the file's size. */
int dsrt__onnx_external_span(onnx_import *c, const onnx_tensor *t, onnx_ext_file **x);

/* A new layer of keyword type taking the given values' layers, named after
 * the node; NULL with c->err when there are too many or no memory. */
onnx_layer *dsrt__onnx_add_layer(onnx_import *c, const char *type, onnx_val *const *ins, int n_in);
/* Appends options to the layer's description line (" size=3"). */
void dsrt__onnx_opt(onnx_layer *l, const char *fmt, ...) DSRT_PRINTF(2, 3);
/* Output 0 of the node is layer l's output (flat: as ONNX's (N, K)). */
void dsrt__onnx_produce(onnx_import *c, onnx_layer *l, int flat);
/* The shape of a layer's output, refused naming the node when its images
 * would have 2^31 values or more. */
int dsrt__onnx_out_shape(onnx_import *c, int64_t ch, int64_t h, int64_t w, dsrt_shape *out);

/* A convolution's or pooling's window. */
typedef struct {
    int kh, kw, sh, sw, dh, dw;
    int pt, pb, pl, pr; /* dsrt's: top, bottom, left, right */
    int64_t oh, ow;
} onnx_window;

/* Reads kernel_shape (or takes kernel), strides, dilations (when allowed),
 * pads and auto_pad into w for input s. */
int dsrt__onnx_geometry(onnx_import *c, const dsrt_shape *s, const int *kernel, int dilations,
                        onnx_window *w);
/* " size= stride= pad=" of w. */
void dsrt__onnx_window_opts(onnx_layer *l, const onnx_window *w);

static inline int onnx_same(onnx_str a, onnx_str b) {
    return a.n == b.n && (a.n == 0 || __builtin_memcmp(a.p, b.p, a.n) == 0);
}

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

/* Whether constant t, met by a value of rank dimensions whose last axis
 * holds n, is one value an entry of that axis, the same along every other:
 * its dimensions 1 but the last (n or 1), and no more of them than the
 * value has (more would raise the result's rank and move its axes). */
static inline int dsrt__onnx_row_const(const onnx_tensor *t, int64_t n, int rank) {
    if (t->ndims > rank) return 0;
    for (int d = 0; d + 1 < t->ndims; d++)
        if (t->dims[d] != 1) return 0;
    return t->ndims == 0 || t->dims[t->ndims - 1] == n || t->dims[t->ndims - 1] == 1;
}

#endif
