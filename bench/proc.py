"""Run one child process with a timeout and read its peak resident memory.

The peak is VmHWM from /proc/<pid>/status, polled while the child runs (the child also
reports its own at exit, which is exact). getrusage's maxrss is not used: across exec it
inherits the parent's peak and overstates a small child's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from opfuse.runtime.memory import vmhwm_bytes

POLL_S = 0.02
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ProcResult:
    returncode: int | None  # None: killed after the timeout
    wall_s: float
    peak_kb: int  # polled VmHWM; 0 when the child ended before the first poll
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def failure(self) -> str:
        """A one-line reason for a failed run ("" when it succeeded)."""
        if self.returncode is None:
            return f"timeout after {self.wall_s:.0f} s"
        if self.returncode == 0:
            return ""
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else ""
        if self.returncode < 0:
            return f"killed by signal {-self.returncode}" + (f": {last}" if last else "")
        return f"exit {self.returncode}" + (f": {last[:200]}" if last else "")


def vmhwm_kb(pid: int | str = "self") -> int:
    """Peak resident set size of a live process in KiB (0 if it is gone): opfuse's one
    VmHWM reader (a measurement of the process, not of the system under test)."""
    return vmhwm_bytes(pid) // 1024


def run_python(args: list[str], timeout: float, env: dict[str, str] | None = None) -> ProcResult:
    """``python -m ...`` in a fresh interpreter (the project root on sys.path), killed at the
    timeout together with any children it started."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p
    )
    full_env.update(env or {})
    return run([sys.executable, *args], timeout, full_env)


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> ProcResult:
    start = time.perf_counter()
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as child:
        peak = 0
        out_chunks: list[str] = []
        err_chunks: list[str] = []

        # Read pipes in threads so a chatty child cannot block on a full pipe.
        def drain(stream, sink: list[str]) -> None:
            for line in stream:
                sink.append(line)

        readers = [
            threading.Thread(target=drain, args=(child.stdout, out_chunks), daemon=True),
            threading.Thread(target=drain, args=(child.stderr, err_chunks), daemon=True),
        ]
        for t in readers:
            t.start()
        returncode: int | None = None
        while True:
            peak = max(peak, vmhwm_kb(child.pid))
            code = child.poll()
            if code is not None:
                returncode = code
                break
            if time.perf_counter() - start > timeout:
                _kill_group(child)
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - start
        for t in readers:
            t.join(timeout=5)
    return ProcResult(returncode, wall, peak, "".join(out_chunks), "".join(err_chunks))


def _kill_group(child: subprocess.Popen) -> None:
    """Kill the child and whatever it started (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
