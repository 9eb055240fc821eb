# One entry point for set-up, build, demo, tests, sanitizers and benchmarks.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
STAMP := $(VENV)/.leapp-setup
# The C core is compiled again only when csrc/ or setup.py changed since it was.
CORE_STAMP := build/.leapp-core
CORE_SOURCES := $(wildcard csrc/*.c csrc/*.h) setup.py
# Development and CI builds treat C warnings as errors; users' pip builds do not.
export LEAPP_DEV_BUILD := 1

.PHONY: setup build debug demo test test-device test-matrix test-debug test-asan test-wheel wheel bench oneshot compat fuzz fuzz-writers opinfo upstream-venv clean

setup: $(STAMP)

# A fresh machine: libyaml headers, Chromium and its driver (tests/test_view.py), a venv, torch pinned to the CPU build, the
# package (editable, which compiles the C core) and its test dependencies.
$(STAMP): pyproject.toml setup.py constraints.txt
	@test -f /usr/include/yaml.h || (apt-get update -qq && apt-get install -y -qq libyaml-dev)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt setuptools wheel torch==2.13.0
	$(PIP) install -c constraints.txt --no-build-isolation -e '.[test]'
	# tritonserver for tests/test_triton.py: only the binary is used, so the wheel's
	# Python requirements (numpy<2 among them) are not installed
	$(PIP) install -c constraints.txt --no-deps nvidia-pytriton==0.7.0
	# rl-games for tests/test_client_exports.py: its psutil<6 pin clashes with ipython's
	# psutil>=7 and it never imports psutil; its other requirements are in the test extra
	$(PIP) install -c constraints.txt --no-deps rl-games==1.6.5
	@mkdir -p build && touch $(STAMP) $(CORE_STAMP)

build: setup $(CORE_STAMP)

$(CORE_STAMP): $(STAMP) $(CORE_SOURCES)
	$(PY) setup.py -q build_ext --inplace
	@mkdir -p build && touch $@

# The GPU run (tests/device/run.py, README's maintainer section): on a machine with an
# NVIDIA GPU and its own Python and CUDA torch, build the C core there (libyaml carried
# in tests/device/vendor/ where the machine lacks it), run the GPU tests, export the
# device pipelines with ours and upstream 0.7.2 (its wheel carried too) and compare;
# the report goes to $(DEVICE_OUT)/device-report.md.  Needs no venv and no network.
DEVICE_OUT ?= build/device
test-device:
	tests/device/run.sh --out $(DEVICE_OUT)

# The compatibility matrix (tests/matrix.py): the subset of the suite that covers
# tracing, every backend, InferenceManager, fuse, the examples, rsl-rl-lib and the
# ONNX writer's rules, run
# under torch 2.7 (Isaac Lab's line) with NumPy 1.26, the pinned torch with NumPy
# 1.26, and the pinned torch with NumPy 2 (.venv).  The side environments live in
# .matrix/ and are made once; the first run downloads torch 2.7.1 (a CUDA build,
# about 5 GB with its nvidia packages; it runs on the CPU).
# MATRIX_ARGS=--side-only leaves out .venv (CI: `make test` has just run all of it there).
test-matrix: build
	$(PY) tests/matrix.py $(MATRIX_ARGS)

# The debug core in place: -O0 -g3 and assert() of the invariants csrc/ states
# (LEAPP_DEBUG_BUILD=1).  The stamp goes, so the next `make build` (or `make
# test`) compiles the release core again.  tests/test_debug_build.py compiles
# this build on every `make test`, into a temporary directory.
debug: setup
	LEAPP_DEBUG_BUILD=1 $(PY) setup.py -q build_ext --inplace --force
	@rm -f $(CORE_STAMP)

# The whole suite on the debug core, then the release core back
# (LEAPP_EXPECT_ASSERTS=1: tests/conftest.py stops the run if the core it
# imports has no asserts).
test-debug: setup
	LEAPP_DEBUG_BUILD=1 $(PY) setup.py -q build_ext --inplace --force
	$(PY) -c "from leapp import _core; assert _core.ASSERTS, 'not the debug core'" \
	&& LEAPP_EXPECT_ASSERTS=1 $(PY) -m pytest -q -p no:warnings tests; status=$$?; \
	$(PY) setup.py -q build_ext --inplace --force; exit $$status

demo: build
	$(PY) examples/getting_started.py

test: build
	$(PY) -m pytest -q -p no:warnings tests

# ASan + UBSan build of the core, with assert() on (the invariants csrc/ states
# are checked on every path the suite drives), then two runs under the sanitizers:
# 1. leak-checked: tests/c, tests/test_leaks.py (the hot paths repeated in fresh
#    interpreters, which inherit the settings) and tests/test_lsan.py, with
#    LeakSanitizer on (detect_leaks=1) and PYTHONMALLOC=malloc, so that memory
#    the core takes with PyMem_* or malloc (the program's slot arrays,
#    pruning's marks, libyaml's emitter) and never frees fails the run at exit.
#    tests/lsan.supp suppresses CPython's object allocators, whose objects
#    (interned strings, types, what torch's modules keep) live until the end
#    of the process; leaked Python objects of the core are what test_leaks.py's
#    exact reference and object counts catch.  About a minute.
# 2. the suite (the command of `make test`, less SANITIZER_SKIPS) with detect_leaks=0: memory
#    errors and undefined behaviour everywhere, leaks not checked there.
# Measured on a 2-core machine, .ci/run on a clean clone: 38 minutes in all
# (setup and the side matrix environments' installs included), of which the
# pytest runs of `make test` 15, of the matrix 4, of this target 11.5.
# LEAPP_SANITIZED=1 tells the tests that measure RSS that ASan's quarantine
# holds freed memory.  The normal build is restored after.
SANITIZER_PRELOAD = $$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)
SANITIZER_ENV = LD_PRELOAD="$(SANITIZER_PRELOAD)" LEAPP_SANITIZED=1 LEAPP_EXPECT_ASSERTS=1
LEAK_CHECKED_ENV = $(SANITIZER_ENV) ASAN_OPTIONS=detect_leaks=1 PYTHONMALLOC=malloc \
	LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0
LEAK_CHECKED_TESTS = tests/c tests/test_leaks.py tests/test_lsan.py
# The sanitized run leaves out the files whose time goes to other processes or to
# torch's exporters, not to the core: the side-by-side runs under upstream (compat,
# upstream YAML / calls / parity, fuzz), the client libraries' exports, the
# exporter catalogue, the device script's CPU half, the wheel build, the view in
# Chromium (test_view.py, and test_ports.py's page in the browser: Chromium does not
# start under the preloaded ASan runtime) and the Triton server.  The core paths they
# reach are the ones the rest
# of the suite drives under the sanitizers; `make test` runs them all.
SANITIZER_SKIPS = $(addprefix --ignore=tests/,test_compat.py test_upstream_yaml.py \
	test_upstream_calls.py test_upstream_parity.py test_fuzz.py test_client_exports.py \
	test_export_catalogue.py test_device_script.py test_wheel.py test_view.py \
	test_triton.py) \
	--deselect=tests/test_ports.py::test_view_renders_the_catalogue_in_a_browser
test-asan: setup
	LEAPP_SANITIZE=1 $(PY) setup.py -q build_ext --inplace --force
	$(LEAK_CHECKED_ENV) $(PY) -m pytest -q -p no:warnings $(LEAK_CHECKED_TESTS) \
	&& $(SANITIZER_ENV) ASAN_OPTIONS=detect_leaks=0 $(PY) -m pytest -q -p no:warnings \
		$(SANITIZER_SKIPS) tests; \
	status=$$?; $(PY) setup.py -q build_ext --inplace --force; exit $$status

# A manylinux wheel in dist/ with libyaml bundled (auditwheel repair vendors it
# into leapp.libs/ and points the extension at it), and its end-to-end check:
# built, repaired, installed into a fresh venv, examples/getting_started.py run.
wheel: setup
	rm -rf build/wheel-raw
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
		-w build/wheel-raw .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist \
		build/wheel-raw/leapp-*.whl

test-wheel: setup
	LEAPP_TEST_WHEEL=1 $(PY) -m pytest -q -p no:warnings tests/test_wheel.py

bench: build
	$(PY) bench/run.py $(if $(UPSTREAM),--upstream $(UPSTREAM),)

# One-shot export scripts (W10): whole processes, ours against upstream in alternating
# pairs (ONESHOT_PAIRS of them); UPSTREAM defaults to $$LEAPP_UPSTREAM_PYTHON.
ONESHOT_PAIRS ?= 3
oneshot: build
	$(PY) bench/oneshot.py --pairs $(ONESHOT_PAIRS) $(if $(UPSTREAM),--upstream $(UPSTREAM),)

compat: build
	$(PY) bench/compat.py --setup

# Differential fuzzing against upstream 0.7.2 (bench/fuzz.py): FUZZ_N random
# annotated programs, each run under both packages and compared (outcome,
# error wording, YAML, replayed outputs).  `make test` runs a short fixed-seed
# run (tests/test_fuzz.py); this is the long one.  Needs .compat-venv
# (`make upstream-venv`) or LEAPP_UPSTREAM_PYTHON.
FUZZ_N ?= 500
FUZZ_SEED ?= 1
fuzz: build
	$(PY) bench/fuzz.py --n $(FUZZ_N) --seed $(FUZZ_SEED) $(if $(FUZZ_CASES),--save-cases $(FUZZ_CASES),)

# The two ONNX writers compared (bench/fuzz.py --writers): every node of FUZZ_N
# programs exported with onnx / onnx-dynamo, once by leapp's ONNX writer and once
# by torch's exporter (LEAPP_ONNX_WRITER=torch); no upstream needed.
fuzz-writers: build
	$(PY) bench/fuzz.py --writers --n $(FUZZ_N) --seed $(FUZZ_SEED) $(if $(FUZZ_CASES),--save-cases $(FUZZ_CASES),)

# PyTorch's op database through export_with="onnx" (bench/opinfo.py): every OpInfo
# sample (OPINFO_LIMIT per op and dtype, OPINFO_DTYPES) traced as one node, exported,
# and run in onnxruntime against eager on the sample, redrawn inputs and NaN / inf /
# -0.0 / large / integer-edge copies; three runs: ours, ours with torch's exporter for
# every node (LEAPP_ONNX_WRITER=torch), upstream 0.7.2 (.compat-venv, made here if
# missing, with expecttest, which torch.testing._internal imports).  The censuses go
# to $(OPINFO_OUT)/{ours,torch,upstream}.json, the three-way report to
# $(OPINFO_OUT)/report.md; docs/backends.md's section is
# `bench/opinfo.py --markdown ours.json torch.json upstream.json`.
# OPINFO_OPS=fmax,sort limits the run to those ops.  tests/test_opinfo.py runs the
# hard-case ops of it in `make test`.
OPINFO_OUT ?= build/opinfo
OPINFO_LIMIT ?= 2
OPINFO_DTYPES ?= float32,float16,int64,int32,bool
OPINFO_ARGS = --dtypes $(OPINFO_DTYPES) --limit-per-op $(OPINFO_LIMIT) --quiet \
	$(if $(OPINFO_OPS),--ops $(OPINFO_OPS),)
opinfo: build upstream-venv
	@.compat-venv/bin/python -c "import expecttest" 2>/dev/null || \
		.compat-venv/bin/python -m pip install -q --disable-pip-version-check \
		-c constraints.txt expecttest
	$(PY) bench/opinfo.py $(OPINFO_ARGS) --label ours --out $(OPINFO_OUT)/ours.json
	LEAPP_ONNX_WRITER=torch $(PY) bench/opinfo.py $(OPINFO_ARGS) --label "torch's exporter" \
		--out $(OPINFO_OUT)/torch.json
	$(PY) bench/opinfo.py $(OPINFO_ARGS) --python .compat-venv --label "upstream 0.7.2" \
		--out $(OPINFO_OUT)/upstream.json
	$(PY) bench/opinfo.py --compare $(OPINFO_OUT)/ours.json $(OPINFO_OUT)/torch.json \
		$(OPINFO_OUT)/upstream.json --report $(OPINFO_OUT)/report.md

# Upstream leapp 0.7.2 in .compat-venv (torch pinned as everywhere): with it,
# `make test` also runs the side-by-side compatibility tests.
upstream-venv: setup
	$(PY) -c "import sys; sys.path.insert(0, 'bench'); import compat; compat.setup_venv()"

clean:
	rm -rf build dist leapp/*.so *.egg-info
