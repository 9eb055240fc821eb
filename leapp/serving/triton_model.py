"""The ``model.py`` of every python-backend model in a repository from ``leapp triton``.

``leapp.serving.triton`` copies this file verbatim into ``<model>/1/model.py`` next to
``leapp_model.json``, which says what to run:

* ``{"kind": "node", ...}``: one node of a feed-forward bundle, loaded by
  ``InferenceNode`` (the loader ``InferenceManager`` uses: checksum, confined
  path, pt2 never unpickled) from the model file copied beside this one;
* ``{"kind": "fleet", ...}``: the batched fused model (``leapp.fuse(...,
  batch=True)``) under Triton's batching: every request of one ``execute()``
  (one robot each) goes into one onnxruntime run, one intra-op thread that does
  not spin.  With feedback, each robot's state (one row) is kept here by its
  ``CORRID``, as below; a robot beyond the configured fleet size is refused
  with an error at its first request instead of waiting;
* ``{"kind": "sequence", ...}``: the fused model of a bundle with feedback,
  run by ``leapp.serving.fusion.FusedModel``.  Triton's python backend does not carry
  the sequence batcher's implicit state, so the state of each sequence lives
  here, keyed by the ``CORRID`` control input: ``START`` puts the bundle's
  initial values back, ``END`` forgets the sequence after its step.

Tensors cross the python backend's stub through DLPack, never through NumPy:
the stub's NumPy bindings read NumPy 2 arrays wrongly (wrong strides, empty
outputs).  It runs in the stub's interpreter, so the environment that starts
``tritonserver`` must have leapp and torch installed (and onnxruntime for ONNX).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

# The stub's interpreter ignores PYTHONPATH (as with python -E); honour it here, so
# a leapp that is not installed in site-packages (a source checkout) is found too.
for _entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _entry and _entry not in sys.path:
        sys.path.insert(0, _entry)

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402  (Triton's python backend)
from torch.utils.dlpack import from_dlpack  # noqa: E402

SPEC_FILE = "leapp_model.json"


def _input(request: Any, name: str) -> torch.Tensor:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise pb_utils.TritonModelException(f"request carries no input {name!r}")
    return from_dlpack(tensor.to_dlpack())


def _output(name: str, value: torch.Tensor) -> Any:
    return pb_utils.Tensor.from_dlpack(name, value.detach().cpu().contiguous())


class TritonPythonModel:
    """One leapp node, or a fused pipeline with per-sequence state."""

    def initialize(self, args: dict) -> None:
        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, SPEC_FILE)) as handle:
            self.spec = json.load(handle)
        self.kind = self.spec["kind"]
        if self.kind == "fleet":
            self._fleet_init(os.path.join(here, self.spec["model_file"]))
        elif self.kind == "node":
            from leapp.running.inference_manager import InferenceNode
            self.node = InferenceNode(self.spec["node"], self.spec["description"], here)
        else:
            from leapp.serving.fusion import FusedModel
            self.model = FusedModel(os.path.join(here, self.spec["model_file"]),
                                    providers=["CPUExecutionProvider"])
            self.states: dict[int, dict[str, torch.Tensor]] = {}

    def execute(self, requests: list) -> list:
        if self.kind == "fleet":
            return self._fleet(requests)
        responses = []
        for request in requests:
            try:
                responses.append(self._node(request) if self.kind == "node"
                                 else self._sequence(request))
            except Exception as exc:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(
                        f"leapp {self.kind} {self.spec['name']!r}: {type(exc).__name__}: {exc}")))
        return responses

    def _node(self, request: Any) -> Any:
        node = self.node
        args = [_input(request, name).to(node.device) for name in node.input_names]
        with torch.no_grad():
            result = node(*args)
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        return pb_utils.InferenceResponse(
            [_output(name, value) for name, value in zip(node.output_names, values)])

    def _sequence(self, request: Any) -> Any:
        corrid = int(_input(request, "CORRID").reshape(-1)[0])
        start = bool(_input(request, "START").reshape(-1)[0])
        end = bool(_input(request, "END").reshape(-1)[0])
        model = self.model
        if start or corrid not in self.states:
            model.reset()
        else:
            model.state = self.states[corrid]
        outputs = model.step({name: _input(request, name) for name in model.input_names})
        if end:
            self.states.pop(corrid, None)
        else:
            self.states[corrid] = model.state
        # tensors carry the fused model's output names ("<node>/<port>", or
        # "<node>/<port>__out" where an input has that name); step() keys by the YAML's
        keys = getattr(model, "output_keys", model.output_names)
        return pb_utils.InferenceResponse(
            [_output(name, outputs[key]) for name, key in zip(model.output_names, keys)])

    # ---- the batched fused model: one onnxruntime run per execute() ----------------------

    def _fleet_init(self, path: str) -> None:
        import onnxruntime as ort

        from leapp.serving.batched import robot_major_shape
        from leapp.serving.fusion import initial_state, read_metadata
        metadata = read_metadata(path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_names = [p["name"] for p in metadata["inputs"]]
        self.output_names = [p["name"] for p in metadata["outputs"]]
        self.state_inputs = [s["input"] for s in metadata["state"]]
        self.initial = {name: value.numpy().reshape([1] + robot_major_shape(s))
                        for (name, value), s in zip(initial_state(metadata).items(),
                                                    metadata["state"])}
        self.fleet_size = int(self.spec["fleet_size"])
        self.states = {}

    def _error(self, message: str) -> Any:
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
            f"leapp fleet {self.spec['name']!r}: {message}"))

    def _fleet(self, requests: list) -> list:
        import numpy as np
        responses: list = [None] * len(requests)
        taken, rows, ends = [], [], []
        for i, request in enumerate(requests):
            try:
                feed = {name: _input(request, name).numpy() for name in self.input_names}
                if any(value.shape[0] != 1 for value in feed.values()):
                    raise ValueError("one robot per request: the leading dimension must be 1")
                if self.state_inputs:
                    corrid = int(_input(request, "CORRID").reshape(-1)[0])
                    start = bool(_input(request, "START").reshape(-1)[0])
                    if start or corrid not in self.states:
                        if corrid not in self.states and len(self.states) >= self.fleet_size:
                            raise RuntimeError(
                                f"the fleet is full: {self.fleet_size} robots are being "
                                "served (the repository's fleet size); end a robot's "
                                "sequence, or write the repository with a larger "
                                "--fleet-size")
                        self.states[corrid] = dict(self.initial)
                    feed.update(self.states[corrid])
                    ends.append(bool(_input(request, "END").reshape(-1)[0]))
                    rows.append(corrid)
                taken.append((i, feed))
            except Exception as exc:  # one bad request must not fail the others
                responses[i] = self._error(f"{type(exc).__name__}: {exc}")
        if taken:
            names = self.input_names + self.state_inputs
            feed = {name: np.concatenate([f[name] for _, f in taken]) for name in names}
            try:
                results = self.session.run(None, feed)
            except Exception as exc:
                for i, _ in taken:
                    responses[i] = self._error(f"{type(exc).__name__}: {exc}")
                return responses
            count = len(self.output_names)
            for k, (i, _) in enumerate(taken):
                responses[i] = pb_utils.InferenceResponse([
                    _output(name, torch.from_numpy(value[k:k + 1]))
                    for name, value in zip(self.output_names, results[:count])])
            for k, corrid in enumerate(rows):
                if ends[k]:
                    self.states.pop(corrid, None)
                else:
                    self.states[corrid] = {name: value[k:k + 1].copy() for name, value
                                           in zip(self.state_inputs, results[count:])}
        return responses

    def finalize(self) -> None:
        self.states = {}
