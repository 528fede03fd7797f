"""State invariants of the engine (SPEC §2, §3), checked from the outside after a committed step.

    from invariants import check_invariants
    eng = Engine(workload)
    for trace in eng.run():
        check_invariants(eng)

Reads only the engine's public-ish state: `engine.requests`, `engine.pool`
(`owner`, `refs`, `free_pages()`, `num_pages`, `page_size`, `slots`),
`engine.cache` (`node_of_page`, `tree_order()`) and `engine.CACHE` /
`engine.pool.CACHE` (the cache-owner sentinel, taken from the `engine`
package if the instance does not carry it).
"""
from __future__ import annotations

from inferris_dist import engine as engine_pkg
from inferris_dist.engine import State


def _cache_sentinel(eng):
    for holder in (eng, eng.pool):
        sentinel = getattr(holder, "CACHE", None)
        if sentinel is not None:
            return sentinel
    return engine_pkg.CACHE


def _pages_needed(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def check_invariants(eng) -> None:
    """Assert every bookkeeping invariant of a committed step; the message says which broke."""
    pool, cache = eng.pool, eng.cache
    CACHE = _cache_sentinel(eng)
    num_pages, page_size = pool.num_pages, pool.page_size
    owner, refs = pool.owner, pool.refs
    requests = eng.requests
    by_id = {r.request_id: r for r in requests}
    assert len(by_id) == len(requests), "duplicate request ids in engine.requests"
    assert len(owner) == num_pages and len(refs) == num_pages

    # -- the free list: no duplicates, exactly the unowned pages ---------------------------
    free = pool.free_pages()
    assert len(free) == len(set(free)), f"free list has duplicates: {free}"
    assert all(0 <= p < num_pages for p in free), f"free list has a bad page id: {free}"
    free_set = set(free)
    unowned = {p for p in range(num_pages) if owner[p] is None}
    assert free_set == unowned, (f"free list {sorted(free_set)} != pages with no owner "
                                 f"{sorted(unowned)}")
    owned = [p for p in range(num_pages) if owner[p] is not None]
    assert len(free) + len(owned) == num_pages, "free + owned != num_pages"
    for p in free:
        assert all(s is None for s in pool.slots.slots(p)), f"free page {p} has non-empty slots"

    # -- every owner is the cache or an unfinished request --------------------------------
    for p in owned:
        o = owner[p]
        if o is CACHE:
            continue
        assert isinstance(o, str) and o in by_id, f"page {p} owned by unknown {o!r}"
        assert by_id[o].state is not State.FINISHED, f"page {p} owned by finished request {o}"

    # -- page tables --------------------------------------------------------------------
    mapped_by: dict[int, list[str]] = {}
    for r in requests:
        table = r.page_table
        rid = r.request_id
        assert len(table) == len(set(table)), f"{rid}: page table maps a page twice: {table}"
        if r.state is State.FINISHED:
            assert table == [], f"finished {rid} still holds pages {table}"
            assert r.finish_reason is not None, f"finished {rid} has no finish_reason"
            continue
        assert r.finish_reason is None, f"unfinished {rid} has finish_reason {r.finish_reason}"
        if r.state is State.WAITING:
            assert table == [] and r.computed == 0 and r.generated == 0, f"waiting {rid} has state"
            continue
        assert r.state is State.RUNNING, f"{rid}: unknown state {r.state!r}"
        assert 0 <= r.computed <= r.prompt + r.generated, (
            f"{rid}: computed {r.computed} outside [0, target {r.prompt + r.generated}]")
        assert 0 <= r.generated < r.max_new_tokens, (
            f"running {rid}: generated {r.generated}, max_new_tokens {r.max_new_tokens}")
        assert len(table) == _pages_needed(r.computed, page_size), (
            f"{rid}: page table {table} for computed {r.computed} "
            f"(want {_pages_needed(r.computed, page_size)} pages)")
        for logical, p in enumerate(table):
            assert 0 <= p < num_pages, f"{rid}: bad page id {p}"
            assert p not in free_set, f"{rid}: page table maps free page {p}"
            o = owner[p]
            assert o is CACHE or o == rid, f"{rid}: maps page {p} owned by {o!r}"
            mapped_by.setdefault(p, []).append(rid)
            if o == rid:
                # the request's own page holds exactly its own positions below the frontier
                for off in range(page_size):
                    pos = logical * page_size + off
                    if pos < r.computed:
                        got = pool.slots.slot(p, off)
                        assert got == (rid, pos), (f"{rid}: page {p} slot {off} holds {got}, "
                                                   f"want {(rid, pos)}")

    # -- a request-owned page lives in its owner's page table and nowhere else ----------
    for p in owned:
        o = owner[p]
        if o is CACHE:
            continue
        assert mapped_by.get(p) == [o], (f"page {p} owned by {o} is mapped by "
                                         f"{mapped_by.get(p, [])}")

    # -- cache pages: refs count the page tables mapping them --------------------------
    cache_pages = {p for p in owned if owner[p] is CACHE}
    for p in cache_pages:
        n = len(mapped_by.get(p, []))
        assert refs[p] == n, f"cache page {p}: refs {refs[p]}, mapped by {mapped_by.get(p, [])}"

    # -- cache nodes hold exactly the cache-owned pages ----------------------------------
    node_of_page = cache.node_of_page
    assert set(node_of_page) == cache_pages, (
        f"cache nodes hold pages {sorted(node_of_page)}, cache-owned pages are "
        f"{sorted(cache_pages)}")
    nodes = list(cache.tree_order())
    tree_pages = [n.page for n in nodes]
    assert len(tree_pages) == len(set(tree_pages)), f"two cache nodes share a page: {tree_pages}"
    assert set(tree_pages) == cache_pages, (
        f"tree order visits pages {tree_pages}, cache-owned pages are {sorted(cache_pages)}")
    for n in nodes:
        assert node_of_page[n.page] is n, f"node_of_page[{n.page}] is not the tree's node"
        parent = getattr(n, "parent", None)
        children = getattr(parent, "children", None)
        if children is not None:
            assert children.get(n.key) is n, f"node of page {n.page} not under its parent"

    # -- counters the engine keeps for itself ------------------------------------------
    num_unfinished = getattr(eng, "num_unfinished", None)
    if num_unfinished is not None:
        real = sum(1 for r in requests if r.state is not State.FINISHED)
        assert num_unfinished == real, f"num_unfinished {num_unfinished}, really {real}"
