"""Library entry: the engine with its executor on real processes.

    import inferris_dist
    with inferris_dist.launch("workload.json", world_size=4) as engine:
        for trace in engine.run():
            print(trace.to_json())

`engine` is an `engine.Engine` whose executor is a `ProcessGroup`; its
`run()` also audits every rank's shard at the end (and every `audit_every`
steps), and a failed step follows `on_rank_loss` (abort, restore, recompute).

With `listen="tcp://ADDR:PORT"` the group spawns nothing: it binds there and
waits `join_timeout` seconds for workers someone else starts
(`inferris-dist worker --connect ...`), each proving its rank's CURVE key
from `keys` (a directory made by `inferris-dist keys`). A lost member is
replaced by a new worker joining within `rejoin_timeout`. Members we did not
start leave when they stop hearing from us: keep stepping the engine.
"""
from __future__ import annotations

import ipaddress
import os
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence, TextIO

from inferris_dist.engine import EngineError, Workload, WorkloadError, load_workload
from inferris_dist.engine.rungs import rung as rung_named
from inferris_dist.observe.records import WireLog
from inferris_dist.observe.timeline import Timeline
from inferris_dist.protocol.faults import POLICIES, parse_faults
from inferris_dist.protocol.keys import ServerKeys
from inferris_dist.protocol.limits import MAX_SECONDS, valid_seconds
from inferris_dist.protocol.placement import PlacementError, check_address
from inferris_dist.scheduler.group import ProcessGroup
from inferris_dist.scheduler.recovery import DistributedEngine


@dataclass(frozen=True)
class LaunchOptions:
    """Everything about a launch but the workload: one set, for the library and the CLI."""
    world_size: int | None = None
    step_timeout: float = 10.0
    faults: Sequence[str] = ()
    audit_every: int = 0
    on_rank_loss: str = "abort"
    max_restarts: int = 3
    wire_log: str | Path | TextIO | None = None
    timeline: Timeline | None = None
    listen: str | None = None           # bind here and wait for workers someone else starts
    keys: str | Path | None = None      # CURVE key directory (inferris-dist keys)
    join_timeout: float = 60.0
    rejoin_timeout: float = 30.0
    # told (address, ranks, timeout, rejoin) when the group waits for members to join
    on_waiting: Callable[[str, list[int], float, bool], None] | None = None
    rung: str = "full"                  # the mechanism ladder's rung (SPEC §6)
    name: str = ""                      # the workload's name, for the wire log and the page

    def check(self) -> None:
        """Refuse, as bad input (WorkloadError), options that cannot work together."""
        for name in ("step_timeout", "join_timeout", "rejoin_timeout"):
            if not valid_seconds(getattr(self, name)):
                raise WorkloadError(f"{name} must be a number of seconds > 0 and <= {MAX_SECONDS:g}, "
                                    f"got {getattr(self, name)!r}")
        rung_named(self.rung)
        if self.on_rank_loss not in POLICIES:
            raise WorkloadError(f"unknown --on-rank-loss {self.on_rank_loss!r}; one of {', '.join(POLICIES)}")
        if self.audit_every < 0:
            raise WorkloadError("--audit-every must be >= 0")
        if self.max_restarts < 0:
            raise WorkloadError("--max-restarts must be >= 0")
        if self.keys is not None and self.listen is None:
            raise WorkloadError("--keys needs --listen (ranks spawned here use a fresh run secret)")
        if self.listen is not None:
            try:
                check_address(self.listen, "--listen")
            except PlacementError as e:
                raise WorkloadError(str(e)) from None
            if self.keys is None and not is_loopback(self.listen):
                raise WorkloadError(f"--listen {self.listen} is not a loopback address: pass --keys DIR "
                                    f"(make them with `inferris-dist keys DIR --world-size N`); "
                                    f"nothing crosses a network in plaintext")


def is_loopback(address: str) -> bool:
    host = address[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False     # a name or an interface: may reach the network


@contextmanager
def launch(workload: Workload | dict | str | Path, world_size: int | None = None, *,
           options: LaunchOptions | None = None, **kw) -> Iterator[DistributedEngine]:
    """Start `world_size` rank workers (or wait for them, with `listen`), yield the engine
    driving them; stop them all on exit. Keyword arguments are LaunchOptions fields."""
    unknown = set(kw) - {f.name for f in fields(LaunchOptions)}
    if unknown:
        raise TypeError(f"launch() got unknown options: {', '.join(sorted(unknown))}")
    options = replace(options or LaunchOptions(), **kw)
    if world_size is not None:
        options = replace(options, world_size=world_size)
    options.check()
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    workload = workload.with_config(world_size=options.world_size)
    n = workload.config.world_size
    fault_list = parse_faults(options.faults, n, workload.faults)
    keys = ServerKeys.load(options.keys, n) if options.keys is not None else None
    log, own_stream = None, None
    if options.wire_log is not None:
        if isinstance(options.wire_log, (str, Path)):
            own_stream = open(options.wire_log, "w")
            log = WireLog(own_stream)
        else:
            log = WireLog(options.wire_log)
    if log is not None:
        cfg = workload.config
        log.event("run", name=options.name, world_size=n, rung=options.rung, policy=options.on_rank_loss,
                  faults=[f.text for f in fault_list],
                  config={k: getattr(cfg, k) for k in ("max_step_tokens", "page_size", "num_pages",
                                                       "spec_len", "world_size")},
                  requests=len(workload.requests), scheduler_pid=os.getpid(), listen=options.listen,
                  shared_clock=options.listen is None)
    engine, ended = None, None
    try:
        with ProcessGroup(workload, n, step_timeout=options.step_timeout, faults=fault_list,
                          wire_log=log, listen=options.listen, keys=keys,
                          join_timeout=options.join_timeout, rejoin_timeout=options.rejoin_timeout,
                          on_waiting=options.on_waiting) as group:
            engine = DistributedEngine(workload, group, options.audit_every, options.on_rank_loss,
                                       options.max_restarts, rung=options.rung)
            engine.timeline = options.timeline
            group.channel.timing = options.timeline is not None or log is not None
            if options.timeline is not None:
                options.timeline.shared_clock = not group.external
            try:
                yield engine
            except BaseException as e:
                ended = e
                raise
    except BaseException as e:
        ended = ended or e
        raise
    finally:
        if log is not None:
            _log_end(log, engine, ended)
        if own_stream is not None:
            own_stream.close()


def _log_end(log: WireLog, engine: DistributedEngine | None, ended: BaseException | None) -> None:
    """The wire log's last line: how the run ended (after every worker was stopped)."""
    if ended is None:
        error = None
    elif isinstance(ended, EngineError):
        error = ended.to_json()
    else:
        error = {"error": type(ended).__name__, "message": str(ended)}
    try:
        log.event("end", status="ok" if ended is None else "failed", error=error,
                  steps=engine.step_id if engine is not None else 0)
    except OSError:
        pass                    # the log's own failure is reported where it is closed
