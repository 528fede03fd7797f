"""The wire: typed messages between the scheduler and its rank workers.

A message is two ZeroMQ frames, both msgpack: a header
`[version, type, epoch, step, rank, world_size]` and a body whose shape the
type fixes. The plan body is encoded once per step and the same bytes go to
every rank; only the small header differs. Decoding is bounded (frame size,
string, array and map lengths; no ext types) and goes through the explicit
table below: no pickle, no eval, no lookup of a class by name. Anything
malformed is a `WireError`, which the receiver attributes to the sender.
"""
from __future__ import annotations

import hashlib
import hmac
from enum import IntEnum
from itertools import chain
from typing import Any, NamedTuple

import msgpack

from inferris_dist.engine.messages import ExecutionPlan, ItemOutcome, PlanItem

PROTOCOL_VERSION = 2   # 2: REFUSED tells any peer to exit; HELLO's proof is empty for a CURVE-proven member
MAX_FRAME_BYTES = 64 << 20        # also the sockets' ZMQ_MAXMSGSIZE
MAX_HEADER_BYTES = 256
MAX_HELLO_BYTES = 256             # what an unauthenticated peer may make us decode
MAX_STR_LEN = 1 << 16
MAX_ARRAY_LEN = 1 << 22
MAX_MAP_LEN = 1 << 20


class WireError(Exception):
    """A message that is not a valid message of this protocol."""


class MsgType(IntEnum):
    HELLO = 1      # worker -> scheduler: who I am, and proof I hold the run secret
    CONFIG = 2     # scheduler -> worker: page geometry, accept scripts, shard, faults
    READY = 3      # worker -> scheduler: configured
    PLAN = 4       # scheduler -> worker: the step's ExecutionPlan
    RESULT = 5     # worker -> scheduler: its RankExecutionResult's outcomes
    AUDIT = 6      # scheduler -> worker: report your shard
    SHARD = 7      # worker -> scheduler: the shard snapshot
    STOP = 8       # scheduler -> worker: exit now
    REFUSED = 9    # scheduler -> a would-be or retired worker: why it was turned away; it exits


class Header(NamedTuple):
    version: int
    type: MsgType
    epoch: int
    step: int
    rank: int
    world_size: int


class Hello(NamedTuple):
    pid: int
    proof: bytes


class Config(NamedTuple):
    num_pages: int
    page_size: int
    accept_scripts: dict[str, tuple[int, ...]]
    shard: list            # SlotStore snapshot to start from ([] for an empty shard)
    faults: list[str]      # this rank's injected faults, as given on the command line


# Timing (launch --timeline): a PLAN may carry a third frame TIMING_PLEASE; the rank then
# appends to its RESULT a third frame of four times in its own monotonic clock: the plan
# received, decoded, executed, the result encoded. It travels beside the result, never in the
# bytes the ranks must agree on, and is never joined.
TIMING_PLEASE = b"t"
MAX_TIMING_BYTES = 64


def encode_timing(times: tuple[float, float, float, float]) -> bytes:
    return msgpack.packb(times)


def decode_timing(frame: bytes) -> tuple[float, float, float, float]:
    raw = _unpack(frame, MAX_TIMING_BYTES)
    if (type(raw) is not tuple or len(raw) != 4 or not all(type(t) is float for t in raw)
            or list(raw) != sorted(raw)):
        raise WireError("malformed timing")
    return raw


def encode_header(kind: MsgType, epoch: int, step: int, rank: int, world_size: int) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, int(kind), epoch, step, rank, world_size))


def encode_body(kind: MsgType, body: Any) -> bytes:
    if kind is MsgType.SHARD or kind is MsgType.CONFIG:
        body = _pack_masks(kind, body)
    return msgpack.packb(body)


def _unpack(frame: bytes, limit: int) -> Any:
    if len(frame) > limit:
        raise WireError(f"frame of {len(frame)} bytes exceeds the {limit}-byte cap")
    try:
        # No container can hold more entries than the frame has bytes: capping the
        # lengths by the frame's size keeps a small hostile frame cheap to refuse.
        size = len(frame)
        return msgpack.unpackb(frame, use_list=False, raw=False, strict_map_key=True,
                               max_str_len=min(MAX_STR_LEN, size), max_bin_len=min(MAX_STR_LEN, size),
                               max_array_len=min(MAX_ARRAY_LEN, size), max_map_len=min(MAX_MAP_LEN, size),
                               max_ext_len=0)
    except Exception as e:  # msgpack raises many kinds on hostile input; all mean "malformed"
        raise WireError(f"undecodable frame ({type(e).__name__})") from None


def decode_header(frame: bytes) -> Header:
    raw = _unpack(frame, MAX_HEADER_BYTES)
    if type(raw) is not tuple or len(raw) != 6 or not all(type(v) is int for v in raw):
        raise WireError("malformed header")
    if raw[0] != PROTOCOL_VERSION:
        raise WireError(f"protocol version {raw[0]}, want {PROTOCOL_VERSION}")
    try:
        kind = MsgType(raw[1])
    except ValueError:
        raise WireError(f"unknown message type {raw[1]}") from None
    return Header(raw[0], kind, raw[2], raw[3], raw[4], raw[5])


def decode_body(kind: MsgType, frame: bytes) -> Any:
    return _DECODERS[kind](_unpack(frame, MAX_FRAME_BYTES))


# -- body decoders: one per type, each checks the exact shape ---------------------------

_INT = frozenset((int,))
_STR = frozenset((str,))
_BOOL = frozenset((bool,))
_TUPLE = frozenset((tuple,))
_SEVEN = frozenset((7,))
_FIVE = frozenset((5,))


def _pages(value, what: str) -> tuple:
    if type(value) is not tuple or not _INT.issuperset(map(type, value)):
        raise WireError(f"malformed {what}")
    return value


def _empty(body) -> tuple:
    if body != ():
        raise WireError("unexpected body")
    return ()


def _hello(body) -> Hello:
    if type(body) is not tuple or len(body) != 2 or type(body[0]) is not int or type(body[1]) is not bytes:
        raise WireError("malformed hello")
    return Hello(*body)


def _config(body) -> Config:
    if type(body) is not tuple or len(body) != 5:
        raise WireError("malformed config")
    num_pages, page_size, scripts, shard, faults = body
    if type(num_pages) is not int or type(page_size) is not int or num_pages < 1 or page_size < 1:
        raise WireError("malformed config geometry")
    if type(scripts) is not dict or not all(
            type(k) is str and type(v) is tuple and all(type(a) is int for a in v)
            for k, v in scripts.items()):
        raise WireError("malformed accept scripts")
    if type(faults) is not tuple or not all(type(f) is str for f in faults):
        raise WireError("malformed faults")
    return Config(num_pages, page_size, scripts, _shard(shard), list(faults))


def _plan(body) -> ExecutionPlan:
    """Every check over whole columns (one pass in C per column, not seven per item)."""
    if type(body) is not tuple or len(body) != 2 or type(body[0]) is not int or type(body[1]) is not tuple:
        raise WireError("malformed plan")
    items = body[1]
    if items:
        if not _TUPLE.issuperset(map(type, items)) or not _SEVEN.issuperset(map(len, items)):
            raise WireError("malformed plan item")
        ids, starts, counts, drafts, decodes, verdicts, pages = zip(*items)
        if (not _STR.issuperset(map(type, ids)) or not _INT.issuperset(map(type, starts))
                or not _INT.issuperset(map(type, counts)) or not _INT.issuperset(map(type, drafts))
                or not _BOOL.issuperset(map(type, decodes)) or not _INT.issuperset(map(type, verdicts))):
            raise WireError("malformed plan item")
        if (not _TUPLE.issuperset(map(type, pages))
                or not _INT.issuperset(map(type, chain.from_iterable(pages)))):
            raise WireError("malformed placements")
    return ExecutionPlan(body[0], tuple(map(PlanItem._make, items)))


def _outcomes(body) -> tuple[ItemOutcome, ...]:
    """Every check over whole columns, as for a plan."""
    if type(body) is not tuple:
        raise WireError("malformed result")
    if body:
        if not _TUPLE.issuperset(map(type, body)) or not _FIVE.issuperset(map(len, body)):
            raise WireError("malformed outcome")
        ids, starts, executed, accepted, writes = zip(*body)
        if (not _STR.issuperset(map(type, ids)) or not _INT.issuperset(map(type, starts))
                or not _INT.issuperset(map(type, executed)) or not _INT.issuperset(map(type, accepted))):
            raise WireError("malformed outcome")
        if (not _TUPLE.issuperset(map(type, writes))
                or not _INT.issuperset(map(type, chain.from_iterable(writes)))):
            raise WireError("malformed writes")
    return tuple(map(ItemOutcome._make, body))


def _shard(body) -> list:
    """[(page, [(rid, base, mask bytes)])] -> SlotStore snapshot with int masks."""
    if type(body) is not tuple:
        raise WireError("malformed shard")
    snapshot = []
    for entry in body:
        if (type(entry) is not tuple or len(entry) != 2 or type(entry[0]) is not int
                or type(entry[1]) is not tuple):
            raise WireError("malformed shard page")
        layers = []
        for layer in entry[1]:
            if (type(layer) is not tuple or len(layer) != 3 or type(layer[0]) is not str
                    or type(layer[1]) is not int or type(layer[2]) is not bytes):
                raise WireError("malformed shard layer")
            layers.append((layer[0], layer[1], int.from_bytes(layer[2], "little")))
        snapshot.append((entry[0], layers))
    return snapshot


def _refused(body) -> str:
    if type(body) is not tuple or len(body) != 1 or type(body[0]) is not str:
        raise WireError("malformed refusal")
    return body[0]


def _pack_masks(kind: MsgType, body):
    """Masks are arbitrary-size ints (one bit per slot): they travel as bytes."""
    def pack(snapshot):
        return [(page, [(rid, base, mask.to_bytes((mask.bit_length() + 7) // 8, "little"))
                        for rid, base, mask in layers]) for page, layers in snapshot]
    if kind is MsgType.SHARD:
        return pack(body)
    return body._replace(shard=pack(body.shard))


_DECODERS = {
    MsgType.HELLO: _hello,
    MsgType.CONFIG: _config,
    MsgType.READY: _empty,
    MsgType.PLAN: _plan,
    MsgType.RESULT: _outcomes,
    MsgType.AUDIT: _empty,
    MsgType.SHARD: _shard,
    MsgType.STOP: _empty,
    MsgType.REFUSED: _refused,
}


def proof_of_secret(secret: bytes, rank: int, world_size: int, pid: int) -> bytes:
    """What a worker shows to prove it holds the run secret without sending it."""
    msg = f"inferris-dist hello v{PROTOCOL_VERSION} rank={rank} world={world_size} pid={pid}"
    return hmac.new(secret, msg.encode(), hashlib.sha256).digest()


def check_proof(secret: bytes, header: Header, hello: Hello) -> bool:
    want = proof_of_secret(secret, header.rank, header.world_size, hello.pid)
    return hmac.compare_digest(want, hello.proof)


def to_jsonable(value: Any) -> Any:
    """A decoded body as JSON-able data, for the wire log."""
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "_asdict"):
        return {k: to_jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
