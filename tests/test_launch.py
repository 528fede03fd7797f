"""The engine with its ranks on real worker processes: `inferris_dist.launch` and `inferris-dist launch`.

Real processes and real sockets only, no mocks. Every wait is a loop on a
condition with a deadline; nothing sleeps to synchronise.

1. every golden workload gives exactly its golden trace at world sizes 1, 2, 4, 8
   (library), and `launch --json` is byte-identical to `run --json` (CLI);
2. `compare` says identical on seeded random workloads, and so does the library;
3. the demo launch prints its worker pids, and afterwards none of them exists;
4-6. SIGINT / SIGKILL / SIGTERM to a running launch leave no worker behind;
7. `--wire-log` records every message that crossed, PLAN bodies are the plans;
8. the shard audit catches a dropped write (`--fault 1:drop-write@2`);
9. a worker started by hand without the run secret says so in one line;
10. a long idle stretch costs a trace line per step, and no round trip.
"""
from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import inferris_dist
from inferris_dist.cli.workload_source import DEMO
from inferris_dist.engine import (
    Engine,
    EngineError,
    ExecutionPlan,
    LocalGroup,
    PlanItem,
    load_workload,
    run_workload,
)
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType, to_jsonable
from inferris_dist.testing import comparable

from tests.helpers.external import CLI, ENV, GOLDEN, REPO, cli, golden_lines
from tests.helpers.procs import all_gone

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]   # every test here, one bound


SPECS = sorted(p.name.removesuffix(".spec.json") for p in GOLDEN.glob("*.spec.json"))
# World sizes 2 and 8 run a fixed subset (runtime); 1 and 4 run every golden workload.
SUBSET = ["demo", "preemption", "cache_eviction", "speculative", "irreducible", "world_size_8",
          "recompute_window", "eos_immediate", "empty", "chunked_prefill", "prefix_reuse",
          "spec_budget_cut", "random_007", "random_042"]
# Every golden at world size 4; a subset at 1, 2 and 8 (world-size independence of the engine
# itself is a property test: here it is the processes that must not change anything).
GOLDEN_CASES = [(ws, name) for ws in (1, 2, 4, 8) for name in (SPECS if ws == 4 else SUBSET)]
CLI_CASES = [("demo", 4), ("preemption", 2), ("irreducible", 3), ("speculative", 8),
             ("cache_eviction", 1)]

MESSAGE_KEYS = {"t", "dir", "rank", "epoch", "step", "type", "bytes", "body"}
RESULT_KEYS = {"sent", "rtt", "inside"}   # a RESULT: when its plan went, the round trip, its own times
STEP_FIELDS = ["step", "admitted", "scheduled", "executed", "sampled", "finished", "preempted",
               "reused", "published", "evicted", "drafted", "accepted", "rolled_back"]


# -- helpers --------------------------------------------------------------------------

def spec_path(name: str) -> Path:
    return GOLDEN / f"{name}.spec.json"


def launched_lines(workload, world_size: int | None = None, **kw) -> tuple[list[dict], list[int]]:
    """The SPEC §4 lines of a run through the library `launch`, and the pids it started."""
    lines: list[dict] = []
    engine = None
    try:
        with inferris_dist.launch(workload, world_size=world_size, **kw) as engine:
            for trace in engine.run():
                lines.append(trace.to_json())
            lines.append({"summary": engine.summary()})
    except EngineError as e:
        assert engine is not None, f"launch failed before yielding an engine: {e.to_json()}"
        lines.append(e.to_json())
    return lines, list(engine.group.pids_started)


class LineReader:
    """Read a child's stdout line by line, every read bounded by a deadline (select)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def until(self, predicate, timeout: float) -> str:
        """Read until a line satisfies `predicate`; that line (fails at the deadline or EOF)."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for line in self.lines[checked:]:
                if predicate(line):
                    return line
            checked = len(self.lines)
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                pytest.fail(f"no such line within {timeout} s (eof={self.eof}); got {self.lines!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
            self.buf += chunk
            *complete, self.buf = self.buf.split(b"\n")
            self.lines += [c.decode() for c in complete]


def parse_pids(line: str) -> list[int]:
    m = re.search(r"\bpids((?:\s+\d+)+)", line)
    assert m, f"no pids on {line!r}"
    return [int(p) for p in m.group(1).split()]


def long_workload(tmp_path: Path, world_size: int = 3) -> Path:
    """Thousands of lockstep steps: runs for many seconds unless stopped."""
    data = {"engine": {"max_step_tokens": 64, "page_size": 16, "num_pages": 8192,
                       "world_size": world_size},
            "requests": [{"request_id": f"r{i}", "prompt_len": 8, "max_new_tokens": 20000}
                         for i in range(4)]}
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data))
    return path


def start_long_launch(tmp_path: Path) -> tuple[subprocess.Popen, LineReader, list[int]]:
    """A launch that is running steps: its workers are up and step 0 has been printed."""
    proc = subprocess.Popen(CLI + ["launch", "--spec", str(long_workload(tmp_path))],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=ENV)
    reader = LineReader(proc)
    try:
        pids = parse_pids(reader.until(lambda l: " pids " in l, 30))
        assert len(pids) == 3
        reader.until(lambda l: re.match(r"\s*0\s+admit", l) is not None, 30)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    assert proc.poll() is None, "the long workload finished already"
    return proc, reader, pids


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for the process to exit within the deadline; its status and stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail(f"the launch did not exit within {timeout} s")
    return proc.returncode, err.decode(errors="replace")


# -- 1. golden traces on real processes ---------------------------------------------------

def test_the_subset_exists():
    assert len(SPECS) >= 70
    assert set(SUBSET) <= set(SPECS)


@pytest.mark.parametrize("world_size,name", GOLDEN_CASES,
                         ids=[f"ws{ws}-{name}" for ws, name in GOLDEN_CASES])
def test_golden_through_library_launch(world_size, name):
    got, pids = launched_lines(spec_path(name), world_size=world_size)
    want = golden_lines(name)
    assert comparable(got) == comparable(want)
    if "error" not in want[-1]:
        assert got == want
    for line in got[:-1]:
        assert list(line) == STEP_FIELDS
    assert len(pids) == world_size
    assert all_gone(pids, 2.0) == [], "workers left running after launch's exit"


@pytest.mark.parametrize("name,world_size", CLI_CASES, ids=[f"{n}-ws{w}" for n, w in CLI_CASES])
def test_cli_launch_json_is_byte_identical_to_run(name, world_size):
    spec = spec_path(name)
    ran = cli("run", "--json", "--spec", spec)
    launched = cli("launch", "--json", "--spec", spec, "--world-size", world_size)
    assert "Traceback" not in launched.stderr
    assert launched.returncode == ran.returncode, launched.stderr
    assert launched.stdout == ran.stdout
    assert comparable([json.loads(l) for l in launched.stdout.splitlines()]) == comparable(golden_lines(name))


# -- 2. compare on random workloads -----------------------------------------------------

def random_workload(seed: int) -> dict:
    """A small seeded workload: shared prefixes, speculation, accept scripts, staggered arrivals."""
    rng = random.Random(seed)
    page_size = rng.choice([2, 4, 8])
    spec_len = rng.choice([0, 1, 2, 3, 4])
    prefixes = [[rng.randrange(1, 500) for _ in range(rng.randint(page_size, 3 * page_size))]
                for _ in range(3)]
    requests, longest = [], 1
    for i in range(rng.randint(3, 8)):
        req: dict = {"request_id": f"q{i}", "max_new_tokens": rng.randint(1, 12),
                     "arrival_step": rng.randint(0, 6)}
        if rng.random() < 0.7:
            req["tokens"] = rng.choice(prefixes) + [rng.randrange(1, 500)
                                                    for _ in range(rng.randint(0, 2 * page_size))]
            prompt = len(req["tokens"])
        else:
            prompt = req["prompt_len"] = rng.randint(1, 3 * page_size)
        if rng.random() < 0.6:
            req["accept_script"] = [rng.randint(0, spec_len + 1) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.2:
            req["eos_after"] = rng.randint(0, 5)
        longest = max(longest, prompt + req["max_new_tokens"] + spec_len)
        requests.append(req)
    fits = -(-longest // page_size) + 1
    # Tight pools (preemption, eviction) for some seeds, roomy ones for the others.
    num_pages = fits + rng.choice([0, 0, 1, 3, 10, 30])
    return {"engine": {"max_step_tokens": rng.randint(4, 24), "page_size": page_size,
                       "num_pages": num_pages, "spec_len": spec_len},
            "requests": requests}


RANDOM_SEEDS = [11, 23, 37, 41, 59, 73]


def test_random_workloads_exercise_the_engine():
    """The generator is worth its runtime: reuse, preemption, speculation, no failed run."""
    seen = set()
    for seed in RANDOM_SEEDS:
        lines = run_workload(load_workload(random_workload(seed)))
        assert "summary" in lines[-1], (seed, lines[-1])
        for line in lines[:-1]:
            seen.update(k for k in ("reused", "preempted", "evicted", "drafted", "admitted")
                        if line[k])
    assert {"reused", "preempted", "drafted"} <= seen, seen


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_compare_says_identical_on_random_workloads(tmp_path, seed, world_size):
    path = tmp_path / f"random_{seed}.json"
    path.write_text(json.dumps(random_workload(seed)))
    proc = cli("compare", "--spec", path, "--world-size", world_size)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout
    assert f"on {world_size} worker processes" in proc.stdout


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_library_launch_equals_run_workload_on_random_workloads(seed):
    workload = load_workload(random_workload(seed))
    want = run_workload(workload)
    for world_size in (2, 3):
        got, pids = launched_lines(workload, world_size=world_size)
        assert got == want, (seed, world_size)
        assert len(pids) == world_size


# -- 3. the demo ------------------------------------------------------------------------

def test_demo_launch_prints_its_pids_and_leaves_none_running():
    proc = cli("launch")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    pids = parse_pids(lines[1])
    assert len(pids) == DEMO["engine"]["world_size"] == 4
    assert len(set(pids)) == 4
    assert lines[-1] == "workers: 4 started, none left running"
    assert all_gone(pids, 2.0) == []


def test_demo_launch_json_is_the_golden_demo_trace():
    proc = cli("launch", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "demo.trace.jsonl").read_text()


# -- 4-6. signals --------------------------------------------------------------------------

def test_sigint_exits_130_and_stops_every_worker(tmp_path):
    proc, _, pids = start_long_launch(tmp_path)
    proc.send_signal(signal.SIGINT)
    status, err = finish(proc, 15)
    assert status == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    assert all_gone(pids, 2.0) == []


def test_ctrl_c_while_the_command_line_is_still_importing_itself_is_one_line_and_130():
    """The console script's first line takes Ctrl-C quietly: an interrupt while the command
    line is being imported (here: the moment its main module's import begins) is the same one
    line and status 130 as later, never Python's traceback."""
    script = ("import builtins, os, signal\n"
              "real = builtins.__import__\n"
              "def hook(name, *a, **k):\n"
              "    if name == 'inferris_dist.cli.main':\n"
              "        builtins.__import__ = real\n"
              "        os.kill(os.getpid(), signal.SIGINT)\n"
              "    return real(name, *a, **k)\n"
              "builtins.__import__ = hook\n"
              "import sys; sys.argv = ['inferris-dist', 'launch']\n"
              "from inferris_dist.cli.console import entry\n"
              "entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          env=ENV, cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr == "inferris-dist: interrupted\n"


def test_sigkill_to_the_scheduler_takes_its_workers_with_it(tmp_path):
    proc, _, pids = start_long_launch(tmp_path)
    proc.send_signal(signal.SIGKILL)
    status, _ = finish(proc, 15)
    assert status == -signal.SIGKILL
    # Reparented now; a zombie nobody reaps counts as gone.
    assert all_gone(pids, 2.0) == []


def test_sigterm_exits_143_and_stops_every_worker(tmp_path):
    proc, _, pids = start_long_launch(tmp_path)
    proc.send_signal(signal.SIGTERM)
    status, err = finish(proc, 15)
    assert status == 143, err
    assert "Traceback" not in err
    assert all_gone(pids, 2.0) == []


# -- 7. the wire log -------------------------------------------------------------------------

class RecordingGroup(LocalGroup):
    """The in-process executor, keeping every plan it was given."""

    def __init__(self, workload):
        super().__init__(workload)
        self.plans: list[ExecutionPlan] = []

    def execute(self, plan):
        self.plans.append(plan)
        return super().execute(plan)


def test_wire_log_records_every_message(tmp_path):
    log_path = tmp_path / "wire.jsonl"
    proc = cli("launch", "--json", "--wire-log", log_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "demo.trace.jsonl").read_text()
    world_size = DEMO["engine"]["world_size"]
    num_steps = len(proc.stdout.splitlines()) - 1

    entries = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert entries
    messages = [e for e in entries if "event" not in e]
    for m in messages:
        assert MESSAGE_KEYS <= set(m) <= MESSAGE_KEYS | RESULT_KEYS, m
        assert (set(m) > MESSAGE_KEYS) == (m["type"] == "RESULT"), m
        assert m["dir"] in ("in", "out")
        assert 0 <= m["rank"] < world_size
        assert m["epoch"] == 0
        assert isinstance(m["bytes"], int) and m["bytes"] >= 0
        assert isinstance(m["t"], (int, float))
    assert [m["t"] for m in messages] == sorted(m["t"] for m in messages)
    types = {m["type"] for m in messages}
    assert {"HELLO", "CONFIG", "READY", "PLAN", "RESULT", "AUDIT", "SHARD", "STOP"} <= types, types
    for kind, direction in [("HELLO", "in"), ("CONFIG", "out"), ("READY", "in"), ("PLAN", "out"),
                            ("RESULT", "in"), ("AUDIT", "out"), ("SHARD", "in"), ("STOP", "out")]:
        assert {m["dir"] for m in messages if m["type"] == kind} == {direction}, kind
    for kind in ("HELLO", "CONFIG", "READY", "AUDIT", "SHARD", "STOP"):
        assert sorted(m["rank"] for m in messages if m["type"] == kind) == list(range(world_size)), kind

    plans = [m for m in messages if m["type"] == "PLAN"]
    results = [m for m in messages if m["type"] == "RESULT"]
    assert len(plans) == num_steps * world_size
    assert len(results) == num_steps * world_size

    # The same workload in process: the plans the control plane made, one per step.
    recorder = RecordingGroup(load_workload(DEMO))
    for _ in Engine(load_workload(DEMO), recorder).run():
        pass
    assert len(recorder.plans) == num_steps
    for plan in recorder.plans:
        sent = [m for m in plans if m["step"] == plan.step]
        assert sorted(m["rank"] for m in sent) == list(range(world_size))
        for m in sent:
            assert m["body"] == to_jsonable(plan)
            assert m["bytes"] == len(wire.encode_body(MsgType.PLAN, plan))
            # and the body, rebuilt as a plan, is that plan
            items = tuple(PlanItem(**{**i, "placements": tuple(i["placements"])})
                          for i in m["body"]["items"])
            assert ExecutionPlan(m["body"]["step"], items) == plan


# -- 8. the shard audit ------------------------------------------------------------------------

def test_audit_catches_a_dropped_write_json():
    proc = cli("launch", "--fault", "1:drop-write@2", "--json")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["error"] == "ShardDivergence", last
    assert re.search(r"rank 1\b.*page \d+.*offset \d+", last["message"]), last


def test_audit_catches_a_dropped_write_human():
    proc = cli("launch", "--fault", "1:drop-write@2")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"ShardDivergence.*rank 1\b.*page \d+.*offset \d+", proc.stderr), proc.stderr
    assert proc.stdout.splitlines()[-1] == "workers: 4 started, none left running"


# -- 9. a worker without the secret ------------------------------------------------------------

def test_worker_without_secret_exits_with_one_clear_line():
    proc = subprocess.run([sys.executable, "-m", "inferris_dist.rank", "--rank", "0",
                           "--world-size", "1", "--connect", "tcp://127.0.0.1:1",
                           "--parent-pid", str(os.getpid())],
                          input="", capture_output=True, text=True, cwd=REPO, env=ENV, timeout=20)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "secret" in lines[0] and "rank 0" in lines[0]
    assert proc.stdout == ""


# -- 10. long idle stretches ----------------------------------------------------------------------

def test_a_hundred_thousand_idle_steps_take_seconds_and_send_no_plan(tmp_path):
    spec = tmp_path / "idle.json"
    spec.write_text(json.dumps({"engine": {}, "requests": [
        {"request_id": "a", "prompt_len": 3, "max_new_tokens": 2},
        {"request_id": "b", "prompt_len": 3, "max_new_tokens": 2, "arrival_step": 100_000}]}))
    log = tmp_path / "wire.jsonl"
    ran = cli("run", "--spec", spec, "--json", timeout=15)
    launched = cli("launch", "--spec", spec, "--json", "--wire-log", log, timeout=15)
    assert ran.returncode == launched.returncode == 0
    assert ran.stdout == launched.stdout
    lines = ran.stdout.splitlines()
    assert len(lines) == 100_003
    assert json.loads(lines[50_000]) == {"step": 50_000, "admitted": [], "scheduled": [], "executed": {},
                                         "sampled": {}, "finished": {}, "preempted": [], "reused": {},
                                         "published": {}, "evicted": [], "drafted": {}, "accepted": {},
                                         "rolled_back": {}}
    events = [json.loads(line) for line in log.read_text().splitlines()]
    plans = [e for e in events if e.get("type") == "PLAN"]
    assert len(plans) == 4                                # the 4 steps with work, to its 1 rank
    idle = [e for e in events if e.get("event") == "idle"]
    assert [(e["first"], e["last"]) for e in idle] == [(2, 99_999)]
    # people see one line for the whole stretch (a shorter one: the format, not the speed)
    spec.write_text(spec.read_text().replace("100000", "10000"))
    human = cli("run", "--spec", spec, timeout=50)
    assert "2-9999  idle, waiting for arrivals" in human.stdout
