"""`inferris-dist check` against a log someone edited to pass: each edit is one change to the
wire log of a real restore (4 ranks, rank 2 crashed at step 3), made once per module, and each
is caught with exit status 1 and a violation that names what was changed, first.

1. who was lost and who was replaced: a loss moved onto a rank that answered the step, the
   rank that died going on; then one edit each, its violation said first: a loss of one rank
   with a restart replacing another, a run said failed at a step after which steps committed,
   a restart past max_restarts, one after no failure, one of another policy than the run's,
   one in a run under abort;
2. the reference: a log whose workload and digest are gone says loudly that nothing was
   compared, and --require-reference fails it;
3. a record removed: the root cause first (a restart missing before a line), what follows
   from it folded under it, every violation still in --json, marked;
4. the words: an article fits the message type ("an AUDIT").
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.external import CLI, ENV, REPO

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> list[dict]:
    """The records of a real restore's wire log: 4 ranks, rank 2 crashed at step 3."""
    path = tmp_path_factory.mktemp("tampered") / "restore.jsonl"
    done = subprocess.run([*CLI, "launch", "--world-size", "4", "--fault", "2:crash@3", "--on-rank-loss",
                           "restore", "--wire-log", str(path)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    objs = [json.loads(line) for line in path.read_text().splitlines()]
    lost = [o for o in objs if o.get("event") == "rank-lost"]
    assert [(o["rank"], o["step"], o["epoch"]) for o in lost] == [(2, 3, 0)]
    return objs


def copy(objs: list[dict]) -> list[dict]:
    return json.loads(json.dumps(objs))


def at(objs: list[dict], **want) -> int:
    """The index of the first record with every field `want` says."""
    return next(i for i, o in enumerate(objs) if all(o.get(k) == v for k, v in want.items()))


def check(objs: list[dict], tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return subprocess.run([*CLI, "check", str(path), *flags], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=60)


def first_violation(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout.splitlines()[0]


@pytest.mark.procs
def test_the_real_log_passes(real, tmp_path):
    done = check(real, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    assert done.stdout.endswith("the trace is the reference's\n")


# -- 1. who was lost and who was replaced -----------------------------------------------------

@pytest.mark.procs
def test_a_loss_moved_onto_a_rank_that_answered_is_caught(real, tmp_path):
    objs = copy(real)
    lost = at(objs, event="rank-lost")
    restart = at(objs, event="restart")
    answered = at(objs, type="RESULT", rank=0, step=3, epoch=0)
    objs[lost].update(rank=0, ranks=[0])
    objs[restart]["ranks"] = [0]
    first_plan = at(objs, type="PLAN", epoch=1)
    for o in objs[restart:first_plan]:            # the replacement moved to rank 0 too
        if o.get("rank") == 2 and o.get("epoch") == 1:
            o["rank"] = 0
    done = check(objs, tmp_path)
    said = first_violation(done)
    fired = at(objs, type="FIRED", rank=2)
    goes_on = (f"rank 2's member said at line {fired + 1} that its fault 2:crash@3 fired, yet its RESULT for "
               f"step 3 is taken: it ended at step 3, and no new member holds rank 2 (was another rank "
               f"blamed for its loss?)")
    assert goes_on in done.stdout, done.stdout
    if answered < lost and "dropped" not in objs[answered]:    # it answered before the loss was seen
        assert (f"line {lost + 1}: step 3, epoch 0, rank 0: rank 0 is lost (died) at step 3 in epoch 0, but "
                f"its RESULT for step 3 in epoch 0 was taken at line {answered + 1}") in said, said
    else:                                         # its answer came after, dropped: the rank that died goes on
        assert goes_on in said, said


def restart_of_another_rank(objs: list[dict]) -> str:
    lost, restart = at(objs, event="rank-lost"), at(objs, event="restart")
    objs[restart]["ranks"] = [1]
    return (f"line {restart + 1}: step 3, epoch 1, rank 2: the restart into epoch 1 does not replace rank 2, "
            f"lost at line {lost + 1}")


def failed_before_steps_committed(objs: list[dict]) -> str:
    objs[-1].update(status="failed", error={"error": "RankLost", "message": "rank 1 died", "step": 2,
                                            "rank": 1, "epoch": 1, "reason": "died"})
    return (f"line {len(objs)}: the end says the run failed at step 2, yet steps 2..5 committed (a failed "
            f"step commits nothing, nor does any after it)")


def restart_past_max_restarts(objs: list[dict]) -> str:
    objs[0]["max_restarts"] = 0
    restart = at(objs, event="restart")
    return f"line {restart + 1}: step 3, epoch 1: recovery 1 of a run allowed max_restarts 0"


def restart_after_no_failure(objs: list[dict]) -> str:
    del objs[at(objs, event="rank-lost")]
    return (f"line {at(objs, event='restart') + 1}: step 3, epoch 1: a restart into epoch 1 after no failure "
            f"in epoch 0 (no loss, no step failed, no audit failed, no joined result that fails phase 9)")


def restart_of_another_policy(objs: list[dict]) -> str:
    restart = at(objs, event="restart")
    objs[restart]["policy"] = "recompute"
    return (f"line {restart + 1}: step 3, epoch 1: a restart under policy recompute in a run whose policy is "
            f"restore")


def restart_under_abort(objs: list[dict]) -> str:
    objs[0]["policy"] = "abort"
    return f"line {at(objs, event='restart') + 1}: step 3, epoch 1: a restart in a run whose policy is abort"


@pytest.mark.procs
@pytest.mark.parametrize("edit", [restart_of_another_rank, failed_before_steps_committed,
                                  restart_past_max_restarts, restart_after_no_failure,
                                  restart_of_another_policy, restart_under_abort], ids=lambda f: f.__name__)
def test_one_edit_to_the_history_is_caught_first_in_its_own_words(real, tmp_path, edit):
    objs = copy(real)
    want = edit(objs)
    said = first_violation(check(objs, tmp_path))
    assert want in said, said


# -- 2. the reference -----------------------------------------------------------------------

@pytest.mark.procs
def test_a_log_without_its_workload_says_so_and_can_be_required_to_have_one(real, tmp_path):
    objs = copy(real)
    del objs[0]["workload"], objs[0]["workload_digest"]
    step = at(objs, event="step", step=4)
    objs[step]["trace"]["published"] = {}          # a consistent change no reference sees
    done = check(objs, tmp_path)
    assert done.returncode == 0 and done.stdout.endswith("no reference compared (the log records no "
                                                         "workload)\n"), done.stdout
    assert done.stderr.count("\n") == 1 and "warning: no reference compared" in done.stderr, done.stderr
    assert "--require-reference" in done.stderr
    required = check(objs, tmp_path, "--require-reference")
    assert required.returncode == 1 and required.stdout == done.stdout, required.stdout
    assert "error: no reference compared" in required.stderr, required.stderr
    as_json = check(objs, tmp_path, "--require-reference", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["checked"]["reference"] is None
    assert check(real, tmp_path, "--require-reference").returncode == 0


# -- 3. the root cause first ----------------------------------------------------------------

@pytest.mark.procs
def test_a_restart_removed_is_said_first_and_what_follows_folded(real, tmp_path):
    objs = copy(real)
    del objs[at(objs, event="restart")]
    member = at(objs, event="member", epoch=1) + 1       # the first record of epoch 1 checked
    done = check(objs, tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert (f"line {member}: epoch 1, rank 2: a restart is missing before line {member}: rank 2's member "
            f"admitted in epoch 1, while no restart has moved the run past epoch 0") in lines[0], lines[0]
    as_json = json.loads(check(objs, tmp_path, "--json").stdout)
    violations = as_json["violations"]
    folded = [v for v in violations if v["follows"] is not None]
    assert violations[0]["follows"] is None and len(folded) == len(violations) - 1 >= 10
    assert {v["follows"] for v in folded} == {member}
    assert lines[1].endswith(f": ... and {len(folded)} more that follow from it (--json lists each)")
    assert f": {len(violations)} violations in 6 steps in 7 attempts, 1 epoch, 4 ranks; " in lines[2]
    assert len(lines) == 3, lines


# -- 4. the words ---------------------------------------------------------------------------

@pytest.mark.procs
def test_an_article_fits_the_message_type(real, tmp_path):
    objs = copy(real)
    audit = at(objs, type="AUDIT", rank=1)
    objs[audit]["epoch"] = 0
    said = first_violation(check(objs, tmp_path))
    assert "an AUDIT sent in epoch 0 while the run is in epoch 1" in said, said
