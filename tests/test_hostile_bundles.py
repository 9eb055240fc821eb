"""Hostile bundles: every tampered bundle is refused with a clear message, fast.

One small real bundle (a jit node, an ONNX node with state, a pt2 node, feedback
initial values) is compiled once per module; each test copies it and tampers
with the copy.  Loading must never run code from the bundle (payloads would
create a marker file), never read outside the bundle unless asked to, never
hang, and never allocate what the bundle merely declares.

Every test runs under a hard SIGALRM timeout; the cases whose failure mode is a
hang inside C code (YAML alias expansion, reading a FIFO or /dev/zero) run in a
subprocess with a timeout instead.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from typing import Any, Callable

import pytest
import torch
import yaml

import leapp
from leapp import annotate
from leapp.bundle.safe_load import MAX_QUOTE, MAX_YAML_BYTES, quote
from leapp.running.inference_manager import InferenceManager
from support import ROOT

HARD_TIMEOUT_S = 60
GRAPH = "hostile"


# ---- the reference bundle -------------------------------------------------------------


def _compile(root: str, policy_backend: str) -> str:
    """Compile pre (jit) -> policy (policy_backend, state h) -> post (pt2) into root."""
    leapp.start(name=GRAPH, save_path=root)
    x = annotate.input_tensors("pre", {"x": torch.randn(1, 4)})
    y = x * 2.0 + 1.0
    annotate.output_tensors("pre", {"y": y}, export_with="jit")
    obs = annotate.input_tensors("policy", {"obs": y})
    h = annotate.state_tensors("policy", {"h": torch.full((1, 4), 0.5)})
    h_new = torch.tanh(obs + 0.5 * h)
    annotate.update_state("policy", {"h": h_new})
    a = h_new * 2.0
    annotate.output_tensors("policy", {"a": a}, export_with=policy_backend)
    z = annotate.input_tensors("post", {"a": a})
    annotate.output_tensors("post", {"out": z - 1.0}, export_with="pt2")
    leapp.stop()
    leapp.compile_graph(visualize=False, validate=False)
    from leapp import _core
    _core.reset_nodes()
    return os.path.join(root, GRAPH)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """The bundle most tests tamper with: every node TorchScript or torch.export.

    Its policy is TorchScript, so that onnxruntime sessions (each with its own
    thread pool) are only started by the tests about ONNX (``onnx_bundle``).
    """
    return _compile(str(tmp_path_factory.mktemp("reference")), "jit")


@pytest.fixture(scope="module")
def onnx_reference(tmp_path_factory) -> str:
    """The same graph with its policy in ONNX (state ports h_in / h_out)."""
    return _compile(str(tmp_path_factory.mktemp("onnx_reference")), "onnx-torchscript")


class Bundle:
    """A writable copy of the reference bundle."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.yaml_path = os.path.join(directory, f"{GRAPH}.yaml")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def read(self) -> dict:
        with open(self.yaml_path) as handle:
            return yaml.safe_load(handle)

    def write(self, description: Any) -> None:
        with open(self.yaml_path, "w") as handle:
            yaml.safe_dump(description, handle, sort_keys=False)

    def edit(self, change: Callable[[dict], Any]) -> None:
        description = self.read()
        change(description)
        self.write(description)

    def model_file(self, node: str) -> str:
        return self.path(self.read()["models"][node]["parameters"]["model_path"])

    def rehash(self, node: str) -> None:
        """Make the YAML's sha256 match the (tampered) model file, as an attacker would."""
        with open(self.model_file(node), "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        self.edit(lambda d: d["models"][node]["parameters"].update(sha256sum=digest))

    def load(self, **kwargs: Any) -> InferenceManager:
        return InferenceManager(self.yaml_path, **kwargs)


@pytest.fixture
def bundle(reference, tmp_path) -> Bundle:
    target = str(tmp_path / "bundle" / GRAPH)
    shutil.copytree(reference, target)
    return Bundle(target)


@pytest.fixture
def onnx_bundle(onnx_reference, tmp_path) -> Bundle:
    target = str(tmp_path / "onnx_bundle" / GRAPH)
    shutil.copytree(onnx_reference, target)
    return Bundle(target)


@pytest.fixture(scope="module", autouse=True)
def _give_memory_back():
    """Hand freed heap back to the OS after this module (it loads ~150 bundles)."""
    yield
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(autouse=True)
def _hard_timeout():
    """Fail any test that runs longer than HARD_TIMEOUT_S (Python-level hangs)."""
    def expire(signum, frame):
        raise TimeoutError(f"hostile-bundle test exceeded {HARD_TIMEOUT_S} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(HARD_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refused(bundle: Bundle, pattern: str, error: type[Exception] = ValueError,
            **kwargs: Any) -> str:
    """Load the bundle, expect ``error`` matching ``pattern``; returns the message."""
    with pytest.raises(error, match=pattern) as info:
        bundle.load(**kwargs)
    message = str(info.value)
    assert len(message) < 4000, "error messages stay bounded"
    return message


def load_in_subprocess(cases: list[tuple[str, dict]], timeout: float = HARD_TIMEOUT_S
                       ) -> list[str]:
    """Load each (yaml path, kwargs) in one fresh interpreter under a hard timeout.

    Returns one verdict line per case: ``LOADED`` or ``REFUSED <type> <message>``.
    """
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from leapp.running.inference_manager import InferenceManager
        for path, kwargs in {cases!r}:
            try:
                InferenceManager(path, **kwargs)
            except Exception as exc:
                print("REFUSED", type(exc).__name__, str(exc)[:2000].replace("\\n", " "))
            else:
                print("LOADED")
            sys.stdout.flush()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=timeout)
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(("REFUSED", "LOADED"))]
    assert len(lines) == len(cases), result.stderr[-2000:]
    return lines


def test_reference_bundle_loads_and_runs(bundle):
    manager = bundle.load()
    x = torch.randn(1, 4)
    h = torch.tanh(x * 2.0 + 1.0 + 0.5 * torch.full((1, 4), 0.5))
    torch.testing.assert_close(manager({"pre/x": x})["post/out"], h * 2.0 - 1.0)


# ---- loading never runs code from the bundle ------------------------------------------


class _Payload:
    """Unpickling this creates the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rewrite_zip(path: str, change: Callable[[str, bytes], bytes | None],
                 add: dict[str, bytes] | None = None) -> None:
    """Rewrite the archive at path: change(name, data) -> new data (None drops it)."""
    with zipfile.ZipFile(path) as source:
        entries = [(info, source.read(info.filename)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as target:
        for info, data in entries:
            new = change(info.filename, data)
            if new is not None:
                target.writestr(info, new)
        for name, data in (add or {}).items():
            target.writestr(name, data)


def _root(path: str) -> str:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()[0].split("/", 1)[0]


@pytest.fixture
def marker(tmp_path) -> str:
    path = str(tmp_path / "payload-ran")
    yield path
    assert not os.path.exists(path), "a pickle payload from the bundle ran"


def test_pt2_pickled_sample_inputs_never_unpickled(bundle, marker):
    path = bundle.model_file("post")
    payload = pickle.dumps(_Payload(marker), protocol=2)
    _rewrite_zip(path, lambda name, data: payload if "sample_inputs" in name else data)
    bundle.rehash("post")
    manager = bundle.load()  # loads: the sample inputs are never read
    assert "post/out" in manager({"pre/x": torch.ones(1, 4)})


def _edit_pt2_json(path: str, suffix: str, change: Callable[[Any], None]) -> None:
    def rewrite(name: str, data: bytes) -> bytes:
        if not name.endswith(suffix):
            return data
        document = json.loads(data)
        change(document)
        return json.dumps(document).encode()
    _rewrite_zip(path, rewrite)


def test_pt2_pickled_weight_refused(bundle, marker):
    path = bundle.model_file("post")
    root = _root(path)
    payload = pickle.dumps(_Payload(marker), protocol=2)

    def pickled(config: dict) -> None:
        config["config"]["evil"] = {"path_name": "weight_evil", "is_param": False,
                                    "use_pickle": True, "tensor_meta": None}
    _edit_pt2_json(path, "model_constants_config.json", pickled)
    _rewrite_zip(path, lambda n, d: d, {f"{root}/data/constants/weight_evil": payload})
    bundle.rehash("post")
    refused(bundle, r"archive entry '.*data/constants/weight_evil' \('evil'\) is a pickle")


def test_pt2_custom_object_refused(bundle, marker):
    path = bundle.model_file("post")
    root = _root(path)

    def custom(config: dict) -> None:
        config["config"]["obj"] = {"path_name": "custom_obj_0", "is_param": False,
                                   "use_pickle": False, "tensor_meta": None}
    _edit_pt2_json(path, "model_constants_config.json", custom)
    _rewrite_zip(path, lambda n, d: d, {f"{root}/data/constants/custom_obj_0":
                                        pickle.dumps(_Payload(marker))})
    bundle.rehash("post")
    refused(bundle, r"custom_obj_0' \('obj'\) is a pickled custom or opaque object")


@pytest.mark.parametrize("entry", ["data/weights/model.pt", "data/aotinductor/model/x.so",
                                   "data/constants/model.pt", "extra.pkl"])
def test_pt2_pickle_or_library_entry_refused(bundle, marker, entry):
    path = bundle.model_file("post")
    root = _root(path)
    _rewrite_zip(path, lambda n, d: d, {f"{root}/{entry}": pickle.dumps(_Payload(marker))})
    bundle.rehash("post")
    refused(bundle, f"holds '{root}/{entry}', a pickled payload or native library")


def test_pt2_old_format_refused(bundle, marker):
    path = bundle.model_file("post")
    _rewrite_zip(path, lambda n, d: None if n.endswith("archive_version") else d,
                 {f"{_root(path)}/serialized_example_inputs.pt": pickle.dumps(_Payload(marker))})
    bundle.rehash("post")
    refused(bundle, r"is not a torch>=2.7 PT2 archive")


def _legacy_pt2(path: str, state_dict: bytes | None = None, extra: dict | None = None
                ) -> torch.nn.Module:
    """A torch 2.7 style archive (flat, state dict as a torch.save pickle) at path."""
    from torch._export.serde.serialize import SCHEMA_VERSION, serialize

    module = torch.nn.Linear(3, 2)
    artifact = serialize(torch.export.export(module, (torch.ones(1, 3),)))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", state_dict or artifact.state_dict)
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return module


def test_pt2_torch27_archive_loads(tmp_path):
    from leapp.bundle.pt2_reader import load_pt2

    path = str(tmp_path / "legacy.pt2")
    module = _legacy_pt2(path)
    x = torch.randn(1, 3)
    torch.testing.assert_close(load_pt2(path).module()(x), module(x))


@pytest.mark.parametrize("where", ["state_dict", "entry"])
def test_pt2_torch27_archive_pickle_refused(tmp_path, marker, where):
    from leapp.bundle.pt2_reader import load_pt2
    from leapp.bundle.safe_load import BundleError

    path = str(tmp_path / "legacy.pt2")
    payload = pickle.dumps(_Payload(marker))
    if where == "state_dict":
        _legacy_pt2(path, state_dict=payload)
        pattern = r"serialized_state_dict.pt' is not a plain dict of tensors"
    else:
        _legacy_pt2(path, extra={"payload.pkl": payload})
        pattern = r"holds 'payload.pkl', which a torch.export archive of torch 2.7 never holds"
    with pytest.raises(BundleError, match=pattern):
        load_pt2(path)


def test_pt2_guard_code_refused(bundle, marker):
    path = bundle.model_file("post")
    _edit_pt2_json(path, "models/model.json", lambda d: d.update(
        guards_code=[f"__import__('os').system('touch {marker}') == 0"]))
    bundle.rehash("post")
    refused(bundle, r"guard .* is not a plain comparison of input sizes")


def test_pt2_symbolic_expression_refused(bundle, marker):
    path = bundle.model_file("post")

    def inject(document: dict) -> None:
        text = json.dumps(document).replace(
            '{"as_int": 4}', json.dumps({"as_expr": {
                "expr_str": f"__import__('os').system('touch {marker}')",
                "hint": {"as_int": 4}}}), 1)
        document.clear()
        document.update(json.loads(text))
    _edit_pt2_json(path, "models/model.json", inject)
    bundle.rehash("post")
    refused(bundle, r"symbolic expression .* names '__import__'")


def test_pt2_load_never_calls_an_unpickler(bundle, monkeypatch):
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an unpickler was called while loading a bundle")
    import _pickle
    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"),
                         (_pickle, "load"), (_pickle, "loads"), (torch, "load"),
                         (torch.serialization, "load"), (torch._C, "_pickle_load_obj")):
        monkeypatch.setattr(module, name, forbidden)
    manager = bundle.load()
    assert "post/out" in manager({"pre/x": torch.ones(1, 4)})


@pytest.mark.parametrize("entry", ["data.pkl", "constants.pkl"])
def test_torchscript_pickle_payload_refused(bundle, marker, entry):
    path = bundle.model_file("pre")
    payload = pickle.dumps(_Payload(marker), protocol=2)
    _rewrite_zip(path, lambda name, data: payload if name.endswith("/" + entry) else data)
    bundle.rehash("pre")
    # torch.jit.load's unpickler only knows tensors and TorchScript classes
    refused(bundle, r"Could not load the jit model of node 'pre'.*system")


# ---- paths stay inside the bundle -----------------------------------------------------


def _elsewhere(bundle: Bundle, name: str) -> str:
    """Copy a bundle file next to the bundle's parent; returns the new path."""
    outside = os.path.join(os.path.dirname(os.path.dirname(bundle.dir)), "elsewhere")
    os.makedirs(outside, exist_ok=True)
    target = os.path.join(outside, os.path.basename(name))
    shutil.copy(bundle.path(name), target)
    return target


def test_model_path_escaping_with_dotdot_refused(bundle):
    target = _elsewhere(bundle, "pre.pt")
    relative = os.path.relpath(target, bundle.dir)
    assert relative.startswith("..")
    bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(model_path=relative))
    refused(bundle, r"model file for node 'pre' '\.\./.*pre\.pt' resolves to .*, outside the "
                    r"bundle directory .*allow_external_paths=True")
    assert bundle.load(allow_external_paths=True).nodes["pre"].model_path == \
        os.path.realpath(target)


def test_absolute_model_path_refused(bundle):
    target = _elsewhere(bundle, "pre.pt")
    bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(model_path=target))
    refused(bundle, r"model file for node 'pre' is named by an absolute path")
    bundle.load(allow_external_paths=True)


def test_symlink_leaving_the_bundle_refused(bundle):
    target = _elsewhere(bundle, "pre.pt")
    os.remove(bundle.path("pre.pt"))
    os.symlink(target, bundle.path("pre.pt"))
    refused(bundle, r"'pre\.pt' resolves to .*elsewhere.*outside the bundle directory")


def test_symlink_inside_the_bundle_allowed(bundle):
    os.makedirs(bundle.path("models"))
    os.replace(bundle.path("pre.pt"), bundle.path("models/pre.pt"))
    os.symlink(os.path.join("models", "pre.pt"), bundle.path("pre.pt"))
    bundle.load()


def test_initial_values_escaping_refused(bundle):
    name = f"{GRAPH}_initial_values.safetensors"
    target = _elsewhere(bundle, name)
    relative = os.path.relpath(target, bundle.dir)
    bundle.edit(lambda d: d["pipeline"].update(initial_values=relative))
    refused(bundle, r"feedback initial values file .* outside the bundle directory")
    bundle.load(allow_external_paths=True)


def test_model_path_to_a_directory_refused(bundle):
    os.makedirs(bundle.path("models.d"))
    bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(model_path="models.d"))
    refused(bundle, r"Model file for node 'pre' at .*models\.d' is not a regular file")


# ---- cases that would hang: one subprocess under a hard timeout ------------------------


def _alias_bomb(levels: int = 12) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*l{i - 1}"] * 10)
        lines.append(f"l{i}: &l{i} [{refs}]")
    return "\n".join(lines)


def _plant_bomb(bundle: Bundle, where: str) -> None:
    """10**12 'lol's behind an alias chain, reached from graph inputs, a node or a shape."""
    bomb = f"bomb:\n{textwrap.indent(_alias_bomb(), '  ')}\n"
    text = open(bundle.yaml_path).read()
    if where == "graph inputs":
        text = text.replace("  inputs:\n    pre:", "  inputs:\n    bomb: *l11\n    pre:", 1)
    elif where == "model description":
        text = text.replace("  pre:\n", "  pre:\n    description: *l11\n", 1)
    else:
        text = text.replace("shape: [1, 4]", "shape: *l11", 1)
    assert "*l11" in text
    with open(bundle.yaml_path, "w") as handle:
        handle.write(bomb + text)


# The last two would not hang, but allocate tens of MiB: kept out of this process so
# that its heap stays as the memory-growth test of test_inference_manager expects.
HANG_CASES = ["alias bomb in graph inputs", "alias bomb in model description",
              "alias bomb in shape", "model path is a FIFO", "model path is /dev/zero",
              "symlink to /dev/zero", "YAML is a FIFO", "oversized YAML",
              "initial values bigger than the inputs"]


@pytest.fixture(scope="module")
def hang_verdicts(reference, tmp_path_factory) -> dict[str, str]:
    """Verdicts of the cases whose failure mode is a hang, loaded in one subprocess."""
    root = tmp_path_factory.mktemp("hang")
    cases = []
    for i, case in enumerate(HANG_CASES):
        directory = str(root / str(i) / GRAPH)
        shutil.copytree(reference, directory)
        bundle = Bundle(directory)
        kwargs: dict = {}
        path = bundle.yaml_path
        if case.startswith("alias bomb in "):
            _plant_bomb(bundle, case[len("alias bomb in "):])
        elif case == "model path is a FIFO":
            os.mkfifo(bundle.path("pipe.pt"))
            bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(model_path="pipe.pt"))
        elif case == "model path is /dev/zero":
            bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(
                model_path="/dev/zero"))
            kwargs = {"allow_external_paths": True}
        elif case == "symlink to /dev/zero":
            os.symlink("/dev/zero", bundle.path("zero.pt"))
            bundle.edit(lambda d: d["models"]["pre"]["parameters"].update(model_path="zero.pt"))
        elif case == "oversized YAML":
            with open(bundle.yaml_path, "a") as handle:
                handle.write("# " + "x" * (MAX_YAML_BYTES + 10) + "\n")
        elif case == "initial values bigger than the inputs":
            from safetensors.torch import save_file
            save_file({"policy/h": torch.zeros(5_000_000)}, _initial(bundle))
        else:
            path = str(root / str(i) / "graph.yaml")
            os.mkfifo(path)
        cases.append((path, kwargs))
    return dict(zip(HANG_CASES, load_in_subprocess(cases)))


@pytest.mark.parametrize("case", [c for c in HANG_CASES if c.startswith("alias bomb")])
def test_alias_bomb_refused_fast(hang_verdicts, case):
    verdict = hang_verdicts[case]
    assert verdict.startswith("REFUSED BundleError"), verdict
    assert "uses a YAML anchor or alias ('l0', line 2)" in verdict


@pytest.mark.parametrize("case", ["model path is a FIFO", "model path is /dev/zero",
                                  "YAML is a FIFO"])
def test_non_regular_files_refused_without_reading(hang_verdicts, case):
    verdict = hang_verdicts[case]
    assert verdict.startswith("REFUSED BundleError"), verdict
    assert "is not a regular file" in verdict


def test_symlink_to_dev_zero_refused(hang_verdicts):
    assert "outside the bundle directory" in hang_verdicts["symlink to /dev/zero"]


# ---- YAML bombs and oddities ---------------------------------------------------------


def _alias_bomb(levels: int = 12) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*l{i - 1}"] * 10)
        lines.append(f"l{i}: &l{i} [{refs}]")
    return "\n".join(lines)


def test_single_anchor_refused(bundle):
    text = open(bundle.yaml_path).read().replace("shape: [1, 4]", "shape: &s [1, 4]", 1)
    with open(bundle.yaml_path, "w") as handle:
        handle.write(text)
    refused(bundle, r"uses a YAML anchor or alias \('s', line \d+\)")


def test_oversized_yaml_refused(hang_verdicts):
    verdict = hang_verdicts["oversized YAML"]
    assert verdict.startswith("REFUSED BundleError"), verdict
    assert "is larger than 16777216 bytes (16 MiB)" in verdict


def test_deeply_nested_yaml_refused(bundle):
    with open(bundle.yaml_path, "a") as handle:
        handle.write("deep: " + "[" * 10000 + "]" * 10000 + "\n")
    refused(bundle, r"nests deeper than 64 levels")


@pytest.mark.parametrize("text,pattern", [
    ("models: !!python/object/apply:os.system ['true']\n", r"is not valid YAML"),
    ("models: {}\n---\npipeline: {}\n", r"is not valid YAML"),
    ("models: {a: " + "9" * 5000 + "}\n", r"holds a value that cannot be read"),
    ("models: [unclosed\n", r"is not valid YAML"),
    ("", r"must contain models, pipeline, and system_info, got None"),
    ("- a\n- b\n", r"must contain models, pipeline, and system_info, got \['a', 'b'\]"),
])
def test_malformed_yaml_refused(bundle, text, pattern):
    with open(bundle.yaml_path, "w") as handle:
        handle.write(text)
    refused(bundle, pattern)


def test_non_utf8_yaml_refused(bundle):
    with open(bundle.yaml_path, "wb") as handle:
        handle.write(b"models: \xff\xfe\n")
    refused(bundle, r"is not UTF-8 text")


# ---- shapes --------------------------------------------------------------------------


@pytest.mark.parametrize("shape,pattern", [
    ([1.0, 4], r"dimension 1\.0 is not a non-negative int"),
    (["8"], r"dimension '8' is not a non-negative int"),
    ("8", r"Invalid shape '8' for pre/x"),
    ([True, 4], r"dimension True is not a non-negative int"),
    ([1, -4], r"dimension -4 is not a non-negative int"),
    ("[1, -4]", r"dimension -4 is not a non-negative int"),
    (None, r"Invalid shape None for pre/x"),
    ({"a": 1}, r"Invalid shape \{'a': 1\} for pre/x"),
    ([[1], 4], r"dimension \[1\] is not a non-negative int"),
    ([1] * 65, r"more than 64 dimensions"),
    ([2 ** 20, 2 ** 20], r"Shape \[1048576, 1048576\] for pre/x declares 1099511627776 "
                         r"elements, more than the 2147483648 \(2\*\*31\)"),
])
def test_bad_shapes_refused(bundle, shape, pattern):
    bundle.edit(lambda d: d["models"]["pre"]["inputs"][0].update(shape=shape))
    refused(bundle, pattern)


def test_huge_output_shape_refused_before_allocation(bundle):
    bundle.edit(lambda d: d["models"]["post"]["outputs"][0].update(shape=[2 ** 31, 2]))
    refused(bundle, r"for post/out declares 4294967296 elements")


def test_8_gib_input_refused_on_load_naming_node_port_and_size(bundle):
    """2**31 float32 elements pass the element bound but are 8 GiB: refused before torch
    is asked for the buffer, with the node, the port and the size."""
    bundle.edit(lambda d: d["models"]["pre"]["inputs"][0].update(shape=[2, 1024, 1024, 1024]))
    message = refused(bundle, r"Node 'pre', port 'x' \(pre/x\) declares float32 "
                              r"\[2, 1024, 1024, 1024\]: 8\.0 GiB \(8589934592 bytes\), "
                              r"more than the 2\.0 GiB")
    assert "MAX_PORT_BYTES" in message and "allocat" in message
    assert "DefaultCPUAllocator" not in message


def test_large_dtype_counts_in_the_port_bound(bundle):
    """2**28 + 1 float64 elements, far below the element bound, are 8 bytes over the
    2 GiB port bound: the bound is in bytes, so the dtype counts."""
    bundle.edit(lambda d: d["models"]["post"]["outputs"][0].update(shape=[2 ** 28 + 1],
                                                                   dtype="float64"))
    refused(bundle, r"Node 'post', port 'out' \(post/out\) declares float64 \[268435457\]")


def test_ports_over_the_bundle_bound_refused_naming_the_largest(bundle):
    """Six ports of 2 GiB each (each within its own bound): 12 GiB together is refused."""
    def grow(d):
        models = d["models"]
        for node, side, index in [("pre", "inputs", 0), ("pre", "outputs", 0),
                                  ("policy", "inputs", 0), ("policy", "outputs", 0),
                                  ("post", "inputs", 0), ("post", "outputs", 0)]:
            port = models[node][side][index]
            assert port["name"] in ("x", "y", "obs", "a", "out"), port
            port["shape"] = [2 ** 29]
    bundle.edit(grow)
    # six ports of 2 GiB, and the state h in and out: 2 x 16 bytes
    message = refused(bundle, r"The bundle's ports declare 12\.0 GiB \(12884901920 bytes\) "
                              r"together, more than the 8\.0 GiB")
    assert "MAX_BUNDLE_PORT_BYTES" in message and "2.0 GiB" in message


def test_json_string_shape_still_accepted(bundle):
    bundle.edit(lambda d: d["models"]["pre"]["inputs"][0].update(shape="[1, 4]"))
    bundle.load()


# ---- error messages stay short -------------------------------------------------------


def test_quote_bounds_long_and_nested_values():
    assert len(quote("x" * 10 ** 6)) <= MAX_QUOTE and "..." in quote("x" * 10 ** 6)
    nested: list = []
    for _ in range(1000):
        nested = [nested]
    assert len(quote(nested)) <= MAX_QUOTE
    assert quote([1, 2]) == "[1, 2]"


@pytest.mark.parametrize("change", [
    lambda d: d["models"]["pre"]["inputs"][0].update(shape=["x" * 100000]),
    lambda d: d["models"]["pre"].update(parameters=None, **{"k" * 100000: 1}) or
    d["models"]["pre"].pop("parameters"),
    lambda d: d["models"]["pre"]["inputs"][0].update(dtype="f" * 100000),
    lambda d: d["pipeline"]["data_flow"].update({"a" * 100000: ["post/a"]}),
    lambda d: d["models"]["pre"]["parameters"].update(backend="b" * 100000),
])
def test_messages_quote_attacker_values_bounded(bundle, change):
    bundle.edit(change)
    with pytest.raises(ValueError) as info:
        bundle.load()
    assert len(str(info.value)) < 2000 and "..." in str(info.value)


# ---- corrupted model files -----------------------------------------------------------


def _node_of(backend: str) -> str:
    return {"jit": "pre", "onnx": "policy", "pt2": "post"}[backend]


@pytest.mark.parametrize("backend", ["jit", "onnx", "pt2"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "flipped"])
def test_corrupted_model_files_refused(request, backend, damage):
    bundle = request.getfixturevalue("onnx_bundle" if backend == "onnx" else "bundle")
    node = _node_of(backend)
    path = bundle.model_file(node)
    data = open(path, "rb").read()
    if damage == "empty":
        data = b""
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "garbage":
        data = os.urandom(4096)
    else:  # a byte flipped in the middle
        middle = len(data) // 2
        data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
    with open(path, "wb") as handle:
        handle.write(data)
    # first the checksum catches it
    refused(bundle, r"SHA256 checksum mismatch")
    # then, with a matching checksum, the loader refuses it with a message naming the node
    bundle.rehash(node)
    try:
        bundle.load()
    except ValueError as exc:
        message = str(exc)
        assert len(message) < 4000
        assert (f"node '{node}'" in message or "torch.export archive" in message), message
    else:  # a flipped byte can land in padding or a weight: loading may still succeed
        assert damage == "flipped"


# ---- initial values ------------------------------------------------------------------


def _initial(bundle: Bundle) -> str:
    return bundle.path(f"{GRAPH}_initial_values.safetensors")


@pytest.mark.parametrize("damage,pattern", [
    ("empty", r"is not a valid safetensors file"),
    ("truncated", r"is not a valid safetensors file"),
    ("garbage", r"is not a valid safetensors file"),
    ("unknown dtype", r"is not a valid safetensors file"),
    ("huge header", r"is not a valid safetensors file"),
])
def test_corrupted_initial_values_refused(bundle, damage, pattern):
    path = _initial(bundle)
    data = open(path, "rb").read()
    if damage == "empty":
        data = b""
    elif damage == "truncated":
        data = data[:len(data) - 5]
    elif damage == "garbage":
        data = os.urandom(256)
    elif damage == "unknown dtype":
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        key = next(k for k in header if k != "__metadata__")
        header[key]["dtype"] = "Q7"
        raw = json.dumps(header).encode()
        data = len(raw).to_bytes(8, "little") + raw + data[8 + header_len:]
    else:
        data = (2 ** 62).to_bytes(8, "little") + data[8:]
    with open(path, "wb") as handle:
        handle.write(data)
    refused(bundle, pattern)


def test_initial_value_wrong_shape_or_dtype_refused(bundle):
    from safetensors.torch import load_file, save_file
    path = _initial(bundle)
    values = load_file(path)
    key = next(iter(values))
    save_file({key: torch.zeros(7)}, path)
    refused(bundle, rf"Feedback initial value '{key}' is a torch.float32 tensor of shape "
                    r"\(7,\), but the input is declared torch.float32 \(1, 4\)")
    save_file({key: torch.zeros(1, 4, dtype=torch.int64)}, path)
    refused(bundle, r"is a torch.int64 tensor")


def test_initial_values_bigger_than_the_inputs_refused(hang_verdicts):
    verdict = hang_verdicts["initial values bigger than the inputs"]
    assert verdict.startswith("REFUSED BundleError"), verdict
    assert re.search(r"is larger than the \d+ bytes the declared node inputs can hold", verdict)


def test_initial_values_null_name_refused(bundle):
    bundle.edit(lambda d: d["pipeline"].update(initial_values=5))
    refused(bundle, r"pipeline initial_values must be a file name, got 5")


# ---- dtypes, wiring ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float128", "complex64", 5, None, ["float32"]])
def test_unknown_dtype_refused(bundle, dtype):
    bundle.edit(lambda d: d["models"]["pre"]["inputs"][0].update(dtype=dtype))
    refused(bundle, rf"Unsupported dtype {quote(dtype).replace('[', '.').replace(']', '.')} "
                    r"for pre/x")


@pytest.mark.parametrize("change,pattern", [
    (lambda p: p["data_flow"].update({"ghost/y": ["post/a"]}), r"Source node 'ghost' not found"),
    (lambda p: p["data_flow"].update({"pre/nope": ["post/a"]}),
     r"Source output 'nope' not found in node 'pre'"),
    (lambda p: p["data_flow"].update({"pre/y": ["ghost/a"]}), r"Target node 'ghost' not found"),
    (lambda p: p["data_flow"].update({"pre/y": ["post/nope"]}),
     r"Target input 'nope' not found in node 'post'"),
    (lambda p: p["feedback_flow"].update({"ghost/h": ["policy/h"]}),
     r"Source node 'ghost' not found"),
    (lambda p: p["inputs"].update({"ghost": ["x"]}),
     r"Pipeline input 'ghost/x' does not match any node input"),
    (lambda p: p["outputs"].update({"post": ["nope"]}),
     r"Pipeline output 'post/nope' does not match any node output"),
    (lambda p: p["data_flow"].update({"pre-y": ["post/a"]}),
     r"Invalid pipeline source key 'pre-y': not enough values"),
    (lambda p: p["data_flow"].update({"pre/y": ["post/a/b"]}),
     r"Invalid pipeline target key 'post/a/b': too many values"),
    (lambda p: p["data_flow"].update({"post/out": ["pre/x"]}), r"data_flow has a cycle"),
])
def test_broken_wiring_refused(bundle, change, pattern):
    bundle.edit(lambda d: change(d["pipeline"]))
    refused(bundle, pattern)


# ---- null fields, wrong types, missing sections --------------------------------------


def _set(path: list, value: Any) -> Callable[[dict], None]:
    def change(description: dict) -> None:
        target = description
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _delete(path: list) -> Callable[[dict], None]:
    def change(description: dict) -> None:
        target = description
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return change


@pytest.mark.parametrize("change,pattern", [
    (_set(["models"], None), r"Section 'models' must be a mapping, got None"),
    (_set(["models"], ["pre"]), r"Section 'models' must be a mapping, got \['pre'\]"),
    (_set(["pipeline"], None), r"Section 'pipeline' must be a mapping, got None"),
    (_set(["pipeline"], "x"), r"Section 'pipeline' must be a mapping, got 'x'"),
    (_set(["system information"], None),
     r"Section 'system information' must be a mapping, got None"),
    (_delete(["models"]), r"must contain models, pipeline, and system_info"),
    (_delete(["pipeline"]), r"must contain models, pipeline, and system_info"),
    (_set(["models", "pre"], None), r"Model description must contain inputs, outputs, and "
                                    r"parameters, got None"),
    (_set(["models", 7], {}), r"Invalid node name 7"),
    (_set(["models", "a/b"], {}), r"Invalid node name 'a/b'"),
    (_delete(["models", "pre", "inputs"]), r"Model description must contain inputs"),
    (_set(["models", "pre", "inputs"], None),
     r"'inputs' of node 'pre' must be a list of port descriptions, got None"),
    (_set(["models", "pre", "outputs"], {"y": 1}),
     r"'outputs' of node 'pre' must be a list of port descriptions"),
    (_set(["models", "pre", "inputs", 0], "x"),
     r"Each of the inputs of node 'pre' must be a mapping with name, dtype and shape, got 'x'"),
    (_set(["models", "pre", "inputs", 0, "name"], 3), r"Invalid input name of node 'pre' 3"),
    (_set(["models", "pre", "inputs", 0, "name"], None), r"Invalid input name of node 'pre'"),
    (_delete(["models", "pre", "inputs", 0, "shape"]), r"must be a mapping with name, dtype"),
    (_set(["models", "pre", "parameters"], ["x"]),
     r"'parameters' of node 'pre' must be a mapping, got \['x'\]"),
    (_set(["models", "pre", "parameters"], None),
     r"Model description must contain model_path, md5sum, sha256sum, and backend"),
    (_set(["models", "pre", "parameters", "model_path"], None), r"Node 'pre' has no model_path"),
    (_set(["models", "pre", "parameters", "model_path"], 5),
     r"The path of the model file for node 'pre' must be a non-empty string, got 5"),
    (_set(["models", "pre", "parameters", "sha256sum"], None),
     r"SHA256 checksum mismatch .*expected None"),
    (_set(["models", "pre", "parameters", "backend"], None), r"Unsupported backend: None"),
    (_set(["models", "pre", "parameters", "backend"], ["jit"]),
     r"Unsupported backend: \['jit'\]"),
    (_set(["pipeline", "data_flow"], ["pre/y"]),
     r"Section 'pipeline data_flow' must be a mapping, got \['pre/y'\]"),
    (_set(["pipeline", "data_flow", "pre/y"], "post/a"),
     r"pipeline data_flow entry 'pre/y' must be a list of names, got 'post/a'"),
    (_set(["pipeline", "feedback_flow", "policy/h"], [None]),
     r"pipeline feedback_flow entry 'policy/h' must be a list of names, got \[None\]"),
    (_set(["pipeline", "inputs"], 3), r"Section 'pipeline inputs' must be a mapping, got 3"),
    (_set(["pipeline", "outputs", "post"], [1]),
     r"pipeline outputs entry 'post' must be a list of names, got \[1\]"),
    (_set(["pipeline", "data_flow", 5], ["post/a"]),
     r"Invalid pipeline data_flow key 5: expected a string"),
])
def test_null_fields_and_wrong_types_refused(bundle, change, pattern):
    bundle.edit(change)
    refused(bundle, pattern)


def test_duplicate_port_refused(bundle):
    bundle.edit(lambda d: d["models"]["policy"]["inputs"].append(
        copy.deepcopy(d["models"]["policy"]["inputs"][0])))
    refused(bundle, r"Node 'policy' declares the input 'obs' twice")


def test_missing_model_file_refused(bundle):
    os.remove(bundle.model_file("pre"))
    refused(bundle, r"Model file for node 'pre' not found at", FileNotFoundError)


def test_missing_initial_values_file_refused(bundle):
    os.remove(_initial(bundle))
    refused(bundle, r"Feedback initial values file not found at", FileNotFoundError)


def test_byom_style_pt2_weights_round_trip(tmp_path):
    """A pt2 with parameters, buffers, constants and aliasing loads bit-exactly."""
    from leapp.bundle.pt2_reader import load_pt2

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 5))
            self.register_buffer("scale", torch.randn(5))
            self.alias = self.weight  # shared storage

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.weight) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])

    model = Model().eval()
    path = str(tmp_path / "m.pt2")
    torch.export.save(torch.export.export(model, (torch.randn(2, 3),)), path)
    x = torch.randn(2, 3)
    torch.testing.assert_close(load_pt2(path).module()(x), model(x), rtol=0, atol=0)


# ---- ONNX external data --------------------------------------------------------------


def _externalize(bundle: Bundle, location: str) -> str:
    """Move policy.onnx's initializers to an external file named location (relative)."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, convert_model_to_external_data
    path = bundle.model_file("policy")
    model = onnx.load(path)
    convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                   location="policy.onnx.data", size_threshold=0,
                                   convert_attribute=True)
    onnx.save_model(model, path)
    assert os.path.exists(bundle.path("policy.onnx.data"))
    model = onnx.load(path, load_external_data=False)
    for tensor in _get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, path)
    bundle.rehash("policy")
    return bundle.path("policy.onnx.data")


def test_onnx_external_data_inside_bundle_loads(onnx_bundle):
    bundle = onnx_bundle
    _externalize(bundle, "policy.onnx.data")
    bundle.load()


def test_onnx_external_data_symlink_leaving_bundle_refused(onnx_bundle):
    bundle = onnx_bundle
    data = _externalize(bundle, "weights.bin")
    outside = os.path.join(os.path.dirname(os.path.dirname(bundle.dir)), "weights.bin")
    os.replace(data, outside)
    os.symlink(outside, bundle.path("weights.bin"))
    refused(bundle, r"external data file of ONNX tensor .* resolves to .*, outside the bundle")


def test_onnx_external_data_fifo_refused(onnx_bundle):
    bundle = onnx_bundle
    data = _externalize(bundle, "weights.bin")
    os.remove(data)
    os.mkfifo(bundle.path("weights.bin"))
    refused(bundle, r"External data file of ONNX tensor .* is not a regular file")


# ---- what torch would evaluate: guards and symbolic expressions ----------------------


@pytest.mark.parametrize("text,ok", [
    ("s0**2 + 3*s1", True),
    ("Symbol('s77', positive=True, integer=True)", True),
    ("FloorDiv(s0, 2) + Max(s1, 4)", True),
    ("(9**64)**64", True),
    ("9**9**9", False),              # a power tower sympy would compute exactly
    ("Pow(9, 99999999)", False),
    ("1" + "0" * 30, False),
    ("s0.__class__", False),
    ("__import__('os')", False),
    ("lambda: 0", False),
])
def test_symbolic_expression_check(text, ok):
    from leapp.bundle.pt2_reader import _check_sym_expr
    from leapp.bundle.safe_load import BundleError
    if ok:
        _check_sym_expr(text, "t")
    else:
        with pytest.raises(BundleError, match="symbolic expression"):
            _check_sym_expr(text, "t")


@pytest.mark.parametrize("text,ok", [
    ("L['x'].size()[0] == 3", True),
    ("2 <= L['x'].size()[0] and L['x'].size()[0] <= 64", True),
    ("L['x'].__class__", False),
    ("L['x'].size()[0] == open('f')", False),
    ("L['a\"); import os; (\"'].size()[0] == 1", False),
])
def test_guard_check(text, ok):
    from leapp.bundle.pt2_reader import _check_guard
    from leapp.bundle.safe_load import BundleError
    if ok:
        _check_guard(text, "t")
    else:
        with pytest.raises(BundleError, match="guard"):
            _check_guard(text, "t")


def test_dynamic_shape_pt2_loads(tmp_path):
    """A pt2 exported with a dynamic dim (symbols, range constraints) still loads."""
    from leapp.bundle.pt2_reader import load_pt2

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :2] * x.shape[0] + x.sum(1, keepdim=True)

    batch = torch.export.Dim("batch", min=2, max=64)
    path = str(tmp_path / "dyn.pt2")
    torch.export.save(torch.export.export(Model(), (torch.randn(4, 3),),
                                          dynamic_shapes={"x": {0: batch}}), path)
    x = torch.randn(5, 3)
    torch.testing.assert_close(load_pt2(path).module()(x), Model()(x))
