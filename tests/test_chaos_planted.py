"""Chaos seen to fail: three deliberately broken recoveries (tests/helpers/planted.py), each found
from a seed within a bounded number of runs on real processes and shrunk to its known minimal
schedule: the smallest number of faults, at the earliest step, on the lowest rank and the fewest
ranks and requests the break allows."""
from __future__ import annotations

import pytest

from inferris_dist import chaos
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload
from inferris_dist.protocol.faults import parse_fault

from tests.helpers import planted

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

RUNS = 20          # the exploration's bound


def found_and_shrunk(engine_class, policy: str, kinds: dict, seed: int = 0):
    """Explore the demo under `policy` with the plant until the first break (at most RUNS runs),
    then shrink it; (the break, the shrunk result)."""
    workload = load_workload(DEMO)
    config = chaos.ChaosConfig([("demo", workload)], seed=seed, policies=(policy,), kinds=kinds)
    with chaos.Session(step_timeout=config.step_timeout, engine_class=engine_class) as session:
        report = chaos.explore(config, runs=RUNS, session=session, stop_on_break=True)
        assert report.breaks, f"no break in {report.runs} runs"
        found = report.breaks[0]
        shrunk = chaos.shrink(workload, found.schedule, chaos.Break(found.kind, found.reason),
                                session=session, max_runs=40, max_seconds=30)
    return found, shrunk


def test_a_restore_one_page_short_is_found_and_shrunk_to_one_crash_at_the_first_step_with_pages():
    found, shrunk = found_and_shrunk(planted.ShortRestore, "restore", {"crash": 1})
    assert found.kind == "failed" and "ShardDivergence" in found.reason
    # at step 0 the pool is still empty (nothing to leave out): the first restore that can lose
    # a page is at step 1
    assert shrunk.minimal.faults == ("0:crash@1",), shrunk.minimal.describe()
    assert shrunk.minimal.world_size == 1 and len(shrunk.minimal.workload.requests) == 1
    assert shrunk.brk.kind == "failed" and not shrunk.budget_spent


def test_a_lie_told_only_when_two_faults_meet_keeps_both_faults_when_shrunk():
    found, shrunk = found_and_shrunk(planted.LiesWhenTwoFaultsMeet, "restore", {"duplicate": 1, "stale": 1})
    assert found.kind == "differs"
    faults = [parse_fault(f) for f in shrunk.minimal.faults]
    assert len(faults) == 2, shrunk.minimal.describe()            # one alone does not break
    assert [f.step for f in faults] == [0, 0]                     # moved back together, still meeting
    assert len(shrunk.minimal.workload.requests) == 1
    assert "field 'executed'" in shrunk.brk.reason


def test_an_abort_that_blames_the_neighbour_is_found_and_shrunk_to_one_crash_on_two_ranks():
    found, shrunk = found_and_shrunk(planted.BlamesTheNeighbour, "abort", {"crash": 1, "exit": 1})
    assert found.kind == "blame"
    assert len(shrunk.minimal.faults) == 1
    fault = parse_fault(shrunk.minimal.faults[0])
    assert (fault.rank, fault.step) == (0, 0), shrunk.minimal.describe()
    assert shrunk.minimal.world_size == 2                          # a neighbour to blame
    assert len(shrunk.minimal.workload.requests) == 1
    assert "blaming rank 1" in shrunk.brk.reason


def test_the_same_schedules_hold_without_the_plant():
    workload = load_workload(DEMO)
    config = chaos.ChaosConfig([("demo", workload)], seed=0, policies=("restore", "abort"),
                                 kinds={"crash": 1, "duplicate": 1, "stale": 1})
    report = chaos.explore(config, runs=8)
    assert report.runs == 8 and not report.breaks, [str(b.schedule) + ": " + b.reason for b in report.breaks]
