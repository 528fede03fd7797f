"""Page slot contents: what the control plane's pool and every rank's shard hold.

A slot is empty or holds `(request_id, position)` (SPEC §2). Between two
frees, a page is written by one request at one logical page, so its slots are
`(rid, base + offset)` for a set of offsets: stored as one layer `[rid, base,
mask]` with a bit per offset. A write with another `(rid, base)` (a rank's
shard is never told of frees, so a reused page still holds the old writer's
slots) pushes a new layer on top and clears its bits from the layers below:
the store stays exact and a write costs O(1), not O(tokens).
"""
from __future__ import annotations


class SlotStore:
    __slots__ = ("page_size", "_pages")

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self._pages: list[list[list] | None] = [None] * num_pages

    def write_run(self, page: int, request_id: str, position: int, offset: int, length: int) -> None:
        """Write `(request_id, position + i)` into slots `offset + i` for i < length."""
        bits = ((1 << length) - 1) << offset
        base = position - offset
        layers = self._pages[page]
        if layers is None:
            self._pages[page] = [[request_id, base, bits]]
            return
        top = layers[0]
        if top[0] == request_id and top[1] == base:
            top[2] |= bits
            if len(layers) == 1:
                return
        else:
            top = [request_id, base, bits]
            layers.insert(0, top)
        # Below the top: clear the new bits; an older layer of the same writer merges into
        # the top, so each (rid, base) has one layer and the layers' masks stay disjoint.
        keep = ~bits
        below = []
        for layer in layers[1:]:
            layer[2] &= keep
            if layer[0] == request_id and layer[1] == base:
                top[2] |= layer[2]
            elif layer[2]:
                below.append(layer)
        layers[1:] = below

    def erase_run(self, page: int, request_id: str, position: int, offset: int, length: int) -> None:
        """Forget a run written by `request_id` (the slots become empty)."""
        bits = ((1 << length) - 1) << offset
        for layer in self._pages[page] or ():
            if layer[0] == request_id and layer[1] == position - offset:
                layer[2] &= ~bits

    def write_span(self, pages: tuple[int, ...], request_id: str, start: int, num_tokens: int) -> None:
        """Write positions [start, start + num_tokens) of a request into consecutive pages.

        The hot path of every rank and of the pool: a whole page replaces what
        was there, a page whose top layer is the same writer's is updated in
        place (its bits cleared from the layers below), and anything else goes
        through write_run.
        """
        page_size = self.page_size
        full = (1 << page_size) - 1
        store = self._pages
        position, end = start, start + num_tokens
        for page in pages:
            offset = position % page_size
            length = page_size - offset
            if length > end - position:
                length = end - position
                if length <= 0:
                    return
            base = position - offset
            bits = ((1 << length) - 1) << offset
            layers = store[page]
            if layers is None or bits == full:       # a whole page hides whatever was below
                store[page] = [[request_id, base, bits]]
            else:
                top = layers[0]
                if top[0] != request_id or top[1] != base:
                    self.write_run(page, request_id, position, offset, length)
                elif len(layers) == 1:
                    top[2] |= bits
                elif len(layers) == 2 and (layers[1][0] != request_id or layers[1][1] != base):
                    top[2] |= bits                   # and cleared from the one layer below
                    below = layers[1]
                    below[2] &= ~bits
                    if not below[2]:
                        del layers[1]
                else:
                    self.write_run(page, request_id, position, offset, length)
            position += length

    def clear(self, page: int) -> None:
        self._pages[page] = None

    def slot(self, page: int, offset: int) -> tuple[str, int] | None:
        for rid, base, mask in self._pages[page] or ():
            if mask >> offset & 1:
                return (rid, base + offset)
        return None

    def slots(self, page: int) -> list[tuple[str, int] | None]:
        return [self.slot(page, off) for off in range(self.page_size)]

    def layers(self, page: int) -> list[tuple[str, int, int]]:
        return [tuple(layer) for layer in self._pages[page] or ()]

    def snapshot(self) -> list[tuple[int, list[tuple[str, int, int]]]]:
        """Every non-empty page as (page, layers): compact, for audits and the wire."""
        return [(p, [tuple(layer) for layer in layers])
                for p, layers in enumerate(self._pages) if layers]

    def load(self, snapshot) -> None:
        """Replace the contents with a snapshot (rebuilding a new rank's shard)."""
        self._pages = [None] * len(self._pages)
        for page, layers in snapshot:
            self._pages[page] = [list(layer) for layer in layers]


def first_mismatch(held: SlotStore,
                   shard_layers: dict[int, list]) -> tuple[int, int, tuple, tuple | None] | None:
    """The first slot `held` has that a shard (page -> layers) does not hold the same.

    Returns (page, offset, held slot, shard slot) or None when the shard holds
    every slot that `held` holds. Slots `held` leaves empty are not compared.
    """
    for page, layers in enumerate(held._pages):
        for rid, base, mask in layers or ():
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
