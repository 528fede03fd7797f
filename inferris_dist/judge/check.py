"""A recorded run judged afterwards: does its wire log hold a history the boundary allows?

`check_log(path, workload=None)` reads a wire log (`launch --wire-log`) once, front to back,
whatever wrote it, and returns a `Report`: every violation found (its line, step, epoch and
rank where known) and what was checked. The checks:

- The join. Every committed step (a `step` event) was joined from exactly one RESULT of each
  rank 0..N-1, all of the epoch it committed in, all with the same body, none dropped; the
  attempt it commits did not fail; each RESULT answers a PLAN sent to that rank for that
  step in that epoch, before it; every PLAN of an attempt is the same plan.
- Epochs and members. Epochs only move forward, by a `restart` into a later one; everything
  sent, every member admitted, every reply taken, every step committed is of the epoch the
  run is in. A reply of an older epoch is dropped (`"dropped": ...`), never taken: one taken
  from a member a restart retired is named as such. A plan goes to, and a result comes from,
  a rank a member holds (a `member` event since the rank's last retirement); each member is
  configured with the run's page geometry and, with the workload known, its accept scripts.
- The step follows from its plan and its joined result, where that is exact (SPEC §3.6 to
  §3.13, §7): the result validates against the plan by the engine's own phase 9
  (`engine.boundary.mismatches`, every mismatch said: outcome per item, start,
  tokens executed, pages written, accepted within the drafts; at rung overlap an item planned
  after d drafts started exactly as many positions earlier as the ranks rejected of them the
  step before); `executed` (and `discarded`) are the plan's items and token counts; `drafted`
  is n-1 of each decode item, `accepted` the joined result's count (clamped by `eos_after`),
  `rolled_back` the difference; `scheduled` holds the plan's requests in order; `sampled`,
  `finished` and `published` name requests that ran; a request reused starts where the cache
  put it; with the workload known also who samples, EOS or TOKEN, and who finishes, exactly,
  and (below rung overlap) that every item starts at its request's committed frontier.
- Losses and restarts. A restart is a recovery (docs/faults.md): of a failure recorded in
  the epoch it leaves (a loss, a step or an audit failed, a joined result failing phase 9),
  replacing every rank lost there not since replaced, under the run's policy (never abort),
  within max_restarts. A rank lost for not answering has no RESULT taken for that step in
  that epoch; a member that said (FIRED) a fault killed it answers nothing after, until a
  new member holds its rank.
- Steps and the end. Steps commit in order, idle stretches filling the gaps; audits passed
  had every rank's SHARD, each asked for; the `end` event is the last record, once, and its
  step count is the run's; a run that failed at step K committed none from K on (K itself
  only when an audit after it failed it).
- The promise (docs/faults.md), when the workload is known (recorded in the run event, or
  given, and then checked to be the recorded one by its digest): the reference engine runs
  alongside, step for step. abort and restore: the committed trace is the reference's, step
  by step (a failed run: the steps before its failure are, exactly); recompute: the run's
  summary, rebuilt from the committed steps, is the reference's.

What cannot be checked from a log: a dropped reply's plan (only replies taken are matched to
plans sent), what a shard held (the SHARD bodies are not replayed against a pool), the cache's
choices (`published` counts, `evicted`, `preempted`, `reused` amounts are taken as they are,
and checked by the reference where there is one), timing. A step whose result cannot be joined
or fails phase 9 is said once; what it did to its requests is then unknown, and so is the
summary, which is not compared (the trace still is, step by step).

Tolerant of a newer writer: fields and events the schema does not name are left alone; a
message the link marks lost (`"link": "lost"`) never arrived (a PLAN so marked was not sent,
a RESULT so marked cannot be joined), and a reply marked delayed is the link taking it, not
its delivery (logged again when it comes). An older writer's log may lack what the checker does not
read (NEEDED says what it does).

The root cause first: a record of a later epoch that no restart moved the run to is said as
a restart missing before its line, and what the log shows after it, to the next restart,
follows from it (`Violation.follows`: folded under it in the text, each kept in the JSON).

Bounded: the log is streamed, one record at a time. Kept are the attempts in flight (their
plan once, each distinct result once), a few numbers per rank and per request, the reference
engine, and at most MAX_VIOLATIONS violations (the rest are counted): memory grows with the
ranks, the requests and the steps in flight, not with the log's length.

Bad input, not a violation: a log that is not a wire log, a record malformed (a field of the
wrong kind, by the schema; a plan or a result of the wrong shape), a log whose first record is
not the run event, a workload given that is not the run's: WorkloadError, one line.
"""
from __future__ import annotations

import functools
import itertools
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from inferris_dist.engine import WorkloadError
from inferris_dist.engine.boundary import mismatches, said
from inferris_dist.engine.messages import ExecutionPlan, ExecutionResult, ItemOutcome, PlanItem
from inferris_dist.engine.workload import ENGINE_KEYS, MAX_WORLD_SIZE, Workload, load_workload, parse_workload
from inferris_dist.judge.promise import HELD, compared
from inferris_dist.judge.promise import field_difference as _field_difference
from inferris_dist.judge.promise import id_said as _id
from inferris_dist.judge.promise import json_said as _json
from inferris_dist.judge.promise import summary_difference as _summary_difference
from inferris_dist.protocol.faults import kind_of as fault_kind
from inferris_dist.wirelog.logread import LogReader, Malformed
from inferris_dist.wirelog.schema import ANY, EVENTS, ITEM, MESSAGE, OUTCOME, TYPES, Field, kind_of
from inferris_dist.wirelog.writer import workload_fields
from inferris_dist.words import shown

__all__ = ["MAX_VIOLATIONS", "NotTheRunsWorkload", "Report", "Violation", "check_log"]

MAX_INSTRUCTIONS_KEPT = 1024   # instruction ids remembered, to find one carried out twice
MAX_VIOLATIONS = 1000       # violations kept whole; past these only counted
MAX_IN_FLIGHT = 64          # attempts with a plan out and no verdict (a writer's are a few)
# A message's "link" mark (schema.LINK) saying the record is not of a delivery: "lost" never
# arrived; a reply marked "delayed" is the link taking it (the delivery is logged again, unmarked,
# when it comes). A plan marked delayed, reordered or duplicated was delivered; any other mark is
# taken as delivered.
NOT_DELIVERED = {"out": frozenset({"lost"}), "in": frozenset({"lost", "delayed"})}
REPLIES = ("RESULT", "SHARD")        # the replies a round takes (a FIRED, a HELLO: said, not taken)
# A fault a member says FIRED for that kills it (protocol/faults.py KINDS): True, at the step it
# fired (nothing of it answers that step or after), False, after answering it.
FATAL = {"crash": True, "exit": True, "crash-after-reply": False}
# Losses of a rank that gave no answer (scheduler/channel.py): one whose RESULT was taken is not.
ANSWERLESS = frozenset({"died", "timeout"})
SPEC_ORDER = ("step", "admitted", "scheduled", "executed", "sampled", "finished", "preempted", "reused",
              "published", "evicted", "drafted", "accepted", "rolled_back", "discarded", "returned")


# The reference's lines by (workload digest, rung), read whole once (up to MAX_REFERENCE_LINES)
# and kept: checking many logs of one workload (chaos's runs) runs the engine once. A check never
# changes a reference line. Bounded by entries and lines.
REFERENCES: dict[tuple[str, str], list[dict]] = {}
MAX_REFERENCES = 16
MAX_REFERENCE_LINES = 20_000


class NotTheRunsWorkload(WorkloadError):
    """The workload given to check a log against is not the one the log's run event names."""

    def __init__(self, message: str, given: str, recorded: str):
        super().__init__(message)
        self.given, self.recorded = given, recorded


@dataclass(frozen=True)
class Violation:
    """One thing the log shows that the boundary does not allow."""
    line: int | None            # the log's line (1-based) that shows it; None: the log as a whole
    what: str
    step: int | None = None
    epoch: int | None = None
    rank: int | None = None
    follows: int | None = None  # the line of the root cause it follows from (None: said for itself)

    def where(self) -> str:
        """"line 12: step 3, epoch 1, rank 2" (what is known of it)."""
        known = ", ".join(f"{k} {v}" for k, v in (("step", self.step), ("epoch", self.epoch),
                                                   ("rank", self.rank)) if v is not None)
        if self.line is None:
            return known
        return f"line {self.line}: {known}" if known else f"line {self.line}"

    def __str__(self) -> str:
        where = self.where()
        return f"{where}: {self.what}" if where else self.what

    def to_json(self) -> dict:
        return {"line": self.line, "step": self.step, "epoch": self.epoch, "rank": self.rank,
                "what": self.what, "follows": self.follows}


@dataclass
class Report:
    """What `check_log` found: the violations (the first MAX_VIOLATIONS; `more` counts the rest)
    and what was checked (`checked`: counts, the run's policy and rung, what the reference
    comparison compared)."""
    log: str
    violations: list[Violation] = field(default_factory=list)
    more: int = 0
    checked: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        """One line: what was checked, and how it came out."""
        c = self.checked
        steps = f"{_count(c['steps'], 'step')}"
        if c["idle"]:
            steps += f" ({c['committed']} committed, {c['idle']} idle)"
        counts = (f"{steps} in {_count(c['attempts'], 'attempt')}, {_count(c['epochs'], 'epoch')}, "
                  f"{_count(c['ranks'], 'rank')}; {_count(c['results'], 'result')} taken, "
                  f"{c['dropped']} dropped")
        promise = HELD[c["reference"]]
        if c["reference"] is None and c.get("why_not"):
            promise += f" ({c['why_not']})"
        if self.ok:
            return f"{self.log}: ok: {counts}; {promise}"
        n = len(self.violations) + self.more
        return f"{self.log}: {_count(n, 'violation')} in {counts}"

    def lines(self) -> list[str]:
        """The report for people: one line per violation (`LOG line N: step S, ...: what`), those
        that follow from a root cause folded into one line after it, then the summary line."""
        following: dict[int, int] = {}
        for v in self.violations:
            if v.follows is not None:
                following[v.follows] = following.get(v.follows, 0) + 1
        out = []
        for v in self.violations:
            if v.follows is not None:
                continue
            out.append(f"{self.log}{' ' if v.line is not None else ': '}{v}")
            n = following.pop(v.line, 0) if v.line is not None else 0
            if n:
                out.append(f"{self.log}: ... and {n} more that follow from it (--json lists each)")
        return out + ([f"{self.log}: ... and {self.more} more violations"] if self.more else []) + [
            self.summary()]

    def to_json(self) -> dict:
        return {"log": self.log, "ok": self.ok, "violations": [v.to_json() for v in self.violations],
                "more_violations": self.more, "checked": dict(self.checked)}


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def check_log(path: str | Path, workload: Workload | dict | str | Path | None = None) -> Report:
    """Judge the wire log at `path`. `workload`: the run's workload (a Workload, a SPEC §1 dict or
    the path of its file), for logs that do not record it whole; it must be the one the log's
    digest names (its engine values are taken from the run event, as the run overrode them).
    Bad input raises WorkloadError (one line); a violation is in the report, never raised."""
    return _Checker(str(path), workload).run()


# -- what is kept while reading ---------------------------------------------------------------

@dataclass
class _Attempt:
    """One (step, epoch): the plan sent (kept once), to whom, and each rank's reply taken."""
    step: int
    epoch: int
    line: int
    plan: dict | None = None              # the PLAN body, checked
    plan_line: int = 0
    sent: set = field(default_factory=set)
    raw_plan: Any = None                  # the PLAN body as logged (the others compare to it in C)
    replies: dict = field(default_factory=dict)     # rank -> (line, index of its body in `bodies`)
    raw: list = field(default_factory=list)         # each distinct RESULT body as logged
    norm: list = field(default_factory=list)        # its index in `bodies` (-1: it did not decode)
    undecodable: dict = field(default_factory=dict)  # rank -> line of a reply that did not decode
    bodies: list = field(default_factory=list)      # each distinct body, checked (raw's, in order)
    verdict: str | None = None


@dataclass
class _Request:
    generated: int | None = 0             # None: not known since a step that could not be followed
    computed: int | None = 0              # None: not known from the log (see _after_step)
    state: str = "WAITING"
    finish: str | None = None


class _Checker:
    def __init__(self, path: str, workload):
        self.path, self.given = path, workload
        self.name = shown(path)
        self.violations: list[Violation] = []
        self.more = 0
        self.n = 0                               # ranks
        self.widest = 0                          # the most ranks the world has had (mechanism 14)
        self.run_event: dict | None = None
        self.rung = "full"
        self.page_size = 0
        self.epoch = 0
        self.members: dict[int, int | None] = {}   # rank -> the epoch its member joined in (None: none)
        self.retired: dict[int, tuple[int, int]] = {}   # rank -> (old member's epoch, epoch replaced in)
        self.attempts: OrderedDict[tuple[int, int], _Attempt] = OrderedDict()
        self.closed: deque = deque(maxlen=MAX_IN_FLIGHT)    # (step, epoch) whose verdict was given
        self.audits: OrderedDict[tuple[int, int], tuple[set, set]] = OrderedDict()
        self.next_step = 0
        self.committed = self.idle = self.attempt_events = self.results = self.dropped = 0
        self.records = 0
        self.end_line: int | None = None
        self.end: dict | None = None
        self.after_end_said = False
        self.too_many_said = False
        self.requests: dict[str, _Request] = {}
        self.specs: dict | None = None           # request id -> RequestSpec, when the workload is known
        self.order: list[str] = []               # the workload's request ids, in order
        self.last_decodes: dict[str, int] = {}   # overlap: drafts rejected of each decode item last step
        self.last_decodes_step = -1
        self.workload: Workload | None = None
        self.workload_from: str | None = None
        self.reference: Iterator[dict] | None = None
        self.promise: str | None = None          # "traces" or "summaries"
        self.compared = None                     # what the reference comparison came to compare
        self.diverged = False                    # the first difference from the reference is said
        self.why_not = ""
        # who was lost and what a restart did about it
        self.lost: dict[int, int] = {}           # rank -> line of its loss not yet met by a replacement
        self.resize_due: dict[int, int] = {}     # kept ranks owed a RESIZE in this epoch -> its pages
        self.paused: int | None = None           # the line of a pause no instruction has ended
        self.instructed: str | None = None       # the instruction being carried out (pause)
        self.instruction_ids: OrderedDict[str, int] = OrderedDict()   # ids carried out, by line
        self.failed_at: int | None = None        # the line of a failure in this epoch (a restart's cause)
        self.sent_in_epoch = False               # a PLAN or AUDIT went out in this epoch
        self.restarted_into = 0                  # the epoch the last restart moved to
        self.recoveries = self.tries = 0         # recoveries, and restarts of the one under way
        self.fatal: dict[int, tuple] = {}        # rank -> (line, fault, step, member, at it) of a FIRED death
        self.last_audit: int | None = None       # the step of the last AUDIT sent
        self.root: int | None = None             # the line of the root cause later violations follow
        self.roots: list[tuple[int, str]] = []   # each root cause said: its index, and it said plainly

    # -- saying ---------------------------------------------------------------------------

    def bad(self, line: int | None, what: str, step=None, epoch=None, rank=None) -> None:
        """A violation; while a root cause is said (a restart missing), it follows from it."""
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(Violation(line, what, step, epoch, rank, self.root))
        else:
            self.more += 1

    def _other_epoch(self, epoch: int, line: int, what: str, step=None, rank=None, why: str = "") -> None:
        """What the scheduler did in an epoch the run is not in. The first of a later epoch no
        restart moved the run to is the root cause (a restart missing) of what the log shows
        from there to the next restart, said once; `finish` says it plainly if nothing followed."""
        plain = f"{what} in epoch {epoch} while the run is in epoch {self.epoch}{why}"
        if epoch < self.epoch or self.root is not None or len(self.violations) >= MAX_VIOLATIONS:
            self.bad(line, plain, step, epoch, rank)
            return
        self.bad(line, f"a restart is missing before line {line}: {what} in epoch {epoch}, while no "
                       f"restart has moved the run past epoch {self.epoch} (epochs move only by a restart)",
                 step, epoch, rank)
        self.root = line
        self.roots.append((len(self.violations) - 1, plain))

    # -- the pass -------------------------------------------------------------------------

    def run(self) -> Report:
        reader = LogReader(self.path, strict=True, command="check", max_read=None)
        for obj in reader:
            self.records += 1
            line = reader.line
            try:
                if self.run_event is None:
                    self.first(obj, line)
                    continue
                if self.end_line is not None and not self.after_end_said:
                    self.after_end_said = True
                    self.bad(line, f"a record after the end event (line {self.end_line}): the end is "
                                   f"recorded last")
                if "event" in obj:
                    self.event(obj, line)
                else:
                    self.message(obj, line)
            except Malformed as e:
                raise reader.refused(str(e)) from None
        if self.run_event is None:
            raise WorkloadError(f"{self.name}: not a wire log of a run (no record in it)")
        self.finish(reader)
        self._plain_roots()
        return Report(self.name, self.violations, self.more, self.checked(reader))

    def checked(self, reader: LogReader) -> dict:
        return {"records": self.records, "steps": self.next_step, "committed": self.committed,
                "idle": self.idle, "attempts": self.attempt_events, "epochs": self.epoch + 1,
                "ranks": self.n, "results": self.results, "dropped": self.dropped,
                "rung": self.rung, "policy": self.run_event.get("policy"),
                "end": None if self.end is None else self.end.get("status"),
                "workload": self.workload_from, "reference": self.compared,
                "why_not": self.why_not or None, "cut_short": reader.cut_short}

    # -- the run event: first --------------------------------------------------------------

    def first(self, obj: dict, line: int) -> None:
        if obj.get("event") != "run":
            raise WorkloadError(f"{self.name} line {line}: not a wire log of a run: its first record is "
                                f"not the run event")
        _fields(obj, EVENTS["run"].fields, "run event", "run")
        self.run_event = obj
        n = obj["world_size"]
        if not 1 <= n <= MAX_WORLD_SIZE:
            raise Malformed(f"run event: world_size must be 1..{MAX_WORLD_SIZE}")
        self.n = self.widest = n
        self.rung = obj["rung"]
        config = obj["config"]
        page_size = config.get("page_size")
        if type(page_size) is not int or page_size < 1:
            raise Malformed("run event: config.page_size must be a whole number > 0")
        self.page_size = page_size
        if config.get("world_size", n) != n:
            self.bad(line, f"the config's world_size {config.get('world_size')} is not the run's {n}")
        self.members = {r: None for r in range(n)}
        self.workload = self._workload(obj, line)
        if self.workload is not None and obj.get("requests", len(self.workload.requests)) != len(
                self.workload.requests):
            self.bad(line, f"the run event counts {obj['requests']} requests, its workload has "
                           f"{len(self.workload.requests)}")
        if self.workload is not None:
            self._start_reference(obj)

    def _workload(self, run: dict, line: int) -> Workload | None:
        """The run's workload: given (checked against the log's digest), else recorded."""
        digest = run.get("workload_digest")
        if self.given is not None:
            w = self.given if isinstance(self.given, Workload) else load_workload(self.given)
            knobs = {k: v for k, v in run["config"].items() if k in ENGINE_KEYS}
            try:
                w = w.with_config(**knobs)
            except WorkloadError as e:
                raise WorkloadError(f"{self.name}: the run's engine values do not apply to the workload "
                                    f"given: {e}") from None
            mine = workload_fields(w)["workload_digest"]
            if digest is not None and mine != digest:
                raise NotTheRunsWorkload(f"{self.name}: the workload given is not this run's (its digest is "
                                         f"{mine[:19]}..., the run's {shown(str(digest))[:19]}...); "
                                         f"nothing checked", mine, digest)
            self.workload_from = "given"           # (a log without a digest: taken as given)
            return w
        recorded = run.get("workload")
        if recorded is None:
            self.why_not = ("the log does not record the workload: give it" if digest is not None
                            else "the log records no workload")
            return None
        try:
            w = parse_workload(recorded)
        except WorkloadError as e:
            raise WorkloadError(f"{self.name} line {line}: the run event's workload: {e}") from None
        if digest is not None and workload_fields(w)["workload_digest"] != digest:
            self.bad(line, "the run event's workload is not the one its workload_digest names")
        self.workload_from = "recorded"
        return w

    def _start_reference(self, run: dict) -> None:
        from inferris_dist.engine import Engine, trace_objects
        w = self.workload
        self.specs = {r.request_id: r for r in w.requests}
        self.order = [r.request_id for r in w.requests]
        self.requests = {rid: _Request() for rid in self.order}
        policy = run["policy"]
        key = (run.get("workload_digest"), self.rung)
        cached = REFERENCES.get(key) if key[0] is not None else None
        if cached is not None:
            self.reference = iter(cached)
        else:
            try:
                engine = Engine(w, rung=self.rung)
            except WorkloadError as e:
                raise WorkloadError(f"{self.name}: the run's rung: {e}") from None
            lines = trace_objects(engine)
            first = list(itertools.islice(lines, MAX_REFERENCE_LINES + 1)) if key[0] is not None else []
            if key[0] is not None and len(first) <= MAX_REFERENCE_LINES:
                while len(REFERENCES) >= MAX_REFERENCES:
                    REFERENCES.pop(next(iter(REFERENCES)))
                REFERENCES[key] = first
            self.reference = itertools.chain(first, lines)
        self.promise = compared(policy)
        self.compared = self.promise

    # -- messages -------------------------------------------------------------------------

    def message(self, m: dict, line: int) -> None:
        _fields(m, MESSAGE, f"{_kind_name(m)} message", "message")
        if m["dir"] not in ("in", "out"):
            raise Malformed('a message\'s dir must be "in" or "out"')
        kind, rank, epoch, step = m["type"], m["rank"], m["epoch"], m["step"]
        if rank is None:
            return                                   # no rank's: nothing here is about the boundary
        if not 0 <= rank < self.n:
            # one from an epoch before the world shrank may name a rank it had then (a lost member's
            # last words, read after the resize): dropped by the scheduler, not a fault of the log
            if not (m["dir"] == "in" and epoch < self.epoch and 0 <= rank < self.widest):
                self.bad(line, f"{_a(_kind_name(m))} of rank {rank}, outside the run's ranks "
                               f"0..{self.n - 1}", step, epoch)
            return
        if m["dir"] == "out" and kind in ("PLAN", "AUDIT") and epoch == self.epoch:
            self.sent_in_epoch = True                # (delivered or not: the epoch's window was over)
        if m.get("link") in NOT_DELIVERED[m["dir"]]:
            return                                   # no delivery: neither sent nor answered
        if m["dir"] == "out":
            if epoch != self.epoch:
                self._other_epoch(epoch, line, f"{_a(_kind_name(m))} sent", step, rank,
                                  " (epochs move only by a restart)")
                return
            if kind in ("PLAN", "AUDIT") and self.paused is not None:
                self.bad(line, f"{_a(kind)} sent while the run was paused (line {self.paused}) before any "
                               f"instruction", step, epoch, rank)
            if kind in ("PLAN", "AUDIT") and rank in self.resize_due:
                self.bad(line, f"{_a(kind)} sent to rank {rank} before its RESIZE (a kept member learns "
                               f"its place in the new world first)", step, epoch, rank)
            if kind == "RESIZE":
                self.resized(m, line)
            if kind in ("PLAN", "AUDIT") and self.members.get(rank) is None:
                self.bad(line, f"{_a(kind)} sent to rank {rank}, which no member holds (no member event "
                               f"admitted one since {self._since(rank)})", step, epoch, rank)
            if kind == "CONFIG":
                self.config(m, line)
            elif kind == "PLAN":
                self.plan(m, line)
            elif kind == "AUDIT":
                sent, _ = self._audit((step, epoch))
                sent.add(rank)
                self.last_audit = step
            return
        if kind == "FIRED":
            self.fired(m, line)
        if kind not in REPLIES:
            return
        if "dropped" in m:
            self.dropped += 1
            return
        if epoch != self.epoch:
            old = self.retired.get(rank)
            if old is not None and epoch < old[1]:
                self.bad(line, f"{_a(_kind_name(m))} of rank {rank}'s retired member (of epoch {old[0]}, "
                               f"replaced in epoch {old[1]}) was taken, not dropped", step, epoch, rank)
            else:
                self.bad(line, f"{_a(_kind_name(m))} of epoch {epoch} taken in epoch {self.epoch} (a reply "
                               f"of another epoch is dropped, never taken)", step, epoch, rank)
            return
        if self.members.get(rank) is None:
            self.bad(line, f"{_a(kind)} taken from rank {rank}, which no member holds (no member event "
                           f"admitted one since {self._since(rank)})", step, epoch, rank)
        if kind == "RESULT":
            self.result(m, line)
        elif kind == "SHARD":
            key = (step, epoch)
            sent, got = self._audit(key)
            if rank not in sent:
                self.bad(line, f"a SHARD from rank {rank} answers no AUDIT sent to it for step {step} in "
                               f"epoch {epoch}", step, epoch, rank)
            got.add(rank)

    def fired(self, m: dict, line: int) -> None:
        """A member says a fault of its fired: one that kills it (FATAL) is kept, to hold its rank's
        later replies against (a member dead by its own fault answers nothing more)."""
        rank, body = m["rank"], m["body"]
        member = self.members.get(rank)
        if m["epoch"] != self.epoch or member is None or not isinstance(body, list):
            return
        for text in body:
            if isinstance(text, str) and fault_kind(text) in FATAL:
                self.fatal[rank] = (line, text, m["step"], member, FATAL[fault_kind(text)])

    def config(self, m: dict, line: int) -> None:
        """A member's CONFIG: the run's page geometry and, with the workload known, its accept
        scripts (what the ranks' verdicts come from)."""
        body, rank = m["body"], m["rank"]
        if not isinstance(body, dict):
            return
        run = self.run_event["config"]
        for key in ("num_pages", "page_size"):
            if key in body and key in run and body[key] != run[key]:
                self.bad(line, f"rank {rank} configured with {key} {_json(body[key])}, the run's is "
                               f"{run[key]}", m["step"], m["epoch"], rank)
        if self.specs is not None and "accept_scripts" in body:
            want = {rid: list(r.accept_script) for rid, r in self.specs.items()
                    if r.accept_script is not None}
            if body["accept_scripts"] != want:
                self.bad(line, f"rank {rank} configured with accept scripts "
                               f"{_json(body['accept_scripts'])}, the workload's are {_json(want)}",
                         m["step"], m["epoch"], rank)

    def _since(self, rank: int) -> str:
        old = self.retired.get(rank)
        return ("the run began" if old is None
                else f"its member of epoch {old[0]} was retired in epoch {old[1]}")

    def _audit(self, key) -> tuple[set, set]:
        rounds = self.audits
        if key not in rounds:
            rounds[key] = (set(), set())
            while len(rounds) > MAX_IN_FLIGHT:
                rounds.popitem(last=False)
        return rounds[key]

    def plan(self, m: dict, line: int) -> None:
        step, epoch, rank = m["step"], m["epoch"], m["rank"]
        if step < self.next_step:
            self.bad(line, f"a PLAN for step {step}, which has committed (the next step is "
                           f"{self.next_step})", step, epoch, rank)
        a = self._attempt(step, epoch, line)
        a.sent.add(rank)
        raw = m["body"]
        if a.plan is not None and raw == a.raw_plan:     # every rank gets the same plan: read it once
            return
        body = _plan_body(raw)
        if body["step"] != step:
            self.bad(line, f"a PLAN for step {body['step']} sent as step {step}", step, epoch, rank)
        if a.plan is None:
            a.plan, a.raw_plan, a.plan_line = body, raw, line
        elif body != a.plan:
            self.bad(line, f"the PLAN sent to rank {rank} is not the one sent to the others (line "
                           f"{a.plan_line})", step, epoch, rank)

    def _attempt(self, step: int, epoch: int, line: int) -> _Attempt:
        key = (step, epoch)
        a = self.attempts.get(key)
        if a is None:
            a = self.attempts[key] = _Attempt(step, epoch, line)
            if len(self.attempts) > MAX_IN_FLIGHT:
                old = self.attempts.popitem(last=False)[1]
                if not self.too_many_said:
                    self.too_many_said = True
                    self.bad(line, f"more than {MAX_IN_FLIGHT} attempts with plans out and no verdict "
                                   f"(step {old.step}, epoch {old.epoch} is forgotten)", step, epoch)
        return a

    def result(self, m: dict, line: int) -> None:
        step, epoch, rank = m["step"], m["epoch"], m["rank"]
        raw = m["body"]
        self.results += 1
        dead = self.fatal.get(rank)
        if dead is not None and dead[3] == self.members.get(rank) and step >= dead[2] + (not dead[4]):
            del self.fatal[rank]
            when = "at" if dead[4] else "after answering"
            self.bad(line, f"rank {rank}'s member said at line {dead[0]} that its fault {shown(dead[1])} "
                           f"fired, yet its RESULT for step {step} is taken: it ended {when} step {dead[2]}, "
                           f"and no new member holds rank {rank} (was another rank blamed for its loss?)",
                     step, epoch, rank)
        key = (step, epoch)
        a = self.attempts.get(key)
        if a is None and key in self.closed:
            self.bad(line, f"a RESULT from rank {rank} taken after its attempt's verdict (a late reply "
                           f"is dropped)", step, epoch, rank)
            return
        if a is None:
            self.bad(line, f"a RESULT from rank {rank} answers no PLAN sent for step {step} in epoch "
                           f"{epoch}", step, epoch, rank)
            a = self._attempt(step, epoch, line)
        elif rank not in a.sent:
            self.bad(line, f"a RESULT from rank {rank} answers no PLAN sent to it for step {step} in epoch "
                           f"{epoch} (the plan went to {_ranks(a.sent)})", step, epoch, rank)
        # the ranks' bodies are the same, as a rule: each compared to those seen (in C), read once
        seen = next((i for i, other in enumerate(a.raw) if raw == other), None)
        if seen is None:
            body = _result_body(raw)
            index = -1 if body is None else next((j for j, b in enumerate(a.bodies) if b == body), None)
            if index is None:
                index = len(a.bodies)
                a.bodies.append(body)
            a.raw.append(raw)
            a.norm.append(index)
        else:
            index = a.norm[seen]
        if index < 0:             # it did not decode: which step it answers is not known, only awaited
            a.undecodable.setdefault(rank, line)
            return
        if rank in a.replies:
            self.bad(line, f"two RESULTs from rank {rank} taken, at lines {a.replies[rank][0]} and {line} "
                           f"(a duplicate is dropped)", step, epoch, rank)
            return
        a.replies[rank] = (line, index)

    # -- events ---------------------------------------------------------------------------

    def event(self, ev: dict, line: int) -> None:
        kind = ev["event"]
        spec = EVENTS.get(kind)
        if spec is None:
            return                                   # a newer writer's event: not ours to judge
        _fields(ev, spec.fields, f"{kind} event", kind)
        handler = getattr(self, "ev_" + kind.replace("-", "_"), None)
        if handler is not None:
            handler(ev, line)

    def _same_epoch(self, ev: dict, line: int, what: str, rank=None) -> bool:
        if ev["epoch"] != self.epoch:
            self._other_epoch(ev["epoch"], line, what, ev.get("step"), rank)
            return False
        return True

    def ev_run(self, ev: dict, line: int) -> None:
        self.bad(line, "a second run event")

    def ev_member(self, ev: dict, line: int) -> None:
        rank = ev["rank"]
        if not 0 <= rank < self.n:
            self.bad(line, f"a member of rank {rank}, outside the run's ranks", epoch=ev["epoch"])
            return
        self._same_epoch(ev, line, f"rank {rank}'s member admitted", rank)
        old = self.members.get(rank)
        if old is not None:                      # replaced without a restart naming it (lost meanwhile)
            self.retired[rank] = (old, ev["epoch"])
        self.members[rank] = ev["epoch"]
        self.lost.pop(rank, None)
        self.fatal.pop(rank, None)

    def ev_restart(self, ev: dict, line: int) -> None:
        new = ev["epoch"]
        if new <= self.epoch:
            self.bad(line, f"a restart into epoch {new} from epoch {self.epoch}: epochs only move forward",
                     ev["step"], new)
            return
        self._restart_allowed(ev, line)
        for rank in ev["ranks"]:
            if 0 <= rank < self.n:
                if self.members.get(rank) is not None:
                    self.retired[rank] = (self.members[rank], new)
                self.members[rank] = None
            else:
                self.bad(line, f"a restart of rank {rank}, outside the run's ranks", ev["step"], new)
        if ev.get("policy", self.run_event.get("policy")) == "recompute":
            for r in self.requests.values():     # every page dropped: frontiers reset, not always traced
                if r.state != "FINISHED":
                    r.computed = None
        self._enter_epoch(new)

    def ev_resize(self, ev: dict, line: int) -> None:
        """The world changed size (mechanism 14): under shrink or pause only; a shrink (or an
        operator's scale-down) follows a failure in the epoch it leaves and drops every rank lost
        there, a growth (regrow, scale-up) adds ranks up to the size the run asked for. The
        placement at the new size: the kept members, renumbered in order of their old ranks,
        then the new ones after them; each kept member is told so by one RESIZE before anything
        else in the new epoch."""
        new, step, why = ev["epoch"], ev["step"], ev["why"]
        old_n, to, kept, lost, added = ev["from"], ev["to"], ev["kept"], ev["lost"], ev["added"]

        def say(what: str, rank=None) -> None:
            self.bad(line, what, step, new, rank)
        if new <= self.epoch:
            say(f"a resize into epoch {new} from epoch {self.epoch}: epochs only move forward")
            return
        policy = self.run_event.get("policy")
        if policy not in ("shrink", "pause"):
            say(f"the world changed size in a run whose policy is {shown(str(policy))[:32]} (only shrink and "
                f"pause change it)")
        if old_n != self.n:
            say(f"a resize from world size {old_n} in a world of {self.n}")
        if kept != sorted(set(kept)) or any(not 0 <= r < self.n for r in kept):
            say(f"a resize keeping ranks {_json(kept)}: not the old ranks in order (the placement renumbers "
                f"the kept members in order of their old ranks)")
            kept = sorted({r for r in kept if 0 <= r < self.n})
        if sorted(lost) != [r for r in range(self.n) if r not in kept]:
            say(f"a resize losing ranks {_json(lost)}: not every old rank it does not keep")
        if added != list(range(len(kept), to)) or to < 1:
            say(f"a resize to world size {to} keeping {len(kept)} adds ranks {_json(added)}, not "
                f"{_json(list(range(len(kept), to)))}")
        requested = self.run_event["world_size"]
        if why in ("scale-down", "scale-up") and (policy != "pause" or self.instructed != why):
            say(f"a {why} that no {why} instruction asked for")
        if why in ("shrink", "regrow") and policy != "shrink":
            say(f"a {why} in a run whose policy is not shrink")
        if why in ("shrink", "scale-down"):
            if added or to >= self.n:
                say(f"a {why} from {self.n} to {to} ranks that does not shrink the world")
            if self.failed_at is None and not self._phase_9_failed():
                say(f"a {why} into epoch {new} after no failure in epoch {self.epoch}")
            for rank, at in sorted(self.lost.items()):
                if rank not in lost:
                    say(f"the shrink into epoch {new} keeps rank {rank}, lost at line {at}", rank)
            self._counted(say)
        elif lost or to > requested or not added:
            say(f"a {why} from {self.n} to {to} ranks (it may only add ranks, up to the {requested} "
                f"asked for)")
        members = {r: None for r in range(to)}
        for i, r in enumerate(kept):
            members[i] = self.members.get(r)
        for r in lost:
            if self.members.get(r) is not None:
                self.retired[r] = (self.members[r], new)
        self.members, self.n = members, to
        self.widest = max(self.widest, to)
        self.fatal.clear()                       # the ranks are other members' now
        self._enter_epoch(new)
        self.resize_due = {i: ev["shard_pages"] for i in range(len(kept))}

    def _enter_epoch(self, new: int) -> None:
        """A restart or a resize moved the run to epoch `new`: what was in flight is closed."""
        self.epoch = new
        for key in [k for k in self.attempts if k[1] < new]:
            self.closed.append(key)
            del self.attempts[key]
        for key in [k for k in self.audits if k[1] < new]:
            del self.audits[key]
        self.lost.clear()
        self.resize_due = {}                     # a RESIZE owed in the epoch before is owed no more
        self.failed_at, self.sent_in_epoch, self.restarted_into, self.root = None, False, new, None

    def ev_pause(self, ev: dict, line: int) -> None:
        """A run under pause stopped on a loss: nothing more is sent until an instruction."""
        if self.run_event.get("policy") != "pause":
            policy = shown(str(self.run_event.get("policy")))[:32]
            self.bad(line, f"a pause in a run whose policy is {policy}",
                     ev["step"], ev["epoch"])
        self._same_epoch(ev, line, "a pause")
        self.paused, self.instructed = line, None

    def ev_instruction(self, ev: dict, line: int) -> None:
        """An operator's instruction: carried out (202) only while paused, each id once."""
        if ev["code"] not in (200, 202):
            return                                # refused: the run stays paused
        if self.paused is None:
            self.bad(line, f"instruction {shown(ev['id'])[:40]} ({ev['instruction']}) carried out while "
                           f"nothing was paused", epoch=ev["epoch"])
        if ev["id"] in self.instruction_ids:
            self.bad(line, f"instruction {shown(ev['id'])[:40]} carried out twice (an id acts once)",
                     epoch=ev["epoch"])
        self.instruction_ids[ev["id"]] = line
        while len(self.instruction_ids) > MAX_INSTRUCTIONS_KEPT:
            self.instruction_ids.popitem(last=False)
        if ev["code"] == 202:
            self.paused, self.instructed = None, ev["instruction"]

    def resized(self, m: dict, line: int) -> None:
        """A RESIZE sent: once to each kept member, with the pool's pages the resize names."""
        rank = m["rank"]
        if rank not in self.resize_due:
            self.bad(line, f"a RESIZE to rank {rank}, which no resize in epoch {self.epoch} keeps (or told "
                           f"already)", m["step"], m["epoch"], rank)
            return
        pages = self.resize_due.pop(rank)
        body = m["body"]
        if isinstance(body, dict) and isinstance(body.get("shard"), list) and len(body["shard"]) != pages:
            self.bad(line, f"a RESIZE to rank {rank} with a shard of {len(body['shard'])} pages, not the "
                           f"{pages} the resize names", m["step"], m["epoch"], rank)

    def _restart_allowed(self, ev: dict, line: int) -> None:
        """A restart is a recovery (docs/faults.md): of a failure recorded in the epoch it leaves,
        replacing every rank lost there, under the run's policy (never abort), within its
        max_restarts (recoveries; a recovery whose replacement did not come up tries again,
        max(1, max_restarts) times in all: a try is a restart out of an epoch a restart began
        that sent nothing)."""
        new, step = ev["epoch"], ev["step"]

        def say(what: str, rank=None) -> None:
            self.bad(line, what, step, new, rank)
        policy, theirs = self.run_event.get("policy"), ev.get("policy")
        if policy == "abort":
            say("a restart in a run whose policy is abort (abort stops at the first failure)")
        elif policy == "pause":
            if theirs != "restore" or self.instructed not in ("retry", "scale-up"):
                say("a restart under pause that no retry or scale-up instruction asked for")
        elif policy == "shrink" and theirs == "restore":
            pass                                 # a failure no rank can be blamed for: restored
        elif theirs is not None and theirs != policy:
            say(f"a restart under policy {shown(str(theirs))[:32]} in a run whose policy is "
                f"{shown(str(policy))[:32]}")
        if theirs == "recompute" and ev.get("shard_pages"):
            say(f"a recompute restart whose new members start from {ev['shard_pages']} pages (recompute's "
                f"start empty)")
        if self.failed_at is None and not self._phase_9_failed():
            say(f"a restart into epoch {new} after no failure in epoch {self.epoch} (no loss, no step "
                f"failed, no audit failed, no joined result that fails phase 9)")
        replaced = set(ev["ranks"])
        for rank, at in sorted(self.lost.items()):
            if rank not in replaced:
                say(f"the restart into epoch {new} does not replace rank {rank}, lost at line {at} (it "
                    f"replaces {_ranks(replaced)})", rank)
        self._counted(say)

    def _counted(self, say) -> None:
        """One more recovery, or one more try of the one under way (a restart or resize out of
        an epoch a restart or resize began that sent nothing), within max_restarts."""
        if self.epoch > 0 and self.restarted_into == self.epoch and not self.sent_in_epoch:
            self.tries += 1                      # the replacement did not come up: the same recovery
        else:
            self.recoveries, self.tries = self.recoveries + 1, 1
        most = self.run_event.get("max_restarts")
        if type(most) is int:
            if self.recoveries > most:
                say(f"recovery {self.recoveries} of a run allowed max_restarts {most} (a failure past "
                    f"them ends the run, as abort does)")
            elif self.tries > max(1, most):
                say(f"try {self.tries} of one recovery, past the {max(1, most)} max_restarts {most} allows")

    def _phase_9_failed(self) -> bool:
        """A joined result in this epoch, not committed, that fails phase 9 against its plan (the
        engine refuses it at commit: a failure the log shows no event for)."""
        for (step, epoch), a in self.attempts.items():
            if epoch != self.epoch or a.verdict != "joined" or a.plan is None:
                continue
            indexes = {index for _, index in a.replies.values()}
            if len(a.replies) != self.n or len(indexes) != 1:
                continue
            outcomes = a.bodies[indexes.pop()]
            decodes = self.last_decodes if self.last_decodes_step == step - 1 else {}
            result = ExecutionResult(a.plan["step"], tuple(map(_as_outcome, outcomes)))
            if any(True for _ in mismatches(_as_plan(a.plan), result, dict(decodes), self.page_size)):
                return True
        return False

    def ev_attempt(self, ev: dict, line: int) -> None:
        self.attempt_events += 1
        key = (ev["step"], ev["epoch"])
        self._same_epoch(ev, line, "an attempt's verdict")
        a = self.attempts.get(key)
        if a is None:
            return
        a.verdict = ev["verdict"]
        if a.verdict != "joined":
            del self.attempts[key]
            self.closed.append(key)

    def ev_rank_lost(self, ev: dict, line: int) -> None:
        if not self._same_epoch(ev, line, "a rank lost", ev["rank"]):
            return
        ranks = [r for r in ev["ranks"] if 0 <= r < self.n]
        if ev["rank"] is not None and 0 <= ev["rank"] < self.n and ev["rank"] not in ranks:
            ranks.insert(0, ev["rank"])
        step, epoch, reason = ev["step"], ev["epoch"], ev["reason"]
        a = self.attempts.get((step, epoch))
        if reason in ANSWERLESS and a is not None:
            for r in ranks:
                if r in a.replies:
                    self.bad(line, f"rank {r} is lost ({shown(reason)}) at step {step} in epoch {epoch}, but "
                                   f"its RESULT for step {step} in epoch {epoch} was taken at line "
                                   f"{a.replies[r][0]}: a rank that answered is never lost for not answering",
                             step, epoch, r)
        for r in ranks:
            self.lost.setdefault(r, line)
        self.failed_at = line

    def ev_step_failed(self, ev: dict, line: int) -> None:
        if self._same_epoch(ev, line, "a step failed"):
            self.failed_at = line

    def ev_audit(self, ev: dict, line: int) -> None:
        self._same_epoch(ev, line, "an audit passed")
        key = (ev["step"], ev["epoch"])
        _, got = self.audits.pop(key, (set(), set()))
        missing = [r for r in range(self.n) if r not in got]
        if missing:
            self.bad(line, f"an audit passed without a SHARD from {_ranks(missing)} for step {ev['step']} "
                           f"in epoch {ev['epoch']}", ev["step"], ev["epoch"])

    def ev_audit_failed(self, ev: dict, line: int) -> None:
        if self._same_epoch(ev, line, "an audit failed", ev["rank"]):
            self.failed_at = line
        self.audits.pop((ev["step"], ev["epoch"]), None)

    def ev_idle(self, ev: dict, line: int) -> None:
        first, last = ev["first"], ev["last"]
        if first != self.next_step or last < first:
            self.bad(line, f"an idle stretch of steps {first}..{last} where step {self.next_step} is next",
                     first)
        if last < first:
            return
        n = last - first + 1
        if self.promise == "traces" and not self.diverged:
            fields = _fields_of(self.rung)
            for step in range(first, last + 1):
                want = next(self.reference, None)
                got = _idle_trace(step, fields)
                if not self._same_as_reference(got, want, line, step, None):
                    break
        self.idle += n
        self.next_step = last + 1

    def ev_step(self, ev: dict, line: int) -> None:
        step, epoch, trace = ev["step"], ev["epoch"], ev["trace"]
        _trace_shape(trace)
        self._same_epoch(ev, line, f"step {step} committed")
        if step != self.next_step:
            self.bad(line, f"step {step} committed where step {self.next_step} is next (steps commit in "
                           f"order)", step, epoch)
        if trace.get("step") != step:
            self.bad(line, f"the trace of step {step} says step {trace.get('step')}", step, epoch)
        key = (step, epoch)
        a = self.attempts.pop(key, None)
        for k in [k for k in self.attempts if k[0] == step]:     # its other attempts failed
            self.closed.append(k)
            del self.attempts[k]
        self.closed.append(key)
        joined = None
        if a is None or a.plan is None:
            self.bad(line, f"step {step} committed in epoch {epoch} with no PLAN for it in that epoch: "
                           f"nothing to join", step, epoch)
        else:
            joined = self._joined(a, line)
        if joined is None or not self._follows(a.plan, joined, trace, line, step, epoch):
            self._unfollowed(None if a is None else a.plan, trace, line, step, epoch)
        if self.promise == "traces" and not self.diverged:
            self._same_as_reference(trace, next(self.reference, None), line, step, epoch)
        self.committed += 1
        self.next_step = step + 1

    def _joined(self, a: _Attempt, line: int) -> list | None:
        """The one result the ranks' replies join to, or None (each reason said)."""
        step, epoch = a.step, a.epoch
        ok = True
        if a.verdict not in (None, "joined"):
            self.bad(line, f"step {step} committed, though its attempt in epoch {epoch} failed "
                           f"({shown(a.verdict)[:80]})", step, epoch)
            ok = False
        elif a.verdict is None and self.attempt_events:       # a writer that says verdicts said none
            self.bad(line, f"step {step} committed with no verdict on its attempt in epoch {epoch}",
                     step, epoch)
        missing = [r for r in range(self.n) if r not in a.replies]
        for r in missing:
            also = (f" (its reply at line {a.undecodable[r]} did not decode)" if r in a.undecodable else "")
            self.bad(line, f"step {step} committed without a RESULT of rank {r} in epoch {epoch} to "
                           f"join{also}", step, epoch, r)
        if missing or not a.replies:
            return None
        counts: dict[int, int] = {}
        for _, index in a.replies.values():
            counts[index] = counts.get(index, 0) + 1
        # said against the body most ranks sent (the lowest rank's among equals): the join itself
        # takes no vote, but the one who differs is likelier the one to name
        common = max(counts, key=lambda i: (counts[i], -min(r for r, (_, x) in a.replies.items() if x == i)))
        base = min(r for r, (_, i) in a.replies.items() if i == common)
        for r, (at, index) in sorted(a.replies.items()):
            if index != common:
                self.bad(at, f"rank {r}'s RESULT is not rank {base}'s, and step {step} committed: "
                             f"{_difference(a.bodies[common], a.bodies[index])} (the join takes no vote)",
                         step, epoch, r)
                ok = False
        return a.bodies[common] if ok else None

    # -- the step from its plan and its result ------------------------------------------------

    def _follows(self, plan: dict, outcomes: list, trace: dict, line: int, step: int, epoch: int) -> bool:
        """Phase 9 (the engine's own `mismatches`, every one said) of the joined result against
        the plan, then the trace against both."""
        def say(what: str) -> None:
            self.bad(line, what, step, epoch)

        items = plan["items"]
        decodes = dict(self.last_decodes) if self.last_decodes_step == step - 1 else {}
        self.last_decodes, self.last_decodes_step = {}, step
        valid = True
        for m in mismatches(_as_plan(plan), ExecutionResult(plan["step"], tuple(map(_as_outcome, outcomes))),
                            decodes, self.page_size):
            say(said(m, WORDS, _id))
            valid = False
        if not valid:
            return False
        self._trace_follows(items, outcomes, trace, say)
        return True

    def _trace_follows(self, items: list, outcomes: list, trace: dict, say) -> None:
        fields = set(trace)
        discarded = trace.get("discarded", {}) if "discarded" in fields else {}
        if not isinstance(discarded, dict):
            raise Malformed("a step event's trace: discarded must be an object")
        ran = [(it, out) for it, out in zip(items, outcomes) if it["request_id"] not in discarded]
        ids = [it["request_id"] for it in items]
        want_discarded = [(it["request_id"], it["num_tokens"]) for it in items
                          if it["request_id"] in discarded]
        if list(discarded.items()) != want_discarded or len(want_discarded) != len(discarded):
            say(f"discarded {_json(discarded)} is not of the plan's items")
        executed = _obj(trace, "executed")
        want = [(it["request_id"], it["num_tokens"]) for it, _ in ran]
        if list(executed.items()) != want:
            say(f"executed {_json(executed)} is not the plan's items {_json(dict(want))}")
        scheduled = _list(trace, "scheduled")
        if not _subsequence(ids, scheduled):
            say(f"scheduled {_json(scheduled)} does not hold the plan's requests {_json(ids)} in order")
        elif "preempted" not in fields and scheduled != ids:
            say(f"scheduled {_json(scheduled)} is not the plan's requests {_json(ids)} (nothing is "
                f"preempted at rung {self.rung})")
        elif self.rung != "overlap" and "preempted" in fields:
            preempted = set(_list(trace, "preempted"))
            dropped = [r for r in scheduled if r not in set(ids) and r not in preempted]
            if dropped:
                say(f"scheduled {_json(dropped)}, neither in the plan nor preempted")
        reused = _obj(trace, "reused") if "reused" in fields else {}
        for it in items:
            rid = it["request_id"]
            if rid in reused and it["start_position"] != reused[rid]:
                say(f"{_id(rid)} reused {reused[rid]} positions but its item starts at "
                    f"{it['start_position']}")
        if len(set(ids)) != len(ids):
            say(f"the plan names a request twice: {_json(ids)}")
        # phase 10
        decode = [(it, out) for it, out in ran if it["decode"]]
        have_spec = "drafted" in fields
        accepted = {}
        if have_spec:
            drafted, acc, back = _obj(trace, "drafted"), _obj(trace, "accepted"), _obj(trace, "rolled_back")
            want_d = [(it["request_id"], it["num_tokens"] - 1) for it, _ in decode]
            if list(drafted.items()) != want_d:
                say(f"drafted {_json(drafted)} is not the plan's decode items {_json(dict(want_d))}")
            names = [it["request_id"] for it, _ in decode]
            if list(acc) != names or list(back) != names:
                say(f"accepted {_json(acc)} and rolled_back {_json(back)} are not of the decode items "
                    f"{_json(names)}")
            for it, out in decode:
                rid = it["request_id"]
                a = acc.get(rid)
                if a is None:
                    continue
                accepted[rid] = a
                ceiling = out["accepted"]
                req, spec = self.requests.get(rid), (self.specs or {}).get(rid)
                if spec is not None and req is not None and req.generated is not None:
                    clamp = (ceiling if spec.eos_after is None
                             else min(ceiling, spec.eos_after - req.generated))
                    if a != clamp:
                        say(f"{_id(rid)} accepted {a}, the joined result {ceiling}"
                            + (f" (eos_after {spec.eos_after}, generated {req.generated}: {clamp})"
                               if spec.eos_after is not None else ""))
                elif a > ceiling:
                    say(f"{_id(rid)} accepted {a}, more than the joined result's {ceiling}")
                if back.get(rid) != it["num_tokens"] - 1 - a:
                    say(f"{_id(rid)} rolled back {back.get(rid)}, drafted {it['num_tokens'] - 1} less "
                        f"accepted {a} is {it['num_tokens'] - 1 - a}")
        for it, out in ran:                      # what the next step's items planned ahead start from
            if it["decode"]:
                self.last_decodes[it["request_id"]] = it["num_tokens"] - 1 - out["accepted"]
        # phases 11 to 13
        ran_ids = [it["request_id"] for it, _ in ran]
        sampled, finished = _obj(trace, "sampled"), _obj(trace, "finished")
        if not _subsequence(list(sampled), ran_ids):
            say(f"sampled {_json(sampled)} names requests that did not run, or out of order")
        if not _subsequence(list(finished), list(sampled)):
            say(f"finished {_json(finished)} names requests that did not sample, or out of order")
        for rid, s in sampled.items():
            f = finished.get(rid)
            if s == "EOS" and f != "EOS" or s == "TOKEN" and f not in (None, "LENGTH") or s not in ("EOS",
                                                                                                 "TOKEN"):
                say(f"{_id(rid)} sampled {_json(s)} and finished {_json(f)}")
        if "published" in fields and not _subsequence(list(_obj(trace, "published")), ran_ids):
            say(f"published {_json(trace['published'])} names requests that did not run, or out of order")
        self._after_step(items, ran, trace, accepted, say)

    def _request(self, rid: str, say) -> _Request:
        r = self.requests.get(rid)
        if r is None:
            if self.specs is not None:
                say(f"{_id(rid)} is no request of the workload")
            r = self.requests[rid] = _Request()
        return r

    def _after_step(self, items: list, ran: list, trace: dict, accepted: dict, say) -> None:
        """Each request's state after the step, from the trace and the outcomes (the summary is
        rebuilt from these); with the workload known, who samples and finishes, exactly."""
        specs = self.specs or {}
        self._admitted(trace, say)
        preempted = set(_list(trace, "preempted")) if "preempted" in trace else set()
        reused = _obj(trace, "reused") if "reused" in trace else {}
        in_plan = {it["request_id"] for it in items}
        if self.rung != "overlap":               # an item starts at its request's committed frontier
            for it in items:
                rid = it["request_id"]
                frontier = reused.get(rid, 0 if rid in preempted else self._request(rid, say).computed)
                if frontier is not None and it["start_position"] != frontier:
                    say(f"{_id(rid)}'s item starts at {it['start_position']}, its committed frontier is "
                        f"{frontier}")
        for rid in preempted | set(reused):
            if rid not in in_plan:
                self._request(rid, say).computed = (None if rid in preempted and rid in reused
                                                    else reused.get(rid, 0))
        sampled, finished = _obj(trace, "sampled"), _obj(trace, "finished")
        want_sampled, want_finished, judged = {}, {}, set()
        for it, out in ran:
            rid = it["request_id"]
            r = self._request(rid, say)
            a = accepted.get(rid, 0)
            back = it["num_tokens"] - 1 - a if it["decode"] and rid in accepted else 0
            r.computed = out["start_position"] + out["executed_tokens"] - back
            if r.generated is None:
                continue                         # not known since a step that could not be followed
            r.generated += a
            spec = specs.get(rid)
            if spec is None:
                continue
            judged.add(rid)
            if r.computed == len(spec.tokens) + r.generated:
                if spec.eos_after is not None and r.generated >= spec.eos_after:
                    want_sampled[rid] = want_finished[rid] = "EOS"
                else:
                    want_sampled[rid] = "TOKEN"
                    if r.generated + 1 >= spec.max_new_tokens:
                        want_finished[rid] = "LENGTH"
        if judged:
            got = [(k, v) for k, v in sampled.items() if k in judged]
            if got != list(want_sampled.items()):
                say(f"sampled {_json(dict(got))}, where the computed frontiers say {_json(want_sampled)}")
            got = [(k, v) for k, v in finished.items() if k in judged]
            if got != list(want_finished.items()):
                say(f"finished {_json(dict(got))}, where the samples say {_json(want_finished)}")
        for rid, s in sampled.items():
            r = self._request(rid, say)
            if s == "TOKEN" and r.generated is not None:
                r.generated += 1
        self._finished(trace, say)

    def _admitted(self, trace: dict, say) -> None:
        for rid in _list(trace, "admitted"):
            r = self._request(rid, say)
            if r.state != "WAITING":
                say(f"{_id(rid)} admitted again ({r.state.lower()})")
            r.state = "RUNNING"

    def _finished(self, trace: dict, say) -> None:
        for rid, f in _obj(trace, "finished").items():
            r = self._request(rid, say)
            r.state, r.finish = "FINISHED", f

    def _unfollowed(self, plan: dict | None, trace: dict, line: int, step: int, epoch: int) -> None:
        """A step committed that could not be followed (no joined result, one that fails phase
        9): what it did to its requests is not known from here on, but who it admitted and
        finished; said once, where it failed."""
        def say(what: str) -> None:
            self.bad(line, what, step, epoch)
        self._admitted(trace, say)
        for it in (plan or {}).get("items", ()):
            r = self._request(it["request_id"], say)
            r.computed = r.generated = None
        self._finished(trace, say)
        self.last_decodes, self.last_decodes_step = {}, step

    # -- the reference ------------------------------------------------------------------------

    def _same_as_reference(self, got: dict, want: dict | None, line: int, step: int, epoch) -> bool:
        if want is None or "step" not in want or "error" in want:
            self.diverged = True
            ends = "ends" if want is None else (f"fails there ({shown(str(want.get('error')))})"
                                                if "error" in want else "has ended")
            self.bad(line, f"the reference {ends} before step {step}, which the run committed", step, epoch)
            return False
        if json.dumps(got) != json.dumps(want):
            self.diverged = True
            self.bad(line, f"step {step} is not the reference's: {_field_difference(got, want)} (the "
                           f"policy promises the same trace)", step, epoch)
            return False
        return True

    def _summary(self) -> list[dict]:
        out = []
        for rid in self.order:
            r = self.requests[rid]
            out.append({"request_id": rid, "state": r.state, "generated": r.generated, "computed": r.computed,
                        "finish_reason": r.finish})
        return out

    # -- the end --------------------------------------------------------------------------

    def ev_end(self, ev: dict, line: int) -> None:
        if self.end_line is not None:
            self.bad(line, f"a second end event (the first at line {self.end_line})")
            return
        self.end_line, self.end = line, ev
        status, error = ev["status"], ev["error"]
        if ev["steps"] != self.next_step:
            self.bad(line, f"the end says {ev['steps']} steps; the log's steps are {self.next_step}")
        if status not in ("ok", "failed"):
            self.bad(line, f"the end's status is {_json(status)}, neither ok nor failed")
        if status == "ok" and error is not None:
            self.bad(line, "the end says ok, with an error")
        if status == "failed" and not (isinstance(error, dict) and isinstance(error.get("error"), str)):
            self.bad(line, "the end says failed, with no error object")
        elif status == "failed" and type(error.get("step")) is int:
            self._failed_at(error["step"], line)
        if status == "ok":
            pending = [k for k, a in self.attempts.items() if a.verdict is None]
            if pending:
                s, e = pending[0]
                self.bad(line, f"the run ended ok with step {s}'s plan of epoch {e} never answered nor "
                               f"given up", s, e)

    def _failed_at(self, k: int, line: int) -> None:
        """A run that failed at step k committed the steps before it and none after; step k itself
        only when an audit after it failed it."""
        last = self.next_step - 1
        if last < k or last == k and self.last_audit == k:
            return
        steps = f"step {k}" if last == k else f"steps {k}..{last}"
        why = ("a failed step commits nothing, nor does any after it" if last > k else
               "a failed step commits nothing; no audit after it failed it")
        self.bad(line, f"the end says the run failed at step {k}, yet {steps} committed ({why})")

    def _plain_roots(self) -> None:
        """A root cause nothing followed from is one record of another epoch: said as such."""
        lines = {v.follows for v in self.violations}
        for index, plain in self.roots:
            v = self.violations[index]
            if v.line not in lines:
                self.violations[index] = replace(v, what=plain)

    def finish(self, reader: LogReader) -> None:
        if self.end is None:
            self.bad(None, f"no end event: the log stops at line {reader.cut_short or reader.line} (the run "
                           f"did not finish writing it)")
            if self.reference is not None:
                self.compared = None
                self.why_not = "the run has no end"
            return
        if self.reference is None:
            return
        line, status, error = self.end_line, self.end["status"], self.end["error"]
        error = error if isinstance(error, dict) else {}
        rebuilt = self._summary()
        unknown = any(r["generated"] is None or r["computed"] is None for r in rebuilt)
        if self.promise == "traces":
            if self.diverged:
                return
            want = next(self.reference, None)
            if status == "ok":
                if want is None or "summary" not in want:
                    what = (f"goes on to step {want['step']}" if want is not None and "step" in want
                            else f"fails ({shown(str(want.get('error')))} at step {want.get('step')})"
                            if want is not None else "ends")
                    self.bad(line, f"the run ended ok after {self.next_step} steps where the reference "
                                   f"{what}")
                elif not unknown and want["summary"] != rebuilt:    # (unknown: the steps are compared)
                    self.bad(line, f"the summary rebuilt from the steps is not the reference's: "
                                   f"{_summary_difference(rebuilt, want['summary'])}")
                return
            self.compared = "prefix"
            if want is not None and "error" in want:
                if (want.get("error"), want.get("step")) != (error.get("error"), error.get("step")):
                    self.bad(line, f"the run failed with {shown(str(error.get('error')))} at step "
                                   f"{error.get('step')}, the reference with {shown(str(want['error']))} at "
                                   f"step {want.get('step')}")
            elif want is not None and "summary" in want:
                pass                                 # failed at the end (an audit): the steps all stand
            return
        # recompute: the summary
        if status != "ok":
            self.compared = None
            self.why_not = "recompute promises a summary, and the run failed"
            return
        if unknown:
            self.compared = None
            self.why_not = "a committed step could not be followed: the summary cannot be rebuilt"
            return
        want, budget = None, 10 * self.next_step + 100_000     # recompute may take more steps, not 10x
        for n, want in enumerate(self.reference):
            if n > budget:
                self.compared = None
                self.why_not = f"the reference runs past {budget} steps, the run took {self.next_step}"
                return
        if want is None or "summary" not in want:
            self.bad(line, f"the run ended ok, the reference failed "
                           f"({shown(str((want or {}).get('error')))})")
        elif want["summary"] != rebuilt:
            self.bad(line, f"the summary rebuilt from the steps is not the reference's: "
                           f"{_summary_difference(rebuilt, want['summary'])} (recompute promises "
                           f"the same summary)")


# -- reading records: the fields the schema gives, the shapes of plans and results -------------

# The fields each record the checker reads must have; the schema's other fields, when there,
# must be of their kinds (an older writer may leave out what the checker does not use).
NEEDED = {"message": ("dir", "rank", "epoch", "step", "type", "body"),
          "run": ("world_size", "rung", "policy", "config"),
          "member": ("rank", "epoch"), "restart": ("ranks", "epoch", "step"),
          "attempt": ("step", "epoch", "verdict"), "rank-lost": ("rank", "epoch"),
          "step-failed": ("step", "epoch"), "audit": ("step", "epoch"),
          "audit-failed": ("rank", "step", "epoch"), "idle": ("first", "last"),
          "step": ("step", "epoch", "trace"), "end": ("status", "error", "steps")}


def _types(kinds) -> frozenset:
    return frozenset(t for k in kinds for t in TYPES[k])


@functools.lru_cache(maxsize=None)
def _table(spec_id: int, kind: str) -> tuple:
    """A schema table as the checker reads it: (name, types, needed, item types or None) per field
    (the Python types of JSON's kinds: a bool is no int, as the schema has it)."""
    spec = _SPECS[spec_id]
    needed = NEEDED.get(kind, ())
    return tuple((name, _types(f.kinds), name in needed, None if f.items is ANY else _types(f.items))
                 for name, f in spec.items())


_SPECS = {id(MESSAGE): MESSAGE, id(ITEM): ITEM, id(OUTCOME): OUTCOME,
          **{id(e.fields): e.fields for e in EVENTS.values()}}


def _fields(obj: dict, spec: dict[str, Field], what: str, kind: str) -> None:
    """The schema's fields of `obj`, each of its kind, those the checker reads (NEEDED) there
    (a field the schema does not know is left alone: a newer writer's)."""
    for name, types, needed, items in _table(id(spec), kind):
        if name not in obj:
            if needed:
                raise Malformed(f"{what}: no {name}")
            continue
        v = obj[name]
        if type(v) not in types:
            raise Malformed(f"{what}: {name} must be {_kinds_said(spec[name])}, not {kind_of(v)}")
        if items is not None and type(v) is list and not set(map(type, v)) <= items:
            raise Malformed(f"{what}: {name} must hold {' or '.join(sorted(spec[name].items))} only")


def _kinds_said(f: Field) -> str:
    return " or ".join(sorted(f.kinds))


def _kind_name(m: dict) -> str:
    kind = m.get("type")
    return shown(kind)[:32] if isinstance(kind, str) else "wire"


@functools.lru_cache(maxsize=None)
def _shape(spec_id: int) -> tuple:
    """A body's schema table (ITEM, OUTCOME) as the checker reads it: (name, types, item types or
    None, its kind in words) per required field."""
    return tuple((name, _types(f.kinds), None if f.items is ANY else _types(f.items),
                  "a list of page numbers" if f.sort == "page" else _kinds_said(f))
                 for name, f in _SPECS[spec_id].items() if f.required)


def _shaped(obj: Any, shape: dict[str, Field], what: str) -> dict:
    """`obj`, an object holding each required field of `shape` (the schema's ITEM or OUTCOME),
    of its kind."""
    if type(obj) is not dict:
        raise Malformed(f"{what} must be an object")
    for key, types, items, must in _shape(id(shape)):
        v = obj.get(key, _MISSING)
        if type(v) not in types or items is not None and not set(map(type, v)) <= items:
            raise Malformed(f"{what}: no {key}" if v is _MISSING else f"{what}: {key} must be {must}")
    return obj


_MISSING = object()
_ITEM_KEYS = tuple(k for k, f in ITEM.items() if f.required)      # prior_drafts: 0 when left out


def _plan_body(body: Any) -> dict:
    if not isinstance(body, dict) or type(body.get("step")) is not int or not isinstance(body.get("items"),
                                                                                          list):
        raise Malformed("PLAN message: body must be an object with a step and a list of items")
    items = []
    for i, it in enumerate(body["items"]):
        it = _shaped(it, ITEM, f"PLAN item {i}")
        prior = it.get("prior_drafts", 0)
        if type(prior) is not int or prior < 0:
            raise Malformed(f"PLAN item {i}: prior_drafts must be a whole number >= 0")
        items.append({**{k: it[k] for k in _ITEM_KEYS}, "prior_drafts": prior})
    return {"step": body["step"], "items": items}


def _result_body(body: Any) -> list | None:
    """A RESULT's outcomes, or None for one that did not decode."""
    if isinstance(body, dict) and set(body) == {"undecodable"}:
        return None
    if not isinstance(body, list):
        raise Malformed('RESULT message: body must be a list of outcomes or {"undecodable": TEXT}')
    return [{k: _shaped(o, OUTCOME, f"RESULT outcome {i}")[k] for k in OUTCOME} for i, o in enumerate(body)]


def _as_plan(plan: dict) -> ExecutionPlan:
    """A checked PLAN body as the engine holds a plan (for phase 9)."""
    return ExecutionPlan(plan["step"], tuple(PlanItem(**{**it, "placements": tuple(it["placements"])})
                                             for it in plan["items"]))


def _as_outcome(out: dict) -> ItemOutcome:
    return ItemOutcome(**{**out, "writes": tuple(out["writes"])})


# Phase 9's mismatches as the checker says them (the engine's words: boundary.WORDS).
WORDS = {
    "step": "the joined result answers step {got}, the plan is step {want}",
    "outcomes": "the joined result has {got} outcomes for the plan's {want} items",
    "request_id": "outcome {index} is for {got}, the plan's item {index} for {want}",
    "start_position": "{rid} started at {got}, the plan{shifted} says {want}",
    "executed_tokens": "{rid} executed {got} tokens, the plan says {want}",
    "writes": "{rid} wrote pages {got}, placed on {want}",
    "accepted": "{rid} accepted {got}, allowed 0..{want}",
}


TRACE_SHAPES = {  # a trace's fields (SPEC §4, §7) as the checker reads them
    **dict.fromkeys(("admitted", "scheduled", "preempted"), (list, str)), "evicted": (list, int),
    **dict.fromkeys(("executed", "reused", "published", "drafted", "accepted", "rolled_back", "discarded",
                     "returned"), (dict, int)),
    **dict.fromkeys(("sampled", "finished"), (dict, str)),
}


def _trace_shape(trace: dict) -> None:
    """A step event's trace: each field the checker reads of its shape (a list of ids or pages, an
    object of counts or names), or the record is malformed."""
    for key, (outer, inner) in TRACE_SHAPES.items():
        v = trace.get(key)
        if v is None:
            continue
        values = v if outer is list else v.values() if type(v) is dict else None
        if type(v) is not outer or not set(map(type, values)) <= {inner}:
            raise Malformed(f"step event: the trace's {key} must be "
                            f"{'a list' if outer is list else 'an object'} of "
                            f"{'names' if inner is str else 'whole numbers'}")


def _obj(trace: dict, key: str) -> dict:
    v = trace.get(key, {})
    if not isinstance(v, dict):
        raise Malformed(f"a step event's trace: {key} must be an object")
    return v


def _list(trace: dict, key: str) -> list:
    v = trace.get(key, [])
    if not isinstance(v, list):
        raise Malformed(f"a step event's trace: {key} must be a list")
    return v


# -- small words ------------------------------------------------------------------------------

def _fields_of(rung: str) -> tuple[str, ...]:
    from inferris_dist.engine import RUNGS
    r = RUNGS.get(rung)
    return r.fields if r is not None else SPEC_ORDER[:13]


def _idle_trace(step: int, fields: tuple[str, ...]) -> dict:
    from inferris_dist.engine import StepTrace
    return StepTrace.idle(step).to_json(fields)


def _subsequence(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def _a(word: str) -> str:
    """`word` (a message type, AUDIT, PLAN) with its article: "an AUDIT", "a PLAN"."""
    return f"{'an' if word[:1].upper() in 'AEIOU' else 'a'} {word}"


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + (", ".join(map(str, ranks)) or "none")


def _difference(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"{len(b)} outcomes, not {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        for k in OUTCOME:
            if x[k] != y[k]:
                return f"outcome {i} ({_id(x['request_id'])}) {k} {_json(y[k])}, not {_json(x[k])}"
    return "the same outcomes, in another form"

