"""The link: the wire between the scheduler and each rank, and the faults that act on it.

ZeroMQ over TCP (or a unix socket) retransmits: packet faults alone never lose, duplicate or
reorder a message. The link faults of the grammar (`protocol/faults.py`, LINK_KINDS) act at
the message level, here, on the scheduler's side of each rank's connection: a plan the link
loses never reaches its rank, though the rank is alive and well; a result it loses never
reaches the scheduler; a delayed one arrives ARG seconds late; a duplicated one arrives
twice; a reordered plan arrives after the next message to its rank; a partition loses
everything both ways for ARG seconds, then heals.

Deterministic: a fault acts on the message it names (rank, step, direction) the first time
that message crosses, and is spent (`@STEP+` acts on every step from STEP on). Whatever the
link did to a message is told to the recorder with the message (`link`: lost, delayed,
duplicated, reordered), so the wire log, `inspect` and the page show it. The channel carries
it out through its layer around the transport (`linkfaults.py`), made only for a run with link
faults: a run without them loads neither module.
"""
from __future__ import annotations

import heapq
import itertools
import time
from typing import NamedTuple

from inferris_dist.protocol.faults import LINK_KINDS, Fault
from inferris_dist.protocol.wire import MsgType

MAX_HELD = 4096          # messages the link holds at once (delayed, reordered); past it, it loses them


class Held(NamedTuple):
    """A message the link holds until `due` (a delayed one). Held ones order by due time, then
    by `seq`, which no two share: the fields after it are never compared."""
    due: float
    seq: int
    rank: int
    frames: list              # what goes out (identity first) or what came in
    meta: object = None


class Link:
    def __init__(self, faults: list[Fault]):
        self.faults = [f for f in faults if f.kind in LINK_KINDS]
        self.active = bool(self.faults)
        self.cut: dict[int, float] = {}            # rank -> until when a partition cuts it off
        self._out: list[Held] = []                 # delayed sends (a heap by due)
        self._in: list[Held] = []                  # delayed receipts (a heap by due)
        self._reordered: dict[int, list[list[bytes]]] = {}   # rank -> plans held for its next message
        self._seq = itertools.count()
        self.partitions: list[tuple[int, int, float]] = []    # (rank, step, seconds): told, then cleared

    # -- what the link does to a message ---------------------------------------------------

    def _take(self, rank: int, step: int, kinds: tuple[str, ...]) -> Fault | None:
        """The first fault of `kinds` acting on rank `rank`'s message of `step` (spent if one-shot)."""
        for i, f in enumerate(self.faults):
            if f.kind in kinds and f.applies_to(rank) and f.fires(step):
                if not f.repeat:
                    if f.rank is None:     # `all`: spent for this rank only
                        self.faults[i] = _without_rank(f, rank)
                    else:
                        del self.faults[i]
                return f
        return None

    def outgoing(self, rank: int, kind: MsgType, step: int) -> tuple[str | None, float]:
        """What the link does to a message to `rank`: None (it crosses), "lost", "delayed" (with
        its delay), "duplicated" or "reordered". Only plans are acted on by their own faults; a
        partition takes everything."""
        now = time.monotonic()
        if kind is MsgType.PLAN:
            cut = self._take(rank, step, ("partition",))
            if cut is not None:
                self.cut[rank] = max(self.cut.get(rank, 0.0), now + cut.arg)
                self.partitions.append((rank, step, cut.arg))
        if self.cut.get(rank, 0.0) > now:
            return "lost", 0.0
        if kind is not MsgType.PLAN:
            return None, 0.0
        f = self._take(rank, step, ("plan-lost", "plan-delay", "plan-dup", "reorder"))
        if f is None:
            return None, 0.0
        return {"plan-lost": "lost", "plan-delay": "delayed", "plan-dup": "duplicated",
                "reorder": "reordered"}[f.kind], f.arg or 0.0

    def incoming(self, rank: int, kind: MsgType, step: int) -> tuple[str | None, float]:
        """What the link does to a message from `rank`: None, "lost", "delayed" or "duplicated"."""
        if self.cut.get(rank, 0.0) > time.monotonic():
            return "lost", 0.0
        if kind is not MsgType.RESULT:
            return None, 0.0
        f = self._take(rank, step, ("result-lost", "result-delay", "result-dup"))
        if f is None:
            return None, 0.0
        return {"result-lost": "lost", "result-delay": "delayed", "result-dup": "duplicated"}[f.kind], \
            f.arg or 0.0

    # -- what the link holds ---------------------------------------------------------------

    def hold_out(self, rank: int, frames: list[bytes], seconds: float) -> bool:
        return self._hold(self._out, rank, frames, None, seconds)

    def hold_in(self, rank: int, frames: list[bytes], meta, seconds: float) -> bool:
        return self._hold(self._in, rank, frames, meta, seconds)

    def _hold(self, heap: list, rank: int, frames, meta, seconds: float) -> bool:
        if len(self._out) + len(self._in) >= MAX_HELD:
            return False                         # the link's buffer is full: it loses the message
        heapq.heappush(heap, Held(time.monotonic() + seconds, next(self._seq), rank, frames, meta))
        return True

    def reorder(self, rank: int, frames: list[bytes]) -> None:
        self._reordered.setdefault(rank, []).append(frames)

    def after_next(self, rank: int) -> list[list[bytes]]:
        """The plans held for rank `rank` until the next message to it (that message just went)."""
        return self._reordered.pop(rank, []) if self._reordered else []

    def next_due(self) -> float | None:
        dues = [h[0].due for h in (self._out, self._in) if h]
        return min(dues) if dues else None

    def due_out(self) -> list[Held]:
        return _pop_due(self._out)

    def due_in(self) -> list[Held]:
        return _pop_due(self._in)

    def forget(self, rank: int) -> None:
        """Rank `rank`'s member was retired: what the link held for it goes with it, and a cut
        with it (a partition cuts a member off; its replacement has a link of its own)."""
        self._reordered.pop(rank, None)
        self.cut.pop(rank, None)
        self._out = [h for h in self._out if h.rank != rank]
        heapq.heapify(self._out)


def _pop_due(heap: list[Held]) -> list[Held]:
    now = time.monotonic()
    out = []
    while heap and heap[0].due <= now:
        out.append(heapq.heappop(heap))
    return out


def _without_rank(fault: Fault, rank: int) -> Fault:
    """A fault on `all` once it acted on `rank`: it goes on acting on the others."""
    done = fault.spent_by | {rank}
    return Fault(fault.rank, fault.kind, fault.step, fault.repeat, fault.arg, fault.text, done)
