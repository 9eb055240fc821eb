/* port.c: the Port type, one input or output of a node, and dtype names.
 *
 * A Port holds what the YAML says of a tensor (name, dtype name, shape,
 * semantic fields), the values seen at it and, for an input fed by another
 * node, its source (src_node, src_port).  The dtype names ("float32", ...)
 * are torch's, cached per dtype in the module state.  Which ports a node has
 * is the Node's business (node.c): a Port only knows itself.
 */
#include "leapp.h"

/* ---- dtype names --------------------------------------------------------- */

PyObject *
leapp_dtype_name(leapp_state *st, PyObject *tensor)
{
    PyObject *dtype = NULL, *name = NULL, *text = NULL, *prefix = NULL;
    Py_ssize_t skip = 0;
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
    /* "torch.float32" -> "float32"; a str without that prefix is kept whole
     * (a dtype-like object of another library) */
    text = PyObject_Str(dtype);
    prefix = text != NULL ? PyUnicode_FromString("torch.") : NULL;
    if (prefix == NULL) {
        goto done;
    }
    skip = PyUnicode_Tailmatch(text, prefix, 0, PY_SSIZE_T_MAX, -1);
    if (skip < 0) {
        goto done;
    }
    skip = skip ? PyUnicode_GET_LENGTH(prefix) : 0;
    name = PyUnicode_Substring(text, skip, PyUnicode_GET_LENGTH(text));
    if (name != NULL && PyDict_SetItem(st->dtype_names, dtype, name) < 0) {
        Py_CLEAR(name);
    }
done:
    Py_XDECREF(prefix);
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

static PyMethodDef port_functions[] = {
    {"dtype_name", py_dtype_name, METH_O, "The YAML dtype name of a tensor."},
    {NULL, NULL, 0, NULL},
};

int
port_init(PyObject *module, leapp_state *st)
{
    st->port_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &port_spec, NULL);
    if (st->port_type == NULL || PyModule_AddType(module, st->port_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, port_functions);
}
