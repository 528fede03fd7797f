"""`inferris-dist inspect`: a wire log read back, checked against the log itself.

Real wire logs, recorded once per module by real launches (no fakes):
1. the summary has one row per (step, epoch) attempt, in the order of the log, with the
   plan's item count, and the totals of the log's messages;
2. a crash survived by `restore` shows two attempts at the failed step, the loss, the
   restart; a disagreement shows the GroupViolation; idle steps show as one line;
3. `--step K` lists exactly the items of step K's PLAN and every rank's RESULT;
4. bad input is one line naming the file, with nothing printed before it;
5. request ids and notes from the log are shown escaped;
6. --step on a large log keeps only that step: its peak memory does not grow with the log.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from external import GOLDEN

from engine import WorkloadError
from inferris_dist.cmd_inspect import run_inspect
from inferris_dist.render import Style, human_bytes

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
ROW = re.compile(r"^ *(\d+) +(\d+) +(\d+) +[\d.]+ k?B x\d+  (.*?)  +(\S.*)$")   # columns: 2 spaces
ESCAPED_IDS = {"engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8, "spec_len": 0,
                          "world_size": 2},
               "requests": [{"request_id": "a\x1b[2J\nb", "prompt_len": 3, "max_new_tokens": 2},
                            {"request_id": "r\u202e1", "prompt_len": 2, "max_new_tokens": 1}]}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    """name -> a wire log recorded by `inferris-dist launch` (exit status checked)."""
    tmp = tmp_path_factory.mktemp("wirelogs")
    (tmp / "escaped.spec.json").write_text(json.dumps(ESCAPED_IDS))
    runs = {"demo": (0, ["--world-size", "4"]),
            "crash": (0, ["--spec", str(GOLDEN / "demo.spec.json"), "--fault", "1:crash@2",
                          "--on-rank-loss", "restore"]),
            "disagree": (1, ["--spec", str(GOLDEN / "preemption.spec.json"), "--world-size", "2",
                             "--fault", "0:disagree@3"]),
            "idle": (0, ["--spec", str(GOLDEN / "continuous_batching.spec.json")]),
            "escaped": (0, ["--spec", str(tmp / "escaped.spec.json")])}
    out = {}
    for name, (status, args) in runs.items():
        out[name] = tmp / f"{name}.jsonl"
        done = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "launch", *args,
                               "--wire-log", str(out[name])], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == status, done.stdout + done.stderr
    return out


def inspect(path, step=None, style=Style(False)) -> list[str]:
    out = io.StringIO()
    assert run_inspect(str(path), step, out, style) == 0
    return out.getvalue().splitlines()


def records(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def plans(path) -> list[dict]:
    """The first PLAN of each (step, epoch) attempt, in the log's order."""
    seen = {}
    for r in records(path):
        if r.get("type") == "PLAN":
            seen.setdefault((r["step"], r["epoch"]), r)
    return list(seen.values())


def rows(lines) -> list[tuple[int, int, int, str]]:
    """(step, epoch, items, verdict) of each attempt row of a summary."""
    return [(int(m[1]), int(m[2]), int(m[3]), m[5]) for m in map(ROW.match, lines) if m]


# -- 1-2. the summary ------------------------------------------------------------------

def test_the_summary_has_one_row_per_attempt_and_the_log_totals(logs):
    lines = inspect(logs["demo"])
    want = [(p["step"], p["epoch"], len(p["body"]["items"]), "joined") for p in plans(logs["demo"])]
    assert rows(lines) == want and [s for s, *_ in want] == list(range(6))
    msgs = [r for r in records(logs["demo"]) if "dir" in r]
    out = sum(r["bytes"] for r in msgs if r["dir"] == "out")
    got = sum(r["bytes"] for r in msgs if r["dir"] == "in")
    assert lines[-1] == (f"{len(msgs)} messages, {human_bytes(out)} out, {human_bytes(got)} in; "
                         f"6 steps in 6 attempts; 4 ranks")
    assert len(lines) == 1 + 6 + 1       # header, the steps, the totals: nothing else happened


def test_a_crash_restored_shows_both_attempts_the_loss_and_the_restart(logs):
    lines = inspect(logs["crash"])
    got = rows(lines)
    assert [(s, e) for s, e, _, _ in got] == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert got[2][3] == "rank 1 lost (died)" and all(v == "joined" for *_, v in got[:2] + got[3:])
    attempt_rows = [i for i, line in enumerate(lines) if ROW.match(line)]
    between = [line.strip() for line in lines[attempt_rows[2] + 1:attempt_rows[3]]]   # (2, 0) .. (2, 1)
    assert between[0].startswith("! rank lost at step 2, epoch 0: rank 1 died before answering step 2")
    assert "restart: rank 1 into epoch 1 at step 2, shard of 2 pages" in between
    assert lines[-1].endswith("6 steps in 7 attempts; 4 ranks")


def test_a_disagreement_names_the_group_violation(logs):
    lines = inspect(logs["disagree"])
    assert rows(lines)[-1] == (3, 0, 1, "GroupViolation")
    assert lines[-2].strip() == ("! GroupViolation at step 3, epoch 0: rank 1 disagrees with rank 0: "
                                 "item 0 (p0) accepted 1 vs 0")


def test_idle_steps_are_one_line_and_count_as_steps(logs):
    lines = inspect(logs["idle"])
    assert [s for s, *_ in rows(lines)] == [0, 1, 2, 3, 4, 5, 9, 10, 11]
    assert "  6-8  idle: empty plans, answered by the scheduler: no round trip" in lines
    assert lines[-1].endswith("12 steps in 9 attempts; 1 rank")
    assert inspect(logs["idle"], 7) == ["  6-8  idle: empty plans, answered by the scheduler: no round trip"]


# -- 3. one step ------------------------------------------------------------------------

def step_tables(lines: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """The item rows and the rank rows of a one-attempt --step output, split on whitespace."""
    items_at = next(i for i, l in enumerate(lines) if l.split()[:2] == ["item", "request"])
    ranks_at = next(i for i, l in enumerate(lines) if l.split()[:2] == ["rank", "bytes"])
    join_at = next(i for i, l in enumerate(lines) if l.strip().startswith("join:"))
    return ([l.split() for l in lines[items_at + 1:ranks_at]],
            [l.split() for l in lines[ranks_at + 1:join_at]])


@pytest.mark.parametrize("step", range(6))
def test_one_step_lists_exactly_its_plan_items_and_every_rank(logs, step):
    lines = inspect(logs["demo"], step)
    plan = next(p for p in plans(logs["demo"]) if p["step"] == step)
    items, ranks = step_tables(lines)
    assert lines[0] == f"step {step}, epoch 0: plan of {len(plan['body']['items'])} item" + \
        "s" * (len(plan["body"]["items"]) != 1) + f", {human_bytes(plan['bytes'])} to ranks 0-3"
    assert items == [[str(i), it["request_id"], str(it["start_position"]), str(it["num_tokens"]),
                      str(it["draft_len"]), "yes" if it["decode"] else "no", str(it["verdict_index"]),
                      ",".join(map(str, it["placements"]))] for i, it in enumerate(plan["body"]["items"])]
    result = next(r for r in records(logs["demo"])
                  if r.get("type") == "RESULT" and r["step"] == step and r["rank"] == 0)
    outcomes = [[o["request_id"], str(o["start_position"]), str(o["executed_tokens"]), str(o["accepted"]),
                 ",".join(map(str, o["writes"]))] for o in result["body"]]
    size = human_bytes(result["bytes"]).split()
    assert ranks[0] == ["0", *size, *outcomes[0]] and ranks[1:len(outcomes)] == outcomes[1:]
    assert ranks[len(outcomes):] == [[str(r), *size, "same", "as", "rank", "0"] for r in (1, 2, 3)]
    assert lines[-1].strip() == "join: joined"


def test_one_step_of_a_crash_shows_both_epochs_and_what_happened(logs):
    lines = inspect(logs["crash"], 2)
    heads = [i for i, l in enumerate(lines) if l.startswith("step 2, epoch")]
    assert [lines[i].split(":")[0] for i in heads] == ["step 2, epoch 0", "step 2, epoch 1"]
    first, second = lines[heads[0]:heads[1]], lines[heads[1]:]
    text = "\n".join(first)
    assert "results: none in the log" in text
    assert "join: rank 1 lost (died): rank 1 died before answering step 2 (killed by SIGKILL)" in text
    assert "restart: rank 1 into epoch 1 at step 2, shard of 2 pages" in text
    items, ranks = step_tables(second)
    assert [i[1] for i in items] == ["r1", "r2"]
    assert [r[0] for r in ranks if r[0].isdigit()] == ["0", "1", "2", "3"]
    assert second[-1].strip() == "join: joined"


def test_one_step_of_a_disagreement_shows_each_rank_and_the_violation(logs):
    lines = inspect(logs["disagree"], 3)
    _, ranks = step_tables(lines)
    assert ranks == [["0", "10", "B", "p0", "7", "1", "1", "6"], ["1", "10", "B", "p0", "7", "1", "0", "6"]]
    assert lines[-1].strip() == ("join: GroupViolation: rank 1 disagrees with rank 0: "
                                 "item 0 (p0) accepted 1 vs 0")


# -- 4. bad input -------------------------------------------------------------------------

def refused(path, step=None) -> str:
    out = io.StringIO()
    with pytest.raises(WorkloadError) as e:
        run_inspect(str(path), step, out, Style(False))
    assert out.getvalue() == "" and "\n" not in str(e.value)
    return str(e.value)


def test_bad_input_is_one_line_naming_the_file(logs, tmp_path):
    missing = tmp_path / "missing.jsonl"
    assert refused(missing) == f"inspect {missing}: No such file or directory"
    assert refused(tmp_path) == f"inspect {tmp_path}: Is a directory"
    cut = tmp_path / "cut.jsonl"                   # a log cut mid-line, as by a full disk
    lines = logs["demo"].read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:20]) + lines[20][:30])
    assert refused(cut) == f"{cut} line 21: not JSON"
    odd = tmp_path / "odd.jsonl"
    odd.write_text(lines[0] + "[1, 2]\n")
    assert refused(odd) == f"{odd} line 2: neither a wire message nor an event"
    quiet = tmp_path / "quiet.jsonl"
    quiet.write_text('{"t": 1.0, "event": "note", "rank": 0, "epoch": 0, "text": "hi"}\n')
    assert refused(quiet) == f"{quiet}: no messages in the log"
    (tmp_path / "empty.jsonl").write_text("")
    assert refused(tmp_path / "empty.jsonl") == f"{tmp_path / 'empty.jsonl'}: no messages in the log"
    assert refused(logs["demo"], 6) == f"{logs['demo']}: no step 6 in the log (steps 0..5)"
    assert refused(logs["idle"], -1) == f"{logs['idle']}: no step -1 in the log (steps 0..11)"


# -- 5. escaped ------------------------------------------------------------------------------

def test_request_ids_and_notes_from_the_log_are_shown_escaped(logs, tmp_path):
    lines = inspect(logs["escaped"], 0)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\u202e" not in text and len(lines) == len(text.split("\n"))
    items, _ = step_tables(lines)
    assert [i[1] for i in items] == ["a\\x1b[2J\\x0ab", "r\\u202e1"]
    hostile = tmp_path / "hostile.jsonl"           # a note and an unknown event, as a peer could word them
    hostile.write_text(logs["escaped"].read_text() + json.dumps(
        {"t": 1.0, "event": "note", "rank": 1, "epoch": 0, "text": "x\x1b]0;owned\x07\nfake line"}) + "\n"
        + json.dumps({"t": 1.0, "event": "odd\n", "why": ["\x1b[2J"]}) + "\n")
    summary = inspect(hostile)
    assert "! x\\x1b]0;owned\\x07\\x0afake line" in [l.strip() for l in summary]
    assert 'odd\\x0a: why ["\\u001b[2J"]' in [l.strip() for l in summary]
    assert not any("\x1b" in l for l in summary + inspect(hostile, 1))
    assert any("\x1b[32mjoined\x1b[0m" in l for l in inspect(hostile, style=Style(True)))


# -- 6. bounded memory ------------------------------------------------------------------

def test_one_step_of_a_large_log_keeps_only_that_step(tmp_path):
    big = tmp_path / "big.jsonl"
    item = {"request_id": "r", "start_position": 0, "num_tokens": 1, "draft_len": 0, "decode": True,
            "verdict_index": 0, "placements": list(range(64))}
    outcome = {"request_id": "r", "start_position": 0, "executed_tokens": 1, "accepted": 0,
               "writes": list(range(64))}
    with open(big, "w") as f:
        for step in range(1500):
            plan = {"step": step, "items": [item] * 4}
            for d, kind, body in (("out", "PLAN", plan), ("in", "RESULT", [outcome] * 4)):
                for rank in range(2):
                    f.write(json.dumps({"t": 0.0, "dir": d, "rank": rank, "epoch": 0, "step": step,
                                        "type": kind, "bytes": 100, "body": body}) + "\n")
    assert big.stat().st_size > 3_000_000
    tracemalloc.start()
    try:
        lines = inspect(big, 1234)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines[0].startswith("step 1234, epoch 0: plan of 4 items") and lines[-1].strip() == "join: joined"
    assert peak < 200_000, f"peak {peak} bytes for one step of an {big.stat().st_size}-byte log"
    assert inspect(big)[-1] == ("6000 messages, 293.0 kB out, 293.0 kB in; "
                                "1500 steps in 1500 attempts; 2 ranks")
