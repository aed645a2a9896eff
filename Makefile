# Two commands do all set-up on a fresh machine (Python 3.11+, Java 17):
#   make serve   - install into .venv if needed, run `pipeline serve` (Spark local[*], data in ./data)
#   make test    - install with the dev extras into .venv if needed, run the static checks, then the whole test suite
#   make check   - the static checks alone (ruff, mypy, import-linter; seconds)
# Pass server options with ARGS, e.g. make serve ARGS="--mode baseline --queues 8".

VENV ?= .venv
PYTHON ?= python3
ARGS ?=
PYTEST_ARGS ?=
# make test runs pytest on this many pytest-xdist workers, a test module (or the shared servers' modules) at a
# time each, so module-scoped servers start once (tests/conftest.py); TEST_WORKERS=0 runs it in this process.
# Three on 2 cores: much of an end-to-end test waits (a JVM's start, a timeout), and a third worker fills it.
TEST_WORKERS ?= 3

.PHONY: serve check test clean

# pipeline/_*.c: the C extensions pip builds with the package (gcc and the Python headers).
$(VENV)/.installed: pyproject.toml pipeline/_records.c pipeline/_frames.c pipeline/_stages.c
	@command -v java >/dev/null || { echo "Java 17+ is needed by Spark (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@# the Spark driver's class-data archive (~40 s, once): every later driver starts ~5 s sooner
	$(VENV)/bin/python -m pipeline.persist.jvm_archive || echo "no class-data archive: Spark drivers start without it"
	touch $@

serve: $(VENV)/.installed
	$(VENV)/bin/pipeline serve $(ARGS)

# ruff, the type checker and the import layers, in that order (docs/development.md)
check: $(VENV)/.installed
	$(VENV)/bin/ruff check pipeline tests deploy
	$(VENV)/bin/mypy pipeline deploy/image_check.py
	$(VENV)/bin/lint-imports

test: check
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf data spark-warehouse metastore_db derby.log .pytest_cache .hypothesis .mypy_cache .ruff_cache
