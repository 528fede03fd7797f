"""Breaks `inferris-dist chaos` found in the product, each kept as the reproducer the shrinker
made: those the product now survives pass; one is a limit of exact agreement, kept as a strict
xfail (docs/chaos.md lists them with their commands)."""
from __future__ import annotations

import pytest

from inferris_dist import testing
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

def breaks(workload, faults, policy="restore", rung="full", world_size=4, max_restarts=3):
    with testing.Session(step_timeout=0.25) as session:
        return session.run(load_workload(workload), testing.Schedule(0, "finding", rung, policy, world_size,
                                                                     tuple(faults)),
                           max_restarts=max_restarts).brk


def test_a_one_shot_fault_fires_once_across_recoveries_at_overlap():
    assert breaks(DEMO, ["0:hang@3", "1:delay@2:0.425"], rung="overlap", world_size=2, max_restarts=2) is None


def test_a_write_dropped_on_every_rank_is_one_recovery():
    assert breaks(DEMO, ["all:drop-write@1"]) is None


@pytest.mark.xfail(strict=True, reason="the join compares the ranks with each other: a lie every rank "
                   "tells alike (an accepted count still within the drafts) is committed")
def test_a_lie_told_by_every_rank_is_not_committed():
    assert breaks(DEMO, ["all:disagree@4"]) is None
