"""Mechanism 14, the elastic world, on real processes: a group that shrinks and grows, and an
operator who decides.

- shrink at world size 4 with 1, 2 and 3 ranks killed at different steps: the trace is the
  reference's, the world ends at 3, 2 or 1, every audit passes, and the wire log checks;
- below --min-world-size the run fails (exit 1), naming the floor;
- --regrow: the trace is the reference's and the world returns to the size asked for;
- pause, driven with curl: retry, scale-down and abort keep the promises of the policies they
  stand for; no token or a wrong one gives 401 and changes nothing; one id twice acts once; a
  stale epoch gives 409; /ready is 503 while paused and /health 200; the pause timeout applies
  its default, and says so;
- a rank killed while the run waits for arrivals pauses the run before the next step is planned.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import inferris_dist
from inferris_dist.engine import Engine, load_workload, trace_dicts
from inferris_dist.judge.check import check_log

from tests.helpers.external import CLI, ENV, GOLDEN, Lines
from tests.helpers.procs import wait_until

pytestmark = [pytest.mark.timeout(90)]
CURL = shutil.which("curl")


def reference(workload) -> list[dict]:
    return trace_dicts(Engine(workload))


def assert_checks(log: Path) -> None:
    """The wire log holds a history the boundary allows (inferris-dist check)."""
    report = check_log(log)
    assert report.ok, "\n".join(report.lines())


def events(log: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == kind]


# -- shrink ---------------------------------------------------------------------------------------

@pytest.mark.invariant("elastic-world/1")
@pytest.mark.invariant("elastic-world/2")
@pytest.mark.parametrize("spec,faults", [
    ("random_002", ["1:crash@3"]),
    ("random_003", ["3:crash@2", "0:crash@6"]),
    ("random_004", ["2:crash@1", "1:crash@4", "0:exit@8"]),
])
def test_shrink_keeps_the_trace_at_every_size(tmp_path, spec, faults):
    workload = load_workload(GOLDEN / f"{spec}.spec.json").with_config(world_size=4)
    log = tmp_path / "wire.jsonl"
    with inferris_dist.launch(workload, on_rank_loss="shrink", faults=faults, audit_every=1,
                              wire_log=str(log)) as engine:
        lines = [json.loads(engine.json_line(t)) for t in engine.run()] + [{"summary": engine.summary()}]
        final = engine.group.world_size
    assert lines == reference(workload)
    assert final == 4 - len(faults)
    resizes = events(log, "resize")
    assert [(r["from"], r["to"], r["why"]) for r in resizes] == [(4 - i, 3 - i, "shrink")
                                                                 for i in range(len(faults))]
    audits = {r["epoch"] for r in events(log, "audit")}
    assert {r["epoch"] for r in resizes} <= audits          # the shard audit passed at every size
    assert_checks(log)


@pytest.mark.invariant("elastic-world/3")
def test_below_the_floor_the_run_fails_naming_it():
    proc = subprocess.run([*CLI, "launch", "--spec", str(GOLDEN / "random_001.spec.json"),
                           "--world-size", "4",
                           "--on-rank-loss", "shrink", "--min-world-size", "3", "--fault", "1:crash@2",
                           "--fault", "1:crash@4"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "shrinking would leave 2 ranks, below --min-world-size 3" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.invariant("elastic-world/3")
def test_a_floor_above_the_world_is_bad_input():
    proc = subprocess.run([*CLI, "launch", "--spec", str(GOLDEN / "demo.spec.json"), "--world-size", "2",
                           "--on-rank-loss", "shrink", "--min-world-size", "3"],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--min-world-size 3 is above the world size 2" in proc.stderr


@pytest.mark.invariant("elastic-world/4")
@pytest.mark.invariant("elastic-world/2")
def test_regrow_returns_to_the_size_asked_for(tmp_path):
    workload = load_workload(GOLDEN / "random_004.spec.json").with_config(world_size=4)
    log = tmp_path / "wire.jsonl"
    # steps of 30 ms: a replacement (forked from the template in a few ms) is ready long before
    # the run ends, which it would not wait for
    with inferris_dist.launch(workload, on_rank_loss="shrink", regrow=True, audit_every=2,
                              faults=["1:crash@2", "2:crash@25"], exec_cost="30ms",
                              wire_log=str(log)) as engine:
        lines = [json.loads(engine.json_line(t)) for t in engine.run()] + [{"summary": engine.summary()}]
        final = engine.group.world_size
        left = engine.group.joining
    assert lines == reference(workload)
    assert final == 4 and not left
    resizes = events(log, "resize")
    shrinks = [(r["from"] - r["to"], r["lost"]) for r in resizes if r["why"] == "shrink"]
    assert len(shrinks) == 2 and all(n == 1 for n, _ in shrinks)     # one rank each time
    grown = [r for r in resizes if r["why"] == "regrow"]               # when the replacement was ready
    assert grown and grown[-1]["to"] == 4 and resizes[-1] is grown[-1]
    assert all(r["added"] == list(range(r["from"], 4)) and r["hidden"] >= 0 for r in grown)
    assert_checks(log)


# -- pause, with curl -----------------------------------------------------------------------------

class Paused:
    """`launch --on-rank-loss pause --serve` of a workload, its URL and token read off stderr."""

    def __init__(self, tmp_path: Path, spec: Path, *extra: str, world_size: int = 3):
        self.log = tmp_path / "wire.jsonl"
        self.out = tmp_path / "stdout.jsonl"          # a file: the lines never wait for a reader
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([*CLI, "launch", "--spec", str(spec),
                                          "--world-size", str(world_size),
                                          "--on-rank-loss", "pause", "--serve", "127.0.0.1:0", "--json",
                                          "--wire-log", str(self.log), *extra],
                                         stdout=out, stderr=subprocess.PIPE, env=ENV)
        self.err = Lines(self.proc.stderr)
        said = self.err.until(r"Authorization: Bearer", 30)
        self.url = re.search(r"(http://[0-9.:]+)/fault-tolerance", said).group(1)
        self.token = re.search(r"Bearer ([A-Za-z0-9_-]+)", said).group(1)
        self.token_file = re.search(r"also in (\S+),", said).group(1)

    def curl(self, path: str, *args: str, token: str | None = "") -> tuple[int, dict]:
        token = self.token if token == "" else token
        auth = ["-H", f"Authorization: Bearer {token}"] if token is not None else []
        out = subprocess.run([CURL, "-s", "-w", "\n%{http_code}", *auth, *args, self.url + path],
                             capture_output=True, text=True, timeout=80).stdout
        body, _, code = out.rpartition("\n")
        try:
            return int(code), json.loads(body)
        except ValueError:
            return int(code), {"text": body}

    def apply(self, ident: str, instruction: str, epoch: int, token: str | None = "") -> tuple[int, dict]:
        return self.curl("/fault-tolerance/apply", "-X", "POST", "-H", "Content-Type: application/json",
                         "-d", json.dumps({"id": ident, "instruction": instruction, "epoch": epoch}),
                         token=token)

    def paused(self, timeout: float = 30) -> dict:
        got = {}

        def is_paused() -> bool:
            code, status = self.curl("/fault-tolerance/status")
            got.update(status)
            return code == 200 and status.get("phase") == "paused"
        assert wait_until(is_paused, timeout, interval=0.05), got
        return got

    def finish(self, timeout: float = 60) -> tuple[int, list[dict]]:
        deadline = time.monotonic() + timeout
        while not self.err.eof and time.monotonic() < deadline:    # stderr to its end: the exit
            self.err.pump(deadline - time.monotonic())
        self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return self.proc.returncode, [json.loads(x) for x in self.out.read_text().splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def paused_run(tmp_path):
    runs: list[Paused] = []

    def start(*extra: str, spec: Path = GOLDEN / "random_001.spec.json", world_size: int = 3) -> Paused:
        runs.append(Paused(tmp_path, spec, *extra, world_size=world_size))
        return runs[-1]
    yield start
    for run in runs:
        run.stop()


needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")


@pytest.mark.invariant("elastic-world/5")
@pytest.mark.invariant("elastic-world/6")
@pytest.mark.invariant("elastic-world/7")
@needs_curl
def test_retry_by_curl_restores_and_the_desk_keeps_its_rules(paused_run):
    run = paused_run("--fault", "1:crash@3")
    status = run.paused()
    assert status["lost"] == [{"rank": 1, "reason": "died"}] and status["survivors"] == [0, 2]
    assert status["world_size"] == {"requested": 3, "effective": 3} and "retry" in status["can"]
    epoch = status["epoch"]
    assert os.stat(run.token_file).st_mode & 0o777 == 0o600
    assert run.curl("/ready", token=None)[0] == 503                   # readiness: not while paused
    assert run.curl("/health", token=None)[0] == 200                  # liveness: it serves
    assert run.curl("/fault-tolerance/status", token=None)[0] == 401
    assert run.apply("r1", "retry", epoch, token=None)[0] == 401      # no token: nothing changes
    assert run.apply("r1", "retry", epoch, token="not-the-token")[0] == 401
    assert run.curl("/fault-tolerance/status", "-X", "POST", "-d", "{}")[0] == 405   # GET only there
    assert run.paused()["epoch"] == epoch
    code, stale = run.apply("r0", "retry", epoch - 1)
    assert code == 409 and "not the paused run's epoch" in stale["error"]
    first = run.apply("r1", "retry", epoch)
    again = run.apply("r1", "retry", epoch)                           # the same id: acts once
    assert first == again and first[0] == 200 and first[1]["result"] == "applied"
    code, later = run.apply("r2", "retry", first[1]["epoch"])
    assert code == 409 and "nothing is paused" in later["error"]
    status, lines = run.finish()
    assert status == 0
    workload = load_workload(GOLDEN / "random_001.spec.json").with_config(world_size=3)
    assert lines == reference(workload)
    said = events(run.log, "instruction")
    assert [(i["id"], i["instruction"], i["code"]) for i in said] == [("r1", "retry", 202)]
    assert run.token not in run.log.read_text()                       # never in the log
    assert not os.path.exists(run.token_file)                         # gone with the run
    assert_checks(run.log)


@pytest.mark.invariant("elastic-world/5")
@needs_curl
def test_scale_down_by_ft_keeps_shrinks_promise(paused_run):
    run = paused_run("--fault", "0:crash@4", "--exec-cost", "30ms")   # still running when told again
    run.paused()
    ft = [*CLI, "ft", run.url, "--token-file", run.token_file]
    said = subprocess.run([*ft, "status", "--json"], capture_output=True, text=True, env=ENV, timeout=60)
    assert said.returncode == 0 and json.loads(said.stdout)["phase"] == "paused"
    done = subprocess.run([*ft, "apply", "scale-down", "--json"], capture_output=True, text=True, env=ENV,
                          timeout=90)
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["code"] == 200 and answer["world_size"] == 2, done.stdout
    again = subprocess.run([*ft, "apply", "retry"], capture_output=True, text=True, env=ENV, timeout=60)
    assert again.returncode == 1 and "nothing is paused" in again.stdout
    rc, lines = run.finish()
    assert rc == 0
    assert lines == reference(load_workload(GOLDEN / "random_001.spec.json").with_config(world_size=3))
    assert [(r["why"], r["kept"]) for r in events(run.log, "resize")] == [("scale-down", [1, 2])]
    assert_checks(run.log)


@pytest.mark.invariant("elastic-world/5")
@needs_curl
def test_abort_by_curl_fails_the_run_as_abort_does(paused_run):
    run = paused_run("--fault", "2:crash@5")
    status = run.paused()
    code, answer = run.apply("a1", "abort", status["epoch"])
    assert (code, answer["result"]) == (200, "aborted")
    rc, lines = run.finish()
    assert rc == 1
    assert lines[-1]["error"] == "RankLost" and lines[-1]["step"] == 5 and lines[-1]["rank"] == 2
    assert lines[:-1] == reference(load_workload(GOLDEN / "random_001.spec.json"))[:5]
    assert "the operator said abort" in lines[-1]["message"]


@pytest.mark.invariant("elastic-world/8")
@needs_curl
def test_the_pause_timeout_applies_its_default_and_says_so(paused_run):
    run = paused_run("--fault", "1:crash@2", "--pause-timeout", "0.5")
    rc, lines = run.finish()
    assert rc == 1 and lines[-1]["error"] == "RankLost"
    assert "no instruction within --pause-timeout 0.5 s: abort, the default" in lines[-1]["message"]
    said = events(run.log, "instruction")
    assert [(i["source"], i["instruction"]) for i in said] == [("timeout", "abort")]


@pytest.mark.invariant("elastic-world/9")
@needs_curl
def test_a_loss_while_waiting_for_arrivals_pauses_before_the_next_plan(tmp_path, paused_run):
    spec = tmp_path / "gap.spec.json"
    spec.write_text(json.dumps({
        "engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 16, "spec_len": 0, "world_size": 2},
        "requests": [{"request_id": "early", "prompt_len": 4, "max_new_tokens": 2},
                     {"request_id": "late", "prompt_len": 4, "max_new_tokens": 2, "arrival_step": 150}]}))
    run = paused_run("--exec-cost", "10ms", spec=spec, world_size=2)
    # "early" is done at step 1: from step 2 the run waits for "late" (the log is flushed as it does)
    assert wait_until(lambda: run.log.exists() and '"event": "step", "step": 1,' in run.log.read_text(), 30)
    member = [m for m in events(run.log, "member") if m["rank"] == 1][-1]
    os.kill(member["pid"], signal.SIGKILL)                            # while the run waits for "late"
    status = run.paused()
    assert status["step"] < 150 and "waited for arrivals" in status["message"]
    planned = [json.loads(x) for x in run.log.read_text().splitlines()
               if '"PLAN"' in x and json.loads(x)["step"] >= 150]
    assert planned == []                                              # paused before the next plan
    assert run.apply("i1", "retry", status["epoch"])[0] == 200
    rc, lines = run.finish()
    assert rc == 0 and lines == reference(load_workload(spec))


@pytest.mark.invariant("elastic-world/10")
def test_a_member_honours_resize():
    proc = subprocess.run([*CLI, "conform", "--case", "resize.renumbered", "--case", "resize.before-config",
                           "--json"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    graded = {c["id"]: c["grade"] for c in json.loads(proc.stdout)["cases"] if c["grade"] != "SKIPPED"}
    assert graded == {"resize.renumbered": "PASS", "resize.before-config": "PASS"}


def test_ft_without_a_token_is_bad_input():
    env = {k: v for k, v in ENV.items() if k != "INFERRIS_DIST_TOKEN"}
    proc = subprocess.run([*CLI, "ft", "http://127.0.0.1:9", "status"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no token" in proc.stderr


@pytest.mark.invariant("elastic-world/5")
def test_scale_up_after_a_scale_down_returns_to_the_size_asked_for(tmp_path):
    from inferris_dist.scheduler.operator import Desk
    desk = Desk(pause_timeout=30)
    answers: list = []

    def operator() -> None:
        for move in ("scale-down", "scale-up"):
            with desk.changed:
                desk.changed.wait_for(lambda: desk.status["phase"] == "paused"
                                      and move in desk.status["can"], timeout=30)
                epoch = desk.status["epoch"]
            answers.append(desk.apply(move, move, epoch))
    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    workload = load_workload(GOLDEN / "random_001.spec.json").with_config(world_size=3)
    log = tmp_path / "wire.jsonl"
    with inferris_dist.launch(workload, on_rank_loss="pause", operator=desk,
                              faults=["1:crash@2", "1:crash@6"],
                              wire_log=str(log)) as engine:
        lines = [json.loads(engine.json_line(t)) for t in engine.run()] + [{"summary": engine.summary()}]
        final = engine.group.world_size
    thread.join(timeout=5)
    assert [a[1]["world_size"] for a in answers] == [2, 3] and final == 3
    assert lines == reference(workload)
    assert [(r["why"], r["from"], r["to"]) for r in events(log, "resize")] == [("scale-down", 3, 2),
                                                                              ("scale-up", 2, 3)]
    assert_checks(log)


@pytest.mark.invariant("elastic-world/2")
def test_a_lost_members_last_words_read_after_a_shrink_are_no_fault_of_the_log(tmp_path):
    """A message of the epoch before a shrink may name a rank the smaller world no longer has (a
    lost member's FIRED, read after the resize): the checker takes it as the old world's; the
    same in the new epoch is a rank outside the run's."""
    log = tmp_path / "wire.jsonl"
    done = subprocess.run([*CLI, "launch", "--spec", str(GOLDEN / "random_004.spec.json"),
                           "--world-size", "3", "--fault", "1:crash@2", "--on-rank-loss", "shrink",
                           "--wire-log", str(log), "--json"],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if json.loads(x).get("type") == "RESIZE")
    fired = next(json.loads(x) for x in lines if json.loads(x).get("type") == "FIRED")
    assert fired["epoch"] == 0
    late = dict(fired, rank=2, t=json.loads(lines[at])["t"])                 # rank 2 of the world of 3
    for epoch, ok in ((0, True), (1, False)):
        spoiled = tmp_path / f"late-{epoch}.jsonl"
        spoiled.write_text("\n".join(lines[:at + 1] + [json.dumps(dict(late, epoch=epoch))] + lines[at + 1:])
                           + "\n")
        report = check_log(spoiled)
        outside = [str(v) for v in report.violations if "outside the run's ranks" in str(v)]
        assert (outside == []) is ok, outside
