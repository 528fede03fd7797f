"""Overlap scheduling on real processes, what a review found (each test failed before its fix):
replies kept for a plan sent ahead are logged when that plan is voided, a failure is printed
under the attempt that failed, and a one-shot fault at the step ahead fires as at `full`."""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.external import REPO, cli

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

sys.path.insert(0, str(REPO / "examples"))
from serving import serving_workload  # noqa: E402


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("serving") / "serving20.json"
    path.write_text(json.dumps(serving_workload(20, world_size=3)))
    return str(path)


def records(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_results_kept_for_a_plan_sent_ahead_are_in_the_wire_log(serving, tmp_path):
    """Rank 1 answers step 5 late; meanwhile ranks 0 and 2 (and then 1) answer step 6, sent
    ahead: those RESULTs are kept in step 6's round. Step 5 then fails (rank 2 disagrees) and
    the epoch ends. Every RESULT that crossed is in the wire log: those joined as many as the
    metrics count per rank, the ones kept for the voided plan marked void."""
    log, metrics = tmp_path / "w.jsonl", tmp_path / "m.json"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:delay@5:0.3", "--fault", "2:disagree@5", "--spec", serving,
               "--wire-log", log, "--metrics", metrics)
    assert done.returncode == 0, done.stderr
    logged = {r: 0 for r in range(3)}
    for rec in records(log):
        if rec.get("dir") == "in" and rec.get("type") == "RESULT" and not rec.get("dropped"):
            logged[rec["rank"]] += 1
    counted = {r["rank"]: r["steps"] for r in json.loads(metrics.read_text())["ranks"]}
    assert logged == counted            # found: {0: 35, 1: 35, 2: 35} against 36 each
    void = [r for r in records(log) if r.get("type") == "RESULT" and r.get("dropped") == "void"]
    assert void and all(r["epoch"] == 0 and r["step"] == 6 for r in void)


def test_each_failure_is_printed_under_its_own_attempt(serving):
    """A repeated crash with two plans in flight: every `! RankLost at step 5, epoch E` line
    must come after the wire line of step 5's attempt in epoch E (the one that failed)."""
    done = cli("launch", "--rung", "overlap", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:crash@5+", "--max-restarts", 2, "--spec", serving)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    for epoch in (0, 1):
        failure = next(i for i, x in enumerate(lines) if f"RankLost at step 5, epoch {epoch}" in x)
        prefix = "wire plan" if epoch == 0 else f"wire epoch {epoch}, plan"
        attempt = next(i for i, x in enumerate(lines) if x.strip().startswith(prefix) and "lost" in x)
        assert attempt < failure, "\n".join(lines[attempt - 8:attempt + 4])


def test_a_one_shot_fault_at_the_step_ahead_fires_or_is_named(serving, tmp_path):
    """Rank 1 is killed on receiving plan 5, before it could act on plan 6 (sent ahead).
    Its fault at 6 either fires on the replacement (as at `full`: two restarts) or is named as
    never fired on stderr; it must not vanish without a word."""
    log = tmp_path / "w.jsonl"
    done = cli("launch", "--rung", "overlap", "--json", "--world-size", 3, "--on-rank-loss", "restore",
               "--fault", "1:crash@5", "--fault", "1:garble@6", "--spec", serving, "--wire-log", log)
    assert done.returncode == 0, done.stderr
    restarts = [r for r in records(log) if r.get("event") == "restart"]
    assert len(restarts) == 2, (len(restarts), done.stderr)
