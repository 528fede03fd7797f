"""The engine on real processes, and what it does when a step fails there.

`DistributedEngine` drives an `Engine` whose executor is a `ProcessGroup`:
the engine prepares a step (phases 1 to 6), its plan goes to the group, the
group collects every rank's result, and the engine commits it (phases 9 to
13). One loop for `full` and one for `overlap` sit side by side below, each
a step read top to bottom: prepare, submit, collect or recover, commit.

A step whose execution fails (a rank lost, a protocol error, a
GroupViolation or BoundaryViolation) has committed nothing: the control
plane is exactly as it was when the plan went out. The policy decides what
follows (the loop's "or recover"):

- abort: stop, with the failure attributed (rank, step, epoch, kind).
- restore: replace the lost rank (every rank, when none can be blamed) with a
  fresh worker whose shard is rebuilt from the control plane's pool, move to
  the next epoch and send the same plan again. The trace is unchanged.
- recompute: replace it with an empty worker, as a real GPU rank would come
  back; the control plane treats every page as lost and plans the step again.
  The trace shows the preemptions; every request generates the same tokens.

A shard that fails the audit is treated the same way. A fault that keeps
coming back exhausts `max_restarts` and ends as abort does.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from operator import attrgetter
from typing import Iterator, NamedTuple

from inferris_dist.engine import (
    BoundaryViolation,
    Engine,
    EngineError,
    GroupViolation,
    PreparedStep,
    RankLost,
    StepTrace,
    Workload,
)
from inferris_dist.engine.errors import ShardDivergence
from inferris_dist.protocol.faults import POLICIES
from inferris_dist.scheduler.group import ProcessGroup, Resize
from inferris_dist.scheduler.options import LaunchOptions

LOOK_EVERY_S = 0.02        # while idle with no model time: how often the members are looked at
IDLE_WAIT_S = 2.0          # pause: the most an idle stretch waits in real time
BUSY_PHASES = ("prepare", "commit")   # the scheduler's own work in a step
MAX_RECOVERIES_KEPT = 256       # recoveries kept between two takes (the restarts of one step)
RECOVERABLE = (RankLost, GroupViolation, BoundaryViolation, ShardDivergence)
# The engine's state, read through the DistributedEngine (what the command line, the metrics and
# a check after each step read of a run); stepping the engine is the DistributedEngine's own.
READ_THROUGH = ("workload", "config", "rung", "fields", "requests", "by_id", "pool", "cache", "keys",
                "scheduler", "executor", "step_id", "next_step", "num_unfinished", "done", "is_idle",
                "summary", "snapshot", "trace_json", "json_line")


class Recovery(NamedTuple):
    """One failure survived: what failed, and what was done about it."""
    step: int
    epoch: int             # the epoch that failed
    kind: str
    rank: int | None
    message: str
    policy: str
    restarted: tuple[int, ...]
    pids: tuple[int, ...]
    shard_pages: int       # pages rebuilt into each new shard (0 for recompute)
    preempted: tuple[str, ...] = ()
    in_audit: bool = False  # found by the shard audit, between steps
    hosts: tuple[str, ...] = ()   # where the replacements joined from (members we did not start)
    resize: Resize | None = None  # the world changed size (shrink; a regrow has no failure)
    waited: float = 0.0           # seconds the steps waited for it
    wavefront: tuple[str, ...] = ()   # a deadline passed: where every rank was, a line each


def _reading_through(cls: type) -> type:
    """The engine's state (READ_THROUGH) as read-only attributes of the class."""
    for name in READ_THROUGH:
        setattr(cls, name, property(attrgetter(f"engine.{name}"), doc=f"the engine's `{name}`"))
    return cls


@_reading_through
class DistributedEngine:
    """The engine on processes: drives `engine`, an `Engine` whose executor is `group`, one step
    at a time, telling the recorder what happened and recovering what fails as the policy says.
    The engine's state reads through it (READ_THROUGH: `step_id`, `requests`, `summary()`, ...)."""

    def __init__(self, workload: Workload, group: ProcessGroup, options: LaunchOptions | None = None):
        options = options or group.options
        self.engine = Engine(workload, executor=group, rung=options.rung)
        if options.on_rank_loss not in POLICIES:
            raise ValueError(f"unknown policy {options.on_rank_loss!r}")
        self.group = group
        self.recorder = group.recorder
        self.audit_every = options.audit_every
        self.policy = options.on_rank_loss
        self.max_restarts = options.max_restarts
        self.num_restarts = 0
        self.requested = group.world_size          # the world size asked for (mechanism 14)
        self.min_world_size = options.min_world_size
        self.regrow = options.regrow
        self.desk = options.operator               # pause: where instructions come from
        if self.policy == "pause" and self.desk is None:
            raise ValueError("pause needs an operator's desk (options.operator)")
        # pause (a serving engine with an operator, mechanism 14): an idle step takes the model's
        # time of a step, up to IDLE_WAIT_S a stretch; under every other policy it takes none
        paced = options.exec_cost and self.policy == "pause"
        self.idle_s = options.exec_cost.per_step_ns / 1e9 if paced else 0.0
        self._next_look = 0.0                      # when an idle step without model time looks next
        self._idle_until = 0.0                     # when this stretch's waiting ends
        self.recoveries: deque[Recovery] = deque(maxlen=MAX_RECOVERIES_KEPT)   # since take_recoveries()
        self.recoveries_unshown = 0                # recoveries past the kept ones, since the last take
        self._preempted_between_steps: list[str] = []  # by a recompute after an audit: shown next step
        self._idle_from: int | None = None         # the first step of the idle stretch we are in
        self.scheduler_s = 0.0                     # the scheduler's planning and committing, timed
        self.hidden_s = 0.0                        # of it, what ran while a plan was in flight

    def take_recoveries(self) -> list[Recovery]:
        recoveries = list(self.recoveries)
        self.recoveries.clear()
        self.recoveries_unshown = 0
        return recoveries

    def run(self) -> Iterator[StepTrace]:
        """Every step committed, with every rank's shard audited every `audit_every` steps that
        crossed the boundary, and always at the end."""
        if self.desk is not None:
            self.desk.set(phase="running", epoch=self.group.epoch, world_size=self._sizes())
        try:
            yield from (self._overlap_loop() if self.engine.rung.overlap else self._full_loop())
            self._end_idle()
            self._audit(self.engine.step_id - 1)
            self.group.run_ended()
        except BaseException:
            if self.desk is not None:
                self.desk.set(phase="failed")
            raise
        if self.desk is not None:
            self.desk.set(phase="ended")

    # -- the two loops: one step, prepare, submit, collect or recover, commit -------------------

    def _full_loop(self) -> Iterator[StepTrace]:
        """At `full` one plan is out at a time: it is prepared and submitted, then its result
        is collected (or the failure recovered) and committed."""
        engine = self.engine
        while not engine.done:
            if engine.is_idle():
                trace = self._idle_step()
            else:
                self._end_idle()
                with self.phase("prepare", engine.next_step):
                    step = engine.dispatch(self._prepare())
                trace = self._collect_and_commit(step, engine.dispatch)
                self.recorder.committed(engine, trace, self.group.epoch)
            yield trace
            self._between_steps(trace)

    def _overlap_loop(self) -> Iterator[StepTrace]:
        """At `overlap` step k+1's plan goes out before step k's result is read: k is sent
        (unless it went out ahead of k-1), k+1 is planned from k's assumptions and sent, then k
        is collected (or recovered) and committed, and k+1 becomes the step in flight."""
        engine = self.engine
        while not engine.done:
            if engine.is_idle():
                trace = self._idle_step()
            else:
                self._end_idle()
                step = engine.in_flight
                if step is None:
                    with self.phase("prepare", engine.next_step):
                        step = engine.send_in_flight(self._prepare())
                if engine.can_plan_ahead():
                    with self.phase("prepare", engine.next_step):
                        engine.send_ahead(self._prepare())
                trace = self._collect_and_commit(step, engine.send_in_flight)
                self.recorder.committed(engine, trace, self.group.epoch)
            yield trace
            self._between_steps(trace)

    def _prepare(self) -> PreparedStep:
        """The engine's phases 1 to 6; what a recompute found by the audit preempted between
        steps is shown with this step."""
        prepared = self.engine.prepare()
        if self._preempted_between_steps:
            prepared = prepared._replace(preempted=self._preempted_between_steps + prepared.preempted)
            self._preempted_between_steps = []
        return prepared

    def _collect_and_commit(self, step: PreparedStep, send_again) -> StepTrace:
        """Collect `step`'s result and commit it. A failure goes to the policy, with the plans
        out (at `overlap` the step ahead's is one), and the step is collected again: the same
        plans sent again in a new epoch, or the step planned again and sent by `send_again`."""
        while True:
            try:
                with self.phase("execute", step.step):
                    result = self.group.collect(step.flight)
                with self.phase("commit", step.step):
                    return self.engine.commit(step, result)
            except RECOVERABLE as err:
                err.step = step.step
                if err.epoch is None:
                    err.epoch = self.group.epoch
                with self.phase("recover", step.step):
                    step = self._recover_sent(err, step, send_again)

    def _between_steps(self, trace: StepTrace) -> None:
        """The shard audited every `audit_every` steps that crossed the boundary (not the last:
        the run's end audits it), then the engine's own check that the run progresses."""
        if (self._idle_from is None and self.audit_every and not self.engine.done
                and (trace.step + 1) % self.audit_every == 0):
            self._audit(trace.step)
        if self.regrow and self.group.joining and not self.engine.done and self.group.joining_ready():
            self._grow()
        self.engine.check_progress(trace)

    def _grow(self) -> None:
        """--regrow: admit the members started ahead, between two steps (at `overlap` the next
        step's plan, in flight, is sent again in the new epoch); a failure on the way is
        recovered as any other found between steps."""
        engine = self.engine
        in_flight = engine.in_flight
        step = in_flight.step if in_flight is not None else engine.next_step
        try:
            self._admit_joining("regrow", step)
            if in_flight is not None:
                self.group.resend(in_flight.flight)
        except RECOVERABLE as err:
            err.step = step
            if err.epoch is None:
                err.epoch = self.group.epoch
            if in_flight is None:
                self._recover(err, None)
            else:
                self._recover_sent(err, in_flight, engine.send_in_flight, in_audit=True)

    def _admit_joining(self, why: str, step: int) -> None:
        """The world grows back to its requested size in a new epoch: the members started ahead
        admitted after the kept ones, every rank holding the pool; what the steps waited for it
        measured."""
        failed_epoch = self.group.epoch
        started = time.monotonic()
        with self.phase("recover", step):
            resize = self.group.resize(range(self.group.world_size), self.engine.pool.slots.snapshot(),
                                       step, why, add=len(self.group.joining))
        added = resize.added
        self._keep(Recovery(step, failed_epoch, "grow", None, "", why, added,
                            tuple(self.group.channel.members[r].pid for r in added), resize.shard_pages,
                            in_audit=True, resize=resize, waited=time.monotonic() - started))

    def _idle_step(self) -> StepTrace:
        """No plan crosses: the scheduler answers an empty one itself (one record per stretch
        of such steps). Meanwhile the ranks are watched: a loss while the run waits for
        arrivals is seen at once (the pidfd of a worker we started, a connection closing) and
        recovered, or paused, before the next step is planned. Under pause an idle step takes
        the model's time of a step (--exec-cost's per-step part), up to IDLE_WAIT_S a stretch,
        watching: the run waits for arrivals as a serving engine does."""
        if self._idle_from is None:
            self._idle_from = self.engine.step_id
            if self.idle_s:
                self._idle_until = time.monotonic() + IDLE_WAIT_S
                self.recorder.waiting()
        trace = self.engine.idle_step()
        if self.idle_s or time.monotonic() >= self._next_look:
            self._watch_idle(trace.step)
        return trace

    def _watch_idle(self, step: int) -> None:
        """The members watched through an idle step: for its model time, or with none (or the
        stretch's wait spent), a look every LOOK_EVERY_S (a million idle steps cost a clock read
        each, not a poll each)."""
        now = time.monotonic()
        wait = self.idle_s if now < self._idle_until else 0.0
        if not wait:
            if now < self._next_look:
                return
            self._next_look = now + LOOK_EVERY_S
        while True:
            try:
                return self.group.watch(wait, step)
            except RECOVERABLE as err:
                self._end_idle()
                if err.epoch is None:
                    err.epoch = self.group.epoch
                with self.phase("recover", step):
                    self._recover(err, None)

    def _end_idle(self) -> None:
        if self._idle_from is not None:
            self.recorder.idle(self._idle_from, self.engine.step_id - 1)
        self._idle_from = None

    def phase(self, name: str, step: int):
        """A stretch of the scheduler's work, for the recorder (planning and committing also
        timed here)."""
        if name in BUSY_PHASES:
            return self._busy(name, step)
        return self.recorder.phase(name, step)

    @contextmanager
    def _busy(self, name: str, step: int):
        """The scheduler's own work (planning, committing), timed: the share of it that ran while
        a plan was in flight (overlap scheduling's gain: work the ranks' time hides)."""
        ahead = bool(self.group.channel.in_flight)
        start = time.monotonic()
        try:
            with self.recorder.phase(name, step):
                yield
        finally:
            took = time.monotonic() - start
            self.scheduler_s += took
            if ahead:
                self.hidden_s += took

    def _audit(self, step: int) -> None:
        """Every rank's shard against the pool; a divergent rank is recovered like a lost one."""
        while True:
            try:
                return self.group.audit(self.engine.pool.slots, step)
            except RECOVERABLE as err:
                in_flight = self.engine.in_flight
                if in_flight is None:
                    self._recover(err, None)
                else:                          # overlap: the next step's plan is in flight
                    self._recover_sent(err, in_flight, self.engine.send_in_flight, in_audit=True)

    # -- recovery: the budget, then the policy ----------------------------------------------

    def _recover_sent(self, err: EngineError, current: PreparedStep, send_again, in_audit: bool = False
                      ) -> PreparedStep:
        """Recover with `current`'s plan sent (and at `overlap` maybe the step ahead's too);
        returns the step to collect next, its plan sent. `in_audit`: the failure was found by
        the audit after the step before `current`."""
        again = self._recover(err, current, in_audit)
        ahead = self.engine.ahead
        if again is current:                   # restore: the same plans, in order, new epoch
            self.group.resend(current.flight)
            if ahead is not None:
                self.group.resend(ahead.flight)
            return current
        return send_again(again)               # recompute: planned again, nothing ahead of it

    def _recover(self, err: EngineError, prepared, in_audit: bool = False):
        """Restart what failed, as the policy says. The budget counts recoveries: one recovery
        may try again when a replacement we started dies on the way up (within the same budget
        of tries), but a window that passes without a replacement joining ends the run, naming
        the first loss."""
        if self.policy == "abort":
            raise err
        if self.policy == "pause":
            return self._pause(err, prepared, in_audit)
        if self.num_restarts >= self.max_restarts:
            err.message += (f" (gave up after {self.num_restarts} restarts, "
                            f"--max-restarts {self.max_restarts})")
            raise err
        self.num_restarts += 1
        first, tries = err, 0
        while True:
            tries += 1
            try:
                return self._restart_after(err, prepared, in_audit)
            except RankLost as again:           # the replacement did not come up
                if again is err:                # nothing to replace it with: the run ends
                    raise
                if again.step is None:
                    again.step = first.step
                if tries >= max(1, self.max_restarts) or (again.reason == "timeout" and self.group.external):
                    again.message += (f"; replacing after the first loss, {first.kind} at step "
                                      f"{first.step}, epoch {first.epoch}: {first.message}")
                    raise again from None
                err = again

    def _restart_after(self, err: EngineError, prepared, in_audit: bool = False, policy: str | None = None):
        """Replace the ranks `err` blames (every rank, when none can be blamed) by the policy
        (or by `policy`, an operator's instruction); returns the step to send again."""
        policy = policy or self.policy
        blamed = isinstance(err, (RankLost, ShardDivergence)) and err.rank is not None
        if blamed:
            # every rank found dead by now goes too (a fault on all ranks is one recovery, not N),
            # and every rank left without a member by a restart that failed half-way
            ranks = sorted({*err.ranks} | self.group.dead_ranks() | self.group.without_member())
        else:
            ranks = list(range(self.group.world_size))
        in_audit = in_audit or prepared is None
        step = err.step if in_audit else prepared.step
        failed_epoch = self.group.epoch
        started = time.monotonic()
        if policy == "shrink" and blamed:
            resize = self._shrink(err, ranks, step, "shrink" if policy == self.policy else "scale-down")
            self._keep(Recovery(step, failed_epoch, err.kind, err.rank, err.message, "shrink", (), (),
                                resize.shard_pages, in_audit=in_audit, resize=resize,
                                waited=time.monotonic() - started,
                                wavefront=tuple(getattr(err, "wavefront", ()))))
            return prepared
        restart = self._recompute if policy == "recompute" else self._restore
        prepared, ranks, pids, pages, preempted = restart(ranks, step, prepared)
        self._keep(Recovery(step, failed_epoch, err.kind, err.rank, err.message,
                            "restore" if restart == self._restore else policy,
                            tuple(ranks), tuple(pids), pages, tuple(preempted), in_audit=in_audit,
                            hosts=self.group.hosts_of(ranks), waited=time.monotonic() - started,
                            wavefront=tuple(getattr(err, "wavefront", ()))))
        return prepared

    # -- pause: an operator decides (mechanism 14) ------------------------------------------

    def _pause(self, err: EngineError, prepared, in_audit: bool = False):
        """pause: commit nothing more, say the status at the desk, and wait for an instruction
        (until --pause-timeout, then its default): retry restores, scale-down shrinks, scale-up
        restores and grows back to the size asked for, abort ends the run with the failure. An
        instruction that cannot be carried out now is refused and the run stays paused; one
        that fails on the way (a rank lost meanwhile) pauses again, on that loss."""
        desk, group = self.desk, self.group
        deadline = time.monotonic() + desk.pause_timeout
        while True:
            status = self._paused_status(err, prepared, in_audit)
            desk.set(**status)
            self.recorder.paused(status)
            got = desk.wait(deadline)
            if got is None:
                ident, instruction, source = f"pause-timeout-{status['epoch']}", desk.default, "timeout"
            else:
                (ident, instruction), source = got, "operator"
            if instruction not in status["can"]:
                why = (f"{instruction} cannot be carried out now: "
                       + ("the restarts are spent" if self.num_restarts >= self.max_restarts
                          else {"scale-down": f"it would leave fewer than --min-world-size "
                                              f"{self.min_world_size} ranks, or no rank is to blame",
                                "scale-up": f"the world is at the size asked for ({self.requested})"}
                          .get(instruction, "not now")))
                self._answer(ident, instruction, status, source, 409, {"error": why}, keep=False)
                if source != "timeout":
                    continue
                instruction = "abort"         # the default cannot be done: the run ends
            aborting = instruction == "abort"
            self.recorder.instruction(ident, instruction, status["epoch"], source, 200 if aborting else 202,
                                      {"result": "aborted" if aborting else "accepted"})
            if instruction == "abort":
                said = ("the operator said abort" if source == "operator" else
                        f"no instruction within --pause-timeout {desk.pause_timeout:g} s: {desk.default}, "
                        f"the default" + ("" if desk.default == "abort" else ", could not be carried out"))
                self._answer(ident, "abort", status, source, 200, {"result": "aborted"}, logged=True)
                desk.set(phase="failed")
                err.message += f" (paused; {said})"
                raise err
            self.num_restarts += 1
            try:
                if instruction == "scale-down":
                    again = self._restart_after(err, prepared, in_audit, "shrink")
                else:
                    again = self._restart_after(err, prepared, in_audit, "restore")
                    if instruction == "scale-up":
                        self._grow_back(again)
            except RECOVERABLE as new:
                if new.step is None:
                    new.step = err.step
                if new.epoch is None:
                    new.epoch = group.epoch
                self._answer(ident, instruction, status, source, 200,
                             {"result": "failed", "message": new.message, "epoch": group.epoch}, logged=True)
                err = new                      # paused again, on this loss, for a timeout of its own
                deadline = time.monotonic() + desk.pause_timeout
                continue
            self._answer(ident, instruction, status, source, 200,
                         {"result": "applied", "epoch": group.epoch, "world_size": group.world_size},
                         logged=True)
            desk.set(phase="running", epoch=group.epoch, world_size=self._sizes(), lost=[], survivors=[])
            return again

    def _paused_status(self, err: EngineError, prepared, in_audit: bool) -> dict:
        group = self.group
        blamed = isinstance(err, (RankLost, ShardDivergence)) and err.rank is not None
        lost = sorted((set(err.ranks) if blamed else set()) | group.dead_ranks() | group.without_member())
        survivors = [r for r in range(group.world_size) if r not in lost]
        can = ["abort"]
        if self.num_restarts < self.max_restarts:
            can.insert(0, "retry")
            if blamed and survivors and len(survivors) >= self.min_world_size:
                can.insert(1, "scale-down")
            if not group.external and (group.world_size < self.requested):
                can.insert(-1, "scale-up")
        reason = getattr(err, "reason", None) or err.kind
        step = err.step if in_audit or prepared is None else prepared.step
        return {"phase": "paused", "epoch": group.epoch, "step": step, "kind": err.kind,
                "message": err.message, "lost": [{"rank": r, "reason": reason} for r in lost],
                "survivors": survivors, "world_size": self._sizes(), "can": can,
                "retryable": "retry" in can, "timeout_s": self.desk.pause_timeout,
                "default": self.desk.default}

    def _sizes(self) -> dict:
        return {"requested": self.requested, "effective": self.group.world_size}

    def _answer(self, ident: str, instruction: str, status: dict, source: str, code: int, body: dict,
                keep: bool = True, logged: bool = False) -> None:
        """The operator's answer; a refusal is logged here (an instruction carried out was logged,
        accepted, before it was)."""
        if not logged:
            self.recorder.instruction(ident, instruction, status["epoch"], source, code, body)
        if source == "operator":
            self.desk.answer(ident, code, body, keep)

    def _grow_back(self, prepared) -> None:
        """scale-up: members started now for every rank the world lacks, admitted as soon as
        they have said HELLO (the steps wait: the run is paused; a failure is the pause's)."""
        group = self.group
        step = prepared.step if prepared is not None else self.engine.next_step
        group.start_joining(self.requested)
        until = time.monotonic() + group.options.start_timeout
        while not group.joining_ready(until=min(until, time.monotonic() + 0.05)):
            if time.monotonic() >= until:
                raise group.channel.lost(group.joining[0], step, "timeout",
                                         f"did not join within {group.options.start_timeout:g} s")
        self._admit_joining("scale-up", step)

    def _keep(self, recovery: Recovery) -> None:
        if len(self.recoveries) == self.recoveries.maxlen:
            self.recoveries_unshown += 1           # a budget: many restarts in one step keep the last
        self.recoveries.append(recovery)
        self.recorder.recovered(recovery)

    def _shrink(self, err: EngineError, ranks, step: int, why: str = "shrink") -> Resize:
        """shrink: the group goes on without the lost ranks, in a new epoch: the survivors are
        renumbered in order and every one holds the pool again (the pages placed over the world
        that remains); the same plan is sent again. Below --min-world-size the run ends. With
        --regrow, replacements start in the background and join when they are ready."""
        survivors = [r for r in range(self.group.world_size) if r not in ranks]
        if len(survivors) < self.min_world_size:
            err.message += (f"; shrinking would leave {len(survivors)} rank"
                            f"{'' if len(survivors) == 1 else 's'}, below --min-world-size "
                            f"{self.min_world_size}")
            raise err
        resize = self.group.resize(survivors, self.engine.pool.slots.snapshot(), step, why)
        if self.regrow:
            self.group.start_joining(self.requested)
        return resize

    def _restore(self, ranks, step: int, prepared):
        """restore: new members whose shards are the control plane's pool; the same plan again."""
        shard = self.engine.pool.slots.snapshot()
        ranks, pids = self.group.restart(ranks, shard, step, "restore")
        return prepared, ranks, pids, len(shard), []

    def _recompute(self, ranks, step: int, prepared):
        """recompute: new members come back empty, as GPU ranks would; every page is lost, and
        the step is planned again (found by the audit between steps: preempted, shown with the
        next step)."""
        ranks, pids = self.group.restart(ranks, [], step, "recompute")
        if prepared is None:
            preempted = self.engine.drop_all_pages()
            self._preempted_between_steps += preempted
            return None, ranks, pids, 0, preempted
        before = set(prepared.preempted)
        prepared = self.engine.replan_without_pages(prepared)
        return prepared, ranks, pids, 0, [r for r in prepared.preempted if r not in before]
