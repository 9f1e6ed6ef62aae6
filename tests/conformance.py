"""opfuse on the ONNX backend conformance suite of the installed onnx.

Every backend test model with inputs and expected outputs (the node tests, generated from
``onnx/backend/test/case/node`` as onnx's ``backend-test-tools generate-data`` does, since
the wheel no longer ships them; ``simple``, ``pytorch-converted`` and ``pytorch-operator``
from ``onnx/backend/test/data``) whose original onnxruntime runs and matches its expected
outputs is optimized as a user would (``api.optimize_file``, verification on) and sorted
into one class:

    ok            exit 0; the output passes onnx.checker (full), runs and matches
    undecided     the verifier could not decide (exit 2); with --no-verify the output is ok
    refused       exit 2 for a reason on REFUSALS
    false-alarm   exit 1 although the output (with --no-verify) matches
    wrong         the output does not match, cannot run or fails the checker
    unexpected    exit 2 for a reason not on REFUSALS
    crash         any other exception
    timeout       more than TIMEOUT seconds

Models whose original fails are counted apart (``skipped``). ``make test-conformance``
runs them all with 2 workers and prints the counts; tests/test_conformance.py runs a
deterministic sample in ``make test`` and the whole suite in ``make test-slow``.

    python tests/conformance.py [--workers 2] [--sample N] [--show CLASS]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "build" / "conformance"  # ignored (build/): regenerated per onnx version
SHIPPED = Path(onnx.__file__).parent / "backend" / "test" / "data"
KINDS = ("simple", "pytorch-converted", "pytorch-operator")
TIMEOUT = 120  # seconds per model
RTOL, ATOL = 1e-3, 1e-7  # onnx's backend test runner defaults

# The reasons opfuse may refuse a conformance model (exit 2, one line): the documented list.
REFUSALS = {
    "converter": r"cannot convert the model to opset",  # onnx's version converter fails
    "ir-version": r"onnxruntime cannot load the model.*(Unsupported model IR version|IR version)",
}
# The verifier's own "cannot decide" (exit 2 where --no-verify succeeds)
UNDECIDED = "undecided"
CLASSES = (
    "ok",
    UNDECIDED,
    "refused",
    "false-alarm",
    "wrong",
    "unexpected",
    "crash",
    "timeout",
    "skipped",
)


def generate(data: Path = DATA) -> Path:
    """The node test data of the installed onnx under ``data/node`` (once per version)."""
    stamp = data / "onnx-version"
    if stamp.exists() and stamp.read_text() == onnx.__version__:
        return data
    import onnx.backend.test.case.node as node_cases
    import onnx.backend.test.cmd_tools as tools

    # generate-data writes only the model tests in onnx 1.23: give it the node tests
    tools.model_test = types.SimpleNamespace(  # type: ignore[assignment]
        collect_testcases=lambda: node_cases.collect_testcases(None)
    )
    with np.errstate(all="ignore"):
        tools.generate_data(types.SimpleNamespace(output=str(data)))
    stamp.write_text(onnx.__version__)
    return data


def cases(data: Path = DATA) -> list[Path]:
    """Every test folder with a model and a first data set, sorted."""
    folders = [data / "node"] + [SHIPPED / kind for kind in KINDS]
    found = [
        case
        for folder in folders
        for case in sorted(folder.iterdir())
        if (case / "model.onnx").exists() and (case / "test_data_set_0").is_dir()
    ]
    return sorted(found, key=lambda p: (p.parent.name, p.name))


def sample(all_cases: list[Path], n: int) -> list[Path]:
    """A deterministic sample of ``n``: by a hash of the name, so it never depends on order."""
    key = lambda p: hashlib.sha256(f"{p.parent.name}/{p.name}".encode()).hexdigest()  # noqa: E731
    return sorted(sorted(all_cases, key=key)[:n], key=lambda p: (p.parent.name, p.name))


def _read(path: Path, value: onnx.ValueInfoProto) -> object:
    """One .pb by the graph's declared type: tensor, sequence, optional or map."""
    data = path.read_bytes()
    kind = value.type.WhichOneof("value")
    if kind == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if kind == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    if kind == "map_type":
        m = onnx.MapProto()
        m.ParseFromString(data)
        return numpy_helper.to_dict(m)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def load_data(case: Path) -> tuple[dict[str, object], list[object]]:
    model = onnx.load_model(str(case / "model.onnx"), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    folder = case / "test_data_set_0"
    feeds = {}
    for j, value in enumerate(inputs):
        path = folder / f"input_{j}.pb"
        if path.exists():
            feeds[value.name] = _read(path, value)
    expected = []
    for j, value in enumerate(model.graph.output):
        path = folder / f"output_{j}.pb"
        expected.append(_read(path, value) if path.exists() else None)
    return feeds, expected


def matches(expected: object, got: object) -> bool:
    """The onnx backend runner's rule (rtol 1e-3, atol 1e-7), through sequences and optionals."""
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(matches(e, g) for e, g in zip(expected, got, strict=True))
        )
    if expected is None or got is None:
        return expected is None and got is None
    if isinstance(expected, dict):
        return isinstance(got, dict) and expected.keys() == got.keys()
    e, g = np.asarray(expected), np.asarray(got)
    if e.shape != g.shape:
        return False
    if e.dtype == object or g.dtype == object or e.dtype.kind in "USb" or g.dtype.kind in "USb":
        return bool(np.array_equal(e.astype(str), g.astype(str)))
    try:
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), RTOL, ATOL)
    except AssertionError:
        return False
    return True


def session(path: Path) -> Any:
    """An onnxruntime session on ``path``, its optimizations off, one thread, quiet."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run(path: Path | Any, feeds: dict[str, object]) -> list[object]:
    """``path``'s outputs on ``feeds`` (or a ``session``'s), the inputs it takes."""
    sess = session(path) if isinstance(path, Path) else path
    wanted = {i.name for i in sess.get_inputs()}
    return list(sess.run(None, {k: v for k, v in feeds.items() if k in wanted}))


def original_ok(case: Path, feeds: dict[str, object], expected: list[object]) -> str | None:
    """Why the original cannot be the judge (it fails or disagrees), or None."""
    try:
        got = run(case / "model.onnx", feeds)
    except Exception as exc:
        return f"onnxruntime: {first_line_of(exc)}"
    if len(got) != len(expected) or not all(
        e is None or matches(e, g) for e, g in zip(expected, got, strict=True)
    ):
        return "onnxruntime's outputs differ from the expected ones"
    return None


def first_line_of(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def passes_full_check(path: Path) -> bool:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception:
        return False
    return True


def output_wrong(
    out: Path, feeds: dict[str, object], expected: list[object], full: bool = True
) -> str | None:
    """What is wrong with an optimized model, or None. ``full``: the original passes
    onnx.checker's full check (a few node tests' originals fail its shape inference), so
    the output must too; else the plain check."""
    try:
        onnx.checker.check_model(str(out), full_check=full)
    except Exception as exc:
        return f"fails onnx.checker: {first_line_of(exc)}"
    try:
        got = run(out, feeds)
    except Exception as exc:
        return f"onnxruntime cannot run it: {first_line_of(exc)}"
    for j, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e is not None and not matches(e, g):
            return f"output {j} differs from the expected"
    return None


class Timeout(Exception):
    pass


def alarm(signum: int, frame: object) -> None:
    raise Timeout


def guarded(case: Path, judge: Callable[[Path], tuple[str, str]]) -> tuple[str, str, str, float]:
    """(test name, class, detail, seconds): ``judge``'s (class, detail) for the test folder
    within TIMEOUT seconds ("timeout"), any exception it lets out a "crash"."""
    name = f"{case.parent.name}/{case.name}"
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT)
    try:
        kind, detail = judge(case)
    except Timeout:
        kind, detail = "timeout", f"over {TIMEOUT} s"
    except Exception as exc:  # a crash of opfuse's (or of this harness)
        kind, detail = "crash", f"{type(exc).__name__}: {first_line_of(exc)}"
    finally:
        signal.alarm(0)
    return name, kind, detail, time.perf_counter() - start


def classify(case: Path) -> tuple[str, str, str, float]:
    """(test name, class, detail, seconds) for one test folder: opfuse optimize."""
    return guarded(case, _optimized)


def _optimized(case: Path) -> tuple[str, str]:
    from opfuse.errors import OpfuseError, VerificationError
    from opfuse.pipeline.conductor import optimize_file

    feeds, expected = load_data(case)
    why = original_ok(case, feeds, expected)
    if why is not None:
        return "skipped", why
    with tempfile.TemporaryDirectory(prefix="opfuse-conformance-") as tmp:
        out = Path(tmp) / "model.opt.onnx"
        try:
            optimize_file(case / "model.onnx", out)
            wrong = output_wrong(out, feeds, expected, passes_full_check(case / "model.onnx"))
            return ("wrong", wrong) if wrong else ("ok", "")
        except VerificationError as exc:
            return _unverified(case, out, feeds, expected, "false-alarm", exc)
        except OpfuseError as exc:
            refusal = next((k for k, r in REFUSALS.items() if re.search(r, str(exc))), None)
            if refusal is not None:
                return "refused", f"{refusal}: {exc}"
            return _unverified(case, out, feeds, expected, "unexpected", exc)


def _unverified(
    case: Path,
    out: Path,
    feeds: dict[str, object],
    expected: list[object],
    kind: str,
    exc: Exception,
) -> tuple[str, str]:
    """Exit 1 or 2 with verification on: optimize again without it and judge the output.
    A correct output makes a verifier failure a false alarm and an exit 2 "undecided"."""
    from opfuse.errors import OpfuseError
    from opfuse.pipeline.conductor import optimize_file

    try:
        optimize_file(case / "model.onnx", out, verify=False)
    except OpfuseError:
        return kind, str(exc)  # refused without the verifier too
    wrong = output_wrong(out, feeds, expected, passes_full_check(case / "model.onnx"))
    if wrong:
        return ("wrong", wrong) if kind == "false-alarm" else ("wrong", f"{wrong} ({exc})")
    return ("false-alarm" if kind == "false-alarm" else UNDECIDED), str(exc)


def run_all(
    paths: list[Path],
    workers: int = 2,
    judge: Callable[[Path], tuple[str, str, str, float]] | None = None,
) -> Iterator[tuple[str, str, str, float]]:
    """``judge`` (default ``classify``, opfuse optimize) on every model, ``workers`` at
    a time (each worker a fresh interpreter)."""
    judge = judge or classify
    if workers <= 1:
        yield from map(judge, paths)
        return
    with get_context("spawn").Pool(workers, maxtasksperchild=100) as pool:
        yield from pool.imap_unordered(judge, paths, chunksize=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="a deterministic sample of N")
    parser.add_argument("--show", action="append", default=[], help="list the models of CLASS")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    all_cases = cases(generate())
    chosen = sample(all_cases, args.sample) if args.sample else all_cases
    start = time.perf_counter()
    results = sorted(run_all(chosen, args.workers))
    counts = Counter(kind for _, kind, _, _ in results)
    for name, kind, detail, _ in results:
        if kind in args.show or kind not in ("ok", "skipped", "refused", UNDECIDED):
            print(f"{kind:12} {name}: {detail}")
    refused = Counter(d.split(":")[0] for _, k, d, _ in results if k == "refused")
    print(f"{len(results)} models in {time.perf_counter() - start:.0f} s")
    for kind in CLASSES:
        extra = f"  {dict(refused)}" if kind == "refused" and refused else ""
        print(f"  {kind:12} {counts.get(kind, 0)}{extra}")
    optimized = sum(counts[k] for k in ("ok", UNDECIDED, "false-alarm", "wrong"))
    if optimized:
        print(f"  undecided: {100 * counts[UNDECIDED] / optimized:.1f}% of {optimized} optimized")
    if args.json:
        args.json.write_text(json.dumps([list(r) for r in results], indent=1) + "\n")
    bad = sum(counts[k] for k in ("false-alarm", "wrong", "unexpected", "crash", "timeout"))
    return 1 if bad else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
