"""Speculative decoding: draft_len (phase 3), the ranks' verdict (phase 7), resolve (phase 10)."""
import json

import pytest

from inferris_dist.engine import Engine, PagePool, State, load_workload, run_workload, speculation, verdict
from inferris_dist.engine.request import Request
from inferris_dist.engine.speculation import draft_len, resolve
from inferris_dist.engine.workload import RequestSpec

from tests.helpers.external import GOLDEN


def make_request(prompt, max_new, generated=0, computed=0, eos_after=None):
    req = Request(0, RequestSpec("r", tuple(range(prompt)), max_new, 0, eos_after))
    req.state = State.RUNNING
    req.generated, req.computed = generated, computed
    return req


# -- draft_len -------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt,max_new,generated,computed,spec_len,want", [
    (4, 10, 1, 4, 3, 3),       # decoding: min(3, 10 - 1 - 1)
    (4, 5, 1, 4, 3, 3),        # min(3, 5 - 1 - 1 = 3)
    (4, 5, 2, 5, 3, 2),        # min(3, 5 - 2 - 1 = 2)
    (4, 5, 4, 7, 3, 0),        # the last token: nothing to draft
    (4, 10, 1, 4, 0, 0),       # spec_len 0
    (4, 10, 0, 0, 3, 0),       # prefill: generated 0
    (4, 10, 0, 2, 3, 0),
    (4, 10, 3, 4, 3, 0),       # recompute after preemption: computed >= prompt, not decoding
    (4, 10, 3, 5, 3, 0),       # still recomputing (target 7, frontier must be 6)
    (4, 10, 3, 6, 3, 3),       # back on the frontier
])
def test_draft_len_rule(prompt, max_new, generated, computed, spec_len, want):
    req = make_request(prompt, max_new, generated, computed)
    assert draft_len(req, spec_len) == want
    assert speculation.is_decoding(req) == (generated >= 1 and computed == prompt + generated - 1)


def test_golden_recompute_window_terminates_with_the_fixed_rule():
    wl = load_workload(GOLDEN / "recompute_window.spec.json")
    want = [json.loads(line) for line in (GOLDEN / "recompute_window.trace.jsonl").read_text().splitlines()]
    eng = Engine(wl)
    lines = []
    for trace in eng.run():
        lines.append(trace.to_json())
        assert trace.step < 100, "the run does not end"
        for req in eng.requests:
            assert req.draft_len >= 0
            assert req.generated <= req.max_new_tokens
    lines.append({"summary": eng.summary()})
    assert lines == want
    # q6 recomputes 15 positions at step 8: a chunk through its generated tokens, no verdict.
    assert lines[8]["executed"]["q6"] == 15 and "q6" not in lines[8]["drafted"]


def test_recompute_chunk_ending_inside_generated_tokens_is_not_a_window():
    wl = {"engine": {"max_step_tokens": 3, "page_size": 2, "num_pages": 4, "spec_len": 1},
          "requests": [{"request_id": "a", "prompt_len": 6, "max_new_tokens": 1, "arrival_step": 2},
                       {"request_id": "b", "prompt_len": 2, "max_new_tokens": 6}]}
    lines = run_workload(wl)
    steps = lines[:-1]
    assert [s["scheduled"] for s in steps] == [["b"], ["b"], ["a"], ["a"], ["b"], ["b"], ["b"]]
    assert [s["executed"] for s in steps] == [{"b": 2}, {"b": 2}, {"a": 3}, {"a": 3}, {"b": 3},
                                              {"b": 2}, {"b": 2}]
    # Step 3: a needs a third page; b (generated 3) holds two and is preempted.
    assert [s["preempted"] for s in steps] == [[], [], [], ["b"], [], [], []]
    # Step 4 recomputes 0..3, step 5 3..5: computed 3 >= prompt 2, but the frontier is not on
    # the last sampled token (4), so no drafts and no verdict; step 6 decodes again.
    assert [s["drafted"] for s in steps] == [{}, {"b": 1}, {}, {}, {}, {}, {"b": 1}]
    assert [s["accepted"] for s in steps] == [{}, {"b": 1}, {}, {}, {}, {}, {"b": 1}]
    assert [s["sampled"] for s in steps] == [{"b": "TOKEN"}, {"b": "TOKEN"}, {}, {"a": "TOKEN"}, {},
                                             {"b": "TOKEN"}, {"b": "TOKEN"}]
    assert [s["evicted"] for s in steps] == [[], [], [], [], [0, 1], [3], [2]]
    assert [s["published"] for s in steps] == [{"b": 1}, {}, {"a": 1}, {"a": 2}, {"b": 1}, {}, {}]
    assert lines[-1]["summary"] == [
        {"request_id": "a", "state": "FINISHED", "generated": 1, "computed": 6, "finish_reason": "LENGTH"},
        {"request_id": "b", "state": "FINISHED", "generated": 6, "computed": 7, "finish_reason": "LENGTH"},
    ]


# -- verdict ---------------------------------------------------------------------------------

@pytest.mark.parametrize("script,index,drafted,want", [
    (None, 0, 3, 3),           # absent: all accepted
    ((), 0, 2, 2),             # empty
    ((1,), 0, 3, 1),
    ((1,), 1, 3, 3),           # shorter than the verdict index: all accepted
    ((5,), 0, 3, 3),           # clamped high
    ((-2,), 0, 3, 0),          # clamped low
    ((2, 0), 1, 3, 0),
    ((4, 1), 0, 0, 0),         # nothing drafted
])
def test_verdict(script, index, drafted, want):
    assert verdict(script, index, drafted) == want


# -- resolve ---------------------------------------------------------------------------------

def test_resolve_rolls_back_and_frees_pages_past_the_frontier():
    pool = PagePool(8, 2)
    req = make_request(4, 10, generated=1, computed=4)
    req.page_table = [pool.take("r") for _ in range(4)]   # 0..3: positions up to 7
    req.computed = 8                                      # after apply: 4 + 4 tokens
    req.draft_len = 3
    assert resolve(req, 4, 1, pool) == (3, 1, 2)
    assert (req.computed, req.generated, req.draft_len, req.num_verdicts) == (6, 2, 0, 1)
    assert req.page_table == [0, 1, 2]                    # pages_needed(6) = 3
    assert pool.owner[3] is None and pool.free_pages() == [4, 5, 6, 7, 3]


def test_resolve_caps_accepted_at_eos_after():
    pool = PagePool(4, 4)
    req = make_request(4, 10, generated=1, computed=8, eos_after=2)
    req.page_table = [pool.take("r"), pool.take("r")]
    assert resolve(req, 4, 3, pool) == (3, 1, 2)          # min(3, 2 - 1)
    assert (req.computed, req.generated) == (6, 2)
    assert req.page_table == [0, 1]


def test_speculation_end_to_end():
    wl = {"engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3},
          "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6,
                        "accept_script": [1, 0]}]}
    eng = Engine(wl)
    r = eng.by_id["r"]
    eng.step()                                            # prefill, generated 1
    prepared = eng.prepare()                              # step 1: 1 + 3 drafts
    (item,) = prepared.plan.items
    assert (item.start_position, item.num_tokens, item.draft_len, item.decode,
            item.verdict_index) == (4, 4, 3, True, 0)
    t = eng.commit(prepared, eng.executor.execute(prepared.plan))
    assert (t.drafted, t.accepted, t.rolled_back) == ({"r": 3}, {"r": 1}, {"r": 2})
    assert (r.computed, r.generated) == (6, 3)            # 8 - 2 rolled back; +1 sampled
    assert r.page_table == [0, 1]
    prepared = eng.prepare()                              # step 2: min(3, 6 - 3 - 1) = 2 drafts
    (item,) = prepared.plan.items
    assert (item.num_tokens, item.draft_len, item.verdict_index) == (3, 2, 1)
    assert r.page_table == [0, 1, 2]                      # pages_needed(9) = 3
    t = eng.commit(prepared, eng.executor.execute(prepared.plan))
    assert (t.drafted, t.accepted, t.rolled_back) == ({"r": 2}, {"r": 0}, {"r": 2})
    assert (r.computed, r.generated) == (7, 4)
    assert r.page_table == [0, 1]                         # page 2 rolled back and freed
    assert eng.pool.owner[2] is None and eng.pool.free_pages() == [3, 4, 5, 6, 7, 2]
    t = eng.step()                                        # script exhausted: all accepted
    assert (t.executed, t.drafted, t.accepted, t.rolled_back) == (
        {"r": 2}, {"r": 1}, {"r": 1}, {"r": 0})
    assert t.finished == {"r": "LENGTH"}
    assert eng.summary() == [{"request_id": "r", "state": "FINISHED", "generated": 6,
                              "computed": 9, "finish_reason": "LENGTH"}]


def test_eos_after_caps_accepted_and_ends_the_request():
    wl = {"engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3},
          "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6, "eos_after": 2}]}
    lines = run_workload(wl)
    assert len(lines) == 3
    step1 = lines[1]
    assert step1["executed"] == {"r": 4}
    assert (step1["drafted"], step1["accepted"], step1["rolled_back"]) == ({"r": 3}, {"r": 1}, {"r": 2})
    assert step1["sampled"] == {"r": "EOS"} and step1["finished"] == {"r": "EOS"}
    assert lines[2] == {"summary": [{"request_id": "r", "state": "FINISHED", "generated": 2,
                                     "computed": 6, "finish_reason": "EOS"}]}


def test_budget_cuts_the_window():
    wl = {"engine": {"max_step_tokens": 3, "page_size": 2, "num_pages": 16, "spec_len": 4},
          "requests": [{"request_id": "r", "prompt_len": 2, "max_new_tokens": 8}]}
    eng = Engine(wl)
    eng.step()
    prepared = eng.prepare()
    (item,) = prepared.plan.items
    assert (item.num_tokens, item.draft_len) == (3, 4)    # asked for 1 + 4, the budget gave 3
    t = eng.commit(prepared, eng.executor.execute(prepared.plan))
    assert (t.drafted, t.accepted, t.rolled_back) == ({"r": 2}, {"r": 2}, {"r": 0})
    assert (eng.by_id["r"].computed, eng.by_id["r"].generated) == (5, 4)
