"""ProcessGroup: the engine's executor seam on N real worker processes.

Each step the plan is encoded once and sent to every rank over one ROUTER
socket; the group gathers one RESULT per rank under the step deadline,
watching each worker's process sentinel so a death is seen at once, not at
the deadline; then it joins the N answers with engine's exact-agreement rule.
Lockstep: `execute` returns (or raises) before the next plan can go out.

Admitting workers is handshake.py's part; sending, gathering and blaming
are channel.py's.
"""
from __future__ import annotations

import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Sequence

import zmq

from engine import EngineError, ExecutionPlan, ExecutionResult, RankExecutionResult, Workload, join
from engine.errors import ShardDivergence
from engine.group import accept_scripts
from engine.shard import SlotStore, first_mismatch
from launcher import WorkerProcess, stop_workers

from . import wire
from .channel import RankChannel
from .faults import Fault
from .handshake import admit_ranks
from .observe import StepRecord, WireLog
from .wire import MsgType

LOOPBACK = "tcp://127.0.0.1"


class ProcessGroup(RankChannel):
    def __init__(self, workload: Workload, world_size: int | None = None, *,
                 step_timeout: float = 10.0, start_timeout: float = 20.0,
                 faults: Sequence[Fault] = (), wire_log: WireLog | None = None,
                 bind: str = LOOPBACK):
        cfg = workload.config
        super().__init__(world_size or cfg.world_size, step_timeout, wire_log)
        wire.check_fits(workload)
        self.num_pages, self.page_size = cfg.num_pages, cfg.page_size
        self.accept_scripts = accept_scripts(workload)
        self.start_timeout = start_timeout
        self.faults = list(faults)
        self.bind = bind
        self.address = ""
        self.secret = secrets.token_bytes(32)
        self.rank_pids: dict[int, list[int]] = {r: [] for r in range(self.world_size)}  # oldest first
        self.attempts: deque[StepRecord] = deque(maxlen=64)   # since take_attempts()
        self.log_dir: Path | None = None
        self._ctx: zmq.Context | None = None

    @property
    def pids_started(self) -> list[int]:
        return [pid for pids in self.rank_pids.values() for pid in pids]

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "ProcessGroup":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="inferris-dist-"))
        self._ctx = zmq.Context()
        sock = self.sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(self.step_timeout * 1000))
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.bind(f"{self.bind}:0")
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller.register(sock, zmq.POLLIN)
        admit_ranks(self, range(self.world_size), shard=[], step=-1)

    def adopt(self, worker: WorkerProcess) -> None:
        """A freshly spawned worker joins the watch list (before its handshake)."""
        self.workers[worker.rank] = worker
        self.rank_pids[worker.rank].append(worker.pid)
        self._dead.discard(worker.rank)
        if worker.sentinel is not None:
            self._poller.register(worker.sentinel, zmq.POLLIN)

    def bind_identity(self, rank: int, ident: bytes) -> None:
        self.rank_of.pop(self.identity.get(rank, b""), None)
        self.identity[rank] = ident
        self.rank_of[ident] = rank

    def close(self) -> None:
        """Stop every worker (politely, then by signal) and release the socket. Idempotent.

        Ctrl-C and SIGTERM wait until the workers are gone: a second Ctrl-C
        must not leave orphans behind.
        """
        with _interrupts_held():
            workers = list(self.workers.values())
            if workers:
                stop_workers(workers, polite=lambda: self._stop_message(workers),
                             grace=1.0, term_wait=1.0)
            self.workers = {}
            if self.sock is not None:
                self.sock.close(linger=0)
                self.sock = None
            if self._ctx is not None and not self._ctx.closed:
                self._ctx.term()
            if self.log_dir is not None:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    def _stop_message(self, workers: list[WorkerProcess]) -> None:
        for w in workers:
            if w.alive() and w.rank in self.identity:
                self.send(w.rank, MsgType.STOP, 0, wire.encode_body(MsgType.STOP, ()), (), quiet=True)

    def restart(self, ranks: Sequence[int], shard: list, step: int) -> list[int]:
        """Replace the workers of `ranks` with fresh ones in a new epoch; returns their pids.

        The old workers are killed, not asked: they are lost or not trusted.
        Each new worker starts from `shard` (a snapshot of the control plane's
        pool, or [] for an empty shard) and gets the faults not yet spent.
        """
        self.epoch += 1
        with _interrupts_held():
            old = [self.workers[r] for r in ranks if r in self.workers]
            stop_workers(old, grace=0.0, term_wait=0.5)
            for w in old:
                self._forget(w)
        if self.log:
            self.log.event("restart", ranks=list(ranks), epoch=self.epoch, step=step,
                           shard_pages=len(shard))
        admit_ranks(self, ranks, shard, step)
        return [self.workers[r].pid for r in ranks]

    def _forget(self, w: WorkerProcess) -> None:
        if self.workers.get(w.rank) is w:
            del self.workers[w.rank]
        if w.sentinel is not None and w.rank not in self._dead:
            self._poller.unregister(w.sentinel)
        self._dead.discard(w.rank)
        self.rank_of.pop(self.identity.pop(w.rank, b""), None)

    # -- the seam ----------------------------------------------------------------------

    def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        body = wire.encode_body(MsgType.PLAN, plan)
        record = self.last_record = StepRecord(plan.step, self.epoch, len(body))
        self.attempts.append(record)
        sent_at = record.sent
        for rank in range(self.world_size):
            sent_at[rank] = time.monotonic()
            self.send(rank, MsgType.PLAN, plan.step, body, plan)
        got = self.gather(MsgType.RESULT, plan.step, sent_at, record)
        bodies = [got[r][1] for r in range(self.world_size)]
        if all(b == bodies[0] for b in bodies):
            blame = 0 if self.world_size == 1 else None      # the same bad bytes from every rank
            outcomes = [self.decode(blame, MsgType.RESULT, bodies[0], plan.step)] * self.world_size
        else:
            outcomes = [self.decode(r, MsgType.RESULT, bodies[r], plan.step) for r in range(self.world_size)]
        for r in range(self.world_size) if self.log else ():
            self.log_message("in", r, MsgType.RESULT, plan.step, len(bodies[r]), outcomes[r])
        results = [RankExecutionResult(got[r][0].rank, got[r][0].world_size, got[r][0].step, outcomes[r])
                   for r in range(self.world_size)]
        try:
            joined = join(results, self.world_size, plan.step)
        except EngineError as e:
            e.epoch = self.epoch
            record.verdict = e.kind
            if self.log:
                self.log.event("step-failed", kind=e.kind, ranks=list(e.ranks), step=plan.step,
                               epoch=self.epoch, message=e.message)
            raise
        record.verdict = "joined"
        for rank in range(self.world_size):
            self._answered[rank] = (self.epoch, plan.step)
        return joined

    def take_attempts(self) -> list[StepRecord]:
        attempts = list(self.attempts)
        self.attempts.clear()
        return attempts

    def audit(self, held: SlotStore, step: int) -> None:
        """Every rank's shard must hold every slot the control plane's pool holds."""
        self.last_record = None              # the audit is not the step: its verdict stands
        sent_at = {}
        for rank in range(self.world_size):
            sent_at[rank] = time.monotonic()
            self.send(rank, MsgType.AUDIT, step, wire.encode_body(MsgType.AUDIT, ()), ())
        got = self.gather(MsgType.SHARD, step, sent_at, None)
        for rank in range(self.world_size):
            snapshot = self.decode(rank, MsgType.SHARD, got[rank][1], step)
            self.log_message("in", rank, MsgType.SHARD, step, len(got[rank][1]), snapshot)
            miss = first_mismatch(held, dict(snapshot))
            if miss is not None:
                page, offset, want, have = miss
                err = ShardDivergence(
                    f"rank {rank}'s shard diverges at page {page} offset {offset}: the pool holds "
                    f"{_slot(want)}, the shard holds {_slot(have)}",
                    step, rank=rank, epoch=self.epoch)
                if self.log:
                    self.log.event("audit-failed", rank=rank, step=step, epoch=self.epoch,
                                   page=page, offset=offset, message=err.message)
                raise err

class _interrupts_held:
    """Hold SIGINT and SIGTERM (main thread only) until the block is done."""

    def __enter__(self):
        self.mask = None
        if threading.current_thread() is threading.main_thread():
            self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    def __exit__(self, *exc):
        if self.mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _slot(slot) -> str:
    return "nothing" if slot is None else f"({slot[0]}, {slot[1]})"
