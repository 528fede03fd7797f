"""Overlap scheduling on real processes (mechanism 13; issue "Mechanism 13, beyond the
original"): step k+1's plan crosses before step k's results come back, the trace is the bytes
of `run --rung overlap`, and a failure with two plans in flight keeps each policy's promise.
Real worker processes and sockets."""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.external import GOLDEN, LADDER, REPO, cli

pytestmark = [pytest.mark.timeout(180), pytest.mark.procs]

sys.path.insert(0, str(REPO / "examples"))
from serving import serving_workload  # noqa: E402


def overlap_golden(case: str) -> str:
    return (LADDER / f"{case}.overlap.trace.jsonl").read_text()


def events(log, name: str) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == name]


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("serving") / "serving.json"
    path.write_text(json.dumps(serving_workload(60, world_size=4)))
    return str(path)


@pytest.fixture(scope="module")
def serving_trace(serving) -> str:
    done = cli("run", "--rung", "overlap", "--json", "--spec", serving)
    assert done.returncode == 0, done.stderr
    assert '"discarded": {"' in done.stdout       # the workload exercises the mechanism
    return done.stdout


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_launch_is_run_byte_for_byte(serving, serving_trace, world_size):
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", world_size, "--spec", serving)
    assert done.returncode == 0, done.stderr
    assert done.stdout == serving_trace


@pytest.mark.parametrize("case", ["speculative", "eos_immediate", "random_011", "cache_eviction"])
def test_golden_workloads_on_processes(case):
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3,
               "--spec", GOLDEN / f"{case}.spec.json")
    assert done.stdout == overlap_golden(case), done.stderr


def test_the_next_plan_crosses_before_the_results_of_the_one_before(serving, tmp_path):
    """What it shows is what happened: in the wire log, step k+1's PLAN goes out to every rank
    before step k's first RESULT is taken, for most steps; at `full`, never."""
    def ahead_steps(rung: str) -> tuple[int, int]:
        log = tmp_path / f"{rung}.jsonl"
        done = cli("launch", "--rung", rung, "--world-size", 2, "--wire-log", log, "--json",
                   "--spec", serving)
        assert done.returncode == 0, done.stderr
        plans_out, ahead, results = set(), 0, set()
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "PLAN" and rec["dir"] == "out":
                plans_out.add(rec["step"])
            elif rec.get("type") == "RESULT" and rec["dir"] == "in" and rec["step"] not in results:
                results.add(rec["step"])
                ahead += rec["step"] + 1 in plans_out
        return ahead, len(results)

    ahead, steps = ahead_steps("overlap")
    assert ahead >= steps // 2, (ahead, steps)
    assert ahead_steps("full")[0] == 0


# found: where the failure is seen. A garbled reply to 7 may come while 6 is awaited (it is
# no message: nothing says which step it answers), so it is seen at 6 or at 7.
@pytest.mark.parametrize("fault,found", [("1:crash@6", {6}), ("0:hang@6", {6}), ("2:disagree@6", {6}),
                                         ("1:crash-after-reply@6", {7}), ("2:garble@7", {6, 7}),
                                         ("0:bad-writes@7", {7})])
def test_restore_with_two_plans_in_flight_keeps_the_trace(serving, serving_trace, fault, found, tmp_path):
    log = tmp_path / "wire.jsonl"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--step-timeout", 2,
               "--on-rank-loss", "restore", "--fault", fault, "--spec", serving, "--wire-log", log)
    assert done.returncode == 0, done.stderr
    assert done.stdout == serving_trace
    restarts = events(log, "restart")
    assert len(restarts) == 1 and restarts[0]["step"] in found
    # the failed step had the next one in flight: its plan went out before the failure
    step = restarts[0]["step"]
    epochs = {r["epoch"] for r in map(json.loads, log.read_text().splitlines())
              if r.get("type") == "PLAN" and r["step"] == step + 1}
    assert epochs == {0, 1}


def test_recompute_with_two_plans_in_flight_keeps_the_summary(serving, serving_trace):
    done = cli("compare", "--rung", "overlap", "--world-size", 3, "--on-rank-loss", "recompute",
               "--fault", "1:crash@6", "--fault", "2:exit@14", "--json", "--spec", serving)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["holds"] is True and verdict["compared"] == "summaries"


def test_a_shard_wrong_behind_a_plan_in_flight_is_found_by_the_audit(serving, serving_trace, tmp_path):
    log = tmp_path / "wire.jsonl"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 2, "--audit-every", 1,
               "--on-rank-loss", "restore", "--fault", "1:drop-write@8", "--spec", serving,
               "--wire-log", log)
    assert done.returncode == 0, done.stderr
    assert done.stdout == serving_trace
    failed = events(log, "audit-failed")
    assert len(failed) == 1 and failed[0]["rank"] == 1 and "diverges" in failed[0]["message"]


def test_abort_with_two_plans_in_flight_names_the_failed_step(serving):
    done = cli("launch", "--rung", "overlap", "--world-size", 3, "--fault", "1:crash@6", "--spec", serving)
    assert done.returncode == 1
    assert "step 6" in done.stderr and "rank 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_exec_cost_changes_the_time_not_the_trace(serving, serving_trace):
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 2, "--exec-cost", "200us+1us/token",
               "--spec", serving)
    assert done.returncode == 0, done.stderr
    assert done.stdout == serving_trace


@pytest.mark.parametrize("bad", ["1", "fast", "1ms+2ms", "-1ms", "20s", "1ms/token+1ms/token"])
def test_a_bad_exec_cost_is_one_line_and_status_2(bad):
    done = cli("launch", "--exec-cost", bad, "--spec", GOLDEN / "demo.spec.json")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--exec-cost" in done.stderr
