"""A short fixed-seed run of the differential fuzzer (bench/fuzz.py) against upstream.

`make fuzz` is the long run.  Here a handful of generated programs run under
this package and under upstream leapp 0.7.2; any difference that is neither a
known difference being fixed (``fuzz.KNOWN_DIFFERENCES``) nor a documented
departure (``fuzz.DEPARTURES``, docs/compatibility.md) fails the test; each
listed difference's program is run again under both packages to show that it
still stands, as its entry (our side and upstream's) describes it.  The
comparison itself is checked without upstream; the run skips without an
upstream interpreter, as tests/test_compat.py does.

The writers mode (`make fuzz-writers`) runs a few programs through leapp's ONNX
writer and through torch's exporter (LEAPP_ONNX_WRITER=torch), both this package:
no difference outside ``fuzz.WRITER_DIFFERENCES`` and no fallback to torch's
exporter; its comparer is shown to flag a difference in fabricated results.
"""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import compat  # noqa: E402
import fuzz  # noqa: E402

UPSTREAM = compat.find_upstream_python()
OURS = compat.resolve_python(os.environ.get("LEAPP_OURS_PYTHON") or sys.executable)

# Chosen so the programs draw every call shape family, payload style and a mix of
# backends while the run stays near a minute on a 2-core machine.
SEED, N = 120, 8


def test_generation_is_deterministic_and_standalone():
    a, b = fuzz.generate(SEED, 5), fuzz.generate(SEED, 5)
    assert a["source"] == b["source"] and a["features"] == b["features"]
    assert fuzz.generate(SEED, 6)["source"] != a["source"]
    compile(a["source"], a["id"] + ".py", "exec")
    # no import of the repository: the catalogue is pasted, so a saved case runs as-is
    assert "op_catalogue" not in a["source"].split("# ---- end of the catalogue")[1]
    assert "sys.path" not in a["source"]
    pasted = a["source"].split("# ---- tests/op_catalogue.py, pasted")[1]
    assert "GROUPS" in pasted.split("# ---- end of the catalogue")[0]


def test_generator_covers_the_api():
    features = set()
    for i in range(60):
        features |= set(fuzz.generate(SEED, i)["features"])
    for shape in fuzz.CALL_SHAPES:
        assert "method:" + shape in features
    for payload in fuzz.PAYLOADS:
        assert "payload:" + payload in features
    for backend in fuzz.BACKENDS:
        assert "backend:" + backend in features
    assert {"state", "static_outputs", "source:forward", "source:feedback"} <= features
    for order in fuzz.STATE_ORDERS:
        assert "state_order:" + order in features
    for source in fuzz.STATE_SOURCES:
        assert "state_source:" + source in features


def test_state_orders_place_update_state():
    """Each order puts update_state where it says, relative to the node's annotations."""
    seen = set()
    for i in range(200):
        prog = fuzz.generate(1, i)
        body = prog["source"].split("def step(p, carry):")[1].split("def main(")[0]
        for order in fuzz.STATE_ORDERS:
            if "state_order:" + order not in prog["features"] or order in seen:
                continue
            if sum(f.startswith("state_order:") for f in prog["features"]) != 1:
                continue  # one stateful node, so its lines are the only ones of their kind
            lines = body.splitlines()
            state = next(k for k, ln in enumerate(lines) if "annotate.state_tensors(" in ln)
            node = lines[state].split("annotate.state_tensors(")[1].split(",")[0]
            output = next(k for k, ln in enumerate(lines)
                          if "annotate.output_tensors(%s" % node in ln)
            updates = [k for k, ln in enumerate(lines) if "annotate.update_state(" in ln]
            if order == "never":
                assert updates == [], body
            elif order == "before_output":
                assert len(updates) == 1 and state < updates[0] < output, body
            elif order == "after_output":
                assert len(updates) == 1 and updates[0] > output, body
            else:  # next_call: bound in the next pass, before the state is declared again
                assert len(updates) == 1 and updates[0] < state, body
                assert "'%s:h' in carry" % node.strip("'") in body, body
            seen.add(order)
    assert seen == set(fuzz.STATE_ORDERS)


def _rec(ok=True, exc=None, message="", compile_result=None):
    return {"ok": ok, "exc_type": exc, "message": message, "compile": compile_result,
            "yaml": None, "replay": None}


def test_comparer_finds_outcome_and_message_differences():
    prog = fuzz.generate(SEED, 0)
    diffs = fuzz.compare_program(prog, _rec(False, "TypeError", "bad call"), _rec())
    assert [d["check"] for d in diffs] == ["outcome"]
    assert diffs[0]["class"] == "outcome: ours TypeError, upstream ok"
    # ours keeps upstream's first line and adds guidance: no difference
    same = fuzz.compare_program(prog, _rec(False, "ValueError", "Node 'a' failed: fix it"),
                                _rec(False, "ValueError", "Node 'a' failed"))
    assert same == []
    other = fuzz.compare_program(prog, _rec(False, "ValueError", "something else"),
                                 _rec(False, "ValueError", "Node 'a' failed"))
    assert [d["check"] for d in other] == ["message"]


def test_unlisted_difference_is_unexplained():
    diff = {"check": "outcome", "class": "outcome: ours KeyError, upstream ok",
            "details": ["ours: 'zz'"], "features": []}
    assert fuzz.explain(diff) is None


def test_an_explanation_needs_our_side_to_match_too():
    """Upstream failing on x.mT explains our view error there, not any error of ours."""
    upstream = "upstream: 'method-wrapper' object has no attribute '__module__'"
    ours = ("ours: view size is not compatible with input tensor's size and stride (at "
            "least one dimension spans across two contiguous subspaces). Use .reshape(...) "
            "instead.")
    listed = {"check": "outcome", "class": "outcome: ours RuntimeError, upstream AttributeError",
              "details": [ours, upstream], "features": []}
    assert fuzz.explain(listed)["id"] == "tensor-mT-then-eager-error"
    other = dict(listed, details=["ours: Node 'n1' output 'y' was declared twice", upstream])
    assert fuzz.explain(other) is None
    # ours failing where the entry says ours compiles: not explained either
    property_entry = next(e for e in fuzz.DEPARTURES if e["id"] == "tensor-mT-property")
    failed = {"check": "outcome", "class": "outcome: ours KeyError, upstream AttributeError",
              "details": ["ours: 'zz'", upstream], "features": []}
    assert not fuzz.matches(property_entry, failed)
    assert fuzz.explain(failed) is None


@pytest.mark.parametrize("entry", fuzz.KNOWN_DIFFERENCES + fuzz.DEPARTURES,
                         ids=lambda e: e["id"])
def test_every_explanation_names_both_sides(entry):
    for side in ("ours", "upstream"):
        assert entry[side] and re.compile(entry[side])
    if entry["check"] == "outcome":
        assert re.fullmatch(r"ours \w+, upstream \w+", entry["outcome"])


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_every_listed_difference_still_stands(tmp_path):
    """Each departure's and known difference's program, run again under both packages,
    still differs, and in the way its own entry describes (both sides matched)."""
    entries = fuzz.KNOWN_DIFFERENCES + fuzz.DEPARTURES
    programs = [fuzz.case_program(entry["id"]) for entry in entries]
    report = fuzz.run_programs(programs, OURS, UPSTREAM, str(tmp_path), batch=len(programs),
                               timeout=600)
    summary = fuzz.summarise(report)
    assert report["tried"] == len(programs), summary
    for entry in entries:
        found = [d for d in report["differences"] if d["program"] == entry["program"]]
        assert [d["check"] for d in found] == [entry["check"]], (entry["id"], summary)
        assert fuzz.matches(entry, found[0]), (entry["id"], found[0]["class"],
                                               found[0]["details"])
        assert found[0]["explained"]["id"] == entry["id"]


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_short_fuzz_run_matches_upstream(tmp_path):
    report = fuzz.run(N, SEED, OURS, UPSTREAM, str(tmp_path), batch=N, timeout=600)
    summary = fuzz.summarise(report)
    assert report["tried"] == N, summary
    assert all(p["ours"] is not None and p["upstream"] is not None
               for p in report["programs"].values()), summary
    assert fuzz.unexplained(report) == [], "\n" + summary


def test_saved_case_runs_as_is(tmp_path):
    prog = fuzz.generate(SEED, 2)  # compiles under both packages
    path = tmp_path / (prog["id"] + ".py")
    path.write_text(prog["source"])
    env = compat.clean_env(ours=True)
    done = subprocess.run([OURS, str(path), str(tmp_path / "out")], capture_output=True,
                          text=True, cwd=str(tmp_path), env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / fuzz.GRAPH / (fuzz.GRAPH + ".yaml")).exists()


@pytest.mark.parametrize("entry", fuzz.KNOWN_DIFFERENCES + fuzz.FIXED + fuzz.DEPARTURES,
                         ids=lambda e: e["id"])
def test_every_difference_names_the_program_that_shows_it(entry):
    """Each known difference, fix and departure names its program, which regenerates."""
    assert entry["reason"]
    program = fuzz.case_program(entry["id"])
    assert program["id"] == entry["program"]
    compile(program["source"], entry["program"], "exec")


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_departure_cases_show_their_departure(tmp_path):
    """Each departure's program, run under both packages, differs exactly as its entry
    says (a generator change that alters a program shows here); for the late-state
    entries the pattern holds upstream's message and ours."""
    programs = [fuzz.case_program(entry["id"]) for entry in fuzz.DEPARTURES]
    report = fuzz.run_programs(programs, OURS, UPSTREAM, str(tmp_path), batch=len(programs),
                               timeout=600)
    summary = fuzz.summarise(report)
    assert report["tried"] == len(programs), summary
    assert fuzz.unexplained(report) == [], "\n" + summary
    shown = {(d["program"], d["explained"]["id"]) for d in report["differences"]}
    assert shown == {(e["program"], e["id"]) for e in fuzz.DEPARTURES}, "\n" + summary


@pytest.mark.skipif(UPSTREAM is None,
                    reason="no upstream leapp interpreter: run `make compat` (creates "
                           ".compat-venv) or set LEAPP_UPSTREAM_PYTHON")
def test_fixed_cases_match_upstream(tmp_path):
    """Every difference the fuzzer found and that was fixed stays fixed."""
    programs = [fuzz.case_program(entry["id"]) for entry in fuzz.FIXED]
    report = fuzz.run_programs(programs, OURS, UPSTREAM, str(tmp_path), batch=len(programs),
                               timeout=600)
    summary = fuzz.summarise(report)
    assert report["tried"] == len(programs), summary
    assert report["differences"] == [], "\n" + summary


# ---- writers mode: leapp's ONNX writer against torch's exporter ------------------
# Both sides are this package (no upstream needed): the writer's side as it is, the
# other with LEAPP_ONNX_WRITER=torch.  Programs drawn so that the run stays near a
# minute on a loaded 2-core machine (torch's exporter pays its cold start once); the
# short run adds these (recurrent cells, quaternion maths) to the programs of
# WRITER_DIFFERENCES (float16 chains, hypot, copysign, indexing, ...).
WRITERS_SEED = 1
WRITERS_PROGRAMS = ["w1_0007", "w1_0008"]


def test_writers_programs_export_every_node_with_an_onnx_backend():
    groups = set()
    for i in range(40):
        plain, onnx = fuzz.generate(WRITERS_SEED, i), fuzz.generate(WRITERS_SEED, i, writers=True)
        assert onnx["id"] == "w%d_%04d" % (WRITERS_SEED, i)
        assert fuzz.program_by_id(onnx["id"])["source"] == onnx["source"]
        backends = re.findall(r"export_with=('[\w-]+')", onnx["source"])
        assert backends and {b.strip("'") for b in backends} <= set(fuzz.WRITER_BACKENDS)
        # the same wiring, passes and annotations: only backends and op groups redrawn
        redrawn = ("backend:", "group:", "extra_outputs")
        assert ([f for f in plain["features"] if not f.startswith(redrawn)]
                == [f for f in onnx["features"] if not f.startswith(redrawn)])
        compile(onnx["source"], onnx["id"] + ".py", "exec")
        groups |= {f for f in onnx["features"] if f.startswith("group:")}
    # the writer's op groups beyond the catalogue are drawn too
    assert {"group:" + g for g in fuzz.catalogue(writers=True)[1]} <= groups


def _writer_side(tmp_path, side, replay, fallbacks=(), producer=None, yaml_text=None):
    """A fabricated worker record of one side of the writers mode: a bundle YAML and
    its replay (``replay``: {"step|output": tensor})."""
    from safetensors.torch import save_file
    bundle = tmp_path / side / "fz"
    bundle.mkdir(parents=True)
    (bundle / "fz.yaml").write_text(yaml_text or "models:\n  n0:\n    md5sum: %s\n"
                                    "pipeline:\n  nodes: [n0]\n" % ("a" * 32))
    save_file(replay, str(tmp_path / side / "replay.safetensors"))
    producer = producer or ("leapp" if side == "writer" else "pytorch")
    interface = {"opsets": [["", 18]], "inputs": [["a", 1, [2, 3, 4]]],
                 "outputs": [["main", 1, [2, 3, 4]]], "metadata_props": []}
    return {"ok": True, "exc_type": None, "message": "", "compile": {"n0": True},
            "yaml": str(bundle / "fz.yaml"),
            "replay": {"ok": True, "outputs": sorted({k.split("|")[1] for k in replay})},
            "onnx": {"n0.onnx": {"producer": producer, "interface": interface}},
            "fallbacks": [list(f) for f in fallbacks]}


def test_writers_comparer_flags_a_real_writer_difference(tmp_path):
    import torch
    prog = fuzz.generate(WRITERS_SEED, 0, writers=True)
    x = torch.linspace(-1, 1, 24).reshape(2, 3, 4)
    same = {"0|n0/main": x, "1|n0/main": x * 2}
    a = _writer_side(tmp_path / "same", "writer", same)
    b = _writer_side(tmp_path / "same", "torch", {k: v.clone() for k, v in same.items()})
    assert fuzz.compare_program(prog, a, b, mode="writers") == []
    # one step's output off by more than the tolerance (float16 rounding of 0.5)
    off = dict(same, **{"1|n0/main": x * 2 + 2e-4})
    a = _writer_side(tmp_path / "values", "writer", off)
    b = _writer_side(tmp_path / "values", "torch", same)
    diffs = fuzz.compare_program(prog, a, b, mode="writers")
    assert [d["class"] for d in diffs] == ["replay: output values differ"]
    assert "1|n0/main" in diffs[0]["details"][0]
    assert fuzz.explain(dict(diffs[0], features=prog["features"])) is None
    # within the tolerance: the same
    near = dict(same, **{"1|n0/main": x * 2 + 5e-7})
    a = _writer_side(tmp_path / "near", "writer", near)
    b = _writer_side(tmp_path / "near", "torch", same)
    assert fuzz.compare_program(prog, a, b, mode="writers") == []
    # a dtype the writer's side changed, a fallback, a YAML line and a producer
    a = _writer_side(tmp_path / "more", "writer", {k: v.double() for k, v in same.items()},
                     fallbacks=[("n0", "no ONNX rule for torch.cumprod")], producer="pytorch",
                     yaml_text="models:\n  n0:\n    md5sum: %s\n    backend: onnx\n"
                               "pipeline:\n  nodes: [n0]\n" % ("b" * 32))
    b = _writer_side(tmp_path / "more", "torch", same, producer="leapp")
    classes = [d["class"] for d in fuzz.compare_program(prog, a, b, mode="writers")]
    assert classes == ["yaml: text", "fallback: torch.cumprod",
                       "producer: torch file written by the writer under LEAPP_ONNX_WRITER=torch",
                       "replay: output dtype/shape differ"], classes


def test_writers_comparer_digests_alone_are_no_difference(tmp_path):
    import torch
    prog = fuzz.generate(WRITERS_SEED, 0, writers=True)
    same = {"0|n0/main": torch.ones(2)}
    a = _writer_side(tmp_path, "writer", same)
    b = _writer_side(tmp_path, "torch", same, yaml_text="models:\n  n0:\n    md5sum: %s\n"
                                                        "pipeline:\n  nodes: [n0]\n" % ("c" * 32))
    assert fuzz.compare_program(prog, a, b, mode="writers") == []


def test_every_writer_difference_is_explained_with_a_reason():
    for entry in fuzz.WRITER_DIFFERENCES:
        assert entry["reason"] and entry["check"]
        assert re.fullmatch(r"w\d+_\d+", entry["program"])
        assert fuzz.case_program(entry["id"])["id"] == entry["program"]


def test_short_writers_run_shows_no_unexplained_difference(tmp_path):
    """A few programs, every node written by leapp's writer on one side and by torch's
    exporter on the other: same outcome, YAML, interfaces and replayed outputs but for
    the explained differences, each of which its own program still shows, and no node
    fell back to torch's exporter on the writer's side."""
    programs = [fuzz.case_program(e["id"]) for e in fuzz.WRITER_DIFFERENCES]
    programs += [fuzz.program_by_id(pid) for pid in WRITERS_PROGRAMS]
    report = fuzz.run_programs(programs, OURS, None, str(tmp_path), batch=len(programs),
                               timeout=600, seed=WRITERS_SEED, mode="writers")
    summary = fuzz.summarise(report)
    assert report["tried"] == len(programs), summary
    found = report["programs"].values()
    assert all(report["programs"][pid]["writer"] == "ok" for pid in WRITERS_PROGRAMS), summary
    assert sum(p["onnx_files"] for p in found) >= len(programs), summary
    assert [f for p in found for f in p["fallbacks"]] == [], summary
    assert fuzz.unexplained(report) == [], "\n" + summary
    shown = {(d["program"], d["explained"]["id"]) for d in report["differences"]}
    assert shown == {(e["program"], e["id"]) for e in fuzz.WRITER_DIFFERENCES}, summary


def test_writer_explanations_are_narrow():
    """The float16 entry explains a small replay difference of a program with a float16
    chain, not a large one, nor one in a program without such a chain."""
    half = fuzz.case_program("float16-rounding-kept")
    diff = {"check": "replay", "class": "replay: output values differ",
            "details": ["1|n2/x0 torch.float32: max abs diff 0.0023756"],
            "sides": list(fuzz.SIDES["writers"]), "features": half["features"],
            "source": half["source"]}
    assert fuzz.explain(diff)["id"] == "float16-rounding-kept"
    large = dict(diff, details=diff["details"] + ["2|n1/main torch.float32: max abs diff 0.5"])
    assert fuzz.explain(large) is None
    plain = fuzz.program_by_id(WRITERS_PROGRAMS[1])
    assert "r['half_chain']" not in plain["source"] and "r['half_add']" not in plain["source"]
    assert fuzz.explain(dict(diff, features=plain["features"], source=plain["source"])) is None
    # an upstream-mode difference is never explained by a writer entry
    assert fuzz.explain(dict(diff, sides=list(fuzz.SIDES["upstream"]))) is None
