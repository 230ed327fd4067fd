/*
 * dsrt._dsrt: the CPython extension behind the dsrt Python package.
 *
 * It wraps the public C API (the headers under include/dsrt) and nothing else: a Datastore
 * is a dsrt_datastore, a Pipeline a dsrt_pipeline, a Batch one lent
 * dsrt_batch. A batch's samples and labels are handed to NumPy and PyTorch
 * without a copy, through DLPack (__dlpack__, __dlpack_device__) and the
 * buffer protocol: each exported tensor keeps its Batch alive, and the Batch
 * gives its slot back to the pipeline (dsrt_batch_release) when the last
 * tensor viewing it is freed. Holding tensors therefore holds slots: the
 * pipeline makes at most prefetch + 1 consecutive batches at a time, and
 * asking for one more while the oldest is still referenced raises dsrt.Error
 * (after a garbage collection, in case only a reference cycle held it)
 * rather than waiting for ever.
 *
 * Waiting for a batch releases the GIL and wakes every 100 ms to let Python
 * run its signal handlers, so Ctrl-C raises KeyboardInterrupt promptly;
 * closing the pipeline (close(), the context manager, or the object's end)
 * stops and joins the workers. A Pipeline belongs to one thread at a time.
 *
 * Misuse raises rather than crashes or hangs: in a child made by os.fork()
 * the parent's pipelines are dead (fork copies only the calling thread, so
 * their workers do not exist there): using one raises, closing or freeing
 * it abandons it at once, and the child may open pipelines of its own.
 * Opening again (__init__) a Datastore a Pipeline reads, or a Pipeline that
 * is open or has batches alive, is refused; every method and getter of an
 * object whose __init__ never ran raises ValueError.
 *
 * One file a type: datastore.c, pipeline.c (pipeline_options.c its augment
 * keywords), batch.c, tensor.c; names.c the names keywords take; this file
 * the module's functions and its initialisation.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

PyObject *dsrt_error;

static PyObject *mod_version(PyObject *m, PyObject *unused) {
    return PyUnicode_FromString(dsrt_version_string());
}

static PyObject *mod_options(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    const dsrt_option_group *groups;
    size_t n = dsrt_option_groups(&groups);
    return options_list(groups, n);
}

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS, "version() -> the version of libdsrt in use"},
    {"options", mod_options, METH_NOARGS,
     "options() -> the data side's option rows, one dict each: name (as a keyword),\n"
     "option (as dsbench spells it), group, type, default, choices, help, where, old"},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_dsrt",
    .m_doc = "dsrt's datastore and background pipeline, with batches lent to NumPy and\n"
             "PyTorch without a copy (DLPack).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__dsrt(void) {
    PyTypeObject *types[] = {&Datastore_Type, &Pipeline_Type, &Batch_Type, &Tensor_Type};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    dsrt_error = PyErr_NewExceptionWithDoc(
        "dsrt.Error", "A failure reported by libdsrt; .code is its (negative) code.",
        PyExc_RuntimeError, NULL);
    if (!dsrt_error || PyModule_AddObjectRef(m, "Error", dsrt_error) < 0) goto fail;
    static const char *names[] = {"Datastore", "Pipeline", "Batch", "Tensor"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
