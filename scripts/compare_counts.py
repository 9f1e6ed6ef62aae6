"""Print node counts of the zoo models: original, opfuse, onnxslim and onnxsim.

    .venv/bin/python scripts/compare_counts.py [--zoo /tmp/zoo] [MODEL ...]

Counts cover the main graph and every subgraph, Constant nodes included. onnxslim and
onnxsim run with their defaults (pip install -e '.[bench]'); their counts are cached in
``--cache`` because they do not change while opfuse does. A tool that fails prints its
exception's first line instead of a count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnx


def count(model: onnx.ModelProto) -> int:
    def walk(graph: onnx.GraphProto) -> int:
        n = 0
        for node in graph.node:
            n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    n += sum(walk(g) for g in a.graphs)
        return n

    return walk(model.graph)


def run_opfuse(path: Path) -> tuple[int, float]:
    import onnx_ir as ir

    from opfuse.model import io
    from opfuse.pipeline.conductor import optimize_model

    model = io.load_model(path)
    start = time.perf_counter()
    result = optimize_model(model)
    seconds = time.perf_counter() - start
    return count(ir.to_proto(result.model)), seconds


def run_onnxslim(path: Path) -> int:
    import onnxslim

    return count(onnxslim.slim(str(path)))


def run_onnxsim(path: Path) -> int:
    import onnxsim

    model, _ = onnxsim.simplify(onnx.load(str(path)))
    return count(model)


def failed(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"failed: {text[0][:40] if text else type(exc).__name__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: every zoo model)")
    parser.add_argument("--zoo", default="/tmp/zoo", type=Path)
    parser.add_argument("--cache", default="/tmp/compare_counts_cache.json", type=Path)
    parser.add_argument("--no-cache", action="store_true", help="rerun onnxslim and onnxsim")
    args = parser.parse_args()

    cache: dict[str, dict[str, object]] = {}
    if args.cache.exists() and not args.no_cache:
        cache = json.loads(args.cache.read_text())
    names = args.models or sorted(p.stem for p in args.zoo.glob("*.onnx"))
    print("| model | original | opfuse | onnxslim | onnxsim | opfuse seconds |")
    print("|---|---|---|---|---|---|")
    worse = []
    for name in names:
        path = args.zoo / f"{name}.onnx"
        original = count(onnx.load(str(path), load_external_data=False))
        row = cache.setdefault(name, {})
        for tool, fn in (("onnxslim", run_onnxslim), ("onnxsim", run_onnxsim)):
            if tool not in row:
                try:
                    row[tool] = fn(path)
                except Exception as exc:  # report, do not stop the table
                    row[tool] = failed(exc)
                args.cache.write_text(json.dumps(cache, indent=1))
        try:
            ours, seconds = run_opfuse(path)
            mine: object = ours
            secs = f"{seconds:.2f}"
        except Exception as exc:
            mine, secs = failed(exc), "-"
        others = [v for v in (row["onnxslim"], row["onnxsim"]) if isinstance(v, int)]
        if not isinstance(mine, int) or any(mine > v for v in others):
            worse.append(name)
        print(f"| {name} | {original} | {mine} | {row['onnxslim']} | {row['onnxsim']} | {secs} |")
        sys.stdout.flush()
    if worse:
        print(f"\nopfuse has more nodes than onnxslim or onnxsim on: {', '.join(worse)}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
