"""Worlds side by side: one exploration run as N child processes, each a shard.

`explore_in_jobs(config, jobs=N, runs=R)` starts N children (`python -m inferris_dist.chaos.jobs`),
each told the whole configuration (as JSON on its stdin: the workloads as documents, the seed,
the step deadline, everything `ChaosConfig` holds) and its shard K of N; each runs its schedules
in a session of its own (its own warm world and template) and writes its report as JSON on
stdout. The reports are merged (`merge_reports`) into the unsharded exploration's: schedule i is
the seed's i-th whatever N is, and so is its verdict.

Every child is started with the parent's death as its own (PR_SET_PDEATHSIG) and in the
parent's process group, so Ctrl-C reaches it; the parent waits for every child before it
returns or raises, and kills those that do not end. A child's output is read under a budget.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from inferris_dist.chaos.exploring import ChaosConfig, Report, explore, merge_reports
from inferris_dist.engine import EngineError, WorkloadError, load_workload

MAX_REPORT_BYTES = 64 << 20     # a child's report: far beyond any exploration's
MAX_ERROR_BYTES = 64 << 10      # what a child that failed said, kept
STOP_WAIT_S = 10.0              # a child that outlives its siblings' end by this much is killed


def job_document(config: ChaosConfig, runs: int | None, seconds: float | None, shard: tuple[int, int],
                 worker: str | None) -> dict:
    return {"workloads": [[name, w.to_dict()] for name, w in config.workloads], "seed": config.seed,
            "rungs": list(config.rungs), "policies": list(config.policies),
            "world_sizes": None if config.world_sizes is None else list(config.world_sizes),
            "kinds": config.kinds, "max_faults": config.max_faults, "step_timeout": config.step_timeout,
            "max_restarts": config.max_restarts, "random_workloads": config.random_workloads,
            "runs": runs, "seconds": seconds, "shard": list(shard), "worker": worker}


def config_of(doc: dict) -> ChaosConfig:
    return ChaosConfig([(name, load_workload(w)) for name, w in doc["workloads"]], doc["seed"],
                       tuple(doc["rungs"]), tuple(doc["policies"]),
                       None if doc["world_sizes"] is None else tuple(doc["world_sizes"]), doc["kinds"],
                       doc["max_faults"], doc["step_timeout"], doc["max_restarts"], doc["random_workloads"])


def explore_in_jobs(config: ChaosConfig, jobs: int, *, runs: int | None = None, seconds: float | None = None,
                    worker: str | None = None, on_report: Callable[[Report], None] | None = None) -> Report:
    """The exploration of `runs` schedules (or `seconds` of them) in `jobs` children at once, as
    one report (see above). `on_report` is told of each child's report as it comes."""
    children: list[tuple[subprocess.Popen, object, object]] = []
    parent, started = os.getpid(), time.monotonic()
    try:
        for k in range(jobs):
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            proc = subprocess.Popen([sys.executable, "-m", "inferris_dist.chaos.jobs"], stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, preexec_fn=lambda: _die_with(parent))
            children.append((proc, out, err))
            try:
                proc.stdin.write(json.dumps(job_document(config, runs, seconds, (k, jobs), worker)).encode())
                proc.stdin.close()
            except BrokenPipeError:          # it ended already: its exit status says why, below
                pass
        reports = []
        for k, (proc, out, err) in enumerate(children):
            proc.wait()
            if proc.returncode != 0:
                raise EngineError(f"chaos job {k + 1} of {jobs} failed ({_status(proc.returncode)}): "
                                  f"{_last_line(err)}", None)
            out.seek(0)
            text = out.read(MAX_REPORT_BYTES + 1)
            if len(text) > MAX_REPORT_BYTES:
                raise EngineError(f"chaos job {k + 1} of {jobs} wrote a report over "
                                  f"{MAX_REPORT_BYTES >> 20} MiB", None)
            report = Report.from_json(json.loads(text))
            reports.append(report)
            if on_report is not None:
                on_report(report)
    finally:
        _stop(children)
    merged = merge_reports(reports)
    merged.shards = []                   # every shard: the exploration itself, whatever the jobs
    merged.seconds = time.monotonic() - started
    return merged


def _die_with(parent: int) -> None:
    """In the child, before it runs: the kernel kills it when `parent` goes (and it goes now if
    that happened already). The rank's own rule, which chaos may not import (tests/test_layering.py)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _stop(children) -> None:
    """Every child ended: those still running (an interrupt, a sibling's failure) are asked with
    SIGINT, as Ctrl-C asks them, and killed after STOP_WAIT_S; then their files closed."""
    running = [p for p, _, _ in children if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in running:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for _, out, err in children:
        out.close()
        err.close()


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _last_line(err) -> str:
    err.seek(0, os.SEEK_END)
    size = err.tell()
    err.seek(max(0, size - MAX_ERROR_BYTES))
    lines = [x for x in err.read().decode(errors="replace").splitlines() if x.strip()]
    return lines[-1] if lines else "it said nothing"


def main() -> int:
    """A child: the job document on stdin, the shard's report as JSON on stdout."""
    from inferris_dist.chaos.harness import Session
    try:
        doc = json.loads(sys.stdin.buffer.read(MAX_REPORT_BYTES))
        config = config_of(doc)
        with Session(step_timeout=config.step_timeout, max_restarts=config.max_restarts,
                     worker=doc["worker"]) as session:
            report = explore(config, runs=doc["runs"], seconds=doc["seconds"], shard=tuple(doc["shard"]),
                             session=session)
    except KeyboardInterrupt:
        return 130
    except (WorkloadError, EngineError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write(f"{type(e).__name__}: {e}\n")
        return 1
    sys.stdout.write(json.dumps(report.to_json()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
