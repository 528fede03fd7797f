"""The channel: the scheduler's socket, and who is rank R on it.

The channel owns the ROUTER socket (and, with CURVE, the gate that checks
every key before a byte gets through) and the membership: for each rank the
member that holds it, the epoch it joined in, how it proved itself (the run
secret of a worker we spawned, or the CURVE key of one someone else started),
its pid and host. How members come to be (spawned here, or started by a
cluster's launcher) is not the channel's business: admission checks them in,
the process group drives steps over the channel.

Every exchange goes through here (a step's PLAN and RESULTs, the audit's
AUDIT and SHARDs, the handshake's waits). Replies of another epoch or step
are stale and a second one from a rank is a duplicate: both are counted and
noted, never used. A reply that does not decode, or names another rank than
its sender, is a protocol error blamed on the rank that sent it; a rank
whose process exits (its sentinel) or whose connection closes is seen at
once; one that stays silent is lost at the deadline. A member that leaves
is retired, never re-admitted: if it speaks again it is told to exit.
"""
from __future__ import annotations

import errno as _errno
import os
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, NamedTuple

import zmq

from inferris_dist.engine import RankLost
from inferris_dist.engine.errors import MachineFailure
from inferris_dist.observe.recorder import Recorder
from inferris_dist.observe.records import StepRecord
from inferris_dist.protocol import wire
from inferris_dist.protocol.sockets import POLLIN, send_frames
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.gate import Gate
from inferris_dist.scheduler.link import Link

if TYPE_CHECKING:
    from inferris_dist.protocol.keys import ServerKeys

MAX_RETIRED = 256           # identities of former members remembered, to tell them to exit
MAX_STRANGER_FRAMES = 4     # frames of a message from a non-member kept (the rest are dropped)
MAX_MEMBER_FRAMES = 3       # a member's message: header, body, timing (more is a protocol error)
HANDSHAKE_MS = 10_000       # a connection that has not finished ZeroMQ's handshake by then is closed


class Member:
    """Who holds a rank: the connection, the epoch it joined in, and how it proved itself."""
    __slots__ = ("rank", "epoch", "identity", "proof", "pid", "host", "fd", "replaceable")

    def __init__(self, rank: int, epoch: int, identity: bytes, proof: str, pid: int, host: str,
                 fd: int | None, replaceable: bool):
        self.rank = rank
        self.epoch = epoch
        self.identity = identity
        self.proof = proof            # "run secret" (spawned here) or "key rank-R" (CURVE)
        self.pid = pid
        self.host = host
        self.fd = fd                  # the connection's socket, to notice it closing
        self.replaceable = replaceable   # started by someone else: if it goes during admission,
                                         # wait for another


def machine_failure(e: OSError | zmq.ZMQError, what: str = "", step: int | None = None) -> MachineFailure:
    errno_ = getattr(e, "errno", None)
    name = getattr(e, "filename", None)
    text = getattr(e, "strerror", None) or str(e)
    if errno_ in (_errno.EMFILE, _errno.ENFILE):
        text = f"out of file descriptors ({text}; see ulimit -n)"
    elif errno_ == _errno.ENOSPC:
        text = f"{text} (the disk, or its inodes, is full: see df -h and df -i)"
    elif errno_ == _errno.EAGAIN:
        text = f"{text} (the system refused a process or thread: see ulimit -u)"
    where = f"{name}: " if name else ""
    return MachineFailure(f"{what + ': ' if what else ''}{where}{text}", step)


LAST_WORDS_S = 1.0       # at most this long for a dead rank's connection to close (see _last_words)


class Reply(NamedTuple):
    """One rank's reply in an exchange: its header, and its body decoded."""
    header: wire.Header
    body: object


class Flight:
    """One message to every rank and the replies it awaits: a step's plan in flight, or an
    audit. A step's flight is made when its plan is sent, held by the engine's step (with the
    plan it carries) and handed back to be collected; the replies are read into it as they come.
    With overlap scheduling a plan goes out while the one before it is awaited: a reply to it
    that comes meanwhile is kept in its own flight, not dropped. Restore sends a flight again,
    in the new epoch (the same plan, a new attempt)."""
    __slots__ = ("send", "expect", "step", "plan", "encoded", "against", "record", "epoch", "sent_at",
                 "got", "failure", "broken", "logged")

    def __init__(self, send: MsgType, expect: MsgType, step: int, plan: object, encoded: bytes,
                 against: object, record: StepRecord | None):
        self.send = send
        self.expect = expect
        self.step = step
        self.plan = plan              # what was sent: an ExecutionPlan, or an audit's body
        self.encoded = encoded
        self.against = against        # what the decoder reads a RESULT against (the plan's bytes)
        self.record = record          # this attempt's record (None for an audit)
        self.epoch = 0
        self.sent_at: dict = {}       # rank -> when it was sent (the record's `sent`)
        self.got: dict = {}           # rank -> (header, body bytes), as they came
        self.failure: RankLost | None = None   # sending it lost a rank: raised when it is collected
        self.broken: tuple[int, str] | None = None   # (rank, why): its reply did not decode, read
                                      # while the step before was awaited: raised when it is gathered
        self.logged = False           # its replies are in the wire log


FIRED_HEAD = bytes([0x96, wire.PROTOCOL_VERSION, int(MsgType.FIRED)])   # how a FIRED's header begins
MAX_FIRED_KEPT = 1024     # fault texts kept per rank (a run's faults for it, generously)
MAX_GARBLES_OWED = 64     # garbled replies a member announced and the channel has not read yet
LINK_DONE = object()      # a message's "meta": handed over by the link, which acted on it already


class Meta(NamedTuple):
    """What the transport says of a message from a peer that is not a member yet."""
    user_id: str            # "rank-R" when CURVE proved that rank's key; "" without CURVE
    host: str
    fd: int | None


class RankChannel:
    def __init__(self, world_size: int, step_timeout: float, recorder: Recorder | None = None,
                 spin_s: float = 0.0, link: Link | None = None):
        self.world_size = world_size
        self.step_timeout = step_timeout
        self.recorder = recorder = recorder if recorder is not None else Recorder(world_size)
        self.link = link if link is not None else Link([])   # the wire to each rank, and its faults
        self.epoch = 0
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.gate = Gate(world_size)         # the door: who may connect, and who was turned away
        self.address = ""
        self.curve = False
        self.timing = recorder.wants_timing   # ask the ranks for their own times (someone keeps them)
        self.spin_s = spin_s            # spin this long before sleeping in a wait (a free core only)
        self.blamed: set[int] = set()   # ranks a failure was blamed on (not asked politely at the end)
        self.members: dict[int, Member] = {}
        self.rank_of: dict[bytes, int] = {}
        self.retired: OrderedDict[bytes, tuple[int, int, str]] = OrderedDict()  # ident -> rank, epoch, why
        self.sentinels: dict[int, int] = {}       # rank -> pidfd of a worker we spawned
        self.explain: Callable[[int], str] = lambda rank: ""   # more on a rank that died
        self._answered: dict[int, tuple] = {}   # rank -> (epoch, step, kind) last joined
        self._dead: set[int] = set()                      # ranks whose process or connection ended
        self.in_flight: dict[int, Flight] = {}   # step -> its plan's flight, sent, replies not read yet
        self.fired: dict[int, set[str]] = {}     # rank -> its one-shot faults a member said fired
        self.garbling: dict[int, deque] = {}      # rank -> (epoch, step) of each plan whose reply its
                                                  # member said it garbles, not read yet, oldest first
        self._poller = zmq.Poller()

    # -- the socket --------------------------------------------------------------------

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

    totals = property(lambda self: self.recorder.totals)

    def close(self) -> None:
        self.void_in_flight("the run ended")
        self.recorder.turned_away(self.gate.counts(self.recorder.member_drops()))
        self.gate.close()                        # the monitor first: never a stuck I/O thread
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()

    # -- membership --------------------------------------------------------------------

    def admit(self, member: Member) -> None:
        self.retire(member.rank, "replaced")
        self.members[member.rank] = member
        self.rank_of[member.identity] = member.rank
        self._dead.discard(member.rank)
        self.blamed.discard(member.rank)        # a new member, blameless
        self.garbling.pop(member.rank, None)     # and it has announced nothing
        self.gate.proven(member.fd)
        self.recorder.member(member.rank, member.epoch, member.pid,
                             member.host if member.replaceable else "", member.proof)

    def retire(self, rank: int, why: str) -> Member | None:
        """Rank `rank` has no member any more; its connection is remembered, to be told to exit."""
        member = self.members.pop(rank, None)
        if member is None:
            return None
        self.rank_of.pop(member.identity, None)
        self.link.forget(rank)
        self.retired[member.identity] = (rank, member.epoch, why)
        while len(self.retired) > MAX_RETIRED:
            self.retired.popitem(last=False)
        return member

    def watch_process(self, rank: int, sentinel: int | None) -> None:
        """Poll `sentinel` (a pidfd) to see rank `rank`'s process exit at once."""
        old = self.sentinels.pop(rank, None)
        if old is not None and rank not in self._dead:
            self._poller.unregister(old)
        self._dead.discard(rank)
        if sentinel is not None:
            self.sentinels[rank] = sentinel
            self._poller.register(sentinel, zmq.POLLIN)

    def unwatch_process(self, rank: int) -> None:
        old = self.sentinels.pop(rank, None)
        if old is not None and rank not in self._dead:
            self._poller.unregister(old)
        self._dead.discard(rank)

    @property
    def dead_ranks(self) -> set[int]:
        return set(self._dead)

    # -- the exchange: one step's (or audit's) round with every rank --------------------

    def exchange(self, send: MsgType, expect: MsgType, step: int, body) -> dict[int, "Reply"]:
        """Send `body` (encoded once, the same bytes to every rank) and gather one reply of kind
        `expect` from each (an audit's round). RankLost when a rank is lost or breaks the
        protocol."""
        flight = self.send_round(send, expect, step, body, None)
        if flight.failure is not None:
            raise flight.failure
        return self.receive_round(flight)

    def send_round(self, send: MsgType, expect: MsgType, step: int, body, record: StepRecord | None
                   ) -> Flight:
        """The sending half: the flight, sent to every rank. A RESULT is read back against the
        plan's own bytes: what repeats the plan shares its values. A rank that cannot be reached
        is the flight's failure, raised when it is collected (for a plan sent while another is
        awaited, see `send`)."""
        if send is MsgType.PLAN:
            encoded, against = wire.encode_plan(body)
        else:
            encoded, against = wire.encode_body(send, body), None
        flight = Flight(send, expect, step, body, encoded, against, record)
        self.resend(flight, record)
        return flight

    def resend(self, flight: Flight, record: StepRecord | None) -> None:
        """Send `flight` (again: restore, in a new epoch), as attempt `record`."""
        ahead = bool(self.in_flight)
        flight.record, flight.epoch, flight.got = record, self.epoch, {}
        flight.failure, flight.broken, flight.logged = None, None, False
        flight.sent_at = sent_at = record.sent if record is not None else {}
        if record is not None:
            record.plan_bytes = len(flight.encoded)
        extra = (wire.TIMING_PLEASE,) if self.timing and flight.send is MsgType.PLAN else ()
        if flight.send is MsgType.PLAN:
            self.in_flight[flight.step] = flight
        try:
            for rank in range(self.world_size):
                sent_at[rank] = time.monotonic()
                self.send(rank, flight.send, flight.step, flight.encoded, flight.plan, extra=extra,
                          found_later=ahead, record=record)
        except RankLost as e:
            flight.failure = e

    def receive_round(self, flight: Flight) -> dict[int, "Reply"]:
        """The receiving half: every rank's reply to `flight`, those that came early included,
        each decoded (once, when every rank sent the same bytes)."""
        expect, step = flight.expect, flight.step
        self.recorder.gathering(flight.record)   # an audit has none: the step's verdict stands
        self.in_flight.pop(step, None)            # read now: a failure logs what came itself
        self.gather(flight)
        got = flight.got
        raw = [got[r][1] for r in range(self.world_size)]
        if all(b == raw[0] for b in raw):
            blame = 0 if self.world_size == 1 else None      # the same bad bytes from every rank
            decoded = [self.decode(blame, expect, raw[0], flight)] * self.world_size
        else:
            decoded = [self.decode(r, expect, raw[r], flight) for r in range(self.world_size)]
        self.recorder.replies(self.epoch, flight, dict(enumerate(decoded)))
        return {r: Reply(got[r][0], decoded[r]) for r in range(self.world_size)}

    def joined(self, step: int) -> None:
        """Every rank's reply to `step` was joined: a second one from any of them is a duplicate."""
        for rank in range(self.world_size):
            self._answered[rank] = (self.epoch, step, MsgType.RESULT)

    def next_epoch(self) -> int:
        """A new epoch: replies of the old one are stale from now on (plans in flight too)."""
        self.void_in_flight("the epoch ended")
        self.epoch += 1
        return self.epoch

    def void_in_flight(self, why: str) -> None:
        """The plans sent whose results will never be read (the epoch ends, or the run)."""
        for flight in self.in_flight.values():
            self.recorder.voided(self.epoch, flight, why)
        self.in_flight.clear()

    # -- receiving ---------------------------------------------------------------------

    def gather(self, flight: Flight) -> None:
        """One reply of kind `flight.expect` from every rank into `flight.got`, or RankLost. The
        replies that came before a failure are logged with it: the wire log holds every message
        that crossed. The wait runs from now: a plan sent ahead of the one before it is started
        by the ranks only when they are done with that one."""
        deadline = time.monotonic() + self.step_timeout
        step, got = flight.step, flight.got
        if flight.broken is not None:            # read while the step before was awaited
            rank, why = flight.broken
            raise self.lost(rank, step, "protocol", f"broke the protocol: {why}", flight=flight)
        while len(got) < self.world_size:
            dead, messages = self.wait(deadline)
            self._take_all(messages, flight)
            missing = [rank for rank in dead if rank not in got]
            if missing:
                self._last_words(missing, flight)
            for rank in missing:
                if rank not in got:
                    raise self.lost(rank, step, "died", f"died before answering step {step}", flight=flight)
            if len(got) < self.world_size and time.monotonic() >= deadline:
                silent = sorted(set(range(self.world_size)) - set(got))
                raise self.lost(silent[0], step, "timeout",
                                f"gave no answer to step {step} within {self.step_timeout:g} s",
                                also=silent[1:], flight=flight)

    def _take_all(self, messages, flight: Flight) -> None:
        for i, (frames, meta) in enumerate(messages):
            try:
                self.take(frames, meta, flight)
            except RankLost:
                self._drop_rest(messages[i + 1:])   # what else came is logged, not lost
                raise

    def _last_words(self, ranks, flight: Flight) -> None:
        """A rank's process can be seen gone a moment before ZeroMQ hands over what it sent just
        before it went. Its connection closes after the last of its bytes are read (a stream
        is in order), and the socket monitor says so: until then, at most LAST_WORDS_S, read
        on, so that a rank that answered and then died has answered."""
        got = flight.got

        def settled() -> bool:
            return all(r in got or (r in self.members and self.members[r].fd is None)
                       or r not in self.members for r in ranks)
        until = time.monotonic() + (LAST_WORDS_S if self.gate.monitor is not None else 0.02)
        while True:
            done = settled()
            _, messages = self.wait(time.monotonic() if done else min(until, time.monotonic() + 0.005))
            self._take_all(messages, flight)
            if done or time.monotonic() >= until:
                return

    def take(self, frames, meta, flight: Flight) -> None:
        """One message, while `flight`'s replies are awaited: a reply to it, to a plan sent after
        it (kept in that plan's flight), or one to drop, count and note."""
        rank = self.rank_of.get(frames[0])
        if rank is None:
            return self.stranger(frames, None if meta is LINK_DONE else meta)
        expect, step = flight.expect, flight.step
        came, timing = frames, None
        try:
            frames, extra = self.without_timing(frames)
            if extra is not None and expect is MsgType.RESULT:
                timing = wire.decode_timing(extra)
            if len(frames) != 3:
                raise wire.WireError(f"a message of {len(frames) - 1} frame(s), not 2")
            header = wire.decode_header(frames[1])
        except wire.WireError as e:
            # An undecodable message says neither its epoch nor its step. One its member announced
            # (FIRED) in an epoch gone by is a kept member's, read after the restore: dropped. One
            # announced for a plan sent after this one (overlap), or from a rank that has answered
            # this step (a member answers in order), answers that later plan: its step's failure,
            # raised when it is gathered.
            if self.drop_announced_garble(rank, frames, str(e)):
                return
            said = self._owed_garble(rank)
            if said is not None and said[1] != step and said[1] in self.in_flight:
                ahead = self.in_flight[said[1]]
            else:
                ahead = self._ahead_of(flight, rank)
            answers = ahead.step if ahead is not None else step
            self.recorder.broken(rank, self.epoch, answers, expect, sum(map(len, frames[1:])), str(e))
            if ahead is not None:
                ahead.broken = ahead.broken or (rank, str(e))
                return
            raise self.lost(rank, step, "protocol", f"broke the protocol: {e}", flight=flight) from None
        if header.rank != rank:
            raise self.lost(rank, step, "protocol",
                            f"broke the protocol: its message names rank {header.rank}", flight=flight)
        copied = None                   # "duplicated": the link delivered this message twice
        if self.link.active and meta is not LINK_DONE:
            what, seconds = self.link.incoming(rank, header.type, header.step)
            if what is not None:
                if what == "delayed" and not self.link.hold_in(rank, came, None, seconds):
                    what = "lost"
                said = f"the {header.type.name} of step {header.step} from rank {rank}"
                self.recorder.link_note(None, rank, self.epoch, _did(what, seconds, said))
                if what != "duplicated":
                    self.recorder.link_in(rank, header, frames[2], what)
                    return
                self.take(came, LINK_DONE, flight)      # the copy comes first, then the message
                copied = what
        current = header.type is expect and header.epoch == self.epoch and header.step == step
        into = flight
        if rank in flight.got or not current:
            into = self.in_flight.get(header.step) if header.type is MsgType.RESULT \
                and header.epoch == self.epoch else None
            if into is None or into is flight or rank in into.got:
                return self.drop(rank, header, body=frames[2], link=copied)
        into.got[rank] = (header, frames[2])     # a plan sent ahead: kept for its turn
        self.recorder.taken(rank, len(frames[1]), len(frames[2]), into.record, into.sent_at[rank], timing)

    def _ahead_of(self, flight: Flight, rank: int) -> Flight | None:
        """The plan sent after `flight` that `rank`'s next reply answers, if it has answered
        `flight` already (None: that reply answers `flight`)."""
        if rank not in flight.got or flight.expect is not MsgType.RESULT:
            return None
        later = [f for s, f in self.in_flight.items() if s > flight.step and rank not in f.got]
        return min(later, key=lambda f: f.step) if later else None

    def _drop_rest(self, messages) -> None:
        """Members' replies that came in the same batch as a failure: dropped, counted, logged."""
        for frames, _meta in messages:
            rank = self.rank_of.get(frames[0])
            if rank is None:
                continue
            frames, _ = self.without_timing(frames)
            try:
                header = wire.decode_header(frames[1]) if len(frames) == 3 else None
            except wire.WireError:
                header = None
            if header is None:
                self._owed_garble(rank)           # the garbled reply it announced, if any: read
            if header is not None and header.rank == rank:
                self.drop(rank, header, "(after the step failed)", body=frames[2])

    def without_timing(self, frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
        """A member's message and, apart, the frame of its own times a result carries when we
        asked for them (a timeline, a wire log): never part of the bytes that must agree."""
        if len(frames) == 4 and self.timing:
            return frames[:3], frames[3]
        return frames, None

    def stranger(self, frames: list[bytes], meta: Meta | None, during: str = "") -> bool:
        """A message from a connection that holds no rank. A former member (or, with CURVE, a
        worker proven to hold a rank's key, speaking from an older epoch) is told to exit; any
        other peer gets no answer. Each peer's first few are noted in full, the rest counted:
        a flood costs a counter, not memory or output. True if it was told to exit."""
        ident = frames[0]
        if ident in self.retired:
            rank, epoch, why = self.retired[ident]
            self.refuse(ident, f"rank {rank} of epoch {epoch} was {why}; the run is in epoch "
                               f"{self.epoch}: exit", meta.host if meta else "")
            return True
        peer = peer_label(ident, meta)
        if not self.gate.turned_away.add(peer):
            return False                                  # counted; noted often enough already
        header = None
        if len(frames) == 3:
            try:
                header = wire.decode_header(frames[1])
            except wire.WireError:
                pass
        if (self.curve and header is not None and meta is not None and header.epoch < self.epoch
                and header.type is not MsgType.HELLO and meta.user_id == f"rank-{header.rank}"):
            self.tell(ident, f"rank {header.rank} of epoch {header.epoch} is no member: the run "
                              f"is in epoch {self.epoch}: exit")
            self.note(None, f"refused {peer}: rank {header.rank} of epoch {header.epoch} is no member")
            return True
        self.note(None, f"dropped a message from an unknown peer ({peer}){' ' + during if during else ''}")
        return False

    def drop(self, rank: int, header: wire.Header, when: str = "", body: bytes | None = None,
             link: str | None = None) -> None:
        """Count and note a reply that is not joined: a duplicate of one already taken, or stale.
        It crossed, so it is logged too (marked dropped), as it came; `link`: what the link did
        to it (the second copy of a message it delivered twice)."""
        last = self.recorder.last_record
        seen = self._answered.get(rank) == (header.epoch, header.step, header.type) or (
            header.epoch == self.epoch and last is not None and header.step == last.step
            and rank in last.rtt)
        ahead = header.epoch > self.epoch or (
            header.epoch == self.epoch and last is not None and header.step > last.step)
        what = "duplicate" if seen else "future" if ahead else "stale"
        self.recorder.dropped(rank, self.epoch, header, body, what,
                              f"dropped a {what} {header.type.name} from rank {rank} "
                              f"(epoch {header.epoch}, step {header.step}){' ' + when if when else ''}",
                              link=link)

    def decode(self, rank: int | None, kind: MsgType, body: bytes, flight: Flight):
        try:
            if kind is MsgType.RESULT and flight.against is not None:
                return wire.decode_result(body, flight.against)
            return wire.decode_body(kind, body)
        except wire.WireError as e:
            raise self.lost(rank, flight.step, "protocol", f"sent a malformed {kind.name}: {e}",
                            flight=flight) from None

    def _poll(self, deadline: float) -> dict:
        """The poller's events by `deadline`. With `spin_s`, first a bounded spin without
        sleeping (no wake-up to pay when the answer comes within it), then a sleeping wait."""
        if self.spin_s > 0.0:
            until = min(deadline, time.monotonic() + self.spin_s)
            while True:
                events = self._poller.poll(0)
                if events or time.monotonic() >= until:
                    break
            if events:
                return dict(events)
        if self.link.active:
            due = self.link.next_due()
            if due is not None:
                deadline = min(deadline, due)
        timeout = max(0.0, deadline - time.monotonic())
        return dict(self._poller.poll(int(timeout * 1000) + 1))

    def wait(self, deadline: float) -> tuple[list[int], list[tuple[list[bytes], Meta | None]]]:
        """Messages that came, and ranks whose process or connection is gone, waiting at most
        until `deadline`.

        A sentinel stays readable once its process exits, so it is unregistered
        the first time: a dead rank is remembered, not polled in a busy loop.
        """
        events = self._poll(deadline)
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
                if not self._fired(message[0]):
                    messages.append(message)
        if self.link.active:
            messages += self._link_due()
        for rank, fd in self.sentinels.items():
            if rank not in self._dead and fd in events:
                self._dead.add(rank)
                self._poller.unregister(fd)
        return sorted(r for r in self._dead if r in self.members or r in self.sentinels), messages

    def _owed_garble(self, rank: int) -> tuple[int, int] | None:
        """The oldest garbled reply `rank`'s member announced and the channel has not read: (epoch,
        step), taken; a member answers its plans in order, so the next that does not decode is it."""
        owed = self.garbling.get(rank)
        return owed.popleft() if owed else None

    def drop_announced_garble(self, rank: int, frames: list[bytes], why: str) -> bool:
        """Whether `rank`'s message, which does not decode (`why`), is the garbled reply its
        member announced (FIRED) in an epoch gone by: a kept member's, read only after the
        restore began (while its step is awaited again, or while the ranks replaced are
        admitted). Then it is dropped and said, logged as a stale RESULT (a garble is a reply
        to a plan) of the epoch and step it was announced for (it names none itself); else
        nothing is done."""
        owed = self.garbling.get(rank)
        if not owed or owed[0][0] >= self.epoch:
            return False
        epoch, answers = self._owed_garble(rank)
        self.recorder.broken(rank, epoch, answers, MsgType.RESULT, sum(map(len, frames[1:])), why,
                             dropped="stale")
        self.note(rank, f"dropped rank {rank}'s garbled reply of epoch {epoch} (announced then, read only "
                        f"now)")
        return True

    def _fired(self, frames: list[bytes]) -> bool:
        """A FIRED from a member (or one retired since: a worker says it just before a fault
        kills it) is kept, whenever it comes: those faults are spent, and no replacement gets
        them. Peeked at by its header's first bytes (a fixarray of six, the version, the type):
        the other messages pay a slice and a compare."""
        if len(frames) != 3 or frames[1][:3] != FIRED_HEAD:
            return False
        rank = self.rank_of.get(frames[0])
        if rank is None and frames[0] in self.retired:
            rank = self.retired[frames[0]][0]
        if rank is None:
            return False
        try:
            header = wire.decode_header(frames[1])
            texts = wire.decode_body(MsgType.FIRED, frames[2])
        except wire.WireError:
            return False                  # not one after all: read as any other message
        if header.rank != rank:
            return False
        spent = self.fired.setdefault(rank, set())
        if len(spent) < MAX_FIRED_KEPT:
            spent.update(texts)
        if any(_kind_of(text) == "garble" for text in texts):
            self.garbling.setdefault(rank, deque(maxlen=MAX_GARBLES_OWED)).append(
                (header.epoch, header.step))    # its reply to that plan will not decode
        self.recorder.totals[rank].bytes_received += len(frames[1]) + len(frames[2])
        self.recorder.received(rank, header.epoch, header.step, MsgType.FIRED, len(frames[2]), list(texts))
        return True

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
                    if m.fd == value and rank not in self._dead:
                        self._dead.add(rank)
                        m.fd = None
            elif self.gate.refusals.add("handshake"):
                self.note(None, "refused a connection: its handshake failed "
                                f"({_handshake_failure(what, value)})")

    # -- sending -----------------------------------------------------------------------

    def send(self, rank: int, kind: MsgType, step: int, body: bytes, decoded, *, quiet=False,
             extra: tuple[bytes, ...] = (), found_later: bool = False, record: StepRecord | None = None
             ) -> None:
        """`found_later`: a plan sent ahead of one still awaited; a rank it cannot reach is not
        lost here but where the plan before is gathered (it died, or its connection closed),
        so that one loss is one loss, at the step it broke."""
        header = wire.encode_header(kind, self.epoch, step, rank, self.world_size)
        member = self.members.get(rank)
        what, seconds = self.link.outgoing(rank, kind, step) if self.link.active else (None, 0.0)
        try:
            frames = [member.identity, header, body, *extra]
            if what is None or what == "duplicated":
                send_frames(self.sock, frames, zmq.NOBLOCK if quiet else 0)
        except (zmq.ZMQError, AttributeError):
            if quiet or found_later:
                return
            raise self.lost(rank, step, "unreachable", "cannot be reached") from None
        if what is None:
            self.recorder.sent(rank, self.epoch, step, kind, len(header), len(body), decoded)
            if self.link.active:
                self._release_reordered(rank)
            return
        self._on_link(rank, kind, step, frames, header, body, decoded, what, seconds, record)

    # -- the link's faults: what it did to a message, said with the message ------------------

    def _on_link(self, rank, kind, step, frames, header, body, decoded, what: str, seconds: float,
                 record: StepRecord | None) -> None:
        """A message to `rank` the link acts on: lost, held (delayed, reordered) or duplicated."""
        for cut_rank, cut_step, cut_s in self.link.partitions:
            self.recorder.partition(cut_rank, cut_step, self.epoch, cut_s)
            self.recorder.link_note(record, cut_rank, self.epoch, f"the link cut rank {cut_rank} off for "
                                    f"{cut_s:g} s (everything to and from it lost)")
        self.link.partitions.clear()
        if what == "delayed" and not self.link.hold_out(rank, frames, seconds):
            what = "lost"                      # the link holds no more: it loses the message
        elif what == "reordered":
            self.link.reorder(rank, frames)
        self.recorder.sent(rank, self.epoch, step, kind, len(header), len(body), decoded, link=what)
        self.recorder.link_note(record, rank, self.epoch, _did(what, seconds, f"the {kind.name} of step "
                                                                         f"{step} to rank {rank}"))
        if what == "duplicated":
            try:
                send_frames(self.sock, frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            self.recorder.sent(rank, self.epoch, step, kind, len(header), len(body), decoded, link=what)
            self._release_reordered(rank)

    def _release_reordered(self, rank: int) -> None:
        """A message to `rank` crossed: the plans the link held back for it cross after it."""
        for frames in self.link.after_next(rank):
            try:
                send_frames(self.sock, frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _link_due(self) -> list:
        """What the link delays and is due now: sends go out, receipts are handed over as if
        they came now (marked: the link acted on them already)."""
        for held in self.link.due_out():
            try:
                send_frames(self.sock, held.frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                continue                       # its member is gone: lost with it
            self._release_reordered(held.rank)
        return [(held.frames, LINK_DONE) for held in self.link.due_in()]

    def refuse(self, ident: bytes, reason: str, host: str = "") -> None:
        """Tell a peer why it is turned away (it exits), and note it: the first few times per
        peer; after that it is only counted, and gets no answer."""
        if not self.gate.turned_away.add(peer_label(ident, None, host)):
            return
        self.note(None, f"refused a peer{' at ' + host if host else ''}: {reason}")
        self.tell(ident, reason)

    def tell(self, ident: bytes, reason: str) -> None:
        """REFUSED with `reason` to one connection (it exits), not noted."""
        try:
            self.sock.send_multipart(
                [ident, wire.encode_header(MsgType.REFUSED, self.epoch, 0, -1, self.world_size),
                 wire.encode_body(MsgType.REFUSED, (reason,))], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    # -- saying what happened ----------------------------------------------------------

    def lost(self, rank: int | None, step: int, reason: str, what: str, also=(),
             flight: Flight | None = None) -> RankLost:
        """A RankLost blamed on `rank` (and the ranks `also`; None: every rank alike), recorded
        after what did come back for `flight`, the round it broke."""
        detail = ""
        if rank is not None and reason in ("died", "unreachable"):
            detail = self.explain(rank)
            if not detail and rank in self.members and rank in self._dead:
                detail = " (its connection closed)"
        message = f"{who_of(rank, also)} {what}{detail}"
        ranks = tuple(range(self.world_size)) if rank is None else (rank, *also)
        self.blamed.update(ranks)
        step = None if step < 0 else step
        if flight is not None:
            self.recorder.replies(self.epoch, flight, {})
        err = RankLost(message, step=step, rank=rank, epoch=self.epoch, reason=reason, ranks=ranks)
        self.recorder.lost(err, step, self.epoch)
        return err

    def turned_away_summary(self) -> str | None:
        return self.gate.summary(self.recorder.member_drops())

    def note(self, rank: int | None, text: str) -> None:
        self.recorder.note(rank, self.epoch, text)


def _kind_of(fault_text: str) -> str:
    """The kind of a fault spec as a worker names it (RANK:KIND@STEP...)."""
    return fault_text.partition(":")[2].partition("@")[0]


def _did(what: str, seconds: float, message: str) -> str:
    """What the link did to `message`, in words."""
    if what == "delayed":
        return f"the link delayed {message} by {seconds:g} s"
    if what == "reordered":
        return f"the link held back {message} until after the next message to it"
    return f"the link {what} {message}"


def who_of(rank: int | None, also=()) -> str:
    """Who a loss is blamed on, in words."""
    if rank is None:
        return "every rank"
    return f"rank {rank}" if not also else "ranks " + ", ".join(map(str, (rank, *also)))


def lost_verdict(err: RankLost) -> str:
    """An attempt's verdict when a rank was lost."""
    rank, *also = err.ranks if err.rank is not None else (None,)
    return f"{who_of(rank, also)} lost ({err.reason})"


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
