"""Op types and node counts of opfuse's output on every zoo model, to show that a refactoring
changed nothing: record at the starting commit, then compare at the end.

    .venv/bin/python scripts/zoo_fingerprint.py --zoo /work/zoo-m --out before.json
    ... change the code ...
    .venv/bin/python scripts/zoo_fingerprint.py --zoo /work/zoo-m --compare before.json

Counts cover the main graph and every subgraph, Constant nodes included, keyed by
``domain::op_type``. A model opfuse refuses records its error's first line. ``--compare``
prints each model that differs and exits 1 when any does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir


def op_types(graph: onnx.GraphProto, counts: Counter[str]) -> Counter[str]:
    for node in graph.node:
        counts[f"{node.domain}::{node.op_type}"] += 1
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                op_types(a.g, counts)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    op_types(g, counts)
    return counts


def fingerprint(path: Path) -> dict[str, object]:
    from opfuse.model import io
    from opfuse.pipeline.conductor import optimize_model

    try:
        result = optimize_model(io.load_model(path))
    except Exception as exc:  # the refusal is part of the behaviour being compared
        return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    counts = op_types(ir.to_proto(result.model).graph, Counter())
    return {"total": sum(counts.values()), "ops": dict(sorted(counts.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default="/tmp/zoo", type=Path, help="materialized zoo folder")
    parser.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    parser.add_argument("--compare", type=Path, help="fingerprints recorded before")
    args = parser.parse_args()
    found = {}
    for path in sorted(args.zoo.glob("*.onnx")):
        found[path.stem] = fingerprint(path)
        print(path.stem, found[path.stem].get("total", found[path.stem].get("error")), flush=True)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    if not args.compare:
        return 0
    before = json.loads(args.compare.read_text())
    differ = sorted(k for k in before.keys() | found.keys() if before.get(k) != found.get(k))
    for name in differ:
        print(f"DIFFERS {name}: before {before.get(name)} now {found.get(name)}")
    print(f"{len(found) - len(differ)} of {len(found)} models identical (op types and counts)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
