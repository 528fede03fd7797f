"""Every rank's arrival at every join: who came last, how late, and what the lockstep cost.

A lockstep group is as fast as its slowest rank: the join waits for the last result. The step
times of the group are alike by construction (a barrier equalizes them), so the straggler is
found from arrivals, as they were measured: for each joined step, the moment each rank's
result came (its plan's send plus its round trip), and the rank's own execute time where it
said it (protocol §7.7: from the plan received to the result made).

Per rank, over the run:

- `last`: the joined steps it arrived last at (a world of one has no last);
- `lateness`: the median of its arrival minus the median arrival of the others;
- `score`: its median execute time over the best rank's (the round trip where a rank did not
  say its times): 3.0 means three times slower than the fastest rank;
- and the group's `waited`: the time between the first and the last arrival, summed over the
  steps: what the ranks that were done spent waiting for the last.

One rank is named the straggler when, over STRAGGLER_STEPS joined steps or more, it arrived
last at more than STRAGGLER_SHARE of them and is STRAGGLER_SCORE or more times slower than the
best; else there is none. Bounded: the
medians come from a uniform sample per rank (records.Sample).
"""
from __future__ import annotations

from typing import NamedTuple

from inferris_dist.observe.records import Sample, StepRecord

STRAGGLER_SHARE = 0.5          # arrived last at more than half of the steps
STRAGGLER_SCORE = 1.2          # and at least this many times slower than the best rank
STRAGGLER_STEPS = 20           # of at least this many joined steps (fewer say nothing fair)


class RankArrivals(NamedTuple):
    rank: int
    steps: int
    last: int
    lateness: float | None     # seconds, median
    execute: float | None      # seconds, median (its own, else its round trip)
    score: float | None        # execute over the best rank's


class Arrivals:
    def __init__(self):
        self.steps = 0                     # joined steps with at least two ranks
        self.waited = 0.0                  # seconds, summed: last arrival minus first
        self.last: dict[int, int] = {}
        self.joined: dict[int, int] = {}
        self.lateness: dict[int, Sample] = {}
        self.execute: dict[int, Sample] = {}

    def join(self, record: StepRecord) -> dict[int, float]:
        """A joined attempt's arrivals, counted: when each rank's result came (its plan's send
        plus its round trip), by rank (empty: none came)."""
        sent, inside = record.sent, record.inside
        came = {r: sent[r] + rtt for r, rtt in record.rtt.items() if r in sent}
        for r in came:
            self.joined[r] = self.joined.get(r, 0) + 1
            own = inside.get(r)
            self.execute.setdefault(r, Sample()).add(own[2] - own[0] if own is not None else record.rtt[r])
        if len(came) < 2:
            return came
        self.steps += 1
        ordered = sorted(came.values())
        last = max(came, key=came.__getitem__)
        self.last[last] = self.last.get(last, 0) + 1
        self.waited += ordered[-1] - ordered[0]
        for r, t in came.items():
            self.lateness.setdefault(r, Sample()).add(t - _median_without(ordered, t))
        return came

    @staticmethod
    def said(record: StepRecord, came: dict[int, float]) -> list[dict]:
        """The arrivals as the wire log's `attempt` event says them: each rank's seconds after
        its plan was sent, behind the first arrival, and its own execute time where it said it."""
        first = min(came.values())
        out = []
        for r in sorted(came):
            arrival = {"rank": r, "after": round(record.rtt[r], 6), "behind": round(came[r] - first, 6)}
            own = record.inside.get(r)
            if own is not None:
                arrival["exec"] = round(own[2] - own[0], 6)
            out.append(arrival)
        return out

    def table(self) -> list[RankArrivals]:
        execs = {r: s.percentile(0.5) for r, s in self.execute.items()}
        best = min((e for e in execs.values() if e), default=None)
        rows = []
        for r in sorted(self.joined):
            e = execs.get(r)
            late = self.lateness.get(r)
            rows.append(RankArrivals(r, self.joined[r], self.last.get(r, 0),
                                     late.percentile(0.5) if late is not None else None, e,
                                     e / best if e is not None and best else None))
        return rows

    def straggler(self) -> RankArrivals | None:
        """The rank named the straggler, or None."""
        if self.steps < STRAGGLER_STEPS:
            return None
        row = max(self.table(), key=lambda x: (x.last, x.score or 0))
        if row.last > STRAGGLER_SHARE * self.steps and row.score is not None and row.score >= STRAGGLER_SCORE:
            return row
        return None

    def verdict(self) -> str:
        """One line: the straggler named, or that there is none."""
        if not self.steps:
            return "straggler: none (no step joined two ranks or more)"
        if self.steps < STRAGGLER_STEPS:
            return f"straggler: none said ({self.steps} joined steps: too few to say)"
        s = self.straggler()
        if s is not None:
            return (f"straggler: rank {s.rank}, last at {100 * s.last / self.steps:.0f}% of steps, "
                    f"{s.score:.1f}x the best rank")
        most = max(self.table(), key=lambda x: x.last)
        return (f"straggler: none (the most often last, rank {most.rank}, at "
                f"{100 * most.last / self.steps:.0f}% of steps, {most.score or 1:.1f}x the best rank)")

    def to_json(self, run_seconds: float | None = None) -> dict:
        s = self.straggler()
        return {"steps": self.steps, "waited_s": round(self.waited, 6),
                "waited_share": (round(self.waited / run_seconds, 4) if run_seconds else None),
                "straggler": None if s is None else s.rank,
                "ranks": [{"rank": x.rank, "steps": x.steps, "last": x.last,
                           "lateness_s": None if x.lateness is None else round(x.lateness, 6),
                           "execute_s": None if x.execute is None else round(x.execute, 6),
                           "score": None if x.score is None else round(x.score, 3)} for x in self.table()]}


def _median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted) with one `value` of it left out."""
    i = ordered.index(value)
    rest = ordered[:i] + ordered[i + 1:]
    n = len(rest)
    return rest[n // 2] if n % 2 else (rest[n // 2 - 1] + rest[n // 2]) / 2
