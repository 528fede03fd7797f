"""A member that misbehaves: a peer holding a real rank key.

It joins a `launch --listen` run through the real handshake (a hand-driven DEALER
speaking the protocol), then, instead of answering a plan, sends a message too big or
floods replies for steps that are not the current one. The scheduler bounds what one
message from a member can cost and gives members the quota strangers get. A replacement
that knocks while its rank still has a member waits its turn. Loopback, bounded counts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from inferris_dist.protocol import wire
from inferris_dist.protocol.keys import ClientKeys
from inferris_dist.protocol.wire import MsgType

from tests.helpers.external import GOLDEN, Scheduler, start_worker

pytestmark = [pytest.mark.timeout(90), pytest.mark.procs]

LONG = GOLDEN / "preemption.spec.json"
WORLD = 2


class HandMember:
    """Rank 0 of a `--listen --keys` run, by hand: HELLO, CONFIG, READY, then whatever."""

    def __init__(self, address: str, keys: Path, rank: int = 0):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 20_000)
        self.sock.setsockopt(zmq.SNDTIMEO, 20_000)
        ClientKeys.load(keys, rank).apply(self.sock)
        self.sock.connect(address)
        self.rank = rank

    def header(self, kind: MsgType, step: int, epoch: int = 0) -> bytes:
        return wire.encode_header(kind, epoch, step, self.rank, WORLD)

    def join(self) -> None:
        self.sock.send_multipart([self.header(MsgType.HELLO, 0), msgpack.packb((12345, b""))])
        frames = self.sock.recv_multipart()
        assert wire.decode_header(frames[0]).type is MsgType.CONFIG, frames[:1]
        self.sock.send_multipart([self.header(MsgType.READY, 0), msgpack.packb(())])

    def next_plan(self) -> int:
        while True:
            frames = self.sock.recv_multipart()
            header = wire.decode_header(frames[0])
            if header.type is MsgType.PLAN:
                return header.step

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def vm_hwm_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def start(keys: Path, procs, *extra) -> tuple[Scheduler, HandMember]:
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", WORLD, "--step-timeout", 3, *extra])
    procs.append(sched.proc)
    address = sched.listening()
    member = HandMember(address, keys)
    member.join()
    procs.append(start_worker(address, keys, 1, WORLD))
    return sched, member


def test_a_member_sending_a_message_of_many_big_frames_is_dropped_and_memory_stays_bounded(keys, procs):
    sched, member = start(keys, procs)
    try:
        step = member.next_plan()
        big = b"\x00" * (2 << 20)               # 2 MiB a frame, 80 frames: 160 MiB in one message
        member.sock.send_multipart([member.header(MsgType.RESULT, step)] + [big] * 79)
        peak = 0
        deadline = time.monotonic() + 30
        while sched.proc.poll() is None and time.monotonic() < deadline:
            try:
                peak = max(peak, vm_hwm_kb(sched.proc.pid))
            except OSError:
                break
            sched.out.pump(0.05)
        status, out, err = sched.finish(30)
    finally:
        member.close()
    assert status == 1
    text = "\n".join(out + err)
    assert "rank 0" in text and ("broke the protocol" in text or "connection closed" in text), text[-800:]
    assert peak < 150 * 1024, f"the scheduler peaked at {peak // 1024} MB"


def test_a_member_sending_many_frames_is_a_protocol_error_without_copying_them(keys, procs):
    sched, member = start(keys, procs)
    try:
        step = member.next_plan()
        member.sock.send_multipart([member.header(MsgType.RESULT, step)] + [b"x" * 1000] * 5000)
        status, out, err = sched.finish(30)
    finally:
        member.close()
    assert status == 1
    want = "rank 0 broke the protocol: a message of 5001 frame(s)"
    assert any(want in line for line in out + err), out[-5:]


def test_a_member_flooding_replies_for_other_steps_gets_the_strangers_quota(keys, procs, tmp_path):
    log = tmp_path / "w.jsonl"
    sched, member = start(keys, procs, "--wire-log", log, "--step-timeout", 4)   # time to read them all
    n = 5_000
    try:
        step = member.next_plan()
        empty = wire.encode_body(MsgType.RESULT, ())           # a well-formed RESULT of no items
        for i in range(n):
            target = 10 ** 9 if i % 2 else step + 2           # never the step being gathered
            member.sock.send_multipart([member.header(MsgType.RESULT, target), empty])
        status, out, err = sched.finish(60)            # rank 0 never answers: lost at the deadline
    finally:
        member.close()
    assert status == 1
    assert len(out) < 80, len(out)
    assert any("future RESULT from rank 0 (epoch 0, step 1000000000)" in line for line in out), out[-20:]
    assert any("dropped unnoted (rank 0:" in line for line in out), out[-5:]
    assert log.stat().st_size < 200_000
    events = [json.loads(line) for line in log.read_text().splitlines()]
    counted = [e for e in events if e.get("event") == "turned-away"]
    assert counted and int(counted[-1]["member_replies_dropped"]["0"]) >= 1000   # counted, however many came


def wait_for_note(log: Path, words: tuple[str, ...], timeout: float) -> str:
    """The first wire-log note holding any of `words` (a condition with a deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else ():
            if '"note"' in line and any(w in line for w in words):
                return line
        time.sleep(0.05)
    pytest.fail(f"no note with {words} in {timeout} s")


def test_an_early_replacement_waits_its_turn_while_another_rank_is_admitted(keys, procs, tmp_path):
    """Rank 2 goes silent; while its replacement is awaited rank 1 goes silent too,
    and replacements for both start at once. Rank 1's knocks while rank 1 still has a member:
    it is not refused, it waits, and is let in when rank 1 is found lost. The run ends with
    the fault-free trace."""
    import signal

    from tests.helpers.external import run_json
    n = 3
    log = tmp_path / "w.jsonl"
    want = run_json(LONG, "--world-size", n)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", n, "--json", "--on-rank-loss", "restore", "--step-timeout", 2,
                       "--rejoin-timeout", 30, "--fault", "all:delay@0+:0.01", "--wire-log", log])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    sched.out.until(r'"step": 2\b', 30)
    first[2].send_signal(signal.SIGSTOP)
    sched.err.until("replacement for rank 2", 30)
    first[1].send_signal(signal.SIGSTOP)
    early = start_worker(address, keys, 1, n)               # first: it knocks during the admission
    wait_for_note(log, ("knocks while rank 1", "claims rank 1"), 30)   # judged during the admission
    again = [early, start_worker(address, keys, 2, n)]
    procs.extend(again)
    status, out, err = sched.finish(90)
    for w in first:
        w.send_signal(signal.SIGKILL)
    assert status == 0, err[-5:]
    assert out == want
    assert all(w.wait(10) == 0 for w in again)
