"""The `leapp` command: look at, run, draw and check an exported bundle.

    leapp inspect BUNDLE.yaml         nodes, ports, edges, feedback, checksums, ports by kind
    leapp inspect MODEL.onnx          the contract a model file carries (.pt, .pt2 too)
    leapp run BUNDLE.yaml [--steps N] mock inputs through InferenceManager
    leapp draw BUNDLE.yaml [-o PNG]   the pipeline picture
    leapp view BUNDLE.yaml [-o HTML]  the interactive view (one self-contained HTML file)
    leapp check BUNDLE.yaml           load every model, run one step
    leapp check --deploy BUNDLE.yaml  is the bundle complete enough to deploy

BUNDLE.yaml may also be the bundle's directory (DIR/<DIR's name>.yaml, or the
one .yaml file it holds).
    leapp triton BUNDLE.yaml REPO     a Triton Inference Server model repository

Exit status: 0 ok, 1 a check failed (checksum, model load, a step), 2 usage
or a bundle that cannot be read.  User errors print one line, no traceback.
docs/cli.md describes each verb.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Mapping, Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_PORT_FIELDS = ("name", "dtype", "shape", "type")


class BundleError(Exception):
    """The bundle cannot be read (exit status 2)."""


class CheckFailed(Exception):
    """The bundle was read but does not hold up (exit status 1)."""


# ---- reading ------------------------------------------------------------------------------

def _read_bundle(path: str) -> Any:
    """The bundle's checked :class:`leapp.bundle.pipeline.Pipeline`; BundleError when it cannot be read.

    Parsed by InferenceManager's safe loader (no anchors or aliases, bounded
    size and depth, regular files only) and checked as InferenceManager checks it.
    """
    from .bundle.safe_load import BundleError as Unreadable, read_bundle
    from .bundle.pipeline import Pipeline
    try:
        return Pipeline.from_document(read_bundle(path))
    except Unreadable as exc:
        raise BundleError(str(exc)) from exc
    except ValueError as exc:
        raise BundleError(f"{path}: {_one_line(exc)}") from exc


def _bundle_path(path: str) -> str:
    """path, or for a bundle directory its YAML: DIR/<DIR's name>.yaml, else the one .yaml
    file DIR holds.  A directory with neither stays as given (the reader says so)."""
    if not os.path.isdir(path):
        return path
    named = os.path.join(path, os.path.basename(os.path.normpath(path)) + ".yaml")
    if os.path.isfile(named):
        return named
    found = [entry for entry in sorted(os.listdir(path))
             if entry.endswith(".yaml") and os.path.isfile(os.path.join(path, entry))]
    return os.path.join(path, found[0]) if len(found) == 1 else path


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def _checksum(yaml_dir: str, name: str, parameters: Mapping[str, Any]) -> tuple[str, bool]:
    """(what to print, ok) for one node's model file (confined to the bundle)."""
    from .bundle.safe_load import bundle_file_sha256
    model_path = parameters.get("model_path")
    if not model_path:
        return "no model", True
    try:
        _, actual = bundle_file_sha256(yaml_dir, model_path, f"model file of node '{name}'")
    except FileNotFoundError:
        return f"{model_path}: MISSING", False
    except ValueError as exc:  # outside the bundle, not a regular file, not a string
        return f"{model_path}: REFUSED ({_one_line(exc)})", False
    expected = parameters.get("sha256sum")
    if expected is None:
        return f"{model_path}: no sha256sum recorded", False
    if actual != expected:
        return f"{model_path}: sha256 MISMATCH", False
    return f"{model_path}: sha256 ok", True


def _port_text(entry: Mapping[str, Any]) -> str:
    shape = entry.get("shape")
    dims = "x".join(str(s) for s in shape) if isinstance(shape, (list, tuple)) else shape
    extra = [f"{k}={_short(v)}" for k, v in entry.items() if k not in _PORT_FIELDS]
    text = f"{entry.get('name')}: {entry.get('dtype')}[{dims}]"
    return text + (f"  ({', '.join(extra)})" if extra else "")


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- verbs --------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace, out: Any) -> int:
    if args.bundle.endswith(_MODEL_SUFFIXES):
        return _inspect_model(args.bundle, out)
    model = _read_bundle(args.bundle)
    yaml_dir = os.path.dirname(os.path.abspath(args.bundle))
    system = model.system_information
    feeds: dict[str, list[str]] = {}
    for edge in model.edges:
        feeds.setdefault(edge.target, []).append(
            edge.source + (" (feedback)" if edge.feedback else ""))
    graph_inputs = set(model.input_keys())
    failed = []
    graph = os.path.splitext(os.path.basename(args.bundle))[0]
    print(f"bundle {graph}: {len(model.nodes)} node(s), leapp {system.get('leapp version')}, "
          f"torch {system.get('torch version')}", file=out)
    for name, node in model.nodes.items():
        checksum, ok = _checksum(yaml_dir, name, node.parameters)
        if not ok:
            failed.append(f"{name}: {checksum}")
        print(f"\nnode {name}  backend={node.backend}  {checksum}", file=out)
        for port in node.inputs:
            key = f"{name}/{port.name}"
            source = ", ".join(feeds.get(key, [])) or (
                "graph input" if key in graph_inputs else "unconnected")
            print(f"  in   {_port_text(port.entry)}  <- {source}", file=out)
        for port in node.outputs:
            print(f"  out  {_port_text(port.entry)}", file=out)
    for title, edges in (("\nedges", list(model.forward_edges())),
                         ("feedback", list(model.feedback_edges()))):
        print(f"{title} ({len(edges)}):", file=out)
        for edge in edges:
            print(f"  {edge.source} -> {edge.target}", file=out)
    if model.initial_values:
        print(f"initial values: {model.initial_values}", file=out)
    print(f"graph inputs: {', '.join(model.input_keys()) or '-'}", file=out)
    print(f"graph outputs: {', '.join(model.output_keys()) or '-'}", file=out)
    _print_catalogue(model, out)
    _print_analytics(yaml_dir, graph, list(model.nodes), out)
    if failed:
        raise CheckFailed("checksums failed: " + "; ".join(failed))
    print("checksums: ok", file=out)
    return EXIT_OK


def _print_catalogue(model: Any, out: Any) -> None:
    """The port catalogue (leapp.bundle.ports): the frequency, then the graph inputs and
    outputs grouped by kind (first seen first, YAML order inside), then the feedback
    ports with their sources."""
    from .bundle.ports import describe
    frequency = model.frequency
    print("frequency: " + (f"{frequency:g} Hz (period {1000.0 / frequency:g} ms)"
                           if frequency is not None else
                           "none (the pipeline's configs name no frequency)"), file=out)
    groups: dict[str, list[tuple[str, Any]]] = {}
    for side, ports in (("in", model.input_ports), ("out", model.output_ports)):
        for port in ports.values():
            kind = port.kind_name
            label = "(no kind)" if kind is None else str(kind)
            groups.setdefault(label, []).append((side, port))
    print(f"ports by kind ({len(groups)} kind(s)):", file=out)
    for label in sorted(groups, key=lambda k: k == "(no kind)"):  # stable: first seen first
        print(f"  {label}", file=out)
        for side, port in groups[label]:
            print(f"    {side:4} {describe(port)}", file=out)
    feedback = model.feedback_ports
    print(f"feedback ports ({len(feedback)}):", file=out)
    for port in feedback.values():
        print(f"    in   {describe(port)}", file=out)


def _print_analytics(yaml_dir: str, graph: str, nodes: list[str], out: Any) -> None:
    """The compile's validation analytics (``<graph>_analytics.json``, leapp.bundle.analytics):
    per node the checks that passed and the largest error, then each failed check."""
    from .bundle import analytics
    name = analytics.file_name(graph)
    try:
        entries = analytics.read(yaml_dir, graph)
    except ValueError as exc:
        print(f"validation analytics: unreadable: {exc}", file=out)
        return
    if entries is None:
        print(f"validation analytics: none (no {name}: compiled with validate=False, or by "
              f"another leapp)", file=out)
        return
    print(f"validation analytics ({name}, {len(entries)} check(s)):", file=out)
    for node, rows in analytics.by_node(entries, nodes).items():
        if not rows:
            print(f"  {node}: no checks (no model)", file=out)
            continue
        passed = sum(1 for row in rows if row["passed"])
        errors = [row["max_abs"] for row in rows if isinstance(row.get("max_abs"), float)]
        largest = f", max abs error {max(errors):.3e}" if errors else ""
        print(f"  {node}: {passed}/{len(rows)} passed{largest}", file=out)
        for row in rows:
            if not row["passed"]:
                why = row.get("reason") or f"max abs error {row.get('max_abs')}"
                print(f"    FAIL {row['output']} sample {row['sample']}: {why}", file=out)


_MODEL_SUFFIXES = (".onnx", ".pt", ".pt2")


def _inspect_model(path: str, out: Any) -> int:
    """`leapp inspect MODEL`: the contract a single model file carries (docs/deploy.md)."""
    import json

    from .bundle.contract import ContractError, read
    if not os.path.isfile(path):
        raise BundleError(f"no such model file: {path}")
    try:
        contract = read(path)
    except ContractError as exc:
        raise CheckFailed(_one_line(exc)) from exc
    what = f"node {contract.get('node')}" if contract.get("artifact") == "node" \
        else f"fused pipeline ({contract.get('format')})"
    print(f"model {path}: {what} of graph {contract.get('graph')}, leapp "
          f"{contract.get('leapp_version')}, contract schema {contract.get('schema_version')}",
          file=out)
    for side in ("inputs", "outputs"):
        for port in contract.get(side) or []:
            entry = {"name": port.get("name"), "dtype": port.get("dtype"),
                     "shape": port.get("shape"), **(port.get("semantics") or {})}
            where = [f"{k}={port[k]}" for k in ("graph_input", "graph_output", "source",
                                                "state") if port.get(k) is not None]
            print(f"  {side[:-1]:6} {_port_text(entry)}  {' '.join(where)}".rstrip(), file=out)
    for pair in contract.get("feedback") or []:
        print(f"  state  {pair['input']} <- {pair['output']} (initial "
              f"{'recorded' if pair.get('initial') else 'zeros'})", file=out)
    if contract.get("configs"):
        print(f"  configs {contract['configs']}", file=out)
    print("contract (JSON):", file=out)
    print(json.dumps(contract, indent=1), file=out)
    return EXIT_OK


def _manager(path: str) -> Any:
    """InferenceManager for a readable bundle; its refusals are failed checks."""
    _read_bundle(path)
    from .running.inference_manager import InferenceManager
    try:
        return InferenceManager(path)
    except Exception as exc:  # noqa: BLE001  (a model that does not load is the finding)
        raise CheckFailed(f"{type(exc).__name__}: {_one_line(exc)}") from exc


def _step(manager: Any) -> dict:
    import torch
    with torch.no_grad():
        try:
            return manager.run_policy(manager.get_mock_input())
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"a pipeline step failed: {type(exc).__name__}: "
                              f"{_one_line(exc)}") from exc


def cmd_run(args: argparse.Namespace, out: Any) -> int:
    manager = _manager(args.bundle)
    outputs: dict = {}
    for step in range(args.steps):
        started = time.perf_counter()
        outputs = _step(manager)
        print(f"step {step + 1}: {(time.perf_counter() - started) * 1e3:.3f} ms", file=out)
    for key, value in outputs.items():
        shape = "x".join(str(s) for s in value.shape)
        print(f"{key}: {str(value.dtype).replace('torch.', '')}[{shape}]", file=out)
    return EXIT_OK


def cmd_draw(args: argparse.Namespace, out: Any) -> int:
    model = _read_bundle(args.bundle)
    graph = os.path.splitext(os.path.basename(args.bundle))[0]
    target = args.output or os.path.splitext(args.bundle)[0] + ".png"
    if not target.endswith(".png"):
        raise BundleError(f"-o {target}: the picture is a PNG; give a path ending in .png")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise BundleError(f"-o {target}: directory {parent} does not exist")
    from .drawing.png import draw
    try:
        draw(model, target, graph)
    except (RuntimeError, OSError) as exc:
        raise BundleError(_one_line(exc)) from exc
    print(f"wrote {target}", file=out)
    return EXIT_OK


def cmd_view(args: argparse.Namespace, out: Any) -> int:
    _read_bundle(args.bundle)
    target = args.output or os.path.splitext(args.bundle)[0] + ".html"
    if not target.endswith((".html", ".htm")):
        raise BundleError(f"-o {target}: the view is an HTML page; give a path ending in .html")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise BundleError(f"-o {target}: directory {parent} does not exist")
    from .drawing.html import write_view
    try:
        write_view(args.bundle, target)
    except (RuntimeError, OSError) as exc:
        raise BundleError(_one_line(exc)) from exc
    print(f"wrote {target}", file=out)
    return EXIT_OK


def cmd_check(args: argparse.Namespace, out: Any) -> int:
    if args.deploy:
        _read_bundle(args.bundle)
        from .compiling.deploy_check import run_cli
        failed = run_cli(args.bundle, out)
        if failed:
            raise CheckFailed(f"{failed} deploy check(s) failed (each listed above with its fix)")
        return EXIT_OK
    manager = _manager(args.bundle)
    _step(manager)
    print(f"ok: {len(manager.nodes)} node(s) loaded, checksums match, one step ran", file=out)
    return EXIT_OK


def cmd_triton(args: argparse.Namespace, out: Any) -> int:
    _read_bundle(args.bundle)
    from .serving.fusion import FuseError
    from .serving.triton import TritonRepositoryError, write_repository
    try:
        repository = write_repository(args.bundle, args.repository, serve_with=args.serve_with,
                                      fused_model=args.fused, fleet_size=args.fleet_size,
                                      batch=not args.no_batch,
                                      queue_delay_us=args.queue_delay_us,
                                      instances=args.instances)
    except (TritonRepositoryError, FileExistsError, ImportError) as exc:
        raise BundleError(_one_line(exc)) from exc
    except FuseError as exc:
        raise CheckFailed(_one_line(exc)) from exc
    kind = "a sequence model (one state per correlation ID)" if repository.sequence else \
        ("a batched model" if repository.max_batch_size else "an ensemble")
    if repository.max_batch_size:
        kind += f", up to {repository.max_batch_size} robots per execution"
    print(f"wrote {repository.path}: {len(repository.models)} model(s), serve_with="
          f"{args.serve_with}", file=out)
    print(f"call {repository.entry!r}, {kind}", file=out)
    for title, tensors in (("inputs", repository.inputs), ("outputs", repository.outputs)):
        for name, (datatype, shape) in tensors.items():
            print(f"  {title[:-1]:6} {name}: {datatype}{shape}", file=out)
    return EXIT_OK


# ---- entry point --------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leapp", description="Look at, run, draw and check a bundle exported by "
        "leapp.compile_graph().",
        epilog="exit status: 0 ok, 1 a check failed, 2 usage error or unreadable bundle")
    verbs = parser.add_subparsers(dest="verb", metavar="{inspect,run,draw,view,check,triton}")
    verbs.required = True

    def verb(name: str, text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=text, description=text)
        sub.add_argument("bundle", metavar="BUNDLE.yaml", help="the bundle's YAML file, or its "
                         "directory")
        return sub

    verb("inspect", "Print nodes, ports (shape, dtype, kind), edges, feedback, the frequency "
         "and the port catalogue (graph inputs and outputs by kind, with element names and "
         "the time axis' period) and verify the model checksums (exit 1 on a mismatch); "
         "given a model file (.onnx, .pt, .pt2), print the contract it carries."
         ).set_defaults(run=cmd_inspect)
    run = verb("run", "Run mock inputs through InferenceManager and print the time of "
               "each step.")
    run.add_argument("--steps", type=_positive, default=1, metavar="N",
                     help="number of steps (default 1)")
    run.set_defaults(run=cmd_run)
    draw = verb("draw", "Draw the pipeline picture.")
    draw.add_argument("-o", "--output", metavar="PNG",
                      help="where to write it (default: BUNDLE.png beside the YAML)")
    draw.set_defaults(run=cmd_draw)
    view = verb("view", "Write the interactive view: one self-contained HTML page with the "
                "pipeline, each node's ports, validation analytics, warnings and op graph.")
    view.add_argument("-o", "--output", metavar="HTML",
                      help="where to write it (default: BUNDLE.html beside the YAML)")
    view.set_defaults(run=cmd_view)
    check = verb("check", "Load every model, verify checksums and run one step with mock "
                 "inputs; exit 0 when all of it works, 1 when not.")
    check.add_argument("--deploy", action="store_true",
                       help="instead, check the bundle is complete enough to deploy (kinds, "
                       "element names, initial values, frequency, dtypes, contracts); "
                       "docs/deploy.md")
    check.set_defaults(run=cmd_check)
    triton = verb("triton", "Write a Triton Inference Server model repository that serves the "
                  "bundle (an ensemble, or the fused model under the sequence batcher when "
                  "the bundle has feedback).")
    triton.add_argument("repository", metavar="REPO_DIR",
                        help="the repository to create (new or empty)")
    triton.add_argument("--serve-with", choices=("native", "python"), default="native",
                        help="native: Triton's onnxruntime/pytorch backends where they apply "
                        "(default); python: every model in the python backend")
    triton.add_argument("--fused", metavar="MODEL",
                        help="a fused model of the bundle (leapp.fuse) to serve; by default "
                        "the one the YAML records, else the bundle is fused for the "
                        "repository")
    triton.add_argument("--fleet-size", "--max-sequences", type=_positive, default=None,
                        metavar="N", dest="fleet_size",
                        help="robots (correlation IDs) served at once (default and most: 128); "
                        "a robot beyond it is refused")
    triton.add_argument("--no-batch", action="store_true",
                        help="one robot per request: an ensemble of one model per node, or "
                        "the one-robot fused model")
    triton.add_argument("--queue-delay-us", type=int, default=1000, metavar="US",
                        help="how long the batcher waits to fill a batch (default 1000)")
    triton.add_argument("--instances", choices=("cpu", "gpu"), default="cpu",
                        help="the model instance group's kind (default cpu)")
    triton.set_defaults(run=cmd_triton)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 with argparse's message on a usage error
    args.bundle = _bundle_path(args.bundle)  # a bundle directory stands for its YAML
    try:
        return args.run(args, sys.stdout)
    except BundleError as exc:
        print(f"leapp {args.verb}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckFailed as exc:
        print(f"leapp {args.verb}: FAILED: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001  (a bundle shaped in a way no check foresaw)
        if os.environ.get("LEAPP_DEBUG"):
            raise
        print(f"leapp {args.verb}: error: {type(exc).__name__}: {_one_line(exc)} (set "
              f"LEAPP_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
