"""Nobody without a key ends or freezes an authenticated run by opening connections
(issue "Hostile surroundings, round three", findings 1-3).

A plain TCP client (no key, not a byte of ZeroMQ) opens more connections than
the scheduler has descriptors: during the join, mid-run, and while it is
being stopped. The scheduler keeps a bound on connections that hold no rank,
sheds the oldest first, keeps descriptors for its members, never blocks on
its socket monitor, and always answers SIGTERM. Loopback only; every burst is
bounded in count and time.
"""
from __future__ import annotations

import resource
import signal
import socket
import subprocess

import pytest

from tests.helpers.external import GOLDEN, Scheduler, exit_line, run_json, start_worker

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

LONG = GOLDEN / "preemption.spec.json"
BURST = 1100


def _room_for_the_burst() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = BURST + 200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this process may open only {hard} descriptors; the burst needs {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _limit_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))   # the usual soft limit, and no more


def burst(address: str, count: int = BURST) -> list[socket.socket]:
    """`count` idle TCP connections (each bounded: a connect that does not complete in 2 s is
    given up)."""
    host, port = address[len("tcp://"):].rsplit(":", 1)
    conns = []
    for _ in range(count):
        try:
            conns.append(socket.create_connection((host, int(port)), timeout=2))
        except OSError:
            pass
    return conns


def close_all(conns) -> None:
    for c in conns:
        c.close()


def listening_at_1024(keys, procs, world_size: int, *extra) -> tuple[Scheduler, str]:
    """A `launch --listen --keys` scheduler whose descriptor limit is 1,024, soft and hard, with
    room in this process for the burst; (the scheduler, its address)."""
    _room_for_the_burst()
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", world_size, "--json", *extra], preexec_fn=_limit_1024)
    procs.append(sched.proc)
    return sched, sched.listening()


def test_a_burst_during_the_join_neither_freezes_nor_ends_the_run(keys, procs):
    want = run_json(LONG, "--world-size", 4)
    sched, address = listening_at_1024(keys, procs, 4)
    conns = burst(address)
    try:
        workers = [start_worker(address, keys, r, 4) for r in range(4)]
        procs.extend(workers)
        status, out, err = sched.finish(90)
    finally:
        close_all(conns)
    assert status == 0, err[-5:]
    assert out == want
    assert all(exit_line(w, 10)[0] == 0 for w in workers)


def test_a_burst_mid_run_neither_freezes_nor_ends_the_run(keys, procs):
    want = run_json(LONG, "--world-size", 2)
    sched, address = listening_at_1024(keys, procs, 2, "--fault", "all:delay@0+:0.002")
    workers = [start_worker(address, keys, r, 2) for r in range(2)]
    procs.extend(workers)
    sched.out.until(r'"step": 2\b', 30)
    conns = burst(address)
    try:
        status, out, err = sched.finish(90)
    finally:
        close_all(conns)
    assert status == 0, err[-5:]
    assert out == want


def test_sigterm_stops_the_scheduler_during_a_burst(keys, procs):
    sched, address = listening_at_1024(keys, procs, 4)
    conns = burst(address)
    try:
        sched.proc.send_signal(signal.SIGTERM)
        try:
            status = sched.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not stop the scheduler within 20 s during the burst")
    finally:
        close_all(conns)
    assert status == 143
    assert any("terminated" in line for line in sched.err.rest(5))
