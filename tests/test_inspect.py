"""`inferris-dist inspect`: a wire log read back, checked against the log itself.

Real wire logs, recorded once per module by real launches (no fakes):
1. the summary has one row per (step, epoch) attempt, in the order of the log, with the
   plan's item count, and the totals of the log's messages;
2. a crash survived by `restore` shows two attempts at the failed step, the loss, the
   restart; a disagreement shows the GroupViolation; idle steps show as one line;
3. `--step K` lists exactly the items of step K's PLAN and every rank's RESULT;
4. bad input is one line naming the file, with nothing printed before it;
5. request ids and notes from the log are shown escaped;
6. --step on a large log keeps only that step: its peak memory does not grow with the log;
7. --json: every line is one JSON object of the documented shape, saying what the text says;
   an error is still one line on stderr, exit status 2;
8. hostile logs (a rank of 150 million, /dev/zero, a fifo, a 1 GB sparse file, a line over
   16 MB, a field of the wrong type): one line and exit status 2, within seconds, in a
   300 MB address space; a last line cut short is left out with one note, the rest shown;
9. the lines a newer writer adds: the RESULTs of a failed attempt shown under it (`-` where
   no rank answered), events inspect does not know skipped.
"""
from __future__ import annotations

import io
import json
import os
import re
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from inferris_dist.cli.cmd_inspect import JSON_HELP, run_inspect
from inferris_dist.cli.render import Style, human_bytes
from inferris_dist.engine import WorkloadError

from tests.helpers.external import ENV, GOLDEN, REPO

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

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
    assert lines[-2].strip() == ("! GroupViolation at step 3, epoch 0: the ranks disagree on item 0 (p0) "
                                 "accepted: rank 0 says 1; rank 1 says 0")


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
    answered = sorted(r["rank"] for r in records(logs["crash"])
                      if r.get("type") == "RESULT" and (r["step"], r["epoch"]) == (2, 0))
    if not answered:                               # a writer that logs joined attempts only
        assert "results: none in the log" in text
    else:                                          # every RESULT that crossed: rank 1 died
        assert 1 not in answered
        _, ranks = step_tables(first)
        assert [r[0] for r in ranks if r[0].isdigit()] == ["0", "1", "2", "3"]
        for r in ranks:
            if r[0].isdigit() and int(r[0]) not in answered:
                assert r[1:] == ["-", "no", "result", "in", "the", "log"]
    assert "join: rank 1 lost (died): rank 1 died before answering step 2 (killed by SIGKILL)" in text
    assert "restart: rank 1 into epoch 1 at step 2, shard of 2 pages" in text
    items, ranks = step_tables(second)
    assert [i[1] for i in items] == ["r1", "r2"]
    assert [r[0] for r in ranks if r[0].isdigit()] == ["0", "1", "2", "3"]
    assert second[-1].strip() == "join: joined"


def test_one_step_of_a_disagreement_shows_each_rank_and_the_violation(logs):
    lines = inspect(logs["disagree"], 3)
    _, ranks = step_tables(lines)
    # one outcome in a RESULT of protocol 3: [ids], 16 bytes of columns, 4 of writes: 29 bytes
    assert ranks == [["0", "29", "B", "p0", "7", "1", "1", "6"], ["1", "29", "B", "p0", "7", "1", "0", "6"]]
    assert lines[-1].strip() == ("join: GroupViolation: the ranks disagree on item 0 (p0) accepted: "
                                 "rank 0 says 1; rank 1 says 0")


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
    cut = tmp_path / "cut.jsonl"                   # a line cut short, not the last
    lines = logs["demo"].read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:20]) + lines[20][:30] + "\n" + "".join(lines[21:]))
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
    assert not any("odd" in l for l in summary)   # an event inspect does not know: skipped
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
        for step in range(750):
            plan = {"step": step, "items": [item] * 4}
            for d, kind, body in (("out", "PLAN", plan), ("in", "RESULT", [outcome] * 4)):
                for rank in range(2):
                    f.write(json.dumps({"t": 0.0, "dir": d, "rank": rank, "epoch": 0, "step": step,
                                        "type": kind, "bytes": 100, "body": body}) + "\n")
    assert big.stat().st_size > 1_500_000                 # over seven times what one step may keep
    tracemalloc.start()
    try:
        lines = inspect(big, 567)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines[0].startswith("step 567, epoch 0: plan of 4 items") and lines[-1].strip() == "join: joined"
    assert peak < 200_000, f"peak {peak} bytes for one step of an {big.stat().st_size}-byte log"
    assert inspect(big)[-1] == ("3000 messages, 146.5 kB out, 146.5 kB in; "
                                "750 steps in 750 attempts; 2 ranks")


# -- hand-made logs, and the CLI in a small address space -----------------------------------

ITEM = {"request_id": "r2", "start_position": 6, "num_tokens": 4, "draft_len": 0, "decode": False,
        "verdict_index": 0, "placements": [6, 7]}
OUTCOME = {"request_id": "r2", "start_position": 6, "executed_tokens": 4, "accepted": 0, "writes": [6, 7]}
NEWER_EVENTS = [  # what a newer writer adds: none of it is for inspect to show
    {"t": 1.0, "event": "run", "name": "", "world_size": 4, "config": {"page_size": 4}},
    {"t": 1.0, "event": "member", "rank": 0, "epoch": 0, "pid": 4812, "host": "", "proof": "x"},
    {"t": 1.0, "event": "phase", "phase": "execute", "step": 3, "dur": 0.001},
    {"t": 1.0, "event": "step", "step": 3, "epoch": 0, "trace": {"step": 3, "admitted": ["r2"]},
     "counters": {"pages": [1, 2]}},
    {"t": 1.0, "event": "audit", "step": 3, "epoch": 1},
    {"t": 1.0, "event": "rejoin-wait", "rank": 2, "seconds": 1.5},
    {"t": 1.0, "event": "end", "status": 0, "steps": 5},
    {"t": 1.0, "event": "attempt", "step": 3, "epoch": 0, "verdict": ["odd"], "plan_bytes": "x"},
]


def message(direction, rank, epoch, step, kind, size, body, **extra) -> dict:
    return {"t": 1.0, "dir": direction, "rank": rank, "epoch": epoch, "step": step, "type": kind,
            "bytes": size, "body": body, **extra}


def attempt(step, epoch, answering, world=4) -> list[dict]:
    """Step `step`'s plan to every rank, and the RESULTs of the ranks `answering`."""
    plan = {"step": step, "items": [ITEM]}
    return ([message("out", r, epoch, step, "PLAN", 15, plan) for r in range(world)]
            + [message("in", r, epoch, step, "RESULT", 11, [OUTCOME], sent=1.0, rtt=0.001,
                       inside=[1.0, 1.1, 1.2, 1.3]) for r in answering])


def crashed(answered_before=(0, 1, 3)) -> list[dict]:
    """Four ranks; rank 2 dies at step 3 after `answered_before` answered; restored into epoch 1."""
    recs = [r for s in range(3) for r in attempt(s, 0, range(4))]
    recs += attempt(3, 0, answered_before)
    recs += [{"t": 1.0, "event": "rank-lost", "rank": 2, "ranks": [2], "step": 3, "epoch": 0,
              "reason": "died", "message": "rank 2 died before answering step 3 (killed by SIGKILL)"},
             {"t": 1.0, "event": "restart", "ranks": [2], "epoch": 1, "step": 3, "shard_pages": 4}]
    recs += attempt(3, 1, range(4)) + attempt(4, 1, range(4))
    return json.loads(json.dumps(recs))              # no part shared between records


def written(path, recs, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return path


def _small_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (300 << 20, 300 << 20))


def cli_inspect(*args, timeout: float = 20) -> tuple[subprocess.CompletedProcess, float]:
    """`inferris-dist inspect ARGS` in a 300 MB address space: its outcome, and how long it took."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "inspect", *map(str, args)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, preexec_fn=_small_address_space)
    return done, time.monotonic() - start


def cli_refused(*args) -> str:
    """The one line of a refusal: exit status 2, nothing on stdout, no traceback."""
    done, took = cli_inspect(*args)
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr[-500:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert took < 10, f"{took:.1f} s"
    return done.stderr.rstrip("\n")


def json_lines(*args) -> list[dict]:
    done, _ = cli_inspect(*args, "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    objs = [json.loads(line) for line in lines]
    assert all(isinstance(o, dict) and next(iter(o)) == "record" for o in objs)
    return objs


# -- 7. --json ----------------------------------------------------------------------------------

ATTEMPT_KEYS = ["record", "step", "epoch", "items", "plan_bytes", "ranks", "result_bytes", "verdict",
                "message"]
TOTALS_KEYS = ["record", "messages", "bytes_out", "bytes_in", "steps", "attempts", "ranks"]


@pytest.mark.parametrize("name", ["demo", "crash", "disagree", "idle"])
def test_json_summary_says_what_the_text_says(logs, name):
    objs = json_lines(logs[name])
    text = inspect(logs[name])
    attempts = [o for o in objs if o["record"] == "attempt"]
    assert all(list(o) == ATTEMPT_KEYS for o in attempts)
    assert [(o["step"], o["epoch"], o["items"], o["verdict"])
            for o in attempts] == rows(text)
    got = {}                                       # (step, epoch, rank) -> bytes, from the log itself
    for r in records(logs[name]):
        if r.get("type") == "RESULT":
            got[r["step"], r["epoch"], r["rank"]] = r["bytes"]
    for o in attempts:
        assert o["result_bytes"] == [got.get((o["step"], o["epoch"], r)) for r in o["ranks"]]
        assert (o["message"] is None) == (o["verdict"] == "joined")
    assert [o["record"] for o in objs].count("totals") == 1 and list(objs[-1]) == TOTALS_KEYS
    t = objs[-1]
    assert text[-1] == (f"{t['messages']} messages, {human_bytes(t['bytes_out'])} out, "
                        f"{human_bytes(t['bytes_in'])} in; {t['steps']} steps in {t['attempts']} "
                        f"attempt{'s' * (t['attempts'] != 1)}; {t['ranks']} rank{'s' * (t['ranks'] != 1)}")
    events = [o for o in objs if o["record"] == "event"]   # each event line of the text, in its place
    assert len(events) == len(text) - 2 - len(attempts)
    assert {o["event"] for o in events} <= {"rank-lost", "step-failed", "audit-failed", "restart", "note",
                                            "idle", "turned-away"}


def test_json_summary_of_a_crash_has_the_loss_and_the_restart_where_they_happened(logs):
    objs = json_lines(logs["crash"])
    kinds = [(o["record"], o.get("event"), o.get("step"), o.get("epoch")) for o in objs]
    at = kinds.index(("attempt", None, 2, 0))
    assert kinds[at + 1] == ("event", "rank-lost", 2, 0) and ("event", "restart", 2, 1) in kinds[at:]
    assert objs[at]["verdict"] == "rank 1 lost (died)"
    assert objs[at]["message"].startswith("rank 1 died before answering step 2")
    lost = objs[at + 1]
    assert lost == {"record": "event", "event": "rank-lost", "rank": 1, "ranks": [1], "step": 2, "epoch": 0,
                    "reason": "died", "message": objs[at]["message"]}


@pytest.mark.parametrize("step", [0, 3])
def test_json_one_step_lists_its_items_every_rank_and_the_join(logs, step):
    objs = json_lines(logs["demo"], "--step", step)
    plan = next(p for p in plans(logs["demo"]) if p["step"] == step)
    at = {"step": step, "epoch": 0}
    assert objs[0] == {"record": "plan", **at, "bytes": plan["bytes"], "ranks": [0, 1, 2, 3],
                       "items": len(plan["body"]["items"])}
    items = [o for o in objs if o["record"] == "item"]
    assert items == [{"record": "item", **at, "index": i, **it} for i, it in enumerate(plan["body"]["items"])]
    results = [o for o in objs if o["record"] == "result"]
    logged = {r["rank"]: r for r in records(logs["demo"])
              if r.get("type") == "RESULT" and r["step"] == step}
    assert [o["rank"] for o in results] == [0, 1, 2, 3]
    for o in results:
        assert (o["bytes"], o["outcomes"], o["undecodable"]) == (logged[o["rank"]]["bytes"],
                                                                 logged[o["rank"]]["body"], None)
        assert o["inside"] == logged[o["rank"]].get("inside")
    assert objs[-1] == {"record": "join", **at, "verdict": "joined", "message": None}
    assert [o["record"] for o in objs] == ["plan"] + ["item"] * len(items) + ["result"] * 4 + ["join"]


def test_json_one_step_of_an_idle_stretch_is_its_event(logs):
    assert json_lines(logs["idle"], "--step", "7") == [
        {"record": "event", "event": "idle", "first": 6, "last": 8,
         "text": "empty plans, answered by the scheduler: no round trip"}]


def test_json_keeps_the_words_of_the_log_that_the_text_escapes(tmp_path):
    recs = crashed()
    recs[LOST].update(reason="di\ned", message="rank 2 \x1b[2J died")
    log = written(tmp_path / "words.jsonl", recs)
    done, _ = cli_inspect(log, "--json")
    assert done.returncode == 0 and "\x1b" not in done.stdout
    failed = [o for o in map(json.loads, done.stdout.splitlines()) if o["record"] == "attempt"][3]
    assert (failed["verdict"], failed["message"]) == ("rank 2 lost (di\ned)", "rank 2 \x1b[2J died")
    assert rows(inspect(log))[3][3] == "rank 2 lost (di\\x0aed)"
    assert not any("\x1b" in line for line in inspect(log) + inspect(log, 3))


def test_json_errors_are_one_line_on_stderr(logs, tmp_path):
    assert cli_refused(tmp_path / "missing.jsonl", "--json") == \
        f"inferris-dist: inspect {tmp_path / 'missing.jsonl'}: No such file or directory"
    assert cli_refused(logs["demo"], "--json", "--step", "9") == \
        f"inferris-dist: {logs['demo']}: no step 9 in the log (steps 0..5)"
    bad = written(tmp_path / "bad.jsonl", attempt(0, 0, range(4)), tail="{oops\n")
    assert cli_refused(bad, "--json").endswith(f"{bad} line 9: not JSON")


def test_the_json_shapes_are_in_the_help():
    done = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "inspect", "--help"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "--json" in done.stdout
    for shape in ('{"record": "attempt"', '{"record": "event"', '{"record": "totals"', '{"record": "plan"',
                  '{"record": "item"', '{"record": "result"', '{"record": "join"', '{"record": "truncated"'):
        assert shape in done.stdout and shape in JSON_HELP, shape


# -- 8. hostile logs ------------------------------------------------------------------------

def test_a_restart_naming_rank_150_million_is_refused_without_allocating_by_it(tmp_path):
    recs = crashed()
    at = next(i for i, r in enumerate(recs) if r.get("event") == "restart")
    recs[at] = {"t": 1.0, "event": "restart", "ranks": [0, 1, 150_000_000], "epoch": 1, "step": 3,
                "shard_pages": 4}
    log = written(tmp_path / "rank.jsonl", recs)
    assert len(json.dumps(recs[at])) < 110
    assert cli_refused(log) == (f"inferris-dist: {log} line {at + 1}: restart event: ranks must be a "
                                f"list of ranks, 0..4095")
    assert cli_refused(log, "--step", "3", "--json").endswith(f"line {at + 1}: restart event: ranks "
                                                              f"must be a list of ranks, 0..4095")


def test_a_device_is_refused_before_it_is_read():
    assert cli_refused("/dev/zero") == ("inferris-dist: inspect /dev/zero: not a regular file "
                                        "(a character device)")


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "wire.fifo"
    os.mkfifo(fifo)                 # nobody writes to it: opening it for reading would block for ever
    assert cli_refused(fifo) == f"inferris-dist: inspect {fifo}: not a regular file (a fifo)"


@pytest.mark.parametrize("head,said", [
    ("", "line 1: not JSON"),                                       # 1 GB of zeros
    ("log", "line 23: not JSON"),                                   # a log of 22 lines, then zeros
    ('{"t": 1.0, "dir": "in", "body": "', "line 1: longer than 16 MB")])   # one endless line
def test_a_1gb_sparse_file_fails_at_its_first_bad_line_in_bounded_memory(tmp_path, head, said):
    sparse = tmp_path / "sparse.jsonl"
    with open(sparse, "wb") as f:
        if head == "log":
            recs = attempt(0, 0, range(4)) + attempt(1, 0, range(4)) + attempt(2, 0, range(2))
            f.write("".join(json.dumps(r) + "\n" for r in recs).encode())
        else:
            f.write(head.encode())
        f.truncate(1 << 30)
    assert cli_refused(sparse) == f"inferris-dist: {sparse} {said}"


def test_a_line_over_16_mb_is_refused_and_one_just_under_is_read(tmp_path):
    pad = "x" * (16 << 20)
    long = written(tmp_path / "long.jsonl", attempt(0, 0, range(4)) + [
        {"t": 1.0, "event": "note", "rank": 0, "epoch": 0, "text": pad}])
    assert cli_refused(long) == f"inferris-dist: {long} line 9: longer than 16 MB"
    under = written(tmp_path / "under.jsonl", attempt(0, 0, range(4)) + [
        {"t": 1.0, "event": "end", "text": pad[:(16 << 20) - 100]}])    # an unknown event: skipped
    done, took = cli_inspect(under)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("8 messages") and took < 10


def _set(path: tuple, value):
    """A function that sets recs[path...] = value in the record list it is given."""
    def apply(recs):
        obj = recs
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return apply


# in crashed(): the first PLAN of step 3 (epoch 0), its first RESULT, the loss
P3 = next(i for i, r in enumerate(crashed()) if r.get("type") == "PLAN" and r["step"] == 3)
R3 = next(i for i, r in enumerate(crashed()) if r.get("type") == "RESULT" and r["step"] == 3)
LOST = next(i for i, r in enumerate(crashed()) if r.get("event") == "rank-lost")


@pytest.mark.parametrize("where,value,said", [
    ((P3, "body", "items", 0, "decode"), [1, 2], "PLAN item 0: decode must be true or false"),
    ((P3, "body", "items", 0, "placements"), {"a": 1},
     "PLAN item 0: placements must be a list of page numbers"),
    ((P3, "body", "items", 0, "request_id"), 7, "PLAN item 0: request_id must be a string"),
    ((P3, "body", "items", 0), [1], "PLAN item 0 must be an object"),
    ((P3, "body", "items"), "all", "PLAN message: body must be an object with a list of items"),
    ((P3, "rank"), 150_000_000, "PLAN message: rank must be a rank, 0..4095"),
    ((P3, "rank"), -1, "PLAN message: rank must be a rank, 0..4095"),
    ((P3, "bytes"), -5, "PLAN message: bytes must be a whole number >= 0"),
    ((P3, "bytes"), 1.5, "PLAN message: bytes must be a whole number >= 0"),
    ((P3, "step"), "3", "PLAN message: step must be a whole number"),
    ((P3, "step"), True, "PLAN message: step must be a whole number"),
    ((P3, "dir"), ["in"], 'PLAN message: dir must be "in" or "out"'),
    ((R3, "body"), "ok", 'RESULT message: body must be a list of outcomes or {"undecodable": TEXT}'),
    ((R3, "body", 0, "writes"), "6,7", "RESULT outcome 0: writes must be a list of page numbers"),
    ((R3, "body", 0, "accepted"), None, "RESULT outcome 0: accepted must be a whole number"),
    ((R3, "inside"), [1.0, 2.0, 3.0], "RESULT message: inside must be a list of 4 numbers"),
    ((LOST, "ranks"), "2", "rank-lost event: ranks must be a list of ranks, 0..4095"),
    ((LOST, "message"), ["x"], "rank-lost event: message must be a string"),
    ((LOST + 1, "shard_pages"), {}, "restart event: shard_pages must be a whole number >= 0"),
])
def test_a_malformed_record_is_bad_input_naming_its_line(tmp_path, where, value, said):
    recs = crashed()
    _set(where, value)(recs)
    log = written(tmp_path / "bad.jsonl", recs)
    line = where[0] + 1
    for args in ((), ("--step", "3"), ("--step", "0", "--json")):
        assert cli_refused(log, *args) == f"inferris-dist: {log} line {line}: {said}", args


def test_a_missing_field_and_an_odd_record_name_their_line(tmp_path):
    recs = crashed()
    del recs[LOST]["reason"]
    log = written(tmp_path / "bad.jsonl", recs)
    assert refused(log) == f"{log} line {LOST + 1}: rank-lost event: no reason"
    recs = crashed()
    recs[4] = {"t": 1.0, "event": 5}
    log = written(tmp_path / "odd.jsonl", recs)
    assert refused(log) == f"{log} line 5: neither a wire message nor an event"


def test_a_last_line_cut_short_is_left_out_with_one_note(logs, tmp_path):
    lines = logs["demo"].read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"                   # as a full disk leaves it: the last line half written
    cut.write_text("".join(lines[:-1]) + lines[-1][:30])
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(lines[:-1]))
    note = f"! line {len(lines)}, the last, is cut short (as by a full disk): left out"
    got = inspect(cut)
    assert [l.strip() for l in got].count(note) == 1
    assert [l for l in got if l.strip() != note] == inspect(whole)
    assert inspect(cut, 2)[-1].strip() == note and inspect(cut, 2)[:-1] == inspect(whole, 2)
    objs = json_lines(cut)
    assert objs[-2] == {"record": "truncated", "line": len(lines)} and objs[-1]["record"] == "totals"
    done, _ = cli_inspect(cut)
    assert done.returncode == 0 and done.stderr == ""


# -- 9. what a newer writer adds -------------------------------------------------------------

def test_the_results_of_a_failed_attempt_are_shown_under_it(tmp_path):
    log = written(tmp_path / "crash.jsonl", crashed())
    lines = inspect(log, 3)
    heads = [i for i, l in enumerate(lines) if l.startswith("step 3, epoch")]
    first = lines[heads[0]:heads[1]]
    assert first[0] == "step 3, epoch 0: plan of 1 item, 15 B to ranks 0-3"
    _, ranks = step_tables(first)
    same = ["11", "B", "same", "as", "rank", "0"]
    assert ranks == [["0", "11", "B", "r2", "6", "4", "0", "6,7"], ["1", *same],
                     ["2", "-", "no", "result", "in", "the", "log"], ["3", *same]]
    assert first[-2].strip() == ("join: rank 2 lost (died): rank 2 died before answering step 3 "
                                 "(killed by SIGKILL)")
    assert first[-1].strip() == "restart: rank 2 into epoch 1 at step 3, shard of 4 pages"
    assert rows(inspect(log))[3] == (3, 0, 1, "rank 2 lost (died)")
    assert "  15 B x4  11 B 11 B - 11 B  rank 2 lost (died)" in inspect(log)[4]
    objs = json_lines(log, "--step", "3")
    got = [(o["epoch"], o["rank"], o["bytes"], o["outcomes"] is not None)
           for o in objs if o["record"] == "result"]
    assert got[:4] == [(0, 0, 11, True), (0, 1, 11, True), (0, 2, None, False), (0, 3, 11, True)]
    assert [o["result_bytes"] for o in json_lines(log) if o["record"] == "attempt"][3] == [11, 11, None, 11]


def test_where_no_rank_answered_the_result_is_a_dash(tmp_path):
    log = written(tmp_path / "none.jsonl", crashed(answered_before=()))
    summary = inspect(log)
    assert re.search(r"^ +3 +0 +1 +15 B x4  -  +rank 2 lost \(died\)$", summary[4]), summary[4]
    assert not re.search(r"(?<![\d.])0 B", "\n".join(summary))
    assert "results: none in the log" in [l.strip() for l in inspect(log, 3)]
    assert [o["result_bytes"] for o in json_lines(log) if o["record"] == "attempt"][3] == [None] * 4


def test_an_undecodable_result_is_shown_as_such(tmp_path):
    recs = crashed()
    recs[R3]["body"] = {"undecodable": "truncated frame \x1b[2J"}
    log = written(tmp_path / "undecodable.jsonl", recs)
    lines = inspect(log, 3)
    _, ranks = step_tables(lines[:lines.index(next(l for l in lines if l.startswith("step 3, epoch 1")))])
    assert ranks[0] == ["0", "11", "B", "undecodable:", "truncated", "frame", "\\x1b[2J"]
    assert ranks[1][:2] == ["1", "11"] and ranks[1][3:5] == ["r2", "6"]      # the first with outcomes
    result = next(o for o in json_lines(log, "--step", "3") if o["record"] == "result")
    assert result["undecodable"] == "truncated frame \x1b[2J" and result["outcomes"] is None


def test_events_inspect_does_not_know_are_skipped(tmp_path):
    plain = written(tmp_path / "plain.jsonl", crashed())
    recs = crashed()
    for i, ev in enumerate(NEWER_EVENTS):
        recs.insert(3 + 7 * i, ev)
    newer = written(tmp_path / "newer.jsonl", recs)
    assert inspect(newer) == inspect(plain)
    for step in (0, 3, 4):
        assert inspect(newer, step) == inspect(plain, step)
    assert json_lines(newer) == json_lines(plain)
