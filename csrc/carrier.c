/* carrier.c: the Carrier type, the provenance of a traced tensor.
 *
 * Every traced tensor carries a Carrier in its __dict__ naming the node that
 * owns its value, the value id inside that node and, once the node has
 * finished, the output port it was published as.  Giving a tensor a carrier
 * promotes it to TracedTensor in place; the promoted tensors are remembered
 * weakly so that stop() can make them plain torch.Tensors again.  A tensor
 * computed outside every node from a published value carries a derived tag
 * instead (trace_inactive.c), and is remembered the same way.
 *
 * The class changes through `obj.__class__ = cls` and the instance dict is
 * reached through PyObject_GenericGetDict: CPython's own checks run, and a
 * managed dict is materialised before the class changes.
 */
#include "leapp.h"

static int
carrier_traverse(CarrierObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->node);
    Py_VISIT(self->port);
    Py_VISIT(self->group);
    return 0;
}

static int
carrier_clear(CarrierObject *self)
{
    Py_CLEAR(self->node);
    Py_CLEAR(self->port);
    Py_CLEAR(self->group);
    return 0;
}

static void
carrier_dealloc(CarrierObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    (void)carrier_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
carrier_get_port(CarrierObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->port ? self->port : Py_None);
}

static int
carrier_set_port(CarrierObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value != NULL && value != Py_None && !PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "port must be a str or None");
        return -1;
    }
    Py_XSETREF(self->port, (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    return 0;
}

static PyObject *
carrier_get_group(CarrierObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->group ? self->group : Py_None);
}

static int
carrier_set_group(CarrierObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    Py_XSETREF(self->group, (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    return 0;
}

static PyObject *
carrier_get_active(CarrierObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(((NodeObject *)self->node)->state == NODE_OPEN);
}

static PyGetSetDef carrier_getset[] = {
    {"port", (getter)carrier_get_port, (setter)carrier_set_port, "Published output name.", NULL},
    {"active", (getter)carrier_get_active, NULL, "Whether the owning node is still tracing.", NULL},
    {"group", (getter)carrier_get_group, (setter)carrier_set_group,
     "Alias group: the tensors sharing this value's storage (leapp.tracing.alias), or None.", NULL},
    {NULL},
};

static PyMemberDef carrier_members[] = {
    {"node", T_OBJECT, offsetof(CarrierObject, node), READONLY, "Owning node."},
    {"vid", T_PYSSIZET, offsetof(CarrierObject, vid), 0, "Value id inside the node."},
    {"declared", T_INT, offsetof(CarrierObject, declared), 0, "Entered as a node input."},
    {"dynamic", T_INT, offsetof(CarrierObject, dynamic), 0,
     "Its shape depends on values (a nonzero, unique or boolean-mask result)."},
    {NULL},
};

static PyType_Slot carrier_slots[] = {
    {Py_tp_dealloc, carrier_dealloc},
    {Py_tp_traverse, carrier_traverse},
    {Py_tp_clear, carrier_clear},
    {Py_tp_members, carrier_members},
    {Py_tp_getset, carrier_getset},
    {Py_tp_doc, "Provenance of a traced tensor: owning node, value id, port."},
    {0, NULL},
};

static PyType_Spec carrier_spec = {
    .name = "leapp._core.Carrier",
    .basicsize = sizeof(CarrierObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = carrier_slots,
};

PyObject *
carrier_dict_item(leapp_state *st, PyObject *obj, PyObject *key)
{
    PyObject *dict, *found = NULL;    /* found: borrowed from obj's dict */
    if (st->traced_type == NULL || Py_TYPE(obj) != (PyTypeObject *)st->traced_type
        || PyErr_Occurred()) {
        goto done;                    /* never called to look at, or wipe, a pending error */
    }
    dict = PyObject_GenericGetDict(obj, NULL);
    if (dict != NULL) {
        found = PyDict_GetItemWithError(dict, key);
        Py_DECREF(dict);              /* obj keeps it, and with it found */
    }
    if (found == NULL) {
        PyErr_Clear();                /* only the error of this lookup can be set here */
    }
done:
    return found;
}

CarrierObject *
carrier_of(leapp_state *st, PyObject *obj)
{
    PyObject *found = carrier_dict_item(st, obj, st->str_carrier); /* borrowed */
    if (found == NULL || Py_TYPE(found) != st->carrier_type) {
        return NULL;
    }
    assert(((CarrierObject *)found)->node != NULL); /* set at creation, read-only */
    return (CarrierObject *)found;
}

/* A strong reference to the referent of weakref ref, or NULL (no error) when
 * it is dead. */
static PyObject *
weak_target(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) < 0) {
        PyErr_Clear();
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(ref); /* borrowed */
    if (obj == NULL) {
        PyErr_Clear(); /* not a weakref: nothing to give back */
    }
    return (obj == NULL || obj == Py_None) ? NULL : Py_NewRef(obj);
#endif
}

/* Drop the dead weakrefs from st->promoted; the list may then grow to twice
 * what is alive before the next pass, so the work stays linear. */
static int
promoted_compact(leapp_state *st)
{
    Py_ssize_t i, n = PyList_GET_SIZE(st->promoted);
    PyObject *alive = PyList_New(0);
    int rc = alive == NULL ? -1 : 0;
    for (i = 0; rc == 0 && i < n; i++) {
        PyObject *ref = PyList_GET_ITEM(st->promoted, i); /* borrowed */
        PyObject *obj = weak_target(ref);
        if (obj != NULL) {
            rc = PyList_Append(alive, ref);
            Py_DECREF(obj);
        }
    }
    if (rc == 0) {
        n = PyList_GET_SIZE(alive);
        st->promoted_limit = 2 * n > 4096 ? 2 * n : 4096;
        Py_SETREF(st->promoted, Py_NewRef(alive)); /* the old list is released */
    }
    Py_XDECREF(alive);
    return rc;
}

/* Remember obj weakly, so stop() can make it a plain tensor again. */
static int
promoted_remember(leapp_state *st, PyObject *obj)
{
    PyObject *ref;
    int rc;
    if (st->promoted == NULL || !PyType_SUPPORTS_WEAKREFS(Py_TYPE(obj))) {
        return 0;
    }
    if (PyList_GET_SIZE(st->promoted) >= st->promoted_limit && promoted_compact(st) < 0) {
        return -1;
    }
    ref = PyWeakref_NewRef(obj, NULL);
    if (ref == NULL) {
        return -1;
    }
    /* A weakref without a callback can be in no reference cycle; left tracked,
     * one per traced op result would pile up in the oldest generation and
     * trigger full collections in the middle of tracing. */
    if (PyObject_GC_IsTracked(ref)) {
        PyObject_GC_UnTrack(ref);
    }
    rc = PyList_Append(st->promoted, ref);
    Py_DECREF(ref);
    return rc;
}

/* `obj.__class__ = cls`: object's descriptor called directly for a
 * TracedTensor or a torch.Tensor when _bind found nothing else in the way
 * (CPython's checks run, a managed dict is materialised first), else through
 * PyObject_SetAttr (another subclass may have a __setattr__ of its own). */
static int
set_class(leapp_state *st, PyObject *obj, PyObject *cls)
{
    PyObject *setter = st->class_setter; /* borrowed from st */
    int direct = setter != NULL && (Py_TYPE(obj) == (PyTypeObject *)st->traced_type
                                    || Py_TYPE(obj) == (PyTypeObject *)st->tensor_type);
    return direct ? Py_TYPE(setter)->tp_descr_set(setter, obj, cls)
                  : PyObject_SetAttr(obj, st->str_class, cls);
}

/* Forget obj's carrier and derived tag and make it a plain torch.Tensor
 * again, in place. */
static int
carrier_demote(leapp_state *st, PyObject *obj)
{
    PyObject *dict, *keys[2] = {st->str_carrier, st->str_derived};
    int rc = 0;
    if (Py_TYPE(obj) != (PyTypeObject *)st->traced_type) {
        goto done;
    }
    dict = PyObject_GenericGetDict(obj, NULL);
    rc = dict == NULL ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < 2; i++) {
        int present = PyDict_Contains(dict, keys[i]);
        if (present < 0 || (present == 1 && PyDict_DelItem(dict, keys[i]) < 0)) {
            rc = -1;
        }
    }
    Py_XDECREF(dict);
    if (rc == 0) {
        rc = set_class(st, obj, st->tensor_type);
    }
done:
    return rc;
}

Py_ssize_t
carrier_release_all(leapp_state *st)
{
    PyObject *refs = st->promoted, *fresh = PyList_New(0); /* refs: taken from st */
    Py_ssize_t i, n = 0, count = 0;
    if (fresh == NULL) {
        count = -1;
        refs = NULL; /* st keeps its list */
    }
    else {
        st->promoted = fresh;
        st->promoted_limit = 4096;
        n = refs != NULL ? PyList_GET_SIZE(refs) : 0;
    }
    for (i = 0; i < n && count >= 0; i++) {
        PyObject *obj = weak_target(PyList_GET_ITEM(refs, i));
        if (obj != NULL) {
            if (Py_TYPE(obj) == (PyTypeObject *)st->traced_type) {
                count = carrier_demote(st, obj) < 0 ? -1 : count + 1;
            }
            Py_DECREF(obj);
        }
    }
    Py_XDECREF(refs);
    return count;
}

Py_ssize_t
carrier_release_node(leapp_state *st, PyObject *node)
{
    PyObject *refs = Py_XNewRef(st->promoted); /* demoting never appends to it */
    Py_ssize_t i, n = refs != NULL ? PyList_GET_SIZE(refs) : 0, count = 0;
    for (i = 0; i < n && count >= 0; i++) {
        PyObject *obj = weak_target(PyList_GET_ITEM(refs, i));
        if (obj != NULL) {
            CarrierObject *c = carrier_of(st, obj); /* borrowed */
            if (c != NULL && c->node == node) {
                count = carrier_demote(st, obj) < 0 ? -1 : count + 1;
            }
            Py_DECREF(obj);
        }
    }
    Py_XDECREF(refs);
    return count;
}

int
carrier_attach(leapp_state *st, PyObject *obj, PyObject *node, Py_ssize_t vid,
               PyObject *port, int declared)
{
    if (promoted_remember(st, obj) < 0) {
        return -1;
    }
    return carrier_attach_value(st, obj, node, vid, port, declared);
}

int
carrier_attach_value(leapp_state *st, PyObject *obj, PyObject *node, Py_ssize_t vid,
                     PyObject *port, int declared)
{
    int rc = -1;
    PyObject *dict = NULL;
    CarrierObject *c;
    /* obj was promoted first; the carrier names a value its node handed out */
    assert(Py_IS_TYPE(obj, (PyTypeObject *)st->traced_type));
    assert(Py_IS_TYPE(node, st->node_type) && vid >= 0);
    assert(port == NULL || PyUnicode_Check(port));
    c = PyObject_GC_New(CarrierObject, st->carrier_type);
    if (c == NULL) {
        return -1;
    }
    c->node = Py_NewRef(node);
    c->port = Py_XNewRef(port);
    c->group = NULL;
    c->vid = vid;
    c->declared = declared;
    c->dynamic = 0;
    PyObject_GC_Track(c);
    dict = PyObject_GenericGetDict(obj, NULL); /* made when obj has none yet */
    if (dict != NULL) {
        rc = PyDict_SetItem(dict, st->str_carrier, (PyObject *)c);
    }
    Py_XDECREF(dict);
    Py_DECREF(c);
    return rc;
}

int
carrier_tag_derived(leapp_state *st, PyObject *obj, PyObject *tag)
{
    PyObject *dict = NULL;
    int rc = -1;
    assert(Py_IS_TYPE(obj, (PyTypeObject *)st->tensor_type));
    if (carrier_promote(st, obj) < 0 || promoted_remember(st, obj) < 0) {
        goto done;
    }
    dict = PyObject_GenericGetDict(obj, NULL); /* made when obj has none yet */
    if (dict != NULL) {
        rc = PyDict_SetItem(dict, st->str_derived, tag);
    }
done:
    Py_XDECREF(dict);
    return rc;
}

int
carrier_promote(leapp_state *st, PyObject *obj)
{
    if (Py_TYPE(obj) == (PyTypeObject *)st->traced_type) {
        return 0;
    }
    /* `obj.__class__ = TracedTensor` (set_class): CPython checks the layouts
     * and materialises a managed dict before the class changes. */
    return set_class(st, obj, st->traced_type);
}

/* carrier_of(obj) -> Carrier | None */
static PyObject *
py_carrier_of(PyObject *module, PyObject *obj)
{
    CarrierObject *c = carrier_of(leapp_get_state(module), obj);
    return Py_NewRef(c ? (PyObject *)c : Py_None);
}

/* set_carrier(obj, node, vid, port=None, declared=False): make obj traced. */
static PyObject *
py_set_carrier(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *obj, *node, *port = Py_None;
    Py_ssize_t vid;
    int declared = 0;
    if (!PyArg_ParseTuple(args, "OO!n|Op:set_carrier", &obj, st->node_type, &node, &vid,
                          &port, &declared)) {
        return NULL;
    }
    if (port != Py_None && !PyUnicode_Check(port)) {
        PyErr_SetString(PyExc_TypeError, "set_carrier(): port must be a str or None");
        return NULL;
    }
    if (carrier_promote(st, obj) < 0
        || carrier_attach(st, obj, node, vid, port == Py_None ? NULL : port, declared) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* drop_carrier(obj): forget obj's provenance and make it a plain tensor. */
static PyObject *
py_drop_carrier(PyObject *module, PyObject *obj)
{
    if (carrier_demote(leapp_get_state(module), obj) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* remember(obj): stop() makes obj a plain tensor again (a published output
 * made by an op: op results are not remembered one by one on the hot path). */
static PyObject *
py_remember(PyObject *module, PyObject *obj)
{
    leapp_state *st = leapp_get_state(module);
    if (Py_TYPE(obj) == (PyTypeObject *)st->traced_type && promoted_remember(st, obj) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef carrier_functions[] = {
    {"carrier_of", py_carrier_of, METH_O, "The Carrier of a traced tensor, or None."},
    {"set_carrier", py_set_carrier, METH_VARARGS, "Make a tensor traced with a carrier."},
    {"drop_carrier", py_drop_carrier, METH_O, "Make a traced tensor plain again."},
    {"remember", py_remember, METH_O, "Have stop() make this traced tensor plain again."},
    {NULL, NULL, 0, NULL},
};

int
carrier_init(PyObject *module, leapp_state *st)
{
    st->carrier_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &carrier_spec, NULL);
    if (st->carrier_type == NULL || PyModule_AddType(module, st->carrier_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, carrier_functions);
}
