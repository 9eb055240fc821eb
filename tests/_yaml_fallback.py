"""PyYAML stand-in for leapp._core.emit_yaml while the C emitter is a placeholder.

Used by the backend and validation tests only when the real emitter raises
NotImplementedError; it writes the same documents (tuples in flow style).
"""
from __future__ import annotations

import pytest
import yaml

import leapp.lifecycle as lifecycle


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    tuple, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def pyyaml_emit(documents: list) -> str:
    return "\n".join(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
                     for doc in documents)


class _CoreProxy:
    def __init__(self, core: object) -> None:
        self._core = core

    def __getattr__(self, name: str) -> object:
        return getattr(self._core, name)

    def emit_yaml(self, documents: list) -> str:
        return pyyaml_emit(documents)


def _emitter_missing() -> bool:
    try:
        lifecycle._core.emit_yaml([{"a": 1}])
    except NotImplementedError:
        return True
    except Exception:
        return False
    return False


@pytest.fixture(autouse=True)
def yaml_emitter(monkeypatch):
    """Patch lifecycle._core with a PyYAML emitter only if the C one is missing."""
    if _emitter_missing():
        monkeypatch.setattr(lifecycle, "_core", _CoreProxy(lifecycle._core))
    yield
