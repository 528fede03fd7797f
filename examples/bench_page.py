"""What the page costs: synthetic wire logs that strain it, their pages built and opened in
headless Chromium.

    python examples/bench_page.py [--logs restarts,real32,lanes] [--frames 9] [--scale 1] [--keep DIR]

The logs (tests/helpers/pagelogs.py writes them in the writer's format):
- restarts: 128 ranks, 10,000 restarts (each a loss, a failed attempt, a new member and the
  step joined again), no message logged;
- real32: 32 ranks, 1,500 restarts, every plan, result and handshake logged;
- lanes: 200 request lanes changing state at every step for 40,000 steps.
(`--scale F`: F times as many restarts and steps.)

For each: the log's size; the page's build (`inferris-dist html`, in a process of its own:
its wall time and peak RSS) and size; in the browser (/usr/bin/chromium, driven as the page
tests drive it), the time from navigating to the page's first frame, and the time of one
frame (the median and the worst of --frames each): the whole run (fit), a tenth of it, a
pan by a third of that, and the lanes scrolled to the middle. `--source DIR` builds the pages
with the inferris_dist found in DIR (another checkout) instead of this one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.browser import CHROMIUM, Browser  # noqa: E402  (the page tests' browser client)
from tests.helpers.pagelogs import lanes_log, restarts_log  # noqa: E402

LOGS = {           # name: (what it is, its writer given a path and how many restarts or steps)
    "restarts": ("128 ranks x {:,} restarts", 10_000, lambda p, n: restarts_log(p, 128, n)),
    "real32": ("32 ranks x {:,} restarts, with messages", 1_500,
               lambda p, n: restarts_log(p, 32, n, messages=True)),
    "lanes": ("200 request lanes x {:,} steps", 40_000, lambda p, n: lanes_log(p, 200, n)),
}
BUILD = """
import resource, sys, time
from inferris_dist.page import write_page
started = time.perf_counter()
write_page(sys.argv[1], sys.argv[2])
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
FRAME = """(() => {{ const t = performance.now(); {what}; return performance.now() - t; }})()"""


def build(log: Path, page: Path, source: str | None) -> tuple[float, int]:
    """Seconds to build the page and the builder's peak RSS in kB."""
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    # run from the log's directory: the checkout the bench runs in is not put first on the path
    done = subprocess.run([sys.executable, "-c", BUILD, str(log.resolve()), str(page.resolve())], env=env,
                          cwd=log.parent, capture_output=True, text=True, check=True)
    took, rss = done.stdout.split()
    return float(took), int(rss)


def frames(b: Browser, what: str, n: int) -> tuple[float, float]:
    took = [b.evaluate(FRAME.format(what=what), timeout=120) for _ in range(n)]
    return statistics.median(took), max(took)


def scrolled(b: Browser, y: int, n: int) -> tuple[float, float] | None:
    """A whole-run frame with the lanes scrolled to y (a page without scrollTo: None)."""
    if not b.evaluate("typeof inferrisPage.scrollTo === 'function'"):
        return None
    b.evaluate(f"inferrisPage.scrollTo({y})")
    return frames(b, "inferrisPage.fit()", n)


def in_browser(page: Path, n: int) -> dict:
    with Browser(1400, 900, timeout=300) as b:
        started = time.perf_counter()
        b.open(page, timeout=300)
        b.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0", timeout=300)
        opened = time.perf_counter() - started
        view = b.evaluate("inferrisPage.view")
        a, z = view[0], view[1]
        tenth = (z - a) / 10
        mid = a + (z - a) / 2
        lanes = b.evaluate("inferrisPage.lanes()")
        height = lanes[-1]["y"] + lanes[-1]["h"]
        out = {"open_s": opened,
               "fit": frames(b, "inferrisPage.fit()", n),
               "tenth": frames(b, f"inferrisPage.setView({mid - tenth / 2}, {mid + tenth / 2})", n),
               "pan": frames(b, f"inferrisPage.setView({mid - tenth / 6}, {mid + tenth * 5 / 6})", n),
               "scrolled": scrolled(b, height // 2, n)}
        if b.errors:
            raise SystemExit(f"{page}: errors in the browser: {b.errors[:3]}")
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default=",".join(LOGS), help="which logs, comma-separated: " + ", ".join(LOGS))
    ap.add_argument("--frames", type=int, default=9, help="frames timed of each kind")
    ap.add_argument("--keep", metavar="DIR", help="write the logs and pages there (and keep them)")
    ap.add_argument("--source", metavar="DIR", help="build the pages with the inferris_dist in DIR")
    ap.add_argument("--no-browser", action="store_true", help="build the pages only")
    ap.add_argument("--scale", type=float, default=1.0, help="this many times the restarts and steps")
    args = ap.parse_args()
    browse = not args.no_browser
    if browse and not Path(CHROMIUM).exists():
        print(f"no {CHROMIUM}: the pages are built, not opened")
        browse = False
    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-page-"))
    where.mkdir(parents=True, exist_ok=True)
    for name in args.logs.split(","):
        what, count, write = LOGS[name]
        count = max(2, round(count * args.scale))
        what = what.format(count)
        log, page = where / f"{name}.log", where / f"{name}.html"
        write(log, count)
        took, rss = build(log, page, args.source)
        print(f"{name}: {what}: log {log.stat().st_size / 1e6:.1f} MB, "
              f"page {page.stat().st_size / 1e6:.2f} MB, built in {took:.1f} s, "
              f"peak RSS {rss / 1024:.0f} MiB")
        if browse:
            r = in_browser(page, args.frames)
            said = ", ".join(f"{k} {v[0]:.0f} ms (worst {v[1]:.0f})" for k, v in r.items()
                             if k != "open_s" and v is not None)
            print(f"  in Chromium: opened in {r['open_s']:.2f} s; a frame: {said}")
        sys.stdout.flush()
        if not args.keep:
            log.unlink()
            page.unlink()
    if not args.keep:
        os.rmdir(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
