"""The trace (SPEC §4): one record per step, fields in SPEC order, and the summary."""
from __future__ import annotations

from typing import NamedTuple


class StepTrace(NamedTuple):
    step: int
    admitted: list[str]
    scheduled: list[str]
    executed: dict[str, int]
    sampled: dict[str, str]
    finished: dict[str, str]
    preempted: list[str]
    reused: dict[str, int]
    published: dict[str, int]
    evicted: list[int]
    drafted: dict[str, int]
    accepted: dict[str, int]
    rolled_back: dict[str, int]

    def to_json(self) -> dict:
        return self._asdict()

    @property
    def is_empty(self) -> bool:
        """Nothing happened (a step while requests are still to arrive)."""
        return not any(self[1:])

