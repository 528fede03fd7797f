"""Note 12, parallelism: rank groups (docs/mechanisms/12-parallelism.md): its invariants
parallelism/1 to /5, pinned on join, on in-process groups and on real worker processes."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import inferris_dist
from inferris_dist.engine import (
    Engine,
    ExecutionResult,
    GroupViolation,
    ItemOutcome,
    LocalGroup,
    RankExecutionResult,
    join,
    load_workload,
    run_workload,
)
from inferris_dist.engine.shard import first_mismatch
from inferris_dist.testing import comparable

from tests.helpers.external import golden_workload
from tests.helpers.invariants import GOLDEN_NAMES, PROPERTY, plan_steps

pytestmark = pytest.mark.timeout(60)


OUT = (ItemOutcome("a", 4, 3, 1, (0, 1)), ItemOutcome("b", 0, 2, 0, (2,)))


@pytest.mark.invariant("parallelism/1")
@PROPERTY
@given(n=st.integers(1, 4), ranks=st.lists(st.integers(0, 5), max_size=6),
       sizes=st.lists(st.integers(1, 5), min_size=6, max_size=6),
       steps=st.lists(st.sampled_from([7, 7, 7, 8]), min_size=6, max_size=6))
def test_join_needs_every_rank_once_naming_the_group(n, ranks, sizes, steps):
    results = [RankExecutionResult(r, sizes[i], steps[i], OUT) for i, r in enumerate(ranks)]
    ok = (sorted(ranks) == list(range(n)) and all(sizes[i] == n for i in range(len(ranks)))
          and all(steps[i] == 7 for i in range(len(ranks))))
    if ok:
        assert join(results, n, 7) == ExecutionResult(7, OUT)
    else:
        with pytest.raises(GroupViolation):
            join(results, n, 7)


@pytest.mark.invariant("parallelism/1")
def test_join_examples():
    good = [RankExecutionResult(r, 3, 7, OUT) for r in (2, 0, 1)]
    assert join(good, 3, 7) == ExecutionResult(7, OUT)             # arrival order is irrelevant
    for bad in (good[:2], good + [good[0]], [r._replace(world_size=4) for r in good]):
        with pytest.raises(GroupViolation):
            join(bad, 3, 7)


@pytest.mark.invariant("parallelism/2")
@PROPERTY
@given(n=st.integers(2, 5), data=st.data())
def test_no_majority_vote(n, data):
    odd = data.draw(st.integers(0, n - 1))
    i = data.draw(st.integers(0, len(OUT) - 1))
    fld = data.draw(st.sampled_from(ItemOutcome._fields))
    value = {"request_id": "z", "start_position": 5, "executed_tokens": 9, "accepted": 2,
             "writes": (3,)}[fld]
    changed = list(OUT)
    changed[i] = changed[i]._replace(**{fld: value})
    if tuple(changed) == OUT:
        return
    results = [RankExecutionResult(r, n, 7, tuple(changed) if r == odd else OUT) for r in range(n)]
    with pytest.raises(GroupViolation):
        join(results, n, 7)
    with pytest.raises(GroupViolation):                  # also with a missing outcome
        join([RankExecutionResult(r, n, 7, OUT[:1] if r == odd else OUT) for r in range(n)], n, 7)


@pytest.mark.invariant("parallelism/3")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_world_size_changes_no_trace_in_process(name):
    wl = golden_workload(name)
    want = comparable(run_workload(wl.with_config(world_size=1)))
    for n in (2, 3, 5):
        assert comparable(run_workload(wl.with_config(world_size=n))) == want, n


@pytest.mark.invariant("parallelism/3")
@pytest.mark.invariant("parallelism/4")
@pytest.mark.procs
@pytest.mark.parametrize("name", ["speculative", "cache_eviction"])
def test_world_size_changes_no_trace_on_processes(name):
    wl = golden_workload(name)
    want = run_workload(wl.with_config(world_size=1))
    lines = []
    with inferris_dist.launch(wl, world_size=3, audit_every=1) as eng:   # audit every shard each step
        for t in eng.run():
            lines.append(t.to_json())
        lines.append({"summary": eng.summary()})
    assert lines == want


@pytest.mark.invariant("parallelism/4")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_every_shard_holds_the_pool(name):
    wl = golden_workload(name)
    group = LocalGroup(wl, 3)
    for s in plan_steps(wl, executor=group):
        shards = group.shards()
        assert sorted(shards) == [0, 1, 2]
        for r, snap in shards.items():
            assert first_mismatch(s.eng.pool.slots, dict(snap)) is None, (r, s.step)
        assert shards[0] == shards[1] == shards[2]


SPECULATIVE_3 = {
    "engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3, "world_size": 3},
    "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6, "accept_script": [2]},
                 {"request_id": "s", "prompt_len": 6, "max_new_tokens": 2}],
}


@pytest.mark.invariant("parallelism/5")
def test_a_split_group_commits_nothing():
    wl = load_workload(SPECULATIVE_3)
    other = dict(SPECULATIVE_3, requests=[dict(SPECULATIVE_3["requests"][0], accept_script=[0]),
                                          SPECULATIVE_3["requests"][1]])
    group = LocalGroup(wl)
    group.ranks[2] = LocalGroup(load_workload(other)).ranks[2]    # a real rank with another verdict
    eng = Engine(wl, group)
    eng.step()                                                     # prefill: no verdict, all agree
    prepared = eng.prepare()
    planned = eng.snapshot()
    with pytest.raises(GroupViolation):
        group.execute(prepared.plan)
    assert eng.snapshot() == planned
    lines = run_workload(wl, _split_group(wl, other))
    assert lines[-1]["error"] == "GroupViolation" and lines[-1]["step"] == 1 and len(lines) == 2


def _split_group(wl, other):
    group = LocalGroup(wl)
    group.ranks[2] = LocalGroup(load_workload(other)).ranks[2]
    return group


@pytest.mark.invariant("parallelism/5")
@pytest.mark.procs
def test_a_disagreeing_worker_process_commits_nothing():
    wl = load_workload(SPECULATIVE_3)
    reference = Engine(wl)
    reference.step()
    reference.prepare()                                  # where the control plane stands at step 1
    lines = []
    with inferris_dist.launch(wl, world_size=3, faults=["1:disagree@1"]) as eng:
        with pytest.raises(GroupViolation) as info:
            for t in eng.run():
                lines.append(t.to_json())
        assert info.value.step == 1
        assert eng.snapshot() == reference.snapshot()
    assert len(lines) == 1
