"""The judge of one chaos run: did it keep its policy's promise, and leave nothing behind?

A run that does not is a *break*, with a class (`Break.kind`, stable, what shrinking keeps
constant) and a one-line reason. The classes, in the order they are judged:

- `differs`: a run with no failure whose trace (restore, abort) or summary (recompute) is not
  the in-process run's;
- `failed`: restore or recompute ended in an error though no fault that keeps coming back
  fired (the restarts ran out, or the failure is not one a recovery takes); shrink, regrow or
  pause ended in one it was not told to end in (the floor, the restarts spent, the operator's
  or the pause timeout's abort);
- `steps-before`: abort, or restore ended by a repeating fault, or shrink, regrow or pause
  ended as told: the steps before the failure are not the reference's;
- `failure-kind`: such a failure is not one a fault makes (RankLost, GroupViolation,
  BoundaryViolation, ShardDivergence), or came before any step;
- `blame`: such a failure blames a rank no fault fired on by its step, or comes before any
  fault fired;
- `wire-log`: a wire-log checker found a violation;
- `counters`: restore: the counters of the wire log's `step` events are not the reference's;
- `leftover`: a worker process of the run still runs after it ended;
- `run-dir`: a run directory of the run is left in the temp directory;
- `crashed`: the run raised something other than an engine error (an internal error);
- `operator`: under pause, the operator's desk broke one of its rules (a stale epoch taken, an
  id answered twice differently, an instruction the status offered refused).

The policies chaos draws are the launch's and `regrow` (shrink with --regrow): CHAOS_POLICIES.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from inferris_dist.chaos.runs import Run
from inferris_dist.engine import Engine, Workload
from inferris_dist.engine.trace import StepTrace
from inferris_dist.judge.promise import STEP_FAILURES, comparable, error_said, first_difference, judge
from inferris_dist.protocol.faults import POLICIES, Fault, parse_fault

PROMISE_KINDS = ("differs", "failed", "steps-before", "failure-kind", "blame")   # judge_promise's:
                                                                          # what compare also sees
BREAK_KINDS = PROMISE_KINDS + ("wire-log", "counters", "leftover", "run-dir", "crashed", "operator")
CHAOS_POLICIES = POLICIES + ("regrow",)


@dataclass(frozen=True)
class Break:
    kind: str            # one of BREAK_KINDS: what "the same break" means when shrinking
    reason: str          # one line, for people

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


@dataclass
class Reference:
    """The in-process engine's run of a workload at a rung: its lines, and the counters after each
    step that would cross the boundary (an idle step does not), by step."""
    lines: list[dict]
    counters: list[tuple[int, dict]] = field(default_factory=list)
    rung: str = "full"

    @property
    def steps(self) -> int:
        return sum(1 for line in self.lines if "step" in line and "error" not in line)


def reference_of(workload: Workload, rung: str = "full") -> Reference:
    """The reference a chaos run is judged against (computed once per workload and rung)."""
    from inferris_dist.engine import trace_dicts
    from inferris_dist.observe.metrics import step_counters
    counters: list[tuple[int, dict]] = []

    class Counting(Engine):
        def step(self) -> StepTrace:
            trace = super().step()
            counters.append((trace.step, step_counters(self, trace)))
            return trace

    return Reference(trace_dicts(Counting(workload, rung=rung)), counters, rung)


def fired_faults(faults: Sequence[str], run: Run, world_size: int | None = None) -> list[Fault]:
    """The faults of `faults` whose step a plan reached (`Run.unfired` names the others)."""
    unfired = list(run.unfired)
    out = []
    for text in faults:
        if text in unfired:
            unfired.remove(text)
            continue
        out.append(parse_fault(text, world_size))
    return out


def judge_promise(reference: Reference, run: Run, faults: Sequence[str], policy: str) -> Break | None:
    """The policy's promise (docs/faults.md) against the reference; None when it holds.

    - restore: the same trace; recompute: the same summary; either: no error, unless a fault
      that keeps coming back (`@STEP+`) fired, which ends the run as abort does once the
      restarts run out (then judged as abort, below).
    - abort: with no failure, the same trace; with one, the steps before it exactly, and an
      error of a kind a fault makes that blames a rank some fault fired on at or before that
      step (a fault on `all`: any rank; an error that blames nobody: any fault before it). At
      `overlap` a partition at step K acts from K-1: its cut begins with K's plan, which goes
      out while K-1 is awaited (docs/faults.md)."""
    fired = fired_faults(faults, run)
    error = run.error
    if error is None:
        verdict = judge(reference.lines, run.lines, policy)
        if verdict["holds"]:
            return None
        what = "summary" if verdict["compared"] == "summaries" else "trace"
        return Break("differs", f"{policy}: the {what} differs from the in-process run's: "
                                f"{verdict['difference']}")
    ref_failed = bool(reference.lines) and "error" in reference.lines[-1]
    if ref_failed and judge(reference.lines, run.lines, policy)["holds"]:
        return None                       # the workload fails in process too, alike
    if policy == "abort" or policy in ELASTIC and _ended_as_told(run.lines[-1]):
        return _judge_failure(reference, run, fired, steps_before=True, policy=policy)
    if any(f.repeat for f in fired):
        return _judge_failure(reference, run, fired, steps_before=policy == "restore", policy=policy)
    return Break("failed", f"{policy} ended in {_error_words(run.lines[-1])}")


ELASTIC = ("shrink", "regrow", "pause")      # mechanism 14: a failure there ends as told, or not at all
# What says a run of ELASTIC ended as it was told to: the floor, the restarts (or one recovery's
# tries) spent, the operator (or the pause timeout's default) saying abort.
ENDED_AS_TOLD = ("below --min-world-size", "gave up after", "replacing after the first loss", "(paused; ")


def _ended_as_told(err: dict) -> bool:
    return any(words in str(err.get("message", "")) for words in ENDED_AS_TOLD)


def _judge_failure(reference: Reference, run: Run, fired: list[Fault], steps_before: bool,
                   policy: str) -> Break | None:
    err = run.lines[-1]
    words = _error_words(err)
    if steps_before:
        before = run.lines[:-1]
        diff = first_difference(comparable(reference.lines[:len(before)]), comparable(before))
        if diff is not None:
            return Break("steps-before", f"{policy}: the steps before {words} differ: {diff}")
    if err["error"] not in STEP_FAILURES:
        return Break("failure-kind", f"{policy} ended in {words}, a failure no fault makes")
    step = err.get("step")
    if step is None:
        return Break("failure-kind", f"{policy} ended in {words}, before any step")
    # at overlap the next step's plan is out while a step is awaited: a fault at it can act
    # first (a partition cuts from the plan before); under shrink, regrow or pause a recovery
    # sends that plan again, and its faults act within the recovery of the step before
    early = 1 if reference.rung == "overlap" else 0
    before = [f for f in fired
              if f.step - (early if f.kind == "partition" or policy in ELASTIC else 0) <= step]
    if not before:
        return Break("blame", f"{policy} ended in {words}, before any fault fired")
    rank, ranks = err.get("rank"), err.get("ranks") or ([err["rank"]] if err.get("rank") is not None else [])
    if rank is not None:
        blamed = [rank]
    else:
        blamed = list(ranks)
    if blamed and not any(f.rank is None or f.rank in blamed for f in before):
        touched = ", ".join(f.text for f in before)
        return Break("blame", f"{policy} ended in {words}, blaming rank {', '.join(map(str, blamed))}, "
                              f"which no fault fired on by step {step} (fired: {touched})")
    return None


def _error_words(err: dict) -> str:
    message = " ".join(str(err.get("message", "")).split())
    return f"{error_said(err, epoch=False)}: {message[:240]}"


# -- the wire log ---------------------------------------------------------------------------

def read_wire_log(path: str | Path, having: str | None = None) -> list[dict]:
    """A wire log's lines as objects (a line that is not JSON is kept as {"unreadable": text});
    with `having`, only the lines that hold that text."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if having is not None and having not in line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"unreadable": line[:200]})
    return out


def log_is_complete(path: str | Path) -> list[str]:
    """A checker: the log starts with its `run` event and ends with its `end` event (the first
    checker of harness.WIRE_LOG_CHECKERS)."""
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    problems = []
    for where, line, event in (("first", lines[:1], "run"), ("last", lines[-1:], "end")):
        try:
            ok = bool(line) and json.loads(line[0]).get("event") == event
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"the {where} line is not the {event} event")
    return problems


def judge_counters(reference: Reference, lines: list[dict]) -> Break | None:
    """restore: every committed step's counters in the wire log are the reference's."""
    logged = [(x.get("step"), x.get("counters")) for x in lines if x.get("event") == "step"]
    for (step, want), got in zip(reference.counters, logged):
        if got != (step, want):
            if got[0] != step:
                return Break("counters", f"the wire log's step events go {got[0]} where the in-process "
                                         f"run's go {step}")
            differ = next(k for k in want if want.get(k) != (got[1] or {}).get(k))
            return Break("counters", f"step {step}: counter {differ} is {(got[1] or {}).get(differ)} "
                                     f"in the wire log, {want[differ]} in process")
    if len(logged) != len(reference.counters):
        return Break("counters", f"the wire log has {len(logged)} step events, the in-process run "
                                 f"{len(reference.counters)} steps that cross")
    return None


def judge_run(reference: Reference, run: Run, faults: Sequence[str], policy: str, *,
              wire_log: str | Path | None = None,
              checkers: Iterable[Callable[[Path], list]] = (),
              left_running: Sequence[int] = (), run_dirs_left: Sequence[str] = ()) -> Break | None:
    """The whole judgement of one run, the first thing that does not hold (None: it held): its
    promise (judge_promise), the wire log's checkers and, under restore, its counters, then
    what it left behind (`left_running`: pids still running; `run_dirs_left`: run directories
    not swept; the harness finds both)."""
    found = judge_promise(reference, run, faults, policy)
    if found is not None:
        return found
    if wire_log is not None:
        path = Path(wire_log)
        for check in checkers:
            try:
                problems = list(check(path))
            except Exception as e:           # a checker that fails is a finding too
                problems = [f"{getattr(check, '__name__', 'a checker')} raised {type(e).__name__}: {e}"]
            if problems:
                return Break("wire-log", f"{getattr(check, '__name__', 'checker')}: {problems[0]}")
        if policy == "restore" and run.error is None:
            found = judge_counters(reference, read_wire_log(path, '"event": "step"'))
            if found is not None:
                return found
    if left_running:
        return Break("leftover", f"worker pid{'s' * (len(left_running) > 1)} "
                                 f"{', '.join(map(str, left_running))} still running after the run")
    if run_dirs_left:
        return Break("run-dir", f"run director{'ies' if len(run_dirs_left) > 1 else 'y'} left: "
                                f"{', '.join(run_dirs_left)}")
    return None
