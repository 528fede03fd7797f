"""A rank replies before it writes its shard (the rank's hot path): the writes are off the
scheduler's wait, and the shard is exact again before the next message is read.
A rank that dies between its reply and its writes is found, by the next plan or by the audit,
and restored like any other loss. Real processes."""
from __future__ import annotations

import json

import pytest

from inferris_dist.engine import LocalGroup, load_workload
from inferris_dist.engine.rank import RankExecutor

from tests.helpers.external import GOLDEN, cli

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

DEMO = GOLDEN / "demo.spec.json"
TRACE = (GOLDEN / "demo.trace.jsonl").read_text()


def test_verdicts_then_apply_is_execute():
    """The split is exact: the outcomes do not depend on the shard, and apply writes what
    execute wrote (the in-process group is unchanged)."""
    workload = load_workload(DEMO)
    plans = []

    class Recording(LocalGroup):
        def execute(self, plan):
            plans.append(plan)
            return super().execute(plan)

    from inferris_dist.engine import Engine
    for _ in Engine(workload, Recording(workload)).run():
        pass
    cfg = workload.config
    scripts = {r.request_id: tuple(r.accept_script) for r in workload.requests if r.accept_script}
    whole, split = (RankExecutor(0, 1, cfg.num_pages, cfg.page_size, scripts) for _ in range(2))
    for plan in plans:
        assert split.verdicts(plan) == whole.execute(plan)
        split.apply(plan)
        assert split.shard.snapshot() == whole.shard.snapshot()


def test_an_audit_after_every_step_finds_every_shard_exact():
    done = cli("launch", "--spec", DEMO, "--world-size", 4, "--audit-every", 1, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout == TRACE


@pytest.mark.parametrize("step", [3, 5])      # mid-run (the next plan finds it), the last (the audit)
def test_a_rank_dying_between_reply_and_writes_is_restored(step):
    done = cli("launch", "--spec", DEMO, "--world-size", 4, "--fault", f"1:crash-after-reply@{step}",
               "--on-rank-loss", "restore", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout == TRACE
    human = cli("launch", "--spec", DEMO, "--world-size", 4, "--fault", f"1:crash-after-reply@{step}",
                "--on-rank-loss", "restore")
    assert "restore: restarted rank 1" in human.stdout, human.stdout
    if step == 5:                 # the reply crossed (the fault lets it leave first): the audit finds it
        assert "audited again" in human.stdout, human.stdout


def test_under_abort_the_audit_names_the_rank_that_died_after_replying():
    done = cli("launch", "--spec", DEMO, "--world-size", 4, "--fault", "1:crash-after-reply@5", "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout.splitlines()[-1])
    assert error["error"] == "RankLost" and error["rank"] == 1
