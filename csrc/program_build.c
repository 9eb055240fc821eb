/* program_build.c: building a Program from what InferenceManager resolved (the
 * constructor and its argument readers).  The Program's layout and the rest of
 * the type (run, slot access, the type slots) are in runtime.c.
 */
#include "leapp.h"

/* ---- construction helpers -------------------------------------------- */

/* Slot index from obj, checked against nslots; -1 with an exception. */
Py_ssize_t
program_slot_index(PyObject *obj, Py_ssize_t nslots)
{
    Py_ssize_t i = PyLong_AsSsize_t(obj);
    if (i == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (i < 0 || i >= nslots) {
        PyErr_Format(PyExc_ValueError, "slot index %zd out of range [0, %zd)",
                     i, nslots);
        return -1;
    }
    return i;
}

/* A private tuple of the items of obj (TypeError with `what` when obj is
 * not a sequence).  Unlike PySequence_Fast, a list argument is copied: the
 * callers run Python code (__iter__ of other items) while they read it, and
 * that code could otherwise resize or empty the caller's list under them. */
static PyObject *
fast_tuple(PyObject *obj, const char *what)
{
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq != NULL && PyList_Check(seq)) {
        Py_SETREF(seq, PyList_AsTuple(seq));
    }
    return seq;
}

/* Read a sequence of sequences of slot indices into a flat array with
 * offsets.  *off gets count + 1 entries, *flat the concatenation.  Returns
 * the number of inner sequences, or -1 with an exception.
 *
 * One pass: each inner sequence is converted once and read at once (reading
 * runs no Python code), and *flat grows to fit, so an inner object whose
 * __len__ and __iter__ disagree cannot overrun the buffer. */
static Py_ssize_t
read_groups(PyObject *groups, Py_ssize_t nslots, Py_ssize_t **off,
            Py_ssize_t **flat, const char *what)
{
    PyObject *outer = NULL, *inner = NULL;
    Py_ssize_t n, i, j, len, total = 0, cap = 0, count = -1;
    outer = fast_tuple(groups, what);
    if (outer == NULL) {
        goto done;
    }
    n = PyTuple_GET_SIZE(outer);
    *off = PyMem_New(Py_ssize_t, n + 1);
    if (*off == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        (*off)[i] = total;
        /* the item is borrowed from outer, a tuple only this function holds */
        inner = PySequence_Fast(PyTuple_GET_ITEM(outer, i), what);
        if (inner == NULL) {
            goto done;
        }
        len = PySequence_Fast_GET_SIZE(inner);
        if (len > PY_SSIZE_T_MAX - total) {
            PyErr_Format(PyExc_OverflowError, "%s: too many slots", what);
            goto done;
        }
        if (total + len > cap) {
            Py_ssize_t want = total + len > 2 * cap ? total + len : 2 * cap;
            Py_ssize_t *grown = *flat;
            PyMem_Resize(grown, Py_ssize_t, want > 0 ? want : 1);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done; /* *flat is still allocated; the caller frees it */
            }
            *flat = grown;
            cap = want;
        }
        for (j = 0; j < len; j++) {
            /* borrowed from inner; slot_index runs no Python code */
            Py_ssize_t s = program_slot_index(PySequence_Fast_GET_ITEM(inner, j), nslots);
            if (s < 0) {
                goto done;
            }
            (*flat)[total++] = s;
        }
        Py_CLEAR(inner);
    }
    if (*flat == NULL) {
        *flat = PyMem_New(Py_ssize_t, 1);
        if (*flat == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    (*off)[n] = total;
    count = n;
done:
    Py_XDECREF(inner);
    Py_XDECREF(outer);
    return count;
}

/* Read a sequence of 2-item sequences (a, b) into two arrays; the first
 * item is a slot index when first_is_slot, else any object kept in *objs.
 * Returns the count or -1 with an exception. */
static Py_ssize_t
read_pairs(PyObject *pairs, Py_ssize_t nslots, PyObject ***objs,
           Py_ssize_t **first, Py_ssize_t **second, const char *what)
{
    PyObject *seq = NULL;
    Py_ssize_t n = 0, i, count = -1;
    seq = fast_tuple(pairs, what);
    if (seq == NULL) {
        goto done;
    }
    n = PyTuple_GET_SIZE(seq);
    if (objs != NULL) {
        *objs = PyMem_New(PyObject *, n > 0 ? n : 1);
        if (*objs == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < n; i++) {
            (*objs)[i] = NULL;
        }
    }
    else {
        *first = PyMem_New(Py_ssize_t, n > 0 ? n : 1);
        if (*first == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    *second = PyMem_New(Py_ssize_t, n > 0 ? n : 1);
    if (*second == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(seq, i); /* borrowed from seq */
        PyObject *a, *b;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "%s: expected 2-tuples, got %R",
                         what, pair);
            goto done;
        }
        a = PyTuple_GET_ITEM(pair, 0); /* borrowed */
        b = PyTuple_GET_ITEM(pair, 1); /* borrowed */
        if (objs != NULL) {
            (*objs)[i] = Py_NewRef(a);
        }
        else if (((*first)[i] = program_slot_index(a, nslots)) < 0) {
            goto done;
        }
        if (((*second)[i] = program_slot_index(b, nslots)) < 0) {
            goto done;
        }
    }
    count = n;
done:
    if (count < 0 && objs != NULL && *objs != NULL) {
        /* the caller only owns the objects of a complete read; *objs has
         * n entries (NULL past the failing one) */
        for (i = 0; i < n; i++) {
            Py_CLEAR((*objs)[i]);
        }
    }
    Py_XDECREF(seq);
    return count;
}

static PyObject *
tuple_of(PyObject *obj, Py_ssize_t expected, const char *what)
{
    PyObject *t = PySequence_Tuple(obj);
    if (t != NULL && expected >= 0 && PyTuple_GET_SIZE(t) != expected) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd entries, got %zd",
                     what, expected, PyTuple_GET_SIZE(t));
        Py_CLEAR(t);
    }
    return t;
}

/* ---- the constructor's steps ---------------------------------------------
 * Each fills some fields of a zeroed Program and returns 0, or -1 with an
 * exception; what it filled before failing is freed by the type's dealloc. */

/* O& converter of `convert`: callable or None, stored borrowed (the caller's
 * argument tuple holds it for the constructor's whole run). */
static int
callable_or_none(PyObject *obj, void *out)
{
    if (obj != Py_None && !PyCallable_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "convert must be callable or None, got %R", obj);
        return 0;
    }
    *(PyObject **)out = obj;
    return 1;
}

/* The per-slot tables (keys, shapes, dtypes), the node names, the graph
 * input keys and the empty slots; sets nslots. */
static int
read_slot_tables(ProgramObject *self, PyObject *keys, PyObject *shapes, PyObject *dtypes,
                 PyObject *names, PyObject *ginputs)
{
    Py_ssize_t i;
    self->slot_keys = tuple_of(keys, -1, "slot_keys");
    if (self->slot_keys == NULL) {
        return -1;
    }
    self->nslots = PyTuple_GET_SIZE(self->slot_keys);
    self->shapes = tuple_of(shapes, self->nslots, "shapes");
    self->dtypes = tuple_of(dtypes, self->nslots, "dtypes");
    self->names = tuple_of(names, -1, "names");
    self->graph_inputs = PySequence_List(ginputs);
    if (self->shapes == NULL || self->dtypes == NULL || self->names == NULL
        || self->graph_inputs == NULL) {
        return -1;
    }
    self->slots = PyMem_New(PyObject *, self->nslots > 0 ? self->nslots : 1);
    if (self->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < self->nslots; i++) {
        self->slots[i] = NULL;
    }
    return 0;
}

/* input_index: a private copy (the caller may change its dict after
 * construction), its keys str and its values slot indices. */
static int
read_input_index(ProgramObject *self, PyObject *index)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v; /* borrowed from self->input_index */
    self->input_index = PyDict_Copy(index);
    if (self->input_index == NULL) {
        return -1;
    }
    while (PyDict_Next(self->input_index, &pos, &k, &v)) {
        if (!PyUnicode_Check(k)) {
            PyErr_Format(PyExc_TypeError, "input_index keys must be str, got %R", k);
            return -1;
        }
        if (program_slot_index(v, self->nslots) < 0) {
            return -1;
        }
    }
    return 0;
}

/* One callable per node name; sets nnodes as each is stored. */
static int
read_calls(ProgramObject *self, PyObject *calls)
{
    Py_ssize_t i, n;
    int status = -1;
    PyObject *seq = PySequence_Fast(calls, "calls must be a sequence");
    if (seq == NULL) {
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n != PyTuple_GET_SIZE(self->names)) {
        PyErr_Format(PyExc_ValueError, "calls: expected %zd entries, got %zd",
                     PyTuple_GET_SIZE(self->names), n);
        goto done;
    }
    self->calls = PyMem_New(PyObject *, n > 0 ? n : 1);
    if (self->calls == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(seq, i); /* borrowed from seq */
        if (!PyCallable_Check(c)) {
            PyErr_Format(PyExc_TypeError, "node %R: %R is not callable",
                         PyTuple_GET_ITEM(self->names, i), c);
            goto done;
        }
        self->calls[i] = Py_NewRef(c);
        self->nnodes = i + 1; /* traverse/clear see only filled entries */
    }
    status = 0;
done:
    Py_DECREF(seq);
    return status;
}

/* Each node's argument slots (in_off, in_slot), one group per node. */
static int
read_arguments(ProgramObject *self, PyObject *inputs)
{
    Py_ssize_t n = self->nnodes;
    if (read_groups(inputs, self->nslots, &self->in_off, &self->in_slot,
                    "inputs must be a sequence of slot sequences") != n) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "inputs: expected %zd entries", n);
        }
        return -1;
    }
    return 0;
}

/* The output counts per node as offsets (out_off); the total output count,
 * or -1 with an exception. */
static Py_ssize_t
read_output_counts(ProgramObject *self, PyObject *noutputs)
{
    Py_ssize_t i, n = self->nnodes, total = 0, result = -1;
    PyObject *counts = PySequence_Fast(noutputs, "noutputs must be a sequence");
    if (counts == NULL) {
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(counts) != n) {
        PyErr_Format(PyExc_ValueError, "noutputs: expected %zd entries", n);
        goto done;
    }
    self->out_off = PyMem_New(Py_ssize_t, n + 1);
    if (self->out_off == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        /* the item is borrowed from counts */
        Py_ssize_t c = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(counts, i));
        if (c < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "noutputs must be >= 0");
            }
            goto done;
        }
        if (c > PY_SSIZE_T_MAX - total) {
            PyErr_SetString(PyExc_OverflowError, "noutputs: total output count too large");
            goto done;
        }
        self->out_off[i] = total;
        total += c;
    }
    self->out_off[n] = total;
    result = total;
done:
    Py_DECREF(counts);
    return result;
}

/* The destination slots of each of the total outputs (dst_off, dst_slot):
 * at least one each. */
static int
read_destinations(ProgramObject *self, PyObject *dests, Py_ssize_t total)
{
    Py_ssize_t i;
    if (read_groups(dests, self->nslots, &self->dst_off, &self->dst_slot,
                    "dests must be a sequence of slot sequences") != total) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "dests: expected %zd entries", total);
        }
        return -1;
    }
    for (i = 0; i < total; i++) {
        if (self->dst_off[i + 1] == self->dst_off[i]) {
            PyErr_Format(PyExc_ValueError, "dests: output %zd has no destination", i);
            return -1;
        }
    }
    return 0;
}

/* The graph outputs (key, slot) and the staged feedback moves (from, to). */
static int
read_results_and_commits(ProgramObject *self, PyObject *results, PyObject *commits)
{
    self->nresults = read_pairs(results, self->nslots, &self->result_keys, NULL,
                                &self->result_slot, "results");
    if (self->nresults < 0) {
        self->nresults = 0;
        return -1;
    }
    self->ncommits = read_pairs(commits, self->nslots, NULL, &self->commit_from,
                                &self->commit_to, "commits");
    if (self->ncommits < 0) {
        self->ncommits = 0;
        return -1;
    }
    return 0;
}

/* Program(names, calls, inputs, noutputs, dests, results, commits,
 *         input_index, slot_keys, shapes, dtypes, graph_inputs, convert=None)
 *
 *   names        node names in run order (for errors)
 *   calls        one callable per node, run order
 *   inputs       per node: the slots passed as its arguments, in order
 *   noutputs     per node: how many outputs it returns
 *   dests        per output of every node (node order, then output order):
 *                its destination slots; the first gets the tensor itself
 *   results      (key, slot) per graph output, in result order
 *   commits      (staging slot, target slot) moved after the last node
 *   input_index  dict "node/input" -> slot accepted by run()
 *   slot_keys    a readable name per slot; its length is the slot count
 *   shapes       per slot: the expected shape tuple, or None (no check)
 *   dtypes       per slot: the expected dtype object, or None (no check)
 *   graph_inputs the graph input keys, listed in unknown-key errors
 *   convert      None, or convert(key, value) -> value, called by run() for
 *                an input value that does not fit its slot; what it returns
 *                is checked again (returning value unchanged keeps the error)
 */
PyObject *
program_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"names", "calls", "inputs", "noutputs", "dests",
                             "results", "commits", "input_index", "slot_keys",
                             "shapes", "dtypes", "graph_inputs", "convert", NULL};
    /* all borrowed from args / kwds, which the caller holds during the call */
    PyObject *names, *calls, *inputs, *noutputs, *dests, *results, *commits;
    PyObject *index, *keys, *shapes, *dtypes, *ginputs, *convert = Py_None;
    ProgramObject *self = NULL;
    PyObject *result = NULL;
    Py_ssize_t total;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOO!OOOO|O&:Program", kwlist,
                                     &names, &calls, &inputs, &noutputs, &dests,
                                     &results, &commits, &PyDict_Type, &index,
                                     &keys, &shapes, &dtypes, &ginputs,
                                     callable_or_none, &convert)) {
        goto done;
    }
    self = (ProgramObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        goto done;
    }
    /* tp_alloc zeroed every field: on error the dealloc frees partial state. */
    self->convert = Py_NewRef(convert);
    if (read_slot_tables(self, keys, shapes, dtypes, names, ginputs) < 0
        || read_input_index(self, index) < 0
        || read_calls(self, calls) < 0
        || read_arguments(self, inputs) < 0
        || (total = read_output_counts(self, noutputs)) < 0
        || read_destinations(self, dests, total) < 0
        || read_results_and_commits(self, results, commits) < 0) {
        goto done;
    }
    result = (PyObject *)self;
    self = NULL;
done:
    Py_XDECREF(self);
    return result;
}
