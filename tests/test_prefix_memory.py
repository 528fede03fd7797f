"""The prefix cache's memory grows linearly with the prompt, not with its square.

A radix node that carried its whole path from the root (a tuple of per-parent
insertion numbers) would make one prompt of L blocks cost O(L^2): at page_size 1
a 32k-token prompt would take 4.2 GB and 64k would run out of memory, all inside
the documented limits. These runs are real `inferris-dist run` processes; each is
held to an address-space limit (so a regression fails fast instead of eating
the machine) and its own peak resident set, read by wait4, must stay small.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.external import REPO

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

MB = 1024 * 1024
ADDRESS_SPACE = 1024 * MB        # the child's hard cap: a quadratic cache dies here with MemoryError
PEAK_RSS = 400 * MB              # what a 32k-token prompt at page_size 1 may cost the whole command


def run_capped(tmp_path: Path, workload: dict) -> tuple[int, list[dict], int, str]:
    """`inferris-dist run --json` on `workload` under the address-space cap.

    Returns (exit status, the JSON lines if it succeeded, the child's own peak RSS in bytes, stderr).
    """
    spec = tmp_path / "big.spec.json"
    spec.write_text(json.dumps(workload))

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        command = [sys.executable, "-m", "inferris_dist.cli", "run", "--json", "--spec", str(spec)]
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, preexec_fn=cap)
    try:
        # wait4 reports this child's own rusage (RUSAGE_CHILDREN would be the maximum over
        # every child this test process ever waited for).
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [json.loads(line) for line in out_path.read_text().splitlines()] if proc.returncode == 0 else []
    return proc.returncode, lines, usage.ru_maxrss * 1024, err_path.read_text()


def one_prompt(prompt_len: int, num_pages: int) -> dict:
    return {"engine": {"max_step_tokens": 4096, "page_size": 1, "num_pages": num_pages},
            "requests": [{"request_id": "a", "prompt_len": prompt_len, "max_new_tokens": 1}]}


def test_a_32k_token_prompt_at_page_size_1_stays_small(tmp_path):
    status, lines, peak, err = run_capped(tmp_path, one_prompt(32768, 40000))
    assert status == 0, err[-2000:]
    assert lines[-1]["summary"][0]["state"] == "FINISHED"
    assert sum(line.get("published", {}).get("a", 0) for line in lines) == 32768
    assert peak < PEAK_RSS, f"peak RSS {peak / MB:.0f} MB"


def test_evicting_a_32k_block_chain_stays_small(tmp_path):
    # `b` shares nothing with `a`, and the pool holds only one of them: admitting `b` evicts
    # nearly all of `a`'s cached chain (the shortfall), leaf by leaf from its deep end.
    workload = {"engine": {"max_step_tokens": 4096, "page_size": 1, "num_pages": 33000},
                "requests": [{"request_id": "a", "prompt_len": 32768, "max_new_tokens": 1},
                             {"request_id": "b", "prompt_len": 32768, "max_new_tokens": 1,
                              "arrival_step": 9}]}
    status, lines, peak, err = run_capped(tmp_path, workload)
    assert status == 0, err[-2000:]
    assert [r["state"] for r in lines[-1]["summary"]] == ["FINISHED", "FINISHED"]
    evicted = [page for line in lines for page in line.get("evicted", [])]
    assert len(evicted) > 32000
    assert peak < PEAK_RSS, f"peak RSS {peak / MB:.0f} MB"
