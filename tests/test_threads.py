"""compile_graph() on one intra-op thread, and the process's count put back
(leapp/compiling/threads.py).

The export and writing phase runs with torch.set_num_threads(1); validation
too while the pipeline's weights are under SMALL_WEIGHTS_BYTES.  The real
torch.jit.freeze and torch.jit.load run throughout, wrapped only to note the
thread count they ran under.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import pytest
import torch

import leapp
from leapp import annotate
from leapp.compiling import threads as _threads


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process on two intra-op threads, so that one is observable; restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _noting(seen: list, real: Callable) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)
    return wrapper


def _trace(save_path: str) -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ELU(), torch.nn.Linear(16, 2))
    leapp.start("threads", save_path=save_path)
    with torch.no_grad():
        for i in range(2):
            x = annotate.input_tensors("policy", {"obs": torch.full((1, 4), float(i))})
            annotate.output_tensors("policy", {"action": mlp(x)}, export_with="jit")
    leapp.stop()


def test_export_and_validation_on_one_thread(tmp_path: Any, monkeypatch: Any,
                                             two_threads: None) -> None:
    frozen: list = []
    loaded: list = []
    monkeypatch.setattr(torch.jit, "freeze", _noting(frozen, torch.jit.freeze))
    monkeypatch.setattr(torch.jit, "load", _noting(loaded, torch.jit.load))
    _trace(str(tmp_path))
    result = leapp.compile_graph(visualize=False)
    assert dict(result) == {"policy": True}
    assert frozen == [1]
    assert loaded and set(loaded) == {1}
    assert torch.get_num_threads() == 2
    assert os.path.isfile(os.path.join(str(tmp_path), "threads", "policy.pt"))


def test_large_weights_validate_on_the_process_threads(tmp_path: Any, monkeypatch: Any,
                                                      two_threads: None) -> None:
    loaded: list = []
    monkeypatch.setattr(_threads, "SMALL_WEIGHTS_BYTES", 0)
    monkeypatch.setattr(torch.jit, "load", _noting(loaded, torch.jit.load))
    _trace(str(tmp_path))
    assert dict(leapp.compile_graph(visualize=False)) == {"policy": True}
    assert loaded and set(loaded) == {2}
    assert torch.get_num_threads() == 2


def test_thread_count_restored_after_a_failed_export(tmp_path: Any, monkeypatch: Any,
                                                     two_threads: None) -> None:
    def failing_freeze(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("freeze failed on purpose")

    monkeypatch.setattr(torch.jit, "freeze", failing_freeze)
    _trace(str(tmp_path))
    with pytest.raises(Exception, match="freeze failed on purpose"):
        leapp.compile_graph(visualize=False)
    assert torch.get_num_threads() == 2


def test_validation_threads_follow_the_files_size(tmp_path: Any, monkeypatch: Any) -> None:
    (tmp_path / "model.pt").write_bytes(b"x" * 1000)
    outside = tmp_path.parent / f"{tmp_path.name}-own.onnx"
    outside.write_bytes(b"y" * 500)
    try:
        assert _threads.files_bytes(str(tmp_path)) == 1000
        assert _threads.files_bytes(str(tmp_path), [str(outside)]) == 1500
        monkeypatch.setattr(_threads, "SMALL_WEIGHTS_BYTES", 1200)
        assert _threads.validation_threads(str(tmp_path)) == 1
        assert _threads.validation_threads(str(tmp_path), [str(outside)]) is None
    finally:
        outside.unlink()


def test_intra_op_threads_none_leaves_the_count(two_threads: None) -> None:
    with _threads.intra_op_threads(None):
        assert torch.get_num_threads() == 2
    with _threads.intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_opt_out_keeps_the_process_count(tmp_path: Any, monkeypatch: Any,
                                         two_threads: None) -> None:
    frozen: list = []
    monkeypatch.setenv("LEAPP_NO_SINGLE_THREAD", "1")
    monkeypatch.setattr(torch.jit, "freeze", _noting(frozen, torch.jit.freeze))
    _trace(str(tmp_path))
    assert dict(leapp.compile_graph(visualize=False)) == {"policy": True}
    assert frozen == [2]
    assert torch.get_num_threads() == 2
