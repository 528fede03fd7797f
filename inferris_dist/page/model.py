"""The page's model: a wire log's records, read in one pass, into what the page draws.

`Builder.add` takes the records one by one, as a careful reader would: whatever a record
holds (a field of the wrong type, a number that is not one, a hostile text), it is either
used, bounded and cleaned, or skipped and counted (`malformed`, `unknown`); it never raises.
What is kept is bounded whatever the log holds: each kind of thing has its cap (MAX_*), and
texts and bodies have byte budgets, each distinct one kept once; what is past a bound is
counted, for a note at the top of the page (data.py says it). Nothing is sized by a number
the log holds (a rank, a step, a count, a duration): what a record costs is what its bytes
cost. A step's trace is not kept: its line is said as it comes (within LINE_BUDGET) and its
request lanes written one byte a step (`Lanes`); what of a trace cannot be used is left out and
counted. The builder keeps times in the scheduler's seconds; data.py turns them into the
page's microseconds.
"""
from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from inferris_dist.engine import StepTrace
from inferris_dist.wirelog import schema
from inferris_dist.wirelog.logread import Malformed
from inferris_dist.words import PLAIN, shown, step_events

MAX_RANK = 4095             # a rank number beyond this is not one (keys refuses larger worlds)
MAX_TEXT = 400              # characters kept of any one text from the log
TEXT_BUDGET = 2 << 20       # characters of text kept in all
BODY_BUDGET = 3 << 20       # bytes of plan bodies on the page, and as many of result bodies
LINE_BUDGET = 1 << 20       # bytes of step lines ("admit r0  run r0:6 ...") kept
MAX_ROUND_TRIPS = 200_000   # ranks' round trips drawn
MAX_ARRIVALS = 200_000      # ranks' arrivals at a join kept (an attempt's whole, or none of it)
MAX_ATTEMPTS = 50_000
MAX_STEPS = 40_000          # committed steps with counters and step lines
MAX_PHASES = 120_000
MAX_MARKS = 20_000
MAX_MEMBERS = 20_000         # members admitted (and as many HELLOs, and joins)
MAX_AUDITS = 60_000
MAX_EPOCHS = 40_000          # epoch starts (restarts) placed on the ranks' lanes
MAX_RESIZES = 40_000         # changes of the world's size (the world-size chart)
MAX_REQUEST_LANES = 200
MAX_REQUESTS_COUNTED = 1_000_000   # distinct requests counted beyond the lanes
SEGMENT_BUDGET = 120_000     # segments of the request lanes in all, each lane its share
LANE_SEGMENTS = 40_000       # segments of one request lane at most
MAX_LIST = 256              # elements of a list kept in a body (then "... N more")
MAX_KEYS = 64
MAX_DEPTH = 6
TIME_LIMIT = 1e9            # seconds from the start: a time beyond it is not one

PHASES = schema.PHASES        # a phase's index in it is what the page's data holds
COUNTERS = ("requests_running", "requests_waiting", "requests_preempted", "pages_used", "pages_free",
            "pages_cached", "prefix_hit_tokens", "drafted_tokens", "accepted_tokens", "batch_tokens",
            "batch_requests")
# A plan item's and an outcome's columns on the page: the schema's fields (a plan item's that
# every plan has; prior_drafts, where there, goes with the other keys, in a last object).
PLAN_KEYS = tuple(k for k, f in schema.ITEM.items() if f.required)
RESULT_KEYS = tuple(schema.OUTCOME)
MARKS = ("lost", "restart", "step-failed", "audit", "audit-failed", "note", "turned-away",
         "rejoin-wait", "refused", "replaced", "end", "link", "partition", "resize")
# Each kind of mark has its own budget within MAX_MARKS, so that a flood of one kind (a link
# fault on every message, an audit every step) cannot crowd out the losses and restarts.
MARK_BUDGET = {"lost": 4000, "restart": 4000, "step-failed": 2000, "audit": 4000, "audit-failed": 1000,
               "note": 4000, "turned-away": 64, "rejoin-wait": 1000, "refused": 1000, "replaced": 4000,
               "end": 8, "link": 4000, "partition": 1000, "resize": 4000}
assert set(MARK_BUDGET) == set(MARKS)
LINK = schema.LINK       # what a link fault did to a message
# The events the page draws, each by its Builder._ev_* method: every event of the wire log's
# schema (tests/test_wire_schema.py holds each to its method); any other is counted and ignored.
KNOWN_EVENTS = frozenset(schema.EVENTS)
WAITING, RUNNING, PREEMPTED, CHANGING = 0, 1, 2, 3   # CHANGING: a stretch in which the state changed
LINK_NOTE = "the link "     # the notes the link writes (a message's or a cut's mark says each)


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
    link: list = field(default_factory=list)   # what the link did to its plan and result ("plan lost")


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
    # a joined attempt's arrivals, as its `attempt` event says them: (rank, after, behind, exec
    # or None) in the log's order, seconds; and the rank the join waited for (None: under two)
    arrivals: list = field(default_factory=list)
    last: int | None = None

    def start(self) -> float | None:
        times = [rt.sent for rt in self.ranks.values() if rt.sent is not None]
        return min(times) if times else None


@dataclass
class Step:
    step: int
    epoch: int
    t: float
    line: str                             # what happened in it, in words (bounded: LINE_BUDGET)
    counters: list
    ordinal: int                          # its place among the steps as they came (the lanes' index)


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


TRACE_IDS = ("admitted", "scheduled", "preempted")
TRACE_COUNTS = ("executed", "reused", "published", "drafted", "accepted", "rolled_back", "discarded",
                "returned")
TRACE_WORDS = ("sampled", "finished")


def _trace(step: int, obj: Any, skipped: Callable[[str], None]) -> StepTrace | None:
    """A step's trace as the page can use it: each field of its kind (a list of request ids, an
    object of counts or of words by request id, a list of page numbers), a draft only with its
    accepted count. What is not so is left out and `skipped` says what it was; a field that is
    not there is empty (an older writer's trace has fewer)."""
    if not isinstance(obj, dict):
        skipped("a trace that is not an object")
        return None
    g = obj.get

    def ids(key: str) -> list[str]:
        v = g(key)
        if v is None:
            return []
        if not isinstance(v, list):
            skipped(f"{key} that is not a list")
            return []
        out = [x for x in v if isinstance(x, str)]
        if len(out) < len(v):
            skipped(f"{key} holding what is not a request id")
        return out

    def mapping(key: str, ok: Callable[[Any], bool], what: str) -> dict:
        v = g(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            skipped(f"{key} that is not an object")
            return {}
        out = {k: x for k, x in v.items() if isinstance(k, str) and ok(x)}
        if len(out) < len(v):
            skipped(f"{key} holding what is not {what}")
        return out

    counts = {k: mapping(k, is_int, "a count") for k in TRACE_COUNTS}
    words = {k: mapping(k, lambda x: isinstance(x, str), "a word") for k in TRACE_WORDS}
    pages = g("evicted")
    evicted = [p for p in pages if is_int(p)] if isinstance(pages, list) else []
    if pages is not None and (not isinstance(pages, list) or len(evicted) < len(pages)):
        skipped("evicted holding what is not a page number")
    drafted, accepted = counts["drafted"], counts["accepted"]
    unaccepted = [r for r in drafted if r not in accepted]
    if unaccepted:
        skipped("drafted naming a request accepted does not")
        for r in unaccepted:
            del drafted[r]
    return StepTrace(step, ids("admitted"), ids("scheduled"), counts["executed"], words["sampled"],
                     words["finished"], ids("preempted"), counts["reused"], counts["published"], evicted,
                     drafted, accepted, counts["rolled_back"], counts["discarded"], counts["returned"])


def _ranks_text(ranks: list) -> str:
    """ "rank 2", "ranks 0-3", "ranks 1, 5, 9": the numbers as the log gives them, never a range
    of them expanded (a rank of 10**8 costs what its digits cost)."""
    ranks = [r for r in ranks if is_int(r)]
    if not ranks:
        return "every rank"
    if len(ranks) > 2 and ranks[-1] - ranks[0] == len(ranks) - 1 and all(
            b == a + 1 for a, b in zip(ranks, ranks[1:])):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    more = f" (and {len(ranks) - 32} more)" if len(ranks) > 32 else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:32])) + more


def resize_words(old: int, new: int, epoch: Any, kept: list, lost: list, added: list) -> str:
    """ "world size 4 -> 3 in epoch 1, without rank 1; renumbered 2->1 3->2", as launch says it
    (at most 32 of each list said)."""
    words = f"world size {old} -> {new} in epoch {epoch}"
    if lost:
        words += f", without {_ranks_text(lost)}"
    moved = [f"{was}->{rank}" for rank, was in enumerate(kept) if was != rank]
    if moved:
        words += "; renumbered " + " ".join(moved[:32]) + (f" (and {len(moved) - 32} more)"
                                                           if len(moved) > 32 else "")
    if added:
        words += f"; joined: {_ranks_text(added)}"
    return words


def _counter(v: Any) -> int | float | None:
    """A counter's value as the page keeps it: a whole number a script can hold, or a finite
    float; anything else is no value."""
    if type(v) is int:
        return v if abs(v) < 2 ** 53 else None
    return v if type(v) is float and math.isfinite(v) else None


def _secs(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


# -- the request lanes -------------------------------------------------------------------------

class Lanes:
    """A lane per request, for the first MAX_REQUEST_LANES requests admitted or scheduled: its
    state (WAITING, RUNNING, PREEMPTED) at each committed step from the one it came in to the
    one it finished in, one byte a step, the steps numbered in the order they are given
    (`ordinal`); the other requests are counted (up to MAX_REQUESTS_COUNTED). A step costs what
    its trace lists: a lane that did not run, was not preempted and did not run the step before
    keeps its state, written when it next changes (`close` writes the rest)."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.ids: list[str] = []
        self.first: list[int] = []              # the ordinal of the step it came in at
        self.states: list[bytearray] = []       # its state at each step from `first` on
        self.now: list[int] = []                # its state at its last step written
        self.finished: list[int] = []           # the step it finished in, or -1
        self.reason: list[str] = []
        self.preemptions: list[int] = []
        self.open: set[int] = set()             # lanes not finished
        self.ran: set[int] = set()              # lanes that ran at the last step
        self.others: set[int] = set()           # the other requests (by hash)
        self.more_than_counted = False
        self.steps = 0                          # steps given

    def step(self, number: int, admitted: Iterable[str], scheduled: Iterable[str], executed: Iterable[str],
             preempted: Iterable[str], finished: dict[str, str]) -> None:
        """One committed step (`number`), as its trace says it."""
        o = self.steps
        self.steps += 1
        index = self.index
        fresh = []
        for rid in admitted:
            if rid not in index:
                fresh.append(rid)
        scheduled = list(scheduled)
        for rid in scheduled:
            if rid not in index:
                fresh.append(rid)
        for rid in fresh:
            if rid in index:
                continue
            if len(self.ids) < MAX_REQUEST_LANES:
                i = index[rid] = len(self.ids)
                self.ids.append(rid)
                self.first.append(o)
                self.states.append(bytearray())
                self.now.append(WAITING)
                self.finished.append(-1)
                self.reason.append("")
                self.preemptions.append(0)
                self.open.add(i)
            elif len(self.others) < MAX_REQUESTS_COUNTED:
                self.others.add(hash(rid))
            else:
                self.more_than_counted = True
        ran = {index[r] for r in scheduled if r in index} | {index[r] for r in executed if r in index}
        out = {index[r] for r in preempted if r in index}
        done = {index[r]: why for r, why in finished.items() if r in index}
        touched = (ran | out | set(done) | self.ran | {index[r] for r in fresh if r in index}) & self.open
        still_running = set()
        for i in touched:
            if i in out:
                state = PREEMPTED
                self.preemptions[i] += 1
            elif i in ran:
                state = RUNNING
                still_running.add(i)
            else:
                state = PREEMPTED if self.now[i] == PREEMPTED else WAITING
            self._fill(i, o)
            self.states[i].append(state)
            self.now[i] = state
            if i in done:
                self.finished[i], self.reason[i] = number, done[i]
                self.open.discard(i)
        self.ran = still_running

    def _fill(self, i: int, o: int) -> None:
        """Lane i's state written up to (not including) ordinal o."""
        gap = o - self.first[i] - len(self.states[i])
        if gap > 0:
            self.states[i] += bytes((self.now[i],)) * gap

    def close(self) -> None:
        """Every lane still open written up to the last step."""
        for i in self.open:
            self._fill(i, self.steps)

    @property
    def total(self) -> int:
        return len(self.ids) + len(self.others)


def runs(states: bytes, cap: int) -> tuple[list[tuple[int, int, int]], int]:
    """A lane's states as runs (state, first, end), `first` and `end` offsets into `states`, at
    most `cap` of them (cap >= 2): at the finest resolution q (1, 2, 4, ... steps) at which they
    fit, a stretch of q steps in which the state changed being CHANGING; and q. Every pass is
    over bytes, in C: a lane of 40,000 steps costs a few of them, not a Python loop per step."""
    n = len(states)
    if not n:
        return [], 1
    ne = operator.ne
    d = bytes(map(ne, states[1:], states))          # d[j]: the state changes between j and j + 1
    q, mixed, level = 1, bytes(n), states
    if d.count(1) + 1 > cap:
        to_changing = bytes.maketrans(b"\x00\x01", b"\x00\x03")
        while True:
            left, right = mixed[0::2], mixed[1::2]
            bound = d[q - 1::2 * q]                   # between the two halves of each new bucket
            k = len(left)
            right += bytes(k - len(right))
            bound += bytes(k - len(bound))
            mixed = bytes(map(operator.or_, map(operator.or_, left, right), bound))
            q *= 2
            level = bytes(map(max, states[0::q], mixed.translate(to_changing)))
            if sum(map(ne, level[1:], level)) + 1 <= cap:
                break
    out = []
    for m in re.finditer(rb"(.)\1*", level, re.S):
        out.append((level[m.start()], m.start() * q, min(n, m.end() * q)))
    return out, q


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
        self.round_trips = 0
        self.arrivals = 0                          # arrivals at a join kept (MAX_ARRIVALS)
        self.phases: list[tuple[float, float, int, int]] = []   # start, dur, kind, step
        self.steps: list[Step] = []
        self.lanes = Lanes()                       # the request lanes, from the step events
        self.line_budget = [0, 0]                  # characters of step lines kept, lines past LINE_BUDGET
        self.trace_skipped: dict[str, int] = {}    # what the step traces held that the page cannot use
        self.traces_skipped = 0                    # traces that held any of it
        self.idle: list[tuple[int, int, float]] = []
        self.marks: list[list] = []
        self.dropped_marks = 0
        self.marks_of: dict[str, int] = {}         # kind -> marks kept of it (each kind's budget)
        self.dropped_of: dict[str, int] = {}       # kind -> marks past its budget
        # what is past its bound, by what it is ("round trips", "audits", ...): said in a note
        self.over: dict[str, int] = {}
        self.members: list[tuple[float, int, int, int, str]] = []   # t, rank, epoch, pid, host
        self.hellos: list[tuple[float, int, int, int]] = []          # t, rank, epoch, pid
        self.handshakes: list[list] = []                            # rank, hello t, ready t
        self.epochs: list[tuple[float, int]] = []                   # t, epoch: where each began
        # the world's size: each change (t, step, epoch, from, to, why), and the members a
        # change renumbered (t, new rank, epoch, pid, host, old rank): a kept member's new rank
        self.resizes: list[tuple[float, int, int, int, int, str]] = []
        self.renumbered: list[tuple[float, int, int, int, str, int]] = []
        self.pid_of: dict[int, tuple[int, str]] = {}                 # rank -> its member's (pid, host)
        self.joined: set[tuple[int, int]] = set()                    # (epoch, rank) a resize added
        self.hello_at: dict[int, float] = {}
        self.audit_out: dict[int, tuple[float, int]] = {}
        self.audits: list[list] = []
        self.ranks: set[int] = set()
        self.messages = self.bytes_out = self.bytes_in = 0
        self.has_step_events = False
        self._last_link: tuple | None = None      # the last message marked for the link (a copy follows it)

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

    def _over(self, what: str) -> None:
        """One more of `what` past its bound: not kept, counted."""
        self.over[what] = self.over.get(what, 0) + 1

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
        if len(self.marks) >= MAX_MARKS or self.marks_of.get(kind, 0) >= MARK_BUDGET[kind]:
            self.dropped_marks += 1
            self.dropped_of[kind] = self.dropped_of.get(kind, 0) + 1
            return
        self.marks_of[kind] = self.marks_of.get(kind, 0) + 1
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
        if "link" in m and rank is not None and not (
                kind == "PLAN" and m["dir"] == "out" or kind == "RESULT" and m["dir"] == "in"):
            self._link(m, t, rank, epoch, step, kind)      # a CONFIG, an AUDIT, ... a cut lost
        if kind == "PLAN" and m["dir"] == "out":
            self._plan(m, t, rank, epoch, step, num_bytes)
        elif kind == "RESULT" and m["dir"] == "in":
            self._result(m, t, rank, epoch, step, num_bytes)
        elif kind == "HELLO" and m["dir"] == "in":
            body = m.get("body")
            pid = body.get("pid") if isinstance(body, dict) else None
            if len(self.hellos) < MAX_MEMBERS:
                self.hellos.append((t, rank, epoch, pid if is_int(pid) else -1))
            self.hello_at[rank] = t
        elif kind == "READY" and m["dir"] == "in":
            began = self.hello_at.pop(rank, None)
            if began is not None:
                if len(self.handshakes) < MAX_MEMBERS:
                    self.handshakes.append([rank, began, t])
                else:
                    self._over("joins")
        elif kind == "AUDIT" and m["dir"] == "out":
            self.audit_out[rank] = (t, step if step is not None else -1)
        elif kind == "SHARD" and m["dir"] == "in":
            out = self.audit_out.pop(rank, None)
            if out is not None:
                if len(self.audits) < MAX_AUDITS:
                    self.audits.append([rank, out[0], t, num_bytes, out[1]])
                else:
                    self._over("audits")
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
            self._over("attempts")
            return None
        a = self.open[(step, epoch)] = _Attempt(step, epoch)
        self.attempts.append(a)
        return a

    def _round_trip(self, a: _Attempt, rank: int) -> _RoundTrip | None:
        rt = a.ranks.get(rank)
        if rt is None:
            if self.round_trips >= MAX_ROUND_TRIPS:
                self._over("round trips")
                return None
            self.round_trips += 1
            rt = a.ranks[rank] = _RoundTrip(rank)
        return rt

    def _plan(self, m: dict, t: float, rank: int, epoch: int, step: int | None, num_bytes: int) -> None:
        body = m.get("body")
        items = body.get("items") if isinstance(body, dict) else None
        if step is None or not isinstance(items, list):
            raise Malformed("no plan items")
        link = m.get("link")
        if link is not None:
            link = self._link(m, t, rank, epoch, step, "PLAN")
        if link == "duplicated":                    # its second copy: the same attempt
            a = self.open.get((step, epoch))
            if a is not None and rank in a.ranks and a.ranks[rank].sent is not None:
                return
        a = self._attempt(step, epoch, fresh_for=rank)
        if a is None:
            return
        rt = self._round_trip(a, rank)
        if rt is None:
            return
        if link is not None and len(rt.link) < 4:
            rt.link.append(f"plan {link}")
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
        link = m.get("link")
        if link is not None:
            link = self._link(m, t, rank, epoch, step, "RESULT")
            a = self.open.get((step, epoch))
            rt = a.ranks.get(rank) if a is not None else None
            if rt is not None and len(rt.link) < 4:
                rt.link.append(f"result {link}")
            if link != "duplicated" or rt is None or rt.back is not None:
                return          # lost, or held to come later: no answer; a second copy: the first stands
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

    def _link(self, m: dict, t: float, rank: int, epoch: int, step: int | None, kind: str) -> str:
        """A message a link fault acted on: its mark on the rank's lane (a message the link
        duplicated is marked once); what the link did."""
        link = m["link"]
        if link not in LINK:
            raise Malformed("link")
        key = (m["dir"], kind, step, epoch, rank, link)
        if key != self._last_link:
            self._last_link = key
            kind = shown(kind[:16])
            whom = f"to rank {rank}" if m["dir"] == "out" else f"from rank {rank}"
            said = {"lost": "lost", "delayed": "delayed", "duplicated": "duplicated",
                    "reordered": "held back"}[link]
            text = f"the link {said} the {kind}{f' of step {step}' if step is not None else ''} {whom}"
            if link == "reordered":
                text += " until after the next message to it"
            elif link == "delayed":
                text += " (delivered late)" if m["dir"] == "out" else " (taken when the link delivers it)"
            self._mark("link", t, text, [rank], step, epoch)
        return link

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
        self.pid_of[rank] = (-1 if pid is None else pid, host)
        if len(self.members) < MAX_MEMBERS:
            self.members.append((t, rank, epoch, -1 if pid is None else pid, host))
        else:
            self._over("members admitted")

    def _ev_phase(self, ev: dict, t: float) -> None:
        phase = ev.get("phase")
        if phase not in PHASES:
            raise Malformed("phase")
        dur = _num(ev, "dur")
        step = _int(ev, "step", 0, optional=True)
        self._time(t + max(dur, 0.0))
        if len(self.phases) >= MAX_PHASES:
            self._over("scheduler phases")
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
        if "arrivals" in ev:
            self._arrivals(a, ev["arrivals"])

    def _arrivals(self, a: _Attempt, arrivals: Any) -> None:
        """A joined attempt's arrivals: each rank once, its times finite and >= 0, or none of
        them kept (counted as malformed; the attempt itself is kept); past MAX_ARRIVALS, counted."""
        ok = isinstance(arrivals, list) and len(arrivals) <= MAX_RANK + 1
        kept: list[tuple[int, float, float, float | None]] = []
        seen: set[int] = set()
        for x in arrivals if ok else ():
            if not isinstance(x, dict):
                ok = False
                break
            rank, times = x.get("rank"), (x.get("after"), x.get("behind"), x.get("exec"))
            ok = (is_int(rank) and 0 <= rank <= MAX_RANK and rank not in seen
                  and all(is_num(v) and 0 <= v < TIME_LIMIT for v in times[:2])
                  and (times[2] is None or is_num(times[2]) and 0 <= times[2] < TIME_LIMIT))
            if not ok:
                break
            seen.add(rank)
            after, behind, run = times
            kept.append((rank, float(after), float(behind), None if run is None else float(run)))
        if not ok:
            self._bad("attempt (arrivals)")
            return
        if self.arrivals + len(kept) > MAX_ARRIVALS:
            self._over("attempts' arrivals")
            return
        self.arrivals += len(kept)
        a.arrivals = kept
        # the last to arrive: the most behind, the first of equals (a world of one has none)
        a.last = max(kept, key=lambda x: x[2])[0] if len(kept) > 1 else None

    def _ev_step(self, ev: dict, t: float) -> None:
        step = _int(ev, "step")
        epoch = _int(ev, "epoch", 0, 2 ** 31, optional=True) or 0
        self.has_step_events = True
        if len(self.steps) >= MAX_STEPS:
            self._over("committed steps")
            return
        counters = ev.get("counters") if isinstance(ev.get("counters"), dict) else {}
        values = [_counter(counters.get(k)) for k in COUNTERS]
        skipped: list[str] = []
        trace = _trace(step, ev.get("trace"), skipped.append)
        if skipped:
            self.traces_skipped += 1
            for what in skipped:
                self.trace_skipped[what] = self.trace_skipped.get(what, 0) + 1
        self.steps.append(Step(step, epoch, t, self.line(trace), values, self.lanes.steps))
        if trace is not None:
            self.lanes.step(step, trace.admitted, trace.scheduled, trace.executed, trace.preempted,
                            trace.finished)
        else:
            self.lanes.step(step, (), (), (), (), {})

    def line(self, trace: StepTrace | None, budget: list[int] | None = None) -> str:
        """A step's line ("admit r0  run r0:6 ..."), while the budget for lines lasts (`budget`:
        [characters spent, lines past it], the model's own by default)."""
        if trace is None:
            return ""
        if budget is None:
            budget = self.line_budget
        try:
            line = step_events(trace, PLAIN, 8)[:2000]
        except Exception as e:      # what _trace let through and words cannot say: counted
            what = f"what cannot be said in words ({type(e).__name__})"
            self.trace_skipped[what] = self.trace_skipped.get(what, 0) + 1
            return ""
        if budget[0] + len(line) > LINE_BUDGET:
            budget[1] += 1
            return ""
        budget[0] += len(line)
        return line

    def _ev_idle(self, ev: dict, t: float) -> None:
        first, last = _int(ev, "first"), _int(ev, "last")
        if first > last:
            raise Malformed("first > last")
        if len(self.idle) < MAX_STEPS:
            self.idle.append((first, last, t))
        else:
            self._over("idle stretches")

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
        epoch = ev.get("epoch")
        if is_int(epoch) and 0 <= epoch < 2 ** 31:
            if len(self.epochs) < MAX_EPOCHS:
                self.epochs.append((t, epoch))
            else:
                self._over("epoch starts")

    def _ev_resize(self, ev: dict, t: float) -> None:
        """The world changed size: a mark in words (as launch says it), a new epoch on the ranks'
        lanes, a point of the world-size chart, and each kept member that was renumbered on
        the lane of its new rank."""
        epoch, step = _int(ev, "epoch", 0, 2 ** 31 - 1), _int(ev, "step")
        old, new = _int(ev, "from", 0, MAX_RANK + 1), _int(ev, "to", 0, MAX_RANK + 1)
        lists = []
        for key in ("kept", "lost", "added"):
            v = ev.get(key)
            if not isinstance(v, list) or not all(is_int(r) and 0 <= r <= MAX_RANK for r in v):
                raise Malformed(key)
            lists.append(v[:MAX_RANK + 1])
        kept, lost, added = lists
        why = ev.get("why")
        why = shown(why[:40]) if isinstance(why, str) and why else "resize"
        text = f"{why}: {resize_words(old, new, epoch, kept, lost, added)}"
        if is_int(ev.get("shard_pages")):
            text += f"; every rank holds the pool ({ev['shard_pages']} pages)"
        hidden = ev.get("hidden")
        if is_num(hidden) and hidden >= 0:
            text += f"; {_secs(hidden)} of start-up ran while the steps went on"
        # the lanes it touches: the ranks gone from the world, and the ranks that joined it
        gone = list(range(new, old))
        self._mark("resize", t, text, gone + added, step, epoch)
        if len(self.resizes) < MAX_RESIZES:
            self.resizes.append((t, step, epoch, old, new, why))
        else:
            self._over("world size changes")
        if len(self.epochs) < MAX_EPOCHS:
            self.epochs.append((t, epoch))
        else:
            self._over("epoch starts")
        for rank in added:
            if len(self.joined) < MAX_MEMBERS:
                self.joined.add((epoch, rank))
        members = {}
        for rank, was in enumerate(kept):
            if was not in self.pid_of:
                continue
            members[rank] = self.pid_of[was]
            if was == rank:
                continue
            if len(self.members) + len(self.renumbered) < MAX_MEMBERS:
                pid, host = self.pid_of[was]
                self.renumbered.append((t, rank, epoch, pid, host, was))
            else:
                self._over("members renumbered")
        self.pid_of = members

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

    def _ev_partition(self, ev: dict, t: float) -> None:
        rank = _int(ev, "rank", 0, MAX_RANK)
        seconds = max(_num(ev, "seconds"), 0.0)
        self._time(t + seconds)
        self._mark("partition", t, f"the link cut rank {rank} off for {_secs(seconds)}: everything to "
                   f"and from it lost, then it healed", [rank], ev.get("step"), ev.get("epoch"), dur=seconds)

    def _ev_pause(self, ev: dict, t: float) -> None:
        """A run under pause stopped on a loss: a note on the ranks it lost (mechanism 14)."""
        lost = ev.get("lost") if isinstance(ev.get("lost"), list) else []
        ranks = [x.get("rank") for x in lost[:64] if isinstance(x, dict)]
        can = ev.get("can") if isinstance(ev.get("can"), list) else []
        self._mark("note", t, f"paused: {say(ev.get('message'))[:300]}; waits for an operator "
                   f"({', '.join(say(c)[:16] for c in can[:4])})", ranks, ev.get("step"), ev.get("epoch"))

    def _ev_instruction(self, ev: dict, t: float) -> None:
        """An operator's instruction, carried out or refused (or the pause timeout's default)."""
        who = "the pause timeout" if ev.get("source") == "timeout" else "the operator"
        code = ev.get("code")
        how = {202: "carried out", 200: "carried out"}.get(code, f"refused ({say(code)})")
        what = f"{say(ev.get('instruction'))[:16]} (id {say(ev.get('id'))[:40]})"
        self._mark("note", t, f"{who}: {what}, {how}",
                   [], None, ev.get("epoch"))

    def _ev_wavefront(self, ev: dict, t: float) -> None:
        """A step's deadline passed: where every rank was (the last plan, result, FIRED), a note
        on the ranks that did not answer."""
        rows = [r for r in (ev.get("ranks") if isinstance(ev.get("ranks"), list) else [])[:64]
                if isinstance(r, dict)]

        def at(what: Any, key: str) -> str:
            return f"step {say(what.get(key))}" if isinstance(what, dict) else "none"
        said = "; ".join(f"rank {say(r.get('rank'))}: plan {at(r.get('plan'), 'step')}, result "
                         f"{at(r.get('result'), 'step')}{', no answer' if r.get('silent') is True else ''}"
                         for r in rows)
        silent = [r.get("rank") for r in rows if r.get("silent") is True]
        self._mark("note", t, f"the deadline passed: {said[:600]}", silent)

    def _ev_note(self, ev: dict, t: float) -> None:
        rank = ev.get("rank")
        if isinstance(ev.get("text"), str) and ev["text"].startswith(LINK_NOTE):
            return             # the link's own words for a message or a cut: its mark says it
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
