"""Counts one step's path on processes at `full`: from the distributed engine's loop handing out
a step to the trace in hand, every call into the project's own code, the files they are in, and
the calls that cross from one file into another.

    python tools/step_hops.py [--spec FILE] [--step K] [--world-size N] [-v]

`-v` lists every cross-file call, caller first. The figures in docs/ARCHITECTURE.md ("One step on
processes") are this script's on the demo's step 2 at world size 2.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import inferris_dist
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import load_workload

PARTS = ("/inferris_dist/", "/engine/", "/launcher/")


def ours(filename: str, top: str) -> str | None:
    """`filename` relative to the checkout when it is the project's own code, else None."""
    path = os.path.realpath(filename)
    if not any(part in path for part in PARTS) or os.path.basename(path) == "step_hops.py":
        return None
    return os.path.relpath(path, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", help="a workload (default: the demo)")
    ap.add_argument("--step", type=int, default=2)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("-v", action="store_true", help="list every call from one file into another")
    args = ap.parse_args()
    top = os.path.dirname(os.path.dirname(os.path.realpath(inferris_dist.__file__)))
    workload = load_workload(args.spec) if args.spec else load_workload(DEMO)
    calls = []

    def profile(frame, event, arg):
        if event != "call" or (callee := ours(frame.f_code.co_filename, top)) is None:
            return
        back = frame.f_back
        while back is not None and ours(back.f_code.co_filename, top) is None:
            back = back.f_back
        caller = ours(back.f_code.co_filename, top) if back is not None else None
        calls.append((caller, callee, frame.f_code.co_name))

    with inferris_dist.launch(workload, world_size=args.world_size) as engine:
        steps = engine.run()
        for _ in range(args.step):
            next(steps)
        sys.setprofile(profile)
        trace = next(steps)
        sys.setprofile(None)
        for _ in steps:
            pass
    files = collections.Counter(callee for _, callee, _ in calls)
    hops = [(caller, callee, name) for caller, callee, name in calls if caller != callee]
    print(f"step {trace.step}: {len(calls)} calls into our code in {len(files)} files, {len(hops)} from one "
          f"file into another")
    for name, count in sorted(files.items()):
        print(f"  {count:4d}  {name}")
    if args.v:
        for caller, callee, name in hops:
            print(f"    {caller} -> {callee}:{name}")


if __name__ == "__main__":
    main()
