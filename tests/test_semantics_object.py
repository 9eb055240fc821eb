"""TensorSemantics, TemporalAxis, GraphConfigs and the kind enums behave as upstream
leapp 0.7.2's objects do (Isaac Lab uses them as objects, not only as annotation
payloads): plain assertions on our behaviour, then tests/semantics_probe.py run
under both implementations, result by result."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch
import yaml

import leapp
from leapp import (GraphConfigs, InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics,
                   annotate)
from leapp.semantics import yaml_fields

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402

PROBE = os.path.join(HERE, "semantics_probe.py")
UPSTREAM = compat.find_upstream_python()


def sem(**kw) -> TensorSemantics:
    kw.setdefault("name", "t")
    kw.setdefault("ref", torch.zeros(1, 2))
    return TensorSemantics(**kw)


# --- element_names normalised on the object -------------------------------------------

@pytest.mark.parametrize("given, stored", [
    (["a", "b"], [["a", "b"]]),
    ("a", [["a"]]),
    ([], [[]]),
    ([["a", "b"], ["x", "y", "z"]], [["a", "b"], ["x", "y", "z"]]),
    ([None, ["a", "b"]], [None, ["a", "b"]]),
    (["a", ["b", "c"]], ["a", ["b", "c"]]),
    ([TemporalAxis(20.0), ["a", "b"]], ["__temporal_axis__", ["a", "b"]]),
])
def test_element_names_normalised(given, stored):
    s = sem(element_names=given)
    assert s.element_names == stored
    assert all(item is None or isinstance(item, (str, list)) for item in s.element_names)


def test_element_names_for_1d_and_numpy_refs():
    assert sem(ref=torch.zeros(3), element_names=["a", "b", "c"]).element_names == [["a", "b", "c"]]
    assert sem(ref=np.zeros((1, 2)), element_names=["a", "b"]).element_names == [["a", "b"]]


@pytest.mark.parametrize("given", [None, ("a", "b"), [("a", "b"), None], [1, 2], [["a"], 3],
                                   {"a": 1}, 7])
def test_other_element_names_kept_as_given(given):
    s = sem(element_names=given)
    assert s.element_names == given and type(s.element_names) is type(given)
    assert s.temporal_period_ms is None


def test_caller_list_not_modified_and_inner_lists_copied():
    inner = ["x"]
    names = [None, inner]
    s = sem(element_names=names)
    assert names == [None, ["x"]] and s.element_names[1] is not inner


def test_temporal_period_ms():
    assert sem().temporal_period_ms is None
    s = sem(element_names=["a", TemporalAxis(5)])
    assert s.element_names == ["a", "__temporal_axis__"] and s.temporal_period_ms == 5
    with pytest.raises(TypeError):
        TensorSemantics(name="t", ref=torch.zeros(1), temporal_period_ms=3)
    assert [f.name for f in dataclasses.fields(TensorSemantics) if not f.init] == \
        ["temporal_period_ms"]


@pytest.mark.parametrize("given, error, start", [
    ("__temporal_axis__", ValueError, "'__temporal_axis__' is reserved for TemporalAxis"),
    (["__temporal_axis__", ["a"]], ValueError, "'__temporal_axis__' is reserved for TemporalAxis"),
    ([["__temporal_axis__"]], ValueError, "'__temporal_axis__' must be a bare axis item"),
    ([[TemporalAxis(1)]], ValueError, "TemporalAxis must be an axis item, not nested in a list"),
    ([TemporalAxis(1), TemporalAxis(2)], ValueError,
     "element_names can contain at most one TemporalAxis"),
])
def test_element_names_errors(given, error, start):
    with pytest.raises(error) as info:
        sem(element_names=given)
    assert str(info.value).startswith(start)


@pytest.mark.parametrize("ref", [None, [1.0], 3, "x", np.float32(1.0)])
def test_ref_must_be_a_tensor(ref):
    with pytest.raises(TypeError, match="^TensorSemantics 'ref' must be a traceable tensor type"):
        sem(ref=ref)
    with pytest.raises(TypeError):
        TensorSemantics()


def test_temporal_axis_period_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="^TemporalAxis period_ms must be positive"):
            TemporalAxis(bad)
    assert TemporalAxis(2) == TemporalAxis(2.0)


# --- to_dict / update --------------------------------------------------------------------

def test_to_dict():
    assert sem().to_dict() == {}
    full = sem(kind=OutputKindEnum.KD, element_names=[TemporalAxis(10), ["a", "b"]],
               extra={"z": 1, "kind": "custom"})
    assert list(full.to_dict().items()) == [
        ("kind", "custom"), ("element_names", ["__temporal_axis__", ["a", "b"]]),
        ("temporal_period_ms", 10), ("z", 1)]
    assert sem(kind=InputKindEnum.WRENCH).to_dict() == {"kind": InputKindEnum.WRENCH}
    assert sem().to_dict() is not sem().to_dict()


def test_update():
    s = sem(extra={"a": 1})
    assert s.update({"kind": InputKindEnum.JOINT_VELOCITY, "element_names": ["x", "y"],
                     "b": 2, "name": "n2", "temporal_period_ms": 5}) is None
    assert s.name == "t" and s.kind is InputKindEnum.JOINT_VELOCITY
    assert s.element_names == [["x", "y"]] and s.temporal_period_ms is None
    assert s.extra == {"a": 1, "b": 2, "name": "n2", "temporal_period_ms": 5}
    t = sem(element_names=[TemporalAxis(2), ["x"]])
    t.update({"kind": "k"})
    assert t.element_names == ["__temporal_axis__", ["x"]] and t.temporal_period_ms == 2
    t.update({"extra": {"c": 3}})
    assert t.extra == {"c": 3}
    with pytest.raises(ValueError, match="reserved for TemporalAxis"):
        sem().update({"element_names": "__temporal_axis__"})


# --- dataclass behaviour -------------------------------------------------------------------

def test_equality_repr_and_hash():
    ref = torch.zeros(2)
    a = TensorSemantics(name="a", ref=ref, kind=InputKindEnum.WRENCH, element_names=["x", "y"])
    assert a == TensorSemantics(name="a", ref=ref, kind=InputKindEnum.WRENCH,
                                element_names=[["x", "y"]])
    assert a != TensorSemantics(name="b", ref=ref)
    assert repr(a) == ("TensorSemantics(name='a', ref=tensor([0., 0.]), "
                       "kind=<InputKindEnum.WRENCH: 'state/wrench'>, element_names=[['x', 'y']], "
                       "temporal_period_ms=None, extra=None)")
    with pytest.raises(TypeError):
        hash(a)
    assert sorted(n for n in dir(TensorSemantics) if not n.startswith("_")) == [
        "element_names", "extra", "kind", "name", "ref", "temporal_period_ms", "to_dict",
        "update"]


def test_graph_configs():
    assert GraphConfigs().extra is None and GraphConfigs().to_dict() == {}
    assert GraphConfigs(10, {"robot": "g1", "frequency": 20}).to_dict() == \
        {"frequency": 20, "robot": "g1"}
    assert repr(GraphConfigs(frequency=5)) == "GraphConfigs(frequency=5, extra=None)"
    for bad in (0, -1):
        with pytest.raises(ValueError, match="^GraphConfigs frequency must be positive"):
            GraphConfigs(frequency=bad)
    assert sorted(n for n in dir(GraphConfigs) if not n.startswith("_")) == \
        ["extra", "frequency", "to_dict"]


# --- the kind enums are plain enums ------------------------------------------------------

@pytest.mark.parametrize("enum", [InputKindEnum, OutputKindEnum])
def test_kind_enums_are_not_strings(enum):
    for member in enum:
        assert member != member.value and not (member == member.value)
        assert not isinstance(member, str)
        assert member.value not in set(enum) and member.value not in list(enum)
        assert {member: 1}.get(member.value) is None and {member.value: 1}.get(member) is None
        assert {member: 1}[member] == 1 and hash(member) == hash(member.name)
        assert str(member) == format(member) == f"{member}" == f"{enum.__name__}.{member.name}"
        assert repr(member) == f"<{enum.__name__}.{member.name}: {member.value!r}>"
        assert enum(member.value) is member and enum[member.name] is member
    first = next(iter(enum))
    with pytest.raises(TypeError):
        json.dumps(first)
    with pytest.raises(TypeError):
        first < first  # noqa: B015
    with pytest.raises(AttributeError):
        first.upper()
    assert len(InputKindEnum) == 20 and len(OutputKindEnum) == 11
    assert InputKindEnum.JOINT_POSITION != OutputKindEnum.JOINT_POSITION


def test_yaml_fields_write_values():
    s = sem(kind=InputKindEnum.JOINT_POSITION, element_names=["a", "b"],
            extra={"k": OutputKindEnum.KP, "l": [1, [2]]})
    assert yaml_fields(s) == {"kind": "state/joint/position", "element_names": (("a", "b"),),
                              "k": "kp", "l": [1, [2]]}
    assert yaml_fields(s)["l"] is not s.extra["l"]
    assert yaml_fields(sem(kind=5))["kind"] == 5
    assert yaml_fields(sem()) is None
    # element names given as tuples are written as lists would be (upstream writes a
    # Python tag no safe loader reads)
    assert yaml_fields(sem(element_names=("a", "b")))["element_names"] == (("a", "b"),)
    assert yaml_fields(sem(element_names=[("a", "b"), None]))["element_names"] == \
        (("a", "b"), None)
    assert yaml_fields(sem(element_names=[1, 2]))["element_names"] == [1, 2]


def test_exported_yaml_forms(tmp_path):
    leapp.start("forms", save_path=str(tmp_path))
    a, b, c = annotate.input_tensors("n", [
        sem(name="tup", element_names=("a", "b"), kind=InputKindEnum.JOINT_POSITION),
        sem(name="ints", element_names=[1, 2], kind=5),
        sem(name="temporal", element_names=[TemporalAxis(20.0), ["a", "b"]]),
    ])
    annotate.output_tensors("n", {"out": a + b + c}, export_with="jit")
    leapp.stop()
    leapp.compile_graph(visualize=False)
    text = (tmp_path / "forms" / "forms.yaml").read_text()
    assert "kind: state/joint/position\n      element_names: [[a, b]]\n" in text
    assert "kind: 5\n      element_names:\n      - 1\n      - 2\n" in text
    assert "element_names: [__temporal_axis__, [a, b]]\n      temporal_period_ms: 20.0\n" in text
    assert yaml.safe_load(text)["models"]["n"]["inputs"][1]["kind"] == 5


# --- side by side with upstream ------------------------------------------------------------

def _probe(python: str, ours: bool) -> dict:
    result = subprocess.run([python, PROBE], capture_output=True, text=True, timeout=300,
                            env=compat.clean_env(ours), cwd=tempfile.gettempdir())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_probe_matches_upstream():
    ours, theirs = _probe(sys.executable, True), _probe(UPSTREAM, False)
    assert sorted(ours) == sorted(theirs)
    differences = []
    for key, expected in theirs.items():
        got = ours[key]
        if expected[0] == "err" and got[0] == "err":
            # same exception type; our message starts with upstream's (and may add to it)
            same = got[1] == expected[1] and got[2].startswith(expected[2][:150])
        else:
            same = got == expected
        if not same:
            differences.append(f"{key}: upstream {expected!r}, ours {got!r}")
    assert not differences, "\n".join(differences)
