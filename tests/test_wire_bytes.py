"""The wire pinned byte for byte: a few fixed messages of every shape and their exact bytes.

Most messages are NamedTuples encoded as msgpack arrays, so the protocol is the fields' order;
a PLAN and a RESULT are columns of int32 (protocol 4), so it is the columns' order too:
reorder a field of a plan item (or a column) and every round-trip test still passes while
every peer of the old order breaks. These pins fail instead. A change of format is then on purpose:
bump wire.PROTOCOL_VERSION and re-pin (the expected bytes below, and the version)."""
from __future__ import annotations

import pytest

from inferris_dist.engine.messages import ExecutionPlan, ItemOutcome, PlanItem
from inferris_dist.engine.rank import RankExecutor
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType

pytestmark = pytest.mark.timeout(30)

PLAN = ExecutionPlan(5, (PlanItem("r0", 6, 3, 2, True, 1, (4, 5)), PlanItem("r1", 0, 4, 0, False, 0, (6,))))
# r0 planned ahead (overlap) after 3 assumed drafts: its placements cover [9 - 3, 9 + 3). Every
# column's pair of values differs from every other's, so any two columns swapped change the bytes.
PLAN_AHEAD = ExecutionPlan(5, (PlanItem("r0", 9, 3, 2, True, 4, (4, 5), 3),
                               PlanItem("r1", 0, 4, 0, False, 0, (6,))))
OUTCOMES = (ItemOutcome("r0", 6, 3, 1, (4, 5)), ItemOutcome("r1", 0, 4, 0, (6,)))
CONFIG = wire.Config(8, 4, {"r2": (1, 2)}, [(3, [("r0", 4, 0b1011)])], ["1:crash@3"], (1000000, 2000))
SHARD = [(3, [("r0", 4, 0b1011)])]
RESIZE = wire.Resize(SHARD, ["0:crash@9"])

PINNED = [
    # (name, kind or None for a header, the message, its exact bytes in hex)
    ("header", None, (MsgType.PLAN, 1, 7, 2, 4), "96070401070204"),
    ("hello", MsgType.HELLO, wire.Hello(4242, b"\x01" * 4), "92cd1092c40401010101"),
    ("config", MsgType.CONFIG, CONFIG,
     # ... faults ["1:crash@3"], exec cost [1 ms, 2 us per token] in ns
     "96080481a272329201029192039193a2723004c4010b91a9313a63726173684033" "92ce000f4240cd07d0"),
    # [step, ids, bin: start 6,0 | tokens 3,4 | draft 2,0 | decode 1,0 | verdict 1,0 | pages 2,1 |
    #  prior drafts 0,0, bin: pages 4,5,6], every column int32 little-endian
    ("plan", MsgType.PLAN, PLAN,
     "940592a27230a27231c438" "0600000000000000" "0300000004000000" "0200000000000000"
     "0100000000000000" "0100000000000000" "0200000001000000" "0000000000000000"
     "c40c" "040000000500000006000000"),
    # the same with r0 planned ahead: start 9,0 | tokens 3,4 | draft 2,0 | decode 1,0 |
    # verdict 4,0 | pages 2,1 | prior drafts 3,0
    ("plan ahead", MsgType.PLAN, PLAN_AHEAD,
     "940592a27230a27231c438" "0900000000000000" "0300000004000000" "0200000000000000"
     "0100000000000000" "0400000000000000" "0200000001000000" "0300000000000000"
     "c40c" "040000000500000006000000"),
    ("empty plan", MsgType.PLAN, ExecutionPlan(3, ()), "940390c400c400"),
    # [ids, bin: start 6,0 | executed 3,4 | accepted 1,0 | writes 2,1, bin: writes 4,5,6]
    ("result", MsgType.RESULT, OUTCOMES,
     "9392a27230a27231c420" "0600000000000000" "0300000004000000" "0100000000000000"
     "0200000001000000" "c40c" "040000000500000006000000"),
    ("empty result", MsgType.RESULT, (), "9390c400c400"),
    ("shard", MsgType.SHARD, SHARD, "9192039193a2723004c4010b"),
    ("refused", MsgType.REFUSED, ("go away",), "91a7676f2061776179"),
    ("fired", MsgType.FIRED, ("1:crash@3",), "91a9313a63726173684033"),
    ("ready", MsgType.READY, (), "90"),
    # [shard (SHARD's layout), faults]
    ("resize", MsgType.RESIZE, RESIZE, "92" "9192039193a2723004c4010b" "91a9303a63726173684039"),
]


def test_the_protocol_version_is_the_pinned_one():
    assert wire.PROTOCOL_VERSION == 7, "the format changed: re-pin every message below"


@pytest.mark.parametrize("name,kind,message,hexed", PINNED, ids=[p[0].replace(" ", "-") for p in PINNED])
def test_a_message_encodes_to_its_pinned_bytes(name, kind, message, hexed):
    if kind is None:
        assert wire.encode_header(*message).hex() == hexed
    else:
        assert wire.encode_body(kind, message).hex() == hexed


@pytest.mark.parametrize("name,kind,message,hexed", PINNED, ids=[p[0].replace(" ", "-") for p in PINNED])
def test_pinned_bytes_decode_to_the_message(name, kind, message, hexed):
    frame = bytes.fromhex(hexed)
    if kind is None:
        header = wire.decode_header(frame)
        assert (header.version, header.type, header.epoch, header.step, header.rank,
                header.world_size) == (wire.PROTOCOL_VERSION, *message)
    elif kind is MsgType.REFUSED:
        assert wire.decode_body(kind, frame) == message[0]
    elif kind is MsgType.CONFIG:
        got = wire.decode_body(kind, frame)
        assert got._replace(faults=tuple(got.faults)) == message._replace(faults=tuple(message.faults))
    elif kind is MsgType.RESIZE:
        got = wire.decode_body(kind, frame)
        assert [(p, [tuple(layer) for layer in layers]) for p, layers in got.shard] == SHARD
        assert got.faults == message.faults
    elif kind is MsgType.SHARD:
        assert [(p, [tuple(layer) for layer in layers]) for p, layers in wire.decode_body(kind, frame)] \
            == [(p, [tuple(layer) for layer in layers]) for p, layers in message]
    else:
        assert wire.decode_body(kind, frame) == message


def test_the_timing_frame_is_pinned():
    times = (1.0, 1.5, 2.0, 2.25)
    hexed = "94cb3ff0000000000000cb3ff8000000000000cb4000000000000000cb4002000000000000"
    assert wire.encode_timing(times).hex() == hexed
    assert wire.decode_timing(bytes.fromhex(hexed)) == times


def test_an_honest_rank_builds_the_pinned_result_from_the_plan_bytes():
    """The rank's hot path never builds outcomes: its RESULT is the plan's columns with the
    accepted column in place of three, and must be the very bytes of the pinned RESULT."""
    plan = wire.decode_plan_columns(wire.encode_body(MsgType.PLAN, PLAN))
    assert wire.encode_result_of(plan, [1, 0]).hex() == dict((p[0], p[3]) for p in PINNED)["result"]


def test_a_rank_places_the_pinned_plan_ahead_by_its_own_verdict():
    """r0 of PLAN_AHEAD follows 3 assumed drafts; its verdict 3 accepted 2 of them, so it runs
    one position earlier, at 8, and writes [8, 11): page 5 alone (page size 4) of its 4, 5."""
    plan = wire.decode_plan_columns(wire.encode_body(MsgType.PLAN, PLAN_AHEAD))
    rank = RankExecutor(0, 1, 8, 4, {"r0": (0, 0, 0, 2)})
    n = len(plan.request_ids)
    accepted = rank.accepted(plan.request_ids, plan.column("num_tokens"), plan.column("decode"),
                             plan.column("verdict_index"))
    starts, num_pages, pages = rank.place_columns(
        plan.request_ids, plan.column("start_position"), plan.column("num_tokens"),
        plan.column("verdict_index"), plan.column("num_pages"), plan.column("prior_drafts"), plan.pages)
    body = wire.encode_result_columns(plan.request_ids, starts, plan.column("num_tokens"), accepted,
                                      num_pages, pages)
    want = (ItemOutcome("r0", 8, 3, 2, (5,)), ItemOutcome("r1", 0, 4, 0, (6,)))
    assert n == 2 and wire.decode_body(MsgType.RESULT, body) == want
    assert body == wire.encode_body(MsgType.RESULT, want) == wire.encode_body(
        MsgType.RESULT, rank.verdicts(wire.plan_of(plan)).outcomes)
