"""A timeline of a launched run in the Chrome trace event format.

Open the file in chrome://tracing or https://ui.perfetto.dev: one lane per
scheduler phase (prepare, execute, commit, recover) and one lane per rank
with each plan's round trip (send to answer), so the boundary's share of
every step can be seen, and a failed attempt stands out beside its retry.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import TextIO

from .observe import StepRecord

SCHEDULER, RANKS = 1, 2   # the trace's "process" ids: the scheduler's lane, the ranks' lanes


class Timeline:
    def __init__(self):
        self.origin = time.monotonic()
        self.events: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": SCHEDULER, "args": {"name": "scheduler"}},
            {"ph": "M", "name": "process_name", "pid": RANKS, "args": {"name": "ranks"}},
        ]
        self._ranks_named: set[int] = set()

    def _us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 1)

    @contextmanager
    def span(self, lane: str, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.events.append({"ph": "X", "name": name, "cat": lane, "pid": SCHEDULER, "tid": 0,
                                "ts": self._us(start), "dur": round((time.monotonic() - start) * 1e6, 1)})

    def attempt(self, record: StepRecord) -> None:
        """Each rank's round trip for one attempt at a step (a lost rank: until the verdict)."""
        end = time.monotonic()
        for rank, sent in sorted(record.sent.items()):
            self._name_rank(rank)
            rtt = record.rtt.get(rank)
            self.events.append({
                "ph": "X", "name": f"step {record.step}", "cat": "rank", "pid": RANKS, "tid": rank,
                "ts": self._us(sent), "dur": round(((rtt if rtt is not None else end - sent)) * 1e6, 1),
                "args": {"epoch": record.epoch, "plan_bytes": record.plan_bytes,
                         "result_bytes": record.result_bytes.get(rank), "verdict": record.verdict}})

    def instant(self, name: str, **args) -> None:
        self.events.append({"ph": "i", "name": name, "s": "g", "pid": SCHEDULER, "tid": 0,
                            "ts": self._us(time.monotonic()), "args": args})

    def _name_rank(self, rank: int) -> None:
        if rank not in self._ranks_named:
            self._ranks_named.add(rank)
            self.events.append({"ph": "M", "name": "thread_name", "pid": RANKS, "tid": rank,
                                "args": {"name": f"rank {rank}"}})

    def write(self, stream: TextIO) -> None:
        json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, stream)
