# Two commands do all set-up on a fresh machine (Python 3.11+, Java 17):
#   make serve   - install into .venv if needed, run `pipeline serve` (Spark local[*], data in ./data)
#   make test    - install with the dev extras into .venv if needed, run the whole test suite
# Pass server options with ARGS, e.g. make serve ARGS="--mode baseline --queues 8".

VENV ?= .venv
PYTHON ?= python3
ARGS ?=
PYTEST_ARGS ?=

.PHONY: serve test clean

$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is needed by Spark (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	touch $@

serve: $(VENV)/.installed
	$(VENV)/bin/pipeline serve $(ARGS)

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf data spark-warehouse metastore_db derby.log .pytest_cache .hypothesis
