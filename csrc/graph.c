/* graph.c: the pipeline of finished nodes.
 *
 * Every input port that received a published value names its producer
 * (src_node, src_port).  An edge is forward (data_flow) when the producer
 * finished before the consumer and feedback (feedback_flow) otherwise,
 * self-loops and declared state included.  Unconnected inputs are graph
 * inputs; outputs no edge consumes are graph outputs.
 *
 * The exporters' port renames are applied on the way (the nodes are read,
 * never written): two mappings "node/port" -> final name, one per side; an
 * input mapped to None was dropped by its exporter and takes no part.
 */
#include "leapp.h"

static PyObject *
joined(PyObject *node_name, PyObject *port_name)
{
    return PyUnicode_FromFormat("%U/%U", node_name, port_name);
}

/* The final name of a port (a new reference): renames["node/port"], or
 * port_name itself when it has no entry (or renames is None); Py_None for a
 * dropped input (only when may_drop: an output's name goes into formats and
 * keys, so None there is a TypeError); NULL with an exception set. */
static PyObject *
final_name(PyObject *renames, PyObject *node_name, PyObject *port_name, int may_drop)
{
    PyObject *key = NULL, *found = NULL, *result = NULL;
    if (renames == Py_None) {
        result = Py_NewRef(port_name);
        goto done;
    }
    key = joined(node_name, port_name);
    if (key == NULL) {
        goto done;
    }
    found = PyDict_GetItemWithError(renames, key); /* borrowed */
    if (found == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (found != NULL && !PyUnicode_Check(found) && (found != Py_None || !may_drop)) {
        PyErr_Format(PyExc_TypeError, "build_pipeline(): the new name of %U must be a str%s, "
                     "got %.200s", key, may_drop ? " or None" : " (an output cannot be dropped)",
                     Py_TYPE(found)->tp_name);
        goto done;
    }
    result = Py_NewRef(found != NULL ? found : port_name);
done:
    Py_XDECREF(key);
    return result;
}

/* Append value to the list at mapping[key], creating it if needed. */
static int
append_to(PyObject *mapping, PyObject *key, PyObject *value)
{
    PyObject *list = PyDict_GetItemWithError(mapping, key); /* borrowed */
    int rc;
    if (list == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        list = PyList_New(0);
        if (list == NULL) {
            return -1;
        }
        rc = PyDict_SetItem(mapping, key, list);
        Py_DECREF(list); /* the mapping holds it now */
        if (rc < 0) {
            return -1;
        }
    }
    return PyList_Append(list, value);
}

/* A copy of mapping with its keys sorted (YAML emits pipeline keys sorted). */
static PyObject *
sorted_dict(PyObject *mapping)
{
    PyObject *keys = PyDict_Keys(mapping), *out = NULL;
    Py_ssize_t i;
    if (keys == NULL || PyList_Sort(keys) < 0) {
        goto done;
    }
    out = PyDict_New();
    if (out == NULL) {
        goto done;
    }
    for (i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);          /* borrowed */
        PyObject *v = PyDict_GetItemWithError(mapping, k); /* borrowed */
        if (v == NULL && !PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, k);
        }
        if (v == NULL || PyDict_SetItem(out, k, v) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_XDECREF(keys);
    return out;
}

static int
add_message(PyObject *messages, const char *level, PyObject *text)
{
    PyObject *item;
    int rc;
    if (text == NULL) {
        return -1;
    }
    item = Py_BuildValue("(sO)", level, text);
    Py_DECREF(text);
    if (item == NULL) {
        return -1;
    }
    rc = PyList_Append(messages, item);
    Py_DECREF(item);
    return rc;
}

/* The producer's output port named src_port (borrowed), or NULL when it has
 * none.  Comparing two str runs no Python code and cannot fail. */
static PortObject *
find_output(leapp_state *st, NodeObject *src, PyObject *src_port)
{
    Py_ssize_t i;
    for (i = 0; i < PyTuple_GET_SIZE(src->outputs); i++) {
        PortObject *p = node_port_at(st, src->outputs, i);
        if (PyUnicode_Compare(p->name, src_port) == 0) {
            return p;
        }
    }
    return NULL;
}

static int
check_edge(PyObject *src_key, PortObject *out, PyObject *dst_key, PortObject *in)
{
    int same = PyObject_RichCompareBool(out->shape, in->shape, Py_EQ);
    if (same < 0) {
        return -1;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError,
                     "Shape mismatch in pipeline connection: %U %R -> %U %R. The value "
                     "published by '%U' must keep its shape to feed '%U'.",
                     src_key, out->shape, dst_key, in->shape, src_key, dst_key);
        return -1;
    }
    same = PyObject_RichCompareBool(out->dtype, in->dtype, Py_EQ);
    if (same < 0) {
        return -1;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError,
                     "Dtype mismatch in pipeline connection: %U %U -> %U %U. Cast the value "
                     "before it enters '%U', or change the producer's dtype.",
                     src_key, out->dtype, dst_key, in->dtype, dst_key);
        return -1;
    }
    return 0;
}

/* The outputs of src by name, for the message about a missing one. */
static PyObject *
output_names(leapp_state *st, NodeObject *src)
{
    PyObject *names = PyList_New(0);
    Py_ssize_t j;
    for (j = 0; names != NULL && j < PyTuple_GET_SIZE(src->outputs); j++) {
        if (PyList_Append(names, node_port_at(st, src->outputs, j)->name) < 0) {
            Py_CLEAR(names);
        }
    }
    return names;
}

/* Wire one input port; `seen` maps each source key to the first input it fed.
 * The ports and the producer are held: comparisons may run Python code. */
static int
wire_input(leapp_state *st, NodeObject *node, PortObject *in, PyObject *in_name,
           PyObject *out_renames, PyObject *in_graph, PyObject *seen, PyObject *data_flow,
           PyObject *feedback, PyObject *consumed, PyObject *connected, PyObject *messages)
{
    NodeObject *src = (NodeObject *)Py_NewRef(in->src_node); /* a Node: the setter checks */
    PortObject *out = NULL;
    PyObject *src_key = NULL, *dst_key = NULL, *prev, *names = NULL, *out_name = NULL;
    int rc = -1, member = PySet_Contains(in_graph, (PyObject *)src);
    if (member < 0) {
        goto done;
    }
    if (!member) {
        rc = add_message(messages, "error",
                         PyUnicode_FromFormat("Error: input %U/%U came from node '%U', which is "
                                              "not part of this graph.\nTreating it as a "
                                              "dangling input.",
                                              node->name, in_name, src->name));
        goto done;
    }
    out = find_output(st, src, in->src_port);
    if (out == NULL) {
        names = output_names(st, src);
        if (names != NULL) {
            rc = add_message(messages, "error",
                             PyUnicode_FromFormat("Error: input %U/%U expects output '%U' from "
                                                  "node '%U', which does not produce it.\n"
                                                  "Available outputs: %R\nTreating it as a "
                                                  "dangling input.",
                                                  node->name, in_name, in->src_port, src->name,
                                                  names));
        }
        goto done;
    }
    Py_INCREF(out);
    out_name = final_name(out_renames, src->name, out->name, 0);
    src_key = out_name != NULL ? joined(src->name, out_name) : NULL;
    dst_key = src_key != NULL ? joined(node->name, in_name) : NULL;
    if (src_key == NULL || dst_key == NULL) {
        goto done;
    }
    prev = PyDict_GetItemWithError(seen, src_key); /* borrowed */
    if (prev != NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "Error: unsupported use of sending the same tensor multiple times to the "
                     "same node. Duplicate input sources in node %U: %U (it feeds both '%U' "
                     "and '%U'). Declare the tensor once and reuse the traced value inside the "
                     "node.",
                     node->name, src_key, prev, in_name);
        goto done;
    }
    if (PyErr_Occurred() || PyDict_SetItem(seen, src_key, in_name) < 0
        || check_edge(src_key, out, dst_key, in) < 0) {
        goto done;
    }
    {
        int forward = src->index >= 0 && src->index < node->index;
        const char *fmt = forward ? "Found connection: %U  -> %U"
                                  : "Found feedback connection: %U  -> %U";
        if (append_to(forward ? data_flow : feedback, src_key, dst_key) < 0
            || PySet_Add(consumed, src_key) < 0 || PySet_Add(connected, dst_key) < 0
            || add_message(messages, "info", PyUnicode_FromFormat(fmt, src_key, dst_key)) < 0) {
            goto done;
        }
    }
    rc = 0;
done:
    Py_XDECREF(names);
    Py_XDECREF(out_name);
    Py_XDECREF(src_key);
    Py_XDECREF(dst_key);
    Py_XDECREF(out);
    Py_DECREF(src);
    return rc;
}

/* Wire the inputs of one node; fills the edge maps and the consumed set. */
static int
wire_node(leapp_state *st, NodeObject *node, PyObject *const renames[2], PyObject *in_graph,
          PyObject *data_flow, PyObject *feedback, PyObject *consumed, PyObject *connected,
          PyObject *messages)
{
    Py_ssize_t i;
    int rc = 0;
    PyObject *seen = PyDict_New(); /* src key -> first input name */
    /* held: the comparisons in wire_input may run Python code that gives the
     * node a new input tuple */
    PyObject *inputs = Py_NewRef(node->inputs);
    if (seen == NULL) {
        Py_DECREF(inputs);
        return -1;
    }
    for (i = 0; rc == 0 && i < PyTuple_GET_SIZE(inputs); i++) {
        PortObject *in = node_port_at(st, inputs, i); /* borrowed, then held */
        PyObject *name;
        if (in->src_node == Py_None || in->src_port == Py_None) {
            continue;
        }
        Py_INCREF(in);
        name = final_name(renames[0], node->name, in->name, 1);
        if (name == NULL) {
            rc = -1;
        }
        else if (name != Py_None) {
            rc = wire_input(st, node, in, name, renames[1], in_graph, seen, data_flow, feedback,
                            consumed, connected, messages);
        }
        Py_XDECREF(name);
        Py_DECREF(in);
    }
    Py_DECREF(inputs);
    Py_DECREF(seen);
    return rc;
}

/* Graph inputs (or outputs): ports of each node not in `linked`. */
static PyObject *
dangling(leapp_state *st, PyObject *nodes, int outputs, PyObject *renames, PyObject *linked,
         Py_ssize_t *count)
{
    PyObject *result = PyDict_New(), *sorted = NULL;
    Py_ssize_t i, j;
    if (result == NULL) {
        return NULL;
    }
    for (i = 0; i < PyList_GET_SIZE(nodes); i++) {
        NodeObject *node = (NodeObject *)PyList_GET_ITEM(nodes, i); /* borrowed */
        PyObject *ports = outputs ? node->outputs : node->inputs;
        for (j = 0; j < PyTuple_GET_SIZE(ports); j++) {
            PortObject *p = node_port_at(st, ports, j); /* borrowed */
            PyObject *name = final_name(renames, node->name, p->name, !outputs);
            PyObject *key = name != NULL && name != Py_None ? joined(node->name, name) : NULL;
            int found = key ? PySet_Contains(linked, key) : (name == Py_None ? 1 : -1);
            Py_XDECREF(key);
            if (found == 0) {
                found = append_to(result, node->name, name) < 0 ? -1 : 0;
                (*count) += found == 0;
            }
            Py_XDECREF(name);
            if (found < 0) {
                goto error;
            }
        }
    }
    sorted = sorted_dict(result);
error:
    Py_DECREF(result);
    return sorted;
}

static PyObject *
count_targets(PyObject *flow, Py_ssize_t *total)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(flow, &pos, &key, &value)) {
        *total += PyList_GET_SIZE(value);
    }
    return flow;
}

/* build_pipeline(nodes: list[Node], input_renames=None, output_renames=None) -> dict
 *   data_flow, feedback_flow, inputs, outputs: the YAML pipeline mappings
 *   statistics: dict of the graph statistics
 *   messages: list of (level, text) for the facade's logger
 * The renames map "node/port" to the port's final name (None: an input dropped). */
static PyObject *
build_pipeline(PyObject *module, PyObject *args)
{
    leapp_state *st = leapp_get_state(module);
    PyObject *arg, *renames[2] = {Py_None, Py_None};
    PyObject *nodes = NULL, *in_graph = NULL, *data_flow = NULL, *feedback = NULL;
    PyObject *consumed = NULL, *connected = NULL, *messages = NULL, *inputs = NULL;
    PyObject *outputs = NULL, *sorted_data = NULL, *sorted_feedback = NULL, *result = NULL;
    Py_ssize_t i, n_in = 0, n_out = 0, internal = 0;
    if (!PyArg_ParseTuple(args, "O|OO:build_pipeline", &arg, &renames[0], &renames[1])) {
        return NULL;
    }
    for (i = 0; i < 2; i++) {
        if (renames[i] != Py_None && !PyDict_Check(renames[i])) {
            PyErr_SetString(PyExc_TypeError, "build_pipeline(): renames must be dicts or None");
            return NULL;
        }
    }
    nodes = PySequence_List(arg);
    in_graph = PySet_New(NULL);
    data_flow = PyDict_New();
    feedback = PyDict_New();
    consumed = PySet_New(NULL);
    connected = PySet_New(NULL);
    messages = PyList_New(0);
    if (nodes == NULL || in_graph == NULL || data_flow == NULL || feedback == NULL
        || consumed == NULL || connected == NULL || messages == NULL) {
        goto done;
    }
    for (i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i); /* borrowed */
        if (!PyObject_TypeCheck(n, st->node_type)) {
            PyErr_SetString(PyExc_TypeError, "build_pipeline() expects Node objects");
            goto done;
        }
        if (PySet_Add(in_graph, n) < 0) {
            goto done;
        }
    }
    for (i = 0; i < PyList_GET_SIZE(nodes); i++) {
        if (wire_node(st, (NodeObject *)PyList_GET_ITEM(nodes, i), renames, in_graph, data_flow,
                      feedback, consumed, connected, messages) < 0) {
            goto done;
        }
    }
    inputs = dangling(st, nodes, 0, renames[0], connected, &n_in);
    outputs = inputs ? dangling(st, nodes, 1, renames[1], consumed, &n_out) : NULL;
    if (outputs == NULL) {
        goto done;
    }
    sorted_data = sorted_dict(data_flow);
    sorted_feedback = sorted_data ? sorted_dict(feedback) : NULL;
    if (sorted_feedback == NULL) {
        goto done;
    }
    count_targets(data_flow, &internal);
    count_targets(feedback, &internal);
    result = Py_BuildValue(
        "{sOsOsOsOs{snsnsnsnsn}sO}", "data_flow", sorted_data, "feedback_flow",
        sorted_feedback, "inputs", inputs, "outputs", outputs, "statistics",
        "computation_nodes", PyList_GET_SIZE(nodes), "dangling_inputs", n_in,
        "dangling_outputs", n_out, "internal_connections", internal, "total_edges",
        internal + n_in + n_out, "messages", messages);
done:
    Py_XDECREF(nodes);
    Py_XDECREF(in_graph);
    Py_XDECREF(data_flow);
    Py_XDECREF(feedback);
    Py_XDECREF(consumed);
    Py_XDECREF(connected);
    Py_XDECREF(messages);
    Py_XDECREF(inputs);
    Py_XDECREF(outputs);
    Py_XDECREF(sorted_data);
    Py_XDECREF(sorted_feedback);
    return result;
}

static PyMethodDef graph_functions[] = {
    {"build_pipeline", build_pipeline, METH_VARARGS,
     "Edges, feedback, graph inputs/outputs and statistics of finished nodes."},
    {NULL, NULL, 0, NULL},
};

int
graph_init(PyObject *module, leapp_state *st)
{
    (void)st;
    return PyModule_AddFunctions(module, graph_functions);
}
