/* node.c: node contexts, ports, carriers (provenance) and op-log references.
 *
 * A Node owns the op log of one traced stage.  Every traced tensor carries a
 * Carrier in its __dict__ naming the node that owns its value, the value id
 * inside that node and, once the node has finished, the output port it was
 * published as.  Ops are recorded as (func, args, kwargs, out) where traced
 * arguments are replaced by Ref(value) and outside tensors by Ref(const).
 */
#include "leapp.h"

/* ---- Ref --------------------------------------------------------------- */

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
    Py_hash_t h = (Py_hash_t)(self->index * 2 + self->kind);
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

/* ---- Carrier ----------------------------------------------------------- */

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
     "Alias group: the tensors sharing this value's storage (leapp._alias), or None.", NULL},
    {NULL},
};

static PyMemberDef carrier_members[] = {
    {"node", T_OBJECT, offsetof(CarrierObject, node), READONLY, "Owning node."},
    {"vid", T_PYSSIZET, offsetof(CarrierObject, vid), 0, "Value id inside the node."},
    {"declared", T_INT, offsetof(CarrierObject, declared), 0, "Entered as a node input."},
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

CarrierObject *
carrier_of(leapp_state *st, PyObject *obj)
{
    PyObject **dictptr;
    PyObject *found;
    if (st->traced_type == NULL || Py_TYPE(obj) != (PyTypeObject *)st->traced_type
        || PyErr_Occurred()) {
        return NULL; /* never called to look at, or wipe, a pending error */
    }
    dictptr = _PyObject_GetDictPtr(obj);
    if (dictptr == NULL || *dictptr == NULL) {
        return NULL;
    }
    found = PyDict_GetItemWithError(*dictptr, st->str_carrier); /* borrowed */
    if (found == NULL || Py_TYPE(found) != st->carrier_type) {
        PyErr_Clear(); /* only the error of this lookup can be set here */
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

/* Forget obj's carrier and make it a plain torch.Tensor again, in place. */
static int
carrier_demote(leapp_state *st, PyObject *obj)
{
    PyObject **dictptr;
    if (Py_TYPE(obj) != (PyTypeObject *)st->traced_type) {
        return 0;
    }
    dictptr = _PyObject_GetDictPtr(obj);
    if (dictptr != NULL && *dictptr != NULL) {
        int present = PyDict_Contains(*dictptr, st->str_carrier);
        if (present < 0 || (present == 1 && PyDict_DelItem(*dictptr, st->str_carrier) < 0)) {
            return -1;
        }
    }
    if (st->same_layout) {
        /* The reverse of carrier_promote's type swap. */
        Py_INCREF(st->tensor_type);
        Py_SET_TYPE(obj, (PyTypeObject *)st->tensor_type);
        Py_DECREF(st->traced_type); /* the instance's reference to its old type */
        return 0;
    }
    return PyObject_SetAttr(obj, st->str_class, st->tensor_type);
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
    PyObject **dictptr = _PyObject_GetDictPtr(obj);
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
    PyObject_GC_Track(c);
    if (dictptr == NULL) {
        rc = PyObject_SetAttr(obj, st->str_carrier, (PyObject *)c);
        goto done;
    }
    if (*dictptr == NULL) {
        *dictptr = PyDict_New(); /* the instance dict, owned by obj */
        if (*dictptr == NULL) {
            goto done;
        }
    }
    rc = PyDict_SetItem(*dictptr, st->str_carrier, (PyObject *)c);
done:
    Py_DECREF(c);
    return rc;
}

int
carrier_promote(leapp_state *st, PyObject *obj)
{
    PyTypeObject *traced = (PyTypeObject *)st->traced_type;
    if (Py_TYPE(obj) == traced) {
        return 0;
    }
    if (st->same_layout && Py_TYPE(obj) == (PyTypeObject *)st->tensor_type) {
        /* What `obj.__class__ = TracedTensor` does, without re-proving on
         * every op what _bind proved once: the two layouts are identical. */
        Py_INCREF(traced);
        Py_SET_TYPE(obj, traced);
        Py_DECREF(st->tensor_type); /* the instance's reference to its old type */
        return 0;
    }
    return PyObject_SetAttr(obj, st->str_class, st->traced_type);
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

/* ---- dtype names --------------------------------------------------------- */

PyObject *
leapp_dtype_name(leapp_state *st, PyObject *tensor)
{
    PyObject *dtype = NULL, *name = NULL, *text = NULL;
    dtype = PyObject_GetAttr(tensor, st->str_dtype);
    if (dtype == NULL) {
        goto done;
    }
    name = PyDict_GetItemWithError(st->dtype_names, dtype); /* borrowed */
    if (name != NULL) {
        Py_INCREF(name);
        goto done;
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    text = PyObject_Str(dtype); /* "torch.float32" */
    if (text == NULL) {
        goto done;
    }
    if (PyUnicode_GET_LENGTH(text) > 6) {
        name = PyUnicode_Substring(text, 6, PyUnicode_GET_LENGTH(text));
    }
    else {
        name = Py_NewRef(text);
    }
    if (name != NULL && PyDict_SetItem(st->dtype_names, dtype, name) < 0) {
        Py_CLEAR(name);
    }
done:
    Py_XDECREF(text);
    Py_XDECREF(dtype);
    return name;
}

static PyObject *
py_dtype_name(PyObject *module, PyObject *tensor)
{
    return leapp_dtype_name(leapp_get_state(module), tensor);
}

/* ---- Port -------------------------------------------------------------- */

static int
port_traverse(PortObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->name);
    Py_VISIT(self->dtype);
    Py_VISIT(self->shape);
    Py_VISIT(self->semantics);
    Py_VISIT(self->value);
    Py_VISIT(self->samples);
    Py_VISIT(self->src_node);
    Py_VISIT(self->src_port);
    return 0;
}

static int
port_clear(PortObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->semantics);
    Py_CLEAR(self->value);
    Py_CLEAR(self->samples);
    Py_CLEAR(self->src_node);
    Py_CLEAR(self->src_port);
    return 0;
}

static void
port_dealloc(PortObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    (void)port_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Port(name, dtype, shape, vid=-1, value=None, semantics=None) */
static PyObject *
port_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "dtype", "shape", "vid", "value", "semantics", NULL};
    PyObject *name, *dtype, *shape, *value = Py_None, *semantics = Py_None;
    Py_ssize_t vid = -1;
    PortObject *self = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UUO!|nOO:Port", kwlist, &name, &dtype,
                                     &PyTuple_Type, &shape, &vid, &value, &semantics)) {
        return NULL;
    }
    if (semantics != Py_None && !PyDict_Check(semantics)) {
        PyErr_SetString(PyExc_TypeError, "Port(): semantics must be a dict or None");
        return NULL;
    }
    self = (PortObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->samples = PyList_New(0);
    if (self->samples == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->name = Py_NewRef(name);
    self->dtype = Py_NewRef(dtype);
    self->shape = Py_NewRef(shape);
    self->value = Py_NewRef(value);
    self->semantics = Py_NewRef(semantics);
    self->src_node = Py_NewRef(Py_None);
    self->src_port = Py_NewRef(Py_None);
    self->vid = vid;
    return (PyObject *)self;
}

static PyObject *
port_repr(PortObject *self)
{
    return PyUnicode_FromFormat("Port(%R, %U, %R)", self->name, self->dtype, self->shape);
}

/* describe() -> dict with name, dtype, shape, type and semantic fields:
 * the tensor entry of the YAML, in its key order. */
static PyObject *
port_describe(PortObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *d = PyDict_New(), *shape = NULL;
    if (d == NULL) {
        goto error;
    }
    shape = PySequence_List(self->shape);
    if (shape == NULL || PyDict_SetItemString(d, "name", self->name) < 0
        || PyDict_SetItemString(d, "dtype", self->dtype) < 0
        || PyDict_SetItemString(d, "shape", shape) < 0) {
        goto error;
    }
    {
        PyObject *tensor = PyUnicode_FromString("tensor");
        int rc = tensor ? PyDict_SetItemString(d, "type", tensor) : -1;
        Py_XDECREF(tensor);
        if (rc < 0) {
            goto error;
        }
    }
    if (self->semantics != Py_None && PyDict_Check(self->semantics)
        && PyDict_Update(d, self->semantics) < 0) {
        goto error;
    }
    Py_DECREF(shape);
    return d;
error:
    Py_XDECREF(shape);
    Py_XDECREF(d);
    return NULL;
}

static PyMethodDef port_methods[] = {
    {"describe", (PyCFunction)port_describe, METH_NOARGS, "The YAML tensor entry."},
    {NULL},
};

/* Typed fields of a Port: C code reads them as str / tuple / Node, so the
 * setters refuse anything else (and deletion). */
enum { FIELD_STR, FIELD_STR_OR_NONE, FIELD_TUPLE, FIELD_DICT_OR_NONE, FIELD_NODE_OR_NONE };

typedef struct {
    Py_ssize_t offset;
    int kind;
    const char *expected;
} port_field;

static const port_field port_fields[] = {
    {offsetof(PortObject, name), FIELD_STR, "a str"},
    {offsetof(PortObject, dtype), FIELD_STR, "a str"},
    {offsetof(PortObject, shape), FIELD_TUPLE, "a tuple"},
    {offsetof(PortObject, semantics), FIELD_DICT_OR_NONE, "a dict or None"},
    {offsetof(PortObject, src_node), FIELD_NODE_OR_NONE, "a Node or None"},
    {offsetof(PortObject, src_port), FIELD_STR_OR_NONE, "a str or None"},
};

static PyObject *
port_get_field(PortObject *self, void *closure)
{
    const port_field *field = closure;
    PyObject *value = *(PyObject **)((char *)self + field->offset);
    return Py_NewRef(value != NULL ? value : Py_None);
}

static int
port_set_field(PortObject *self, PyObject *value, void *closure)
{
    const port_field *field = closure;
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject **slot = (PyObject **)((char *)self + field->offset);
    int ok = 0;
    if (st == NULL) {
        return -1;
    }
    if (value != NULL) {
        switch (field->kind) {
        case FIELD_STR:
            ok = PyUnicode_Check(value);
            break;
        case FIELD_STR_OR_NONE:
            ok = value == Py_None || PyUnicode_Check(value);
            break;
        case FIELD_TUPLE:
            ok = PyTuple_Check(value);
            break;
        case FIELD_DICT_OR_NONE:
            ok = value == Py_None || PyDict_Check(value);
            break;
        default:
            ok = value == Py_None || PyObject_TypeCheck(value, st->node_type);
            break;
        }
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "this Port field must be %s, got %s", field->expected,
                     value == NULL ? "a deletion" : Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

#define PORT_FIELD(attr, i, doc) \
    {attr, (getter)port_get_field, (setter)port_set_field, doc, (void *)&port_fields[i]}
static PyGetSetDef port_getset[] = {
    PORT_FIELD("name", 0, "Port name."),
    PORT_FIELD("dtype", 1, "dtype name, e.g. float32."),
    PORT_FIELD("shape", 2, "Shape as a tuple of ints."),
    PORT_FIELD("semantics", 3, "Semantic YAML fields or None."),
    PORT_FIELD("src_node", 4, "Producing node or None."),
    PORT_FIELD("src_port", 5, "Producing port or None."),
    {NULL},
};
#undef PORT_FIELD

static PyMemberDef port_members[] = {
    {"value", T_OBJECT, offsetof(PortObject, value), 0, "First-trace value."},
    {"samples", T_OBJECT_EX, offsetof(PortObject, samples), READONLY, "Re-entry values."},
    {"vid", T_PYSSIZET, offsetof(PortObject, vid), 0, "Value id inside the node."},
    {"is_state", T_INT, offsetof(PortObject, is_state), 0, "Declared state port."},
    {NULL},
};

static PyType_Slot port_slots[] = {
    {Py_tp_new, port_new},
    {Py_tp_dealloc, port_dealloc},
    {Py_tp_traverse, port_traverse},
    {Py_tp_clear, port_clear},
    {Py_tp_repr, port_repr},
    {Py_tp_members, port_members},
    {Py_tp_getset, port_getset},
    {Py_tp_methods, port_methods},
    {Py_tp_doc, "One input or output of a node: name, dtype, shape, semantics, source."},
    {0, NULL},
};

static PyType_Spec port_spec = {
    .name = "leapp._core.Port",
    .basicsize = sizeof(PortObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = port_slots,
};

/* ---- Node -------------------------------------------------------------- */

static int
node_traverse(NodeObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->name);
    Py_VISIT(self->inputs);
    Py_VISIT(self->outputs);
    Py_VISIT(self->trimmed);
    Py_VISIT(self->ops);
    Py_VISIT(self->consts);
    Py_VISIT(self->const_ids);
    Py_VISIT(self->info);
    return 0;
}

static int
node_clear(NodeObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->inputs);
    Py_CLEAR(self->outputs);
    Py_CLEAR(self->trimmed);
    Py_CLEAR(self->ops);
    Py_CLEAR(self->consts);
    Py_CLEAR(self->const_ids);
    Py_CLEAR(self->info);
    return 0;
}

static void
node_dealloc(NodeObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    (void)node_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
node_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", NULL};
    PyObject *name;
    NodeObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U:Node", kwlist, &name)) {
        return NULL;
    }
    self = (NodeObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->name = Py_NewRef(name);
    self->inputs = PyTuple_New(0);
    self->outputs = PyTuple_New(0);
    self->trimmed = PyTuple_New(0);
    self->ops = PyList_New(0);
    self->consts = PyList_New(0);
    self->const_ids = PyDict_New();
    self->info = PyDict_New();
    self->index = -1;
    self->state = NODE_OPEN;
    if (self->inputs == NULL || self->outputs == NULL || self->trimmed == NULL
        || self->ops == NULL || self->consts == NULL || self->const_ids == NULL
        || self->info == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
node_repr(NodeObject *self)
{
    return PyUnicode_FromFormat("<Node %R: %zd ops, %s>", self->name, PyList_GET_SIZE(self->ops),
                                self->state == NODE_OPEN ? "tracing" : "finished");
}

Py_ssize_t
node_const_index(NodeObject *node, PyObject *t)
{
    Py_ssize_t index = -1;
    PyObject *key = PyLong_FromVoidPtr(t), *found;
    if (key == NULL) {
        return -1;
    }
    found = PyDict_GetItemWithError(node->const_ids, key); /* borrowed */
    if (found != NULL) {
        index = PyLong_AsSsize_t(found);
        goto done;
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    /* The list keeps t alive, so its id cannot be reused while recorded. */
    index = PyList_GET_SIZE(node->consts);
    {
        PyObject *pos = PyLong_FromSsize_t(index);
        if (pos == NULL || PyList_Append(node->consts, t) < 0
            || PyDict_SetItem(node->const_ids, key, pos) < 0) {
            index = -1;
        }
        Py_XDECREF(pos);
    }
done:
    Py_DECREF(key);
    return index;
}

/* new_value() -> int: hand out a fresh value id. */
static PyObject *
node_new_value(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->nvalues++);
}

/* bind_const(tensor, vid=-1) -> int: a value id (fresh unless given) defined
 * as a constant of the node; a given vid is defined at the start of the log. */
static PyObject *
node_bind_const(NodeObject *self, PyObject *args_in)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *tensor, *ref = NULL, *args = NULL, *record = NULL, *vid = NULL;
    Py_ssize_t given = -1, k;
    if (st == NULL || !PyArg_ParseTuple(args_in, "O|n:bind_const", &tensor, &given)) {
        return NULL;
    }
    k = node_const_index(self, tensor);
    if (k < 0) {
        goto done;
    }
    ref = ref_new(st, REF_CONST, k);
    if (ref == NULL) {
        goto done;
    }
    args = PyTuple_Pack(1, ref);
    vid = PyLong_FromSsize_t(given >= 0 ? given : self->nvalues++);
    if (args == NULL || vid == NULL) {
        Py_CLEAR(vid);
        goto done;
    }
    record = PyTuple_Pack(4, Py_None, args, Py_None, vid);
    /* A given vid (an input turned into a constant) already has uses in the
     * log: its definition goes first so that pruning, which walks the log
     * backwards, sees the uses before the definition. */
    if (record == NULL
        || (given >= 0 ? PyList_Insert(self->ops, 0, record) : PyList_Append(self->ops, record))
               < 0) {
        Py_CLEAR(vid);
    }
done:
    Py_XDECREF(record);
    Py_XDECREF(args);
    Py_XDECREF(ref);
    return vid;
}

/* Mark every value Ref inside obj as live. */
static int
mark_refs(leapp_state *st, PyObject *obj, char *live, Py_ssize_t n)
{
    int rc = 0;
    if (Py_TYPE(obj) == st->ref_type) {
        RefObject *r = (RefObject *)obj;
        if (r->kind == REF_VALUE && r->index >= 0 && r->index < n) {
            live[r->index] = 1;
        }
        return 0;
    }
    if (!PyTuple_Check(obj) && !PyList_Check(obj) && !PyDict_Check(obj) && !PySlice_Check(obj)) {
        return 0;
    }
    if (Py_EnterRecursiveCall(" while pruning a node")) {
        return -1;
    }
    if (PyTuple_Check(obj) || PyList_Check(obj)) {
        Py_ssize_t i;
        for (i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(obj); i++) {
            rc = mark_refs(st, PySequence_Fast_GET_ITEM(obj, i), live, n);
        }
    }
    else if (PyDict_Check(obj)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (rc == 0 && PyDict_Next(obj, &pos, &key, &value)) {
            rc = mark_refs(st, value, live, n);
        }
    }
    else {
        PySliceObject *s = (PySliceObject *)obj;
        rc = (mark_refs(st, s->start, live, n) < 0 || mark_refs(st, s->stop, live, n) < 0
              || mark_refs(st, s->step, live, n) < 0) ? -1 : 0;
    }
    Py_LeaveRecursiveCall();
    return rc;
}

/* 1 when a value of a record's out field is live, 0 if not, -1 on error. */
static int
out_is_live(PyObject *out, const char *live, Py_ssize_t n)
{
    if (PyLong_Check(out)) {
        Py_ssize_t v = PyLong_AsSsize_t(out);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        return v >= 0 && v < n && live[v];
    }
    if (PyTuple_Check(out)) {
        Py_ssize_t i;
        for (i = 0; i < PyTuple_GET_SIZE(out); i++) {
            int found = out_is_live(PyTuple_GET_ITEM(out, i), live, n);
            if (found != 0) {
                return found;
            }
        }
    }
    return 0;
}

/* prune(output_vids) -> (live_ops: list[int], live_values: bytes)
 * Reachability from the outputs, walking the op log backwards once. */
static PyObject *
node_prune(NodeObject *self, PyObject *vids)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *seq = NULL, *live_ops = NULL, *flags = NULL, *result = NULL;
    Py_ssize_t n = self->nvalues, i;
    char *live = NULL;
    if (st == NULL) {
        goto done;
    }
    seq = PySequence_Fast(vids, "prune() expects a sequence of value ids");
    live = PyMem_Calloc(n > 0 ? (size_t)n : 1, 1);
    live_ops = PyList_New(0);
    if (seq == NULL || live == NULL || live_ops == NULL) {
        if (live == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    for (i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (v >= 0 && v < n) {
            live[v] = 1;
        }
    }
    for (i = PyList_GET_SIZE(self->ops) - 1; i >= 0; i--) {
        PyObject *rec = PyList_GET_ITEM(self->ops, i); /* borrowed; the list is ours */
        int used;
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4) {
            PyErr_Format(PyExc_TypeError, "node '%U': op record %zd is not a "
                         "(func, args, kwargs, out) tuple", self->name, i);
            goto done;
        }
        used = out_is_live(PyTuple_GET_ITEM(rec, 3), live, n);
        if (used < 0) {
            goto done;
        }
        if (!used) {
            continue;
        }
        if (mark_refs(st, PyTuple_GET_ITEM(rec, 1), live, n) < 0
            || mark_refs(st, PyTuple_GET_ITEM(rec, 2), live, n) < 0) {
            goto done;
        }
        PyObject *pos = PyLong_FromSsize_t(i);
        if (pos == NULL || PyList_Append(live_ops, pos) < 0) {
            Py_XDECREF(pos);
            goto done;
        }
        Py_DECREF(pos);
    }
    if (PyList_Reverse(live_ops) < 0) {
        goto done;
    }
    flags = PyBytes_FromStringAndSize(live, n);
    if (flags == NULL) {
        goto done;
    }
    result = PyTuple_Pack(2, live_ops, flags);
done:
    PyMem_Free(live);
    Py_XDECREF(flags);
    Py_XDECREF(live_ops);
    Py_XDECREF(seq);
    return result;
}

/* finish(index=None): close the node; its carriers become inactive.  The
 * completion order is the session's next one unless given (graphs built by
 * hand in tests). */
static PyObject *
node_finish(NodeObject *self, PyObject *args)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *given = Py_None, *result = NULL;
    Py_ssize_t index;
    if (st == NULL || !PyArg_ParseTuple(args, "|O:finish", &given)) {
        goto done;
    }
    if (self->state != NODE_OPEN) {
        PyErr_Format(PyExc_RuntimeError, "finish(): node '%U' has already finished", self->name);
        goto done;
    }
    index = given == Py_None ? st->next_index : PyLong_AsSsize_t(given);
    if (index == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (given == Py_None) {
        st->next_index++;
    }
    self->index = index;
    self->state = NODE_DONE;
    result = Py_NewRef(Py_None);
done:
    return result;
}

/* record(func, args, kwargs=None) -> int: append an op whose traced
 * arguments are value Refs (see value_ref) and return its fresh value id.
 * The alias hooks use it to write the effect of an in-place write onto the
 * other views of the same storage. */
static PyObject *
node_record(NodeObject *self, PyObject *args_in)
{
    PyObject *func, *args, *kwargs = Py_None, *vid = NULL, *record = NULL;
    if (!PyArg_ParseTuple(args_in, "OO!|O:record", &func, &PyTuple_Type, &args, &kwargs)) {
        return NULL;
    }
    if (kwargs != Py_None && !PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "record(): kwargs must be a dict or None");
        return NULL;
    }
    if (self->state != NODE_OPEN) {
        PyErr_Format(PyExc_RuntimeError, "record(): node '%U' has finished tracing", self->name);
        return NULL;
    }
    vid = PyLong_FromSsize_t(self->nvalues);
    if (vid == NULL) {
        return NULL;
    }
    assert(self->nvalues >= 0 && PyList_Check(self->ops));
    record = PyTuple_Pack(4, func, args, kwargs, vid);
    if (record == NULL || PyList_Append(self->ops, record) < 0) {
        Py_CLEAR(vid);
    }
    else {
        self->nvalues++;
    }
    Py_XDECREF(record);
    return vid;
}

/* ---- the port tuples: the only writers of inputs, outputs, trimmed ------ */

/* Index of port (by identity) in ports, a port tuple; -1 if absent. */
static Py_ssize_t
port_index(PyObject *ports, PyObject *port)
{
    Py_ssize_t i;
    for (i = 0; i < PyTuple_GET_SIZE(ports); i++) {
        if (PyTuple_GET_ITEM(ports, i) == port) {
            return i;
        }
    }
    return -1;
}

/* Index of the port named name (a str) in ports, a port tuple; -1 if absent.
 * Comparing two str runs no Python code and cannot fail. */
static Py_ssize_t
port_index_named(leapp_state *st, PyObject *ports, PyObject *name)
{
    Py_ssize_t i;
    assert(PyUnicode_Check(name));
    for (i = 0; i < PyTuple_GET_SIZE(ports); i++) {
        if (PyUnicode_Compare(node_port_at(st, ports, i)->name, name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Whether port is one of the node's ports, on any side. */
static int
node_has_port(NodeObject *self, PyObject *port)
{
    return port_index(self->inputs, port) >= 0 || port_index(self->trimmed, port) >= 0
           || port_index(self->outputs, port) >= 0;
}

/* Whether name is taken by an input, trimmed ones included. */
static int
input_name_taken(leapp_state *st, NodeObject *self, PyObject *name)
{
    return port_index_named(st, self->inputs, name) >= 0
           || port_index_named(st, self->trimmed, name) >= 0;
}

/* 0 when the node still traces; -1 with the error naming the method if not. */
static int
require_open(NodeObject *self, const char *method)
{
    if (self->state == NODE_OPEN) {
        return 0;
    }
    PyErr_Format(PyExc_RuntimeError, "%s(): node '%U' has finished tracing; its ports are fixed",
                 method, self->name);
    return -1;
}

/* Replace *slot (a port tuple) by its items followed by those of more (a
 * tuple); -1 on error, *slot unchanged. */
static int
ports_extend(PyObject **slot, PyObject *more)
{
    PyObject *grown = PySequence_Concat(*slot, more); /* two tuples: no Python code */
    if (grown == NULL) {
        return -1;
    }
    Py_SETREF(*slot, grown);
    return 0;
}

/* add_input(port): append a new input port to the tracing node; its name
 * must be new among the node's inputs (trimmed ones included). */
static PyObject *
node_add_input(NodeObject *self, PyObject *args)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *port, *one = NULL, *result = NULL;
    if (st == NULL || !PyArg_ParseTuple(args, "O!:add_input", st->port_type, &port)
        || require_open(self, "add_input") < 0) {
        goto done;
    }
    if (node_has_port(self, port)) {
        PyErr_Format(PyExc_ValueError, "add_input(): %R is already a port of node '%U'", port,
                     self->name);
        goto done;
    }
    if (input_name_taken(st, self, ((PortObject *)port)->name)) {
        PyErr_Format(PyExc_ValueError, "add_input(): node '%U' already has an input named '%U'",
                     self->name, ((PortObject *)port)->name);
        goto done;
    }
    one = PyTuple_Pack(1, port);
    if (one == NULL || ports_extend(&self->inputs, one) < 0) {
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(one);
    return result;
}

/* add_outputs(ports): append output ports to the tracing node, all or none;
 * their names must be new among its outputs and distinct. */
static PyObject *
node_add_outputs(NodeObject *self, PyObject *ports)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *items = NULL, *result = NULL;
    Py_ssize_t i, n;
    if (st == NULL) {
        goto done;
    }
    /* ours: the checks below see what is added; iterating ports may run
     * Python code, so the node is looked at only afterwards */
    items = PySequence_Tuple(ports);
    if (items == NULL || require_open(self, "add_outputs") < 0) {
        goto done;
    }
    n = PyTuple_GET_SIZE(items);
    for (i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i); /* borrowed */
        PyObject *name;
        if (!PyObject_TypeCheck(item, st->port_type)) {
            PyErr_Format(PyExc_TypeError, "add_outputs(): item %zd is a %.200s, not a Port", i,
                         Py_TYPE(item)->tp_name);
            goto done;
        }
        name = ((PortObject *)item)->name;
        if (node_has_port(self, item) || port_index(items, item) < i) {
            PyErr_Format(PyExc_ValueError, "add_outputs(): %R is already a port of node '%U'",
                         item, self->name);
            goto done;
        }
        if (port_index_named(st, self->outputs, name) >= 0
            || port_index_named(st, items, name) < i) {
            PyErr_Format(PyExc_ValueError,
                         "add_outputs(): node '%U' already has an output named '%U'", self->name,
                         name);
            goto done;
        }
    }
    if (ports_extend(&self->outputs, items) < 0) {
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(items);
    return result;
}

/* remove_input(port): drop an input port of the tracing node (a buffer that
 * became a constant of the node). */
static PyObject *
node_remove_input(NodeObject *self, PyObject *args)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *port, *head = NULL, *tail = NULL, *result = NULL;
    Py_ssize_t i;
    if (st == NULL || !PyArg_ParseTuple(args, "O!:remove_input", st->port_type, &port)
        || require_open(self, "remove_input") < 0) {
        goto done;
    }
    i = port_index(self->inputs, port);
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "remove_input(): %R is not an input of node '%U'", port,
                     self->name);
        goto done;
    }
    head = PyTuple_GetSlice(self->inputs, 0, i);
    tail = PyTuple_GetSlice(self->inputs, i + 1, PyTuple_GET_SIZE(self->inputs));
    if (head == NULL || tail == NULL || ports_extend(&head, tail) < 0) {
        goto done;
    }
    Py_SETREF(self->inputs, Py_NewRef(head));
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(head);
    Py_XDECREF(tail);
    return result;
}

/* trim_inputs(names): move the inputs of those names to trimmed_inputs, both
 * keeping their order (pruning, and an exporter that dropped inputs). */
static PyObject *
node_trim_inputs(NodeObject *self, PyObject *names)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *seq = NULL, *kept = NULL, *moved = NULL, *result = NULL;
    Py_ssize_t i, n;
    char *trim = NULL;
    if (st == NULL) {
        goto done;
    }
    seq = PySequence_Tuple(names); /* may run Python code: the node is read after it */
    if (seq == NULL) {
        goto done;
    }
    n = PyTuple_GET_SIZE(self->inputs);
    trim = PyMem_Calloc(n > 0 ? (size_t)n : 1, 1);
    if (trim == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        PyObject *name = PyTuple_GET_ITEM(seq, i); /* borrowed */
        Py_ssize_t at;
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "trim_inputs(): names must be str, got %.200s",
                         Py_TYPE(name)->tp_name);
            goto done;
        }
        at = port_index_named(st, self->inputs, name);
        if (at < 0) {
            PyErr_Format(PyExc_ValueError, "trim_inputs(): node '%U' has no input named '%U'",
                         self->name, name);
            goto done;
        }
        trim[at] = 1;
    }
    kept = PyList_New(0);
    moved = PySequence_List(self->trimmed);
    for (i = 0; kept != NULL && moved != NULL && i < n; i++) {
        if (PyList_Append(trim[i] ? moved : kept, PyTuple_GET_ITEM(self->inputs, i)) < 0) {
            goto done;
        }
    }
    if (kept == NULL || moved == NULL) {
        goto done;
    }
    Py_SETREF(kept, PyList_AsTuple(kept));
    Py_SETREF(moved, PyList_AsTuple(moved));
    if (kept == NULL || moved == NULL) {
        goto done;
    }
    Py_SETREF(self->inputs, Py_NewRef(kept));
    Py_SETREF(self->trimmed, Py_NewRef(moved));
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(trim);
    Py_XDECREF(seq);
    Py_XDECREF(kept);
    Py_XDECREF(moved);
    return result;
}

/* Set port's name (a str) in place. */
static void
port_rename(PortObject *port, PyObject *name)
{
    Py_SETREF(port->name, Py_NewRef(name));
}

/* rename_input(old, new): an exporter's name for an input (the name stays
 * unique among the inputs, trimmed ones included). */
static PyObject *
node_rename_input(NodeObject *self, PyObject *args)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *old, *new, *result = NULL;
    Py_ssize_t i;
    if (st == NULL || !PyArg_ParseTuple(args, "UU:rename_input", &old, &new)) {
        goto done;
    }
    i = port_index_named(st, self->inputs, old);
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "rename_input(): node '%U' has no input named '%U'",
                     self->name, old);
        goto done;
    }
    if (PyUnicode_Compare(old, new) != 0 && input_name_taken(st, self, new)) {
        PyErr_Format(PyExc_ValueError, "rename_input(): node '%U' already has an input named '%U'",
                     self->name, new);
        goto done;
    }
    port_rename(node_port_at(st, self->inputs, i), new);
    result = Py_NewRef(Py_None);
done:
    return result;
}

/* Every input (trimmed ones included) of the session's nodes that names
 * producer's output old as its source names new instead. */
static void
rename_sources(leapp_state *st, NodeObject *producer, PyObject *old, PyObject *new)
{
    Py_ssize_t pos = 0, i, side;
    PyObject *key, *value; /* borrowed from st->nodes */
    while (PyDict_Next(st->nodes, &pos, &key, &value)) {
        NodeObject *node = (NodeObject *)value;
        assert(Py_IS_TYPE(value, st->node_type)); /* register_node checks */
        for (side = 0; side < 2; side++) {
            PyObject *ports = side == 0 ? node->inputs : node->trimmed;
            for (i = 0; i < PyTuple_GET_SIZE(ports); i++) {
                PortObject *in = node_port_at(st, ports, i);
                if (in->src_node == (PyObject *)producer && PyUnicode_Check(in->src_port)
                    && PyUnicode_Compare(in->src_port, old) == 0) {
                    Py_SETREF(in->src_port, Py_NewRef(new)); /* a str: frees no object */
                }
            }
        }
    }
}

/* rename_output(old, new): an exporter's name for an output; every input of
 * the session's nodes it feeds names it as its source under the new name. */
static PyObject *
node_rename_output(NodeObject *self, PyObject *args)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *old, *new, *result = NULL;
    Py_ssize_t i;
    if (st == NULL || !PyArg_ParseTuple(args, "UU:rename_output", &old, &new)) {
        goto done;
    }
    i = port_index_named(st, self->outputs, old);
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "rename_output(): node '%U' has no output named '%U'",
                     self->name, old);
        goto done;
    }
    if (PyUnicode_Compare(old, new) != 0) {
        if (port_index_named(st, self->outputs, new) >= 0) {
            PyErr_Format(PyExc_ValueError,
                         "rename_output(): node '%U' already has an output named '%U'",
                         self->name, new);
            goto done;
        }
        /* old stays alive: the argument tuple holds it */
        port_rename(node_port_at(st, self->outputs, i), new);
        rename_sources(st, self, old, new);
    }
    result = Py_NewRef(Py_None);
done:
    return result;
}

static PyObject *
node_get_tracing(NodeObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->state == NODE_OPEN);
}

static PyMethodDef node_methods[] = {
    {"new_value", (PyCFunction)node_new_value, METH_NOARGS, "A fresh value id."},
    {"bind_const", (PyCFunction)node_bind_const, METH_VARARGS, "Value id bound to a constant."},
    {"prune", (PyCFunction)node_prune, METH_O, "Reachability from output value ids."},
    {"finish", (PyCFunction)node_finish, METH_VARARGS,
     "Close the node; its completion index is the session's next one unless given."},
    {"record", (PyCFunction)node_record, METH_VARARGS, "Append an op; its fresh value id."},
    {"add_input", (PyCFunction)node_add_input, METH_VARARGS,
     "Append an input port (its name new among the inputs) to the tracing node."},
    {"add_outputs", (PyCFunction)node_add_outputs, METH_O,
     "Append output ports (distinct new names) to the tracing node, all or none."},
    {"remove_input", (PyCFunction)node_remove_input, METH_VARARGS,
     "Drop an input port of the tracing node."},
    {"trim_inputs", (PyCFunction)node_trim_inputs, METH_O,
     "Move the inputs of these names to trimmed_inputs."},
    {"rename_input", (PyCFunction)node_rename_input, METH_VARARGS, "Rename an input port."},
    {"rename_output", (PyCFunction)node_rename_output, METH_VARARGS,
     "Rename an output port and the source of every input it feeds."},
    {NULL},
};

static PyGetSetDef node_getset[] = {
    {"is_tracing", (getter)node_get_tracing, NULL, "True until the first pass finishes.", NULL},
    {NULL},
};

static PyMemberDef node_members[] = {
    {"name", T_OBJECT, offsetof(NodeObject, name), READONLY, "Node name."},
    {"inputs", T_OBJECT, offsetof(NodeObject, inputs), READONLY, "Input ports (a tuple)."},
    {"outputs", T_OBJECT, offsetof(NodeObject, outputs), READONLY, "Output ports (a tuple)."},
    {"trimmed_inputs", T_OBJECT, offsetof(NodeObject, trimmed), READONLY,
     "Inputs pruned or dropped by the exporter (a tuple)."},
    {"ops", T_OBJECT, offsetof(NodeObject, ops), READONLY, "The op log."},
    {"consts", T_OBJECT, offsetof(NodeObject, consts), READONLY, "Constant table."},
    {"info", T_OBJECT, offsetof(NodeObject, info), READONLY, "Facade data."},
    {"nvalues", T_PYSSIZET, offsetof(NodeObject, nvalues), READONLY, "Value ids used."},
    {"node_index", T_PYSSIZET, offsetof(NodeObject, index), READONLY, "Completion order."},
    {NULL},
};

static PyType_Slot node_slots[] = {
    {Py_tp_new, node_new},
    {Py_tp_dealloc, node_dealloc},
    {Py_tp_traverse, node_traverse},
    {Py_tp_clear, node_clear},
    {Py_tp_repr, node_repr},
    {Py_tp_methods, node_methods},
    {Py_tp_members, node_members},
    {Py_tp_getset, node_getset},
    {Py_tp_doc, "A traced node: ports, op log, constants and completion order."},
    {0, NULL},
};

static PyType_Spec node_spec = {
    .name = "leapp._core.Node",
    .basicsize = sizeof(NodeObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = node_slots,
};

static PyMethodDef node_functions[] = {
    {"carrier_of", py_carrier_of, METH_O, "The Carrier of a traced tensor, or None."},
    {"set_carrier", py_set_carrier, METH_VARARGS, "Make a tensor traced with a carrier."},
    {"drop_carrier", py_drop_carrier, METH_O, "Make a traced tensor plain again."},
    {"dtype_name", py_dtype_name, METH_O, "The YAML dtype name of a tensor."},
    {"value_ref", py_value_ref, METH_O, "A Ref to a node value, for Node.record()."},
    {"remember", py_remember, METH_O, "Have stop() make this traced tensor plain again."},
    {NULL, NULL, 0, NULL},
};

static int
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **slot)
{
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
    if (*slot == NULL) {
        return -1;
    }
    return PyModule_AddType(module, *slot);
}

int
node_init(PyObject *module, leapp_state *st)
{
    if (add_type(module, &ref_spec, &st->ref_type) < 0
        || add_type(module, &carrier_spec, &st->carrier_type) < 0
        || add_type(module, &port_spec, &st->port_type) < 0
        || add_type(module, &node_spec, &st->node_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, node_functions);
}
