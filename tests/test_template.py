"""The worker template (launcher/template.py): a process that imported the worker once and
forks ranks from itself. Forked workers are real processes like spawned ones: their exit is
seen through a pidfd and described (the template reaps them and reports the status), and
nothing outlives the scheduler: the template dies with it, its children with the template."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import inferris_dist
from inferris_dist.engine import load_workload, run_workload, trace_dicts
from inferris_dist.launcher import fork_workers, stop_workers

from tests.helpers.external import REPO, stand_in_template
from tests.helpers.procs import all_gone, gone

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]



def test_forked_children_are_watched_and_described(tmp_path):
    template = stand_in_template(tmp_path)
    try:
        workers = fork_workers(template, lambda r: [str(r)], b"s3cret", [0, 1, 2], tmp_path)
        assert len({w.pid for w in workers}) == 3 and all(w.pid != template.pid for w in workers)
        os.kill(workers[1].pid, signal.SIGKILL)
        assert workers[1].wait(5) and not workers[1].alive()
        assert workers[1].exit_description() == "killed by SIGKILL"
        assert workers[0].alive() and workers[2].alive()
        # each read its secret on stdin and wrote its stderr to its own log
        # (a condition with a deadline: they may not have written it yet)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                w.last_words() == f"rank {w.rank} has s3cret" for w in (workers[0], workers[2])):
            select.select([], [], [], 0.01)
        assert all(w.last_words() == f"rank {w.rank} has s3cret" for w in (workers[0], workers[2]))
        stop_workers(workers, grace=0.0, term_wait=2.0)
        assert workers[0].exit_description() == "killed by SIGTERM"
    finally:
        template.close()
    assert gone(template.proc.pid if template.proc else workers[0].pid)


def test_the_template_and_its_children_die_with_the_scheduler(tmp_path):
    """A scheduler killed with SIGKILL: the template goes (parent-death signal), and so do the
    workers it forked (theirs is the template)."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from inferris_dist.launcher import Template, fork_workers
        t = Template("inferris_dist.rank.cli", Path({str(tmp_path)!r}))
        t.start()
        # workers that wait for a scheduler that never answers (their parent is the template)
        ws = fork_workers(t, lambda r: ["--rank", str(r), "--world-size", "2", "--connect",
                                        "tcp://127.0.0.1:9", "--parent-pid", str(t.pid), "--death-signal"],
                          b"ab", [0, 1], Path({str(tmp_path)!r}))
        print(t.pid, *[w.pid for w in ws], flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and not any(gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait(10)
    assert not all_gone(pids, 5), "the template or a worker outlived the scheduler"


def test_a_launch_forks_its_ranks_and_restarts_from_the_template():
    workload = load_workload(REPO / "tests" / "data" / "golden" / "demo.spec.json")
    with inferris_dist.launch(workload, world_size=4, faults=["2:crash@3"],
                              on_rank_loss="restore") as engine:
        members = engine.group.members
        assert members.template is not None
        first = dict((r, w.pid) for r, w in members.workers.items())
        got = trace_dicts(engine)
        assert members.workers[2].pid != first[2]                  # restarted, by a fork
        assert type(members.workers[2]).__name__ == "ForkedProcess"
        pids = engine.group.pids_started
    assert got == run_workload(workload)
    assert not all_gone(pids, 5)


def test_an_exit_report_returns_as_soon_as_it_is_in(tmp_path):
    """The template's report of a child's exit is returned when it arrives, not after the
    whole wait (else every death is seen a second late): asked with a 600 s wait, it
    must come back within this test's own timeout."""
    template = stand_in_template(tmp_path)
    try:
        worker = fork_workers(template, lambda r: [str(r)], b"s3cret", [0], tmp_path)[0]
        os.kill(worker.pid, signal.SIGKILL)
        status = template.status_of(worker.pid, wait=600.0)
        assert status is not None and os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    finally:
        template.close()


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_a_stopped_template_is_given_up_on_within_the_deadline_and_the_run_recovers():
    """SIGSTOP the template, then a rank dies: its replacement's fork gets no answer; within the
    step deadline the template is given up on (said in the attempt's notes), the replacement is
    started afresh, the trace holds, and the stopped template is killed when the run ends."""
    import signal
    import time

    import inferris_dist
    from inferris_dist import testing

    from tests.helpers.external import GOLDEN
    from tests.helpers.procs import gone

    demo = GOLDEN / "demo.spec.json"
    lines = []
    with inferris_dist.launch(demo, world_size=2, faults=["1:crash@2"], on_rank_loss="restore",
                              step_timeout=1.0) as engine:
        template = engine.group.members.template.pid
        for trace in engine.run():
            lines.append(trace.to_json())
            if trace.step == 1:
                os.kill(template, signal.SIGSTOP)
                started = time.monotonic()
            if trace.step == 2:
                took = time.monotonic() - started
        lines.append({"summary": engine.summary()})
        notes = [n for a in engine.group.take_attempts() for n in a.notes]
        recoveries = engine.take_recoveries()
    assert lines == testing.reference(demo)
    assert [(r.step, r.rank) for r in recoveries] == [(2, 1)]
    assert any("did not answer within 1 s (stopped or stuck)" in n for n in notes), notes
    assert took < 15, took                      # the deadline, a fresh interpreter, not forever
    assert gone(template)


def test_closed_after_its_children_exited_the_template_goes_at_once_and_says_nothing(tmp_path):
    """Its children's exit notes may still be unread when the scheduler closes its end (the
    socket is then reset, not closed): the template takes that as the end, without a traceback
    in its log, and is gone as soon as it is told."""
    for _ in range(3):
        template = stand_in_template(tmp_path)
        workers = fork_workers(template, lambda r: [str(r)], b"s3cret", [0, 1, 2, 3], tmp_path)
        stop_workers(workers, grace=0.0, term_wait=2.0)
        pid = template.pid
        started = time.monotonic()
        template.close()
        took = time.monotonic() - started
        assert gone(pid)
        assert (tmp_path / "template.log").read_text() == ""
        assert took < 1.0, f"the template took {took:.2f} s to go"    # not its 2 s deadline


def test_a_template_begun_early_is_waited_for_at_its_first_fork():
    """`begin` starts the template without waiting (the command line starts it before it
    imports the scheduler); the first fork waits until it is up; a template of its own keeps
    its log in a run directory it removes when closed."""
    from inferris_dist.launcher import Template
    template = Template()
    template.begin()
    try:
        assert template.log_dir is not None and template.log_dir.is_dir()
        workload = load_workload({"engine": {"world_size": 2},
                                  "requests": [{"request_id": "a", "prompt_len": 5, "max_new_tokens": 3}]})
        with inferris_dist.launch(workload, template=template) as engine:
            lines = trace_dicts(engine)
        assert lines == run_workload(workload)
        assert template.alive()                          # shared: its starter's to close
    finally:
        log_dir = template.log_dir
        template.close()
    assert not log_dir.exists()
