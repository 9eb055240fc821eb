"""Many robots at once: the batched fused model and leapp.serving.fleet.FleetRunner (docs/fuse.md).

Two real pipelines, compiled once for the module: a locomotion pipeline
(onnx normaliser, jit GRU cell with declared state, pt2 scaler with static
gains) and a torch.nn.GRU policy whose hidden state [layers, 1, hidden] holds
the robot on its second axis.  Each is fused with batch=True and stepped for a
fleet next to one InferenceManager per robot, robots reset, added and
removed on the way.
"""
from __future__ import annotations

import os

import onnx
import pytest
import torch

import leapp
from leapp import annotate
from leapp.serving.fleet import FleetError, FleetRunner
from leapp.serving.fusion import FusedModel, FuseError, read_metadata
from leapp.running.inference_manager import InferenceManager

OBS, HIDDEN, ACT = 6, 8, 3


def _locomotion(root: str) -> str:
    torch.manual_seed(0)
    gru = torch.nn.GRUCell(OBS, HIDDEN).eval()
    head = torch.nn.Linear(HIDDEN, ACT).eval()
    mean, std = torch.randn(1, OBS) * 0.1, torch.rand(1, OBS) + 0.5
    kp = torch.full((ACT,), 20.0)
    leapp.start("loco", save_path=root)
    hidden = torch.full((1, HIDDEN), 0.25)
    with torch.no_grad():
        for i in range(2):
            x = annotate.input_tensors("normaliser", {"obs": torch.randn(1, OBS)})
            x = annotate.output_tensors("normaliser", {"obs_norm": (x - mean) / std},
                                        export_with="onnx")
            x = annotate.input_tensors("memory", {"obs_norm": x})
            h = annotate.state_tensors("memory", {"hidden": hidden})
            h_new = gru(x, h)
            hidden = annotate.update_state("memory", {"hidden": h_new})
            latent = annotate.output_tensors("memory", {"latent": h_new * 1.0},
                                             export_with="jit")
            z = annotate.input_tensors("scaler", {"latent": latent})
            annotate.output_tensors("scaler", {"targets": torch.tanh(head(z)) * 0.5},
                                    static_outputs={"kp": kp}, export_with="pt2")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    return os.path.join(root, "loco", "loco.yaml")


class _GRUPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(OBS, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, ACT)
        self.register_buffer("h_state", torch.zeros(1, 1, HIDDEN))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        seq, h = self.gru(obs.unsqueeze(0), self.h_state)
        self.h_state = h
        return self.out(seq.squeeze(0))


def _gru(root: str) -> str:
    torch.manual_seed(1)
    model = _GRUPolicy().eval()
    leapp.start("gru_fleet", save_path=root)
    with torch.no_grad():
        obs = annotate.input_tensors("policy", {"obs": torch.randn(1, OBS)})
        annotate.module("policy", model)
        annotate.output_tensors("policy", {"action": model(obs)},
                                export_with="onnx-torchscript")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    return os.path.join(root, "gru_fleet", "gru_fleet.yaml")


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fleet_bundles"))
    loco, gru = _locomotion(root), _gru(root)
    return {"loco": (loco, leapp.fuse(loco, batch=True)),
            "gru": (gru, leapp.fuse(gru, batch=True))}


def _obs(generator: torch.Generator) -> torch.Tensor:
    return torch.randn(1, OBS, generator=generator)


def _check(fleet: FleetRunner, managers: dict, generator: torch.Generator, step: int) -> None:
    name = fleet.input_names[0]
    feeds = {robot: {name: _obs(generator)} for robot in fleet.robots}
    got = fleet.step_robots(feeds)
    for robot in fleet.robots:
        want = managers[robot].run_policy(feeds[robot])
        assert set(got[robot]) == set(want)
        for key, value in want.items():
            assert got[robot][key].shape == value.shape, (key, robot)
            torch.testing.assert_close(got[robot][key], value, rtol=1e-4, atol=1e-5,
                                       msg=f"step {step}, robot {robot}, {key}")


@pytest.mark.parametrize("which", ["loco", "gru"])
def test_batched_fused_model_matches_inference_manager_per_robot(fleets, which):
    yaml_path, path = fleets[which]
    assert path.endswith(f"{os.path.basename(yaml_path)[:-5]}_fused_batched.onnx")
    metadata = read_metadata(path)
    assert metadata["batched"] is True
    # the robot dimension is symbolic: any fleet size runs the same file
    model = onnx.load(path)
    for value in model.graph.input:
        assert value.type.tensor_type.shape.dim[0].dim_param == "robots", value.name
    (state,) = metadata["state"]
    # the GRU's hidden state [layers, 1, hidden] carries the robot on its second axis
    assert state["robot_axis"] == (1 if which == "gru" else 0)
    if which == "loco":  # a static output is the same row for every robot
        axes = {p["name"]: p["robot_axis"] for p in metadata["outputs"]}
        assert axes == {"scaler/targets": 0, "scaler/kp": None}
    robots = 7
    fleet = FleetRunner(path, robots)
    managers = {r: InferenceManager(yaml_path) for r in range(robots)}
    generator = torch.Generator().manual_seed(5)
    for step in range(6):
        _check(fleet, managers, generator, step)
    # the batched call itself: the robots' tensors concatenated, row i for robot i
    name = fleet.input_names[0]
    obs = torch.randn(robots, OBS, generator=generator)
    outputs = fleet.step({name: obs})
    for r in range(robots):
        want = managers[r].run_policy({name: obs[r:r + 1]})
        for key, value in want.items():
            torch.testing.assert_close(outputs[key][r].reshape(value.shape), value,
                                       rtol=1e-4, atol=1e-5)


def test_runner_reset_add_remove(fleets):
    yaml_path, path = fleets["loco"]
    fleet = FleetRunner(path, ["a", "b", "c"])
    managers = {r: InferenceManager(yaml_path) for r in fleet.robots}
    generator = torch.Generator().manual_seed(9)
    initial = fleet.state("a")["memory/hidden"]
    torch.testing.assert_close(initial, torch.full((1, HIDDEN), 0.25))
    for step in range(3):
        _check(fleet, managers, generator, step)
    assert not torch.equal(fleet.state("b")["memory/hidden"], initial)

    fleet.remove("b")  # the robots after it move up; their state goes with them
    assert fleet.robots == ["a", "c"] and len(fleet) == 2
    fleet.add("d")  # a new robot starts from the bundle's initial values
    managers["d"] = InferenceManager(yaml_path)
    torch.testing.assert_close(fleet.state("d")["memory/hidden"], initial)
    fleet.reset("a")  # one robot starts over, the others keep their state
    managers["a"].reset()
    assert fleet.add() == 0 and fleet.robots == ["a", "c", "d", 0]
    managers[0] = InferenceManager(yaml_path)
    for step in range(3, 7):
        _check(fleet, managers, generator, step)
    fleet.reset()
    for robot in fleet.robots:
        torch.testing.assert_close(fleet.state(robot)["memory/hidden"], initial)

    with pytest.raises(FleetError, match="robot 'b' is not in the fleet"):
        fleet.remove("b")
    with pytest.raises(FleetError, match="robot 'a' is in the fleet already"):
        fleet.add("a")
    with pytest.raises(FleetError, match=r"is \[3, 6\]; 4 robots need \[4, 6\]"):
        fleet.step({"normaliser/obs": torch.zeros(3, OBS)})
    with pytest.raises(FleetError, match="inputs for every robot"):
        fleet.step_robots({"a": {"normaliser/obs": torch.zeros(1, OBS)}})


def test_runner_from_yaml_and_refusals(fleets, bundle, caplog, monkeypatch):
    yaml_path, path = fleets["gru"]
    fleet = FleetRunner(yaml_path, 2)  # fused and batched on the fly
    assert fleet.robots == [0, 1] and fleet.input_shapes == {"policy/obs": [OBS]}
    # and it steps: each robot equal to its own InferenceManager, the state carried
    managers = {robot: InferenceManager(yaml_path) for robot in fleet.robots}
    generator = torch.Generator().manual_seed(11)
    initial = {name: value.clone() for name, value in fleet.state(0).items()}
    for step in range(3):
        _check(fleet, managers, generator, step)
    for name, value in initial.items():
        assert not torch.equal(fleet.state(0)[name], value), name
    with pytest.raises(FuseError, match="batched fused model: run it with"):
        FusedModel(path)
    one_robot = leapp.fuse(yaml_path, out=os.path.join(bundle.root, "one.onnx"))
    with pytest.raises(ValueError, match="one-robot fused model"):
        FleetRunner(one_robot)
    with pytest.raises(ValueError, match="only the ONNX fused model is batched"):
        leapp.fuse(yaml_path, format="torchscript", batch=True)
    # no leading dimension of 1 to stack robots along: refused, nothing written, and
    # the writer's model is not converted again with torch's exporter first
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    leapp.start("flat", save_path=bundle.root)
    memory = torch.zeros(2)
    for _ in range(2):
        obs, mem = annotate.input_tensors("policy", {"obs": torch.rand(2), "memory": memory})
        memory = annotate.output_tensors("policy", {"memory": 0.5 * mem + obs},
                                         export_with="jit")  # written: the writer's model
    leapp.stop()
    leapp.compile_graph(visualize=False)
    flat = os.path.join(bundle.dir("flat"), "flat.yaml")
    with caplog.at_level("INFO", logger="leapp"), \
            pytest.raises(FuseError, match=r"'policy/obs' has shape \[2\]: a robot's input "
                                           "needs a leading dimension of 1"):
        leapp.fuse(flat, batch=True)
    assert "converting those nodes with torch's exporter" not in caplog.text  # no other try
    assert not [f for f in os.listdir(bundle.dir("flat")) if "fused" in f]


def _flat_obs(bundle, bidirectional: bool = False) -> str:
    """obs (jit): a flatten, then a linear layer, or a bidirectional GRU over one step."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(6, ACT).eval()
    gru = torch.nn.GRU(6, 4, bidirectional=True).eval()

    def obs(x):
        if bidirectional:  # [1 step, the robot as GRU batch, 6]
            return gru(x.flatten(1).unsqueeze(0))[0].squeeze(0) * 1.0
        return linear(x.flatten(1))

    return _one_node(bundle, "flat_obs", obs, "img", (1, 2, 3), "jit")


def _one_node(bundle, graph: str, fn, port: str, shape: tuple, export_with: str) -> str:
    """Two traced steps of node obs (fn of one input port), compiled; the YAML's path."""
    leapp.start(graph, save_path=bundle.root)
    with torch.no_grad():
        for _ in range(2):
            x = annotate.input_tensors("obs", {port: torch.randn(*shape)})
            annotate.output_tensors("obs", {"a": fn(x)}, export_with=export_with)
    leapp.stop()
    leapp.compile_graph(visualize=False)
    leapp._core.reset_nodes()
    return os.path.join(bundle.dir(graph), f"{graph}.yaml")


def _check_fleet(yaml_path: str, output: str, port: str = "obs/img",
                 shape: tuple = (1, 2, 3)) -> None:
    fleet = FleetRunner(yaml_path, 3)
    managers = {robot: InferenceManager(yaml_path) for robot in fleet.robots}
    generator = torch.Generator().manual_seed(4)
    for step in range(3):
        feeds = {robot: {port: torch.randn(*shape, generator=generator)}
                 for robot in fleet.robots}
        got = fleet.step_robots(feeds)
        for robot in fleet.robots:
            want = managers[robot].run_policy(feeds[robot])
            torch.testing.assert_close(got[robot][output], want[output], rtol=1e-4,
                                       atol=1e-5, msg=f"step {step}, robot {robot}")


def test_a_written_node_keeps_the_robot_dimension_open(bundle, caplog, monkeypatch):
    """leapp's ONNX writer writes the jit node's flatten as a Reshape that copies the
    leading dimension (0, 6): the batched model stacks robots on it as written."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    yaml_path = _flat_obs(bundle)
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)  # checked robot by robot against IM
    assert "Node 'obs' (jit): written to ONNX by leapp's ONNX writer" in caplog.text
    assert "cannot be batched" not in caplog.text
    model = onnx.load(path)
    assert read_metadata(path)["batched"] is True
    targets = {tuple(onnx.numpy_helper.to_array(t).tolist()) for t in model.graph.initializer
               if t.name.startswith("n0_obs::") and t.data_type == onnx.TensorProto.INT64}
    assert (0, 6) in targets and "Flatten" not in {n.op_type for n in model.graph.node}
    _check_fleet(yaml_path, "obs/a")


def test_a_written_sequence_first_gru_keeps_the_robot_on_its_batch_axis(bundle, caplog,
                                                                       monkeypatch):
    """A bidirectional nn.GRU over one step, sequence first: the robot is the GRU's batch
    (axis 1), and nn.GRU starts from zeros [2, 1, 4] it makes itself.  The writer
    unsqueezes by axis, takes the zeros' batch from the sequence at run time and
    reshapes the output to [0, 0, 8]: the batched model stacks robots on the node as
    written, as InferenceManager steps each."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    yaml_path = _flat_obs(bundle, bidirectional=True)
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)  # checked robot by robot against IM
    assert "Node 'obs' (jit): written to ONNX by leapp's ONNX writer" in caplog.text
    assert "cannot be batched" not in caplog.text
    model = onnx.load(path)
    targets = {tuple(onnx.numpy_helper.to_array(t).tolist()) for t in model.graph.initializer
               if t.name.startswith("n0_obs::") and t.data_type == onnx.TensorProto.INT64}
    assert (0, 0, 8) in targets
    assert read_metadata(path)["batched"] is True
    _check_fleet(yaml_path, "obs/a")


@pytest.mark.parametrize("case", ["cell", "padding", "ones", "like"])
def test_constants_a_node_makes_are_stacked_with_the_robots(bundle, caplog, monkeypatch, case):
    """Constants of one value the node makes from no input meet the robot's data: the
    zeros nn.GRUCell starts from when given no state, a torch.zeros-like padding made
    with new_zeros(x.shape[0], k) and a torch.ones padding, each concatenated, and a
    zeros_like stacked beside the data.  The
    writer sizes them from the data at run time, so the batched model steps every
    robot as InferenceManager does (torch's exporter bakes them at one robot)."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    torch.manual_seed(7)
    cell = torch.nn.GRUCell(6, 4).eval()
    linear = torch.nn.Linear(6, ACT).eval()
    fns = {
        "cell": lambda x: cell(x.flatten(1)),
        "padding": lambda x: linear(torch.cat([x.flatten(1)[:, :2],
                                               x.new_zeros(x.shape[0], 4)], 1)),
        "ones": lambda x: torch.cat([x.flatten(1), torch.ones(x.shape[0], 2)], 1) * 2,
        "like": lambda x: torch.stack([x.flatten(1), torch.zeros_like(x.flatten(1))], 1),
    }
    yaml_path = _one_node(bundle, f"made_{case}", fns[case], "img", (1, 2, 3), "jit")
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)  # checked robot by robot against IM
    assert "Node 'obs' (jit): written to ONNX by leapp's ONNX writer" in caplog.text
    assert "cannot be batched" not in caplog.text
    assert read_metadata(path)["batched"] is True
    _check_fleet(yaml_path, "obs/a")


def test_a_node_that_moves_the_robot_is_refused_after_both_exporters(bundle, caplog,
                                                                     monkeypatch):
    """x.reshape(2, x.shape[0], 3) moves the robot into the middle of a reshape (the
    traced target is [2, 1, 3]): the writer's model cannot stack robots, the batched
    model tries the node again with torch's exporter, says so, and that one bakes the
    batch too: refused naming the fix, nothing written."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    torch.manual_seed(8)
    linear = torch.nn.Linear(6, ACT).eval()

    def obs(x):
        moved = x.reshape(2, x.shape[0], 3).transpose(0, 1)
        return linear(moved.reshape(x.shape[0], 6))

    yaml_path = _one_node(bundle, "moved", obs, "img", (1, 2, 3), "jit")
    with caplog.at_level("INFO", logger="leapp"), \
            pytest.raises(FuseError, match=r"cannot be batched: .*keep the leading dimension: "
                                           r"x.reshape\(x.shape\[0\], -1\)"):
        leapp.fuse(yaml_path, batch=True)
    assert ("written with leapp's ONNX writer (nodes 'obs') cannot be batched" in caplog.text
            and "converting those nodes with torch's exporter" in caplog.text)
    assert not [f for f in os.listdir(bundle.dir("moved")) if "fused" in f]


def test_a_node_that_mixes_the_robots_is_refused_naming_the_reduction(bundle, monkeypatch):
    """obs - obs.mean() (the getting-started example's centring) averages over the robot
    axis too: no layout steps robots as one robot at a time, and the refusal names the
    reduction and its fix."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    yaml_path = _one_node(bundle, "centred", lambda x: x - x.mean(), "img", (1, 2, 3), "jit")
    with pytest.raises(FuseError, match=r"a reduction over every axis \(x.mean\(\): give it "
                                        r"the feature axes"):
        leapp.fuse(yaml_path, batch=True)
    assert not [f for f in os.listdir(bundle.dir("centred")) if "fused" in f]


def test_a_written_attention_node_is_batched_as_written(bundle, caplog, monkeypatch):
    """nn.MultiheadAttention over a robot's tokens [1, 4, 8] (an onnx node, written by
    leapp's writer): its reshapes leave the batch open (-1), so the batched model stacks
    robots on the node as written."""
    monkeypatch.delenv("LEAPP_ONNX_WRITER", raising=False)
    torch.manual_seed(5)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def obs(x):
        attended, _ = attention(x, x, x)
        return attended.mean(1)

    yaml_path = _one_node(bundle, "attend", obs, "tokens", (1, 4, 8), "onnx")
    with caplog.at_level("INFO", logger="leapp"):
        path = leapp.fuse(yaml_path, batch=True)  # checked robot by robot against IM
    assert "cannot be batched" not in caplog.text
    assert onnx.load(os.path.join(bundle.dir("attend"), "obs.onnx")).producer_name == "leapp"
    assert read_metadata(path)["batched"] is True
    _check_fleet(yaml_path, "obs/a", "obs/tokens", (1, 4, 8))

