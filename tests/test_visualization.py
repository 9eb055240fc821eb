"""Tests for leapp.drawing.png (the `<graph>.png` picture): draw, render_pipeline
and the scene layout_pipeline places."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from leapp.bundle.pipeline import Pipeline
from leapp.drawing.png import draw, layout_pipeline, render_pipeline, style

ROOT = Path(__file__).resolve().parents[1]


def port(name: str, shape=(1, 4), dtype: str = "float32", kind: str | None = None) -> dict:
    entry = {"name": name, "dtype": dtype, "shape": list(shape), "type": "tensor"}
    if kind:
        entry["kind"] = kind
    return entry


def node(inputs: list[dict], outputs: list[dict], backend: str | None = "jit") -> dict:
    return {"inputs": inputs, "outputs": outputs,
            "parameters": {"model_path": None, "md5sum": None, "sha256sum": None, "backend": backend}}


def getting_started() -> tuple[dict, dict]:
    """The quick-start pipeline: preprocess (two graph inputs) -> predict."""
    models = {
        "preprocess": node([port("obs1_name", (1, 8)), port("obs2_name", (1, 8))],
                           [port("processed_features", (1, 16))], "jit"),
        "predict": node([port("features", (1, 16))], [port("output", (1, 4))], "onnx"),
    }
    pipeline = {
        "data_flow": {"preprocess/processed_features": ["predict/features"]},
        "feedback_flow": {},
        "inputs": {"preprocess": ["obs1_name", "obs2_name"]},
        "outputs": {"predict": ["output"]},
    }
    return models, pipeline


def feedback_example() -> tuple[dict, dict]:
    """The feedback example of the state-capture guide, as upstream exports it."""
    models = {
        "policy_step": node([port("observation_scalar", (1,)), port("policy_memory_in", (1,))],
                            [port("policy_context", (1,)), port("control_action", (1,))]),
        "feedback_update": node([port("policy_context", (1,)), port("policy_memory_prev", (1,))],
                                [port("policy_memory_out", (1,))]),
    }
    pipeline = {
        "data_flow": {"policy_step/policy_context": ["feedback_update/policy_context"]},
        "feedback_flow": {"feedback_update/policy_memory_out":
                          ["policy_step/policy_memory_in", "feedback_update/policy_memory_prev"]},
        "initial_values": "sample_feedback_graph_initial_values.safetensors",
        "inputs": {"policy_step": ["observation_scalar"]},
        "outputs": {"policy_step": ["control_action"]},
    }
    return models, pipeline


def loop3() -> tuple[dict, dict]:
    models = {
        "a": node([port("x"), port("fb")], [port("y")]),
        "b": node([port("x")], [port("y")], "onnx"),
        "c": node([port("x")], [port("y", kind="target/joint/position"), port("state")], "pt2"),
    }
    pipeline = {"data_flow": {"a/y": ["b/x"], "b/y": ["c/x"]}, "feedback_flow": {"c/state": ["a/fb"]},
                "inputs": {"a": ["x"]}, "outputs": {"c": ["y"]}}
    return models, pipeline


def diamond() -> tuple[dict, dict]:
    models = {
        "split": node([port("x")], [port("l"), port("r")]),
        "left": node([port("in")], [port("out")]),
        "right": node([port("in")], [port("out")], None),
        "join": node([port("l"), port("r")], [port("y")]),
    }
    pipeline = {"data_flow": {"split/l": ["left/in"], "split/r": ["right/in"],
                              "left/out": ["join/l"], "right/out": ["join/r"]},
                "feedback_flow": {}, "inputs": {"split": ["x"]}, "outputs": {"join": ["y"]}}
    return models, pipeline


def chain(n: int) -> tuple[dict, dict]:
    models = {f"node_{i:03d}": node([port("x", (1, 8))], [port("y", (1, 8))]) for i in range(n)}
    pipeline = {"data_flow": {f"node_{i:03d}/y": [f"node_{i + 1:03d}/x"] for i in range(n - 1)},
                "feedback_flow": {}, "inputs": {"node_000": ["x"]}, "outputs": {f"node_{n - 1:03d}": ["y"]}}
    return models, pipeline


def model(graph: tuple[dict, dict]) -> Pipeline:
    models, pipeline = graph
    return Pipeline.from_document({"models": models, "pipeline": pipeline, "system information": {}})


def _near(pixel, color, tol: int = 40) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(pixel, color))


def count_color(path: Path, color, top: int = style.HEADER_BLOCK_H) -> int:
    """Pixels within 30 per channel of `color`, below the header/legend block."""
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.int16)[top:]
    return int((np.abs(pixels - np.array(color, dtype=np.int16)) <= 30).all(axis=-1).sum())


def render(tmp_path: Path, name: str, graph: tuple[dict, dict], **kw) -> Path:
    models, pipeline = graph
    out = tmp_path / f"{name}.png"
    assert render_pipeline(str(out), name, models, pipeline, **kw) == str(out)
    return out


@pytest.mark.parametrize("name,graph,min_size,max_size", [
    ("getting_started", getting_started(), (700, 200), (2000, 600)),
    ("feedback_example", feedback_example(), (700, 250), (2000, 700)),
    ("loop3", loop3(), (900, 250), (2500, 800)),
    ("diamond", diamond(), (700, 300), (2500, 1000)),
])
def test_renders_open_with_expected_size(tmp_path, name, graph, min_size, max_size):
    out = render(tmp_path, name, graph)
    with Image.open(out) as im:
        im.verify()
    with Image.open(out) as im:
        assert im.format == "PNG"
        assert min_size[0] <= im.width <= max_size[0]
        assert min_size[1] <= im.height <= max_size[1]


def test_feedback_drawn_in_feedback_colour(tmp_path):
    with_fb = render(tmp_path, "fb", feedback_example())
    without = render(tmp_path, "gs", getting_started())
    assert count_color(with_fb, style.FEEDBACK_COLOR) > 300
    assert count_color(without, style.FEEDBACK_COLOR) == 0
    assert count_color(without, style.FORWARD_COLOR) > 50
    assert count_color(without, style.INPUT_COLOR) > 50
    assert count_color(without, style.OUTPUT_COLOR) > 50


def test_feedback_lane_runs_above_the_cards(tmp_path):
    models, pipeline = loop3()
    scene = layout_pipeline(model((models, pipeline)))
    (loop,) = scene.loops
    lane_y = min(y for _, y in scene.loop_route(loop))
    assert lane_y < min(i.y for i in scene.items if i.kind == "node")
    out = render(tmp_path, "loop3", (models, pipeline))
    with Image.open(out) as im:
        im = im.convert("RGB")
        row = [im.getpixel((x, round(lane_y))) for x in range(round(loop.xt), round(loop.xs))]
    assert sum(_near(px, style.FEEDBACK_COLOR) for px in row) > len(row) // 3  # dashed


def test_layout_producers_left_of_consumers_and_no_overlap():
    models, pipeline = diamond()
    graph = model((models, pipeline))
    scene = layout_pipeline(graph)
    cards = {i.key[1]: i for i in scene.items if i.kind == "node"}
    for edge in graph.forward_edges():
        assert cards[edge.src_node].x + cards[edge.src_node].width < cards[edge.dst_node].x
    boxes = [(i.x, i.y, i.x + i.width, i.y + i.height) for i in scene.items if i.kind != "dummy"]
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            p, q = boxes[a], boxes[b]
            assert p[2] <= q[0] or q[2] <= p[0] or p[3] <= q[1] or q[3] <= p[1], (p, q)
    assert scene.crossings == 0


def test_chain_of_100_wraps_into_rows(tmp_path):
    out = render(tmp_path, "chain100", chain(100))
    with Image.open(out) as im:
        assert max(im.size) <= style.MAX_SIDE
        assert im.width < 6000 and im.height < 6000
        assert im.height > 1000  # wrapped into several rows, not one strip
    assert out.stat().st_size < 4 * 1024 * 1024


def test_single_node_and_node_without_model(tmp_path):
    out = render(tmp_path, "single", ({"only": node([], [], None)}, {}))
    with Image.open(out) as im:
        assert im.width >= 400 and im.height >= 150
    models, pipeline = diamond()
    no_model = render(tmp_path, "nomodel", (models, pipeline))
    models["right"]["parameters"]["backend"] = "jit"
    with_model = render(tmp_path, "withmodel", (models, pipeline))
    grey = count_color(no_model, style.BADGE_NONE, top=style.HEADER_BLOCK_H + 4)
    assert grey > count_color(with_model, style.BADGE_NONE, top=style.HEADER_BLOCK_H + 4) + 20


def test_backend_override_changes_badge(tmp_path):
    plain = render(tmp_path, "plain", getting_started())
    override = render(tmp_path, "override", getting_started(), backends={"predict": "pt2", "preprocess": None})
    assert count_color(plain, style.BADGE_COLORS["pt2"], top=style.HEADER_BLOCK_H + 4) == 0
    assert count_color(override, style.BADGE_COLORS["pt2"], top=style.HEADER_BLOCK_H + 4) > 20


def test_deterministic_bytes(tmp_path):
    a = render(tmp_path, "a", feedback_example())
    b = tmp_path / "b.png"
    render_pipeline(str(b), "a", *feedback_example())
    assert a.read_bytes() == b.read_bytes()


def test_deterministic_across_processes(tmp_path):
    here = render(tmp_path, "loop3", loop3())
    other = tmp_path / "other.png"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tests.test_visualization as t; "
            "from leapp.drawing.png import render_pipeline; render_pipeline(sys.argv[2], 'loop3', *t.loop3())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-c", code, str(ROOT), str(other)], check=True, env=env, cwd=ROOT)
    assert here.read_bytes() == other.read_bytes()


def test_no_metadata_chunks(tmp_path):
    data = render(tmp_path, "meta", getting_started()).read_bytes()
    for chunk in (b"tIME", b"tEXt", b"iTXt", b"zTXt"):
        assert chunk not in data


@pytest.mark.parametrize("mutate,needle", [
    (lambda m, p: p["data_flow"].update({"ghost/y": ["predict/features"]}), "ghost"),
    (lambda m, p: p["data_flow"].update({"preprocess/processed_features": ["nowhere/x"]}), "nowhere"),
    (lambda m, p: p["data_flow"].update({"preprocess/processed_features": ["predict/bogus"]}), "bogus"),
    (lambda m, p: p["inputs"].update({"missing": ["x"]}), "missing"),
    (lambda m, p: m["predict"].update({"inputs": "not a list"}), "predict"),
    # a '/' in a node name: the key would not split into node and port
    (lambda m, p: m.update({"pre/process": m.pop("preprocess")}), "pre/process"),
])
def test_bad_input_raises_clear_error(tmp_path, mutate, needle):
    """The mappings are read by Pipeline.from_document: its message, inside a
    RuntimeError naming the graph, and no file written."""
    models, pipeline = getting_started()
    mutate(models, pipeline)
    out = tmp_path / "bad.png"
    with pytest.raises(RuntimeError) as info:
        render_pipeline(str(out), "my_graph", models, pipeline)
    message = str(info.value)
    assert message.startswith(f"cannot render the graph 'my_graph' to {out}: ")
    assert needle in message
    assert isinstance(info.value.__cause__, ValueError)
    assert not out.exists()
    assert not list(tmp_path.iterdir())


def test_cyclic_data_flow_is_refused(tmp_path):
    """A data_flow cycle is no pipeline (loops go under feedback_flow)."""
    models = {"a": node([port("x")], [port("y")]), "b": node([port("x")], [port("y")])}
    pipeline = {"data_flow": {"a/y": ["b/x"], "b/y": ["a/x"]}}
    out = tmp_path / "cycle.png"
    with pytest.raises(RuntimeError, match="cannot render the graph 'cycle' .*cycle through nodes"):
        render_pipeline(str(out), "cycle", models, pipeline)
    assert not out.exists()


def test_backends_naming_unknown_node_raises(tmp_path):
    out = tmp_path / "bad.png"
    with pytest.raises(RuntimeError, match="cannot render the graph 'g' .*'backends' names unknown node"):
        draw(model(getting_started()), str(out), "g", backends={"ghost": "jit"})
    assert not out.exists()


def test_draw_and_render_pipeline_give_the_same_file(tmp_path):
    via_mappings = render(tmp_path, "loop3", loop3())
    via_model = tmp_path / "model.png"
    assert draw(model(loop3()), str(via_model), "loop3") == str(via_model)
    assert via_mappings.read_bytes() == via_model.read_bytes()


def test_data_edge_to_own_node_is_drawn_as_a_loop(tmp_path):
    models = {"a": node([port("x"), port("s")], [port("y"), port("z")]), "b": node([port("x")], [port("y")])}
    pipeline = {"data_flow": {"a/y": ["b/x"], "a/z": ["a/s"]}, "inputs": {"a": ["x"]}, "outputs": {"b": ["y"]}}
    (loop,) = layout_pipeline(model((models, pipeline))).loops
    assert (loop.src.key, loop.dst.key, loop.kind) == (("node", "a"), ("node", "a"), "forward")
    out = render(tmp_path, "self", (models, pipeline))
    assert count_color(out, style.FEEDBACK_COLOR) == 0  # still a data edge, not feedback
