"""Watching a run live: `launch --serve`, `inferris-dist serve WIRELOG` (inferris_dist/live, cli/cmd_serve).

Without processes:
1. a --serve value is parsed as [HOST:]PORT, and what is no address is refused with the reason;
2. a log followed as it is written gives each line once, when its newline has come, within bounds;
3. the exposition parses with prometheus_client's own parser, and every family it serves is in
   docs/observing.md's table and every family there is served, with its type and labels;
4. /health's body says recovering, with the reason, from a loss to the replacement's first
   committed step, and /status says where the run is;
5. the server is bounded: unknown paths are 404, other methods 405, a foreign Host 403, huge
   headers 431, a request that never ends 408, one connection too many 503, and an event
   stream whose client never reads is dropped, all within their deadlines.

With processes (the CLI, workers, Prometheus, a browser):
6. the numbers served agree with the --metrics document of the same run (a rank lost and restored);
7. serving changes nothing: `launch --json` prints the same bytes and the wire log the same step
   events with --serve as without; the /page.html download is the file --html writes;
8. `serve WIRELOG` follows a log another process is writing to its end, and says so;
9. a bad --serve value (a port out of range, a host that is no address, a port in use) is one
   line and exit 2, before any worker starts;
10. a real Prometheus scrapes a live run, and PromQL gives the run's requests finished,
    generation tokens and steps at the end (skipped where /usr/bin/prometheus is missing);
11. headless Chromium watches the live page of a run with a loss: the steps grow, the loss and
    the restart appear, the end is said, with no console error and no request beyond the server;
12. the server is gone when its run ends, and when its launch is killed with SIGKILL.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferris_dist.live import prom, server
from inferris_dist.live.server import AddressError, LiveServer, parse_address
from inferris_dist.live.state import LiveState
from inferris_dist.wirelog.logread import LogFollower

from tests.helpers.external import CLI, ENV, REPO, Lines, serving_spec
from tests.helpers.procs import wait_until

pytestmark = [pytest.mark.timeout(60)]

PROMETHEUS = Path("/usr/bin/prometheus")
CHROMIUM = Path("/usr/bin/chromium")
DOCS = REPO / "docs" / "observing.md"


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def get(url: str, timeout: float = 10) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels) -> float:
    """A sample's value: `name` as exposed (a counter's `_total` included)."""
    base = next((name[:-len(end)] for end in ("_total", "_count", "_sum") if name.endswith(end)
                 and name[:-len(end)] in fams), name)
    for s in fams[base].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{name} {labels}")


# -- 1, 2: addresses, following ------------------------------------------------------------------

def test_serve_addresses():
    assert parse_address("8080") == ("127.0.0.1", 8080)
    assert parse_address("0") == ("127.0.0.1", 0)
    assert parse_address("localhost:9") == ("127.0.0.1", 9)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_address("[::1]:8080") == ("::1", 8080)
    for bad, says in (("70000", "0 to 65535"), ("-1", "0 to 65535"), ("example.com:80", "not an IP"),
                      ("::1:80", "brackets"), ("[::1]80", "brackets"), ("", "0 to 65535"),
                      ("127.0.0.1:", "0 to 65535"), ("1.2.3:80", "not an IP")):
        with pytest.raises(AddressError, match=says):
            parse_address(bad)


def test_a_log_is_followed_line_by_line_as_it_is_written(tmp_path):
    path = tmp_path / "w.log"
    out = open(path, "wb", buffering=0)
    follower = LogFollower(str(path), max_line=200)
    assert follower.poll() == []
    out.write(b'{"t": 1.0, "event": "run"')
    assert follower.poll() == []                     # no newline yet: not a line
    out.write(b', "name": "x"}\n{"t": 2.0, "event": "idle", "first": 1, "last": 2, "text": "t"}\n')
    got = follower.poll()
    assert [r["event"] for r in got] == ["run", "idle"] and got[0]["name"] == "x"
    out.write(b"not json\n" + b'{"a": "' + b"x" * 300 + b'"}\n' + b"[1]\n")
    out.write(b'{"t": 3.0, "event": "end", "status": "ok", "error": null, "steps": 3}\n')
    got = follower.poll()
    assert [r["event"] for r in got] == ["end"]
    assert follower.skipped == 2 and follower.too_long == 1 and follower.line == 6
    out.write(b'{"long": "' + b"y" * 500)             # too long before its newline: dropped as it comes
    assert follower.poll() == []
    out.write(b'"}\n{"t": 4.0, "event": "idle", "first": 5, "last": 6, "text": "t"}\n')
    assert [r["event"] for r in follower.poll()] == ["idle"] and follower.too_long == 2
    assert not follower.truncated()
    out.close()
    path.write_bytes(b"")
    assert follower.truncated()
    follower.close()


# -- a faulted run's log, made once --------------------------------------------------------------

@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> dict:
    """A serving workload on 2 ranks, rank 1 crashing at step 12, restored: its wire log, its
    --metrics document and its --json lines."""
    tmp = tmp_path_factory.mktemp("live")
    spec = serving_spec(tmp / "w.json", 40, world_size=2)
    log, metrics = tmp / "w.log", tmp / "m.json"
    done = subprocess.run([*CLI, "launch", "--spec", str(spec), "--fault", "1:crash@12", "--on-rank-loss",
                           "restore", "--wire-log", str(log), "--metrics", str(metrics), "--json"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {"spec": spec, "log": log, "records": records_of(log), "metrics": json.loads(metrics.read_text()),
            "lines": done.stdout.splitlines(), "tmp": tmp}


def state_of(records) -> LiveState:
    state = LiveState()
    state.add(records)
    return state


# -- 3: the exposition and the docs --------------------------------------------------------------

def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metric table of docs/observing.md: name -> (type, labels)."""
    text = DOCS.read_text()
    section = text.split("## Watching a run live", 1)[1]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`inferris_"):
            labels = tuple(x.strip("` ") for x in cells[2].split(",") if x.strip("` -"))
            table[cells[0].strip("`")] = (cells[1], labels)
    return table


@pytest.mark.procs
def test_every_family_served_is_documented_and_parses(faulted):
    state = state_of(faulted["records"])
    text = prom.exposition(prom.registry(state)).decode()
    fams = families(text)
    served = {}
    for f in fams.values():
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = set()
        for s in f.samples:
            labels |= set(s.labels) - {"le"}
        served[name] = (f.type, labels)
    docs = documented()
    assert set(served) == set(docs), (set(served) ^ set(docs))
    assert set(served) == {name for name, *_ in prom.FAMILIES}
    for name, (kind, labels) in served.items():
        assert docs[name][0] == kind, name
        assert labels <= set(docs[name][1]), name
    assert all(name.startswith("inferris_") for name in served)


# -- 6: the numbers agree with --metrics ---------------------------------------------------------

@pytest.mark.procs
def test_the_numbers_agree_with_the_metrics_document(faulted):
    fams = families(prom.exposition(prom.registry(state_of(faulted["records"]))).decode())
    doc = faulted["metrics"]
    run = doc["run"]
    steps = len(faulted["lines"]) - 1
    assert value(fams, "inferris_steps_committed_total") == steps == run["steps"]
    finished = sum(s.value for s in fams["inferris_request_success"].samples)
    assert finished == run["requests_finished"] == 40
    assert value(fams, "inferris_generation_tokens_total") == run["generated_tokens"]
    assert value(fams, "inferris_prompt_tokens_total") == run["prompt_tokens"]
    assert value(fams, "inferris_prefix_cache_hits_total") == run["prefix_hit_tokens"]
    assert value(fams, "inferris_prefix_cache_queries_total") == run["prompt_tokens"]
    assert value(fams, "inferris_spec_decode_num_draft_tokens_total") == run["drafted_tokens"]
    assert value(fams, "inferris_spec_decode_num_accepted_tokens_total") == run["accepted_tokens"]
    assert value(fams, "inferris_num_preemptions_total") == run["preemptions"]
    last = {k: v[-1] for k, v in doc["steps"].items()}
    assert value(fams, "inferris_kv_pages_free") == last["pages_free"]
    assert value(fams, "inferris_kv_pages_cached") == last["pages_cached"]
    assert value(fams, "inferris_epoch") == 1
    assert value(fams, "inferris_attempts_failed_total") >= 1
    assert value(fams, "inferris_rank_restarts_total", rank="1") == 1
    assert value(fams, "inferris_rank_losses_total", rank="1", reason="died") == 1
    for row in doc["ranks"]:
        r = str(row["rank"])
        assert value(fams, "inferris_rank_sent_bytes_total", rank=r) == row["bytes_sent"]
        assert value(fams, "inferris_rank_received_bytes_total", rank=r) == row["bytes_received"]
        assert value(fams, "inferris_rank_replies_dropped_total", rank=r) == row["dropped"]
    ttft = value(fams, "inferris_time_to_first_token_steps_count")
    assert ttft == 40
    firsts = [r["first_token_step"] - r["arrival_step"] for r in doc["requests"]]
    assert value(fams, "inferris_time_to_first_token_steps_sum") == sum(firsts)
    assert value(fams, "inferris_step_duration_seconds_count") == steps


# -- 4: health and status ------------------------------------------------------------------------

@pytest.mark.procs
def test_health_is_503_from_a_loss_to_the_replacements_first_step(faulted):
    records = faulted["records"]
    lost = next(i for i, r in enumerate(records) if r.get("event") == "rank-lost")
    back = next(i for i, r in enumerate(records) if r.get("event") == "step" and r["epoch"] == 1)
    state = LiveState()
    state.add(records[:lost])
    assert state.health_json() == (True, {"health": "stepping", "reason": "", "step": 11, "epoch": 0})
    state.add(records[lost:lost + 1])
    healthy, said = state.health_json()
    assert not healthy and said["health"] == "recovering"
    assert "rank 1 lost at step 12 (died)" in said["reason"]
    state.add(records[lost + 1:back])
    healthy, said = state.health_json()
    assert not healthy and "restarting rank 1 into epoch 1" in said["reason"]
    state.add(records[back:back + 1])
    assert state.health_json()[0] and state.health_json()[1]["health"] == "stepping"
    state.add(records[back + 1:])
    status = state.status_json()
    assert status["ended"] and status["status"] == "ok" and status["health"] == "ended"
    assert status["epoch"] == 1 and status["restarts"] == {"spent": 1, "allowed": 3}
    assert status["policy"] == "restore" and status["steps"] == len(faulted["lines"]) - 1
    assert [m["rank"] for m in status["members"]] == [0, 1] and all(m["pid"] for m in status["members"])
    failed = LiveState()
    failed.add(records[:lost + 1] + [{"t": 1.0, "event": "end", "status": "failed", "steps": 12,
                                     "error": {"error": "RankLost", "message": "gone", "step": 12}}])
    healthy, said = failed.health_json()
    assert not healthy and said["health"] == "failed" and "RankLost at step 12: gone" in said["reason"]


# -- 5: a bounded server -------------------------------------------------------------------------

@pytest.fixture
def live_server(faulted, monkeypatch):
    monkeypatch.setattr(server, "SEND_SECONDS", 1.0)
    monkeypatch.setattr(server, "HEAD_SECONDS", 1.0)
    monkeypatch.setattr(server, "HEARTBEAT_SECONDS", 0.2)
    state = state_of(faulted["records"][:-5])      # a run still going
    sock = server.bind("127.0.0.1", 0)
    srv = LiveServer(sock, state, lambda: "<html>whole</html>")
    srv.start()
    host, port = sock.getsockname()
    yield srv, f"http://127.0.0.1:{port}", (host, port)
    srv.stop()


def raw(where, data: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(where, timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_what_the_server_refuses(live_server):
    srv, url, where = live_server
    status, headers, body = get(url + "/no/such/<script>")
    assert status == 404 and b"<script>" not in body
    assert get(url + "/etc/passwd")[0] == 404 and get(url + "/../../etc/passwd")[0] == 404
    assert raw(where, b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert raw(where, b"GET /status HTTP/1.1\r\nHost: evil.example:80\r\n\r\n").startswith(b"HTTP/1.1 403")
    assert raw(where, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    assert raw(where, b"\x16\x03\x01 garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    started = time.monotonic()
    assert raw(where, b"GET / HTTP/1.1\r\n").startswith(b"HTTP/1.1 408")     # never ends its headers
    assert time.monotonic() - started < 3
    status, headers, body = get(url + "/health")
    assert status == 200 and json.loads(body)["health"] == "stepping"
    assert headers["Content-Type"] == "application/json" and headers["X-Content-Type-Options"] == "nosniff"
    status, headers, body = get(url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "inferris_steps_committed" in families(body.decode())
    status, headers, body = get(url + "/page.html")
    assert body == b"<html>whole</html>" and "attachment" in headers["Content-Disposition"]
    status, headers, body = get(url + "/")
    assert status == 200 and b"connect-src 'self'" in body and b"inferrisLive" in body
    assert b"the log has no end record" not in body


def test_too_many_clients_and_a_client_that_never_reads(live_server, monkeypatch):
    srv, url, where = live_server
    idle = [socket.create_connection(where, timeout=5) for _ in range(server.MAX_CLIENTS)]
    try:
        assert wait_until(lambda: srv.clients == server.MAX_CLIENTS, 5)
        started = time.monotonic()
        assert raw(where, b"GET /health HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503")
        assert time.monotonic() - started < 1
    finally:
        for s in idle:
            s.close()
    assert wait_until(lambda: srv.clients == 0, 5)          # the idle ones: cut at their deadline
    assert get(url + "/health")[0] == 200
    # an event stream whose client never reads: its messages are not kept for it, it is dropped
    monkeypatch.setattr(server, "PUBLISH_SECONDS", 0.05)   # each news published: its socket full sooner
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.settimeout(5)
    stuck.connect(where)
    stuck.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        assert wait_until(lambda: srv.streams == 1, 5)
        deadline, news = time.monotonic() + 20, 0
        while srv.streams and time.monotonic() < deadline:     # news comes, more than a socket holds
            srv.state.add([{"t": 1.0 + news, "event": "note", "rank": 0, "epoch": 0, "text": f"news {news}"}])
            news += 1
            time.sleep(0.05)
        assert srv.streams == 0, f"still streaming after {news} news"
        assert get(url + "/health")[0] == 200
    finally:
        stuck.close()


def test_an_event_stream_brings_the_news(live_server, faulted):
    srv, url, where = live_server
    with socket.create_connection(where, timeout=5) as s:
        s.sendall(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        lines = Lines(s.makefile("rb"))
        assert lines.until(r"^HTTP/1.1 200", 5)
        first = lines.until(r"^data: ", 5)
        news = json.loads(first[len("data: "):])
        assert news["live"]["ended"] is False and news["page"]["steps"]["step"]
        srv.state.add(faulted["records"][-5:])
        start = len(lines.lines)
        while True:
            line = lines.until(r"^data: ", 5, start)
            news = json.loads(line[len("data: "):])
            if news["live"]["ended"]:
                break
            start = lines.lines.index(line) + 1
        assert news["live"]["status"] == "ok" and news["live"]["health"] == "ended"


# -- 7, 8, 9: the command line -------------------------------------------------------------------

def launch(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "launch", *map(str, args)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def step_events(path: Path) -> list[dict]:
    return [{k: r[k] for k in ("step", "epoch", "trace", "counters", "prompt_tokens")}
            for r in records_of(path) if r.get("event") == "step"]


@pytest.mark.procs
def test_serving_changes_nothing_and_the_download_is_the_html_file(faulted):
    tmp = faulted["tmp"]
    plain = launch("--spec", faulted["spec"], "--fault", "1:crash@12", "--on-rank-loss", "restore",
                   "--json", "--wire-log", tmp / "plain.log")
    proc = subprocess.Popen([*CLI, "launch", "--spec", str(faulted["spec"]), "--fault", "1:crash@12",
                             "--on-rank-loss", "restore", "--json", "--wire-log", str(tmp / "served.log"),
                             "--html", str(tmp / "served.html"), "--serve", "127.0.0.1:0",
                             "--serve-linger", "30"], cwd=REPO, env=ENV, stdout=open(tmp / "served.out", "w"),
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        err = Lines(proc.stderr)
        url = err.until(r"serving the run at http://", 20).split(" at ", 1)[1].split(" ", 1)[0]
        err.until(r"the run is over; the server stays 30 s", 30)
        assert wait_until(lambda: (tmp / "served.html").exists() and (tmp / "served.html").stat().st_size, 10)
        status, _, page = get(url + "page.html")
        assert status == 200 and page == (tmp / "served.html").read_bytes()
        status, _, body = get(url + "status")
        assert json.loads(body)["ended"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert plain.returncode == 0, plain.stderr
    assert (tmp / "served.out").read_text() == plain.stdout
    assert step_events(tmp / "served.log") == step_events(tmp / "plain.log")
    assert plain.stderr == ""


@pytest.mark.procs
def test_serve_follows_a_log_another_process_writes_to_its_end(faulted):
    tmp = faulted["tmp"]
    log = tmp / "followed.log"
    run = subprocess.Popen([*CLI, "launch", "--spec", str(faulted["spec"]), "--exec-cost", "80ms",
                            "--wire-log", str(log), "--json"], cwd=REPO, env=ENV,
                           stdout=open(tmp / "followed.out", "w"), stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL)
    try:
        assert wait_until(log.exists, 20)
        serve = subprocess.Popen([*CLI, "serve", str(log), "--serve-linger", "0"], cwd=REPO, env=ENV,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        err = Lines(serve.stderr)
        url = err.until(r"serving .* at http://", 20).split(" at ", 1)[1].split(" ", 1)[0]
        seen = set()
        while run.poll() is None:
            status, _, body = get(url + "status")
            seen.add(json.loads(body)["steps"])
            time.sleep(0.1)
        ended = err.until(r"the run ended", 20)
        assert serve.wait(timeout=20) == 0
        out = (tmp / "followed.out").read_text().splitlines()
    finally:
        for p in (run, locals().get("serve")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)
    steps = len(out) - 1
    assert f"the run ended (ok), {steps} steps" in ended
    assert len([s for s in seen if 0 < s < steps]) >= 2, seen       # it followed, step by step


@pytest.mark.procs
@pytest.mark.parametrize("value, says", [("70000", "from 0 to 65535"), ("example.com:8080", "is not an IP"),
                                         ("in-use", "cannot listen there")])
def test_a_bad_serve_value_is_one_line_and_exit_2(value, says):
    taken = server.bind("127.0.0.1", 0)
    try:
        if value == "in-use":
            value = f"127.0.0.1:{taken.getsockname()[1]}"
        started = time.monotonic()
        done = launch("--serve", value, "--world-size", "2")
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1 and says in done.stderr
    assert done.stderr.startswith("inferris-dist: --serve ")
    assert time.monotonic() - started < 10


# -- 10: Prometheus ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.procs
@pytest.mark.timeout(90)
@pytest.mark.skipif(not PROMETHEUS.exists(), reason="no /usr/bin/prometheus: Debian's prometheus scrapes "
                    "the live run only where it is installed")
def test_prometheus_scrapes_a_live_run(tmp_path):
    spec = serving_spec(tmp_path / "w.json", 60, world_size=2)
    target, web = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
        f"scrape_configs:\n  - job_name: inferris\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target}']\n")
    prometheus = subprocess.Popen([str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{web}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{web}"

    def query(q: str):
        status, _, body = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=2)
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return float(result[0]["value"][1]) if result else None

    try:
        assert wait_until(lambda: _ready(api), 30, interval=0.2), "prometheus did not become ready"
        run = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--exec-cost", "5ms", "--serve",
                                f"127.0.0.1:{target}", "--serve-linger", "20", "--json"], cwd=REPO, env=ENV,
                               stdout=open(tmp_path / "out.jsonl", "w"), stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
        err = Lines(run.stderr)
        err.until(r"the run is over; the server stays", 60)
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        steps = len(lines) - 1
        summary = json.loads(lines[-1])["summary"]
        generated = sum(r["generated"] for r in summary)
        want = {"inferris_steps_committed_total": steps, "sum(inferris_request_success_total)": 60,
                "inferris_generation_tokens_total": generated}
        assert wait_until(lambda: all(query(q) == v for q, v in want.items()), 15, interval=0.25), \
            {q: query(q) for q in want}
        assert query('inferris_rank_round_trip_seconds_count{rank="1"}') == steps
        run.terminate()
        run.wait(20)
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(10)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait(5)
        if "run" in locals() and run.poll() is None:
            run.kill()
            run.wait(5)


def _ready(api: str) -> bool:
    try:
        return get(api + "/-/ready", timeout=1)[0] == 200
    except OSError:
        return False


# -- 11: the live page in a browser --------------------------------------------------------------

@pytest.mark.procs
@pytest.mark.timeout(90)
@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: the live page is tested in a "
                    "browser only where Debian's chromium is installed")
def test_the_live_page_in_a_browser(tmp_path):
    from tests.helpers.browser import Browser
    spec = serving_spec(tmp_path / "w.json", 60, world_size=2)
    with Browser(1400, 900, loopback=True) as browser:      # ready before the run starts
        run = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--exec-cost", "60ms", "--fault",
                                "1:crash@30", "--on-rank-loss", "restore", "--serve", "127.0.0.1:0",
                                "--serve-linger", "10", "--json"], cwd=REPO, env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            err = Lines(run.stderr)
            url = err.until(r"serving the run at http://", 20).split(" at ", 1)[1].split(" ", 1)[0]
            browser.open_url(url, timeout=20)
            browser.wait_for("window.inferrisLive && inferrisLive.state.renders > 0", 20)
            counts, losses = [], []
            while not browser.evaluate("inferrisLive.state.ended"):
                counts.append(browser.evaluate("inferrisPage.steps"))
                losses.append(browser.evaluate("inferrisPage.marks.lost || 0"))
                time.sleep(0.2)
                assert len(counts) < 300
            marks = browser.evaluate("inferrisPage.marks")
            said = browser.evaluate("document.getElementById('live').textContent")
            final = browser.evaluate("inferrisPage.steps")
            assert browser.evaluate("inferrisLive.state.closed")
            errors, requests = browser.errors, browser.requests
        finally:
            run.terminate()
            run.wait(20)
    assert losses[0] == 0 and losses[-1] == 1, losses          # the loss came while the page watched
    grew = sorted(set(counts))
    assert len(grew) >= 3 and counts == sorted(counts), counts
    assert marks.get("lost", 0) >= 1 and marks.get("restart", 0) >= 1 and marks.get("end", 0) == 1, marks
    assert "the run ended (ok)" in said and f"{final} steps committed" in said
    assert errors == [], errors
    assert requests and all(r.startswith(url) for r in requests), requests
    assert {r[len(url) - 1:] for r in requests} <= {"/", "/events"}


def test_the_live_script_is_the_pages_first(tmp_path):
    """A live page holds live.js and page.js in one script element, allowed by their hash, and
    the policy allows connections to where the page came from only; a page for a file none."""
    from inferris_dist.page import asset, page_html
    from inferris_dist.page.data import page_data
    from inferris_dist.page.model import Builder
    data = page_data(Builder(), "t", [])
    live, still = page_html(data, "t", live=True), page_html(data, "t")
    assert asset("live.js") + asset("page.js") in live and asset("live.js") not in still
    assert "connect-src 'self'" in live and "connect-src 'none'" in still
    if shutil.which("node"):
        done = subprocess.run(["node", "--check", str(REPO / "inferris_dist/page/live.js")],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr



def servers() -> dict[int, bytes]:
    from tests.helpers.procs import descendants
    return {pid: cmd for pid, cmd in descendants(os.getpid()).items() if b"inferris_dist.cli serve" in cmd}


@pytest.mark.procs
def test_the_server_is_gone_when_the_run_ends_or_is_killed(faulted):
    done = launch("--world-size", "2", "--serve", "127.0.0.1:0", "--json")
    assert done.returncode == 0 and "serving the run at http://127.0.0.1:" in done.stderr
    assert wait_until(lambda: not servers(), 5), servers()
    run = subprocess.Popen([*CLI, "launch", "--spec", str(faulted["spec"]), "--exec-cost", "50ms", "--serve",
                            "127.0.0.1:0", "--json"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        Lines(run.stderr).until(r"serving the run at http://", 20)
        assert wait_until(lambda: servers(), 10)
        run.kill()                                          # SIGKILL: no chance to stop its server
        run.wait(10)
        assert wait_until(lambda: not servers(), 10), servers()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(5)


@pytest.mark.procs
def test_the_page_rebuilt_again_and_again_says_the_same(faulted):
    """The live page is built anew at every change; building it leaves the model as it was
    (the replaced ranks it marks, and the count of each kind of mark against its budget), so
    the thousandth page says what the first said, and drops nothing the first did not."""
    state = state_of(faulted["records"])
    model = state.builder
    counts = (len(model.marks), model.dropped_marks, dict(model.marks_of), dict(model.dropped_of))
    first = state.page_data()
    replaced = first["mark_kinds"].index("replaced")
    assert any(m[0] == replaced for m in first["marks"]), first["marks"][:5]
    again = state.page_data()
    assert (len(model.marks), model.dropped_marks, model.marks_of, model.dropped_of) == counts
    assert again["marks"] == first["marks"] and again["notes"] == first["notes"]
