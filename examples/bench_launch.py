"""Where a launch's time goes, as a whole command, beside `run` of the same workload.

    python examples/bench_launch.py [--pairs 7] [--world-size 4] [--spec FILE] [--launch-flags "..."]

Runs `inferris-dist launch --json --wire-log LOG` and `inferris-dist run --json` in interleaved
pairs. The wire log's times are the host's monotonic clock, which this script reads too, just
before it starts the command and as soon as the command has exited: so each launch splits into
the scheduler getting ready (interpreter, imports, flags, workload: up to the log's `run`
event), the workers starting (the template, the forks, up to the first HELLO), the handshakes
(to the last READY), the steps (to the last RESULT), the audit (the SHARD replies), stopping
(to the log's end record) and leaving (to the process's exit). Medians over the pairs, and the
launch / run ratio of each pair. The wire log costs the launch a little (a line per message).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("ready", "workers", "handshakes", "steps", "audit", "stopping", "leaving")


def command() -> list[str]:
    script = shutil.which("inferris-dist", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "inferris_dist.cli"]


def timed(argv: list[str]) -> tuple[float, float]:
    """(start, exit) of one command, on the monotonic clock; its output thrown away."""
    start = time.monotonic()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    end = time.monotonic()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace').strip()}")
    return start, end


def parts_of(log: Path, start: float, end: float) -> dict[str, float]:
    """A launch's wall time split at the wire log's landmarks (seconds)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for t, kind in ((r["t"], r.get("event") or r.get("type")) for r in records):
        first.setdefault(kind, t)
        last[kind] = t
    marks = [start, first["run"], first["HELLO"], last["READY"], last["RESULT"],
             last.get("SHARD", last["RESULT"]), records[-1]["t"], end]
    return {name: b - a for name, a, b in zip(PARTS, marks, marks[1:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--spec", help="a workload file (default: the built-in demo)")
    ap.add_argument("--launch-flags", default="", help="more flags for launch alone, e.g. "
                    "\"--rung overlap --exec-cost 1ms\"")
    args = ap.parse_args()
    cli = command()
    workload = ["--spec", args.spec] if args.spec else []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        log = Path(tmp) / "wire.jsonl"
        launch = (cli + ["launch", "--world-size", str(args.world_size), "--json", "--wire-log", str(log)]
                  + workload + args.launch_flags.split())
        run = cli + ["run", "--world-size", str(args.world_size), "--json"] + workload
        timed(launch)                             # a first pair, not counted: caches warm
        timed(run)
        launches, runs, parts = [], [], {p: [] for p in PARTS}
        for _ in range(args.pairs):
            start, end = timed(launch)
            launches.append(end - start)
            for name, took in parts_of(log, start, end).items():
                parts[name].append(took)
            start, end = timed(run)
            runs.append(end - start)
    ratios = [a / b for a, b in zip(launches, runs)]
    ms = lambda values: f"{statistics.median(values) * 1000:6.1f} ms"  # noqa: E731
    print(f"{'workload':<12} {args.spec or 'the demo'}, world size {args.world_size}, {args.pairs} "
          f"interleaved pairs (medians){'; launch ' + args.launch_flags if args.launch_flags else ''}")
    print(f"{'launch':<12} {ms(launches)}   (min {min(launches) * 1000:.1f}, max {max(launches) * 1000:.1f})")
    print(f"{'run':<12} {ms(runs)}   (min {min(runs) * 1000:.1f}, max {max(runs) * 1000:.1f})")
    print(f"{'launch / run':<12} {statistics.median(ratios):6.2f}x    "
          f"(pairs {min(ratios):.2f}x .. {max(ratios):.2f}x)")
    print("the launch, part by part:")
    for name in PARTS:
        print(f"  {name:<11} {ms(parts[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
