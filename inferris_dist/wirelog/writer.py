"""The wire log's writer: one JSON line per message that crossed and per event, as the schema
(wirelog/schema.py) says, and the run event's account of its workload (`workload_fields`)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, TextIO

from inferris_dist.protocol.wire import to_jsonable

WORKLOAD_INLINE = 1 << 20     # bytes: a workload encoded within this is written whole in the run event


def workload_dict(workload) -> dict:
    """A workload as the run event records it: SPEC §1 JSON of what the reference engine depends
    on, its engine values and its requests (every prompt by its tokens); not its faults, which
    the run event lists apart."""
    out = workload.to_dict()
    out.pop("faults", None)
    return out


def workload_fields(workload) -> dict:
    """The run event's account of its workload: `workload_digest` always ("sha256:" and the hex
    digest of workload_dict's canonical JSON: keys sorted, no spaces), and `workload`, the
    dict itself, when that JSON is at most WORKLOAD_INLINE bytes. Hashed as it is encoded, so a
    big workload costs no second copy of its text. The last few workloads' fields are kept (runs
    of one workload, chaos's, and the checks of their logs, compute them once); what is handed
    out is a new dict each time, its `workload` shared and never to be changed."""
    try:
        kept = _FIELDS.get(workload)
    except TypeError:                    # a workload that does not hash: computed each time
        kept = None
    if kept is None:
        kept = _fields_of(workload)
        if len(_FIELDS) >= MAX_FIELDS_KEPT:
            _FIELDS.pop(next(iter(_FIELDS)))
        try:
            _FIELDS[workload] = kept
        except TypeError:
            pass
    return dict(kept)


_FIELDS: dict = {}
MAX_FIELDS_KEPT = 8


def _fields_of(workload) -> dict:
    data = workload_dict(workload)
    digest, size = hashlib.sha256(), 0
    for chunk in _CANONICAL.iterencode(data):
        piece = chunk.encode("ascii")
        digest.update(piece)
        size += len(piece)
    out = {"workload_digest": "sha256:" + digest.hexdigest()}
    if size <= WORKLOAD_INLINE:
        out["workload"] = data
    return out


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)

BUFFERED_EVENTS = frozenset({"phase", "attempt", "step"})   # one per step or more: not flushed each
FLUSH_EVERY = 0.2      # seconds: while steps commit, what is buffered reaches the file this often
CHECK_ENV = "INFERRIS_DIST_CHECK_WIRE_LOG"     # "1": every WireLog checks what it writes (the tests)


class WireLog:
    """One JSON line per message that crossed, and per event (drop, loss, restart), each as
    the schema (wirelog/schema.py) says.

    `checked` (default: the environment's INFERRIS_DIST_CHECK_WIRE_LOG is "1"): every record
    is checked against the schema before it is written, and one that is not as the schema
    says (an unknown event or field, a missing one, a value of another kind) raises
    SchemaError. The test suite turns it on; a production run does not pay for it: the check
    is put in place of the plain write once, here, not asked about per message."""

    def __init__(self, stream: TextIO, name: str = "--wire-log", checked: bool | None = None):
        self.stream = stream
        self.name = f"{name} {getattr(stream, 'name', '')}".strip()
        self.broken: OSError | None = None    # the first write that failed: nothing is written after
        self._flushed = time.monotonic()      # when the buffer last went to the file
        self._body: Any = None                # the last body logged, and its JSON-able form: a
        self._jsonable: Any = None            # plan goes to every rank, equal results come as one
        if checked if checked is not None else os.environ.get(CHECK_ENV) == "1":
            self._write = self._checked_write

    def message(self, direction: str, rank: int | None, epoch: int, step: int, kind: str,
                num_bytes: int | None, body: Any, t: float | None = None, **extra: Any) -> None:
        """A message that crossed; `t` when it crossed (default: now), `extra` what more is known
        of it (a RESULT's send time, round trip and the rank's own times)."""
        if body is not self._body:
            self._body, self._jsonable = body, to_jsonable(body)
        self._write({"t": round(time.monotonic() if t is None else t, 6), "dir": direction,
                     "rank": rank, "epoch": epoch, "step": step, "type": kind, "bytes": num_bytes,
                     "body": self._jsonable, **extra})

    def event(self, event: str, t: float | None = None, **fields: Any) -> None:
        """Something that happened (`t`: when it began, default now). A loss, a restart or a
        note is flushed at once, so `tail -f` sees it as it happens; messages and the per-step
        events are written through the buffer, which a per-step event flushes when the last
        flush is FLUSH_EVERY old (a follower sees the steps within a fraction of a second, and
        a fast run does not pay a flush per line)."""
        now = time.monotonic()
        self._write({"t": round(now if t is None else t, 6), "event": event, **fields})
        if self.broken is None and (event not in BUFFERED_EVENTS or now - self._flushed >= FLUSH_EVERY):
            try:
                self.stream.flush()
                self._flushed = now
            except OSError as e:
                self._lost(e)

    def flush(self) -> None:
        """What is buffered, to the file now (the run is about to wait: a follower sees it)."""
        if self.broken is None:
            try:
                self.stream.flush()
                self._flushed = time.monotonic()
            except OSError as e:
                self._lost(e)

    def _write(self, obj: dict) -> None:
        """One line; a write the machine refuses (a full disk) loses the log, not the run: it
        is remembered, said at the end, and nothing more is written."""
        if self.broken is not None:
            return
        try:
            self.stream.write(json.dumps(obj) + "\n")
        except OSError as e:
            self._lost(e)

    def _checked_write(self, obj: dict) -> None:
        from inferris_dist.wirelog.schema import check_record  # only when asked to check
        check_record(obj)          # SchemaError: the writer drifted from the schema
        WireLog._write(self, obj)

    def _lost(self, e: OSError) -> None:
        self.broken = OSError(e.errno, e.strerror, getattr(self.stream, "name", None))
