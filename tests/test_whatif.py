"""`inferris-dist whatif WIRELOG --without RANK`: a run replayed without one rank's slowness.

Real wire logs, recorded once per module by real launches (a world of three whose rank 2 is
slowed three times from step 0 on; a world of one):
1. without the slow rank, the run's time and the p99 TTFT come out lower;
2. every number --json prints is recomputed here from the wire log, by the model of
   docs/cli.md written again, small, and agrees to the microsecond;
3. without a rank that was never last nothing changes: the savings are the sum of the
   steps' savings computed here, each 0 where the rank was not last;
4. bad input (no wire log, a log without arrivals, a rank not of the run, a world of one) is
   one line on stderr and exit status 2, nothing on stdout; Ctrl-C is 130.
"""
from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.external import ENV, GOLDEN, REPO

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

SLOW = 2
US = 1e-3 + 1e-9          # a microsecond, in ms (and a float's rounding)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("whatif")
    spec = str(GOLDEN / "random_004.spec.json")
    runs = {"slow": ["--world-size", "3", "--exec-cost", "2ms+20us/token", "--fault", f"{SLOW}:slow@0+:3"],
            "one": ["--world-size", "1"]}
    out = {}
    for name, args in runs.items():
        out[name] = tmp / f"{name}.jsonl"
        done = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "launch", "--spec", spec, *args,
                               "--wire-log", str(out[name])], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
    return out


def whatif(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferris_dist.cli", "whatif", *map(str, args)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=30)


@functools.cache
def report(log: Path, rank: int) -> dict:
    done = whatif(log, "--without", rank, "--json")
    assert done.returncode == 0 and not done.stderr, done.stderr
    [line] = done.stdout.splitlines()
    return json.loads(line)


# -- the model, written again from docs/cli.md -----------------------------------------------

def replayed(log: Path, rank: int) -> dict:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    start = records[0]["t"]
    joined, steps = {}, []    # (step, end, saving, admitted, sampled, came last, another came later)
    for r in records:
        if r.get("event") == "attempt" and r["verdict"] == "joined" and "arrivals" in r:
            joined[r["step"]] = r["arrivals"]
        elif r.get("event") == "step":
            arrivals = {a["rank"]: a for a in joined.pop(r["step"], [])}
            d, last, behind_others = 0.0, False, True
            if rank in arrivals and len(arrivals) > 1:
                behind_others = arrivals[rank]["after"] < max(a["after"] for k, a in arrivals.items()
                                                              if k != rank)
                took = {k: a.get("exec", a["after"]) for k, a in arrivals.items()}
                after = {k: a["after"] for k, a in arrivals.items()}
                mid = statistics.median(v for k, v in took.items() if k != rank)
                changed = {**after, rank: after[rank] - max(0.0, took[rank] - mid)}
                d = max(after.values()) - max(changed.values())
                last = max(arrivals.values(), key=lambda a: a["behind"])["rank"] == rank
            steps.append((r["step"], r["t"], d, r["trace"]["admitted"], list(r["trace"]["sampled"]), last,
                          behind_others))
    ends, total = [], 0.0
    for _, t, d, *_ in steps:
        total += d
        ends.append((t, t - total))

    def pct(values, q):
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else None

    def times(i):
        admitted_start, last_end, ttft, itl = {}, {}, {}, []
        for k, (_, _, _, admitted, sampled, *_) in enumerate(steps):
            before = ends[k - 1][i] if k else start
            for rid in admitted:
                admitted_start.setdefault(rid, before)
            for rid in sampled:
                if rid in last_end:
                    itl.append(ends[k][i] - last_end[rid])
                else:
                    ttft[rid] = ends[k][i] - admitted_start[rid]
                last_end[rid] = ends[k][i]
        return ({"run_ms": (ends[-1][i] - start) * 1000,
                 "ttft_p50_ms": pct(list(ttft.values()), 0.5) * 1000,
                 "ttft_p99_ms": pct(list(ttft.values()), 0.99) * 1000,
                 "itl_p50_ms": pct(itl, 0.5) * 1000, "itl_p99_ms": pct(itl, 0.99) * 1000},
                {rid: v * 1000 for rid, v in ttft.items()})
    (with_, ttft_with), (without, ttft_without) = times(0), times(1)
    return {"savings": [s[2] * 1000 for s in steps], "steps_last": sum(s[5] for s in steps),
            "steps": len(steps), "with": with_, "without_rank": without,
            "ttft": ttft_with, "ttft_without": ttft_without,
            "not_last": [s[2] for s in steps if s[6]]}


def close(a: float, b: float) -> bool:
    return abs(a - b) <= US


# -- 1. the slow rank taken away ----------------------------------------------------------------

def test_without_the_slow_rank_the_run_and_the_p99_ttft_are_shorter(logs):
    got = report(logs["slow"], SLOW)
    assert got["without"] == SLOW and got["steps_last"] > got["steps"] / 2
    assert got["without_rank"]["run_ms"] < got["with"]["run_ms"]
    assert got["without_rank"]["ttft_p99_ms"] < got["with"]["ttft_p99_ms"]
    assert got["saved_ms"] > 0
    text = whatif(logs["slow"], "--without", SLOW)
    assert text.returncode == 0 and not text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"rank {SLOW} came last at {got['steps_last']} of {got['steps']} steps")
    run_row = next(line for line in lines if line.startswith("run time"))
    assert run_row.split()[2:4] == [f"{got['with']['run_ms']:.2f}", f"{got['without_rank']['run_ms']:.2f}"]


# -- 2. the numbers, recomputed from the log --------------------------------------------------

def test_every_number_agrees_with_the_model_recomputed_from_the_log(logs):
    got, want = report(logs["slow"], SLOW), replayed(logs["slow"], SLOW)
    assert (got["steps"], got["steps_last"]) == (want["steps"], want["steps_last"])
    assert close(got["saved_ms"], sum(want["savings"]))
    for side in ("with", "without_rank"):
        assert set(got[side]) == set(want[side])
        for key, value in want[side].items():
            assert close(got[side][key], value), (side, key, got[side][key], value)
    assert {r["request_id"] for r in got["requests"]} == set(want["ttft"])
    for r in got["requests"]:
        assert r["admitted_step"] is not None and r["tokens"] > 0
        assert close(r["ttft_ms"], want["ttft"][r["request_id"]]), r
        assert close(r["ttft_without_ms"], want["ttft_without"][r["request_id"]]), r
    drops = [r["ttft_ms"] - r["ttft_without_ms"] for r in got["requests"]]
    assert all(a >= b - 2 * US for a, b in zip(drops, drops[1:]))      # the largest drop first


# -- 3. a rank that was never last ------------------------------------------------------------

def test_without_a_rank_never_last_the_savings_are_the_steps_savings(logs):
    models = {rank: replayed(logs["slow"], rank) for rank in range(3) if rank != SLOW}
    rank = min(models, key=lambda r: models[r]["steps_last"])
    want = models[rank]
    got = report(logs["slow"], rank)
    assert got["steps_last"] == want["steps_last"]
    assert close(got["saved_ms"], sum(want["savings"]))
    assert all(d == 0 for d in want["not_last"])      # no saving where another result came later
    if want["steps_last"] == 0:
        assert got["saved_ms"] == 0 and got["with"] == got["without_rank"]
        assert all(r["ttft_ms"] == r["ttft_without_ms"] for r in got["requests"])
    assert got["saved_ms"] < 0.1 * report(logs["slow"], SLOW)["saved_ms"]


# -- 4. bad input -----------------------------------------------------------------------------

def refused(status: int, out: str, err: str, *words: str) -> None:
    assert status == 2, out + err
    assert out == ""
    [line] = err.splitlines()
    assert "Traceback" not in line
    for w in words:
        assert w in line, line


def test_bad_input_is_one_line_and_exit_status_2(logs, tmp_path, capsys):
    from inferris_dist.cli.main import main
    text = tmp_path / "notes.txt"
    text.write_text("not a log\n")
    record = tmp_path / "record.jsonl"
    record.write_text('{"a": 1}\n')
    headless = tmp_path / "headless.jsonl"
    headless.write_text("".join(logs["slow"].read_text().splitlines(keepends=True)[1:]))
    older = tmp_path / "older.jsonl"
    older.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "arrivals"}) + "\n"
                             for line in logs["slow"].read_text().splitlines()))
    done = whatif(text, "--without", 0)              # the command itself, once
    refused(done.returncode, done.stdout, done.stderr, "not a wire log")
    for args, words in (((record, "--without", 0), ("not a wire log",)),
                        ((headless, "--without", 0), ("not a wire log",)),
                        ((tmp_path / "absent.jsonl", "--without", 0), ("absent.jsonl",)),
                        ((older, "--without", SLOW), ("no arrivals",)),
                        ((logs["slow"], "--without", 3), ("--without 3", "not a rank of the run")),
                        ((logs["slow"], "--without", -1), ("--without -1", "not a rank")),
                        ((logs["one"], "--without", 0), ("a world of one rank",)),
                        ((logs["slow"],), ("--without",))):
        status = main(["whatif", *map(str, args)])
        refused(status, *capsys.readouterr(), *words)


def test_ctrl_c_is_130(logs, monkeypatch, capsys):
    from inferris_dist.cli import cmd_whatif
    from inferris_dist.cli.main import main

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cmd_whatif, "read", interrupted)
    assert main(["whatif", str(logs["slow"]), "--without", "0"]) == 130
    assert capsys.readouterr().err == "inferris-dist: interrupted\n"
