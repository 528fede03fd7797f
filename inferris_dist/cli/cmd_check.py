"""`inferris-dist check WIRELOG [--spec FILE] [--require-reference] [--json]`: a recorded run judged
afterwards.

The checks are `inferris_dist.judge.check`'s (its docstring says each one, and what a log
cannot show): every committed step joined from one RESULT of each rank of its epoch, all
agreeing, each answering a PLAN sent to that rank; epochs only forward, no reply of another
epoch or of a retired member taken; each step's trace following from its plan and its
joined result; each restart a recovery of a failure, replacing every rank lost, under the
run's policy, within its max_restarts; the end recorded last, a failed run committing
nothing from its failed step on; and, with the workload (recorded in the log's run
event, or given with --spec and checked to be the run's by its digest), the policy's promise
against the reference engine.

Output: a clean log is one line saying what was checked, exit status 0. A log with
violations: one line per violation, naming the line of the log, the step, the epoch and the
rank where known, then one line counting them; exit status 1. A violation that is the root
cause of those after it (a restart missing) comes first and folds them: "... and N more that
follow from it". Bad input (no such file, not a wire log, a malformed record, a --spec that
is not the run's workload): one line on standard error, exit status 2.

With no reference compared (the log records no workload, and none was given), only the
history was judged, not the policy's promise: a warning on standard error says so; with
--require-reference that is a failure, exit status 1.

--json: one JSON object, and nothing else on standard output:
  {"log": NAME, "ok": true|false,
   "violations": [{"line": N or null, "step": S or null, "epoch": E or null, "rank": R or null,
                   "what": TEXT, "follows": L or null}, ...],
                                                  the first 1000; "more_violations" counts the rest
   "more_violations": N,
   "checked": {"records": N, "steps": N, "committed": N, "idle": N, "attempts": N, "epochs": N,
               "ranks": N, "results": N, "dropped": N, "rung": RUNG, "policy": POLICY,
               "end": "ok"|"failed"|null, "workload": "recorded"|"given"|null,
               "reference": "traces"|"summaries"|"prefix"|null, "why_not": TEXT or null,
               "cut_short": N or null}}
  "steps": steps run (committed and idle); "results": RESULTs taken; "dropped": replies the
  log marks dropped; "reference": what was compared with the reference engine (the trace;
  recompute's summary; a failed run's steps before its failure), null when nothing was
  ("why_not" says why); "cut_short": the number of the last line, left out if cut short;
  a violation's "follows": the line of the root cause it follows from (folded under it in the
  text), null for one said for itself.
"""
from __future__ import annotations

import json
import sys
from typing import TextIO

from inferris_dist.cli.args import EXIT_FAILED, EXIT_OK
from inferris_dist.cli.flags import described
from inferris_dist.cli.render import shown
from inferris_dist.engine import WorkloadError

JSON_HELP = __doc__[__doc__.index("--json:"):]      # the shape, for `check --help`


def add_arguments(chk) -> None:
    described(chk, epilog=JSON_HELP)
    chk.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    chk.add_argument("--spec", metavar="FILE", help="the run's workload (or - for stdin), for a log that "
                     "does not record it whole; refused unless it is the run's")
    chk.add_argument("--require-reference", action="store_true", help="fail (exit status 1) when no "
                     "reference could be compared: the log records no workload and no --spec gave it")
    chk.add_argument("--json", action="store_true", help="one JSON object (its shape below)")


def main(args) -> int:
    return run_check(args.wirelog, args.spec, sys.stdout, args.json, args.require_reference)


def run_check(path: str, spec: str | None, out: TextIO, as_json: bool = False,
              require_reference: bool = False, err: TextIO | None = None) -> int:
    from inferris_dist.judge.check import NotTheRunsWorkload, check_log  # only when checking
    workload = None
    if spec is not None:
        from inferris_dist.cli.workload_source import workload_from_flags
        workload, _ = workload_from_flags(spec, None, {})
    try:
        report = check_log(path, workload)
    except NotTheRunsWorkload as e:
        raise WorkloadError(f"check {shown(path)}: --spec {shown(spec)} is not this run's workload (its "
                            f"digest {e.given[:19]}..., the log's {shown(e.recorded)[:19]}...)") from None
    if as_json:
        out.write(json.dumps(report.to_json()) + "\n")
    else:
        out.write("".join(line + "\n" for line in report.lines()))
    unjudged = report.checked["reference"] is None
    if unjudged:
        (err or sys.stderr).write(_unjudged(report, require_reference) + "\n")
    return EXIT_OK if report.ok and not (unjudged and require_reference) else EXIT_FAILED


def _unjudged(report, required: bool) -> str:
    """The line saying no reference was compared: a warning, or with --require-reference the
    failure; where the workload is what is missing, how to give it."""
    why = report.checked["why_not"] or "the log records no workload"
    give = "; give the run's workload with --spec" if report.checked["workload"] is None else ""
    if required:
        return (f"inferris-dist: error: no reference compared ({why}), and --require-reference asks for "
                f"one{give}")
    return (f"inferris-dist: warning: no reference compared ({why}): the history was judged, not the "
            f"policy's promise{give} (--require-reference fails here)")
