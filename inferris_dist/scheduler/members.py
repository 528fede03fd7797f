"""Two ways of getting members for a process group.

- `Spawned`: fresh worker processes on this host, started by us, each proving
  the run secret and its pid; we watch their pidfds and stop them at the end.
- `External`: workers someone else starts (a cluster's launcher on other
  hosts, or a person), each proving its rank's CURVE key (or nothing, on a
  loopback address without keys); we can neither watch nor kill them, so we
  keep them hearing from us, and tell them to exit when we are done or when
  they are replaced.

The group cannot tell the two kinds of member apart once admitted: both go
through the same admission and the same channel.
"""
from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from inferris_dist.launcher import (
    Template,
    WorkerProcess,
    command_argv,
    fork_workers,
    spawn_command,
    spawn_workers,
    stop_workers,
    worker_args,
)
from inferris_dist.launcher.process import log_path_of
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.channel import Meta, RankChannel
from inferris_dist.scheduler.gate import user_id

if TYPE_CHECKING:
    from inferris_dist.protocol.keys import ServerKeys

MAX_GONE = 4096       # workers known to be gone kept by pid (per run); older ones are only counted


class Gone(NamedTuple):
    """A worker we started, stopped and reaped: its rank and pid are all that is kept of it."""
    rank: int
    pid: int

    def alive(self) -> bool:
        return False


class Spawned:
    proof = "run secret"
    replaceable = False

    def __init__(self, channel: RankChannel, secret: bytes, log_dir: Path, start_timeout: float,
                 template: Template | None = None, command: str | None = None):
        self.channel = channel
        self.command = command            # a worker command template (launcher/command.py), or ours
        self.secret = secret
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.template = template          # forks workers that have imported already; else spawn
        self.workers: dict[int, WorkerProcess] = {}
        self.started: list[WorkerProcess | Gone] = []   # every worker started, restarts too
        self._where: dict[int, int] = {}                # pid -> its place in `started`
        self.forgotten = 0                              # gone workers past MAX_GONE, counted
        self.abandoned: list[Template] = []             # templates given up on, closed at the end
        self.joining: dict[int, tuple[WorkerProcess, float]] = {}   # rank -> started ahead, when
        self.joining_world = 0                          # the world size they were started for
        self._world = 0                                 # the world size being started for (0: now)
        channel.explain = self.explain

    def worker_args(self, rank: int, parent_pid: int, death_signal: bool) -> list[str]:
        return worker_args(rank, self.world, self.channel.address, parent_pid, death_signal)

    @property
    def world(self) -> int:
        """The world size the workers being started are told: the channel's, or the size a
        world grows to (`start_joining`)."""
        return self._world or self.channel.world_size

    def argv(self, rank: int) -> list[str]:
        """A fresh interpreter's command line; the parent-death signal follows the spawning
        thread, so it is asked for only from the main one."""
        main_thread = threading.current_thread() is threading.main_thread()
        return [sys.executable, "-m", "inferris_dist.rank",
                *self.worker_args(rank, os.getpid(), main_thread)]

    def forked_argv(self, rank: int) -> list[str]:
        """A forked worker's arguments: its parent is the template, which dies with us."""
        return self.worker_args(rank, self.template.pid, True)

    def start(self, ranks: Sequence[int]) -> tuple[float, str]:
        """Start workers for `ranks`; the wait for their handshake, and what it means to miss it."""
        for w in self._spawn(ranks):
            self.workers[w.rank] = w
            self.channel.transport.watch_process(w.rank, w.sentinel)
        return self.started_ahead()

    def started_ahead(self) -> tuple[float, str]:
        return self.start_timeout, f"did not finish the handshake within {self.start_timeout:g} s"

    # -- members started ahead, for a world that grows --------------------------------------

    def start_joining(self, ranks: Sequence[int], world_size: int) -> None:
        """Start workers for `ranks` of a world of `world_size`, in the background: they say
        HELLO while the steps go on, and are admitted when the world grows (`admit_joining`)."""
        self._world = world_size
        try:
            started = self._spawn(ranks)
        finally:
            self._world = 0
        now = time.monotonic()
        for w in started:
            self.joining[w.rank] = (w, now)
        self.joining_world = world_size

    def admit_joining(self, ranks: Sequence[int]) -> None:
        """The workers started ahead for `ranks` are the ones admission now waits for."""
        for rank in ranks:
            w, _ = self.joining.pop(rank)
            self.workers[rank] = w
            self.channel.transport.watch_process(rank, w.sentinel)

    def joined_since(self, ranks: Sequence[int]) -> float:
        """Seconds since the first of `ranks`' workers was started ahead."""
        return time.monotonic() - min(self.joining[r][1] for r in ranks)

    def dead_joining(self) -> list[int]:
        return [r for r, (w, _) in self.joining.items() if not w.alive()]

    def explain_joining(self, rank: int) -> str:
        w = self.joining[rank][0]
        w.wait(1.0)
        return w.exit_description()

    def drop_joining(self, rank: int) -> None:
        w, _ = self.joining.pop(rank)
        stop_workers([w], grace=0.0, term_wait=0.5)
        if not w.alive():
            self._forget(w)

    def reshape(self, kept: dict[int, int], world_size: int) -> None:
        """The world changed size: the kept workers answer to their new ranks."""
        workers = {kept[r]: w for r, w in self.workers.items() if r in kept}
        for rank, w in workers.items():
            w.rank = rank
        self.workers = workers

    def _spawn(self, ranks: Sequence[int]) -> list[WorkerProcess]:
        started = None
        if self.command is not None:
            started = self.start_commands(ranks)
        elif self.template is not None:
            try:
                started = fork_workers(self.template, self.forked_argv, self.secret, ranks, self.log_dir)
            except OSError as e:
                if e.filename is not None:
                    raise                     # a file we could not make (a full disk): say so
                # gone, stopped or stuck: start them the slow way from now on. A template that
                # does not answer is not killed now (the workers it forked die with it): it is
                # stopped with the run.
                self.abandoned.append(self.template)
                self.template = None
                self.channel.note(None, f"{e}: workers are started afresh from now on")
        if started is None:
            started = spawn_workers(self.argv, self.world, self.secret, ranks, self.log_dir)
        for w in started:
            self._where[w.pid] = len(self.started)
            self.started.append(w)
        return started

    def start_commands(self, ranks: Sequence[int]) -> list[WorkerProcess]:
        """One instance of the worker command per rank, each in a process group of its own."""
        started: list[WorkerProcess] = []
        try:
            for rank in ranks:
                argv = command_argv(self.command, self.channel.address, rank, self.world)
                started.append(spawn_command(argv, rank, self.secret, log_path_of(self.log_dir, rank)))
        except BaseException:
            stop_workers(started, grace=0.0, term_wait=0.5)
            raise
        return started

    def vet(self, rank: int, header: wire.Header, hello: wire.Hello, meta: Meta) -> str | None:
        if not wire.check_proof(self.secret, header, hello):
            return f"claims rank {rank} without proof of the run secret"
        if rank not in self.workers or not self.started_as(rank, hello.pid):
            return f"claims rank {rank} from pid {hello.pid}, not the worker we started"
        return None

    def started_as(self, rank: int, pid: int) -> bool:
        """Whether `pid` is the worker started for `rank`: that very process, or (a worker
        command, which may be a wrapper that starts the real worker) one in its session."""
        started = self.workers[rank].pid
        if pid == started:
            return True
        if self.command is None:
            return False
        try:
            return os.getsid(pid) == started
        except OSError:
            return False

    def dead(self) -> set[int]:
        return {r for r, w in self.workers.items() if not w.alive()}

    def explain(self, rank: int) -> str:
        w = self.workers.get(rank)
        if w is None:
            return ""
        if not w.wait(1.0):            # its connection may close a moment before it is reaped
            return " (its connection closed; the process still runs)"
        words = w.last_words()
        return (f" ({w.exit_description()}" + (f"; its last words: {words}" if words else "")
                + _resource_hint(words) + ")")

    def retire(self, ranks: Sequence[int]) -> None:
        """The old workers of `ranks` are killed, not asked: they are lost or not trusted."""
        old = [self.workers.pop(r) for r in ranks if r in self.workers]
        stop_workers(old, grace=0.0, term_wait=0.5)
        for w in old:
            self.channel.transport.unwatch_process(w.rank)
            self.channel.retire(w.rank, "stopped")
            if not w.alive():
                self._forget(w)

    def _forget(self, w: WorkerProcess) -> None:
        """A retired worker that is gone keeps only its rank and pid (a run of many restarts
        costs a few bytes each), and past MAX_GONE of them only a count."""
        i = self._where.pop(w.pid, None)
        if i is not None and self.started[i] is w:
            self.started[i] = Gone(w.rank, w.pid)
        gone = len(self.started) - len(self.workers)
        if gone > MAX_GONE:
            keep = [x for x in self.started if not isinstance(x, Gone)]
            old = [x for x in self.started if isinstance(x, Gone)]
            self.forgotten += len(old) - MAX_GONE // 2
            self.started = old[-(MAX_GONE // 2):] + keep
            self._where = {x.pid: i for i, x in enumerate(self.started)}

    def adopt(self, rank: int, worker: WorkerProcess) -> None:
        """A worker a run before started (a warm world's) holds `rank` in this run: counted with
        the workers this run started (`started`, `pids_started`: every worker it held), so that
        it too must be gone at the end unless it is handed back."""
        worker.rank = rank
        self.workers[rank] = worker
        self._where[worker.pid] = len(self.started)
        self.started.append(worker)
        self.channel.transport.watch_process(rank, worker.sentinel)

    def hand_over(self, ranks: Sequence[int]) -> dict[int, WorkerProcess]:
        """The workers of `ranks`, left running for the next run (a warm world's); every other
        one is stopped as `close` stops them."""
        kept = {r: self.workers.pop(r) for r in ranks}
        for rank in kept:
            self.channel.transport.unwatch_process(rank)
        self.close()
        return kept

    def close(self) -> None:
        """Healthy workers are asked to stop and given a second; those a failure was blamed on
        (dead, hung, lying) are not waited for: they get SIGTERM, then SIGKILL, at once."""
        lost = [w for w in self.workers.values() if w.rank in self.channel.blamed or not w.alive()]
        lost += [w for w, _ in self.joining.values()]    # never admitted: nothing to ask politely
        self.joining = {}
        healthy = [w for w in self.workers.values() if w not in lost]
        if lost:
            stop_workers(lost, grace=0.0, term_wait=0.5)
        if healthy:
            stop_workers(healthy, polite=lambda: _send_stop(self.channel, [w.rank for w in healthy]),
                         grace=1.0, term_wait=1.0)
        self.workers = {}
        if self.template is not None:
            self.template.close()
            self.template = None
        for template in self.abandoned:     # stopped or stuck: it gets no second to answer
            template.kill()
        self.abandoned = []

    @property
    def pids(self) -> dict[int, list[int]]:
        """Per rank, the pids of its workers, oldest first (a restart adds one)."""
        out: dict[int, list[int]] = {r: [] for r in range(self.channel.world_size)}
        for w in self.started:
            out.setdefault(w.rank, []).append(w.pid)
        return out

    @property
    def pids_started(self) -> list[int]:
        return [w.pid for w in self.started]

    def still_running(self) -> list[int]:
        """Pids of workers we started that still run (each judged by its own handle, not by
        its pid, which the system may have given to another process since)."""
        return [w.pid for w in self.started if w.alive()]


class External:
    replaceable = True

    def __init__(self, channel: RankChannel, keys: ServerKeys | None, join_timeout: float,
                 rejoin_timeout: float, on_waiting: Callable[[str, list[int], float, bool], None] | None):
        self.channel = channel
        self.keys = keys
        self.proof = "CURVE key" if keys is not None else "nothing (plaintext on loopback)"
        self.join_timeout = join_timeout
        self.rejoin_timeout = rejoin_timeout
        self.on_waiting = on_waiting
        self.joined = False
        self.pids: dict[int, list[int]] = {r: [] for r in range(channel.world_size)}
        self.hosts: dict[int, list[str]] = {r: [] for r in range(channel.world_size)}

    def start(self, ranks: Sequence[int]) -> tuple[float, str]:
        """Nothing to start: say who we wait for, and for how long."""
        rejoin = self.joined
        timeout = self.rejoin_timeout if rejoin else self.join_timeout
        if self.on_waiting is not None:
            self.on_waiting(self.channel.address, list(ranks), timeout, rejoin)
        self.joined = True
        return timeout, f"{'did not rejoin' if rejoin else 'never joined'} within {timeout:g} s"

    def vet(self, rank: int, header: wire.Header, hello: wire.Hello, meta: Meta) -> str | None:
        if self.keys is not None and meta.user_id != user_id(rank):
            held = meta.user_id or "no rank key"
            return f"claims rank {rank} but holds the key of {held.replace('-', ' ')}"
        self.pids[rank].append(hello.pid)
        self.hosts[rank].append(meta.host)
        return None

    def dead(self) -> set[int]:
        return set()

    def reshape(self, kept: dict[int, int], world_size: int) -> None:
        """The world changed size: each rank's history follows its kept member."""
        self.pids = {kept[r]: p for r, p in self.pids.items() if r in kept}
        self.hosts = {kept[r]: h for r, h in self.hosts.items() if r in kept}
        for rank in range(world_size):
            self.pids.setdefault(rank, [])
            self.hosts.setdefault(rank, [])

    def retire(self, ranks: Sequence[int]) -> None:
        """Replaced members are told to exit (now, or when a partition heals and they hear it)."""
        for rank in ranks:
            member = self.channel.members.get(rank)
            if member is not None:
                self.channel.retire(rank, "replaced")
                reason = (f"rank {rank} of epoch {member.epoch} was replaced in epoch "
                          f"{self.channel.epoch}: exit")
                self.channel.note(rank, f"told the old member at {member.host or 'its address'} to exit "
                                        f"(if it still hears us): {reason}")
                self.channel.transport.tell(member.identity, reason, self.channel.epoch)

    def close(self, wait: float = 2.0) -> None:
        """STOP to every member, then wait (bounded) for their connections to close: the
        socket drops what it has not sent when it closes. Members a failure was blamed on
        (hung, cut off, lying) are told too, but not waited for: they may never answer."""
        channel = self.channel
        _send_stop(channel, list(channel.members))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(
                r in channel.transport.dead for r, m in channel.members.items()
                if m.fd is not None and r not in channel.blamed):
            channel.wait(deadline)

    @property
    def pids_started(self) -> list[int]:
        return []


def _resource_hint(words: str) -> str:
    """The limit behind a worker's last words, where they name a resource the system refused
    (ZeroMQ aborts with the errno's text when it cannot start its I/O thread)."""
    if "Resource temporarily unavailable" in words or "Cannot allocate memory" in words:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        return (f"; the system refused a thread or process: likely the limit of processes per user "
                f"(ulimit -u: {limit}) or memory")
    if "Too many open files" in words:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f"; out of file descriptors (ulimit -n: {soft})"
    if "No space left on device" in words:
        return "; the disk (or its inodes) is full: df -h, df -i"
    return ""


def _send_stop(channel: RankChannel, ranks: Sequence[int]) -> None:
    for rank in ranks:
        channel.send(rank, MsgType.STOP, 0, wire.encode_body(MsgType.STOP, ()), (), quiet=True)
