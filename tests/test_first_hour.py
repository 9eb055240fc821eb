"""The messages and documents a new user meets in the first hour: each rough edge found by
trying the README, the docs, the command line and the notebook as a newcomer would."""
from __future__ import annotations

import ast
import json
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import leapp
from leapp import annotate
from support import ROOT

PY = sys.executable


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


def test_no_cuda_warning_where_cuda_cannot_exist(tmp_path, caplog):
    import onnxruntime as ort
    if torch.cuda.is_available() or "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a GPU or onnxruntime's CUDA provider is present: the warning may apply")
    leapp.start("g", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
    annotate.output_tensors("policy", {"a": x * 2}, export_with="onnx")
    leapp.stop()
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        leapp.compile_graph(verbose=False)
        leapp.InferenceManager(os.path.join(str(tmp_path), "g", "g.yaml"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("CUDA" in w for w in warnings), warnings
    assert any("onnxruntime runs on the CPU" in r.getMessage() for r in caplog.records)


def test_cuda_fallback_warning_once_where_a_gpu_was_asked_for():
    # a process where torch sees a GPU but onnxruntime has no CUDA provider: upstream's
    # words, once, however many ONNX models are loaded
    code = (
        "import logging, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "from leapp.models import onnx_runner\n"
        "records = []\n"
        "class H(logging.Handler):\n"
        "    def emit(self, r): records.append((r.levelname, r.getMessage()))\n"
        "logging.getLogger('leapp').addHandler(H())\n"
        "logging.getLogger('leapp').setLevel(logging.DEBUG)\n"
        "for _ in range(3): onnx_runner._cpu_fallback()\n"
        "print([r for r in records if r[0] == 'WARNING'])\n")
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip() == \
        "[('WARNING', 'CUDA execution provider not available. Falling back to CPU.')]"


def test_unknown_backend_names_the_node_and_suggests(tmp_path):
    leapp.start("g", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
    with pytest.raises(ValueError) as info:
        annotate.output_tensors("policy", {"a": x * 2}, export_with="torchscript")
    leapp.stop()
    text = str(info.value)
    assert text.startswith("node 'policy': unknown backend 'torchscript'; did you mean 'jit'?")
    assert "\n" not in text
    assert "Unexpected backend: torchscript" in text  # upstream's words follow


def test_unknown_backend_keeps_upstreams_words(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import compat
    finally:
        sys.path.pop(0)
    upstream = compat.find_upstream_python()
    if upstream is None:
        pytest.skip("upstream leapp 0.7.2 venv not found (make upstream-venv)")
    code = ("import torch, leapp, tempfile\nfrom leapp import annotate\n"
            "leapp.start('g', save_path=tempfile.mkdtemp())\n"
            "x = annotate.input_tensors('policy', {'obs': torch.randn(1, 3)})\n"
            "try:\n    annotate.output_tensors('policy', {'a': x}, export_with='torchscript')\n"
            "except Exception as exc:\n    print(repr(str(exc)))\n")
    out = subprocess.run([upstream, "-c", code], cwd=str(tmp_path), capture_output=True,
                         text=True, timeout=300, env=compat.clean_env()).stdout
    assert "Unexpected backend: torchscript" in out


def _read_only_dir(tmp_path) -> str:
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        return str(locked)
    return "/sys/leapp-read-only"  # root writes anywhere but here


def test_start_into_a_read_only_directory_says_where_and_what_to_do(tmp_path):
    where = _read_only_dir(tmp_path)
    with pytest.raises(PermissionError) as info:
        leapp.start("g", save_path=where)
    text = str(info.value)
    assert os.path.join(where, "g") in text and "save_path" in text


def test_the_notebook_ends_its_compile_cell_with_the_result():
    notebook = json.loads(_read("examples", "getting_started.ipynb"))
    cells = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    compile_cell = next(c for c in cells if "compile_graph" in c)
    last = ast.parse(compile_cell).body[-1]
    assert isinstance(last, ast.Expr) and "compile_graph" in ast.unparse(last)
    assert "print(validated)" not in compile_cell


def test_cli_doc_sample_shows_this_version_and_the_pinned_torch():
    line = re.search(r"bundle my_pipeline: 2 node\(s\), leapp (\S+), torch (\S+)",
                     _read("docs", "cli.md"))
    assert line
    assert line.group(1).rstrip(",") == leapp.__version__
    pinned = re.search(r"^torch==(\S+)", _read("constraints.txt"), re.M).group(1)
    assert line.group(2).split("+")[0] == pinned


def test_triton_names_an_ensemble_with_its_article(tmp_path, capsys):
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from leapp.cli import main
    leapp.start("g", save_path=str(tmp_path))
    x = annotate.input_tensors("policy", {"obs": torch.randn(1, 3)})
    annotate.output_tensors("policy", {"a": x * 2}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(verbose=False, visualize=False)
    assert main(["triton", os.path.join(str(tmp_path), "g", "g.yaml"),
                 str(tmp_path / "repo"), "--no-batch"]) == 0
    out = capsys.readouterr().out
    assert ", an ensemble" in out and "a ensemble" not in out
    assert main(["triton", os.path.join(str(tmp_path), "g", "g.yaml"),
                 str(tmp_path / "batched")]) == 0
    assert ", a batched model, up to 128 robots per execution" in capsys.readouterr().out


def test_running_a_bundle_prints_what_it_was_given():
    section = _read("docs", "api.md").split("## Running a bundle", 1)[1]
    block = section.split("```python", 1)[1].split("```", 1)[0]
    assert "get_mock_input()" not in block.split("print(")[0].split("run_policy(")[1]
    assert "torch.ones(1, 3)" in block.split("run_policy(")[1]
    assert "tensor([[2., 2., 2.]])" in block


def test_quickstart_file_table_lists_every_file_of_the_bundle():
    text = _read("docs", "quickstart.md")
    for name in ("my_pipeline.yaml", "preprocess.pt", "predict.onnx", "my_pipeline.png",
                 "my_pipeline.html", "log.txt", ".leapp_cache.json"):
        assert f"`{name}`" in text, name


def test_fragments_say_so_where_a_reader_sees_it():
    for path in ["README.md"] + [os.path.join("docs", f) for f in os.listdir(
            os.path.join(ROOT, "docs")) if f.endswith(".md")]:
        lines = _read(path).splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "<!-- fragment -->":
                assert lines[i + 1].startswith("```")
                assert lines[i + 2].startswith("# excerpt"), (path, i + 1)


def test_readme_says_how_long_and_keeps_maintainer_targets_apart():
    text = _read("README.md")
    user, _, maintainers = text.partition("## For maintainers")
    assert "about 3 minutes" in user and "7 to 15 minutes" in user
    for target in ("make test-asan", "make compat", "make debug", "make wheel"):
        assert target not in user, target
        assert target in maintainers, target
    assert "[triton]" in maintainers and "leapp triton" in maintainers
