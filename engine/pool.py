"""The page pool (SPEC §2): owners, the free list, and the slots of each page.

The free list starts ascending; pages are taken from its front and freed to
its back. A page's owner is a request id, `CACHE`, or None (free). Freeing a
page empties its slots.

`refs` counts, for cache-owned pages only, how many page tables map the page:
a cache page is evictable only at refs 0 (phase 5). A request's own page is
mapped by its owner alone, so it needs no count.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from .shard import SlotStore


class _Cache:
    def __repr__(self) -> str:
        return "CACHE"


CACHE = _Cache()


def pages_needed(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


class PagePool:
    __slots__ = ("num_pages", "page_size", "owner", "refs", "slots", "_free", "on_unreferenced",
                 "writing", "held")

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        self.owner: list = [None] * num_pages
        self.refs = [0] * num_pages
        self.slots = SlotStore(num_pages, page_size)
        self._free = deque(range(num_pages))
        # Told when a cache page's last mapping goes: it may now be evictable.
        self.on_unreferenced: Callable[[int], None] = lambda page: None
        # Overlap scheduling (engine/overlap.py): page -> the last step in flight whose plan
        # writes it. A page freed while such a plan may still write it is held back from the
        # free list (in `held`, by that step) until the plan has landed. Empty at other rungs.
        self.writing: dict[int, int] = {}
        self.held: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def take(self, owner: str) -> int:
        return self.take_pages(owner, 1)[0]

    def take_pages(self, owner: str, count: int) -> list[int]:
        """The first `count` pages of the free list, in its order, now `owner`'s."""
        take = self._free.popleft
        pages = [take() for _ in range(count)]
        own = self.owner
        for page in pages:
            own[page] = owner
        return pages

    def free(self, page: int) -> None:
        self.free_many((page,))

    def free_many(self, pages) -> None:
        """Free each page in turn: no owner, its slots emptied, to the back of the free list."""
        owner, refs, clear, writing = self.owner, self.refs, self.slots.clear, self.writing
        for page in pages:
            owner[page] = None
            refs[page] = 0
            clear(page)
            step = writing.get(page)
            if step is None:
                self._free.append(page)
            else:                               # a plan in flight may still write it: it waits
                self.held.setdefault(step, []).append(page)

    def plan_in_flight(self, step: int, placements) -> None:
        """Overlap: the plan of `step` went out; until it lands, a page it writes is not reused."""
        writing = self.writing
        for pages in placements:
            for page in pages:
                writing[page] = step

    def plans_withdrawn(self) -> None:
        """Overlap: no plan is in flight any more (a recompute plans again from nothing): every
        page held back goes to the free list, oldest plan's first."""
        self.writing.clear()
        for step in sorted(self.held):
            self._free.extend(self.held.pop(step))

    def plan_landed(self, step: int, placements) -> None:
        """Overlap: the plan of `step` has executed; the pages freed while it could write them
        go to the free list (in the order they were freed)."""
        writing = self.writing
        for pages in placements:
            for page in pages:
                if writing.get(page) == step:
                    del writing[page]
        self._free.extend(self.held.pop(step, ()))

    def give_to_cache(self, page: int) -> None:
        """A published page: still mapped by the request that wrote it."""
        self.give_pages_to_cache((page,))

    def give_pages_to_cache(self, pages) -> None:
        owner, refs = self.owner, self.refs
        for page in pages:
            owner[page] = CACHE
            refs[page] = 1

    def map_cached(self, page: int) -> None:
        self.refs[page] += 1

    def unmap(self, page: int, holder: str) -> None:
        """`holder` drops `page` from its page table: its own page is freed."""
        self.unmap_pages((page,), holder)

    def unmap_pages(self, pages, holder: str) -> None:
        """`unmap` of each page in turn (the request's own pages freed in that order, after the
        cache pages' counts: a count is no part of the free list)."""
        owner, refs = self.owner, self.refs
        own = []
        for page in pages:
            if owner[page] is CACHE:
                refs[page] -= 1
                if refs[page] == 0:
                    self.on_unreferenced(page)
            else:
                own.append(page)
        if own:
            self.free_many(own)
