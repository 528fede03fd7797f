"""Fault injection: `RANK:KIND@STEP[+][:ARG]`, a first-class input, not a test monkeypatch.

The grammar is read in one place, `Fault.read` (`Fault.parse` keeps what it read), and
written in one, `Fault.format` (what the shrinker writes back when it moves a fault); `kind_of`
reads a text's KIND alone. The scheduler parses and validates the specs and hands each rank its own in
the CONFIG message (so they show in the wire log); the rank acts them out on
real processes through its FaultPlan. `@STEP` fires once in the run, `@STEP+`
at that step and every later one (a replacement worker inherits it, so it
keeps coming back).

Adding a fault kind touches this module only: its line in KINDS and, in
FaultPlan's table, the hook that acts it out (before the step, on the
outcomes, on the frames, or as an extra send). The link's kinds (LINK_KINDS)
are not the rank's: they act on the wire between the scheduler and the rank,
where the scheduler's side of the connection puts them (scheduler/link.py);
the rank never hears of them.
"""
from __future__ import annotations

import functools
import os
import random
import signal
from typing import TYPE_CHECKING, NamedTuple, Protocol

from inferris_dist.engine import WorkloadError
from inferris_dist.protocol.limits import plain

if TYPE_CHECKING:
    from inferris_dist.engine.shard import SlotStore

KINDS = {    # each kind: what it does (for help and docs); how a rank acts it out is FaultPlan's table
    "crash": "kills itself (SIGKILL) on receiving the plan",
    "exit": "exits 0 on receiving the plan",
    "hang": "stops answering, process alive (a busy loop holding the GIL)",
    "delay": "answers ARG seconds late",
    "slow": "takes ARG times the model's time to execute (--exec-cost), ARG from 1 to 100",
    "jitter": "takes up to ARG seconds more to execute, the same draw for the same fault and step",
    "garble": "replies with bytes that are not a valid message",
    "duplicate": "sends its result twice",
    "stale": "also re-sends its previous step's result",
    "disagree": "reports accepted+1 on its first item",
    "bad-writes": "reports a write off its placement",
    "drop-write": "reports a write but does not store it in its shard",
    "crash-after-reply": "replies, then kills itself (SIGKILL) before writing its shard",
    # the link between the scheduler and the rank (the rank alive and well)
    "plan-lost": "the link loses the plan to the rank (it never sees it)",
    "result-lost": "the link loses the rank's result (the scheduler never sees it)",
    "plan-delay": "the link delivers the plan ARG seconds late",
    "result-delay": "the link delivers the rank's result ARG seconds late",
    "plan-dup": "the link delivers the plan twice",
    "result-dup": "the link delivers the rank's result twice",
    "reorder": "the link holds the plan and delivers it after the next message to the rank",
    "partition": "the link loses everything to and from the rank for ARG seconds, then heals",
}
LINK_KINDS = frozenset({"plan-lost", "result-lost", "plan-delay", "result-delay", "plan-dup", "result-dup",
                        "reorder", "partition"})
SECONDS_KINDS = frozenset({"delay", "jitter", "plan-delay", "result-delay", "partition"})   # ARG: seconds
FACTOR_KINDS = frozenset({"slow"})                  # ARG: a factor, 1 to MAX_FACTOR
TIME_KINDS = frozenset({"slow", "jitter"})         # act on the model's time only: no trace changes
MAX_FACTOR = 100.0
FORMAT = "RANK:KIND@STEP[+][:ARG]"
POLICIES = ("abort", "restore", "recompute", "shrink", "pause")     # what follows a failed step (recovery.py)


class Fault(NamedTuple):
    rank: int | None          # None: every rank
    kind: str
    step: int
    repeat: bool              # @STEP+: this step and every later one
    arg: float | None = None
    text: str = ""
    spent_by: frozenset = frozenset()   # a one-shot link fault on `all`: the ranks it acted on

    def fires(self, step: int) -> bool:
        return step == self.step or (self.repeat and step > self.step)

    def applies_to(self, rank: int) -> bool:
        return (self.rank is None or self.rank == rank) and rank not in self.spent_by

    @property
    def on_link(self) -> bool:
        return self.kind in LINK_KINDS

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str, world_size: int | None = None, source: str = "--fault") -> Fault:
        """Fault.read, kept for the texts seen last: a run's faults are read again by every part
        that judges it (what is not text is read each time, and refused as read refuses it)."""
        if type(text) is str and (world_size is None or type(world_size) is int) and type(source) is str:
            return _read_kept(text, world_size, source)
        return Fault.read(text, world_size, source)

    @staticmethod
    def read(text: str, world_size: int | None = None, source: str = "--fault") -> Fault:
        """A fault as written (`RANK:KIND@STEP[+][:ARG]`), checked against the grammar and, given
        `world_size`, the ranks; `source` says where it came from in errors (the flag, or the
        workload). A WorkloadError says what is wrong."""
        def bad(why: str) -> WorkloadError:
            return WorkloadError(f"{source} {text!r}: {why} "
                                 f"(want {FORMAT}, e.g. 1:crash@3 or all:delay@2+:0.5)")

        rank_part, sep, rest = text.partition(":")
        if not sep:
            raise bad("no ':' after the rank")
        if rank_part == "all":
            rank = None
        else:
            try:
                rank = int(plain(rank_part))
            except ValueError:
                raise bad(f"rank {rank_part!r} is not an integer or 'all'") from None
            if rank < 0 or (world_size is not None and rank >= world_size):
                raise bad(f"rank {rank} is outside 0..{(world_size or 1) - 1}")
        kind, at, when = rest.partition("@")
        if not at:
            raise bad("no '@STEP'")
        if kind not in KINDS:
            raise bad(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        step_part, _, arg_part = when.partition(":")
        repeat = step_part.endswith("+")
        try:
            step = int(plain(step_part.removesuffix("+")))
        except ValueError:
            raise bad(f"step {step_part!r} is not an integer") from None
        if step < 0:
            raise bad("step must be >= 0")
        arg = None
        if kind in SECONDS_KINDS:
            try:
                arg = float(plain(arg_part))
            except ValueError:
                arg = None
            if arg is None or arg != arg:
                raise bad(f"{kind} needs seconds, e.g. 1:{kind}@3:0.5")
            if not 0 <= arg <= 3600:
                raise bad(f"{kind} seconds must be within 0..3600")
        elif kind in FACTOR_KINDS:
            try:
                arg = float(plain(arg_part))
            except ValueError:
                arg = None
            if arg is None or not 1 <= arg <= MAX_FACTOR:
                raise bad(f"{kind} needs a factor from 1 to {MAX_FACTOR:g}, e.g. 1:{kind}@3+:2.5")
        elif arg_part:
            raise bad(f"{kind} takes no argument")
        return Fault(rank, kind, step, repeat, arg, text)

    def format(self) -> str:
        """The fault written from its fields, as Fault.parse reads it back: what a fault changed
        with `_replace` (an earlier step, another rank) is written as (`text` is as it was given)."""
        rank = "all" if self.rank is None else str(self.rank)
        arg = "" if self.arg is None else f":{_seconds_text(self.arg)}"
        return f"{rank}:{self.kind}@{self.step}{'+' * self.repeat}{arg}"



@functools.lru_cache(maxsize=1024)
def _read_kept(text: str, world_size: int | None, source: str) -> Fault:
    return Fault.read(text, world_size, source)

def _seconds_text(seconds: float) -> str:
    """Seconds in their shortest text that reads back the same (0.05, not 0.05000000000000000277)."""
    text = f"{seconds:g}"
    return text if float(text) == seconds else repr(seconds)


def kind_of(text: str) -> str:
    """The KIND of a fault as written (`RANK:KIND@STEP[+][:ARG]`), without parsing the rest: how a
    FIRED's texts and a schedule's faults are told apart by kind."""
    return text.partition(":")[2].partition("@")[0]


def parse_fault(text: str, world_size: int | None = None, source: str = "--fault") -> Fault:
    """One fault spec (Fault.parse); `source` says where it came from in errors."""
    return Fault.parse(text, world_size, source)


def parse_faults(texts, world_size: int, workload_faults=()) -> list[Fault]:
    """The workload's faults (named by their entry in 'faults') and the command line's."""
    return ([parse_fault(t, world_size, f"workload 'faults' entry {i}")
             for i, t in enumerate(workload_faults)]
            + [parse_fault(t, world_size) for t in texts])


# -- acting them out, on the rank ------------------------------------------------------------

class Acting(Protocol):
    """What a rank lends its faults: to stop answering for good, to answer late, and to let
    what it sent leave the process."""

    def hang(self) -> None: ...

    def sleep(self, seconds: float) -> None: ...

    def flush(self) -> None: ...


def _crash(fault: Fault, rank: Acting) -> None:
    rank.flush()          # its replies to earlier steps have left (a plan may queue behind one)
    os.kill(os.getpid(), signal.SIGKILL)


def _exit(fault: Fault, rank: Acting) -> None:
    rank.flush()
    os._exit(0)


def _hang(fault: Fault, rank: Acting) -> None:
    rank.hang()


def _delay(fault: Fault, rank: Acting) -> None:
    rank.sleep(fault.arg)


def _disagree(outcomes: tuple, num_pages: int) -> tuple:
    if not outcomes:
        return outcomes
    return (outcomes[0]._replace(accepted=outcomes[0].accepted + 1),) + outcomes[1:]


def _bad_writes(outcomes: tuple, num_pages: int) -> tuple:
    if not outcomes or not outcomes[0].writes:
        return outcomes
    first = outcomes[0]
    moved = ((first.writes[0] + 1) % num_pages,) + first.writes[1:]
    return (first._replace(writes=moved),) + outcomes[1:]


def _drop_write(outcomes: tuple, shard: SlotStore) -> None:
    """Forget the last page-run the rank wrote (it still reports it)."""
    from inferris_dist.engine.messages import page_spans
    for outcome in reversed(outcomes):
        spans = list(page_spans(outcome.start_position, outcome.executed_tokens, outcome.writes,
                                shard.page_size))
        if spans:
            page, position, offset, length = spans[-1]
            shard.erase_run(page, outcome.request_id, position, offset, length)
            return


def _crash_after_reply(fault: Fault, rank: Acting) -> None:
    rank.flush()                  # the reply has crossed; only then the rank dies, its shard unwritten
    os.kill(os.getpid(), signal.SIGKILL)


def _garble(frames: list[bytes]) -> list[bytes]:
    return [b"\xc1\xc1 not a message \xc1"]


BEFORE = {"crash": _crash, "exit": _exit, "hang": _hang, "delay": _delay}   # before executing
OUTCOMES = {"disagree": _disagree, "bad-writes": _bad_writes}              # what it reports
FRAMES = {"garble": _garble}                                                # what is sent
AGAIN = {"duplicate", "stale"}                                              # sent once more
AFTER_REPLY = {"crash-after-reply": _crash_after_reply}                     # before the writes
AFTER_APPLY = {"drop-write": _drop_write}                                   # on the shard written


class FaultPlan:
    """One rank's faults, acted out around each step it executes."""

    def __init__(self, faults: list[Fault]):
        self.faults = faults
        self.previous: list[bytes] | None = None      # the last result sent (for `stale`)

    def firing(self, step: int) -> dict[str, Fault]:
        """The faults that act on this step's plan. A one-shot fault is spent once it fired:
        a member that is kept through a restore and sent the same step's plan again (a new
        epoch) does not fire it a second time."""
        if not self.faults:
            return {}
        firing = {f.kind: f for f in self.faults if f.fires(step)}
        if firing:
            self.faults = [f for f in self.faults if f.repeat or f.step != step]
        return firing

    def model_time(self, firing: dict[str, Fault], step: int, seconds: float) -> float:
        """The model's time of a step (`seconds`, from --exec-cost) as the time faults make it:
        `slow` multiplies it, `jitter` adds a draw of up to its ARG, the same for the same fault
        text and step (the same run asks for the same times)."""
        if "slow" in firing:
            seconds *= firing["slow"].arg
        if "jitter" in firing:
            jitter = firing["jitter"]
            seconds += random.Random(f"{jitter.text}/{step}").uniform(0.0, jitter.arg)
        return seconds

    def before(self, firing: dict[str, Fault], rank: Acting) -> None:
        for kind, act in BEFORE.items():
            if kind in firing:
                act(firing[kind], rank)

    def outcomes(self, firing: dict[str, Fault], outcomes: tuple, num_pages: int) -> tuple:
        for kind, tamper in OUTCOMES.items():
            if kind in firing:
                outcomes = tamper(outcomes, num_pages)
        return outcomes

    def after_reply(self, firing: dict[str, Fault], rank: Acting) -> None:
        for kind, act in AFTER_REPLY.items():
            if kind in firing:
                act(firing[kind], rank)

    def after_apply(self, firing: dict[str, Fault], outcomes: tuple, shard: SlotStore) -> None:
        for kind, tamper in AFTER_APPLY.items():
            if kind in firing:
                tamper(outcomes, shard)

    def frames(self, firing: dict[str, Fault], frames: list[bytes]) -> list[bytes]:
        for kind, tamper in FRAMES.items():
            if kind in firing:
                frames = tamper(frames)
        return frames

    def sends(self, firing: dict[str, Fault], frames: list[bytes]) -> list[list[bytes]]:
        """What goes out for a step: its frames, and what the faults add after them."""
        out = [frames]
        if "duplicate" in firing:
            out.append(frames)
        if "stale" in firing and self.previous is not None:
            out.append(self.previous)
        self.previous = frames
        return out
