"""A pytest file to copy: kill a rank of the executor on real processes and assert that each
recovery policy keeps its promise. Nothing here but the installed package and pytest:

    pip install inferris-dist pytest
    pytest examples/test_my_executor.py

Change the workload, the faults and the world size to the executor you are working on; every
worker process is stopped before each run returns, whatever happened.
"""
import pytest

from inferris_dist import KINDS, RankLost, testing

WORKLOAD = {
    "engine": {"max_step_tokens": 12, "page_size": 4, "num_pages": 16, "spec_len": 2, "world_size": 4},
    "requests": [
        {"request_id": "chat", "tokens": [5, 5, 5, 5, 6, 6, 6, 6, 1, 2], "max_new_tokens": 5,
         "accept_script": [2, 1, 0]},
        {"request_id": "agent", "tokens": [5, 5, 5, 5, 6, 6, 6, 6, 3], "max_new_tokens": 4,
         "arrival_step": 1},
        {"request_id": "batch", "prompt_len": 14, "max_new_tokens": 3},
    ],
}
STEP_TIMEOUT = 2.0        # seconds a healthy rank may take to answer a step


@pytest.fixture(scope="module")
def reference():
    """What the engine does in one process: the promise every run on processes is held to."""
    return testing.reference(WORKLOAD)


@pytest.mark.parametrize("policy", ["restore", "recompute"])
@pytest.mark.parametrize("fault", ["1:crash@2", "3:crash-after-reply@1", "2:garble@3"])
def test_a_killed_or_garbled_rank_is_survived(reference, policy, fault):
    run = testing.run_on_processes(WORKLOAD, faults=[fault], policy=policy, step_timeout=STEP_TIMEOUT,
                                   check=testing.check_invariants)
    verdict = testing.assert_holds(reference, run)   # restore: the trace; recompute: the summary
    assert run.error is None and len(run.recoveries) == 1, run.recoveries
    assert verdict["compared"] == ("summaries" if policy == "recompute" else "traces")
    assert not run.unfired


def test_abort_names_the_rank_that_died(reference):
    run = testing.run_on_processes(WORKLOAD, faults=["2:crash@1"], policy="abort", step_timeout=STEP_TIMEOUT)
    assert isinstance(run.error, RankLost)
    assert (run.error.rank, run.error.step, run.error.reason) == (2, 1, "died")
    assert testing.comparable(run.lines[:-1]) == testing.comparable(reference[:1])   # step 0 stands


def test_a_fault_that_keeps_coming_back_ends_the_run():
    run = testing.run_on_processes(WORKLOAD, faults=["0:crash@1+"], policy="restore", max_restarts=2,
                                   step_timeout=STEP_TIMEOUT)
    assert isinstance(run.error, RankLost) and "gave up after 2 restarts" in run.error.message
    assert len(run.recoveries) == 2


def test_every_fault_kind_is_known():
    assert {"crash", "hang", "garble", "disagree", "crash-after-reply"} <= set(KINDS)
