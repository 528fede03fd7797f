"""The rank executor (SPEC §3, phase 7): what every rank runs, in process or in a worker.

A rank holds its shard of the pages (its slice of every page's state) and
the accept scripts, the ranks' stand-in for a model. For each plan item it
gives its verdict (how many draft tokens are accepted, by `verdict_index`)
and writes `(request_id, position)` into its shard for every placement.
"""
from __future__ import annotations

from .messages import ExecutionPlan, ItemOutcome, RankExecutionResult
from .shard import SlotStore


def verdict(script: tuple[int, ...] | None, verdict_index: int, drafted: int) -> int:
    """Accepted draft tokens: the script's entry clamped to [0, drafted], else all of them."""
    if script is None or verdict_index >= len(script):
        return drafted
    return min(max(script[verdict_index], 0), drafted)


class RankExecutor:
    def __init__(self, rank: int, world_size: int, num_pages: int, page_size: int,
                 accept_scripts: dict[str, tuple[int, ...]]):
        self.rank = rank
        self.world_size = world_size
        self.shard = SlotStore(num_pages, page_size)
        self.accept_scripts = accept_scripts

    def execute(self, plan: ExecutionPlan) -> RankExecutionResult:
        write = self.shard.write_span
        scripts = self.accept_scripts
        outcome = ItemOutcome._make
        outcomes = []
        for rid, start, num_tokens, _, decode, verdict_index, pages in plan.items:
            accepted = verdict(scripts.get(rid), verdict_index, num_tokens - 1) if decode else 0
            write(pages, rid, start, num_tokens)
            outcomes.append(outcome((rid, start, num_tokens, accepted, pages)))
        return RankExecutionResult(self.rank, self.world_size, plan.step, tuple(outcomes))
