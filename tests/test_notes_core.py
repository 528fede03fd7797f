"""The invariants of the mechanism notes 01 to 06 (docs/mechanisms/01-engine-loop.md to
06-preemption.md), each pinned on real engine runs at the rung of the ladder that adds it.

Every test drives `engine.Engine(workload, rung=...)` through its own phases and reads
its requests, pool and traces; nothing is mocked. Property tests draw small workloads
(derandomized, so every run checks the same examples).
"""
from __future__ import annotations

import copy
import json
import subprocess
from typing import NamedTuple

import pytest
from external import CLI, ENV, GOLDEN, REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferris_dist import engine
from inferris_dist.engine import (
    Engine,
    EngineError,
    Irreducible,
    NeverFits,
    OutOfPages,
    State,
    expand_placements,
    pages_needed,
)

pytestmark = pytest.mark.timeout(60)

LADDER = GOLDEN / "ladder"
CASES = sorted(p.name.split(".")[0] for p in LADDER.glob("*.00.trace.jsonl"))
# No workload drawn here needs more than a few dozen steps: a run past this has stopped ending.
MAX_STEPS = 2000

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# -- workloads ---------------------------------------------------------------------------------

@st.composite
def workloads(draw, max_requests: int = 5) -> dict:
    """A small workload with staggered arrivals, EOS now and then, any budget and pool."""
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        req = {"request_id": f"r{i}", "prompt_len": draw(st.integers(1, 10)),
               "max_new_tokens": draw(st.integers(1, 4))}
        if draw(st.booleans()):
            req["arrival_step"] = draw(st.integers(0, 4))
        if draw(st.integers(0, 3)) == 0:
            req["eos_after"] = draw(st.integers(0, 4))
        requests.append(req)
    knobs = {"max_step_tokens": draw(st.integers(1, 12)), "page_size": draw(st.integers(1, 4)),
             "num_pages": draw(st.integers(1, 12))}
    return {"engine": knobs, "requests": requests}


@st.composite
def pressured(draw) -> dict:
    """A workload whose pool is short of what its requests want at once, yet fits any one of
    them alone: preemption happens often and Irreducible never."""
    w = draw(workloads(max_requests=6))
    ps = w["engine"]["page_size"]
    alone = max(pages_needed(r["prompt_len"] + r["max_new_tokens"], ps) for r in w["requests"])
    w["engine"]["num_pages"] = alone + draw(st.integers(0, 3))
    return w


def roomy(w: dict) -> dict:
    """The same workload with a pool no step can run short of (every request's whole life at once)."""
    w = copy.deepcopy(w)
    ps = w["engine"].get("page_size", 4)
    w["engine"]["num_pages"] = sum(pages_needed(r["prompt_len"] + r["max_new_tokens"], ps)
                                   for r in w["requests"]) + 1
    return w


def unbudgeted(w: dict) -> dict:
    """The same workload with a budget every request's whole prompt fits in."""
    w = copy.deepcopy(w)
    w["engine"]["max_step_tokens"] = sum(r["prompt_len"] + r["max_new_tokens"] for r in w["requests"])
    return w


# -- driving an engine through its own phases ---------------------------------------------

class Snap(NamedTuple):
    index: int
    state: State
    prompt: int
    generated: int
    computed: int
    table: tuple

    @property
    def owed(self) -> int:
        return self.prompt + self.generated - self.computed


class Step(NamedTuple):
    trace: object              # the StepTrace
    before: dict               # request id -> Snap, before the step
    free_before: list          # the pool's free list before the step
    mid: dict | None           # request id -> page table once phase 5 is done (None: idle step)
    free_mid: list | None      # the free list once phase 5 is done
    plan: object | None        # the step's ExecutionPlan
    free_after: list           # the free list once the step is committed


def snap(eng) -> dict:
    return {r.request_id: Snap(r.index, r.state, r.prompt, r.generated, r.computed, tuple(r.page_table))
            for r in eng.requests}


def drive(eng):
    """Step `eng` to its end exactly as `Engine.run` does (idle step, or prepare, the
    executor, commit; then the progress check), yielding a `Step` after each one.
    Engine errors propagate, after the steps before them were yielded."""
    while not eng.done:
        assert eng.step_id <= MAX_STEPS, f"no end after {MAX_STEPS} steps"
        before, free_before = snap(eng), eng.pool.free_pages()
        if eng.is_idle():
            trace = eng.idle_step()
            yield Step(trace, before, free_before, None, None, None, eng.pool.free_pages())
        else:
            prepared = eng.prepare()
            mid = {r.request_id: list(r.page_table) for r in eng.requests}
            free_mid = eng.pool.free_pages()
            trace = eng.commit(prepared, eng.executor.execute(prepared.plan))
            yield Step(trace, before, free_before, mid, free_mid, prepared.plan, eng.pool.free_pages())
        eng.check_progress(trace)


def drive_all(eng, check=None):
    """All the steps and the error that ended the run (or None); `check(eng, step)` after each."""
    steps = []
    try:
        for s in drive(eng):
            steps.append(s)
            if check is not None:
                check(eng, s)
    except EngineError as e:
        return steps, e
    return steps, None


def bounded(lines):
    out = []
    for line in lines:
        out.append(line)
        assert len(out) <= MAX_STEPS + 1, f"no end after {MAX_STEPS} steps"
    return out


def trace_dicts(eng) -> list[dict]:
    """The SPEC §4 lines of a run (the steps, then the summary or the error), bounded."""
    return bounded(engine.trace_objects(eng))


def trace_json_lines(eng) -> list[str]:
    """The same lines as the JSON text `--json` prints, bounded."""
    return bounded(engine.trace_json_lines(eng))


def running_after_admission(s: Step) -> list[Snap]:
    """The requests RUNNING once phase 1 of the step is done, in request order."""
    admitted = set(s.trace.admitted)
    return sorted((x for rid, x in s.before.items() if x.state is State.RUNNING or rid in admitted),
                  key=lambda x: x.index)


def ids_of(eng, snaps) -> list[str]:
    return [eng.requests[x.index].request_id for x in snaps]


def replay_chunked(running: list[Snap], budget: int) -> list[tuple[int, int]]:
    """Phase 4 from outside: (request index, tokens), min(owed, budget left) in request order."""
    work = []
    for x in running:
        n = min(x.owed, budget)
        if n > 0:
            work.append((x.index, n))
            budget -= n
            if budget == 0:
                break
    return work


def replay_whole(running: list[Snap], budget: int) -> list[tuple[int, int]]:
    """Rung 02/03's phase 4 from outside: a request runs only if all it owes fits what is left."""
    work = []
    for x in running:
        if x.owed <= budget:
            work.append((x.index, x.owed))
            budget -= x.owed
    return work


def work_ids(eng, work) -> list[str]:
    return [eng.requests[i].request_id for i, _ in work]


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.spec.json").read_text())


def index_of(eng) -> dict:
    return {r.request_id: r.index for r in eng.requests}


# ============================================================================================
# 01 engine loop (rung 00)
# ============================================================================================

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
        first = trace_json_lines(Engine(copy.deepcopy(w), rung=rung))
        assert first == trace_json_lines(Engine(copy.deepcopy(w), rung=rung))


@pytest.mark.invariant("engine-loop/2")
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
            assert snap(eng) == s.before and eng.pool.free_pages() == s.free_before
    assert [t.step for t in seen] == [0, 1, 2, 3]
    assert seen[3].admitted == ["late"] and seen[3].finished == {"late": "LENGTH"}


@pytest.mark.invariant("engine-loop/5")
@PROPERTY
@given(workloads())
def test_a_step_with_nothing_running_is_empty(w):
    eng = Engine(w, rung="00")
    for s in drive(eng):
        if not running_after_admission(s):
            assert s.trace.is_empty and snap(eng) == s.before
        else:
            assert not s.trace.is_empty


# ============================================================================================
# 02 continuous batching (rung 01)
# ============================================================================================

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
    steps = trace_dicts(Engine(golden("continuous_batching"), rung="01"))
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
    assert trace_json_lines(Engine(w, rung="01")) == trace_json_lines(Engine(copy.deepcopy(w), rung="00"))
    assert ((LADDER / f"{case}.01.trace.jsonl").read_text()
            == (LADDER / f"{case}.00.trace.jsonl").read_text())


@pytest.mark.invariant("continuous-batching/4")
@PROPERTY
@given(workloads())
def test_rung_01_traces_equal_rung_00(w):
    assert (trace_json_lines(Engine(copy.deepcopy(w), rung="01"))
            == trace_json_lines(Engine(copy.deepcopy(w), rung="00")))


@pytest.mark.invariant("continuous-batching/5")
@PROPERTY
@given(workloads())
def test_without_a_budget_a_request_runs_as_if_alone(w):
    together = trace_dicts(Engine(copy.deepcopy(w), rung="01"))[:-1]
    for spec in w["requests"]:
        rid = spec["request_id"]
        alone = trace_dicts(Engine({"engine": w["engine"], "requests": [spec]}, rung="01"))[:-1]
        mine = [(t["step"], t["executed"].get(rid), t["sampled"].get(rid), t["finished"].get(rid))
                for t in together if rid in t["scheduled"]]
        solo = [(t["step"], t["executed"].get(rid), t["sampled"].get(rid), t["finished"].get(rid))
                for t in alone if rid in t["scheduled"]]
        assert mine == solo, rid


# ============================================================================================
# 03 token budget (rung 02)
# ============================================================================================

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
            assert all(now[rid] == x for rid, x in last.before.items() if rid not in last.trace.admitted)
        elif error is None:
            assert all(r.state is State.FINISHED for r in eng.requests)


@pytest.mark.invariant("token-budget/4")
def test_never_fits_is_printed_after_its_step_line():
    lines = trace_dicts(Engine(golden("chunked_prefill"), rung="02"))
    assert lines == [
        {"step": 0, "admitted": ["long"], "scheduled": [], "executed": {}, "sampled": {}, "finished": {}},
        {"error": "NeverFits", "message": lines[1]["message"], "step": 0}]
    assert "long" in lines[1]["message"]


# ============================================================================================
# 04 paged state (rung 03)
# ============================================================================================

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
    steps, error = drive_all(Engine(golden("preemption"), rung="05"), check_pages)
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
                table = s.mid[item.request_id]
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
            taken = [p for rid in s.trace.scheduled for p in s.mid[rid][len(s.before[rid].table):]]
            # phase 5 takes the pages it needs, in work order, off the front ...
            assert s.free_before[:len(taken)] == taken
            assert s.free_mid == s.free_before[len(taken):]
            # ... and a finishing request's pages go to the back, in page table order
            freed = [p for rid in s.trace.finished for p in s.mid[rid]]
            assert s.free_after == s.free_mid + freed


@pytest.mark.invariant("paged-state/4")
def test_a_fresh_pool_hands_out_pages_in_ascending_order():
    w = {"engine": {"max_step_tokens": 16, "page_size": 2, "num_pages": 8},
         "requests": [{"request_id": "a", "prompt_len": 3, "max_new_tokens": 1},
                      {"request_id": "b", "prompt_len": 4, "max_new_tokens": 2}]}
    eng = Engine(w, rung="03")
    step = next(drive(eng))
    assert step.mid["a"] == [0, 1] and step.mid["b"] == [2, 3]
    assert eng.pool.free_pages() == [4, 5, 6, 7, 0, 1]     # a finished: its pages at the back


@pytest.mark.invariant("paged-state/5")
def test_a_short_pool_is_fatal_at_rung_03_and_moves_no_page():
    eng = Engine(golden("preemption"), rung="03")
    it = drive(eng)
    next(it)
    pages_before = (eng.pool.free_pages(), list(eng.pool.owner), eng.pool.slots.snapshot(),
                    [(r.computed, list(r.page_table)) for r in eng.requests])
    with pytest.raises(OutOfPages) as info:
        next(it)
    assert info.value.step == 1
    assert pages_before == (eng.pool.free_pages(), list(eng.pool.owner), eng.pool.slots.snapshot(),
                            [(r.computed, list(r.page_table)) for r in eng.requests])
    lines = trace_dicts(Engine(golden("preemption"), rung="03"))
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
    assert (trace_json_lines(Engine(copy.deepcopy(w), rung="03"))
            == trace_json_lines(Engine(copy.deepcopy(w), rung="02")))


# ============================================================================================
# 05 chunked prefill (rung 04)
# ============================================================================================

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
    lines = trace_dicts(Engine(golden("chunked_prefill"), rung="04"))
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
    w = golden("chunked_prefill")
    assert trace_dicts(Engine(w, rung="03"))[-1]["error"] == "NeverFits"
    summary = trace_dicts(Engine(copy.deepcopy(w), rung="04"))[-1]["summary"]
    assert [r["finish_reason"] for r in summary] == ["LENGTH", "LENGTH"]


@pytest.mark.invariant("chunked-prefill/5")
@PROPERTY
@given(workloads())
def test_chunking_changes_when_not_what(w):
    w = roomy(w)
    chunked = trace_dicts(Engine(copy.deepcopy(w), rung="04"))
    whole = trace_dicts(Engine(copy.deepcopy(w), rung="00"))
    assert chunked[-1] == whole[-1]
    for rid in (r["request_id"] for r in w["requests"]):
        samples = [t["sampled"][rid] for t in chunked[:-1] if rid in t["sampled"]]
        assert samples == [t["sampled"][rid] for t in whole[:-1] if rid in t["sampled"]]


# ============================================================================================
# 06 preemption (rung 05)
# ============================================================================================

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
    lines = trace_dicts(Engine(golden("irreducible"), rung="05"))
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
    lines = trace_dicts(Engine(golden("preemption"), rung="05"))
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
                     for p in s.mid[rid][len(s.before[rid].table):]]
            assert (s.free_before + freed)[:len(taken)] == taken
            assert s.free_mid == (s.free_before + freed)[len(taken):]

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
        assert bool(s.trace.preempted) == (short > len(s.free_before)), s.trace


@pytest.mark.invariant("preemption/4")
@PROPERTY
@given(workloads())
def test_with_a_roomy_pool_rung_05_is_rung_04(w):
    w = roomy(w)
    with_preemption = trace_dicts(Engine(copy.deepcopy(w), rung="05"))
    assert all(t["preempted"] == [] for t in with_preemption[:-1])
    without = [{k: v for k, v in t.items() if k != "preempted"} for t in with_preemption]
    assert without == trace_dicts(Engine(copy.deepcopy(w), rung="04"))


@pytest.mark.invariant("preemption/5")
@PROPERTY
@given(st.one_of(pressured(), workloads()))
def test_preemption_changes_when_not_what(w):
    short = trace_dicts(Engine(copy.deepcopy(w), rung="05"))
    if "error" in short[-1]:
        assert short[-1]["error"] == "Irreducible"
        return
    assert short[-1] == trace_dicts(Engine(roomy(w), rung="05"))[-1]


@pytest.mark.invariant("preemption/5")
def test_golden_preemption_run_ends_as_with_a_roomy_pool():
    w = golden("preemption")
    short = trace_dicts(Engine(w, rung="05"))
    assert sum(len(t["preempted"]) for t in short[:-1]) == 7
    big = copy.deepcopy(w)
    big["engine"]["num_pages"] = 64
    assert short[-1] == trace_dicts(Engine(big, rung="05"))[-1]
    assert trace_dicts(Engine(copy.deepcopy(w), rung="04"))[-1]["error"] == "OutOfPages"
