"""A fused ONNX model that steps a batch of robots at once: ``leapp.fuse(..., batch=True)``.

The fused model (docs/fuse.md) steps one robot: its tensors have the bundle's
shapes, the robot dimension fixed at 1.  Its batched variant takes every data
input and state *robot-major*: ``[robots, *rest]``, where ``rest`` is the
bundle's shape without its robot axis (an axis of size 1), and ``robots`` is a
symbolic dimension.  Inside, each state goes back to its own layout (a GRU's
hidden state ``[layers, 1, hidden]`` has its robot axis second) by one
``Transpose``.  A data output computed from no robot's input (a static output
such as gains) is broadcast to ``[robots, *shape]``, so every output holds one
row per robot too.

Which axis of a state is the robot's is found by running the model: each
candidate layout is tried on three robots with different inputs and state, and
the first whose every output and next state equals the one-robot model run
robot by robot is kept.  A pipeline that fixes the batch inside (a reshape to a
constant shape, say) has no such layout and is refused, saying why.

The metadata is the fused model's (per-robot shapes) plus ``"batched": true``
and, on every port, ``"robot_axis"``: the axis of the bundle's shape that
holds the robot (``null`` for a broadcast output).  Row ``i`` of a batched
tensor, reshaped to the bundle's shape, is robot ``i``'s tensor.
"""
from __future__ import annotations

import copy
import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

logger = logging.getLogger("leapp")

#: Name of the symbolic robot dimension of a batched fused model.
ROBOT_DIM = "robots"
#: Robots the layout search and the check run side by side.
CHECK_ROBOTS = 3
#: Layouts tried at most (the product of each state's candidate axes).
MAX_LAYOUTS = 256


class BatchError(ValueError):
    """The fused model cannot step several robots at once (the message says why)."""


class LayoutError(BatchError):
    """The ports allow a batch, but no layout of the state steps robots as the one-robot
    model does: a node mixes the robots or fixes their number inside."""


def _rest(shape: list[int], axis: int | None) -> list[int]:
    return list(shape) if axis is None else [d for i, d in enumerate(shape) if i != axis]


def _to_internal(axis: int, rank: int) -> list[int]:
    """Transpose perm from robot-major [B, *rest] to the bundle's layout (B at ``axis``)."""
    return list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))


def _to_major(axis: int, rank: int) -> list[int]:
    return [axis] + [i for i in range(rank) if i != axis]


def _np_dtype(name: str) -> Any:
    return np.dtype("bool" if name == "bool" else name)


def _info(name: str, elem: int, dims: list[Any] | None) -> Any:
    from onnx import helper
    return helper.make_tensor_value_info(name, elem, dims)


def rewrite(model: Any, metadata: Mapping[str, Any], state_axes: Mapping[str, int],
            output_axes: Mapping[str, int | None] | None) -> Any:
    """The batched ``ModelProto``: data inputs at axis 0, states at ``state_axes``.

    ``output_axes`` None leaves the data outputs' shapes open (the layout probe).
    """
    from onnx import helper, numpy_helper

    batched = copy.deepcopy(model)
    graph = batched.graph
    del graph.value_info[:]  # the one-robot shapes no longer hold
    elem = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)}
    axes = {p["name"]: 0 for p in metadata["inputs"]}
    axes.update({s["input"]: state_axes[s["input"]] for s in metadata["state"]})
    shapes = {p["name"]: list(p["shape"]) for p in metadata["inputs"] + metadata["outputs"]}
    shapes.update({s["input"]: list(s["shape"]) for s in metadata["state"]})
    shapes.update({s["output"]: list(s["shape"]) for s in metadata["state"]})
    out_axes: dict[str, int | None] = {s["output"]: state_axes[s["input"]]
                                       for s in metadata["state"]}
    if output_axes is not None:
        out_axes.update(output_axes)

    front, back = [], []
    inputs = []
    for value in graph.input:
        name = value.name
        if name not in axes:  # an initializer listed as input
            inputs.append(copy.deepcopy(value))
            continue
        axis, shape = axes[name], shapes[name]
        inputs.append(_info(name, elem[name], [ROBOT_DIM] + _rest(shape, axis)))
        if axis != 0:
            inner = f"{name}::bundle_layout"
            for node in graph.node:
                for i, source in enumerate(node.input):
                    if source == name:
                        node.input[i] = inner
            front.append(helper.make_node("Transpose", [name], [inner],
                                          perm=_to_internal(axis, len(shape)),
                                          name=f"robot_major::{name}"))
    del graph.input[:]
    graph.input.extend(inputs)

    robots = None
    outputs = []
    for value in graph.output:
        name = value.name
        if output_axes is None and name not in out_axes:
            outputs.append(_info(name, elem[name], None))
            continue
        axis, shape = out_axes[name], shapes[name]
        outputs.append(_info(name, elem[name], [ROBOT_DIM] + _rest(shape, axis)))
        if axis == 0:
            continue
        inner = f"{name}::bundle_layout"
        for node in graph.node:
            for i, produced in enumerate(node.output):
                if produced == name:
                    node.output[i] = inner
        if axis is not None:
            back.append(helper.make_node("Transpose", [inner], [name],
                                         perm=_to_major(axis, len(shape)),
                                         name=f"robot_major::{name}"))
            continue
        if robots is None:  # the robot count, from the first data input (or state)
            first = next(iter(axes))
            robots = "leapp::robots"
            front.append(helper.make_node("Shape", [first], [robots], start=0, end=1,
                                          name="robot_count"))
        target = f"{name}::robot_shape"
        graph.initializer.append(numpy_helper.from_array(
            np.asarray(shape, dtype=np.int64), f"{name}::shape"))
        back.append(helper.make_node("Concat", [robots, f"{name}::shape"], [target], axis=0,
                                     name=f"robot_shape::{name}"))
        back.append(helper.make_node("Expand", [inner, target], [name],
                                     name=f"every_robot::{name}"))
    del graph.output[:]
    graph.output.extend(outputs)
    nodes = front + list(graph.node) + back
    del graph.node[:]
    graph.node.extend(nodes)
    return batched


def _session(model: Any) -> Any:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a layout that does not run is an answer, not an error
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _random(shape: list[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("float", "bfloat")):
        return rng.standard_normal(shape).astype(_np_dtype(dtype))
    return rng.integers(0, 2, shape).astype(_np_dtype(dtype))


def initial_values(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``{state input: initial value}`` (torch tensors, the bundle's shapes) from the metadata."""
    import base64

    import torch

    from ..bundle.pipeline import torch_dtype
    values = {}
    for entry in metadata["state"]:
        dtype = torch_dtype(entry["dtype"], entry["input"])
        raw = bytearray(base64.b64decode(entry["initial"]["data"]))
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        values[entry["input"]] = flat.reshape(entry["shape"]).clone()
    return values


def _initial(metadata: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in initial_values(metadata).items()}


def _close(want: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> bool:
    if want.shape != got.shape:
        return False
    if want.dtype.kind in "fc":
        return bool(np.allclose(want.astype(np.float64), got.astype(np.float64), rtol=rtol,
                                atol=atol, equal_nan=True))
    return bool(np.array_equal(want, got))


def _major(value: np.ndarray, axis: int | None, shape: list[int]) -> np.ndarray:
    """Robot ``i``'s tensor (bundle shape) -> its row of a robot-major tensor."""
    return value.reshape(_rest(shape, axis))


def compare(session: Any, single: Any, metadata: Mapping[str, Any], state_axes: Mapping[str, int],
            output_axes: Mapping[str, int | None] | None, steps: int, seed: int,
            rtol: float = 1e-4, atol: float = 1e-5) -> tuple[dict[str, int | None], str | None]:
    """Run ``session`` (batched) and ``single`` (one robot) side by side over ``steps`` steps.

    Returns the data outputs' robot axes found (``output_axes`` when given) and
    None, or the first difference in words.
    """
    rng = np.random.default_rng(seed)
    robots = CHECK_ROBOTS
    initial = _initial(metadata)
    states = metadata["state"]
    # different state per robot from the first step: the initial value plus noise
    per_robot = [{s["input"]: (initial[s["input"]]
                               + (0.1 * (r + 1) if initial[s["input"]].dtype.kind == "f" else 0)
                               ).astype(initial[s["input"]].dtype) for s in states}
                 for r in range(robots)]
    found: dict[str, int | None] = dict(output_axes or {})
    for step in range(steps):
        feeds = [{p["name"]: _random(list(p["shape"]), p["dtype"], rng)
                  for p in metadata["inputs"]} for _ in range(robots)]
        batch_feed = {p["name"]: np.stack([_major(f[p["name"]], 0, p["shape"]) for f in feeds])
                      for p in metadata["inputs"]}
        batch_feed.update({s["input"]: np.stack([
            _major(r[s["input"]], state_axes[s["input"]], s["shape"]) for r in per_robot])
            for s in states})
        try:
            batched = dict(zip([o.name for o in session.get_outputs()],
                               session.run(None, batch_feed)))
        except Exception as exc:  # onnxruntime's own error: this layout does not run
            return found, f"onnxruntime refuses {robots} robots: {' '.join(str(exc).split())[:300]}"
        names = [o.name for o in single.get_outputs()]
        for r in range(robots):
            feed = dict(feeds[r])
            feed.update(per_robot[r])
            want = dict(zip(names, single.run(None, feed)))
            for port in metadata["outputs"]:
                name, shape = port["name"], list(port["shape"])
                got = batched[name]
                if name not in found:  # the probe: outputs in the bundle's layout
                    grown = [a for a, d in enumerate(shape) if d == 1 and list(got.shape)
                             == shape[:a] + [robots] + shape[a + 1:]]
                    if list(got.shape) == shape:
                        found[name] = None  # the same for every robot: broadcast
                    elif grown:
                        found[name] = grown[0]
                    else:
                        return found, (f"output {name!r} is {list(got.shape)} for {robots} "
                                       f"robots, {shape} for one: no robot axis")
                axis = found[name]
                if output_axes is None:
                    row = got if axis is None else np.take(got, [r], axis=axis)
                else:
                    row = got[r]
                if not _close(want[name], row.reshape(shape), rtol, atol):
                    return found, f"step {step}, robot {r}: output {name!r} differs"
            for s in states:
                row = batched[s["output"]][r]
                if not _close(want[s["output"]], row.reshape(s["shape"]), rtol, atol):
                    return found, f"step {step}, robot {r}: state {s['output']!r} differs"
                per_robot[r][s["input"]] = want[s["output"]]
    return found, None


def _candidates(metadata: Mapping[str, Any]) -> list[dict[str, int]]:
    choices = []
    for s in metadata["state"]:
        axes = [a for a, d in enumerate(s["shape"]) if d == 1]
        if not axes:
            raise BatchError(f"state {s['input']!r} has shape {s['shape']}: no axis of size 1 "
                             "holds the robot, so robots cannot be stacked")
        choices.append([(s["input"], a) for a in axes])
    layouts = []
    for combo in itertools.islice(itertools.product(*choices), MAX_LAYOUTS):
        layouts.append(dict(combo))
    return layouts


#: Metadata key of a fused model (``leapp.serving.fusion.METADATA_KEY``).
METADATA_KEY = "leapp_fused"


def batch_model(model: Any, steps: int = 12, seed: int = 0) -> Any:
    """The batched ``ModelProto`` of a one-robot fused ``ModelProto`` (checked robot by robot)."""
    from onnx import helper

    metadata = json.loads(next(p.value for p in model.metadata_props if p.key == METADATA_KEY))
    if metadata.get("batched"):
        raise BatchError("the fused model is batched already")
    for port in metadata["inputs"]:
        if not port["shape"] or port["shape"][0] != 1:
            raise BatchError(f"data input {port['name']!r} has shape {port['shape']}: a robot's "
                             "input needs a leading dimension of 1 to stack robots along it")
    single = _session(model)
    tried = []
    for layout in _candidates(metadata):
        probe = _session(rewrite(model, metadata, layout, None))
        axes, problem = compare(probe, single, metadata, layout, None, 2, seed)
        if problem is None:
            final = rewrite(model, metadata, layout, axes)
            _, problem = compare(_session(final), single, metadata, layout, axes, steps, seed + 1)
            if problem is None:
                described = dict(metadata)
                described["batched"] = True
                described["robot_dim"] = ROBOT_DIM
                described["inputs"] = [dict(p, robot_axis=0) for p in metadata["inputs"]]
                described["outputs"] = [dict(p, robot_axis=axes[p["name"]])
                                        for p in metadata["outputs"]]
                described["state"] = [dict(s, robot_axis=layout[s["input"]])
                                      for s in metadata["state"]]
                del final.metadata_props[:]
                helper.set_model_props(final, {METADATA_KEY: json.dumps(described)})
                logger.info("Batched fused model: state robot axes %s, output robot axes %s",
                            layout, axes)
                return final
        tried.append(f"{layout or 'no state'}: {problem}")
    raise LayoutError("no layout of the state steps several robots like one robot at a time ("
                      + "; ".join(tried[:4]) + "). A node probably mixes the robots or fixes "
                      "their number inside: a reduction over every axis (x.mean(): give it "
                      "the feature axes, x.mean(-1, keepdim=True)) or a reshape or expand to "
                      "a constant shape (keep the leading dimension: x.reshape(x.shape[0], "
                      "-1)); change it, compile again and fuse again")


def check_per_robot(path: str, metadata: Mapping[str, Any], managers: list[Any],
                    steps: int, rtol: float, atol: float, seed: int = 0) -> str | None:
    """Run the batched model at ``path`` next to one ``InferenceManager`` per robot.

    Each robot gets its own random inputs each step, and robot 1 is reset
    halfway so that the robots' states differ.  Returns None, or the first
    difference in words.
    """
    import torch
    session = _session(path)
    robots = len(managers)
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(seed)
    initial = _initial(metadata)
    state = {s["input"]: np.stack([initial[s["input"]].reshape(robot_major_shape(s))] * robots)
             for s in metadata["state"]}
    for step in range(steps):
        if step == steps // 2 and robots > 1:
            managers[1].reset()
            for s in metadata["state"]:
                state[s["input"]][1] = initial[s["input"]].reshape(robot_major_shape(s))
        feeds = [{p["name"]: _random(list(p["shape"]), p["dtype"], rng)
                  for p in metadata["inputs"]} for _ in range(robots)]
        feed = {p["name"]: np.stack([f[p["name"]].reshape(robot_major_shape(p)) for f in feeds])
                for p in metadata["inputs"]}
        feed.update(state)
        got = dict(zip(names, session.run(None, feed)))
        for s in metadata["state"]:
            state[s["input"]] = got[s["output"]]
        for r, manager in enumerate(managers):
            want = manager.run_policy({k: torch.from_numpy(v.copy()) for k, v in feeds[r].items()})
            for port in metadata["outputs"]:
                key = port.get("key", port["name"])
                expected = want[key].detach().cpu().numpy()
                row = got[port["name"]][r].reshape(expected.shape) \
                    if got[port["name"]][r].size == expected.size else None
                if row is None or not _close(expected, row, rtol, atol):
                    return f"step {step}, robot {r}: {key!r} differs from InferenceManager's"
    return None


def robot_major_shape(port: Mapping[str, Any]) -> list[int]:
    """A batched port's shape after its robot dimension: the bundle's without its robot axis."""
    return _rest(list(port["shape"]), port.get("robot_axis"))


__all__ = ["BatchError", "LayoutError", "batch_model", "robot_major_shape", "ROBOT_DIM"]
