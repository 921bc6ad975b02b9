# labkit — two commands do everything on a fresh machine:
#   make run    bootstrap .venv (when missing or stale), then run the quickstart card end to end
#   make test   bootstrap .venv, then the test suite (offline, CPU, no hub)
#   make test-fast   the unit tests only (tests/unit, a few minutes)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.labkit-installed
CARD   ?= params/quickstart.yaml
# `make test` runs the test modules in this many pytest-xdist processes, each module whole in one (`--dist loadfile`:
# its fixtures built once; the smoke run once per process); CI has 2 cores; 1 runs everything in one process
TEST_WORKERS ?= 2

.PHONY: run test test-fast test-slow bench lab venv clean-runs chromium skypilot

# Reinstalled only when requirements.txt or pyproject.toml is newer than the stamp (or .venv is missing):
# a second call installs nothing.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e . \
		|| $(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	@touch $(STAMP)

# Debian's chromium for the report test (tests/integration/test_report_browser.py), where apt can install it;
# without it that test is skipped with the reason
chromium:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
		echo "chromium could not be installed: the report's browser test will be skipped"

# SkyPilot in an environment of its own (.venv-sky): skypilot pins click<8.2, huggingface_hub in .venv needs
# click>=8.4.2, so one environment cannot hold both; the test that runs SkyPilot's parser on a written task uses it
# (tests/unit/experiment/test_launch_files.py), and is skipped with the reason where it cannot be installed
SKY_STAMP := .venv-sky/.installed
skypilot: $(SKY_STAMP)
$(SKY_STAMP):
	@{ test -x .venv-sky/bin/python || $(PYTHON) -m venv .venv-sky; } && \
		.venv-sky/bin/python -m pip install --disable-pip-version-check -q skypilot==0.14.1 && touch $(SKY_STAMP) || \
		echo "skypilot could not be installed in .venv-sky: the SkyPilot parser test will be skipped"

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/labkit run $(CARD)

test: $(STAMP) chromium skypilot
	$(BIN)/python -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# bench/gpu_check.py needs a CUDA GPU (docs/gpu.md); its CPU dry run is part of `make test`
bench: $(STAMP)
	@for script in $(filter-out bench/gpu_check.py,$(wildcard bench/*.py)); do echo "== $$script"; $(BIN)/python $$script 2>/dev/null || exit 1; done

# Jupyter refuses to start as root unless told: containers (Colab-like images, docker) often run as root
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean-runs:
	rm -rf runs/
