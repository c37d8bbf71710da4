/* fleet._chunk: a chunk's items run through their handler in one C loop, and its
 * values are handed out to the caller of map one by one.
 *
 * A chunk of a map carries many small items; in Python, building each item's Unit (a
 * NamedTuple) cost more than a cheap handler itself. Here a Unit is allocated and
 * filled directly (the template's fields, the item's payload in its place), reused for
 * the next item when the handler kept no reference to it, and the handler is called
 * through vectorcall: no Python frame of ours per item.
 *
 * `hand_out(values)` is the caller's side: an iterator over a list that lets go of each
 * value as it hands it out (the list's slot becomes None), as ProcessPoolExecutor's map
 * frees a result the caller dropped. In Python that took list.pop per value, called by
 * an iterator that compared each value with a sentinel: two to three times a plain
 * list iterator's cost, a fifth of a big map's time in the caller.
 *
 * This is a CPython extension module, not a cffi one: it builds Python objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Take the exception being raised, with its traceback attached (the worker formats it). */
static PyObject *take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

PyDoc_STRVAR(run_items_doc,
"run_items(handler, template, payload_at, payloads, values, start, running=None)\n"
"    -> None | (index, exception)\n"
"\n"
"For each payload of the list `payloads` from index `start` on: a copy of `template`\n"
"(a tuple, or an instance of a tuple subclass such as a NamedTuple) with the payload at\n"
"field `payload_at`, passed to `handler`; what it returns is appended to the list\n"
"`values`. Stops at the first item whose handler raises and returns (its index, the\n"
"exception, with its traceback); None once every item ran.\n"
"\n"
"`running`: an object whose `unit` is a __slots__ field (fleet.unit._Running): it holds\n"
"each item's Unit while its handler runs (fleet.current_unit()), and None between items.");

/* Where `running`'s __slots__ field "unit" lives in the object, or -1 (exception set)
 * when it has none: written directly per item, as a slot descriptor would. */
static Py_ssize_t unit_field_offset(PyObject *running) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)Py_TYPE(running), "unit");
    if (descr == NULL) {
        PyErr_SetString(PyExc_TypeError, "run_items: running must have a __slots__ field 'unit'");
        return -1;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
            offset = member->offset;
        }
    }
    Py_DECREF(descr);
    if (offset < 0) {
        PyErr_SetString(PyExc_TypeError, "run_items: running must have a __slots__ field 'unit'");
    }
    return offset;
}

/* Put `value` (a new reference taken here) in the field at `at`, releasing what was there. */
static void set_field(PyObject **at, PyObject *value) {
    PyObject *old = *at;
    Py_INCREF(value);
    *at = value;
    Py_XDECREF(old);
}

static PyObject *run_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "run_items takes 6 or 7 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *handler = args[0], *template = args[1], *payloads = args[3], *values = args[4];
    if (!PyTuple_Check(template)) {
        PyErr_SetString(PyExc_TypeError, "run_items: template must be a tuple");
        return NULL;
    }
    if (!PyList_Check(payloads) || !PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "run_items: payloads and values must be lists");
        return NULL;
    }
    Py_ssize_t width = PyTuple_GET_SIZE(template);
    Py_ssize_t payload_at = PyLong_AsSsize_t(args[2]);
    Py_ssize_t start = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (payload_at < 0 || payload_at >= width) {
        PyErr_Format(PyExc_ValueError, "run_items: payload_at %zd is not a field of a %zd-tuple",
                     payload_at, width);
        return NULL;
    }
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "run_items: start must be >= 0");
        return NULL;
    }
    PyObject **running_unit = NULL;  /* running's "unit" field, or NULL: no running object */
    if (nargs == 7 && args[6] != Py_None) {
        Py_ssize_t offset = unit_field_offset(args[6]);
        if (offset < 0) {
            return NULL;
        }
        running_unit = (PyObject **)((char *)args[6] + offset);
    }
    PyTypeObject *type = Py_TYPE(template);
    PyObject *unit = NULL;
    /* The list may change under a handler that holds it: its size is read each turn. */
    for (Py_ssize_t i = start; i < PyList_GET_SIZE(payloads); i++) {
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        Py_INCREF(payload);
        if (unit != NULL && Py_REFCNT(unit) == 1) {
            /* Nothing kept the last item's Unit: it takes this item's payload instead of a
             * new Unit being made (zip reuses its result tuple the same way). No other
             * reference exists, so no one can see it change. */
            PyObject *old = PyTuple_GET_ITEM(unit, payload_at);
            PyTuple_SET_ITEM(unit, payload_at, payload);
            Py_DECREF(old);
            if (!PyObject_GC_IsTracked(unit)) {
                PyObject_GC_Track(unit);  /* a collection may have untracked it: it may hold anything now */
            }
        } else {
            Py_XDECREF(unit);
            unit = type->tp_alloc(type, width);
            if (unit == NULL) {
                Py_DECREF(payload);
                return NULL;
            }
            for (Py_ssize_t f = 0; f < width; f++) {
                PyObject *field = f == payload_at ? payload : PyTuple_GET_ITEM(template, f);
                if (f != payload_at) {
                    Py_INCREF(field);
                }
                PyTuple_SET_ITEM(unit, f, field);
            }
        }
        if (running_unit != NULL) {
            set_field(running_unit, unit);
        }
        PyObject *result = PyObject_Vectorcall(handler, &unit, 1, NULL);
        if (running_unit != NULL) {
            /* Before the reuse test above: the field's reference is not the handler's. */
            set_field(running_unit, Py_None);
        }
        if (result == NULL) {
            PyObject *exc = take_exception();  /* first: freeing the Unit may run a payload's __del__ */
            Py_DECREF(unit);
            if (exc == NULL) {
                PyErr_SetString(PyExc_SystemError, "run_items: a handler failed without an exception");
                return NULL;
            }
            return Py_BuildValue("(nN)", i, exc);
        }
        int appended = PyList_Append(values, result);
        Py_DECREF(result);
        if (appended < 0) {
            Py_DECREF(unit);
            return NULL;
        }
    }
    Py_XDECREF(unit);
    Py_RETURN_NONE;
}

/* --- hand_out: values handed out one by one, each let go of on the way ------------- */
typedef struct {
    PyObject_HEAD
    PyObject *values; /* the list; NULL once every value was handed out */
    Py_ssize_t next;  /* index of the next value */
} HandOut;

static int hand_out_traverse(HandOut *it, visitproc visit, void *arg) {
    Py_VISIT(it->values);
    return 0;
}

static int hand_out_clear(HandOut *it) {
    Py_CLEAR(it->values);
    return 0;
}

static void hand_out_dealloc(HandOut *it) {
    PyObject_GC_UnTrack(it);
    Py_XDECREF(it->values);
    PyObject_GC_Del(it);
}

static PyObject *hand_out_next(HandOut *it) {
    PyObject *values = it->values;
    if (values == NULL)
        return NULL;
    if (it->next < PyList_GET_SIZE(values)) {
        /* the list's reference becomes the caller's; None holds the slot */
        PyObject *value = PyList_GET_ITEM(values, it->next);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(values, it->next, Py_None);
        it->next++;
        return value;
    }
    it->values = NULL;
    Py_DECREF(values);
    return NULL;
}

static PyObject *hand_out_length_hint(HandOut *it, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t left = it->values == NULL ? 0 : PyList_GET_SIZE(it->values) - it->next;
    return PyLong_FromSsize_t(left < 0 ? 0 : left);
}

static PyMethodDef hand_out_methods[] = {
    {"__length_hint__", (PyCFunction)hand_out_length_hint, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandOutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fleet._chunk.HandOut",
    .tp_basicsize = sizeof(HandOut),
    .tp_dealloc = (destructor)hand_out_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An iterator over a list that sets each slot to None as it hands its value out.",
    .tp_traverse = (traverseproc)hand_out_traverse,
    .tp_clear = (inquiry)hand_out_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)hand_out_next,
    .tp_methods = hand_out_methods,
};

PyDoc_STRVAR(hand_out_doc,
"hand_out(values: list) -> iterator\n\n"
"The values of `values` in order; each slot of the list becomes None as its value is\n"
"handed out, so a value the caller dropped is freed at once.");

static PyObject *hand_out(PyObject *module, PyObject *values) {
    if (!PyList_CheckExact(values)) {
        PyErr_Format(PyExc_TypeError, "hand_out takes a list, not %.100s", Py_TYPE(values)->tp_name);
        return NULL;
    }
    HandOut *it = PyObject_GC_New(HandOut, &HandOutType);
    if (it == NULL)
        return NULL;
    Py_INCREF(values);
    it->values = values;
    it->next = 0;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static PyMethodDef chunk_methods[] = {
    {"run_items", (PyCFunction)(void (*)(void))run_items, METH_FASTCALL, run_items_doc},
    {"hand_out", (PyCFunction)hand_out, METH_O, hand_out_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef chunk_module = {
    PyModuleDef_HEAD_INIT, "fleet._chunk", "A chunk's items run through their handler in one C loop.", -1,
    chunk_methods,
};

PyMODINIT_FUNC PyInit__chunk(void) {
    if (PyType_Ready(&HandOutType) < 0)
        return NULL;
    return PyModule_Create(&chunk_module);
}
