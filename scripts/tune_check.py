"""Check `opfuse tune` against the original and the default output, model by model.

    .venv/bin/python scripts/tune_check.py ZOO_DIR [--only a,b] [--budget 30] [--seconds 10]

For each model: `opfuse optimize` (the default output) and `opfuse tune --budget`, then one
measurement of original, default and tuned together (opfuse.tuning.measure: paired, interleaved,
the original twice so the noise is in the same run). Prints a row per model: the tuned and
default ratios to the original, the noise, and whether tuned is within the noise of the
original (not slower) and of the default (at least as fast). Quicker than `make bench`,
which also runs the other tools.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from opfuse.runtime import get_runtime
from opfuse.tuning.measure import measure


def opfuse(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "opfuse", *args], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("zoo", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or sorted(
        p.stem for p in args.zoo.glob("*.onnx")
    )
    runtime = get_runtime("onnxruntime", threads=1)
    print(runtime.describe())
    print("| model | default | tuned | noise | tuned not slower | tuned <= default |")
    print("|---|---|---|---|---|---|")
    tuned_ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            src = args.zoo / f"{name}.onnx"
            default, tuned = Path(tmp, f"{name}.opt.onnx"), Path(tmp, f"{name}.tuned.onnx")
            opfuse("optimize", str(src), "-o", str(default))
            opfuse("tune", str(src), "-o", str(tuned), "--budget", str(args.budget))
            found = measure(
                src, {"default": default, "tuned": tuned}, runtime, seconds=args.seconds
            )
            t, d, noise = found.ratio("tuned"), found.ratio("default"), found.threshold
            tuned_ratios.append(t)
            print(
                f"| {name} | {d:.3f} | {t:.3f} | +-{found.noise:.1%} "
                f"| {'yes' if t <= 1 + noise else 'NO'} "
                f"| {'yes' if found.ratio('tuned', to='default') <= 1 + noise else 'NO'} |",
                flush=True,
            )
    geomean = math.exp(sum(map(math.log, tuned_ratios)) / len(tuned_ratios))
    print(f"tuned geomean {geomean:.3f} over {len(tuned_ratios)} models")


if __name__ == "__main__":
    main()
