"""Chaos throughput: fault schedules per minute on real processes, `inferris-dist chaos`'s way (one
process, one worker template shared by every run, the reference computed once) against a loop of
separate `inferris-dist compare --fault ... --on-rank-loss restore` commands on the same schedules.

    python examples/bench_chaos.py [--spec FILE] [--schedules 120] [--loop 30] [--seed 1]
                                   [--world-size 4] [--step-timeout 0.25]

The schedules are chaos's own (every fault kind, up to 3 faults, policy restore) on the demo
workload by default. The loop runs the first `--loop` of them (a command each: a fresh
interpreter, its own template and reference). Both ways judge every run; the table says how many
held. Then where a run's time goes: chaos's runs split by what their faults cost (a hang or a
delay past the deadline waits out the step timeout), and one fault-free run taken apart.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from inferris_dist import chaos
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload


def chaos_way(workload, schedules, step_timeout: float) -> tuple[float, int, list]:
    """Every schedule in one session; (seconds, held, outcomes)."""
    started = time.perf_counter()
    with chaos.Session(step_timeout=step_timeout) as session:
        outcomes = [session.run(workload, s) for s in schedules]
    return time.perf_counter() - started, sum(o.held for o in outcomes), outcomes


def loop_way(spec_path: str, schedules, step_timeout: float) -> tuple[float, int]:
    """One `inferris-dist compare` command per schedule; (seconds, held)."""
    exe = shutil.which("inferris-dist") or os.path.join(os.path.dirname(sys.executable), "inferris-dist")
    held = 0
    started = time.perf_counter()
    for s in schedules:
        argv = [exe, "compare", "--spec", spec_path, "--on-rank-loss", s.policy, "--world-size",
                str(s.world_size), "--step-timeout", f"{step_timeout:g}", "--rung", s.rung]
        for f in s.faults:
            argv += ["--fault", f]
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        held += done.returncode == 0
    return time.perf_counter() - started, held


def costly(schedule, step_timeout: float) -> bool:
    """Whether a schedule's faults wait out the step deadline (a hang, or a delay past it)."""
    for f in schedule.faults:
        kind = f.split(":", 1)[1].split("@", 1)[0]
        arg = f.split("@", 1)[1].partition(":")[2]
        if kind == "hang" or (arg and float(arg) > step_timeout):
            return True
    return False


def one_run_apart(workload, world_size: int, step_timeout: float) -> list[tuple[str, float]]:
    """A fault-free run's time by part, from its wire log: start-up (fork and handshake of every
    worker), the steps, and the stop (every worker asked to stop and gone)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp, chaos.Session(step_timeout=step_timeout) as session:
        session.run(workload, chaos.Schedule(0, "warm", "full", "restore", world_size, ()))
        log = os.path.join(tmp, "w.jsonl")
        started = time.monotonic()
        chaos.run_on_processes(workload, (), "restore", world_size=world_size, wire_log=log,
                                 template=session.shared_template(), step_timeout=step_timeout)
        ended = time.monotonic()
        lines = [json.loads(x) for x in open(log)]
    phases = [x for x in lines if x.get("event") == "phase"]
    first = min(x["t"] for x in phases)
    last = max(x["t"] + x["dur"] for x in phases)
    return [("start-up: template fork, handshake, CONFIG", first - started),
            ("steps: plans out, results in, commit, audit", last - first),
            ("stop: every worker stopped, run directory removed", ended - last)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="workload JSON (default: the built-in demo)")
    ap.add_argument("--schedules", type=int, default=120, help="schedules run chaos's way")
    ap.add_argument("--loop", type=int, default=30, help="of them, run as separate compare commands")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--step-timeout", type=float, default=0.25)
    args = ap.parse_args()
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        spec = args.spec
        if spec is None:
            spec = os.path.join(tmp, "demo.spec.json")
            with open(spec, "w") as f:
                json.dump(DEMO, f)
        workload = load_workload(spec).with_config(world_size=args.world_size)
        config = chaos.ChaosConfig([("demo", workload)], seed=args.seed, policies=("restore",),
                                     step_timeout=args.step_timeout)
        steps = chaos.reference_of(workload).steps
        schedules = [chaos.schedule_at(config, i, lambda w, r: steps) for i in range(args.schedules)]
        chaos_s, chaos_held, outcomes = chaos_way(workload, schedules, args.step_timeout)
        loop = schedules[:args.loop]
        loop_s, loop_held = loop_way(spec, loop, args.step_timeout) if loop else (0.0, 0)
        parts = one_run_apart(workload, args.world_size, args.step_timeout)
    chaos_rate = len(schedules) / chaos_s * 60
    loop_rate = len(loop) / loop_s * 60 if loop else 0.0
    print(f"{len(schedules)} schedules (seed {args.seed}, every kind, up to 3 faults, restore) on the demo "
          f"workload at world size {args.world_size}, step timeout {args.step_timeout:g} s, "
          f"{os.cpu_count()} cores")
    print(f"{'way':<44} {'schedules':>9} {'held':>5} {'seconds':>8} {'per minute':>11}")
    print(f"{'chaos (one process, one shared template)':<44} {len(schedules):>9} {chaos_held:>5} "
          f"{chaos_s:>8.1f} {chaos_rate:>11.0f}")
    if loop:
        print(f"{'a loop of inferris-dist compare':<44} {len(loop):>9} {loop_held:>5} {loop_s:>8.1f} "
              f"{loop_rate:>11.0f}")
        print(f"chaos is {chaos_rate / loop_rate:.1f}x the loop")
    for o in outcomes:
        if o.brk is not None:
            print(f"broke: {o.schedule}: {o.brk}")
    cheap = [o.seconds for o in outcomes if not costly(o.schedule, args.step_timeout)]
    dear = [o.seconds for o in outcomes if costly(o.schedule, args.step_timeout)]
    print("where a chaos run's time goes:")
    for label, runs in (("runs whose faults wait out no deadline", cheap),
                        ("runs with a hang or a delay past the deadline", dear)):
        if runs:
            print(f"  {label:<48} {len(runs):>4} runs, median {statistics.median(runs) * 1000:6.0f} ms, "
                  f"{sum(runs) / chaos_s:5.0%} of the time")
    print("  one fault-free run, taken apart:")
    for label, seconds in parts:
        print(f"    {label:<52} {seconds * 1000:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
