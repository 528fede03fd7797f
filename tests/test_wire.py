"""The wire (inferris_dist/wire.py) and the scheduler's front door against hostile peers.

1. Every message type round-trips (headers, HELLO, CONFIG with accept scripts and a shard,
   READY, PLAN and RESULT from real engine steps, AUDIT, SHARD with masks wider than 64
   bits, STOP, REFUSED), and re-encoding a decoded body gives the same bytes.
2. Every malformation is a `WireError`, never another exception.
3. Fuzzers (hypothesis): arbitrary bytes, hostile msgpack, near-valid shapes, and byte
   mutations of valid frames: a decode either fails with `WireError` or returns a
   well-typed value, and quickly.
4. Hostile peers against a live `ProcessGroup` on real sockets: during the handshake they
   are refused with a reason that names the problem; during the run they are dropped and
   noted; the run's trace equals the in-process one.
5. Memory: thousands of hostile messages during a run do not grow the scheduler's RSS.
"""
from __future__ import annotations

import json
import struct
import time
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferris_dist.engine import (
    Engine,
    EngineError,
    ExecutionPlan,
    ItemOutcome,
    LocalGroup,
    PlanItem,
    accept_scripts,
)
from inferris_dist.engine.shard import SlotStore
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType, WireError

from tests.helpers.external import golden_workload

pytestmark = [pytest.mark.timeout(30), pytest.mark.procs]   # every test here, one bound

ENGINE_SPECS = ["demo", "speculative", "preemption", "prefix_reuse", "cache_eviction",
                "chunked_prefill", "world_size_8", "random_017", "irreducible"]
OVERLAP_SPECS = ["speculative", "random_011", "random_028"]     # overlap runs that plan items ahead

FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.data_too_large,
                                                  HealthCheck.filter_too_much])
QUICK_S = 0.5            # no single decode may take longer than this


# -- helpers -----------------------------------------------------------------------------------

def roundtrip(kind: MsgType, body):
    frame = wire.encode_body(kind, body)
    decoded = wire.decode_body(kind, frame)
    again = (decoded,) if kind is MsgType.REFUSED else decoded     # a refusal decodes to its reason
    assert wire.encode_body(kind, again) == frame, "re-encoding changed the bytes"
    return decoded


def engine_frames(names=ENGINE_SPECS):
    """(plan, outcomes, shard snapshots, config) from real engine steps of golden workloads."""
    plans, results, shards, configs = [], [], [], []
    for name in names:
        workload = golden_workload(name)
        eng = Engine(workload)
        try:
            while not eng.done:
                prepared = eng.prepare()
                plans.append(prepared.plan)
                result = eng.executor.execute(prepared.plan)
                results.append(result.outcomes)
                eng.commit(prepared, result)
        except EngineError:
            pass
        snaps = eng.executor.shards()
        shards.extend(snaps.values())
        cfg = workload.config
        configs.append(wire.Config(cfg.num_pages, cfg.page_size, accept_scripts(workload),
                                   snaps[0], ["1:crash@3", "0:delay@2:0.5"]))
    for name in OVERLAP_SPECS:                 # and the plans of overlap runs (prior_drafts > 0)
        workload = golden_workload(name)

        class Recording(LocalGroup):
            def execute(self, plan):
                result = super().execute(plan)
                plans.append(plan)
                results.append(result.outcomes)
                return result

        for _ in Engine(workload, Recording(workload), rung="overlap").run():
            pass
    return plans, results, shards, configs


_ENGINE_CACHE = {}


def engine_data():
    if not _ENGINE_CACHE:
        _ENGINE_CACHE["data"] = engine_frames()
    return _ENGINE_CACHE["data"]


def wide_store() -> SlotStore:
    """A shard with page_size 100: masks of up to 100 bits, several layers per page."""
    store = SlotStore(6, 100)
    store.write_span((0, 1, 2), "a", 0, 250)             # full 100-bit masks, then 50 bits
    store.write_run(3, "b", 1000, 3, 97)                   # bits 3..99: the top bit set
    store.write_run(1, "c", 40, 40, 30)                    # a second layer over "a" on page 1
    store.write_run(4, "d", 99, 99, 1)                     # only bit 99
    return store


def check_well_typed(kind: MsgType, value) -> None:
    """What a successful decode must look like, whatever the input was."""
    def pages(v):
        assert type(v) is tuple and all(type(p) is int for p in v)

    def shard(v):
        assert type(v) is list
        for page, layers in v:
            assert type(page) is int and type(layers) is list
            for rid, base, mask in layers:
                assert type(rid) is str and type(base) is int and type(mask) is int and mask >= 0

    if kind is MsgType.HELLO:
        assert type(value) is wire.Hello and type(value.pid) is int and type(value.proof) is bytes
    elif kind is MsgType.CONFIG:
        assert type(value) is wire.Config
        assert type(value.num_pages) is int and value.num_pages >= 1
        assert type(value.page_size) is int and value.page_size >= 1
        assert type(value.accept_scripts) is dict
        for k, v in value.accept_scripts.items():
            assert type(k) is str
            pages(v)
        shard(value.shard)
        assert type(value.faults) is list and all(type(f) is str for f in value.faults)
    elif kind in (MsgType.READY, MsgType.AUDIT, MsgType.STOP):
        assert value == ()
    elif kind is MsgType.PLAN:
        assert type(value) is ExecutionPlan and type(value.step) is int
        assert type(value.items) is tuple
        for item in value.items:
            assert type(item) is PlanItem and type(item.request_id) is str
            assert all(type(v) is int for v in item[1:4]) and type(item.decode) is bool
            assert type(item.verdict_index) is int
            pages(item.placements)
            assert item.start_position >= 0 and item.num_tokens >= 1 and item.draft_len >= 0
            assert item.verdict_index >= 0 and all(p >= 0 for p in item.placements)
            assert type(item.prior_drafts) is int and item.prior_drafts >= 0
    elif kind is MsgType.RESULT:
        assert type(value) is tuple
        for o in value:
            assert type(o) is ItemOutcome and type(o.request_id) is str
            assert all(type(v) is int for v in o[1:4])
            pages(o.writes)
            assert min(o[1:4]) >= 0 and all(p >= 0 for p in o.writes)
    elif kind is MsgType.SHARD:
        shard(value)
    elif kind is MsgType.REFUSED:
        assert type(value) is str
    elif kind is MsgType.RESIZE:
        assert type(value) is wire.Resize
        shard(value.shard)
        assert type(value.faults) is list and all(type(f) is str for f in value.faults)
    elif kind is MsgType.FIRED:
        assert type(value) is tuple and 0 < len(value) <= wire.MAX_FIRED
        assert all(type(t) is str for t in value)
    else:  # pragma: no cover
        raise AssertionError(kind)


def decode_or_wire_error(kind: MsgType | None, frame: bytes):
    """Decode (a header when kind is None): a value, or None on WireError; nothing else."""
    t = time.perf_counter()
    try:
        value = wire.decode_header(frame) if kind is None else wire.decode_body(kind, frame)
    except WireError:
        value = None
    finally:
        elapsed = time.perf_counter() - t
        assert elapsed < QUICK_S, f"decoding {len(frame)} bytes took {elapsed:.2f} s"
    if value is not None:
        if kind is None:
            assert type(value) is wire.Header and type(value.type) is MsgType
            assert all(type(v) is int for i, v in enumerate(value) if i != 1)
            assert value.version == wire.PROTOCOL_VERSION
        else:
            check_well_typed(kind, value)
    return value


def decode_everything(frame: bytes) -> None:
    decode_or_wire_error(None, frame)
    for kind in MsgType:
        decode_or_wire_error(kind, frame)


# -- 1. round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(MsgType))
@pytest.mark.parametrize("fields", [(0, 0, 0, 1), (3, 17, 1, 4), (0, 0, -1, 2),
                                    (2**63 - 1, 2**64 - 1, -(2**63), 2**32)])
def test_header_roundtrip(kind, fields):
    frame = wire.encode_header(kind, *fields)
    assert len(frame) <= wire.MAX_HEADER_BYTES
    header = wire.decode_header(frame)
    assert header == wire.Header(wire.PROTOCOL_VERSION, kind, *fields)
    assert type(header.type) is MsgType and header.type is kind


def test_empty_bodies_roundtrip():
    for kind in (MsgType.READY, MsgType.AUDIT, MsgType.STOP):
        assert roundtrip(kind, ()) == ()


def test_hello_roundtrip():
    proof = wire.proof_of_secret(b"s" * 32, 1, 2, 4242)
    hello = roundtrip(MsgType.HELLO, wire.Hello(4242, proof))
    assert hello == wire.Hello(4242, proof) and type(hello) is wire.Hello
    header = wire.decode_header(wire.encode_header(MsgType.HELLO, 0, 0, 1, 2))
    assert wire.check_proof(b"s" * 32, header, hello)
    assert not wire.check_proof(b"t" * 32, header, hello)
    assert not wire.check_proof(b"s" * 32, header._replace(rank=0), hello)
    assert not wire.check_proof(b"s" * 32, header, hello._replace(pid=4243))


@pytest.mark.parametrize("reason", ["claims rank 7, outside 0..1", "", "ünïcødé ✓ " * 50])
def test_refused_roundtrip(reason):
    assert roundtrip(MsgType.REFUSED, (reason,)) == reason


def test_plans_and_outcomes_of_real_engine_steps_roundtrip():
    plans, results, _, _ = engine_data()
    assert len(plans) > 100 and any(i.decode for p in plans for i in p.items)
    assert any(i.draft_len for p in plans for i in p.items)       # speculation crossed too
    assert any(i.prior_drafts for p in plans for i in p.items)    # and items planned ahead
    for plan in plans:
        got = roundtrip(MsgType.PLAN, plan)
        assert got == plan
        check_well_typed(MsgType.PLAN, got)
    for outcomes in results:
        got = roundtrip(MsgType.RESULT, outcomes)
        assert got == outcomes
        check_well_typed(MsgType.RESULT, got)


def test_wide_shard_snapshot_roundtrip():
    store = wide_store()
    snapshot = store.snapshot()
    masks = [mask for _, layers in snapshot for _, _, mask in layers]
    assert max(m.bit_length() for m in masks) == 100 and len(snapshot[1][1]) == 2
    got = roundtrip(MsgType.SHARD, snapshot)
    assert got == snapshot
    check_well_typed(MsgType.SHARD, got)
    again = SlotStore(6, 100)
    again.load(got)
    assert all(again.slots(p) == store.slots(p) for p in range(6))
    huge = [(0, [("x", 7, (1 << 5000) | 1), ("y", 0, 0)])]             # a 5001-bit mask, an empty one
    assert roundtrip(MsgType.SHARD, huge) == huge
    assert roundtrip(MsgType.SHARD, []) == []


def test_engine_shards_and_configs_roundtrip():
    _, _, shards, configs = engine_data()
    for snapshot in shards:
        assert roundtrip(MsgType.SHARD, snapshot) == snapshot
    assert any(c.accept_scripts for c in configs)
    for config in configs:
        got = roundtrip(MsgType.CONFIG, config)
        assert got == config and type(got) is wire.Config
        check_well_typed(MsgType.CONFIG, got)


def test_config_with_accept_scripts_and_wide_shard_roundtrip():
    config = wire.Config(6, 100, {"r2": (1, 2), "neg": (-3, 0, 99), "empty": ()},
                         wide_store().snapshot(), ["1:crash@3", "0:garble@1"])
    got = roundtrip(MsgType.CONFIG, config)
    assert got == config
    assert got.accept_scripts == {"r2": (1, 2), "neg": (-3, 0, 99), "empty": ()}
    demo = golden_workload("demo")
    cfg = demo.config
    assert roundtrip(MsgType.CONFIG, wire.Config(cfg.num_pages, cfg.page_size, accept_scripts(demo),
                                                 [], [])).accept_scripts == {"r2": (1, 2)}


def test_to_jsonable_handles_every_decoded_body():
    plans, results, shards, configs = engine_data()
    for value in (plans[3], results[3], shards[0], configs[0], wire.Hello(1, b"\x00\xff"), "why", ()):
        json.dumps(wire.to_jsonable(value))


# -- 2. malformations --------------------------------------------------------------------------

def pk(obj) -> bytes:
    return msgpack.packb(obj)


GOOD_HEADER = (wire.PROTOCOL_VERSION, int(MsgType.PLAN), 0, 3, 1, 2)
def i32(*values: int) -> bytes:
    """A little-endian int32 column, as the wire carries PLAN and RESULT fields."""
    return struct.pack(f"<{len(values)}i", *values)


# One item r0: start 0, 4 tokens, no draft, no decode, verdict 0, one page, no prior drafts: page 0.
GOOD_PLAN = (3, ("r0",), i32(0, 4, 0, 0, 0, 1, 0), i32(0))
GOOD_RESULT = (("r0",), i32(0, 4, 0, 1), i32(0))       # start 0, executed 4, accepted 0, one write
V2_ITEM = ("r0", 0, 4, 0, False, 0, (0,))             # protocol 2's row of a plan, and of a result
V2_OUTCOME = ("r0", 0, 4, 0, (0,))
GOOD_LAYER = ("r0", 0, b"\x0f")
GOOD_CONFIG = (8, 4, {"r2": (1, 2)}, ((0, (GOOD_LAYER,)),), ("1:crash@3",))

EXT = msgpack.ExtType(5, b"abc")
TIMESTAMP = msgpack.Timestamp(0)


def with_at(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


BAD_HEADERS = {
    "version-0": pk(with_at(GOOD_HEADER, 0, 0)),
    "version-1": pk(with_at(GOOD_HEADER, 0, 1)),
    "version-2": pk(with_at(GOOD_HEADER, 0, 2)),
    "version-3": pk(with_at(GOOD_HEADER, 0, 3)),
    "version-4": pk(with_at(GOOD_HEADER, 0, 4)),
    "version-5": pk(with_at(GOOD_HEADER, 0, 5)),
    "version-6": pk(with_at(GOOD_HEADER, 0, 6)),
    "version-8": pk(with_at(GOOD_HEADER, 0, 8)),
    "version-99": pk(with_at(GOOD_HEADER, 0, 99)),
    "version-negative": pk(with_at(GOOD_HEADER, 0, -1)),
    "type-0": pk(with_at(GOOD_HEADER, 1, 0)),
    "type-12": pk(with_at(GOOD_HEADER, 1, 12)),
    "type-99": pk(with_at(GOOD_HEADER, 1, 99)),
    "type--1": pk(with_at(GOOD_HEADER, 1, -1)),
    "type-huge": pk(with_at(GOOD_HEADER, 1, 2**64 - 1)),
    "arity-0": pk(()),
    "arity-1": pk((1,)),
    "arity-5": pk(GOOD_HEADER[:5]),
    "arity-7": pk(GOOD_HEADER + (0,)),
    "map": pk({"version": 1, "type": 4}),
    "int-keyed-map": pk({1: 1}),
    "int": pk(1),
    "str": pk("header"),
    "nil": pk(None),
    "bytes": pk(b"\x96\x01\x04\x00\x03\x01\x02"),
    "ext": pk(EXT),
    "timestamp": pk(TIMESTAMP),
    "ext-field": pk(with_at(GOOD_HEADER, 2, EXT)),
    "empty": b"",
    "invalid-byte": b"\xc1",
    "trailing-byte": pk(GOOD_HEADER) + b"\x00",
    "two-headers": pk(GOOD_HEADER) * 2,
    "oversize": pk(GOOD_HEADER) + b"\xc0" * (wire.MAX_HEADER_BYTES + 1 - len(pk(GOOD_HEADER))),
    "nested": b"\x91" * 250 + b"\x01",
    "array32-claims-4g": b"\xdd\xff\xff\xff\xff",
    "array32-claims-max": b"\xdd" + wire.MAX_ARRAY_LEN.to_bytes(4, "big"),
    "str32-claims-4g": b"\xdb\xff\xff\xff\xff",
}
for _i in range(6):
    for _name, _v in [("str", "1"), ("float", 1.0), ("nil", None), ("bytes", b"\x01"),
                      ("true", True), ("false", False), ("list", (1,)), ("map", {"a": 1})]:
        BAD_HEADERS[f"field{_i}-{_name}"] = pk(with_at(GOOD_HEADER, _i, _v))


@pytest.mark.parametrize("name", sorted(BAD_HEADERS))
def test_bad_header_is_a_wire_error(name):
    with pytest.raises(WireError):
        wire.decode_header(BAD_HEADERS[name])


def test_header_errors_say_what_is_wrong():
    with pytest.raises(WireError, match="version 99"):
        wire.decode_header(BAD_HEADERS["version-99"])
    with pytest.raises(WireError, match="unknown message type 99"):
        wire.decode_header(BAD_HEADERS["type-99"])
    with pytest.raises(WireError, match="exceeds"):
        wire.decode_header(BAD_HEADERS["oversize"])
    assert len(BAD_HEADERS["oversize"]) == wire.MAX_HEADER_BYTES + 1


BAD_BODIES = [
    # HELLO
    (MsgType.HELLO, "arity-1", (1,)),
    (MsgType.HELLO, "arity-3", (1, b"p", 0)),
    (MsgType.HELLO, "proof-str", (1, "proof")),
    (MsgType.HELLO, "proof-int", (1, 5)),
    (MsgType.HELLO, "proof-nil", (1, None)),
    (MsgType.HELLO, "proof-list", (1, (1, 2))),
    (MsgType.HELLO, "proof-ext", (1, EXT)),
    (MsgType.HELLO, "pid-bool", (True, b"p")),
    (MsgType.HELLO, "pid-float", (1.0, b"p")),
    (MsgType.HELLO, "pid-str", ("1", b"p")),
    (MsgType.HELLO, "map", {"pid": 1, "proof": b"p"}),
    (MsgType.HELLO, "nil", None),
    # CONFIG
    (MsgType.CONFIG, "arity-4", GOOD_CONFIG[:4]),
    (MsgType.CONFIG, "arity-6", GOOD_CONFIG + ((),)),
    (MsgType.CONFIG, "num-pages-0", with_at(GOOD_CONFIG, 0, 0)),
    (MsgType.CONFIG, "num-pages-negative", with_at(GOOD_CONFIG, 0, -8)),
    (MsgType.CONFIG, "page-size-0", with_at(GOOD_CONFIG, 1, 0)),
    (MsgType.CONFIG, "num-pages-bool", with_at(GOOD_CONFIG, 0, True)),
    (MsgType.CONFIG, "page-size-float", with_at(GOOD_CONFIG, 1, 4.0)),
    (MsgType.CONFIG, "scripts-int-key", with_at(GOOD_CONFIG, 2, {1: (1,)})),
    (MsgType.CONFIG, "scripts-bytes-key", with_at(GOOD_CONFIG, 2, {b"r2": (1,)})),
    (MsgType.CONFIG, "scripts-nil-key", with_at(GOOD_CONFIG, 2, {None: (1,)})),
    (MsgType.CONFIG, "scripts-bool-value", with_at(GOOD_CONFIG, 2, {"r2": (True,)})),
    (MsgType.CONFIG, "scripts-str-value", with_at(GOOD_CONFIG, 2, {"r2": "12"})),
    (MsgType.CONFIG, "scripts-list", with_at(GOOD_CONFIG, 2, (("r2", (1,)),))),
    (MsgType.CONFIG, "scripts-ext", with_at(GOOD_CONFIG, 2, {"r2": (EXT,)})),
    (MsgType.CONFIG, "shard-map", with_at(GOOD_CONFIG, 3, {0: ()})),
    (MsgType.CONFIG, "shard-int-mask", with_at(GOOD_CONFIG, 3, ((0, (("r0", 0, 15),)),))),
    (MsgType.CONFIG, "faults-str", with_at(GOOD_CONFIG, 4, "1:crash@3")),
    (MsgType.CONFIG, "faults-int", with_at(GOOD_CONFIG, 4, (1,))),
    (MsgType.CONFIG, "faults-bytes", with_at(GOOD_CONFIG, 4, (b"1:crash@3",))),
    # READY, AUDIT, STOP: exactly the empty array
    *[(k, name, v) for k in (MsgType.READY, MsgType.AUDIT, MsgType.STOP)
      for name, v in [("nil", None), ("one", (1,)), ("map", {}), ("int", 0), ("str", ""),
                      ("false", False), ("ext", EXT), ("nested-empty", ((),))]],
    # PLAN: [step, ids, cols, pages]
    (MsgType.PLAN, "arity-1", (3,)),
    (MsgType.PLAN, "arity-3", GOOD_PLAN[:3]),
    (MsgType.PLAN, "arity-5", GOOD_PLAN + (0,)),
    (MsgType.PLAN, "v2-items", (3, (V2_ITEM,))),
    (MsgType.PLAN, "step-bool", with_at(GOOD_PLAN, 0, True)),
    (MsgType.PLAN, "step-str", with_at(GOOD_PLAN, 0, "3")),
    (MsgType.PLAN, "step-nil", with_at(GOOD_PLAN, 0, None)),
    (MsgType.PLAN, "ids-map", with_at(GOOD_PLAN, 1, {"a": "r0"})),
    (MsgType.PLAN, "ids-nil", with_at(GOOD_PLAN, 1, None)),
    (MsgType.PLAN, "ids-str", with_at(GOOD_PLAN, 1, "r0")),
    (MsgType.PLAN, "rid-bytes", with_at(GOOD_PLAN, 1, (b"r0",))),
    (MsgType.PLAN, "rid-int", with_at(GOOD_PLAN, 1, (0,))),
    (MsgType.PLAN, "rid-nil", with_at(GOOD_PLAN, 1, (None,))),
    (MsgType.PLAN, "rid-nested", with_at(GOOD_PLAN, 1, (("r0",),))),
    (MsgType.PLAN, "more-ids-than-columns", with_at(GOOD_PLAN, 1, ("r0", "r1"))),
    (MsgType.PLAN, "no-ids-some-columns", with_at(GOOD_PLAN, 1, ())),
    (MsgType.PLAN, "cols-list", with_at(GOOD_PLAN, 2, (0, 4, 0, 0, 0, 1, 0))),
    (MsgType.PLAN, "cols-str", with_at(GOOD_PLAN, 2, "\x00" * 28)),
    (MsgType.PLAN, "cols-nil", with_at(GOOD_PLAN, 2, None)),
    (MsgType.PLAN, "cols-ext", with_at(GOOD_PLAN, 2, EXT)),
    (MsgType.PLAN, "cols-6-columns", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 1))),   # before prior_drafts
    (MsgType.PLAN, "cols-8-columns", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 1, 0, 0))),
    (MsgType.PLAN, "cols-truncated", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 1, 0)[:-1])),
    (MsgType.PLAN, "cols-a-byte-more", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 1, 0) + b"\x00")),
    (MsgType.PLAN, "cols-empty", with_at(GOOD_PLAN, 2, b"")),
    (MsgType.PLAN, "start-negative", with_at(GOOD_PLAN, 2, i32(-1, 4, 0, 0, 0, 1, 0))),
    (MsgType.PLAN, "start-int32-min", with_at(GOOD_PLAN, 2, i32(-(2**31), 4, 0, 0, 0, 1, 0))),
    (MsgType.PLAN, "tokens-0", with_at(GOOD_PLAN, 2, i32(0, 0, 0, 0, 0, 1, 0))),
    (MsgType.PLAN, "tokens-negative", with_at(GOOD_PLAN, 2, i32(0, -4, 0, 0, 0, 1, 0))),
    (MsgType.PLAN, "draft-negative", with_at(GOOD_PLAN, 2, i32(0, 4, -1, 0, 0, 1, 0))),
    (MsgType.PLAN, "decode-2", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 2, 0, 1, 0))),
    (MsgType.PLAN, "decode-negative", with_at(GOOD_PLAN, 2, i32(0, 4, 0, -1, 0, 1, 0))),
    (MsgType.PLAN, "verdict-negative", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, -1, 1, 0))),
    (MsgType.PLAN, "num-pages-negative", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, -1, 0))),
    (MsgType.PLAN, "num-pages-over", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 2, 0))),
    (MsgType.PLAN, "num-pages-under", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 0, 0))),
    (MsgType.PLAN, "num-pages-huge", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 2**31 - 1, 0))),
    (MsgType.PLAN, "num-pages-cancel-out", (3, ("a", "b"), i32(0, 0, 4, 4, 0, 0, 0, 0, 0, 0, 2, -1, 0, 0),
                                            i32(0))),
    (MsgType.PLAN, "num-pages-with-prior", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 0, 0, 0, 1))),
    (MsgType.PLAN, "prior-negative", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 1, 1, 1, -1))),
    (MsgType.PLAN, "prior-int32-min", with_at(GOOD_PLAN, 2, i32(0, 4, 0, 1, 1, 1, -(2**31)))),
    (MsgType.PLAN, "pages-int", with_at(GOOD_PLAN, 3, 0)),
    (MsgType.PLAN, "pages-list", with_at(GOOD_PLAN, 3, (0,))),
    (MsgType.PLAN, "pages-bool", with_at(GOOD_PLAN, 3, (True,))),
    (MsgType.PLAN, "pages-map", with_at(GOOD_PLAN, 3, {"0": 0})),
    (MsgType.PLAN, "pages-ext", with_at(GOOD_PLAN, 3, EXT)),
    (MsgType.PLAN, "pages-timestamp", with_at(GOOD_PLAN, 3, TIMESTAMP)),
    (MsgType.PLAN, "pages-str", with_at(GOOD_PLAN, 3, "\x00" * 4)),
    (MsgType.PLAN, "pages-truncated", with_at(GOOD_PLAN, 3, b"\x00" * 3)),
    (MsgType.PLAN, "pages-a-byte-more", with_at(GOOD_PLAN, 3, b"\x00" * 5)),
    (MsgType.PLAN, "pages-one-more", with_at(GOOD_PLAN, 3, i32(0, 1))),
    (MsgType.PLAN, "page-negative", with_at(GOOD_PLAN, 3, i32(-1))),
    (MsgType.PLAN, "pages-without-items", (3, (), b"", i32(0))),
    (MsgType.PLAN, "plan-is-map", {"step": 3, "ids": ("r0",)}),
    (MsgType.PLAN, "int-keyed-map", {3: GOOD_PLAN}),
    # RESULT: [ids, cols, writes]
    (MsgType.RESULT, "nil", None),
    (MsgType.RESULT, "empty-array", ()),
    (MsgType.RESULT, "map", {"r0": GOOD_RESULT}),
    (MsgType.RESULT, "arity-2", GOOD_RESULT[:2]),
    (MsgType.RESULT, "arity-4", GOOD_RESULT + (0,)),
    (MsgType.RESULT, "with-a-step", (3,) + GOOD_RESULT),
    (MsgType.RESULT, "v2-outcomes", (V2_OUTCOME,)),
    (MsgType.RESULT, "ids-nil", with_at(GOOD_RESULT, 0, None)),
    (MsgType.RESULT, "rid-int", with_at(GOOD_RESULT, 0, (0,))),
    (MsgType.RESULT, "rid-bytes", with_at(GOOD_RESULT, 0, (b"r0",))),
    (MsgType.RESULT, "more-ids-than-columns", with_at(GOOD_RESULT, 0, ("r0", "r1"))),
    (MsgType.RESULT, "cols-list", with_at(GOOD_RESULT, 1, (0, 4, 0, 1))),
    (MsgType.RESULT, "cols-nil", with_at(GOOD_RESULT, 1, None)),
    (MsgType.RESULT, "cols-3-columns", with_at(GOOD_RESULT, 1, i32(0, 4, 0))),
    (MsgType.RESULT, "cols-5-columns", with_at(GOOD_RESULT, 1, i32(0, 4, 0, 1, 0))),
    (MsgType.RESULT, "cols-truncated", with_at(GOOD_RESULT, 1, i32(0, 4, 0, 1)[:-2])),
    (MsgType.RESULT, "start-negative", with_at(GOOD_RESULT, 1, i32(-1, 4, 0, 1))),
    (MsgType.RESULT, "executed-negative", with_at(GOOD_RESULT, 1, i32(0, -4, 0, 1))),
    (MsgType.RESULT, "accepted-negative", with_at(GOOD_RESULT, 1, i32(0, 4, -1, 1))),
    (MsgType.RESULT, "num-writes-negative", with_at(GOOD_RESULT, 1, i32(0, 4, 0, -1))),
    (MsgType.RESULT, "num-writes-over", with_at(GOOD_RESULT, 1, i32(0, 4, 0, 2))),
    (MsgType.RESULT, "num-writes-huge", with_at(GOOD_RESULT, 1, i32(0, 4, 0, 2**31 - 1))),
    (MsgType.RESULT, "writes-list", with_at(GOOD_RESULT, 2, (0,))),
    (MsgType.RESULT, "writes-nil", with_at(GOOD_RESULT, 2, None)),
    (MsgType.RESULT, "writes-ext", with_at(GOOD_RESULT, 2, EXT)),
    (MsgType.RESULT, "writes-a-byte-more", with_at(GOOD_RESULT, 2, b"\x00" * 5)),
    (MsgType.RESULT, "write-negative", with_at(GOOD_RESULT, 2, i32(-7))),
    (MsgType.RESULT, "writes-without-outcomes", ((), b"", i32(0))),
    (MsgType.RESULT, "outcome-nested", (GOOD_RESULT,)),
    # SHARD
    (MsgType.SHARD, "nil", None),
    (MsgType.SHARD, "map", {"0": ()}),
    (MsgType.SHARD, "int-keyed-map", {0: (GOOD_LAYER,)}),
    (MsgType.SHARD, "entry-arity-1", ((0,),)),
    (MsgType.SHARD, "entry-arity-3", ((0, (GOOD_LAYER,), 0),)),
    (MsgType.SHARD, "page-bool", ((True, (GOOD_LAYER,)),)),
    (MsgType.SHARD, "page-str", (("0", (GOOD_LAYER,)),)),
    (MsgType.SHARD, "layers-map", ((0, {"r0": 1}),)),
    (MsgType.SHARD, "layer-arity-2", ((0, (GOOD_LAYER[:2],)),)),
    (MsgType.SHARD, "layer-arity-4", ((0, (GOOD_LAYER + (0,),)),)),
    (MsgType.SHARD, "layer-rid-bytes", ((0, (with_at(GOOD_LAYER, 0, b"r0"),)),)),
    (MsgType.SHARD, "layer-base-bool", ((0, (with_at(GOOD_LAYER, 1, True),)),)),
    (MsgType.SHARD, "layer-mask-int", ((0, (with_at(GOOD_LAYER, 2, 15),)),)),
    (MsgType.SHARD, "layer-mask-str", ((0, (with_at(GOOD_LAYER, 2, "\x0f"),)),)),
    (MsgType.SHARD, "layer-mask-ext", ((0, (with_at(GOOD_LAYER, 2, EXT),)),)),
    # REFUSED
    (MsgType.REFUSED, "bare-str", "no"),
    (MsgType.REFUSED, "arity-0", ()),
    (MsgType.REFUSED, "arity-2", ("no", "no")),
    (MsgType.REFUSED, "bytes", (b"no",)),
    (MsgType.REFUSED, "int", (1,)),
    (MsgType.REFUSED, "nil", (None,)),
]
# The whole body as an ext type, a timestamp, or with a byte that is no msgpack, for every type.
BAD_BODIES += [(k, "ext", EXT) for k in MsgType]
BAD_BODIES += [(k, "timestamp", TIMESTAMP) for k in MsgType]


@pytest.mark.parametrize("kind,name,body", BAD_BODIES,
                         ids=[f"{k.name}-{n}" for k, n, _ in BAD_BODIES])
def test_bad_body_is_a_wire_error(kind, name, body):
    with pytest.raises(WireError):
        wire.decode_body(kind, msgpack.packb(body))


RAW_BAD_BODIES = {
    "empty": b"",
    "invalid-byte": b"\xc1",
    "bad-utf8-in-rid": (b"\x94\x03\x91\xa2\xff\xfe\xc4\x1c" + b"\x00" * 4 + b"\x04\x00\x00\x00"
                        + b"\x00" * 12 + b"\x01\x00\x00\x00" + b"\x00" * 4 + b"\xc4\x04\x00\x00\x00\x00"),
    "nested-deep": b"\x91" * 100_000 + b"\xc0",
    "array32-claims-4g": b"\xdd\xff\xff\xff\xff",
    "map32-claims-4g": b"\xdf\xff\xff\xff\xff",
    "str32-claims-4g": b"\xdb\xff\xff\xff\xff" + b"a" * 10,
    "bin32-claims-4g": b"\xc6\xff\xff\xff\xff" + b"a" * 10,
    "ext32-claims-4g": b"\xc9\xff\xff\xff\xff\x05",
    "str-over-cap": msgpack.packb(("x" * (wire.MAX_STR_LEN + 1),)),
    "bin-over-cap": msgpack.packb((1, b"x" * (wire.MAX_STR_LEN + 1))),
    "array-over-cap": b"\xdd" + (wire.MAX_ARRAY_LEN + 1).to_bytes(4, "big") + b"\x00" * 64,
    "map-over-cap": b"\xdf" + (wire.MAX_MAP_LEN + 1).to_bytes(4, "big") + b"\xa1a\x00" * 8,
    "nested-array-claims": (b"\xdd" + wire.MAX_ARRAY_LEN.to_bytes(4, "big")) * 40,
    "nested-map-claims": (b"\xdf" + wire.MAX_MAP_LEN.to_bytes(4, "big") + b"\xa1k") * 1000,
    # the columnar bodies' own claims: a column of 4 GB, of the frame cap, ids past the cap
    "plan-cols-claim-4g": b"\x94\x03\x91\xa2r0\xc6\xff\xff\xff\xff" + b"\x00" * 28,
    "plan-pages-claim-cap": (b"\x94\x03\x90\xc4\x00\xc6" + wire.MAX_FRAME_BYTES.to_bytes(4, "big")
                             + b"\x00" * 64),
    "plan-ids-claim-max": b"\x94\x03\xdd" + wire.MAX_ARRAY_LEN.to_bytes(4, "big") + b"\xa0" * 64,
    "result-writes-claim-4g": b"\x93\x91\xa2r0\xc4\x10" + b"\x00" * 16 + b"\xc6\xff\xff\xff\xff",
    "result-ids-claim-4g": b"\x93\xdd\xff\xff\xff\xff\xa2r0",
}


@pytest.mark.parametrize("kind", list(MsgType))
@pytest.mark.parametrize("name", sorted(RAW_BAD_BODIES))
def test_raw_bad_body_is_a_wire_error(kind, name):
    t = time.perf_counter()
    with pytest.raises(WireError):
        wire.decode_body(kind, RAW_BAD_BODIES[name])
    assert time.perf_counter() - t < QUICK_S


def test_bad_utf8_in_a_plan_is_the_raw_frame_we_meant():
    good = msgpack.packb(with_at(GOOD_PLAN, 1, ("ab",)))
    assert good.replace(b"\xa2ab", b"\xa2\xff\xfe") == RAW_BAD_BODIES["bad-utf8-in-rid"]
    assert wire.decode_body(MsgType.PLAN, good).items[0].request_id == "ab"


def test_oversize_body_is_refused_before_decoding():
    frame = b"\x90" + b"\x00" * wire.MAX_FRAME_BYTES          # one byte over the cap
    assert len(frame) == wire.MAX_FRAME_BYTES + 1
    for kind in MsgType:
        t = time.perf_counter()
        with pytest.raises(WireError, match="exceeds"):
            wire.decode_body(kind, frame)
        assert time.perf_counter() - t < QUICK_S


def decode_cost(kind: MsgType | None, frame: bytes) -> tuple[float, int]:
    """(seconds, peak bytes allocated) of one decode of a frame that must not decode."""
    tracemalloc.start()
    try:
        t = time.perf_counter()
        with pytest.raises(WireError):
            wire.decode_header(frame) if kind is None else wire.decode_body(kind, frame)
        elapsed = time.perf_counter() - t
        return elapsed, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# 1023 nested arrays, each claiming MAX_ARRAY_LEN elements: 5 115 bytes.
NESTED_CLAIMS = (b"\xdd" + wire.MAX_ARRAY_LEN.to_bytes(4, "big")) * 1023


def test_hostile_length_claims_cost_little_in_small_frames():
    """Huge length claims in a header (<= 256 bytes), flat or nested maps, cost little."""
    cases = [(None, (b"\xdd" + wire.MAX_ARRAY_LEN.to_bytes(4, "big")) * 51),     # 255 bytes
             (None, b"\xdf" + wire.MAX_MAP_LEN.to_bytes(4, "big")),
             (MsgType.SHARD, RAW_BAD_BODIES["nested-map-claims"]),
             (MsgType.PLAN, RAW_BAD_BODIES["array32-claims-4g"]),
             (MsgType.PLAN, RAW_BAD_BODIES["array-over-cap"])]
    for kind, frame in cases:
        elapsed, peak = decode_cost(kind, frame)
        assert peak < 8 << 20, f"{len(frame)} bytes made the decoder allocate {peak >> 20} MB"
        assert elapsed < QUICK_S, f"{len(frame)} bytes took {elapsed:.3f} s to refuse"


def test_nested_length_claims_are_not_amplified():
    elapsed, peak = decode_cost(MsgType.HELLO, NESTED_CLAIMS)
    assert peak < 16 << 20, f"{len(NESTED_CLAIMS)} bytes made the decoder allocate {peak >> 20} MB"
    assert elapsed < QUICK_S, f"{len(NESTED_CLAIMS)} bytes took {elapsed:.3f} s to refuse"


def valid_frames() -> list[tuple[MsgType | None, bytes]]:
    """A valid frame of every type (None: a header)."""
    plans, results, shards, configs = engine_data()
    plan = max(plans[:40], key=lambda p: len(p.items))
    return [
        (None, wire.encode_header(MsgType.PLAN, 1, 2**40, 1, 4)),
        (MsgType.HELLO, wire.encode_body(MsgType.HELLO, wire.Hello(123, b"\xab" * 32))),
        (MsgType.CONFIG, wire.encode_body(MsgType.CONFIG, configs[0])),
        (MsgType.READY, wire.encode_body(MsgType.READY, ())),
        (MsgType.PLAN, wire.encode_body(MsgType.PLAN, plan)),
        (MsgType.RESULT, wire.encode_body(MsgType.RESULT, max(results[:40], key=len))),
        (MsgType.AUDIT, wire.encode_body(MsgType.AUDIT, ())),
        (MsgType.SHARD, wire.encode_body(MsgType.SHARD, wide_store().snapshot())),
        (MsgType.STOP, wire.encode_body(MsgType.STOP, ())),
        (MsgType.REFUSED, wire.encode_body(MsgType.REFUSED, ("go away",))),
        (MsgType.FIRED, wire.encode_body(MsgType.FIRED, ("1:crash@3", "all:garble@3"))),
    ]


def test_every_prefix_of_a_valid_frame_is_a_wire_error():
    for kind, frame in valid_frames():
        assert decode_or_wire_error(kind, frame) is not None
        for n in range(len(frame)):
            with pytest.raises(WireError):
                (wire.decode_header if kind is None else lambda f: wire.decode_body(kind, f))(frame[:n])
        with pytest.raises(WireError):       # and one byte too many
            (wire.decode_header if kind is None else lambda f: wire.decode_body(kind, f))(frame + b"\xc0")


def test_a_body_of_one_type_is_refused_as_another():
    frames = dict(valid_frames()[1:])
    for kind, frame in frames.items():
        for other in MsgType:
            same_shape = ({kind, other} <= {MsgType.READY, MsgType.AUDIT, MsgType.STOP}
                          or {kind, other} == {MsgType.REFUSED, MsgType.FIRED})   # strings, both
            empty_list = frame == msgpack.packb(()) and other is MsgType.SHARD
            if other is kind or same_shape or empty_list:    # () is also a shard of no pages
                continue
            with pytest.raises(WireError):
                wire.decode_body(other, frame)


# -- 3. fuzzers ----------------------------------------------------------------------------------

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
EXTS = st.one_of(st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
                 st.builds(msgpack.Timestamp, st.integers(0, 2**33), st.integers(0, 999_999_999)))
LEAVES = st.one_of(st.none(), st.booleans(), INT64, st.integers(-3, 300),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                   st.binary(max_size=12), EXTS)
KEYS = st.one_of(st.text(max_size=5), st.binary(max_size=5), INT64, st.booleans(), st.none())
HOSTILE = st.recursive(
    LEAVES,
    lambda children: st.one_of(st.lists(children, max_size=8),
                               st.lists(children, max_size=8).map(tuple),
                               st.dictionaries(KEYS, children, max_size=4)),
    max_leaves=40)


def mostly(good):
    """Usually the right thing, sometimes anything."""
    return st.one_of(good, good, good, LEAVES)


def shaped(*fields):
    """A fixed-arity array of these fields, sometimes one too short or one too long."""
    exact = st.tuples(*fields)
    return st.one_of(exact, exact, exact, exact.map(lambda t: t[:-1]),
                     st.tuples(exact, LEAVES).map(lambda t: t[0] + (t[1],)))


_I = mostly(st.integers(-5, 2**20))
_S = mostly(st.text(max_size=6))
_B = mostly(st.booleans())
_Y = mostly(st.binary(max_size=40))
_PAGES = mostly(st.lists(_I, max_size=5))
_LAYER = shaped(_S, _I, _Y)
# The columnar PLAN and RESULT, near valid: n ids (sometimes not n, sometimes no strings),
# int32 columns of mostly valid values (sometimes cut, padded, or no bytes at all), and
# page ids whose number is usually wrong (a valid body must match the num_pages column, which
# the shape cannot know: the mutation fuzzer and test_wire_columns.py cover valid bodies).
_IDS = lambda n: mostly(st.lists(_S, min_size=n, max_size=n).map(tuple)) | st.lists(_S, max_size=5)
_START, _DRAFT, _VERDICT = st.integers(-1, 2**20), st.integers(-1, 8), st.integers(-1, 8)
_TOKENS, _DECODE, _NUM_PAGES = st.integers(0, 64), st.sampled_from([0, 1, 0, 1, 2, -1]), st.integers(-1, 2)
_PRIOR = st.sampled_from([0, 0, 0, 1, 3, -1])


def _COLUMNS(n, *columns):
    exact = st.tuples(*(st.lists(c, min_size=n, max_size=n) for c in columns)).map(
        lambda cols: i32(*(v for col in cols for v in col)))
    return st.one_of(exact, exact, exact, exact.map(lambda b: b[:-1]), exact.map(lambda b: b + b"\x00"),
                     st.binary(max_size=40), LEAVES)


_PAGE_IDS = st.one_of(st.lists(st.integers(-1, 9), max_size=6).map(lambda v: i32(*v)),
                      st.binary(max_size=9), LEAVES)
_SHARD = mostly(st.lists(shaped(_I, mostly(st.lists(_LAYER, max_size=3))), max_size=3))
_SCRIPTS = mostly(st.dictionaries(st.one_of(st.text(max_size=4), st.text(max_size=4),
                                            st.binary(max_size=3), st.integers(0, 9)),
                                  mostly(st.lists(_I, max_size=4)), max_size=3))
SHAPES = {
    MsgType.HELLO: shaped(_I, _Y),
    MsgType.CONFIG: shaped(_I, _I, _SCRIPTS, _SHARD, mostly(st.lists(_S, max_size=3))),
    MsgType.READY: st.one_of(st.just(()), LEAVES, st.lists(LEAVES, max_size=2)),
    MsgType.PLAN: st.integers(0, 4).flatmap(lambda n: shaped(
        _I, _IDS(n), _COLUMNS(n, _START, _TOKENS, _DRAFT, _DECODE, _VERDICT, _NUM_PAGES, _PRIOR), _PAGE_IDS)),
    MsgType.RESULT: st.integers(0, 4).flatmap(lambda n: shaped(
        _IDS(n), _COLUMNS(n, _START, _TOKENS, _DRAFT, _NUM_PAGES), _PAGE_IDS)),
    MsgType.SHARD: _SHARD,
    MsgType.REFUSED: shaped(_S),
    MsgType.FIRED: st.lists(_S, min_size=0, max_size=3).map(tuple),
    MsgType.RESIZE: shaped(_SHARD, mostly(st.lists(_S, max_size=3))),
}
SHAPES[MsgType.AUDIT] = SHAPES[MsgType.STOP] = SHAPES[MsgType.READY]
V = wire.PROTOCOL_VERSION
HEADER_SHAPE = shaped(mostly(st.sampled_from([V, V, V, 0, 1, V - 1, V + 1, 99])),
                      mostly(st.integers(-1, 12)), _I, _I, _I, _I)


@settings(max_examples=400, **FUZZ)
@given(st.binary(max_size=600))
def test_fuzz_arbitrary_bytes(frame):
    decode_everything(frame)


@settings(max_examples=150, **FUZZ)
@given(HOSTILE)
def test_fuzz_hostile_msgpack(value):
    decode_everything(msgpack.packb(value))


@settings(max_examples=200, **FUZZ)
@given(st.sampled_from(list(MsgType)).flatmap(lambda k: st.tuples(st.just(k), SHAPES[k])))
def test_fuzz_near_valid_bodies(kind_and_body):
    kind, body = kind_and_body
    frame = msgpack.packb(body)
    value = decode_or_wire_error(kind, frame)
    if value is not None:
        # Whatever is accepted can be sent again and means the same.
        again = wire.encode_body(kind, (value,) if kind is MsgType.REFUSED else value)
        assert wire.decode_body(kind, again) == value
    for other in MsgType:
        decode_or_wire_error(other, frame)


@settings(max_examples=150, **FUZZ)
@given(HEADER_SHAPE)
def test_fuzz_near_valid_headers(raw):
    frame = msgpack.packb(raw)
    header = decode_or_wire_error(None, frame)
    if header is not None:
        assert wire.decode_header(wire.encode_header(header.type, *header[2:])) == header


MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]),
                               st.integers(0, 1 << 20), st.integers(0, 255)),
                     min_size=1, max_size=6)


def mutate(frame: bytes, ops) -> bytes:
    b = bytearray(frame)
    for op, where, byte in ops:
        i = where % (len(b) + 1)
        if op == "insert":
            b.insert(i, byte)
        elif not b:
            continue
        elif op == "delete":
            del b[i % len(b)]
        elif op == "flip":
            b[i % len(b)] ^= 1 << (byte % 8)
        else:
            b[i % len(b)] = byte
    return bytes(b)


def mutation_corpus() -> list[tuple[MsgType | None, bytes]]:
    plans, results, _, _ = engine_data()
    corpus = [(MsgType.PLAN, wire.encode_body(MsgType.PLAN, p)) for p in plans[::7]]
    corpus += [(MsgType.RESULT, wire.encode_body(MsgType.RESULT, r)) for r in results[::7]]
    return corpus + valid_frames()


@settings(max_examples=250, **FUZZ)
@given(st.data(), MUTATIONS)
def test_fuzz_mutated_valid_frames(data, ops):
    corpus = mutation_corpus()
    kind, frame = corpus[data.draw(st.integers(0, len(corpus) - 1), label="frame")]
    bad = mutate(frame, ops)
    decode_or_wire_error(kind, bad)
    if kind is not None:
        decode_or_wire_error(None, bad)
