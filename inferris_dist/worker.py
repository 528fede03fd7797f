"""A rank worker process: `python -m inferris_dist.worker` (or `inferris-dist worker`).

It reads the run secret from stdin, connects to the scheduler, proves it holds
the secret, takes its configuration, then answers each PLAN with its RESULT
using engine's RankExecutor on its own page shard, in lockstep, until STOP.
It exits by itself within about a second if the scheduler goes away.
Injected faults (CONFIG's fault list) are acted out here, for real.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import sys
import time

import zmq

from engine.messages import page_spans
from engine.rank import RankExecutor
from engine.shard import SlotStore

from . import wire
from .faults import parse_fault
from .wire import MsgType

PARENT_CHECK_MS = 500
HANDSHAKE_TIMEOUT_S = 30.0
EXIT_PROTOCOL = 3


def die_with_parent(parent_pid: int, death_signal: bool) -> None:
    """Exit when the scheduler is gone; with `death_signal`, let the kernel SIGKILL us.

    The kernel's parent-death signal follows the *thread* that spawned us, so
    the launcher asks for it only when spawning from its main thread; the
    poll loop (a pidfd on the parent) and every wait below watch the parent
    in any case.
    """
    if death_signal:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # not Linux: the parent checks still catch it
    if os.getppid() != parent_pid:
        os._exit(0)


class Worker:
    def __init__(self, rank: int, world_size: int, address: str, parent_pid: int, secret: bytes):
        self.rank = rank
        self.world_size = world_size
        self.parent_pid = parent_pid
        self.secret = secret
        self.epoch = 0
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, PARENT_CHECK_MS)
        self.sock.setsockopt(zmq.SNDTIMEO, 5000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self.sock.connect(address)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.parent_fd = None
        if hasattr(os, "pidfd_open"):
            try:
                self.parent_fd = os.pidfd_open(parent_pid)
                self.poller.register(self.parent_fd, zmq.POLLIN)
            except OSError:
                self.parent_fd = None
        self.executor: RankExecutor | None = None
        self.faults = []
        self.previous_result: list[bytes] | None = None

    def send(self, kind: MsgType, step: int, body_bytes: bytes) -> None:
        self.sock.send_multipart([wire.encode_header(kind, self.epoch, step, self.rank, self.world_size),
                                  body_bytes])

    def recv(self, timeout_s: float | None = None) -> tuple[wire.Header, object] | None:
        """The next message, or None when the wait ran out; exits if the scheduler is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            events = dict(self.poller.poll(PARENT_CHECK_MS))
            if (self.parent_fd is not None and self.parent_fd in events) or os.getppid() != self.parent_pid:
                os._exit(0)
            if self.sock in events:
                frames = self.sock.recv_multipart()
                if len(frames) != 2:
                    fail(f"rank {self.rank}: a message of {len(frames)} frames from the scheduler")
                try:
                    header = wire.decode_header(frames[0])
                    return header, wire.decode_body(header.type, frames[1])
                except wire.WireError as e:
                    fail(f"rank {self.rank}: bad message from the scheduler: {e}")
            if deadline is not None and time.monotonic() > deadline:
                return None

    def handshake(self) -> None:
        pid = os.getpid()
        hello = wire.Hello(pid, wire.proof_of_secret(self.secret, self.rank, self.world_size, pid))
        self.send(MsgType.HELLO, 0, wire.encode_body(MsgType.HELLO, hello))
        got = self.recv(HANDSHAKE_TIMEOUT_S)
        if got is None:
            fail(f"rank {self.rank}: no configuration from the scheduler")
        header, body = got
        if header.type is MsgType.REFUSED:
            fail(f"rank {self.rank}: refused by the scheduler: {body}")
        if header.type is not MsgType.CONFIG:
            fail(f"rank {self.rank}: expected CONFIG, got {header.type.name}")
        self.epoch = header.epoch
        self.num_pages = body.num_pages
        self.executor = RankExecutor(self.rank, self.world_size, body.num_pages, body.page_size,
                                     body.accept_scripts)
        if body.shard:
            self.executor.shard.load(body.shard)
        self.faults = [parse_fault(f) for f in body.faults]
        self.send(MsgType.READY, 0, wire.encode_body(MsgType.READY, ()))

    def serve(self) -> None:
        while True:
            header, body = self.recv()
            self.epoch = header.epoch      # the scheduler's epoch moves when the group restarts
            if header.type is MsgType.PLAN:
                try:
                    self.answer(body)
                except Exception as e:   # a plan this rank cannot carry out: its last words say why
                    fail(f"rank {self.rank}: cannot execute step {body.step}: {type(e).__name__}: {e}")
            elif header.type is MsgType.AUDIT:
                self.send(MsgType.SHARD, header.step,
                          wire.encode_body(MsgType.SHARD, self.executor.shard.snapshot()))
            elif header.type is MsgType.STOP:
                return
            else:
                fail(f"rank {self.rank}: unexpected {header.type.name} from the scheduler")

    def answer(self, plan) -> None:
        firing = {f.kind: f for f in self.faults if f.fires(plan.step)}
        if "crash" in firing:
            os.kill(os.getpid(), signal.SIGKILL)
        if "exit" in firing:
            os._exit(0)
        if "hang" in firing:
            while os.getppid() == self.parent_pid:   # busy, holding the GIL, deaf to the socket
                pass
            os._exit(0)
        if "delay" in firing:
            self.sleep_unless_orphaned(firing["delay"].arg)
        result = self.executor.execute(plan)
        outcomes = result.outcomes
        if "drop-write" in firing:
            _drop_last_write(self.executor.shard, outcomes)
        if "disagree" in firing and outcomes:
            outcomes = (outcomes[0]._replace(accepted=outcomes[0].accepted + 1),) + outcomes[1:]
        if "bad-writes" in firing and outcomes and outcomes[0].writes:
            first = outcomes[0]
            moved = ((first.writes[0] + 1) % self.num_pages,) + first.writes[1:]
            outcomes = (first._replace(writes=moved),) + outcomes[1:]
        frames = [wire.encode_header(MsgType.RESULT, self.epoch, plan.step, self.rank, self.world_size),
                  wire.encode_body(MsgType.RESULT, outcomes)]
        if "garble" in firing:
            frames = [b"\xc1\xc1 not a message \xc1"]
        self.sock.send_multipart(frames)
        if "duplicate" in firing:
            self.sock.send_multipart(frames)
        if "stale" in firing and self.previous_result is not None:
            self.sock.send_multipart(self.previous_result)
        self.previous_result = frames

    def sleep_unless_orphaned(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.parent_fd is not None:
                if select.select([self.parent_fd], [], [], left)[0]:
                    os._exit(0)
            else:
                time.sleep(min(left, PARENT_CHECK_MS / 1000))
            if os.getppid() != self.parent_pid:
                os._exit(0)

    def close(self) -> None:
        self.sock.close(linger=0)
        if self.parent_fd is not None:
            os.close(self.parent_fd)


def _drop_last_write(shard: SlotStore, outcomes) -> None:
    """Forget the last page-run the rank wrote (it still reports it)."""
    for outcome in reversed(outcomes):
        spans = list(page_spans(outcome.start_position, outcome.executed_tokens, outcome.writes,
                                shard.page_size))
        if spans:
            page, position, offset, length = spans[-1]
            shard.erase_run(page, outcome.request_id, position, offset, length)
            return


def fail(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(EXIT_PROTOCOL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferris-dist worker",
                                 description="a rank worker; started by `inferris-dist launch`, "
                                             "reads the run secret from stdin")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--connect", required=True, help="the scheduler's ZeroMQ address")
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--death-signal", action="store_true",
                    help="ask the kernel to kill this worker when its parent dies")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the scheduler stops us, not the terminal
    die_with_parent(args.parent_pid, args.death_signal)
    line = sys.stdin.readline().strip()
    try:
        secret = bytes.fromhex(line)
    except ValueError:
        secret = b""
    if not secret:
        fail(f"rank {args.rank}: no run secret on stdin")
    worker = Worker(args.rank, args.world_size, args.connect, args.parent_pid, secret)
    try:
        worker.handshake()
        worker.serve()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
