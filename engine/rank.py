"""The rank executor (SPEC §3, phase 7): what every rank runs, in process or in a worker.

A rank holds its shard of the pages (its slice of every page's state) and
the accept scripts, the ranks' stand-in for a model. For each plan item it
gives its verdict (how many draft tokens are accepted, by `verdict_index`)
and writes `(request_id, position)` into its shard for every placement.
"""
from __future__ import annotations

from .messages import ExecutionPlan, RankExecutionResult, new_outcome, shifted_span
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
        if not plan.items:
            return RankExecutionResult(self.rank, self.world_size, plan.step, ())
        ids, starts, counts, _, decodes, indexes, placements, priors = zip(*plan.items)
        accepted = self.accepted(ids, counts, decodes, indexes)
        if any(priors):
            starts, placements = zip(*map(self.where, plan.items))
        outcomes = tuple(map(new_outcome, zip(ids, starts, counts, accepted, placements)))
        return RankExecutionResult(self.rank, self.world_size, plan.step, outcomes)

    def apply(self, plan: ExecutionPlan) -> None:
        """Write every item's positions into the shard, at its placements."""
        write = self.shard.write_span
        for item in plan.items:
            start, pages = self.where(item) if item.prior_drafts else (item.start_position, item.placements)
            write(pages, item.request_id, start, item.num_tokens)

    def where(self, item) -> tuple[int, tuple[int, ...]]:
        """An item's start and pages. Planned after assumed drafts (overlap scheduling), it
        starts as many positions earlier as this rank rejected of them, by its own verdict."""
        if not item.prior_drafts:
            return item.start_position, item.placements
        drafted = item.prior_drafts
        script = self.accept_scripts.get(item.request_id)
        rejected = drafted - verdict(script, item.verdict_index - 1, drafted)
        return shifted_span(item, rejected, self.shard.page_size)

    # The same two, over a plan's columns (a rank on processes gets its plan as columns and
    # never builds the items): one value per item in each, the pages of all items concatenated.

    def accepted(self, request_ids, counts, decodes, verdict_indexes) -> list[int]:
        """Each item's accepted draft tokens: 0 for a prefill, else `verdict` (inlined: the
        rank's hot path) of its script for its num_tokens - 1 drafted."""
        get = self.accept_scripts.get
        out: list[int] = []
        add = out.append
        for rid, count, decode, index in zip(request_ids, counts, decodes, verdict_indexes):
            if not decode:
                add(0)
                continue
            drafted = count - 1
            script = get(rid)
            if script is None or index >= len(script):
                add(drafted)
                continue
            a = script[index]
            add(a if 0 <= a <= drafted else drafted if a > drafted else min(0, drafted))
        return out

    def place_columns(self, request_ids, starts, counts, verdict_indexes, num_pages, priors, pages):
        """`where` over columns: (starts, num_pages, pages) as the items really run. `verdict`
        and `shifted` are inlined (the rank's hot path at overlap; the columnar tests hold
        them to `where` on every golden step and on generated plans): an item's pages are
        sliced out of `pages` once, where it really runs. For columns the wire has checked:
        no negative prior_drafts, every num_tokens at least 1."""
        get, page_size = self.accept_scripts.get, self.shard.page_size
        starts, kept_counts, kept = list(starts), [], []
        count_kept, keep = kept_counts.append, kept.extend
        at = 0
        for i, (rid, count, index, k, prior) in enumerate(zip(request_ids, counts, verdict_indexes,
                                                                num_pages, priors)):
            end = at + k
            if prior:
                script, j = get(rid), index - 1
                a = script[j] if script is not None and j < len(script) else prior
                a = a if 0 <= a <= prior else prior if a > prior else 0     # clamped, as `accepted`
                start = starts[i]
                first = at - (start - prior) // page_size
                start -= prior - a                                          # the drafts rejected
                starts[i] = start
                own = pages[first + start // page_size:min(end, first + (start + count - 1) // page_size + 1)]
            else:
                own = pages[at:end]
            count_kept(len(own))
            keep(own)
            at = end
        return starts, kept_counts, kept

    def apply_columns(self, request_ids, starts, counts, num_pages, pages) -> None:
        """`apply`: item i is written at the next num_pages[i] of `pages`."""
        write = self.shard.write_span
        pages = tuple(pages)
        at = 0
        for rid, start, num_tokens, k in zip(request_ids, starts, counts, num_pages):
            write(pages[at:at + k], rid, start, num_tokens)
            at += k
