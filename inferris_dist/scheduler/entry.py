"""Library entry: the engine with its executor on real processes.

    import inferris_dist
    with inferris_dist.launch("workload.json", world_size=4) as engine:
        for trace in engine.run():
            print(trace.to_json())

`engine` is a `DistributedEngine`, driving an `engine.Engine` whose executor
is a `ProcessGroup` (the engine's state reads through it); its `run()` also
audits every rank's shard at the end (and every `audit_every` steps), and a
failed step follows `on_rank_loss` (abort, restore, recompute).

With `listen="tcp://ADDR:PORT"` the group spawns nothing: it binds there and
waits `join_timeout` seconds for workers someone else starts
(`inferris-dist worker --connect ...`), each proving its rank's CURVE key
from `keys` (a directory made by `inferris-dist keys`). A lost member is
replaced by a new worker joining within `rejoin_timeout`. Members we did not
start leave when they stop hearing from us: keep stepping the engine.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from inferris_dist.engine import Workload, load_workload
from inferris_dist.observe.recorder import Recorder
from inferris_dist.protocol.faults import parse_faults
from inferris_dist.scheduler.group import ProcessGroup
from inferris_dist.scheduler.options import LaunchOptions
from inferris_dist.scheduler.recovery import DistributedEngine
from inferris_dist.wirelog.writer import WireLog, workload_fields


@contextmanager
def launch(workload: Workload | dict | str | Path, world_size: int | None = None, *,
           options: LaunchOptions | None = None, engine_class: type[DistributedEngine] = DistributedEngine,
           **kw) -> Iterator[DistributedEngine]:
    """Start `world_size` rank workers (or wait for them, with `listen`), yield the engine
    driving them; stop them all on exit. Keyword arguments are LaunchOptions fields;
    `engine_class` (a DistributedEngine subclass) is what drives the group, for a test that
    plants a broken recovery of its own."""
    unknown = set(kw) - set(LaunchOptions._fields)
    if unknown:
        raise TypeError(f"launch() got unknown options: {', '.join(sorted(unknown))}")
    options = (options or LaunchOptions())._replace(**kw)
    if world_size is not None:
        options = options._replace(world_size=world_size)
    options = options.read()
    options.check()
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    workload = workload.with_config(world_size=options.world_size)
    options.check_for(workload)
    n = workload.config.world_size
    fault_list = parse_faults(options.faults, n, workload.faults)     # bad input before anything starts
    log, own_stream = None, None
    if options.wire_log is not None:
        if isinstance(options.wire_log, (str, Path)):
            own_stream = open(options.wire_log, "w")
            log = WireLog(own_stream)
        else:
            log = WireLog(options.wire_log)
    recorder = Recorder(n, log, options.timeline, shared_clock=options.listen is None)
    cfg = workload.config
    recorder.run(name=options.name, world_size=n, rung=options.rung, policy=options.on_rank_loss,
                 max_restarts=options.max_restarts,
                 faults=[f.text for f in fault_list],
                 config={k: getattr(cfg, k) for k in ("max_step_tokens", "page_size", "num_pages",
                                                      "spec_len", "world_size")},
                 requests=len(workload.requests), scheduler_pid=os.getpid(), listen=options.listen,
                 shared_clock=options.listen is None,
                 **(workload_fields(workload) if log is not None else {}))
    engine, ended = None, None
    try:
        with ProcessGroup(workload, options, recorder) as group:
            engine = engine_class(workload, group, options)
            try:
                yield engine
            except BaseException as e:
                ended = e
                raise
    except BaseException as e:
        ended = ended or e
        raise
    finally:
        recorder.end(ended, engine.step_id if engine is not None else 0)
        if own_stream is not None:
            own_stream.close()
