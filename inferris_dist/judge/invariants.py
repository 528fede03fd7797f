"""The control plane's bookkeeping judged after a committed step (SPEC §2, §3): the free list,
page ownership, page tables, slots, the cache's refs and nodes. `check_invariants(engine)`
raises InvariantBroken where one does not hold; the testing library hands it out, to pass as
`check=` to a run on processes.
"""
from __future__ import annotations

from inferris_dist.engine import CACHE, Engine, State


class InvariantBroken(AssertionError):
    """A bookkeeping invariant of the control plane does not hold after a committed step."""


def check_invariants(eng: Engine) -> None:
    """Raise InvariantBroken unless every bookkeeping invariant of a committed step holds (SPEC
    §2, §3): the free list is exactly the unowned pages and they are empty; every page is owned
    by the cache or an unfinished request, which maps it; each request's page table covers
    exactly its computed positions, and its own pages hold exactly them; cache pages' refs
    count the tables mapping them, and the cache's nodes hold exactly the cache's pages."""
    pool, cache = eng.pool, eng.cache
    # the cache's owner mark: the engine's, or that of an engine of one's own that has its own
    cache_owner = getattr(eng, "CACHE", None) or getattr(pool, "CACHE", None) or CACHE
    num_pages = pool.num_pages
    owner, refs = pool.owner, pool.refs
    requests = eng.requests
    by_id = {r.request_id: r for r in requests}
    _require(len(by_id) == len(requests), "duplicate request ids in engine.requests")
    _require(len(owner) == num_pages and len(refs) == num_pages, "owner or refs not one per page")

    free = pool.free_pages()
    free_set = set(free)
    _require(len(free) == len(free_set), lambda: f"free list has duplicates: {free}")
    _require(all(0 <= p < num_pages for p in free), lambda: f"free list has a bad page id: {free}")
    unowned = {p for p in range(num_pages) if owner[p] is None}
    _require(free_set == unowned, lambda: f"free list {sorted(free_set)} != pages with no owner "
                                          f"{sorted(unowned)}")
    owned = [p for p in range(num_pages) if owner[p] is not None]
    for p in free:
        _require(all(s is None for s in pool.slots.slots(p)), lambda: f"free page {p} has non-empty slots")
    for p in owned:
        o = owner[p]
        if o is cache_owner:
            continue
        _require(isinstance(o, str) and o in by_id, lambda: f"page {p} owned by unknown {o!r}")
        _require(by_id[o].state is not State.FINISHED, lambda: f"page {p} owned by finished request {o}")

    mapped_by: dict[int, list[str]] = {}
    for r in requests:
        _check_request(r, pool, free_set, mapped_by, cache_owner)
    for p in owned:
        o = owner[p]
        if o is not cache_owner:
            _require(mapped_by.get(p) == [o], lambda: f"page {p} owned by {o} is mapped by "
                                                      f"{mapped_by.get(p, [])}")

    cache_pages = {p for p in owned if owner[p] is cache_owner}
    for p in cache_pages:
        _require(refs[p] == len(mapped_by.get(p, [])),
                 lambda: f"cache page {p}: refs {refs[p]}, mapped by {mapped_by.get(p, [])}")
    node_of_page = cache.node_of_page
    _require(set(node_of_page) == cache_pages, lambda: f"cache nodes hold pages {sorted(node_of_page)}, "
                                                       f"cache-owned pages are {sorted(cache_pages)}")
    nodes = list(cache.tree_order())
    tree_pages = [n.page for n in nodes]
    _require(len(tree_pages) == len(set(tree_pages)), lambda: f"two cache nodes share a page: {tree_pages}")
    _require(set(tree_pages) == cache_pages, lambda: f"tree order visits pages {tree_pages}, cache-owned "
                                                     f"pages are {sorted(cache_pages)}")
    for n in nodes:
        _require(node_of_page[n.page] is n, lambda: f"node_of_page[{n.page}] is not the tree's node")
        children = getattr(getattr(n, "parent", None), "children", None)
        if children is not None:
            _require(children.get(n.key) is n, lambda: f"node of page {n.page} not under its parent")
    num_unfinished = getattr(eng, "num_unfinished", None)
    if num_unfinished is not None:
        real = sum(1 for r in requests if r.state is not State.FINISHED)
        _require(num_unfinished == real, lambda: f"num_unfinished {num_unfinished}, really {real}")


def _check_request(r, pool, free_set: set[int], mapped_by: dict[int, list[str]], cache_owner) -> None:
    table, rid, page_size = r.page_table, r.request_id, pool.page_size
    _require(len(table) == len(set(table)), lambda: f"{rid}: page table maps a page twice: {table}")
    if r.state is State.FINISHED:
        _require(table == [], lambda: f"finished {rid} still holds pages {table}")
        _require(r.finish_reason is not None, lambda: f"finished {rid} has no finish_reason")
        return
    _require(r.finish_reason is None, lambda: f"unfinished {rid} has finish_reason {r.finish_reason}")
    if r.state is State.WAITING:
        _require(table == [] and r.computed == 0 and r.generated == 0, lambda: f"waiting {rid} has state")
        return
    _require(r.state is State.RUNNING, lambda: f"{rid}: unknown state {r.state!r}")
    _require(0 <= r.computed <= r.prompt + r.generated,
             lambda: f"{rid}: computed {r.computed} outside [0, target {r.prompt + r.generated}]")
    _require(0 <= r.generated < r.max_new_tokens,
             lambda: f"running {rid}: generated {r.generated}, max_new_tokens {r.max_new_tokens}")
    want = -(-r.computed // page_size)
    _require(len(table) == want, lambda: f"{rid}: page table {table} for computed {r.computed} "
                                         f"(want {want} pages)")
    for logical, p in enumerate(table):
        _require(0 <= p < pool.num_pages, lambda: f"{rid}: bad page id {p}")
        _require(p not in free_set, lambda: f"{rid}: page table maps free page {p}")
        o = pool.owner[p]
        _require(o is cache_owner or o == rid, lambda: f"{rid}: maps page {p} owned by {o!r}")
        mapped_by.setdefault(p, []).append(rid)
        if o == rid:       # the request's own page holds exactly its own positions below the frontier
            for off in range(page_size):
                pos = logical * page_size + off
                if pos < r.computed:
                    got = pool.slots.slot(p, off)
                    _require(got == (rid, pos), lambda: f"{rid}: page {p} slot {off} holds {got}, "
                                                        f"want {(rid, pos)}")


def _require(holds: bool, message) -> None:
    if not holds:
        raise InvariantBroken(message() if callable(message) else message)

