"""The wire's examples for docs/protocol.md, taken from real runs, and how an example is shown.

`python -m tests.helpers.wire_examples` runs two tiny launches on real worker processes (world
size 2: one at `full` with faults, a restore and audits; one at `overlap`; one of world size
3 that shrinks to 2; and two on one warm world), records every frame
the scheduler's socket sends and receives, and prints one example per message type in the form
docs/protocol.md holds them: a `<!-- example: NAME -->` line, then for each frame a ```hex block
and a ```text block with its value in msgpack diagnostic notation (`show`). The REFUSED is the
one a stray peer got during the first admission, read off that peer's own socket.

`show` is also what tests/test_protocol_doc.py checks each example's text against: the notation
is the one place that says how a frame is read aloud.
"""
from __future__ import annotations

import os
import struct
import sys
import tempfile
import time

import msgpack
import zmq

from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType

# A fixed run secret, so that the doc can show the HMAC of a real HELLO (a run makes a fresh one).
SECRET = bytes.fromhex("6b1e2f0c9d8a7b6c5d4e3f20112233445566778899aabbccddeeff0011223344")

WORKLOAD = {
    "engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8, "spec_len": 2, "world_size": 2},
    "requests": [
        {"request_id": "a", "prompt_len": 5, "max_new_tokens": 8, "accept_script": [1, 0, 2, 1]},
        {"request_id": "b", "prompt_len": 3, "max_new_tokens": 3, "arrival_step": 1},
    ],
}


# -- how a frame is read aloud -------------------------------------------------------------------

def _i32(raw: bytes) -> str:
    return "i32le[" + ", ".join(str(v) for v in struct.unpack(f"<{len(raw) // 4}i", raw)) + "]"


def _diag(value, columns: frozenset = frozenset(), path: tuple = ()) -> str:
    """msgpack diagnostic notation: [..] an array, {k: v} a map, "s" a str, h'..' a bin (shown
    as little-endian int32s, i32le[..], where `columns` names its path)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "nil"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bytes):
        return _i32(value) if path in columns else f"h'{value.hex()}'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_diag(k)}: {_diag(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_diag(v, columns, path + (i,)) for i, v in enumerate(value)) + "]"


COLUMNS = {MsgType.PLAN: frozenset({(2,), (3,)}), MsgType.RESULT: frozenset({(1,), (2,)})}


def show(kind: MsgType | None, frame: bytes, position: int) -> str:
    """Frame `position` (0 header, 1 body, 2 the extra one) of a message of type `kind`, in
    words: the timing request is a raw byte, not msgpack."""
    if position == 2 and kind is MsgType.PLAN:
        return f"raw h'{frame.hex()}' (not msgpack)"
    value = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    return _diag(value, COLUMNS.get(kind, frozenset()) if position == 1 else frozenset())


def hex_lines(frame: bytes, width: int = 32) -> str:
    """A frame as hex, `width` bytes to a line, the bytes apart."""
    return "\n".join(" ".join(f"{b:02x}" for b in frame[i:i + width]) for i in range(0, len(frame), width))


def markdown(name: str, frames: list[bytes]) -> str:
    kind = wire.decode_header(frames[0]).type
    out = [f"<!-- example: {name} -->"]
    for i, frame in enumerate(frames):
        out += ["```hex", hex_lines(frame), "```", "```text", show(kind, frame, i), "```"]
    return "\n".join(out)


# -- taking them from real runs ------------------------------------------------------------------

class Tap:
    """Every message the scheduler's socket sends or receives, as (direction, frames without
    the routing id)."""

    def __init__(self):
        self.seen: list[tuple[str, list[bytes]]] = []

    def __enter__(self):
        from inferris_dist.scheduler import transport
        self.transport = transport
        self.send_frames, self.recv = transport.send_frames, transport.Transport._recv
        tap = self

        def send_frames(sock, frames, flags=0):
            tap.seen.append(("out", [bytes(f) for f in frames[1:]]))
            return tap.send_frames(sock, frames, flags)

        def recv(chan):
            got = tap.recv(chan)
            if got is not None:
                tap.seen.append(("in", [bytes(f) for f in got[0][1:]]))
            return got
        transport.send_frames, transport.Transport._recv = send_frames, recv
        return self

    def __exit__(self, *exc):
        self.transport.send_frames, self.transport.Transport._recv = self.send_frames, self.recv

    def find(self, direction: str, kind: MsgType, test=lambda h, frames: True) -> list[bytes]:
        for d, frames in self.seen:
            if d != direction or len(frames) < 2:
                continue
            try:
                header = wire.decode_header(frames[0])
            except wire.WireError:
                continue
            if header.type is kind and test(header, frames):
                return frames
        raise LookupError(f"no {direction} {kind.name} in the run")


def stray_hello(address: str) -> zmq.Socket:
    """A peer that says HELLO for a world of 3 to a run of 2: it is refused."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart([wire.encode_header(MsgType.HELLO, 0, 0, 0, 3),
                         wire.encode_body(MsgType.HELLO, wire.Hello(os.getpid(), b""))])
    return sock


def full_run(tmp: str) -> tuple[Tap, list[bytes]]:
    import inferris_dist
    from inferris_dist.scheduler import members

    stray = []
    start = members.Spawned.start

    def start_with_a_stray(self, ranks):
        if not stray:
            stray.append(stray_hello(self.channel.address))
            time.sleep(0.2)      # a capture tool, not a test: the stray's HELLO is read first
        return start(self, ranks)
    members.Spawned.start = start_with_a_stray
    try:
        with Tap() as tap, inferris_dist.launch(
                WORKLOAD, world_size=2, secret=SECRET, wire_log=os.path.join(tmp, "wire.jsonl"),
                faults=["0:duplicate@1", "1:crash@3", "1:delay@4+:0"], on_rank_loss="restore",
                audit_every=2, exec_cost="1us+10ns/token") as engine:
            for _ in engine.run():
                pass
    finally:
        members.Spawned.start = start
    sock = stray[0]
    if not sock.poll(5000):
        raise RuntimeError("the stray peer was not refused")
    refused = sock.recv_multipart()
    sock.close()
    return tap, refused


def overlap_run(tmp: str) -> Tap:
    import inferris_dist
    with Tap() as tap, inferris_dist.launch(WORKLOAD, world_size=2, rung="overlap",
                                            wire_log=os.path.join(tmp, "wire2.jsonl")) as engine:
        for _ in engine.run():
            pass
    return tap


def shrink_run(tmp: str) -> Tap:
    """World size 3 under shrink: rank 1 crashes at step 3, ranks 0 and 2 go on as 0 and 1."""
    import inferris_dist
    with Tap() as tap, inferris_dist.launch(WORKLOAD, world_size=3, on_rank_loss="shrink",
                                            faults=["1:crash@3", "1:delay@5:0"],
                                            wire_log=os.path.join(tmp, "wire3.jsonl")) as engine:
        for _ in engine.run():
            pass
    return tap


def warm_run(tmp: str) -> Tap:
    """Two runs of world size 2 on one warm world: the second configures the first's workers
    again (protocol §8.6); only the second is tapped."""
    import inferris_dist
    from inferris_dist.scheduler.world import World
    with World() as world:
        for tapped in (False, True):
            with Tap() as tap, inferris_dist.launch(WORKLOAD, world_size=2, world=world,
                                                    wire_log=os.path.join(tmp, "wire4.jsonl")) as engine:
                for _ in engine.run():
                    pass
            if tapped and world.reused < 2:
                raise RuntimeError("the second run did not take the first one's workers")
    return tap


def examples() -> list[tuple[str, list[bytes]]]:
    with tempfile.TemporaryDirectory() as tmp:
        tap, refused = full_run(tmp)
        ahead = overlap_run(tmp)
        shrunk = shrink_run(tmp)
        warm = warm_run(tmp)

    def plan_with(h, frames) -> bool:
        body = wire.decode_plan_columns(frames[1])
        n = len(body.request_ids)
        return h.rank == 1 and n == 2 and max(body.column("decode")) == 1 and len(frames) == 3

    plan = tap.find("out", MsgType.PLAN, plan_with)
    step = wire.decode_header(plan[0]).step
    result = tap.find("in", MsgType.RESULT, lambda h, f: h.rank == 1 and h.step == step and len(f) == 3)

    def planned_ahead(h, frames) -> bool:
        body = wire.decode_plan_columns(frames[1])
        return h.rank == 0 and len(body.request_ids) > 0 and max(body.column("prior_drafts")) > 0

    plan2 = ahead.find("out", MsgType.PLAN, planned_ahead)
    h2 = wire.decode_header(plan2[0])
    result2 = ahead.find("in", MsgType.RESULT, lambda h, f: h.rank == 0 and h.step == h2.step)
    return [
        ("HELLO", tap.find("in", MsgType.HELLO, lambda h, f: h.rank == 0 and h.world_size == 2)),
        ("CONFIG", tap.find("out", MsgType.CONFIG, lambda h, f: h.rank == 0)),
        ("CONFIG, a replacement's", tap.find("out", MsgType.CONFIG, lambda h, f: h.epoch == 1)),
        ("READY", tap.find("in", MsgType.READY)),
        ("PLAN", plan),
        ("RESULT", result),
        ("PLAN, at overlap", plan2[:2]),
        ("RESULT, at overlap", result2[:2]),
        ("FIRED", tap.find("in", MsgType.FIRED)),
        ("AUDIT", tap.find("out", MsgType.AUDIT)),
        ("SHARD", tap.find("in", MsgType.SHARD, lambda h, f: len(f[1]) > 40)),
        ("STOP", tap.find("out", MsgType.STOP)),
        ("REFUSED", refused),
        ("RESIZE", shrunk.find("out", MsgType.RESIZE, lambda h, f: h.rank == 1)),
        ("READY, after a RESIZE", shrunk.find("in", MsgType.READY,
                                              lambda h, f: h.epoch == 1 and h.rank == 1)),
        ("CONFIG, again", warm.find("out", MsgType.CONFIG, lambda h, f: h.rank == 1)),
    ]


def main() -> None:
    for name, frames in examples():
        sys.stdout.write(markdown(name, frames) + "\n\n")


if __name__ == "__main__":
    main()
