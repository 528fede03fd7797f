"""Breaks `inferris-dist chaos` found in the product, each as the reproducer the shrinker made,
expected to fail until the product keeps its promise there (strict: a fix makes these pass, and
then the marker goes). docs/chaos.md lists them with their commands."""
from __future__ import annotations

import pytest

from inferris_dist import testing
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

# The shrinker's workload for the first break below (seed 11, --random-workloads, schedule 45).
TWO_REQUESTS = {"engine": {"max_step_tokens": 12, "page_size": 4, "num_pages": 21, "spec_len": 0,
                           "world_size": 2},
                "requests": [{"request_id": "q1", "tokens": [21], "max_new_tokens": 1},
                             {"request_id": "q2", "max_new_tokens": 1, "arrival_step": 2,
                              "tokens": [21, 14, 6, 48, 25, 12, 26, 27, 120, 207, 350, 296, 232]}]}


def breaks(workload, faults, policy="restore", rung="full", world_size=4):
    with testing.Session(step_timeout=0.25) as session:
        return session.run(load_workload(workload),
                           testing.Schedule(0, "finding", rung, policy, world_size, tuple(faults))).brk


@pytest.mark.xfail(strict=True, reason="at overlap, a one-shot fault that fired on the plan sent ahead "
                   "is given again to the replacement of a later recovery (its CONFIG counts only "
                   "who answered the last failed attempt): the hang at step 3 fires twice and the "
                   "three faults need four restarts")
def test_a_one_shot_fault_fires_once_across_recoveries_at_overlap():
    assert breaks(TWO_REQUESTS, ["0:hang@3", "0:hang@0", "1:delay@2:0.425"], rung="overlap",
                  world_size=2) is None


@pytest.mark.xfail(strict=True, reason="the audit blames the first divergent rank only: a write dropped "
                   "on every rank costs one recovery per rank, and 4 ranks need 4 of the 3 restarts")
def test_a_write_dropped_on_every_rank_is_one_recovery():
    assert breaks(DEMO, ["all:drop-write@1"]) is None


@pytest.mark.xfail(strict=True, reason="the join compares the ranks with each other: a lie every rank "
                   "tells alike (an accepted count still within the drafts) is committed")
def test_a_lie_told_by_every_rank_is_not_committed():
    assert breaks(DEMO, ["all:disagree@4"]) is None
