"""Note 06, preemption (docs/mechanisms/06-preemption.md): its invariants preemption/1 to /5,
pinned on real runs from rung 05, the rung that adds it."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import Engine, Irreducible, State, pages_needed, trace_dicts, trace_objects

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    PROPERTY,
    bounded,
    drive_all,
    index_of,
    replay_chunked,
    roomy,
    running_after_admission,
    work_ids,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


@st.composite
def pressured(draw) -> dict:
    """A workload whose pool is short of what its requests want at once, yet fits any one of
    them alone: preemption happens often and Irreducible never."""
    w = draw(workloads(max_requests=6))
    ps = w["engine"]["page_size"]
    alone = max(pages_needed(r["prompt_len"] + r["max_new_tokens"], ps) for r in w["requests"])
    w["engine"]["num_pages"] = alone + draw(st.integers(0, 3))
    return w


@pytest.mark.invariant("preemption/1")
@PROPERTY
@given(pressured())
def test_under_pressure_a_run_whose_requests_each_fit_the_pool_always_ends(w):
    eng = Engine(copy.deepcopy(w), rung="05")
    steps, error = drive_all(eng)
    assert error is None, error.to_json()
    assert all(r.state is State.FINISHED for r in eng.requests)
    for s in steps:
        if s.trace.scheduled:
            assert s.trace.scheduled[0] not in s.trace.preempted


@pytest.mark.invariant("preemption/1")
@PROPERTY
@given(workloads())
def test_the_anchor_is_never_preempted_and_only_irreducible_ends_a_run(w):
    eng = Engine(copy.deepcopy(w), rung="05")
    steps, error = drive_all(eng)
    for s in steps:
        if s.trace.scheduled:
            assert s.trace.scheduled[0] not in s.trace.preempted
            assert s.trace.scheduled[0] in s.trace.executed
    if error is None:
        assert all(r.state is State.FINISHED for r in eng.requests)
        return
    assert isinstance(error, Irreducible), error.to_json()
    # the anchor of the failed step alone needs more pages than the pool has
    ps, budget = w["engine"]["page_size"], w["engine"]["max_step_tokens"]
    anchor = next(r for r in eng.requests if r.state is State.RUNNING)
    owed = anchor.prompt + anchor.generated - anchor.computed
    assert pages_needed(anchor.computed + min(owed, budget), ps) > w["engine"]["num_pages"]
    assert anchor.request_id in error.message


@pytest.mark.invariant("preemption/1")
def test_irreducible_is_the_anchor_outgrowing_the_pool():
    lines = trace_dicts(Engine(golden_workload("irreducible"), rung="05"))
    assert (lines[-1]["error"], lines[-1]["step"]) == ("Irreducible", 4)
    assert lines[-2]["executed"] == {"huge": 8} and lines[-2]["preempted"] == []


def check_victims(eng, s, budget):
    """preemption/2 from outside: the candidates are the RUNNING requests other than the anchor
    that hold pages or are in the step's work; the victims are the last of them, last first."""
    t, order = s.trace, index_of(eng)
    work = replay_chunked(running_after_admission(s), budget)
    assert t.scheduled == work_ids(eng, work)
    if not work:
        assert t.preempted == []
        return
    anchor = work[0][0]
    candidates = {i for i, _ in work[1:]} | {x.index for x in running_after_admission(s)
                                             if x.table and x.index != anchor}
    victims = [order[rid] for rid in t.preempted]
    assert victims == sorted(candidates, reverse=True)[:len(victims)], t
    for rid in t.executed:
        assert all(order[rid] < v for v in victims), t


@pytest.mark.invariant("preemption/2")
@PROPERTY
@given(st.one_of(pressured(), workloads()))
def test_victims_go_last_first_in_request_order(w):
    eng = Engine(copy.deepcopy(w), rung="05")
    drive_all(eng, lambda eng, s: check_victims(eng, s, w["engine"]["max_step_tokens"]))


@pytest.mark.invariant("preemption/2")
def test_a_holder_the_budget_did_not_reach_is_a_victim_too():
    # b decodes in its one page. At step 1, a (first in request order) arrives, takes the whole
    # budget and needs both pages; b is not in the work but holds a page: b is the victim.
    w = {"engine": {"max_step_tokens": 3, "page_size": 2, "num_pages": 2},
         "requests": [{"request_id": "a", "prompt_len": 4, "max_new_tokens": 1, "arrival_step": 1},
                      {"request_id": "b", "prompt_len": 1, "max_new_tokens": 2}]}
    eng = Engine(w, rung="05")
    steps, error = drive_all(eng, lambda eng, s: check_victims(eng, s, 3))
    assert error is None
    assert [(s.trace.scheduled, s.trace.preempted) for s in steps] == [
        (["b"], []), (["a"], ["b"]), (["a", "b"], ["b"]), (["b"], [])]


@pytest.mark.invariant("preemption/2")
def test_golden_preemption_victims():
    lines = trace_dicts(Engine(golden_workload("preemption"), rung="05"))
    assert [t["preempted"] for t in lines[:-1]] == [[], ["p2"], ["p2"], ["p2", "p1"], ["p2", "p1"],
                                                    [], [], ["p2"], [], []]


@pytest.mark.invariant("preemption/3")
@PROPERTY
@given(st.one_of(pressured(), workloads()))
def test_a_victim_keeps_running_keeps_generated_and_starts_over(w):
    eng = Engine(copy.deepcopy(w), rung="05")

    def check(eng, s):
        t = s.trace
        assert list(t.executed) == [rid for rid in t.scheduled if rid not in t.preempted]
        for rid in t.preempted:
            r, b = eng.by_id[rid], s.before[rid]
            assert r.state is State.RUNNING and r.finish_reason is None
            assert (r.computed, r.page_table, r.generated) == (0, [], b.generated)
            assert rid not in t.sampled
            assert not any(p == rid for p in eng.pool.owner)
        if s.mid is not None:
            # victims' pages joined the back of the free list in page table order, before any extension
            freed = [p for rid in t.preempted for p in s.before[rid].table]
            taken = [p for rid in t.scheduled if rid not in t.preempted
                     for p in s.mid.tables[rid][len(s.before[rid].table):]]
            assert (s.before.free + freed)[:len(taken)] == taken
            assert s.mid.free == (s.before.free + freed)[len(taken):]

    drive_all(eng, check)


@pytest.mark.invariant("preemption/4")
@PROPERTY
@given(st.one_of(pressured(), workloads()))
def test_preemption_only_when_the_step_is_short(w):
    eng = Engine(copy.deepcopy(w), rung="05")
    ps, budget = w["engine"]["page_size"], w["engine"]["max_step_tokens"]
    steps, _ = drive_all(eng)
    for s in steps:
        short = sum(max(0, pages_needed(s.before[eng.requests[i].request_id].computed + n, ps)
                        - len(s.before[eng.requests[i].request_id].table))
                    for i, n in replay_chunked(running_after_admission(s), budget))
        assert bool(s.trace.preempted) == (short > len(s.before.free)), s.trace


@pytest.mark.invariant("preemption/4")
@PROPERTY
@given(workloads())
def test_with_a_roomy_pool_rung_05_is_rung_04(w):
    w = roomy(w)
    with_preemption = list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="05"))))
    assert all(t["preempted"] == [] for t in with_preemption[:-1])
    without = [{k: v for k, v in t.items() if k != "preempted"} for t in with_preemption]
    assert without == list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="04"))))


@pytest.mark.invariant("preemption/5")
@PROPERTY
@given(st.one_of(pressured(), workloads()))
def test_preemption_changes_when_not_what(w):
    short = list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="05"))))
    if "error" in short[-1]:
        assert short[-1]["error"] == "Irreducible"
        return
    assert short[-1] == list(bounded(trace_objects(Engine(roomy(w), rung="05"))))[-1]


@pytest.mark.invariant("preemption/5")
def test_golden_preemption_run_ends_as_with_a_roomy_pool():
    w = golden_workload("preemption")
    short = trace_dicts(Engine(w, rung="05"))
    assert sum(len(t["preempted"]) for t in short[:-1]) == 7
    big = w.with_config(num_pages=64)
    assert short[-1] == trace_dicts(Engine(big, rung="05"))[-1]
    assert trace_dicts(Engine(copy.deepcopy(w), rung="04"))[-1]["error"] == "OutOfPages"
