"""Admission on live sockets, driven by hand, with nothing left to timing: every hostile
message is in the scheduler's queue before the honest ranks say HELLO (the honest peers
wait for every refusal first), so each one is judged during the handshake, every time.

The peers are hand-driven DEALER sockets speaking the real protocol to the real channel;
the worker processes the vetting expects are stand-ins holding only the pids the peers
claim (what a spawned worker's HELLO must match)."""
from __future__ import annotations

import io
import json
import threading
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from inferris_dist import wire
from inferris_dist.channel import RankChannel
from inferris_dist.handshake import Admission
from inferris_dist.members import Spawned
from inferris_dist.observe import WireLog
from inferris_dist.wire import MsgType

pytestmark = pytest.mark.timeout(60)

SECRET = b"s" * 32
WORLD = 2
PIDS = {0: 40000, 1: 40001}


def hello(rank: int, world_size: int = WORLD, secret: bytes = b"not the run secret",
          pid: int = 12345, proof=None) -> list[bytes]:
    if proof is None:
        proof = wire.proof_of_secret(secret, rank, world_size, pid)
    return [wire.encode_header(MsgType.HELLO, 0, 0, rank, world_size), msgpack.packb((pid, proof))]


def probes() -> list[tuple[str, list[bytes], tuple[str, ...]]]:
    """(name, frames, words the refusal must hold) for each hostile message."""
    good = wire.encode_header(MsgType.HELLO, 0, 0, 0, WORLD)
    return [
        ("one-random-frame", [b"\xc1" * 40], ("malformed",)),
        ("empty-frames", [b"", b""], ("malformed",)),
        ("truncated-header", [good[:-2], msgpack.packb((1, b"p"))], ("malformed",)),
        ("version-99", [msgpack.packb((99, int(MsgType.HELLO), 0, 0, 0, WORLD)), msgpack.packb((1, b"p"))],
         ("version 99",)),
        ("unknown-type", [msgpack.packb((wire.PROTOCOL_VERSION, 42, 0, 0, 0, WORLD)), msgpack.packb(())],
         ("unknown message type 42",)),
        ("hello-str-proof", hello(1, proof="not bytes"), ("malformed",)),
        ("hello-too-big", [good, msgpack.packb((1, b"x" * 1000))], ("HELLO of",)),
        ("ready-before-hello", [wire.encode_header(MsgType.READY, 0, 0, 0, WORLD), msgpack.packb(())],
         ("READY before HELLO",)),
        ("rank-7", hello(7), ("claims rank 7", "outside")),
        ("rank-negative", hello(-1), ("claims rank -1", "outside")),
        ("world-5", hello(1, world_size=5), ("world size 5",)),
        ("wrong-proof", hello(1), ("claims rank 1 without proof",)),
        ("right-proof-wrong-pid", hello(1, secret=SECRET, pid=999), ("from pid 999",)),
    ]


def test_every_hostile_peer_in_the_handshake_is_refused_with_its_reason_then_the_ranks_join(tmp_path):
    stream = io.StringIO()
    channel = RankChannel(WORLD, step_timeout=5.0, wire_log=WireLog(stream))
    channel.open("tcp://127.0.0.1:0", None)
    vetting = Spawned(channel, SECRET, tmp_path, start_timeout=20.0)
    vetting.workers = {r: SimpleNamespace(rank=r, pid=pid) for r, pid in PIDS.items()}
    ctx = zmq.Context()
    sockets: dict[str, zmq.Socket] = {}
    reasons: dict[str, str] = {}
    honest_done = threading.Event()
    failures: list[str] = []

    def connect() -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(channel.address)
        return s

    def honest_peers():
        """Only once every hostile peer has its refusal: both ranks say HELLO and READY."""
        try:
            for name, sock in sockets.items():
                if not sock.poll(15_000):
                    failures.append(f"no refusal for {name}")
                    return
                frames = sock.recv_multipart()
                assert wire.decode_header(frames[0]).type is MsgType.REFUSED
                reasons[name] = wire.decode_body(MsgType.REFUSED, frames[1])
            for rank, pid in PIDS.items():
                s = connect()
                sockets[f"rank {rank}"] = s
                s.send_multipart(hello(rank, secret=SECRET, pid=pid))
                if not s.poll(15_000):
                    failures.append(f"no CONFIG for rank {rank}")
                    return
                header = wire.decode_header(s.recv_multipart()[0])
                assert header.type is MsgType.CONFIG, header
                s.send_multipart([wire.encode_header(MsgType.READY, 0, 0, rank, WORLD), msgpack.packb(())])
        except BaseException as e:                      # reported by the test thread
            failures.append(repr(e))
        finally:
            honest_done.set()

    try:
        for name, frames, _ in probes():
            sockets[name] = connect()
            sockets[name].send_multipart(frames)
        helper = threading.Thread(target=honest_peers, daemon=True)
        helper.start()
        config = wire.Config(8, 4, {}, [], [])
        Admission(channel, set(PIDS), vetting, lambda rank: config, -1, 20.0,
                  "did not finish the handshake").run()
        assert honest_done.wait(15) and not failures, failures
        helper.join(5)
        for name, _, words in probes():
            assert all(w in reasons[name] for w in words), (name, reasons[name])
        assert sorted(channel.members) == [0, 1]
        assert all(channel.members[r].pid == PIDS[r] for r in PIDS)
        notes = [json.loads(line)["text"] for line in stream.getvalue().splitlines()
                 if json.loads(line).get("event") == "note"]
        assert len([n for n in notes if n.startswith("refused a peer")]) == len(probes())
        for reason in reasons.values():
            assert any(reason in n for n in notes), reason
    finally:
        for s in sockets.values():
            s.close(0)
        ctx.term()
        channel.close()


def test_a_rank_already_taken_in_this_admission_is_refused(tmp_path):
    """A second HELLO for a rank configured a moment ago (from another connection) is refused
    as taken; the first one's member stands."""
    channel = RankChannel(1, step_timeout=5.0, wire_log=None)
    channel.open("tcp://127.0.0.1:0", None)
    vetting = Spawned(channel, SECRET, tmp_path, start_timeout=20.0)
    vetting.workers = {0: SimpleNamespace(rank=0, pid=PIDS[0])}
    ctx = zmq.Context()
    first, second = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        for s in (first, second):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(channel.address)
        first.send_multipart(hello(0, world_size=1, secret=SECRET, pid=PIDS[0]))
        admission = Admission(channel, {0}, vetting, lambda rank: wire.Config(8, 4, {}, [], []), -1, 20.0,
                              "did not finish the handshake")
        done = threading.Thread(target=admission.run, daemon=True)
        done.start()
        assert first.poll(15_000)
        assert wire.decode_header(first.recv_multipart()[0]).type is MsgType.CONFIG
        second.send_multipart(hello(0, world_size=1, secret=SECRET, pid=PIDS[0]))
        assert second.poll(15_000)
        frames = second.recv_multipart()
        assert wire.decode_header(frames[0]).type is MsgType.REFUSED
        assert "already taken" in wire.decode_body(MsgType.REFUSED, frames[1])
        first.send_multipart([wire.encode_header(MsgType.READY, 0, 0, 0, 1), msgpack.packb(())])
        done.join(15)
        assert not done.is_alive()
        assert channel.members[0].identity != b""
    finally:
        first.close(0)
        second.close(0)
        ctx.term()
        channel.close()
