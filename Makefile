# hcqr-dspy: every target sets up what it needs by itself on a fresh machine.
#   make demo   set up (default 1.5B model), build the demo index, run HCQR / CoT / Simple RAG on 10 of the 20 demo
#               questions and compare them; make demo DEMO_ARGS="--limit 20" runs all 20
#   make test   set up (smallest packaged model), check formatting and lint (ruff), build the docs site
#               (mkdocs --strict) and run the test suite (its layers test runs import-linter)
#   make docs   set up and serve the documentation site (mkdocs.yml, docs/) on http://127.0.0.1:8000
#   make bench  set up and write bench/results.json + bench/RESULTS.md: index builds at 1k, 10k and the full
#               shared corpus (~41k passages), retrieval latency, exact vs HNSW recall, and CoT / Simple RAG / HCQR
#               cost with the 0.5B model, cold and warm (about 1.5 hours on 2 cores);
#               make bench QUICK=1 measures the 1k slice only and skips the LM pipeline
#               (bench/scale.py and bench/milvus.py: faiss index types, query runtimes, the MedCorp extrapolation and
#               Milvus Lite / server vs faiss at the real ~41k and a synthetic 1M corpus; reuse the ~41k embeddings)
#               and raw llama.cpp prefill / generation rates per cached build variant and model (bench/lm.py),
#               then the product against raw llama.cpp per stage and the cost of 10 demo questions per method with
#               the 1.5B model (bench/lm_pipeline.py, about 20 minutes), each Simple RAG and CoT answer call
#               paired with raw llama.cpp on the same tokens (bench/lm_overhead.py, 10 questions, about 13 minutes),
#               HCQR and Simple RAG on each of 10 demo questions back to back with the 0.5B model, their wall-time
#               ratio with a paired interval (bench/lm_ratio.py, about 30 minutes on 2 cores),
#               and requests per minute of a served
#               program on MLflow's scoring server at 1, 8 and 32 questions a request (bench/serving.py, a minute),
#               and the memory and MLflow store growth of `hcqr eval` over 20,000 questions against the tests' stub LM
#               (bench/eval_memory.py; MEMORY_QUESTIONS=N for another count; about 50 min on 2 cores)
#   make bench-scale / bench-milvus / bench-lm / bench-serving / bench-memory   one of those sections alone (PAUSE=script: run `script stop|cont` around timed phases)
#   make setup-milvus-server  a real Milvus 2.3.5 standalone server (PyPI's `milvus` package) in its own
#               virtualenv $(MILVUS_VENV), for the tests and the benchmark (make test does this)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMPS := $(VENV)/.stamps
# llama-cpp-python has no binary wheel on PyPI: it is compiled once per machine and build variant (4-9 min) and
# the wheel kept in $(HCQR_CACHE)/wheels-<variant> for later setups and CI runs. hcqr_dspy/lm/llama_builds.py picks
# the fastest variant the CPU has (AVX-512 where present, else portable AVX2) and keeps it only if every installed
# packaged model decodes a multi-token prompt through it; HCQR_LLAMA_BUILD=portable forces the portable one.
# Its `server` extra (pure Python: uvicorn, fastapi, sse-starlette, starlette-context, pydantic-settings) is installed
# beside the build: the installed llama-cpp-python satisfies the pin, so pip adds the extra's packages only and never
# builds again. It serves a local judge LM to MLflow's judges (hcqr judge --mlflow-scorers).
LLAMA_CPP_VERSION := 0.3.36
# PyPI's `milvus` package ships a real Milvus standalone server; its launcher needs these pins, which
# clash with the product's pymilvus 3.x, hence its own virtualenv. The binary is unpacked there once.
MILVUS_VENV ?= .venv-milvus
MILVUS_SERVER_PINS := 'milvus==2.3.5' 'marshmallow<4' 'environs<10' 'pymilvus<2.4'

export HF_HUB_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-llm setup-model-135m setup-model-0p5b setup-model-1p5b setup-milvus-server test docs demo bench bench-scale bench-milvus bench-lm bench-serving bench-memory clean

setup: $(STAMPS)/base
$(STAMPS)/base: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0 -e '.[dev]'
	@mkdir -p $(STAMPS) && touch $@

setup-llm: $(STAMPS)/llm
$(STAMPS)/llm: $(STAMPS)/base
	$(PY) -m hcqr_dspy.lm.llama_builds setup --version $(LLAMA_CPP_VERSION)
	$(PIP) install --quiet 'llama-cpp-python[server]==$(LLAMA_CPP_VERSION)'
	@touch $@

setup-model-135m: $(STAMPS)/model-135m
setup-model-0p5b: $(STAMPS)/model-0p5b
setup-model-1p5b: $(STAMPS)/model-1p5b
$(STAMPS)/model-%: $(STAMPS)/llm
	$(PIP) install --quiet -e '.[model-$*]'
	$(PY) -m hcqr_dspy.lm.llama_builds verify --version $(LLAMA_CPP_VERSION)
	@touch $@

setup-milvus-server: $(MILVUS_VENV)/.stamps/server
$(MILVUS_VENV)/.stamps/server: Makefile
	@test -x $(MILVUS_VENV)/bin/python || $(PYTHON) -m venv $(MILVUS_VENV)
	$(MILVUS_VENV)/bin/python -m pip --disable-pip-version-check install --quiet $(MILVUS_SERVER_PINS)
	$(MILVUS_VENV)/bin/python -c "import milvus; milvus._initialize_data_files('$(MILVUS_VENV)/server')"
	@mkdir -p $(@D) && touch $@

# pytest-xdist: one worker more than the cores (at most 4), each test file kept on one worker (--dist loadfile),
# so a file's session fixtures (the Milvus server, the encoded Pathoma corpus) start once. Many tests wait rather
# than compute (MLflow's trace-export flushes, servers starting, a Milvus restart for its port to leave
# TIME_WAIT): on 2 cores, pytest took 852 s with 3 workers (169% CPU by `/usr/bin/time`) against 1,325 s with 2.
DEFAULT_TEST_WORKERS = $(shell n=$$(nproc); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
# TEST_WORKERS=N sets the count; left out or blank (TEST_WORKERS=), the default
TEST_WORKERS_N = $(or $(strip $(TEST_WORKERS)),$(DEFAULT_TEST_WORKERS))
# --no-loadscope-reorder: files in collection order, where tests/conftest.py puts the files marked slow first
# (xdist's own order, most tests first, left a one-test file of minutes running alone at the end).
# --durations: the 25 slowest tests close the output, to see where a slower machine spends the suite's time.
test: setup-model-135m setup-milvus-server
	$(VENV)/bin/ruff format --check hcqr_dspy tests bench
	$(VENV)/bin/ruff check hcqr_dspy tests bench
	$(VENV)/bin/mkdocs build --strict --site-dir build/site
	$(PY) -m pytest -q -n $(TEST_WORKERS_N) --dist loadfile --no-loadscope-reorder --durations=25

docs: setup
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

demo: setup-model-1p5b
	$(VENV)/bin/hcqr demo $(DEMO_ARGS)

bench: setup-model-0p5b setup-model-1p5b setup-milvus-server
ifdef QUICK
	$(PY) bench/retrieval.py --quick --out bench/quick/results.json
	$(PY) bench/scale.py --quick --out bench/quick/results.json $(PAUSE_ARG)
	$(PY) bench/milvus.py --quick --out bench/quick/results.json $(PAUSE_ARG)
	@echo "bench: QUICK=1: small slices only, LM pipeline skipped; wrote bench/quick/ (the full results are untouched)"
else
	$(PY) bench/retrieval.py
	$(PY) bench/scale.py $(PAUSE_ARG)
	$(PY) bench/milvus.py $(PAUSE_ARG)
	$(PY) bench/pipeline.py
	$(PY) bench/lm.py
	$(PY) bench/lm_pipeline.py
	$(PY) bench/lm_overhead.py
	$(PY) bench/lm_ratio.py
	$(PY) bench/serving.py
	$(PY) bench/eval_memory.py --questions $(MEMORY_QUESTIONS)
endif

PAUSE_ARG := $(if $(PAUSE),--pause-study $(PAUSE))
bench-scale: setup
	$(PY) bench/scale.py $(PAUSE_ARG)

bench-lm: setup-model-1p5b setup-model-0p5b
	$(PY) bench/lm.py
	$(PY) bench/lm_pipeline.py
	$(PY) bench/lm_overhead.py
	$(PY) bench/lm_ratio.py

bench-serving: setup
	$(PY) bench/serving.py

MEMORY_QUESTIONS ?= 20000
bench-memory: setup
	$(PY) bench/eval_memory.py --questions $(MEMORY_QUESTIONS)

bench-milvus: setup setup-milvus-server
	HCQR_MILVUS_SERVER_VENV=$(abspath $(MILVUS_VENV)) $(PY) bench/milvus.py $(PAUSE_ARG)

clean:
	rm -rf $(VENV) $(MILVUS_VENV) .pytest_cache build *.egg-info
