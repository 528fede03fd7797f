"""Prefix keys and the radix cache (SPEC §2, "Prefix keys and the radix cache").

The key of prompt block j is (namespace, key of block j-1 or ROOT, the block's
tokens). Hashing that nested triple would re-hash the whole chain at every
level, so each distinct (parent key, block tokens) pair is interned once as a
small integer: two requests get the same integer for block j exactly when
their first (j+1)*page_size tokens are equal, which is the SPEC's equality.
The namespace is one constant per engine, so it is the key table itself.

The cache is a tree of nodes, children kept in insertion order. Eviction wants
"the first leaf in tree order whose page nobody maps": every node carries its
path of per-parent insertion numbers, which sorts exactly in depth-first
pre-order, and evictable leaves wait in a heap by that path (entries that went
stale are skipped when popped). An eviction costs O(log n), not a tree walk.
"""
from __future__ import annotations

import heapq

ROOT_KEY = 0


class KeyTable:
    """Interned prefix keys: (parent key, block tokens) -> int, ROOT is 0."""

    __slots__ = ("_ids",)

    def __init__(self):
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def chain(self, tokens: tuple[int, ...], page_size: int) -> list[int]:
        """Keys of the complete blocks of a prompt, block 0 first."""
        ids = self._ids
        keys: list[int] = []
        parent = ROOT_KEY
        for start in range(0, len(tokens) - page_size + 1, page_size):
            pair = (parent, tokens[start:start + page_size])
            key = ids.get(pair)
            if key is None:
                key = ids[pair] = len(ids) + 1
            keys.append(key)
            parent = key
        return keys


class Node:
    __slots__ = ("key", "page", "parent", "children", "path", "num_children_made", "alive", "queued")

    def __init__(self, key: int, page: int, parent: "Node | None", path: tuple[int, ...]):
        self.key = key
        self.page = page
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.path = path                 # per-parent insertion numbers from ROOT: sorts in tree order
        self.num_children_made = 0
        self.alive = True
        self.queued = False              # has an entry in the evictable heap


class RadixCache:
    def __init__(self):
        self.root = Node(ROOT_KEY, -1, None, ())
        self.node_of_page: dict[int, Node] = {}
        self.new_root_keys: list[int] = []      # keys hung under ROOT since take_new_root_keys()
        self._evictable: list[tuple[tuple[int, ...], Node]] = []

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
        """Hang a chain of new nodes (keys[i] holding pages[i]) under `node`; returns the last."""
        if node is self.root and keys:
            self.new_root_keys.append(keys[0])
        for key, page in zip(keys, pages):
            path = node.path + (node.num_children_made,)
            node.num_children_made += 1
            child = Node(key, page, node, path)
            node.children[key] = child
            self.node_of_page[page] = child
            node = child
        if refs[node.page] == 0:      # publishing keeps it mapped; other callers may not
            self.note_unreferenced(node.page)
        return node

    def note_unreferenced(self, page: int) -> None:
        """A cache page lost its last mapping: a candidate if its node is a leaf."""
        node = self.node_of_page[page]
        if not node.children:
            self._queue(node)

    def _queue(self, node: Node) -> None:
        if not node.queued:
            node.queued = True
            heapq.heappush(self._evictable, (node.path, node))

    def evict_one(self, refs: list[int]) -> int | None:
        """Remove the first leaf in tree order whose page is unmapped; its page, or None."""
        heap = self._evictable
        while heap:
            _, node = heapq.heappop(heap)
            node.queued = False
            if node.alive and not node.children and refs[node.page] == 0:
                self._remove(node)
                parent = node.parent
                if parent is not self.root and not parent.children and refs[parent.page] == 0:
                    self._queue(parent)
                return node.page
        return None

    def _remove(self, node: Node) -> None:
        node.alive = False
        del node.parent.children[node.key]
        del self.node_of_page[node.page]

    def clear(self) -> list[int]:
        """Drop every node; returns the pages they held, in tree order."""
        pages = [n.page for n in self.tree_order()]
        for node in self.node_of_page.values():
            node.alive = False
        self.root.alive = False
        self.root = Node(ROOT_KEY, -1, None, ())
        self.node_of_page.clear()
        self._evictable.clear()
        return pages

    def tree_order(self):
        """Every node, depth-first, each before its children, children in insertion order."""
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))
