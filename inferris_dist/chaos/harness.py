"""Running chaos schedules on real processes, one after another, and judging each run.

A `Session` keeps what one run can lend the next: the process it runs in, one worker template
(a worker the run must start is forked from it, not started afresh), a warm world
(scheduler/world.py: the workers of a run that ended whole, still connected, configured again
by the next run, which starts only the ranks it lacks), the in-process reference of each
workload and rung, and a private directory for the wire logs. Everything else is a run's own,
as a `launch` makes it: its epochs, its faults, its recoveries, its wire log.

After each run the session looks for what the run may have left: every worker it held
(`Run.pids`: those it started and those it took from the warm world) must be gone but those it
handed back, and no run directory of this process other than the template's and the world's
may be left in the temp directory. The wire log of every run is written to a file and handed
to each of `checkers` (by default WIRE_LOG_CHECKERS, below).
"""
from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from inferris_dist.chaos.runs import Run, run_on_processes
from inferris_dist.chaos.schedules import Schedule, workload_key
from inferris_dist.chaos.verdicts import (
    Break,
    Reference,
    fired_faults,
    judge_run,
    log_is_complete,
    reference_of,
)
from inferris_dist.engine import Workload, WorkloadError
from inferris_dist.launcher import Template
from inferris_dist.launcher.rundir import PREFIX, short_roots
from inferris_dist.scheduler.world import World


# -- the wire-log checkers ----------------------------------------------------------------------
# The one place every run's wire log (a file of JSON lines, docs/observing.md) is handed to
# checkers: each is called with the log's path and returns a list of violations (anything with a
# str(); empty when the log is fine), and the first violation of the first checker that finds one
# is the run's break: the log is whole, and it passes the history checker (`inferris-dist check`).
def history(path: Path) -> list:
    from inferris_dist.judge.check import check_log
    return check_log(path).violations


WIRE_LOG_CHECKERS: list[Callable[[Path], list]] = [log_is_complete, history]

DEFAULT_STEP_TIMEOUT = 0.25   # a rank lost after this long: short, since a hang waits all of it out
MEASURE_TIMEOUT = 5.0         # the deadline of the runs that measure the step time (no fault in them)

# The step deadline chaos derives from the workload's own steps (`deadline_from`): a multiple of
# the median step measured (and of the slowest, so that one costly step is not cut off), rounded
# up to a grid so that a machine's noise rarely moves it (nor the schedules drawn from it), within
# bounds: a hang costs the whole deadline, and one too short loses healthy ranks on a busy machine.
MEDIAN_FACTOR, SLOWEST_FACTOR = 100, 10
DEADLINE_GRID = 0.05
DEADLINE_BOUNDS = (0.1, 1.0)


def deadline_from(median: float, slowest: float) -> float:
    """The step deadline for a workload whose steps took `median` seconds, at most `slowest`."""
    low, high = DEADLINE_BOUNDS
    want = max(median * MEDIAN_FACTOR, slowest * SLOWEST_FACTOR)
    steps = math.ceil(round(want / DEADLINE_GRID, 6))
    return min(high, max(low, round(steps * DEADLINE_GRID, 3)))
LEFT_WITHIN = 2.0        # seconds a run's workers may take to be gone once the run has returned


@dataclass
class Outcome:
    """One run on processes, judged."""
    schedule: Schedule
    run: Run | None                    # None: the run raised (its break says what)
    brk: Break | None                  # None: it held
    fired: list[str] = field(default_factory=list)    # the kinds of the faults that fired
    seconds: float = 0.0
    wire_log: Path | None = None       # kept only when the run broke

    @property
    def held(self) -> bool:
        return self.brk is None


class Session:
    """Runs on processes with what can be shared between runs kept for the next (see above).
    A context manager: on the way out the template is stopped and every directory removed."""

    def __init__(self, *, step_timeout: float = DEFAULT_STEP_TIMEOUT, max_restarts: int = 3,
                 checkers: Sequence[Callable[[Path], list]] | None = None, engine_class: type | None = None,
                 share_template: bool = True, left_within: float = LEFT_WITHIN, exec_cost=None,
                 worker: str | None = None, warm: bool = True):
        self.step_timeout = step_timeout
        self.max_restarts = max_restarts
        # the list itself, not a copy: a checker added to WIRE_LOG_CHECKERS later is used too
        self.checkers = WIRE_LOG_CHECKERS if checkers is None else list(checkers)
        self.engine_class = engine_class
        self.share_template = share_template
        self.left_within = left_within
        self.exec_cost = exec_cost
        self.worker = worker            # a worker command (LaunchOptions.worker): no template then
        self.template: Template | None = None
        self.template_pids: list[int] = []          # every template this session started
        self.warm = warm                            # keep a warm world between runs
        self.world: World | None = None
        self.logs: Path | None = None
        self.references: dict[tuple[str, str], Reference] = {}
        self.runs = 0

    def __enter__(self) -> "Session":
        self.logs = Path(tempfile.mkdtemp(prefix=f"inferris-chaos-{os.getpid()}-"))
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.world is not None:
            self.world.close()               # its workers, its socket, its run directory
            self.world = None
        if self.template is not None:
            self.template.close()            # and its run directory with it
            self.template = None
        if self.logs is not None:
            shutil.rmtree(self.logs, ignore_errors=True)
            self.logs = None

    # -- what is shared -----------------------------------------------------------------------

    def reference(self, workload: Workload, rung: str) -> Reference:
        """The in-process run of `workload` at `rung`, computed once."""
        key = (workload_key(workload), rung)
        if key not in self.references:
            self.references[key] = reference_of(workload, rung)
        return self.references[key]

    def shared_template(self) -> Template | None:
        if not self.share_template:
            return None
        if self.template is not None and not self.template.alive():
            self.template.close()            # gone (killed from outside): start another
            self.template = None
        if self.template is None:
            template = Template()
            try:
                template.start()
            except OSError:
                template.close()
                return None                  # each run starts its own, as launch does
            self.template = template
            self.template_pids.append(template.pid)
        return self.template

    def _options(self, rung: str, step_timeout: float) -> dict:
        """What every run of the session is launched with (run_on_processes's options)."""
        options = dict(step_timeout=step_timeout, rung=rung)
        template = self.shared_template() if self.worker is None else None
        if self.worker is not None:
            options["worker"] = self.worker
        if self.warm:
            if self.world is None:
                self.world = World()
            options["world"] = self.world
        if template is not None:
            options["template"] = template
        if self.exec_cost is not None:
            options["exec_cost"] = self.exec_cost
        if self.engine_class is not None:
            options["engine_class"] = self.engine_class
        return options

    def step_times(self, workload: Workload, world_size: int, rung: str, runs: int = 3) -> list[float]:
        """The time of every step of `runs` runs of `workload` on processes without faults, each
        step timed from the commit before it (the first from the start of the steps). The
        session's world and template serve them, and are warm after."""
        from inferris_dist.scheduler.entry import launch
        workload = workload.with_config(world_size=world_size)
        options = self._options(rung, MEASURE_TIMEOUT)
        options.pop("engine_class", None)
        times: list[float] = []
        for _ in range(runs):
            with launch(workload, world_size, **options) as engine:
                last = time.monotonic()
                for _trace in engine.run():
                    now = time.monotonic()
                    times.append(now - last)
                    last = now
        return times

    # -- one run --------------------------------------------------------------------------------

    def run(self, workload: Workload, schedule: Schedule, *, max_restarts: int | None = None) -> Outcome:
        """Run `schedule` (its faults, policy, rung and world size) on `workload`; judged."""
        if self.logs is None:
            self.__enter__()
        reference = self.reference(workload, schedule.rung)
        workload = workload.with_config(world_size=schedule.world_size)
        self.runs += 1
        log = self.logs / f"run-{self.runs}.wire.jsonl"
        options = self._options(schedule.rung, self.step_timeout)
        options.update(wire_log=str(log), name=schedule.workload,
                       max_restarts=self.max_restarts if max_restarts is None else max_restarts)
        policy, operator = schedule.policy, None
        if policy == "regrow":                     # chaos's name for shrink with --regrow
            policy, options["regrow"] = "shrink", True
        elif policy == "pause":                    # a scripted operator at the desk
            from inferris_dist.chaos.operators import PAUSE_TIMEOUT_S, ScriptedOperator
            from inferris_dist.scheduler.operator import Desk
            options["operator"] = desk = Desk(PAUSE_TIMEOUT_S, schedule.pause_default)
            operator = ScriptedOperator(desk, schedule.operator).start()
        started = time.monotonic()
        try:
            run = run_on_processes(workload, schedule.faults, policy,
                                   world_size=schedule.world_size, **options)
        except WorkloadError:
            raise                                  # bad input is the caller's, not a finding
        except Exception as e:                     # an internal error of the product is one
            outcome = Outcome(schedule, None, Break("crashed", f"{type(e).__name__}: {e}"), [],
                              time.monotonic() - started, log if log.exists() else None)
            return outcome
        finally:
            if operator is not None:
                operator.stop()
        seconds = time.monotonic() - started
        kept = set(self.world.pids) if self.world is not None else set()
        left = still_running([p for p in run.pids if p not in kept], self.left_within)
        dirs = run_dirs_left({d for d in (self.template.log_dir if self.template is not None else None,
                                          self.world.run_dir if self.world is not None else None) if d})
        brk = judge_run(reference, run, schedule.faults, schedule.policy, wire_log=log,
                        checkers=self.checkers, left_running=left, run_dirs_left=dirs)
        if brk is None and operator is not None and operator.problems:
            brk = Break("operator", operator.problems[0])
        fired = [f.kind for f in fired_faults(schedule.faults, run)]
        if brk is None:
            log.unlink(missing_ok=True)
        return Outcome(schedule, run, brk, fired, seconds, None if brk is None else log)


def still_running(pids: Sequence[int], within: float) -> list[int]:
    """Those of `pids` still running after `within` seconds (a zombie is gone)."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if not gone(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return status.rsplit(")", 1)[-1].split()[:1] in (["Z"], ["X"])


def run_dirs_left(keep: set) -> list[str]:
    """Run directories of this process in the temp directory (and the short socket roots), but
    those in `keep`: a run that ended must have removed its own."""
    mine = re.compile(rf"^{re.escape(PREFIX)}{os.getpid()}-")
    keep = {str(k) for k in keep}
    out = []
    for root in dict.fromkeys([tempfile.gettempdir(), *short_roots()]):
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        out += [e.path for e in entries if mine.match(e.name) and e.path not in keep]
    return out
