"""A scheduler that follows a script: a raw ZeroMQ ROUTER on a private unix socket, for what the
real scheduler never does (a refusal out of the blue, a CONFIG for another rank, a plan sent
twice, a stale one, garbage, a frame past the cap). It starts instances of the worker command
under test exactly as the real scheduler does (launcher/command.py) and speaks the wire of
protocol/wire.py frame by frame; every frame both ways is written to a wire log, one JSON line
each, for whoever reads a failure.
"""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import NamedTuple

import zmq

from inferris_dist.launcher import CommandProcess, command_argv, spawn_command, stop_workers
from inferris_dist.launcher.rundir import local_endpoint
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType

live: "set[Scripted]" = set()     # the scripted schedulers running now (a Ctrl-C kills their workers)


class Message(NamedTuple):
    """One message from a worker: who sent it, its header, its frames after the header."""
    ident: bytes
    header: wire.Header | None       # None: the header did not decode
    frames: list[bytes]


class ScriptError(Exception):
    """The worker did not do what the script needs to go on (one line why)."""


class Scripted:
    """The scripted scheduler: a ROUTER bound in `run_dir`, the worker command's instances it
    started, and its wire log. A context manager: every instance is stopped on the way out."""

    def __init__(self, run_dir: Path, command: str, world_size: int):
        self.run_dir = run_dir
        self.command = command
        self.world_size = world_size
        self.secret = secrets.token_bytes(32)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDTIMEO, 5000)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)   # a worker under test sends no more
        self.address = local_endpoint(run_dir)
        self.sock.bind(self.address)
        self.procs: list[CommandProcess] = []
        self.log_path = run_dir / "wire.jsonl"
        self._log = open(self.log_path, "w")
        self._t0 = time.monotonic()
        live.add(self)

    def __enter__(self) -> "Scripted":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        live.discard(self)
        stop_workers(self.procs, grace=0.0, term_wait=0.5)
        self.sock.close(linger=0)
        self._log.close()

    # -- processes ------------------------------------------------------------------------------

    def start(self, rank: int, secret: bytes | None = None) -> CommandProcess:
        """One instance of the worker command for `rank`, given `secret` (default the run's)."""
        argv = command_argv(self.command, self.address, rank, self.world_size)
        n = len(self.procs)
        proc = spawn_command(argv, rank, self.secret if secret is None else secret,
                             self.run_dir / f"worker-{n}.rank{rank}.log")
        self.procs.append(proc)
        self.note("started", rank=rank, pid=proc.pid, argv=argv)
        return proc

    # -- the wire -------------------------------------------------------------------------------

    def note(self, event: str, **fields) -> None:
        fields = {"t": round(time.monotonic() - self._t0, 4), "event": event, **fields}
        self._log.write(json.dumps(fields, default=repr) + "\n")
        self._log.flush()

    def send(self, ident: bytes, kind: MsgType, body: bytes, *, epoch: int = 1, step: int = 0,
             rank: int = 0, world_size: int | None = None, version: int = wire.PROTOCOL_VERSION) -> None:
        """One message as the scheduler sends it; any header field may be set wrong on purpose."""
        header = wire.encode_header(kind, epoch, step, rank, world_size or self.world_size)
        if version != wire.PROTOCOL_VERSION:
            import msgpack
            header = msgpack.packb([version, int(kind), epoch, step, rank, world_size or self.world_size])
        self.send_frames(ident, [header, body], kind=kind.name, epoch=epoch, step=step, rank=rank)

    def send_frames(self, ident: bytes, frames: list[bytes], **what) -> None:
        self.note("sent", bytes=[len(f) for f in frames], **what)
        try:
            self.sock.send_multipart([ident, *frames], copy=len(frames[-1]) < (1 << 20))
        except zmq.ZMQError as e:                       # the peer is gone: nothing to send to
            self.note("unsent", error=str(e))

    def recv(self, timeout: float) -> Message | None:
        """The next message within `timeout` seconds, or None."""
        if not self.sock.poll(max(0, int(timeout * 1000))):
            return None
        ident, *frames = self.sock.recv_multipart()
        try:
            header = wire.decode_header(frames[0]) if frames else None
        except wire.WireError:
            header = None
        said = {"kind": header.type.name, "epoch": header.epoch, "step": header.step,
                "rank": header.rank} if header else {"kind": "?"}
        self.note("received", **said, bytes=[len(f) for f in frames])
        return Message(ident, header, frames)

    def expect(self, kind: MsgType, timeout: float, what: str) -> Message:
        """The next message, which must be of `kind` (a repeated HELLO is skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.recv(deadline - time.monotonic())
            if got is None:
                raise ScriptError(f"no {kind.name} within {timeout:g} s {what}")
            if got.header is None:
                raise ScriptError(f"a message that does not decode {what}")
            if got.header.type is MsgType.HELLO and kind is not MsgType.HELLO:
                continue
            if got.header.type is not kind:
                raise ScriptError(f"{got.header.type.name} where {kind.name} was due {what}")
            return got

    def hello(self, proc: CommandProcess, timeout: float) -> tuple[Message, wire.Hello]:
        """The worker's HELLO, checked: its header and its proof of the secret it was given."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            got = self.recv(max(0.0, min(left, 0.05)))
            if got is None:
                if not proc.alive():
                    raise ScriptError(f"the worker {proc.exit_description()} before its HELLO"
                                      + _words(proc))
                if left <= 0:
                    raise NeverConnected(f"the worker sent no HELLO within {timeout:g} s" + _words(proc))
                continue
            if got.header is None or got.header.type is not MsgType.HELLO or len(got.frames) != 2:
                raise ScriptError("its first message is not a HELLO of two frames")
            return got, wire.decode_body(MsgType.HELLO, got.frames[1])

    def admit(self, proc: CommandProcess, rank: int, config: wire.Config, timeout: float,
              epoch: int = 1) -> bytes:
        """HELLO (checked), CONFIG, READY: the worker's identity on the socket."""
        got, hello = self.hello(proc, timeout)
        h = got.header
        if (h.rank, h.world_size) != (rank, self.world_size):
            raise ScriptError(f"its HELLO claims rank {h.rank} of {h.world_size}, "
                              f"it was started as rank {rank} of {self.world_size}")
        if not wire.check_proof(self.secret, h, hello):
            raise ScriptError("its HELLO does not prove the run secret it was given on stdin")
        self.send(got.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config), epoch=epoch, rank=rank)
        self.expect(MsgType.READY, timeout, "after CONFIG")
        return got.ident

    def quiet(self, seconds: float) -> list[Message]:
        """Everything the workers send within `seconds` (repeated HELLOs left out)."""
        out = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            got = self.recv(left)
            if got is not None and not (got.header is not None and got.header.type is MsgType.HELLO):
                out.append(got)
        return out


class NeverConnected(ScriptError):
    """The worker never said HELLO: every case that needs it fails with the same line."""


def _words(proc: CommandProcess) -> str:
    words = proc.last_words()
    return f" (its last words: {words})" if words else ""
