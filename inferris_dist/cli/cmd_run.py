"""`inferris-dist run`: a workload run by the engine in this process, its ranks in process too."""
from __future__ import annotations

import sys

from inferris_dist.cli.args import EXIT_FAILED, EXIT_OK
from inferris_dist.cli.flags import (
    add_metrics_flag,
    add_output_flags,
    add_rung_flag,
    add_workload_flags,
    described,
    workload_of,
)

TYPE_CHECKING = False      # typing.TYPE_CHECKING, without loading typing at every start

if TYPE_CHECKING:
    from inferris_dist.observe.metrics import Metrics, MetricsFile


def add_arguments(run) -> None:
    from inferris_dist.cli.workload_source import WORKLOAD_HELP
    described(run, epilog=WORKLOAD_HELP)
    add_workload_flags(run)
    add_rung_flag(run)
    add_output_flags(run)
    add_metrics_flag(run)


def main(args) -> int:
    workload, name = workload_of(args)
    return run_in_process(workload, name, args.json, args.rung, args.verbose, args.metrics)


def run_in_process(workload, name: str, as_json: bool, rung: str = "full", verbose: bool = False,
                   metrics_path: str | None = None) -> int:
    from inferris_dist.cli import render
    from inferris_dist.engine import Engine, EngineError, trace_json_lines
    from inferris_dist.observe.metrics import (
        Metrics,
        MetricsFile,
        MetricsNotWritten,
        error_object,
        write_quietly,
    )
    from inferris_dist.protocol.faults import parse_faults
    out = sys.stdout
    parse_faults((), workload.config.world_size, workload.faults)   # refused alike by run and launch
    if workload.faults:
        sys.stderr.write(f"inferris-dist: note: the workload's faults ({', '.join(workload.faults)}) "
                         f"act on worker processes; run them with `inferris-dist launch`\n")
    engine = Engine(workload, rung=rung)
    file = MetricsFile(metrics_path) if metrics_path is not None else None
    progress = render.Progress(sys.stderr, len(workload.requests))
    total = len(workload.requests)
    if as_json and file is not None:
        return _json_with_metrics(engine, Metrics(engine, name), file, out, progress)
    if as_json:
        last = ""
        try:
            for last in trace_json_lines(engine):
                out.write(last + "\n")
                progress.update(engine.step_id - 1, total - engine.num_unfinished)
        finally:
            progress.clear()
        return EXIT_FAILED if last.startswith('{"error"') else EXIT_OK
    metrics = Metrics(engine, name, keep_steps=file is not None)
    style = render.Style.for_stream(out)
    out.write(render.header(workload, name) + "\n")
    printer = render.StepPrinter(out, style, verbose)
    num_steps = 0
    try:
        for trace in engine.run():
            num_steps += 1
            metrics.step(trace)
            progress.clear()
            printer.step(trace)
            progress.update(trace.step, total - engine.num_unfinished)
    except EngineError as err:
        progress.clear()
        printer.flush()
        out.write(render.request_table(engine.summary(), style) + "\n")
        out.flush()
        render.write_error(err, sys.stderr, render.Style.for_stream(sys.stderr))
        if file is not None:
            write_quietly(file, metrics.document(error=err.to_json()))
        return EXIT_FAILED
    except BaseException as e:               # interrupted (or a bug): the file says so
        if file is not None:
            write_quietly(file, metrics.document(error=error_object(e, engine.step_id)))
        raise
    finally:
        progress.clear()
    printer.flush()
    out.write(render.request_table(engine.summary(), style) + "\n")
    out.write(render.closing_line(num_steps, engine.summary()) + "\n")
    for line in metrics.summary_lines():
        out.write(line + "\n")
    if file is not None:
        try:
            file.write(metrics.document())
        except MetricsNotWritten as err:
            out.flush()
            render.write_error(err, sys.stderr, render.Style.for_stream(sys.stderr))
            return EXIT_FAILED
    return EXIT_OK


def _json_with_metrics(engine, metrics: Metrics, file: MetricsFile, out, progress) -> int:
    """`run --json --metrics FILE`: the lines of `trace_json_lines` (the same bytes), each
    step recorded on the way. The summary line waits for the file: a file the machine
    refuses ends the run as a failure, its error object in the summary's place."""
    import json

    from inferris_dist.engine import EngineError
    from inferris_dist.observe.metrics import MetricsNotWritten, error_object, write_quietly
    total = len(engine.requests)
    failure = None
    try:
        for trace in engine.run():
            metrics.step(trace)
            out.write(engine.json_line(trace) + "\n")
            progress.update(trace.step, total - engine.num_unfinished)
    except EngineError as err:
        failure = err
    except BaseException as e:
        write_quietly(file, metrics.document(error=error_object(e, engine.step_id)))
        raise
    finally:
        progress.clear()
    if failure is not None:
        write_quietly(file, metrics.document(error=failure.to_json()))
    else:
        try:
            file.write(metrics.document())
        except MetricsNotWritten as err:
            failure = err
    if failure is not None:
        out.write(json.dumps(failure.to_json()) + "\n")
        return EXIT_FAILED
    out.write(json.dumps({"summary": engine.summary()}) + "\n")
    return EXIT_OK
