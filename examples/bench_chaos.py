"""Chaos throughput: fault schedules a minute on real processes, `inferris-dist chaos` at
`--jobs 1` and `--jobs 2` against a loop of separate `inferris-dist compare` commands over the
same schedules, in one sitting.

    python examples/bench_chaos.py [--schedules 240] [--mix 120] [--loop 40] [--seed 1]
                                   [--world-size 4]

Two sets of schedules, chaos's own (drawn from --seed, up to 3 faults, policy restore, the demo
workload): the kinds whose faults wait out no deadline (every rank kind but hang and the time
kinds, and the link's duplicates: a lost or reordered message is waited for until the deadline,
as it would be on a real link), and the default mix of every kind. The first command derives
the step deadline from the workload's measured steps; every row after it is given that deadline
(`--step-timeout`), so that every row runs the very same schedules. Each row's time is the whole
command's, start-up included. The loop runs the first --loop schedules of the first set, one
`compare` command each (a fresh interpreter, its own template and reference). The last lines say
whether both job counts gave the same report (apart from its times) and what each left behind.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from inferris_dist import chaos
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload

NO_DEADLINE = ("crash", "exit", "garble", "disagree", "stale", "duplicate", "bad-writes", "drop-write",
               "crash-after-reply", "plan-dup", "result-dup")


def cli() -> str:
    return shutil.which("inferris-dist") or os.path.join(os.path.dirname(sys.executable), "inferris-dist")


def chaos_command(runs: int, seed: int, world_size: int, kinds: tuple[str, ...] | None, jobs: int,
                  step_timeout: float | None, cwd: str) -> tuple[float, dict]:
    """One `inferris-dist chaos --json` command: (its seconds, its report)."""
    argv = [cli(), "chaos", "--runs", str(runs), "--seed", str(seed), "--world-size", str(world_size),
            "--policy", "restore", "--jobs", str(jobs), "--json", "--no-shrink"]
    if kinds:
        argv += ["--kinds", ",".join(kinds)]
    if step_timeout is not None:
        argv += ["--step-timeout", f"{step_timeout:g}"]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=cwd)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"chaos failed ({done.returncode}): {done.stderr.strip()}")
    return seconds, json.loads(done.stdout)


def loop_way(spec: str, schedules, step_timeout: float, cwd: str) -> tuple[float, int]:
    """One `inferris-dist compare` command per schedule: (seconds, held)."""
    held = 0
    started = time.perf_counter()
    for s in schedules:
        argv = [cli(), "compare", "--spec", spec, "--on-rank-loss", s.policy, "--world-size",
                str(s.world_size), "--step-timeout", f"{step_timeout:g}", "--rung", s.rung]
        for f in s.faults:
            argv += ["--fault", f]
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=cwd)
        held += done.returncode == 0
    return time.perf_counter() - started, held


def ours_in_temp() -> set[str]:
    """The run directories of ours in the temp directory."""
    names = os.listdir(tempfile.gettempdir())
    return {n for n in names if n.startswith(("inferris-dist-", "inferris-chaos-"))}


def left_behind(before: set[str]) -> list[str]:
    """Run directories of ours in the temp directory that were not there before and whose
    process is gone (a directory of a process still running is that process's business)."""
    def owner_gone(name: str) -> bool:
        pid = name.split("-")[2]
        return not (pid.isdigit() and os.path.exists(f"/proc/{pid}"))
    return sorted(n for n in ours_in_temp() - before if owner_gone(n))


def cpu(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def one_run_costs(workload, world_size: int, deadline: float, runs: int) -> list[tuple]:
    """A run's wall time, the scheduler's CPU and the workers' and template's CPU, each a mean
    over `runs` runs in a session of its own (its template's start included, its workers reaped
    when it closes): fault-free on a warm world, then with one fault whose worker is replaced."""
    out = []
    fault = f"{world_size - 1}:stale@2"
    for label, faults in (("a fault-free run, warm", ()), (f"with one worker replaced ({fault})", (fault,))):
        schedule = chaos.Schedule(0, "demo", "full", "restore", world_size, faults)
        own, children = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with chaos.Session(step_timeout=deadline) as session:
            for _ in range(runs):
                session.run(workload, schedule)
        wall = time.perf_counter() - started
        out.append((label, wall / runs, (cpu(resource.RUSAGE_SELF) - own) / runs,
                    (cpu(resource.RUSAGE_CHILDREN) - children) / runs))
    return out


def same(a: dict, b: dict) -> bool:
    a, b = dict(a), dict(b)
    a.pop("seconds", None)
    b.pop("seconds", None)
    return a == b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=240,
                    help="schedules of the kinds that need no deadline")
    ap.add_argument("--mix", type=int, default=120, help="schedules of the default mix of every kind")
    ap.add_argument("--loop", type=int, default=40, help="of the first set, run as separate compare commands")
    ap.add_argument("--parts", type=int, default=50, help="runs of each kind timed in one session")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--world-size", type=int, default=4)
    args = ap.parse_args()
    before = ours_in_temp()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "demo.spec.json")
        with open(spec, "w") as f:
            json.dump(DEMO, f)
        size = args.world_size
        seconds, first = chaos_command(args.schedules, args.seed, size, NO_DEADLINE, 1, None, tmp)
        deadline = first["config"]["step_timeout"]
        rows.append(("no deadline", "chaos --jobs 1 (deadline derived)", first, seconds))
        seconds, two = chaos_command(args.schedules, args.seed, size, NO_DEADLINE, 2, deadline, tmp)
        rows.append(("no deadline", "chaos --jobs 2", two, seconds))
        workload = load_workload(spec).with_config(world_size=args.world_size)
        config = chaos.ChaosConfig([("demo", workload)], seed=args.seed, policies=("restore",),
                                   world_sizes=(args.world_size,), kinds={k: 1.0 for k in NO_DEADLINE},
                                   step_timeout=deadline)
        steps = chaos.reference_of(workload).steps
        loop = [chaos.schedule_at(config, i, lambda w, r: steps)
                for i in range(min(args.loop, args.schedules))]
        loop_s, loop_held = loop_way(spec, loop, deadline, tmp) if loop else (0.0, 0)
        mix1 = mix2 = None
        if args.mix:
            seconds, mix1 = chaos_command(args.mix, args.seed, args.world_size, None, 1, deadline, tmp)
            rows.append(("every kind", "chaos --jobs 1", mix1, seconds))
            seconds, mix2 = chaos_command(args.mix, args.seed, args.world_size, None, 2, deadline, tmp)
            rows.append(("every kind", "chaos --jobs 2", mix2, seconds))
    parts = one_run_costs(workload, args.world_size, deadline, args.parts) if args.parts else []
    left = left_behind(before)
    print(f"the demo workload at world size {args.world_size}, policy restore, seed {args.seed}, up to 3 "
          f"faults, step deadline {deadline:g} s (derived by the first command), {os.cpu_count()} cores")
    print(f"{'schedules':<12} {'way':<34} {'runs':>5} {'held':>5} {'seconds':>8} {'per minute':>11}")
    for what, way, report, seconds in rows:
        print(f"{what:<12} {way:<34} {report['runs']:>5} {report['held']:>5} {seconds:>8.1f} "
              f"{report['runs'] / seconds * 60:>11.0f}")
    if loop:
        loop_rate = len(loop) / loop_s * 60
        print(f"{'no deadline':<12} {'a loop of inferris-dist compare':<34} {len(loop):>5} {loop_held:>5} "
              f"{loop_s:>8.1f} {loop_rate:>11.0f}")
        for _, way, report, seconds in rows[:2]:
            print(f"{way.split(' (')[0]} is {report['runs'] / seconds * 60 / loop_rate:.1f}x the loop "
                  f"(no deadline)")
    print(f"the same report at --jobs 1 and --jobs 2: {'yes' if same(first, two) else 'NO'} (no deadline)"
          + (f", {'yes' if same(mix1, mix2) else 'NO'} (every kind)" if mix1 is not None else ""))
    if parts:
        print(f"one run, in one session ({args.parts} runs each):  {'wall ms':>8} {'scheduler CPU ms':>17} "
              f"{'workers CPU ms':>15}")
        for label, wall, own, children in parts:
            print(f"  {label:<44} {wall * 1e3:>8.1f} {own * 1e3:>17.1f} {children * 1e3:>15.1f}")
    print(f"left behind in {tempfile.gettempdir()}: {', '.join(left) if left else 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
