"""Validation of exported nodes against the values seen while tracing.

Each node is validated as it ships: its saved file is loaded from the bundle
with InferenceManager's own loader (SavedModel: leapp.models.load.load_node),
checksum included, and that loaded model runs on its first traced example
(sample 0: the ports' `.value`) and on each cached re-entry example (sample 1,
2, ...: the ports' `.samples`), TorchScript models in the interpreter without the optimising
executor's profiling passes.  Per example: the output count, then per output shape, NaN
and ±inf as eager's (the same positions, infinities of the same sign: eager's own NaN,
such as the variance of one value, is no failure), dtype, and torch.allclose(rtol, atol)
on the finite values; a numeric mismatch logs
shapes, dtypes, value ranges and absolute-difference statistics.  A summary
closes the run; strict=True raises when any node failed.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..bundle.log import fatal, log_path, logger, section
from ..models.load import load_node
from ..bundle.pipeline import Node
from ..tracing import escapes as _escapes
from ..bundle.analytics import Analytics
from .backends import WRITER

REENTRY_HINT = (
    "Sample 0 (initial trace) passed validation, but one or more re-entry samples failed. "
    "This pattern often means a value that changes across iterations was inlined as a "
    "constant during export. Consider declaring it with annotate.input_tensors() for this "
    "node. A value the node keeps for its next call (a recurrent hidden state in an "
    "attribute) is state: declare it with annotate.state_tensors() and bind its new value "
    "with annotate.update_state().")

PERCENTILES = (("p50", 0.50), ("p75", 0.75), ("p90", 0.90), ("p99", 0.99), ("p995", 0.995))

# torch.quantile refuses inputs larger than this; beyond it the same linear
# interpolation is done on a sorted copy.
_QUANTILE_MAX = 1 << 24


class SavedModel:
    """A node's saved model, loaded on first use exactly as InferenceManager loads it.

    description is the node's entry of the bundle's YAML ("models" document) and
    yaml_dir the directory its model_path is relative to; allow_external is set
    for a bring-your-own model the user chose to reference outside the bundle.
    """

    def __init__(self, name: str, description: dict, yaml_dir: str,
                 allow_external: bool = False) -> None:
        self.name = name
        self.description = description
        self.yaml_dir = yaml_dir
        self.allow_external = allow_external
        self._loaded: Any = None

    def loaded(self) -> Any:
        """The model as load_node loads it, once: the node checks and the
        closed-loop replay run the same loaded file."""
        if self._loaded is None:
            self._loaded = load_node(Node.from_entry(self.name, self.description),
                                     self.yaml_dir, allow_external_paths=self.allow_external)
        return self._loaded

    def release(self) -> None:
        """Drop the loaded model (its file may move: the bundle's commit)."""
        self._loaded = None

    def load(self) -> tuple[Callable[..., Any], str]:
        """(the loaded model's call, its device)."""
        loaded = self.loaded()
        return loaded.call, loaded.device

    def __repr__(self) -> str:
        return f"SavedModel({self.name!r}, {self.yaml_dir!r})"


class _Example:
    """One set of input values and the outputs traced for them."""

    def __init__(self, index: int, inputs: list, outputs: list) -> None:
        self.index = index
        self.inputs = inputs
        self.outputs = outputs


def _examples(inputs: Sequence[Any], outputs: Sequence[Any]) -> list[_Example]:
    examples = [_Example(0, [p.value for p in inputs], [p.value for p in outputs])]
    ports = list(inputs) + list(outputs)
    cached = min((len(p.samples) for p in ports), default=0)
    for k in range(cached):
        examples.append(_Example(k + 1, [p.samples[k] for p in inputs],
                                 [p.samples[k] for p in outputs]))
    return examples


def _as_tuple(result: Any) -> tuple:
    if isinstance(result, tuple):
        return result
    if isinstance(result, list):
        return tuple(result)
    return (result,)


def _percent(count: int, total: int) -> float:
    return 100.0 * count / total if total else 0.0


def _finite(tensor: torch.Tensor) -> bool:
    """True when tensor holds no NaN or Inf (always for integer and bool tensors)."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    return bool(torch.isfinite(tensor).all())


def _nonfinite(node: str, out: str, index: int, exported: torch.Tensor,
               source: torch.Tensor) -> bool:
    """Log NaN/Inf on either side; True when any was found."""
    # One reduction a side in the usual all-finite case; the counts only for the report.
    if _finite(exported) and _finite(source):
        return False
    counts = {}
    for side, tensor in (("Exported", exported), ("Source", source)):
        floating = tensor.is_floating_point() or tensor.is_complex()
        counts[side] = ((int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum()))
                        if floating else (0, 0))
    if not any(n or i for n, i in counts.values()):
        return False
    total = exported.numel()
    logger.error("%s/%s sample %d: NaN/Inf detected!", node, out, index)
    for side, log in (("Exported", logger.error), ("Source", logger.warning)):
        nans, infs = counts[side]
        if nans:
            log("  %s has %d/%d NaN values (%.3f%%)", side, nans, total, _percent(nans, total))
        if infs:
            log("  %s has %d/%d Inf values (%.3f%%)", side, infs, total, _percent(infs, total))
    return True


def _same_nonfinite(exported: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether NaN and ±inf sit at the same positions on both sides (inf of the same
    sign): eager's own NaN (the variance of one value, a fully masked softmax) is then
    the export's too, and the finite values are compared as usual."""
    if exported.dtype != source.dtype or not exported.is_floating_point():
        return False
    nan_e, nan_s = torch.isnan(exported), torch.isnan(source)
    inf_e, inf_s = torch.isinf(exported), torch.isinf(source)
    return torch.equal(nan_e, nan_s) and torch.equal(inf_e, inf_s) and \
        torch.equal(exported[inf_e], source[inf_s])


def _quantiles(values: torch.Tensor, qs: Sequence[float]) -> list[float]:
    """Linear-interpolation quantiles of a flat floating tensor."""
    if values.numel() == 0:
        return [float("nan")] * len(qs)
    if values.numel() <= _QUANTILE_MAX:
        return torch.quantile(values, torch.tensor(qs, dtype=values.dtype)).tolist()
    ordered = values.sort().values
    last = ordered.numel() - 1
    found = []
    for q in qs:
        position = q * last
        low = int(position)
        high = min(low + 1, last)
        weight = position - low
        found.append(float(ordered[low] * (1 - weight) + ordered[high] * weight))
    return found


def _range(tensor: torch.Tensor) -> tuple[float, float]:
    if tensor.numel() == 0:
        return float("nan"), float("nan")
    return float(tensor.min()), float(tensor.max())


def _mismatch_report(node: str, out: str, index: int, exported: torch.Tensor,
                     source: torch.Tensor, rtol: float, atol: float) -> None:
    wide = torch.float64 if torch.float64 in (exported.dtype, source.dtype) else torch.float32
    got = (exported.abs() if exported.is_complex() else exported).detach().to(wide).flatten()
    want = (source.abs() if source.is_complex() else source).detach().to(wide).flatten()
    diff = (exported.detach().to(torch.complex128 if exported.is_complex() else wide)
            - source.detach().to(torch.complex128 if source.is_complex() else wide))
    diff = diff.abs().to(wide).flatten()
    logger.error("%s/%s sample %d: Mismatch detected (rtol=%s, atol=%s). Please check %s for "
                 "more details.", node, out, index, rtol, atol, log_path())
    logger.info("  Source shape: %s, dtype: %s", source.shape, source.dtype)
    logger.info("  Exported shape: %s, dtype: %s", exported.shape, exported.dtype)
    logger.info("  Source range:   [%.6e, %.6e]", *_range(want))
    logger.info("  Exported range: [%.6e, %.6e]", *_range(got))
    mean = float(diff.mean()) if diff.numel() else float("nan")
    logger.info("  Diff stats: max=%.6e, mean=%.6e", _range(diff)[1], mean)
    values = _quantiles(diff, [q for _, q in PERCENTILES])
    logger.info("  Diff percentiles: %s",
                ", ".join(f"{label}={value:.6e}" for (label, _), value in zip(PERCENTILES, values)))


def _compare(node: str, out: str, index: int, exported: Any, source: torch.Tensor,
             rtol: float, atol: float, analytics: Analytics) -> bool:
    """One output of one example, recorded in analytics; True when it matches."""
    record = analytics.record
    if not isinstance(exported, torch.Tensor):
        exported = torch.as_tensor(exported)
    exported = exported.to(source.device)
    if tuple(exported.shape) != tuple(source.shape):
        logger.error("%s/%s sample %d: Shape mismatch - got %s, expected %s", node, out, index,
                     list(exported.shape), list(source.shape))
        record(node, out, index, False, rtol, atol, reason=f"shape {list(exported.shape)}, "
               f"expected {list(source.shape)}")
        return False
    if not (_finite(exported) and _finite(source)) and _same_nonfinite(exported, source):
        logger.info("%s/%s sample %d: NaN/Inf where the traced output has them, at the "
                    "same positions", node, out, index)
        finite = torch.isfinite(source)
        exported, source = exported[finite], source[finite]
    elif _nonfinite(node, out, index, exported, source):
        record(node, out, index, False, rtol, atol, exported, source, reason="NaN/Inf")
        return False
    if exported.dtype != source.dtype:
        raise TypeError(f"{node}/{out} sample {index}: the exported model returned dtype "
                        f"{exported.dtype} but the traced output has dtype {source.dtype}")
    if exported.dtype == torch.bool:
        close = torch.equal(exported, source)
    else:
        close = torch.allclose(exported, source, rtol=rtol, atol=atol)
    if not close:
        _mismatch_report(node, out, index, exported, source, rtol, atol)
    record(node, out, index, close, rtol, atol, exported, source)
    return close


def _validate_node(name: str, model: Any, inputs: Sequence[Any], outputs: Sequence[Any],
                   rtol: float, atol: float, analytics: Analytics,
                   note: str | None = None) -> tuple[bool, str | None]:
    """(passed, hint) for one node over all of its examples, each recorded in analytics."""
    examples = _examples(inputs, outputs)
    device = None
    if isinstance(model, SavedModel):
        model, device = model.load()
    passed = []
    for example in examples:
        args = example.inputs if device is None else [
            t.to(device) if isinstance(t, torch.Tensor) else t for t in example.inputs]
        # TorchScript's optimising executor spends its first two calls of a model
        # profiling and recompiling it (~0.1 s a node), which a few validation
        # calls never earn back; the plain interpreter runs the same ops.
        with torch.no_grad(), torch.jit.optimized_execution(False):
            got = _as_tuple(model(*args))
        if len(got) != len(example.outputs):
            logger.error("%s sample %d: Output count mismatch - got %d, expected %d", name,
                         example.index, len(got), len(example.outputs))
            analytics.record(name, "(all)", example.index, False, rtol, atol,
                             reason=f"{len(got)} outputs, expected {len(example.outputs)}")
            passed.append(False)
            continue
        ok = True
        for idx, (exported, source) in enumerate(zip(got, example.outputs)):
            out = outputs[idx].name if idx < len(outputs) else f"output_{idx}"
            ok = _compare(name, out, example.index, exported, source, rtol, atol,
                           analytics) and ok
        passed.append(ok)
    hint = None
    if note is not None and not all(passed):
        hint = note + _escapes.reentry_note(name)  # random ops (and state kept in Python)
        logger.warning("  %s", hint)
    elif passed[0] and not all(passed):
        hint = REENTRY_HINT + _escapes.reentry_note(name)  # state kept in Python, named
        logger.warning("  %s: %s", name, hint)
    if all(passed):
        count = len(examples)
        logger.info("  [PASS] %s passed validation (%d example%s)", name, count,
                    "s" if count > 1 else "")
    return all(passed), hint


def validate_models(entries: list, rtol: float, atol: float, strict: bool) -> dict:
    """entries: (node, model or None, input ports, output ports) -> {node: result}.

    model is a SavedModel (loaded here as InferenceManager loads it) or a
    callable.  A result is True (passed or nothing to run), False (a mismatch)
    or the exception raised while loading or running the node.  strict=True
    raises when a node did not pass.
    """
    results, failure = run_validation(entries, rtol, atol)
    if strict and failure is not None:
        fatal(failure, Exception)
    return results


def random_note(node: str, random_ops: Sequence[tuple]) -> str:
    """Why a node with random ops cannot be compared: the ops and where they ran."""
    where = "; ".join(f"{label} at {file}:{line}" for label, file, line in random_ops)
    what = "the random op" if len(random_ops) == 1 else "the random ops"
    return (f"node {node} uses {what} {where}; its exported outputs are random too, so "
            f"validation cannot compare them exactly. Seeding does not help: the exported "
            f"model draws its own numbers. Validate with the random op replaced (e.g. the "
            f"mean, or dropout in eval mode), or compile with validate=False.")


def writer_hint(node: str, writer: str) -> str:
    """Who wrote a node's failing ONNX model and how to choose another."""
    if writer == WRITER:
        switch = ("set LEAPP_ONNX_WRITER=torch to export it with torch's ONNX exporter, or "
                  "export it with another backend (export_with='jit' or 'pt2')")
    else:
        switch = "export it with another backend (export_with='jit' or 'pt2')"
    return f"node {node}'s ONNX model was written by {writer}: {switch}."


def run_validation(entries: list, rtol: float, atol: float,
                   observer: Any = None,
                   random_ops: dict | None = None,
                   writers: dict | None = None,
                   analytics: Analytics | None = None) -> tuple[dict, str | None]:
    """({node: result}, the strict-mode failure message or None); raises nothing.

    observer (compile_graph's progress) is told of each node: validating(name)
    before, validated(name, result) after.  random_ops maps a node to the
    random ops it ran ((label, file, line) each): a mismatch there is
    reported as following from them.  writers maps an ONNX node to who wrote
    its model: a failure names it and the switch to another.  analytics gets an
    entry per output and example (``<graph>_analytics.json``).
    """
    if analytics is None:
        analytics = Analytics()
    results: dict[str, Any] = {}
    hints: dict[str, str] = {}
    section(f"Validating {len(entries)} models")
    if not entries:
        logger.error("No nodes to validate")
        return results, None
    for name, model, inputs, outputs in entries:
        logger.info("Validating %s...", name)
        if observer is not None:
            observer.validating(name)
        if model is None:
            logger.warning("Model %s does not have a compiled model. Skipping validation.", name)
            results[name] = True
        else:
            try:
                found = (random_ops or {}).get(name)
                note = random_note(name, found) if found else None
                results[name], hint = _validate_node(name, model, inputs, outputs, rtol, atol,
                                                     analytics, note)
                writer = (writers or {}).get(name)
                if results[name] is False and writer is not None and note is None:
                    said = writer_hint(name, writer)
                    logger.warning("  %s", said)
                    hint = said if hint is None else f"{hint} {said}"
                if hint is not None:
                    hints[name] = hint
            except Exception as exc:
                logger.error("%s: Validation failed with exception: %s", name, exc)
                results[name] = exc
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if observer is not None:
            observer.validated(name, results[name])
    total = len(results)
    failed = [n for n, r in results.items() if r is False]
    errors = [n for n, r in results.items() if isinstance(r, BaseException)]
    section("Validation Summary")
    logger.info("  Passed: %d/%d", total - len(failed) - len(errors), total)
    if failed:
        logger.warning("  Failed: %d/%d", len(failed), total)
    if errors:
        logger.error("  Errors: %d/%d", len(errors), total)
    bad = [n for n, r in results.items() if r is not True]
    if not bad:
        return results, None
    message = f"Model validation failed for {len(bad)} node(s): {bad}"
    if hints:
        message += "\n\n" + "\n".join(f"{node}: {hint}" for node, hint in hints.items())
    return results, message
