"""No output overwrites an input or another output, and an output that fails says so after the
run's own output, which stands: two outputs on one file (by identity, not spelling) or an output
on the workload are bad input before any worker starts; a page that cannot be written or built
is one diagnosis line; the page's private wire log lives where the run-directory sweep reaches."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import tempfile

import pytest

from tests.helpers.external import CLI, ENV, GOLDEN, REPO
from tests.helpers.procs import all_gone, descendants, wait_until

DEMO = GOLDEN / "demo.spec.json"
OUTPUTS = ["--wire-log", "--metrics", "--timeline", "--html"]


def cli(*args, cwd, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("first, second", [(a, b) for i, a in enumerate(OUTPUTS) for b in OUTPUTS[i + 1:]])
def test_two_outputs_on_one_file_are_refused_before_anything_runs(tmp_path, first, second):
    (tmp_path / "sub").mkdir()
    done = cli("launch", first, "out", second, "sub/../out", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert len(done.stderr.splitlines()) == 1 and "it would be overwritten" in done.stderr
    assert not (tmp_path / "out").exists()          # nothing was written, nothing started


@pytest.mark.parametrize("command", ["launch", "run"])
@pytest.mark.parametrize("flag", OUTPUTS)
def test_an_output_on_the_workload_is_refused_and_the_workload_is_untouched(tmp_path, command, flag):
    if command == "run" and flag != "--metrics":
        pytest.skip("run writes only --metrics")
    spec = tmp_path / "w.json"
    spec.write_bytes(DEMO.read_bytes())
    os.link(spec, tmp_path / "hard.json")           # the same file under another name
    done = cli(command, "--spec", "w.json", flag, "hard.json", cwd=tmp_path)
    assert done.returncode == 2 and "is the input --spec w.json" in done.stderr, done.stderr
    assert spec.read_bytes() == DEMO.read_bytes()


@pytest.mark.procs
@pytest.mark.parametrize("args, says", [
    (["--html", "/dev/full"], "--html /dev/full"),
    (["--wire-log", "/dev/null", "--html", "page.html"], "--html page.html"),
])
def test_a_page_that_cannot_be_written_is_one_line_after_the_whole_run(tmp_path, args, says):
    done = cli("launch", "--json", *args, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and len(lines) == 7 and "summary" in json.loads(lines[-1]), done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("error: MachineFailure") and says in done.stderr
    assert "internal error" not in done.stderr
    human = cli("launch", *args, cwd=tmp_path)
    assert human.returncode == 1 and "3/3 requests finished" in human.stdout, human.stdout


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_the_pages_private_wire_log_of_a_killed_run_is_swept_by_the_next(tmp_path):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "inferris-dist-*")))
    proc = subprocess.Popen([*CLI, "launch", "--html", str(tmp_path / "p.html"), "--exec-cost", "20ms",
                             "--spec", str(REPO / "examples" / "faulty.spec.json"),
                             "--on-rank-loss", "restore"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def its_log() -> list[str]:
            now = set(glob.glob(os.path.join(tempfile.gettempdir(), "inferris-dist-*", "wire.jsonl")))
            return [p for p in now if os.path.dirname(p) not in before]
        wait_until(lambda: its_log(), 20)
        left = its_log()
        assert not glob.glob(os.path.join(tempfile.gettempdir(), "inferris-dist-wire-*.jsonl"))
        below = descendants(proc.pid)        # its template and workers hold the run's lock too
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=20)
    assert all(os.path.exists(p) for p in left)          # killed outright: left behind, for now
    assert all_gone(below, 10) == []         # they die with it; until then the run is not gone
    # the next run on processes sweeps it (`run` makes no run directory, so sweeps nothing)
    done = cli("launch", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: not any(os.path.exists(p) for p in left), 10), left


@pytest.mark.procs
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, status, said", [(signal.SIGTERM, 143, "terminated"),
                                               (signal.SIGINT, 130, "interrupted")])
def test_stopped_during_a_long_recovery_the_run_says_what_it_did_and_its_summary(tmp_path, sig, status, said):
    """A fault that keeps coming back restarts rank 0 over and over; SIGTERM or Ctrl-C then: the
    attempts so far, the request table and the rank table are printed, every worker is gone,
    and the exit status says how it was stopped."""
    proc = subprocess.Popen([*CLI, "launch", "--fault", "0:crash@1+", "--max-restarts", "100000",
                             "--on-rank-loss", "restore", "--world-size", "2", "--wire-log", "w.jsonl"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "w.jsonl"
    wait_until(lambda: log.exists() and log.read_text().count('"event": "restart"') >= 3, 30)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert err.strip().splitlines()[-1] == f"inferris-dist: {said}"
    assert "restore: restarted rank 0" in out and "request  state" in out, out[-2000:]
    assert "workers:" in out and "none left running" in out, out[-1000:]
