"""The executor boundary, control-plane side: build the plan (phase 6) and
validate the joined result against it (phase 9) before anything commits.
"""
from __future__ import annotations

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


def validate(plan: ExecutionPlan, result: ExecutionResult, shifts: dict[str, int] | None = None,
             page_size: int = 0) -> None:
    """Phase 9: the result must answer exactly this plan; else BoundaryViolation. `shifts`
    (overlap): for an item planned ahead, the drafts the ranks rejected of its request's item
    before it: it must have started that much earlier, on those of its placements."""
    if shifts is not None and any(item.prior_drafts for item in plan.items):
        plan = plan._replace(items=tuple(_where(item, shifts, page_size) if item.prior_drafts else item
                                         for item in plan.items))
    if result.step != plan.step:
        raise BoundaryViolation(f"result answers step {result.step}, the plan is step {plan.step}")
    items, outcomes = plan.items, result.outcomes
    if len(outcomes) != len(items):
        raise BoundaryViolation(f"{len(outcomes)} outcomes for {len(items)} plan items")
    for i, (item, out) in enumerate(zip(items, outcomes)):
        rid = item.request_id
        if out.request_id != rid:
            raise BoundaryViolation(f"outcome {i} is for {out.request_id!r}, the plan has {rid!r}")
        if out.start_position != item.start_position:
            raise BoundaryViolation(f"{rid}: start_position {out.start_position}, "
                                    f"planned {item.start_position}")
        if out.executed_tokens != item.num_tokens:
            raise BoundaryViolation(f"{rid}: executed {out.executed_tokens} tokens, "
                                    f"planned {item.num_tokens}")
        if out.writes != item.placements:
            raise BoundaryViolation(f"{rid}: wrote pages {_pages(out.writes)}, "
                                    f"placed on pages {_pages(item.placements)}")
        high = item.num_tokens - 1 if item.decode else 0
        if not 0 <= out.accepted <= high:
            raise BoundaryViolation(f"{rid}: accepted {out.accepted}, allowed 0..{high}")


def _where(item: PlanItem, shifts: dict[str, int], page_size: int) -> PlanItem:
    """The item as the ranks must run it: started earlier by its request's drafts rejected."""
    rid, start, n, draft_len, decode, index, placements, prior = item
    start, pages = shifted(start, n, prior, placements, shifts.get(rid, 0), page_size)
    return new_item((rid, start, n, draft_len, decode, index, pages, prior))


def _pages(pages) -> str:
    shown = ",".join(map(str, pages[:8]))
    return f"[{shown}{',...' if len(pages) > 8 else ''}]"
