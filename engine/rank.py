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
        """Verdicts and writes: what a rank does for a plan."""
        result = self.verdicts(plan)
        self.apply(plan)
        return result

    def verdicts(self, plan: ExecutionPlan) -> RankExecutionResult:
        """The outcomes alone, the shard untouched: a rank on processes replies with these
        first, and writes its shard after (`apply`), before it reads the next message."""
        scripts = self.accept_scripts
        outcome = ItemOutcome._make
        outcomes = [outcome((rid, start, num_tokens,
                             verdict(scripts.get(rid), verdict_index, num_tokens - 1) if decode else 0,
                             pages))
                    for rid, start, num_tokens, _, decode, verdict_index, pages in plan.items]
        return RankExecutionResult(self.rank, self.world_size, plan.step, tuple(outcomes))

    def apply(self, plan: ExecutionPlan) -> None:
        """Write every item's positions into the shard, at its placements."""
        write = self.shard.write_span
        for rid, start, num_tokens, _, _, _, pages in plan.items:
            write(pages, rid, start, num_tokens)
