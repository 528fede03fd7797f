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

import resource
import socket
from collections import Counter, OrderedDict
from typing import Iterator

import zmq
from zmq.utils import z85

from inferris_dist.observe.recorder import NOTED_PER_RANK
from inferris_dist.protocol.monitor import monitor_event
from inferris_dist.protocol.sockets import POLLIN

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"inferris-dist"
NOTED_PER_PEER = NOTED_PER_RANK   # refusals noted in full per peer address (a member's drops too)
MAX_PEERS_TRACKED = 256        # distinct addresses counted one by one; beyond, as "other"
MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                  | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPT_FAILED | zmq.EVENT_ACCEPTED)
MONITOR_ENDPOINT = "inproc://inferris-dist.monitor"
DESCRIPTORS_RESERVED = 64      # kept for the members and our own files, whoever knocks
DESCRIPTORS_PER_RANK = 4       # a member's connection, a worker's pidfd and log, a spare
MAX_UNPROVEN = 4096            # connections not yet a member, at most (fewer at a low limit)


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


def unproven_bound(world_size: int) -> int:
    """How many connections that are not (yet) members we keep open at once: what the
    descriptor limit leaves after the members' reserve, halved (so a flood at the bound still
    leaves room), within MAX_UNPROVEN, and never fewer than the ranks joining need."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_UNPROVEN
    spare = soft - DESCRIPTORS_RESERVED - DESCRIPTORS_PER_RANK * world_size
    return max(8 + 2 * world_size, min(MAX_UNPROVEN, spare // 2))   # room for every rank joining


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise our soft limit of open descriptors to the hard one (strangers may connect to a
    run that listens; each connection costs a descriptor). Returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


class Gate:
    """ZAP checks and the socket monitor of one ROUTER socket, and the connections that are
    not members: counted, bounded, the oldest shed first when there are too many or the
    descriptors run short, so that nobody without a key can starve the members."""

    def __init__(self, world_size: int = 1):
        self.ctx: zmq.Context | None = None
        self.rank_of_key: dict[bytes, int] | None = None   # z85 public key -> rank; None: no CURVE
        self.zap = None
        self.monitor = None
        self.watched: zmq.Socket | None = None
        self.unproven: OrderedDict[int, str] = OrderedDict()   # fd -> peer, oldest first
        self.bound = unproven_bound(world_size)
        # what was turned away, kept after the sockets close (for the run's last lines)
        self.shed = 0                             # connections we closed to keep the bound
        self.refusals = Refusals()                # connections turned away at the door, per address
        self.turned_away = Refusals()             # messages from peers holding no rank, per peer

    def open(self, ctx: zmq.Context, rank_of_key: dict[bytes, int] | None, world_size: int = 1) -> None:
        """The ZAP handler on `ctx` (with CURVE: `rank_of_key`); the bound on connections that
        hold no rank from the descriptor limit as it is now (raised, if it could be)."""
        self.bound = unproven_bound(world_size)
        self.ctx = ctx
        self.rank_of_key = rank_of_key
        if rank_of_key is not None:
            self.zap = ctx.socket(zmq.REP)
            self.zap.setsockopt(zmq.LINGER, 0)
            self.zap.setsockopt(zmq.RCVTIMEO, 0)
            self.zap.bind(ZAP_ENDPOINT)

    def guard(self, sock: zmq.Socket, public: bytes, secret: bytes) -> None:
        """Make `sock` a CURVE server whose every peer is checked here."""
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.zap_domain = ZAP_DOMAIN

    def watch(self, sock: zmq.Socket) -> None:
        """Monitor `sock` over a pipe with no high-water mark: ZeroMQ's I/O thread must never
        wait on us to read an event (a flood of failed accepts would otherwise block it, and
        a close that needs it would hang). We read every event at every wait."""
        endpoint = f"{MONITOR_ENDPOINT}.{id(self)}"
        sock.monitor(endpoint, MONITOR_EVENTS)
        self.monitor = self.ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.setsockopt(zmq.RCVHWM, 0)
        self.monitor.connect(endpoint)
        self.watched = sock

    def unwatch(self) -> None:
        """Stop the monitor, reading what it still holds first (bounded: the I/O thread is
        never blocked on the pipe, so it stops sending once disabled)."""
        if self.watched is None:
            return
        for _ in self.monitor_events():
            pass
        self.watched.disable_monitor()
        self.watched = None

    # -- connections that are not members ---------------------------------------------------

    def accepted(self, fd: int) -> None:
        self.unproven[fd] = _peer_of(fd)
        while len(self.unproven) > self.bound:
            self.shed_oldest()

    def gone(self, fd: int) -> None:
        self.unproven.pop(fd, None)

    def proven(self, fd: int | None) -> None:
        """The connection on `fd` is a member's now: never shed."""
        if fd is not None:
            self.unproven.pop(fd, None)

    def shed_oldest(self, count: int = 1) -> int:
        """Close the oldest connections that are not members (each checked to be the very
        connection we counted: a descriptor reused since is left alone). Returns how many."""
        done = 0
        while self.unproven and done < count:
            fd, peer = self.unproven.popitem(last=False)
            if peer and _peer_of(fd) == peer:
                try:
                    s = socket.socket(fileno=fd)
                    try:
                        s.shutdown(socket.SHUT_RDWR)     # ZeroMQ sees it end and closes it
                    finally:
                        s.detach()
                    done += 1
                except OSError:
                    pass
        self.shed += done
        return done

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
        monitor = self.monitor
        while monitor.getsockopt(zmq.EVENTS) & POLLIN:   # asked: pyzmq's Again costs ~20 us
            try:
                event, value = monitor_event(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event == zmq.EVENT_ACCEPTED:
                self.accepted(value)
            elif event == zmq.EVENT_DISCONNECTED:
                self.gone(value)
                yield "closed", value
            elif event == zmq.EVENT_ACCEPT_FAILED:
                yield "accept-failed", value
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                yield "protocol", value
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                yield "no-detail", value

    def recount(self) -> None:
        """A run begins on a socket that served one before (a warm world): its counts start
        again; the connections still held stay."""
        self.shed = 0
        self.refusals = Refusals()
        self.turned_away = Refusals()

    def close(self) -> None:
        """Close the gate's sockets (the counts stay, for the summary)."""
        self.unwatch()
        for s in self.sockets:
            s.close(linger=0)
        self.zap = self.monitor = None

    # -- what was turned away, said once ------------------------------------------------------

    def summary(self, member_drops: dict[int, int]) -> str | None:
        """One line for the end of the run: what peers holding no rank sent beyond the notes,
        connections refused or shed, and members' replies dropped beyond theirs."""
        extra = self.turned_away.unnoted()
        gate = self.refusals.total
        members = {r: n - NOTED_PER_PEER for r, n in member_drops.items() if n > NOTED_PER_PEER}
        if not (extra or gate or self.shed or members):
            return None
        parts = []
        if extra:
            parts.append(f"{sum(extra.values())} more message(s) from {len(extra)} peer(s) holding no "
                         f"rank were dropped unanswered (each peer's first {NOTED_PER_PEER} noted above)")
        if gate:
            parts.append(f"{gate} connection(s) refused at the door")
        if members:
            who = ", ".join(f"rank {r}: {n}" for r, n in sorted(members.items())[:16])
            parts.append(f"{sum(members.values())} more reply(ies) not joined (stale, future or duplicate) "
                         f"were dropped unnoted ({who}; each rank's first {NOTED_PER_PEER} noted above)")
        if self.shed:
            parts.append(f"{self.shed} connection(s) holding no rank closed to keep descriptors for the "
                         f"members")
        return "; ".join(parts)

    def counts(self, member_drops: dict[int, int]) -> dict | None:
        """The counts behind the notes (None when nothing was turned away), for the wire log
        once at the end: it grows with the run, not with whoever floods us."""
        members = {str(r): n for r, n in member_drops.items() if n > NOTED_PER_PEER}
        if not (self.turned_away.count or self.refusals.count or members or self.shed):
            return None
        return {"messages": dict(list(self.turned_away.count.items())[:64]),
                "connections": dict(list(self.refusals.count.items())[:64]),
                "member_replies_dropped": members, "shed": self.shed}


def _peer_of(fd: int) -> str:
    """The address at the other end of the connection on `fd` ("" if it is not a connected
    socket any more)."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return ""
    try:
        return str(s.getpeername())
    except OSError:
        return ""
    finally:
        s.detach()
