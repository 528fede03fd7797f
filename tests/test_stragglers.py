"""Time at the boundary: slow ranks, the straggler named from arrivals, what the lockstep cost.

1. a 300-request workload with a per-token model cost, one rank made slow by a factor F from 1.5
   to 4 (5 seeded trials, a random rank and factor each): that rank is named the straggler, its
   score within 20% of F, and the group's wait for it is reported;
2. the time faults (`slow`, `jitter`) change no trace, at `full` and at `overlap`;
3. with no slow rank, none is named.
"""
from __future__ import annotations

import json
import random
import subprocess

import pytest

import inferris_dist
from inferris_dist.engine import Engine, load_workload, trace_dicts

from tests.helpers.external import CLI, ENV, GOLDEN, serving_spec

pytestmark = [pytest.mark.timeout(120)]
COST = "1ms+10us/tok"            # a decode step: 1 ms, a prefill chunk of a thousand tokens: 11 ms;
                                 # a slow rank then lags by far more than a busy machine's noise


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    return load_workload(serving_spec(tmp_path_factory.mktemp("serving") / "s300.json", 300, 4, seed=3))


def arrivals_of(workload, faults, **options):
    with inferris_dist.launch(workload, faults=faults, exec_cost=COST, **options) as engine:
        for _ in engine.run():
            pass
        return engine.group.recorder.arrivals


@pytest.mark.parametrize("trial", range(5))
def test_the_slow_rank_is_named_with_its_factor(serving, trial):
    rng = random.Random(f"straggler/{trial}")
    rank, factor = rng.randrange(4), round(rng.uniform(1.5, 4.0), 2)
    arrivals = arrivals_of(serving, [f"{rank}:slow@0+:{factor}"])
    named = arrivals.straggler()
    assert named is not None and named.rank == rank, arrivals.verdict()
    assert abs(named.score - factor) <= 0.2 * factor, (named, factor)
    assert arrivals.waited > 0 and f"straggler: rank {rank}," in arrivals.verdict()


def test_with_no_slow_rank_none_is_named():
    workload = load_workload(GOLDEN / "random_004.spec.json").with_config(world_size=3)
    arrivals = arrivals_of(workload, [])
    assert arrivals.straggler() is None and arrivals.verdict().startswith("straggler: none")


@pytest.mark.parametrize("rung", ["full", "overlap"])
def test_time_faults_change_no_trace(rung):
    spec = GOLDEN / "random_003.spec.json"
    want = [json.dumps(x) for x in trace_dicts(Engine(load_workload(spec), rung=rung))]
    faults = ["--fault", "1:slow@0+:3", "--fault", "all:jitter@0+:0.002", "--fault", "0:slow@2:4",
              "--fault", "2:jitter@5:0.01"]
    done = subprocess.run([*CLI, "launch", "--spec", str(spec), "--world-size", "3", "--rung", rung, "--json",
                           "--exec-cost", "0.2ms+5us/tok", *faults], capture_output=True, text=True, env=ENV,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == want


def test_a_hang_shows_the_wavefront_and_names_the_hung_rank_alone(tmp_path):
    log = tmp_path / "wire.jsonl"
    done = subprocess.run([*CLI, "launch", "--spec", str(GOLDEN / "random_004.spec.json"),
                           "--world-size", "4",
                           "--fault", "2:hang@3", "--step-timeout", "0.5", "--wire-log", str(log)],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 1
    assert "rank 2 gave no answer to step 3 within 0.5 s" in done.stderr
    front = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("rank ")]
    assert [line.split(":")[0] for line in front] == [f"rank {r}" for r in range(4)]
    assert [line.endswith("<- no answer") for line in front] == [False, False, True, False]
    assert "last FIRED 2:hang@3" in front[2] and "last result step 2 " in front[2]
    assert all("last plan step 3 (epoch 0)" in line for line in front)
    logged = [json.loads(x) for x in log.read_text().splitlines() if '"wavefront"' in x]
    assert len(logged) == 1 and [r["rank"] for r in logged[0]["ranks"] if r["silent"]] == [2]
