"""Library entry: the engine with its executor on real processes.

    import inferris_dist
    with inferris_dist.launch("workload.json", world_size=4) as engine:
        for trace in engine.run():
            print(trace.to_json())

`engine` is an `engine.Engine` whose executor is a `ProcessGroup`; its
`run()` also audits every rank's shard at the end (and every `audit_every`
steps), and a failed step follows `on_rank_loss` (abort, restore, recompute).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence, TextIO

from engine import Workload, load_workload

from .faults import parse_faults
from .group import ProcessGroup
from .observe import WireLog
from .recovery import DistributedEngine
from .timeline import Timeline


@contextmanager
def launch(workload: Workload | dict | str | Path, world_size: int | None = None, *,
           step_timeout: float = 10.0, faults: Sequence[str] = (), audit_every: int = 0,
           on_rank_loss: str = "abort", max_restarts: int = 3,
           wire_log: str | Path | TextIO | None = None,
           timeline: Timeline | None = None) -> Iterator[DistributedEngine]:
    """Start `world_size` rank workers, yield the engine driving them; stop them all on exit."""
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    workload = workload.with_config(world_size=world_size)
    n = workload.config.world_size
    fault_list = parse_faults([*workload.faults, *faults], n)
    log, own_stream = None, None
    if wire_log is not None:
        if isinstance(wire_log, (str, Path)):
            own_stream = open(wire_log, "w")
            log = WireLog(own_stream)
        else:
            log = WireLog(wire_log)
    try:
        with ProcessGroup(workload, n, step_timeout=step_timeout, faults=fault_list,
                          wire_log=log) as group:
            engine = DistributedEngine(workload, group, audit_every, on_rank_loss, max_restarts)
            engine.timeline = timeline
            yield engine
    finally:
        if own_stream is not None:
            own_stream.close()
