"""Overlap scheduling with `launch --listen` and workers started by someone else (real
processes, loopback, CURVE keys); a replacement joining with the next plan in flight is
tests/test_hosts.py's, at both rungs."""
from __future__ import annotations

import pytest

from tests.helpers.external import GOLDEN, Scheduler, exit_line, run_json, start_worker

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
