# Two commands: `make demo` (a whole swarm on this machine) and `make test` (the whole suite).
# Both create .venv with Python 3.11 and install the project into it first.
#
# torch is installed before the project, pinned, because an unpinned torch pulls a CUDA build of several GB.
# On a GPU machine pick your build:  make demo TORCH="torch==2.5.1" PIP_TORCH_FLAGS="--index-url <your CUDA index>"

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
PIP_TORCH_FLAGS ?=
PYTEST_FLAGS ?=
# e.g. make demo DEMO_ARGS="--duration 1800 --nodes 2": a longer demo (cotrain demo --help lists the options)
DEMO_ARGS ?=

.PHONY: demo test test-fast coverage protos docs bench clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/python
	@# the venv's own pip when it is 23 or later (it installs the project editable); an older one is upgraded first
	$(BIN)/python -c "import pip, sys; sys.exit(int(pip.__version__.split('.')[0]) < 23)" || \
	  $(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_TORCH_FLAGS) "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/cotrain demo $(DEMO_ARGS)

# the whole suite as CI runs it: test files spread over two workers (a file's tests stay together: some share a
# module's swarm or network namespaces), the files with the most swarm tests dealt first (tests/conftest.py)
test: $(VENV)/.installed browser
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_FLAGS)

# the edit loop: everything that starts no swarm (pure logic, codecs, config, protocol, models)
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not swarm" -q $(PYTEST_FLAGS)

# line coverage of the data plane (src/cotrain/averaging) by the edit loop's tests alone
coverage: $(VENV)/.installed
	$(BIN)/python -m coverage run --source=src/cotrain/averaging -m pytest -m "not swarm" -q $(PYTEST_FLAGS)
	$(BIN)/python -m coverage report --sort=cover

# the dashboard test drives Debian's chromium headless; install it where we may (root, as in CI)
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the dashboard's browser test will be skipped"; }

protos: $(VENV)/.installed
	$(BIN)/python protos/generate.py

# docs/config.md from src/cotrain/config.py (its fields, defaults and `#:` comments); tests/test_docs.py fails when stale
docs: $(VENV)/.installed
	$(BIN)/python -m cotrain.config_docs

clean:
	rm -rf $(VENV) cotrain-demo .pytest_cache
