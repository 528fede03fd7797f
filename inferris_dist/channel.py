"""Talking to the ranks: sending, gathering under a deadline, and saying who failed.

The part of ProcessGroup that every exchange shares (a step's PLAN and
RESULTs, the audit's AUDIT and SHARDs, the handshake's waits). Replies of
another epoch or step are stale and a second one from a rank is a duplicate:
both are counted and noted, never used. A reply that does not decode, or
names another rank than its sender, is a protocol error blamed on the rank
that sent it (a body is decoded, and logged, by whoever uses it); a rank whose process exits is seen at once through its
sentinel; one that stays silent is lost at the deadline.
"""
from __future__ import annotations

import time

import zmq

from engine import RankLost
from launcher import WorkerProcess

from . import wire
from .observe import RankTotals, StepRecord, WireLog
from .wire import MsgType


class RankChannel:
    """The sockets, workers and bookkeeping a ProcessGroup talks through."""

    def __init__(self, world_size: int, step_timeout: float, wire_log: WireLog | None):
        self.world_size = world_size
        self.step_timeout = step_timeout
        self.log = wire_log
        self.epoch = 0
        self.sock = None
        self.workers: dict[int, WorkerProcess] = {}
        self.identity: dict[int, bytes] = {}
        self.rank_of: dict[bytes, int] = {}
        self.totals = {r: RankTotals() for r in range(world_size)}
        self.last_record: StepRecord | None = None
        self._answered: dict[int, tuple[int, int]] = {}   # rank -> (epoch, step) last joined
        self._dead: set[int] = set()                      # ranks whose process has exited
        self._poller = zmq.Poller()

    def gather(self, expect: MsgType, step: int, sent_at: dict[int, float],
                record: StepRecord | None) -> dict[int, tuple[wire.Header, bytes]]:
        deadline = min(sent_at.values()) + self.step_timeout
        got: dict[int, tuple[wire.Header, bytes]] = {}
        while len(got) < self.world_size:
            dead, messages = self.wait(deadline)
            for frames in messages:
                self.take(frames, expect, step, got, sent_at, record)
            for rank in dead:
                if rank not in got:
                    raise self.lost(rank, step, "died", f"died before answering step {step}")
            if len(got) < self.world_size and time.monotonic() >= deadline:
                silent = sorted(set(range(self.world_size)) - set(got))
                raise self.lost(silent[0], step, "timeout",
                                f"gave no answer to step {step} within {self.step_timeout:g} s",
                                also=silent[1:])
        return got

    def take(self, frames, expect, step, got, sent_at, record) -> None:
        rank = self.rank_of.get(frames[0])
        if rank is None:
            self.note(None, "dropped a message from an unknown peer")
            return
        try:
            if len(frames) != 3:
                raise wire.WireError(f"a message of {len(frames) - 1} frame(s), not 2")
            header = wire.decode_header(frames[1])
        except wire.WireError as e:
            raise self.lost(rank, step, "protocol", f"broke the protocol: {e}") from None
        if header.rank != rank:
            raise self.lost(rank, step, "protocol", f"broke the protocol: its message names rank {header.rank}")
        current = header.type is expect and header.epoch == self.epoch and header.step == step
        if rank in got or not current:
            self.drop(rank, header)
            return
        got[rank] = (header, frames[2])
        totals = self.totals[rank]
        totals.bytes_received += len(frames[2]) + len(frames[1])
        if record is not None:
            rtt = time.monotonic() - sent_at[rank]
            record.rtt[rank] = rtt
            record.result_bytes[rank] = len(frames[2])
            totals.rtts.append(rtt)
            totals.steps += 1

    def drop(self, rank: int, header: wire.Header, when: str = "") -> None:
        """Count and note a reply that is not joined: a duplicate of one already taken, or stale."""
        seen = self._answered.get(rank) == (header.epoch, header.step) or (
            header.epoch == self.epoch and self.last_record is not None
            and header.step == self.last_record.step and rank in self.last_record.rtt)
        what = "duplicate" if seen else "stale"
        self.totals[rank].dropped += 1
        self.note(rank, f"dropped a {what} {header.type.name} from rank {rank} "
                        f"(epoch {header.epoch}, step {header.step}){' ' + when if when else ''}")

    def decode(self, rank: int | None, kind: MsgType, body: bytes, step: int):
        try:
            return wire.decode_body(kind, body)
        except wire.WireError as e:
            raise self.lost(rank, step, "protocol", f"sent a malformed {kind.name}: {e}") from None

    def wait(self, deadline: float) -> tuple[list[int], list[list[bytes]]]:
        """Messages that came, and ranks whose process is gone, waiting at most until `deadline`.

        A sentinel stays readable once its process exits, so it is unregistered
        the first time: a dead rank is remembered, not polled in a busy loop.
        """
        timeout = max(0.0, deadline - time.monotonic())
        if any(w.sentinel is None for w in self.workers.values()):
            timeout = min(timeout, 0.05)   # no pidfd: look at the processes often
        events = dict(self._poller.poll(int(timeout * 1000) + 1))
        messages = []
        if self.sock in events:
            while True:
                try:
                    messages.append(self.sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        for rank, w in self.workers.items():
            if rank in self._dead:
                continue
            if (w.sentinel in events) if w.sentinel is not None else not w.alive():
                self._dead.add(rank)
                if w.sentinel is not None:
                    self._poller.unregister(w.sentinel)
        return [r for r in self._dead if r in self.workers], messages

    def send(self, rank: int, kind: MsgType, step: int, body: bytes, decoded, *, quiet=False) -> None:
        header = wire.encode_header(kind, self.epoch, step, rank, self.world_size)
        try:
            self.sock.send_multipart([self.identity[rank], header, body])
        except (zmq.ZMQError, KeyError):
            if quiet:
                return
            raise self.lost(rank, step, "unreachable", "cannot be reached") from None
        self.totals[rank].bytes_sent += len(header) + len(body)
        self.log_message("out", rank, kind, step, len(body), decoded)

    def lost(self, rank: int | None, step: int, reason: str, what: str, also=()) -> RankLost:
        """A RankLost blamed on `rank` (and the ranks `also`; None: every rank alike), logged."""
        w = self.workers.get(rank)
        detail = ""
        if w is not None and reason in ("died", "unreachable"):
            w.proc.poll()
            detail = f" ({w.exit_description()}"
            words = w.last_words()
            detail += f"; its last words: {words})" if words else ")"
        who = ("every rank" if rank is None else f"rank {rank}" if not also
               else "ranks " + ", ".join(map(str, (rank, *also))))
        message = f"{who} {what}{detail}"
        if self.last_record is not None and self.last_record.step == step:
            self.last_record.verdict = f"{who} lost ({reason})"
        ranks = tuple(range(self.world_size)) if rank is None else (rank, *also)
        step = None if step < 0 else step
        if self.log:
            self.log.event("rank-lost", rank=rank, ranks=list(ranks), step=step, epoch=self.epoch,
                           reason=reason, message=message)
        return RankLost(message, step=step, rank=rank, epoch=self.epoch, reason=reason, ranks=ranks)

    def note(self, rank: int | None, text: str) -> None:
        if self.last_record is not None:
            self.last_record.notes.append(text)
        if self.log:
            self.log.event("note", rank=rank, epoch=self.epoch, text=text)

    def log_message(self, direction: str, rank: int, kind: MsgType, step: int, num_bytes: int,
                    body) -> None:
        if self.log:
            self.log.message(direction, rank, self.epoch, step, kind.name, num_bytes, body)
