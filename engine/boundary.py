"""The executor boundary, control-plane side: build the plan (phase 6) and
validate the joined result against it (phase 9) before anything commits.
"""
from __future__ import annotations

from typing import Any, Iterator, NamedTuple

from .errors import BoundaryViolation
from .messages import ExecutionPlan, ExecutionResult, PlanItem, new_item, placement_pages, shifted


def build_plan(step: int, work: list, page_size: int, priors: dict[str, int] | None = None) -> ExecutionPlan:
    """Phase 6. `priors` (overlap): the drafts assumed accepted of each request's item in flight;
    its item here may start that many positions earlier, so its placements begin there."""
    if priors:
        return ExecutionPlan(step, tuple(_ahead_item(req, n, decode, page_size, priors.get(req.request_id, 0))
                                         for req, n, decode in work))
    items = tuple(
        new_item((req.request_id, req.computed, n, req.draft_len, decode, req.num_verdicts,
                   placement_pages(req.computed, n, req.page_table, page_size), 0))
        for req, n, decode in work)
    return ExecutionPlan(step, items)


def _ahead_item(req, n: int, decode: bool, page_size: int, prior: int) -> PlanItem:
    start = req.computed
    return new_item((req.request_id, start, n, req.draft_len, decode, req.num_verdicts,
                      placement_pages(start - prior, n + prior, req.page_table, page_size), prior))


class Mismatch(NamedTuple):
    """One way a result fails to answer its plan (phase 9). `field`: "step", "outcomes" (their
    count), or the outcome's field that differs ("request_id", "start_position",
    "executed_tokens", "writes", "accepted"); `index`: the item's (None: the result as a whole);
    `got`: the result's value; `want`: the plan's (for "accepted": the highest allowed); `item`:
    the plan's item as planned (None: the result as a whole)."""
    field: str
    index: int | None
    got: Any
    want: Any
    item: PlanItem | None = None


def mismatches(plan: ExecutionPlan, result: ExecutionResult, shifts: dict[str, int] | None = None,
               page_size: int = 0) -> Iterator[Mismatch]:
    """Phase 9, the one statement of it: each way `result` does not answer exactly this plan,
    in order. Taken up to the first, it is the engine's check (`validate`); taken whole, every
    violation a recorded step shows (the history checker's). A count of outcomes that differs
    ends it (nothing pairs up); an outcome for another request is that item's only mismatch.
    `shifts` (overlap): for an item planned ahead, the drafts the ranks rejected of its
    request's item before it: it must have started that much earlier, on those of its
    placements (None: no item is shifted)."""
    if result.step != plan.step:
        yield Mismatch("step", None, result.step, plan.step)
    items, outcomes = plan.items, result.outcomes
    if len(outcomes) != len(items):
        yield Mismatch("outcomes", None, len(outcomes), len(items))
        return
    for i, (item, out) in enumerate(zip(items, outcomes)):
        if out.request_id != item.request_id:
            yield Mismatch("request_id", i, out.request_id, item.request_id, item)
            continue
        start, pages = item.start_position, item.placements
        if item.prior_drafts and shifts is not None:
            start, pages = shifted(start, item.num_tokens, item.prior_drafts, pages,
                                   shifts.get(item.request_id, 0), page_size)
        if out.start_position != start:
            yield Mismatch("start_position", i, out.start_position, start, item)
        if out.executed_tokens != item.num_tokens:
            yield Mismatch("executed_tokens", i, out.executed_tokens, item.num_tokens, item)
        if out.writes != pages:
            yield Mismatch("writes", i, out.writes, pages, item)
        high = item.num_tokens - 1 if item.decode else 0
        if not 0 <= out.accepted <= high:
            yield Mismatch("accepted", i, out.accepted, high, item)


def validate(plan: ExecutionPlan, result: ExecutionResult, shifts: dict[str, int] | None = None,
             page_size: int = 0) -> None:
    """Phase 9: the result must answer exactly this plan; else BoundaryViolation, saying the
    first of its `mismatches`."""
    for m in mismatches(plan, result, shifts, page_size):
        raise BoundaryViolation(said(m))


# The engine's words for each mismatch (`said`); the history checker has its own.
WORDS = {
    "step": "result answers step {got}, the plan is step {want}",
    "outcomes": "{got} outcomes for {want} plan items",
    "request_id": "outcome {index} is for {got!r}, the plan has {want!r}",
    "start_position": "{rid}: start_position {got}, planned {want}",
    "executed_tokens": "{rid}: executed {got} tokens, planned {want}",
    "writes": "{rid}: wrote pages {got}, placed on pages {want}",
    "accepted": "{rid}: accepted {got}, allowed 0..{want}",
}


def said(m: Mismatch, words: dict[str, str] = WORDS, name=lambda rid: rid) -> str:
    """A mismatch in `words` (a format per field, of {got}, {want}, {index}, {rid}, and
    {shifted}: " (shifted)" for an item planned ahead); request ids as `name` gives them, pages
    as `pages_said` does."""
    got, want, item = m.got, m.want, m.item
    if m.field == "writes":
        got, want = pages_said(got), pages_said(want)
    elif m.field == "request_id":
        got, want = name(got), name(want)
    return words[m.field].format(got=got, want=want, index=m.index,
                                 rid="" if item is None else name(item.request_id),
                                 shifted=" (shifted)" if item is not None and item.prior_drafts else "")


def pages_said(pages) -> str:
    """A list of pages, the first eight of it: "[1,3,...]"."""
    shown = ",".join(map(str, pages[:8]))
    return f"[{shown}{',...' if len(pages) > 8 else ''}]"
