# Two commands do all set-up on a fresh machine (Python 3.11+, Java 17):
#   make serve   - install into .venv if needed, run `pipeline serve` (Spark local[*], data in ./data)
#   make test    - install with the dev extras into .venv if needed, run the static checks, then the whole test suite
#   make check   - the static checks alone (ruff, mypy, import-linter; seconds)
#   make bench-smoke - the benchmarks' smoke forms (tests/bench, marker bench_smoke; ~4 min): outside make test's
#                  15 minutes, run by .ci/run after it
#   make fault-test - the fault tests (~9 min): the single-machine crash tests (marker crash), then the three-host
#                  ones (tests/e2e/test_failover.py, marker fault_hosts), in one process, outside make test's 15
#                  minutes, run by .ci/run after it
#   make sanitize - the C extensions' differential and fuzz tests under AddressSanitizer + UBSan (.ci/sanitize.py)
#   make clean   - build and test artifacts; make clean-data deletes ./data, the default data directory
# Pass server options with ARGS, e.g. make serve ARGS="--mode baseline --queues 8".

VENV ?= .venv
PYTHON ?= python3
ARGS ?=
PYTEST_ARGS ?=
# make test runs pytest on this many pytest-xdist workers, a test module (or the shared servers' modules) at a
# time each, so module-scoped servers start once (tests/conftest.py); TEST_WORKERS=0 runs it in this process.
# Three on 2 cores: much of an end-to-end test waits (a JVM's start, a timeout), and a third worker fills it.
TEST_WORKERS ?= 3

.PHONY: serve check test fault-test bench-smoke sanitize clean clean-data

# The C extensions pip builds with the package (gcc and the Python headers; pyproject's ext-modules):
# an edit of any of them reinstalls, which rebuilds them.
NATIVE_SOURCES := $(shell find pipeline -name '*.c')

$(VENV)/.installed: pyproject.toml $(NATIVE_SOURCES)
	@command -v java >/dev/null || { echo "Java 17+ is needed by Spark (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@# the Spark driver's class-data archive (~40 s, once): every later driver starts ~5 s sooner
	$(VENV)/bin/python -m pipeline.persist.jvm_archive
	touch $@

serve: $(VENV)/.installed
	$(VENV)/bin/pipeline serve $(ARGS)

# ruff, the type checker and the import layers, in that order (docs/development.md)
check: $(VENV)/.installed
	$(VENV)/bin/ruff check pipeline tests deploy .ci/sanitize.py
	$(VENV)/bin/mypy pipeline deploy/image_check.py
	$(VENV)/bin/lint-imports

test: check
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not bench_smoke and not fault_hosts and not crash" $(PYTEST_ARGS)

# the fault tests, outside make test's budget (docs/development.md): the single-machine crash tests (marker crash:
# servers of their own killed under load), then the three-host ones (fault_hosts: network namespaces, as root; three
# brokers, a Spark Connect server and the clients of each host on 2 cores), in one process so nothing runs beside them
fault-test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -m "crash or fault_hosts" tests/e2e $(PYTEST_ARGS)

# `pipeline bench` in its smoke forms, each on real servers under load: minutes of CPU on 2 cores, so beside
# make test's budget, as the sanitizer and the image check are (docs/development.md)
bench-smoke: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m bench_smoke tests/bench $(PYTEST_ARGS)

# a sanitizer build of the C extensions in a temporary directory (the .venv's stay as they are), then their
# differential and fuzz tests on it (.ci/run runs it before make test; docs/development.md)
sanitize: $(VENV)/.installed
	$(VENV)/bin/python .ci/sanitize.py

# build and test artifacts only; a Spark session started in the repository without pipeline's
# configuration leaves spark-warehouse, metastore_db and derby.log here
clean:
	rm -rf spark-warehouse metastore_db derby.log .pytest_cache .hypothesis .mypy_cache .ruff_cache

# ./data is the default data directory (pipeline.data.dir): `make serve`'s tables, WAL and metadata stores
clean-data:
	@echo "deleting ./data: every table, WAL segment and metadata store a 'make serve' kept there"
	rm -rf data
