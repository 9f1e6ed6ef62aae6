"""Benchmark suite: opfuse against onnxslim, onnxsim, onnxoptimizer and onnxruntime's offline
optimizer, side by side on the same machine in one run (``python -m bench.run``).

Not run by CI; tests/test_bench_harness.py smoke-tests the harness on a tiny model."""
