"""When torch's exporter fails: one clear error, the backends that work (issue 33).

Real exports throughout: torch's TorchScript and dynamo ONNX exporters,
torch.jit, torch.export, onnxruntime.
"""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn as nn

import leapp
from leapp import annotate
from leapp.compiling.export_errors import ExportError, one_line
from test_export_catalogue import assert_quiet


class VisionPolicy(nn.Module):
    """The issue's policy: a depth-image CNN with AdaptiveAvgPool2d((2, 2)) on an 11 x 11
    map, GELU, BatchNorm2d, MultiheadAttention, LayerNorm and SiLU."""

    def __init__(self) -> None:
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.BatchNorm2d(8), nn.GELU(),
                                 nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten())
        self.proj = nn.Linear(32 + 12, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 6))

    def forward(self, depth: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        z = torch.cat([self.cnn(depth), proprio], -1)
        t = self.proj(z).unsqueeze(1)
        a, _ = self.attn(t, t, t)
        return self.head(self.norm(a + t).squeeze(1))


def trace_policy(save_path: str, backend: str) -> int:
    """Three steps of the policy; the line its inputs are declared on."""
    torch.manual_seed(0)
    policy = VisionPolicy().eval()
    leapp.start("vision", save_path=save_path)
    line = 0
    with torch.no_grad():
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            depth, proprio = torch.randn(2, 1, 24, 24, generator=g), torch.randn(2, 12, generator=g)
            line = _line_after()
            depth, proprio = annotate.input_tensors("policy", {"depth": depth, "proprio": proprio})
            annotate.output_tensors("policy", {"actions": policy(depth, proprio)},
                                    export_with=backend)
    leapp.stop()
    return line


def _line_after() -> int:
    import sys
    return sys._getframe(1).f_lineno + 1


def test_the_issues_policy_names_the_op_and_the_backends_that_work(tmp_path, capfd):
    line = trace_policy(str(tmp_path), "onnx-torchscript")
    with pytest.raises(ExportError) as caught:
        leapp.compile_graph(visualize=False)
    error = caught.value
    message = str(error)
    assert message.startswith("node 'policy' cannot be exported with backend "
                              "'onnx-torchscript': op `adaptive_avg_pool2d` "
                              "(torch.nn.functional.adaptive_avg_pool2d)")
    assert f"{os.path.basename(__file__)}:{line}" in message  # the user's file and line
    assert "torch says: SymbolicValueError: Unsupported: ONNX export of operator " \
           "adaptive_avg_pool2d" in message
    assert "Fix: choose an output size that divides the input size" in message
    assert "Or: export_with='onnx', 'jit', 'jit-trace' or 'pt2' export this node" in message
    assert len(message.splitlines()) == 4
    assert {a.export_with: a.ok for a in error.others} == {
        "onnx": True, "jit": True, "jit-trace": True, "pt2": True}
    assert_quiet(capfd)
    bundle = os.path.join(tmp_path, "vision")
    assert sorted(os.listdir(bundle)) == ["log.txt"]  # nothing of the survey in the bundle
    with open(os.path.join(bundle, "log.txt"), encoding="utf-8") as handle:
        log = handle.read()
    assert "Torch IR graph at exception" in log  # torch's dump, kept for the curious
    assert "policy with exported-program: exports and validates" in log


def test_an_export_that_works_says_nothing_of_torch_on_the_console(tmp_path, capfd):
    trace_policy(str(tmp_path), "onnx")
    assert leapp.compile_graph(visualize=False) == {"policy": True}
    assert_quiet(capfd)


def trace_random_pose(save_path: str) -> None:
    """A node that no backend exports: an inverse the ONNX exporters refuse, and a
    random draw no export reproduces."""
    leapp.start("noisy", save_path=save_path)
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        m = annotate.input_tensors("noisy", {"m": torch.randn(3, 3, generator=g) + 4 * torch.eye(3)})
        noisy = torch.linalg.inv(m) + 0.1 * torch.randn_like(m)
        annotate.output_tensors("noisy", {"inverse": noisy}, export_with="onnx-torchscript")
    leapp.stop()


def test_a_node_no_backend_exports_gives_each_backends_reason(tmp_path, capfd):
    trace_random_pose(str(tmp_path))
    with pytest.raises(ExportError) as caught:
        leapp.compile_graph(visualize=False)
    lines = str(caught.value).splitlines()
    start = lines.index("  No backend exports this node:")
    reasons = lines[start + 1:]
    assert [r.split(":", 1)[0].strip() for r in reasons] == [
        "onnx-torchscript", "onnx", "jit", "jit-trace", "pt2"]
    assert reasons[0].startswith("    onnx-torchscript: op `linalg_inv`: "
                                 "UnsupportedOperatorError: Exporting the operator "
                                 "'aten::linalg_inv' to ONNX")
    assert reasons[1].startswith("    onnx: op `linalg_inv_ex`: DispatchError: No ONNX function")
    assert "op `linalg_inv` (torch.linalg.inv)" in lines[0]
    for reason in reasons[2:]:
        assert reason.endswith("the node draws random numbers (torch.randn_like), which no "
                               "export reproduces"), reason
        assert "exports, but output 0 differs from the traced one" in reason
    assert "Fix:" not in "\n".join(lines)  # no backend to advise
    assert_quiet(capfd)


def test_check_backends_surveys_every_node_before_a_compile(tmp_path, capfd):
    trace_random_pose(str(tmp_path))
    report = leapp.check_backends()
    assert list(report) == ["noisy"]
    attempts = report["noisy"]
    assert [a.export_with for a in attempts.values()] == [
        "onnx", "jit", "jit-trace", "pt2", "onnx-torchscript"]
    assert not any(a.ok for a in attempts.values())
    assert attempts["onnx-torchscript"].op == "linalg_inv"
    assert_quiet(capfd)
    with open(os.path.join(tmp_path, "noisy", "log.txt"), encoding="utf-8") as handle:
        log = handle.read()
    assert "[PROGRESS]: noisy: no backend exports it" in log
    assert "[PROGRESS]:     onnx-torchscript: op `linalg_inv`: UnsupportedOperatorError" in log
    assert sorted(os.listdir(os.path.join(tmp_path, "noisy"))) == ["log.txt"]


def test_the_survey_is_bounded(tmp_path):
    trace_random_pose(str(tmp_path))
    attempts = leapp.check_backends(budget=0)["noisy"]
    assert all(a.ok is None for a in attempts.values())
    assert all(a.reason.startswith("not tried: the survey's 0 s were up") for a in
               attempts.values())


def test_check_backends_needs_a_finished_trace(tmp_path):
    leapp.start("t", save_path=str(tmp_path))
    x = annotate.input_tensors("n", {"x": torch.ones(2)})
    annotate.output_tensors("n", {"y": x + 1}, export_with="jit")
    with pytest.raises(RuntimeError, match=r"call leapp\.stop\(\) first"):
        leapp.check_backends()
    leapp.stop()
    with pytest.raises(ValueError, match=r"no traced node named \['m'\]; the trace has \['n'\]"):
        leapp.check_backends(nodes=["m"])
    assert leapp.check_backends(nodes=["n"])["n"]["jit"].ok is True


def test_one_line_keeps_torchs_cause_and_drops_the_rest():
    dynamo = RuntimeError(
        "Failed to convert the exported program to an ONNX model. \x1b[96mThis is step 3/3"
        "\x1b[0m of exporting the model to ONNX. Next steps:\n- If there is a missing ONNX "
        "function, implement it.\n\n## Exception summary\n\n<class 'torch.onnx._internal."
        "exporter._errors.DispatchError'>: No ONNX function found for <OpOverload(op='aten."
        "linalg_inv_ex', overload='default')>.\n⬆️\n<class 'x.ConversionError'>: Error when "
        "translating node %linalg_inv_ex")
    assert one_line(dynamo) == ("DispatchError: No ONNX function found for <OpOverload("
                                "op='aten.linalg_inv_ex', overload='default')>.")
    long = ValueError("x" * 1000)
    assert len(one_line(long)) <= len("ValueError: ") + 300 and one_line(long).endswith("...")
    assert re.fullmatch(r"KeyError: 'k'", one_line(KeyError("k")))


def test_a_known_cause_deep_in_torchs_chain_gives_its_fix():
    from leapp.compiling.export_errors import describe
    try:
        try:
            raise RuntimeError("Inference tensors cannot be saved for backward. To work "
                               "around you can make a clone to get a normal tensor")
        except RuntimeError as inner:
            raise ValueError("Failed to export the model") from inner
    except ValueError as outer:
        error = describe("policy", "exported-program", outer)
    assert error.reason == "ValueError: Failed to export the model"
    assert error.fix.startswith("create the model's tensors outside torch.inference_mode()")
    assert str(error).splitlines()[2].startswith("  Fix: create the model's tensors")
