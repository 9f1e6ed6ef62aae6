"""polygraphy's default comparison on opfuse's output, as a user would run it:
``python -m bench.polygraphy_check [--zoo-dir DIR] [MODEL_NAME ...]``.

For every model: ``opfuse optimize`` (defaults), then

    polygraphy run ORIGINAL --onnxrt --save-inputs in.json --save-outputs out.json
    polygraphy run OPTIMIZED --onnxrt --load-inputs in.json --load-outputs out.json

which compares both under onnxruntime's default optimizations (ORT_ENABLE_ALL) at
polygraphy's default tolerances (rtol 1e-5, atol 1e-5, every element). Prints one line
per model and exits 1 when any comparison fails."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.run import ZOO_DIR, ZOO_SRC


def polygraphy() -> list[str]:
    """The ``polygraphy`` command of this Python (its package has no ``__main__``)."""
    return [sys.executable, "-c", "import sys; from polygraphy.tools import main; sys.exit(main())"]


def check(model: Path, work: Path) -> tuple[bool, str]:
    opt = work / f"{model.stem}.opt.onnx"
    steps = [
        [sys.executable, "-m", "opfuse", "optimize", str(model), "-o", str(opt)],
        [*polygraphy(), "run", str(model), "--onnxrt", "--save-inputs", str(work / "in.json")]
        + ["--save-outputs", str(work / "out.json")],
        [*polygraphy(), "run", str(opt), "--onnxrt", "--load-inputs", str(work / "in.json")]
        + ["--load-outputs", str(work / "out.json")],
    ]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            what = "opfuse optimize" if "opfuse" in step else f"polygraphy run {Path(step[3]).name}"
            return False, f"{what} failed: {' | '.join(tail)}"
    return True, "PASSED"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.polygraphy_check", description=__doc__)
    p.add_argument("models", nargs="*", help="zoo model names (default: all)")
    p.add_argument("--zoo-dir", type=Path, default=ZOO_DIR, help="materialized zoo models")
    args = p.parse_args(argv)
    if not args.zoo_dir.exists() or not any(args.zoo_dir.glob("*.onnx")):
        args.zoo_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(ZOO_SRC / "materialize.py"), str(args.zoo_dir), *args.models],
            check=True,
        )
    names = args.models or sorted(p.stem for p in args.zoo_dir.glob("*.onnx"))
    failed = 0
    for name in names:
        with tempfile.TemporaryDirectory(prefix="opfuse-polygraphy-") as tmp:
            ok, text = check(args.zoo_dir / f"{name}.onnx", Path(tmp))
        failed += not ok
        print(f"{name}: {text}", flush=True)
    print(f"polygraphy default comparison: {len(names) - failed}/{len(names)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
