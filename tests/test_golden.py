"""Every golden workload reproduces its trace: in process, and through the installed CLI."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferris_dist.engine import load_workload, run_workload

from tests.helpers.external import GOLDEN

pytestmark = pytest.mark.procs          # starts processes (pytest -m 'not procs' skips)

SPECS = sorted(p.name for p in GOLDEN.glob("*.spec.json"))
STEP_FIELDS = ["step", "admitted", "scheduled", "executed", "sampled", "finished", "preempted",
               "reused", "published", "evicted", "drafted", "accepted", "rolled_back"]
SUMMARY_FIELDS = ["request_id", "state", "generated", "computed", "finish_reason"]


def trace_path(spec_name):
    return GOLDEN / spec_name.replace(".spec.json", ".trace.jsonl")


def read_trace(spec_name):
    return [json.loads(line) for line in trace_path(spec_name).read_text().splitlines() if line.strip()]


def assert_same(got, want):
    """Step lines and the summary exactly; an error line by `error` and `step` only."""
    assert len(got) == len(want), (len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        if "error" in w:
            assert i == len(want) - 1
            assert set(g) >= {"error", "message", "step"}, g
            assert (g["error"], g["step"]) == (w["error"], w["step"])
            assert isinstance(g["message"], str) and g["message"]
        elif "summary" in w:
            assert i == len(want) - 1
            assert g == w
            assert all(list(r) == SUMMARY_FIELDS for r in g["summary"])
        else:
            assert g == w, f"step {w['step']}"
            assert list(g) == STEP_FIELDS


def test_the_golden_set_is_there():
    assert len(SPECS) >= 20
    for name in SPECS:
        assert trace_path(name).is_file(), name


@pytest.mark.parametrize("name", SPECS)
def test_golden_in_process(name):
    got = run_workload(load_workload(GOLDEN / name))
    assert_same(got, read_trace(name))


def cli_command():
    script = Path(sys.executable).parent / "inferris-dist"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "inferris_dist.cli"]


CLI_SPECS = ["demo.spec.json", "empty.spec.json", "irreducible.spec.json", "preemption.spec.json",
             "cache_eviction.spec.json", "speculative.spec.json", "world_size_8.spec.json",
             "recompute_window.spec.json"]


@pytest.mark.parametrize("name", CLI_SPECS)
def test_golden_through_the_cli(name):
    proc = subprocess.run(cli_command() + ["run", "--json", "--spec", str(GOLDEN / name)],
                          capture_output=True, text=True, timeout=30)
    want = read_trace(name)
    failed = "error" in want[-1]
    assert proc.returncode == (1 if failed else 0), proc.stderr
    assert "Traceback" not in proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert_same(got, want)
    if not failed:
        # Byte for byte: the golden files are the CLI's own lines.
        assert proc.stdout == trace_path(name).read_text()


def test_cli_module_entry_point_agrees():
    name = "chunked_prefill.spec.json"
    proc = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "run", "--json", "--spec",
                           str(GOLDEN / name)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == trace_path(name).read_text()
