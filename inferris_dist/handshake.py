"""Admitting workers into a ProcessGroup: spawn, HELLO, CONFIG, READY.

A peer is admitted only if it names this run's world size and a rank being
started now, proves it holds the run secret (HMAC over rank, world size and
pid) and is the very process we spawned for that rank. Until then it may say
HELLO only, in a few bytes; anything else gets REFUSED with the reason, which
is also noted in the wire log. An admitted rank is configured with the page
geometry, the accept scripts, the shard to start from and its unspent faults.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Sequence

import zmq

from launcher import spawn_workers

from . import wire
from .wire import MsgType

if TYPE_CHECKING:
    from .group import ProcessGroup


def worker_argv(group: "ProcessGroup", rank: int) -> list[str]:
    argv = [sys.executable, "-m", "inferris_dist.worker", "--rank", str(rank),
            "--world-size", str(group.world_size), "--connect", group.address,
            "--parent-pid", str(os.getpid())]
    if threading.current_thread() is threading.main_thread():
        argv.append("--death-signal")     # tied to the spawning thread: only the main one lasts
    return argv


def admit_ranks(group: "ProcessGroup", ranks: Sequence[int], shard: list, step: int) -> None:
    """Spawn workers for `ranks` and wait until each is configured and ready (or raise RankLost)."""
    started = spawn_workers(lambda rank: worker_argv(group, rank), group.world_size,
                            group.secret, ranks, group.log_dir)
    for w in started:
        group.adopt(w)
    Admission(group, set(ranks), shard, step).run()


class Admission:
    def __init__(self, group: "ProcessGroup", ranks: set[int], shard: list, step: int):
        self.group = group
        self.ranks = ranks
        self.shard = shard
        self.step = step                  # the step the run is at (-1 before the first)
        self.configured: set[int] = set()
        self.ready: set[int] = set()

    def run(self) -> None:
        group = self.group
        deadline = time.monotonic() + group.start_timeout
        while len(self.ready) < len(self.ranks):
            dead, messages = group.wait(deadline)
            for frames in messages:
                self.take(frames)
            for rank in dead:
                if rank in self.ranks:
                    raise group.lost(rank, self.step, "died", "died during start-up")
            if time.monotonic() >= deadline and len(self.ready) < len(self.ranks):
                missing = sorted(self.ranks - self.ready)
                raise group.lost(missing[0], self.step, "timeout",
                                 f"did not finish the handshake within {group.start_timeout:g} s",
                                 also=missing[1:])

    def take(self, frames: list[bytes]) -> None:
        group = self.group
        ident = frames[0]
        known = group.rank_of.get(ident) in self.configured
        try:
            if len(frames) != 3:
                raise wire.WireError(f"{len(frames) - 1} frames")
            header = wire.decode_header(frames[1])
            if not known and header.type is not MsgType.HELLO:
                if ident in group.rank_of:      # a rank of the running group, answering late
                    return group.drop(group.rank_of[ident], header, "while starting ranks")
                raise wire.WireError(f"{header.type.name} before HELLO")
            if header.type is MsgType.HELLO and len(frames[2]) > wire.MAX_HELLO_BYTES:
                raise wire.WireError(f"a HELLO of {len(frames[2])} bytes")
            body = wire.decode_body(header.type, frames[2])
        except wire.WireError as e:
            return self.refuse(ident, f"malformed message during the handshake: {e}")
        if header.type is MsgType.HELLO:
            self.hello(ident, header, body, len(frames[2]))
        elif header.type is MsgType.READY:
            rank = group.rank_of[ident]
            self.ready.add(rank)
            group.log_message("in", rank, header.type, header.step, len(frames[2]), ())
        else:
            self.refuse(ident, f"unexpected {header.type.name} during the handshake")

    def hello(self, ident: bytes, header: wire.Header, hello: wire.Hello, num_bytes: int) -> None:
        group, rank = self.group, header.rank
        if header.world_size != group.world_size:
            return self.refuse(ident, f"claims world size {header.world_size}, the run has {group.world_size}")
        if not 0 <= rank < group.world_size:
            return self.refuse(ident, f"claims rank {rank}, outside 0..{group.world_size - 1}")
        if rank not in self.ranks or rank in self.configured:
            return self.refuse(ident, f"claims rank {rank}, which is already taken")
        if not wire.check_proof(group.secret, header, hello):
            return self.refuse(ident, f"claims rank {rank} without proof of the run secret")
        if hello.pid != group.workers[rank].pid:
            return self.refuse(ident, f"claims rank {rank} from pid {hello.pid}, not the worker we started")
        group.bind_identity(rank, ident)
        self.configured.add(rank)
        group.log_message("in", rank, header.type, header.step, num_bytes, hello)
        faults = [f.text for f in group.faults
                  if f.applies_to(rank) and (f.repeat or f.step > self.step)]   # one-shots fire once
        config = wire.Config(group.num_pages, group.page_size, group.accept_scripts, self.shard, faults)
        group.send(rank, MsgType.CONFIG, max(self.step, 0), wire.encode_body(MsgType.CONFIG, config), config)

    def refuse(self, ident: bytes, reason: str) -> None:
        group = self.group
        group.note(None, f"refused a peer: {reason}")
        try:
            group.sock.send_multipart(
                [ident, wire.encode_header(MsgType.REFUSED, group.epoch, 0, -1, group.world_size),
                 wire.encode_body(MsgType.REFUSED, (reason,))], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
