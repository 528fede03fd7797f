"""What the executor boundary costs: the serving workload in process, on N worker processes,
and against the bare transport floor (ZeroMQ + msgpack broadcast and gather of the same plan
and result sizes to N processes, over a unix socket as the workers have, no engine).

    python examples/bench_boundary.py [--requests 1000] [--world-sizes 1,2,4,8,16,32,64]
                                      [--pairs 7] [--turn 30] [--quiet 0.25] [--patience 10]
                                      [--json FILE]

For each world size, each kind of pass runs in a process of its own (a heap and a collector
of its own, as a run alone has): the floor, the paced floor, in process at N ranks, on N
worker processes, and in process at 1 rank. The workers and the floors' echo processes are
started once, outside the timing, and every kind runs one pass untimed. Then come --pairs
timed pairs: in each, the kinds take turns of --turn steps (0: a whole pass each) until all
of them are through the run, so that whatever else the machine does falls on all of them
alike. Every pass on processes must give the trace the engine gives in process. Each pair
first waits (up to --patience seconds) for the rest of the machine to keep fewer than --quiet
cores busy, and the cores it kept busy during each pair are counted (from /proc) and shown: a
pair taken while other work runs is not comparable with one on a quiet machine.

The paced floor is the floor with its round trips as far apart as the steps' were on
processes: before each one it keeps its core busy, untimed, as long as the scheduler worked
between the step before's last reply and that step's first plan, in the turn just before, over
the same steps (from the steps' own records). The bare floor sends its next plan
the moment the last reply is in, so its echo processes never wait long; the ranks of a run
wait out the control plane's work every step, and a process that has waited longer takes
longer to wake (on a virtual machine above all, whose idle cores the host takes back). The
paced floor is what moving these bytes costs at this cadence, with no engine.

Overhead is processes minus in process at the same world size, per pair, against that pair's
floor and paced floor (and, beside it, minus 1 rank in process); each ratio is the median of
the pairs with their min..max. Then the rank's work per step on the wire's hot path (decode and check the
PLAN, the verdicts, encode the RESULT, then the writes into its shard) and the scheduler's
encode of the PLAN and decode of the RESULT, timed apart with no I/O. `--json FILE` writes
every figure and every pass's time too, for a script to compare two runs.
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import msgpack
import zmq
from serving import serving_workload  # examples/serving.py, beside this script

from inferris_dist import DistributedEngine, launch
from inferris_dist.engine import Engine, LocalGroup, accept_scripts, load_workload
from inferris_dist.engine.rank import RankExecutor
from inferris_dist.launcher import spawn_workers, stop_workers
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType, encode_body

HERE = Path(__file__).resolve().parent
TURN = 30
FORK = multiprocessing.get_context("fork")   # a kind's process starts from our heap: the workload
KINDS = ("floor", "in process", "processes", "in process, 1 rank", "paced floor")


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
    a PLAN (as Worker.answer does it: with overlap scheduling it also places the items planned
    ahead) and of the scheduler's encode and decode around it."""
    cfg = workload.config
    frames = [encode_body(MsgType.PLAN, p) for p in plans]
    best: dict[str, float] = {}
    clock = time.perf_counter
    for _ in range(repeat):
        rank = RankExecutor(1, cfg.world_size, cfg.num_pages, cfg.page_size, accept_scripts(workload))
        t = dict.fromkeys(("decode", "verdicts", "place", "encode", "apply", "scheduler encode",
                           "scheduler decode"), 0.0)
        for plan, frame in zip(plans, frames):
            t0 = clock()
            c = wire.decode_plan_columns(frame)
            if c.pages and max(c.pages) >= cfg.num_pages:
                raise ValueError("a page past the shard")
            ids, cols, pages = c.request_ids, c.cols, c.pages
            n = len(ids)
            t1 = clock()
            accepted = rank.accepted(ids, cols[n:2 * n], cols[3 * n:4 * n], cols[4 * n:5 * n])
            t2 = clock()
            starts, counts, num_pages = cols[:n], cols[n:2 * n], cols[5 * n:6 * n]
            ahead = bool(n and max(cols[6 * n:]))
            if ahead:
                starts, num_pages, pages = rank.place_columns(ids, starts, counts, cols[4 * n:5 * n],
                                                              num_pages, cols[6 * n:], pages)
            t3 = clock()
            if ahead:
                body = wire.encode_result_columns(ids, starts, counts, accepted, num_pages, pages)
            else:
                body = wire.encode_result_of(c, accepted)
            t4 = clock()
            rank.apply_columns(ids, starts, counts, num_pages, pages)
            t5 = clock()
            _, sent = wire.encode_plan(plan)
            t6 = clock()
            wire.decode_result(body, sent)
            t7 = clock()
            for key, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)):
                t[key] += dt
        best = {k: min(best.get(k, v), v) for k, v in t.items()}
    return {k: v / len(plans) for k, v in best.items()}


class Pass:
    """One kind of pass, run a turn of `steps` steps at a time: `begin`, then `turn` until
    `done`; `seconds` is the time its turns took, up to its last step. A run on processes
    audits every shard after its last step: not a step, and not timed."""

    def begin(self) -> None:
        self.seconds, self.done, self.traces = 0.0, False, []
        self.steps = iter(self.engine().run())

    def turn(self, steps: int) -> None:
        clock, keep, it = time.perf_counter, self.traces.append, self.steps
        t0 = clock()
        end = t0
        after = self.step_done
        for _ in range(steps):
            trace = next(it, None)
            if trace is None:
                self.done = True
                break
            keep(trace)
            end = clock()
            after()
        self.seconds += end - t0

    def step_done(self) -> None:
        """After each step, outside its time (a kind may note something of it)."""

    def lines(self) -> list[str]:
        """The pass's trace as `run --json` prints it, for the check against in process."""
        engine = self.last
        return [engine.json_line(t) for t in self.traces] + [json.dumps(engine.summary())]


class InProcess(Pass):
    """The engine with its ranks in this process. One group for every pass, as the workers
    keep their shards from one pass to the next (a rank's shard is never told of frees): both
    write over what the pass before left, alike."""

    def __init__(self, workload, world_size: int):
        self.workload = workload
        self.group = LocalGroup(workload, world_size)

    def engine(self):
        self.last = Engine(self.workload, self.group)
        return self.last


class OnProcesses(Pass):
    """The engine on N worker processes, started once (its start-up timed apart); each pass is
    a new engine on the same group, in an epoch of its own (a worker carries out a plan of an
    (epoch, step) it answered lately only once)."""

    def __init__(self, workload, world_size: int, stack: ExitStack):
        self.workload = workload
        t0 = time.perf_counter()
        self.group = stack.enter_context(launch(workload, world_size=world_size)).group
        self.startup = time.perf_counter() - t0

    def begin(self) -> None:
        super().begin()
        self.gaps, self.replied = [], None

    def step_done(self) -> None:
        """How long the scheduler worked between the last reply of the step before and the
        first send of this one (while its ranks waited), from the step's own record."""
        record = self.group.recorder.last_record
        first = min(record.sent.values())
        self.gaps.append(0.0 if self.replied is None else max(0.0, first - self.replied))
        self.replied = max(record.sent[r] + record.rtt[r] for r in record.rtt)

    def turn(self, steps: int) -> None:
        """A turn, then a pause (untimed) for the ranks' writes into their shards after their
        last reply (about 0.1 ms of work a rank here): not done in another kind's turn. A
        turn's first step has no gap before it (the other kinds' turns were)."""
        self.replied = None
        super().turn(steps)
        time.sleep(0.002 + 0.0002 * self.group.world_size)

    def engine(self):
        self.group.channel.next_epoch()
        self.last = DistributedEngine(self.workload, self.group)
        return self.last


class Floor(Pass):
    """N bare echo processes (examples/bare_echo.py), started once, on a unix socket in a
    private directory as the workers are; a step sends a recorded plan to all and gathers a
    reply of the recorded result's size from each. Paced, before each round trip it
    keeps its core busy, untimed, as long as the scheduler on processes worked before that
    step's plan in the turn just before (`gaps`, handed over by the measurement): the echo
    processes wait between round trips as long as the ranks did, and a process that has waited
    longer takes longer to wake (a virtual machine's idle cores above all)."""

    def __init__(self, sizes: list[tuple[bytes, int]], world_size: int, stack: ExitStack):
        self.sizes, self.world_size = sizes, world_size
        self.gaps = [0.0] * len(sizes)              # unpaced, until the measurement says
        self.dir = Path(tempfile.mkdtemp(prefix="bench-floor-"))
        stack.callback(shutil.rmtree, self.dir, ignore_errors=True)
        self.ctx = zmq.Context()
        stack.callback(self.ctx.term)
        self.sock = sock = self.ctx.socket(zmq.ROUTER)
        stack.callback(sock.close, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.bind(f"ipc://{self.dir}/s")
        address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        argv = lambda rank: [sys.executable, str(HERE / "bare_echo.py"), address, str(os.getpid())]
        workers = spawn_workers(argv, world_size, b"unused", None, self.dir)
        stack.callback(stop_workers, workers, grace=1.0)
        self.peers = [sock.recv_multipart()[0] for _ in range(world_size)]
        stack.callback(self.stop)

    def begin(self) -> None:
        self.seconds, self.done, self.at = 0.0, False, 0

    def turn(self, steps: int) -> None:
        sock, peers, n, clock = self.sock, self.peers, self.world_size, time.perf_counter
        todo = self.sizes[self.at:self.at + steps]
        took = 0.0
        for (body, result_len), gap in zip(todo, self.gaps[self.at:self.at + steps]):
            t0 = clock()
            while clock() - t0 < gap:          # the control plane's work before this plan
                pass
            t0 = clock()
            header = msgpack.packb(result_len)
            for peer in peers:
                sock.send_multipart([peer, header, body])
            replies = [sock.recv_multipart() for _ in range(n)]
            msgpack.unpackb(replies[0][2])
            took += clock() - t0
        self.seconds += took
        self.at += len(todo)
        self.done = self.at >= len(self.sizes)

    def lines(self) -> None:
        return None

    def stop(self) -> None:
        for peer in self.peers:
            self.sock.send_multipart([peer, b"stop", b""])


class Others:
    """How many cores the rest of the machine kept busy: all the machine's busy time (from
    /proc/stat) less that of this process and every process under it (from /proc/PID/stat),
    over a stretch of time. None where /proc cannot say."""

    TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self):
        self.at = self.read()

    def read(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]     # user .. steal
            parents, used = {}, {}
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{name}/stat") as f:
                            text = f.read()
                    except OSError:
                        continue                                        # gone meanwhile
                    fields = text[text.rindex(")") + 2:].split()
                    parents[int(name)], used[int(name)] = int(fields[1]), int(fields[11]) + int(fields[12])
        except (OSError, ValueError):
            return None
        me, ours = os.getpid(), {}

        def mine(pid: int) -> bool:
            if pid not in ours:
                ours[pid] = pid == me or (pid in parents and parents[pid] > 1 and mine(parents[pid]))
            return ours[pid]

        tree = sum(t for pid, t in used.items() if mine(pid))
        busy = sum(ticks) - ticks[3] - ticks[4]                          # less idle and iowait
        return time.monotonic(), busy / self.TICK, tree / self.TICK

    def since(self) -> float | None:
        """Cores busy elsewhere since the last call (or since made); starts the next stretch."""
        before, self.at = self.at, self.read()
        if before is None or self.at is None or self.at[0] <= before[0]:
            return None
        return max(0.0, (self.at[1] - before[1]) - (self.at[2] - before[2])) / (self.at[0] - before[0])

    def wait(self, cores: float, patience: float) -> bool:
        """Wait, a quarter second at a time, until the rest of the machine keeps fewer than
        `cores` busy, at most `patience` seconds; whether it did."""
        give_up = time.monotonic() + patience
        self.since()
        while True:
            time.sleep(0.25)
            busy = self.since()
            if busy is None or busy < cores:
                return True
            if time.monotonic() >= give_up:
                return False


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def serve(conn, make) -> None:
    """A kind's own process: make its pass (and whatever it starts), then run it as told."""
    with ExitStack() as stack:
        p = make(stack)
        conn.send(getattr(p, "startup", 0.0))
        for what, arg in iter(conn.recv, ("stop", None)):
            if what == "begin":
                p.begin()
                gc.collect()
                conn.send(None)
            elif what == "turn":
                p.turn(arg)
                conn.send((p.seconds, p.done))
            elif what == "gaps":                           # the processes': how far apart
                conn.send(p.gaps)
            elif what == "pace":                           # the paced floor's: as far apart
                p.gaps = arg
                conn.send(None)
            else:                                          # "end": its trace, then forget it
                conn.send(p.lines())
                p.traces = p.last = None


class Kind:
    """One kind of pass in a process of its own: a heap, a collector and a cache of its own, as
    a run alone has; it waits for its turn on a pipe."""

    def __init__(self, name: str, make):
        self.name = name
        self.conn, theirs = FORK.Pipe()
        self.proc = FORK.Process(target=serve, args=(theirs, make), name=f"bench {name}")
        self.proc.start()
        theirs.close()
        self.startup = self.ask()

    def ask(self, what: str | None = None, arg=None):
        """Its answer to `what` (None: to nothing asked, its first word)."""
        if what is not None:
            self.conn.send((what, arg))
        while not self.conn.poll(1.0) and self.proc.is_alive():
            pass
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise SystemExit(f"the process of {self.name} ended (exit status {self.proc.exitcode})") from None

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop", None))
            except OSError:
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def measure(requests: int, size: int, pairs: int, turns, quiet: float = 0.0, patience: float = 0.0) -> dict:
    """One world size: every pass's seconds, by kind, in pair order; the figures per pair.
    `turns`: the steps of a turn, one for each pair in turn (0: a whole pass). Each timed pair
    waits up to `patience` seconds for the rest of the machine to keep fewer than `quiet`
    cores busy."""
    workload = load_workload(serving_workload(requests, world_size=size))
    recorder = Recorder(workload, 1)
    engine = Engine(workload, recorder)
    reference = [engine.json_line(t) for t in engine.run()] + [json.dumps(engine.summary())]
    steps = len(reference) - 1
    makers = {"floor": lambda stack: Floor(recorder.sizes, size, stack),
              "in process": lambda stack: InProcess(workload, size),
              "processes": lambda stack: OnProcesses(workload, size, stack),
              "paced floor": lambda stack: Floor(recorder.sizes, size, stack)}   # right after it
    if size > 1:
        makers["in process, 1 rank"] = lambda stack: InProcess(workload, 1)
    turns, others = list(turns), Others()
    times: dict[str, list[float]] = {kind: [] for kind in makers}
    busy_elsewhere, waited_in_vain, paces = [], 0, []
    with ExitStack() as stack:
        kinds = []
        for name, make in makers.items():
            kinds.append(Kind(name, make))
            stack.callback(kinds[-1].close)
        for pair in range(pairs + 1):          # the first, untimed: every kind's first pass
            turn = turns[(pair - 1) % len(turns)] or steps
            for kind in kinds:
                kind.ask("begin")
            if pair and patience > 0:
                waited_in_vain += not others.wait(quiet, patience)
            others.since()
            left, took, gaps = list(kinds), {}, []
            while left:
                for kind in list(left):
                    if kind.name == "paced floor":      # the turn processes just took, paced alike
                        kind.ask("pace", gaps)
                    took[kind.name], done = kind.ask("turn", turn)
                    if kind.name == "processes":
                        gaps = kind.ask("gaps")
                    if done:
                        left.remove(kind)
            if len(gaps) != steps:
                raise SystemExit(f"world size {size}: {len(gaps)} gaps for {steps} steps")
            if pair:
                paces.append(sum(gaps) / steps * 1e6)
            if pair:
                busy_elsewhere.append(others.since())
            for kind in kinds:
                lines = kind.ask("end")
                if lines is not None and lines != reference:
                    raise SystemExit(f"world size {size}, {kind.name}, pass {pair}: the trace differs "
                                     f"from the engine's in process")
                if pair:
                    times[kind.name].append(took[kind.name])
        startup = next(k for k in kinds if k.name == "processes").startup
    times.setdefault("in process, 1 rank", times["in process"])
    per_step = {kind: [t / steps * 1e6 for t in ts] for kind, ts in times.items()}
    floor, local, procs, local1, paced = (times[k] for k in KINDS)
    figures = {
        "overhead/floor": [(p - q) / f for p, q, f in zip(procs, local, floor)],
        "overhead/paced floor": [(p - q) / f for p, q, f in zip(procs, local, paced)],
        "overhead vs 1 rank/floor": [(p - q) / f for p, q, f in zip(procs, local1, floor)],
        "processes/in process": [p / q for p, q in zip(procs, local)],
    }
    return {"world_size": size, "steps": steps, "startup_s": startup, "seconds": times,
            "other_cores": busy_elsewhere if None not in busy_elsewhere else None,
            "waited_in_vain": waited_in_vain,
            "turns": [turns[(pair - 1) % len(turns)] for pair in range(1, pairs + 1)],
            "us_per_step": {k: spread(v) for k, v in per_step.items()},
            "ratios": {k: spread(v) for k, v in figures.items()},
            "per_pair": figures, "recorder": recorder, "workload": workload,
            "pace_us_per_step": spread(paces)}


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}..{s['max']:.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description="the executor boundary's cost")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--world-sizes", default="1,2,4,8,16,32,64", help="comma-separated")
    ap.add_argument("--pairs", type=int, default=7, help="timed pairs per world size")
    ap.add_argument("--turn", type=int, default=TURN,
                    help="steps of one kind before the next kind's turn (0: a whole pass)")
    ap.add_argument("--quiet", type=float, default=0.25, metavar="CORES",
                    help="before each pair, wait for the rest of the machine to keep fewer cores busy")
    ap.add_argument("--patience", type=float, default=10.0, metavar="SECONDS",
                    help="the longest wait for --quiet before a pair (0: never wait)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure and pass time there")
    a = ap.parse_args()
    sizes = [int(x) for x in a.world_sizes.split(",") if x.strip()]
    if not sizes or a.pairs < 1 or a.turn < 0:
        ap.error("at least one world size, one pair, and a turn of 0 or more steps")
    rows = [measure(a.requests, size, a.pairs, [a.turn], a.quiet, a.patience) for size in sizes]

    first = rows[0]
    recorder, steps = first["recorder"], first["steps"]
    plan_bytes = sum(len(b) for b, _ in recorder.sizes) / max(1, len(recorder.sizes))
    result_bytes = sum(r for _, r in recorder.sizes) / max(1, len(recorder.sizes))
    turn = f"turns of {a.turn} steps" if a.turn else "a whole pass at a time"
    wait = f"each waiting up to {a.patience:g} s for the rest of the machine to keep under {a.quiet:g} " \
           f"cores busy" if a.patience > 0 else "none waiting for a quiet machine"
    print(f"serving workload: {a.requests} requests, {steps} steps, mean plan {plan_bytes:.0f} B, "
          f"mean result {result_bytes:.0f} B")
    print(f"{a.pairs} pairs per world size, {turn}, {wait}")
    print("per step, the median of the pairs; overhead = processes - in process, per pair, against "
          "a floor: median (min..max)")
    print(f"  {'ranks':>5}  {'in process':>10}  {'processes':>10}  {'floor':>7}  {'paced':>7}  "
          f"{'overhead/floor':<20}  {'overhead/paced':<20}  {'vs 1 rank/floor':<20}  {'start-up':>8}  "
          f"{'others':>11}")
    for row in rows:
        us, r, busy = row["us_per_step"], row["ratios"], row["other_cores"]
        per = lambda kind: f"{us[kind]['median']:.0f} us"
        busy = "" if busy is None else f"{statistics.median(busy):.2f} ({max(busy):.2f})"
        print(f"  {row['world_size']:>5}  {per('in process'):>10}  {per('processes'):>10}  "
              f"{per('floor'):>7}  {per('paced floor'):>7}  {fmt(r['overhead/floor']):<20}  "
              f"{fmt(r['overhead/paced floor']):<20}  {fmt(r['overhead vs 1 rank/floor']):<20}  "
              f"{row['startup_s']:>7.2f}s  {busy:>11}")
    paces = ", ".join(f"{row['pace_us_per_step']['median']:.0f}" for row in rows)
    print(f"(paced: the floor with its round trips as far apart as the steps' were on processes, "
          f"the scheduler's time between them: {paces} us a step; vs 1 rank: processes - 1 rank "
          f"in process; others: cores the rest of the machine kept busy during a pair, median (max))")
    for row in rows:
        if row["waited_in_vain"]:
            print(f"  world size {row['world_size']}: {row['waited_in_vain']} of {a.pairs} pairs began "
                  f"on a machine busier than that")
    print("each pass over the pairs, max / min:")
    for row in rows:
        us = row["us_per_step"]
        kinds = [k for k in KINDS if row["world_size"] > 1 or k != "in process, 1 rank"]
        print(f"  {row['world_size']:>5}  " + ", ".join(f"{kind} {us[kind]['max'] / us[kind]['min']:.2f}x"
                                                      for kind in kinds)
              + f"; processes / in process {fmt(row['ratios']['processes/in process'])}")

    micro_repeat = max(a.pairs, 5)
    micro = hot_path(first["workload"], recorder.plans, micro_repeat)
    items = sum(len(p.items) for p in recorder.plans) / max(1, len(recorder.plans))
    print(f"a rank's hot path, per step ({items:.0f} items; best of {micro_repeat} passes, no I/O): "
          + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in micro.items() if not k.startswith("sched")))
    print("  the scheduler's side: " + ", ".join(f"{k.split()[1]} {v * 1e6:.1f} us"
                                                 for k, v in micro.items() if k.startswith("sched")))
    if a.json:
        keep = ("steps", "startup_s", "other_cores", "waited_in_vain", "us_per_step", "ratios", "per_pair",
                "seconds", "pace_us_per_step")
        doc = {"requests": a.requests, "pairs": a.pairs, "turn": a.turn, "quiet": a.quiet,
               "patience": a.patience,
               "mean_plan_bytes": plan_bytes, "mean_result_bytes": result_bytes,
               "hot_path_us": {k: v * 1e6 for k, v in micro.items()},
               "world_sizes": {str(row["world_size"]): {k: row[k] for k in keep} for row in rows}}
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
