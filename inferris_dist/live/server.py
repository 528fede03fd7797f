"""The live server: a wire log followed as it is written, served over HTTP on a socket bound
by whoever starts it.

    GET /           the live page: the page `--html` writes, updating as steps commit
    GET /events     Server-Sent Events: the run's state and the page's data, each time they move
    GET /page.html  the page of the whole log so far, as `--html` writes it (a download)
    GET /metrics    the Prometheus text format (prom.py)
    GET /health     200 while the run starts, steps or has ended well; 503 while it recovers
                    or after it failed (JSON: health, reason, step, epoch)
    GET /status     JSON: step, epoch, members (pid, host), policy, restarts spent, ended
    anything else   404 (GET and HEAD only: 405 otherwise)

Bounded whatever its clients do: MAX_CLIENTS connections at once (one more is answered 503
and closed without being read), MAX_STREAMS of them event streams; a request's line and
headers at most MAX_HEAD bytes (431 past it), sent within HEAD_SECONDS of connecting (408
otherwise: one byte a second keeps no connection); every response written with a timeout
of SEND_SECONDS, so a client that does not read is dropped, never buffered for. An event
stream holds one message at most: the latest (a client that is slow gets the newest state
when it has taken the one before, nothing piles up). The page, its data and the download
are built once per published state and sent PAGE_SECONDS apart at most, all clients
together: asking again and again costs a wait, not a build. Nothing from a request is reflected
in a response; one connection serves one request (Connection: close). Bound to loopback,
only a Host of an address or localhost is served (a page of another site reaching it by
DNS rebinding is refused, 403).

Threads: one accepts, one per connection served, one (the publisher) makes each new message
of the event stream, at most every PUBLISH_SECONDS (sooner for a loss, a restart, the end)
and never more often than four times what making one costs. The follower runs where
`serve` calls it (`follow`), feeding the state.
"""
from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from typing import Callable

from inferris_dist.live.prom import CONTENT_TYPE_LATEST, exposition, registry
from inferris_dist.live.state import LiveState
from inferris_dist.page import finite
from inferris_dist.wirelog.logread import LogFollower

MAX_CLIENTS = 16
MAX_STREAMS = 8
MAX_HEAD = 8192
HEAD_SECONDS = 5.0
SEND_SECONDS = 5.0
HEARTBEAT_SECONDS = 10.0
PUBLISH_SECONDS = 0.25
POLL_SECONDS = 0.05          # the follower looks at the log this often when nothing is new
DRAIN_SECONDS = 2.0          # at the end: how long the streams get to take the last message
PAGE_SECONDS = 0.25          # /, /data, /page.html: one sent at most this often, all clients together
REBUILD_SECONDS = 1.0        # and each built again at most this often (the event stream brings the rest)
ROUTES = ("/", "/index.html", "/events", "/page.html", "/metrics", "/health", "/status", "/data")


class AddressError(ValueError):
    """A --serve value that is no address."""


def parse_address(value: str, flag: str = "--serve") -> tuple[str, int]:
    """`[HOST:]PORT` -> (host, port). HOST: an IPv4 address, an IPv6 one in brackets, or
    localhost (default 127.0.0.1); PORT: 0 (any free one) to 65535."""
    text = value.strip()
    host, port = "127.0.0.1", text
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            raise AddressError(f"{flag} {value!r}: an IPv6 address goes in brackets: [::1]:PORT")
        host, port = text[1:close], text[close + 2:]
    elif ":" in text:
        host, _, port = text.rpartition(":")
        if ":" in host:
            raise AddressError(f"{flag} {value!r}: an IPv6 address goes in brackets: [::1]:PORT")
    if not port.isdigit() or not port.isascii() or len(port) > 5 or int(port) > 65535:
        raise AddressError(f"{flag} {value!r}: the port must be a number from 0 to 65535")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"{flag} {value!r}: {host!r} is not an IP address (127.0.0.1, [::1], "
                           f"0.0.0.0, or localhost)") from None
    return host, int(port)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (OSError: the machine said no, the port is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


# -- responses -----------------------------------------------------------------------------------

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 411: "Length Required",
           413: "Content Too Large", 414: "URI Too Long", 415: "Unsupported Media Type",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
COMMON = ("Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
          "Referrer-Policy: no-referrer\r\nConnection: close\r\n")


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
             extra: str = "", head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{COMMON}{extra}\r\n")
    return head.encode("ascii") + (b"" if head_only else body)


DOWNLOAD = 'Content-Disposition: attachment; filename="inferris-dist-page.html"\r\n'
REFUSED = response(503, b"too many clients: try again later\n", extra="Retry-After: 1\r\n")


def _json(obj) -> bytes:
    return (json.dumps(finite(obj), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
            + "\n").encode("ascii")


OPERATOR = "/fault-tolerance/"


class Request:
    __slots__ = ("method", "path", "host", "headers", "rest")

    def __init__(self, method: str, path: str, host: str | None, headers: dict | None = None,
                 rest: bytes = b""):
        self.method, self.path, self.host = method, path, host
        self.headers = headers or {}      # the few we read: authorization, content-length, content-type
        self.rest = rest                  # what came after the head (the start of a body)


class BadRequest(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


def read_request(conn: socket.socket, deadline: float) -> Request:
    """The request line and headers, within MAX_HEAD bytes and the deadline (BadRequest)."""
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadRequest(408, "the request took too long to come")
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except socket.timeout:
            raise BadRequest(408, "the request took too long to come") from None
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
        if len(data) > MAX_HEAD and b"\r\n\r\n" not in data[:MAX_HEAD + 4]:
            raise BadRequest(431, "the request's line and headers are too long")
    cut = data.find(b"\r\n\r\n")
    rest = data[cut + 4:] if cut >= 0 else data[data.find(b"\n\n") + 2:]
    head = data.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, "not an HTTP/1 request line")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "not an HTTP/1 request line") from None
    host = None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadRequest(400, "a header line without a colon")
        name = name.strip().lower()
        if name == b"host":
            host = value.strip().decode("latin-1")
        elif name in KEPT_HEADERS:
            headers[name.decode()] = value.strip().decode("latin-1")
    path = target.split("?", 1)[0]
    return Request(method, path, host, headers, rest)


KEPT_HEADERS = (b"authorization", b"content-length", b"content-type")
MAX_BODY = 4096               # bytes of an operator's request body


def read_body(conn: socket.socket, req: Request, deadline: float) -> bytes:
    """A request's body, by its Content-Length, within MAX_BODY bytes and the deadline."""
    length = req.headers.get("content-length", "")
    if not length.isdigit() or len(length) > 8:
        raise BadRequest(411, "a body needs a Content-Length")
    n = int(length)
    if n > MAX_BODY:
        raise BadRequest(413, f"a body of at most {MAX_BODY} bytes")
    data = req.rest[:n]
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadRequest(408, "the request took too long to come")
        conn.settimeout(left)
        try:
            chunk = conn.recv(n - len(data))
        except socket.timeout:
            raise BadRequest(408, "the request took too long to come") from None
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _host_allowed(host: str | None) -> bool:
    """A Host header that names this machine by address or as localhost (any port)."""
    if host is None:
        return True                       # HTTP/1.0 clients send none
    name = host
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# -- the server ----------------------------------------------------------------------------------

class LiveServer:
    """Serves `state` on the listening socket `sock` until `stop()`. `page_file()` gives the
    whole page as --html writes it (read from the log again); `title` names the live page."""

    def __init__(self, sock: socket.socket, state: LiveState, page_file: Callable[[], str],
                 loopback: bool = True, control=None):
        self.sock = sock
        self.control = control          # a paused run's desk (live/control.py), or None
        self.state = state
        self.page_file = page_file
        self.loopback = loopback
        self.registry = registry(state)
        self.lock = threading.Lock()
        self.clients = 0
        self.streams = 0
        self.served = 0                 # requests answered, refused ones included
        self.refused = 0
        self.stopping = threading.Event()
        self.published = threading.Condition()
        self.message: bytes | None = None      # the latest event-stream message
        self.message_seq = 0
        self.final_seq: int | None = None      # the message that said the run ended
        self.build_seconds = 0.0
        self.page_news: dict | None = None     # the page's data in the latest message
        self.page_builds = 0                   # live pages built (one per published state at most)
        self._built: dict[str, tuple[int, float, bytes]] = {}   # what -> (the message seq it is of,
                                                                # when it was built, its bytes)
        self._build_locks = {what: threading.Lock() for what in ("/", "/data", "/page.html")}
        self._pace = threading.Lock()
        self._next_page = 0.0                  # when the next page may be sent (PAGE_SECONDS apart)
        self._threads: list[threading.Thread] = []
        self._taken: dict[int, int] = {}       # stream id -> the message seq it has sent

    # -- running

    def start(self) -> None:
        for target, name in ((self._accept, "live-accept"), (self._publish, "live-publish")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, drain: float = 0.0) -> None:
        """Stop: first (drain > 0) give the event streams up to `drain` seconds to take the
        last message and close, then close every connection and the socket."""
        deadline = time.monotonic() + drain
        while drain > 0 and time.monotonic() < deadline:
            with self.lock:
                if not self.streams:
                    break
            time.sleep(0.02)
        self.stopping.set()
        with self.published:
            self.published.notify_all()
        with self.state.changed:
            self.state.changed.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass
        for t in self._threads:
            t.join(timeout=2.0)

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                full = self.clients >= MAX_CLIENTS
                if not full:
                    self.clients += 1
                self.served += 1
            if full:
                self.refused += 1
                _refuse(conn)
                continue
            t = threading.Thread(target=self._serve_one, args=(conn,), name="live-client", daemon=True)
            t.start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        except (OSError, ConnectionError):
            pass                         # the client went away, or stopped reading: dropped
        finally:
            _close(conn)
            with self.lock:
                self.clients -= 1

    def _answer(self, conn: socket.socket) -> None:
        try:
            req = read_request(conn, time.monotonic() + HEAD_SECONDS)
        except BadRequest as e:
            _send(conn, response(e.status, (str(e) + "\n").encode()))
            return
        head = req.method == "HEAD"
        path = req.path
        if path.startswith(OPERATOR):
            return self._operator(conn, req)
        if req.method not in ("GET", "HEAD"):
            _send(conn, response(405, b"GET or HEAD only\n", extra="Allow: GET, HEAD\r\n"))
            return
        if self.loopback and not _host_allowed(req.host):
            _send(conn, response(403, b"this server answers to its address or localhost only\n",
                                 head_only=head))
            return
        if path == "/ready":
            ready, body = self._ready()
            _send(conn, response(200 if ready else 503, _json(body), "application/json", head_only=head))
        elif path in ("/", "/index.html"):
            _send(conn, response(200, self._built_for("/"), "text/html; charset=utf-8", head_only=head))
        elif path == "/events":
            if head:
                _send(conn, response(200, b"", "text/event-stream", head_only=True))
                return
            self._stream(conn)
        elif path == "/page.html":
            _send(conn, response(200, self._built_for("/page.html"), "text/html; charset=utf-8",
                                 extra=DOWNLOAD, head_only=head))
        elif path == "/data":
            _send(conn, response(200, self._built_for("/data"), "application/json", head_only=head))
        elif path == "/metrics":
            _send(conn, response(200, exposition(self.registry), CONTENT_TYPE_LATEST, head_only=head))
        elif path == "/health":            # liveness: this process serves; how the run is, in the body
            _, body = self.state.health_json()
            _send(conn, response(200, _json(body), "application/json", head_only=head))
        elif path == "/status":
            _send(conn, response(200, _json(self.state.status_json()), "application/json", head_only=head))
        else:
            _send(conn, response(404, b"not found: this server serves / (the live page), /events, "
                                      b"/page.html, /metrics, /health, /ready, /status"
                                      + (b", /fault-tolerance/status and /fault-tolerance/apply"
                                         if self.control is not None else b"") + b"\n", head_only=head))

    def _ready(self) -> tuple[bool, dict]:
        """Readiness: the run steps (a paused, recovering, failed or ended one is not ready);
        /health, liveness, says only that this process serves."""
        if self.control is not None:
            code, status = self.control.ask({"op": "status"})
            phase = status.get("phase", "ended") if code == 200 else "ended"
        else:
            _, health = self.state.health_json()
            phase = "running" if health["health"] == "stepping" else health["health"]
        return phase == "running", {"ready": phase == "running", "phase": phase}

    def _operator(self, conn: socket.socket, req: Request) -> None:
        """/fault-tolerance/status (GET) and /fault-tolerance/apply (POST, a JSON body {"id",
        "instruction", "epoch"}): the bearer token first, no CORS, the Host check; a GET changes
        nothing."""
        path = req.path[len(OPERATOR):]
        if self.control is None or path not in ("status", "apply"):
            _send(conn, response(404, b"no operator here: launch --on-rank-loss pause --serve serves "
                                      b"/fault-tolerance/status and /fault-tolerance/apply\n"))
            return
        want = "POST" if path == "apply" else "GET"
        if req.method != want:
            _send(conn, response(405, f"{want} only\n".encode(), extra=f"Allow: {want}\r\n"))
            return
        if self.loopback and not _host_allowed(req.host):
            _send(conn, response(403, b"this server answers to its address or localhost only\n"))
            return
        if not self.control.allows(req.headers.get("authorization")):
            _send(conn, response(401, _json({"error": "the run's bearer token is needed: "
                                                       "Authorization: Bearer TOKEN"}),
                                 "application/json",
                                 extra='WWW-Authenticate: Bearer realm="inferris-dist"\r\n'))
            return
        if path == "status":
            code, body = self.control.ask({"op": "status"})
            _send(conn, response(code, _json(body), "application/json"))
            return
        if req.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            _send(conn, response(415, _json({"error": "the body must be application/json"}),
                                 "application/json"))
            return
        try:
            body = json.loads(read_body(conn, req, time.monotonic() + HEAD_SECONDS))
        except BadRequest as e:
            _send(conn, response(e.status, _json({"error": str(e)}), "application/json"))
            return
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            _send(conn, response(400, _json({"error": 'the body must be a JSON object {"id", '
                                                       '"instruction", "epoch"}'}), "application/json"))
            return
        code, answer = self.control.ask({"op": "apply", "id": body.get("id"),
                                         "instruction": body.get("instruction"), "epoch": body.get("epoch")})
        _send(conn, response(code, _json(answer), "application/json"))

    def _built_for(self, what: str) -> bytes:
        """The body of `/`, `/data` or `/page.html` for the state last published, built once
        per published state: a client that comes while it is being built waits for that build,
        and one that comes with nothing new takes the bytes built before. What a client can
        make the server do is one build per published state (at most every PUBLISH_SECONDS), and
        these bodies are sent PAGE_SECONDS apart at most, whoever asks (a client asking again and
        again waits, at most MAX_CLIENTS * PAGE_SECONDS)."""
        with self._pace:                       # clients asking again and again wait their turn
            now = time.monotonic()
            turn = max(now, self._next_page)
            self._next_page = turn + PAGE_SECONDS
        if turn > now:
            self.stopping.wait(turn - now)
        with self.published:
            self.published.wait_for(lambda: self.message is not None or self.stopping.is_set(), HEAD_SECONDS)
            seq, data = self.message_seq, self.page_news
        with self._build_locks[what]:
            built = self._built.get(what)
            if built is not None and (built[0] >= seq or time.monotonic() - built[1] < REBUILD_SECONDS):
                return built[2]                # the same state, or one built a moment ago
            if data is None:                   # nothing published (stopping): the state as it is
                with self.state.lock:
                    data = finite(self.state.page_data())
            if what == "/":
                from inferris_dist.page import page_html
                body = page_html(data, data["title"], live=True).encode("utf-8")
                self.page_builds += 1
            elif what == "/data":
                body = _json(data)
            else:                              # the whole log read again, as --html reads it
                body = self.page_file().encode("utf-8")
            self._built[what] = (seq, time.monotonic(), body)
            return body

    # -- the event stream

    def _stream(self, conn: socket.socket) -> None:
        with self.lock:
            if self.streams >= MAX_STREAMS:
                full = True
            else:
                full = False
                self.streams += 1
        if full:
            _send(conn, REFUSED)
            return
        try:
            _send(conn, (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{COMMON}\r\n"
                         f"retry: 2000\n\n").encode("ascii"))
            sent = 0
            while not self.stopping.is_set():
                with self.published:
                    if self.message_seq == sent and not self.stopping.is_set():
                        self.published.wait(HEARTBEAT_SECONDS)
                    seq, message, final = self.message_seq, self.message, self.final_seq
                if self.stopping.is_set():
                    return
                if seq == sent or message is None:
                    _send(conn, b": still here\n\n")
                    continue
                _send(conn, message)
                sent = seq
                if final is not None and seq >= final:
                    _wait_closed(conn, DRAIN_SECONDS, self.stopping)
                    return
        finally:
            with self.lock:
                self.streams -= 1

    def _publish(self) -> None:
        """Each time the state moves: one message for every stream (the page's data and where
        the run is), at most every PUBLISH_SECONDS, sooner for what is urgent."""
        state = self.state
        built_version, last = -1, 0.0
        while not self.stopping.is_set():
            with state.changed:
                while state.version == built_version and not self.stopping.is_set():
                    state.changed.wait(1.0)
                urgent = state.take_urgent()
            if self.stopping.is_set():
                return
            gap = max(4 * self.build_seconds, 0.05 if urgent else PUBLISH_SECONDS)
            wait = last + gap - time.monotonic()
            if wait > 0 and self.stopping.wait(wait):
                return
            started = time.monotonic()
            with state.lock:
                built_version = state.version
                news = {"live": state.live_json(), "page": state.page_data()}
                ended = state.ended
            news = finite(news)
            text = json.dumps(news, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
            message = f"id: {built_version}\nevent: state\ndata: {text}\n\n".encode("ascii")
            last = time.monotonic()
            self.build_seconds = last - started
            with self.published:
                self.message = message
                self.page_news = news["page"]
                self.message_seq += 1
                if ended and self.final_seq is None:
                    self.final_seq = self.message_seq
                self.published.notify_all()

    def ended_and_told(self) -> bool:
        """The run's end is in the message the streams get."""
        with self.published:
            return self.final_seq is not None


def _send(conn: socket.socket, data: bytes) -> None:
    """All of `data`, or the client is dropped (socket.timeout is an OSError)."""
    conn.settimeout(SEND_SECONDS)
    conn.sendall(data)


def _refuse(conn: socket.socket) -> None:
    """503 without reading the request, without waiting for the client."""
    try:
        conn.setblocking(False)
        conn.send(REFUSED)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(65536)             # what already came, dropped: a close with it unread resets
    except OSError:
        pass
    finally:
        _shut(conn)


def _close(conn: socket.socket) -> None:
    """Close after the response: what the client still sends is read and dropped for a moment
    (up to 64 kB, 0.2 s), so that closing with unread bytes does not reset the connection and
    lose the response on its way."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.2)
        left = 64 << 10
        while left > 0 and (chunk := conn.recv(16384)):
            left -= len(chunk)
    except OSError:
        pass
    finally:
        _shut(conn)


def _shut(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass


def _wait_closed(conn: socket.socket, seconds: float, stopping: threading.Event) -> None:
    """After the last message: until the client closes (a page closes its stream when told the
    run ended), the server stops, or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not stopping.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        conn.settimeout(min(left, 0.2))
        try:
            if not conn.recv(1024):
                return
        except socket.timeout:
            continue


# -- following -----------------------------------------------------------------------------------

def follow(follower: LogFollower, state: LiveState, stop: threading.Event,
           alive: Callable[[], bool] = lambda: True) -> bool:
    """Feed `state` the log's records as they are written, until its end record (True), `stop`
    is set or `alive()` turns false and nothing more comes (False)."""
    while not stop.is_set():
        records = follower.poll()
        if records:
            state.add(records)
            if state.ended:
                return True
            continue
        if follower.truncated():
            state.stopped("the log became shorter than what was read of it (replaced or cut)")
            return False
        if not alive():
            records = follower.poll()
            if records:
                state.add(records)
                continue
            return state.ended
        stop.wait(POLL_SECONDS)
    return False
