"""Worker processes: spawned fresh (never forked from the scheduler's state),
handed their secret on stdin (never on the command line, where `ps` shows it),
watched through a pidfd that becomes readable the moment the process exits,
and stopped politely, then with SIGTERM, then with SIGKILL, each wait bounded.

Workers run in their own session so a terminal's Ctrl-C reaches only the
scheduler, which then stops them; they also watch the scheduler themselves
(parent-death signal and a pidfd), so a scheduler killed with SIGKILL takes
its workers with it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence


class WorkerProcess:
    """One rank's process: its Popen, a sentinel fd for polling, and its stderr log."""

    def __init__(self, rank: int, proc: subprocess.Popen, log_path: Path):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.log_path = log_path
        self._pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(proc.pid)
            except OSError:
                self._pidfd = None

    @property
    def sentinel(self) -> int | None:
        """An fd that polls readable once the process has exited (None: poll `alive()`)."""
        return self._pidfd

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def last_words(self, limit: int = 300) -> str:
        """The last line the worker wrote to stderr, if any."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:limit] if lines else ""

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def spawn_workers(argv_for_rank: Callable[[int], Sequence[str]], world_size: int, secret: bytes,
                  ranks: Sequence[int] | None, log_dir: Path,
                  env: dict | None = None) -> list[WorkerProcess]:
    """Start one process per rank (all when `ranks` is None); each reads the hex secret from
    its stdin first and writes its stderr to a log in `log_dir` (the caller's to remove)."""
    workers = []
    try:
        for rank in (range(world_size) if ranks is None else ranks):
            log_path = log_dir / f"rank{rank}.{int(time.monotonic() * 1000)}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(list(argv_for_rank(rank)), stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=log, close_fds=True,
                                        start_new_session=True, env=env)
            try:
                proc.stdin.write(secret.hex().encode() + b"\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once; the handshake will say so
            workers.append(WorkerProcess(rank, proc, log_path))
    except BaseException:
        stop_workers(workers, grace=0.0)
        raise
    return workers


def wait_all(workers: Sequence[WorkerProcess], timeout: float) -> list[WorkerProcess]:
    """Wait until every worker exited or the timeout passed; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = [w for w in workers if w.alive()]
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            alive[0].proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            break
        alive = [w for w in alive if w.alive()]
    return alive


def stop_workers(workers: Sequence[WorkerProcess], polite: Callable[[], None] | None = None,
                 grace: float = 1.0, term_wait: float = 1.0, kill_wait: float = 5.0) -> None:
    """Stop every worker: ask (`polite`), then SIGTERM, then SIGKILL; reap them all."""
    if polite is not None and any(w.alive() for w in workers):
        try:
            polite()
        except Exception:
            pass  # the signals below do the job
    alive = wait_all(workers, grace)
    for w in alive:
        w.signal(signal.SIGTERM)
    alive = wait_all(alive, term_wait)
    for w in alive:
        w.signal(signal.SIGKILL)
    wait_all(alive, kill_wait)
    for w in workers:
        w.close()
