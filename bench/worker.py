"""One optimization in a fresh process: ``python -m bench.worker TOOL SRC DST RESULT_JSON``.

Imports the tool and what its call imports first (untimed), then times the file-to-file run, then writes the time and
this process's VmHWM to RESULT_JSON. A crash leaves no result file; the harness reports it."""

from __future__ import annotations

import importlib
import json
import sys
import time

from bench.proc import vmhwm_kb
from bench.tools import TOOLS


def main(argv: list[str]) -> int:
    name, src, dst, result = argv
    tool = TOOLS[name]
    for module in (tool.module, *tool.imports):
        importlib.import_module(module)
    start = time.perf_counter()
    tool.optimize(src, dst)
    seconds = time.perf_counter() - start
    with open(result, "w") as f:
        json.dump({"seconds": seconds, "peak_kb": vmhwm_kb()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
