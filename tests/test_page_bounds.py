"""The page's builder against logs that would cost it more than their size: nothing the page
does is sized by a number from the log, every kind of span and mark has a budget, and no trace
makes it raise.

1. a step trace it cannot use (a draft with no accepted count) is left out and said in a note:
   `html` makes the page, `inspect` reads the same log;
2. fuzzed step traces (keys missing or extra, values of every kind) never make it raise;
3. a restart naming rank 100,000,000 costs what its digits cost, and so do the biggest numbers
   the log may hold in any field;
4. a request lane within its share of the segment budget is exactly the states the steps say,
   and one past it is drawn coarser, never wrong (the 200-lane, 40,000-step log is in
   test_page_scale.py);
5. past each bound (members, joins, epochs, ...), what is not shown is counted in a note.
"""
from __future__ import annotations

import json
import subprocess
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferris_dist.page import build_page, write_page
from inferris_dist.page.data import page_data
from inferris_dist.page.model import (
    CHANGING,
    MAX_EPOCHS,
    MAX_MEMBERS,
    PREEMPTED,
    RUNNING,
    TRACE_COUNTS,
    TRACE_IDS,
    TRACE_WORDS,
    WAITING,
    Builder,
    runs,
)
from inferris_dist.wirelog.schema import check_record

from tests.helpers.external import CLI, ENV, GOLDEN, REPO
from tests.helpers.pagelogs import HUGE, hostile_numbers, lanes_log, restarts_log
from tests.test_page import data_of, html_cli, lines_of, synthetic

pytestmark = [pytest.mark.timeout(180), pytest.mark.procs]

RUN = {"t": 1.0, "event": "run", "name": "n", "world_size": 2, "rung": "full", "policy": "restore",
       "faults": [], "config": {}, "requests": 1, "scheduler_pid": 1, "listen": None, "shared_clock": True}


def costs(make) -> tuple[float, int]:
    """Seconds and peak bytes Python allocated while `make()` ran."""
    tracemalloc.start()
    try:
        started = time.perf_counter()
        make()
        took = time.perf_counter() - started
        return took, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- 1. a trace the page cannot use -------------------------------------------------------------

def test_a_draft_with_no_accepted_count_is_left_out_and_said(tmp_path):
    log = synthetic(tmp_path / "drafts.log", 8, 2)
    lines = log.read_text().splitlines()
    for i, line in enumerate(lines):
        if '"event": "step", "step": 3' in line:
            rec = json.loads(line)
            rec["trace"]["drafted"] = {"req-0": 2, "req-1": 3}
            rec["trace"]["accepted"] = {"req-1": 1}
            lines[i] = json.dumps(rec)
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "drafts.html"
    made = html_cli(str(log), "-o", str(out))
    assert made.returncode == 0 and made.stderr == "", made.stderr
    data = data_of(out.read_text())
    [note] = [n for n in data["notes"] if "step trace" in n]
    assert note.startswith("1 step trace(s) held what the page cannot use") and \
        "drafted naming a request accepted does not x1" in note, note
    line = data["steps"]["line"][data["steps"]["step"].index(3)]
    assert [part for part in line.split("  ") if part.startswith("accept")] == ["accept req-1:1/3"], line
    seen = subprocess.run([*CLI, "inspect", str(log)], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert seen.returncode == 0 and seen.stderr == "", seen.stderr            # inspect reads it too


# -- 2. no trace makes the builder raise ----------------------------------------------------------

IDS = st.sampled_from(["r0", "r1", "r2", "</script>"])
LEAVES = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=6)
ANY = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=10)
FIELD = st.one_of(ANY, st.lists(IDS | ANY, max_size=5),
                  st.dictionaries(IDS, st.integers(-3, 9) | ANY, max_size=4),
                  st.dictionaries(IDS, st.sampled_from(["TOKEN", "EOS", "LENGTH"]) | ANY, max_size=4))
KEYS = st.sampled_from(("step",) + TRACE_IDS + TRACE_COUNTS + TRACE_WORDS + ("evicted", "extra", ""))
TRACES = st.one_of(ANY, st.dictionaries(KEYS, FIELD, max_size=12))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TRACES, min_size=1, max_size=6), st.lists(ANY, max_size=3))
def test_no_step_trace_makes_the_builder_raise(traces, counters):
    records = [RUN] + [{"t": 2.0 + i, "event": "step", "step": i, "epoch": 0, "trace": tr,
                        "counters": counters[i] if i < len(counters) else {}} for i, tr in enumerate(traces)]
    b = Builder()
    for r in records:
        b.add(r)
    assert not b.malformed                                     # a bad trace is not a bad record
    page_data(b, "fuzzed", [])
    data = data_of(build_page(records))
    assert len(data["steps"]["step"]) == len(traces)


# -- 3. numbers from the log size nothing -------------------------------------------------------

def test_a_restart_naming_rank_100000000_costs_what_its_digits_cost(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text(json.dumps({"t": 1.0, "event": "restart", "ranks": [0, 1, 100000000], "epoch": 1,
                               "step": 0, "shard_pages": 4, "policy": "restore"}) + "\n")
    out = tmp_path / "rank.html"
    took, peak = costs(lambda: write_page(str(log), str(out)))
    print(f"\n{log.stat().st_size}-byte log: page built in {took * 1000:.0f} ms, "
          f"{peak / 2**20:.1f} MiB at peak")
    assert took < 1.0 and peak < 64 << 20, (took, peak)
    data = data_of(out.read_text())
    assert "restarted ranks 0, 1, 100000000 into epoch 1" in " ".join(data["strs"])


def test_the_biggest_numbers_anywhere_cost_nothing():
    records = hostile_numbers()
    page = []
    took, peak = costs(lambda: page.append(build_page(records)))
    print(f"\nhostile numbers: page of {len(page[0]) / 1e3:.0f} kB built in {took * 1000:.0f} ms, "
          f"{peak / 2**20:.1f} MiB at peak")
    assert took < 2.0 and peak < 64 << 20 and len(page[0]) < 1 << 20, (took, peak, len(page[0]))
    data = data_of(page[0])
    assert data["idle"][0][:2] == [0, HUGE] and len(data["ranks"]) <= 256


# -- 4. request lanes, exact within their budget ---------------------------------------------

def test_the_synthetic_logs_are_what_the_writer_writes(tmp_path):
    for log in (restarts_log(tmp_path / "r.log", 4, 6, messages=True), lanes_log(tmp_path / "l.log", 5, 7)):
        for record in lines_of(log):
            check_record(record)


def reference_lanes(records: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Each request's (state, step) at every committed step from its admission to its finish,
    worked out the plain way, a loop over every lane at every step."""
    lanes: dict[str, list] = {}
    active: dict[str, int] = {}
    for r in records:
        if r.get("event") != "step":
            continue
        tr = r["trace"]
        ran = set(tr["scheduled"]) | set(tr["executed"])
        for rid in tr["admitted"] + tr["scheduled"]:
            if rid not in lanes:
                lanes[rid], active[rid] = [], WAITING
        for rid in list(active):
            state = PREEMPTED if rid in tr["preempted"] else RUNNING if rid in ran else \
                PREEMPTED if active[rid] == PREEMPTED else WAITING
            lanes[rid].append((state, r["step"]))
            active[rid] = state
            if rid in tr["finished"]:
                del active[rid]
    return lanes


def test_a_lane_within_its_share_is_every_state_the_steps_say(tmp_path):
    log, out = tmp_path / "pre.log", tmp_path / "pre.html"
    done = subprocess.run([*CLI, "launch", "--world-size", "2", "--spec",
                           str(GOLDEN / "preemption.spec.json"), "--wire-log", str(log), "--html", str(out)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    records = lines_of(log)
    want = reference_lanes(records)
    data = data_of(out.read_text())
    rq = data["requests"]
    step_end = dict(zip(data["steps"]["step"], data["steps"]["b"]))
    assert sorted(rq["ids"]) == sorted(want) and rq["coarse"] == 0
    assert any(state == PREEMPTED for lane in want.values() for state, _ in lane)
    for rid, lane in zip(rq["ids"], rq["lanes"]):
        got, t = [], lane[0]
        for k in range(1, len(lane), 2):
            t += lane[k + 1]
            got.append((lane[k], t))
        # the same runs of states, each ending where its last step ended
        runs_of = []
        for state, step in want[rid]:
            if runs_of and runs_of[-1][0] == state:
                runs_of[-1] = (state, step)
            else:
                runs_of.append((state, step))
        assert got == [(state, step_end[step]) for state, step in runs_of], rid


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([WAITING, RUNNING, PREEMPTED]), max_size=300), st.integers(2, 40))
def test_a_lane_past_its_share_is_drawn_coarser_and_never_wrong(states, cap):
    states = bytes(states)
    got, q = runs(states, cap)
    assert len(got) <= cap
    assert [a for _, a, _ in got] == [0] + [z for _, _, z in got[:-1]] if got else not states
    assert not got or got[-1][2] == len(states)                  # one after the other, to the end
    for state, a, z in got:
        if state == CHANGING:
            assert len(set(states[a:z])) > 1 and q > 1       # it did change in there
        else:
            assert set(states[a:z]) == {state}               # a state is only ever what it was
    changes = sum(x != y for x, y in zip(states, states[1:]))
    if changes < cap:                                        # it fits: every state, exactly
        assert q == 1 and len(got) == (1 + changes if states else 0)
    else:                                                    # no coarser than it must be
        assert q <= max(2, 2 * -(-len(states) // cap))


# -- 5. past each bound, counted --------------------------------------------------------------------

def test_past_each_bound_what_is_not_shown_is_counted(tmp_path):
    records = [RUN]
    for i in range(MAX_MEMBERS + 7):
        records.append({"t": 2.0 + i * 1e-4, "event": "member", "rank": i % 4, "epoch": i, "pid": 100 + i,
                        "host": "", "proof": ""})
    for i in range(MAX_EPOCHS + 3):
        records.append({"t": 5.0 + i * 1e-4, "event": "restart", "ranks": [i % 4], "epoch": i + 1, "step": 0,
                        "shard_pages": 1, "policy": "restore"})
    data = data_of(build_page(records))
    notes = " | ".join(data["notes"])
    assert "7 members admitted beyond the page's bound are not shown" in notes, notes
    assert "3 epoch starts beyond the page's bound are not shown" in notes, notes
    assert "restart x" in notes and "replaced x" in notes, notes           # marks, by kind
    assert len(data["members"]) == MAX_MEMBERS and len(data["epochs"]) == MAX_EPOCHS
