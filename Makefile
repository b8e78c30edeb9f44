PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
WEB_PORT ?= 8000
PYTEST_ARGS ?=
# test processes (pytest-xdist; most tests wait on real servers, so 3 on 2 cores; 0: serial).
# Whole modules go to a worker (their shared servers start once), the slowest modules first
# (tests/scheduling.py orders them from tests/durations.txt; xdist must not reorder them).
TEST_WORKERS ?= 3
TEST_DIST ?= --dist loadscope --no-loadscope-reorder

NODE_TESTS := tests/node/node_modules/.installed
EXAMPLE := examples/chat/dist/chat.js

.PHONY: venv lock run passwords test lint format bench clean example node-deps

# the pinned, hashed versions (requirements.lock: `make lock` after changing pyproject.toml),
# then the project itself without resolving anything again
$(BIN)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(BIN)/.installed

# re-pin requirements.lock from pyproject.toml's ranges (the apps', the demo's and the dev
# extras) with uv (`pip install uv` anywhere); UPGRADE=1 moves every pin to the newest allowed
# release
lock:
	uv pip compile pyproject.toml --extra demo --extra dev --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 $(if $(UPGRADE),--upgrade) -o requirements.lock

run: venv
	@[ -f examples/chat/dist/chat.js ] || ! command -v npm >/dev/null || $(MAKE) example
	@mkdir -p var
	@# the simulated refund gateway's key, made once: the web (gateway) and the worker (tool) share it
	@test -s var/gateway.key || $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(32))" > var/gateway.key
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py seed_demo
	@echo
	@echo "  Open http://127.0.0.1:$(WEB_PORT)/  and sign in with a user printed above"
	@echo "  (passwords are printed once; 'make passwords' prints new ones)."
	@echo "  The AI SDK chat example: http://127.0.0.1:$(WEB_PORT)/examples/chat/ (make example builds it)"
	@echo "  API: TOKEN=\$$($(BIN)/python manage.py create_api_token lead | tail -n1)"
	@echo
	@# Ctrl-C: honcho SIGTERMs each process group and SIGKILLs what is left 5 s later, so the
	@# worker's drain is kept inside that (steps still running then are handed over by lease)
	REFUND_GATEWAY_KEY=$${REFUND_GATEWAY_KEY:-$$(cat var/gateway.key)} \
	  AGENTRUNS_DRAIN_SECONDS=$${AGENTRUNS_DRAIN_SECONDS:-3} \
	  WEB_PORT=$(WEB_PORT) APP_BASE_URL=http://127.0.0.1:$(WEB_PORT) $(BIN)/honcho start -f Procfile

# the AI SDK chat example's bundle: Node.js and npm, pinned lock file
$(EXAMPLE): examples/chat/package-lock.json $(wildcard examples/chat/src/*.js)
	cd examples/chat && npm ci --no-audit --no-fund && npm run build

example: $(EXAMPLE)

# the Node tests' pinned `ai` package (tests/node, run by tests/stream/test_ai_sdk_client.py)
$(NODE_TESTS): tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund && touch node_modules/.installed

node-deps: $(NODE_TESTS)

passwords: venv
	$(BIN)/python manage.py seed_demo --reset-passwords

# npm installs the Node tests' packages and builds the chat example; without it those tests are
# skipped with the reason (with CI=true they fail: tests/binaries.py); TESTS_HIDE_BINARIES=npm
# pretends it is missing
comma := ,
NPM := $(if $(filter npm,$(subst $(comma), ,$(TESTS_HIDE_BINARIES))),,$(shell command -v npm 2>/dev/null))

test: venv $(if $(NPM),$(NODE_TESTS) $(EXAMPLE))
	@[ -n "$(NPM)" ] || echo "npm is not installed: the AI SDK client and chat example tests will be skipped (apt-get install npm)"
	scripts/with-postgres.sh $(BIN)/pytest -n $(TEST_WORKERS) $(TEST_DIST) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/python scripts/check_imports.py

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# BENCH_QUICK=1 make bench: smaller rounds, no N=1000, for working on the harness (a few minutes)
# BENCH_BASELINE=/path/to/checkout (e.g. `git worktree add /tmp/base main`): the real deployment's
# batch also runs that checkout, side by side with this one (targets before and after)
bench: venv
	$(BIN)/pip install -q -e '.[dev,bench]'
	rm -f var/bench-engine.json var/bench-pydantic-ai.json var/bench-inflight.json \
		var/bench-step-cost.json var/bench-deployment.json
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.run
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.step_cost --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.deployment \
		$(if $(BENCH_BASELINE),--a $(BENCH_BASELINE)) \
		$(if $(BENCH_QUICK),--runs 30 --floor-runs 50,--runs 100) \
		--json var/bench-deployment.json --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.pydantic_ai_flow \
		$(if $(BENCH_QUICK),--runs 10 --rounds 1,--runs 40 --rounds 3) --json var/bench-pydantic-ai.json
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.inflight --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.model_rate_limit --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.events_size --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.concurrency_keys --write-docs
	PG_EXTRA_OPTS=" " scripts/with-postgres.sh $(BIN)/python -m benchmarks.desk_pages --write-docs \
		$(if $(BENCH_QUICK),--tickets 5000 --runs 1000 --repeat 10)
	$(BIN)/python -m benchmarks.targets --write-docs

clean:
	rm -rf var .pytest_cache
