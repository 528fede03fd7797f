"""The live server's line to the operator's desk of a paused run (scheduler/operator.py).

`launch --serve --on-rank-loss pause` hands its server one end of a socket pair and the path of
the bearer token it made. The server checks the token on every /fault-tolerance request
(compared in constant time), then asks the desk over the line: one JSON line out, one back,
one question at a time. What the desk answers is what the operator gets.
"""
from __future__ import annotations

import hmac
import json
import socket
import threading

MAX_TOKEN_BYTES = 256
MAX_ANSWER = 1 << 16          # bytes of one answer from the desk
ASK_SECONDS = 70.0            # the desk waits up to a minute for the scheduler to carry one out


class DeskLine:
    def __init__(self, sock: socket.socket, token_file: str):
        self.sock = sock
        with open(token_file, "rb") as f:
            self.token = f.read(MAX_TOKEN_BYTES).strip()
        self.lock = threading.Lock()
        self.broken = False

    def allows(self, authorization: str | None) -> bool:
        """Whether the request's Authorization header carries the run's bearer token."""
        if not authorization or not self.token:
            return False
        scheme, _, given = authorization.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), self.token)

    def ask(self, request: dict) -> tuple[int, dict]:
        """The desk's answer (HTTP status, body); 503 when the run is gone."""
        with self.lock:
            if self.broken:
                return 503, {"error": "the run is over: nobody is at the desk"}
            try:
                self.sock.settimeout(ASK_SECONDS)
                self.sock.sendall(json.dumps(request).encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = self.sock.recv(MAX_ANSWER)
                    if not chunk or len(data) + len(chunk) > MAX_ANSWER:
                        raise OSError("the desk closed the line")
                    data += chunk
                answer = json.loads(data)
                return int(answer["code"]), answer["body"]
            except (OSError, ValueError, KeyError, TypeError):
                self.broken = True
                return 503, {"error": "the run is over: nobody is at the desk"}
