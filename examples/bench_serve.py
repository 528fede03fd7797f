"""What watching a run live costs the step loop: the serving workload under `launch`, plain, with a
wire log, with `--serve`, with `--serve` and one page connected to its event stream, and with
`--serve` and CLIENTS local clients at nice 19 each asking for the live page (`GET /`) again and
again, closing after each answer.

    python examples/bench_serve.py [--requests 300] [--world-size 2] [--costs 0,1] [--repeat 5] [--clients 15]

Each mode runs `--repeat` times, the modes interleaved (a noisy machine drifts: an interleaved
comparison is the fair one). The figure is the scheduler's own time per step, from the run's
`--metrics` document (`steps.wall_s`: plan, round trips, join, commit), so start-up and the
server's linger are not in it; the best and the median of the repeats are printed, and each
mode's best against the plain run's. The connected page is a client that reads the event
stream (/events) as the page does, decoding every message (its drawing is not done: the
browser's own work would run in another process, as this client does). Every run's trace is
checked against the plain run's: the figures are of runs that printed the same bytes. Beside the
time per step, each mode's run time (the sum of its steps' times) is printed, best and median.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from serving import serving_workload  # examples/serving.py, beside this script

CLI = Path(sys.executable).with_name("inferris-dist")
MODES = ("plain", "wire log", "serve", "serve + page", "serve + clients")


def reader(url: str, stop: threading.Event, got: list) -> None:
    """A page's part: the event stream read and every message decoded, until the run ends."""
    host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        buf = b""
        while not stop.is_set():
            try:
                chunk = s.recv(1 << 20)
            except socket.timeout:
                continue
            if not chunk:
                return
            buf += chunk
            while b"\n\n" in buf:
                message, buf = buf.split(b"\n\n", 1)
                for line in message.split(b"\n"):
                    if line.startswith(b"data: "):
                        news = json.loads(line[6:])
                        got.append(len(line))
                        if news["live"]["ended"]:
                            return


def asker() -> None:
    """A local client (`--client`): started before the run, so that its interpreter's start is
    not the run's cost; told the URL on stdin once the server is up, then the live page asked
    for, read whole, the connection closed, again and again until it is stopped or the server
    is gone."""
    url = sys.stdin.readline().strip()
    if not url:
        return
    host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                while s.recv(1 << 20):
                    pass
        except OSError:
            return


def askers(n: int) -> list[subprocess.Popen]:
    """`n` clients at nice 19, started and waiting for the URL (`tell`)."""
    return [subprocess.Popen([sys.executable, __file__, "--client"], preexec_fn=lambda: os.nice(19),
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             text=True)
            for _ in range(n)]


def tell(clients: list[subprocess.Popen], url: str) -> None:
    for p in clients:
        p.stdin.write(url + "\n")
        p.stdin.close()


def one_run(spec: Path, mode: str, cost: str, tmp: Path, clients: int) -> tuple[float, int, list[str], int]:
    """(seconds per step, steps, the trace's lines, event messages a page took)."""
    metrics = tmp / "m.json"
    args = [str(CLI), "launch", "--spec", str(spec), "--exec-cost", cost, "--json", "--metrics", str(metrics)]
    if mode == "wire log":
        args += ["--wire-log", str(tmp / "w.log")]
    if mode.startswith("serve"):
        args += ["--serve", "127.0.0.1:0"]
    asking = askers(clients) if mode == "serve + clients" else []
    proc = subprocess.Popen(args, stdout=open(tmp / "out.jsonl", "w"), stderr=subprocess.PIPE, text=True)
    got: list = []
    stop = threading.Event()
    page = None
    if mode.startswith("serve"):
        line = proc.stderr.readline()
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        if mode == "serve + page":
            page = threading.Thread(target=reader, args=(url, stop, got), daemon=True)
            page.start()
        if mode == "serve + clients":
            tell(asking, url)
    proc.stderr.read()
    failed = proc.wait() != 0
    stop.set()
    for p in asking:
        p.kill()
        p.wait()
    if failed:
        raise SystemExit(f"{mode}: launch failed")
    if page is not None:
        page.join(10)
    wall = json.loads(metrics.read_text())["steps"]["wall_s"]
    lines = (tmp / "out.jsonl").read_text().splitlines()
    return sum(wall) / len(wall), len(wall), lines, len(got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--costs", default="0,1", help="exec costs in ms per step, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clients", type=int, default=15, help="local clients asking for / (serve + clients)")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)     # one of them
    args = ap.parse_args()
    if args.client:
        asker()
        return 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        spec = tmp / "w.json"
        spec.write_text(json.dumps(serving_workload(args.requests, world_size=args.world_size)))
        print(f"serving workload: {args.requests} requests, world size {args.world_size}, "
              f"{os.cpu_count()} cores, best and median of {args.repeat} interleaved runs; "
              f"serve + clients: {args.clients} clients at nice 19 asking for / and closing")
        for cost in args.costs.split(","):
            cost_flag = f"{float(cost)}ms"
            times: dict[str, list[float]] = {m: [] for m in MODES}
            reference, messages, steps = None, [], 0
            for _ in range(args.repeat):
                for mode in MODES:
                    per_step, steps, lines, got = one_run(spec, mode, cost_flag, tmp, args.clients)
                    if reference is None:
                        reference = lines
                    elif lines != reference:
                        raise SystemExit(f"{mode}: the trace differs from the plain run's")
                    times[mode].append(per_step)
                    if mode == "serve + page":
                        messages.append(got)
            print(f"exec cost {cost_flag}: {steps} steps; the page took {statistics.median(messages):.0f} "
                  f"messages a run")
            best_plain = min(times["plain"])
            for mode in MODES:
                best, median = min(times[mode]), statistics.median(times[mode])
                print(f"  {mode:<15} {best * 1e6:8.0f} us/step best  {median * 1e6:8.0f} median  "
                      f"{best / best_plain:5.3f}x plain   run {best * steps:6.2f} s best  "
                      f"{median * steps:6.2f} s median  {median / statistics.median(times['plain']):5.3f}x "
                      f"plain's median")
            served, loaded = times["serve"], times["serve + clients"]
            print(f"  serve + clients against serve: {min(loaded) / min(served):5.3f}x best, "
                  f"{statistics.median(loaded) / statistics.median(served):5.3f}x median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
