# Quick start: `make serve` (the demo dataset on http://127.0.0.1:8000, with the server and the client installed and
# nothing else; `make serve PORT=8080` for another port) and `make test` (adds the dev and test tools and torch's CPU
# build, then runs the whole suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The server and the client only: what `make serve` needs.
SERVE_STAMP := $(VENV)/.serve-installed
# The dev and test environment: the dev extra, the client's torch and images extras, torch's CPU build.
STAMP := $(VENV)/.installed
# torch's CPU build: constraints.txt pins torch==2.13.0+cpu on Linux and Windows, a version only PyTorch's own CPU
# index serves (PyPI's Linux wheels of the same release are CUDA builds, ~2.5 GB more). torch alone is installed in a
# step of its own: from pip's configured places first (a wheel cache, a mirror, a local directory), and only where
# the CPU build is not there from that index, so no other package is ever looked up there. With no CPU build
# anywhere it stops rather than install a CUDA build. `make test TORCH_INDEX=<url>` names a mirror of that index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv serve-venv ui ui-check serve test docs wheels lint format clean

$(SERVE_STAMP): pyproject.toml client/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e . -e ./client
	touch $(SERVE_STAMP)

# LeRobot 0.4.4, for the tests that run its own training script through episerve: its declared dependencies
# conflict with this project's pins, so what its training path imports is installed from
# tests/lerobot_env/requirements.txt, then lerobot and the torchvision built for torch 2.13 without their
# dependencies, plus a start-up shim that lets that torchvision import beside torch's CPU build (all explained in
# tests/lerobot_env/).
$(STAMP): $(SERVE_STAMP) pyproject.toml client/pyproject.toml constraints.txt tests/lerobot_env/requirements.txt \
		tests/lerobot_env/torchvision_cpu_shim.py
	$(BIN)/pip install -q -c constraints.txt --no-deps torch 2>/dev/null \
		|| $(BIN)/pip install -q -c constraints.txt --no-deps --extra-index-url $(TORCH_INDEX) torch
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]" -e "./client[torch,images,jpeg]"
	$(BIN)/pip install -q -c constraints.txt -r tests/lerobot_env/requirements.txt
	$(BIN)/pip install -q --no-deps -c constraints.txt lerobot torchvision
	$(BIN)/python tests/lerobot_env/install_shim.py
	touch $(STAMP)

serve-venv: $(SERVE_STAMP)

venv: $(STAMP)

# The episode viewer's browser libraries (uPlot, apache-arrow) are kept built in app/ui/vendor, so installing or
# running the server needs no Node. After changing a pin in ui/package.json: `make ui` (needs nodejs and npm)
# rewrites them; `make ui-check` fails when they differ from what the pins give.
ui:
	cd ui && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error && node build.mjs

ui-check:
	cd ui && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error && node build.mjs --check

serve: $(SERVE_STAMP)
	$(BIN)/episerve-server serve $(if $(PORT),--port $(PORT))

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 -q --durations=40

# The documentation site (mkdocs.yml, docs/) into site/, strictly: a broken link or anchor, or a page left out of the
# nav, fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Wheels of the server (viewer included) and of the client, into dist/.
wheels: $(STAMP)
	$(BIN)/python -m build --wheel --outdir dist .
	$(BIN)/python -m build --wheel --outdir dist client

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis ui/node_modules dist build client/build site
