# CXR-LT Lab. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TASK ?= task1
ARGS ?=
PORT ?= 5000
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
# The one resolution of the MLflow store (MLFLOW_TRACKING_URI > sqlite:///mlruns/mlflow.db), shared with the code.
TRACKING_URI = $(PY) -m training.tracking.uri

.DEFAULT_GOAL := help
# Recipes are not echoed: a command line can carry a secret (ARGS="+model.hub_token=...", STORAGE=<url with a
# password>) and terminal output ends up in shared job logs. `make V=1 <target>` shows them; `make -n` still prints.
ifndef V
.SILENT:
endif
.PHONY: help setup prepare data-check train crt compare evaluate score tune optuna-dashboard register serve submit ensemble pseudo-label benchmark benchmarks-extra card dicom-balance ui server test test-e2e test-realdata test-presets test-slow test-server lint format bench bench-scale clean

help: ## Show this help
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $@

setup: $(STAMP) ## Create .venv and install the core (idempotent; instant when up to date)

# The benchmark-only packages (pyproject's `benchmarks` extra): installed by the first make benchmark or make card.
$(VENV)/.benchmarks: $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[benchmarks]"
	@touch $@

benchmarks-extra: $(VENV)/.benchmarks ## Install the benchmark-only packages now (CI does, before make test)

train: setup ## Train and test one model, tracked in MLflow: make train TASK=task1 ARGS="model=resnet18 loss=bce"
	$(PY) -m training.train task=$(TASK) $(ARGS)

crt: setup ## Classifier re-training on a finished run's frozen backbone: make crt RUN=<run id> [ARGS=...]
	@test -n "$(RUN)" || { echo "usage: make crt RUN=<first-stage run id> [TASK=task1] [ARGS=...]"; exit 2; }
	$(PY) -m training.train task=$(TASK) stage=crt stage.parent_run=$(RUN) $(ARGS)

LOSSES ?= bce asl ldam db
SEEDS ?= 3
comma := ,
space := $(eval) $(eval)
empty :=
space := $(empty) $(empty)
compare: setup ## Which run is really better (paired bootstrap, Holm): make compare RUNS="<run id> models:/cxrlt-task1@champion <grid tag> ..." [ARGS="--n-boot 20000"]; without RUNS, trains a grid of losses x seeds first: make compare TASK=task1 LOSSES="bce asl" SEEDS=3 [ARGS=debug=smoke]
ifneq ($(strip $(RUNS)),)
	$(PY) -m apps.compare $(foreach r,$(RUNS),'$(r)') $(ARGS)
else
	$(eval GRID := $(TASK)-$(shell date +%Y%m%d-%H%M%S))
	$(PY) -m training.train -m task=$(TASK) loss=$(subst $(space),$(comma),$(strip $(LOSSES))) \
		seed=$(shell seq -s, 0 $$(($(SEEDS)-1))) +tags.grid=$(GRID) trainer.enable_progress_bar=false $(ARGS)
	$(PY) -m apps.compare --experiment $(TASK) --grid $(GRID) --by loss.name
endif

evaluate: setup ## Re-evaluate a finished run into itself: make evaluate RUN=<run id> [ARGS="tta=multicrop"]
	@test -n "$(RUN)" || { echo "usage: make evaluate RUN=<run id> [ARGS=...]"; exit 2; }
	$(PY) -m apps.evaluate run=$(RUN) $(ARGS)

score: setup ## Score a predictions CSV: make score PREDICTIONS=preds.csv MANIFEST=<manifest | label table in the organisers' layout> [SPLIT=test] [DATA=cxrlt2026]; concept tasks: PREDICTIONS=<run file> MANIFEST=<ID,CUIs table> [MANUAL=<manual table>] [NAMES=cui_mapping.csv]
	$(PY) -m apps.score $(PREDICTIONS) $(MANIFEST) --split $(or $(SPLIT),test) --task $(TASK) \
		$(if $(filter command line environment,$(origin DATA)),--data $(DATA)) \
		$(if $(MANUAL),--manual '$(MANUAL)') $(if $(NAMES),--names '$(NAMES)') $(if $(SECONDARY),--secondary $(SECONDARY))

TRIALS ?= 20
SEARCH ?= default
PRUNER ?= median
# OBJECTIVES="a b" -> tune.objectives=["a","b"], in a study of its own unless STUDY is given: <task>-<search>-pareto
OBJECTIVE_LIST = [$(subst $(space),$(comma),$(patsubst %,"%",$(strip $(OBJECTIVES))))]
comma := ,
space := $(eval) $(eval)
tune: setup ## Optuna study, each trial a nested tracked run: make tune TASK=task1 TRIALS=20 [SEARCH=default] [PRUNER=median|hyperband|aggressive|none] [STORAGE=<rdb url>] [STUDY=<name>] [OBJECTIVES="val/mAP val/group/rare/mAP"] [ARGS=...]
	$(PY) -m training.tune task=$(TASK) tune.trials=$(TRIALS) hparams_search=$(SEARCH) pruner=$(PRUNER) \
		$(if $(STORAGE),'tune.storage="$(STORAGE)"') $(if $(STUDY),'tune.study="$(STUDY)"') \
		$(if $(strip $(OBJECTIVES)),'tune.objectives=$(OBJECTIVE_LIST)' $(if $(STUDY),,'tune.study="$(TASK)-$(SEARCH)-pareto"')) $(ARGS)

DASHBOARD_PORT ?= 8080
optuna-dashboard: setup ## Optuna's dashboard on the study storage, http://127.0.0.1:8080: make optuna-dashboard [STORAGE=<rdb url>] [DASHBOARD_PORT=8080]
	@test -n "$(STORAGE)" -o -f mlruns/optuna.db || { echo "make optuna-dashboard: no study yet in mlruns/optuna.db; run make tune first (or give STORAGE=<rdb url>)" >&2; exit 2; }
	$(VENV)/bin/optuna-dashboard '$(or $(STORAGE),sqlite:///mlruns/optuna.db)' --host 127.0.0.1 --port $(DASHBOARD_PORT)

register: setup ## Register the best finished run as cxrlt-<task>@champion: make register TASK=task1 [METRIC=<the task's selection_metric>] [RUN=<id>]
	$(PY) -m apps.registry --task $(TASK) $(if $(METRIC),--metric '$(METRIC)') $(if $(RUN),--run $(RUN)) $(ARGS)

serve: setup ## Serve the champion over REST on 127.0.0.1:5000 (the model checked first): make serve TASK=task1 [PORT=5001] [MODEL=models:/...] [IMAGE_ROOT=<folder requests may name images under; default none, image_b64 only>] [MAX_REQUEST_MB=32]
	$(PY) -m apps.serve --model '$(or $(MODEL),models:/cxrlt-$(TASK)@champion)' --port $(PORT) $(if $(IMAGE_ROOT),--image-root '$(IMAGE_ROOT)') $(if $(MAX_REQUEST_MB),--max-request-mb $(MAX_REQUEST_MB))

# The line as typed, for the upload's code/COMMAND.txt.
submit: export CXRLT_SUBMIT_COMMAND = make submit $(strip TASK=$(TASK) $(foreach v,MODEL TEMPLATE MANIFEST ROOT TTA OUT ID_COLUMN THRESHOLDS,$(if $(strip $($(v))),$(v)="$(strip $($(v)))")))
submit: setup ## Validated upload zip (the CSV in the organisers' format + code/; ImageCLEF run file for concept tasks): make submit TASK=task1 [TEMPLATE=CXRLT_2026_TEST_ALL_TASK1.csv] [MODEL="models:/cxrlt-task1@champion <run id> ..."] [TTA=default] [MANIFEST=m.csv ROOT=dir] [OUT=f.zip|f.csv] [ID_COLUMN=dicom_id] [THRESHOLDS=global|per_class]
	$(PY) -m apps.submit_cli --task $(TASK) $(foreach m,$(MODEL),--model '$(m)') $(if $(TEMPLATE),--template '$(TEMPLATE)') \
		$(if $(MANIFEST),--manifest '$(MANIFEST)') $(if $(ROOT),--root '$(ROOT)') $(if $(TTA),--tta $(TTA)) $(if $(OUT),--out '$(OUT)') \
		$(if $(ID_COLUMN),--id-column '$(ID_COLUMN)') $(if $(THRESHOLDS),--thresholds $(THRESHOLDS))

ensemble: setup ## Weights fitted on validation for several finished runs, logged as a run: make ensemble TASK=task1 MODELS="<ref> <ref> ..." [WEIGHTS=per_model|per_class|mean]; then make submit MODEL=ensemble:<run id>
	@test -n "$(strip $(MODELS))" || { echo 'usage: make ensemble TASK=task1 MODELS="<run id|models:/...> <...>" [WEIGHTS=per_model|per_class|mean]'; exit 2; }
	$(PY) -m apps.ensemble_cli --task $(TASK) $(foreach m,$(MODELS),--model '$(m)') $(if $(WEIGHTS),--weighting '$(WEIGHTS)') $(ARGS)

pseudo-label: setup ## A finished run fills another manifest's empty cells: make pseudo-label MODEL=<run id|models:/...> MANIFEST=m.csv ROOT=<image dir> OUT=new.csv [THRESHOLDS=per_class|global] [MARGIN=0.1] [SPLITS="train val"] [EXTRA_COLUMNS="age sex"]; then make train ARGS="data=pseudo_labelled data.source.manifest=new.csv"
	@test -n "$(MODEL)" -a -n "$(MANIFEST)" -a -n "$(OUT)" || { echo 'usage: make pseudo-label MODEL=<run id|models:/...> MANIFEST=<manifest> ROOT=<image dir> OUT=<new manifest> [THRESHOLDS=per_class|global] [MARGIN=0.1] [SPLITS="train"] [EXTRA_COLUMNS="age sex"]'; exit 2; }
	$(PY) -m apps.pseudo_label --model '$(MODEL)' --manifest '$(MANIFEST)' --out '$(OUT)' $(if $(ROOT),--root '$(ROOT)') \
		$(if $(THRESHOLDS),--thresholds $(THRESHOLDS)) $(if $(MARGIN),--margin $(MARGIN)) $(if $(strip $(SPLITS)),--splits $(SPLITS)) $(if $(strip $(EXTRA_COLUMNS)),--extra-columns $(EXTRA_COLUMNS)) $(ARGS)

NAME ?=
VERSION ?=
benchmark: $(VENV)/.benchmarks ## Benchmark a model (no NAME: list the protocols): make benchmark NAME=<name> MODEL=<run id|models:/name@alias|clip:spec> DATA_ROOT=<dir> [VERSION=<version>]
	@if [ -z "$(NAME)" ]; then $(PY) -m apps.benchmarks.cli $(ARGS); \
	else $(PY) -m apps.benchmarks.cli --name '$(NAME)' $(if $(MODEL),--model '$(MODEL)') \
		$(if $(DATA_ROOT),--data-root '$(DATA_ROOT)') $(if $(VERSION),--version '$(VERSION)') $(ARGS); fi

CARD ?=
card: $(VENV)/.benchmarks ## Model card across every configured benchmark, logged to the model's run: make card MODEL=<run id|models:/name/version|models:/name@alias> [CARD=configs/card.yaml]
	$(PY) -m apps.benchmarks.card_cli $(if $(MODEL),--model '$(MODEL)') $(if $(CARD),--card '$(CARD)') $(ARGS)

dicom-balance: setup ## Acquisition balance of a reader study's subsets (Pearson's chi-square on DICOM tags): make dicom-balance DATA_ROOT=<dir> [NAME=reveal] [BY=subset]
	$(PY) -m apps.benchmarks.reveal.balance_cli --name '$(or $(NAME),reveal)' --data-root '$(DATA_ROOT)' --by '$(or $(BY),subset)' $(ARGS)

# One reader needs one web worker and none of the job runner (GenAI evaluation jobs: a dozen processes, ~2 GB);
# MLflow's own MLFLOW_WORKERS and MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true ask for them.
UI_ENV = MLFLOW_WORKERS=$${MLFLOW_WORKERS:-1} MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
ui: setup ## MLflow UI, opening on the training runs: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning (PORT=...)
	echo "MLflow UI: http://127.0.0.1:$(PORT)/#/experiments?workflowType=machine_learning"
	echo "(an experiment opens on MLflow's GenAI pages until 'Model training' is picked in the sidebar; the browser keeps it)"
	$(UI_ENV) $(VENV)/bin/mlflow ui --backend-store-uri "$$($(TRACKING_URI))" --host 127.0.0.1 --port $(PORT)

HOST ?= 127.0.0.1
PG_PORT ?= 5432
SERVER_DIR ?= mlruns/server
server: setup ## Team tracking server: PostgreSQL + basic auth + served artifacts: MLFLOW_ADMIN_PASSWORD=... make server [HOST=127.0.0.1] [PORT=5000] [PG_PORT=5432] [DATABASE_URL=postgresql://mlflow@db-host/mlflow] [ARTIFACTS=/srv/mlflow-artifacts] [AUTH_CACHE_TTL=60]
	@test -n "$$MLFLOW_ADMIN_PASSWORD" || { echo "make server: export MLFLOW_ADMIN_PASSWORD (the admin's password; never put it in a file of the repository)" >&2; exit 2; }
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m training.tracking.server --host $(HOST) --port $(PORT) --pg-port $(PG_PORT) \
		--dir $(SERVER_DIR) $(if $(DATABASE_URL),--database-url '$(DATABASE_URL)') $(if $(ARTIFACTS),--artifacts '$(ARTIFACTS)') \
		$(if $(AUTH_CACHE_TTL),--auth-cache-ttl $(AUTH_CACHE_TTL))

# pytest workers (pytest-xdist) for the suites: their tests spend much of their time in one-threaded imports,
# subprocess start-up and file I/O, so two workers on two cores finish before one; each worker's torch uses one
# thread (tests/conftest.py). A test file stays on one worker, so its module fixtures (a trained run, a study) are
# built once. TEST_WORKERS=0 runs a suite in one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile
test: setup ## Fast default test suite (no slow, real-data or GPU tests)
	$(PY) -m pytest $(XDIST)

test-e2e: setup ## The real commands end to end on CPU (trainings, tuning, make on trained runs); CI runs them after make test
	$(PY) -m pytest $(XDIST) -m 'e2e and not slow and not realdata and not gpu and not server and not browser and not presets'

test-realdata: setup ## Tests on the real radiographs in ../shared/data
	$(PY) -m pytest $(XDIST) -m realdata

# One file of independent preset trainings: spread test by test, not file by file.
test-presets: setup ## Every configs/experiment preset trained at smoke size on CPU (experiment=<name> debug=smoke)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist load -m presets tests/presets

test-slow: setup ## Slow tests (full-size training runs)
	$(PY) -m pytest -m slow

# One file too, but its tests wait on servers and workers much of the time: each worker starts its own throwaway
# PostgreSQL cluster and MLflow server (a module fixture) and takes tests one by one.
test-server: setup ## Team-server tests: throwaway PostgreSQL + mlflow server with auth, tuning workers, outages
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -n $(TEST_WORKERS) --dist load -m server

lint: setup ## Ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

DATA ?= synthetic
DATA_ARGS = data=$(DATA) $(if $(DATA_ROOT),data.root=$(DATA_ROOT)) $(if $(SIZE),data.image_size=$(SIZE))
prepare: setup ## Decode every image once into the cache: make prepare DATA=nih14 DATA_ROOT=/path SIZE=224
	$(PY) -m training.prepare $(DATA_ARGS) $(ARGS)

data-check: setup ## Counts, groups, patients, overlaps, unreadable files: make data-check DATA=nih14 DATA_ROOT=/path
	$(PY) -m training.data_check $(DATA_ARGS) $(ARGS)

bench: setup ## Benchmarks, printing ratios measured side by side in one run (bench_gpu: on CUDA only, else says why it skipped)
	$(PY) tests/bench/bench_throughput.py
	$(PY) tests/bench/bench_metrics.py
	$(PY) tests/bench/bench_loader.py
	$(PY) tests/bench/bench_gpu.py
	$(PY) tests/bench/bench_cli.py
	$(PY) tests/bench/bench_store.py

bench-store: setup ## A store of 300 finished runs: make register, make compare and the Headline view's REST calls as ratios to search_runs (filled once into /tmp/cxrlt-bench-store): make bench-store [ARGS="--runs 300"]
	$(PY) tests/bench/bench_store.py $(ARGS)

bench-scale: setup ## Each stage at 10k, 40k and full size of a rehearsal release built from ../shared/data's real tables (minutes; docs/scaling.md)
	$(PY) tests/bench/bench_scale.py $(ARGS)

clean: ## Remove generated data, working checkpoints and caches (keeps the MLflow store and .venv)
	rm -rf data/synthetic mlruns/checkpoints .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -not -path './.venv/*' -prune -exec rm -rf {} +
