"""The page pool and page slots (SPEC §2): free list order, pages_needed, SlotStore, first_mismatch."""
import pytest

from inferris_dist.engine import CACHE, Engine, PagePool, pages_needed
from inferris_dist.engine.shard import SlotStore, first_mismatch

# -- free list --------------------------------------------------------------------------------

def test_free_list_starts_ascending():
    pool = PagePool(5, 2)
    assert pool.free_pages() == [0, 1, 2, 3, 4]
    assert pool.num_free == 5
    assert pool.owner == [None] * 5


def test_take_from_front_free_to_back():
    pool = PagePool(4, 2)
    assert [pool.take("a"), pool.take("b"), pool.take("a")] == [0, 1, 2]
    assert pool.owner == ["a", "b", "a", None]
    pool.free(1)
    pool.free(0)
    assert pool.free_pages() == [3, 1, 0]
    assert pool.owner == [None, None, "a", None]
    assert pool.take("c") == 3
    assert pool.take("c") == 1
    assert pool.free_pages() == [0]
    assert pool.num_free == 1


def test_freeing_a_page_empties_its_slots_and_owner():
    pool = PagePool(2, 4)
    page = pool.take("a")
    pool.slots.write_run(page, "a", 0, 0, 3)
    assert pool.slots.slots(page) == [("a", 0), ("a", 1), ("a", 2), None]
    pool.free(page)
    assert pool.owner[page] is None
    assert pool.slots.slots(page) == [None] * 4
    assert pool.free_pages() == [1, 0]


def test_cache_pages_are_unmapped_not_freed():
    pool = PagePool(3, 2)
    page = pool.take("a")
    pool.give_to_cache(page)
    assert pool.owner[page] is CACHE and pool.refs[page] == 1
    told = []
    pool.on_unreferenced = told.append
    pool.map_cached(page)                      # a second request maps it
    pool.unmap(page, "a")
    assert told == [] and pool.refs[page] == 1
    pool.unmap(page, "b")
    assert told == [page] and pool.owner[page] is CACHE
    assert pool.free_pages() == [1, 2]         # still cached, not on the free list
    own = pool.take("b")
    pool.unmap(own, "b")                       # a request's own page is freed
    assert pool.owner[own] is None and pool.free_pages() == [2, 1]


@pytest.mark.parametrize("tokens,page_size,want", [
    (0, 4, 0), (1, 4, 1), (3, 4, 1), (4, 4, 1), (5, 4, 2), (8, 4, 2), (9, 4, 3),
    (1, 1, 1), (7, 1, 7), (6, 3, 2), (7, 3, 3),
])
def test_pages_needed_is_ceil(tokens, page_size, want):
    assert pages_needed(tokens, page_size) == want


def test_engine_takes_pages_in_free_list_order():
    wl = {"engine": {"page_size": 2, "num_pages": 8, "max_step_tokens": 16},
          "requests": [{"request_id": "a", "prompt_len": 3, "max_new_tokens": 1},
                       {"request_id": "b", "prompt_len": 2, "max_new_tokens": 3},
                       {"request_id": "c", "prompt_len": 1, "max_new_tokens": 1, "arrival_step": 1}]}
    eng = Engine(wl)
    eng.step()
    # a held [0, 1]: block 0 went to the cache, page 1 was a's own and went to the back.
    assert eng.pool.free_pages() == [3, 4, 5, 6, 7, 1]
    assert eng.pool.owner[:3] == [CACHE, None, CACHE]
    eng.prepare()
    # step 1: b needs a second page (position 2), c its first, in work order.
    assert eng.by_id["b"].page_table == [2, 3]
    assert eng.by_id["c"].page_table == [4]


# -- slots -----------------------------------------------------------------------------------

def test_write_run_and_slot():
    store = SlotStore(2, 4)
    store.write_run(0, "a", 4, 0, 3)
    assert store.slots(0) == [("a", 4), ("a", 5), ("a", 6), None]
    assert store.slot(0, 2) == ("a", 6)
    assert store.slot(0, 3) is None
    assert store.slots(1) == [None] * 4
    store.write_run(0, "a", 7, 3, 1)           # same writer, same logical page: one layer
    assert store.layers(0) == [("a", 4, 0b1111)]
    assert store.slots(0) == [("a", 4), ("a", 5), ("a", 6), ("a", 7)]


def test_rewrite_by_another_writer_layers_on_top():
    store = SlotStore(1, 4)
    store.write_run(0, "a", 4, 0, 4)
    store.write_run(0, "b", 1, 1, 2)
    assert store.slots(0) == [("a", 4), ("b", 1), ("b", 2), ("a", 7)]
    assert store.layers(0) == [("b", 0, 0b0110), ("a", 4, 0b1001)]
    store.write_run(0, "b", 3, 3, 1)           # b again: merges into the top layer
    assert store.layers(0) == [("b", 0, 0b1110), ("a", 4, 0b0001)]
    store.write_run(0, "c", 8, 0, 4)           # covers everything: the layers below go
    assert store.layers(0) == [("c", 8, 0b1111)]
    assert store.slots(0) == [("c", 8), ("c", 9), ("c", 10), ("c", 11)]


def test_same_request_at_another_logical_page_is_another_writer():
    store = SlotStore(1, 2)
    store.write_run(0, "a", 0, 0, 2)
    store.write_run(0, "a", 8, 0, 1)
    assert store.slots(0) == [("a", 8), ("a", 1)]
    assert store.layers(0) == [("a", 8, 0b01), ("a", 0, 0b10)]
    # The old writer comes back on top and takes its slot again.
    store.write_run(0, "a", 0, 0, 1)
    assert store.slots(0) == [("a", 0), ("a", 1)]


def test_clear_empties_one_page():
    store = SlotStore(2, 2)
    store.write_run(0, "a", 0, 0, 2)
    store.write_run(1, "b", 2, 0, 2)
    store.clear(0)
    assert store.slots(0) == [None, None]
    assert store.layers(0) == []
    assert store.slots(1) == [("b", 2), ("b", 3)]
    assert store.snapshot() == [(1, [("b", 2, 0b11)])]


def test_snapshot_and_load_round_trip():
    store = SlotStore(3, 4)
    store.write_run(0, "a", 0, 0, 4)
    store.write_run(2, "b", 6, 2, 2)
    store.write_run(2, "c", 8, 0, 1)
    other = SlotStore(3, 4)
    other.load(store.snapshot())
    assert [other.slots(p) for p in range(3)] == [store.slots(p) for p in range(3)]
    other.write_run(0, "z", 0, 0, 1)           # a copy, not shared state
    assert store.slot(0, 0) == ("a", 0)


# -- first_mismatch ----------------------------------------------------------------------------

def _held():
    held = SlotStore(3, 4)
    held.write_run(1, "a", 4, 0, 4)
    held.write_run(2, "b", 0, 0, 2)
    return held


def test_first_mismatch_none_when_shard_holds_everything():
    held = _held()
    shard = {p: held.layers(p) for p in range(3) if held.layers(p)}
    assert first_mismatch(held, shard) is None


def test_first_mismatch_ignores_extra_shard_slots():
    held = _held()
    # Stale slots of an old writer where held is empty, and a page held does not use.
    shard = {0: [("old", 0, 0b1111)], 1: [("a", 4, 0b1111)], 2: [("b", 0, 0b0011), ("old", 0, 0b1100)]}
    assert first_mismatch(held, shard) is None


def test_first_mismatch_reports_first_missing_slot():
    held = _held()
    shard = {1: [("a", 4, 0b0011)], 2: [("b", 0, 0b0011)]}
    assert first_mismatch(held, shard) == (1, 2, ("a", 6), None)


def test_first_mismatch_reports_the_other_writer():
    held = _held()
    shard = {1: [("z", 0, 0b0100), ("a", 4, 0b1011)], 2: [("b", 0, 0b0011)]}
    assert first_mismatch(held, shard) == (1, 2, ("a", 6), ("z", 2))


def test_first_mismatch_page_order_first():
    held = _held()
    assert first_mismatch(held, {}) == (1, 0, ("a", 4), None)
    assert first_mismatch(held, {1: held.layers(1)}) == (2, 0, ("b", 0), None)
    # Same request, another base: not the same slot.
    assert first_mismatch(held, {1: [("a", 0, 0b1111)], 2: held.layers(2)}) == (1, 0, ("a", 4), ("a", 0))


def test_slot_store_matches_a_per_slot_model_under_random_writes():
    """Layers are an encoding of one slot array: any write order gives the same slots,
    one layer per (writer, base), and the shard audit sees no difference where there is none."""
    import random

    from inferris_dist.engine.shard import SlotStore, first_mismatch
    for trial in range(1500):
        rng = random.Random(trial)
        ps, n = rng.randint(1, 6), 3
        store, model = SlotStore(n, ps), [[None] * ps for _ in range(n)]
        twin = SlotStore(n, ps)            # the same slots reached by whole-slot rewrites
        for _ in range(rng.randint(1, 30)):
            page, rid, logical = rng.randrange(n), rng.choice("abc"), rng.randrange(3)
            off = rng.randrange(ps)
            length = rng.randint(1, ps - off)
            store.write_run(page, rid, logical * ps + off, off, length)
            for i in range(length):
                model[page][off + i] = (rid, logical * ps + off + i)
            if rng.random() < 0.1:
                store.clear(page)
                model[page] = [None] * ps
        for p in range(n):
            assert store.slots(p) == model[p], (trial, p)
            keys = [(r, b) for r, b, _ in store.layers(p)]
            assert len(keys) == len(set(keys)), (trial, store.layers(p))
            for off, slot in enumerate(model[p]):
                if slot is not None:
                    twin.write_run(p, slot[0], slot[1], off, 1)
        assert first_mismatch(store, dict(twin.snapshot())) is None, trial
        assert first_mismatch(twin, dict(store.snapshot())) is None, trial
