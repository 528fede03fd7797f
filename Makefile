# make demo: set up .venv if missing and run the demo on real processes.
# make test: set up .venv if missing and run the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench golden clean bytecode

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Every command, and every worker, starts from bytecode compiled here (only what changed is
# compiled again): where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile every
# module it imports, at every start.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q inferris_dist engine launcher

demo: bytecode
	$(BIN)/inferris-dist launch --world-size 4

test: bytecode
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist worksteal   # two test processes: this machine's two cores; an idle one takes work from the other

bench: bytecode
	$(BIN)/python examples/serving.py
	$(BIN)/python examples/bench_boundary.py
	$(BIN)/python examples/bench_overlap.py
	$(BIN)/python examples/bench_launch.py
	$(BIN)/python examples/bench_hosts.py   # across namespaces when run as root

golden: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_golden.py tests/test_launch.py -k golden

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
