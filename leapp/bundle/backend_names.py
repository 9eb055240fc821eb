"""The backends names: what ``export_with`` accepts, the canonical name each
spelling stands for, the ``backend_params`` each accepts, and the check
``output_tensors`` runs on them while tracing (the exporters are in
leapp.compiling.backends).
"""
from __future__ import annotations

from typing import Any


# export_with -> canonical backend name
CANONICAL = {
    "jit": "jit-script",
    "jit-script": "jit-script",
    "jit-trace": "jit-trace",
    "onnx": "onnx-dynamo",
    "onnx-dynamo": "onnx-dynamo",
    "onnx-torchscript": "onnx-torchscript",
    "exported-program": "exported-program",
    "pt2": "exported-program",
}

# canonical name -> (module, accepted backend_params)
BACKENDS = {
    "jit-script": ("jit", frozenset()),
    "jit-trace": ("jit", frozenset({"check_trace", "check_tolerance", "strict"})),
    "onnx-dynamo": ("onnx", frozenset({"opset_version", "verify", "optimize", "report"})),
    "onnx-torchscript": ("onnx", frozenset({"opset_version", "report", "prescript"})),
    "exported-program": ("pt2", frozenset({"strict"})),
    None: ("byom", frozenset({"model_path", "copy_original_model", "device"})),
}


def canonical(node: str, export_with: str | None) -> str | None:
    """The canonical backend name, or a clear error listing the accepted values."""
    if export_with is None:
        return None
    if export_with in ("cpp", "c++"):
        raise NotImplementedError(f"{node}: C++ backend not implemented")
    if export_with in ("py", "python"):
        raise NotImplementedError(f"{node}: Python backend not implemented")
    name = CANONICAL.get(export_with) if isinstance(export_with, str) else None
    if name is None:
        raise ValueError(f"node {node!r}: unknown backend {export_with!r}"
                         f"{_did_you_mean(export_with)} (Unexpected backend: {export_with}; "
                         f"please use one of the following: {sorted(CANONICAL)}, or None to "
                         f"describe the node without exporting it)")
    return name


#: What users write for a backend that has another name here.
_ALIASES = {"torchscript": "jit", "script": "jit", "trace": "jit-trace", "traced": "jit-trace",
            "export": "pt2", "torch.export": "pt2", "exportedprogram": "pt2",
            "dynamo": "onnx", "onnx_dynamo": "onnx-dynamo", "torch.onnx": "onnx"}


def _did_you_mean(export_with: Any) -> str:
    """"; did you mean 'jit'?" for a near miss, else ""."""
    if not isinstance(export_with, str):
        return ""
    key = export_with.strip().lower()
    guess = _ALIASES.get(key) or (key if key in CANONICAL else None)
    if guess is None:
        import difflib
        close = difflib.get_close_matches(key, list(CANONICAL), n=1, cutoff=0.6)
        guess = close[0] if close else None
    return "" if guess is None else f"; did you mean {guess!r}?"


def check_backend(node: str, export_with: str | None, backend_params: dict | None) -> str | None:
    """Validate export_with and backend_params at output_tensors time."""
    name = canonical(node, export_with)
    params = backend_params or {}
    if not isinstance(params, dict):
        raise TypeError(f"{node}: backend_params must be a dict, got {type(params).__name__}")
    accepted = BACKENDS[name][1]
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(
            f"{node}: unknown backend_params {unknown} for export_with={export_with!r}; "
            f"accepted keys: {sorted(accepted) or 'none'}")
    return name
