"""engine: the single-process serving engine of docs/SPEC.md.

Pure Python, no I/O. The control plane (`Engine`) decides; an executor with
`execute(plan) -> result` runs the plan on N ranks (default `LocalGroup`).

    from inferris_dist.engine import Engine, load_workload
    eng = Engine(load_workload("workload.json"))
    for trace in eng.run():
        print(trace.to_json())
    print(eng.summary())
"""
import importlib

from .errors import (
    BoundaryViolation,
    EngineError,
    GroupViolation,
    Irreducible,
    MachineFailure,
    NeverFits,
    OutOfPages,
    RankLost,
    WorkloadError,
)

# Every other name is imported on first use, so that a rank worker, which needs only
# messages, rank and shard, does not pay for the control plane at every start.
_LAZY = {
    "LocalGroup": "group", "accept_scripts": "group", "join": "group",
    "ExecutionPlan": "messages", "ExecutionResult": "messages", "ItemOutcome": "messages",
    "PlanItem": "messages", "RankExecutionResult": "messages", "expand_placements": "messages",
    "page_spans": "messages", "placement_pages": "messages",
    "CACHE": "pool", "PagePool": "pool", "pages_needed": "pool",
    "RankExecutor": "rank", "verdict": "rank",
    "FinishReason": "request", "Request": "request", "SampleResult": "request", "State": "request",
    "Engine": "step", "PreparedStep": "step",
    "StepTrace": "trace",
    "RUNGS": "rungs", "Rung": "rungs",
    "EngineConfig": "workload", "RequestSpec": "workload", "Workload": "workload",
    "load_workload": "workload", "parse_workload": "workload",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "BoundaryViolation", "CACHE", "Engine", "EngineConfig", "EngineError", "ExecutionPlan",
    "ExecutionResult", "FinishReason", "GroupViolation", "Irreducible", "ItemOutcome",
    "LocalGroup", "MachineFailure", "NeverFits", "OutOfPages", "PagePool", "PlanItem", "PreparedStep",
    "RankExecutionResult",
    "RUNGS", "RankExecutor", "RankLost", "Request", "Rung", "RequestSpec", "SampleResult", "State",
    "StepTrace",
    "Workload", "WorkloadError", "accept_scripts", "expand_placements", "join", "load_workload",
    "page_spans", "pages_needed", "parse_workload", "placement_pages", "run_workload", "trace_json_lines",
    "trace_dicts", "trace_objects", "verdict",
]


def run_workload(workload, executor=None) -> list[dict]:
    """Run to the end; the SPEC §4 lines as dicts (the steps, then summary or error)."""
    from .step import Engine
    return trace_dicts(Engine(workload, executor))


def trace_dicts(engine) -> list[dict]:
    """Run an engine to the end; its SPEC §4 lines (the steps, then the summary or the error)."""
    return list(trace_objects(engine))


def trace_json_lines(engine):
    """`trace_objects` as JSON text, one line each (without newlines): what `--json` prints."""
    import json
    try:
        for trace in engine.run():
            yield engine.json_line(trace)
    except EngineError as e:
        yield json.dumps(e.to_json())
        return
    yield json.dumps({"summary": engine.summary()})


def trace_objects(engine):
    """Run an engine, yielding its SPEC §4 lines as they happen: each step, then the
    summary, or the error object where a step fails."""
    try:
        for trace in engine.run():
            yield engine.trace_json(trace)
    except EngineError as e:
        yield e.to_json()
        return
    yield {"summary": engine.summary()}
