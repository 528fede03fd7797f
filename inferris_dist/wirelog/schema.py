"""The wire log's schema: every record a WireLog writes, field by field, in one table.

A wire log (`launch --wire-log FILE`) is one JSON object per line, of two shapes:

- a message that crossed the boundary: MESSAGE below (direction, rank, epoch, step, type,
  bytes, the decoded body, and for a reply what more is known of it);
- an event (a rank lost, a restart, a committed step): {"t": ..., "event": NAME, FIELD: ...},
  its fields given by EVENTS[NAME].

The table is what the writer writes today, derived from its call sites; it is the contract
between the writer (`records.WireLog`, which checks against it when checking is on: the
test suite turns it on, production does not pay for it) and the readers (`inspect`, the
page, anything later). The readers read with tolerance of their own (an older or a newer
writer's log, a hostile one); `check_record` says whether one parsed line is exactly what
today's writer writes.

A field's kinds are JSON's, named: "int" (a whole number, never a bool), "number" (an int
or a float), "str", "bool", "null", "list", "object", or ANY. A required field is in every
record of its kind; an optional one may be left out (the writer leaves it out, it never
writes null for "not known" unless "null" is among the kinds). A field's sort says more of
what its numbers are, where a reader bounds them (SORTS): a rank, a count, a page, seconds;
a list's or an object's sort is its elements'.

The bodies of the two messages a reader takes apart are here too: a PLAN's body is {"step":
int, "items": [ITEM, ...]}, a RESULT's a list of OUTCOME (or {"undecodable": why}).

The readers derive what they read from these tables (each chooses which records and fields
it reads and how tolerant it is): `inspect`'s checks, the history checker's, the page's
columns. `TYPES` gives each kind's Python types, as json.loads makes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from inferris_dist.protocol.wire import MsgType

KINDS = frozenset({"int", "number", "str", "bool", "null", "list", "object"})
ANY = KINDS
# The Python types of each kind as json.loads gives them (a bool is no int, as the schema has it).
TYPES = {"int": (int,), "number": (int, float), "str": (str,), "bool": (bool,), "null": (type(None),),
         "list": (list,), "object": (dict,)}
# A number's sort, beyond its kind: what a reader may bound it by.
SORTS = {"rank": "a rank of the run (0 .. the largest world size - 1)", "count": "a whole number >= 0",
         "page": "a page number (>= 0)", "seconds": "a duration, a finite number >= 0"}


class SchemaError(ValueError):
    """A record that is not what the schema says: an unknown event or field, a required field
    missing, a value of another kind, or one outside its choices."""


@dataclass(frozen=True)
class Field:
    kinds: frozenset[str]          # the JSON kinds its value may be (ANY: whatever it is)
    required: bool
    meaning: str
    choices: tuple = ()            # when not empty: the only values it takes
    items: frozenset[str] = ANY        # a list's elements: their kinds
    sort: str = ""                 # what its numbers are (SORTS; a list's or an object's: its values')


def _kinds(kinds: str | frozenset) -> frozenset[str]:
    kinds = frozenset(kinds.split("|")) if isinstance(kinds, str) else kinds
    assert kinds <= KINDS, kinds
    return kinds


def _field(kinds, meaning: str, required: bool, choices: tuple, items, sort: str) -> Field:
    assert sort in SORTS or not sort, sort
    return Field(_kinds(kinds), required, meaning, choices, _kinds(items), sort)


def req(kinds: str | frozenset, meaning: str, choices: tuple = (), items: str | frozenset = ANY,
        sort: str = "") -> Field:
    return _field(kinds, meaning, True, choices, items, sort)


def opt(kinds: str | frozenset, meaning: str, choices: tuple = (), items: str | frozenset = ANY,
        sort: str = "") -> Field:
    return _field(kinds, meaning, False, choices, items, sort)


TIME = req("number", "the scheduler's monotonic clock, seconds (an event's start where it has a dur)")
MESSAGE_TYPES = tuple(m.name for m in MsgType)
RESIZE_WHY = ("shrink", "regrow", "scale-down", "scale-up")   # the policy or the operator's instruction
DROPPED = ("stale", "duplicate", "future", "void")
LINK = ("lost", "delayed", "duplicated", "reordered")   # what a link fault did to a message
PHASES = ("prepare", "execute", "commit", "recover")

MESSAGE: dict[str, Field] = {
    "t": req("number", "when it crossed (a reply: when it came)"),
    "dir": req("str", "out: scheduler to rank; in: rank to scheduler", ("in", "out")),
    "rank": req("int|null", "the rank it went to or came from", sort="rank"),
    "epoch": req("int", "the epoch it was sent in (a dropped reply: the epoch it names)"),
    "step": req("int", "the step it belongs to"),
    "type": req("str", "the message type", MESSAGE_TYPES),
    "bytes": req("int|null", "the body's size on the wire", sort="count"),
    "body": req(ANY, 'the decoded body as JSON ({"undecodable": why} for one that did not decode)'),
    "sent": opt("number", "a reply: when its request went to that rank"),
    "rtt": opt("number", "a reply: seconds from sent to its coming back"),
    "inside": opt("list", "a RESULT: the rank's own four times (received, decoded, executed, encoded)",
                  items="number"),
    "dropped": opt("str", "a reply not joined: why", DROPPED),
    "link": opt("str", "what a link fault did to it: lost (never delivered), delayed (delivered "
                       "late), duplicated (delivered twice: this record is one copy), reordered "
                       "(delivered after the next message to its rank)", LINK),
}

# A PLAN body's item (engine.messages.PlanItem, placements as page ids) and a RESULT's outcome
# (ItemOutcome).
ITEM: dict[str, Field] = {
    "request_id": req("str", "the request it runs"),
    "start_position": req("int", "its first position"),
    "num_tokens": req("int", "positions it runs"),
    "draft_len": req("int", "its drafts"),
    "decode": req("bool", "a decode item (its verdict is asked for)"),
    "verdict_index": req("int", "which verdict of its request's accept script"),
    "placements": req("list", "the pages holding its positions", items="int", sort="page"),
    "prior_drafts": opt("int", "overlap: the drafts assumed accepted of its request's item in flight "
                               "(left out: 0)", sort="count"),
}
OUTCOME: dict[str, Field] = {
    "request_id": req("str", "the request it ran"),
    "start_position": req("int", "where it started"),
    "executed_tokens": req("int", "positions it ran"),
    "accepted": req("int", "drafts accepted (the verdict)"),
    "writes": req("list", "the pages it wrote", items="int", sort="page"),
}


@dataclass(frozen=True)
class Event:
    written: str                   # when the writer writes it
    fields: dict[str, Field]       # besides "t" (TIME), which every event has


EVENTS: dict[str, Event] = {
    "run": Event("first, before any worker starts", {
        "name": req("str", "the workload's name"),
        "world_size": req("int", "ranks"),
        "rung": req("str", "the rung of the ladder"),
        "policy": req("str", "--on-rank-loss"),
        "max_restarts": req("int", "--max-restarts: recoveries allowed in the run"),
        "faults": req("list", "the faults to inject, as written (RANK:KIND@STEP...)", items="str"),
        "config": req("object", "max_step_tokens, page_size, num_pages, spec_len, world_size"),
        "requests": req("int", "requests in the workload"),
        "scheduler_pid": req("int", "the scheduler's process"),
        "listen": req("str|null", "the address outside workers join at; null: workers spawned here"),
        "shared_clock": req("bool", "the ranks read the scheduler's clock (all on this host)"),
        "workload_digest": req("str", '"sha256:" and the digest of the workload (records.workload_fields)'),
        "workload": opt("object", "the workload itself (engine values and requests) when its JSON is "
                                  "at most 1 MiB"),
    }),
    "member": Event("a member admitted to a rank (each epoch)", {
        "rank": req("int", "the rank it holds"),
        "epoch": req("int", "the epoch it joined in"),
        "pid": req("int", "its process id (on its host)"),
        "host": req("str", "where it joined from; empty for a worker spawned here"),
        "proof": req("str", 'how it proved itself ("run secret", "key rank-R")'),
    }),
    "phase": Event("each scheduler phase; t is its start", {
        "phase": req("str", "which phase", PHASES),
        "step": req("int", "the step"),
        "dur": req("number", "seconds it took"),
    }),
    "attempt": Event("each try at a step", {
        "step": req("int", "the step"),
        "epoch": req("int", "the epoch it was sent in"),
        "verdict": req("str", '"joined", what failed it, or "void (...)" for a plan never read'),
        "plan_bytes": req("int", "the plan's size on the wire"),
        "arrivals": opt("list", "a joined attempt: each rank's result as it came, {rank, after (seconds "
                                "after its plan was sent), behind (seconds behind the first), exec (its "
                                "own execute seconds, where it said them)}", items="object"),
    }),
    "step": Event("each committed step", {
        "step": req("int", "the step"),
        "epoch": req("int", "the epoch it committed in"),
        "trace": req("object", "the step's trace (the --json line)"),
        "counters": req("object", "the counters after it (as --metrics)"),
        "prompt_tokens": req("int", "prompt tokens of the requests admitted in it, and again of those "
                                    "preempted in it (--metrics' prompt_tokens, step by step)"),
    }),
    "audit": Event("a shard audit every shard passed", {
        "step": req("int", "the step after which it ran"),
        "epoch": req("int", "the epoch"),
    }),
    "audit-failed": Event("a shard audit a rank failed", {
        "rank": req("int", "the rank whose shard diverged", sort="rank"),
        "step": req("int", "the step after which it ran"),
        "epoch": req("int", "the epoch"),
        "page": req("int", "the first page that diverges"),
        "offset": req("int", "the slot in it"),
        "message": req("str", "what the pool holds and the shard holds"),
    }),
    "rank-lost": Event("a loss, when it is seen", {
        "rank": req("int|null", "the rank blamed; null: every rank alike", sort="rank"),
        "ranks": req("list", "every rank lost with it", items="int", sort="rank"),
        "step": req("int|null", "the step; null: during start-up or a replacement"),
        "epoch": req("int", "the epoch"),
        "reason": req("str", "died, hung, protocol, unreachable, ..."),
        "message": req("str", "the loss in words"),
    }),
    "step-failed": Event("the join refused the results (a GroupViolation, a BoundaryViolation)", {
        "kind": req("str", "the error's kind"),
        "ranks": req("list", "the ranks it names", items="int", sort="rank"),
        "step": req("int", "the step"),
        "epoch": req("int", "the epoch"),
        "message": req("str", "the error in words"),
        "where": opt("str", "ranks that disagree: the first item and field their results differ on"),
        "sides": opt("list", "ranks that disagree: each value reported there, with the ranks that "
                             "reported it ({\"ranks\": [...], \"value\": ...})", items="object"),
    }),
    "restart": Event("a recovery begins", {
        "ranks": req("list", "the ranks replaced", items="int", sort="rank"),
        "epoch": req("int", "the new epoch"),
        "step": req("int", "the step it repeats or plans again"),
        "shard_pages": req("int", "pages in the shard the new members start from", sort="count"),
        "policy": req("str", "restore or recompute"),
    }),
    "resize": Event("the world changed size: members kept (renumbered in order), lost or added", {
        "epoch": req("int", "the new epoch"),
        "step": req("int", "the next step to commit (the one sent again, or planned next)"),
        "from": req("int", "the world size before"),
        "to": req("int", "the world size after"),
        "kept": req("list", "for each new rank, in order, the old rank of the member kept there",
                    items="int", sort="rank"),
        "lost": req("list", "the old ranks whose members are gone", items="int", sort="rank"),
        "added": req("list", "the new ranks new members joined at", items="int", sort="rank"),
        "shard_pages": req("int", "pages in the shard every rank holds in the new world", sort="count"),
        "why": req("str", "what decided it", RESIZE_WHY),
        "hidden": opt("number", "seconds of the new members' start-up that ran while steps went on",
                      sort="seconds"),
    }),
    "pause": Event("a run under pause stopped on a loss: its status, as the operator sees it", {
        "epoch": req("int", "the epoch it paused in (an instruction must name it)"),
        "step": req("int", "the step it will send again (or plan) once told"),
        "kind": req("str", "the failure's kind"),
        "message": req("str", "the failure in words"),
        "lost": req("list", "each rank lost: {rank, reason}", items="object"),
        "survivors": req("list", "the ranks still held", items="int", sort="rank"),
        "world_size": req("object", "requested and effective"),
        "can": req("list", "the instructions that can be carried out now", items="str"),
        "timeout_s": req("number", "--pause-timeout"),
        "default": req("str", "what the timeout does (--pause-default)"),
    }),
    "instruction": Event("an operator's instruction answered (or the pause timeout's default)", {
        "id": req("str", "the instruction's id"),
        "instruction": req("str", "retry, scale-down, scale-up or abort", ("retry", "scale-down",
                                                                             "scale-up", "abort")),
        "epoch": req("int", "the epoch it was carried out in"),
        "source": req("str", "who gave it", ("operator", "timeout")),
        "code": req("int", "202: accepted, carried out next (a restart or a resize follows); 200: abort; "
                           "409: refused, the run stays paused"),
        "answer": req("object", "the answer"),
    }),
    "wavefront": Event("a step's deadline passed: where every rank was", {
        "ranks": req("list", "per rank {rank, silent (no answer by the deadline), plan {step, epoch, ago}, "
                             "result {step, epoch, ago}, fired {step, faults, ago}}; ago: seconds before "
                             "the deadline passed; null where there was none", items="object"),
    }),
    "rejoin-wait": Event("--listen: the wait for replacements; t is its start", {
        "ranks": req("list", "the ranks waited for", items="int"),
        "dur": req("number", "seconds it took"),
        "joined": req("bool", "they all joined"),
    }),
    "note": Event("a dropped reply, a refused peer", {
        "rank": req("int|null", "the rank it is about, if any", sort="rank"),
        "epoch": req("int", "the epoch"),
        "text": req("str", "the note"),
    }),
    "idle": Event("a stretch of steps with no round trip", {
        "first": req("int", "its first step"),
        "last": req("int", "its last step"),
        "text": req("str", "why no plan crossed"),
    }),
    "turned-away": Event("at the end, the counts behind the notes", {
        "messages": req("object", "messages from peers holding no rank, by peer", sort="count"),
        "connections": req("object", "connections refused, by why", sort="count"),
        "member_replies_dropped": req("object", "members' replies dropped past the noted ones, by rank"),
        "shed": req("int", "connections holding no rank closed to keep descriptors for the members"),
    }),
    "partition": Event("a link fault cuts a rank off: everything to and from it is lost for a while", {
        "rank": req("int", "the rank cut off", sort="rank"),
        "step": req("int", "the step whose plan the cut began with"),
        "epoch": req("int", "the epoch"),
        "seconds": req("number", "how long the link loses everything, both ways, before it heals",
                    sort="seconds"),
    }),
    "end": Event("last, once every worker is stopped", {
        "status": req("str", "how the run ended", ("ok", "failed")),
        "error": req("object|null", "the error object of a failed run"),
        "steps": req("int", "steps run"),
    }),
}


# -- checking -------------------------------------------------------------------------------

def kind_of(value: Any) -> str:
    """The JSON kind of a value as the writer hands it to json.dumps (a tuple is a list)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__          # no JSON kind: never allowed


def _check_fields(what: str, values: Mapping[str, Any], fields: Mapping[str, Field]) -> None:
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise SchemaError(f"{what}: unknown field(s) {', '.join(map(repr, unknown))}")
    for name, f in fields.items():
        if name not in values:
            if f.required:
                raise SchemaError(f"{what}: no {name!r}")
            continue
        v = values[name]
        kind = kind_of(v)
        if kind not in f.kinds and not (kind == "int" and "number" in f.kinds):
            raise SchemaError(f"{what}: {name!r} is {kind}, not {' or '.join(sorted(f.kinds))}")
        if kind == "list" and f.items is not ANY:
            odd = next((kind_of(x) for x in v if kind_of(x) not in f.items
                        and not (kind_of(x) == "int" and "number" in f.items)), None)
            if odd is not None:
                raise SchemaError(f"{what}: {name!r} holds a {odd}, not only {' or '.join(sorted(f.items))}")
        if f.choices and v not in f.choices:
            raise SchemaError(f"{what}: {name!r} is {v!r}, not one of {', '.join(map(str, f.choices))}")


def check_event(event: str, fields: Mapping[str, Any]) -> None:
    """An event as the writer is about to write it: its name, and its fields but "t"."""
    spec = EVENTS.get(event)
    if spec is None:
        raise SchemaError(f"unknown event {event!r}")
    _check_fields(f"{event} event", fields, spec.fields)


def check_message(record: Mapping[str, Any]) -> None:
    """A message record, every field ("t" too)."""
    kind = record.get("type")
    _check_fields(f"{kind if isinstance(kind, str) else 'wire'} message", record, MESSAGE)


def check_record(obj: Any) -> None:
    """One parsed line of a wire log, against the schema: exactly what today's writer writes."""
    shape = record_kind(obj)
    if shape is None:
        raise SchemaError("neither a wire message nor an event")
    if shape == "message":
        check_message(obj)
        return
    _check_fields(f"{obj['event']} event", {"t": obj.get("t")} if "t" in obj else {}, {"t": TIME})
    check_event(obj["event"], {k: v for k, v in obj.items() if k not in ("t", "event")})


def record_kind(obj: Any) -> str | None:
    """The shape every reader goes by: "event" (an object whose "event" is a string),
    "message" (an object with no "event" that has a "dir" or a "type"), or None (no record)."""
    if not isinstance(obj, dict):
        return None
    if "event" in obj:
        return "event" if isinstance(obj["event"], str) else None
    return "message" if "dir" in obj or "type" in obj else None
