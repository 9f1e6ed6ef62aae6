"""The optimizers under test. Each runs file to file inside bench.worker, in its own process;
a tool whose package is missing is reported as "not installed"."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    name: str
    package: str  # distribution name, for the version
    module: str  # import name, for the installed check
    how: str  # what the run does, for the docs
    optimize: Callable[[str, str], None]
    # what the optimize call imports, loaded before the clock starts so that every
    # tool's time is its work only (a tool that imports lazily is not charged for it)
    imports: tuple[str, ...] = ()
    scale: bool = True  # also run on the ~40k-node model (a search there would take long)

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"


def _opfuse(src: str, dst: str) -> None:
    from opfuse.cli import main

    # The CLI as users call it (its entry point, in this worker process of its own);
    # verification is measured by the harness, not timed here.
    sys.argv = ["opfuse", "optimize", "--no-verify", src, "-o", dst]
    main()


TUNE_BUDGET_S = 60.0  # opfuse tune's search budget per model
TUNE_BENCH_S = 1.0  # its measuring time per comparison


def _opfuse_tune(src: str, dst: str) -> None:
    from opfuse.cli import app

    # onnxruntime CPU, ORT_ENABLE_ALL, 1 thread: the settings the latency columns use
    args = ["tune", src, "-o", dst, "--budget", str(TUNE_BUDGET_S)]
    args += ["--bench-seconds", str(TUNE_BENCH_S)]
    app.main(args, standalone_mode=False)


def _onnxslim(src: str, dst: str) -> None:
    import onnxslim

    onnxslim.slim(src, output_model=dst)


def _onnxsim(src: str, dst: str) -> None:
    import onnx
    import onnxsim

    model, ok = onnxsim.simplify(onnx.load(src))
    if not ok:
        raise RuntimeError("onnxsim: simplified model failed its check")
    onnx.save(model, dst)


def _onnxoptimizer(src: str, dst: str) -> None:
    import onnx
    import onnxoptimizer

    passes = onnxoptimizer.get_fuse_and_elimination_passes()
    onnx.save(onnxoptimizer.optimize(onnx.load(src), passes), dst)


def _ort_basic(src: str, dst: str) -> None:
    from bench.measure import session

    session(src, "basic", threads=0, inter_threads=None, optimized_path=dst)


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "opfuse",
            "opfuse",
            "opfuse",
            "`opfuse optimize --no-verify` (default switches)",
            _opfuse,
            ("opfuse.cli", "opfuse.pipeline.conductor"),
        ),
        Tool(
            "opfuse-tune",
            "opfuse",
            "opfuse",
            f"`opfuse tune --budget {TUNE_BUDGET_S:g} --bench-seconds {TUNE_BENCH_S:g}` "
            "(onnxruntime CPU, ORT_ENABLE_ALL, 1 thread; its time is the search's)",
            _opfuse_tune,
            ("opfuse.cli", "opfuse.tuning.search"),
            scale=False,
        ),
        Tool(
            "onnxslim", "onnxslim", "onnxslim", "`onnxslim.slim(src, output_model=dst)`", _onnxslim
        ),
        Tool(
            "onnxsim",
            "onnxsim",
            "onnxsim",
            "`onnxsim.simplify(model)` (defaults, no check)",
            _onnxsim,
            ("onnx",),
        ),
        Tool(
            "onnxoptimizer",
            "onnxoptimizer",
            "onnxoptimizer",
            "`onnxoptimizer.optimize(model, get_fuse_and_elimination_passes())`",
            _onnxoptimizer,
            ("onnx",),
        ),
        Tool(
            "ort-basic",
            "onnxruntime",
            "onnxruntime",
            "onnxruntime `ORT_ENABLE_BASIC` with `optimized_model_filepath`",
            _ort_basic,
        ),
    )
}
