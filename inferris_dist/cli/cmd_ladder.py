"""`inferris-dist ladder`: one workload at every rung of the mechanism ladder, side by side.

Each row is the engine as it stands at that rung (SPEC §6), run in process:
what the rung adds, how many steps the workload took, the tokens computed
and reused from the cache, the preemptions, the drafted and accepted tokens,
the mean batch, the requests finished, or the error that stopped it. Read
down a column to see what one mechanism buys.
"""
from __future__ import annotations

import json
import sys

from inferris_dist.cli import render
from inferris_dist.cli.args import EXIT_OK
from inferris_dist.cli.flags import add_workload_flags, workload_of
from inferris_dist.engine import Engine, EngineError
from inferris_dist.engine.rungs import RUNGS

COLUMNS = ("rung", "adds", "steps", "computed", "reused", "preempted", "drafted", "accepted",
           "discarded", "batch", "finished")


def climb(workload) -> list[dict]:
    """Run `workload` at every rung; one row of figures (or the error) per rung."""
    return [rung_row(workload, name) for name in RUNGS]


def rung_row(workload, name: str) -> dict:
    rung = RUNGS[name]
    engine = Engine(workload, rung=name)
    adds = rung.adds + (" (beyond the original)" if rung.beyond else "")
    row = {"rung": name, "adds": adds, "steps": 0, "computed": 0, "reused": 0, "preempted": 0,
           "drafted": 0, "accepted": 0, "discarded": 0, "batch": 0.0, "finished": 0, "error": None}
    batches = []
    try:
        for t in engine.run():
            row["steps"] += 1
            row["computed"] += sum(t.executed.values())
            row["reused"] += sum(t.reused.values())
            row["preempted"] += len(t.preempted)
            row["drafted"] += sum(t.drafted.values())
            row["accepted"] += sum(t.accepted.values())
            row["discarded"] += sum(t.discarded.values())
            row["finished"] += len(t.finished)
            if t.executed:
                batches.append(len(t.executed))
    except EngineError as e:
        row["error"] = {"error": e.kind, "step": e.step, "message": e.message}
    row["batch"] = round(sum(batches) / len(batches), 2) if batches else 0.0
    return row


def write_table(rows: list[dict], num_requests: int, out, style) -> None:
    """Aligned: names left, figures right; a rung that failed says how, across its figures."""
    table, failed = [COLUMNS], {}
    for r in rows:
        if r["error"] is not None:
            e = r["error"]
            failed[len(table)] = f"{e['error']} at step {e['step']}: {e['message']}"
            table.append((r["rung"], r["adds"]) + ("",) * (len(COLUMNS) - 2))
        else:
            table.append((r["rung"], r["adds"], str(r["steps"]), str(r["computed"]), str(r["reused"]),
                          str(r["preempted"]), str(r["drafted"]), str(r["accepted"]),
                          str(r["discarded"]), f"{r['batch']:.2f}", f"{r['finished']}/{num_requests}"))
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for i, row in enumerate(table):
        cells = [v.ljust(w) if j < 2 else v.rjust(w) for j, (v, w) in enumerate(zip(row, widths))]
        line = "  ".join(cells[:2] + ([style.red(failed[i])] if i in failed else cells[2:]))
        out.write((style.dim(line) if i == 0 else line).rstrip() + "\n")


def run_ladder(workload, name: str, as_json: bool) -> int:
    rows = climb(workload)
    out = sys.stdout
    if as_json:
        for row in rows:
            out.write(json.dumps(row) + "\n")
        return EXIT_OK
    style = render.Style.for_stream(out)
    out.write(render.header(workload, name) + "\n")
    write_table(rows, len(workload.requests), out, style)
    return EXIT_OK


def add_arguments(lad) -> None:
    add_workload_flags(lad)
    lad.add_argument("--json", action="store_true", help="one JSON object per rung")


def main(args) -> int:
    from inferris_dist.cli.workload_source import LADDER_DEMO
    workload, name = workload_of(args, default=LADDER_DEMO, default_name="ladder demo")
    return run_ladder(workload, name, args.json)
