"""`inferris-dist chaos --jobs N`: worlds side by side, one report whatever N; the step deadline
derived from the workload's measured steps; Ctrl-C with N worlds up leaves nothing."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.external import CLI, ENV
from tests.helpers.procs import all_gone, descendants, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

KINDS = "crash,garble,stale,duplicate,result-dup"


def chaos(*args, cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "chaos", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=timeout, stdin=subprocess.DEVNULL)


def test_one_job_and_two_give_the_same_report_apart_from_times(tmp_path):
    args = ("--runs", 8, "--seed", 11, "--kinds", KINDS, "--policy", "restore,recompute",
            "--step-timeout", 0.25, "--json")
    one, two = chaos(*args, "--jobs", 1, cwd=tmp_path), chaos(*args, "--jobs", 2, cwd=tmp_path)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert a.pop("seconds") > 0 and b.pop("seconds") > 0
    assert a == b and a["runs"] == 8 and a["merged_shards"] is None
    text = chaos(*args[:-1], "--jobs", 2, cwd=tmp_path)
    assert text.returncode == 0 and "; 2 jobs" in text.stdout.splitlines()[0], text.stdout


def test_the_step_deadline_is_derived_from_the_measured_steps_and_printed(tmp_path):
    done = chaos("--runs", 2, "--seed", 1, "--kinds", "crash", "--jobs", 1, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    header = done.stdout.splitlines()[0]
    m = re.search(r"step timeout ([\d.]+) s \(derived from (\d+) steps measured: median ([\d.]+) ms, "
                  r"slowest ([\d.]+) ms\)", header)
    assert m, header
    timeout, steps, median, slowest = float(m[1]), int(m[2]), float(m[3]), float(m[4])
    assert 0.1 <= timeout <= 1.0 and steps == 3 * 6 and 0 < median <= slowest   # the demo: 6 steps, 3 runs
    assert timeout >= min(1.0, median / 1e3 * 100 - 1e-9)
    given = chaos("--runs", 1, "--seed", 1, "--kinds", "crash", "--step-timeout", 0.3, "--jobs", 1,
                  cwd=tmp_path)
    assert "step timeout 0.3 s, max restarts" in given.stdout.splitlines()[0], given.stdout
    sharded = chaos("--runs", 2, "--shard", "1/2", "--kinds", "crash", cwd=tmp_path)
    assert "step timeout 0.25 s (a shard's: shards merge under one deadline)" in sharded.stdout, \
        sharded.stdout


def test_jobs_and_shard_together_are_refused_in_one_line(tmp_path):
    done = chaos("--runs", 4, "--jobs", 2, "--shard", "0/2", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["inferris-dist chaos: --jobs runs shards of its own: give "
                                                "--jobs or --shard"], done.stderr
    zero = chaos("--runs", 4, "--jobs", 0, cwd=tmp_path)
    assert zero.returncode == 2 and "--jobs must be >= 1" in zero.stderr


def test_ctrl_c_with_two_worlds_up_exits_130_and_leaves_nothing(tmp_path):
    proc = subprocess.Popen([*CLI, "chaos", "--runs", "100000", "--seed", "2", "--jobs", "2",
                             "--step-timeout", "0.25"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=ENV, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    seen: dict[int, bytes] = {}
    try:
        def two_worlds_up() -> bool:          # both jobs have their ranks' workers running
            below = descendants(proc.pid)
            seen.update(below)
            jobs = [p for p, cmd in below.items() if b"inferris_dist.chaos.jobs" in cmd]
            return len(jobs) == 2 and all(any(b"inferris_dist.rank" in c for c in descendants(j).values())
                                          for j in jobs)
        assert wait_until(two_worlds_up, 60, interval=0.05), seen
        os.killpg(proc.pid, signal.SIGINT)    # as a terminal's Ctrl-C: the whole group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    left = all_gone(seen, 5)
    assert left == [], {p: seen[p] for p in left}
    pids = {proc.pid, *seen}
    assert not [p for p in Path("/tmp").iterdir()
                if any(p.name.startswith((f"inferris-dist-{q}-", f"inferris-chaos-{q}-")) for q in pids)]



def test_by_default_a_job_a_core_but_not_for_a_few_schedules():
    from inferris_dist.cli.cmd_chaos import default_jobs
    from inferris_dist.protocol.limits import usable_cores
    cores = usable_cores()
    assert default_jobs(6, None, (0, 1)) == 1                      # a world is not worth 6 schedules
    assert default_jobs(16, None, (0, 1)) == min(cores, 2)
    assert default_jobs(None, None, (0, 1)) == min(cores, 100 // 8)   # the default 100 runs
    assert default_jobs(None, 60.0, (0, 1)) == cores               # --time: as many as the cores
    assert default_jobs(1000, None, (1, 4)) == 1                   # a shard is a share already
