# Quick start: `make serve` (demo dataset on http://127.0.0.1:8000) and `make test` (the whole suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The episode viewer's browser libraries (uPlot, apache-arrow), pinned by ui/package-lock.json and copied into
# app/ui/vendor by ui/build.mjs; the stamp is refreshed whenever the pins change.
UI_STAMP := app/ui/vendor/.built

.PHONY: venv ui serve test lint format clean

# LeRobot 0.4.4, for the tests that run its own training script through episerve: its declared dependencies
# conflict with this project's pins, so what its training path imports is installed from
# tests/lerobot_env/requirements.txt, then lerobot and the torchvision built for torch 2.13 without their
# dependencies, plus a start-up shim that lets that torchvision import beside torch's CPU build (all explained in
# tests/lerobot_env/).
$(STAMP): pyproject.toml client/pyproject.toml constraints.txt tests/lerobot_env/requirements.txt \
		tests/lerobot_env/torchvision_cpu_shim.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]" -e "./client[torch,images]"
	$(BIN)/pip install -q -c constraints.txt -r tests/lerobot_env/requirements.txt
	$(BIN)/pip install -q --no-deps -c constraints.txt lerobot torchvision
	$(BIN)/python tests/lerobot_env/install_shim.py
	touch $(STAMP)

$(UI_STAMP): ui/package.json ui/package-lock.json ui/build.mjs
	@if command -v npm >/dev/null 2>&1; then \
		(cd ui && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error && node build.mjs) && touch $(UI_STAMP) \
			|| echo "could not build the episode viewer's libraries: /ui/ will say so, and its browser tests skip"; \
	else \
		echo "npm not found: the episode viewer's libraries are not built (install nodejs and npm, then: make ui)"; \
	fi

ui: $(UI_STAMP)

venv: $(STAMP) $(UI_STAMP)

serve: $(STAMP) $(UI_STAMP)
	$(BIN)/episerve-server serve

test: $(STAMP) $(UI_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis ui/node_modules app/ui/vendor
