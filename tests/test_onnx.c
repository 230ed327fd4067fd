/*
 * Tests of ONNX import and export that need nothing but dsrt: a net of every
 * layer type written out at several opsets and read back gives the same
 * parameters, state and predictions bit for bit (and its class names); models
 * written here byte by byte (the protobuf writer of nn/protobuf.h) hold their
 * weights in every storage the importer reads (raw_data, packed and unpacked
 * typed fields, float16 and bfloat16, external data at an offset past 2^31)
 * and give them back exactly; and the refusals: an unsupported operator or
 * opset, attributes and shapes dsrt would compute differently, every
 * truncation of a file, a length that lies, a tensor whose bytes do not fit
 * its shape, external data outside the model's folder (through a link too),
 * shorter than its tensor or cut short while it is read, thousands of nodes
 * of one name and more layers than a net may have, shapes too large for an
 * int, constants that ONNX broadcasts otherwise than one a channel, each with
 * a message naming the node or tensor. The activation operators in each of
 * their forms (Clip's bounds as attributes and as inputs, left out, 0 and
 * 6; HardSigmoid's defaults; Gelu's approximate) and their refusals. The
 * comparisons with onnxruntime are test_onnx_ref's.
 */
#include "nn/layers/eltwise.h"
#include "nn/onnx.h"
#include "task.h"
#include "testimg.h"

#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[512];

static void path_of(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

static dsrt_net_options one_thread(void) {
    dsrt_net_options o = dsrt_net_defaults();
    o.threads = 1;
    o.seed = 5;
    return o;
}

// ----------------------------------------------------------------------------
// Round trips

/* Every layer type and option that has an ONNX form, as a graph. */
static const char ALL_LAYERS[] =
    "input size=12x10x3 normalization=zscore mean=0.4,0.5,0.6 std=0.2,0.25,0.3\n"
    "conv name=c1 filters=6 size=3 pad=same\n"
    "batchnorm name=b1 eps=1e-3 momentum=0.2\n"
    "relu name=r1\n"
    "conv name=c2 filters=6 size=3x2 stride=2x1 dilation=2 pad=2,1,0,2 groups=3 bias=0\n"
    "leakyrelu name=l2 leak=0.2\n"
    "lrn name=n2 size=3 alpha=1e-2 beta=0.6 k=1.5\n"
    "maxpool name=p2 size=3 stride=2 pad=1\n"
    "conv name=c3 filters=6 size=1\n"
    "add name=s inputs=p2,c3 relu=1\n"
    "avgpool name=a1 size=3 stride=1 pad=1 count_pad=0 inputs=s\n"
    "avgpool name=a2 size=3 stride=1 pad=1 inputs=s\n"
    "concat name=j inputs=a1,a2\n"
    "gap name=g\n"
    "fc name=f1 outputs=8\n"
    "dropout name=d p=0.3\n"
    "batchnorm name=b2\n"
    "relu name=r2\n"
    "fc name=f2 outputs=classes bias=0\n"
    "softmax name=out\n"
    "# dsrt-class: cat\n# dsrt-class: dog\n# dsrt-class: a bird\n# dsrt-class: fish\n";

/* A net of ALL_LAYERS whose running statistics are not the initial ones. */
static dsrt_net *all_layers_net(const char *desc, int classes) {
    dsrt_net_options o = one_thread();
    dsrt_net *net;
    REQUIRE(dsrt_net_create(&net, desc, 0, 0, 0, classes, &o) == 0);
    size_t ns;
    float *st = dsrt_net_state(net, &ns);
    dsrt_rng r = dsrt_rng_init(9, 0, 0, 0);
    for (int i = 1; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->kind != DSRT_LAYER_BATCHNORM) continue;
        for (int k = 0; k < l->out.c; k++) {
            st[l->s_off + k] = (float)(dsrt_rng_uniform(&r) - 0.5);
            st[l->s_off + l->out.c + k] = (float)(0.5 + dsrt_rng_uniform(&r));
            net->params[l->w_off + k] = (float)(0.5 + dsrt_rng_uniform(&r));
            net->params[l->b_off + k] = (float)(dsrt_rng_uniform(&r) - 0.5);
        }
    }
    dsrt_net_params_changed(net);
    return net;
}

static void random_images(float *x, size_t n, uint64_t seed) {
    dsrt_rng r = dsrt_rng_init(seed, 1, 2, 3);
    for (size_t i = 0; i < n; i++) x[i] = (float)dsrt_rng_uniform(&r);
}

/* a and b: the same parameters and running statistics bit for bit (the
 * input layer's statistics may be written another way for the same
 * normalisation; a has `dropouts` dropout layers that b lacks), the same
 * probabilities on a batch. */
static void check_same_net(dsrt_net *a, dsrt_net *b, const char *what, int dropouts) {
    size_t na, nb, sa, sb;
    const float *pa = dsrt_net_params(a, &na), *pb = dsrt_net_params(b, &nb);
    const float *ta = dsrt_net_state(a, &sa), *tb = dsrt_net_state(b, &sb);
    CHECK_EQ(na, nb);
    CHECK_EQ(sa, sb);
    if (na != nb || sa != sb) return;
    size_t skip = a->layers[0].s_n; /* the input layer's statistics come first */
    if (memcmp(pa, pb, na * sizeof *pa) || memcmp(ta + skip, tb + skip, (sa - skip) * sizeof *ta)) {
        fprintf(stderr, "%s: the parameters or the running statistics differ\n", what);
        test_failures++;
    }
    dsrt_net_info ia, ib;
    dsrt_net_get_info(a, &ia);
    dsrt_net_get_info(b, &ib);
    CHECK_EQ(ia.layers - dropouts, ib.layers);
    CHECK_EQ(ia.classes, ib.classes);
    enum { N = 3 };
    size_t per = (size_t)ia.channels * ia.height * ia.width;
    float *x = malloc(N * per * sizeof *x), *ya = malloc(N * ia.classes * sizeof *ya),
          *yb = malloc(N * ia.classes * sizeof *yb);
    REQUIRE(x && ya && yb);
    random_images(x, N * per, 4);
    CHECK_OK(dsrt_net_predict(a, x, N, ya, NULL, NULL, NULL));
    CHECK_OK(dsrt_net_predict(b, x, N, yb, NULL, NULL, NULL));
    for (int i = 0; i < N * ia.classes; i++) CHECK(ya[i] == yb[i]);
    free(x), free(ya), free(yb);
}

static void test_round_trip(void) {
    static const int opsets[] = {7, 9, 11, 13, 17, 21};
    dsrt_net *net = all_layers_net(ALL_LAYERS, 4);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(opsets); k++) {
        char path[600], what[64];
        snprintf(what, sizeof what, "all.opset%d.onnx", opsets[k]);
        path_of(path, sizeof path, what);
        dsrt_onnx_export_options eo = dsrt_onnx_export_defaults();
        eo.opset = opsets[k];
        CHECK_OK(dsrt_onnx_export(net, path, &eo));
        dsrt_net_options no = one_thread();
        dsrt_net *back = NULL;
        CHECK_OK(dsrt_onnx_import(&back, path, NULL, &no));
        if (!back) continue;
        check_same_net(net, back, what, 1);
        /* The class names came back in order; add relu=1 is one layer. */
        char names[4][16];
        for (int c = 0; c < 4; c++) {
            const char *d = dsrt_net_description(back);
            int seen = 0;
            for (const char *p = d; (p = strstr(p, DSRT_CLASS_LINE)); p++)
                if (seen++ == c) sscanf(p + strlen(DSRT_CLASS_LINE), "%15[^\n]", names[c]);
        }
        CHECK_STR_EQ(names[0], "cat");
        CHECK_STR_EQ(names[2], "a bird");
        CHECK_CONTAINS(dsrt_net_description(back), "relu=1");
        CHECK_CONTAINS(dsrt_net_description(back), "count_pad=0");
        dsrt_net_destroy(back);
    }
    /* A net without input normalisation, and one whose input layer only
     * rescales: the exported model's x / 255 is dsrt's own. */
    const char *plain[] = {"input size=5x4x1\nconv filters=2 size=3\nrelu\nfc outputs=3\nsoftmax\n",
                           "input size=5x4x2 normalization=rescale-symmetric min=0.1 max=0.9\n"
                           "fc outputs=3\nsoftmax\n"};
    for (int k = 0; k < 2; k++) {
        dsrt_net_options no = one_thread();
        dsrt_net *a = NULL, *b = NULL;
        CHECK_OK(dsrt_net_create(&a, plain[k], 0, 0, 0, 3, &no));
        char path[600];
        path_of(path, sizeof path, "plain.onnx");
        CHECK_OK(dsrt_onnx_export(a, path, NULL));
        CHECK_OK(dsrt_onnx_import(&b, path, NULL, &no));
        if (a && b) check_same_net(a, b, plain[k], 0);
        if (b && k == 0) CHECK(!strstr(dsrt_net_description(b), "normalization"));
        dsrt_net_destroy(a);
        dsrt_net_destroy(b);
    }
    dsrt_net_destroy(net);
}

/* Every kind's example net, exported at two opsets (and at the first its
 * ONNX form reads back from, when that is later) and imported: the same
 * parameters, statistics and probabilities bit for bit (dropout, the
 * identity at inference, leaves no layer). Below that opset (silu: at
 * every one) the export, an expansion into other kinds' operators, is only
 * written (test_onnx_ref runs it in onnxruntime). */
static void test_layer_table(void) {
    static const int opsets[] = {11, 17};
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++) {
        const dsrt_layer_ops *o = dsrt__layers[k];
        if (!o->example) continue;
        dsrt_net *net = all_layers_net(o->example, 0);
        int dropouts = 0;
        for (int i = 0; i < net->n_layers; i++)
            dropouts += net->layers[i].kind == DSRT_LAYER_DROPOUT ||
                        net->layers[i].kind == DSRT_LAYER_STOCHASTIC_DEPTH;
        int from = o->onnx_round_trip;
        for (size_t v = 0; v <= DSRT_ARRAY_SIZE(opsets); v++) {
            int opset = v < DSRT_ARRAY_SIZE(opsets) ? opsets[v] : from;
            if (v == DSRT_ARRAY_SIZE(opsets) && from <= opsets[v - 1]) break;
            char path[600], what[96];
            snprintf(what, sizeof what, "%s.opset%d.onnx", o->name, opset);
            path_of(path, sizeof path, what);
            dsrt_onnx_export_options eo = dsrt_onnx_export_defaults();
            eo.opset = opset;
            CHECK_OK(dsrt_onnx_export(net, path, &eo));
            if (from < 0 || opset < from) continue;
            dsrt_net_options no = one_thread();
            dsrt_net *back = NULL;
            CHECK_OK(dsrt_onnx_import(&back, path, NULL, &no));
            if (back) check_same_net(net, back, what, dropouts);
            dsrt_net_destroy(back);
        }
        dsrt_net_destroy(net);
    }
}

// ----------------------------------------------------------------------------
// Models written byte by byte

static void attr_ints(dsrt_pb_writer *w, const char *name, const int64_t *v, int n) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 7);
    dsrt__pb_put_int64s(w, 8, v, (size_t)n);
    dsrt__pb_end(w, m);
}

static void attr_int(dsrt_pb_writer *w, const char *name, int64_t v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 2);
    dsrt__pb_put_varint(w, 3, (uint64_t)v);
    dsrt__pb_end(w, m);
}

/* A node; ins and outs are comma-separated names ("" for none); attrs
 * (may be NULL) writes its attributes. */
static void add_node(dsrt_pb_writer *g, const char *op, const char *name, const char *ins,
                     const char *outs, void (*attrs)(dsrt_pb_writer *)) {
    size_t m = dsrt__pb_begin(g, 1);
    const char *lists[2] = {ins, outs};
    for (int k = 0; k < 2; k++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", lists[k]);
        for (char *p = buf; *p;) {
            char *e = strchr(p, ',');
            if (e) *e = '\0';
            dsrt__pb_put_string(g, (uint32_t)(k + 1), p);
            if (!e) break;
            p = e + 1;
        }
    }
    dsrt__pb_put_string(g, 3, name);
    dsrt__pb_put_string(g, 4, op);
    if (attrs) attrs(g);
    dsrt__pb_end(g, m);
}

static void value_info(dsrt_pb_writer *g, int field, const char *name, const int64_t *dims, int n) {
    size_t m = dsrt__pb_begin(g, (uint32_t)field);
    dsrt__pb_put_string(g, 1, name);
    size_t t = dsrt__pb_begin(g, 2), tt = dsrt__pb_begin(g, 1);
    dsrt__pb_put_varint(g, 1, 1);
    size_t sh = dsrt__pb_begin(g, 2);
    for (int i = 0; i < n; i++) {
        size_t d = dsrt__pb_begin(g, 1);
        if (dims[i] < 0)
            dsrt__pb_put_string(g, 2, "N");
        else
            dsrt__pb_put_varint(g, 1, (uint64_t)dims[i]);
        dsrt__pb_end(g, d);
    }
    dsrt__pb_end(g, sh);
    dsrt__pb_end(g, tt);
    dsrt__pb_end(g, t);
    dsrt__pb_end(g, m);
}

/* How a test tensor stores its values. */
typedef enum {
    ST_RAW,          /* float32 raw_data */
    ST_PACKED,       /* float_data, packed */
    ST_UNPACKED,     /* float_data, one field a value */
    ST_F16_RAW,      /* float16 raw_data */
    ST_F16_INT32,    /* float16 bits in int32_data */
    ST_BF16_RAW,     /* bfloat16 raw_data */
    ST_BF16_INT32,   /* bfloat16 bits in int32_data */
    ST_EXTERNAL,     /* float32 in w.bin at offset 16 */
    ST_EXTERNAL_FAR, /* float32 in far.bin at offset 3 GiB (a sparse file) */
    ST_COUNT,
} storage;

static uint16_t to_half(float f) { /* exact for the values used: k / 8, |k| < 64 */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if ((u & 0x7fffffff) == 0) return (uint16_t)sign;
    return (uint16_t)(sign | (uint32_t)e << 10 | ((u >> 13) & 0x3ff));
}

static void tensor(dsrt_pb_writer *g, const char *name, const int64_t *dims, int n, const float *v,
                   storage st) {
    size_t count = 1;
    for (int i = 0; i < n; i++) count *= (size_t)dims[i];
    size_t m = dsrt__pb_begin(g, 5);
    dsrt__pb_put_int64s(g, 1, dims, (size_t)n);
    int f16 = st == ST_F16_RAW || st == ST_F16_INT32,
        bf16 = st == ST_BF16_RAW || st == ST_BF16_INT32;
    dsrt__pb_put_varint(g, 2, f16 ? 10 : bf16 ? 16 : 1);
    dsrt__pb_put_string(g, 8, name);
    uint16_t h[128];
    REQUIRE(count <= 128);
    for (size_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        h[i] = f16 ? to_half(v[i]) : (uint16_t)(u >> 16);
    }
    switch (st) {
    case ST_RAW:
        dsrt__pb_put_bytes(g, 9, v, count * 4);
        break;
    case ST_PACKED:
        dsrt__pb_put_bytes(g, 4, v, count * 4);
        break;
    case ST_UNPACKED:
        for (size_t i = 0; i < count; i++) dsrt__pb_put_float(g, 4, v[i]);
        break;
    case ST_F16_RAW:
    case ST_BF16_RAW:
        dsrt__pb_put_bytes(g, 9, h, count * 2);
        break;
    case ST_F16_INT32:
    case ST_BF16_INT32:
        for (size_t i = 0; i < count; i++) dsrt__pb_put_varint(g, 5, h[i]);
        break;
    case ST_EXTERNAL:
    case ST_EXTERNAL_FAR: {
        int far = st == ST_EXTERNAL_FAR;
        char path[600], off[32], len[32];
        path_of(path, sizeof path, far ? "far.bin" : "w.bin");
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        REQUIRE(fd >= 0);
        off_t at = far ? ((off_t)3 << 30) : 16;
        REQUIRE(pwrite(fd, v, count * 4, at) == (ssize_t)(count * 4));
        close(fd);
        snprintf(off, sizeof off, "%lld", (long long)at);
        snprintf(len, sizeof len, "%zu", count * 4);
        const char *kv[3][2] = {
            {"location", far ? "far.bin" : "w.bin"}, {"offset", off}, {"length", len}};
        for (int k = 0; k < 3; k++) {
            size_t e = dsrt__pb_begin(g, 13);
            dsrt__pb_put_string(g, 1, kv[k][0]);
            dsrt__pb_put_string(g, 2, kv[k][1]);
            dsrt__pb_end(g, e);
        }
        dsrt__pb_put_varint(g, 14, 1);
        break;
    }
    default:
        break;
    }
    dsrt__pb_end(g, m);
}

/* The model around a graph's fields. */
static uint8_t *model(dsrt_pb_writer *g, int opset, size_t *size) {
    dsrt_pb_writer w = {0};
    dsrt__pb_put_varint(&w, 1, 7);
    dsrt__pb_put_string(&w, 2, "test_onnx");
    size_t o = dsrt__pb_begin(&w, 8);
    dsrt__pb_put_string(&w, 1, "");
    dsrt__pb_put_varint(&w, 2, (uint64_t)opset);
    dsrt__pb_end(&w, o);
    size_t m = dsrt__pb_begin(&w, 7);
    dsrt__pb_append(&w, g->buf, g->len);
    dsrt__pb_end(&w, m);
    REQUIRE(!w.failed && !g->failed);
    free(g->buf);
    memset(g, 0, sizeof *g);
    *size = w.len;
    return w.buf;
}

/* The weights of the small conv model: exact in float16 and bfloat16. */
static float conv_w(int i) {
    return (float)((i * 7) % 17 - 8) / 8.0f;
}

static void conv_pads(dsrt_pb_writer *w) {
    int64_t p[4] = {1, 0, 0, 1};
    attr_ints(w, "pads", p, 4);
}

static void trans_b(dsrt_pb_writer *w) {
    attr_int(w, "transB", 1);
}

/* image (N, 2, 3, 3) -> Conv (3, 2, 2, 2) with pads -> Flatten -> Gemm ->
 * scores (N, 4). The conv weights stored as st. */
static uint8_t *conv_model(storage st, int opset, size_t *size) {
    dsrt_pb_writer g = {0};
    float w[24], b[3] = {0.5f, -0.25f, 1.0f}, fw[4 * 27], fb[4] = {0, 0.125f, -0.125f, 0};
    for (int i = 0; i < 24; i++) w[i] = conv_w(i);
    for (int i = 0; i < 4 * 27; i++) fw[i] = (float)((i * 5) % 11 - 5) / 16.0f;
    add_node(&g, "Conv", "conv", "image,w,b", "c", conv_pads);
    add_node(&g, "Relu", "relu", "c", "r", NULL);
    add_node(&g, "Flatten", "flat", "r", "f", NULL);
    add_node(&g, "Gemm", "gemm", "f,fw,fb", "scores", trans_b);
    int64_t wd[4] = {3, 2, 2, 2}, bd[1] = {3}, fwd[2] = {4, 27}, fbd[1] = {4};
    tensor(&g, "w", wd, 4, w, st);
    tensor(&g, "b", bd, 1, b, ST_RAW);
    tensor(&g, "fw", fwd, 2, fw, ST_RAW);
    tensor(&g, "fb", fbd, 1, fb, ST_PACKED);
    int64_t in[4] = {-1, 2, 3, 3}, out[2] = {-1, 4};
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, opset, size);
}

static int import_bytes(dsrt_net **net, const uint8_t *data, size_t size) {
    dsrt_net_options no = one_thread();
    return dsrt__onnx_import_memory(net, data, size, "test.onnx", dir, 0, NULL, &no);
}

static void test_storages(void) {
    for (int st = 0; st < ST_COUNT; st++) {
        size_t size;
        uint8_t *m = conv_model((storage)st, 13, &size);
        dsrt_net *net = NULL;
        int rc = import_bytes(&net, m, size);
        if (rc) fprintf(stderr, "storage %d: %s\n", st, dsrt_last_error());
        CHECK_EQ(rc, 0);
        if (net) {
            const dsrt_layer *c = &net->layers[1];
            CHECK_STR_EQ(c->type, "conv");
            CHECK_EQ(c->w_n, 24);
            for (int i = 0; i < 24; i++) CHECK(net->params[c->w_off + i] == conv_w(i));
            CHECK(net->params[c->b_off + 1] == -0.25f);
            /* pads [top 1, left 0, bottom 0, right 1]: 3x3 -> 3x3 */
            CHECK_EQ(c->pt, 1);
            CHECK_EQ(c->pb, 0);
            CHECK_EQ(c->pl, 0);
            CHECK_EQ(c->pr, 1);
            CHECK_EQ(net->classes, 4);
            CHECK_STR_EQ(net->layers[net->n_layers - 1].type, "softmax");
        }
        dsrt_net_destroy(net);
        free(m);
    }
    char far[600];
    path_of(far, sizeof far, "far.bin");
    unlink(far);
}

// ----------------------------------------------------------------------------
// Refusals

/* Imports data and checks the code and that the message holds each of the
 * NULL-terminated needles. */
static void refused(const uint8_t *data, size_t size, int code, ...) {
    dsrt_net *net = NULL;
    int rc = import_bytes(&net, data, size);
    CHECK_EQ(rc, code);
    CHECK(net == NULL);
    va_list ap;
    va_start(ap, code);
    for (const char *n; (n = va_arg(ap, const char *));) CHECK_CONTAINS(dsrt_last_error(), n);
    va_end(ap);
    dsrt_net_destroy(net);
}

/* A one-layer model around a node of op with the given attributes. */
static uint8_t *one_node(const char *op, void (*attrs)(dsrt_pb_writer *), int opset, size_t *size) {
    dsrt_pb_writer g = {0};
    add_node(&g, op, "the_node", "image", "x", attrs);
    add_node(&g, "Flatten", "flat", "x", "scores", NULL);
    int64_t in[4] = {1, 2, 4, 4}, out[2] = {1, 32};
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, opset, size);
}

static void pool_dilated(dsrt_pb_writer *w) {
    int64_t k[2] = {2, 2}, d[2] = {2, 2};
    attr_ints(w, "kernel_shape", k, 2);
    attr_ints(w, "dilations", d, 2);
}

static void unknown_attr(dsrt_pb_writer *w) {
    int64_t k[2] = {2, 2};
    attr_ints(w, "kernel_shape", k, 2);
    attr_int(w, "frobnicate", 1);
}

static void flatten_axis2(dsrt_pb_writer *w) {
    attr_int(w, "axis", 2);
}

static void test_refusals(void) {
    size_t size;
    uint8_t *m;
    /* Operators and opsets. */
    m = one_node("Tanh", NULL, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "node 0 'the_node' (Tanh, opset 13)",
            "operator 'Tanh' is not supported", NULL);
    free(m);
    m = one_node("Pad", NULL, 11, &size);
    refused(m, size, DSRT_ECORRUPT, "(Pad, opset 11)", "its pads input is missing", NULL);
    free(m);
    for (int opset = 6; opset <= 22; opset += 16) {
        m = conv_model(ST_RAW, opset, &size);
        char want[64];
        snprintf(want, sizeof want, "opset %d: dsrt imports opsets 7 to 21", opset);
        refused(m, size, DSRT_EUNSUPPORTED, want, NULL);
        free(m);
    }
    /* Attributes dsrt would compute differently. */
    m = one_node("MaxPool", pool_dilated, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "(MaxPool, opset 13)", "dilations 2x2", NULL);
    free(m);
    m = one_node("MaxPool", unknown_attr, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "attribute 'frobnicate' is not supported", NULL);
    free(m);
    m = one_node("Flatten", flatten_axis2, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "(Flatten, opset 13)", "axis 2", NULL);
    free(m);

    /* A Softmax inside the net, an Add of a constant, a graph out of order. */
    dsrt_pb_writer g = {0};
    int64_t in[4] = {1, 2, 3, 3}, out[2] = {1, 18}, od[1] = {18};
    float ones[18];
    for (int i = 0; i < 18; i++) ones[i] = 1;
    add_node(&g, "Flatten", "f", "image", "x", NULL);
    add_node(&g, "Softmax", "sm", "x", "y", NULL);
    add_node(&g, "Relu", "r", "y", "scores", NULL);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'sm' (Softmax", "the network's output", NULL);
    free(m);
    add_node(&g, "Relu", "r0", "image", "a", NULL);
    add_node(&g, "Flatten", "f", "a", "x", NULL);
    add_node(&g, "Add", "plus", "x,k", "scores", NULL);
    tensor(&g, "k", od, 1, ones, ST_RAW);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'plus' (Add", "constant 'k'", NULL);
    free(m);
    add_node(&g, "Flatten", "f", "a", "scores", NULL);
    add_node(&g, "Relu", "r0", "image", "a", NULL);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_ECORRUPT, "topological order", NULL);
    free(m);

    /* A tensor whose bytes do not fit its shape, and one whose shape does
     * not fit the layer. */
    float w[24] = {0};
    int64_t wrong[4] = {3, 2, 2, 2};
    add_node(&g, "Conv", "conv", "image,w", "c", NULL);
    add_node(&g, "Flatten", "flat", "c", "scores", NULL);
    size_t t = dsrt__pb_begin(&g, 5);
    dsrt__pb_put_int64s(&g, 1, wrong, 4);
    dsrt__pb_put_varint(&g, 2, 1);
    dsrt__pb_put_string(&g, 8, "w");
    dsrt__pb_put_bytes(&g, 9, w, 20 * 4);
    dsrt__pb_end(&g, t);
    int64_t o2[2] = {1, 12};
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", o2, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_ECORRUPT, "initializer 0 'w'",
            "raw_data has 80 bytes; its shape makes 24 float values, 96 bytes", NULL);
    free(m);
    int64_t three[4] = {3, 3, 2, 2};
    float w36[36] = {0};
    add_node(&g, "Conv", "conv", "image,w", "c", NULL);
    add_node(&g, "Flatten", "flat", "c", "scores", NULL);
    tensor(&g, "w", three, 4, w36, ST_RAW);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", o2, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_ECORRUPT, "'conv' (Conv, opset 13)", "weight 'w' (3, 3, 2, 2)",
            "do not fit 2 input channels", NULL);
    free(m);

    /* Every truncation of a good model is refused, none crashes. */
    m = conv_model(ST_RAW, 13, &size);
    int accepted = 0;
    for (size_t n = 0; n < size; n++) {
        dsrt_net *net = NULL;
        int rc = import_bytes(&net, m, n);
        if (rc == 0) accepted++;
        CHECK(rc == 0 || rc == DSRT_ECORRUPT || rc == DSRT_ETRUNCATED || rc == DSRT_EFORMAT ||
              rc == DSRT_EUNSUPPORTED);
        dsrt_net_destroy(net);
    }
    CHECK_EQ(accepted, 0);
    refused(m, size / 2, DSRT_ECORRUPT, "onnx: test.onnx", NULL);
    /* A length that lies: the graph's length a byte longer than the file. */
    size_t at = 0;
    while (at < size && m[at] != (7 << 3 | 2)) at++; /* the graph's tag */
    REQUIRE(at < size);
    m[at + 1]++;
    refused(m, size, DSRT_ECORRUPT, "field 7 says it has", "left in its message", NULL);
    m[at + 1]--;
    /* Bytes that are no protobuf at all. */
    static const uint8_t junk[] = "this is not a model\n";
    refused(junk, sizeof junk - 1, DSRT_ECORRUPT, "onnx: test.onnx", NULL);
    free(m);
}

/* External data must lie in the model's folder and fit its file. */
static void test_external_refusals(void) {
    static const struct {
        const char *location, *offset, *length, *why;
    } cases[] = {
        {"../w.bin", "0", "96", "a location with '..' is refused"},
        {"sub/../../w.bin", "0", "96", "a location with '..' is refused"},
        {"/etc/passwd", "0", "96", "only a path relative to the model's folder"},
        {"missing.bin", "0", "96", "No such file"},
        {"w.bin", "0", "95", "external data 'w.bin'"},
        {"w.bin", "200", "96", "offset 200"},
        {"w.bin", "18446744073709551615", "96", "offset"},
        {"w.bin", "1x", "96", "'1x' is not a number"},
    };
    float w[24] = {0};
    char path[600];
    path_of(path, sizeof path, "w.bin");
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(w, 4, 24, f) == 24 && fwrite(w, 4, 24, f) == 24);
    fclose(f);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        dsrt_pb_writer g = {0};
        add_node(&g, "Conv", "conv", "image,w", "c", NULL);
        add_node(&g, "Flatten", "flat", "c", "scores", NULL);
        int64_t wd[4] = {3, 2, 2, 2}, in[4] = {1, 2, 3, 3}, out[2] = {1, 12};
        size_t t = dsrt__pb_begin(&g, 5);
        dsrt__pb_put_int64s(&g, 1, wd, 4);
        dsrt__pb_put_varint(&g, 2, 1);
        dsrt__pb_put_string(&g, 8, "w");
        const char *kv[3][2] = {{"location", cases[k].location},
                                {"offset", cases[k].offset},
                                {"length", cases[k].length}};
        for (int i = 0; i < 3; i++) {
            size_t e = dsrt__pb_begin(&g, 13);
            dsrt__pb_put_string(&g, 1, kv[i][0]);
            dsrt__pb_put_string(&g, 2, kv[i][1]);
            dsrt__pb_end(&g, e);
        }
        dsrt__pb_put_varint(&g, 14, 1);
        dsrt__pb_end(&g, t);
        value_info(&g, 11, "image", in, 4);
        value_info(&g, 12, "scores", out, 2);
        size_t size;
        uint8_t *m = model(&g, 13, &size);
        dsrt_net *net = NULL;
        int rc = import_bytes(&net, m, size);
        CHECK(rc != 0);
        CHECK(net == NULL);
        CHECK_CONTAINS(dsrt_last_error(), cases[k].why);
        dsrt_net_destroy(net);
        free(m);
    }
}

// ----------------------------------------------------------------------------
// External data: links, short files, files that change

/* A tensor whose values are external data at location (offset and length
 * may be NULL: not given). */
static void ext_tensor(dsrt_pb_writer *g, const char *name, const int64_t *dims, int n,
                       const char *location, const char *offset, const char *length) {
    size_t t = dsrt__pb_begin(g, 5);
    dsrt__pb_put_int64s(g, 1, dims, (size_t)n);
    dsrt__pb_put_varint(g, 2, 1);
    dsrt__pb_put_string(g, 8, name);
    const char *kv[3][2] = {{"location", location}, {"offset", offset}, {"length", length}};
    for (int i = 0; i < 3; i++) {
        if (!kv[i][1]) continue;
        size_t e = dsrt__pb_begin(g, 13);
        dsrt__pb_put_string(g, 1, kv[i][0]);
        dsrt__pb_put_string(g, 2, kv[i][1]);
        dsrt__pb_end(g, e);
    }
    dsrt__pb_put_varint(g, 14, 1);
    dsrt__pb_end(g, t);
}

/* image (N, 2, 3, 3) -> Conv with weights (3, 2, 2, 2) as external data ->
 * Flatten -> scores (N, 12). */
static uint8_t *ext_conv_model(const char *location, const char *offset, const char *length,
                               size_t *size) {
    dsrt_pb_writer g = {0};
    add_node(&g, "Conv", "conv", "image,w", "c", NULL);
    add_node(&g, "Flatten", "flat", "c", "scores", NULL);
    int64_t wd[4] = {3, 2, 2, 2}, in[4] = {1, 2, 3, 3}, out[2] = {1, 12};
    ext_tensor(&g, "w", wd, 4, location, offset, length);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, 13, size);
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, n, f) == n);
    fclose(f);
}

static void relink(const char *target, const char *path) {
    unlink(path);
    REQUIRE(symlink(target, path) == 0);
}

/* A link that leaves the model's folder (to a file, or a folder on the
 * way) is refused naming it; a link inside the folder is followed. */
static void test_external_links(void) {
    char folder[600], outside[600], p[700];
    path_of(folder, sizeof folder, "linked");
    path_of(outside, sizeof outside, "outside");
    mkdir(folder, 0755);
    mkdir(outside, 0755);
    float w[24], secret[24];
    for (int i = 0; i < 24; i++) w[i] = conv_w(i), secret[i] = 7.0f;
    snprintf(p, sizeof p, "%s/secret.bin", outside);
    write_file(p, secret, sizeof secret);
    snprintf(p, sizeof p, "%s/w.bin", folder);
    write_file(p, w, sizeof w);
    snprintf(p, sizeof p, "%s/link.bin", folder);
    relink("../outside/secret.bin", p);
    snprintf(p, sizeof p, "%s/dir", folder);
    relink("../outside", p);
    snprintf(p, sizeof p, "%s/inner.bin", folder);
    relink("w.bin", p);
    snprintf(p, sizeof p, "%s/loop.bin", folder);
    relink("loop.bin", p);
    static const struct {
        const char *location, *why;
    } refusals[] = {
        {"link.bin", "external data 'link.bin' lies outside the model's folder"},
        {"dir/secret.bin", "external data 'dir/secret.bin' lies outside the model's folder"},
        {"loop.bin", "external data 'loop.bin'"},
    };
    dsrt_net_options no = one_thread();
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(refusals); k++) {
        size_t size;
        uint8_t *m = ext_conv_model(refusals[k].location, NULL, NULL, &size);
        dsrt_net *net = NULL;
        int rc = dsrt__onnx_import_memory(&net, m, size, "test.onnx", folder, 0, NULL, &no);
        CHECK(rc != 0);
        CHECK(net == NULL);
        CHECK_CONTAINS(dsrt_last_error(), "node 0 'conv' (Conv, opset 13): tensor 'w'");
        CHECK_CONTAINS(dsrt_last_error(), refusals[k].why);
        dsrt_net_destroy(net);
        free(m);
    }
    /* The model's folder reached through a link of its own is the folder. */
    char via[600];
    path_of(via, sizeof via, "via");
    relink("linked", via);
    const char *folders[2] = {folder, via};
    for (int k = 0; k < 2; k++) {
        size_t size;
        uint8_t *m = ext_conv_model("inner.bin", NULL, NULL, &size);
        dsrt_net *net = NULL;
        CHECK_OK(dsrt__onnx_import_memory(&net, m, size, "test.onnx", folders[k], 0, NULL, &no));
        if (net)
            for (int i = 0; i < 24; i++)
                CHECK(net->params[net->layers[1].w_off + (size_t)i] == conv_w(i));
        dsrt_net_destroy(net);
        free(m);
    }
}

/* External data shorter than its tensor is refused naming the file. */
static void test_external_short(void) {
    char p[600];
    float w[24] = {0};
    path_of(p, sizeof p, "short.bin");
    write_file(p, w, 50);
    const char *lengths[2] = {NULL, "96"};
    for (int k = 0; k < 2; k++) {
        size_t size;
        uint8_t *m = ext_conv_model("short.bin", "0", lengths[k], &size);
        refused(m, size, DSRT_ECORRUPT, "tensor 'w': external data 'short.bin'", "file of 50",
                NULL);
        free(m);
    }
}

/* Writes n bytes of p to fd at 0, and sets its size to n. */
static void rewrite(int fd, const void *p, size_t n) {
    REQUIRE(pwrite(fd, p, n, 0) == (ssize_t)n);
    REQUIRE(ftruncate(fd, (off_t)n) == 0);
}

/* A model file and its external data cut short and restored again and
 * again while another process imports them: each import is refused or
 * succeeds, none kills the process. */
static void test_files_that_shrink(void) {
    enum { K = 4096, OUT = 256 };
    char mpath[600], wpath[600];
    path_of(mpath, sizeof mpath, "shrink.onnx");
    path_of(wpath, sizeof wpath, "shrink.bin");
    float *w = calloc((size_t)K * OUT, sizeof *w);
    REQUIRE(w);
    for (size_t i = 0; i < (size_t)K * OUT; i++) w[i] = (float)(i % 7) / 8.0f;
    size_t wbytes = (size_t)K * OUT * sizeof *w;
    write_file(wpath, w, wbytes);
    dsrt_pb_writer g = {0};
    add_node(&g, "Flatten", "flat", "image", "f", NULL);
    add_node(&g, "Gemm", "gemm", "f,fw", "scores", trans_b);
    int64_t wd[2] = {OUT, K}, in[4] = {1, 1, 64, 64}, out[2] = {1, OUT};
    ext_tensor(&g, "fw", wd, 2, "shrink.bin", NULL, NULL);
    /* A large tensor in the model file itself too. */
    int64_t bd[1] = {OUT};
    float b[OUT];
    for (int i = 0; i < OUT; i++) b[i] = (float)i;
    size_t t = dsrt__pb_begin(&g, 5);
    dsrt__pb_put_int64s(&g, 1, bd, 1);
    dsrt__pb_put_varint(&g, 2, 1);
    dsrt__pb_put_string(&g, 8, "unused");
    dsrt__pb_put_bytes(&g, 9, b, sizeof b);
    dsrt__pb_end(&g, t);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    size_t msize;
    uint8_t *m = model(&g, 13, &msize);
    write_file(mpath, m, msize);
    fflush(stderr);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int ok = 0, no = 0;
        for (int k = 0; k < 60; k++) {
            dsrt_net_options o = one_thread();
            dsrt_net *net = NULL;
            int rc = dsrt_onnx_import(&net, mpath, NULL, &o);
            if (rc == 0) ok++;
            if (rc && (!strstr(dsrt_last_error(), "shrink.onnx") || net)) _exit(2);
            no += rc != 0;
            dsrt_net_destroy(net);
            usleep(300); /* not all in one of the parent's cuts */
        }
        fprintf(stderr, "  60 imports of files that shrink: %d imported, %d refused\n", ok, no);
        _exit(0);
    }
    int mfd = open(mpath, O_WRONLY), wfd = open(wpath, O_WRONLY), st = 0;
    REQUIRE(mfd >= 0 && wfd >= 0);
    for (int k = 0; waitpid(child, &st, WNOHANG) == 0; k++) {
        REQUIRE(ftruncate(wfd, (off_t)wbytes / 2) == 0);
        REQUIRE(ftruncate(mfd, (off_t)msize / 2) == 0);
        usleep(100);
        rewrite(wfd, w, wbytes);
        rewrite(mfd, m, msize);
        usleep(1000);
    }
    close(mfd);
    close(wfd);
    if (WIFSIGNALED(st))
        fprintf(stderr, "  the importing process died of signal %d\n", WTERMSIG(st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(wpath);
    free(m);
    free(w);
}

// ----------------------------------------------------------------------------
// Large graphs and shapes

/* A chain of n Relu nodes that all have one name, then a Flatten. */
static uint8_t *same_names(int n, size_t *size) {
    dsrt_pb_writer g = {0};
    for (int i = 0; i < n; i++) {
        char ins[32], outs[32];
        snprintf(ins, sizeof ins, i ? "x%d" : "image", i - 1);
        snprintf(outs, sizeof outs, "x%d", i);
        add_node(&g, "Relu", "same", ins, outs, NULL);
    }
    char last[32];
    snprintf(last, sizeof last, "x%d", n - 1);
    add_node(&g, "Flatten", "same", last, "scores", NULL);
    int64_t in[4] = {1, 1, 2, 2}, out[2] = {1, 4};
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, 13, size);
}

/* 4000 nodes of one name become layers of names made unique; more layers
 * than a net may have are refused for that reason. */
static void test_many_names(void) {
    size_t size;
    uint8_t *m = same_names(4000, &size);
    dsrt_net *net = NULL;
    CHECK_OK(import_bytes(&net, m, size));
    if (net) {
        CHECK_EQ(net->n_layers, 4002);
        CHECK_STR_EQ(net->layers[1].name, "same");
        CHECK_STR_EQ(net->layers[2].name, "same_2");
        CHECK_STR_EQ(net->layers[4000].name, "same_4000");
        CHECK_STR_EQ(net->layers[4001].name, "output");
    }
    dsrt_net_destroy(net);
    free(m);
    m = same_names(DSRT_LAYERS_MAX + 10, &size);
    refused(m, size, DSRT_ETOOBIG, "node 4095 'same' (Relu, opset 13): more than 4096 layers",
            NULL);
    free(m);
}

/* An input or a layer whose images would have 2^31 values or more is
 * refused naming it, before any arithmetic overflows. */
static void test_huge_shapes(void) {
    static const int64_t inputs[][4] = {
        {1, 3, 100000, 100000}, {1, 3, 65536, 65536}, {1, 65536, 65536, 65536}};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(inputs); k++) {
        dsrt_pb_writer g = {0};
        add_node(&g, "Flatten", "flat", "image", "scores", NULL);
        int64_t out[2] = {1, -1};
        value_info(&g, 11, "image", inputs[k], 4);
        value_info(&g, 12, "scores", out, 2);
        size_t size;
        uint8_t *m = model(&g, 13, &size);
        refused(m, size, DSRT_ETOOBIG, "onnx: test.onnx: input 'image' is (N, ",
                "more than 2^31 - 1 values an image", NULL);
        free(m);
    }
    /* A convolution of 2^20 filters on a 32768x32768 image: 2^50 values. */
    dsrt_pb_writer g = {0};
    add_node(&g, "Conv", "wide", "image,w", "c", NULL);
    add_node(&g, "Flatten", "flat", "c", "scores", NULL);
    int64_t wd[4] = {1 << 20, 1, 1, 1}, in[4] = {1, 1, 32768, 32768}, out[2] = {1, -1};
    ext_tensor(&g, "w", wd, 4, "none.bin", NULL, NULL);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    size_t size;
    uint8_t *m = model(&g, 13, &size);
    refused(m, size, DSRT_ETOOBIG, "node 0 'wide' (Conv, opset 13)",
            "(N, 1048576, 32768, 32768): more than 2^31 - 1 values an image", NULL);
    free(m);
    /* Two of 2^30 values joined along the channels: 2^31. */
    add_node(&g, "Conv", "wide", "image,w", "c", NULL);
    add_node(&g, "Conv", "wide2", "image,w", "c2", NULL);
    add_node(&g, "Concat", "join", "c,c2", "j", NULL);
    add_node(&g, "Flatten", "flat", "j", "scores", NULL);
    int64_t in2[4] = {1, 1, 32, 32};
    ext_tensor(&g, "w", wd, 4, "none.bin", NULL, NULL);
    value_info(&g, 11, "image", in2, 4);
    value_info(&g, 12, "scores", out, 2);
    m = model(&g, 13, &size);
    refused(m, size, DSRT_ETOOBIG, "node 2 'join' (Concat, opset 13)",
            "(N, 2097152, 32, 32): more than 2^31 - 1 values an image", NULL);
    free(m);
}

// ----------------------------------------------------------------------------
// The input normalisation and ONNX's broadcasting

/* image (1, 3, 4, w) -> op(image, k) with k of shape dims -> Conv 1x1 ->
 * Flatten -> scores. */
static uint8_t *affine_model(const char *op, const int64_t *dims, int n, const float *k, int w,
                             size_t *size) {
    dsrt_pb_writer g = {0};
    add_node(&g, op, "norm", "image,k", "x", NULL);
    add_node(&g, "Conv", "conv", "x,cw", "c", NULL);
    add_node(&g, "Flatten", "flat", "c", "scores", NULL);
    size_t count = 1;
    for (int i = 0; i < n; i++) count *= (size_t)dims[i];
    size_t t = dsrt__pb_begin(&g, 5);
    dsrt__pb_put_int64s(&g, 1, dims, (size_t)n);
    dsrt__pb_put_varint(&g, 2, 1);
    dsrt__pb_put_string(&g, 8, "k");
    dsrt__pb_put_bytes(&g, 9, k, count * 4);
    dsrt__pb_end(&g, t);
    float cw[3] = {1, 1, 1};
    int64_t cd[4] = {1, 3, 1, 1}, in[4] = {1, 3, 4, w}, out[2] = {1, 4 * w};
    tensor(&g, "cw", cd, 4, cw, ST_RAW);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, 13, size);
}

/* A constant of one value, or one a channel ((C, 1, 1), (1, C, 1, 1)), is
 * the input's normalisation; ONNX broadcasts a (C) along the width, which
 * dsrt's per-channel normalisation cannot be, so it is refused. */
static void test_constant_broadcast(void) {
    static const float k3[3] = {0.25f, 0.5f, 0.75f}, k1[1] = {0.5f};
    static const struct {
        int64_t dims[5];
        int n;
        const float *k;
        int w;
        const char *mean; /* NULL: refused */
    } cases[] = {
        {{3, 1, 1}, 3, k3, 5, "mean=0.25,0.5,0.75"},
        {{1, 3, 1, 1}, 4, k3, 5, "mean=0.25,0.5,0.75"},
        {{0}, 0, k1, 5, "mean=0.5 "},
        {{1}, 1, k1, 5, "mean=0.5 "},
        {{1, 1, 1, 1}, 4, k1, 5, "mean=0.5 "},
        {{3}, 1, k3, 5, NULL},             /* along a width of 5: not even valid */
        {{3}, 1, k3, 3, NULL},             /* along a width of 3: not per channel */
        {{1, 3}, 2, k3, 3, NULL},          /* the width again */
        {{3, 1}, 2, k3, 5, NULL},          /* the height */
        {{3, 1, 1, 1}, 4, k3, 5, NULL},    /* the batch */
        {{1, 1, 1, 1, 1}, 5, k1, 5, NULL}, /* a fifth axis */
    };
    for (size_t c = 0; c < DSRT_ARRAY_SIZE(cases); c++) {
        size_t size;
        uint8_t *m = affine_model("Sub", cases[c].dims, cases[c].n, cases[c].k, cases[c].w, &size);
        dsrt_net *net = NULL;
        int rc = import_bytes(&net, m, size);
        if (cases[c].mean) {
            CHECK_EQ(rc, 0);
            if (rc) fprintf(stderr, "case %zu: %s\n", c, dsrt_last_error());
            if (net) CHECK_CONTAINS(dsrt_net_description(net), cases[c].mean);
        } else {
            if (!rc) fprintf(stderr, "case %zu: imported\n", c);
            CHECK_EQ(rc, DSRT_EUNSUPPORTED);
            CHECK_CONTAINS(dsrt_last_error(),
                           "node 0 'norm' (Sub, opset 13): constant 'k' of shape (");
            CHECK_CONTAINS(dsrt_last_error(), "broadcast");
        }
        dsrt_net_destroy(net);
        free(m);
    }
}

static void bn_eps_1e12(dsrt_pb_writer *w) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, "epsilon");
    dsrt__pb_put_varint(w, 20, 1);
    dsrt__pb_put_float(w, 2, 1e-12f);
    dsrt__pb_end(w, m);
}

static void bn_eps_small(dsrt_pb_writer *w) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, "epsilon");
    dsrt__pb_put_varint(w, 20, 1);
    dsrt__pb_put_float(w, 2, nextafterf(1e-12f, 0.0f));
    dsrt__pb_end(w, m);
}

/* BatchNormalization's epsilon 1e-12 (in a float: 9.99999996e-13) is
 * dsrt's smallest; the float below it is refused. */
static void test_batchnorm_epsilon(void) {
    void (*attrs[2])(dsrt_pb_writer *) = {bn_eps_1e12, bn_eps_small};
    for (int k = 0; k < 2; k++) {
        dsrt_pb_writer g = {0};
        add_node(&g, "BatchNormalization", "bn", "image,s,b,mu,var", "y", attrs[k]);
        add_node(&g, "Flatten", "flat", "y", "scores", NULL);
        float one[2] = {1, 1}, zero[2] = {0, 0};
        int64_t d[1] = {2}, in[4] = {1, 2, 3, 3}, out[2] = {1, 18};
        tensor(&g, "s", d, 1, one, ST_RAW);
        tensor(&g, "b", d, 1, zero, ST_RAW);
        tensor(&g, "mu", d, 1, zero, ST_RAW);
        tensor(&g, "var", d, 1, one, ST_RAW);
        value_info(&g, 11, "image", in, 4);
        value_info(&g, 12, "scores", out, 2);
        size_t size;
        uint8_t *m = model(&g, 13, &size);
        dsrt_net *net = NULL;
        int rc = import_bytes(&net, m, size);
        if (k == 0) {
            CHECK_OK(rc);
            if (net) CHECK(net->layers[1].o.eps == 1e-12f);
        } else {
            CHECK_EQ(rc, DSRT_EUNSUPPORTED);
            CHECK_CONTAINS(dsrt_last_error(), "'bn' (BatchNormalization, opset 13): epsilon");
        }
        dsrt_net_destroy(net);
        free(m);
    }
}

// ----------------------------------------------------------------------------
// Activations

static void attr_float(dsrt_pb_writer *w, const char *name, float v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 1);
    dsrt__pb_put_float(w, 2, v);
    dsrt__pb_end(w, m);
}

static void attr_string(dsrt_pb_writer *w, const char *name, const char *v) {
    size_t m = dsrt__pb_begin(w, 5);
    dsrt__pb_put_string(w, 1, name);
    dsrt__pb_put_varint(w, 20, 3);
    dsrt__pb_put_string(w, 4, v);
    dsrt__pb_end(w, m);
}

static void clip_bounds(dsrt_pb_writer *w) {
    attr_float(w, "min", -0.5f);
    attr_float(w, "max", 0.75f);
}

static void clip_0_6(dsrt_pb_writer *w) {
    attr_float(w, "min", 0.0f);
    attr_float(w, "max", 6.0f);
}

static void clip_min_only(dsrt_pb_writer *w) {
    attr_float(w, "min", -2.0f);
}

static void hardsigmoid_ab(dsrt_pb_writer *w) {
    attr_float(w, "alpha", 0.3f);
    attr_float(w, "beta", 0.6f);
}

static void gelu_tanh(dsrt_pb_writer *w) {
    attr_string(w, "approximate", "tanh");
}

static void gelu_fast(dsrt_pb_writer *w) {
    attr_string(w, "approximate", "fast");
}

/* image (1, 2, 4, 4) -> Relu (r) -> Clip(ins: r, then "lo", "hi" or "" for
 * none, or r for a computed bound) -> Flatten; lo and hi constant scalars. */
static uint8_t *clip_model(const char *ins, float lo, float hi, int opset, size_t *size) {
    dsrt_pb_writer g = {0};
    add_node(&g, "Relu", "relu", "image", "r", NULL);
    add_node(&g, "Clip", "the_node", ins, "x", NULL);
    add_node(&g, "Flatten", "flat", "x", "scores", NULL);
    int64_t none[1] = {0}, in[4] = {1, 2, 4, 4}, out[2] = {1, 32};
    tensor(&g, "lo", none, 0, &lo, ST_RAW);
    tensor(&g, "hi", none, 0, &hi, ST_PACKED);
    value_info(&g, 11, "image", in, 4);
    value_info(&g, 12, "scores", out, 2);
    return model(&g, opset, size);
}

/* The model (m, *size bytes, freed here) imports with one layer of kind,
 * of that keyword (kind -1: none of clip's); that layer's options. */
static dsrt_act_opts imports_as(uint8_t *m, const size_t *size, int kind, const char *keyword) {
    dsrt_act_opts o = {0};
    dsrt_net *net = NULL;
    CHECK_OK(import_bytes(&net, m, *size));
    free(m);
    if (!net) return o;
    int found = 0;
    for (int i = 0; i < net->n_layers; i++) {
        const dsrt_layer *l = &net->layers[i];
        if (l->kind != (kind < 0 ? DSRT_LAYER_CLIP : (dsrt_layer_kind)kind)) continue;
        found++;
        if (keyword) CHECK_STR_EQ(l->type, keyword);
        o = *dsrt__act_opts(l);
    }
    CHECK_EQ(found, kind < 0 ? 0 : 1);
    dsrt_net_destroy(net);
    return o;
}

/* Each activation operator at the opsets that change its form: Clip's
 * bounds as attributes (before 11) and as optional constant inputs, both
 * left out (the identity), 0 and 6 (relu6); HardSigmoid's defaults
 * (ONNX's alpha 0.2); Gelu's approximate; and the refusals. */
static void test_activation_ops(void) {
    size_t size;
    dsrt_act_opts o;
    uint8_t *m;
    o = imports_as(one_node("Clip", clip_bounds, 7, &size), &size, DSRT_LAYER_CLIP, "clip");
    CHECK(o.min == -0.5f && o.max == 0.75f);
    o = imports_as(one_node("Clip", clip_min_only, 9, &size), &size, DSRT_LAYER_CLIP, "clip");
    CHECK(o.min == -2.0f && o.max == FLT_MAX);
    imports_as(one_node("Clip", clip_0_6, 9, &size), &size, DSRT_LAYER_CLIP, "relu6");
    imports_as(clip_model("r", 0, 0, 9, &size), &size, -1, NULL);
    o = imports_as(clip_model("r,lo,hi", -1.5f, 2.5f, 13, &size), &size, DSRT_LAYER_CLIP, "clip");
    CHECK(o.min == -1.5f && o.max == 2.5f);
    o = imports_as(clip_model("r,,hi", 0, 3.0f, 11, &size), &size, DSRT_LAYER_CLIP, "clip");
    CHECK(o.min == -FLT_MAX && o.max == 3.0f);
    o = imports_as(clip_model("r,lo", 0.25f, 0, 21, &size), &size, DSRT_LAYER_CLIP, "clip");
    CHECK(o.min == 0.25f && o.max == FLT_MAX);
    o = imports_as(clip_model("r,lo,hi", -INFINITY, 1.0f, 13, &size), &size, DSRT_LAYER_CLIP,
                   "clip");
    CHECK(o.min == -FLT_MAX && o.max == 1.0f);
    imports_as(clip_model("r,lo,hi", 0, 6, 13, &size), &size, DSRT_LAYER_CLIP, "relu6");
    imports_as(clip_model("r", 0, 0, 13, &size), &size, -1, NULL);
    imports_as(clip_model("r,,", 0, 0, 13, &size), &size, -1, NULL);
    imports_as(one_node("Sigmoid", NULL, 7, &size), &size, DSRT_LAYER_SIGMOID, "sigmoid");
    o = imports_as(one_node("HardSigmoid", NULL, 13, &size), &size, DSRT_LAYER_HARDSIGMOID,
                   "hardsigmoid");
    CHECK(o.alpha == 0.2f && o.beta == 0.5f);
    o = imports_as(one_node("HardSigmoid", hardsigmoid_ab, 7, &size), &size, DSRT_LAYER_HARDSIGMOID,
                   "hardsigmoid");
    CHECK(o.alpha == 0.3f && o.beta == 0.6f);
    imports_as(one_node("HardSwish", NULL, 14, &size), &size, DSRT_LAYER_HARDSWISH, "hardswish");
    o = imports_as(one_node("Gelu", NULL, 20, &size), &size, DSRT_LAYER_GELU, "gelu");
    CHECK_EQ(o.approximate, 0);
    o = imports_as(one_node("Gelu", gelu_tanh, 21, &size), &size, DSRT_LAYER_GELU, "gelu");
    CHECK_EQ(o.approximate, 1);

    m = clip_model("r,lo,hi", 2.0f, 1.0f, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'the_node' (Clip, opset 13): min 2 is above max 1", NULL);
    free(m);
    m = clip_model("r,lo,hi", NAN, 1.0f, 13, &size);
    refused(m, size, DSRT_ECORRUPT, "(Clip, opset 13): its min is NaN", NULL);
    free(m);
    m = clip_model("r,r", 0, 0, 13, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "(Clip, opset 13): its min 'r' is computed", NULL);
    free(m);
    m = clip_model("r,lo", 0, 0, 9, &size);
    refused(m, size, DSRT_ECORRUPT, "(Clip, opset 9): min and max are inputs", NULL);
    free(m);
    m = one_node("Clip", clip_bounds, 11, &size);
    refused(m, size, DSRT_ECORRUPT, "(Clip, opset 11): min and max are attributes", NULL);
    free(m);
    m = one_node("Gelu", gelu_fast, 20, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "(Gelu, opset 20): approximate 'fast'", NULL);
    free(m);
}

/* Random bytes changed in a good model: refused or imported, never a
 * crash (the fuzz target goes further under the sanitizers). */
static void test_mutations(void) {
    size_t size;
    uint8_t *good = conv_model(ST_PACKED, 13, &size), *m = malloc(size);
    REQUIRE(m);
    dsrt_rng r = dsrt_rng_init(11, 0, 0, 0);
    int imported = 0;
    for (int k = 0; k < 3000; k++) {
        memcpy(m, good, size);
        int flips = 1 + (int)(dsrt_rng_u64(&r) % 4);
        for (int j = 0; j < flips; j++) m[dsrt_rng_u64(&r) % size] = (uint8_t)dsrt_rng_u64(&r);
        dsrt_net *net = NULL;
        if (import_bytes(&net, m, size) == 0) imported++;
        dsrt_net_destroy(net);
    }
    fprintf(stderr, "  3000 mutated models: %d imported, the others refused\n", imported);
    free(m);
    free(good);
}

// ----------------------------------------------------------------------------
// Products, layer normalisation, padding, partial pooling windows

/* image (N, 2, 4, 4) -> Conv 'c' (3 filters, 1x1) -> x (N, 3, 4, 4): the
 * computed value the nodes under test take. */
static const float STEM_W[6] = {0.5f, -0.25f, 0.75f, 0.125f, -0.5f, 1.0f};

static void stem(dsrt_pb_writer *g) {
    int64_t d[4] = {3, 2, 1, 1};
    add_node(g, "Conv", "c", "image,cw", "x", NULL);
    tensor(g, "cw", d, 4, STEM_W, ST_RAW);
}

/* A 1-D int64 initializer of n values. */
static void int64_tensor(dsrt_pb_writer *g, const char *name, int n, const int64_t *v) {
    int64_t dims[1] = {n};
    size_t t = dsrt__pb_begin(g, 5);
    dsrt__pb_put_int64s(g, 1, dims, 1);
    dsrt__pb_put_varint(g, 2, 7);
    dsrt__pb_put_string(g, 8, name);
    dsrt__pb_put_bytes(g, 9, v, (size_t)n * 8);
    dsrt__pb_end(g, t);
}

/* The model around the nodes written into g, which end in y: the scores
 * are its flattening, k values an image. */
static uint8_t *scores_model(dsrt_pb_writer *g, int opset, int64_t k, size_t *size) {
    add_node(g, "Flatten", "flat", "y", "scores", NULL);
    int64_t in[4] = {-1, 2, 4, 4}, out[2] = {-1, k};
    value_info(g, 11, "image", in, 4);
    value_info(g, 12, "scores", out, 2);
    return model(g, opset, size);
}

/* Imports m (size bytes; freed here): the net, or NULL with the message. */
static dsrt_net *import_model(uint8_t *m, size_t size) {
    dsrt_net *net = NULL;
    int rc = import_bytes(&net, m, size);
    if (rc) fprintf(stderr, "  import: %s\n", dsrt_last_error());
    CHECK_OK(rc);
    free(m);
    return net;
}

/* The net's only layer of kind k. */
static const dsrt_layer *only_layer(const dsrt_net *net, dsrt_layer_kind k) {
    const dsrt_layer *found = NULL;
    int n = 0;
    for (int i = 0; net && i < net->n_layers; i++)
        if (net->layers[i].kind == k) found = &net->layers[i], n++;
    CHECK_EQ(n, 1);
    return found;
}

/* Mul: a gate (N, C, 1, 1) on either side is a mul layer taking it second;
 * two values of one shape a mul layer; a value by itself refused. */
static void test_mul_import(void) {
    float gw[9] = {1, 0.5f, -1, 0.25f, 2, 0, -0.5f, 1, 0.75f};
    int64_t gd[4] = {3, 3, 1, 1};
    for (int swap = 0; swap < 2; swap++) {
        dsrt_pb_writer g = {0};
        size_t size;
        stem(&g);
        add_node(&g, "GlobalAveragePool", "gap", "x", "p", NULL);
        add_node(&g, "Conv", "fc1", "p,gw", "gate", NULL);
        add_node(&g, "Mul", "excite", swap ? "gate,x" : "x,gate", "y", NULL);
        tensor(&g, "gw", gd, 4, gw, ST_RAW);
        uint8_t *mm = scores_model(&g, 13, 48, &size);
        dsrt_net *net = import_model(mm, size);
        const dsrt_layer *l = net ? only_layer(net, DSRT_LAYER_MUL) : NULL;
        if (l) {
            CHECK_STR_EQ(net->layers[l->inputs[0]].name, "c");
            CHECK_STR_EQ(net->layers[l->inputs[1]].name, "fc1");
            CHECK_EQ(l->out.h, 4);
        }
        dsrt_net_destroy(net);
    }
    dsrt_pb_writer g = {0};
    size_t size;
    stem(&g);
    add_node(&g, "Relu", "r", "x", "rx", NULL);
    add_node(&g, "Mul", "square", "x,rx", "y", NULL);
    uint8_t *mm = scores_model(&g, 13, 48, &size);
    dsrt_net *net = import_model(mm, size);
    if (net) CHECK_EQ(only_layer(net, DSRT_LAYER_MUL)->in.c, 3);
    dsrt_net_destroy(net);
    stem(&g);
    add_node(&g, "Mul", "square", "x,x", "y", NULL);
    uint8_t *m = scores_model(&g, 13, 48, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'square' (Mul, opset 13): it multiplies a value by itself",
            NULL);
    free(m);
    /* A gate of other channels. */
    int64_t gd2[4] = {2, 3, 1, 1};
    stem(&g);
    add_node(&g, "GlobalAveragePool", "gap", "x", "p", NULL);
    add_node(&g, "Conv", "fc1", "p,gw", "gate", NULL);
    add_node(&g, "Mul", "excite", "x,gate", "y", NULL);
    tensor(&g, "gw", gd2, 4, gw, ST_RAW);
    m = scores_model(&g, 13, 48, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'excite' (Mul, opset 13): its inputs' shapes", NULL);
    free(m);
}

/* Mul of a computed value by a constant of one value a channel, as ONNX
 * broadcasts it ((C, 1, 1), (1, C, 1, 1); one value repeated): a scale
 * layer with those factors; (C), which runs along the width, refused. */
static void test_scale_import(void) {
    static const float k3[3] = {0.5f, -2.0f, 0.25f}, k1[1] = {1.5f};
    static const struct {
        int64_t dims[4];
        int n;
        const float *k;
        int ok;
    } cases[] = {
        {{3, 1, 1}, 3, k3, 1}, {{1, 3, 1, 1}, 4, k3, 1}, {{0}, 0, k1, 1},
        {{1}, 1, k1, 1},       {{3}, 1, k3, 0},          {{1, 1, 4, 1}, 4, k3, 0},
    };
    for (size_t c = 0; c < DSRT_ARRAY_SIZE(cases); c++)
        for (int swap = 0; swap < 2; swap++) {
            dsrt_pb_writer g = {0};
            size_t size;
            float k[4] = {0};
            memcpy(k, cases[c].k, (cases[c].n >= 3 ? 3 : 1) * sizeof *k);
            stem(&g);
            add_node(&g, "Mul", "gamma", swap ? "k,x" : "x,k", "y", NULL);
            tensor(&g, "k", cases[c].dims, cases[c].n, k, ST_RAW);
            uint8_t *m = scores_model(&g, 13, 48, &size);
            if (!cases[c].ok) {
                refused(m, size, DSRT_EUNSUPPORTED, "'gamma' (Mul, opset 13)", "the constant 'k'",
                        "one factor a channel", NULL);
                free(m);
                continue;
            }
            dsrt_net *net = import_model(m, size);
            const dsrt_layer *l = net ? only_layer(net, DSRT_LAYER_SCALE) : NULL;
            for (int i = 0; l && i < 3; i++)
                CHECK(net->params[l->w_off + i] == cases[c].k[cases[c].n >= 3 ? i : 0]);
            dsrt_net_destroy(net);
        }
}

static void ln_eps(dsrt_pb_writer *w) {
    attr_float(w, "epsilon", 1e-3f);
}

static void ln_axis1(dsrt_pb_writer *w) {
    attr_int(w, "axis", 1);
}

static void to_nhwc(dsrt_pb_writer *w) {
    int64_t p[4] = {0, 2, 3, 1};
    attr_ints(w, "perm", p, 4);
}

static void to_nchw(dsrt_pb_writer *w) {
    int64_t p[4] = {0, 3, 1, 2};
    attr_ints(w, "perm", p, 4);
}

/* LayerNormalization over the channels: of a flattened (N, C) of one
 * pixel, of an image between Transposes to channels-last and back
 * (PyTorch's LayerNorm2d), B left out (zeros); refused over the channels
 * and pixels of an (N, C, H, W) image. */
static void test_layernorm_import(void) {
    float sc[3] = {1.5f, 0.5f, -1}, b[3] = {0.25f, 0, -0.75f};
    int64_t d[1] = {3};
    for (int form = 0; form < 3; form++) {
        dsrt_pb_writer g = {0};
        size_t size;
        stem(&g);
        if (form == 0) {
            add_node(&g, "GlobalAveragePool", "gap", "x", "p", NULL);
            add_node(&g, "Flatten", "f", "p", "pf", NULL);
            add_node(&g, "LayerNormalization", "ln", "pf,s,b", "y", ln_eps);
        } else {
            add_node(&g, "Transpose", "t1", "x", "xt", to_nhwc);
            add_node(&g, "LayerNormalization", "ln", form == 1 ? "xt,s,b" : "xt,s", "yt", ln_eps);
            add_node(&g, "Transpose", "t2", "yt", "y", to_nchw);
        }
        tensor(&g, "s", d, 1, sc, ST_RAW);
        if (form < 2) tensor(&g, "b", d, 1, b, ST_RAW);
        uint8_t *mm = scores_model(&g, 17, form ? 48 : 3, &size);
        dsrt_net *net = import_model(mm, size);
        const dsrt_layer *l = net ? only_layer(net, DSRT_LAYER_LAYERNORM) : NULL;
        if (l) {
            CHECK(l->o.eps == 1e-3f);
            CHECK_EQ(l->out.h, form ? 4 : 1);
            for (int i = 0; i < 3; i++) {
                CHECK(net->params[l->w_off + i] == sc[i]);
                CHECK(net->params[l->b_off + i] == (form < 2 ? b[i] : 0.0f));
            }
        }
        dsrt_net_destroy(net);
    }
    dsrt_pb_writer g = {0};
    size_t size;
    stem(&g);
    add_node(&g, "LayerNormalization", "ln", "x,s", "y", ln_axis1);
    tensor(&g, "s", d, 1, sc, ST_RAW);
    uint8_t *m = scores_model(&g, 17, 48, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'ln' (LayerNormalization, opset 17): axis 1 of the",
            "dsrt normalises the channels of each pixel", NULL);
    free(m);
}

static void pad_attrs_9(dsrt_pb_writer *w) {
    int64_t p[8] = {0, 0, 1, 2, 0, 0, 3, 0};
    attr_ints(w, "pads", p, 8);
    attr_float(w, "value", -1.5f);
}

static void pad_reflect(dsrt_pb_writer *w) {
    int64_t p[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    attr_string(w, "mode", "reflect");
    attr_ints(w, "pads", p, 8);
}

static void pad_channels(dsrt_pb_writer *w) {
    int64_t p[8] = {0, 1, 0, 0, 0, 0, 0, 0};
    attr_ints(w, "pads", p, 8);
}

/* Pad: its pads and value as attributes (opset 9) or constant inputs (11;
 * 18 with axes), of the height and width: a pad layer; another mode, a
 * padded channel or a crop refused naming the node. */
static void test_pad_import(void) {
    for (int form = 0; form < 3; form++) {
        dsrt_pb_writer g = {0};
        size_t size;
        stem(&g);
        if (form == 0) {
            add_node(&g, "Pad", "p", "x", "y", pad_attrs_9);
        } else {
            int64_t p8[8] = {0, 0, 1, 2, 0, 0, 3, 0}, p4[4] = {1, 2, 3, 0}, ax[2] = {-2, 3};
            float v = -1.5f;
            add_node(&g, "Pad", "p", form == 1 ? "x,pads,v" : "x,pads,v,axes", "y", NULL);
            if (form == 1) {
                int64_tensor(&g, "pads", 8, p8);
            } else {
                int64_tensor(&g, "pads", 4, p4);
                int64_tensor(&g, "axes", 2, ax);
            }
            tensor(&g, "v", NULL, 0, &v, ST_RAW);
        }
        uint8_t *mm = scores_model(&g, form == 0 ? 9 : form == 1 ? 11 : 18, 3 * 8 * 6, &size);
        dsrt_net *net = import_model(mm, size);
        const dsrt_layer *l = net ? only_layer(net, DSRT_LAYER_PAD) : NULL;
        if (l) {
            CHECK_CONTAINS(dsrt_net_description(net), "pad=1,3,2,0 value=-1.5");
            CHECK_EQ(l->out.h, 8);
            CHECK_EQ(l->out.w, 6);
        }
        dsrt_net_destroy(net);
    }
    size_t size;
    uint8_t *m = one_node("Pad", pad_reflect, 9, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'the_node' (Pad, opset 9): mode 'reflect'", NULL);
    free(m);
    m = one_node("Pad", pad_channels, 9, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'the_node' (Pad, opset 9): pads (0, 1, 0, 0",
            "the height and the width", NULL);
    free(m);
    dsrt_pb_writer g = {0};
    int64_t crop[8] = {0, 0, -1, 0, 0, 0, 0, 0};
    stem(&g);
    add_node(&g, "Pad", "p", "x,pads", "y", NULL);
    int64_tensor(&g, "pads", 8, crop);
    m = scores_model(&g, 13, 27, &size);
    refused(m, size, DSRT_EUNSUPPORTED, "'p' (Pad, opset 13): a negative pad (-1) crops", NULL);
    free(m);
}

static void avg_ceil(dsrt_pb_writer *w) {
    int64_t k[2] = {3, 3}, s[2] = {2, 2}, p[4] = {1, 1, 1, 1};
    attr_ints(w, "kernel_shape", k, 2);
    attr_ints(w, "strides", s, 2);
    attr_ints(w, "pads", p, 4);
    attr_int(w, "ceil_mode", 1);
    attr_int(w, "count_include_pad", 1);
}

static void max_ceil(dsrt_pb_writer *w) {
    int64_t k[2] = {2, 2}, s[2] = {3, 3};
    attr_ints(w, "kernel_shape", k, 2);
    attr_ints(w, "strides", s, 2);
    attr_int(w, "ceil_mode", 1);
}

/* AveragePool and MaxPool with ceil_mode: a partial last window is ceil=1
 * (the average counting the padding divides it as ONNX does), exported
 * back as ceil_mode (before opset 10, as more padding where that computes
 * the same, else refused), bit for bit. */
static void test_pool_ceil_import(void) {
    for (int avg = 0; avg < 2; avg++) {
        dsrt_pb_writer g = {0};
        size_t size;
        stem(&g);
        add_node(&g, avg ? "AveragePool" : "MaxPool", "pool", "x", "y", avg ? avg_ceil : max_ceil);
        /* 4x4: the average's windows 3x3, stride 2, padding 1: 3x3 (the
         * floor: 2x2); the maximum's 2x2, stride 3: 2x2 (1x1). */
        uint8_t *mm = scores_model(&g, 13, avg ? 27 : 12, &size);
        dsrt_net *net = import_model(mm, size);
        if (!net) continue;
        const dsrt_layer *l = only_layer(net, avg ? DSRT_LAYER_AVGPOOL : DSRT_LAYER_MAXPOOL);
        CHECK_CONTAINS(dsrt_net_description(net), "ceil=1");
        CHECK_EQ(l->out.h, avg ? 3 : 2);
        for (int opset = 9; opset <= 13; opset += 4) {
            char path[600];
            path_of(path, sizeof path, "ceil.onnx");
            dsrt_onnx_export_options eo = dsrt_onnx_export_defaults();
            eo.opset = opset;
            int rc = dsrt_onnx_export(net, path, &eo);
            if (avg && opset < 10) {
                CHECK_EQ(rc, DSRT_EUNSUPPORTED);
                CHECK_CONTAINS(dsrt_last_error(), "needs ceil_mode, opset 10 or later");
                continue;
            }
            CHECK_OK(rc);
            dsrt_net_options no = one_thread();
            dsrt_net *back = NULL;
            CHECK_OK(dsrt_onnx_import(&back, path, NULL, &no));
            if (back) check_same_net(net, back, "ceil_mode", 0);
            if (back && opset >= 10) CHECK_CONTAINS(dsrt_net_description(back), "ceil=1");
            dsrt_net_destroy(back);
        }
        dsrt_net_destroy(net);
    }
}

int main(void) {
    REQUIRE(timg_tmpdir("onnx", dir, sizeof dir) == 0);
    RUN(test_round_trip);
    RUN(test_layer_table);
    RUN(test_storages);
    RUN(test_refusals);
    RUN(test_external_refusals);
    RUN(test_external_links);
    RUN(test_external_short);
    RUN(test_files_that_shrink);
    RUN(test_many_names);
    RUN(test_huge_shapes);
    RUN(test_constant_broadcast);
    RUN(test_batchnorm_epsilon);
    RUN(test_activation_ops);
    RUN(test_mul_import);
    RUN(test_scale_import);
    RUN(test_layernorm_import);
    RUN(test_pad_import);
    RUN(test_pool_ceil_import);
    RUN(test_mutations);
    return TEST_RESULT();
}
