"""Chaos on the elastic world (mechanism 14): schedules under shrink, regrow (shrink with --regrow)
and pause, where a scripted operator answers each pause at random (late, twice, for a stale epoch,
or never, leaving it to the pause timeout). Runs on real processes, bounded in count.

1. drawn schedules under all three hold, every kind of fault among them;
2. a pause schedule carries its operator's moves and the timeout's default, the same for the same
   seed and index, and through its JSON;
3. a desk that breaks its own rules (it takes an instruction for an older epoch) is found: the
   run's break is of class "operator";
4. a policy the chaos command does not know is bad input.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from inferris_dist.chaos import ChaosConfig, explore, schedule_at
from inferris_dist.chaos.harness import Session
from inferris_dist.chaos.schedules import Schedule, random_workloads
from inferris_dist.scheduler import operator as desk_module

from tests.helpers.external import CLI, ENV

pytestmark = [pytest.mark.timeout(120)]
POLICIES = ("shrink", "regrow", "pause")


def config(seed: int) -> ChaosConfig:
    return ChaosConfig(random_workloads(seed), seed=seed, policies=POLICIES, world_sizes=(2, 3, 4))


@pytest.mark.invariant("elastic-world/5")
def test_schedules_under_shrink_regrow_and_pause_hold():
    report = explore(config(11), runs=18)
    assert report.runs == 18
    assert not report.breaks, [f"{b.schedule}: {b.kind}: {b.reason}" for b in report.breaks]
    assert {p for p, _ in report.totals} == set(POLICIES)


def test_a_pause_schedule_carries_its_operator():
    cfg = config(3)
    steps_of = lambda w, rung: 6                                          # noqa: E731
    pauses = [schedule_at(cfg, i, steps_of) for i in range(12)]
    pauses = [s for s in pauses if s.policy == "pause"]
    assert pauses and all(len(s.operator) == len(s.faults) + 1 for s in pauses)
    assert all(s.pause_default in ("abort", "retry", "scale-down") for s in pauses)
    again = [schedule_at(cfg, s.index, steps_of) for s in pauses]
    assert again == pauses                                                # drawn from the seed alone
    assert [Schedule.from_json(json.loads(json.dumps(s.to_json()))) for s in pauses] == pauses
    assert "operator" in str(pauses[0])


class CarelessDesk(desk_module.Desk):
    """A desk that takes an instruction for any epoch."""

    def apply(self, ident, instruction, epoch, wait=desk_module.ANSWER_WAIT_S):
        if type(epoch) is int:
            epoch = self.snapshot().get("epoch", epoch)
        return super().apply(ident, instruction, epoch, wait)


def test_a_desk_that_takes_a_stale_epoch_is_an_operator_break(monkeypatch):
    name, workload = random_workloads(5)[0]
    schedule = Schedule(0, name, "full", "pause", 3, ("1:crash@1",), ("retry:stale",), "abort")
    with Session() as session:
        assert session.run(workload, schedule).held               # the desk as it is: it holds
        monkeypatch.setattr(desk_module, "Desk", CarelessDesk)
        outcome = session.run(workload, schedule)
    assert outcome.brk is not None and outcome.brk.kind == "operator"
    assert "not 409" in outcome.brk.reason


def test_an_unknown_policy_is_bad_input(tmp_path):
    done = subprocess.run([*CLI, "chaos", "--policy", "shrink,grow", "--runs", "1"], capture_output=True,
                          text=True, env=ENV, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "'grow'" in done.stderr
