"""The page's data: what the model (model.py) kept of a log, as the page's script draws it.

One JSON object (`page_data`): times in integer microseconds from the run's start (the `run`
record's time), texts as indices into one table of strings, attempts with their round trips
placed on the scheduler's clock (a rank elsewhere by the offset of its fastest round trip),
the committed steps with their counters and lines, a lane per request (its first time, then
each segment's state and length: each lane within its share of SEGMENT_BUDGET, `runs` making
one that changed state more often coarser), the marks, where each epoch began, the stretch
"fit" shows (the steps, not the start-up), and the notes saying what was skipped or past a
bound, the world's size over the steps (`world`), and each joined attempt's arrivals at its join
(`arrivals`: each rank's result after its plan was sent and behind the first, its own execute
time, and the rank the join waited for). Nothing here reads the log again: it works
from the model's bounded state only, so the page's size is bounded as the model is.
"""
from __future__ import annotations

import bisect
import math
import operator

from inferris_dist.engine import StepTrace
from inferris_dist.page.model import (
    COUNTERS,
    LANE_SEGMENTS,
    MARKS,
    MAX_RANK,
    MAX_STEPS,
    MAX_TEXT,
    PLAN_KEYS,
    RESULT_KEYS,
    RUNNING,
    SEGMENT_BUDGET,
    TIME_LIMIT,
    Builder,
    Lanes,
    Step,
    clean,
    error_text,
    is_int,
    runs,
    say,
)
from inferris_dist.words import shown

IN_FLIGHT = "in flight: no verdict in the log yet"   # page.js counts it neither committed nor failed


class _Clock:
    """Scheduler seconds -> integer microseconds from the start of the run."""

    def __init__(self, origin: float):
        self.origin = origin

    def __call__(self, t: float | None) -> int:
        if t is None:
            return -1
        return int(round(max(-TIME_LIMIT, min(TIME_LIMIT, t - self.origin)) * 1e6))


def _offsets(b: Builder, shared: bool) -> dict[tuple[int, int], float]:
    """Per (rank, pid): the rank's clock minus the scheduler's, from the round trip with the
    least time on the wire (NTP's midpoint estimate); zero when they share a clock."""
    best: dict[tuple[int, int], tuple[float, float]] = {}
    for a in b.attempts:
        for rt in a.ranks.values():
            if rt.inside is None or rt.sent is None or rt.back is None:
                continue
            if shared:
                best[(rt.rank, rt.pid)] = (0.0, 0.0)
                continue
            received, _, _, encoded = rt.inside
            wire_time = (rt.back - rt.sent) - (encoded - received)
            offset = ((received - rt.sent) + (encoded - rt.back)) / 2
            key = (rt.rank, rt.pid)
            if key not in best or wire_time < best[key][0]:
                best[key] = (wire_time, offset)
    return {k: off for k, (_, off) in best.items()}


def _pids(b: Builder) -> None:
    """Each round trip's process: the latest member of its rank admitted before its plan."""
    admitted = sorted([(t, rank, pid) for t, rank, _, pid, _ in b.members]
                      + [(t, rank, pid) for t, rank, _, pid, _, _ in b.renumbered], key=lambda x: x[0]) or \
        sorted(((t, rank, pid) for t, rank, _, pid in b.hellos), key=lambda x: x[0])
    by_rank: dict[int, list[tuple[float, int]]] = {}
    for t, rank, pid in admitted:
        by_rank.setdefault(rank, []).append((t, pid))
    if not by_rank:
        return
    for a in b.attempts:
        for rt in a.ranks.values():
            seq = by_rank.get(rt.rank)
            if seq and rt.sent is not None:
                i = bisect.bisect_right(seq, (rt.sent, math.inf)) - 1
                rt.pid = seq[max(i, 0)][1]


def page_data(b: Builder, title: str, notes: list[str]) -> dict:
    run = b.run or {}
    origin = b.run["t"] if b.run is not None else (b.t_lo if math.isfinite(b.t_lo) else 0.0)
    us = _Clock(origin)
    T = b.text
    shared = run.get("shared_clock") is True
    _pids(b)
    offsets = _offsets(b, shared)

    # attempts and their round trips
    attempts = []
    committed_by_attempt = not b.has_step_events
    # a log that goes on (step events, no end yet): an attempt with no verdict past the last step
    # joined is in flight, neither committed nor failed
    going_on = b.has_step_events and b.end is None
    joined_to = max((a.step for a in b.attempts if a.verdict == "joined"), default=-1) if going_on else 0
    for a in b.attempts:
        start = a.start()
        ends = [rt.back for rt in a.ranks.values() if rt.back is not None]
        end = a.end if a.end is not None else (max(ends) if ends else start)
        if start is None:
            start = end if end is not None else origin
        if end is None:
            end = start
        answered = a.ranks and all(rt.back is not None for rt in a.ranks.values())
        verdict = a.verdict or (IN_FLIGHT if going_on and a.step > joined_to else
                                "joined" if answered else "no answer in the log")
        rows = []
        for rank in sorted(a.ranks):
            rt = a.ranks[rank]
            sent = rt.sent if rt.sent is not None else start
            # microseconds after the attempt's start, after the plan's send, after each other
            row = [rank, round((sent - start) * 1e6),
                   -1 if rt.back is None else max(0, round((rt.back - sent) * 1e6)), rt.bytes, rt.result]
            if rt.inside is not None and rt.back is not None:
                off = offsets.get((rt.rank, rt.pid), 0.0)
                received, decoded, executed, encoded = rt.inside
                row += [round((received - off - sent) * 1e6), max(0, round((decoded - received) * 1e6)),
                        max(0, round((executed - decoded) * 1e6)), max(0, round((encoded - executed) * 1e6))]
            if rt.plan >= 0:
                row += [None] * (9 - len(row)) + [rt.plan]
            rows.append(row)
        # what the link did to a rank's plan or result, by rank (only where it did something)
        links = [[rank, T(", ".join(a.ranks[rank].link))] for rank in sorted(a.ranks) if a.ranks[rank].link]
        attempts.append([a.step, a.epoch, us(start), us(end), T(verdict), a.plan_bytes, a.plan, rows]
                        + ([links] if links else []))
        if committed_by_attempt:
            a.verdict = verdict          # what _steps takes as committed

    # committed steps: their spans, counters and lines
    steps, lanes, lines_over = _steps(b, committed_by_attempt)
    starts: dict[int, float] = {}
    for t, dur, _, step in b.phases:
        if step >= 0 and (step not in starts or t < starts[step]):
            starts[step] = t
    for a in b.attempts:
        s = a.start()
        if s is not None and (a.step not in starts or s < starts[a.step]):
            starts[a.step] = s
    col: dict[str, list] = {"step": [], "epoch": [], "a": [], "b": [], "line": []}
    counters: dict[str, list] = {k: [] for k in COUNTERS}
    prev_end = origin
    spans: list[tuple[float, float]] = []
    # by ordinal (the order the steps came in, the request lanes' index): span and number
    span_of: list[tuple[int, int]] = [(0, 0)] * len(steps)
    number_of: list[int] = [0] * len(steps)
    for st in steps:
        start = min(starts.get(st.step, st.t), st.t)
        if start < prev_end and st.step not in starts:
            start = prev_end
        spans.append((start, st.t))
        prev_end = st.t
        col["step"].append(st.step)
        col["epoch"].append(st.epoch)
        col["a"].append(us(start))
        col["b"].append(us(st.t))
        col["line"].append(st.line)
        for k, v in zip(COUNTERS, st.counters):
            counters[k].append(v)
        span_of[st.ordinal] = (us(start), us(st.t))
        number_of[st.ordinal] = st.step
    if not b.has_step_events:
        counters = {}

    requests = _requests(lanes, span_of, number_of, trim=not b.has_step_events)

    # each member admitted, and each kept member a resize renumbered (with the rank it held)
    members = [[rank, epoch, pid, T(host) if host else -1, us(t)] + ([was] if was >= 0 else [])
               for t, rank, epoch, pid, host, was in
               sorted([m + (-1,) for m in b.members] + b.renumbered, key=lambda m: m[0])]
    if not members:
        members = [[rank, epoch, pid, -1, us(t)] for t, rank, epoch, pid in sorted(b.hellos)]
    seen_pid: dict[int, int] = {}
    for rank, epoch, pid, _, t, *was in members:
        # renumbered by a resize, or joined at a rank a resize added: no replacement
        if rank in seen_pid and seen_pid[rank] != pid and not was and (epoch, rank) not in b.joined:
            b._mark("replaced", origin + t / 1e6, f"rank {rank} replaced: pid {seen_pid[rank]} -> {pid}",
                    [rank], epoch=epoch)
        seen_pid[rank] = pid

    marks = sorted(b.marks, key=lambda m: m[1])
    marks = [[k, us(t), int(round(dur * 1e6)), ranks, step, epoch, T(text)]
             for k, t, dur, ranks, step, epoch, text in marks]
    phases = sorted(b.phases)
    idle = []
    ends = sorted(z for _, z in spans)
    for first, last, t in sorted(b.idle, key=lambda x: x[0]):
        # the stretch began when the step before it ended (the event is written at its end)
        j = bisect.bisect_right(ends, t) - 1
        idle.append([first, last, us(ends[j] if j >= 0 else min(t, origin)), us(t)])

    world = run.get("world_size")
    ranks = set(b.ranks)
    if is_int(world) and 0 < world <= MAX_RANK + 1:
        ranks |= set(range(world))
    ranks_list = sorted(ranks)[:256]

    for what, n in (("plan bodies", b.plans.dropped), ("result bodies", b.results.dropped)):
        if n:
            kept = (b.plans if what == "plan bodies" else b.results).kept_to
            notes.append(f"{what} kept up to step {kept} only ({n} more not kept, to bound the page's "
                         f"size): `inferris-dist inspect WIRELOG --step K` prints any step in full")
    for what, n in list(b.over.items()) + [("step lines", lines_over), ("events", b.dropped_marks),
                                           ("texts", T.dropped)]:
        if n:
            kinds = ", ".join(f"{k} x{c}" for k, c in b.dropped_of.items()) if what == "events" else ""
            notes.append(f"{n} {what} beyond the page's bound are not shown"
                         + (f" ({kinds})" if kinds else ""))
    if b.traces_skipped:
        said = ", ".join(f"{what} x{n}" for what, n in list(b.trace_skipped.items())[:8])
        notes.append(f"{b.traces_skipped} step trace(s) held what the page cannot use, left out of their "
                     f"lines and request lanes: {said}")
    if requests["coarse"]:
        notes.append(f"{requests['coarse']} request lane(s) changed state more often than their share of "
                     f"the page's budget for lanes ({SEGMENT_BUDGET} segments in all, {requests['share']} a "
                     f"lane) allows: "
                     f"{requests['changes']} segments drawn as {requests['segments']}, each stretch of up "
                     f"to {requests['coarsest']} steps in which a lane changed state as one \"changing\" "
                     f"segment")
    if requests["more"]:
        notes.append(f"{'more than ' if not requests['counted_all'] else ''}{requests['total']} requests: "
                     f"lanes for the first {len(requests['ids'])} (the counter tracks count them all)")
    if len(ranks) > len(ranks_list):
        notes.append(f"{len(ranks)} ranks in the log: the first {len(ranks_list)} have lanes")
    if b.malformed:
        total = sum(b.malformed.values())
        kinds = ", ".join(f"{k} x{n}" for k, n in list(b.malformed.items())[:6])
        notes.insert(0, f"{total} malformed record(s) skipped: {kinds}")
    if b.unknown:
        notes.append("events this page does not know, ignored: " +
                     ", ".join(f"{k} x{n}" for k, n in b.unknown.items()))
    if not b.has_step_events and steps:
        notes.append("no step events in this log (written before they were logged): steps are the "
                     "joined attempts, request lanes come from the plans, and there are no counters")
    if b.run is not None and b.end is None:
        notes.append("the log has no end record: the run did not finish writing it")

    end_status = b.end.get("status") if b.end else None
    meta = {"name": say(run.get("name")) if run.get("name") else "",
            "world_size": world if is_int(world) else None,
            "rung": say(run["rung"]) if "rung" in run else "",
            "policy": say(run["policy"]) if "policy" in run else "",
            "faults": [say(f) for f in run.get("faults", [])[:32]] if isinstance(run.get("faults"), list)
            else [],
            "config": {shown(str(k))[:40]: clean(v) for k, v in list(run.get("config", {}).items())[:16]}
            if isinstance(run.get("config"), dict) else {},
            "requests": run.get("requests") if is_int(run.get("requests")) else None,
            "scheduler_pid": run.get("scheduler_pid") if is_int(run.get("scheduler_pid")) else None,
            "address": say(run.get("address") or run.get("listen") or ""),
            "shared_clock": run.get("shared_clock") if isinstance(run.get("shared_clock"), bool) else None,
            "status": say(end_status) if end_status is not None else "",
            "error": error_text(b.end.get("error")) if b.end and b.end.get("error") is not None else "",
            "messages": b.messages, "bytes_out": b.bytes_out, "bytes_in": b.bytes_in,
            "offsets": [[r, pid, round(o * 1e6, 1)] for (r, pid), o in sorted(offsets.items())
                        if not shared][:256]}
    lo = min([0] + [a[2] for a in attempts] + [m[1] for m in marks])
    hi = max([1] + [a[3] for a in attempts] + [m[1] + m[2] for m in marks] + col["b"]
             + [us(t + d) for t, d, _, _ in phases])
    # what "fit" shows: the run's steps (their attempts, and what befell them), not the start-up
    # before the first plan nor the stopping after the last step
    ran = [a[2] for a in attempts] + col["a"]
    during = {MARKS.index(k) for k in ("lost", "restart", "step-failed", "rejoin-wait", "partition",
                                       "audit", "audit-failed", "link", "resize")}
    fit = [lo, hi]
    if ran:
        first = min(ran)
        fit = [first, max([a[3] for a in attempts] + col["b"]
                          + [m[1] + m[2] for m in marks if m[0] in during and m[1] >= first])]
        if fit[1] <= fit[0]:
            fit = [lo, hi]
    return {
        "v": 1, "title": shown(title), "meta": meta, "notes": notes, "strs": T.texts,
        "span": [lo, hi], "fit": fit, "ranks": ranks_list, "phases": [[k, s, us(t), int(round(d * 1e6))]
                                                          for t, d, k, s in phases],
        "attempts": attempts, "plans": b.plans.rows, "results": b.results.rows,
        "plan_keys": list(PLAN_KEYS), "result_keys": list(RESULT_KEYS),
        "steps": col, "counters": counters, "requests": requests, "marks": marks, "mark_kinds": list(MARKS),
        "members": members, "handshakes": [[r, us(a), us(z)] for r, a, z in b.handshakes],
        "audits": [[r, us(a), us(z), n, s] for r, a, z, n, s in b.audits], "idle": idle,
        # where each epoch began (the restarts and resizes), in time order
        "epochs": [[us(t), e] for t, e in sorted(b.epochs)],
        "world": _world(b, world, us),
        "arrivals": _arrivals(b),
        # from the run's first record to its first plan: the ranks being started and joining
        "startup": [0, min(a[2] for a in attempts)] if b.run is not None and attempts else None,
    }


def _world(b: Builder, requested: object, us: _Clock) -> dict:
    """The world's size over the steps: the size the run asked for (its `run` record's), and
    each change as [step, from, to, time, why (a text), epoch], in time order. No change: the
    page draws no chart."""
    T = b.text
    return {"requested": requested if is_int(requested) and 0 < requested <= MAX_RANK + 1 else None,
            "changes": [[step, old, new, us(t), T(why), epoch]
                        for t, step, epoch, old, new, why in sorted(b.resizes, key=lambda r: r[0])]}


def _arrivals(b: Builder) -> list:
    """Each joined attempt's arrivals, where its `attempt` event said them: [attempt (its index
    in "attempts"), the last rank (-1: under two ranks), [[rank, after, behind, exec (-1: not
    said)], ...]], times in microseconds, the ranks in the log's order."""
    def us(v: float | None) -> int:
        return -1 if v is None else int(round(v * 1e6))
    return [[i, -1 if a.last is None else a.last,
             [[rank, us(after), us(behind), us(run)] for rank, after, behind, run in a.arrivals]]
            for i, a in enumerate(b.attempts) if a.arrivals]


def _steps(b: Builder, from_attempts: bool) -> tuple[list[Step], Lanes, int]:
    """The committed steps in time order, their request lanes, and how many step lines were
    past their budget: the step events, or (an older log) the joined attempts, with the plan's
    request ids as what ran."""
    if not from_attempts:
        b.lanes.close()
        return sorted(b.steps, key=lambda s: s.t), b.lanes, b.line_budget[1]
    joined = []
    for a in b.attempts:
        if a.verdict == "joined" and len(joined) < MAX_STEPS:
            ends = [rt.back for rt in a.ranks.values() if rt.back is not None]
            t = a.end if a.end is not None else (max(ends) if ends else a.start() or 0.0)
            body = a.plan_body if isinstance(a.plan_body, list) else []
            ids = list(dict.fromkeys(x.get("request_id") for x in body
                                     if isinstance(x, dict) and isinstance(x.get("request_id"), str)))
            joined.append((t, a, ids))
    joined.sort(key=lambda j: j[0])
    lanes = Lanes()
    steps = []
    budget = [0, 0]            # its own: the model is left as it was (a live page makes its data often)
    for ordinal, (t, a, ids) in enumerate(joined):
        trace = StepTrace(a.step, [], ids, {}, {}, {}, [], {}, {}, [], {}, {}, {})
        steps.append(Step(a.step, a.epoch, t, b.line(trace, budget), [None] * len(COUNTERS), ordinal))
        lanes.step(a.step, (), ids, (), (), {})
    lanes.close()
    return steps, lanes, budget[1]


def _requests(lanes: Lanes, span_of: list[tuple[int, int]], number_of: list[int], trim: bool) -> dict:
    """A lane per request (the first MAX_REQUEST_LANES): waiting, running, preempted, as the
    committed steps say, and where it finished; each lane as its first time and then, per
    segment, its state and how long it lasted (microseconds): [t0, state, dur, state, dur, ...].
    Each lane has its share of SEGMENT_BUDGET: a lane that changed state more often is kept at a
    coarser resolution, a stretch of steps in which it changed being one CHANGING segment.
    `trim` (an older log, where nothing says when a request finished): each lane ends with the
    last step it ran in."""
    n = len(lanes.ids)
    cap = min(LANE_SEGMENTS, max(2, SEGMENT_BUDGET // max(1, n)))
    out, info = [], []
    changes = kept = coarse = coarsest = 0
    for i in range(n):
        states = bytes(lanes.states[i])
        if trim:
            states = states[:states.rfind(RUNNING) + 1]
        first = lanes.first[i]
        segs, q = runs(states, cap)
        if q > 1:
            coarse += 1
            coarsest = max(coarsest, q)
            changes += sum(map(operator.ne, states[1:], states)) + 1
        else:
            changes += len(segs)
        kept += len(segs)
        lane: list[int] = []
        if segs:
            t = span_of[first][0]
            lane.append(t)
            for state, a, z in segs:
                end = max(t, span_of[first + z - 1][1])
                lane += [state, end - t]
                t = end
        out.append(lane)
        admitted = number_of[first] if first < len(number_of) else -1
        info.append([admitted, lanes.finished[i], shown(lanes.reason[i][:40]), states.count(RUNNING),
                     lanes.preemptions[i]] + ([q] if q > 1 else []))
    more = lanes.total - n
    return {"ids": [shown(r[:MAX_TEXT]) for r in lanes.ids], "lanes": out, "info": info,
            "total": lanes.total, "more": more, "counted_all": not lanes.more_than_counted,
            "changes": changes, "segments": kept, "coarse": coarse, "coarsest": coarsest, "share": cap}
