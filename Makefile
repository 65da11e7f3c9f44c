PY := .venv/bin/python
# The second Spark: every Spark test, the demo and the spark-cluster fault scenario run on it too.
SPARK4_VENV := .venv-spark4
SPARK4_PY := $(SPARK4_VENV)/bin/python
SPARK4 := 4.1.*
DOCS_PY := .venv-docs/bin/python
# pytest exits 5 when it collected no tests: that is a failure here, never a green run. A failed run ends with
# the free space where tests keep their servers' data: SeaweedFS writes nothing on a disk under 1% free.
# $(2): another venv's python (default: .venv's).
PYTEST = $(or $(2),$(PY)) -m pytest -q $(1); rc=$$?; [ $$rc -eq 0 ] || df -h . "$${TMPDIR:-/tmp}" /dev/shm >&2; \
	[ $$rc -ne 5 ] || { echo "pytest: no tests ran" >&2; exit 1; }; exit $$rc

.PHONY: setup setup-spark4 demo lint test test-fast test-spark4 test-faults bench docs docs-serve clean
setup:
	@bash scripts/setup.sh

setup-spark4:
	@TIDEMARK_VENV=$(SPARK4_VENV) TIDEMARK_PYSPARK='$(SPARK4)' bash scripts/setup.sh

demo: setup
	$(PY) -m examples.demo

# ruff and mypy, configured in pyproject.toml (about 15 seconds; mypy's cache makes later runs quicker).
lint: setup
	$(PY) -m ruff check
	$(PY) -m mypy

# Three workers on two cores: the suite waits (session timeouts, intervals, servers' starts) much of the time, and
# two left the cores idle for a good part of a run (docs/contributing/development.md).
test: setup lint
	@$(call PYTEST,-n 3 --dist loadgroup --durations=15)

test-fast: setup lint
	@$(call PYTEST,-m "not spark")

# The Spark part of the suite on Spark 4.1 (make test runs it on 3.5): every Spark test, the demo, and the
# spark-cluster fault scenario, in a venv of its own.
test-spark4: setup-spark4
	@$(call PYTEST,-m spark,$(SPARK4_PY))
	$(SPARK4_PY) -m examples.demo
	$(SPARK4_PY) -m tests.faults --scenario spark-cluster

# The whole fault suite (about 36 minutes, CPU-heavy): prints the summary table kept in README.md.
test-faults: setup
	$(PY) -m tests.faults

bench: setup
	$(PY) -m bench

# The documentation site into site/ (strict: a broken link or a missing page fails), and the same served on
# http://127.0.0.1:8000 while you edit: MkDocs alone, in .venv-docs (never .venv, the jars or Trino). That the
# reference pages are what the code says is make test's (tests/test_docs.py; `python -m tools.docs_reference`
# writes them).
docs:
	@bash scripts/docs-setup.sh
	NO_MKDOCS_2_WARNING=1 $(DOCS_PY) -m mkdocs build --strict

docs-serve:
	@bash scripts/docs-setup.sh
	NO_MKDOCS_2_WARNING=1 $(DOCS_PY) -m mkdocs serve

clean:
	rm -rf .venv $(SPARK4_VENV) .venv-docs .pytest_cache .hypothesis .mypy_cache .ruff_cache site
