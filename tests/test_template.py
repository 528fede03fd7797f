"""The worker template (launcher/template.py): a process that imported the worker once and
forks ranks from itself. Forked workers are real processes like spawned ones: their exit is
seen through a pidfd and described (the template reaps them and reports the status), and
nothing outlives the scheduler: the template dies with it, its children with the template."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
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


# -- a template the command line forks itself into, and workers asked for ahead ------------------

FORKED = textwrap.dedent('''
    import json, os, sys, time
    from inferris_dist.launcher.rundir import make_run_dir, remove_run_dir
    from inferris_dist.launcher.template import fork_template
    run_dir = make_run_dir()                              # as the command line makes it: locked
    pid, sock = fork_template("tests.helpers.template_child", str(run_dir / "template.log"))
    from inferris_dist.launcher.process import Template, fork_workers, stop_workers
    template = Template.of_fork(pid, sock, run_dir, module="tests.helpers.template_child")
    ahead = [(r, [str(r)], run_dir / f"ahead{r}.log") for r in range(3)]
    if "twice" in sys.argv[2:]:                           # asked for ahead, then for others
        template.fork_ahead([(r, ["old"], run_dir / f"old{r}.log") for r in range(3)], b"s3cret")
    template.fork_ahead(ahead, b"s3cret")
    template.wait_up()
    fds = sorted(os.listdir(f"/proc/{pid}/fd"))
    targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
    asked = json.loads(sys.argv[1])                       # rank -> argv the run asks for
    if "kill one" in sys.argv[2:]:                        # one forked ahead is gone meanwhile
        deadline = time.monotonic() + 10
        while len(children := open(f"/proc/{pid}/task/{pid}/children").read().split()) < 3:
            assert time.monotonic() < deadline, "the workers forked ahead did not come"
            time.sleep(0.01)
        os.kill(int(children[1]), 9)
        while str(children[1]) in open(f"/proc/{pid}/task/{pid}/children").read().split():
            assert time.monotonic() < deadline, "the template did not reap its child"
            time.sleep(0.01)
    workers = fork_workers(template, lambda r: asked[str(r)], b"s3cret", [int(r) for r in asked], run_dir)
    pids = {w.rank: w.pid for w in workers}
    logs = {w.rank: w.log_path.name for w in workers}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(w.last_words() for w in workers):
        time.sleep(0.01)
    words = {w.rank: w.last_words() for w in workers}
    deadline = time.monotonic() + 5          # a spare killed is gone once the template reaps it
    while True:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        if len(children) <= len(workers) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    stop_workers(workers, grace=0.0, term_wait=2.0)
    template.close()
    remove_run_dir(run_dir)
    print(json.dumps({"template": pid, "pids": pids, "logs": logs, "words": words,
                      "children": [int(c) for c in children], "targets": targets,
                      "run_dir": str(run_dir)}))
''')


def forked_template_run(asked: dict[int, list[str]], *more: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", FORKED, json.dumps(asked), *more], capture_output=True,
                          text=True, timeout=40, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_workers_asked_for_ahead_are_the_ones_a_fork_of_the_same_gets():
    """The command line forks itself into the template and asks for the run's workers before
    it knows it runs: the group's first start, asking for the same ranks and arguments, gets
    those very processes (their logs made ahead), each with its secret; nothing is left."""
    got = forked_template_run({0: ["0"], 1: ["1"], 2: ["2"]})
    assert sorted(got["logs"].values()) == ["ahead0.log", "ahead1.log", "ahead2.log"]
    assert sorted(got["children"]) == sorted(got["pids"].values())     # three forks, no more
    assert all(got["words"][r] == f"rank {r} has s3cret" for r in ("0", "1", "2"))
    assert all_gone([got["template"], *got["pids"].values()], 5) == []
    assert not os.path.exists(got["run_dir"])


def test_workers_asked_for_ahead_and_not_wanted_are_killed():
    """A start that asks for other arguments (or fewer ranks) gets fresh workers; those forked
    ahead for nothing are killed at once, not left to connect."""
    got = forked_template_run({0: ["0"], 1: ["other"]})
    assert got["logs"]["0"] == "ahead0.log" and got["logs"]["1"] != "ahead1.log"
    assert got["words"]["1"] == "rank other has s3cret"
    assert len(got["children"]) == 2, "the spare workers outlived the start that did not want them"
    assert all_gone([got["template"], *got["pids"].values()], 5) == []


def test_a_worker_forked_ahead_that_is_gone_by_the_start_is_forked_afresh():
    """A worker forked ahead gives up on a scheduler that takes too long to bind (or dies
    meanwhile): the start does not take it, but forks its rank afresh; the others it takes."""
    got = forked_template_run({0: ["0"], 1: ["1"], 2: ["2"]}, "kill one")
    fresh = [r for r, log in got["logs"].items() if not log.startswith("ahead")]
    assert len(fresh) == 1, got["logs"]
    assert all(got["words"][r] == f"rank {r} has s3cret" for r in ("0", "1", "2")), got["words"]
    assert sorted(got["children"]) == sorted(got["pids"].values())
    assert all_gone([got["template"], *got["pids"].values()], 5) == []


def test_workers_asked_for_ahead_again_replace_those_asked_for_before():
    """A second ask ahead (chaos-like: the next run's, the last one's never claimed) kills what
    the first asked for; the start takes the second's."""
    got = forked_template_run({0: ["0"], 1: ["1"], 2: ["2"]}, "twice")
    assert sorted(got["logs"].values()) == ["ahead0.log", "ahead1.log", "ahead2.log"], got["logs"]
    assert sorted(got["children"]) == sorted(got["pids"].values()), "the first asks' workers live on"
    assert all_gone([got["template"], *got["pids"].values()], 5) == []


def test_a_forked_template_keeps_nothing_of_the_command_line_but_its_socket():
    """Forked, it would inherit every descriptor of the command line: the run directory's lock
    above all, which would keep a killed run's directory from being swept. It keeps its
    standard streams (the log for stderr) and its end of the socketpair; the rest is its own
    (the pipe of its signal wake-up, a pidfd on the scheduler)."""
    got = forked_template_run({0: ["0"]})
    targets = got["targets"]
    assert not any(t.endswith("/lock") for t in targets), targets
    assert targets[2].endswith("template.log")
    assert sum(t.startswith("socket:") for t in targets) == 1, targets
    assert all(t.startswith(("socket:", "pipe:", "anon_inode:", "/dev/null")) or t.endswith("template.log")
               for t in targets), targets


EARLY = textwrap.dedent('''
    import json, sys, time
    import inferris_dist
    from inferris_dist.launcher.early import WorkerTemplate
    from inferris_dist.protocol.limits import usable_cores
    from inferris_dist.engine import load_workload, run_workload, trace_dicts
    early = WorkerTemplate.begin(usable_cores())       # as `inferris-dist launch` does as it starts
    asked = early.max_ahead + 1 if sys.argv[1] == "beyond" else int(sys.argv[1])
    early.fork_ahead(asked)                              # as the command line does, once it has
    logs_ahead = sorted(p.name for p in early.run_dir.glob("rank*.log"))   # read the workload
    workload = load_workload({"engine": {"world_size": 2},
                              "requests": [{"request_id": "a", "prompt_len": 5, "max_new_tokens": 3}]})
    try:
        with inferris_dist.launch(workload, **early.options(10.0)) as engine:
            same = trace_dicts(engine) == run_workload(workload)
            used = sorted(w.log_path.name for w in engine.group.workers.values())
            deadline = time.monotonic() + 5      # a spare killed is gone once the template reaps it
            pid = early.template.pid
            while True:
                children = open(f"/proc/{pid}/task/{pid}/children").read().split()
                if len(children) <= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        logs_after = sorted(p.name for p in early.run_dir.glob("rank*.log"))
    finally:
        early.close()
    print(json.dumps({"same": same, "ahead": logs_ahead, "used": used, "after": logs_after,
                      "children": len(children), "asked": asked, "max": early.max_ahead}))
''')


@pytest.mark.parametrize("ahead", ["2", "3", "0", "beyond"])
def test_the_command_line_forks_the_runs_workers_ahead(ahead):
    """Once the workload is read, the command line asks its template for the workload's
    workers, and the run uses them. Workers asked for that the run does not want (another
    size) are killed, and it gets its own; none are asked for beyond what the cores can start
    meanwhile (max_ahead: 4 a core)."""
    done = subprocess.run([sys.executable, "-c", EARLY, ahead], capture_output=True, text=True,
                          timeout=40, cwd=REPO)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["same"] and len(got["used"]) == 2
    if ahead == "2":
        assert got["used"] == got["ahead"] == got["after"]
    else:
        assert not set(got["used"]) & set(got["ahead"])
        assert len(got["ahead"]) == (got["asked"] if got["asked"] <= got["max"] else 0), got
    assert got["children"] == 2, "a spare worker outlived the start that did not want it"


def test_a_process_with_threads_starts_its_template_afresh_and_an_interrupted_start_leaves_nothing():
    """Only a process of one thread, without ZeroMQ, forks itself into the template (a library
    caller's threads and their locks would be copied stopped): another gets a fresh
    interpreter. And a start interrupted once the template is forked undoes what it made."""
    script = textwrap.dedent('''
        import json, os, threading
        from inferris_dist.launcher.early import WorkerTemplate
        import inferris_dist.launcher.process as process
        stop = threading.Event()
        t = threading.Thread(target=stop.wait); t.start()
        early = WorkerTemplate.begin(1)
        kind = type(early.template.proc).__name__
        early.close()
        stop.set(); t.join()
        def interrupted(*a, **k):
            raise KeyboardInterrupt
        process.Template.of_fork = interrupted
        try:
            WorkerTemplate.begin(1)
        except KeyboardInterrupt:
            pass
        me = os.getpid()
        children = open(f"/proc/{me}/task/{me}/children").read().split()
        left = [d for d in os.listdir(os.environ["TMPDIR"]) if d.startswith("inferris-dist-")]
        print(json.dumps({"kind": kind, "children": children, "left": left}))
    ''')
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=40,
                              cwd=REPO, env={**os.environ, "TMPDIR": tmp})
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
    assert got["kind"] == "Popen", got
    assert got["children"] == [] and got["left"] == [], got
