/* module.c: module state, the facade's one-time configuration, and init. */
#include "leapp.h"

#define STATE_OBJECTS(X)                                                     \
    X(node_type) X(port_type) X(carrier_type) X(ref_type) X(method_type)     \
    X(program_type) X(traced_type) X(tensor_type) X(run_disabled) X(class_setter) \
    X(classify) X(rewrite) X(alias) X(session_api) X(alias_link) X(alias_write) \
    X(guard) X(shape_guard) X(getitem) X(bool_dtype) \
    X(script_call) X(note_random)                                           \
    X(op_kinds) X(dtype_names) X(empty_kwargs) X(str_carrier) X(str_class) X(str_dtype)      \
    X(str_shape) X(str_clone) X(str_detach) X(str_derived) X(str_out) X(nodes) X(promoted)

static int
module_traverse(PyObject *module, visitproc visit, void *arg)
{
    leapp_state *st = leapp_get_state(module);
#define VISIT(name) Py_VISIT(st->name);
    STATE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
module_clear(PyObject *module)
{
    leapp_state *st = leapp_get_state(module);
#define CLEAR(name) Py_CLEAR(st->name);
    STATE_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
module_free(void *module)
{
    (void)module_clear((PyObject *)module);
}

/* object's __class__ descriptor (a new reference) when traced subclasses
 * tensor and no class of traced's MRO but object defines __class__ or
 * __setattr__: then `obj.__class__ = cls` on an instance of exactly one of the
 * two runs that descriptor's setter, and carrier.c may call it directly.
 * NULL otherwise, or with an exception set. */
static PyObject *
find_class_setter(PyObject *traced, PyObject *tensor, PyObject *str_class)
{
    PyObject *mro = NULL, *setter = NULL, *dict = NULL, *str_setattr = NULL;
    Py_ssize_t i;
    int in_the_way = 0;
    if (!PyType_Check(traced) || !PyType_Check(tensor)
        || !PyType_IsSubtype((PyTypeObject *)traced, (PyTypeObject *)tensor)) {
        goto done;
    }
    mro = PyObject_GetAttrString(traced, "__mro__");
    str_setattr = mro != NULL ? PyUnicode_InternFromString("__setattr__") : NULL;
    if (str_setattr == NULL || !PyTuple_Check(mro)) {
        goto done;
    }
    for (i = 0; i < PyTuple_GET_SIZE(mro) && in_the_way == 0; i++) {
        PyObject *cls = PyTuple_GET_ITEM(mro, i); /* borrowed from mro */
        if (cls == (PyObject *)&PyBaseObject_Type) {
            continue;
        }
        dict = PyObject_GetAttrString(cls, "__dict__");
        in_the_way = dict == NULL ? -1 : PySequence_Contains(dict, str_class);
        if (in_the_way == 0) {
            in_the_way = PySequence_Contains(dict, str_setattr);
        }
        Py_CLEAR(dict);
    }
    if (in_the_way == 0) {
        dict = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__dict__");
        setter = dict != NULL ? PyObject_GetItem(dict, str_class) : NULL;
        if (setter != NULL && Py_TYPE(setter)->tp_descr_set == NULL) {
            Py_CLEAR(setter);         /* not a data descriptor: the generic path */
        }
    }
done:
    Py_XDECREF(dict);
    Py_XDECREF(str_setattr);
    Py_XDECREF(mro);
    return setter;
}

/* _bind(traced_type, tensor_type, run_disabled, classify, rewrite, alias,
 *       session_api): the facade hands over the torch objects
 * once at import, so the extension never needs torch to build. */
static PyObject *
module_bind(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *traced, *tensor, *run, *classify, *rewrite, *alias, *api;
    if (!PyArg_ParseTuple(args, "OOOOOOO:_bind", &traced, &tensor, &run, &classify, &rewrite,
                          &alias, &api)) {
        return NULL;
    }
    Py_XSETREF(st->traced_type, Py_NewRef(traced));
    Py_XSETREF(st->tensor_type, Py_NewRef(tensor));
    Py_XSETREF(st->run_disabled, Py_NewRef(run));
    Py_XSETREF(st->classify, Py_NewRef(classify));
    Py_XSETREF(st->rewrite, Py_NewRef(rewrite));
    Py_XSETREF(st->alias, Py_NewRef(alias));
    Py_XSETREF(st->session_api, Py_NewRef(api));
    Py_XSETREF(st->class_setter, find_class_setter(traced, tensor, st->str_class));
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyDict_Clear(st->op_kinds);
    Py_RETURN_NONE;
}

/* _bind_alias(link, write): the alias-provenance hooks (leapp.tracing.alias), called
 * only for ops that may return views and for in-place writes on values that
 * have aliases, so the common op never leaves C. */
static PyObject *
module_bind_alias(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *link, *write;
    if (!PyArg_ParseTuple(args, "OO:_bind_alias", &link, &write)) {
        return NULL;
    }
    if (!PyCallable_Check(link) || !PyCallable_Check(write)) {
        PyErr_SetString(PyExc_TypeError, "_bind_alias() expects two callables");
        return NULL;
    }
    Py_XSETREF(st->alias_link, Py_NewRef(link));
    Py_XSETREF(st->alias_write, Py_NewRef(write));
    Py_RETURN_NONE;
}

/* _bind_script(call, note_random): the TorchScript hook (leapp.tracing.script),
 * called for ops of kind OP_SCRIPTED, and the random-op hook, called for ops
 * flagged OP_RANDOM; both only while a node traces. */
static PyObject *
module_bind_script(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *call, *note;
    if (!PyArg_ParseTuple(args, "OO:_bind_script", &call, &note)) {
        return NULL;
    }
    if (!PyCallable_Check(call) || !PyCallable_Check(note)) {
        PyErr_SetString(PyExc_TypeError, "_bind_script() expects two callables");
        return NULL;
    }
    Py_XSETREF(st->script_call, Py_NewRef(call));
    Py_XSETREF(st->note_random, Py_NewRef(note));
    Py_RETURN_NONE;
}

/* set_tracing(flag): turning tracing on gives the session to the calling
 * thread; annotations and traced ops from other threads are refused. */
static PyObject *
module_set_tracing(PyObject *module, PyObject *flag)
{
    leapp_state *st = leapp_get_state(module);
    int on = PyObject_IsTrue(flag);
    if (on < 0) {
        return NULL;
    }
    st->tracing = on;
    if (on) {
        st->owner = PyThread_get_thread_ident();
    }
    Py_RETURN_NONE;
}

/* session_thread(): the ident of the thread that owns the running session,
 * or None when no session runs. */
static PyObject *
module_session_thread(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    leapp_state *st = leapp_get_state(module);
    if (!st->tracing) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLong(st->owner);
}

/* release_traced(): every tensor given a carrier since the last call becomes
 * a plain torch.Tensor again, in place (leapp.stop()); returns how many. */
static PyObject *
module_release_traced(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = carrier_release_all(leapp_get_state(module));
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

PyObject *
leapp_refuse_thread(leapp_state *st, PyObject *what)
{
    PyObject *done = NULL;
    if (st->session_api != NULL) {
        done = PyObject_CallMethod(st->session_api, "refuse_thread", "O", what);
    }
    if (done != NULL || st->session_api == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%S was called from a thread that does not own the "
                     "tracing session", what);
    }
    Py_XDECREF(done);
    return NULL;
}

PyObject *
leapp_func_name(PyObject *func)
{
    PyObject *name = PyObject_GetAttrString(func, "__name__");
    if (name == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            goto done;                /* the lookup itself failed */
        }
        PyErr_Clear();                /* only the missing attribute: a callable without a name */
    }
    if (name == NULL || !PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0) {
        Py_XSETREF(name, PyObject_Repr(func)); /* absent, empty or not a str */
    }
done:
    return name;
}

static PyObject *
module_is_tracing(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(leapp_get_state(module)->tracing);
}

/* reset_nodes(): forget every node of the session (start() and tests). */
static PyObject *
module_reset_nodes(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    leapp_state *st = leapp_get_state(module);
    PyObject *fresh = PyDict_New(), *key, *value;
    Py_ssize_t pos = 0;
    if (fresh == NULL) {
        return NULL;
    }
    /* Close nodes a failed session left open: tensors still carrying them
     * must not record into a forgotten node. */
    while (st->nodes != NULL && PyDict_Next(st->nodes, &pos, &key, &value)) {
        assert(Py_IS_TYPE(value, st->node_type)); /* register_node checks */
        ((NodeObject *)value)->state = NODE_DONE;
    }
    Py_XSETREF(st->nodes, fresh);
    st->next_index = 0;
    Py_RETURN_NONE;
}

/* register_node(node): add a new node to the session; its name must be new. */
static PyObject *
module_register_node(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *node, *result = NULL;
    int taken;
    if (!PyArg_ParseTuple(args, "O!:register_node", st->node_type, &node)) {
        goto done;
    }
    taken = PyDict_Contains(st->nodes, ((NodeObject *)node)->name);
    if (taken < 0) {
        goto done;
    }
    if (taken) {
        PyErr_Format(PyExc_ValueError, "register_node(): the session already has a node named "
                     "'%U'", ((NodeObject *)node)->name);
        goto done;
    }
    if (PyDict_SetItem(st->nodes, ((NodeObject *)node)->name, node) < 0) {
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    return result;
}

/* discard_node(node): forget a node that is still tracing (a call of an
 * @annotate.method function that raised), so that the next call builds it
 * afresh.  The node is closed, as reset_nodes() closes every node, and the
 * tensors it promoted in place (declared inputs, buffers) are plain again;
 * returns how many were. */
static PyObject *
module_discard_node(PyObject *module, PyObject *node)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *registered, *result = NULL;
    Py_ssize_t released;
    if (!Py_IS_TYPE(node, st->node_type)) {
        PyErr_Format(PyExc_TypeError, "discard_node() expects a Node, got %s",
                     Py_TYPE(node)->tp_name);
        goto done;
    }
    registered = PyDict_GetItemWithError(st->nodes, ((NodeObject *)node)->name); /* borrowed */
    if (registered != node || ((NodeObject *)node)->state != NODE_OPEN) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "discard_node(): '%U' is not a node of the session "
                         "that is still tracing", ((NodeObject *)node)->name);
        }
        goto done;
    }
    if (PyDict_DelItem(st->nodes, ((NodeObject *)node)->name) < 0) {
        goto done;
    }
    ((NodeObject *)node)->state = NODE_DONE;
    released = carrier_release_node(st, node);
    if (released >= 0) {
        result = PyLong_FromSsize_t(released);
    }
done:
    return result;
}

/* find_node(name): the session's node of that name, or None. */
static PyObject *
module_find_node(PyObject *module, PyObject *name)
{
    PyObject *node = PyDict_GetItemWithError(leapp_get_state(module)->nodes, name); /* borrowed */
    if (node == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    return Py_NewRef(node);
}

/* nodes(): a read-only view of the session's nodes, in creation order. */
static PyObject *
module_nodes(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyDictProxy_New(leapp_get_state(module)->nodes);
}

static PyMethodDef module_methods[] = {
    {"_bind", module_bind, METH_VARARGS, "Hand the torch objects to the core."},
    {"_bind_alias", module_bind_alias, METH_VARARGS, "Hand the alias-provenance hooks to the core."},
    {"_bind_script", module_bind_script, METH_VARARGS,
     "Hand the TorchScript and random-op hooks to the core."},
    {"set_tracing", module_set_tracing, METH_O, "Turn the session flag on or off."},
    {"is_tracing", module_is_tracing, METH_NOARGS, "Whether a session is running."},
    {"session_thread", module_session_thread, METH_NOARGS,
     "Ident of the thread owning the running session, or None."},
    {"release_traced", module_release_traced, METH_NOARGS,
     "Make every tensor traced since the last call a plain tensor again."},
    {"reset_nodes", module_reset_nodes, METH_NOARGS, "Forget every node."},
    {"register_node", module_register_node, METH_VARARGS,
     "Add a node to the session; its name must be new."},
    {"find_node", module_find_node, METH_O, "The session's node of that name, or None."},
    {"discard_node", module_discard_node, METH_O,
     "Forget a node still tracing; the tensors it promoted in place are plain again."},
    {"nodes", module_nodes, METH_NOARGS,
     "A read-only view of the session's nodes (name -> Node), in creation order."},
    {NULL, NULL, 0, NULL},
};

/* The kinds the facade hands back (leapp.tracing.ops.classify) or reads (Ref.kind),
 * exported so that Python never repeats their numbers. */
static int
module_add_constants(PyObject *module)
{
    static const struct {
        const char *name;
        int value;
    } constants[] = {
        {"OP_PLAIN", OP_PLAIN}, {"OP_INPLACE", OP_INPLACE}, {"OP_COPY", OP_COPY},
        {"OP_TO", OP_TO}, {"OP_OVERWRITE", OP_OVERWRITE}, {"OP_VIEW", OP_VIEW},
        {"OP_CONVERSION", OP_CONVERSION}, {"OP_SIZE", OP_SIZE}, {"OP_DYNAMIC", OP_DYNAMIC},
        {"OP_SCRIPTED", OP_SCRIPTED}, {"OP_RANDOM", OP_RANDOM},
        {"REF_VALUE", REF_VALUE}, {"REF_CONST", REF_CONST},
    };
    int rc = 0;
#ifdef NDEBUG
    const int asserts = 0;
#else
    const int asserts = 1;
#endif
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]) && rc == 0; i++) {
        rc = PyModule_AddIntConstant(module, constants[i].name, constants[i].value);
    }
    if (rc == 0) {
        /* whether assert() was compiled in: the debug and sanitizer builds */
        PyObject *flag = PyBool_FromLong(asserts);
        rc = PyModule_AddObjectRef(module, "ASSERTS", flag);
        Py_DECREF(flag);
    }
    return rc;
}

static int
module_exec(PyObject *module)
{
    leapp_state *st = leapp_get_state(module);
    int rc = -1;
    st->tracing = 0;
    st->owner = 0;
    st->next_index = 0;
    st->promoted_limit = 4096;
    st->promoted = PyList_New(0);
    st->op_kinds = PyDict_New();
    st->dtype_names = PyDict_New();
    st->empty_kwargs = PyDict_New();
    st->nodes = PyDict_New();
    st->str_carrier = PyUnicode_InternFromString("_leapp_carrier");
    st->str_class = PyUnicode_InternFromString("__class__");
    st->str_dtype = PyUnicode_InternFromString("dtype");
    st->str_shape = PyUnicode_InternFromString("shape");
    st->str_clone = PyUnicode_InternFromString("clone");
    st->str_detach = PyUnicode_InternFromString("detach");
    st->str_derived = PyUnicode_InternFromString("_leapp_derived");
    st->str_out = PyUnicode_InternFromString("out");
    if (st->op_kinds == NULL || st->dtype_names == NULL || st->empty_kwargs == NULL
        || st->nodes == NULL || st->promoted == NULL
        || st->str_carrier == NULL || st->str_class == NULL
        || st->str_dtype == NULL || st->str_shape == NULL
        || st->str_clone == NULL || st->str_detach == NULL || st->str_derived == NULL
        || st->str_out == NULL) {
        goto done;
    }
    if (module_add_constants(module) < 0 || ref_init(module, st) < 0
        || carrier_init(module, st) < 0 || port_init(module, st) < 0
        || node_init(module, st) < 0 || trace_init(module, st) < 0
        || annotate_init(module, st) < 0 || graph_init(module, st) < 0
        || yaml_emit_init(module, st) < 0 || runtime_init(module, st) < 0) {
        goto done;
    }
    rc = 0;
done:
    return rc;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* The core relies on the GIL: the session's state, the nodes' op logs and
     * the instance dicts it writes are unsynchronised.  A free-threaded
     * CPython turns the GIL on when it imports this module. */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "leapp._core",
    .m_doc = "The C core of leapp: tracing, node contexts, graph, YAML, runtime.",
    .m_size = sizeof(leapp_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
