"""compile_graph()'s result in notebooks: still upstream's dict, displayed inline."""
from __future__ import annotations

import importlib.util
import json
import os
import pickle

import pytest
import torch

import leapp
from leapp import annotate
from leapp.compiling.result import CompileResult
from support import ROOT


def _compile(tmp_path, visualize=True):
    leapp.start("nb", save_path=str(tmp_path))
    x = annotate.input_tensors("enc", {"x": torch.ones(3)})
    z = annotate.output_tensors("enc", {"z": torch.tanh(x)}, export_with="jit")
    a = annotate.input_tensors("act", {"z": z})
    annotate.output_tensors("act", {"y": a * 2}, export_with="onnx")
    leapp.stop()
    return leapp.compile_graph(visualize=visualize)


def test_result_is_the_validation_dict(tmp_path):
    result = _compile(tmp_path)
    assert isinstance(result, dict) and isinstance(result, CompileResult)
    assert result == {"enc": True, "act": True}
    assert repr(result) == repr({"enc": True, "act": True})
    assert json.loads(json.dumps(result)) == {"enc": True, "act": True}
    assert pickle.loads(pickle.dumps(result)) == {"enc": True, "act": True}
    assert result.passed and result.graph == "nb"
    assert [row["node"] for row in result.nodes] == ["enc", "act"]
    assert [row["backend"] for row in result.nodes] == ["jit", "onnx"]
    assert [row["file"] for row in result.nodes] == ["enc.pt", "act.onnx"]
    assert all(row["seconds"] >= 0 for row in result.nodes)
    assert result._repr_png_().startswith(b"\x89PNG\r\n\x1a\n")
    page = result._repr_html_()
    # the interactive view (leapp.drawing.html) in an iframe, in place of the picture
    assert "<table" in page and '<iframe class="leapp-view" srcdoc=' in page
    assert "<td>enc</td><td>jit</td><td>enc.pt</td>" in page and ">passed</td>" in page


def test_result_without_picture(tmp_path):
    result = _compile(tmp_path, visualize=False)
    assert result._repr_png_() is None and "<img" not in result._repr_html_()
    assert "<table" in result._repr_html_()


def test_failed_validation_rows():
    result = CompileResult({"a": True, "b": False, "c": ValueError("boom")}, graph="g",
                           nodes=[{"node": "a", "validation": True},
                                  {"node": "b", "validation": False},
                                  {"node": "c", "validation": ValueError("boom")}])
    page = result._repr_html_()
    assert ">FAILED</td>" in page and "error: ValueError: boom" in page
    assert "validation failed" in page and not result.passed


NOTEBOOK_CELLS = [
    f"import sys\nsys.path.insert(0, {ROOT!r})\n"
    "import torch, leapp\nfrom leapp import annotate",
    "leapp.start('nb', save_path={save!r})\n"
    "x = annotate.input_tensors('enc', {{'x': torch.ones(3)}})\n"
    "z = annotate.output_tensors('enc', {{'z': torch.tanh(x)}}, export_with='jit')\n"
    "leapp.stop()\n"
    "leapp.compile_graph()",
]


def _execute(cells: list[str], tmp_path) -> list:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell.format(save=str(tmp_path)))
                      for cell in cells]
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     allow_errors=True, resources={"metadata": {
                                         "path": str(tmp_path)}})
    client.execute()
    return [cell.outputs for cell in notebook.cells]


def test_compile_result_displays_inline_in_a_notebook(tmp_path):
    outputs = _execute(NOTEBOOK_CELLS, tmp_path)
    shown = [o for o in outputs[1] if o.output_type == "execute_result"]
    assert len(shown) == 1, outputs[1]
    data = shown[0]["data"]
    assert "image/png" in data
    assert "<table" in data["text/html"] and "<td>enc</td><td>jit</td>" in data["text/html"]
    assert data["text/plain"] == "{'enc': True}"
    # the summary is not in the red stderr area; the progress line is printed
    streams = [o for o in outputs[1] if o.output_type == "stream"]
    assert not any(o.name == "stderr" and "export artifacts" in o.text for o in streams)
    printed = "".join(o.text for o in streams if o.name == "stdout")
    assert "1/1 enc (jit-script): exported in" in printed
    if importlib.util.find_spec("ipywidgets") is not None:  # the progress bar is a widget
        widgets = [o for o in outputs[1] if o.output_type == "display_data"
                   and "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert len(widgets) == 1, outputs[1]
        # its plain-text fallback tells where the compile ended, not where it began
        text = widgets[0]["data"]["text/plain"]
        assert "100%" in text and " 0%" not in text, text


def _error_text(outputs: list) -> str:
    errors = [o for o in outputs if o.output_type == "error"]
    assert len(errors) == 1, outputs
    return f"{errors[0].ename}: {errors[0].evalue}"


def test_notebook_reruns_say_to_call_start_again(tmp_path):
    failing = ("x = annotate.input_tensors('n', {{'x': torch.ones(2)}})\n"
               "raise ValueError('user code failed inside the node')")
    node = ("x = annotate.input_tensors('m', {{'x': torch.ones(2)}})\n"
            "y = annotate.output_tensors('m', {{'y': x + 1}})")
    cells = [NOTEBOOK_CELLS[0], "leapp.start('nb', save_path={save!r})",
             failing, failing,           # retried after the exception
             node, "# edited\n" + node,  # an edited cell run again
             node.replace("m'", "q'") + "\n@annotate.method(node_name='k')\n"
             "def step(x):\n    return x * 2\nstep(torch.ones(2))",
             "@annotate.method(node_name='k')\ndef step(x):\n    return x * 3\n"
             "step(torch.ones(2))"]  # a redefined method
    outputs = _execute(cells, tmp_path)
    assert "user code failed" in _error_text(outputs[2])
    retried = _error_text(outputs[3])
    assert retried.startswith("RuntimeError: Duplicate i/o name 'x' in node 'n'.")
    assert retried.rstrip().endswith("call leapp.start() again to reset the session and rerun.")
    assert not [o for o in outputs[4] if o.output_type == "error"]
    edited = _error_text(outputs[5])
    assert "node 'm' is being called from a different annotation origin" in edited
    assert "Give the node at this call site its own name." in edited
    assert edited.rstrip().endswith("Call leapp.start() again to reset the session and rerun.")
    assert not [o for o in outputs[6] if o.output_type == "error"]
    redefined = _error_text(outputs[7])
    assert "node 'k' is being called from a different annotation origin" in redefined
    assert "Call leapp.start() again" in redefined
