/* node.c: the Node type, the context of one traced stage.
 *
 * A Node owns the op log of one traced stage, its constant table and its
 * port tuples.  Ops are recorded as (func, args, kwargs, out) where traced
 * arguments are replaced by Ref(value) and outside tensors by Ref(const)
 * (ref.c).  The port tuples change only through the Node methods below,
 * which keep the invariants leapp.h states; pruning lives in prune.c.
 */
#include "leapp.h"

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
                                self->state == NODE_OPEN ? "tracing"
                                : self->state == NODE_TAIL ? "finished, in its tail" : "finished");
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

/* open_tail(): a finished node keeps recording ops on its internal values
 * (NODE_TAIL) until close_tail(): declared state updated after output_tensors. */
static PyObject *
node_open_tail(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state != NODE_DONE) {
        PyErr_Format(PyExc_RuntimeError, "open_tail(): node '%U' is %s", self->name,
                     self->state == NODE_OPEN ? "still tracing" : "already in its tail");
        return NULL;
    }
    self->state = NODE_TAIL;
    Py_RETURN_NONE;
}

/* close_tail(): the end of the tail; a node not in its tail is left as it is. */
static PyObject *
node_close_tail(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state == NODE_TAIL) {
        self->state = NODE_DONE;
    }
    Py_RETURN_NONE;
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
    if (items == NULL || (self->state != NODE_TAIL && require_open(self, "add_outputs") < 0)) {
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

static PyObject *
node_get_in_tail(NodeObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->state == NODE_TAIL);
}

static PyMethodDef node_methods[] = {
    {"new_value", (PyCFunction)node_new_value, METH_NOARGS, "A fresh value id."},
    {"bind_const", (PyCFunction)node_bind_const, METH_VARARGS, "Value id bound to a constant."},
    {"prune", (PyCFunction)node_prune, METH_O, "Reachability from output value ids."},
    {"finish", (PyCFunction)node_finish, METH_VARARGS,
     "Close the node; its completion index is the session's next one unless given."},
    {"open_tail", (PyCFunction)node_open_tail, METH_NOARGS,
     "Keep recording ops on the finished node's internal values (a late state update)."},
    {"close_tail", (PyCFunction)node_close_tail, METH_NOARGS, "End the node's tail."},
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
    {"in_tail", (getter)node_get_in_tail, NULL,
     "True while ops on its internal values are still recorded after its finish.", NULL},
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

int
node_init(PyObject *module, leapp_state *st)
{
    st->node_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &node_spec, NULL);
    if (st->node_type == NULL || PyModule_AddType(module, st->node_type) < 0) {
        return -1;
    }
    return 0;
}
