"""The one ONNX Runtime runner: an ONNX file called with torch tensors in and out.

Every reader of an ``.onnx`` file runs it through :class:`OnnxRunner`, which
:func:`leapp.models.load.load` builds: ``InferenceManager``'s nodes,
validation, bring-your-own models and ``leapp.serving.fusion.FusedModel``.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np
import torch

from ..bundle.dtypes import IO_BINDING
from ..bundle.pipeline import torch_dtype

logger = logging.getLogger("leapp")

# torch dtypes I/O binding hands to onnxruntime, as numpy element types
_NP_DTYPES = IO_BINDING


def default_providers() -> list[str]:
    """The onnxruntime providers a model runs on when the caller names none: CUDA first
    where onnxruntime has it, then the CPU."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
            if p == "CPUExecutionProvider" or p in available]


def _to_numpy(value: Any) -> Any:
    """A CPU numpy view of a tensor (a copy only when it must move or is strided)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach() if value.requires_grad else value
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.is_conj() or tensor.is_neg():
            tensor = tensor.resolve_conj().resolve_neg()
        array = tensor.numpy()
        # np.ascontiguousarray would give a 0-d tensor a dimension (ndim >= 1).
        return array if array.flags.c_contiguous else np.require(array, requirements="C")
    return np.asarray(value)


def _output_spec(name: str, output: Any) -> tuple[str, tuple[int, ...], torch.dtype]:
    """(name, shape, torch dtype) of an output: a ``leapp.bundle.pipeline.Port`` or a YAML dict."""
    if isinstance(output, dict):
        return name, tuple(output["shape"]), torch_dtype(output["dtype"], name)
    return name, tuple(output.shape), output.torch_dtype



#: Whether this process already said that onnxruntime runs on the CPU although torch sees a
#: GPU (said once: every ONNX node of every compile and load would repeat it).
_FALLBACK_SAID: list[bool] = []


def _cpu_fallback() -> None:
    """Say that ONNX models run on the CPU: a warning, once per process, where a GPU exists
    (torch sees CUDA) but onnxruntime has no CUDA provider; a DEBUG line where CUDA cannot
    exist (a CPU-only torch, no GPU), where the CPU is no fallback but the only choice."""
    if not torch.cuda.is_available():
        logger.debug("onnxruntime runs on the CPU (no CUDA device, no CUDA execution provider)")
    elif not _FALLBACK_SAID:
        _FALLBACK_SAID.append(True)
        logger.warning("CUDA execution provider not available. Falling back to CPU.")
    else:
        logger.debug("CUDA execution provider not available. Falling back to CPU.")

class OnnxRunner:
    """Calls an ONNX model through onnxruntime with torch tensors in and out.

    ``providers`` None prefers CUDAExecutionProvider when onnxruntime has it
    (and warns when it falls back to CPU); CUDA inputs then go through I/O
    binding (no host copies), which needs ``outputs``: the declared shape and
    dtype of each output, as ``leapp.bundle.pipeline.Port`` objects or YAML entries.
    On CPU the inputs reach onnxruntime as numpy views of the tensors and the
    outputs come back as ``torch.from_numpy`` views, so no tensor data is copied.
    The inputs are fed by name when the session's inputs are among
    ``input_names`` (tolerating inputs the exporter dropped), else by position
    (``input_names`` None: the session's own inputs).
    """

    def __init__(self, path: str, input_names: Sequence[str] | None = None,
                 outputs: Sequence[Any] | None = None,
                 providers: list[str] | None = None) -> None:
        import onnxruntime as ort

        if providers is None:
            providers = default_providers()
            if "CUDAExecutionProvider" not in providers:
                _cpu_fallback()
        options = ort.SessionOptions()
        # BASIC on purpose: ENABLE_ALL has been seen to corrupt decomposed Gemm chains.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self.path = path
        self.session = ort.InferenceSession(path, options, providers=providers)
        active = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._out_specs = None if outputs is None else [
            _output_spec(name, output) for name, output in zip(self.output_names, outputs)]
        self.use_cuda = bool(active) and active[0] == "CUDAExecutionProvider" \
            and torch.cuda.is_available()
        self.device = "cuda" if self.use_cuda else "cpu"
        # I/O binding needs every output's shape and dtype, in a type it can bind
        self._bind = self.use_cuda and self._out_specs is not None \
            and len(self._out_specs) == len(self.output_names) \
            and all(dtype in _NP_DTYPES for _, _, dtype in self._out_specs)

        names = self.input_names if input_names is None else list(input_names)
        if set(self.input_names) <= set(names):
            self._feed = [(name, names.index(name)) for name in self.input_names]
        else:
            self._feed = list(zip(self.input_names, range(len(self.input_names))))
        self._nargs = len(names)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        if len(args) != self._nargs:
            raise ValueError(f"{os.path.basename(self.path)} takes {self._nargs} inputs, "
                             f"got {len(args)}")
        if self._bind and self._can_bind(args):
            return self._run_bound(args)
        feed = {}
        out_device = None
        for name, index in self._feed:
            value = args[index]
            try:  # the common case, inline: a tensor numpy can view
                if value.requires_grad:
                    value = value.detach()
                if value.device.type != "cpu":
                    if out_device is None and value.device.type == "cuda":
                        out_device = value.device
                    value = value.cpu()
                feed[name] = value.numpy()
            except (AttributeError, RuntimeError, TypeError):  # conj/neg bits, not a tensor
                feed[name] = _to_numpy(value)
        outputs = self.session.run(self.output_names, feed)
        try:
            results = tuple(torch.from_numpy(o) for o in outputs)
        except TypeError:  # a sequence or map output
            results = tuple(torch.as_tensor(o) if not isinstance(o, np.ndarray)
                            else torch.from_numpy(o) for o in outputs)
        if out_device is None:
            return results
        return tuple(r.to(out_device) for r in results)

    @staticmethod
    def _can_bind(args: tuple[Any, ...]) -> bool:
        if not all(isinstance(t, torch.Tensor) for t in args):
            return False
        devices = {t.device for t in args}
        return (len(devices) == 1 and next(iter(devices)).type == "cuda"
                and all(t.dtype in _NP_DTYPES for t in args))

    def _run_bound(self, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        device = args[0].device
        index = device.index or 0
        binding = self.session.io_binding()
        keep = []
        for name, i in self._feed:
            tensor = args[i].detach().contiguous()
            keep.append(tensor)
            binding.bind_input(name, "cuda", index, _NP_DTYPES[tensor.dtype],
                               list(tensor.shape), tensor.data_ptr())
        outputs = []
        for name, shape, dtype in self._out_specs or ():
            out = torch.empty(shape, dtype=dtype, device=device)
            outputs.append(out)
            binding.bind_output(name, "cuda", index, _NP_DTYPES[dtype],
                                list(shape), out.data_ptr())
        # onnxruntime runs on its own stream: the inputs must be ready first.
        torch.cuda.current_stream(device).synchronize()
        self.session.run_with_iobinding(binding)
        del keep
        return tuple(outputs)

    def __repr__(self) -> str:
        return f"OnnxRunner({self.path!r}, device={self.device!r})"
