"""The graph walk and model assembly of the ONNX writer.

A node's torch.fx.GraphModule is run once on its example inputs (the traced
port values), which gives every fx value its static shape and dtype as eager
computes them.  Each call is then handed to the rule registered for it
(leapp.compiling.onnx_writer.rules): the rule appends ONNX nodes through an
Emitter and returns the name(s) of its result(s).  A call whose arguments are
all constants (module buffers, Python numbers) is folded to its eager value.
The finished model is checked: every value a rule produced must have, after
ONNX shape inference, the dtype and shape eager gave it, or the node is
refused (WriterError) and goes through torch's exporter.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ...bundle.dtypes import onnx_type
from . import rules as _rules  # noqa: F401  (importing the families registers every rule)
from .emit import RULES, Call, Emitter, NoRule, Value, WriterError, may_draw_random, op_label, rule_key
from .normalize import describe_form, normalize


class _Recorder(fx.Interpreter):
    """Runs the module once and keeps each fx node's eager value."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=False)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n] = result
        return result


def _is_const_arg(obj: Any, consts: set) -> bool:
    """Whether every fx value obj holds (in tuples, lists, dicts, slices) is a constant."""
    found: list[fx.Node] = []
    fx.node.map_arg(obj, found.append)
    return all(n in consts for n in found)


class Walk:
    """One node's writing: values, constants, the emitter."""

    def __init__(self, module: fx.GraphModule, example_inputs: list[torch.Tensor],
                 input_names: list[str], output_names: list[str], opset: int,
                 node_name: str) -> None:
        self.module = module
        self.example_inputs = example_inputs
        self.input_names = input_names
        self.output_names = output_names
        self.opset = opset
        self.node_name = node_name
        shared = sorted(set(input_names) & set(output_names))
        if shared or len(set(input_names)) != len(input_names) \
                or len(set(output_names)) != len(output_names):
            raise WriterError(f"[{node_name}] port names must be distinct across inputs and "
                              f"outputs (shared: {shared}); name state ports <name>_in / "
                              f"<name>_out as the onnx backend does")
        self.e = Emitter(opset, set(input_names) | set(output_names))
        self.env: dict[fx.Node, Any] = {}
        self.consts: set[fx.Node] = set()
        self.expected: dict[str, torch.Tensor] = {}
        #: the fx call each value a rule produced comes from, and where in its result
        #: (() for a tensor, (1,) for topk's indices): locate names the op
        self.origins: dict[str, tuple[fx.Node, tuple]] = {}

    def _map(self, obj: Any) -> Any:
        """obj with each fx value replaced by its Value (torch.fx's own walk)."""
        return fx.node.map_arg(obj, self.env.__getitem__)

    @staticmethod
    def _example(obj: Any, values: dict) -> Any:
        """obj with each fx value replaced by eager's example of it."""
        return fx.node.map_arg(obj, values.__getitem__)

    def _const_value(self, value: Any, hint: str) -> Any:
        """A folded value: tensors become initialisers (Value), others stay Python."""
        if isinstance(value, torch.Tensor):
            if value.dtype not in _SUPPORTED_DTYPES:
                raise NoRule(f"a constant of dtype {value.dtype}")
            return Value(self.e.tensor_const(value, hint), value, const=True)
        if isinstance(value, (tuple, list)):
            return type(value)(self._const_value(v, hint) for v in value)
        return value

    def _wrap(self, result: Any, example: Any, node: fx.Node, path: tuple = ()) -> Any:
        """The rule's name(s) paired with eager's example value(s) (path: where in the
        call's result this one lies)."""
        if isinstance(example, torch.Tensor):
            if not isinstance(result, (str, Value)):
                raise WriterError(f"rule for {op_label(node)} returned {result!r}")
            if example.dtype not in _SUPPORTED_DTYPES:
                raise NoRule(op_label(node), f"a result of dtype {example.dtype}")
            if isinstance(result, Value):  # a rule's own Value (a constant, say)
                self.expected.setdefault(result.name, example)
                self.origins.setdefault(result.name, (node, path))
                return result
            self.expected[result] = example
            self.origins[result] = (node, path)
            return Value(result, example)
        if isinstance(example, (tuple, list)):
            if not isinstance(result, (tuple, list)) or len(result) != len(example):
                raise WriterError(f"rule for {op_label(node)} returned {result!r}, eager gives "
                                  f"{len(example)} values")
            return [self._wrap(r, x, node, path + (i,))
                    for i, (r, x) in enumerate(zip(result, example))]
        return result if result is not None else example

    def run(self) -> Any:
        """The node's onnx.GraphProto: its eager values recorded, its inputs declared,
        each call written (or folded), its outputs named."""
        recorder = _Recorder(self.module)
        with torch.no_grad():
            recorder.run(*self.example_inputs)
        values = recorder.values
        graph_inputs, kept_inputs = self._declare_inputs(values)
        output_node = None
        for n in self.module.graph.nodes:
            if n.op == "output":
                output_node = n
                break
            if n.op != "placeholder":
                self._write_call(n, values)
        assert output_node is not None
        graph_outputs = self._name_outputs(output_node, kept_inputs)
        e = self.e
        nodes, initializers = _live(e.nodes, e.initializers, self.output_names)
        return e.helper.make_graph(nodes, "main_graph", graph_inputs, graph_outputs,
                                   initializers)

    def _declare_inputs(self, values: dict) -> tuple[list, list[str]]:
        """(the graph's input ValueInfos, their names): an input no output reads is left
        out, as torch's exporter does."""
        placeholders = [n for n in self.module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.input_names):
            raise WriterError(f"{len(placeholders)} placeholders for {len(self.input_names)} "
                              f"inputs")
        graph_inputs, kept = [], []
        for n, name, example in zip(placeholders, self.input_names, self.example_inputs):
            if example.dtype not in _SUPPORTED_DTYPES:
                raise NoRule(f"an input of dtype {example.dtype}")
            self.env[n] = Value(name, values[n])
            if n.users:
                graph_inputs.append(self.e.helper.make_tensor_value_info(
                    name, onnx_type(example.dtype), list(example.shape)))
                kept.append(name)
        return graph_inputs, kept

    def _write_call(self, n: fx.Node, values: dict) -> None:
        """One fx node: a constant (get_attr, or a call of constants folded to its eager
        value), an element of a tuple, or a call handed to its rule in function form."""
        if n.op == "get_attr":
            self.consts.add(n)
            self.env[n] = self._const_value(values[n], "const")
            return
        if n.op not in ("call_function", "call_method"):
            raise NoRule(f"fx op {n.op}")
        if n.op == "call_function" and n.target is operator.getitem \
                and isinstance(values.get(n.args[0]), (tuple, list)) \
                and isinstance(self.env[n.args[0]], (tuple, list)):
            self.env[n] = self.env[n.args[0]][n.args[1]]
            if n.args[0] in self.consts:
                self.consts.add(n)
            return
        if _is_const_arg(n.args, self.consts) and _is_const_arg(n.kwargs, self.consts) \
                and not (n.op == "call_function" and may_draw_random(n.target)):
            self.consts.add(n)
            self.env[n] = self._const_value(values[n], "folded")
            return
        fn = RULES.get(rule_key(n))
        if fn is None:
            raise NoRule(op_label(n))
        args, kwargs = self._map(n.args), self._map(n.kwargs)
        example_args = self._example(n.args, values)
        example_kwargs = self._example(n.kwargs, values)
        form = normalize(n, example_args, example_kwargs)
        if form is False:
            raise NoRule(op_label(n), f"called as {describe_form(example_args, example_kwargs)}"
                                      f", a form none of the op's ATen overloads fits")
        if form is not None:  # the function form of the overload the call binds to
            args, kwargs = form.apply(args, kwargs)
            example_args, example_kwargs = form.apply(example_args, example_kwargs)
        call = Call(self.e, n, args, kwargs, example_args, example_kwargs, values[n])
        self.env[n] = self._wrap(fn(call), values[n], n)

    def _name_outputs(self, output_node: fx.Node, kept_inputs: list[str]) -> list:
        """The graph's output ValueInfos: each result's value renamed to its port name
        where it is a node's own output no other port claims, else an Identity."""
        e = self.e
        results = output_node.args[0]
        results = list(results) if isinstance(results, (tuple, list)) else [results]
        if len(results) != len(self.output_names):
            raise WriterError(f"{len(results)} results for {len(self.output_names)} outputs")
        graph_outputs = []
        renames: dict[str, str] = {}
        claimed: set[str] = set(kept_inputs)
        initializer_names = {t.name for t in e.initializers}
        produced = {o for node in e.nodes for o in node.output}
        for fx_value, name in zip(results, self.output_names):
            value = self.env[fx_value] if isinstance(fx_value, fx.Node) else None
            if not isinstance(value, Value):
                raise NoRule(f"output '{name}' that is not a tensor")
            source = renames.get(value.name, value.name)
            if source in produced and source not in claimed and value.name not in renames \
                    and source not in initializer_names:
                renames[value.name] = name
                claimed.add(name)
            else:
                e.nodes.append(e.helper.make_node("Identity", [source], [name]))
            graph_outputs.append(e.helper.make_tensor_value_info(
                name, onnx_type(value.dtype), list(value.shape)))
        if renames:
            for node in e.nodes:
                node.input[:] = [renames.get(i, i) for i in node.input]
                node.output[:] = [renames.get(o, o) for o in node.output]
            self.expected = {renames.get(k, k): v for k, v in self.expected.items()}
            self.origins = {renames.get(k, k): v for k, v in self.origins.items()}
        return graph_outputs


def origin_value(values: dict, origin: tuple[fx.Node, tuple]) -> Any:
    """The eager value an origin names (a call's result, or an element of it)."""
    node, path = origin
    value = values[node]
    for index in path:
        value = value[index]
    return value


def locate(model: Any, module: fx.GraphModule, inputs: list,
           origins: dict[str, tuple[fx.Node, tuple]], tolerance: Any) -> fx.Node | None:
    """The first fx call (in graph order) whose written value parts from eager's on
    inputs, or None: the model runs once with every value a rule produced as an
    extra output, beside the module in an fx interpreter.  tolerance(got, want) says
    how two values differ ('' when they agree)."""
    import copy

    import numpy as np
    import onnxruntime as ort

    recorder = _Recorder(module)
    try:
        with torch.no_grad():
            recorder.run(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    except Exception:  # noqa: BLE001  eager refuses the inputs: nothing to locate
        return None
    produced = {o for node in model.graph.node for o in node.output}
    outputs = {v.name for v in model.graph.output}
    probe = copy.deepcopy(model)
    watched = [name for name in origins if name in produced]
    for name in watched:
        if name not in outputs:
            probe.graph.output.append(probe_info(name, origin_value(recorder.values,
                                                                    origins[name])))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(probe.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    fed = {i.name for i in session.get_inputs()}
    names = [i.name for i in model.graph.input]
    feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, _graph_inputs(module, inputs))
             if n in fed}
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    order = {n: i for i, n in enumerate(module.graph.nodes)}
    for name in sorted(watched, key=lambda n: (order[origins[n][0]], origins[n][1])):
        want = origin_value(recorder.values, origins[name])
        if isinstance(want, torch.Tensor) and tolerance(torch.from_numpy(np.asarray(got[name])),
                                                        want.detach()):
            return origins[name][0]
    return None


def probe_info(name: str, example: torch.Tensor) -> Any:
    from onnx import helper
    return helper.make_tensor_value_info(name, onnx_type(example.dtype), None)


def _graph_inputs(module: fx.GraphModule, inputs: list) -> list:
    """The inputs a written model keeps, in order (those some call reads)."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    return [t for n, t in zip(placeholders, inputs) if n.users]


def _live(nodes: list, initializers: list, outputs: list[str]) -> tuple[list, list]:
    """The nodes the outputs need (in order) and the initialisers they read."""
    needed = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    return keep, [t for t in initializers if t.name in needed]


_SUPPORTED_DTYPES = frozenset({
    torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool})


#: Ops onnxruntime's CPU provider has no float64 kernel for (1.2x-1.3x): a node that
#: would need one is refused (eager computes them in float64; float32 would differ).
NO_FLOAT64_KERNEL = frozenset({
    "Elu", "Selu", "Celu", "LeakyRelu", "Gelu", "Softplus", "Softsign", "HardSigmoid",
    "HardSwish", "Mish", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
    "Atanh", "Erf", "Conv", "ConvTranspose", "AveragePool", "PRelu", "Resize"})


def _check_kernels(model: Any, infos: dict) -> None:
    from onnx import TensorProto
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    types.update({name: v.type.tensor_type.elem_type for name, v in infos.items()})
    for node in model.graph.node:
        if node.op_type in NO_FLOAT64_KERNEL and types.get(node.input[0]) == TensorProto.DOUBLE:
            raise NoRule(f"{node.op_type} on float64",
                         "onnxruntime has no float64 kernel for it")


def check_against_eager(model: Any, expected: dict[str, torch.Tensor], node: str) -> None:
    """Every value a rule produced has, after strict shape inference, eager's dtype and
    shape (WriterError otherwise)."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True)
    infos = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    _check_kernels(inferred, infos)
    for name, example in expected.items():
        info = infos.get(name)
        if info is None:
            continue
        tensor_type = info.type.tensor_type
        want = onnx_type(example.dtype)
        if tensor_type.elem_type != want:
            raise WriterError(f"[{node}] value {name}: the writer gives ONNX type "
                              f"{tensor_type.elem_type}, eager {example.dtype}")
        if tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in tensor_type.shape.dim]
            if None not in dims and tuple(dims) != tuple(example.shape):
                raise WriterError(f"[{node}] value {name}: the writer gives shape {dims}, "
                                  f"eager {tuple(example.shape)}")
