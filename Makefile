# Two commands: `make run` (the main job on bundled defaults) and `make test`.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed

.PHONY: run demo test bench bench-smoke install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# CPU torch (a plain `torch` would pull a multi-GB CUDA build)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e ".[test]"
	# Byte-compiled once here, so a first `servecast` run does not pay for it
	$(VENV)/bin/python -m compileall -q engine calibrate simulator app
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/servecast plan --out out/plan

demo: $(STAMP)
	$(VENV)/bin/servecast generate

test: $(STAMP)
	$(VENV)/bin/python -m pytest

bench: $(STAMP)
	$(VENV)/bin/pip install -q -e ".[bench]"
	$(VENV)/bin/python bench/linear_backends.py
	$(VENV)/bin/python bench/engine_throughput.py
	$(VENV)/bin/python bench/cost_model_heldout.py

# Every bench/ script once in its --quick mode (tiny sizes; a few minutes in all): they still run.
bench-smoke: $(STAMP)
	$(VENV)/bin/pip install -q -e ".[bench]"
	VENV=$(VENV) bash bench/smoke.sh
