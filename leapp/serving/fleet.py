"""Many robots in one process: ``leapp.serving.fleet.FleetRunner``.

A simulator, or a robot computer serving many agents, steps N robots of one
pipeline at once.  ``FleetRunner`` runs the batched fused model
(``leapp.fuse(..., batch=True)``, docs/fuse.md) with one onnxruntime call per
step for the whole fleet; each robot keeps its own recurrent state, one row of
the batched state, starting from the bundle's initial values.  Robots join
(``add``), leave (``remove``) and start over (``reset``) one at a time; the
others keep their state.  Each robot's outputs equal those of its own
``InferenceManager`` (``validate_fleet`` checks it robot by robot).

Tensors are robot-major: row ``i`` of every input and output is robot
``robots[i]``.  A data input's row is the robot's tensor without its leading
dimension of 1, so the fleet's input is the robots' tensors concatenated:
``torch.cat([obs_0, obs_1, ...])``.  ``step_robots`` takes and returns one
dict per robot, with exactly the tensors ``InferenceManager.run_policy``
takes and returns.
"""
from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from .batched import BatchError, robot_major_shape

logger = logging.getLogger("leapp")


class FleetError(ValueError):
    """A robot or a tensor the fleet does not have (the message says which)."""


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class FleetRunner:
    """Steps a fleet of robots through one batched fused model.

    Args:
        model: a batched fused ONNX model (``leapp.fuse(yaml, batch=True)``), or a
            bundle's YAML, which is then fused and batched (checked against
            ``InferenceManager``) into a temporary file first.
        robots: the robots to start with: a count (IDs ``0 .. count - 1``) or IDs.
        threads: onnxruntime intra-op threads (1: no thread spins between steps).
        allow_external_paths: as for ``InferenceManager``, when ``model`` is a YAML.
    """

    def __init__(self, model: str, robots: int | Iterable[Any] = 0, *, threads: int = 1,
                 allow_external_paths: bool = False) -> None:
        import onnxruntime as ort

        from .fusion import read_metadata
        model = os.fspath(model)
        if model.endswith((".yaml", ".yml")):
            from .fusion import fuse
            with tempfile.TemporaryDirectory(prefix="leapp-fleet-") as tmp:
                path = fuse(model, out=os.path.join(tmp, "fleet.onnx"), batch=True,
                            allow_external_paths=allow_external_paths)
                self._load(path, read_metadata(path), ort, threads)
        else:
            self._load(model, read_metadata(model), ort, threads)
        self.robots: list[Any] = []
        self._state = {name: np.zeros((0, *shape), dtype=value.dtype)
                       for (name, value), shape in zip(self._initial.items(), self._state_rest)}
        self.add_many(range(robots) if isinstance(robots, int) else robots)

    def _load(self, path: str, metadata: dict, ort: Any, threads: int) -> None:
        from .fusion import initial_state
        if not metadata.get("batched"):
            raise BatchError(f"{path} is a one-robot fused model; FleetRunner runs a batched "
                             "one: leapp.fuse(yaml_path, batch=True)")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.path, self.metadata = path, metadata
        #: data inputs, in the model's order; each ``[robots, *input_shapes[name]]``
        self.input_names = [p["name"] for p in metadata["inputs"]]
        self.input_shapes = {p["name"]: robot_major_shape(p) for p in metadata["inputs"]}
        self.output_names = [p["name"] for p in metadata["outputs"]]
        #: "node/port" of each output, as InferenceManager names it
        self.output_keys = [p.get("key", p["name"]) for p in metadata["outputs"]]
        self._robot_shapes = {p.get("key", p["name"]): list(p["shape"])
                              for p in metadata["outputs"]}
        self._robot_shapes.update({p["name"]: list(p["shape"]) for p in metadata["inputs"]})
        self.state_inputs = [s["input"] for s in metadata["state"]]
        self.state_outputs = [s["output"] for s in metadata["state"]]
        self._state_rest = [robot_major_shape(s) for s in metadata["state"]]
        self._initial = {name: value.numpy().reshape(rest) for (name, value), rest
                         in zip(initial_state(metadata).items(), self._state_rest)}

    # ---- the fleet ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.robots)

    def _row(self, robot: Any) -> int:
        try:
            return self.robots.index(robot)
        except ValueError:
            raise FleetError(f"robot {robot!r} is not in the fleet ({len(self.robots)} "
                             "robots); add it first") from None

    def add(self, robot: Any = None) -> Any:
        """Add one robot (default ID: one more than the largest integer ID); its ID."""
        if robot is None:
            robot = max([r for r in self.robots if isinstance(r, int)], default=-1) + 1
        self.add_many([robot])
        return robot

    def add_many(self, robots: Iterable[Any]) -> None:
        """Add robots at the end of the fleet, each at the bundle's initial state."""
        new = list(robots)
        taken = set(self.robots)
        for robot in new:
            if robot in taken:
                raise FleetError(f"robot {robot!r} is in the fleet already")
            taken.add(robot)
        if not new:
            return
        self.robots.extend(new)
        for name, initial in self._initial.items():
            rows = np.broadcast_to(initial, (len(new), *initial.shape))
            self._state[name] = np.concatenate([self._state[name], rows])

    def remove(self, robot: Any) -> None:
        """Take a robot out of the fleet (the robots after it move up one row)."""
        row = self._row(robot)
        del self.robots[row]
        for name in self._state:
            self._state[name] = np.delete(self._state[name], row, axis=0)

    def reset(self, robot: Any = None) -> None:
        """Put one robot's state (every robot's, with None) back to the initial values."""
        rows = slice(None) if robot is None else self._row(robot)
        for name, initial in self._initial.items():
            self._state[name][rows] = initial

    def state(self, robot: Any) -> dict[str, torch.Tensor]:
        """One robot's state ``{"node/port": tensor}`` in the bundle's shapes."""
        row = self._row(robot)
        return {s["input"]: torch.from_numpy(self._state[s["input"]][row].reshape(s["shape"]))
                for s in self.metadata["state"]}

    # ---- stepping --------------------------------------------------------------------------

    def step(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """One step of every robot: ``{"node/port": [robots, ...]}`` in, the same out.

        Row ``i`` of each input and output belongs to ``self.robots[i]``; each
        robot's state advances.
        """
        count = len(self.robots)
        if not count:
            raise FleetError("the fleet has no robots; add one first")
        feed = {}
        for name in self.input_names:
            if name not in inputs:
                raise FleetError(f"FleetRunner.step: missing input {name!r}; every data input "
                                 f"({self.input_names}) is needed at each step")
            value = _numpy(inputs[name])
            want = [count, *self.input_shapes[name]]
            if list(value.shape) != want:
                raise FleetError(f"input {name!r} is {list(value.shape)}; {count} robots need "
                                 f"{want} (the robots' tensors concatenated, row i for robot i)")
            feed[name] = value
        feed.update(self._state)
        results = self.session.run(None, feed)
        n = len(self.output_names)
        for name, value in zip(self.state_inputs, results[n:]):
            self._state[name] = value
        return {key: torch.from_numpy(value) for key, value in zip(self.output_keys, results[:n])}

    def step_robots(self, inputs: Mapping[Any, Mapping[str, Any]]
                    ) -> dict[Any, dict[str, torch.Tensor]]:
        """One step, robot by robot: ``{robot: {"node/port": tensor}}`` in and out.

        Every robot of the fleet needs its inputs, in the shapes
        ``InferenceManager.run_policy`` takes; the outputs have its shapes too.
        """
        missing = [r for r in self.robots if r not in inputs]
        extra = [r for r in inputs if r not in set(self.robots)]
        if missing or extra:
            raise FleetError(f"step_robots: inputs for every robot of the fleet are needed "
                             f"(missing {missing[:5]}, not in the fleet {extra[:5]})")
        stacked = {name: np.stack([_numpy(inputs[r][name]).reshape(self.input_shapes[name])
                                   for r in self.robots]) for name in self.input_names}
        outputs = self.step(stacked)
        return {robot: {key: value[row].reshape(self._robot_shapes[key])
                        for key, value in outputs.items()}
                for row, robot in enumerate(self.robots)}


def validate_fleet(model: str, yaml_path: str, robots: int = 3, steps: int = 12,
                   rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0,
                   allow_external_paths: bool = False, shown: str | None = None) -> None:
    """Run a batched fused model for ``robots`` robots next to one ``InferenceManager`` each.

    Every robot gets its own random inputs each step; robot 1 is reset halfway
    so that the robots' states differ.  Raises ``FuseError`` naming the step,
    the robot and the output that differs.
    """
    from .batched import check_per_robot
    from .fusion import FuseError, read_metadata
    from ..running.inference_manager import InferenceManager

    managers = [InferenceManager(yaml_path, allow_external_paths=allow_external_paths)
                for _ in range(robots)]
    problem = check_per_robot(model, read_metadata(model), managers, steps, rtol, atol, seed)
    if problem is not None:
        raise FuseError(f"Batched fused model {shown or model}: {problem}. The bundle was not "
                        "batched faithfully: please report it.")
    logger.info("Batched fused model %s matches InferenceManager for %d robots over %d steps",
                shown or model, robots, steps)


__all__ = ["FleetRunner", "FleetError", "validate_fleet", "BatchError"]
