"""The interactive view (<graph>.html, leapp.drawing.html): written by compile_graph and
`leapp view` for every example and compat pipeline, self-contained, and working in a real
browser: headless Chromium (Debian's chromium + chromium-driver, installed by `make setup`)
driven by selenium, with the network disabled."""
from __future__ import annotations

import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import leapp
from leapp import annotate
from leapp.cli import main as cli_main
from leapp.bundle.pipeline import Pipeline
from support import ROOT, under_sanitizer

PY = sys.executable

# The view is Python, HTML and JavaScript over a compiled bundle: the sanitized
# suite (`make test-asan`) checks the C core, and Chromium cannot start under its
# LD_PRELOAD, so the view's tests run in `make test` only.
pytestmark = pytest.mark.skipif(under_sanitizer(), reason="the view runs no C code of "
                                "leapp's; Chromium does not start under the sanitizer")


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    found = _chromium()
    if found is None:
        pytest.skip("chromium and chromedriver are not installed (make setup installs "
                    "Debian's chromium and chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1500,1000", "--force-device-scale-factor=1",
                 # no network: every proxy request fails and no host name resolves
                 "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                 "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=found[1]))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _inlined_constant_bundle(save_path: str) -> str:
    """policy adds `offset`, a tensor computed outside every node and never declared: it is
    baked into the ONNX model as a constant, so re-entry samples 1 and 2 fail validation."""
    leapp.start("inlined", save_path=save_path)
    offset = torch.full((1, 4), 0.25)
    for step in range(3):
        obs = annotate.input_tensors("policy", {"obs": torch.full((1, 4), float(step))})
        action = torch.tanh(obs) + offset
        annotate.output_tensors("policy", {"action": action}, export_with="onnx")
        x = annotate.input_tensors("post", {"action": action})
        annotate.output_tensors("post", {"command": x * 2.0}, export_with="jit")
        offset = offset + 1.0
    leapp.stop()
    result = leapp.compile_graph(strict=False)
    assert dict(result) == {"policy": False, "post": True}
    return os.path.join(save_path, "inlined")


def _data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="leapp-data">(.*?)</script>', page,
                      re.S)
    assert match
    return json.loads(match.group(1))


def _self_contained(page: str) -> None:
    assert not re.search(r"https?://", page), "the view references the network"
    assert not re.search(r"<(script|link|img)[^>]*(src|href)=", page), "an external resource"


def _open(browser, path: str) -> None:
    browser.get("file://" + os.path.abspath(path))
    browser.implicitly_wait(0)
    assert browser.execute_script("return document.readyState") == "complete"


def _non_blank(png: bytes) -> None:
    from PIL import Image
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    background = max(colours)[0]
    assert background < image.width * image.height * 0.97, "the screenshot is nearly empty"


def test_compile_writes_the_view_and_it_explains_an_inlined_constant(tmp_path, browser):
    bundle = _inlined_constant_bundle(str(tmp_path))
    page_path = os.path.join(bundle, "inlined.html")
    page = open(page_path, encoding="utf-8").read()
    _self_contained(page)
    # the data alone: failing node, sample and output, and the baked constant
    data = _data(page)
    rows = data["nodes"]["policy"]["validation"]
    assert [(r["sample"], r["output"], r["passed"]) for r in rows] == [
        (0, "action", True), (1, "action", False), (2, "action", False)]
    assert rows[1]["max_abs"] == pytest.approx(1.0, abs=1e-5)
    assert all(r["passed"] for r in data["nodes"]["post"]["validation"])

    _open(browser, page_path)
    from selenium.webdriver.common.by import By
    nodes = browser.find_elements(By.CSS_SELECTOR, "svg#pipeline g.node")
    assert sorted(n.get_attribute("data-node") for n in nodes) == ["policy", "post"]
    edges = browser.find_elements(By.CSS_SELECTOR, "svg#pipeline g.edge")
    ends = sorted((e.get_attribute("data-kind"), e.get_attribute("data-src"),
                   e.get_attribute("data-dst")) for e in edges)
    assert ends == [("forward", "policy/action", "post/action"),
                    ("graph_input", "input:policy/obs", "policy/obs"),
                    ("graph_output", "post/command", "output:post/command")]
    failed = browser.find_element(By.ID, "failed-nodes").text
    assert "policy" in failed and "post" not in failed
    assert "failed" in nodes[[n.get_attribute("data-node") for n in nodes].index(
        "policy")].get_attribute("class")

    browser.find_element(By.CSS_SELECTOR, 'g.node[data-node="policy"]').click()
    assert browser.find_element(By.ID, "node-title").text == "policy"
    inputs = browser.find_element(By.ID, "inputs").text
    assert "obs" in inputs and "[1, 4]" in inputs and "float32" in inputs
    assert "graph input" in inputs
    assert browser.find_element(By.ID, "verdict").text == "FAILED"
    table = browser.find_elements(By.CSS_SELECTOR, "#validation tr.row-fail")
    assert [(r.get_attribute("data-sample"), r.get_attribute("data-output")) for r in table] \
        == [("1", "action"), ("2", "action")]
    assert table[0].text.startswith("1 action 1 ")  # max abs error 1: the offset's step
    assert "atol 1.000e-5 + rtol 0.001" in table[0].text and table[0].text.endswith("FAIL")
    warnings = browser.find_element(By.ID, "warnings").text
    assert "inlined as a constant" in warnings
    assert "Model file" in browser.find_element(By.ID, "panel").text
    sha = browser.find_element(By.ID, "model-file").text
    assert data["nodes"]["policy"]["parameters"]["sha256sum"] in sha

    browser.find_element(By.ID, "open-ops").click()
    constants = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#constants tr.constant")]
    baked = [c for c in constants if "0.25, 0.25, 0.25, 0.25" in c]
    assert baked, constants  # the offset of the first trace, baked into the model
    ops = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#ops tr.op")]
    assert any(o.startswith("Add") for o in ops) and any(o.startswith("Tanh") for o in ops)
    shot = browser.get_screenshot_as_png()
    _non_blank(shot)
    out = os.environ.get("LEAPP_VIEW_SCREENSHOT")
    if out:  # docs/images/view.png is taken this way
        with open(out, "wb") as handle:
            handle.write(shot)

    # the other node's panel: a passing TorchScript node, its op graph from the file
    browser.find_element(By.CSS_SELECTOR, 'g.node[data-node="post"]').click()
    assert browser.find_element(By.ID, "verdict").text == "passed"
    assert "policy/action (data)" in browser.find_element(By.ID, "inputs").text
    browser.find_element(By.ID, "open-ops").click()
    assert "TorchScript" in browser.find_element(By.ID, "ops-format").text
    assert browser.find_elements(By.CSS_SELECTOR, "#ops tr.op")


def test_feedback_edges_are_drawn_apart(tmp_path, browser):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import feedback_example
        yaml_path = feedback_example.main(str(tmp_path))
    finally:
        sys.path.pop(0)
    if os.path.isdir(yaml_path):
        yaml_path = glob.glob(os.path.join(yaml_path, "*.yaml"))[0]
    page_path = os.path.join(str(tmp_path), "view.html")
    assert cli_main(["view", yaml_path, "-o", page_path]) == 0
    _open(browser, page_path)
    from selenium.webdriver.common.by import By
    ends = sorted((e.get_attribute("data-kind"), e.get_attribute("data-src"),
                   e.get_attribute("data-dst"))
                  for e in browser.find_elements(By.CSS_SELECTOR, "g.edge"))
    # written out from examples/feedback_example.py, not read back from the bundle
    assert ends == [
        ("feedback", "feedback_update/policy_memory_out", "feedback_update/policy_memory_prev"),
        ("feedback", "feedback_update/policy_memory_out", "policy_step/policy_memory_in"),
        ("forward", "policy_step/policy_context", "feedback_update/policy_context"),
        ("graph_input", "input:policy_step/observation_scalar",
         "policy_step/observation_scalar"),
        ("graph_output", "policy_step/control_action", "output:policy_step/control_action"),
    ]
    dashed = browser.find_elements(By.CSS_SELECTOR,
                                   'g.edge[data-kind="feedback"] polyline[stroke-dasharray]')
    assert dashed
    solid = browser.find_elements(By.CSS_SELECTOR,
                                  'g.edge[data-kind="forward"] polyline[stroke-dasharray]')
    assert not solid
    _non_blank(browser.get_screenshot_as_png())


def test_fifty_node_bundle_opens_and_stays_small(tmp_path, browser):
    leapp.start("fifty", save_path=str(tmp_path))
    x = annotate.input_tensors("n0", {"x": torch.randn(1, 8)})
    for i in range(50):
        if i:
            x = annotate.input_tensors(f"n{i}", {"x": x})
        x = annotate.output_tensors(f"n{i}", {"y": torch.tanh(x) * 0.5 + 0.1},
                                    export_with="jit")
    leapp.stop()
    assert all(leapp.compile_graph(verbose=False).values())
    page_path = os.path.join(str(tmp_path), "fifty", "fifty.html")
    size = os.path.getsize(page_path)
    assert size < 1_500_000, f"{size} bytes for 50 nodes"
    _self_contained(open(page_path, encoding="utf-8").read())
    from selenium.webdriver.common.by import By
    _open(browser, page_path)  # how long this takes: bench/view_load.py
    assert len(browser.find_elements(By.CSS_SELECTOR, "g.node")) == 50
    browser.find_element(By.CSS_SELECTOR, 'g.node[data-node="n49"]').click()
    browser.find_element(By.ID, "open-ops").click()
    assert browser.find_elements(By.CSS_SELECTOR, "#ops tr.op")


def test_view_without_a_log_and_cli_errors(tmp_path, capsys):
    leapp.start("plain", save_path=str(tmp_path))
    obs = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
    annotate.output_tensors("policy", {"action": obs * 3}, export_with="pt2")
    leapp.stop()
    leapp.compile_graph(visualize=False, verbose=False)
    bundle = os.path.join(str(tmp_path), "plain")
    assert not os.path.exists(os.path.join(bundle, "plain.html"))
    os.remove(os.path.join(bundle, "log.txt"))
    yaml_path = os.path.join(bundle, "plain.yaml")
    assert cli_main(["view", yaml_path]) == 0
    assert "plain.html" in capsys.readouterr().out
    data = _data(open(os.path.join(bundle, "plain.html"), encoding="utf-8").read())
    # the analytics are data of their own (plain_analytics.json), no log line needed
    assert data["has_log"] is False and data["has_analytics"] is True
    assert [(r["output"], r["sample"], r["passed"], r.get("max_abs"))
            for r in data["nodes"]["policy"]["validation"]] == [
        ("action", 0, True, 0.0), ("action [closed loop]", 0, True, None)]
    os.remove(os.path.join(bundle, "plain_analytics.json"))
    assert cli_main(["view", yaml_path]) == 0
    capsys.readouterr()
    data = _data(open(os.path.join(bundle, "plain.html"), encoding="utf-8").read())
    assert data["has_analytics"] is False and data["nodes"]["policy"]["validation"] == []
    assert "torch.export" in data["nodes"]["policy"]["ops"]["format"]
    assert cli_main(["view", yaml_path, "-o", os.path.join(bundle, "x.png")]) == 2
    assert "give a path ending in .html" in capsys.readouterr().err


def _scripts() -> list[tuple[str, list[str]]]:
    examples = [(f"example:{name}", [os.path.join(ROOT, "examples", f"{name}.py")])
                for name in ("getting_started", "complete_pipeline", "method_node",
                             "state_tensors", "module_buffers", "stateful_gru_export",
                             "feedback_example")]
    compat = [(f"compat:{os.path.basename(p)[:-3]}", [p]) for p in sorted(glob.glob(
        os.path.join(ROOT, "bench", "compat_pipelines", "*.py")))
        if not os.path.basename(p).startswith("_")]
    return examples + compat


@pytest.mark.parametrize("label,script", _scripts(), ids=[s[0] for s in _scripts()])
def test_every_example_and_compat_pipeline_gets_a_view(tmp_path, label, script):
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(script[0])]))
    proc = subprocess.run([PY, *script, out], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted(glob.glob(os.path.join(out, "**", "*.yaml"), recursive=True)) or sorted(
        glob.glob(os.path.join(str(tmp_path), "**", "*.yaml"), recursive=True))
    assert found, f"{label} wrote no bundle"
    for yaml_path in found:
        model = Pipeline.load(yaml_path)
        page_path = os.path.splitext(yaml_path)[0] + ".html"
        # compile_graph writes the view beside the PNG: a script that compiles with
        # visualize=False (the compat pipelines, stateful_gru_export) gets neither,
        # and only the CLI's view below
        png_path = os.path.splitext(yaml_path)[0] + ".png"
        assert os.path.exists(page_path) == os.path.exists(png_path), yaml_path
        assert cli_main(["view", yaml_path, "-o", str(tmp_path / "cli.html")]) == 0
        for path in [p for p in (page_path, str(tmp_path / "cli.html")) if os.path.exists(p)]:
            page = open(path, encoding="utf-8").read()
            _self_contained(page)
            data = _data(page)
            assert sorted(data["nodes"]) == sorted(model.nodes)
            for name in model.nodes:
                assert f'data-node="{name}"' in page
            for name, node in data["nodes"].items():
                if model.nodes[name].model_path:
                    assert node["ops"] and "error" not in node["ops"], (name, node["ops"])
                    assert node["ops"]["ops"]
