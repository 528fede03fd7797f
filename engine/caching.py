"""Cache-aware scheduling: reuse a cached prefix (phase 2) and publish one (phase 11).

Eviction, the third part, is a residency decision and lives in residency.py.
Each request keeps a cursor (node, depth) into the cache: how much of its own
prefix chain the cache is known to hold. A node is removed only as a leaf, so
while the cursor's node is alive every node above it is too, and publishing
walks only the new blocks instead of re-matching the whole prefix each step.
"""
from __future__ import annotations

from .pool import PagePool
from .prefix import KeyTable, RadixCache
from .request import Request


class ReuseQueue:
    """Phase 2's candidates, without re-matching every waiting request every step.

    A RUNNING request with nothing computed and no pages is a candidate the
    step it is admitted or preempted. One whose match found nothing waits on
    its first block's key: it can hit only once a node with that key hangs
    under the cache's root, and the cache reports every such insertion. A
    prompt of page_size tokens or fewer can never reuse and never waits.
    """

    def __init__(self):
        self._now: dict[int, Request] = {}
        self._waiting: dict[int, dict[int, Request]] = {}

    def add(self, req: Request) -> None:
        self._now[req.index] = req

    def wait(self, req: Request, first_key: int) -> None:
        self._waiting.setdefault(first_key, {})[req.index] = req

    def take(self, new_root_keys: list[int]) -> list[Request]:
        """This step's candidates, in request order."""
        for key in new_root_keys:
            self._now.update(self._waiting.pop(key, {}))
        ready = [self._now[i] for i in sorted(self._now)]
        self._now.clear()
        return ready


def prefix_keys(req: Request, keys: KeyTable, page_size: int) -> list[int]:
    if req.prefix_keys is None:
        req.prefix_keys = keys.chain(req.tokens, page_size)
    return req.prefix_keys


def reuse(req: Request, cache: RadixCache, pool: PagePool, keys: KeyTable) -> int:
    """Phase 2 for a RUNNING request with nothing computed and no pages; returns `computed`.

    At most (prompt - 1) // page_size blocks are reused: the last prompt token
    is always computed, so the step that finishes the prompt can sample.
    """
    page_size = pool.page_size
    usable_cap = (req.prompt - 1) // page_size
    if usable_cap <= 0 or not len(cache):
        return 0
    pages, _, _ = cache.match(prefix_keys(req, keys, page_size), usable_cap)
    if not pages:
        return 0
    for page in pages:
        pool.map_cached(page)
    req.page_table = pages
    req.computed = len(pages) * page_size
    return req.computed


def publish(req: Request, cache: RadixCache, pool: PagePool, keys: KeyTable) -> int:
    """Phase 11: hand the request's complete prompt blocks the cache lacks to the cache.

    Returns how many blocks were published (complete - resident).
    """
    page_size = pool.page_size
    complete = min(req.computed, req.prompt) // page_size
    node, depth = req.cache_cursor or (None, 0)
    if node is None or not node.alive:
        node, depth = None, 0
    if complete <= depth:
        return 0
    chain = prefix_keys(req, keys, page_size)
    _, node, resident = cache.match(chain, complete, node, depth)
    if resident < complete:
        own = req.page_table[resident:complete]
        pool.give_pages_to_cache(own)
        node = cache.insert_below(node, chain[resident:complete], own, pool.refs)
    req.cache_cursor = (node, complete)
    return complete - resident
