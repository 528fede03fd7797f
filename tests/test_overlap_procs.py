"""Overlap scheduling on real processes (mechanism 13): step k+1's plan crosses before step
k's results come back, the trace is the bytes of `run --rung overlap`, and a failure with two
plans in flight keeps each policy's promise; what crossed is logged and said where it belongs:
replies kept for a plan sent ahead are in the wire log when that plan is voided, a failure is
printed under the attempt that failed, and a one-shot fault at the step ahead fires as at
`full`. Real worker processes and sockets."""
from __future__ import annotations

import json

import pytest

from tests.helpers.external import GOLDEN, LADDER, cli, serving_spec

pytestmark = [pytest.mark.timeout(180), pytest.mark.procs]


def overlap_golden(case: str) -> str:
    return (LADDER / f"{case}.overlap.trace.jsonl").read_text()


def records(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def events(log, name: str) -> list[dict]:
    return [r for r in records(log) if r.get("event") == name]


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> str:
    return str(serving_spec(tmp_path_factory.mktemp("serving") / "serving.json", 60, world_size=4))


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


# found: where the failure is seen. A garbled reply to 7 may come while 6 is awaited; nothing in
# it says which step it answers, but its rank has answered 6 by then (a member answers in
# order), so it is 7's failure, seen when 7 is gathered.
@pytest.mark.parametrize("fault,found", [("1:crash@6", {6}), ("0:hang@6", {6}), ("2:disagree@6", {6}),
                                         ("1:crash-after-reply@6", {7}), ("2:garble@7", {7}),
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


# -- what is said and logged with two plans in flight -------------------------------------------

@pytest.fixture(scope="module")
def serving20(tmp_path_factory) -> str:
    """A shorter serving workload for three ranks."""
    return str(serving_spec(tmp_path_factory.mktemp("serving") / "serving20.json", 20, world_size=3))


def test_results_kept_for_a_plan_sent_ahead_are_in_the_wire_log(serving20, tmp_path):
    """Rank 1 answers step 5 late; meanwhile ranks 0 and 2 (and then 1) answer step 6, sent
    ahead: those RESULTs are kept in step 6's round. Step 5 then fails (rank 2 disagrees) and
    the epoch ends. Every RESULT that crossed is in the wire log: those joined as many as the
    metrics count per rank, the ones kept for the voided plan marked void."""
    log, metrics = tmp_path / "w.jsonl", tmp_path / "m.json"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:delay@5:0.3", "--fault", "2:disagree@5", "--spec", serving20,
               "--wire-log", log, "--metrics", metrics)
    assert done.returncode == 0, done.stderr
    logged = {r: 0 for r in range(3)}
    for rec in records(log):
        if rec.get("dir") == "in" and rec.get("type") == "RESULT" and not rec.get("dropped"):
            logged[rec["rank"]] += 1
    counted = {r["rank"]: r["steps"] for r in json.loads(metrics.read_text())["ranks"]}
    assert logged == counted            # every RESULT joined is logged, none counted twice or missed
    void = [r for r in records(log) if r.get("type") == "RESULT" and r.get("dropped") == "void"]
    assert void and all(r["epoch"] == 0 and r["step"] == 6 for r in void)


def test_each_failure_is_printed_under_its_own_attempt(serving20):
    """A repeated crash with two plans in flight: every `! RankLost at step 5, epoch E` line
    must come after the wire line of step 5's attempt in epoch E (the one that failed)."""
    done = cli("launch", "--rung", "overlap", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:crash@5+", "--max-restarts", 2, "--spec", serving20)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    for epoch in (0, 1):
        failure = next(i for i, x in enumerate(lines) if f"RankLost at step 5, epoch {epoch}" in x)
        prefix = "wire plan" if epoch == 0 else f"wire epoch {epoch}, plan"
        attempt = next(i for i, x in enumerate(lines) if x.strip().startswith(prefix) and "lost" in x)
        assert attempt < failure, "\n".join(lines[attempt - 8:attempt + 4])


def test_a_one_shot_fault_at_the_step_ahead_fires_or_is_named(serving20, tmp_path):
    """Rank 1 is killed on receiving plan 5, before it could act on plan 6 (sent ahead).
    Its fault at 6 either fires on the replacement (as at `full`: two restarts) or is named as
    never fired on stderr; it must not vanish without a word."""
    log = tmp_path / "w.jsonl"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:crash@5", "--fault", "1:garble@6", "--spec", serving20, "--wire-log", log)
    assert done.returncode == 0, done.stderr
    restarts = [r for r in records(log) if r.get("event") == "restart"]
    assert len(restarts) == 2, (len(restarts), done.stderr)


def test_a_garbled_reply_to_the_plan_sent_ahead_fails_its_own_step():
    """Under abort, with step 4's plan out while step 3 is collected, rank 1's unreadable reply to
    4 can come before the others have answered 3. Its rank has answered 3 by then, so the reply
    is 4's: step 3 commits, and the run ends at step 4 naming rank 1, every time (it used to end
    at step 3 in about 2 runs of 5)."""
    for _ in range(5):
        done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--step-timeout", 2,
                   "--on-rank-loss", "abort", "--fault", "1:garble@4", "--spec", GOLDEN / "demo.spec.json")
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert done.returncode == 1 and [line.get("step") for line in lines[:-1]] == [0, 1, 2, 3], lines
        last = lines[-1]
        assert last["error"] == "RankLost" and (last["step"], last["rank"]) == (4, 1), last
