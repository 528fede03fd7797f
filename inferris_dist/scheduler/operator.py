"""The operator's desk: where a paused run (`--on-rank-loss pause`) waits for an instruction.

A run under pause commits nothing more after a loss, says its status here, and waits for
one of INSTRUCTIONS: retry (restore), scale-down (shrink), scale-up (back to the size asked
for) or abort. Instructions come from any thread: the live server's (its HTTP API reaches
the desk over a socket, `serve_socket`), or a chaos schedule's scripted operator calling
`apply` itself. The desk's rules are the same for both, and are the only ones:

- an instruction names the epoch the run paused in: one for another epoch is refused (409);
- one while nothing is paused is refused (409), and so is a second while the first is
  being carried out;
- an id applied twice acts once: the second gets the first's answer, whenever it comes;
- a refusal is not an answer to keep: the same id may be applied again later.

The status says the phase (running, paused, recovering, failed, ended), the epoch, the
requested and effective world size, the survivors and the ranks lost (each with why), and
what can be done. The scheduler's main thread sets it; `wait` hands it the next accepted
instruction, or None when the pause timeout passes.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import OrderedDict

INSTRUCTIONS = ("retry", "scale-down", "scale-up", "abort")
PHASES = ("starting", "running", "paused", "recovering", "failed", "ended")
MAX_ANSWERS = 1024            # answered ids kept (a replay older than that acts again)
MAX_ID = 128                  # characters of an instruction id
MAX_LINE = 4096               # bytes of one request on the desk's socket
ANSWER_WAIT_S = 60.0          # how long an apply waits for the scheduler to carry it out


class Desk:
    def __init__(self, pause_timeout: float = 300.0, default: str = "abort"):
        self.pause_timeout = pause_timeout
        self.default = default
        self.changed = threading.Condition()
        self.status: dict = {"phase": "starting", "epoch": 0}
        self.answers: OrderedDict[str, tuple[int, dict]] = OrderedDict()
        self.pending: tuple[str, str] | None = None     # (id, instruction) accepted, not carried out
        self.carrying: str | None = None                # the id being carried out
        self.fleeting: set[str] = set()                 # ids answered with a refusal, not kept

    # -- any thread ---------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self.changed:
            return dict(self.status)

    def apply(self, ident, instruction, epoch, wait: float = ANSWER_WAIT_S) -> tuple[int, dict]:
        """An instruction: (HTTP status, answer). Validated, then refused (409) or carried out by
        the scheduler, whose answer comes back (an id seen before: its first answer)."""
        if not isinstance(ident, str) or not 0 < len(ident) <= MAX_ID or not ident.isprintable():
            return 400, {"error": f"'id' must be a string of 1 to {MAX_ID} printable characters"}
        if instruction not in INSTRUCTIONS:
            return 400, {"error": f"'instruction' must be one of {', '.join(INSTRUCTIONS)}"}
        if type(epoch) is not int:
            return 400, {"error": "'epoch' must be an integer: the epoch the run paused in (see status)"}
        deadline = time.monotonic() + wait
        with self.changed:
            if ident in self.answers:
                return self.answers[ident]
            if ident not in (self.carrying, self.pending and self.pending[0]):
                status = self.status
                if status["phase"] != "paused":
                    return 409, {"error": f"nothing is paused (the run is {status['phase']})",
                                 "phase": status["phase"], "epoch": status["epoch"]}
                if epoch != status["epoch"]:
                    return 409, {"error": f"epoch {epoch} is not the paused run's epoch {status['epoch']}",
                                 "epoch": status["epoch"]}
                if self.pending is not None or self.carrying is not None:
                    return 409, {"error": "another instruction is being carried out", "epoch": epoch}
                self.pending = (ident, instruction)
                self.changed.notify_all()
            while ident not in self.answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 503, {"error": f"the scheduler did not carry it out within {wait:g} s; "
                                          f"ask the status"}
                self.changed.wait(left)
            if ident in self.fleeting:          # a refusal: said once, the id free again
                self.fleeting.discard(ident)
                return self.answers.pop(ident)
            return self.answers[ident]

    # -- the scheduler's main thread --------------------------------------------------------

    def set(self, **fields) -> None:
        with self.changed:
            self.status = {**self.status, **fields}
            self.changed.notify_all()

    def wait(self, deadline: float) -> tuple[str, str] | None:
        """The next instruction accepted (id, instruction), or None at `deadline`."""
        with self.changed:
            while self.pending is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            ident, instruction = self.pending
            self.pending, self.carrying = None, ident
            self.status = {**self.status, "phase": "recovering"}
            return ident, instruction

    def answer(self, ident: str, code: int, body: dict, keep: bool = True) -> None:
        """The answer to the instruction being carried out: kept for a replay of its id, unless
        it is a refusal (`keep` False: the apply waiting takes it, and the id may come again)."""
        with self.changed:
            self.answers[ident] = (code, body)
            if not keep:
                self.fleeting.add(ident)
                if self.status["phase"] == "recovering":
                    self.status = {**self.status, "phase": "paused"}   # refused: still paused, at once
            while len(self.answers) > MAX_ANSWERS:
                self.answers.popitem(last=False)
            self.carrying = None
            self.changed.notify_all()


def serve_socket(desk: Desk, sock: socket.socket, stop: threading.Event) -> threading.Thread:
    """Answer the live server over `sock` (one JSON line per request: {"op": "status"} or
    {"op": "apply", "id", "instruction", "epoch"}; one JSON line per answer: {"code", "body"}),
    on a thread of its own until `stop` or the socket closes."""
    def run() -> None:
        sock.settimeout(0.2)
        buf = b""
        while not stop.is_set():
            try:
                chunk = sock.recv(MAX_LINE)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                code, body = _one(desk, line)
                try:
                    sock.sendall(json.dumps({"code": code, "body": body}).encode() + b"\n")
                except OSError:
                    return
            if len(buf) > MAX_LINE:
                return                       # not our server: stop listening to it
    t = threading.Thread(target=run, name="operator-desk", daemon=True)
    t.start()
    return t


def _one(desk: Desk, line: bytes) -> tuple[int, dict]:
    try:
        req = json.loads(line)
    except (ValueError, RecursionError):
        return 400, {"error": "not JSON"}
    if not isinstance(req, dict):
        return 400, {"error": "not a JSON object"}
    if req.get("op") == "status":
        return 200, desk.snapshot()
    if req.get("op") == "apply":
        return desk.apply(req.get("id"), req.get("instruction"), req.get("epoch"))
    return 400, {"error": "unknown op"}
