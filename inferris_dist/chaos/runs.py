"""One run of a workload on worker processes, as it ended: its lines, its failure, the
recoveries it survived, every worker it started and the faults no plan reached. What chaos
judges and the testing library hands out (`inferris_dist.testing.run_on_processes`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from inferris_dist.engine import EngineError, Workload, load_workload


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
        with launch(as_workload(workload), world_size, faults=list(faults), on_rank_loss=policy,
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


def as_workload(workload) -> Workload:
    """A workload as given: a Workload, or anything load_workload takes."""
    return workload if isinstance(workload, Workload) else load_workload(workload)
