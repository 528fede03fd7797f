"""A rank worker process: `python -m inferris_dist.rank` (or `inferris-dist worker`).

Two ways to start one:

- spawned by `inferris-dist launch` on this host (`--parent-pid`): it reads
  the run secret from stdin, proves it holds it, and exits with its parent
  (parent-death signal and a pidfd on the parent);
- started by someone else (a cluster's launcher, or by hand): rank, world
  size and address from flags or the launcher's environment (rank/cli.py, protocol/placement.py),
  the CURVE keys from `--keys DIR`. It exits 0 after the run's STOP, and by
  itself (status 1, one line why) when the scheduler refuses it or the
  connection ends: closed, or silent past the transport's heartbeat
  (ZeroMQ's own PINGs every second, answered by the scheduler's I/O thread
  whatever its main thread is doing; no answer for 3 s and we leave).

Either way it takes its configuration, then answers each PLAN with its RESULT
using engine's RankExecutor on its own page shard, in lockstep, until STOP.
Injected faults (CONFIG's fault list) are acted out for real, around each step, by the
FaultPlan of protocol/faults.py.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

import zmq

from inferris_dist.engine.rank import RankExecutor
from inferris_dist.protocol import wire
from inferris_dist.protocol.faults import FaultPlan, parse_fault
from inferris_dist.protocol.limits import NO_EXEC_COST, ExecCost
from inferris_dist.protocol.monitor import monitor_event
from inferris_dist.protocol.placement import MAX_WORLD_SIZE
from inferris_dist.protocol.sockets import send_frames
from inferris_dist.protocol.wire import MsgType

if TYPE_CHECKING:
    from inferris_dist.protocol.keys import ClientKeys

PARENT_CHECK_MS = 500
ANSWERED_KEPT = 8               # plans remembered as answered, to carry out a duplicated one once
HANDSHAKE_TIMEOUT_S = 30.0      # spawned: the scheduler binds within moments (forked ahead too)
HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 1000, 3000   # started by someone else: leave within ~4 s
SPAWNED_RECONNECT_MS = 2        # a spawned worker tries its socket this often until it is there
HELLO_EVERY_S = 1.0             # a HELLO is repeated until CONFIG: one sent early is not lost
EXIT_GONE, EXIT_USAGE, EXIT_PROTOCOL = 1, 2, 3


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
    exec_cost = NO_EXEC_COST          # set by CONFIG
    def __init__(self, rank: int, world_size: int, address: str, parent_pid: int | None,
                 secret: bytes = b"", keys: ClientKeys | None = None):
        self.rank = rank
        self.world_size = world_size
        self.address = address
        self.parent_pid = parent_pid
        self.secret = secret
        self.epoch = 0
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, PARENT_CHECK_MS)
        self.sock.setsockopt(zmq.SNDTIMEO, 5000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self.keys = keys
        if keys is not None:
            keys.apply(self.sock)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.monitor = None
        self.connected = False
        if parent_pid is not None:       # forked ahead, it may come before the socket is bound
            self.sock.setsockopt(zmq.RECONNECT_IVL, SPAWNED_RECONNECT_MS)
        else:                            # nobody to watch but the connection itself
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            if address.startswith("tcp://["):
                self.sock.setsockopt(zmq.IPV6, 1)
            self.monitor = self.sock.get_monitor_socket(
                zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            self.monitor.setsockopt(zmq.LINGER, 0)
            self.poller.register(self.monitor, zmq.POLLIN)
        try:
            self.sock.connect(address)
        except zmq.ZMQError as e:
            fail(f"inferris-dist worker: cannot connect to {address}: {e}", EXIT_USAGE)
        self.parent_fd = None
        if parent_pid is not None and hasattr(os, "pidfd_open"):
            try:
                self.parent_fd = os.pidfd_open(parent_pid)
                self.poller.register(self.parent_fd, zmq.POLLIN)
            except OSError:
                self.parent_fd = None
        self.configured = False
        self.answered: deque = deque(maxlen=ANSWERED_KEPT)   # (epoch, step) of the plans last answered
        self.timing = False               # the scheduler asked for our own times (a timeline)
        self.times = (0.0, 0.0)           # the last message: received, decoded
        self.executor: RankExecutor | None = None
        self.faults = FaultPlan([])
        self.exec_cost = NO_EXEC_COST

    def send(self, kind: MsgType, step: int, body_bytes: bytes) -> None:
        send_frames(self.sock, (wire.encode_header(kind, self.epoch, step, self.rank, self.world_size),
                                body_bytes))

    def recv(self, timeout_s: float | None = None) -> tuple[wire.Header, object] | None:
        """The next message, or None when the wait ran out; exits if the scheduler is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            events = dict(self.poller.poll(PARENT_CHECK_MS))
            self.check_scheduler(events)
            if self.sock in events:
                frames = self.sock.recv_multipart()
                received = time.monotonic()
                self.timing = len(frames) == 3 and frames[2] == wire.TIMING_PLEASE
                if len(frames) != 2 and not self.timing:
                    fail(f"rank {self.rank}: a message of {len(frames)} frames from the scheduler")
                try:
                    header = wire.decode_header(frames[0])
                    if header.type is MsgType.PLAN:       # as columns: the items are never built
                        body = wire.decode_plan_columns(frames[1])
                    else:
                        body = wire.decode_body(header.type, frames[1])
                except wire.WireError as e:
                    fail(f"rank {self.rank}: bad message from the scheduler: {e}")
                self.times = (received, time.monotonic())
                if header.type is MsgType.REFUSED:
                    leave(f"rank {self.rank}: refused by the scheduler: {body}")
                return header, body
            if deadline is not None and time.monotonic() > deadline:
                return None

    def check_scheduler(self, events: dict) -> None:
        """Leave if the scheduler is gone: parent exited (spawned), or the connection failed its
        handshake, closed, or went unanswered past the heartbeat (started by someone else)."""
        if self.parent_pid is not None:
            if (self.parent_fd is not None and self.parent_fd in events) or os.getppid() != self.parent_pid:
                os._exit(0)
            return
        if self.monitor in events:
            while True:
                try:
                    kind, value = monitor_event(self.monitor.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    leave(f"rank {self.rank}: the scheduler at {self.address} refused this worker's "
                          f"key (it is none of the run's rank keys)")
                if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    leave(f"rank {self.rank}: no handshake with the scheduler at {self.address} "
                          f"({_mismatch(value)})")
                if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    hint = ("is scheduler.key in --keys the key of this scheduler?" if self.keys
                            else "the scheduler probably uses CURVE: pass the run's --keys DIR")
                    leave(f"rank {self.rank}: the scheduler at {self.address} closed the connection "
                          f"during the handshake ({os.strerror(value)}); {hint}")
                if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.connected = True
                if kind == zmq.EVENT_DISCONNECTED and (self.configured or self.connected):
                    self.last_words_of_scheduler()
                    leave(f"rank {self.rank}: lost the connection to the scheduler at {self.address} "
                          f"(closed, or no answer for {(HEARTBEAT_MS + HEARTBEAT_TIMEOUT_MS) / 1000:g} s)")

    def last_words_of_scheduler(self) -> None:
        """The connection is gone; what the scheduler said before it went still counts: a
        refusal or a STOP already received is acted on, not lost with the connection."""
        while self.sock.poll(0):
            frames = self.sock.recv_multipart()
            try:
                header = wire.decode_header(frames[0])
                body = wire.decode_body(header.type, frames[1]) if len(frames) == 2 else None
            except (wire.WireError, IndexError):
                continue
            if header.type is MsgType.REFUSED:
                leave(f"rank {self.rank}: refused by the scheduler: {body}")
            if header.type is MsgType.STOP:
                os._exit(0)

    def handshake(self, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        pid = os.getpid()
        proof = wire.proof_of_secret(self.secret, self.rank, self.world_size, pid) if self.secret else b""
        hello = wire.encode_body(MsgType.HELLO, wire.Hello(pid, proof))
        deadline = time.monotonic() + timeout_s
        got = None
        while got is None:
            left = deadline - time.monotonic()
            if left <= 0:
                leave(f"rank {self.rank}: no configuration from the scheduler at {self.address} "
                      f"within {timeout_s:g} s")
            self.send(MsgType.HELLO, 0, hello)
            got = self.recv(min(left, HELLO_EVERY_S) if self.parent_pid is None else left)
        header, body = got
        if header.type is not MsgType.CONFIG:
            fail(f"rank {self.rank}: expected CONFIG, got {header.type.name}")
        if (header.rank, header.world_size) != (self.rank, self.world_size):
            fail(f"rank {self.rank} of {self.world_size}: a CONFIG for rank {header.rank} of "
                 f"{header.world_size}")
        self.configure(header, body)

    def configure(self, header: wire.Header, body: wire.Config) -> None:
        """CONFIG applied (protocol §6.5), at the handshake or again between steps (§8.6: a new
        run on this member): the header's epoch, rank and world size are taken as its own, and
        everything of a run before is replaced (the shard, the scripts, the faults, the model's
        time, the plans answered); READY."""
        self.epoch = header.epoch
        self.rank, self.world_size = placed(header)
        self.num_pages = body.num_pages
        self.executor = RankExecutor(self.rank, self.world_size, body.num_pages, body.page_size,
                                     body.accept_scripts)
        if body.shard:
            self.executor.shard.load(body.shard)
        self.faults = FaultPlan([parse_fault(f) for f in body.faults])
        self.exec_cost = ExecCost(*body.exec_cost)
        self.answered.clear()
        self.configured = True
        self.send(MsgType.READY, 0, wire.encode_body(MsgType.READY, ()))

    def serve(self) -> None:
        answered = self.answered
        while True:
            header, body = self.recv()
            self.epoch = header.epoch      # the scheduler's epoch moves when the group restarts
            if header.type is MsgType.PLAN:
                if (header.epoch, header.step) in answered:
                    continue               # a plan the link delivered twice: carried out once
                answered.append((header.epoch, header.step))
                try:
                    self.answer(body)
                except Exception as e:   # a plan this rank cannot carry out: its last words say why
                    fail(f"rank {self.rank}: cannot execute step {body.step}: {type(e).__name__}: {e}")
            elif header.type is MsgType.AUDIT:
                self.send(MsgType.SHARD, header.step,
                          wire.encode_body(MsgType.SHARD, self.executor.shard.snapshot()))
            elif header.type is MsgType.RESIZE:
                self.resize(header, body)
            elif header.type is MsgType.CONFIG:
                self.configure(header, body)
            elif header.type is MsgType.STOP:
                return
            else:
                fail(f"rank {self.rank}: unexpected {header.type.name} from the scheduler")

    def resize(self, header: wire.Header, body: wire.Resize) -> None:
        """The world changed size (protocol §8.5): this member is rank `header.rank` of
        `header.world_size` from now on, holds the shard it is given (the pages placed again
        for the new world) and the faults meant for its new rank, and says READY."""
        self.rank, self.world_size = placed(header)
        executor = self.executor
        executor.rank, executor.world_size = header.rank, header.world_size
        executor.shard.load(body.shard)
        self.faults = FaultPlan([parse_fault(f) for f in body.faults])
        self.send(MsgType.READY, 0, wire.encode_body(MsgType.READY, ()))

    def answer(self, plan: wire.PlanColumns) -> None:
        """Verdicts, reply, then write the shard: the writes are off the scheduler's wait (the
        shard is exact again before the next message is read, audit and snapshot included).
        The plan stays columns: its page ids checked in range at once, the verdicts computed
        from its columns, the RESULT built from its bytes. A step a fault acts on goes the
        general way, through items and outcomes, so the faults can act around it."""
        firing = self.faults.firing(plan.step)
        if firing:
            once = tuple(f.text for f in firing.values() if not f.repeat)
            if once:           # said first: a fault that kills the rank must not fire again elsewhere
                self.send(MsgType.FIRED, plan.step, wire.encode_body(MsgType.FIRED, once))
            self.faults.before(firing, self)
        pages = plan.pages
        if pages and max(pages) >= self.num_pages:
            raise ValueError(f"page {max(pages)} is outside the shard's {self.num_pages} pages")
        ids, cols = plan.request_ids, plan.cols
        n = len(ids)
        if firing:
            return self.answer_with_faults(firing, wire.plan_of(plan))
        executor = self.executor
        counts, indexes = cols[n:2 * n], cols[4 * n:5 * n]
        accepted = executor.accepted(ids, counts, cols[3 * n:4 * n], indexes)
        starts, num_pages = cols[:n], cols[5 * n:6 * n]
        if n and max(cols[6 * n:]):        # items planned ahead (overlap): placed by earlier verdicts
            starts, num_pages, pages = executor.place_columns(ids, starts, counts, indexes, num_pages,
                                                              cols[6 * n:], pages)
            body = wire.encode_result_columns(ids, starts, counts, accepted, num_pages, pages)
        else:
            body = wire.encode_result_of(plan, accepted)
        frames = self.result_frames(plan.step, body, counts)
        send_frames(self.sock, frames)
        self.faults.previous = frames
        executor.apply_columns(ids, starts, counts, num_pages, pages)

    def answer_with_faults(self, firing: dict, plan) -> None:
        """The general way, through items and outcomes, so that the faults can act around it."""
        outcomes = self.faults.outcomes(firing, self.executor.verdicts(plan).outcomes, self.num_pages)
        frames = self.result_frames(plan.step, wire.encode_body(MsgType.RESULT, outcomes),
                                    [item.num_tokens for item in plan.items], firing)
        for message in self.faults.sends(firing, self.faults.frames(firing, frames)):
            send_frames(self.sock, message)
        self.faults.after_reply(firing, self)
        self.executor.apply(plan)
        self.faults.after_apply(firing, outcomes, self.executor.shard)

    def result_frames(self, step: int, body: bytes, token_counts, firing: dict | None = None) -> list[bytes]:
        """A RESULT's frames, once the model's time (if any, as the time faults make it) is
        over; with our own times when the scheduler asked for them."""
        if self.exec_cost or firing:
            seconds = self.exec_cost.seconds(sum(token_counts))
            self.model_time(self.faults.model_time(firing, step, seconds) if firing else seconds)
        executed = time.monotonic()
        frames = [wire.encode_header(MsgType.RESULT, self.epoch, step, self.rank, self.world_size), body]
        if self.timing:
            frames.append(wire.encode_timing((*self.times, executed, time.monotonic())))
        return frames

    def model_time(self, took: float) -> None:
        """--exec-cost: the step takes as long as a model would take (`took` seconds), from the
        plan's arrival, waited out without spinning (the core is free for the scheduler and the
        other ranks, as with a GPU busy): the rank's own decoding and verdicts run inside that
        time, as a kernel's launch does."""
        seconds = self.times[0] + took - time.monotonic()
        if seconds <= 0:
            return
        if seconds < PARENT_CHECK_MS / 1000:
            time.sleep(seconds)
        else:
            self.sleep(seconds)

    def hang(self) -> None:
        """Stop answering for good: busy, holding the GIL, deaf to plans. Still leaves when the
        scheduler is gone or tells it to (a member someone else started must not linger)."""
        if self.parent_pid is not None:
            while os.getppid() == self.parent_pid:
                pass
            os._exit(0)
        next_look = 0.0
        while True:
            now = time.monotonic()
            if now >= next_look:             # a glance every 50 ms, between spins
                next_look = now + 0.05
                self.glance()

    def glance(self) -> None:
        """Without reading plans: leave if refused, stopped, or the scheduler is gone."""
        self.check_scheduler(dict(self.poller.poll(0)))
        self.last_words_of_scheduler()

    def sleep(self, seconds: float) -> None:
        """Answer `seconds` late, leaving at once if the scheduler is gone."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.parent_pid is not None:
                watch = zmq.Poller()
                if self.parent_fd is not None:
                    watch.register(self.parent_fd, zmq.POLLIN)
                events = dict(watch.poll(int(min(left, PARENT_CHECK_MS / 1000) * 1000) + 1))
                self.check_scheduler(events)
            else:
                watch = zmq.Poller()
                watch.register(self.monitor, zmq.POLLIN)
                self.check_scheduler(dict(watch.poll(int(min(left, 0.5) * 1000) + 1)))

    def flush(self, timeout_s: float = 2.0) -> None:
        """Let what was sent leave the process (ZeroMQ's I/O thread sends it; closing the
        socket with a linger and ending the context waits, bounded, until it has)."""
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        self.sock.close(linger=int(timeout_s * 1000))
        self.ctx.term()

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
        self.sock.close(linger=0)
        if self.parent_fd is not None:
            os.close(self.parent_fd)


def _mismatch(code: int) -> str:
    if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "one side uses CURVE keys and the other does not: pass the run's --keys DIR"
    return f"ZMTP protocol error {int(code):#x}"


def placed(header: wire.Header) -> tuple[int, int]:
    """The rank and world size a CONFIG or RESIZE header gives a member; a place outside any
    world (a world size outside 1..MAX_WORLD_SIZE, a rank outside it) is malformed: exit 3."""
    if not (1 <= header.world_size <= MAX_WORLD_SIZE and 0 <= header.rank < header.world_size):
        fail(f"a {header.type.name} for rank {header.rank} of {header.world_size}: no such place")
    return header.rank, header.world_size


def fail(message: str, status: int = EXIT_PROTOCOL) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(status)


def leave(message: str) -> None:
    """The scheduler is gone, silent, or does not want us: one line, status 1."""
    fail(message, EXIT_GONE)


