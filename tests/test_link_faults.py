"""Link faults on real processes: the wire between the scheduler and a rank loses, delays,
duplicates and reorders messages, or cuts the rank off for a while, the rank alive and well.

Real worker processes and sockets; the link's faults act on the scheduler's side of each
connection (scheduler/link.py). Each run is judged by what its policy promises
(inferris_dist.testing), on golden random workloads at world sizes 2 to 4:

1. every link kind under restore gives the fault-free trace and under recompute the
   fault-free summary, at `--rung full` and, for some, at `--rung overlap`; a loss costs one
   recovery, a harmless kind none;
2. under abort a lost plan or result, a delay past the deadline or a partition ends with
   RankLost naming the cut-off rank alone, reason "timeout", saying it gave no answer (never
   that it died); a short delay, a duplicate, a reorder at overlap change nothing;
3. the wire log marks every message the link acted on with its `link` field and has the
   `partition` event; `@STEP+` link faults keep acting (a duplicate is harmless every step; a
   lost plan every step exhausts --max-restarts);
4. a fault's bad ARG is bad input: exit status 2 and one line;
5. `inspect` shows what the link did to each message, and a partition, on the message's line
   and in the event lines, in text and in --json;
6. a partition longer than the deadline is survived with one restart (the replacement has a link
   of its own); the grammar's numbers are the digits 0-9 alone.
"""
from __future__ import annotations

import functools
import io
import json
import re
from pathlib import Path

import pytest

from inferris_dist import testing
from inferris_dist.cli.cmd_inspect import run_inspect
from inferris_dist.cli.render import Style
from inferris_dist.engine import RankLost, WorkloadError
from inferris_dist.protocol.faults import LINK_KINDS, parse_fault

from tests.helpers.external import GOLDEN, cli

STEP_TIMEOUT = 0.5            # every loss here is seen at the deadline: keep it short
GONE_WITHIN = 5.0
pytestmark = [pytest.mark.timeout(60), pytest.mark.procs(left_within=GONE_WITHIN)]

W2, W3, W4 = "random_020", "random_005", "random_008"     # world sizes 2, 3, 4 (18, 23, 21 steps)


def spec(name: str) -> Path:
    return GOLDEN / f"{name}.spec.json"


@functools.cache
def reference(name: str, rung: str = "full") -> list[dict]:
    return testing.reference(spec(name), rung=rung)


def run(name: str, faults, policy: str, tmp_path: Path, rung: str = "full", **options) -> tuple:
    """(the run on processes, its wire log's records)."""
    log = tmp_path / f"{name}.{rung}.{policy}.jsonl"
    options.setdefault("step_timeout", STEP_TIMEOUT)
    done = testing.run_on_processes(spec(name), list(faults), policy, rung=rung, wire_log=log, **options)
    return done, [json.loads(line) for line in log.read_text().splitlines()]


def marked(records: list[dict]) -> list[tuple]:
    """(dir, type, step, rank, link) of every message the log marks with what the link did."""
    return [(r["dir"], r["type"], r["step"], r["rank"], r["link"]) for r in records if "link" in r]


def events(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r.get("event") == name]


# What each kind does to the message it names: the records the wire log marks for it
# (direction, type, the step, the rank, what the link did).
def expected_marks(fault: str) -> list[tuple]:
    f = parse_fault(fault)
    plan, result = ("out", "PLAN", f.step, f.rank), ("in", "RESULT", f.step, f.rank)
    return {"plan-lost": [(*plan, "lost")], "result-lost": [(*result, "lost")],
            "plan-delay": [(*plan, "delayed")], "result-delay": [(*result, "delayed")],
            "plan-dup": [(*plan, "duplicated")] * 2, "result-dup": [(*result, "duplicated")],
            "reorder": [(*plan, "reordered")], "partition": [(*plan, "lost")]}[f.kind]


# -- 1. the promise of each policy, every kind -----------------------------------------------

# (workload, fault, recoveries it costs): each under restore; those that cost a recovery under
# recompute too (a harmless kind recovers nothing, whatever the policy: see section 2)
FULL = [
    (W4, "1:plan-lost@3", 1),
    (W3, "2:result-lost@4", 1),
    (W2, "1:plan-delay@3:1", 1),              # past the deadline: as good as lost
    (W4, "0:result-delay@2:1", 1),
    (W2, "0:plan-delay@5:0.1", 0),            # within it: late, and taken
    (W3, "1:result-delay@6:0.1", 0),
    (W4, "3:plan-dup@4", 0),
    (W2, "1:result-dup@2", 0),
    (W3, "1:reorder@3", 1),                   # at full nothing follows the plan before the deadline
    (W4, "2:partition@5:0.2", 1),             # the plan sent into the cut is lost for good
]
OVERLAP = [
    (W4, "1:plan-lost@3", 1),
    (W3, "0:result-delay@4:1", 1),
    (W3, "1:reorder@3", 0),                   # the next plan goes at once: the held one follows it
    (W2, "1:result-dup@4", 0),
    (W4, "2:partition@5:0.2", 1),
]


def under_policies(cases):
    return [pytest.param(*case, policy, id=f"{case[1]}-{policy}") for case in cases
            for policy in ("restore", "recompute") if policy == "restore" or case[2]]


def check_promise(name, fault, recoveries, policy, rung, tmp_path):
    done, records = run(name, [fault], policy, tmp_path, rung=rung)
    verdict = testing.assert_holds(reference(name, rung), done)
    assert verdict["compared"] == ("summaries" if policy == "recompute" else "traces")
    assert len(done.recoveries) == recoveries, [r.message for r in done.recoveries]
    for r in done.recoveries:
        assert r.kind == "RankLost" and r.rank == parse_fault(fault).rank and "died" not in r.message
    if policy == "restore" or not recoveries:
        assert verdict["difference"] is None         # restore, and a harmless kind: the very trace
    assert done.unfired == []
    got = marked(records)
    assert got[:len(expected_marks(fault))] == expected_marks(fault), got
    if parse_fault(fault).kind == "partition":
        f = parse_fault(fault)
        assert [(e["rank"], e["step"], e["epoch"], e["seconds"]) for e in events(records, "partition")] == [
            (f.rank, f.step, 0, f.arg)]
    return done, records


@pytest.mark.parametrize("name,fault,recoveries,policy", under_policies(FULL))
def test_every_link_kind_keeps_the_policys_promise(name, fault, recoveries, policy, tmp_path):
    check_promise(name, fault, recoveries, policy, "full", tmp_path)


@pytest.mark.parametrize("name,fault,recoveries,policy", under_policies(OVERLAP))
def test_with_two_plans_in_flight_too(name, fault, recoveries, policy, tmp_path):
    done, records = check_promise(name, fault, recoveries, policy, "overlap", tmp_path)
    if parse_fault(fault).kind == "reorder":
        # the held plan crossed after the next one, and both were answered and joined
        f = parse_fault(fault)
        out = [(r["step"], r.get("link")) for r in records
               if r.get("dir") == "out" and r.get("type") == "PLAN" and r["rank"] == f.rank
               and r["step"] in (f.step, f.step + 1)]
        assert out == [(f.step, "reordered"), (f.step + 1, None)]
        assert not any(r.get("dropped") for r in records if r.get("rank") == f.rank)


def test_every_link_kind_is_exercised():
    kinds = {parse_fault(f).kind for _, f, _ in FULL + OVERLAP}
    assert kinds == LINK_KINDS


# -- 2. abort: the cut-off rank, and no other, gave no answer ----------------------------------

@pytest.mark.parametrize("name,fault,rung", [
    (W4, "1:plan-lost@3", "full"),
    (W2, "0:result-lost@2", "full"),
    (W3, "2:plan-delay@4:2", "full"),
    (W4, "3:partition@4:2", "full"),           # longer than the deadline
    (W3, "1:result-lost@5", "overlap"),
])
def test_under_abort_the_cut_off_rank_alone_gave_no_answer(name, fault, rung, tmp_path):
    f = parse_fault(fault)
    done, records = run(name, [fault], "abort", tmp_path, rung=rung)
    err = done.error
    assert isinstance(err, RankLost), done.lines[-1]
    assert (err.rank, tuple(err.ranks), err.reason, err.epoch) == (f.rank, (f.rank,), "timeout", 0)
    assert err.step == f.step
    assert err.message == f"rank {f.rank} gave no answer to step {f.step} within {STEP_TIMEOUT:g} s"
    assert "died" not in err.message
    assert done.recoveries == []
    # the steps before it stand, exactly
    ref = reference(name, rung)
    assert done.lines[:-1] == ref[:f.step] and done.lines[-1]["error"] == "RankLost"
    lost = events(records, "rank-lost")
    assert [(e["rank"], e["ranks"], e["reason"]) for e in lost] == [(f.rank, [f.rank], "timeout")]
    assert events(records, "end")[0]["status"] == "failed"


@pytest.mark.parametrize("name,faults,rung", [
    (W4, ["1:plan-delay@3:0.1", "2:result-delay@5:0.1"], "full"),
    (W2, ["0:plan-dup@2", "1:result-dup@3"], "full"),
    (W3, ["all:plan-dup@4"], "full"),
    (W3, ["2:reorder@6"], "overlap"),
])
def test_a_short_delay_a_duplicate_or_a_reorder_at_overlap_changes_nothing(name, faults, rung, tmp_path):
    done, records = run(name, faults, "abort", tmp_path, rung=rung)
    assert done.error is None and done.recoveries == []
    assert done.lines == reference(name, rung)
    assert not events(records, "rank-lost") and not events(records, "restart")
    for fault in faults:
        f = parse_fault(fault)
        want = {m for m in expected_marks(fault)} if f.rank is not None else {
            m[:3] + (r,) + m[4:] for m in expected_marks(fault.replace("all", "0")) for r in range(3)}
        assert want <= set(marked(records)), (fault, marked(records))


# -- 3. faults that keep acting --------------------------------------------------------------------

def test_a_duplicate_every_step_is_harmless(tmp_path):
    done, records = run(W2, ["1:plan-dup@1+", "0:result-dup@1+"], "abort", tmp_path)
    assert done.error is None and done.recoveries == [] and done.lines == reference(W2)
    plans = [(r["step"], r.get("link")) for r in records if r.get("type") == "PLAN" and r["rank"] == 1]
    sent = sorted({step for step, _ in plans})
    assert len(sent) > 10 and plans == [(s, None if s == 0 else "duplicated")
                                        for s in sent for _ in range(1 if s == 0 else 2)]
    copies = [r["step"] for r in records if r.get("type") == "RESULT" and r["rank"] == 0 and "link" in r]
    assert copies and set(copies) <= set(sent[1:]) and copies[0] == 1


def test_a_plan_lost_every_step_exhausts_max_restarts(tmp_path):
    done, records = run(W4, ["1:plan-lost@2+"], "restore", tmp_path, max_restarts=2)
    assert isinstance(done.error, RankLost) and done.error.rank == 1 and done.error.reason == "timeout"
    assert len(done.recoveries) == 2 and done.error.step == 2
    assert [e["epoch"] for e in events(records, "restart")] == [1, 2]
    assert [m for m in marked(records)] == [("out", "PLAN", 2, 1, "lost")] * 3   # once per epoch


# -- 4. bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault,said", [
    ("1:plan-delay@2", "plan-delay needs seconds"),
    ("1:result-delay@2:abc", "result-delay needs seconds"),
    ("1:partition@2:-1", "partition seconds must be within 0..3600"),
    ("1:plan-delay@2:\uff11", "plan-delay needs seconds"),          # a fullwidth digit one
])
def test_a_bad_arg_is_exit_2_and_one_line(fault, said):
    done = cli("launch", "--spec", spec(W2), "--fault", fault, "--step-timeout", STEP_TIMEOUT, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and said in done.stderr and repr(fault) in done.stderr, done.stderr


@pytest.mark.parametrize("fault,said", [
    ("1:partition@2:nan", "partition needs seconds"),
    ("1:result-delay@2:inf", "result-delay seconds must be within 0..3600"),
    ("1:plan-delay@2:3600.5", "plan-delay seconds must be within 0..3600"),
    ("1:plan-lost@2:1", "plan-lost takes no argument"),
    ("1:reorder@2:0.5", "reorder takes no argument"),
    ("1:result-dup@", "step '' is not an integer"),
])
def test_more_bad_args_are_refused(fault, said):
    with pytest.raises(WorkloadError, match=re.escape(said)):
        parse_fault(fault, 4)


# -- 5. inspect says what the link did ----------------------------------------------------------

INSPECTED = ["1:plan-lost@3", "2:result-delay@5:0.1", "0:plan-dup@6", "3:result-dup@7",
             "2:result-lost@9", "3:partition@11:0.2"]      # W4 plans steps 0-7, 9-12, 18-20


@pytest.fixture(scope="module")
def inspected(tmp_path_factory) -> Path:
    """A restore run on 4 ranks through which the link did a bit of everything, its wire log."""
    tmp = tmp_path_factory.mktemp("linklog")
    done, _ = run(W4, INSPECTED, "restore", tmp)
    testing.assert_holds(reference(W4), done)
    assert len(done.recoveries) == 3
    return tmp / f"{W4}.full.restore.jsonl"


def inspect(path, step=None, as_json=False) -> list[str]:
    out = io.StringIO()
    assert run_inspect(str(path), step, out, Style(False), as_json) == 0
    return out.getvalue().splitlines()


def test_inspect_marks_each_message_the_link_acted_on(inspected):
    lines = inspect(inspected)
    rows = {}
    for line in lines:
        m = re.match(r"^ *(\d+) +(\d+) +\d+ +\S+ B x\d+  .*?  +(\S.*)$", line)
        if m:
            rows.setdefault((int(m[1]), int(m[2])), m[3])
    assert rows[(3, 0)] == "rank 1 lost (timeout)  link: plan to rank 1 lost"
    assert rows[(5, 1)] == "joined  link: result from rank 2 delayed"
    assert rows[(6, 1)] == "joined  link: plan to rank 0 duplicated"
    assert rows[(7, 1)] == "joined  link: result from rank 3 duplicated"
    assert rows[(9, 1)] == "rank 2 lost (timeout)  link: result from rank 2 lost"
    assert rows[(11, 2)] == "rank 3 lost (timeout)  link: plan to rank 3 lost"
    assert rows[(4, 1)] == "joined"                                # the link did nothing there
    assert "       ! partition at step 11, epoch 2: rank 3 cut off for 0.2 s (everything to and " \
           "from it lost)" in lines


def test_inspect_step_puts_the_tag_on_the_ranks_line(inspected):
    lines = inspect(inspected, 3)
    first = lines[:next(i for i, line in enumerate(lines) if line.startswith("step 3, epoch 1"))]
    rank1 = next(line for line in first if re.match(r"^ +1 +- ", line))
    assert rank1.split() == ["1", "-", "no", "result", "in", "the", "log", "link:", "plan", "lost"]
    assert any(line.strip().startswith("join: rank 1 lost (timeout): rank 1 gave no answer")
               for line in first)
    assert "! the link lost the PLAN of step 3 to rank 1" in [line.strip() for line in first]
    lines = inspect(inspected, 7)
    rank3 = next(line for line in lines if re.match(r"^ +3 +\d+ B ", line))
    assert rank3.endswith("link: result duplicated")
    lines = inspect(inspected, 11)
    assert "! partition at step 11, epoch 2: rank 3 cut off for 0.2 s (everything to and from it lost)" \
        in [line.strip() for line in lines]


def test_inspect_json_says_what_the_link_did(inspected):
    objs = [json.loads(line) for line in inspect(inspected, as_json=True)]
    attempts = {(o["step"], o["epoch"]): o for o in objs if o["record"] == "attempt"}
    assert attempts[(3, 0)]["link"] == [{"rank": 1, "dir": "out", "type": "PLAN", "link": "lost"}]
    assert attempts[(3, 0)]["verdict"] == "rank 1 lost (timeout)"
    assert attempts[(9, 1)]["link"] == [{"rank": 2, "dir": "in", "type": "RESULT", "link": "lost"}]
    assert attempts[(9, 1)]["result_bytes"][2] is None           # a result the link lost: none came
    assert "link" not in attempts[(4, 1)]
    partitions = [o for o in objs if o.get("event") == "partition"]
    assert partitions == [{"record": "event", "event": "partition", "rank": 3, "step": 11, "epoch": 2,
                           "seconds": 0.2}]
    step = [json.loads(line) for line in inspect(inspected, 5, as_json=True)]
    results = {(o["epoch"], o["rank"]): o for o in step if o["record"] == "result"}
    assert results[(1, 2)]["link"] == [{"dir": "in", "type": "RESULT", "link": "delayed"}]
    assert results[(1, 2)]["bytes"] is not None and "link" not in results[(1, 0)]


# -- 6. promises broken today ---------------------------------------------------------------------

def test_a_partition_longer_than_the_deadline_is_survived_with_one_restart(tmp_path):
    done, _ = run(W4, ["1:partition@3:1.5"], "restore", tmp_path, max_restarts=1, start_timeout=2)
    testing.assert_holds(reference(W4), done)
    assert len(done.recoveries) == 1


@pytest.mark.parametrize("fault", ["\uff11:plan-lost@2", "1:plan-lost@\u0662", "1:plan-lost@+2",
                                   "1:plan-lost@ 2", "1:plan-delay@2:1_0", "1:plan-delay@2: 0.5"])
def test_a_faults_numbers_are_the_digits_0_to_9_alone(fault):
    try:
        parse_fault(fault, 4)
    except WorkloadError:
        return
    raise AssertionError(f"{fault!r} was taken as {parse_fault(fault, 4)}")
