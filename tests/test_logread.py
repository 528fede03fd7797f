"""The one reader of wire logs (inferris_dist/wirelog/logread.py), in its two modes:

1. strict: the first line that is no record refuses the log, one line naming the file and
   the line; a consumer refuses a record the same way; a last line cut short is left out
   and said; a log past the total bound is refused;
2. lenient: bad lines are skipped and counted, a line past the bound skipped unread, a log
   past the total bound read to it, each said in a note; a file with no record is no log;
3. both: what is not a regular file (a fifo, a directory) is refused before a byte is read.
"""
from __future__ import annotations

import json
import os

import pytest

from inferris_dist.engine import WorkloadError
from inferris_dist.wirelog.logread import LogReader

pytestmark = [pytest.mark.timeout(30)]

RECORDS = [{"t": 1.0, "event": "run", "name": "x"},
           {"t": 1.1, "dir": "out", "rank": 0, "epoch": 0, "step": 0, "type": "PLAN", "bytes": 3, "body": {}},
           {"t": 1.2, "event": "end", "status": "ok", "error": None, "steps": 1}]


def log_of(tmp_path, *lines: str, end: str = "\n"):
    path = tmp_path / "w.jsonl"
    path.write_bytes(("\n".join(lines) + end).encode())
    return path


def good() -> list[str]:
    return [json.dumps(r) for r in RECORDS]


def strict(path, **kw) -> LogReader:
    return LogReader(str(path), strict=True, command="inspect", **kw)


def lenient(path, **kw) -> LogReader:
    return LogReader(str(path), strict=False, command="html", **kw)


# -- 1. strict ------------------------------------------------------------------------------------

def test_strict_gives_the_records_in_order_with_their_lines(tmp_path):
    path = log_of(tmp_path, good()[0], "", good()[1], good()[2])
    reader = strict(path)
    got = [(reader.line, r) for r in reader]
    assert got == [(1, RECORDS[0]), (3, RECORDS[1]), (4, RECORDS[2])]
    assert reader.cut_short is None and reader.notes == []


@pytest.mark.parametrize("bad,said", [
    ("hello", "not JSON"), ("{oops", "not JSON"), ("[1, 2]", "neither a wire message nor an event"),
    ('{"event": 5}', "neither a wire message nor an event"), ("{}", "neither a wire message nor an event"),
    ("[" * 10, "not JSON")])
def test_strict_refuses_the_first_bad_line_naming_it(tmp_path, bad, said):
    path = log_of(tmp_path, good()[0], bad, good()[1])
    with pytest.raises(WorkloadError) as e:
        list(strict(path))
    assert str(e.value) == f"{path} line 2: {said}"


def test_strict_refuses_a_long_line_unread_and_a_consumer_refuses_a_record(tmp_path):
    path = log_of(tmp_path, good()[0], json.dumps({"t": 1, "event": "note", "text": "x" * 5000}))
    with pytest.raises(WorkloadError, match=r"line 2: longer than 0 MB$"):
        list(strict(path, max_line=4096))
    reader = strict(log_of(tmp_path, *good()))
    with pytest.raises(WorkloadError) as e:
        for r in reader:
            if r.get("type") == "PLAN":
                raise reader.refused("PLAN message: body must be an object with a list of items")
    assert str(e.value).endswith("line 2: PLAN message: body must be an object with a list of items")


def test_strict_leaves_out_a_last_line_cut_short_and_refuses_past_the_total_bound(tmp_path):
    path = log_of(tmp_path, *good(), good()[0][:12], end="")
    reader = strict(path)
    assert list(reader) == RECORDS and reader.cut_short == 4
    with pytest.raises(WorkloadError, match=r"line 2: the log goes on past 0 MiB"):
        list(strict(log_of(tmp_path, *good()), max_read=len(good()[0]) + 1))


# -- 2. lenient -----------------------------------------------------------------------------------

def test_lenient_skips_and_counts_what_is_not_a_record(tmp_path):
    long = json.dumps({"t": 1, "event": "note", "text": "x" * 5000})
    path = log_of(tmp_path, good()[0], "hello", "[1]", long, "\xff{", good()[1], good()[2], "{cut", end="")
    reader = lenient(path, max_line=4096)
    assert list(reader) == RECORDS
    assert (reader.skipped, reader.too_long, reader.cut_short) == (3, 1, 8)
    notes = " | ".join(reader.notes)
    assert "3 line(s) of the log are not JSON objects" in notes and "longer than" in notes
    assert "cut short" in notes


def test_lenient_stops_at_the_total_bound_and_says_so(tmp_path):
    path = log_of(tmp_path, *good() * 1000)
    reader = lenient(path, max_read=2 << 20)
    assert len(list(reader)) == 3000 and reader.stopped_at is None
    big = log_of(tmp_path, *[json.dumps({"t": 1, "event": "note", "text": "x" * 1000})] * 3000)
    reader = lenient(big, max_read=1 << 20)
    assert len(list(reader)) < 3000 and reader.stopped_at is not None
    assert reader.stopped_at <= 1 << 20 and any(n.startswith("only the first") for n in reader.notes)


def test_lenient_says_what_is_no_wire_log(tmp_path):
    with pytest.raises(WorkloadError, match=r"not a wire log \(no message or event in it\)"):
        list(lenient(log_of(tmp_path, "")))
    with pytest.raises(WorkloadError, match=r"none of its first 1000 lines"):
        list(lenient(log_of(tmp_path, *["hello"] * 2000)))


# -- 3. both ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [strict, lenient])
def test_what_is_not_a_regular_file_is_refused_unread(tmp_path, mode):
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)                 # nobody writes to it: opening it for reading would block
    command = "inspect" if mode is strict else "html"
    with pytest.raises(WorkloadError) as e:
        list(mode(fifo))
    assert str(e.value) == f"{command} {fifo}: not a regular file (a fifo)"
    with pytest.raises(WorkloadError) as e:
        list(mode(tmp_path))
    assert str(e.value) == f"{command} {tmp_path}: Is a directory"
