"""A short fixed-seed run of the differential fuzzer (bench/fuzz.py) against upstream.

`make fuzz` is the long run.  Here a handful of generated programs run under
this package and under upstream leapp 0.7.2; any difference that is neither a
known difference being fixed (``fuzz.KNOWN_DIFFERENCES``) nor a documented
departure (``fuzz.DEPARTURES``, docs/compatibility.md) fails the test.  The
comparison itself is checked without upstream; the run skips without an
upstream interpreter, as tests/test_compat.py does.
"""

import os
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
