"""Fixtures shared by the tests, and the check that no worker outlives its test.

Each test process makes itself a child subreaper: a worker whose parent (a scheduler, or the
template that forked it) dies is re-parented to us rather than to init, so every process our
tests caused to start stays in view. After each test marked `procs`, any of them still
running (a rank worker, spawned or forked, or a worker template) fails the test and is killed.

Every wire log written while the tests run is checked against its schema as it is written
(observe/schema.py): in this process and in every process the tests start, so a writer that
drifts from the schema fails the test that made it write.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

import pytest
from external import ENV, keys_for, stop_all
from procs import wait_until

from inferris_dist.observe.records import CHECK_ENV

PR_SET_CHILD_SUBREAPER = 36
OURS = (b"inferris_dist.rank", b"inferris_dist.launcher.template")   # in a worker's command line


def pytest_configure(config):
    os.environ[CHECK_ENV] = ENV[CHECK_ENV] = "1"     # ENV: what the tests hand the processes they start
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass                                   # not Linux: orphans go to init, out of view


def descendants(root: int) -> dict[int, bytes]:
    """Every live (not zombie) process below `root`: pid -> its command line."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in "ZX":
            parent_of[int(entry)] = int(fields[1])
    found: dict[int, bytes] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parent_of.items():
            if parent == pid and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                frontier.append(child)
    return found


def leftover_workers(timeout: float = 10.0) -> dict[int, bytes]:
    """Our workers and templates still running below this process after `timeout` seconds
    (a worker leaves on its own when its scheduler is gone: give it the time to)."""
    def ours() -> dict[int, bytes]:
        return {pid: cmd for pid, cmd in descendants(os.getpid()).items() if any(o in cmd for o in OURS)}
    wait_until(lambda: not ours(), timeout, interval=0.05)
    return ours()


@pytest.fixture(autouse=True)
def no_worker_left(request):
    """After a test that starts processes: none of our workers may still run."""
    yield
    if request.node.get_closest_marker("procs") is None:
        return
    left = leftover_workers()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        pytest.fail("left running: " + "; ".join(f"{pid} {cmd.decode(errors='replace')[:120]}"
                                                 for pid, cmd in left.items()), pytrace=False)


@pytest.fixture
def keys(tmp_path) -> Path:
    """CURVE keys for a scheduler and 4 ranks, in a fresh directory."""
    return keys_for(tmp_path)


@pytest.fixture
def procs():
    """Processes a test starts; whatever still runs at the end is killed (and must die)."""
    started: list[subprocess.Popen] = []
    yield started
    stop_all(started)
