"""The whole pipeline as one model: ``leapp.fuse``.

A bundle is one model per node plus the YAML that wires them.  ``fuse`` turns
it into one model that runs one step of the whole pipeline, nodes in run
order, so that a runtime knowing nothing of LEAPP (onnxruntime, TensorRT, a
C++ TorchScript runtime, a Triton server) can run it.  Feedback becomes
explicit state: each feedback target is a state input named
``"<node>/<port>"`` and its source this step a state output named
``"<node>/<port>__next"``; the initial values travel in the model's metadata.
The convention is documented in docs/fuse.md.

The bundle is read the way ``InferenceManager`` reads it (it *is* an
``InferenceManager``: same parser, same checksums, same confined paths, pt2
never unpickled), so fusing trusts a bundle no more than running it does.

* ``format="onnx"``: ONNX nodes are merged as graphs (``onnx.compose``
  prefixes against name clashes), TorchScript nodes are re-exported with
  torch's TorchScript-based ONNX exporter, pt2 nodes with the dynamo exporter.
* ``format="torchscript"``: jit nodes are kept as they are, pt2 nodes are
  traced; a node that only exists as ONNX cannot be turned into TorchScript
  and is refused, naming the node.

The fused model is then run step by step next to ``InferenceManager`` on the
same bundle, state carried across :data:`VALIDATION_STEPS` steps, and refused
if any output differs.
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import torch

from ..bundle.digest import file_digests
from ..bundle.modes import save_via_memory
from ..bundle.safe_load import quote
from ..models.load import default_providers, load
from ..bundle.pipeline import split_key
from .fused_onnx import build_onnx, save_onnx
from .fused_plan import (FORMAT_VERSION, FORMATS, METADATA_KEY, STATE_SUFFIX,  # noqa: F401
                         TORCHSCRIPT_EXTRA_FILE, VALIDATION_STEPS, YAML_KEY, FuseError, Plan,
                         fail, logger, plan)
from .fused_torchscript import build_torchscript


# ---- running a fused model --------------------------------------------------------


def read_metadata(path: str) -> dict[str, Any]:
    """The convention's JSON of a fused model (``.onnx`` or TorchScript ``.pt``)."""
    if path.endswith(".onnx"):
        import onnx
        model = onnx.load(path, load_external_data=False)
        for prop in model.metadata_props:
            if prop.key == METADATA_KEY:
                return json.loads(prop.value)
        raise FuseError(f"{quote(path)} carries no {METADATA_KEY!r} metadata: not a fused model")
    extra = {TORCHSCRIPT_EXTRA_FILE: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=extra)
    if not extra[TORCHSCRIPT_EXTRA_FILE]:
        raise FuseError(f"{quote(path)} carries no {TORCHSCRIPT_EXTRA_FILE!r}: not a fused model")
    return json.loads(extra[TORCHSCRIPT_EXTRA_FILE])


def initial_state(metadata: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``{state input name: initial value}`` decoded from the fused model's metadata."""
    from ..bundle.pipeline import torch_dtype
    state = {}
    for entry in metadata["state"]:
        dtype = torch_dtype(entry["dtype"], entry["input"])
        raw = bytearray(base64.b64decode(entry["initial"]["data"]))
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        state[entry["input"]] = flat.reshape(entry["shape"]).clone()
    return state


class FusedModel:
    """Runs a fused model step by step, carrying its state.

    ``FusedModel(path)`` loads a fused ``.onnx`` with onnxruntime (the CUDA
    provider first when onnxruntime has it) or a fused TorchScript ``.pt``,
    both through :func:`leapp.models.load.load`, and reads the state
    convention from its metadata.
    ``step(inputs)`` takes ``{"node/port": tensor}`` like
    ``InferenceManager.run_policy`` (every data input, each call) and returns
    the data outputs; ``reset()`` puts the initial state back.
    """

    def __init__(self, path: str, providers: list[str] | None = None) -> None:
        self.path = os.fspath(path)
        self.metadata = read_metadata(self.path)
        if self.metadata.get("batched"):
            raise FuseError(f"{quote(self.path)} is a batched fused model: run it with "
                            "leapp.serving.fleet.FleetRunner")
        self.input_names = [p["name"] for p in self.metadata["inputs"]]
        self.output_names = [p["name"] for p in self.metadata["outputs"]]
        #: the YAML's "node/port" of each output (``step`` returns these keys)
        self.output_keys = [p.get("key", p["name"]) for p in self.metadata["outputs"]]
        self.state_inputs = [s["input"] for s in self.metadata["state"]]
        self.state_outputs = [s["output"] for s in self.metadata["state"]]
        self._initial = initial_state(self.metadata)
        if self.path.endswith(".onnx"):
            if providers is None:
                providers = default_providers()
            # InferenceManager's runner: numpy views on CPU, I/O binding for CUDA tensors
            described = self.metadata["outputs"] + [
                {"name": s["output"], "dtype": s["dtype"], "shape": s["shape"]}
                for s in self.metadata["state"]]
            #: "cuda" when onnxruntime runs the model on the GPU (inputs go there)
            self._runner, _, self.device = load(
                "onnx", self.path, input_names=self.input_names + self.state_inputs,
                outputs=described, providers=providers)
            self.session = self._runner.session
            self._run = self._run_onnx
        else:
            self.module, _, self.device = load("jit", self.path, device="cpu")
            self._run = self._run_torchscript
        self.reset()

    def reset(self) -> None:
        """Put every state input back to its initial value."""
        self.state = {name: value.to(self.device, copy=True)
                      for name, value in self._initial.items()}

    def _run_onnx(self, args: list[torch.Tensor]) -> list[Any]:
        if self.device != "cpu":
            args = [a.to(self.device) for a in args]
        return list(self._runner(*args))

    def _run_torchscript(self, args: list[torch.Tensor]) -> list[Any]:
        with torch.no_grad():
            return list(self.module(*args))

    def step(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One step: the data outputs ``{"node/port": tensor}``; the state advances."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise KeyError(f"FusedModel.step: missing inputs {missing}; every data input "
                           f"({self.input_names}) is needed at each step")
        args = [inputs[n] for n in self.input_names] + [self.state[n] for n in self.state_inputs]
        results = self._run(args)
        count = len(self.output_names)
        self.state = dict(zip(self.state_inputs, results[count:]))
        return dict(zip(self.output_keys, results[:count]))


# ---- validation -------------------------------------------------------------------


def validate(path: str, yaml_path: str | Any, steps: int = VALIDATION_STEPS,
             rtol: float = 1e-3, atol: float = 1e-5, allow_external_paths: bool = False,
             seed: int = 0, shown: str | None = None) -> None:
    """Run the fused model and ``InferenceManager`` side by side for ``steps`` steps.

    ``yaml_path`` is the bundle's YAML (or an ``InferenceManager`` already
    loaded from it, which is reset first).  Both get the same random inputs
    each step; the fused model carries its own state.  Raises
    :class:`FuseError` naming the step and the output (data or state) that
    differs (as ``shown``, where the file is not yet at its final path).
    """
    from ..running.inference_manager import InferenceManager

    shown = path if shown is None else shown
    if isinstance(yaml_path, InferenceManager):
        manager = yaml_path
        manager.reset()
    else:
        manager = InferenceManager(yaml_path, allow_external_paths=allow_external_paths)
    fused = FusedModel(path, providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        inputs = {}
        for name, port in zip(fused.input_names, fused.metadata["inputs"]):
            inputs[name] = _random(tuple(port["shape"]), manager, name, generator)
        expected = manager.run_policy({k: v.clone() for k, v in inputs.items()})
        actual = fused.step(inputs)
        pairs = [(name, expected[name], actual[name]) for name in fused.output_keys]
        for state, entry in zip(fused.state_inputs, fused.metadata["state"]):
            node, port = split_key(state, "fused state")
            # InferenceManager holds the target's next value in its input buffer
            # (or a staging slot): compare with what the fused model carries.
            pairs.append((entry["output"], _next_state(manager, node, port), fused.state[state]))
        for name, want, got in pairs:
            got = got.to(want.device)
            if want.shape != got.shape or want.dtype != got.dtype:
                fail(f"Fused model {quote(shown)}: step {step}, {quote(name)} is "
                      f"{got.dtype} {tuple(got.shape)} but InferenceManager gives "
                      f"{want.dtype} {tuple(want.shape)}")
            if not _close(want, got, rtol, atol):
                worst = (want.double() - got.double()).abs().max().item() \
                    if want.dtype != torch.bool else float("nan")
                fail(f"Fused model {quote(shown)} differs from InferenceManager at step "
                      f"{step} on {quote(name)} (largest difference {worst:.3g}, rtol={rtol}, "
                      f"atol={atol}). The bundle was not fused faithfully: please report it.")
    logger.info("Fused model %s matches InferenceManager over %d steps", shown, steps)


def _random(shape: tuple[int, ...], manager: Any, name: str,
            generator: torch.Generator) -> torch.Tensor:
    node, port = split_key(name, "fused input")
    entry = manager.nodes[node]
    dtype = entry.input_dtypes[entry.input_names.index(port)]
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    # 0 or 1: valid as an index or a flag wherever an integer input is one
    return torch.randint(0, 2, shape, generator=generator).to(dtype)


def _next_state(manager: Any, node: str, port: str) -> torch.Tensor:
    # staged feedback is committed after the last node: the target's buffer
    # holds the value the next step will read
    return manager.value_dict[node][port]


def _close(want: torch.Tensor, got: torch.Tensor, rtol: float, atol: float) -> bool:
    if want.dtype.is_floating_point or want.dtype.is_complex:
        return bool(torch.allclose(want.double(), got.double(), rtol=rtol, atol=atol,
                                   equal_nan=True))
    return bool(torch.equal(want, got))


# ---- the YAML record --------------------------------------------------------------


def record(yaml_path: str, fused_path: str, format: str) -> None:
    """Write the fused model's path and checksum under the YAML's ``fused`` key.

    The entry is a field of the pipeline model (``Pipeline.with_extra``), read
    through the bounded safe reader and written by the model's YAML writer,
    which gives the rest of the bundle's YAML back as it was; the file is
    replaced in one rename.  Only a fused model inside the bundle directory is
    recorded.
    """
    from ..bundle.pipeline import Pipeline, thawed
    bundle = os.path.dirname(os.path.abspath(yaml_path))
    relative = os.path.relpath(os.path.abspath(fused_path), bundle)
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        logger.info("Fused model %s lies outside the bundle: not recorded in its YAML",
                    fused_path)
        return
    model = Pipeline.load(yaml_path)
    recorded = thawed(model.extra.get(YAML_KEY))
    current = {k: v for k, v in recorded.items() if k in FORMATS and isinstance(v, dict)} \
        if isinstance(recorded, dict) else {}
    current[format] = {"model_path": relative, "sha256sum": file_digests(fused_path)[0],
                       "format_version": FORMAT_VERSION}
    text = model.with_extra(YAML_KEY, current).to_yaml()
    fd, tmp = tempfile.mkstemp(prefix=".leapp-fuse-", dir=bundle)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, os.stat(yaml_path).st_mode & 0o7777)
        os.replace(tmp, yaml_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- entry point ------------------------------------------------------------------


def fuse(yaml_path: str, out: str | None = None, format: str = "onnx", *,
         validate_steps: int = VALIDATION_STEPS, rtol: float = 1e-3, atol: float = 1e-5,
         allow_external_paths: bool = False, batch: bool = False,
         _shown_dir: str | None = None) -> str:
    """Fuse a compiled bundle into one model that runs one step of the whole pipeline.

    Args:
        yaml_path: the bundle's YAML (as written by ``leapp.compile_graph``).
        out: where to write the fused model; default
            ``<bundle_dir>/<pipeline>_fused.onnx`` (``_fused.pt`` for TorchScript).
        format: ``"onnx"`` or ``"torchscript"``.
        validate_steps: steps the fused model is run next to ``InferenceManager``
            (state carried across) before it is accepted; at least 10.
        rtol, atol: tolerances of that comparison (integers and booleans exact).
        allow_external_paths: as for ``InferenceManager`` (trusted bundles only).
        batch: write the batched model instead (ONNX only; default file
            ``<pipeline>_fused_batched.onnx``, not recorded in the YAML): it steps
            any number of robots at once, every data input, output and state
            robot-major, and is checked robot by robot against one
            ``InferenceManager`` per robot (see ``leapp.serving.fleet``).

    Returns:
        The path of the fused model.  When it lies inside the bundle directory,
        its path and sha256 are recorded in the YAML under ``fused: {<format>: ...}``.

    Raises:
        FuseError: the bundle holds a node that cannot be fused into ``format``
            (named, with the fix), or the fused model does not match
            ``InferenceManager``; nothing is written then.
        BundleError, FileNotFoundError: the bundle itself is unreadable, as for
            ``InferenceManager``.
    """
    from ..running.inference_manager import InferenceManager

    if format not in FORMATS:
        raise ValueError(f"leapp.fuse(format={format!r}): expected one of {sorted(FORMATS)}")
    if batch and format != "onnx":
        raise ValueError(f"leapp.fuse(batch=True, format={format!r}): only the ONNX fused "
                         "model is batched")
    if not isinstance(validate_steps, int) or validate_steps < 10:
        raise ValueError(f"leapp.fuse(validate_steps={validate_steps!r}): at least 10 steps "
                         "are needed to check feedback")
    yaml_path = os.fspath(yaml_path)
    manager = InferenceManager(yaml_path, allow_external_paths=allow_external_paths)
    the_plan = plan(manager)
    if out is None:
        stem = f"{the_plan.pipeline}_fused" + ("_batched" if batch else "")
        out = os.path.join(the_plan.bundle_dir, stem + FORMATS[format])
    out = os.fspath(out)
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    # messages name the final place (compile_graph fuses the bundle it stages)
    shown = out if _shown_dir is None else os.path.join(_shown_dir, os.path.basename(out))
    fd, tmp = tempfile.mkstemp(prefix=".leapp-fuse-", suffix=FORMATS[format], dir=directory)
    os.close(fd)
    from ..bundle import contract as _contract
    contract = _contract.expected(yaml_path, fused=format)  # docs/deploy.md
    try:
        if batch:
            _fuse_batched(the_plan, manager, tmp, out, validate_steps, rtol, atol, shown,
                          allow_external_paths, contract)
        elif format == "onnx":
            fused = build_onnx(the_plan, manager)
            _contract.set_onnx(fused, contract)
            save_onnx(fused, tmp, out)
            del fused
        else:
            module = build_torchscript(the_plan, manager)
            extra = {TORCHSCRIPT_EXTRA_FILE: json.dumps(the_plan.metadata()),
                     _contract.EXTRA_FILE: _contract.dumps(contract)}
            save_via_memory(lambda h: torch.jit.save(module, h, _extra_files=extra), tmp)
        if not batch:
            validate(tmp, manager, validate_steps, rtol, atol, shown=shown)
        from ..bundle.modes import file_mode
        os.chmod(tmp, file_mode())  # mkstemp's 0600 is no file mode of a bundle
        os.replace(tmp, out)
    except BaseException:
        for leftover in (tmp,):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise
    logger.info("Fused %d nodes of %s into %s (%d state pairs%s)", len(the_plan.order),
                the_plan.pipeline, shown, len(the_plan.states), ", batched" if batch else "")
    if not batch:
        record(yaml_path, out, format)
    return out


def _fuse_batched(the_plan: Plan, manager: Any, tmp: str, out: str, steps: int, rtol: float,
                  atol: float, shown: str, allow_external_paths: bool,
                  contract: Mapping[str, Any]) -> None:
    """fuse(batch=True): the one-robot model, checked, then batched and checked per robot."""
    from . import batched as _batched
    from ..bundle import contract as _contract
    from ..running.inference_manager import InferenceManager
    for writer in (True, False):
        written: list[str] = []
        single = build_onnx(the_plan, manager, writer=writer, written=written)
        _contract.set_onnx(single, contract)
        save_onnx(single, tmp, out)
        validate(tmp, manager, steps, rtol, atol, shown=shown)
        try:
            batched = _batched.batch_model(single, steps=steps)
            break
        except _batched.BatchError as exc:
            # torch's exporters change the layout, not the ports a batch needs
            if not written or not isinstance(exc, _batched.LayoutError):
                fail(f"The fused model of {quote(the_plan.pipeline)} cannot be batched: {exc}")
            # a node that moves the robot axis: torch's exporters, whose graphs
            # follow other shapes at run time, may still stack robots on it
            logger.warning("The fused model of %s written with leapp's ONNX writer (nodes %s) "
                           "cannot be batched (%s); converting those nodes with torch's "
                           "exporter for the batched model", quote(the_plan.pipeline),
                           ", ".join(quote(n) for n in written), quote(str(exc), 300))
    _contract.set_onnx(batched, contract)
    save_onnx(batched, tmp, out)
    manager.reset()
    managers = [manager] + [InferenceManager(manager.model_path,
                                             allow_external_paths=allow_external_paths)
                            for _ in range(_batched.CHECK_ROBOTS - 1)]
    problem = _batched.check_per_robot(tmp, read_metadata(tmp), managers, steps,
                                       max(rtol, 1e-4), atol)
    if problem is not None:
        fail(f"Batched fused model {quote(shown)}: {problem}. The bundle was not batched "
              "faithfully: please report it.")


__all__ = ["fuse", "FusedModel", "FuseError", "read_metadata", "initial_state", "validate"]
