"""Cache-aware scheduling: reuse (phase 2), publish (phase 11), eviction (phase 5)."""
import json

from inferris_dist.engine import CACHE, Engine, load_workload, run_workload

from tests.helpers.external import GOLDEN

PROMPT = [1, 2, 3, 4, 5, 6, 7]


def reuse_workload():
    return {"engine": {"max_step_tokens": 16, "page_size": 2, "num_pages": 16},
            "requests": [
                {"request_id": "a", "tokens": PROMPT, "max_new_tokens": 1},
                # same prompt: all 3 blocks hit, (7 - 1) // 2 = 3 usable
                {"request_id": "b", "tokens": PROMPT, "max_new_tokens": 1, "arrival_step": 1},
                # 6 tokens = 3 complete blocks hit, but only (6 - 1) // 2 = 2 usable
                {"request_id": "c", "tokens": PROMPT[:6], "max_new_tokens": 1, "arrival_step": 2},
                # block 2 differs: 2 hits; 4 complete blocks, 2 of them new
                {"request_id": "d", "tokens": [1, 2, 3, 4, 9, 9, 9, 9], "max_new_tokens": 1,
                 "arrival_step": 3},
                # 2 tokens: (2 - 1) // 2 = 0 usable, no reuse at all
                {"request_id": "e", "tokens": [1, 2], "max_new_tokens": 1, "arrival_step": 4},
                # d's 4 blocks now hit, 8 // 2 = 4 usable
                {"request_id": "f", "tokens": [1, 2, 3, 4, 9, 9, 9, 9, 5], "max_new_tokens": 1,
                 "arrival_step": 4},
            ]}


def test_reuse_and_publish_counts():
    lines = run_workload(reuse_workload())
    steps, summary = lines[:-1], lines[-1]["summary"]
    assert [s["reused"] for s in steps] == [{}, {"b": 6}, {"c": 4}, {"d": 4}, {"f": 8}]
    assert [s["executed"] for s in steps] == [{"a": 7}, {"b": 1}, {"c": 2}, {"d": 4},
                                              {"e": 2, "f": 1}]
    assert [s["published"] for s in steps] == [{"a": 3}, {}, {}, {"d": 2}, {}]   # e's block 0 is a's
    assert [s["evicted"] for s in steps] == [[]] * 5
    assert [r["computed"] for r in summary] == [7, 7, 6, 8, 2, 9]
    assert all(r["finish_reason"] == "LENGTH" for r in summary)


def test_reused_pages_stay_cache_owned_and_are_mapped():
    eng = Engine(reuse_workload())
    eng.step()                                     # a: pages 0..3, blocks 0..2 published
    pool = eng.pool
    assert pool.owner[:4] == [CACHE, CACHE, CACHE, None]
    assert pool.refs[:3] == [0, 0, 0]
    assert pool.free_pages()[-1] == 3              # a's own last page went to the back
    prepared = eng.prepare()                       # step 1: b reuses 3 blocks
    b = eng.by_id["b"]
    assert prepared.reused == {"b": 6}
    assert b.computed == 6 and b.page_table == [0, 1, 2, 4]
    assert pool.owner[:3] == [CACHE, CACHE, CACHE] and pool.owner[4] == "b"
    assert pool.refs[:3] == [1, 1, 1]
    (item,) = prepared.plan.items
    assert (item.start_position, item.num_tokens) == (6, 1)
    eng.commit(prepared, eng.executor.execute(prepared.plan))
    assert pool.refs[:3] == [0, 0, 0] and pool.owner[4] is None


def test_publish_hands_complete_blocks_to_the_cache_chunk_by_chunk():
    wl = {"engine": {"max_step_tokens": 3, "page_size": 2, "num_pages": 8},
          "requests": [{"request_id": "r", "tokens": PROMPT, "max_new_tokens": 2}]}
    eng = Engine(wl)
    pool = eng.pool
    t = eng.step()                                 # computed 3: 1 complete block
    assert t.published == {"r": 1}
    assert eng.by_id["r"].page_table == [0, 1]
    assert pool.owner[:2] == [CACHE, "r"]
    t = eng.step()                                 # computed 6: 3 complete, 1 resident
    assert t.published == {"r": 2}
    assert eng.by_id["r"].page_table == [0, 1, 2]
    assert pool.owner[:3] == [CACHE, CACHE, CACHE]
    assert pool.refs[:3] == [1, 1, 1]
    t = eng.step()                                 # computed 7: still 3 complete blocks
    assert t.published == {} and t.sampled == {"r": "TOKEN"}
    assert eng.by_id["r"].page_table == [0, 1, 2, 3] and pool.owner[3] == "r"
    t = eng.step()                                 # decode: generated tokens are never published
    assert t.published == {} and t.finished == {"r": "LENGTH"}
    assert pool.owner[:4] == [CACHE, CACHE, CACHE, None]


def test_publish_counts_only_blocks_not_already_resident():
    wl = {"engine": {"max_step_tokens": 16, "page_size": 2, "num_pages": 8},
          "requests": [{"request_id": "x", "tokens": [1, 2, 3, 4, 5], "max_new_tokens": 2},
                       {"request_id": "y", "tokens": [1, 2, 3, 4, 5], "max_new_tokens": 2}]}
    eng = Engine(wl)
    t = eng.step()
    # Same step, same prompt: x publishes both blocks, y finds them resident.
    assert t.reused == {} and t.published == {"x": 2}
    assert eng.by_id["x"].page_table == [0, 1, 2] and eng.by_id["y"].page_table == [3, 4, 5]
    assert eng.pool.owner == [CACHE, CACHE, "x", "y", "y", "y", None, None]


def test_publish_after_a_partial_hit_inserts_below_the_resident_blocks():
    wl = {"engine": {"max_step_tokens": 16, "page_size": 2, "num_pages": 8},
          "requests": [{"request_id": "a", "tokens": [1, 2, 3, 4], "max_new_tokens": 1},
                       {"request_id": "b", "tokens": [1, 2, 7, 7, 8], "max_new_tokens": 1,
                        "arrival_step": 1}]}
    eng = Engine(wl)
    eng.step()
    t = eng.step()
    assert t.reused == {"b": 2} and t.published == {"b": 1}
    assert [n.page for n in eng.cache.tree_order()] == [0, 1, 2]
    assert eng.cache.match(eng.by_id["b"].prefix_keys, 2)[0] == [0, 2]


def test_golden_cache_eviction_trace():
    wl = load_workload(GOLDEN / "cache_eviction.spec.json")
    want = [json.loads(line) for line in (GOLDEN / "cache_eviction.trace.jsonl").read_text().splitlines()]
    assert run_workload(wl) == want


def test_golden_cache_eviction_states():
    eng = Engine(load_workload(GOLDEN / "cache_eviction.spec.json"))
    traces = [eng.step() for _ in range(4)]
    # w0's chain 0 -> 1 -> 2, w1's block 2 hangs below 1 as a second child (page 4).
    assert [n.page for n in eng.cache.tree_order()] == [0, 1, 2, 4]
    assert eng.pool.free_pages() == [6, 7, 3, 5]
    t = eng.step()                                 # w2 needs 6 pages, 4 free: 2 leaves go
    assert t.evicted == [2, 4]
    assert eng.by_id["w2"].page_table == [6, 7, 3, 5, 2, 4]
    eng.step()
    t = eng.step()                                 # w3: 1 is a leaf now but w3 maps it
    assert t.reused == {"w3": 4} and t.evicted == [2]
    assert eng.by_id["w3"].page_table == [0, 1, 4, 2]
    assert eng.pool.owner[4] is CACHE and eng.pool.owner[2] == "w3"
    assert traces[2].published == {"w1": 1}
