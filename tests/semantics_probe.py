"""Probe of TensorSemantics, TemporalAxis, GraphConfigs and the kind enums as Python
objects; prints one JSON object {probe: result}.

Run by tests/test_semantics_object.py under this package's interpreter and under
upstream leapp 0.7.2's, which must agree probe by probe.  A result is
["ok", value] or ["err", exception type, message]; values are encoded so that
list / tuple / enum member / tensor stay distinguishable.
"""
import copy
import dataclasses
import json
import pickle
import sys
import warnings

import numpy as np
import torch

from leapp import GraphConfigs, InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics

ENUMS = (InputKindEnum, OutputKindEnum)
RESULTS = {}


def enc(v):
    if isinstance(v, ENUMS):
        return {"enum": type(v).__name__, "name": v.name}
    if isinstance(v, TemporalAxis):
        return {"temporal_axis": v.period_ms}
    if isinstance(v, dict):
        return {"dict": [[enc(k), enc(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return {("list" if isinstance(v, list) else "tuple"): [enc(x) for x in v]}
    if isinstance(v, (torch.Tensor, np.ndarray)):
        return {type(v).__name__: list(v.shape)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"type": type(v).__name__}


def rec(key, fn):
    try:
        RESULTS[key] = ["ok", enc(fn())]
    except Exception as e:  # noqa: BLE001 - the exception is the result
        RESULTS[key] = ["err", type(e).__name__, str(e)[:200]]


def sem(**kw):
    kw.setdefault("name", "t")
    kw.setdefault("ref", torch.zeros(1, 2))
    return TensorSemantics(**kw)


def after(obj, attr, value, then):
    setattr(obj, attr, value)
    return then(obj)


def updated(s, values):
    returned = s.update(values)
    return [returned, s.name, s.kind, s.element_names, s.temporal_period_ms, s.extra, s.to_dict()]


ELEMENT_NAMES = {
    "flat": ["a", "b"], "str": "a", "tuple": ("a", "b"), "none": None, "empty": [],
    "multi": [["a", "b"], ["x", "y", "z"]], "none_axis": [None, ["a", "b"]],
    "str_and_list": ["a", ["b", "c"]], "tuple_inner": [("a", "b"), None],
    "inner_tuple_list": [["a", "b"], ("c",)],
    "temporal": [TemporalAxis(20.0), ["a", "b"]], "temporal_last": ["a", TemporalAxis(5)],
    "temporal_only": [TemporalAxis(1.5)], "two_temporal": [TemporalAxis(1), TemporalAxis(2)],
    "nested_temporal": [[TemporalAxis(1)]], "sentinel": "__temporal_axis__",
    "sentinel_item": ["__temporal_axis__", ["a"]], "sentinel_nested": [["__temporal_axis__"]],
    "ints": [1, 2], "mixed": [["a"], 3], "dict": {"a": 1}, "int": 7,
}


def probe_element_names():
    for k, v in ELEMENT_NAMES.items():
        rec(f"en.{k}", lambda v=v: sem(element_names=v).element_names)
        rec(f"en.{k}.period", lambda v=v: sem(element_names=v).temporal_period_ms)
        rec(f"en.{k}.to_dict", lambda v=v: sem(element_names=v).to_dict())
    rec("en.1d_ref", lambda: sem(ref=torch.zeros(3), element_names=["a", "b", "c"]).element_names)
    rec("en.3d_ref", lambda: sem(ref=torch.zeros(2, 3, 2),
                                 element_names=[None, ["x", "y", "z"], ["l", "r"]]).element_names)
    rec("en.numpy_ref", lambda: sem(ref=np.zeros((1, 2)), element_names=["a", "b"]).element_names)
    rec("en.is_list", lambda: [isinstance(sem(element_names=["a"]).element_names, list),
                               isinstance(sem(element_names=["a"]).element_names[0], list)])
    rec("en.caller_list_untouched", lambda: (lambda names: (sem(element_names=names), names)[1])(
        ["a", "b"]))
    rec("en.inner_list_copied", lambda: (lambda inner: sem(
        element_names=[None, inner]).element_names[1] is inner)(["a"]))
    rec("en.setattr_not_normalised", lambda: after(sem(), "element_names", ["q"],
                                                   lambda s: s.element_names))


def probe_fields():
    for k, v in {"none": None, "list": [1.0], "int": 3, "str": "x", "np": np.zeros(2),
                 "scalar": torch.tensor(1.0), "np_scalar": np.float32(1.0)}.items():
        rec(f"ref.{k}", lambda v=v: sem(ref=v).name)
    rec("ref.default", lambda: TensorSemantics().name)
    rec("ref.name_only", lambda: TensorSemantics(name="x").name)
    rec("ref.positional", lambda: TensorSemantics("x", torch.zeros(2)).name)
    rec("ref.positional_all", lambda: TensorSemantics("x", torch.zeros(2), "k", ["a", "b"],
                                                      {"u": 1}).to_dict())
    rec("ref.temporal_kw", lambda: TensorSemantics(name="t", ref=torch.zeros(1),
                                                   temporal_period_ms=3))
    rec("name.none", lambda: sem(name=None).name)
    rec("name.int", lambda: sem(name=3).name)
    for k, v in {"enum": InputKindEnum.JOINT_POSITION, "out": OutputKindEnum.KP, "str": "custom",
                 "int": 5}.items():
        rec(f"kind.{k}", lambda v=v: sem(kind=v).kind)
        rec(f"kind.{k}.to_dict", lambda v=v: sem(kind=v).to_dict())
    rec("extra.dict", lambda: sem(extra={"unit": "rad", "k": InputKindEnum.WRENCH}).to_dict())
    rec("extra.list", lambda: sem(extra=[1]).extra)
    rec("extra.pairs", lambda: sem(extra=[("a", 1)]).to_dict())
    rec("extra.empty", lambda: sem(extra={}).to_dict())
    rec("extra.shadow", lambda: sem(kind="a", extra={"kind": "b"}).to_dict())
    rec("extra.aliased", lambda: (lambda e: sem(extra=e).extra is e)({"a": 1}))
    rec("temporal.set", lambda: after(sem(), "temporal_period_ms", 4, lambda s: s.to_dict()))
    rec("to_dict.full", lambda: sem(kind=OutputKindEnum.KD,
                                    element_names=[TemporalAxis(10), ["a", "b"]],
                                    extra={"z": 1, "a": 2}).to_dict())
    rec("to_dict.empty", lambda: sem().to_dict())
    rec("to_dict.fresh", lambda: (lambda s: s.to_dict() is not s.to_dict())(sem()))
    rec("to_dict.shares_names", lambda: (lambda s: s.to_dict()["element_names"] is
                                         s.element_names)(sem(element_names=["a"])))


def probe_update():
    rec("update.kind", lambda: updated(sem(), {"kind": InputKindEnum.JOINT_VELOCITY}))
    rec("update.en", lambda: updated(sem(), {"element_names": ["x", "y"]}))
    rec("update.en_temporal", lambda: updated(sem(), {"element_names": [TemporalAxis(2), ["x"]]}))
    rec("update.after_temporal", lambda: updated(sem(element_names=[TemporalAxis(2), ["x"]]),
                                                 {"kind": "k"}))
    rec("update.temporal_replaced", lambda: updated(sem(element_names=[TemporalAxis(2), ["x"]]),
                                                    {"element_names": ["y"]}))
    rec("update.unknown", lambda: updated(sem(), {"unit": "m", "scale": 2}))
    rec("update.unknown_merges", lambda: updated(sem(extra={"a": 1}), {"b": 2}))
    rec("update.extra_replaces", lambda: updated(sem(extra={"a": 1}), {"extra": {"b": 2}}))
    rec("update.name", lambda: updated(sem(), {"name": "n2"}))
    rec("update.ref", lambda: updated(sem(), {"ref": torch.zeros(3)}))
    rec("update.period", lambda: updated(sem(), {"temporal_period_ms": 5}))
    rec("update.bad_en", lambda: updated(sem(), {"element_names": "__temporal_axis__"}))
    rec("update.empty", lambda: updated(sem(kind="a"), {}))
    rec("update.none_kind", lambda: updated(sem(kind="a"), {"kind": None}))
    rec("update.bad_ref", lambda: updated(after(sem(), "ref", None, lambda s: s), {}))
    rec("update.pairs", lambda: updated(sem(), [("kind", "k")]))


def probe_dataclass():
    r = torch.zeros(1, 2)
    rec("dc.fields", lambda: [f.name for f in dataclasses.fields(TensorSemantics)])
    rec("dc.init_fields", lambda: [f.name for f in dataclasses.fields(TensorSemantics) if f.init])
    rec("dc.is_dataclass", lambda: dataclasses.is_dataclass(TensorSemantics))
    rec("dc.eq_normalised", lambda: TensorSemantics(name="a", ref=r, element_names=["x", "y"]) ==
        TensorSemantics(name="a", ref=r, element_names=[["x", "y"]]))
    rec("dc.ne_name", lambda: TensorSemantics(name="a", ref=r) == TensorSemantics(name="b", ref=r))
    rec("dc.eq_other", lambda: TensorSemantics(name="a", ref=r) == "a")
    rec("dc.eq_diff_ref", lambda: TensorSemantics(name="a", ref=torch.zeros(1, 2)) ==
        TensorSemantics(name="a", ref=torch.zeros(1, 2)))
    rec("dc.hash", lambda: hash(TensorSemantics(name="a", ref=r)))
    rec("dc.repr", lambda: repr(TensorSemantics(name="a", ref=torch.zeros(2),
                                                kind=InputKindEnum.WRENCH,
                                                element_names=["x", "y"])))
    rec("dc.repr_temporal", lambda: repr(TensorSemantics(name="a", ref=torch.zeros(2), kind="k",
                                                         element_names=[TemporalAxis(4), None],
                                                         extra={"u": 1})))
    rec("dc.replace", lambda: dataclasses.replace(sem(element_names=["a", "b"]),
                                                  name=None).to_dict())
    rec("dc.replace_temporal", lambda: dataclasses.replace(
        sem(element_names=[TemporalAxis(1), ["a"]]), name=None).to_dict())
    rec("dc.asdict_keys", lambda: list(dataclasses.asdict(sem()).keys()))
    rec("dc.deepcopy", lambda: copy.deepcopy(sem(element_names=["a"], extra={"u": 1})).to_dict())
    rec("dc.copy", lambda: copy.copy(sem(element_names=["a"])).element_names)
    rec("dc.pickle", lambda: pickle.loads(pickle.dumps(
        sem(element_names=[TemporalAxis(3), ["a"]], kind=InputKindEnum.WRENCH))).to_dict())
    rec("dc.internal", lambda: sorted(TensorSemantics._INTERNAL_FIELDS))
    rec("dc.public", lambda: sorted(n for n in dir(TensorSemantics) if not n.startswith("_")))
    rec("dc.set_other_attr", lambda: after(sem(), "foo", 1, lambda s: s.foo))


def probe_temporal_axis():
    rec("ta.zero", lambda: TemporalAxis(0))
    rec("ta.neg", lambda: TemporalAxis(-1.0))
    rec("ta.str", lambda: TemporalAxis("a"))
    rec("ta.ok", lambda: TemporalAxis(2.5))
    rec("ta.kw", lambda: TemporalAxis(period_ms=2))
    rec("ta.repr", lambda: repr(TemporalAxis(2.5)))
    rec("ta.eq", lambda: [TemporalAxis(2) == TemporalAxis(2.0),
                          hash(TemporalAxis(2)) == hash(TemporalAxis(2.0))])
    rec("ta.frozen", lambda: setattr(TemporalAxis(2), "period_ms", 3))
    rec("ta.fields", lambda: [f.name for f in dataclasses.fields(TemporalAxis)])


def probe_graph_configs():
    for k, kw in {"empty": {}, "freq": {"frequency": 50}, "freq_f": {"frequency": 50.5},
                  "zero": {"frequency": 0}, "neg": {"frequency": -1}, "str": {"frequency": "a"},
                  "extra": {"frequency": 10, "extra": {"robot": "g1", "frequency": 20}},
                  "extra_only": {"extra": {"a": 1}}, "extra_empty": {"extra": {}},
                  "extra_enum": {"extra": {"k": InputKindEnum.WRENCH}}}.items():
        rec(f"gc.{k}", lambda kw=kw: GraphConfigs(**kw).to_dict())
        rec(f"gc.{k}.attrs", lambda kw=kw: (lambda g: [g.frequency, g.extra])(GraphConfigs(**kw)))
    rec("gc.positional", lambda: GraphConfigs(30, {"a": 1}).to_dict())
    rec("gc.repr", lambda: repr(GraphConfigs(frequency=5)))
    rec("gc.eq", lambda: GraphConfigs(frequency=5) == GraphConfigs(frequency=5.0))
    rec("gc.hash", lambda: hash(GraphConfigs(frequency=5)))
    rec("gc.fields", lambda: [f.name for f in dataclasses.fields(GraphConfigs)])
    rec("gc.public", lambda: sorted(n for n in dir(GraphConfigs) if not n.startswith("_")))
    rec("gc.set_bad", lambda: after(GraphConfigs(), "frequency", -1, lambda g: g.to_dict()))


def probe_enums():
    for E in ENUMS:
        n = E.__name__
        m = next(iter(E))
        rec(f"{n}.members", lambda E=E: [[x.name, x.value] for x in E])
        rec(f"{n}.mro", lambda E=E: [b.__name__ for b in E.__mro__])
        rec(f"{n}.eq_value", lambda E=E: [x == x.value for x in E])
        rec(f"{n}.ne_value", lambda E=E: [x != x.value for x in E])
        rec(f"{n}.value_eq", lambda E=E: [x.value == x for x in E])
        rec(f"{n}.eq_self", lambda E=E: [x == E(x.value) for x in E])
        rec(f"{n}.isinstance_str", lambda m=m: isinstance(m, str))
        rec(f"{n}.hash_value", lambda E=E: [hash(x) == hash(x.value) for x in E])
        rec(f"{n}.hash_name", lambda E=E: [hash(x) == hash(x.name) for x in E])
        rec(f"{n}.in_values", lambda E=E: [x in [y.value for y in E] for x in E])
        rec(f"{n}.value_in_set", lambda E=E: [x.value in set(E) for x in E])
        rec(f"{n}.value_in_list", lambda E=E: [x.value in list(E) for x in E])
        rec(f"{n}.member_in_set", lambda E=E: [x in set(E) for x in E])
        rec(f"{n}.dict_key_by_value", lambda E=E: [{x: 1}.get(x.value) for x in E])
        rec(f"{n}.value_key_by_member", lambda E=E: [{x.value: 1}.get(x) for x in E])
        rec(f"{n}.dict_key_by_member", lambda E=E: [{x: 1}.get(x) for x in E])
        rec(f"{n}.str", lambda E=E: [str(x) for x in E])
        rec(f"{n}.repr", lambda E=E: [repr(x) for x in E])
        rec(f"{n}.format", lambda E=E: [format(x) for x in E])
        rec(f"{n}.fstring", lambda E=E: [f"{x}|{x!s}|{x!r}|{x.value}|{x.name}" for x in E])
        rec(f"{n}.format_spec", lambda m=m: format(m, "30"))
        rec(f"{n}.percent", lambda m=m: "%s %r" % (m, m))
        rec(f"{n}.by_value", lambda E=E: [E(x.value) is x for x in E])
        rec(f"{n}.by_name", lambda E=E: [E[x.name] is x for x in E])
        rec(f"{n}.by_member", lambda m=m: type(m)(m) is m)
        rec(f"{n}.bad_value", lambda E=E: E("nope"))
        rec(f"{n}.bad_name", lambda E=E: E["nope"])
        rec(f"{n}.len", lambda E=E: len(E))
        rec(f"{n}.contains_member", lambda E=E, m=m: m in E)
        rec(f"{n}.contains_value", lambda E=E, m=m: m.value in E)
        rec(f"{n}.lt", lambda m=m: m < m)
        rec(f"{n}.str_method", lambda m=m: m.upper())
        rec(f"{n}.add", lambda m=m: m + "x")
        rec(f"{n}.json", lambda m=m: json.dumps(m))
        rec(f"{n}.json_value", lambda m=m: json.dumps(m.value))
        rec(f"{n}.pickle", lambda m=m: pickle.loads(pickle.dumps(m)) is m)
        rec(f"{n}.deepcopy", lambda m=m: copy.deepcopy(m) is m)
        rec(f"{n}.bool", lambda m=m: bool(m))
        rec(f"{n}.public", lambda E=E: sorted(x for x in dir(E) if not x.startswith("_")))
        rec(f"{n}.member_public", lambda m=m: sorted(x for x in dir(m) if not x.startswith("_")))
        rec(f"{n}.setattr", lambda m=m: setattr(m, "value", "x"))
    rec("cross.eq", lambda: InputKindEnum.JOINT_POSITION == OutputKindEnum.JOINT_POSITION)
    rec("cross.same_value", lambda: [InputKindEnum.JOINT_EFFORT == OutputKindEnum.JOINT_EFFORT,
                                     InputKindEnum.JOINT_EFFORT.value ==
                                     OutputKindEnum.JOINT_EFFORT.value])
    rec("paths", lambda: [__import__("leapp.utils.enums", fromlist=["x"]).InputKindEnum
                          is InputKindEnum,
                          __import__("leapp.utils.tensor_description",
                                     fromlist=["x"]).TensorSemantics is TensorSemantics])


def main():
    warnings.simplefilter("ignore")
    probe_element_names()
    probe_fields()
    probe_update()
    probe_dataclass()
    probe_temporal_axis()
    probe_graph_configs()
    probe_enums()
    json.dump(RESULTS, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
