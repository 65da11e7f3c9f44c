PY := .venv/bin/python
# pytest exits 5 when it collected no tests: that is a failure here, never a green run.
PYTEST = $(PY) -m pytest -q $(1); rc=$$?; [ $$rc -ne 5 ] || { echo "pytest: no tests ran" >&2; exit 1; }; exit $$rc

.PHONY: setup demo lint test test-fast test-faults bench clean
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m examples.demo

# ruff and mypy, configured in pyproject.toml (about 15 seconds; mypy's cache makes later runs quicker).
lint: setup
	$(PY) -m ruff check
	$(PY) -m mypy

test: setup lint
	@$(call PYTEST,)

test-fast: setup lint
	@$(call PYTEST,-m "not spark")

# The whole fault suite (about 22 minutes, CPU-heavy): prints the summary table kept in README.md.
test-faults: setup
	$(PY) -m tests.faults

bench: setup
	$(PY) -m bench

clean:
	rm -rf .venv .pytest_cache .hypothesis .mypy_cache .ruff_cache
