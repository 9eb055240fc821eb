"""LEAPP: Lightweight Export Annotations for Policy Pipelines, with a C core.

    import leapp
    from leapp import annotate

    leapp.start("my_pipeline")
    ... annotated code ...
    leapp.stop()
    leapp.compile_graph()
"""
from __future__ import annotations

from typing import Any

import torch

from . import _core
from .tracing import ops as _ops, script as _script
from .tracing import alias as _alias  # noqa: F401  (binds the alias hooks into the core)
from .tracing import guards as _guards  # noqa: F401  (binds the guard hook into the core)
from .tracing.session import API
from .tracing.traced import TracedTensor, alias

_core._bind(TracedTensor, torch.Tensor, torch._C._disabled_torch_function_impl,
            _ops.classify, _ops.rewrite, alias, API)
_core._bind_script(_script.trace_through, _ops.note_random)

from . import annotate  # noqa: E402
from .export_manager import ExportManager  # noqa: E402
from .tracing.patching import FunctionPatch  # noqa: E402
from ._version import __implementation__, __version__  # noqa: E402
from .compiling.lifecycle import __config_version__, compile_graph, start, stop  # noqa: E402
from .compiling.backend_survey import check_backends  # noqa: E402  (docs/backends.md)
from .compiling.export_errors import ExportError  # noqa: E402
from .serving.fusion import fuse  # noqa: E402
from .bundle.contract import read as contract  # noqa: E402  (docs/deploy.md)
from .semantics import GraphConfigs, InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics
from . import leapp, utils  # noqa: E402,F401  (upstream's module paths)

__all__ = [
    "start", "stop", "compile_graph", "annotate", "TensorSemantics", "InputKindEnum",
    "OutputKindEnum", "TemporalAxis", "GraphConfigs", "FunctionPatch", "InferenceManager",
    "TracedTensor", "ExportManager", "fuse", "contract", "check_backends", "ExportError",
    "__version__", "__config_version__", "__implementation__",
]


def __getattr__(name: str) -> Any:
    if name == "InferenceManager":  # onnxruntime is imported only when needed
        from .running.inference_manager import InferenceManager
        return InferenceManager
    raise AttributeError(f"module 'leapp' has no attribute '{name}'")
