"""The wire: typed messages between the scheduler and its rank workers.

A message is two ZeroMQ frames, both msgpack: a header
`[version, type, epoch, step, rank, world_size]` and a body whose shape the
type fixes. The plan body is encoded once per step and the same bytes go to
every rank; only the small header differs. Decoding is bounded (frame size,
string, array and map lengths; no ext types) and goes through the explicit
table below: no pickle, no eval, no lookup of a class by name. Anything
malformed is a `WireError`, which the receiver attributes to the sender.

A PLAN and a RESULT are columnar: the request ids as a msgpack array of
strings, every integer field as a column of little-endian int32 in
one bin, and the page ids of all items concatenated in another:

    PLAN    [step, [request_id...], cols, pages]
            cols: start_position[n] num_tokens[n] draft_len[n] decode[n] verdict_index[n] num_pages[n]
    RESULT  [[request_id...], cols, writes]
            cols: start_position[n] executed_tokens[n] accepted[n] num_writes[n]

Item i's placements (writes) are the next num_pages[i] (num_writes[i]) ids of
`pages` (`writes`). Every check runs over whole columns in C (min, max, sum);
decoded, a plan is still an `ExecutionPlan` of `PlanItem`s and a result a tuple
of `ItemOutcome`s, so everything past the wire sees items. An honest rank's
RESULT repeats the plan's columns but for `accepted`: it is built from the
plan's bytes, and the scheduler reads it back against the plan it sent.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
import sys
from array import array
from enum import IntEnum
from itertools import accumulate, chain
from typing import Any, NamedTuple

import msgpack

from inferris_dist.engine.messages import ExecutionPlan, ItemOutcome, new_item, new_outcome
from inferris_dist.protocol.limits import MAX_STEP_COST_NS, MAX_TOKEN_COST_NS

PROTOCOL_VERSION = 7   # both sides speak exactly this one (a peer of another version is refused)
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
    FIRED = 10     # worker -> scheduler: the one-shot faults of mine this step's plan set off
    RESIZE = 11    # scheduler -> member: the world changed size; your rank, shard and faults in it


_TYPE_OF = {int(t): t for t in MsgType}
_INT_ONLY = frozenset((int,))     # `type(v) is int` for every v, told at C speed (a bool is no int)


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
    exec_cost: tuple[int, int] = (0, 0)   # ns per step, ns per token: a model's time (--exec-cost)


class Resize(NamedTuple):
    """A kept member's place in a world of another size (its new rank and world size are the
    header's): the shard it holds there, and its faults from now on."""
    shard: list            # SlotStore snapshot: the whole shard, replacing what it held
    faults: list[str]


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
    if kind is MsgType.PLAN:
        return encode_plan(body)[0]
    if kind is MsgType.RESULT:
        return encode_result(body)
    if kind is MsgType.SHARD or kind is MsgType.CONFIG or kind is MsgType.RESIZE:
        body = _pack_masks(kind, body)
    return msgpack.packb(body)


def _unpack(frame: bytes, limit: int, max_bin: int = MAX_STR_LEN) -> Any:
    if len(frame) > limit:
        raise WireError(f"frame of {len(frame)} bytes exceeds the {limit}-byte cap")
    try:
        # No container can hold more entries than the frame has bytes: capping the
        # lengths by the frame's size keeps a small hostile frame cheap to refuse.
        size = len(frame)
        return msgpack.unpackb(frame, use_list=False, raw=False, strict_map_key=True,
                               max_str_len=min(MAX_STR_LEN, size), max_bin_len=min(max_bin, size),
                               max_array_len=min(MAX_ARRAY_LEN, size), max_map_len=min(MAX_MAP_LEN, size),
                               max_ext_len=0)
    except Exception as e:  # msgpack raises many kinds on hostile input; all mean "malformed"
        raise WireError(f"undecodable frame ({type(e).__name__})") from None


def decode_header(frame: bytes) -> Header:
    raw = _unpack(frame, MAX_HEADER_BYTES)
    if type(raw) is not tuple or len(raw) != 6 or not _INT_ONLY.issuperset(map(type, raw)):
        raise WireError("malformed header")
    if raw[0] != PROTOCOL_VERSION:
        raise WireError(f"protocol version {raw[0]}, want {PROTOCOL_VERSION}")
    kind = _TYPE_OF.get(raw[1])           # a dict, not MsgType(n): the enum's call costs us
    if kind is None:
        raise WireError(f"unknown message type {raw[1]}")
    return Header(raw[0], kind, raw[2], raw[3], raw[4], raw[5])


def decode_body(kind: MsgType, frame: bytes) -> Any:
    return _DECODERS[kind](_unpack(frame, MAX_FRAME_BYTES, _MAX_BIN.get(kind, MAX_STR_LEN)))


# -- the columnar PLAN and RESULT ------------------------------------------------------------

_I32 = next((code for code in "il" if array(code).itemsize == 4), None)
if _I32 is None:  # pragma: no cover - a host without a 4-byte C int or long
    raise ImportError("inferris_dist.protocol.wire needs a 4-byte array type for its int32 columns")
_SWAP = sys.byteorder != "little"          # the columns are little-endian on every host
_MAX_BIN = {MsgType.PLAN: MAX_FRAME_BYTES, MsgType.RESULT: MAX_FRAME_BYTES}   # columns: one bin each
PLAN_COLUMNS = ("start_position", "num_tokens", "draft_len", "decode", "verdict_index", "num_pages",
                "prior_drafts")
RESULT_COLUMNS = ("start_position", "executed_tokens", "accepted", "num_writes")
_BOOLS = (False, True)
_STR = frozenset((str,))


def int32_bytes(values, count: int | None = None) -> bytes:
    """`count` integers (all of `values` if None) as a little-endian int32 column (struct's
    standard sizes: the same bytes on every host); WireError if one is no int or does not fit."""
    if count is None:
        values = list(values)
        count = len(values)
    try:
        return struct.pack(f"<{count}i", *values)
    except struct.error:
        raise WireError("a value that is no int32 in a column") from None


def int32_column(raw: bytes, what: str) -> array:
    """A little-endian int32 column as an array (WireError unless whole int32s)."""
    if len(raw) & 3:
        raise WireError(f"malformed {what}: {len(raw)} bytes are no whole int32s")
    column = array(_I32)
    column.frombytes(raw)
    if _SWAP:  # pragma: no cover - big-endian hosts
        column.byteswap()
    return column


class PlanColumns(NamedTuple):
    """A PLAN as it crossed, checked: what a rank executes without building items."""
    step: int
    request_ids: tuple[str, ...]
    cols: array              # len(PLAN_COLUMNS) columns of n, one after the other
    pages: array             # every item's page ids, concatenated
    raw_cols: bytes          # the same, as they came (an honest RESULT repeats them)
    raw_pages: bytes

    def column(self, name: str) -> array:
        n = len(self.request_ids)
        k = PLAN_COLUMNS.index(name)
        return self.cols[k * n:(k + 1) * n]


class SentPlan(NamedTuple):
    """What the scheduler keeps of a plan it encoded, to read RESULTs back against it."""
    request_ids: tuple[str, ...]
    starts: tuple[int, ...]
    counts: tuple[int, ...]
    placements: tuple[tuple[int, ...], ...]
    raw_cols: bytes
    raw_pages: bytes


def encode_plan(plan: ExecutionPlan) -> tuple[bytes, SentPlan]:
    """A PLAN body, and what the scheduler keeps to read the RESULTs back against it."""
    step, items = plan
    if not items:
        return msgpack.packb((step, (), b"", b"")), SentPlan((), (), (), (), b"", b"")
    ids, starts, counts, drafts, decodes, verdicts, placements, priors = zip(*items)
    cols = int32_bytes(chain(starts, counts, drafts, decodes, verdicts, map(len, placements), priors),
                       7 * len(ids))
    pages = int32_bytes(chain.from_iterable(placements))
    return (msgpack.packb((step, ids, cols, pages)),
            SentPlan(ids, starts, counts, placements, cols, pages))


def encode_result(outcomes: tuple[ItemOutcome, ...]) -> bytes:
    if not outcomes:
        return msgpack.packb(((), b"", b""))
    ids, starts, executed, accepted, writes = zip(*outcomes)
    return msgpack.packb((ids, int32_bytes(chain(starts, executed, accepted, map(len, writes)), 4 * len(ids)),
                          int32_bytes(chain.from_iterable(writes))))


def encode_result_columns(ids, starts, executed, accepted, num_writes, writes) -> bytes:
    """`encode_result` from columns (a rank that placed items itself: overlap scheduling)."""
    n = len(ids)
    return msgpack.packb((ids, int32_bytes(chain(starts, executed, accepted, num_writes), 4 * n),
                          int32_bytes(writes)))


def encode_result_of(plan: PlanColumns, accepted) -> bytes:
    """An honest rank's RESULT, from the plan's own bytes: its starts, its token counts as
    executed, `accepted` (one per item), its placements as the writes. The same bytes as
    `encode_result` of the outcomes, without building them."""
    n = len(plan.request_ids)
    raw = plan.raw_cols
    if len(accepted) != n:
        raise ValueError(f"{len(accepted)} verdicts for {n} items")
    return msgpack.packb((plan.request_ids, raw[:8 * n] + int32_bytes(accepted, n) + raw[20 * n:24 * n],
                          plan.raw_pages))


def decode_plan_columns(frame: bytes) -> PlanColumns:
    """A PLAN frame, checked over whole columns, as columns (a rank's hot path)."""
    return _plan_columns(_unpack(frame, MAX_FRAME_BYTES, MAX_FRAME_BYTES))


def _ids(ids: tuple, what: str) -> None:
    if not _STR.issuperset(map(type, ids)):
        raise WireError(f"malformed {what}: a request id that is no string")


def _nonnegative(raw: bytes, cols: array, names: tuple[str, ...], what: str) -> None:
    """No int32 of `raw` is negative: no sign bit (the top bit of every fourth byte) is set,
    one pass in C over a quarter of the bytes, without an int made per value."""
    if not raw[3::4].isascii():
        n = len(cols) // len(names)
        k = next(k for k in range(len(names)) if min(cols[k * n:(k + 1) * n]) < 0)
        raise WireError(f"malformed {what}: a negative {names[k]}")


def _plan_columns(body) -> PlanColumns:
    if (type(body) is not tuple or len(body) != 4 or type(body[0]) is not int or type(body[1]) is not tuple
            or type(body[2]) is not bytes or type(body[3]) is not bytes):
        raise WireError("malformed plan")
    step, ids, raw_cols, raw_pages = body
    n = len(ids)
    _ids(ids, "plan")
    if len(raw_cols) != 28 * n:
        raise WireError(f"malformed plan: {len(raw_cols)} bytes of columns for {n} items, want {28 * n}")
    cols = int32_column(raw_cols, "plan columns")
    pages = int32_column(raw_pages, "placements")
    _nonnegative(raw_cols, cols, PLAN_COLUMNS, "plan")
    if n and min(cols[n:2 * n]) < 1:
        raise WireError("malformed plan: an item of no tokens")
    if n and max(cols[3 * n:4 * n]) > 1:
        raise WireError("malformed plan: a decode flag that is neither 0 nor 1")
    if sum(cols[5 * n:6 * n]) != len(pages):
        raise WireError(f"malformed plan: the items claim {sum(cols[5 * n:6 * n])} pages, "
                        f"the placements hold {len(pages)}")
    if not raw_pages[3::4].isascii():
        raise WireError("malformed placements: a negative page id")
    if n and max(cols[6 * n:]):
        _items_ahead(cols, n)
    return PlanColumns(step, ids, cols, pages, raw_cols, raw_pages)


def _items_ahead(cols: array, n: int) -> None:
    """An item planned after `prior_drafts` drafts (overlap) is a decode whose request has a
    verdict before this one, and can start no earlier than position 0."""
    for i in range(n):
        prior = cols[6 * n + i]
        if prior and (not cols[3 * n + i] or cols[4 * n + i] < 1 or prior > cols[i]):
            raise WireError(f"malformed plan: item {i} follows {prior} drafts but is no decode with a "
                            f"verdict before it, or would start before position 0")


def _split(values: array, counts: array) -> list[tuple[int, ...]]:
    """`values` cut into consecutive runs of `counts` (their sum is len(values))."""
    flat = tuple(values)
    ends = list(accumulate(counts))
    return [flat[a:b] for a, b in zip(chain((0,), ends), ends)]


def plan_of(columns: PlanColumns) -> ExecutionPlan:
    """The checked columns as the plan the rest of the code sees: items."""
    ids, cols = columns.request_ids, columns.cols
    n = len(ids)
    if not n:
        return ExecutionPlan(columns.step, ())
    c = [cols[k * n:(k + 1) * n] for k in range(len(PLAN_COLUMNS))]
    items = zip(ids, c[0], c[1], c[2], map(_BOOLS.__getitem__, c[3]), c[4], _split(columns.pages, c[5]), c[6])
    return ExecutionPlan(columns.step, tuple(map(new_item, items)))


def _plan(body) -> ExecutionPlan:
    return plan_of(_plan_columns(body))


def _result_columns(body) -> tuple[tuple[str, ...], array, array, bytes, bytes]:
    if (type(body) is not tuple or len(body) != 3 or type(body[0]) is not tuple
            or type(body[1]) is not bytes or type(body[2]) is not bytes):
        raise WireError("malformed result")
    ids, raw_cols, raw_writes = body
    n = len(ids)
    _ids(ids, "result")
    if len(raw_cols) != 16 * n:
        raise WireError(f"malformed result: {len(raw_cols)} bytes of columns for {n} outcomes, "
                        f"want {16 * n}")
    cols = int32_column(raw_cols, "result columns")
    writes = int32_column(raw_writes, "writes")
    _nonnegative(raw_cols, cols, RESULT_COLUMNS, "result")
    if sum(cols[3 * n:]) != len(writes):
        raise WireError(f"malformed result: the outcomes claim {sum(cols[3 * n:])} writes, "
                        f"the writes hold {len(writes)}")
    if not raw_writes[3::4].isascii():
        raise WireError("malformed writes: a negative page id")
    return ids, cols, writes, raw_cols, raw_writes


def decode_result(frame: bytes, sent: SentPlan | None = None) -> tuple[ItemOutcome, ...]:
    """A RESULT, checked over whole columns, as outcomes. With `sent` (the plan it answers):
    when its ids, starts, counts and writes are the plan's own bytes, the outcomes share the
    plan's values and only `accepted` is read (the same outcomes, built without a split)."""
    return _outcomes(_unpack(frame, MAX_FRAME_BYTES, MAX_FRAME_BYTES), sent)


def _outcomes(body, sent: SentPlan | None = None) -> tuple[ItemOutcome, ...]:
    ids, cols, writes, raw_cols, raw_writes = _result_columns(body)
    n = len(ids)
    if not n:
        return ()
    accepted = cols[2 * n:3 * n]
    if (sent is not None and raw_writes == sent.raw_pages and ids == sent.request_ids
            and raw_cols[:8 * n] == sent.raw_cols[:8 * n]
            and raw_cols[12 * n:] == sent.raw_cols[20 * n:24 * n]):
        return tuple(map(new_outcome, zip(sent.request_ids, sent.starts, sent.counts, accepted,
                                                sent.placements)))
    return tuple(map(new_outcome, zip(ids, cols[:n], cols[n:2 * n], accepted,
                                            _split(writes, cols[3 * n:]))))


# -- body decoders: one per type, each checks the exact shape ---------------------------

def _empty(body) -> tuple:
    if body != ():
        raise WireError("unexpected body")
    return ()


def _hello(body) -> Hello:
    if type(body) is not tuple or len(body) != 2 or type(body[0]) is not int or type(body[1]) is not bytes:
        raise WireError("malformed hello")
    return Hello(*body)


def _config(body) -> Config:
    if type(body) is not tuple or len(body) != 6:
        raise WireError("malformed config")
    num_pages, page_size, scripts, shard, faults, exec_cost = body
    if type(num_pages) is not int or type(page_size) is not int or num_pages < 1 or page_size < 1:
        raise WireError("malformed config geometry")
    if type(scripts) is not dict or not all(
            type(k) is str and type(v) is tuple and all(type(a) is int for a in v)
            for k, v in scripts.items()):
        raise WireError("malformed accept scripts")
    if type(faults) is not tuple or not all(type(f) is str for f in faults):
        raise WireError("malformed faults")
    if (type(exec_cost) is not tuple or len(exec_cost) != 2 or not all(type(c) is int for c in exec_cost)
            or not 0 <= exec_cost[0] <= MAX_STEP_COST_NS or not 0 <= exec_cost[1] <= MAX_TOKEN_COST_NS):
        raise WireError("malformed exec cost")
    return Config(num_pages, page_size, scripts, _shard(shard), list(faults), exec_cost)


def _resize(body) -> Resize:
    if type(body) is not tuple or len(body) != 2:
        raise WireError("malformed resize")
    shard, faults = body
    if type(faults) is not tuple or not all(type(f) is str for f in faults):
        raise WireError("malformed faults")
    return Resize(_shard(shard), list(faults))


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


MAX_FIRED = 64      # faults one FIRED names at most (a rank's faults for one step)


def _fired(body) -> tuple[str, ...]:
    if (type(body) is not tuple or not 0 < len(body) <= MAX_FIRED
            or any(type(t) is not str for t in body)):
        raise WireError("malformed FIRED")
    return body


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
    MsgType.FIRED: _fired,
    MsgType.RESIZE: _resize,
}


def proof_of_secret(secret: bytes, rank: int, world_size: int, pid: int) -> bytes:
    """What a worker shows to prove it holds the run secret without sending it."""
    msg = f"inferris-dist hello v{PROTOCOL_VERSION} rank={rank} world={world_size} pid={pid}"
    return hmac.new(secret, msg.encode(), hashlib.sha256).digest()


def check_proof(secret: bytes, header: Header, hello: Hello) -> bool:
    want = proof_of_secret(secret, header.rank, header.world_size, hello.pid)
    return hmac.compare_digest(want, hello.proof)


_SCALARS = frozenset({int, float, str, bool, type(None)})


def to_jsonable(value: Any) -> Any:
    """A decoded body as JSON-able data, for the wire log. (A body's lists are mostly of plain
    numbers, taken as they are without a call each: the log pays for this once per message.)"""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        scalars = _SCALARS
        return [v if type(v) in scalars else to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "_asdict"):
        return {k: to_jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
