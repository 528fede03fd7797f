"""Fixtures shared by the tests, and the check that no worker outlives its test.

Each test process makes itself a child subreaper: a worker whose parent (a scheduler, or the
template that forked it) dies is re-parented to us rather than to init, so every process our
tests caused to start stays in view. After each test marked `procs`, any of them still
running (a rank worker, spawned or forked, or a worker template) after LEFT_WITHIN seconds, or
the marker's own `left_within`, fails the test and is killed: tests.helpers.procs's
`leftover_workers`, the one leftover check of the suite.

Every wire log written while the tests run is checked against its schema as it is written
(wirelog/schema.py): in this process and in every process the tests start, so a writer that
drifts from the schema fails the test that made it write.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from inferris_dist.wirelog.writer import CHECK_ENV

from tests.helpers.external import ENV, REPO, keys_for, stop_all
from tests.helpers.procs import LEFT_WITHIN, leftover_workers

PR_SET_CHILD_SUBREAPER = 36

# The width of the terminal the tests were started from is not the commands' width: a step line is
# summarised to fit COLUMNS where it is set (pytest-xdist's workers have it), so the commands the
# tests start see none, and print at their default width.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
    ENV.pop(_var, None)


def pytest_configure(config):
    os.environ[CHECK_ENV] = ENV[CHECK_ENV] = "1"     # ENV: what the tests hand the processes they start
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass                                   # not Linux: orphans go to init, out of view


@pytest.fixture(autouse=True)
def no_worker_left(request):
    """After a test that starts processes: none of our workers may still run."""
    yield
    marker = request.node.get_closest_marker("procs")
    if marker is None:
        return
    left = leftover_workers(marker.kwargs.get("left_within", LEFT_WITHIN))
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


@pytest.fixture(scope="session")
def wheel_file(tmp_path_factory) -> Path:
    """The package's wheel (`pip wheel --no-deps` of the checkout), built once for the whole
    session: pytest-xdist's test processes share it, the first to need it building it under a
    lock. Skips the test where no wheel can be built."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                     # the session's, above each test process's own
    out, failed = root / "wheel", root / "wheel.failed"
    with open(root / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir() and not failed.exists():
            part = root / "wheel.part"
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(part),
                                    str(REPO)], capture_output=True, text=True, timeout=150)
            if built.returncode == 0:
                part.rename(out)
            else:
                failed.write_text(repr(built.stderr.strip().splitlines()[-1:]))
    if failed.exists():
        pytest.skip(f"cannot build a wheel here (pip wheel: {failed.read_text()})")
    return next(out.glob("*.whl"))
