"""The door of the scheduler's socket: who may connect, and who was turned away.

With CURVE, a peer must prove a key before it can send a single message.
The ZAP handler here (ZeroMQ's authentication protocol, answered on
`inproc://zeromq.zap.01` of the channel's context) admits a key only if it
is one of the run's rank keys, and names the connection after it: every
message on it carries the User-Id `rank-R`, which admission checks against
the rank the HELLO claims. A socket monitor reports handshakes that failed
(a plaintext peer, a wrong server key) and connections that closed (a
member's process gone on another host).

Both are answered in the scheduler's own thread, from the poll loop every
wait goes through: no thread to stop, and a handshake simply waits the few
milliseconds until the loop comes round. What was turned away is counted,
not hoarded: the first few refusals per peer address are noted in full, the
rest only counted, so a peer that knocks a million times costs a counter.
"""
from __future__ import annotations

import struct
from collections import Counter
from typing import Iterator

import zmq
from zmq.utils import z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"inferris-dist"
NOTED_PER_PEER = 5             # refusals noted in full per peer address; the rest are counted
MAX_PEERS_TRACKED = 256        # distinct addresses counted one by one; beyond, as "other"
MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                  | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPT_FAILED)


def monitor_event(frames: list[bytes]) -> tuple[int, int]:
    """(event, value) of a socket monitor message: a 16-bit event id and a 32-bit value.

    Parsed here rather than by pyzmq's helper, which imports asyncio (a worker pays
    for every module it imports, at every start)."""
    if len(frames) < 1 or len(frames[0]) < 6:
        return 0, 0
    event, value = struct.unpack("=HI", frames[0][:6])
    return event, value


def user_id(rank: int) -> str:
    return f"rank-{rank}"


class Refusals:
    """Peers turned away, counted per address; only the first few of each are worth a note."""

    def __init__(self):
        self.count: Counter[str] = Counter()

    def add(self, peer: str) -> bool:
        """Count one refusal of `peer`; True if it is still worth noting in full."""
        if peer not in self.count and len(self.count) >= MAX_PEERS_TRACKED:
            peer = "other addresses"
        self.count[peer] += 1
        return self.count[peer] <= NOTED_PER_PEER

    @property
    def total(self) -> int:
        return sum(self.count.values())

    def unnoted(self) -> dict[str, int]:
        """Per peer, the refusals counted but not noted."""
        return {p: n - NOTED_PER_PEER for p, n in self.count.items() if n > NOTED_PER_PEER}


class Gate:
    """ZAP checks and the socket monitor of one ROUTER socket."""

    def __init__(self, ctx: zmq.Context, rank_of_key: dict[bytes, int] | None):
        self.rank_of_key = rank_of_key            # z85 public key -> rank; None: no CURVE
        self.zap = None
        if rank_of_key is not None:
            self.zap = ctx.socket(zmq.REP)
            self.zap.setsockopt(zmq.LINGER, 0)
            self.zap.setsockopt(zmq.RCVTIMEO, 0)
            self.zap.bind(ZAP_ENDPOINT)
        self.monitor = None

    def guard(self, sock: zmq.Socket, public: bytes, secret: bytes) -> None:
        """Make `sock` a CURVE server whose every peer is checked here."""
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.zap_domain = ZAP_DOMAIN

    def watch(self, sock: zmq.Socket) -> None:
        self.monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self.monitor.setsockopt(zmq.LINGER, 0)

    @property
    def sockets(self) -> list[zmq.Socket]:
        return [s for s in (self.zap, self.monitor) if s is not None]

    def answer_zap(self) -> Iterator[tuple[str, str]]:
        """Answer every pending ZAP request; yields (peer address, reason) for each refused."""
        while True:
            try:
                request = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(request) < 6:
                continue                      # not from libzmq: nothing to answer
            version, request_id, _domain, address, _identity, mechanism = request[:6]
            peer = address.decode(errors="replace")
            rank = None
            if mechanism == b"CURVE" and len(request) == 7 and len(request[6]) == 32:
                rank = self.rank_of_key.get(z85.encode(request[6]))
            if rank is None:
                reason = ("a key that is none of this run's rank keys" if mechanism == b"CURVE"
                          else f"mechanism {mechanism.decode(errors='replace')}")
                self.zap.send_multipart([version, request_id, b"400", reason.encode(), b"", b""])
                yield peer, f"refused a connection from {peer}: {reason}"
            else:
                self.zap.send_multipart([version, request_id, b"200", b"OK",
                                         user_id(rank).encode(), b""])

    def monitor_events(self) -> Iterator[tuple[str, int]]:
        """('closed', fd) for a closed connection; ('protocol', code) or ('no-detail', errno)
        for a failed handshake; ('accept-failed', errno) when a connection could not be taken."""
        while True:
            try:
                event, value = monitor_event(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event == zmq.EVENT_DISCONNECTED:
                yield "closed", value
            elif event == zmq.EVENT_ACCEPT_FAILED:
                yield "accept-failed", value
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                yield "protocol", value
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                yield "no-detail", value

    def close(self) -> None:
        for s in self.sockets:
            s.close(linger=0)
        self.zap = self.monitor = None
