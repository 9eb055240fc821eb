/* prune.c: Node.prune(), reachability over a node's op log.
 *
 * The values the outputs need are found by walking the op log backwards
 * once: an op is live when one of its out values is, and then the value
 * Refs among its arguments are.  A definition moved to the front of the log
 * (bind_const with a given vid) keeps this one backward pass exact.
 */
#include "leapp.h"

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
PyObject *
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
