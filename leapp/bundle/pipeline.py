"""The pipeline of a bundle as one typed, immutable model.

A bundle's YAML describes a pipeline: nodes with their ports, the edges
between those ports (forward along ``data_flow``, back along
``feedback_flow``), the graph's inputs and outputs and the file of initial
feedback values.  :class:`Pipeline` is that description, checked once:
``compile_graph`` builds it from the session and writes the YAML from it;
``InferenceManager``, the picture, ``leapp.fuse``, the Triton repositories
and the command line read it from the YAML through :meth:`Pipeline.load`,
and nothing else parses a bundle's wiring.  :func:`split_key` is the one
parser of ``"node/port"`` keys.

The edges themselves are computed in C (``_core.build_pipeline`` classifies
each traced connection as forward or feedback while the session's nodes are
at hand); this module gives them types, the run order and the checks a
reader needs, which cost nothing on the tracing hot path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from .dtypes import BY_NAME, SPELLINGS
from .log import reject
from .ports import INPUT, OUTPUT, InferencePort, PortCatalog, port_record
from .safe_load import (BUNDLE_DOCUMENTS, MAX_BUNDLE_PORT_BYTES, check_port_bytes, fail,
                        parse_shape, quote, size_text)
from . import wiring
from .wiring import join_key

#: Edge kinds.  Forward edges are ``data_flow``; the others are
#: ``feedback_flow``: between two nodes, from a node to another input of its
#: own (``self``), or from a declared state to its own input (``state``).
FORWARD, FEEDBACK, SELF, STATE = "forward", "feedback", "self", "state"

#: The key of graph outputs in ``InferenceManager.value_dict``; no node may be named so.
OUTPUT_KEY = "==out=="

#: The three YAML documents of a bundle, in file order (defined by the safe reader).
DOCUMENTS = BUNDLE_DOCUMENTS

#: The formats a bundle's ``fused`` record may name (``leapp.fuse``), each with its file suffix.
FUSED_FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}

_FLOWS = ("data_flow", "feedback_flow", "inputs", "outputs")

#: dtype names a port may carry -> the torch dtype's attribute name (leapp.bundle.dtypes).
DTYPES: Mapping[str, str] = SPELLINGS
_PARAMETERS = ("model_path", "md5sum", "sha256sum", "backend")


def split_key(key: Any, what: str) -> tuple[str, str]:
    """Split ``"node/port"`` into its two parts, or raise a ValueError naming ``what``."""
    if not isinstance(key, str):
        reject(f"Invalid {what} key {quote(key)}: expected a 'node_name/port_name' string")
    parts = key.split("/")
    if len(parts) != 2:
        reason = ("too many values to unpack (expected 2)" if len(parts) > 2
                  else f"not enough values to unpack (expected 2, got {len(parts)})")
        reject(f"Invalid {what} key {quote(key)}: {reason}. "
               "Expected format: node_name/port_name")
    return parts[0], parts[1]


def check_name(name: Any, what: str) -> str:
    """A node or port name: a non-empty string without ``/``."""
    if not isinstance(name, str) or not name or "/" in name or name == OUTPUT_KEY:
        reject(f"Invalid {what} {quote(name)}: expected a non-empty string without '/'")
    return name


def dtype_name(value: Any, where: str) -> str:
    """The canonical name of a port's dtype (``"torch.float32"`` and ``"float"`` read as
    ``"float32"``), or a ValueError naming ``where``."""
    name = None
    if isinstance(value, str):
        name = DTYPES.get(value[len("torch."):] if value.startswith("torch.") else value)
    if name is None:
        reject(f"Unsupported dtype {quote(value)} for {where}. "
               f"Supported dtypes: {sorted(DTYPES)}")
    return name


def torch_dtype(value: Any, where: str) -> Any:
    """The ``torch.dtype`` a port's dtype names (a ``torch.dtype`` passes through)."""
    import torch
    if isinstance(value, torch.dtype):
        return value
    return getattr(torch, dtype_name(value, where))


def _mapping(value: Any, where: str, allow_none: bool = False) -> dict:
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        reject(f"{where} must be a mapping, got {quote(value)}")
    return value


def _name_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if type(value) not in (list, tuple) or not all(type(v) is str and v for v in value):
        reject(f"{where} must be a list of names, got {quote(value)}")
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


class _List(tuple):
    """A frozen list: written back as a block-style list (a tuple is written flow-style)."""


def _frozen(value: Any) -> Any:
    """A read-only deep copy of YAML data (mappings, lists and tuples)."""
    kind = type(value)
    if kind is dict:
        return MappingProxyType({k: v if type(v) in _SCALARS else _frozen(v)
                                 for k, v in value.items()})
    if kind is list:
        return _List([_frozen(v) for v in value])
    if kind is tuple:
        return tuple([_frozen(v) for v in value])
    return value


def thawed(value: Any) -> Any:
    """The plain dicts, lists and tuples ``_frozen`` was given."""
    kind = type(value)
    if kind is MappingProxyType or kind is dict:
        return {k: v if type(v) in _SCALARS else thawed(v) for k, v in value.items()}
    if kind is _List:
        return [thawed(v) for v in value]
    if kind is tuple:
        return tuple([thawed(v) for v in value])
    return value


def flow(value: Any) -> Any:
    """Lists as tuples, nested ones too: the YAML emitter writes tuples in flow style (on
    one line)."""
    if isinstance(value, (list, tuple)):
        return tuple(flow(v) for v in value)
    return value


@dataclass(frozen=True, slots=True)
class Port:
    """One input or output of a node: its YAML entry, with name, dtype and shape checked."""

    node: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    entry: Mapping[str, Any]

    @property
    def key(self) -> str:
        """``"node/port"``."""
        return join_key(self.node, self.name)

    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` that ``dtype`` names (a ValueError for an unknown name)."""
        return torch_dtype(self.dtype, self.key)

    def description(self) -> dict[str, Any]:
        """A plain copy of the YAML entry, as read."""
        return thawed(self.entry)

    def to_entry(self) -> dict[str, Any]:
        """The YAML entry to write (shape and per-axis element names as flow-style lists;
        element names of any other form are written as given, as upstream does)."""
        out = thawed(self.entry)
        out["shape"] = tuple(self.shape)
        names = out.get("element_names")
        if isinstance(names, (list, tuple)) and all(
                item is None or isinstance(item, (str, list, tuple)) for item in names):
            out["element_names"] = flow(names)
        return out


@dataclass(frozen=True, slots=True)
class Node:
    """One node: its ports in model order and its ``parameters`` (model file, backend, ...)."""

    name: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    parameters: Mapping[str, Any]

    @property
    def backend(self) -> Any:
        return self.parameters.get("backend")

    @property
    def model_path(self) -> Any:
        return self.parameters.get("model_path")

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [p.name for p in self.outputs]

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)

    @classmethod
    def from_entry(cls, name: Any, description: Any) -> "Node":
        """Check one entry of the YAML's ``models`` mapping."""
        check_name(name, "node name")
        is_mapping = type(description) is dict or isinstance(description, Mapping)
        if not is_mapping or not all(k in description for k in ("inputs", "outputs", "parameters")):
            keys = list(description.keys()) if is_mapping else description
            reject("Model description must contain inputs, outputs, and parameters, got "
                   f"{quote(keys)}")
        params = description["parameters"]
        if params is None:
            params = {}
        elif type(params) is not dict:
            _mapping(params, f"'parameters' of node {quote(name)}")
        if not all(k in params for k in _PARAMETERS):
            reject("Model description must contain model_path, md5sum, sha256sum, and "
                   f"backend, got {quote(list(params.keys()))}")
        return cls(name, _ports(description["inputs"], name, "inputs"),
                   _ports(description["outputs"], name, "outputs"), _frozen(params))

    def to_entry(self) -> dict[str, Any]:
        return {"inputs": [p.to_entry() for p in self.inputs],
                "outputs": [p.to_entry() for p in self.outputs],
                "parameters": thawed(self.parameters)}


def _check_total_bytes(nodes: Mapping[str, Node]) -> None:
    """Refuse a bundle whose declared ports together pass MAX_BUNDLE_PORT_BYTES (every
    port is a buffer InferenceManager allocates), naming the largest ports."""
    sizes = []
    for node in nodes.values():
        for port in node.inputs + node.outputs:
            row = BY_NAME.get(SPELLINGS.get(port.dtype, ""))
            if row is not None:
                sizes.append((math.prod(port.shape) * row.torch.itemsize, port.key))
    total = sum(size for size, _ in sizes)
    if total > MAX_BUNDLE_PORT_BYTES:
        largest = ", ".join(f"{key} {size_text(size)}" for size, key in sorted(sizes)[::-1][:3])
        fail(f"The bundle's ports declare {size_text(total)} together, more than the "
             f"{size_text(MAX_BUNDLE_PORT_BYTES)} a bundle may take (MAX_BUNDLE_PORT_BYTES); "
             f"refusing to allocate them. The largest: {largest}. leapp never exports such "
             f"ports: was the YAML edited? (docs/safety.md)")


def _ports(value: Any, node: str, side: str) -> tuple[Port, ...]:
    """A node's ``inputs`` or ``outputs``: a list of {name, dtype, shape} mappings."""
    if not isinstance(value, list):
        reject(f"'{side}' of node {quote(node)} must be a list of port descriptions, "
               f"got {quote(value)}")
    seen: set[str] = set()
    ports = []
    for entry in value:
        if type(entry) is not dict or "name" not in entry or "dtype" not in entry \
                or "shape" not in entry:
            reject(f"Each of the {side} of node {quote(node)} must be a mapping with name, "
                   f"dtype and shape, got {quote(entry)}")
        name = entry["name"]
        if type(name) is not str or not name or "/" in name or name == OUTPUT_KEY:
            check_name(name, f"{side[:-1]} name of node {quote(node)}")
        if name in seen:
            reject(f"Node {quote(node)} declares the {side[:-1]} {quote(name)} twice")
        seen.add(name)
        where = f"{node}/{name}"
        shape = parse_shape(entry["shape"], where)
        dtype = entry["dtype"]
        if type(dtype) is not str or not dtype:
            dtype_name(dtype, where)  # raises: a dtype is a name
        # an unknown name is the reader's call (InferenceManager refuses it, Triton
        # names its own table): the model keeps what the YAML says
        row = BY_NAME.get(SPELLINGS.get(dtype, ""))
        if row is not None:
            check_port_bytes(shape, row.name, row.torch.itemsize, node, name)
        ports.append(Port(node, name, dtype, shape, _frozen(entry)))
    return tuple(ports)


@dataclass(frozen=True, slots=True)
class Edge:
    """A connection from an output port to an input port."""

    src_node: str
    src_port: str
    dst_node: str
    dst_port: str
    feedback: bool

    @property
    def source(self) -> str:
        return join_key(self.src_node, self.src_port)

    @property
    def target(self) -> str:
        return join_key(self.dst_node, self.dst_port)

    @property
    def kind(self) -> str:
        """FORWARD, FEEDBACK, SELF or STATE."""
        if not self.feedback:
            return FORWARD
        if self.src_node != self.dst_node:
            return FEEDBACK
        return STATE if self.src_port == self.dst_port else SELF


#: Suffix of a graph output named like an input of the same model ("reader/base"
#: in and out): the one renaming rule of fused models, Triton and contracts.
OUTPUT_SUFFIX = "__out"
#: Suffix of a feedback target's next value, where a model carries the state.
STATE_SUFFIX = "__next"

GRAPH_INPUT, UNFED = "input", "unfed"


@dataclass(frozen=True, slots=True)
class Feed:
    """What feeds one node input.

    ``kind``: ``"input"`` (a graph input), ``"forward"`` (another node's output
    of this step), ``"feedback"`` (an output of the previous step) or
    ``"unfed"`` (nothing: the zeros or initial value a runtime leaves there);
    ``source``: the feeding ``(node, port)`` of an edge, else None.
    """

    kind: str
    source: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Pipeline(PortCatalog):
    """A bundle's pipeline, checked and read-only.

    ``nodes`` keep the YAML's order; ``run_order`` puts producers before
    consumers along the forward edges (ties keep YAML order); ``sections``
    holds the ``pipeline`` document's other keys (``configs``, ...) and
    ``extra`` any top-level document after the three of every bundle.

    A pipeline built by ``compile_graph`` (:meth:`from_compile`) copies the
    documents it is given, builds its typed fields from that copy at once
    (without the reader's checks: the session checked its wiring as it was
    traced) and writes the copy as it is.  Every pipeline is complete and
    read-only from construction on; none is filled in later.

    The port catalogue (``input_ports``, ``output_ports``, ``feedback_ports``,
    ``input_by_kind`` ...; ``leapp.bundle.ports``) is read from the YAML alone:
    its records have no device and do not say whether an output is static
    (``InferenceManager``'s do).
    """

    nodes: Mapping[str, Node]
    edges: tuple[Edge, ...]
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    run_order: tuple[str, ...]
    initial_values: str | None
    sections: Mapping[str, Any]
    system_information: Mapping[str, Any]
    extra: Mapping[str, Any]
    # the documents a compiled pipeline writes (its own copy); None for one read from YAML
    _documents: tuple[dict[str, Any], ...] | None = field(default=None, repr=False,
                                                          compare=False)
    # the port catalogue, built when first read (never part of what the pipeline says)
    _catalog: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)

    @classmethod
    def from_compile(cls, models: dict[str, Any], section: dict[str, Any],
                     system_information: dict[str, Any]) -> "Pipeline":
        """The pipeline ``compile_graph`` traced, from the documents it built.

        The documents are copied (the caller's stay as they are): each port
        entry and parameter mapping, with shapes and flows as flow-style lists,
        as YAML writes them; the values inside a port entry (semantic fields)
        are shared, never written.  Ports and edges were checked as they were
        traced, so the typed fields are built from the copy without the
        reader's checks: a 200-node compile pays for copies, not for parsing.
        """
        own_models: dict[str, Any] = {}
        for name, entry in models.items():
            inputs = [{**port, "shape": tuple(port["shape"])} for port in entry["inputs"]]
            outputs = [{**port, "shape": tuple(port["shape"])} for port in entry["outputs"]]
            own_models[name] = {**entry, "inputs": inputs, "outputs": outputs,
                                "parameters": dict(entry["parameters"])}
        nodes = _CompiledNodes(own_models)
        own_section = {key: {k: tuple(v) for k, v in value.items()} if key in _FLOWS else value
                       for key, value in section.items()}
        edges = tuple(
            Edge(*split_key(source, "pipeline source"), *split_key(target, "pipeline target"),
                 feedback=(key == "feedback_flow"))
            for key in ("data_flow", "feedback_flow")
            for source, targets in own_section.get(key, {}).items() for target in targets)
        terminals = {key: tuple((node, port) for node, ports in own_section.get(key, {}).items()
                                for port in ports) for key in ("inputs", "outputs")}
        others = {k: v for k, v in own_section.items()
                  if k not in _FLOWS and k != "initial_values"}
        return cls(nodes, edges, terminals["inputs"], terminals["outputs"],
                   wiring.run_order(nodes, edges), own_section.get("initial_values"),
                   _frozen(others), _frozen(system_information), MappingProxyType({}),
                   ({"models": own_models}, {"pipeline": own_section},
                    {"system information": dict(system_information)}))

    # ---- reading ----------------------------------------------------------

    @classmethod
    def load(cls, yaml_path: str) -> "Pipeline":
        """Read and check the bundle YAML at ``yaml_path`` (see ``leapp.bundle.safe_load.load_yaml``)."""
        from .safe_load import load_yaml
        return cls.from_document(load_yaml(yaml_path))

    @classmethod
    def from_document(cls, description: Any, check_wiring: bool = True) -> "Pipeline":
        """Check the YAML's documents (a mapping of them) and build the model.

        Raises ValueError naming the section, node or key at fault.  With
        ``check_wiring`` (readers), every edge and graph port must name ports
        that exist with equal shapes and dtypes and every output must be
        routed; ``compile_graph`` skips it, its wiring being checked as traced.
        """
        if not isinstance(description, dict) or not all(k in description for k in DOCUMENTS):
            keys = list(description.keys()) if isinstance(description, dict) else description
            reject("Leapp description file must contain models, pipeline, and "
                   f"system_info, got {quote(keys)}")
        models = _mapping(description["models"], "Section 'models'")
        section = _mapping(description["pipeline"], "Section 'pipeline'")
        system = _mapping(description["system information"], "Section 'system information'")
        for name in models:
            check_name(name, "node name")
        flows = {}
        for key in _FLOWS:
            where = f"pipeline {key}"
            flow = _mapping(section.get(key), f"Section '{where}'", allow_none=True)
            for source, targets in flow.items():
                if not isinstance(source, str):
                    reject(f"Invalid {where} key {quote(source)}: expected a string")
                _name_list(targets, f"{where} entry {quote(source)}")
            flows[key] = flow
        initial = section.get("initial_values")
        if initial is not None and not isinstance(initial, str):
            reject(f"pipeline initial_values must be a file name, got {quote(initial)}")
        nodes = {name: Node.from_entry(name, entry) for name, entry in models.items()}
        _check_total_bytes(nodes)
        edges = tuple(
            Edge(*split_key(source, "pipeline source"), *split_key(target, "pipeline target"),
                 feedback=(key == "feedback_flow"))
            for key in ("data_flow", "feedback_flow")
            for source, targets in flows[key].items() for target in targets or [])
        terminals = {key: tuple((node, port) for node, ports in flows[key].items()
                                for port in ports or []) for key in ("inputs", "outputs")}
        if check_wiring:
            wiring.check_wiring(nodes, edges, terminals["inputs"], terminals["outputs"])
        others = {k: v for k, v in section.items() if k not in _FLOWS and k != "initial_values"}
        return cls(MappingProxyType(nodes), edges, terminals["inputs"], terminals["outputs"],
                   wiring.run_order(nodes, edges), initial, _frozen(others), _frozen(system),
                   _frozen({k: v for k, v in description.items() if k not in DOCUMENTS}))

    # ---- queries ----------------------------------------------------------

    def forward_edges(self) -> Iterator[Edge]:
        return (e for e in self.edges if not e.feedback)

    def feedback_edges(self) -> Iterator[Edge]:
        return (e for e in self.edges if e.feedback)

    def port(self, node: str, port: str, side: str) -> Port | None:
        """The input (``side="inputs"``) or output port ``node/port``, or None."""
        found = self.nodes.get(node)
        if found is None:
            return None
        return found.input(port) if side == "inputs" else found.output(port)

    def input_keys(self) -> list[str]:
        return [join_key(n, p) for n, p in self.inputs]

    def feeds(self) -> dict[str, dict[str, tuple[Feed, ...]]]:
        """For every node input (YAML order), what feeds it: the graph input
        first, then the edges in YAML order (forward before feedback), or one
        ``unfed`` Feed.  Two or more feeds mean the bundle feeds the input
        twice; each consumer says what it makes of that."""
        found: dict[str, dict[str, list[Feed]]] = {
            name: {port: [] for port in node.input_names} for name, node in self.nodes.items()}
        for node, port in self.inputs:
            found[node][port].append(Feed(GRAPH_INPUT))
        for edge in self.edges:
            found[edge.dst_node][edge.dst_port].append(
                Feed(FEEDBACK if edge.feedback else FORWARD, (edge.src_node, edge.src_port)))
        return {name: {port: tuple(fed) or (Feed(UNFED),) for port, fed in ports.items()}
                for name, ports in found.items()}

    def output_names(self) -> dict[tuple[str, str], str]:
        """The name each node output takes in one model of the whole pipeline
        (a fused model, a Triton ensemble, a contract), whose inputs are the
        graph inputs and the feedback targets (``"node/port"``) and whose state
        outputs are ``"<target>__next"``: its key, with ``"__out"`` appended
        where one of those names takes it (a port both in and out)."""
        targets = {edge.target for edge in self.edges if edge.feedback}
        taken = set(self.input_keys()) | targets | {t + STATE_SUFFIX for t in targets}
        names = {}
        for name, node in self.nodes.items():
            for port in node.output_names:
                key = join_key(name, port)
                names[(name, port)] = key + OUTPUT_SUFFIX if key in taken else key
        return names

    def output_keys(self) -> list[str]:
        return [join_key(n, p) for n, p in self.outputs]

    # ---- the port catalogue (leapp.bundle.ports) ---------------------------

    def port_catalog(self, devices: Mapping[str, Any] | None = None,
                     static: Mapping[tuple[str, str], bool] | None = None
                     ) -> dict[str, Mapping[str, InferencePort]]:
        """``{"inputs", "outputs", "feedback"}``: the graph inputs, the graph outputs
        and the feedback targets as :class:`~leapp.bundle.ports.InferencePort` records
        keyed ``"node/port"``, in the YAML's order.

        ``devices``: ``{node: device}`` where a runtime keeps each node's tensors;
        ``static``: ``{(node, output): bool}``, whether a node's model computes the
        output from none of its inputs.  Both unknown (None on the records) by default.
        """
        devices = devices or {}
        static = static or {}

        def record(node: str, name: str, side: str, source: str | None = None) -> InferencePort:
            port = self.port(node, name, "inputs" if side == INPUT else "outputs")
            assert port is not None  # the reader checked every graph port and edge
            return port_record(port.entry, node, side, shape=port.shape, dtype=port.dtype,
                               device=devices.get(node), static=static.get((node, name)),
                               source=source)

        feedback: dict[str, InferencePort] = {}
        for edge in self.feedback_edges():
            if edge.target not in feedback:
                feedback[edge.target] = record(edge.dst_node, edge.dst_port, INPUT, edge.source)
        return {
            "inputs": MappingProxyType({join_key(n, p): record(n, p, INPUT)
                                        for n, p in self.inputs}),
            "outputs": MappingProxyType({join_key(n, p): record(n, p, OUTPUT)
                                         for n, p in self.outputs}),
            "feedback": MappingProxyType(feedback)}

    def _ports(self) -> dict[str, Mapping[str, InferencePort]]:
        built = self._catalog.get("ports")
        if built is None:
            built = self._catalog["ports"] = self.port_catalog()
        return built

    @property
    def input_ports(self) -> Mapping[str, InferencePort]:
        """The graph inputs as port records, keyed ``"node/port"``, in YAML order."""
        return self._ports()["inputs"]

    @property
    def output_ports(self) -> Mapping[str, InferencePort]:
        """The graph outputs as port records, keyed ``"node/port"``, in YAML order."""
        return self._ports()["outputs"]

    @property
    def feedback_ports(self) -> Mapping[str, InferencePort]:
        """Every feedback target as a port record (``source``: the output feeding it),
        keyed ``"node/input"``, in the order of ``feedback_flow``."""
        return self._ports()["feedback"]

    @property
    def configs(self) -> Mapping[str, Any]:
        """The pipeline's ``configs`` (``GraphConfigs``: frequency and project fields),
        read-only; empty when the YAML has none."""
        configs = self.sections.get("configs")
        return configs if isinstance(configs, Mapping) else MappingProxyType({})

    @property
    def frequency(self) -> float | None:
        """The rate in Hz the pipeline must run at (``configs.frequency``); None when the
        YAML names none, or names something that is not a positive number."""
        value = self.configs.get("frequency")
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and value > 0:
            return value
        return None

    def with_extra(self, key: str, value: Any) -> "Pipeline":
        """This pipeline with the top-level document ``key`` (after the three of
        every bundle, such as ``fused``) set to ``value``: a new model, this one
        unchanged."""
        if key in DOCUMENTS:
            raise ValueError(f"{key!r} is one of the bundle's own documents, not an extra one")
        return replace(self, extra=MappingProxyType({**self.extra, key: _frozen(value)}))

    # ---- writing ----------------------------------------------------------

    def to_documents(self) -> list[dict[str, Any]]:
        """The YAML's documents, as ``_core.emit_yaml`` writes them."""
        documents = [{"models": {name: node.to_entry() for name, node in self.nodes.items()}},
                     {"pipeline": self.pipeline_section()},
                     {"system information": thawed(self.system_information)}]
        documents += [{key: thawed(value)} for key, value in self.extra.items()]
        return documents

    def pipeline_section(self) -> dict[str, Any]:
        """The ``pipeline`` document (flows and graph ports as flow-style lists)."""
        if self._documents is not None:  # flows hold tuples: a shallow copy is the caller's own
            return {k: dict(v) if k in _FLOWS else thawed(_frozen(v))
                    for k, v in self._documents[1]["pipeline"].items()}
        section: dict[str, Any] = {}
        if "configs" in self.sections:
            section["configs"] = thawed(self.sections["configs"])
        for key, feedback in (("data_flow", False), ("feedback_flow", True)):
            flow: dict[str, list[str]] = {}
            for edge in self.edges:
                if edge.feedback == feedback:
                    flow.setdefault(edge.source, []).append(edge.target)
            section[key] = {k: tuple(v) for k, v in flow.items()}
        if self.initial_values is not None:
            section["initial_values"] = self.initial_values
        for key, terminals in (("inputs", self.inputs), ("outputs", self.outputs)):
            grouped: dict[str, list[str]] = {}
            for node, port in terminals:
                grouped.setdefault(node, []).append(port)
            section[key] = {k: tuple(v) for k, v in grouped.items()}
        section.update({k: thawed(v) for k, v in self.sections.items() if k != "configs"})
        return section

    def to_yaml(self) -> str:
        """The bundle YAML's text."""
        from .. import _core
        if self._documents is not None:
            return _core.emit_yaml(list(self._documents) + [
                {key: thawed(value)} for key, value in self.extra.items()])
        return _core.emit_yaml(self.to_documents())


class _CompiledNodes(Mapping[str, Node]):
    """A compiled pipeline's nodes in YAML order, each built from its copied entry when
    first read (a 200-node dry-run compile reads the two at the graph's ends; the YAML is
    written from the documents).  Read-only: nothing but the cache of built nodes changes."""

    __slots__ = ("_entries", "_built")

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = entries  # the pipeline's own copies, never written
        self._built: dict[str, Node] = {}

    def __getitem__(self, name: str) -> Node:
        node = self._built.get(name)
        if node is None:
            entry = self._entries[name]  # KeyError for a name the pipeline lacks
            node = Node(name, _compiled_ports(name, entry["inputs"]),
                        _compiled_ports(name, entry["outputs"]),
                        MappingProxyType(entry["parameters"]))
            self._built[name] = node
        return node

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._entries)})"


def _compiled_ports(node: str, entries: list[dict[str, Any]]) -> tuple[Port, ...]:
    """A compiled node's ports over their (copied) entries, read-only."""
    return tuple(Port(node, e["name"], e["dtype"], e["shape"], MappingProxyType(e))
                 for e in entries)
