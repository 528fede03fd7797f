"""`inferris-dist whatif WIRELOG --without RANK [--json]`: what a run would have cost its
requests had one rank been no slower than the others.

The recorded timeline is replayed with RANK's execute time at each step made no longer than
the median of the other ranks' at that step; the trace stays as it was (the engine is
deterministic: only time moves). The model, step by step, from the wire log alone:

- Step k's joined attempt (the last `attempt` event of step k with verdict "joined" before its
  `step` event) says, per rank, `after` (seconds from the plan's send to its result) and
  `exec` (the rank's own execute seconds; `after` stands in where a rank said none).
  J_k = the largest `after`. RANK's result would have come its excess over the others sooner:
  after'_R = after_R - max(0, exec_R - median of the others' exec), the others unchanged;
  J'_k = the largest after', and the saving d_k = J_k - J'_k (0 where RANK was not last; never
  below 0: a rank as fast as the others is not made slower). A step whose attempt holds no
  arrivals, or none of RANK's, or RANK's alone, saves nothing.
- end_k = the `t` of step k's `step` event; without RANK's slowness, end'_k = end_k minus the
  savings of every committed step up to k. The run starts at the `t` of the run event; its
  time is the last step's end minus that.
- A request's TTFT: the end of the first step that sampled it, minus the start of the step
  that admitted it (the end of the committed step before, or the run's start). Its
  inter-token latencies: the differences of the ends of consecutive steps that sampled it.
- pN of n values: the value at index min(n-1, floor(N/100 * n)) of them sorted (nearest rank,
  as the launch summary's percentiles are).
Idle steps have no step event and take no time; failed attempts, restarts and the waits
between steps stay as they were.

--json: one object, nothing else printed:
  {"without": RANK,
   "steps": N,             committed steps
   "steps_last": N,        of those, the steps whose joined attempt RANK's result came last to
                           (by arrival: the largest "behind"; two ranks or more)
   "saved_ms": MS,         the savings summed: the run's time with minus without
   "with": TIMES, "without_rank": TIMES,
   "requests": [{"request_id": ID, "arrival_step": S or null, "admitted_step": S or null,
                 "tokens": N, "ttft_ms": MS or null, "ttft_without_ms": MS or null}, ...]}
  TIMES: {"run_ms": MS, "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms": MS or null}
  (null: no value to take it of). "requests": every request of the workload (the run event's;
  else those the steps name), the largest drop of TTFT first, then in the workload's order;
  "arrival_step": the workload's (null: the log holds no workload), "admitted_step": the step
  that admitted it (null: none did), "tokens": the steps that sampled it, TTFT null when none
  did. Milliseconds are rounded to the microsecond (3 decimals).

The log is read by the wire log reader (wirelog/logread), strict, within its bounds (a line
at most 16 MB, 1 GiB read in all); every field used is checked. Bad input is one line and
exit status 2: a file that is no wire log (no run event first), a log without arrivals (one
written before attempts recorded them), a world of one rank, RANK not a rank of the run.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from statistics import median
from typing import Any, TextIO

from inferris_dist.cli.args import EXIT_OK, int_arg
from inferris_dist.cli.flags import described
from inferris_dist.cli.render import Style, shown
from inferris_dist.engine import WorkloadError
from inferris_dist.protocol.placement import MAX_WORLD_SIZE

HELP = __doc__[__doc__.index("The recorded timeline"):__doc__.index("The log is read")]   # --help's end
TOP = 5                    # requests shown whose TTFT dropped the most
MAX_INT = (1 << 63) - 1


def add_arguments(p) -> None:
    described(p, epilog=HELP)
    p.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    p.add_argument("--without", type=int_arg, metavar="RANK", required=True,
                   help="the rank whose slowness is taken away: its execute time at each step no "
                        "longer than the median of the others'")
    p.add_argument("--json", action="store_true", help="one JSON object (its shape below)")


def main(args) -> int:
    return run_whatif(args.wirelog, args.without, sys.stdout, Style.for_stream(sys.stdout), args.json)


def run_whatif(path: str, rank: int, out: TextIO, style: Style, as_json: bool = False) -> int:
    replay = read(path, rank)
    report = replay.report()
    if as_json:
        out.write(json.dumps(report) + "\n")
    else:
        out.write("".join(line + "\n" for line in said(report, style)))
    return EXIT_OK


# -- the model ------------------------------------------------------------------------------

def saving(arrivals: list[dict], rank: int) -> float:
    """d_k: how much sooner step k's last result would have come, RANK's execute time made no
    longer than the median of the others' (seconds, >= 0)."""
    mine = next((a for a in arrivals if a["rank"] == rank), None)
    others = [a for a in arrivals if a["rank"] != rank]
    if mine is None or not others:
        return 0.0
    took = [a.get("exec", a["after"]) for a in others]
    excess = max(0.0, mine.get("exec", mine["after"]) - median(took))
    joined = max(a["after"] for a in arrivals)
    without = max([mine["after"] - excess] + [a["after"] for a in others])
    return max(0.0, joined - without)


def came_last(arrivals: list[dict], rank: int) -> bool:
    if len(arrivals) < 2:
        return False
    last = max(arrivals, key=lambda a: (a["behind"], a["after"]))
    return last["rank"] == rank


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: the value at index min(n-1, floor(q*n)) of the values sorted."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Request:
    request_id: str
    arrival_step: int | None = None
    admitted_step: int | None = None
    start: tuple[float, float] | None = None      # its admission step's start: with, without
    first: tuple[float, float] | None = None      # the end of the step of its first token
    last: tuple[float, float] | None = None       # the end of the step of its latest token
    tokens: int = 0

    def ttft(self, i: int) -> float | None:
        if self.first is None or self.start is None:
            return None
        return self.first[i] - self.start[i]


@dataclass
class Replay:
    """The log, replayed step by step as it is read: the ends of the steps with and without
    RANK's slowness, and each request's times."""
    rank: int
    start: float = 0.0
    world_size: int = 0
    ranks: set = field(default_factory=set)        # every rank that ever arrived at a join
    widest: int = 0                                # the most ranks at one join
    arrivals_seen: int = 0                         # joined attempts with arrivals
    steps: int = 0
    steps_last: int = 0
    saved: float = 0.0                             # seconds, the savings so far
    end: tuple[float, float] | None = None         # the last committed step's end: with, without
    requests: dict = field(default_factory=dict)   # request id -> Request, in the workload's order
    workload: bool = False                         # the log held the workload
    itl: tuple = field(default_factory=lambda: ([], []))    # inter-token latencies: with, without
    joined: dict = field(default_factory=dict)     # step -> its last joined attempt's arrivals

    def run_event(self, t: float, world_size: int, requests: list | None) -> None:
        self.start, self.world_size = t, world_size
        if requests is not None:
            self.workload = True
            for r in requests:
                self.requests.setdefault(r["request_id"], Request(r["request_id"], r.get("arrival_step", 0)))

    def attempt(self, step: int, arrivals: list[dict]) -> None:
        self.arrivals_seen += 1
        self.joined[step] = arrivals
        self.ranks.update(a["rank"] for a in arrivals)
        self.widest = max(self.widest, len(arrivals))

    def step(self, step: int, t: float, admitted: list[str], sampled: list[str]) -> None:
        arrivals = self.joined.pop(step, None) or []
        self.steps += 1
        self.steps_last += came_last(arrivals, self.rank)
        self.saved += saving(arrivals, self.rank)
        before = self.end if self.end is not None else (self.start, self.start)
        self.end = end = (t, t - self.saved)
        for rid in admitted:
            r = self.requests.setdefault(rid, Request(rid))
            if r.admitted_step is None:
                r.admitted_step, r.start = step, before
        for rid in sampled:
            r = self.requests.setdefault(rid, Request(rid))
            if r.first is None:
                r.first = end
            else:
                self.itl[0].append(end[0] - r.last[0])
                self.itl[1].append(end[1] - r.last[1])
            r.last = end
            r.tokens += 1

    def times(self, i: int) -> dict:
        ttft = [t for t in (r.ttft(i) for r in self.requests.values()) if t is not None]
        end = self.end[i] if self.end is not None else self.start
        return {"run_ms": ms(end - self.start),
                "ttft_p50_ms": ms(percentile(ttft, 0.5)), "ttft_p99_ms": ms(percentile(ttft, 0.99)),
                "itl_p50_ms": ms(percentile(self.itl[i], 0.5)),
                "itl_p99_ms": ms(percentile(self.itl[i], 0.99))}

    def report(self) -> dict:
        order = {rid: i for i, rid in enumerate(self.requests)}

        def drop(r: Request) -> tuple:
            with_, without = r.ttft(0), r.ttft(1)
            return (0, -(with_ - without), order[r.request_id]) if with_ is not None \
                else (1, 0.0, order[r.request_id])
        requests = [{"request_id": r.request_id,
                     "arrival_step": r.arrival_step if self.workload else None,
                     "admitted_step": r.admitted_step, "tokens": r.tokens,
                     "ttft_ms": ms(r.ttft(0)), "ttft_without_ms": ms(r.ttft(1))}
                    for r in sorted(self.requests.values(), key=drop)]
        return {"without": self.rank, "steps": self.steps, "steps_last": self.steps_last,
                "saved_ms": ms(self.saved), "with": self.times(0), "without_rank": self.times(1),
                "requests": requests}


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


# -- reading: the wire log reader, strict; every field used checked ------------------------

def read(path: str, rank: int) -> Replay:
    from inferris_dist.wirelog.logread import LogReader, Malformed
    reader = LogReader(path, strict=True, command="whatif")    # its line and byte bounds
    name = reader.name
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise WorkloadError(f"--without {rank}: not a rank (0..{MAX_WORLD_SIZE - 1})")
    replay = Replay(rank)
    first = True
    try:
        for obj in reader:
            kind = obj.get("event")
            try:
                if first:
                    if kind != "run":
                        raise WorkloadError(f"{name}: not a wire log (its first record is no run event)")
                    replay.run_event(*_run(obj))
                    first = False
                elif kind == "attempt":
                    step, arrivals = _attempt(obj)
                    if arrivals is not None:
                        replay.attempt(step, arrivals)
                elif kind == "step":
                    replay.step(*_step(obj))
            except Malformed as e:
                raise reader.refused(str(e)) from None
    except WorkloadError as e:          # a first line that is no record: no wire log at all
        where = f"{name} line 1: "
        if first and reader.line <= 1 and str(e).startswith(where):
            raise WorkloadError(f"{name}: not a wire log (line 1: {str(e)[len(where):]})") from None
        raise
    if first:
        raise WorkloadError(f"{name}: not a wire log (no run event in it)")
    if replay.world_size == 1 and replay.widest <= 1:
        raise WorkloadError(f"{name}: a world of one rank: no other ranks to take the median of")
    if not replay.arrivals_seen:
        raise WorkloadError(f"{name}: no arrivals in the log (written before joined attempts recorded "
                            f"them): nothing to replay")
    ranks = replay.ranks | set(range(replay.world_size))
    if rank not in ranks:
        raise WorkloadError(f"--without {rank}: not a rank of the run in {name} (its ranks: "
                            f"{min(ranks)}-{max(ranks)})")
    return replay


def _malformed(why: str) -> Exception:
    from inferris_dist.wirelog.logread import Malformed
    return Malformed(why)


def _int(v: Any, low: int = -MAX_INT, high: int = MAX_INT) -> bool:
    return type(v) is int and low <= v <= high


def _seconds(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and abs(v) <= MAX_INT


def _need(obj: dict, key: str, ok, must: str, what: str) -> Any:
    if key not in obj:
        raise _malformed(f"{what}: no {key}")
    if not ok(obj[key]):
        raise _malformed(f"{what}: {key} must be {must}")
    return obj[key]


def _run(obj: dict) -> tuple:
    t = _need(obj, "t", _seconds, "a number of seconds", "run event")
    world = _need(obj, "world_size", lambda v: _int(v, 1, MAX_WORLD_SIZE),
                  f"a whole number, 1..{MAX_WORLD_SIZE}", "run event")
    workload = obj.get("workload")
    if workload is None:
        return t, world, None
    requests = workload.get("requests") if isinstance(workload, dict) else None
    if not isinstance(requests, list):
        raise _malformed("run event: workload must be an object with a list of requests")
    for i, r in enumerate(requests):
        what = f"run event: workload request {i}"
        if not isinstance(r, dict):
            raise _malformed(f"{what} must be an object")
        _need(r, "request_id", lambda v: isinstance(v, str), "a string", what)
        if "arrival_step" in r:
            _need(r, "arrival_step", lambda v: _int(v, 0), "a whole number >= 0", what)
    return t, world, requests


def _attempt(obj: dict) -> tuple[int, list[dict] | None]:
    """(step, the arrivals of a joined attempt that has them, else None)."""
    step = _need(obj, "step", _int, "a whole number", "attempt event")
    verdict = _need(obj, "verdict", lambda v: isinstance(v, str), "a string", "attempt event")
    arrivals = obj.get("arrivals")
    if verdict != "joined" or arrivals is None:
        return step, None
    if not isinstance(arrivals, list) or len(arrivals) > MAX_WORLD_SIZE:
        raise _malformed(f"attempt event: arrivals must be a list of at most {MAX_WORLD_SIZE}")
    seen = set()
    for i, a in enumerate(arrivals):
        what = f"attempt event: arrival {i}"
        if not isinstance(a, dict):
            raise _malformed(f"{what} must be an object")
        r = _need(a, "rank", lambda v: _int(v, 0, MAX_WORLD_SIZE - 1),
                  f"a rank, 0..{MAX_WORLD_SIZE - 1}", what)
        if r in seen:
            raise _malformed(f"{what}: rank {r} twice")
        seen.add(r)
        for key in ("after", "behind") + (("exec",) if "exec" in a else ()):
            _need(a, key, lambda v: _seconds(v) and v >= 0, "a number of seconds >= 0", what)
    return step, arrivals


def _step(obj: dict) -> tuple:
    t = _need(obj, "t", _seconds, "a number of seconds", "step event")
    step = _need(obj, "step", _int, "a whole number", "step event")
    trace = _need(obj, "trace", lambda v: isinstance(v, dict), "an object", "step event")
    admitted = _need(trace, "admitted", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                     "a list of request ids", "step event: trace")
    sampled = _need(trace, "sampled", lambda v: isinstance(v, dict), "an object", "step event: trace")
    return step, t, admitted, list(sampled)


# -- saying it ------------------------------------------------------------------------------

ROWS = (("run time", "run_ms"), ("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"),
        ("inter-token p50", "itl_p50_ms"), ("inter-token p99", "itl_p99_ms"))


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _change(before: float | None, after: float | None) -> tuple[str, str]:
    """The change in ms, and in percent of `before`."""
    if before is None or after is None:
        return "-", ""
    if f"{after - before:.2f}" in ("0.00", "-0.00"):
        return "0.00", ""
    return f"{after - before:+.2f}", (f"{100 * (after - before) / before:+.1f}%" if before else "")


def _table(header: tuple, rows: list[tuple], style: Style) -> list[str]:
    """Columns two spaces apart, the first left-aligned, the others right."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def fmt(row: tuple) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(row, widths))).rstrip()
    return [style.dim(fmt(header))] + [fmt(r) for r in rows]


def said(report: dict, style: Style) -> list[str]:
    rank, with_, without = report["without"], report["with"], report["without_rank"]
    lines = [f"rank {rank} came last at {report['steps_last']} of {report['steps']} steps; no slower "
             f"than the others' median, {report['saved_ms']:.2f} ms saved", ""]
    rows = [(label, _num(with_[key]), _num(without[key]), *_change(with_[key], without[key]))
            for label, key in ROWS]
    lines += _table(("", "with ms", f"without {rank}", "change", ""), rows, style)
    dropped = [r for r in report["requests"][:TOP]
               if r["ttft_ms"] is not None and r["ttft_ms"] > r["ttft_without_ms"]]
    lines.append("")
    if not dropped:
        lines.append("no request's TTFT would have dropped")
        return lines
    rows = [(shown(r["request_id"]), _num(r["ttft_ms"]), _num(r["ttft_without_ms"]),
             *_change(r["ttft_ms"], r["ttft_without_ms"])) for r in dropped]
    lines += _table(("TTFT dropped most", "with ms", f"without {rank}", "change", ""), rows, style)
    return lines
