# `make demo` and `make test` work on a fresh clone: they build .venv first.
PYTHON ?= python3
VENV := .venv
# The stamp lives inside the venv, so deleting .venv also forgets the install.
STAMP := $(VENV)/.installed

.PHONY: venv test demo clean

venv: $(STAMP)

# Re-install only when the dependencies may have changed.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	touch $@

test: venv
	$(VENV)/bin/python -m pytest -q tests

demo: venv
	$(VENV)/bin/jigsaw demo

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
