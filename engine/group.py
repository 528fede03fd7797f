"""Rank groups (SPEC §3, phase 8): N rank results become one only by exact agreement.

`join` is the rule, shared by every group; `LocalGroup` is the in-process
group of N rank executors, the engine's default executor.
"""
from __future__ import annotations

from typing import Iterable

from .errors import GroupViolation
from .messages import ExecutionPlan, ExecutionResult, ItemOutcome, RankExecutionResult
from .rank import RankExecutor
from .workload import Workload


def join(results: Iterable[RankExecutionResult], world_size: int, step: int) -> ExecutionResult:
    """One result from N: ranks 0..N-1 exactly once, world size N, all equal. No majority vote."""
    results = list(results)
    ranks = sorted(r.rank for r in results)
    if ranks != list(range(world_size)):
        raise GroupViolation(f"results cover ranks {ranks}, want 0..{world_size - 1} once each")
    by_rank = sorted(results, key=lambda r: r.rank)
    for r in by_rank:
        if r.world_size != world_size:
            raise GroupViolation(f"rank {r.rank} names world size {r.world_size}, want {world_size}",
                                 ranks=(r.rank,))
        if r.step != step:
            raise GroupViolation(f"rank {r.rank} answers step {r.step}, want {step}")
    first = by_rank[0]
    if any(r.outcomes != first.outcomes for r in by_rank[1:]):
        raise disagreement(by_rank)
    return ExecutionResult(step, first.outcomes)


def disagreement(by_rank: list[RankExecutionResult]) -> GroupViolation:
    """What each rank reported, side by side, at the first item and field where they differ.
    Nothing commits without every rank (no majority): which side is smaller is said as
    information, never as a verdict, and nobody is blamed."""
    where, sides = _first_split(by_rank)
    said = "; ".join(f"{_who(ranks)} {'says' if len(ranks) == 1 else 'say'} {_short(value)}"
                     for value, ranks in sides)
    sizes = sorted(len(ranks) for _, ranks in sides)
    alone = [ranks for _, ranks in sides if len(ranks) == sizes[0]]
    note = ""
    if len(sides) == 2 and sizes[0] < sizes[1]:
        note = f" ({_who(alone[0])} in the minority: nothing commits without every rank)"
    err = GroupViolation(f"the ranks disagree on {where}: {said}{note}",
                         ranks=tuple(r.rank for r in by_rank))
    err.sides = [{"ranks": list(ranks), "value": value} for value, ranks in sides]
    err.where = where
    return err


def _first_split(by_rank: list[RankExecutionResult]) -> tuple[str, list]:
    """(where, [(value, ranks)]): the first item and field the ranks' outcomes differ on, and
    the ranks that reported each value there, in the order of their lowest rank."""
    outcomes = [r.outcomes for r in by_rank]
    if len({len(o) for o in outcomes}) > 1:
        return "the number of outcomes", _sides(by_rank, [len(o) for o in outcomes])
    for i in range(len(outcomes[0])):
        items = [o[i] for o in outcomes]
        for field in ItemOutcome._fields:
            values = [getattr(x, field) for x in items]
            if any(v != values[0] for v in values):
                rid = items[0].request_id if field != "request_id" else i
                return f"item {i} ({rid}) {field}", _sides(by_rank, values)
    return "their outcomes", _sides(by_rank, outcomes)   # pragma: no cover: a field differs


def _sides(by_rank, values) -> list:
    sides: dict = {}
    for r, v in zip(by_rank, values):
        sides.setdefault(_hashable(v), (v, []))[1].append(r.rank)
    return [(v if not isinstance(v, tuple) else list(v), ranks) for v, ranks in sides.values()]


def _hashable(v):
    return v if not isinstance(v, list) else tuple(v)


def _who(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))


def describe_difference(a: tuple[ItemOutcome, ...], b: tuple[ItemOutcome, ...]) -> str:
    if len(a) != len(b):
        return f"{len(a)} outcomes vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            for field in ItemOutcome._fields:
                if getattr(x, field) != getattr(y, field):
                    return (f"item {i} ({x.request_id}) {field} "
                            f"{_short(getattr(x, field))} vs {_short(getattr(y, field))}")
    return "outcomes differ"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def accept_scripts(workload: Workload) -> dict[str, tuple[int, ...]]:
    return {r.request_id: r.accept_script for r in workload.requests if r.accept_script is not None}


class LocalGroup:
    """N rank executors in this process behind the `execute(plan) -> result` seam."""

    def __init__(self, workload: Workload, world_size: int | None = None):
        cfg = workload.config
        self.world_size = world_size or cfg.world_size
        scripts = accept_scripts(workload)
        self.ranks = [RankExecutor(r, self.world_size, cfg.num_pages, cfg.page_size, scripts)
                      for r in range(self.world_size)]
        self._sent: list[ExecutionPlan] = []

    def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        return join([rank.execute(plan) for rank in self.ranks], self.world_size, plan.step)

    # Overlap scheduling: plans are sent ahead and collected in order; the ranks execute
    # them in the order sent, as workers do with the plans queued on their socket. What
    # `submit` returns (here the plan itself) is what the engine hands back to `collect`.
    def submit(self, plan: ExecutionPlan) -> ExecutionPlan:
        self._sent.append(plan)
        return plan

    def collect(self, plan: ExecutionPlan) -> ExecutionResult:
        first = self._sent.pop(0)
        assert first is plan, "plans are collected in the order they were sent"
        return self.execute(first)

    def shards(self) -> dict[int, list]:
        """Each rank's shard as a snapshot, for the audit."""
        return {rank.rank: rank.shard.snapshot() for rank in self.ranks}
