/* fleet.shm.table._kernels: the transition kernels built at install.
 *
 * The machine code is numba's (fleet/shm/table/kernel_build.py compiles the entry points
 * of fleet/shm/table/kernel_entry.py into an object file linked with this one). This
 * file makes it a module a process can import without numba or numpy: `addresses()`
 * gives each entry point's address, which fleet._table calls through (native/fleet_table.c),
 * and `build_digest()` what it was built from, which fleet.shm.table.kernel_load compares
 * before trusting it.
 *
 * It also defines the few helpers of numba's that the entry points' object code names.
 * They are on the path where a kernel raised, which the kernels never do (bad indices
 * are reason codes; they are compiled with the numpy error model and no bounds checks),
 * and on the path where an array's reference count falls to zero, which the arrays made
 * over the table's pointers never reach (they own no memory). Each behaves correctly
 * anyway: the GIL helpers take and give back the GIL, and the error path leaves a
 * RuntimeError that says a kernel failed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifndef FLEET_KERNELS_DIGEST
#error "FLEET_KERNELS_DIGEST: the kernel_tables.build_digest() the object code was built from"
#endif

/* The entry points, defined by the object code (names: kernel_build.SYMBOL). */
extern void fleet_kernel_apply_transition(void);
extern void fleet_kernel_apply_batch(void);
extern void fleet_kernel_start_unit(void);
extern void fleet_kernel_finish_unit(void);
extern void fleet_kernel_seq_write(void);
extern void fleet_kernel_add_field(void);
extern void fleet_kernel_store_field(void);

/* --- numba's helpers the object code names ------------------------------------------ */

void numba_gil_ensure(PyGILState_STATE *state) { *state = PyGILState_Ensure(); }

void numba_gil_release(PyGILState_STATE *state) { PyGILState_Release(*state); }

static PyObject *kernel_failed(void) {
    PyErr_SetString(PyExc_RuntimeError, "a fleet transition kernel raised an exception (its kernels never do)");
    return NULL;
}

PyObject *numba_unpickle(const char *data, int n, const char *hashed) {
    (void)data, (void)n, (void)hashed;
    return kernel_failed();
}

PyObject *numba_runtime_build_excinfo_struct(PyObject *struct_gv, PyObject *exc_args) {
    (void)struct_gv, (void)exc_args;
    return kernel_failed();
}

int numba_do_raise(PyObject *exc_packed) {
    (void)exc_packed;
    kernel_failed();
    return 0;
}

void NRT_MemInfo_call_dtor(void *mi) {
    (void)mi;
    Py_FatalError("fleet transition kernels: an array over the table's memory was freed (it owns none)");
}

void NRT_Free(void *ptr) {
    (void)ptr;
    Py_FatalError("fleet transition kernels: memory freed that the kernels never allocate");
}

/* --- the module ------------------------------------------------------------------------ */

static PyObject *addresses(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue(
        "{sNsNsNsNsNsNsN}",
        "apply_transition", PyLong_FromVoidPtr((void *)&fleet_kernel_apply_transition),
        "apply_batch", PyLong_FromVoidPtr((void *)&fleet_kernel_apply_batch),
        "start_unit", PyLong_FromVoidPtr((void *)&fleet_kernel_start_unit),
        "finish_unit", PyLong_FromVoidPtr((void *)&fleet_kernel_finish_unit),
        "seq_write", PyLong_FromVoidPtr((void *)&fleet_kernel_seq_write),
        "add_field", PyLong_FromVoidPtr((void *)&fleet_kernel_add_field),
        "store_field", PyLong_FromVoidPtr((void *)&fleet_kernel_store_field));
}

static PyObject *build_digest(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(FLEET_KERNELS_DIGEST);
}

static PyMethodDef methods[] = {
    {"addresses", addresses, METH_NOARGS, "Each entry point's address: {name: int}."},
    {"build_digest", build_digest, METH_NOARGS, "The kernel_tables.build_digest() these kernels were built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "fleet's transition kernels, built at install (kernel_build).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
