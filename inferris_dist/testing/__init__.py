"""Testing an executor's boundary from your own tests: runs on real processes with faults and a
recovery policy, judged by what the policy promises.

    from inferris_dist import testing

    reference = testing.reference("workload.json")            # the in-process engine's lines
    run = testing.run_on_processes("workload.json", faults=["1:crash@2"], policy="restore",
                                   world_size=4)
    testing.assert_holds(reference, run)                       # restore: the same trace

What each policy promises (docs/faults.md):

- abort (and a run without faults): the same trace as the in-process engine, or, when a
  fault fires, a failure of one of the kinds that can stop a step, naming the faulted rank;
- restore: the same trace, byte for byte, whatever was lost;
- recompute: the same summary (every request's tokens and how it finished); the steps may
  differ, since a recompute plans the step again from nothing.

`check_history(wire_log, workload=None)` judges a run's wire log afterwards, whatever wrote
it (inferris_dist.judge.check): every committed step joined from its epoch's results and
following from its plan, no stale or retired reply taken, and the policy's promise against
the reference; a `Report` of violations, empty when the history holds.

Lines are SPEC §4 objects: one per step, then `{"summary": [...]}`, or the error object
where the run failed. `comparable` is how lines compare: an error line by its kind and
step only (its message is for people). `check_invariants(engine)` asserts the control
plane's bookkeeping after a committed step (pass it as `check=` to check every step).

The same package draws fault schedules itself and runs them (`inferris-dist chaos`,
docs/chaos.md): schedules.py draws them from a seed, harness.py runs each on processes with one
shared worker template and judges it (verdicts.py), exploring.py counts and shards, shrinking.py
shrinks a break to a reproducer; their names are loaded from here on first use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from inferris_dist.engine import CACHE, Engine, EngineError, State, Workload, load_workload, trace_dicts
from inferris_dist.judge.check import check_log as check_history
from inferris_dist.judge.promise import broken, comparable, first_difference, first_summary_difference, judge

__all__ = ["InvariantBroken", "Run", "assert_holds", "check_history", "check_invariants", "comparable",
           "first_difference", "first_summary_difference", "judge", "reference", "run_on_processes",
           # chaos (docs/chaos.md), loaded on first use
           "WIRE_LOG_CHECKERS", "Break", "ChaosConfig", "Outcome", "Reference", "Report", "Reproducer",
           "Schedule", "Session", "Shrunk", "draw_faults", "explore", "fault_kinds", "judge_promise",
           "judge_run", "merge_reports", "random_workloads", "reference_of", "schedule_at", "shrink",
           "write_reproducer"]

# Chaos exploration lives in this package's modules, imported when one of its names is first used.
_CHAOS = {name: module for module, names in (
    ("harness", ("WIRE_LOG_CHECKERS", "Outcome", "Session")),
    ("verdicts", ("Break", "Reference", "judge_promise", "judge_run", "reference_of")),
    ("schedules", ("Schedule", "draw_faults", "fault_kinds", "random_workloads")),
    ("exploring", ("ChaosConfig", "Report", "explore", "merge_reports", "schedule_at")),
    ("shrinking", ("Reproducer", "Shrunk", "shrink", "write_reproducer"))) for name in names}


def __getattr__(name: str):
    if name in _CHAOS:
        import importlib
        value = getattr(importlib.import_module(f"inferris_dist.chaos.{_CHAOS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- running ----------------------------------------------------------------------------------

@dataclass
class Run:
    """One run on processes, as it ended."""
    lines: list[dict]                  # the steps, then the summary, or the error object last
    error: EngineError | None          # what ended it, if it failed
    recoveries: list = field(default_factory=list)   # every failure survived (scheduler.Recovery)
    pids: list[int] = field(default_factory=list)    # every worker process started, replacements too
    unfired: list[str] = field(default_factory=list)  # faults whose step no plan reached
    policy: str = "abort"

    @property
    def summary(self) -> list[dict] | None:
        return self.lines[-1]["summary"] if self.lines and "summary" in self.lines[-1] else None


def reference(workload: Workload | dict | str | Path, rung: str = "full") -> list[dict]:
    """The in-process engine's lines for `workload`: what a run on processes is judged against."""
    return trace_dicts(Engine(_workload(workload), rung=rung))


def run_on_processes(workload: Workload | dict | str | Path, faults: Sequence[str] = (),
                     policy: str = "abort", *, world_size: int | None = None,
                     check: Callable | None = None, **options) -> Run:
    """Run `workload` on `world_size` worker processes (default: the workload's) with `faults`
    (`RANK:KIND@STEP[+][:ARG]`, see docs/faults.md) under `policy`; `options` are any other
    `LaunchOptions` fields (step_timeout, max_restarts, rung, audit_every, wire_log, ...) or
    `launch`'s engine_class.
    `check(engine)` runs after every committed step (e.g. `check_invariants`). Every worker
    is stopped before this returns; a failure of the run is in the result, not raised (bad
    input still raises, as `launch` does)."""
    from inferris_dist.scheduler.entry import launch  # the control plane, only when used
    lines: list[dict] = []
    recoveries: list = []
    engine = None
    error = None
    try:
        with launch(_workload(workload), world_size, faults=list(faults), on_rank_loss=policy,
                    **options) as engine:
            for trace in engine.run():
                lines.append(engine.trace_json(trace))
                recoveries += engine.take_recoveries()
                if check is not None:
                    check(engine)
            lines.append({"summary": engine.summary()})
    except EngineError as e:
        error = e
        lines.append(e.to_json())
    if engine is not None:
        recoveries += engine.take_recoveries()
    group = engine.group if engine is not None else None
    return Run(lines, error, recoveries, list(group.pids_started) if group is not None else [],
               [f.text for f in group.unfired] if group is not None else [], policy)


def _workload(workload) -> Workload:
    return workload if isinstance(workload, Workload) else load_workload(workload)


# -- judging (judge/promise.py) ---------------------------------------------------------------

def assert_holds(local: list[dict], run: Run | list[dict], policy: str | None = None) -> dict:
    """Assert `run` keeps its policy's promise against the in-process `local` lines; the verdict.
    The AssertionError says what differed first (and what failed, on which side)."""
    remote = run.lines if isinstance(run, Run) else run
    policy = policy or (run.policy if isinstance(run, Run) else "abort")
    verdict = judge(local, remote, policy)
    said = broken(verdict, policy)
    if said is not None:
        raise AssertionError(said)
    return verdict


# -- the control plane's bookkeeping ----------------------------------------------------------

class InvariantBroken(AssertionError):
    """A bookkeeping invariant of the control plane does not hold after a committed step."""


def check_invariants(eng: Engine) -> None:
    """Raise InvariantBroken unless every bookkeeping invariant of a committed step holds (SPEC
    §2, §3): the free list is exactly the unowned pages and they are empty; every page is owned
    by the cache or an unfinished request, which maps it; each request's page table covers
    exactly its computed positions, and its own pages hold exactly them; cache pages' refs
    count the tables mapping them, and the cache's nodes hold exactly the cache's pages."""
    pool, cache = eng.pool, eng.cache
    # the cache's owner mark: the engine's, or that of an engine of one's own that has its own
    cache_owner = getattr(eng, "CACHE", None) or getattr(pool, "CACHE", None) or CACHE
    num_pages = pool.num_pages
    owner, refs = pool.owner, pool.refs
    requests = eng.requests
    by_id = {r.request_id: r for r in requests}
    _require(len(by_id) == len(requests), "duplicate request ids in engine.requests")
    _require(len(owner) == num_pages and len(refs) == num_pages, "owner or refs not one per page")

    free = pool.free_pages()
    free_set = set(free)
    _require(len(free) == len(free_set), lambda: f"free list has duplicates: {free}")
    _require(all(0 <= p < num_pages for p in free), lambda: f"free list has a bad page id: {free}")
    unowned = {p for p in range(num_pages) if owner[p] is None}
    _require(free_set == unowned, lambda: f"free list {sorted(free_set)} != pages with no owner "
                                          f"{sorted(unowned)}")
    owned = [p for p in range(num_pages) if owner[p] is not None]
    for p in free:
        _require(all(s is None for s in pool.slots.slots(p)), lambda: f"free page {p} has non-empty slots")
    for p in owned:
        o = owner[p]
        if o is cache_owner:
            continue
        _require(isinstance(o, str) and o in by_id, lambda: f"page {p} owned by unknown {o!r}")
        _require(by_id[o].state is not State.FINISHED, lambda: f"page {p} owned by finished request {o}")

    mapped_by: dict[int, list[str]] = {}
    for r in requests:
        _check_request(r, pool, free_set, mapped_by, cache_owner)
    for p in owned:
        o = owner[p]
        if o is not cache_owner:
            _require(mapped_by.get(p) == [o], lambda: f"page {p} owned by {o} is mapped by "
                                                      f"{mapped_by.get(p, [])}")

    cache_pages = {p for p in owned if owner[p] is cache_owner}
    for p in cache_pages:
        _require(refs[p] == len(mapped_by.get(p, [])),
                 lambda: f"cache page {p}: refs {refs[p]}, mapped by {mapped_by.get(p, [])}")
    node_of_page = cache.node_of_page
    _require(set(node_of_page) == cache_pages, lambda: f"cache nodes hold pages {sorted(node_of_page)}, "
                                                       f"cache-owned pages are {sorted(cache_pages)}")
    nodes = list(cache.tree_order())
    tree_pages = [n.page for n in nodes]
    _require(len(tree_pages) == len(set(tree_pages)), lambda: f"two cache nodes share a page: {tree_pages}")
    _require(set(tree_pages) == cache_pages, lambda: f"tree order visits pages {tree_pages}, cache-owned "
                                                     f"pages are {sorted(cache_pages)}")
    for n in nodes:
        _require(node_of_page[n.page] is n, lambda: f"node_of_page[{n.page}] is not the tree's node")
        children = getattr(getattr(n, "parent", None), "children", None)
        if children is not None:
            _require(children.get(n.key) is n, lambda: f"node of page {n.page} not under its parent")
    num_unfinished = getattr(eng, "num_unfinished", None)
    if num_unfinished is not None:
        real = sum(1 for r in requests if r.state is not State.FINISHED)
        _require(num_unfinished == real, lambda: f"num_unfinished {num_unfinished}, really {real}")


def _check_request(r, pool, free_set: set[int], mapped_by: dict[int, list[str]], cache_owner) -> None:
    table, rid, page_size = r.page_table, r.request_id, pool.page_size
    _require(len(table) == len(set(table)), lambda: f"{rid}: page table maps a page twice: {table}")
    if r.state is State.FINISHED:
        _require(table == [], lambda: f"finished {rid} still holds pages {table}")
        _require(r.finish_reason is not None, lambda: f"finished {rid} has no finish_reason")
        return
    _require(r.finish_reason is None, lambda: f"unfinished {rid} has finish_reason {r.finish_reason}")
    if r.state is State.WAITING:
        _require(table == [] and r.computed == 0 and r.generated == 0, lambda: f"waiting {rid} has state")
        return
    _require(r.state is State.RUNNING, lambda: f"{rid}: unknown state {r.state!r}")
    _require(0 <= r.computed <= r.prompt + r.generated,
             lambda: f"{rid}: computed {r.computed} outside [0, target {r.prompt + r.generated}]")
    _require(0 <= r.generated < r.max_new_tokens,
             lambda: f"running {rid}: generated {r.generated}, max_new_tokens {r.max_new_tokens}")
    want = -(-r.computed // page_size)
    _require(len(table) == want, lambda: f"{rid}: page table {table} for computed {r.computed} "
                                         f"(want {want} pages)")
    for logical, p in enumerate(table):
        _require(0 <= p < pool.num_pages, lambda: f"{rid}: bad page id {p}")
        _require(p not in free_set, lambda: f"{rid}: page table maps free page {p}")
        o = pool.owner[p]
        _require(o is cache_owner or o == rid, lambda: f"{rid}: maps page {p} owned by {o!r}")
        mapped_by.setdefault(p, []).append(rid)
        if o == rid:       # the request's own page holds exactly its own positions below the frontier
            for off in range(page_size):
                pos = logical * page_size + off
                if pos < r.computed:
                    got = pool.slots.slot(p, off)
                    _require(got == (rid, pos), lambda: f"{rid}: page {p} slot {off} holds {got}, "
                                                        f"want {(rid, pos)}")


def _require(holds: bool, message) -> None:
    if not holds:
        raise InvariantBroken(message() if callable(message) else message)

