"""Exploring fault schedules: draw them from a seed, run each on real processes, judge it, count.

    config = ChaosConfig([("demo", workload)], seed=7, policies=("restore", "recompute"))
    report = explore(config, runs=40)               # or seconds=60; shard=(K, N)
    report.breaks                                  # each: the schedule, the break, its index

Schedule `i` runs the `i mod C`-th of the C combinations of workload, rung, policy and world
size (so every combination gets its share), with faults drawn from schedule i's own generator
(schedules.generator). `shard=(K, N)` runs only the schedules `i` with `i mod N == K`: the N
shards of a seed together are exactly the unsharded run, and their reports merge
(`merge_reports`) into its table.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from inferris_dist.chaos.harness import DEFAULT_STEP_TIMEOUT, Outcome, Session
from inferris_dist.chaos.schedules import (
    Schedule,
    draw_faults,
    fault_kinds,
    generator,
    parse_kind_weights,
    workload_key,
)
from inferris_dist.chaos.verdicts import CHAOS_POLICIES as POLICIES
from inferris_dist.engine import Workload, WorkloadError
from inferris_dist.protocol.faults import kind_of

REPORT_VERSION = 1


@dataclass
class ChaosConfig:
    """What to explore: the workloads (name, workload), the rungs, policies and world sizes
    (None: each workload's own), the fault kinds by weight (None: every kind, alike), how many
    faults at most, and the launch's step timeout and restart budget."""
    workloads: list[tuple[str, Workload]]
    seed: int = 0
    rungs: tuple[str, ...] = ("full",)
    policies: tuple[str, ...] = ("restore", "recompute")
    world_sizes: tuple[int, ...] | None = None
    kinds: dict[str, float] | None = None
    max_faults: int = 3
    step_timeout: float = DEFAULT_STEP_TIMEOUT
    max_restarts: int = 3
    random_workloads: bool = False          # the workloads were drawn from the seed (for the report)

    def __post_init__(self) -> None:
        if not self.workloads:
            raise WorkloadError("no workload to explore")
        self.kinds = parse_kind_weights(None) if self.kinds is None else dict(self.kinds)
        infos = fault_kinds()
        unknown = [k for k in self.kinds if k not in infos]
        if unknown:
            raise WorkloadError(f"unknown fault kind {unknown[0]!r}; kinds: {', '.join(infos)}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise WorkloadError(f"unknown policy {bad[0] if bad else ''!r}; one of {', '.join(POLICIES)}")
        if not 1 <= self.max_faults <= 64:
            raise WorkloadError(f"--max-faults must be within 1..64, got {self.max_faults}")
        from inferris_dist.engine.rungs import rung as rung_named
        from inferris_dist.scheduler.options import MAX_RESTARTS
        if not 0 <= self.max_restarts <= MAX_RESTARTS:
            raise WorkloadError(f"--max-restarts must be within 0..{MAX_RESTARTS}, got {self.max_restarts}")
        for r in self.rungs:
            rung_named(r)
        for n in self.world_sizes or ():
            if not 1 <= n <= 256:
                raise WorkloadError(f"--world-size {n} is outside 1..256")

    @property
    def by_name(self) -> dict[str, Workload]:
        return dict(self.workloads)

    def combinations(self) -> list[tuple[str, str, str, int]]:
        """(workload, rung, policy, world size), in the order schedules take them."""
        out = []
        for name, workload in self.workloads:
            for rung in self.rungs:
                for policy in self.policies:
                    for n in self.world_sizes or (workload.config.world_size,):
                        out.append((name, rung, policy, n))
        return out

    def to_json(self) -> dict:
        """What two reports must share to be merged: everything but the shard."""
        return {"workloads": [{"name": name, "requests": len(w.requests),
                               "digest": hashlib.sha256(workload_key(w).encode()).hexdigest()[:16]}
                              for name, w in self.workloads],
                "random_workloads": self.random_workloads, "rungs": list(self.rungs),
                "policies": list(self.policies),
                "world_sizes": None if self.world_sizes is None else list(self.world_sizes),
                "kinds": self.kinds, "max_faults": self.max_faults, "step_timeout": self.step_timeout,
                "max_restarts": self.max_restarts}


def schedule_at(config: ChaosConfig, index: int, steps_of: Callable[[Workload, str], int]) -> Schedule:
    """Schedule `index` of the config's seed (`steps_of(workload, rung)`: the reference's steps)."""
    combos = config.combinations()
    name, rung, policy, n = combos[index % len(combos)]
    steps = steps_of(config.by_name[name], rung)
    faults = draw_faults(generator(config.seed, index), steps, n, config.kinds, config.max_faults,
                         config.step_timeout)
    if policy != "pause":
        return Schedule(index, name, rung, policy, n, faults)
    from inferris_dist.chaos.operators import draw_operator
    moves, default = draw_operator(generator(config.seed, index, "operator"), len(faults))
    return Schedule(index, name, rung, policy, n, faults, moves, default)


def shard_indices(shard: tuple[int, int], runs: int | None) -> Iterator[int]:
    """The schedule indices of shard K of N: K, K+N, K+2N, ... (below `runs`, if given)."""
    k, n = shard
    i = k
    while runs is None or i < runs:
        yield i
        i += n


@dataclass
class BreakRecord:
    index: int
    schedule: Schedule
    kind: str
    reason: str
    shrunk: dict | None = None          # the shrinker's result, as JSON (shrink.Shrunk.to_json)

    def to_json(self) -> dict:
        return {"index": self.index, "schedule": self.schedule.to_json(), "class": self.kind,
                "reason": self.reason, "shrunk": self.shrunk}

    @classmethod
    def from_json(cls, obj: dict) -> "BreakRecord":
        return cls(int(obj["index"]), Schedule.from_json(obj["schedule"]), obj["class"], obj["reason"],
                   obj.get("shrunk"))


@dataclass
class Report:
    """An exploration's result: the runs, the breaks, the table kind x policy x rung, coverage."""
    config: dict
    seed: int
    shard: tuple[int, int] | None = (0, 1)     # None: shards merged, not all of them
    runs: int = 0
    held: int = 0
    seconds: float = 0.0
    breaks: list[BreakRecord] = field(default_factory=list)
    cells: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)   # -> [runs, breaks]
    totals: dict[tuple[str, str], list[int]] = field(default_factory=dict)       # (policy, rung) -> same
    fired: set[str] = field(default_factory=set)
    shards: list[tuple[int, int]] = field(default_factory=list)    # merged from (empty: this one)
    last: Schedule | None = None

    @property
    def kinds(self) -> list[str]:
        return list(self.config["kinds"])

    @property
    def never_fired(self) -> list[str]:
        return [k for k in self.kinds if k not in self.fired]

    @property
    def broke(self) -> int:
        return len(self.breaks)

    def add(self, outcome: Outcome) -> None:
        s = outcome.schedule
        self.runs += 1
        self.held += outcome.held
        self.last = s
        for kind in dict.fromkeys(kind_of(f) for f in s.faults):
            cell = self.cells.setdefault((kind, s.policy, s.rung), [0, 0])
            cell[0] += 1
            cell[1] += not outcome.held
        total = self.totals.setdefault((s.policy, s.rung), [0, 0])
        total[0] += 1
        total[1] += not outcome.held
        self.fired |= set(outcome.fired)
        if outcome.brk is not None:
            self.breaks.append(BreakRecord(s.index, s, outcome.brk.kind, outcome.brk.reason))

    def table_rows(self) -> list[dict]:
        return [{"kind": k, "policy": p, "rung": r, "runs": v[0], "breaks": v[1]}
                for (k, p, r), v in sorted(self.cells.items(), key=lambda x: self._order(x[0]))]

    def _order(self, key: tuple[str, str, str]) -> tuple:
        kinds, policies, rungs = self.kinds, self.config["policies"], self.config["rungs"]
        k, p, r = key
        return (kinds.index(k) if k in kinds else len(kinds), policies.index(p) if p in policies else 9,
                rungs.index(r) if r in rungs else 9)

    def to_json(self) -> dict:
        shard = None if self.shard is None else {"index": self.shard[0], "count": self.shard[1]}
        return {"report": "inferris-dist chaos", "version": REPORT_VERSION, "seed": self.seed,
                "shard": shard, "merged_shards": [list(s) for s in self.shards] or None,
                "config": self.config, "runs": self.runs, "held": self.held, "broke": self.broke,
                "seconds": round(self.seconds, 3), "breaks": [b.to_json() for b in self.breaks],
                "table": self.table_rows(),
                "totals": [{"policy": p, "rung": r, "runs": v[0], "breaks": v[1]}
                           for (p, r), v in sorted(self.totals.items(),
                                                   key=lambda x: self._order(("", *x[0])))],
                "coverage": {"fired": [k for k in self.kinds if k in self.fired],
                             "never_fired": self.never_fired}}

    @classmethod
    def from_json(cls, obj: dict) -> "Report":
        """A report as `to_json` wrote it; WorkloadError naming the first field that is missing, of
        the wrong type, out of range, or at odds with the others (held + broke = runs, a shard
        K < N, every break's schedule in its shard, the totals adding up to the runs)."""
        if not isinstance(obj, dict) or obj.get("report") != "inferris-dist chaos":
            raise WorkloadError("not a report of inferris-dist chaos --json")
        if obj.get("version") != REPORT_VERSION:
            raise WorkloadError(f"a report of version {obj.get('version')!r}; this reads version "
                                f"{REPORT_VERSION}")
        f = _Fields(obj)
        runs = f.count("runs")
        shard = None if f.get("shard", (dict, type(None))) is None else f.shard("shard")
        merged = [f.shard(f"merged_shards[{i}]", pair)
                  for i, pair in enumerate(f.get("merged_shards", (list, type(None))) or ())]
        breaks = []
        for i, b in enumerate(f.get("breaks", list)):
            if not isinstance(b, dict):
                raise WorkloadError(f"a report whose breaks[{i}] is {_shown(b)}: want an object")
            _Fields(b, f"breaks[{i}].").count("index")
            try:
                record = BreakRecord.from_json(b)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise WorkloadError(f"a report whose breaks[{i}] is not a break ({type(e).__name__}: "
                                    f"{e})") from None
            if shard is not None and not merged and record.index % shard[1] != shard[0]:
                raise WorkloadError(f"a report whose breaks[{i}].index {record.index} is not a schedule "
                                    f"of shard {shard[0]}/{shard[1]}")
            breaks.append(record)
        held = f.count("held")
        broke = f.count("broke")
        if broke != len(breaks):
            raise WorkloadError(f"a report whose broke ({broke}) is not the number of its breaks "
                                f"({len(breaks)})")
        if held + broke != runs:
            raise WorkloadError(f"a report whose held ({held}) and broke ({broke}) do not add up to its "
                                f"runs ({runs})")
        cells = f.cells("table", ("kind", "policy", "rung"), runs)
        totals = f.cells("totals", ("policy", "rung"), runs)
        if [sum(v[0] for v in totals.values()), sum(v[1] for v in totals.values())] != [runs, broke]:
            raise WorkloadError(f"a report whose totals do not add up to its runs ({runs}) and breaks "
                                f"({broke})")
        coverage = f.get("coverage", dict)
        fired = _Fields(coverage, "coverage.").get("fired", list)
        if not all(isinstance(k, str) for k in fired):
            raise WorkloadError("a report whose coverage.fired is not a list of kinds")
        seconds = f.get("seconds", (int, float))
        if isinstance(seconds, bool) or not 0 <= seconds <= MAX_SECONDS:
            raise WorkloadError(f"a report whose seconds is {seconds!r}: want 0..{MAX_SECONDS}")
        seed = f.get("seed", int)
        if isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise WorkloadError(f"a report whose seed is {seed!r}: want a whole number within 0..2**63-1")
        return cls(f.get("config", dict), seed, shard, runs, held, float(seconds), breaks, cells, totals,
                   set(fired), merged)


MAX_COUNT = 10**12          # runs (or breaks) a report may count: far beyond any exploration
MAX_SECONDS = 10.0**9
MAX_SHARDS = 10**6


class _Fields:
    """A report's fields read and checked, each refusal one line naming the field."""

    def __init__(self, obj: dict, prefix: str = "") -> None:
        self.obj, self.prefix = obj, prefix

    def get(self, name: str, types):
        if name not in self.obj:
            raise WorkloadError(f"a report without {self.prefix}{name}")
        value = self.obj[name]
        if not isinstance(value, types):
            want = " or ".join("null" if t is type(None) else {"dict": "object", "list": "array"}.get(
                t.__name__, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))
            raise WorkloadError(f"a report whose {self.prefix}{name} is {_shown(value)}: want {want}")
        return value

    def count(self, name: str, shown: str | None = None, limit: int = MAX_COUNT) -> int:
        value = self.obj.get(name)
        if type(value) is not int or not 0 <= value <= limit:
            missing = name not in self.obj
            raise WorkloadError(f"a report {'without' if missing else 'whose'} {shown or self.prefix + name}"
                                + ("" if missing else f" is {_shown(value)}")
                                + f": want a whole number within 0..{limit}")
        return value

    def shard(self, name: str, value=None) -> tuple[int, int]:
        value = self.obj[name] if value is None else value
        if isinstance(value, list) and len(value) == 2:
            value = {"index": value[0], "count": value[1]}
        if not isinstance(value, dict):
            raise WorkloadError(f"a report whose {name} is {_shown(value)}: want a shard")
        f = _Fields(value, f"{name}.")
        count = f.count("count", limit=MAX_SHARDS)
        index = f.count("index", limit=MAX_SHARDS)
        if not index < count or count < 1:
            raise WorkloadError(f"a report whose {name} is {index} of {count}: want K/N with 0 <= K < N")
        return index, count

    def cells(self, name: str, keys: tuple[str, ...], runs: int) -> dict:
        out = {}
        for i, row in enumerate(self.get(name, list)):
            if not isinstance(row, dict):
                raise WorkloadError(f"a report whose {name}[{i}] is {_shown(row)}: want an object")
            f = _Fields(row, f"{name}[{i}].")
            key = tuple(f.get(k, str) for k in keys)
            cell = [f.count("runs", limit=runs), f.count("breaks")]
            if cell[1] > cell[0]:
                raise WorkloadError(f"a report whose {name}[{i}] has more breaks ({cell[1]}) than runs "
                                    f"({cell[0]})")
            out[key] = cell
        return out


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) or value == value else "NaN"
    return text if len(text) <= 40 else text[:37] + "..."


def explore(config: ChaosConfig, *, runs: int | None = None, seconds: float | None = None,
            shard: tuple[int, int] = (0, 1), session: Session | None = None,
            engine_class: type | None = None, checkers: Sequence | None = None,
            on_run: Callable[[Outcome, Report], None] | None = None, stop_on_break: bool = False) -> Report:
    """Run the config's schedules (`runs` of the unsharded sequence, or as many as fit in
    `seconds`; only shard K of N's) on real processes, each judged (harness.Session.run); the
    report. `session`: one to reuse (else one is made here, with the config's step timeout and
    restart budget, `engine_class` and `checkers`, and closed at the end). `on_run(outcome,
    report)` is told of every run as it ends; `stop_on_break`: stop at the first break."""
    if runs is None and seconds is None:
        raise WorkloadError("give a number of runs or a time to explore for")
    k, n = shard
    if not (n >= 1 and 0 <= k < n):
        raise WorkloadError(f"--shard {k}/{n}: want K/N with 0 <= K < N")
    own = session is None
    if own:
        session = Session(step_timeout=config.step_timeout, max_restarts=config.max_restarts,
                          checkers=checkers, engine_class=engine_class)
    report = Report({**config.to_json(), "schedules": runs, "time": seconds}, config.seed, shard)
    started = time.monotonic()
    try:
        if own:
            session.__enter__()
        for index in shard_indices(shard, runs):
            if seconds is not None and time.monotonic() - started >= seconds:
                break
            schedule = schedule_at(config, index, lambda w, r: session.reference(w, r).steps)
            outcome = session.run(config.by_name[schedule.workload], schedule)
            report.add(outcome)
            report.seconds = time.monotonic() - started
            if on_run is not None:
                on_run(outcome, report)
            if stop_on_break and report.breaks:
                break
    finally:
        report.seconds = time.monotonic() - started
        if own:
            session.close()
    return report


def merge_reports(reports: Sequence[Report]) -> Report:
    """Shards of one exploration joined into one report; WorkloadError (bad input) for reports
    of different seeds or configurations, or the same shard twice."""
    if not reports:
        raise WorkloadError("no report to merge")
    first = reports[0]
    for other in reports[1:]:
        if other.seed != first.seed:
            raise WorkloadError(f"reports of different seeds ({first.seed} and {other.seed}) do not merge")
        if other.config != first.config:
            differs = next(k for k in dict.fromkeys([*first.config, *other.config])
                           if first.config.get(k) != other.config.get(k))
            raise WorkloadError(f"reports of different configurations do not merge ({differs!r} differs)")
    shards: list[tuple[int, int]] = []
    for r in reports:
        for s in r.shards or [r.shard]:
            if s in shards:
                raise WorkloadError(f"shard {s[0]}/{s[1]} is given twice")
            if shards and s[1] != shards[0][1]:
                raise WorkloadError(f"shards of {shards[0][1]} and of {s[1]} do not merge")
            shards.append(s)
    complete = len(shards) == shards[0][1]
    merged = Report(first.config, first.seed, (0, 1) if complete else None)
    merged.shards = sorted(shards)
    for r in reports:
        merged.runs += r.runs
        merged.held += r.held
        merged.seconds = max(merged.seconds, r.seconds)
        merged.breaks += r.breaks
        merged.fired |= r.fired
        for into, cells in ((merged.cells, r.cells), (merged.totals, r.totals)):
            for key, (runs, breaks) in cells.items():
                cell = into.setdefault(key, [0, 0])
                cell[0] += runs
                cell[1] += breaks
    merged.breaks.sort(key=lambda b: b.index)
    return merged
