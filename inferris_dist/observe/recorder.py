"""The recorder: what happened at the boundary, told once, kept by whoever wants it.

The control plane's side of the boundary (the channel, the process group, the
engine on processes) tells one `Recorder` what happened: a message sent, a
reply taken or dropped, a rank lost, a member admitted, an attempt's verdict, a
step committed, a restart, a note. The recorder keeps the step records and the
per-rank totals the command line prints, and feeds the wire log and the
timeline when a run has them. It never steers: nothing it is told changes what
the control flow does next, and a run without a wire log or a timeline is told
the same things (the calls then cost a method call each).

Anything that wants to watch a run (a live page, a history checker) is one
more thing the recorder feeds.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager, nullcontext
from typing import Any, Iterable

from inferris_dist.observe.arrivals import Arrivals
from inferris_dist.observe.records import RankTotals, StepRecord
from inferris_dist.observe.timeline import Timeline
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.wirelog.writer import WireLog

NOTED_PER_RANK = 5       # a member's dropped replies noted and logged in full; the rest are counted
MAX_ATTEMPTS = 64        # attempts kept between two takes (a step's own, and its retries)
_NOTHING = nullcontext()


PAUSE_FIELDS = ("epoch", "step", "kind", "message", "lost", "survivors", "world_size", "can", "timeout_s",
                "default")


class Recorder:
    def __init__(self, world_size: int, wire_log: WireLog | None = None, timeline: Timeline | None = None,
                 shared_clock: bool = True):
        self.world_size = world_size
        self.log = wire_log
        self.timeline = timeline
        if timeline is not None:
            timeline.shared_clock = shared_clock    # ranks on this host read our clock
        self.totals = {r: RankTotals() for r in range(world_size)}
        self.arrivals = Arrivals()          # every rank's arrival at every join
        # the wavefront (as a flight recorder keeps it): per rank, its last result taken and its
        # last FIRED, each (step, epoch, when[, what]); the plans out say the rest
        self.front: dict[int, dict[str, tuple]] = {}
        self.attempts: deque[StepRecord] = deque(maxlen=MAX_ATTEMPTS)   # since take_attempts()
        self.last_record: StepRecord | None = None   # the attempt whose replies were gathered last

    @property
    def wants_timing(self) -> bool:
        """Whether the ranks' own times are worth asking for: always, for the arrivals' execute
        times (the straggler's score), and the wire log and the timeline keep them."""
        return True

    # -- the run -------------------------------------------------------------------------

    def run(self, **fields: Any) -> None:
        if self.log is not None:
            self.log.event("run", **fields)

    def end(self, ended: BaseException | None, steps: int) -> None:
        """The wire log's last line: how the run ended (after every worker was stopped)."""
        if self.log is None:
            return
        if ended is None:
            error = None
        elif hasattr(ended, "to_json"):
            error = ended.to_json()
        else:
            error = {"error": type(ended).__name__, "message": str(ended)}
        try:
            self.log.event("end", status="ok" if ended is None else "failed", error=error, steps=steps)
        except OSError:
            pass                    # the log's own failure is reported where it is closed

    # -- members -------------------------------------------------------------------------

    def member(self, rank: int, epoch: int, pid: int, host: str, proof: str) -> None:
        if self.log is not None:
            self.log.event("member", rank=rank, epoch=epoch, pid=pid, host=host, proof=proof)

    def lost(self, err, step: int | None, epoch: int) -> None:
        """A rank (or several) lost: `err` is the RankLost raised for it."""
        if self.log is not None:
            self.log.event("rank-lost", rank=err.rank, ranks=list(err.ranks), step=step, epoch=epoch,
                           reason=err.reason, message=err.message)

    def lost_meanwhile(self, rank: int, epoch: int, message: str) -> None:
        """A member lost while others were being replaced (replaced in the same window)."""
        if self.log is not None:
            self.log.event("rank-lost", rank=rank, ranks=[rank], step=None, epoch=epoch,
                           reason="died", message=message)

    def restart(self, ranks: list[int], epoch: int, step: int, shard_pages: int, policy: str) -> None:
        if self.log is not None:
            self.log.event("restart", ranks=list(ranks), epoch=epoch, step=step,
                           shard_pages=shard_pages, policy=policy)

    def reshape(self, world_size: int) -> None:
        """The world changed size: a rank new to the run starts with totals of its own."""
        self.world_size = world_size
        for rank in range(world_size):
            self.totals.setdefault(rank, RankTotals())

    def resized(self, resize) -> None:
        """The world changed size (a `Resize` of the process group)."""
        if self.log is not None:
            fields = {k: v for k, v in resize._asdict().items() if v is not None}
            fields["from"] = fields.pop("old")
            fields["to"] = fields.pop("new")
            self.log.event("resize", **fields)
        if self.timeline is not None:
            self.timeline.instant(f"{resize.why}: world size {resize.old} -> {resize.new}",
                                  step=resize.step, epoch=resize.epoch)

    def waiting(self) -> None:
        """The run waits in real time (for arrivals): what is buffered goes out first."""
        if self.log is not None:
            self.log.flush()

    def paused(self, status: dict) -> None:
        """A run under pause stopped on a loss and waits for an operator (its status)."""
        if self.log is not None:
            self.log.event("pause", **{k: status[k] for k in PAUSE_FIELDS})
        if self.timeline is not None:
            self.timeline.instant("paused", step=status["step"], epoch=status["epoch"])

    def instruction(self, ident: str, instruction: str, epoch: int, source: str, code: int,
                    answer: dict) -> None:
        """An operator's instruction carried out or refused (or the pause timeout's default)."""
        if self.log is not None:
            self.log.event("instruction", id=ident, instruction=instruction, epoch=epoch, source=source,
                           code=code, answer=answer)

    def rejoin_wait(self, started: float, ranks: list[int], joined: bool) -> None:
        if self.log is not None:
            self.log.event("rejoin-wait", t=started, ranks=ranks,
                           dur=round(time.monotonic() - started, 6), joined=joined)

    def recovered(self, recovery) -> None:
        """A failure survived (a `Recovery`): a mark on the timeline."""
        if self.timeline is not None:
            self.timeline.instant(f"{recovery.policy}: {recovery.kind}", step=recovery.step,
                                  epoch=recovery.epoch, ranks=list(recovery.restarted),
                                  message=recovery.message)

    # -- messages ------------------------------------------------------------------------

    def sent(self, rank: int, epoch: int, step: int, kind: MsgType, header_bytes: int, body_bytes: int,
             body: Any, link: str | None = None) -> None:
        """A message sent to `rank` (`link`: what a link fault did to it on its way)."""
        self.totals[rank].bytes_sent += header_bytes + body_bytes
        if self.log is not None:
            if link is None:
                self.log.message("out", rank, epoch, step, kind.name, body_bytes, body)
            else:
                self.log.message("out", rank, epoch, step, kind.name, body_bytes, body, link=link)

    def link_in(self, rank: int, header: wire.Header, body: bytes, what: str) -> None:
        """A message from `rank` a link fault acted on before the scheduler read it: lost, or
        delayed (it is read, and logged again, when the link delivers it)."""
        if self.log is not None:
            self.log.message("in", rank, header.epoch, header.step, header.type.name, len(body),
                             for_log(header.type, body), link=what)

    def partition(self, rank: int, step: int, epoch: int, seconds: float) -> None:
        if self.log is not None:
            self.log.event("partition", rank=rank, step=step, epoch=epoch, seconds=seconds)

    def received(self, rank: int, epoch: int, step: int, kind: MsgType, body_bytes: int, body: Any) -> None:
        """A message that is no reply to a round (a HELLO, a READY, a FIRED): logged as it came."""
        if kind is MsgType.FIRED:
            self.front.setdefault(rank, {})["fired"] = (step, epoch, time.monotonic(), " ".join(body))
        if self.log is not None:
            self.log.message("in", rank, epoch, step, kind.name, body_bytes, body)

    def taken(self, rank: int, header_bytes: int, body_bytes: int, record: StepRecord | None,
              sent_at: float, timing: tuple | None) -> None:
        """A reply taken for its round: its bytes, its round trip and the rank's own times."""
        totals = self.totals[rank]
        totals.bytes_received += header_bytes + body_bytes
        if record is not None:
            if timing is not None:
                record.inside[rank] = timing
            now = time.monotonic()
            self.front.setdefault(rank, {})["result"] = (record.step, record.epoch, now)
            rtt = now - sent_at
            record.rtt[rank] = rtt
            record.result_bytes[rank] = body_bytes
            totals.add_rtt(rtt)
            totals.steps += 1

    def replies(self, epoch: int, flight, decoded: dict[int, Any], **more: Any) -> None:
        """A round's replies in the wire log, once, in the order they came: `decoded` by rank
        where the caller decoded them (the others are decoded here, for the log only)."""
        if flight.logged:
            return
        flight.logged = True
        if self.log is None:
            return
        record = flight.record
        came = (lambda r: record.sent[r] + record.rtt[r]) if record is not None else (lambda r: r)
        for r in sorted(flight.got, key=came):
            self._reply(r, epoch, flight.step, flight.expect, flight.got[r][1], decoded.get(r), record,
                        **more)

    def voided(self, epoch: int, flight, why: str) -> None:
        """A plan sent ahead whose results will never be read (the epoch ended, or the run): its
        attempt says so, and the replies kept for it crossed, so they are logged, marked void,
        at the time they came, and counted as dropped."""
        record = flight.record
        for r in flight.got:
            self.totals[r].dropped += 1
            if record is not None and r in record.rtt:
                self.totals[r].steps -= 1          # taken, never joined: dropped after all
        self.replies(epoch, flight, {}, dropped="void")
        if record is not None and not record.verdict:
            record.verdict = f"void (sent ahead; {why})"
            self.attempt(record)

    def dropped(self, rank: int, epoch: int, header: wire.Header, body: bytes | None, what: str,
                note: str, link: str | None = None) -> None:
        """A reply not joined (a duplicate, stale, or for a plan the run is not at), counted; the
        first few of each rank also noted in `epoch` and logged as it came (it crossed), the
        rest only counted."""
        totals = self.totals[rank]
        totals.dropped += 1
        if totals.dropped > NOTED_PER_RANK:
            return
        if self.log is not None and body is not None:
            kind = header.type
            more = {"dropped": what} if link is None else {"dropped": what, "link": link}
            self.log.message("in", rank, header.epoch, header.step, kind.name, len(body),
                             for_log(kind, body), **more)
        self.note(rank, epoch, note)

    def broken(self, rank: int, epoch: int, step: int, kind: MsgType, num_bytes: int, why: str,
               dropped: str | None = None) -> None:
        """A member's message that does not decode where a `kind` was awaited: its size, and why;
        `dropped` (why it is not joined) when it is dropped, not blamed."""
        if self.log is not None:
            more = {} if dropped is None else {"dropped": dropped}
            self.log.message("in", rank, epoch, step, kind.name, num_bytes, {"undecodable": why}, **more)

    def note(self, rank: int | None, epoch: int, text: str) -> None:
        """Something worth saying (a drop, a refusal): with the attempt gathered last, and logged."""
        if self.last_record is not None:
            self.last_record.notes.append(text)
        if self.log is not None:
            self.log.event("note", rank=rank, epoch=epoch, text=text)

    def link_note(self, record: StepRecord | None, rank: int, epoch: int, text: str) -> None:
        """What a link fault did, said with the attempt it did it to (`record`; None: the attempt
        gathered last) and logged as a note."""
        record = record if record is not None else self.last_record
        if record is not None:
            record.notes.append(text)
        if self.log is not None:
            self.log.event("note", rank=rank, epoch=epoch, text=text)

    def turned_away(self, counts: dict | None) -> None:
        """What the door turned away and what was dropped unnoted, counted (None: nothing)."""
        if self.log is not None and counts is not None:
            self.log.event("turned-away", **counts)

    def _reply(self, rank: int, epoch: int, step: int, kind: MsgType, body: bytes, decoded,
               record: StepRecord | None, **more: Any) -> None:
        """A reply that crossed, at the time it came: for a RESULT also when its plan went out,
        the round trip, and the rank's own times. `decoded` None: decoded here for the log."""
        if decoded is None:
            decoded = for_log(kind, body)
        extra = {}
        t = None
        if record is not None and rank in record.rtt:
            sent, rtt = record.sent[rank], record.rtt[rank]
            t = sent + rtt
            extra = {"sent": round(sent, 6), "rtt": round(rtt, 6)}
            if rank in record.inside:
                extra["inside"] = [round(x, 6) for x in record.inside[rank]]
        self.log.message("in", rank, epoch, step, kind.name, len(body), decoded, t=t, **extra, **more)

    # -- attempts and steps --------------------------------------------------------------

    def started(self, record: StepRecord) -> None:
        """An attempt at a step: its plan goes out now."""
        self.attempts.append(record)

    def gathering(self, record: StepRecord | None) -> None:
        """The replies to this attempt are being read (None: an audit's; a step's verdict stands)."""
        self.last_record = record

    def attempt(self, record: StepRecord) -> None:
        """An attempt's verdict is in (joined, failed, or void); a joined one's arrivals are
        counted (who came last, how late)."""
        if self.timeline is not None:
            self.timeline.attempt(record)
        came = self.arrivals.join(record) if record.verdict == "joined" else None
        if self.log is not None:
            if came:
                self.log.event("attempt", step=record.step, epoch=record.epoch, verdict=record.verdict,
                               plan_bytes=record.plan_bytes, arrivals=Arrivals.said(record, came))
            else:
                self.log.event("attempt", step=record.step, epoch=record.epoch,
                               verdict=record.verdict or "failed", plan_bytes=record.plan_bytes)

    def wavefront(self, ranks, silent, flights) -> list[str]:
        """One line per rank of `ranks`: the last plan it was sent (of `flights`, the plans out:
        their send times are theirs), its last result and its last FIRED, and how long ago each
        was; the ranks in `silent` marked (no answer by the deadline). Logged as the `wavefront`
        event."""
        now = time.monotonic()
        lines, rows = [], []
        for r in ranks:
            front = self.front.get(r, {})
            sent = [(f.sent_at[r], f.step, f.epoch) for f in flights if r in f.sent_at]
            last = max(sent) if sent else None
            plan = (last[1], last[2], last[0]) if last is not None else None     # step, epoch, when
            result, fired = front.get("result"), front.get("fired")
            said = [f"last plan step {plan[0]} (epoch {plan[1]}) {now - plan[2]:.2f} s ago" if plan
                    else "no plan yet",
                    f"last result step {result[0]} {now - result[2]:.2f} s ago" if result
                    else "no result yet",
                    f"last FIRED {fired[3]} {now - fired[2]:.2f} s ago" if fired else "no FIRED"]
            lines.append(f"rank {r}: {'; '.join(said)}{'   <- no answer' if r in silent else ''}")
            rows.append({"rank": r, "silent": r in silent,
                         "plan": None if plan is None else {"step": plan[0], "epoch": plan[1],
                                                            "ago": round(now - plan[2], 6)},
                         "result": None if result is None else {"step": result[0], "epoch": result[1],
                                                                "ago": round(now - result[2], 6)},
                         "fired": None if fired is None else {"step": fired[0], "faults": fired[3],
                                                              "ago": round(now - fired[2], 6)}})
        if self.log is not None:
            self.log.event("wavefront", ranks=rows)
        return lines

    def step_failed(self, err, step: int, epoch: int) -> None:
        """Every rank answered, and the answers could not be joined."""
        if self.log is not None:
            sides = getattr(err, "sides", None)
            more = {} if sides is None else {"where": err.where, "sides": sides}
            self.log.event("step-failed", kind=err.kind, ranks=list(err.ranks), step=step,
                           epoch=epoch, message=err.message, **more)

    def committed(self, engine, trace, epoch: int) -> None:
        """A step committed: its trace and the counters after it (what a page draws without
        running the engine again)."""
        if self.log is not None:
            from inferris_dist.observe.metrics import step_counters
            by_id = engine.by_id
            prompt = sum(by_id[r].prompt for r in trace.admitted)
            prompt += sum(by_id[r].prompt for r in trace.preempted)
            self.log.event("step", step=trace.step, epoch=epoch, trace=engine.trace_json(trace),
                           counters=step_counters(engine, trace), prompt_tokens=prompt)

    def idle(self, first: int, last: int) -> None:
        if self.log is not None:
            self.log.event("idle", first=first, last=last,
                           text="empty plans, answered by the scheduler: no round trip")

    def phase(self, name: str, step: int):
        """A stretch of the scheduler's work, timed for whoever keeps it (nobody: no clock read)."""
        if self.log is None and self.timeline is None:
            return _NOTHING
        return self._phase(name, step)

    @contextmanager
    def _phase(self, name: str, step: int):
        start = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - start
            if self.timeline is not None:
                self.timeline.add_span("scheduler", f"{name} {step}", start, took)
            if self.log is not None:
                self.log.event("phase", t=start, phase=name, step=step, dur=round(took, 6))

    def audit(self, step: int, epoch: int) -> None:
        if self.log is not None:
            self.log.event("audit", step=step, epoch=epoch)

    def audit_failed(self, err, page: int, offset: int) -> None:
        if self.log is not None:
            self.log.event("audit-failed", rank=err.rank, step=err.step, epoch=err.epoch,
                           page=page, offset=offset, message=err.message)

    def take_attempts(self, in_flight: Iterable[StepRecord] = ()) -> list[StepRecord]:
        """The attempts since the last call, but those of plans still in flight (overlap: the
        next step's plan went out; its attempt is taken with its own step)."""
        keep = {id(r) for r in in_flight}
        attempts = [a for a in self.attempts if id(a) not in keep]
        self.attempts = deque((a for a in self.attempts if id(a) in keep), maxlen=self.attempts.maxlen)
        return attempts

    def member_drops(self) -> dict[int, int]:
        """Per rank, its replies dropped (stale, future, duplicate, void)."""
        return {r: t.dropped for r, t in self.totals.items() if t.dropped}


def for_log(kind: MsgType, body: bytes):
    """A reply decoded for the wire log only (one that does not decode is logged as such)."""
    try:
        return wire.decode_body(kind, body)
    except wire.WireError as e:
        return {"undecodable": str(e)}
