"""engine: the single-process serving engine of SPEC.md.

Pure Python, no I/O. The control plane (`Engine`) decides; an executor with
`execute(plan) -> result` runs the plan on N ranks (default `LocalGroup`).

    from engine import Engine, load_workload
    eng = Engine(load_workload("workload.json"))
    for trace in eng.run():
        print(trace.to_json())
    print(eng.summary())
"""
import json

from .errors import (BoundaryViolation, EngineError, GroupViolation, Irreducible, OutOfPages,
                     RankLost, WorkloadError)
from .group import LocalGroup, accept_scripts, join
from .messages import (ExecutionPlan, ExecutionResult, ItemOutcome, PlanItem, RankExecutionResult,
                       expand_placements, page_spans, placement_pages)
from .pool import CACHE, PagePool, pages_needed
from .rank import RankExecutor, verdict
from .request import FinishReason, Request, SampleResult, State
from .step import Engine, PreparedStep
from .trace import StepTrace
from .workload import EngineConfig, RequestSpec, Workload, load_workload, parse_workload

__all__ = [
    "BoundaryViolation", "CACHE", "Engine", "EngineConfig", "EngineError", "ExecutionPlan",
    "ExecutionResult", "FinishReason", "GroupViolation", "Irreducible", "ItemOutcome",
    "LocalGroup", "OutOfPages", "PagePool", "PlanItem", "PreparedStep", "RankExecutionResult",
    "RankExecutor", "RankLost", "Request", "RequestSpec", "SampleResult", "State", "StepTrace",
    "Workload", "WorkloadError", "accept_scripts", "expand_placements", "join", "load_workload",
    "page_spans", "pages_needed", "parse_workload", "placement_pages", "run_workload", "trace_json_lines", "trace_lines", "trace_objects", "verdict",
]


def run_workload(workload, executor=None) -> list[dict]:
    """Run to the end; the SPEC §4 lines as dicts (the steps, then summary or error)."""
    return trace_lines(Engine(workload, executor))


def trace_lines(engine: Engine) -> list[dict]:
    """Run an engine to the end; its SPEC §4 lines (the steps, then the summary or the error)."""
    return list(trace_objects(engine))


def trace_json_lines(engine: Engine):
    """`trace_objects` as JSON text, one line each (without newlines): what `--json` prints."""
    try:
        for trace in engine.run():
            yield trace.json_line()
    except EngineError as e:
        yield json.dumps(e.to_json())
        return
    yield json.dumps({"summary": engine.summary()})


def trace_objects(engine: Engine):
    """Run an engine, yielding its SPEC §4 lines as they happen: each step, then the
    summary, or the error object where a step fails."""
    try:
        for trace in engine.run():
            yield trace.to_json()
    except EngineError as e:
        yield e.to_json()
        return
    yield {"summary": engine.summary()}
