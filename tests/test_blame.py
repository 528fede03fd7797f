"""Blame that is exact: when ranks disagree the diagnosis says what each rank reported, side by
side (the human line, the error object, the wire log); nothing commits without every rank, and
which side is smaller is said as information, never as a verdict."""
from __future__ import annotations

import json

import pytest

from inferris_dist.engine import GroupViolation, ItemOutcome, RankExecutionResult, join

from tests.helpers.external import CLI, ENV, GOLDEN, REPO

DEMO = GOLDEN / "demo.spec.json"


def results(accepted_by_rank: list[int]) -> list[RankExecutionResult]:
    return [RankExecutionResult(r, len(accepted_by_rank), 5, (ItemOutcome("sysB", 0, 3, a, (1,)),))
            for r, a in enumerate(accepted_by_rank)]


def test_one_rank_against_three_is_named_as_the_minority_and_nobody_is_blamed():
    with pytest.raises(GroupViolation) as got:
        join(results([1, 0, 0, 0]), 4, 5)
    err = got.value
    assert err.message == ("the ranks disagree on item 0 (sysB) accepted: rank 0 says 1; ranks 1, 2, 3 "
                           "say 0 (rank 0 in the minority: nothing commits without every rank)")
    assert err.rank is None and err.ranks == (0, 1, 2, 3)
    assert err.to_json()["sides"] == [{"ranks": [0], "value": 1}, {"ranks": [1, 2, 3], "value": 0}]
    with pytest.raises(GroupViolation) as other:
        join(results([0, 1, 0, 0]), 4, 5)
    assert other.value.message != err.message and "rank 1 says 1" in other.value.message


def test_two_against_two_names_no_minority_and_three_sides_are_all_said():
    with pytest.raises(GroupViolation) as got:
        join(results([1, 1, 0, 0]), 4, 5)
    assert got.value.message == ("the ranks disagree on item 0 (sysB) accepted: ranks 0, 1 say 1; "
                                 "ranks 2, 3 say 0")
    with pytest.raises(GroupViolation) as got:
        join(results([2, 1, 0, 0]), 4, 5)
    assert "rank 0 says 2; rank 1 says 1; ranks 2, 3 say 0" in got.value.message


def test_results_of_different_lengths_say_how_many_each_rank_sent():
    short = results([0, 0])
    short[1] = short[1]._replace(outcomes=())
    with pytest.raises(GroupViolation, match="the number of outcomes: rank 0 says 1; rank 1 says 0"):
        join(short, 2, 5)


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_on_processes_each_liar_is_named_in_the_line_the_error_object_and_the_wire_log(tmp_path):
    import subprocess
    seen = []
    for liar in (0, 1):
        log = tmp_path / f"wire{liar}.jsonl"
        done = subprocess.run([*CLI, "launch", "--spec", str(DEMO), "--world-size", "4", "--json",
                               "--fault", f"{liar}:disagree@2", "--wire-log", str(log)],
                              cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        error = json.loads(done.stdout.splitlines()[-1])
        assert error["error"] == "GroupViolation" and error["step"] == 2
        assert {"ranks": [liar], "value": 2} in error["sides"], error
        assert f"rank {liar} says 2" in error["message"]
        assert f"rank {liar} in the minority" in error["message"]
        failed = [json.loads(line) for line in log.read_text().splitlines() if '"step-failed"' in line]
        assert failed and failed[0]["sides"] == error["sides"] and failed[0]["message"] == error["message"]
        seen.append(error["message"])
    assert seen[0] != seen[1]


@pytest.mark.parametrize("args, says", [
    (["--exec-cost", "10s", "--step-timeout", "10"], "not within --step-timeout 10"),
    (["--exec-cost", "1ms+2ms/token", "--step-timeout", "0.01"], "at the workload's largest step"),
    (["--exec-cost", "１ms"], "not a number"),
    (["--world-size", "４"], "want an integer"),
    (["--fault", "１:crash@2"], "is not an integer"),
    (["--fault", "1:delay@2:٣"], "needs seconds"),
    (["--step-timeout", "1_0"], "want a number of seconds"),
])
@pytest.mark.parametrize("command", ["launch", "compare"])
def test_a_contradiction_or_a_number_not_in_ascii_is_bad_input_before_any_worker(command, args, says):
    """Refused with one line and exit 2, not reported later as a healthy rank giving no answer."""
    import subprocess
    done = subprocess.run([*CLI, command, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
    assert done.stdout == ""
