/* annotate.c: the annotations' entry points.
 *
 * Annotations stay in training code, so with no session running they must
 * cost next to nothing: these functions answer a dict payload directly and
 * hand everything else (sessions, semantics, payload errors) to the facade's
 * Python implementation in state->session_api.
 */
#include "leapp.h"

/* The payload's values: the single value for one entry, else a tuple. */
static PyObject *
dict_values(PyObject *payload)
{
    Py_ssize_t n = PyDict_GET_SIZE(payload), pos = 0, i = 0;
    PyObject *key, *value, *out;
    if (n == 1) {
        (void)PyDict_Next(payload, &pos, &key, &value);
        return Py_NewRef(value);
    }
    out = PyTuple_New(n);
    if (out == NULL) {
        return NULL;
    }
    while (PyDict_Next(payload, &pos, &key, &value)) {
        PyTuple_SET_ITEM(out, i++, Py_NewRef(value)); /* steals the new ref */
    }
    return out;
}

static int
has_nested_value(PyObject *payload)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(payload, &pos, &key, &value)) {
        if (PyDict_Check(value) || PyList_Check(value) || PyTuple_Check(value)) {
            return 1;
        }
    }
    return 0;
}

/* The session's error for annotate.<name>() called from a foreign thread. */
static PyObject *
refuse(leapp_state *st, const char *name)
{
    PyObject *what = PyUnicode_FromFormat("annotate.%s()", name);
    if (what != NULL) {
        (void)leapp_refuse_thread(st, what);
        Py_DECREF(what);
    }
    return NULL;
}

/* Forward to session_api.<name>(*args, **kwnames); the session's own
 * thread only. */
static PyObject *
forward(leapp_state *st, const char *name, PyObject *const *args, size_t nargsf,
        PyObject *kwnames)
{
    PyObject *meth, *result;
    if (st->session_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "leapp._core is not bound to the facade yet");
        return NULL;
    }
    if (leapp_foreign_thread(st)) {
        return refuse(st, name);
    }
    meth = PyObject_GetAttrString(st->session_api, name);
    if (meth == NULL) {
        return NULL;
    }
    result = PyObject_Vectorcall(meth, args, nargsf, kwnames);
    Py_DECREF(meth);
    assert(leapp_result_ok(result));
    return result;
}

/* The payload argument (position 1) when given positionally. */
static PyObject *
payload_of(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs >= 2 ? args[1] : NULL;
}

#define FAST_ENTRY(cname, pyname, extra_check)                                      \
    static PyObject *cname(PyObject *module, PyObject *const *args, size_t nargsf,  \
                           PyObject *kwnames)                                       \
    {                                                                               \
        leapp_state *st = leapp_get_state(module);                                  \
        Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);                              \
        PyObject *payload = payload_of(args, nargs);                                \
        if (!st->tracing && payload != NULL && PyDict_CheckExact(payload)           \
            && PyDict_GET_SIZE(payload) > 0 && extra_check) {                       \
            return dict_values(payload);                                            \
        }                                                                           \
        return forward(st, pyname, args, nargsf, kwnames);                          \
    }

FAST_ENTRY(input_tensors, "input_tensors", kwnames == NULL)
FAST_ENTRY(output_tensors, "output_tensors", 1)
FAST_ENTRY(state_tensors, "state_tensors", !has_nested_value(payload))
FAST_ENTRY(update_state, "update_state", !has_nested_value(payload))
FAST_ENTRY(register_buffer, "register_buffer", 1)

static PyObject *
module_annotation(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    leapp_state *st = leapp_get_state(module);
    if (!st->tracing) {
        Py_RETURN_NONE;
    }
    return forward(st, "module", args, nargsf, kwnames);
}

static PyObject *
mirror_leapp_tags(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    leapp_state *st = leapp_get_state(module);
    if (!st->tracing && PyVectorcall_NARGS(nargsf) == 2 && kwnames == NULL) {
        return Py_NewRef(args[1]);
    }
    return forward(st, "mirror_leapp_tags", args, nargsf, kwnames);
}

/* ---- Method: the callable that @annotate.method returns ------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *fn;        /* the decorated function */
    PyObject *options;   /* dict: node_name, export_with, backend_params */
    PyObject *dict;      /* __dict__ for functools.update_wrapper */
    vectorcallfunc vectorcall;
} MethodObject;

static PyObject *
method_vectorcall(MethodObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *call_args = NULL, *kwargs = NULL, *meth = NULL, *result = NULL;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), i;
    if (st == NULL) {
        return NULL;
    }
    if (!st->tracing) {
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    if (leapp_foreign_thread(st)) {
        return refuse(st, "method");
    }
    call_args = PyTuple_New(nargs);
    kwargs = PyDict_New();
    if (call_args == NULL || kwargs == NULL) {
        goto done;
    }
    for (i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(call_args, i, Py_NewRef(args[i])); /* steals */
    }
    if (kwnames != NULL) {
        for (i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                goto done;
            }
        }
    }
    if (st->session_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "leapp._core is not bound to the facade yet");
        goto done;
    }
    meth = PyObject_GetAttrString(st->session_api, "call_method");
    if (meth == NULL) {
        goto done;
    }
    result = PyObject_CallFunctionObjArgs(meth, (PyObject *)self, call_args, kwargs, NULL);
done:
    Py_XDECREF(meth);
    Py_XDECREF(kwargs);
    Py_XDECREF(call_args);
    return result;
}

static PyObject *
method_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fn", "options", NULL};
    PyObject *fn, *options;
    MethodObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!:Method", kwlist, &fn, &PyDict_Type,
                                     &options)) {
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "annotate.method() decorates a callable");
        return NULL;
    }
    self = (MethodObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->options = Py_NewRef(options);
    self->dict = NULL;
    self->vectorcall = (vectorcallfunc)method_vectorcall;
    return (PyObject *)self;
}

static int
method_traverse(MethodObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fn);
    Py_VISIT(self->options);
    Py_VISIT(self->dict);
    return 0;
}

static int
method_clear(MethodObject *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->options);
    Py_CLEAR(self->dict);
    return 0;
}

static void
method_dealloc(MethodObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    (void)method_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Decorating a function in a class body gives a method: bind like one. */
static PyObject *
method_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyMemberDef method_members[] = {
    {"fn", T_OBJECT, offsetof(MethodObject, fn), READONLY, "The decorated function."},
    {"options", T_OBJECT, offsetof(MethodObject, options), READONLY, "Node options."},
    {"__dictoffset__", T_PYSSIZET, offsetof(MethodObject, dict), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(MethodObject, vectorcall), READONLY, NULL},
    {NULL},
};

static PyGetSetDef method_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyType_Slot method_slots[] = {
    {Py_tp_new, method_new},
    {Py_tp_dealloc, method_dealloc},
    {Py_tp_traverse, method_traverse},
    {Py_tp_clear, method_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, method_descr_get},
    {Py_tp_members, method_members},
    {Py_tp_getset, method_getset},
    {Py_tp_doc, "A function traced as one node when a session runs; a plain call otherwise."},
    {0, NULL},
};

static PyType_Spec method_spec = {
    .name = "leapp._core.Method",
    .basicsize = sizeof(MethodObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = method_slots,
};

#define VC(f) (PyCFunction)(void (*)(void))(f)
static PyMethodDef annotate_functions[] = {
    {"input_tensors", VC(input_tensors), METH_FASTCALL | METH_KEYWORDS,
     "input_tensors(node_name, tensors): begin a traced node."},
    {"output_tensors", VC(output_tensors), METH_FASTCALL | METH_KEYWORDS,
     "output_tensors(node_name, tensors, static_outputs=None, export_with=None, "
     "backend_params=None): finish a traced node."},
    {"state_tensors", VC(state_tensors), METH_FASTCALL | METH_KEYWORDS,
     "state_tensors(node_name, tensors): declare recurrent state."},
    {"update_state", VC(update_state), METH_FASTCALL | METH_KEYWORDS,
     "update_state(node_name, tensors): bind the new state values."},
    {"register_buffer", VC(register_buffer), METH_FASTCALL | METH_KEYWORDS,
     "register_buffer(node_name, tensors): persistent tensors written in place."},
    {"module", VC(module_annotation), METH_FASTCALL | METH_KEYWORDS,
     "module(node_name, model, buffer_names=None): track an nn.Module's buffers."},
    {"mirror_leapp_tags", VC(mirror_leapp_tags), METH_FASTCALL | METH_KEYWORDS,
     "mirror_leapp_tags(source, target): copy provenance after an exact match."},
    {NULL, NULL, 0, NULL},
};
#undef VC

int
annotate_init(PyObject *module, leapp_state *st)
{
    st->method_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &method_spec, NULL);
    if (st->method_type == NULL || PyModule_AddType(module, st->method_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, annotate_functions);
}
