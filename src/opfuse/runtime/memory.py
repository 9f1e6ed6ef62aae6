"""A process's peak resident memory, read from Linux's /proc: the one VmHWM reader
(``opfuse batch`` records each task's peak with it; the bench harness its children's)."""

from __future__ import annotations


def vmhwm_bytes(pid: int | str = "self") -> int:
    """Peak resident set size (VmHWM in /proc/PID/status) of a live process, in bytes;
    0 once it is gone, or where /proc has no such line (not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # the kernel states kB
    except (OSError, ValueError, IndexError):
        pass
    return 0
