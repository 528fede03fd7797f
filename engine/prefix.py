"""Prefix keys and the radix cache (SPEC §2, "Prefix keys and the radix cache").

The key of prompt block j is (namespace, key of block j-1 or ROOT, the block's
tokens). Hashing that nested triple would re-hash the whole chain at every
level, so each distinct (parent key, block tokens) pair is interned once as a
small integer: two requests get the same integer for block j exactly when
their first (j+1)*page_size tokens are equal, which is the SPEC's equality.
The namespace is one constant per engine, so it is the key table itself.

The cache is a tree of nodes, children kept in insertion order. Eviction wants
"the first leaf in tree order whose page nobody maps", without a tree walk and
without any node storing its path from the root (a path is O(depth), so one
long prompt would cost O(depth^2) memory: 4 GB for 32k blocks). Each node
stores only what it adds:

- Tree order is kept as a list, an Euler tour: every node has an enter token
  (the node itself) and an exit token, in one doubly linked list from ROOT to
  ROOT's exit. A node's subtree lies between its enter and its exit, so the
  enters, read in list order, are depth-first pre-order. A new child goes last
  among its siblings, which is just before its parent's exit: found in O(1).
  A chain of new nodes goes there as one block (enters, then exits in
  reverse). A leaf's enter and exit are adjacent; removing it unlinks both.
- Order maintenance (Bender, Cole, Demaine, Farach-Colton, Zito, "Two
  simplified algorithms for maintaining order in a list", ESA 2002): every
  token carries an integer label, strictly increasing along the list, so two
  nodes compare in tree order as two integers. New tokens take labels inside
  the gap where they go (see `insert_below`). When that gap is too small, the
  smallest aligned range of 2^i labels around the insertion point that holds
  at most (2/T)^i tokens, the new ones included, is found by walking outwards
  and its tokens are relabelled evenly: O(log n) amortised relabels per
  inserted node. Labels start within 2^LABEL_BITS and may grow past it (they
  are Python integers), so nothing overflows; they stay O(log n) bits.
- Evictable leaves wait in a heap of (label, node). A relabelling keeps the
  order of all tokens, so an entry whose label went out of date is left where
  it is: the relabelled queued nodes are pushed again at their new labels, and
  an entry counts only while its label is its node's and the node is queued;
  the rest are skipped when popped, like the entries of nodes that have since
  gained a child or a mapping. When stale entries outnumber live ones the heap
  is rebuilt, so it stays O(queued nodes). An eviction costs O(log n)
  amortised, not a tree walk; a parent left an unmapped leaf by the eviction
  of its last child is the first leaf in tree order then, so when more pages
  are wanted it goes next without passing through the heap.

Per node: the Node (key, page, parent, children, its insertion number among
its siblings, a label, two links) and one exit token (a label, two links);
nothing grows with depth. `Node.path` (the per-parent insertion numbers from
ROOT, which sort exactly as the labels do) is computed on demand by walking
up, O(depth), for state snapshots and tests; the engine never calls it.
"""
from __future__ import annotations

import heapq

ROOT_KEY = 0
LABEL_BITS = 120                # the root's two tokens are labelled 0 and 2^LABEL_BITS to begin with
_DENSITY = 2 / 1.8              # 2/T, T = 1.8: an aligned range of 2^i labels may hold (2/T)^i tokens


class KeyTable:
    """Interned prefix keys: (parent key, block tokens) -> int, ROOT is 0."""

    __slots__ = ("_ids",)

    def __init__(self):
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def chain(self, tokens: tuple[int, ...], page_size: int) -> list[int]:
        """Keys of the complete blocks of a prompt, block 0 first."""
        ids = self._ids
        get = ids.get
        keys: list[int] = []
        add = keys.append
        if len(tokens) < page_size:       # no complete block (and page_size may be huge)
            return keys
        key = ROOT_KEY
        # zip over page_size references to one iterator: the complete blocks, a partial one dropped
        for block in zip(*[iter(tokens)] * page_size):
            pair = (key, block)
            key = get(pair)
            if key is None:
                key = ids[pair] = len(ids) + 1
            add(key)
        return keys


class _Exit:
    """The token that closes a node's subtree in the tour; never queued."""

    __slots__ = ("label", "prev", "next")    # set when it is linked into the tour
    queued = False


class Node:
    """One cached block; also its own enter token in the tour (label, prev, next)."""

    __slots__ = ("key", "page", "parent", "children", "ordinal", "num_children_made", "alive", "queued",
                 "label", "prev", "next", "exit")

    def __init__(self, key: int, page: int, parent: "Node | None", ordinal: int):
        self.key = key
        self.page = page
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.ordinal = ordinal           # insertion number among its parent's children, ever
        self.num_children_made = 0
        self.alive = True
        self.queued = False              # has a live entry in the evictable heap
        self.exit = _Exit()              # label, prev, next: set when linked into the tour

    def __lt__(self, other: "Node") -> bool:
        # Only for heap entries whose labels tie, which happens only between an entry left
        # stale by a relabelling and another: whichever pops first, the stale one is skipped.
        return id(self) < id(other)

    @property
    def path(self) -> tuple[int, ...]:
        """Per-parent insertion numbers from ROOT (sorts in tree order); O(depth), for snapshots."""
        numbers = []
        node = self
        while node.parent is not None:
            numbers.append(node.ordinal)
            node = node.parent
        return tuple(reversed(numbers))


class RadixCache:
    def __init__(self):
        self.root = self._new_root()
        self.node_of_page: dict[int, Node] = {}
        self.new_root_keys: list[int] = []      # keys hung under ROOT since take_new_root_keys()
        self._evictable: list[tuple[int, Node]] = []     # (label when pushed, node)
        self._num_queued = 0                    # nodes with queued set: the heap's live entries

    @staticmethod
    def _new_root() -> Node:
        root = Node(ROOT_KEY, -1, None, 0)
        end = root.exit
        root.prev, root.next, end.prev, end.next = None, end, root, None
        root.label, end.label = 0, 1 << LABEL_BITS
        return root

    def __len__(self) -> int:
        return len(self.node_of_page)

    def match(self, keys: list[int], limit: int, start: Node | None = None, depth: int = 0):
        """Walk from `start` (ROOT) along keys[depth:limit]; stop at the first absent key.

        Returns (pages found, last node reached, its depth).
        """
        node = start or self.root
        pages: list[int] = []
        while depth < limit:
            child = node.children.get(keys[depth])
            if child is None:
                break
            pages.append(child.page)
            node = child
            depth += 1
        return pages, node, depth

    def take_new_root_keys(self) -> list[int]:
        keys, self.new_root_keys = self.new_root_keys, []
        return keys

    def insert_below(self, node: Node, keys: list[int], pages: list[int], refs: list[int]) -> Node:
        """Hang a chain of new nodes (keys[i] holding pages[i]) under `node`; returns the last.

        In the tour the chain goes last under `node`, just before its exit, as
        enter_1 .. enter_m, exit_m .. exit_1, and takes the first half of the
        label gap there (the second half stays for `node`'s later children).
        The enters get consecutive labels, since nothing is ever inserted
        between two enters; the exits spread evenly over the rest of the half,
        and the gap just before each exit is where that node's own children
        will go. A gap too small for that is relabelled (`_relabel`).
        """
        if node is self.root and keys:
            self.new_root_keys.append(keys[0])
        parent = node
        before = parent.exit
        after = prev = before.prev
        m = min(len(keys), len(pages))
        share = (before.label - after.label) // 2
        fits = share >= 2 * m
        label = after.label
        node_of_page = self.node_of_page
        for key, page in zip(keys, pages):
            child = Node(key, page, node, node.num_children_made)
            node.num_children_made += 1
            node.children[key] = child
            node_of_page[page] = child
            label += 1
            child.label = label
            prev.next = child
            child.prev = prev
            prev = node = child
        if m:
            step = (share - m) // m if fits else 0
            closing = node
            while closing is not parent:
                token = closing.exit
                label += step
                token.label = label
                prev.next = token
                token.prev = prev
                prev = token
                closing = closing.parent
            prev.next = before
            before.prev = prev
            if not fits:
                self._relabel(after, before, 2 * m)
        if refs[node.page] == 0:      # publishing keeps it mapped; other callers may not
            self.note_unreferenced(node.page)
        return node

    # -- relabelling -------------------------------------------------------------------------------

    def _relabel(self, after, before, k: int) -> None:
        """Relabel the smallest sparse enough range around the k new tokens between after and before.

        The range at level i is the aligned block of 2^i labels holding
        after.label; it is sparse enough when its tokens and the new ones
        number at most (2/T)^i. Walking outwards finds it in time proportional
        to what it holds, and its tokens (with the new ones) are spread evenly
        over it.
        """
        first, last = after, before.prev     # the new tokens' labels mean nothing yet
        count = 1
        label = after.label
        level = max(1, (k + 1).bit_length())
        while True:
            base = (label >> level) << level
            end = base + (1 << level)
            while first.prev is not None and first.prev.label >= base:
                first = first.prev
                count += 1
            while last.next is not None and last.next.label < end:
                last = last.next
                count += 1
            if count + k <= _DENSITY ** level:
                break
            level += 1
        stop = last.next                     # the first token past the range (None at the end)
        step = (end - base) // (count + k)   # >= 1: (2/T)^i <= 2^i
        heap = self._evictable
        token = first
        new = base + step // 2               # half a step of room at either end of the range
        while token is not stop:
            if token.queued and token.label != new:   # its old entry goes stale; the new one sorts right
                heapq.heappush(heap, (new, token))
            token.label = new
            new += step
            token = token.next
        if len(heap) > 2 * self._num_queued + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the heap's stale entries: one entry per queued node, at its label."""
        seen: set[int] = set()
        live = []
        for label, node in self._evictable:
            if node.queued and label == node.label and id(node) not in seen:
                seen.add(id(node))
                live.append((label, node))
        heapq.heapify(live)
        self._evictable = live

    # -- eviction --------------------------------------------------------------------------------

    def note_unreferenced(self, page: int) -> None:
        """A cache page lost its last mapping: a candidate if its node is a leaf."""
        node = self.node_of_page[page]
        if not node.children:
            self._queue(node)

    def _queue(self, node: Node) -> None:
        if not node.queued:
            node.queued = True
            self._num_queued += 1
            heapq.heappush(self._evictable, (node.label, node))

    def evict_one(self, refs: list[int]) -> int | None:
        """Remove the first leaf in tree order whose page is unmapped; its page, or None."""
        pages = self.evict(1, refs)
        return pages[0] if pages else None

    def evict(self, num_wanted: int, refs: list[int]) -> list[int]:
        """`evict_one` until `num_wanted` pages are evicted or none is left: the pages, in order."""
        heap = self._evictable
        pop = heapq.heappop
        root = self.root
        pages: list[int] = []
        while heap and len(pages) < num_wanted:
            label, node = pop(heap)
            if not node.queued or label != node.label:
                continue                     # stale: relabelled since, or already popped
            node.queued = False
            self._num_queued -= 1
            if not (node.alive and not node.children and refs[node.page] == 0):
                continue
            while True:
                parent = node.parent
                self._remove(node)
                pages.append(node.page)
                if parent is root or parent.children or refs[parent.page] != 0:
                    break
                if len(pages) == num_wanted:
                    self._queue(parent)
                    break
                # The parent, now an unmapped leaf, is the first in tree order: it comes before
                # the leaf just removed, and every live entry left in the heap comes after that
                # leaf. So it goes next, without a round trip through the heap.
                if parent.queued:
                    parent.queued = False
                    self._num_queued -= 1
                node = parent
        return pages

    def _remove(self, node: Node) -> None:
        node.alive = False
        del node.parent.children[node.key]
        del self.node_of_page[node.page]
        end = node.exit                      # a leaf's enter and exit are adjacent
        before, after = node.prev, end.next
        before.next = after
        after.prev = before
        # A removed node may still be held (a request's cache cursor, which only asks `alive`):
        # let it hold nothing else, neither its exit nor its neighbours nor its ancestors.
        node.prev = node.next = node.exit = node.parent = None

    def clear(self) -> list[int]:
        """Drop every node; returns the pages they held, in tree order."""
        pages = [n.page for n in self.tree_order()]
        for node in self.node_of_page.values():
            node.alive = False
        self.root.alive = False
        self.root = self._new_root()
        self.node_of_page.clear()
        self._evictable.clear()
        self._num_queued = 0
        return pages

    def tree_order(self):
        """Every node, depth-first, each before its children, children in insertion order."""
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))
