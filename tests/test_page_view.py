"""What the page shows first and what a link to it shows, in headless Chromium, on a real run at
rung overlap whose rank 2 dies at step 3 under restore (the plan of step 4, sent ahead, is void
when epoch 0 ends):

1. "fit" (and the page as it opens) shows the run's steps, not mostly the start-up before them;
2. PAGE#step=K opens step K, PAGE#t=A-B shows seconds A to B of the run, both may be given,
   what is not a link is ignored; once a step is clicked, the address is a link to what is shown;
3. a void attempt is not a failed one anywhere on the page: not in the counts, not red.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.external import CLI, ENV, GOLDEN, REPO
from tests.test_page import data_of, lines_of, needs_browser

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]


@pytest.fixture
def browser():
    from tests.helpers.browser import Browser
    with Browser(1400, 900) as b:
        yield b


@pytest.fixture(scope="module")
def voided(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("voided")
    log, out = tmp / "void.log", tmp / "void.html"
    done = subprocess.run([*CLI, "launch", "--rung", "overlap", "--world-size", "4", "--exec-cost", "2ms",
                           "--spec", str(GOLDEN / "speculative.spec.json"), "--fault", "2:crash@3",
                           "--on-rank-loss", "restore", "--wire-log", str(log), "--html", str(out)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = [r["verdict"] for r in lines_of(log) if r.get("event") == "attempt"]
    assert sum(v.startswith("void") for v in verdicts) == 1 and sum(v != "joined" for v in verdicts) == 2
    return log, out


def opened(browser, page: Path, fragment: str = "") -> None:
    """The page loaded afresh (from another document: a new fragment alone would not load it)."""
    browser.send("Page.navigate", {"url": "about:blank"})
    browser.wait_event("Page.loadEventFired")
    browser.open(page, fragment=fragment)
    browser.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0")


@needs_browser
def test_fit_shows_the_steps_not_the_start_up(browser, voided):
    _, out = voided
    data = data_of(out.read_text())
    first_plan = min(a[2] for a in data["attempts"])
    last_step = max(data["steps"]["b"])
    # the start-up is long enough beside the steps that a view from 0 would fail the check below
    assert data["startup"] == [0, first_plan] and first_plan > 0.1 * (last_step - first_plan)
    opened(browser, out)
    for _ in range(2):
        v0, v1, _ = browser.evaluate("inferrisPage.view")
        width = last_step - first_plan
        # from the first plan, to the last step and what followed it (its audit): not the start-up
        assert first_plan - 0.05 * width <= v0 <= first_plan and last_step <= v1 < v0 + 1.5 * width
        browser.evaluate("inferrisPage.setView(0, 1e6)")                  # away, and back with fit
        browser.evaluate("document.getElementById('fit').click()")
        browser.wait_for(f"inferrisPage.view[0] > {first_plan - 0.05 * width}")
    assert browser.errors == []


@needs_browser
def test_a_link_opens_a_step_and_a_time_range(browser, voided):
    _, out = voided
    opened(browser, out, "step=3")
    assert browser.evaluate("inferrisPage.selected") == 3
    assert "step 3, epoch 0: plan of" in browser.evaluate("document.getElementById('detail').innerText")
    assert browser.evaluate("inferrisPage.stepPoint(3)") is not None          # and it is in view
    ms = min(a[2] for a in data_of(out.read_text())["attempts"]) // 1000      # the first plan, in ms
    opened(browser, out, f"t={ms / 1000:.3f}-{(ms + 20) / 1000:.3f}")
    v0, v1, _ = browser.evaluate("inferrisPage.view")
    assert (round(v0), round(v1)) == (ms * 1000, (ms + 20) * 1000)
    assert browser.evaluate("inferrisPage.selected") is None
    lo = ms // 2                  # a range from within the start-up (never before the log began)
    opened(browser, out, f"step=4&t={lo / 1000:.3f}-{(ms + 30) / 1000:.3f}")
    v0, v1, _ = browser.evaluate("inferrisPage.view")
    assert (round(v0), round(v1)) == (lo * 1000, (ms + 30) * 1000)
    assert browser.evaluate("inferrisPage.selected") == 4
    opened(browser, out, "t=-0.002-0.030")    # a view may begin before the run (a step close to it)
    v0, v1, _ = browser.evaluate("inferrisPage.view")
    assert (round(v0), round(v1)) == (-2000, 30000)
    for nonsense in ("step=1e400&t=9-1", "t=abc", "step=-3", "t=1-2-3&x=%3Cscript%3E", "t=--1-2", "=&&="):
        opened(browser, out, nonsense)
        assert browser.evaluate("inferrisPage.selected") is None, nonsense
    # a click on a step: once it settles, the address is a link to what is shown
    browser.evaluate("inferrisPage.focusStep(2)")
    where = browser.evaluate("inferrisPage.stepPoint(2)")
    browser.click(where["x"], where["y"])
    browser.wait_for("inferrisPage.selected === 2")
    link = browser.wait_for("location.hash.startsWith('#step=2&t=') && location.hash", 5)
    view = browser.evaluate("inferrisPage.view")
    opened(browser, out, link[1:])
    assert browser.evaluate("inferrisPage.selected") == 2
    again = browser.evaluate("inferrisPage.view")
    width = view[1] - view[0]
    assert abs(again[0] - view[0]) < 0.01 * width and abs(again[1] - view[1]) < 0.01 * width
    # and a link typed into the address bar is followed
    browser.evaluate("location.hash = '#step=3'")
    browser.wait_for("inferrisPage.selected === 3")
    assert browser.errors == [] and browser.requests == []


@needs_browser
def test_a_void_attempt_is_not_a_failure(browser, voided):
    _, out = voided
    opened(browser, out)
    page = "inferrisPage"
    counts = browser.evaluate(f"[{page}.attempts, {page}.failedAttempts, {page}.voidAttempts]")
    assert counts == [7, 1, 1]
    header = browser.evaluate("document.getElementById('run').innerText")
    assert "in 7 attempts (1 failed)" in header, header
    detail = browser.evaluate("document.getElementById('detail').innerText")
    assert "7 attempts (1 failed, 1 void: sent ahead, never read)" in detail, detail
    browser.evaluate("inferrisPage.focusStep(4)")
    where = browser.evaluate("inferrisPage.stepPoint(4)")
    browser.click(where["x"], where["y"])
    browser.wait_for("inferrisPage.selected === 4")
    joins = browser.evaluate("[...document.querySelectorAll('#detail .join')].map(e => [e.className, "
                             "e.textContent])")
    assert [c for c, _ in joins] == ["join void", "join ok"], joins
    said = joins[0][1]
    assert said.startswith("join: void (sent ahead; the epoch ended)") and "not a failure" in said, said
    # on the steps lane, under step 4's void attempt, nothing says it failed
    where = browser.evaluate("inferrisPage.stepPoint(4)")
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": where["x"], "y": where["y"] + 10})
    said = browser.wait_for("document.getElementById('tip').innerText")
    assert "failed" not in said, said
    assert browser.errors == []
