"""`inferris-dist conform` on real processes: our worker conforms; each broken worker in
tests/data/broken_workers is caught by the case named for what it breaks, within deadlines,
with nothing left running."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from inferris_dist.launcher.command import OUTPUT_BUDGET, TAIL_BYTES

from tests.helpers.procs import wait_until

BROKEN = Path(__file__).parent / "data" / "broken_workers"
ENV = {**os.environ, "PYTHONPATH": str(BROKEN)}

pytestmark = [pytest.mark.procs]


def broken(name: str) -> str:
    return (f"{shlex.quote(sys.executable)} {BROKEN / name}.py --connect {{connect}} --rank {{rank}} "
            f"--world-size {{world_size}}")


def conform(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferris_dist.cli", "conform", *args], capture_output=True,
                          text=True, timeout=timeout, env=env or ENV)


def line_of(out: str, case: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(case + " "))


def all_gone(pids_dir: Path, within: float = 5.0) -> list[int]:
    """The pids written by the workers started, those still running after `within` s."""
    deadline = time.monotonic() + within
    pids = [int(p.name) for p in pids_dir.iterdir()]
    assert pids, "no worker wrote its pid"
    while True:
        left = [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_our_worker_conforms(tmp_path):
    junit = tmp_path / "conform.xml"
    started = time.monotonic()
    done = conform("--junit", str(junit), timeout=80)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert len(cases) >= 40
    ran = [c for c in cases if c.find("skipped") is None]
    assert ran and all(c.find("failure") is None for c in ran)
    assert {"handshake.hello §6.1", "plan.duplicate §8.2", "stop.exit §9.2"} <= {c.get("name") for c in cases}
    print(f"default conform run: {time.monotonic() - started:.1f} s")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker, case", [
    ("ignores_epoch", "epoch.later"),
    ("duplicate_twice", "plan.duplicate"),
    ("stop_late", "stop.exit"),
    ("page_off_by_one", "plan.replay"),
    ("accepted_off_by_one", "plan.replay"),
    ("unsent_reply", "plan.replay"),
    ("config_any_rank", "config.other-rank"),
    ("no_frame_cap", "frame.oversized"),
])
def test_broken_worker_is_caught(worker, case, tmp_path):
    done = conform("--worker", broken(worker), "--case", case, "--keep", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    line = line_of(done.stdout, case)
    assert " FAIL " in line
    assert "again: inferris-dist conform --worker " in done.stdout and f"--case {case}" in done.stdout
    assert (tmp_path / case / "wire.jsonl").exists()


@pytest.mark.timeout(60)
def test_worker_that_never_connects(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.monotonic()
    done = conform("--worker", broken("never_connects"), "--start-timeout", "1", "--case", "handshake.*",
                   "--case", "plan.replay", "--case", "golden.demo.w1",
                   env={**ENV, "CONFORM_PIDS": str(pids)})
    assert done.returncode == 1
    assert time.monotonic() - started < 20
    assert line_of(done.stdout, "handshake.hello").count("never connected within --start-timeout 1 s") == 1
    assert "not run: the worker never connected" in line_of(done.stdout, "plan.replay")
    assert all_gone(pids) == []


@pytest.mark.timeout(60)
def test_worker_deaf_to_stop_and_sigterm_is_killed(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    done = conform("--worker", broken("ignores_stop_and_term"), "--case", "stop.exit",
                   "--case", "golden.demo.w1", env={**ENV, "CONFORM_PIDS": str(pids)})
    assert done.returncode == 1
    assert " FAIL " in line_of(done.stdout, "stop.exit")
    assert " PASS " in line_of(done.stdout, "golden.demo.w1")    # stopped by SIGKILL at the end
    assert all_gone(pids) == []


@pytest.mark.timeout(60)
def test_worker_that_dies_mid_run(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    done = conform("--worker", broken("dies_midrun"), "--case", "plan.replay", "--case", "golden.demo.w1",
                   env={**ENV, "CONFORM_PIDS": str(pids)})
    assert done.returncode == 1
    assert " FAIL " in line_of(done.stdout, "plan.replay")
    assert " FAIL " in line_of(done.stdout, "golden.demo.w1")
    assert all_gone(pids) == []


@pytest.mark.timeout(60)
def test_flooding_worker_costs_bounded_disk(tmp_path):
    done = conform("--worker", broken("floods_stdout"), "--case", "plan.replay", "--keep", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    logs = list((tmp_path / "plan.replay").glob("worker-*.log"))
    assert logs
    for log in logs:
        assert log.stat().st_size <= OUTPUT_BUDGET + TAIL_BYTES + 200
        assert b"bytes of output not kept" in log.read_bytes()[-TAIL_BYTES - 200:]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("worker, says", [
    ("python3 -m x --connect {where}", "unknown placeholder {where}"),
    ("no-such-program-here --connect {connect}", "no such command"),
])
def test_bad_worker_command(worker, says):
    done = conform("--worker", worker)
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(30)
def test_junit_refuses_a_directory_and_an_input(tmp_path):
    done = conform("--junit", str(tmp_path), "--case", "handshake.hello")
    assert done.returncode == 2 and "is a directory" in done.stderr
    script = tmp_path / "w.py"
    script.write_text("print()\n")
    done = conform("--worker", f"{sys.executable} {script} {{connect}}", "--junit", str(script))
    assert done.returncode == 2 and "input" in done.stderr
    assert script.read_text() == "print()\n"


OWN = (f"{shlex.quote(sys.executable)} -m inferris_dist.rank --connect {{connect}} --rank {{rank}} "
       f"--world-size {{world_size}}")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferris_dist.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(60)
def test_launch_and_compare_run_any_worker_command():
    ours = cli("run", "--json")
    assert ours.returncode == 0
    on_command = cli("launch", "--json", "--world-size", "3", "--worker", OWN)
    assert on_command.returncode == 0, on_command.stderr
    assert on_command.stdout == ours.stdout
    restored = cli("compare", "--world-size", "3", "--worker", OWN, "--fault", "1:crash@2",
                   "--on-rank-loss", "restore")
    assert restored.returncode == 0, restored.stderr
    assert "identical" in restored.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", ["launch", "compare"])
def test_a_bad_worker_command_is_bad_input_for_launch_and_compare(command):
    for worker, says in [("python3 {where}", "unknown placeholder {where}"),
                         ("no-such-program-here {connect}", "no such command")]:
        done = cli(command, "--worker", worker)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_chaos_runs_its_schedules_on_a_worker_command():
    """The link's kinds alone unless the worker says it acts out the rank's (--profile faults);
    the runs hold, judged as any other."""
    refused = cli("chaos", "--runs", "2", "--worker", OWN, "--kinds", "crash")
    assert refused.returncode == 2 and "--profile faults" in refused.stderr
    links = cli("chaos", "--runs", "3", "--seed", "3", "--world-size", "2", "--worker", OWN, timeout=100)
    assert links.returncode == 0, links.stdout[-2000:] + links.stderr[-2000:]
    header = links.stdout.splitlines()[0]
    assert "kinds plan-lost, result-lost," in header and "crash" not in header and f"worker {OWN}" in header
    acted = cli("chaos", "--runs", "3", "--seed", "3", "--world-size", "2", "--worker", OWN, "--profile",
                "faults", "--kinds", "crash,garble", timeout=100)
    assert acted.returncode == 0, acted.stdout[-2000:] + acted.stderr[-2000:]
    assert "3 held, none broke" in acted.stdout


@pytest.mark.timeout(120)
def test_the_faults_profile_passes_our_worker_and_is_informational_for_one_without_it():
    ours = conform("--profile", "faults", "--case", "faults.*")
    assert ours.returncode == 0, ours.stdout
    rows = [line for line in ours.stdout.splitlines() if line.startswith("faults.")]
    from inferris_dist.protocol.faults import KINDS, LINK_KINDS
    acted = [k for k in KINDS if k not in LINK_KINDS and k != "hang"]      # a hang is the deadline's
    assert len(rows) == len(acted) == 12 and all(" PASS " in line for line in rows), rows
    without = conform("--profile", "faults", "--case", "faults.*", "--worker", broken("no_faults_profile"))
    assert without.returncode == 0, without.stdout            # the profile is optional
    rows = [line for line in without.stdout.splitlines() if line.startswith("faults.")]
    assert rows and all(" INFORMATIONAL " in line for line in rows), rows


@pytest.mark.timeout(30)
def test_a_junit_file_that_cannot_be_written_loses_no_verdict():
    done = conform("--case", "handshake.hello", "--junit", "/dev/full")
    assert done.returncode == 1
    assert "1 passed, 0 failed" in done.stdout
    said = "inferris-dist conform: cannot write --junit /dev/full: No space left on device"
    assert done.stderr.strip() == said


@pytest.mark.timeout(60)
def test_each_case_runs_once(tmp_path):
    """The scripted cases run on the kit's threads, each once: a worker started for one is
    started once (its log says its start once)."""
    done = conform("--case", "handshake.hello", "--case", "handshake.good", "--case", "stop.exit",
                   "--case", "epoch.later", "--keep", str(tmp_path / "kept"))  # the real one between
    assert done.returncode == 0, done.stdout
    for case in ("stop.exit", "epoch.later"):
        logs = list((tmp_path / "kept" / case).glob("worker-*.log"))
        assert logs, case
        starts = sum(log.read_text(errors="replace").count("inferris-dist worker: rank") for log in logs)
        assert starts == len(logs), (case, starts, len(logs))


@pytest.mark.timeout(60)
def test_a_worker_s_last_words_leave_the_junit_file_well_formed(tmp_path):
    script = tmp_path / "noisy.sh"
    script.write_text("#!/bin/sh\nprintf '\\033[31mboom\\001\\n' >&2\nexit 1\n")
    script.chmod(0o755)
    junit_file = tmp_path / "out.xml"
    done = conform("--worker", f"{script} {{connect}} {{rank}} {{world_size}}", "--case", "handshake.hello",
                   "--junit", str(junit_file), "--start-timeout", "5")
    assert done.returncode == 1
    ET.parse(junit_file)                   # well-formed, whatever the worker said


def test_an_install_without_the_golden_workloads_skips_the_cases_that_need_them(tmp_path):
    from inferris_dist.conform.cases import Kit, Missing, all_cases
    from inferris_dist.conform.runner import exit_status, run_cases
    kit = Kit(OWN, 5.0, Missing())
    cases = [c for c in all_cases(None) if c.id == "plan.replay"]
    results = run_cases(kit, cases, tmp_path, jobs=0)
    assert [r.grade for r in results] == ["SKIPPED"]
    assert "tests/data/golden" in results[0].detail
    assert exit_status(results) == 1          # nothing tried, nothing said of the worker


@pytest.mark.timeout(30)
def test_our_worker_in_the_command_form_leaves_with_the_scheduler_that_started_it(tmp_path):
    """Given the run secret, it was started by a scheduler: when that process is killed with
    SIGKILL, before any connection was made, the worker goes too (protocol.md §3.5)."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-m', 'inferris_dist.rank', '--connect', "
        f"'ipc://{tmp_path}/nobody', '--rank', '0', '--world-size', '1'], stdin=subprocess.PIPE, "
        "start_new_session=True)\n"
        "w.stdin.write(b'ab' * 32 + b'\\n'); w.stdin.close()\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    worker = int(parent.stdout.readline())
    assert "the run secret from stdin" in parent.stderr.readline()     # the worker has taken it
    parent.kill()
    parent.wait(5)
    gone = wait_until(lambda: _ended(worker), 10)
    if not gone:
        os.kill(worker, 9)
    assert gone, "the worker outlived the scheduler that started it"


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
