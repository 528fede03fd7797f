"""One run of a workload on worker processes, as it ended: its lines, its failure, the
recoveries it survived, every worker it started and the faults no plan reached. What chaos
judges and the testing library hands out (`inferris_dist.testing.run_on_processes`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from inferris_dist.engine import EngineError, Workload, WorkloadError, load_workload
from inferris_dist.protocol.faults import POLICIES


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
    is stopped before this returns; a failure of the run is in the result, not raised. Bad
    input raises before anything starts: WorkloadError naming the argument (WrongType, also a
    TypeError, for one of the wrong type)."""
    from inferris_dist.scheduler.entry import launch  # the control plane, only when used
    workload = as_workload(workload)
    faults = _checked_arguments(faults, policy, world_size, check, options)
    lines: list[dict] = []
    recoveries: list = []
    engine = None
    error = None
    try:
        with launch(workload, world_size, faults=faults, on_rank_loss=policy,
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


class WrongType(WorkloadError, TypeError):
    """An argument of the wrong type: bad input (a WorkloadError) and a TypeError alike."""


def as_workload(workload) -> Workload:
    """A workload as given: a Workload, or anything load_workload takes."""
    if isinstance(workload, Workload):
        return workload
    if not isinstance(workload, (dict, str, Path)):
        raise WrongType(f"workload: want a Workload, a dict or a path, got {_shown(workload)}")
    return load_workload(workload)


def _checked_arguments(faults, policy, world_size, check, options: dict) -> list[str]:
    """run_on_processes's arguments checked before anything starts, each refusal naming its
    argument; the faults as a list."""
    from inferris_dist.scheduler.options import LaunchOptions
    if isinstance(faults, (str, bytes)) or not isinstance(faults, Sequence):
        raise WrongType(f"faults: want a list of fault specs (RANK:KIND@STEP, docs/faults.md), "
                        f"got {_shown(faults)}")
    for i, f in enumerate(faults):
        if not isinstance(f, str):
            raise WrongType(f"faults[{i}]: want a fault spec (RANK:KIND@STEP), got {_shown(f)}")
    if not isinstance(policy, str) or policy not in POLICIES:
        raise WorkloadError(f"policy: want one of {', '.join(POLICIES)}, got {_shown(policy)}")
    if world_size is not None and (type(world_size) is not int or world_size < 1):
        raise WorkloadError(f"world_size: want a whole number >= 1 (or None), got {_shown(world_size)}")
    if check is not None and not callable(check):
        raise WrongType(f"check: want a callable, check(engine), or None, got {_shown(check)}")
    unknown = sorted(set(options) - set(LaunchOptions._fields) - {"engine_class"})
    taken = sorted(set(options) & {"faults", "on_rank_loss"})
    if unknown or taken:
        raise WrongType(f"run_on_processes() got unknown options: {', '.join(unknown)}" if unknown else
                        f"{taken[0]}: give it as run_on_processes's "
                        f"{'faults' if taken[0] == 'faults' else 'policy'} argument")
    if "wire_log" in options and isinstance(options["wire_log"], (str, Path)):
        _probe_wire_log(Path(options["wire_log"]))
    return list(faults)


def _probe_wire_log(path: Path) -> None:
    """The wire log's file, opened and written as the run will (it is overwritten): a path that
    cannot take it is refused now, not from inside the run."""
    try:
        with open(path, "w") as stream:
            stream.write("\n")
            stream.flush()
            try:
                stream.seek(0)
                stream.truncate()
            except OSError:
                pass                       # not a file that truncates (a device): written all the same
    except OSError as e:
        raise WorkloadError(f"wire_log {str(path)!r}: cannot be written ({e.strerror or e})") from None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
