"""Run the benchmark table: ``python -m bench.run [--quick] [MODEL.onnx ...]``.

Every optimization, every numeric check and every latency measurement runs in a child
process with a timeout, so a crash or a hang costs one cell of the table, not the run."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import measure, report, scale
from bench.proc import ROOT, run_python
from bench.tools import TOOLS

ZOO_SRC = ROOT.parent / "shared" / "zoo"
ZOO_DIR = ROOT / "bench" / "zoo"
OUT_DIR = ROOT / "bench" / "out"
DOCS = ROOT / "docs" / "BENCHMARKS.md"
QUICK_MODELS = ("squeezenet1_1", "mobilenet_v3_small", "transformer_tiny")
SCALE_MODELS = ("transformer_tiny", "tx100")
OPENVINO_TOOLS = ("opfuse", "opfuse-tune")  # measured on OpenVINO too, when it is installed
CONTROL = "original again"  # the original measured twice, for the noise of the latency ratios
VALID_REL_ERR = 1e-3  # a tool's output counts as correct at or below this relative error


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("models", nargs="*", help="extra model files to benchmark")
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_MODELS)}")
    p.add_argument("--only", default="", help="comma-separated zoo model names")
    p.add_argument("--no-zoo", action="store_true", help="only the models given")
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated tool names")
    p.add_argument("--zoo-src", type=Path, default=ZOO_SRC, help="the zoo with materialize.py")
    p.add_argument("--zoo-dir", type=Path, default=ZOO_DIR, help="materialized models (ignored)")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="results folder (ignored)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per optimization")
    p.add_argument(
        "--scale-timeout", type=float, default=300, help="seconds per optimization of tx430"
    )
    p.add_argument("--check-timeout", type=float, default=300, help="seconds per check")
    p.add_argument("--latency-budget", type=float, default=None, help="seconds per model")
    p.add_argument("--no-latency", action="store_true")
    p.add_argument(
        "--scale",
        choices=("auto", "on", "off"),
        default="auto",
        help="the ~40k-node model (auto: on unless --quick or --only/--no-zoo)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        default=None,
        help=f"write the report here too (the full default run writes {DOCS.relative_to(ROOT)})",
    )
    p.add_argument("--keep", action="store_true", help="keep the optimized models")
    args = p.parse_args(argv)
    unknown = [t for t in args.tools.split(",") if t and t not in TOOLS]
    if unknown:
        p.error(f"unknown tool {unknown[0]!r}; known: {', '.join(TOOLS)}")
    args.tools = [t for t in args.tools.split(",") if t]
    full = not (args.quick or args.only or args.no_zoo or args.models)
    if args.latency_budget is None:
        args.latency_budget = 5.0 if args.quick else 25.0
    if args.scale == "auto":
        args.scale = "on" if full else "off"
    if args.docs is None and full and args.tools == list(TOOLS):
        args.docs = DOCS
    return args


def zoo_models(args: argparse.Namespace) -> list[Path]:
    """The zoo models of this run, materialized into the ignored zoo folder."""
    if args.no_zoo:
        return []
    names = list(QUICK_MODELS) if args.quick else [n for n in args.only.split(",") if n]
    if not names:
        names = sorted(p.stem for p in (args.zoo_src / "models").glob("*.onnx"))
    return materialize(args, names)


def materialize(args: argparse.Namespace, names: list[str]) -> list[Path]:
    """Run the zoo's materialize.py for the models not materialized yet."""
    missing = [n for n in names if not (args.zoo_dir / f"{n}.onnx").exists()]
    if missing:
        args.zoo_dir.mkdir(parents=True, exist_ok=True)
        script = args.zoo_src / "materialize.py"
        res = run_python([str(script), str(args.zoo_dir), *missing], timeout=900)
        if res.returncode != 0:
            raise SystemExit(f"bench: {script} failed: {res.failure()}")
    return [args.zoo_dir / f"{n}.onnx" for n in names]


def log(text: str) -> None:
    print(text, flush=True)


def optimize(tool: str, src: Path, dst: Path, timeout: float) -> dict[str, Any]:
    """One tool on one model in a worker process: status, time, peak memory, nodes, size."""
    if not TOOLS[tool].installed():
        return {"status": "not installed"}
    result_json = dst.with_suffix(".time.json")
    result_json.unlink(missing_ok=True)
    dst.unlink(missing_ok=True)
    res = run_python(["-m", "bench.worker", tool, str(src), str(dst), str(result_json)], timeout)
    row: dict[str, Any] = {"process_s": round(res.wall_s, 3)}
    if res.returncode != 0 or not result_json.exists() or not dst.exists():
        row["status"] = res.failure() or "no output written"
        row["peak_mb"] = res.peak_kb / 1024 if res.peak_kb else None
        return row
    timing = json.loads(result_json.read_text())
    row["status"] = "ok"
    row["optimize_s"] = timing["seconds"]
    row["peak_mb"] = max(timing["peak_kb"], res.peak_kb) / 1024
    row["nodes"] = measure.node_count(dst)
    row["bytes"] = measure.file_bytes(dst)
    return row


def check(model: Path, workdir: Path, timeout: float) -> dict[str, Any]:
    out = workdir / f"{model.stem}.check.json"
    out.unlink(missing_ok=True)
    res = run_python(["-m", "bench.measure", "check", str(model), str(workdir), str(out)], timeout)
    if res.returncode != 0 or not out.exists():
        return {"check": res.failure() or "no result"}
    return {"check": "ok", **json.loads(out.read_text())}


def bench_model(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = path.stem
    workdir = args.out / "work" / name
    workdir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"model": name, "path": str(path), "rows": {}}
    rows: dict[str, dict[str, Any]] = entry["rows"]
    res = run_python(
        ["-m", "bench.measure", "reference", str(path), str(workdir)], args.check_timeout
    )
    if res.returncode != 0:
        entry["error"] = f"the original does not run: {res.failure()}"
        log(f"  {name}: {entry['error']}")
        return entry
    original = {
        "status": "ok",
        "nodes": measure.node_count(path),
        "bytes": measure.file_bytes(path),
    }
    original.update(check(path, workdir, args.check_timeout))
    rows["original"] = original
    variants = {"original": path}
    if not args.no_latency:
        # The original again as a variant of its own: its ratio shows the latency noise.
        control = workdir / "original-again.onnx"
        control.unlink(missing_ok=True)
        control.symlink_to(path.resolve())
        variants[CONTROL] = control
        rows[CONTROL] = {"status": "ok"}
    for tool in args.tools:
        dst = workdir / f"{tool}.onnx"
        row = optimize(tool, path, dst, args.timeout)
        if row["status"] == "ok":
            row.update(check(dst, workdir, args.check_timeout))
            if row["check"] == "ok":
                variants[tool] = dst
        session = dst.with_name(dst.name + ".session.json")  # opfuse tune's session choice
        if session.exists():
            row["session"] = json.loads(session.read_text())["measured"]
            session.unlink()
        rows[tool] = row
        log(f"  {name} {tool}: {report.short(row)}")
    if not args.no_latency:
        lat_json = workdir / "latency.json"
        lat_json.unlink(missing_ok=True)
        cmd = [
            "-m",
            "bench.measure",
            "latency",
            str(lat_json),
            str(args.latency_budget),
            str(workdir / "inputs.npz"),
            *map(str, variants.values()),
        ]
        res = run_python(cmd, args.check_timeout + 20 * args.latency_budget)
        if res.returncode == 0 and lat_json.exists():
            lat = json.loads(lat_json.read_text())
            entry["latency_runs"] = lat["runs"]
            for key, variant in variants.items():
                rows[key].update(lat["models"][str(variant)])
        else:
            entry["latency_error"] = res.failure() or "no result"
            log(f"  {name} latency: {entry['latency_error']}")
        if measure.openvino_installed():
            openvino_latency(entry, variants, workdir, args)
    if not args.keep:
        for tool in args.tools:
            (workdir / f"{tool}.onnx").unlink(missing_ok=True)
    return entry


def openvino_latency(
    entry: dict[str, Any], variants: dict[str, Path], workdir: Path, args: argparse.Namespace
) -> None:
    """OpenVINO CPU latency of the original, opfuse's default output and the tuned one."""
    rows = entry["rows"]
    keys = [k for k in ("original", *OPENVINO_TOOLS) if k in variants]
    out = workdir / "openvino.json"
    out.unlink(missing_ok=True)
    cmd = ["-m", "bench.measure", "openvino", str(out), str(args.latency_budget)]
    cmd += [str(workdir / "inputs.npz"), *(str(variants[k]) for k in keys)]
    res = run_python(cmd, args.check_timeout + 20 * args.latency_budget)
    if res.returncode != 0 or not out.exists():
        entry["openvino_error"] = res.failure() or "no result"
        log(f"  {entry['model']} openvino: {entry['openvino_error']}")
        return
    found = json.loads(out.read_text())
    entry["openvino"] = {"runtime": found["runtime"], "noise": found["noise"]}
    for key, median, ratio in zip(keys, found["medians_s"], found["ratios"], strict=True):
        rows[key]["latency_ov_s"] = median
        rows[key]["latency_ov_ratio"] = ratio


SCALE_REPEATS = 3  # runs of each tool on the ~40k-node model, interleaved: the median


def bench_scale(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Optimize time per 1,000 nodes on the transformer stacks, tool by tool."""
    table: dict[str, Any] = {}
    by_name = {str(e["model"]): e for e in results}
    for name in SCALE_MODELS:
        if name in by_name and "rows" in by_name[name]:
            rows = by_name[name]["rows"]
            table[name] = {
                "nodes": rows["original"]["nodes"],
                "tools": {t: rows[t] for t in args.tools if t in rows and TOOLS[t].scale},
            }
    if args.scale == "on":
        materialize(args, sorted(set(scale.STACK)))
        big = scale.build(args.zoo_dir, args.out / "scale")
        workdir = args.out / "work" / big.stem
        workdir.mkdir(parents=True, exist_ok=True)
        tools: dict[str, dict[str, Any]] = {}
        runs: dict[str, list[float]] = {}
        # the tools in turn, SCALE_REPEATS times: the machine's load drifts over minutes,
        # and one run each once made onnxruntime-basic look twice as slow as it is
        for _ in range(SCALE_REPEATS):
            for tool in [t for t in args.tools if TOOLS[t].scale]:
                if tool in tools and tools[tool].get("status") != "ok":
                    continue  # failed once: not retried
                row = optimize(tool, big, workdir / f"{tool}.onnx", args.scale_timeout)
                log(f"  {big.stem} {tool}: {report.short(row)}")
                tools[tool] = row
                if row.get("status") == "ok":
                    runs.setdefault(tool, []).append(row["optimize_s"])
                if not args.keep:
                    (workdir / f"{tool}.onnx").unlink(missing_ok=True)
        for tool, seconds in runs.items():
            tools[tool]["optimize_s"] = statistics.median(seconds)
            tools[tool]["runs_s"] = [round(x, 3) for x in seconds]
        table[big.stem] = {"nodes": measure.node_count(big), "tools": tools}
        if "opfuse" in tools:
            table[big.stem]["engine"] = engine_breakdown(big, workdir, args.scale_timeout)
    for entry in table.values():
        nodes = entry["nodes"]
        for row in entry["tools"].values():
            if row.get("status") == "ok":
                row["s_per_1k_nodes"] = row["optimize_s"] / (nodes / 1000)
    return table


def engine_breakdown(model: Path, workdir: Path, timeout: float) -> dict[str, Any]:
    """opfuse's own time per phase and per stage of passes on the largest model
    (``optimize --format json``: timings, pass_seconds)."""
    out = workdir / "engine.onnx"
    res = run_python(
        ["-m", "opfuse", "optimize", str(model), "-o", str(out), "--no-verify", "--format", "json"],
        timeout,
    )
    out.unlink(missing_ok=True)
    if res.returncode != 0:
        return {"error": res.failure() or "failed"}
    found = json.loads(res.stdout)
    return {"timings": found["timings"], "pass_seconds": found["pass_seconds"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    command = (
        "python -m bench.run"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    models = zoo_models(args) + [Path(m).resolve() for m in args.models]
    for m in models:
        if not m.exists():
            raise SystemExit(f"bench: {m} does not exist")
    args.out.mkdir(parents=True, exist_ok=True)
    for tool in args.tools:
        if not TOOLS[tool].installed():
            log(f"bench: {tool} is not installed; its rows say so")
    machine = report.machine()  # the commit measured is the one the run starts from
    results = []
    for i, path in enumerate(models, 1):
        log(f"[{i}/{len(models)}] {path.stem}")
        results.append(bench_model(path, args))
    log("scale")
    scale_table = bench_scale(results, args)
    doc = {
        "command": command,
        "machine": machine,
        "tools": {t: TOOLS[t].how for t in args.tools},
        "settings": {
            "batch": measure.BATCH,
            "dynamic_dim": measure.DIM,
            "seed": measure.SEED,
            "threads": 1,
            "warmup": measure.WARMUP,
            "latency_budget_s": args.latency_budget,
            "timeout_s": args.timeout,
            "scale_timeout_s": args.scale_timeout,
            "valid_rel_err": VALID_REL_ERR,
        },
        "models": results,
        "scale": scale_table,
        "total_s": time.perf_counter() - started,
    }
    doc["goals"] = report.goals(doc)
    (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    text = report.markdown(doc)
    (args.out / "results.md").write_text(text)
    if args.docs:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(text)
    log(
        f"wrote {args.out / 'results.md'} and results.json"
        + (f" and {args.docs}" if args.docs else "")
        + f" in {doc['total_s']:.0f} s"
    )
    if not args.keep:
        shutil.rmtree(args.out / "work", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
