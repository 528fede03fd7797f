"""Ranks on other hosts, for real: Linux network namespaces linked by veth pairs
(192.0.2.0/24, only inside them), the scheduler in one, ranks in others.

- `launch --listen` across hosts gives the trace of `run --json`, every rank
  placed by another launcher convention;
- a partition: one host's link goes down mid-run; with `--on-rank-loss restore`
  replacements join from a third host and the run ends with the fault-free
  trace; when the link comes back the old workers are refused and exit;
- a scheduler killed with SIGKILL takes every worker on every host with it.

Skipped with the reason where namespaces cannot be made (not root, no iproute2).
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.external import REPO, Scheduler, exit_line, long_spec, run_json, start_worker, stop_all
from tests.helpers.netns import NETNS_SKIP, Hosts

pytestmark = [pytest.mark.procs, pytest.mark.timeout(90),
              pytest.mark.skipif(NETNS_SKIP is not None, reason=NETNS_SKIP or "")]

PREEMPTION = REPO / "tests" / "data" / "golden" / "preemption.spec.json"


def test_across_hosts_the_trace_is_run_json(tmp_path, keys):
    want = run_json(PREEMPTION, "--world-size", 4)
    procs = []
    with Hosts(["sched", "a", "b"]) as hosts:
        try:
            sched = Scheduler(["--listen", f"tcp://{hosts.addr('sched')}:0", "--keys", keys,
                               "--spec", PREEMPTION, "--world-size", 4, "--json"],
                              prefix=hosts.argv("sched", []))
            procs.append(sched.proc)
            address = sched.listening()
            assert address.startswith("tcp://192.0.2.1:")
            placed = [("a", {"RANK": "0", "WORLD_SIZE": "4"}, []),
                      ("a", {"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, []),
                      ("b", {"PMI_RANK": "2", "PMI_SIZE": "4"}, []),
                      ("b", {"JOB_COMPLETION_INDEX": "3"}, ["--world-size", "4"])]
            workers = [start_worker(address, keys, env=env, extra=extra, prefix=hosts.argv(host, []))
                       for host, env, extra in placed]
            procs += workers
            status, out, err = sched.finish()
            assert status == 0, err
            assert out == want
            for w in workers:
                assert exit_line(w, 10)[0] == 0
            assert not hosts.pids("a") and not hosts.pids("b") and not hosts.pids("sched")
        finally:
            stop_all(procs)


def test_a_partitioned_host_is_replaced_and_its_old_workers_are_refused(tmp_path, keys):
    """Host a (ranks 0, 1) drops off the network mid-run. The scheduler loses both at the step
    deadline, waits for replacements, which start on host c; the run ends with the fault-free
    trace. When a's link comes back, its workers hear they were replaced, and exit."""
    spec = long_spec(tmp_path, 150, max_step_tokens=8)
    want = run_json(spec, "--world-size", 4)
    log = tmp_path / "wire.jsonl"
    procs = []
    with Hosts(["sched", "a", "b", "c"]) as hosts:
        try:
            sched = Scheduler(["--listen", f"tcp://{hosts.addr('sched')}:0", "--keys", keys,
                               "--spec", spec, "--world-size", 4, "--json", "--on-rank-loss", "restore",
                               "--step-timeout", 1, "--fault", "all:delay@0+:0.02", "--wire-log", log],
                              prefix=hosts.argv("sched", []))
            procs.append(sched.proc)
            address = sched.listening()
            old = [start_worker(address, keys, r, 4, prefix=hosts.argv("a" if r < 2 else "b", []))
                   for r in range(4)]
            procs += old
            sched.out.until(r'"step": 5\b', 30)
            hosts.link_down("a")
            sched.err.until(r"replacement for ranks 0, 1", 30)
            hosts.link_up("a")              # the partition heals while the replacements start
            new = [start_worker(address, keys, r, 4, prefix=hosts.argv("c", [])) for r in (0, 1)]
            procs += new
            for w in old[:2]:
                code, line = exit_line(w, 15)
                assert code == 1 and "replaced in epoch 1" in line, line
            status, out, err = sched.finish()
            assert status == 0, err
            assert out == want
            for w in old[2:] + new:
                assert exit_line(w, 10)[0] == 0
            events = [json.loads(line) for line in log.read_text().splitlines()]
            lost = [e for e in events if e.get("event") == "rank-lost"]
            assert lost and lost[0]["ranks"] == [0, 1] and lost[0]["reason"] == "timeout"
            assert [e["epoch"] for e in events if e.get("event") == "restart"] == [1]
            for name in ("sched", "a", "b", "c"):
                assert not hosts.pids(name), name
        finally:
            stop_all(procs)


def test_every_worker_on_every_host_leaves_when_the_scheduler_is_killed(tmp_path, keys):
    spec = long_spec(tmp_path, 400, max_step_tokens=8)
    procs = []
    with Hosts(["sched", "a", "b"]) as hosts:
        try:
            sched = Scheduler(["--listen", f"tcp://{hosts.addr('sched')}:0", "--keys", keys,
                               "--spec", spec, "--world-size", 4, "--fault", "all:delay@0+:0.01"],
                              prefix=hosts.argv("sched", []))
            procs.append(sched.proc)
            address = sched.listening()
            workers = [start_worker(address, keys, r, 4, prefix=hosts.argv("ab"[r % 2], []))
                       for r in range(4)]
            procs += workers
            sched.out.until(r"^\s+5\s", 30)
            sched.kill()
            for w in workers:
                code, line = exit_line(w, 5)
                assert code == 1 and "scheduler" in line, line
        finally:
            stop_all(procs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
