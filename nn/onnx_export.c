/*
 * ONNX export: a net's inference graph written as an ONNX ModelProto in the
 * protobuf wire format (nn/protobuf.h), for onnxruntime and any other ONNX
 * consumer.
 *
 * Each dsrt layer becomes the node (or the few nodes) that compute what it
 * computes at inference: batch normalisation with its running statistics,
 * dropout left out, the softmax as the output "probabilities". The model
 * takes raw pixels ("pixels": float32 NCHW, 0 to 255, any batch size):
 * its first nodes are the pipeline's scaling to [0, 1] (x / 255, the same
 * division) and the input layer's normalisation (a x + o per channel, with
 * the a and o the backends compute, nn/arith.h), so that a runtime given a
 * file's pixels sees what dsrt's net saw. Weights are float32 raw_data in
 * the flat buffer's layout, which is ONNX's (convolution weights (M, C/g,
 * kH, kW); Gemm's B transposed, (N, K) with K in C, H, W order), so an
 * import gives them back bit for bit. Class names go into metadata_props.
 */
#include "nn/arith.h"
#include "nn/onnx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPSET_MIN 7
#define OPSET_MAX 21

dsrt_onnx_export_options dsrt_onnx_export_defaults(void) {
    dsrt_onnx_export_options o;
    memset(&o, 0, sizeof o);
    o.opset = 13;
    o.input_scale = 1.0 / 255.0;
    return o;
}

/* The IR version that goes with an opset (onnx's versioning table). */
static int64_t ir_for(int opset) {
    static const int64_t ir[] = {3, 3, 4, 5, 6, 7, 7, 7, 8, 8, 8, 8, 9, 9, 10};
    return ir[opset - OPSET_MIN];
}

// ----------------------------------------------------------------------------
// Writing nodes and tensors

typedef struct {
    const dsrt_net *net;
    int opset;
    dsrt_pb_writer nodes, inits, init_inputs; /* graph fields, in three runs */
    char (*value)[DSRT_LAYER_NAME_MAX + 16];  /* (n_layers) each layer's ONNX output */
    int *rank;                                /* (n_layers) 2: (N, K), 4: (N, C, H, W) */
    int aux;                                  /* auxiliary names made */
} exporter;

/* A node: op over inputs (n_in names) into out, named name, with its
 * attributes written by attrs (may be NULL) into the node's writer. */
typedef void (*attrs_fn)(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx);

static void node(exporter *e, const char *op, const char *name, const char *const *in, int n_in,
                 const char *out, attrs_fn attrs, const dsrt_layer *l, const void *ctx) {
    size_t m = dsrt__pb_begin(&e->nodes, 1);
    for (int k = 0; k < n_in; k++) dsrt__pb_put_string(&e->nodes, 1, in[k]);
    dsrt__pb_put_string(&e->nodes, 2, out);
    dsrt__pb_put_string(&e->nodes, 3, name);
    dsrt__pb_put_string(&e->nodes, 4, op);
    if (attrs) attrs(&e->nodes, l, ctx);
    dsrt__pb_end(&e->nodes, m);
}

static void attr_int(dsrt_pb_writer *w, const char *name, int64_t v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 2); /* INT */
    dsrt__pb_put_varint(w, 3, (uint64_t)v);
    dsrt__pb_end(w, m);
}

static void attr_float(dsrt_pb_writer *w, const char *name, float v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 1); /* FLOAT */
    dsrt__pb_put_float(w, 2, v);
    dsrt__pb_end(w, m);
}

static void attr_ints(dsrt_pb_writer *w, const char *name, const int64_t *v, size_t n) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 7); /* INTS */
    dsrt__pb_put_int64s(w, 8, v, n);
    dsrt__pb_end(w, m);
}

/* A graph input's or output's ValueInfoProto: a float tensor of dims (a
 * negative one is the symbolic "batch"). */
static void value_info(dsrt_pb_writer *w, int field, const char *name, const int64_t *dims, int n,
                       int elem) {
    size_t m = dsrt__pb_begin(w, field);
    dsrt__pb_put_string(w, 1, name);
    size_t t = dsrt__pb_begin(w, 2);  /* TypeProto */
    size_t tt = dsrt__pb_begin(w, 1); /* .tensor_type */
    dsrt__pb_put_varint(w, 1, (uint64_t)elem);
    size_t sh = dsrt__pb_begin(w, 2); /* .shape */
    for (int i = 0; i < n; i++) {
        size_t d = dsrt__pb_begin(w, 1); /* .dim */
        if (dims[i] < 0)
            dsrt__pb_put_string(w, 2, "batch");
        else
            dsrt__pb_put_varint(w, 1, (uint64_t)dims[i]);
        dsrt__pb_end(w, d);
    }
    dsrt__pb_end(w, sh);
    dsrt__pb_end(w, tt);
    dsrt__pb_end(w, t);
    dsrt__pb_end(w, m);
}

/* An initializer: float32 (dtype 1) or int64 (7) values as raw_data. */
static void tensor(exporter *e, const char *name, const int64_t *dims, int n, int dtype,
                   const void *data, size_t bytes) {
    size_t m = dsrt__pb_begin(&e->inits, 5);
    dsrt__pb_put_int64s(&e->inits, 1, dims, (size_t)n);
    dsrt__pb_put_varint(&e->inits, 2, (uint64_t)dtype);
    dsrt__pb_put_string(&e->inits, 8, name);
    dsrt__pb_put_bytes(&e->inits, 9, data, bytes);
    dsrt__pb_end(&e->inits, m);
    if (ir_for(e->opset) < 4) /* IR 3: every initializer is a graph input too */
        value_info(&e->init_inputs, 11, name, dims, n, dtype);
}

static void floats(exporter *e, const char *name, const int64_t *dims, int n, const float *v) {
    size_t count = 1;
    for (int i = 0; i < n; i++) count *= (size_t)dims[i];
    tensor(e, name, dims, n, 1, v, count * sizeof(float));
}

/* A name of its own for an auxiliary value or node: "<layer>.<what>". */
static void aux_name(char *out, size_t cap, const dsrt_layer *l, const char *what) {
    snprintf(out, cap, "%s.%s", l->name, what);
}

// ----------------------------------------------------------------------------
// Layers

static void conv_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    int64_t k[2] = {l->o.kh, l->o.kw}, s[2] = {l->o.sh, l->o.sw}, d[2] = {l->o.dh, l->o.dw};
    int64_t p[4] = {l->pt, l->pl, l->pb, l->pr};
    attr_ints(w, "kernel_shape", k, 2);
    attr_ints(w, "strides", s, 2);
    attr_ints(w, "pads", p, 4);
    if (l->kind == DSRT_LAYER_CONV) {
        attr_ints(w, "dilations", d, 2);
        attr_int(w, "group", l->o.groups);
    }
    if (l->kind == DSRT_LAYER_AVGPOOL) attr_int(w, "count_include_pad", l->o.count_pad);
}

static void bn_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    attr_float(w, "epsilon", l->o.eps);
    attr_float(w, "momentum", 1.0f - l->o.momentum);
}

static void leaky_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    attr_float(w, "alpha", l->o.leak);
}

static void lrn_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    attr_int(w, "size", l->o.lrn_size);
    attr_float(w, "alpha", l->o.alpha);
    attr_float(w, "beta", l->o.beta);
    attr_float(w, "bias", l->o.k);
}

static void axis1_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    attr_int(w, "axis", 1);
}

static void gemm_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    attr_int(w, "transB", 1);
}

/* Layer j's output as the rank a node needs: 4 (a (k, 1, 1) value reshaped
 * from (N, K)) or 2 (flattened). Returns the name to take. */
static const char *as_rank(exporter *e, const dsrt_layer *l, int j, int rank, char *buf,
                           size_t cap) {
    if (e->rank[j] == rank) return e->value[j];
    const dsrt_layer *src = &e->net->layers[j];
    char nm[DSRT_LAYER_NAME_MAX + 32];
    snprintf(buf, cap, "%s.%s%d", l->name, rank == 2 ? "flat" : "image", ++e->aux);
    if (rank == 2) {
        const char *in[1] = {e->value[j]};
        aux_name(nm, sizeof nm, l, rank == 2 ? "flatten" : "reshape");
        snprintf(nm + strlen(nm), sizeof nm - strlen(nm), "%d", e->aux);
        node(e, "Flatten", nm, in, 1, buf, axis1_attrs, l, NULL);
        return buf;
    }
    char shape[DSRT_LAYER_NAME_MAX + 32];
    snprintf(shape, sizeof shape, "%s.shape%d", l->name, e->aux);
    int64_t dims[1] = {4}, v[4] = {0, src->out.c, src->out.h, src->out.w};
    tensor(e, shape, dims, 1, 7, v, sizeof v);
    const char *in[2] = {e->value[j], shape};
    snprintf(nm, sizeof nm, "%s.reshape%d", l->name, e->aux);
    node(e, "Reshape", nm, in, 2, buf, NULL, l, NULL);
    return buf;
}

/* The input: pixels / 255 (or * scale), then a x + o per channel. out is
 * the name of the value it leaves. */
static int export_input(exporter *e, const dsrt_layer *l, double input_scale, char *out) {
    const float *state = e->net->state;
    int ch = l->out.c;
    const char *cur = "pixels";
    int64_t one[1] = {1};
    if (fabs(input_scale * 255.0 - 1.0) < 1e-12) {
        float v = 255.0f;
        floats(e, "pixels.divisor", one, 0, &v);
        const char *in[2] = {cur, "pixels.divisor"};
        node(e, "Div", "pixels.scale", in, 2, "pixels.scaled", NULL, l, NULL);
    } else {
        float v = (float)input_scale;
        floats(e, "pixels.factor", one, 0, &v);
        const char *in[2] = {cur, "pixels.factor"};
        node(e, "Mul", "pixels.scale", in, 2, "pixels.scaled", NULL, l, NULL);
    }
    cur = "pixels.scaled";
    if (l->o.norm != DSRT_NORM_NONE) {
        float *av = dsrt__calloc(2 * (size_t)ch, sizeof *av);
        if (!av) return -ENOMEM;
        for (int k = 0; k < ch; k++)
            dsrt_input_affine(l->o.norm, state + l->s_off, ch, k, &av[k], &av[ch + k]);
        int64_t dims[4] = {1, ch, 1, 1};
        floats(e, "input.scale", dims, 4, av);
        floats(e, "input.offset", dims, 4, av + ch);
        free(av);
        const char *in1[2] = {cur, "input.scale"}, *in2[2] = {"input.scaled", "input.offset"};
        node(e, "Mul", "input.normalise_scale", in1, 2, "input.scaled", NULL, l, NULL);
        node(e, "Add", "input.normalise_offset", in2, 2, "input.normalised", NULL, l, NULL);
        cur = "input.normalised";
    }
    snprintf(out, DSRT_LAYER_NAME_MAX + 16, "%s", cur);
    return 0;
}

/* A fully connected layer: Gemm, or before opset 11 without a bias, a
 * MatMul by the transposed weights. */
static int export_fc(exporter *e, int i, const dsrt_layer *l, char *out) {
    const float *params = e->net->params;
    char a[DSRT_LAYER_NAME_MAX + 32], b[DSRT_LAYER_NAME_MAX + 32], x0[DSRT_LAYER_NAME_MAX + 32];
    int j = l->inputs[0];
    const char *x = as_rank(e, l, j, 2, x0, sizeof x0);
    int64_t w[2] = {l->out.c, (int64_t)l->in.c * l->in.h * l->in.w}, bd[1] = {l->out.c};
    aux_name(a, sizeof a, l, "weight");
    aux_name(b, sizeof b, l, "bias");
    const char *in[3] = {x, a, b};
    e->rank[i] = 2;
    if (!l->b_n && e->opset < 11) {
        /* Gemm's C is optional from opset 11; before, a MatMul by the
         * transposed weights (a zero bias would come back as one). */
        size_t n = (size_t)w[0], k = (size_t)w[1];
        float *t = dsrt__malloc(n * k * sizeof *t);
        if (!t) return -ENOMEM;
        for (size_t r = 0; r < n; r++)
            for (size_t q = 0; q < k; q++) t[q * n + r] = params[l->w_off + r * k + q];
        int64_t tw[2] = {w[1], w[0]};
        floats(e, a, tw, 2, t);
        free(t);
        node(e, "MatMul", l->name, in, 2, out, NULL, l, NULL);
        return 0;
    }
    floats(e, a, w, 2, params + l->w_off);
    if (l->b_n) floats(e, b, bd, 1, params + l->b_off);
    node(e, "Gemm", l->name, in, l->b_n ? 3 : 2, out, gemm_attrs, l, NULL);
    return 0;
}

/* A sum or concatenation of inputs, every input at one rank (4 unless all
 * are flat). */
static int export_merge(exporter *e, int i, const dsrt_layer *l, char *out) {
    char c[DSRT_LAYER_NAME_MAX + 32], d[DSRT_LAYER_NAME_MAX + 32];
    int rank = 2;
    for (int k = 0; k < l->n_inputs; k++)
        if (e->rank[l->inputs[k]] == 4) rank = 4;
    char(*names)[DSRT_LAYER_NAME_MAX + 32] = dsrt__calloc((size_t)l->n_inputs, sizeof *names);
    const char **in = dsrt__calloc((size_t)l->n_inputs, sizeof *in);
    if (!names || !in) {
        free(names);
        free(in);
        return -ENOMEM;
    }
    for (int k = 0; k < l->n_inputs; k++)
        in[k] = as_rank(e, l, l->inputs[k], rank, names[k], sizeof names[k]);
    e->rank[i] = rank;
    if (l->kind == DSRT_LAYER_CONCAT) {
        node(e, "Concat", l->name, in, l->n_inputs, out, axis1_attrs, l, NULL);
    } else {
        /* The inputs summed in order, as the backends sum them. */
        const char *sum = in[0];
        for (int k = 1; k < l->n_inputs; k++) {
            int last = k == l->n_inputs - 1 && !l->o.relu;
            snprintf(c, sizeof c, "%s.sum%d", l->name, k);
            snprintf(d, sizeof d, "%s.add%d", l->name, k);
            const char *two[2] = {sum, in[k]};
            node(e, "Add", last ? l->name : d, two, 2, last ? out : c, NULL, l, NULL);
            snprintf(names[0], sizeof names[0], "%s", c);
            sum = names[0];
        }
        if (l->o.relu) {
            const char *one[1] = {sum};
            node(e, "Relu", l->name, one, 1, out, NULL, l, NULL);
        }
    }
    free(names);
    free(in);
    return 0;
}

static int export_layer(exporter *e, int i, double input_scale) {
    const dsrt_net *net = e->net;
    const dsrt_layer *l = &net->layers[i];
    const float *params = net->params, *state = net->state;
    char *out = e->value[i];
    char a[DSRT_LAYER_NAME_MAX + 32], b[DSRT_LAYER_NAME_MAX + 32], x0[DSRT_LAYER_NAME_MAX + 32];
    int j = l->inputs[0];
    snprintf(out, DSRT_LAYER_NAME_MAX + 16, "%s", l->name);
    e->rank[i] = 4;
    switch (l->kind) {
    case DSRT_LAYER_INPUT:
        return export_input(e, l, input_scale, out);
    case DSRT_LAYER_CONV: {
        const char *x = as_rank(e, l, j, 4, x0, sizeof x0);
        int64_t w[4] = {l->o.filters, l->in.c / l->o.groups, l->o.kh, l->o.kw}, bd[1] = {l->out.c};
        aux_name(a, sizeof a, l, "weight");
        aux_name(b, sizeof b, l, "bias");
        floats(e, a, w, 4, params + l->w_off);
        if (l->b_n) floats(e, b, bd, 1, params + l->b_off);
        const char *in[3] = {x, a, b};
        node(e, "Conv", l->name, in, l->b_n ? 3 : 2, out, conv_attrs, l, NULL);
        return 0;
    }
    case DSRT_LAYER_BATCHNORM: {
        int64_t dims[1] = {l->out.c};
        const char *what[4] = {"scale", "bias", "mean", "var"};
        const float *src[4] = {params + l->w_off, params + l->b_off, state + l->s_off,
                               state + l->s_off + l->out.c};
        char names[4][DSRT_LAYER_NAME_MAX + 32];
        const char *in[5] = {e->value[j], names[0], names[1], names[2], names[3]};
        for (int k = 0; k < 4; k++) {
            aux_name(names[k], sizeof names[k], l, what[k]);
            floats(e, names[k], dims, 1, src[k]);
        }
        node(e, "BatchNormalization", l->name, in, 5, out, bn_attrs, l, NULL);
        e->rank[i] = e->rank[j];
        return 0;
    }
    case DSRT_LAYER_RELU: {
        const char *in[1] = {e->value[j]};
        if (l->o.leak != 0.0f)
            node(e, "LeakyRelu", l->name, in, 1, out, leaky_attrs, l, NULL);
        else
            node(e, "Relu", l->name, in, 1, out, NULL, l, NULL);
        e->rank[i] = e->rank[j];
        return 0;
    }
    case DSRT_LAYER_MAXPOOL:
    case DSRT_LAYER_AVGPOOL: {
        const char *in[1] = {as_rank(e, l, j, 4, x0, sizeof x0)};
        node(e, l->kind == DSRT_LAYER_MAXPOOL ? "MaxPool" : "AveragePool", l->name, in, 1, out,
             conv_attrs, l, NULL);
        return 0;
    }
    case DSRT_LAYER_GAP: {
        const char *in[1] = {as_rank(e, l, j, 4, x0, sizeof x0)};
        node(e, "GlobalAveragePool", l->name, in, 1, out, NULL, l, NULL);
        return 0;
    }
    case DSRT_LAYER_FC:
        return export_fc(e, i, l, out);
    case DSRT_LAYER_DROPOUT: /* identity at inference */
        snprintf(out, DSRT_LAYER_NAME_MAX + 16, "%s", e->value[j]);
        e->rank[i] = e->rank[j];
        return 0;
    case DSRT_LAYER_LRN: {
        const char *in[1] = {as_rank(e, l, j, 4, x0, sizeof x0)};
        node(e, "LRN", l->name, in, 1, out, lrn_attrs, l, NULL);
        return 0;
    }
    case DSRT_LAYER_SOFTMAX: {
        const char *in[1] = {as_rank(e, l, j, 2, x0, sizeof x0)};
        snprintf(out, DSRT_LAYER_NAME_MAX + 16, "%s", "probabilities");
        node(e, "Softmax", l->name, in, 1, out, axis1_attrs, l, NULL);
        e->rank[i] = 2;
        return 0;
    }
    case DSRT_LAYER_ADD:
    case DSRT_LAYER_CONCAT:
        return export_merge(e, i, l, out);
    }
    return dsrt__fail(DSRT_EUNSUPPORTED, "onnx export: layer '%s' (%s): no ONNX form", l->name,
                      l->type);
}

// ----------------------------------------------------------------------------
// The model

/* The class names of the description's class lines, one a line. */
static char *class_list(const dsrt_net *net) {
    size_t k = strlen(DSRT_CLASS_LINE), n = 0;
    char *out = dsrt__malloc(strlen(net->desc) + 1);
    if (!out) return NULL;
    for (const char *line = net->desc; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len >= k && !memcmp(line, DSRT_CLASS_LINE, k)) {
            memcpy(out + n, line + k, len - k);
            n += len - k;
            out[n++] = '\n';
        }
        line += len + (end != NULL);
    }
    if (n) n--; /* no line break after the last */
    out[n] = '\0';
    return out;
}

static void meta(dsrt_pb_writer *w, const char *key, const char *value) {
    size_t m = dsrt__pb_begin(w, 14);
    dsrt__pb_put_string(w, 1, key);
    dsrt__pb_put_string(w, 2, value);
    dsrt__pb_end(w, m);
}

int dsrt_onnx_export(dsrt_net *net, const char *path, const dsrt_onnx_export_options *o) {
    dsrt_onnx_export_options defaults = dsrt_onnx_export_defaults();
    if (!o) o = &defaults;
    if (!net || !path) return dsrt__fail(-EINVAL, "onnx export: no net or path");
    if (o->opset < OPSET_MIN || o->opset > OPSET_MAX)
        return dsrt__fail(DSRT_EOPTION, "onnx export: opset %d: dsrt writes %d to %d", o->opset,
                          OPSET_MIN, OPSET_MAX);
    if (!(o->input_scale > 0) || !isfinite(o->input_scale))
        return dsrt__fail(DSRT_EOPTION, "onnx export: input scale %g: must be positive",
                          o->input_scale);
    int rc = dsrt__net_host(net, DSRT_BUF_PARAMS | DSRT_BUF_STATE);
    if (rc) return rc;
    exporter e;
    memset(&e, 0, sizeof e);
    e.net = net;
    e.opset = o->opset;
    e.value = dsrt__calloc((size_t)net->n_layers, sizeof *e.value);
    e.rank = dsrt__calloc((size_t)net->n_layers, sizeof *e.rank);
    dsrt_pb_writer w = {0};
    char *classes = class_list(net);
    if (!e.value || !e.rank || !classes) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < net->n_layers; i++)
        if ((rc = export_layer(&e, i, o->input_scale))) goto out;

    /* ModelProto: ir_version, producer, opset_import, graph, metadata. */
    char version[64];
    snprintf(version, sizeof version, "%s", dsrt_version_string());
    dsrt__pb_put_varint(&w, 1, (uint64_t)ir_for(o->opset));
    dsrt__pb_put_string(&w, 2, "dsrt");
    dsrt__pb_put_string(&w, 3, version);
    size_t op = dsrt__pb_begin(&w, 8);
    dsrt__pb_put_string(&w, 1, "");
    dsrt__pb_put_varint(&w, 2, (uint64_t)o->opset);
    dsrt__pb_end(&w, op);
    size_t g = dsrt__pb_begin(&w, 7);
    dsrt__pb_append(&w, e.nodes.buf, e.nodes.len);
    dsrt__pb_put_string(&w, 2, "dsrt");
    dsrt__pb_append(&w, e.inits.buf, e.inits.len);
    const dsrt_layer *in = &net->layers[0];
    int64_t idims[4] = {-1, in->out.c, in->out.h, in->out.w}, odims[2] = {-1, net->classes};
    value_info(&w, 11, "pixels", idims, 4, 1);
    dsrt__pb_append(&w, e.init_inputs.buf, e.init_inputs.len);
    value_info(&w, 12, "probabilities", odims, 2, 1);
    dsrt__pb_end(&w, g);
    if (*classes) meta(&w, "classes", classes);
    meta(&w, "dsrt.input",
         "pixels: float32 (N, C, H, W), values 0 to 255 as image files hold them");
    meta(&w, "dsrt.input_scale", "1"); /* for dsrt_onnx_import: it takes pixels as they are */
    if (w.failed || e.nodes.failed || e.inits.failed || e.init_inputs.failed) {
        rc = dsrt__fail(-ENOMEM, "onnx export: out of memory");
        goto out;
    }
    if ((rc = dsrt__write_file_atomic(path, w.buf, w.len)))
        dsrt__fail_prefix(rc, "onnx export: %s", path);
out:
    free(e.value);
    free(e.rank);
    free(e.nodes.buf);
    free(e.inits.buf);
    free(e.init_inputs.buf);
    free(w.buf);
    free(classes);
    return rc;
}
