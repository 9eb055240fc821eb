"""The ``model.py`` of every python-backend model in a repository from ``leapp triton``.

``leapp.triton`` copies this file verbatim into ``<model>/1/model.py`` next to
``leapp_model.json``, which says what to run:

* ``{"kind": "node", ...}``: one node of a feed-forward bundle, loaded by
  ``InferenceNode`` (the loader ``InferenceManager`` uses: checksum, confined
  path, pt2 never unpickled) from the model file copied beside this one;
* ``{"kind": "sequence", ...}``: the fused model of a bundle with feedback,
  run by ``leapp.fusion.FusedModel``.  Triton's python backend does not carry
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
        if self.kind == "node":
            from leapp.inference_manager import InferenceNode
            self.node = InferenceNode(self.spec["node"], self.spec["description"], here)
        else:
            from leapp.fusion import FusedModel
            self.model = FusedModel(os.path.join(here, self.spec["model_file"]),
                                    providers=["CPUExecutionProvider"])
            self.states: dict[int, dict[str, torch.Tensor]] = {}

    def execute(self, requests: list) -> list:
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

    def finalize(self) -> None:
        self.states = {}
