"""Differential fuzzer: random annotated pipelines, run under this package and
under upstream leapp 0.7.2, compared.

    python bench/fuzz.py [--n 500] [--seed 1] [--batch 25] [--keep DIR]
                         [--upstream VENV_OR_PYTHON] [--ours PYTHON] [--save-cases DIR]
    python bench/fuzz.py --print s7_0014                  (one program's source)
    python bench/fuzz.py --rescan DIR --n N --seed S      (compare a --keep run again)
    python bench/fuzz.py --writers [--n 300] [--seed 1]    (leapp's ONNX writer against
                                                          torch's exporter, below)
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
  steps on inputs seeded from the YAML's graph inputs, then from a fresh
  manager on step 0's inputs with NaN, +inf, -inf and large values at a third
  of the float positions and integers at their dtype's edges
  (``ADVERSARIAL``): same output keys, ``allclose(1e-5)`` values, NaN where
  the other side has NaN (the writers mode leaves the adversarial steps out:
  torch's exporter's models differ from eager on special values by design,
  and the writer's were held to eager on such inputs when they compiled).

Every difference gets a class (check plus a normalised signature); classes
matching ``KNOWN_DIFFERENCES`` (bugs being fixed: shrink the list as fixes
land) or ``DEPARTURES`` (deliberate, see docs/compatibility.md) are
reported as such.  Exit status 1 when an unexplained difference remains,
2 when the run could not start.

``--writers`` compares the two ONNX writers instead: both sides run this
package, side "writer" with leapp's ONNX writer, side "torch" with
LEAPP_ONNX_WRITER=torch (torch's exporter for every node).  Its programs
("w<seed>_<index>") are the plain ones with every node's backend redrawn
from ``WRITER_BACKENDS`` and half of the nodes' op groups from
bench/fuzz_onnx_ops.py (the writer's rules the catalogue leaves out).
Compared: outcome and error line, compile result, the YAML text
(byte-identical but for digests) and initial values, each ONNX file's
interface (opsets, input and output names, element types, shapes,
metadata_props), who wrote each file, the writer's fallbacks to
torch's exporter (each one a difference: the goal is none), and the replays
(same keys, dtypes and shapes, values within ``WRITER_RTOL`` /
``WRITER_ATOL``).  Explained differences: ``WRITER_DIFFERENCES``.
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
# The writers mode's op groups beyond the catalogue (pasted after it).
ONNX_OPS = os.path.join(HERE, "fuzz_onnx_ops.py")
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

# Writers mode (--writers): both sides are this package, side "writer" with leapp's
# ONNX writer, side "torch" with WRITER_ENV=torch (torch's exporter for every
# node); every node exports with one of WRITER_BACKENDS, so every node goes
# through the writer on the writer's side ("onnx-torchscript" is torch's
# TorchScript exporter on both sides: nothing of the writer to compare).
WRITER_BACKENDS = ["onnx", "onnx-dynamo"]
# The share of nodes whose op group is redrawn from bench/fuzz_onnx_ops.py (the
# writer's rules that tests/op_catalogue.py leaves out).
WRITER_NEW_GROUPS = 0.5
WRITER_ENV = "LEAPP_ONNX_WRITER"
# Both sides' bundles replay the same inputs: identical dtypes and shapes, and
# values within these (ONNX models of the same graph, one rounding apart).
WRITER_RTOL, WRITER_ATOL = 1e-5, 1e-6
# The two sides of each mode, as the comparer's lines and the tables name them.
SIDES = {"upstream": ("ours", "upstream"), "writers": ("writer", "torch")}
# What the writer's side logs for a node it sent to torch's exporter.
FALLBACK_RE = re.compile(r"\[(\w+)\] exported with torch's ONNX exporter: (.*?)"
                         r"(?: \(set \w+=torch to use it for every node\))?$", re.M)


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


# ---- WRITER_DIFFERENCES: the writers mode's explained differences -------
# Between leapp's ONNX writer and torch's exporter (both this package), each
# documented in docs/compatibility.md ("The two ONNX writers") with its reason.
# An entry: id, program (a writers-mode program, "w<seed>_<index>"),
# check, optional features (all must be the program's), class (a regex searched in
# the class), writer / torch (regexes on that side's line), details (a regex every
# detail line must match), source (a regex the program's source must match),
# max_abs (a bound on every replayed output's max abs diff), reason.
# The float16 ops of bench/fuzz_onnx_ops.py whose result torch's exporter computes in
# float32 (a program that uses one of them as an output).
_FLOAT16_OPS = r"r\['(half_chain|half_add|softmax_half)'\]"
# The torch calls torch's dynamo exporter has no ONNX function for.
_TORCH_EXPORTER_LACKS = r"No ONNX function found for <OpOverload\(op='prims\.(hypot|signbit)'"

WRITER_DIFFERENCES: list[dict] = [
    {"id": "float16-rounding-kept", "program": "w1_0009", "check": "replay",
     "class": r"^replay: output values differ$", "source": _FLOAT16_OPS, "max_abs": 0.02,
     "reason": "float16 arithmetic cast back to float32 ((x.half() * 3.3).float(), "
               "(x.half() + y.half()).float(), F.softmax(x.half(), -1).float()): the "
               "writer rounds to float16 after each op as eager does; torch's exporter "
               "computes in float32, so its outputs are off eager's by float16's rounding "
               "(about 1e-3 relative), and so are the outputs computed from them "
               "(tests/test_onnx_writer.py holds the writer's to eager's)"},
    {"id": "float16-rounding-fails-torch-validation", "program": "w1_0049",
     "check": "outcome", "class": r"^outcome: writer ok, torch Exception$",
     "source": _FLOAT16_OPS, "writer": r"^ok$",
     "torch": r"^(Model validation failed for \d+ node|Closed-loop validation failed: "
              r"closed loop, step \d+: \S+ \((graph output|feedback value into \S+)\): "
              r"the bundle gives .* \(max abs difference \d\.\d+e-0[2-9]\))",
     "reason": "the float16 chains above: torch's exporter's float32 result is off "
               "eager's by more than validation allows on some traced samples, so its "
               "bundle fails leapp's validation; the writer's, rounded as eager, passes"},
    {"id": "torch-exporter-atan2-signed-zero", "program": "w2_0149", "check": "outcome",
     "class": r"^outcome: writer ok, torch Exception$", "source": r"r\['atan2'\]",
     "writer": r"^ok$", "torch": r"^Model validation failed for \d+ node",
     "reason": "torch.atan2 where y is a zero (a feedback input's zero initial value) and x "
               "is negative or a zero: eager gives +-pi by the zero's sign (atan2(0, -1) "
               "= pi, atan2(0, 0) = 0, atan2(0, -0) = pi); torch's exporter's model gives "
               "-pi for atan2(+0, -1) and 0 for atan2(0, -0), so its bundle fails leapp's "
               "validation; the writer's gives eager's"},
    {"id": "torch-exporter-atan2-signed-zero-replay", "program": "w11_0253",
     "check": "replay", "class": r"^replay: output values differ$",
     "source": r"r\['(atan2|yaw|heading)'\]", "details": r"max abs diff 6\.283\d*$",
     "reason": "the same atan2 branch cut met on the replay's inputs rather than the "
               "traced ones (a quaternion's yaw from integer-valued components, whose "
               "products are signed zeros): torch's exporter's model gives -pi where eager "
               "gives pi, 2 pi apart; the writer's gives eager's"},
    {"id": "torch-exporter-lacks-op", "program": "w1_0011", "check": "outcome",
     "class": r"^outcome: writer ok, torch ExportError$",
     "writer": r"^ok$", "torch": _TORCH_EXPORTER_LACKS,
     "reason": "torch.hypot and torch.copysign: torch's dynamo exporter has no ONNX "
               "function for prims.hypot / prims.signbit and the node fails to export; "
               "the writer writes both"},
    {"id": "torch-exporter-lacks-op-then-program-error", "program": "w1_0044",
     "check": "outcome", "class": r"^outcome: writer RuntimeError, torch ExportError$",
     "writer": r"^Error: unsupported use of sending the same tensor multiple times to the "
               r"same node",
     "torch": _TORCH_EXPORTER_LACKS,
     "reason": "torch's exporter fails on hypot / copysign (above) before compile_graph "
               "checks the wiring; the writer's side exports every node and reaches the "
               "program's own mistake (one tensor fed to two inputs of a node), refused "
               "with the same message as under upstream"},
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


def matches_writer(entry: dict, diff: dict) -> bool:
    """Whether the WRITER_DIFFERENCES entry explains the writers-mode ``diff``: its check,
    every feature it names, its class regex, each side's line it names, and its
    details regex on every detail line (so an output it does not explain, differing
    beside it, leaves the difference unexplained)."""
    if entry["check"] != diff["check"]:
        return False
    if not set(entry.get("features", [])) <= set(diff.get("features", [])):
        return False
    if entry.get("class") and not re.search(entry["class"], diff["class"]):
        return False
    for side in SIDES["writers"]:
        if side in entry:
            line = _side(diff, side)
            if line is None or not re.search(entry[side], line, re.S):
                return False
    if entry.get("details"):
        if not diff["details"] or not all(re.search(entry["details"], d)
                                          for d in diff["details"]):
            return False
    if entry.get("source") and not re.search(entry["source"], diff.get("source") or ""):
        return False
    if "max_abs" in entry:
        found = [re.search(r"max abs diff (\S+)$", d) for d in diff["details"]]
        if not found or not all(m and float(m.group(1)) <= entry["max_abs"] for m in found):
            return False
    return True


def explain(diff: dict) -> dict | None:
    """The KNOWN_DIFFERENCES or DEPARTURES entry explaining `diff`, if any (for a
    writers-mode difference: the WRITER_DIFFERENCES entry)."""
    if diff.get("sides") == list(SIDES["writers"]):
        for entry in WRITER_DIFFERENCES:
            if matches_writer(entry, diff):
                return dict(entry, kind="writer")
        return None
    for table, kind in ((DEPARTURES, "departure"), (KNOWN_DIFFERENCES, "known")):
        for entry in table:
            if matches(entry, diff):
                return dict(entry, kind=kind)
    return None


# --------------------------------------------------------------------------
# The op catalogue: groups of ops over (x, y) of shape (2, 3, 4)

def _catalogue(path=CATALOGUE, table="GROUPS"):
    """(source text to paste, {group: (carrier keys, extra keys)})."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_fuzz_" + os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch
    groups = {}
    for name, (inputs, fn) in getattr(mod, table).items():
        if inputs[0].shape != (2, 3, 4):
            continue  # the convolution group takes images
        outs = fn(*inputs)
        carriers = [k for k, v in outs.items()
                    if v.shape == (2, 3, 4) and v.dtype == torch.float32]
        extras = [k for k in outs if k not in carriers]
        if not carriers:
            continue  # nothing of the (2, 3, 4) float shape to chain on
        groups[name] = (sorted(carriers), sorted(extras))
    with open(path) as f:
        source = f.read()
    source = source.replace("from __future__ import annotations\n", "")
    return source, groups


_CAT = {}


def catalogue(writers=False):
    """The catalogue's (source, groups); with ``writers``, the writers mode's op groups
    (bench/fuzz_onnx_ops.py) instead."""
    key = "writers" if writers else "plain"
    if key not in _CAT:
        _CAT[key] = _catalogue(ONNX_OPS, "ONNX_GROUPS") if writers else _catalogue()
    return _CAT[key]


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


def generate(seed: int, index: int, writers: bool = False) -> dict:
    """One program: {"id", "seed", "index", "features", "source"}.

    With ``writers`` (the writers mode) the program is the one of the same seed and
    index with every node's backend redrawn from WRITER_BACKENDS (a stream of its
    own, so the rest of the program is unchanged); its id starts with "w"."""
    source, groups = catalogue()
    rng = random.Random("%d/%d" % (seed, index))
    n_nodes = rng.choice([1, 2, 2, 3, 3, 4])
    passes = rng.choice([1, 2, 2, 3])
    no_grad = rng.random() < 0.7
    nodes = [Node(i, rng, groups, n_nodes, passes) for i in range(n_nodes)]
    extra_source = None
    if writers:
        extra_source, extra = catalogue(writers=True)
        every = dict(groups, **extra)
        writer_rng = random.Random("%d/%d/writers" % (seed, index))
        for node in nodes:
            node.backend = writer_rng.choice(WRITER_BACKENDS)
            if writer_rng.random() < WRITER_NEW_GROUPS:
                node.group = writer_rng.choice(sorted(extra))
                carriers, extras = every[node.group]
                node.carrier = writer_rng.choice(carriers)
                node.extras = [k for k in writer_rng.sample(extras + carriers,
                                                            writer_rng.choice([0, 1, 2]))
                               if k != node.carrier]
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
    pid = "%s%d_%04d" % ("w" if writers else "s", seed, index)
    lines = [
        '"""leapp fuzz program %s (seed %d, index %d).' % (pid, seed, index),
        "",
        "Features: %s." % ", ".join(features),
        ("Run as-is, with and without LEAPP_ONNX_WRITER=torch: python %s.py OUT_DIR"
         if writers else "Run as-is under either leapp: python %s.py OUT_DIR") % pid,
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
    ]
    if extra_source:
        lines += ["# ---- bench/fuzz_onnx_ops.py, pasted " + "-" * 39,
                  extra_source.rstrip(),
                  "# ---- end of the writers' op groups " + "-" * 39]
    lines += [
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
    if info["ok"]:
        info["adversarial"] = _replay_adversarial(yaml_path, steps.get(0, {}), tensors)
    save_file(tensors, out_path)
    return info


#: The adversarial replay steps: step 0's inputs with these values at a third of the
#: float positions, or integers at their dtype's edges (fed after the plain steps, so
#: a NaN in fed-back state reaches no plain step).
ADVERSARIAL = ("nan", "+inf", "-inf", "large", "int-edges")


def _adversarial(value, kind):
    import torch
    v = value.clone()
    flat = v.reshape(-1)
    if kind == "int-edges":
        if v.is_floating_point() or v.dtype == torch.bool:
            return v
        info = torch.iinfo(v.dtype)
        flat[0::2] = info.max
        flat[1::2] = info.min
        return v
    if not v.is_floating_point():
        return v
    fill = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf"),
            "large": 6.0e4 if v.dtype == torch.float16 else 1.0e30}[kind]
    flat[0::3] = fill
    return v


def _replay_adversarial(yaml_path, first, tensors):
    """Each adversarial kind's outputs ("a<kind>|<output>") from a fresh manager; a kind
    the bundle raises on is recorded as "<kind>: <error>" (both sides are compared)."""
    import torch
    from leapp import InferenceManager
    errors = []
    for kind in ADVERSARIAL:
        fed = {k: _adversarial(v, kind) for k, v in first.items()}
        if all(torch.equal(fed[k], first[k]) for k in first):
            continue
        try:
            manager = InferenceManager(yaml_path)
            with torch.no_grad():
                outputs = manager.run_policy(fed)
            for name, value in outputs.items():
                tensors["a%s|%s" % (kind, name)] = value.detach().cpu().clone().contiguous()
        except Exception as exc:  # noqa: BLE001 - compared: raising is an outcome
            errors.append("%s: %s" % (kind, type(exc).__name__))
    return errors


def _onnx_files(yaml_path):
    """{file: what the comparer checks of each ONNX model in the bundle}: its producer
    (leapp's writer or torch's exporter) and its interface (opsets, inputs and outputs
    with element types and shapes, metadata_props)."""
    import onnx
    info = {}
    bundle = os.path.dirname(yaml_path)
    for fname in sorted(os.listdir(bundle)):
        if not fname.endswith(".onnx"):
            continue
        model = onnx.load(os.path.join(bundle, fname), load_external_data=False)

        def ports(values):
            return [[v.name, v.type.tensor_type.elem_type,
                     [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]]
                    for v in values]

        info[fname] = {
            "producer": model.producer_name,
            "interface": {"opsets": sorted([o.domain, o.version] for o in model.opset_import),
                          "inputs": ports(model.graph.input),
                          "outputs": ports(model.graph.output),
                          "metadata_props": sorted([p.key, p.value]
                                                   for p in model.metadata_props)}}
    return info


def _fallbacks(yaml_path):
    """[[node, reason]] for each node the writer sent to torch's exporter, from log.txt."""
    path = os.path.join(os.path.dirname(yaml_path), "log.txt")
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return [[m.group(1), m.group(2)] for m in FALLBACK_RE.finditer(f.read())]


def worker(program_dir, out_dir, writers=False):
    """Run every program of program_dir; results.json in out_dir.  With ``writers``
    the warnings stay on (log.txt names the writer's fallbacks) and each bundle's ONNX
    files and fallbacks are recorded too."""
    import logging
    import runpy
    logging.disable(logging.INFO if writers else logging.CRITICAL)
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
        if writers and rec["ok"] and rec["yaml"] and os.path.exists(rec["yaml"]):
            try:
                rec["onnx"] = _onnx_files(rec["yaml"])
            except Exception as exc:  # noqa: BLE001 - reported to the comparer
                rec["onnx"] = {"?": {"error": "%s: %s" % (type(exc).__name__, exc)}}
            rec["fallbacks"] = _fallbacks(rec["yaml"])
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


def compare_program(prog, ours, up, mode="upstream"):
    """List of differences {check, class, details} for one program (``mode``
    "writers": ``ours`` is the writer's side, ``up`` torch's exporter's)."""
    if mode == "writers":
        return compare_writers(prog, ours, up)
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


def _compare_replay(ours, up, sides=SIDES["upstream"], rtol=TOL, atol=TOL, adversarial=True):
    """[(class, detail)] between the two sides' replays (``sides``: their labels);
    adversarial=False leaves out the adversarial steps ("a<kind>|..." keys)."""
    import torch
    from safetensors.torch import load_file
    first, second = sides
    ro, ru = ours.get("replay") or {}, up.get("replay") or {}
    if not ro.get("ok") or not ru.get("ok"):
        if ro.get("ok") == ru.get("ok"):
            return []  # both failed to replay: the YAML check says why
        side = first if not ro.get("ok") else second
        err = (ro if side == first else ru).get("error", "")
        return [("%s bundle fails in its InferenceManager: %s" % (side, err.split(":")[0]),
                 err[:400])]
    if ro["outputs"] != ru["outputs"]:
        return [("output keys differ", "%s %s, %s %s" % (first, ro["outputs"], second,
                                                         ru["outputs"]))]
    a = load_file(os.path.join(os.path.dirname(ours["yaml"]), "..", "replay.safetensors"))
    b = load_file(os.path.join(os.path.dirname(up["yaml"]), "..", "replay.safetensors"))
    if not adversarial:
        a = {k: v for k, v in a.items() if k[:1].isdigit()}
        b = {k: v for k, v in b.items() if k[:1].isdigit()}
    elif ro.get("adversarial") != ru.get("adversarial"):
        return [("adversarial replay raises on one side", "%s %s, %s %s" % (
            first, ro.get("adversarial"), second, ru.get("adversarial")))]
    return compare_tensors(a, b, sides, rtol, atol)


def compare_tensors(a, b, sides=SIDES["upstream"], rtol=TOL, atol=TOL):
    """[(class, detail)] between two replays ({"step|output": tensor}): a key on one
    side only, a dtype or shape that differs, values not allclose(rtol, atol)."""
    import torch
    first, second = sides
    out = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            out.append(("output missing", "%s: only %s has it" % (k, first if k in a
                                                                   else second)))
            continue
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(("output dtype/shape differ", "%s: %s %s%s, %s %s%s"
                        % (k, first, x.dtype, list(x.shape), second, y.dtype,
                           list(y.shape))))
        elif not torch.allclose(x.double(), y.double(), rtol=rtol, atol=atol,
                                equal_nan=True):
            out.append(("output values differ", "%s %s: max abs diff %g" % (
                k, x.dtype, (x.double() - y.double()).abs().max().item())))
    return out


def compare_writers(prog, a, b):
    """The writers mode's differences for one program: ``a`` ran with leapp's ONNX
    writer, ``b`` with torch's exporter for every node (the same package).

    Checks: outcome (ok, or the exception type), the error's first line, the compile
    result, the YAML text (digests masked: byte-identical otherwise) and the initial
    values, each ONNX file's interface (opsets, names, element types, shapes,
    metadata_props), who wrote each file (the writer on a's side, torch on b's), the
    writer's fallbacks (each one a difference: the goal is none), and the replayed
    outputs (same keys, dtypes and shapes; values within WRITER_RTOL / WRITER_ATOL)."""
    sys.path.insert(0, HERE)
    import compat
    first, second = SIDES["writers"]
    diffs = []

    def add(check, signature, details):
        diffs.append({"check": check, "class": "%s: %s" % (check, signature),
                      "details": details, "sides": [first, second]})

    if a is None or b is None:
        add("harness", "no result from %s" % (first if a is None else second), [])
        return diffs
    a_out = "ok" if a["ok"] else a["exc_type"]
    b_out = "ok" if b["ok"] else b["exc_type"]
    if a_out != b_out:
        add("outcome", "%s %s, %s %s" % (first, a_out, second, b_out),
            ["%s: %s" % (first, "ok" if a["ok"] else _head(a["message"])),
             "%s: %s" % (second, "ok" if b["ok"] else _head(b["message"]))])
        return diffs
    if not a["ok"]:
        la, lb = _first_line(a["message"]), _first_line(b["message"])
        if la != lb:
            add("message", "%s: %s" % (a_out, _normalise(lb[:60])),
                ["%s: %s" % (first, la), "%s: %s" % (second, lb)])
        return diffs
    if a["compile"] != b["compile"]:
        add("compile", "%s %s, %s %s" % (first, _normalise(json.dumps(a["compile"])), second,
                                         _normalise(json.dumps(b["compile"]))),
            ["%s %s" % (first, a["compile"]), "%s %s" % (second, b["compile"])])
    try:
        ydiffs = ["%s %s" % ({"+": first, "-": second}[d[0]], d[1:])
                  for d in compat.text_diff_lines(a["yaml"], b["yaml"])]
    except Exception as exc:  # noqa: BLE001
        ydiffs = ["could not compare: %s: %s" % (type(exc).__name__, exc)]
    try:
        idiffs, _ = compat.compare_initial_values(a["yaml"], b["yaml"])
        idiffs = [re.sub(r"\bupstream\b", second, re.sub(r"\bours\b", first, d))
                  for d in idiffs]
    except Exception as exc:  # noqa: BLE001
        idiffs = ["could not compare initial values: %s: %s" % (type(exc).__name__, exc)]
    if ydiffs or idiffs:
        kinds = (["text"] if ydiffs else []) + (["initial values"] if idiffs else [])
        add("yaml", " and ".join(kinds), ydiffs + idiffs)
    fa, fb = a.get("onnx") or {}, b.get("onnx") or {}
    if sorted(fa) != sorted(fb):
        add("onnx", "files differ", ["%s %s" % (first, sorted(fa)),
                                     "%s %s" % (second, sorted(fb))])
    for fname in sorted(set(fa) & set(fb)):
        ia, ib = fa[fname].get("interface"), fb[fname].get("interface")
        if ia != ib:
            keys = [k for k in sorted(set(ia or {}) | set(ib or {}))
                    if (ia or {}).get(k) != (ib or {}).get(k)]
            add("onnx", "interface differs: %s" % ", ".join(keys) if keys else "unreadable",
                ["%s: %s %s" % (first, fname, {k: (ia or {}).get(k) for k in keys} or fa[fname]),
                 "%s: %s %s" % (second, fname, {k: (ib or {}).get(k) for k in keys}
                                or fb[fname])])
    # Who wrote each file: the writer on its side (else a fallback), torch on the other.
    fallbacks = {node: why for node, why in a.get("fallbacks") or []}
    for node, why in sorted(fallbacks.items()):
        op = re.match(r"no ONNX rule for (\S+)", why)
        add("fallback", op.group(1) if op else _normalise(why[:60]),
            ["%s: %s: %s" % (first, node, why), "%s: not asked" % second])
    for fname, info in sorted(fa.items()):
        node = fname[:-len(".onnx")]
        if info.get("producer") != "leapp" and node not in fallbacks:
            add("producer", "%s file not written by the writer, no fallback logged" % first,
                ["%s: %s written by %r" % (first, fname, info.get("producer")),
                 "%s: -" % second])
    for fname, info in sorted(fb.items()):
        if info.get("producer") == "leapp":
            add("producer", "%s file written by the writer under %s=torch" % (second,
                                                                              WRITER_ENV),
                ["%s: -" % first, "%s: %s written by 'leapp'" % (second, fname)])
    # the adversarial steps are left out here: torch's exporter's models differ from
    # eager on special values by design (docs/compatibility.md), and the writer's side
    # was held to eager on such inputs when it compiled (its fresh-input check)
    rdiffs = _compare_replay(a, b, (first, second), WRITER_RTOL, WRITER_ATOL,
                             adversarial=False)
    if rdiffs:
        add("replay", rdiffs[0][0], [d[1] for d in rdiffs])
    return diffs


# --------------------------------------------------------------------------
# Driver

def _run_side(python, program_dir, out_dir, env, log_path, writers=False):
    log = open(log_path, "w")
    argv = [python, os.path.abspath(__file__), "--worker", program_dir, out_dir]
    if writers:
        argv.append("--worker-writers")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=out_dir, env=env)
    return proc, log


def side_envs(mode):
    """{side: the worker's environment} for the mode's two sides."""
    sys.path.insert(0, HERE)
    import compat
    first, second = SIDES[mode]
    if mode == "writers":
        a, b = compat.clean_env(True), compat.clean_env(True)
        a.pop(WRITER_ENV, None)  # the writer, whatever the caller's environment says
        b[WRITER_ENV] = "torch"
        return {first: a, second: b}
    return {first: compat.clean_env(True), second: compat.clean_env(False)}


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
    entry = next(e for e in KNOWN_DIFFERENCES + FIXED + DEPARTURES + WRITER_DIFFERENCES
                 if e["id"] == case_id)
    return program_by_id(entry["program"])


def program_by_id(pid: str) -> dict:
    """The generated program "s<seed>_<index>" (or "w<seed>_<index>", writers mode)."""
    kind, seed, index = re.fullmatch(r"([sw])(\d+)_(\d+)", pid).groups()
    return generate(int(seed), int(index), writers=kind == "w")


def run(n, seed, ours, upstream, workdir, batch=25, timeout=1800, progress=None,
        mode="upstream"):
    """Generate `n` programs and compare them; returns the report dict.  In the
    writers mode both sides run `ours` (`upstream` is not used)."""
    return run_programs([generate(seed, i, writers=mode == "writers") for i in range(n)],
                        ours, upstream, workdir, batch=batch, timeout=timeout,
                        progress=progress, seed=seed, mode=mode)


def run_programs(programs, ours, upstream, workdir, batch=25, timeout=1800, progress=None,
                 seed=None, mode="upstream"):
    """Compare the given programs (generate() dicts); returns the report dict."""
    n = len(programs)
    report = {"seed": seed, "mode": mode, "tried": 0, "programs": {}, "differences": []}
    first, second = SIDES[mode]
    pythons = {first: ours, second: ours if mode == "writers" else upstream}
    envs = side_envs(mode)
    for start in range(0, n, batch):
        chunk = programs[start:start + batch]
        bdir = os.path.join(workdir, "batch%04d" % start)
        pdir = os.path.join(bdir, "programs")
        os.makedirs(pdir, exist_ok=True)
        for prog in chunk:
            with open(os.path.join(pdir, prog["id"] + ".py"), "w") as f:
                f.write(prog["source"])
        procs = {}
        for side in (first, second):
            out = os.path.join(bdir, side)
            os.makedirs(out, exist_ok=True)
            procs[side] = (out,) + _run_side(pythons[side], pdir, out, envs[side],
                                             os.path.join(bdir, side + ".log"),
                                             writers=mode == "writers")
        res = {side: _collect(p, log, out, timeout) for side, (out, p, log) in procs.items()}
        for prog in chunk:
            _record(report, prog, res[first].get(prog["id"]), res[second].get(prog["id"]),
                    os.path.join(pdir, prog["id"] + ".py"), mode)
        if progress:
            progress("%d/%d programs, %d differences" % (
                report["tried"], n, len(report["differences"])))
    return report


def rescan(workdir, n, seed, mode="upstream"):
    """The report of a kept run (--keep DIR), compared again with this comparer."""
    report = {"seed": seed, "mode": mode, "tried": 0, "programs": {}, "differences": []}
    programs = [generate(seed, i, writers=mode == "writers") for i in range(n)]
    first, second = SIDES[mode]
    results = {first: {}, second: {}}
    for bdir in sorted(os.listdir(workdir)):
        for side in results:
            path = os.path.join(workdir, bdir, side, "results.json")
            if os.path.exists(path):
                with open(path) as f:
                    results[side].update(json.load(f))
    for prog in programs:
        o, u = results[first].get(prog["id"]), results[second].get(prog["id"])
        if o is None or u is None:
            continue  # a batch still running (or killed): not compared
        _record(report, prog, o, u, "", mode)
    return report


def _record(report, prog, o, u, path, mode="upstream"):
    first, second = SIDES[mode]
    report["tried"] += 1
    report["programs"][prog["id"]] = {
        "features": prog["features"],
        first: "ok" if o and o["ok"] else (o or {}).get("exc_type"),
        second: "ok" if u and u["ok"] else (u or {}).get("exc_type")}
    if mode == "writers":
        report["programs"][prog["id"]]["fallbacks"] = (o or {}).get("fallbacks") or []
        report["programs"][prog["id"]]["onnx_files"] = len((o or {}).get("onnx") or {})
    for d in compare_program(prog, o, u, mode):
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
    mode = report.get("mode", "upstream")
    first, second = SIDES[mode]
    both_ok = sum(1 for p in progs.values() if p[first] == "ok" and p[second] == "ok")
    lines.append("fuzz%s: seed %s, %d programs tried (%d compiled on both sides), "
                 "%d differences in %d programs" % (
                     " --writers" if mode == "writers" else "",
                     report["seed"], report["tried"], both_ok, len(report["differences"]),
                     len({d["program"] for d in report["differences"]})))
    if mode == "writers":
        fell = [(pid, node) for pid, p in sorted(progs.items())
                for node, _ in p.get("fallbacks", [])]
        lines.append("  ONNX models written on the writer's side: %d; fell back to torch's "
                     "exporter: %d%s" % (
                         sum(p.get("onnx_files", 0) for p in progs.values()), len(fell),
                         (" (%s)" % ", ".join("%s/%s" % f for f in fell[:8])) if fell else ""))
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
    ap.add_argument("--worker-writers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--writers", action="store_true",
                    help="compare leapp's ONNX writer with torch's exporter (both this "
                         "package, %s=torch on one side) instead of upstream" % WRITER_ENV)
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
        worker(*args.worker, writers=args.worker_writers)
        return 0
    mode = "writers" if args.writers else "upstream"
    if args.rescan:
        report = rescan(args.rescan, args.n, args.seed, mode)
        print(summarise(report))
        if args.save_cases:
            for p in save_cases(report, args.save_cases):
                print("saved", p)
        return 1 if unexplained(report) else 0
    if args.print_id:
        print(program_by_id(args.print_id)["source"])
        return 0
    sys.path.insert(0, HERE)
    import compat
    ours = compat.resolve_python(args.ours)
    if mode == "writers":
        upstream = None  # both sides are ours
        if not ours:
            print("fuzz: no interpreter at --ours %s" % args.ours, file=sys.stderr)
            return 2
    else:
        upstream = compat.resolve_python(args.upstream) if args.upstream \
            else compat.find_upstream_python()
    if mode == "upstream" and (not upstream or not ours):
        print("fuzz: no upstream interpreter (pass --upstream or set "
              "LEAPP_UPSTREAM_PYTHON)", file=sys.stderr)
        return 2
    workdir = args.keep or tempfile.mkdtemp(prefix="leapp-fuzz-")
    t0 = time.perf_counter()
    try:
        report = run(args.n, args.seed, ours, upstream, workdir, batch=args.batch,
                     progress=lambda s: print("fuzz: " + s, flush=True), mode=mode)
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
