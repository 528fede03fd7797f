"""The examples run as a user runs them: each script of examples/ with the venv's python
(`.venv/bin/python examples/X.py`, from outside the checkout's root where it can be), on a
workload small enough for the suite, printing what it promises. A script that imports what
the installed package does not have, or leans on the current directory, fails here."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from inferris_dist.engine import load_workload

from tests.helpers.external import ENV, EXAMPLES, REPO, SCRIPT
from tests.helpers.netns import netns_skip_reason

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]


def example(name: str, *args, cwd, timeout: float = 90) -> str:
    """`python examples/NAME ARGS...` to its end, from `cwd`; its stdout (exit status 0)."""
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_every_example_is_run_here():
    ran = {"library.py", "serving.py", "bench_boundary.py", "bench_overlap.py", "bench_hosts.py",
           "bench_serve.py", "bench_chaos.py", "bench_page.py", "bench_launch.py", "faults.sh",
           "faulty.spec.json",                        # faults.sh's workload
           "bare_echo.py",                            # bench_boundary.py's transport floor
           "test_my_executor.py",                     # test_testing_api.py: pytest in a clean venv
           "bench_page.py",                           # test_page_scale.py
           "bench_live_parts.py", "bench_arrivals.py"}
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == ran


def test_bench_arrivals(tmp_path):
    """What recording the arrivals costs a step, as docs/performance.md says it (small here)."""
    out = example("bench_arrivals.py", "--requests", 20, "--repeat", 2000, cwd=tmp_path)
    assert re.search(r"^recording a join at world size 4: [\d.]+ us a step", out, re.M), out
    assert re.search(r"^recording's share of a step: [\d.]+%$", out, re.M), out


def test_bench_live_parts(tmp_path):
    """What http.server and prometheus_client would cost the live server, as ARCHITECTURE.md says."""
    out = example("bench_live_parts.py", "--slow-seconds", 6, cwd=tmp_path)
    assert re.search(r"^http\.server: a head of [\d.]+ MB answered 'HTTP/1\.0 200 OK'", out, re.M), out
    assert "a client sending a byte a second held after 6 s: True" in out, out
    observe = r"^an observation: live state \d+ ns, prometheus_client \d+ ns, with a rank label \d+ ns$"
    assert re.search(observe, out, re.M), out


def test_library(tmp_path):
    out = example("library.py", cwd=tmp_path)
    assert re.search(r"^in process: \d+ steps; summary ", out, re.M), out
    assert "on 4 processes: identical; worker pids [" in out, out


def test_serving_writes_its_workload_and_checks_it_against_the_naive_implementation(tmp_path):
    example("serving.py", "--write", tmp_path / "w.json", "--requests", 30, "--world-size", 2, cwd=tmp_path)
    workload = load_workload(json.loads((tmp_path / "w.json").read_text()))
    assert len(workload.requests) == 30 and workload.config.world_size == 2
    out = example("serving.py", "--requests", 30, "--repeat", 1, "--check", cwd=tmp_path)
    assert "serving workload: 30 requests, world_size 1," in out, out
    assert re.search(r"naive SPEC implementation: [\d.]+ s, trace identical", out), out


def test_bench_boundary(tmp_path):
    # --patience: a pair still waits for a quiet machine, but not the 10 s a busy suite would cost it
    out = example("bench_boundary.py", "--requests", 20, "--world-sizes", "1,2", "--pairs", 2, "--turn", 5,
                  "--patience", 0.5, "--json", tmp_path / "b.json", cwd=tmp_path)
    ratio = r"(-?\d+\.\d\d)x \((-?\d+\.\d\d)\.\.(-?\d+\.\d\d)\)"        # median (min..max)
    rows = re.findall(rf"^ +(\d+) +\d+ us +\d+ us +\d+ us +\d+ us +{ratio} +{ratio} +{ratio} +[\d.]+s",
                      out, re.M)
    assert [row[0] for row in rows] == ["1", "2"], out           # every pass's trace was checked
    for row in rows:
        for median, low, high in (row[1:4], row[4:7], row[7:10]):
            assert float(low) <= float(median) <= float(high), out
    assert "a rank's hot path, per step" in out and "each waiting up to 0.5 s" in out, out
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["pairs"] == 2 and doc["patience"] == 0.5 and set(doc["world_sizes"]) == {"1", "2"}, doc
    two = doc["world_sizes"]["2"]
    assert len(two["per_pair"]["overhead/floor"]) == 2 and len(two["seconds"]["floor"]) == 2, two
    assert f"{two['ratios']['overhead/floor']['median']:.2f}x" == rows[1][1] + "x", (two, out)
    assert f"{two['ratios']['overhead/paced floor']['median']:.2f}x" == rows[1][4] + "x", (two, out)
    assert len(two["seconds"]["paced floor"]) == 2 and two["pace_us_per_step"]["median"] > 0, two


def test_bench_overlap(tmp_path):
    out = example("bench_overlap.py", "--requests", 20, "--world-size", 2, "--costs", "0,0.5",
                  "--repeat", 1, cwd=tmp_path)
    rows = [line for line in out.splitlines() if re.match(r"\s*[\d.]+ ms\s+(full|overlap)\s", line)]
    assert len(rows) == 4, out                       # each rung at each cost, traces checked
    assert re.search(r"overlap .*\d\.\d\dx$", rows[1]), out


def test_bench_overlap_splits_a_round_trip_by_the_ranks_own_times(tmp_path):
    out = example("bench_overlap.py", "--requests", 20, "--world-size", 2, "--costs", "1", "--round-trip",
                  cwd=tmp_path)
    rows = {m[1]: [float(x) for x in m.groups()[1:]] for m in re.finditer(
        r"^\s*1 ms\s+(full|overlap)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"full", "overlap"}, out
    for rung, (trip, there, inside, back) in rows.items():
        assert inside >= 0.9, (rung, out)            # the model's 1 ms is spent inside the rank
        assert min(there, back) >= 0 and trip >= inside, (rung, out)


def test_bench_launch_splits_a_launch_into_its_parts(tmp_path):
    out = example("bench_launch.py", "--pairs", 2, "--world-size", 2, cwd=tmp_path)
    assert re.search(r"^launch / run\s+\d+\.\d\dx", out, re.M), out
    parts = dict(re.findall(r"^  (\w+)\s+([\d.]+) ms$", out, re.M))
    assert list(parts) == ["ready", "workers", "handshakes", "steps", "audit", "stopping", "leaving"], out
    launch = float(re.search(r"^launch\s+([\d.]+) ms", out, re.M)[1])
    assert all(float(v) >= 0 for v in parts.values()) and float(parts["ready"]) < launch, out


def test_bench_serve(tmp_path):
    out = example("bench_serve.py", "--requests", 20, "--world-size", 2, "--costs", "0", "--repeat", 1,
                  "--clients", 3, cwd=tmp_path)
    rows = [line for line in out.splitlines() if "us/step best" in line]
    assert [row.split()[0] for row in rows] == ["plain", "wire"] + ["serve"] * 3, out   # traces checked
    assert re.search(r"serve \+ page .*\d\.\d{3}x plain .*\d\.\d{3}x plain's median$", rows[3]), out
    assert re.search(r"serve \+ clients against serve: \d\.\d{3}x best, \d\.\d{3}x median", out), out


def test_bench_hosts(tmp_path):
    out = example("bench_hosts.py", "--requests", 20, "--world-size", 2, "--repeat", 1, cwd=tmp_path)
    assert "CURVE / plaintext, loopback:" in out, out
    if netns_skip_reason() is None:
        assert "veth / loopback, CURVE:" in out, out
    else:
        assert f"(no namespaces: {netns_skip_reason()})" in out, out


def test_bench_chaos(tmp_path):
    out = example("bench_chaos.py", "--schedules", 6, "--mix", 4, "--loop", 2, "--world-size", 2,
                  "--parts", 2, cwd=tmp_path)
    for way, runs in (("chaos --jobs 1 \\(deadline derived\\)", 6), ("chaos --jobs 2", 6),
                      ("a loop of inferris-dist compare", 2)):
        assert re.search(rf"^no deadline\s+{way}\s+{runs}\s+{runs}\s+[\d.]+\s+\d+$", out, re.M), out
    assert re.search(r"^every kind\s+chaos --jobs 2\s+4\s+\d+\s+[\d.]+\s+\d+$", out, re.M), out
    assert "the same report at --jobs 1 and --jobs 2: yes (no deadline), yes (every kind)" in out, out
    assert re.search(r"^chaos --jobs 2 is [\d.]+x the loop", out, re.M), out
    assert re.search(r"^left behind in \S+: nothing$", out, re.M), out
    assert re.search(r"^  with one worker replaced \(1:stale@2\)\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), out


def test_bench_page(tmp_path):
    out = example("bench_page.py", "--scale", 0.01, "--frames", 1, cwd=tmp_path)
    built = r"^(\w+): .*: log [\d.]+ MB, page [\d.]+ MB, built in [\d.]+ s, peak RSS \d+ MiB$"
    assert re.findall(built, out, re.M) == ["restarts", "real32", "lanes"], out
    if "no /usr/bin/chromium" not in out:
        opened = r"^  in Chromium: opened in [\d.]+ s; a frame: fit \d+ ms"
        assert len(re.findall(opened, out, re.M)) == 3, out


def test_faults_sh():
    """Run from the project root, as it says, with the venv's `inferris-dist`."""
    if not SCRIPT.is_file():
        pytest.skip(f"no {SCRIPT}: the script runs the installed command")
    done = subprocess.run(["bash", str(EXAMPLES / "faults.sh")], cwd=REPO, env={**ENV, "CLI": str(SCRIPT)},
                          capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    statuses = re.findall(r"^\(exit status (\d+)\)$", done.stdout, re.M)
    assert statuses == ["1", "0", "0", "1", "1"], done.stdout[-3000:]     # stopped, survived twice, ...
    assert "Traceback" not in done.stdout + done.stderr


def test_bench_overlap_shows_a_ranks_work_at_each_rung(tmp_path):
    out = example("bench_overlap.py", "--requests", 20, "--world-size", 2, "--rank-work", cwd=tmp_path)
    rows = {m[1]: [float(x) for x in m.groups()[1:]] for m in re.finditer(
        r"^(full|overlap) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.M)}
    assert set(rows) == {"full", "overlap"}, out
    for rung, (*parts, total) in rows.items():
        assert abs(sum(parts) - total) < 0.5 and min(parts) >= 0, (rung, out)
