"""Note 01, the engine loop (docs/mechanisms/01-engine-loop.md): its invariants engine-loop/1 to /5,
pinned on real runs from rung 00, the first rung of the ladder."""
from __future__ import annotations

import copy
import json
import subprocess

import pytest
from hypothesis import given

from inferris_dist.engine import Engine, State, trace_dicts, trace_json_lines

from tests.helpers.external import CLI, ENV, GOLDEN, LADDER, REPO
from tests.helpers.invariants import (
    CASES,
    PROPERTY,
    bounded,
    drive,
    drive_all,
    running_after_admission,
    snap,
    workloads,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.invariant("engine-loop/1")
@PROPERTY
@given(workloads())
def test_steps_count_from_zero_and_the_run_ends_with_the_last_finish(w):
    eng = Engine(w, rung="00")
    steps, error = drive_all(eng)
    assert error is None
    assert [s.trace.step for s in steps] == list(range(len(steps)))
    finished = [rid for s in steps for rid in s.trace.finished]
    assert sorted(finished) == sorted(r["request_id"] for r in w["requests"])
    assert steps[-1].trace.finished, "a step after the last finish"
    assert all(r.state is State.FINISHED and r.finish_reason is not None for r in eng.requests)


@pytest.mark.invariant("engine-loop/1")
def test_a_workload_without_requests_has_no_step():
    assert trace_dicts(Engine({"requests": []}, rung="00")) == [{"summary": []}]


@pytest.mark.invariant("engine-loop/2")
@pytest.mark.parametrize("case", CASES)
def test_rung_00_reproduces_its_reference_trace_byte_for_byte(case):
    eng = Engine(json.loads((GOLDEN / f"{case}.spec.json").read_text()), rung="00")
    text = "".join(line + "\n" for line in trace_json_lines(eng))
    assert text == (LADDER / f"{case}.00.trace.jsonl").read_text()


@pytest.mark.invariant("engine-loop/2")
@PROPERTY
@given(workloads())
def test_the_same_workload_gives_the_same_bytes(w):
    for rung in ("00", "05"):
        first = list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung=rung))))
        assert first == list(bounded(trace_json_lines(Engine(copy.deepcopy(w), rung=rung))))


@pytest.mark.invariant("engine-loop/2")
@pytest.mark.procs
def test_the_cli_prints_the_same_bytes():
    spec = GOLDEN / "continuous_batching.spec.json"
    done = subprocess.run([*CLI, "run", "--rung", "00", "--json", "--spec", str(spec)], env=ENV,
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (LADDER / "continuous_batching.00.trace.jsonl").read_text()


@pytest.mark.invariant("engine-loop/3")
@PROPERTY
@given(workloads())
def test_rung_00_computes_everything_owed_and_samples_every_step(w):
    eng = Engine(w, rung="00")
    for s in drive(eng):
        t = s.trace
        assert t.executed == {rid: s.before[rid].owed for rid in t.scheduled}
        assert list(t.sampled) == t.scheduled
        for rid in t.scheduled:
            b, r = s.before[rid], eng.by_id[rid]
            assert r.computed == b.prompt + b.generated       # the frontier reached the target


@pytest.mark.invariant("engine-loop/4")
@PROPERTY
@given(workloads())
def test_generated_counts_token_samples_and_the_finish_reason_follows(w):
    for rung in ("00", "01"):
        eng = Engine(copy.deepcopy(w), rung=rung)
        steps, error = drive_all(eng)
        assert error is None
        for spec, r in zip(w["requests"], eng.requests):
            rid, max_new, eos = r.request_id, spec["max_new_tokens"], spec.get("eos_after")
            tokens = sum(1 for s in steps if s.trace.sampled.get(rid) == "TOKEN")
            eoses = [s.trace.step for s in steps if s.trace.sampled.get(rid) == "EOS"]
            assert r.generated == tokens
            if eos is not None and eos < max_new:
                assert (r.finish_reason, r.generated, len(eoses)) == ("EOS", eos, 1)
                assert steps[eoses[0]].trace.finished.get(rid) == "EOS"
            else:
                assert (r.finish_reason, r.generated, eoses) == ("LENGTH", max_new, [])


@pytest.mark.invariant("engine-loop/4")
def test_eos_after_zero_finishes_on_the_prompt_step_with_nothing_generated():
    w = {"requests": [{"request_id": "x", "prompt_len": 3, "max_new_tokens": 4, "eos_after": 0}]}
    lines = trace_dicts(Engine(w, rung="00"))
    assert lines[0]["sampled"] == {"x": "EOS"} and lines[0]["finished"] == {"x": "EOS"}
    assert lines[-1]["summary"][0]["generated"] == 0


@pytest.mark.invariant("engine-loop/5")
def test_idle_steps_are_empty_and_change_nothing():
    w = {"requests": [{"request_id": "late", "prompt_len": 2, "max_new_tokens": 1, "arrival_step": 3}]}
    eng = Engine(w, rung="00")
    seen = []
    for s in drive(eng):
        seen.append(s.trace)
        if s.trace.step < 3:
            assert s.trace.is_empty
            assert snap(eng) == s.before.requests and eng.pool.free_pages() == s.before.free
    assert [t.step for t in seen] == [0, 1, 2, 3]
    assert seen[3].admitted == ["late"] and seen[3].finished == {"late": "LENGTH"}


@pytest.mark.invariant("engine-loop/5")
@PROPERTY
@given(workloads())
def test_a_step_with_nothing_running_is_empty(w):
    eng = Engine(w, rung="00")
    for s in drive(eng):
        if not running_after_admission(s):
            assert s.trace.is_empty and snap(eng) == s.before.requests
        else:
            assert not s.trace.is_empty
