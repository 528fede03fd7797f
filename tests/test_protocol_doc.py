"""docs/protocol.md against the wire module: every hex example is a real message of this version.

Each example (a `<!-- example: NAME -->` line, then for each frame a ```hex block and a ```text
block reading it) is decoded with the wire module's decoders, encoded again to the very same
bytes, and read aloud as the page reads it; the RESULT examples are what a rank computes for the
PLAN examples from the CONFIG example's scripts, and the HELLO's proof is the HMAC of the page's
secret. Every message type of the wire's table is named in the page with its code, and the
limits the page states are the wire's.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferris_dist.engine.rank import RankExecutor
from inferris_dist.protocol import faults, wire
from inferris_dist.protocol.wire import MsgType

from tests.helpers.wire_examples import SECRET, show

PAGE = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
MARK = re.compile(r"^<!-- example: (.+?) -->$")
FENCE = re.compile(r"^```(\w*)$")


def read_examples(text: str) -> dict[str, list[tuple[bytes, str]]]:
    """NAME -> [(frame, its reading)], for every example of the page, in order."""
    lines, found, i = text.splitlines(), {}, 0
    while i < len(lines):
        mark = MARK.match(lines[i])
        i += 1
        if not mark:
            continue
        frames: list[tuple[bytes, str]] = []
        while i < len(lines) and lines[i] == "```hex":
            hex_end = lines.index("```", i + 1)
            frame = bytes.fromhex("".join(lines[i + 1:hex_end]))
            assert lines[hex_end + 1] == "```text", f"example {mark.group(1)!r}: a frame without its reading"
            text_end = lines.index("```", hex_end + 2)
            frames.append((frame, "\n".join(lines[hex_end + 2:text_end])))
            i = text_end + 1
        assert mark.group(1) not in found, f"two examples named {mark.group(1)!r}"
        found[mark.group(1)] = frames
    return found


def reencoded(kind: MsgType, body) -> bytes:
    """A decoded body encoded again by the wire module."""
    if kind is MsgType.PLAN:
        return wire.encode_plan(body)[0]
    if kind is MsgType.REFUSED:
        return wire.encode_body(kind, (body,))
    return wire.encode_body(kind, body)


def check(name: str, frames: list[tuple[bytes, str]]):
    """The example's header and body, decoded; AssertionError or WireError if it is not a real
    message of this version, read as the page reads it."""
    assert 2 <= len(frames) <= 3, f"{name}: {len(frames)} frames"
    (head, head_text), (body_frame, body_text) = frames[:2]
    header = wire.decode_header(head)
    assert name.split(",")[0] == header.type.name, f"{name}: a {header.type.name} header"
    assert wire.encode_header(header.type, header.epoch, header.step, header.rank,
                              header.world_size) == head, f"{name}: the header encodes otherwise"
    body = wire.decode_body(header.type, body_frame)
    assert reencoded(header.type, body) == body_frame, f"{name}: the body encodes otherwise"
    if header.type is MsgType.PLAN:
        assert wire.decode_plan_columns(body_frame).step == header.step == body.step
    for i, (frame, text) in enumerate(frames):
        assert show(header.type, frame, i) == text, f"{name}: frame {i} reads {show(header.type, frame, i)}"
    if len(frames) == 3:
        extra = frames[2][0]
        if header.type is MsgType.PLAN:
            assert extra == wire.TIMING_PLEASE, f"{name}: a third frame that asks for nothing"
        else:
            assert header.type is MsgType.RESULT, f"{name}: a third frame on a {header.type.name}"
            assert wire.encode_timing(wire.decode_timing(extra)) == extra
    return header, body


@pytest.fixture(scope="module")
def text() -> str:
    return PAGE.read_text()


@pytest.fixture(scope="module")
def examples(text) -> dict:
    return read_examples(text)


def test_every_example_is_a_message_of_this_version_that_encodes_back_to_its_bytes(examples):
    assert examples
    for name, frames in examples.items():
        check(name, frames)


def test_every_message_type_has_an_example_and_its_code_in_the_table(text, examples):
    kinds = {check(name, frames)[0].type for name, frames in examples.items()}
    assert kinds == set(MsgType), f"no example of {sorted(k.name for k in set(MsgType) - kinds)}"
    for kind in MsgType:
        assert re.search(rf"^\| {kind.name} \| {int(kind)} \|", text, re.M), \
            f"{kind.name} is not in the table of types with its code {int(kind)}"


def test_the_results_are_what_a_rank_computes_for_the_plans(examples):
    _, config = check("CONFIG", examples["CONFIG"])
    for plan_name, result_name in (("PLAN", "RESULT"), ("PLAN, at overlap", "RESULT, at overlap")):
        header, plan = check(plan_name, examples[plan_name])
        reply, outcomes = check(result_name, examples[result_name])
        rank = RankExecutor(header.rank, header.world_size, config.num_pages, config.page_size,
                            config.accept_scripts)
        assert rank.verdicts(plan).outcomes == outcomes
        assert (reply.epoch, reply.step, reply.rank) == (header.epoch, header.step, header.rank)
        assert wire.encode_result(outcomes) == examples[result_name][1][0]


def test_the_hello_proves_the_secret_the_page_names(text, examples):
    header, hello = check("HELLO", examples["HELLO"])
    assert SECRET.hex() in text
    assert wire.check_proof(SECRET, header, hello)
    assert f"inferris-dist hello v{wire.PROTOCOL_VERSION} rank={header.rank} world={header.world_size} " \
           f"pid={hello.pid}" in text


def test_fired_names_the_faults_its_config_gave(examples):
    _, fired = check("FIRED", examples["FIRED"])
    _, config = check("CONFIG", examples["CONFIG"])
    assert set(fired) <= set(config.faults)
    assert all(faults.parse_fault(t).kind in faults.KINDS for t in fired)


def test_the_page_states_the_wires_limits_and_the_garbled_bytes(text):
    assert f"protocol version **{wire.PROTOCOL_VERSION}**" in text
    rows = {
        "frame (any body)": wire.MAX_FRAME_BYTES, "header": wire.MAX_HEADER_BYTES,
        "HELLO body": wire.MAX_HELLO_BYTES, "timing frame": wire.MAX_TIMING_BYTES,
        "str": wire.MAX_STR_LEN, "array": wire.MAX_ARRAY_LEN, "map": wire.MAX_MAP_LEN,
    }
    for row, value in rows.items():
        assert re.search(rf"^\| {re.escape(row)} \| [^|]*\b{value}\b", text, re.M), f"limit {row}: {value}"
    assert re.search(rf"^\| FIRED \| 1 to {wire.MAX_FIRED} strings", text, re.M)
    garbled = faults._garble([])[0]
    assert f"the {len(garbled)} bytes `{garbled.hex(' ')}`" in text


def test_every_byte_of_every_example_counts(examples):
    """The check is sharp: any one byte of any frame changed, the example is refused."""
    for name, frames in examples.items():
        for f, (frame, _) in enumerate(frames):
            for at in range(len(frame)):
                changed = [(bytes(frame[:at]) + bytes([frame[at] ^ 0x01]) + frame[at + 1:], reading)
                           if g == f else (other, reading) for g, (other, reading) in enumerate(frames)]
                with pytest.raises(Exception):   # noqa: PT011 - refused, whichever way
                    check(name, changed)
