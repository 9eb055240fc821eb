/* runtime.c: the compiled step program behind InferenceManager (placeholder). */
#include "leapp.h"

int
runtime_init(PyObject *module, leapp_state *st)
{
    (void)module;
    (void)st;
    return 0;
}
