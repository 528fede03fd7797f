"""Note 03, the token budget (docs/mechanisms/03-token-budget.md): its invariants token-budget/1
to /4, pinned on real runs from rung 02, the rung that adds it."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import Engine, NeverFits, State, trace_dicts

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    PROPERTY,
    drive_all,
    replay_whole,
    running_after_admission,
    snap,
    work_ids,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.invariant("token-budget/1")
@PROPERTY
@given(workloads(), st.integers(0, 3))
def test_a_step_never_executes_more_than_the_budget(w, spec_len):
    w["engine"]["spec_len"] = spec_len
    for rung in ("02", "03", "04", "05", "08c", "full"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        for s in steps:
            assert sum(s.trace.executed.values()) <= w["engine"]["max_step_tokens"], (rung, s.trace)


@pytest.mark.invariant("token-budget/1")
def test_without_the_budget_the_same_workload_overruns_it():
    w = {"engine": {"max_step_tokens": 4},
         "requests": [{"request_id": "a", "prompt_len": 3, "max_new_tokens": 2},
                      {"request_id": "b", "prompt_len": 3, "max_new_tokens": 2},
                      {"request_id": "c", "prompt_len": 2, "max_new_tokens": 1}]}
    assert sum(trace_dicts(Engine(w, rung="01"))[0]["executed"].values()) == 8
    lines = trace_dicts(Engine(w, rung="02"))
    assert all(sum(t["executed"].values()) <= 4 for t in lines[:-1])
    assert all(r["state"] == "FINISHED" for r in lines[-1]["summary"])


@pytest.mark.invariant("token-budget/2")
@PROPERTY
@given(workloads())
def test_rung_02_runs_a_request_whole_or_not_at_all(w):
    eng = Engine(w, rung="02")
    steps, _ = drive_all(eng)
    for s in steps:
        t = s.trace
        assert t.executed == {rid: s.before[rid].owed for rid in t.scheduled}
        assert list(t.sampled) == t.scheduled


@pytest.mark.invariant("token-budget/3")
@PROPERTY
@given(workloads())
def test_rung_02_is_the_first_fit_pass_in_request_order(w):
    for rung in ("02", "03"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        for s in steps:
            want = replay_whole(running_after_admission(s), w["engine"]["max_step_tokens"])
            assert s.trace.scheduled == work_ids(eng, want), (rung, s.trace.step)


@pytest.mark.invariant("token-budget/3")
def test_a_request_that_does_not_fit_lets_a_later_one_run():
    w = {"engine": {"max_step_tokens": 6},
         "requests": [{"request_id": "a", "prompt_len": 3, "max_new_tokens": 2},
                      {"request_id": "b", "prompt_len": 5, "max_new_tokens": 2},
                      {"request_id": "c", "prompt_len": 2, "max_new_tokens": 1}]}
    first = trace_dicts(Engine(w, rung="02"))[0]
    assert first["scheduled"] == ["a", "c"] and first["executed"] == {"a": 3, "c": 2}


@pytest.mark.invariant("token-budget/4")
@PROPERTY
@given(workloads())
def test_never_fits_ends_the_run_on_the_step_that_took_nothing(w):
    for rung in ("02", "03"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, error = drive_all(eng)
        budget = w["engine"]["max_step_tokens"]
        for s in steps[:-1]:
            assert s.trace.scheduled or not running_after_admission(s)
        if rung == "02":
            assert error is None or isinstance(error, NeverFits), error.to_json()
        if isinstance(error, NeverFits):
            last = steps[-1]
            assert error.step == last.trace.step and last.trace.scheduled == []
            running = running_after_admission(last)
            assert running and all(x.owed > budget for x in running)
            now = snap(eng)
            assert all(now[rid] == x for rid, x in last.before.requests.items()
                       if rid not in last.trace.admitted)
        elif error is None:
            assert all(r.state is State.FINISHED for r in eng.requests)


@pytest.mark.invariant("token-budget/4")
def test_never_fits_is_printed_after_its_step_line():
    lines = trace_dicts(Engine(golden_workload("chunked_prefill"), rung="02"))
    assert lines == [
        {"step": 0, "admitted": ["long"], "scheduled": [], "executed": {}, "sampled": {}, "finished": {}},
        {"error": "NeverFits", "message": lines[1]["message"], "step": 0}]
    assert "long" in lines[1]["message"]
