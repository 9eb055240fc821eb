"""Shared fixtures and helpers of test_state.py and test_feedback.py."""
from __future__ import annotations

import os
import types

import pytest
import torch
import yaml

import leapp
import leapp.compiling.compiler
from leapp import _core

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from support import upstream_python  # noqa: E402

UPSTREAM_PYTHON = upstream_python() or "/nonexistent/upstream-python"


def _flow_tuples(dumper: yaml.SafeDumper, value: tuple) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)


class _YamlFallback(types.ModuleType):
    """leapp._core with emit_yaml answered by PyYAML while the C emitter is a placeholder."""

    def __init__(self, core: types.ModuleType) -> None:
        super().__init__(core.__name__)
        self._real = core

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def emit_yaml(self, document):
        try:
            return self._real.emit_yaml(document)
        except NotImplementedError:
            dumper = type("FlowDumper", (yaml.SafeDumper,), {})
            dumper.add_representer(tuple, _flow_tuples)
            return "\n".join(yaml.dump(part, Dumper=dumper, sort_keys=False)
                             for part in document)


@pytest.fixture(autouse=True)
def leapp_session(monkeypatch):
    """No session leaks from one test into the next; YAML works on every branch."""
    monkeypatch.setattr(leapp.compiling.compiler, "_core", _YamlFallback(_core))
    yield
    if _core.is_tracing():
        leapp.stop()


def compile_quiet(**kwargs):
    leapp.stop()
    kwargs.setdefault("visualize", False)
    return leapp.compile_graph(**kwargs)


def load_yaml(bundle: str, graph: str) -> dict:
    with open(os.path.join(bundle, f"{graph}.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_initial(bundle: str, graph: str) -> dict | None:
    path = os.path.join(bundle, f"{graph}_initial_values.safetensors")
    if not os.path.exists(path):
        return None
    from safetensors.torch import load_file
    return load_file(path)


def node(name: str):
    return _core.nodes()[name]


def _load_model(path: str):
    """A callable taking and returning torch tensors: TorchScript or ONNX."""
    if not path.endswith(".onnx"):
        return torch.jit.load(path)
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def call(*args):
        feed = {n: a.detach().cpu().numpy() for n, a in zip(names, args)}
        return tuple(torch.from_numpy(o) for o in session.run(None, feed))

    return call


class ExportedPipeline:
    """Steps an exported TorchScript bundle the way a runtime would, from its YAML.

    Graph inputs come from the caller each step; data_flow routes outputs of
    the same step; feedback_flow routes the previous step's outputs, starting
    from the initial values file.
    """

    def __init__(self, bundle: str, graph: str) -> None:
        self.doc = load_yaml(bundle, graph)
        models = self.doc["models"]
        pipeline = self.doc["pipeline"]
        self.order = list(models)
        self.models = {n: _load_model(os.path.join(bundle, m["parameters"]["model_path"]))
                       for n, m in models.items()}
        self.inputs = {n: [p["name"] for p in m["inputs"]] for n, m in models.items()}
        self.outputs = {n: [p["name"] for p in m["outputs"]] for n, m in models.items()}
        self.data_flow = pipeline.get("data_flow") or {}
        self.feedback_flow = pipeline.get("feedback_flow") or {}
        self.state = dict(load_initial(bundle, graph) or {})

    def step(self, graph_inputs: dict) -> dict:
        values = dict(graph_inputs)
        values.update(self.state)
        produced: dict = {}
        for name in self.order:
            args = [values[f"{name}/{port}"] for port in self.inputs[name]]
            result = self.models[name](*args)
            result = result if isinstance(result, (tuple, list)) else (result,)
            for port, value in zip(self.outputs[name], result):
                key = f"{name}/{port}"
                produced[key] = value
                for target in self.data_flow.get(key, ()):
                    values[target] = value
        self.state = {target: produced[src] for src, targets in self.feedback_flow.items()
                      for target in targets}
        return produced
