"""Residency (SPEC §3, phase 5): extend, evict in tree order only when short, preempt, Irreducible."""
import json

import pytest

from inferris_dist.engine import (
    CACHE,
    Engine,
    Irreducible,
    OutOfPages,
    PagePool,
    State,
    load_workload,
    run_workload,
)
from inferris_dist.engine.prefix import RadixCache
from inferris_dist.engine.request import Request
from inferris_dist.engine.residency import Holders, make_resident
from inferris_dist.engine.workload import RequestSpec

from tests.helpers.external import GOLDEN


def make_request(index, rid, prompt=4):
    req = Request(index, RequestSpec(rid, tuple(range(100 * index, 100 * index + prompt)), 4))
    req.state = State.RUNNING
    return req


def hold(req, pool, holders, num_pages, computed=None):
    """Give `req` its own pages, as an earlier step would have."""
    req.page_table = [pool.take(req.request_id) for _ in range(num_pages)]
    req.computed = num_pages * pool.page_size if computed is None else computed
    holders.add(req)


def setup(num_pages, page_size):
    pool = PagePool(num_pages, page_size)
    cache = RadixCache()
    pool.on_unreferenced = cache.note_unreferenced
    return pool, cache, Holders()


def cached_tree(pool, cache):
    """Pages 0, 1, 2 cached as A(0) -> B(1) and C(2), nobody mapping them.

    Tree order A, B, C; the evictable leaves in order: B, then A (once B is
    gone), then C.
    """
    pages = [pool.take("x") for _ in range(3)]
    assert pages == [0, 1, 2]
    for page in pages:
        pool.give_to_cache(page)
    cache.insert_below(cache.root, [11, 12], [0, 1], pool.refs)
    cache.insert_below(cache.root, [13], [2], pool.refs)
    for page in pages:
        pool.unmap(page, "x")
    assert pool.owner[:3] == [CACHE] * 3 and pool.refs[:3] == [0, 0, 0]


# -- extension -------------------------------------------------------------------------------

def test_extension_in_work_order_from_the_free_list():
    pool, cache, holders = setup(8, 2)
    a, b = make_request(0, "a"), make_request(1, "b")
    hold(a, pool, holders, 1, computed=1)      # a has page 0
    pool.take("ghost")                         # page 1 is somebody else's
    pool.free(1)                               # ... and goes to the back: [2..7, 1]
    work = [(a, 4, False), (b, 3, False)]
    evicted, preempted = [], []
    make_resident(work, pool, cache, holders, evicted, preempted)
    assert a.page_table == [0, 2, 3]           # pages_needed(1 + 4) = 3
    assert b.page_table == [4, 5]              # pages_needed(0 + 3) = 2
    assert pool.owner[2:6] == ["a", "a", "b", "b"]
    assert pool.free_pages() == [6, 7, 1]
    assert evicted == [] and preempted == []


def test_no_new_pages_when_the_table_is_long_enough():
    pool, cache, holders = setup(4, 4)
    a = make_request(0, "a")
    hold(a, pool, holders, 2, computed=5)
    make_resident([(a, 3, True)], pool, cache, holders, [], [])
    assert a.page_table == [0, 1] and pool.num_free == 2


# -- eviction --------------------------------------------------------------------------------

def test_no_eviction_while_the_free_pages_suffice():
    pool, cache, holders = setup(6, 2)
    cached_tree(pool, cache)
    r = make_request(0, "r", 8)
    evicted = []
    make_resident([(r, 6, False)], pool, cache, holders, evicted, [])
    assert evicted == [] and r.page_table == [3, 4, 5]
    assert len(cache) == 3


def test_evicts_only_the_shortfall_in_tree_order():
    pool, cache, holders = setup(6, 2)
    cached_tree(pool, cache)
    r = make_request(0, "r", 8)
    evicted = []
    make_resident([(r, 8, False)], pool, cache, holders, evicted, [])   # 4 pages, 3 free
    assert evicted == [1]
    assert r.page_table == [3, 4, 5, 1]
    assert pool.owner[1] == "r" and len(cache) == 2


def test_eviction_frees_a_parent_after_its_child():
    pool, cache, holders = setup(6, 2)
    cached_tree(pool, cache)
    r = make_request(0, "r", 10)
    evicted = []
    make_resident([(r, 10, False)], pool, cache, holders, evicted, [])  # 5 pages, 3 free
    assert evicted == [1, 0]
    assert r.page_table == [3, 4, 5, 1, 0]
    assert [n.page for n in cache.tree_order()] == [2]


def test_mapped_cache_pages_are_not_evicted():
    pool, cache, holders = setup(6, 2)
    cached_tree(pool, cache)
    pool.map_cached(1)                         # some request maps B: neither B nor A may go
    r = make_request(0, "r", 8)
    evicted = []
    make_resident([(r, 8, False)], pool, cache, holders, evicted, [])
    assert evicted == [2]
    assert r.page_table == [3, 4, 5, 2]


def test_eviction_before_preemption():
    pool, cache, holders = setup(6, 2)
    cached_tree(pool, cache)
    a, b = make_request(0, "a", 8), make_request(1, "b", 8)
    hold(b, pool, holders, 1)                  # page 3
    evicted, preempted = [], []
    make_resident([(a, 8, False)], pool, cache, holders, evicted, preempted)  # 4 pages, 2 free
    assert preempted == [] and evicted == [1, 0]
    assert a.page_table == [4, 5, 1, 0] and b.page_table == [3]


# -- preemption ------------------------------------------------------------------------------

def test_victim_is_the_last_holder_in_request_order_even_outside_the_work():
    pool, cache, holders = setup(4, 2)
    a, b, c = make_request(0, "a", 6), make_request(1, "b"), make_request(2, "c")
    hold(b, pool, holders, 1)                  # page 0
    hold(c, pool, holders, 1)                  # page 1
    evicted, preempted = [], []
    work = [(a, 6, False)]                     # 3 pages, 2 free
    make_resident(work, pool, cache, holders, evicted, preempted)
    assert preempted == [c]
    assert c.page_table == [] and c.computed == 0 and c.state is State.RUNNING
    assert b.page_table == [0] and b.computed == 2
    assert a.page_table == [2, 3, 1]
    assert work == [(a, 6, False)]


def test_victim_in_the_work_without_pages_is_dropped_from_the_work():
    pool, cache, holders = setup(3, 2)
    a, b = make_request(0, "a"), make_request(1, "b")
    work = [(a, 4, False), (b, 4, False)]      # 2 + 2 pages, 3 free
    evicted, preempted = [], []
    make_resident(work, pool, cache, holders, evicted, preempted)
    assert preempted == [b]
    assert work == [(a, 4, False)]
    assert a.page_table == [0, 1] and b.page_table == []
    assert pool.free_pages() == [2]


def test_preemption_frees_own_pages_in_page_table_order_and_keeps_generated():
    pool, cache, holders = setup(4, 2)
    a, b = make_request(0, "a", 8), make_request(1, "b")
    hold(b, pool, holders, 3)                  # pages 0, 1, 2
    pool.give_to_cache(0)                      # b's first block is published
    cache.insert_below(cache.root, [11], [0], pool.refs)
    b.generated = 2
    evicted, preempted = [], []
    make_resident([(a, 6, False)], pool, cache, holders, evicted, preempted)
    assert preempted == [b]
    assert (b.computed, b.generated, b.page_table) == (0, 2, [])
    # 1 and 2 went to the back of the free list in page table order; 0 stays cached.
    assert pool.owner[0] is CACHE and pool.refs[0] == 0
    assert a.page_table == [3, 1, 2]


def test_preempts_as_many_as_needed_last_first():
    pool, cache, holders = setup(4, 2)
    a, b, c = make_request(0, "a", 8), make_request(1, "b"), make_request(2, "c")
    hold(b, pool, holders, 1)
    hold(c, pool, holders, 1)
    work = [(a, 8, False)]
    evicted, preempted = [], []
    make_resident(work, pool, cache, holders, evicted, preempted)   # a needs all 4 pages
    assert preempted == [c, b]
    assert a.page_table == [2, 3, 1, 0]


def test_anchor_is_never_the_victim():
    pool, cache, holders = setup(4, 2)
    a = make_request(0, "a")
    hold(a, pool, holders, 1, computed=2)
    pool.take("ghost")                         # pages 1, 2 held by no request
    pool.take("ghost")
    with pytest.raises(OutOfPages):
        make_resident([(a, 5, False)], pool, cache, holders, [], [])    # 4 pages, 1 free + its own
    assert a.page_table == [0]


def test_engine_preempts_the_last_scheduled_request_first():
    wl = {"engine": {"max_step_tokens": 8, "page_size": 2, "num_pages": 4},
          "requests": [{"request_id": "a", "prompt_len": 4, "max_new_tokens": 1},
                       {"request_id": "b", "prompt_len": 2, "max_new_tokens": 2},
                       {"request_id": "c", "prompt_len": 2, "max_new_tokens": 1}]}
    steps = run_workload(wl)
    # a 2 pages + b 1 + c 1 = 4 = the pool: no preemption.
    assert steps[0]["preempted"] == [] and steps[0]["executed"] == {"a": 4, "b": 2, "c": 2}
    wl["requests"][0]["prompt_len"] = 5
    wl["requests"][0]["max_new_tokens"] = 1
    steps = run_workload(wl)
    # budget 8 = a 5 + b 2 + c 1; a 3 pages + b 1 + c 1 = 5 > 4: c (last in the work, no
    # pages yet) goes; it keeps its place and runs next step.
    assert steps[0]["scheduled"] == ["a", "b", "c"]
    assert steps[0]["preempted"] == ["c"]
    assert steps[0]["executed"] == {"a": 5, "b": 2}
    assert steps[1]["scheduled"] == ["b", "c"] and steps[1]["executed"] == {"b": 1, "c": 2}


# -- Irreducible -----------------------------------------------------------------------------

def test_irreducible_names_the_anchor():
    wl = {"engine": {"max_step_tokens": 8, "page_size": 2, "num_pages": 2},
          "requests": [{"request_id": "big", "prompt_len": 5, "max_new_tokens": 1}]}
    lines = run_workload(wl)
    assert len(lines) == 1
    assert lines[0]["error"] == "Irreducible" and lines[0]["step"] == 0
    assert "big" in lines[0]["message"]


def test_irreducible_only_for_the_anchor():
    wl = {"engine": {"max_step_tokens": 8, "page_size": 2, "num_pages": 2},
          "requests": [{"request_id": "small", "prompt_len": 2, "max_new_tokens": 1},
                       {"request_id": "big", "prompt_len": 5, "max_new_tokens": 1}]}
    eng = Engine(wl)
    t0 = eng.step()
    # big is not the anchor at step 0: it is preempted, not Irreducible.
    assert t0.scheduled == ["small", "big"] and t0.preempted == ["big"]
    assert t0.finished == {"small": "LENGTH"}
    with pytest.raises(Irreducible) as info:
        eng.step()
    assert info.value.step == 1
    assert "big" in info.value.message
    assert info.value.to_json()["error"] == "Irreducible"


def test_anchor_exactly_filling_the_pool_is_not_irreducible():
    wl = {"engine": {"max_step_tokens": 8, "page_size": 2, "num_pages": 2},
          "requests": [{"request_id": "fit", "prompt_len": 4, "max_new_tokens": 1}]}
    lines = run_workload(wl)
    assert lines[-1] == {"summary": [{"request_id": "fit", "state": "FINISHED", "generated": 1,
                                      "computed": 4, "finish_reason": "LENGTH"}]}


# -- the golden preemption workload ---------------------------------------------------------------

def test_golden_preemption_trace():
    wl = load_workload(GOLDEN / "preemption.spec.json")
    want = [json.loads(line) for line in (GOLDEN / "preemption.trace.jsonl").read_text().splitlines()]
    assert run_workload(wl) == want


def test_golden_preemption_states():
    eng = Engine(load_workload(GOLDEN / "preemption.spec.json"))
    t = eng.step()
    assert eng.by_id["p0"].page_table == [0, 1, 2] and eng.by_id["p1"].page_table == [3, 4]
    t = eng.step()
    # p2 needs 2 pages, p1 one more: 3 > 2 free, nothing evictable (all mapped): p2 goes.
    assert t.preempted == ["p2"] and t.evicted == []
    assert eng.by_id["p1"].page_table == [3, 4, 5]
    eng.step()
    t = eng.step()
    assert t.preempted == ["p2", "p1"]
    p1 = eng.by_id["p1"]
    assert (p1.state, p1.computed, p1.generated, p1.page_table) == (State.RUNNING, 0, 3, [])
    t = eng.step()
    # p1 gets back min(2 hits, (4 - 1) // 2) = 1 block.
    assert t.reused == {"p1": 2} and t.evicted == [4]
