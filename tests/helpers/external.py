"""Helpers for runs whose ranks the scheduler did not start: a `launch --listen`
scheduler as a child process, and `inferris-dist worker`s started beside it
(on this host, in a network namespace, or by a cluster launcher).

Every wait is on a condition with a deadline: lines are read with select.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest

from tests.helpers.procs import all_gone

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden"      # the SPEC's golden workloads and traces
SCRIPT = Path(sys.executable).with_name("inferris-dist")
CLI = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "inferris_dist.cli"]
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "PYTHONUNBUFFERED": "1"}
# a launcher's variables in our own environment must not place the workers we start
for _var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "JOB_COMPLETION_INDEX",
             "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(_var, None)
LISTENING = re.compile(r"listening at (tcp://\S+) ")
LADDER = GOLDEN / "ladder"                           # the goldens at each rung of the ladder
EXAMPLES = REPO / "examples"


def golden_workload(name: str):
    """A golden workload (`demo`, `preemption`, ...), loaded."""
    from inferris_dist.engine import load_workload
    return load_workload(GOLDEN / f"{name}.spec.json")


def golden_lines(name: str, rung: str = "full") -> list[dict]:
    """A golden trace, one dict per line (at `rung` of the ladder)."""
    path = GOLDEN / f"{name}.trace.jsonl" if rung == "full" else LADDER / f"{name}.{rung}.trace.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def serving_spec(path: Path, requests: int, world_size: int = 1, seed: int = 7) -> Path:
    """The serving-shaped workload of examples/serving.py (`--write`: the example run as a
    program, as a user runs it), written to `path`."""
    done = subprocess.run([sys.executable, str(EXAMPLES / "serving.py"), "--write", str(path),
                           "--requests", str(requests), "--world-size", str(world_size), "--seed", str(seed)],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    return path




class Lines:
    """A child's output stream, read line by line, each read bounded by a deadline."""

    def __init__(self, stream):
        self.fd = stream.fileno()
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def pump(self, timeout: float) -> None:
        if self.eof:
            return
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
                if self.buf:
                    self.lines.append(self.buf.decode(errors="replace"))
                    self.buf = b""
            self.buf += chunk
            *complete, self.buf = self.buf.split(b"\n")
            self.lines += [c.decode(errors="replace") for c in complete]

    def until(self, pattern: str, timeout: float, start: int = 0) -> str:
        """The first line from index `start` on that matches `pattern` (fails at the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines[start:]:
                if re.search(pattern, line):
                    return line
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                pytest.fail(f"no line matching {pattern!r} within {timeout} s "
                            f"(eof={self.eof}); got {self.lines[-30:]!r}")
            self.pump(left)

    def rest(self, timeout: float) -> list[str]:
        """Everything until EOF (bounded)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        return self.lines


class Scheduler:
    """`inferris-dist launch --listen ...` as a child; `prefix` runs it elsewhere (ip netns exec)."""

    def __init__(self, args: Sequence[str], prefix: Sequence[str] = (), cwd: Path | None = None,
                 preexec_fn=None):
        self.proc = subprocess.Popen([*prefix, *CLI, "launch", *map(str, args)], env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, cwd=cwd, preexec_fn=preexec_fn)
        self.out = Lines(self.proc.stdout)
        self.err = Lines(self.proc.stderr)
        self.address = ""

    def listening(self, timeout: float = 20) -> str:
        line = self.err.until(r"listening at ", timeout)
        self.address = LISTENING.search(line).group(1)
        return self.address

    def finish(self, timeout: float = 60) -> tuple[int, list[str], list[str]]:
        """Wait for the exit; (status, stdout lines, stderr lines)."""
        deadline = time.monotonic() + timeout
        while (not self.out.eof or not self.err.eof) and time.monotonic() < deadline:
            ready, _, _ = select.select([s.fd for s in (self.out, self.err) if not s.eof], [], [],
                                       max(0.0, deadline - time.monotonic()))
            for s in (self.out, self.err):
                if s.fd in ready:
                    s.pump(0)
        try:
            status = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the scheduler did not finish within {timeout} s; "
                        f"stdout {self.out.lines[-20:]!r}, stderr {self.err.lines[-20:]!r}")
        return status, self.out.lines, self.err.lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def local_launch(args, **kw) -> tuple[subprocess.Popen, str]:
    """`inferris-dist launch ARGS` (spawning its workers, human output) as a child, once its
    workers are up; (process, its socket address). The process's `pids` attribute: its workers'
    pids; `lines`: its stdout, read so far."""
    proc = subprocess.Popen([*CLI, "launch", *map(str, args)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, **kw)
    out = Lines(proc.stdout)
    line = out.until(r"rank workers up in", 30)
    proc.lines = out
    proc.pids = [int(p) for p in line.split(", pids ")[1].split()]
    return proc, re.search(r" at (\S+), pids", line).group(1)


def cli(*args, timeout: float = 60, stdin: str | None = None, cmd: list[str] | None = None,
        **kw) -> subprocess.CompletedProcess:
    """`inferris-dist ARGS...` to its end, from the repository's root: output as text."""
    return subprocess.run([*(cmd or CLI), *map(str, args)], input=stdin, capture_output=True, text=True,
                          cwd=REPO, env=ENV, timeout=timeout,
                          **({"stdin": subprocess.DEVNULL} if stdin is None and "stdin" not in kw else {}),
                          **kw)


def worker_argv(address: str, keys: str | Path | None, rank: int | None = None,
                world_size: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    argv = [*CLI, "worker", "--connect", address]
    if keys is not None:
        argv += ["--keys", str(keys)]
    if rank is not None:
        argv += ["--rank", str(rank)]
    if world_size is not None:
        argv += ["--world-size", str(world_size)]
    return argv + list(extra)


def start_worker(address: str, keys, rank=None, world_size=None, env: dict | None = None,
                 prefix: Sequence[str] = (), extra: Sequence[str] = ()) -> subprocess.Popen:
    return subprocess.Popen([*prefix, *worker_argv(address, keys, rank, world_size, extra)],
                            env={**ENV, **(env or {})}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_all(procs: Sequence[subprocess.Popen], timeout: float = 10) -> None:
    """Kill whatever still runs (a test's cleanup: never leave a process behind)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    left = all_gone([p.pid for p in procs], timeout)
    for p in procs:
        try:
            p.wait(1)
        except subprocess.TimeoutExpired:
            pass
    assert not left, f"still running: {left}"


def exit_line(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for a worker to exit; (status, its last stderr line)."""
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {proc.pid} still runs after {timeout} s")
    lines = proc.stderr.read().decode(errors="replace").strip().splitlines()
    return status, lines[-1] if lines else ""


def long_spec(tmp_path: Path, new_tokens: int = 400, num_requests: int = 4,
              max_step_tokens: int = 4) -> Path:
    """A workload of about `new_tokens` steps: time to act in the middle of a run."""
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps({"engine": {"max_step_tokens": max_step_tokens, "page_size": 4,
                                           "num_pages": 64},
                                "requests": [{"request_id": f"q{i}", "tokens": [1, 2, 3, i],
                                              "max_new_tokens": new_tokens}
                                             for i in range(num_requests)]}))
    return spec


def keys_for(tmp_path: Path, world_size: int = 4) -> Path:
    """A fresh CURVE key directory for a test."""
    from inferris_dist.protocol.keys import write_keys
    d = tmp_path / "keys"
    write_keys(d, world_size)
    return d


def run_json(spec: str | Path, *args) -> list[str]:
    """`inferris-dist run --json` of a workload: the reference trace."""
    done = subprocess.run([*CLI, "run", "--json", "--spec", str(spec), *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def stand_in_template(tmp_path: Path):
    """A worker template whose children are tests/helpers/template_child.py (a stand-in worker
    that says it has its secret, then waits to be killed), started. The template imports it as
    `tests.helpers.template_child`: the repository's root is on its PYTHONPATH."""
    from inferris_dist.launcher import Template
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{env_path}" if env_path else str(REPO)
    try:
        template = Template("tests.helpers.template_child", tmp_path)
        template.start()
    finally:
        os.environ["PYTHONPATH"] = env_path
    return template
