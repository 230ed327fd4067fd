/*
 * dsrt.Net: a dsrt_net with a lock (a net belongs to one thread at a time),
 * its class names, its properties and methods (net_methods: load.c,
 * predict.c, classify.c and the writers below fill them), and its type.
 */
#include "nn.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// The Net object

/* Takes the net's lock, waiting without the GIL when another thread has it. */
void net_lock(NetObject *self) {
    if (PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) return;
    PyThreadState *ts = PyEval_SaveThread();
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    PyEval_RestoreThread(ts);
}

void net_unlock(NetObject *self) {
    PyThread_release_lock(self->lock);
}

/* Grows the scratch to n floats (under the lock, without the GIL). */
int x_reserve(NetObject *self, size_t n) {
    if (n <= self->x_cap) return 0;
    float *x = realloc(self->x, n * sizeof *x);
    if (!x) {
        self->oom = "out of memory for the net's input";
        return -ENOMEM;
    }
    self->x = x;
    self->x_cap = n;
    return 0;
}

static void net_dealloc(NetObject *self) {
    dsrt_net_destroy(self->net);
    dsrt_decoder_destroy(self->dec);
    dsrt_augmenter_destroy(self->aug);
    free(self->x);
    free(self->hwc);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The class names the net's description holds, as a tuple, or None. */
PyObject *class_names(const dsrt_net *net, int classes) {
    char name[256];
    if (dsrt_net_class_name(net, 0, name, sizeof name) < 0) Py_RETURN_NONE;
    PyObject *t = PyTuple_New(classes);
    if (!t) return NULL;
    for (int c = 0; c < classes; c++) {
        PyObject *s;
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            s = PyUnicode_FromFormat("%d", c);
        else
            s = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, c, s);
    }
    return t;
}

/* A Net owning net (destroyed on failure), images sized as ao says. */
PyObject *net_wrap(dsrt_net *net, const dsrt_augment_options *ao) {
    NetObject *self = (NetObject *)Net_Type.tp_alloc(&Net_Type, 0);
    if (!self) {
        dsrt_net_destroy(net);
        return NULL;
    }
    self->net = net;
    dsrt_net_get_info(net, &self->info);
    self->ao = *ao;
    self->ao.output_height = self->info.height;
    self->ao.output_width = self->info.width;
    /* The augmenter makes the 1- or 3-channel input of image files and
     * uint8 arrays; other channel counts take arrays of the net's size. */
    self->ao.output_channels = self->info.channels == 1 ? 1 : 3;
    int rc = dsrt_augment_check(&self->ao);
    if (rc != 0) {
        raise_code(rc, NULL);
        goto fail;
    }
    if (!(self->lock = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((rc = dsrt_decoder_create(&self->dec, NULL)) != 0 ||
        (rc = dsrt_augmenter_create(&self->aug)) != 0) {
        raise_code(rc, NULL);
        goto fail;
    }
    if (!(self->names = class_names(net, self->info.classes))) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

// ----------------------------------------------------------------------------
// Writing: save and export

static PyObject *net_save(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", NULL};
    PyObject *path_o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:save", kwlist, &path_o)) return NULL;
    PyObject *path = fs_path(path_o);
    if (!path) return NULL;
    int rc;
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_model_save(PyBytes_AS_STRING(path), self->net);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    Py_DECREF(path);
    if (rc != 0) return raise_code(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *net_export(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "opset", NULL};
    PyObject *path_o;
    dsrt_onnx_export_options o = dsrt_onnx_export_defaults();
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$i:export", kwlist, &path_o, &o.opset))
        return NULL;
    if (o.opset < 7 || o.opset > 21) {
        PyErr_Format(PyExc_ValueError, "export: opset %d: dsrt writes opsets 7 to 21", o.opset);
        return NULL;
    }
    PyObject *path = fs_path(path_o);
    if (!path) return NULL;
    int rc;
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_onnx_export(self->net, PyBytes_AS_STRING(path), &o);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    Py_DECREF(path);
    if (rc != 0) return raise_code(rc, NULL);
    Py_RETURN_NONE;
}

// ----------------------------------------------------------------------------
// Properties

static PyObject *net_input_shape(NetObject *self, void *unused) {
    return Py_BuildValue("(iii)", self->info.channels, self->info.height, self->info.width);
}

static PyObject *net_classes(NetObject *self, void *unused) {
    return Py_NewRef(self->names);
}

static PyObject *net_num_classes(NetObject *self, void *unused) {
    return PyLong_FromLong(self->info.classes);
}

static PyObject *net_learnables(NetObject *self, void *unused) {
    return PyLong_FromSize_t(self->info.learnable);
}

static PyObject *net_layers(NetObject *self, void *unused) {
    PyObject *t = PyTuple_New(self->info.layers);
    for (int i = 0; t && i < self->info.layers; i++) {
        dsrt_layer_info li;
        PyObject *pair = dsrt_net_layer(self->net, i, &li) == 0
                             ? Py_BuildValue("(ss)", li.name, li.type)
                             : raise_code(-EINVAL, NULL);
        if (!pair)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, pair);
    }
    return t;
}

static PyObject *net_description(NetObject *self, void *unused) {
    const char *d = dsrt_net_description(self->net);
    return PyUnicode_DecodeUTF8(d, (Py_ssize_t)strlen(d), "replace");
}

static PyObject *net_backend(NetObject *self, void *unused) {
    return PyUnicode_FromString(self->info.backend);
}

static PyObject *net_threads(NetObject *self, void *unused) {
    return PyLong_FromLong(dsrt_net_threads(self->net));
}

static PyObject *net_repr(NetObject *self) {
    return PyUnicode_FromFormat("<dsrt.Net: %d layers, input (%d, %d, %d), %d classes, %zu "
                                "learnables>",
                                self->info.layers, self->info.channels, self->info.height,
                                self->info.width, self->info.classes, self->info.learnable);
}

static PyObject *net_options(PyObject *unused_self, PyObject *unused) {
    (void)unused_self, (void)unused;
    const dsrt_option_group *groups;
    size_t n = dsrt_train_option_groups(&groups);
    return options_list(groups, n);
}

static PyMethodDef net_methods[] = {
    {"options", net_options, METH_NOARGS | METH_STATIC,
     "Net.options() -> the training and inference option rows, one dict each, as\n"
     "dsrt.options() gives the data side's: those whose where holds 'Net' are Net.load's\n"
     "and onnx_import's keywords."},
    {"load", (PyCFunction)(void (*)(void))net_load, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Net.load(path, *, preprocess=None, input_scale=None, mean=None, std=None,\n"
     "         input_size=None, classes=None, size_mode='resize', resize_shorter=0,\n"
     "         threads=0) -> Net\n\n"
     "Loads a dsrt model or checkpoint file, or imports an ONNX model (a path ending in\n"
     ".onnx), as `dstrain classify --model` does. For an ONNX model: preprocess\n"
     "('torchvision' or 'none'), input_scale, mean and std (one value or one a channel)\n"
     "say how the model wants its pixels (it takes pixels x input_scale, less mean, over\n"
     "std), written into the net's input layer; input_size=(height, width) fixes a size\n"
     "the model leaves open. A dsrt model keeps its own normalisation and refuses them.\n"
     "classes: the class names, a list or the path of a file of one name a line (the\n"
     "C library's parser, dstrain's --classes), as many as the model's classes.\n"
     "size_mode ('resize' or 'centercrop') and resize_shorter (the shorter side first\n"
     "resized to it, 0: not) say how image files and uint8 arrays are brought to the\n"
     "net's input size. threads: compute threads, 0 for every core. Raises ValueError\n"
     "for a bad option, OSError when a file cannot be read, dsrt.Error for a model the\n"
     "library refuses, with its message."},
    {"predict", (PyCFunction)(void (*)(void))net_predict, METH_VARARGS | METH_KEYWORDS,
     "predict(x, *, layout='auto', batch=64) -> numpy.ndarray (n, classes) float32\n\n"
     "Class probabilities of images: x a NumPy array or any tensor with __dlpack__ in\n"
     "host memory (a torch CPU tensor), 4-D (a batch) or 3-D (one image). uint8 holds\n"
     "pixels 0 to 255, made into the net's input exactly as image files are (resized\n"
     "as the load's size_mode and resize_shorter say; 1 or 3 channels); float32 is the\n"
     "net's input itself, values 0 to 1 (a Pipeline's float32 batch, torchvision's\n"
     "ToTensor), of the net's height and width. layout 'NCHW' or 'NHWC' ('CHW'/'HWC'\n"
     "for one image); 'auto' takes the one whose channel dimension holds the net's\n"
     "channels and refuses a shape where both do. Any strides are read. A float32 NCHW\n"
     "array laid out contiguously is read in place; others are copied batch by batch.\n"
     "Raises TypeError for an unsupported dtype or object, ValueError for a wrong rank,\n"
     "channel count or size. The GIL is released while computing."},
    {"classify", (PyCFunction)(void (*)(void))net_classify, METH_VARARGS | METH_KEYWORDS,
     "classify(paths, *, batch=64, with_paths=False) -> numpy.ndarray (n, classes)\n\n"
     "Class probabilities of image files (JPEG, PNG, WebP), decoded by dsrt's decoders and\n"
     "sized as `dstrain classify` does: the same numbers as its --json scores. paths: one\n"
     "path or a sequence; a folder stands for its images (sub-folders too) in dsrt's\n"
     "sorted order. with_paths=True returns (files, probabilities). A file that cannot\n"
     "be read raises OSError with its name, one that does not decode dsrt.Error naming\n"
     "it. top(probabilities) gives the labels. The GIL is released while computing."},
    {"top", (PyCFunction)(void (*)(void))net_top, METH_VARARGS | METH_KEYWORDS,
     "top(probabilities, k=3) -> [[(label, probability), ...], ...]\n\n"
     "The k likeliest classes of each row of probabilities ((n, classes), or one row\n"
     "(classes,)), likeliest first, as `dstrain classify` lists them: the label is the\n"
     "class name, or its number when the model names none. A row that is not finite\n"
     "raises ValueError."},
    {"save", (PyCFunction)(void (*)(void))net_save, METH_VARARGS | METH_KEYWORDS,
     "save(path)\n\nWrites the net as a dsrt model file (description, class names,\n"
     "weights, statistics), atomically: the file is complete or absent."},
    {"export", (PyCFunction)(void (*)(void))net_export, METH_VARARGS | METH_KEYWORDS,
     "export(path, *, opset=13)\n\nWrites the net as an ONNX model, as `dstrain export`:\n"
     "its inference graph taking 'pixels' (float32 NCHW, values 0 to 255, any batch\n"
     "size), the softmax output 'probabilities', the class names in metadata_props."},
    {NULL}};

static PyGetSetDef net_getset[] = {
    {"input_shape", (getter)net_input_shape, NULL, "(channels, height, width) of the net's input",
     NULL},
    {"classes", (getter)net_classes, NULL,
     "the class names, a tuple in class order, or None when the model names none", NULL},
    {"num_classes", (getter)net_num_classes, NULL, "the number of classes (scores a row)", NULL},
    {"learnables", (getter)net_learnables, NULL, "the number of learnable parameters", NULL},
    {"layers", (getter)net_layers, NULL,
     "the layers, the input layer first: a tuple of (name, type)", NULL},
    {"description", (getter)net_description, NULL, "the description the net was built from", NULL},
    {"backend", (getter)net_backend, NULL, "where it computes: 'cpu-onednn'", NULL},
    {"threads", (getter)net_threads, NULL, "CPU compute threads", NULL},
    {NULL}};

PyTypeObject Net_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Net",
    .tp_basicsize = sizeof(NetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A trained network, for inference: Net.load(path, ...) makes one.\n\n"
              "What `dstrain classify` does, from Python: predict(array) on NumPy arrays or\n"
              "DLPack tensors, classify(paths) on image files, top(probabilities) for the\n"
              "labels; save(path) and export(path) write it as a dsrt or ONNX model. Every\n"
              "computation releases the GIL; one Net computes for one thread at a time (others\n"
              "wait).",
    .tp_dealloc = (destructor)net_dealloc,
    .tp_repr = (reprfunc)net_repr,
    .tp_methods = net_methods,
    .tp_getset = net_getset,
};
