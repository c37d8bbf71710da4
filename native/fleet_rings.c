/* fleet._rings: the rings' and the bell's non-blocking calls, made with the GIL held.
 *
 * cffi releases the GIL around every C call. For a call that cannot block (a push, a
 * pop, a notify: memory copies and at most one FUTEX_WAKE) that costs more than the
 * call: while another thread of the process waits for the GIL (a caller submitting,
 * while the supervisor's loop pushes its grants), each release hands the GIL over and
 * the loop waits to get it back. A single no-op cffi call measured 0.2 us alone and
 * ~230 us with one busy Python thread beside it. These calls keep the GIL; the
 * blocking ones (waits, sleeps) stay in fleet._native and release it.
 *
 * The ring code itself is native/fleet_native.c, compiled into this module as well
 * (its symbols hidden): one implementation, two ways to call it. A ring or bell is
 * named by its address, an int (the caller keeps the mapping alive).
 *
 * This is a CPython extension module, not a cffi one: it builds Python objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>

#include "fleet_native.h"

/* Up to this many messages per pop_many, lengths and tags live on the stack. */
#define STACK_MSGS 256

static int take_address(PyObject *arg, void **out, const char *what) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be an address (int), got %.100s", what, Py_TYPE(arg)->tp_name);
        return -1;
    }
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s is a null address", what);
        return -1;
    }
    *out = p;
    return 0;
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, want, nargs);
    return -1;
}

static int take_tag(PyObject *arg, uint32_t *out) {
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "tag does not fit in 32 bits");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

PyDoc_STRVAR(used_doc, "used(ring) -> int\n\nBytes in flight in the ring (payloads and their framing).");

static PyObject *used(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    if (check_nargs("used", nargs, 1) || take_address(args[0], &ring, "ring")) return NULL;
    return PyLong_FromUnsignedLongLong(fleet_ring_used(ring));
}

PyDoc_STRVAR(seq_doc, "seq(ring) -> int\n\nThe ring's data sequence word (see Ring.wait_since).");

static PyObject *seq(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    if (check_nargs("seq", nargs, 1) || take_address(args[0], &ring, "ring")) return NULL;
    return PyLong_FromUnsignedLong(fleet_ring_seq(ring));
}

PyDoc_STRVAR(notify_doc, "notify(ring) -> bool\n\nWake the ring's consumer; True if it was asleep.");

static PyObject *notify(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    if (check_nargs("notify", nargs, 1) || take_address(args[0], &ring, "ring")) return NULL;
    return PyBool_FromLong(fleet_ring_notify(ring) == 1);
}

PyDoc_STRVAR(bell_ring_doc, "bell_ring(bell, waiting) -> bool\n\nBump the bell; True if its waiter was asleep.");

static PyObject *bell_ring(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *bell, *waiting;
    if (check_nargs("bell_ring", nargs, 2) || take_address(args[0], &bell, "bell") ||
        take_address(args[1], &waiting, "waiting")) {
        return NULL;
    }
    return PyBool_FromLong(fleet_bell_ring((uint32_t *)bell, (uint32_t *)waiting) == 1);
}

PyDoc_STRVAR(push_doc,
"push(ring, tag, head, body) -> int\n"
"\n"
"Append one message: `head` followed by `body` (bytes-like; body may be b\"\"). Does not\n"
"wake the consumer. 0, or -EAGAIN (no room now) or -EMSGSIZE (can never fit).");

static PyObject *push(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    uint32_t tag;
    if (check_nargs("push", nargs, 4) || take_address(args[0], &ring, "ring") || take_tag(args[1], &tag)) return NULL;
    Py_buffer head, body;
    if (PyObject_GetBuffer(args[2], &head, PyBUF_SIMPLE)) return NULL;
    if (PyObject_GetBuffer(args[3], &body, PyBUF_SIMPLE)) {
        PyBuffer_Release(&head);
        return NULL;
    }
    int rc;
    if ((uint64_t)head.len + (uint64_t)body.len > UINT32_MAX) {
        rc = -EMSGSIZE;
    } else if (body.len == 0) {
        rc = fleet_ring_push(ring, tag, head.buf, (uint32_t)head.len);
    } else {
        rc = fleet_ring_push2(ring, tag, head.buf, (uint32_t)head.len, body.buf, (uint32_t)body.len);
    }
    PyBuffer_Release(&head);
    PyBuffer_Release(&body);
    return PyLong_FromLong(rc);
}

PyDoc_STRVAR(push_many_doc,
"push_many(ring, tag, messages, notify) -> int\n"
"\n"
"Append the messages of the list `messages` in order until one does not fit: how many\n"
"were pushed (a message that can never fit stops the run too, left for push to report).\n"
"A message is bytes, or a pair (head, body) of bytes pushed as one message, head then\n"
"body, without joining them first. With `notify` true, wake the consumer once after them.");

/* Message `m` of push_many as (a, alen, b, blen): bytes, or a pair of bytes. -1 with
 * TypeError set when it is neither. */
static int message_parts(PyObject *m, Py_ssize_t i, const char **a, Py_ssize_t *alen, const char **b,
                         Py_ssize_t *blen) {
    if (PyBytes_Check(m)) {
        *a = PyBytes_AS_STRING(m);
        *alen = PyBytes_GET_SIZE(m);
        *b = NULL;
        *blen = 0;
        return 0;
    }
    if (PyTuple_CheckExact(m) && PyTuple_GET_SIZE(m) == 2 && PyBytes_Check(PyTuple_GET_ITEM(m, 0)) &&
        PyBytes_Check(PyTuple_GET_ITEM(m, 1))) {
        *a = PyBytes_AS_STRING(PyTuple_GET_ITEM(m, 0));
        *alen = PyBytes_GET_SIZE(PyTuple_GET_ITEM(m, 0));
        *b = PyBytes_AS_STRING(PyTuple_GET_ITEM(m, 1));
        *blen = PyBytes_GET_SIZE(PyTuple_GET_ITEM(m, 1));
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "push_many: message %zd is %.100s, not bytes or a pair (head, body) of bytes", i,
                 Py_TYPE(m)->tp_name);
    return -1;
}

static PyObject *push_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    uint32_t tag;
    if (check_nargs("push_many", nargs, 4) || take_address(args[0], &ring, "ring") || take_tag(args[1], &tag)) {
        return NULL;
    }
    PyObject *messages = args[2];
    if (!PyList_Check(messages)) {
        PyErr_Format(PyExc_TypeError, "push_many: messages must be a list, got %.100s", Py_TYPE(messages)->tp_name);
        return NULL;
    }
    int wake = PyObject_IsTrue(args[3]);
    if (wake < 0) return NULL;
    const char *a, *b;
    Py_ssize_t alen, blen;
    Py_ssize_t n = PyList_GET_SIZE(messages), i = 0;
    for (; i < n; i++) {  /* refused whole, before anything is pushed */
        if (message_parts(PyList_GET_ITEM(messages, i), i, &a, &alen, &b, &blen) < 0) return NULL;
    }
    for (i = 0; i < n; i++) {
        message_parts(PyList_GET_ITEM(messages, i), i, &a, &alen, &b, &blen);
        if ((uint64_t)alen + (uint64_t)blen > UINT32_MAX ||
            fleet_ring_push2(ring, tag, a, (uint32_t)alen, b, (uint32_t)blen) != 0) break;
    }
    if (wake && i > 0) fleet_ring_notify(ring);
    return PyLong_FromSsize_t(i);
}

PyDoc_STRVAR(pop_many_doc,
"pop_many(ring, max_bytes, max_msgs) -> list[(tag, memoryview)]\n"
"\n"
"Take every message there is, up to `max_bytes` of payload and `max_msgs` messages: the\n"
"views share one fresh bytearray. [] when the ring is empty. A single message larger\n"
"than `max_bytes` is still returned, alone.");

/* A pop of up to max_msgs messages, max_bytes of payload: from a ring this process
 * trusts (capacity 0: the ring's own words), or with every frame checked against the
 * capacity its consumer made it with (fleet_ring_pop_many_checked). */
static int64_t pop_into(void *ring, uint64_t capacity, void *out, uint64_t cap, uint32_t *lens, uint32_t *tags,
                        uint32_t max_msgs) {
    if (capacity == 0) return fleet_ring_pop_many(ring, out, cap, lens, tags, max_msgs);
    return fleet_ring_pop_many_checked(ring, capacity, out, cap, lens, tags, max_msgs);
}

static PyObject *pop_list(void *ring, uint64_t capacity, Py_ssize_t max_bytes, Py_ssize_t max_msgs);

static PyObject *pop_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    if (check_nargs("pop_many", nargs, 3) || take_address(args[0], &ring, "ring")) return NULL;
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_msgs = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    return pop_list(ring, 0, max_bytes, max_msgs);
}

PyDoc_STRVAR(pop_many_checked_doc,
"pop_many_checked(ring, capacity, max_bytes, max_msgs) -> list[(tag, memoryview)]\n"
"\n"
"pop_many for a ring whose producer this process does not trust: `capacity` is the one\n"
"it made the ring with, and every frame is checked against it before it is copied.\n"
"Raises ValueError when a word of the ring or a frame would take a read outside it\n"
"(the ring is left as it was).");

static PyObject *pop_many_checked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *ring;
    if (check_nargs("pop_many_checked", nargs, 4) || take_address(args[0], &ring, "ring")) return NULL;
    unsigned long long capacity = PyLong_AsUnsignedLongLong(args[1]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_msgs = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (capacity == 0) {
        PyErr_SetString(PyExc_ValueError, "pop_many_checked: capacity must be the ring's, not 0");
        return NULL;
    }
    return pop_list(ring, capacity, max_bytes, max_msgs);
}

static PyObject *pop_list(void *ring, uint64_t capacity, Py_ssize_t max_bytes, Py_ssize_t max_msgs) {
    if (max_bytes < 0 || max_msgs < 1 || max_msgs > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "pop_many: max_bytes (%zd) must be >= 0 and max_msgs (%zd) >= 1", max_bytes,
                     max_msgs);
        return NULL;
    }
    uint64_t in_ring = fleet_ring_used(ring);
    if (in_ring == 0) return PyList_New(0);  /* the common look at an empty ring: nothing made */
    if (capacity != 0 && in_ring > capacity) in_ring = capacity;  /* an untrusted ring's words bound nothing */
    uint32_t stack_lens[STACK_MSGS], stack_tags[STACK_MSGS];
    uint32_t *lens = stack_lens, *tags = stack_tags;
    if (max_msgs > STACK_MSGS) {
        lens = PyMem_Malloc(sizeof(uint32_t) * 2 * (size_t)max_msgs);
        if (lens == NULL) return PyErr_NoMemory();
        tags = lens + max_msgs;
    }
    PyObject *out = NULL, *view = NULL;
    /* What is in the ring (payloads and their framing) bounds what one call can take. */
    uint64_t cap = (uint64_t)max_bytes < in_ring ? (uint64_t)max_bytes : in_ring;
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (buf == NULL) goto done;
    int64_t n = pop_into(ring, capacity, PyByteArray_AS_STRING(buf), cap, lens, tags, (uint32_t)max_msgs);
    if (n == -ENOBUFS) {  /* one message larger than max_bytes: it comes alone */
        if (PyByteArray_Resize(buf, (Py_ssize_t)lens[0]) < 0) goto done;
        n = pop_into(ring, capacity, PyByteArray_AS_STRING(buf), lens[0], lens, tags, 1);
    }
    if (n == -EPROTO || n == -EINVAL) {
        PyErr_SetString(PyExc_ValueError, "the ring's words or a frame's length point outside it: not a ring");
        goto done;
    }
    if (n <= 0) {
        out = PyList_New(0);
        goto done;
    }
    view = PyMemoryView_FromObject(buf);
    if (view == NULL) goto done;
    out = PyList_New((Py_ssize_t)n);
    if (out == NULL) goto done;
    Py_ssize_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        PyObject *tag = NULL, *pair = NULL;
        PyObject *part = PySequence_GetSlice(view, off, off + (Py_ssize_t)lens[i]);
        if (part != NULL) tag = PyLong_FromUnsignedLong(tags[i]);
        if (tag != NULL) pair = PyTuple_Pack(2, tag, part);
        Py_XDECREF(tag);
        Py_XDECREF(part);
        if (pair == NULL) {
            Py_CLEAR(out);  /* the messages are gone from the ring: this is out of memory */
            goto done;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, pair);
        off += (Py_ssize_t)((lens[i] + 7u) & ~7u);
    }
done:
    Py_XDECREF(view);
    Py_XDECREF(buf);
    if (lens != stack_lens) PyMem_Free(lens);
    return out;
}

static PyMethodDef methods[] = {
    {"used", (PyCFunction)(void (*)(void))used, METH_FASTCALL, used_doc},
    {"seq", (PyCFunction)(void (*)(void))seq, METH_FASTCALL, seq_doc},
    {"notify", (PyCFunction)(void (*)(void))notify, METH_FASTCALL, notify_doc},
    {"bell_ring", (PyCFunction)(void (*)(void))bell_ring, METH_FASTCALL, bell_ring_doc},
    {"push", (PyCFunction)(void (*)(void))push, METH_FASTCALL, push_doc},
    {"push_many", (PyCFunction)(void (*)(void))push_many, METH_FASTCALL, push_many_doc},
    {"pop_many", (PyCFunction)(void (*)(void))pop_many, METH_FASTCALL, pop_many_doc},
    {"pop_many_checked", (PyCFunction)(void (*)(void))pop_many_checked, METH_FASTCALL, pop_many_checked_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "fleet._rings",
    "The rings' and the bell's non-blocking calls, made with the GIL held (see native/fleet_rings.c).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rings(void) { return PyModule_Create(&module_def); }
