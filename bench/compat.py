"""Drop-in check: export the same pipelines with our leapp and upstream's,
compare the bundles, and run each bundle with the other side's
InferenceManager.

    python bench/compat.py --setup            # make .compat-venv if missing, run
    python bench/compat.py --upstream /path/to/venv-or-python [--ours PYTHON]
    python bench/compat.py --only gru_module,declared_state --keep /tmp/compat

For every script in bench/compat_pipelines/ (each takes an output directory
and writes OUT/<name>/<name>.yaml), under both interpreters:

1. YAML, parsed with PyYAML, key by key: the three documents in order
   (models, pipeline, system information); in ``models`` the same nodes in
   the same order, the same keys in the same order in every node, tensor
   entry and ``parameters``, equal values except ``md5sum``/``sha256sum``
   (only their presence and form are checked); ``pipeline`` equal (data_flow,
   feedback_flow, inputs, outputs, initial_values, configs); ``system
   information`` the same keys, values ignored except ``leapp config
   version``.  Also the set of files in the bundle (log, PNG and our
   incremental-compile manifest aside).  Text
   identity after masking hashes and system information is reported as
   information only.
   Our interactive view (<graph>.html) is set aside with the PNG, and so are
   our validation analytics (<graph>_analytics.json): what the compile found,
   not part of the format.
2. The initial-values safetensors: same keys, equal tensors (dtype, shape,
   values).
3. Inference: fixed inputs (seeded, from the YAML's graph inputs) for 5
   steps; each bundle runs under both InferenceManagers; every run must give
   the same outputs (same keys, torch.allclose rtol=atol=1e-5) as upstream's
   bundle under upstream's InferenceManager.

Exit status 0 when every pipeline is identical, 1 on any difference, 2 when
the check itself could not run.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PIPELINE_DIR = os.path.join(HERE, "compat_pipelines")
COMPAT_VENV = os.path.join(ROOT, ".compat-venv")
STEPS = 5
TOL = 1e-5
HASH_KEYS = {"md5sum": 32, "sha256sum": 64}
SYSINFO_CHECKED = ("leapp config version",)
DOC_KEYS = ["models", "pipeline", "system information"]


def pipelines():
    """Names of the compat pipelines (script stems), sorted."""
    return sorted(f[:-3] for f in os.listdir(PIPELINE_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


PIPELINES = pipelines()


# --------------------------------------------------------------------------
# Interpreters

def resolve_python(path):
    if path and os.path.isdir(path):
        for cand in ("bin/python", "bin/python3", "Scripts/python.exe"):
            exe = os.path.join(path, cand)
            if os.path.exists(exe):
                return exe
        return None
    return path if path and os.path.exists(path) else None


def find_upstream_python():
    """LEAPP_UPSTREAM_PYTHON (venv or interpreter), else .compat-venv."""
    env = os.environ.get("LEAPP_UPSTREAM_PYTHON")
    if env:
        return resolve_python(env)
    return resolve_python(COMPAT_VENV)


def setup_venv(base_python=sys.executable):
    """Create .compat-venv with upstream leapp 0.7.2 (CPU torch pinned)."""
    py = resolve_python(COMPAT_VENV)
    if py:
        return py
    print("[compat] creating %s (torch==2.13.0, leapp==0.7.2)" % COMPAT_VENV,
          flush=True)
    subprocess.run([base_python, "-m", "venv", COMPAT_VENV], check=True)
    py = resolve_python(COMPAT_VENV)
    # Always with the constraints file: a bare "torch" would pull CUDA builds.
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-c", os.path.join(ROOT, "constraints.txt"),
                    "torch==2.13.0", "leapp==0.7.2"], check=True)
    return py


def clean_env(ours=False):
    """The environment of a child interpreter.

    Upstream's side imports its installed leapp; ours imports this checkout's
    (an editable install may point at another checkout, e.g. from a git
    worktree), so the package under test is the one beside this script."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if ours:
        env["PYTHONPATH"] = ROOT
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def describe(python, ours=False):
    code = ("import json, os, leapp, torch; from importlib import metadata\n"
            "try: v = metadata.version('leapp')\n"
            "except Exception: v = getattr(leapp, '__version__', '?')\n"
            "print(json.dumps({'leapp': v, 'path': os.path.dirname(leapp.__file__),"
            " 'torch': torch.__version__}))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             env=clean_env(ours), cwd=tempfile.gettempdir(), timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc)}


# --------------------------------------------------------------------------
# Export

def export_both(name, sides, workdir, timeout=900):
    """Run pipeline `name` under every side at once.

    Returns {side: (yaml_path or None, seconds, error text)}."""
    script = os.path.join(PIPELINE_DIR, name + ".py")
    procs = {}
    for side, python in sides.items():
        out = os.path.join(workdir, side)
        os.makedirs(out, exist_ok=True)
        log = open(os.path.join(workdir, "%s.%s.log" % (name, side)), "w")
        procs[side] = (subprocess.Popen([python, script, out], stdout=log,
                                        stderr=subprocess.STDOUT, cwd=out,
                                        env=clean_env(side == "ours")),
                       log, time.perf_counter(), out)
    results = {}
    for side, (proc, log, t0, out) in procs.items():
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        log.close()
        secs = time.perf_counter() - t0
        yaml_path = os.path.join(out, name, name + ".yaml")
        if rc != 0 or not os.path.exists(yaml_path):
            with open(log.name) as f:
                tail = "\n".join(f.read().strip().splitlines()[-12:])
            results[side] = (None, secs, "exit %s\n%s" % (rc, tail))
        else:
            results[side] = (yaml_path, secs, "")
    return results


# --------------------------------------------------------------------------
# YAML comparison

def load_docs(path):
    import yaml
    with open(path) as f:
        return list(yaml.safe_load_all(f))


def _is_hash(value, length):
    return value is None or (isinstance(value, str)
                             and re.fullmatch("[0-9a-f]{%d}" % length, value))


def compare_values(a, b, path, diffs, ordered=True):
    """Deep comparison; dict key order matters when `ordered`."""
    if isinstance(a, dict) and isinstance(b, dict):
        ka, kb = list(a), list(b)
        if ordered and ka != kb or not ordered and set(ka) != set(kb):
            diffs.append("%s: keys differ: ours %s, upstream %s" % (path, ka, kb))
        for k in ka:
            if k not in b:
                continue
            sub = "%s/%s" % (path, k)
            if k in HASH_KEYS and path.endswith("/parameters"):
                if not (_is_hash(a[k], HASH_KEYS[k]) and _is_hash(b[k], HASH_KEYS[k])
                        and (a[k] is None) == (b[k] is None)):
                    diffs.append("%s: bad or mismatched digest: ours %r, upstream %r"
                                 % (sub, a[k], b[k]))
                continue
            compare_values(a[k], b[k], sub, diffs, ordered)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            diffs.append("%s: %d entries in ours, %d in upstream: ours %r, upstream %r"
                         % (path, len(a), len(b), a, b))
            return
        for i, (x, y) in enumerate(zip(a, b)):
            label = x.get("name", i) if isinstance(x, dict) else i
            compare_values(x, y, "%s[%s]" % (path, label), diffs, ordered)
    elif type(a) is not type(b) or a != b:
        diffs.append("%s: ours %r, upstream %r" % (path, a, b))


def compare_yaml(ours_path, up_path):
    """List of differences between two bundle YAMLs (empty: identical)."""
    diffs = []
    a, b = load_docs(ours_path), load_docs(up_path)
    # Upstream concatenates three dumps without "---": one YAML document
    # whose top-level keys are, in order, DOC_KEYS.  Ours must have the same
    # document structure (a reader may use yaml.safe_load, not _load_all).
    ka = [list(d) if isinstance(d, dict) else d for d in a]
    kb = [list(d) if isinstance(d, dict) else d for d in b]
    if [k for d in kb for k in d] != DOC_KEYS:
        diffs.append("upstream YAML top-level keys are %r, expected %r" % (kb, DOC_KEYS))
    if ka != kb:
        diffs.append("YAML documents/top-level keys: ours %r, upstream %r" % (ka, kb))
        return diffs
    merged_a = {k: v for d in a for k, v in d.items()}
    merged_b = {k: v for d in b for k, v in d.items()}
    compare_values(merged_a.get("models"), merged_b.get("models"), "models", diffs)
    compare_values(merged_a.get("pipeline"), merged_b.get("pipeline"), "pipeline",
                   diffs)
    sa = merged_a.get("system information") or {}
    sb = merged_b.get("system information") or {}
    if set(sa) != set(sb):
        diffs.append("system information: keys differ: ours %s, upstream %s"
                     % (sorted(sa), sorted(sb)))
    for k in SYSINFO_CHECKED:
        if sa.get(k) != sb.get(k):
            diffs.append("system information/%s: ours %r, upstream %r"
                         % (k, sa.get(k), sb.get(k)))
    return diffs


def masked_text(path):
    """YAML text with digests and the system-information values masked."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"(md5sum|sha256sum): [0-9a-f]+", r"\1: <digest>", text)
    head, sep, tail = text.partition("system information:")
    tail = re.sub(r"(?m)^(  [^:\n]+):.*$", r"\1: <value>", tail)
    return head + sep + tail


def text_diff_lines(ours_path, up_path):
    import difflib
    a = masked_text(ours_path).splitlines()
    b = masked_text(up_path).splitlines()
    return [line for line in difflib.unified_diff(b, a, "upstream", "ours", lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


# Our bundles also hold the content keys of incremental compiles (a hidden
# file no reader of the format needs): not a difference of the format.
INCREMENTAL_MANIFEST = ".leapp_cache.json"


def bundle_files(yaml_path):
    d = os.path.dirname(yaml_path)
    return sorted(f for f in os.listdir(d)
                  if not f.startswith("log") and not f.endswith((".png", ".html"))
                  and f != INCREMENTAL_MANIFEST and not f.endswith("_analytics.json"))


# --------------------------------------------------------------------------
# Initial values

def initial_values_path(yaml_path):
    docs = load_docs(yaml_path)
    pipe = next((d["pipeline"] for d in docs if isinstance(d, dict) and "pipeline" in d), {})
    name = (pipe or {}).get("initial_values")
    return os.path.join(os.path.dirname(yaml_path), name) if name else None


def compare_initial_values(ours_yaml, up_yaml):
    """(diffs, note)."""
    import torch
    from safetensors.torch import load_file
    pa, pb = initial_values_path(ours_yaml), initial_values_path(up_yaml)
    if pa is None and pb is None:
        return [], "none (no feedback)"
    diffs = []
    for side, p in (("ours", pa), ("upstream", pb)):
        if p is None or not os.path.exists(p):
            diffs.append("%s: initial values file missing (%s)" % (side, p))
    if diffs:
        return diffs, ""
    a, b = load_file(pa), load_file(pb)
    if sorted(a) != sorted(b):
        diffs.append("initial values keys: ours %s, upstream %s" % (sorted(a), sorted(b)))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            diffs.append("initial value %s: ours %s%s, upstream %s%s"
                         % (k, x.dtype, list(x.shape), y.dtype, list(y.shape)))
        elif not torch.equal(x, y):
            diffs.append("initial value %s: values differ (max abs diff %g)"
                         % (k, (x.double() - y.double()).abs().max().item()))
    return diffs, "%d tensors" % len(b)


# --------------------------------------------------------------------------
# Inference, crossed

def make_inputs(yaml_path, path, steps=STEPS, seed=1234):
    """Seeded inputs for every graph input of the bundle, for `steps` steps."""
    import torch
    from safetensors.torch import save_file
    docs = load_docs(yaml_path)
    merged = {k: v for d in docs for k, v in d.items()}
    models, pipe = merged["models"], merged["pipeline"]
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for step in range(steps):
        for node, names in sorted((pipe.get("inputs") or {}).items()):
            entries = {e["name"]: e for e in models[node]["inputs"]}
            for name in names:
                e = entries[name]
                shape = e["shape"] if isinstance(e["shape"], list) else json.loads(e["shape"])
                dtype = getattr(torch, e["dtype"])
                if dtype.is_floating_point:
                    t = torch.randn(shape, generator=gen).to(dtype)
                elif dtype == torch.bool:
                    t = torch.randint(0, 2, shape, generator=gen).bool()
                else:
                    t = torch.randint(0, 100, shape, generator=gen).to(dtype)
                tensors["%d|%s/%s" % (step, node, name)] = t
    save_file(tensors, path)


def run_inference(python, bundles, inputs_path, out_path, timeout=600, ours=False):
    """Run compat_im.py; returns ({label: info}, error text)."""
    cmd = [python, os.path.join(HERE, "compat_im.py"), inputs_path, out_path]
    cmd += ["%s=%s" % (label, y) for label, y in bundles.items()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(ours),
                              cwd=os.path.dirname(out_path), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, "timed out"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), ""
            except ValueError:
                break
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
    return {}, "exit %d\n%s" % (proc.returncode, tail)


def compare_inference(runs, tensors, reference):
    """runs: {label: info}; tensors: {"label|step|key": tensor}."""
    import torch
    diffs = []
    ref = runs.get(reference)
    if not ref or not ref.get("ok"):
        return ["reference run %s failed:\n%s" % (reference, (ref or {}).get("error"))]
    ref_t = {k.split("|", 1)[1]: v for k, v in tensors.items()
             if k.startswith(reference + "|")}
    for label, info in runs.items():
        if label == reference:
            continue
        if not info.get("ok"):
            diffs.append("%s failed:\n      %s" % (label, info.get("error", "").strip()
                                                   .replace("\n", "\n      ")))
            continue
        if info.get("outputs") != ref.get("outputs"):
            diffs.append("%s: output keys %s, reference %s"
                         % (label, info.get("outputs"), ref.get("outputs")))
        got = {k.split("|", 1)[1]: v for k, v in tensors.items()
               if k.startswith(label + "|")}
        if set(got) != set(ref_t):
            diffs.append("%s: outputs %s, reference %s" % (label, sorted(got), sorted(ref_t)))
        for k in sorted(set(got) & set(ref_t)):
            x, y = got[k], ref_t[k]
            if x.dtype != y.dtype or x.shape != y.shape:
                diffs.append("%s step %s: %s%s vs reference %s%s"
                             % (label, k, x.dtype, list(x.shape), y.dtype, list(y.shape)))
            elif not torch.allclose(x, y, rtol=TOL, atol=TOL, equal_nan=True):
                diffs.append("%s step %s: max abs diff %g"
                             % (label, k, (x.double() - y.double()).abs().max().item()))
    return diffs


# --------------------------------------------------------------------------
# One pipeline, end to end

class Report:
    def __init__(self, name):
        self.name = name
        self.lines = []     # (check, status, details)
        self.failed = False

    def add(self, check, diffs, ok_text, note=""):
        if diffs:
            self.failed = True
            self.lines.append((check, "DIFFERENT", diffs))
        else:
            self.lines.append((check, ok_text + (" (%s)" % note if note else ""), []))

    @property
    def ok(self):
        return not self.failed

    def text(self):
        out = ["[%s] %s" % (self.name, "identical" if self.ok else "DIFFERENT")]
        for check, status, details in self.lines:
            out.append("  %-16s %s" % (check, status))
            for d in details[:40]:
                out.append("      - " + str(d).replace("\n", "\n        "))
            if len(details) > 40:
                out.append("      ... %d more" % (len(details) - 40))
        return "\n".join(out)


def check_pipeline(name, ours, upstream, workdir):
    """Export `name` with both interpreters and compare; returns a Report."""
    from safetensors.torch import load_file
    rep = Report(name)
    work = os.path.join(workdir, name)
    os.makedirs(work, exist_ok=True)
    sides = {"ours": ours, "upstream": upstream}
    exported = export_both(name, sides, work)
    for side in sides:
        path, secs, err = exported[side]
        rep.add("export " + side, [err] if path is None else [], "ok", "%.1fs" % secs)
    ya, yb = exported["ours"][0], exported["upstream"][0]
    if not (ya and yb):
        return rep

    try:
        diffs = compare_yaml(ya, yb)
    except Exception as exc:  # noqa: BLE001 - e.g. ours is not valid YAML
        diffs = ["could not compare: %s: %s" % (type(exc).__name__, exc)]
    fa, fb = bundle_files(ya), bundle_files(yb)
    if fa != fb:
        diffs.append("bundle files: ours %s, upstream %s" % (fa, fb))
    try:
        textual = text_diff_lines(ya, yb)
    except OSError as exc:
        textual = [str(exc)]
    note = ("text identical after masking digests and system information"
            if not textual else "%d text lines differ after masking (information "
            "only; first: %s)" % (len(textual), textual[0].strip()))
    rep.add("yaml", diffs, "identical", note)

    try:
        diffs, note = compare_initial_values(ya, yb)
    except Exception as exc:  # noqa: BLE001 - unreadable file, bad YAML
        diffs, note = ["could not compare: %s: %s" % (type(exc).__name__, exc)], ""
    rep.add("initial values", diffs, "identical", note)

    inputs = os.path.join(work, "inputs.safetensors")
    make_inputs(yb, inputs)
    bundles = {"ours-bundle": ya, "upstream-bundle": yb}
    runs, tensors, errors = {}, {}, []
    for side in ("upstream", "ours"):
        out = os.path.join(work, "outputs-%s-im.safetensors" % side)
        res, err = run_inference(sides[side], bundles, inputs, out, ours=side == "ours")
        if err:
            errors.append("%s InferenceManager: %s" % (side, err))
            continue
        for label, info in res.items():
            runs["%s in %s-IM" % (label, side)] = info
        for k, v in load_file(out).items():
            label, rest = k.split("|", 1)
            tensors["%s in %s-IM|%s" % (label, side, rest)] = v
    reference = "upstream-bundle in upstream-IM"
    diffs = errors + compare_inference(runs, tensors, reference)
    n_out = len((runs.get(reference) or {}).get("outputs") or [])
    if not diffs and n_out == 0:
        diffs = ["the bundle has no graph outputs: nothing to compare"]
    rep.add("inference", diffs, "identical",
            "%d steps, %d outputs; ours bundle in upstream IM, upstream bundle in "
            "ours IM, and both native, vs upstream native" % (STEPS, n_out))
    return rep


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true",
                    help="create .compat-venv (upstream leapp 0.7.2) if missing "
                         "and use it as --upstream")
    ap.add_argument("--upstream", metavar="VENV_OR_PYTHON",
                    help="upstream's interpreter (default: $LEAPP_UPSTREAM_PYTHON, "
                         "then .compat-venv)")
    ap.add_argument("--ours", metavar="PYTHON", default=sys.executable,
                    help="our interpreter (default: this one)")
    ap.add_argument("--only", help="comma-separated pipeline names (%s)"
                    % ", ".join(PIPELINES))
    ap.add_argument("--keep", metavar="DIR",
                    help="work in DIR and keep the bundles and logs there")
    args = ap.parse_args()

    if args.upstream:
        upstream = resolve_python(args.upstream)
    elif args.setup:
        upstream = setup_venv()
    else:
        upstream = find_upstream_python()
    ours = resolve_python(args.ours)
    if not upstream or not ours:
        print("compat: no upstream interpreter (pass --upstream, set "
              "LEAPP_UPSTREAM_PYTHON, or run with --setup)" if not upstream
              else "compat: no such interpreter: %s" % args.ours, file=sys.stderr)
        return 2
    names = PIPELINES
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - set(PIPELINES))
        if unknown:
            print("compat: unknown pipelines %s (known: %s)" % (unknown, PIPELINES),
                  file=sys.stderr)
            return 2

    for side, py in (("ours", ours), ("upstream", upstream)):
        d = describe(py, ours=side == "ours")
        print("%-8s %s  (leapp %s from %s, torch %s)" % (
            side, py, d.get("leapp", "?"), d.get("path", d.get("error", "?")),
            d.get("torch", "?")), flush=True)
    print(flush=True)

    workdir = args.keep or tempfile.mkdtemp(prefix="leapp-compat-")
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    failed = []
    try:
        for name in names:
            rep = check_pipeline(name, ours, upstream, workdir)
            print(rep.text(), flush=True)
            if not rep.ok:
                failed.append(name)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print("compat: %d/%d pipelines identical (%.0fs)%s" % (
        len(names) - len(failed), len(names), time.perf_counter() - t0,
        "; DIFFERENT: " + ", ".join(failed) if failed else ""))
    if args.keep:
        print("bundles and logs kept in %s" % workdir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
