"""Public behaviours that match upstream leapp 0.7.2, each run as one script under
this package and under upstream's interpreter (``compat.find_upstream_python()``,
skipped when there is none), their recorded results compared:

* ``update_state`` before ``state_tensors``: our error starts with upstream's
  words (then names the node and the fix);
* the record of the written artifacts (``LEAPP export artifacts saved`` ...)
  reaches the application's handlers as upstream's does: logger ``leapp``,
  level ``SYSTEM`` (31, above WARNING, so ``basicConfig(level=WARNING)`` still
  shows it), the same lines, and none for a dry run;
* under ``leapp.start(dry_run=True)`` an ``@annotate.method`` function returns
  upstream's kind of value: on the traced pass a ``TracedTensor`` (a
  ``torch.Tensor`` subclass) holding the eager values, the argument itself
  when the function returns it, a ``TracedTensor`` again from ``detach()``;
  on later passes the caller's tensors handed to an annotation come back
  themselves as TracedTensors (a function returning its argument returns one;
  a value once passed to a method reads as one), computed values are plain
  ``torch.Tensor``; the YAML wires the nodes alike.  Unlike upstream, stop()
  makes them plain again.

Each check is also run in this process, without upstream, so that the suite
checks these behaviours where no upstream interpreter is installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import leapp
from leapp import TracedTensor, annotate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

UPSTREAM = compat.find_upstream_python()
OURS = compat.resolve_python(os.environ.get("LEAPP_OURS_PYTHON") or sys.executable)

PRELUDE = '''
import json, logging, os, sys
import torch
OUT = sys.argv[1]
RESULT = {}


def finish():
    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump(RESULT, f, indent=1, sort_keys=True)
'''

SCRIPTS = {
    "update_state": '''
import leapp
from leapp import annotate
leapp.start("g", save_path=OUT)
errors = []
x = annotate.input_tensors("n", {"x": torch.ones(1, 2)})
try:
    annotate.update_state("n", {"h": x * 2})
except Exception as exc:
    errors.append(str(exc))
leapp.start("g2", save_path=OUT)
x = annotate.input_tensors("m", {"x": torch.ones(1, 2)})
h = annotate.state_tensors("m", {"h": torch.zeros(1, 2)})
try:
    annotate.update_state("m", {"c": x + h})
except Exception as exc:
    errors.append(str(exc))
RESULT["errors"] = errors
finish()
''',
    "artifacts_record": '''
class Recorder(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append([record.name, record.levelno, record.levelname,
                             record.getMessage().replace(OUT, "<OUT>")])

# as basicConfig(level=logging.WARNING) configures it
recorder = Recorder()
logging.getLogger().addHandler(recorder)
logging.getLogger().setLevel(logging.WARNING)
import leapp
from leapp import annotate
torch.manual_seed(0)
policy = torch.nn.Linear(3, 2)
for name, dry, skip in (("real", False, None), ("dry", True, None),
                        ("skipped", False, ["policy"])):
    leapp.start(name, save_path=OUT, dry_run=dry, non_traced=skip)
    obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
    annotate.output_tensors("policy", {"action": policy(obs)}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
RESULT["records"] = [r for r in recorder.records if "artifacts" in r[3]]
finish()
''',
    "dry_run_method": '''
import leapp
from leapp import annotate
torch.manual_seed(0)
lin = torch.nn.Linear(4, 2)


@annotate.method(node_name="policy")
def policy(obs):
    action = torch.tanh(lin(obs))
    return action


@annotate.method(node_name="ident")
def ident(obs):
    return obs


@annotate.method(node_name="pair")
def pair(action, obs):
    a = action * 2.0
    b = obs[:, :2] + action
    return a, b


leapp.start("g", save_path=OUT, dry_run=True)
steps = []
for step in range(2):
    x = torch.randn(1, 4)
    eager = torch.tanh(lin(x.detach().clone()))
    y = policy(x)
    record = {
        "policy": type(y).__name__,
        "policy_is_tensor": isinstance(y, torch.Tensor),
        "policy_values": torch.equal(y.detach().clone(), eager.detach()),
        "detach": type(y.detach()).__name__,
        "op_is_tensor": isinstance(y * 3.0, torch.Tensor),
    }
    x2 = torch.randn(1, 4)
    same = ident(x2)
    record["ident"] = type(same).__name__
    record["ident_values"] = torch.equal(same.detach().clone(), x2.detach().clone())
    a, b = pair(y, x)
    record["pair"] = [type(a).__name__, type(b).__name__]
    record["pair_values"] = torch.allclose(a.detach().clone(), eager.detach() * 2.0)
    # after y was passed to pair (a later pass: upstream promotes it in place)
    record["policy_after_passing"] = type(y).__name__
    steps.append(record)
leapp.stop()
leapp.compile_graph(visualize=False)
import yaml
with open(os.path.join(OUT, "g", "g.yaml")) as f:
    pipeline = yaml.safe_load(f)["pipeline"]
RESULT["steps"] = steps
RESULT["data_flow"] = pipeline.get("data_flow")
RESULT["models_written"] = sorted(n for n in os.listdir(os.path.join(OUT, "g"))
                                  if n.endswith((".pt", ".onnx", ".pt2")))
finish()
''',
}


def _script(tmp_path, name: str) -> str:
    path = os.path.join(str(tmp_path), f"{name}.py")
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(SCRIPTS[name]))
    return path


def _run(python: str, script: str, out: str, ours: bool) -> dict:
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run([python, script, out], capture_output=True, text=True, cwd=out,
                          env=compat.clean_env(ours), timeout=600)
    assert proc.returncode == 0, f"{'ours' if ours else 'upstream'} failed:\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(os.path.join(out, "result.json")) as f:
        return json.load(f)


def _ours(tmp_path, name: str) -> dict:
    return _run(OURS, _script(tmp_path, name), os.path.join(str(tmp_path), "ours"), True)


def _upstream(tmp_path, name: str) -> dict:
    return _run(UPSTREAM, _script(tmp_path, name), os.path.join(str(tmp_path), "upstream"),
                False)


needs_upstream = pytest.mark.skipif(UPSTREAM is None,
                                    reason="no upstream leapp 0.7.2 interpreter "
                                    "(LEAPP_UPSTREAM_PYTHON or .compat-venv)")

# ---- update_state before state_tensors -----------------------------------------------------

UPSTREAM_UPDATE_WORDS = ("Error: update_state called for '{name}' but it was not registered "
                         "as a state tensor. Call state_tensors() first.")


def test_update_state_before_state_tensors_names_the_node_and_fix(tmp_path):
    errors = _ours(tmp_path, "update_state")["errors"]
    assert len(errors) == 2
    for error, name, node in zip(errors, ("h", "c"), ("n", "m")):
        assert error.startswith(UPSTREAM_UPDATE_WORDS.format(name=name)), error
        assert f"Node '{node}' has no state '{name}'" in error
        assert f"annotate.state_tensors('{node}', {{'{name}': initial}})" in error


@needs_upstream
def test_update_state_before_state_tensors_starts_with_upstreams_words(tmp_path):
    ours = _ours(tmp_path, "update_state")["errors"]
    theirs = _upstream(tmp_path, "update_state")["errors"]
    assert len(ours) == len(theirs) == 2
    for mine, upstream in zip(ours, theirs):
        assert mine.startswith(upstream), (mine, upstream)
        assert len(mine) > len(upstream)  # our node and fix after it


# ---- the record of the written artifacts ---------------------------------------------------


def test_artifacts_record_passes_a_warning_threshold(tmp_path):
    records = _ours(tmp_path, "artifacts_record")["records"]
    # the dry run writes no record (as upstream); a non_traced node is named
    assert [r[:3] for r in records] == [["leapp", 31, "SYSTEM"]] * 2
    real, skipped = (r[3].splitlines() for r in records)
    assert real == ["LEAPP export artifacts saved:", "Export directory: <OUT>/real",
                    "Graph YAML: <OUT>/real/real.yaml", "Models:",
                    "- policy: <OUT>/real/policy.pt"]
    assert skipped == ["LEAPP export artifacts saved:", "Export directory: <OUT>/skipped",
                       "Graph YAML: <OUT>/skipped/skipped.yaml", "Models: none",
                       "Nodes without saved model artifacts: policy"]


@needs_upstream
def test_artifacts_record_reaches_the_handlers_as_upstreams(tmp_path):
    ours = _ours(tmp_path, "artifacts_record")["records"]
    theirs = _upstream(tmp_path, "artifacts_record")["records"]
    assert len(theirs) == 2
    assert ours == theirs


# ---- what a method returns under dry_run ---------------------------------------------------

EXPECTED_DRY_STEPS = [
    {"policy": "TracedTensor", "policy_is_tensor": True, "policy_values": True,
     "detach": "TracedTensor", "op_is_tensor": True, "ident": "TracedTensor",
     "ident_values": True, "pair": ["TracedTensor", "TracedTensor"], "pair_values": True,
     "policy_after_passing": "TracedTensor"},
    {"policy": "Tensor", "policy_is_tensor": True, "policy_values": True,
     "detach": "Tensor", "op_is_tensor": True, "ident": "TracedTensor", "ident_values": True,
     "pair": ["Tensor", "Tensor"], "pair_values": True,
     "policy_after_passing": "TracedTensor"},
]


def test_dry_run_method_returns_traced_tensors(tmp_path):
    result = _ours(tmp_path, "dry_run_method")
    assert result["steps"] == EXPECTED_DRY_STEPS
    assert result["data_flow"] == {"policy/action": ["pair/action"]}
    assert result["models_written"] == []


@needs_upstream
def test_dry_run_method_returns_what_upstream_returns(tmp_path):
    ours = _ours(tmp_path, "dry_run_method")
    theirs = _upstream(tmp_path, "dry_run_method")
    assert theirs["steps"] == EXPECTED_DRY_STEPS  # the expectation is upstream's
    assert ours == theirs


def test_dry_run_later_pass_tensors_are_plain_after_stop(tmp_path):
    """The caller's tensors a later dry-run pass made TracedTensors are plain again after
    stop() (upstream leaves them traced; docs/api.md: stop() leaves none behind)."""
    leapp.start("g", save_path=str(tmp_path), dry_run=True)
    kept = []
    try:
        for _ in range(2):
            x = torch.randn(1, 3)
            kept.append(x)
            y = annotate.input_tensors("n", {"x": x})
            annotate.output_tensors("n", {"y": y * 2.0})
        assert y is x and type(x) is TracedTensor
        assert type(x * 2.0) is torch.Tensor  # a finished node's value: ops run eagerly
    finally:
        leapp.stop()
    assert [type(t) for t in kept] == [torch.Tensor, torch.Tensor]
