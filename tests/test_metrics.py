"""`--metrics FILE` and the summary lines: the numbers a serving engineer reads first.

1. the per-step counters, checked step by step against numbers computed here from the
   golden trace lines and from a scan of the pool's owners;
2. the per-request and run-level numbers, against the trace lines;
3. `run --metrics` and `launch --metrics --world-size 2` agree on every deterministic
   number (and `--json` is unchanged by --metrics, byte for byte);
4. the summary lines, and their silence when there is nothing to say;
5. errors: a path that cannot be written (exit 2), a full disk (/dev/full), a failed run;
6. an idle stretch of 200,000 steps keeps the file small.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from inferris_dist.engine import CACHE, Engine, EngineError, load_workload
from inferris_dist.engine.rungs import NAMES as RUNG_NAMES
from inferris_dist.observe.metrics import COUNTERS, Metrics, step_counters

from tests.helpers.external import GOLDEN, cli, golden_lines

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

CHECKED = ["demo", "preemption", "prefix_reuse", "cache_eviction", "speculative", "eos_immediate",
           "recompute_window", "random_035", "random_053", "random_054"]


def prompts_of(name: str) -> dict[str, int]:
    return {r.request_id: len(r.tokens) for r in load_workload(GOLDEN / f"{name}.spec.json").requests}


def pool_scan(engine) -> tuple[int, int, int]:
    """(used, cached, free) by looking at every page's owner: the slow, obvious way."""
    pool = engine.pool
    used = cached = free = 0
    for page, owner in enumerate(pool.owner):
        if owner is None:
            free += 1
        elif owner is CACHE and pool.refs[page] == 0:
            cached += 1
        else:
            used += 1
    return used, cached, free


def recorded(spec, rung: str = "full", keep_steps: bool = True):
    """Run in process, feeding Metrics; (engine, metrics, traces, counters after each step)."""
    engine = Engine(spec, rung=rung)
    metrics = Metrics(engine, "test", keep_steps=keep_steps)
    traces, after = [], []
    try:
        for trace in engine.run():
            metrics.step(trace)
            traces.append(trace)
            after.append((step_counters(engine, trace), pool_scan(engine)))
    except EngineError:
        pass
    return engine, metrics, traces, after


def deterministic(doc: dict) -> dict:
    """The document without what was measured (wall time per step, the ranks, the arrivals)."""
    doc = dict(doc)
    doc.pop("ranks")
    doc.pop("arrivals")
    doc["steps"] = {k: v for k, v in doc["steps"].items() if k != "wall_s"}
    return doc


def expand(columns: dict) -> list[dict]:
    """Rows of the step columns, one per step (a folded idle row repeated span times)."""
    keys = [k for k in columns if k not in ("span", "wall_s")]
    out = []
    for i, span in enumerate(columns["span"]):
        for j in range(span):
            row = {k: columns[k][i] for k in keys}
            row["step"] += j
            out.append(row)
    return out


# -- 1. the counters, step by step -----------------------------------------------------------

@pytest.mark.parametrize("name", CHECKED)
def test_counters_match_the_trace_lines_and_the_pool(name):
    engine, metrics, traces, after = recorded(GOLDEN / f"{name}.spec.json")
    lines = golden_lines(name)[:-1]
    assert [t.to_json() for t in traces] == lines        # the engine is the golden one
    in_flight = set()
    rows = expand(metrics.document()["steps"])
    assert [r["step"] for r in rows] == [line["step"] for line in lines]
    for line, row, (counters, (used, cached, free)) in zip(lines, rows, after):
        in_flight |= set(line["admitted"])
        in_flight -= set(line["finished"])
        ran = set(line["executed"]) - set(line["finished"])
        want = {
            "requests_running": len(ran),
            "requests_waiting": len(in_flight - ran),
            "requests_preempted": len(line["preempted"]),
            "pages_used": used, "pages_cached": cached, "pages_free": free,
            "prefix_hit_tokens": sum(line["reused"].values()),
            "drafted_tokens": sum(line["drafted"].values()),
            "accepted_tokens": sum(line["accepted"].values()),
            "batch_tokens": sum(line["executed"].values()),
            "batch_requests": len(line["executed"]),
        }
        assert counters == want, line["step"]
        assert {k: row[k] for k in COUNTERS} == want, line["step"]
        assert used + cached + free == engine.config.num_pages


def test_the_counters_are_a_flat_dict_of_ints_on_an_idle_step_too():
    engine = Engine({"requests": [{"request_id": "late", "prompt_len": 3, "max_new_tokens": 1,
                                   "arrival_step": 2}]})
    trace = engine.idle_step() if engine.is_idle() else None
    assert trace is not None and trace.is_empty
    counters = step_counters(engine, trace)
    assert list(counters) == list(COUNTERS)
    assert all(type(v) is int for v in counters.values())
    assert counters["pages_free"] == engine.config.num_pages
    assert sum(counters.values()) == counters["pages_free"]


@pytest.mark.parametrize("rung", RUNG_NAMES)
def test_every_rung_reports_pages_the_same_way(rung):
    engine, metrics, traces, after = recorded(GOLDEN / "preemption.spec.json", rung=rung)
    doc = metrics.document()
    steps = doc["steps"]
    assert doc["rung"] == rung and len(steps["step"]) == len(traces) > 0
    pages = [steps["pages_used"][i] + steps["pages_cached"][i] + steps["pages_free"][i]
             for i in range(len(steps["step"]))]
    if engine.rung.paged:
        assert set(pages) == {engine.config.num_pages}
    else:       # nothing is paged: every page counter is 0
        assert set(pages) == {0}
    assert (doc["run"]["prefix_hit_rate"] is None) == (not engine.rung.reuse)
    assert doc["run"]["acceptance_rate"] is None          # preemption.spec drafts nothing


# -- 2. requests and the run ------------------------------------------------------------------

@pytest.mark.parametrize("name", CHECKED)
def test_requests_and_run_totals_match_the_trace_lines(name):
    engine, metrics, traces, _ = recorded(GOLDEN / f"{name}.spec.json")
    doc = metrics.document()
    golden = golden_lines(name)
    lines, summary = golden[:-1], {s["request_id"]: s for s in golden[-1]["summary"]}
    prompts = prompts_of(name)
    first, finish, preempted = {}, {}, Counter()
    reused, drafted, accepted = Counter(), Counter(), Counter()
    for line in lines:
        for rid in line["sampled"]:
            first.setdefault(rid, line["step"])
        for rid, why in line["finished"].items():
            finish[rid] = (line["step"], why)
        preempted.update(line["preempted"])
        reused.update(line["reused"])
        drafted.update(line["drafted"])
        accepted.update(line["accepted"])
    for row in doc["requests"]:
        rid = row["request_id"]
        assert row["first_token_step"] == first.get(rid), rid
        assert (row["finish_step"], row["finish_reason"]) == finish.get(rid, (None, None)), rid
        assert row["preemptions"] == preempted[rid]
        assert row["reused_tokens"] == reused[rid]
        assert (row["drafted"], row["accepted"]) == (drafted[rid], accepted[rid])
        assert row["acceptance_rate"] == (round(accepted[rid] / drafted[rid], 6) if drafted[rid] else None)
        assert row["generated"] == summary[rid]["generated"]
        assert row["state"] == summary[rid]["state"]
        assert row["prompt_tokens"] == prompts[rid]
    run = doc["run"]
    busy = [line for line in lines if line["executed"]]
    prompt_tokens = sum(prompts[r] for line in lines for r in line["admitted"] + line["preempted"])
    hits = sum(reused.values())
    assert run["steps"] == len(lines) and run["busy_steps"] == len(busy)
    assert run["prompt_tokens"] == prompt_tokens
    assert run["prefix_hit_tokens"] == hits
    assert run["prefix_hit_rate"] == round(hits / prompt_tokens, 6)
    assert 0 <= run["prefix_hit_rate"] <= 1
    assert (run["drafted_tokens"], run["accepted_tokens"]) == (sum(drafted.values()), sum(accepted.values()))
    assert run["batch_tokens"] == sum(sum(line["executed"].values()) for line in lines)
    assert run["mean_batch_tokens"] == round(run["batch_tokens"] / len(busy), 6)
    assert run["mean_batch_requests"] == round(sum(len(line["executed"]) for line in busy) / len(busy), 6)
    assert run["requests_finished"] == len(finish) == sum(s["state"] == "FINISHED" for s in summary.values())
    assert run["preemptions"] == sum(preempted.values())
    assert run["generated_tokens"] == sum(s["generated"] for s in summary.values())


def test_a_preempted_request_counts_its_preemptions():
    _, metrics, _, _ = recorded(GOLDEN / "preemption.spec.json")
    doc = metrics.document()
    by_id = {r["request_id"]: r for r in doc["requests"]}
    # preemption.trace.jsonl: p2 at steps 1, 2, 3, 4 and 7; p1 at steps 3 and 4
    assert (by_id["p0"]["preemptions"], by_id["p1"]["preemptions"], by_id["p2"]["preemptions"]) == (0, 2, 5)
    assert doc["run"]["preemptions"] == 7 and doc["run"]["requests_preempted"] == 2
    assert doc["steps"]["requests_preempted"] == [0, 1, 1, 2, 2, 0, 0, 1, 0, 0]
    # each start from nothing looks the prompt up again: 5+4+3 admitted, p1 (4) twice, p2 (3) 5 times
    assert doc["run"]["prompt_tokens"] == 12 + 2 * 4 + 5 * 3
    assert by_id["p1"]["reused_tokens"] == 4 and by_id["p2"]["reused_tokens"] == 2
    assert "preempted 7 times (2 requests)" in metrics.summary_lines()
    assert "prefix hit rate 17.1% (6 of 35 prompt tokens)" in metrics.summary_lines()


def test_the_totals_without_step_columns_are_the_same():
    _, full, _, _ = recorded(GOLDEN / "random_054.spec.json")
    _, light, _, _ = recorded(GOLDEN / "random_054.spec.json", keep_steps=False)
    assert light.summary_lines() == full.summary_lines()
    assert light.steps == full.steps and light.prompt_tokens == full.prompt_tokens
    assert light.document()["steps"]["step"] == []


# -- 3. run and launch ------------------------------------------------------------------------

def late_preemption_spec(tmp_path: Path) -> Path:
    """preemption.spec with one more request arriving after an idle stretch."""
    spec = json.loads((GOLDEN / "preemption.spec.json").read_text())
    spec["requests"].append({"request_id": "late", "prompt_len": 6, "max_new_tokens": 3,
                             "arrival_step": 400})
    path = tmp_path / "late.spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("which", ["late_preemption", "random_054"])
def test_run_and_launch_agree_on_every_deterministic_number(tmp_path, which):
    spec = late_preemption_spec(tmp_path) if which == "late_preemption" else GOLDEN / f"{which}.spec.json"
    plain = cli("run", "--spec", spec, "--world-size", 2, "--json")
    ran = cli("run", "--spec", spec, "--world-size", 2, "--json", "--metrics", tmp_path / "run.json")
    launched = cli("launch", "--spec", spec, "--world-size", 2, "--json",
                   "--metrics", tmp_path / "launch.json")
    assert plain.returncode == ran.returncode == launched.returncode == 0, launched.stderr
    assert plain.stdout == ran.stdout == launched.stdout         # --json: not a byte changed
    a = json.loads((tmp_path / "run.json").read_text())
    b = json.loads((tmp_path / "launch.json").read_text())
    assert a["ranks"] is None and a["arrivals"] is None and "wall_s" not in a["steps"]
    assert b["arrivals"]["steps"] == b["run"]["busy_steps"] and b["arrivals"]["waited_s"] >= 0
    assert deterministic(a) == deterministic(b)
    assert "error" not in a and "error" not in b
    wall = b["steps"]["wall_s"]
    assert len(wall) == len(b["steps"]["step"]) and all(isinstance(w, float) and w >= 0 for w in wall)
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    for rank in b["ranks"]:
        assert 0 < rank["rtt_p50_ms"] <= rank["rtt_p99_ms"]
        assert 0 < rank["steps"] <= b["run"]["steps"]
    if which == "late_preemption":
        assert 1 in b["steps"]["span"] and max(b["steps"]["span"]) > 300      # the idle stretch: one row
        assert b["run"]["preemptions"] > 0
    else:
        assert b["run"]["drafted_tokens"] > 0 and b["run"]["prefix_hit_tokens"] > 0


# -- 4. the summary lines ---------------------------------------------------------------------

def after_closing_line(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if " requests finished" in line)
    return lines[at + 1:]


def test_the_summary_lines_of_run_and_launch():
    ran = cli("run")
    assert ran.returncode == 0
    assert after_closing_line(ran.stdout) == ["acceptance 5/7 drafted tokens (71.4%)",
                                              "mean batch 5.2 tokens, 1.3 requests"]
    launched = cli("launch", "--world-size", 2)
    assert launched.returncode == 0, launched.stderr
    after = after_closing_line(launched.stdout)
    assert after[:2] == ["acceptance 5/7 drafted tokens (71.4%)", "mean batch 5.2 tokens, 1.3 requests"]
    assert after[2].startswith("6 steps in ") and after[2].endswith(" s of start-up")   # launch's own
    assert after[3].startswith("rank ") and after[-1] == "workers: 2 started, none left running"


def test_the_summary_is_quiet_when_nothing_happened():
    # no drafts, no hits, no preemption: only the batch line
    done = cli("run", "--request", "a:5:3", "--request", "b:3:2")
    assert done.returncode == 0
    assert after_closing_line(done.stdout) == ["mean batch 3.7 tokens, 1.7 requests"]
    empty = cli("run", "--spec", GOLDEN / "empty.spec.json")
    assert empty.returncode == 0 and after_closing_line(empty.stdout) == []
    preempted = cli("run", "--spec", GOLDEN / "preemption.spec.json")
    assert after_closing_line(preempted.stdout) == ["prefix hit rate 17.1% (6 of 35 prompt tokens)",
                                                    "mean batch 3.0 tokens, 1.5 requests",
                                                    "preempted 7 times (2 requests)"]


# -- 5. errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "launch"])
def test_a_path_that_cannot_be_written_is_bad_input(tmp_path, command):
    for path in (tmp_path / "no" / "such" / "m.json", tmp_path):
        done = cli(command, "--metrics", path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and f"--metrics {path}: " in done.stderr, done.stderr
        assert done.stdout == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("args", [["run"], ["run", "--json"], ["launch", "--world-size", 2]])
def test_a_full_disk_names_the_flag_and_the_file(args):
    done = cli(*args, "--metrics", "/dev/full")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    said = done.stdout if "--json" in args else done.stderr
    assert "--metrics /dev/full: No space left on device" in said, said
    if "--json" in args:
        last = json.loads(done.stdout.splitlines()[-1])
        assert last["error"] == "MachineFailure" and last["step"] == 5
        assert not any('"summary"' in line for line in done.stdout.splitlines())


@pytest.mark.parametrize("as_json", [False, True])
def test_a_failed_run_still_writes_what_there_is(tmp_path, as_json):
    out = tmp_path / "m.json"
    done = cli("run", "--spec", GOLDEN / "irreducible.spec.json", "--metrics", out,
               *(["--json"] if as_json else []))
    assert done.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["error"]["error"] == "Irreducible" and doc["error"]["step"] == 4
    assert doc["steps"]["step"] == [0, 1, 2, 3] and doc["run"]["steps"] == 4
    assert "requests finished" not in done.stdout     # the failed run prints no closing line


# -- 6. idle stretches ------------------------------------------------------------------------

def test_an_idle_stretch_of_200000_steps_stays_small(tmp_path):
    out = tmp_path / "m.json"
    started = time.monotonic()
    done = cli("run", "--request", "a:5:3", "--request", "b:4:2:200000", "--metrics", out)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 1_000_000 and took < 30
    doc = json.loads(out.read_text())
    steps = doc["steps"]
    assert doc["run"]["steps"] == sum(steps["span"]) == 200_002
    assert len(steps["step"]) < 10 and max(steps["span"]) == 199_997
    assert {k: len(v) for k, v in steps.items()} == {k: len(steps["step"]) for k in steps}
    late = next(r for r in doc["requests"] if r["request_id"] == "b")
    assert late["arrival_step"] == late["first_token_step"] == 200_000
    assert late["finish_step"] == 200_001
    assert doc["run"]["mean_batch_tokens"] == 2.4          # idle steps are not averaged in
    assert "mean batch 2.4 tokens, 1.0 requests over the 5 steps that ran a batch" in done.stdout


def test_overlap_counts_what_it_discarded_and_returned_alike_in_run_and_launch(tmp_path):
    """At `overlap` the run totals say how much work planned ahead was discarded and how many
    placeholders came back: the traces' sums, the same in process and on processes; null at
    `full`, where nothing is planned ahead."""
    spec = GOLDEN / "eos_immediate.spec.json"
    docs = {}
    for command in ("run", "launch"):
        done = cli(command, "--spec", spec, "--rung", "overlap", "--json", "--metrics", tmp_path / command)
        assert done.returncode == 0, done.stderr
        docs[command] = json.loads((tmp_path / command).read_text())
        lines = [json.loads(line) for line in done.stdout.splitlines()[:-1]]
        run = docs[command]["run"]
        assert run["discarded_tokens"] == sum(sum(x["discarded"].values()) for x in lines) == 4
        assert run["returned_tokens"] == sum(sum(x["returned"].values()) for x in lines) == 4
    assert deterministic(docs["run"]) == deterministic(docs["launch"])
    human = cli("run", "--spec", spec, "--rung", "overlap")
    assert "planned ahead: 4 placeholder tokens returned, 4 tokens of work discarded" in human.stdout
    cli("run", "--spec", spec, "--json", "--metrics", tmp_path / "full")
    full = json.loads((tmp_path / "full").read_text())["run"]
    assert full["discarded_tokens"] is None and full["returned_tokens"] is None
    assert "planned ahead" not in cli("run", "--spec", spec).stdout
