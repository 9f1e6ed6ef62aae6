# The README opens with `make demo` and `make test`; both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-conformance lint fuzz bench bench-quick bench-quant bench-transformers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,ray,openvino]'  # ray: the batch engine's tests run a local cluster; openvino: the OpenVINO form is run in the tests
	touch $(STAMP)

# the demo needs opfuse alone (no test, Ray or OpenVINO extras)
$(VENV)/.demo: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(VENV)/.demo

demo: $(VENV)/.demo
	mkdir -p build
	$(BIN)/opfuse optimize src/opfuse/examples/convnet.onnx -o build/convnet.opt.onnx \
		--log-level info --fusion-result build/fusion_result.json

lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test: lint
	$(BIN)/pytest -q

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# the ONNX backend conformance suite of the installed onnx, 2 workers, counts per class:
# opfuse optimize on each model, then opfuse quantize
test-conformance: $(STAMP)
	$(BIN)/python tests/conformance.py --workers 2
	cd tests && ../$(BIN)/python quantize_conformance.py --workers 2

fuzz: $(STAMP)
	OPFUSE_FUZZ_EXAMPLES=10000 $(BIN)/pytest -q tests/test_fuzz.py --hypothesis-show-statistics

$(VENV)/.bench: $(STAMP)
	$(BIN)/pip install -q -e '.[test,ray,bench]'
	touch $(VENV)/.bench

# bench.quant: OpenVINO's column needs opfuse[openvino]; NNCF's is optional (left out
# where it does not install)
$(VENV)/.bench-quant: $(VENV)/.bench
	$(BIN)/pip install -q -e '.[test,ray,bench,openvino]'
	$(BIN)/pip install -q 'nncf>=2.14' || echo "nncf did not install: its column is left out"
	touch $(VENV)/.bench-quant

bench: $(VENV)/.bench $(VENV)/.bench-quant
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.quant --docs docs/BENCHMARKS.md

# silero_vad's speech is synthesized by espeak-ng (left out, with a message, without it)
bench-quant: $(VENV)/.bench-quant
	@command -v espeak-ng >/dev/null || echo "espeak-ng is not installed (apt-get install espeak-ng): silero_vad is left out"
	$(BIN)/python -m bench.quant --docs docs/BENCHMARKS.md

# bench.quant_transformers: onnxsim's quantizer rows need onnxsim 0.8.1 (--dynamic-quantize)
bench-transformers: $(VENV)/.bench-quant
	$(BIN)/pip install -q 'onnxsim==0.8.1' || echo "onnxsim 0.8.1 did not install: its rows give its error"
	$(BIN)/python -m bench.quant_transformers --seconds 20 --docs docs/BENCHMARKS.md

bench-quick: $(VENV)/.bench
	$(BIN)/python -m bench.run --quick

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
