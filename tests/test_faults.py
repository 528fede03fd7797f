"""Fault injection on real processes: every fault kind under every recovery policy.

Real worker processes, real sockets, real signals; no mocks. Every wait is a
loop on a condition with a deadline, and the step timeouts are small (0.5 to
1 s) so a test waits no longer than the fault it studies makes it.

1. each kind of the fault table under abort, restore and recompute (library):
   abort raises the right error kind, attributed (rank, step, epoch 0);
   restore gives the fault-free trace exactly; recompute the fault-free
   summary; duplicate, stale and a short delay leave the trace untouched;
   `@STEP+` exhausts --max-restarts and then fails like abort;
   a few of the same through the CLI (`--json` error object, human stderr);
2. a crash is detected through the process sentinel, not the step deadline;
3. a failed step commits nothing to the control plane (snapshot before/after);
4. faults from outside: SIGKILL and SIGSTOP a worker between steps;
5. after every test, no worker process survives (conftest's leftover check, within GONE_WITHIN);
6. the wire log of a restore run records the loss, the restart and the drops;
7. faults in the workload JSON work like --fault; a bad fault spec is a usage
   error (exit 2, one stderr line).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import inferris_dist
from inferris_dist.engine import BoundaryViolation, EngineError, GroupViolation, RankLost, run_workload
from inferris_dist.engine.errors import ShardDivergence

from tests.helpers.external import CLI, ENV, REPO, cli
from tests.helpers.invariants import check_invariants
from tests.helpers.procs import gone, wait_until

DEMO = REPO / "tests" / "data" / "golden" / "demo.spec.json"

WORLD_SIZE = 4           # the demo's own world size
STEP_TIMEOUT = 1.0       # faults that do not involve the deadline never wait for it
FAST_TIMEOUT = 0.5       # faults that are detected at the deadline (hang, long delay, SIGSTOP)
GONE_WITHIN = 5.0        # seconds for every worker to be gone after a run

# every test here, one bound; conftest's leftover check gives workers GONE_WITHIN to leave
pytestmark = [pytest.mark.timeout(60), pytest.mark.procs(left_within=GONE_WITHIN)]

BASELINE = run_workload(DEMO)            # the fault-free lines: 6 step traces, then the summary
assert len(BASELINE) == 7 and "summary" in BASELINE[-1]


# -- helpers --------------------------------------------------------------------------


def run_lines(faults=(), *, policy="abort", step_timeout=STEP_TIMEOUT,
              world_size=WORLD_SIZE, **kw):
    """Run the demo through `launch`; (lines, error or None, engine). Lines end with the summary.

    The control plane's invariants are checked after every committed step,
    recovered ones included.
    """
    lines: list[dict] = []
    engine = None
    error = None
    try:
        with inferris_dist.launch(DEMO, world_size=world_size, step_timeout=step_timeout,
                                  faults=list(faults), on_rank_loss=policy, **kw) as engine:
            for trace in engine.run():
                lines.append(trace.to_json())
                check_invariants(engine)
            lines.append({"summary": engine.summary()})
    except EngineError as e:
        assert engine is not None, f"launch failed before yielding an engine: {e.to_json()}"
        error = e
    return lines, error, engine


def cli_launch(tmp_path: Path, *args, timeout: float = 60):
    """`inferris-dist launch ... --wire-log`; the completed process and the worker pids it started.

    The pids come from the HELLO messages in the wire log (restarted workers
    too); any worker of ours still running after the test is found by
    conftest's leftover check.
    """
    log = tmp_path / f"wire{len(list(tmp_path.glob('wire*.jsonl')))}.jsonl"
    proc = subprocess.Popen(CLI + ["launch", *map(str, args), "--wire-log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=ENV, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail(f"launch did not finish within {timeout} s")
    pids = [m["body"]["pid"] for m in read_jsonl(log) if m.get("type") == "HELLO" and m.get("dir") == "in"]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), pids


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def demo_with_faults(tmp_path: Path, faults: list[str], name: str = "faulty.json") -> Path:
    data = json.loads(DEMO.read_text())
    data["faults"] = faults
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# -- 1. the fault table, every kind under every policy ---------------------------------

class Case:
    """One row of the fault table: the fault and what abort must report."""

    def __init__(self, name, fault, error=None, *, rank=1, step=2, reason=None, words=(),
                 timeout=STEP_TIMEOUT, audit_every=0):
        self.name, self.fault, self.error = name, fault, error
        self.rank, self.step, self.reason, self.words = rank, step, reason, words
        self.timeout, self.audit_every = timeout, audit_every

    @property
    def survivable(self) -> bool:
        return self.error is None


CASES = [
    Case("crash", "1:crash@2", RankLost, reason="died", words=("rank 1", "SIGKILL")),
    Case("exit", "1:exit@2", RankLost, reason="died", words=("rank 1", "exited with status 0")),
    Case("hang", "1:hang@2", RankLost, reason="timeout", timeout=FAST_TIMEOUT,
         words=("rank 1", "step 2", "0.5 s")),
    Case("delay-below", "1:delay@2:0.1"),
    Case("delay-above", "1:delay@2:1.5", RankLost, reason="timeout", timeout=FAST_TIMEOUT,
         words=("rank 1", "0.5 s")),
    Case("garble", "1:garble@2", RankLost, reason="protocol", words=("rank 1", "protocol")),
    Case("duplicate", "1:duplicate@2"),
    Case("stale", "1:stale@2"),
    # no majority vote: a disagreement blames nobody; the error names the ranks involved
    Case("disagree", "1:disagree@2", GroupViolation, rank=None, words=("rank 1", "accepted")),
    Case("bad-writes-one", "1:bad-writes@2", GroupViolation, rank=None, words=("rank 1", "writes")),
    Case("bad-writes-all", "all:bad-writes@2", BoundaryViolation, rank=None, words=("wrote pages",)),
    Case("drop-write", "1:drop-write@2", ShardDivergence, audit_every=1,
         words=("rank 1", "page ", "offset ")),
    Case("drop-write-final-audit", "1:drop-write@2", ShardDivergence, step=5,
         words=("rank 1", "page ", "offset ")),
]
POLICIES = ["abort", "restore", "recompute"]
MATRIX = [(case, policy) for case in CASES for policy in POLICIES]


@pytest.mark.parametrize("case,policy", MATRIX, ids=[f"{c.name}-{p}" for c, p in MATRIX])
def test_fault_table(case, policy):
    started = time.monotonic()
    lines, error, engine = run_lines([case.fault], policy=policy, step_timeout=case.timeout,
                                     audit_every=case.audit_every)
    elapsed = time.monotonic() - started
    recoveries = engine.take_recoveries()

    if case.survivable:
        assert error is None, error.to_json()
        assert lines == BASELINE
        assert engine.num_restarts == 0 and recoveries == []
        assert engine.group.epoch == 0
        if case.name in ("duplicate", "stale"):
            totals = engine.group.totals
            assert totals[1].dropped > 0, "the extra message was not counted as dropped"
            assert all(totals[r].dropped == 0 for r in range(WORLD_SIZE) if r != 1)
        return

    if policy == "abort":
        assert isinstance(error, case.error), (type(error), error.to_json() if error else lines)
        obj = error.to_json()
        assert obj["error"] == case.error.kind
        assert (error.step, error.epoch) == (case.step, 0), obj
        assert obj["step"] == case.step and obj["epoch"] == 0
        assert error.rank == case.rank, obj
        assert obj.get("rank") == case.rank
        if case.error is GroupViolation:       # every rank is involved; the sides say who said what
            assert obj["ranks"] == [0, 1, 2, 3], obj
            assert {"ranks": [1], "value": obj["sides"][1]["value"]} in obj["sides"], obj
        if case.reason is not None:
            assert error.reason == case.reason and obj["reason"] == case.reason
        for word in case.words:
            assert word in error.message, obj
        assert engine.num_restarts == 0 and recoveries == []
        # the steps before the failure are the fault-free ones (an audit failure follows its step)
        done = case.step + 1 if case.error is ShardDivergence else case.step
        assert lines == BASELINE[:done]
        if case.reason == "died":
            assert elapsed < 3 * case.timeout + 5, "a death was not seen at once"
        return

    # restore and recompute survive a fault that does not come back
    assert error is None, error.to_json()
    assert engine.num_restarts >= 1
    assert engine.group.epoch == engine.num_restarts
    assert recoveries, "no Recovery recorded"
    first = recoveries[0]
    assert (first.kind, first.step, first.epoch, first.policy) == (case.error.kind, case.step, 0, policy)
    if case.rank is not None and case.error in (RankLost, ShardDivergence):
        assert first.rank == case.rank and first.restarted == (case.rank,)
    else:
        assert first.restarted == tuple(range(WORLD_SIZE)), "nobody blamed: every rank restarts"
    assert len(first.pids) == len(first.restarted)
    assert set(first.pids) <= set(engine.group.pids_started)
    assert first.in_audit == (case.error is ShardDivergence)
    if policy == "restore":
        assert lines == BASELINE
        assert first.shard_pages > 0
    else:
        assert lines[-1] == BASELINE[-1], "recompute must generate the same tokens"
        assert first.shard_pages == 0
        assert [l["step"] for l in lines[:-1]] == list(range(len(lines) - 1))
        if not first.in_audit:
            assert set(first.preempted) <= set(lines[case.step]["preempted"]), \
                "the failed step's trace shows the preemptions of the lost pages"


@pytest.mark.parametrize("policy", ["restore", "recompute"])
def test_recurring_fault_exhausts_max_restarts(policy):
    lines, error, engine = run_lines(["1:crash@2+"], policy=policy, max_restarts=2)
    assert isinstance(error, RankLost), lines
    assert (error.rank, error.step, error.reason) == (1, 2, "died")
    assert error.epoch == 2, "the epoch of the last attempt"
    assert engine.num_restarts == 2
    assert "restarts" in error.message and "2" in error.message
    assert "max-restarts" in error.message
    assert lines == BASELINE[:2]
    recoveries = engine.take_recoveries()
    assert [(r.epoch, r.rank) for r in recoveries] == [(0, 1), (1, 1)]
    assert len(engine.group.pids_started) == WORLD_SIZE + 2


def test_max_restarts_zero_fails_like_abort():
    lines, error, engine = run_lines(["1:crash@2"], policy="restore", max_restarts=0)
    assert isinstance(error, RankLost)
    assert (error.rank, error.step, error.epoch) == (1, 2, 0)
    assert "restarts" in error.message
    assert engine.num_restarts == 0 and len(engine.group.pids_started) == WORLD_SIZE


def test_faults_on_surviving_ranks_do_not_disturb_a_restore():
    """A crash and, on other ranks, a duplicate and a stale resend in the same step."""
    lines, error, engine = run_lines(["1:crash@2", "2:duplicate@2", "3:stale@2"],
                                     policy="restore")
    assert error is None, error.to_json()
    assert lines == BASELINE
    assert engine.num_restarts == 1
    assert engine.group.totals[2].dropped > 0 and engine.group.totals[3].dropped > 0


@pytest.mark.parametrize("fault", ["all:crash@2", "all:exit@2"])
def test_one_off_death_of_every_rank_is_survived(fault):
    """Every rank dies once: the ranks found dead are restarted together, within --max-restarts."""
    lines, error, engine = run_lines([fault], policy="restore")
    assert error is None, error.to_json()
    assert lines == BASELINE
    assert 1 <= engine.num_restarts < WORLD_SIZE
    restarted = [r for rec in engine.take_recoveries() for r in rec.restarted]
    assert sorted(restarted) == list(range(WORLD_SIZE)), "each rank replaced exactly once"


def test_one_off_hang_of_every_rank_needs_one_restart():
    lines, error, engine = run_lines(["all:hang@2"], policy="restore", world_size=2,
                                     step_timeout=FAST_TIMEOUT, max_restarts=1)
    assert error is None, error.to_json()
    assert lines == BASELINE
    assert engine.num_restarts == 1


def test_recompute_after_a_failed_audit_shows_the_preemption_in_the_trace():
    lines, error, engine = run_lines(["1:drop-write@2"], policy="recompute", audit_every=1)
    assert error is None and lines[-1] == BASELINE[-1]
    recovery, = engine.take_recoveries()
    assert recovery.in_audit and recovery.preempted == ("r2",)
    assert any("r2" in line["preempted"] for line in lines[3:-1])


# -- 1b. the same through the CLI -----------------------------------------------------

CLI_ABORTS = [
    ("1:crash@2", "RankLost", 1, 2, "died", STEP_TIMEOUT),
    ("2:garble@3", "RankLost", 2, 3, "protocol", STEP_TIMEOUT),
    ("3:hang@1", "RankLost", 3, 1, "timeout", FAST_TIMEOUT),
    ("2:disagree@2", "GroupViolation", None, 2, None, STEP_TIMEOUT),
    ("all:bad-writes@2", "BoundaryViolation", None, 2, None, STEP_TIMEOUT),
]


@pytest.mark.parametrize("fault,kind,rank,step,reason,timeout", CLI_ABORTS,
                         ids=[c[0] for c in CLI_ABORTS])
def test_cli_json_error_object(fault, kind, rank, step, reason, timeout, tmp_path):
    proc, pids = cli_launch(tmp_path, "--spec", DEMO, "--fault", fault,
                            "--step-timeout", timeout, "--json")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = json_lines(proc.stdout)
    assert lines[:-1] == BASELINE[:step]
    last = lines[-1]
    assert last["error"] == kind
    assert last["step"] == step and last["epoch"] == 0
    if rank is not None:
        assert last["rank"] == rank
    else:
        assert "rank" not in last             # nobody to blame
    if kind == "GroupViolation":
        assert last["ranks"] == [0, 1, 2, 3]  # every rank is involved; the sides say who said what
        assert [side["ranks"] for side in last["sides"]] == [[0, 1, 3], [2]]
    if reason is not None:
        assert last["reason"] == reason
    assert len(pids) == WORLD_SIZE


@pytest.mark.parametrize("fault,kind,words", [
    ("1:crash@2", "RankLost", ("rank 1", "SIGKILL")),
    ("1:drop-write@2", "ShardDivergence", ("rank 1", "page", "offset")),
])
def test_cli_human_error_is_one_stderr_line(fault, kind, words, tmp_path):
    proc, _ = cli_launch(tmp_path, "--spec", DEMO, "--fault", fault, "--step-timeout", 1,
                         "--audit-every", 1)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert line.startswith(f"error: {kind} at step 2, epoch 0: "), line
    for word in words:
        assert word in line
    assert "none left running" in proc.stdout
    assert re.search(r" pids(\s+\d+)+", proc.stdout), proc.stdout          # the workers it started


def test_cli_restore_json_is_the_fault_free_output(tmp_path):
    ran = cli("run", "--json", "--spec", DEMO)
    assert ran.returncode == 0
    proc, pids = cli_launch(tmp_path, "--spec", DEMO, "--fault", "1:crash@2",
                            "--fault", "2:garble@4", "--on-rank-loss", "restore",
                            "--step-timeout", 1, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ran.stdout
    assert len(pids) == WORLD_SIZE + 2, "two replacement workers"


def test_cli_recurring_fault_gives_up(tmp_path):
    proc, pids = cli_launch(tmp_path, "--spec", DEMO, "--fault", "1:exit@3+",
                            "--on-rank-loss", "recompute", "--max-restarts", 1,
                            "--step-timeout", 1, "--json")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    last = json_lines(proc.stdout)[-1]
    assert (last["error"], last["rank"], last["step"], last["epoch"]) == ("RankLost", 1, 3, 1)
    assert "restarts" in last["message"]
    assert len(pids) == WORLD_SIZE + 1


# -- 2. detection by sentinel, not by the clock ----------------------------------------

def test_crash_is_seen_long_before_the_step_deadline():
    started = step_started = time.monotonic()
    failed_at = None
    with pytest.raises(RankLost) as info:
        with inferris_dist.launch(DEMO, world_size=WORLD_SIZE, step_timeout=30,
                                  faults=["1:crash@2"]) as engine:
            try:
                for trace in engine.run():
                    step_started = time.monotonic()
            finally:
                failed_at = time.monotonic()
    total = time.monotonic() - started
    assert (info.value.rank, info.value.step, info.value.reason) == (1, 2, "died")
    assert failed_at - step_started < 5, "the death was found by the clock, not the sentinel"
    assert total < 10


# -- 3. a failed step commits nothing ----------------------------------------------------

ATOMIC = [
    ("1:crash@2", RankLost, "execute"),
    ("1:garble@2", RankLost, "execute"),
    ("1:disagree@2", GroupViolation, "execute"),
    ("all:bad-writes@2", BoundaryViolation, "commit"),
]


@pytest.mark.parametrize("fault,error,where", ATOMIC, ids=[a[0] for a in ATOMIC])
def test_failed_step_commits_nothing(fault, error, where):
    with inferris_dist.launch(DEMO, world_size=WORLD_SIZE, step_timeout=STEP_TIMEOUT,
                              on_rank_loss="abort", faults=[fault]) as driver:
        steps = driver.run()
        assert [next(steps).to_json() for _ in range(2)] == BASELINE[:2]
        engine = driver.engine                          # the Engine the distributed engine drives
        prepared = engine.prepare()
        assert prepared.step == 2
        snap = engine.snapshot()
        with pytest.raises(error) as info:
            result = driver.group.execute(prepared.plan)
            assert where == "commit", "execute should have failed"
            assert engine.snapshot() == snap, "execute changed the control plane"
            engine.commit(prepared, result)
        assert engine.snapshot() == snap
        assert engine.step_id == 2
        if where == "execute":
            assert info.value.epoch == 0 and info.value.step in (None, 2)   # the driver's loop sets it
        if error is RankLost:
            assert info.value.rank == 1


# -- 4. faults from outside ------------------------------------------------------------

def run_killing(sig, policy, step_timeout):
    """Run the demo, sending `sig` to rank 2's worker after step 1; (lines, error, engine, victim)."""
    lines: list[dict] = []
    engine = error = victim = None
    try:
        with inferris_dist.launch(DEMO, world_size=WORLD_SIZE, step_timeout=step_timeout,
                                  on_rank_loss=policy) as engine:
            try:
                for trace in engine.run():
                    lines.append(trace.to_json())
                    if trace.step == 1:
                        victim = engine.group.workers[2].pid
                        os.kill(victim, sig)
                lines.append({"summary": engine.summary()})
                if victim is not None and policy != "abort":
                    # the restart replaced it: gone while we are still inside the run
                    assert wait_until(lambda: gone(victim), 2.0), "the replaced worker still runs"
            finally:
                if victim is not None and sig == signal.SIGSTOP:
                    try:
                        os.kill(victim, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
    except EngineError as e:
        error = e
    assert victim is not None
    return lines, error, engine, victim


@pytest.mark.parametrize("policy", ["abort", "restore"])
def test_worker_killed_from_outside(policy):
    lines, error, engine, victim = run_killing(signal.SIGKILL, policy, STEP_TIMEOUT)
    if policy == "abort":
        assert isinstance(error, RankLost), lines
        assert (error.rank, error.step, error.epoch) == (2, 2, 0)
        assert error.reason in ("died", "unreachable")
        assert "SIGKILL" in error.message
        assert lines == BASELINE[:2]
    else:
        assert error is None, error.to_json()
        assert lines == BASELINE
        assert engine.num_restarts == 1
        recovery, = engine.take_recoveries()
        assert (recovery.rank, recovery.step, recovery.epoch) == (2, 2, 0)
        assert victim not in engine.group.pids_started[WORLD_SIZE:]


@pytest.mark.parametrize("policy", ["abort", "restore"])
def test_worker_stopped_from_outside(policy):
    lines, error, engine, victim = run_killing(signal.SIGSTOP, policy, FAST_TIMEOUT)
    if policy == "abort":
        assert isinstance(error, RankLost), lines
        assert (error.rank, error.step, error.epoch, error.reason) == (2, 2, 0, "timeout")
        assert lines == BASELINE[:2]
    else:
        assert error is None, error.to_json()
        assert lines == BASELINE
        recovery, = engine.take_recoveries()
        assert (recovery.kind, recovery.rank, recovery.step) == ("RankLost", 2, 2)
        assert "gave no answer" in recovery.message
    assert wait_until(lambda: gone(victim), GONE_WITHIN)


# -- 6. the wire log of a restore run ---------------------------------------------------

def test_wire_log_records_loss_restart_and_drops(tmp_path):
    log = tmp_path / "wire.jsonl"
    lines, error, engine = run_lines(["1:crash@2", "2:duplicate@1", "3:stale@4"],
                                     policy="restore", wire_log=log)
    assert error is None, error.to_json()
    assert lines == BASELINE
    entries = read_jsonl(log)
    events = [e for e in entries if "event" in e]

    lost = [e for e in events if e["event"] == "rank-lost"]
    assert len(lost) == 1
    assert (lost[0]["rank"], lost[0]["step"], lost[0]["epoch"], lost[0]["reason"]) == (1, 2, 0, "died")
    restart = [e for e in events if e["event"] == "restart"]
    assert len(restart) == 1
    assert (restart[0]["epoch"], restart[0]["ranks"], restart[0]["step"]) == (1, [1], 2)
    assert entries.index(lost[0]) < entries.index(restart[0])

    notes = [e for e in events if e["event"] == "note"]
    dup = [n for n in notes if n["rank"] == 2 and "duplicate" in n["text"]]
    assert dup, notes
    stale = [n for n in notes if n["rank"] == 3 and "dropped" in n["text"]]
    assert stale, notes
    assert all(n["epoch"] == 1 for n in stale), "the stale resend came after the restart"

    # step 2's plan went out in epoch 0 and again in epoch 1; later plans only in epoch 1
    plans = {(m["epoch"], m["step"]) for m in entries if m.get("type") == "PLAN" and m["dir"] == "out"}
    assert {(0, 2), (1, 2)} <= plans
    assert all(epoch == 1 for epoch, step in plans if step > 2)
    # the replacement got its shard from the pool in its CONFIG
    configs = [m for m in entries if m.get("type") == "CONFIG" and m["epoch"] == 1]
    assert [c["rank"] for c in configs] == [1] and configs[0]["body"]["shard"]
    hello_pids = [m["body"]["pid"] for m in entries if m.get("type") == "HELLO"]
    assert sorted(hello_pids) == sorted(engine.group.pids_started)


# -- 7. faults in the workload, and bad fault specs -------------------------------------

def test_faults_in_the_workload_json_work_like_the_flag(tmp_path):
    spec = demo_with_faults(tmp_path, ["1:crash@2"])
    proc, _ = cli_launch(tmp_path, "--spec", spec, "--step-timeout", 1, "--json")
    assert proc.returncode == 1
    last = json_lines(proc.stdout)[-1]
    assert (last["error"], last["rank"], last["step"], last["epoch"], last["reason"]) == \
        ("RankLost", 1, 2, 0, "died")
    # the same through the library, restored: the workload's faults plus one from the caller
    with inferris_dist.launch(spec, world_size=WORLD_SIZE, step_timeout=STEP_TIMEOUT,
                              faults=["3:garble@4"], on_rank_loss="restore") as engine:
        lines = [t.to_json() for t in engine.run()] + [{"summary": engine.summary()}]
        recoveries = engine.take_recoveries()
    assert lines == BASELINE
    assert [(r.rank, r.step) for r in recoveries] == [(1, 2), (3, 4)]


BAD_FAULTS = ["9:crash@1", "1:explode@1", "x", "1:crash", "1:delay@2", "1:crash@2:5", "1:crash@-1"]


@pytest.mark.parametrize("fault", BAD_FAULTS)
def test_bad_fault_spec_is_a_usage_error(fault, tmp_path):
    proc = cli("launch", "--spec", DEMO, f"--fault={fault}", "--json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert fault in proc.stderr


def test_bad_fault_spec_in_the_workload_is_a_usage_error(tmp_path):
    spec = demo_with_faults(tmp_path, ["7:crash@1"])
    proc = cli("launch", "--spec", spec)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "7:crash@1" in proc.stderr
    # and a fault list that is not a list of strings
    spec.write_text(json.dumps({**json.loads(DEMO.read_text()), "faults": [1]}))
    proc = cli("launch", "--spec", spec)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_bad_fault_spec_in_the_library_raises_before_any_worker_starts():
    from inferris_dist.engine import WorkloadError
    for fault in ("4:crash@1", "1:explode@1", "x"):
        with pytest.raises(WorkloadError):
            with inferris_dist.launch(DEMO, world_size=WORLD_SIZE, faults=[fault]):
                pytest.fail("workers started for a bad fault spec")


# -- a fault that fired unseen ---------------------------------------------------------------------

UNSEEN = "fired; no check saw its effect"


@pytest.mark.procs
def test_a_dropped_write_no_audit_saw_is_said_with_how_to_see_it():
    """3:drop-write@4 on the demo fires (its worker says FIRED), the run ends well, and the audit at
    the end finds nothing: said on stderr, the exit status the run's."""
    done = cli("launch", "--world-size", 4, "--fault", "3:drop-write@4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"inferris-dist: fault 3:drop-write@4 {UNSEEN} (if it dropped a write, the page was freed "
            f"before the audit, at the end, could see it; --audit-every 1 checks every step)") in done.stderr
    every = cli("launch", "--world-size", 4, "--fault", "3:drop-write@4", "--audit-every", 1, "--json")
    assert every.returncode == 0, every.stderr
    assert [json.loads(line) for line in every.stdout.splitlines()]          # --json stays clean
    said = [line for line in every.stderr.splitlines() if UNSEEN in line]
    assert said == [f"inferris-dist: fault 3:drop-write@4 {UNSEEN}"], every.stderr   # no reason claimed


@pytest.mark.procs
@pytest.mark.parametrize("args", [
    ("--fault", "3:drop-write@2"),                                  # the audit at the end finds it
    ("--fault", "3:drop-write@2", "--on-rank-loss", "restore"),     # found, and recovered from
    ("--fault", "1:disagree@5"),                                    # a GroupViolation
    ("--fault", "1:duplicate@2"),                                   # dropped and counted by design
], ids=["audit", "recovered", "violation", "tolerated"])
def test_a_fault_a_check_saw_or_the_run_tolerates_is_not_said_to_be_unseen(args):
    done = cli("launch", "--world-size", 4, *args)
    assert done.returncode in (0, 1), done.stderr
    assert UNSEEN not in done.stderr, done.stderr
