"""Workloads (SPEC §1): the engine's configuration and its requests, validated.

`load_workload` is the one door in: it takes a dict or the path of a JSON
file, applies every rule of SPEC §1 and returns a frozen `Workload`, or
raises `WorkloadError` with one line naming the key, the request and the value.
"""
from __future__ import annotations

import json
import os
import select
import stat
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from .errors import WorkloadError

# key -> smallest allowed value (the defaults are EngineConfig's)
ENGINE_KEYS: dict[str, int] = {
    "max_step_tokens": 1,
    "page_size": 1,
    "num_pages": 1,
    "spec_len": 0,
    "world_size": 1,
}
# Far beyond any workload this engine is for, and short of exhausting memory.
MAX_VALUE = 1 << 24
MAX_WORLD_SIZE = 256
REQUEST_KEYS = ("request_id", "tokens", "prompt_len", "max_new_tokens", "arrival_step",
                "eos_after", "accept_script")
TOP_KEYS = ("engine", "requests", "faults")

# A prompt given by length at list index i gets tokens 1000*i, 1000*i+1, ...
PROMPT_STRIDE = 1000


class EngineConfig(NamedTuple):
    max_step_tokens: int = 8
    page_size: int = 4
    num_pages: int = 8
    spec_len: int = 0
    world_size: int = 1


class RequestSpec(NamedTuple):
    request_id: str
    tokens: tuple[int, ...]
    max_new_tokens: int
    arrival_step: int = 0
    eos_after: int | None = None
    accept_script: tuple[int, ...] | None = None


class Workload(NamedTuple):
    config: EngineConfig
    requests: tuple[RequestSpec, ...]
    # Fault specs carried for the distributed executor; opaque to the engine.
    faults: tuple[str, ...] = ()

    def with_config(self, **knobs: int | None) -> "Workload":
        """Override engine knobs (the command line's), validated like the spec's own."""
        given = {k: v for k, v in knobs.items() if v is not None}
        for key, value in given.items():
            _check_engine_value(key, value)
        return self._replace(config=self.config._replace(**given))

    def to_dict(self) -> dict:
        """The workload as SPEC §1 JSON (requests by explicit tokens)."""
        out: dict[str, Any] = {"engine": self.config._asdict(), "requests": []}
        for r in self.requests:
            out["requests"].append({
                "request_id": r.request_id, "tokens": list(r.tokens),
                "max_new_tokens": r.max_new_tokens, "arrival_step": r.arrival_step,
                "eos_after": r.eos_after,
                "accept_script": None if r.accept_script is None else list(r.accept_script)})
        if self.faults:
            out["faults"] = list(self.faults)
        return out


def load_workload(source: dict | str | Path) -> Workload:
    """Parse and validate a workload: a dict, or the path of a JSON file."""
    if isinstance(source, (str, Path)):
        source = read_json(Path(source))
    return parse_workload(source)


READ_BUDGET = 64 << 20      # bytes of one input file (a spec, a report): far beyond any we write
READ_SECONDS = 10.0         # for an input that is not a regular file (a pipe, a fifo, a device)


def read_json(path: Path) -> Any:
    return parse_json(read_text(path, "spec"), f"spec {path}")


def read_text(path: str | Path, what: str, budget: int = READ_BUDGET, seconds: float = READ_SECONDS) -> str:
    """The UTF-8 text of the file at `path` ("-": standard input), read under a byte budget
    checked while reading, never after: a regular file larger than `budget` is refused by its
    size; anything else (a pipe, a fifo, /dev/zero) is read until its end, `budget` bytes or
    `seconds`, whichever comes first. A fifo that no one writes to is read as empty, not waited
    for. Every failure is a WorkloadError of one line: bad input."""
    said = f"{what} on stdin" if str(path) == "-" else f"{what} {path}"      # how it is named
    if str(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:                       # a text-only stdin (a library caller's StringIO)
            text = sys.stdin.read(budget + 1)
            if len(text) > budget:
                raise WorkloadError(f"{said}: more than {budget:,} bytes (an input may have at most that)")
            return text
        fd, owned = stream.fileno(), False
    else:
        try:
            fd, owned = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), True
        except FileNotFoundError:
            raise WorkloadError(f"cannot read {said}: no such file") from None
        except OSError as e:
            raise WorkloadError(f"cannot read {said}: {e.strerror or e}") from None
    try:
        data = _read_fd(fd, said, budget, seconds)
    finally:
        if owned:
            os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{said} is not UTF-8: byte 0x{e.object[e.start]:02x} at offset "
                            f"{e.start} ({e.reason})") from None


def _read_fd(fd: int, said: str, budget: int, seconds: float) -> bytes:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise WorkloadError(f"cannot read {said}: it is a directory")
    regular = stat.S_ISREG(mode)
    if regular and os.fstat(fd).st_size > budget:
        raise WorkloadError(f"{said}: {os.fstat(fd).st_size:,} bytes, more than the {budget:,} "
                            f"an input may have")
    if not (regular or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise WorkloadError(f"cannot read {said}: not a file, a pipe or a device")
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + seconds
    chunks, size = [], 0
    while True:
        if not regular:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkloadError(f"{said}: not ended within {seconds:g} s")
            if not poller.poll(left * 1000):
                continue
        try:
            chunk = os.read(fd, min(1 << 20, budget + 1 - size))
        except BlockingIOError:
            continue
        except OSError as e:
            raise WorkloadError(f"cannot read {said}: {e.strerror or e}") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > budget:
            raise WorkloadError(f"{said}: more than {budget:,} bytes (an input may have at most that)")
        chunks.append(chunk)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} "
                            f"column {e.colno}") from None
    except RecursionError:
        raise WorkloadError(f"{what} is nested too deeply to be a workload") from None


def parse_workload(data: Any) -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError(f"a workload must be a JSON object, got {_kind(data)}")
    _no_unknown_keys(data, TOP_KEYS, "workload")
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise WorkloadError(f"'engine' must be an object, got {_kind(engine)}")
    _no_unknown_keys(engine, ENGINE_KEYS, "engine")
    for key, value in engine.items():
        _check_engine_value(key, value)
    config = EngineConfig(**engine)

    requests = data.get("requests", [])
    if not isinstance(requests, list):
        raise WorkloadError(f"'requests' must be a list, got {_kind(requests)}")
    specs: list[RequestSpec] = []
    seen: set[str] = set()
    for index, raw in enumerate(requests):
        spec = _parse_request(index, raw)
        if spec.request_id in seen:
            raise WorkloadError(f"duplicate request_id {spec.request_id!r} (request {index})")
        seen.add(spec.request_id)
        specs.append(spec)

    faults = data.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise WorkloadError("'faults' must be a list of strings such as \"1:crash@3\"")
    return Workload(config, tuple(specs), tuple(faults))


def _parse_request(index: int, raw: Any) -> RequestSpec:
    where = f"request {index}"
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where} must be an object, got {_kind(raw)}")
    _no_unknown_keys(raw, REQUEST_KEYS, where)       # before anything else: `id` is a typo, not a null
    rid = raw.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise WorkloadError(f"{where}: 'request_id' must be a non-empty string, got {_show(rid)}")
    try:
        rid.encode("utf-8")             # the wire carries it as UTF-8: a lone surrogate cannot go
    except UnicodeEncodeError as e:
        raise WorkloadError(f"{where}: 'request_id' must be encodable as UTF-8, got {_show(rid)} "
                            f"(a lone surrogate {_show(rid[e.start])} at character {e.start})") from None
    where = f"request {rid!r}"
    if ("tokens" in raw) == ("prompt_len" in raw):
        raise WorkloadError(f"{where}: give exactly one of 'tokens' and 'prompt_len'")
    if "tokens" in raw:
        tokens = raw["tokens"]
        # every token checked, at C speed: `type(t) is int` (JSON gives no int subclass but bool)
        if not isinstance(tokens, list) or not tokens or not _INT_ONLY.issuperset(map(type, tokens)):
            raise WorkloadError(f"{where}: 'tokens' must be a non-empty list of integers")
        tokens = tuple(tokens)
    else:
        prompt_len = _int_at_least(raw["prompt_len"], 1, where, "prompt_len")
        base = PROMPT_STRIDE * index
        tokens = tuple(range(base, base + prompt_len))
    if "max_new_tokens" not in raw:
        raise WorkloadError(f"{where}: 'max_new_tokens' is required")
    max_new = _int_at_least(raw["max_new_tokens"], 1, where, "max_new_tokens")
    arrival = _int_at_least(raw.get("arrival_step", 0), 0, where, "arrival_step")
    eos_after = raw.get("eos_after")
    if eos_after is not None:
        eos_after = _int_at_least(eos_after, 0, where, "eos_after")
    script = raw.get("accept_script")
    if script is not None:
        # plain ints are told at C speed; anything else goes through _is_int, one at a time
        if not isinstance(script, list) or not (_INT_ONLY.issuperset(map(type, script))
                                                or all(_is_int(a) for a in script)):
            raise WorkloadError(f"{where}: 'accept_script' must be a list of integers or null")
        big = None
        if script and (min(script) < -MAX_VALUE or max(script) > MAX_VALUE):
            big = next(a for a in script if not -MAX_VALUE <= a <= MAX_VALUE)
        if big is not None:       # clamped to 0..drafted anyway; bounded so every executor can carry it
            raise WorkloadError(f"{where}: 'accept_script' entries must be within "
                                f"-{MAX_VALUE}..{MAX_VALUE}, got {big}")
        script = tuple(script)
    return RequestSpec(rid, tokens, max_new, arrival, eos_after, script)


def _check_engine_value(key: str, value: Any) -> None:
    if key not in ENGINE_KEYS:
        raise WorkloadError(f"unknown engine key {key!r}")
    high = MAX_WORLD_SIZE if key == "world_size" else MAX_VALUE
    _int_at_least(value, ENGINE_KEYS[key], "engine", key, high)


def _int_at_least(value: Any, low: int, where: str, key: str, high: int = MAX_VALUE) -> int:
    if not _is_int(value) or not low <= value <= high:
        rel = "> 0" if low == 1 else f">= {low}"
        raise WorkloadError(f"{where}: '{key}' must be an integer {rel} and <= {high}, got {_show(value)}")
    return value


# keys people write for the ones meant (not close in spelling, so difflib alone would miss them)
_MEANT = {"id": "request_id", "name": "request_id", "prompt": "tokens", "max_new": "max_new_tokens",
          "max_tokens": "max_new_tokens", "arrival": "arrival_step", "eos": "eos_after"}


def _no_unknown_keys(obj: dict, allowed, where: str) -> None:
    known = allowed.keys() if isinstance(allowed, dict) else _KNOWN[allowed]
    if obj.keys() <= known:                    # the usual case, told at C speed
        return
    for key in obj:
        if key not in allowed:
            import difflib  # only for a key nobody knows
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            meant = _MEANT.get(key) if _MEANT.get(key) in allowed else (close[0] if close else None)
            hint = f"; did you mean {meant!r}?" if meant else f" (known keys: {', '.join(allowed)})"
            raise WorkloadError(f"unknown key {key!r} in {where}{hint}")


_INT_ONLY = frozenset((int,))
_KNOWN = {keys: frozenset(keys) for keys in (TOP_KEYS, REQUEST_KEYS)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else _kind(value)
