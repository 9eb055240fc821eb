"""The one loader of exported model files: TorchScript, ONNX and torch.export.

:func:`load` turns a model file into ``(model, call, device)``; every reader
goes through it: ``InferenceManager``'s nodes (and with them the Triton
python-backend models) and validation through :func:`load_node`, which first
confines the bundle's path and checks its sha256, bring-your-own models at
compile time, and ``leapp.serving.fusion`` (the fused models, and the TorchScript
nodes it fuses).

Loading never unpickles: TorchScript archives go through ``torch.jit.load``'s
restricted unpickler, torch.export archives through
``leapp.bundle.pt2_reader.load_pt2`` (never ``torch.export.load``), and an ONNX
model's external-data files are checked before onnxruntime opens them.  See
``docs/safety.md``.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, Sequence

import torch

from ..bundle.log import fatal, reject
from ..bundle.pt2_reader import load_pt2
from ..bundle.safe_load import (BundleError, bundle_file_sha256, check_onnx_external_data, clip,
                                  quote)
from ..bundle.pipeline import Node
from .onnx_runner import OnnxRunner, default_providers  # noqa: F401  (the loaders' one door)

BACKENDS = ("jit", "onnx", "pt2")

# device -> onnxruntime providers, for a caller that names the device
_PROVIDERS = {"cpu": ["CPUExecutionProvider"],
              "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(backend: Any, path: str, *, input_names: Sequence[str] | None = None,
         outputs: Sequence[Any] | None = None, bundle_dir: str | None = None,
         allow_external_paths: bool = False, device: str | None = None,
         providers: list[str] | None = None) -> tuple[Any, Callable[..., Any], str]:
    """``(model, call, device)`` for the model file at ``path``.

    Args:
        backend: the YAML backend, ``"jit"``, ``"onnx"`` or ``"pt2"``.
        input_names: the node's inputs, in call order (ONNX feeds by name
            where it can); None: the ONNX session's own, by position.
        outputs: each output's shape and dtype (``leapp.bundle.pipeline.Port``
            objects or YAML entries), for ONNX I/O binding on CUDA.
        bundle_dir: the directory an ONNX model's external data must stay in
            (unless ``allow_external_paths``); None: the model file's own.
        device: ``"cpu"`` or ``"cuda"``; None: CUDA when available (for
            ONNX: when onnxruntime has its CUDA provider, with a warning
            when it falls back to CPU).
        providers: onnxruntime's providers, in preference order (ONNX only;
            overrides ``device``).

    ``call`` is what runs the model: the compiled ``forward`` of a TorchScript
    module (no ``nn.Module.__call__`` hooks), the torch.export module itself
    (its input-checking hooks stay), the ONNX runner.
    """
    if backend == "jit":
        # TorchScript archives are read by torch's restricted unpickler, which only
        # rebuilds tensors and TorchScript classes compiled from the archive's code:
        # no Python global can be named, so no Python code runs.
        device = device or default_device()
        model = torch.jit.load(path, map_location=device).to(device).eval()
        return model, model.forward, device
    if backend == "onnx":
        check_onnx_external_data(path, os.path.dirname(path) if bundle_dir is None
                                 else bundle_dir, allow_external_paths)
        if providers is None and device is not None:
            providers = _PROVIDERS[device]
        runner = OnnxRunner(path, input_names, outputs, providers)
        return runner, runner, runner.device
    if backend == "pt2":
        device = device or default_device()
        # never torch.export.load: it unpickles (see leapp.bundle.pt2_reader.load_pt2)
        model = load_pt2(path).module()
        if device != "cpu":
            model = model.to(device)
        return model, model, device
    reject(f"Unsupported backend: {clip(backend)}")


class Loaded(NamedTuple):
    """A bundle node's model: its confined path, the model, its call and its device."""

    path: str
    model: Any
    call: Callable[..., Any]
    device: str


def load_node(node: Node, bundle_dir: str, allow_external_paths: bool = False,
              device: str | None = None) -> Loaded:
    """Load one node of a bundle the way ``InferenceManager`` does.

    The backend must be one of :data:`BACKENDS`; the model path must stay
    inside ``bundle_dir`` (unless ``allow_external_paths``) and be a regular
    file, and its sha256 must match the YAML's.  A file that does not load
    raises a ``BundleError`` naming the node.
    """
    name, params = node.name, node.to_entry()["parameters"]  # plain values, as written
    backend, model_path = params["backend"], params["model_path"]
    if backend not in BACKENDS:
        if backend is None and model_path in (None, ""):
            _no_model_path(name)
        reject(f"Unsupported backend: {clip(backend)}")
    if model_path in (None, ""):
        _no_model_path(name)
    path, actual = bundle_file_sha256(bundle_dir, model_path,
                                      f"model file for node {quote(name)}", allow_external_paths)
    expected = params["sha256sum"]
    if expected != actual:
        reject(f"SHA256 checksum mismatch for {path}: expected {clip(expected)}, got {actual}")
    try:
        return Loaded(path, *load(backend, path, input_names=node.input_names,
                                  outputs=node.outputs, bundle_dir=bundle_dir,
                                  allow_external_paths=allow_external_paths, device=device))
    except BundleError as exc:  # the safe loaders' own refusals (already logged)
        raise BundleError(f"Node {quote(name)}: {exc}") from exc
    except Exception as exc:  # a corrupt or hostile file: one clear message
        fatal(f"Could not load the {backend} model of node {quote(name)} from "
              f"{quote(path)}: {type(exc).__name__}: {clip(' '.join(str(exc).split()), 400)}",
              BundleError)


def _no_model_path(name: str) -> None:
    reject(f"Node {quote(name)} has no model_path: it cannot run in InferenceManager. "
           "Export it with a backend (jit, onnx or pt2).")
