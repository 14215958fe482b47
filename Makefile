# Two commands on a fresh machine with only Python and pip:
#   make compare   set up .venv, install xbench with both frameworks, compare tf and jax
#   make test      the same set-up plus torch (CPU) and the test tools, then lint, types, tests
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?= --backends tf jax
# The tests run torch on the CPU: this pin takes the CPU build where pip has it locally
# (a bare `torch` would pull a multi-GB CUDA build). Override with TORCH= to skip it.
TORCH  ?= torch==2.13.0

.PHONY: compare test check setup setup-dev clean

compare: $(VENV)/.installed-all
	$(BIN)/xbench compare $(ARGS)

# Lint and types first (seconds), then the tests in two pytest-xdist workers that compute
# (TEST_WORKERS=1: one process) and a third, the waiting lane, for the tests that mostly wait on a
# bound (a hung worker's timeout) with the cores idle (tests/conftest.py's WAITING). Each module's
# tests run in one worker, so that its module fixture (a real run, children that train) runs
# once (--dist loadfile's units: under pytest 9, pytest-xdist 3.8's loadgroup no longer sees
# groups). Modules start in the order tests/conftest.py's LONGEST_FIRST gives (the longest first;
# tests/unit's quick ones last), not xdist's default (by test count), so the progress percentage
# lags the time. Measured on a fresh clone of the 2-core machine, idle: 1,744 passed in 17.7 min
# (1,063 s) with two workers, both cores busy for 94 % of it; a third worker that computes too
# was slower. With the waiting lane (2026-12-05): 1,004 s and 1,064 s in two runs, against 1,080 s
# for two workers without it right after the second: the suite is CPU-bound, and the lane fills
# only the cores' idle time (these with the frameworks' own thread pools). One thread per framework
# operation (tests/conftest.py), measured (2026-12-06) while the machine ran ~1.6x slower than
# at its best: 1,418 s and 1,446 s against 1,682 s without it. pytest-xdist is held below
# 4: the lane's scheduler extends its LoadFileScheduling (tests/support/waiting_lane.py). The
# slowest tests are listed at the end.
TEST_WORKERS ?= 2  # the workers that compute, a number (the lane comes on top; 1: one process, no lane)
test: $(VENV)/.installed-dev
	$(BIN)/ruff check --quiet xbench backends tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(shell expr $(TEST_WORKERS) + 1) --dist loadfile \
		--no-loadscope-reorder --waiting-lane) \
		--durations=15 $(PYTEST_ARGS)

# The inner loop: lint, types and tests/unit, which start no process and import no framework
# (tests/unit/conftest.py holds them to it), spread over TEST_WORKERS pytest-xdist workers: on the
# 2-core machine (2026-12-07, a slow day) 35 s of tests with two workers, against 74 s in one.
check: $(VENV)/.installed-dev
	$(BIN)/ruff check --quiet xbench backends tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest tests/unit $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

setup: $(VENV)/.installed-all
setup-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# A regular (not editable) install, redone whenever a source file changes: setuptools warns
# about every editable install of this layout (backends/ installs as xbench_backends, with one
# subpackage per framework: backends/jax, backends/tf, backends/torch).
SOURCES := pyproject.toml $(shell find xbench backends -name '*.py' 2>/dev/null)

$(VENV)/.installed-all: $(BIN)/python $(SOURCES)
	$(BIN)/python -m pip install --quiet ".[all]"
	touch $@

$(VENV)/.installed-dev: $(BIN)/python $(SOURCES)
	$(if $(TORCH),$(BIN)/python -m pip install --quiet "$(TORCH)")
	$(BIN)/python -m pip install --quiet ".[all,dev]"
	touch $@ $(VENV)/.installed-all

clean:
	rm -rf $(VENV) *.egg-info build
