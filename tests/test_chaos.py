"""`inferris-dist chaos`: schedules drawn from a seed, run on real processes and judged; the table,
the coverage, the exit status; shards and their merge; a break shrunk to a reproducer that
reproduces; bad input; Ctrl-C with nothing left running. Every exploration here is bounded in
runs and by the test's timeout."""
from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings

from inferris_dist.chaos import ChaosConfig, explore, schedule_at
from inferris_dist.chaos.exploring import shard_indices
from inferris_dist.chaos.schedules import fault_kinds, random_workloads
from inferris_dist.cli.main import main
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload
from inferris_dist.protocol.faults import KINDS, Fault, parse_fault

from tests.helpers.external import CLI, ENV
from tests.helpers.procs import descendants, leftover_workers, wait_until
from tests.helpers.schedules import fault_schedules

pytestmark = [pytest.mark.timeout(90)]

TABLE_ROW = re.compile(r"^(\S+)((?:\s+\d+/\d+)+)$", re.M)


def chaos(*args, cwd: Path, timeout: float = 80) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "chaos", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=timeout, stdin=subprocess.DEVNULL)


def table(out: str) -> dict[str, list[tuple[int, int]]]:
    """The kind x policy table of chaos's output: kind -> [(runs, breaks), ...] per column."""
    return {m.group(1): [tuple(map(int, c.split("/"))) for c in m.group(2).split()]
            for m in TABLE_ROW.finditer(out)}


def demo_config(seed: int, **kw) -> ChaosConfig:
    return ChaosConfig([("demo", load_workload(DEMO))], seed=seed, **kw)


# -- exploring ------------------------------------------------------------------------------------

@pytest.mark.procs
@pytest.mark.parametrize("workloads", [(), ("--random-workloads",)], ids=["demo", "random-workloads"])
def test_forty_schedules_at_both_rungs_under_restore_and_recompute_all_hold(tmp_path, workloads):
    done = chaos("--runs", 40, "--seed", 3 if not workloads else 1, "--rung", "full,overlap", *workloads,
                 cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^40 runs in [\d.]+ s \([\d,]+ a minute\): 40 held, none broke$", out, re.M), out
    header = next(line for line in out.splitlines() if line.startswith("kind "))
    assert header.split()[1:] == ["restore", "full", "restore", "overlap", "recompute", "full",
                                  "recompute", "overlap"], header
    rows = table(out)
    assert set(rows) == set(KINDS) | {"total"}, rows             # every kind a row, then the total
    assert [runs for runs, _ in rows["total"]] == [10, 10, 10, 10]
    assert all(b == 0 for cells in rows.values() for _, b in cells)
    assert "coverage: " in out
    assert not list(tmp_path.iterdir()), "nothing written when nothing broke"


def test_the_same_seed_draws_the_same_schedules_whoever_draws_them():
    def steps(w, r):
        return 6
    a = [schedule_at(demo_config(5), i, steps) for i in range(60)]
    b = [schedule_at(demo_config(5), i, steps) for i in reversed(range(60))][::-1]
    assert a == b                                                # independent of the order drawn
    assert a != [schedule_at(demo_config(6), i, steps) for i in range(60)]
    kinds = fault_kinds()
    for s in a:
        assert 1 <= len(s.faults) <= 3 and len(set(s.faults)) == len(s.faults)
        for spec in s.faults:
            fault = parse_fault(spec, s.world_size)
            assert fault.kind in kinds and 0 <= fault.step < 6
    drawn = {parse_fault(f).kind for s in a for f in s.faults}
    assert drawn == set(KINDS), "every kind is drawn by default"
    assert [s.policy for s in a[:4]] == ["restore", "recompute", "restore", "recompute"]
    assert random_workloads(5) == random_workloads(5)


def test_kinds_and_what_each_takes_are_read_from_the_fault_grammar():
    kinds = fault_kinds()
    assert list(kinds) == list(KINDS)
    assert kinds["delay"].arg == "seconds" and kinds["crash"].arg is None
    s = schedule_at(demo_config(1, kinds={"delay": 1.0}, max_faults=3), 0, lambda w, r: 6)
    assert all(re.fullmatch(r"(\d|all):delay@\d\+?:[\d.]+", f) for f in s.faults), s.faults


@settings(max_examples=40, deadline=None)
@given(fault_schedules(world_size=4, steps=6))
def test_every_schedule_the_strategy_draws_is_valid_input(faults):
    for spec in faults:
        assert parse_fault(spec, 4).step < 6


@settings(max_examples=40, deadline=None)
@given(fault_schedules(world_size=4, steps=6))
def test_a_fault_written_from_its_fields_reads_back_as_the_same_fault(faults):
    """Fault.format is what the shrinker writes when it moves a fault: Fault.parse reads it back
    to the same fault, moved or not, and a drawn fault is written as it was drawn."""
    for spec in faults:
        fault = Fault.parse(spec, 4)
        assert fault.format() == spec
        for moved in (fault._replace(step=0), fault._replace(rank=0),
                      fault._replace(repeat=not fault.repeat)):
            again = Fault.parse(moved.format(), 4)
            assert again == moved._replace(text=moved.format())


@pytest.mark.procs
def test_a_time_bound_ends_the_exploration_after_the_run_in_progress():
    started = time.monotonic()
    report = explore(demo_config(2, kinds={"duplicate": 1.0}), seconds=0.5)
    assert report.runs >= 1 and not report.breaks
    assert time.monotonic() - started < 10
    assert report.to_json()["config"]["time"] == 0.5 and report.to_json()["config"]["schedules"] is None


def test_shards_are_disjoint_and_together_the_unsharded_run():
    for n in (1, 2, 3, 7):
        shards = [list(shard_indices((k, n), 50)) for k in range(n)]
        flat = [i for s in shards for i in s]
        assert sorted(flat) == list(range(50)) and len(flat) == len(set(flat))
        assert all(i % n == k for k, s in enumerate(shards) for i in s)


@pytest.mark.procs
def test_shards_merge_into_the_unsharded_table(tmp_path):
    args = ("--runs", 6, "--seed", 4, "--kinds", "duplicate,stale,crash", "--step-timeout", 0.25, "--json")
    whole = chaos(*args, cwd=tmp_path)
    parts = [chaos(*args, "--shard", f"{k}/2", cwd=tmp_path) for k in range(2)]
    for done in (whole, *parts):
        assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(d.stdout) for d in parts]
    assert [r["runs"] for r in reports] == [3, 3]
    assert not any(r["breaks"] for r in reports)
    for k, p in enumerate(parts):
        (tmp_path / f"r{k}.json").write_text(p.stdout)
    merged = subprocess.run([*CLI, "chaos", "merge", "r0.json", "r1.json", "--json"], capture_output=True,
                            text=True, cwd=tmp_path, env=ENV, timeout=30)
    assert merged.returncode == 0, merged.stderr
    got, want = json.loads(merged.stdout), json.loads(whole.stdout)
    assert got["runs"] == want["runs"] == 6 and got["shard"] == {"index": 0, "count": 1}
    assert [(r["kind"], r["runs"]) for r in got["table"]] == [(r["kind"], r["runs"]) for r in want["table"]]
    assert got["config"] == want["config"] and got["merged_shards"] == [[0, 2], [1, 2]]
    text = subprocess.run([*CLI, "chaos", "merge", "r0.json", "r1.json"], capture_output=True, text=True,
                          cwd=tmp_path, env=ENV, timeout=30)
    assert text.returncode == 0 and "seed 4, all 2 shards" in text.stdout, text.stdout
    assert re.search(r"^6 runs in ", text.stdout, re.M), text.stdout

    other = dict(reports[1], seed=5)
    (tmp_path / "other.json").write_text(json.dumps(other))
    for files, says in ((["r0.json", "other.json"], "different seeds"),
                        (["r0.json", "r0.json"], "given twice"), (["r0.json", "nope.json"], "nope.json")):
        refused = subprocess.run([*CLI, "chaos", "merge", *files], capture_output=True, text=True,
                                 cwd=tmp_path, env=ENV, timeout=30)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def a_report(tmp_path_factory) -> dict:
    """A real report of two schedules, one of which broke (--max-restarts 0 under restore)."""
    done = chaos("--runs", 2, "--seed", 3, "--policy", "restore", "--max-restarts", 0, "--no-shrink",
                 "--json", cwd=tmp_path_factory.mktemp("report"))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["runs"] == 2 and report["broke"] >= 1
    return report


def _with(report: dict, path: str, value) -> dict:
    """A copy of `report` with the field at `path` (a.b.0.c) set to `value` (a float of JSON's, too)."""
    out = json.loads(json.dumps(report))
    *head, last = path.split(".")
    at = out
    for key in head:
        at = at[int(key)] if isinstance(at, list) else at[key]
    at[int(last) if isinstance(at, list) else last] = value
    return out


@pytest.mark.parametrize("path, value, says", [
    ("shard", {"index": 5, "count": 3}, "shard is 5 of 3: want K/N with 0 <= K < N"),
    ("shard.count", 0, "shard is 0 of 0"),
    ("shard.index", -1, "shard.index is -1: want a whole number"),
    ("runs", 1e30, "runs is 1e+30: want a whole number within 0..1000000000000"),
    ("runs", "2", 'runs is "2": want a whole number'),
    ("runs", True, "runs is true: want a whole number"),
    ("held", -5, "held is -5: want a whole number"),
    ("held", 2, "held (2) and broke"),
    ("broke", 0, "broke (0) is not the number of its breaks"),
    ("seconds", -1, "seconds is -1"),
    ("seed", 2.5, "seed is 2.5: want int"),
    ("breaks.0.index", 1.5, "breaks[0].index is 1.5"),
    ("table.0.breaks", 9, "table[0] has more breaks (9) than runs"),
    ("table.0.runs", 3, "table[0].runs is 3: want a whole number within 0..2"),
    ("totals", [], "totals do not add up to its runs (2)"),
    ("merged_shards", [[0, 2], [2, 2]], "merged_shards[1] is 2 of 2"),
    ("config", [], "config is []: want object"),
    ("coverage", {}, "without coverage.fired"),
])
def test_a_report_with_a_bad_field_is_refused_by_merge_naming_the_field(tmp_path, capsys, a_report, path,
                                                                          value, says):
    (tmp_path / "bad.json").write_text(json.dumps(_with(a_report, path, value)))
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["chaos", "merge", str(tmp_path / "bad.json")]) == 2
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err
    assert says in err and "bad.json" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_a_sound_report_merges_alone(tmp_path, capsys, a_report):
    (tmp_path / "r.json").write_text(json.dumps(a_report))
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["chaos", "merge", str(tmp_path / "r.json"), "--json"]) == 1     # it holds a break
    finally:
        signal.signal(signal.SIGTERM, before)
    merged = json.loads(capsys.readouterr().out)
    assert merged["runs"] == 2 and merged["broke"] == a_report["broke"]


# -- a break, shrunk, reproduced ---------------------------------------------------------------------

@pytest.mark.procs
@pytest.mark.parametrize("args,noted", [
    (("--max-faults", "4"), True), (("--max-faults", "4", "--max-restarts", "4"), False),
    (("--max-faults", "4", "--policy", "abort"), False), ((), False)])
def test_more_faults_a_schedule_than_restarts_is_said_before_it_runs(tmp_path, args, noted):
    done = chaos("--runs", "1", "--seed", "1", "--no-shrink", *args, cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    said = "runs out of restarts, a break by the budget" in done.stderr
    assert said == noted, done.stderr


def test_no_restarts_breaks_restore_and_shrinks_to_one_fault_with_a_reproducer_that_reproduces(tmp_path):
    done = chaos("--policy", "restore", "--max-restarts", 0, "--runs", 3, "--seed", 3, "--reruns", 3,
                 "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["breaks"] and report["breaks"][0]["class"] == "failed"
    assert "gave up after 0 restarts" in report["breaks"][0]["reason"]
    shrunk = report["breaks"][0]["shrunk"]
    assert len(shrunk["faults"]) == 1 and shrunk["requests"] <= 2, shrunk
    repro = shrunk["reproducer"]
    assert repro["broke"] == repro["of"] == 3, repro
    spec = tmp_path / repro["spec"]
    assert spec.parent.name == "chaos-seed-3" and spec.is_file()
    assert len(load_workload(spec).requests) <= 2
    argv = shlex.split(repro["command"])
    assert argv[:2] == ["inferris-dist", "compare"] and "--max-restarts" in argv
    again = subprocess.run([*CLI, *argv[1:]], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                           timeout=30)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "the run on processes failed" in again.stdout and "gave up after 0 restarts" in again.stdout

    second = chaos("--policy", "restore", "--max-restarts", 0, "--runs", 1, "--seed", 3, "--reruns", 1,
                   cwd=tmp_path)                        # the same seed again: a fresh directory
    assert second.returncode == 1
    assert (tmp_path / "chaos-seed-3-2").is_dir() and spec.is_file()     # the first one left as it was
    assert re.search(r"^    reproduce: inferris-dist compare --spec chaos-seed-3-2/break-0\.spec\.json ",
                     second.stdout, re.M), second.stdout
    assert re.search(r"^    broke 1 of 1$", second.stdout, re.M), second.stdout


# -- bad input, Ctrl-C -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--kinds", "crash,nope"], "unknown kind 'nope'"),
    (["--kinds", "crash=-1"], "weight of crash"),
    (["--shard", "2/2"], "want K/N"),
    (["--runs", "0"], "--runs must be >= 1"),
    (["--runs", "3", "--time", "3"], "exclusive"),
    (["--time", "5x"], "want a duration"),
    (["--policy", "restore,nope"], "unknown policy 'nope'"),
    (["--rung", "top"], "unknown rung 'top'"),
    (["--world-size", "0"], "within 1..256"),
    (["--max-faults", "0"], "--max-faults"),
    (["--random-workloads", "--spec", "x.json"], "exclusive"),
    (["--spec", "no-such-file.json"], "no-such-file.json"),
])
def test_bad_input_is_one_line_and_exit_status_2(capsys, args, says):
    before = signal.getsignal(signal.SIGTERM)        # main() installs its own: not for pytest to keep
    try:
        assert main(["chaos", *args]) == 2
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("out", ["file/sub", "/proc/chaos-out", "dangling", "file"])
def test_an_out_directory_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, out):
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    started = time.monotonic()
    done = chaos("--policy", "restore", "--max-restarts", 0, "--runs", 50, "--seed", 3, "--out", out,
                 cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert f"--out {out}: reproducers cannot be written there" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert time.monotonic() - started < 10          # refused at once: no exploration ran


def test_a_fresh_out_directory_is_checked_and_made_only_when_something_broke(tmp_path):
    done = chaos("--runs", 1, "--seed", 1, "--kinds", "duplicate", "--out", "a/b", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "a").exists()           # the check's directories are gone again


@pytest.mark.procs
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_reproducer_that_cannot_be_written_keeps_the_report_and_says_so_in_one_line(tmp_path, as_json):
    """--out a/b passes the check; once the exploration is under way `a` becomes a file, so the
    reproducer has nowhere to go."""
    proc = subprocess.Popen([*CLI, "chaos", "--policy", "restore", "--max-restarts", "0", "--runs", "1",
                             "--seed", "3", "--reruns", "0", "--shrink-runs", "2", "--out", "a/b",
                             *(["--json"] if as_json else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=ENV, stdin=subprocess.DEVNULL)
    try:
        if as_json:                                   # workers up: the check is behind us
            assert wait_until(lambda: descendants(proc.pid), 20)
        else:
            assert proc.stdout.readline().startswith("chaos: seed 3")
        (tmp_path / "a").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    said = [line for line in err.splitlines() if not line.startswith("inferris-dist: note:")]
    assert len(said) == 1 and "Traceback" not in err, err
    assert re.match(r"inferris-dist chaos: the reproducer of the break at schedule 0 could not be written "
                    r"to a/b/break-0\.spec\.json \(Not a directory\); the report stands without it$",
                    said[0]), err
    if as_json:
        report = json.loads(out)
        assert report["broke"] == 1 and report["breaks"][0]["shrunk"]["reproducer"] is None, report
        assert report["breaks"][0]["shrunk"]["faults"], report
    else:
        assert re.search(r"^1 run in [\d.]+ s .*: 0 held, 1 broke$", out, re.M), out
        assert re.search(r"^shrunk the break at schedule 0 \(failed\)", out, re.M), out
        assert "reproduce:" not in out


@pytest.mark.procs
def test_ctrl_c_mid_run_exits_130_with_nothing_left_running(tmp_path):
    proc = subprocess.Popen([*CLI, "chaos", "--runs", "1000", "--seed", "1", "--jobs", "1"],   # a warm world
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().startswith("chaos: seed 1")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(b"inferris_dist.rank" in cmd
                                                      for cmd in leftover_workers(0).values()):
            time.sleep(0.02)                      # a run's workers are up: mid-run
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert leftover_workers(5) == {}
    assert not [p for p in Path("/tmp").iterdir() if p.name.startswith(f"inferris-dist-{proc.pid}-")]
    assert not [p for p in Path("/tmp").iterdir() if p.name.startswith(f"inferris-chaos-{proc.pid}-")]
