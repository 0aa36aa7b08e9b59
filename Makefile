# The two commands of the README: `make run` and `make test`. Both do their own set-up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test install dev-install redis-check bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip

# Re-install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/affinity-gateway up --replicas 3 --port 8000

# The tests start their own redis-server on a free port; install one where we can.
redis-check:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  elif command -v brew >/dev/null 2>&1; then brew install redis; \
	  else echo "redis-server not found: install Redis (apt-get install redis-server / brew install redis) and re-run 'make test'" >&2; exit 1; fi; }

test: install redis-check
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m bench.gateway_overhead

clean:
	rm -rf $(VENV) build *.egg-info
