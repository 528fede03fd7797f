"""What each recovery policy promises (docs/faults.md), how a run is judged against it, and the
words of a difference: the one place `compare`, `check`, chaos and the testing library judge by.

- abort (and a run without faults): the same trace as the in-process engine, or, when a fault
  fires, a failure of one of the kinds a fault makes (STEP_FAILURES), naming the faulted rank;
- restore: the same trace, byte for byte, whatever was lost;
- recompute: the same summary (every request's tokens and how it finished); the steps may
  differ, since a recompute plans the step again from nothing;
- shrink: the same trace, at whatever world size the run goes on with; when a loss would
  take the world below --min-world-size, abort's promise (the run fails, blaming a faulted rank);
- pause: the promise of the instruction the operator gave: retry keeps restore's, scale-down
  and scale-up shrink's, abort (or the pause timeout's abort) abort's.

Lines are SPEC §4 objects: one per step, then `{"summary": [...]}`, or the error object
where the run failed. `comparable` is how lines compare: an error line by its kind and step
only (its message is for people).

`judge` compares the two runs' lines (compare's verdict: a side that failed alone is a
difference); `kept` judges the run on processes by its policy's promise, a failure a fault
made included (what `testing.assert_holds` asserts).
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from inferris_dist.protocol.faults import parse_fault
from inferris_dist.words import shown

STEP_FAILURES = ("RankLost", "GroupViolation", "BoundaryViolation", "ShardDivergence")   # what faults make
HELD = {"traces": "the trace is the reference's", "summaries": "the summary is the reference's",
        "prefix": "the steps before the failure are the reference's",
        None: "no reference compared"}        # a recorded run's promise found kept, by what was compared


ENDS_LIKE_ABORT = ("abort", "shrink", "pause")   # a failure they may end in keeps abort's promise


def compared(policy: str) -> str:
    """What `policy` promises to keep: "summaries" (recompute) or "traces" (every other)."""
    return "summaries" if policy == "recompute" else "traces"


# -- a run on processes against the in-process run ------------------------------------------

def comparable(lines: Iterable[dict]) -> list[dict]:
    """Lines as runs are compared: an error line by its kind and step only (SPEC §4)."""
    return [{"error": x["error"], "step": x.get("step")} if isinstance(x, dict) and "error" in x else x
            for x in lines]


def judge(local: list[dict], remote: list[dict], policy: str) -> dict:
    """Whether `remote` (on processes) keeps `policy`'s promise against `local` (in process):
    what was compared ("traces" or "summaries"), the steps on each side, the failed sides'
    error objects, `holds`, and the first difference if it does not hold."""
    steps = [sum(1 for line in lines if "step" in line and "error" not in line) for lines in (local, remote)]
    failed = {side: lines[-1] for side, lines in (("in process", local), ("on processes", remote))
              if lines and "error" in lines[-1]}
    out = {"compared": compared(policy),
           "steps": {"in process": steps[0], "on processes": steps[1]},
           "failed": dict(failed), "difference": None}
    trace_diff = first_difference(local, remote)
    if failed and not (len(failed) == 2 and trace_diff is None):
        out["holds"] = False
        return out
    if out["compared"] == "traces" or failed:
        out["holds"] = trace_diff is None
        out["difference"] = trace_diff
        return out
    summary_diff = first_summary_difference(local[-1].get("summary", []), remote[-1].get("summary", []))
    out["holds"] = summary_diff is None
    out["difference"] = summary_diff
    out["traces_identical"] = trace_diff is None
    return out


def kept(local: list[dict], remote: list[dict], policy: str, faults: Sequence[str] | None = None) -> dict:
    """`judge`'s verdict, with a run on processes that failed where the in-process run did not
    judged by the promise a failure keeps (abort; restore or recompute once a fault that keeps
    coming back, `@STEP+`, ran out the restarts): `failure_broken`. `faults`: the run's (RANK:
    KIND@STEP texts); None: not known, and the blame is not checked. A failure that keeps it
    holds, "kept" saying so."""
    verdict = judge(local, remote, policy)
    if verdict["holds"] or list(verdict["failed"]) != ["on processes"]:
        return verdict
    repeating = any(parse_fault(f).repeat for f in faults or ())
    if policy not in ENDS_LIKE_ABORT and not repeating:
        return verdict
    why = failure_broken(local, remote, faults, steps_before=policy != "recompute")
    if why is not None:
        return {**verdict, "difference": why}
    return {**verdict, "holds": True, "kept": f"the steps before the failure, then {error_said(remote[-1])}"}


def failure_broken(local: list[dict], remote: list[dict], faults: Sequence[str] | None = None,
                   steps_before: bool = True) -> str | None:
    """Why the failure that ended `remote` does not keep abort's promise, or None: the steps
    before it are `local`'s exactly (`steps_before`), and it is a failure a fault makes
    (STEP_FAILURES) at a step, blaming a rank a fault of `faults` acts on at or before that
    step (a fault on every rank: any rank; a failure that blames nobody: any such fault; a
    partition acts from the step before at `overlap`). `faults` None: the blame is not checked."""
    err, before = remote[-1], remote[:-1]
    if steps_before:
        diff = first_difference(local[:len(before)], before)
        if diff is not None:
            return f"the steps before the failure differ: {diff}"
    if err.get("error") not in STEP_FAILURES:
        return f"it failed with {error_said(err)}, a failure no fault makes"
    step = err.get("step")
    if step is None:
        return f"it failed with {error_said(err)}, before any step"
    if faults is None:
        return None
    acted = [f for f in map(parse_fault, faults) if f.step - (f.kind == "partition") <= step]
    if not acted:
        return f"it failed with {error_said(err)}, before any fault acted"
    blamed = [err["rank"]] if err.get("rank") is not None else list(err.get("ranks") or ())
    if blamed and not any(f.rank is None or f.rank in blamed for f in acted):
        return (f"it failed with {error_said(err)}, blaming a rank no fault acted on by step {step} "
                f"(acted: {', '.join(f.text for f in acted)})")
    return None


def broken(verdict: dict, policy: str) -> str | None:
    """A verdict that does not hold, in one line: what differed first, what failed on which side
    (None: it holds)."""
    if verdict["holds"]:
        return None
    failed = "; ".join(f"{side}: {json.dumps(err)}" for side, err in verdict["failed"].items())
    return (f"{policy} does not keep its promise ({verdict['compared']}): "
            f"{verdict['difference'] or 'a run failed'}{'; ' + failed if failed else ''}")


def first_difference(a: list[dict], b: list[dict]) -> str | None:
    """The first line where `a` (in process) and `b` (on processes) differ, in words; an error
    line compares by its kind and step."""
    for i, (x, y) in enumerate(zip(comparable(a), comparable(b))):
        if x != y:
            where = f"step {x['step']}" if "step" in x else f"line {i + 1}"
            return f"{where}, {_first_field(x, y)}"
    if len(a) != len(b):
        return f"in process {len(a)} lines, on processes {len(b)} lines"
    return None


def first_summary_difference(a: list[dict], b: list[dict]) -> str | None:
    """The first request whose summary differs (its state, tokens generated, positions
    computed, finish reason: recompute changes the steps, never these)."""
    by_id = {r.get("request_id"): r for r in b}
    for r in a:
        other = by_id.get(r.get("request_id"))
        if other is None:
            return f"request {_escaped(str(r.get('request_id')))}: missing on processes"
        differs = _first_field(r, other)
        if differs is not None:
            return f"request {_escaped(str(r.get('request_id')))}, {differs}"
    if len(a) != len(b):
        return f"in process {len(a)} requests, on processes {len(b)}"
    return None


def _first_field(x: dict, y: dict) -> str | None:
    """The first field two objects disagree on, both values shown (None: they agree)."""
    for key in dict.fromkeys([*x, *y]):
        if x.get(key) != y.get(key):
            return (f"field {key!r}: in process {json.dumps(x.get(key))}, "
                    f"on processes {json.dumps(y.get(key))}")
    return None


def _escaped(text: str) -> str:
    """A request id made safe for a terminal, as Python escapes a string literal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def error_said(err: dict, epoch: bool = True) -> str:
    """An error object in a few words: its kind, its step (or start-up), its epoch, the rank(s)
    it blames."""
    ranks = err.get("ranks") or ([err["rank"]] if err.get("rank") is not None else [])
    who = f", rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}" if ranks else ""
    at = "during start-up" if err.get("step") is None else f"at step {err['step']}"
    when = f", epoch {err['epoch']}" if epoch and err.get("epoch") is not None else ""
    return f"{err.get('error')} {at}{when}{who}"


def verdict_text(v: dict) -> str:
    """`compare`'s verdict for people: one line, or one per failed side."""
    name, n = shown(v["workload"]), v["world_size"]
    where = f"in process and on {n} worker process{'es' * (n != 1)}"
    failed = v["failed"]
    if failed and not v["holds"]:
        lines = [f"{name}: the run {side} failed: {error_said(err)}: {shown(err.get('message', ''))}"
                 for side, err in failed.items()]
        if len(failed) == 1:
            other = "on processes" if "in process" in failed else "in process"
            lines.append(f"{name}: the run {other} did not")
        return "\n".join(lines)
    steps = v["steps"]
    if v["compared"] == "traces":
        if v["holds"]:
            ends = f", both ending {error_said(failed['in process'])}" if failed else ""
            return f"{name}: identical ({steps['in process']} steps{ends}) {where}"
        return f"{name}: traces differ: {v['difference']}"
    if v["holds"]:
        how = ("the traces too" if v.get("traces_identical") else
               f"the steps differ, as recompute's replanning may: {steps['in process']} steps in "
               f"process, {steps['on processes']} on processes")
        return (f"{name}: the same summary {where} (recompute promises the summary, not the steps; "
                f"compared every request's state, generated, computed and finish: identical; {how})")
    return f"{name}: summaries differ under recompute: {v['difference']}"


# -- a recorded run against the reference engine (judge/check.py) ----------------------------

def id_said(rid: Any) -> str:
    """A request id from a log, safe and short."""
    return shown(str(rid))[:60]


def json_said(v: Any) -> str:
    """A value from a log as JSON, safe and at most 120 characters."""
    text = shown(json.dumps(v))
    return text if len(text) <= 120 else text[:117] + "..."


def field_difference(got: dict, want: dict) -> str:
    """The first field a recorded step (or request) has other than the reference's."""
    for key in dict.fromkeys([*want, *got]):
        if json.dumps(got.get(key)) != json.dumps(want.get(key)):
            return f"{key} {json_said(got.get(key))}, the reference {json_said(want.get(key))}"
    return "the fields in another order"


def summary_difference(got: list[dict], want: list[dict]) -> str:
    """The first request of a summary rebuilt from a log that is not the reference's."""
    for g, w in zip(got, want):
        if g != w:
            return f"request {id_said(w['request_id'])}: {field_difference(g, w)}"
    return f"{len(got)} requests, the reference {len(want)}"
