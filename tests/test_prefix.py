"""Prefix keys and the radix cache (SPEC §2)."""
from inferris_dist.engine.prefix import ROOT_KEY, KeyTable, RadixCache

# -- KeyTable --------------------------------------------------------------------------------

def test_only_complete_blocks_have_keys():
    kt = KeyTable()
    assert kt.chain((1, 2, 3), 4) == []
    assert len(kt.chain(tuple(range(7)), 4)) == 1
    assert len(kt.chain(tuple(range(8)), 4)) == 2
    assert len(kt.chain(tuple(range(9)), 4)) == 2
    assert len(kt.chain((5,), 1)) == 1


def test_equal_prefixes_share_keys():
    kt = KeyTable()
    a = kt.chain((1, 2, 3, 4, 5, 6, 7), 2)
    b = kt.chain((1, 2, 3, 4, 5, 6, 8, 9), 2)
    assert len(a) == 3 and len(b) == 4
    assert a == b[:3]
    assert kt.chain((1, 2, 3, 4, 5, 6, 7), 2) == a     # asking again gives the same keys
    assert ROOT_KEY not in a + b


def test_a_differing_block_changes_every_later_key():
    kt = KeyTable()
    a = kt.chain((1, 2, 3, 4, 5, 6), 2)
    b = kt.chain((1, 2, 9, 4, 5, 6), 2)
    assert a[0] == b[0]
    # Blocks 1 and 2 hold (3,4)/(9,4) and (5,6)/(5,6): block 2's tokens are equal but its
    # parent differs, so its key differs too.
    assert a[1] != b[1] and a[2] != b[2]
    c = kt.chain((9, 2, 3, 4, 5, 6), 2)
    assert set(c).isdisjoint(a)


def test_same_block_tokens_at_another_depth_get_another_key():
    kt = KeyTable()
    k0, k1 = kt.chain((1, 2, 1, 2), 2)
    assert k0 != k1
    assert kt.chain((1, 2), 2) == [k0]


def test_keys_depend_on_page_size():
    kt = KeyTable()
    assert kt.chain((1, 2, 3, 4), 2)[0] != kt.chain((1, 2, 3, 4), 4)[0]


# -- RadixCache ------------------------------------------------------------------------------

def build(refs):
    """A(10) -> {B(11), D(13)}, C(12) at the root; A, B, C inserted first, D last.

    Tree order (pre-order, children in insertion order): A, B, D, C.
    """
    cache = RadixCache()
    cache.insert_below(cache.root, [1, 2], [10, 11], refs)
    cache.insert_below(cache.root, [3], [12], refs)
    _, a, depth = cache.match([1], 1)
    assert depth == 1
    cache.insert_below(a, [4], [13], refs)
    return cache


def drain(cache, refs):
    out = []
    while (page := cache.evict_one(refs)) is not None:
        out.append(page)
    return out


def test_match_walks_until_the_first_absent_key():
    refs = [0] * 16
    cache = build(refs)
    assert cache.match([1, 2, 5], 3)[0] == [10, 11]
    assert cache.match([1, 4], 2)[0] == [10, 13]
    assert cache.match([3, 2], 2)[0] == [12]
    assert cache.match([2, 1], 2)[0] == []          # 2 is not a child of ROOT
    assert cache.match([1, 2], 1)[0] == [10]        # the limit stops the walk
    assert cache.match([], 0)[0] == []
    pages, node, depth = cache.match([1, 2], 2)
    assert (pages, node.page, depth) == ([10, 11], 11, 2)


def test_match_from_a_node():
    refs = [0] * 16
    cache = build(refs)
    _, a, depth = cache.match([1, 4], 1)
    pages, node, depth = cache.match([1, 4], 2, a, depth)
    assert (pages, node.page, depth) == ([13], 13, 2)


def test_tree_order_is_preorder_with_children_in_insertion_order():
    refs = [0] * 16
    cache = build(refs)
    assert [n.page for n in cache.tree_order()] == [10, 11, 13, 12]
    assert len(cache) == 4


def test_evict_first_leaf_in_tree_order_parent_after_last_child():
    refs = [0] * 16
    cache = build(refs)
    # Leaves B, D, C: B first; A is not a leaf until D is gone too; then A precedes C.
    assert drain(cache, refs) == [11, 13, 10, 12]
    assert len(cache) == 0
    assert list(cache.tree_order()) == []


def test_a_mapped_page_is_never_evicted():
    refs = [0] * 16
    cache = build(refs)
    refs[11] = 1                                    # some request maps B
    assert drain(cache, refs) == [13, 12]           # A keeps its child B, so A stays too
    assert [n.page for n in cache.tree_order()] == [10, 11]
    refs[11] = 0
    cache.note_unreferenced(11)                     # the pool tells the cache
    assert drain(cache, refs) == [11, 10]


def test_mapped_inner_node_outlives_its_children():
    refs = [0] * 16
    cache = build(refs)
    refs[10] = 1                                    # A mapped, its children not
    assert drain(cache, refs) == [11, 13, 12]
    refs[10] = 0
    cache.note_unreferenced(10)
    assert drain(cache, refs) == [10]


def test_insert_below_queues_only_an_unmapped_last_node():
    refs = [0] * 16
    refs[11] = 1
    cache = RadixCache()
    cache.insert_below(cache.root, [1, 2], [10, 11], refs)
    assert cache.evict_one(refs) is None            # 11 is mapped, 10 has a child
    refs[11] = 0
    cache.note_unreferenced(11)
    assert drain(cache, refs) == [11, 10]


def test_reinserted_key_goes_last_among_its_siblings():
    refs = [0] * 16
    cache = build(refs)
    refs[13] = refs[12] = 1
    assert cache.evict_one(refs) == 11              # B goes; A still has D
    _, a, _ = cache.match([1], 1)
    cache.insert_below(a, [2], [14], refs)          # B's key again, new page
    assert [n.page for n in cache.tree_order()] == [10, 13, 14, 12]
    assert cache.match([1, 2], 2)[0] == [10, 14]
    refs[13] = refs[12] = 0
    cache.note_unreferenced(13)
    cache.note_unreferenced(12)
    assert drain(cache, refs) == [13, 14, 10, 12]


def test_clear_returns_pages_in_tree_order_and_empties_the_cache():
    refs = [0] * 16
    cache = build(refs)
    assert cache.clear() == [10, 11, 13, 12]
    assert len(cache) == 0
    assert cache.match([1, 2], 2)[0] == []
    assert cache.evict_one(refs) is None
    cache.insert_below(cache.root, [1], [10], refs)  # usable again
    assert cache.match([1], 1)[0] == [10]
    assert drain(cache, refs) == [10]


def test_eviction_order_stays_tree_order_through_relabelling(monkeypatch):
    """Random inserts, mappings and evictions against the SPEC's rule, read off the tree.

    A tiny label space makes almost every insertion relabel (and the labels outgrow it),
    which is where the order-maintenance labels and the heap's stale entries could go wrong.
    """
    import random

    from inferris_dist.engine import prefix

    def tour(cache):
        """The tokens of the linked list, checked against the tree's own Euler tour."""
        want = []

        def visit(node):
            want.append(node)
            for child in node.children.values():
                visit(child)
            want.append(node.exit)
        visit(cache.root)
        got, token = [], cache.root
        while token is not None:
            got.append(token)
            token = token.next
        assert got == want
        labels = [t.label for t in got]
        assert labels == sorted(set(labels)), "labels must increase strictly along the tour"

    def first_unmapped_leaf(cache, refs):
        return next((n.page for n in cache.tree_order() if not n.children and refs[n.page] == 0), None)

    for label_bits in (2, 120):
        monkeypatch.setattr(prefix, "LABEL_BITS", label_bits)
        rng = random.Random(label_bits)
        refs = [0] * 5000
        cache = RadixCache()
        next_page = next_key = 0
        for op in range(1500):
            nodes = list(cache.tree_order())
            roll = rng.random()
            if roll < 0.45 or not nodes:
                parent = rng.choice(nodes + [cache.root] * 3)
                m = rng.choice((1, 1, 2, 3, 7))
                keys = list(range(next_key + 1, next_key + 1 + m))
                pages = list(range(next_page, next_page + m))
                next_key, next_page = next_key + m, next_page + m
                for page in pages:
                    refs[page] = int(rng.random() < 0.3)
                cache.insert_below(parent, keys, pages, refs)
            elif roll < 0.7:
                node = rng.choice(nodes)
                if refs[node.page]:
                    refs[node.page] = 0
                    cache.note_unreferenced(node.page)
                else:
                    refs[node.page] = 1
            elif roll < 0.995:
                want = first_unmapped_leaf(cache, refs)
                assert cache.evict_one(refs) == want, op
            else:
                assert cache.clear() == [n.page for n in nodes]
            tour(cache)
            paths = [n.path for n in cache.tree_order()]
            assert paths == sorted(paths)                  # the old key still sorts the same way
        for node in list(cache.tree_order()):            # unmap everything, then empty it
            if refs[node.page]:
                refs[node.page] = 0
                cache.note_unreferenced(node.page)
        while (want := first_unmapped_leaf(cache, refs)) is not None:
            assert cache.evict_one(refs) == want
            tour(cache)
        assert cache.evict_one(refs) is None and len(cache) == 0
