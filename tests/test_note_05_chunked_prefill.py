"""Note 05, chunked prefill (docs/mechanisms/05-chunked-prefill.md): its invariants
chunked-prefill/1 to /5, pinned on real runs from rung 04, the rung that adds it."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given

from inferris_dist.engine import Engine, State, trace_dicts, trace_objects

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    PROPERTY,
    bounded,
    drive_all,
    replay_chunked,
    roomy,
    running_after_admission,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.invariant("chunked-prefill/1")
@PROPERTY
@given(workloads())
def test_each_request_takes_min_of_owed_and_budget_left_in_request_order(w):
    eng = Engine(roomy(w), rung="04")
    budget = w["engine"]["max_step_tokens"]
    steps, error = drive_all(eng)
    assert error is None
    for s in steps:
        t = s.trace
        want = replay_chunked(running_after_admission(s), budget)
        assert list(t.executed.items()) == [(eng.requests[i].request_id, n) for i, n in want]
        cut = [rid for rid, n in t.executed.items() if n < s.before[rid].owed]
        assert len(cut) <= 1
        if cut:
            assert cut[0] == t.scheduled[-1] and sum(t.executed.values()) == budget
        if len(t.scheduled) < len(running_after_admission(s)):
            assert sum(t.executed.values()) == budget      # somebody waits only when the budget is spent


@pytest.mark.invariant("chunked-prefill/2")
@PROPERTY
@given(workloads())
def test_chunks_start_at_the_frontier_and_tile_the_sequence(w):
    eng = Engine(roomy(w), rung="04")
    steps, error = drive_all(eng)
    assert error is None
    covered = {r.request_id: 0 for r in eng.requests}
    for s in steps:
        for item in (s.plan.items if s.plan else ()):
            rid = item.request_id
            assert item.start_position == s.before[rid].computed == covered[rid]
            covered[rid] += item.num_tokens
    assert covered == {r.request_id: r.computed for r in eng.requests}


@pytest.mark.invariant("chunked-prefill/2")
def test_a_long_prompt_is_cut_into_budget_sized_chunks():
    lines = trace_dicts(Engine(golden_workload("chunked_prefill"), rung="04"))
    # 17 prompt tokens at 5 a step: 5, 5, 5, then 2 beside short's prompt
    assert [t["executed"].get("long") for t in lines[:4]] == [5, 5, 5, 2]
    assert [t["sampled"].get("long") for t in lines[:4]] == [None, None, None, "TOKEN"]


@pytest.mark.invariant("chunked-prefill/3")
@PROPERTY
@given(workloads())
def test_a_request_samples_exactly_when_its_frontier_reaches_its_target(w):
    for rung in ("04", "05", "08c"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        for s in steps:
            for rid, n in s.trace.executed.items():
                b = s.before[rid]
                start = s.trace.reused.get(rid, b.computed)     # 08c: a cached prefix moves the start
                reaches = start + n == b.prompt + b.generated
                assert (rid in s.trace.sampled) == reaches, (rung, s.trace)
            assert set(s.trace.sampled) <= set(s.trace.executed)


@pytest.mark.invariant("chunked-prefill/4")
@PROPERTY
@given(workloads())
def test_from_rung_04_every_request_finishes_whatever_the_budget(w):
    w = roomy(w)
    eng = Engine(copy.deepcopy(w), rung="04")
    steps, error = drive_all(eng)
    assert error is None
    assert all(r.state is State.FINISHED for r in eng.requests)


@pytest.mark.invariant("chunked-prefill/4")
def test_the_prompt_that_never_fits_at_rung_03_completes_at_rung_04():
    w = golden_workload("chunked_prefill")
    assert trace_dicts(Engine(w, rung="03"))[-1]["error"] == "NeverFits"
    summary = trace_dicts(Engine(copy.deepcopy(w), rung="04"))[-1]["summary"]
    assert [r["finish_reason"] for r in summary] == ["LENGTH", "LENGTH"]


@pytest.mark.invariant("chunked-prefill/5")
@PROPERTY
@given(workloads())
def test_chunking_changes_when_not_what(w):
    w = roomy(w)
    chunked = list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="04"))))
    whole = list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="00"))))
    assert chunked[-1] == whole[-1]
    for rid in (r["request_id"] for r in w["requests"]):
        samples = [t["sampled"][rid] for t in chunked[:-1] if rid in t["sampled"]]
        assert samples == [t["sampled"][rid] for t in whole[:-1] if rid in t["sampled"]]
