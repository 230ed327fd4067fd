/*
 * Constant folding at ONNX import: the shape arithmetic exporters write
 * (PyTorch's dynamic padding and reshapes, tf2onnx's) evaluated once, at
 * import, where its inputs are constants or the static shapes of the
 * net's values, so that what reaches a layer's mapping is a constant (a
 * Pad's pads, a Reshape's shape). Shape of a value gives its dims with the
 * batch as ONNX_BATCH, a symbol that passes through gathers, concatenations
 * and arithmetic that leaves it as it is (adding 0, multiplying by 1), and
 * that only a Reshape's leading dimension may take; anything else that
 * depends on it (N * 2, N > 3) is refused. Values are small (a shape,
 * a few constants): at most FOLD_MAX elements, integers as int64 and
 * numbers as float32, computed as onnxruntime computes them (float32
 * arithmetic, numpy's broadcasting).
 */
#include "nn/onnx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FOLD_MAX (1 << 16)

/* A constant being folded: int64 or float32 values and their dims. */
typedef struct {
    int is_int;
    int ndims;
    int64_t dims[ONNX_DIMS_MAX];
    size_t n;
    int64_t *i; /* (n) when is_int */
    float *f;   /* (n) otherwise */
} cval;

/* The operators folded here, and which inputs may be computed values whose
 * shape alone is read (Shape's). */
static const char *const FOLDED[] = {"Shape",   "Gather", "Unsqueeze",  "Squeeze",
                                     "Concat",  "Slice",  "Cast",       "ConstantOfShape",
                                     "Range",   "Expand", "Reshape",    "Transpose",
                                     "Add",     "Sub",    "Mul",        "Div",
                                     "Pow",     "Sqrt",   "Neg",        "Floor",
                                     "Ceil",    "Abs",    "Reciprocal", "Mod",
                                     "Max",     "Min",    "Equal",      "Less",
                                     "Greater", "Where",  "Not",        "And",
                                     "Or",      "Xor",    "Clip",       "Identity",
                                     NULL};

/* Those that only fold: no layer computes them. */
static const char *const ONLY[] = {
    "Shape",   "Gather",     "Unsqueeze", "Squeeze", "Slice", "Cast",  "ConstantOfShape",
    "Range",   "Expand",     "Pow",       "Sqrt",    "Neg",   "Floor", "Ceil",
    "Abs",     "Reciprocal", "Mod",       "Max",     "Min",   "Equal", "Less",
    "Greater", "Where",      "Not",       "And",     "Or",    "Xor",   NULL};

static int listed(const char *const *list, onnx_str op) {
    for (int k = 0; list[k]; k++)
        if (onnx_is(op, list[k])) return 1;
    return 0;
}

int dsrt__onnx_fold_only(const onnx_node *n) {
    return (!n->domain.n || onnx_is(n->domain, "ai.onnx")) && listed(ONLY, n->op);
}

// ----------------------------------------------------------------------------
// Values in and out

static int cv_alloc(onnx_import *c, cval *v, int is_int, int ndims, const int64_t *dims) {
    memset(v, 0, sizeof *v);
    v->is_int = is_int;
    v->ndims = ndims;
    size_t n = 1;
    for (int d = 0; d < ndims; d++) {
        if (dims[d] < 0 || dims[d] > FOLD_MAX)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "a folded value of dimension %lld",
                                   (long long)dims[d]);
        v->dims[d] = dims[d];
        n *= (size_t)dims[d];
        if (n > FOLD_MAX)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "a folded value of more than %d elements (dsrt folds shapes "
                                   "and small constants)",
                                   FOLD_MAX);
    }
    v->n = n;
    size_t bytes = (n ? n : 1) * (is_int ? sizeof(int64_t) : sizeof(float));
    void *p = dsrt__arena_alloc(&c->m.arena, bytes, 8);
    if (!p) return -ENOMEM;
    memset(p, 0, bytes);
    if (is_int)
        v->i = p;
    else
        v->f = p;
    return 0;
}

static int is_int_type(int dtype) {
    return dtype == ONNX_INT64 || dtype == ONNX_INT32 || dtype == ONNX_INT8 ||
           dtype == ONNX_UINT8 || dtype == ONNX_BOOL;
}

/* Constant t as a cval. */
static int cv_of(onnx_import *c, const onnx_tensor *t, cval *v) {
    int is_int = t->made_i ? 1 : t->made_f ? 0 : is_int_type(t->dtype);
    if (t->ndims > ONNX_DIMS_MAX || t->count > FOLD_MAX)
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "constant '%s' of %llu values: dsrt folds shapes and small constants",
            ONNX_SHOWN(t->name), (unsigned long long)t->count);
    int rc = cv_alloc(c, v, is_int, t->ndims, t->dims);
    if (rc) return rc;
    if (v->n != t->count)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "constant '%s'", ONNX_SHOWN(t->name));
    if (!is_int) return v->n ? dsrt__onnx_tensor_floats(c, t, v->f) : 0;
    if (!v->n) return 0;
    onnx_tensor u = *t;
    if (!t->made_i && t->dtype != ONNX_INT64 && t->dtype != ONNX_INT32) {
        /* bool, int8, uint8: one byte each in raw_data, else int32_data */
        if (t->has_raw) {
            for (size_t k = 0; k < v->n; k++)
                v->i[k] = t->dtype == ONNX_INT8 ? (int8_t)t->raw.p[k] : t->raw.p[k];
            return 0;
        }
        u.dtype = ONNX_INT32;
    }
    rc = dsrt__onnx_tensor_ints(c, &u, v->i, (int)v->n);
    return rc < 0 ? rc : 0;
}

/* Output k of the node becomes the constant v. */
static int cv_out(onnx_import *c, int k, const cval *v) {
    onnx_val *o = dsrt__onnx_output(c, k);
    if (!o) return 0;
    onnx_tensor *t = dsrt__arena_alloc(&c->m.arena, sizeof *t, 8);
    if (!t) return -ENOMEM;
    memset(t, 0, sizeof *t);
    t->name = o->name;
    t->dtype = v->is_int ? ONNX_INT64 : ONNX_FLOAT;
    t->ndims = v->ndims;
    memcpy(t->dims, v->dims, sizeof t->dims);
    t->count = v->n;
    if (v->is_int)
        t->made_i = v->i;
    else
        t->made_f = v->f;
    o->kind = ONNX_V_CONST;
    o->t = t;
    o->flat = o->nhwc = 0;
    return 0;
}

/* The dims of a computed value, as ONNX sees them (the batch symbolic). */
static int dims_of(onnx_import *c, const onnx_val *v, int64_t *dims) {
    if (v->kind == ONNX_V_CONST) {
        memcpy(dims, v->t->dims, sizeof v->t->dims);
        return v->t->ndims;
    }
    dsrt_shape s = dsrt__onnx_shape_of(c, v);
    dims[0] = ONNX_BATCH;
    if (v->flat) {
        dims[1] = (int64_t)s.c * s.h * s.w;
        return 2;
    }
    if (v->nhwc) {
        dims[1] = s.h, dims[2] = s.w, dims[3] = s.c;
    } else {
        dims[1] = s.c, dims[2] = s.h, dims[3] = s.w;
    }
    return 4;
}

static double num(const cval *v, size_t k) {
    return v->is_int ? (double)v->i[k] : (double)v->f[k];
}

/* The ints of an integer cval (a shape, indices), refusing floats. */
static int need_ints(onnx_import *c, const cval *v, const char *what) {
    if (!v->is_int)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s holds floats, not integers", what);
    return 0;
}

static int no_batch(onnx_import *c, const cval *v, const char *what) {
    for (size_t k = 0; v->is_int && k < v->n; k++)
        if (v->i[k] == ONNX_BATCH)
            return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                                   "its %s depends on the batch size, which dsrt leaves open",
                                   what);
    return 0;
}

/* axis in [-rank, rank) made non-negative; -1 when out of range. */
static int axis_of(int64_t a, int rank) {
    if (a < 0) a += rank;
    return a >= 0 && a < rank ? (int)a : -1;
}

// ----------------------------------------------------------------------------
// Broadcasting

/* numpy's broadcast of a and b: the output dims, and for each output
 * element the elements of a and b (strides 0 where broadcast). */
static int broadcast(onnx_import *c, const cval *a, const cval *b, int *ndims, int64_t *dims) {
    int n = DSRT_MAX(a->ndims, b->ndims);
    if (n > ONNX_DIMS_MAX) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "too many dimensions");
    for (int d = 0; d < n; d++) {
        int da = d - (n - a->ndims), db = d - (n - b->ndims);
        int64_t x = da >= 0 ? a->dims[da] : 1, y = db >= 0 ? b->dims[db] : 1;
        if (x != y && x != 1 && y != 1)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its inputs do not broadcast (%lld, %lld)",
                                   (long long)x, (long long)y);
        dims[d] = x == 1 ? y : x;
    }
    *ndims = n;
    return 0;
}

/* The index in v of output element k of dims (ndims) under broadcasting. */
static size_t bindex(const cval *v, int ndims, const int64_t *dims, size_t k) {
    size_t idx = 0, stride = 1;
    for (int d = ndims - 1; d >= 0; d--) {
        size_t coord = k % (size_t)dims[d];
        k /= (size_t)dims[d];
        int dv = d - (ndims - v->ndims);
        if (dv >= 0) {
            if (v->dims[dv] != 1) idx += coord * stride;
            stride *= (size_t)v->dims[dv];
        }
    }
    return idx;
}

// ----------------------------------------------------------------------------
// The operators

/* x op y in 64 bits (Mod: fmod 1 takes the dividend's sign, C's %); *bad
 * = 1 for a division by zero or an operator that is not integer
 * arithmetic, 2 for a result past 64 bits (the batch's symbol, INT64_MIN,
 * is not a number to reach), 3 for a result that depends on the batch's
 * size: the symbol passes only through what leaves it as it is (adding 0,
 * multiplying or dividing by 1). */
static int64_t int_op(onnx_str op, int64_t x, int64_t y, int fmod, int *bad) {
    if (x == ONNX_BATCH || y == ONNX_BATCH) {
        int64_t other = x == ONNX_BATCH ? y : x;
        int same =
            other != ONNX_BATCH &&
            (((onnx_is(op, "Add") || (onnx_is(op, "Sub") && y != ONNX_BATCH)) && other == 0) ||
             ((onnx_is(op, "Mul") || (onnx_is(op, "Div") && y != ONNX_BATCH)) && other == 1));
        if (!same) *bad = 3;
        return same ? ONNX_BATCH : 0;
    }
    int64_t r;
    if (onnx_is(op, "Add") || onnx_is(op, "Sub") || onnx_is(op, "Mul")) {
        int over = onnx_is(op, "Add")   ? __builtin_add_overflow(x, y, &r)
                   : onnx_is(op, "Sub") ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
        if (over || r == ONNX_BATCH) *bad = 2;
        return *bad ? 0 : r;
    }
    if (onnx_is(op, "Div") || onnx_is(op, "Mod")) {
        if (y == 0) {
            *bad = 1;
            return 0;
        }
        if (onnx_is(op, "Div")) return x / y;
        r = x % y; /* fmod 1: the sign of the dividend */
        if (fmod) return r;
        return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; /* fmod 0: the divisor's */
    }
    if (onnx_is(op, "Max")) return x > y ? x : y;
    if (onnx_is(op, "Min")) return x < y ? x : y;
    if (onnx_is(op, "Equal")) return x == y;
    if (onnx_is(op, "Less")) return x < y;
    if (onnx_is(op, "Greater")) return x > y;
    if (onnx_is(op, "And")) return x && y;
    if (onnx_is(op, "Or")) return x || y;
    if (onnx_is(op, "Xor")) return !x != !y;
    if (onnx_is(op, "Pow")) {
        r = 1;
        for (int64_t k = 0; k < y && k < 64 && !*bad; k++)
            if (__builtin_mul_overflow(r, x, &r) || r == ONNX_BATCH) *bad = 2;
        return *bad ? 0 : r;
    }
    *bad = 1;
    return 0;
}

static float float_op(onnx_str op, float x, float y) {
    if (onnx_is(op, "Add")) return x + y;
    if (onnx_is(op, "Sub")) return x - y;
    if (onnx_is(op, "Mul")) return x * y;
    if (onnx_is(op, "Div")) return x / y;
    if (onnx_is(op, "Mod")) return fmodf(x, y);
    if (onnx_is(op, "Max")) return x > y ? x : y;
    if (onnx_is(op, "Min")) return x < y ? x : y;
    if (onnx_is(op, "Pow")) return powf(x, y);
    if (onnx_is(op, "Equal")) return x == y;
    if (onnx_is(op, "Less")) return x < y;
    if (onnx_is(op, "Greater")) return x > y;
    return NAN;
}

/* Add, Sub, Mul, Div, Pow, Mod, Max, Min, the comparisons, And, Or, Xor of two
 * (Max, Min: of every) input. */
static int fold_binary(onnx_import *c, cval *in, int n) {
    onnx_str op = c->cur->op;
    int cmp = onnx_is(op, "Equal") || onnx_is(op, "Less") || onnx_is(op, "Greater") ||
              onnx_is(op, "And") || onnx_is(op, "Or") || onnx_is(op, "Xor");
    cval acc = in[0];
    int64_t fmod = 0;
    int rc0 = onnx_is(op, "Mod") ? dsrt__onnx_get_int(c, "fmod", 0, &fmod) : 0;
    if (rc0) return rc0;
    for (int j = 1; j < n; j++) {
        cval *b = &in[j], out;
        int nd, rc;
        /* As numbers, the batch's symbol would be INT64_MIN. */
        if (!(acc.is_int && b->is_int) &&
            ((rc = no_batch(c, &acc, "input")) || (rc = no_batch(c, b, "input"))))
            return rc;
        int64_t dims[ONNX_DIMS_MAX];
        if ((rc = broadcast(c, &acc, b, &nd, dims))) return rc;
        int is_int = acc.is_int && b->is_int;
        if ((rc = cv_alloc(c, &out, is_int || cmp, nd, dims))) return rc;
        for (size_t k = 0; k < out.n; k++) {
            size_t ia = bindex(&acc, nd, dims, k), ib = bindex(b, nd, dims, k);
            if (is_int) {
                int bad = 0;
                out.i[k] = int_op(op, acc.i[ia], b->i[ib], fmod != 0, &bad);
                if (bad)
                    return dsrt__onnx_fail(
                        c, DSRT_EUNSUPPORTED,
                        bad == 3   ? "its result depends on the batch size, which dsrt leaves open"
                        : bad == 2 ? "its integers pass 64 bits"
                                   : "it divides by zero or is not integer arithmetic");
            } else {
                float x = (float)num(&acc, ia), y = (float)num(b, ib), r = float_op(op, x, y);
                if (cmp)
                    out.i[k] = (int64_t)r;
                else
                    out.f[k] = r;
            }
        }
        acc = out;
    }
    return cv_out(c, 0, &acc);
}

static int fold_unary(onnx_import *c, cval *x) {
    onnx_str op = c->cur->op;
    cval out;
    int as_int = x->is_int && !onnx_is(op, "Sqrt") && !onnx_is(op, "Reciprocal");
    int rc = cv_alloc(c, &out, as_int, x->ndims, x->dims);
    if (rc) return rc;
    for (size_t k = 0; k < x->n; k++) {
        if (as_int) {
            int64_t v = x->i[k];
            if (v == ONNX_BATCH && !onnx_is(op, "Identity")) return no_batch(c, x, "input");
            out.i[k] = onnx_is(op, "Neg")   ? -v
                       : onnx_is(op, "Abs") ? (v < 0 ? -v : v)
                       : onnx_is(op, "Not") ? !v
                                            : v; /* Floor, Ceil, Identity */
            continue;
        }
        float v = (float)num(x, k);
        out.f[k] = onnx_is(op, "Neg")          ? -v
                   : onnx_is(op, "Abs")        ? fabsf(v)
                   : onnx_is(op, "Sqrt")       ? sqrtf(v)
                   : onnx_is(op, "Floor")      ? floorf(v)
                   : onnx_is(op, "Ceil")       ? ceilf(v)
                   : onnx_is(op, "Reciprocal") ? 1.0f / v
                                               : v;
    }
    return cv_out(c, 0, &out);
}

static int fold_cast(onnx_import *c, cval *x) {
    int64_t to;
    int rc = dsrt__onnx_get_int(c, "to", ONNX_FLOAT, &to);
    if (rc) return rc;
    int is_int = is_int_type((int)to);
    if (!is_int && to != ONNX_FLOAT && to != ONNX_DOUBLE && to != ONNX_FLOAT16)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "a cast to %s",
                               dsrt__onnx_dtype_name((int)to));
    cval out;
    if ((rc = cv_alloc(c, &out, is_int, x->ndims, x->dims))) return rc;
    for (size_t k = 0; k < x->n; k++) {
        if (is_int && x->is_int)
            out.i[k] = to == ONNX_BOOL ? x->i[k] != 0 : x->i[k];
        else if (is_int)
            out.i[k] = to == ONNX_BOOL ? x->f[k] != 0 : (int64_t)x->f[k];
        else {
            if (x->is_int && x->i[k] == ONNX_BATCH) return no_batch(c, x, "input");
            out.f[k] = (float)num(x, k);
        }
    }
    return cv_out(c, 0, &out);
}

static int fold_shape(onnx_import *c, const onnx_val *v) {
    int64_t dims[ONNX_DIMS_MAX], start, end;
    int n = dims_of(c, v, dims), rc;
    if ((rc = dsrt__onnx_get_int(c, "start", 0, &start)) ||
        (rc = dsrt__onnx_get_int(c, "end", n, &end)))
        return rc;
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = DSRT_MAX(0, DSRT_MIN(start, n));
    end = DSRT_MAX(start, DSRT_MIN(end, n));
    cval out;
    int64_t len = end - start;
    if ((rc = cv_alloc(c, &out, 1, 1, &len))) return rc;
    for (int64_t k = 0; k < len; k++) out.i[k] = dims[start + k];
    return cv_out(c, 0, &out);
}

static int fold_gather(onnx_import *c, cval *data, cval *idx) {
    int64_t axis;
    int rc = dsrt__onnx_get_int(c, "axis", 0, &axis);
    if (rc || (rc = need_ints(c, idx, "indices"))) return rc;
    int a = axis_of(axis, data->ndims);
    if (a < 0 || data->ndims + idx->ndims - 1 > ONNX_DIMS_MAX)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "axis %lld of a %d-d value", (long long)axis,
                               data->ndims);
    int64_t dims[ONNX_DIMS_MAX];
    int nd = 0;
    for (int d = 0; d < a; d++) dims[nd++] = data->dims[d];
    for (int d = 0; d < idx->ndims; d++) dims[nd++] = idx->dims[d];
    for (int d = a + 1; d < data->ndims; d++) dims[nd++] = data->dims[d];
    cval out;
    if ((rc = cv_alloc(c, &out, data->is_int, nd, dims))) return rc;
    size_t inner = 1, outer = 1, along = (size_t)data->dims[a];
    for (int d = a + 1; d < data->ndims; d++) inner *= (size_t)data->dims[d];
    for (int d = 0; d < a; d++) outer *= (size_t)data->dims[d];
    size_t at = 0;
    for (size_t o = 0; o < outer; o++)
        for (size_t j = 0; j < idx->n; j++) {
            int64_t q = idx->i[j] < 0 ? idx->i[j] + (int64_t)along : idx->i[j];
            if (q < 0 || (size_t)q >= along)
                return dsrt__onnx_fail(c, DSRT_ECORRUPT, "index %lld out of %zu",
                                       (long long)idx->i[j], along);
            for (size_t k = 0; k < inner; k++, at++) {
                size_t from = (o * along + (size_t)q) * inner + k;
                if (out.is_int)
                    out.i[at] = data->i[from];
                else
                    out.f[at] = data->f[from];
            }
        }
    return cv_out(c, 0, &out);
}

/* The axes of Unsqueeze and Squeeze: the attribute (before opset 13) or
 * input 1. */
static int axes_of(onnx_import *c, cval *in, int n_in, int64_t *axes, int *n) {
    *n = 0;
    if (n_in > 1) {
        int rc = need_ints(c, &in[1], "axes");
        if (rc) return rc;
        if (in[1].n > ONNX_DIMS_MAX) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "too many axes");
        for (size_t k = 0; k < in[1].n; k++) axes[(*n)++] = in[1].i[k];
        return 0;
    }
    const onnx_attr *a = dsrt__onnx_get_attr(c, "axes");
    if (!a) return 0;
    if (a->n_ints > ONNX_DIMS_MAX) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "too many axes");
    for (size_t k = 0; k < a->n_ints; k++) axes[(*n)++] = a->ints[k];
    return 0;
}

static int fold_unsqueeze(onnx_import *c, cval *in, int n_in, int squeeze) {
    int64_t axes[ONNX_DIMS_MAX];
    int na, rc = axes_of(c, in, n_in, axes, &na);
    if (rc) return rc;
    cval out = in[0];
    int rank = squeeze ? in[0].ndims : in[0].ndims + na;
    if (rank > ONNX_DIMS_MAX) return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "too many dimensions");
    int mark[ONNX_DIMS_MAX] = {0};
    for (int k = 0; k < na; k++) {
        int a = axis_of(axes[k], rank);
        if (a < 0 || mark[a] || (squeeze && in[0].dims[a] != 1))
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "axis %lld", (long long)axes[k]);
        mark[a] = 1;
    }
    int nd = 0;
    if (squeeze) {
        for (int d = 0; d < in[0].ndims; d++)
            if (na ? !mark[d] : in[0].dims[d] != 1) out.dims[nd++] = in[0].dims[d];
    } else {
        for (int d = 0, from = 0; d < rank; d++) out.dims[nd++] = mark[d] ? 1 : in[0].dims[from++];
    }
    out.ndims = nd;
    return cv_out(c, 0, &out);
}

static int fold_concat(onnx_import *c, cval *in, int n) {
    int64_t axis;
    int rc = dsrt__onnx_get_int(c, "axis", 0, &axis);
    if (rc) return rc;
    int a = axis_of(axis, in[0].ndims);
    if (a < 0) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "axis %lld", (long long)axis);
    int64_t dims[ONNX_DIMS_MAX];
    memcpy(dims, in[0].dims, sizeof dims);
    dims[a] = 0;
    int is_int = 1;
    for (int k = 0; k < n; k++) {
        if (in[k].ndims != in[0].ndims)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "inputs of different ranks");
        for (int d = 0; d < in[0].ndims; d++)
            if (d != a && in[k].dims[d] != in[0].dims[d])
                return dsrt__onnx_fail(c, DSRT_ECORRUPT, "inputs of different shapes");
        dims[a] += in[k].dims[a];
        is_int &= in[k].is_int;
    }
    cval out;
    if ((rc = cv_alloc(c, &out, is_int, in[0].ndims, dims))) return rc;
    size_t outer = 1, at = 0;
    for (int d = 0; d < a; d++) outer *= (size_t)dims[d];
    for (size_t o = 0; o < outer; o++)
        for (int k = 0; k < n; k++) {
            size_t chunk = in[k].n / (outer ? outer : 1);
            for (size_t q = 0; q < chunk; q++, at++) {
                size_t from = o * chunk + q;
                if (is_int)
                    out.i[at] = in[k].i[from];
                else
                    out.f[at] = (float)num(&in[k], from);
            }
        }
    return cv_out(c, 0, &out);
}

static int fold_slice(onnx_import *c, cval *in, int n_in) {
    cval *x = &in[0];
    int64_t starts[ONNX_DIMS_MAX], ends[ONNX_DIMS_MAX], axes[ONNX_DIMS_MAX], steps[ONNX_DIMS_MAX];
    int n = 0, rc;
    if (c->m.opset < 10) {
        const onnx_attr *s = dsrt__onnx_get_attr(c, "starts"), *e = dsrt__onnx_get_attr(c, "ends"),
                        *a = dsrt__onnx_get_attr(c, "axes");
        if (!s || !e || s->n_ints != e->n_ints || s->n_ints > ONNX_DIMS_MAX)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "starts and ends");
        n = (int)s->n_ints;
        for (int k = 0; k < n; k++) {
            starts[k] = s->ints[k];
            ends[k] = e->ints[k];
            axes[k] = a && (int)a->n_ints == n ? a->ints[k] : k;
            steps[k] = 1;
        }
    } else {
        if (n_in < 3) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "starts and ends are missing");
        for (int j = 1; j < n_in; j++)
            if ((rc = need_ints(c, &in[j], "starts, ends, axes or steps"))) return rc;
        n = (int)in[1].n;
        if (n > ONNX_DIMS_MAX || in[2].n != (size_t)n || (n_in > 3 && in[3].n != (size_t)n) ||
            (n_in > 4 && in[4].n != (size_t)n))
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "starts, ends, axes and steps disagree");
        for (int k = 0; k < n; k++) {
            starts[k] = in[1].i[k];
            ends[k] = in[2].i[k];
            axes[k] = n_in > 3 ? in[3].i[k] : k;
            steps[k] = n_in > 4 ? in[4].i[k] : 1;
        }
    }
    int64_t lo[ONNX_DIMS_MAX], st[ONNX_DIMS_MAX], dims[ONNX_DIMS_MAX];
    for (int d = 0; d < x->ndims; d++) lo[d] = 0, st[d] = 1, dims[d] = x->dims[d];
    for (int k = 0; k < n; k++) {
        int a = axis_of(axes[k], x->ndims);
        int64_t len = x->dims[a < 0 ? 0 : a], s = starts[k], e = ends[k], step = steps[k];
        if (a < 0 || step == 0) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "axis or step");
        if (s < 0) s += len;
        if (e < 0) e += len;
        if (step > 0) {
            s = DSRT_MAX(0, DSRT_MIN(s, len));
            e = DSRT_MAX(0, DSRT_MIN(e, len));
            dims[a] = e > s ? (e - s + step - 1) / step : 0;
        } else {
            s = DSRT_MAX(-1, DSRT_MIN(s, len - 1));
            e = DSRT_MAX(-1, DSRT_MIN(e, len - 1));
            dims[a] = s > e ? (s - e - step - 1) / -step : 0;
        }
        lo[a] = s;
        st[a] = step;
    }
    cval out;
    if ((rc = cv_alloc(c, &out, x->is_int, x->ndims, dims))) return rc;
    for (size_t k = 0; k < out.n; k++) {
        size_t rem = k, from = 0, stride = 1;
        int64_t coord[ONNX_DIMS_MAX];
        for (int d = x->ndims - 1; d >= 0; d--) {
            coord[d] = (int64_t)(rem % (size_t)dims[d]);
            rem /= (size_t)dims[d];
        }
        for (int d = x->ndims - 1; d >= 0; d--) {
            from += (size_t)(lo[d] + coord[d] * st[d]) * stride;
            stride *= (size_t)x->dims[d];
        }
        if (out.is_int)
            out.i[k] = x->i[from];
        else
            out.f[k] = x->f[from];
    }
    return cv_out(c, 0, &out);
}

static int fold_constant_of_shape(onnx_import *c, cval *shape) {
    int rc = need_ints(c, shape, "shape");
    if (rc || (rc = no_batch(c, shape, "shape"))) return rc;
    if (shape->n > ONNX_DIMS_MAX)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "too many dimensions");
    cval fill = {0};
    const onnx_attr *a = dsrt__onnx_get_attr(c, "value");
    if (a && a->t && (rc = cv_of(c, a->t, &fill))) return rc;
    cval out;
    if ((rc = cv_alloc(c, &out, a && a->t ? fill.is_int : 0, (int)shape->n, shape->i))) return rc;
    for (size_t k = 0; k < out.n; k++) {
        if (out.is_int)
            out.i[k] = fill.n ? fill.i[0] : 0;
        else
            out.f[k] = fill.n ? fill.f[0] : 0.0f;
    }
    return cv_out(c, 0, &out);
}

static int fold_range(onnx_import *c, cval *in) {
    for (int k = 0; k < 3; k++) {
        int rc = no_batch(c, &in[k], "start, limit or delta");
        if (rc) return rc;
        if (in[k].n != 1)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "start, limit or delta not one value");
    }
    double s = num(&in[0], 0), l = num(&in[1], 0), d = num(&in[2], 0);
    if (d == 0) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "delta 0");
    int64_t n = (int64_t)fmax(ceil((l - s) / d), 0);
    cval out;
    int rc = cv_alloc(c, &out, in[0].is_int, 1, &n);
    if (rc) return rc;
    for (int64_t k = 0; k < n; k++) {
        if (out.is_int)
            out.i[k] = in[0].i[0] + k * in[2].i[0];
        else
            out.f[k] = (float)(s + (double)k * d);
    }
    return cv_out(c, 0, &out);
}

static int fold_expand(onnx_import *c, cval *x, cval *shape) {
    int rc = need_ints(c, shape, "shape");
    if (rc || (rc = no_batch(c, shape, "shape"))) return rc;
    if (shape->n > ONNX_DIMS_MAX)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "too many dimensions");
    cval to = {.is_int = 1, .ndims = (int)shape->n, .n = 1};
    memcpy(to.dims, shape->i, shape->n * sizeof *shape->i);
    int nd;
    int64_t dims[ONNX_DIMS_MAX];
    if ((rc = broadcast(c, x, &to, &nd, dims))) return rc;
    cval out;
    if ((rc = cv_alloc(c, &out, x->is_int, nd, dims))) return rc;
    for (size_t k = 0; k < out.n; k++) {
        size_t from = bindex(x, nd, dims, k);
        if (out.is_int)
            out.i[k] = x->i[from];
        else
            out.f[k] = x->f[from];
    }
    return cv_out(c, 0, &out);
}

static int fold_reshape(onnx_import *c, cval *x, cval *shape) {
    int rc = need_ints(c, shape, "shape");
    if (rc || (rc = no_batch(c, shape, "shape"))) return rc;
    if (shape->n > ONNX_DIMS_MAX)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "too many dimensions");
    int64_t allow;
    if ((rc = dsrt__onnx_get_int(c, "allowzero", 0, &allow))) return rc;
    cval out = *x;
    out.ndims = (int)shape->n;
    int64_t known = 1;
    int infer = -1;
    for (int d = 0; d < out.ndims; d++) {
        int64_t v = shape->i[d];
        if (v == 0 && !allow) v = d < x->ndims ? x->dims[d] : -2;
        if (v == -1 && infer < 0) {
            infer = d;
            continue;
        }
        if (v < 0) return dsrt__onnx_fail(c, DSRT_ECORRUPT, "shape value %lld", (long long)v);
        out.dims[d] = v;
        known *= v;
    }
    if (infer >= 0) out.dims[infer] = known ? (int64_t)x->n / known : 0;
    int64_t total = 1;
    for (int d = 0; d < out.ndims; d++) total *= out.dims[d];
    if ((size_t)total != x->n)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "a reshape of %zu values to %lld", x->n,
                               (long long)total);
    return cv_out(c, 0, &out);
}

static int fold_transpose(onnx_import *c, cval *x) {
    int64_t perm[ONNX_DIMS_MAX];
    int rc = dsrt__onnx_get_ints(c, "perm", x->ndims, perm);
    if (rc < 0) return rc;
    if (rc == 0)
        for (int d = 0; d < x->ndims; d++) perm[d] = x->ndims - 1 - d;
    int64_t dims[ONNX_DIMS_MAX];
    for (int d = 0; d < x->ndims; d++) {
        if (perm[d] < 0 || perm[d] >= x->ndims)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "perm %lld", (long long)perm[d]);
        dims[d] = x->dims[perm[d]];
    }
    cval out;
    if ((rc = cv_alloc(c, &out, x->is_int, x->ndims, dims))) return rc;
    size_t stride[ONNX_DIMS_MAX];
    for (int d = x->ndims - 1, s = 1; d >= 0; d--) {
        stride[d] = (size_t)s;
        s *= (int)x->dims[d];
    }
    for (size_t k = 0; k < out.n; k++) {
        size_t rem = k, from = 0;
        for (int d = x->ndims - 1; d >= 0; d--) {
            size_t coord = rem % (size_t)dims[d];
            rem /= (size_t)dims[d];
            from += coord * stride[perm[d]];
        }
        if (out.is_int)
            out.i[k] = x->i[from];
        else
            out.f[k] = x->f[from];
    }
    return cv_out(c, 0, &out);
}

static int fold_where(onnx_import *c, cval *in) {
    int rc, nd, nd2;
    if ((rc = no_batch(c, &in[0], "condition"))) return rc;
    int64_t d1[ONNX_DIMS_MAX], d2[ONNX_DIMS_MAX];
    if ((rc = broadcast(c, &in[1], &in[2], &nd, d1))) return rc;
    cval ab = {.ndims = nd, .n = 1};
    memcpy(ab.dims, d1, sizeof d1);
    if ((rc = broadcast(c, &in[0], &ab, &nd2, d2))) return rc;
    int is_int = in[1].is_int && in[2].is_int;
    cval out;
    if ((rc = cv_alloc(c, &out, is_int, nd2, d2))) return rc;
    for (size_t k = 0; k < out.n; k++) {
        int cond = num(&in[0], bindex(&in[0], nd2, d2, k)) != 0;
        cval *src = cond ? &in[1] : &in[2];
        size_t from = bindex(src, nd2, d2, k);
        if (is_int)
            out.i[k] = src->i[from];
        else
            out.f[k] = (float)num(src, from);
    }
    return cv_out(c, 0, &out);
}

/* Clip of a constant: its bounds the inputs min and max (either left out),
 * or before opset 11 the attributes. */
static int fold_clip(onnx_import *c, cval *in, int n_in) {
    cval *x = &in[0], out;
    double lo = -INFINITY, hi = INFINITY;
    if (c->m.opset > 0 && c->m.opset < 11) {
        float a, b;
        int rc = dsrt__onnx_get_float(c, "min", -INFINITY, &a);
        if (rc || (rc = dsrt__onnx_get_float(c, "max", INFINITY, &b))) return rc;
        lo = a;
        hi = b;
    }
    for (int k = 1; k < n_in && k < 3; k++) {
        if (!in[k].n) continue;
        if (in[k].n != 1)
            return dsrt__onnx_fail(c, DSRT_ECORRUPT, "its %s is not one value",
                                   k == 1 ? "min" : "max");
        if (in[k].is_int && in[k].i[0] == ONNX_BATCH) return no_batch(c, &in[k], "bound");
        double b = num(&in[k], 0);
        if (k == 1)
            lo = b;
        else
            hi = b;
    }
    int rc = cv_alloc(c, &out, x->is_int, x->ndims, x->dims);
    if (rc) return rc;
    for (size_t k = 0; k < x->n; k++) {
        if (x->is_int) {
            int64_t v = x->i[k];
            if (v == ONNX_BATCH) return no_batch(c, x, "input");
            out.i[k] = v < lo ? (int64_t)lo : v > hi ? (int64_t)hi : v;
        } else {
            float v = x->f[k];
            out.f[k] = v < (float)lo ? (float)lo : v > (float)hi ? (float)hi : v;
        }
    }
    return cv_out(c, 0, &out);
}

// ----------------------------------------------------------------------------
// The entry

int dsrt__onnx_fold(onnx_import *c) {
    const onnx_node *n = c->cur;
    if ((n->domain.n && !onnx_is(n->domain, "ai.onnx")) || !listed(FOLDED, n->op)) return 0;
    if (n->n_in < 1 || n->n_in > 16) return 0;
    onnx_val *v[16];
    for (int k = 0; k < n->n_in; k++) {
        v[k] = n->in[k].n ? dsrt__onnx_input(c, k) : NULL;
        if (n->in[k].n && !v[k]) return c->err ? c->err : DSRT_ECORRUPT;
    }
    if (onnx_is(n->op, "Shape")) return fold_shape(c, v[0]) ?: 1;
    /* Every other folds only constants (an input left out counts as one). */
    for (int k = 0; k < n->n_in; k++)
        if (v[k] && v[k]->kind != ONNX_V_CONST) return 0;
    cval in[16];
    int n_in = n->n_in;
    while (n_in > 0 && !v[n_in - 1]) n_in--;
    for (int k = 0; k < n_in; k++) {
        if (!v[k]) {
            if (!onnx_is(n->op, "Slice") && !onnx_is(n->op, "Clip"))
                return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "input %d is left out", k);
            memset(&in[k], 0, sizeof in[k]);
            continue;
        }
        int rc = cv_of(c, v[k]->t, &in[k]);
        if (rc) return rc;
    }
    onnx_str op = n->op;
    int rc;
    if (onnx_is(op, "Gather"))
        rc = n_in == 2 ? fold_gather(c, &in[0], &in[1]) : DSRT_ECORRUPT;
    else if (onnx_is(op, "Unsqueeze") || onnx_is(op, "Squeeze"))
        rc = fold_unsqueeze(c, in, n_in, onnx_is(op, "Squeeze"));
    else if (onnx_is(op, "Concat"))
        rc = fold_concat(c, in, n_in);
    else if (onnx_is(op, "Slice"))
        rc = fold_slice(c, in, n_in);
    else if (onnx_is(op, "Cast"))
        rc = fold_cast(c, &in[0]);
    else if (onnx_is(op, "ConstantOfShape"))
        rc = fold_constant_of_shape(c, &in[0]);
    else if (onnx_is(op, "Range"))
        rc = n_in == 3 ? fold_range(c, in) : DSRT_ECORRUPT;
    else if (onnx_is(op, "Expand"))
        rc = n_in == 2 ? fold_expand(c, &in[0], &in[1]) : DSRT_ECORRUPT;
    else if (onnx_is(op, "Reshape"))
        rc = n_in == 2 ? fold_reshape(c, &in[0], &in[1]) : DSRT_ECORRUPT;
    else if (onnx_is(op, "Transpose"))
        rc = fold_transpose(c, &in[0]);
    else if (onnx_is(op, "Where"))
        rc = n_in == 3 ? fold_where(c, in) : DSRT_ECORRUPT;
    else if (onnx_is(op, "Clip"))
        rc = fold_clip(c, in, n_in);
    else if (n_in == 1)
        rc = fold_unary(c, &in[0]);
    else
        rc = fold_binary(c, in, n_in);
    if (rc == DSRT_ECORRUPT && !c->err) rc = dsrt__onnx_fail(c, DSRT_ECORRUPT, "%d inputs", n_in);
    return rc ? rc : 1;
}
