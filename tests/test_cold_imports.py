"""What a one-shot export process imports: torch's exporters only for the nodes that use
them.

A fresh interpreter traces a pipeline and compiles it with ``compile_graph()``'s defaults
(validation, the PNG, the HTML view), then prints the heavy modules it imported.  A
TorchScript-only pipeline never imports torch.onnx, the dynamo compiler, torch.export's
tracer, onnxscript, onnx or onnxruntime; a torch.export node imports torch.export's tracer
(and with it torch._dynamo and torch.onnx: torch's own imports), never onnxscript, onnx or
onnxruntime (which also shows the probe sees the imports it looks for).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import ROOT

HEAVY = ("torch.onnx", "torch._dynamo", "torch.export._trace", "onnxscript", "onnx",
         "onnxruntime")

SCRIPT = """
import json, sys
import torch, leapp
from leapp import annotate
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ELU(), torch.nn.Linear(16, 4))
leapp.start("cold", save_path=sys.argv[1])
with torch.no_grad():
    for step in range(2):
        obs = annotate.input_tensors("norm", {"obs": torch.randn(1, 8)})
        x = annotate.output_tensors("norm", {"x": (obs - 0.5) * 2.0}, export_with="jit")
        x = annotate.input_tensors("actor", {"x": x})
        annotate.output_tensors("actor", {"action": mlp(x)}, export_with=sys.argv[2])
leapp.stop()
result = leapp.compile_graph()
assert all(v is True for v in result.values()), result
print(json.dumps(sorted(m for m in %r if m in sys.modules)))
""" % (HEAVY,)


def _imported(tmp_path, actor_backend: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TQDM_DISABLE="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), actor_backend],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_torchscript_pipeline_imports_no_torch_exporter_nor_onnx(tmp_path):
    assert _imported(tmp_path, "jit-trace") == []


def test_a_torch_export_node_imports_torch_exports_tracer_only(tmp_path):
    imported = _imported(tmp_path, "pt2")
    assert "torch.export._trace" in imported  # with the dynamo compiler and torch.onnx it imports
    assert [m for m in imported if m in ("onnxscript", "onnx", "onnxruntime")] == []


def test_validation_imports_no_drawing():
    """compile_graph(visualize=False) validates without importing the drawing stage or PIL:
    its analytics are data of the bundle stage (leapp.bundle.analytics)."""
    code = ("import json, sys, leapp.compiling.validation; print(json.dumps(sorted(m for m in "
            "sys.modules if m == 'PIL' or m.startswith('leapp.drawing') or m == 'leapp.bundle.analytics')))")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["leapp.bundle.analytics"]
