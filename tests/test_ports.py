"""The port catalogue (docs/runtime.md): every field of every record against its YAML.

Bundles: the examples, the compat pipelines, bundles exported from rsl-rl-lib,
rl_games, skrl and Stable-Baselines3 (sb3-contrib) the way Isaac Lab's export
backends drive leapp (tests/client_exports.py), and a hand-written config-1.4
bundle built from the fields upstream's development line documents.

Each record is checked against the YAML read here with PyYAML and a reading
written for the test (the keys of `pipeline.inputs` / `outputs` / `feedback_flow`,
the names of nested `element_names` lists collected), not against the
catalogue's own parser; whether an output is static is checked against the
running pipeline (a static output is the same whatever the inputs), and the
literal expectations of the semantics bundle and the 1.4 bundle are written
by hand from the scripts that made them.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml

import leapp
from leapp import InferenceManager, InputKindEnum, OutputKindEnum
from leapp.bundle.pipeline import Pipeline
from leapp.bundle.ports import Axis, PortLookupError
from leapp.cli import main as cli_main

from support import ROOT

PY = sys.executable
MARKER = "__temporal_axis__"
KNOWN = {"name", "dtype", "shape", "type", "kind", "element_names", "temporal_period_ms",
         "axes", "is_setpoint", "reference", "expressed_in"}
ENUM_VALUES = {m.value: m for enum in (InputKindEnum, OutputKindEnum) for m in enum}


def _needs(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                              "(the 'test' extra)")


# ---- the YAML, read for the test -------------------------------------------------------------

def _documents(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        merged: dict[str, Any] = {}
        for doc in yaml.safe_load_all(handle):
            merged.update(doc or {})
    return merged


def _names_in(value: Any) -> list[str]:
    """Every element name of an element_names value, in order, the marker left out."""
    if isinstance(value, str):
        return [] if value == MARKER else [value]
    if isinstance(value, list):
        return [name for item in value for name in _names_in(item)]
    return []


def _entry(doc: dict, node: str, name: str, side: str) -> dict:
    found = [p for p in doc["models"][node][side] if p["name"] == name]
    assert len(found) == 1, (node, name, side)
    return found[0]


def _graph_ports(doc: dict, key: str) -> list[tuple[str, str]]:
    return [(node, port) for node, ports in (doc["pipeline"].get(key) or {}).items()
            for port in ports]


def _check_record(record: Any, entry: dict, node: str, side: str, device: Any) -> None:
    """One record against the YAML entry it came from."""
    assert record.key == f"{node}/{entry['name']}"
    assert (record.node, record.name, record.side) == (node, entry["name"], side)
    kind = entry.get("kind")
    assert record.kind == ENUM_VALUES.get(kind, kind), (record.key, record.kind)
    assert record.kind_name == kind
    assert record.element_names == tuple(_names_in(entry.get("element_names"))), record.key
    assert MARKER not in record.element_names
    if isinstance(entry.get("element_names"), list) and MARKER in entry["element_names"]:
        assert record.temporal_axis is not None, record.key
        assert record.temporal_period_ms == entry["temporal_period_ms"]
    assert record.shape == tuple(entry["shape"]) and isinstance(record.shape, tuple)
    assert record.dtype == getattr(torch, entry["dtype"]) and record.dtype_name == entry["dtype"]
    assert record.device == device
    assert dict(record.extra) == {k: v for k, v in entry.items() if k not in KNOWN}, record.key
    assert record.is_setpoint is bool(entry.get("is_setpoint", False))
    assert record.reference == entry.get("reference")


def check_bundle(yaml_path: str) -> InferenceManager:
    """Every record of the manager's and the pipeline's catalogues against the YAML; the
    static flags against the running pipeline; zeros_input and a step."""
    doc = _documents(yaml_path)
    manager = InferenceManager(yaml_path)
    model = Pipeline.load(yaml_path)
    feedback = [(src, dst) for src, targets in (doc["pipeline"].get("feedback_flow") or {}).items()
                for dst in targets]
    for catalogue, runtime in ((manager, True), (model, False)):
        for key, side, ports in (("inputs", "input", catalogue.input_ports),
                                 ("outputs", "output", catalogue.output_ports)):
            expected = _graph_ports(doc, key)
            assert list(ports) == [f"{n}/{p}" for n, p in expected]
            for (node, name), record in zip(expected, ports.values()):
                device = torch.device(manager.nodes[node].device) if runtime else None
                _check_record(record, _entry(doc, node, name, key), node, side, device)
                assert record.source is None
                if side == "input" or not runtime:
                    assert record.static is (False if side == "input" else None)
        targets = list(dict.fromkeys(dst for _, dst in feedback))
        assert list(catalogue.feedback_ports) == targets
        for src, dst in feedback:
            record = catalogue.feedback_ports[dst]
            if record.source != src:  # a target fed twice keeps its first source
                continue
            node, name = dst.split("/")
            device = torch.device(manager.nodes[node].device) if runtime else None
            _check_record(record, _entry(doc, node, name, "inputs"), node, "input", device)
    assert list(manager.input_ports) == manager.inputs
    assert list(manager.output_ports) == manager.outputs
    assert list(manager.feedback_ports) == list(dict.fromkeys(manager.feedback_inputs))
    assert dict(manager.configs) == (doc["pipeline"].get("configs") or {})
    assert manager.frequency == (doc["pipeline"].get("configs") or {}).get("frequency")

    # zeros_input: get_mock_input's keys, shapes, dtypes and devices, all zeros
    zeros, mock = manager.zeros_input(), manager.get_mock_input()
    assert list(zeros) == list(mock) == manager.inputs
    for key, value in zeros.items():
        port = manager.input_ports[key]
        assert (tuple(value.shape), value.dtype, value.device) == \
            (port.shape, port.dtype, port.device) == \
            (tuple(mock[key].shape), mock[key].dtype, mock[key].device)
        assert not value.any()
    for key, value in manager.zeros_input().items():
        assert value is not zeros[key]  # new tensors on every call

    # static: an output the model computes from no input is the same whatever the inputs
    with torch.inference_mode():
        manager.reset()
        first = manager.run_policy(manager.zeros_input())
        manager.reset()
        torch.manual_seed(11)
        second = manager.run_policy(manager.get_mock_input())
    assert list(first) == list(manager.output_ports)
    for key, port in manager.output_ports.items():
        assert isinstance(port.static, bool), key
        assert tuple(first[key].shape) == port.shape and first[key].dtype == port.dtype
        if port.static:
            assert torch.equal(first[key], second[key]), key
    manager.reset()
    return manager


# ---- the examples and the compat pipelines -----------------------------------------------------

EXAMPLES = ["getting_started", "complete_pipeline", "method_node", "state_tensors",
            "module_buffers", "stateful_gru_export", "feedback_example"]
COMPAT = sorted(os.path.basename(p)[:-3] for p in glob.glob(
    os.path.join(ROOT, "bench", "compat_pipelines", "*.py"))
    if not os.path.basename(p).startswith("_"))


def _run_script(script: str, workdir: str) -> list[str]:
    """Run an example or compat pipeline as its docs do; the YAML files it wrote."""
    out = os.path.join(workdir, "out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(script)]))
    proc = subprocess.run([PY, script, out], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted(glob.glob(os.path.join(workdir, "**", "*.yaml"), recursive=True))
    assert found, f"{script} wrote no bundle"
    return found


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_port_matches_its_yaml(tmp_path, name):
    for yaml_path in _run_script(os.path.join(ROOT, "examples", f"{name}.py"), str(tmp_path)):
        check_bundle(yaml_path)


@pytest.mark.parametrize("name", COMPAT)
def test_every_compat_pipeline_port_matches_its_yaml(tmp_path, name):
    script = os.path.join(ROOT, "bench", "compat_pipelines", f"{name}.py")
    for yaml_path in _run_script(script, str(tmp_path)):
        check_bundle(yaml_path)


@pytest.fixture(scope="module")
def semantics_bundle(tmp_path_factory) -> str:
    """bench/compat_pipelines/semantics_static.py's bundle (kinds in every form, extra
    fields, static outputs)."""
    workdir = str(tmp_path_factory.mktemp("semantics"))
    (path,) = _run_script(os.path.join(ROOT, "bench", "compat_pipelines",
                                       "semantics_static.py"), workdir)
    return path


def test_semantics_bundle_by_hand(semantics_bundle):
    """What semantics_static.py annotated, written out by hand."""
    manager = InferenceManager(semantics_bundle)
    joints = ("hip", "knee", "ankle", "wrist")
    pos = manager.input_by_kind(InputKindEnum.JOINT_POSITION)
    assert pos is manager.input_by_kind("state/joint/position")
    assert (pos.key, pos.kind, pos.element_names, pos.shape, pos.dtype) == \
        ("observe/joint_pos", InputKindEnum.JOINT_POSITION, joints, (1, 4), torch.float32)
    assert pos.axis_names == (None, joints)
    vel = manager.input_ports["observe/joint_vel"]
    assert vel.element_names == joints and dict(vel.extra) == {"units": "rad/s"}
    command = manager.input_by_kind("command/custom")  # a custom kind stays a string
    assert (command.key, command.kind, command.element_names) == \
        ("observe/command", "command/custom", ("vx",))
    target = manager.output_by_kind(OutputKindEnum.JOINT_POSITION)
    assert (target.key, target.static, dict(target.extra)) == \
        ("act/target", False, {"clip": 1.5, "frame": "base"})
    assert manager.output_by_kind(OutputKindEnum.KP).key == "act/gains"
    kd = manager.output_by_kind("kd")
    assert (kd.key, kd.static, kd.element_names) == ("act/kd", True, joints)
    assert {k: p.static for k, p in manager.output_ports.items()} == {
        "act/target": False, "act/gains": False, "act/kd": True, "offset/shifted": False,
        "offset/bias": True}
    assert [p.key for p in manager.outputs_by_kind("nothing")] == []
    assert manager.frequency is None and dict(manager.configs) == {}
    # element lookups
    assert pos.index_of(["knee", "hip"]) == [1, 0]
    assert pos.index_of("wrist") == [3]
    assert pos.index_of(["wrist"], axis=-1) == [3]
    with pytest.raises(PortLookupError, match=r"Port 'observe/joint_pos' has no elements "
                       r"'elbow', 'toe' on axis 1; its elements: hip, knee, ankle, wrist"):
        pos.index_of(["hip", "elbow", "toe"])
    with pytest.raises(PortLookupError, match="Port 'act/gains' names no elements"):
        manager.output_by_kind("kp").index_of(["hip"])
    with pytest.raises(PortLookupError, match=r"names no elements on axis 0"):
        pos.index_of(["hip"], axis=0)


def test_by_kind_refuses_none_and_several(semantics_bundle):
    manager = InferenceManager(semantics_bundle)
    with pytest.raises(KeyError) as none:
        manager.output_by_kind(OutputKindEnum.JOINT_TORQUES)
    assert str(none.value) == (
        "No graph output has kind 'target/joint/torques'. The graph outputs: act/target "
        "(target/joint/position), act/gains (kp), act/kd (kd), offset/shifted (no kind), "
        "offset/bias (no kind)")
    with pytest.raises(PortLookupError, match="No graph input has kind 'kp'"):
        manager.input_by_kind("kp")
    with pytest.raises(TypeError, match="A kind is an InputKindEnum / OutputKindEnum member"):
        manager.input_by_kind(3)
    # two outputs of one kind: a bundle whose YAML gives kd's kind to gains as well
    doc_text = open(semantics_bundle, encoding="utf-8").read()
    assert doc_text.count("      kind: kp\n") == 1
    twice = os.path.join(os.path.dirname(semantics_bundle), "twice.yaml")
    with open(twice, "w", encoding="utf-8") as handle:
        handle.write(doc_text.replace("      kind: kp\n", "      kind: kd\n"))
    model = Pipeline.load(twice)
    assert [p.key for p in model.outputs_by_kind("kd")] == ["act/gains", "act/kd"]
    with pytest.raises(PortLookupError) as several:
        model.output_by_kind(OutputKindEnum.KD)
    assert str(several.value) == (
        "2 graph outputs have kind 'kd': act/gains, act/kd; output_by_kind wants exactly one. "
        "Use outputs_by_kind('kd') for all of them, or pick one by its key in output_ports")


def test_inspect_and_view_show_the_catalogue(semantics_bundle, tmp_path, capsys):
    assert cli_main(["inspect", semantics_bundle]) == 0
    text = capsys.readouterr().out
    catalogue = text[text.index("frequency:"):]
    assert catalogue == (
        "frequency: none (the pipeline's configs name no frequency)\n"
        "ports by kind (7 kind(s)):\n"
        "  state/joint/position\n"
        "    in   observe/joint_pos: float32[1x4]  elements [hip, knee, ankle, wrist]\n"
        "  state/joint/velocity\n"
        "    in   observe/joint_vel: float32[1x4]  elements [hip, knee, ankle, wrist]  "
        "(units=rad/s)\n"
        "  command/custom\n"
        "    in   observe/command: float32[1x3]  elements [vx]\n"
        "  target/joint/position\n"
        "    out  act/target: float32[1x4]  elements [hip, knee, ankle, wrist]  "
        "(clip=1.5, frame=base)\n"
        "  kp\n"
        "    out  act/gains: float32[1x4]\n"
        "  kd\n"
        "    out  act/kd: float32[1x4]  elements [hip, knee, ankle, wrist]\n"
        "  (no kind)\n"
        "    out  offset/shifted: float32[1x11]\n"
        "    out  offset/bias: float32[3]\n"
        "feedback ports (0):\n"
        "validation analytics (semantics_static_analytics.json, 17 check(s)):\n"
        "  observe: 2/2 passed, max abs error 0.000e+00\n"
        "  act: 9/9 passed, max abs error 0.000e+00\n"
        "  offset: 6/6 passed, max abs error 0.000e+00\n"
        "checksums: ok\n")
    page_path = str(tmp_path / "view.html")
    assert cli_main(["view", semantics_bundle, "-o", page_path]) == 0
    page = open(page_path, encoding="utf-8").read()
    import json
    import re
    data = json.loads(re.search(r'id="leapp-data">(.*?)</script>', page, re.S).group(1))
    rows = data["catalogue"]
    assert rows["frequency"] is None and rows["feedback"] == []
    assert [(r["key"], r["kind"], r["elements"]) for r in rows["inputs"]] == [
        ("observe/joint_pos", "state/joint/position", ["hip", "knee", "ankle", "wrist"]),
        ("observe/joint_vel", "state/joint/velocity", ["hip", "knee", "ankle", "wrist"]),
        ("observe/command", "command/custom", ["vx"])]
    assert rows["outputs"][0]["extra"] == {"clip": 1.5, "frame": "base"}
    act = data["nodes"]["act"]["outputs"]
    assert [(p["name"], p["kind"], p["elements"]) for p in act] == [
        ("target", "target/joint/position", ["hip", "knee", "ankle", "wrist"]),
        ("gains", "kp", []), ("kd", "kd", ["hip", "knee", "ankle", "wrist"])]
    assert "function catalogue(c)" in page and "if(DATA.catalogue)intro+=catalogue" in page


def test_view_renders_the_catalogue_in_a_browser(tmp_path):
    """The page's catalogue table, as Chromium draws it, for a bundle with a frequency, a
    temporal axis and feedback."""
    from test_view import _chromium
    if _chromium() is None:
        pytest.skip("chromium and chromedriver are not installed")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    yaml_path = _temporal_feedback_bundle(str(tmp_path))
    page_path = str(tmp_path / "view.html")
    assert cli_main(["view", yaml_path, "-o", page_path]) == 0
    options = webdriver.ChromeOptions()
    options.binary_location = _chromium()[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=_chromium()[1]))
    try:
        driver.get("file://" + page_path)
        rows = driver.find_elements(By.CSS_SELECTOR, "#catalogue tr[data-key]")
        cells = [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]
        assert driver.find_element(By.ID, "frequency").text == \
            "frequency: 25 Hz (period 40 ms)"
        assert cells == [
            ["state/joint/position", "input", "arm/history", "[3, 2]", "float32", "hip, knee",
             "axis 0, 20 ms", ""],
            ["target/joint/position", "output", "arm/plan", "[2]", "float32", "hip, knee", "",
             ""]]
        fed = driver.find_elements(By.CSS_SELECTOR, "#feedback-ports tr[data-key] td")
        assert [c.text for c in fed] == ["arm/memory", "arm/memory", "[2]", "float32"]
    finally:
        driver.quit()


def _temporal_feedback_bundle(save_path: str) -> str:
    """arm: a history of joint positions (time axis first, 20 ms apart), a declared state
    fed back, a frequency."""
    from leapp import GraphConfigs, TemporalAxis, TensorSemantics, annotate
    leapp.start("arm", save_path=save_path)
    memory = torch.zeros(2)
    for step in range(2):
        history = annotate.input_tensors("arm", TensorSemantics(
            "history", torch.full((3, 2), float(step)), kind=InputKindEnum.JOINT_POSITION,
            element_names=[TemporalAxis(period_ms=20), ["hip", "knee"]]))
        memory = annotate.state_tensors("arm", {"memory": memory})
        plan = history.mean(dim=0) + memory
        annotate.update_state("arm", {"memory": plan * 0.5})
        annotate.output_tensors("arm", TensorSemantics(
            "plan", plan, kind=OutputKindEnum.JOINT_POSITION, element_names=["hip", "knee"]),
            export_with="jit")
    leapp.stop()
    leapp.compile_graph(graph_configs=GraphConfigs(frequency=25), visualize=False)
    return os.path.join(save_path, "arm", "arm.yaml")


def test_temporal_axis_and_feedback_by_hand(tmp_path):
    yaml_path = _temporal_feedback_bundle(str(tmp_path))
    manager = check_bundle(yaml_path)
    history = manager.input_ports["arm/history"]
    assert (history.element_names, history.axis_names, history.temporal_axis,
            history.temporal_period_ms) == (("hip", "knee"), (None, ("hip", "knee")), 0, 20)
    assert history.index_of(["knee"]) == [1]
    assert list(manager.feedback_ports) == ["arm/memory"]
    memory = manager.feedback_ports["arm/memory"]
    assert (memory.source, memory.shape, memory.side, memory.static) == \
        ("arm/memory", (2,), "input", False)
    assert manager.frequency == 25 and dict(manager.configs) == {"frequency": 25}
    buffer = io.StringIO()
    from leapp.cli import cmd_inspect
    import argparse
    cmd_inspect(argparse.Namespace(bundle=yaml_path), buffer)
    text = buffer.getvalue()
    assert "frequency: 25 Hz (period 40 ms)\n" in text
    assert "    in   arm/history: float32[3x2]  elements [hip, knee]  time axis 0 every 20 ms\n" \
        in text
    assert "feedback ports (1):\n    in   arm/memory: float32[2]  <- arm/memory\n" in text


@pytest.mark.parametrize("backend", ["jit", "onnx", "pt2"])
def test_static_outputs_found_in_every_backend(tmp_path, backend):
    """Gains as a static output beside a regular one: static where no input reaches it,
    in each backend's graph."""
    leapp.start("gains", save_path=str(tmp_path))
    for step in range(2):
        x = annotate_input("ctrl", torch.full((1, 3), float(step + 1)))
        leapp.annotate.output_tensors(
            "ctrl", {"action": torch.tanh(x) * 2.0},
            static_outputs={"kp": torch.full((1, 3), 40.0), "kd": torch.full((3,), 2.0)},
            export_with=backend)
    leapp.stop()
    leapp.compile_graph(visualize=False)
    manager = check_bundle(os.path.join(str(tmp_path), "gains", "gains.yaml"))
    assert {k: p.static for k, p in manager.output_ports.items()} == {
        "ctrl/action": False, "ctrl/kp": True, "ctrl/kd": True}


def annotate_input(node: str, value: torch.Tensor) -> torch.Tensor:
    return leapp.annotate.input_tensors(node, {"x": value})


# ---- bundles exported from RL libraries ------------------------------------------------------

@_needs("rsl_rl")
def test_rsl_rl_bundle_ports(tmp_path):
    import test_rsl_rl
    was = torch.jit._state._enabled.enabled
    torch.jit._state.disable()
    try:
        yaml_path = test_rsl_rl.export_actor_critic(str(tmp_path), "lstm")
    finally:
        if was:
            torch.jit._state.enable()
    manager = check_bundle(yaml_path)
    assert list(manager.input_ports) == ["actor/policy", "critic/policy", "critic/privileged"]
    assert list(manager.output_ports) == ["actor/actions", "critic/value"]
    assert manager.feedback_ports and all(
        p.source is not None and p.node in ("actor", "critic")
        for p in manager.feedback_ports.values())


@_needs("rl_games", "gymnasium")
def test_rl_games_bundle_ports(tmp_path):
    import test_client_exports as clients
    manager = check_bundle(clients.export_rl_games(str(tmp_path), "jit"))
    assert [(k, p.shape) for k, p in manager.input_ports.items()] == [("policy/obs", (2, 6))]
    assert [(k, p.shape, p.static) for k, p in manager.output_ports.items()] == [
        ("policy/actions", (2, 3), False)]
    assert {k: (p.source, p.shape) for k, p in manager.feedback_ports.items()} == {
        "policy/actor_state_0": ("policy/actor_state_0", (1, 2, 8)),
        "policy/actor_state_1": ("policy/actor_state_1", (1, 2, 8))}


@_needs("skrl", "gymnasium")
def test_skrl_bundle_ports(tmp_path):
    import client_exports as ce
    import test_client_exports as clients
    agent = clients.make_skrl_ppo()
    env = ce.ExportEnv(clients.SKRL_ENVS, clients.SKRL_OBS, "onnx-dynamo")

    def step(obs: torch.Tensor) -> torch.Tensor:
        actions, outputs = agent.act(obs, None, timestep=0, timesteps=0)
        obs, _, _ = env.step(outputs.get("mean_actions", actions))
        return obs

    manager = check_bundle(clients._traced_loop(str(tmp_path), "skrl_ppo", step, env))
    assert [(k, p.shape, p.device) for k, p in manager.input_ports.items()] == [
        ("policy/obs", (2, 6), torch.device(manager.nodes["policy"].device))]
    assert [(k, p.static) for k, p in manager.output_ports.items()] == [
        ("policy/actions", False)]
    assert dict(manager.feedback_ports) == {}


@_needs("sb3_contrib", "stable_baselines3", "gymnasium")
def test_sb3_recurrent_ppo_bundle_ports(tmp_path):
    import test_client_exports as clients
    manager = check_bundle(clients.export_recurrent_ppo(str(tmp_path), "onnx-dynamo"))
    assert list(manager.input_ports) == ["policy/obs"]
    assert [(k, p.static) for k, p in manager.output_ports.items()] == [
        ("policy/actions", False)]
    assert {k: p.source for k, p in manager.feedback_ports.items()} == {
        f"policy/actor_state_{i}_in": f"policy/actor_state_{i}_out" for i in range(2)}


# ---- a hand-written config-1.4 bundle ------------------------------------------------------------

class _Policy(torch.nn.Module):
    """joint_pos [1, 3] and a command [1, 3] in; targets [1, 3] and stiffness [1, 3] out."""

    def forward(self, joint_pos: torch.Tensor, twist: torch.Tensor) -> tuple[torch.Tensor,
                                                                               torch.Tensor]:
        return joint_pos + 0.1 * twist, torch.full((1, 3), 40.0)


YAML_14 = """\
models:
  policy:
    inputs:
    - name: joint_pos
      dtype: float32
      shape: [1, 3]
      type: tensor
      kind: joint/position
      axes:
      - kind: robot
      - kind: element
        names: [hip, knee, ankle]
        units: rad
      source: state:robot:joint_pos
    - name: twist
      dtype: float32
      shape: [1, 3]
      type: tensor
      kind: frame/twist
      axes:
      - null
      - {kind: component, names: [vx, vy, wz]}
      reference: base
      expressed_in: {selector: self}
      sensor_rate_hz: 200
    outputs:
    - name: targets
      dtype: float32
      shape: [1, 3]
      type: tensor
      kind: joint/position
      is_setpoint: true
      axes:
      - {kind: robot}
      - {kind: element, names: [hip, knee, ankle]}
    - name: stiffness
      dtype: float32
      shape: [1, 3]
      type: tensor
      kind: kp
    parameters:
      model_path: policy.pt
      md5sum: {md5}
      sha256sum: {sha256}
      backend: jit
pipeline:
  data_flow: {{}}
  feedback_flow: {{}}
  inputs:
    policy: [joint_pos, twist]
  outputs:
    policy: [targets, stiffness]
  configs:
    frequency: 50
    decimation: 4
system information:
  python version: 3.12.0
  torch version: 2.9.1
  leapp version: 0.8.0.dev0
  leapp config version: '1.4'
  cuda version: None
  os: Ubuntu 24.04
"""


def _bundle_14(directory: str, text: str = YAML_14) -> str:
    path = os.path.join(directory, "policy.pt")
    torch.jit.script(_Policy()).save(path)
    data = open(path, "rb").read()
    yaml_path = os.path.join(directory, "robot14.yaml")
    with open(yaml_path, "w", encoding="utf-8") as handle:
        handle.write(text.replace("{md5}", hashlib.md5(data).hexdigest())
                     .replace("{sha256}", hashlib.sha256(data).hexdigest())
                     .replace("{{}}", "{}"))
    return yaml_path


def test_config_14_bundle_loads_runs_and_reports_its_ports(tmp_path):
    yaml_path = _bundle_14(str(tmp_path))
    manager = InferenceManager(yaml_path)
    assert manager.system_info["leapp config version"] == "1.4"
    joints = ("hip", "knee", "ankle")
    pos = manager.input_by_kind("joint/position")
    assert (pos.key, pos.kind, pos.element_names, pos.axis_names, pos.shape, pos.dtype) == \
        ("policy/joint_pos", "joint/position", joints, (None, joints), (1, 3), torch.float32)
    assert pos.axes == (Axis(kind="robot"),
                        Axis(kind="element", names=joints, extra={"units": "rad"}))
    assert dict(pos.axes[1].extra) == {"units": "rad"}  # an unknown axis field kept
    assert dict(pos.extra) == {"source": "state:robot:joint_pos"}
    assert (pos.is_setpoint, pos.reference, pos.expressed_in, pos.temporal_axis) == \
        (False, None, None, None)
    twist = manager.input_by_kind("frame/twist")
    assert (twist.element_names, twist.reference, dict(twist.expressed_in)) == \
        (("vx", "vy", "wz"), "base", {"selector": "self"})
    assert twist.axes == (None, Axis(kind="component", names=("vx", "vy", "wz")))
    assert dict(twist.extra) == {"sensor_rate_hz": 200}  # the unknown field is kept
    targets = manager.output_by_kind("joint/position")
    assert (targets.key, targets.is_setpoint, targets.static, targets.element_names) == \
        ("policy/targets", True, False, joints)
    stiffness = manager.output_by_kind(OutputKindEnum.KP)
    assert (stiffness.kind, stiffness.static) == (OutputKindEnum.KP, True)
    assert manager.frequency == 50 and dict(manager.configs) == {"frequency": 50,
                                                                 "decimation": 4}
    assert targets.index_of(["ankle", "hip"]) == [2, 0]
    # it runs, and the command's components go where the names say
    inputs = manager.zeros_input()
    inputs[pos.key][0] = torch.tensor([1.0, 2.0, 3.0])
    inputs[twist.key][0, twist.index_of(["wz"])] = 10.0
    outputs = manager.run_policy(inputs)
    assert torch.allclose(outputs[targets.key], torch.tensor([[1.0, 2.0, 4.0]]))
    assert torch.equal(outputs[stiffness.key], torch.full((1, 3), 40.0))
    # nothing the YAML says is lost: the pipeline model writes every field back
    reread = yaml.safe_load_all(io.StringIO(Pipeline.load(yaml_path).to_yaml()))
    assert [doc for doc in reread] == list(yaml.safe_load_all(open(yaml_path)))


def test_config_14_time_axis_and_forms_the_record_cannot_hold(tmp_path):
    text = YAML_14.replace("""      kind: joint/position
      axes:
      - kind: robot
      - kind: element
        names: [hip, knee, ankle]
        units: rad
""", """      kind: joint/position
      axes:
      - {kind: time, period_ms: 5}
      - {kind: element, names: [hip, knee, ankle]}
""").replace("""      reference: base
      expressed_in: {selector: self}
""", """      reference: [base, odom]
      expressed_in: {frame: world}
      axes_note: 1
""").replace("""      - null
      - {kind: component, names: [vx, vy, wz]}
""", """      - null
      - {kind: component, names: vx}
""")
    manager = InferenceManager(_bundle_14(str(tmp_path), text))
    pos = manager.input_ports["policy/joint_pos"]
    assert (pos.temporal_axis, pos.temporal_period_ms, pos.element_names) == \
        (0, 5, ("hip", "knee", "ankle"))
    twist = manager.input_ports["policy/twist"]
    # a reference that is not a frame name and axis names that are not a list: kept in extra
    assert twist.reference is None and twist.element_names == ()
    assert dict(twist.extra) == {"reference": ("base", "odom"), "sensor_rate_hz": 200,
                                 "axes_note": 1}
    assert dict(twist.axes[1].extra) == {"names": "vx"}
    assert dict(twist.expressed_in) == {"frame": "world"}
    manager.run_policy(manager.zeros_input())
