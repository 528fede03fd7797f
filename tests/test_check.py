"""`inferris-dist check`: a recorded run judged afterwards, whatever wrote its wire log.

Real wire logs, recorded once per module by real runs on worker processes:
1. the logs of real runs are accepted, each judged against the reference engine by its
   policy's promise: fault-free, a crash restored and recomputed, duplicate and stale replies,
   an audit after every step finding a dropped write, the overlap rung with and without a
   fault, the link delaying, duplicating, reordering and losing messages, an abort, an idle
   stretch;
2. each tampered log, one change each, is caught, a violation naming the line, the step, the
   epoch and the rank: a committed result's accepted count, a RESULT removed, an epoch
   changed, a step's trace altered, a PLAN removed, a retired member's late reply taken, a
   dropped reply counted, the end removed; phase 9 is the engine's own: a result tampered
   alike on every rank, the checker says each of its mismatches, the engine refuses it at the
   first, in its own words;
3. the workload: recorded in the run event (a digest always); --spec of the run's workload is
   used, of another one refused (exit status 2, one line);
4. bad input is one line and exit status 2; --json is one object of the documented shape;
   exit status 1 for violations; a newer writer's fields and events are left alone; whatever
   a log is changed to, a report or bad input, never another exception;
5. a long log is checked in memory that does not grow with it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferris_dist import testing
from inferris_dist.cli.cmd_check import JSON_HELP
from inferris_dist.engine import WorkloadError, load_workload
from inferris_dist.engine.boundary import validate
from inferris_dist.engine.errors import BoundaryViolation
from inferris_dist.engine.messages import ExecutionPlan, ExecutionResult, ItemOutcome, PlanItem
from inferris_dist.judge.check import check_log
from inferris_dist.wirelog.writer import workload_fields

from tests.helpers.external import CLI, ENV, GOLDEN, REPO

pytestmark = [pytest.mark.timeout(60)]

DEMO, PREEMPTION = GOLDEN / "demo.spec.json", GOLDEN / "preemption.spec.json"
RUNS = {  # name -> (workload, world size, faults, policy, options, what `checked` must say)
    "clean": (DEMO, 4, [], "abort", {}, {"reference": "traces", "epochs": 1, "end": "ok"}),
    "restore": (DEMO, 3, ["1:crash@2"], "restore", {}, {"reference": "traces", "epochs": 2}),
    "recompute": (DEMO, 3, ["1:crash@2"], "recompute", {}, {"reference": "summaries", "epochs": 2}),
    "replies": (DEMO, 4, ["1:duplicate@1", "2:stale@2", "3:stale@3"], "restore", {},
                {"reference": "traces", "epochs": 1}),
    "audit": (DEMO, 3, ["1:drop-write@2"], "restore", {"audit_every": 1},
              {"reference": "traces", "epochs": 2}),
    "overlap": (GOLDEN / "speculative.spec.json", 2, [], "abort", {"rung": "overlap"},
                {"reference": "traces", "rung": "overlap"}),
    "overlap-restore": (DEMO, 3, ["1:crash@3"], "restore", {"rung": "overlap"},
                        {"reference": "traces", "epochs": 2, "rung": "overlap"}),
    "overlap-recompute": (DEMO, 3, ["2:crash@2"], "recompute", {"rung": "overlap", "audit_every": 1},
                          {"reference": "summaries", "epochs": 2, "rung": "overlap"}),
    "link": (DEMO, 3, ["1:result-delay@2:0.05", "2:plan-dup@3", "0:result-dup@1"], "restore", {},
             {"reference": "traces", "epochs": 1}),
    "link-overlap": (DEMO, 3, ["1:reorder@2", "2:plan-delay@3:0.02"], "restore", {"rung": "overlap"},
                     {"reference": "traces", "epochs": 1, "rung": "overlap"}),
    "link-lost": (DEMO, 3, ["1:plan-lost@2", "2:result-lost@4"], "restore", {"step_timeout": 0.3},
                  {"reference": "traces", "epochs": 3}),
    "abort": (DEMO, 3, ["1:crash@2"], "abort", {}, {"reference": "prefix", "end": "failed"}),
    "disagree": (PREEMPTION, 2, ["0:disagree@3"], "restore", {}, {"reference": "traces", "epochs": 2}),
    "idle": (GOLDEN / "continuous_batching.spec.json", 2, [], "abort", {}, {"reference": "traces"}),
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    """name -> the wire log of a real run on worker processes (its faults checked to fire)."""
    tmp = tmp_path_factory.mktemp("checked")
    out = {}
    for name, (workload, world, faults, policy, options, _) in RUNS.items():
        out[name] = tmp / f"{name}.jsonl"
        run = testing.run_on_processes(workload, faults, policy, world_size=world, wire_log=out[name],
                                       **options)
        assert not run.unfired and (run.error is None) == (name != "abort"), (name, run.lines[-1])
    return out


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, objs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def check(*args, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "check", *map(str, args)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=60, input=stdin)


# -- 1. real runs are accepted ------------------------------------------------------------------

@pytest.mark.procs
@pytest.mark.parametrize("name", list(RUNS))
def test_the_log_of_a_real_run_is_accepted(logs, name):
    report = check_log(logs[name])
    assert report.ok, "\n".join(report.lines())
    c = report.checked
    for key, value in RUNS[name][5].items():
        assert c[key] == value, (key, c)
    objs = records(logs[name])
    assert c["records"] == len(objs) and c["ranks"] == RUNS[name][1] and c["workload"] == "recorded"
    assert c["committed"] == sum(o.get("event") == "step" for o in objs)
    assert c["attempts"] == sum(o.get("event") == "attempt" for o in objs) >= c["committed"]
    assert c["steps"] == objs[-1]["steps"] and c["idle"] == (3 if name == "idle" else 0)
    assert c["dropped"] == sum("dropped" in o for o in objs)
    if name == "replies":
        assert c["dropped"] >= 2                   # the duplicate and a stale reply crossed, dropped
    if name == "audit":
        assert any(o.get("event") == "audit-failed" for o in objs)
    if name.startswith("link"):                  # what the link did is in the log, and was allowed
        marks = {o["link"] for o in objs if "link" in o}
        want = {"link": {"delayed", "duplicated"}, "link-overlap": {"reordered", "delayed"},
                "link-lost": {"lost"}}
        assert marks == want[name], marks
    assert report.lines() == [report.summary()] and report.summary().startswith(f"{report.log}: ok: ")


# -- 2. tampered logs are caught ------------------------------------------------------------

def find(objs: list[dict], **want) -> int:
    """The index of the first record with every field `want` says."""
    return next(i for i, o in enumerate(objs) if all(o.get(k) == v for k, v in want.items()))


def accepted_changed(logs):
    objs = records(logs["restore"])
    at = next(i for i, o in enumerate(objs) if o.get("event") == "step" and o["trace"]["accepted"])
    step, epoch = objs[at]["step"], objs[at]["epoch"]
    i = find(objs, type="RESULT", step=step, epoch=epoch, rank=1)
    outcome = next(o for o in objs[i]["body"] if o["accepted"] > 0)
    outcome["accepted"] -= 1
    return objs, (i + 1, step, epoch, 1), ["rank 1's RESULT is not rank 0's", "accepted"]


def result_removed(logs):
    objs = records(logs["restore"])
    i = find(objs, type="RESULT", step=3, epoch=1, rank=2)
    del objs[i]
    at = find(objs, event="step", step=3)
    return objs, (at + 1, 3, 1, 2), ["without a RESULT of rank 2 in epoch 1"]


def epoch_changed(logs):
    objs = records(logs["restore"])
    i = find(objs, type="RESULT", step=2, epoch=1, rank=0)
    objs[i]["epoch"] = 2
    return objs, (i + 1, 2, 2, 0), ["of epoch 2 taken in epoch 1"]


def trace_altered(logs):
    objs = records(logs["clean"])
    i = find(objs, event="step", step=3)
    rid = next(iter(objs[i]["trace"]["executed"]))
    objs[i]["trace"]["executed"][rid] += 1
    return objs, (i + 1, 3, 0, None), ["executed", "is not the plan's items"]


def plan_removed(logs):
    objs = records(logs["clean"])
    del objs[find(objs, type="PLAN", step=2, rank=1)]
    i = find(objs, type="RESULT", step=2, rank=1)
    return objs, (i + 1, 2, 0, 1), ["answers no PLAN sent to it"]


def retired_member_taken(logs):
    """Under a GroupViolation restore replaces every rank: rank 1's reply to the failed attempt
    comes late, after its member was retired, and is taken, not dropped."""
    objs = records(logs["disagree"])
    late = objs.pop(find(objs, type="RESULT", step=3, epoch=0, rank=1))
    at = find(objs, event="member", rank=1, epoch=1) + 1
    objs.insert(at, late)
    return objs, (at + 1, 3, 0, 1), ["rank 1's retired member (of epoch 0, replaced in epoch 1)"]


def dropped_counted(logs):
    objs = records(logs["replies"])
    i = find(objs, type="RESULT", dropped="duplicate")
    del objs[i]["dropped"]
    o = objs[i]
    where = (i + 1, o["step"], o["epoch"], o["rank"])
    if i > find(objs, event="attempt", step=o["step"], epoch=o["epoch"]):   # it came after the join
        return objs, where, [f"a RESULT from rank {o['rank']} taken after its attempt's verdict"]
    taken = [j for j, x in enumerate(objs) if j != i and x.get("type") == "RESULT" and "dropped" not in x
             and (x["step"], x["epoch"], x["rank"]) == (o["step"], o["epoch"], o["rank"])]
    lines = sorted((i + 1, taken[0] + 1))
    return objs, (lines[1], *where[1:]), [f"two RESULTs from rank {o['rank']} taken, at lines {lines[0]} and "
                                         f"{lines[1]}"]


def end_removed(logs):
    objs = records(logs["clean"])
    objs.pop()
    return objs, (None, None, None, None), ["no end event"]


TAMPERED = [accepted_changed, result_removed, epoch_changed, trace_altered, plan_removed,
            retired_member_taken, dropped_counted, end_removed]


@pytest.mark.procs
@pytest.mark.parametrize("tamper", TAMPERED, ids=lambda f: f.__name__)
def test_a_tampered_log_is_caught_naming_the_line_step_epoch_and_rank(logs, tmp_path, tamper):
    objs, where, words = tamper(logs)
    report = check_log(write(tmp_path / "tampered.jsonl", objs))
    assert not report.ok
    named = [v for v in report.violations if (v.line, v.step, v.epoch, v.rank) == where]
    assert named, f"nothing at {where}:\n" + "\n".join(report.lines())
    assert any(all(w in v.what for w in words) for v in named), "\n".join(map(str, named))
    assert report.summary().endswith(f"{len(report.violations)} violation"
                                     f"{'s' * (len(report.violations) != 1)} in "
                                     f"{report.summary().split(' in ', 1)[1]}")


@pytest.mark.procs
def test_phase_9_is_the_engines_the_checker_says_every_violation_the_engine_stops_at_the_first(
        logs, tmp_path):
    objs = records(logs["clean"])
    at = next(i for i, o in enumerate(objs) if o.get("type") == "RESULT" and len(o["body"]) >= 2)
    step = objs[at]["step"]
    for o in objs:                                # every rank's RESULT alike: the join holds
        if o.get("type") == "RESULT" and o["step"] == step:
            o["body"][0]["writes"] = [*o["body"][0]["writes"], 99]
            o["body"][1]["accepted"] = 99
    plan = next(o["body"] for o in objs if o.get("type") == "PLAN" and o["step"] == step)
    first, second = plan["items"][:2]
    pages = ",".join(map(str, first["placements"]))
    high = second["num_tokens"] - 1 if second["decode"] else 0
    line = find(objs, event="step", step=step) + 1
    report = check_log(write(tmp_path / "phase9.jsonl", objs))
    said = [v.what for v in report.violations if v.line == line]
    assert said == [f"{first['request_id']} wrote pages [{pages},99], placed on [{pages}]",
                    f"{second['request_id']} accepted 99, allowed 0..{high}"], said
    engine_plan = ExecutionPlan(step, tuple(PlanItem(**{**it, "placements": tuple(it["placements"])})
                                            for it in plan["items"]))
    result = next(o["body"] for o in objs if o.get("type") == "RESULT" and o["step"] == step)
    engine_result = ExecutionResult(step, tuple(ItemOutcome(**{**o, "writes": tuple(o["writes"])})
                                                for o in result))
    with pytest.raises(BoundaryViolation) as refused:
        validate(engine_plan, engine_result)
    assert str(refused.value) == f"{first['request_id']}: wrote pages [{pages},99], placed on pages [{pages}]"


@pytest.mark.procs
def test_the_cli_says_each_violation_on_a_line_and_exits_1(logs, tmp_path):
    objs, (line, step, epoch, rank), _ = accepted_changed(logs)
    path = write(tmp_path / "t.jsonl", objs)
    done = check(path)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert f"t.jsonl line {line}: step {step}, epoch {epoch}, rank {rank}: rank 1's RESULT" in done.stdout
    assert lines[-1].startswith(f"{path}: 1 violation in ") and len(lines) == 2
    done = check(path, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert done.stdout.count("\n") == 1 and report["ok"] is False and report["more_violations"] == 0
    assert report["violations"][0] == {**report["violations"][0], "line": line, "step": step, "epoch": epoch,
                                       "rank": rank}
    assert set(report) == {"log", "ok", "violations", "more_violations", "checked"}
    assert set(report["checked"]) == {"records", "steps", "committed", "idle", "attempts", "epochs", "ranks",
                                      "results", "dropped", "rung", "policy", "end", "workload", "reference",
                                      "why_not", "cut_short"}
    for key in report["checked"]:
        assert f'"{key}"' in JSON_HELP, key              # the help gives every field


# -- 3. the workload -----------------------------------------------------------------------

@pytest.mark.procs
def test_the_run_event_records_the_workload_and_its_digest(logs):
    run = records(logs["restore"])[0]
    workload = load_workload(DEMO).with_config(world_size=3)
    assert run["workload_digest"] == workload_fields(workload)["workload_digest"]
    assert run["workload"] == workload_fields(workload)["workload"]
    assert load_workload(run["workload"]) == workload


@pytest.mark.procs
def test_spec_of_the_runs_workload_is_used_and_of_another_refused(logs, tmp_path):
    objs = records(logs["restore"])
    del objs[0]["workload"]                    # a log that records only the digest (a big workload)
    path = write(tmp_path / "digest-only.jsonl", objs)
    report = check_log(path)
    assert report.ok and report.checked["reference"] is None and "give it" in report.checked["why_not"]
    done = check(path, "--spec", DEMO)
    assert done.returncode == 0 and done.stdout.endswith("the trace is the reference's\n"), done.stdout
    assert check_log(path, DEMO).checked["workload"] == "given"
    done = check(path, "--spec", PREEMPTION)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"inferris-dist: check {path}: --spec {PREEMPTION} is not this run's "
                                  f"workload (its digest sha256:"), done.stderr
    done = check(logs["restore"], "--spec", "-", stdin=PREEMPTION.read_text())
    assert done.returncode == 2 and "is not this run's workload" in done.stderr


@pytest.mark.procs
def test_a_trace_the_reference_does_not_have_is_a_broken_promise(logs, tmp_path):
    """A step altered consistently with its plan and result (what the protocol alone cannot see):
    the reference's trace differs."""
    objs = records(logs["clean"])
    i = find(objs, event="step", step=1)
    objs[i]["trace"]["published"] = {}
    report = check_log(write(tmp_path / "t.jsonl", objs))
    assert [(v.line, v.step) for v in report.violations] == [(i + 1, 1)]
    assert "is not the reference's: published {}" in report.violations[0].what


@pytest.mark.procs
def test_a_newer_writers_fields_and_events_are_left_alone_and_a_lost_message_is_not_joined(logs, tmp_path):
    objs = records(logs["restore"])
    for o in objs:
        if "dir" in o:
            o["link"] = "rerouted"               # a mark it does not know: delivered, all the same
    objs.insert(5, {"t": 1.0, "event": "weather", "ranks": [0, 1], "dur": 0.5})
    assert check_log(write(tmp_path / "newer.jsonl", objs)).ok
    i = find(objs, type="RESULT", step=4, rank=1)
    objs[i]["link"] = "lost"                     # it never arrived: it cannot have been joined
    report = check_log(write(tmp_path / "lost.jsonl", objs))
    assert [(v.step, v.rank) for v in report.violations] == [(4, 1)], report.lines()
    assert "without a RESULT of rank 1" in report.violations[0].what


@pytest.mark.procs
def test_whatever_a_log_is_changed_to_the_checker_reports_or_refuses_it(logs, tmp_path):
    """Random changes to a real log (a field's value, a field gone, a line gone or moved): a
    report or bad input, never another exception."""
    import random
    rng = random.Random(4)
    values = [0, 1, -1, 7, 10 ** 12, None, True, "x", [], {}, [1], {"a": 1}, 0.5, "RESULT", "joined"]
    source = records(logs["overlap-restore"])
    outcomes = {"ok": 0, "violations": 0, "bad input": 0}
    for _ in range(120):
        objs = json.loads(json.dumps(source))
        i = rng.randrange(len(objs))
        node, key = objs, i
        while isinstance(node[key], (dict, list)) and node[key] and rng.random() < 0.7:
            node = node[key]
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        change = rng.random()
        if change < 0.1:
            del objs[i]
        elif change < 0.2:
            objs.insert(rng.randrange(len(objs)), objs.pop(i))
        elif change < 0.3 and isinstance(node, dict):
            del node[key]
        else:
            node[key] = rng.choice(values)
        try:
            report = check_log(write(tmp_path / "changed.jsonl", objs))
        except WorkloadError:
            outcomes["bad input"] += 1
        else:
            outcomes["ok" if report.ok else "violations"] += 1
    assert all(outcomes.values()), outcomes


# -- 4. bad input ----------------------------------------------------------------------------

@pytest.mark.procs
@pytest.mark.parametrize("spoil,said", [
    (lambda objs: objs.insert(3, "not a record"), "line 4: not JSON"),
    (lambda objs: objs.insert(3, {"a": "record of no kind"}), "line 4: neither a wire message nor an event"),
    (lambda objs: objs[5].update(rank="two"), "line 6: "),
    (lambda objs: objs.pop(0), "line 1: not a wire log of a run: its first record is not the run event"),
])
def test_a_malformed_log_is_bad_input_in_one_line(logs, tmp_path, spoil, said):
    objs = records(logs["clean"])
    spoil(objs)
    path = write(tmp_path / "bad.jsonl", objs)
    with pytest.raises(WorkloadError, match=said):
        check_log(path)
    done = check(path)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert said in done.stderr


def test_no_such_log_and_a_directory_are_bad_input(tmp_path):
    for path in (tmp_path / "nothing.jsonl", tmp_path):
        done = check(path)
        assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("inferris-dist: check ")


# -- 5. bounded ------------------------------------------------------------------------------

def write_long_log(path: Path, steps: int, ranks: int = 8, requests: int = 8) -> Path:
    """A consistent log of `steps` steps on `ranks` ranks, `requests` requests each prefilling 4
    tokens every step (the log records only its workload's digest: no reference to run)."""
    ids = [f"q{i}" for i in range(requests)]
    with open(path, "w") as f:
        w = f.write
        config = {"max_step_tokens": 4 * requests, "page_size": 4, "num_pages": 1 << 24, "spec_len": 0,
                  "world_size": ranks}
        w(json.dumps({"t": 0.0, "event": "run", "name": "long", "world_size": ranks, "rung": "full",
                      "policy": "abort", "faults": [], "config": config,
                      "requests": requests, "scheduler_pid": 1, "listen": None, "shared_clock": True,
                      "workload_digest": "sha256:0"}) + "\n")
        for r in range(ranks):
            w(json.dumps({"t": 0.0, "event": "member", "rank": r, "epoch": 0, "pid": 100 + r, "host": "",
                          "proof": "run secret"}) + "\n")
        for s in range(steps):
            plan = json.dumps({"step": s, "items": [
                {"request_id": q, "start_position": 4 * s, "num_tokens": 4, "draft_len": 0, "decode": False,
                 "verdict_index": 0, "placements": [s * requests + i], "prior_drafts": 0}
                for i, q in enumerate(ids)]})
            result = json.dumps([{"request_id": q, "start_position": 4 * s, "executed_tokens": 4,
                                  "accepted": 0, "writes": [s * requests + i]} for i, q in enumerate(ids)])
            for r in range(ranks):
                w(f'{{"t": 1.0, "dir": "out", "rank": {r}, "epoch": 0, "step": {s}, "type": "PLAN", '
                  f'"bytes": 500, "body": {plan}}}\n')
            for r in range(ranks):
                w(f'{{"t": 1.0, "dir": "in", "rank": {r}, "epoch": 0, "step": {s}, "type": "RESULT", '
                  f'"bytes": 300, "body": {result}, "sent": 1.0, "rtt": 0.001}}\n')
            w(f'{{"t": 1.0, "event": "attempt", "step": {s}, "epoch": 0, "verdict": "joined", '
              f'"plan_bytes": 500}}\n')
            trace = {"step": s, "admitted": ids if s == 0 else [], "scheduled": ids,
                     "executed": {q: 4 for q in ids}, "sampled": {}, "finished": {}, "preempted": [],
                     "reused": {}, "published": {}, "evicted": [], "drafted": {}, "accepted": {},
                     "rolled_back": {}}
            w(json.dumps({"t": 1.0, "event": "step", "step": s, "epoch": 0, "trace": trace,
                          "counters": {}}) + "\n")
        w(json.dumps({"t": 2.0, "event": "end", "status": "ok", "error": None, "steps": steps}) + "\n")
    return path


PEAK = """\
import sys
from inferris_dist.cli.main import main
status = main(sys.argv[1:])
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
sys.stderr.write(f"{int(peak.split()[1]) * 1024}\\n")
sys.exit(status)
"""


def peak_rss(*args) -> tuple[int, str]:
    """`inferris-dist check ARGS` run to its end: its peak resident memory (bytes, its process's own
    high-water mark: not the forking parent's), its output."""
    done = subprocess.run([sys.executable, "-c", PEAK, "check", *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stderr.splitlines()[-1]), done.stdout


@pytest.mark.timeout(90)
def test_a_long_log_is_checked_in_memory_that_does_not_grow_with_it(tmp_path):
    small = write_long_log(tmp_path / "small.jsonl", 100)
    big = write_long_log(tmp_path / "big.jsonl", 2500)
    size = big.stat().st_size
    assert size > 45 << 20
    base, _ = peak_rss(small)
    peak, out = peak_rss(big)
    assert out.startswith(f"{big}: ok: 2500 steps in 2500 attempts, 1 epoch, 8 ranks; 20000 results "
                          f"taken"), out
    assert peak - base < 4 << 20 and peak < size * 3 / 4, (base, peak, size)   # 100 steps or 2500


def test_a_big_workload_is_recorded_by_its_digest_only_and_the_library_names_the_checker():
    big = load_workload({"requests": [{"request_id": f"r{i}", "prompt_len": 1000, "max_new_tokens": 1}
                                      for i in range(200)]})
    fields = workload_fields(big)
    assert set(fields) == {"workload_digest"} and fields["workload_digest"].startswith("sha256:")
    small = workload_fields(load_workload(DEMO))
    assert load_workload(small["workload"]) == load_workload(DEMO)
    assert workload_fields(load_workload(small["workload"])) == small     # the digest of what it holds
    assert testing.check_history is check_log and "check_history" in testing.__all__
