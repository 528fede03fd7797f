"""The step loop (SPEC §3): the thirteen phases in order, around the executor seam.

`prepare` runs phases 1 to 6 and returns the plan; the executor runs phase 7
and its group joins (phase 8); `commit` runs phases 9 to 13. Between the plan
and the commit nothing of the control plane changes, so a step whose
execution fails leaves requests, pool and cache as they were when the plan
went out.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

from . import caching, overlap, speculation
from .boundary import build_plan, validate
from .errors import EngineError, NeverFits
from .group import LocalGroup
from .messages import ExecutionPlan, ExecutionResult
from .pool import PagePool
from .prefix import KeyTable, RadixCache
from .request import FinishReason, Request, SampleResult, State
from .residency import AHEAD_RELIEFS, Holders, make_resident, preempt, release_pages
from .rungs import Rung
from .rungs import rung as rung_named
from .scheduler import Scheduler
from .trace import StepTrace
from .workload import Workload, load_workload

_NONE: dict = {}          # no pages reserved (never written)
# the trace's words for what phases 12 and 13 decide
_TOKEN, _EOS = SampleResult.TOKEN.value, SampleResult.EOS.value
_BY_EOS, _BY_LENGTH = FinishReason.EOS.value, FinishReason.LENGTH.value


class PreparedStep(NamedTuple):
    """A step up to its plan: what phases 1 to 6 did, waiting for the executor."""
    step: int
    plan: ExecutionPlan
    work: list                 # [(request, num_tokens, decode)], the plan's items in order
    admitted: list[str]
    scheduled: list[str]
    preempted: list[str]
    reused: dict[str, int]
    evicted: list[int]
    voided: set[str]           # overlap: requests whose item is discarded (planned from a state
                               # that never existed)
    shifts: dict[str, int]     # overlap: drafts rejected of each request's item the step before
    flight: object = None      # what the executor's `submit` returned for the plan: handed to `collect`


class Engine:
    """The control plane. Give it a workload and an executor (default: LocalGroup)."""

    def __init__(self, workload: Workload | dict | str, executor=None, rung: str | Rung = "full"):
        if not isinstance(workload, Workload):
            workload = load_workload(workload)
        self.workload = workload
        self.config = cfg = workload.config
        # The mechanisms switched on, asked once (SPEC §6): each phase below runs the rule
        # it was handed here and never asks which rung it is on.
        self.rung = the_rung = rung_named(rung)
        self.fields = the_rung.fields
        self._spec_len = cfg.spec_len if the_rung.speculation else 0
        self._relief = the_rung.reliefs
        self.requests = [Request(i, spec) for i, spec in enumerate(workload.requests)]
        self.by_id = {r.request_id: r for r in self.requests}
        self.executor = executor if executor is not None else LocalGroup(workload)
        self.pool = PagePool(cfg.num_pages, cfg.page_size)
        self.cache = RadixCache()
        self.pool.on_unreferenced = self.cache.note_unreferenced
        self.keys = KeyTable()
        self.step_id = 0               # the next step to commit
        self.next_step = 0             # the next step to plan (step_id + 1 while one is ahead)
        self.num_unfinished = len(self.requests)
        self.scheduler = Scheduler(self.requests)
        self._schedule = {"none": self.scheduler.schedule_all, "whole": self.scheduler.schedule_whole,
                          "chunked": self.scheduler.schedule}[the_rung.budget]
        self._phase2 = self._reuse if the_rung.reuse else dict
        self._phase5 = self._make_resident if the_rung.paged else _no_pages
        self._phase11 = caching.publish if the_rung.publish else _publish_nothing
        self._reuse_queue = caching.ReuseQueue()
        self._holders = Holders()
        # Overlap scheduling (engine/overlap.py): the step in flight, whose tokens the next
        # plan assumes, and the step planned ahead of it (sent, not yet assumed).
        self._overlap = the_rung.overlap
        self._commit_as = self._commit_overlapped if the_rung.overlap else self._commit_planned
        self._in_flight: PreparedStep | None = None
        self._ahead: PreparedStep | None = None
        self._taken_as_finished = 0    # requests the step in flight is assumed to finish

    @property
    def done(self) -> bool:
        """Every request finished and no plan in flight (overlap: the step planned ahead of
        the last EOS still executes, its work discarded)."""
        return self.num_unfinished == 0 and self._in_flight is None

    def run(self) -> Iterator[StepTrace]:
        while not self.done:
            trace = self.idle_step() if self.is_idle() else self.step()
            yield trace
            self.check_progress(trace)

    def check_progress(self, trace: StepTrace) -> None:
        """Rungs whose budget is all-or-nothing: a step that took nothing while requests
        run will be followed by the same step forever (nothing changes): NeverFits."""
        if self.rung.never_fits and not trace.scheduled and self.scheduler.running:
            ids = [r.request_id for r in self.scheduler.running]
            raise NeverFits(f"never fits the budget: {ids}", trace.step)

    def trace_json(self, trace: StepTrace) -> dict:
        """The SPEC §4 object of a step at this engine's rung (only the fields it has)."""
        return trace.to_json(self.fields)

    def json_line(self, trace: StepTrace) -> str:
        return trace.json_line(self.fields)

    def is_idle(self) -> bool:
        """Nothing runs and nothing arrives this step: every phase would do nothing (no
        RUNNING request means no reuse, no work, no residency, nothing to publish or sample),
        so the step is its empty trace, without a plan crossing the boundary. A long wait
        for arrivals then costs a trace per step, not a step's work."""
        return (not self.scheduler.running and self.scheduler.next_arrival() > self.step_id
                and self._in_flight is None)

    def idle_step(self) -> StepTrace:
        trace = StepTrace.idle(self.step_id)
        self.step_id += 1
        self.next_step = self.step_id
        return trace

    def step(self) -> StepTrace:
        if self._overlap:
            return self.overlapped_step()
        prepared = self.prepare()
        with _failing_at(prepared.step):
            result = self.executor.execute(prepared.plan)
        return self.commit(prepared, result)

    # -- overlap scheduling (mechanism 13) -------------------------------------------

    def overlapped_step(self) -> StepTrace:
        """Commit one step, with the next one planned and sent before this one's result is
        read: send k (unless it went out ahead of k-1), send k+1 planned from k's assumptions,
        then collect and commit k, whose commit lets k+1's plan assume k's tokens."""
        current = self._in_flight
        if current is None:
            current = self.send_in_flight(self.prepare())
        if self.can_plan_ahead():
            self.send_ahead(self.prepare())
        with _failing_at(current.step):
            result = self.executor.collect(current.flight)
        return self.commit(current, result)

    @property
    def in_flight(self) -> PreparedStep | None:
        """Overlap: the step sent whose tokens the next plan assumes (None: no plan is out)."""
        return self._in_flight

    @property
    def ahead(self) -> PreparedStep | None:
        """Overlap: the step planned and sent ahead of the step in flight, if one was."""
        return self._ahead

    def dispatch(self, prepared: PreparedStep) -> PreparedStep:
        """The plan goes to the executor; the step holds what `submit` returned, its flight."""
        return prepared._replace(flight=self.executor.submit(prepared.plan))

    def send(self, prepared: PreparedStep) -> PreparedStep:
        """Dispatched, planned ahead: until the plan lands, no page it writes is reused."""
        prepared = self.dispatch(prepared)
        self.pool.plan_in_flight(prepared.step, (item.placements for item in prepared.plan.items))
        return prepared

    def send_in_flight(self, prepared: PreparedStep) -> PreparedStep:
        """Sent as the step in flight: the next plan assumes its tokens."""
        prepared = self.send(prepared)
        self._assume(prepared)
        return prepared

    def _assume(self, prepared: PreparedStep) -> None:
        self._taken_as_finished = overlap.assume(prepared.work, prepared.voided)
        self._in_flight = prepared

    def send_ahead(self, prepared: PreparedStep) -> None:
        """Sent ahead of the step in flight, planned from its assumptions; its commit makes this
        the step in flight."""
        self._ahead = self.send(prepared)

    def can_plan_ahead(self) -> bool:
        """The step in flight has work to overlap with (an empty one commits first: planning
        ahead of it gains nothing), and some request can be scheduled next step: a RUNNING one
        not taken as finished by the step in flight, or one arriving. Otherwise the next step
        waits for this one's result (the engine never plans a step it cannot fill)."""
        return bool(self._in_flight.plan.items) and (
            len(self.scheduler.running) > self._taken_as_finished
            or self.scheduler.next_arrival() <= self.next_step)

    def _withdraw_in_flight(self, prepared: PreparedStep) -> None:
        """Overlap, before `prepared`'s step is planned again from nothing: its assumptions go
        (every request as committed), the step planned ahead of it is withdrawn (what it
        admitted waits again; a step planned ahead preempts no one, and the pages it gave out go
        with every other page), and no plan is in flight any more. At any other rung nothing
        was assumed, sent ahead or held back, and nothing changes."""
        for req, _, _ in prepared.work:
            if req.assumed is not None:
                overlap.settle(req)
        ahead, self._ahead, self._in_flight = self._ahead, None, None
        self._taken_as_finished = 0
        self.pool.plans_withdrawn()
        self.next_step = prepared.step + 1
        if ahead is None:
            return
        admitted = [self.by_id[rid] for rid in ahead.admitted]
        for req in admitted:
            preempt(req, self.pool)            # pages it was given (a reuse, its first chunk) go back
        self.scheduler.unadmit(admitted)

    # -- phases 1 to 6 ---------------------------------------------------------------

    def prepare(self) -> PreparedStep:
        step = self.next_step
        self.next_step = step + 1
        admitted = self._admit(step)
        return self._plan(step, [r.request_id for r in admitted])

    def _plan(self, step: int, admitted: list[str]) -> PreparedStep:
        """Phases 2 to 6 (admission is done)."""
        try:
            reused = self._phase2()
            work = self._schedule(self.config.max_step_tokens, self._spec_len)
            scheduled = [req.request_id for req, _, _ in work]
            evicted: list[int] = []
            preempted: list[Request] = []
            if work:
                self._phase5(work, evicted, preempted)
        except EngineError as e:
            e.step = step
            raise
        for req in preempted:
            self._reuse_queue.add(req)
        priors = None
        if self._in_flight is not None:           # overlap: planned ahead, from assumed drafts
            priors = {req.request_id: req.assumed.drafts for req, _, _ in work
                      if req.assumed is not None and req.assumed.drafts}
        plan = build_plan(step, work, self.config.page_size, priors)
        return PreparedStep(step, plan, work, admitted, scheduled,
                            [r.request_id for r in preempted], reused, evicted, set(), {})

    def replan_without_pages(self, prepared: PreparedStep) -> PreparedStep:
        """Every page is lost (the executor came back empty): plan the step again from nothing.

        Whatever was assumed of plans in flight goes first (overlap); every
        RUNNING request holding pages is preempted, the cache is emptied, and
        phases 2 to 6 run again for the same step. The step's trace shows these
        preemptions; what each request generates is unchanged. The step comes
        back unsent.
        """
        self._withdraw_in_flight(prepared)
        lost = self.drop_all_pages()
        again = self._plan(prepared.step, prepared.admitted)
        return again._replace(preempted=prepared.preempted + lost + again.preempted,
                              evicted=prepared.evicted + again.evicted)

    def _make_resident(self, work, evicted: list[int], preempted: list[Request]) -> None:
        reliefs = self._relief if self._in_flight is None else AHEAD_RELIEFS
        make_resident(work, self.pool, self.cache, self._holders, evicted, preempted, reliefs)

    def _admit(self, step: int) -> list[Request]:
        arrived = self.scheduler.admit(step)
        for req in arrived:
            self._reuse_queue.add(req)
        return arrived

    def _reuse(self) -> dict[str, int]:
        """Phase 2, for every RUNNING request with nothing computed and no pages."""
        reused = {}
        page_size = self.config.page_size
        for req in self._reuse_queue.take(self.cache.take_new_root_keys()):
            if req.state is not State.RUNNING or req.page_table or req.computed:
                continue                      # placed since it began to wait
            computed = caching.reuse(req, self.cache, self.pool, self.keys)
            if computed:
                reused[req.request_id] = computed
                self._holders.add(req)
            elif req.prompt > page_size:
                self._reuse_queue.wait(req, caching.prefix_keys(req, self.keys, page_size)[0])
        return reused

    def drop_all_pages(self) -> list[str]:
        """Preempt every RUNNING request that holds pages and empty the cache; the preempted ids."""
        lost = []
        for req in self.scheduler.running:
            if req.page_table:
                preempt(req, self.pool)
                self._reuse_queue.add(req)
                lost.append(req.request_id)
        for page in self.cache.clear():
            self.pool.free(page)
        return lost

    # -- phases 9 to 13 --------------------------------------------------------------

    def commit(self, prepared: PreparedStep, result: ExecutionResult) -> StepTrace:
        try:
            validate(prepared.plan, result, prepared.shifts, self.config.page_size)
        except EngineError as e:
            e.step = prepared.step
            raise
        return self._commit_as(prepared, result)

    def _commit_planned(self, prepared: PreparedStep, result: ExecutionResult) -> StepTrace:
        """Every rung but `overlap`: phases 9 to 13 on the plan's items."""
        return self._commit(prepared, prepared.work, result.outcomes)

    def _commit_overlapped(self, prepared: PreparedStep, result: ExecutionResult) -> StepTrace:
        """Phases 9 to 13 from the committed state, as at `full`, for the items not discarded;
        then what differs from what the next plan assumed is given back: an item of a request
        that finished by EOS is discarded from the next step, one whose drafts were rejected
        stands, started as much earlier (the ranks know by how much; the next commit checks).
        Last, the step sent ahead (if one was) becomes the step in flight."""
        voided, ahead = prepared.voided, self._ahead
        reserved = {} if ahead is None else {req.request_id: n for req, n, _ in ahead.work
                                             if req.request_id not in ahead.voided}
        work, outcomes, assumed = [], [], []
        for entry, outcome in zip(prepared.work, result.outcomes):
            if entry[0].request_id not in voided:
                work.append(entry)
                outcomes.append(outcome)
                assumed.append(overlap.settle(entry[0]))
        self._taken_as_finished = 0
        trace = self._commit(prepared, work, outcomes, reserved)
        real = {}
        for (req, n, decode), outcome, a in zip(work, outcomes, assumed):
            back = overlap.reconcile(req, a)
            if back:
                real[req.request_id] = back
            if ahead is not None:
                if req.state is State.FINISHED:
                    ahead.voided.add(req.request_id)
                if decode:                  # what the ranks shift its next item by, discarded or not
                    ahead.shifts[req.request_id] = n - 1 - outcome.accepted
        discarded, returned = {}, {}
        for req, n, _ in prepared.work:
            rid = req.request_id
            if rid in voided:
                discarded[rid] = n
            if rid in real:
                returned[rid] = real[rid]
        self.pool.plan_landed(prepared.step, (item.placements for item in prepared.plan.items))
        trace = trace._replace(discarded=discarded, returned=returned)
        self._in_flight = self._ahead = None
        if ahead is not None:
            self._assume(ahead)
        return trace

    def _commit(self, prepared: PreparedStep, work: list, outcomes, reserved: dict[str, int] = _NONE
                ) -> StepTrace:
        """Phases 9 to 13. `reserved` (overlap): tokens of each request's item in the step
        planned ahead, whose pages resolve keeps."""
        pool, cache, keys = self.pool, self.cache, self.keys
        write = pool.slots.write_span
        executed, drafted, accepted, rolled_back = {}, {}, {}, {}
        published, sampled, finished = {}, {}, {}
        # phase 9, apply: the writes land, the frontier moves
        for (req, n, _), outcome in zip(work, outcomes):
            rid = req.request_id
            write(outcome.writes, rid, outcome.start_position, outcome.executed_tokens)
            req.computed += outcome.executed_tokens
            executed[rid] = n
        # phase 10, resolve
        resolve, reserve = speculation.resolve, reserved.get
        for (req, n, decode), outcome in zip(work, outcomes):
            if decode:
                rid = req.request_id
                d, a, r = resolve(req, n, outcome.accepted, pool, reserve(rid, 0))
                drafted[rid], accepted[rid], rolled_back[rid] = d, a, r
        # phase 11, publish
        publish = self._phase11
        for req, _, _ in work:
            num_blocks = publish(req, cache, pool, keys)
            if num_blocks:
                published[req.request_id] = num_blocks
        # phases 12 and 13, sample and update
        for req, _, _ in work:
            if req.computed != req.prompt + req.generated:
                continue
            rid = req.request_id
            if req.eos_after is not None and req.generated >= req.eos_after:
                sampled[rid] = _EOS
                self._finish(req, FinishReason.EOS)
                finished[rid] = _BY_EOS
            else:
                sampled[rid] = _TOKEN
                req.generated += 1
                if req.generated >= req.max_new_tokens:
                    self._finish(req, FinishReason.LENGTH)
                    finished[rid] = _BY_LENGTH
        self.step_id += 1
        return StepTrace(prepared.step, prepared.admitted, prepared.scheduled, executed, sampled,
                         finished, prepared.preempted, prepared.reused, published,
                         prepared.evicted, drafted, accepted, rolled_back)

    def _finish(self, req: Request, reason: FinishReason) -> None:
        req.state = State.FINISHED
        req.finish_reason = reason
        release_pages(req, self.pool)
        self.scheduler.retire(req)
        self.num_unfinished -= 1

    # -- reading the state -----------------------------------------------------------

    def summary(self) -> list[dict]:
        return [r.summary() for r in self.requests]

    def snapshot(self) -> dict:
        """The whole control-plane state as plain data: equal snapshots, equal states."""
        pool = self.pool
        return {
            "step": self.step_id,
            "requests": [(r.request_id, str(r.state), r.generated, r.computed, tuple(r.page_table),
                          r.draft_len, r.num_verdicts) for r in self.requests],
            "owners": [None if o is None else str(o) for o in pool.owner],
            "refs": list(pool.refs),
            "free": pool.free_pages(),
            "slots": pool.slots.snapshot(),
            "cache": [(n.key, n.page, n.path) for n in self.cache.tree_order()],
        }


@contextmanager
def _failing_at(step: int):
    """An executor's failure names the step whose plan it was running (unless it says)."""
    try:
        yield
    except EngineError as e:
        e.step = step if e.step is None else e.step
        raise


def _no_pages(work, evicted, preempted) -> None:
    """Rungs 00 to 02: nothing is paged; a plan's items carry no placements."""


def _publish_nothing(req, cache, pool, keys) -> int:
    """Rungs 00 to 05: no prefix cache."""
    return 0
