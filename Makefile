# The README's two commands are `make run` and `make test`; both set everything up first.
.PHONY: run replicas test test-fast lint setup bench train eval screenshots

# make run MODELS=/path/to/models[:/other/folder]: every checkpoint folder or .gguf file one level
# inside those folders joins the model picker ($ATTENTION_LAB_MODELS).
run:
	$(if $(MODELS),ATTENTION_LAB_MODELS="$(MODELS)" )bash scripts/run.sh

# make replicas N=2: N app processes behind HAProxy on http://127.0.0.1:${ATTENTION_LAB_BALANCER_PORT:-8501},
# sticky per browser session, each with 1/N of the machine's gate budget (scripts/replicas.py lists
# the settings). Ctrl-C stops everything it started.
replicas:
	bash scripts/setup.sh
	ATTENTION_LAB_REPLICAS=$(or $(N),2) exec .venv/bin/python scripts/replicas.py

test:
	bash scripts/test.sh

# The loop while coding: the linter, then the tests that need no browser, no AppTest page run and no
# smollm2, Ray, subprocess or training run (tests/conftest.py marks app and slow from what a test uses).
test-fast:
	bash scripts/test.sh -m "not browser and not slow and not app"

lint: setup
	.venv/bin/ruff check .

# The README's screenshots: the browser tests that take them, writing into docs/screenshots/
# (a plain `make test` writes them under test-artifacts/ and leaves docs/ as it was).
screenshots: setup
	ATTENTION_LAB_SCREENSHOTS="$(CURDIR)/docs/screenshots" .venv/bin/python -m pytest -q tests/browser/test_browser.py \
		tests/browser/test_browser_corpus.py tests/browser/test_browser_heads.py tests/browser/test_browser_long.py \
		tests/browser/test_browser_newcomer.py tests/browser/test_browser_training.py \
		tests/browser/test_browser_reading.py

setup:
	bash scripts/setup.sh --test

bench: setup
	.venv/bin/python -m bench.run_all

train: setup
	.venv/bin/python -m core.cli.train_toy

eval: setup
	.venv/bin/python -m core eval --model toy-translate
