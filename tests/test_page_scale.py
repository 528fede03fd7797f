"""The page of a log that strains it is bounded, and opens and redraws fast in headless
Chromium: many ranks restarted many times (each epoch band placed without scanning the
restarts), a restarted run with every message logged, 200 request lanes changing state at every
step for 40,000 steps (a page under 10 MB), and the biggest numbers the log may hold. The
bounds in the browser are generous (this machine is shared): open in under 10 s, a frame in
under 500 ms; examples/bench_page.py measures the same pages (docs/performance.md).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferris_dist.page import build_page, write_page
from inferris_dist.page.model import CHANGING, SEGMENT_BUDGET

from tests.helpers.external import ENV, REPO
from tests.helpers.pagelogs import hostile_numbers, lanes_log, restarts_log
from tests.test_page import data_of, needs_browser

pytestmark = [pytest.mark.timeout(240), pytest.mark.procs]


@pytest.fixture
def browser():
    from tests.helpers.browser import Browser
    with Browser(1400, 900, timeout=60) as b:
        yield b

OPEN_S, FRAME_MS = 10.0, 500.0
FRAME = "(() => { const t = performance.now(); %s; return performance.now() - t; })()"


def opened(browser, page: Path) -> float:
    started = time.monotonic()
    browser.open(page, timeout=60)
    browser.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0", 60)
    return time.monotonic() - started


def frames(browser) -> dict[str, float]:
    """The worst of three of each kind of frame, in ms: the whole run, a tenth of it, a pan, the
    lanes scrolled half way down, a step close up."""
    browser.evaluate("inferrisPage.fit()")
    a, z, _ = browser.evaluate("inferrisPage.view")
    mid, tenth = (a + z) / 2, (z - a) / 10
    every = browser.evaluate("inferrisPage.lanes()")
    half = (every[-1]["y"] + every[-1]["h"]) // 2
    steps = browser.evaluate("inferrisPage.stepNumbers")
    kinds = {"fit": "inferrisPage.fit()",
             "tenth": f"inferrisPage.setView({mid - tenth / 2}, {mid + tenth / 2})",
             "pan": f"inferrisPage.setView({mid - tenth / 6}, {mid + tenth * 5 / 6})",
             "scrolled": f"inferrisPage.setView({mid - tenth / 6}, {mid + tenth * 5 / 6}, {half})",
             "step": f"inferrisPage.focusStep({steps[len(steps) // 2] if steps else 0})"}
    return {k: max(browser.evaluate(FRAME % what, timeout=60) for _ in range(3)) for k, what in kinds.items()}


def check(browser, page: Path, name: str) -> dict:
    took = opened(browser, page)
    worst = frames(browser)
    print(f"\n{name}: page {page.stat().st_size / 1e6:.2f} MB, opened in {took:.2f} s, worst frames "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in worst.items()))
    assert took < OPEN_S, took
    assert max(worst.values()) < FRAME_MS, worst
    assert browser.errors == [] and browser.requests == []
    return worst


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> Path:
    """The page of 128 ranks restarted 10,000 times (no message logged)."""
    tmp = tmp_path_factory.mktemp("restarted")
    out = tmp / "restarts.html"
    write_page(str(restarts_log(tmp / "restarts.log", 128, 10_000)), str(out))
    return out


@needs_browser
def test_128_ranks_and_10000_restarts_open_and_redraw_fast(browser, restarted):
    check(browser, restarted, "128 ranks x 10,000 restarts")
    drawn = browser.evaluate("inferrisPage.drawn")
    assert drawn["bands"] > 0 and drawn["lanes"] > 10
    data = data_of(restarted.read_text())
    assert len(data["epochs"]) == 10_000 and len(data["ranks"]) == 128     # every epoch placed
    # after the last restart, rank 5's band is its last process in the last epoch
    end = data["steps"]["b"][-1]
    assert "rank 5: pid 20117, epoch 10000" in hover(browser, "rank 5", 5, (end - 1000, end + 1000))


def hover(browser, label: str, dy: float, view: tuple[float, float] | None = None) -> str:
    """The tip over lane `label`, dy px into it, in the middle of `view` (default: the whole run)."""
    lane = browser.evaluate(f"inferrisPage.lanes().find(l => l.label === {label!r})")
    shown = "inferrisPage.fit()" if view is None else f"inferrisPage.setView({view[0]}, {view[1]})"
    browser.evaluate(f"inferrisPage.scrollTo({lane['y'] - 40}); {shown}")
    where = browser.evaluate(f"(() => {{ const r = document.getElementById('cv').getBoundingClientRect(); "
                             f"return {{x: r.left + 172 + (r.width - 172) / 2, "
                             f"y: r.top + 24 + 40 + {dy}}}; }})()")
    browser.evaluate("document.getElementById('tip').textContent = ''")
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": where["x"], "y": where["y"]})
    return browser.wait_for("document.getElementById('tip').innerText", 10)


@needs_browser
def test_a_restarted_run_with_every_message_opens_and_redraws_fast(browser, tmp_path):
    out = tmp_path / "real32.html"
    write_page(str(restarts_log(tmp_path / "real32.log", 32, 1_500, messages=True)), str(out))
    check(browser, out, "32 ranks x 1,500 restarts, every message")
    assert browser.evaluate("inferrisPage.failedAttempts") == 1_500


@pytest.fixture(scope="module")
def lanes(tmp_path_factory) -> tuple[Path, Path, float, int]:
    """(log, page, seconds to build, the builder's peak RSS in kB) of 200 request lanes changing
    state at every step for 40,000 steps, the page built in a process of its own."""
    tmp = tmp_path_factory.mktemp("lanes")
    log, out = lanes_log(tmp / "lanes.log", 200, 40_000), tmp / "lanes.html"
    build = ("import resource, sys, time\nfrom inferris_dist.page import write_page\n"
             "t = time.perf_counter()\nwrite_page(sys.argv[1], sys.argv[2])\n"
             "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", build, str(log), str(out)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    took, rss = done.stdout.split()
    return log, out, float(took), int(rss)


def test_200_lanes_changing_every_step_for_40000_steps_make_a_page_under_10_mb(lanes):
    log, out, took, rss = lanes
    size = out.stat().st_size
    print(f"\n200 lanes x 40,000 steps: log {log.stat().st_size / 1e6:.1f} MB, page {size / 1e6:.2f} MB, "
          f"built in {took:.1f} s, peak RSS {rss / 1024:.0f} MiB")
    assert size < 10_000_000 and rss < 400 * 1024, (size, rss)
    data = data_of(out.read_text())
    rq = data["requests"]
    assert len(rq["ids"]) == 200 and len(data["steps"]["step"]) == 40_000
    segments = [(len(lane) - 1) // 2 for lane in rq["lanes"]]
    assert sum(segments) <= SEGMENT_BUDGET and max(segments) <= SEGMENT_BUDGET // 200
    assert rq["changes"] == 200 * 40_000 and rq["coarse"] == 200
    [note] = [n for n in data["notes"] if "request lane(s) changed state" in n]
    assert note.startswith("200 request lane(s) changed state more often than their share") and \
        f"{200 * 40_000} segments drawn as {sum(segments)}" in note, note
    # a lane running every other step is, at any coarser resolution, changing all along
    assert all(lane[1] == CHANGING for lane in rq["lanes"])
    assert all(info[1] == 39_999 and info[3] == 20_000 for info in rq["info"])


@needs_browser
def test_200_lanes_for_40000_steps_open_and_redraw_fast(browser, lanes):
    _, out, _, _ = lanes
    check(browser, out, "200 lanes x 40,000 steps")
    assert browser.evaluate("inferrisPage.requestLanes") == 200
    # over a lane kept coarser, the pointer says what its segments stand for
    tip = hover(browser, "r7", 6)
    assert tip.startswith("r7: changing state (waiting and running by turns"), tip


@needs_browser
def test_the_biggest_numbers_open_and_redraw_fast(browser, tmp_path):
    out = tmp_path / "numbers.html"
    out.write_text(build_page(hostile_numbers()))
    check(browser, out, "the biggest numbers")
