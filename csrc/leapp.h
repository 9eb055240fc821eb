/* leapp._core: the one internal header shared by the C files of the core.
 *
 * Each concern lives in its own file and registers itself from module.c
 * through one `*_init(module, state)` function:
 *
 *   module.c     module state, configuration from the facade, init
 *   ref.c        the Ref type: references inside recorded ops
 *   carrier.c    the Carrier type: the provenance a traced tensor carries,
 *                promotion to TracedTensor and back
 *   port.c       the Port type and dtype names
 *   node.c       the Node type: node contexts, the op log, the constant
 *                table, the port tuples and their invariants
 *   prune.c      Node.prune(): reachability over a node's op log
 *   trace.c      the per-op __torch_function__ handler
 *   trace_inactive.c  its path for ops on values of finished nodes (no init:
 *                called from trace.c)
 *   annotate.c   the no-session fast paths of the annotations and the
 *                annotated-method wrapper type
 *   graph.c      edges, feedback classification, graph I/O, statistics
 *   yaml_emit.c  YAML emission through libyaml
 *   runtime.c    the compiled step program behind InferenceManager
 *   program_build.c  that program's constructor (no init: runtime.c's type
 *                names it as tp_new)
 *
 * Ownership conventions: functions returning PyObject* return a new
 * reference, or NULL with an exception set.  Borrowed references are
 * commented where they are taken.
 *
 * assert() states the invariants these comments describe; release builds
 * compile them out (NDEBUG), LEAPP_DEBUG_BUILD=1 (make debug, make
 * test-debug) and LEAPP_SANITIZE=1 (make test-asan) keep them; the module's
 * ASSERTS constant says which.
 */
#ifndef LEAPP_H
#define LEAPP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>  /* first: it sets the feature macros the system headers read */
#include <structmember.h>
#include <pythread.h>
#include <assert.h>

/* Kinds of torch functions, decided once per function by the facade's
 * classifier (leapp.tracing.ops.classify) and cached in state->op_kinds. */
enum {
    OP_PLAIN = 0,      /* record as called */
    OP_INPLACE = 1,    /* mutates args[0]: record a functional rewrite */
    OP_COPY = 2,       /* clone/detach/contiguous/cpu/cuda: keeps provenance */
    OP_TO = 3,         /* .to(): keeps provenance when the dtype is unchanged */
    OP_OVERWRITE = 4,  /* __setitem__ / copy_: in place; a full overwrite from a
                        * published value adopts its provenance */
    OP_VIEW = 5,       /* may return a view sharing the argument's storage */
    OP_CONVERSION = 6, /* a traced value read into Python (bool, int, float,
                        * index, complex, item, tolist): a guard */
    OP_SIZE = 7,       /* a size read (numel, size, shape, len): a guard only
                        * when the receiver's shape is data-dependent */
    OP_DYNAMIC = 8,    /* its results' shapes depend on values (nonzero,
                        * unique, masked_select, ...) */
    OP_SCRIPTED = 9,   /* a TorchScript callable: traced through by the facade */
    OP_KIND_MASK = 15, /* the kind's bits; the flags below may be or-ed in */
    OP_RANDOM = 16,    /* flag: a random op, noted on the node (validation says so) */
};
#define OP_LAST OP_SCRIPTED

typedef struct {
    /* Types created at module init. */
    PyTypeObject *node_type;
    PyTypeObject *port_type;
    PyTypeObject *carrier_type;
    PyTypeObject *ref_type;
    PyTypeObject *method_type;
    PyTypeObject *program_type;

    /* Objects the facade hands over once at import (leapp/__init__.py calls _bind). */
    PyObject *traced_type;    /* leapp's TracedTensor class */
    PyObject *tensor_type;    /* torch.Tensor */
    PyObject *run_disabled;   /* torch._C._disabled_torch_function_impl */
    PyObject *class_setter;   /* object.__dict__["__class__"], the descriptor that
                               * `obj.__class__ = cls` runs on a TracedTensor or a
                               * torch.Tensor, when _bind found no __class__ or
                               * __setattr__ of TracedTensor's own classes in the
                               * way; else NULL (carrier.c then goes through
                               * PyObject_SetAttr) */
    PyObject *classify;       /* func -> kind (int) */
    PyObject *rewrite;        /* (func, args, kwargs) -> (func, args, kwargs) */
    PyObject *alias;          /* tensor -> new TracedTensor sharing storage */
    PyObject *session_api;    /* facade object with the traced slow paths */
    PyObject *alias_link;     /* (src, result) -> None: join result to src's alias group */
    PyObject *alias_write;    /* (receiver, func) -> None: an in-place write reached aliases */
    PyObject *guard;          /* (node, func, receiver, value) -> None: a traced value was
                               * read into Python (leapp.tracing.guards); may raise */
    PyObject *shape_guard;    /* (node, func, args, kwargs, result) -> bool: an op whose
                               * results' shape may depend on the values ran; true when
                               * it does (a guard, leapp.tracing.guards); may raise */
    PyObject *getitem;        /* torch.Tensor.__getitem__: a boolean-mask key gives a
                               * data-dependent shape */
    PyObject *bool_dtype;     /* torch.bool */
    PyObject *script_call;    /* (func, args, kwargs) -> result: a TorchScript call traced through */
    PyObject *note_random;    /* (node, func, args, kwargs) -> None: a random op of a node */

    /* Caches owned by the module. */
    PyObject *op_kinds;       /* dict: func -> int kind */
    PyObject *dtype_names;    /* dict: torch.dtype -> "float32" ... */
    PyObject *empty_kwargs;   /* {}: torch's runner reads None as a kwargs object */

    /* Interned strings. */
    PyObject *str_carrier;    /* "_leapp_carrier" */
    PyObject *str_class;      /* "__class__" */
    PyObject *str_dtype;
    PyObject *str_shape;
    PyObject *str_clone;
    PyObject *str_detach;
    PyObject *str_derived;    /* "_leapp_derived": (node, port, func) of a result
                               * computed outside every node from a published value */
    PyObject *str_out;        /* "out": the keyword of torch's out= variants */


    /* Session. */
    int tracing;              /* between leapp.start() and leapp.stop() */
    unsigned long owner;      /* ident of the thread that turned tracing on */
    PyObject *promoted;       /* list of weakrefs to the tensors given a carrier or a
                               * derived tag that stop() makes plain again */
    Py_ssize_t promoted_limit; /* size at which dead weakrefs are dropped from it */
    PyObject *nodes;          /* dict: name -> Node, creation order; only module.c
                               * writes it (register_node, reset_nodes), Python
                               * reads it through a mappingproxy */
    Py_ssize_t next_index;    /* completion order of the next finished node,
                               * handed out by Node.finish() */
} leapp_state;

static inline leapp_state *
leapp_get_state(PyObject *module)
{
    leapp_state *st = (leapp_state *)PyModule_GetState(module);
    assert(st != NULL);
    return st;
}

/* The C API's rule for a function returning an object: NULL exactly when an
 * exception is set.  Only for assert(): it calls PyErr_Occurred(). */
static inline int
leapp_result_ok(const PyObject *result)
{
    return (result == NULL) == (PyErr_Occurred() != NULL);
}

/* A session traces the thread that started it: 1 when a session runs and
 * the calling thread is another one.  One thread-id compare. */
static inline int
leapp_foreign_thread(const leapp_state *st)
{
    return st->tracing && PyThread_get_thread_ident() != st->owner;
}

/* Raise the facade's error for a session call from a foreign thread (what,
 * a str, names the call, e.g. "annotate.input_tensors()"); returns NULL. */
PyObject *leapp_refuse_thread(leapp_state *st, PyObject *what);

/* The name of a callable for messages, a str: its __name__ when that is a
 * non-empty str, else its repr (module.c). */
PyObject *leapp_func_name(PyObject *func);

/* ---- ref.c ----------------------------------------------------------- */

/* A reference inside a recorded op: to a value of the node or a constant. */
enum { REF_VALUE = 0, REF_CONST = 1 };
typedef struct {
    PyObject_HEAD
    Py_ssize_t index;
    int kind;
} RefObject;

int ref_init(PyObject *module, leapp_state *st);
/* A new Ref of that kind (REF_VALUE, REF_CONST) and index. */
PyObject *ref_new(leapp_state *st, int kind, Py_ssize_t index);

/* ---- carrier.c ------------------------------------------------------- */

/* The provenance of a traced tensor, kept in its __dict__ under "_leapp_carrier". */
typedef struct {
    PyObject_HEAD
    PyObject *node;        /* Node owning the value (strong) */
    PyObject *port;        /* published output name, or NULL */
    Py_ssize_t vid;        /* value id in node->ops */
    PyObject *group;       /* alias group (tensors sharing storage), or NULL */
    int declared;          /* entered through a declaration (an input) */
    int dynamic;           /* its shape depends on values (nonzero, a mask, ...) */
} CarrierObject;

int carrier_init(PyObject *module, leapp_state *st);
/* Borrowed carrier of a traced tensor, or NULL (no exception) if none. */
CarrierObject *carrier_of(leapp_state *st, PyObject *obj);
/* The value under key in the instance dict of obj, a TracedTensor, borrowed
 * (obj's dict holds it), or NULL (no exception) if none. */
PyObject *carrier_dict_item(leapp_state *st, PyObject *obj, PyObject *key);
/* Make the plain tensor obj a TracedTensor without a carrier, tagged with
 * tag under "_leapp_derived" and remembered for stop(). */
int carrier_tag_derived(leapp_state *st, PyObject *obj, PyObject *tag);
/* Attach a fresh carrier to obj (a tensor of type TracedTensor). */
int carrier_attach(leapp_state *st, PyObject *obj, PyObject *node,
                   Py_ssize_t vid, PyObject *port, int declared);
/* carrier_attach without remembering obj for stop(): the op-result hot path. */
int carrier_attach_value(leapp_state *st, PyObject *obj, PyObject *node, Py_ssize_t vid,
                         PyObject *port, int declared);
/* Make obj (an exact torch.Tensor) a TracedTensor in place. */
int carrier_promote(leapp_state *st, PyObject *obj);
/* Make every tensor given a carrier or a derived tag since the last call
 * plain again (in place: class back to torch.Tensor, carrier and tag
 * dropped); -1 on error. */
Py_ssize_t carrier_release_all(leapp_state *st);
/* Make the remembered tensors whose carrier names node plain again (a
 * discarded node's declared inputs and buffers); -1 on error. */
Py_ssize_t carrier_release_node(leapp_state *st, PyObject *node);

/* ---- port.c ---------------------------------------------------------- */

/* One input or output of a node. */
typedef struct {
    PyObject_HEAD
    PyObject *name;        /* str */
    PyObject *dtype;       /* str, e.g. "float32" */
    PyObject *shape;       /* tuple of int */
    PyObject *semantics;   /* dict of extra YAML fields, or None */
    PyObject *value;       /* the first-trace value (a clone) */
    PyObject *samples;     /* list of re-entry values */
    PyObject *src_node;    /* producing Node, or None */
    PyObject *src_port;    /* producing port name, or None */
    Py_ssize_t vid;        /* value id inside the node; -1 for constants */
    int is_state;          /* declared state (feedback in one pass) */
} PortObject;

int port_init(PyObject *module, leapp_state *st);
/* The YAML dtype name of tensor ("float32" ...), cached per dtype. */
PyObject *leapp_dtype_name(leapp_state *st, PyObject *tensor);

/* ---- node.c ---------------------------------------------------------- */

/* NODE_TAIL: finished for the annotations (its ports fixed, re-entry checks
 * apply), but ops on its internal values (neither declared nor published) are
 * still recorded: a declared state's update computed after output_tensors,
 * until update_state binds it (leapp.tracing.session_outputs). */
enum { NODE_OPEN = 0, NODE_DONE = 1, NODE_TAIL = 2 };

/* A Node's port lists are tuples only node.c builds: Python reads them and
 * changes them through the Node methods (add_input, add_outputs,
 * remove_input, trim_inputs, rename_input, rename_output), which keep the
 * invariants below; a change replaces the tuple, so a reader holding the
 * old one never sees it change. */
typedef struct {
    PyObject_HEAD
    PyObject *name;        /* str */
    PyObject *inputs;      /* tuple[Port], declaration order; names unique among
                            * inputs and trimmed */
    PyObject *outputs;     /* tuple[Port], declaration order; names unique */
    PyObject *trimmed;     /* tuple[Port] pruned from inputs */
    PyObject *ops;         /* list of (func, args, kwargs, out) records */
    PyObject *consts;      /* list[Tensor]: tensors from outside the node */
    PyObject *const_ids;   /* dict: id(tensor) -> index into consts */
    PyObject *info;        /* dict owned by the facade (backend, module...) */
    Py_ssize_t nvalues;    /* value ids handed out so far */
    Py_ssize_t index;      /* completion order; -1 while open */
    int state;
} NodeObject;

int node_init(PyObject *module, leapp_state *st);
/* Index of tensor t in node's constant table, adding it if new; -1 on error. */
Py_ssize_t node_const_index(NodeObject *node, PyObject *t);
/* The port of ports (a Node's port tuple) at i, borrowed: only Ports are
 * ever put there. */
static inline PortObject *
node_port_at(leapp_state *st, PyObject *ports, Py_ssize_t i)
{
    PyObject *item = PyTuple_GET_ITEM(ports, i);
    (void)st;
    assert(Py_IS_TYPE(item, st->port_type));
    return (PortObject *)item;
}

/* ---- prune.c --------------------------------------------------------- */

/* Node.prune(output_vids) -> (live_ops, live_values): the op records and
 * values the given output value ids need (node.c's method table). */
PyObject *node_prune(NodeObject *self, PyObject *vids);

/* ---- trace.c --------------------------------------------------------- */
int trace_init(PyObject *module, leapp_state *st);
/* One walk of an op's args (trace.c): the tracing node and the first carrier found. */
typedef struct {
    leapp_state *st;
    PyObject *func;           /* borrowed */
    NodeObject *active;       /* strong once the walk ends: the tracing node, if any */
    CarrierObject *first;     /* strong once the walk ends: the first traced leaf's */
    int dynamic;              /* a value of the tracing node with a data-dependent shape */
    int retry;                /* a tail node's value came before an open node's: walk again */
} trace_walk;
int trace_is_tensor(leapp_state *st, PyObject *obj);
PyObject *trace_run_eager(leapp_state *st, PyObject *func, PyObject *types, PyObject *args,
                          PyObject *kwargs);
/* trace_inactive.c: an op on values of finished nodes while a session runs. */
PyObject *trace_inactive(leapp_state *st, trace_walk *w, int kind, PyObject *func, PyObject *types, PyObject *args, PyObject *kwargs);

/* ---- annotate.c ------------------------------------------------------ */
int annotate_init(PyObject *module, leapp_state *st);

/* ---- graph.c --------------------------------------------------------- */
int graph_init(PyObject *module, leapp_state *st);

/* ---- yaml_emit.c ----------------------------------------------------- */
int yaml_emit_init(PyObject *module, leapp_state *st);

/* ---- runtime.c, program_build.c ------------------------------------- */
/* The compiled step program: routing tables in slots, resolved once by
 * InferenceManager (see runtime.c). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t nslots;
    PyObject **slots;        /* owned value per slot, or NULL */
    Py_ssize_t nnodes;
    PyObject **calls;        /* owned callable per node, run order */
    Py_ssize_t *in_off;      /* nnodes + 1 offsets into in_slot */
    Py_ssize_t *in_slot;     /* slots read by the nodes, concatenated */
    Py_ssize_t *out_off;     /* nnodes + 1 offsets into dst_off */
    Py_ssize_t *dst_off;     /* noutputs + 1 offsets into dst_slot */
    Py_ssize_t *dst_slot;    /* destination slots of every output */
    Py_ssize_t nresults;
    PyObject **result_keys;  /* owned str "node/output" per graph output */
    Py_ssize_t *result_slot;
    Py_ssize_t ncommits;
    Py_ssize_t *commit_from; /* staging slot */
    Py_ssize_t *commit_to;   /* feedback target slot */
    PyObject *names;         /* tuple[str]: node names, run order */
    PyObject *input_index;   /* dict: "node/input" -> int slot */
    PyObject *slot_keys;     /* tuple[str]: a readable name per slot */
    PyObject *shapes;        /* tuple: expected shape tuple per slot, or None */
    PyObject *dtypes;        /* tuple: expected dtype per slot, or None */
    PyObject *graph_inputs;  /* list[str]: the graph inputs, for errors */
    PyObject *convert;       /* (key, value) -> value, for values that do not fit;
                                or None */
} ProgramObject;

int runtime_init(PyObject *module, leapp_state *st);
/* program_build.c: the constructor (tp_new) and the slot-index check run() shares. */
PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwds);
Py_ssize_t program_slot_index(PyObject *obj, Py_ssize_t nslots);

#endif /* LEAPP_H */
