"""`inferris-dist html WIRELOG -o FILE`: a wire log as one self-contained page.

The page shows what crossed the executor boundary, on one time axis: a lane for the
scheduler's phases, one per rank (its processes and epochs, each plan's round trip with
the rank's own decode, execute and encode inside it, audits, joins and rejoin waits), the
losses, restarts and refused peers where they happened, counter tracks, and a lane per
request. A click on a step lists its plan item by item, every rank's result and the join,
as `inferris-dist inspect WIRELOG --step K` prints them.

Nothing on the page comes from elsewhere: the script, the style and the data are in the
file, a Content-Security-Policy allows only those (by hash) and no connection at all. The
data is one JSON block, read by the script with JSON.parse; every text from the log is put
on the page as text (textContent), never as markup.

The page's size is bounded whatever the log holds: a plan sent to every rank of an attempt
is kept once, identical results once, and past a budget the detail (plan and result
bodies, then round trips) is dropped, with a note at the top of the page that says so.
The log is read as a careful reader would: lines longer than MAX_LINE are skipped, at most
MAX_READ bytes are read, a line that is not a record (or a record that is malformed) is
skipped and counted, a line cut short at the end is said to be so, and unknown events are
ignored.

Times are the scheduler's monotonic clock. A rank on this host reads the same clock (the
run record says `shared_clock`); a rank elsewhere has its own, placed on the scheduler's,
process by process, by the offset of its fastest round trip (NTP's midpoint estimate).

The page keeps a read-only `window.inferrisPage` (lanes, steps, marks, what the last frame
drew, stepPoint(K), focusStep(K), setView(a, b)) for tests, and for anyone at its console.
"""
from __future__ import annotations

import base64
import bisect
import hashlib
import html
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from inferris_dist.cli.cmd_inspect import open_log
from inferris_dist.cli.render import PLAIN, shown, step_events
from inferris_dist.engine import StepTrace, WorkloadError

MAX_LINE = 4 << 20          # a longer line is skipped (read in pieces, never held whole)
MAX_READ = 1 << 30          # bytes read from one log at most
PROBE_LINES = 1000          # none of the first lines (or bytes) a wire record: not a wire log
PROBE_BYTES = 64 << 20
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
KNOWN_EVENTS = {"run", "member", "phase", "attempt", "step", "audit", "audit-failed", "rejoin-wait",
                "restart", "rank-lost", "step-failed", "note", "turned-away", "idle", "end"}
WAITING, RUNNING, PREEMPTED = 0, 1, 2


# -- reading ---------------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_num(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


_raw_decode = json.JSONDecoder().raw_decode


def _decode(line: bytes) -> Any:
    """One JSON value filling the line (json.loads, a little faster: a log has many lines)."""
    text = line.decode("utf-8")
    if text[:1] in (" ", "\t", "\r", "\n"):
        text = text.strip()
    obj, end = _raw_decode(text)
    if end != len(text) and text[end:].strip():
        raise ValueError("extra data")
    return obj


def _looks_like_record(obj: Any) -> bool:
    return isinstance(obj, dict) and (isinstance(obj.get("event"), str) or (
        obj.get("dir") in ("in", "out") and isinstance(obj.get("type"), str)))


class LogReader:
    """The records of a wire log, one dict per line, read with bounds. After the iteration,
    `notes` says what was skipped (build_page puts them at the top of the page)."""

    def __init__(self, path: str):
        self.path = path
        self.skipped = 0            # lines that are not a JSON object
        self.too_long = 0
        self.cut_short = False      # the last line ends without its newline and does not parse
        self.stopped_at: int | None = None   # bytes read when MAX_READ stopped the reading
        self.records = 0

    @property
    def notes(self) -> list[str]:
        notes = []
        if self.skipped:
            notes.append(f"{self.skipped} line(s) of the log are not JSON objects: skipped")
        if self.too_long:
            notes.append(f"{self.too_long} line(s) longer than {MAX_LINE >> 20} MiB: skipped")
        if self.cut_short:
            notes.append("the log's last line is cut short (the run may have been killed while "
                         "writing it): skipped")
        if self.stopped_at is not None:
            notes.append(f"only the first {self.stopped_at >> 20} MiB of the log were read")
        return notes

    def __iter__(self) -> Iterator[dict]:
        name = shown(str(self.path))
        with open_log(self.path, "html") as f:       # a regular file only: never a fifo or a device
            yield from self._lines(f, name)
        if not self.records:
            raise WorkloadError(f"{name}: not a wire log (no message or event in it)")

    def _lines(self, f, name: str) -> Iterator[dict]:
        total = n = 0
        while True:
            if not self.records and (n >= PROBE_LINES or total >= PROBE_BYTES):
                raise WorkloadError(f"{name}: not a wire log (none of its first {n} lines is a "
                                    f"wire message or event)")
            try:
                line = f.readline(MAX_LINE + 1)
                n += 1
                total += len(line)
                if total > MAX_READ:
                    self.stopped_at = total - len(line)
                    return
                if len(line) > MAX_LINE:
                    self.too_long += 1
                    while line and not line.endswith(b"\n") and total <= MAX_READ:   # the rest, in pieces
                        line = f.readline(MAX_LINE)
                        total += len(line)
                    continue
            except OSError as e:
                raise WorkloadError(f"html {name}: {e.strerror or e}") from None
            if not line:
                return
            if not line.strip():
                continue
            try:
                obj = _decode(line)
            except (ValueError, RecursionError):
                if not line.endswith(b"\n") and not f.peek(1):
                    self.cut_short = True
                else:
                    self.skipped += 1
                continue
            if _looks_like_record(obj):
                self.records += 1
                yield obj
            else:
                self.skipped += 1


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
        return json.dumps(_clean(v), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return "(unprintable)"


def _clean(v: Any, depth: int = 0) -> Any:
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
        out = [_clean(x, depth + 1) for x in v[:MAX_LIST]]
        if len(v) > MAX_LIST:
            out.append(f"… {len(v) - MAX_LIST} more")
        return out
    if isinstance(v, dict):
        items = list(v.items())
        out = {shown(str(k)[:64]): _clean(x, depth + 1) for k, x in items[:MAX_KEYS]}
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
            row = [_clean(x.get(k)) for k in keys]
            extra = {k: x[k] for k in list(x)[:MAX_KEYS] if k not in keys}
            if extra:
                row.append(_clean(extra))
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
class _Step:
    step: int
    epoch: int
    t: float
    trace: StepTrace | None
    counters: list


class Malformed(Exception):
    pass


def _int(obj: dict, key: str, lo: int = 0, hi: int = 2 ** 53, optional: bool = False) -> Any:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not _is_int(v) or not lo <= v <= hi:
        raise Malformed(key)
    return v


def _num(obj: dict, key: str, optional: bool = False) -> Any:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not _is_num(v) or abs(v) > 1e12:
        raise Malformed(key)
    return float(v)


def _ids(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _counts(v: Any) -> dict[str, int]:
    return {k: n for k, n in v.items() if isinstance(k, str) and _is_int(n)} if isinstance(v, dict) else {}


def _words(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        return {}
    return {k: w for k, w in v.items() if isinstance(k, str) and isinstance(w, str)}


def _trace(step: int, obj: Any) -> StepTrace | None:
    if not isinstance(obj, dict):
        return None
    g = obj.get
    evicted = [p for p in g("evicted") if _is_int(p)] if isinstance(g("evicted"), list) else []
    return StepTrace(step, _ids(g("admitted")), _ids(g("scheduled")), _counts(g("executed")),
                     _words(g("sampled")), _words(g("finished")), _ids(g("preempted")),
                     _counts(g("reused")), _counts(g("published")), evicted, _counts(g("drafted")),
                     _counts(g("accepted")), _counts(g("rolled_back")))


def _ranks_text(ranks: list) -> str:
    ranks = [r for r in ranks if _is_int(r)]
    if not ranks:
        return "every rank"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:32]))


def _secs(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


# -- the one pass over the records -----------------------------------------------------------

class _Builder:
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
        self.steps: list[_Step] = []
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
        ranks = sorted({r for r in ranks or () if _is_int(r) and 0 <= r <= MAX_RANK})[:64]
        self.marks.append([MARKS.index(kind), t, dur, ranks, step if _is_int(step) else -1,
                           epoch if _is_int(epoch) else -1, text])

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
            self.hellos.append((t, rank, epoch, pid if _is_int(pid) else -1))
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
                                       and all(_is_num(x) and abs(x) < 1e12 for x in inside)):
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
            text += f": {_error_text(error)}"
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
        if _is_int(ev.get("plan_bytes")) and ev["plan_bytes"] >= 0:
            a.plan_bytes = ev["plan_bytes"]

    def _ev_step(self, ev: dict, t: float) -> None:
        step = _int(ev, "step")
        epoch = _int(ev, "epoch", 0, 2 ** 31, optional=True) or 0
        self.has_step_events = True
        if len(self.steps) >= MAX_STEPS:
            self.dropped_steps += 1
            return
        counters = ev.get("counters") if isinstance(ev.get("counters"), dict) else {}
        values = [counters.get(k) if _is_num(counters.get(k)) else None for k in COUNTERS]
        self.steps.append(_Step(step, epoch, t, _trace(step, ev.get("trace")), values))

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
        self._mark("audit-failed", t, f"audit failed: {_say(ev.get('message'))}",
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
        if _is_int(ev.get("shard_pages")):
            text += f", shard of {ev['shard_pages']} pages"
        if pids and all(_is_int(p) for p in pids):
            text += f" (pid {', '.join(map(str, pids[:16]))})"
        self._mark("restart", t, text, ranks, ev.get("step"), ev.get("epoch"))

    def _ev_rank_lost(self, ev: dict, t: float) -> None:
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else [ev.get("rank")]
        reason = ev.get("reason")
        text = f"lost ({shown(str(reason)[:40])}): {_say(ev.get('message'))}"
        if ev.get("rank") is None and not ranks:
            ranks = sorted(self.ranks)
        self._mark("lost", t, text, ranks, ev.get("step"), ev.get("epoch"))
        self._verdict(ev, f"{_ranks_text(ranks)} lost ({shown(str(reason)[:40])})")

    def _ev_step_failed(self, ev: dict, t: float) -> None:
        kind = ev.get("kind")
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        self._mark("step-failed", t, f"{_say(kind)}: {_say(ev.get('message'))}", ranks,
                   ev.get("step"), ev.get("epoch"))
        self._verdict(ev, _say(kind))

    def _verdict(self, ev: dict, verdict: str) -> None:
        """A verdict from a log without `attempt` events, where no other line will say it."""
        s, e = ev.get("step"), ev.get("epoch")
        a = self.open.get((s, e)) if _is_int(s) and _is_int(e) else None
        if a is not None and not a.closed and not a.verdict:
            a.verdict = verdict

    def _ev_note(self, ev: dict, t: float) -> None:
        rank = ev.get("rank")
        self._mark("note", t, _say(ev.get("text")), [rank] if _is_int(rank) else [], ev.get("step"),
                   ev.get("epoch"))

    def _ev_turned_away(self, ev: dict, t: float) -> None:
        counts = [ev.get(k) if isinstance(ev.get(k), dict) else {} for k in ("messages", "connections")]
        sums = [sum(n for n in c.values() if _is_int(n)) for c in counts]
        peers = ", ".join(shown(str(p))[:60] for p in list(counts[0])[:8])
        self._mark("turned-away", t, f"turned away: {sums[0]} message(s) from {len(counts[0])} peer(s) "
                   f"holding no rank{f' ({peers})' if peers else ''}, {sums[1]} connection(s) refused")


def _error_text(error: Any) -> str:
    """The end record's error object in words: "RankLost at step 3, epoch 0: rank 2 died ..."."""
    if not isinstance(error, dict):
        return _say(error)
    kind = error.get("error") or error.get("kind") or "error"
    where = ", ".join(f"{k} {error[k]}" for k in ("step", "epoch", "rank") if _is_int(error.get(k)))
    rest = {k: v for k, v in error.items() if k not in ("error", "kind", "message", "step", "epoch", "rank")}
    text = f"{_say(kind)}{f' at {where}' if where else ''}: {_say(error.get('message'))}"
    return text + (f" ({_json_text(rest)})" if rest else "")


def _say(v: Any) -> str:
    return shown(v) if isinstance(v, str) else _json_text(v)


# -- from the records to the page's data -----------------------------------------------------

class _Clock:
    """Scheduler seconds -> integer microseconds from the start of the run."""

    def __init__(self, origin: float):
        self.origin = origin

    def __call__(self, t: float | None) -> int:
        if t is None:
            return -1
        return int(round(max(-TIME_LIMIT, min(TIME_LIMIT, t - self.origin)) * 1e6))


def _offsets(b: _Builder, shared: bool) -> dict[tuple[int, int], float]:
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


def _pids(b: _Builder) -> None:
    """Each round trip's process: the latest member of its rank admitted before its plan."""
    admitted = sorted(((t, rank, pid) for t, rank, _, pid, _ in b.members), key=lambda x: x[0]) or \
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


def _data(b: _Builder, title: str, notes: list[str]) -> dict:
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
    for a in b.attempts:
        start = a.start()
        ends = [rt.back for rt in a.ranks.values() if rt.back is not None]
        end = a.end if a.end is not None else (max(ends) if ends else start)
        if start is None:
            start = end if end is not None else origin
        if end is None:
            end = start
        verdict = a.verdict or ("joined" if a.ranks and all(rt.back is not None for rt in a.ranks.values())
                                else "no answer in the log")
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
        attempts.append([a.step, a.epoch, us(start), us(end), T(verdict), a.plan_bytes, a.plan, rows])
        a.verdict = verdict

    # committed steps: their spans, counters and lines
    steps = _steps(b, committed_by_attempt)
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
    line_size = 0
    lines_dropped = 0
    prev_end = origin
    spans: list[tuple[float, float]] = []
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
        line = step_events(st.trace, PLAIN, 8) if st.trace is not None else ""
        if line_size + len(line) > LINE_BUDGET:
            lines_dropped += 1
            line = ""
        line_size += len(line)
        col["line"].append(line[:2000])
        for k, v in zip(COUNTERS, st.counters):
            counters[k].append(v)
    if not b.has_step_events:
        counters = {}

    requests = _requests(steps, spans, b, us)

    members = [[rank, epoch, pid, T(host) if host else -1, us(t)] for t, rank, epoch, pid, host in
               sorted(b.members, key=lambda m: m[0])]
    if not members:
        members = [[rank, epoch, pid, -1, us(t)] for t, rank, epoch, pid in sorted(b.hellos)]
    seen_pid: dict[int, int] = {}
    for rank, epoch, pid, _, t in members:
        if rank in seen_pid and seen_pid[rank] != pid:
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
    if _is_int(world) and 0 < world <= MAX_RANK + 1:
        ranks |= set(range(world))
    ranks_list = sorted(ranks)[:256]

    for what, n in (("plan bodies", b.plans.dropped), ("result bodies", b.results.dropped)):
        if n:
            kept = (b.plans if what == "plan bodies" else b.results).kept_to
            notes.append(f"{what} kept up to step {kept} only ({n} more not kept, to bound the page's "
                         f"size): `inferris-dist inspect WIRELOG --step K` prints any step in full")
    for n, what in ((b.dropped_attempts, "attempts"), (b.dropped_round_trips, "round trips"),
                    (b.dropped_steps, "committed steps"), (b.dropped_phases, "scheduler phases"),
                    (b.dropped_marks, "events"), (lines_dropped, "step lines"), (T.dropped, "texts")):
        if n:
            notes.append(f"{n} {what} beyond the page's bound are not shown")
    if requests["more"]:
        notes.append(f"{requests['total']} requests: lanes for the first {len(requests['ids'])} "
                     f"(the counter tracks count them all)")
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
    meta = {"name": _say(run.get("name")) if run.get("name") else "",
            "world_size": world if _is_int(world) else None,
            "rung": _say(run["rung"]) if "rung" in run else "",
            "policy": _say(run["policy"]) if "policy" in run else "",
            "faults": [_say(f) for f in run.get("faults", [])[:32]] if isinstance(run.get("faults"), list)
            else [],
            "config": {shown(str(k))[:40]: _clean(v) for k, v in list(run.get("config", {}).items())[:16]}
            if isinstance(run.get("config"), dict) else {},
            "requests": run.get("requests") if _is_int(run.get("requests")) else None,
            "scheduler_pid": run.get("scheduler_pid") if _is_int(run.get("scheduler_pid")) else None,
            "address": _say(run.get("address") or run.get("listen") or ""),
            "shared_clock": run.get("shared_clock") if isinstance(run.get("shared_clock"), bool) else None,
            "status": _say(end_status) if end_status is not None else "",
            "error": _error_text(b.end.get("error")) if b.end and b.end.get("error") is not None else "",
            "messages": b.messages, "bytes_out": b.bytes_out, "bytes_in": b.bytes_in,
            "offsets": [[r, pid, round(o * 1e6, 1)] for (r, pid), o in sorted(offsets.items())
                        if not shared][:256]}
    lo = min([0] + [a[2] for a in attempts] + [m[1] for m in marks])
    hi = max([1] + [a[3] for a in attempts] + [m[1] + m[2] for m in marks] + col["b"]
             + [us(t + d) for t, d, _, _ in phases])
    return {
        "v": 1, "title": shown(title), "meta": meta, "notes": notes, "strs": T.texts,
        "span": [lo, hi], "ranks": ranks_list, "phases": [[k, s, us(t), int(round(d * 1e6))]
                                                          for t, d, k, s in phases],
        "attempts": attempts, "plans": b.plans.rows, "results": b.results.rows,
        "plan_keys": list(PLAN_KEYS), "result_keys": list(RESULT_KEYS),
        "steps": col, "counters": counters, "requests": requests, "marks": marks, "mark_kinds": list(MARKS),
        "members": members, "handshakes": [[r, us(a), us(z)] for r, a, z in b.handshakes],
        "audits": [[r, us(a), us(z), n, s] for r, a, z, n, s in b.audits], "idle": idle,
        # from the run's first record to its first plan: the ranks being started and joining
        "startup": [0, min(a[2] for a in attempts)] if b.run is not None and attempts else None,
    }


def _steps(b: _Builder, from_attempts: bool) -> list[_Step]:
    """The committed steps in order: the step events, or (a log without them) the joined attempts,
    with the plan's request ids as what ran."""
    if not from_attempts:
        return sorted(b.steps, key=lambda s: s.t)
    steps = []
    for a in b.attempts:
        if a.verdict == "joined" and len(steps) < MAX_STEPS:
            ends = [rt.back for rt in a.ranks.values() if rt.back is not None]
            t = a.end if a.end is not None else (max(ends) if ends else a.start() or 0.0)
            body = a.plan_body if isinstance(a.plan_body, list) else []
            ids = list(dict.fromkeys(x.get("request_id") for x in body
                                     if isinstance(x, dict) and isinstance(x.get("request_id"), str)))
            trace = StepTrace(a.step, [], ids, {}, {}, {}, [], {}, {}, [], {}, {}, {})
            steps.append(_Step(a.step, a.epoch, t, trace, [None] * len(COUNTERS)))
    return sorted(steps, key=lambda s: s.t)


@dataclass
class _Lane:
    index: int
    admitted: int
    cursor: float
    segs: list = field(default_factory=list)      # flat: state, from, to, ...
    state: int = WAITING
    finished: int = -1
    reason: str = ""
    ran: int = 0
    preemptions: int = 0
    last_run: int = -1


def _requests(steps: list[_Step], spans: list[tuple[float, float]], b: _Builder, us) -> dict:
    """A lane per request (the first MAX_REQUEST_LANES): waiting, running, preempted, as the
    committed steps say, and where it finished."""
    lanes: dict[str, _Lane] = {}
    active: dict[str, _Lane] = {}
    others: set[str] = set()
    for st, (start, end) in zip(steps, spans):
        tr = st.trace
        if tr is None:
            continue
        ran = set(tr.scheduled) | set(tr.executed)
        preempted = set(tr.preempted)
        for rid in list(tr.admitted) + list(tr.scheduled):
            if rid in lanes or rid in others:
                continue
            if len(lanes) < MAX_REQUEST_LANES:
                lanes[rid] = active[rid] = _Lane(len(lanes), st.step, start)
            elif len(others) < 1_000_000:
                others.add(rid)
        for rid, lane in list(active.items()):
            if rid in preempted:
                state = PREEMPTED
                lane.preemptions += 1
            elif rid in ran:
                state = RUNNING
                lane.ran += 1
                lane.last_run = len(lane.segs)
            else:
                state = PREEMPTED if lane.state == PREEMPTED else WAITING
            seg = lane.segs
            if seg and seg[-3] == state and seg[-1] == us(lane.cursor):
                seg[-1] = us(end)
            else:
                seg += [state, us(lane.cursor), us(end)]
            lane.state, lane.cursor = state, end
            if rid in tr.finished:
                lane.finished, lane.reason = st.step, tr.finished[rid]
                del active[rid]
    if not b.has_step_events:           # no step events: nothing says when a request finished
        for lane in lanes.values():
            if lane.last_run >= 0:
                del lane.segs[lane.last_run + 3:]
    ids = list(lanes)
    return {"ids": [shown(r[:MAX_TEXT]) for r in ids],
            "lanes": [lanes[r].segs for r in ids],
            "info": [[lanes[r].admitted, lanes[r].finished, shown(lanes[r].reason[:40]), lanes[r].ran,
                      lanes[r].preemptions] for r in ids],
            "total": len(lanes) + len(others), "more": len(others)}


# -- the page ---------------------------------------------------------------------------------

def _embed(data: dict) -> str:
    """The data as JSON that cannot end its <script> element: every <, > and & escaped."""
    try:
        text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except ValueError:          # a number that is not one slipped through: JSON has no NaN
        text = json.dumps(_finite(data), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, list):
        return [_finite(x) for x in v]
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return v


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def build_page(records: Iterable[dict], title: str | None = None) -> str:
    """The page of a wire log's records (dicts as read from its lines). Never fails on what
    the records hold: what cannot be used is skipped and counted in a note on the page. If
    `records` has a `notes` attribute once iterated (LogReader), those notes lead the page's."""
    b = _Builder()
    for obj in records:
        b.add(obj)
    notes = list(getattr(records, "notes", []) or [])
    run_name = b.run.get("name") if b.run and isinstance(b.run.get("name"), str) else ""
    title = title if title else f"inferris-dist · {run_name or 'wire log'}"
    data = _data(b, title, notes)
    csp = (f"default-src 'none'; script-src '{_hash(_SCRIPT)}'; style-src '{_hash(_STYLE)}'; "
           f"img-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")
    fill = {"CSP": csp, "TITLE": html.escape(shown(title), quote=True), "STYLE": _STYLE,
            "SCRIPT": _SCRIPT, "DATA": _embed(data)}
    # one pass: what is put in (a title, the data) is never looked at again
    return re.sub(r"@(CSP|TITLE|STYLE|SCRIPT|DATA)@", lambda m: fill[m.group(1)], _HTML)


def write_page(wirelog_path: str, out_path: str, title: str | None = None) -> None:
    """Read a wire log and write its page. Bad input (no such log, not a wire log, an output
    that cannot be written) raises WorkloadError with one line saying which."""
    try:
        same = os.path.exists(out_path) and os.path.samefile(wirelog_path, out_path)
    except OSError:
        same = False
    if same:
        raise WorkloadError(f"html: {shown(str(out_path))} is the wire log itself: not overwritten")
    page = build_page(LogReader(wirelog_path), title)
    try:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise WorkloadError(f"html: cannot write {shown(str(out_path))}: {e.strerror or e}") from None



# -- the page's markup, style and script (no library, nothing fetched) --------------------------

_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="@CSP@">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="inferris-dist html">
<title>@TITLE@</title>
<link rel="icon" href="data:,">
<style>@STYLE@</style>
</head>
<body>
<header>
<h1 id="title">@TITLE@</h1>
<div id="run"></div>
<div id="notes"></div>
<div id="bar">
<button id="zout" type="button" title="zoom out (-)">&minus;</button>
<button id="zin" type="button" title="zoom in (+)">+</button>
<button id="fit" type="button" title="the whole run (0)">fit</button>
<button id="prev" type="button" title="previous step ([)">&#9664; step</button>
<button id="next" type="button" title="next step (])">step &#9654;</button>
<input id="goto" type="text" inputmode="numeric" size="7" placeholder="step K" aria-label="go to step">
<span id="help">wheel: zoom &middot; shift+wheel or wheel over the labels: scroll &middot;
drag: pan &middot; click: details</span>
<span id="legend"></span>
</div>
</header>
<main>
<div id="plot"><canvas id="cv" role="img" aria-label="the run's lanes, drawn: see the list of lanes"></canvas>
<ul id="lanes" class="sr" aria-label="lanes"></ul></div>
<aside id="detail"></aside>
</main>
<div id="tip"></div>
<script type="application/json" id="data">@DATA@</script>
<script>@SCRIPT@</script>
</body>
</html>
"""

_STYLE = """
html, body { margin: 0; height: 100%; }
body { display: flex; flex-direction: column; color: #1d232b; background: #f6f7f9;
  font: 13px/1.35 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { padding: 6px 10px 5px; background: #fff; border-bottom: 1px solid #d5dae1; }
h1 { font-size: 15px; margin: 0 0 2px; font-weight: 600; }
#run { color: #3a4452; }
#run .bad { color: #b3261e; font-weight: 600; }
#run .ok { color: #1f7a3f; font-weight: 600; }
.note { background: #fff4d6; border: 1px solid #e6c96a; padding: 1px 6px; margin-top: 3px;
  border-radius: 3px; }
#bar { display: flex; gap: 6px; align-items: center; margin-top: 5px; flex-wrap: wrap; }
button, input { font: inherit; padding: 1px 8px; border: 1px solid #b3bcc8; background: #f2f4f7;
  border-radius: 3px; }
button { cursor: pointer; }
button:hover { background: #e4e9f0; }
#help { color: #667; font-size: 12px; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; margin: 0; padding: 0; }
#legend { font-size: 12px; color: #333; }
.sw { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 9px; vertical-align: -1px;
  border-radius: 2px; }
main { flex: 1; display: flex; min-height: 0; }
#plot { flex: 1; position: relative; min-width: 0; background: #fff; }
#cv { position: absolute; left: 0; top: 0; width: 100%; height: 100%; cursor: grab; }
#cv.dragging { cursor: grabbing; }
#detail { width: 440px; flex: none; overflow: auto; background: #fff; border-left: 1px solid #d5dae1;
  padding: 6px 10px 20px; font-size: 12.5px; }
#detail h2 { font-size: 15px; margin: 2px 0 4px; }
#detail h3 { font-size: 12.5px; margin: 10px 0 2px; font-weight: 600; }
#detail .sub { color: #5b6574; }
#detail .line { background: #f3f5f8; padding: 3px 5px; border-radius: 3px; margin: 3px 0; }
#detail table { border-collapse: collapse; margin: 3px 0 5px; }
#detail td, #detail th { padding: 0 8px 0 0; text-align: left; white-space: nowrap; vertical-align: top; }
#detail th { color: #6b7482; font-weight: normal; border-bottom: 1px solid #e1e5ea; }
#detail .n { text-align: right; }
#detail table.wrap td:last-child { white-space: normal; }
#detail .ev { margin: 1px 0 1px 8px; }
#detail button { margin: 4px 0; }
.mono, #detail table { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-size: 11.5px; }
.join { margin: 2px 0 4px; font-weight: 600; }
.ok { color: #1f7a3f; }
.bad { color: #b3261e; }
#tip { position: fixed; pointer-events: none; background: rgba(255, 255, 255, 0.97);
  border: 1px solid #9aa4b2; box-shadow: 0 2px 6px rgba(0, 0, 0, 0.18); padding: 4px 7px;
  font-size: 12px; max-width: 480px; display: none; z-index: 5; white-space: pre-wrap; }
#tip b { font-weight: 600; }
"""

_SCRIPT = r"""
(function () {
'use strict';
var D;
try {
  D = JSON.parse(document.getElementById('data').textContent);
} catch (err) {
  document.getElementById('run').textContent = 'the page holds no readable data: ' + err;
  return;
}
const $ = (id) => document.getElementById(id);
const S = D.strs || [];
const txt = (i) => (Number.isInteger(i) && i >= 0 && i < S.length ? S[i] : '');

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function add(parent, tag, cls, text) {
  const e = el(tag, cls, text);
  parent.appendChild(e);
  return e;
}
function hb(n) {
  if (!(n >= 0)) return '-';
  if (n < 1024) return n + ' B';
  if (n < 1048576) return (n / 1024).toFixed(1) + ' kB';
  return (n / 1048576).toFixed(1) + ' MB';
}
function ft(us) {                       // a duration in microseconds
  if (!(us === us)) return '-';
  const a = Math.abs(us);
  if (a < 1000) return (a < 10 ? us.toFixed(1) : us.toFixed(0)) + ' \u00b5s';
  if (a < 1e6) return (us / 1000).toFixed(a < 1e4 ? 2 : 1) + ' ms';
  return (us / 1e6).toFixed(a < 1e8 ? 3 : 1) + ' s';
}
const at = (us) => '+' + ft(us);        // a time since the run began
function lowerBound(arr, x) {           // the first index whose value is >= x
  let lo = 0, hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}
function ranksText(rs) {
  if (!rs.length) return 'no rank';
  const run = rs.length > 2 && rs.every((r, i) => r === rs[0] + i);
  if (run) return 'ranks ' + rs[0] + '-' + rs[rs.length - 1];
  return (rs.length === 1 ? 'rank ' : 'ranks ') + rs.join(', ');
}
function vt(v) {                        // a value of a plan or a result, as text
  if (v === null || v === undefined) return '-';
  if (Array.isArray(v)) {
    if (!v.length) return '-';
    return v.every(Number.isInteger) ? v.join(',') : JSON.stringify(v);
  }
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

// -- the model -------------------------------------------------------------------------------
const KINDS = D.mark_kinds || [];
const span = D.span || [0, 1];
const ranks = D.ranks || [];
const laneOfRank = new Map();
ranks.forEach((r, i) => laneOfRank.set(r, i));

const attempts = (D.attempts || []).map((r, i) => {
  const a = r[2];
  const rts = r[7].map((w) => {
    const sent = a + w[1];
    const back = w[2] >= 0 ? sent + w[2] : NaN;
    let inside = null;
    if (w.length >= 9 && w[5] !== null && back === back) {
      const rc = sent + w[5], dc = rc + w[6], ex = dc + w[7], en = ex + w[8];
      inside = [rc, dc, ex, en];
    }
    return {rank: w[0], sent: sent, back: back, bytes: w[3], result: w[4], inside: inside,
            plan: w.length > 9 ? w[9] : r[6]};
  });
  const verdict = txt(r[4]);
  return {i: i, step: r[0], epoch: r[1], a: a, b: Math.max(a, r[3]), verdict: verdict,
          ok: verdict === 'joined', planBytes: r[5], plan: r[6], rts: rts};
});
const attemptsOf = new Map();
for (const x of attempts) {
  if (!attemptsOf.has(x.step)) attemptsOf.set(x.step, []);
  attemptsOf.get(x.step).push(x);
}
const byStart = attempts.slice().sort((p, q) => p.a - q.a);
const failed = byStart.filter((x) => !x.ok);
const failedA = Float64Array.from(failed, (x) => x.a);
const failedMax = failed.reduce((m, x) => Math.max(m, x.b - x.a), 0);

const ST = D.steps || {step: [], epoch: [], a: [], b: [], line: []};
const nSteps = ST.step.length;
const stepA = Float64Array.from(ST.a), stepB = Float64Array.from(ST.b);
let stepMax = 0;
for (let i = 0; i < nSteps; i++) stepMax = Math.max(stepMax, stepB[i] - stepA[i]);
const stepIdx = new Map();
for (let i = 0; i < nSteps; i++) if (!stepIdx.has(ST.step[i])) stepIdx.set(ST.step[i], i);
const idle = D.idle || [];
const idleA = Float64Array.from(idle, (r) => r[2]);
const idleMax = idle.reduce((m, r) => Math.max(m, r[3] - r[2]), 0);
const stepList = Array.from(new Set(ST.step.concat(attempts.map((x) => x.step)))).sort((p, q) => p - q);

const phases = (D.phases || []).slice().sort((p, q) => p[2] - q[2]);
const phaseA = Float64Array.from(phases, (r) => r[2]);
const phaseMax = phases.reduce((m, r) => Math.max(m, r[3]), 0);
const PHASE = ['prepare', 'execute', 'commit', 'recover'];
const COL = {prepare: '#5b8def', execute: '#f0a030', commit: '#3fae6a', recover: '#e0504a',
  rt: '#c6d4e9', rtFail: '#f2a09a', rtLost: '#f6c9c5', decode: '#8e6bd1', exec: '#2a9d8f',
  encode: '#d9a400', audit: '#7b8fe0', hand: '#a9dbb3', wait: '#f7c98b', lost: '#d62728',
  restart: '#ef7d0d', note: '#7d8590', peer: '#9b4dca', replaced: '#2f9e44', end: '#333',
  waiting: '#ead9a6', running: '#4e9a6a', preempted: '#ec8f43', grid: '#eef0f3'};

const marks = (D.marks || []).map((r, i) => ({i: i, kind: KINDS[r[0]] || '?', t: r[1], dur: r[2],
  ranks: r[3], step: r[4], epoch: r[5], text: txt(r[6])}));
const RANKED = new Set(['lost', 'restart', 'replaced', 'note', 'audit-failed', 'rejoin-wait',
  'refused']);
const TOP = new Set(['lost', 'restart', 'step-failed', 'audit', 'audit-failed', 'end']);
const stepMarks = marks.filter((m) => TOP.has(m.kind));
const schedMarks = marks.filter((m) => !m.ranks.length && !TOP.has(m.kind));
const markCount = {};
for (const m of marks) markCount[m.kind] = (markCount[m.kind] || 0) + 1;
const epochStarts = [[span[0], 0]];
for (const m of marks) if (m.kind === 'restart' && m.epoch >= 0) epochStarts.push([m.t, m.epoch]);
epochStarts.sort((p, q) => p[0] - q[0]);
function epochAt(t) {
  let e = epochStarts[0][1];
  for (const s of epochStarts) if (s[0] <= t) e = s[1];
  return e;
}

// each rank: its round trips (sorted by send), processes, audits, joins, waits and marks
const members = (D.members || []).slice().sort((p, q) => p[4] - q[4]);
const R = ranks.map((r) => ({rank: r, list: [], audits: [], hands: [], waits: [], marks: [],
  bands: [], pids: [], host: ''}));
for (const x of attempts) {
  for (const rt of x.rts) {
    const L = R[laneOfRank.get(rt.rank)];
    if (L) L.list.push({x: x, rt: rt});
  }
}
for (const L of R) {
  L.list.sort((p, q) => p.rt.sent - q.rt.sent);
  const n = L.list.length;
  L.st = new Float64Array(n);
  L.en = new Float64Array(n);
  L.maxDur = 0;
  L.list.forEach((it, j) => {
    const e = it.rt.back === it.rt.back ? it.rt.back : Math.max(it.x.b, it.rt.sent);
    L.st[j] = it.rt.sent;
    L.en[j] = e;
    L.maxDur = Math.max(L.maxDur, e - it.rt.sent);
  });
}
for (const r of D.audits || []) {
  const L = R[laneOfRank.get(r[0])];
  if (L) L.audits.push({a: r[1], b: Math.max(r[1], r[2]), bytes: r[3], step: r[4]});
}
for (const r of D.handshakes || []) {
  const L = R[laneOfRank.get(r[0])];
  if (L) L.hands.push({a: r[1], b: Math.max(r[1], r[2])});
}
for (const m of marks) {
  if (!RANKED.has(m.kind)) continue;
  for (const r of m.ranks) {
    const L = R[laneOfRank.get(r)];
    if (!L) continue;
    if (m.kind === 'rejoin-wait') L.waits.push(m); else L.marks.push(m);
  }
}
const lastT = Math.max(span[1], 0);
for (const L of R) {
  L.audits.sort((p, q) => p.a - q.a);
  L.hands.sort((p, q) => p.a - q.a);
  const own = members.filter((m) => m[0] === L.rank);
  const losses = L.marks.filter((m) => m.kind === 'lost').map((m) => m.t);
  own.forEach((m, j) => {
    let b = j + 1 < own.length ? own[j + 1][4] : lastT;
    for (const t of losses) if (t > m[4] && t < b) b = t;
    const host = txt(m[3]);
    if (host) L.host = host;
    if (!L.pids.length || L.pids[L.pids.length - 1] !== m[2]) L.pids.push(m[2]);
    // one band per process and epoch
    const cuts = epochStarts.filter((s) => s[0] > m[4] && s[0] < b).map((s) => s[0]);
    let a = m[4];
    for (const c of cuts.concat([b])) {
      const e = epochAt(a);
      L.bands.push({a: a, b: c, pid: m[2], host: host, epoch: Math.max(e, m[1])});
      a = c;
    }
  });
}

// counter tracks
function series(t, values) {
  const v = Float64Array.from(values, (x) => (typeof x === 'number' ? x : NaN));
  let max = 0;
  for (const x of v) if (x > max) max = x;
  return {t: t, v: v, max: max};
}
const C = D.counters || {};
const attT = Float64Array.from(byStart, (x) => x.a);
const TRACKS = [];
function track(label, parts) {
  const ss = parts.filter((p) => p[0]);
  if (!ss.length) return;
  const max = Math.max(1, ...ss.map((p) => p[0].max));
  TRACKS.push({label: label, parts: ss, max: max});
}
const cs = (k) => (C[k] ? series(stepB, C[k]) : null);
track('requests', [[cs('requests_running'), COL.running, 'running'],
  [cs('requests_waiting'), '#c79a1e', 'waiting'], [cs('requests_preempted'), COL.preempted, 'preempted']]);
track('batch tokens', [[cs('batch_tokens'), '#5b8def', 'batch tokens']]);
track('pages', [[cs('pages_free'), '#3fae6a', 'free'], [cs('pages_cached'), '#8e6bd1', 'cached']]);
track('wire bytes', [[series(attT, byStart.map((x) => (x.planBytes >= 0 ? x.planBytes : null))),
  '#5b8def', 'plan'], [series(attT, byStart.map((x) => x.rts.reduce((m, r) => Math.max(m, r.bytes), -1))
  .map((b) => (b >= 0 ? b : null))), '#e0504a', 'result']]);

const RQ = D.requests || {ids: [], lanes: [], info: [], total: 0, more: 0};

// -- the lanes -------------------------------------------------------------------------------
const LANES = [];
function lane(kind, h, label, extra) {
  LANES.push(Object.assign({kind: kind, h: h, label: label, y: 0}, extra || {}));
}
lane('steps', 30, 'steps');
lane('sched', 24, 'scheduler');
lane('head', 18, 'ranks: ' + ranks.length);
R.forEach((L) => lane('rank', 44, 'rank ' + L.rank, {R: L}));
if (TRACKS.length) {
  lane('head', 18, 'counters');
  TRACKS.forEach((tk) => lane('counter', 48, tk.label, {track: tk}));
}
lane('head', 18, RQ.more ? 'requests: the first ' + RQ.ids.length + ' of ' + RQ.total
  : 'requests: ' + RQ.ids.length);
RQ.ids.forEach((id, i) => lane('req', 13, id, {req: i}));
let totalH = 0;
for (const L of LANES) { L.y = totalH; totalH += L.h; }
// the lanes as text too (the canvas is a picture): for screen readers, find-in-page and tests
for (const L of LANES) {
  if (L.kind !== 'rank' && L.kind !== 'sched' && L.kind !== 'steps') continue;
  const li = document.createElement('li');
  li.textContent = L.label + (L.R && L.R.pids.length ? ': pid ' + L.R.pids.join(' \u2192 ') : '')
    + (L.R && L.R.host ? ' @ ' + L.R.host : '');
  $('lanes').appendChild(li);
}

// -- drawing ---------------------------------------------------------------------------------
const cv = $('cv'), ctx = cv.getContext('2d'), plot = $('plot');
const GX = 172, AX = 24;
const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif';
let W = 600, H = 400, dpr = 1;
let v0 = span[0], v1 = span[1], sy = 0;
let selStep = null, selReq = null, pending = false, frames = 0;
let stats = {frames: 0, marks: {}, roundTrips: 0, steps: 0, phases: 0, requests: 0, lanes: 0};
const X = (t) => GX + (t - v0) * (W - GX) / (v1 - v0);
const T = (x) => v0 + (x - GX) * (v1 - v0) / (W - GX);

function hatch(color) {
  const c = document.createElement('canvas');
  c.width = c.height = 6;
  const g = c.getContext('2d');
  g.strokeStyle = color;
  g.lineWidth = 1.5;
  g.beginPath();
  g.moveTo(0, 6); g.lineTo(6, 0); g.moveTo(-1, 1); g.lineTo(1, -1); g.moveTo(5, 7); g.lineTo(7, 5);
  g.stroke();
  return ctx.createPattern(c, 'repeat');
}
const HATCH = {lost: hatch('#d62728'), idle: hatch('#b7bec8'), wait: hatch('#e07b00')};

function resize() {
  const r = plot.getBoundingClientRect();
  dpr = window.devicePixelRatio || 1;
  W = Math.max(GX + 100, r.width);
  H = Math.max(AX + 40, r.height);
  cv.width = Math.round(W * dpr);
  cv.height = Math.round(H * dpr);
  clampY();
  draw();
}
function dirty() {
  if (!pending) { pending = true; requestAnimationFrame(draw); }
}
function clampY() { sy = Math.max(0, Math.min(sy, Math.max(0, totalH - (H - AX) + 8))); }
function clampX() {
  const full = Math.max(10, span[1] - span[0]);
  let w = Math.max(2, Math.min(v1 - v0, full * 1.5));
  let c = (v0 + v1) / 2;
  c = Math.max(span[0] - full * 0.25, Math.min(span[1] + full * 0.25, c));
  v0 = c - w / 2; v1 = c + w / 2;
}
function fit() {
  const full = Math.max(10, span[1] - span[0]);
  v0 = span[0] - full * 0.01; v1 = span[1] + full * 0.015;
  dirty();
}
function zoom(f, x) {
  const t = T(x === undefined ? (GX + W) / 2 : x);
  v0 = t - (t - v0) * f; v1 = t + (v1 - t) * f;
  clampX(); dirty();
}
function pan(dx) {
  const d = dx * (v1 - v0) / (W - GX);
  v0 += d; v1 += d; clampX(); dirty();
}

function label(text, x, y, maxW, color) {
  if (maxW < 12) return;
  let s = text;
  if (ctx.measureText(s).width > maxW) {
    let lo = 0, hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(s.slice(0, mid) + '\u2026').width <= maxW) lo = mid; else hi = mid - 1;
    }
    if (lo < 1) return;
    s = s.slice(0, lo) + '\u2026';
  }
  if (color) ctx.fillStyle = color;
  ctx.fillText(s, x, y);
}
function box(a, b, y, h, fill) {          // a span drawn; how wide it shows (0: not at all)
  let x0 = X(a), x1 = X(b);
  if (x1 < GX || x0 > W) return 0;
  if (x1 - x0 < 1) x1 = x0 + 1;
  ctx.fillStyle = fill;
  ctx.fillRect(x0, y, x1 - x0, h);
  return Math.min(W, x1) - Math.max(GX, x0);
}

function icon(kind, x, y, s) {
  ctx.save();
  ctx.lineWidth = 2;
  if (kind === 'lost' || kind === 'step-failed') {
    ctx.strokeStyle = COL.lost;
    ctx.beginPath();
    ctx.moveTo(x - s, y - s); ctx.lineTo(x + s, y + s); ctx.moveTo(x + s, y - s); ctx.lineTo(x - s, y + s);
    ctx.stroke();
  } else if (kind === 'restart' || kind === 'replaced') {
    ctx.fillStyle = kind === 'restart' ? COL.restart : COL.replaced;
    ctx.beginPath();
    ctx.moveTo(x, y - s - 1); ctx.lineTo(x + s + 1, y + s); ctx.lineTo(x - s - 1, y + s); ctx.closePath();
    ctx.fill();
  } else if (kind === 'audit' || kind === 'audit-failed') {
    ctx.fillStyle = kind === 'audit' ? COL.audit : COL.lost;
    ctx.beginPath();
    ctx.moveTo(x, y - s); ctx.lineTo(x + s, y); ctx.lineTo(x, y + s); ctx.lineTo(x - s, y); ctx.closePath();
    ctx.fill();
  } else if (kind === 'turned-away' || kind === 'refused') {
    ctx.fillStyle = COL.peer;
    ctx.fillRect(x - s + 1, y - s + 1, 2 * s - 2, 2 * s - 2);
  } else if (kind === 'end') {
    ctx.strokeStyle = COL.end;
    ctx.beginPath(); ctx.moveTo(x, y - s - 2); ctx.lineTo(x, y + s + 2); ctx.stroke();
    ctx.fillStyle = COL.end;
    ctx.fillRect(x, y - s - 2, s + 2, s);
  } else {
    ctx.fillStyle = COL.note;
    ctx.beginPath(); ctx.arc(x, y, s - 1, 0, 6.3); ctx.fill();
  }
  ctx.restore();
}
const WORD = {lost: 'lost', restart: 'restart', replaced: 'new pid', 'step-failed': 'failed',
  'audit-failed': 'audit failed', end: 'end'};

function drawMarks(list, y, h, seen, words) {
  const tol = 4 * (v1 - v0) / (W - GX);
  let lastX = -1e9, textEnd = -1e9;
  for (const m of list) {
    if (m.t < v0 - tol || m.t > v1 + tol || m.kind === 'rejoin-wait') continue;
    const x = X(m.t);
    seen.add(m.i);
    if (x - lastX < 2 && m.kind !== 'lost' && m.kind !== 'restart') continue;
    lastX = x;
    icon(m.kind, x, y + h / 2, 4);
    if (words && WORD[m.kind]) {
      ctx.font = 'bold ' + FONT;
      const lx = Math.max(x + 7, textEnd + 6);          // beside the last word, never over it
      const w = ctx.measureText(WORD[m.kind]).width;
      if (lx - x < 90) {
        label(WORD[m.kind], lx, y + h / 2, 80, m.kind === 'restart' ? '#b35900'
          : m.kind === 'replaced' ? '#1f6f30' : m.kind === 'end' ? COL.end : COL.lost);
        textEnd = lx + w;
      }
      ctx.font = FONT;
    }
  }
}

function drawSteps(y, h, st) {
  let i = lowerBound(stepA, v0 - stepMax);
  ctx.textAlign = 'center';
  for (; i < nSteps && stepA[i] <= v1; i++) {
    const w = box(stepA[i], stepB[i], y + 3, h - 6, ST.step[i] % 2 ? '#c9d2de' : '#dbe1ea');
    if (!w) continue;
    st.steps++;
    if (w > 22) {
      const x0 = Math.max(GX, X(stepA[i])), x1 = Math.min(W, X(stepB[i]));
      label(String(ST.step[i]), (x0 + x1) / 2, y + h / 2, x1 - x0 - 4, '#223');
    }
  }
  ctx.textAlign = 'left';
  for (let j = lowerBound(idleA, v0 - idleMax); j < idle.length && idleA[j] <= v1; j++) {
    const r = idle[j];
    const w = box(r[2], r[3], y + 5, h - 10, HATCH.idle);
    if (w > 40) {
      label('idle ' + (r[0] === r[1] ? r[0] : r[0] + '-' + r[1]), Math.max(GX, X(r[2])) + 3, y + h / 2,
        w - 6, '#556');
    }
  }
  for (let j = lowerBound(failedA, v0 - failedMax); j < failed.length && failedA[j] <= v1; j++) {
    const x = failed[j];
    const w = box(x.a, x.b, y + h / 2, h / 2 - 3, '#e0504a');
    if (w > 50) label('step ' + x.step + ' failed', Math.max(GX, X(x.a)) + 3, y + h * 0.75, w - 6, '#fff');
  }
  if (selStep !== null) {
    const s = stepSpan(selStep);
    if (s) {
      ctx.strokeStyle = '#1d4ed8'; ctx.lineWidth = 2;
      ctx.strokeRect(X(s[0]), y + 2, Math.max(2, X(s[1]) - X(s[0])), h - 4);
    }
  }
}

function drawSched(y, h, st, seen) {
  let i = lowerBound(phaseA, v0 - phaseMax);
  let lastX = -1e9;
  for (; i < phases.length && phaseA[i] <= v1; i++) {
    const r = phases[i];
    const x0 = X(r[2]), x1 = X(r[2] + r[3]);
    if (x1 < GX) continue;
    if (x1 - x0 < 1 && x0 - lastX < 1) continue;
    lastX = x0;
    st.phases++;
    const w = box(r[2], r[2] + r[3], y + 3, h - 6, COL[PHASE[r[0]]] || '#999');
    if (w > 46) label(PHASE[r[0]] + ' ' + r[1], Math.max(GX, x0) + 3, y + h / 2, w - 6, '#fff');
  }
  if (D.startup && D.startup[1] > D.startup[0]) {
    const w = box(D.startup[0], D.startup[1], y + 5, h - 10, HATCH.idle);
    const x0 = Math.max(GX, X(D.startup[0])) + 3;
    if (w > 90) label('start-up: the ranks join', x0, y + h / 2, w - 6, '#445');
  }
  for (const m of schedMarks) {
    if (m.kind === 'rejoin-wait' && m.t <= v1 && m.t + m.dur >= v0) {
      box(m.t, m.t + m.dur, y + 3, h - 6, HATCH.wait);
      seen.add(m.i);
    }
  }
  drawMarks(schedMarks, y, h, seen, false);
}

function drawRank(L, y, h, st, seen) {
  const sh = 12;
  ctx.fillStyle = laneOfRank.get(L.rank) % 2 ? '#fbfcfd' : '#ffffff';
  ctx.fillRect(GX, y, W - GX, h);
  for (const b of L.bands) {
    const w = box(b.a, b.b, y + 1, sh, b.epoch % 2 ? '#d8e2f0' : '#e9eef5');
    if (!w) continue;
    const x0 = Math.max(GX, X(b.a));
    ctx.fillStyle = '#7a8799';
    ctx.fillRect(X(b.a), y + 1, 1, sh);
    const room = Math.min(W, X(b.b)) - x0 - 5;
    const long = 'pid ' + b.pid + ' \u00b7 epoch ' + b.epoch + (b.host ? ' \u00b7 ' + b.host : '');
    const short = 'pid ' + b.pid + ' \u00b7 e' + b.epoch;
    label(ctx.measureText(long).width <= room ? long : ctx.measureText(short).width <= room ? short
      : b.pid + ' e' + b.epoch, x0 + 3, y + 1 + sh / 2, room, '#334155');
  }
  const top = y + sh + 3, rh = h - sh - 6;
  for (const s of L.hands) box(s.a, s.b, top, rh, COL.hand);
  for (const m of L.waits) {
    if (m.t > v1 || m.t + m.dur < v0) continue;
    const w = box(m.t, m.t + m.dur, top, rh, HATCH.wait);
    seen.add(m.i);
    if (w > 70) label('waiting to rejoin', Math.max(GX, X(m.t)) + 3, top + rh / 2, w - 6, '#7a3d00');
  }
  const n = L.st.length;
  let j = lowerBound(L.st, v0 - L.maxDur);
  let lastX = -1e9;
  for (; j < n && L.st[j] <= v1; j++) {
    const x0 = X(L.st[j]), x1 = X(L.en[j]);
    if (x1 < GX) continue;
    const it = L.list[j];
    const lost = !(it.rt.back === it.rt.back);
    const w = x1 - x0;
    if (w < 1 && x0 - lastX < 1 && it.x.ok) continue;
    lastX = x0;
    st.roundTrips++;
    ctx.fillStyle = lost ? HATCH.lost : it.x.ok ? COL.rt : COL.rtFail;
    ctx.fillRect(x0, top, Math.max(1, w), rh);
    if (lost) {
      ctx.strokeStyle = COL.lost; ctx.lineWidth = 1;
      ctx.strokeRect(x0 + 0.5, top + 0.5, Math.max(1, w - 1), rh - 1);
    }
    const ins = it.rt.inside;
    if (ins && w > 5) {
      const iy = top + rh * 0.42, ih = rh * 0.58;
      box(ins[0], ins[1], iy, ih, COL.decode);
      box(ins[1], ins[2], iy, ih, COL.exec);
      box(ins[2], ins[3], iy, ih, COL.encode);
    }
    if (w > 60) {
      label('step ' + it.x.step + (it.x.ok ? '' : ': ' + it.x.verdict), Math.max(GX, x0) + 3,
        top + rh * 0.22, Math.min(W, x1) - Math.max(GX, x0) - 6, '#223');
    }
  }
  for (const s of L.audits) {
    if (s.b < v0 || s.a > v1) continue;
    const w = box(s.a, s.b, top + rh * 0.25, rh * 0.5, COL.audit);
    if (w > 40) label('audit', Math.max(GX, X(s.a)) + 3, top + rh / 2, w - 6, '#fff');
  }
  drawMarks(L.marks, y + sh, h - sh, seen, true);
}

function drawCounter(tk, y, h) {
  ctx.fillStyle = '#fcfcfd';
  ctx.fillRect(GX, y, W - GX, h);
  const y0 = y + 4, yh = h - 8;
  for (const p of tk.parts) {
    const s = p[0], t = s.t, v = s.v, n = t.length;
    if (!n) continue;
    ctx.strokeStyle = p[1];
    ctx.lineWidth = 1.4;
    ctx.beginPath();
    let i = Math.max(0, lowerBound(t, v0) - 1);
    let started = false, lastY = 0;
    for (; i < n; i++) {
      const val = v[i];
      if (!(val === val)) continue;
      const x = X(t[i]);
      const yy = y0 + yh - (val / tk.max) * yh;
      if (!started) { ctx.moveTo(Math.max(GX, x), yy); started = true; } else {
        ctx.lineTo(x, lastY); ctx.lineTo(x, yy);
      }
      lastY = yy;
      if (x > W) break;
    }
    if (started) ctx.lineTo(Math.min(W, X(t[n - 1])), lastY);
    ctx.stroke();
  }
}

function drawRequest(L, y, h, st) {
  const segs = RQ.lanes[L.req] || [];
  const fill = [COL.waiting, COL.running, COL.preempted];
  let lastX = -1e9;
  for (let k = 0; k + 2 < segs.length; k += 3) {
    if (segs[k + 2] < v0 || segs[k + 1] > v1) continue;
    const x0 = X(segs[k + 1]);
    if (X(segs[k + 2]) - x0 < 1 && x0 - lastX < 1) continue;
    lastX = x0;
    box(segs[k + 1], segs[k + 2], y + 2, h - 3, fill[segs[k]] || '#ccc');
    st.requests++;
  }
  const info = RQ.info[L.req];
  if (info && info[1] >= 0 && segs.length) {
    const x = X(segs[segs.length - 1]);
    if (x >= GX && x <= W) { ctx.fillStyle = '#222'; ctx.fillRect(x - 1, y + 1, 2, h - 1); }
  }
}

function drawAxis() {
  ctx.fillStyle = '#f3f5f8';
  ctx.fillRect(0, 0, W, AX);
  ctx.strokeStyle = '#cfd5dd';
  ctx.beginPath(); ctx.moveTo(0, AX - 0.5); ctx.lineTo(W, AX - 0.5); ctx.stroke();
  const ticks = tickList();
  ctx.fillStyle = '#445';
  ctx.textAlign = 'left';
  for (const t of ticks) {
    const x = X(t);
    ctx.fillRect(x, AX - 6, 1, 6);
    label(ft(t), x + 3, AX / 2 - 1, 90, '#445');
  }
  ctx.fillStyle = '#556';
  label('time since the run began', 8, AX / 2 - 1, GX - 12, '#556');
}
function tickList() {
  const want = Math.max(2, (W - GX) / 110);
  const raw = (v1 - v0) / want;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw) || 10 * p;
  const out = [];
  for (let t = Math.ceil(v0 / step) * step; t <= v1 && out.length < 200; t += step) out.push(t);
  return out;
}

function stepSpan(k) {
  let a = Infinity, b = -Infinity;
  const i = stepIdx.get(k);
  if (i !== undefined) { a = stepA[i]; b = stepB[i]; }
  for (const x of attemptsOf.get(k) || []) { a = Math.min(a, x.a); b = Math.max(b, x.b); }
  for (const r of idle) if (r[0] <= k && k <= r[1]) { a = Math.min(a, r[2]); b = Math.max(b, r[3]); }
  return a <= b ? [a, b] : null;
}

function draw() {
  pending = false;
  frames++;
  const st = {frames: frames, marks: {}, roundTrips: 0, steps: 0, phases: 0, requests: 0, lanes: 0};
  const seen = new Set();
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, W, H);
  ctx.font = FONT;
  ctx.textBaseline = 'middle';
  ctx.save();
  ctx.beginPath(); ctx.rect(GX, AX, W - GX, H - AX); ctx.clip();
  ctx.fillStyle = COL.grid;
  for (const t of tickList()) ctx.fillRect(X(t), AX, 1, H - AX);
  if (selStep !== null) {
    const s = stepSpan(selStep);
    if (s) {
      ctx.fillStyle = 'rgba(59, 130, 246, 0.10)';
      ctx.fillRect(X(s[0]), AX, Math.max(2, X(s[1]) - X(s[0])), H - AX);
    }
  }
  for (const L of LANES) {
    const y = L.y - sy + AX;
    if (y + L.h < AX || y > H) continue;
    st.lanes++;
    if (L.kind === 'steps') {
      drawSteps(y, L.h, st);
      drawMarks(stepMarks, y, 12, seen, false);
    } else if (L.kind === 'sched') drawSched(y, L.h, st, seen);
    else if (L.kind === 'rank') drawRank(L.R, y, L.h, st, seen);
    else if (L.kind === 'counter') drawCounter(L.track, y, L.h);
    else if (L.kind === 'req') drawRequest(L, y, L.h, st);
    else if (L.kind === 'head') { ctx.fillStyle = '#eef1f5'; ctx.fillRect(GX, y, W - GX, L.h); }
    ctx.fillStyle = '#e6e9ee';
    ctx.fillRect(GX, y + L.h - 1, W - GX, 1);
  }
  // the losses and restarts, across every lane
  for (const m of marks) {
    if ((m.kind !== 'lost' && m.kind !== 'restart') || m.t < v0 || m.t > v1) continue;
    ctx.fillStyle = m.kind === 'lost' ? 'rgba(214, 39, 40, 0.45)' : 'rgba(239, 125, 13, 0.45)';
    ctx.fillRect(X(m.t), AX, 1, H - AX);
  }
  ctx.restore();
  drawGutter();
  drawAxis();
  for (const i of seen) { const k = marks[i].kind; st.marks[k] = (st.marks[k] || 0) + 1; }
  stats = st;
}

function drawGutter() {
  ctx.fillStyle = '#f7f8fa';
  ctx.fillRect(0, AX, GX, H - AX);
  ctx.fillStyle = '#d5dae1';
  ctx.fillRect(GX - 1, AX, 1, H - AX);
  ctx.textAlign = 'left';
  for (const L of LANES) {
    const y = L.y - sy + AX;
    if (y + L.h < AX || y > H) continue;
    if (L.kind === 'head') {
      ctx.fillStyle = '#e6eaf0';
      ctx.fillRect(0, y, GX - 1, L.h);
      ctx.font = 'bold ' + FONT;
      label(L.label, 8, y + L.h / 2, W - 16, '#334');       // over the lane's empty plot too
      ctx.font = FONT;
    } else if (L.kind === 'rank') {
      ctx.font = 'bold ' + FONT;
      label(L.label, 10, y + 11, GX - 16, '#223');
      ctx.font = FONT;
      const pids = L.R.pids.length ? 'pid ' + L.R.pids.slice(-3).join(' \u2192 ') : '';
      label(pids, 10, y + 24, GX - 16, '#556');
      if (L.R.host) label('@ ' + L.R.host, 10, y + 36, GX - 16, '#556');
    } else if (L.kind === 'counter') {
      label(L.label, 10, y + 10, GX - 16, '#223');
      let x = 10;
      for (const p of L.track.parts.length > 1 ? L.track.parts : []) {
        ctx.fillStyle = p[1];
        ctx.fillRect(x, y + 22, 8, 8);
        label(p[2], x + 11, y + 26, 70, '#445');
        x += 16 + ctx.measureText(p[2]).width;
        if (x > GX - 30) break;
      }
      label('max ' + fmtMax(L.track), 10, y + 39, GX - 16, '#778');
    } else if (L.kind === 'req') {
      const info = RQ.info[L.req];
      const done = info && info[1] >= 0;
      label(L.label, 14, y + L.h / 2, GX - 20, selReq === L.req ? '#1d4ed8' : done ? '#223' : '#8a5a00');
    } else {
      ctx.font = 'bold ' + FONT;
      label(L.label, 10, y + L.h / 2, GX - 16, '#223');
      ctx.font = FONT;
    }
    ctx.fillStyle = '#e6e9ee';
    ctx.fillRect(0, y + L.h - 1, GX - 1, 1);
  }
}
function fmtMax(tk) {
  return tk.label === 'wire bytes' ? hb(tk.max) : String(tk.max);
}

// -- what is under the pointer ---------------------------------------------------------------
function laneAt(y) {
  if (y < AX) return null;
  const yy = y - AX + sy;
  for (const L of LANES) if (yy >= L.y && yy < L.y + L.h) return L;
  return null;
}
function nearMark(list, t, tol) {
  let best = null, bd = Infinity;
  for (const m of list) {
    const d = m.kind === 'rejoin-wait' ? (t >= m.t && t <= m.t + m.dur ? 0 : Infinity) : Math.abs(m.t - t);
    if (d <= tol && d < bd) { best = m; bd = d; }
  }
  return best;
}
function markLines(m) {
  const out = [m.kind + ' at ' + at(m.t) + (m.step >= 0 ? ', step ' + m.step : '') +
    (m.epoch >= 0 ? ', epoch ' + m.epoch : ''), m.text];
  if (m.dur > 0) out.push('for ' + ft(m.dur));
  return out;
}
function rtLines(it) {
  const x = it.x, r = it.rt;
  const out = ['rank ' + r.rank + ': step ' + x.step + ', epoch ' + x.epoch,
    'plan ' + hb(x.planBytes) + ' sent at ' + at(r.sent)];
  if (r.back === r.back) {
    out.push('round trip ' + ft(r.back - r.sent) + ', result ' + hb(r.bytes));
    if (r.inside) {
      const i = r.inside;
      out.push('inside: decode ' + ft(i[1] - i[0]) + ', execute ' + ft(i[2] - i[1]) + ', encode ' +
        ft(i[3] - i[2]));
    }
  } else out.push('no result in the log');
  out.push('join: ' + x.verdict);
  return out;
}
function nearest(a, b, maxDur, t, tol) {
  // the span holding t (the latest to start), else the closest within tol; -1 if none
  let best = -1, bd = Infinity;
  for (let i = lowerBound(a, t - maxDur - tol); i < a.length && a[i] <= t + tol; i++) {
    const d = t < a[i] ? a[i] - t : t > b[i] ? t - b[i] : 0;
    if (d <= tol && d <= bd) { best = i; bd = d; }
  }
  return best;
}
function wireLine(x) {
  // "epoch 0: plan 15 B x4, results 11 B each, joined", as launch prints it
  const sizes = new Set(x.rts.filter((r) => r.bytes >= 0).map((r) => r.bytes));
  const res = !sizes.size ? 'no result' : sizes.size === 1 && x.rts.every((r) => r.bytes >= 0)
    ? 'result ' + hb(x.rts[0].bytes) + ' each' : 'results ' + x.rts.map((r) => hb(r.bytes)).join(' ');
  return 'epoch ' + x.epoch + ': plan ' + hb(x.planBytes) + ' x' + x.rts.length + ', ' + res + ', ' +
    x.verdict;
}
function hit(x, y) {
  const L = laneAt(y);
  if (!L) return null;
  if (x < GX) {
    if (L.kind === 'req') return {lines: requestLines(L.req), req: L.req};
    if (L.kind === 'rank') {
      return {lines: [L.label, L.R.pids.length ? 'processes: pid ' + L.R.pids.join(', ') : '',
        L.R.host ? 'host ' + L.R.host : 'on the scheduler\'s host'].filter(Boolean)};
    }
    return null;
  }
  const t = T(x), tol = 4 * (v1 - v0) / (W - GX);
  const ly = y - (L.y - sy + AX);
  if (L.kind === 'steps') {
    const m = ly < 14 ? nearMark(stepMarks, t, tol) : null;
    if (m) return {lines: markLines(m), mark: m, step: m.step >= 0 ? m.step : null};
    for (let j = lowerBound(failedA, t - failedMax) ; j < failed.length && failedA[j] <= t + tol; j++) {
      const f = failed[j];
      if (ly > L.h / 2 && t >= f.a - tol && t <= f.b + tol) {
        return {lines: ['step ' + f.step + ', epoch ' + f.epoch + ': ' + f.verdict], step: f.step};
      }
    }
    const i = nearest(stepA, stepB, stepMax, t, tol);
    if (i >= 0) {
      return {lines: ['step ' + ST.step[i] + ' (epoch ' + ST.epoch[i] + '), ' + ft(stepB[i] - stepA[i]),
        ST.line[i] || 'nothing happened'].concat((attemptsOf.get(ST.step[i]) || []).map(wireLine)),
        step: ST.step[i]};
    }
    for (const r of idle) {
      if (t >= r[2] && t <= r[3]) {
        return {lines: ['steps ' + r[0] + '-' + r[1] + ': idle', 'empty plans, answered by the scheduler: ' +
          'no round trip'], step: r[0]};
      }
    }
    return null;
  }
  if (L.kind === 'sched') {
    const m = nearMark(schedMarks, t, tol);
    if (m) return {lines: markLines(m), mark: m};
    let best = null;
    for (let i = lowerBound(phaseA, t - phaseMax); i < phases.length && phaseA[i] <= t + tol; i++) {
      const r = phases[i];
      if (t >= r[2] - tol && t <= r[2] + r[3] + tol) best = r;
    }
    if (best) {
      return {lines: [PHASE[best[0]] + ' of step ' + best[1], ft(best[3]) + ' from ' + at(best[2])],
        step: best[1] >= 0 ? best[1] : null};
    }
    if (D.startup && t >= D.startup[0] && t <= D.startup[1]) {
      return {lines: ['start-up: ' + ft(D.startup[1] - D.startup[0]), 'from the run\'s start to its first ' +
        'plan: the ranks are started and join (HELLO, CONFIG, READY)']};
    }
    return null;
  }
  if (L.kind === 'rank') {
    const Rk = L.R;
    const m = nearMark(Rk.marks.concat(Rk.waits), t, tol);
    if (m) return {lines: markLines(m), mark: m, step: m.step >= 0 ? m.step : null};
    if (ly < 14) {
      for (const b of Rk.bands) {
        if (t >= b.a && t <= b.b) {
          return {lines: [L.label + ': pid ' + b.pid + ', epoch ' + b.epoch, b.host ? 'host ' + b.host
            : 'on the scheduler\'s host', 'from ' + at(b.a) + ' to ' + at(b.b)]};
        }
      }
    }
    const j = nearest(Rk.st, Rk.en, Rk.maxDur, t, tol);
    if (j >= 0) return {lines: rtLines(Rk.list[j]), step: Rk.list[j].x.step};
    for (const s of Rk.audits) {
      if (t >= s.a - tol && t <= s.b + tol) {
        return {lines: ['audit at step ' + s.step + ': ' + L.label + ' sent its shard, ' + hb(s.bytes),
          ft(s.b - s.a) + ' from ' + at(s.a)], step: s.step};
      }
    }
    for (const s of Rk.hands) {
      if (t >= s.a - tol && t <= s.b + tol) {
        return {lines: [L.label + ' joined: HELLO to READY in ' + ft(s.b - s.a), 'from ' + at(s.a)]};
      }
    }
    return null;
  }
  if (L.kind === 'counter') {
    const out = [L.label + ' at ' + at(t)];
    for (const p of L.track.parts) {
      const i = lowerBound(p[0].t, t + 1e-9) - 1;
      const val = i >= 0 ? p[0].v[i] : NaN;
      out.push(p[2] + ': ' + (val === val ? (L.label === 'wire bytes' ? hb(val) : val) : '-'));
    }
    return {lines: out};
  }
  if (L.kind === 'req') {
    const segs = RQ.lanes[L.req] || [];
    const NAMES = ['waiting', 'running', 'preempted'];
    for (let k = 0; k + 2 < segs.length; k += 3) {
      if (t >= segs[k + 1] - tol && t <= segs[k + 2] + tol) {
        return {lines: [L.label + ': ' + NAMES[segs[k]] + ' for ' + ft(segs[k + 2] - segs[k + 1]),
          'from ' + at(segs[k + 1])].concat(requestLines(L.req).slice(1)), req: L.req};
      }
    }
    return {lines: requestLines(L.req), req: L.req};
  }
  return null;
}
function requestLines(i) {
  const info = RQ.info[i] || [-1, -1, '', 0, 0];
  return ['request ' + RQ.ids[i], 'admitted at step ' + info[0] + ', ran in ' + info[3] + ' step(s)' +
    (info[4] ? ', preempted ' + info[4] + ' time(s)' : ''),
    info[1] >= 0 ? 'finished at step ' + info[1] + (info[2] ? ' (' + info[2] + ')' : '') : 'not finished'];
}

// -- the detail panel --------------------------------------------------------------------------
const P = $('detail');
function table(parent, head, rows, numeric) {
  const t = add(parent, 'table');
  const hr = add(add(t, 'thead'), 'tr');
  head.forEach((h, i) => add(hr, 'th', numeric.has(i) ? 'n' : '', h));
  const body = add(t, 'tbody');
  for (const r of rows) {
    const tr = add(body, 'tr');
    r.cells.forEach((v, i) => add(tr, 'td', numeric.has(i) ? 'n' : '', v));
    if (r.rest !== undefined) {
      const td = add(tr, 'td', '', r.rest);
      td.colSpan = Math.max(1, head.length - r.cells.length);
    }
  }
  return t;
}
function decodeText(v) {
  return v === true ? 'yes' : v === false ? 'no' : vt(v);
}
function planTable(plan) {
  const rows = plan.map((row, j) => (Array.isArray(row)
    ? {cells: [j, vt(row[0]), vt(row[1]), vt(row[2]), vt(row[3]), decodeText(row[4]), vt(row[5]),
      vt(row[6])].concat(row.length > 7 ? [vt(row[7])] : [])}
    : {cells: [j], rest: vt(row)}));
  const head = ['item', 'request', 'start', 'tokens', 'draft', 'decode', 'verdict', 'pages'];
  if (plan.some((r) => Array.isArray(r) && r.length > 7)) head.push('more');
  return table(P, head, rows, new Set([0, 2, 3, 4, 6]));
}
function resultTables(x) {
  const rts = x.rts.slice().sort((p, q) => p.rank - q.rank);
  table(P, ['rank', 'sent', 'round trip', 'decode', 'execute', 'encode'], rts.map((r) => {
    const ins = r.inside;
    return {cells: [r.rank, at(r.sent), r.back === r.back ? ft(r.back - r.sent) : 'no answer',
      ins ? ft(ins[1] - ins[0]) : '-', ins ? ft(ins[2] - ins[1]) : '-', ins ? ft(ins[3] - ins[2]) : '-']};
  }), new Set([0, 1, 2, 3, 4, 5]));
  const rows = [];
  const first = rts.find((r) => r.result >= 0);
  for (const r of rts) {
    if (!(r.back === r.back)) { rows.push({cells: [r.rank, '-'], rest: 'no result in the log'}); continue; }
    if (r.result < 0) {
      rows.push({cells: [r.rank, hb(r.bytes)], rest: 'result not kept (page size)'});
      continue;
    }
    if (first && r !== first && r.result === first.result) {
      rows.push({cells: [r.rank, hb(r.bytes)], rest: 'same as rank ' + first.rank});
      continue;
    }
    const body = (D.results || [])[r.result];
    if (typeof body === 'string') { rows.push({cells: [r.rank, hb(r.bytes)], rest: body}); continue; }
    if (!body || !body.length) { rows.push({cells: [r.rank, hb(r.bytes)], rest: 'no outcomes'}); continue; }
    body.forEach((o, j) => {
      const lead = j ? ['', ''] : [r.rank, hb(r.bytes)];
      if (Array.isArray(o)) rows.push({cells: lead.concat([0, 1, 2, 3, 4].map((c) => vt(o[c])))});
      else rows.push({cells: lead, rest: vt(o)});
    });
  }
  if (!rows.length) { add(P, 'div', 'sub', 'results: none in the log'); return; }
  table(P, ['rank', 'bytes', 'request', 'start', 'ran', 'accepted', 'writes'], rows,
    new Set([0, 1, 3, 4, 5]));
}
function eventLine(m) {
  const d = add(P, 'div', 'ev ' + (m.kind === 'lost' || m.kind.indexOf('fail') >= 0 ? 'bad' : ''), '');
  const bang = m.kind === 'lost' || m.kind === 'step-failed' ? '! ' : '';
  d.textContent = bang + m.text + '  (' + at(m.t) + ')';
}
function showStep(k) {
  selStep = k; selReq = null;
  P.replaceChildren();
  P.dataset.step = String(k);
  add(P, 'h2', '', 'step ' + k);
  const i = stepIdx.get(k);
  if (i !== undefined) {
    add(P, 'div', 'line mono', ST.line[i] || '(nothing happened)');
    add(P, 'div', 'sub', 'committed in epoch ' + ST.epoch[i] + ': ' + at(stepA[i]) + ' to ' + at(stepB[i]) +
      ' (' + ft(stepB[i] - stepA[i]) + ')');
    const names = Object.keys(C);
    if (names.length) {
      const rows = [];
      for (let j = 0; j < names.length; j += 2) {
        const cell = (n) => (n ? [n.replace(/_/g, ' '), vt(C[n][i])] : ['', '']);
        rows.push({cells: cell(names[j]).concat(cell(names[j + 1]))});
      }
      table(P, ['counter', '', 'counter', ''], rows, new Set([1, 3]));
    }
  }
  for (const r of idle) {
    if (r[0] <= k && k <= r[1]) {
      add(P, 'div', 'sub', 'idle: steps ' + r[0] + '-' + r[1] + ', empty plans answered by the scheduler: ' +
        'no round trip');
    }
  }
  const list = attemptsOf.get(k) || [];
  const shown = new Set();
  for (const x of list) {
    const plan = x.plan >= 0 ? (D.plans || [])[x.plan] : null;
    const n = Array.isArray(plan) ? plan.length : '?';
    add(P, 'h3', '', 'step ' + k + ', epoch ' + x.epoch + ': plan of ' + n + ' item' + (n === 1 ? '' : 's') +
      ', ' + hb(x.planBytes) + ' to ' + ranksText(x.rts.map((r) => r.rank).sort((p, q) => p - q)));
    if (plan === null || plan === undefined) {
      add(P, 'div', 'sub', 'plan not kept (the page bounds its size): inferris-dist inspect WIRELOG --step ' +
        k + ' prints it');
    } else if (typeof plan === 'string') add(P, 'div', 'mono', plan);
    else planTable(plan);
    resultTables(x);
    add(P, 'div', 'join ' + (x.ok ? 'ok' : 'bad'), 'join: ' + x.verdict);
    for (const m of marks) {
      if (m.step === k && m.epoch === x.epoch && !shown.has(m.i)) { shown.add(m.i); eventLine(m); }
    }
  }
  const rest = marks.filter((m) => m.step === k && !shown.has(m.i));
  if (rest.length) {
    add(P, 'h3', '', 'events at step ' + k);
    rest.forEach(eventLine);
  }
  if (!list.length && i === undefined && !idle.some((r) => r[0] <= k && k <= r[1])) {
    add(P, 'div', 'sub', 'no step ' + k + ' in the log');
  }
  add(P, 'div', 'sub', 'the same as `inferris-dist inspect WIRELOG --step ' + k + '` prints');
  dirty();
}
function showRequest(i) {
  selReq = i; selStep = null;
  P.replaceChildren();
  delete P.dataset.step;
  const lines = requestLines(i);
  add(P, 'h2', '', lines[0]);
  lines.slice(1).forEach((l) => add(P, 'div', '', l));
  const segs = RQ.lanes[i] || [];
  const NAMES = ['waiting', 'running', 'preempted'];
  const rows = [];
  for (let k = 0; k + 2 < segs.length && rows.length < 400; k += 3) {
    rows.push({cells: [NAMES[segs[k]] || '?', at(segs[k + 1]), ft(segs[k + 2] - segs[k + 1])]});
  }
  table(P, ['state', 'from', 'for'], rows, new Set([1, 2]));
  dirty();
}
function showMark(m) {
  P.replaceChildren();
  delete P.dataset.step;
  add(P, 'h2', '', m.kind);
  markLines(m).forEach((l) => add(P, 'div', '', l));
  if (m.ranks.length) add(P, 'div', 'sub', ranksText(m.ranks));
  if (m.step >= 0) {
    const b = add(P, 'button', '', 'show step ' + m.step);
    b.type = 'button';
    b.addEventListener('click', () => showStep(m.step));
  }
}
function showRun() {
  P.replaceChildren();
  add(P, 'h2', '', 'the run');
  const M = D.meta || {};
  const rows = [];
  const put = (k, v) => {
    if (v !== '' && v !== null && v !== undefined) rows.push({cells: [k, String(v)]});
  };
  put('workload', M.name);
  put('world size', M.world_size);
  put('rung', M.rung);
  put('on rank loss', M.policy);
  put('faults', (M.faults || []).join(' '));
  for (const k of Object.keys(M.config || {})) put(k.replace(/_/g, ' '), vt(M.config[k]));
  put('requests', M.requests);
  put('scheduler pid', M.scheduler_pid);
  put('address', M.address);
  put('clocks', M.shared_clock === true ? 'one host: one monotonic clock'
    : M.shared_clock === false ? 'ranks elsewhere: each placed by its fastest round trip' : '');
  put('status', M.status);
  put('error', M.error);
  put('messages', M.messages + ' (' + hb(M.bytes_out) + ' out, ' + hb(M.bytes_in) + ' in)');
  put('steps', nSteps + ' committed, ' + attempts.length + ' attempts (' + failed.length + ' failed)');
  for (const o of M.offsets || []) put('clock of rank ' + o[0] + ' (pid ' + o[1] + ')', o[2] + ' \u00b5s');
  table(P, ['', ''], rows, new Set()).className = 'wrap';
  add(P, 'div', 'sub', 'Click a step (the top lane, a round trip or a phase) for its plan item by item, ' +
    'every rank\'s result and the join; a request\'s lane for its story; a mark for what happened.');
}

// -- the header ------------------------------------------------------------------------------
function header() {
  const M = D.meta || {};
  document.title = D.title || document.title;
  $('title').textContent = D.title || '';
  const run = $('run');
  const parts = [];
  if (M.name) parts.push(M.name);
  parts.push(ranks.length + ' rank' + (ranks.length === 1 ? '' : 's'));
  if (M.rung) parts.push('rung ' + M.rung);
  if (M.policy) parts.push('on rank loss: ' + M.policy);
  if (M.faults && M.faults.length) parts.push('faults ' + M.faults.join(' '));
  if (M.requests !== null && M.requests !== undefined) parts.push(M.requests + ' requests');
  parts.push(nSteps + ' steps committed in ' + attempts.length + ' attempts');
  const lost = markCount.lost || 0, restarts = markCount.restart || 0;
  if (lost || restarts) parts.push(lost + ' loss' + (lost === 1 ? '' : 'es') + ', ' + restarts + ' restart' +
    (restarts === 1 ? '' : 's'));
  add(run, 'span', '', parts.join(' \u00b7 '));
  if (M.status) {
    add(run, 'span', '', ' \u00b7 ');
    const said = 'status ' + M.status + (M.error ? ': ' + M.error : '');
    add(run, 'span', M.status === 'ok' ? 'ok' : 'bad', said);
  }
  const notes = $('notes');
  for (const n of D.notes || []) add(notes, 'div', 'note', n);
  const lg = $('legend');
  const items = [['prepare', COL.prepare], ['execute', COL.execute], ['commit', COL.commit],
    ['recover', COL.recover], ['round trip', COL.rt], ['failed', COL.rtFail], ['rank decode', COL.decode],
    ['rank execute', COL.exec], ['rank encode', COL.encode], ['audit', COL.audit], ['join', COL.hand],
    ['rejoin wait', COL.wait], ['lost', COL.lost], ['restart', COL.restart], ['waiting', COL.waiting],
    ['running', COL.running], ['preempted', COL.preempted]];
  for (const it of items) {
    const sw = add(lg, 'span', 'sw', '');
    sw.style.background = it[1];
    add(lg, 'span', '', it[0]);
  }
}

// -- input -----------------------------------------------------------------------------------
const tip = $('tip');
let drag = null;
function showTip(h, cx, cy) {
  if (!h || !h.lines || !h.lines.length) { tip.style.display = 'none'; return; }
  tip.replaceChildren();
  h.lines.forEach((l, j) => add(tip, j ? 'div' : 'b', '', l));
  tip.style.display = 'block';
  const r = tip.getBoundingClientRect();
  let x = cx + 14, y = cy + 14;
  if (x + r.width > window.innerWidth - 4) x = Math.max(4, cx - r.width - 10);
  if (y + r.height > window.innerHeight - 4) y = Math.max(4, cy - r.height - 10);
  tip.style.left = x + 'px';
  tip.style.top = y + 'px';
}
function local(e) {
  const r = cv.getBoundingClientRect();
  return [e.clientX - r.left, e.clientY - r.top];
}
cv.addEventListener('wheel', (e) => {
  e.preventDefault();
  const p = local(e);
  const dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY;
  const dx = e.deltaMode === 1 ? e.deltaX * 16 : e.deltaX;
  if (e.shiftKey || p[0] < GX) { sy += dy || dx; clampY(); dirty(); } else if (Math.abs(dx) > Math.abs(dy)) {
    pan(dx);
  } else zoom(Math.exp(dy * 0.002), p[0]);
}, {passive: false});
cv.addEventListener('mousedown', (e) => {
  if (e.button !== 0) return;
  const p = local(e);
  drag = {x: p[0], y: p[1], v0: v0, v1: v1, sy: sy, moved: false};
  cv.classList.add('dragging');
});
window.addEventListener('mousemove', (e) => {
  const p = local(e);
  if (drag) {
    const dx = p[0] - drag.x, dy = p[1] - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) {
      const d = dx * (drag.v1 - drag.v0) / (W - GX);
      v0 = drag.v0 - d; v1 = drag.v1 - d; clampX();
      sy = drag.sy - dy; clampY();
      tip.style.display = 'none';
      dirty();
    }
    return;
  }
  if (e.target !== cv) { tip.style.display = 'none'; return; }
  showTip(hit(p[0], p[1]), e.clientX, e.clientY);
});
window.addEventListener('mouseup', (e) => {
  if (!drag) return;
  const d = drag;
  drag = null;
  cv.classList.remove('dragging');
  if (d.moved) return;
  const p = local(e);
  click(p[0], p[1]);
});
cv.addEventListener('mouseleave', () => { if (!drag) tip.style.display = 'none'; });
function click(x, y) {
  const h = hit(x, y);
  if (!h) return;
  if (h.step !== undefined && h.step !== null) showStep(h.step);
  else if (h.req !== undefined) showRequest(h.req);
  else if (h.mark) showMark(h.mark);
}
function stepBy(d) {
  if (!stepList.length) return;
  let j;
  if (selStep === null) j = d > 0 ? 0 : stepList.length - 1;
  else {
    const i = lowerBound(stepList, selStep);
    j = stepList[i] === selStep ? i + d : d > 0 ? i : i - 1;
  }
  j = Math.max(0, Math.min(stepList.length - 1, j));
  showStep(stepList[j]);
  reveal(stepList[j]);
}
function reveal(k) {
  const s = stepSpan(k);
  if (!s) return;
  if (s[0] < v0 || s[1] > v1) {
    const w = Math.max(v1 - v0, (s[1] - s[0]) * 1.2);
    const c = (s[0] + s[1]) / 2;
    v0 = c - w / 2; v1 = c + w / 2; clampX(); dirty();
  }
}
function focusStep(k) {
  const s = stepSpan(k);
  if (!s) return false;
  const w = Math.max(20, (s[1] - s[0]) * 6);
  const c = (s[0] + s[1]) / 2;
  v0 = c - w / 2; v1 = c + w / 2; clampX(); draw();
  return true;
}
$('zin').addEventListener('click', () => zoom(0.5));
$('zout').addEventListener('click', () => zoom(2));
$('fit').addEventListener('click', fit);
$('prev').addEventListener('click', () => stepBy(-1));
$('next').addEventListener('click', () => stepBy(1));
$('goto').addEventListener('keydown', (e) => {
  if (e.key !== 'Enter') return;
  const k = parseInt(e.target.value, 10);
  if (Number.isInteger(k)) { showStep(k); reveal(k); }
});
document.addEventListener('keydown', (e) => {
  if (e.target && e.target.tagName === 'INPUT') return;
  const k = e.key;
  if (k === '+' || k === '=' || k === 'w') zoom(0.7);
  else if (k === '-' || k === 's') zoom(1 / 0.7);
  else if (k === '0' || k === 'f') fit();
  else if (k === 'ArrowLeft' || k === 'a') pan(-80);
  else if (k === 'ArrowRight' || k === 'd') pan(80);
  else if (k === 'ArrowUp' || k === 'ArrowDown') { sy += k === 'ArrowUp' ? -40 : 40; clampY(); dirty(); }
  else if (k === '[') stepBy(-1);
  else if (k === ']') stepBy(1);
  else return;
  e.preventDefault();
});
if (window.ResizeObserver) new ResizeObserver(resize).observe(plot);
window.addEventListener('resize', resize);

// -- what a test (or a curious engineer) may read ----------------------------------------------
function stepPoint(k) {
  const s = stepSpan(k);
  const L = LANES[0];
  if (!s) return null;
  // With overlap scheduling the next step's plan goes out before this one commits: a point
  // over both is the later step's (the latest to start), so aim before the next one starts.
  const after = stepList[stepList.indexOf(k) + 1];
  const next = after === undefined ? null : stepSpan(after);
  const end = next && next[0] > s[0] ? Math.min(s[1], next[0]) : s[1];
  const a = Math.max(X(s[0]), GX), b = Math.min(X(end), W);
  if (b < a) return null;
  const r = cv.getBoundingClientRect();
  const i = stepIdx.get(k);
  // A committed step's band, below its marks (a loss, a restart: hit first in the top 14 px)
  // and above its failed attempts (the lower half): a point that is the step and nothing else.
  const yy = L.y - sy + AX + (i !== undefined ? 14 : L.h - 8);
  return {x: r.left + (a + b) / 2, y: r.top + yy};
}
window.inferrisPage = Object.freeze({
  version: 1,
  ranks: ranks.slice(),
  rankLanes: R.length,
  steps: nSteps,
  stepNumbers: stepList.slice(),
  attempts: attempts.length,
  failedAttempts: failed.length,
  marks: Object.freeze(Object.assign({}, markCount)),
  requestLanes: RQ.ids.length,
  requests: RQ.total,
  counterTracks: TRACKS.map((t) => t.label),
  lanes: () => LANES.map((L) => ({kind: L.kind, label: L.label, y: L.y, h: L.h})),
  notes: (D.notes || []).slice(),
  get drawn() { return JSON.parse(JSON.stringify(stats)); },
  get frames() { return frames; },
  get selected() { return selStep; },
  get view() { return [v0, v1, sy]; },
  stepPoint: stepPoint,
  focusStep: focusStep,
  fit: () => { fit(); draw(); },
  setView: (a, b) => { v0 = a; v1 = b; clampX(); draw(); },
});

header();
showRun();
fit();
resize();
document.body.dataset.ready = '1';
})();
"""
