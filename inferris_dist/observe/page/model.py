"""The page's model: a wire log's records, read in one pass, into what the page draws.

`Builder.add` takes the records one by one, as a careful reader would: whatever a record
holds (a field of the wrong type, a number that is not one, a hostile text), it is either
used, bounded and cleaned, or skipped and counted (`malformed`, `unknown`); it never raises.
What is kept is bounded whatever the log holds: each kind of thing has its cap (MAX_*), and
texts and bodies have byte budgets, each distinct one kept once; what is past a bound is
counted, for a note at the top of the page (data.py says it). The builder keeps times in the
scheduler's seconds; data.py turns them into the page's microseconds.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from inferris_dist.engine import StepTrace
from inferris_dist.observe.logread import Malformed
from inferris_dist.observe.words import shown

MAX_RANK = 4095             # a rank number beyond this is not one (keys refuses larger worlds)
MAX_TEXT = 400              # characters kept of any one text from the log
TEXT_BUDGET = 2 << 20       # characters of text kept in all
BODY_BUDGET = 3 << 20       # bytes of plan bodies on the page, and as many of result bodies
LINE_BUDGET = 1 << 20       # bytes of step lines ("admit r0  run r0:6 ...") kept
MAX_ROUND_TRIPS = 200_000   # ranks' round trips drawn
MAX_ATTEMPTS = 50_000
MAX_STEPS = 40_000          # committed steps with counters and step lines
MAX_PHASES = 120_000
MAX_MARKS = 20_000
MAX_MEMBERS = 10_000
MAX_AUDITS = 60_000
MAX_REQUEST_LANES = 200
MAX_LIST = 256              # elements of a list kept in a body (then "... N more")
MAX_KEYS = 64
MAX_DEPTH = 6
TIME_LIMIT = 1e9            # seconds from the start: a time beyond it is not one

PHASES = ("prepare", "execute", "commit", "recover")
COUNTERS = ("requests_running", "requests_waiting", "requests_preempted", "pages_used", "pages_free",
            "pages_cached", "prefix_hit_tokens", "drafted_tokens", "accepted_tokens", "batch_tokens",
            "batch_requests")
PLAN_KEYS = ("request_id", "start_position", "num_tokens", "draft_len", "decode", "verdict_index",
             "placements")
RESULT_KEYS = ("request_id", "start_position", "executed_tokens", "accepted", "writes")
MARKS = ("lost", "restart", "step-failed", "audit", "audit-failed", "note", "turned-away",
         "rejoin-wait", "refused", "replaced", "end")
# The events the page draws, each by its Builder._ev_* method: every event of the wire log's
# schema (tests/test_wire_schema.py holds them equal); any other is counted and ignored.
KNOWN_EVENTS = {"run", "member", "phase", "attempt", "step", "audit", "audit-failed", "rejoin-wait",
                "restart", "rank-lost", "step-failed", "note", "turned-away", "idle", "partition", "end"}
WAITING, RUNNING, PREEMPTED = 0, 1, 2


def is_int(v: Any) -> bool:
    return type(v) is int


def is_num(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


# -- what the page keeps: bounded, cleaned values --------------------------------------------

class _Texts:
    """Every text of the log the page shows, once, shortened, escaped like the terminal shows
    it, within one budget."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.texts: list[str] = []
        self.size = 0
        self.dropped = 0

    def __call__(self, text: Any) -> int:
        s = text if isinstance(text, str) else _json_text(text)
        s = shown(s[:MAX_TEXT]) + ("…" if len(s) > MAX_TEXT else "")
        i = self.index.get(s)
        if i is None:
            if self.size + len(s) > TEXT_BUDGET:
                self.dropped += 1
                s = "(text not kept: the page's budget for text is spent)"
                i = self.index.get(s)
                if i is not None:
                    return i
            i = self.index[s] = len(self.texts)
            self.texts.append(s)
            self.size += len(s)
        return i


def _json_text(v: Any) -> str:
    try:
        return json.dumps(clean(v), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return "(unprintable)"


def clean(v: Any, depth: int = 0) -> Any:
    """A value from the log as the page may keep it: finite numbers, short strings, bounded
    lists and objects."""
    if v is None or isinstance(v, bool):
        return v
    if type(v) is int:
        return v if abs(v) < 2 ** 53 else str(v)
    if type(v) is float:
        return v if math.isfinite(v) else str(v)
    if isinstance(v, str):
        return shown(v[:MAX_TEXT]) + ("…" if len(v) > MAX_TEXT else "")
    if depth >= MAX_DEPTH:
        return "…"
    if isinstance(v, list):
        out = [clean(x, depth + 1) for x in v[:MAX_LIST]]
        if len(v) > MAX_LIST:
            out.append(f"… {len(v) - MAX_LIST} more")
        return out
    if isinstance(v, dict):
        items = list(v.items())
        out = {shown(str(k)[:64]): clean(x, depth + 1) for k, x in items[:MAX_KEYS]}
        if len(items) > MAX_KEYS:
            out["…"] = f"{len(items) - MAX_KEYS} more keys"
        return out
    return shown(str(v)[:MAX_TEXT])


def _rows(body: Any, keys: tuple[str, ...]) -> list | str:
    """A plan's items or a result's outcomes as rows of values in `keys` order (a row that is
    not an object: its text; keys beyond `keys`: a last object)."""
    if not isinstance(body, list):
        return _json_text(body)
    rows: list = []
    for x in body[:MAX_LIST]:
        if isinstance(x, dict):
            row = [clean(x.get(k)) for k in keys]
            extra = {k: x[k] for k in list(x)[:MAX_KEYS] if k not in keys}
            if extra:
                row.append(clean(extra))
            rows.append(row)
        else:
            rows.append(_json_text(x))
    if len(body) > MAX_LIST:
        rows.append(f"… {len(body) - MAX_LIST} more")
    return rows


class _Bodies:
    """Plan or result bodies, each distinct one kept once, within a budget."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys
        self.index: dict[str, int] = {}
        self.rows: list = []
        self.size = 0
        self.dropped = 0
        self.kept_to = -1                 # the last step whose body was kept

    def add(self, body: Any, step: int) -> int:
        try:
            key = json.dumps(body, sort_keys=True)
        except (ValueError, TypeError, RecursionError):
            key = repr(type(body))
        i = self.index.get(key)
        if i is not None:
            return i
        if self.size > BODY_BUDGET:
            self.dropped += 1
            return -1
        rows = _rows(body, self.keys)
        self.size += len(json.dumps(rows, separators=(",", ":")))
        self.kept_to = max(self.kept_to, step)
        i = self.index[key] = len(self.rows)
        self.rows.append(rows)
        return i


@dataclass
class _RoundTrip:
    rank: int
    sent: float | None = None
    back: float | None = None
    bytes: int = -1
    result: int = -1
    plan: int = -1                        # its plan, where it differs from the attempt's
    inside: tuple | None = None           # the rank's own four times, in its clock
    pid: int = -1


@dataclass
class _Attempt:
    step: int
    epoch: int
    plan: int = -1
    plan_body: Any = None
    plan_bytes: int = -1
    ranks: dict[int, _RoundTrip] = field(default_factory=dict)
    verdict: str = ""
    end: float | None = None
    closed: bool = False                  # its `attempt` event came
    results: list = field(default_factory=list)   # (body, id) of the results seen, to dedupe

    def start(self) -> float | None:
        times = [rt.sent for rt in self.ranks.values() if rt.sent is not None]
        return min(times) if times else None


@dataclass
class Step:
    step: int
    epoch: int
    t: float
    trace: StepTrace | None
    counters: list


def _int(obj: dict, key: str, lo: int = 0, hi: int = 2 ** 53, optional: bool = False) -> Any:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not is_int(v) or not lo <= v <= hi:
        raise Malformed(key)
    return v


def _num(obj: dict, key: str, optional: bool = False) -> Any:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not is_num(v) or abs(v) > 1e12:
        raise Malformed(key)
    return float(v)


def _ids(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _counts(v: Any) -> dict[str, int]:
    return {k: n for k, n in v.items() if isinstance(k, str) and is_int(n)} if isinstance(v, dict) else {}


def _words(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        return {}
    return {k: w for k, w in v.items() if isinstance(k, str) and isinstance(w, str)}


def _trace(step: int, obj: Any) -> StepTrace | None:
    if not isinstance(obj, dict):
        return None
    g = obj.get
    evicted = [p for p in g("evicted") if is_int(p)] if isinstance(g("evicted"), list) else []
    return StepTrace(step, _ids(g("admitted")), _ids(g("scheduled")), _counts(g("executed")),
                     _words(g("sampled")), _words(g("finished")), _ids(g("preempted")),
                     _counts(g("reused")), _counts(g("published")), evicted, _counts(g("drafted")),
                     _counts(g("accepted")), _counts(g("rolled_back")))


def _ranks_text(ranks: list) -> str:
    ranks = [r for r in ranks if is_int(r)]
    if not ranks:
        return "every rank"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:32]))


def _secs(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


# -- the one pass over the records -----------------------------------------------------------

class Builder:
    """The one pass: `add` each record; the state it keeps is bounded (see the module)."""

    def __init__(self):
        self.text = _Texts()
        self.plans = _Bodies(PLAN_KEYS)
        self.results = _Bodies(RESULT_KEYS)
        self.malformed: dict[str, int] = {}
        self.unknown: dict[str, int] = {}
        self.run: dict | None = None
        self.end: dict | None = None
        self.t_lo = math.inf
        self.t_hi = -math.inf
        self.attempts: list[_Attempt] = []
        self.open: dict[tuple[int, int], _Attempt] = {}       # (step, epoch) -> latest attempt
        self.dropped_attempts = 0
        self.round_trips = 0
        self.dropped_round_trips = 0
        self.phases: list[tuple[float, float, int, int]] = []   # start, dur, kind, step
        self.dropped_phases = 0
        self.steps: list[Step] = []
        self.dropped_steps = 0
        self.idle: list[tuple[int, int, float]] = []
        self.marks: list[list] = []
        self.dropped_marks = 0
        self.members: list[tuple[float, int, int, int, str]] = []   # t, rank, epoch, pid, host
        self.hellos: list[tuple[float, int, int, int]] = []          # t, rank, epoch, pid
        self.handshakes: list[list] = []                            # rank, hello t, ready t
        self.hello_at: dict[int, float] = {}
        self.audit_out: dict[int, tuple[float, int]] = {}
        self.audits: list[list] = []
        self.ranks: set[int] = set()
        self.messages = self.bytes_out = self.bytes_in = 0
        self.has_step_events = False

    # -- the records

    def add(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            self._bad("not an object")
            return
        try:
            if "event" in obj:
                self._event(obj)
            else:
                self._message(obj)
        except (Malformed, TypeError, ValueError, KeyError, AttributeError, OverflowError,
                RecursionError) as e:     # whatever a hostile record holds: skipped, counted
            what = obj.get("event") if isinstance(obj.get("event"), str) else obj.get("type")
            why = str(e) if isinstance(e, Malformed) else type(e).__name__
            self._bad(f"{shown(what[:40]) if isinstance(what, str) else 'record'} ({why})")

    def _bad(self, why: str) -> None:
        if len(self.malformed) < 50 or why in self.malformed:
            self.malformed[why] = self.malformed.get(why, 0) + 1
        else:
            self.malformed["other"] = self.malformed.get("other", 0) + 1

    def _time(self, t: float) -> None:
        if t < self.t_lo:
            self.t_lo = t
        if t > self.t_hi:
            self.t_hi = t

    def _mark(self, kind: str, t: float, text: str, ranks: list | None = None, step: Any = None,
              epoch: Any = None, dur: float = 0.0) -> None:
        if len(self.marks) >= MAX_MARKS:
            self.dropped_marks += 1
            return
        ranks = sorted({r for r in ranks or () if is_int(r) and 0 <= r <= MAX_RANK})[:64]
        self.marks.append([MARKS.index(kind), t, dur, ranks, step if is_int(step) else -1,
                           epoch if is_int(epoch) else -1, text])

    def _message(self, m: dict) -> None:
        if m.get("dir") not in ("in", "out") or not isinstance(m.get("type"), str):
            raise Malformed("neither a message nor an event")
        g = m.get
        t, rank, epoch, step, num_bytes = g("t"), g("rank"), g("epoch"), g("step"), g("bytes")
        # the common case checked inline (a long run has hundreds of thousands of messages)
        if not (type(t) is float and -1e12 < t < 1e12):
            t = _num(m, "t")
        if not (type(rank) is int and 0 <= rank <= MAX_RANK):
            rank = _int(m, "rank", 0, MAX_RANK, optional=True)
        if not (type(epoch) is int and 0 <= epoch < 2 ** 31):
            epoch = _int(m, "epoch", 0, 2 ** 31, optional=True) or 0
        if not (type(step) is int and -1 <= step < 2 ** 53):
            step = _int(m, "step", -1, 2 ** 53, optional=True)
        if not (type(num_bytes) is int and num_bytes >= 0):
            num_bytes = -1
        kind = m["type"]
        if rank is None and kind != "REFUSED":
            raise Malformed("rank")
        if t < self.t_lo or t > self.t_hi:
            self._time(t)
        self.messages += 1
        if num_bytes > 0:
            if m["dir"] == "out":
                self.bytes_out += num_bytes
            else:
                self.bytes_in += num_bytes
        if rank is not None:
            self.ranks.add(rank)
        if kind == "PLAN" and m["dir"] == "out":
            self._plan(m, t, rank, epoch, step, num_bytes)
        elif kind == "RESULT" and m["dir"] == "in":
            self._result(m, t, rank, epoch, step, num_bytes)
        elif kind == "HELLO" and m["dir"] == "in":
            body = m.get("body")
            pid = body.get("pid") if isinstance(body, dict) else None
            self.hellos.append((t, rank, epoch, pid if is_int(pid) else -1))
            self.hello_at[rank] = t
        elif kind == "READY" and m["dir"] == "in":
            began = self.hello_at.pop(rank, None)
            if began is not None and len(self.handshakes) < MAX_MEMBERS:
                self.handshakes.append([rank, began, t])
        elif kind == "AUDIT" and m["dir"] == "out":
            self.audit_out[rank] = (t, step if step is not None else -1)
        elif kind == "SHARD" and m["dir"] == "in":
            out = self.audit_out.pop(rank, None)
            if out is not None and len(self.audits) < MAX_AUDITS:
                self.audits.append([rank, out[0], t, num_bytes, out[1]])
        elif kind == "REFUSED":
            body = m.get("body")
            why = body[0] if isinstance(body, list) and body and isinstance(body[0], str) else ""
            who = "a peer" if rank is None else f"rank {rank}'s peer"
            self._mark("refused", t, f"refused {who}" + (f": {why}" if why else ""),
                       [rank] if rank is not None else [], step)

    def _attempt(self, step: int, epoch: int, fresh_for: int | None = None) -> _Attempt | None:
        a = self.open.get((step, epoch))
        if a is not None and not (fresh_for is not None and (a.closed or fresh_for in a.ranks
                                                                  and a.ranks[fresh_for].sent is not None)):
            return a
        if len(self.attempts) >= MAX_ATTEMPTS:
            self.dropped_attempts += 1
            return None
        a = self.open[(step, epoch)] = _Attempt(step, epoch)
        self.attempts.append(a)
        return a

    def _round_trip(self, a: _Attempt, rank: int) -> _RoundTrip | None:
        rt = a.ranks.get(rank)
        if rt is None:
            if self.round_trips >= MAX_ROUND_TRIPS:
                self.dropped_round_trips += 1
                return None
            self.round_trips += 1
            rt = a.ranks[rank] = _RoundTrip(rank)
        return rt

    def _plan(self, m: dict, t: float, rank: int, epoch: int, step: int | None, num_bytes: int) -> None:
        body = m.get("body")
        items = body.get("items") if isinstance(body, dict) else None
        if step is None or not isinstance(items, list):
            raise Malformed("no plan items")
        a = self._attempt(step, epoch, fresh_for=rank)
        if a is None:
            return
        rt = self._round_trip(a, rank)
        if rt is None:
            return
        rt.sent = t
        if a.plan_body is None:
            a.plan_body, a.plan_bytes = items, num_bytes
            a.plan = self.plans.add(items, step)
        elif items != a.plan_body:                   # every rank should get the same plan
            rt.plan = self.plans.add(items, step)

    def _result(self, m: dict, t: float, rank: int, epoch: int, step: int | None, num_bytes: int) -> None:
        if step is None:
            raise Malformed("step")
        sent, rtt = _num(m, "sent", optional=True), _num(m, "rtt", optional=True)
        inside = m.get("inside")
        if inside is not None and not (isinstance(inside, list) and len(inside) == 4
                                       and all(is_num(x) and abs(x) < 1e12 for x in inside)):
            raise Malformed("inside")
        a = self.open.get((step, epoch)) or self._attempt(step, epoch)
        if a is None:
            return
        rt = self._round_trip(a, rank)
        if rt is None:
            return
        if sent is not None:
            rt.sent = sent
            self._time(sent)
        if rt.sent is not None and rtt is not None and rtt >= 0:
            rt.back = rt.sent + rtt
        else:
            rt.back = t
        rt.bytes = num_bytes
        rt.inside = tuple(inside) if inside is not None else None
        body = m.get("body")
        for seen, i in a.results:                   # most ranks answer alike: compare, keep one
            if seen == body:
                rt.result = i
                break
        else:
            rt.result = self.results.add(body, step)
            if len(a.results) < 8:
                a.results.append((body, rt.result))

    def _event(self, ev: dict) -> None:
        kind = ev["event"]
        if not isinstance(kind, str):
            raise Malformed("event")
        if kind not in KNOWN_EVENTS:
            if len(self.unknown) < 20 or kind in self.unknown:
                self.unknown[shown(kind[:40])] = self.unknown.get(shown(kind[:40]), 0) + 1
            return
        t = _num(ev, "t")
        self._time(t)
        getattr(self, "_ev_" + kind.replace("-", "_"))(ev, t)

    def _ev_run(self, ev: dict, t: float) -> None:
        self.run = ev

    def _ev_end(self, ev: dict, t: float) -> None:
        self.end = ev
        status = ev.get("status")
        error = ev.get("error")
        text = f"run ended: {shown(str(status))[:40]}"
        if error is not None:
            text += f": {error_text(error)}"
        self._mark("end", t, text, step=error.get("step") if isinstance(error, dict) else None)

    def _ev_member(self, ev: dict, t: float) -> None:
        rank = _int(ev, "rank", 0, MAX_RANK)
        epoch = _int(ev, "epoch", 0, 2 ** 31, optional=True) or 0
        pid = _int(ev, "pid", 0, 2 ** 53, optional=True)
        host = ev.get("host") if isinstance(ev.get("host"), str) else ""
        self.ranks.add(rank)
        if len(self.members) < MAX_MEMBERS:
            self.members.append((t, rank, epoch, -1 if pid is None else pid, host))

    def _ev_phase(self, ev: dict, t: float) -> None:
        phase = ev.get("phase")
        if phase not in PHASES:
            raise Malformed("phase")
        dur = _num(ev, "dur")
        step = _int(ev, "step", 0, optional=True)
        self._time(t + max(dur, 0.0))
        if len(self.phases) >= MAX_PHASES:
            self.dropped_phases += 1
            return
        self.phases.append((t, max(dur, 0.0), PHASES.index(phase), -1 if step is None else step))

    def _ev_attempt(self, ev: dict, t: float) -> None:
        step, epoch = _int(ev, "step"), _int(ev, "epoch", 0, 2 ** 31)
        a = self.open.get((step, epoch))
        if a is None or a.closed:
            a = self._attempt(step, epoch)
            if a is None:
                return
        a.closed = True
        a.end = t
        verdict = ev.get("verdict")
        a.verdict = verdict if isinstance(verdict, str) else _json_text(verdict)
        if is_int(ev.get("plan_bytes")) and ev["plan_bytes"] >= 0:
            a.plan_bytes = ev["plan_bytes"]

    def _ev_step(self, ev: dict, t: float) -> None:
        step = _int(ev, "step")
        epoch = _int(ev, "epoch", 0, 2 ** 31, optional=True) or 0
        self.has_step_events = True
        if len(self.steps) >= MAX_STEPS:
            self.dropped_steps += 1
            return
        counters = ev.get("counters") if isinstance(ev.get("counters"), dict) else {}
        values = [counters.get(k) if is_num(counters.get(k)) else None for k in COUNTERS]
        self.steps.append(Step(step, epoch, t, _trace(step, ev.get("trace")), values))

    def _ev_idle(self, ev: dict, t: float) -> None:
        first, last = _int(ev, "first"), _int(ev, "last")
        if first > last:
            raise Malformed("first > last")
        if len(self.idle) < MAX_STEPS:
            self.idle.append((first, last, t))

    def _ev_audit(self, ev: dict, t: float) -> None:
        self._mark("audit", t, f"audit at step {ev.get('step')}: every shard holds every slot the "
                   f"pool holds", step=ev.get("step"), epoch=ev.get("epoch"))

    def _ev_audit_failed(self, ev: dict, t: float) -> None:
        rank = ev.get("rank")
        self._mark("audit-failed", t, f"audit failed: {say(ev.get('message'))}",
                   [rank], ev.get("step"), ev.get("epoch"))

    def _ev_rejoin_wait(self, ev: dict, t: float) -> None:
        dur = max(_num(ev, "dur"), 0.0)
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        self._time(t + dur)
        joined = ev.get("joined") is True
        self._mark("rejoin-wait", t, f"waited {_secs(dur)} for {_ranks_text(ranks)} to "
                   f"{'rejoin: joined' if joined else 'rejoin: did not join'}", ranks, dur=dur)

    def _ev_restart(self, ev: dict, t: float) -> None:
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        pids = ev.get("pids") if isinstance(ev.get("pids"), list) else []
        policy = ev.get("policy") if isinstance(ev.get("policy"), str) and ev.get("policy") else "restart"
        text = (f"{shown(policy[:40])}: restarted {_ranks_text(ranks)} into epoch {ev.get('epoch')} "
                f"at step {ev.get('step')}")
        if is_int(ev.get("shard_pages")):
            text += f", shard of {ev['shard_pages']} pages"
        if pids and all(is_int(p) for p in pids):
            text += f" (pid {', '.join(map(str, pids[:16]))})"
        self._mark("restart", t, text, ranks, ev.get("step"), ev.get("epoch"))

    def _ev_rank_lost(self, ev: dict, t: float) -> None:
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else [ev.get("rank")]
        reason = ev.get("reason")
        text = f"lost ({shown(str(reason)[:40])}): {say(ev.get('message'))}"
        if ev.get("rank") is None and not ranks:
            ranks = sorted(self.ranks)
        self._mark("lost", t, text, ranks, ev.get("step"), ev.get("epoch"))
        self._verdict(ev, f"{_ranks_text(ranks)} lost ({shown(str(reason)[:40])})")

    def _ev_step_failed(self, ev: dict, t: float) -> None:
        kind = ev.get("kind")
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        self._mark("step-failed", t, f"{say(kind)}: {say(ev.get('message'))}", ranks,
                   ev.get("step"), ev.get("epoch"))
        self._verdict(ev, say(kind))

    def _verdict(self, ev: dict, verdict: str) -> None:
        """An old log's verdict, when no `attempt` event will say it."""
        s, e = ev.get("step"), ev.get("epoch")
        a = self.open.get((s, e)) if is_int(s) and is_int(e) else None
        if a is not None and not a.closed and not a.verdict:
            a.verdict = verdict

    def _ev_note(self, ev: dict, t: float) -> None:
        rank = ev.get("rank")
        self._mark("note", t, say(ev.get("text")), [rank] if is_int(rank) else [], ev.get("step"),
                   ev.get("epoch"))

    def _ev_turned_away(self, ev: dict, t: float) -> None:
        counts = [ev.get(k) if isinstance(ev.get(k), dict) else {} for k in ("messages", "connections")]
        sums = [sum(n for n in c.values() if is_int(n)) for c in counts]
        peers = ", ".join(shown(str(p))[:60] for p in list(counts[0])[:8])
        self._mark("turned-away", t, f"turned away: {sums[0]} message(s) from {len(counts[0])} peer(s) "
                   f"holding no rank{f' ({peers})' if peers else ''}, {sums[1]} connection(s) refused")


def error_text(error: Any) -> str:
    """The end record's error object in words: "RankLost at step 3, epoch 0: rank 2 died ..."."""
    if not isinstance(error, dict):
        return say(error)
    kind = error.get("error") or error.get("kind") or "error"
    where = ", ".join(f"{k} {error[k]}" for k in ("step", "epoch", "rank") if is_int(error.get(k)))
    rest = {k: v for k, v in error.items() if k not in ("error", "kind", "message", "step", "epoch", "rank")}
    text = f"{say(kind)}{f' at {where}' if where else ''}: {say(error.get('message'))}"
    return text + (f" ({_json_text(rest)})" if rest else "")


def say(v: Any) -> str:
    return shown(v) if isinstance(v, str) else _json_text(v)
