"""Admission: checking members in with HELLO, CONFIG, READY.

A peer is admitted only if it names this run's world size and a rank being
admitted now, and passes the check of whoever is getting the members: a
worker we spawned proves the run secret (HMAC over rank, world size and pid)
and is the very process started for that rank; a worker someone else started
holds that rank's CURVE key (the gate named its connection `rank-R`). Until
then it may say HELLO only, in a few bytes; anything else gets REFUSED with
the reason, which is also noted in the wire log. An admitted rank is
configured with the page geometry, the accept scripts, the shard to start
from and its unspent faults, then says READY.

Admission needs only the channel, the ranks it waits for, the check, and
the configuration each rank gets: it knows nothing of processes.
"""
from __future__ import annotations

import time
from typing import Callable, Collection, Protocol

from inferris_dist.engine import RankLost
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.channel import LINK_DONE, Member, Meta, RankChannel, without_timing


class Vetting(Protocol):
    """Whoever gets the members: says whether a HELLO for a rank is the member it expects."""
    proof: str
    replaceable: bool

    def vet(self, rank: int, header: wire.Header, hello: wire.Hello, meta: Meta) -> str | None: ...


class Admission:
    def __init__(self, channel: RankChannel, ranks: Collection[int], vetting: Vetting,
                 configure: Callable[[int], wire.Config], step: int, timeout: float,
                 never_came: str, also_lost: Callable[[int], None] | None = None,
                 early: Collection = ()):
        self.channel = channel
        self.ranks = set(ranks)
        self.vetting = vetting
        self.configure = configure
        self.step = step                  # the step the run is at (-1 before the first)
        self.timeout = timeout
        self.never_came = never_came      # e.g. "did not finish the handshake within 20 s"
        self.configured: set[int] = set()
        self.ready: set[int] = set()
        self.waiting: set[int] = set()    # ranks whose early replacement knocked (noted once)
        self.refused: list[str] = []      # the first few peers refused, and why
        self.num_refused = 0
        # a member outside `ranks` lost while we wait: replaced within the same window
        self.also_lost = also_lost
        self.early = early                # messages read before (HELLOs of members started ahead)

    def run(self) -> None:
        """Wait until every rank is configured and ready, or raise RankLost."""
        channel = self.channel
        deadline = time.monotonic() + self.timeout
        for frames, meta in self.early:
            self.take(frames, meta)
        while len(self.ready) < len(self.ranks):
            dead, messages = channel.wait(deadline)
            for frames, meta in messages:
                self.take(frames, meta)
            for rank in dead:
                if rank in self.ranks and rank not in self.ready and self.vetting.replaceable:
                    self.forget(rank, "its connection closed before READY")
                elif rank in self.ranks:
                    raise channel.lost(rank, self.step, "died", "died during start-up")
                elif self.also_lost is not None and rank in channel.members:
                    self.also_lost(rank)            # a second loss, seen at once: one window for all
                    self.ranks.add(rank)
            if time.monotonic() >= deadline and len(self.ready) < len(self.ranks):
                missing = sorted(self.ranks - self.ready)
                why = self.never_came
                if self.refused:
                    why += ("; meanwhile refused: " + "; ".join(self.refused)
                            + (f" (and {self.num_refused - len(self.refused)} more)"
                               if self.num_refused > len(self.refused) else ""))
                raise channel.lost(missing[0], self.step, "timeout", why, also=missing[1:])

    def take(self, frames: list[bytes], meta: Meta | None) -> None:
        channel = self.channel
        if meta is LINK_DONE:       # a receipt the link held and hands over now: no transport facts
            meta = None
        ident = frames[0]
        rank = channel.rank_of.get(ident)
        known = rank in self.configured
        if rank is not None or ident in channel.retired:
            frames, _ = without_timing(frames, channel.timing)   # a late result's times: dropped with it
        try:
            if len(frames) != 3:
                raise wire.WireError(f"{len(frames) - 1} frames")
            header = wire.decode_header(frames[1])
            if rank is not None and header.type is MsgType.HELLO:
                return          # a member saying HELLO again (a worker repeats it until CONFIG)
            if not known and header.type is not MsgType.HELLO:
                if rank is not None:              # a rank of the running group, answering late
                    return channel.drop(rank, header, "while starting ranks", frames[2])
                if ident in channel.retired or channel.curve:
                    if channel.stranger(frames, meta, "while starting ranks"):
                        return
                raise wire.WireError(f"{header.type.name} before HELLO")
            if header.type is MsgType.HELLO and len(frames[2]) > wire.MAX_HELLO_BYTES:
                raise wire.WireError(f"a HELLO of {len(frames[2])} bytes")
            body = wire.decode_body(header.type, frames[2])
        except wire.WireError as e:
            if (rank is not None and not known and channel.oneshots is not None
                    and channel.oneshots.drop_announced_garble(rank, frames, str(e), channel.epoch)):
                return                                    # a kept member's reply to a plan
            return self.refuse(ident, meta, f"malformed message during the handshake: {e}")
        if header.type is MsgType.HELLO:
            self.hello(ident, header, body, meta or Meta("", "", None), len(frames[2]))
        elif header.type is MsgType.READY:
            self.ready.add(rank)
            channel.recorder.received(rank, channel.epoch, header.step, header.type, len(frames[2]), ())
        else:
            self.refuse(ident, meta, f"unexpected {header.type.name} during the handshake")

    def hello(self, ident: bytes, header: wire.Header, hello: wire.Hello, meta: Meta,
              num_bytes: int) -> None:
        channel, rank = self.channel, header.rank
        if ident in channel.retired:
            channel.stranger([ident], meta)
            return
        if header.world_size != channel.world_size:
            return self.refuse(ident, meta, f"claims world size {header.world_size}, "
                                            f"the run has {channel.world_size}")
        if not 0 <= rank < channel.world_size:
            return self.refuse(ident, meta, f"claims rank {rank}, outside 0..{channel.world_size - 1}")
        if rank not in self.ranks and self.vetting.replaceable and rank in channel.members:
            return self.wait_turn(rank, meta)
        if rank not in self.ranks or rank in self.configured:
            return self.refuse(ident, meta, f"claims rank {rank}, which is already taken")
        why = self.vetting.vet(rank, header, hello, meta)
        if why is not None:
            return self.refuse(ident, meta, why)
        channel.admit(Member(rank, channel.epoch, ident, self.vetting.proof, hello.pid, meta.host,
                             meta.fd, self.vetting.replaceable))
        self.configured.add(rank)
        channel.recorder.received(rank, channel.epoch, header.step, header.type, num_bytes, hello)
        config = self.configure(rank)
        try:
            channel.send(rank, MsgType.CONFIG, max(self.step, 0),
                         wire.encode_body(MsgType.CONFIG, config), config)
        except RankLost:
            if not self.vetting.replaceable:
                raise
            self.forget(rank, "its CONFIG could not be sent")

    def wait_turn(self, rank: int, meta: Meta | None) -> None:
        """A worker for a rank whose member we still hold (started early, by a launcher that
        saw its host go before we did): not refused. It repeats its HELLO until it is let in,
        which it is if that member is lost; noted once per admission."""
        if rank not in self.waiting:
            self.waiting.add(rank)
            host = meta.host if meta is not None and meta.host else "a peer"
            self.channel.note(rank, f"a worker for rank {rank} at {host} knocks while rank {rank} "
                                    f"still has a member: it waits its turn (unanswered)")

    def forget(self, rank: int, why: str) -> None:
        """A member someone else started went before READY: wait on for another (until the
        deadline) rather than fail the whole admission."""
        self.channel.retire(rank, "gone before READY")
        self.configured.discard(rank)
        self.channel.note(rank, f"rank {rank} left during its handshake ({why}); still waiting for it")

    def refuse(self, ident: bytes, meta: Meta | None, reason: str) -> None:
        host = meta.host if meta is not None else ""
        self.num_refused += 1
        if len(self.refused) < 3:          # the first few, for the diagnosis if ranks never come
            self.refused.append(f"a peer{' at ' + host if host else ''}: {reason}")
        self.channel.transport.refuse(ident, reason, self.channel.epoch, host)
