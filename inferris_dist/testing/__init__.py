"""Testing an executor's boundary from your own tests: runs on real processes with faults and a
recovery policy, judged by what the policy promises.

    from inferris_dist import testing

    reference = testing.reference("workload.json")            # the in-process engine's lines
    run = testing.run_on_processes("workload.json", faults=["1:crash@2"], policy="restore",
                                   world_size=4)
    testing.assert_holds(reference, run)                       # restore: the same trace

This package is the public face (docs/library.md) and holds no rule of its own: a run on
processes is chaos/runs.py's, what each policy promises and how a run is judged against it
judge/promise.py's, a recorded run's history judged afterwards judge/check.py's
(`check_history`), the control plane's bookkeeping judge/invariants.py's (`check_invariants`).
The chaos names docs/library.md documents (ChaosConfig, explore, Session, judge_run, shrink,
write_reproducer, merge_reports, WIRE_LOG_CHECKERS) are handed out here as they are in
inferris_dist.chaos, where the rest of chaos is.
"""
from __future__ import annotations

from pathlib import Path

from inferris_dist.chaos.exploring import ChaosConfig, explore, merge_reports
from inferris_dist.chaos.harness import WIRE_LOG_CHECKERS, Session
from inferris_dist.chaos.runs import Run, as_workload, run_on_processes
from inferris_dist.chaos.shrinking import shrink, write_reproducer
from inferris_dist.chaos.verdicts import judge_run
from inferris_dist.engine import Engine, Workload, trace_dicts
from inferris_dist.judge.check import check_log as check_history
from inferris_dist.judge.invariants import InvariantBroken, check_invariants
from inferris_dist.judge.promise import (
    broken,
    comparable,
    first_difference,
    first_summary_difference,
    judge,
    kept,
)

__all__ = ["InvariantBroken", "Run", "assert_holds", "check_history", "check_invariants", "comparable",
           "first_difference", "first_summary_difference", "judge", "reference", "run_on_processes",
           # chaos (docs/chaos.md), as inferris_dist.chaos has them
           "WIRE_LOG_CHECKERS", "ChaosConfig", "Session", "explore", "judge_run", "merge_reports", "shrink",
           "write_reproducer"]


def reference(workload: Workload | dict | str | Path, rung: str = "full") -> list[dict]:
    """The in-process engine's lines for `workload`: what a run on processes is judged against."""
    return trace_dicts(Engine(as_workload(workload), rung=rung))


def assert_holds(local: list[dict], run: Run | list[dict], policy: str | None = None,
                 faults: list[str] | None = None) -> dict:
    """Assert `run` keeps its policy's promise against the in-process `local` lines; the verdict
    (judge/promise.py `kept`: a failure a fault made keeps abort's promise when the steps before
    it are the reference's exactly and it blames a rank a fault acted on; `faults`, the run's, for
    that blame: left out, it is not checked). The AssertionError says what differed first (and
    what failed, on which side)."""
    remote = run.lines if isinstance(run, Run) else run
    policy = policy or (run.policy if isinstance(run, Run) else "abort")
    verdict = kept(local, remote, policy, faults)
    said = broken(verdict, policy)
    if said is not None:
        raise AssertionError(said)
    return verdict
