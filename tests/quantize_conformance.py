"""``opfuse quantize`` on the ONNX backend conformance models (the models of
``tests/conformance.py``), as a user with one such model would run it: a valid model
never ends in a crash, an internal failure (exit 3) or a refusal (exit 2).

Each model whose inputs are all tensors and whose original onnxruntime runs on its test
data is quantized through the Python API (``opfuse.quantize``: the default recipe search,
``max_drop="off"``, no speed measurement) on 16 samples: its test inputs with float inputs
jittered (1% of their mean magnitude) where the original still runs on them, else as they
are. The int8 model must pass onnx.checker, run on the test inputs and keep the
original's interface (input and output names and element types). Classes:

    ok          a model that does all that
    wrong       a model that does not
    refused     exit 2 for a reason on REFUSALS (an already quantized model)
    unexpected  exit 2 for another reason (an OpfuseError other than below)
    internal    exit 3 (QuantizeInternalError)
    unverified  opfuse's verification of the fused model failed (exit 1)
    crash       any other exception
    timeout     more than conformance.TIMEOUT seconds
    skipped     the original fails on its own data, or an input is not a tensor

A few models end in a documented failure (``KNOWN``): the test accepts those and only
those, so one fixed or a new one shows.

    python tests/quantize_conformance.py [--workers 2] [--sample N] [--show CLASS]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

import conformance

SAMPLES = 16
JITTER = 0.01
BAD = ("wrong", "unexpected", "internal", "unverified", "crash", "timeout")
# the reasons quantize may refuse a conformance model (exit 2, one line)
REFUSALS = {
    "already-quantized": r"already quantized",
    # a test of NaN or infinity handling: such data calibrates nothing (exit 2, issue 41)
    "non-finite-data": r"holds (NaN|an infinity)",
}
# the conformance tests of quantized ops, by name: the only ones that may be refused so
QUANTIZED_TESTS = re.compile(r"quantize|qlinear|integer", re.IGNORECASE)
# the models that end in a documented failure, and why (docs/QUANTIZATION.md)
KNOWN = {
    # an attention whose Softmax masks whole rows: NaN in its calibrated range, and
    # onnxruntime's quantizer raises "scale issue" even with the nodes around it excluded
    "node/test_attention_24_qk_matmul_output_mode3_softmax_precision_expanded": "internal",
    "node/test_attention_local_window_gqa_rank4_mask_expanded": "internal",
    # Scan-8 (a batch axis) converted to opset 13 by onnx's version converter changes the
    # input's rank: the fused model's verification catches it (per-tensor needs no opset 13)
    "node/test_scan_sum": "unverified",
}


def _samples(case: Path, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    original = conformance.session(case / "model.onnx")
    out = []
    for _ in range(SAMPLES):
        jittered = {
            k: (v + rng.normal(0, JITTER, v.shape) * (np.abs(v).mean() + 1e-3)).astype(v.dtype)
            if v.dtype.kind == "f"
            else v
            for k, v in feeds.items()
        }
        try:
            conformance.run(original, jittered)
        except Exception:  # the original refuses the jittered values (a shape, a scale)
            jittered = dict(feeds)
        out.append(jittered)
    return out


def _interface(model: onnx.ModelProto) -> list[tuple[str, int]]:
    values = [*model.graph.input, *model.graph.output]
    inits = {t.name for t in model.graph.initializer}
    return [(v.name, v.type.tensor_type.elem_type) for v in values if v.name not in inits]


def _wrong(original: onnx.ModelProto, made: onnx.ModelProto, feeds: dict) -> str | None:
    try:
        onnx.checker.check_model(made)
    except Exception as exc:
        return f"fails onnx.checker: {conformance.first_line_of(exc)}"
    if _interface(made) != _interface(original):
        return f"its interface changed: {_interface(original)} -> {_interface(made)}"
    with tempfile.TemporaryDirectory(prefix="opfuse-qconf-") as tmp:
        path = Path(tmp) / "int8.onnx"
        onnx.save_model(made, str(path))
        try:
            conformance.run(path, feeds)
        except Exception as exc:
            return f"onnxruntime cannot run it: {conformance.first_line_of(exc)}"
    return None


def _finite(feeds: dict[str, np.ndarray]) -> bool:
    """Every float input of the test's own data is finite."""
    return all(v.dtype.kind not in "fc" or np.isfinite(v).all() for v in feeds.values())


def classify(case: Path) -> tuple[str, str, str, float]:
    """(test name, class, detail, seconds) for one test folder: opfuse quantize."""
    return conformance.guarded(case, _quantized)


def _quantized(case: Path) -> tuple[str, str]:
    import opfuse
    from opfuse.errors import OpfuseError, VerificationError
    from opfuse.quantization.workspace import QuantizeInternalError

    feeds, expected = conformance.load_data(case)
    tensors = all(isinstance(v, np.ndarray) and v.dtype != object for v in feeds.values())
    why = "an input is not a tensor" if not tensors or not feeds else None
    why = why or conformance.original_ok(case, feeds, expected)
    if why is not None:
        return "skipped", why
    original = onnx.load_model(str(case / "model.onnx"))
    samples = _samples(case, feeds)
    try:
        made = opfuse.quantize(
            original,
            calibration=samples[:12],
            eval=samples[12:],
            benchmark=False,
            max_drop="off",
            fallback_tries=4,
        ).model
    except QuantizeInternalError as exc:
        return "internal", str(exc)
    except VerificationError as exc:
        return "unverified", str(exc)
    except OpfuseError as exc:
        refusal = next((k for k, r in REFUSALS.items() if re.search(r, str(exc))), None)
        if refusal == "non-finite-data" and _finite(feeds):  # the data must hold them
            refusal = None
        return ("refused", f"{refusal}: {exc}") if refusal else ("unexpected", str(exc))
    wrong = _wrong(original, made, feeds)
    return ("wrong", wrong) if wrong else ("ok", "")


def unexpected(results: list[tuple[str, str, str, float]]) -> list[str]:
    """The results that are bad and not the documented failure of their model; a model of
    KNOWN that no longer fails so (take it off the list); a refusal of a model whose test
    is not about a quantized op (an independent check of the already-quantized test)."""
    out = []
    for name, kind, detail, _ in results:
        if kind in BAD and KNOWN.get(name) != kind:
            out.append(f"{kind} {name}: {detail}")
        elif name in KNOWN and kind != KNOWN[name]:
            out.append(f"{kind} {name}: on KNOWN as {KNOWN[name]}; it now ends {kind}")
        elif kind == "refused" and detail.startswith("non-finite-data"):
            continue  # checked against the test's own data in _quantized
        elif kind == "refused" and not QUANTIZED_TESTS.search(name):
            out.append(f"refused {name}: {detail}")
    return out


def run_all(paths: list[Path], workers: int = 2) -> Iterator[tuple[str, str, str, float]]:
    return conformance.run_all(paths, workers, classify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="a deterministic sample of N")
    parser.add_argument("--show", action="append", default=[], help="list the models of CLASS")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    all_cases = conformance.cases(conformance.generate())
    chosen = conformance.sample(all_cases, args.sample) if args.sample else all_cases
    start = time.perf_counter()
    results = sorted(run_all(chosen, args.workers))
    counts = Counter(kind for _, kind, _, _ in results)
    for name, kind, detail, _ in results:
        if kind in args.show or kind in BAD:
            known = " (known)" if KNOWN.get(name) == kind else ""
            print(f"{kind:10} {name}{known}: {detail}")
    print(f"{len(results)} models in {time.perf_counter() - start:.0f} s")
    for kind in ("ok", "refused", *BAD, "skipped"):
        print(f"  {kind:10} {counts.get(kind, 0)}")
    return 1 if unexpected(results) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
