"""Note 09, cache-aware scheduling (docs/mechanisms/09-cache-aware-scheduling.md): its invariants
cache-aware-scheduling/1 to /6, pinned by checking every step against SPEC phase 2, 5 and 11."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferris_dist.engine import CACHE, Engine, State, pages_needed, trace_dicts

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    CACHE_RUNGS,
    GOLDEN_NAMES,
    PROPERTY,
    Step,
    chain,
    plan_steps,
    prefix_workloads,
)

pytestmark = pytest.mark.timeout(60)


def check_reuse(s: Step) -> None:
    want = {rid: c for rid, (c, _) in s.reuse.items()}
    assert s.prepared.reused == want
    assert list(s.prepared.reused) == list(want)        # in request order
    ps = s.eng.config.page_size
    for rid, (c, hits) in s.reuse.items():
        req = s.eng.by_id[rid]
        assert c % ps == 0 and 0 < c < req.prompt
        if rid not in s.prepared.preempted:
            assert s.mid.tables[rid][:len(hits)] == hits
            assert s.mid.computed[rid] == c
            assert all(s.mid.owner[p] is CACHE for p in hits)


def check_publish(s: Step) -> None:
    eng, ps = s.eng, s.eng.config.page_size
    present = set(s.mid.path_set)
    want, new_pages = {}, {}
    for req, _, _ in s.prepared.work:
        keys = chain(eng, req)
        complete = min(s.after.computed[req.request_id], req.prompt) // ps
        resident = 0
        while resident < complete and tuple(keys[:resident + 1]) in present:
            resident += 1
        if complete > resident:
            want[req.request_id] = complete - resident
        for d in range(resident + 1, complete + 1):
            present.add(tuple(keys[:d]))
            new_pages[tuple(keys[:d])] = s.mid.tables[req.request_id][d - 1]
    assert s.trace.published == want
    assert s.after.path_set == present
    if eng.rung.publish:
        page_of = s.after.page_of
        for path, page in new_pages.items():
            assert page_of[path] == page          # the publisher's own page became the cache's
            assert s.after.owner[page] is CACHE
    assert len(s.after.paths) == len(s.mid.paths) + sum(want.values())


def mapped_pre5(s: Step) -> dict[str, list[int]]:
    """Each request's page table when phase 5 begins: as before the step, or the reused hit."""
    out = {rid: list(t) for rid, t in s.before.tables.items()}
    for rid, (_, hits) in s.reuse.items():
        out[rid] = list(hits)
    return out


def check_eviction_safe(s: Step) -> None:
    tables = mapped_pre5(s)
    kept = {p for rid, t in tables.items() if rid not in s.prepared.preempted for p in t}
    before_cache = {page for _, page in s.before.paths}
    for p in s.trace.evicted:
        assert s.before.owner[p] is CACHE and p in before_cache
        assert p not in kept, f"step {s.step}: evicted page {p} is mapped"
    assert len(set(s.trace.evicted)) == len(s.trace.evicted)


def brute_force_evictions(paths, mapped):
    """SPEC phase 5's eviction order: the first unmapped leaf in tree order, again and again."""
    paths = list(paths)
    while True:
        alive = {p for p, _ in paths}
        for i, (path, page) in enumerate(paths):
            leaf = not any(q[:len(path)] == path and len(q) > len(path) for q in alive)
            if leaf and page not in mapped:
                yield page
                del paths[i]
                break
        else:
            return


def check_eviction_minimal(s: Step) -> None:
    if s.prepared.preempted:
        return
    eng, ps = s.eng, s.eng.config.page_size
    tables = mapped_pre5(s)
    shortfall = sum(max(0, pages_needed(s.mid.computed[req.request_id] + n, ps)
                        - len(tables[req.request_id])) for req, n, _ in s.prepared.work)
    evicted = s.trace.evicted
    if "evict" in eng.rung.reliefs:
        assert len(evicted) == max(0, shortfall - len(s.before.free))
        mapped = {p for t in tables.values() for p in t}
        assert evicted == list(itertools.islice(brute_force_evictions(s.before.paths, mapped),
                                                len(evicted)))
    else:
        assert evicted == []


def check_evict_before_preempt(s: Step) -> None:
    if not s.prepared.preempted:
        return
    if "evict" not in s.eng.rung.reliefs:
        assert s.trace.evicted == []
        return
    tables = mapped_pre5(s)
    victims = {p for rid in s.prepared.preempted for p in tables[rid]}
    mapped_now = {p for rid, t in s.mid.tables.items() if s.mid.state[rid] is not State.FINISHED
                  for p in t}
    paths = s.mid.path_set
    for path, page in s.mid.paths:
        leaf = not any(len(q) == len(path) + 1 and q[:-1] == path for q in paths)
        if leaf and page not in mapped_now:
            assert page in victims, (f"step {s.step}: preempted {s.prepared.preempted} while "
                                     f"cache leaf page {page} was evictable")


def check_only_prompt_blocks(s: Step) -> None:
    chains = [tuple(chain(s.eng, r)) for r in s.eng.requests]
    for path, _ in s.after.paths:
        assert any(c[:len(path)] == path for c in chains), f"cache path {path} is no prompt prefix"


CACHE_CHECKS = [check_reuse, check_publish, check_eviction_safe, check_eviction_minimal,
                check_evict_before_preempt, check_only_prompt_blocks]


def check_cache_steps(workload, rung):
    n = 0
    for s in plan_steps(workload, rung):
        for c in CACHE_CHECKS:
            c(s)
        n += 1
    return n


@pytest.mark.invariant("cache-aware-scheduling/1")
@pytest.mark.invariant("cache-aware-scheduling/2")
@pytest.mark.invariant("cache-aware-scheduling/3")
@pytest.mark.invariant("cache-aware-scheduling/4")
@pytest.mark.invariant("cache-aware-scheduling/5")
@pytest.mark.invariant("cache-aware-scheduling/6")
@pytest.mark.parametrize("rung", CACHE_RUNGS)
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_cache_decisions_on_golden_workloads(name, rung):
    check_cache_steps(golden_workload(name), rung)


@pytest.mark.invariant("cache-aware-scheduling/1")
@pytest.mark.invariant("cache-aware-scheduling/2")
@pytest.mark.invariant("cache-aware-scheduling/3")
@pytest.mark.invariant("cache-aware-scheduling/4")
@pytest.mark.invariant("cache-aware-scheduling/5")
@pytest.mark.invariant("cache-aware-scheduling/6")
@PROPERTY
@given(wl=prefix_workloads(), rung=st.sampled_from(CACHE_RUNGS))
def test_cache_decisions_on_generated_workloads(wl, rung):
    check_cache_steps(wl, rung)


@pytest.mark.invariant("cache-aware-scheduling/1")
def test_reuse_counts_on_prefix_reuse():
    lines = trace_dicts(Engine(golden_workload("prefix_reuse"), rung="08b"))
    reused = {k: v for line in lines[:-1] for k, v in line["reused"].items()}
    # same: 3 blocks hit, 13 // 4 = 3 usable; branch: 2 hit; exact: 2 hit, only (8-1)//4 = 1 usable
    assert reused == {"same": 12, "branch": 8, "exact": 4}
    at_08a = trace_dicts(Engine(golden_workload("prefix_reuse"), rung="08a"))
    assert all(line["reused"] == {} for line in at_08a[:-1])


@pytest.mark.invariant("cache-aware-scheduling/1")
def test_a_preempted_request_keeps_its_cache_hit():
    wl = {"engine": {"max_step_tokens": 4, "page_size": 2, "num_pages": 5},
          "requests": [{"request_id": "a", "tokens": [1, 2, 3, 4, 5], "max_new_tokens": 3},
                       {"request_id": "b", "tokens": [7, 7, 7, 7, 7, 7], "max_new_tokens": 1,
                        "arrival_step": 1}]}
    steps = list(plan_steps(wl, "08b"))
    pre = [s for s in steps if s.prepared.preempted]
    assert pre, "the workload no longer preempts"
    for s in steps:
        check_reuse(s)
    victim = pre[0].prepared.preempted[0]
    later = [s for s in steps if s.step > pre[0].step and victim in s.prepared.reused]
    assert later, f"{victim} never reused its published blocks after preemption"


@pytest.mark.invariant("cache-aware-scheduling/5")
def test_pressure_evicts_at_08c_where_08b_runs_out():
    lines = trace_dicts(Engine(golden_workload("cache_eviction"), rung="08b"))
    assert lines[-1]["error"] == "OutOfPages" and lines[-1]["step"] == 4
    lines = trace_dicts(Engine(golden_workload("cache_eviction"), rung="08c"))
    assert [line["evicted"] for line in lines[:-1]][4] == [2, 4]
    assert all(line["preempted"] == [] for line in lines[:-1])
