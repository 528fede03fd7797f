"""Overlap scheduling against a model's time: the serving workload on N worker processes whose
ranks each take --exec-cost to execute a step, at rung `full` and at rung `overlap`.

    python examples/bench_overlap.py [--requests 300] [--world-size 4] [--costs 0,0.5,1,2] [--repeat 3]
    python examples/bench_overlap.py --round-trip [--costs 1]
    python examples/bench_overlap.py --rank-work

For each exec cost, the two rungs run interleaved `--repeat` times (the workers started once per
run, outside the timing): the run loop's wall time (the best, and the median), steps per
second, and the tokens of work discarded at `overlap`. The ratio is overlap / full of the best
wall times. Every run's trace is checked against `run` in process: the figures are of runs
that printed the right bytes.

`--round-trip` shows where a round trip's time goes at each rung instead: each rank reports four
times of its own (the plan read, decoded, executed, the result encoded; the clock is the
host's, shared by the scheduler), which split the scheduler's round trip (plan sent to result
read) into the way to the rank, the time inside it, and the way back.

`--rank-work` shows a rank's own work per step at each rung, with no I/O (bench_boundary.py's
hot path over the plans of the run in process): at `overlap` a rank also places the items
planned ahead of its verdicts, and the ranks' work shares the machine's cores with the
scheduler's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from serving import serving_workload  # examples/serving.py, beside this script

from inferris_dist import launch
from inferris_dist.engine import Engine, load_workload, trace_json_lines
from inferris_dist.observe.timeline import Timeline
from inferris_dist.protocol.limits import parse_exec_cost

RUNGS = ("full", "overlap")


def one_run(workload, rung: str, cost, reference: list[str]) -> float:
    """The run loop's seconds of one launch; its trace must be `reference`."""
    with launch(workload, rung=rung, exec_cost=cost, step_timeout=60) as engine:
        started = time.perf_counter()
        lines = list(trace_json_lines(engine))
        took = time.perf_counter() - started
    if lines != reference:
        raise SystemExit(f"rung {rung}, exec cost {cost}: the trace differs from run in process")
    return took


class KeptRecords(Timeline):
    """A timeline that also keeps every attempt's record (its sends, round trips and the
    ranks' own times): asking for a timeline is what makes the ranks report their times."""

    def __init__(self):
        super().__init__()
        self.records = []

    def attempt(self, record) -> None:
        super().attempt(record)
        self.records.append(record)


def round_trip_parts(workload, rung: str, cost, reference: list[str]) -> dict[str, float]:
    """Medians over every (step, rank) of one run, in ms: the round trip and its three parts."""
    kept = KeptRecords()
    with launch(workload, rung=rung, exec_cost=cost, step_timeout=60, timeline=kept) as engine:
        lines = list(trace_json_lines(engine))
    if lines != reference:
        raise SystemExit(f"rung {rung}, exec cost {cost}: the trace differs from run in process")
    parts: dict[str, list[float]] = {"round trip": [], "to the rank": [], "inside": [], "way back": []}
    for record in kept.records:
        for rank, (got, _decoded, _executed, encoded) in record.inside.items():
            sent, rtt = record.sent[rank], record.rtt[rank]
            parts["round trip"].append(rtt)
            parts["to the rank"].append(got - sent)
            parts["inside"].append(encoded - got)
            parts["way back"].append(sent + rtt - encoded)
    return {k: statistics.median(v) * 1000 for k, v in parts.items()}


def print_round_trips(workload, costs: list[str], reference: dict[str, list[str]]) -> None:
    print(f"{'exec cost':>9}  {'rung':<8} {'round trip':>10} {'to the rank':>11} {'inside':>7} "
          f"{'way back':>8}   (medians over every step and rank, ms)")
    for ms in costs:
        cost = parse_exec_cost(f"{float(ms) * 1000:g}us")
        for rung in RUNGS:
            p = round_trip_parts(workload, rung, cost, reference[rung])
            print(f"{ms + ' ms':>9}  {rung:<8} {p['round trip']:>10.2f} {p['to the rank']:>11.2f} "
                  f"{p['inside']:>7.2f} {p['way back']:>8.2f}")


def print_rank_work(workload, requests: int, repeat: int) -> None:
    from bench_boundary import Recorder, hot_path  # beside this script
    n = workload.config.world_size
    print(f"serving workload: {requests} requests, world size {n}: a rank's work per step, best of "
          f"{repeat} passes over the run's plans, no I/O (us)")
    keys = ("decode", "verdicts", "place", "encode", "apply")
    print(f"{'rung':<8} " + " ".join(f"{k:>8}" for k in keys) + f" {'total':>8}")
    for rung in RUNGS:
        recorder = Recorder(workload, n)
        for _ in Engine(workload, recorder, rung=rung).run():
            pass
        work = hot_path(workload, recorder.plans, repeat)
        print(f"{rung:<8} " + " ".join(f"{work[k] * 1e6:>8.1f}" for k in keys)
              + f" {sum(work[k] for k in keys) * 1e6:>8.1f}")


def steps_and_discarded(lines: list[str]) -> tuple[int, int]:
    """A trace's steps and the tokens it discarded (0 at rungs that discard nothing)."""
    steps = [json.loads(line) for line in lines[:-1]]
    return len(steps), sum(sum(s.get("discarded", {}).values()) for s in steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--costs", default="0,0.5,1,2", help="exec costs in ms per step, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--round-trip", action="store_true",
                    help="where a round trip's time goes at each rung (the ranks' own times)")
    ap.add_argument("--rank-work", action="store_true", help="a rank's own work per step at each rung")
    args = ap.parse_args()
    workload = load_workload(serving_workload(args.requests, world_size=args.world_size))
    if args.rank_work:
        print_rank_work(workload, args.requests, max(5, args.repeat))
        return 0
    reference = {rung: list(trace_json_lines(Engine(workload, rung=rung))) for rung in RUNGS}
    counted = {rung: steps_and_discarded(reference[rung]) for rung in RUNGS}
    if args.round_trip:
        print(f"serving workload: {args.requests} requests, world size {args.world_size}: where a "
              f"round trip goes")
        print_round_trips(workload, args.costs.split(","), reference)
        return 0
    print(f"serving workload: {args.requests} requests, world size {args.world_size}, "
          f"{args.repeat} interleaved runs per rung and cost (run loop only, workers already up)")
    header = (f"{'exec cost':>9}  {'rung':<8} {'steps':>5} {'best s':>7} {'median s':>8} "
              f"{'steps/s':>7} {'discarded':>9}  overlap/full")
    print(header)
    for ms in args.costs.split(","):
        cost = parse_exec_cost(f"{float(ms) * 1000:g}us")
        times: dict[str, list[float]] = {r: [] for r in RUNGS}
        for _ in range(args.repeat):
            for rung in RUNGS:
                times[rung].append(one_run(workload, rung, cost, reference[rung]))
        best = {r: min(times[r]) for r in RUNGS}
        for rung in RUNGS:
            steps, discarded = counted[rung]
            ratio = f"{best['overlap'] / best['full']:.2f}x" if rung == "overlap" else ""
            print(f"{ms + ' ms':>9}  {rung:<8} {steps:>5} {best[rung]:>7.3f} "
                  f"{statistics.median(times[rung]):>8.3f} {steps / best[rung]:>7.0f} "
                  f"{discarded:>9}  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
