"""Page slot contents: what the control plane's pool and every rank's shard hold.

A slot is empty or holds `(request_id, position)` (SPEC §2). Between two
frees, a page is written by one request at one logical page, so its slots are
`(rid, base + offset)` for a set of offsets: stored as one layer `(rid, base,
mask)` with a bit per offset. A write with another `(rid, base)` (a rank's
shard is never told of frees, so a reused page still holds the old writer's
slots) pushes a new layer on top and clears its bits from the layers below:
the store stays exact and a write costs O(1), not O(tokens).

A page holds None (empty), its one layer (the common case), or a list of
layers, top first, their masks disjoint and one per (rid, base). Layers are
tuples of a string and two integers, which the garbage collector stops
tracking, so a pool of pages costs it nothing to look through.
"""
from __future__ import annotations


def _layers(entry) -> tuple | list:
    """A page's layers, top first, whichever form it is held in."""
    if entry is None:
        return ()
    return (entry,) if type(entry) is tuple else entry


class SlotStore:
    __slots__ = ("page_size", "_pages")

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self._pages: list[tuple | list[tuple] | None] = [None] * num_pages

    def write_run(self, page: int, request_id: str, position: int, offset: int, length: int) -> None:
        """Write `(request_id, position + i)` into slots `offset + i` for i < length."""
        bits = ((1 << length) - 1) << offset
        base = position - offset
        entry = self._pages[page]
        if entry is None:
            self._pages[page] = (request_id, base, bits)
            return
        layers = _layers(entry)
        top = layers[0]
        if top[0] == request_id and top[1] == base:
            mask, rest = top[2] | bits, layers[1:]
        else:
            mask, rest = bits, layers
        # Below the top: clear the new bits; an older layer of the same writer merges into
        # the top, so each (rid, base) has one layer and the layers' masks stay disjoint.
        keep = ~bits
        below = []
        for rid, b, m in rest:
            m &= keep
            if rid == request_id and b == base:
                mask |= m
            elif m:
                below.append((rid, b, m))
        top = (request_id, base, mask)
        self._pages[page] = [top, *below] if below else top

    def erase_run(self, page: int, request_id: str, position: int, offset: int, length: int) -> None:
        """Forget a run written by `request_id` (the slots become empty)."""
        keep = ~(((1 << length) - 1) << offset)
        base = position - offset
        entry = self._pages[page]
        if type(entry) is tuple:
            if entry[0] == request_id and entry[1] == base:
                self._pages[page] = (entry[0], base, entry[2] & keep)
        elif entry is not None:
            for i, (rid, b, m) in enumerate(entry):
                if rid == request_id and b == base:
                    entry[i] = (rid, b, m & keep)

    def write_span(self, pages: tuple[int, ...], request_id: str, start: int, num_tokens: int) -> None:
        """Write positions [start, start + num_tokens) of a request into consecutive pages.

        The hot path of every rank and of the pool: a whole page replaces what
        was there, a page whose top layer is the same writer's is updated in
        place (its bits cleared from the one layer below, if any), and anything
        else goes through write_run.
        """
        page_size = self.page_size
        store = self._pages
        position, end = start, start + num_tokens
        for page in pages:
            offset = position % page_size
            base = position - offset
            stop = end - base                        # this page's slots [offset, stop) are written
            if stop >= page_size:
                stop = page_size
                if not offset:                       # a whole page hides whatever was below
                    store[page] = (request_id, base, (1 << page_size) - 1)
                    position = base + page_size
                    continue
            elif stop <= offset:                     # pages past the span's end
                return
            bits = (1 << stop) - (1 << offset)
            entry = store[page]
            if entry is None:
                store[page] = (request_id, base, bits)
            elif type(entry) is tuple:
                if entry[0] == request_id and entry[1] == base:
                    store[page] = (request_id, base, entry[2] | bits)
                else:
                    self.write_run(page, request_id, position, offset, stop - offset)
            else:
                top, below = entry[0], entry[1]
                if (len(entry) == 2 and top[0] == request_id and top[1] == base
                        and (below[0] != request_id or below[1] != base)):
                    top = (request_id, base, top[2] | bits)
                    m = below[2] & ~bits
                    store[page] = [top, (below[0], below[1], m)] if m else top
                else:
                    self.write_run(page, request_id, position, offset, stop - offset)
            position = base + stop

    def clear(self, page: int) -> None:
        self._pages[page] = None

    def slot(self, page: int, offset: int) -> tuple[str, int] | None:
        for rid, base, mask in _layers(self._pages[page]):
            if mask >> offset & 1:
                return (rid, base + offset)
        return None

    def slots(self, page: int) -> list[tuple[str, int] | None]:
        return [self.slot(page, off) for off in range(self.page_size)]

    def layers(self, page: int) -> list[tuple[str, int, int]]:
        return list(_layers(self._pages[page]))

    def snapshot(self) -> list[tuple[int, list[tuple[str, int, int]]]]:
        """Every non-empty page as (page, layers): compact, for audits and the wire."""
        return [(p, list(_layers(entry))) for p, entry in enumerate(self._pages) if entry]

    def load(self, snapshot) -> None:
        """Replace the contents with a snapshot (rebuilding a new rank's shard)."""
        self._pages = [None] * len(self._pages)
        for page, layers in snapshot:
            layers = [tuple(layer) for layer in layers]
            self._pages[page] = None if not layers else layers[0] if len(layers) == 1 else layers


def first_mismatch(held: SlotStore,
                   shard_layers: dict[int, list]) -> tuple[int, int, tuple, tuple | None] | None:
    """The first slot `held` has that a shard (page -> layers) does not hold the same.

    Returns (page, offset, held slot, shard slot) or None when the shard holds
    every slot that `held` holds. Slots `held` leaves empty are not compared.
    """
    for page, entry in enumerate(held._pages):
        for rid, base, mask in _layers(entry):
            have = 0
            for s_rid, s_base, s_mask in shard_layers.get(page, ()):
                if s_rid == rid and s_base == base:
                    have |= s_mask
            missing = mask & ~have
            if missing:
                offset = (missing & -missing).bit_length() - 1
                got = None
                for s_rid, s_base, s_mask in shard_layers.get(page, ()):
                    if s_mask >> offset & 1:
                        got = (s_rid, s_base + offset)
                return page, offset, (rid, base + offset), got
    return None
