"""The wire log's schema (inferris_dist/wirelog/schema.py) holds the writer to what it writes:

1. a WireLog with checking on refuses an unknown event, an unknown or missing field, a value
   of another kind; with checking off (production) it writes what it is given, unchecked;
2. the test suite writes every wire log checked, here and in the processes it starts;
3. real launches on worker processes (faults restored and recomputed, the overlap rung, an
   audit after every step, a failed join, an idle stretch) write only what the schema says,
   every event of it but those needing outside peers;
4. the readers know the writer's records from the schema: the page draws every event, its
   plan and result columns are the schema's; inspect checks each field it reads as the schema
   says (kinds, elements, choices, sort), narrowed only where it says so; what the history
   checker needs, the schema requires;
5. the documentation's table of events lists exactly the schema's events and their fields.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from inferris_dist import page
from inferris_dist.cli.cmd_inspect import EVENTS as INSPECTED
from inferris_dist.cli.cmd_inspect import ITEM as INSPECT_ITEM
from inferris_dist.cli.cmd_inspect import MESSAGE as INSPECT_MESSAGE
from inferris_dist.cli.cmd_inspect import OUTCOME as INSPECT_OUTCOME
from inferris_dist.judge.check import NEEDED
from inferris_dist.page.model import PLAN_KEYS, RESULT_KEYS
from inferris_dist.wirelog.schema import EVENTS, ITEM, MESSAGE, OUTCOME, SchemaError, check_record, kind_of
from inferris_dist.wirelog.writer import CHECK_ENV, WireLog

from tests.helpers.external import CLI, ENV, GOLDEN, REPO

pytestmark = [pytest.mark.timeout(120)]


# -- 1. the writer checks ----------------------------------------------------------------------

@pytest.mark.parametrize("event,fields,said", [
    ("lunch", {}, "unknown event 'lunch'"),
    ("audit", {"step": 1}, "audit event: no 'epoch'"),
    ("audit", {"step": 1, "epoch": 0, "rank": 2}, "audit event: unknown field(s) 'rank'"),
    ("audit", {"step": True, "epoch": 0}, "audit event: 'step' is bool, not int"),
    ("idle", {"first": 1, "last": 2, "text": None}, "idle event: 'text' is null, not str"),
    ("restart", {"ranks": [1, "2"], "epoch": 1, "step": 3, "shard_pages": 4, "policy": "restore"},
     "restart event: 'ranks' holds a str, not only int"),
    ("phase", {"phase": "lunch", "step": 1, "dur": 0.1}, "phase event: 'phase' is 'lunch', not one of"),
])
def test_a_checked_wire_log_refuses_what_the_schema_does_not_say(event, fields, said):
    out = io.StringIO()
    log = WireLog(out, checked=True)
    with pytest.raises(SchemaError, match=re.escape(said)):
        log.event(event, **fields)
    assert out.getvalue() == ""                           # nothing written of it
    log.event("audit", step=1, epoch=0)
    assert json.loads(out.getvalue())["event"] == "audit"


def test_a_checked_wire_log_refuses_a_message_field_it_does_not_know():
    log = WireLog(io.StringIO(), checked=True)
    log.message("in", 1, 0, 3, "RESULT", 11, [], sent=1.0, rtt=0.001, inside=[1.0, 1.1, 1.2, 1.3])
    log.message("in", 1, 0, 3, "RESULT", 11, [], dropped="stale")
    with pytest.raises(SchemaError, match="RESULT message: unknown field"):
        log.message("in", 1, 0, 3, "RESULT", 11, [], late=True)
    with pytest.raises(SchemaError, match="'dropped' is 'lost'"):
        log.message("in", 1, 0, 3, "RESULT", 11, [], dropped="lost")
    with pytest.raises(SchemaError, match="'type' is 'LUNCH'"):
        log.message("out", 1, 0, 3, "LUNCH", 11, [])


def test_unchecked_the_writer_writes_what_it_is_given():
    out = io.StringIO()
    log = WireLog(out, checked=False)
    log.event("lunch", menu=["soup"])
    assert json.loads(out.getvalue())["event"] == "lunch"
    assert "_write" not in vars(log)                     # the plain write: no check in its path


# -- 2. on in the suite ---------------------------------------------------------------------------

def test_the_suite_checks_every_wire_log_it_writes():
    assert os.environ.get(CHECK_ENV) == "1" and ENV.get(CHECK_ENV) == "1"
    with pytest.raises(SchemaError):
        WireLog(io.StringIO()).event("lunch")


# -- 3. real launches -------------------------------------------------------------------------

DEMO, PREEMPTION = str(GOLDEN / "demo.spec.json"), str(GOLDEN / "preemption.spec.json")
LAUNCHES = {   # name -> (exit status, arguments)
    "restore": (0, ["--spec", DEMO, "--world-size", "4", "--on-rank-loss", "restore", "--audit-every", "1",
                    "--fault", "1:crash@2", "--fault", "2:duplicate@1", "--fault", "3:stale@3"]),
    "recompute": (0, ["--spec", PREEMPTION, "--world-size", "2", "--on-rank-loss", "recompute",
                      "--audit-every", "1", "--fault", "1:drop-write@2", "--fault", "0:crash@4"]),
    "overlap": (0, ["--spec", str(GOLDEN / "speculative.spec.json"), "--world-size", "2", "--rung", "overlap",
                    "--exec-cost", "1ms", "--on-rank-loss", "restore", "--fault", "1:crash@3",
                    "--fault", "0:garble@5"]),
    "overlap-recompute": (0, ["--spec", DEMO, "--world-size", "3", "--rung", "overlap",
                              "--on-rank-loss", "recompute", "--audit-every", "1", "--fault", "2:crash@2"]),
    "disagree": (1, ["--spec", PREEMPTION, "--world-size", "2", "--fault", "0:disagree@3"]),
    "idle": (0, ["--spec", str(GOLDEN / "continuous_batching.spec.json"), "--world-size", "2"]),
    "link": (0, ["--spec", DEMO, "--world-size", "3", "--on-rank-loss", "restore", "--step-timeout", "0.5",
                 "--fault", "0:plan-dup@1", "--fault", "2:result-dup@1", "--fault", "1:partition@2:0.1"]),
    "shrink": (0, ["--spec", DEMO, "--world-size", "3", "--on-rank-loss", "shrink", "--fault", "1:crash@2"]),
    "pause": (0, ["--spec", DEMO, "--world-size", "3", "--on-rank-loss", "pause", "--serve", "127.0.0.1:0",
                  "--pause-timeout", "0.2", "--pause-default", "scale-down", "--fault", "2:crash@3"]),
}
NEEDS_PEERS = {"turned-away", "rejoin-wait"}    # peers holding no rank; --listen: not run here


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, list[dict]]:
    """name -> the records of its wire log, written with checking on."""
    tmp = tmp_path_factory.mktemp("schema")
    out = {}
    for name, (status, args) in LAUNCHES.items():
        log = tmp / f"{name}.jsonl"
        done = subprocess.run([*CLI, "launch", *args, "--wire-log", str(log)], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == status and "SchemaError" not in done.stderr, (name, done.stderr[-2000:])
        out[name] = [json.loads(line) for line in log.read_text().splitlines()]
    return out


@pytest.mark.procs
def test_real_launches_write_only_what_the_schema_says(launched):
    seen: set[str] = set()
    for name, records in launched.items():
        for n, obj in enumerate(records, 1):
            try:
                check_record(obj)
            except SchemaError as e:
                pytest.fail(f"{name} line {n}: {e}: {json.dumps(obj)[:300]}")
            seen.add(obj.get("event", "message"))
        assert records[0]["event"] == "run" and records[-1]["event"] == "end", name
    assert "message" in seen and set(EVENTS) - NEEDS_PEERS <= seen - {"message"} <= set(EVENTS), sorted(seen)
    fields = {k for records in launched.values() for r in records if "dir" in r for k in r}
    assert fields == set(MESSAGE), sorted(fields)        # every field of a message, some time


# -- 4. the readers know the writer's events --------------------------------------------------

def test_the_page_draws_every_event_and_its_columns_are_the_schemas():
    assert page.KNOWN_EVENTS == set(EVENTS)
    for event in EVENTS:
        assert callable(getattr(page.Builder, "_ev_" + event.replace("-", "_"), None)), event
    assert (*PLAN_KEYS, "prior_drafts") == tuple(ITEM) and RESULT_KEYS == tuple(OUTCOME)


SORTS = {"rank": lambda v: kind_of(v) == "int" and 0 <= v <= 4095,      # schema.SORTS, in code
         "count": lambda v: kind_of(v) == "int" and v >= 0, "page": lambda v: kind_of(v) == "int" and v >= 0,
         "seconds": lambda v: kind_of(v) in ("int", "number") and math.isfinite(v) and v >= 0}
SAMPLES = [None, True, False, 0, 3, -1, 4095, 4096, 2.5, -0.5, float("inf"), "in", "out", "PLAN", "x", [],
           [0, 2], [-1], [4096], [True], ["a"], [1.5], {}, {"a": 1}, {"a": -1}, {"a": "b"}, {"a": True}]


def schema_allows(f, v) -> bool:
    """What the schema says of a value of field `f`: of its kinds, its elements of theirs, one of
    its choices, its numbers (a list's elements, an object's values) of its sort."""
    def of(kinds, x):
        k = kind_of(x)
        return k in kinds or k == "int" and "number" in kinds
    if not of(f.kinds, v) or f.choices and v not in f.choices:
        return False
    if isinstance(v, list) and not all(of(f.items, x) for x in v):
        return False
    if v is None or not f.sort:
        return True
    return all(map(SORTS[f.sort], v if isinstance(v, list) else v.values() if isinstance(v, dict) else [v]))


@pytest.mark.parametrize("table,fields,narrowed", [
    (INSPECT_MESSAGE, MESSAGE, {"rank": "present", "bytes": "present", "type": "any choice"}),
    (INSPECT_ITEM, ITEM, {}), (INSPECT_OUTCOME, OUTCOME, {}),
    *((INSPECTED[event], EVENTS[event].fields, {}) for event in INSPECTED)])
def test_inspect_checks_each_field_it_reads_as_the_schema_has_it(table, fields, narrowed):
    for name, (ok, must) in table.items():
        f = fields[name]
        assert f.required, name                        # inspect reads only what is always written
        for v in SAMPLES:
            want = schema_allows(f, v)
            if narrowed.get(name) == "present":
                want = want and v is not None
            elif narrowed.get(name) == "any choice":
                want = schema_allows(dataclasses.replace(f, choices=()), v)
            assert ok(v) == want, (name, v, must)


def test_what_the_checker_needs_the_schema_requires():
    for kind, names in NEEDED.items():
        fields = MESSAGE if kind == "message" else EVENTS[kind].fields
        assert all(fields[name].required for name in names), kind


# -- 5. the table of events in the documentation -------------------------------------------------

def event_tables() -> list[tuple[Path, list[tuple[list[str], str | None]]]]:
    """Every markdown table of README.md and docs/*.md whose header's first cell says "event"
    and whose first column names events in backticks: (file, [(names, its fields cell, or
    None where the table has no column headed "fields")])."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines() if path.exists() else []
        for i, line in enumerate(lines[:-1]):
            head = _cells(line)
            if not head or "event" not in head[0].lower() or not re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
                continue
            col = next((j for j, h in enumerate(head) if "field" in h.lower()), None)
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                names = re.findall(r"`([^`]+)`", cells[0])
                if names:
                    rows.append((names, cells[col] if col is not None and col < len(cells) else None))
            if rows:
                found.append((path, rows))
    return found


def _cells(line: str) -> list[str]:
    line = line.strip()
    return [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []


def _fields(cell: str) -> set[str]:
    """The field names a table cell lists: the first word of each comma- or semicolon-separated
    part, once what is in parentheses and backticks' marks are taken out."""
    cell = re.sub(r"\([^)]*\)", "", cell.replace("`", ""))
    return {m.group(0) for part in re.split(r"[,;]", cell) if (m := re.search(r"[a-z_]+", part))}


def test_the_documented_table_of_events_is_the_schema():
    tables = event_tables()
    assert tables, ("no table of the wire log's events in README.md or docs/*.md (a markdown table "
                    "whose first column, headed \"event\", names the events in backticks)")
    for path, rows in tables:
        where = path.relative_to(REPO)
        documented = [name for names, _ in rows for name in names]
        assert sorted(documented) == sorted(EVENTS), (
            f"{where}: events in the table but not in the schema: {sorted(set(documented) - set(EVENTS))}; "
            f"in the schema but not in the table: {sorted(set(EVENTS) - set(documented))}")
        for names, cell in rows:
            if cell is None:
                continue
            schema = set().union(*(EVENTS[n].fields for n in names))
            assert _fields(cell) == schema, (f"{where}: the fields of {', '.join(names)}: the table says "
                                             f"{sorted(_fields(cell))}, the schema {sorted(schema)}")
