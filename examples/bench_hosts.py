"""What ranks on other hosts cost per step: the serving workload at world size N with
workers that join a `--listen` scheduler, on loopback without and with CURVE, and across
network namespaces (veth, CURVE). Needs root and iproute2 for the namespaces.

    python examples/bench_hosts.py [--requests 1000] [--world-size 4] [--repeat 3]   # as root

Prints per-step cost (engine loop time / steps; median and best of --repeat interleaved
runs) for each, and the two
ratios: CURVE / plaintext on loopback, veth / loopback with CURVE.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serving import serving_workload  # examples/serving.py, beside this script

from inferris_dist import launch
from inferris_dist.engine import load_workload
from inferris_dist.protocol.keys import write_keys

REPO = Path(__file__).resolve().parent.parent


def inner(a) -> int:
    """One run, in whatever namespace we were started: print {"steps", "seconds"} as JSON."""
    workload = load_workload(serving_workload(a.requests, world_size=a.world_size))
    prefixes = json.loads(a.worker_prefixes)
    workers: list[subprocess.Popen] = []

    def start(address, ranks, timeout, rejoin):
        for r in ranks:
            argv = [*prefixes[r % len(prefixes)], sys.executable, "-m", "inferris_dist.rank",
                    "--connect", address, "--rank", str(r), "--world-size", str(a.world_size)]
            if a.keys:
                argv += ["--keys", a.keys]
            workers.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    try:
        with launch(workload, listen=a.listen, keys=a.keys, on_waiting=start) as engine:
            t0 = time.perf_counter()
            steps = sum(1 for _ in engine.run())
            seconds = time.perf_counter() - t0
    finally:
        for w in workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
    print(json.dumps({"steps": steps, "seconds": seconds}))
    return 0


@contextlib.contextmanager
def namespace_hosts(names: list[str]):
    """Hosts as network namespaces, made by the tests' helper (tests/helpers/netns.py) run as a
    child from the repository's root, kept until the block ends; its one JSON line:
    {"skip": reason}, or {"addr": {name: address}, "argv": {name: prefix}}."""
    child = subprocess.Popen([sys.executable, "-m", "tests.helpers.netns", *names], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        yield json.loads(line) if line else {"skip": "the namespace helper ended without a word"}
    finally:
        child.stdin.close()                        # the helper removes the namespaces, then exits
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()


def run_once(a, listen: str, keys: str | None, sched_prefix: list[str],
             worker_prefixes: list[list[str]]) -> tuple[float, int]:
    argv = [*sched_prefix, sys.executable, __file__, "--inner", "--listen", listen,
            "--requests", str(a.requests), "--world-size", str(a.world_size),
            "--worker-prefixes", json.dumps(worker_prefixes)]
    if keys:
        argv += ["--keys", keys]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"bench run failed: {done.stderr.strip()[-500:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got["seconds"], got["steps"]


def main() -> int:
    ap = argparse.ArgumentParser(description="per-step cost across hosts and with CURVE")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--listen", help=argparse.SUPPRESS)
    ap.add_argument("--keys", help=argparse.SUPPRESS)
    ap.add_argument("--worker-prefixes", default="[[]]", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        return inner(a)
    keys = tempfile.mkdtemp(prefix="bench-keys-")
    write_keys(keys, a.world_size)
    configs = {"loopback, plaintext": ("tcp://127.0.0.1:0", None, [], [[]]),
               "loopback, CURVE": ("tcp://127.0.0.1:0", keys, [], [[]])}
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(namespace_hosts(["sched", "a", "b"]))
        if "skip" not in hosts:
            configs["veth (3 namespaces), CURVE"] = (f"tcp://{hosts['addr']['sched']}:0", keys,
                                                     hosts["argv"]["sched"],
                                                     [hosts["argv"]["a"], hosts["argv"]["b"]])
        else:
            print(f"(no namespaces: {hosts['skip']})")
        # interleaved, so that the machine's moods fall on every configuration alike
        times: dict[str, list[float]] = {name: [] for name in configs}
        steps = 0
        for _ in range(a.repeat):
            for name, config in configs.items():
                seconds, steps = run_once(a, *config)
                times[name].append(seconds)
    print(f"serving workload: {a.requests} requests, {steps} steps, world size {a.world_size}, "
          f"workers joining a --listen scheduler, {a.repeat} interleaved runs of each")
    print(f"  {'':28} {'median':>17}  {'best':>17}")
    for name, ts in times.items():
        med, best = statistics.median(ts), min(ts)
        print(f"  {name:28} {med:6.3f} s {med / steps * 1e6:5.0f} us/step  "
              f"{best:6.3f} s {best / steps * 1e6:5.0f} us/step")

    def ratio(x: str, y: str) -> str:
        per_run = [p / q for p, q in zip(times[x], times[y])]
        return (f"{statistics.median(times[x]) / statistics.median(times[y]):.2f}x (medians), "
                f"per-run pairs {min(per_run):.2f}..{max(per_run):.2f}")

    print(f"CURVE / plaintext, loopback: {ratio('loopback, CURVE', 'loopback, plaintext')}")
    if "veth (3 namespaces), CURVE" in times:
        print(f"veth / loopback, CURVE:      {ratio('veth (3 namespaces), CURVE', 'loopback, CURVE')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
