"""The channel: the rounds of messages with the ranks, and who is rank R.

The channel keeps the membership: for each rank the member that holds it, the epoch it
joined in, how it proved itself (the run secret of a worker we spawned, or the CURVE key of
one someone else started), its pid and host. How members come to be (spawned here, or
started by a cluster's launcher) is not the channel's business: admission checks them in,
the process group drives steps over the channel. It sends and reads through the transport
(`transport.py`: the socket, its poll, the gate), wrapped, only in a run that asks for link
faults, by the link's layer (`linkfaults.py`); a run with rank faults keeps what the ranks
said fired (`oneshots.py`). A run without faults calls nothing of either.

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
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import zmq

from inferris_dist.engine import RankLost
from inferris_dist.engine.errors import MachineFailure
from inferris_dist.observe.recorder import Recorder
from inferris_dist.observe.records import StepRecord
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.transport import LINK_DONE, Meta, Transport, peer_label

if TYPE_CHECKING:
    from inferris_dist.protocol.faults import Fault
    from inferris_dist.protocol.keys import ServerKeys
    from inferris_dist.scheduler.linkfaults import LinkFaults
    from inferris_dist.scheduler.oneshots import OneShots

HELLO_HEAD = bytes([0x96, wire.PROTOCOL_VERSION, int(MsgType.HELLO)])   # how a HELLO's header begins
MAX_KNOCKS = 64             # HELLOs kept from members started ahead (the rest are strangers')
MAX_RETIRED = 256           # identities of former members remembered, to tell them to exit


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


LAST_WORDS_S = 1.0       # at most this long for a dead rank's connection to close (see gather)


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


class RankChannel:
    def __init__(self, world_size: int, step_timeout: float, recorder: Recorder | None = None,
                 spin_s: float = 0.0, faults: Sequence[Fault] = (), transport: Transport | None = None):
        """`faults`: the run's; the link's layer is made only when a link fault is among them,
        the one-shots' bookkeeping only when a rank fault is. `transport`: an open one a run
        before this one served (a warm world, world.py), lent to this channel."""
        self.world_size = world_size
        self.step_timeout = step_timeout
        self.recorder = recorder = recorder if recorder is not None else Recorder(world_size)
        self.epoch = 0
        self.address = ""
        self.curve = False
        self.timing = recorder.wants_timing   # ask the ranks for their own times (someone keeps them)
        self.blamed: set[int] = set()   # ranks a failure was blamed on (not asked politely at the end)
        self.members: dict[int, Member] = {}
        self.rank_of: dict[bytes, int] = {}
        self.retired: OrderedDict[bytes, tuple[int, int, str]] = OrderedDict()  # ident -> rank, epoch, why
        self.explain: Callable[[int], str] = lambda rank: ""   # more on a rank that died
        self._answered: dict[int, tuple] = {}   # rank -> (epoch, step, kind) last joined
        self.in_flight: dict[int, Flight] = {}   # step -> its plan's flight, sent, replies not read yet
        self.knocking: deque | None = None      # HELLOs of members started ahead, kept for admission
        if transport is None:
            self.transport = Transport(world_size, step_timeout, spin_s, self.members, self.rank_of,
                                       self.note)
        else:
            self.transport = transport.lend(world_size, step_timeout, spin_s, self.members, self.rank_of,
                                            self.note)
            self.address, self.curve = transport.address, transport.curve
        self.gate = self.transport.gate      # the door: who may connect, and who was turned away
        self.link: LinkFaults | None = None   # the wire to each rank and its faults, if any were asked
        self.oneshots: OneShots | None = None   # what the ranks said fired, in a run with rank faults
        if any(f.on_link for f in faults):
            from inferris_dist.scheduler.link import Link
            from inferris_dist.scheduler.linkfaults import LinkFaults
            self.link = LinkFaults(Link(faults), self.transport, recorder)
        if any(not f.on_link for f in faults):
            from inferris_dist.scheduler.oneshots import OneShots
            self.oneshots = OneShots(recorder)

    # -- the socket --------------------------------------------------------------------

    def open(self, bind: str, keys: ServerKeys | None, max_frame: int = wire.MAX_FRAME_BYTES) -> None:
        """Bind the transport's socket at `bind` (see Transport.open)."""
        self.transport.open(bind, keys, max_frame)
        self.address, self.curve = self.transport.address, self.transport.curve

    def close(self, keep_open: bool = False) -> None:
        """The run ended: plans out voided, what was turned away recorded, the socket closed
        (`keep_open`: left open, with its connections, for the next run of a warm world)."""
        _void(self, "the run ended")
        self.recorder.turned_away(self.gate.counts(self.recorder.member_drops()))
        if not keep_open:
            self.transport.close()

    # -- membership --------------------------------------------------------------------

    def admit(self, member: Member) -> None:
        self.retire(member.rank, "replaced")
        self.members[member.rank] = member
        self.rank_of[member.identity] = member.rank
        self.transport.dead.discard(member.rank)
        self.blamed.discard(member.rank)        # a new member, blameless
        if self.oneshots is not None:
            self.oneshots.forget(member.rank)    # and it has announced nothing
        self.gate.proven(member.fd)
        self.recorder.member(member.rank, member.epoch, member.pid,
                             member.host if member.replaceable else "", member.proof)

    def retire(self, rank: int, why: str) -> Member | None:
        """Rank `rank` has no member any more; its connection is remembered, to be told to exit."""
        member = self.members.pop(rank, None)
        if member is None:
            return None
        self.rank_of.pop(member.identity, None)
        if self.link is not None:
            self.link.forget(rank)
        self.retired[member.identity] = (rank, member.epoch, why)
        while len(self.retired) > MAX_RETIRED:
            self.retired.popitem(last=False)
        return member

    def reshape(self, world_size: int, kept: dict[int, int]) -> None:
        """A world of `world_size` ranks from now on (in the epoch just begun): `kept` maps each
        kept member's old rank to its new one; every other member was retired already."""
        members = {kept[r]: m for r, m in self.members.items() if r in kept}
        for rank, member in members.items():
            member.rank = rank
        self.members.clear()
        self.members.update(members)            # the transport reads the same dict
        self.rank_of.clear()
        self.rank_of.update({m.identity: r for r, m in members.items()})
        if self.link is not None:
            for rank in range(max(self.world_size, world_size)):
                self.link.forget(rank)          # what it held was of the old world
        self.world_size = world_size
        self.blamed = {kept[r] for r in self.blamed if r in kept}
        self._answered.clear()
        self.transport.reshape(world_size, kept)
        self.recorder.reshape(world_size)

    def settle(self, step: int, bodies: dict[int, "wire.Resize"]) -> None:
        """Tell each kept member its place in a world of another size (RESIZE: its new rank in
        the header, the shard and faults it holds there) and wait for its READY, within the
        step timeout. RankLost when one dies, stays silent or answers out of turn."""
        for rank, body in bodies.items():
            self.send(rank, MsgType.RESIZE, step, wire.encode_body(MsgType.RESIZE, body), body)
        failed = self._await_ready(set(bodies), set(), step, "RESIZE", "while the world changed size")
        if failed is not None:
            rank, reason, what, also = failed
            raise self.lost(rank, step, reason, what, also=also)

    def reconfigure(self, bodies: dict[int, "wire.Config"]) -> dict[int, str]:
        """A run begins on members a run before handed back (a warm world): each is configured
        again (CONFIG in this run's epoch, protocol §8.6) and says READY within the step
        timeout. The ranks that did not, each with why (to be replaced, not blamed: this run
        has not begun)."""
        for rank, body in bodies.items():
            try:
                self.send(rank, MsgType.CONFIG, 0, wire.encode_body(MsgType.CONFIG, body), body)
            except RankLost:
                pass                               # unreachable: it says no READY either
        failed: dict[int, str] = {}
        waiting, ready = set(bodies), set()
        while (gone := self._await_ready(waiting, ready, 0, "CONFIG", "while configured again")) is not None:
            rank, _, what, also = gone
            for r in (rank, *also):
                failed[r] = what
                waiting.discard(r)
        return failed

    def _await_ready(self, ranks: set[int], ready: set[int], step: int, sent: str, when: str
                     ) -> tuple[int, str, str, tuple[int, ...]] | None:
        """READY from every one of `ranks` (told `sent`) into `ready`, within the step timeout;
        else the first failure: (rank, reason, what, other ranks alike)."""
        deadline = time.monotonic() + self.step_timeout
        while not ranks <= ready:
            dead, messages = self.wait(deadline)
            for frames, meta in messages:
                rank = self.rank_of.get(frames[0])
                if rank is None:
                    self.stranger(frames, None if meta is LINK_DONE else meta)
                    continue
                frames, _ = without_timing(frames, self.timing)
                try:
                    if len(frames) != 3:
                        raise wire.WireError(f"a message of {len(frames) - 1} frame(s), not 2")
                    header = wire.decode_header(frames[1])
                except wire.WireError as e:
                    return rank, "protocol", f"broke the protocol: {e}", ()
                if header.epoch < self.epoch:
                    self.drop(rank, header, f"({when})", body=frames[2])
                elif header.type is not MsgType.READY or header.rank != rank or rank in ready \
                        or rank not in ranks:
                    return rank, "protocol", (f"answered its {sent} with {header.type.name} naming rank "
                                              f"{header.rank} of {header.world_size}"), ()
                else:
                    ready.add(rank)
                    self.recorder.received(rank, self.epoch, header.step, header.type, len(frames[2]), ())
            gone = [r for r in dead if r in ranks and r not in ready]
            if gone:
                return gone[0], "died", f"died {when}", tuple(gone[1:])
            if not ranks <= ready and time.monotonic() >= deadline:
                silent = sorted(ranks - ready)
                return (silent[0], "timeout",
                        f"did not say READY to its {sent} within {self.step_timeout:g} s", tuple(silent[1:]))
        return None

    def expect_knocks(self) -> None:
        """Members are being started ahead: keep their HELLOs, read while the steps go on."""
        if self.knocking is None:
            self.knocking = deque(maxlen=MAX_KNOCKS)

    def knocked(self, count: int, until: float | None = None) -> bool:
        """Whether HELLOs from `count` connections have come since `expect_knocks`, reading
        what came (without blocking, or until `until`)."""
        if self.knocking is None:
            return False
        if not self.in_flight:      # with a plan out, its gather reads them (and keeps the HELLOs)
            self.between_steps(time.monotonic() if until is None else until)
        return len({frames[0] for frames, _ in self.knocking}) >= count

    def between_steps(self, deadline: float) -> list[int]:
        """What comes while no round is awaited, until `deadline`: a member's late reply is
        dropped, a stranger's message judged as always; the ranks whose process or connection
        is gone."""
        dead, messages = self.wait(deadline)
        for frames, meta in messages:
            rank = self.rank_of.get(frames[0])
            if rank is None:
                self.stranger(frames, None if meta is LINK_DONE else meta)
            elif self.in_flight:                  # a reply to a plan out: kept for its gather
                self.take(frames, meta, self.in_flight[min(self.in_flight)])
            else:
                self._between(rank, frames)
        return dead

    def take_knocking(self) -> list:
        knocking, self.knocking = self.knocking, None
        return list(knocking or ())

    def _between(self, rank: int, frames: list[bytes]) -> None:
        """A member's message read between steps: a late reply, dropped and noted."""
        frames, _ = without_timing(frames, self.timing)
        try:
            header = wire.decode_header(frames[1]) if len(frames) == 3 else None
        except wire.WireError:
            header = None
        if header is not None:
            self.drop(rank, header, "(between steps)", body=frames[2])

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
        same = all(b == raw[0] for b in raw)
        decoded = []
        for r in range(1 if same else self.world_size):
            try:
                decoded.append(_decode(expect, raw[r], flight))
            except wire.WireError as e:
                # the same bad bytes from every rank: blamed on every rank (on the one, if it is one)
                blame = r if not same else 0 if self.world_size == 1 else None
                raise self.lost(blame, flight.step, "protocol", f"sent a malformed {expect.name}: {e}",
                                flight=flight) from None
        if same:
            decoded *= self.world_size
        self.recorder.replies(self.epoch, flight, dict(enumerate(decoded)))
        return {r: Reply(got[r][0], decoded[r]) for r in range(self.world_size)}

    def joined(self, step: int) -> None:
        """Every rank's reply to `step` was joined: a second one from any of them is a duplicate."""
        for rank in range(self.world_size):
            self._answered[rank] = (self.epoch, step, MsgType.RESULT)

    def next_epoch(self) -> int:
        """A new epoch: replies of the old one are stale from now on (plans in flight too)."""
        _void(self, "the epoch ended")
        self.epoch += 1
        return self.epoch

    # -- receiving ---------------------------------------------------------------------

    def wait(self, deadline: float) -> tuple[list[int], list[tuple[list[bytes], Meta | None]]]:
        """Messages that came (a FIRED kept by the one-shots, not handed over; what the link
        held and is due now, handed over), and ranks whose process or connection is gone,
        waiting at most until `deadline` (see Transport.wait)."""
        link = self.link
        dead, messages = self.transport.wait(deadline, link.next_due if link is not None else None)
        if self.oneshots is not None:
            heard, rank_of, retired = self.oneshots.heard, self.rank_of, self.retired
            messages = [m for m in messages if not heard(m[0], rank_of, retired)]
        if link is not None:
            messages += link.due()
        return dead, messages

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
                # A rank's process can be seen gone a moment before ZeroMQ hands over what it
                # sent just before it went. Its connection closes after the last of its bytes are
                # read (a stream is in order), and the socket monitor says so: until then, at most
                # LAST_WORDS_S, read on, so that a rank that answered and then died has answered.
                def settled() -> bool:
                    return all(r in got or (r in self.members and self.members[r].fd is None)
                               or r not in self.members for r in missing)
                until = time.monotonic() + (LAST_WORDS_S if self.gate.monitor is not None else 0.02)
                while True:
                    done = settled()
                    _, messages = self.wait(time.monotonic() if done
                                            else min(until, time.monotonic() + 0.005))
                    self._take_all(messages, flight)
                    if done or time.monotonic() >= until:
                        break
            for rank in missing:
                if rank not in got:
                    raise self.lost(rank, step, "died", f"died before answering step {step}", flight=flight)
            if len(got) < self.world_size and time.monotonic() >= deadline:
                silent = sorted(set(range(self.world_size)) - set(got))
                front = self.recorder.wavefront(range(self.world_size), set(silent),
                                                [flight, *self.in_flight.values()])
                err = self.lost(silent[0], step, "timeout",
                                f"gave no answer to step {step} within {self.step_timeout:g} s",
                                also=silent[1:], flight=flight)
                err.wavefront = front
                raise err

    def _take_all(self, messages, flight: Flight) -> None:
        """Each message, taken while `flight` is awaited. On a failure, the members' replies that
        came in the same batch are dropped, counted and logged: what else came is not lost."""
        for i, (frames, meta) in enumerate(messages):
            try:
                self.take(frames, meta, flight)
            except RankLost:
                for rest, _meta in messages[i + 1:]:
                    rank = self.rank_of.get(rest[0])
                    if rank is None:
                        continue
                    rest, _ = without_timing(rest, self.timing)
                    try:
                        header = wire.decode_header(rest[1]) if len(rest) == 3 else None
                    except wire.WireError:
                        header = None
                    if header is None and self.oneshots is not None:
                        self.oneshots.owed(rank)      # the garbled reply it announced, if any: read
                    if header is not None and header.rank == rank:
                        self.drop(rank, header, "(after the step failed)", body=rest[2])
                raise

    def take(self, frames, meta, flight: Flight) -> None:
        """One message, while `flight`'s replies are awaited: a reply to it, to a plan sent after
        it (kept in that plan's flight), or one to drop, count and note."""
        rank = self.rank_of.get(frames[0])
        if rank is None:
            return self.stranger(frames, None if meta is LINK_DONE else meta)
        expect, step = flight.expect, flight.step
        came, timing = frames, None
        try:
            frames, extra = without_timing(frames, self.timing)
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
            oneshots = self.oneshots
            if oneshots is not None and oneshots.drop_announced_garble(rank, frames, str(e), self.epoch):
                return
            said = oneshots.owed(rank) if oneshots is not None else None
            if said is not None and said[1] != step and said[1] in self.in_flight:
                ahead = self.in_flight[said[1]]
            else:
                ahead = _ahead_of(self.in_flight, flight, rank)
            answers = ahead.step if ahead is not None else step
            self.recorder.broken(rank, self.epoch, answers, expect, sum(map(len, frames[1:])), str(e))
            if ahead is not None:
                ahead.broken = ahead.broken or (rank, str(e))
                return
            raise self.lost(rank, step, "protocol", f"broke the protocol: {e}", flight=flight) from None
        if header.rank != rank:
            if header.epoch < self.epoch:         # sent under its rank before the world was resized
                return self.drop(rank, header, body=frames[2])
            raise self.lost(rank, step, "protocol",
                            f"broke the protocol: its message names rank {header.rank}", flight=flight)
        copied = None                   # "duplicated": the link delivered this message twice
        if self.link is not None and meta is not LINK_DONE:
            copied = self.link.received(rank, header, came, frames[2], self.epoch)
            if copied == "duplicated":
                self.take(came, LINK_DONE, flight)      # the copy comes first, then the message
            elif copied is not None:
                return                                  # lost, or held: the link said so
        current = header.type is expect and header.epoch == self.epoch and header.step == step
        into = flight
        if rank in flight.got or not current:
            into = self.in_flight.get(header.step) if header.type is MsgType.RESULT \
                and header.epoch == self.epoch else None
            if into is None or into is flight or rank in into.got:
                return self.drop(rank, header, body=frames[2], link=copied)
        into.got[rank] = (header, frames[2])     # a plan sent ahead: kept for its turn
        self.recorder.taken(rank, len(frames[1]), len(frames[2]), into.record, into.sent_at[rank], timing)

    def stranger(self, frames: list[bytes], meta: Meta | None, during: str = "") -> bool:
        """A message from a connection that holds no rank. A former member (or, with CURVE, a
        worker proven to hold a rank's key, speaking from an older epoch) is told to exit; any
        other peer gets no answer. Each peer's first few are noted in full, the rest counted:
        a flood costs a counter, not memory or output. True if it was told to exit."""
        ident = frames[0]
        if ident in self.retired:
            rank, epoch, why = self.retired[ident]
            self.transport.refuse(ident, f"rank {rank} of epoch {epoch} was {why}; the run is in epoch "
                                         f"{self.epoch}: exit", self.epoch, meta.host if meta else "")
            return True
        if self.knocking is not None and len(frames) == 3 and frames[1][:3] == HELLO_HEAD:
            self.knocking.append((frames, meta))      # a member started ahead: admitted later
            return False
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
            self.transport.tell(ident, f"rank {header.rank} of epoch {header.epoch} is no member: the run "
                                       f"is in epoch {self.epoch}: exit", self.epoch)
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

    # -- sending -----------------------------------------------------------------------

    def send(self, rank: int, kind: MsgType, step: int, body: bytes, decoded, *, quiet=False,
             extra: tuple[bytes, ...] = (), found_later: bool = False, record: StepRecord | None = None
             ) -> None:
        """`found_later`: a plan sent ahead of one still awaited; a rank it cannot reach is not
        lost here but where the plan before is gathered (it died, or its connection closed),
        so that one loss is one loss, at the step it broke. Through the link's layer when the
        run has one (it logs what it sent)."""
        header = wire.encode_header(kind, self.epoch, step, rank, self.world_size)
        member = self.members.get(rank)
        flags = zmq.NOBLOCK if quiet else 0
        try:
            if self.link is not None:
                return self.link.send(rank, kind, step, self.epoch, member, header, body, decoded, extra,
                                      flags, record)
            self.transport.send([member.identity, header, body, *extra], flags)
        except (zmq.ZMQError, AttributeError):
            if quiet or found_later:
                return
            raise self.lost(rank, step, "unreachable", "cannot be reached") from None
        self.recorder.sent(rank, self.epoch, step, kind, len(header), len(body), decoded)

    # -- saying what happened ----------------------------------------------------------

    def lost(self, rank: int | None, step: int, reason: str, what: str, also=(),
             flight: Flight | None = None) -> RankLost:
        """A RankLost blamed on `rank` (and the ranks `also`; None: every rank alike), recorded
        after what did come back for `flight`, the round it broke."""
        detail = ""
        if rank is not None and reason in ("died", "unreachable"):
            detail = self.explain(rank)
            if not detail and rank in self.members and rank in self.transport.dead:
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

    def note(self, rank: int | None, text: str) -> None:
        self.recorder.note(rank, self.epoch, text)


def _void(channel: RankChannel, why: str) -> None:
    """The plans sent whose results will never be read (the epoch ends, or the run)."""
    for flight in channel.in_flight.values():
        channel.recorder.voided(channel.epoch, flight, why)
    channel.in_flight.clear()


def _ahead_of(in_flight: dict[int, Flight], flight: Flight, rank: int) -> Flight | None:
    """The plan sent after `flight` that `rank`'s next reply answers, if it has answered
    `flight` already (None: that reply answers `flight`)."""
    if rank not in flight.got or flight.expect is not MsgType.RESULT:
        return None
    later = [f for s, f in in_flight.items() if s > flight.step and rank not in f.got]
    return min(later, key=lambda f: f.step) if later else None


def _decode(kind: MsgType, body: bytes, flight: Flight):
    """A reply's body read as `kind` (a RESULT against its plan's bytes); WireError if it is not."""
    if kind is MsgType.RESULT and flight.against is not None:
        return wire.decode_result(body, flight.against)
    return wire.decode_body(kind, body)


def without_timing(frames: list[bytes], timing: bool) -> tuple[list[bytes], bytes | None]:
    """A member's message and, apart, the frame of its own times a result carries when we
    asked for them (`timing`: a timeline, a wire log): never part of the bytes that must agree."""
    if len(frames) == 4 and timing:
        return frames[:3], frames[3]
    return frames, None


def who_of(rank: int | None, also=()) -> str:
    """Who a loss is blamed on, in words."""
    if rank is None:
        return "every rank"
    return f"rank {rank}" if not also else "ranks " + ", ".join(map(str, (rank, *also)))


def lost_verdict(err: RankLost) -> str:
    """An attempt's verdict when a rank was lost."""
    rank, *also = err.ranks if err.rank is not None else (None,)
    return f"{who_of(rank, also)} lost ({err.reason})"
