"""What the executor boundary costs: the serving workload in process, on N
worker processes, and the bare transport floor (ZeroMQ + msgpack broadcast and
gather of the same plan and result sizes to N processes, no engine).

    python examples/bench_boundary.py [--requests 1000] [--world-size 4]

Prints engine time for each, the distributed/in-process ratio, the
per-step boundary overhead against the floor's per-step cost, and a rank's own
work per step on the wire's hot path (decode and check the PLAN, the verdicts,
encode the RESULT, then the writes into its shard), with the scheduler's
encode of the PLAN and decode of the RESULT.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import zmq
from serving import serving_workload  # examples/serving.py, beside this script

from inferris_dist import launch
from inferris_dist.engine import Engine, LocalGroup, accept_scripts, load_workload
from inferris_dist.engine.rank import RankExecutor
from inferris_dist.launcher import spawn_workers, stop_workers
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType, encode_body

HERE = Path(__file__).resolve().parent


class Recorder(LocalGroup):
    """The in-process group, keeping each step's plan and result sizes for the floor."""

    def __init__(self, workload, world_size):
        super().__init__(workload, world_size)
        self.sizes: list[tuple[bytes, int]] = []
        self.plans = []

    def execute(self, plan):
        result = super().execute(plan)
        result_len = len(encode_body(MsgType.RESULT, result.outcomes))
        self.sizes.append((encode_body(MsgType.PLAN, plan), result_len))
        self.plans.append(plan)
        return result


def hot_path(workload, plans, repeat: int) -> dict[str, float]:
    """Seconds per step (best of `repeat` passes over the run's plans) of what a rank does with
    a PLAN (as Worker.answer does it) and of the scheduler's encode and decode around it."""
    cfg = workload.config
    frames = [encode_body(MsgType.PLAN, p) for p in plans]
    best: dict[str, float] = {}
    clock = time.perf_counter
    for _ in range(repeat):
        rank = RankExecutor(1, cfg.world_size, cfg.num_pages, cfg.page_size, accept_scripts(workload))
        t = dict.fromkeys(("decode", "verdicts", "encode", "apply", "scheduler encode",
                           "scheduler decode"), 0.0)
        for plan, frame in zip(plans, frames):
            t0 = clock()
            c = wire.decode_plan_columns(frame)
            if c.pages and max(c.pages) >= cfg.num_pages:
                raise ValueError("a page past the shard")
            ids, cols = c.request_ids, c.cols
            n = len(ids)
            t1 = clock()
            accepted = rank.accepted(ids, cols[n:2 * n], cols[3 * n:4 * n], cols[4 * n:5 * n])
            t2 = clock()
            body = wire.encode_result_of(c, accepted)
            t3 = clock()
            rank.apply_columns(ids, cols[:n], cols[n:2 * n], cols[5 * n:], c.pages)
            t4 = clock()
            _, sent = wire.encode_plan(plan)
            t5 = clock()
            wire.decode_result(body, sent)
            t6 = clock()
            for key, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                t[key] += dt
        best = {k: min(best.get(k, v), v) for k, v in t.items()}
    return {k: v / len(plans) for k, v in best.items()}


def in_process(workload, world_size: int) -> tuple[float, int]:
    engine = Engine(workload, LocalGroup(workload, world_size))
    t0 = time.perf_counter()
    steps = sum(1 for _ in engine.run())
    return time.perf_counter() - t0, steps


def distributed(workload, world_size: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    with launch(workload, world_size=world_size) as engine:
        t1 = time.perf_counter()
        steps = sum(1 for _ in engine.run())
        t2 = time.perf_counter()
    return t2 - t1, t1 - t0, steps


def floor(sizes: list[tuple[bytes, int]], world_size: int) -> float:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.bind("tcp://127.0.0.1:0")
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    argv = lambda rank: [sys.executable, str(HERE / "bare_echo.py"), address, str(os.getpid())]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    workers = spawn_workers(argv, world_size, b"unused", None, log_dir)
    try:
        peers = [sock.recv_multipart()[0] for _ in range(world_size)]
        t0 = time.perf_counter()
        for body, result_len in sizes:
            header = msgpack.packb(result_len)
            for peer in peers:
                sock.send_multipart([peer, header, body])
            replies = [sock.recv_multipart() for _ in range(world_size)]
            msgpack.unpackb(replies[0][2])
        elapsed = time.perf_counter() - t0
        for peer in peers:
            sock.send_multipart([peer, b"stop", b""])
    finally:
        stop_workers(workers, grace=1.0)
        sock.close(0)
        ctx.term()
        shutil.rmtree(log_dir, ignore_errors=True)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description="the executor boundary's cost")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--world-size", type=int, default=4, help="the detailed figures' world size")
    ap.add_argument("--world-sizes", default="1,2,4,8,16,32,64",
                    help="the table's world sizes, comma-separated ('' for none)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the best is reported")
    a = ap.parse_args()
    n = a.world_size
    workload = load_workload(serving_workload(a.requests, world_size=n))

    local1, steps = min(in_process(workload, 1) for _ in range(a.repeat))
    localn, _ = min(in_process(workload, n) for _ in range(a.repeat))
    runs = [distributed(workload, n) for _ in range(a.repeat)]
    dist, startup = min(r[0] for r in runs), min(r[1] for r in runs)
    recorder = Recorder(workload, 1)
    for _ in Engine(workload, recorder).run():
        pass
    bare = min(floor(recorder.sizes, n) for _ in range(a.repeat))
    plan_bytes = sum(len(b) for b, _ in recorder.sizes) / steps
    result_bytes = sum(r for _, r in recorder.sizes) / steps

    us = lambda seconds: f"{seconds / steps * 1e6:7.0f} us/step"
    print(f"serving workload: {a.requests} requests, {steps} steps, mean plan {plan_bytes:.0f} B, "
          f"mean result {result_bytes:.0f} B, world size {n}, best of {a.repeat}")
    print(f"  in process, 1 rank      {local1:6.3f} s  {us(local1)}")
    print(f"  in process, {n} ranks     {localn:6.3f} s  {us(localn)}")
    print(f"  {n} worker processes     {dist:6.3f} s  {us(dist)}   (+{startup:.2f} s start-up)")
    print(f"  transport floor, {n} procs {bare:6.3f} s  {us(bare)}")
    print(f"distributed / in process: {dist / localn:.2f}x against {n} ranks in process, "
          f"{dist / local1:.2f}x against 1 rank")
    # The boundary's cost per step: what the processes add to the same work done in process.
    # Against 1 rank in process it also counts the other ranks' work, which the processes
    # do in parallel but on this machine's cores.
    for label, base in ((f"{n} ranks", localn), ("1 rank", local1)):
        extra = dist - base
        print(f"boundary overhead vs {label} in process: {extra / steps * 1e6:5.0f} us/step, "
              f"{extra / bare:.2f}x the floor's {bare / steps * 1e6:.0f} us/step")
    micro = hot_path(workload, recorder.plans, max(a.repeat, 5))
    items = sum(len(p.items) for p in recorder.plans) / max(1, len(recorder.plans))
    print(f"a rank's hot path, per step ({items:.0f} items; best of {max(a.repeat, 5)} passes, no I/O): "
          + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in micro.items() if not k.startswith("sched")))
    print("  the scheduler's side: " + ", ".join(f"{k.split()[1]} {v * 1e6:.1f} us"
                                                 for k, v in micro.items() if k.startswith("sched")))
    sizes = [int(x) for x in a.world_sizes.split(",") if x.strip()]
    if sizes:
        print(f"\nper step by world size (best of {a.repeat}; overhead = processes - in process, "
              f"against the floor)")
        print(f"  {'ranks':>5}  {'in process':>10}  {'processes':>10}  {'floor':>8}  "
              f"{'overhead/floor':>14}  {'start-up':>8}")
        for size in sizes:
            w = load_workload(serving_workload(a.requests, world_size=size))
            local, steps_n = min(in_process(w, size) for _ in range(a.repeat))
            runs = [distributed(w, size) for _ in range(a.repeat)]
            on_procs, up = min(r[0] for r in runs), min(r[1] for r in runs)
            bare_n = min(floor(recorder.sizes, size) for _ in range(a.repeat))
            per = lambda t: f"{t / steps_n * 1e6:.0f} us"
            print(f"  {size:>5}  {per(local):>10}  {per(on_procs):>10}  {per(bare_n):>8}  "
                  f"{(on_procs - local) / bare_n:>13.2f}x  {up:>7.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
