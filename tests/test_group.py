"""Rank groups (SPEC §3, phase 8): join by exact agreement; LocalGroup at any world size."""
import json

import pytest

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
from inferris_dist.engine.boundary import build_plan
from inferris_dist.engine.request import Request
from inferris_dist.engine.shard import first_mismatch
from inferris_dist.engine.workload import RequestSpec

from tests.helpers.external import GOLDEN

SPECS = sorted(p.name for p in GOLDEN.glob("*.spec.json"))



def placements(start, num_tokens, page_table, page_size=4):
    """The plan's placements for positions [start, start + num_tokens), in its wire form."""
    req = Request(0, RequestSpec("x", (0,), 1))
    req.computed, req.page_table = start, list(page_table)
    return build_plan(0, [(req, num_tokens, False)], page_size).items[0].placements


OUTCOMES = (ItemOutcome("a", 4, 3, 1, placements(4, 3, [0, 1])),
            ItemOutcome("b", 0, 2, 0, placements(0, 2, [2])))
OTHER = (ItemOutcome("a", 4, 3, 2, ((4, 1, 0, 3),)), OUTCOMES[1])     # a different verdict


def rank(r, world_size=3, step=5, outcomes=OUTCOMES):
    return RankExecutionResult(r, world_size, step, outcomes)


# -- join ------------------------------------------------------------------------------------

def test_all_agree_gives_the_result():
    assert join([rank(0), rank(1), rank(2)], 3, 5) == ExecutionResult(5, OUTCOMES)


def test_rank_order_of_arrival_does_not_matter():
    assert join([rank(2), rank(0), rank(1)], 3, 5) == ExecutionResult(5, OUTCOMES)


def test_world_size_one():
    assert join([rank(0, world_size=1)], 1, 5) == ExecutionResult(5, OUTCOMES)


@pytest.mark.parametrize("results", [
    pytest.param([rank(0), rank(2)], id="missing-rank-1"),
    pytest.param([rank(0), rank(1)], id="missing-last-rank"),
    pytest.param([], id="nobody"),
    pytest.param([rank(0), rank(1), rank(1)], id="duplicate-rank"),
    pytest.param([rank(0), rank(1), rank(1), rank(2)], id="duplicate-and-complete"),
    pytest.param([rank(0), rank(1), rank(2), rank(3)], id="one-rank-too-many"),
    pytest.param([rank(1), rank(2), rank(3)], id="ranks-from-one"),
])
def test_ranks_must_cover_the_group_exactly_once(results):
    with pytest.raises(GroupViolation):
        join(results, 3, 5)


def test_wrong_world_size_names_the_rank():
    with pytest.raises(GroupViolation) as info:
        join([rank(0), rank(1, world_size=4), rank(2)], 3, 5)
    assert "rank 1" in info.value.message


def test_all_ranks_naming_the_same_wrong_world_size_are_refused():
    with pytest.raises(GroupViolation):
        join([rank(r, world_size=4) for r in range(3)], 3, 5)


@pytest.mark.parametrize("odd", [1, 2])
def test_one_disagreeing_rank_is_a_violation_naming_it(odd):
    results = [rank(r, outcomes=OTHER if r == odd else OUTCOMES) for r in range(3)]
    with pytest.raises(GroupViolation) as info:
        join(results, 3, 5)
    assert f"rank {odd}" in info.value.message


def test_no_majority_vote():
    # Ranks 1..3 agree, rank 0 is the odd one out: still no result.
    results = [rank(r, world_size=4, outcomes=OTHER if r == 0 else OUTCOMES) for r in range(4)]
    with pytest.raises(GroupViolation):
        join(results, 4, 5)


@pytest.mark.parametrize("field,value", [
    ("request_id", "z"), ("start_position", 3), ("executed_tokens", 2), ("accepted", 0),
    ("writes", placements(4, 3, [0, 2])),
])
def test_every_field_counts(field, value):
    odd = (OUTCOMES[0]._replace(**{field: value}), OUTCOMES[1])
    with pytest.raises(GroupViolation) as info:
        join([rank(0, 2), rank(1, 2, outcomes=odd)], 2, 5)
    assert "rank 1" in info.value.message


def test_a_missing_outcome_is_a_disagreement():
    with pytest.raises(GroupViolation) as info:
        join([rank(0, 2), rank(1, 2, outcomes=OUTCOMES[:1])], 2, 5)
    assert "rank 1" in info.value.message


# -- LocalGroup --------------------------------------------------------------------------------

SPECULATIVE = {
    "engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3, "world_size": 3},
    "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6}],
}


def test_local_group_has_world_size_ranks():
    wl = load_workload(SPECULATIVE)
    assert [r.rank for r in LocalGroup(wl).ranks] == [0, 1, 2]
    assert [r.world_size for r in LocalGroup(wl, 5).ranks] == [5] * 5


def test_a_rank_with_another_verdict_breaks_the_group():
    wl = load_workload(SPECULATIVE)
    group = LocalGroup(wl)
    group.ranks[2].accept_scripts = {"r": (0,)}            # rank 2 rejects every draft
    eng = Engine(wl, group)
    t = eng.step()                                         # prefill: no verdict yet, all agree
    assert t.executed == {"r": 4}
    with pytest.raises(GroupViolation) as info:
        eng.step()
    assert info.value.step == 1
    assert "rank 2" in info.value.message
    assert eng.by_id["r"].computed == 4 and eng.by_id["r"].generated == 1
    lines = run_workload(wl, _broken_group(wl))
    assert lines[-1]["error"] == "GroupViolation" and lines[-1]["step"] == 1 and len(lines) == 2


def _broken_group(wl):
    group = LocalGroup(wl)
    group.ranks[2].accept_scripts = {"r": (0,)}
    return group


def _golden(name):
    path = GOLDEN / name
    want = [json.loads(line) for line in path.with_name(name.replace(".spec.json", ".trace.jsonl"))
            .read_text().splitlines() if line.strip()]
    return load_workload(path), want


def _comparable(lines):
    if lines and "error" in lines[-1]:
        return lines[:-1] + [{"error": lines[-1]["error"], "step": lines[-1]["step"]}]
    return lines


@pytest.mark.parametrize("name", SPECS)
def test_traces_do_not_depend_on_world_size(name):
    wl, want = _golden(name)
    for world_size in (1, 2, 3, 8):
        got = run_workload(wl.with_config(world_size=world_size))
        assert _comparable(got) == _comparable(want), f"world_size {world_size}"


@pytest.mark.parametrize("name", ["demo.spec.json", "preemption.spec.json", "cache_eviction.spec.json",
                                  "speculative.spec.json", "recompute_window.spec.json",
                                  "random_009.spec.json"])
def test_every_rank_shard_holds_what_the_control_plane_holds(name):
    wl, _ = _golden(name)
    group = LocalGroup(wl, 3)
    eng = Engine(wl, group)
    num_steps = 0
    for _ in eng.run():
        num_steps += 1
        shards = group.shards()
        assert sorted(shards) == [0, 1, 2]
        for r, snap in shards.items():
            assert first_mismatch(eng.pool.slots, dict(snap)) is None, (r, num_steps)
        assert shards[0] == shards[1] == shards[2]
    assert num_steps > 0
