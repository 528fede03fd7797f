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

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from .rundir import local_endpoint, make_run_dir, remove_run_dir
from .template import WORKER_MODULE

MAX_STATUSES = 1024     # exit statuses of forked workers kept (the oldest go first)
START_TIMEOUT = 20.0    # seconds for a template to be up, by default


def worker_args(rank: int, world_size: int, address: str, parent_pid: int, death_signal: bool) -> list[str]:
    """A spawned worker's arguments (after the interpreter and module, if any)."""
    return (["--rank", str(rank), "--world-size", str(world_size), "--connect", address,
             "--parent-pid", str(parent_pid)] + ["--death-signal"] * death_signal)


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

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` for the exit; True if it has exited (seen at once by pidfd)."""
        return exited_within(self.proc, timeout, self._pidfd)

    def exit_description(self) -> str:
        return describe_status(self.proc.poll())

    def last_words(self, limit: int = 300) -> str:
        """The last line the worker wrote to stderr, if any."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:limit] if lines else ""

    def signal(self, sig: int) -> None:
        if self.alive():
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
        if not alive[0].wait(left):
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


def readable(fd: int, timeout: float) -> bool:
    """Whether `fd` turns readable within `timeout` seconds. poll, not select: a scheduler
    whose descriptor limit was raised may hold descriptors past select's 1,024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000 + 0.999))))


def exited_within(proc: subprocess.Popen, timeout: float, pidfd: int | None = None) -> bool:
    """Whether `proc` exits within `timeout` s (reaped when it has), seen the moment it does
    through a pidfd, its own or one opened here (Popen.wait with a timeout polls, sleeping up
    to 50 ms between looks; it is the way only where there is no pidfd)."""
    opened = None
    if pidfd is None:
        try:
            pidfd = opened = os.pidfd_open(proc.pid)
        except (OSError, AttributeError):     # no pidfd here, or already reaped
            pidfd = None
    if pidfd is None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        if not readable(pidfd, timeout):
            return False
    finally:
        if opened is not None:
            os.close(opened)
    proc.wait()
    return True


def describe_status(code: int | None) -> str:
    """An exit code as Popen reports it (negative: the signal that killed it)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class ForkedProcess(WorkerProcess):
    """A worker forked by a Template: not our child, so watched by pidfd and told its exit
    status by the template that reaps it."""

    def __init__(self, rank: int, pid: int, log_path: Path, template: "Template"):
        self.rank = rank
        self.pid = pid
        self.proc = None
        self.log_path = log_path
        self.template = template
        self._exited = False
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def alive(self) -> bool:
        """Once seen gone, gone for good: after its pidfd is closed its pid may be reused."""
        if self._exited:
            return False
        if self._pidfd is not None:
            self._exited = readable(self._pidfd, 0.0)
        elif self.template.status_of(self.pid) is not None:
            self._exited = True
        else:
            try:
                with open(f"/proc/{self.pid}/stat") as f:   # a zombie the template has not reaped
                    self._exited = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except (OSError, IndexError):
                self._exited = True
        return not self._exited

    def wait(self, timeout: float) -> bool:
        if self._exited:
            return True
        if self._pidfd is not None:
            self._exited = readable(self._pidfd, timeout)
            return self._exited
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.alive()

    def exit_code(self) -> int | None:
        if self.alive():
            return None
        status = self.template.status_of(self.pid, wait=1.0)
        return None if status is None else os.waitstatus_to_exitcode(status)

    def exit_description(self) -> str:
        if self.alive():
            return "still running"
        code = self.exit_code()
        return "exited" if code is None else describe_status(code)


class _Child:
    """A child we forked (not through subprocess), as much of a Popen as a template needs:
    its pid, whether it has exited (seen through a pidfd), a kill, and a bounded wait that
    reaps it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Reap it, within `timeout` s if given (else TimeoutExpired, as Popen says)."""
        if self.returncode is not None:
            return self.returncode
        if timeout is not None and self._pidfd is not None:
            if not readable(self._pidfd, timeout):
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
        elif timeout is not None:              # no pidfd here: look every 5 ms
            deadline = time.monotonic() + timeout
            while self.poll() is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired([str(self.pid)], timeout)
                time.sleep(0.005)
            return self.returncode
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = 0
        self._reaped(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Template:
    """The scheduler's side of a template process (inferris_dist.launcher.template): fork workers fast.

    `start()` starts it and waits until it is up; or `begin()` now and the first `fork` waits,
    so that its interpreter and imports run while the starter does other work."""

    def __init__(self, module: str = WORKER_MODULE, log_dir: Path | None = None,
                 start_timeout: float = START_TIMEOUT, answer_timeout: float | None = None):
        """`log_dir`: where its log goes (None: a run directory of its own, removed when it is
        closed); `start_timeout`: for the template to be up; `answer_timeout` (default the
        same): for it to answer a fork, which takes it milliseconds (one that does not is
        given up on)."""
        self.module = module
        self.log_dir = log_dir
        self.own_dir = log_dir is None
        self.start_timeout = start_timeout
        self.answer_timeout = start_timeout if answer_timeout is None else answer_timeout
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._buf = b""
        self._statuses: dict[int, int] = {}
        self._began = 0.0
        self._up = False
        self._ahead: dict[int, tuple[list[str], Path]] = {}   # rank -> (argv, log): forked ahead
        self._ahead_secret = b""

    @classmethod
    def of_fork(cls, pid: int, sock: socket.socket, log_dir: Path, module: str = WORKER_MODULE) -> "Template":
        """The template a command line forked itself into (launcher.template.fork_template),
        begun: the first fork waits for it to be up."""
        template = cls(module=module, log_dir=log_dir)
        template.proc, template.sock, template._began = _Child(pid), sock, time.monotonic()
        return template

    def start(self) -> None:
        self.begin()
        self.wait_up()

    def begin(self) -> None:
        """Start the process; do not wait for it (OSError: it could not be started)."""
        if self.own_dir and self.log_dir is None:
            self.log_dir = make_run_dir()
        ours, theirs = socket.socketpair()
        log = open(self.log_dir / "template.log", "wb")
        try:
            main_thread = threading.current_thread() is threading.main_thread()
            argv = [sys.executable, "-m", "inferris_dist.launcher.template", self.module,
                    str(theirs.fileno())] + ["--death-signal"] * main_thread
            self.proc = subprocess.Popen(argv,
                                         pass_fds=[theirs.fileno()],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log, start_new_session=True)
        finally:
            theirs.close()
            log.close()
        self.sock = ours
        self._began = time.monotonic()

    def wait_up(self) -> None:
        """Wait until it says it is ready, within `start_timeout` of `begin` (else OSError)."""
        if self._up:
            return
        if self.sock is None:
            raise OSError("the worker template was not started")
        left = self._began + self.start_timeout - time.monotonic()
        if "ready" not in self._read(max(0.0, left)):
            raise OSError(f"the worker template did not start: {self._last_words()}")
        self._up = True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """Started and still running (a template shared between runs is checked before each)."""
        return self.proc is not None and self.sock is not None and self.proc.poll() is None

    def fork_ahead(self, asks: Sequence[tuple[int, Sequence[str], Path]], secret: bytes) -> None:
        """Ask now for workers a run will want, before it knows it wants them (the command
        line, as it starts): the template forks them as soon as it is
        up, and they connect and wait for the scheduler. `fork_all` later takes those it asks
        for alike (the same rank, arguments and secret) and kills the rest; so does another
        call of this, of those the last one asked for."""
        if self.sock is None:
            return
        if self._ahead:
            self.wait_up()                     # its answers come after it says it is up
            ahead, self._ahead = self._ahead, {}
            self._kill(self._answers(list(ahead), time.monotonic() + self.answer_timeout).values())
        self._send(asks, secret)
        self._ahead = {rank: (list(argv), log_path) for rank, argv, log_path in asks}
        self._ahead_secret = secret

    def fork_ahead_for(self, run_dir: Path, world_size: int, secret: bytes) -> None:
        """`fork_ahead` of what a group in `run_dir` asks for first: ranks 0..world_size-1 of
        a run on its local socket, with `secret`."""
        address = local_endpoint(run_dir)
        self.fork_ahead([(rank, worker_args(rank, world_size, address, self.pid, True),
                          log_path_of(run_dir, rank)) for rank in range(world_size)], secret)

    def fork_all(self, asks: Sequence[tuple[int, Sequence[str], Path]], secret: bytes) -> list[ForkedProcess]:
        """Fork a worker for each (rank, argv, log path): every ask sent at once, then the
        answers read (one round trip to the template, not one per worker), in the asks' order.
        A worker forked ahead for the same rank, arguments and secret is the one for its ask
        (with its own log); those forked ahead and not asked for are killed, and one that is
        gone by now (it waited too long for the scheduler) is asked for afresh."""
        self.wait_up()
        ahead, self._ahead = self._ahead, {}
        alike = {rank for rank, argv, _ in asks
                 if rank in ahead and ahead[rank][0] == list(argv) and secret == self._ahead_secret}
        # The answers come in the order of the asks: those sent ahead first, then these.
        deadline = time.monotonic() + self.answer_timeout
        early = self._answers(list(ahead), deadline)
        if alike:
            self._read(0.0)                    # the exit notes in by now (no answer is due)
        taken = {}
        for rank in alike:                     # one gone already waited too long: asked afresh
            w = ForkedProcess(rank, early[rank], ahead[rank][1], self)
            if early[rank] not in self._statuses and w.alive():
                taken[rank] = w
            else:
                w.close()
        self._kill(pid for rank, pid in early.items() if rank not in taken)   # forked ahead for nothing
        fresh = [a for a in asks if a[0] not in taken]
        self._send(fresh, secret)
        pids = self._answers([rank for rank, _, _ in fresh], deadline)
        return [taken.get(rank) or ForkedProcess(rank, pids[rank], log_path, self)
                for rank, _, log_path in asks]

    def _kill(self, pids) -> None:
        """Have the template kill these children of its own (it reaps them)."""
        lines = "".join(json.dumps({"kill": pid}) + "\n" for pid in pids)
        if lines:
            self._say(lines)

    def _answers(self, ranks: list[int], deadline: float) -> dict[int, int]:
        """The pid the template answered for each of `ranks` (asks sent, one per rank)."""
        pids: dict[int, int] = {}
        waiting = list(ranks)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:                      # stopped or stuck: given up on, never waited on
                pid = self.proc.pid if self.proc is not None else "?"
                raise OSError(f"the worker template (pid {pid}) did not answer within "
                              f"{self.answer_timeout:g} s (stopped or stuck)")
            got = self._read(left)
            if "pid" in got and got.get("rank") in waiting:
                waiting.remove(got["rank"])
                pids[got["rank"]] = got["pid"]
        return pids

    def _send(self, asks: Sequence[tuple[int, Sequence[str], Path]], secret: bytes) -> None:
        """The asks, to the template; their logs are made here first, not in the child: a full
        disk is ours to name (OSError with the file's name)."""
        if not asks:
            return
        for _, _, log_path in asks:
            open(log_path, "wb").close()
        self._say("".join(json.dumps({"fork": list(argv), "rank": rank, "secret": secret.hex(),
                                      "log": str(log_path)}) + "\n" for rank, argv, log_path in asks))

    def _say(self, lines: str) -> None:
        try:
            self.sock.settimeout(self.answer_timeout)     # a stopped template's buffer may be full
            self.sock.sendall(lines.encode())
        except OSError:
            raise OSError(f"the worker template is gone or does not read: {self._last_words()}") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)

    def status_of(self, pid: int, wait: float = 0.0) -> int | None:
        """The wait status the template reported for `pid` (reading its notes up to `wait` s)."""
        deadline = time.monotonic() + wait
        while pid not in self._statuses and self.sock is not None:    # a closed template says no more
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    self._read(0.0)
                except OSError:
                    pass
                break
            try:
                self._read(left, until_exit_of=pid)
            except OSError:
                break
        return self._statuses.get(pid)

    def _read(self, timeout: float, until_exit_of: int | None = None) -> dict:
        """The next message that is not an exit note (exit notes are recorded on the way);
        with `until_exit_of`, return ({}) as soon as that pid's exit note is in."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    self._statuses[msg["exit"]] = msg["status"]
                    if len(self._statuses) > MAX_STATUSES:      # asked for soon after, if at all
                        del self._statuses[next(iter(self._statuses))]
                    if msg["exit"] == until_exit_of:
                        return {}
                    continue
                return msg
            left = deadline - time.monotonic()
            if not readable(self.sock.fileno(), left):
                if left <= 0:
                    return {}
                continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError(f"the worker template exited: {self._last_words()}")
            self._buf += chunk

    def _last_words(self) -> str:
        if self.log_dir is None:
            return "no log"
        try:
            lines = (self.log_dir / "template.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][:300] if lines else "no last words"

    def kill(self) -> None:
        """Stop a template that does not answer: SIGKILL (a stopped process dies of it too)."""
        if self.proc is not None:
            try:
                self.proc.kill()
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()          # the template sees EOF, kills what it forked, exits
            self.sock = None
        if self.proc is not None:
            if not exited_within(self.proc, 2.0):
                self.proc.kill()
                self.proc.wait(timeout=5.0)
            self.proc = None
        if self.own_dir and self.log_dir is not None:
            remove_run_dir(self.log_dir)
            self.log_dir = None


def fork_workers(template: Template, argv_for_rank: Callable[[int], Sequence[str]], secret: bytes,
                 ranks: Sequence[int], log_dir: Path) -> list[WorkerProcess]:
    """Fork one worker per rank from `template` (argv without the interpreter: the module's)."""
    asks = [(rank, argv_for_rank(rank), log_path_of(log_dir, rank)) for rank in ranks]
    return template.fork_all(asks, secret)


def log_path_of(log_dir: Path, rank: int) -> Path:
    """Where a new worker of `rank` writes its stderr (made when it is asked for)."""
    return log_dir / f"rank{rank}.{int(time.monotonic() * 1000)}.log"
