"""`inferris-dist html`: a wire log as one self-contained page, checked as built and in a browser.

Without a browser:
1. what a log holds cannot break out of the page: a request id that closes the data's
   <script> is data, the title is escaped, and no URL appears but inside the data;
2. a malformed, truncated or hostile log still makes a page, with what was skipped counted
   in a note; unknown events are ignored; an idle stretch is one record, never expanded;
3. bad input to `html` (no such file, not a wire log, an output that cannot be written, the
   log as its own output) is one line on stderr and exit status 2;
4. a 10,000-step, 16-rank log gives a page of bounded size;
5. the page's own files (inferris_dist/page: page.html, page.css, page.js) are put in whole, the
   policy allowing the style and the script by their hashes, and the script parses
   (`node --check`, skipped with the reason where node is not installed).

In a real browser (Debian's chromium, driven over the DevTools protocol by tests/browser.py,
skipped with the reason when it is not installed):
6. the page of a real faulted run loads from file:// with no request beyond the file and no
   console error, has a lane per rank and every step, shows the loss and the restart, and a
   click on a step shows its plan item by item;
7. a hostile request id is shown as text (no script of its runs);
8. the 10,000-step, 16-rank page loads and redraws without error.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from inferris_dist import page as page_module
from inferris_dist.page import build_page, read_log, write_page

from tests.helpers.external import CLI, ENV, GOLDEN, REPO

pytestmark = [pytest.mark.timeout(120), pytest.mark.procs]

CHROMIUM = Path("/usr/bin/chromium")
needs_browser = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: the page is "
                                   "tested in a browser only where Debian's chromium is installed")
HOSTILE = "</script><script>alert(1)</script>"
BIG_STEPS, BIG_RANKS = 10_000, 16
MAX_PAGE = 20 * 1024 * 1024


def html_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "html", *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def data_of(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def outside_data(page: str) -> str:
    return re.sub(r'(<script type="application/json" id="data">).*?(</script>)', r"\1\2", page, flags=re.S)


# -- logs: a real faulted run, and synthetic ones written by the format ------------------------

@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> tuple[Path, Path]:
    """(wire log, page) of `launch --world-size 4 --spec examples/faulty.spec.json
    --on-rank-loss restore`: rank 2 crashes at step 3 and is restored."""
    tmp = tmp_path_factory.mktemp("faulted")
    log, out = tmp / "faulty.log", tmp / "faulty.html"
    done = subprocess.run([*CLI, "launch", "--world-size", "4", "--spec", "examples/faulty.spec.json",
                           "--on-rank-loss", "restore", "--wire-log", str(log)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    made = html_cli(str(log), "-o", str(out))
    assert made.returncode == 0 and not made.stderr, made.stderr
    return log, out


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Synthetic:
    """A wire log written by its format, fast: each plan and result body
    serialised once and written for every rank. Ranks on other hosts, each clock offset;
    a rank lost and restored half way, with a rejoin wait; audits; an idle stretch of a
    million steps; notes; refused peers."""

    def __init__(self, path: Path, steps: int, ranks: int, request_id=lambda n: f"req-{n}",
                 idle_at: int | None = None, idle_len: int = 1_000_000, lose_at: int | None = None,
                 audit_every: int = 1000, end: bool = True):
        self.rng = random.Random(7)
        self.t = 100.0
        self.out = open(path, "w")
        self.ranks = ranks
        self.offsets = [0.0013 * r - 0.004 for r in range(ranks)]
        self.pids = [5000 + r for r in range(ranks)]
        self.epoch = 0
        self.request_id = request_id
        self.steps = steps
        self.idle_at, self.idle_len = idle_at, idle_len
        self.lose_at = lose_at if lose_at is not None else steps // 2
        self.audit_every = audit_every
        self.end = end

    def write(self, **obj) -> None:
        self.out.write(json.dumps(obj) + "\n")

    def tick(self, dt: float) -> float:
        self.t += dt
        return round(self.t, 6)

    def run(self) -> None:
        n = self.ranks
        self.write(t=self.tick(0), event="run", name="synthetic", world_size=n, rung="full",
                   policy="restore", faults=[f"{n // 2}:crash@{self.lose_at}"],
                   config={"max_step_tokens": 64, "page_size": 16, "num_pages": 512, "spec_len": 0,
                           "world_size": n}, requests=0, scheduler_pid=4000, address="tcp://10.0.0.1:5555",
                   shared_clock=False)
        for r in range(n):
            self.join(r)
        running: dict[str, list] = {}      # id -> [start, left, pages]
        waiting: list[str] = []
        made = 0
        step = 0
        done = 0
        while done < self.steps:
            if step == self.idle_at:
                self.write(t=self.tick(0.05), event="idle", first=step, last=step + self.idle_len - 1,
                           text="empty plans, answered by the scheduler: no round trip")
                step += self.idle_len
                continue
            admitted = []
            while len(running) + len(waiting) < 5:
                rid = self.request_id(made)
                made += 1
                waiting.append(rid)
                admitted.append(rid)
            while waiting and len(running) < 3:
                rid = waiting.pop(0)
                running[rid] = [0, self.rng.randint(4, 30), [self.rng.randint(0, 511)]]
            items = []
            outcomes = []
            for i, (rid, st) in enumerate(running.items()):
                tokens = 24 if st[0] == 0 else 1
                items.append({"request_id": rid, "start_position": st[0], "num_tokens": tokens,
                              "draft_len": 0, "decode": st[0] > 0, "verdict_index": i, "placements": st[2]})
                outcomes.append({"request_id": rid, "start_position": st[0], "executed_tokens": tokens,
                                 "accepted": 0, "writes": st[2][-1:]})
            self.write(t=self.tick(0.0002), event="phase", phase="prepare", step=step, dur=0.00004)
            if done == self.lose_at:
                self.lose(step, items, outcomes)
            t0 = self.t
            verdict = self.attempt(step, items, outcomes)
            self.write(t=t0, event="phase", phase="execute", step=step, dur=round(self.t - t0, 6))
            self.write(t=self.tick(0.00002), event="attempt", step=step, epoch=self.epoch, verdict=verdict,
                       plan_bytes=15 * len(items))
            finished = {}
            for rid, st in list(running.items()):
                st[0] += 24 if st[0] == 0 else 1
                st[1] -= 1
                if st[1] <= 0:
                    finished[rid] = "LENGTH"
                    del running[rid]
            self.write(t=self.tick(0.00003), event="phase", phase="commit", step=step, dur=0.00002)
            trace = {"step": step, "admitted": admitted, "scheduled": [i["request_id"] for i in items],
                     "executed": {i["request_id"]: i["num_tokens"] for i in items},
                     "sampled": {i["request_id"]: "TOKEN" for i in items}, "finished": finished,
                     "preempted": [], "reused": {}, "published": {}, "evicted": [], "drafted": {},
                     "accepted": {}, "rolled_back": {}}
            counters = {"requests_running": len(running), "requests_waiting": len(waiting),
                        "requests_preempted": 0, "pages_used": 2 * len(running),
                        "pages_free": 512 - 2 * len(running),
                        "pages_cached": step % 17, "prefix_hit_tokens": 0, "drafted_tokens": 0,
                        "accepted_tokens": 0, "batch_tokens": sum(i["num_tokens"] for i in items),
                        "batch_requests": len(items)}
            self.write(t=self.tick(0.00001), event="step", step=step, epoch=self.epoch, trace=trace,
                       counters=counters)
            if self.audit_every and done % self.audit_every == self.audit_every - 1:
                self.audit(step)
            step += 1
            done += 1
        self.write(t=self.tick(0.001), event="turned-away", messages={"peer tcp://10.9.9.9:4242": 3},
                   connections={"10.9.9.9": 1})
        for r in range(n):
            self.message("out", r, 0, "STOP", 1, [])
        if self.end:
            self.write(t=self.tick(0.0001), event="end", status="ok", error=None, steps=step)
        self.out.close()

    def message(self, direction: str, rank: int, step: int, kind: str, size: int, body, **extra) -> None:
        self.write(t=self.tick(0.00001), dir=direction, rank=rank, epoch=self.epoch, step=step, type=kind,
                   bytes=size, body=body, **extra)

    def join(self, r: int) -> None:
        self.message("in", r, 0, "HELLO", 38, {"pid": self.pids[r], "proof": ""})
        self.message("out", r, 0, "CONFIG", 12, {"num_pages": 512, "page_size": 16, "shard": []})
        self.message("in", r, 0, "READY", 1, [])
        self.write(t=self.tick(0.00001), event="member", rank=r, epoch=self.epoch, pid=self.pids[r],
                   host=f"node{r // 4}.example")

    def attempt(self, step: int, items: list, outcomes: list, lost: int | None = None) -> str:
        plan = json.dumps({"step": step, "items": items})
        result = json.dumps(outcomes)
        sent = []
        for r in range(self.ranks):
            t = self.tick(0.000004)
            sent.append(t)
            self.out.write(f'{{"t": {t}, "dir": "out", "rank": {r}, "epoch": {self.epoch}, "step": {step}, '
                           f'"type": "PLAN", "bytes": {15 * len(items)}, "body": {plan}}}\n')
        for r in range(self.ranks):
            if r == lost:
                continue
            rtt = 0.0003 + 0.00002 * r + self.rng.random() * 0.0001
            back = round(sent[r] + rtt, 6)
            off = self.offsets[r]
            got = sent[r] + 0.0001 + off
            inside = ", ".join(repr(round(x, 6)) for x in (got, got + 0.00002, got + 0.00006, got + 0.00007))
            self.out.write(f'{{"t": {back}, "dir": "in", "rank": {r}, "epoch": {self.epoch}, "step": {step}, '
                           f'"type": "RESULT", "bytes": {11 * len(items)}, "body": {result}, '
                           f'"sent": {sent[r]}, "rtt": {round(rtt, 6)}, "inside": [{inside}]}}\n')
        self.t = max(self.t, sent[-1] + 0.0006)
        return "joined" if lost is None else f"rank {lost} lost (died)"

    def lose(self, step: int, items: list, outcomes: list) -> None:
        """The lost rank's attempt, its recovery, the wait for its replacement."""
        lost = self.ranks // 2
        verdict = self.attempt(step, items, outcomes, lost=lost)
        self.write(t=self.tick(0.01), event="rank-lost", rank=lost, ranks=[lost], step=step,
                   epoch=self.epoch, reason="died",
                   message=f"rank {lost} died before answering step {step} (killed by SIGKILL)")
        self.write(t=self.tick(0.00001), event="attempt", step=step, epoch=self.epoch, verdict=verdict,
                   plan_bytes=15 * len(items))
        start = self.tick(0.00001)
        self.epoch += 1
        self.pids[lost] += 100
        self.write(t=self.tick(0.00001), event="restart", ranks=[lost], epoch=self.epoch, step=step,
                   shard_pages=12, policy="restore", pids=[self.pids[lost]])
        wait = self.t
        self.join(lost)
        self.tick(0.3)
        self.write(t=round(wait, 6), event="rejoin-wait", ranks=[lost], dur=round(self.t - wait, 6),
                   joined=True)
        self.write(t=start, event="phase", phase="recover", step=step, dur=round(self.t - start, 6))
        self.write(t=self.tick(0.00001), event="note", rank=0, epoch=self.epoch,
                   text="dropped a stale RESULT from rank 0 (epoch 0) while starting ranks")

    def audit(self, step: int) -> None:
        for r in range(self.ranks):
            self.message("out", r, step, "AUDIT", 1, [])
        for r in range(self.ranks):
            self.message("in", r, step, "SHARD", 97, [[0, [["req-0", 0, 15]]]])
        self.write(t=self.tick(0.00001), event="audit", step=step, epoch=self.epoch)


def synthetic(path: Path, steps: int = 40, ranks: int = 4, **kw) -> Path:
    Synthetic(path, steps, ranks, **kw).run()
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, Path, float]:
    """(log, page, seconds to build it) of 10,000 steps on 16 ranks."""
    tmp = tmp_path_factory.mktemp("big")
    log = synthetic(tmp / "big.log", BIG_STEPS, BIG_RANKS, idle_at=2000)
    out = tmp / "big.html"
    started = time.monotonic()
    write_page(str(log), str(out))
    return log, out, time.monotonic() - started


# -- 1. nothing breaks out --------------------------------------------------------------------

def test_a_request_id_cannot_close_the_data_block(tmp_path):
    log = synthetic(tmp_path / "hostile.log", 6, 2, request_id=lambda n: HOSTILE if n == 1 else f"r{n}")
    page = build_page(read_log(str(log)), title=f"<b>{HOSTILE}</b>")
    assert HOSTILE not in page and "alert(1)</script>" not in page
    assert page.count("</script>") == 2 and page.count("<script") == 2      # the data, the script
    assert "&lt;b&gt;" in page                                               # the title, escaped
    data = data_of(page)
    assert HOSTILE in data["requests"]["ids"]                                # and yet it is all there
    assert HOSTILE in json.dumps(data["plans"])


def test_no_url_outside_the_data(tmp_path, faulted):
    _, out = faulted
    page = out.read_text()
    assert not re.search(r"https?://", page), re.findall(r".{40}https?://.{40}", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # a URL the log holds (a peer's address) is data, shown as text, nowhere else
    log = synthetic(tmp_path / "url.log", 6, 2, request_id=lambda n: f"https://example.com/{n}")
    page = build_page(read_log(str(log)))
    assert re.search(r"https?://", page)
    assert not re.search(r"https?://", outside_data(page))


# -- 2. whatever the log holds, a page ----------------------------------------------------------

def test_malformed_lines_are_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(page_module, "MAX_LINE", 4096)
    good = lines_of(synthetic(tmp_path / "good.log", 8, 2))
    bad = ["not json at all", "[1, 2, 3]", '"a string"', "{}", '{"event": 7, "t": 1}',
           '{"event": "phase", "t": "soon", "phase": "prepare", "dur": 1}',
           '{"event": "phase", "t": 101, "phase": "lunch", "dur": 1}',
           '{"t": NaN, "dir": "out", "rank": 0, "epoch": 0, "step": 1, "type": "PLAN", "body": {}}',
           '{"t": 101, "dir": "out", "rank": true, "epoch": 0, "step": 1, "type": "PLAN", "bytes": 1}',
           '{"t": 101, "dir": "out", "rank": 99999999, "epoch": 0, "step": 1, "type": "PLAN", "bytes": 1}',
           '{"t": 101, "dir": "out", "rank": 0, "epoch": 0, "step": 1, "type": "PLAN", "body": {"items": 3}}',
           '{"t": 1e400, "event": "note", "text": "x"}',
           "[" * 100_000 + "]" * 100_000,
           '{"t": 101, "event": "step", "step": 3, "trace": {"admitted": [1, {"x": []}]}, "counters": 5}',
           '{"t": 101, "event": "note", "text": "' + "x" * 10_000 + '"}']
    path = tmp_path / "bad.log"
    with open(path, "wb") as f:
        lines = [json.dumps(x) for x in good]
        for i, b in enumerate(bad):
            lines.insert(3 + 2 * i, b)
        f.write("\n".join(lines).encode() + b"\n")
        f.write(b'{"t": 1, "event": "note", "text": "\xff\xfe bad bytes"}\n')
        f.write(b"\x00\x01\x02 binary\n")
    page = build_page(read_log(str(path)))
    data = data_of(page)
    notes = " | ".join(data["notes"])
    assert re.search(r"\d+ malformed record\(s\) skipped", notes), notes
    assert re.search(r"\d+ line\(s\) of the log are not JSON objects", notes), notes
    assert "longer than" in notes, notes
    assert data["steps"]["step"][:8] == list(range(8))          # the good records all made it


def test_a_log_cut_short_and_unknown_events(tmp_path):
    text = synthetic(tmp_path / "whole.log", 10, 3, end=False).read_text()
    cut = text[: text.rindex('"event": "step"') + 40]               # in the middle of a line
    path = tmp_path / "cut.log"
    path.write_text('{"t": 99, "event": "from-the-future", "x": 1}\n' + cut)
    data = data_of(build_page(read_log(str(path))))
    notes = " | ".join(data["notes"])
    assert "cut short" in notes and "from-the-future x1" in notes and "no end record" in notes, notes
    assert len(data["steps"]["step"]) == 9                           # the tenth step was the cut line


def test_build_page_takes_any_records():
    """What the lead's `launch --html` hands over: dicts, maybe odd ones, never a traceback."""
    records = [None, 5, "x", [], {"event": "run", "t": 1.0, "name": "odd", "world_size": "four"},
               {"event": "idle", "t": 2.0, "first": 0, "last": 10 ** 15},
               {"event": "restart", "t": 3.0, "ranks": "all", "pids": [1, "2"]},
               {"event": "rank-lost", "t": 3.0, "rank": None, "ranks": None},
               {"event": "end", "t": 4.0, "status": "failed", "error": {"kind": "RankLost", "message": "m"}},
               {"event": "member", "t": 1.5, "rank": 0, "epoch": 0, "pid": 9, "host": ["x"]}]
    data = data_of(build_page(records, "odd"))
    assert "4 malformed record(s)" in data["notes"][0]
    assert data["idle"][0][:2] == [0, 10 ** 15]                  # one stretch, not expanded
    assert data["meta"]["status"] == "failed"


def test_hostile_values_anywhere_never_break_the_builder(faulted):
    """Every field of a real log's records, in turn, replaced by values of every odd kind: the
    page is still built, and the JSON it embeds still parses."""
    records = lines_of(faulted[0])
    odd = [None, -1, 2 ** 70, 1e308, -0.0, float("nan"), "", "x" * 5000, [], {}, True, [1, "a", None],
           {"a": {"b": [1]}}, HOSTILE, "\u202e\x1b[2J"]
    rng = random.Random(11)
    for _ in range(120):
        mutated = []
        for r in records:
            r = dict(r)
            for key in rng.sample(sorted(r), k=min(len(r), rng.randint(0, 3))):
                r[key] = rng.choice(odd)
            mutated.append(r)
        page = build_page(mutated, rng.choice([None, HOSTILE]))
        assert HOSTILE not in page
        data_of(page)


def test_an_idle_million_is_not_expanded(tmp_path):
    log = synthetic(tmp_path / "idle.log", 20, 2, idle_at=5, idle_len=1_000_000)
    started = time.monotonic()
    page = build_page(read_log(str(log)))
    assert time.monotonic() - started < 5 and len(page) < 200_000
    assert data_of(page)["idle"][0][:2] == [5, 1_000_004]


def test_a_failed_run_and_an_older_log(tmp_path, faulted):
    """A run that failed (abort: rank 2's crash ends it) says so at the top; a log written
    before steps, phases and attempts were logged still gives its steps and request lanes."""
    log = tmp_path / "abort.log"
    done = subprocess.run([*CLI, "launch", "--world-size", "4", "--spec", "examples/faulty.spec.json",
                           "--wire-log", str(log)], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    data = data_of(build_page(read_log(str(log))))
    assert data["meta"]["status"] == "failed" and "RankLost" in data["meta"]["error"]
    assert [m[0] for m in data["marks"]].count(data["mark_kinds"].index("lost")) == 1
    assert data["steps"]["step"] == [0, 1, 2]

    new = {"run", "member", "phase", "attempt", "step", "audit", "rejoin-wait", "end"}
    old = [{k: v for k, v in r.items() if k not in ("sent", "rtt", "inside", "pids", "policy")}
           for r in lines_of(faulted[0]) if r.get("event") not in new]
    data = data_of(build_page(old))
    assert data["steps"]["step"] == [0, 1, 2, 3, 4, 5]
    assert sorted(data["requests"]["ids"]) == ["r0", "r1", "r2"] and data["counters"] == {}
    assert any("no step events" in n for n in data["notes"])
    verdicts = [data["strs"][a[4]] for a in data["attempts"] if a[0] == 3]
    assert verdicts == ["rank 2 lost (died)", "joined"]


# -- 3. bad input: one line, exit 2 -------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "not-a-log", "binary", "empty", "unwritable", "itself"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    log = synthetic(tmp_path / "ok.log", 3, 2)
    out = tmp_path / "out.html"
    if case == "missing":
        args = [str(tmp_path / "nope.log"), "-o", str(out)]
    elif case == "not-a-log":
        (tmp_path / "x.txt").write_text("hello\n" * 2000)
        args = [str(tmp_path / "x.txt"), "-o", str(out)]
    elif case == "binary":
        (tmp_path / "x.bin").write_bytes(bytes(range(256)) * 100)
        args = [str(tmp_path / "x.bin"), "-o", str(out)]
    elif case == "empty":
        (tmp_path / "x.log").write_text("")
        args = [str(tmp_path / "x.log"), "-o", str(out)]
    elif case == "unwritable":
        args = [str(log), "-o", str(tmp_path / "no-such-dir" / "p.html")]
    else:
        args = [str(log), "-o", str(log)]
    done = html_cli(*args)
    assert done.returncode == 2, done
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert not out.exists()
    if case == "itself":
        assert log.read_text().startswith('{"t"')


# -- 4. a big log, a bounded page --------------------------------------------------------------

def test_a_10000_step_16_rank_page_is_bounded(big):
    log, out, took = big
    size = out.stat().st_size
    data = data_of(out.read_text())
    print(f"\n{BIG_STEPS} steps x {BIG_RANKS} ranks: log {log.stat().st_size / 2**20:.1f} MiB, "
          f"page {size / 2**20:.2f} MiB, built in {took:.1f} s")
    assert size < MAX_PAGE
    assert len(data["steps"]["step"]) == BIG_STEPS and len(data["ranks"]) == BIG_RANKS
    assert len(data["attempts"]) == BIG_STEPS + 1                    # and the one lost at half way
    rows = [row for a in data["attempts"] for row in a[7]]
    assert len(rows) == (BIG_STEPS + 1) * BIG_RANKS                # a round trip per rank and plan
    assert sum(row[2] < 0 for row in rows) == 1                      # one of them lost
    assert len(data["requests"]["ids"]) == page_module.MAX_REQUEST_LANES
    assert data["requests"]["more"] > 0
    plans = sum(len(json.dumps(p)) for p in data["plans"])
    assert len(data["plans"]) <= len(data["attempts"]) and plans <= page_module.BODY_BUDGET * 2


# -- 5. the page's own files -------------------------------------------------------------------

def test_the_style_and_the_script_are_allowed_by_their_hashes(tmp_path):
    page = build_page(read_log(str(synthetic(tmp_path / "small.log", 3, 2))))
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    for tag, name in (("style", "page.css"), ("script", "page.js")):
        inline = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.S)
        assert inline == [page_module.asset(name)], tag                  # the file, whole
        digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
        assert f"{tag}-src 'sha256-{digest}'" in policy, (tag, policy)
    assert "@" + "SCRIPT@" not in page and "@" + "DATA@" not in page   # every slot filled


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="no node on PATH: the page's script is checked by the "
                    "browser tests only")
def test_the_script_parses():
    script = Path(page_module.__file__).with_name("page.js")
    done = subprocess.run([NODE, "--check", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


# -- in a browser ----------------------------------------------------------------------------

@pytest.fixture
def browser():
    from tests.helpers.browser import Browser
    with Browser(1400, 900) as b:
        yield b


def loaded(browser, path: Path, timeout: float = 20) -> None:
    browser.open(path, timeout=timeout)
    browser.wait_for("document.body.dataset.ready === '1' && window.inferrisPage.frames > 0", timeout)


@needs_browser
def test_the_faulted_runs_page_in_a_browser(browser, faulted):
    log, out = faulted
    records = lines_of(log)
    plans = {}
    for r in records:
        if r.get("type") == "PLAN":
            plans.setdefault(r["step"], [i["request_id"] for i in r["body"]["items"]])
    committed = sorted({r["step"] for r in records if r.get("event") == "step"} or plans)
    loaded(browser, out)
    page = browser.evaluate("({ranks: inferrisPage.rankLanes, steps: inferrisPage.stepNumbers, "
                            "committed: inferrisPage.steps, marks: inferrisPage.marks, "
                            "drawn: inferrisPage.drawn, lanes: inferrisPage.lanes()})")
    assert page["ranks"] == 4
    labels = [lane["label"] for lane in page["lanes"] if lane["kind"] == "rank"]
    assert labels == [f"rank {r}" for r in range(4)]
    as_text = browser.evaluate("[...document.querySelectorAll('#lanes li')].map(li => li.textContent)")
    assert [t.split(":")[0] for t in as_text if t.startswith("rank")] == labels   # in the DOM too
    assert any("\u2192" in t for t in as_text)          # the restarted rank: its old pid, then its new
    assert page["steps"] == sorted(plans) and page["committed"] == len(committed)
    assert page["marks"].get("lost", 0) >= 1 and page["marks"].get("restart", 0) >= 1
    drawn = page["drawn"]
    assert drawn["marks"].get("lost", 0) >= 1 and drawn["marks"].get("restart", 0) >= 1
    assert drawn["steps"] == len(committed) and drawn["roundTrips"] > 0
    for step in (2, 3):
        if step == 2:
            browser.evaluate("inferrisPage.focusStep(2)")           # zoomed in, as a user would
        else:
            browser.evaluate("inferrisPage.fit()")                   # the whole run: step 3 is wide
        where = browser.evaluate(f"inferrisPage.stepPoint({step})")
        browser.click(where["x"], where["y"])
        browser.wait_for(f"inferrisPage.selected === {step}")
        text = browser.evaluate("document.getElementById('detail').innerText")
        assert f"step {step}, epoch 0: plan of" in text
        for rid in plans[step]:
            assert rid in text
    assert "rank 2 lost" in text and "join: joined" in text              # step 3: the loss, the retry
    # the buttons and the keyboard walk the steps; hovering says what is there; a drag pans
    browser.evaluate("document.getElementById('next').click()")
    browser.wait_for("inferrisPage.selected === 4")
    browser.send("Input.dispatchKeyEvent", {"type": "keyDown", "key": "["})
    browser.wait_for("inferrisPage.selected === 3")
    where = browser.evaluate("inferrisPage.stepPoint(3)")
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": where["x"], "y": where["y"]})
    assert "step 3 (epoch 1)" in browser.wait_for("document.getElementById('tip').innerText")
    before = browser.evaluate("inferrisPage.view")
    for kind, dx in (("mousePressed", 0), ("mouseMoved", 120), ("mouseReleased", 120)):
        browser.send("Input.dispatchMouseEvent", {"type": kind, "x": where["x"] + dx, "y": where["y"] + 40,
                                                  "button": "left", "clickCount": 1})
    after = browser.evaluate("inferrisPage.view")
    assert after[0] < before[0] and browser.evaluate("inferrisPage.selected") == 3   # panned, not a click
    assert browser.errors == [] and browser.requests == [] and browser.dialogs == []


@needs_browser
def test_a_hostile_request_id_is_text(browser, tmp_path):
    log = synthetic(tmp_path / "hostile.log", 6, 2, request_id=lambda n: HOSTILE if n == 1 else f"r{n}")
    out = tmp_path / "hostile.html"
    write_page(str(log), str(out), title=HOSTILE)
    loaded(browser, out)
    browser.evaluate("inferrisPage.focusStep(2)")
    where = browser.evaluate("inferrisPage.stepPoint(2)")
    browser.click(where["x"], where["y"])
    browser.wait_for("inferrisPage.selected === 2")
    assert HOSTILE in browser.evaluate("document.getElementById('detail').innerText")
    assert browser.evaluate("document.title") == HOSTILE
    assert browser.evaluate("document.querySelectorAll('script').length") == 2
    assert browser.dialogs == [] and browser.errors == [] and browser.requests == []


@needs_browser
def test_the_big_page_loads_and_redraws(browser, big):
    _, out, _ = big
    started = time.monotonic()
    loaded(browser, out, timeout=40)
    took = time.monotonic() - started
    page = browser.evaluate("({ranks: inferrisPage.rankLanes, steps: inferrisPage.steps, "
                            "requests: inferrisPage.requestLanes, notes: inferrisPage.notes})")
    assert page["ranks"] == BIG_RANKS and page["steps"] == BIG_STEPS and page["requests"] == 200
    # a whole-run frame and a zoomed one, timed in the page
    redraw = browser.evaluate("(() => { const t = performance.now(); inferrisPage.fit(); "
                              "return performance.now() - t; })()")
    assert browser.evaluate("inferrisPage.drawn.roundTrips") > 0
    for _ in range(3):
        browser.wheel(700, 300, -400)                                    # zoom in, at the pointer
    browser.wait_for("inferrisPage.view[1] - inferrisPage.view[0] < 0.5 * "
                     "(JSON.parse(document.getElementById('data').textContent).span[1])")
    browser.evaluate("inferrisPage.focusStep(5000)")
    print(f"\nbig page: loaded in {took:.1f} s, a whole-run frame in {redraw:.0f} ms")
    assert redraw < 1000
    assert browser.errors == [] and browser.requests == []


@needs_browser
def test_an_overlap_run_with_model_time_in_a_browser(browser, tmp_path):
    """Two plans in flight and a rank's model time: every step drawn once, each rank's round
    trips drawn, a step's plan shows its items planned ahead, nothing fetched, no error."""
    log, out = tmp_path / "overlap.log", tmp_path / "overlap.html"
    done = subprocess.run([*CLI, "launch", "--world-size", "2", "--rung", "overlap", "--exec-cost", "2ms",
                           "--spec", str(GOLDEN / "speculative.spec.json"), "--wire-log", str(log),
                           "--html", str(out)], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    committed = sorted({r["step"] for r in lines_of(log) if r.get("event") == "step"})
    loaded(browser, out)
    page = browser.evaluate("({ranks: inferrisPage.rankLanes, steps: inferrisPage.stepNumbers, "
                            "drawn: inferrisPage.drawn})")
    assert page["ranks"] == 2 and page["steps"] == committed
    assert page["drawn"]["steps"] == len(committed) and page["drawn"]["roundTrips"] >= 2 * len(committed)
    browser.evaluate("inferrisPage.focusStep(3)")
    where = browser.evaluate("inferrisPage.stepPoint(3)")
    browser.click(where["x"], where["y"])
    browser.wait_for("inferrisPage.selected === 3")
    text = browser.evaluate("document.getElementById('detail').innerText")
    assert "step 3, epoch 0: plan of" in text and "join: joined" in text
    assert browser.errors == [] and browser.requests == [] and browser.dialogs == []


# -- link faults: what the link did to a message, and a partition, are marks -------------------

LINK_FAULTS = ["1:plan-lost@3", "2:result-delay@5:0.1", "0:plan-dup@6", "3:result-dup@7",
               "3:partition@11:0.2"]


@pytest.fixture(scope="module")
def linked(tmp_path_factory) -> tuple[Path, Path]:
    """(wire log, page) of a restore run on 4 ranks through which the link lost, delayed and
    duplicated messages, and cut rank 3 off for 0.2 s."""
    tmp = tmp_path_factory.mktemp("linked")
    log, out = tmp / "linked.log", tmp / "linked.html"
    faults = [arg for f in LINK_FAULTS for arg in ("--fault", f)]
    done = subprocess.run([*CLI, "launch", "--spec", str(GOLDEN / "random_008.spec.json"), *faults,
                           "--on-rank-loss", "restore", "--step-timeout", "0.5", "--wire-log", str(log),
                           "--html", str(out)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return log, out


def link_marks(data: dict) -> dict[str, list]:
    kinds = data["mark_kinds"]
    out: dict[str, list] = {}
    for m in data["marks"]:
        out.setdefault(kinds[m[0]], []).append([data["strs"][m[6]] if k == 6 else v for k, v in enumerate(m)])
    return out


def test_what_the_link_did_is_marked_on_the_ranks_lane(linked):
    data = data_of(linked[1].read_text())
    marks = link_marks(data)
    said = {(m[3][0], m[4], m[6]) for m in marks["link"]}
    assert said == {(1, 3, "the link lost the PLAN of step 3 to rank 1"),
                    (2, 5, "the link delayed the RESULT of step 5 from rank 2 (taken when the link "
                           "delivers it)"),
                    (0, 6, "the link duplicated the PLAN of step 6 to rank 0"),
                    (3, 7, "the link duplicated the RESULT of step 7 from rank 3"),
                    (3, 11, "the link lost the PLAN of step 11 to rank 3")}
    assert len(marks["link"]) == len(said)               # a plan sent twice: one mark
    [cut] = marks["partition"]
    assert (cut[2], cut[3], cut[4], cut[5]) == (200_000, [3], 11, 1)      # its duration, on rank 3's lane
    assert "cut rank 3 off for 200 ms" in cut[6]
    assert not any(m[6].startswith("the link ") for m in marks.get("note", []))   # said once, by the marks
    links = {(a[0], a[1]): {r: data["strs"][t] for r, t in a[8]} for a in data["attempts"] if len(a) > 8}
    assert links == {(3, 0): {1: "plan lost"}, (5, 1): {2: "result delayed"}, (6, 1): {0: "plan duplicated"},
                     (7, 1): {3: "result duplicated"}, (11, 1): {3: "plan lost"}}
    lost = [a for a in data["attempts"] if (a[0], a[1]) == (3, 0)][0]
    assert [row[2] for row in lost[7] if row[0] == 1] == [-1]            # no answer came back
    delayed = [a for a in data["attempts"] if (a[0], a[1]) == (5, 1)][0]
    assert [row[2] >= 100_000 for row in delayed[7] if row[0] == 2] == [True]   # it came, 0.1 s late
    assert len([a for a in data["attempts"] if a[0] == 6]) == 1          # one attempt, not two


def test_every_kind_of_mark_has_its_budget(tmp_path):
    """A link fault on every message cannot crowd the loss out of the page: each kind of mark
    has its own budget, and what is past it is counted in a note, by kind."""
    from inferris_dist.page.model import MARK_BUDGET, MARKS
    assert set(MARK_BUDGET) == set(MARKS)
    n = MARK_BUDGET["link"] + 300
    records = [{"t": 1.0, "event": "run", "name": "flood", "world_size": 1, "rung": "full", "policy": "abort",
                "faults": ["0:plan-dup@0+"], "config": {}, "requests": 0, "scheduler_pid": 1, "listen": None,
                "shared_clock": True}]
    for step in range(n):
        plan = {"t": 2.0 + step * 1e-3, "dir": "out", "rank": 0, "epoch": 0, "step": step, "type": "PLAN",
                "bytes": 10, "body": {"step": step, "items": []}, "link": "duplicated"}
        records += [plan, plan, {"t": plan["t"], "event": "partition", "rank": 0, "step": step, "epoch": 0,
                                 "seconds": 1e-4}]
    records.append({"t": 9.0, "event": "rank-lost", "rank": 0, "ranks": [0], "step": n, "epoch": 0,
                    "reason": "timeout", "message": "rank 0 gave no answer"})
    data = data_of(build_page(records))
    marks = link_marks(data)
    assert len(marks["link"]) == MARK_BUDGET["link"] and len(marks["partition"]) == MARK_BUDGET["partition"]
    assert len(marks["lost"]) == 1
    [note] = [note for note in data["notes"] if "beyond the page's bound" in note]
    assert "link x300" in note and f"partition x{n - MARK_BUDGET['partition']}" in note


@needs_browser
def test_an_attempt_in_flight_is_said_so_in_the_header(browser, faulted, tmp_path):
    """The page of a log cut mid-step (its plans sent, no verdict yet): the step's attempt is
    in flight, neither committed nor failed."""
    lines = faulted[0].read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    plan = next(i for i, r in enumerate(records) if r.get("type") == "PLAN" and r.get("step") == 1)
    cut, out = tmp_path / "cut.log", tmp_path / "cut.html"
    cut.write_text("".join(lines[:plan + 1]))
    write_page(str(cut), str(out))
    loaded(browser, out)
    page = browser.evaluate("({failed: inferrisPage.failedAttempts, "
                            "inFlight: inferrisPage.attemptsInFlight})")
    assert page == {"failed": 0, "inFlight": 1}
    header = browser.evaluate("document.getElementById('run').innerText")
    assert "1 steps committed in 2 attempts (1 in flight)" in header and "failed" not in header


@needs_browser
def test_the_links_marks_in_a_browser(browser, linked):
    loaded(browser, linked[1])
    page = browser.evaluate("({marks: inferrisPage.marks, drawn: inferrisPage.drawn})")
    assert page["marks"]["link"] == 5 and page["marks"]["partition"] == 1
    assert page["drawn"]["marks"].get("link") == 5 and page["drawn"]["marks"].get("partition") == 1
    header = browser.evaluate("document.getElementById('run').innerText")
    assert "the link acted on 5 messages, cut 1 time" in header
    for step, said in ((3, ["! the link lost the PLAN of step 3 to rank 1", "plan lost"]),
                       (11, ["! the link cut rank 3 off for 200 ms",
                             "! the link lost the PLAN of step 11 to rank 3"])):
        browser.evaluate(f"inferrisPage.focusStep({step})")
        where = browser.evaluate(f"inferrisPage.stepPoint({step})")
        browser.click(where["x"], where["y"])
        browser.wait_for(f"inferrisPage.selected === {step}")
        text = browser.evaluate("document.getElementById('detail').innerText")
        for words in said:
            assert words in text, (step, words, text)
    assert browser.errors == [] and browser.requests == [] and browser.dialogs == []
