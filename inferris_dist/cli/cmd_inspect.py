"""`inferris-dist inspect WIRELOG [--step K] [--json]`: a wire log read back, step by step.

A wire log (`launch --wire-log`) holds one JSON line per message that crossed the boundary
and one per event (a rank lost, a restart, a note). Without --step: one line per attempt at
a step (step, epoch, plan items and bytes, result bytes, verdict), the events where they
happened, and the totals. With --step K: each attempt's plan item by item, every rank's
result (those of a failed attempt too, when the log holds them) and the join; where the log
holds a joined attempt's arrivals, first a table of them: each rank's result, ms after its plan
was sent, ms behind the first to arrive, the rank's own execute ms, and the last one marked
"last" (the one the join waited for; a world of one rank has no last). The file is
streamed: the summary keeps one small record per attempt, --step only that step's lines, so
a long run costs memory per step, not per message.

The log is read as input from outside, by the wire log reader (wirelog/logread) in its
strict mode. It must be a regular file (a fifo, a device or a socket is refused before a
byte is read); a line is at most 16 MB and holds at most 2**20 objects and arrays; every
field inspect uses is checked, type and range (a rank is below 4096), and a record that
fails is refused naming its line. A last line cut short (the disk filled up) is left out
with one note, the rest shown; any other bad line refuses the log, nothing printed, one
line on stderr, exit status 2. Events inspect does not know are skipped.

What a link fault did to a message (its "link": lost, delayed, duplicated, reordered) is said
on the line of the message: the attempt's row ("link: plan to rank 1 lost") and, with --step,
the rank's row of the results ("link: plan lost"). A RESULT the link lost, or took to deliver
later, is no answer (the one delivered later is). A partition is an event line.

--json: one JSON object per line, "record" first (what it is); nothing else is printed.
  Without --step, in the log's order:
    {"record": "attempt", "step": S, "epoch": E, "items": N, "plan_bytes": B,
     "ranks": [R, ...], "result_bytes": [B or null, ...], "verdict": V, "message": M or null}
        one per (step, epoch) attempt. "ranks": those the plan went to or that answered;
        "result_bytes": the size of each one's RESULT, null where the log holds none;
        "verdict": "joined", what failed it ("GroupViolation", "rank 2 lost (died)") or
        "no answer in the log"; "message": the failure's own words. Where a link fault acted
        on the attempt's messages, also "link": [{"rank": R, "dir": "out"|"in", "type":
        "PLAN"|"RESULT", "link": "lost"|"delayed"|"duplicated"|"reordered"}, ...], each once,
        in the order they crossed (a lost or delayed RESULT is not one that came: its
        "result_bytes" is another copy's, or null).
    {"record": "event", "event": NAME, FIELD: VALUE, ...}
        one per event, where it happened, with these fields only:
        rank-lost    rank (null: every rank), ranks, step (null: start-up), epoch, reason, message
        step-failed  kind, ranks, step, epoch, message
        audit-failed rank, step, epoch, message
        restart      ranks, epoch, step, shard_pages
        note         rank, epoch, text
        idle         first, last, text (steps first..last ran without a round trip)
        turned-away  messages, connections (counts by peer)
        partition    rank, step, epoch, seconds (a link fault cut the rank off that long)
    {"record": "truncated", "line": N}   the last line, cut short, left out (if so)
    {"record": "totals", "messages": N, "bytes_out": B, "bytes_in": B, "steps": N,
     "attempts": N, "ranks": N}   always last
  With --step K: the idle event holding K, if any; then per attempt at K:
    {"record": "plan", "step": K, "epoch": E, "bytes": B, "ranks": [R, ...], "items": N}
    {"record": "item", "step": K, "epoch": E, "index": I, "request_id": ID, "start_position": P,
     "num_tokens": N, "draft_len": D, "decode": true|false, "verdict_index": V,
     "placements": [PAGE, ...], "prior_drafts": D (not 0 only at rung overlap)}   one per plan item
    {"record": "result", "step": K, "epoch": E, "rank": R, "bytes": B or null,
     "outcomes": [{"request_id", "start_position", "executed_tokens", "accepted", "writes"},
     ...] or null, "undecodable": TEXT or null, "inside": [4 numbers] or null}
        one per rank; null "bytes" and "outcomes": no RESULT of that rank in the log; where a
        link fault acted on the rank's PLAN or RESULT, also "link": [{"dir", "type", "link"}];
        where the log holds the rank's arrival at the join, also "arrival": {"after": S,
        "behind": S, "exec": S or null, "last": true|false} (seconds after its plan was sent,
        behind the first arrival, its own execute time; "last": the join waited for it)
    {"record": "join", "step": K, "epoch": E, "verdict": V, "message": M or null}
    {"record": "event", ...}   the attempt's other events, as above
  and last, {"record": "truncated", "line": N} if the last line was cut short.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TextIO

from inferris_dist.cli.args import EXIT_OK, int_arg
from inferris_dist.cli.flags import described
from inferris_dist.cli.render import STEP_WIDTH, Style, human_bytes, shown
from inferris_dist.engine import WorkloadError
from inferris_dist.protocol.placement import MAX_WORLD_SIZE
from inferris_dist.wirelog import schema

JSON_HELP = __doc__[__doc__.index("--json:"):]      # the shapes, for `inspect --help`


def add_arguments(ins) -> None:
    described(ins, epilog=JSON_HELP)
    ins.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    ins.add_argument("--step", type=int_arg, metavar="K", help="show step K in full")
    ins.add_argument("--json", action="store_true", help="one JSON object per line (shapes below)")


def main(args) -> int:
    return run_inspect(args.wirelog, args.step, sys.stdout, Style.for_stream(sys.stdout), args.json)
PAD = " " * (STEP_WIDTH + 2)     # event lines sit under the figures, as in launch's output
MAX_RANKS = MAX_WORLD_SIZE       # a rank read from the log is below this, or the log is refused
MAX_INT = (1 << 63) - 1          # any other number


def run_inspect(path: str, step: int | None, out: TextIO, style: Style, as_json: bool = False) -> int:
    log = Reader(path, step).read()
    if as_json:
        lines = [json.dumps(o) for o in (_summary_objects(log) if step is None else _step_objects(log))]
    else:
        lines = _summary(log, style) if step is None else _one_step(log, style)
    out.write("".join(line + "\n" for line in lines))     # all read before a word is printed
    return EXIT_OK


# -- reading: one line naming the file for anything that is not a wire log ---------------

Check = tuple[Callable[[Any], bool], str]     # a field's test, and what it must be, in words


def _records(path: str) -> Iterator[tuple[int, dict | None]]:
    """(line number, record) for each record of the log, checked (unknown events left out);
    (n, None) last when line n, the last, was cut short. The reader is strict: a line that
    is no record refuses the log, naming it; so does a record this module finds malformed."""
    from inferris_dist.wirelog.logread import LogReader, Malformed
    # The reader's line bound (16 MB); no bound on the bytes read in all: inspect keeps a small
    # record per attempt (--step: one step's), so a long log costs time, not memory.
    reader = LogReader(path, strict=True, command="inspect", max_read=None)
    for obj in reader:
        try:
            record = _record(obj)
        except Malformed as e:
            raise reader.refused(str(e)) from None
        if record is not None:
            yield reader.line, record
    if reader.cut_short is not None:
        yield reader.cut_short, None


def _record(obj: dict) -> dict | None:
    """A message or a known event (the reader gives records only: schema.record_kind), as far
    as inspect uses it, checked; None: an event inspect does not know."""
    from inferris_dist.wirelog.logread import Malformed
    if "event" in obj:
        kind = obj["event"]
        if kind == "attempt":        # a void one, a joined one's arrivals: more than the messages say
            void = isinstance(obj.get("verdict"), str) and obj["verdict"].startswith("void")
            if not void and "arrivals" not in obj:
                return None
        if kind not in EVENTS:
            return None
        ev = {"event": kind, **_checked(obj, EVENTS[kind], f"{kind} event")}
        for name, (ok, must) in OPTIONAL.get(kind, {}).items():
            if name in obj:
                if not ok(obj[name]):
                    raise Malformed(f"{kind} event: {name} must be {must}")
                ev[name] = obj[name]
        if "arrivals" in ev:
            ev["arrivals"] = _arrivals(ev["arrivals"], f"{kind} event")
        return ev
    kind = obj.get("type")
    kind = shown(kind) if isinstance(kind, str) and len(kind) <= 32 else "wire"   # an error stays short
    msg = _checked(obj, MESSAGE, f"{kind} message")
    if "link" in obj:
        if obj["link"] not in LINK:
            raise Malformed(f"{kind} message: link must be one of {', '.join(LINK)}")
        msg["link"] = obj["link"]
    if msg["type"] == "PLAN":
        body = obj.get("body")
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise Malformed("PLAN message: body must be an object with a list of items")
        msg["items"] = [_item(it, f"PLAN item {i}") for i, it in enumerate(body["items"])]
    elif msg["type"] == "RESULT":
        msg["result"] = _result(obj)
    return msg


def _result(obj: dict) -> "Result":
    from inferris_dist.wirelog.logread import Malformed
    body, inside = obj.get("body"), obj.get("inside")
    if inside is not None and not (isinstance(inside, list) and len(inside) == 4
                                   and all(type(x) in (int, float) and math.isfinite(x) for x in inside)):
        raise Malformed("RESULT message: inside must be a list of 4 numbers")
    if isinstance(body, dict) and set(body) == {"undecodable"} and isinstance(body["undecodable"], str):
        return Result(obj["bytes"], None, body["undecodable"], inside)
    if not isinstance(body, list):
        raise Malformed('RESULT message: body must be a list of outcomes or {"undecodable": TEXT}')
    return Result(obj["bytes"], [_checked(o, OUTCOME, f"RESULT outcome {i}") for i, o in enumerate(body)],
                  None, inside)


def _item(obj: Any, what: str) -> dict:
    """A plan item; `prior_drafts` 0 where the log has none (a plan without that field)."""
    from inferris_dist.wirelog.logread import Malformed
    item = _checked(obj, ITEM, what)
    prior = obj.get("prior_drafts", 0)
    if not (_is_int(prior) and prior >= 0):
        raise Malformed(f"{what}: prior_drafts must be an integer >= 0")
    item["prior_drafts"] = prior
    return item


def _arrivals(arrivals: list, what: str) -> list[dict]:
    """A joined attempt's arrivals, each checked (ARRIVAL, and `exec` where said), each rank once;
    what a newer writer adds to one is left out."""
    from inferris_dist.wirelog.logread import Malformed
    out, seen = [], set()
    for i, obj in enumerate(arrivals):
        arrival = _checked(obj, ARRIVAL, f"{what}: arrival {i}")
        if "exec" in obj:
            if not SECONDS[0](obj["exec"]):
                raise Malformed(f"{what}: arrival {i}: exec must be {SECONDS[1]}")
            arrival["exec"] = obj["exec"]
        if arrival["rank"] in seen:
            raise Malformed(f"{what}: arrival {i}: rank {arrival['rank']} arrives twice")
        seen.add(arrival["rank"])
        out.append(arrival)
    return out


def _checked(obj: Any, fields: dict[str, Check], what: str) -> dict:
    """The `fields` of `obj`, each checked; a new dict of those only, in that order."""
    from inferris_dist.wirelog.logread import Malformed
    if not isinstance(obj, dict):
        raise Malformed(f"{what} must be an object")
    got = {}
    for key, (ok, must) in fields.items():
        if key not in obj:
            raise Malformed(f"{what}: no {key}")
        if not ok(obj[key]):
            raise Malformed(f"{what}: {key} must be {must}")
        got[key] = obj[key]
    return got


def _is_int(v: Any) -> bool:
    return type(v) is int and -MAX_INT <= v <= MAX_INT     # JSON gives no int subclass but bool


def _is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _is_rank(v: Any) -> bool:
    return type(v) is int and 0 <= v < MAX_RANKS


def _ints_within(v: Any, low: int, high: int) -> bool:
    """v is a list of whole numbers in low..high (checked at C speed: a log has millions)."""
    return isinstance(v, list) and (not v or set(map(type, v)) == {int} and low <= min(v) and max(v) <= high)


def _list_of(kinds: frozenset[str]) -> Check:
    """A list whose elements are of `kinds` (schema.TYPES: a bool is no int)."""
    types = {t for k in kinds for t in schema.TYPES[k]}
    names = {"object": "objects", "list": "lists", "str": "strings", "int": "whole numbers",
             "number": "numbers", "bool": "true or false", "null": "nulls"}
    return ((lambda v: isinstance(v, list) and all(type(x) in types for x in v)),
            "a list of " + " or ".join(names[k] for k in sorted(kinds)))


def _maybe(check: Check) -> Check:
    return (lambda v: v is None or check[0](v)), f"{check[1]} or null"


INT: Check = (_is_int, "a whole number")
COUNT: Check = (_is_count, "a whole number >= 0")
RANK: Check = (_is_rank, f"a rank, 0..{MAX_RANKS - 1}")
TEXT: Check = (lambda v: isinstance(v, str), "a string")
FLAG: Check = (lambda v: type(v) is bool, "true or false")
PAGES: Check = (lambda v: _ints_within(v, 0, MAX_INT), "a list of page numbers")
RANKS: Check = (lambda v: isinstance(v, list) and len(v) <= MAX_RANKS and _ints_within(v, 0, MAX_RANKS - 1),
                f"a list of ranks, 0..{MAX_RANKS - 1}")
COUNTS: Check = (lambda v: isinstance(v, dict) and all(map(_is_count, v.values())),
                 "an object of counts")
SECONDS: Check = (lambda v: type(v) in (int, float) and math.isfinite(v) and 0 <= v <= MAX_INT,
                  "a number of seconds >= 0")
# A schema field's check, by its kinds and its sort (schema.SORTS): what inspect bounds it by.
CHECKS: dict[tuple[str, str], Check] = {
    ("int", ""): INT, ("int", "count"): COUNT, ("int", "rank"): RANK, ("str", ""): TEXT,
    ("bool", ""): FLAG, ("list", "page"): PAGES, ("list", "rank"): RANKS, ("object", "count"): COUNTS,
    ("number", "seconds"): SECONDS,
}


def _check(f: schema.Field, present: bool = False, any_choice: bool = False) -> Check:
    """What inspect requires of a value of schema field `f`: of its kind, within its sort, one
    of its choices (unless `any_choice`: inspect takes a newer writer's too), null where the
    schema allows it (unless `present`: inspect needs the value)."""
    if f.choices and not any_choice:
        choices = f.choices
        return (lambda v: v in choices), " or ".join(json.dumps(c) for c in choices)
    kind = next(iter(f.kinds - {"null"}))
    check = _list_of(f.items) if (kind, f.sort) == ("list", "") else CHECKS[(kind, f.sort)]
    return _maybe(check) if "null" in f.kinds and not present else check


def _reads(fields: dict[str, schema.Field], names: str, present: tuple = (), any_choice: tuple = ()
           ) -> dict[str, Check]:
    """The checks of the schema's `fields` that inspect reads (`names`, in that order)."""
    return {name: _check(fields[name], name in present, name in any_choice) for name in names.split()}


# What inspect reads of each record, checked as the schema has it. A message it shows is of a
# rank, of a size; its type may be a newer writer's.
MESSAGE = _reads(schema.MESSAGE, "dir rank epoch step type bytes", present=("rank", "bytes"),
                 any_choice=("type",))
ITEM = _reads(schema.ITEM, "request_id start_position num_tokens draft_len decode verdict_index placements")
OUTCOME = _reads(schema.OUTCOME, " ".join(schema.OUTCOME))
EVENTS = {  # the events inspect shows, and the fields it uses of each; the others are skipped
    event: _reads(schema.EVENTS[event].fields, names) for event, names in {
        "rank-lost": "rank ranks step epoch reason message",
        "step-failed": "kind ranks step epoch message",
        "audit-failed": "rank step epoch message",
        "restart": "ranks epoch step shard_pages",
        "note": "rank epoch text",
        "idle": "first last text",
        "attempt": "step epoch verdict",
        "turned-away": "messages connections",
        "partition": "rank step epoch seconds",
    }.items()}
# What inspect reads of an event where the writer writes it (the schema's optional fields),
# checked as the schema has it when there: a joined attempt's arrivals, each an ARRIVAL (and
# its `exec`, SECONDS, where the rank said it).
OPTIONAL = {"attempt": _reads(schema.EVENTS["attempt"].fields, "arrivals")}
ARRIVAL = {"rank": RANK, "after": SECONDS, "behind": SECONDS}
LINK = schema.LINK     # what a link fault did to a message
NOT_CAME = ("lost", "delayed")      # a RESULT so marked never reached the scheduler (then, at least)


# -- saying it ------------------------------------------------------------------------------

def _txt(v: Any) -> str:
    """Any value from the log as safe text: strings escaped, page lists joined."""
    if isinstance(v, str):
        return shown(v)
    if isinstance(v, list) and all(map(_is_int, v)):
        return ",".join(map(str, v)) or "-"
    return shown(json.dumps(v))


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "ranks -"
    if len(ranks) > 2 and all(b == a + 1 for a, b in zip(ranks, ranks[1:])):   # no list built
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _event_line(ev: dict, style: Style) -> str:
    """One event, said once, in the words launch uses for it."""
    kind, g = ev["event"], ev.get
    where = ("during start-up" if g("step") is None
             else f"at step {g('step')}, epoch {g('epoch')}")
    if kind == "rank-lost":
        return PAD + style.red(f"! rank lost {where}: {_txt(g('message'))}")
    if kind == "step-failed":
        return PAD + style.red(f"! {_txt(g('kind'))} {where}: {_txt(g('message'))}")
    if kind == "audit-failed":
        return PAD + style.red(f"! audit failed {where}: {_txt(g('message'))}")
    if kind == "restart":
        return PAD + style.yellow(f"restart: {_ranks(g('ranks'))} into epoch {g('epoch')} at step "
                                  f"{g('step')}, shard of {g('shard_pages')} pages")
    if kind == "note":
        return PAD + style.yellow(f"! {_txt(g('text'))}")
    if kind == "partition":
        return PAD + style.red(f"! partition {where}: rank {g('rank')} cut off for {g('seconds'):g} s "
                               f"(everything to and from it lost)")
    if kind == "idle":
        first, last = g("first"), g("last")
        label = str(first) if first == last else f"{first}-{last}"
        return f"{label:>{STEP_WIDTH}}  " + style.dim(f"idle: {_txt(g('text'))}")
    # turned-away
    counts = [ev["messages"], ev["connections"]]
    sums = [sum(c.values()) for c in counts]
    return PAD + style.yellow(f"turned away: {sums[0]} message(s) from {len(counts[0])} peer(s) "
                              f"holding no rank, {sums[1]} connection(s) refused")


def _key(obj: dict) -> tuple[int, int] | None:
    """(step, epoch) of a message or event, when both are there."""
    s, e = obj.get("step"), obj.get("epoch")
    return (s, e) if s is not None and e is not None else None


def _lost(ev: dict) -> str:
    who = "every rank" if ev["rank"] is None else _ranks(ev["ranks"])
    return f"{who} lost ({ev['reason']})"


def _truncated(n: int) -> str:
    return f"line {n}, the last, is cut short (as by a full disk): left out"


@dataclass
class Result:
    """One rank's RESULT: its size; in --step, its outcomes (or why they did not decode)."""
    bytes: int
    outcomes: list[dict] | None
    undecodable: str | None = None
    inside: list | None = None


@dataclass
class Attempt:
    """One (step, epoch): the plan went out to some ranks; results came back or did not."""
    step: int
    epoch: int
    plan_bytes: int
    items: list | int                       # the items (--step), or just how many (summary)
    ranks: set[int] = field(default_factory=set)
    results: dict[int, Result] = field(default_factory=dict)
    failed: str = ""                        # what a step-failed or rank-lost event said of it
    why: str = ""                           # that event's message
    events: list[dict] = field(default_factory=list)   # its other events (--step)
    links: dict = field(default_factory=dict)       # (rank, dir, type, link) -> None: what the link did
    arrivals: list[dict] = field(default_factory=list)   # --step: its ranks' arrivals at the join

    def last(self) -> int | None:
        """The rank whose result came last (the join waited for it); None for fewer than two."""
        if len(self.arrivals) < 2:
            return None
        return max(self.arrivals, key=lambda x: x["behind"])["rank"]     # the first of equals

    def answered(self) -> bool:
        return bool(self.ranks) and all(r in self.results for r in self.ranks)

    def verdict(self) -> str:
        # Every rank answered and no event said otherwise: the join went through.
        return self.failed or ("joined" if self.answered() else "no answer in the log")

    def all_ranks(self) -> list[int]:
        return sorted(self.ranks | set(self.results))

    def link_tag(self) -> str:
        """What the link did to the attempt's messages, for its row: "" when nothing."""
        said = [f"{kind.lower()} {'to' if d == 'out' else 'from'} rank {r} {what}"
                for r, d, kind, what in self.links]
        return "link: " + "; ".join(said) if said else ""

    def rank_link(self, rank: int) -> str:
        """What the link did to one rank's messages, for its row of the results."""
        said = [f"{kind.lower()} {what}" for r, _, kind, what in self.links if r == rank]
        return "link: " + ", ".join(said) if said else ""

    def link_objects(self, rank: int | None = None) -> list[dict]:
        return [({} if rank is not None else {"rank": r}) | {"dir": d, "type": kind, "link": what}
                for r, d, kind, what in self.links if rank is None or r == rank]


class Reader:
    """The one pass both views share. The summary (step None) keeps a small record per attempt
    and its events; --step K keeps only step K's attempts, whole."""

    def __init__(self, path: str, step: int | None):
        self.path, self.step = path, step
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.rows: list[Attempt | dict] = []      # attempts and events, in the log's order
        self.current: Attempt | None = None       # the attempt under way: a note is about it
        self.messages = self.sent = self.received = 0
        self.ranks: set[int] = set()
        self.steps: set[int] = set()              # planned (the summary's only: --step needs `last`)
        self.idle_steps, self.last = 0, -1
        self.idle: list[dict] = []                # the idle stretch holding step K, if it is one
        self.truncated: int | None = None         # the number of the last line, cut short
        self.early: list[dict] = []               # --step: step K's events before its first plan

    def read(self) -> "Reader":
        for n, obj in _records(self.path):
            if obj is None:
                self.truncated = n
            elif "event" in obj:
                self._event(obj)
            else:
                self._message(obj)
        name = shown(str(self.path))
        if not self.messages:
            raise WorkloadError(f"{name}: no messages in the log")
        if self.step is not None and not self.attempts and not self.idle:
            known = "no steps" if self.last < 0 else f"steps 0..{self.last}"
            raise WorkloadError(f"{name}: no step {self.step} in the log ({known})")
        return self

    def _message(self, msg: dict) -> None:
        self.messages += 1
        self.sent += msg["bytes"] if msg["dir"] == "out" else 0
        self.received += msg["bytes"] if msg["dir"] == "in" else 0
        self.ranks.add(msg["rank"])
        if msg["type"] == "PLAN":
            self.last = max(self.last, msg["step"])
            if self.step is None:
                self.steps.add(msg["step"])
            self.current = self._plan(msg) if self.step in (None, msg["step"]) else None
            if "link" in msg and self.current is not None:
                self.current.links[(msg["rank"], "out", "PLAN", msg["link"])] = None
        elif msg["type"] == "RESULT" and _key(msg) in self.attempts:
            a = self.attempts[_key(msg)]
            if "link" in msg:
                a.links[(msg["rank"], "in", "RESULT", msg["link"])] = None
                if msg["link"] in NOT_CAME:
                    return                        # the link lost it, or holds it: no answer (yet)
            result = msg["result"]
            if self.step is None:                 # the summary needs sizes only
                result = Result(result.bytes, None)
            a.results[msg["rank"]] = result

    def _plan(self, msg: dict) -> Attempt:
        a = self.attempts.get(_key(msg))
        if a is None:                             # every rank gets the same plan bytes: keep one
            items = msg["items"]
            a = Attempt(msg["step"], msg["epoch"], msg["bytes"], len(items) if self.step is None else items)
            self.attempts[_key(msg)] = a
            self.rows.append(a)
            a.events += self.early                # a partition cutting the first rank off: before it
            self.early = []
        a.ranks.add(msg["rank"])
        return a

    def _event(self, ev: dict) -> None:
        if ev["event"] == "idle" and ev["first"] <= ev["last"]:
            first, last = ev["first"], ev["last"]
            self.idle_steps += last - first + 1
            self.last = max(self.last, last)
            if self.step is not None and first <= self.step <= last:
                self.idle.append(ev)
        # The verdict of the attempt it names; a rank lost after every rank answered was lost
        # in the audit that followed: an event, not the verdict.
        at = self.attempts.get(_key(ev)) if _key(ev) else None
        if ev["event"] == "attempt":          # said of its attempt only (one whose plan is in the log)
            if at is not None and ev["verdict"].startswith("void") and not at.failed:   # sent ahead, unread
                at.failed, at.why = ev["verdict"], ""
            if at is not None and self.step is not None and "arrivals" in ev:
                at.arrivals = ev["arrivals"]
            return
        if at is not None and (ev["event"] == "step-failed"
                               or ev["event"] == "rank-lost" and not at.answered()):
            at.failed = ev["kind"] if ev["event"] == "step-failed" else _lost(ev)   # as in the log
            at.why = ev["message"]
            if self.step is not None:
                return                            # --step says it on the join line
        if self.step is None:
            self.rows.append(ev)
        # Under step K: the events naming step K (a restart names the step it repeats), and
        # those naming no step (a note) that came while one of step K's attempts was under way.
        # (An idle stretch is shown only for the steps it holds.)
        elif self.rows and ev["event"] != "idle" and (
                ev.get("step") == self.step if ev.get("step") is not None else self.current is not None):
            self.rows[-1].events.append(ev)
        elif ev["event"] == "partition" and ev["step"] == self.step:
            self.early.append(ev)


# -- the summary: one line per attempt -------------------------------------------------------

def _aligned(header: tuple, rows: list[tuple], right: set[int]):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def fmt(row: tuple, strip: bool = True) -> str:
        line = "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths)))
        return line.rstrip() if strip else line
    return fmt


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _painted(verdict: str, style: Style, why: str = "") -> str:
    return (style.green if verdict == "joined" else style.red)(shown(verdict + (f": {why}" if why else "")))


def _result_bytes(a: Attempt) -> str:
    sizes = {r.bytes for r in a.results.values()}
    if not sizes:
        return "-"                                # no rank answered: nothing came back
    if len(sizes) == 1 and len(a.results) == len(a.ranks):
        return f"{human_bytes(sizes.pop())} each"
    return " ".join(human_bytes(a.results[r].bytes) if r in a.results else "-" for r in a.all_ranks())


def _summary(log: Reader, style: Style) -> list[str]:
    cells = {id(a): (str(a.step), str(a.epoch), str(a.items),
                     f"{human_bytes(a.plan_bytes)} x{len(a.ranks)}", _result_bytes(a))
             for a in log.attempts.values()}
    header = ("step".rjust(STEP_WIDTH), "epoch", "items", "plan", "result")
    fmt = _aligned(header, list(cells.values()), {0, 1, 2})
    lines = [style.dim(fmt(header, strip=False) + "  verdict")]
    for row in log.rows:
        if isinstance(row, dict):
            lines.append(_event_line(row, style))
            continue
        tag = row.link_tag()
        lines.append(fmt(cells[id(row)], strip=False) + "  " + _painted(row.verdict(), style)
                     + ("  " + style.yellow(tag) if tag else ""))
    if log.truncated is not None:
        lines.append(PAD + style.yellow(f"! {_truncated(log.truncated)}"))
    steps = len(log.steps) + log.idle_steps
    lines.append(f"{_count(log.messages, 'message')}, {human_bytes(log.sent)} out, "
                 f"{human_bytes(log.received)} in; {_count(steps, 'step')} in "
                 f"{_count(len(log.attempts), 'attempt')}; {_count(len(log.ranks), 'rank')}")
    return lines


def _event_object(ev: dict) -> dict:
    return {"record": "event", **ev}


def _summary_objects(log: Reader) -> Iterator[dict]:
    for row in log.rows:
        if isinstance(row, dict):
            yield _event_object(row)
            continue
        ranks = row.all_ranks()
        obj = {"record": "attempt", "step": row.step, "epoch": row.epoch, "items": row.items,
               "plan_bytes": row.plan_bytes, "ranks": ranks,
               "result_bytes": [row.results[r].bytes if r in row.results else None for r in ranks],
               "verdict": row.verdict(), "message": row.why or None}
        if row.links:
            obj["link"] = row.link_objects()
        yield obj
    if log.truncated is not None:
        yield {"record": "truncated", "line": log.truncated}
    yield {"record": "totals", "messages": log.messages, "bytes_out": log.sent, "bytes_in": log.received,
           "steps": len(log.steps) + log.idle_steps, "attempts": len(log.attempts),
           "ranks": len(log.ranks)}


# -- one step: its plan, every rank's result, the join, per attempt ----------------------------

def _one_step(log: Reader, style: Style) -> list[str]:
    lines = [_event_line(ev, style) for ev in log.idle]
    for a in log.attempts.values():
        plan = f"{_count(len(a.items), 'item')}, {human_bytes(a.plan_bytes)} to {_ranks(sorted(a.ranks))}"
        lines.append(style.bold(f"step {a.step}, epoch {a.epoch}") + f": plan of {plan}")
        lines += _arrival_table(a, style) + _plan_table(a.items, style) + _result_table(a, style)
        lines.append(PAD + "join: " + _painted(a.verdict(), style, a.why))
        lines += [_event_line(ev, style) for ev in a.events]
    if log.truncated is not None:
        lines.append(PAD + style.yellow(f"! {_truncated(log.truncated)}"))
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def _arrival_table(a: Attempt, style: Style) -> list[str]:
    """Each rank's result as it came to the join, in rank order; the last marked."""
    if not a.arrivals:
        return []
    header = ("rank", "after ms", "behind first ms", "exec ms")
    last = a.last()
    rows = [(str(x["rank"]), _ms(x["after"]), _ms(x["behind"]), _ms(x["exec"]) if "exec" in x else "-")
            for x in sorted(a.arrivals, key=lambda x: x["rank"])]
    fmt = _aligned(header, rows, {0, 1, 2, 3})
    return [PAD + "arrivals at the join:", PAD + style.dim(fmt(header))] + [
        PAD + fmt(r, strip=False) + ("  " + style.yellow("last") if int(r[0]) == last else "")
        for r in rows]


def _plan_table(items: list[dict], style: Style) -> list[str]:
    header = ("item", "request", "start", "tokens", "draft", "decode", "verdict", "pages")
    rows = [(str(i), _txt(it["request_id"]), str(it["start_position"]), str(it["num_tokens"]),
             str(it["draft_len"]), "yes" if it["decode"] else "no", str(it["verdict_index"]),
             _txt(it["placements"])) for i, it in enumerate(items)]
    if any(it["prior_drafts"] for it in items):     # overlap: starts earlier by the drafts rejected
        header = header[:7] + ("after drafts",) + header[7:]
        rows = [r[:7] + (str(it["prior_drafts"] or ""),) + r[7:] for r, it in zip(rows, items)]
    fmt = _aligned(header, rows, {0, 2, 3, 4, 6, 7} if len(header) == 9 else {0, 2, 3, 4, 6})
    return [PAD + style.dim(fmt(header))] + [PAD + fmt(r) for r in rows]


def _result_table(a: Attempt, style: Style) -> list[str]:
    """Per rank, per outcome; a rank that answered exactly as the first one did says so."""
    header = ("rank", "bytes", "request", "start", "ran", "accepted", "writes")
    if not a.results:
        said = [f"rank {r}: {a.rank_link(r)}" for r in a.all_ranks() if a.rank_link(r)]
        return [PAD + "results: none in the log" + ("  " + style.yellow("; ".join(said)) if said else "")]
    rows, free = [], {}                    # free: row index -> text that spans the outcome columns
    tags = {}                              # row index -> what the link did to that rank's messages
    first = min(a.results)
    for rank in a.all_ranks():
        if a.rank_link(rank):
            tags[len(rows)] = style.yellow(a.rank_link(rank))
        r = a.results.get(rank)
        outcomes = None if r is None else r.outcomes
        if not outcomes or (rank != first and outcomes == a.results[first].outcomes):
            free[len(rows)] = ("no result in the log" if r is None
                               else f"undecodable: {shown(r.undecodable)}" if r.undecodable is not None
                               else "no outcomes" if not outcomes else f"same as rank {first}")
            rows.append((str(rank), "-" if r is None else human_bytes(r.bytes)) + ("",) * 5)
            continue
        for i, o in enumerate(outcomes):
            rows.append((str(rank) if i == 0 else "", human_bytes(r.bytes) if i == 0 else "",
                         _txt(o["request_id"]), str(o["start_position"]), str(o["executed_tokens"]),
                         str(o["accepted"]), _txt(o["writes"])))
    fmt = _aligned(header, rows, {0, 1, 3, 4, 5})
    return [PAD + style.dim(fmt(header))] + [
        PAD + (fmt(r[:2]) + "  " + free[i] if i in free else fmt(r)) + ("  " + tags[i] if i in tags else "")
        for i, r in enumerate(rows)]


def _step_objects(log: Reader) -> Iterator[dict]:
    for ev in log.idle:
        yield _event_object(ev)
    for a in log.attempts.values():
        at = {"step": a.step, "epoch": a.epoch}
        yield {"record": "plan", **at, "bytes": a.plan_bytes, "ranks": sorted(a.ranks), "items": len(a.items)}
        arrivals, last = {x["rank"]: x for x in a.arrivals}, a.last()
        for i, it in enumerate(a.items):
            yield {"record": "item", **at, "index": i, **it}
        for rank in a.all_ranks():
            r = a.results.get(rank)
            obj = {"record": "result", **at, "rank": rank, "bytes": None if r is None else r.bytes,
                   "outcomes": None if r is None else r.outcomes,
                   "undecodable": None if r is None else r.undecodable,
                   "inside": None if r is None else r.inside}
            if a.link_objects(rank):
                obj["link"] = a.link_objects(rank)
            arrival = arrivals.get(rank)
            if arrival is not None:
                obj["arrival"] = {"after": arrival["after"], "behind": arrival["behind"],
                                  "exec": arrival.get("exec"), "last": rank == last}
            yield obj
        yield {"record": "join", **at, "verdict": a.verdict(), "message": a.why or None}
        for ev in a.events:
            yield _event_object(ev)
    if log.truncated is not None:
        yield {"record": "truncated", "line": log.truncated}
