"""The mechanism ladder (SPEC §6): every rung's golden trace through the library, the CLI
and (a subset) real processes; the same outcome in process and on processes for random
workloads at every rung; the `ladder` table against the goldens; NeverFits said clearly."""
from __future__ import annotations

import io
import json
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferris_dist
from inferris_dist.cli import main as cli
from inferris_dist.cli.cmd_ladder import climb
from inferris_dist.engine import Engine, load_workload, trace_dicts
from inferris_dist.engine.rungs import NAMES, RUNGS
from inferris_dist.testing import comparable

from tests.helpers.external import CLI, ENV, GOLDEN, golden_lines

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

LADDER = GOLDEN / "ladder"
LADDER_CASES = sorted(tuple(p.name[:-len(".trace.jsonl")].rsplit(".", 1))
                      for p in LADDER.glob("*.trace.jsonl"))
# the rung "full" is the whole engine: its traces are the main goldens
CASES = sorted(LADDER_CASES + [(c, "full") for c in {c for c, _ in LADDER_CASES}])


def spec(case: str) -> Path:
    return GOLDEN / f"{case}.spec.json"


def test_every_rung_has_its_goldens():
    assert len(LADDER_CASES) == 250     # 25 workloads at 00..08c (the original's) and at overlap (ours)
    assert {r for _, r in CASES} == set(NAMES)


@pytest.mark.parametrize("case,rung", CASES, ids=[f"{c}.{r}" for c, r in CASES])
def test_ladder_golden_through_the_library(case, rung):
    got = trace_dicts(Engine(load_workload(spec(case)), rung=rung))
    assert comparable(got) == comparable(golden_lines(case, rung))


@pytest.mark.parametrize("case,rung", CASES, ids=[f"{c}.{r}" for c, r in CASES])
def test_ladder_golden_through_the_cli(case, rung):
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli.main(["run", "--rung", rung, "--json", "--spec", str(spec(case))])
    want = golden_lines(case, rung)
    assert status == (1 if "error" in want[-1] else 0)
    assert comparable([json.loads(line) for line in out.getvalue().splitlines()]) == comparable(want)


LAUNCH_CASES = [(c, r) for c, r in CASES
                if c in ("demo", "preemption", "cache_eviction", "chunked_prefill", "irreducible",
                         "random_003")]


@pytest.mark.parametrize("case,rung", LAUNCH_CASES, ids=[f"{c}.{r}" for c, r in LAUNCH_CASES])
def test_ladder_golden_on_processes(case, rung):
    """Every rung still crosses the executor boundary: the plan carries what the rung decided."""
    workload = load_workload(spec(case))
    try:
        with inferris_dist.launch(workload, rung=rung, step_timeout=30) as engine:
            got = trace_dicts(engine)
    except Exception as e:          # the workers did not start: a failure of this test
        pytest.fail(f"launch failed: {e}")
    assert comparable(got) == comparable(golden_lines(case, rung))


def test_launch_cli_at_a_rung_is_run_at_that_rung():
    for rung in ("02", "05", "08a"):
        args = ["--rung", rung, "--json", "--spec", str(spec("chunked_prefill"))]
        ran = subprocess.run([*CLI, "run", *args], env=ENV, capture_output=True, text=True, timeout=60)
        launched = subprocess.run([*CLI, "launch", *args], env=ENV, capture_output=True, text=True,
                                  timeout=60)
        assert ran.stdout == launched.stdout and ran.returncode == launched.returncode, rung


# -- in process and on processes: the same outcome at every rung, for any workload -----------------

@st.composite
def workloads(draw):
    n = draw(st.integers(1, 4))
    requests = [{"request_id": f"q{i}", "prompt_len": draw(st.integers(1, 14)),
                 "max_new_tokens": draw(st.integers(1, 5)), "arrival_step": draw(st.integers(0, 3))}
                for i in range(n)]
    return {"engine": {"max_step_tokens": draw(st.integers(2, 12)), "page_size": draw(st.integers(1, 4)),
                       "num_pages": draw(st.integers(2, 12)), "spec_len": draw(st.integers(0, 3)),
                       "world_size": 2}, "requests": requests}


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(NAMES))
def test_every_rung_ends_alike_in_process_and_on_processes(raw, rung):
    workload = load_workload(raw)
    local = trace_dicts(Engine(workload, rung=rung))
    with inferris_dist.launch(workload, rung=rung, step_timeout=30) as engine:
        remote = trace_dicts(engine)
    assert comparable(remote) == comparable(local)


# -- the ladder table ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted({c for c, _ in CASES}))
def test_ladder_rows_are_the_goldens_summed(case):
    rows = {r["rung"]: r for r in climb(load_workload(spec(case)))}
    assert list(rows) == list(NAMES)
    for rung in NAMES:
        lines = golden_lines(case, rung)
        steps = [x for x in lines if "step" in x and "error" not in x]
        row = rows[rung]
        assert row["steps"] == len(steps)
        assert row["computed"] == sum(sum(x["executed"].values()) for x in steps)
        assert row["reused"] == sum(sum(x.get("reused", {}).values()) for x in steps)
        assert row["preempted"] == sum(len(x.get("preempted", [])) for x in steps)
        assert row["accepted"] == sum(sum(x.get("accepted", {}).values()) for x in steps)
        assert row["finished"] == sum(len(x["finished"]) for x in steps)
        if "error" in lines[-1]:
            assert row["error"]["error"] == lines[-1]["error"] and row["error"]["step"] == lines[-1]["step"]
        else:
            assert row["error"] is None


def test_ladder_command_default_shows_every_mechanism_changing_the_outcome():
    done = subprocess.run([*CLI, "ladder"], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ladder demo: 5 requests")
    body = {line.split()[0]: line for line in lines[2:]}
    assert list(body) == list(NAMES)
    assert "NeverFits at step" in body["02"] and "doc" in body["02"]     # the budget starves it
    assert "OutOfPages" in body["04"] and "OutOfPages" not in body["05"]   # preemption rescues
    assert "OutOfPages" in body["08b"] and "OutOfPages" not in body["08c"]  # eviction rescues
    rows = [json.loads(x) for x in subprocess.run([*CLI, "ladder", "--json"], env=ENV, capture_output=True,
                                                   text=True, timeout=60).stdout.splitlines()]
    by = {r["rung"]: r for r in rows}
    assert by["08c"]["reused"] > 0 and by["full"]["steps"] < by["08c"]["steps"]   # reuse; speculation
    drafting = ("full", "overlap")
    assert by["full"]["drafted"] > 0 and all(by[r]["drafted"] == 0 for r in NAMES if r not in drafting)
    # overlap: the same requests finish, at a different pace (planned ahead of their results:
    # a request taken as finished waits a step, a step ahead defers what it cannot place)
    assert by["overlap"]["finished"] == by["full"]["finished"]
    assert by["overlap"]["steps"] != by["full"]["steps"]
    assert all(by[r]["discarded"] == 0 for r in NAMES if r != "overlap")


def test_never_fits_ends_with_a_clear_diagnosis():
    done = subprocess.run([*CLI, "run", "--rung", "02", "--spec", str(spec("chunked_prefill"))],
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "error: NeverFits at step" in done.stderr and "never fits the budget" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_rung_is_bad_input():
    done = subprocess.run([*CLI, "run", "--rung", "07"], env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--rung" in done.stderr and done.stderr.count("\n") == 1


def test_a_rung_is_a_set_of_mechanisms_chosen_once():
    """Each rung adds to the one before it (budget, pages, reliefs, cache, speculation grow
    monotonically), and the trace fields only grow."""
    order = {"none": 0, "whole": 1, "chunked": 2}
    rungs = list(RUNGS.values())
    for a, b in zip(rungs, rungs[1:]):
        assert order[a.budget] <= order[b.budget]
        assert a.paged <= b.paged and a.publish <= b.publish and a.reuse <= b.reuse
        assert a.speculation <= b.speculation
        assert set(a.fields) <= set(b.fields)
