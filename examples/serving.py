"""A serving-shaped workload and the engine's speed on it.

    python examples/serving.py                 # in-process: steps/s and wall time
    python examples/serving.py --write w.json  # just write the workload
    python examples/serving.py --requests 200 --world-size 4

1,000 requests, 8 shared system prompts of 64 to 512 tokens, user parts of 16
to 768 tokens, page_size 16, 2,048 pages, max_step_tokens 2,048, spec_len 3,
accept scripts on most requests, a few stopping at EOS. Seeded: the same
workload every time.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inferris_dist.engine import Engine, LocalGroup, load_workload, run_workload

# the naive SPEC implementation the tests use as their oracle: a script of the standard library
# alone, run as a program (it is not part of the installed package)
NAIVE = Path(__file__).resolve().parent.parent / "tests" / "helpers" / "naive_reference.py"


def serving_workload(num_requests: int = 1000, seed: int = 7, world_size: int = 1) -> dict:
    rng = random.Random(seed)
    system_prompts = [[rng.randrange(1, 50_000) for _ in range(rng.randint(64, 512))]
                      for _ in range(8)]
    requests = []
    for i in range(num_requests):
        user = [1_000_000 + i * 1000 + t for t in range(rng.randint(16, 768))]
        req = {"request_id": f"q{i:04d}", "tokens": rng.choice(system_prompts) + user,
               "max_new_tokens": rng.randint(8, 96), "arrival_step": i // 3}
        if rng.random() < 0.8:
            req["accept_script"] = [rng.randint(0, 3) for _ in range(rng.randint(4, 40))]
        if rng.random() < 0.05:
            req["eos_after"] = rng.randint(0, 20)
        requests.append(req)
    return {"engine": {"max_step_tokens": 2048, "page_size": 16, "num_pages": 2048,
                       "spec_len": 3, "world_size": world_size},
            "requests": requests}


def naive_lines(data: dict) -> list[dict]:
    """The trace of the naive SPEC implementation (a child process) on the workload `data`."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        json.dump(data, spec)
        spec.flush()
        done = subprocess.run([sys.executable, str(NAIVE), spec.name], capture_output=True, text=True)
    if done.returncode not in (0, 1):                       # 1: the run ended in an error line
        raise SystemExit(f"{NAIVE.name} failed: {done.stderr.strip()[-500:]}")
    return [json.loads(line) for line in done.stdout.splitlines()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", metavar="FILE", help="write the workload JSON and stop")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (the best is reported)")
    ap.add_argument("--check", action="store_true",
                    help="also run tests/helpers/naive_reference.py (slow) and compare the traces")
    a = ap.parse_args()
    data = serving_workload(a.requests, a.seed, a.world_size)
    if a.write:
        Path(a.write).write_text(json.dumps(data))
        return 0
    workload = load_workload(data)
    best = None
    for _ in range(a.repeat):
        engine = Engine(workload, LocalGroup(workload))
        t0 = time.perf_counter()
        num_steps = sum(1 for _ in engine.run())
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    tokens = sum(s["computed"] for s in engine.summary())
    print(f"serving workload: {a.requests} requests, world_size {a.world_size}, {num_steps} steps")
    print(f"engine time {best:.3f} s (best of {a.repeat}), {num_steps / best:,.0f} steps/s, "
          f"{best / num_steps * 1e6:.0f} us/step, final computed tokens {tokens:,}")
    if a.check:
        t0 = time.perf_counter()
        same = naive_lines(data) == run_workload(workload)
        print(f"naive SPEC implementation: {time.perf_counter() - t0:.1f} s, trace "
              f"{'identical' if same else 'DIFFERENT'}")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
