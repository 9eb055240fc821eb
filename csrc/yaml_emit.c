/* yaml_emit.c: YAML emission through libyaml (placeholder until the emitter lands). */
#include "leapp.h"
#include <yaml.h>

static PyObject *
emit_yaml(PyObject *module, PyObject *args)
{
    (void)module;
    (void)args;
    PyErr_SetString(PyExc_NotImplementedError, "emit_yaml is not built yet");
    return NULL;
}

static PyMethodDef yaml_functions[] = {
    {"emit_yaml", emit_yaml, METH_VARARGS, "Emit YAML documents."},
    {NULL, NULL, 0, NULL},
};

int
yaml_emit_init(PyObject *module, leapp_state *st)
{
    (void)st;
    return PyModule_AddFunctions(module, yaml_functions);
}
