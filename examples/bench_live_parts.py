"""What the standard library's HTTP server and prometheus_client's histograms would cost the
live server, measured: the reasons `serve` keeps its own bounded server and its own histograms
(docs/ARCHITECTURE.md, "Written by hand, and why").

    python examples/bench_live_parts.py [--slow-seconds S]

It starts `http.server.ThreadingHTTPServer` on loopback with a handler whose socket timeout is
5 s (the live server's HEAD_SECONDS), sends it a request head of about 6 MB and a client that
sends one byte a second, and times an observation in the live state's `Histogram` against
`prometheus_client.Histogram` (unregistered, with and without a label).
"""
from __future__ import annotations

import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import Histogram as ClientHistogram

from inferris_dist.live.server import HEAD_SECONDS, MAX_HEAD
from inferris_dist.live.state import RTT_BUCKETS, Histogram


class _Handler(BaseHTTPRequestHandler):
    timeout = HEAD_SECONDS

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _stdlib_server() -> tuple[ThreadingHTTPServer, int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def big_head(port: int) -> tuple[int, bytes]:
    lines = b"".join(b"X-%d: " % i + b"a" * 60_000 + b"\r\n" for i in range(99))
    head = b"GET / HTTP/1.1\r\n" + lines + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(head)
        return len(head), c.recv(32).split(b"\r\n")[0]


def slow_client(port: int, seconds: float) -> bool:
    """Send one byte a second for `seconds`: is the connection still open at the end?"""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        sent, until = 0, time.monotonic() + seconds
        while time.monotonic() < until:
            c.send(b"GET / HTTP/1.1\r\n"[sent % 16:sent % 16 + 1])
            sent += 1
            time.sleep(1.0)        # the client's pace is the point of the measure
        c.settimeout(0.2)
        try:
            return c.recv(1) != b""
        except socket.timeout:
            return True


def per_observe(observe, values) -> float:
    t = time.perf_counter()
    for v in values:
        observe(v)
    return (time.perf_counter() - t) / len(values) * 1e9


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow-seconds", type=float, default=2 * HEAD_SECONDS,
                    help=f"how long the slow client sends (default {2 * HEAD_SECONDS:g}: twice the live "
                         f"server's limit)")
    slow_s = ap.parse_args().slow_seconds
    srv, port = _stdlib_server()
    size, answer = big_head(port)
    print(f"http.server: a head of {size / 1e6:.1f} MB answered {answer.decode()!r} "
          f"(the live server's cap: {MAX_HEAD} bytes, 431 past it)")
    held = slow_client(port, slow_s)
    print(f"http.server: a client sending a byte a second held after {slow_s:g} s: {held} "
          f"(the live server closes a head not sent within {HEAD_SECONDS:g} s)")
    srv.shutdown()
    values = [random.random() * 0.01 for _ in range(200_000)]
    ours = Histogram(RTT_BUCKETS)
    theirs = ClientHistogram("x", "x", buckets=RTT_BUCKETS, registry=None)
    labelled = ClientHistogram("y", "y", ["rank"], buckets=RTT_BUCKETS, registry=None)
    print(f"an observation: live state {per_observe(ours.observe, values):.0f} ns, prometheus_client "
          f"{per_observe(theirs.observe, values):.0f} ns, with a rank label "
          f"{per_observe(lambda v: labelled.labels('0').observe(v), values):.0f} ns")


if __name__ == "__main__":
    main()
