"""Closed-loop validation: the staged bundle run as InferenceManager runs it.

The node checks (leapp.compiling.validation) give each exported model the
inputs it was traced with; they cannot see the wiring.  Here the whole bundle
runs step by step over the traced passes: initial values from the bundle,
feedback from its own outputs, graph inputs from the trace.  Every step's
graph outputs and feedback values are compared with what was traced; the
first difference names the step, the node, the port and both values.

Where the trace itself broke the chain (a feedback input at pass k that is not
what its source gave at pass k - 1: a reset, a done mask, a new episode), the
replay takes the traced value at that step and says so.  The chain is read
from the trace's own wiring, not from the bundle's, so a bundle that routes a
value wrongly cannot pass as a broken chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..bundle.analytics import CLOSED_LOOP, Analytics
from ..bundle.log import logger, section
from .inference_manager import InferenceManager


@dataclass
class ClosedLoop:
    """What the replay found: steps run, chain breaks taken from the trace, the
    first difference (None when the bundle reproduced every step) and its node."""

    steps: int = 0
    breaks: list = field(default_factory=list)
    difference: str | None = None
    node: str | None = None
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return self.difference is None

    def summary(self) -> dict:
        """The compile result's record of it."""
        return {"steps": self.steps, "passed": self.passed, "difference": self.difference,
                "breaks": list(self.breaks), "skipped": self.skipped}


def _traced(port: Any, step: int) -> Any:
    return port.value if step == 0 else port.samples[step - 1]


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    a = a.detach().to(b.device)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


def _shown(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return repr(value)
    flat = value.detach().flatten()
    head = ", ".join(f"{float(x):.6g}" for x in flat[:4].tolist())
    more = ", ..." if flat.numel() > 4 else ""
    return f"[{head}{more}] (shape {list(value.shape)}, {str(value.dtype).replace('torch.', '')})"


class _Replay:
    """One replay: the manager over the staged bundle and the trace's ports."""

    def __init__(self, manager: Any, entries: Sequence[tuple], rtol: float,
                 atol: float, analytics: Analytics, changed: dict) -> None:
        self.manager = manager
        self.changed = changed  # node -> {input: why}: fed back changed outside the node
        self.checked = 0        # feedback values compared with what their source gave
        self.analytics = analytics
        self.rtol, self.atol = rtol, atol
        self.inputs: dict[tuple[str, str], Any] = {}   # bundle (node, input) -> traced Port
        self.outputs: dict[tuple[str, str], Any] = {}  # bundle (node, output) -> traced Port
        for name, _, in_ports, out_ports in entries:
            node = manager.nodes[name]
            self.inputs.update({(name, yaml): port
                                for yaml, port in zip(node.input_names, in_ports)})
            self.outputs.update({(name, yaml): port
                                 for yaml, port in zip(node.output_names, out_ports)})
        self.report = ClosedLoop()

    def source(self, port: Any) -> Any:
        """The traced output port that fed port in the trace, or None."""
        node = port.src_node
        if node is None:
            return None
        return next((out for out in node.outputs if out.name == port.src_port), None)

    def differ(self, step: int, node: str, port: str, what: str, got: Any,
               want: Any) -> None:
        gap = ""
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) \
                and got.shape == want.shape:
            diff = (got.detach().to(want.device).double() - want.double()).abs()
            gap = f" (max abs difference {float(diff.max()):.3e})" if diff.numel() else ""
        self.report.difference = (
            f"closed loop, step {step}: {node}/{port} ({what}): the bundle gives "
            f"{_shown(got)} where the trace has {_shown(want)}{gap}")
        self.report.node = node
        self.analytics.record(node, port + CLOSED_LOOP, step, False, self.rtol, self.atol,
                              got, want, reason=what)

    def check_wiring(self) -> bool:
        """A graph input of the bundle that the trace fed from a node: a dropped edge."""
        for key in self.manager.graph.inputs:
            port = self.inputs.get(key)
            source = self.source(port) if port is not None else None
            if source is not None:
                self.differ(0, key[0], key[1], f"a graph input of the bundle, fed by "
                            f"{port.src_node.name}/{port.src_port} in the trace",
                            None, _traced(port, 0))
                return False
        return True

    def feed_step(self, step: int) -> bool:
        """Check (step 0) or repair (a chain the trace broke) the feedback inputs."""
        for edge in self.manager.graph.feedback_edges():
            port = self.inputs[(edge.dst_node, edge.dst_port)]
            want = _traced(port, step)
            if step == 0:
                got = self.manager.value_dict[edge.dst_node][edge.dst_port]
                if not _close(got, want, self.rtol, self.atol):
                    self.differ(0, edge.dst_node, edge.dst_port, "initial value", got, want)
                    return False
                continue
            source = self.source(port)
            if source is None or not _close(want, _traced(source, step - 1), self.rtol,
                                            self.atol):
                why = self.changed.get(edge.dst_node, {}).get(port.name)
                if why is not None:  # not a reset: the loop changed the value it fed back
                    self.differ(step, edge.dst_node, edge.dst_port,
                                f"feedback changed outside every node: {why}",
                                self.manager.value_dict[edge.dst_node][edge.dst_port], want)
                    return False
                self.report.breaks.append(f"step {step}: {edge.target}")
                self.manager.set_input_value(edge.dst_node, edge.dst_port, want)
            else:
                self.checked += 1
        return True

    def run_step(self, step: int) -> bool:
        feed = {f"{node}/{name}": _traced(self.inputs[(node, name)], step)
                for node, name in self.manager.graph.inputs}
        with torch.no_grad(), torch.jit.optimized_execution(False):
            got = self.manager.run_policy(feed)
        for node, name in self.manager.graph.outputs:
            want = _traced(self.outputs[(node, name)], step)
            value = got[f"{node}/{name}"]
            if not _close(value, want, self.rtol, self.atol):
                self.differ(step, node, name, "graph output", value, want)
                return False
        for edge in self.manager.graph.feedback_edges():
            port = self.inputs[(edge.dst_node, edge.dst_port)]
            source = self.source(port)
            if source is None:
                continue  # not fed in the trace: the next step takes the traced value
            value = self.manager.value_dict[edge.dst_node][edge.dst_port]
            want = _traced(source, step)
            if not _close(value, want, self.rtol, self.atol):
                self.differ(step, edge.src_node, edge.src_port,
                            f"feedback value into {edge.target}", value, want)
                return False
        return True


def _why_not(entries: Sequence[tuple], passes: dict, random_ops: dict) -> str | None:
    """Why the bundle cannot be replayed against the trace, or None."""
    if any(model is None for _, model, _, _ in entries):
        return "a node has no exported model"
    if random_ops:
        return f"node {sorted(random_ops)[0]} draws random numbers"
    if len(set(passes.values())) > 1:
        return ("the nodes ran different numbers of passes "
                f"({', '.join(f'{n}: {k}' for n, k in sorted(passes.items()))}), so their "
                f"samples are not steps of one loop")
    return None


def run_closed_loop(yaml_path: str, entries: Sequence[tuple], passes: dict,
                    random_ops: dict, rtol: float, atol: float,
                    allow_external_paths: bool = False,
                    analytics: Analytics | None = None,
                    changed: dict | None = None) -> ClosedLoop:
    """Replay the staged bundle at yaml_path over the traced steps.

    entries are the node checks' (node, SavedModel, input ports in model order,
    output ports); passes maps each node to its traced passes; random_ops the
    nodes with random ops; analytics gets the replay's entries (a failing step, or each
    graph output's last step when every step passed); changed maps a node to its inputs
    that a later pass declared from a value computed outside every node from an output
    (leapp.tracing: h = new.clamp(...) between steps): such a step is a difference, not
    a reset.  A replay (or a skip) that leaves the bundle's feedback unchecked says so
    at WARNING.  Raises nothing the node checks did not already.
    """
    if analytics is None:
        analytics = Analytics()
    section("Closed-loop validation")
    why = _why_not(entries, passes, random_ops)
    if why is not None:
        fed_back = any(port.src_node is not None for _, _, ins, _ in entries for port in ins)
        (logger.warning if fed_back else logger.info)(
            "Closed-loop validation not run: %s.%s", why,
            " The bundle's feedback is not checked against the trace: the node checks "
            "give each model its traced inputs, never what the bundle feeds back." if fed_back
            else "")
        return ClosedLoop(skipped=why)
    steps = 1 + min((len(port.samples) for _, _, ins, outs in entries
                     for port in list(ins) + list(outs)), default=0)
    try:
        manager = InferenceManager(yaml_path, allow_external_paths, loaded={
            name: model.loaded() for name, model, _, _ in entries})
    except Exception as exc:  # a bundle InferenceManager refuses: the first difference
        report = ClosedLoop(node=entries[0][0], difference=(
            f"the bundle does not load in InferenceManager: {type(exc).__name__}: {exc}"))
        logger.error("  [FAIL] %s", report.difference)
        return report
    replay = _Replay(manager, entries, rtol, atol, analytics, changed or {})
    report = replay.report
    if replay.check_wiring():
        for step in range(steps):
            if not replay.feed_step(step) or not replay.run_step(step):
                break
            report.steps = step + 1
    for step_break in report.breaks:
        logger.info("  %s: the trace fed a value other than its feedback source's previous "
                    "output (a reset or a mask); the replay takes the traced value there",
                    step_break)
    if report.difference is not None:
        logger.error("  [FAIL] %s. The exported models each match their traced examples, "
                     "but the bundle run as InferenceManager runs it does not reproduce the "
                     "trace: check the pipeline's wiring, feedback and initial values.",
                     report.difference)
    else:
        for node, name in manager.graph.outputs:
            analytics.record(node, name + CLOSED_LOOP, steps - 1, True, rtol, atol)
        edges = list(manager.graph.feedback_edges())
        if edges and steps > 1 and not replay.checked:
            logger.warning(
                "  Closed-loop validation checked no fed-back value: every traced step fed "
                "%s a value other than its source's previous output (a reset, a mask, or "
                "the value changed outside every node), so the bundle's feedback was never "
                "compared with the loop that ran. Trace steps that feed back the node's own "
                "output to check it.", ", ".join(sorted({e.target for e in edges})))
        else:
            logger.info("  [PASS] the bundle reproduced the trace for %d step%s closed-loop",
                        steps, "s" if steps > 1 else "")
    return report
