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


def connect_as_nobody(path) -> str:
    """Try to connect to a unix socket as user nobody (a forked child that drops root):
    "connected", "denied", or "error"."""
    import pwd
    import socket
    nobody = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:                                        # the child: no Python cleanup, just the try
        code = 3
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(str(path))
                code = 0
            except PermissionError:
                code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "connected", 1: "denied"}.get(os.waitstatus_to_exitcode(status), "error")
