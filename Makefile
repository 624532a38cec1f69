# resnet8ptq: `make sweep` sets up and runs the headline sweep, `make test` sets up and runs the tests.
# The Python the venv is made with (scripts/find-python finds it; PYTHON=/path names one): 3.12 by default, the
# version the lock is verified on; 3.11 and 3.13 work too.
PYTHON_VERSION ?= 3.12
VENV ?= .venv
BIN := $(VENV)/bin
DEPS := $(VENV)/.deps-installed
PROJECT := $(VENV)/.project-installed
HOST ?= 127.0.0.1
PORT ?= 5000

.PHONY: setup sweep grid test test-fast lint report bench ui lock check-pythons clean neurosim

setup: $(PROJECT)  ## create .venv with every dependency (exact versions from requirements.lock)

$(DEPS): requirements.lock
	test -x $(BIN)/python || { python=$$(scripts/find-python $(PYTHON_VERSION)) && $$python -m venv $(VENV); }
	$(BIN)/python -m pip install --upgrade --quiet "pip>=24"
	# uv installs the same pins several times faster (parallel downloads); pip when uv is not installed.
	# --compile-bytecode: the .pyc files pip writes by default; without them every new process (a run, a test's
	# CLI call, a launcher's job) compiles what it imports, ~1 s each here, more where PYTHONDONTWRITEBYTECODE is set.
	if command -v uv >/dev/null 2>&1; then uv pip install --compile-bytecode --python $(BIN)/python -r requirements.lock; \
	else $(BIN)/python -m pip install -r requirements.lock; fi
	$(BIN)/python -c "import matplotlib.pyplot"  # builds matplotlib's font cache now, not in the first sweep
	touch $@

# The project itself, editable: jobs started by launchers (submitit, joblib) import it from the venv.
$(PROJECT): $(DEPS) pyproject.toml
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	# The package's own .pyc files, as --compile-bytecode writes the dependencies': where PYTHONDONTWRITEBYTECODE
	# is set, each process would compile what it imports of the package again (~0.3 s a run on the AVX2 EPYC).
	$(BIN)/python -m compileall -q resnet8ptq explore
	touch $@

sweep: $(PROJECT)  ## the headline sweep: both backends x int8/uint8
	$(BIN)/python run.py -m backend=onnx,torch dtype=int8,uint8

grid: $(PROJECT)  ## every configuration of the three toolchains (38 runs; tflite skips what it cannot make)
	$(BIN)/python run.py -m backend=onnx,torch,tflite dtype=int8,uint8,u8s8 calib=minmax,entropy,percentile per_channel=false,true

test: $(PROJECT)  ## the whole test suite (needs CIFAR-10 + model: RESNET8PTQ_ASSETS, default ../shared)
	$(BIN)/python -m pytest -n auto --dist loadgroup  # every core; a module stays in one worker (tests/conftest.py)

test-fast: $(PROJECT)  ## the unit tier only: no data, no model, no subprocess (about 30 s)
	$(BIN)/python -m pytest tests/unit

neurosim: $(PROJECT)  ## opt-in: NeuroSim's ADC (CC BY-NC 4.0, non-commercial) for components.adc_model=neurosim
	scripts/install-neurosim $(BIN)/python

lint: $(PROJECT)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

report: $(PROJECT)  ## comparison report of the newest sweep (Markdown + HTML under its runs/ directory)
	$(BIN)/python -m resnet8ptq.report

bench: $(PROJECT)  ## benchmark figures (prints them)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/sweeps.py

# MLflow's usage telemetry off unless MLFLOW_DISABLE_TELEMETRY is set (the package does the same in Python).
ui: $(PROJECT)  ## MLflow UI for the runs tracked in this directory (mlflow.db + mlruns/)
	@echo "Runs table: http://$(HOST):$(PORT)/#/experiments?workflowType=machine_learning (then the experiment)"
	MLFLOW_DISABLE_TELEMETRY=$${MLFLOW_DISABLE_TELEMETRY:-true} $(BIN)/mlflow ui --host $(HOST) --port $(PORT)

# The run explorer (explore/runs.py, docs/explore.md): a marimo app over the tracking store; marimo and plotly
# are in requirements.lock (and the optional extra `explore`).
EXPLORE_PORT ?= 2718
TRACKING_URI ?= $(or $(MLFLOW_TRACKING_URI),sqlite:///mlflow.db)
.PHONY: explore
explore: $(PROJECT)  ## run explorer on http://$(HOST):$(EXPLORE_PORT) (TRACKING_URI=..., else MLFLOW_TRACKING_URI)
	MARIMO_SKIP_UPDATE_CHECK=1 $(BIN)/marimo run explore/runs.py --host $(HOST) --port $(EXPLORE_PORT) \
	    -- --tracking-uri "$(TRACKING_URI)"

lock:  ## regenerate requirements.lock from pyproject.toml in a scratch venv
	rm -rf .lock-venv && python=$$(scripts/find-python $(PYTHON_VERSION)) && $$python -m venv .lock-venv
	.lock-venv/bin/pip install --quiet ".[torch,dev,explore,mlperf-data]"
	{ head -2 requirements.lock; .lock-venv/bin/pip freeze --exclude-editable | grep -v '^resnet8ptq'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv
	scripts/sync-uv-lock  # uv.lock from the same pins (needs uv)

check-pythons:  ## pip install . and one quick run on each supported Python present (3.11-3.13); slow, downloads
	scripts/check-pythons

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
