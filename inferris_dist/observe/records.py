"""What crossed the boundary, as the recorder keeps it: per-step records and per-rank totals
(the wire log they are written to is wirelog/writer.py)."""
from __future__ import annotations

import random


class StepRecord:
    """One attempt at one step: what went out, what came back, and the verdict."""
    __slots__ = ("step", "epoch", "plan_bytes", "sent", "rtt", "result_bytes", "verdict", "notes", "inside",
                 "world_size")

    def __init__(self, step: int, epoch: int, plan_bytes: int, world_size: int = 0):
        self.step = step
        self.epoch = epoch
        self.plan_bytes = plan_bytes
        self.world_size = world_size                # the ranks it was sent to (0: not said)
        self.sent: dict[int, float] = {}            # rank -> monotonic send time
        self.rtt: dict[int, float] = {}             # rank -> seconds
        self.result_bytes: dict[int, int] = {}      # rank -> bytes
        self.verdict = ""                           # "joined", or what went wrong
        self.notes: list[str] = []                  # dropped messages, refusals
        self.inside: dict[int, tuple] = {}          # rank -> its own 4 times (timeline)

    def __repr__(self) -> str:
        return _repr(self)


def _repr(obj) -> str:
    """`Class(field=value, ...)` of a plain class with slots (its private ones left out)."""
    shown = ", ".join(f"{k}={getattr(obj, k)!r}" for k in obj.__slots__ if not k.startswith("_"))
    return f"{type(obj).__name__}({shown})"


MAX_RTT_SAMPLES = 1 << 16    # round trips kept per rank; past them, a uniform sample of them all


class Sample:
    """Values of a run, at most MAX_RTT_SAMPLES of them: every one while they fit the budget
    (the percentiles exact); then each new one replaces a kept one with the chance that keeps
    the sample uniform (reservoir sampling, seeded: the same run keeps the same sample)."""
    __slots__ = ("values", "count", "_rng")

    def __init__(self):
        self.values: list[float] = []
        self.count = 0
        self._rng: random.Random | None = None

    def add(self, value: float) -> None:
        self.count += 1
        if len(self.values) < MAX_RTT_SAMPLES:
            self.values.append(value)
            return
        if self._rng is None:
            self._rng = random.Random(MAX_RTT_SAMPLES)
        j = self._rng.randrange(self.count)
        if j < MAX_RTT_SAMPLES:
            self.values[j] = value

    def percentile(self, q: float) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RankTotals:
    """What crossed with one rank over the run, and a sample of its round trips."""
    __slots__ = ("steps", "bytes_sent", "bytes_received", "rtt", "dropped")

    def __init__(self):
        self.steps = self.bytes_sent = self.bytes_received = self.dropped = 0
        self.rtt = Sample()

    def __repr__(self) -> str:
        return _repr(self)

    def add_rtt(self, rtt: float) -> None:
        self.rtt.add(rtt)

    def percentile(self, q: float) -> float | None:
        return self.rtt.percentile(q)
