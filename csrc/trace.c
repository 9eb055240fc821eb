/* trace.c: the per-op __torch_function__ handler of TracedTensor.
 *
 * One walk over args and kwargs replaces every traced argument of the
 * tracing node by Ref(value id) and finds the node; the op then runs eagerly
 * on the real tensors (torch function dispatch disabled for subclasses), is
 * appended to the node's op log, and its tensor results are made traced
 * values of the node.  Ops on values of finished nodes run eagerly and give
 * plain tensors, except the equivalent copies that keep the published port;
 * while a session runs, a tensor computed there from a published value is
 * tagged with where it came from (trace_inactive), never with a carrier.
 */
#include "leapp.h"


/* Upstream's message (the two node names as a sorted set), then which op
 * mixed them and how to fix it. */
static int
raise_mixed(trace_walk *w, NodeObject *other)
{
    PyObject *fname = leapp_func_name(w->func);
    PyObject *lo = w->active->name, *hi = other->name; /* borrowed */
    int order;
    if (fname == NULL) {
        goto done;
    }
    order = PyObject_RichCompareBool(lo, hi, Py_GT);
    if (order < 0) {
        goto done;
    }
    if (order) {
        lo = other->name;
        hi = w->active->name;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "Error: detected multiple TracedTensor contexts: {%R, %R} inside of a traced "
                 "function.\n\nThis happens when you mix multiple active TracedTensors from "
                 "different contexts inside of a traced function/block. solutions:\n\n"
                 "1. call output_tensors() to finalize one of the nodes first\n"
                 "2. combine both nodes into a single node by calling input_tensors() with the "
                 "same node name\n\nIn op '%S', nodes '%U' and '%U' are both tracing. Cannot "
                 "mix multiple active TracedTensors from different contexts. Finish node '%U' "
                 "with annotate.output_tensors() and declare its result with "
                 "annotate.input_tensors('%U', ...) before using it there.",
                 lo, hi, fname, w->active->name, other->name, other->name, w->active->name);
done:
    Py_XDECREF(fname);
    return -1;
}

static PyObject *template_of_container(trace_walk *w, PyObject *obj);

/* The template of obj: obj with every value of the tracing node replaced by
 * a Ref; containers are rebuilt, everything else is kept as is (tensors from
 * outside the node become constants when the node is turned into a graph). */
static PyObject *
template_of(trace_walk *w, PyObject *obj)
{
    leapp_state *st = w->st;
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == (PyTypeObject *)st->traced_type) {
        CarrierObject *c = carrier_of(st, obj); /* borrowed */
        if (c == NULL) {
            return Py_NewRef(obj);
        }
        assert(c->node != NULL && Py_IS_TYPE(c->node, st->node_type)); /* strong, a Node */
        if (w->first == NULL) {
            w->first = (CarrierObject *)Py_NewRef(c); /* released by torch_function */
        }
        if (((NodeObject *)c->node)->state == NODE_TAIL) {
            /* Only the tail node's internal values are recorded, and only by
             * an op no open node takes part in; otherwise they are constants. */
            if (c->port != NULL || c->declared
                || (w->active != NULL && w->active != (NodeObject *)c->node)) {
                return Py_NewRef(obj);
            }
        }
        else if (((NodeObject *)c->node)->state != NODE_OPEN) {
            return Py_NewRef(obj);
        }
        if (w->active == NULL) {
            w->active = (NodeObject *)Py_NewRef(c->node); /* released by torch_function */
        }
        else if (w->active != (NodeObject *)c->node) {
            if (w->active->state != NODE_TAIL) {
                raise_mixed(w, (NodeObject *)c->node);
                return NULL;
            }
            /* The open node records the op; the walk starts again from it. */
            Py_SETREF(w->active, (NodeObject *)Py_NewRef(c->node));
            w->retry = 1;
        }
        assert(c->vid >= 0 && c->vid < w->active->nvalues); /* a value the node handed out */
        w->dynamic |= c->dynamic;
        return ref_new(st, REF_VALUE, c->vid);
    }
    if (tp == &PyTuple_Type || tp == &PyList_Type || tp == &PyDict_Type) {
        PyObject *out;
        if (Py_EnterRecursiveCall(" while tracing an op's arguments")) {
            return NULL;
        }
        out = template_of_container(w, obj);
        Py_LeaveRecursiveCall();
        return out;
    }
    return Py_NewRef(obj);
}

/* template_of for an exact tuple, list or dict: a rebuilt container. */
static PyObject *
template_of_container(trace_walk *w, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == &PyTuple_Type || tp == &PyList_Type) {
        Py_ssize_t i, n = PySequence_Fast_GET_SIZE(obj);
        PyObject *out = tp == &PyTuple_Type ? PyTuple_New(n) : PyList_New(n);
        if (out == NULL) {
            return NULL;
        }
        for (i = 0; i < n; i++) {
            PyObject *item = template_of(w, PySequence_Fast_GET_ITEM(obj, i));
            if (item == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            if (tp == &PyTuple_Type) {
                PyTuple_SET_ITEM(out, i, item); /* steals item */
            }
            else {
                PyList_SET_ITEM(out, i, item); /* steals item */
            }
        }
        return out;
    }
    {
        Py_ssize_t pos = 0;
        PyObject *key, *value, *out = PyDict_New();
        if (out == NULL) {
            return NULL;
        }
        while (PyDict_Next(obj, &pos, &key, &value)) {
            PyObject *item = template_of(w, value);
            if (item == NULL || PyDict_SetItem(out, key, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
        return out;
    }
}

static int
op_kind(leapp_state *st, PyObject *func)
{
    PyObject *found = PyDict_GetItemWithError(st->op_kinds, func); /* borrowed */
    PyObject *kind = NULL, *cached = NULL;
    long k = -1;
    if (found != NULL) {
        k = PyLong_AsLong(found);
        /* cached values are checked ints */
        assert(k >= 0 && (k & OP_KIND_MASK) <= OP_LAST && (k & ~(OP_KIND_MASK | OP_RANDOM)) == 0);
        return (int)k;
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    kind = PyObject_CallOneArg(st->classify, func);
    if (kind == NULL) {
        goto done;
    }
    k = PyLong_AsLong(kind);
    if (k == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (k < OP_PLAIN || (k & OP_KIND_MASK) > OP_LAST || (k & ~(OP_KIND_MASK | OP_RANDOM))) {
        PyErr_Format(PyExc_ValueError, "classify() gave an unknown op kind %ld", k);
        k = -1;
        goto done;
    }
    cached = PyLong_FromLong(k);
    if (cached == NULL || PyDict_SetItem(st->op_kinds, func, cached) < 0) {
        k = -1;
    }
done:
    Py_XDECREF(cached);
    Py_XDECREF(kind);
    return (int)k;
}

int
trace_is_tensor(leapp_state *st, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    return tp == (PyTypeObject *)st->tensor_type || tp == (PyTypeObject *)st->traced_type
           || PyType_IsSubtype(tp, (PyTypeObject *)st->tensor_type);
}

/* Make the tensor result r the value vid of node; written: r is a tensor
 * the op wrote into (in place, out=), not one it made. */
static int
bind_result(leapp_state *st, NodeObject *node, PyObject *r, Py_ssize_t vid, int written)
{
    CarrierObject *c = carrier_of(st, r); /* borrowed */
    assert(node->state != NODE_DONE && vid >= 0 && vid < node->nvalues);
    if (c != NULL && c->node == (PyObject *)node) {
        c->vid = vid; /* an op that returned (or mutated) its receiver */
        return 0;
    }
    if (carrier_promote(st, r) < 0) {
        return -1;
    }
    /* A result is not remembered for stop(): a weakref per op would be most
     * of the op's garbage; the outputs a node publishes are remembered when it
     * finishes.  A written tensor is the caller's: stop() makes it plain. */
    return written ? carrier_attach(st, r, (PyObject *)node, vid, NULL, 0)
                   : carrier_attach_value(st, r, (PyObject *)node, vid, NULL, 0);
}

/* The out field of the record for result r, binding its tensors; Py_None
 * when r holds no tensor (sizes, item(), bools are plain Python values). */
static PyObject *
bind_results(leapp_state *st, NodeObject *node, PyObject *r)
{
    if (trace_is_tensor(st, r)) {
        Py_ssize_t vid = node->nvalues++;
        if (bind_result(st, node, r, vid, 0) < 0) {
            return NULL;
        }
        return PyLong_FromSsize_t(vid);
    }
    if (PyTuple_Check(r) || PyList_Check(r)) {
        Py_ssize_t i, n = PySequence_Fast_GET_SIZE(r);
        int any = 0;
        PyObject *out = PyTuple_New(n);
        if (out == NULL) {
            return NULL;
        }
        for (i = 0; i < n; i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(r, i); /* borrowed */
            PyObject *slot;
            if (trace_is_tensor(st, item)) {
                Py_ssize_t vid = node->nvalues++;
                if (bind_result(st, node, item, vid, 0) < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
                slot = PyLong_FromSsize_t(vid);
                any = 1;
            }
            else {
                slot = Py_NewRef(Py_None);
            }
            if (slot == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyTuple_SET_ITEM(out, i, slot); /* steals slot */
        }
        if (!any) {
            Py_DECREF(out);
            return Py_NewRef(Py_None);
        }
        return out;
    }
    return Py_NewRef(Py_None);
}

PyObject *
trace_run_eager(leapp_state *st, PyObject *func, PyObject *types, PyObject *args, PyObject *kwargs)
{
    PyObject *call[4] = {func, types, args, kwargs == Py_None ? st->empty_kwargs : kwargs};
    return PyObject_Vectorcall(st->run_disabled, call, 4, NULL);
}

/* Alias provenance: a result that may be a view of the receiver joins the
 * receiver's alias group, and an in-place write on a value with aliases is
 * carried onto them (leapp.tracing.alias).  Only view-like ops and writes on values
 * that have a group leave C. */
static int
follow_aliases(leapp_state *st, NodeObject *node, int kind, PyObject *func,
               PyObject *receiver, PyObject *result)
{
    CarrierObject *c;                 /* borrowed from receiver's dict */
    PyObject *hook = NULL, *done = NULL;
    if (kind == OP_PLAIN || st->alias_link == NULL) {
        return 0;                     /* the common op: no view, no write */
    }
    c = carrier_of(st, receiver);
    if (c == NULL || c->node != (PyObject *)node) {
        return 0;
    }
    if (kind == OP_INPLACE || kind == OP_OVERWRITE) {
        if (c->group == NULL) {
            return 0;
        }
        hook = st->alias_write;
        done = PyObject_CallFunctionObjArgs(hook, receiver, func, NULL);
    }
    else if ((kind == OP_VIEW || kind == OP_COPY || kind == OP_TO) && result != receiver) {
        hook = st->alias_link;
        done = PyObject_CallFunctionObjArgs(hook, receiver, result, NULL);
    }
    else {
        return 0;
    }
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    return 0;
}

/* The tensor given as out= to a torch function (torch.add(a, b, out=c)),
 * borrowed, or NULL when there is none (no exception set). */
static PyObject *
out_target(leapp_state *st, PyObject *kwargs)
{
    PyObject *target;                 /* borrowed from kwargs */
    if (kwargs == NULL || kwargs == Py_None || PyDict_GET_SIZE(kwargs) == 0) {
        return NULL;
    }
    target = PyDict_GetItemWithError(kwargs, st->str_out);
    if (target == NULL) {
        PyErr_Clear();                /* only this lookup's error: no out= */
        return NULL;
    }
    return trace_is_tensor(st, target) ? target : NULL;
}

/* 1 when key (of x[key]) holds a boolean tensor (a mask: the result's shape
 * depends on its values), 0 when not, -1 on error. */
static int
is_mask_key(leapp_state *st, PyObject *key)
{
    PyObject *dtype;
    int found = 0;
    if (PyTuple_Check(key)) {
        Py_ssize_t i, n = PyTuple_GET_SIZE(key);
        for (i = 0; i < n && found == 0; i++) {
            found = is_mask_key(st, PyTuple_GET_ITEM(key, i));
        }
        return found;
    }
    if (st->bool_dtype == NULL || !trace_is_tensor(st, key)) {
        return 0;
    }
    dtype = PyObject_GetAttr(key, st->str_dtype);
    if (dtype == NULL) {
        return -1;
    }
    found = dtype == st->bool_dtype;
    Py_DECREF(dtype);
    return found;
}

/* Flag the traced results in r (a tensor, or a tuple or list of them) as
 * values whose shape depends on data. */
static void
mark_dynamic(leapp_state *st, PyObject *r)
{
    CarrierObject *c;                 /* borrowed */
    if (PyTuple_Check(r) || PyList_Check(r)) {
        Py_ssize_t i, n = PySequence_Fast_GET_SIZE(r);
        for (i = 0; i < n; i++) {
            mark_dynamic(st, PySequence_Fast_GET_ITEM(r, i));
        }
        return;
    }
    c = carrier_of(st, r);
    if (c != NULL) {
        c->dynamic = 1;
    }
}

/* An op whose results' shape may depend on the values (OP_DYNAMIC, an index
 * with a boolean tensor) ran in node: the shape hook (leapp.tracing.guards)
 * takes it as a guard where the data decided it.  1 when the results' shape
 * depends on data, 0 when not, -1 with an exception (a refused guard).  A
 * node in its tail keeps no guards: its results are flagged as before. */
static int
shape_read(leapp_state *st, NodeObject *node, PyObject *func, PyObject *args,
           PyObject *kwargs, PyObject *result)
{
    PyObject *seen;
    int dynamic;
    if (st->shape_guard == NULL || node->state == NODE_TAIL) {
        return 1;
    }
    {
        PyObject *call[5] = {(PyObject *)node, func, args, kwargs, result};
        seen = PyObject_Vectorcall(st->shape_guard, call, 5, NULL);
    }
    if (seen == NULL) {
        return -1;
    }
    dynamic = PyObject_IsTrue(seen);
    Py_DECREF(seen);
    return dynamic;
}

/* A traced value read into Python (kind OP_CONVERSION; OP_SIZE of a value
 * whose shape depends on data): the op runs eagerly, nothing is recorded
 * (the result is a Python value), and the guard hook sees the value. */
static PyObject *
trace_conversion(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
                 PyObject *args, PyObject *kwargs)
{
    PyObject *result = trace_run_eager(st, func, types, args, kwargs);
    PyObject *seen = NULL;
    if (result == NULL || st->guard == NULL || PyTuple_GET_SIZE(args) == 0
        || (kind == OP_SIZE && !w->dynamic)) {
        return result;
    }
    {
        PyObject *call[4] = {(PyObject *)w->active, func, PyTuple_GET_ITEM(args, 0), result};
        seen = PyObject_Vectorcall(st->guard, call, 4, NULL);
    }
    if (seen == NULL) {
        Py_CLEAR(result);
    }
    Py_XDECREF(seen);
    return result;
}

/* Record an op of the tracing node and bind its results. */
static PyObject *
trace_active(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
             PyObject *args, PyObject *kwargs, PyObject *targs, PyObject *tkwargs)
{
    NodeObject *node = w->active;
    PyObject *rewritten = NULL, *result = NULL, *out = NULL, *record = NULL;
    PyObject *rfunc = func;                   /* borrowed */
    PyObject *receiver = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : NULL;
    PyObject *into = (kind == OP_INPLACE || kind == OP_OVERWRITE) ? NULL
                         : out_target(st, kwargs); /* borrowed */
    assert(node != NULL && node->state != NODE_DONE && targs != NULL);
    if (into != NULL) {
        /* out=: a write into that tensor, recorded functionally like an
         * in-place op (rewrite() drops the keyword). */
        kind = OP_INPLACE;
        receiver = into;
    }
    Py_INCREF(targs);
    Py_XINCREF(tkwargs);
    if (kind == OP_INPLACE || kind == OP_OVERWRITE) {
        /* Rewritten before the op runs: the functional form may need a
         * snapshot of a plain receiver's value. */
        PyObject *call[3] = {func, args, kwargs};
        rewritten = PyObject_Vectorcall(st->rewrite, call, 3, NULL);
        if (rewritten == NULL) {
            goto error;
        }
        if (!PyTuple_Check(rewritten) || PyTuple_GET_SIZE(rewritten) != 3) {
            PyErr_SetString(PyExc_TypeError, "rewrite() must return (func, args, kwargs)");
            goto error;
        }
        rfunc = PyTuple_GET_ITEM(rewritten, 0);
        Py_SETREF(targs, template_of(w, PyTuple_GET_ITEM(rewritten, 1)));
        if (targs == NULL) {
            goto error;
        }
        Py_XSETREF(tkwargs, template_of(w, PyTuple_GET_ITEM(rewritten, 2)));
        if (tkwargs == NULL) {
            goto error;
        }
    }
    result = trace_run_eager(st, func, types, args, kwargs);
    if (result == NULL) {
        goto error;
    }
    if ((kind == OP_INPLACE || kind == OP_OVERWRITE) && receiver != NULL
        && trace_is_tensor(st, receiver)) {
        Py_ssize_t vid = node->nvalues++;
        if (bind_result(st, node, receiver, vid, 1) < 0) {
            goto error;
        }
        out = PyLong_FromSsize_t(vid);
    }
    else {
        out = bind_results(st, node, result);
    }
    if (out == NULL) {
        goto error;
    }
    if (out != Py_None) {
        PyObject *kw = (tkwargs == NULL || (PyDict_Check(tkwargs) && PyDict_GET_SIZE(tkwargs) == 0))
                           ? Py_None : tkwargs;
        assert(PyTuple_Check(targs) && (kw == Py_None || PyDict_Check(kw)));
        record = PyTuple_Pack(4, rfunc, targs, kw, out);
        if (record == NULL || PyList_Append(node->ops, record) < 0) {
            goto error;
        }
        if (receiver != NULL && follow_aliases(st, node, kind, func, receiver, result) < 0) {
            goto error;
        }
        if (kind != OP_INPLACE && kind != OP_OVERWRITE) {
            int shaped = kind == OP_DYNAMIC, dynamic;
            if (kind == OP_VIEW && func == st->getitem && PyTuple_GET_SIZE(args) == 2) {
                shaped = is_mask_key(st, PyTuple_GET_ITEM(args, 1));
                if (shaped < 0) {
                    goto error;
                }
            }
            dynamic = shaped ? shape_read(st, node, func, args, kwargs, result) : 0;
            if (dynamic < 0) {
                goto error;
            }
            if (dynamic || w->dynamic) {
                mark_dynamic(st, result);
            }
        }
    }
    goto done;
error:
    Py_CLEAR(result);
done:
    Py_XDECREF(record);
    Py_XDECREF(out);
    Py_XDECREF(rewritten);
    Py_XDECREF(targs);
    Py_XDECREF(tkwargs);
    assert(leapp_result_ok(result));
    return result;
}


/* An op from a thread that does not own the session.  It may read values of
 * finished nodes (eagerly, plain results, the session untouched); an op on a
 * value of a node still tracing, or an in-place write on any traced value, is
 * refused: recorded, it would interleave with the owner's op log, and not
 * recorded, its result would be baked into the graph as a constant. */
static PyObject *
trace_foreign(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
              PyObject *args, PyObject *kwargs)
{
    PyObject *name, *what = NULL;
    if (w->active == NULL
        && (w->first == NULL || (kind != OP_INPLACE && kind != OP_OVERWRITE))) {
        return trace_run_eager(st, func, types, args, kwargs);
    }
    name = leapp_func_name(func);
    if (name == NULL) {
        goto done;
    }
    what = w->active != NULL
               ? PyUnicode_FromFormat("the torch op '%S' on a traced value of node '%U'", name,
                                      w->active->name)
               : PyUnicode_FromFormat("the torch op '%S' (an in-place write on a traced value)",
                                      name);
    if (what != NULL) {
        (void)leapp_refuse_thread(st, what);
    }
done:
    Py_XDECREF(what);
    Py_XDECREF(name);
    return NULL;
}

/* Ops of the tracing node that leave C first: a random op is noted on the
 * node (leapp.tracing.ops.note_random: validation names it) and then recorded as usual; a
 * TorchScript callable (OP_SCRIPTED) is run by the facade's hook, op by op
 * through this handler, and is not recorded itself. */
static PyObject *
trace_hooked(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types,
             PyObject *args, PyObject *kwargs, PyObject *targs, PyObject *tkwargs)
{
    PyObject *done;
    if ((kind & OP_RANDOM) && st->note_random != NULL) {
        PyObject *call[4] = {(PyObject *)w->active, func, args, kwargs};
        done = PyObject_Vectorcall(st->note_random, call, 4, NULL);
        if (done == NULL) {
            return NULL;
        }
        Py_DECREF(done);
    }
    kind &= OP_KIND_MASK;
    if (kind == OP_SCRIPTED && st->script_call != NULL) {
        PyObject *call[3] = {func, args, kwargs};
        return PyObject_Vectorcall(st->script_call, call, 3, NULL);
    }
    return trace_active(st, w, kind, func, types, args, kwargs, targs, tkwargs);
}

/* The templates of args and kwargs (kwargs: a dict or Py_None, whose template
 * stays NULL) in *targs and *tkwargs, new references; -1 with an exception, the
 * caller releasing whatever was set. */
static int
walk_args(trace_walk *w, PyObject *args, PyObject *kwargs, PyObject **targs,
          PyObject **tkwargs)
{
    *targs = template_of(w, args);
    if (*targs == NULL) {
        return -1;
    }
    if (kwargs != Py_None) {
        *tkwargs = template_of(w, kwargs);
        if (*tkwargs == NULL) {
            return -1;
        }
    }
    return 0;
}

/* torch_function(cls, func, types, args=(), kwargs=None): bound as the
 * classmethod TracedTensor.__torch_function__ by the facade. */
static PyObject *
torch_function(PyObject *module, PyObject *const *argv, Py_ssize_t nargs)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *func, *types, *args, *kwargs, *targs = NULL, *tkwargs = NULL, *result = NULL;
    trace_walk w = {st, NULL, NULL, NULL, 0, 0};
    int kind, base;
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "__torch_function__(func, types, args=(), kwargs=None)");
        return NULL;
    }
    func = argv[1];
    types = argv[2];
    args = nargs > 3 ? argv[3] : NULL;
    kwargs = nargs > 4 ? argv[4] : Py_None;
    if (args == NULL || !PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "__torch_function__: args must be a tuple");
        return NULL;
    }
    if (kwargs != Py_None && !PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "__torch_function__: kwargs must be a dict or None");
        return NULL;
    }
    if (st->run_disabled == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "leapp._core is not bound to torch yet");
        return NULL;
    }
    w.func = func;
    if (!st->tracing) {
        return trace_run_eager(st, func, types, args, kwargs);
    }
    if (walk_args(&w, args, kwargs, &targs, &tkwargs) < 0) {
        goto done;
    }
    if (w.retry) {
        /* w.active is now the open node: the tail node's values become constants */
        Py_CLEAR(targs);
        Py_CLEAR(tkwargs);
        w.dynamic = 0;
        if (walk_args(&w, args, kwargs, &targs, &tkwargs) < 0) {
            goto done;
        }
    }
    kind = op_kind(st, func);
    if (kind < 0) {
        goto done;
    }
    base = kind & OP_KIND_MASK;
    if (PyThread_get_thread_ident() != st->owner) {
        result = trace_foreign(st, &w, base, func, types, args, kwargs);
    }
    else if (w.active != NULL && w.active->state == NODE_TAIL
             && (base == OP_CONVERSION || base == OP_SIZE)) {
        /* a tail value read into Python: no guard, the node's pass is over */
        result = trace_run_eager(st, func, types, args, kwargs);
    }
    else if (w.active != NULL && w.active->state == NODE_TAIL && base != OP_SCRIPTED) {
        result = trace_active(st, &w, base, func, types, args, kwargs, targs, tkwargs);
    }
    else if (w.active != NULL && ((kind & OP_RANDOM) != 0 || base == OP_SCRIPTED)) {
        result = trace_hooked(st, &w, kind, func, types, args, kwargs, targs, tkwargs);
    }
    else if (w.active != NULL && (base == OP_CONVERSION || base == OP_SIZE)) {
        result = trace_conversion(st, &w, base, func, types, args, kwargs);
    }
    else if (w.active != NULL) {
        result = trace_active(st, &w, base, func, types, args, kwargs, targs, tkwargs);
    }
    else {
        result = trace_inactive(st, &w, base, func, types, args, kwargs);
    }
done:
    /* the walk's node and carrier are released here, whichever path ran */
    Py_XDECREF(w.active);
    Py_XDECREF(w.first);
    Py_XDECREF(targs);
    Py_XDECREF(tkwargs);
    assert(leapp_result_ok(result));
    return result;
}

/* _bind_guards(hook, shape_hook, getitem, bool_dtype): the guard hooks
 * (leapp.tracing.guards), called only for conversions of traced values into
 * Python and for ops whose results' shape may depend on the values, and the
 * two torch objects that tell a boolean-mask index. */
static PyObject *
bind_guards(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *hook, *shape_hook, *getitem, *bool_dtype;
    if (!PyArg_ParseTuple(args, "OOOO:_bind_guards", &hook, &shape_hook, &getitem,
                          &bool_dtype)) {
        return NULL;
    }
    if (!PyCallable_Check(hook) || !PyCallable_Check(shape_hook)) {
        PyErr_SetString(PyExc_TypeError, "_bind_guards() expects callable hooks");
        return NULL;
    }
    Py_XSETREF(st->guard, Py_NewRef(hook));
    Py_XSETREF(st->shape_guard, Py_NewRef(shape_hook));
    Py_XSETREF(st->getitem, Py_NewRef(getitem));
    Py_XSETREF(st->bool_dtype, Py_NewRef(bool_dtype));
    Py_RETURN_NONE;
}

static PyMethodDef trace_functions[] = {
    {"_bind_guards", bind_guards, METH_VARARGS,
     "Hand over the guard hooks, torch.Tensor.__getitem__ and torch.bool."},
    {"torch_function", (PyCFunction)(void (*)(void))torch_function, METH_FASTCALL,
     "The __torch_function__ of TracedTensor: run eagerly, record, tag results."},
    {NULL, NULL, 0, NULL},
};

int
trace_init(PyObject *module, leapp_state *st)
{
    (void)st;
    return PyModule_AddFunctions(module, trace_functions);
}
