/* ref.c: the Ref type, a reference inside a recorded op.
 *
 * A node's op log records ops as (func, args, kwargs, out); the traced
 * arguments become Ref(value) (a value id of the node) and the tensors from
 * outside the node Ref(const) (an index into its constant table).  Refs are
 * immutable and compare and hash by (kind, index).
 */
#include "leapp.h"

static PyObject *
ref_repr(RefObject *self)
{
    return PyUnicode_FromFormat("%s(%zd)", self->kind == REF_VALUE ? "Value" : "Const",
                                self->index);
}

static PyObject *
ref_richcompare(PyObject *a, PyObject *b, int op)
{
    if (Py_TYPE(a) != Py_TYPE(b) || (op != Py_EQ && op != Py_NE)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    RefObject *x = (RefObject *)a, *y = (RefObject *)b;
    int eq = x->kind == y->kind && x->index == y->index;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t
ref_hash(RefObject *self)
{
    /* unsigned arithmetic: index * 2 wraps instead of overflowing (index may
     * be any Py_ssize_t >= 0, e.g. value_ref(sys.maxsize)) */
    Py_uhash_t u = (Py_uhash_t)self->index * 2u + (Py_uhash_t)self->kind;
    Py_hash_t h = (Py_hash_t)u; /* modulo 2**N: gcc and clang define the conversion */
    return h == -1 ? -2 : h;
}

static void
ref_dealloc(RefObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMemberDef ref_members[] = {
    {"index", T_PYSSIZET, offsetof(RefObject, index), READONLY, "Value id or constant index."},
    {"kind", T_INT, offsetof(RefObject, kind), READONLY, "0: value, 1: constant."},
    {NULL},
};

static PyType_Slot ref_slots[] = {
    {Py_tp_dealloc, ref_dealloc},
    {Py_tp_repr, ref_repr},
    {Py_tp_richcompare, ref_richcompare},
    {Py_tp_hash, ref_hash},
    {Py_tp_members, ref_members},
    {Py_tp_doc, "A reference inside a recorded op: a node value or a constant."},
    {0, NULL},
};

static PyType_Spec ref_spec = {
    .name = "leapp._core.Ref",
    .basicsize = sizeof(RefObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = ref_slots,
};

PyObject *
ref_new(leapp_state *st, int kind, Py_ssize_t index)
{
    RefObject *ref = PyObject_New(RefObject, st->ref_type);
    if (ref == NULL) {
        return NULL;
    }
    /* PyObject_New took the reference instances of heap types own. */
    ref->kind = kind;
    ref->index = index;
    return (PyObject *)ref;
}

/* value_ref(vid) -> Ref: a reference to a node value, for Node.record(). */
static PyObject *
py_value_ref(PyObject *module, PyObject *arg)
{
    Py_ssize_t vid = PyLong_AsSsize_t(arg);
    if (vid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (vid < 0) {
        PyErr_SetString(PyExc_ValueError, "value_ref(): a value id is >= 0");
        return NULL;
    }
    return ref_new(leapp_get_state(module), REF_VALUE, vid);
}

static PyMethodDef ref_functions[] = {
    {"value_ref", py_value_ref, METH_O, "A Ref to a node value, for Node.record()."},
    {NULL, NULL, 0, NULL},
};

int
ref_init(PyObject *module, leapp_state *st)
{
    st->ref_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &ref_spec, NULL);
    if (st->ref_type == NULL || PyModule_AddType(module, st->ref_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, ref_functions);
}
