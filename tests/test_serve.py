"""The live server kept to its bounds and saying what it did (`inferris-dist serve`, `launch --serve`):

1. a log whose steps admit thousands of long request ids that never finish: the server's
   peak memory stays under a bound, and /status and the page say how many requests were not kept;
2. two GETs of the live page with nothing new between them build it once;
3. a log whose first line is no record is not a wire log: one line, exit 2;
4. an attempt in flight (a log cut mid-step) is neither committed nor failed;
5. Ctrl-C during `launch --serve`: one line, exit 130.
"""
from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from inferris_dist.live.server import LiveServer, bind
from inferris_dist.live.state import LiveState

from tests.helpers.external import CLI, ENV, REPO, Lines, serving_spec
from tests.helpers.procs import wait_until

pytestmark = [pytest.mark.timeout(60)]

TRACE_KEYS = ("admitted", "scheduled", "executed", "sampled", "finished", "preempted", "reused", "published",
              "evicted", "drafted", "accepted", "rolled_back")
LISTS = ("admitted", "scheduled", "preempted", "evicted")
PEAK_MB = 80           # the flood below costs a server without a byte budget over 100 MB


def run_event(t: float, requests: int) -> dict:
    return {"t": t, "event": "run", "name": "flood", "world_size": 1, "rung": "full", "policy": "abort",
            "max_restarts": 0, "faults": [], "config": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8,
                                                        "spec_len": 0, "world_size": 1},
            "requests": requests, "scheduler_pid": 1, "listen": None, "shared_clock": True,
            "workload_digest": "sha256:" + "0" * 64}


def end_event(t: float, steps: int) -> dict:
    return {"t": t, "event": "end", "status": "ok", "error": None, "steps": steps}


def write_flood(path: Path, steps: int, per_step: int = 1000, id_bytes: int = 1000) -> None:
    """A wire log whose every step admits `per_step` requests of `id_bytes`-byte ids, none of
    which ever runs or finishes, then its end record."""
    t = 100.0
    with open(path, "w") as f:
        f.write(json.dumps(run_event(t, steps * per_step)) + "\n")
        for s in range(steps):
            t += 0.01
            trace = {k: [] if k in LISTS else {} for k in TRACE_KEYS}
            trace["step"] = s
            trace["admitted"] = [f"{s:06d}-{i:05d}-".ljust(id_bytes, "x") for i in range(per_step)]
            f.write(json.dumps({"t": t, "event": "attempt", "step": s, "epoch": 0, "verdict": "joined",
                                "plan_bytes": 10}) + "\n")
            f.write(json.dumps({"t": t, "event": "step", "step": s, "epoch": 0, "trace": trace,
                                "counters": {}, "prompt_tokens": 0}) + "\n")
        f.write(json.dumps(end_event(t + 0.01, steps)) + "\n")


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def stopped(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


@pytest.mark.procs
def test_a_flood_of_requests_that_never_finish_is_kept_within_a_byte_budget(tmp_path):
    log = tmp_path / "flood.log"
    write_flood(log, 60)                    # 60 MB: 60,000 requests of 1 kB ids in flight at the end
    serve = subprocess.Popen([*CLI, "serve", str(log), "--serve-linger", "60"], cwd=REPO, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        err = Lines(serve.stderr)
        url = err.until(r"serving .* at http://", 20).split(" at ", 1)[1].split(" ", 1)[0]
        err.until(r"the run ended \(ok\), 60 steps", 40)
        peak = peak_kb(serve.pid)
        status = json.loads(get(url + "status"))
        data = json.loads(get(url + "data"))
    finally:
        stopped(serve)
    assert peak < PEAK_MB * 1024, f"peak RSS {peak} kB"
    assert 0 < status["requests_not_kept"] < 60_000, status
    [note] = [n for n in data["notes"] if "not kept" in n]
    assert f"{status['requests_not_kept']:,} requests" in note, note


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> list[dict]:
    """The records of a small serving run's wire log (2 ranks)."""
    tmp = tmp_path_factory.mktemp("serve")
    spec = serving_spec(tmp / "w.json", 6, world_size=2)
    log = tmp / "w.log"
    done = subprocess.run([*CLI, "launch", "--spec", str(spec), "--wire-log", str(log)], cwd=REPO, env=ENV,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_two_gets_of_the_page_with_nothing_new_build_it_once(small_run):
    state = LiveState()
    state.add(small_run)
    server = LiveServer(bind("127.0.0.1", 0), state, lambda: "")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.sock.getsockname()[1]}/"
        first, second = get(url), get(url)
        assert first == second and b"<html" in first.lower()
        assert server.page_builds == 1
        state.add([{"t": 1e3, "event": "note", "rank": None, "epoch": 0, "text": "something new"}])
        assert wait_until(lambda: get(url) != first, 10)
        assert server.page_builds == 2
    finally:
        server.stop()


@pytest.mark.procs
@pytest.mark.parametrize("first", [b"not a record\n", b'{"t": 1}\n', b"\n"])
def test_a_log_whose_first_line_is_no_record_is_refused(tmp_path, first):
    log = tmp_path / "junk.log"
    log.write_bytes(first + b"".join(json.dumps(r).encode() + b"\n" for r in (
        run_event(1.0, 0), end_event(2.0, 0))))
    done = subprocess.run([*CLI, "serve", str(log), "--serve-linger", "0"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "not a wire log" in line and "first line" in line


@pytest.mark.parametrize("where", ["plans sent", "results back"])
def test_an_attempt_in_flight_is_neither_committed_nor_failed(small_run, where):
    """A log cut mid-step: the step's plans sent and no result back, or every result back and
    the verdict not yet written."""
    records = small_run
    middle = [i for i, r in enumerate(records) if r.get("event") == "attempt"][3]
    step = records[middle]["step"]
    cut = middle if where == "results back" else \
        next(i for i, r in enumerate(records) if r.get("type") == "PLAN" and r.get("step") == step) + 1
    state = LiveState()
    state.add(records[:cut])
    data = state.page_data()
    verdicts = [data["strs"][a[4]] for a in data["attempts"]]
    assert verdicts[:-1] == ["joined"] * (len(verdicts) - 1)
    assert verdicts[-1].startswith("in flight"), verdicts[-1]
    assert state.numbers.attempts_failed == 0
    state.add(records[cut:])                   # the rest of the log: the attempt joined
    data = state.page_data()
    assert {data["strs"][a[4]] for a in data["attempts"]} == {"joined"}


@pytest.mark.procs
def test_ctrl_c_during_launch_serve_is_one_line_and_130(tmp_path):
    spec = serving_spec(tmp_path / "w.json", 100, world_size=2)
    run = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--exec-cost", "50ms", "--serve",
                            "127.0.0.1:0", "--json"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        err = Lines(run.stderr)
        said = err.until(r"serving the run at http://", 20)
        url = said.split(" at ", 1)[1].split(" ", 1)[0]
        assert wait_until(lambda: json.loads(get(url + "status"))["steps"] > 0, 20)
        run.send_signal(signal.SIGINT)
        assert run.wait(20) == 130
        err.pump(5)
        while not err.eof:
            err.pump(5)
    finally:
        stopped(run)
    after = err.lines[err.lines.index(said) + 1:]
    assert after == ["inferris-dist: interrupted"], after
