"""What recording every rank's arrival at every join costs a step, measured.

    python examples/bench_arrivals.py [--requests N] [--repeat K]

The scheduler records, for each joined step: the arrivals (observe/arrivals.py: who came last,
how late, the ranks' execute times), the wavefront (the last plan, result and FIRED of each
rank), and it asks each rank for its own times (the timing frame, protocol §7.7: encoded by the
rank, decoded by the scheduler). This times those three pieces, per step at world size 4, in
this process, and sets them against the median time of a step of the serving workload
(examples/serving.py) launched at world size 4 on real processes: the share of a step that
recording costs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inferris_dist
from inferris_dist.engine import load_workload
from inferris_dist.observe.arrivals import Arrivals
from inferris_dist.observe.records import StepRecord
from inferris_dist.protocol import wire

RANKS = 4


def recording_seconds(repeat: int) -> float:
    """Seconds per step of the three pieces, at RANKS ranks."""
    arrivals = Arrivals()
    front: dict[int, dict] = {}
    times = (1.0, 1.0001, 1.0021, 1.0022)
    frame = wire.encode_timing(times)
    start = time.perf_counter()
    for i in range(repeat):
        record = StepRecord(i, 0, 100, RANKS)
        now = time.monotonic()
        for r in range(RANKS):
            front.setdefault(r, {})["plan"] = (i, 0, now)           # a PLAN sent
            wire.encode_timing(times)                               # the rank's frame
            record.inside[r] = wire.decode_timing(frame)            # read by the scheduler
            record.sent[r] = now
            record.rtt[r] = 0.001 + 0.0001 * r
            front[r]["result"] = (i, 0, now)                        # a RESULT taken
        record.verdict = "joined"
        arrivals.join(record)
    return (time.perf_counter() - start) / repeat


def step_seconds(requests: int) -> tuple[float, int]:
    """The median wall time of a step of the serving workload at RANKS ranks, and its steps."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "serving.json"
        subprocess.run([sys.executable, str(Path(__file__).parent / "serving.py"), "--write", str(spec),
                        "--requests", str(requests), "--world-size", str(RANKS)], check=True,
                       capture_output=True)
        workload = load_workload(spec)
    walls = []
    with inferris_dist.launch(workload) as engine:
        last = time.perf_counter()
        for trace in engine.run():
            now = time.perf_counter()
            if not trace.is_empty:
                walls.append(now - last)
            last = now
    return statistics.median(walls), len(walls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--repeat", type=int, default=20000)
    args = p.parse_args()
    cost = recording_seconds(args.repeat)
    step, steps = step_seconds(args.requests)
    print(f"recording a join at world size {RANKS}: {cost * 1e6:.1f} us a step "
          f"(arrivals, wavefront, timing frames; {args.repeat:,} steps)")
    print(f"a step of the serving workload ({args.requests} requests, world size {RANKS}, {steps:,} steps "
          f"that crossed): {step * 1e6:,.0f} us, median")
    print(f"recording's share of a step: {100 * cost / step:.2f}%")


if __name__ == "__main__":
    main()
