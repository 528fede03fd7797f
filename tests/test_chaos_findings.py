"""Breaks `inferris-dist chaos` found in the product, each kept as the reproducer the shrinker
made: those the product now survives pass; one is a limit of exact agreement, kept as a strict
xfail (docs/chaos.md lists them with their commands)."""
from __future__ import annotations

import pytest

from inferris_dist import chaos
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

def breaks(workload, faults, policy="restore", rung="full", world_size=4, max_restarts=3):
    with chaos.Session(step_timeout=0.25) as session:
        return session.run(load_workload(workload), chaos.Schedule(0, "finding", rung, policy, world_size,
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


def _one_request(tokens, max_new, max_step_tokens, page_size, num_pages, world_size):
    return {"engine": {"max_step_tokens": max_step_tokens, "page_size": page_size, "num_pages": num_pages,
                       "spec_len": 0, "world_size": world_size},
            "requests": [{"request_id": "q0", "tokens": tokens, "max_new_tokens": max_new}]}


def test_a_partition_at_overlap_may_cost_the_step_before_it_and_blame_its_rank():
    """The cut begins with step 1's plan, sent while step 0 is awaited: rank 0's answer to step 0
    is lost, and abort fails at step 0 naming rank 0 (docs/faults.md), which the judge took for
    a failure before any fault fired."""
    spec = _one_request([0, 1, 2, 3, 4], 1, 4, 2, 21, 1)
    assert breaks(spec, ["0:partition@1:0.425"], "abort", "overlap", world_size=1) is None


def test_a_garbled_reply_to_the_plan_sent_ahead_leaves_a_history_that_holds():
    spec = _one_request([0], 2, 8, 4, 17, 1)
    for _ in range(3):
        assert breaks(spec, ["0:garble@1", "0:plan-lost@0"], "recompute", "overlap", world_size=1) is None


def test_kept_members_garbled_replies_at_the_first_step_leave_a_history_that_holds():
    spec = _one_request([25], 1, 6, 2, 8, 2)
    for _ in range(5):           # their replies are read while the step is awaited again, or earlier
        assert breaks(spec, ["all:garble@0"], "restore", world_size=2) is None


def test_a_delayed_reply_of_a_member_lost_after_it_replied_does_not_crash_the_scheduler():
    spec = _one_request([8], 1, 8, 4, 4, 2)
    for _ in range(5):           # the receipt comes due during the admission in about 2 runs of 5
        assert breaks(spec, ["0:result-delay@0:0.025", "all:crash-after-reply@0"], "restore", "overlap",
                      world_size=2) is None
