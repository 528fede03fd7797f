"""The trace (SPEC §4): one record per step, fields in SPEC order, and the summary."""
from __future__ import annotations

import functools
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
    discarded: dict[str, int] = {}     # overlap only (engine/overlap.py); never mutated
    returned: dict[str, int] = {}

    def to_json(self, fields: tuple[str, ...] | None = None) -> dict:
        """SPEC §4's object; `fields`: only those (a rung of the ladder has fewer)."""
        if fields is None:
            fields = SPEC_FIELDS
        if self._fields[:len(fields)] == fields:      # every rung's fields are a prefix
            return dict(zip(fields, self))
        return {f: getattr(self, f) for f in fields}

    def json_line(self, fields: tuple[str, ...] | None = None) -> str:
        """The SPEC §4 line (without the newline): `json.dumps(to_json())`, cheaper for idle steps."""
        if self.is_empty:
            return f'{{"step": {self.step}, {_idle_rest(fields or SPEC_FIELDS)}'
        return json.dumps(self.to_json(fields))

    @classmethod
    def idle(cls, step: int) -> "StepTrace":
        """The trace of a step in which nothing can happen: nothing runs, nothing arrives."""
        return cls(step, [], [], {}, {}, {}, [], {}, {}, [], {}, {}, {})

    @property
    def is_empty(self) -> bool:
        """Nothing happened (a step while requests are still to arrive)."""
        return not any(self[1:])


SPEC_FIELDS = StepTrace._fields[:13]     # SPEC §4's fields; the overlap rung adds the last two


@functools.lru_cache(maxsize=16)
def _idle_rest(fields: tuple[str, ...]) -> str:
    """An idle step's line after its step number, for these fields."""
    return json.dumps(StepTrace.idle(0).to_json(fields))[len('{"step": 0, '):]
