"""Run an exported LEAPP pipeline from its YAML description.

``InferenceManager(yaml_path)`` reads the bundle written by
``leapp.compile_graph`` (config versions 1.0 to 1.4) as a ``leapp.bundle.pipeline.Pipeline``
(the wiring checked), loads one model per node through ``leapp.models.load``
(TorchScript, ONNX through onnxruntime, or torch.export), preallocates every
node input and seeds feedback inputs from the bundle's initial values.  The
routing itself is compiled once into a ``leapp._core.Program``: integer slots
for every node input and graph output, so that ``run_policy`` runs the whole
step in C and only calls back into Python for the models themselves.

Bundles are data, not code: loading never unpickles, every file the YAML names
must lie inside the bundle directory (unless ``allow_external_paths=True``)
and be a regular file, the YAML is parsed with anchors and aliases refused and
its size bounded, and every field is type-checked before anything is
allocated.  See ``docs/safety.md``.

Inputs and threads (``docs/api.md``, "InferenceManager"): a graph input left out
of ``run_policy`` keeps its current value as upstream does (zeros, then the last
value given) and is warned about once per input, or refused under
``strict=True``; a NumPy array is accepted as a tensor (shared, not copied,
when it can be); one lock makes each step atomic, so a manager can be shared by
threads.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from leapp import _core
from leapp.bundle.log import fatal, logger, reject
from leapp.bundle.safe_load import BundleError, bundle_file, clip, load_yaml, open_regular, quote
from leapp.models.load import load_node
from leapp.models.static_outputs import static_outputs
from leapp.bundle.pipeline import OUTPUT_KEY, Node, Pipeline, join_key, split_key
from leapp.bundle.ports import InferencePort, PortCatalog


class InferenceNode:
    """One node of the pipeline: its YAML description and its loaded model.

    Attributes read by downstream tools: ``input_descriptions`` and
    ``output_descriptions`` (the raw YAML entries), ``input_names``,
    ``output_names``, ``device`` (``"cpu"`` or ``"cuda"``), ``model``,
    ``mock_input`` (zero tensors of the declared shapes) and ``mock_output``.
    """

    def __init__(self, name: str, description: Mapping[str, Any] | Node, yaml_dir: str,
                 allow_external_paths: bool = False, loaded: Any = None) -> None:
        spec = description if isinstance(description, Node) \
            else Node.from_entry(name, description)
        self.name = name
        self.spec: Node = spec
        self.input_descriptions: list[dict[str, Any]] = [p.description() for p in spec.inputs]
        self.output_descriptions: list[dict[str, Any]] = [p.description() for p in spec.outputs]
        self.parameters: dict[str, Any] = spec.to_entry()["parameters"]
        self.input_names: list[str] = spec.input_names
        self.output_names: list[str] = spec.output_names
        self.input_shapes = [p.shape for p in spec.inputs]
        self.input_dtypes = [p.torch_dtype for p in spec.inputs]
        self.output_shapes = [p.shape for p in spec.outputs]
        self.output_dtypes = [p.torch_dtype for p in spec.outputs]
        if loaded is None:  # else: this node's file, already loaded by load_node
            loaded = load_node(spec, yaml_dir, allow_external_paths)
        self.backend: str = spec.backend
        self.model_path: str = loaded.path
        self.model, self.call, self.device = loaded.model, loaded.call, loaded.device
        self.mock_input: dict[str, torch.Tensor] = {
            n: torch.zeros(s, dtype=d, device=self.device)
            for n, s, d in zip(self.input_names, self.input_shapes, self.input_dtypes)}
        self.mock_output: dict[str, torch.Tensor] = {
            n: torch.zeros(s, dtype=d, device=self.device)
            for n, s, d in zip(self.output_names, self.output_shapes, self.output_dtypes)}

    def __call__(self, *args: torch.Tensor) -> Any:
        """Run the model once; a single output is returned unwrapped."""
        if len(args) != len(self.input_names):
            reject(f"Expected {len(self.input_names)} inputs, got {len(args)}")
        result = self.call(*args)
        if isinstance(result, (tuple, list)):
            if len(result) == 1:
                result = result[0]
            elif len(result) != len(self.output_names):
                fatal(f"Expected {len(self.output_names)} outputs, got {len(result)}",
                      RuntimeError)
        return result

    def __repr__(self) -> str:
        return (f"InferenceNode({self.name!r}, backend={self.backend!r}, "
                f"device={self.device!r}, inputs={self.input_names}, "
                f"outputs={self.output_names})")


#: Upstream's name for the same thing.
NodeManager = InferenceNode


class _SlotView(MutableMapping):
    """A live ``{name: tensor}`` view over some slots of the program."""

    __slots__ = ("_program", "_index", "_owner", "_lock")

    def __init__(self, program: Any, index: dict[str, int], owner: str,
                 lock: threading.Lock) -> None:
        self._program = program
        self._index = index
        self._owner = owner
        self._lock = lock

    def _slot(self, key: str) -> int:
        try:
            return self._index[key]
        except KeyError:
            raise KeyError(f"'{key}' is not an input of node '{self._owner}'. "
                           f"Available: {list(self._index)}") from None

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._program.get(self._slot(key))

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        slot = self._slot(key)
        with self._lock:  # never in the middle of a step
            self._program.set(slot, value)

    def __delitem__(self, key: str) -> None:
        raise TypeError("pipeline buffers cannot be removed")

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def _input_converter(devices: dict[str, torch.device]) -> Callable[[str, Any], Any]:
    """convert(key, value): the tensor a NumPy array stands for (on the input's device);
    anything else as is.

    Called by the C program only for a value that does not fit its slot, and by
    set_input_value.  The array's memory is shared when torch can view it (writable,
    native byte order, no negative strides); otherwise it is copied.  A closure over the
    devices alone: the program holding a bound method of the manager would make a
    reference cycle, and a dropped manager would keep its models (onnxruntime sessions,
    their threads, GPU memory) until the garbage collector ran.
    """
    def convert(key: str, value: Any) -> Any:
        np = sys.modules.get("numpy")
        if np is None or not isinstance(value, np.ndarray):
            return value
        if (not value.flags.writeable or not value.dtype.isnative
                or any(stride < 0 for stride in value.strides)):
            value = np.array(value, dtype=value.dtype.newbyteorder("="), order="C")
        try:
            tensor = torch.from_numpy(value)
        except TypeError:
            fatal(f"Input '{key}' is a NumPy array of dtype {value.dtype}, which torch "
                  "cannot hold; pass a numeric array or a tensor", TypeError)
        device = devices.get(key)
        if device is not None and tensor.device != device:
            tensor = tensor.to(device)
        return tensor
    return convert


class InferenceManager(PortCatalog):
    """Load an exported LEAPP graph from its YAML and run the whole pipeline.

    Args:
        yaml_path: path to the ``.yaml`` description written by
            ``leapp.compile_graph()``.
        allow_external_paths: accept model and initial-values paths that are
            absolute or resolve (after following symlinks) outside the YAML's
            directory.  Off by default: a bundle is self-contained, and a path
            leaving it is refused.  Turn it on only for bundles you trust.
        strict: refuse a ``run_policy`` call that leaves out a graph input
            (``KeyError`` naming it) instead of reusing the input's current
            value with a one-time warning.  An input given a value with
            ``set_input_value`` may be left out either way.  (Upstream's
            ``InferenceManager`` has no such parameter; it reuses silently.)

    The port catalogue (docs/runtime.md): ``input_ports``, ``output_ports`` and
    ``feedback_ports`` map ``"node/port"`` keys to
    :class:`~leapp.bundle.ports.InferencePort` records (kind, element names,
    shape, dtype, device, static, ...); ``input_by_kind`` / ``inputs_by_kind``
    and ``output_by_kind`` / ``outputs_by_kind`` find ports by kind; ``configs``
    and ``frequency`` give the pipeline's configs; ``zeros_input()`` a step's
    inputs, zeroed.  A robot program needs nothing else of the YAML.

    Thread safety: one manager may be shared by threads.  ``run_policy``,
    ``set_input_value`` and ``reset`` hold one lock, so each step runs whole,
    alone, and every caller gets the outputs of its own inputs; calls are
    serialised, not parallel (one manager per thread runs them in parallel).
    A pipeline with feedback keeps one state, advanced by every call in the
    order the calls take the lock: give each robot or episode its own manager.

    Raises:
        FileNotFoundError: the YAML, a model or the initial-values file is missing.
        ValueError: the YAML is malformed, unsafe (anchors/aliases, larger than
            16 MiB, a path leaving the bundle, a file that is not a regular
            file, a model archive holding pickles or code) or inconsistent, a
            model's sha256 does not match, or the feedback initial values do
            not fit the graph.  Bundle problems raise
            ``leapp.bundle.safe_load.BundleError``, a ValueError.
    """

    def __init__(self, yaml_path: str, allow_external_paths: bool = False, *,
                 strict: bool = False, loaded: Mapping[str, Any] | None = None) -> None:
        yaml_path = os.fspath(yaml_path)
        if not os.path.exists(yaml_path):
            fatal(f"Leapp description file not found at {clip(yaml_path)}", FileNotFoundError)
        if not yaml_path.endswith(".yaml"):
            reject(f"Leapp description file must end with .yaml, got {clip(yaml_path)}")
        self.model_path = yaml_path
        self._yaml_dir = os.path.dirname(os.path.abspath(yaml_path))
        self._allow_external_paths = bool(allow_external_paths)
        self._strict = bool(strict)
        # held for a whole step: the C program's slots are shared, and the
        # node calls release the GIL inside torch and onnxruntime
        self._lock = threading.Lock()
        self._load_description()
        # loaded: {node: its model as load_node loaded it from this bundle}, so
        # that compile_graph's closed-loop check runs the files it has checked
        self.nodes: dict[str, InferenceNode] = {
            name: InferenceNode(name, spec, self._yaml_dir, self._allow_external_paths,
                                (loaded or {}).get(name))
            for name, spec in self.graph.nodes.items()}
        #: graph inputs whose absence run_policy still reports: not warned
        #: about yet (or ``strict``) and not set with set_input_value
        self._watch: frozenset[str] = frozenset(self.graph.input_keys())
        self._build()
        self._load_initial_values()
        self._apply_initial_values()

    def _repr_html_(self) -> str:
        """In a notebook: the bundle's interactive view (leapp.drawing.html), inline."""
        from ..drawing.html import iframe, render_html
        graph = os.path.splitext(os.path.basename(self.model_path))[0]
        return iframe(render_html(self.graph, graph, self._yaml_dir))

    # ---- loading ----------------------------------------------------------

    def _load_description(self) -> None:
        description = load_yaml(self.model_path)
        #: The checked, read-only model of the bundle's pipeline.
        self.graph: Pipeline = Pipeline.from_document(description)
        # the raw documents, as upstream's InferenceManager exposes them
        self.leapp_description: dict[str, Any] = description
        self.models: dict[str, Any] = description["models"]
        self.pipeline: dict[str, Any] = description["pipeline"]
        self.system_info: dict[str, Any] = description["system information"]

    def _build(self) -> None:
        """Check the wiring and compile the routing into a C program."""
        nodes, graph = self.nodes, self.graph
        routes, feedback_edges = self._route()
        order = list(graph.run_order)
        self.run_order: list[str] = order
        slot_keys, shapes, dtypes, results = self._lay_out_slots()
        noutputs, dests, commits = self._destinations(routes, feedback_edges, slot_keys,
                                                      shapes, dtypes)
        input_index = {f"{n}/{p}": s for (n, p), s in self._slot_of.items() if n != OUTPUT_KEY}
        self._input_device: dict[str, torch.device] = {
            f"{n}/{p}": torch.device(nodes[n].device)
            for (n, p) in self._slot_of if n != OUTPUT_KEY}
        self._convert_input = _input_converter(self._input_device)
        self._program = _core.Program(
            names=order,
            calls=[nodes[n].call for n in order],
            inputs=[[self._slot_of[(n, p)] for p in nodes[n].input_names] for n in order],
            noutputs=noutputs,
            dests=dests,
            results=results,
            commits=commits,
            input_index=input_index,
            slot_keys=slot_keys,
            shapes=shapes,
            dtypes=dtypes,
            graph_inputs=graph.input_keys(),
            convert=self._convert_input,
        )
        self._fill_zeros()
        self._make_views()

    def _route(self) -> tuple[dict[tuple[str, str], list[tuple[str, str]]],
                              set[tuple[str, str, str, str]]]:
        """The routing table {(node, port): [destinations]}, forward targets first, then
        feedback, then graph outputs; and the feedback edges as (src..., dst...)."""
        routes: dict[tuple[str, str], list[tuple[str, str]]] = {}
        feedback_edges: set[tuple[str, str, str, str]] = set()
        for edge in self.graph.edges:
            src, dst = (edge.src_node, edge.src_port), (edge.dst_node, edge.dst_port)
            routes.setdefault(src, []).append(dst)
            if edge.feedback:
                feedback_edges.add(src + dst)
        for node, name in self.graph.outputs:
            routes.setdefault((node, name), []).append((OUTPUT_KEY, join_key(node, name)))
        self.organized_pipeline_connections: dict[str, dict[str, list[tuple[str, str]]]] = {}
        for (node, name), targets in routes.items():
            self.organized_pipeline_connections.setdefault(node, {})[name] = targets
        return routes, feedback_edges

    def _lay_out_slots(self) -> tuple[list[str], list[Any], list[Any], list[tuple[str, int]]]:
        """One slot per node input (YAML order), then per graph output: (slot keys, shapes,
        dtypes, the graph outputs' (key, slot)); fills _slot_of and _zeros."""
        nodes = self.nodes
        slot_keys: list[str] = []
        shapes: list[Any] = []
        dtypes: list[Any] = []
        self._slot_of: dict[tuple[str, str], int] = {}
        self._zeros: list[tuple[int, tuple[int, ...], torch.dtype, str]] = []
        for name, node in nodes.items():
            for port, shape, dtype in zip(node.input_names, node.input_shapes,
                                          node.input_dtypes):
                self._slot_of[(name, port)] = len(slot_keys)
                self._zeros.append((len(slot_keys), shape, dtype, node.device))
                slot_keys.append(f"{name}/{port}")
                shapes.append(shape)
                dtypes.append(dtype)
        results = []
        for node, name in self.graph.outputs:
            key = f"{node}/{name}"
            i = nodes[node].output_names.index(name)
            self._slot_of[(OUTPUT_KEY, key)] = len(slot_keys)
            self._zeros.append((len(slot_keys), nodes[node].output_shapes[i],
                                nodes[node].output_dtypes[i], nodes[node].device))
            results.append((key, len(slot_keys)))
            slot_keys.append(key)
            shapes.append(None)
            dtypes.append(None)
        return slot_keys, shapes, dtypes, results

    def _destinations(self, routes: dict, feedback_edges: set, slot_keys: list[str],
                      shapes: list[Any], dtypes: list[Any]) -> tuple[list[int],
                                                                    list[list[int]],
                                                                    list[tuple[int, int]]]:
        """Per node in run order, its outputs' destination slots: (output counts, slots per
        output, staged commits).  A feedback value whose consumer runs after its producer
        goes to a staged slot (appended to slot_keys, shapes, dtypes), committed after the
        step, so that it still arrives the next step."""
        position = {name: i for i, name in enumerate(self.run_order)}
        commits: list[tuple[int, int]] = []
        noutputs: list[int] = []
        dests: list[list[int]] = []
        for name in self.run_order:
            node = self.nodes[name]
            noutputs.append(len(node.output_names))
            for port in node.output_names:
                slots = []
                for dst in routes[(name, port)]:
                    slot = self._slot_of[dst]
                    late = dst[0] != OUTPUT_KEY and position[dst[0]] > position[name]
                    if (name, port) + dst in feedback_edges and late:
                        staged = len(slot_keys)
                        slot_keys.append(f"staged {name}/{port} -> {dst[0]}/{dst[1]}")
                        shapes.append(None)
                        dtypes.append(None)
                        commits.append((staged, slot))
                        slot = staged
                    slots.append(slot)
                dests.append(slots)
        return noutputs, dests, commits

    def _make_views(self) -> None:
        """value_dict: per node (and OUTPUT_KEY) a view of its slots in the program."""
        views: dict[str, dict[str, int]] = {name: {} for name in self.nodes}
        views[OUTPUT_KEY] = {}
        for (node, port), slot in self._slot_of.items():
            views[node][port] = slot
        self.value_dict: dict[str, _SlotView] = {
            node: _SlotView(self._program, index, node, self._lock)
            for node, index in views.items()}

    def _load_initial_values(self) -> None:
        self._initial: list[tuple[int, torch.Tensor]] = []
        filename = self.graph.initial_values
        if not filename:
            return
        path = bundle_file(self._yaml_dir, filename, "feedback initial values file",
                           self._allow_external_paths)
        from safetensors.torch import load as load_safetensors

        # every value fits a declared input: bound the file by their bytes plus a header
        limit = (1 << 24) + sum(
            math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for node in self.nodes.values()
            for shape, dtype in zip(node.input_shapes, node.input_dtypes))
        with os.fdopen(open_regular(path, "Feedback initial values file"), "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            fatal(f"Feedback initial values file {quote(path)} is larger than the {limit} "
                  "bytes the declared node inputs can hold", BundleError)
        try:
            tensors = load_safetensors(data)
        except Exception as exc:  # safetensors' own errors: truncated, bad header, dtype
            fatal(f"Feedback initial values file {quote(path)} is not a valid safetensors "
                  f"file: {type(exc).__name__}: {clip(str(exc))}", BundleError)
        for key, tensor in tensors.items():
            node, name = split_key(key, "feedback initial value")
            slot = self._slot_of.get((node, name))
            if slot is None or node == OUTPUT_KEY:
                inputs = self.nodes[node].input_names if node in self.nodes else None
                reject(f"Feedback initial value key {quote(key)} does not match any node input. "
                       f"Available nodes: {quote(list(self.nodes))}"
                       + (f"; inputs of {quote(node)}: {quote(inputs)}" if inputs is not None
                          else ""))
            target = self.nodes[node]
            i = target.input_names.index(name)
            shape, dtype = target.input_shapes[i], target.input_dtypes[i]
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                reject(f"Feedback initial value {quote(key)} is a {tensor.dtype} tensor of shape "
                       f"{tuple(tensor.shape)}, but the input is declared {dtype} {shape}")
            self._initial.append((slot, tensor.to(target.device)))

    # ---- state ------------------------------------------------------------

    def _fill_zeros(self) -> None:
        graph_inputs = {self._slot_of[key] for key in self.graph.inputs}
        #: the zero tensors the graph inputs hold until a value is given
        self._fresh: dict[int, torch.Tensor] = {}
        for slot, shape, dtype, device in self._zeros:
            zeros = torch.zeros(shape, dtype=dtype, device=device)
            self._program.set(slot, zeros)
            if slot in graph_inputs:
                self._fresh[slot] = zeros

    def _apply_initial_values(self) -> None:
        for slot, tensor in self._initial:
            self._program.set(slot, tensor.clone())

    def reset(self) -> None:
        """Zero every input buffer and graph output, then reapply the initial values.

        Buffers are replaced by fresh zero tensors, so tensors handed out by
        earlier ``run_policy`` calls keep their values.
        """
        with self._lock:
            self._fill_zeros()
            self._apply_initial_values()

    def set_input_value(self, node_name: str, input_name: str, value: torch.Tensor) -> None:
        """Give ``node_name/input_name`` a copy of ``value`` (its dtype and device kept).

        The input keeps that value until a ``run_policy`` call gives another,
        so a graph input set this way may be left out of ``run_policy`` (no
        warning, and allowed under ``strict=True``).  ``value`` may be a
        tensor or a NumPy array.
        """
        if node_name not in self.nodes:
            fatal(f"Node '{node_name}' not found. Available nodes: {list(self.nodes)}",
                  KeyError)
        node = self.nodes[node_name]
        if input_name not in node.input_names:
            fatal(f"Input '{input_name}' not found in node '{node_name}'. "
                  f"Available inputs: {node.input_names}", KeyError)
        key = join_key(node_name, input_name)
        value = self._convert_input(key, value)
        with self._lock:
            buffer = self._program.get(self._slot_of[(node_name, input_name)])
            if tuple(value.shape) != tuple(buffer.shape):
                reject(f"Shape mismatch for input '{key}': expected "
                       f"{tuple(buffer.shape)}, got {tuple(value.shape)}")
            # a fresh buffer, never a write into the old one: after a step that one may
            # be a node's output itself (a TorchScript constant fed back), and writing
            # into it would change what that model returns from then on
            fresh = torch.empty_like(buffer)
            with torch.no_grad():
                fresh.copy_(value)
            self._program.set(self._slot_of[(node_name, input_name)], fresh)
            self._watch = self._watch - {key}

    # ---- running ----------------------------------------------------------

    def run_policy(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run one step of the pipeline.

        Args:
            inputs: tensors keyed ``"node_name/input_name"``; each must have the
                declared shape and dtype.  A NumPy array is taken as the tensor
                ``torch.from_numpy`` makes of it (sharing its memory; a
                read-only array is copied) and checked the same way.  A graph
                input left out keeps its current value (zeros until one is
                given, then the last one): warned about once per input, or a
                ``KeyError`` when the manager is ``strict``.

        Returns:
            A new dict ``{"node_name/output_name": tensor}`` of the graph outputs.

        Safe to call from several threads: each call runs its step alone.
        """
        watch = self._watch
        if watch:
            if type(inputs) is not dict:
                inputs = dict(inputs)
            if not inputs.keys() >= watch:
                self._missing_inputs(inputs)
        lock = self._lock
        lock.acquire()  # not `with`: a third of the cost on CPython 3.11
        try:
            return self._program.run(inputs)
        finally:
            lock.release()

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Same as :meth:`run_policy`."""
        return self.run_policy(inputs)

    def _missing_inputs(self, inputs: Mapping[str, Any]) -> None:
        """Warn once about (or, when strict, refuse) the watched graph inputs not given."""
        with self._lock:
            missing = [(node, name) for node, name in self.graph.inputs
                       if join_key(node, name) in self._watch
                       and join_key(node, name) not in inputs]
            if not missing:  # another thread warned meanwhile
                return
            keys = [join_key(node, name) for node, name in missing]
            if self._strict:
                node, name = missing[0]
                fatal(f"run_policy: graph input{'s' if len(keys) > 1 else ''} "
                      f"{', '.join(repr(k) for k in keys)} not given, and this "
                      "InferenceManager is strict=True, which refuses a missing input "
                      "instead of reusing its current value. Pass every graph input on "
                      f"every call ({self.graph.input_keys()}), or give one a value that "
                      f"stays with set_input_value('{node}', '{name}', value).", KeyError)
            self._watch = self._watch - set(keys)
            for (node, name), key in zip(missing, keys):
                slot = self._slot_of[(node, name)]
                now = ("zeros, as no value was given yet"
                       if self._program.get(slot) is self._fresh.get(slot)
                       else "the last value given")
                logger.warning(
                    f"run_policy: graph input '{key}' was not given; this step uses {now}, "
                    "and later calls without it reuse its last value. Pass it on every "
                    f"call, or set it once with set_input_value('{node}', '{name}', value); "
                    "InferenceManager(..., strict=True) refuses a missing input. "
                    "(Warned once per input.)")

    def _graph_input_specs(self) -> Iterator[tuple[str, tuple[int, ...], torch.dtype, str]]:
        """(key, shape, dtype, device) of every graph input, in YAML order."""
        for node_name, name in self.graph.inputs:
            node = self.nodes[node_name]
            i = node.input_names.index(name)
            yield (join_key(node_name, name), node.input_shapes[i], node.input_dtypes[i],
                   node.device)

    def zeros_input(self) -> dict[str, torch.Tensor]:
        """Zeros for every graph input, with its shape, dtype and device: the inputs of a
        step, ready to be filled (``inputs[port.key][...] = value``).  A new dict of new
        tensors on every call."""
        return {key: torch.zeros(shape, dtype=dtype, device=device)
                for key, shape, dtype, device in self._graph_input_specs()}

    def get_mock_input(self) -> dict[str, torch.Tensor]:
        """Random tensors for every graph input, with its shape, dtype and device."""
        mock = {}
        for key, shape, dtype, device in self._graph_input_specs():
            if dtype == torch.bool:
                value = torch.randint(0, 2, shape, device=device).bool()
            elif dtype.is_floating_point:
                value = torch.randn(shape, device=device).to(dtype)
            else:
                high = min(256, torch.iinfo(dtype).max + 1)
                value = torch.randint(0, high, shape, dtype=dtype, device=device)
            mock[key] = value
        return mock

    @property
    def inputs(self) -> list[str]:
        """Graph input keys ``"node/input"``, in YAML order."""
        return self.graph.input_keys()

    @property
    def outputs(self) -> list[str]:
        """Graph output keys ``"node/output"``, in YAML order."""
        return self.graph.output_keys()

    @property
    def feedback_inputs(self) -> list[str]:
        """Every feedback target ``"node/input"`` of ``feedback_flow``."""
        return [edge.target for edge in self.graph.feedback_edges()]

    # ---- the port catalogue (leapp.bundle.ports) -----------------------------

    def _catalog(self) -> dict[str, Mapping[str, InferencePort]]:
        """The port records, built when first read: the pipeline's, with each node's
        device and, for graph outputs, whether the node's model computes them from no
        input (leapp.models.static_outputs)."""
        built = self.__dict__.get("_ports")
        if built is None:
            devices = {name: torch.device(node.device) for name, node in self.nodes.items()}
            static: dict[tuple[str, str], bool] = {}
            for name in dict.fromkeys(node for node, _ in self.graph.outputs):
                node = self.nodes[name]
                flags = static_outputs(node.backend, node.model, node.model_path,
                                       len(node.output_names))
                if flags is not None:
                    static.update({(name, port): flag
                                   for port, flag in zip(node.output_names, flags)})
            built = self.graph.port_catalog(devices, static)
            self._ports = built
        return built

    @property
    def input_ports(self) -> Mapping[str, InferencePort]:
        """The graph inputs as port records keyed like ``inputs`` (``"node/input"``),
        in the same order: kind, element names, shape, dtype, device, extra fields."""
        return self._catalog()["inputs"]

    @property
    def output_ports(self) -> Mapping[str, InferencePort]:
        """The graph outputs as port records keyed like ``outputs``, in the same order;
        ``static`` says whether the node computes one from none of its inputs."""
        return self._catalog()["outputs"]

    @property
    def feedback_ports(self) -> Mapping[str, InferencePort]:
        """The feedback targets as port records keyed like ``feedback_inputs``;
        ``source`` names the output that feeds each on the next step."""
        return self._catalog()["feedback"]

    @property
    def configs(self) -> Mapping[str, Any]:
        """The pipeline's ``configs`` (frequency and project fields), read-only; empty
        when the bundle has none."""
        return self.graph.configs

    @property
    def frequency(self) -> float | None:
        """The rate in Hz the policy runs at (``configs.frequency``), or None when the
        bundle names none: the period of a control loop is ``1 / frequency`` seconds."""
        return self.graph.frequency

    def __repr__(self) -> str:
        return (f"InferenceManager({self.model_path!r}, nodes={self.run_order}, "
                f"inputs={self.inputs}, outputs={self.outputs})")
