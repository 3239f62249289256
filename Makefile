# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo stages test test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first: pin the CPU build that installs from local disk; keep any torch already there
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/emmy-agent optimize examples/rmsnorm.py

stages: setup
	$(VENV)/bin/emmy compile examples/rmsnorm.py --ir all

# The default suite in one worker per core (pytest-xdist; an idle worker takes tests queued on
# another, so no worker finishes long before the others); GPU runs (-m gpu) stay in one process.
test: setup
	$(PY) -m pytest -q -n auto --dist worksteal; rc=$$?; [ $$rc -ne 5 ] || echo 'pytest collected no tests'; exit $$rc

test-all: setup
	$(PY) -m pytest -q -n auto --dist worksteal -m "slow or not slow"

bench: setup
	$(PY) bench/frontend_time.py
	$(PY) bench/schedule_time.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
