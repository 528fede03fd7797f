"""Residency (SPEC §3, phase 5): give the step's work its pages by extending,
evicting cache leaves, or preempting requests.

The anchor (the first scheduled request) is never preempted: if it alone
outgrows the pool the step is Irreducible. Otherwise, until the work fits:
extend if the shortfall fits the free list; else evict unmapped cache leaves
in tree order; else preempt the last request (in request order) that holds
pages or is still in the work.
"""
from __future__ import annotations

import heapq

from .errors import Irreducible, OutOfPages
from .pool import PagePool, pages_needed
from .prefix import RadixCache
from .request import Request, State

Work = list  # [(request, num_tokens, decode), ...] in request order


class Holders:
    """RUNNING requests whose page table is non-empty, last in request order first.

    A lazy max-heap: a request is pushed when its page table fills and
    dropped when found empty at the top, so finding the victim is O(log n).
    """

    def __init__(self):
        self._heap: list[tuple[int, Request]] = []

    def add(self, req: Request) -> None:
        if not req.in_holders:
            req.in_holders = True
            heapq.heappush(self._heap, (-req.index, req))

    def last(self) -> Request | None:
        heap = self._heap
        while heap:
            req = heap[0][1]
            if req.state is State.RUNNING and req.page_table:
                return req
            heapq.heappop(heap)
            req.in_holders = False
        return None


FULL_RELIEFS = ("evict", "preempt")
# Overlap (engine/overlap.py): a step planned while another is in flight does not preempt
# (a victim's pages that the step in flight writes could not be handed on until it lands);
# work that does not fit after evicting waits for a later step ("defer": dropped from the
# work, last first, the anchor too). An anchor that outgrows the whole pool is deferred too:
# planned from assumed tokens, it is Irreducible only if the step after the commit says so.
AHEAD_RELIEFS = ("evict", "defer")


def make_resident(work: Work, pool: PagePool, cache: RadixCache, holders: Holders,
                  evicted: list[int], preempted: list[Request],
                  reliefs: tuple[str, ...] = FULL_RELIEFS) -> None:
    """Phase 5: on return every work entry has the pages it needs, in work order.

    Appends evicted page ids and preempted requests to the lists given, and
    drops preempted requests from `work`. `reliefs` are what may free pages,
    tried in order each round (the full engine: evict, then preempt; lower rungs
    of the ladder: preempt then evict, preempt only, or nothing at all, when a
    short pool is simply fatal).
    """
    page_size = pool.page_size
    if not reliefs:
        shortfall = _shortfall(work, page_size)
        if shortfall > pool.num_free:
            raise OutOfPages(f"need {shortfall} more pages, {pool.num_free} free")
        _extend(work, pool, holders)
        return
    anchor, anchor_tokens, _ = work[0]
    if pages_needed(anchor.computed + anchor_tokens, page_size) > pool.num_pages:
        if "defer" in reliefs:         # planned ahead, from assumed tokens: reality may differ
            work.clear()
            return
        raise Irreducible(f"{anchor.request_id} alone outgrows the pool: needs "
                          f"{pages_needed(anchor.computed + anchor_tokens, page_size)} pages, "
                          f"the pool has {pool.num_pages}")
    # The shortfall changes only when a victim leaves the work: kept, not recounted.
    shortfall = _shortfall(work, page_size)
    while True:
        if shortfall <= pool.num_free:
            _extend(work, pool, holders)
            return
        for relief in reliefs:
            if relief == "evict" and _evict(shortfall - pool.num_free, pool, cache, evicted):
                break
            if relief == "defer" and work:
                req, n, _ = work.pop()
                shortfall -= _short(req, n, page_size)
                break
            if relief == "preempt":
                victim = _victim(work, holders, anchor)
                if victim is not None:
                    if work[-1][0] is victim:
                        shortfall -= _short(victim, work.pop()[1], page_size)
                    preempt(victim, pool)
                    preempted.append(victim)
                    break
        else:
            raise OutOfPages(f"no request left to preempt for {shortfall} pages "
                             f"({pool.num_free} free)")


def _shortfall(work: Work, page_size: int) -> int:
    """Pages the work's requests lack for this step's tokens, all told."""
    total = 0
    for req, n, _ in work:
        lack = pages_needed(req.computed + n, page_size) - len(req.page_table)
        if lack > 0:
            total += lack
    return total


def _short(req: Request, num_tokens: int, page_size: int) -> int:
    """Pages the request lacks for this step's tokens."""
    return _shortfall(((req, num_tokens, None),), page_size)


def _extend(work: Work, pool: PagePool, holders: Holders) -> None:
    page_size = pool.page_size
    take, hold = pool.take_pages, holders.add
    for req, n, _ in work:
        table = req.page_table
        missing = pages_needed(req.computed + n, page_size) - len(table)
        if missing > 0:
            table += take(req.request_id, missing)
        hold(req)


def _evict(num_wanted: int, pool: PagePool, cache: RadixCache, evicted: list[int]) -> int:
    """Evict up to `num_wanted` unmapped cache leaves, first in tree order first."""
    pages = cache.evict(num_wanted, pool.refs)
    pool.free_many(pages)
    evicted += pages
    return len(pages)


def _victim(work: Work, holders: Holders, anchor: Request) -> Request | None:
    """The last RUNNING request, not the anchor, holding pages or still in the work.

    Requests past the last work entry were not reached by the budget; among
    them only holders count. So the victim is the later of the last holder and
    the last work entry.
    """
    candidate = holders.last()
    last_work = work[-1][0]
    if candidate is None or last_work.index > candidate.index:
        candidate = last_work
    return None if candidate is anchor else candidate


def preempt(req: Request, pool: PagePool) -> None:
    """The request loses its pages and starts again from 0; it stays RUNNING."""
    release_pages(req, pool)
    req.computed = 0


def release_pages(req: Request, pool: PagePool) -> None:
    """Free the pages the request owns, in page table order; cache pages stay cached."""
    pool.unmap_pages(req.page_table, req.request_id)
    req.page_table = []
