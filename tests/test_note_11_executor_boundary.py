"""Note 11, the executor boundary (docs/mechanisms/11-executor-boundary.md): its invariants
executor-boundary/1 to /4, pinned on real plans and results, and on every way to falsify one."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import BoundaryViolation, Engine, EngineError, LocalGroup, expand_placements
from inferris_dist.engine.boundary import validate

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    GOLDEN_NAMES,
    PROPERTY,
    Step,
    as_workload,
    bounded,
    plan_steps,
    prefix_workloads,
)

pytestmark = pytest.mark.timeout(60)


def check_plan_mirrors_state(s: Step) -> None:
    ps = s.eng.config.page_size
    items = s.prepared.plan.items
    assert s.prepared.plan.step == s.step
    assert [i.request_id for i in items] == [r for r in s.prepared.scheduled
                                            if r not in s.prepared.preempted]
    assert [i.request_id for i in items] == [req.request_id for req, _, _ in s.prepared.work]
    for item in items:
        rid = item.request_id
        table = s.mid.tables[rid]
        assert item.start_position == s.mid.computed[rid]
        assert item.draft_len == s.mid.drafts[rid]
        assert item.verdict_index == s.mid.verdicts[rid]
        start, n = item.start_position, item.num_tokens
        assert list(item.placements) == table[start // ps:(start + n - 1) // ps + 1]
        assert expand_placements(start, n, item.placements, ps) == [
            (p, table[p // ps], p % ps) for p in range(start, start + n)]


def mutations(plan, result, num_pages):
    """Results that differ from the honest one in one way each; every one must be refused."""
    outs = list(result.outcomes)
    yield "step", result._replace(step=result.step + 1)
    yield "drop", result._replace(outcomes=tuple(outs[:-1]))
    yield "extra", result._replace(outcomes=tuple(outs + [outs[-1]]))
    if len(outs) > 1:
        yield "swap", result._replace(outcomes=tuple([outs[1], outs[0]] + outs[2:]))
    for i, (item, out) in enumerate(zip(plan.items, outs)):
        def one(**kw):
            changed = list(outs)
            changed[i] = out._replace(**kw)
            return result._replace(outcomes=tuple(changed))
        yield f"{i}.id", one(request_id=out.request_id + "x")
        yield f"{i}.start+", one(start_position=out.start_position + 1)
        yield f"{i}.start-", one(start_position=out.start_position - 1)
        yield f"{i}.n+", one(executed_tokens=out.executed_tokens + 1)
        yield f"{i}.n-", one(executed_tokens=out.executed_tokens - 1)
        yield f"{i}.acc-", one(accepted=-1)
        yield f"{i}.acc-high", one(accepted=item.num_tokens if item.decode else 1)
        yield f"{i}.writes-short", one(writes=out.writes[:-1])
        yield f"{i}.writes-long", one(writes=out.writes + ((out.writes[-1] + 1) % num_pages,))
        yield f"{i}.writes-moved", one(writes=((out.writes[0] + 1) % num_pages,) + out.writes[1:])
        if len(out.writes) > 1:
            yield f"{i}.writes-reversed", one(writes=out.writes[::-1])


@pytest.mark.invariant("executor-boundary/1")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_plan_is_read_off_the_control_plane(name):
    for s in plan_steps(golden_workload(name)):
        check_plan_mirrors_state(s)


@pytest.mark.invariant("executor-boundary/1")
@PROPERTY
@given(wl=prefix_workloads())
def test_plan_is_read_off_the_control_plane_generated(wl):
    for s in plan_steps(wl):
        check_plan_mirrors_state(s)


@pytest.mark.invariant("executor-boundary/2")
@pytest.mark.invariant("executor-boundary/3")
@pytest.mark.parametrize("name", ["speculative", "demo", "preemption", "cache_eviction",
                                  "recompute_window", "spec_budget_cut", "random_009"])
def test_every_mismatch_is_refused_and_commits_nothing(name):
    eng = Engine(golden_workload(name))
    num_pages = eng.config.num_pages
    refused = 0
    while not eng.done:
        if eng.is_idle():
            eng.idle_step()
            continue
        prepared = eng.prepare()
        planned = eng.snapshot()
        honest = eng.executor.execute(prepared.plan)
        assert eng.snapshot() == planned                   # executing touched no control state
        for what, bad in mutations(prepared.plan, honest, num_pages):
            with pytest.raises(BoundaryViolation):
                eng.commit(prepared, bad)
            assert eng.snapshot() == planned, f"{what} at step {prepared.step} committed something"
            refused += 1
        # any in-range verdict is a legal answer: it passes validation
        for item, out in zip(prepared.plan.items, honest.outcomes):
            for acc in range(item.num_tokens if item.decode else 1):
                outs = [o if o is not out else out._replace(accepted=acc) for o in honest.outcomes]
                validate(prepared.plan, honest._replace(outcomes=tuple(outs)))
        eng.commit(prepared, honest)
    assert refused > 0


@pytest.mark.invariant("executor-boundary/2")
@PROPERTY
@given(data=st.data())
def test_random_accepted_values_pass_exactly_in_range(data):
    eng = Engine(golden_workload("speculative"))
    eng.step()
    prepared = eng.prepare()                               # step 1: two decode items
    honest = eng.executor.execute(prepared.plan)
    i = data.draw(st.integers(0, len(honest.outcomes) - 1))
    acc = data.draw(st.integers(-3, 8))
    item = prepared.plan.items[i]
    outs = list(honest.outcomes)
    outs[i] = outs[i]._replace(accepted=acc)
    ok = 0 <= acc <= (item.num_tokens - 1 if item.decode else 0)
    if ok:
        validate(prepared.plan, honest._replace(outcomes=tuple(outs)))
    else:
        with pytest.raises(BoundaryViolation):
            validate(prepared.plan, honest._replace(outcomes=tuple(outs)))


class Recording:
    """A real LocalGroup; every plan it is handed is kept."""

    def __init__(self, workload):
        self.inner = LocalGroup(as_workload(workload))
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return self.inner.execute(plan)


@pytest.mark.invariant("executor-boundary/4")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_one_plan_per_step_that_runs_anything(name):
    wl = golden_workload(name)
    rec = Recording(wl)
    eng = Engine(wl, rec)
    traces = []
    try:
        for t in bounded(eng.run()):
            traces.append(t)
    except EngineError:
        pass
    committed = [t for t in traces if t.executed]
    assert all(not t.scheduled and not t.admitted for t in traces if not t.executed)
    plans = rec.plans[:len(committed)]
    assert [p.step for p in plans] == [t.step for t in committed]
    for p, t in zip(plans, committed):
        assert [i.request_id for i in p.items] == list(t.executed)
        assert [i.num_tokens for i in p.items] == list(t.executed.values())
    # a failed step (Irreducible fails before its plan) never adds a plan for an idle step
    assert len(rec.plans) in (len(committed), len(committed) + 1)
    assert len({p.step for p in rec.plans}) == len(rec.plans)
