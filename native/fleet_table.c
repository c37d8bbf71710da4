/* fleet._table: the transition kernels' calls over one table's mapping, with the GIL held.
 *
 * The kernels are numba's, compiled to C entry points over raw pointers
 * (fleet/shm/table/kernel_entry.py): ahead at install into fleet.shm.table._kernels, or
 * at run time by numba. Either way a process holds their addresses, and `Calls` calls
 * them over the regions of one mapped table: no numpy on either side of the call, and
 * Python ints in and out.
 *
 * The GIL stays held: a kernel runs well under a microsecond, and giving the GIL up
 * around it would let another thread of the process take it for a switch interval
 * (fleet/shm/table/kernels.py says why; cffi would release it, hence a CPython module).
 *
 * A `Calls` holds the mapping's buffer (as a numpy view of it would) until `release()`
 * or its end, so the mapping cannot vanish under a call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The entry points' C signatures (kernel_entry.SIGNATURES, in its NAMES order). */
#define TABLE_PARAMS uint64_t *, int64_t, uint64_t *, int64_t, int64_t, uint64_t *, int64_t
typedef int64_t (*apply_transition_fn)(TABLE_PARAMS, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef int64_t (*apply_batch_fn)(TABLE_PARAMS, int64_t *, int64_t, int64_t *, int64_t);
typedef int64_t (*start_unit_fn)(TABLE_PARAMS, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef int64_t (*finish_unit_fn)(TABLE_PARAMS, int64_t, int64_t, int64_t);
typedef int64_t (*seq_write_fn)(uint64_t *, int64_t, int64_t, int64_t *, uint64_t *, int64_t);
typedef uint64_t (*add_field_fn)(uint64_t *, int64_t, int64_t, uint64_t);
typedef int64_t (*store_field_fn)(uint64_t *, int64_t, int64_t, uint64_t);
#define N_ENTRY_POINTS 7

/* The table's regions, in the order `Calls` takes them and the field writers name them. */
enum { SLOTS, ROLES, POSTURE, LEDGER, BULKHEADS, N_REGIONS };

/* A batch row's ints: slot, event, role, key, chained (fleet.shm.table.layout.OP_FIELDS). */
#define OP_FIELDS 5

/* Up to this many fields or rows, a call's arrays live on the stack. */
#define STACK_WORDS 64

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int held;
    uint64_t *at[N_REGIONS];
    int64_t words[N_REGIONS];
    int64_t n_roles;
    apply_transition_fn apply_transition;
    apply_batch_fn apply_batch;
    start_unit_fn start_unit;
    finish_unit_fn finish_unit;
    seq_write_fn seq_write;
    add_field_fn add_field;
    store_field_fn store_field;
    int64_t *reasons; /* the last batch's reasons */
    Py_ssize_t n_reasons, reasons_cap;
} Calls;

#define TABLE_ARGS(c) (c)->at[SLOTS], (c)->words[SLOTS], (c)->at[ROLES], (c)->words[ROLES], (c)->n_roles, \
                      (c)->at[POSTURE], (c)->words[POSTURE]

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, want, nargs);
    return -1;
}

static int held(Calls *c) {
    if (c->held) return 0;
    PyErr_SetString(PyExc_ValueError, "the table's calls were released (the table is closed)");
    return -1;
}

/* Every argument as an int64 (an int or anything with __index__; a float is a TypeError). */
static int take_ints(PyObject *const *args, Py_ssize_t n, int64_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(args[i]);
        if (v == -1 && PyErr_Occurred()) return -1;
        out[i] = (int64_t)v;
    }
    return 0;
}

static int take_region(PyObject *arg, int *out) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= N_REGIONS) {
        PyErr_Format(PyExc_ValueError, "no such table region %ld (0..%d)", v, N_REGIONS - 1);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int Calls_init(Calls *self, PyObject *args, PyObject *kwargs) {
    PyObject *buffer, *regions, *addresses;
    long long n_roles;
    static char *kwlist[] = {"buffer", "regions", "n_roles", "addresses", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLO:Calls", kwlist, &buffer, &regions, &n_roles, &addresses))
        return -1;
    if (self->held) {
        PyErr_SetString(PyExc_TypeError, "Calls is initialised once");
        return -1;
    }
    if (!PyTuple_Check(regions) || PyTuple_GET_SIZE(regions) != N_REGIONS) {
        PyErr_Format(PyExc_TypeError, "regions must be a tuple of %d (offset, words) pairs", N_REGIONS);
        return -1;
    }
    if (!PyTuple_Check(addresses) || PyTuple_GET_SIZE(addresses) != N_ENTRY_POINTS) {
        PyErr_Format(PyExc_TypeError, "addresses must be a tuple of %d ints", N_ENTRY_POINTS);
        return -1;
    }
    void *fn[N_ENTRY_POINTS];
    for (int i = 0; i < N_ENTRY_POINTS; i++) {
        fn[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, i));
        if (fn[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "entry point %d is a null address", i);
            return -1;
        }
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
    for (int r = 0; r < N_REGIONS; r++) {
        long long off, words;
        PyObject *pair = PyTuple_GET_ITEM(regions, r);
        if (!PyArg_ParseTuple(pair, "LL:region", &off, &words)) goto fail;
        if (off < 0 || words < 0 || off % 8 || off + words * 8 > self->view.len) {
            PyErr_Format(PyExc_ValueError, "region %d (%lld, %lld words) is not within the %zd-byte mapping", r, off,
                         words, self->view.len);
            goto fail;
        }
        self->at[r] = (uint64_t *)((char *)self->view.buf + off);
        self->words[r] = words;
    }
    self->n_roles = n_roles;
    self->apply_transition = (apply_transition_fn)fn[0];
    self->apply_batch = (apply_batch_fn)fn[1];
    self->start_unit = (start_unit_fn)fn[2];
    self->finish_unit = (finish_unit_fn)fn[3];
    self->seq_write = (seq_write_fn)fn[4];
    self->add_field = (add_field_fn)fn[5];
    self->store_field = (store_field_fn)fn[6];
    self->held = 1;
    return 0;
fail:
    PyBuffer_Release(&self->view);
    return -1;
}

static void Calls_dealloc(Calls *self) {
    if (self->held) PyBuffer_Release(&self->view);
    PyMem_Free(self->reasons);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Calls_release(Calls *self, PyObject *unused) {
    (void)unused;
    if (self->held) {
        self->held = 0;
        PyBuffer_Release(&self->view);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(transition_doc, "transition(slot, event, role, key, expected_gen) -> reason\n\n"
                             "apply_transition: one event on one slot; fsm.OK or the reason it was refused.");

static PyObject *Calls_transition(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[5];
    if (check_nargs("transition", nargs, 5) || take_ints(args, 5, a) || held(self)) return NULL;
    return PyLong_FromLongLong(self->apply_transition(TABLE_ARGS(self), a[0], a[1], a[2], a[3], a[4]));
}

PyDoc_STRVAR(start_unit_doc, "start_unit(slot, event, role, key, unit_id) -> reason\n\n"
                             "A worker begins a unit: START or RESUME (LEASE then START), and records it.");

static PyObject *Calls_start_unit(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[5];
    if (check_nargs("start_unit", nargs, 5) || take_ints(args, 5, a) || held(self)) return NULL;
    return PyLong_FromLongLong(self->start_unit(TABLE_ARGS(self), a[0], a[1], a[2], a[3], a[4]));
}

PyDoc_STRVAR(finish_unit_doc, "finish_unit(slot, event, role) -> reason * 16 + state after\n\n"
                              "A worker ends its unit (DRAINED when drained meanwhile) and counts it.");

static PyObject *Calls_finish_unit(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[3];
    if (check_nargs("finish_unit", nargs, 3) || take_ints(args, 3, a) || held(self)) return NULL;
    return PyLong_FromLongLong(self->finish_unit(TABLE_ARGS(self), a[0], a[1], a[2]));
}

/* A sequence of ints into int64s: the stack's `local` when it fits, else the heap (*heap set). */
static int64_t *ints_of(PyObject *seq, const char *what, Py_ssize_t *n, int64_t *local, int64_t **heap,
                        int as_unsigned) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    int64_t *out = local;
    *heap = NULL;
    if (*n > STACK_WORDS) {
        out = *heap = PyMem_Malloc((size_t)*n * sizeof(int64_t));
        if (out == NULL) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            return NULL;
        }
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < *n; i++) {
        /* values of a seqlocked record are words: any int, kept modulo 2**64 */
        long long v = as_unsigned ? (long long)PyLong_AsUnsignedLongLongMask(items[i]) : PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            PyMem_Free(*heap);
            *heap = NULL;
            return NULL;
        }
        out[i] = (int64_t)v;
    }
    Py_DECREF(fast);
    return out;
}

PyDoc_STRVAR(batch_doc, "batch(ops) -> applied\n\n"
                        "apply_batch over a flat sequence of int rows (slot, event, role, key, chained);\n"
                        "returns how many events were applied. `reasons(n)` gives each row's reason.");

static PyObject *Calls_batch(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t local[STACK_WORDS], *heap;
    Py_ssize_t n;
    if (check_nargs("batch", nargs, 1) || held(self)) return NULL;
    int64_t *ops = ints_of(args[0], "ops must be a sequence of ints", &n, local, &heap, 0);
    if (ops == NULL) return NULL;
    Py_ssize_t rows = n / OP_FIELDS;
    if (rows > self->reasons_cap) {
        Py_ssize_t cap = rows > 2 * self->reasons_cap ? rows : 2 * self->reasons_cap;
        int64_t *grown = PyMem_Realloc(self->reasons, (size_t)cap * sizeof(int64_t));
        if (grown == NULL) {
            PyMem_Free(heap);
            return PyErr_NoMemory();
        }
        self->reasons = grown;
        self->reasons_cap = cap;
    }
    int64_t applied = self->apply_batch(TABLE_ARGS(self), ops, n, self->reasons, rows);
    self->n_reasons = rows;
    PyMem_Free(heap);
    return PyLong_FromLongLong(applied);
}

PyDoc_STRVAR(reasons_doc, "reasons(n) -> list\n\nThe last batch's first n reasons (at most its rows).");

static PyObject *Calls_reasons(Calls *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > self->n_reasons) n = n < 0 ? 0 : self->n_reasons;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(self->reasons[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

PyDoc_STRVAR(seq_write_doc, "seq_write(region, seq_idx, fields, values) -> bool\n\n"
                            "Seqlocked write of region[fields[i]] = values[i] (values modulo 2**64) by the\n"
                            "record's single writer; False (nothing written) when an index is out of range.");

static PyObject *Calls_seq_write(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int region;
    int64_t seq_idx, li[STACK_WORDS], lv[STACK_WORDS], *hi, *hv;
    Py_ssize_t n_idx, n_val;
    if (check_nargs("seq_write", nargs, 4) || take_region(args[0], &region) || take_ints(args + 1, 1, &seq_idx) ||
        held(self))
        return NULL;
    int64_t *idx = ints_of(args[2], "fields must be a sequence of ints", &n_idx, li, &hi, 0);
    if (idx == NULL) return NULL;
    int64_t *val = ints_of(args[3], "values must be a sequence of ints", &n_val, lv, &hv, 1);
    if (val == NULL) {
        PyMem_Free(hi);
        return NULL;
    }
    PyObject *out;
    if (n_idx != n_val) {
        out = PyErr_Format(PyExc_ValueError, "seq_write: %zd fields but %zd values", n_idx, n_val);
    } else {
        out = PyBool_FromLong(
            (long)self->seq_write(self->at[region], self->words[region], seq_idx, idx, (uint64_t *)val, n_idx));
    }
    PyMem_Free(hi);
    PyMem_Free(hv);
    return out;
}

PyDoc_STRVAR(add_field_doc, "add_field(region, idx, delta) -> old\n\n"
                            "Atomic region[idx] += delta (modulo 2**64); the old value (0 when idx is out of range).");

static PyObject *Calls_add_field(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int region;
    int64_t idx;
    if (check_nargs("add_field", nargs, 3) || take_region(args[0], &region) || take_ints(args + 1, 1, &idx)) return NULL;
    unsigned long long delta = PyLong_AsUnsignedLongLongMask(args[2]);
    if (delta == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (held(self)) return NULL;
    return PyLong_FromUnsignedLongLong(self->add_field(self->at[region], self->words[region], idx, delta));
}

PyDoc_STRVAR(store_field_doc, "store_field(region, idx, value) -> bool\n\n"
                              "Release-store region[idx] = value (modulo 2**64); False when idx is out of range.");

static PyObject *Calls_store_field(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    int region;
    int64_t idx;
    if (check_nargs("store_field", nargs, 3) || take_region(args[0], &region) || take_ints(args + 1, 1, &idx))
        return NULL;
    unsigned long long value = PyLong_AsUnsignedLongLongMask(args[2]);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (held(self)) return NULL;
    return PyBool_FromLong((long)self->store_field(self->at[region], self->words[region], idx, value));
}

static PyMethodDef Calls_methods[] = {
    {"transition", (PyCFunction)(void (*)(void))Calls_transition, METH_FASTCALL, transition_doc},
    {"start_unit", (PyCFunction)(void (*)(void))Calls_start_unit, METH_FASTCALL, start_unit_doc},
    {"finish_unit", (PyCFunction)(void (*)(void))Calls_finish_unit, METH_FASTCALL, finish_unit_doc},
    {"batch", (PyCFunction)(void (*)(void))Calls_batch, METH_FASTCALL, batch_doc},
    {"reasons", (PyCFunction)Calls_reasons, METH_O, reasons_doc},
    {"seq_write", (PyCFunction)(void (*)(void))Calls_seq_write, METH_FASTCALL, seq_write_doc},
    {"add_field", (PyCFunction)(void (*)(void))Calls_add_field, METH_FASTCALL, add_field_doc},
    {"store_field", (PyCFunction)(void (*)(void))Calls_store_field, METH_FASTCALL, store_field_doc},
    {"release", (PyCFunction)Calls_release, METH_NOARGS, "Give the mapping's buffer back; later calls raise."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CallsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fleet._table.Calls",
    .tp_basicsize = sizeof(Calls),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Calls(buffer, regions, n_roles, addresses): the transition kernels over one mapped table.\n\n"
              "regions: ((offset, words) of the slots, roles, posture, ledger, bulkheads); addresses:\n"
              "the entry points' addresses in fleet.shm.table.kernel_entry.NAMES order.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Calls_init,
    .tp_dealloc = (destructor)Calls_dealloc,
    .tp_methods = Calls_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_table", "The transition kernels' calls over a mapped table, with the GIL held.", -1, NULL,
};

PyMODINIT_FUNC PyInit__table(void) {
    if (PyType_Ready(&CallsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&CallsType);
    if (PyModule_AddObject(m, "Calls", (PyObject *)&CallsType) < 0) {
        Py_DECREF(&CallsType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "OP_FIELDS", OP_FIELDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    for (int r = 0; r < N_REGIONS; r++) {
        static const char *names[] = {"SLOTS", "ROLES", "POSTURE", "LEDGER", "BULKHEADS"};
        if (PyModule_AddIntConstant(m, names[r], r) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
