"""Each rank's arrival at each join, as the wire log's `attempt` event says it (`arrivals`), seen
three ways. Real launches of three ranks, rank 2 answering 3 ms late at every step (and one of a
single rank, which has no last):

1. `inspect WIRELOG --step K` prints every rank's arrival at that step's join (after, behind the
   first, its own execute time, in ms) in a small table, the last one marked `last`; `--json`
   gives the same as an `arrival` object on each rank's `result`, the other keys as they were;
   the arrivals are checked as the schema has them, and a malformed one refuses the log;
2. the page's data holds each joined attempt's arrivals and its last rank, as the log has them,
   a malformed list is counted and the attempt kept; in a browser, a click on a step lists them
   with a bar each and the last one marked;
3. /metrics built from the log: `inferris_rank_last_arrivals_total` is, per rank, the joined
   steps it arrived last at, counted from the log here; `inferris_rank_join_wait_seconds` is a
   histogram per rank, one observation per joined step, of how long its result waited for the
   last.
"""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferris_dist.cli.cmd_inspect import OPTIONAL as INSPECT_OPTIONAL
from inferris_dist.live import prom
from inferris_dist.live.state import LiveState
from inferris_dist.page import build_page, model
from inferris_dist.wirelog.schema import EVENTS

from tests.helpers.external import CLI, ENV, GOLDEN, REPO
from tests.test_page import data_of, needs_browser
from tests.test_wire_schema import SAMPLES, schema_allows

pytestmark = [pytest.mark.timeout(120)]

SLOW = 2          # the rank the fault delays
RUN = ["--spec", str(GOLDEN / "random_004.spec.json"), "--exec-cost", "1ms+20us/token"]


def launched(tmp: Path, name: str, *args: str) -> tuple[Path, Path]:
    """(wire log, page) of one launch, its exit status checked."""
    log, page = tmp / f"{name}.jsonl", tmp / f"{name}.html"
    done = subprocess.run([*CLI, "launch", *RUN, *args, "--wire-log", str(log), "--html", str(page)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return log, page


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("arrivals")
    return {"slow": launched(tmp, "slow", "--world-size", "3", "--fault", f"{SLOW}:delay@0+:0.003"),
            "one": launched(tmp, "one", "--world-size", "1")}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def joins(path: Path) -> list[dict]:
    """The joined attempts' events of a log, with their arrivals."""
    return [r for r in records(path) if r.get("event") == "attempt" and r["verdict"] == "joined"]


def last_of(arrivals: list[dict]) -> int | None:
    """The rank the join waited for: the most behind (the first of equals); none under two."""
    return max(arrivals, key=lambda x: x["behind"])["rank"] if len(arrivals) > 1 else None


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=30)


def arrival_rows(out: str) -> list[list[str]]:
    """The rows of the first table of arrivals in `inspect --step`'s text, split on whitespace."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "arrivals at the join:")
    assert lines[at + 1].split() == ["rank", "after", "ms", "behind", "first", "ms", "exec", "ms"]
    rows = []
    for line in lines[at + 2:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows.append(cells)
    return rows


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


# -- the log itself: rank 2 is the one waited for ------------------------------------------------

@pytest.mark.procs
def test_the_slow_rank_arrives_last_at_most_joins(runs):
    events = joins(runs["slow"][0])
    assert events and all(len(ev["arrivals"]) == 3 for ev in events)
    lasts = Counter(last_of(ev["arrivals"]) for ev in events)
    assert lasts[SLOW] > len(events) / 2, lasts


# -- 1. inspect --step -----------------------------------------------------------------------------

@pytest.mark.procs
def test_inspect_one_step_prints_each_arrival_and_marks_the_slow_rank_last(runs):
    log = runs["slow"][0]
    ev = next(ev for ev in joins(log) if last_of(ev["arrivals"]) == SLOW)
    done = cli("inspect", str(log), "--step", str(ev["step"]))
    assert done.returncode == 0, done.stderr
    rows = arrival_rows(done.stdout)
    by_rank = {x["rank"]: x for x in ev["arrivals"]}
    assert [r[0] for r in rows] == ["0", "1", "2"]
    for r in rows:
        x = by_rank[int(r[0])]
        assert r[1:4] == [ms(x["after"]), ms(x["behind"]), ms(x["exec"])], r
    assert [r[0] for r in rows if r[4:] == ["last"]] == [str(SLOW)]
    assert all(len(r) == 4 for r in rows if r[0] != str(SLOW))
    # above the plan of its attempt, the join still the attempt's last line
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines.index("arrivals at the join:") < next(i for i, line in enumerate(lines)
                                                       if line.startswith("item  request"))
    assert lines[-1] == "join: joined"


@pytest.mark.procs
def test_inspect_json_gives_each_rank_its_arrival_the_other_keys_as_they_were(runs):
    log = runs["slow"][0]
    ev = next(ev for ev in joins(log) if last_of(ev["arrivals"]) == SLOW)
    done = cli("inspect", str(log), "--step", str(ev["step"]), "--json")
    assert done.returncode == 0, done.stderr
    objs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["record"] for o in objs if o["record"] != "item"] == ["plan"] + ["result"] * 3 + ["join"]
    results = [o for o in objs if o["record"] == "result"]
    for o in results:
        assert list(o) == ["record", "step", "epoch", "rank", "bytes", "outcomes", "undecodable", "inside",
                           "arrival"]
        x = next(a for a in ev["arrivals"] if a["rank"] == o["rank"])
        assert o["arrival"] == {"after": x["after"], "behind": x["behind"], "exec": x["exec"],
                                "last": o["rank"] == SLOW}
    assert objs[-1] == {"record": "join", "step": ev["step"], "epoch": ev["epoch"], "verdict": "joined",
                        "message": None}


@pytest.mark.procs
def test_a_world_of_one_has_an_arrival_and_no_last(runs):
    log = runs["one"][0]
    ev = joins(log)[0]
    assert [x["rank"] for x in ev["arrivals"]] == [0]
    done = cli("inspect", str(log), "--step", str(ev["step"]))
    assert done.returncode == 0, done.stderr
    rows = arrival_rows(done.stdout)
    assert [r[0] for r in rows] == ["0"] and "last" not in done.stdout
    done = cli("inspect", str(log), "--step", str(ev["step"]), "--json")
    result = next(json.loads(line) for line in done.stdout.splitlines() if '"record": "result"' in line)
    assert result["arrival"]["last"] is False


def test_inspect_checks_the_arrivals_as_the_schema_has_them():
    f = EVENTS["attempt"].fields["arrivals"]
    assert set(INSPECT_OPTIONAL["attempt"]) == {"arrivals"} and not f.required
    ok, must = INSPECT_OPTIONAL["attempt"]["arrivals"]
    for v in SAMPLES + [[{"rank": 0}], [{"rank": 0}, 1]]:
        assert ok(v) == schema_allows(f, v), (v, must)
    assert ok([]) and ok([{}]) and not ok([[]]) and not ok({"rank": 0})


def edited(tmp_path: Path, log: Path, change) -> tuple[Path, int]:
    """A copy of `log` with `change` applied to the arrivals of its first joined attempt; the
    copy and that line's number."""
    lines = log.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if '"event": "attempt"' in line and '"arrivals"' in line)
    ev = json.loads(lines[n])
    change(ev["arrivals"])
    lines[n] = json.dumps(ev)
    out = tmp_path / "edited.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out, n + 1


@pytest.mark.procs
@pytest.mark.parametrize("change,said", [
    (lambda a: a[2].update(behind=-0.001), "arrival 2: behind must be a number of seconds >= 0"),
    (lambda a: a[1].update(after="3ms"), "arrival 1: after must be a number of seconds >= 0"),
    (lambda a: a[0].update(exec=float("inf")), "arrival 0: exec must be a number of seconds >= 0"),
    (lambda a: a[0].update(rank=4096), "arrival 0: rank must be a rank, 0..4095"),
    (lambda a: a[1].update(rank=0), "arrival 1: rank 0 arrives twice"),
    (lambda a: a[0].pop("behind"), "arrival 0: no behind"),
    (lambda a: a.append(7), "arrivals must be a list of objects"),
])
def test_a_malformed_arrival_refuses_the_log_naming_its_line(runs, tmp_path, change, said):
    log, line = edited(tmp_path, runs["slow"][0], change)
    for args in ((), ("--step", "0"), ("--step", "0", "--json")):
        done = cli("inspect", str(log), *args)
        assert done.returncode == 2 and done.stdout == "", args
        assert done.stderr.strip() == f"inferris-dist: {log} line {line}: attempt event: {said}", args


@pytest.mark.procs
def test_a_log_without_arrivals_shows_none(runs, tmp_path):
    plain = tmp_path / "plain.jsonl"        # as a writer that does not say them writes it
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "arrivals"}) + "\n"
                             for r in records(runs["slow"][0])))
    done = cli("inspect", str(plain), "--step", "0")
    assert done.returncode == 0 and "arrivals" not in done.stdout, done.stderr
    assert "join: joined" in done.stdout
    done = cli("inspect", str(plain), "--step", "0", "--json")
    assert done.returncode == 0 and '"arrival"' not in done.stdout


# -- 2. the page -------------------------------------------------------------------------------------

@pytest.mark.procs
def test_the_page_data_holds_each_joins_arrivals_and_its_last_rank(runs):
    log, page = runs["slow"]
    data = data_of(page.read_text())
    events = joins(log)
    assert len(data["arrivals"]) == len(events)
    lasts = Counter()
    for (i, last, rows), ev in zip(data["arrivals"], events):
        step, epoch = data["attempts"][i][:2]
        assert (step, epoch) == (ev["step"], ev["epoch"])
        assert rows == [[x["rank"], round(x["after"] * 1e6), round(x["behind"] * 1e6), round(x["exec"] * 1e6)]
                        for x in ev["arrivals"]]
        assert last == last_of(ev["arrivals"])
        lasts[last] += 1
    assert lasts[SLOW] > len(events) / 2
    one = data_of(runs["one"][1].read_text())
    assert one["arrivals"] and all(last == -1 and len(rows) == 1 for _, last, rows in one["arrivals"])


@pytest.mark.procs
def test_the_live_pages_data_holds_the_same_arrivals(runs):
    log, page = runs["slow"]
    state = LiveState()
    state.add(records(log))
    with state.lock:
        live = state.page_data()
    assert live["arrivals"] == data_of(page.read_text())["arrivals"] != []


@pytest.mark.procs
def test_malformed_arrivals_are_counted_and_their_attempt_kept(runs):
    recs = records(runs["slow"][0])
    first = next(r for r in recs if r.get("event") == "attempt" and r.get("arrivals"))
    first["arrivals"][1]["behind"] = float("nan")
    second = next(r for r in recs if r.get("event") == "attempt" and r.get("arrivals") and r is not first)
    second["arrivals"][0]["rank"] = "</script>"
    data = data_of(build_page(recs))
    assert len(data["arrivals"]) == len(joins(runs["slow"][0])) - 2
    assert len(data["attempts"]) == len(joins(runs["slow"][0]))
    assert any("attempt (arrivals) x2" in note for note in data["notes"]), data["notes"]


@pytest.mark.procs
def test_past_their_budget_an_attempts_arrivals_are_left_out_and_counted(runs, monkeypatch):
    monkeypatch.setattr(model, "MAX_ARRIVALS", 30)         # ten joins of three ranks
    events = joins(runs["slow"][0])
    data = data_of(build_page(records(runs["slow"][0])))
    assert [data["attempts"][i][:2] for i, _, _ in data["arrivals"]] == [[ev["step"], ev["epoch"]]
                                                                          for ev in events[:10]]
    assert f"{len(events) - 10} attempts' arrivals beyond the page's bound are not shown" in data["notes"]


@pytest.fixture
def browser():
    from tests.helpers.browser import Browser
    with Browser(1400, 900) as b:
        yield b


@needs_browser
@pytest.mark.procs
def test_a_step_clicked_lists_each_arrival_with_a_bar_and_the_last_marked(runs, browser):
    log, page = runs["slow"]
    ev = next(ev for ev in joins(log) if last_of(ev["arrivals"]) == SLOW)
    browser.open(page, timeout=20)
    browser.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0", 20)
    assert browser.evaluate("inferrisPage.arrivals") == len(joins(log))
    browser.evaluate(f"inferrisPage.select({ev['step']})")
    rows = browser.evaluate("[...document.querySelectorAll('#detail table.arrivals tbody tr')].map(tr => "
                            "({cells: [...tr.cells].map(td => td.textContent), last: tr.className, "
                            "bar: tr.querySelector('.abar').getBoundingClientRect().width}))")
    assert [r["cells"][0] for r in rows] == ["0", "1", "2"]
    assert [r["cells"][0] for r in rows if r["last"] == "last"] == [str(SLOW)]
    assert [r["cells"][-1] for r in rows] == ["last" if r["cells"][0] == str(SLOW) else "" for r in rows]
    bars = {int(r["cells"][0]): r["bar"] for r in rows}
    assert bars[SLOW] == max(bars.values()) > 100
    behind = {x["rank"]: x["behind"] for x in ev["arrivals"]}
    for rank, width in bars.items():
        assert abs(width - 120 * behind[rank] / behind[SLOW]) <= 1, (rank, width)
    text = browser.evaluate("document.getElementById('detail').innerText")
    assert "arrivals at the join: it waited" in text and f"for rank {SLOW}" in text
    assert browser.errors == [] and browser.requests == []


# -- 3. /metrics -------------------------------------------------------------------------------------

def exposed(path: Path) -> dict:
    state = LiveState()
    state.add(records(path))
    text = prom.exposition(prom.registry(state)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict, family: str, name: str) -> dict[str, float]:
    """rank -> value of the samples named `name` of `family`."""
    return {s.labels["rank"]: s.value for s in fams[family].samples if s.name == name}


@pytest.mark.procs
def test_metrics_count_the_joins_each_rank_arrived_last_at(runs):
    events = joins(runs["slow"][0])
    lasts = Counter(last_of(ev["arrivals"]) for ev in events)
    fams = exposed(runs["slow"][0])
    got = samples(fams, "inferris_rank_last_arrivals", "inferris_rank_last_arrivals_total")
    assert got == {str(r): float(lasts[r]) for r in range(3)}
    assert got[str(SLOW)] > len(events) / 2


@pytest.mark.procs
def test_metrics_give_each_rank_a_histogram_of_its_wait_for_the_last(runs):
    events = joins(runs["slow"][0])
    fams = exposed(runs["slow"][0])
    family = "inferris_rank_join_wait_seconds"
    assert fams[family].type == "histogram"
    counts = samples(fams, family, family + "_count")
    sums = samples(fams, family, family + "_sum")
    assert counts == {str(r): float(len(events)) for r in range(3)}
    for r in range(3):
        waited = sum(max(x["behind"] for x in ev["arrivals"]) - next(x["behind"] for x in ev["arrivals"]
                                                                    if x["rank"] == r) for ev in events)
        assert sums[str(r)] == pytest.approx(waited, abs=1e-9), r
        buckets = [s for s in fams[family].samples
                   if s.name == family + "_bucket" and s.labels["rank"] == str(r)]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == len(events)
    # the slow rank waited least (it was the one waited for)
    assert sums[str(SLOW)] == min(sums.values())


@pytest.mark.procs
def test_a_world_of_one_waits_for_no_one_and_is_never_last(runs):
    events = joins(runs["one"][0])
    fams = exposed(runs["one"][0])
    assert samples(fams, "inferris_rank_last_arrivals", "inferris_rank_last_arrivals_total") == {"0": 0.0}
    family = "inferris_rank_join_wait_seconds"
    assert samples(fams, family, family + "_count") == {"0": float(len(events))}
    assert samples(fams, family, family + "_sum") == {"0": 0.0}
