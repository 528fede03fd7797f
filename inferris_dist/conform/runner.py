"""Running the cases: each in a directory of its own under the kept directory (its wire log,
the worker's output), timed, graded; a worker that never connects is told once, and every
case after fails with the same line instead of waiting out the start timeout again."""
from __future__ import annotations

import fnmatch
import shlex
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from inferris_dist.conform.cases import FAIL, PASS, SKIPPED, Case, Kit, NoGolden, Outcome
from inferris_dist.conform.scripted import NeverConnected, ScriptError, live

JOBS = 2          # scripted cases at once, beside the real scheduler's one at a time


class Result(NamedTuple):
    case: Case
    grade: str
    seconds: float
    detail: str
    wire_log: Path | None         # where the run's wire log is (a failing case's, kept)
    reproduce: str                # one command that runs this case again

    @property
    def failed(self) -> bool:
        return self.grade == FAIL and self.case.required


def selected(case: Case, full: bool, profiles: Sequence[str], patterns: Sequence[str]) -> str | None:
    """None when the case runs; else why it is skipped."""
    if patterns:
        return None if any(fnmatch.fnmatchcase(case.id, p) for p in patterns) else "not named by --case"
    if case.tier == "full" and not full:
        return "with --full"
    if case.tier not in ("default", "full") and case.tier not in profiles:
        return f"with --profile {case.tier}"
    return None


def reproducer(kit: Kit, case: Case, keep: Path, own_worker: bool) -> str:
    worker = "" if own_worker else f" --worker {shlex.quote(kit.command)}"
    return f"inferris-dist conform{worker} --case {case.id} --keep {shlex.quote(str(keep / 'again'))}"


def run_cases(kit: Kit, cases: Sequence[Case], keep: Path, *, full: bool = False,
              profiles: Sequence[str] = (), patterns: Sequence[str] = (), own_worker: bool = True,
              told: Callable[[Result], None] | None = None, jobs: int = JOBS) -> list[Result]:
    """Every case graded, told in order (`told` hears each as soon as it and those before it
    are done). The first case runs alone: a worker that never connects is told once, and the
    cases after fail with that line. Then the scripted scheduler's cases run on `jobs` threads
    while this thread runs the real scheduler's (which handles signals, so it is the main one)."""
    state = _State(kit, keep, own_worker)
    chosen = [(case, selected(case, full, profiles, patterns)) for case in cases]
    results: list[Result | None] = [None] * len(chosen)
    shown = 0

    def tell() -> None:
        nonlocal shown
        while shown < len(results) and results[shown] is not None:
            if told is not None:
                told(results[shown])
            shown += 1

    order = [i for i, (_, why) in enumerate(chosen) if why is None]
    for i, (case, why) in enumerate(chosen):
        if why is not None:
            results[i] = Result(case, SKIPPED, 0.0, f"runs {why}", None, state.again(case))
    if order:
        first = order.pop(0)
        results[first] = state.run(chosen[first][0])
        tell()
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="conform") if jobs > 0 else None
    futures = {}
    try:
        for i in order:
            if chosen[i][0].scripted and pool is not None:
                futures[i] = pool.submit(state.run, chosen[i][0])
        pooled = set(futures)                 # run by the pool: never again here, taken or not
        for i in order:
            if i not in pooled:
                results[i] = state.run(chosen[i][0])
            for j, f in list(futures.items()):
                if f.done():
                    results[j] = f.result()
                    del futures[j]
            tell()
        for j, f in futures.items():
            results[j] = f.result()
        tell()
    except BaseException:
        state.stopping = True
        for f in futures.values():
            f.cancel()
        state.kill_all()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return results


class _State:
    """What the cases of one run share: the kit, where they keep things, whether the worker
    ever connected, and the scripted schedulers running now (killed on Ctrl-C)."""

    def __init__(self, kit: Kit, keep: Path, own_worker: bool):
        self.kit = kit
        self.keep = keep
        self.own_worker = own_worker
        self.never: str | None = None
        self.stopping = False
        self.lock = threading.Lock()

    def again(self, case: Case) -> str:
        return reproducer(self.kit, case, self.keep, self.own_worker)

    def kill_all(self) -> None:
        for s in list(live):
            for proc in list(s.procs):
                proc.signal(signal.SIGKILL)

    def run(self, case: Case) -> Result:
        if self.never is not None or self.stopping:
            return Result(case, FAIL, 0.0, f"not run: {self.never or 'interrupted'}", None, self.again(case))
        where = self.keep / case.id
        where.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            outcome = case.run(self.kit, where)
        except NeverConnected as e:
            self.never = f"the worker never connected within --start-timeout {self.kit.start_timeout:g} s"
            outcome = Outcome(FAIL, f"{self.never}: {e}")
        except ScriptError as e:
            outcome = Outcome(FAIL, str(e))
        except NoGolden as e:
            outcome = Outcome(SKIPPED, str(e))
        except Exception as e:      # a case that cannot go on says why, in one line
            outcome = Outcome(FAIL, f"{type(e).__name__}: {e}")
        log = where / "wire.jsonl"
        return Result(case, outcome.grade, time.monotonic() - started, outcome.detail,
                      log if log.exists() else None, self.again(case))


def summary(results: Sequence[Result]) -> str:
    counts = {g: 0 for g in ("passed", "failed", "non-strict", "informational", "skipped")}
    word = {"PASS": "passed", "FAIL": "failed", "NON-STRICT": "non-strict", "INFORMATIONAL": "informational",
            "SKIPPED": "skipped"}
    for r in results:
        counts[word[r.grade]] += 1
    optional = sum(1 for r in results if r.grade == FAIL and not r.case.required)
    text = ", ".join(f"{n} {w}" for w, n in counts.items())
    if optional:
        text += f" ({optional} of the failures in optional cases)"
    return text


def exit_status(results: Sequence[Result]) -> int:
    """1 when a required case failed, or when every case was skipped (a run that tried nothing,
    for want of the golden workloads, says nothing of the worker)."""
    return 1 if any(r.failed for r in results) or all(r.grade == SKIPPED for r in results) else 0


__all__ = ["PASS", "Result", "exit_status", "run_cases", "summary"]
