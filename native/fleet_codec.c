/* fleet._codec: the look a payload gets before it is pickled, in C.
 *
 * Every submit asks whether its payload holds a `bytes` object large enough to travel
 * beside the pickle (fleet.worker.codec: pickle keeps `bytes` in band, so a large one
 * found first is set aside instead of being copied into the pickle). The answer is
 * almost always no, for a call's few small arguments; in Python the walk over them was
 * a fifth of the caller's cost per submit (three frames for `(fn, args, kwargs)`), about
 * 4% of the Executor's submit throughput. Here it is one C call.
 *
 * `BlobScan(min_bytes, max_len, depth, pickled_type, calls_type).holds(obj)` is the rule:
 * True when `obj` is a `bytes` of `min_bytes` or more, or a `pickled_type` whose `data`
 * is that long (a payload pickled elsewhere), or when such an object is found in the
 * tuples, lists, dicts (their values) and `calls_type` chunks (their `items`) of its
 * first `depth` levels, each of at most `max_len` items. Deeper, or in longer
 * containers, nothing is looked at (a large `bytes` there stays in band). Types are
 * matched exactly: a subclass is an object like any other, as pickle sees it.
 *
 * `.plain(obj)` is the other question every submit asks: whether `obj` is made of
 * nothing but atoms (None, bool, int, float, complex, a str of fewer than `min_bytes`
 * characters, a bytes of fewer than `min_bytes` bytes) in tuples, lists and dicts (keys and values) of its first `depth`
 * levels, each of at most `max_len` items. Such a value is pickled as it is: pickle
 * calls no Python code for it, it cannot fail (but for memory), and it holds nothing
 * to set aside (no buffer, no large `bytes`). A call by name of a few small arguments,
 * the common unit, is one; deeper or longer, or any other type, is not (the whole
 * path looks at it).
 *
 * This is a CPython extension module, not a cffi one: it reads Python objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t min_bytes;
    Py_ssize_t max_len;
    int depth;
    PyObject *pickled_type;
    PyObject *calls_type;
} BlobScan;

static PyObject *str_data, *str_items;

/* 1: holds one; 0: not; -1: an error is set. */
static int scan(BlobScan *s, PyObject *obj, int depth) {
    PyTypeObject *kind = Py_TYPE(obj);
    if (kind == &PyBytes_Type)
        return PyBytes_GET_SIZE(obj) >= s->min_bytes;
    if ((PyObject *)kind == s->pickled_type) {
        PyObject *data = PyObject_GetAttr(obj, str_data);
        if (data == NULL)
            return -1;
        Py_ssize_t n = PyObject_Length(data);
        Py_DECREF(data);
        return n < 0 ? -1 : n >= s->min_bytes;
    }
    if (!depth)
        return 0;
    if (kind == &PyDict_Type) {
        if (PyDict_GET_SIZE(obj) > s->max_len)
            return 0;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            Py_INCREF(value);  /* scan() may run a getattr: hold what we look at */
            int found = scan(s, value, depth - 1);
            Py_DECREF(value);
            if (found)
                return found;
        }
        return 0;
    }
    PyObject *seq;
    if ((PyObject *)kind == s->calls_type) {
        seq = PyObject_GetAttr(obj, str_items);
        if (seq == NULL)
            return -1;
        if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
            Py_DECREF(seq);
            return 0;
        }
    } else if (kind == &PyTuple_Type || kind == &PyList_Type) {
        seq = Py_NewRef(obj);
    } else {
        return 0;
    }
    int found = 0;
    if (PySequence_Fast_GET_SIZE(seq) <= s->max_len) {
        /* A list's size is read again at each step: nothing here runs Python code that
         * could change it, but a getattr above is Python's to run. */
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && !found; i++) {
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
            found = scan(s, item, depth - 1);
            Py_DECREF(item);
        }
    }
    Py_DECREF(seq);
    return found;
}

/* 1: plain; 0: not. It runs no Python code (type checks only), so nothing it looks
 * at can change under it. */
static int plain(BlobScan *s, PyObject *obj, int depth) {
    PyTypeObject *kind = Py_TYPE(obj);
    if (obj == Py_None || kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyBool_Type ||
        kind == &PyComplex_Type)
        return 1;
    if (kind == &PyUnicode_Type)
        return PyUnicode_GET_LENGTH(obj) < s->min_bytes;
    if (kind == &PyBytes_Type)
        return PyBytes_GET_SIZE(obj) < s->min_bytes;
    if (!depth)
        return 0;
    if (kind == &PyTuple_Type || kind == &PyList_Type) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        if (n > s->max_len)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!plain(s, PySequence_Fast_GET_ITEM(obj, i), depth - 1))
                return 0;
        return 1;
    }
    if (kind == &PyDict_Type) {
        if (PyDict_GET_SIZE(obj) > s->max_len)
            return 0;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value))
            if (!plain(s, key, depth - 1) || !plain(s, value, depth - 1))
                return 0;
        return 1;
    }
    return 0;
}

static PyObject *blob_scan_plain(BlobScan *self, PyObject *obj) {
    return PyBool_FromLong(plain(self, obj, self->depth));
}

static PyObject *blob_scan_holds(BlobScan *self, PyObject *obj) {
    int found = scan(self, obj, self->depth);
    if (found < 0)
        return NULL;
    return PyBool_FromLong(found);
}

static int blob_scan_init(BlobScan *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"min_bytes", "max_len", "depth", "pickled_type", "calls_type", NULL};
    Py_ssize_t min_bytes, max_len;
    int depth;
    PyObject *pickled, *calls;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nniOO:BlobScan", names, &min_bytes, &max_len, &depth, &pickled,
                                     &calls))
        return -1;
    if (min_bytes < 0 || max_len < 0 || depth < 0 || depth > 64) {
        PyErr_SetString(PyExc_ValueError, "BlobScan: min_bytes and max_len must be >= 0, depth 0-64");
        return -1;
    }
    if (!PyType_Check(pickled) || !PyType_Check(calls)) {
        PyErr_SetString(PyExc_TypeError, "BlobScan: pickled_type and calls_type must be classes");
        return -1;
    }
    self->min_bytes = min_bytes;
    self->max_len = max_len;
    self->depth = depth;
    Py_XSETREF(self->pickled_type, Py_NewRef(pickled));
    Py_XSETREF(self->calls_type, Py_NewRef(calls));
    return 0;
}

static void blob_scan_dealloc(BlobScan *self) {
    Py_XDECREF(self->pickled_type);
    Py_XDECREF(self->calls_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef blob_scan_methods[] = {
    {"holds", (PyCFunction)blob_scan_holds, METH_O,
     "holds(obj) -> bool: whether obj is, or holds in its first levels, a large bytes (see the module doc)."},
    {"plain", (PyCFunction)blob_scan_plain, METH_O,
     "plain(obj) -> bool: whether obj is atoms alone, small ones, in its first levels (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BlobScanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fleet._codec.BlobScan",
    .tp_basicsize = sizeof(BlobScan),
    .tp_dealloc = (destructor)blob_scan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlobScan(min_bytes, max_len, depth, pickled_type, calls_type): the large-bytes look (module doc).",
    .tp_methods = blob_scan_methods,
    .tp_init = (initproc)blob_scan_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "fleet._codec", "The look a payload gets before it is pickled, in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__codec(void) {
    if (PyType_Ready(&BlobScanType) < 0)
        return NULL;
    str_data = PyUnicode_InternFromString("data");
    str_items = PyUnicode_InternFromString("items");
    if (str_data == NULL || str_items == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&codec_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "BlobScan", (PyObject *)&BlobScanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
