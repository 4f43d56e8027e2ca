# Quick start: `make demo` then `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/demo
# Without a GPU, take the CPU build of torch (a plain `torch` would pull a multi-GB CUDA build).
# pip finds torch 2.13.0+cpu in the machine's local wheel folder; elsewhere point TORCH_INDEX at a
# CPU wheel index (pip's --extra-index-url).
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC ?= $(if $(HAS_GPU),torch==2.13.0,torch==2.13.0+cpu)
TORCH_INDEX ?=
EXTRAS := test$(if $(HAS_GPU),$(comma)gpu)
comma := ,
FRAMEWORKS := verl==0.9.1 openrlhf==0.11.2 sglang==0.5.23

.PHONY: venv sysdeps demo lint test test-slow test-notebooks test-all test-fast notebooks bench golden clean

# The code sandbox isolates generated code with bubblewrap when it is installed (else with
# util-linux `unshare`); as root with apt-get, install it. Cheap when present, so every build runs it.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
	      || echo "sysdeps: could not install bubblewrap; the sandbox will use unshare"; \
	  else \
	    echo "sysdeps: bubblewrap not installed (needs root and apt-get); the sandbox will use unshare"; \
	  fi; }

venv: $(STAMP)
$(STAMP): pyproject.toml | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	# verl's and OpenRLHF's own config files and argument parser validate `placer export` in the
	# tests, SGLang's source the sglang backend's API contract (tests/test_exec_sglang_config.py);
	# their dependencies (CUDA builds, vLLM, DeepSpeed) are not needed to read them.
	$(PY) -m pip install -q --no-deps $(FRAMEWORKS)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m workflows.demo --out $(OUT)

# ruff (rules in pyproject.toml), the import-linter contracts (the layers, docs/architecture.md)
# and mypy over the packages; `make test` fails on any of them.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy

# Every part, Ray and notebooks included; the few `slow` tests (node join, the five-node placement
# check, cost objective on the large examples, the larger pipeline layouts, the Ray twins of local
# executor tests, the second and third notebooks) run with `make test-slow` or `make test-all`;
# `make test-notebooks` runs the two notebooks `make test` leaves out (CI runs it after `make test`).
# --durations=25: the log ends with the 25 slowest set-ups, calls and tear-downs, to see where time goes.
# Two pytest-xdist workers (TEST_WORKERS): the Ray tests run one after another on one of them
# (xdist group "ray", tests/conftest.py) while the other takes the rest; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadgroup --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

test-notebooks: $(STAMP)
	$(PY) -m pytest -q -m "slow and notebook"

test-all: lint
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not notebook"

# Executes every notebook as a user would (`jupyter nbconvert --to notebook --execute`) on a kernel
# of this venv's interpreter, into a new temporary folder: the executed copies and the files the
# notebooks write go there (its path is printed); the stripped sources in notebooks/ stay as they are.
notebooks: $(STAMP)
	@d=$$(mktemp -d "$${TMPDIR:-/tmp}/placer-notebooks.XXXXXX") && \
	$(PY) -m ipykernel install --name python3 --prefix "$$d/kernel" >/dev/null && \
	JUPYTER_PATH="$$d/kernel/share/jupyter" PLACER_NOTEBOOK_OUT="$$d/files" \
	  $(PY) -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 \
	  --output-dir "$$d" notebooks/*.ipynb && \
	echo "executed notebooks: $$d/*.ipynb; their figures and files: $$d/files"

bench: $(STAMP)
	$(PY) -m bench

golden: $(STAMP)
	$(PY) -m simulator.golden --write

clean:
	rm -rf out .pytest_cache
