"""The serving-shaped benchmark workload (examples/serving.py) gives the naive SPEC
implementation's trace."""
import json

import pytest

from inferris_dist.engine import run_workload

from tests.helpers.external import serving_spec
from tests.helpers.naive_reference import naive_run

pytestmark = pytest.mark.timeout(120)   # every test here, one bound


def test_serving_workload_matches_the_naive_engine(tmp_path):
    workload = json.loads(serving_spec(tmp_path / "serving150.json", 150, seed=11).read_text())
    lines = run_workload(workload)
    assert lines == naive_run(workload)
    steps = [line for line in lines if "step" in line]
    # it is serving-shaped: prefixes reused, pages evicted, drafts rolled back, EOS
    assert any(s["reused"] for s in steps) and any(s["evicted"] for s in steps)
    assert any(sum(s["rolled_back"].values()) for s in steps)
    assert any("EOS" in s["finished"].values() for s in steps)
