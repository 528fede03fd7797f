"""The messages that cross the executor boundary (SPEC §3, phases 6 to 8).

Plain immutable tuples (typing.NamedTuple): cheap to build on the hot path,
compared field by field in C, and encoded as msgpack arrays as they are.

Placements are runs: `(position, page_id, offset, length)` stands for the
SPEC's `(position + i, page_id, offset + i)` for i < length, consecutive
positions on one page. A step's placements grow with pages touched, not
tokens; `expand_placements` gives the SPEC's per-position triples.
"""
from __future__ import annotations

from typing import NamedTuple

Run = tuple[int, int, int, int]          # (position, page_id, offset, length)


class PlanItem(NamedTuple):
    request_id: str
    start_position: int
    num_tokens: int
    draft_len: int
    decode: bool
    verdict_index: int
    placements: tuple[Run, ...]


class ExecutionPlan(NamedTuple):
    step: int
    items: tuple[PlanItem, ...]


class ItemOutcome(NamedTuple):
    request_id: str
    start_position: int
    executed_tokens: int
    accepted: int
    writes: tuple[Run, ...]


class RankExecutionResult(NamedTuple):
    rank: int
    world_size: int
    step: int
    outcomes: tuple[ItemOutcome, ...]


class ExecutionResult(NamedTuple):
    """The group's one answer: N rank results joined (phase 8)."""
    step: int
    outcomes: tuple[ItemOutcome, ...]


def placement_runs(start: int, num_tokens: int, page_table: list[int], page_size: int) -> tuple[Run, ...]:
    """Positions [start, start + num_tokens) as runs on the pages of `page_table`."""
    runs = []
    position, end = start, start + num_tokens
    while position < end:
        logical, offset = divmod(position, page_size)
        length = min(page_size - offset, end - position)
        runs.append((position, page_table[logical], offset, length))
        position += length
    return tuple(runs)


def expand_placements(runs: tuple[Run, ...]) -> list[tuple[int, int, int]]:
    return [(pos + i, page, off + i) for pos, page, off, length in runs for i in range(length)]
