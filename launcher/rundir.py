"""A run's private directory: worker logs and the scheduler's socket, reachable by its owner only.

`inferris-dist-PID-XXXX` in the temp dir, mode 0700 (so a local socket in it is
out of reach of other users). A scheduler killed with SIGKILL cannot remove its
own: the next run removes every such directory of ours whose PID is gone.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "inferris-dist-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


def make_run_dir() -> Path:
    sweep_stale()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def sweep_stale(root: str | Path | None = None) -> list[Path]:
    """Remove run directories we own whose scheduler is gone; returns those removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        m = _NAME.match(entry.name)
        if not m:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
