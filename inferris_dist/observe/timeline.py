"""A timeline of a launched run in the Chrome trace event format.

Open the file in chrome://tracing or https://ui.perfetto.dev: one lane per
scheduler phase (prepare, execute, commit, recover) and one lane per rank
with each plan's round trip (send to answer), so the boundary's share of
every step can be seen, and a failed attempt stands out beside its retry.

Inside each round trip, the rank's own account: decode, execute, encode,
measured by the worker in its clock and shipped beside its result. Each
rank's clock is placed on the scheduler's by the offset of its fastest
round trip (NTP's estimate: the midpoint of the two one-way gaps; on one
host the clocks are one and the offset comes out at a few microseconds).
Flow arrows run from the plan's send to each rank and back.
"""
from __future__ import annotations

import json
import time
from typing import TextIO

from inferris_dist.observe.records import StepRecord

SCHEDULER, RANKS = 1, 2   # the trace's "process" ids: the scheduler's lane, the ranks' lanes


class Timeline:
    def __init__(self):
        self.origin = time.monotonic()
        self.events: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": SCHEDULER, "args": {"name": "scheduler"}},
            {"ph": "M", "name": "process_name", "pid": RANKS, "args": {"name": "ranks"}},
        ]
        self._ranks_named: set[int] = set()
        # (rank, step, epoch, sent, back, the rank's own times) per round trip
        self._inside: list[tuple[int, int, int, float, float, tuple]] = []
        self.shared_clock = False        # the ranks run on this host: their monotonic clock is ours

    def _us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 1)

    def add_span(self, lane: str, name: str, start: float, took: float) -> None:
        """A span measured by someone else (`start` on the monotonic clock, `took` seconds)."""
        self.events.append({"ph": "X", "name": name, "cat": lane, "pid": SCHEDULER, "tid": 0,
                            "ts": self._us(start), "dur": round(took * 1e6, 1)})

    def attempt(self, record: StepRecord) -> None:
        """Each rank's round trip for one attempt at a step (a lost rank: until the verdict)."""
        end = time.monotonic()
        for rank, sent in sorted(record.sent.items()):
            self._name_rank(rank)
            rtt = record.rtt.get(rank)
            if rank in record.inside and rtt is not None:
                self._inside.append((rank, record.step, record.epoch, sent, sent + rtt, record.inside[rank]))
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

    def offsets(self) -> dict[int, float]:
        """Per rank, its clock minus ours, from its round trip with the least time on the wire
        (zero for ranks on this host, which read the same clock)."""
        best: dict[int, tuple[float, float]] = {}
        if self.shared_clock:
            return {rank: 0.0 for rank, *_ in self._inside}
        for rank, _, _, sent, back, (received, _, _, encoded) in self._inside:
            wire_time = (back - sent) - (encoded - received)
            offset = ((received - sent) + (encoded - back)) / 2
            if rank not in best or wire_time < best[rank][0]:
                best[rank] = (wire_time, offset)
        return {rank: offset for rank, (_, offset) in best.items()}

    def _inside_events(self) -> list[dict]:
        offsets = self.offsets()
        events = []
        for n, (rank, step, epoch, sent, back, times) in enumerate(self._inside):
            received, decoded, executed, encoded = (self._us(t - offsets[rank]) for t in times)
            args = {"step": step, "epoch": epoch}
            for name, start, end in (("decode", received, decoded), ("execute", decoded, executed),
                                     ("encode", executed, encoded)):
                events.append({"ph": "X", "name": name, "cat": "inside", "pid": RANKS, "tid": rank,
                               "ts": start, "dur": round(max(0.0, end - start), 1), "args": args})
            out, home = f"plan {step}.{epoch}.{rank}.{n}", f"result {step}.{epoch}.{rank}.{n}"
            events += [  # the plan's flight, and the result's
                {"ph": "s", "name": "plan", "cat": "flow", "id": out, "pid": SCHEDULER, "tid": 0,
                 "ts": self._us(sent)},
                {"ph": "f", "bp": "e", "name": "plan", "cat": "flow", "id": out, "pid": RANKS, "tid": rank,
                 "ts": received},
                {"ph": "s", "name": "result", "cat": "flow", "id": home, "pid": RANKS, "tid": rank,
                 "ts": encoded},
                {"ph": "f", "bp": "e", "name": "result", "cat": "flow", "id": home, "pid": SCHEDULER,
                 "tid": 0, "ts": self._us(back)}]
        return events

    def write(self, stream: TextIO) -> None:
        offsets = {f"rank {r}": round(o * 1e6, 1) for r, o in sorted(self.offsets().items())}
        json.dump({"traceEvents": self.events + self._inside_events(), "displayTimeUnit": "ms",
                   "otherData": {"clock_offsets_us": offsets}}, stream)
