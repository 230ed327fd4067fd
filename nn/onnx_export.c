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

void dsrt__onnx_node(onnx_export *e, const char *op, const char *name, const char *const *in,
                     int n_in, const char *out, dsrt_onnx_attrs_fn attrs, const dsrt_layer *l,
                     const void *ctx) {
    size_t m = dsrt__pb_begin(&e->nodes, 1);
    for (int k = 0; k < n_in; k++) dsrt__pb_put_string(&e->nodes, 1, in[k]);
    dsrt__pb_put_string(&e->nodes, 2, out);
    dsrt__pb_put_string(&e->nodes, 3, name);
    dsrt__pb_put_string(&e->nodes, 4, op);
    if (attrs) attrs(&e->nodes, l, ctx);
    dsrt__pb_end(&e->nodes, m);
}

void dsrt__onnx_attr_int(dsrt_pb_writer *w, const char *name, int64_t v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 2); /* INT */
    dsrt__pb_put_varint(w, 3, (uint64_t)v);
    dsrt__pb_end(w, m);
}

void dsrt__onnx_attr_float(dsrt_pb_writer *w, const char *name, float v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 1); /* FLOAT */
    dsrt__pb_put_float(w, 2, v);
    dsrt__pb_end(w, m);
}

void dsrt__onnx_attr_ints(dsrt_pb_writer *w, const char *name, const int64_t *v, size_t n) {
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
static void tensor(onnx_export *e, const char *name, const int64_t *dims, int n, int dtype,
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

void dsrt__onnx_floats(onnx_export *e, const char *name, const int64_t *dims, int n,
                       const float *v) {
    size_t count = 1;
    for (int i = 0; i < n; i++) count *= (size_t)dims[i];
    tensor(e, name, dims, n, 1, v, count * sizeof(float));
}

/* A name of its own for an auxiliary value or node: "<layer>.<what>". */
void dsrt__onnx_int64s(onnx_export *e, const char *name, const int64_t *dims, int n,
                       const int64_t *v) {
    size_t count = 1;
    for (int i = 0; i < n; i++) count *= (size_t)dims[i];
    tensor(e, name, dims, n, ONNX_INT64, v, count * sizeof(int64_t));
}

void dsrt__onnx_aux_name(char *out, size_t cap, const dsrt_layer *l, const char *what) {
    snprintf(out, cap, "%s.%s", l->name, what);
}

// ----------------------------------------------------------------------------
// Values at the rank a node needs

void dsrt__onnx_axis1_attrs(dsrt_pb_writer *w, const dsrt_layer *l, const void *ctx) {
    dsrt__onnx_attr_int(w, "axis", 1);
}

/* Layer j's output as the rank a node needs: 4 (a (k, 1, 1) value reshaped
 * from (N, K)) or 2 (flattened). Returns the name to take. */
const char *dsrt__onnx_as_rank(onnx_export *e, const dsrt_layer *l, int j, int rank, char *buf,
                               size_t cap) {
    if (e->rank[j] == rank) return e->value[j];
    const dsrt_layer *src = &e->net->layers[j];
    char nm[DSRT_LAYER_NAME_MAX + 32];
    snprintf(buf, cap, "%s.%s%d", l->name, rank == 2 ? "flat" : "image", ++e->aux);
    if (rank == 2) {
        const char *in[1] = {e->value[j]};
        dsrt__onnx_aux_name(nm, sizeof nm, l, rank == 2 ? "flatten" : "reshape");
        snprintf(nm + strlen(nm), sizeof nm - strlen(nm), "%d", e->aux);
        dsrt__onnx_node(e, "Flatten", nm, in, 1, buf, dsrt__onnx_axis1_attrs, l, NULL);
        return buf;
    }
    char shape[DSRT_LAYER_NAME_MAX + 32];
    snprintf(shape, sizeof shape, "%s.shape%d", l->name, e->aux);
    int64_t dims[1] = {4}, v[4] = {0, src->out.c, src->out.h, src->out.w};
    tensor(e, shape, dims, 1, 7, v, sizeof v);
    const char *in[2] = {e->value[j], shape};
    snprintf(nm, sizeof nm, "%s.reshape%d", l->name, e->aux);
    dsrt__onnx_node(e, "Reshape", nm, in, 2, buf, NULL, l, NULL);
    return buf;
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
    onnx_export e;
    memset(&e, 0, sizeof e);
    e.net = net;
    e.opset = o->opset;
    e.input_scale = o->input_scale;
    e.value = dsrt__calloc((size_t)net->n_layers, sizeof *e.value);
    e.rank = dsrt__calloc((size_t)net->n_layers, sizeof *e.rank);
    dsrt_pb_writer w = {0};
    char *classes = class_list(net);
    if (!e.value || !e.rank || !classes) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        const dsrt_layer_ops *ops = dsrt__layer_ops(l);
        snprintf(e.value[i], sizeof e.value[i], "%s", l->name);
        e.rank[i] = 4;
        if (!ops->onnx_export) {
            rc = dsrt__fail(DSRT_EUNSUPPORTED, "onnx export: layer '%s' (%s): no ONNX form",
                            l->name, l->type);
            goto out;
        }
        if ((rc = ops->onnx_export(&e, l, i, e.value[i]))) goto out;
    }

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
