"""Property tests: random valid workloads against the engine's invariants, the naive oracle,
and the world size.

The generator favours the interesting corners: tiny pools (preemption, eviction,
Irreducible), prompts cut from a few shared stems over a four-token alphabet
(prefix reuse and publishing), speculation with accept scripts that go
negative or past `spec_len`, and EOS mid-window.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferris_dist.engine import Engine, EngineError, LocalGroup, load_workload, run_workload
from inferris_dist.testing import comparable

from tests.helpers.invariants import check_invariants
from tests.helpers.naive_reference import naive_run

TOKEN_POOL = st.integers(min_value=0, max_value=3)

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])

# INFERRIS_PROPERTY_SCALE=50 runs fifty times the examples (a deeper hunt; the default keeps the
# file well under a minute).
SCALE = max(1, int(os.environ.get("INFERRIS_PROPERTY_SCALE", "1")))


def examples(n: int) -> int:
    return n * SCALE


@st.composite
def workloads(draw, max_requests: int = 8) -> dict:
    engine = {
        "page_size": draw(st.integers(1, 5)),
        "num_pages": draw(st.integers(1, 24)),
        "max_step_tokens": draw(st.integers(1, 20)),
        "spec_len": draw(st.integers(0, 4)),
    }
    if draw(st.booleans()):
        engine["world_size"] = draw(st.integers(1, 3))
    # a few stems; each prompt is a prefix of a stem plus a short tail, so prompts share blocks
    stems = draw(st.lists(st.lists(TOKEN_POOL, min_size=1, max_size=14), min_size=1, max_size=3))
    requests = []
    for i in range(draw(st.integers(0, max_requests))):
        req: dict = {"request_id": f"r{i}"}
        if draw(st.integers(0, 5)) == 0:
            req["prompt_len"] = draw(st.integers(1, 12))
        else:
            stem = draw(st.sampled_from(stems))
            cut = draw(st.integers(0, len(stem)))
            tail = draw(st.lists(TOKEN_POOL, min_size=0 if cut else 1, max_size=4))
            req["tokens"] = stem[:cut] + tail
        req["max_new_tokens"] = draw(st.integers(1, 8))
        if draw(st.booleans()):
            req["arrival_step"] = draw(st.integers(0, 6))
        eos = draw(st.one_of(st.none(), st.integers(0, 8)))
        if eos is not None or draw(st.booleans()):
            req["eos_after"] = eos
        script = draw(st.one_of(st.none(), st.lists(st.integers(-2, 7), max_size=5)))
        if script is not None or draw(st.booleans()):
            req["accept_script"] = script
        requests.append(req)
    return {"engine": engine, "requests": requests}


def step_bound(w: dict) -> int:
    """Generous: the first RUNNING request is the anchor, is never preempted and moves at least
    one token (prefill) or one sample (decode) a step, so each request needs at most a recompute
    plus its own work once it leads."""
    total, last_arrival = 0, 0
    for r in w["requests"]:
        prompt = len(r["tokens"]) if "tokens" in r else r["prompt_len"]
        total += prompt + r["max_new_tokens"]
        last_arrival = max(last_arrival, r.get("arrival_step", 0))
    return last_arrival + 4 * total + 50


def as_json_lines(lines: list[dict]) -> list[str]:
    # byte-level comparison: field order and insertion order of every map count too
    return [json.dumps(line) for line in lines]


# -- (a) invariants after every step, and termination -------------------------------------

@settings(max_examples=examples(300), **COMMON)
@given(workloads())
def test_invariants_hold_after_every_step(w):
    eng = Engine(copy.deepcopy(w))
    check_invariants(eng)
    bound = step_bound(w)
    steps = 0
    try:
        for trace in eng.run():
            assert trace.step == steps, f"step ids skip: got {trace.step}, want {steps}"
            steps += 1
            check_invariants(eng)
            assert steps <= bound, f"no end after {bound} steps"
    except EngineError as e:
        assert e.step == steps
        if e.kind == "OutOfPages" and pinned_interior_cache_page(eng):
            return   # the known SPEC gap, see test_anchor_that_fits_never_runs_out_of_pages
        assert e.kind == "Irreducible", f"unexpected {e.kind} at step {e.step}: {e.message}"
        return
    assert eng.done
    assert all(r.state == "FINISHED" and r.finish_reason is not None for r in eng.requests)
    assert all(r.page_table == [] for r in eng.requests)


def pinned_interior_cache_page(eng) -> bool:
    """A cache page nobody maps that cannot be evicted because it is not a leaf: its descendants
    are mapped (by the anchor). Phase 5 only evicts leaves, so such a page is lost to the pool."""
    refs = eng.pool.refs
    return any(refs[page] == 0 and node.children for page, node in eng.cache.node_of_page.items())


# The SPEC (§3 phase 5) says OutOfPages "cannot happen while the anchor fits the pool". It can:
# `a` publishes block 0 (page 0), finishes; `b` computed the same block 0 in its own page 1 the same
# step, so its blocks 1-2 are published as children of a's node. b's page table is [1 (own), 2, 3
# (cache)]; page 0 is unmapped but an interior node above b's mapped pages, so it is never an
# evictable leaf. b, the anchor, needs pages_needed(7) = 4 = num_pages pages, has 3, and there is
# nothing to evict and nobody to preempt. Engine and naive reference agree (both follow the text).
PINNED_INTERIOR = {
    "engine": {"page_size": 2, "num_pages": 4, "max_step_tokens": 4},
    "requests": [{"request_id": "a", "tokens": [0, 0], "max_new_tokens": 1},
                 {"request_id": "b", "tokens": [0, 0, 0, 0, 0, 0], "max_new_tokens": 2}],
}


@pytest.mark.xfail(strict=True, reason="SPEC gap: an unmapped interior cache node above the "
                   "anchor's own mapped cache pages is never evictable, so an anchor that fits "
                   "the pool still hits OutOfPages")
def test_anchor_that_fits_never_runs_out_of_pages():
    lines = run_workload(copy.deepcopy(PINNED_INTERIOR))
    assert lines[-1].get("error") != "OutOfPages", lines[-1]


def test_pinned_interior_case_engine_and_naive_agree():
    got = comparable(run_workload(copy.deepcopy(PINNED_INTERIOR)))
    assert got == comparable(naive_run(copy.deepcopy(PINNED_INTERIOR)))
    assert got[-1] == {"error": "OutOfPages", "step": 2}


# -- (b) the engine agrees with the naive reference, line for line -----------------------

@settings(max_examples=examples(300), **COMMON)
@given(workloads())
def test_engine_matches_naive_reference(w):
    got = run_workload(copy.deepcopy(w))
    want = naive_run(copy.deepcopy(w))
    assert as_json_lines(comparable(got)) == as_json_lines(comparable(want))


# -- (c) the world size changes nothing ---------------------------------------------------

@settings(max_examples=examples(150), **COMMON)
@given(workloads())
def test_trace_independent_of_world_size(w):
    workload = load_workload(copy.deepcopy(w))
    traces = {ws: as_json_lines(run_workload(workload, LocalGroup(workload, ws)))
              for ws in (1, 2, 5)}
    assert traces[2] == traces[1]
    assert traces[5] == traces[1]
    # and via the spec's own engine.world_size, with the default executor
    w5 = copy.deepcopy(w)
    w5["engine"]["world_size"] = 5
    assert as_json_lines(run_workload(w5)) == traces[1]


# -- the generator itself reaches the corners it is meant to ------------------------------

def test_generator_reaches_prefix_reuse_preemption_and_speculation():
    """Guard against a generator that silently stops exercising the mechanisms."""
    seen: set[str] = set()

    @settings(max_examples=300, database=None, **COMMON)
    @given(workloads())
    def collect(w):
        for line in run_workload(w):
            if "error" in line:
                seen.add("error")
                continue
            for kind in ("reused", "preempted", "evicted", "published", "drafted"):
                if line.get(kind):
                    seen.add(kind)
            if any(v > 0 for v in line.get("rolled_back", {}).values()):
                seen.add("rolled_back")
            if "EOS" in line.get("finished", {}).values():
                seen.add("eos")

    collect()
    want = {"reused", "preempted", "evicted", "published", "drafted", "rolled_back", "eos", "error"}
    assert want <= seen, f"generator never produced: {sorted(want - seen)}"
