"""No function over 80 lines in the doors and the conductors (issues 33 and 40): ``cli/``,
``api.py``, ``pipeline/``, ``advisor/report.py``, ``advisor/html.py``, the advise and
tune conductors and all of ``quantization/``. A function's
length is ``end_lineno - lineno + 1`` from its ``def`` line to its last line, docstring
included, decorators excluded (a click command's option declarations are not its body);
methods and nested functions count on their own."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "opfuse"
MAX_LINES = 80
CHECKED = [
    *sorted((SRC / "cli").glob("*.py")),
    SRC / "api.py",
    *sorted((SRC / "pipeline").rglob("*.py")),
    SRC / "advisor" / "report.py",
    SRC / "advisor" / "html.py",
    SRC / "advisor" / "conductor.py",
    SRC / "tuning" / "conductor.py",
    *sorted((SRC / "quantization").glob("*.py")),
]


def long_functions(source: str, where: str) -> list[str]:
    """``where:line name (N lines)`` for each function longer than ``MAX_LINES``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines_in_the_doors_and_conductors():
    assert all(path.is_file() for path in CHECKED) and len(CHECKED) > 10
    found = [
        line
        for path in CHECKED
        for line in long_functions(path.read_text("utf-8"), str(path.relative_to(SRC)))
    ]
    assert not found, f"over {MAX_LINES} lines: " + "; ".join(found)


def test_the_measure_counts_from_def_to_the_end_without_decorators():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    fits = f"@decorator\n@decorator\ndef fits():\n{body}"
    assert long_functions(fits, "m.py") == []
    method = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    over = f"class C:\n    def over(self):\n{method}"
    assert long_functions(over, "m.py") == [f"m.py:2 over ({MAX_LINES + 1} lines)"]
