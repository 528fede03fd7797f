"""`inferris-dist chaos`: fault schedules drawn from a seed, run on real processes, each judged by
its policy's promise; a break shrunk to a reproducer. `inferris-dist chaos merge`: shards' reports
joined. The exploring, judging and shrinking are inferris_dist.testing's (docs/chaos.md)."""
from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
from pathlib import Path

from inferris_dist.chaos.harness import DEFAULT_STEP_TIMEOUT
from inferris_dist.chaos.verdicts import CHAOS_POLICIES as POLICIES
from inferris_dist.chaos.verdicts import PROMISE_KINDS
from inferris_dist.cli import render
from inferris_dist.cli.args import EXIT_FAILED, EXIT_OK, UsageError, int_arg
from inferris_dist.cli.flags import add_knob_flags, add_max_restarts, add_step_timeout, add_workload_flags
from inferris_dist.cli.workload_source import workload_from_flags
from inferris_dist.engine import EngineError, WorkloadError
from inferris_dist.engine.rungs import NAMES as RUNG_NAMES
from inferris_dist.protocol.faults import LINK_KINDS
from inferris_dist.protocol.limits import usable_cores

DEFAULT_RUNS = 100


def main(args) -> int:
    return run_chaos(args)


def add_arguments(p) -> None:
    """chaos's flags, on its parser (its line in --help is the command line's)."""
    p.description = ("Draw fault schedules from --seed, run each on real worker processes and\n"
                     "judge it: restore keeps the trace, recompute the summary, abort fails naming a\n"
                     "faulted rank; nothing is left running. A break is shrunk to a reproducer (an\n"
                     "`inferris-dist compare` command and its workload file). `inferris-dist chaos\n"
                     "merge REPORT...` joins the --json reports of shards (docs/chaos.md).")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    g = add_workload_flags(p, knobs=(), title="workloads (default: the built-in demo)")
    g.add_argument("--random-workloads", action="store_true",
                   help="eight small workloads drawn from the seed instead (a few requests, shared "
                        "prefixes, speculation sometimes)")
    add_knob_flags(g, ("max-step-tokens", "page-size", "num-pages", "spec-len"))   # --world-size: below
    e = p.add_argument_group("what to explore")
    e.add_argument("--runs", type=int_arg, metavar="N",
                   help=f"schedules to run (of the unsharded sequence; default {DEFAULT_RUNS})")
    e.add_argument("--time", type=duration_arg, metavar="DURATION",
                   help="run schedules until this much time has passed (60, 60s, 2m, 1h)")
    e.add_argument("--seed", type=int_arg, metavar="S",
                   help="the seed every schedule is drawn from (default: one drawn now, and printed)")
    e.add_argument("--rung", type=_list_of(RUNG_NAMES, "rung"), default=("full",), metavar="R[,R]",
                   help=f"rungs of the ladder (default full; {', '.join(RUNG_NAMES)})")
    e.add_argument("--policy", type=_list_of(POLICIES, "policy"), default=("restore", "recompute"),
                   metavar="P[,P]", help="recovery policies (default restore,recompute; also abort, shrink, "
                        "regrow: shrink with --regrow, pause: a scripted operator answers)")
    e.add_argument("--world-size", type=_int_list, metavar="N[,N]",
                   help="world sizes (default: each workload's own)")
    e.add_argument("--kinds", metavar="KIND[=W],...",
                   help="fault kinds to draw, each with a weight (default: every kind, alike)")
    e.add_argument("--max-faults", type=int_arg, default=3, metavar="K",
                   help="at most this many faults in a schedule (default 3)")
    e.add_argument("--worker", metavar="'COMMAND'",
                   help="run every schedule on COMMAND, a worker that speaks docs/protocol.md "
                        "({connect}, {rank}, {world_size}; the run secret on stdin): the link's kinds "
                        "only, unless --profile faults says it acts out the rank's kinds too")
    e.add_argument("--profile", choices=("faults",),
                   help="with --worker: the worker implements protocol.md's faults profile, so every "
                        "kind is drawn")
    add_step_timeout(e, why="; a hang costs this much",
                     derived="derived from the workload's steps, measured before the schedules: "
                             f"100x the median step, within 0.1..1 s; with --shard, {DEFAULT_STEP_TIMEOUT:g}")
    add_max_restarts(e)
    e.add_argument("--jobs", type=int_arg, metavar="N",
                   help="run N worlds at once, each a shard of the schedules (default: one per core, "
                        f"at most one per {RUNS_PER_JOB} schedules; 1 with --shard); the report does not "
                        "depend on N")
    e.add_argument("--shard", type=shard_arg, default=(0, 1), metavar="K/N",
                   help="run only the schedules i with i mod N == K (0 <= K < N); merge the shards' "
                        "--json reports with `inferris-dist chaos merge`")
    o = p.add_argument_group("output and shrinking")
    o.add_argument("--json", action="store_true", help="one JSON object at the end (docs/chaos.md)")
    o.add_argument("--out", metavar="DIR",
                   help="where reproducers go (default: a fresh chaos-seed-S directory here, made "
                        "only when something broke); no existing file is overwritten")
    o.add_argument("--no-shrink", action="store_true", help="report breaks without shrinking them")
    o.add_argument("--max-shrinks", type=int_arg, default=3, metavar="N",
                   help="shrink the first break of each class, at most N of them (default 3)")
    o.add_argument("--shrink-runs", type=int_arg, default=60, metavar="N",
                   help="runs one shrinking may make (default 60)")
    o.add_argument("--shrink-time", type=duration_arg, default=60.0, metavar="DURATION",
                   help="time one shrinking may take (default 60s)")
    o.add_argument("--reruns", type=int_arg, default=5, metavar="N",
                   help="times each reproducer is run again to see how often it breaks (default 5)")
    sub2 = p.add_subparsers(dest="chaos_command", metavar="merge")
    m = sub2.add_parser("merge", help="join the --json reports of shards of one exploration into one table")
    m.add_argument("reports", nargs="+", metavar="REPORT", help="files written by chaos --json")
    m.add_argument("--json", action="store_true", dest="merge_json", help="the merged report as JSON")


def duration_arg(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|h)?\s*", text or "")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)] if m else 0.0
    if not 0 < value <= 86400 * 30:
        raise argparse.ArgumentTypeError(f"want a duration: seconds, or with s, m or h (60, 60s, 2m), "
                                         f"got {text!r}")
    return value


def shard_arg(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not (int(m.group(2)) >= 1 and int(m.group(1)) < int(m.group(2))):
        raise argparse.ArgumentTypeError(f"want K/N with 0 <= K < N (e.g. 0/4), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _list_of(allowed, what: str):
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad[0] if bad else text!r}; "
                                             f"one or more of {', '.join(allowed)}, comma-separated")
        return tuple(dict.fromkeys(items))
    return parse


def _int_list(text: str) -> tuple[int, ...]:
    try:
        items = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want world sizes, comma-separated (2,4), got {text!r}") from None
    if any(not 1 <= n <= 256 for n in items):
        raise argparse.ArgumentTypeError(f"a world size must be within 1..256, got {text!r}")
    return tuple(dict.fromkeys(items))


# -- chaos ------------------------------------------------------------------------------------------

def run_chaos(args) -> int:
    if args.chaos_command == "merge":
        return run_merge(args.reports, args.merge_json)
    from inferris_dist.chaos.harness import Session
    from inferris_dist.chaos.schedules import parse_kind_weights, random_workloads
    if args.runs is not None and args.time is not None:
        raise UsageError("inferris-dist chaos: --runs and --time are exclusive: give one")
    if args.runs is not None and args.runs < 1:
        raise UsageError("inferris-dist chaos: --runs must be >= 1")
    if args.random_workloads and (args.spec is not None or args.request):
        raise UsageError("inferris-dist chaos: --random-workloads and --spec/--request are exclusive")
    for name in ("max_shrinks", "shrink_runs", "reruns"):
        if getattr(args, name) < 0:
            raise UsageError(f"inferris-dist chaos: --{name.replace('_', '-')} must be >= 0")
    if args.out is not None:              # before the exploration, not after: its report stays
        from inferris_dist.chaos.shrinking import unwritable
        why = unwritable(Path(args.out))
        if why is not None:
            raise UsageError(f"inferris-dist chaos: --out {render.shown(args.out)}: reproducers cannot be "
                             f"written there ({why})")
    drawn_seed = args.seed is None
    seed = secrets.randbelow(2**31) if drawn_seed else args.seed
    knobs = {k: getattr(args, k) for k in ("max_step_tokens", "page_size", "num_pages", "spec_len")}
    if args.random_workloads:
        workloads = [(name, w.with_config(**knobs)) for name, w in random_workloads(seed)]
    else:
        workload, name = workload_from_flags(args.spec, args.request, knobs)
        if workload.faults:
            sys.stderr.write(f"inferris-dist: note: the workload's own faults "
                             f"({', '.join(workload.faults)}) are left out: chaos draws the faults\n")
            workload = workload._replace(faults=())
        workloads = [(name, workload)]
    kinds = parse_kind_weights(args.kinds)
    if args.worker is not None:
        from inferris_dist.launcher.command import CommandError, command_words
        try:
            command_words(args.worker)
        except CommandError as e:
            raise UsageError(f"inferris-dist chaos: {e}") from None
        if args.profile is None:     # a foreign worker acts out no fault of its own unless it says so
            acted = sorted(k for k in kinds if k not in LINK_KINDS)
            if args.kinds and acted:
                raise UsageError(f"inferris-dist chaos: --kinds {', '.join(acted)}: a worker acts these "
                                 f"out itself; with --worker, add --profile faults if it implements them")
            kinds = {k: w for k, w in kinds.items() if k in LINK_KINDS}
    elif args.profile is not None:
        raise UsageError("inferris-dist chaos: --profile is said of a --worker")
    jobs = args.jobs if args.jobs is not None else default_jobs(args.runs, args.time, args.shard)
    if jobs < 1:
        raise UsageError("inferris-dist chaos: --jobs must be >= 1")
    if jobs > 1 and args.shard != (0, 1):
        raise UsageError("inferris-dist chaos: --jobs runs shards of its own: give --jobs or --shard")
    with Session(step_timeout=args.step_timeout or DEFAULT_STEP_TIMEOUT, max_restarts=args.max_restarts,
                 worker=args.worker) as session:
        return _explore(args, session, workloads, seed, drawn_seed, kinds, jobs)


def _explore(args, session, workloads, seed: int, drawn_seed: bool, kinds, jobs: int) -> int:
    from inferris_dist.chaos.exploring import ChaosConfig, explore
    derived = None
    step_timeout = args.step_timeout
    if step_timeout is None and args.shard != (0, 1):     # shards merge only under one deadline
        step_timeout, derived = DEFAULT_STEP_TIMEOUT, "a shard's: shards merge under one deadline"
    elif step_timeout is None:
        step_timeout, derived = _derive_step_timeout(session, workloads, args)
    session.step_timeout = step_timeout
    config = ChaosConfig(workloads, seed, tuple(args.rung), tuple(args.policy), args.world_size,
                         kinds, args.max_faults, step_timeout, args.max_restarts,
                         args.random_workloads)
    if args.max_faults > args.max_restarts and any(p != "abort" for p in args.policy):
        sys.stderr.write(f"inferris-dist: note: up to {args.max_faults} faults a schedule and "
                         f"--max-restarts {args.max_restarts}: under restore or recompute a schedule "
                         f"whose every fault needs a recovery runs out of restarts, a break by the "
                         f"budget\n")
    runs = DEFAULT_RUNS if args.runs is None and args.time is None else args.runs
    out = sys.stdout
    if not args.json:
        out.write(_header(config, seed, drawn_seed, runs, args.time, args.shard, args.worker, derived, jobs)
                  + "\n")
        out.flush()
    live = Live(sys.stderr)

    def said_break(index: int, schedule, kind: str, reason: str) -> None:
        if not args.json:
            live.clear()
            out.write(f"break at schedule {index} ({kind}): {render.shown(str(schedule))}\n"
                      f"    {render.shown(reason)}\n")
            out.flush()

    def on_run(outcome, report) -> None:
        if outcome.brk is not None:
            said_break(outcome.schedule.index, outcome.schedule, outcome.brk.kind, outcome.brk.reason)
        live.update(report)

    try:
        if jobs > 1:
            from inferris_dist.chaos.jobs import explore_in_jobs
            report = explore_in_jobs(config, jobs, runs=runs, seconds=args.time, worker=args.worker)
            for b in report.breaks:       # in the order of the schedules, whatever the jobs
                said_break(b.index, b.schedule, b.kind, b.reason)
        else:
            report = explore(config, runs=runs, seconds=args.time, shard=args.shard, session=session,
                             on_run=on_run)
    finally:
        live.clear()
    if not args.json:
        out.write(table_text(report) + "\n")
        out.write(coverage_text(report) + "\n")
        out.write(summary_text(report) + "\n")
        out.flush()
    if report.breaks and not args.no_shrink and args.max_shrinks:
        unwritten = shrink_breaks(report, config, session, args, out)
        if unwritten is not None:     # the report is kept: said after it, in one line
            if args.json:
                out.write(json.dumps(report.to_json()) + "\n")
                out.flush()
            sys.stderr.write(f"inferris-dist chaos: {render.shown(unwritten)}\n")
            return EXIT_FAILED
    if args.json:
        out.write(json.dumps(report.to_json()) + "\n")
    return EXIT_FAILED if report.breaks else EXIT_OK


def shrink_breaks(report, config, session, args, out) -> str | None:
    """Shrink the first break of each class (at most --max-shrinks), write each reproducer and run
    it again; the result goes into the report's break. A reproducer that cannot be written ends
    the shrinking: what went wrong, in words (None when every one was written)."""
    from inferris_dist.chaos.shrinking import NotWritten, fresh_dir, shrink, write_reproducer
    from inferris_dist.chaos.verdicts import Break
    chosen, classes = [], set()
    for b in report.breaks:
        if b.kind not in classes and len(chosen) < args.max_shrinks:
            classes.add(b.kind)
            chosen.append(b)
    directory = Path(args.out) if args.out is not None else None
    for b in chosen:
        workload = config.by_name[b.schedule.workload]
        shrunk = shrink(workload, b.schedule, Break(b.kind, b.reason), session=session,
                        max_runs=args.shrink_runs, max_seconds=args.shrink_time)
        b.shrunk = {**shrunk.to_json(), "reproducer": None}
        if not args.json:
            spent = "; the budget ran out" if shrunk.budget_spent else ""
            out.write(f"shrunk the break at schedule {b.index} ({b.kind}) in {shrunk.runs} runs, "
                      f"{shrunk.seconds:.1f} s{spent}: {render.shown(shrunk.minimal.describe())}\n")
            out.write(f"    {render.shown(shrunk.brk.reason)}\n")
            out.flush()
        try:
            if directory is None:
                stem = f"chaos-seed-{report.seed}"
                try:
                    directory = fresh_dir(Path.cwd(), stem)
                except OSError as e:
                    raise NotWritten(Path.cwd() / stem, e.strerror or str(e)) from None
            repro = write_reproducer(shrunk, b.schedule, directory, session=session, reruns=args.reruns,
                                     step_timeout=config.step_timeout, max_restarts=config.max_restarts)
        except NotWritten as e:
            return (f"the reproducer of the break at schedule {b.index} could not be written to "
                    f"{e.path} ({e.reason}); the report stands without it")
        b.shrunk["reproducer"] = repro.to_json()
        if args.json:
            continue
        out.write(f"    reproduce: {render.shown(repro.command)}\n")
        if repro.wire_log is not None:
            out.write(f"    the wire log of a run that broke: {render.shown(str(repro.wire_log))}\n")
        if b.kind not in PROMISE_KINDS:
            out.write(f"    (compare judges the promise only: a {b.kind} break shows in chaos's own "
                      f"checks of the run)\n")
        out.write(f"    {repro.verdict()}\n")
        out.flush()
    return None


RUNS_PER_JOB = 8       # by default, no more jobs than a job for each 8 schedules: a job costs a world


def default_jobs(runs: int | None, seconds: float | None, shard: tuple[int, int]) -> int:
    """One job per core; one for a shard (its own share already), and no more than a job for each
    RUNS_PER_JOB schedules asked for (a world to start is not worth a few schedules)."""
    if shard != (0, 1):
        return 1
    if runs is None and seconds is None:
        runs = DEFAULT_RUNS
    return usable_cores() if runs is None else max(1, min(usable_cores(), runs // RUNS_PER_JOB))


def _derive_step_timeout(session, workloads, args) -> tuple[float, str]:
    """The step deadline from the workloads' own steps, measured on processes at every world size
    and rung asked for (three runs of each, no fault); with what it was derived from, in words."""
    from inferris_dist.chaos.harness import deadline_from
    times: list[float] = []
    for _, workload in workloads:
        for n in args.world_size or (workload.config.world_size,):
            for rung in args.rung:
                try:
                    times += session.step_times(workload, n, rung)
                except EngineError as e:
                    raise EngineError(f"inferris-dist chaos: measuring the step time on processes, the "
                                      f"workload failed without a fault: {e.message}", None) from None
    times.sort()
    median, slowest = times[len(times) // 2], times[-1]
    value = deadline_from(median, slowest)
    return value, (f"derived from {len(times)} steps measured: median {median * 1e3:.2f} ms, "
                   f"slowest {slowest * 1e3:.2f} ms")


def _header(config, seed: int, drawn: bool, runs, seconds, shard, worker: str | None = None,
            derived: str | None = None, jobs: int = 1) -> str:
    names = ", ".join(render.shown(n) for n, _ in config.workloads)
    if config.random_workloads:
        names = f"{len(config.workloads)} random workloads"
    kinds = config.kinds
    kinds_text = (f"every kind ({len(kinds)})" if len(kinds) == len(_all_kinds()) and
                  set(kinds.values()) == {1.0} else ", ".join(kinds))
    sizes = ", ".join(map(str, config.world_sizes)) if config.world_sizes else "the workload's"
    much = f"{runs} schedule{'s' * (runs != 1)}" if runs is not None else f"schedules for {seconds:g} s"
    part = f" (shard {shard[0]}/{shard[1]})" if shard != (0, 1) else ""
    again = f" (drawn: --seed {seed} runs these again)" if drawn else ""
    return (f"chaos: seed {seed}{again}, {much}{part} on {names}; rung {', '.join(config.rungs)}; "
            f"policy {', '.join(config.policies)}; world size {sizes}; kinds {kinds_text}; "
            f"up to {config.max_faults} faults; step timeout {config.step_timeout:g} s"
            + (f" ({derived})" if derived else "") + f", max restarts {config.max_restarts}"
            + (f"; {jobs} jobs" if jobs > 1 else "")
            + (f"; worker {render.shown(worker)}" if worker is not None else ""))


def _all_kinds():
    from inferris_dist.chaos.schedules import fault_kinds
    return fault_kinds()


def table_text(report) -> str:
    """Kind x policy (x rung when there is more than one): runs/breaks in each cell."""
    policies, rungs = report.config["policies"], report.config["rungs"]
    columns = [(p, r) for p in policies for r in rungs]
    heads = [p if len(rungs) == 1 else f"{p} {r}" for p, r in columns]
    rows = [["kind", *heads]]
    for kind in report.kinds:
        row = [kind]
        for p, r in columns:
            runs, breaks = report.cells.get((kind, p, r), [0, 0])
            row.append(f"{runs}/{breaks}")
        rows.append(row)
    rows.append(["total", *[f"{t[0]}/{t[1]}" for t in (report.totals.get(c, [0, 0]) for c in columns)]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)).rstrip()
             for r in rows]
    lines.append("cells: runs/breaks; a run counts under every kind it holds")
    return "\n".join(lines)


def coverage_text(report) -> str:
    never = report.never_fired
    n = len(report.kinds)
    if not never:
        return f"coverage: every kind fired at least once ({n} of {n})"
    return f"coverage: {n - len(never)} of {n} kinds fired; never fired: {', '.join(never)}"


def summary_text(report) -> str:
    rate = report.runs / report.seconds * 60 if report.seconds > 0 else 0.0
    verdict = "none broke" if not report.breaks else f"{report.broke} broke"
    return (f"{report.runs} run{'s' * (report.runs != 1)} in {report.seconds:.1f} s ({rate:,.0f} a minute): "
            f"{report.held} held, {verdict}")


class Live(render.LiveLine):
    """The live line: runs done, their rate, held, broken, the schedule running now."""

    def update(self, report) -> None:
        if not self.enabled or not self.due():
            return
        rate = report.runs / report.seconds if report.seconds > 0 else 0.0
        width = render.line_width(self.stream)
        text = (f"{report.runs} runs · {rate:.1f}/s · {report.held} held · {report.broke} broken · "
                f"{render.shown(str(report.last)) if report.last else ''}")
        self.draw(text[:width - 1])


# -- merge ------------------------------------------------------------------------------------------

def run_merge(paths: list[str], as_json: bool) -> int:
    from inferris_dist.chaos.exploring import Report, merge_reports
    from inferris_dist.engine.workload import read_text
    reports = []
    for path in paths:
        text = read_text(path, "chaos merge: report")
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise WorkloadError(f"chaos merge: {path}: not JSON ({e})") from None
        except RecursionError:
            raise WorkloadError(f"chaos merge: {path}: nested too deeply to be a report") from None
        try:
            reports.append(Report.from_json(obj))
        except WorkloadError as e:
            raise WorkloadError(f"chaos merge: {path}: {e}") from None
    try:
        merged = merge_reports(reports)
    except WorkloadError as e:
        raise WorkloadError(f"chaos merge: {e}") from None
    out = sys.stdout
    if as_json:
        out.write(json.dumps(merged.to_json()) + "\n")
    else:
        count = merged.shards[0][1] if merged.shards else 1
        which = (f"all {count} shards" if merged.shard == (0, 1)
                 else f"shards {', '.join(str(s[0]) for s in merged.shards)} of {count}")
        out.write(f"chaos merge: seed {merged.seed}, {which}\n")
        for b in merged.breaks:
            out.write(f"break at schedule {b.index} ({b.kind}): {render.shown(str(b.schedule))}\n"
                      f"    {render.shown(b.reason)}\n")
            repro = (b.shrunk or {}).get("reproducer")
            if repro:
                out.write(f"    reproduce: {render.shown(repro['command'])}\n")
        out.write(table_text(merged) + "\n")
        out.write(coverage_text(merged) + "\n")
        out.write(summary_text(merged) + "\n")
    return EXIT_FAILED if merged.breaks else EXIT_OK
