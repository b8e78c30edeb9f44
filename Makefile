PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
WEB_PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: venv run passwords test lint format bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

run: venv
	@mkdir -p var
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py seed_demo
	@echo
	@echo "  Open http://127.0.0.1:$(WEB_PORT)/  and sign in with a user printed above"
	@echo "  (passwords are printed once; 'make passwords' prints new ones)."
	@echo "  API: TOKEN=\$$($(BIN)/python manage.py create_api_token lead | tail -n1)"
	@echo
	WEB_PORT=$(WEB_PORT) APP_BASE_URL=http://127.0.0.1:$(WEB_PORT) $(BIN)/honcho start -f Procfile

passwords: venv
	$(BIN)/python manage.py seed_demo --reset-passwords

test: venv
	scripts/with-postgres.sh $(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/python scripts/check_imports.py

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv
	$(BIN)/pip install -q -e '.[dev,bench]'
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.run
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.inflight --write-docs

clean:
	rm -rf var .pytest_cache
