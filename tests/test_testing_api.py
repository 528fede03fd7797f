"""inferris_dist.testing, the public API for a user's own fault tests: runs on processes with
faults and a policy, the policy's promise judged, the control plane's invariants, and the
example a user copies (examples/test_my_executor.py), run from a clean venv that installed
only the wheel and pytest."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv

import pytest

import inferris_dist
from inferris_dist import testing
from inferris_dist.engine import Engine, WorkloadError, load_workload

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "tests", "data", "golden", "demo.spec.json")


def test_the_package_exports_what_a_fault_test_needs():
    for name in ("Fault", "KINDS", "POLICIES", "Recovery", "RankLost", "EngineError", "GroupViolation",
                 "BoundaryViolation", "ShardDivergence", "WorkloadError", "MachineFailure", "launch",
                 "LaunchOptions", "testing"):
        assert name in inferris_dist.__all__, name
        assert getattr(inferris_dist, name) is not None
    assert inferris_dist.testing is testing


def test_comparable_keeps_an_error_line_by_kind_and_step():
    lines = [{"step": 0, "scheduled": ["a"]}, {"error": "RankLost", "message": "rank 1 died", "step": 3}]
    assert testing.comparable(lines) == [lines[0], {"error": "RankLost", "step": 3}]


def test_judge_holds_for_the_same_trace_and_finds_the_first_difference():
    ref = testing.reference(DEMO)
    assert testing.judge(ref, ref, "restore")["holds"]
    changed = [dict(line) for line in ref]
    changed[2] = {**changed[2], "scheduled": ["nobody"]}
    verdict = testing.judge(ref, changed, "restore")
    assert not verdict["holds"] and verdict["difference"].startswith("step 2, field 'scheduled'")
    with pytest.raises(AssertionError, match="restore does not keep its promise"):
        testing.assert_holds(ref, changed, "restore")


def test_under_recompute_the_summary_is_judged_not_the_steps():
    ref = testing.reference(DEMO)
    other_steps = [{**ref[0], "preempted": ["r0"]}, *ref[1:]]
    verdict = testing.judge(ref, other_steps, "recompute")
    assert verdict["holds"] and verdict["compared"] == "summaries" and not verdict["traces_identical"]
    summary = [dict(r) for r in ref[-1]["summary"]]
    summary[0]["generated"] += 1
    verdict = testing.judge(ref, [*ref[:-1], {"summary": summary}], "recompute")
    assert not verdict["holds"] and "field 'generated'" in verdict["difference"]


def test_a_failed_side_never_holds_unless_both_fail_alike():
    ref = testing.reference(DEMO)
    failed = [*ref[:2], {"error": "RankLost", "message": "rank 1 died", "step": 2}]
    assert not testing.judge(ref, failed, "abort")["holds"]
    assert testing.judge(failed, [*failed[:2], {**failed[2], "message": "other words"}], "abort")["holds"]


def test_check_invariants_passes_every_step_and_is_seen_to_fail():
    eng = Engine(load_workload(DEMO))
    for _ in eng.run():
        testing.check_invariants(eng)
    eng = Engine(load_workload(DEMO))
    next(iter(eng.run()))
    page = eng.requests[0].page_table[0]
    eng.pool.owner[page] = "stranger"                # a page handed to nobody we know
    with pytest.raises(testing.InvariantBroken, match="owned by unknown 'stranger'"):
        testing.check_invariants(eng)


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_run_on_processes_gives_the_lines_the_recoveries_and_the_pids():
    run = testing.run_on_processes(DEMO, faults=["1:crash@2"], policy="restore", step_timeout=2.0)
    assert run.error is None and run.summary is not None
    assert [(r.step, r.rank, r.kind, r.restarted) for r in run.recoveries] == [(2, 1, "RankLost", (1,))]
    assert len(run.pids) == 5                          # four workers and the replacement
    testing.assert_holds(testing.reference(DEMO), run)
    unfired = testing.run_on_processes(DEMO, faults=["1:crash@99"], step_timeout=2.0)
    assert unfired.unfired == ["1:crash@99"] and unfired.error is None


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_an_abort_that_keeps_its_promise_holds_and_one_that_does_not_is_said():
    """abort promises the steps before the failure, exactly, and a failure naming the faulted
    rank: a run that keeps that holds; other steps before it, or a failure blaming a rank no
    fault acted on, do not."""
    reference = testing.reference(DEMO)
    run = testing.run_on_processes(DEMO, faults=["1:crash@3"], policy="abort", world_size=2)
    assert run.error is not None and run.lines[-1]["rank"] == 1 and run.lines[-1]["step"] == 3
    verdict = testing.assert_holds(reference, run)
    assert verdict["holds"]
    assert verdict["kept"] == "the steps before the failure, then RankLost at step 3, epoch 0, rank 1"
    assert testing.assert_holds(reference, run, faults=["1:crash@3"])["holds"]
    with pytest.raises(AssertionError, match=r"abort does not keep its promise \(traces\): it failed with "
                                             r"RankLost at step 3, epoch 0, rank 1, blaming a rank no fault "
                                             r"acted on by step 3 \(acted: 0:crash@3\)"):
        testing.assert_holds(reference, run, faults=["0:crash@3"])
    other = [dict(line) for line in run.lines]
    other[1] = {**other[1], "scheduled": ["nobody"]}
    with pytest.raises(AssertionError, match="the steps before the failure differ: step 1, field 'sched"):
        testing.assert_holds(reference, other, "abort")
    assert not testing.judge(reference, run.lines, "abort")["holds"]     # compare's verdict: a side failed


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_the_example_passes_in_a_clean_venv_with_only_the_wheel_and_pytest(tmp_path, wheel_file):
    """`pip install WHEEL pytest` into a fresh venv (pyzmq and msgpack come as the wheel's own
    dependencies), then pytest on a copy of the example outside the checkout. The venv is made
    without pip of its own (seconds of ensurepip): this pip installs into it (`pip --python`),
    so it holds the wheel, what the wheel depends on and pytest, nothing else."""
    env_dir = tmp_path / "clean"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                                "--disable-pip-version-check", str(wheel_file), "pytest"],
                               env=env, capture_output=True, text=True, timeout=200)
    if installed.returncode != 0:
        pytest.skip(f"cannot install the wheel and pytest from the package index here: "
                    f"{installed.stderr.strip().splitlines()[-1:]}")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(os.path.join(REPO, "examples", "test_my_executor.py"), work)
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_executor.py"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_library_hands_out_the_chaos_names_it_documents_as_chaos_has_them():
    """testing hands out exactly the chaos names docs/library.md lists, the very objects of
    inferris_dist.chaos; the rest of chaos is chaos's own."""
    from inferris_dist import chaos, testing
    documented = {"ChaosConfig", "explore", "Session", "judge_run", "shrink", "write_reproducer",
                  "merge_reports", "WIRE_LOG_CHECKERS"}
    assert documented <= set(testing.__all__)
    assert all(getattr(testing, name) is getattr(chaos, name) for name in documented)
    assert not (set(chaos.__all__) - documented - {"Run", "run_on_processes"}) & set(testing.__all__)
    assert not hasattr(testing, "schedule_at") and not hasattr(testing, "Break")


STARTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec")
_started: list[str] = []
sys.addaudithook(lambda event, args: _started.append(event) if event in STARTS else None)


@pytest.mark.parametrize("kw, error, says", [
    ({"faults": [5]}, TypeError, "faults[0]: want a fault spec"),
    ({"faults": None}, TypeError, "faults: want a list of fault specs"),
    ({"faults": "1:crash@2"}, TypeError, "faults: want a list"),
    ({"faults": ["9:crash@1"]}, WorkloadError, "rank 9 is outside 0..3"),
    ({"check": 5}, TypeError, "check: want a callable"),
    ({"policy": "retry"}, WorkloadError, "policy: want one of abort, restore, recompute"),
    ({"world_size": 0}, WorkloadError, "world_size: want a whole number >= 1"),
    ({"wire_log": "/dev/full"}, WorkloadError, "wire_log '/dev/full': cannot be written"),
    ({"wire_log": "/tmp"}, WorkloadError, "wire_log '/tmp': cannot be written (Is a directory)"),
    ({"on_rank_loss": "restore"}, TypeError, "on_rank_loss: give it as run_on_processes's policy"),
    ({"no_such_option": 1}, TypeError, "unknown options: no_such_option"),
    ({"workload": 5}, TypeError, "workload: want a Workload"),
])
def test_run_on_processes_refuses_a_bad_argument_by_name_before_any_process_starts(kw, error, says):
    workload = kw.pop("workload", DEMO)
    _started.clear()
    with pytest.raises(error) as refused:
        testing.run_on_processes(workload, **kw)
    assert says in str(refused.value), refused.value
    assert isinstance(refused.value, WorkloadError)      # bad input, whatever its type
    assert _started == []                                        # nothing was started, not even a template


def test_a_good_run_is_seen_to_start_processes():
    _started.clear()
    run = testing.run_on_processes(DEMO)
    assert run.error is None and "subprocess.Popen" in _started
