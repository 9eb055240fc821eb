"""Which backends export a node: the survey behind compile_graph's export errors and
``leapp.check_backends()``.

When a node's backend fails, compile_graph tries the node's traced graph with
every other backend, each in a temporary directory (nothing is written into
the bundle), loads what it wrote the way InferenceManager does and runs it on
the traced inputs and on fresh ones (leapp.compiling.fresh_inputs: perturbed,
NaN, infinities, large values); a backend whose outputs match the traced ones
(rtol 1e-3, atol 1e-5, as compile_graph validates) and eager's on the fresh
inputs "exports this node".  The
error then names them: "export_with='onnx', 'jit' or 'pt2' export this node";
a node no backend exports gets each backend's reason in one line.

The survey is bounded: no backend is started once SURVEY_SECONDS (60 s, or the
LEAPP_SURVEY_SECONDS environment variable; 0 turns the survey off) have gone
by, and those left are reported as not tried.  A backend already running is
not interrupted (torch's exporters cannot be), so one export's time may come
on top.

``leapp.check_backends()`` runs the same survey for every node of the trace
(after ``leapp.stop()``, before ``compile_graph()``).
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

import torch

from .. import _core
from ..bundle import log as _logging
from ..bundle.log import fatal, logger
from ..tracing.node_info import info
from ..tracing.session_state import SESSION
from .export_errors import ExportError, console_to_log, one_line, where_traced
from .progress import third_party_to_log

SURVEY_SECONDS = 60.0

# The backends tried, in the order an error names them (canonical name, what users write).
SURVEYED = (("onnx-dynamo", "onnx"), ("jit-script", "jit"), ("jit-trace", "jit-trace"),
            ("exported-program", "pt2"), ("onnx-torchscript", "onnx-torchscript"))
SHORT = dict(SURVEYED)

RTOL, ATOL = 1e-3, 1e-5


@dataclass
class Attempt:
    """One backend tried on one node: ok True (exported and validated), False (with
    the reason in one line) or None (not tried: the time was up)."""

    backend: str  # canonical name
    ok: bool | None
    reason: str = ""
    seconds: float = 0.0
    op: str | None = None  # the op torch's error names, when it names one

    @property
    def export_with(self) -> str:
        """The name users write in export_with."""
        return SHORT.get(self.backend, self.backend)


def budget_seconds() -> float:
    """The survey's time budget: LEAPP_SURVEY_SECONDS, else SURVEY_SECONDS."""
    raw = os.environ.get("LEAPP_SURVEY_SECONDS", "").strip()
    if not raw:
        return SURVEY_SECONDS
    try:
        return max(0.0, float(raw))
    except ValueError:
        logger.warning("LEAPP_SURVEY_SECONDS=%r is not a number of seconds; using %g",
                       raw, SURVEY_SECONDS)
        return SURVEY_SECONDS


def _reason(error: BaseException) -> str:
    if isinstance(error, ExportError):
        op = f"op `{error.op}`: " if error.op else ""
        return op + error.reason
    return one_line(error)


def _examples(node: Any) -> list[tuple[list, list]]:
    """(inputs, outputs) of every traced example of node: the last pass and the cached
    samples."""
    ports = list(node.inputs) + list(node.outputs)
    found = [([p.value for p in node.inputs], [p.value for p in node.outputs])]
    cached = min((len(p.samples) for p in ports), default=0)
    for k in range(cached):
        found.append(([p.samples[k] for p in node.inputs], [p.samples[k] for p in node.outputs]))
    return found


def _matches(got: Any, want: Sequence[torch.Tensor]) -> str:
    """'' when got matches the traced outputs want, else why not."""
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for index, (value, expected) in enumerate(zip(got, want)):
        value = torch.as_tensor(value).to(expected.device)
        if tuple(value.shape) != tuple(expected.shape):
            return f"output {index}: shape {list(value.shape)}, expected {list(expected.shape)}"
        if value.dtype != expected.dtype:
            return f"output {index}: dtype {value.dtype}, expected {expected.dtype}"
        same = torch.equal(value, expected) if expected.dtype == torch.bool else \
            torch.allclose(value, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
        if not same:
            return f"output {index} differs from the traced one (rtol {RTOL}, atol {ATOL})"
    return ""


def try_backend(node: Any, backend: str) -> Attempt:
    """Export node with backend into a temporary directory, load it as InferenceManager
    does and run it on the traced examples."""
    from .backends import export_node
    from ..models.load import load
    started = time.perf_counter()
    module = info(node).graph_module.module
    examples = _examples(node)
    reason = ""
    op = None
    with tempfile.TemporaryDirectory(prefix="leapp-survey-") as tmp:
        try:
            with third_party_to_log(f"trying {backend} on {node.name}"):
                exported = export_node(node.name, backend, None, module, examples[0][0],
                                       [p.name for p in node.inputs],
                                       [p.name for p in node.outputs], tmp)
                dropped = set(exported.dropped_inputs)
                keep = [i for i, n in enumerate(exported.input_names) if n not in dropped]
                device = "cuda" if any(isinstance(t, torch.Tensor) and t.is_cuda
                                       for t in examples[0][1]) else "cpu"
                with console_to_log(f"loading {node.name} exported with {backend}"):
                    _, call, device = load(exported.yaml_backend, exported.path,
                                           input_names=[exported.input_names[i] for i in keep],
                                           device=device)
                for inputs, outputs in examples:
                    args = [inputs[i].to(device) if isinstance(inputs[i], torch.Tensor)
                            else inputs[i] for i in keep]
                    with torch.no_grad(), torch.jit.optimized_execution(False):
                        reason = _matches(call(*args), outputs)
                    if reason:
                        reason = f"exports, but {reason}"
                        break
                if not reason and not info(node).random_ops:
                    reason = _fresh(module, call, keep, device, examples[0][0],
                                    [p.name for p in node.outputs])
                del call
        except Exception as error:  # noqa: BLE001  (any failure is this backend's answer)
            reason = _reason(error)
            op = error.op if isinstance(error, ExportError) else None
    if reason.startswith("exports, but") and info(node).random_ops:
        ops = ", ".join(sorted({label for label, _, _ in info(node).random_ops}))
        reason += f": the node draws random numbers ({ops}), which no export reproduces"
    seconds = time.perf_counter() - started
    return Attempt(backend, not reason, reason, seconds, op)


def _fresh(module: Any, call: Any, keep: list[int], device: str, inputs: list,
           output_names: list[str]) -> str:
    """'' when the loaded model agrees with eager on inputs the trace never drew
    (leapp.compiling.fresh_inputs: NaN, infinities, large values...), else how not."""
    from .fresh_inputs import first_difference

    def run(draw: Any) -> list:
        args = [draw[i].to(device) if isinstance(draw[i], torch.Tensor) else draw[i]
                for i in keep]
        with torch.no_grad(), torch.jit.optimized_execution(False):
            got = call(*args)
        return list(got) if isinstance(got, (tuple, list)) else [got]

    difference = first_difference(module, run, inputs, output_names)
    return "" if difference is None else \
        f"exports, but differs from eager {difference.describe()}"


def survey(node: Any, skip: Sequence[str] = (), budget: float | None = None) -> list[Attempt]:
    """Every surveyed backend but those in skip (canonical names) tried on node, within
    budget seconds (default budget_seconds())."""
    budget = budget_seconds() if budget is None else budget
    started = time.perf_counter()
    attempts = []
    for backend, _ in SURVEYED:
        if backend in skip:
            continue
        if time.perf_counter() - started >= budget:
            attempts.append(Attempt(backend, None, f"not tried: the survey's {budget:g} s were "
                                    f"up (LEAPP_SURVEY_SECONDS)"))
            continue
        attempt = try_backend(node, backend)
        logger.info("%s with %s: %s (%.2f s)", node.name, backend,
                    "exports and validates" if attempt.ok else attempt.reason, attempt.seconds)
        attempts.append(attempt)
    return attempts


def _quoted(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) <= 1:
        return "".join(quoted)
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def advice(attempts: Sequence[Attempt], failed: str | None = None,
           failed_reason: str = "") -> str:
    """The sentence naming the backends that export the node, or each one's reason."""
    working = [a.export_with for a in attempts if a.ok]
    if working:
        verb = "exports" if len(working) == 1 else "export"
        return (f"export_with={_quoted(working)} {verb} this node (each exported and "
                f"validated on the traced inputs and on fresh ones: NaN, infinities, large "
                f"values).")
    lines = ["No backend exports this node:"]
    if failed is not None:
        lines.append(f"    {SHORT.get(failed, failed)}: {failed_reason}")
    lines.extend(f"    {a.export_with}: {a.reason}" for a in attempts)
    return "\n".join(lines)


def export_failed(node: Any, error: BaseException) -> NoReturn:
    """compile_graph's answer to a node whose export failed: the clear error, with the
    backends that do export the node (an ExportError), or leapp's own error as it was."""
    if not isinstance(error, ExportError):
        message = f"Error compiling model {node.name}: {error}"
        kind: type[BaseException] = type(error)
        try:
            kind(message)
        except Exception:  # noqa: BLE001  (a class that is not rebuilt from a message)
            kind = RuntimeError
        fatal(message, kind, cause=error)
    assert isinstance(error, ExportError)  # for type checkers: fatal() raised otherwise
    where = where_traced(info(node).origins)
    budget = budget_seconds()
    others = None
    text = ""
    if budget > 0:
        logger.log(_logging.PROGRESS, "%s: %s failed (%s); trying the other backends (at "
                   "most %g s, LEAPP_SURVEY_SECONDS)", node.name, error.backend,
                   f"op {error.op}" if error.op else "see the error", budget)
        started = time.perf_counter()
        with third_party_to_log(f"surveying the backends of {node.name}"):
            others = survey(node, skip=(error.backend,), budget=budget)
        text = advice(others, error.backend, _reason(error))
        logger.info("%s: backends surveyed in %.2f s", node.name, time.perf_counter() - started)
    final = error.with_context(where, others, text)
    logger.log(_logging.FATAL, str(final))
    raise final from None


def check_backends(nodes: Sequence[str] | None = None,
                   budget: float | None = None) -> dict[str, dict[str, Attempt]]:
    """Try every backend on every node of the trace (after leapp.stop(), before
    compile_graph()): {node: {backend: Attempt}}, the backends by the names users write
    (onnx, jit, jit-trace, pt2, onnx-torchscript).  Nothing is written into the bundle.

    nodes: only these nodes; budget: seconds per node (default LEAPP_SURVEY_SECONDS or
    60).  Each node's line goes to the console at the PROGRESS level and to log.txt.
    """
    from .torch_caches import release_export_caches
    if _core.is_tracing():
        fatal("leapp.check_backends() needs a finished trace: call leapp.stop() first.")
    if SESSION.config is None:
        fatal("leapp.check_backends() called before leapp.start(): nothing was traced.")
    every = sorted(_core.nodes().values(), key=lambda n: n.node_index)
    wanted = list(nodes) if nodes is not None else [n.name for n in every]
    known = {n.name: n for n in every}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        fatal(f"leapp.check_backends(nodes=...): no traced node named {unknown}; the trace "
              f"has {sorted(known)}", ValueError)
    result: dict[str, dict[str, Attempt]] = {}
    try:
        for name in wanted:
            node = known[name]
            if name in SESSION.config.non_traced:
                continue
            attempts = survey(node, budget=budget_seconds() if budget is None else budget)
            result[name] = {a.export_with: a for a in attempts}
            working = [a.export_with for a in attempts if a.ok]
            logger.log(_logging.PROGRESS, "%s: %s", name,
                       f"export_with={_quoted(working)} export and validate it"
                       if working else "no backend exports it")
            for attempt in attempts:
                if not attempt.ok:
                    logger.log(_logging.PROGRESS, "    %s: %s", attempt.export_with,
                               attempt.reason)
    finally:
        release_export_caches()
    return result
