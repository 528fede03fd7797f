"""The conformance cases: what a rank worker must do on the wire, each case named by what it
tries and the section of docs/protocol.md that says what is due.

Two kinds of case:

- on the real scheduler (`launch` with the worker command): golden traces, the ladder's rungs,
  overlap, the audit, recovery from a worker killed or stopped, the link's faults; each run's
  trace compared byte for byte with the in-process engine's (or judged by its policy's promise);
- on the scripted scheduler (scripted.py), for what the real one never does: refusals, a CONFIG
  for another rank, plans sent twice, stale, from a later epoch, garbage, frames past the cap.

A case returns its grade and one line; it raises ScriptError (a FAIL with that line) when the
worker did not do what the script needs to go on.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

from inferris_dist.conform.scripted import Scripted, ScriptError
from inferris_dist.engine import Engine, Workload, load_workload, trace_dicts
from inferris_dist.engine.group import LocalGroup, join
from inferris_dist.engine.rungs import NAMES as RUNGS
from inferris_dist.protocol import wire
from inferris_dist.protocol.faults import FACTOR_KINDS, KINDS, LINK_KINDS, SECONDS_KINDS
from inferris_dist.protocol.wire import MsgType

PASS, FAIL, NON_STRICT, INFORMATIONAL, SKIPPED = "PASS", "FAIL", "NON-STRICT", "INFORMATIONAL", "SKIPPED"
GRADES = (PASS, FAIL, NON_STRICT, INFORMATIONAL, SKIPPED)

# The sections of docs/protocol.md each family of cases checks: the one place they are named.
SECTIONS = {
    "frame": "§10", "handshake": "§6.1", "refused": "§6.4", "config": "§6.5", "plan": "§7.1",
    "golden": "§7.1", "rung": "§7.2", "overlap": "§7.5", "duplicate": "§8.2", "epoch": "§8.1",
    "stale": "§8.2", "replaced": "§8.4", "audit": "§9.1", "stop": "§9.2", "recovery": "§8.3",
    "link": "§8.2", "faults": "§11", "resize": "§8.5", "again": "§8.6",
}
EXIT_DEADLINE = 2.0        # seconds a worker has to exit once told to (STOP, REFUSED)
UNDECODED = "a message that does not decode"
QUIET = 0.3                # seconds waited for a message that must not come
SCRIPT_WORLD = 2           # the scripted scheduler plays a run of this size; the worker is its rank 1
SCRIPT_RANK = 1
SCRIPT_WORKLOAD = "random_001"
SAMPLE_GOLDEN = ("demo", "prefix_reuse")    # worlds of 1 and 4 (handshake.good is a world of 2)
SAMPLE_RUNGS = ()            # overlap is in the default run; the other rungs with --full
SAMPLE_LINK = ("plan-dup",)
GOLDEN_SIZES = (1, 2, 4)


class Outcome(NamedTuple):
    grade: str
    detail: str


@dataclass(frozen=True)
class Case:
    id: str
    section: str
    run: Callable[["Kit", Path], Outcome]
    tier: str = "default"        # "default", "full" (with --full) or "faults" (--profile faults)
    required: bool = True        # a FAIL fails the run
    scripted: bool = False       # run on the scripted scheduler (else the real one)

    @property
    def title(self) -> str:
        return f"{self.id} {self.section}"


class NoGolden(Exception):
    """A case needs the golden workloads, and this install has none (they are a checkout's)."""


class Missing:
    """Where the golden workloads would be, in an install without them: naming one of them is
    NoGolden, which grades the case SKIPPED with the reason."""

    def __truediv__(self, name: str):
        raise NoGolden(f"needs the golden workloads ({name}): they are in a source checkout's "
                       f"tests/data/golden")

    def glob(self, pattern: str):
        return iter(())


@dataclass
class Kit:
    """What every case is given: the worker command, how long it may take to connect, and where
    the golden workloads are."""
    command: str
    start_timeout: float
    golden: Path | Missing


# -- the reference ------------------------------------------------------------------------------

class Recorded(NamedTuple):
    """A workload run in process, each plan and what each rank replied, kept for the script."""
    workload: Workload
    plans: list
    results: dict[int, list]      # rank -> its RankExecutionResult per plan
    shards: dict[int, list]       # rank -> its shard at the end


@lru_cache(maxsize=4)
def recorded(path: Path, world_size: int) -> Recorded:
    workload = load_workload(path).with_config(world_size=world_size)
    group = LocalGroup(workload, world_size)
    plans, results = [], {r: [] for r in range(world_size)}

    class Recording:
        def execute(self, plan):
            plans.append(plan)
            by_rank = [rank.execute(plan) for rank in group.ranks]
            for r, res in enumerate(by_rank):
                results[r].append(res)
            return join(by_rank, world_size, plan.step)

    trace_dicts(Engine(workload, executor=Recording(), rung="full"))
    return Recorded(workload, plans, results, group.shards())


def config_of(rec: Recorded) -> wire.Config:
    cfg = rec.workload.config
    scripts = {r.request_id: r.accept_script for r in rec.workload.requests if r.accept_script is not None}
    return wire.Config(cfg.num_pages, cfg.page_size, scripts, [], [], (0, 0))


# -- on the real scheduler ------------------------------------------------------------------------

def on_processes(kit: Kit, where: Path, workload: Workload, world_size: int, *, rung: str = "full",
                 faults=(), policy: str = "abort", audit_every: int = 0, step_timeout: float = 5.0,
                 check=None):
    from inferris_dist.testing import run_on_processes
    return run_on_processes(workload, faults, policy, world_size=world_size, worker=kit.command,
                            wire_log=str(where / "wire.jsonl"), rung=rung, audit_every=audit_every,
                            start_timeout=kit.start_timeout, step_timeout=step_timeout,
                            max_restarts=2, check=check)


def same_trace(kit: Kit, where: Path, spec: Path, world_size: int, rung: str = "full",
               audit_every: int = 0) -> Outcome:
    """The run's lines, byte for byte, against the in-process engine's."""
    workload = load_workload(spec).with_config(world_size=world_size)
    want = [json.dumps(x) for x in trace_dicts(Engine(workload, rung=rung))]
    run = on_processes(kit, where, workload, world_size, rung=rung, audit_every=audit_every)
    got = [json.dumps(x) for x in run.lines]
    if got == want:
        return Outcome(PASS, f"{len(want)} lines, byte for byte")
    if run.error is not None:
        return Outcome(FAIL, f"the run failed: {run.error}")
    i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return Outcome(FAIL, f"line {i + 1} differs: got {got[i][:120] if i < len(got) else 'nothing'}")


def judged(kit: Kit, where: Path, spec: Path, world_size: int, faults, policy: str, *,
           check=None, step_timeout: float = 5.0) -> tuple[Outcome, list]:
    """A run with faults (or with what `check` does to it), judged by the policy's promise, its
    wire log's checkers, and what it left running."""
    from inferris_dist.chaos.harness import WIRE_LOG_CHECKERS, still_running
    from inferris_dist.chaos.verdicts import judge_run, reference_of
    workload = load_workload(spec).with_config(world_size=world_size)
    run = on_processes(kit, where, workload, world_size, faults=faults, policy=policy, check=check,
                       step_timeout=step_timeout)
    brk = judge_run(reference_of(workload), run, faults, policy, wire_log=where / "wire.jsonl",
                    checkers=WIRE_LOG_CHECKERS, left_running=still_running(run.pids, EXIT_DEADLINE))
    fired = announced(where / "wire.jsonl")
    if brk is not None:
        return Outcome(FAIL, f"{brk}"), fired
    restarts = len(run.recoveries)
    said = f"{restarts} recover{'y' if restarts == 1 else 'ies'}"
    return Outcome(PASS, f"{policy}: the promise held ({said})"), fired


def announced(wire_log: Path) -> set[str]:
    """The fault texts the workers said FIRED (§11.2) in a run's wire log: what they acted out,
    not what a plan merely reached."""
    from inferris_dist.engine.workload import read_text
    texts: set[str] = set()
    for line in read_text(wire_log, "wire log").splitlines():
        if '"FIRED"' not in line:
            continue
        record = json.loads(line)
        if record.get("type") == "FIRED" and isinstance(record.get("body"), list):
            texts.update(t for t in record["body"] if isinstance(t, str))
    return texts


def kill_at(step: int, rank: int, sig: int) -> Callable:
    """A `check` that sends `sig` to rank's worker (its process group) once `step` is committed."""
    done = []

    def check(engine) -> None:
        if not done and engine.step_id >= step:
            done.append(True)
            worker = engine.group.workers[rank]
            os.killpg(worker.pid, sig)
    return check


# -- on the scripted scheduler --------------------------------------------------------------------

class Session(NamedTuple):
    """A scripted run with one worker admitted as rank SCRIPT_RANK, and the reference."""
    s: Scripted
    ident: bytes
    proc: object
    rec: Recorded


def scripted(kit: Kit, where: Path) -> Scripted:
    return Scripted(where, kit.command, SCRIPT_WORLD)


def admitted(kit: Kit, s: Scripted) -> Session:
    rec = recorded(kit.golden / f"{SCRIPT_WORKLOAD}.spec.json", SCRIPT_WORLD)
    proc = s.start(SCRIPT_RANK)
    ident = s.admit(proc, SCRIPT_RANK, config_of(rec), kit.start_timeout)
    return Session(s, ident, proc, rec)


def send_plan(se: Session, i: int, epoch: int = 1) -> wire.SentPlan:
    body, sent = wire.encode_plan(se.rec.plans[i])
    se.s.send(se.ident, MsgType.PLAN, body, epoch=epoch, step=se.rec.plans[i].step, rank=SCRIPT_RANK)
    return sent


def check_result(se: Session, i: int, sent, epoch: int = 1, timeout: float = 5.0) -> None:
    """The worker's RESULT for plan i: its header, then its outcomes against the reference's."""
    step = se.rec.plans[i].step
    got = se.s.expect(MsgType.RESULT, timeout, f"for the plan of step {step}")
    h = got.header
    if (h.epoch, h.step, h.rank) != (epoch, step, SCRIPT_RANK):
        raise ScriptError(f"its RESULT for step {step} of epoch {epoch} is headed epoch {h.epoch}, "
                          f"step {h.step}, rank {h.rank}")
    try:
        outcomes = wire.decode_result(got.frames[1], sent)
    except (wire.WireError, IndexError) as e:
        raise ScriptError(f"its RESULT for step {step} does not decode: {e}") from None
    want = se.rec.results[SCRIPT_RANK][i].outcomes
    if outcomes != want:
        j = next((j for j, (a, b) in enumerate(zip(want, outcomes)) if a != b), 0)
        raise ScriptError(f"its RESULT for step {step} differs from the reference at item {j}: "
                          f"{_short(outcomes[j] if j < len(outcomes) else None)}, want {_short(want[j])}")


def step_through(se: Session, upto: int, epoch: int = 1, start: int = 0) -> None:
    for i in range(start, upto):
        check_result(se, i, send_plan(se, i, epoch), epoch)


def nothing_more(se: Session, what: str, seconds: float = QUIET) -> None:
    extra = se.s.quiet(seconds)
    if extra:
        h = extra[0].header
        said = f"{h.type.name} for step {h.step} of epoch {h.epoch}" if h else UNDECODED
        raise ScriptError(f"{what}: it sent {said}, which nothing asked for")


def exits_within(proc, seconds: float) -> bool:
    return proc.wait(seconds)


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 100 else text[:97] + "..."


# -- the cases ------------------------------------------------------------------------------------

def c_handshake_good(kit: Kit, where: Path) -> Outcome:
    return same_trace(kit, where, kit.golden / "demo.spec.json", 2)


def c_handshake_hello(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 1)
    return Outcome(PASS, "HELLO with its rank, world size and proof of the secret; READY after CONFIG")


def _refused_then_exit(s: Scripted, proc, ident: bytes, reason: str) -> Outcome:
    s.send(ident, MsgType.REFUSED, wire.encode_body(MsgType.REFUSED, (reason,)), rank=SCRIPT_RANK)
    if not exits_within(proc, EXIT_DEADLINE):
        return Outcome(FAIL, f"still running {EXIT_DEADLINE:g} s after REFUSED ({reason})")
    for m in s.quiet(0.0):
        if m.header is None or m.header.type is not MsgType.HELLO:
            return Outcome(FAIL, "it sent more than HELLO after it was refused")
    return Outcome(PASS, f"exited ({proc.exit_description()}) on REFUSED")


def c_refused_proof(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        proc = s.start(SCRIPT_RANK, secret=bytes(32))
        got, hello = s.hello(proc, kit.start_timeout)
        if wire.check_proof(s.secret, got.header, hello):
            return Outcome(FAIL, "its HELLO proves the run secret, which it was not given")
        return _refused_then_exit(s, proc, got.ident,
                                  f"claims rank {SCRIPT_RANK} without proof of the run secret")


def c_refused_taken(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        second = s.start(SCRIPT_RANK)
        got, _ = s.hello(second, kit.start_timeout)
        out = _refused_then_exit(s, second, got.ident, f"claims rank {SCRIPT_RANK}, which is already taken")
        if out.grade == PASS:
            step_through(se, 1)         # the member admitted first is untouched
        return out


def c_refused_version(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        rec = recorded(kit.golden / f"{SCRIPT_WORKLOAD}.spec.json", SCRIPT_WORLD)
        proc = s.start(SCRIPT_RANK)
        got, _ = s.hello(proc, kit.start_timeout)
        s.send(got.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config_of(rec)),
               rank=SCRIPT_RANK, version=wire.PROTOCOL_VERSION + 1)
        return _no_ready(s, proc, f"a CONFIG of protocol version {wire.PROTOCOL_VERSION + 1}")


def _no_ready(s: Scripted, proc, what: str) -> Outcome:
    """After `what`, the worker must not say READY (nor anything but HELLO); it should exit."""
    deadline = time.monotonic() + EXIT_DEADLINE
    while time.monotonic() < deadline:
        got = s.recv(min(0.05, deadline - time.monotonic()))
        if got is not None and not (got.header and got.header.type is MsgType.HELLO):
            kind = got.header.type.name if got.header else "a message that does not decode"
            return Outcome(FAIL, f"it answered {what} with {kind}")
        if not proc.alive():
            return Outcome(PASS, f"refused {what}: {proc.exit_description()}")
    return Outcome(NON_STRICT, f"silent after {what}, but still running after {EXIT_DEADLINE:g} s")


def c_config_rank(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        rec = recorded(kit.golden / f"{SCRIPT_WORKLOAD}.spec.json", SCRIPT_WORLD)
        proc = s.start(SCRIPT_RANK)
        got, _ = s.hello(proc, kit.start_timeout)
        other = 1 - SCRIPT_RANK
        s.send(got.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config_of(rec)), rank=other)
        return _no_ready(s, proc, f"a CONFIG for rank {other}")


def c_config_world(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        rec = recorded(kit.golden / f"{SCRIPT_WORKLOAD}.spec.json", SCRIPT_WORLD)
        proc = s.start(SCRIPT_RANK)
        got, _ = s.hello(proc, kit.start_timeout)
        s.send(got.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config_of(rec)),
               rank=SCRIPT_RANK, world_size=SCRIPT_WORLD + 1)
        return _no_ready(s, proc, f"a CONFIG for a world of {SCRIPT_WORLD + 1}")


def c_plan_replay(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        n = len(se.rec.plans)
        step_through(se, n)
        nothing_more(se, f"after the last of {n} plans")
        return _audit(se, f"{n} plans answered as the reference")


def _audit(se: Session, said: str) -> Outcome:
    step = se.rec.plans[-1].step
    se.s.send(se.ident, MsgType.AUDIT, wire.encode_body(MsgType.AUDIT, ()), step=step, rank=SCRIPT_RANK)
    got = se.s.expect(MsgType.SHARD, 5.0, "after AUDIT")
    try:
        shard = wire.decode_body(MsgType.SHARD, got.frames[1])
    except (wire.WireError, IndexError) as e:
        raise ScriptError(f"its SHARD does not decode: {e}") from None
    want = se.rec.shards[SCRIPT_RANK]
    if [tuple(map(tuple, x[1])) for x in shard] != [tuple(map(tuple, x[1])) for x in want] \
            or [x[0] for x in shard] != [x[0] for x in want]:
        return Outcome(FAIL, f"{said}, but its SHARD is not the reference's "
                             f"({len(shard)} pages, want {len(want)})")
    return Outcome(PASS, f"{said}; its SHARD is the reference's ({len(want)} pages)")


def c_plan_duplicate(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        k = min(3, len(se.rec.plans) - 1)
        step_through(se, k)
        sent = send_plan(se, k)
        send_plan(se, k)
        check_result(se, k, sent)
        nothing_more(se, f"the plan of step {se.rec.plans[k].step} sent twice")
        step_through(se, len(se.rec.plans), start=k + 1)
        return _audit(se, "a plan sent twice carried out once")


def c_plan_epoch(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 2)
        step_through(se, 4, epoch=3, start=2)
        return Outcome(PASS, "plans of a later epoch answered in that epoch")


def c_plan_stale(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 2)
        step_through(se, 3, epoch=2, start=2)
        send_plan(se, 2, epoch=1)              # the same step, from the epoch before
        extra = s.quiet(QUIET)
        step_through(se, 5, epoch=2, start=3)
        if not extra:
            return Outcome(NON_STRICT, "a plan of an older epoch was ignored (it is to be answered)")
        h = extra[0].header
        if h is not None and h.type is MsgType.RESULT and h.epoch == 1:
            return Outcome(PASS, "a plan of an older epoch answered in its own epoch "
                                 "(the scheduler drops it)")
        said = f"{h.type.name} of epoch {h.epoch}" if h else UNDECODED
        return Outcome(FAIL, f"a plan of epoch 1, after epoch 2, answered with {said}")


FOREIGN_SHARD = [(0, [("resized", 7, 0b101)])]   # a shard no plan of the script ever wrote


def c_resize(kit: Kit, where: Path) -> Outcome:
    """Rank 1 of 2 told it is rank 0 of 1 in epoch 2 (§8.5): it says READY as that, holds the
    shard it was given and nothing else, and answers the next plan under its new rank."""
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 2)
        body = wire.encode_body(MsgType.RESIZE, wire.Resize(FOREIGN_SHARD, []))
        s.send(se.ident, MsgType.RESIZE, body, epoch=2, step=se.rec.plans[2].step, rank=0, world_size=1)
        wrong = _not_resized(s.expect(MsgType.READY, 5.0, "after a RESIZE to rank 0 of 1 in epoch 2"))
        if wrong is not None:
            return wrong
        wrong = _holds_foreign_shard(se, 2, 2, "the RESIZE")
        if wrong is not None:
            return wrong
        plan, _ = wire.encode_plan(se.rec.plans[2])
        s.send(se.ident, MsgType.PLAN, plan, epoch=2, step=se.rec.plans[2].step, rank=0, world_size=1)
        wrong = _not_resized(s.expect(MsgType.RESULT, 5.0, "for a plan after the RESIZE"))
        if wrong is not None:
            return wrong
        return Outcome(PASS, "renumbered to rank 0 of 1: READY, the shard it was given, the next "
                             "plan answered as rank 0")


def _holds_foreign_shard(se: Session, epoch: int, step: int, after: str) -> Outcome | None:
    """AUDIT as rank 0 of 1: a FAIL unless its SHARD holds FOREIGN_SHARD's slots and no other."""
    se.s.send(se.ident, MsgType.AUDIT, wire.encode_body(MsgType.AUDIT, ()), epoch=epoch, step=step, rank=0,
              world_size=1)
    shard = se.s.expect(MsgType.SHARD, 5.0, f"for an AUDIT after {after}")
    try:
        held = wire.decode_body(MsgType.SHARD, shard.frames[1])
    except (wire.WireError, IndexError) as e:
        return Outcome(FAIL, f"its SHARD after {after} does not decode: {e}")
    slots = {(p, rid, base, mask) for p, layers in held for rid, base, mask in layers if mask}
    if slots != {(p, rid, base, mask) for p, layers in FOREIGN_SHARD for rid, base, mask in layers}:
        return Outcome(FAIL, f"after {after} its shard is not the one it was given: {_short(held)}")
    return None


def _not_resized(got) -> Outcome | None:
    """A FAIL if `got` is not headed epoch 2, rank 0 of 1 (c_resize's new place); else None."""
    h = got.header
    if (h.epoch, h.rank, h.world_size) == (2, 0, 1):
        return None
    return Outcome(FAIL, f"its {h.type.name} after the RESIZE is headed epoch {h.epoch}, rank {h.rank} "
                         f"of {h.world_size}, not epoch 2, rank 0 of 1")


def c_config_again(kit: Kit, where: Path) -> Outcome:
    """CONFIG again after READY (§8.6), twice. First as rank 0 of 1 in epoch 0 with a shard of
    its own: READY under that header, and only that shard held. Then as its first rank again,
    in the epoch of the plans it answered before: every plan is answered again as the
    reference (the plans it answered are forgotten, the shard is made afresh)."""
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 2)
        config = config_of(se.rec)
        body = wire.encode_body(MsgType.CONFIG, config._replace(shard=FOREIGN_SHARD))
        s.send(se.ident, MsgType.CONFIG, body, epoch=0, step=0, rank=0, world_size=1)
        got = s.expect(MsgType.READY, 5.0, "after a CONFIG again, as rank 0 of 1 in epoch 0")
        h = got.header
        if (h.epoch, h.rank, h.world_size) != (0, 0, 1):
            return Outcome(FAIL, f"its READY to a CONFIG again is headed epoch {h.epoch}, rank {h.rank} "
                                 f"of {h.world_size}, not epoch 0, rank 0 of 1")
        wrong = _holds_foreign_shard(se, 0, 0, "a CONFIG again")
        if wrong is not None:
            return wrong
        s.send(se.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config), epoch=1, step=0,
               rank=SCRIPT_RANK)
        got = s.expect(MsgType.READY, 5.0, f"after a CONFIG again, as rank {SCRIPT_RANK} in epoch 1")
        if (got.header.epoch, got.header.rank) != (1, SCRIPT_RANK):
            return Outcome(FAIL, f"its READY is headed epoch {got.header.epoch}, rank {got.header.rank}, "
                                 f"not epoch 1, rank {SCRIPT_RANK}")
        n = len(se.rec.plans)
        step_through(se, n)
        return _audit(se, f"configured again twice; the {n} plans answered again as the reference")


def warm_case(kit: Kit, where: Path) -> Outcome:
    """Three real runs of 2 on one warm world (§8.6): the second and third take the first's
    workers (configured again, none started), the second with a crash that replaces rank 1;
    each run's trace is the reference's and its wire log passes the checkers."""
    from inferris_dist.chaos.harness import WIRE_LOG_CHECKERS, still_running
    from inferris_dist.chaos.verdicts import judge_run, reference_of
    from inferris_dist.scheduler.world import World
    from inferris_dist.testing import run_on_processes
    workload = load_workload(kit.golden / "prefix_reuse.spec.json").with_config(world_size=2)
    reference = reference_of(workload)
    with World() as world:
        for i, faults in enumerate(((), ("1:crash@2",), ())):
            log = where / f"wire{i}.jsonl"
            before = world.reused
            run = run_on_processes(workload, faults, "restore", world_size=2, worker=kit.command,
                                   wire_log=str(log), start_timeout=kit.start_timeout, step_timeout=5.0,
                                   max_restarts=2, world=world)
            kept = set(world.pids)
            brk = judge_run(reference, run, faults, "restore", wire_log=log, checkers=WIRE_LOG_CHECKERS,
                            left_running=still_running([p for p in run.pids if p not in kept], EXIT_DEADLINE))
            if brk is not None:
                return Outcome(FAIL, f"run {i + 1} of 3 on a warm world: {brk}")
            if i and world.reused - before < 2:
                return Outcome(FAIL, f"run {i + 1} of 3 took {world.reused - before} of the 2 workers the "
                                     f"run before left (each said READY to its CONFIG again?)")
    return Outcome(PASS, f"3 runs on one warm world; {world.reused} workers configured again, not started")


def c_resize_before_config(kit: Kit, where: Path) -> Outcome:
    """A RESIZE where CONFIG is due (§6.1): the worker exits with status 3."""
    with scripted(kit, where) as s:
        proc = s.start(SCRIPT_RANK)
        msg, _ = s.hello(proc, kit.start_timeout)
        s.send(msg.ident, MsgType.RESIZE, wire.encode_body(MsgType.RESIZE, wire.Resize([], [])),
               rank=SCRIPT_RANK)
        if not exits_within(proc, EXIT_DEADLINE):
            return Outcome(FAIL, f"still running {EXIT_DEADLINE:g} s after a RESIZE before CONFIG")
        if proc.proc.returncode != 3:
            return Outcome(NON_STRICT, f"{proc.exit_description()} after a RESIZE before CONFIG, not "
                                       f"with status 3")
        return Outcome(PASS, "exited with status 3")


def c_config_again_no_place(kit: Kit, where: Path) -> Outcome:
    """A CONFIG again for rank 2 of a world of 2 (§8.6): no such place; the worker exits with
    status 3, without READY."""
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 1)
        s.send(se.ident, MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, config_of(se.rec)), epoch=2,
               rank=2, world_size=2)
        if not exits_within(se.proc, EXIT_DEADLINE):
            return Outcome(FAIL, f"still running {EXIT_DEADLINE:g} s after a CONFIG for rank 2 of 2")
        if se.proc.proc.returncode != 3:
            return Outcome(NON_STRICT, f"{se.proc.exit_description()} after a CONFIG for rank 2 of 2, not "
                                       f"with status 3")
        return Outcome(PASS, "exited with status 3")


def shrink_case(kit: Kit, where: Path) -> Outcome:
    """A real run of 3 under shrink, rank 1 killed at step 1: ranks 0 and 2 go on as 0 and 1,
    the trace unchanged."""
    out, _ = judged(kit, where, kit.golden / "prefix_reuse.spec.json", 3, (), "shrink",
                    check=kill_at(1, 1, signal.SIGKILL))
    return out


def c_frame_malformed(kit: Kit, where: Path) -> Outcome:
    return _garbage(kit, where, "a PLAN whose body is not a plan",
                    lambda se: se.s.send(se.ident, MsgType.PLAN, b"\x93\x01\x02", step=se.rec.plans[1].step,
                                         rank=SCRIPT_RANK))


def c_frame_header(kit: Kit, where: Path) -> Outcome:
    return _garbage(kit, where, "a header that is not a header",
                    lambda se: se.s.send_frames(se.ident, [b"\xc1garbage", b"\x90"], kind="garbage"))


def c_frame_count(kit: Kit, where: Path) -> Outcome:
    def send(se: Session) -> None:
        body, _ = wire.encode_plan(se.rec.plans[1])
        header = wire.encode_header(MsgType.PLAN, 1, se.rec.plans[1].step, SCRIPT_RANK, SCRIPT_WORLD)
        se.s.send_frames(se.ident, [header, body, b"extra", b"frames"], kind="PLAN of 4 frames")
    return _garbage(kit, where, "a PLAN of four frames", send)


def _garbage(kit: Kit, where: Path, what: str, send: Callable[[Session], None]) -> Outcome:
    """After `what`, the worker must not reply as if it were a plan: it exits, or ignores it
    and answers the next good plan as the reference."""
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 1)
        send(se)
        deadline = time.monotonic() + EXIT_DEADLINE
        while time.monotonic() < deadline and se.proc.alive():
            got = s.recv(0.05)
            if got is not None and not (got.header and got.header.type is MsgType.HELLO):
                kind = got.header.type.name if got.header else "a message that does not decode"
                return Outcome(FAIL, f"it answered {what} with {kind}")
        if not se.proc.alive():
            return Outcome(PASS, f"refused {what}: {se.proc.exit_description()}")
        step_through(se, 2, start=1)
        return Outcome(PASS, f"ignored {what} and answered the next plan")


def c_frame_oversized(kit: Kit, where: Path) -> Outcome:
    """A CONFIG past the frame cap (wire.MAX_FRAME_BYTES) yet well formed: a worker that reads
    it has no cap; one that keeps the cap never sees it, and never says READY."""
    with scripted(kit, where) as s:
        rec = recorded(kit.golden / f"{SCRIPT_WORKLOAD}.spec.json", SCRIPT_WORLD)
        proc = s.start(SCRIPT_RANK)
        got, _ = s.hello(proc, kit.start_timeout)
        key = wire.MAX_STR_LEN - 16
        n = wire.MAX_FRAME_BYTES // key + 2
        scripts = {f"{i:08d}".ljust(key, "x"): () for i in range(n)}
        config = config_of(rec)._replace(accept_scripts=scripts)
        body = wire.encode_body(MsgType.CONFIG, config)
        del scripts
        s.send(got.ident, MsgType.CONFIG, body, rank=SCRIPT_RANK)
        size = len(body)
        del body
        return _no_ready(s, proc, f"a CONFIG of {size} bytes (the cap is {wire.MAX_FRAME_BYTES})")


def c_stop(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 2)
        s.send(se.ident, MsgType.STOP, wire.encode_body(MsgType.STOP, ()), rank=SCRIPT_RANK)
        t0 = time.monotonic()
        if not exits_within(se.proc, EXIT_DEADLINE):
            return Outcome(FAIL, f"still running {EXIT_DEADLINE:g} s after STOP")
        code = se.proc.proc.returncode
        took = time.monotonic() - t0
        if code != 0:
            return Outcome(NON_STRICT, f"exited {took:.2f} s after STOP, but {se.proc.exit_description()}")
        return Outcome(PASS, f"exited 0, {took:.2f} s after STOP")


def c_replaced(kit: Kit, where: Path) -> Outcome:
    with scripted(kit, where) as s:
        se = admitted(kit, s)
        step_through(se, 1)
        return _refused_then_exit(s, se.proc, se.ident,
                                  f"rank {SCRIPT_RANK} of epoch 1 was replaced in epoch 2: exit")


def c_audit(kit: Kit, where: Path) -> Outcome:
    return same_trace(kit, where, kit.golden / "prefix_reuse.spec.json", 2, audit_every=1)


def recovery_case(sig: int, policy: str) -> Callable[[Kit, Path], Outcome]:
    def run(kit: Kit, where: Path) -> Outcome:
        hang = sig == signal.SIGSTOP
        out, _ = judged(kit, where, kit.golden / "prefix_reuse.spec.json", 2, (), policy,
                        check=kill_at(1, 1, sig), step_timeout=0.5 if hang else 5.0)
        return out
    return run


def fault_case(kind: str, policy: str = "restore") -> Callable[[Kit, Path], Outcome]:
    arg = ":0.3" if kind in SECONDS_KINDS else ":2" if kind in FACTOR_KINDS else ""
    fault = f"1:{kind}@3{arg}"          # step 3 of prefix_reuse plans work (step 2 waits for arrivals)

    def run(kit: Kit, where: Path) -> Outcome:
        out, fired = judged(kit, where, kit.golden / "prefix_reuse.spec.json", 2, [fault], policy,
                            step_timeout=2.0)
        if kind not in LINK_KINDS and fault not in fired:
            if out.grade == PASS:
                return Outcome(INFORMATIONAL, f"{fault}: not acted out by the worker (no FIRED); "
                                              f"the run held")
            return Outcome(INFORMATIONAL, f"{fault}: not acted out by the worker; {out.detail}")
        return Outcome(out.grade, f"{fault}: {out.detail}")
    return run


def rung_case(rung: str) -> Case:
    section = SECTIONS["overlap" if rung == "overlap" else "rung"]
    cid = "overlap.ahead" if rung == "overlap" else f"rung.{rung}"
    spec = "prefix_reuse.spec.json"
    return Case(cid, section, lambda kit, where: same_trace(kit, where, kit.golden / spec, 2, rung=rung),
                "default" if rung in SAMPLE_RUNGS or rung == "overlap" else "full")


def all_cases(golden: Path | None) -> list[Case]:
    """Every case, in the order they run: the handshake first (a worker that never connects is
    told once), the script's, then the real scheduler's."""
    S = SECTIONS
    cases = [
        Case("handshake.hello", S["handshake"], c_handshake_hello, scripted=True),
        Case("handshake.good", S["handshake"], c_handshake_good),
        Case("handshake.refused.proof", S["refused"], c_refused_proof, scripted=True),
        Case("handshake.refused.taken", S["refused"], c_refused_taken, scripted=True),
        Case("handshake.refused.version", S["refused"], c_refused_version, scripted=True),
        Case("config.other-rank", S["config"], c_config_rank, scripted=True),
        Case("config.other-world", S["config"], c_config_world, scripted=True, tier="full"),
        Case("plan.replay", S["plan"], c_plan_replay, scripted=True),
        Case("plan.duplicate", S["duplicate"], c_plan_duplicate, scripted=True),
        Case("epoch.later", S["epoch"], c_plan_epoch, scripted=True),
        Case("epoch.stale", S["stale"], c_plan_stale, scripted=True),
        Case("frame.malformed-body", S["frame"], c_frame_malformed, scripted=True),
        Case("frame.malformed-header", S["frame"], c_frame_header, scripted=True),
        Case("frame.count", S["frame"], c_frame_count, scripted=True, tier="full"),
        Case("frame.oversized", S["frame"], c_frame_oversized, scripted=True),
        Case("stop.exit", S["stop"], c_stop, scripted=True),
        Case("replaced.exit", S["replaced"], c_replaced, scripted=True),
        Case("resize.renumbered", S["resize"], c_resize, scripted=True),
        Case("resize.before-config", S["resize"], c_resize_before_config, scripted=True, tier="full"),
        Case("audit.shard", S["audit"], c_audit),
        Case("recovery.sigkill.restore", S["recovery"], recovery_case(signal.SIGKILL, "restore")),
        Case("recovery.sigkill.recompute", S["recovery"], recovery_case(signal.SIGKILL, "recompute"),
             tier="full"),
        Case("recovery.sigstop.restore", S["recovery"], recovery_case(signal.SIGSTOP, "restore")),
        Case("resize.shrink", S["resize"], shrink_case),
        Case("again.config", S["again"], c_config_again, scripted=True),
        Case("again.warm", S["again"], warm_case),
        Case("again.no-such-place", S["again"], c_config_again_no_place, scripted=True, tier="full"),
    ]
    cases += [rung_case(r) for r in RUNGS if r != "full"]
    cases += [Case(f"link.{k}", S["link"], fault_case(k), "default" if k in SAMPLE_LINK else "full")
              for k in sorted(LINK_KINDS)]
    cases += [Case(f"faults.{k}", S["faults"], fault_case(k), "faults", required=False)
              for k in KINDS if k not in LINK_KINDS and k != "hang"]
    specs = sorted(p.name[:-len(".spec.json")] for p in golden.glob("*.spec.json")) if golden else []
    for i, name in enumerate(specs):           # every spec, the world sizes in turn
        size = GOLDEN_SIZES[i % len(GOLDEN_SIZES)]
        cases.append(Case(f"golden.{name}.w{size}", S["golden"], golden_run(name, size),
                          "default" if name in SAMPLE_GOLDEN else "full"))
    return cases


def golden_run(name: str, world_size: int) -> Callable[[Kit, Path], Outcome]:
    return lambda kit, where: same_trace(kit, where, kit.golden / f"{name}.spec.json", world_size)
