"""Note 07, the prefix hash (docs/mechanisms/07-prefix-hash.md): its invariants prefix-hash/1 to
/5, pinned on the key table alone and on real engine runs."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import Engine, caching
from inferris_dist.engine.prefix import ROOT_KEY, KeyTable

from tests.helpers.external import golden_workload
from tests.helpers.invariants import PROPERTY, bounded

pytestmark = pytest.mark.timeout(60)


token_lists = st.lists(st.integers(0, 2), max_size=14)


@pytest.mark.invariant("prefix-hash/1")
@PROPERTY
@given(tokens=token_lists, ps=st.integers(1, 5))
def test_only_complete_blocks_have_keys(tokens, ps):
    keys = KeyTable().chain(tuple(tokens), ps)
    assert len(keys) == len(tokens) // ps


@pytest.mark.invariant("prefix-hash/2")
@PROPERTY
@given(a=token_lists, b=token_lists, ps=st.integers(1, 4))
def test_equal_keys_exactly_when_equal_prefixes(a, b, ps):
    table = KeyTable()
    ka, kb = table.chain(tuple(a), ps), table.chain(tuple(b), ps)
    for j in range(min(len(ka), len(kb))):
        same_prefix = a[:(j + 1) * ps] == b[:(j + 1) * ps]
        assert (ka[j] == kb[j]) == same_prefix, (j, a, b)


@pytest.mark.invariant("prefix-hash/3")
@PROPERTY
@given(tokens=token_lists, other=token_lists, ps=st.integers(1, 4))
def test_chains_are_stable_and_prefix_closed(tokens, other, ps):
    table = KeyTable()
    full = table.chain(tuple(tokens), ps)
    table.chain(tuple(other), ps)                          # asking about others changes nothing
    assert table.chain(tuple(tokens), ps) == full
    for k in range(len(full) + 1):
        assert table.chain(tuple(tokens[:k * ps]), ps) == full[:k]
    # The relation does not depend on who asked first: a fresh table in the other order agrees.
    fresh = KeyTable()
    fresh_other = fresh.chain(tuple(other), ps)
    fresh_full = fresh.chain(tuple(tokens), ps)
    for i, j in itertools.product(range(len(full)), range(len(fresh_other))):
        assert (fresh_full[i] == fresh_other[j]) == (full[i] == table.chain(tuple(other), ps)[j])


@pytest.mark.invariant("prefix-hash/4")
@PROPERTY
@given(tokens=token_lists, ps=st.integers(1, 4))
def test_no_key_is_root_and_a_chain_never_repeats_a_key(tokens, ps):
    keys = KeyTable().chain(tuple(tokens), ps)
    assert ROOT_KEY not in keys
    assert len(set(keys)) == len(keys)            # same block tokens at another depth: another key


@pytest.mark.invariant("prefix-hash/4")
def test_repeated_block_at_two_depths():
    k0, k1, k2 = KeyTable().chain((5, 5, 5, 5, 5, 5), 2)
    assert len({k0, k1, k2}) == 3


@pytest.mark.invariant("prefix-hash/5")
@pytest.mark.parametrize("name", ["prefix_reuse", "cache_eviction", "random_009", "random_017",
                                  "random_038", "recompute_window"])
def test_engine_keys_every_prompt_in_one_table(name):
    wl = golden_workload(name)
    eng = Engine(wl)
    for _ in bounded(eng.run()):
        pass
    ps = eng.config.page_size
    keyed = [r for r in eng.requests if r.prefix_keys is not None]
    for r in keyed:
        # only the prompt is keyed, however much the request generated or was preempted
        assert len(r.prefix_keys) == r.prompt // ps
        assert r.prefix_keys == eng.keys.chain(r.tokens, ps)
    for r, s in itertools.combinations(keyed, 2):
        for j in range(min(len(r.prefix_keys), len(s.prefix_keys))):
            assert (r.prefix_keys[j] == s.prefix_keys[j]) == (
                r.tokens[:(j + 1) * ps] == s.tokens[:(j + 1) * ps])


@pytest.mark.invariant("prefix-hash/5")
def test_prefix_reuse_keys_by_tokens_not_by_request():
    eng = Engine(golden_workload("prefix_reuse"))
    for _ in bounded(eng.run()):
        pass
    k = {r.request_id: caching.prefix_keys(r, eng.keys, 4) for r in eng.requests}
    assert k["first"] == k["same"] and len(k["first"]) == 3           # 14 tokens: 3 blocks
    assert k["branch"][:2] == k["first"][:2] and k["branch"][2] != k["first"][2]
    assert k["exact"] == k["first"][:2]
    assert set(k["stranger"]).isdisjoint(k["first"] + k["branch"])
