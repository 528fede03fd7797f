"""Synthetic wire logs that strain the page, written record by record in the writer's format
(tests/test_page_scale.py checks every record against wirelog/schema.py): for the page's
tests and for examples/bench_page.py.

- `restarts_log`: many ranks restarted over and over (a loss, the failed attempt, the restart,
  the new member, the same step joined); with `messages`, every plan and result too.
- `lanes_log`: many requests that change state at every step (half of them run in turn).
- `hostile_numbers`: records holding the biggest numbers they may, in every field.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

COUNTERS = ("requests_running", "requests_waiting", "requests_preempted", "pages_used", "pages_free",
            "pages_cached", "prefix_hit_tokens", "drafted_tokens", "accepted_tokens", "batch_tokens",
            "batch_requests")


class _Writer:
    def __init__(self, out: TextIO, t: float = 50.0):
        self.out = out
        self.t = t

    def tick(self, dt: float) -> float:
        self.t += dt
        return round(self.t, 6)

    def event(self, event: str, dt: float = 0.00001, **fields) -> None:
        self.out.write(json.dumps({"t": self.tick(dt), "event": event, **fields}) + "\n")

    def message(self, direction: str, rank: int, epoch: int, step: int, kind: str, size: int, body,
                dt: float = 0.000004, **extra) -> None:
        self.out.write(json.dumps({"t": self.tick(dt), "dir": direction, "rank": rank, "epoch": epoch,
                                   "step": step, "type": kind, "bytes": size, "body": body, **extra}) + "\n")

    def run(self, name: str, world: int, requests: int, policy: str = "restore", faults=()) -> None:
        self.event("run", 0, name=name, world_size=world, rung="full", policy=policy, max_restarts=1 << 20,
                   faults=list(faults), config={"max_step_tokens": 64, "page_size": 16, "num_pages": 512,
                                                "spec_len": 0, "world_size": world},
                   requests=requests, scheduler_pid=4000, listen=None, shared_clock=True,
                   workload_digest="sha256:" + "0" * 64)


def trace(step: int, admitted=(), scheduled=(), finished=None, full: bool = True) -> dict:
    """A step's trace; without `full`, what ran is listed once (in `scheduled`), not three times."""
    ran = list(scheduled)
    return {"step": step, "admitted": list(admitted), "scheduled": ran,
            "executed": {r: 1 for r in ran} if full else {},
            "sampled": {r: "TOKEN" for r in ran} if full else {}, "finished": dict(finished or {}),
            "preempted": [], "reused": {}, "published": {}, "evicted": [], "drafted": {}, "accepted": {},
            "rolled_back": {}}


def counters(running: int, waiting: int) -> dict:
    values = dict.fromkeys(COUNTERS, 0)
    values.update(requests_running=running, requests_waiting=waiting, batch_tokens=running,
                  batch_requests=running, pages_used=running, pages_free=512 - running)
    return values


def restarts_log(path: Path, ranks: int = 128, restarts: int = 10_000, messages: bool = False) -> Path:
    """`restarts` times: rank (i mod `ranks`) dies at step i, is restarted into the next epoch
    by `restore` (a new pid), and step i is tried again and joins. With `messages`, every plan
    and result of every attempt and the new member's handshake are in the log too."""
    with open(path, "w") as f:
        w = _Writer(f)
        w.run("restarts", ranks, 1, faults=[f"{i % ranks}:crash@{i}" for i in range(min(restarts, 8))])
        pids = [10_000 + r for r in range(ranks)]
        for r in range(ranks):
            if messages:
                w.message("in", r, 0, 0, "HELLO", 38, {"pid": pids[r], "proof": ""})
                w.message("out", r, 0, 0, "CONFIG", 12, {"num_pages": 512, "page_size": 16, "shard": []})
                w.message("in", r, 0, 0, "READY", 1, [])
            w.event("member", rank=r, epoch=0, pid=pids[r], host="", proof="run secret")
        items = [{"request_id": "q", "start_position": 0, "num_tokens": 1, "draft_len": 0, "decode": True,
                  "verdict_index": 0, "placements": [0]}]
        outcome = [{"request_id": "q", "start_position": 0, "executed_tokens": 1, "accepted": 0,
                    "writes": [0]}]
        epoch = 0

        items_json, outcome_json = json.dumps(items), json.dumps(outcome)

        def attempt(step: int, lost: int | None) -> None:
            """What `w.message` writes for each plan and result, the bodies encoded once (fast)."""
            if not messages:
                w.tick(0.0008)
                return
            sent = []
            plan = f'{{"step": {step}, "items": {items_json}}}'
            for r in range(ranks):
                f.write(f'{{"t": {w.tick(0.000004)}, "dir": "out", "rank": {r}, "epoch": {epoch}, '
                        f'"step": {step}, "type": "PLAN", "bytes": 46, "body": {plan}}}\n')
                sent.append(w.t)
            for r in range(ranks):
                if r != lost:
                    rtt = 0.0004 + 0.000001 * r
                    got = sent[r] + 0.0001
                    inside = ", ".join(repr(round(got + d, 6)) for d in (0, 0.00002, 0.00006, 0.00007))
                    f.write(f'{{"t": {w.tick(0.000004)}, "dir": "in", "rank": {r}, "epoch": {epoch}, '
                            f'"step": {step}, "type": "RESULT", "bytes": 33, "body": {outcome_json}, '
                            f'"sent": {round(sent[r], 6)!r}, "rtt": {round(rtt, 6)!r}, '
                            f'"inside": [{inside}]}}\n')

        for i in range(restarts):
            lost = i % ranks
            w.event("phase", phase="prepare", step=i, dur=0.00004)
            attempt(i, lost)
            w.event("rank-lost", 0.0002, rank=lost, ranks=[lost], step=i, epoch=epoch, reason="died",
                    message=f"rank {lost} died before answering step {i} (killed by SIGKILL)")
            w.event("attempt", step=i, epoch=epoch, verdict=f"rank {lost} lost (died)", plan_bytes=46)
            epoch += 1
            pids[lost] += ranks
            w.event("restart", ranks=[lost], epoch=epoch, step=i, shard_pages=4, policy="restore")
            if messages:
                w.message("in", lost, epoch, i, "HELLO", 38, {"pid": pids[lost], "proof": ""}, dt=0.001)
                w.message("out", lost, epoch, i, "CONFIG", 12, {"num_pages": 512, "page_size": 16,
                                                                 "shard": []})
                w.message("in", lost, epoch, i, "READY", 1, [])
            w.event("member", 0.001, rank=lost, epoch=epoch, pid=pids[lost], host="", proof="run secret")
            attempt(i, None)
            w.event("attempt", step=i, epoch=epoch, verdict="joined", plan_bytes=46)
            w.event("phase", phase="commit", step=i, dur=0.00002)
            w.event("step", step=i, epoch=epoch, trace=trace(i, ["q"] if i == 0 else [], ["q"]),
                    counters=counters(1, 0), prompt_tokens=24 if i == 0 else 0)
        w.event("end", 0.001, status="ok", error=None, steps=restarts)
    return path


def lanes_log(path: Path, lanes: int = 200, steps: int = 40_000) -> Path:
    """`lanes` requests admitted at step 0, half of them running at each step and the other
    half at the next, for `steps` steps: step events only, what ran listed once in each (no
    plan crosses, no phase is logged: the page's request lanes and little else)."""
    ids = [f"r{i}" for i in range(lanes)]
    halves = [ids[0::2], ids[1::2]]
    with open(path, "w") as f:
        w = _Writer(f)
        w.run("lanes", 1, lanes, policy="abort")
        w.event("member", rank=0, epoch=0, pid=10_000, host="", proof="run secret")
        # a step between the first and the last, as `w.event` writes it, after its step number
        # (the same for every such step of a half: encoded once, fast)
        rest = [json.dumps(trace(0, (), ran, None, full=False)).removeprefix('{"step": 0') + ", "
                + json.dumps({"counters": counters(len(ran), lanes - len(ran)), "prompt_tokens": 0})[1:]
                for ran in halves]
        for step in range(steps):
            ran = halves[step % 2]
            last = step == steps - 1
            if 0 < step and not last:
                f.write(f'{{"t": {w.tick(0.0008)}, "event": "step", "step": {step}, "epoch": 0, '
                        f'"trace": {{"step": {step}{rest[step % 2]}\n')
                continue
            finished = {r: "LENGTH" for r in ids} if last else None
            w.event("step", 0.0008, step=step, epoch=0,
                    trace=trace(step, ids if step == 0 else (), ran, finished, full=False),
                    counters=counters(len(ran), lanes - len(ran)),
                    prompt_tokens=24 * lanes if step == 0 else 0)
        w.event("end", 0.001, status="ok", error=None, steps=steps)
    return path


HUGE = 2 ** 53 - 1
EPOCH = 2 ** 31 - 1


def hostile_numbers() -> list[dict]:
    """Records with every numeric field at the biggest the schema lets it be, or past it."""
    return [
        {"t": 1.0, "event": "run", "name": "n", "world_size": HUGE, "rung": "full", "policy": "restore",
         "faults": [], "config": {}, "requests": HUGE, "scheduler_pid": HUGE, "listen": None,
         "shared_clock": True},
        {"t": 1.1, "event": "member", "rank": 4095, "epoch": EPOCH, "pid": HUGE, "host": "", "proof": ""},
        {"t": 1.2, "event": "phase", "phase": "prepare", "step": HUGE, "dur": 1e12},
        {"t": 1.3, "event": "attempt", "step": HUGE, "epoch": EPOCH, "verdict": "joined", "plan_bytes": HUGE},
        {"t": 1.4, "event": "step", "step": HUGE, "epoch": EPOCH,
         "trace": {"step": HUGE, "executed": {"r": HUGE}, "evicted": list(range(1000)) + [HUGE]},
         "counters": {k: HUGE for k in ("requests_running", "pages_free", "batch_tokens")}},
        {"t": 1.5, "event": "idle", "first": 0, "last": HUGE, "text": "x"},
        {"t": 1.6, "event": "rank-lost", "rank": HUGE, "ranks": [0, HUGE, -HUGE], "step": HUGE, "epoch": HUGE,
         "reason": "died", "message": "m"},
        {"t": 1.7, "event": "restart", "ranks": list(range(10_000)) + [HUGE], "epoch": EPOCH,
         "step": HUGE, "shard_pages": HUGE, "policy": "restore", "pids": [HUGE] * 50},
        {"t": 1.8, "event": "rejoin-wait", "ranks": [0, HUGE], "dur": 1e12, "joined": False},
        {"t": 1.9, "event": "partition", "rank": 4095, "step": HUGE, "epoch": 0, "seconds": 1e12},
        {"t": 2.0, "event": "audit-failed", "rank": HUGE, "step": HUGE, "epoch": 0, "page": HUGE,
         "offset": HUGE, "message": "m"},
        {"t": 2.1, "event": "turned-away", "messages": {f"p{i}": HUGE for i in range(1000)},
         "connections": {"x": HUGE}, "member_replies_dropped": {}, "shed": HUGE},
        {"t": 2.2, "dir": "out", "rank": 4095, "epoch": EPOCH, "step": HUGE, "type": "PLAN", "bytes": HUGE,
         "body": {"step": HUGE, "items": [{"request_id": "r", "start_position": HUGE, "num_tokens": HUGE,
                                           "placements": list(range(5000))}]}},
        {"t": 2.3, "dir": "in", "rank": 4095, "epoch": EPOCH, "step": HUGE, "type": "RESULT", "bytes": HUGE,
         "body": [], "sent": 2.2, "rtt": 1e11, "inside": [1e11, 1e11, 1e11, 1e11]},
        {"t": 1e12, "event": "end", "status": "failed", "error": {"kind": "x", "step": HUGE}, "steps": HUGE},
    ]
