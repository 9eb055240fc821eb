"""Validation of exported nodes: each failure mode and the analytics it logs.

Mismatching models are brought in as BYOM files (export_with=None with a
model_path), so the traced values stay honest while the "exported" side is
wrong in a controlled way.
"""
from __future__ import annotations

import logging

import pytest
import torch

import leapp
from leapp import annotate
from leapp.bundle import log as _logging
from leapp.compiling.validation import REENTRY_HINT, validate_models


X0 = torch.tensor([[-1.0, 0.5, 2.0], [3.0, -0.25, 1.5]])


class _Affine(torch.nn.Module):
    """What the traced node computes: x * 3 - 1 (optionally off by `offset`)."""

    def __init__(self, offset: float = 0.0) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, x):
        return x * 3.0 - 1.0 + self.offset


class _TwoOutputs(torch.nn.Module):
    def forward(self, x):
        y = x * 3.0 - 1.0
        return y, y


class _Poisoned(torch.nn.Module):
    """x * 3 - 1 with NaN at the first element and Inf at the last two."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("nan_mask", torch.tensor([[True, False, False], [False, False,
                                                                              False]]))
        self.register_buffer("inf_mask", torch.tensor([[False, False, False], [False, True,
                                                                               True]]))

    def forward(self, x):
        y = x * 3.0 - 1.0
        y = torch.where(self.nan_mask, torch.full_like(y, float("nan")), y)
        return torch.where(self.inf_mask, torch.full_like(y, float("inf")), y)


class _AsDouble(torch.nn.Module):
    def forward(self, x):
        return (x * 3.0 - 1.0).double()


class _Wide(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x * 3.0 - 1.0, x], dim=1)


def _save(tmp_path, module: torch.nn.Module, name: str) -> str:
    path = tmp_path / "models" / f"{name}.pt"
    path.parent.mkdir(exist_ok=True)
    torch.jit.script(module.eval()).save(str(path))
    return str(path)


def _affine_node(tmp_path, model_path: str | None, name: str = "own", graph: str = "val"):
    if not leapp._core.is_tracing():
        leapp.start(name=graph, save_path=str(tmp_path / "bundles"))
    x = annotate.input_tensors(name, {"x": X0.clone()})
    annotate.output_tensors(name, {"y": x * 3.0 - 1.0}, export_with=None,
                            backend_params={"model_path": model_path} if model_path else {})


def _compile(caplog, **kwargs):
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        return leapp.compile_graph(visualize=False, **kwargs)


def _messages(caplog, level=None) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "leapp" and (level is None or r.levelno == level)]


# ---------------------------------------------------------------------------
# passing nodes


def test_all_samples_pass_and_summary(tmp_path, caplog):
    leapp.start(name="ok", save_path=str(tmp_path), max_cached_io=3)
    for step in range(5):  # 1 traced + 2 cached examples (max_cached_io - 1)
        x = annotate.input_tensors("node", {"x": torch.randn(2, 3)})
        annotate.output_tensors("node", {"y": torch.relu(x) * 2.0}, export_with="onnx")
        x = annotate.input_tensors("skip", {"x": torch.randn(2, 3)})
        annotate.output_tensors("skip", {"y": x + 1.0})
    leapp.stop()
    result = _compile(caplog)
    assert result == {"node": True, "skip": True}
    messages = _messages(caplog)
    assert "Validating 2 models\n" in messages
    assert "Validating node..." in messages
    assert "  [PASS] node passed validation (3 examples)" in messages
    assert "Model skip does not have a compiled model. Skipping validation." in messages
    assert "Validation Summary\n" in messages
    assert "  Passed: 2/2" in messages
    assert not any(m.startswith("  Failed") or m.startswith("  Errors") for m in messages)


def test_single_example_wording(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Affine(), "affine"))
    leapp.stop()
    assert _compile(caplog) == {"own": True}
    assert "  [PASS] own passed validation (1 example)" in _messages(caplog)


def test_no_nodes(caplog):
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        assert validate_models([], rtol=1e-3, atol=1e-5, strict=True) == {}
    assert "No nodes to validate" in _messages(caplog, logging.ERROR)


# ---------------------------------------------------------------------------
# failure modes


def test_output_count_mismatch(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _TwoOutputs(), "two"))
    leapp.stop()
    assert _compile(caplog, strict=False) == {"own": False}
    assert "own sample 0: Output count mismatch - got 2, expected 1" in _messages(
        caplog, logging.ERROR)
    assert "  Failed: 1/1" in _messages(caplog, logging.WARNING)
    assert "  Passed: 0/1" in _messages(caplog)


def test_nan_and_inf_in_exported_output(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Poisoned(), "poisoned"))
    leapp.stop()
    with pytest.raises(Exception) as info:
        _compile(caplog)
    assert str(info.value) == "Model validation failed for 1 node(s): ['own']"
    errors = _messages(caplog, logging.ERROR)
    assert "own/y sample 0: NaN/Inf detected!" in errors
    assert "  Exported has 1/6 NaN values (16.667%)" in errors
    assert "  Exported has 2/6 Inf values (33.333%)" in errors
    assert not any("Source has" in m for m in _messages(caplog))
    assert not any("Mismatch detected" in m for m in errors)  # allclose is skipped
    # the raised error is written to log.txt at FATAL, never also to the console
    assert not any(r.levelno == _logging.FATAL for r in caplog.records)
    with open(_logging.log_path(), encoding="utf-8") as handle:
        assert "[FATAL]: Model validation failed for 1 node(s): ['own']" in handle.read()


def test_nan_already_in_source(tmp_path, caplog):
    """eager's own NaN, where the export has it too, is no failure (upstream 0.7.2 refuses
    any NaN or inf in an output)."""
    leapp.start(name="src", save_path=str(tmp_path))
    x = annotate.input_tensors("node", {"x": X0.clone()})
    annotate.output_tensors("node", {"y": torch.log(x)}, export_with="jit")  # log(<0) = NaN
    leapp.stop()
    assert _compile(caplog, strict=True) == {"node": True}
    assert "NaN/Inf detected" not in _messages(caplog, logging.ERROR)
    assert "node/y sample 0: NaN/Inf where the traced output has them, at the same " \
           "positions" in _messages(caplog, logging.INFO)


class _NanAt(torch.nn.Module):
    """x * 3 - 1 with a NaN (or, with sign, an infinity) at one position."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x):
        y = x * 3.0 - 1.0
        return torch.cat([y.flatten()[:1] * 0.0 + self.value, y.flatten()[1:]]).reshape(y.shape)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_where_eager_has_none(tmp_path, caplog, value):
    _affine_node(tmp_path, _save(tmp_path, _NanAt(value), "nan_at"))
    leapp.stop()
    assert _compile(caplog, strict=False) == {"own": False}
    assert "own/y sample 0: NaN/Inf detected!" in _messages(caplog, logging.ERROR)


def test_inf_of_the_other_sign_fails(tmp_path, caplog):
    """-inf where eager gives +inf is a failure, though both are infinite."""
    leapp.start(name="sign", save_path=str(tmp_path / "b"))
    x = annotate.input_tensors("own", {"x": X0.clone()})
    y = x * 3.0 - 1.0
    annotate.output_tensors("own", {"y": torch.cat([y.flatten()[:1] * 0.0 + float("inf"),
                                                    y.flatten()[1:]]).reshape(y.shape)},
                            export_with=None,
                            backend_params={"model_path": _save(tmp_path, _NanAt(-float("inf")),
                                                                "minus_inf")})
    leapp.stop()
    assert _compile(caplog, strict=False) == {"own": False}


def test_numeric_mismatch_analytics(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Affine(offset=0.01), "shifted"))
    leapp.stop()
    assert _compile(caplog, strict=False, rtol=1e-3, atol=1e-5) == {"own": False}
    log_file = _logging.log_path()
    assert log_file is not None and log_file.endswith("log.txt")
    errors = _messages(caplog, logging.ERROR)
    assert (f"own/y sample 0: Mismatch detected (rtol=0.001, atol=1e-05). Please check "
            f"{log_file} for more details.") in errors
    source = X0 * 3.0 - 1.0
    exported = source + 0.01
    diff = (exported - source).abs().flatten()
    info = _messages(caplog, logging.INFO)
    assert "  Source shape: torch.Size([2, 3]), dtype: torch.float32" in info
    assert "  Exported shape: torch.Size([2, 3]), dtype: torch.float32" in info
    assert f"  Source range:   [{source.min():.6e}, {source.max():.6e}]" in info
    assert f"  Exported range: [{exported.min():.6e}, {exported.max():.6e}]" in info
    assert f"  Diff stats: max={diff.max():.6e}, mean={diff.mean():.6e}" in info
    q = torch.quantile(diff, torch.tensor([0.5, 0.75, 0.9, 0.99, 0.995]))
    assert (f"  Diff percentiles: p50={q[0]:.6e}, p75={q[1]:.6e}, p90={q[2]:.6e}, "
            f"p99={q[3]:.6e}, p995={q[4]:.6e}") in info
    with open(log_file, encoding="utf-8") as handle:
        assert "Diff percentiles: p50=" in handle.read()


def test_looser_tolerance_passes(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Affine(offset=0.01), "shifted"))
    leapp.stop()
    assert _compile(caplog, atol=0.02) == {"own": True}


def test_constant_inlined_across_reentries(tmp_path, caplog):
    leapp.start(name="reentry", save_path=str(tmp_path), max_cached_io=3)
    for step in range(3):
        scale = torch.full((2, 3), float(step + 1))  # not declared: inlined as a constant
        x = annotate.input_tensors("node", {"x": torch.randn(2, 3)})
        annotate.output_tensors("node", {"y": x * scale}, export_with="jit")
    leapp.stop()
    with pytest.raises(Exception) as info:
        _compile(caplog)
    assert str(info.value) == ("Model validation failed for 1 node(s): ['node']\n\n"
                               f"node: {REENTRY_HINT}")
    errors = _messages(caplog, logging.ERROR)
    assert not any("sample 0" in m for m in errors)
    assert any(m.startswith("node/y sample 1: Mismatch detected") for m in errors)
    assert any(m.startswith("node/y sample 2: Mismatch detected") for m in errors)
    assert f"  node: {REENTRY_HINT}" in _messages(caplog, logging.WARNING)
    assert "inlined as a constant" in REENTRY_HINT
    assert "annotate.input_tensors()" in REENTRY_HINT


def test_constant_inlined_not_strict_returns_false(tmp_path, caplog):
    leapp.start(name="reentry", save_path=str(tmp_path), max_cached_io=2)
    for step in range(4):
        scale = torch.full((2, 3), float(step + 1))
        x = annotate.input_tensors("node", {"x": torch.randn(2, 3)})
        annotate.output_tensors("node", {"y": x * scale}, export_with="pt2")
    leapp.stop()
    assert _compile(caplog, strict=False) == {"node": False}
    errors = _messages(caplog, logging.ERROR)
    assert any(m.startswith("node/y sample 1: Mismatch detected") for m in errors)
    assert not any("sample 2" in m for m in errors)  # max_cached_io=2: one cached example


def test_exception_is_the_result(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _AsDouble(), "double"))
    _affine_node(tmp_path, _save(tmp_path, _Affine(), "affine"), name="fine")
    leapp.stop()
    result = _compile(caplog, strict=False)
    assert result["fine"] is True
    assert isinstance(result["own"], TypeError)
    assert "float64" in str(result["own"]) and "float32" in str(result["own"])
    errors = _messages(caplog, logging.ERROR)
    assert any(m.startswith("own: Validation failed with exception:") for m in errors)
    assert "  Errors: 1/2" in errors
    assert "  Passed: 1/2" in _messages(caplog)


def test_shape_mismatch(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Wide(), "wide"))
    leapp.stop()
    assert _compile(caplog, strict=False) == {"own": False}
    assert "own/y sample 0: Shape mismatch - got [2, 6], expected [2, 3]" in _messages(
        caplog, logging.ERROR)


def test_strict_lists_every_failed_node(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _Affine(offset=1.0), "a"), name="first")
    _affine_node(tmp_path, _save(tmp_path, _TwoOutputs(), "b"), name="second")
    _affine_node(tmp_path, _save(tmp_path, _Affine(), "c"), name="third")
    leapp.stop()
    with pytest.raises(Exception, match=r"^Model validation failed for 2 node\(s\): "
                                        r"\['first', 'second'\]$"):
        _compile(caplog)
    assert "  Passed: 1/3" in _messages(caplog)
    assert "  Failed: 2/3" in _messages(caplog, logging.WARNING)


def test_validate_false_skips(tmp_path, caplog):
    _affine_node(tmp_path, _save(tmp_path, _TwoOutputs(), "two"))
    leapp.stop()
    assert _compile(caplog, validate=False) is True
    assert "Validation Summary\n" not in _messages(caplog)


# ---------------------------------------------------------------------------
# validate_models on its own (the entries compile_graph hands it)


class _Port:
    def __init__(self, name, value, samples=()):
        self.name, self.value, self.samples = name, value, list(samples)


def test_common_sample_length_and_output_fallback_name(caplog):
    x = _Port("x", torch.ones(2), [torch.ones(2) * 2, torch.ones(2) * 3])
    y = _Port("y", torch.ones(2) * 2, [torch.ones(2) * 4])  # only one cached output
    calls = []

    def model(value):
        calls.append(value.clone())
        return [value * 2]

    with caplog.at_level(logging.DEBUG, logger="leapp"):
        result = validate_models([("n", model, [x], [y])], rtol=1e-3, atol=1e-5, strict=True)
    assert result == {"n": True}
    assert len(calls) == 2  # sample 0 and the one complete cached sample
    assert "  [PASS] n passed validation (2 examples)" in _messages(caplog)


def test_bool_and_integer_outputs_compare_exactly(caplog):
    flags = _Port("flags", torch.tensor([True, False]))
    counts = _Port("counts", torch.tensor([1, 2]))
    with caplog.at_level(logging.DEBUG, logger="leapp"):
        result = validate_models(
            [("n", lambda: (torch.tensor([True, True]), torch.tensor([1, 2])), [],
              [flags, counts])], rtol=1e-3, atol=1e-5, strict=False)
    assert result == {"n": False}
    assert any(m.startswith("n/flags sample 0: Mismatch detected")
               for m in _messages(caplog, logging.ERROR))
