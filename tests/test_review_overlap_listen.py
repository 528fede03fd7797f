"""Review of overlap scheduling: `launch --listen` with external workers at rung overlap
(real processes, loopback, CURVE keys)."""
from __future__ import annotations

import json
import signal

import pytest
from external import GOLDEN, Scheduler, exit_line, run_json, start_worker

pytestmark = [pytest.mark.timeout(90), pytest.mark.procs]

SPEC = GOLDEN / "random_011.spec.json"


def test_listen_overlap_json_is_run_json(tmp_path, keys, procs):
    n = 3
    want = run_json(SPEC, "--rung", "overlap")
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", SPEC, "--rung", "overlap",
                       "--world-size", n, "--json", "--wire-log", tmp_path / "w.jsonl"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(workers)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    for w in workers:
        assert exit_line(w, 10)[0] == 0


@pytest.mark.parametrize("policy", ["restore", "recompute"])
def test_listen_overlap_crash_with_the_next_plan_in_flight(tmp_path, keys, procs, policy):
    n = 2
    want = run_json(SPEC, "--rung", "overlap")
    log = tmp_path / "w.jsonl"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", SPEC, "--rung", "overlap",
                       "--world-size", n, "--json", "--on-rank-loss", policy, "--fault", "1:crash@5",
                       "--rejoin-timeout", 20, "--wire-log", log])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    sched.err.until("replacement for rank 1", 30)
    assert exit_line(first[1], 10)[0] == -signal.SIGKILL
    again = start_worker(address, keys, 1, n)
    procs.append(again)
    status, out, err = sched.finish()
    assert status == 0, err
    if policy == "restore":
        assert out == want
    else:
        assert json.loads(out[-1]) == json.loads(want[-1])
    assert exit_line(again, 10)[0] == 0 and exit_line(first[0], 10)[0] == 0
