"""Differential fuzzer: random annotated pipelines, run under this package and
under upstream leapp 0.7.2, compared.

    python bench/fuzz.py [--n 500] [--seed 1] [--batch 25] [--keep DIR]
                         [--upstream VENV_OR_PYTHON] [--ours PYTHON] [--save-cases DIR]
    python bench/fuzz.py --print s7_0014                  (one program's source)
    python bench/fuzz.py --rescan DIR --n N --seed S      (compare a --keep run again)
    python bench/fuzz.py --worker PROGRAM_DIR OUT_DIR      (internal: one batch)

Each program is a standalone Python script built from the public API only
(``python prog.py OUT`` runs it as-is under either package): one to four
nodes, each ``input_tensors``/``output_tensors`` (flat dicts, dicts of dicts,
lists of ``TensorSemantics``; declared state, updated before or after the node's
``output_tensors``, in its next call, or never; static outputs) or
``@annotate.method`` (positional, keyword, skipped and shared tensor
defaults, ``*args``, ``**kwargs``, bound methods, ``torch.no_grad()``
wrappers), whose bodies are groups of ops of tests/op_catalogue.py (its source
is pasted into the program), wired forward (a node's output into a later
node) and back (a later node's output of the previous pass, inferred
feedback), traced for one to three passes and exported with a backend drawn
from every name ``export_with`` accepts.

Programs run in batches: one worker process per interpreter per batch (the
torch import is paid once per batch, not per program).  For every program
the comparer checks

* outcome: both compiled, or both raised the same exception type;
* message: when both raised, upstream's first line (paths masked, set
  literals sorted) is contained in ours (ours keeps upstream's wording and
  may add to it);
* compile result: ``compile_graph``'s ``{node: True | False | error}``;
* yaml: bench/compat.py's ``compare_yaml`` (key by key, digests masked) and
  the initial values;
* replay: each bundle run by its own package's ``InferenceManager`` for 3
  steps on inputs seeded from the YAML's graph inputs: same output keys,
  ``allclose(1e-5)`` values.

Every difference gets a class (check plus a normalised signature); classes
matching ``KNOWN_DIFFERENCES`` (bugs being fixed: shrink the list as fixes
land) or ``DEPARTURES`` (deliberate, see docs/compatibility.md) are
reported as such.  Exit status 1 when an unexplained difference remains,
2 when the run could not start.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CATALOGUE = os.path.join(ROOT, "tests", "op_catalogue.py")
GRAPH = "fz"
REPLAY_STEPS = 3
TOL = 1e-5

# Every spelling upstream 0.7.2's export_with accepts (leapp_node._create_backend).
BACKENDS = ["jit", "jit-script", "jit-trace", "onnx", "onnx-dynamo",
            "onnx-torchscript", "pt2", "exported-program"]
# The fast ones dominate: an ONNX (dynamo) or torch.export export costs seconds.
BACKEND_WEIGHTS = [6, 2, 4, 1, 1, 3, 1, 1]

CALL_SHAPES = ["positional", "keyword", "default_skipped", "keyword_skips_default",
               "shared_default", "varargs", "kwargs", "bound", "no_grad"]
PAYLOADS = ["dict", "nested", "semantics"]
# Where a node's declared state `h` gets its update_state, relative to the node's
# own annotations (each pass: input_tensors, state_tensors, output_tensors):
#   before_output  in the call, before output_tensors (the usual order);
#   after_output   in the same pass, after output_tensors (the value computed
#                  before it, or an op on the node's values after it);
#   next_call      in the node's next call, after its input_tensors and before
#                  its state_tensors (an export loop that binds the state after
#                  the environment step); the last pass leaves it unbound;
#   never          declared, never updated.
# A late update (after_output, next_call) binds one of STATE_SOURCES:
#   direct         h_new, computed in the call before output_tensors;
#   tail_op        an op on h_new after output_tensors (the node's tail);
#   from_output    an op on the node's published output after output_tensors.
# Drawn from a stream of its own, so the rest of a program is what it was
# before the orders existed.
STATE_ORDERS = ["before_output", "after_output", "next_call", "never"]
STATE_ORDER_WEIGHTS = [4, 2, 2, 1]
STATE_SOURCES = ["direct", "tail_op", "from_output"]


# --------------------------------------------------------------------------
# Known differences and deliberate departures
#
# Each entry: id, program (the generated program that showed it, "s<seed>_<index>":
# `--print` writes it out, case_program() regenerates it), check (the class's
# check name), outcome (for check "outcome": the class's "ours X, upstream Y"
# exactly), ours and upstream (regexes, each searched in that side's own line of
# the difference: "ok" or the start of its message), optional feature (a program
# feature the program must have), reason.  A difference is explained only when
# every one of these matches, so another error of ours in a program where
# upstream fails the same way is not explained by it.  KNOWN_DIFFERENCES are bugs
# of this package being fixed now: delete an entry once its fix lands (the fuzz
# test then holds the fix).  DEPARTURES are decided, documented in
# docs/compatibility.md, and stay; tests/test_fuzz.py re-runs their programs
# under both packages to show each still stands and is explained by its entry.

# ---- KNOWN DIFFERENCES: bugs of ours, to shrink as fixes land ------------
KNOWN_DIFFERENCES: list[dict] = []

# ---- FIXED: differences the fuzzer found and that are fixed now ----------
# Their programs must match upstream: tests/test_fuzz.py runs them under both
# packages.
FIXED: list[dict] = [
    {"id": "method-keyword-skips-default", "program": "s7_0003",
     "reason": "@annotate.method called as f(a, c=t) while b keeps its tensor default: "
               "ours passed b twice (TypeError); now b's default is a constant, as upstream"},
    {"id": "method-keyword-input-order", "program": "s7_0014",
     "reason": "@annotate.method called with keywords out of signature order "
               "(f(b=y, a=x)): the inputs now follow the call's order, as upstream's"},
    {"id": "duplicate-source-wording", "program": "s120_0004",
     "reason": "one published value fed to two inputs of a node: ours rewrote the end of "
               "upstream's line; now upstream's line comes whole, our detail after it"},
]

# ---- DEPARTURES: deliberate, documented in docs/compatibility.md --------
DEPARTURES: list[dict] = [
    {"id": "upstream-validation-self-feedback", "program": "s1_0049", "check": "outcome",
     "outcome": "ours ok, upstream Exception", "ours": r"^ok$",
     "upstream": r"^Model validation failed for 1 node\(s\): \['n\d+'\]$",
     "reason": "in-place indexing writes (x[idx] = v) exported through the TorchScript ONNX "
               "exporter: upstream's model has a ScatterND whose updates do not match its "
               "indices, so onnxruntime refuses it and upstream's own validation fails; "
               "ours records the functional write and validates (docs/compatibility.md, "
               "'Where upstream fails')"},
    {"id": "jit-script-python-operators", "program": "s1_0136", "check": "outcome",
     "outcome": "ours ok, upstream RuntimeError", "ours": r"^ok$",
     "upstream": r"^Error compiling model \w+: .*"
                 r"(has no attribute or method '\w+'|Arguments for call are not valid)",
     "reason": "upstream records some ops in a form torch.jit.script rejects (x // 0.5 "
               "as a dunder call, x.bool(), x.norm(dim=-1) with p='fro'); ours records the torch "
               "op as called, so the node exports (docs/compatibility.md, 'Operators "
               "under jit')"},
    {"id": "tensor-mT-then-eager-error", "program": "s11_0030", "check": "outcome",
     "outcome": "ours RuntimeError, upstream AttributeError",
     "ours": r"^view size is not compatible with input tensor's size and stride",
     "upstream": r"^'method-wrapper' object has no attribute '__module__'$",
     "reason": "upstream fails tracing x.mT; ours traces it, and the program goes on to an "
               "error of its own that upstream never reaches (torch's view error on the "
               "non-contiguous x.mT, the same value declared twice, which upstream refuses "
               "too): docs/compatibility.md, 'Where upstream fails'"},
    {"id": "late-state-update-is-feedback", "program": "s1_0002", "check": "outcome",
     "feature": "state",
     "outcome": "ours ok, upstream Exception", "ours": r"^ok$",
     "upstream": r"^Error: Reentering \w+ with new i/o \w+ but failed to find it",
     "reason": "declared state whose update_state comes after the node's output_tensors, "
               "or in its next call before its state_tensors (an export loop that masks "
               "the LSTM state after the environment step): upstream refuses it when the "
               "node is entered again; ours exports the state as feedback, the update "
               "traced in the node's tail (docs/compatibility.md, 'Declared state "
               "updated late')"},
    {"id": "late-state-update-untied-refused", "program": "s1_0028", "check": "message",
     "feature": "state",
     "ours": r"^Error: update_state for state '\w+' of node '\w+' at \S+ comes after "
             r"the node's output_tensors",
     "upstream": r"^Error: Reentering \w+ with new i/o \w+ but failed to find it",
     "reason": "a late update_state (after output_tensors, or in the node's next call) "
               "whose value is not one of the node's traced values (here an op on the "
               "node's published output, made after its output_tensors): both refuse; "
               "upstream when the node is entered again, with its reentry message, ours "
               "at update_state, naming the state, the node, the line and the fix "
               "(docs/compatibility.md, 'Declared state updated late')"},
    {"id": "late-state-update-then-own-error", "program": "s1_0010", "check": "message",
     "feature": "state",
     "ours": r"^(?!Error: update_state for state)",
     "upstream": r"^Error: Reentering \w+ with new i/o \w+ but failed to find it",
     "reason": "upstream refuses the late update_state when the node is entered again; "
               "ours accepts it (the state is feedback), and the program goes on to an "
               "error of its own that upstream never reaches (a value fed twice to one "
               "node, refused by both packages without the late update): "
               "docs/compatibility.md, 'Declared state updated late'"},
    {"id": "tensor-mT-property", "program": "s7_0092", "check": "outcome",
     "outcome": "ours ok, upstream AttributeError", "ours": r"^ok$",
     "upstream": r"^'method-wrapper' object has no attribute '__module__'$",
     "reason": "upstream fails tracing the x.mT property (AttributeError); ours records "
               "it (docs/compatibility.md, 'Where upstream fails')"},
]


def _side(diff: dict, side: str) -> str | None:
    """The ``side`` ("ours" / "upstream") line of a difference, without its label."""
    for line in diff["details"]:
        if line.startswith(side + ": ") or line.startswith(side + " "):
            return line.split(" ", 1)[1]
    return None


def matches(entry: dict, diff: dict) -> bool:
    """Whether the table entry explains ``diff``: its check, outcome, feature and both
    sides' lines all match."""
    if entry["check"] != diff["check"]:
        return False
    if entry.get("feature") and entry["feature"] not in diff.get("features", []):
        return False
    if diff["check"] == "outcome" and diff["class"] != "outcome: " + entry["outcome"]:
        return False
    for side in ("ours", "upstream"):
        line = _side(diff, side)
        if line is None or not re.search(entry[side], line, re.S):
            return False
    return True


def explain(diff: dict) -> dict | None:
    """The KNOWN_DIFFERENCES or DEPARTURES entry explaining `diff`, if any."""
    for table, kind in ((DEPARTURES, "departure"), (KNOWN_DIFFERENCES, "known")):
        for entry in table:
            if matches(entry, diff):
                return dict(entry, kind=kind)
    return None


# --------------------------------------------------------------------------
# The op catalogue: groups of ops over (x, y) of shape (2, 3, 4)

def _catalogue():
    """(source text to paste, {group: (carrier keys, extra keys)})."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_fuzz_op_catalogue", CATALOGUE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch
    groups = {}
    for name, (inputs, fn) in mod.GROUPS.items():
        if inputs[0].shape != (2, 3, 4):
            continue  # the convolution group takes images
        outs = fn(*inputs)
        carriers = [k for k, v in outs.items()
                    if v.shape == (2, 3, 4) and v.dtype == torch.float32]
        extras = [k for k in outs if k not in carriers]
        if not carriers:
            continue  # nothing of the (2, 3, 4) float shape to chain on
        groups[name] = (sorted(carriers), sorted(extras))
    with open(CATALOGUE) as f:
        source = f.read()
    source = source.replace("from __future__ import annotations\n", "")
    return source, groups


_CAT = None


def catalogue():
    global _CAT
    if _CAT is None:
        _CAT = _catalogue()
    return _CAT


# --------------------------------------------------------------------------
# Generator

class Node:
    def __init__(self, index, rng, groups, n_nodes, passes):
        self.name = "n%d" % index
        self.index = index
        self.kind = rng.choice(["io", "io", "method"])
        self.backend = rng.choices(BACKENDS, BACKEND_WEIGHTS)[0]
        self.group = rng.choice(sorted(groups))
        carriers, extras = groups[self.group]
        self.carrier = rng.choice(carriers)
        self.extras = rng.sample(extras + carriers, rng.choice([0, 0, 1, 2]))
        self.extras = [k for k in self.extras if k != self.carrier]
        self.sources = []
        for slot in range(2):
            choices = ["fresh"]
            if index > 0:
                choices += ["forward", "forward"]
            if passes > 1:
                choices += ["feedback"]
            how = rng.choice(choices)
            if how == "forward":
                self.sources.append(("forward", rng.randrange(index)))
            elif how == "feedback":
                self.sources.append(("feedback", rng.randrange(index, n_nodes)))
            else:
                self.sources.append(("fresh", rng.randrange(1000)))
        if self.kind == "io":
            self.payload = rng.choice(PAYLOADS)
            self.out_payload = rng.choice(["dict", "dict", "nested", "semantics"])
            self.state = rng.random() < 0.3
            self.static = rng.random() < 0.25
            self.call = None
        else:
            self.payload = self.out_payload = None
            self.state = self.static = False
            self.call = rng.choice(CALL_SHAPES)
        self.state_order = None  # set by generate() for a node with state
        self.state_source = None  # what a late update binds (STATE_SOURCES)

    def features(self):
        f = ["backend:" + self.backend, "group:" + self.group]
        f += ["source:" + s[0] for s in self.sources]
        if self.kind == "io":
            f += ["payload:" + self.payload, "out_payload:" + self.out_payload]
            if self.state:
                f += ["state", "state_order:" + self.state_order]
                if self.state_source:
                    f.append("state_source:" + self.state_source)
            if self.static:
                f.append("static_outputs")
        else:
            f.append("method:" + self.call)
        if self.extras:
            f.append("extra_outputs")
        return f


def _src_expr(src):
    how, arg = src
    if how == "fresh":
        return "torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(%d + p))" % arg
    if how == "forward":
        return "outs['n%d']" % arg
    return "carry.get('n%d', torch.zeros(2, 3, 4))" % arg


def _body(node, a, b, indent):
    """Lines computing `main` and the extras from `a`, `b` (names)."""
    pad = " " * indent
    lines = ["%sr = %s(%s, %s)" % (pad, node.group, a, b),
             "%smain = r[%r]" % (pad, node.carrier)]
    for i, key in enumerate(node.extras):
        lines.append("%sx%d = r[%r]" % (pad, i, key))
    return lines


def _io_node(node):
    n = node.name
    srcs = [_src_expr(s) for s in node.sources]
    out = []
    if node.payload == "dict":
        out.append("    a, b = annotate.input_tensors(%r, {'a': %s, 'b': %s})" % (n, *srcs))
    elif node.payload == "nested":
        out.append("    v = annotate.input_tensors(%r, {'obs': {'pos': {'a': %s}, 'b': %s}})"
                   % (n, *srcs))
        out.append("    a, b = v['pos']['a'], v['b']")
    else:
        out.append("    a, b = annotate.input_tensors(%r, [TensorSemantics(name='a', ref=%s, "
                   "kind=InputKindEnum.JOINT_POSITION), TensorSemantics(name='b', ref=%s)])"
                   % (n, *srcs))
    out += _body(node, "a", "b", 4)
    order = node.state_order if node.state else None
    pending = "%s:h" % n  # next_call: the update waits in `carry` for the next pass
    if order == "next_call":
        out.append("    if %r in carry:" % pending)
        out.append("        annotate.update_state(%r, {'h': carry[%r]})" % (n, pending))
    if node.state:
        out.append("    h = annotate.state_tensors(%r, {'h': torch.zeros(2, 3, 4)})" % n)
        out.append("    main = main + 0.5 * h")
    if order == "before_output":
        out.append("    annotate.update_state(%r, {'h': main * 0.9})" % n)
    elif order in ("after_output", "next_call"):
        out.append("    h_new = main * 0.9")
    names = ["main"] + ["x%d" % i for i in range(len(node.extras))]
    kw = "export_with=%r" % node.backend
    if node.static:
        kw += ", static_outputs={'gain': torch.full((3,), 0.5)}"
    if node.out_payload == "dict":
        payload = "{%s}" % ", ".join("%r: %s" % (k, k) for k in names)
        out.append("    res = annotate.output_tensors(%r, %s, %s)" % (n, payload, kw))
        out.append("    outs[%r] = res[0] if isinstance(res, tuple) else res" % n)
    elif node.out_payload == "nested":
        inner = "{%s}" % ", ".join("%r: %s" % (k, k) for k in names)
        out.append("    res = annotate.output_tensors(%r, {'out': %s}, %s)" % (n, inner, kw))
        out.append("    outs[%r] = res['main']" % n)
    else:
        items = ["TensorSemantics(name='main', ref=main, kind=OutputKindEnum.JOINT_POSITION)"]
        items += ["TensorSemantics(name=%r, ref=%s)" % (k, k) for k in names[1:]]
        out.append("    annotate.output_tensors(%r, [%s], %s)" % (n, ", ".join(items), kw))
        out.append("    outs[%r] = main" % n)
    late = {"direct": "h_new", "tail_op": "h_new * 0.5",
            "from_output": "main * 0.9"}.get(node.state_source or "")
    if order == "after_output":
        out.append("    annotate.update_state(%r, {'h': %s})" % (n, late))
    elif order == "next_call":
        out.append("    outs[%r] = %s" % (pending, late))
    return [], out


def _method_node(node):
    n, call = node.name, node.call
    deco = "@annotate.method(node_name=%r, export_with=%r)" % (n, node.backend)
    ret = ", ".join(["main"] + ["x%d" % i for i in range(len(node.extras))])
    srcs = [_src_expr(s) for s in node.sources]
    defs = []
    default = "D_%s" % n
    if call in ("default_skipped", "keyword_skips_default", "shared_default"):
        defs.append("%s = torch.linspace(-1.0, 1.0, 24).reshape(2, 3, 4)" % default)
    if call == "bound":
        cls = "Mod_%s" % n
        defs += ["class %s(torch.nn.Module):" % cls,
                 "    def __init__(self):",
                 "        super().__init__()",
                 "        self.scale = torch.nn.Parameter(torch.full((4,), 1.5), "
                 "requires_grad=False)",
                 "",
                 "    " + deco,
                 "    def forward(self, a, b):"]
        defs += _body(node, "a * self.scale", "b", 8)
        defs += ["        return %s" % ret, "", "", "obj_%s = %s()" % (n, cls)]
        call_line = "obj_%s.forward(%s, %s)" % (n, *srcs)
    else:
        sig = {"positional": "a, b", "keyword": "a, b", "no_grad": "a, b",
               "default_skipped": "a, b=%s" % default,
               "keyword_skips_default": "a, b=%s, c=None" % default,
               "shared_default": "a, b=%s, c=%s" % (default, default),
               "varargs": "*args", "kwargs": "a, **kw"}[call]
        defs.append(deco)
        if call == "no_grad":
            defs.append("@torch.no_grad()")
        defs.append("def %s(%s):" % (n, sig))
        if call == "varargs":
            defs.append("    a, b = args")
        elif call == "kwargs":
            defs.append("    b = kw['b']")
        elif call == "keyword_skips_default":
            defs.append("    b = b + c")
        elif call == "shared_default":
            defs.append("    b = b * a + c")
        defs += _body(node, "a", "b", 4)
        defs += ["    return %s" % ret, "", ""]
        call_line = {
            "positional": "%s(%s, %s)" % (n, *srcs),
            "no_grad": "%s(%s, %s)" % (n, *srcs),
            "keyword": "%s(b=%s, a=%s)" % (n, srcs[1], srcs[0]),
            "default_skipped": "%s(%s)" % (n, srcs[0]),
            "keyword_skips_default": "%s(%s, c=%s)" % (n, *srcs),
            "shared_default": "%s(%s)" % (n, srcs[0]),
            "varargs": "%s(%s, %s)" % (n, *srcs),
            "kwargs": "%s(%s, b=%s)" % (n, *srcs),
        }[call]
    out = ["    res = " + call_line,
           "    outs[%r] = res[0] if isinstance(res, tuple) else res" % n]
    return defs, out


def generate(seed: int, index: int) -> dict:
    """One program: {"id", "seed", "index", "features", "source"}."""
    source, groups = catalogue()
    rng = random.Random("%d/%d" % (seed, index))
    n_nodes = rng.choice([1, 2, 2, 3, 3, 4])
    passes = rng.choice([1, 2, 2, 3])
    no_grad = rng.random() < 0.7
    nodes = [Node(i, rng, groups, n_nodes, passes) for i in range(n_nodes)]
    order_rng = random.Random("%d/%d/state-order" % (seed, index))
    for node in nodes:
        if node.state:
            node.state_order = order_rng.choices(STATE_ORDERS, STATE_ORDER_WEIGHTS)[0]
            binds = order_rng.choice(STATE_SOURCES)
            if node.state_order in ("after_output", "next_call"):
                node.state_source = binds
    features = ["nodes:%d" % n_nodes, "passes:%d" % passes]
    if no_grad:
        features.append("run_no_grad")
    defs, steps = [], []
    for node in nodes:
        features += node.features()
        d, s = _io_node(node) if node.kind == "io" else _method_node(node)
        defs += d
        steps += s
    features = sorted(set(features))
    pid = "s%d_%04d" % (seed, index)
    lines = [
        '"""leapp fuzz program %s (seed %d, index %d).' % (pid, seed, index),
        "",
        "Features: %s." % ", ".join(features),
        "Run as-is under either leapp: python %s.py OUT_DIR" % pid,
        '"""',
        "import os",
        "import sys",
        "",
        "import leapp",
        "from leapp import InputKindEnum, OutputKindEnum, TensorSemantics, annotate",
        "",
        "# ---- tests/op_catalogue.py, pasted " + "-" * 40,
        source.rstrip(),
        "# ---- end of the catalogue " + "-" * 48,
        "",
        "",
    ]
    lines += defs
    lines += ["def step(p, carry):", "    outs = {}"] + steps + ["    return outs", "", ""]
    lines += [
        "def main(out_dir):",
        "    torch.manual_seed(0)",
        "    torch.set_num_threads(1)",
        "    leapp.start(%r, save_path=out_dir)" % GRAPH,
        "    carry = {}",
        "    try:",
    ]
    if no_grad:
        lines += ["        with torch.no_grad():",
                  "            for p in range(%d):" % passes,
                  "                carry = step(p, carry)"]
    else:
        lines += ["        for p in range(%d):" % passes,
                  "            carry = step(p, carry)"]
    lines += [
        "    except BaseException:",
        "        try:",
        "            leapp.stop()",
        "        except Exception:",
        "            pass",
        "        raise",
        "    leapp.stop()",
        "    result = leapp.compile_graph(visualize=False)",
        "    return os.path.join(out_dir, %r, %r), result" % (GRAPH, GRAPH + ".yaml"),
        "",
        "",
        'if __name__ == "__main__":',
        "    print(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else 'fuzz_out')))",
        "",
    ]
    return {"id": pid, "seed": seed, "index": index, "features": features,
            "source": "\n".join(lines)}


# --------------------------------------------------------------------------
# Worker: runs one batch of programs in this interpreter

def _result_summary(result):
    if not isinstance(result, dict):
        return repr(type(result).__name__)
    out = {}
    for k, v in result.items():
        out[str(k)] = v if isinstance(v, bool) else type(v).__name__
    return out


def _replay(yaml_path, out_path):
    """Run the bundle with this package's InferenceManager; returns info."""
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, HERE)
    import compat
    from leapp import InferenceManager
    inputs = out_path + ".inputs.safetensors"
    compat.make_inputs(yaml_path, inputs, steps=REPLAY_STEPS, seed=4321)
    from safetensors.torch import load_file
    steps = {}
    for key, value in load_file(inputs).items():
        s, name = key.split("|", 1)
        steps.setdefault(int(s), {})[name] = value
    info = {"ok": False, "error": "", "outputs": []}
    tensors = {}
    try:
        manager = InferenceManager(yaml_path)
        with torch.no_grad():
            for s in range(REPLAY_STEPS):
                outputs = manager.run_policy({k: v.clone() for k, v in steps.get(s, {}).items()})
                if s == 0:
                    info["outputs"] = list(outputs)
                for name, value in outputs.items():
                    tensors["%d|%s" % (s, name)] = value.detach().cpu().clone().contiguous()
        info["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the comparer
        info["error"] = "%s: %s" % (type(exc).__name__, exc)
    save_file(tensors, out_path)
    return info


def worker(program_dir, out_dir):
    import logging
    import runpy
    logging.disable(logging.CRITICAL)
    import warnings
    warnings.simplefilter("ignore")
    import leapp
    results = {}
    for fname in sorted(os.listdir(program_dir)):
        if not fname.endswith(".py"):
            continue
        pid = fname[:-3]
        work = os.path.join(out_dir, pid)
        os.makedirs(work, exist_ok=True)
        rec = {"ok": False, "exc_type": None, "message": "", "compile": None,
               "yaml": None, "replay": None, "seconds": 0.0}
        t0 = time.perf_counter()
        try:
            ns = runpy.run_path(os.path.join(program_dir, fname), run_name="fuzz_program")
            yaml_path, result = ns["main"](work)
            rec["ok"] = True
            rec["compile"] = _result_summary(result)
            rec["yaml"] = yaml_path
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            if isinstance(exc, KeyboardInterrupt):
                raise
            rec["exc_type"] = type(exc).__name__
            rec["message"] = str(exc).replace(work, "<OUT>")
            rec["traceback"] = traceback.format_exc(limit=-3).replace(work, "<OUT>")
            try:
                leapp.stop()
            except BaseException:  # noqa: BLE001
                pass
        if rec["ok"] and rec["yaml"] and os.path.exists(rec["yaml"]):
            try:
                rec["replay"] = _replay(rec["yaml"], os.path.join(work, "replay.safetensors"))
            except BaseException as exc:  # noqa: BLE001
                rec["replay"] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                                 "outputs": []}
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        results[pid] = rec
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f)
    return results


# --------------------------------------------------------------------------
# Comparer

def _first_line(message):
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    line = re.sub(r"/\S*/(tmp|fuzz)\S*", "<PATH>", line)
    line = re.sub(r"0x[0-9a-f]+", "0x", line)
    return re.sub(r"\{('[^'{}]*'(?:, '[^'{}]*')+)\}",
                  lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", line)


SUBCLASSES_OF_EXCEPTION = {"RuntimeError", "ValueError", "TypeError", "KeyError",
                           "IndexError", "NotImplementedError", "AttributeError"}


def _head(message, limit=400):
    """The message's first lines, joined, paths masked."""
    text = " | ".join(line.strip() for line in (message or "").splitlines() if line.strip())
    return re.sub(r"/\S*/(tmp|fuzz)\S*", "<PATH>", text)[:limit]


def _normalise(text):
    text = re.sub(r"\bn\d+\b", "N", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", text)
    return text


def compare_program(prog, ours, up):
    """List of differences {check, class, details} for one program."""
    sys.path.insert(0, HERE)
    import compat
    diffs = []

    def add(check, signature, details):
        diffs.append({"check": check, "class": "%s: %s" % (check, signature),
                      "details": details})

    if ours is None or up is None:
        add("harness", "no result from %s" % ("ours" if ours is None else "upstream"), [])
        return diffs
    o_out = "ok" if ours["ok"] else ours["exc_type"]
    u_out = "ok" if up["ok"] else up["exc_type"]
    # Deliberate departure (docs/compatibility.md, "Exception types"): where
    # upstream raises a bare Exception, ours raises a built-in subclass of it.
    if u_out == "Exception" and o_out in SUBCLASSES_OF_EXCEPTION:
        u_out = o_out
    if o_out != u_out:
        add("outcome", "ours %s, upstream %s" % (o_out, u_out),
            ["ours: %s" % _head(ours["message"]) if not ours["ok"] else "ours: ok",
             "upstream: %s" % _head(up["message"]) if not up["ok"] else "upstream: ok"])
        return diffs
    if not ours["ok"]:
        theirs, mine = _first_line(up["message"]), _first_line(ours["message"])
        head = theirs[:80]
        if head not in _first_line(ours["message"]) and head not in ours["message"]:
            add("message", "%s: %s" % (u_out, _normalise(theirs[:60])),
                ["upstream: " + theirs, "ours: " + mine])
        return diffs
    if ours["compile"] != up["compile"]:
        add("compile", "ours %s, upstream %s" % (_normalise(json.dumps(ours["compile"])),
                                                   _normalise(json.dumps(up["compile"]))),
            ["ours %s" % ours["compile"], "upstream %s" % up["compile"]])
    ya, yb = ours["yaml"], up["yaml"]
    try:
        ydiffs = compat.compare_yaml(ya, yb)
    except Exception as exc:  # noqa: BLE001
        ydiffs = ["could not compare: %s: %s" % (type(exc).__name__, exc)]
    try:
        idiffs, _ = compat.compare_initial_values(ya, yb)
    except Exception as exc:  # noqa: BLE001
        idiffs = ["could not compare initial values: %s: %s" % (type(exc).__name__, exc)]
    ydiffs += idiffs
    if ydiffs:
        sig = sorted({_normalise(d.split(": ")[0]) + ": " + _yaml_kind(d) for d in ydiffs})
        add("yaml", "; ".join(sig[:3]), ydiffs)
    rdiffs = _compare_replay(ours, up)
    if rdiffs:
        add("replay", rdiffs[0][0], [d[1] for d in rdiffs])
    return diffs


def _yaml_kind(d):
    if "keys differ" in d:
        return "keys differ"
    if "entries in ours" in d:
        return "entry count"
    if "digest" in d:
        return "digest"
    if "initial value" in d:
        return "initial values"
    return "value"


def _compare_replay(ours, up):
    import torch
    from safetensors.torch import load_file
    ro, ru = ours.get("replay") or {}, up.get("replay") or {}
    if not ro.get("ok") or not ru.get("ok"):
        if ro.get("ok") == ru.get("ok"):
            return []  # both failed to replay: the YAML check says why
        side = "ours" if not ro.get("ok") else "upstream"
        err = (ro if side == "ours" else ru).get("error", "")
        return [("%s bundle fails in its InferenceManager: %s" % (side, err.split(":")[0]),
                 err[:400])]
    if ro["outputs"] != ru["outputs"]:
        return [("output keys differ", "ours %s, upstream %s" % (ro["outputs"], ru["outputs"]))]
    a = load_file(os.path.join(os.path.dirname(ours["yaml"]), "..", "replay.safetensors"))
    b = load_file(os.path.join(os.path.dirname(up["yaml"]), "..", "replay.safetensors"))
    out = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            out.append(("output missing", k))
            continue
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(("output dtype/shape differ", "%s: ours %s%s, upstream %s%s"
                        % (k, x.dtype, list(x.shape), y.dtype, list(y.shape))))
        elif not torch.allclose(x.double(), y.double(), rtol=TOL, atol=TOL, equal_nan=True):
            out.append(("output values differ", "%s: max abs diff %g" % (
                k, (x.double() - y.double()).abs().max().item())))
    return out


# --------------------------------------------------------------------------
# Driver

def _run_side(python, program_dir, out_dir, ours, log_path, timeout):
    sys.path.insert(0, HERE)
    import compat
    log = open(log_path, "w")
    proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", program_dir,
                             out_dir], stdout=log, stderr=subprocess.STDOUT,
                            cwd=out_dir, env=compat.clean_env(ours))
    return proc, log


def _collect(proc, log, out_dir, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def case_program(case_id: str) -> dict:
    """The generated program that shows the difference ``case_id`` (its entry's
    ``program``, "s<seed>_<index>", regenerated: the generator is deterministic)."""
    entry = next(e for e in KNOWN_DIFFERENCES + FIXED + DEPARTURES if e["id"] == case_id)
    seed, index = re.fullmatch(r"s(\d+)_(\d+)", entry["program"]).groups()
    return generate(int(seed), int(index))


def run(n, seed, ours, upstream, workdir, batch=25, timeout=1800, progress=None):
    """Generate `n` programs and compare them; returns the report dict."""
    return run_programs([generate(seed, i) for i in range(n)], ours, upstream, workdir,
                        batch=batch, timeout=timeout, progress=progress, seed=seed)


def run_programs(programs, ours, upstream, workdir, batch=25, timeout=1800, progress=None,
                 seed=None):
    """Compare the given programs (generate() dicts); returns the report dict."""
    n = len(programs)
    report = {"seed": seed, "tried": 0, "programs": {}, "differences": []}
    for start in range(0, n, batch):
        chunk = programs[start:start + batch]
        bdir = os.path.join(workdir, "batch%04d" % start)
        pdir = os.path.join(bdir, "programs")
        os.makedirs(pdir, exist_ok=True)
        for prog in chunk:
            with open(os.path.join(pdir, prog["id"] + ".py"), "w") as f:
                f.write(prog["source"])
        procs = {}
        for side, py in (("ours", ours), ("upstream", upstream)):
            out = os.path.join(bdir, side)
            os.makedirs(out, exist_ok=True)
            procs[side] = (out,) + _run_side(py, pdir, out, side == "ours",
                                             os.path.join(bdir, side + ".log"), timeout)
        res = {side: _collect(p, log, out, timeout) for side, (out, p, log) in procs.items()}
        for prog in chunk:
            _record(report, prog, res["ours"].get(prog["id"]),
                    res["upstream"].get(prog["id"]), os.path.join(pdir, prog["id"] + ".py"))
        if progress:
            progress("%d/%d programs, %d differences" % (
                report["tried"], n, len(report["differences"])))
    return report


def rescan(workdir, n, seed):
    """The report of a kept run (--keep DIR), compared again with this comparer."""
    report = {"seed": seed, "tried": 0, "programs": {}, "differences": []}
    programs = [generate(seed, i) for i in range(n)]
    results = {"ours": {}, "upstream": {}}
    for bdir in sorted(os.listdir(workdir)):
        for side in results:
            path = os.path.join(workdir, bdir, side, "results.json")
            if os.path.exists(path):
                with open(path) as f:
                    results[side].update(json.load(f))
    for prog in programs:
        o, u = results["ours"].get(prog["id"]), results["upstream"].get(prog["id"])
        if o is None or u is None:
            continue  # a batch still running (or killed): not compared
        _record(report, prog, o, u, "")
    return report


def _record(report, prog, o, u, path):
    report["tried"] += 1
    report["programs"][prog["id"]] = {
        "features": prog["features"],
        "ours": "ok" if o and o["ok"] else (o or {}).get("exc_type"),
        "upstream": "ok" if u and u["ok"] else (u or {}).get("exc_type")}
    for d in compare_program(prog, o, u):
        d["program"] = prog["id"]
        d["features"] = prog["features"]
        d["path"] = path
        d["source"] = prog["source"]
        why = explain(d)
        d["explained"] = why and {"id": why["id"], "kind": why["kind"],
                                  "reason": why["reason"]}
        report["differences"].append(d)


def summarise(report):
    """Text: programs tried, outcomes, and differences grouped by class."""
    lines = []
    progs = report["programs"]
    both_ok = sum(1 for p in progs.values() if p["ours"] == "ok" and p["upstream"] == "ok")
    lines.append("fuzz: seed %s, %d programs tried (%d compiled on both sides), "
                 "%d differences in %d programs" % (
                     report["seed"], report["tried"], both_ok, len(report["differences"]),
                     len({d["program"] for d in report["differences"]})))
    classes = {}
    for d in report["differences"]:
        key = ((d["explained"] or {}).get("id", ""), d["class"])
        classes.setdefault(key, []).append(d)
    for (_, cls), items in sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        why = items[0]["explained"]
        tag = ("[%s %s]" % (why["kind"], why["id"])) if why else "[UNEXPLAINED]"
        common = set(items[0]["features"])
        for d in items[1:]:
            common &= set(d["features"])
        lines.append("  %3d x %s %s" % (len(items), tag, cls))
        lines.append("        programs: %s" % ", ".join(d["program"] for d in items[:6]))
        if common:
            lines.append("        common features: %s" % ", ".join(sorted(common)))
        for det in items[0]["details"][:3]:
            lines.append("        - %s" % str(det)[:300].replace("\n", " | "))
    return "\n".join(lines)


def unexplained(report):
    return [d for d in report["differences"] if not d["explained"]]


def save_cases(report, dest):
    """Write the first program of each difference class to `dest`."""
    os.makedirs(dest, exist_ok=True)
    seen = set()
    written = []
    for d in report["differences"]:
        if d["class"] in seen:
            continue
        seen.add(d["class"])
        path = os.path.join(dest, d["program"] + ".py")
        with open(path, "w") as f:
            f.write(d["source"])
        written.append(path)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=2, metavar=("PROGRAM_DIR", "OUT_DIR"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=int(os.environ.get("FUZZ_N", 500)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", 1)))
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--upstream", metavar="VENV_OR_PYTHON")
    ap.add_argument("--ours", metavar="PYTHON", default=sys.executable)
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep everything")
    ap.add_argument("--json", metavar="FILE", help="write the report (no sources) as JSON")
    ap.add_argument("--save-cases", metavar="DIR",
                    help="write one program per difference class to DIR")
    ap.add_argument("--print", dest="print_id", metavar="ID",
                    help="print the source of program ID (sN_IIII) and exit")
    ap.add_argument("--rescan", metavar="DIR",
                    help="compare the results kept in DIR (--keep) again; --n and "
                         "--seed must be the run's")
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    if args.rescan:
        report = rescan(args.rescan, args.n, args.seed)
        print(summarise(report))
        if args.save_cases:
            for p in save_cases(report, args.save_cases):
                print("saved", p)
        return 1 if unexplained(report) else 0
    if args.print_id:
        m = re.fullmatch(r"s(\d+)_(\d+)", args.print_id)
        print(generate(int(m.group(1)), int(m.group(2)))["source"])
        return 0
    sys.path.insert(0, HERE)
    import compat
    upstream = compat.resolve_python(args.upstream) if args.upstream \
        else compat.find_upstream_python()
    ours = compat.resolve_python(args.ours)
    if not upstream or not ours:
        print("fuzz: no upstream interpreter (pass --upstream or set "
              "LEAPP_UPSTREAM_PYTHON)", file=sys.stderr)
        return 2
    workdir = args.keep or tempfile.mkdtemp(prefix="leapp-fuzz-")
    t0 = time.perf_counter()
    try:
        report = run(args.n, args.seed, ours, upstream, workdir, batch=args.batch,
                     progress=lambda s: print("fuzz: " + s, flush=True))
        print(summarise(report))
        print("fuzz: %.0fs" % (time.perf_counter() - t0))
        if args.save_cases:
            for p in save_cases(report, args.save_cases):
                print("saved", p)
        if args.json:
            slim = dict(report, differences=[{k: v for k, v in d.items() if k != "source"}
                                             for d in report["differences"]])
            with open(args.json, "w") as f:
                json.dump(slim, f, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if unexplained(report) else 0


if __name__ == "__main__":
    sys.exit(main())
