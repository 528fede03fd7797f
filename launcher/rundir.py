"""A run's private directory: worker logs and the scheduler's socket, reachable by its owner only.

`inferris-dist-PID-XXXXXXXX.run` in the temp dir, mode 0700 (so a local socket in it
is out of reach of other users). For its whole life the run holds an exclusive
`flock` on the `lock` file inside; that lock, not the PID in the name, says the run
is alive (a PID means nothing from another PID namespace). A scheduler killed with
SIGKILL cannot remove its own directory: the kernel drops its lock, and the next run
removes every directory of ours whose lock it can take.

The lock fd is opened O_CLOEXEC, so no worker or template started with exec inherits it
(a template the command line forks closes every descriptor it does not use): an inherited
fd would share the lock and keep a dead run "alive".
flock, not fcntl/lockf: a POSIX lock is the process's, so a process would take its
own live run's lock again and sweep it; a flock lock is the open file's.

Where `DIR/s` is too long for a unix socket address (sun_path: 108 bytes, for a long
TMPDIR), the socket goes to a directory of the same kind (0700, ours, locked) under a
short root ($XDG_RUNTIME_DIR, /tmp), removed with the run; without one, `socket_path`
refuses. Never TCP: a port on loopback is open to every local user.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "inferris-dist-"
SUFFIX = ".run"          # mkdtemp's random part has no '.': a name with it is a locked directory
LOCK = "lock"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


class _Held:
    """A directory we made and lock, and the short socket directory made for it (if any)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd
        self.owner = os.getpid()            # a forked child must not remove its parent's
        self.short: _Held | None = None

    def release(self) -> None:
        for held in ([self.short] if self.short is not None else []) + [self]:
            shutil.rmtree(held.path, ignore_errors=True)       # while still locked
            if held.fd >= 0:
                os.close(held.fd)
                held.fd = -1

    def gone(self) -> bool:
        """Its directory was removed by someone else (the lock file is unlinked)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True


_held: dict[Path, _Held] = {}


def make_run_dir(root: str | Path | None = None) -> Path:
    """A fresh private run directory in `root` (the temp dir), locked until the run ends
    (`remove_run_dir`, or this process's exit); stale ones are swept first."""
    _forget_removed()
    sweep_stale(root)
    if root is None:
        for short in short_roots():
            sweep_stale(short)
    path, fd = _make_locked(str(root or tempfile.gettempdir()))
    _held[path] = _Held(path, fd)
    return path


def _make_locked(root: str) -> tuple[Path, int]:
    """mkdtemp, then its lock file, already locked when it appears under its name: a sweep
    never sees a directory of ours with a lock file it could take while we live."""
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", suffix=SUFFIX, dir=root))
    try:
        fd = os.open(path / ".lock-new", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(path / ".lock-new", path / LOCK)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


def remove_run_dir(path: str | Path) -> None:
    """Remove a run directory made here, and its short socket directory; drop the locks."""
    held = _held.pop(Path(path), None)
    if held is not None:
        held.release()
    else:
        shutil.rmtree(path, ignore_errors=True)


def short_roots() -> list[str]:
    """Where a socket directory may go when the run directory is too deep for one."""
    roots = [os.environ.get("XDG_RUNTIME_DIR", ""), "/tmp"]
    return [r for r in roots if r.startswith("/")]


MAX_IPC_PATH = 100       # sun_path holds 108 bytes


def local_endpoint(run_dir: str | Path) -> str:
    """The address of the run's own unix socket, where its spawned workers connect."""
    return f"ipc://{socket_path(run_dir, 's', MAX_IPC_PATH)}"


def socket_path(run_dir: str | Path, name: str, limit: int, roots: list[str] | None = None) -> Path:
    """Where the run's unix socket `name` goes: in the run directory if the path fits in
    `limit` bytes, else in a short private directory of ours (0700, not a symlink, locked,
    removed with the run). OSError when there is none: a local socket is never TCP."""
    run_dir = Path(run_dir)
    path = run_dir / name
    if len(os.fsencode(path)) <= limit:
        return path
    held = _held.get(run_dir)
    if held is not None and held.short is not None:
        return held.short.path / name
    tried = []
    for root in short_roots() if roots is None else roots:
        short = _short_dir(root, name, limit)
        if isinstance(short, str):
            tried.append(short)
            continue
        if held is not None:
            held.short = short
        else:                                   # not a run directory of ours: its own entry
            _held[short.path] = short
        return short.path / name
    raise OSError(errno.ENAMETOOLONG,
                  f"the run directory {run_dir} is too long for a unix socket ({len(os.fsencode(path))} > "
                  f"{limit} bytes) and no short private directory could be made "
                  f"({'; '.join(tried) or 'no place to try'}): set TMPDIR to a shorter directory")


def _short_dir(root: str, name: str, limit: int) -> _Held | str:
    """A locked private directory under `root`, or why not (a short phrase)."""
    try:
        real = os.path.realpath(root)
        st = os.stat(real)
        if not stat.S_ISDIR(st.st_mode):
            return f"{root}: not a directory"
        if st.st_uid not in (0, os.getuid()):
            return f"{root}: owned by another user"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{root}: writable by others and not sticky"
        if len(os.fsencode(os.path.join(real, f"{PREFIX}{os.getpid()}-XXXXXXXX{SUFFIX}", name))) > limit:
            return f"{root}: too long"
        sweep_stale(real)
        path, fd = _make_locked(real)
    except OSError as e:
        return f"{root}: {e.strerror or e}"
    made = _Held(path, fd)
    try:
        st = os.lstat(path)
    except OSError as e:
        made.release()
        return f"{root}: {e.strerror or e}"
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
            or stat.S_IMODE(st.st_mode) != 0o700):
        made.release()
        return f"{root}: the directory made there is not ours alone"
    if len(os.fsencode(path / name)) > limit:
        made.release()
        return f"{root}: too long"
    return made


def sweep_stale(root: str | Path | None = None) -> list[Path]:
    """Remove run directories we own whose run is gone; returns those removed.

    A directory with the `.run` suffix is gone when we can take its lock (non-blocking);
    one without its lock file yet is left alone. A directory of ours without the suffix (and
    so without a lock) is judged by the PID in its name: gone when that PID is.
    """
    _forget_removed()
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
        if entry.name.endswith(SUFFIX):
            if _take_and_remove(entry.path):
                removed.append(Path(entry.path))
            continue
        if _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _take_and_remove(path: str) -> bool:
    """Remove the directory if nobody holds its lock (holding it meanwhile)."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False                # no lock file (being made, or broken): not ours to judge
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False            # held: the run is alive (whatever its PID looks like here)
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _forget_removed() -> None:
    """Runs whose directory someone removed (the group's close): drop their locks and remove
    their short socket directories."""
    for path, held in list(_held.items()):
        if held.owner == os.getpid() and held.gone() and _held.pop(path, None) is held:
            held.release()


@atexit.register
def _release_all() -> None:
    for path, held in list(_held.items()):
        if held.owner == os.getpid() and _held.pop(path, None) is held:
            held.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
