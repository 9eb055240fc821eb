/* trace_inactive.c: ops on values of finished nodes while a session runs (the
 * other half of trace.c's handler).  They run eagerly and give plain tensors,
 * except the equivalent copies and whole-tensor overwrites that keep a published
 * port; a tensor computed from a published value is tagged with where it came
 * from, never with a carrier.
 */
#include "leapp.h"

/* Whether key (of dst[key] = value) selects the whole tensor: `...` or `:`. */
static int
is_full_key(PyObject *key)
{
    PySliceObject *s;
    if (key == Py_Ellipsis) {
        return 1;
    }
    if (!PySlice_Check(key)) {
        return 0;
    }
    s = (PySliceObject *)key;
    return s->start == Py_None && s->stop == Py_None && s->step == Py_None;
}

/* 1 when attribute name of a and b compares equal, 0 when not, -1 on error. */
static int
same_attr(PyObject *a, PyObject *b, PyObject *name)
{
    PyObject *x = PyObject_GetAttr(a, name), *y = x ? PyObject_GetAttr(b, name) : NULL;
    int eq = (x != NULL && y != NULL) ? PyObject_RichCompareBool(x, y, Py_EQ) : -1;
    Py_XDECREF(x);
    Py_XDECREF(y);
    return eq;
}

/* dst.copy_(src) or dst[:] = src outside a tracing node: a full overwrite
 * from a published value with dst's shape and dtype makes dst carry that
 * value's provenance (returns 1); otherwise returns 0, or -1 on error. */
static int
adopt_overwrite(leapp_state *st, PyObject *args)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *dst, *src;              /* borrowed from args */
    CarrierObject *from;              /* src's carrier, held across the attribute reads */
    int eq;
    if (n == 2) {                     /* copy_(dst, src) */
        src = PyTuple_GET_ITEM(args, 1);
    }
    else if (n == 3 && is_full_key(PyTuple_GET_ITEM(args, 1))) {
        src = PyTuple_GET_ITEM(args, 2); /* __setitem__(dst, key, src) */
    }
    else {
        return 0;
    }
    dst = PyTuple_GET_ITEM(args, 0);
    from = carrier_of(st, src);
    if (from == NULL || from->port == NULL || !trace_is_tensor(st, dst) || dst == src) {
        return 0;
    }
    Py_INCREF(from);
    eq = same_attr(dst, src, st->str_shape);
    if (eq == 1) {
        eq = same_attr(dst, src, st->str_dtype);
    }
    if (eq == 1) {
        eq = (carrier_promote(st, dst) < 0
              || carrier_attach(st, dst, from->node, from->vid, from->port, from->declared) < 0)
                 ? -1 : 1;
    }
    Py_DECREF(from);
    return eq;
}

/* Ops on values of finished nodes: eager, keeping the port through copies. */
static PyObject *
run_inactive(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
             PyObject *args, PyObject *kwargs)
{
    PyObject *result = trace_run_eager(st, func, types, args, kwargs);
    PyObject *src = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : NULL; /* borrowed */
    CarrierObject *c;                 /* src's carrier, held across the dtype reads */
    if (result == NULL) {
        return NULL;
    }
    if (kind == OP_OVERWRITE) {
        int adopted = adopt_overwrite(st, args);
        if (adopted != 0) {
            if (adopted < 0) {
                Py_CLEAR(result);
            }
            return result;
        }
    }
    c = src != NULL ? carrier_of(st, src) : NULL;
    if (c == NULL || c != w->first
        || (c->port == NULL && !((kind == OP_INPLACE || kind == OP_OVERWRITE) && c->group))) {
        return result;
    }
    Py_INCREF(c);
    if (kind == OP_INPLACE || kind == OP_OVERWRITE) {
        if (c->group != NULL && st->alias_write != NULL) {
            /* The write may reach a view that a tracing node declared. */
            PyObject *ok = PyObject_CallFunctionObjArgs(st->alias_write, src, func, NULL);
            if (ok == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(ok);
        }
        Py_CLEAR(c->port); /* a published value changed in place is a new value */
        goto done;
    }
    if ((kind == OP_COPY || kind == OP_TO) && result != src
        && Py_TYPE(result) == (PyTypeObject *)st->tensor_type) {
        if (kind == OP_TO) {
            int same = same_attr(src, result, st->str_dtype);
            if (same < 0) {
                Py_CLEAR(result);
            }
            if (same != 1) {
                goto done;
            }
        }
        if (carrier_promote(st, result) < 0
            || carrier_attach(st, result, c->node, c->vid, c->port, c->declared) < 0) {
            Py_CLEAR(result);
        }
    }
done:
    Py_DECREF(c);
    return result;
}

/* A new (node name, port, op name) tag: plain strings, so copies of a tagged
 * tensor (deepcopy, pickle) hold no Node. */
static PyObject *
derived_tag(CarrierObject *c, PyObject *func)
{
    PyObject *tag = NULL, *fname = leapp_func_name(func);
    if (fname != NULL) {
        tag = PyTuple_Pack(3, ((NodeObject *)c->node)->name, c->port, fname);
    }
    Py_XDECREF(fname);
    return tag;
}

/* The derived tag of a top-level argument, borrowed, or NULL (no exception). */
static PyObject *
derived_arg(leapp_state *st, PyObject *args)
{
    PyObject *tag = NULL;             /* borrowed from an argument's instance dict */
    Py_ssize_t i, n = PyTuple_GET_SIZE(args);
    for (i = 0; i < n && tag == NULL; i++) {
        tag = carrier_dict_item(st, PyTuple_GET_ITEM(args, i), st->str_derived);
    }
    return tag;
}

/* Tag the plain tensor t (made a TracedTensor without a carrier, so the ops
 * that follow keep the tag, and remembered, so stop() makes it plain again)
 * with tag; other objects are left alone. */
static int
tag_derived(leapp_state *st, PyObject *t, PyObject *tag)
{
    if (Py_TYPE(t) != (PyTypeObject *)st->tensor_type) {
        return 0;                     /* a traced value or another subclass: untouched */
    }
    return carrier_tag_derived(st, t, tag);
}

/* Ops outside every node while a session runs.  A tensor result computed
 * from a published value (or from a result tagged so) is tagged "derived
 * from port P of node N by func": an input declared from it would silently be
 * a new graph input, and the facade says so (leapp.tracing.session). */
PyObject *
trace_inactive(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
               PyObject *args, PyObject *kwargs)
{
    PyObject *result = run_inactive(st, w, kind, func, types, args, kwargs);
    PyObject *tag = NULL;             /* strong */
    PyObject *target = result;        /* borrowed: what gets the tag */
    Py_ssize_t i, n;
    if (result == NULL) {
        goto done;
    }
    if ((kind == OP_INPLACE || kind == OP_OVERWRITE) && PyTuple_GET_SIZE(args)) {
        target = PyTuple_GET_ITEM(args, 0); /* the written receiver (x[k] = v gives None) */
    }
    if (Py_TYPE(target) != (PyTypeObject *)st->tensor_type && !PyTuple_Check(target)
        && !PyList_Check(target)) {
        goto done;                    /* sizes, item(), bools; results that kept a port */
    }
    if (w->first != NULL && w->first->port != NULL) {
        tag = derived_tag(w->first, func);
    }
    else {
        tag = Py_XNewRef(derived_arg(st, args));
    }
    if (tag == NULL) {
        if (PyErr_Occurred()) {
            Py_CLEAR(result);
        }
        goto done;
    }
    if (Py_TYPE(target) == (PyTypeObject *)st->tensor_type) {
        if (tag_derived(st, target, tag) < 0) {
            Py_CLEAR(result);
        }
        goto done;
    }
    n = PySequence_Fast_GET_SIZE(target);
    for (i = 0; i < n; i++) {
        if (tag_derived(st, PySequence_Fast_GET_ITEM(target, i), tag) < 0) {
            Py_CLEAR(result);
            goto done;
        }
    }
done:
    Py_XDECREF(tag);
    return result;
}
