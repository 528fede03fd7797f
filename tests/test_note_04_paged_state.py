"""Note 04, paged state (docs/mechanisms/04-paged-state.md): its invariants paged-state/1 to /6,
pinned on real runs from rung 03, the rung that adds it."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given

from inferris_dist.engine import (
    Engine,
    Irreducible,
    NeverFits,
    OutOfPages,
    State,
    expand_placements,
    pages_needed,
    trace_dicts,
    trace_json_lines,
)

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    PROPERTY,
    bounded,
    drive,
    drive_all,
    replay_chunked,
    replay_whole,
    roomy,
    snap,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


PAGED_RUNGS = ("03", "04", "05")


def check_pages(eng, s):
    """paged-state/1 to /3 after a committed step."""
    pool, ps = eng.pool, eng.pool.page_size
    free = pool.free_pages()
    # /1: one owner per page, the free list is exactly the unowned pages
    assert len(free) == len(set(free))
    assert set(free) == {p for p in range(pool.num_pages) if pool.owner[p] is None}
    holders = {}
    for r in eng.requests:
        for p in r.page_table:
            assert p not in holders, f"page {p} in the tables of {holders[p]} and {r.request_id}"
            holders[p] = r.request_id
            assert pool.owner[p] == r.request_id
    assert holders == {p: o for p, o in enumerate(pool.owner) if o is not None}
    for r in eng.requests:
        # /2: a running request's table backs exactly its computed positions
        if r.state is State.RUNNING:
            assert len(r.page_table) == pages_needed(r.computed, ps), r
        else:
            assert r.page_table == []
        # /3: position p sits at page_table[p // page_size], slot p % page_size
        for p in range(r.computed if r.state is State.RUNNING else 0):
            assert pool.slots.slot(r.page_table[p // ps], p % ps) == (r.request_id, p)
    for p in free:
        assert pool.slots.slots(p) == [None] * ps


@pytest.mark.invariant("paged-state/1")
@pytest.mark.invariant("paged-state/2")
@pytest.mark.invariant("paged-state/3")
@PROPERTY
@given(workloads())
def test_pages_after_every_step(w):
    for rung in PAGED_RUNGS:
        drive_all(Engine(copy.deepcopy(w), rung=rung), check_pages)


@pytest.mark.invariant("paged-state/1")
@pytest.mark.invariant("paged-state/2")
@pytest.mark.invariant("paged-state/3")
def test_pages_after_every_step_of_the_golden_preemption_run():
    steps, error = drive_all(Engine(golden_workload("preemption"), rung="05"), check_pages)
    assert error is None and any(s.trace.preempted for s in steps)


@pytest.mark.invariant("paged-state/3")
@PROPERTY
@given(workloads())
def test_a_plan_places_each_position_at_its_page_and_slot(w):
    for rung in PAGED_RUNGS:
        eng = Engine(copy.deepcopy(w), rung=rung)
        ps = w["engine"]["page_size"]
        steps, _ = drive_all(eng)
        for s in steps:
            for item in (s.plan.items if s.plan else ()):
                table = s.mid.tables[item.request_id]
                want = [(p, table[p // ps], p % ps)
                        for p in range(item.start_position, item.start_position + item.num_tokens)]
                assert expand_placements(item.start_position, item.num_tokens, item.placements, ps) == want


@pytest.mark.invariant("paged-state/4")
@PROPERTY
@given(workloads())
def test_pages_are_taken_from_the_front_and_freed_to_the_back(w):
    for rung in ("03", "04"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        for s in steps:
            if s.mid is None:
                continue
            taken = [p for rid in s.trace.scheduled for p in s.mid.tables[rid][len(s.before[rid].table):]]
            # phase 5 takes the pages it needs, in work order, off the front ...
            assert s.before.free[:len(taken)] == taken
            assert s.mid.free == s.before.free[len(taken):]
            # ... and a finishing request's pages go to the back, in page table order
            freed = [p for rid in s.trace.finished for p in s.mid.tables[rid]]
            assert s.after.free == s.mid.free + freed


@pytest.mark.invariant("paged-state/4")
def test_a_fresh_pool_hands_out_pages_in_ascending_order():
    w = {"engine": {"max_step_tokens": 16, "page_size": 2, "num_pages": 8},
         "requests": [{"request_id": "a", "prompt_len": 3, "max_new_tokens": 1},
                      {"request_id": "b", "prompt_len": 4, "max_new_tokens": 2}]}
    eng = Engine(w, rung="03")
    step = next(drive(eng))
    assert step.mid.tables["a"] == [0, 1] and step.mid.tables["b"] == [2, 3]
    assert eng.pool.free_pages() == [4, 5, 6, 7, 0, 1]     # a finished: its pages at the back


@pytest.mark.invariant("paged-state/5")
def test_a_short_pool_is_fatal_at_rung_03_and_moves_no_page():
    eng = Engine(golden_workload("preemption"), rung="03")
    it = drive(eng)
    next(it)
    pages_before = (eng.pool.free_pages(), list(eng.pool.owner), eng.pool.slots.snapshot(),
                    [(r.computed, list(r.page_table)) for r in eng.requests])
    with pytest.raises(OutOfPages) as info:
        next(it)
    assert info.value.step == 1
    assert pages_before == (eng.pool.free_pages(), list(eng.pool.owner), eng.pool.slots.snapshot(),
                            [(r.computed, list(r.page_table)) for r in eng.requests])
    lines = trace_dicts(Engine(golden_workload("preemption"), rung="03"))
    assert (lines[-1]["error"], lines[-1]["step"]) == ("OutOfPages", 1)
    assert "preempted" not in lines[0]


def pool_state(eng) -> tuple:
    """Everything about pages: free list, owners, slots, and each request's frontier and table."""
    pool = eng.pool
    return (pool.free_pages(), [None if o is None else str(o) for o in pool.owner],
            pool.slots.snapshot(), [(r.computed, list(r.page_table)) for r in eng.requests])


@pytest.mark.invariant("paged-state/5")
@PROPERTY
@given(workloads())
def test_out_of_pages_only_when_the_step_is_short_and_nothing_moves(w):
    for rung in ("03", "04"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        last = [pool_state(eng)]
        steps, error = drive_all(eng, lambda eng, s: last.append(pool_state(eng)))
        assert not isinstance(error, (Irreducible, NeverFits)) or rung == "03"
        if not isinstance(error, OutOfPages):
            continue
        # nothing of the failed step moved a page ...
        assert pool_state(eng) == last[-1]
        # ... and its work (phase 4 replayed on the state it failed in) needed more than was free
        ps, budget = w["engine"]["page_size"], w["engine"]["max_step_tokens"]
        running = [x for x in snap(eng).values() if x.state is State.RUNNING]
        replay = replay_whole if rung == "03" else replay_chunked
        short = sum(max(0, pages_needed(eng.requests[i].computed + n, ps) - len(eng.requests[i].page_table))
                    for i, n in replay(running, budget))
        assert short > eng.pool.num_free


@pytest.mark.invariant("paged-state/6")
@PROPERTY
@given(workloads())
def test_with_a_roomy_pool_rung_03_traces_equal_rung_02(w):
    w = roomy(w)
    assert (list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung="03"))))
            == list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung="02")))))
