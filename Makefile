# Two commands on a fresh machine with only Python and pip:
#   make compare   set up .venv, install xbench with both frameworks, compare tf and jax
#   make test      the same set-up plus the test tools, then the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?= --backends tf jax

.PHONY: compare test setup setup-dev clean

compare: $(VENV)/.installed-all
	$(BIN)/xbench compare $(ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

setup: $(VENV)/.installed-all
setup-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-all: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[all,dev]"
	touch $@ $(VENV)/.installed-all

clean:
	rm -rf $(VENV) *.egg-info
