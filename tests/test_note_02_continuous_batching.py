"""Note 02, continuous batching (docs/mechanisms/02-continuous-batching.md): its invariants
continuous-batching/1 to /5, pinned on real runs from rung 01, the rung that adds it."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given

from inferris_dist.engine import Engine, State, trace_dicts, trace_json_lines, trace_objects

from tests.helpers.external import GOLDEN, LADDER, golden_workload
from tests.helpers.invariants import (
    CASES,
    PROPERTY,
    bounded,
    drive,
    drive_all,
    index_of,
    running_after_admission,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


def ids_of(eng, snaps) -> list[str]:
    return [eng.requests[x.index].request_id for x in snaps]


@pytest.mark.invariant("continuous-batching/1")
@PROPERTY
@given(workloads())
def test_a_request_is_admitted_once_exactly_at_its_arrival_step(w):
    for rung in ("01", "04", "05", "full"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        order = index_of(eng)
        admitted_at = {}
        for s in steps:
            assert s.trace.admitted == sorted(s.trace.admitted, key=order.get)
            for rid in s.trace.admitted:
                assert rid not in admitted_at
                assert s.before[rid].state is State.WAITING
                admitted_at[rid] = s.trace.step
        for spec in w["requests"]:
            arrival = spec.get("arrival_step", 0)
            if arrival < len(steps):
                assert admitted_at.get(spec["request_id"]) == arrival, (rung, spec)
            else:
                assert spec["request_id"] not in admitted_at


@pytest.mark.invariant("continuous-batching/2")
@PROPERTY
@given(workloads())
def test_the_batch_is_rebuilt_from_request_state_every_step(w):
    eng = Engine(w, rung="01")
    for s in drive(eng):
        assert s.trace.scheduled == ids_of(eng, running_after_admission(s))


@pytest.mark.invariant("continuous-batching/2")
@PROPERTY
@given(workloads())
def test_at_every_rung_the_batch_is_running_requests_in_request_order(w):
    for rung in ("02", "04", "05", "full"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, _ = drive_all(eng)
        for s in steps:
            running = ids_of(eng, running_after_admission(s))
            it = iter(running)
            assert all(rid in it for rid in s.trace.scheduled), (rung, s.trace.scheduled, running)


@pytest.mark.invariant("continuous-batching/2")
def test_a_late_request_joins_a_batch_that_is_mid_decode():
    steps = trace_dicts(Engine(golden_workload("continuous_batching"), rung="01"))
    # a decodes alone; b and c arrive at step 2 and run beside it that very step
    assert steps[1]["scheduled"] == ["a"]
    assert steps[2]["admitted"] == ["b", "c"] and steps[2]["scheduled"] == ["a", "b", "c"]
    assert steps[2]["executed"] == {"a": 1, "b": 5, "c": 1}


@pytest.mark.invariant("continuous-batching/3")
@PROPERTY
@given(workloads())
def test_a_request_leaves_the_batch_the_step_it_finishes(w):
    for rung in ("01", "03", "05"):
        eng = Engine(copy.deepcopy(w), rung=rung)

        def check(eng, s):
            for rid in s.trace.finished:
                assert s.before[rid].state is not State.FINISHED
            for r in eng.requests:
                if r.state is State.FINISHED or r.request_id in s.trace.finished:
                    assert r.state is State.FINISHED and r.page_table == []
                    assert r.request_id not in eng.pool.owner, f"finished {r.request_id} owns a page"
                    assert r not in eng.scheduler.running

        steps, _ = drive_all(eng, check)
        done_at = {}
        for s in steps:
            for rid in s.trace.scheduled + s.trace.admitted + list(s.trace.executed):
                assert rid not in done_at, (f"{rid} finished at step {done_at.get(rid)}, "
                                            f"back at {s.trace.step}")
            for rid in s.trace.finished:
                assert rid not in done_at
                done_at[rid] = s.trace.step


@pytest.mark.invariant("continuous-batching/4")
@pytest.mark.parametrize("case", CASES)
def test_rung_01_traces_equal_rung_00_on_every_ladder_case(case):
    w = json.loads((GOLDEN / f"{case}.spec.json").read_text())
    assert (list(trace_json_lines(Engine(w, rung="01")))
            == list(trace_json_lines(Engine(copy.deepcopy(w), rung="00"))))
    assert ((LADDER / f"{case}.01.trace.jsonl").read_text()
            == (LADDER / f"{case}.00.trace.jsonl").read_text())


@pytest.mark.invariant("continuous-batching/4")
@PROPERTY
@given(workloads())
def test_rung_01_traces_equal_rung_00(w):
    assert (list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung="01"))))
            == list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung="00")))))


@pytest.mark.invariant("continuous-batching/5")
@PROPERTY
@given(workloads())
def test_without_a_budget_a_request_runs_as_if_alone(w):
    together = list(bounded(trace_objects(Engine(copy.deepcopy(w), rung="01"))))[:-1]
    for spec in w["requests"]:
        rid = spec["request_id"]
        alone = Engine({"engine": w["engine"], "requests": [spec]}, rung="01")
        alone = list(bounded(trace_objects(alone)))[:-1]
        mine = [(t["step"], t["executed"].get(rid), t["sampled"].get(rid), t["finished"].get(rid))
                for t in together if rid in t["scheduled"]]
        solo = [(t["step"], t["executed"].get(rid), t["sampled"].get(rid), t["finished"].get(rid))
                for t in alone if rid in t["scheduled"]]
        assert mine == solo, rid
