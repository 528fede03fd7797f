"""Note 08, the radix cache (docs/mechanisms/08-radix-cache.md): its invariants radix-cache/1 to
/5, pinned on a RadixCache driven beside a brute-force model of the tree, and in the engine."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import CACHE, Engine
from inferris_dist.engine.prefix import RadixCache

from tests.helpers.external import golden_workload
from tests.helpers.invariants import CACHE_RUNGS, GOLDEN_NAMES, PROPERTY, bounded, cache_paths, plan_steps

pytestmark = pytest.mark.timeout(60)


class Model:
    """The SPEC's tree as plain dicts: path (keys from ROOT) -> page, children in insertion order."""

    def __init__(self):
        self.page: dict[tuple[int, ...], int] = {}
        self.kids: dict[tuple[int, ...], list[int]] = {(): []}

    def preorder(self):
        out = []

        def walk(path):
            for key in self.kids[path]:
                child = path + (key,)
                out.append(child)
                walk(child)
        walk(())
        return out

    def match(self, keys, limit):
        pages = []
        for i in range(limit):
            path = tuple(keys[:i + 1])
            if path not in self.page:
                break
            pages.append(self.page[path])
        return pages

    def insert(self, keys, pages):
        for i, page in enumerate(pages):
            path = tuple(keys[:len(keys) - len(pages) + i + 1])
            assert path not in self.page
            self.page[path] = page
            self.kids[path[:-1]].append(path[-1])
            self.kids[path] = []

    def first_evictable(self, refs):
        for path in self.preorder():
            if not self.kids[path] and refs[self.page[path]] == 0:
                return path
        return None

    def remove(self, path):
        del self.page[path]
        del self.kids[path]
        self.kids[path[:-1]].remove(path[-1])


NUM_TEST_PAGES = 24
ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(1, 3), min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("map"), st.integers(0, NUM_TEST_PAGES - 1)),
    st.tuples(st.just("unmap"), st.integers(0, NUM_TEST_PAGES - 1)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("match"), st.lists(st.integers(1, 3), max_size=5), st.integers(0, 5)),
), max_size=40)


def play(op_list, check):
    """Drive a RadixCache and the Model side by side, as publish / reuse / residency do."""
    cache, model = RadixCache(), Model()
    refs = [0] * NUM_TEST_PAGES
    free = list(range(NUM_TEST_PAGES))
    for op in op_list:
        kind = op[0]
        if kind == "insert":                 # publish: match, then hang the missing blocks below
            _, keys, mapped = op
            _, node, depth = cache.match(keys, len(keys))
            assert depth == len(model.match(keys, len(keys)))
            missing = len(keys) - depth
            if missing == 0 or missing > len(free):
                continue
            pages = [free.pop(0) for _ in range(missing)]
            for p in pages:
                refs[p] = 1 if mapped else 0
            cache.insert_below(node, keys[depth:], pages, refs)
            model.insert(keys, pages)
        elif kind == "map":                  # reuse maps a cache page
            p = op[1]
            if p in model.page.values():
                refs[p] += 1
        elif kind == "unmap":                # a page table lets go of it
            p = op[1]
            if p in model.page.values() and refs[p] > 0:
                refs[p] -= 1
                if refs[p] == 0:
                    cache.note_unreferenced(p)
        elif kind == "evict":
            want = model.first_evictable(refs)
            got = cache.evict_one(refs)
            check("evict", cache, model, refs, want=want, got=got)
            if want is not None:
                free.append(model.page[want])
                model.remove(want)
        elif kind == "match":
            _, keys, limit = op
            limit = min(limit, len(keys))
            check("match", cache, model, refs, got=cache.match(keys, limit)[0],
                  want=model.match(keys, limit))
        check("state", cache, model, refs)
    return cache, model


def no_check(*a, **k):
    pass


@pytest.mark.invariant("radix-cache/1")
@PROPERTY
@given(op_list=ops)
def test_match_is_the_longest_present_run_from_root(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "match":
            assert got == want
    play(op_list, check)


@pytest.mark.invariant("radix-cache/2")
@PROPERTY
@given(op_list=ops, keys=st.lists(st.integers(1, 3), min_size=1, max_size=5))
def test_insert_keeps_resident_nodes_and_appends_the_rest(op_list, keys):
    cache, model = play(op_list, no_check)
    before = {path: page for path, page in cache_paths(cache)}
    refs = [1] * 64
    pages, node, depth = cache.match(keys, len(keys))
    new_pages = list(range(40, 40 + len(keys) - depth))
    cache.insert_below(node, keys[depth:], new_pages, refs)
    after = dict(cache_paths(cache))
    assert cache.match(keys, len(keys))[0] == pages + new_pages
    for path, page in before.items():                     # nothing resident moved or changed page
        assert after[path] == page
    assert len(after) == len(before) + len(new_pages)


@pytest.mark.invariant("radix-cache/3")
@PROPERTY
@given(op_list=ops)
def test_tree_order_is_preorder_children_in_insertion_order(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "state":
            assert [p for p, _ in cache_paths(cache)] == model.preorder()
    play(op_list, check)


@pytest.mark.invariant("radix-cache/4")
@PROPERTY
@given(op_list=ops)
def test_one_page_per_node(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "state":
            paths = cache_paths(cache)
            pages = [p for _, p in paths]
            assert len(pages) == len(set(pages)) == len(cache)
            assert set(cache.node_of_page) == set(pages)
            assert dict(paths) == model.page
    play(op_list, check)


@pytest.mark.invariant("radix-cache/5")
@PROPERTY
@given(op_list=ops)
def test_evict_takes_the_first_unmapped_leaf_in_tree_order(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "evict":
            assert got == (None if want is None else model.page[want])
    play(op_list, check)


@pytest.mark.invariant("radix-cache/2")
@pytest.mark.invariant("radix-cache/4")
@pytest.mark.parametrize("rung", CACHE_RUNGS)
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_engine_cache_nodes_are_the_cache_pages_and_keep_them(name, rung):
    for s in plan_steps(golden_workload(name), rung):
        evicted = set(s.trace.evicted)
        for when in (s.mid, s.after):
            cache_owned = {p for p, o in enumerate(when.owner) if o is CACHE}
            assert {page for _, page in when.paths} == cache_owned
            assert len(when.paths) == len(cache_owned)
        # first publisher wins: a path present before and after keeps its page, unless evicted
        before, after = s.before.page_of, s.after.page_of
        for path, page in before.items():
            if path in after and page not in evicted:
                assert after[path] == page


@pytest.mark.invariant("radix-cache/2")
def test_first_publisher_wins_in_the_engine():
    eng = Engine(golden_workload("prefix_reuse"), rung="08a")      # 08a publishes but never reads
    traces = list(bounded(eng.run()))
    same = next(t for t in traces if "same" in t.executed and t.executed["same"] == 14)
    assert same.published == {}                           # `first` holds all three blocks
    first_pages = eng.cache.match(eng.keys.chain(eng.by_id["first"].tokens, 4), 3)[0]
    assert first_pages == [0, 1, 2]
