"""Strangers: nobody without a rank key (or, for a local run, nobody but its owner) can make
the scheduler hold, print or keep anything, or end or freeze a run by opening connections.

1. the local launch listens on a unix socket only its owner can reach; `--listen` lets nothing
   through without a rank key: 192 MB offered by a keyless peer is refused at the CURVE
   handshake, before a byte of it is buffered;
2. a flood of junk is counted, not hoarded: bounded notes, one summary line, a small wire log;
3. idle connections past the descriptor limit are shed (oldest first); the run goes on;
4. a plain TCP client (no key, not a byte of ZeroMQ) opens more connections than the scheduler
   has descriptors: during the join, mid-run, and while it is being stopped. The scheduler
   keeps a bound on connections that hold no rank, sheds the oldest first, keeps descriptors
   for its members, never blocks on its socket monitor, and always answers SIGTERM.

Attack scripts use pyzmq and raw sockets on loopback only; every one is bounded in count
and time. Memory is read from the scheduler's own RSS, never inferred from timing.
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest
import zmq

from inferris_dist.scheduler.gate import NOTED_PER_PEER

from tests.helpers.external import (
    CLI,
    ENV,
    GOLDEN,
    Lines,
    Scheduler,
    exit_line,
    local_launch,
    long_spec,
    run_json,
    start_worker,
)
from tests.helpers.procs import connect_as_nobody

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

LONG = GOLDEN / "preemption.spec.json"
BURST = 1100


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# -- 1. nothing buffered before authentication ----------------------------------------------------

def test_the_local_socket_is_the_run_owners_alone(tmp_path, procs):
    proc, address = local_launch(["--spec", long_spec(tmp_path), "--world-size", 2,
                                  "--fault", "all:delay@0+:0.01"])
    procs.append(proc)
    assert address.startswith("ipc://"), address
    path = Path(address[len("ipc://"):])
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    if os.getuid() != 0:
        pytest.skip("needs root to try as another user")
    # another user cannot even connect: nothing of theirs reaches ZeroMQ's buffers
    assert connect_as_nobody(path) == "denied"
    proc.kill()


def test_a_keyless_peer_cannot_make_a_listen_scheduler_hold_anything(tmp_path, keys, procs):
    """Many maximal frames with the 'more' flag, from a peer without a rank key: refused at
    the CURVE handshake, before a byte of it is buffered; the run is unaffected."""
    n = 2
    spec = long_spec(tmp_path, 120)
    want = run_json(spec, "--world-size", n)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", spec,
                       "--world-size", n, "--json", "--fault", "all:delay@0+:0.01"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(workers)
    sched.out.until(r'"step": 3\b', 30)
    baseline = rss_mb(sched.proc.pid)
    ctx = zmq.Context()
    try:
        frame = b"\0" * (8 << 20)
        for kind in ("plaintext", "unknown key"):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDTIMEO, 2000)
            s.setsockopt(zmq.SNDHWM, 4)
            if kind == "unknown key":
                s.curve_serverkey = (keys / "scheduler.key").read_text().split('"')[1].encode()
                s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
            s.connect(address)
            for _ in range(24):                       # 192 MB offered as one message
                try:
                    s.send(frame, zmq.SNDMORE | zmq.NOBLOCK)
                except zmq.Again:
                    break
            s.close(0)
        grown = rss_mb(sched.proc.pid) - baseline
    finally:
        ctx.term()
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    assert grown < 100, f"the scheduler's RSS grew by {grown:.0f} MB"


# -- 2. a flood of junk --------------------------------------------------------------------------

def test_a_flood_is_counted_not_printed(tmp_path, procs):
    """20,000 junk messages from a peer that never says HELLO: the first few noted, then one
    summary line; the wire log does not grow with them; the trace is the trace."""
    n_junk = 20_000
    spec = long_spec(tmp_path, 80)                    # a run of ~2 s: the junk arrives mid-run
    log = tmp_path / "wire.jsonl"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--spec", spec, "--world-size", 2,
                       "--wire-log", log, "--fault", "all:delay@0+:0.01"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, None, r, 2) for r in range(2)]
    procs.extend(workers)
    sched.out.until(r"^\s+2\s", 30)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    try:
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, 10_000)            # never blocks the test for good
        s.connect(address)
        for i in range(n_junk):
            s.send_multipart([b"junk", b"%d" % i])
        # stay connected until the run ends: a peer that hangs up loses what was not yet read
        status, out, err = sched.finish()
    finally:
        s.close()
        ctx.term()
    assert status == 0, err
    noted = [line for line in out if "unknown peer" in line]
    assert len(noted) == NOTED_PER_PEER, noted
    summary = [line for line in out if line.startswith("turned away:")]
    more = f"{n_junk - NOTED_PER_PEER} more message(s) from 1 peer"
    assert len(summary) == 1 and more in summary[0], summary
    steps = [line for line in out if re.match(r"^\s+\d+(-\d+)?  ", line)]
    assert len(out) < 2 * len(steps) + 40                # a step line and its wire line each, no more
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(sum(e["messages"].values()) for e in events if e.get("event") == "turned-away") == n_junk
    assert len([e for e in events if e.get("event") == "note"]) <= NOTED_PER_PEER + 2


# -- 3. out of file descriptors ------------------------------------------------------------------

def test_idle_connections_at_a_low_descriptor_limit_are_shed_and_the_run_goes_on(tmp_path, procs):
    """With a limit of 64 descriptors, 120 idle connections mid-run: the scheduler sheds the
    oldest connections that hold no rank (nobody without a rank ends the run), and the run ends
    as `run --json` does, every worker told to stop."""
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    spec = long_spec(tmp_path, 200)
    proc = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--world-size", "2", "--json",
                             "--listen", "tcp://127.0.0.1:0", "--fault", "all:delay@0+:0.005"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, preexec_fn=low_limit)
    procs.append(proc)
    err = Lines(proc.stderr)
    address = re.search(r"listening at (tcp://\S+) ", err.until("listening at", 20)).group(1)
    workers = [start_worker(address, None, r, 2) for r in range(2)]
    procs.extend(workers)
    out = Lines(proc.stdout)
    out.until(r'"step": 3\b', 30)
    host, port = address[len("tcp://"):].rsplit(":", 1)
    idle = []
    try:
        for _ in range(120):                           # more than the scheduler can take
            try:
                idle.append(socket.create_connection((host, int(port)), timeout=2))
            except OSError:
                pass
        lines = out.rest(60)                           # read as it runs: a full pipe would stall it
        assert proc.wait(10) == 0, err.rest(5)[-5:]
    finally:
        for c in idle:
            c.close()
    assert lines == run_json(spec, "--world-size", 2)
    for w in workers:
        assert exit_line(w, 10)[0] == 0


# -- 4. bursts of connections past the descriptor limit ------------------------------------------



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
