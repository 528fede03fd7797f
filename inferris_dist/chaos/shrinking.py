"""Shrinking a break to a small reproducer, and writing the reproducer down.

A break is a schedule (faults, policy, rung, world size) on a workload that does not hold. The
shrinker looks for a smaller one that breaks *the same way* (a break of the same class,
verdicts.BREAK_KINDS), trying in turn, until nothing gets smaller or the budget (runs, seconds)
is spent:

1. fewer faults: delta debugging over the list (drop halves, then quarters, ... and their
   complements, keeping whatever still breaks);
2. earlier steps: every fault moved back together (faults that meet keep meeting), then each
   on its own, to step 0 if it can, else halfway, else one step;
3. lower ranks: a fault on `all` on rank 0 alone, a rank moved toward 0;
4. a smaller world size, from the smallest the faults' ranks allow;
5. a smaller workload: delta debugging over its requests, then each request's output, prompt,
   arrival, EOS and accept script, and speculation off; then the steps again.

Every candidate is a real run (`test(candidate) -> Break | None`), each one counted against the
budget; a candidate already tried is not run again.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from inferris_dist.chaos.schedules import Schedule, workload_key
from inferris_dist.chaos.verdicts import Break
from inferris_dist.engine import Workload, WorkloadError, load_workload
from inferris_dist.protocol.faults import Fault

DEFAULT_RERUNS = 5


@dataclass(frozen=True)
class Candidate:
    workload: Workload
    faults: tuple[str, ...]
    world_size: int

    def key(self) -> tuple:
        return (workload_key(self.workload), self.faults, self.world_size)

    def describe(self) -> str:
        n, r = len(self.faults), len(self.workload.requests)
        return (f"{n} fault{'s' * (n != 1)}, {r} request{'s' * (r != 1)}, world size {self.world_size}: "
                f"{' '.join(self.faults)}")


@dataclass
class Shrunk:
    original: Candidate
    minimal: Candidate
    brk: Break                 # the minimal candidate's break
    runs: int                  # runs the shrinking made
    seconds: float
    budget_spent: bool         # stopped by the budget (it may shrink further)

    def to_json(self) -> dict:
        return {"faults": list(self.minimal.faults), "world_size": self.minimal.world_size,
                "requests": len(self.minimal.workload.requests), "class": self.brk.kind,
                "reason": self.brk.reason, "runs": self.runs, "seconds": round(self.seconds, 3),
                "budget_spent": self.budget_spent,
                "from": {"faults": list(self.original.faults), "world_size": self.original.world_size,
                         "requests": len(self.original.workload.requests)}}


class _Spent(Exception):
    """The shrinking budget ran out."""


class Shrinker:
    def __init__(self, test: Callable[[Candidate], Break | None], kind: str,
                 steps_of: Callable[[Workload], int], recompute: bool, max_runs: int, max_seconds: float):
        self.test = test
        self.kind = kind
        self.steps_of = steps_of
        self.recompute = recompute
        self.max_runs = max_runs
        self.deadline = time.monotonic() + max_seconds
        self.runs = 0
        self.tried: dict[tuple, Break | None] = {}
        self.best: Candidate | None = None      # the last candidate taken (each pass takes every
                                                # candidate that breaks, as it finds it)

    def breaks(self, c: Candidate) -> bool:
        """Whether `c` breaks the same way (each new candidate is one run of the budget)."""
        if not self._valid(c):
            return False
        key = c.key()
        if key not in self.tried:
            if self.runs >= self.max_runs or time.monotonic() >= self.deadline:
                raise _Spent()
            self.runs += 1
            self.tried[key] = self.test(c)
        found = self.tried[key]
        if found is not None and found.kind == self.kind:
            self.best = c
            return True
        return False

    def _valid(self, c: Candidate) -> bool:
        if not c.faults or c.world_size < 1:
            return False
        limit = self.steps_of(c.workload) + (4 if self.recompute else 0)
        for spec in c.faults:
            try:
                fault = Fault.parse(spec, c.world_size)
            except (WorkloadError, ValueError):
                return False
            if fault.step >= max(1, limit):
                return False
        return len(set(c.faults)) == len(c.faults)

    # -- the passes ------------------------------------------------------------------------------

    def run(self, c: Candidate) -> Candidate:
        passes = (self.fewer_faults, self.earlier_steps, self.lower_ranks, self.smaller_world,
                  self.smaller_workload, self.earlier_steps)
        changed = True
        while changed:
            changed = False
            for step in passes:
                smaller = step(c)
                if smaller != c:
                    c, changed = smaller, True
        return c

    def fewer_faults(self, c: Candidate) -> Candidate:
        kept = ddmin(list(c.faults), lambda fs: self.breaks(replace(c, faults=tuple(fs))))
        return replace(c, faults=tuple(kept))

    def earlier_steps(self, c: Candidate) -> Candidate:
        parts = [Fault.parse(f) for f in c.faults]
        first = min(f.step for f in parts)
        for back in _toward_zero(first):            # all together: faults that meet keep meeting
            moved = replace(c, faults=tuple(f._replace(step=f.step - back).format() for f in parts))
            if self.breaks(moved):
                c = moved
                break
        for i in range(len(c.faults)):
            fault = Fault.parse(c.faults[i])
            for step in _lower_values(fault.step):
                moved = _with_fault(c, i, fault._replace(step=step).format())
                if self.breaks(moved):
                    c = moved
                    break
        return c

    def lower_ranks(self, c: Candidate) -> Candidate:
        for i in range(len(c.faults)):
            fault = Fault.parse(c.faults[i])
            options = [0] if fault.rank is None else _lower_values(fault.rank)
            for rank in options:
                moved = _with_fault(c, i, fault._replace(rank=rank).format())
                if self.breaks(moved):
                    c = moved
                    break
        return c

    def smaller_world(self, c: Candidate) -> Candidate:
        ranks = [f.rank for f in map(Fault.parse, c.faults) if f.rank is not None]
        for n in range(max(ranks, default=0) + 1, c.world_size):
            smaller = replace(c, world_size=n, workload=c.workload.with_config(world_size=n))
            if self.breaks(smaller):
                return smaller
        return c

    def smaller_workload(self, c: Candidate) -> Candidate:
        data = c.workload.to_dict()
        data.pop("faults", None)

        def with_requests(requests: list[dict], engine: dict | None = None) -> Candidate | None:
            try:
                w = load_workload({"engine": engine or data["engine"], "requests": requests})
            except WorkloadError:
                return None
            return self._clamped(replace(c, workload=w))

        def breaks(requests: list[dict], engine: dict | None = None) -> bool:
            cand = with_requests(requests, engine)
            return cand is not None and self.breaks(cand)

        requests = ddmin(data["requests"], breaks)
        for i in range(len(requests)):
            for key, values in _request_reductions(requests[i]):
                for value in values:
                    tried = [dict(r) for r in requests]
                    tried[i][key] = value
                    if breaks(tried):
                        requests = tried
                        break
        engine = data["engine"]
        if engine.get("spec_len"):
            plain = [{**r, "accept_script": None} for r in requests]
            if breaks(plain, {**engine, "spec_len": 0}):
                requests, engine = plain, {**engine, "spec_len": 0}
        return with_requests(requests, engine) or c

    def _clamped(self, c: Candidate) -> Candidate:
        """A smaller workload may have fewer steps: faults past its end move to its last step."""
        last = max(0, self.steps_of(c.workload) - 1)
        faults = []
        for f in c.faults:
            fault = Fault.parse(f)
            spec = fault._replace(step=min(fault.step, last)).format()
            if spec not in faults:
                faults.append(spec)
        return replace(c, faults=tuple(faults))


def _request_reductions(r: dict) -> list[tuple[str, list]]:
    out = []
    if r["max_new_tokens"] > 1:
        out.append(("max_new_tokens", [1, r["max_new_tokens"] // 2]))
    if len(r["tokens"]) > 1:
        n = len(r["tokens"])
        out.append(("tokens", [r["tokens"][:1], r["tokens"][:n // 2]]))
    if r.get("arrival_step"):
        out.append(("arrival_step", [0, r["arrival_step"] // 2]))
    if r.get("eos_after") is not None:
        out.append(("eos_after", [None]))
    if r.get("accept_script") is not None:
        out.append(("accept_script", [None]))
    return out


def ddmin(items: list, fails: Callable[[list], bool]) -> list:
    """Delta debugging's minimisation: a 1-minimal sublist of `items` (order kept) for which
    `fails` still holds, assuming it holds for `items` (never asked of the empty list)."""
    n = 2
    while len(items) >= 2:
        chunks = _chunks(items, n)
        for chunk in chunks:
            if fails(chunk):
                items, n = chunk, max(n - 1, 2)
                break
        else:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if len(chunks) > 2 and fails(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def _chunks(items: list, n: int) -> list[list]:
    size, extra = divmod(len(items), n)
    out, at = [], 0
    for i in range(n):
        step = size + (i < extra)
        if step:
            out.append(items[at:at + step])
        at += step
    return out


def _toward_zero(value: int) -> list[int]:
    """How far to move back, most first: all the way, then halves, then one."""
    out = []
    for v in (value, value // 2, 1):
        if 0 < v <= value and v not in out:
            out.append(v)
    return out


def _lower_values(value: int) -> list[int]:
    """Lower values to try, the lowest first: 0, halfway, one less."""
    return [v for v in dict.fromkeys((0, value // 2, value - 1)) if 0 <= v < value]


def _with_fault(c: Candidate, i: int, spec: str) -> Candidate:
    faults = list(c.faults)
    faults[i] = spec
    return replace(c, faults=tuple(faults))


def shrink(workload: Workload, schedule: Schedule, brk: Break, *, session=None,
           test: Callable[[Candidate], Break | None] | None = None, max_runs: int = 60,
           max_seconds: float = 60.0) -> Shrunk:
    """The smallest candidate found that breaks like `brk` (same class), within `max_runs` runs
    and `max_seconds`. Runs go through `session` (a harness.Session: real processes) or, for a
    test of the shrinker itself, through `test(candidate) -> Break | None`."""
    if test is None:
        if session is None:
            raise TypeError("shrink needs a session or a test")

        def test(c: Candidate) -> Break | None:
            return session.run(c.workload, replace(schedule, world_size=c.world_size, faults=c.faults)).brk
        steps_of = (lambda w: session.reference(w, schedule.rung).steps)
    else:
        from inferris_dist.chaos.verdicts import reference_of
        steps_of = (lambda w: reference_of(w, schedule.rung).steps)
    original = Candidate(workload.with_config(world_size=schedule.world_size), tuple(schedule.faults),
                         schedule.world_size)
    started = time.monotonic()
    shrinker = Shrinker(test, brk.kind, steps_of, schedule.policy == "recompute", max_runs, max_seconds)
    shrinker.best = original
    spent = False
    try:
        shrinker.run(original)
    except _Spent:
        spent = True                 # the best so far: the last candidate taken
    best = shrinker.best
    found = shrinker.tried.get(best.key()) or brk
    return Shrunk(original, best, found, shrinker.runs, time.monotonic() - started, spent)


# -- the reproducer -----------------------------------------------------------------------------

@dataclass
class Reproducer:
    command: str
    spec: Path
    faults: tuple[str, ...]
    policy: str
    world_size: int
    broke: int = 0
    of: int = 0
    wire_log: Path | None = None      # kept from the first re-run that broke

    def verdict(self) -> str:
        if self.of == 0:
            return "not run again"
        if self.broke == self.of:
            return f"broke {self.broke} of {self.of}"
        if self.broke == 0:
            return f"broke 0 of {self.of}: not reproduced (timing-dependent)"
        return f"broke {self.broke} of {self.of}: timing-dependent"

    def to_json(self) -> dict:
        return {"command": self.command, "spec": str(self.spec), "faults": list(self.faults),
                "policy": self.policy, "world_size": self.world_size, "broke": self.broke, "of": self.of,
                "wire_log": None if self.wire_log is None else str(self.wire_log)}


class NotWritten(Exception):
    """A reproducer's file could not be written: `path`, and the system's reason."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def unwritable(directory: Path) -> str | None:
    """Why reproducers could not be written into `directory`, or None: it is made if missing, a
    file made and removed in it, and the directories made for the probe removed again (so a
    long exploration is not run for a report whose reproducers have nowhere to go)."""
    made = []
    p = directory
    while not os.path.lexists(p) and p != p.parent:
        made.append(p)
        p = p.parent
    try:
        if os.path.lexists(directory) and not directory.is_dir():
            return "not a directory" if directory.exists() else "a symlink to nothing"
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".inferris-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
        return None
    except OSError as e:
        return e.strerror or str(e)
    finally:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass


def fresh_path(directory: Path, stem: str, suffix: str) -> Path:
    """A file of ours in `directory`, made here, under a name nothing had: `stem.suffix`, else
    `stem-2.suffix`, ... (never an existing file overwritten)."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10000):
        path = directory / f"{stem}{'' if n == 1 else f'-{n}'}{suffix}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise OSError(f"no free name for {stem}{suffix} in {directory}")


def fresh_dir(parent: Path, stem: str) -> Path:
    """A new directory `stem`, else `stem-2`, ... under `parent` (an existing one is never reused)."""
    for n in range(1, 10000):
        path = parent / f"{stem}{'' if n == 1 else f'-{n}'}"
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        return path
    raise OSError(f"no free directory name for {stem} in {parent}")


def workload_text(data: dict) -> str:
    """A workload as JSON for people: the engine on one line, then one line per request."""
    requests = ",\n  ".join(json.dumps({k: v for k, v in r.items() if v is not None})
                            for r in data["requests"])
    return f'{{"engine": {json.dumps(data["engine"])},\n "requests": [\n  {requests}\n ]}}\n'


def reproduce_command(spec: Path, faults: Sequence[str], policy: str, world_size: int, rung: str = "full",
                      max_restarts: int = 3, step_timeout: float = 10.0, worker: str | None = None,
                      pause_default: str = "abort") -> str:
    """The `inferris-dist compare` command that runs a reproducer (on `worker`, a worker
    command, when the break was found on one); under pause, the `launch` that waits for an
    operator (the schedule's moves are in the report)."""
    try:
        shown = os.path.relpath(spec) if not os.path.relpath(spec).startswith("..") else str(spec)
    except ValueError:
        shown = str(spec)
    argv = ["inferris-dist", "launch" if policy == "pause" else "compare", "--spec", shown]
    for f in faults:
        argv += ["--fault", f]
    if policy == "regrow":
        argv += ["--on-rank-loss", "shrink", "--regrow"]
    elif policy == "pause":           # an operator answers at the URL it prints (inferris-dist ft)
        argv += ["--on-rank-loss", "pause", "--serve", "127.0.0.1:0", "--pause-default", pause_default]
    else:
        argv += ["--on-rank-loss", policy]
    argv += ["--world-size", str(world_size)]
    if rung != "full":
        argv += ["--rung", rung]
    if max_restarts != 3:
        argv += ["--max-restarts", str(max_restarts)]
    if step_timeout != 10.0:
        argv += ["--step-timeout", f"{step_timeout:g}"]
    if worker is not None:
        argv += ["--worker", worker]
    return shlex.join(argv)


def write_reproducer(shrunk: Shrunk, schedule: Schedule, directory: Path, *, session=None,
                     reruns: int = DEFAULT_RERUNS, stem: str | None = None, step_timeout: float = 10.0,
                     max_restarts: int = 3) -> Reproducer:
    """Write the minimal workload into `directory` (a fresh file), make its command, and run it
    `reruns` times through `session` to say how often it breaks the same way (the wire log of the
    first re-run that does is kept beside the workload, for a checker of wire logs)."""
    c = shrunk.minimal
    data = c.workload.with_config(world_size=c.world_size).to_dict()
    data.pop("faults", None)
    spec = _written(directory / f"{stem or f'break-{schedule.index}'}.spec.json",
                    lambda: _write_fresh(directory, stem or f"break-{schedule.index}", ".spec.json",
                                         workload_text(data)))
    command = reproduce_command(spec, c.faults, schedule.policy, c.world_size, schedule.rung,
                                max_restarts, step_timeout, getattr(session, "worker", None),
                                schedule.pause_default)
    repro = Reproducer(command, spec, c.faults, schedule.policy, c.world_size)
    if session is not None:
        s = replace(schedule, world_size=c.world_size, faults=c.faults)
        for _ in range(reruns):
            repro.of += 1
            outcome = session.run(c.workload, s)
            same = outcome.brk is not None and outcome.brk.kind == shrunk.brk.kind
            repro.broke += same
            if same and repro.wire_log is None and outcome.wire_log is not None:
                stem_of = spec.name.removesuffix(".spec.json")
                repro.wire_log = _written(directory / f"{stem_of}.wire.jsonl", lambda: _copy_fresh(
                    directory, stem_of, ".wire.jsonl", outcome.wire_log))
    return repro


def _written(shown: Path, write: Callable[[], Path]) -> Path:
    """`write()`'s path; its OSError as NotWritten (`shown`: the file it was to be)."""
    try:
        return write()
    except OSError as e:
        raise NotWritten(shown, e.strerror or str(e)) from None


def _write_fresh(directory: Path, stem: str, suffix: str, text: str) -> Path:
    path = fresh_path(directory, stem, suffix)
    path.write_text(text)
    return path


def _copy_fresh(directory: Path, stem: str, suffix: str, source: Path) -> Path:
    path = fresh_path(directory, stem, suffix)
    shutil.copyfile(source, path)
    return path
