# handoff: `make demo` runs the main job end to end, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPROC ?= 2
RUN ?= runs/demo

.PHONY: install lock demo test test-fast lint docs docs-assets soak bench clean

install: $(STAMP)

# The tested set: the ranges of pyproject.toml held to the versions of requirements/lock.txt. Re-installs only when
# either changes, so repeated `make test` is fast.
$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements/lock.txt -e '.[dev]'
	touch $(STAMP)

# Re-pin the tested set after changing a range: what `pip install -e '.[dev]'` resolves to now, in a fresh venv.
lock:
	rm -rf .lock_venv && $(PYTHON) -m venv .lock_venv && .lock_venv/bin/pip install --quiet -e '.[dev]'
	{ sed -n '1,3p' requirements/lock.txt; .lock_venv/bin/pip freeze --exclude-editable; } > requirements/lock.new
	mv requirements/lock.new requirements/lock.txt && rm -rf .lock_venv

# Train on the embedded digits with $(NPROC) DDP processes, export and verify the checkpoint, then serve it
# with bentoml and classify validation images over HTTP.
demo: install
	rm -rf $(RUN)
	$(BIN)/torchrun --standalone --nproc-per-node $(NPROC) train/main.py --out $(RUN) --epochs 8 --workers 0
	$(BIN)/python -m export $(RUN)/last.pt --no-bento
	$(BIN)/python scripts/demo_serve.py $(RUN)/last.export --images 200

test: install
	$(BIN)/python -m pytest

# The pure code alone (key unwrapping, sampler, pruning, request limits, batcher, manifest checks): seconds.
test-fast: install
	$(BIN)/python -m pytest tests/unit -m "not e2e" -n 0

# Style, import order and formatting (ruff), and types (mypy: the folders pyproject.toml lists).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing page fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The docs' generated files, from the code that makes them: the page's screenshot (a browser test), the training
# curves (the 5-epoch run's picture) and the OpenAPI document the live service answers. `make test` writes
# none of them (it checks the OpenAPI document against the committed one); commit them when they change.
DOCS_ASSET_TESTS := tests/test_serve.py::test_the_docs_show_the_openapi_document_the_service_serves \
	tests/test_browser.py::test_page_classifies_an_uploaded_image_like_the_eager_model \
	tests/test_train.py::test_two_processes_learn_the_digits
docs-assets: install
	$(BIN)/python -m pytest -n 0 --docs-assets $(DOCS_ASSET_TESTS)

# The long checks left out of `make test`: 10,000 mixed requests at concurrency 32 against a served model
# (failures, memory growth, p99; ~3 min) and a SIGKILL during a synchronous save.
soak: install
	$(BIN)/python -m pytest tests/reliability/test_service_load.py tests/test_train.py -m soak -s -n 0

# The lasting benchmarks (bench/catalog.py) with their full settings, about 90 minutes on 2 cores; each writes
# bench/results/MACHINE/NAME.json. One alone: `python -m bench NAME`; the list: `python -m bench`. The serving ones
# load the service with wrk where it is installed (apt-get install wrk), else httpx.
bench: install
	$(BIN)/python -m bench all

clean:
	rm -rf $(VENV) runs
