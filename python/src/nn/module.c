/*
 * dsrt._nn: networks for the dsrt Python package (dsrt.Net, dsrt.onnx_import).
 *
 * A Net is a dsrt_net loaded from a model file (dsrt_model_load) or imported
 * from an ONNX model (dsrt_onnx_import), with what `dstrain classify` does
 * around it: image files decoded by dsrt's decoders and sized by its
 * augmenter, softmax probabilities from dsrt_net_predict, the class names of
 * the model. Arrays come in through the buffer protocol (NumPy) or DLPack
 * (__dlpack__: PyTorch, JAX, ...); probabilities go out as NumPy arrays.
 *
 * This extension is separate from dsrt._dsrt on purpose. _dsrt carries the
 * data library inside it and loads no compute library; _nn links the shared
 * libdsrt_train (and through it oneDNN), so it is loaded only when the
 * package first needs a network (dsrt/__init__.py imports it on first use of
 * dsrt.Net or dsrt.onnx_import). Its RUNPATH finds libdsrt_train beside the
 * module (a pip install copies it there), in the build tree, or in the
 * install's library folder.
 *
 * Every computation (reading arrays, decoding, the forward pass, saving)
 * runs with the GIL released; a Net's lock keeps two Python threads from
 * using one dsrt_net at once (a net belongs to one thread at a time).
 *
 * One file a part: net.c the Net type and its properties, load.c loading
 * and ONNX import, predict.c predict and top, classify.c image files,
 * arrays.c arrays in, files.c files; this file the module.
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

PyObject *dsrt_error;

// ----------------------------------------------------------------------------
// Module

static PyMethodDef module_methods[] = {
    {"onnx_import", (PyCFunction)(void (*)(void))mod_onnx_import, METH_VARARGS | METH_KEYWORDS,
     "onnx_import(src, dst, *, preprocess=None, input_scale=None, mean=None, std=None,\n"
     "            input_size=None, classes=None, size_mode='resize', resize_shorter=0,\n"
     "            threads=0) -> Net\n\n"
     "Imports the ONNX model src and writes it as the dsrt model file dst, as `dstrain\n"
     "import` does (dst must not be src); returns the net. The keywords are Net.load's."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_nn",
    .m_doc = "dsrt's networks for inference (libdsrt_train on oneDNN), loaded on first use.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__nn(void) {
    if (PyType_Ready(&Net_Type) < 0) return NULL;
    /* dsrt.Error is _dsrt's: both extensions raise the one class. */
    PyObject *data = PyImport_ImportModule("dsrt._dsrt");
    if (!data) return NULL;
    dsrt_error = PyObject_GetAttrString(data, "Error");
    Py_DECREF(data);
    if (!dsrt_error) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Net", (PyObject *)&Net_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
