/*
 * dsrt.Batch: one batch lent by the pipeline (dsrt_batch), its tensors and
 * labels; its slot goes back to the pipeline (dsrt_batch_release) when the
 * last tensor viewing it is freed.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Batch

static void batch_dealloc(BatchObject *self) {
    PipelineObject *pipe = self->pipe;
    if (pipe && self->b) {
        uint64_t g = self->b->global;
        if (pipe->p && !pipeline_forked(pipe)) {
            if (pipe->held) pipe->held[g % pipe->slots] = UINT64_MAX;
            if (dsrt_batch_release(pipe->p, self->b) != 0) {
                PyErr_SetString(PyExc_RuntimeError, dsrt_last_error());
                PyErr_WriteUnraisable((PyObject *)self);
            }
        }
        pipe->live--;
        if (pipe->closing && pipe->live == 0) pipeline_really_close(pipe);
    }
    Py_XDECREF(pipe);
    PyObject_Free(self);
}

static const DLDataType dt_f32 = {DL_FLOAT, 32, 1}, dt_u8 = {DL_UINT, 8, 1},
                        dt_i32 = {DL_INT, 32, 1}, dt_u32 = {DL_UINT, 32, 1};

/* Sample i of a native-size batch: (C, h, w) or (h, w, C). */
static PyObject *native_sample(void *batch, size_t i) {
    BatchObject *self = batch;
    const dsrt_batch *b = self->b;
    int f32 = b->layout == DSRT_AUGMENT_F32_NCHW;
    int64_t h = b->sizes[2 * i], w = b->sizes[2 * i + 1];
    int64_t c = f32 ? b->shape[1] : b->shape[3];
    int64_t shape[3] = {c, h, w};
    if (!f32) shape[0] = h, shape[1] = w, shape[2] = c;
    return (PyObject *)tensor_new(self, (char *)b->data + i * b->sample_stride,
                                  f32 ? dt_f32 : dt_u8, f32 ? "f" : "B", 3, shape);
}

static PyObject *batch_images(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    int f32 = b->layout == DSRT_AUGMENT_F32_NCHW;
    if (b->shape[2] == 0) /* native: one tensor a sample */
        return sequence_of(b->count, 1, native_sample, self);
    int64_t shape[4] = {(int64_t)b->count, b->shape[1], b->shape[2], b->shape[3]};
    return (PyObject *)tensor_new(self, b->data, f32 ? dt_f32 : dt_u8, f32 ? "f" : "B", 4, shape);
}

static PyObject *batch_labels(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->labels, dt_i32, "i", 1, shape);
}

static PyObject *batch_soft_labels(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    if (!b->soft_labels) Py_RETURN_NONE;
    int64_t shape[2] = {(int64_t)b->count, (int64_t)b->classes};
    return (PyObject *)tensor_new(self, b->soft_labels, dt_f32, "f", 2, shape);
}

static PyObject *batch_mix_lambda(BatchObject *self, void *unused) {
    return PyFloat_FromDouble(self->b->mix_lambda);
}

static PyObject *batch_mix_box(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    if (!b->mix_cutmix) Py_RETURN_NONE;
    return Py_BuildValue("(iiii)", b->mix_box[0], b->mix_box[1], b->mix_box[2], b->mix_box[3]);
}

static PyObject *batch_ids(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->ids, dt_u32, "I", 1, shape);
}

static PyObject *batch_sources(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->sources, dt_i32, "i", 1, shape);
}

static PyObject *batch_sizes(BatchObject *self, void *unused) {
    int64_t shape[2] = {(int64_t)self->b->count, 2};
    return (PyObject *)tensor_new(self, self->b->sizes, dt_i32, "i", 2, shape);
}

static PyObject *batch_count(BatchObject *self, void *unused) {
    return PyLong_FromSize_t(self->b->count);
}
static PyObject *batch_epoch(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->epoch);
}
static PyObject *batch_index(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->index);
}
static PyObject *batch_global(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->global);
}

static Py_ssize_t batch_len(BatchObject *self) {
    return (Py_ssize_t)self->b->count;
}

static PyObject *batch_repr(BatchObject *self) {
    return PyUnicode_FromFormat("<dsrt.Batch epoch %llu index %llu: %zu samples>",
                                (unsigned long long)self->b->epoch,
                                (unsigned long long)self->b->index, self->b->count);
}

static PyGetSetDef batch_getset[] = {
    {"images", (getter)batch_images, NULL,
     "the samples: a Tensor (count, C, H, W) float32 or (count, H, W, C) uint8; in native\n"
     "mode a tuple of one Tensor per sample, each at its own size",
     NULL},
    {"labels", (getter)batch_labels, NULL, "class index of each sample: Tensor (count,) int32",
     NULL},
    {"soft_labels", (getter)batch_soft_labels, NULL,
     "targets with mixup, cutmix or label smoothing: Tensor (count, classes) float32, each\n"
     "row summing to 1 (what nn.CrossEntropyLoss and timm's SoftTargetCrossEntropy take);\n"
     "None without them",
     NULL},
    {"mix_lambda", (getter)batch_mix_lambda, NULL,
     "weight of each sample's own image and label (1.0 when the batch was not mixed)", NULL},
    {"mix_box", (getter)batch_mix_box, NULL,
     "cutmix: the box (y0, y1, x0, x1) that holds the partner's pixels; None otherwise", NULL},
    {"ids", (getter)batch_ids, NULL,
     "datastore id of the sample that filled each place: Tensor (count,) uint32", NULL},
    {"sizes", (getter)batch_sizes, NULL, "height and width of each sample: Tensor (count, 2) int32",
     NULL},
    {"sources", (getter)batch_sources, NULL,
     "the mix source each sample came from: Tensor (count,) int32 (0 when not a mix)", NULL},
    {"count", (getter)batch_count, NULL, "samples in this batch", NULL},
    {"epoch", (getter)batch_epoch, NULL, "epoch, from 0", NULL},
    {"index", (getter)batch_index, NULL, "batch in its epoch, from 0", NULL},
    {"global_index", (getter)batch_global, NULL, "epoch * batches_per_epoch + index", NULL},
    {NULL}};

static PySequenceMethods batch_as_sequence = {.sq_length = (lenfunc)batch_len};

PyTypeObject Batch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch lent by a Pipeline. Its slot goes back to the pipeline when the Batch\n"
              "and every Tensor (and every DLPack or buffer view) made from it are freed.",
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_repr = (reprfunc)batch_repr,
    .tp_getset = batch_getset,
    .tp_as_sequence = &batch_as_sequence,
};
