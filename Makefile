# Two commands: `make run` and `make test`. Both create the virtualenv, install the package and
# start a local Kafka and Redis (scripts/services) unless external ones are configured through
# DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS and DELAY_BRIDGE_REDIS__URL.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= config/bridge.yaml
DELAY_PARTITIONS ?= 3
PYTEST_ARGS ?=

.PHONY: run test lint typecheck docs unit chaos bench bench-full bench-ab soak image dist services services-down services-status topics tools clean

# -qq for the package itself: errors only, not setuptools' notice about editable installs.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -qq --disable-pip-version-check -e '.[dev]'
	@touch $@

# Start the local services unless both external addresses are given.
services: $(STAMP)
	@if [ -n "$$DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS" ] && [ -n "$$DELAY_BRIDGE_REDIS__URL" ]; then \
	  echo "using external Kafka $$DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS and Redis $$DELAY_BRIDGE_REDIS__URL"; \
	else PYTHON=$(PY) scripts/services up; fi

# Checking tools for the tests, installed if missing: promtool and prometheus (Debian), helm
# (go install, pinned, cached), buildah and debootstrap (Debian) for the real image build.
tools:
	scripts/tools prometheus helm buildah chromium

# The image, built for real with buildah on a local Debian base (scripts/image).
image:
	scripts/image build localhost/delay-bridge:dev

# The release artifacts in dist/: wheel and sdist (twine-checked), the image as an OCI archive
# with its CycloneDX SBOM, and SHA256SUMS (scripts/dist; publishing them: docs/deploying.md).
dist: $(STAMP)
	scripts/tools buildah
	PYTHON=$(PY) scripts/dist dist

services-down:
	scripts/services down

services-status:
	scripts/services status

topics: services
	@export $$(scripts/services env) && \
	  $(PY) scripts/kafka_admin.py --bootstrap "$$DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS" create delay --partitions $(DELAY_PARTITIONS) --config retention.ms=-1 && \
	  $(PY) scripts/kafka_admin.py --bootstrap "$$DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS" create delay.dlq --partitions 1 && \
	  $(PY) scripts/kafka_admin.py --bootstrap "$$DELAY_BRIDGE_KAFKA__BOOTSTRAP_SERVERS" create delay.journal --partitions $(DELAY_PARTITIONS) --config retention.ms=-1

run: topics
	@export $$(scripts/services env) && exec $(VENV)/bin/delay-bridge run -c $(CONFIG)

lint: $(STAMP)
	$(VENV)/bin/ruff check bridge testbed tests scripts bench
	$(VENV)/bin/ruff format --check bridge testbed tests scripts bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict

# The reference site (docs/, mkdocs.yml) into build/site; --strict: a broken link or anchor fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

unit: $(STAMP)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

# Three pytests side by side, all of which must pass. BESIDE: four of the harness's own tests
# (first, beside the harness's others: these four do not measure Redis's memory; the others'
# Redis figures, a used_memory delta, move with the tests beside, so they only check a figure was
# taken), the shipping checks (the chart, hadolint, the image build: no Kafka or Redis), the
# three-broker cluster's tests (a Kafka and Redis of their own), the unit tests, the store's
# model test (Redis alone), the operators' commands and the Redis modes (Sentinel, Cluster, TLS:
# servers of their own; their deadlines are the lease's), the hostile inputs, the clock steps
# (early is early however busy the machine), a record's identity, the dialects, the quotas and
# the consumer restarts (their margins are seconds), and the cancels' pipeline (a cancel produced
# LIVE_MARGIN_MS before its record's due time wins however busy the machine: the bridge waits).
# BESIDE_TOO: the journal, exactly-once delivery, the cancels read beside a rebuild and the
# recurring schedules (duplicates, losses, missed occurrences; margins of seconds).
# Neither checks a time to the millisecond. The third: every other test on the session's
# services, the chaos scenarios last (their checks of lateness have margins of seconds: BESIDE's
# last tests run beside them; the two take about as long). The others' reports are printed after
# its own (build/test-beside.log, build/test-beside-too.log).
# PYTEST_ARGS given: one pytest with them.
BESIDE_BENCH := $(addprefix tests/bench/test_bench.py::test_the_,\
  exactly_once_scenario_runs_both_modes_and_keeps_the_contract \
  recovery_scenario_kills_restarts_and_keeps_the_contract \
  trace_scenario_finds_what_was_delivered_a_day_ago \
  recurring_scenario_delivers_every_occurrence_once)
BESIDE_INTEGRATION := tests/integration/test_kafka_cluster.py tests/integration/test_store_model.py \
  tests/integration/test_ops.py tests/integration/test_redis_modes.py tests/integration/test_hostile.py \
  tests/integration/test_clock_steps.py tests/integration/test_identity.py \
  tests/integration/test_dialects.py \
  tests/integration/test_testbed.py \
  tests/integration/test_recovery.py \
  tests/integration/test_quotas.py tests/integration/test_consumer_restart.py \
  tests/integration/test_cancel_pipeline.py
BESIDE := $(BESIDE_BENCH) tests/ship tests/unit $(BESIDE_INTEGRATION)
BESIDE_TOO := tests/integration/test_journal.py tests/integration/test_exactly_once.py \
  tests/integration/test_rebuild_cancels.py tests/integration/test_recurring.py
test: lint typecheck docs tools services
	@export $$(scripts/services env) && mkdir -p build && \
	if [ -n "$(PYTEST_ARGS)" ]; then exec $(PY) -m pytest $(PYTEST_ARGS); fi; \
	$(PY) -m pytest $(BESIDE) > build/test-beside.log 2>&1 & beside=$$!; \
	$(PY) -m pytest $(BESIDE_TOO) > build/test-beside-too.log 2>&1 & too=$$!; \
	$(PY) -m pytest tests/bench tests/integration tests/chaos \
	  $(BESIDE_INTEGRATION:%=--ignore=%) $(BESIDE_TOO:%=--ignore=%) \
	  $(BESIDE_BENCH:%=--deselect=%); rest=$$?; \
	wait $$beside; besides=$$?; wait $$too; toos=$$?; \
	echo "=== $(BESIDE) (run beside the others) ==="; cat build/test-beside.log; \
	echo "=== $(BESIDE_TOO) (run beside the others) ==="; cat build/test-beside-too.log; \
	[ $$rest -eq 0 ] && [ $$besides -eq 0 ] && [ $$toos -eq 0 ]

# The full chaos scenarios on a Kafka and Redis of their own (127.0.0.1:19192 / :16479; the broker
# scenarios on a three-broker cluster, 19292-19294); prints
# the Reliability table (docs/reliability.md) and writes build/chaos/results.json. CHAOS_ARGS: e.g. --quick,
# or scenario names. Then the model of the store (tests/integration/test_store_model.py) over
# STORE_MODEL_EXAMPLES random sequences instead of make test's 60.
CHAOS_ARGS ?=
STORE_MODEL_EXAMPLES ?= 3000
chaos: $(STAMP)
	$(PY) -m tests.chaos $(CHAOS_ARGS)
	STORE_MODEL_EXAMPLES=$(STORE_MODEL_EXAMPLES) $(PY) -m pytest -q --timeout 3600 \
	  tests/integration/test_store_model.py

# Benchmarks on the local services (BENCHMARKS.md): `make bench` is the quick run (a few
# minutes), `make bench-full` the full sizes. Tables on stdout; build/bench/results.json and PNG
# plots (matplotlib, the `bench` extra). BENCH_ARGS: scenario names (throughput precision catchup
# priority recovery exactly-once replicas by default; cluster, Redis Cluster next to standalone Redis, far-future,
# records kept as references and read back, and trace, a journal of millions of entries, when
# named).
BENCH_STAMP := $(VENV)/.bench-stamp
BENCH_ARGS ?=
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -qq --disable-pip-version-check -e '.[dev,bench]'
	@touch $@

bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

bench-full: $(BENCH_STAMP)
	$(PY) -m bench --full $(BENCH_ARGS)

# This checkout against a commit (BASE=<commit>, e.g. the last release tag): the throughput and
# steady scenarios in alternating runs, each figure's ratio printed (bench/ab.py).
bench-ab: $(BENCH_STAMP)
	@test -n "$(BASE)" || { echo "make bench-ab BASE=<commit>"; exit 2; }
	$(PY) -m bench.ab $(BASE) $(BENCH_ARGS)

# An hour at 2,000 records/s on a three-broker cluster of its own, the bridge SIGKILLed every ten
# minutes (bench/soak/): build/soak/results.json, report.md and soak.png; the last result in
# BENCHMARKS.md and docs/bench/soak.md.
soak: $(BENCH_STAMP)
	$(PY) -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
