# Two commands do all set-up on a fresh machine with Python 3.11+:
#   make demo   - the T-42 crash-and-resume story on the embedded default (SQLite + filesystem broker)
#   make test   - ruff, mypy --strict, the strict docs build and the whole test-suite (PostgreSQL and RabbitMQ tests included)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast lint docs bench chaos celery-suite clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,docs]' --config-settings editable_mode=compat
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/jobctl demo

# The documentation site into site/ (mkdocs.yml, docs/): --strict fails on any warning,
# a broken link or anchor, or a generated reference table missing something the code defines.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Two test processes (pytest-xdist; one test file stays in one process), the longest files
# handed out first (tests/conftest.py); a test that stops a server stops a private one.
test: lint docs
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=30

test-fast: install
	$(PY) -m pytest -m "not acceptance and not slow"

bench: install
	$(PY) -m bench

shop-django: install
	$(PY) examples/run.py django

shop-flask: install
	$(PY) examples/run.py flask

# Minutes of seeded faults against real workers (tests/acceptance/test_chaos.py); the seed is
# printed, and CHAOS_SEED=<seed> replays it. CHAOS_JOBS and CHAOS_SECONDS size the run.
chaos: install
	CHAOS_JOBS=$${CHAOS_JOBS:-200} CHAOS_SECONDS=$${CHAOS_SECONDS:-120} \
		$(PY) -m pytest -q -s -p no:randomly tests/acceptance/test_chaos.py

# Celery's own integration suite (t/integration of the installed Celery's source distribution,
# fetched once into .cache/celery-sdist) on plain Celery and with durable jobs installed, compared
# test by test (tests/celery_suite/). CELERY_SUITE_ARGS: --plain-again, --subset, test paths.
celery-suite: install
	$(PY) -m tests.celery_suite $(CELERY_SUITE_ARGS)

clean:
	rm -rf $(VENV) site jobs-data .pytest_cache .mypy_cache .ruff_cache .hypothesis
