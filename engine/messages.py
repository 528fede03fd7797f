"""The messages that cross the executor boundary (SPEC §3, phases 6 to 8).

Plain immutable tuples (typing.NamedTuple): cheap to build on the hot path,
compared field by field in C, and encoded as msgpack arrays as they are.

An item's positions [start, start + n) are consecutive, so its SPEC
placements `(position, page_id, offset)` are fixed by the pages that hold
them: `placements` (and an outcome's `writes`) is the tuple of page ids for
logical pages start // page_size, start // page_size + 1, ... in order. A
step's placements grow with pages touched, not tokens; `expand_placements`
gives the SPEC's per-position triples.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple


class PlanItem(NamedTuple):
    request_id: str
    start_position: int
    num_tokens: int
    draft_len: int
    decode: bool
    verdict_index: int
    placements: tuple[int, ...]   # page ids holding [start_position, start_position + num_tokens)
    # Overlap scheduling (engine/overlap.py): planned while the request's previous item, a
    # decode of `prior_drafts` drafts, was in flight, assuming every draft accepted. The rank
    # starts the item as many positions earlier as it rejected of them (it knows: the verdict
    # of `verdict_index - 1`), and `placements` then hold [start - prior_drafts, start + n).
    prior_drafts: int = 0


class ExecutionPlan(NamedTuple):
    step: int
    items: tuple[PlanItem, ...]


class ItemOutcome(NamedTuple):
    request_id: str
    start_position: int
    executed_tokens: int
    accepted: int
    writes: tuple[int, ...]       # page ids written, in the same form as placements


# PlanItem(*fields) and ItemOutcome(*fields) without their Python __new__ (or _make's length
# check): for the hot paths that build them from exactly as many fields.
new_item = partial(tuple.__new__, PlanItem)
new_outcome = partial(tuple.__new__, ItemOutcome)


class RankExecutionResult(NamedTuple):
    rank: int
    world_size: int
    step: int
    outcomes: tuple[ItemOutcome, ...]


class ExecutionResult(NamedTuple):
    """The group's one answer: N rank results joined (phase 8)."""
    step: int
    outcomes: tuple[ItemOutcome, ...]


def shifted_span(item: PlanItem, rejected: int, page_size: int) -> tuple[int, tuple[int, ...]]:
    """Overlap: where an item planned after `prior_drafts` assumed drafts really runs, when
    `rejected` of them were rejected: its start and the pages of its placements it writes."""
    return shifted(item.start_position, item.num_tokens, item.prior_drafts, item.placements, rejected,
                   page_size)


def shifted(start: int, num_tokens: int, prior: int, placements, rejected: int, page_size: int):
    """`shifted_span` over an item's fields (a rank's columns): (start, pages)."""
    first = (start - prior) // page_size
    start -= rejected
    last = (start + num_tokens - 1) // page_size
    return start, placements[start // page_size - first:last - first + 1]


def placement_pages(start: int, num_tokens: int, page_table: list[int], page_size: int) -> tuple[int, ...]:
    """The pages of `page_table` that hold positions [start, start + num_tokens)."""
    return tuple(page_table[start // page_size:(start + num_tokens - 1) // page_size + 1])


def page_spans(start: int, num_tokens: int, pages: tuple[int, ...], page_size: int):
    """(page, first position, offset, length) for each page of a placement."""
    end = start + num_tokens
    position = start
    for page in pages:
        offset = position % page_size
        length = min(page_size - offset, end - position)
        if length <= 0:
            return
        yield page, position, offset, length
        position += length


def expand_placements(start: int, num_tokens: int, pages: tuple[int, ...],
                      page_size: int) -> list[tuple[int, int, int]]:
    """The SPEC's placements: (position, page_id, offset) for every position."""
    return [(position + i, page, offset + i)
            for page, position, offset, length in page_spans(start, num_tokens, pages, page_size)
            for i in range(length)]
