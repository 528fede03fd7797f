"""Fault schedules drawn from a seed, and small random workloads to run them on.

A schedule is what one chaos run breaks and how: the workload, the rung, the policy, the world
size and one to a few faults (`RANK:KIND@STEP[+][:ARG]`, docs/faults.md). Schedule `i` of a
seed is drawn from its own generator (`random.Random(f"{seed}/{i}")`), so it is the same
whoever draws it, in whatever order, on whatever machine: that is what lets `--shard K/N` give
each machine the schedules `i` with `i mod N == K`, and a break be run again from its index.

The fault kinds are read from `inferris_dist.protocol.faults.KINDS` when a schedule is drawn,
never listed here, and so is what each kind takes after its step: the fault parser is asked
(`fault_kinds()`), so a kind added there is drawn here with no change.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from typing import Mapping

from inferris_dist.engine import Engine, EngineError, Workload, WorkloadError, load_workload

# How often the drawing does the rarer things (each a probability).
SEVERAL_RANKS = 0.15     # one fault on several ranks at once (one spec per rank, the same kind and step)
ALL_RANKS = 0.12         # on every rank (`all`)
NEAR_STEP = 0.35         # a second fault at the same step as an earlier one, or next to it
REPEATING = 0.05         # `@STEP+`: this step and every later one
LONG_ARG = 0.5           # an argument in seconds past the step deadline, rather than well inside it


@dataclass(frozen=True)
class KindInfo:
    """A fault kind and what it takes after its step: nothing, seconds, or a count."""
    name: str
    arg: str | None          # None, "seconds" or "count"


def fault_kinds() -> dict[str, KindInfo]:
    """Every kind of the fault grammar, read now, with what it takes: the parser is asked (a kind
    that takes nothing parses bare; one that needs seconds parses with `:0.05`). A kind the
    parser takes in neither form is left out (it cannot be drawn without knowing more)."""
    from inferris_dist.protocol import faults
    out = {}
    for kind in faults.KINDS:
        arg = _arg_of(faults.parse_fault, kind)
        if arg != "unknown":
            out[kind] = KindInfo(kind, arg)
    return out


def _arg_of(parse, kind: str) -> str | None:
    def parses(text: str) -> bool:
        try:
            parse(text, 2)
        except (WorkloadError, ValueError):
            return False
        return True
    if parses(f"0:{kind}@1"):
        return None
    if parses(f"0:{kind}@1:0.05"):
        return "seconds"
    if parses(f"0:{kind}@1:1"):
        return "count"
    return "unknown"


def parse_kind_weights(text: str | None, kinds: Mapping[str, KindInfo] | None = None) -> dict[str, float]:
    """`crash,hang` or `crash=3,hang=1` (a weight each, default 1) -> {kind: weight}; None or ""
    -> every kind, weight 1. An unknown kind or a bad weight is a WorkloadError naming it."""
    kinds = fault_kinds() if kinds is None else kinds
    if not text:
        return {k: 1.0 for k in kinds}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in kinds:
            raise WorkloadError(f"--kinds: unknown kind {name!r}; kinds: {', '.join(kinds)}")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            w = -1.0
        if not 0 < w <= 1e6:
            raise WorkloadError(f"--kinds: the weight of {name} must be a number > 0, got {weight!r}")
        out[name] = w
    return out


@dataclass(frozen=True)
class Schedule:
    """One run to make: which workload (by name), rung, policy, world size, and the faults; under
    pause, the operator's moves and what its pause timeout applies (chaos/operators.py)."""
    index: int
    workload: str
    rung: str
    policy: str
    world_size: int
    faults: tuple[str, ...]
    operator: tuple[str, ...] = ()
    pause_default: str = "abort"

    def to_json(self) -> dict:
        out = asdict(self)
        out["faults"] = list(self.faults)
        out["operator"] = list(self.operator)
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "Schedule":
        return cls(int(obj["index"]), str(obj["workload"]), str(obj["rung"]), str(obj["policy"]),
                   int(obj["world_size"]), tuple(obj["faults"]), tuple(obj.get("operator", ())),
                   str(obj.get("pause_default", "abort")))

    def __str__(self) -> str:
        said = (f"{self.workload} {self.rung} {self.policy} world size {self.world_size}: "
                f"{' '.join(self.faults)}")
        if self.operator:
            said += f"; operator {' '.join(self.operator)} (its timeout: {self.pause_default})"
        return said


def generator(seed: int, index: int, what: str = "schedule") -> random.Random:
    """The generator of schedule (or workload) `index` of `seed`: independent of every other."""
    return random.Random(f"{seed}/{what}/{index}")


def draw_faults(rng: random.Random, steps: int, world_size: int, kinds: Mapping[str, float],
                max_faults: int, step_timeout: float, infos: Mapping[str, KindInfo] | None = None
                ) -> tuple[str, ...]:
    """One to `max_faults` fault specs inside a run of `steps` steps on `world_size` ranks,
    kinds drawn by weight; sometimes on several ranks or on all, sometimes at the same step as
    another or the next, rarely repeating. Distinct specs, in the order drawn."""
    infos = fault_kinds() if infos is None else infos
    names = [k for k in kinds if k in infos]
    weights = [kinds[k] for k in names]
    if not names:
        raise WorkloadError("no fault kind to draw from")
    last_step = max(0, steps - 1)
    want = rng.randint(1, max(1, max_faults))
    out: list[str] = []
    steps_used: list[int] = []
    tries = 0
    while len(out) < want and tries < 50:
        tries += 1
        kind = rng.choices(names, weights)[0]
        if steps_used and rng.random() < NEAR_STEP:
            step = min(last_step, max(0, rng.choice(steps_used) + rng.choice((0, 0, 1, -1))))
        else:
            step = rng.randint(0, last_step)
        repeat = "+" if rng.random() < REPEATING else ""
        arg = _draw_arg(rng, infos[kind].arg, step_timeout)
        roll = rng.random()
        if world_size > 1 and roll < ALL_RANKS:
            ranks: list[str] = ["all"]
        elif world_size > 2 and roll < ALL_RANKS + SEVERAL_RANKS:
            ranks = [str(r) for r in sorted(rng.sample(range(world_size), rng.randint(2, world_size - 1)))]
        else:
            ranks = [str(rng.randrange(world_size))]
        for rank in ranks[:want - len(out)]:
            spec = f"{rank}:{kind}@{step}{repeat}{arg}"
            if spec not in out and _parses(spec, world_size) and not _unanimous(out + [spec], world_size):
                out.append(spec)
        steps_used.append(step)
    return tuple(out)


def _unanimous(specs: list[str], world_size: int) -> bool:
    """A lie every rank tells alike at one step: exact agreement cannot see it (the ranks are the
    model; nothing else knows what it should have said), so it is no schedule to judge a policy
    by (docs/chaos.md says so). A repeating lie counts at every step from its own."""
    from inferris_dist.protocol.faults import parse_fault
    lies = [f for f in (parse_fault(s, world_size) for s in specs) if f.kind == "disagree"]
    for at in {f.step for f in lies}:
        ranks: set[int] = set()
        for f in lies:
            if f.fires(at):
                ranks |= set(range(world_size)) if f.rank is None else {f.rank}
        if len(ranks) >= world_size:
            return True
    return False


def _parses(spec: str, world_size: int) -> bool:
    from inferris_dist.protocol.faults import parse_fault
    try:
        parse_fault(spec, world_size)
    except (WorkloadError, ValueError):
        return False
    return True


def _draw_arg(rng: random.Random, arg: str | None, step_timeout: float) -> str:
    if arg is None:
        return ""
    if arg == "count":
        return f":{rng.choice((1, 2))}"
    if rng.random() < LONG_ARG:            # past the deadline: the rank is lost
        return f":{_seconds(step_timeout * 1.5 + 0.05)}"
    return f":{_seconds(min(0.05, step_timeout / 10))}"   # well inside it: tolerated


def _seconds(value: float) -> str:
    return f"{round(value, 3):g}"


# -- small random workloads ---------------------------------------------------------------------

def random_workload(rng: random.Random, name: str = "random") -> dict:
    """A small valid workload (docs/cli.md's format): a few requests, sometimes sharing a prompt
    prefix, sometimes speculating, a pool that holds them; two to four ranks."""
    spec_len = rng.choice((0, 0, 1, 2, 3))
    page_size = rng.choice((2, 4))
    requests = []
    prefix = [rng.randrange(1, 50) for _ in range(rng.choice((0, page_size, 2 * page_size)))]
    for i in range(rng.randint(1, 4)):
        own = [rng.randrange(50, 500) for _ in range(rng.randint(1, 6))]
        request = {"request_id": f"q{i}", "max_new_tokens": rng.randint(1, 5),
                   "arrival_step": rng.choice((0, 0, 1, 2, 3))}
        if prefix and rng.random() < 0.7:
            request["tokens"] = prefix + own
        else:
            request["prompt_len"] = len(own) + rng.randint(0, 4)
        if rng.random() < 0.2:
            request["eos_after"] = rng.randint(0, request["max_new_tokens"])
        if spec_len and rng.random() < 0.5:
            request["accept_script"] = [rng.randint(0, spec_len) for _ in range(rng.randint(1, 3))]
        requests.append(request)
    def prompt(r: dict) -> int:
        return len(r["tokens"]) if "tokens" in r else r["prompt_len"]
    need = sum(-(-(prompt(r) + r["max_new_tokens"] + spec_len) // page_size) for r in requests)
    engine = {"max_step_tokens": rng.choice((4, 6, 8, 12, 16)), "page_size": page_size,
              "num_pages": need + rng.randint(1, 4), "spec_len": spec_len,
              "world_size": rng.randint(2, 4)}
    return {"engine": engine, "requests": requests}


def random_workloads(seed: int, count: int = 8) -> list[tuple[str, Workload]]:
    """`count` small workloads drawn from `seed`, each one the in-process engine runs to the end
    without an error (a draw it cannot run is drawn again)."""
    out = []
    for i in range(count):
        rng = generator(seed, i, "workload")
        for _ in range(20):
            workload = load_workload(random_workload(rng))
            try:
                lines = list(_steps(workload))
            except EngineError:
                continue
            if 1 <= len(lines) <= 60:
                break
        out.append((f"random-{i}", workload))
    return out


def _steps(workload: Workload):
    engine = Engine(workload)
    for trace in engine.run():
        yield trace


def workload_key(workload: Workload) -> str:
    """The workload as one JSON text (world size left out: every world size has the same trace)."""
    obj = workload.with_config(world_size=1).to_dict()
    obj.pop("faults", None)
    return json.dumps(obj, sort_keys=True)
