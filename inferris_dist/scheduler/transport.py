"""The transport: the scheduler's ROUTER socket, and what it reads and sends as frames.

It binds the socket (behind the gate, which checks every CURVE key before a byte gets
through), polls it with the sentinels of the workers spawned here and the gate's monitor
and ZAP handler, reads each message whole within bounds (a member's few frames kept, a
stranger's counted past a few), and sends frames out. It sees a rank's process exit (its
sentinel) or its connection close (the monitor) at once. It knows whom the channel counts
as a member (to bound their messages and to name whose connection closed), nothing of
steps, flights, or the faults a run may simulate: those are layers around it.
"""
from __future__ import annotations

import errno as _errno
import os
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

import zmq

from inferris_dist.protocol import wire
from inferris_dist.protocol.sockets import POLLIN, send_frames
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.gate import Gate

if TYPE_CHECKING:
    from inferris_dist.protocol.keys import ServerKeys

MAX_STRANGER_FRAMES = 4     # frames of a message from a non-member kept (the rest are dropped)
MAX_MEMBER_FRAMES = 3       # a member's message: header, body, timing (more is a protocol error)
HANDSHAKE_MS = 10_000       # a connection that has not finished ZeroMQ's handshake by then is closed
LINK_DONE = object()        # a message's "meta": handed over by the link, which acted on it already


class Meta(NamedTuple):
    """What the transport says of a message from a peer that is not a member yet."""
    user_id: str            # "rank-R" when CURVE proved that rank's key; "" without CURVE
    host: str
    fd: int | None


class Transport:
    def __init__(self, world_size: int, step_timeout: float, spin_s: float, members: dict,
                 rank_of: dict[bytes, int], note: Callable[[int | None, str], None]):
        self.world_size = world_size
        self.step_timeout = step_timeout
        self.spin_s = spin_s            # spin this long before sleeping in a wait (a free core only)
        self.members = members          # the channel's: rank -> Member (whose connection closed)
        self.rank_of = rank_of          # the channel's: identity -> rank (a member's message bounds)
        self.note = note
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.gate = Gate(world_size)         # the door: who may connect, and who was turned away
        self.address = ""
        self.curve = False
        self.sentinels: dict[int, int] = {}       # rank -> pidfd of a worker we spawned
        self.dead: set[int] = set()               # ranks whose process or connection ended
        self._poller = zmq.Poller()

    def open(self, bind: str, keys: ServerKeys | None, max_frame: int = wire.MAX_FRAME_BYTES) -> None:
        """Bind the ROUTER at `bind` (tcp://HOST:PORT; port 0 picks one); CURVE with `keys`.
        `max_frame`: the largest frame a rank of this run can need to send (ZeroMQ holds a
        whole message before we see it: this bounds what one frame of it can cost)."""
        self.ctx = zmq.Context()
        self.gate.open(self.ctx, keys.rank_of_key if keys is not None else None, self.world_size)
        sock = self.sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(self.step_timeout * 1000))
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, min(max_frame, wire.MAX_FRAME_BYTES))
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)    # a silent stranger is closed by then
        if keys is not None:
            self.gate.guard(sock, keys.public, keys.secret)
            self.curve = True
        if bind.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)          # an IPv6 address: tcp://[::1]:PORT
        self.gate.watch(sock)
        sock.bind(bind)
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller.register(sock, zmq.POLLIN)
        for s in self.gate.sockets:
            self._poller.register(s, zmq.POLLIN)

    def lend(self, world_size: int, step_timeout: float, spin_s: float, members: dict,
             rank_of: dict[bytes, int], note: Callable[[int | None, str], None]) -> "Transport":
        """This transport, open, for another run's channel (a warm world, world.py): that run's
        world size, deadline, spin and membership; no process watched, no rank dead, the gate's
        counts started again."""
        for rank, sentinel in self.sentinels.items():
            if rank not in self.dead:            # a dead one's was unregistered when seen
                self._poller.unregister(sentinel)
        self.sentinels, self.dead = {}, set()
        self.world_size, self.step_timeout, self.spin_s = world_size, step_timeout, spin_s
        self.members, self.rank_of, self.note = members, rank_of, note
        self.gate.recount()
        if self.sock is not None:
            self.sock.setsockopt(zmq.RCVTIMEO, int(step_timeout * 1000))
        return self

    def close(self) -> None:
        self.gate.close()                        # the monitor first: never a stuck I/O thread
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()

    # -- the processes of the ranks ----------------------------------------------------

    def watch_process(self, rank: int, sentinel: int | None) -> None:
        """Poll `sentinel` (a pidfd) to see rank `rank`'s process exit at once."""
        old = self.sentinels.pop(rank, None)
        if old is not None and rank not in self.dead:
            self._poller.unregister(old)
        self.dead.discard(rank)
        if sentinel is not None:
            self.sentinels[rank] = sentinel
            self._poller.register(sentinel, zmq.POLLIN)

    def unwatch_process(self, rank: int) -> None:
        old = self.sentinels.pop(rank, None)
        if old is not None and rank not in self.dead:
            self._poller.unregister(old)
        self.dead.discard(rank)

    def reshape(self, world_size: int, kept: dict[int, int]) -> None:
        """The channel's world changed size: the watched processes follow their new ranks."""
        self.world_size = world_size
        self.sentinels = {kept[r]: fd for r, fd in self.sentinels.items() if r in kept}
        self.dead = {kept[r] for r in self.dead if r in kept}

    # -- receiving ---------------------------------------------------------------------

    def poll(self, deadline: float, next_due: Callable[[], float | None] | None = None) -> dict:
        """The poller's events by `deadline` (or by `next_due()`, when something held for later
        comes due sooner). With `spin_s`, first a bounded spin without sleeping (no wake-up to
        pay when the answer comes within it), then a sleeping wait."""
        if self.spin_s > 0.0:
            until = min(deadline, time.monotonic() + self.spin_s)
            while True:
                events = self._poller.poll(0)
                if events or time.monotonic() >= until:
                    break
            if events:
                return dict(events)
        if next_due is not None:
            due = next_due()
            if due is not None:
                deadline = min(deadline, due)
        timeout = deadline - time.monotonic()
        # a deadline still ahead is waited for (rounded up to the millisecond); one passed is a
        # look, not a millisecond's sleep (an idle stretch looks at its members often)
        return dict(self._poller.poll(int(timeout * 1000) + 1 if timeout > 0 else 0))

    def wait(self, deadline: float, next_due: Callable[[], float | None] | None = None
             ) -> tuple[list[int], list[tuple[list[bytes], Meta | None]]]:
        """Messages that came, and ranks whose process or connection is gone, waiting at most
        until `deadline`.

        A sentinel stays readable once its process exits, so it is unregistered
        the first time: a dead rank is remembered, not polled in a busy loop.
        """
        events = self.poll(deadline, next_due)
        messages = []
        if self.gate.monitor is not None:
            if self.gate.zap is not None and self.gate.zap in events:
                for peer, text in self.gate.answer_zap():
                    if self.gate.refusals.add(peer):
                        self.note(None, text)
            # Every wait, and before the messages: a connection's close is seen before a new
            # connection that reuses its descriptor can be admitted under it.
            self._monitor_events()
        if self.sock in events:
            while (message := self._recv()) is not None:
                messages.append(message)
        for rank, fd in self.sentinels.items():
            if rank not in self.dead and fd in events:
                self.dead.add(rank)
                self._poller.unregister(fd)
        return sorted(r for r in self.dead if r in self.members or r in self.sentinels), messages

    def _recv(self) -> tuple[list[bytes], Meta | None] | None:
        """One whole message; a non-member's comes with what the transport knows of its sender."""
        sock = self.sock
        if not sock.getsockopt(zmq.EVENTS) & POLLIN:
            return None                  # nothing (more) to read: asked, not found by an exception
        try:
            ident = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None
        if ident in self.rank_of:
            frames, more, recv = [ident], sock.getsockopt, sock.recv
            while more(zmq.RCVMORE):
                if len(frames) <= MAX_MEMBER_FRAMES:
                    frames.append(recv())
                else:
                    recv(copy=False)
                    frames.append(b"")   # counted, not copied: a protocol error, blamed on the rank
            return frames, None
        frames, last = [ident], None
        while self.sock.getsockopt(zmq.RCVMORE):
            last = self.sock.recv(copy=False)
            if len(frames) <= MAX_STRANGER_FRAMES:
                frames.append(last.bytes)
            else:
                frames.append(b"")       # counted, not kept: the message is malformed anyway
        if last is None:
            return frames, Meta("", "", None)
        return frames, Meta(_prop(last, "User-Id"), _prop(last, "Peer-Address"), _srcfd(last))

    def _monitor_events(self) -> None:
        for what, value in self.gate.monitor_events():
            if what == "accept-failed" and value in (_errno.EMFILE, _errno.ENFILE):
                # out of descriptors: strangers go first (a quarter of them), members stay
                shed = self.gate.shed_oldest(max(1, len(self.gate.unproven) // 4))
                if self.gate.refusals.add("out of descriptors"):
                    self.note(None, f"cannot accept connections: out of file descriptors "
                                    f"({os.strerror(value)}); closed the {shed} oldest connection(s) "
                                    f"that hold no rank")
                continue
            if what == "accept-failed":
                continue
            if what == "closed":
                for rank, m in self.members.items():
                    if m.fd == value and rank not in self.dead:
                        self.dead.add(rank)
                        m.fd = None
            elif self.gate.refusals.add("handshake"):
                self.note(None, "refused a connection: its handshake failed "
                                f"({_handshake_failure(what, value)})")

    # -- sending -----------------------------------------------------------------------

    def send(self, frames: list[bytes], flags: int = 0) -> None:
        """One message, its peer's identity first; raises what the socket raises."""
        send_frames(self.sock, frames, flags)

    def refuse(self, ident: bytes, reason: str, epoch: int, host: str = "") -> None:
        """Tell a peer why it is turned away (it exits), and note it: the first few times per
        peer; after that it is only counted, and gets no answer."""
        if not self.gate.turned_away.add(peer_label(ident, None, host)):
            return
        self.note(None, f"refused a peer{' at ' + host if host else ''}: {reason}")
        self.tell(ident, reason, epoch)

    def tell(self, ident: bytes, reason: str, epoch: int) -> None:
        """REFUSED with `reason` to one connection (it exits), not noted."""
        try:
            self.sock.send_multipart(
                [ident, wire.encode_header(MsgType.REFUSED, epoch, 0, -1, self.world_size),
                 wire.encode_body(MsgType.REFUSED, (reason,))], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass


def peer_label(ident: bytes, meta: Meta | None, host: str = "") -> str:
    """A peer as counted and noted: its connection's routing id, and its address if known."""
    host = host or (meta.host if meta is not None else "")
    return f"peer {ident.hex()}{' at ' + host if host else ''}"


def _prop(frame: zmq.Frame, name: str) -> str:
    try:
        return frame.get(name)
    except zmq.ZMQError:
        return ""


def _srcfd(frame: zmq.Frame) -> int | None:
    try:
        return int(frame.get(zmq.SRCFD))
    except (zmq.ZMQError, ValueError, TypeError):
        return None


def _handshake_failure(what: str, code: int) -> str:
    if what == "protocol":
        if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "it does not speak CURVE: a plaintext peer"
        return f"ZMTP protocol error {code:#x}"
    return (f"the connection closed mid-handshake: {os.strerror(code)}; a plaintext peer, "
            f"or one that does not hold this scheduler's public key")
