"""The trace (SPEC §4): one record per step, fields in SPEC order, and the summary."""
from __future__ import annotations

import json
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

    def json_line(self) -> str:
        """The SPEC §4 line (without the newline): `json.dumps(to_json())`, cheaper for idle steps."""
        if self.is_empty:
            return f'{{"step": {self.step}, {_IDLE_REST}'
        return json.dumps(self._asdict())

    @classmethod
    def idle(cls, step: int) -> "StepTrace":
        """The trace of a step in which nothing can happen: nothing runs, nothing arrives."""
        return cls(step, [], [], {}, {}, {}, [], {}, {}, [], {}, {}, {})

    @property
    def is_empty(self) -> bool:
        """Nothing happened (a step while requests are still to arrive)."""
        return not any(self[1:])



_IDLE_REST = json.dumps(StepTrace.idle(0)._asdict())[len('{"step": 0, '):]
