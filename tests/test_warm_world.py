"""Warm worlds (inferris_dist/scheduler/world.py, protocol §8.6): runs one after another on the
workers a run before handed back, each still judged in full, nothing left behind."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from inferris_dist.chaos.harness import WIRE_LOG_CHECKERS, Session, gone, still_running
from inferris_dist.chaos.schedules import Schedule
from inferris_dist.chaos.verdicts import judge_run, reference_of
from inferris_dist.engine import load_workload
from inferris_dist.scheduler.world import World
from inferris_dist.testing import run_on_processes

pytestmark = pytest.mark.procs

GOLDEN = Path(__file__).parent / "data" / "golden"
WORKLOAD = load_workload(GOLDEN / "random_004.spec.json")


def judged(world: World, tmp_path: Path, name: str, faults=(), policy="restore", world_size=3):
    log = tmp_path / f"{name}.jsonl"
    workload = WORKLOAD.with_config(world_size=world_size)
    run = run_on_processes(workload, list(faults), policy, world_size=world_size, world=world,
                           wire_log=str(log), step_timeout=5.0)
    left = still_running([p for p in run.pids if p not in set(world.pids)], 2.0)
    brk = judge_run(reference_of(workload), run, list(faults), policy, wire_log=log,
                    checkers=WIRE_LOG_CHECKERS, left_running=left)
    return run, brk, log


def events(log: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == kind]


def test_a_whole_run_hands_its_workers_to_the_next_which_starts_none(tmp_path):
    with World() as world:
        first, brk, _ = judged(world, tmp_path, "first")
        assert brk is None and len(first.pids) == 3 and world.pids == first.pids
        second, brk, log = judged(world, tmp_path, "second")
        assert brk is None, brk
        assert second.pids == first.pids and world.reused == 3 and world.pids == first.pids
        assert [e["pid"] for e in events(log, "member")] == first.pids      # its members, by rank
        sent = [json.loads(x) for x in log.read_text().splitlines() if '"CONFIG"' in x]
        assert len(sent) == 3 and not any('"HELLO"' in x for x in log.read_text().splitlines())
        pids, run_dir = world.pids, world.run_dir
    assert all(gone(p) for p in pids) and not run_dir.exists()               # closed: nothing left


def test_only_the_members_a_fault_reached_or_a_failure_blamed_are_replaced(tmp_path):
    with World() as world:
        first, brk, _ = judged(world, tmp_path, "first")
        assert brk is None
        # rank 1 crashes (restore replaces it), rank 2 sends a stale reply (dropped: no recovery)
        second, brk, _ = judged(world, tmp_path, "second", faults=("1:crash@2", "2:stale@3"))
        assert brk is None, brk
        replacement = [p for p in second.pids if p not in first.pids]
        assert len(replacement) == 1 and gone(first.pids[1]) and gone(first.pids[2])
        assert world.pids == [first.pids[0], replacement[0]]    # rank 2 acted out a fault: not kept
        third, brk, _ = judged(world, tmp_path, "third")
        assert brk is None and len(set(third.pids) - set(second.pids)) == 1 and world.reused == 3 + 2


def test_a_run_that_fails_hands_back_nothing_and_leaves_nothing(tmp_path):
    with World() as world:
        judged(world, tmp_path, "first")
        kept = world.pids
        run, brk, _ = judged(world, tmp_path, "second", faults=("0:crash@2",), policy="abort")
        assert brk is None and run.error is not None                   # abort: the promise is to fail
        assert world.pids == [] and all(gone(p) for p in kept)
        third, brk, _ = judged(world, tmp_path, "third")
        assert brk is None and len(third.pids) == 3                    # a cold start again


def test_a_kept_worker_gone_between_runs_is_replaced_not_blamed(tmp_path):
    with World() as world:
        judged(world, tmp_path, "first")
        kept = world.pids
        victim = kept[1]
        os.kill(victim, signal.SIGKILL)
        run, brk, log = judged(world, tmp_path, "second")
        assert brk is None and run.error is None and victim not in world.pids
        assert len([p for p in run.pids if p != victim and p not in kept]) == 1      # one started
        notes = [e["text"] for e in events(log, "note")]
        assert any("rank 1: the kept worker died while configured again" in t for t in notes), notes
        assert not events(log, "lost") and not events(log, "restart")


def test_a_world_of_another_size_keeps_what_fits_and_starts_the_rest(tmp_path):
    with World() as world:
        judged(world, tmp_path, "three", world_size=3)
        three = world.pids
        run, brk, _ = judged(world, tmp_path, "two", world_size=2)
        assert brk is None and run.pids == three[:2] and world.pids == three[:2] and gone(three[2])
        run, brk, _ = judged(world, tmp_path, "four", world_size=4)
        assert brk is None and len(set(run.pids) - set(three)) == 2 and world.pids[:2] == three[:2]


def test_a_session_runs_schedules_warm_and_judges_each_as_before(tmp_path):
    schedules = [Schedule(i, "p", "full", "restore", 3, faults)
                 for i, faults in enumerate([(), ("0:crash@1",), ("2:garble@2",), (), ("1:hang@1",)])]
    with Session(step_timeout=0.5) as warm:      # one session at a time: each owns the process's
        got = [warm.run(WORKLOAD, s) for s in schedules]     # run directories
        assert warm.world.reused > 0
    with Session(step_timeout=0.5, warm=False) as cold:
        want = [cold.run(WORKLOAD, s) for s in schedules]
        assert cold.world is None
    assert [(o.held, o.fired) for o in got] == [(o.held, o.fired) for o in want], \
        [str(o.brk) for o in got + want]
    assert [(o.held, o.fired) for o in got] == \
        [(True, []), (True, ["crash"]), (True, ["garble"]), (True, []), (True, ["hang"])]
