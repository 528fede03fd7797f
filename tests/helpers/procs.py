"""Helpers for tests on real processes: is a pid gone, waiting on a condition, and the one check
that none of our workers outlives its test (`leftover_workers`, run by conftest after every test
marked `procs`)."""
from __future__ import annotations

import os
import time

from inferris_dist.chaos.harness import gone  # noqa: F401  (the library's rule for a pid gone)

OURS = (b"inferris_dist.rank", b"inferris_dist.launcher.template")   # in a worker's command line
LEFT_WITHIN = 10.0     # seconds a worker may take to leave once its test is done (its scheduler gone)


def wait_until(condition, timeout: float, interval: float = 0.02) -> bool:
    """Poll `condition` until it holds or the deadline passes; its final value."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return condition()
        time.sleep(interval)


def descendants(root: int) -> dict[int, bytes]:
    """Every live (not zombie) process below `root`: pid -> its command line."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split(None, 2)
        if fields[0] not in b"ZX":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: dict[int, bytes] = {}
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child in found:
                continue
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    found[child] = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            frontier.append(child)
    return found


def leftover_workers(timeout: float = LEFT_WITHIN) -> dict[int, bytes]:
    """Our workers and templates still running below this process after `timeout` seconds
    (a worker leaves on its own when its scheduler is gone: give it the time to)."""
    def ours() -> dict[int, bytes]:
        return {pid: cmd for pid, cmd in descendants(os.getpid()).items() if any(o in cmd for o in OURS)}
    left = ours()
    if left:                                 # the common case, none, costs one look
        wait_until(lambda: not ours(), timeout, interval=0.05)
        left = ours()
    return left


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
