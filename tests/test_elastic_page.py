"""The elastic world (mechanism 14) on the page and on /metrics: a real run shrinks to 3 ranks at
step 2 and grows back to 4, twice (`--on-rank-loss shrink --regrow`), and another is left shrunk.

1. the page (`launch --html`) holds the world's size over the steps (what the run asked for, and
   each change), says each resize in words where it lists losses and restarts, shows the
   renumbered members on the lanes of their new ranks, and calls no join a replacement;
2. the live state fed that wire log serves the world's size asked for and the size now on
   /metrics (inferris_world_size_requested, inferris_world_size_effective) and /status
   (`world`, beside the unchanged `world_size`), during the run and after it;
3. a log with no resize draws no chart; a resize record whose values are hostile or malformed
   is text on the page, or skipped and counted;
4. in headless Chromium (where Debian's chromium is installed): the chart is drawn, the header
   counts the resizes, the run's panel lists them, and a log with no resize has no chart.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferris_dist.live import prom
from inferris_dist.live.state import LiveState
from inferris_dist.page import build_page, read_log

from tests.helpers.external import CLI, ENV, GOLDEN, REPO
from tests.test_page import HOSTILE, data_of, lines_of, needs_browser, outside_data, synthetic

pytestmark = [pytest.mark.timeout(30), pytest.mark.procs]

SPEC = GOLDEN / "random_001.spec.json"
SHRINK_AT_2 = "shrink: world size 4 -> 3 in epoch 1, without rank 1; renumbered 2->1 3->2"


def launch(tmp: Path, *faults: str, regrow: bool) -> tuple[Path, Path]:
    """(wire log, page) of random_001 on 4 ranks under --on-rank-loss shrink."""
    log, page = tmp / "run.jsonl", tmp / "run.html"
    args = [*CLI, "launch", "--spec", str(SPEC), "--world-size", "4", "--on-rank-loss", "shrink",
            *[x for f in faults for x in ("--fault", f)], *(["--regrow"] if regrow else []),
            "--wire-log", str(log), "--html", str(page),
            "--exec-cost", "5ms"]     # steps long enough for a replacement to start on a busy machine
    done = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=25)
    assert done.returncode == 0, done.stdout + done.stderr
    return log, page


@pytest.fixture(scope="module")
def regrown(tmp_path_factory) -> tuple[Path, Path]:
    return launch(tmp_path_factory.mktemp("regrown"), "1:crash@2", "1:crash@6", regrow=True)


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory) -> tuple[Path, Path]:
    return launch(tmp_path_factory.mktemp("shrunk"), "1:crash@2", regrow=False)


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory) -> Path:
    """A log of 4 ranks with a loss and a restart (restore), and no resize."""
    return synthetic(tmp_path_factory.mktemp("unchanged") / "restored.log", 40, 4)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def world_metrics(state: LiveState) -> tuple[float, float]:
    """(effective, requested), as a scrape of /metrics gets them."""
    fams = families(prom.exposition(prom.registry(state)).decode())
    return (fams["inferris_world_size_effective"].samples[0].value,
            fams["inferris_world_size_requested"].samples[0].value)


# -- 1. the page ---------------------------------------------------------------------------------

def said_of(r: dict) -> str:
    """How a resize record begins in words."""
    return f"{r['why']}: world size {r['from']} -> {r['to']} in epoch {r['epoch']}"


def test_the_page_holds_the_world_size_and_says_each_resize(regrown):
    log, page = regrown
    resizes = [r for r in lines_of(log) if r.get("event") == "resize"]
    data = data_of(page.read_text())
    world = data["world"]
    assert world["requested"] == 4
    changes = world["changes"]
    # rank 1 lost at steps 2 and 6, each time one rank fewer; grown back to 4 when a new member
    # has started (how many steps later depends on how soon it starts)
    assert [c[0] for c in changes if data["strs"][c[4]] == "shrink"] == [2, 6]
    assert changes[0][1:3] == [4, 3] and changes[-1][2] == 4
    assert all(a[2] == b[1] for a, b in zip(changes, changes[1:]))        # one size after another
    assert [[c[0], c[1], c[2], data["strs"][c[4]], c[5]] for c in changes] == \
        [[r["step"], r["from"], r["to"], r["why"], r["epoch"]] for r in resizes]
    assert [e for _, e in data["epochs"]] == [r["epoch"] for r in resizes]   # each begins an epoch
    # in words, as a mark where the losses and restarts are, at its step
    kinds = data["mark_kinds"]
    said = sorted((m[4], data["strs"][m[6]]) for m in data["marks"] if kinds[m[0]] == "resize")
    assert len(said) == len(resizes)
    assert said[0][0] == 2 and said[0][1].startswith(SHRINK_AT_2), said
    for (step, text), r in zip(said, resizes):
        assert step == r["step"] and text.startswith(said_of(r)), (text, r)
        assert ("without rank 1" in text) == (r["why"] == "shrink")
        assert (f"joined: rank {r['to'] - 1}" in text) == (r["why"] == "regrow" and r["to"] - r["from"] == 1)
    assert not [n for n in data["notes"] if "malformed" in n]
    # the members kept: on the lanes of their new ranks (rank 2's at 1, rank 3's at 2), no join
    # nor renumbering called a replacement
    first_pid = {m[0]: m[2] for m in data["members"] if m[1] == 0}
    moved = [(m[0], m[2], m[5]) for m in data["members"] if len(m) > 5 and m[1] == 1]
    assert moved == [(1, first_pid[2], 2), (2, first_pid[3], 3)]
    assert kinds.index("replaced") not in {m[0] for m in data["marks"]}


def test_the_page_of_a_world_left_shrunk(shrunk):
    _, page = shrunk
    data = data_of(page.read_text())
    assert data["world"]["requested"] == 4
    assert [c[:3] for c in data["world"]["changes"]] == [[2, 4, 3]]


def test_no_resize_no_chart(unchanged):
    data = data_of(build_page(read_log(str(unchanged))))
    assert data["world"] == {"requested": 4, "changes": []}
    assert "resize" not in {data["mark_kinds"][m[0]] for m in data["marks"]}
    assert "restart" in {data["mark_kinds"][m[0]] for m in data["marks"]}     # a restart is no resize
    state = LiveState()
    state.add(lines_of(unchanged))
    assert world_metrics(state) == (4, 4)


def test_a_hostile_or_malformed_resize(regrown):
    records = lines_of(regrown[0])
    i = next(i for i, r in enumerate(records) if r.get("event") == "resize")
    hostile = dict(records[i], why=HOSTILE)
    broken = dict(records[i], kept="all of them", t=records[i]["t"] + 1e-6)
    page = build_page(records[:i] + [hostile, broken] + records[i + 1:])
    data = data_of(page)
    assert HOSTILE not in outside_data(page)                 # text in the data, never markup
    assert HOSTILE in data["strs"]
    assert len(data["world"]["changes"]) == sum(r.get("event") == "resize" for r in records)
    assert any("resize (kept)" in n for n in data["notes"])  # the broken one: skipped, counted


# -- 2. /metrics and /status -----------------------------------------------------------------------

def test_metrics_and_status_follow_the_world_size(regrown):
    records = lines_of(regrown[0])
    first = next(i for i, r in enumerate(records) if r.get("event") == "resize")
    state = LiveState()
    state.add(records[:first])
    assert world_metrics(state) == (4, 4)
    state.add(records[first:first + 1])                      # shrunk: 3 of the 4 asked for
    assert world_metrics(state) == (3, 4)
    assert state.status_json()["world"] == {"requested": 4, "effective": 3}
    state.add(records[first + 1:])
    assert world_metrics(state) == (4, 4)
    status = state.status_json()
    assert status["world"] == {"requested": 4, "effective": 4} and status["world_size"] == 4
    assert status["ended"] and status["health"] == "ended"


def test_metrics_and_status_of_a_world_left_shrunk(shrunk):
    state = LiveState()
    state.add(lines_of(shrunk[0]))
    assert world_metrics(state) == (3, 4)
    status = state.status_json()
    assert status["world"] == {"requested": 4, "effective": 3} and status["world_size"] == 4
    assert [m["rank"] for m in status["members"]] == [0, 1, 2]
    assert status["health"] == "ended"


# -- 4. in a browser -------------------------------------------------------------------------------

@needs_browser
def test_the_chart_in_a_browser(regrown, unchanged, tmp_path):
    from tests.helpers.browser import Browser
    n = sum(r.get("event") == "resize" for r in lines_of(regrown[0]))
    plain = tmp_path / "plain.html"
    plain.write_text(build_page(read_log(str(unchanged))))
    with Browser(1400, 900) as browser:
        for path in (regrown[1], plain):
            browser.open(path)
            browser.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0")
            seen = browser.evaluate(
                "({world: inferrisPage.world, hidden: document.getElementById('world').hidden, "
                "charts: document.querySelectorAll('#world canvas').length, "
                "caption: document.getElementById('world').innerText, "
                "run: document.getElementById('run').innerText, "
                "detail: document.getElementById('detail').innerText})")
            if path == plain:
                assert seen["world"] == {"requested": 4, "effective": 4, "changes": 0}
                assert seen["hidden"] and seen["charts"] == 0 and "resize" not in seen["run"]
                continue
            assert seen["world"] == {"requested": 4, "effective": 4, "changes": n}
            assert not seen["hidden"] and seen["charts"] == 1
            assert seen["caption"].startswith("world size over the steps: 4 \u2192 3 (step 2) \u2192 ")
            assert "asked for 4, 4 at the end" in seen["caption"]
            assert f"2 losses, 0 restarts, {n} resizes" in seen["run"]
            assert f"4 asked, 4 at the end (changed {n} times)" in seen["detail"]
            assert f"step 2: {SHRINK_AT_2}" in seen["detail"]
        assert browser.errors == [] and browser.requests == []
