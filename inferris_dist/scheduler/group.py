"""ProcessGroup: the engine's executor seam on N real worker processes.

Each step the plan is encoded once and sent to every rank over the channel;
the group gathers one RESULT per rank under the step deadline (a death or a
closed connection is seen at once, not at the deadline), then joins the N
answers with engine's exact-agreement rule. `submit` returns the plan's
flight, which the engine holds until it hands it to `collect`: at `full` one
flight is out at a time; at `overlap` the next plan goes out before the one
before it is collected. Everything that happens is told to the recorder.

The group holds a channel (the socket and who is rank R on it) and a way of
getting members: workers it spawns on this host (the default), or workers
someone else starts that join at `listen` (across hosts, with CURVE keys).
Admission (handshake.py) checks either kind in; after that they are alike.
"""
from __future__ import annotations

import resource
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import NamedTuple, Sequence

from inferris_dist.engine import (
    EngineError,
    ExecutionPlan,
    ExecutionResult,
    RankExecutionResult,
    RankLost,
    Workload,
    WorkloadError,
    join,
)
from inferris_dist.engine.errors import MachineFailure, ShardDivergence
from inferris_dist.engine.group import accept_scripts
from inferris_dist.engine.shard import SlotStore, first_mismatch
from inferris_dist.launcher import Template, make_run_dir, remove_run_dir, stop_workers
from inferris_dist.observe.recorder import Recorder
from inferris_dist.observe.records import StepRecord
from inferris_dist.protocol import wire
from inferris_dist.protocol.faults import parse_faults
from inferris_dist.protocol.limits import usable_cores
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.channel import Flight, RankChannel, lost_verdict
from inferris_dist.scheduler.gate import DESCRIPTORS_PER_RANK, raise_descriptor_limit
from inferris_dist.scheduler.handshake import Admission
from inferris_dist.scheduler.members import External, Spawned
from inferris_dist.scheduler.options import LaunchOptions

LOOPBACK = "tcp://127.0.0.1"
LOCAL = "local"          # a unix socket in a private directory of ours (mode 0700), never TCP
DESCRIPTORS_BASE = 48   # ZeroMQ's context and sockets, the template, our files and standard streams


class ProcessGroup:
    def __init__(self, workload: Workload, options: LaunchOptions | None = None,
                 recorder: Recorder | None = None):
        """The group for `workload` as `options` say (world size, timeouts, faults, where the
        members come from); `recorder`: told everything that crosses and happens (default:
        one that keeps the step records and totals, and feeds `options.timeline`)."""
        options = (options or LaunchOptions()).read()
        cfg = workload.config
        self.options = options
        self.world_size = options.world_size or cfg.world_size
        if recorder is None:
            recorder = Recorder(self.world_size, None, options.timeline, shared_clock=options.listen is None)
        self.recorder = recorder
        check_fits(workload)
        self.max_frame = frame_cap(workload)
        self.num_pages, self.page_size = cfg.num_pages, cfg.page_size
        self.accept_scripts = accept_scripts(workload)
        self.faults = parse_faults(options.faults, self.world_size, workload.faults)
        self.world = options.world if options.listen is None else None   # a warm world lent to us
        transport, self.kept = self.world.take() if self.world is not None else (None, [])
        self.ended_whole = False           # told by the engine: the last audit joined
        self.given: dict = {}              # rank -> the faults its member was given (Fault)
        self.channel = RankChannel(self.world_size, options.step_timeout, recorder,
                                   spin_s=spin_seconds(options.spin_us, self.world_size), faults=self.faults,
                                   transport=transport)
        self.unfired = list(self.faults)   # faults whose step no plan has reached yet
        self.last_planned: int | None = None   # the step of the last plan sent
        self.keys = None
        if options.keys is not None:          # CURVE: a run with members from elsewhere
            from inferris_dist.protocol.keys import ServerKeys
            self.keys = ServerKeys.load(options.keys, self.world_size)
        self.secret = options.secret if options.secret is not None else secrets.token_bytes(32)
        if self.world is not None:
            self.secret = self.world.secret        # what its kept workers proved
        self.log_dir: Path | None = None
        if options.listen is None:
            self.members = None           # Spawned, made in start() with the log directory
        else:
            self.members = External(self.channel, self.keys, options.join_timeout, options.rejoin_timeout,
                                    options.on_waiting)

    # what the channel knows, as the group's own
    address = property(lambda self: self.channel.address)
    epoch = property(lambda self: self.channel.epoch)
    totals = property(lambda self: self.recorder.totals)
    last_record = property(lambda self: self.recorder.last_record)
    wire_log = property(lambda self: self.recorder.log)

    @property
    def external(self) -> bool:
        return self.options.listen is not None

    @property
    def rank_pids(self) -> dict[int, list[int]]:
        return self.members.pids if self.members is not None else {r: [] for r in range(self.world_size)}

    @property
    def pids_started(self) -> list[int]:
        return self.members.pids_started if self.members is not None else []

    @property
    def curve(self) -> bool:
        return self.channel.curve

    def joined(self) -> list[tuple[int, int, str]]:
        """(rank, pid, host) of every member now, by rank."""
        return [(r, m.pid, m.host) for r, m in sorted(self.channel.members.items())]

    def member_hosts(self) -> dict | None:
        """Per rank, the hosts its members joined from (None for workers we spawned)."""
        return self.members.hosts if self.external else None

    def still_running(self) -> list[int]:
        """Pids of workers we started that still run (none when members join from outside)."""
        return self.members.still_running() if not self.external and self.members is not None else []

    def turned_away_summary(self) -> str | None:
        return self.channel.gate.summary(self.recorder.member_drops())

    @property
    def workers(self) -> dict:
        """The worker processes we spawned, by rank (none when members join from outside)."""
        return getattr(self.members, "workers", {})

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "ProcessGroup":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        options = self.options
        self._check_descriptors(*raise_descriptor_limit())   # strangers may knock: room for them
        if options.listen is None:
            self.log_dir = (self.world.run_dir if self.world is not None else options.run_dir
                            if options.run_dir is not None else make_run_dir())
            template = options.template        # shared between runs: its starter's to close
            if template is None and self.world is not None and options.use_template \
                    and options.worker is None:
                template = self.world.template_for(options.start_timeout,
                                                   min(options.start_timeout, options.step_timeout))
            if template is None and options.use_template and options.worker is None:
                template = Template(log_dir=self.log_dir, start_timeout=options.start_timeout,
                                    answer_timeout=min(options.start_timeout, options.step_timeout))
                try:
                    template.start()
                except OSError:
                    template.close()
                    template = None            # spawn each worker fresh instead
            self.members = Spawned(self.channel, self.secret, self.log_dir, options.start_timeout,
                                   template if options.worker is None else None, options.worker)
            if self.channel.transport.sock is None:
                self.channel.open(self._local_endpoint(), None, self.max_frame)
        else:
            self.channel.open(options.listen, self.keys, self.max_frame)
        renewed = self._renew() if self.kept else set()
        self._admit([r for r in range(self.world_size) if r not in renewed], shard=[], step=-1)

    def _renew(self) -> set[int]:
        """The members a warm world kept (world.py), configured again as ranks 0, 1, ... of this
        run; those beyond its world size stopped. The ranks that said READY."""
        kept, self.kept = self.kept, []
        use, extra = kept[:self.world_size], kept[self.world_size:]
        if extra:
            with _interrupts_held():
                stop_workers([k.worker for k in extra], grace=0.0, term_wait=0.5)
        for rank, k in enumerate(use):
            k.member.rank, k.member.epoch = rank, self.epoch
            self.members.adopt(rank, k.worker)
            self.channel.admit(k.member)
            self.channel.note(rank, f"rank {rank}: the worker of pid {k.worker.pid} was kept from the run "
                                    f"before and is configured again")
        failed = self.channel.reconfigure({r: self._config(r, [], -1) for r in range(len(use))})
        if failed:
            for rank, why in sorted(failed.items()):
                self.channel.note(rank, f"rank {rank}: the kept worker {why}: a new one is started")
            with _interrupts_held():
                self.members.retire(sorted(failed))
        if self.world is not None:
            self.world.reused += len(use) - len(failed)
        return set(range(len(use))) - set(failed)

    def _check_descriptors(self, soft: int, hard: int) -> None:
        """Refuse to start a run the descriptor limit cannot hold (ZeroMQ aborts the whole
        process when it runs out mid-way): each rank costs us a connection, and for workers we
        start a pidfd and a log; ZeroMQ's context, sockets and our files need some more."""
        need = DESCRIPTORS_BASE + DESCRIPTORS_PER_RANK * self.world_size
        if soft != resource.RLIM_INFINITY and soft < need:
            raise MachineFailure(f"a run of {self.world_size} rank(s) needs about {need} file descriptors; "
                                 f"the limit is {soft} (hard {hard}): raise it with "
                                 f"ulimit -n {need}", None)

    def _local_endpoint(self) -> str:
        """Spawned workers connect over a unix socket only the run's owner can reach (the run
        directory is 0700): no other user's process can even connect, let alone send.
        Where the run directory is too deep for a socket path, the socket goes to a short
        private directory of ours (removed with the run); without one, OSError. Never TCP,
        which every local user can reach (only an explicit `bind` address is used as given)."""
        from inferris_dist.launcher.rundir import local_endpoint
        if self.options.bind != LOCAL:
            return f"{self.options.bind}:0"
        return local_endpoint(self.log_dir)

    def _admit(self, ranks: Sequence[int], shard: list, step: int, early: Sequence = ()) -> list[int]:
        """Admit members for `ranks`; during a restart (step >= 0) a member of another rank
        lost while we wait is replaced in the same window. Returns every rank admitted.
        `early`: the HELLOs of members started ahead, read already (they are not started)."""
        timeout, never_came = self.members.start(ranks) if not early else self.members.started_ahead()
        also_lost = self._also_lost if step >= 0 else None
        admission = Admission(self.channel, ranks, self.members,
                              lambda rank: self._config(rank, shard, step), step, timeout,
                              never_came, also_lost, early)
        started = time.monotonic()
        joined = False
        try:
            admission.run()
            joined = True
        finally:
            if step >= 0 and self.external:          # a wait for members someone else starts
                self.recorder.rejoin_wait(started, sorted(admission.ranks), joined)
        return sorted(admission.ranks)

    def _also_lost(self, rank: int) -> None:
        """A member lost while others are being replaced: say so, retire it, start (or wait
        for) its replacement too, within the window already running."""
        detail = self.channel.explain(rank) or " (its connection closed)"
        text = f"rank {rank} was lost too while replacing others{detail}: replaced in the same window"
        self.channel.note(rank, text)
        self.recorder.lost_meanwhile(rank, self.epoch,
                                     f"rank {rank} was lost while others were replaced{detail}")
        with _interrupts_held():
            self.members.retire([rank])
        self.members.start([rank])

    def _config(self, rank: int, shard: list, step: int) -> wire.Config:
        return wire.Config(self.num_pages, self.page_size, self.accept_scripts, shard,
                           self._faults_of(rank, step), tuple(self.options.exec_cost))

    def _faults_of(self, rank: int, step: int) -> list[str]:
        """The faults a member of `rank` gets from `step` on. One-shots fire once in the run: a
        new member gets those of its rank not yet fired (a member says FIRED before it acts one
        out, even one that kills it); repeating ones always. Faults name ranks, not members: in
        a world of another size a kept member gets its new rank's. The link's faults are the
        link's, never a member's."""
        oneshots = self.channel.oneshots
        fired = oneshots.fired.get(rank, ()) if oneshots is not None else ()
        given = self.given[rank] = [f for f in self.faults if not f.on_link and f.applies_to(rank)
                                    and (f.repeat or (f.step >= step and f.text not in fired))]
        return [f.text for f in given]

    # -- the world's size (mechanism 14) -------------------------------------------------

    def resize(self, keep: Sequence[int], shard: list, step: int, why: str, add: int = 0) -> Resize:
        """A world of len(keep) + `add` ranks, in a new epoch. The members of `keep` (old ranks,
        in order) become ranks 0, 1, ... and are told so (RESIZE: the new rank and world size,
        the shard every rank holds, the faults of the new rank), and say READY; every other
        member is retired. `add` members started ahead (`start_joining`) are admitted at the
        ranks after them (CONFIG, the same shard). Nothing waits for a process to start."""
        old = self.world_size
        lost = tuple(r for r in range(old) if r not in keep)
        self.channel.next_epoch()
        with _interrupts_held():
            self.members.retire(lost)
        kept = {r: i for i, r in enumerate(keep)}
        new = len(keep) + add
        added = tuple(range(len(keep), new))
        hidden = self.members.joined_since(added) if added else None
        self.world_size = new
        self.channel.reshape(new, kept)
        self.members.reshape(kept, new)
        resize = Resize(self.epoch, step, old, new, tuple(keep), lost, added, len(shard), why,
                        None if hidden is None else round(hidden, 6))
        self.recorder.resized(resize)
        self.channel.settle(step, {r: wire.Resize(shard, self._faults_of(r, step)) for r in range(len(keep))})
        if added:
            self.members.admit_joining(added)
            self._admit(added, shard, step, early=self.channel.take_knocking())
        return resize

    def start_joining(self, target: int) -> list[int]:
        """Start members, in the background, for every rank a world of `target` lacks (those not
        started already): they say HELLO while the steps go on; `resize` admits them."""
        if self.external:
            return []
        ranks = [r for r in range(self.world_size, target) if r not in self.members.joining]
        for rank in [r for r in self.members.joining if r >= target]:
            self.members.drop_joining(rank)
        if ranks:
            self.channel.expect_knocks()
            self.members.start_joining(ranks, target)
        return ranks

    @property
    def joining(self) -> list[int]:
        """The ranks members are starting for, in the background."""
        return sorted(self.members.joining) if not self.external and self.members is not None else []

    def watch(self, seconds: float, step: int) -> None:
        """Between steps, no plan out: wait `seconds` (0: one look) for a member's loss; RankLost
        at once if one is gone (its pidfd, its connection)."""
        deadline = time.monotonic() + seconds
        while True:
            dead = self.channel.between_steps(deadline)
            gone = sorted((set(dead) | self.dead_ranks()) & set(self.channel.members))
            if gone:
                raise self.channel.lost(gone[0], step, "died",
                                        f"died while the run waited for arrivals (step {step})",
                                        also=gone[1:])
            if time.monotonic() >= deadline:
                return

    def joining_ready(self, until: float | None = None) -> bool:
        """Whether every member started ahead has said HELLO (a dead one is started again)."""
        if not self.joining:
            return False
        for rank in self.members.dead_joining():
            self.channel.note(rank, f"the member started ahead for rank {rank} "
                                    f"{self.members.explain_joining(rank)}: started again")
            self.members.drop_joining(rank)
            self.members.start_joining([rank], self.members.joining_world)
        return self.channel.knocked(len(self.joining), until)

    def close(self) -> None:
        """Stop every worker (politely, then by signal, for those we spawned) and release the
        socket. Idempotent. Ctrl-C and SIGTERM wait until the workers are gone: a second
        Ctrl-C must not leave orphans behind.
        """
        with _interrupts_held():
            if self.members is not None:
                template = getattr(self.members, "template", None)     # (members from elsewhere: none)
                world = self.options.world
                if template is not None and template in (self.options.template, world and world.template):
                    self.members.template = None     # shared: left running for the next run
                if self.world is not None and self.ended_whole and not self.channel.in_flight \
                        and getattr(self.members, "template", None) is None:   # (its own: they die with it)
                    return self._hand_back()
                self.members.close()
            if self.kept:                            # taken from a warm world, never configured
                stop_workers([k.worker for k in self.kept], grace=0.0, term_wait=0.5)
                self.kept = []
            self.channel.close()
            if self.log_dir is not None:
                lent = self.options.world is not None and self.log_dir == self.options.world.run_dir
                if self.log_dir != self.options.run_dir and not lent:
                    remove_run_dir(self.log_dir)
                self.log_dir = None

    def _hand_back(self) -> None:
        """The run ended whole: the members still trusted (alive, never blamed, none of the
        faults they were given reached) go back to the warm world, with the socket; every other
        worker is stopped as at any run's end (world.py)."""
        from inferris_dist.scheduler.world import Kept
        dead, fired = self.dead_ranks(), set(self.faults) - set(self.unfired)
        trusted = [r for r in sorted(self.channel.members) if r not in self.channel.blamed
                   and r not in dead and not fired.intersection(self.given.get(r, ()))]
        workers = self.members.hand_over(trusted)
        self.channel.close(keep_open=True)
        self.world.give(self.channel.transport, [Kept(self.channel.members[r], workers[r]) for r in trusted])
        self.world = None
        self.log_dir = None

    def run_ended(self) -> None:
        """The engine's last audit joined: the run ended whole (a warm world may keep its members)."""
        self.ended_whole = True

    def hosts_of(self, ranks: Sequence[int]) -> tuple[str, ...]:
        """Where the members of `ranks` joined from (empty for workers we spawned)."""
        if not self.external:
            return ()
        return tuple(self.channel.members[r].host if r in self.channel.members else "" for r in ranks)

    def without_member(self) -> set[int]:
        """Ranks nobody holds now (retired, their replacement not admitted)."""
        return set(range(self.world_size)) - set(self.channel.members)

    def dead_ranks(self) -> set[int]:
        """Ranks known to be gone (process exited or connection closed)."""
        return self.channel.transport.dead | self.members.dead()

    def restart(self, ranks: Sequence[int], shard: list, step: int, policy: str = ""
                ) -> tuple[list[int], list[int]]:
        """Replace the members of `ranks` with new ones in a new epoch; returns their pids.

        Spawned workers are killed and started afresh; members we did not start are
        told to exit and we wait for replacements to join. Each new member starts
        from `shard` (a snapshot of the control plane's pool, or [] for an empty
        shard) and gets the faults not yet spent. A member of another rank lost
        meanwhile is replaced too; returns the ranks replaced and their new pids.
        """
        self.channel.next_epoch()
        with _interrupts_held():
            self.members.retire(ranks)
        self.recorder.restart(list(ranks), self.epoch, step, len(shard), policy)
        ranks = self._admit(ranks, shard, step)
        return ranks, [self.channel.members[r].pid for r in ranks]

    # -- the seam ----------------------------------------------------------------------

    def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        return self.collect(self.submit(plan))

    def submit(self, plan: ExecutionPlan) -> Flight:
        """Send the plan to every rank; its flight, to collect. A rank that cannot be reached
        is reported when the flight is collected (the step fails there, as any other loss)."""
        self.last_planned = plan.step
        if self.unfired:
            self.unfired = [f for f in self.unfired if not f.fires(plan.step)]
        record = self._attempt(plan.step)
        return self.channel.send_round(MsgType.PLAN, MsgType.RESULT, plan.step, plan, record)

    def resend(self, flight: Flight) -> None:
        """Send a flight again, in the epoch a restart began: the same plan, a new attempt."""
        self.channel.resend(flight, self._attempt(flight.step))

    def _attempt(self, step: int) -> StepRecord:
        record = StepRecord(step, self.epoch, 0, self.world_size)
        self.recorder.started(record)
        return record

    def collect(self, flight: Flight) -> ExecutionResult:
        """Every rank's result for `flight`, joined; the attempt's verdict is recorded either way."""
        record = flight.record
        try:
            if flight.failure is not None:
                raise flight.failure
            got = self.channel.receive_round(flight)
            results = [RankExecutionResult(got[r].header.rank, got[r].header.world_size,
                                           got[r].header.step, got[r].body) for r in range(self.world_size)]
            try:
                joined = join(results, self.world_size, flight.step)
            except EngineError as e:
                e.epoch = self.epoch
                self.recorder.step_failed(e, flight.step, self.epoch)
                raise
        except RankLost as e:
            record.verdict = lost_verdict(e)
            raise
        except EngineError as e:
            record.verdict = e.kind
            raise
        else:
            record.verdict = "joined"
            self.channel.joined(flight.step)
            return joined
        finally:
            self.recorder.attempt(record)

    def take_attempts(self) -> list[StepRecord]:
        """The attempts since the last call, but those of a plan still in flight (overlap: the
        next step's plan went out; its attempt is taken with its own step)."""
        return self.recorder.take_attempts(f.record for f in self.channel.in_flight.values())

    def audit(self, held: SlotStore, step: int) -> None:
        """Every rank's shard must hold every slot the control plane's pool holds; every rank
        whose shard does not is named (one recovery replaces them all)."""
        got = self.channel.exchange(MsgType.AUDIT, MsgType.SHARD, step, ())
        failed: list[ShardDivergence] = []
        judged: dict[int, tuple | None] = {}    # ranks that sent the same bytes share one body
        for rank in range(self.world_size):
            body = got[rank].body
            if id(body) not in judged:
                judged[id(body)] = first_mismatch(held, dict(body))
            miss = judged[id(body)]
            if miss is not None:
                page, offset, want, have = miss
                err = ShardDivergence(
                    f"rank {rank}'s shard diverges at page {page} offset {offset}: the pool holds "
                    f"{_slot(want)}, the shard holds {_slot(have)}",
                    step, rank=rank, epoch=self.epoch)
                self.recorder.audit_failed(err, page, offset)
                failed.append(err)
        if failed:
            first = failed[0]
            if len(failed) > 1:
                others = ", ".join(str(e.rank) for e in failed[1:])
                verb = "diverges" if len(failed) == 2 else "diverge"
                first.message += f"; rank{'s' * (len(failed) > 2)} {others} {verb} too"
                first.ranks = tuple(e.rank for e in failed)
            raise first
        self.recorder.audit(step, self.epoch)


class Resize(NamedTuple):
    """The world changed size: who was kept (renumbered in order), lost and added."""
    epoch: int             # the new epoch
    step: int              # the next step to commit
    old: int
    new: int
    kept: tuple[int, ...]  # for each new rank, the old rank of its member
    lost: tuple[int, ...]  # old ranks whose members are gone
    added: tuple[int, ...]  # new ranks new members joined at
    shard_pages: int
    why: str               # shrink, regrow, scale-down, scale-up
    hidden: float | None = None   # seconds of the new members' start-up the steps did not wait for


SPIN_US = 2000    # how long the scheduler spins for an answer before it sleeps (a free core only)


def spin_seconds(spin_us: int | None, world_size: int) -> float:
    """The gather's spin: as asked, or by default SPIN_US only while the ranks leave a core
    free for the scheduler (it must never take a core a rank needs). A rank is a process with
    two threads (its own and ZeroMQ's), and the scheduler's ZeroMQ thread needs one too: on
    this project's 2-core machine the spin never wins (measured: 1.7x slower per step at world
    size 1 under load), so it takes world size + 2 cores to turn it on by default."""
    if spin_us is not None:
        return max(0, spin_us) / 1e6
    return SPIN_US / 1e6 if world_size + 2 <= usable_cores() else 0.0


def frame_cap(workload: Workload) -> int:
    """The largest frame a rank of this run can have a reason to send (its SHARD: every slot of
    the pool in (request, base, mask) layers; its RESULT: every request's outcome and the
    step's writes), generously, and at least 1 MiB: what one frame from a member may cost."""
    return int(min(wire.MAX_FRAME_BYTES, max(1 << 20, 2 * sum(largest_replies(workload)) + 4096)))


def largest_replies(workload: Workload) -> tuple[int, int]:
    """(SHARD, RESULT): about the most bytes a rank's audit reply and step reply can take."""
    cfg = workload.config
    id_len = max((len(r.request_id.encode()) for r in workload.requests), default=1)
    slot = id_len + 24 + (cfg.page_size + 7) // 8
    shard = cfg.num_pages * min(cfg.page_size, len(workload.requests) + 1) * slot + 16 * cfg.num_pages
    result = len(workload.requests) * (id_len + 64) + 16 * (cfg.max_step_tokens + cfg.num_pages)
    return shard, result


def check_fits(workload: Workload) -> None:
    """Refuse, as bad input, a workload whose messages the decoder's limits would refuse."""
    cfg = workload.config
    if (cfg.page_size + 7) // 8 > wire.MAX_STR_LEN:
        raise WorkloadError(f"engine: 'page_size' {cfg.page_size} is too large for the wire "
                            f"(at most {wire.MAX_STR_LEN * 8} slots a page)")
    for r in workload.requests:
        if len(r.request_id.encode()) > wire.MAX_STR_LEN:
            raise WorkloadError(f"request {r.request_id[:20]!r}...: 'request_id' is longer than "
                                f"the wire's {wire.MAX_STR_LEN} bytes")
        script = r.accept_script or ()
        if len(script) > wire.MAX_ARRAY_LEN or any(not -2**63 <= a < 2**63 for a in script):
            raise WorkloadError(f"request {r.request_id!r}: 'accept_script' does not fit the wire "
                                f"(at most {wire.MAX_ARRAY_LEN} 64-bit integers)")
    shard, result = largest_replies(workload)
    if shard + result > wire.MAX_FRAME_BYTES:
        raise WorkloadError(f"a rank's shard could take about {shard + result:,} bytes on the wire "
                            f"({cfg.num_pages:,} pages of {cfg.page_size} slots, request ids up to "
                            f"{max(len(r.request_id.encode()) for r in workload.requests):,} bytes), over "
                            f"its frame limit of {wire.MAX_FRAME_BYTES:,}: fewer or smaller pages, "
                            f"or shorter ids")
    entries = sum(len(r.accept_script or ()) for r in workload.requests)
    if entries > wire.MAX_FRAME_BYTES // 16:       # big enough to matter: measure the CONFIG itself
        size = len(wire.encode_body(MsgType.CONFIG, wire.Config(cfg.num_pages, cfg.page_size,
                                                                accept_scripts(workload), [], [])))
        if size > wire.MAX_FRAME_BYTES:
            raise WorkloadError(f"the accept scripts ({entries:,} entries) make a CONFIG of {size:,} bytes, "
                                f"over the wire's frame limit of {wire.MAX_FRAME_BYTES:,}: every rank "
                                f"gets every script at start-up")


class _interrupts_held:
    """Hold SIGINT and SIGTERM (main thread only) until the block is done."""

    def __enter__(self):
        self.mask = None
        if threading.current_thread() is threading.main_thread():
            self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    def __exit__(self, *exc):
        if self.mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _slot(slot) -> str:
    return "nothing" if slot is None else f"({slot[0]}, {slot[1]})"
