"""The page of a wire log (`inferris-dist html WIRELOG -o FILE`, `launch --html FILE`): one
self-contained file that opens offline in any browser.

The page shows what crossed the executor boundary, on one time axis: a lane for the
scheduler's phases, one per rank (its processes and epochs, each plan's round trip with
the rank's own decode, execute and encode inside it, the one whose result the join waited
for marked at its end, audits, joins and rejoin waits), the
losses, restarts, resizes and refused peers where they happened, counter tracks, and a lane per
request; above them, when the world changed size (`resize` events), a small chart of its size
over the steps, the size the run asked for marked. A click on a step lists each rank's arrival
at the join (a bar from 0 to how far behind the first its result came, the last marked), its
plan item by item, every rank's result and the join, as `inferris-dist inspect WIRELOG --step K`
prints them.

Nothing on the page comes from elsewhere: the script, the style and the data are in the
file, a Content-Security-Policy allows only those (by hash) and no connection at all. The
data is one JSON block, read by the script with JSON.parse; every text from the log is put
on the page as text (textContent), never as markup.

The page's size is bounded whatever the log holds: a plan sent to every rank of an attempt
is kept once, identical results once, every kind of span and mark has its budget (model.py),
and past a budget the detail is dropped, with a note at the top of the page that says so,
by kind. What building and drawing the page cost is bounded too: no number from the log sizes
a loop or an allocation, and the page's script finds what is in view by binary search and
draws at most one thing of a kind a pixel.
The log is read as a careful reader would (wirelog/logread, lenient): lines longer than
MAX_LINE are skipped, at most MAX_READ bytes are read, a line that is not a record (or a
record that is malformed) is skipped and counted, a line cut short at the end is said to be
so, and unknown events are ignored.

Times are the scheduler's monotonic clock. A rank on this host reads the same clock (the
run record says `shared_clock`); a rank elsewhere has its own, placed on the scheduler's,
process by process, by the offset of its fastest round trip (NTP's midpoint estimate).

The parts: model.py reads the records into bounded state, data.py makes the page's data of
it, and this module puts the data in the page: page.html with page.css and page.js (package
data, each put in whole, allowed by its hash) around it.

A link opens the page on a step (PAGE#step=K) or a stretch of the run (PAGE#t=A-B, seconds
since it began), or both (#step=K&t=A-B); once up, the page's address follows what it shows.

The page keeps a read-only `window.inferrisPage` (lanes, steps, marks, attempts failed and
void, attempts with arrivals, what the last frame drew, the stretch "fit" shows, stepPoint(K), focusStep(K),
setView(a, b, y), scrollTo(y), select(K), parseLink(hash)) for tests, and for anyone at its
console.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import os
import re
from importlib import resources
from typing import Any, Iterable

from inferris_dist.engine import WorkloadError
from inferris_dist.page.data import page_data
from inferris_dist.page.model import BODY_BUDGET, KNOWN_EVENTS, MAX_REQUEST_LANES, Builder
from inferris_dist.wirelog.logread import LogReader
from inferris_dist.words import shown

__all__ = ["build_page", "page_html", "write_page", "read_log", "asset", "MAX_LINE", "MAX_READ",
           "BODY_BUDGET", "KNOWN_EVENTS", "MAX_REQUEST_LANES"]

MAX_LINE = 4 << 20          # a longer line is skipped (read in pieces, never held whole)
MAX_READ = 1 << 30          # bytes read from one log at most
ASSETS = ("page.html", "page.css", "page.js", "live.js")   # package data, beside this module


def read_log(path: str) -> LogReader:
    """A wire log as the page reads it: leniently (bad lines skipped and counted, said in the
    reader's notes), within the page's bounds."""
    return LogReader(path, strict=False, command="html", max_line=MAX_LINE, max_read=MAX_READ)


@functools.cache
def asset(name: str) -> str:
    """The text of one of the page's files (ASSETS), read once. Put in the page whole: the
    policy allows the style and the script by the hash of exactly this text."""
    if name not in ASSETS:
        raise ValueError(f"no page asset {name!r}")
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _embed(data: dict) -> str:
    """The data as JSON that cannot end its <script> element: every <, > and & escaped."""
    try:
        text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except ValueError:          # a number that is not one slipped through: JSON has no NaN
        text = json.dumps(finite(data), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def finite(v: Any) -> Any:
    """JSON-safe: a float that is not finite becomes null, in lists and dicts too."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, list):
        return [finite(x) for x in v]
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    return v


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def build_page(records: Iterable[dict], title: str | None = None) -> str:
    """The page of a wire log's records (dicts as read from its lines). Never fails on what
    the records hold: what cannot be used is skipped and counted in a note on the page. If
    `records` has a `notes` attribute once iterated (a LogReader), those notes lead the page's."""
    b = Builder()
    for obj in records:
        b.add(obj)
    notes = list(getattr(records, "notes", []) or [])
    run_name = b.run.get("name") if b.run and isinstance(b.run.get("name"), str) else ""
    title = title if title else f"inferris-dist · {run_name or 'wire log'}"
    return page_html(page_data(b, title, notes), title)


def page_html(data: dict, title: str, live: bool = False) -> str:
    """The page of the data `page_data` made. `live` (a page served while its run goes on,
    `launch --serve`): live.js before the page's script, in the same element, and the policy
    lets it connect to where the page came from (`connect-src 'self'`), for the run's news."""
    markup, style, script = asset("page.html"), asset("page.css"), asset("page.js")
    if live:
        script = asset("live.js") + script
    connect = "'self'" if live else "'none'"
    csp = (f"default-src 'none'; script-src '{_hash(script)}'; style-src '{_hash(style)}'; "
           f"img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'")
    fill = {"CSP": csp, "TITLE": html.escape(shown(title), quote=True), "STYLE": style,
            "SCRIPT": script, "DATA": _embed(data)}
    # one pass: what is put in (a title, the data) is never looked at again
    return re.sub(r"@(CSP|TITLE|STYLE|SCRIPT|DATA)@", lambda m: fill[m.group(1)], markup)


def write_page(wirelog_path: str, out_path: str, title: str | None = None) -> None:
    """Read a wire log and write its page. Bad input (no such log, not a wire log, an output
    that cannot be written) raises WorkloadError with one line saying which."""
    try:
        same = os.path.exists(out_path) and os.path.samefile(wirelog_path, out_path)
    except OSError:
        same = False
    if same:
        raise WorkloadError(f"html: {shown(str(out_path))} is the wire log itself: not overwritten")
    page = build_page(read_log(wirelog_path), title)
    try:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise WorkloadError(f"html: cannot write {shown(str(out_path))}: {e.strerror or e}") from None
