"""The machine description, the goal checks and the markdown of a benchmark run."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from typing import Any

from bench.proc import ROOT
from bench.tools import TOOLS

VERSIONED = (
    "opfuse",
    "onnx",
    "onnx-ir",
    "onnxruntime",
    "onnxslim",
    "onnxsim",
    "onnxoptimizer",
    "numpy",
)
NODE_GOAL_SLACK = 0  # opfuse's nodes must be at or below the best other tool's
TIME_GOAL = 0.5  # x onnxslim's optimize time
LATENCY_GOAL = 1.02  # x the original's latency at ORT_ENABLE_ALL
SCALE_GOAL_S = 10.0  # optimize time of the ~40k-node model
TUNED_GEOMEAN_GOAL = 0.90  # opfuse tune's latency ratio at ORT_ENABLE_ALL, geomean over the zoo
OURS = ("opfuse", "opfuse-tune")
MAKE_TARGETS = {
    "python -m bench.run": "make bench    # = python -m bench.run",
    "python -m bench.run --quick": "make bench-quick    # = python -m bench.run --quick",
}


def machine() -> dict[str, Any]:
    import importlib.metadata

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem_gb = 0.0
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
            mem_gb = kb / 1024 / 1024
    except (OSError, StopIteration, ValueError):
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu or platform.processor(),
        "memory_gb": round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "opfuse_commit": commit,
        "versions": {d: version(d) for d in VERSIONED},
    }


def short(row: dict[str, Any]) -> str:
    """One log line for a tool's row."""
    if row.get("status") != "ok":
        return str(row.get("status"))
    text = f"{row['nodes']} nodes, {row['optimize_s']:.2f} s, {row['peak_mb']:.0f} MB"
    if row.get("check") == "ok":
        text += f", rel err {row['max_rel_err']:.2g}"
    elif "check" in row:
        text += f", check failed: {row['check']}"
    return text


def valid(row: dict[str, Any] | None, max_rel: float) -> bool:
    """The tool ran, its output loads and runs, and matches the original."""
    return bool(
        row
        and row.get("status") == "ok"
        and row.get("check") == "ok"
        and row.get("max_rel_err", float("inf")) <= max_rel
    )


def goals(doc: dict[str, Any]) -> dict[str, Any]:
    """Per model: opfuse against the issue's goals and the best other tool."""
    max_rel = doc["settings"]["valid_rel_err"]
    out: dict[str, Any] = {"models": {}}
    for entry in doc["models"]:
        rows = entry.get("rows", {})
        op = rows.get("opfuse")
        if not valid(op, max_rel):
            out["models"][entry["model"]] = {"opfuse": "failed" if op else "not run"}
            continue
        others = {
            t: r
            for t, r in rows.items()
            if t not in ("original", "original again", *OURS) and valid(r, max_rel)
        }
        g: dict[str, Any] = {"nodes": op["nodes"]}
        if others:
            best = min(others, key=lambda t: others[t]["nodes"])
            g["best_other_nodes"] = [best, others[best]["nodes"]]
            g["nodes_ok"] = op["nodes"] <= others[best]["nodes"] + NODE_GOAL_SLACK
        slim = rows.get("onnxslim")
        if slim and slim.get("status") == "ok":
            g["time_vs_onnxslim"] = op["optimize_s"] / slim["optimize_s"]
            g["time_ok"] = g["time_vs_onnxslim"] <= TIME_GOAL
        if "latency_all_ratio" in op:
            g["latency_all_ratio"] = op["latency_all_ratio"]
            control = rows.get("original again", {})
            if "latency_all_ratio" in control:
                g["control_latency_all"] = control["latency_all_ratio"]
            lat = {t: r["latency_all_ratio"] for t, r in others.items() if "latency_all_ratio" in r}
            g["latency_ok_vs_original"] = op["latency_all_ratio"] <= LATENCY_GOAL
            if lat:
                best = min(lat, key=lambda t: lat[t])
                g["best_other_latency_all"] = [best, lat[best]]
                g["latency_ok_vs_best"] = op["latency_all_ratio"] <= lat[best]
                if not g["latency_ok_vs_best"] and "control_latency_all" in g:
                    # behind, but by no more than the original differs from itself
                    noise = abs(1.0 - g["control_latency_all"])
                    g["latency_within_noise_of_best"] = op["latency_all_ratio"] - lat[best] <= noise
            _tuned(g, rows.get("opfuse-tune"), max_rel)
        out["models"][entry["model"]] = g
    polygraphy = [
        rows["opfuse"].get("polygraphy")
        for rows in (e.get("rows", {}) for e in doc["models"])
        if "opfuse" in rows
    ]
    if any(v is not None for v in polygraphy):
        out["polygraphy_ok"] = f"{sum(v is True for v in polygraphy)}/{len(polygraphy)}"
    for key in ("nodes_ok", "time_ok", "latency_ok_vs_original", "latency_ok_vs_best"):
        vals = [g[key] for g in out["models"].values() if key in g]
        out[key] = f"{sum(vals)}/{len(vals)}"
    out["latency_within_noise_of_best"] = sum(
        bool(g.get("latency_within_noise_of_best")) for g in out["models"].values()
    )
    for key in ("tuned_ok_vs_original", "tuned_ok_vs_default", "tuned_ok_vs_best"):
        vals = [g[key] for g in out["models"].values() if key in g]
        out[key] = f"{sum(vals)}/{len(vals)}"
    tuned = [g["tuned_latency_all"] for g in out["models"].values() if "tuned_latency_all" in g]
    if tuned:
        out["tuned_geomean"] = math.exp(sum(math.log(r) for r in tuned) / len(tuned))
        out["tuned_models"] = len(tuned)
        out["tuned_beat_best"] = [
            m
            for m, g in out["models"].items()
            if g.get("tuned_ok_vs_best") and "tuned_latency_all" in g
        ]
    big = [
        e for name, e in doc.get("scale", {}).items() if name not in ("transformer_tiny", "tx100")
    ]
    if big:
        op = big[0]["tools"].get("opfuse", {})
        if op.get("status") == "ok":
            out["scale_s"] = op["optimize_s"]
            out["scale_ok"] = op["optimize_s"] < SCALE_GOAL_S
    return out


def _f(value: Any, fmt: str, missing: str = "") -> str:
    return missing if value is None else format(value, fmt)


def _err(value: Any) -> str:
    if value is None:
        return ""
    if value == 0:
        return "0"
    return f"{value:.1e}"


def _mark(ok: Any) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    s = doc["settings"]
    lines = [
        "# Benchmarks",
        "",
        "opfuse against the optimizers users have today, measured side by side in one run on one "
        "machine. Made by `bench/` (see its docstrings); regenerate with:",
        "",
        "    " + MAKE_TARGETS.get(doc["command"], doc["command"]),
        "",
        f"in {doc['total_s'] / 60:.1f} min on: {m['nproc']} CPUs ({m['cpu']}), "
        f"{m['memory_gb']} GB memory, {m['os']}, Python {m['python']}, "
        f"opfuse at commit {m['opfuse_commit'] or '?'}"
        + (" (with uncommitted changes)" if m["opfuse_commit"].endswith("-dirty") else "")
        + ".",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "## How each figure is measured",
        "",
        "- Tools, each run file to file in a fresh process with a "
        f"{s['timeout_s']:.0f} s timeout (a crash or hang is reported in its row): "
        + "; ".join(f"**{t}** {how}" for t, how in doc["tools"].items())
        + ".",
        "- **nodes**: of the main graph and subgraphs. **MB**: the file and its external data.",
        "- **opt s**: wall time of the file-to-file optimization (load, optimize, save) inside "
        "the tool's process, after its imports (the package and the modules its call imports; "
        "a command-line user also waits for those: about 1 s for opfuse, mostly onnx and "
        "onnx-ir, which imports sympy). **peak MB**: VmHWM of that process from "
        "/proc/<pid>/status (polled, and read by the process at exit), imports included.",
        "- **abs err / rel err**: max absolute error over all outputs vs the original, and that "
        "error divided by the output's largest magnitude; both models under onnxruntime with "
        f"optimizations off, seeded inputs (seed {s['seed']}, batch {s['batch']}, "
        f"{s['dynamic_dim']} for other dynamic dims; integer inputs in {{0, 1}}).",
        "- **lat off / lat all**: latency at `ORT_DISABLE_ALL` / `ORT_ENABLE_ALL` as a "
        "ratio to the original's at the same level, the median of the per-round ratios (so "
        "that load changing between rounds cancels; the original's row gives its median in "
        "milliseconds); "
        f"{s['threads']} thread, batch {s['batch']}, {s['warmup']} warm-up runs, then the runs "
        "of all variants of a model interleaved round-robin (as many rounds as fit in "
        f"{s['latency_budget_s']:.0f} s, at least 5).",
        "- **lat ov**: median OpenVINO CPU latency (one thread) of the original, opfuse's "
        "output and the tuned output, where OpenVINO is installed, measured like lat all "
        "(`opfuse.tuning.measure`: interleaved, the original twice; its noise is under the table).",
        "- **session s**: creation time of an `ORT_ENABLE_ALL` session, in a fresh process "
        "after onnxruntime's one-time setup.",
        "- **poly**: polygraphy's default comparison (`polygraphy run --onnxrt`: every element "
        "within 1e-5 + 1e-5 * |ref|) of the outputs at `ORT_ENABLE_ALL` against the "
        "original's there (blank: polygraphy not installed). "
        "`python -m bench.polygraphy_check` runs the polygraphy command itself on every model.",
        "",
    ]
    lines += _goal_section(doc)
    lines += _scale_section(doc)
    lines += ["## Per model", ""]
    header = "| tool | nodes | MB | opt s | peak MB | abs err | rel err | lat off | lat all | lat ov | session s | poly | status |"
    for entry in doc["models"]:
        runs = entry.get("latency_runs")
        lines += [f"### {entry['model']}" + (f" ({runs} latency rounds)" if runs else ""), ""]
        if "error" in entry:
            lines += [entry["error"], ""]
            continue
        lines += [header, "|" + "---|" * header.count(" |")]
        for tool, row in entry["rows"].items():
            status = row.get("status", "")
            if tool == "original again":
                status = "the same file again: the noise of the latency ratios"
            elif status == "ok" and row.get("check") not in (None, "ok"):
                status = f"check failed: {row['check']}"
            if tool == "original":
                lat_off = _f(row.get("latency_off_s", 0) * 1e3 or None, ".2f") + " ms"
                lat_all = _f(row.get("latency_all_s", 0) * 1e3 or None, ".2f") + " ms"
                lat_ov = _f(row.get("latency_ov_s", 0) * 1e3 or None, ".2f") + " ms"
            else:
                lat_off = _f(row.get("latency_off_ratio"), ".3f")
                lat_all = _f(row.get("latency_all_ratio"), ".3f")
                lat_ov = _f(row.get("latency_ov_ratio"), ".3f")
            mb = row.get("bytes")
            lines.append(
                f"| {tool} | {_f(row.get('nodes'), 'd')} | {_f(mb and mb / 1e6, '.2f')} "
                f"| {_f(row.get('optimize_s'), '.2f')} | {_f(row.get('peak_mb'), '.0f')} "
                f"| {_err(row.get('max_abs_err'))} | {_err(row.get('max_rel_err'))} "
                f"| {lat_off} | {lat_all} | {lat_ov} | {_f(row.get('session_all_s'), '.3f')} "
                f"| {_mark(row.get('polygraphy'))} | {'' if status == 'ok' else status} |"
            )
        if "latency_error" in entry:
            lines.append(f"\nlatency not measured: {entry['latency_error']}")
        if "openvino" in entry:
            ov = entry["openvino"]
            lines.append(f"\nlat ov: {ov['runtime']}, noise +-{ov['noise']:.1%}")
        elif "openvino_error" in entry:
            lines.append(f"\nOpenVINO latency not measured: {entry['openvino_error']}")
        lines.append("")
    return "\n".join(lines)


def _tuned(g: dict[str, Any], tune: dict[str, Any] | None, max_rel: float) -> None:
    """opfuse tune's row against the original, opfuse's default and the best other tool,
    each within the model's noise (the original measured twice) where the goal allows."""
    if not valid(tune, max_rel) or "latency_all_ratio" not in (tune or {}):
        return
    assert tune is not None
    ratio = tune["latency_all_ratio"]
    noise = abs(1.0 - g.get("control_latency_all", 1.0))
    g["tuned_latency_all"] = ratio
    if "session" in tune:
        g["tuned_session"] = tune["session"]
    g["tuned_ok_vs_original"] = ratio <= 1.0 + noise
    g["tuned_ok_vs_default"] = ratio <= g["latency_all_ratio"] + noise
    if "best_other_latency_all" in g:
        g["tuned_ok_vs_best"] = ratio <= g["best_other_latency_all"][1]


def _session_cell(session: dict[str, Any] | None) -> str:
    """tune's session choice and its measured ratio to the start (1 thread, level all)."""
    if not session:
        return ""
    if session["chosen"] == session["start"]:
        return "start kept"
    return f"{session['chosen']}: {session['latency_ratio_to_start']:.2f}"


def _tuned_summary(g: dict[str, Any]) -> str:
    if "tuned_geomean" not in g:
        return ""
    beat = ", ".join(g["tuned_beat_best"]) or "none"
    return (
        f"\n\nTuned (`opfuse tune`, the opfuse-tune row): geomean latency ratio at "
        f"`ORT_ENABLE_ALL` {g['tuned_geomean']:.3f} over {g['tuned_models']} models (goal <= "
        f"{TUNED_GEOMEAN_GOAL:.2f}){_mark(g['tuned_geomean'] <= TUNED_GEOMEAN_GOAL)}; at or "
        f"below the best other tool on {g['tuned_ok_vs_best']} ({beat}); not slower than the "
        f"original beyond the noise on {g['tuned_ok_vs_original']}; at least as fast as "
        f"opfuse's default output within the noise on {g['tuned_ok_vs_default']}."
    )


def _goal_section(doc: dict[str, Any]) -> list[str]:
    g = doc["goals"]
    lines = [
        "## opfuse against the goals",
        "",
        f"Goals: nodes at or below the best other tool's; optimize time at most {TIME_GOAL}x "
        f"onnxslim's; latency at `ORT_ENABLE_ALL` at most {LATENCY_GOAL}x the original's and "
        "at or below the best other tool's. Only tools whose output matches the original "
        f"(rel err <= {doc['settings']['valid_rel_err']:g}) count as the best other. The last "
        "column is the original measured a second time in the same interleaved runs: how far "
        "it is from 1.000 is the noise of every latency ratio of that model (the machine is "
        "shared; latency ratios within that distance of a goal are not decided).",
        "",
        f"Met on: nodes {g['nodes_ok']} models, time {g['time_ok']}, latency vs original "
        f"{g['latency_ok_vs_original']}, latency vs best other {g['latency_ok_vs_best']}"
        + (
            f" (and {g['latency_within_noise_of_best']} more behind it by no more than their "
            "noise column)"
            if g.get("latency_within_noise_of_best")
            else ""
        )
        + (
            f"; ~40k-node model in {g['scale_s']:.1f} s (goal < {SCALE_GOAL_S:.0f} s){_mark(g['scale_ok'])}"
            if "scale_s" in g
            else ""
        )
        + (
            f"; polygraphy's default comparison passes on {g['polygraphy_ok']} models"
            if "polygraphy_ok" in g
            else ""
        )
        + "."
        + _tuned_summary(g),
        "",
        "| model | opfuse nodes | best other | opfuse time / onnxslim | opfuse lat all "
        "| tuned lat all | tuned session (its ratio to 1 thread) | best other lat all "
        "| original again (noise) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, r in g["models"].items():
        if "nodes" not in r:
            lines.append(f"| {model} | opfuse {r['opfuse']} | | | | | | | |")
            continue
        best = r.get("best_other_nodes")
        best_lat = r.get("best_other_latency_all")
        lines.append(
            f"| {model} | {r['nodes']}{_mark(r.get('nodes_ok'))} "
            f"| {f'{best[1]} ({best[0]})' if best else ''} "
            f"| {_f(r.get('time_vs_onnxslim'), '.2f')}{_mark(r.get('time_ok'))} "
            f"| {_f(r.get('latency_all_ratio'), '.3f')}{_mark(r.get('latency_ok_vs_original'))}"
            f"{'' if r.get('latency_ok_vs_best') is None else (' (best)' if r['latency_ok_vs_best'] else '')} "
            f"| {_f(r.get('tuned_latency_all'), '.3f')}"
            f"{'' if r.get('tuned_ok_vs_best') is None else (' (best)' if r['tuned_ok_vs_best'] else '')} "
            f"| {_session_cell(r.get('tuned_session'))} "
            f"| {f'{best_lat[1]:.3f} ({best_lat[0]})' if best_lat else ''} "
            f"| {_f(r.get('control_latency_all'), '.3f')} |"
        )
    return lines + [""]


def _scale_section(doc: dict[str, Any]) -> list[str]:
    table = doc.get("scale") or {}
    if not table:
        return []
    tools = [t for t in TOOLS if any(t in e["tools"] for e in table.values())]
    lines = [
        "## Scale: optimize time per 1,000 nodes",
        "",
        "transformer_tiny and tx100 from the zoo; tx430 is the zoo's stacks chained "
        "(4 x tx100 + 3 x transformer_tiny, 430 pre-LN blocks; bench/scale.py), optimized "
        f"with a {doc['settings'].get('scale_timeout_s', doc['settings']['timeout_s']):.0f} s "
        "timeout. Seconds, and seconds per 1,000 nodes in brackets.",
        "",
        "| model | nodes | " + " | ".join(tools) + " |",
        "|---|---|" + "---|" * len(tools),
    ]
    for name, e in table.items():
        cells = []
        for t in tools:
            r = e["tools"].get(t)
            if not r:
                cells.append("")
            elif r.get("status") == "ok":
                cells.append(f"{r['optimize_s']:.2f} ({r['s_per_1k_nodes']:.3f})")
            else:
                cells.append(str(r.get("status")))
        lines.append(f"| {name} | {e['nodes']} | " + " | ".join(cells) + " |")
    return lines + [""] + _engine_lines(table)


ENGINE_GOAL = 1.5  # opfuse's time over onnxruntime-basic's session creation, largest model


def _engine_lines(table: dict[str, Any]) -> list[str]:
    """The engine against onnxruntime's C++ optimizer on the largest model, and where its
    time goes (per phase, and per stage of passes over all rounds)."""
    name, e = max(table.items(), key=lambda kv: kv[1]["nodes"])
    ours, ort = e["tools"].get("opfuse", {}), e["tools"].get("ort-basic", {})
    if ours.get("status") != "ok" or ort.get("status") != "ok":
        return []
    ratio = ours["optimize_s"] / ort["optimize_s"]
    runs = ""
    if "runs_s" in ours and "runs_s" in ort:
        runs = (
            f"; medians of {len(ours['runs_s'])} runs each, in turn: opfuse "
            f"{', '.join(f'{x:.2f}' for x in ours['runs_s'])} s, onnxruntime "
            f"{', '.join(f'{x:.2f}' for x in ort['runs_s'])} s"
        )
    lines = [
        f"Engine on {name}: opfuse {ours['optimize_s']:.2f} s vs onnxruntime ORT_ENABLE_BASIC "
        f"{ort['optimize_s']:.2f} s (its C++ optimizer, writing the model too{runs}): "
        f"**{ratio:.2f}x** (goal <= {ENGINE_GOAL:g}x){_mark(ratio <= ENGINE_GOAL)}.",
        "",
    ]
    engine = e.get("engine") or {}
    if "timings" in engine:
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in engine["timings"].items())
        lines += [f"Its phases (a separate run): {phases}.", ""]
        lines += ["| stage of passes (all rounds) | seconds |", "|---|---|"]
        for stage, seconds in sorted(engine["pass_seconds"].items(), key=lambda kv: -kv[1]):
            shown = stage if len(stage) <= 90 else stage[:87] + "..."
            lines.append(f"| {shown} | {seconds:.2f} |")
        lines.append("")
    return lines
