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

.PHONY: setup build demo test test-asan test-wheel wheel bench compat upstream-venv clean

setup: $(STAMP)

# A fresh machine: libyaml headers, a venv, torch pinned to the CPU build, the
# package (editable, which compiles the C core) and its test dependencies.
$(STAMP): pyproject.toml setup.py constraints.txt
	@test -f /usr/include/yaml.h || (apt-get update -qq && apt-get install -y -qq libyaml-dev)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt setuptools wheel torch==2.13.0
	$(PIP) install -c constraints.txt --no-build-isolation -e '.[test]'
	# tritonserver for tests/test_triton.py: only the binary is used, so the wheel's
	# Python requirements (numpy<2 among them) are not installed
	$(PIP) install -c constraints.txt --no-deps nvidia-pytriton==0.7.0
	@mkdir -p build && touch $(STAMP) $(CORE_STAMP)

build: setup $(CORE_STAMP)

$(CORE_STAMP): $(STAMP) $(CORE_SOURCES)
	$(PY) setup.py -q build_ext --inplace
	@mkdir -p build && touch $@

demo: build
	$(PY) examples/getting_started.py

test: build
	$(PY) -m pytest -q -p no:warnings tests

# ASan + UBSan build of the core, then the whole suite (the command of
# `make test`, tests/c's reference-count checks included) under the sanitizers.
# Measured on a 2-core machine: the sanitized suite takes about 1.4 times as
# long as `make test` (11 minutes against 7.5; ~9 against the ~6 of an idle
# CI machine), so CI (.ci/run) stays well under 30 minutes with both, and no
# subset is needed.
# detect_leaks=0: LeakSanitizer reports CPython's and torch's intentional
# process-lifetime allocations; leaks of the core are caught by tests/c's
# reference-count checks and the GC/RSS slope tests.  LEAPP_SANITIZED=1 tells
# the tests that measure RSS that ASan's quarantine holds freed memory.
# The normal build is restored after.
SANITIZER_PRELOAD = $$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)
SANITIZER_ENV = LD_PRELOAD="$(SANITIZER_PRELOAD)" ASAN_OPTIONS=detect_leaks=0 LEAPP_SANITIZED=1
test-asan: setup
	LEAPP_SANITIZE=1 $(PY) setup.py -q build_ext --inplace --force
	$(SANITIZER_ENV) $(PY) -m pytest -q -p no:warnings tests; status=$$?; \
	$(PY) setup.py -q build_ext --inplace --force; exit $$status

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

compat: build
	$(PY) bench/compat.py --setup

# Upstream leapp 0.7.2 in .compat-venv (torch pinned as everywhere): with it,
# `make test` also runs the side-by-side compatibility tests.
upstream-venv: setup
	$(PY) -c "import sys; sys.path.insert(0, 'bench'); import compat; compat.setup_venv()"

clean:
	rm -rf build dist leapp/*.so *.egg-info
