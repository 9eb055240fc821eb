"""LEAPP: Lightweight Export Annotations for Policy Pipelines, with a C core.

    import leapp
    from leapp import annotate

    leapp.start("my_pipeline")
    ... annotated code ...
    leapp.stop()
    leapp.compile_graph()
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch

from . import _core
from .tracing import ops as _ops, script as _script
from .tracing import alias as _alias  # noqa: F401  (binds the alias hooks into the core)
from .tracing import guards as _guards  # noqa: F401  (binds the guard hook into the core)
from .tracing.annotations import API
from .tracing.traced import TracedTensor, alias

_core._bind(TracedTensor, torch.Tensor, torch._C._disabled_torch_function_impl,
            _ops.classify, _ops.rewrite, alias, API)
_core._bind_script(_script.trace_through, _ops.note_random)

from . import annotate  # noqa: E402
from .export_manager import ExportManager  # noqa: E402
from .tracing.patching import FunctionPatch  # noqa: E402
from ._version import __implementation__, __version__  # noqa: E402
from .bundle.contract import read as contract  # noqa: E402  (docs/deploy.md)
from .semantics import GraphConfigs, InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics
from . import utils  # noqa: E402,F401  (upstream's module paths)

if TYPE_CHECKING:
    from . import leapp  # noqa: F401
    from .compiling.compiler import __config_version__, compile_graph
    from .tracing.session_lifecycle import start, stop
    from .running.inference_manager import InferenceManager
    from .serving.fusion import fuse
    from .compiling.backend_survey import check_backends  # docs/backends.md
    from .compiling.export_errors import ExportError

__all__ = [
    "start", "stop", "compile_graph", "annotate", "TensorSemantics", "InputKindEnum",
    "OutputKindEnum", "TemporalAxis", "GraphConfigs", "FunctionPatch", "InferenceManager",
    "TracedTensor", "ExportManager", "fuse", "contract", "check_backends", "ExportError",
    "__version__", "__config_version__", "__implementation__",
]


#: Names whose stage is imported on first use, so that a process that only runs bundles
#: (InferenceManager) never imports the compiling stage, its exporters and the drawing, and
#: one that only exports never imports the runtime: name -> (module, attribute or None for
#: the module itself).
_LAZY = {
    "start": ("leapp.tracing.session_lifecycle", "start"),
    "stop": ("leapp.tracing.session_lifecycle", "stop"),
    "compile_graph": ("leapp.compiling.compiler", "compile_graph"),
    "__config_version__": ("leapp.compiling.compiler", "__config_version__"),
    "fuse": ("leapp.serving.fusion", "fuse"),
    "check_backends": ("leapp.compiling.backend_survey", "check_backends"),
    "ExportError": ("leapp.compiling.export_errors", "ExportError"),
    "InferenceManager": ("leapp.running.inference_manager", "InferenceManager"),
    "leapp": ("leapp.leapp", None),  # upstream's module path leapp.leapp
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'leapp' has no attribute '{name}'") from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
