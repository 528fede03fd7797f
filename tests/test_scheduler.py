"""Continuous batching, the token budget and chunked prefill (SPEC §3, phases 1, 3, 4).

Every expected value below is worked out by hand from docs/SPEC.md.
"""
from inferris_dist import engine
from inferris_dist.engine import Engine, State, run_workload
from inferris_dist.engine.request import Request
from inferris_dist.engine.scheduler import Scheduler
from inferris_dist.engine.workload import RequestSpec


def steps_of(lines):
    assert "summary" in lines[-1], lines[-1]
    return lines[:-1], lines[-1]["summary"]


def by_step(lines, field):
    return [line[field] for line in lines]


def spec_placements(item, page_size):
    """A plan item's SPEC placements (position, page_id, offset), whatever its wire form."""
    try:
        return engine.expand_placements(item.start_position, item.num_tokens, item.placements, page_size)
    except TypeError:
        return engine.expand_placements(item.placements)


def make_request(index, rid, prompt, max_new=4, arrival=0, state=State.RUNNING):
    req = Request(index, RequestSpec(rid, tuple(range(100 * index, 100 * index + prompt)), max_new,
                                     arrival))
    req.state = state
    return req


# -- continuous batching ----------------------------------------------------------------

BATCHING = {
    "engine": {"max_step_tokens": 64, "page_size": 4, "num_pages": 32},
    "requests": [
        {"request_id": "r0", "prompt_len": 2, "max_new_tokens": 3, "arrival_step": 1},
        {"request_id": "r1", "prompt_len": 3, "max_new_tokens": 1},
        {"request_id": "r2", "prompt_len": 1, "max_new_tokens": 2, "arrival_step": 1},
    ],
}


def test_arrivals_are_admitted_in_request_order_and_finished_requests_leave():
    steps, summary = steps_of(run_workload(BATCHING))
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    # r1 arrives first; r0 and r2 arrive together at step 1 and join in list order.
    assert by_step(steps, "admitted") == [["r1"], ["r0", "r2"], [], []]
    # r1 finishes at step 0 and is never scheduled again; r2 leaves after step 2.
    assert by_step(steps, "scheduled") == [["r1"], ["r0", "r2"], ["r0", "r2"], ["r0"]]
    assert by_step(steps, "executed") == [{"r1": 3}, {"r0": 2, "r2": 1}, {"r0": 1, "r2": 1}, {"r0": 1}]
    assert by_step(steps, "sampled") == [{"r1": "TOKEN"}, {"r0": "TOKEN", "r2": "TOKEN"},
                                         {"r0": "TOKEN", "r2": "TOKEN"}, {"r0": "TOKEN"}]
    assert by_step(steps, "finished") == [{"r1": "LENGTH"}, {}, {"r2": "LENGTH"}, {"r0": "LENGTH"}]
    # The decoding requests report their (zero-draft) verdicts.
    assert by_step(steps, "drafted") == [{}, {}, {"r0": 0, "r2": 0}, {"r0": 0}]
    assert summary == [
        {"request_id": "r0", "state": "FINISHED", "generated": 3, "computed": 4, "finish_reason": "LENGTH"},
        {"request_id": "r1", "state": "FINISHED", "generated": 1, "computed": 3, "finish_reason": "LENGTH"},
        {"request_id": "r2", "state": "FINISHED", "generated": 2, "computed": 2, "finish_reason": "LENGTH"},
    ]


def test_scheduled_order_is_request_order_not_arrival_order():
    wl = {"engine": {"max_step_tokens": 64},
          "requests": [{"request_id": "late", "prompt_len": 2, "max_new_tokens": 2, "arrival_step": 1},
                       {"request_id": "early", "prompt_len": 2, "max_new_tokens": 3}]}
    steps, _ = steps_of(run_workload(wl))
    assert by_step(steps, "admitted")[:2] == [["early"], ["late"]]
    assert by_step(steps, "scheduled") == [["early"], ["late", "early"], ["late", "early"]]
    assert by_step(steps, "finished") == [{}, {}, {"late": "LENGTH", "early": "LENGTH"}]


def test_nothing_runnable_gives_empty_steps_until_arrival():
    wl = {"requests": [{"request_id": "x", "prompt_len": 1, "max_new_tokens": 1, "arrival_step": 3}]}
    eng = Engine(wl)
    traces = list(eng.run())
    assert [t.step for t in traces] == [0, 1, 2, 3]
    assert [t.is_empty for t in traces] == [True, True, True, False]
    empty = traces[0].to_json()
    assert empty == {"step": 0, "admitted": [], "scheduled": [], "executed": {}, "sampled": {},
                     "finished": {}, "preempted": [], "reused": {}, "published": {}, "evicted": [],
                     "drafted": {}, "accepted": {}, "rolled_back": {}}
    assert traces[3].admitted == ["x"] and traces[3].finished == {"x": "LENGTH"}
    assert eng.done


def test_scheduler_admit_waits_for_arrival_and_keeps_running_in_request_order():
    reqs = [make_request(0, "a", 2, arrival=2, state=State.WAITING),
            make_request(1, "b", 2, arrival=0, state=State.WAITING),
            make_request(2, "c", 2, arrival=1, state=State.WAITING),
            make_request(3, "d", 2, arrival=1, state=State.WAITING)]
    s = Scheduler(reqs)
    assert [r.request_id for r in s.admit(0)] == ["b"]
    assert [r.request_id for r in s.admit(1)] == ["c", "d"]
    assert reqs[0].state is State.WAITING
    assert [r.request_id for r in s.admit(2)] == ["a"]
    assert [r.request_id for r in s.running] == ["a", "b", "c", "d"]
    assert all(r.state is State.RUNNING for r in reqs)
    s.retire(reqs[2])
    assert [r.request_id for r in s.running] == ["a", "b", "d"]
    assert s.admit(3) == []


# -- token budget ---------------------------------------------------------------------------

def test_budget_is_handed_out_in_request_order_and_stops_at_zero():
    wl = {"engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 16},
          "requests": [{"request_id": "a", "prompt_len": 5, "max_new_tokens": 1},
                       {"request_id": "b", "prompt_len": 2, "max_new_tokens": 1},
                       {"request_id": "c", "prompt_len": 4, "max_new_tokens": 1},
                       {"request_id": "d", "prompt_len": 1, "max_new_tokens": 1}]}
    steps, summary = steps_of(run_workload(wl))
    # 8 = a 5 + b 2 + c 1 (cut); d gets nothing at step 0.
    assert by_step(steps, "scheduled") == [["a", "b", "c"], ["c", "d"]]
    assert by_step(steps, "executed") == [{"a": 5, "b": 2, "c": 1}, {"c": 3, "d": 1}]
    # c's prompt is not complete at step 0: it does not sample.
    assert by_step(steps, "sampled") == [{"a": "TOKEN", "b": "TOKEN"}, {"c": "TOKEN", "d": "TOKEN"}]
    assert [r["computed"] for r in summary] == [5, 2, 4, 1]


def test_schedule_takes_min_of_remaining_and_budget():
    reqs = [make_request(0, "a", 3), make_request(1, "b", 6), make_request(2, "c", 1)]
    reqs[0].computed = 1                       # remaining 2
    s = Scheduler([])
    s.running = list(reqs)
    work = s.schedule(max_step_tokens=5, spec_len=0)
    assert [(r.request_id, n, decode) for r, n, decode in work] == [("a", 2, False), ("b", 3, False)]
    work = s.schedule(max_step_tokens=100, spec_len=0)
    assert [(r.request_id, n) for r, n, _ in work] == [("a", 2), ("b", 6), ("c", 1)]


def test_schedule_marks_only_frontier_requests_as_decoding():
    dec = make_request(0, "dec", 4, max_new=10)
    dec.generated, dec.computed = 2, 5         # target 6, frontier on the last sampled token
    rec = make_request(1, "rec", 4, max_new=10)
    rec.generated, rec.computed = 3, 4         # recomputing after a preemption: target 7
    s = Scheduler([])
    s.running = [dec, rec]
    work = s.schedule(max_step_tokens=100, spec_len=2)
    assert [(r.request_id, n, decode) for r, n, decode in work] == [("dec", 3, True), ("rec", 3, False)]
    assert dec.draft_len == 2 and rec.draft_len == 0


# -- chunked prefill ------------------------------------------------------------------------

CHUNKED = {
    "engine": {"max_step_tokens": 4, "page_size": 4, "num_pages": 8},
    "requests": [{"request_id": "long", "prompt_len": 10, "max_new_tokens": 2},
                 {"request_id": "short", "prompt_len": 2, "max_new_tokens": 1, "arrival_step": 1}],
}


def test_long_prompt_is_prefilled_in_chunks():
    steps, summary = steps_of(run_workload(CHUNKED))
    assert by_step(steps, "admitted") == [["long"], ["short"], [], []]
    assert by_step(steps, "scheduled") == [["long"], ["long"], ["long", "short"], ["long"]]
    assert by_step(steps, "executed") == [{"long": 4}, {"long": 4}, {"long": 2, "short": 2}, {"long": 1}]
    assert by_step(steps, "sampled") == [{}, {}, {"long": "TOKEN", "short": "TOKEN"}, {"long": "TOKEN"}]
    assert by_step(steps, "finished") == [{}, {}, {"short": "LENGTH"}, {"long": "LENGTH"}]
    assert by_step(steps, "published") == [{"long": 1}, {"long": 1}, {}, {}]
    assert summary[0] == {"request_id": "long", "state": "FINISHED", "generated": 2, "computed": 11,
                          "finish_reason": "LENGTH"}
    assert summary[1]["computed"] == 2


def test_chunk_plans_start_at_the_frontier():
    eng = Engine(CHUNKED)
    eng.step()
    prepared = eng.prepare()                   # step 1: the second chunk of long
    (item,) = prepared.plan.items
    assert (item.request_id, item.start_position, item.num_tokens, item.decode) == ("long", 4, 4, False)
    assert spec_placements(item, 4) == [(4, 1, 0), (5, 1, 1), (6, 1, 2), (7, 1, 3)]
    eng.commit(prepared, eng.executor.execute(prepared.plan))
    prepared = eng.prepare()                   # step 2: the tail of long, all of short
    long_item, short_item = prepared.plan.items
    assert (long_item.start_position, long_item.num_tokens) == (8, 2)
    assert spec_placements(long_item, 4) == [(8, 2, 0), (9, 2, 1)]
    assert spec_placements(short_item, 4) == [(0, 3, 0), (1, 3, 1)]
    assert eng.by_id["long"].page_table == [0, 1, 2]
    eng.commit(prepared, eng.executor.execute(prepared.plan))
    # The writes landed in the control plane's pool: slot (page, offset) holds (id, position).
    slots = eng.pool.slots
    assert [slots.slot(2, off) for off in range(4)] == [("long", 8), ("long", 9), None, None]
    assert slots.slot(1, 3) == ("long", 7)
    # short finished this step: its page went back to the pool, emptied.
    assert slots.slots(3) == [None] * 4 and eng.pool.owner[3] is None
