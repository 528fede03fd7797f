"""The numbers a serving engineer reads first: per-step counters, per-request timings in
steps, run totals, and for `launch` the measured times (`--metrics FILE`).

Light on purpose: the engine and the standard library only (no zmq, no msgpack), so that
`inferris-dist run` pays nothing for it.

`step_counters(engine, trace)` is a pure function of the engine's state right after a step
and of that step's trace (an idle step's too). Every value is an int:

    requests_running    requests in flight that ran in this step and did not finish in it
                        (its executed requests less its finished ones)
    requests_waiting    requests in flight (arrived, not finished: the engine's RUNNING
                        state) that did not run in this step: the budget did not reach them,
                        they were preempted, or their turn has not come. The engine admits a
                        request the step it arrives, so "arrived but not in the batch" is the
                        only waiting there is. running + waiting = requests in flight.
    requests_preempted  preemptions in this step: len(trace.preempted) (a request preempted
                        twice in one step, as a recompute recovery can do, counts twice)
    pages_used          pages mapped by some request's page table: its own pages and the
                        cache pages it shares (a shared page counts once)
    pages_cached        pages the prefix cache owns that no request maps: reusable content,
                        reclaimed by eviction when the pool runs short
    pages_free          pages on the pool's free list
                        (used + cached + free = num_pages at paged rungs; at rungs 00 to 02
                        nothing is paged and all three are 0)
    prefix_hit_tokens   prompt tokens served from the cache in this step (sum of trace.reused)
    drafted_tokens      draft tokens verified in this step (sum of trace.drafted)
    accepted_tokens     of those, the accepted ones (sum of trace.accepted)
    batch_tokens        tokens the batch computed, drafts included (sum of trace.executed)
    batch_requests      requests whose tokens ran (len(trace.executed)). Not
                        len(trace.scheduled): `scheduled` is the batch as phase 4 chose it, and
                        phase 5 may preempt requests out of it before anything runs.

Cost: O(the step's trace) plus O(pages the cache holds) for `pages_cached`. The pool keeps
its free count but no count of unmapped cache pages, so that one is counted at each call
over the cache's pages (`refs` read in C, no Python loop): bounded by num_pages, never by
the length of the run.

`Metrics(engine)` is fed every trace (`.step(trace, wall_s)`) and keeps:

- run totals, for the summary lines after a human run's closing line and for `run` in the
  document: steps, busy steps (a batch ran), prompt tokens and prefix hits, drafts and
  accepts, batch tokens and requests, preemptions, requests finished;
- per request: the step its first token was sampled (a sample of EOS counts: it is the
  request's first output), the step and reason it finished, its preemptions, the prompt
  tokens it reused, its drafted and accepted tokens;
- with `keep_steps` (the default; `--metrics` asks for it), the steps' counters.

Steps are stored as columns, and an idle stretch is one row. `document()["steps"]` is a
dict of equal-length lists: `step` (the row's first step), `span` (how many steps the row
stands for), then one list per counter (and `wall_s` for launch). A busy step is a row of
span 1. An idle step (nothing runs, nothing arrives: `Engine.is_idle`) changes nothing but
the step number, so the idle steps in a row share the counters of the stretch's first
step and fold into one row: a request arriving at step 1,000,000 costs one row, not a
million. `span` sums to `run.steps`. `wall_s` of a folded row is the sum over its steps.

The document (version 1):

    {"version": 1, "workload": NAME, "rung": "full", "config": {engine knobs},
     "run": {run totals}, "steps": {columns}, "requests": [one object per request],
     "ranks": null | [{"rank", "rtt_p50_ms", "rtt_p99_ms", "steps", ...}],
     "error": {the SPEC §4 error object}}          # only when the run failed

Everything but `steps.wall_s` and `ranks` is deterministic: the same workload and rung give
the same numbers in process (`run`) and on worker processes (`launch`). `wall_s` is the
scheduler's time to produce the step (plan, round trips, join, commit; an audit between
steps falls into the next step's time); `ranks` come from the process group's totals.

Run-level definitions:

    prompt_tokens       prompt tokens the engine had to provide: each request's prompt
                        length, counted once when it is admitted and once more each time it
                        is preempted (it starts again from nothing and looks its prompt up in
                        the cache again). Without preemption: the sum of the prompt lengths.
    prefix_hit_rate     prefix_hit_tokens / prompt_tokens, in 0..1; null at rungs without
                        prefix reuse (before 08b) or with no prompt tokens
    acceptance_rate     accepted_tokens / drafted_tokens; null when nothing was drafted
    discarded_tokens    overlap scheduling: tokens of items that executed but did not commit
                        (sum of trace.discarded); null at rungs without overlap
    returned_tokens     overlap scheduling: placeholders given back (sum of trace.returned);
                        null at rungs without overlap
    mean_batch_tokens   batch_tokens / busy_steps, where a busy step is one in which a batch
    mean_batch_requests ran (idle steps, and steps whose batch was all preempted, are not
                        averaged in); null when no step ran a batch
"""
from __future__ import annotations

import json
import sys
import time
from typing import Iterable, Iterator

from inferris_dist.engine import EngineError, MachineFailure, WorkloadError

VERSION = 1

COUNTERS = ("requests_running", "requests_waiting", "requests_preempted", "pages_used",
            "pages_cached", "pages_free", "prefix_hit_tokens", "drafted_tokens", "accepted_tokens",
            "batch_tokens", "batch_requests")


def step_counters(engine, trace) -> dict[str, int]:
    """The counters right after `trace`'s step (see the module's docstring for each)."""
    executed = trace.executed
    running = len(executed) - len(trace.finished)     # whoever finished ran in this step
    if engine.rung.paged:
        pool = engine.pool
        free = pool.num_free
        cached = unmapped_cache_pages(engine)
        used = pool.num_pages - free - cached
    else:
        used = cached = free = 0
    return {
        "requests_running": running,
        "requests_waiting": len(engine.scheduler.running) - running,
        "requests_preempted": len(trace.preempted),
        "pages_used": used,
        "pages_cached": cached,
        "pages_free": free,
        "prefix_hit_tokens": sum(trace.reused.values()),
        "drafted_tokens": sum(trace.drafted.values()),
        "accepted_tokens": sum(trace.accepted.values()),
        "batch_tokens": sum(executed.values()),
        "batch_requests": len(executed),
    }


def unmapped_cache_pages(engine) -> int:
    """Cache pages no page table maps (refs 0): O(pages the cache holds)."""
    pages = engine.cache.node_of_page
    if not pages:
        return 0
    return list(map(engine.pool.refs.__getitem__, pages)).count(0)


def timed(traces: Iterable) -> Iterator[tuple]:
    """(trace, seconds the engine took to produce it): the time spent inside the engine's
    iterator, not in whatever the caller does with each step."""
    it = iter(traces)
    clock = time.monotonic
    while True:
        start = clock()
        try:
            trace = next(it)
        except StopIteration:
            return
        yield trace, clock() - start


def error_object(exc: BaseException, step: int | None) -> dict:
    """The document's `error` member for whatever ended the run."""
    if isinstance(exc, EngineError):
        return exc.to_json()
    kind = "Interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
    return {"error": kind, "message": str(exc) or kind.lower(), "step": step}


class Metrics:
    def __init__(self, engine, name: str | None = None, keep_steps: bool = True):
        self.engine = engine
        self.name = name
        self.keep_steps = keep_steps
        self._columns: dict[str, list] = {"step": [], "span": [], **{c: [] for c in COUNTERS}}
        self._wall: list = []              # per row: seconds, or None for a step not timed
        self._idle_row = False             # the last row is an idle stretch that may grow
        self.steps = 0
        self.busy_steps = 0
        self.prompt_tokens = 0
        self.prefix_hit_tokens = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.batch_tokens = 0
        self.batch_requests = 0
        self.preemptions = 0
        self.discarded_tokens = 0
        self.returned_tokens = 0
        # per request id (only the requests something happened to)
        self._first_token: dict[str, int] = {}
        self._finished: dict[str, tuple[int, str]] = {}
        self._preempted: dict[str, int] = {}
        self._reused: dict[str, int] = {}
        self._drafted: dict[str, int] = {}
        self._accepted: dict[str, int] = {}

    # -- recording -----------------------------------------------------------------------

    def step(self, trace, wall_s: float | None = None) -> None:
        """Record one step, right after its trace was produced (idle steps too)."""
        self.steps += 1
        if trace.is_empty and not self.engine.scheduler.running:     # idle: nothing changed
            if self.keep_steps:
                self._idle(trace, wall_s)
            return
        by_id = self.engine.by_id
        for rid in trace.admitted:
            self.prompt_tokens += by_id[rid].prompt
        preempted = self._preempted
        for rid in trace.preempted:
            self.prompt_tokens += by_id[rid].prompt
            preempted[rid] = preempted.get(rid, 0) + 1
        self.preemptions += len(trace.preempted)
        _add_into(self._reused, trace.reused)
        _add_into(self._drafted, trace.drafted)
        _add_into(self._accepted, trace.accepted)
        hits = sum(trace.reused.values())
        self.prefix_hit_tokens += hits
        self.drafted_tokens += sum(trace.drafted.values())
        self.accepted_tokens += sum(trace.accepted.values())
        if trace.discarded or trace.returned:
            self.discarded_tokens += sum(trace.discarded.values())
            self.returned_tokens += sum(trace.returned.values())
        if trace.executed:
            self.busy_steps += 1
            self.batch_tokens += sum(trace.executed.values())
            self.batch_requests += len(trace.executed)
        first = self._first_token
        for rid in trace.sampled:
            if rid not in first:
                first[rid] = trace.step
        for rid, why in trace.finished.items():
            self._finished[rid] = (trace.step, why)
        if self.keep_steps:
            self._row(trace, wall_s)
            self._idle_row = False

    def _row(self, trace, wall_s: float | None) -> None:
        columns = self._columns
        columns["step"].append(trace.step)
        columns["span"].append(1)
        for key, value in step_counters(self.engine, trace).items():
            columns[key].append(value)
        self._wall.append(wall_s)

    def _idle(self, trace, wall_s: float | None) -> None:
        columns = self._columns
        if self._idle_row and columns["step"][-1] + columns["span"][-1] == trace.step:
            columns["span"][-1] += 1
            if wall_s is not None:
                self._wall[-1] = (self._wall[-1] or 0.0) + wall_s
            return
        self._row(trace, wall_s)
        self._idle_row = True

    # -- reading -------------------------------------------------------------------------

    @property
    def requests_finished(self) -> int:
        return len(self._finished)

    def run_totals(self) -> dict:
        """The run-level numbers (deterministic)."""
        busy = self.busy_steps
        engine = self.engine
        used = self._columns["pages_used"]
        return {
            "steps": self.steps,
            "busy_steps": busy,
            "requests": len(engine.requests),
            "requests_finished": self.requests_finished,
            "generated_tokens": sum(r.generated for r in engine.requests),
            "prompt_tokens": self.prompt_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "prefix_hit_rate": (_ratio(self.prefix_hit_tokens, self.prompt_tokens)
                                if engine.rung.reuse else None),
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": _ratio(self.accepted_tokens, self.drafted_tokens),
            "batch_tokens": self.batch_tokens,
            "batch_requests": self.batch_requests,
            "mean_batch_tokens": _ratio(self.batch_tokens, busy),
            "mean_batch_requests": _ratio(self.batch_requests, busy),
            "preemptions": self.preemptions,
            "requests_preempted": len(self._preempted),
            "peak_pages_used": max(used) if used else None,
            "discarded_tokens": self.discarded_tokens if engine.rung.overlap else None,
            "returned_tokens": self.returned_tokens if engine.rung.overlap else None,
        }

    def request_rows(self) -> list[dict]:
        rows = []
        for req in self.engine.requests:
            rid = req.request_id
            finish_step, why = self._finished.get(rid, (None, None))
            drafted, accepted = self._drafted.get(rid, 0), self._accepted.get(rid, 0)
            rows.append({
                "request_id": rid,
                "prompt_tokens": req.prompt,
                "arrival_step": req.arrival_step,
                "first_token_step": self._first_token.get(rid),
                "finish_step": finish_step,
                "finish_reason": why,
                "state": str(req.state),
                "generated": req.generated,
                "preemptions": self._preempted.get(rid, 0),
                "reused_tokens": self._reused.get(rid, 0),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance_rate": _ratio(accepted, drafted),
            })
        return rows

    def step_columns(self) -> dict[str, list]:
        columns = {key: list(values) for key, values in self._columns.items()}
        if any(w is not None for w in self._wall):
            columns["wall_s"] = [None if w is None else round(w, 6) for w in self._wall]
        return columns

    def document(self, ranks=None, error: dict | None = None, arrivals: dict | None = None) -> dict:
        """The `--metrics` document. `ranks`: the process group's totals ({rank: RankTotals})
        for launch, None for a run in process; `arrivals`: launch's arrivals at the joins
        (observe/arrivals.py, `to_json`); `error`: the error object of a failed run."""
        engine = self.engine
        doc = {
            "version": VERSION,
            "workload": self.name,
            "rung": engine.rung.name,
            "config": engine.config._asdict(),
            "run": self.run_totals(),
            "steps": self.step_columns(),
            "requests": self.request_rows(),
            "ranks": None if ranks is None else rank_rows(ranks),
            "arrivals": arrivals,
        }
        if error is not None:
            doc["error"] = error
        return doc

    def summary_lines(self) -> list[str]:
        """The lines after a human run's closing line; only those that have something to say."""
        lines = []
        if self.prefix_hit_tokens:
            lines.append(f"prefix hit rate {_percent(self.prefix_hit_tokens, self.prompt_tokens)} "
                         f"({self.prefix_hit_tokens:,} of {self.prompt_tokens:,} prompt tokens)")
        if self.drafted_tokens:
            lines.append(f"acceptance {self.accepted_tokens:,}/{self.drafted_tokens:,} drafted tokens "
                         f"({_percent(self.accepted_tokens, self.drafted_tokens)})")
        if self.busy_steps:
            busy = self.busy_steps
            over = (f" over the {busy:,} step{'s' * (busy != 1)} that ran a batch"
                    if busy != self.steps else "")
            lines.append(f"mean batch {self.batch_tokens / busy:,.1f} tokens, "
                         f"{self.batch_requests / busy:,.1f} requests{over}")
        if self.preemptions:
            n, who = self.preemptions, len(self._preempted)
            times = "once" if n == 1 else f"{n:,} times"
            requests = "" if n == 1 else f" ({who:,} request{'s' * (who != 1)})"
            lines.append(f"preempted {times}{requests}")
        if self.engine.rung.overlap:
            lines.append(f"planned ahead: {self.returned_tokens:,} placeholder tokens returned, "
                         f"{self.discarded_tokens:,} tokens of work discarded (an EOS not foreseen)")
        return lines


def rank_rows(totals) -> list[dict]:
    """Per rank, from the process group's totals: round trips and steps (measured)."""
    return [{"rank": rank,
             "rtt_p50_ms": _ms(t.percentile(0.5)),
             "rtt_p99_ms": _ms(t.percentile(0.99)),
             "steps": t.steps,
             "bytes_sent": t.bytes_sent,
             "bytes_received": t.bytes_received,
             "dropped": t.dropped}
            for rank, t in sorted(totals.items())]


def empty_document(name: str | None, error: dict | None) -> dict:
    """The document of a run that never got an engine (its workers did not start)."""
    doc = {"version": VERSION, "workload": name, "rung": None, "config": None, "run": None,
           "steps": None, "requests": None, "ranks": None}
    if error is not None:
        doc["error"] = error
    return doc


class MetricsNotWritten(MachineFailure):
    """The machine refused the --metrics file at the end (a full disk)."""


class MetricsFile:
    """`--metrics FILE`: opened before the run (a path that cannot be written is bad input,
    exit 2), written once at the end, even when the run failed."""

    def __init__(self, path: str, flag: str = "--metrics"):
        self.path = path
        self.flag = flag
        try:
            self.stream = open(path, "w")
        except OSError as e:
            raise WorkloadError(f"{flag} {path}: {e.strerror or e}") from None

    def write(self, document: dict) -> None:
        """Write and close; a refusal raises MetricsNotWritten naming the flag and the file
        (its step: the last step the document records, after which it was written)."""
        try:
            self.stream.write(json.dumps(document) + "\n")
            self.stream.close()
        except OSError as e:
            self.close()
            raise MetricsNotWritten(f"{self.flag} {self.path}: {e.strerror or e}",
                                    last_step(document)) from None

    def close(self) -> None:
        try:
            self.stream.close()
        except OSError:
            pass


def last_step(document: dict) -> int | None:
    """The last step a document records (None: no step ran)."""
    steps = document.get("steps")
    if not steps or not steps["step"]:
        return None
    return steps["step"][-1] + steps["span"][-1] - 1


def write_quietly(file: MetricsFile, document: dict) -> None:
    """While another failure is on its way out: write what there is, never hide that failure."""
    try:
        file.write(document)
    except MetricsNotWritten as e:
        sys.stderr.write(f"inferris-dist: {e.message}\n")


def _add_into(totals: dict[str, int], values: dict[str, int]) -> None:
    for key, value in values.items():
        totals[key] = totals.get(key, 0) + value


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
