"""Helpers for tests on real processes: is a pid gone, and waiting on a condition."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path


def gone(pid: int) -> bool:
    """The process no longer runs: no /proc entry, or a zombie (dead, not yet reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        status = None
    if status is not None:
        m = re.search(r"^State:\s*(\S)", status, re.M)
        return bool(m) and m.group(1) in "ZX"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def wait_until(condition, timeout: float, interval: float = 0.02) -> bool:
    """Poll `condition` until it holds or the deadline passes; its final value."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return condition()
        time.sleep(interval)


def all_gone(pids, timeout: float) -> list[int]:
    """Wait until every pid is gone; those still running at the deadline."""
    wait_until(lambda: all(gone(p) for p in pids), timeout)
    return [p for p in pids if not gone(p)]
