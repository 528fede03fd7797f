"""`launch --timeline FILE`: a Chrome trace of the scheduler's phases and each rank's round trips."""
import json
import subprocess

import pytest

from tests.helpers.external import CLI, REPO

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]   # every test here, one bound



def launch(*args):
    return subprocess.run(CLI + ["launch", *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_timeline_shows_every_phase_every_rank_and_the_recovery(tmp_path):
    path = tmp_path / "timeline.json"
    proc = launch("--fault", "1:crash@2", "--on-rank-loss", "restore", "--timeline", str(path))
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert set(names.values()) >= {"scheduler", "ranks", "rank 0", "rank 1", "rank 2", "rank 3"}
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    phases = [e["name"] for e in spans if e["cat"] == "scheduler"]
    for step in range(6):                          # the demo has 6 steps
        assert f"prepare {step}" in phases and f"commit {step}" in phases
    assert phases.count("execute 2") == 2 and "recover 2" in phases   # the failed attempt, then the retry
    rank_spans = [e for e in spans if e["cat"] == "rank"]
    assert {e["tid"] for e in rank_spans} == {0, 1, 2, 3}
    step2 = [e for e in rank_spans if e["name"] == "step 2"]
    assert sorted(e["args"]["epoch"] for e in step2) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert any("lost" in e["args"]["verdict"] for e in step2 if e["args"]["epoch"] == 0)
    restore, = [e for e in events if e["ph"] == "i"]
    assert restore["name"] == "restore: RankLost" and restore["args"]["ranks"] == [1]


def test_an_unwritable_timeline_is_bad_input(tmp_path):
    proc = launch("--timeline", str(tmp_path / "no" / "such" / "dir.json"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--timeline" in proc.stderr and "Traceback" not in proc.stderr


def test_timeline_shows_each_rank_from_inside_with_flows(tmp_path):
    """Each rank's own decode, execute and encode, inside its round trip, and an arrow from
    each plan's send to the rank and from its result back."""
    path = tmp_path / "timeline.json"
    proc = launch("--world-size", "2", "--timeline", str(path))
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert trace["otherData"]["clock_offsets_us"] == {"rank 0": 0.0, "rank 1": 0.0}   # one host
    trips = {(e["tid"], int(e["name"].split()[1])): e for e in events if e.get("cat") == "rank"}
    inside = [e for e in events if e.get("cat") == "inside"]
    assert len(inside) == 3 * len(trips) == 3 * 2 * 6
    for e in inside:
        trip = trips[(e["tid"], e["args"]["step"])]
        assert trip["ts"] <= e["ts"] and e["ts"] + e["dur"] <= trip["ts"] + trip["dur"] + 1, (e, trip)
    flows = [e for e in events if e.get("cat") == "flow"]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    finishes = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert starts.keys() == finishes.keys() and len(starts) == 2 * len(trips)
    for key, s in starts.items():
        assert s["ts"] <= finishes[key]["ts"]
    assert "Traceback" not in proc.stderr
