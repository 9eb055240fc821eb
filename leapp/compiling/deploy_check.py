"""``leapp check --deploy``: is a bundle complete enough to run on a robot?

Each check gives findings, each ``pass``, ``warn`` or ``fail`` with the node,
the port and the fix (docs/deploy.md lists them):

* ``kind``: every graph input and output has a ``kind``;
* ``element_names``: joint-level kinds (``.../joint/...``, ``kp``, ``kd``)
  name the elements of their last axis, as many names as its size (any
  port's last-axis names must count right);
* ``claims``: no two graph outputs claim the same kind and element;
* ``initial_values``: every feedback target has an initial value of its
  dtype and shape;
* ``frequency``: the pipeline's ``configs`` names a positive frequency;
* ``boundary``: graph inputs, outputs and state have dtypes ONNX Runtime and
  TensorRT accept (no float64) and static, non-empty shapes;
* ``model``: every node has a model file, its sha256 matches, and the
  contract it carries (leapp.bundle.contract) equals the YAML's;
* ``fused``: the fused model the YAML records, when there is one, matches its
  sha256 and carries the contract the YAML gives;
* ``tensorrt``: every ONNX model (a node's or the fused one) uses only ops of
  TensorRT's documented ONNX operator set, at an opset it documents
  (leapp.compiling.tensorrt_ops).

``compile_graph`` runs the checks that read the YAML and never refuses a
bundle for them.  What may make the export itself wrong (a feedback target
without its initial value) is a WARNING; what only concerns deployment
readiness (no kinds, no frequency, ...) is one INFO line with the count and
the command that lists each finding.  A check that raises (a bug in leapp) is
a ``fail`` finding saying what failed, and a WARNING at compile: it never turns
the other checks off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TextIO

from ..bundle.log import logger

PASS, WARN, FAIL = "pass", "warn", "fail"

#: dtypes ONNX Runtime takes at a model's boundary (the YAML's names).
ORT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32",
                        "int64", "uint8", "uint16", "uint32", "uint64", "bool"})
#: dtypes TensorRT takes as network inputs and outputs.
TENSORRT_DTYPES = frozenset({"float16", "float32", "bfloat16", "int8", "int32", "int64",
                             "uint8", "bool"})
_OUTPUT_KINDS_PER_JOINT = frozenset({"kp", "kd"})


@dataclass(frozen=True)
class Finding:
    """One check's verdict on one place of the bundle."""

    check: str
    status: str
    message: str
    node: str | None = None
    port: str | None = None
    fix: str | None = None

    @property
    def where(self) -> str:
        if self.node is None:
            return "bundle"
        return self.node if self.port is None else f"{self.node}/{self.port}"


def is_joint_level(kind: Any) -> bool:
    """Whether a kind describes one value per joint (element names needed)."""
    return isinstance(kind, str) and ("/joint/" in kind or kind in _OUTPUT_KINDS_PER_JOINT)


def last_axis_names(element_names: Any) -> list[str] | None:
    """The names element_names gives the last axis, or None."""
    if not isinstance(element_names, (list, tuple)) or not element_names:
        return None
    if all(isinstance(n, str) and n != "__temporal_axis__" for n in element_names):
        return list(element_names)  # a flat list of names: the last axis
    last = element_names[-1]
    if isinstance(last, (list, tuple)) and all(isinstance(n, str) for n in last):
        return list(last)
    return None


def _graph_ports(model: Any) -> Iterator[tuple[str, Any]]:
    for node, port in model.inputs:
        found = model.port(node, port, "inputs")
        if found is not None:
            yield "input", found
    for node, port in model.outputs:
        found = model.port(node, port, "outputs")
        if found is not None:
            yield "output", found


# ---- the checks that read the YAML ----------------------------------------------------------


def check_kinds(model: Any) -> list[Finding]:
    findings = []
    for side, port in _graph_ports(model):
        kind = port.description().get("kind")
        if isinstance(kind, str) and kind:
            findings.append(Finding("kind", PASS, f"graph {side} has kind {kind}",
                                    port.node, port.name))
            continue
        enum = "InputKindEnum" if side == "input" else "OutputKindEnum"
        call = "input_tensors" if side == "input" else "output_tensors"
        findings.append(Finding(
            "kind", FAIL, f"graph {side} has no kind: a deployer cannot tell what it is",
            port.node, port.name,
            f"declare it as TensorSemantics(name={port.name!r}, ref=..., kind={enum}.<...>) "
            f"in annotate.{call}({port.node!r}, ...)"))
    return findings


def check_element_names(model: Any) -> list[Finding]:
    findings = []
    for side, port in _graph_ports(model):
        kind = port.description().get("kind")
        names = last_axis_names(port.description().get("element_names"))
        size = port.shape[-1] if port.shape else 1
        fix = (f"give {port.node}/{port.name} element_names=[...] with one name per element "
               f"of its last axis ({size})"
               + (", the joint names in the robot's order" if is_joint_level(kind) else ""))
        if names is not None and len(names) != size:
            findings.append(Finding(
                "element_names", FAIL, f"element_names name {len(names)} elements but the "
                f"last axis of shape {list(port.shape)} has {size}", port.node, port.name, fix))
        elif is_joint_level(kind) and names is None:
            findings.append(Finding(
                "element_names", FAIL, f"kind {kind} is one value per joint but no "
                "element_names name the joints of its last axis", port.node, port.name, fix))
        elif is_joint_level(kind):
            findings.append(Finding("element_names", PASS, f"{len(names or [])} joints named "
                                    f"for kind {kind}", port.node, port.name))
    return findings


def check_claims(model: Any) -> list[Finding]:
    """No two graph outputs claim the same (kind, element)."""
    claimed: dict[tuple[str, str | None], Any] = {}
    findings = []
    clashes = 0
    for side, port in _graph_ports(model):
        kind = port.description().get("kind")
        if side != "output" or not isinstance(kind, str) or not kind:
            continue
        names = last_axis_names(port.description().get("element_names"))
        elements: list[str | None] = list(names) if names else [None]
        for element in elements:
            # an output without element names claims the whole kind
            rivals = [claimed.get((kind, element))] + (
                [p for (k, _), p in claimed.items() if k == kind] if element is None
                else [claimed.get((kind, None))])
            rival = next((r for r in rivals if r is not None and r is not port), None)
            if rival is not None:
                clashes += 1
                what = f"element {element!r} of kind {kind}" if element else f"kind {kind}"
                findings.append(Finding(
                    "claims", FAIL, f"claims {what}, as graph output {rival.key} does: the "
                    "robot would get two commands for it", port.node, port.name,
                    f"give one of {rival.key} and {port.key} another kind or other "
                    "element_names, or stop exposing one as a graph output"))
                break
            claimed[(kind, element)] = port
    if not clashes and claimed:
        findings.append(Finding("claims", PASS, "no two graph outputs claim the same kind "
                                "and element"))
    return findings


def check_initial_values(model: Any, bundle_dir: str | None) -> list[Finding]:
    """Every feedback target has an initial value (bundle_dir None: not read)."""
    targets = [e for e in model.feedback_edges()]
    if not targets or bundle_dir is None:
        return []
    from ..bundle.contract import initial_values
    try:
        values = initial_values(model, bundle_dir)
    except Exception as exc:  # noqa: BLE001  (a missing or unreadable file is the finding)
        return [Finding("initial_values", FAIL, f"the initial values file "
                        f"{model.initial_values!r} cannot be read: {exc}", fix="compile the "
                        "bundle again (compile_graph writes every feedback target's initial "
                        "value)")]
    findings = []
    for edge in targets:
        port = model.port(edge.dst_node, edge.dst_port, "inputs")
        value = values.get(edge.target)
        fix = (f"compile again (compile_graph writes it), or add {edge.target!r} to "
               f"{model.initial_values or '<graph>_initial_values.safetensors'} and name "
               "that file in the YAML's pipeline initial_values")
        if value is None:
            findings.append(Finding(
                "initial_values", FAIL, f"feedback target (fed by {edge.source}) has no "
                "initial value: the first step would start from zeros", edge.dst_node,
                edge.dst_port, fix))
            continue
        dtype = str(value.dtype).replace("torch.", "")
        if port is not None and (list(value.shape) != list(port.shape) or dtype != port.dtype):
            findings.append(Finding(
                "initial_values", FAIL, f"initial value is {dtype}{list(value.shape)} but the "
                f"port is {port.dtype}{list(port.shape)}", edge.dst_node, edge.dst_port, fix))
            continue
        findings.append(Finding("initial_values", PASS, f"initial value from {edge.source}'s "
                                "feedback pair is recorded", edge.dst_node, edge.dst_port))
    return findings


def check_frequency(model: Any) -> list[Finding]:
    """The pipeline's frequency as a robot program reads it (``Pipeline.frequency``,
    ``InferenceManager.frequency``): None when configs name none."""
    if model.frequency is not None:
        return [Finding("frequency", PASS, f"configs frequency {model.frequency} Hz")]
    frequency = model.configs.get("frequency")
    text = "configs names no frequency (InferenceManager.frequency is None)" \
        if frequency is None else \
        f"configs frequency {frequency!r} is not a positive number " \
        "(InferenceManager.frequency is None)"
    return [Finding("frequency", FAIL, f"{text}: the rate the policy must run at is unknown",
                    fix="compile with leapp.compile_graph(graph_configs="
                        "GraphConfigs(frequency=<Hz>))")]


def check_boundary(model: Any) -> list[Finding]:
    """dtypes and shapes of what crosses the pipeline's boundary (state included)."""
    places: list[tuple[str, Any]] = list(_graph_ports(model))
    seen = {p.key for _, p in places}
    for edge in model.feedback_edges():
        port = model.port(edge.dst_node, edge.dst_port, "inputs")
        if port is not None and port.key not in seen:
            seen.add(port.key)
            places.append(("state", port))
    findings = []
    for side, port in places:
        cast = (f"cast {port.key} to float32 inside node {port.node!r} before it leaves "
                "(or after it enters) the node")
        if port.dtype == "float64":
            findings.append(Finding("boundary", FAIL, f"{side} is float64: TensorRT refuses "
                                    "it and robots run float32", port.node, port.name, cast))
        elif port.dtype not in ORT_DTYPES:
            findings.append(Finding("boundary", FAIL, f"{side} dtype {port.dtype!r} is not one "
                                    "ONNX Runtime accepts", port.node, port.name, cast))
        elif port.dtype not in TENSORRT_DTYPES:
            findings.append(Finding("boundary", WARN, f"{side} dtype {port.dtype} is not one "
                                    "TensorRT accepts at a network's boundary", port.node,
                                    port.name, f"use int32 or float32 for {port.key}"))
        elif 0 in port.shape:
            findings.append(Finding("boundary", WARN, f"{side} shape {list(port.shape)} holds "
                                    "no element", port.node, port.name,
                                    f"drop {port.key} or give it elements"))
        else:
            findings.append(Finding("boundary", PASS, f"{side} {port.dtype}"
                                    f"{list(port.shape)}", port.node, port.name))
    return findings


#: Finding checks whose failure may make the export itself wrong (not only unready to
#: deploy): compile_graph logs them at WARNING.
EXPORT_CHECKS = frozenset({"initial_values"})
#: The message of a check that raised: leapp's own bug, never the user's bundle.
CHECK_ERROR = "the check itself failed"


def _guarded(check: str, run: Callable[[], list[Finding]]) -> list[Finding]:
    """run()'s findings, or one fail finding saying how the check failed (never hidden)."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001  (reported as a finding and, at compile, a warning)
        return [Finding(check, FAIL, f"{CHECK_ERROR}: {type(exc).__name__}: {exc}",
                        fix="a bug in leapp's deploy checks: report it with the bundle; the "
                            "other checks still ran")]


def yaml_checks(model: Any, bundle_dir: str | None) -> list[Finding]:
    """The checks that need the YAML (and the initial values file) only.

    Each check runs on its own: one that raises gives a fail finding naming
    the error, and the others still run.
    """
    runs: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("kind", lambda: check_kinds(model)),
        ("element_names", lambda: check_element_names(model)),
        ("claims", lambda: check_claims(model)),
        ("initial_values", lambda: check_initial_values(model, bundle_dir)),
        ("frequency", lambda: check_frequency(model)),
        ("boundary", lambda: check_boundary(model)),
    ]
    findings: list[Finding] = []
    for check, run in runs:
        findings += _guarded(check, run)
    return findings


# ---- the checks that read the model files ---------------------------------------------------


def _dynamic_dims(path: str) -> list[str]:
    """Inputs and outputs of an ONNX model whose shape is not static."""
    import onnx
    proto = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    dynamic = []
    for value in list(proto.graph.input) + list(proto.graph.output):
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not tensor.HasField("shape") or any(
                not d.HasField("dim_value") for d in tensor.shape.dim):
            dynamic.append(value.name)
    return dynamic


def _file_findings(check: str, node: str | None, path: str, digest: Any, wanted: dict,
                   fix: str) -> list[Finding]:
    """sha256, contract and static ONNX shapes of one model file."""
    from ..bundle.contract import ContractError, differences, read_or_none
    from ..bundle.digest import file_digests
    if digest is None or file_digests(path)[0] != digest:
        text = "no sha256sum is recorded" if digest is None else "its sha256 does not match " \
            "the YAML"
        return [Finding(check, FAIL, f"{os.path.basename(path)}: {text}", node, fix=fix)]
    try:
        found = read_or_none(path)
    except (ContractError, OSError) as exc:
        return [Finding(check, FAIL, str(exc), node, fix=fix)]
    findings = []
    if found is None:
        findings.append(Finding(check, WARN, f"{os.path.basename(path)} carries no contract "
                                "(exported by another leapp, or brought by the user)", node,
                                fix="compile the bundle again with this leapp"))
    else:
        diff = differences(found, wanted)
        if diff:
            findings.append(Finding(check, FAIL, f"{os.path.basename(path)}'s contract differs "
                                    f"from the YAML: {'; '.join(diff[:4])}", node, fix=fix))
    if path.endswith(".onnx"):
        dynamic = _dynamic_dims(path)
        if dynamic:
            findings.append(Finding(check, FAIL, f"{os.path.basename(path)} has inputs or "
                                    f"outputs of dynamic shape: {dynamic}", node,
                                    fix="export with static shapes (compile_graph does)"))
    if not findings:
        findings.append(Finding(check, PASS, f"{os.path.basename(path)}: sha256 and contract "
                                "match the YAML", node))
    return findings


def check_models(model: Any, yaml_path: str, initial: dict) -> list[Finding]:
    from ..bundle.contract import node_contract
    from ..bundle.safe_load import bundle_file
    bundle_dir = os.path.dirname(os.path.abspath(yaml_path))
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    findings = []
    for name, node in model.nodes.items():
        fix = "compile the bundle again; do not edit its files or YAML by hand"
        if not node.model_path:
            findings.append(Finding("model", WARN, "node has no model file: only the Python "
                                    "process that describes it can run it", name,
                                    fix=f"export node {name!r} with export_with='onnx' "
                                        "(or 'jit', 'pt2')"))
            continue
        try:
            path = bundle_file(bundle_dir, node.model_path, f"model file of node {name!r}")
        except (OSError, ValueError) as exc:
            findings.append(Finding("model", FAIL, str(exc), name, fix=fix))
            continue
        findings += _file_findings("model", name, path, node.parameters.get("sha256sum"),
                                   node_contract(model, graph, name, initial), fix)
    return findings


def check_fused(model: Any, yaml_path: str, initial: dict) -> list[Finding]:
    from ..bundle.contract import fused_contract
    from ..bundle.safe_load import bundle_file
    from ..bundle.pipeline import FUSED_FORMATS as FORMATS
    recorded = model.extra.get("fused")
    if not hasattr(recorded, "items") or not recorded:
        return [Finding("fused", WARN, "no fused model: the robot needs the YAML and every "
                        "node's model", fix="leapp.fuse(BUNDLE.yaml) or "
                        "compile_graph(fuse=True) writes one model for the whole pipeline")]
    bundle_dir = os.path.dirname(os.path.abspath(yaml_path))
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    findings = []
    fix = "fuse the bundle again: leapp.fuse(BUNDLE.yaml)"
    for format, entry in recorded.items():
        if format not in FORMATS or not hasattr(entry, "get"):
            findings.append(Finding("fused", FAIL, f"fused entry {format!r} is not one leapp "
                                    "writes", fix=fix))
            continue
        try:
            path = bundle_file(bundle_dir, entry.get("model_path"), f"fused {format} model")
        except (OSError, ValueError) as exc:
            findings.append(Finding("fused", FAIL, str(exc), fix=fix))
            continue
        findings += _file_findings("fused", None, path, entry.get("sha256sum"),
                                   fused_contract(model, graph, format, initial), fix)
    return findings


def check_tensorrt_ops(model: Any, yaml_path: str) -> list[Finding]:
    """Every ONNX model of the bundle (a node's, whoever wrote it, and the fused one) uses
    only ops of TensorRT's documented ONNX operator set (``leapp.compiling.tensorrt_ops``),
    at an opset TensorRT documents; what is outside is listed, as a warning (ONNX Runtime
    still runs it)."""
    from ..bundle.safe_load import bundle_file
    from . import tensorrt_ops
    bundle_dir = os.path.dirname(os.path.abspath(yaml_path))
    places = [(name, node.model_path) for name, node in model.nodes.items()]
    recorded = model.extra.get("fused")
    if hasattr(recorded, "items"):
        places += [(None, entry.get("model_path")) for entry in recorded.values()
                   if hasattr(entry, "get")]
    low, high = tensorrt_ops.TENSORRT_OPSETS
    release = f"TensorRT {tensorrt_ops.TENSORRT_VERSION}"
    findings = []
    for node, relative in places:
        if not isinstance(relative, str) or not relative.endswith(".onnx"):
            continue
        file = os.path.basename(relative)
        try:
            proto = tensorrt_ops.read(bundle_file(bundle_dir, relative, f"ONNX model {file}"))
        except Exception as exc:  # noqa: BLE001  (a missing or altered file: the model check)
            findings.append(Finding("tensorrt", WARN, f"{file}: its ops cannot be read "
                                    f"({type(exc).__name__})", node,
                                    fix="compile the bundle again"))
            continue
        counts = tensorrt_ops.op_counts(proto)
        unsupported = tensorrt_ops.outside(counts)
        opset = tensorrt_ops.default_opset(proto)
        where = f"node {node!r}" if node else "the pipeline"
        if unsupported:
            listed = ", ".join(f"{op} x{n}" for op, n in unsupported.items())
            findings.append(Finding(
                "tensorrt", WARN, f"{file} uses ops outside {release}'s documented ONNX "
                f"operator set: {listed}", node,
                fix=f"compute {where} without {', '.join(unsupported)}, or run this model "
                    "with ONNX Runtime (TensorRT's ONNX parser refuses what it lacks)"))
        if opset is not None and not low <= opset <= high:
            nearest = min(max(opset, low), high)
            findings.append(Finding(
                "tensorrt", WARN, f"{file} has opset {opset}, outside the opsets {low} to "
                f"{high} {release} documents", node,
                fix=f"export with backend_params={{'opset_version': {nearest}}}"))
        if not unsupported and (opset is None or low <= opset <= high):
            findings.append(Finding("tensorrt", PASS, f"{file}: its {len(counts)} kinds of op "
                                    f"are all in {release}'s ONNX operator set", node))
    return findings


def check_bundle(yaml_path: str) -> list[Finding]:
    """Every check on the bundle at yaml_path (raises BundleError when it cannot be read)."""
    from ..bundle.contract import initial_values, load_bundle
    model = load_bundle(yaml_path)
    bundle_dir = os.path.dirname(os.path.abspath(yaml_path))
    findings = yaml_checks(model, bundle_dir)
    try:
        initial = initial_values(model, bundle_dir)
    except Exception:  # noqa: BLE001  (reported by check_initial_values)
        initial = {}
    return (findings + _guarded("model", lambda: check_models(model, yaml_path, initial))
            + _guarded("fused", lambda: check_fused(model, yaml_path, initial))
            + _guarded("tensorrt", lambda: check_tensorrt_ops(model, yaml_path)))


# ---- reporting ------------------------------------------------------------------------------


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    result = {PASS: 0, WARN: 0, FAIL: 0}
    for finding in findings:
        result[finding.status] += 1
    return result


def report(findings: list[Finding], out: TextIO) -> dict[str, int]:
    """Print one line per finding (and its fix); returns the counts."""
    width = max((len(f.check) for f in findings), default=5)
    for finding in findings:
        print(f"{finding.status.upper():4}  {finding.check:{width}}  {finding.where}: "
              f"{finding.message}", file=out)
        if finding.status != PASS and finding.fix:
            print(f"{'':4}  {'':{width}}  fix: {finding.fix}", file=out)
    total = counts(findings)
    print(f"\n{total[PASS]} passed, {total[WARN]} warning(s), {total[FAIL]} failed", file=out)
    return total


def log_compile(model: Any, bundle_dir: str | None, bundle: str | None = None) -> None:
    """compile_graph's word on the YAML checks (bundle: the directory to name).

    What may make the export wrong (EXPORT_CHECKS) and checks that failed
    inside leapp are WARNINGs, one per check and message; the findings about
    deployment readiness are one INFO line with their count and the command
    that lists each.
    """
    try:
        findings = yaml_checks(model, bundle_dir)
    except Exception as exc:  # noqa: BLE001  (the checks never stop a compile)
        logger.warning("Deploy checks failed inside leapp and were not run: %s: %s. Run "
                       "`leapp check --deploy %s` to see which.", type(exc).__name__, exc,
                       bundle or "<bundle>")
        return
    by_check: dict[tuple[str, str], list[Finding]] = {}
    readiness: dict[str, int] = {}
    for finding in findings:
        if finding.status == PASS:
            continue
        if finding.check in EXPORT_CHECKS or finding.message.startswith(CHECK_ERROR):
            by_check.setdefault((finding.check, finding.message), []).append(finding)
        else:
            readiness[finding.check] = readiness.get(finding.check, 0) + 1
    for (check, _), found in by_check.items():
        places = ", ".join(f.where for f in found[:6]) + (", ..." if len(found) > 6 else "")
        first = found[0]
        logger.warning("Deploy check '%s': %d finding(s) (%s): %s. Fix: %s.", check,
                       len(found), places, first.message, first.fix)
    if readiness:
        total = sum(readiness.values())
        which = ", ".join(f"{check} {count}" for check, count in readiness.items())
        logger.info("Deploy readiness: %d finding(s) (%s); `leapp check --deploy %s` lists "
                    "each with its fix.", total, which, bundle or "<bundle>")


def run_cli(yaml_path: str, out: TextIO) -> int:
    """``leapp check --deploy``: print the findings; the number that failed."""
    findings = check_bundle(yaml_path)
    graph = os.path.splitext(os.path.basename(yaml_path))[0]
    print(f"deploy check of {graph} ({yaml_path})", file=out)
    return report(findings, out)[FAIL]
