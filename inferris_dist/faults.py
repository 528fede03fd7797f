"""Fault injection: `RANK:KIND@STEP[+][:ARG]`, a first-class input, not a test monkeypatch.

The scheduler parses and validates the specs and hands each rank its own in
the CONFIG message (so they show in the wire log); the worker acts them out
on real processes. `@STEP` fires once in the run, `@STEP+` at that step and
every later one (a replacement worker inherits it, so it keeps coming back).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine import WorkloadError

KINDS = {
    "crash": "kills itself (SIGKILL) on receiving the plan",
    "exit": "exits 0 on receiving the plan",
    "hang": "stops answering, process alive (a busy loop holding the GIL)",
    "delay": "answers ARG seconds late",
    "garble": "replies with bytes that are not a valid message",
    "duplicate": "sends its result twice",
    "stale": "also re-sends its previous step's result",
    "disagree": "reports accepted+1 on its first item",
    "bad-writes": "reports a write off its placement",
    "drop-write": "reports a write but does not store it in its shard",
}
FORMAT = "RANK:KIND@STEP[+][:ARG]"
POLICIES = ("abort", "restore", "recompute")     # what follows a failed step (recovery.py)


@dataclass(frozen=True)
class Fault:
    rank: int | None          # None: every rank
    kind: str
    step: int
    repeat: bool              # @STEP+: this step and every later one
    arg: float | None = None
    text: str = ""

    def fires(self, step: int) -> bool:
        return step == self.step or (self.repeat and step > self.step)

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank

    def __str__(self) -> str:
        return self.text


def parse_fault(text: str, world_size: int | None = None, source: str = "--fault") -> Fault:
    """One fault spec; `source` says where it came from in errors (the flag, or the workload)."""
    def bad(why: str) -> WorkloadError:
        return WorkloadError(f"{source} {text!r}: {why} (want {FORMAT}, e.g. 1:crash@3 or all:delay@2+:0.5)")

    rank_part, sep, rest = text.partition(":")
    if not sep:
        raise bad("no ':' after the rank")
    if rank_part == "all":
        rank = None
    else:
        try:
            rank = int(rank_part)
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
        step = int(step_part.removesuffix("+"))
    except ValueError:
        raise bad(f"step {step_part!r} is not an integer") from None
    if step < 0:
        raise bad("step must be >= 0")
    arg = None
    if kind == "delay":
        try:
            arg = float(arg_part)
        except ValueError:
            raise bad("delay needs seconds, e.g. 1:delay@3:0.5") from None
        if not 0 <= arg <= 3600:
            raise bad("delay seconds must be within 0..3600")
    elif arg_part:
        raise bad(f"{kind} takes no argument")
    return Fault(rank, kind, step, repeat, arg, text)


def parse_faults(texts, world_size: int, workload_faults=()) -> list[Fault]:
    """The workload's faults (named by their entry in 'faults') and the command line's."""
    return ([parse_fault(t, world_size, f"workload 'faults' entry {i}")
             for i, t in enumerate(workload_faults)]
            + [parse_fault(t, world_size) for t in texts])
