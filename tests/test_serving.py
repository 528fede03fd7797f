"""The serving-shaped benchmark workload gives the naive SPEC implementation's trace."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from serving import serving_workload  # noqa: E402

from inferris_dist.engine import run_workload  # noqa: E402

from tests.helpers.naive_reference import naive_run  # noqa: E402

pytestmark = pytest.mark.timeout(120)   # every test here, one bound


def test_serving_workload_matches_the_naive_engine():
    workload = serving_workload(150, seed=11)
    lines = run_workload(workload)
    assert lines == naive_run(workload)
    steps = [line for line in lines if "step" in line]
    # it is serving-shaped: prefixes reused, pages evicted, drafts rolled back, EOS
    assert any(s["reused"] for s in steps) and any(s["evicted"] for s in steps)
    assert any(sum(s["rolled_back"].values()) for s in steps)
    assert any("EOS" in s["finished"].values() for s in steps)
