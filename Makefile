# retrieval-monitor: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv demo demo-golden test quick faults fault-schedule check lint typecheck unit bench bench-audit bench-detector-week clean kafka-up kafka-down monitoring-tools monitoring-check monitoring-up monitoring-down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python -m compileall -q service  # (as pip does for a wheel; where PYTHONDONTWRITEBYTECODE is set, each command would compile the package anew)
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install the package with its test dependencies

demo: $(STAMP) ## the live pipeline and HTTP server on simulated traffic with a bad deploy, rolled back near the end (no Kafka; Ctrl-C stops)
	$(BIN)/retrieval-monitor demo

demo-golden: $(STAMP) ## evaluate and compare the example golden set shipped in examples/golden
	$(BIN)/retrieval-monitor evaluate --qrels examples/golden/qrels.jsonl --run examples/golden/run_hybrid_v7.jsonl
	@echo
	$(BIN)/retrieval-monitor compare --qrels examples/golden/qrels.jsonl examples/golden/run_hybrid_v7.jsonl examples/golden/run_dense_v8.jsonl

test: $(STAMP) lint typecheck monitoring-tools ## the whole test suite: lint, types, unit and integration tests against a real Kafka, Prometheus and Alertmanager
	@started=0; bash deploy/local/kafka/kafka.sh reachable || { $(MAKE) --no-print-directory kafka-up && started=1; } || exit 1; \
	$(BIN)/pytest -q; rc=$$?; \
	if [ $$started = 1 ]; then $(MAKE) --no-print-directory kafka-down; fi; exit $$rc

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check service tests examples
	$(BIN)/ruff format --check service tests examples

typecheck: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

faults: $(STAMP) ## the reliability fault suite alone, REPEAT times in a row (default 1), against the local Kafka
	@started=0; bash deploy/local/kafka/kafka.sh reachable || { $(MAKE) --no-print-directory kafka-up && started=1; } || exit 1; \
	rc=0; for i in $$(seq $${REPEAT:-1}); do echo "fault suite, run $$i"; $(BIN)/pytest -q -m faults || { rc=1; break; }; done; \
	if [ $$started = 1 ]; then $(MAKE) --no-print-directory kafka-down; fi; exit $$rc

fault-schedule: $(STAMP) ## Jepsen-style runs: RUNS (20) runs of FAULTS (8) broker faults of mixed kinds on a private broker during a live stream, service kill -9s in half (figures: docs/reliability.md)
	$(BIN)/python -m tests.integration.fault_schedule --runs $${RUNS:-20} --faults $${FAULTS:-8}

quick: $(STAMP) ## every test not marked slow (under a minute; the integration ones need make kafka-up)
	$(BIN)/pytest -q -m "not slow"

unit: $(STAMP) ## the unit tests only (no services needed)
	$(BIN)/pytest -q tests/unit

bench: $(STAMP) ## benchmarks (figures as ratios against a baseline measured in the same run; run needs make kafka-up)
	$(BIN)/python -m compileall -q service
	$(BIN)/python tests/benchmarks/bench_evaluate.py
	$(BIN)/python tests/benchmarks/bench_replay.py
	$(BIN)/python tests/benchmarks/bench_memory.py

	$(BIN)/python tests/benchmarks/bench_run_kafka.py
	$(BIN)/python tests/benchmarks/bench_restore.py
	$(BIN)/python tests/benchmarks/bench_detector.py
	$(BIN)/python tests/benchmarks/bench_day_baseline.py
	$(BIN)/python tests/benchmarks/bench_detector_memory.py
	$(BIN)/python tests/benchmarks/bench_cuped.py
	$(BIN)/python tests/benchmarks/bench_global_view.py
	$(BIN)/python tests/benchmarks/bench_pipeline.py
	$(BIN)/python tests/benchmarks/bench_window_records.py
	$(BIN)/python tests/benchmarks/bench_records.py

bench-audit: $(STAMP) ## the audited estimates on simulated traffic: coverage, error and width against the truth (SEEDS, default 40; 11 CPU minutes, about 6 on 2 idle cores)
	$(BIN)/python tests/benchmarks/bench_audit_estimates.py --seeds $${SEEDS:-40}

bench-detector-week: $(STAMP) ## the regression detector with a week of history before each event (REGRESSION_BASELINE_DAYS at its default 7): 120 runs of 8 days, about 80 minutes on 2 cores (4,756 s on 2026-12-07)
	$(BIN)/python tests/benchmarks/bench_detector.py --history-days 7 --runs 20 --null-runs 20 --kinds "drop,canary 20%,find rate only,later feedback,slow drift"

monitoring-tools: ## install Prometheus, promtool and Alertmanager from Debian's packages if missing (needs root)
	bash deploy/local/monitoring.sh install

monitoring-check: monitoring-tools ## promtool check config/rules, promtool rule unit tests, amtool check-config
	bash deploy/local/monitoring.sh check

monitoring-up: monitoring-tools ## run Prometheus (:9090) and Alertmanager (:9093) locally with the repo's configs
	bash deploy/local/monitoring.sh up

monitoring-down: ## stop them
	bash deploy/local/monitoring.sh down

kafka-up: $(STAMP) ## start a local single-node Kafka (KRaft) on 127.0.0.1:9092 from Maven Central jars
	bash deploy/local/kafka/kafka.sh up

kafka-down: ## stop it
	bash deploy/local/kafka/kafka.sh down

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
