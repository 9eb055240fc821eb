/* runtime.c: the compiled step program behind InferenceManager.
 *
 * InferenceManager resolves the YAML once into integer slots: one slot per
 * node input, one per graph output, and a staging slot for each feedback
 * edge whose producer would otherwise run before its consumer.  A Program
 * holds, in run order, each node's callable, the slots it reads, and for
 * each of its outputs the slots the value is routed to.  run(inputs) then
 * does the per-step work without touching Python dicts per node:
 *
 *   1. validate every entry of `inputs` ("node/input" -> tensor) against the
 *      precomputed shape tuple and dtype object of its slot (a value that
 *      does not fit is first offered to the optional `convert` hook, which
 *      turns a NumPy array into a tensor), then store the values by
 *      reference;
 *   2. for each node: call it with its slot values, unwrap a single output,
 *      check the output count, store each output into its first
 *      destination (the tensor itself) and a `clone()` into every further
 *      destination;
 *   3. move staged feedback values into their targets;
 *   4. return a new dict {"node/output": tensor} of the graph outputs.
 *
 * Feedback needs no special casing: a feedback target belongs to a node
 * that runs before the producer, so the value written this step is read on
 * the next one.
 */
#include "leapp.h"

/* Arguments of most nodes fit on the C stack. */
#define SMALL_ARGS 8

/* ---- type slots -------------------------------------------------------- */

static int
program_traverse(ProgramObject *self, visitproc visit, void *arg)
{
    Py_ssize_t i;
    Py_VISIT(Py_TYPE(self));
    if (self->slots != NULL) {
        for (i = 0; i < self->nslots; i++) {
            Py_VISIT(self->slots[i]);
        }
    }
    if (self->calls != NULL) {
        for (i = 0; i < self->nnodes; i++) {
            Py_VISIT(self->calls[i]);
        }
    }
    if (self->result_keys != NULL) {
        for (i = 0; i < self->nresults; i++) {
            Py_VISIT(self->result_keys[i]);
        }
    }
    Py_VISIT(self->names);
    Py_VISIT(self->input_index);
    Py_VISIT(self->slot_keys);
    Py_VISIT(self->shapes);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->graph_inputs);
    Py_VISIT(self->convert);
    return 0;
}

static int
program_clear(ProgramObject *self)
{
    Py_ssize_t i;
    if (self->slots != NULL) {
        for (i = 0; i < self->nslots; i++) {
            Py_CLEAR(self->slots[i]);
        }
    }
    if (self->calls != NULL) {
        for (i = 0; i < self->nnodes; i++) {
            Py_CLEAR(self->calls[i]);
        }
    }
    if (self->result_keys != NULL) {
        for (i = 0; i < self->nresults; i++) {
            Py_CLEAR(self->result_keys[i]);
        }
    }
    Py_CLEAR(self->names);
    Py_CLEAR(self->input_index);
    Py_CLEAR(self->slot_keys);
    Py_CLEAR(self->shapes);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->graph_inputs);
    Py_CLEAR(self->convert);
    return 0;
}

static void
program_dealloc(ProgramObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    (void)program_clear(self);
    PyMem_Free(self->slots);
    PyMem_Free(self->calls);
    PyMem_Free(self->in_off);
    PyMem_Free(self->in_slot);
    PyMem_Free(self->out_off);
    PyMem_Free(self->dst_off);
    PyMem_Free(self->dst_slot);
    PyMem_Free(self->result_keys);
    PyMem_Free(self->result_slot);
    PyMem_Free(self->commit_from);
    PyMem_Free(self->commit_to);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ---- run --------------------------------------------------------------- */

/* Raise the error for a value that does not fit slot s (a graph input). */
static void
input_mismatch(ProgramObject *self, leapp_state *st, Py_ssize_t s, PyObject *key,
               PyObject *value)
{
    PyObject *shape = NULL, *dtype = NULL, *got = NULL;
    PyObject *want_shape = PyTuple_GET_ITEM(self->shapes, s); /* borrowed */
    PyObject *want_dtype = PyTuple_GET_ITEM(self->dtypes, s); /* borrowed */
    shape = PyObject_GetAttr(value, st->str_shape);
    dtype = shape == NULL ? NULL : PyObject_GetAttr(value, st->str_dtype);
    if (shape == NULL || dtype == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "Input '%U' must be a tensor of shape %R and dtype %R, got %.200s",
                     key, want_shape, want_dtype, Py_TYPE(value)->tp_name);
        goto done;
    }
    got = PySequence_Tuple(shape);
    if (got == NULL) {
        goto done;
    }
    if (want_shape != Py_None) {
        int eq = PyObject_RichCompareBool(got, want_shape, Py_EQ);
        if (eq < 0) {
            goto done;
        }
        if (!eq) {
            PyErr_Format(PyExc_ValueError,
                         "Shape mismatch for input '%U': expected %R, got %R",
                         key, want_shape, got);
            goto done;
        }
    }
    PyErr_Format(PyExc_TypeError,
                 "Dtype mismatch for input '%U': expected %R, got %R",
                 key, want_dtype, dtype);
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(got);
}

/* 1 when value fits slot s, 0 when it does not (no exception set), -1 with
 * an exception when the comparison itself failed. */
static int
fits_slot(ProgramObject *self, leapp_state *st, Py_ssize_t s, PyObject *value)
{
    PyObject *want_shape = PyTuple_GET_ITEM(self->shapes, s); /* borrowed */
    PyObject *want_dtype = PyTuple_GET_ITEM(self->dtypes, s); /* borrowed */
    PyObject *attr = NULL;
    int rc = 0;
    if (want_dtype != Py_None) {
        attr = PyObject_GetAttr(value, st->str_dtype);
        if (attr == NULL || attr != want_dtype) {
            PyErr_Clear();
            goto done;
        }
        Py_CLEAR(attr);
    }
    if (want_shape != Py_None) {
        attr = PyObject_GetAttr(value, st->str_shape);
        if (attr == NULL) {
            PyErr_Clear();
            goto done;
        }
        rc = PyObject_RichCompareBool(attr, want_shape, Py_EQ);
        goto done;
    }
    rc = 1;
done:
    Py_XDECREF(attr);
    return rc;
}

/* A new reference to what slot s stores for key: value itself when it
 * fits, else what the convert hook makes of it, checked again.  NULL with
 * an exception (the mismatch error) when neither fits. */
static PyObject *
fitted_input(ProgramObject *self, leapp_state *st, Py_ssize_t s, PyObject *key,
             PyObject *value)
{
    PyObject *converted = NULL, *result = NULL;
    int fits = fits_slot(self, st, s, value);
    if (fits == 0 && self->convert != Py_None) {
        converted = PyObject_CallFunctionObjArgs(self->convert, key, value, NULL);
        if (converted == NULL) {
            goto done;
        }
        value = converted; /* borrowed from converted from here on */
        fits = fits_slot(self, st, s, value);
    }
    if (fits > 0) {
        result = Py_NewRef(value);
    }
    else if (fits == 0) {
        input_mismatch(self, st, s, key, value);
    }
done:
    Py_XDECREF(converted);
    return result;
}

/* Raise the error for a key run() does not know. */
static void
unknown_input(ProgramObject *self, PyObject *key)
{
    Py_ssize_t slash;
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError,
                     "Input keys must be str 'node_name/input_name', got %R", key);
        return;
    }
    slash = PyUnicode_FindChar(key, '/', 0, PyUnicode_GET_LENGTH(key), 1);
    if (slash == -2) {
        return;
    }
    if (slash < 0 || PyUnicode_FindChar(key, '/', slash + 1,
                                        PyUnicode_GET_LENGTH(key), 1) >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "Invalid input key: %U\n Expected format: node_name/input_name",
                     key);
        return;
    }
    PyErr_Format(PyExc_KeyError,
                 "Unknown input key '%U': no node input has that name. "
                 "Graph inputs: %R", key, self->graph_inputs);
}

/* The slot of input key `key` (validated on every use: ids are only as good
 * as the dict they came from), or -1 with an exception. */
static Py_ssize_t
input_slot(ProgramObject *self, PyObject *key)
{
    /* borrowed from self->input_index; slot_index runs no Python code */
    PyObject *idx = PyDict_GetItemWithError(self->input_index, key);
    Py_ssize_t s = -1;
    if (idx != NULL) {
        s = program_slot_index(idx, self->nslots);
    }
    else if (!PyErr_Occurred()) {
        unknown_input(self, key);
    }
    return s;
}

/* Store the validated entries of inputs into their slots.  Every entry is
 * checked (and converted, replacing its value in inputs: the keys stay) before
 * any slot changes, so a bad input leaves the state as is.  inputs must be a
 * dict only this call holds: fitted_input runs Python code (attribute lookups,
 * shape comparison, the convert hook) while key and value are borrowed from it. */
static int
load_inputs(ProgramObject *self, leapp_state *st, PyObject *inputs)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value; /* borrowed from inputs */
    PyObject *fitted = NULL;
    Py_ssize_t s;
    int rc = -1;
    while (PyDict_Next(inputs, &pos, &key, &value)) {
        s = input_slot(self, key);
        if (s < 0 || (fitted = fitted_input(self, st, s, key, value)) == NULL) {
            goto done;
        }
        /* replacing the value of a present key is allowed while iterating */
        if (fitted != value && PyDict_SetItem(inputs, key, fitted) < 0) {
            goto done;
        }
        Py_CLEAR(fitted);
    }
    pos = 0;
    while (PyDict_Next(inputs, &pos, &key, &value)) {
        s = input_slot(self, key);
        if (s < 0) {
            goto done;
        }
        Py_XSETREF(self->slots[s], Py_NewRef(value));
    }
    rc = 0;
done:
    Py_XDECREF(fitted);
    return rc;
}

/* Call node i with its slot values and route its outputs. */
static int
run_node(ProgramObject *self, leapp_state *st, Py_ssize_t i)
{
    PyObject *small[SMALL_ARGS];
    PyObject **argv = small;
    PyObject *res = NULL, *seq = NULL;
    Py_ssize_t first = self->in_off[i], nargs = self->in_off[i + 1] - first;
    Py_ssize_t nout = self->out_off[i + 1] - self->out_off[i];
    Py_ssize_t k, j, d, got, filled = 0;
    int rc = -1;

    if (nargs > SMALL_ARGS) {
        argv = PyMem_New(PyObject *, nargs);
        if (argv == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    assert(i >= 0 && i < self->nnodes && nargs >= 0 && nout >= 0);
    for (k = 0; k < nargs; k++) {
        PyObject *v = self->slots[self->in_slot[first + k]]; /* borrowed */
        /* slot indices were checked against nslots when the Program was built */
        assert(self->in_slot[first + k] >= 0 && self->in_slot[first + k] < self->nslots);
        if (v == NULL) {
            PyErr_Format(PyExc_RuntimeError, "Node '%U': input %R has no value",
                         PyTuple_GET_ITEM(self->names, i),
                         PyTuple_GET_ITEM(self->slot_keys, self->in_slot[first + k]));
            goto done;
        }
        /* own the arguments: the call may replace slot values */
        argv[k] = Py_NewRef(v);
        filled = k + 1;
    }
    res = PyObject_Vectorcall(self->calls[i], argv, nargs, NULL);
    if (res == NULL) {
        goto done;
    }
    if (PyTuple_Check(res) || PyList_Check(res)) {
        /* a tuple: clone() and the destructors of replaced slot values run
         * Python code that could resize a list the node kept */
        seq = PyTuple_Check(res) ? Py_NewRef(res) : PyList_AsTuple(res);
        if (seq == NULL) {
            goto done;
        }
        got = PyTuple_GET_SIZE(seq);
        if (nout == 1 && got == 1) {
            /* a single output comes back as a 1-tuple from some backends */
            Py_SETREF(res, Py_NewRef(PyTuple_GET_ITEM(seq, 0)));
            Py_CLEAR(seq);
        }
        else if (nout == 1 && got != 1) {
            goto count_mismatch;
        }
    }
    else {
        got = 1;
    }
    if (seq == NULL && nout != 1) {
        goto count_mismatch;
    }
    if (seq != NULL && got != nout) {
        goto count_mismatch;
    }
    for (j = 0; j < nout; j++) {
        Py_ssize_t o = self->out_off[i] + j;
        /* borrowed from seq or res, which this call owns */
        PyObject *out = seq != NULL ? PyTuple_GET_ITEM(seq, j) : res;
        Py_ssize_t s0 = self->dst_slot[self->dst_off[o]];
        assert(self->dst_off[o] < self->dst_off[o + 1]); /* every output has a destination */
        assert(s0 >= 0 && s0 < self->nslots);
        Py_XSETREF(self->slots[s0], Py_NewRef(out));
        for (d = self->dst_off[o] + 1; d < self->dst_off[o + 1]; d++) {
            PyObject *copy = PyObject_CallMethodNoArgs(out, st->str_clone);
            if (copy == NULL) {
                goto done;
            }
            Py_XSETREF(self->slots[self->dst_slot[d]], copy); /* steals copy */
        }
    }
    rc = 0;
    goto done;
count_mismatch:
    PyErr_Format(PyExc_RuntimeError, "Node '%U': Expected %zd outputs, got %zd",
                 PyTuple_GET_ITEM(self->names, i), nout, got);
done:
    for (k = 0; k < filled; k++) {
        Py_DECREF(argv[k]);
    }
    if (argv != small) {
        PyMem_Free(argv);
    }
    Py_XDECREF(seq);
    Py_XDECREF(res);
    return rc;
}

PyDoc_STRVAR(program_run_doc,
"run(inputs) -> dict\n\n"
"One pipeline step: store the tensors of `inputs` (keys 'node/input'),\n"
"checked against their declared shape and dtype, run every node in order,\n"
"route its outputs and return {'node/output': tensor} for the graph outputs.");

static PyObject *
program_run(ProgramObject *self, PyObject *inputs)
{
    leapp_state *st = PyType_GetModuleState(Py_TYPE(self));
    PyObject *owned = NULL, *out = NULL;
    Py_ssize_t i;
    if (st == NULL) {
        goto error;
    }
    /* a private copy: load_inputs runs Python code while it iterates */
    if (PyDict_Check(inputs)) {
        owned = PyDict_Copy(inputs);
    }
    else {
        owned = PyDict_New();
        if (owned != NULL && PyDict_Update(owned, inputs) < 0) {
            Py_CLEAR(owned);
        }
    }
    if (owned == NULL) {
        goto error;
    }
    if (load_inputs(self, st, owned) < 0) {
        goto error;
    }
    for (i = 0; i < self->nnodes; i++) {
        if (run_node(self, st, i) < 0) {
            goto error;
        }
    }
    for (i = 0; i < self->ncommits; i++) {
        PyObject *v = self->slots[self->commit_from[i]]; /* reference moved */
        assert(self->commit_from[i] >= 0 && self->commit_from[i] < self->nslots);
        assert(self->commit_to[i] >= 0 && self->commit_to[i] < self->nslots);
        if (v != NULL) {
            self->slots[self->commit_from[i]] = NULL;
            Py_XSETREF(self->slots[self->commit_to[i]], v);
        }
    }
    out = PyDict_New();
    if (out == NULL) {
        goto error;
    }
    for (i = 0; i < self->nresults; i++) {
        PyObject *v = self->slots[self->result_slot[i]]; /* borrowed */
        assert(self->result_slot[i] >= 0 && self->result_slot[i] < self->nslots);
        if (PyDict_SetItem(out, self->result_keys[i], v != NULL ? v : Py_None) < 0) {
            goto error;
        }
    }
    goto done;
error:
    Py_CLEAR(out);
done:
    Py_XDECREF(owned);
    assert(leapp_result_ok(out));
    return out;
}

/* ---- slot access ------------------------------------------------------- */

static int
slot_arg(ProgramObject *self, PyObject *arg, Py_ssize_t *s)
{
    *s = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (*s == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*s < 0 || *s >= self->nslots) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range [0, %zd)",
                     *s, self->nslots);
        return -1;
    }
    return 0;
}

static PyObject *
program_get(ProgramObject *self, PyObject *arg)
{
    Py_ssize_t s;
    if (slot_arg(self, arg, &s) < 0) {
        return NULL;
    }
    return Py_NewRef(self->slots[s] != NULL ? self->slots[s] : Py_None);
}

static PyObject *
program_set(ProgramObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t s;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "set() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (slot_arg(self, args[0], &s) < 0) {
        return NULL;
    }
    if (args[1] == Py_None) {
        Py_CLEAR(self->slots[s]);
    }
    else {
        Py_XSETREF(self->slots[s], Py_NewRef(args[1]));
    }
    Py_RETURN_NONE;
}

static PyObject *
program_values(ProgramObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *t = PyTuple_New(self->nslots);
    Py_ssize_t i;
    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < self->nslots; i++) {
        PyObject *v = self->slots[i] != NULL ? self->slots[i] : Py_None;
        PyTuple_SET_ITEM(t, i, Py_NewRef(v)); /* steals the new reference */
    }
    return t;
}

static PyObject *
program_get_nslots(ProgramObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->nslots);
}

static PyObject *
program_get_names(ProgramObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->names);
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)program_run, METH_O, program_run_doc},
    {"get", (PyCFunction)program_get, METH_O, "get(slot): the value in a slot, or None."},
    {"set", (PyCFunction)(void (*)(void))program_set, METH_FASTCALL,
     "set(slot, value): store value (a reference) in a slot; None empties it."},
    {"values", (PyCFunction)program_values, METH_NOARGS,
     "values(): a tuple of every slot's value (None where empty)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef program_getset[] = {
    {"nslots", (getter)program_get_nslots, NULL, "Number of slots.", NULL},
    {"names", (getter)program_get_names, NULL, "Node names in run order.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(program_doc,
"Program(names, calls, inputs, noutputs, dests, results, commits, input_index,\n"
"        slot_keys, shapes, dtypes, graph_inputs, convert=None)\n\n"
"The per-step routing loop of InferenceManager, resolved into integer slots.");

static PyType_Slot program_slots[] = {
    {Py_tp_doc, (void *)program_doc},
    {Py_tp_new, program_new},
    {Py_tp_dealloc, program_dealloc},
    {Py_tp_traverse, program_traverse},
    {Py_tp_clear, program_clear},
    {Py_tp_methods, program_methods},
    {Py_tp_getset, program_getset},
    {0, NULL},
};

static PyType_Spec program_spec = {
    .name = "leapp._core.Program",
    .basicsize = sizeof(ProgramObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = program_slots,
};

int
runtime_init(PyObject *module, leapp_state *st)
{
    st->program_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &program_spec, NULL);
    if (st->program_type == NULL || PyModule_AddType(module, st->program_type) < 0) {
        return -1;
    }
    return 0;
}
