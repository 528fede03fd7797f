"""The runs of `inferris-dist launch` and `inferris-dist compare` (cmd_launch, cmd_compare): the
engine on real processes, printed as it runs."""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import zmq

from inferris_dist.cli import render
from inferris_dist.cli.args import EXIT_FAILED, EXIT_OK, Terminated
from inferris_dist.engine import Engine, EngineError, WorkloadError, trace_dicts
from inferris_dist.engine.errors import MachineFailure
from inferris_dist.observe.timeline import Timeline
from inferris_dist.protocol.faults import TIME_KINDS
from inferris_dist.scheduler.channel import machine_failure
from inferris_dist.scheduler.entry import LaunchOptions, launch


def options_from_args(args, timeline: Timeline | None, log_stream, on_waiting,
                      name: str = "", made: dict | None = None) -> LaunchOptions:
    return LaunchOptions(name=name, step_timeout=args.step_timeout, faults=args.fault,
                         audit_every=args.audit_every, on_rank_loss=args.on_rank_loss,
                         max_restarts=args.max_restarts, wire_log=log_stream, timeline=timeline,
                         listen=args.listen, keys=args.keys, join_timeout=args.join_timeout,
                         rejoin_timeout=args.rejoin_timeout, on_waiting=on_waiting, rung=args.rung,
                         exec_cost=args.exec_cost, worker=args.worker,
                         min_world_size=args.min_world_size, regrow=args.regrow, **(made or {}))


def run_launch(workload, name: str, args, made: dict | None = None, started: float | None = None) -> int:
    """`inferris-dist launch`: print every step and what crossed, or `--json` (the bytes of
    `run --json`); exit 1 with the diagnosis when the ranks fail. With `--serve` the run is
    served live while it runs (cmd_serve.LaunchServer), by a process of its own. `made`:
    the run directory and worker template made already (flags.made_for); `started`: when
    the command began (its start-up is counted from then; default now)."""
    from inferris_dist.cli.cmd_launch import LAUNCH_LINGER
    from inferris_dist.cli.cmd_serve import LaunchServer
    linger = getattr(args, "serve_linger", LAUNCH_LINGER)
    server = LaunchServer(getattr(args, "serve", None), linger, args)     # binds now
    try:
        status = _run_launch(workload, name, args, server, made, started)
        server.finish(server.log_ok)
    finally:
        server.close()
    return status


def _run_launch(workload, name: str, args, server, made, started) -> int:
    from inferris_dist.observe.metrics import Metrics, MetricsFile, empty_document, error_object, timed
    as_json = args.json
    out = sys.stdout
    style = render.Style.for_stream(out)
    printer = render.StepPrinter(out, style, args.verbose)
    num_steps = 0
    started = time.monotonic() if started is None else started
    engine = group = None
    status = EXIT_OK
    failure = interrupted = None
    ran: list[float] = [started]                  # start, the first step's start, the run's end
    with ExitStack() as opened:              # bad input before the run: whatever was opened, undone
        wire_log = args.wire_log
        if server.wanted and wire_log is None:          # served: a wire log of our own to follow
            wire_log = server.private_log()
        html = HtmlPage(getattr(args, "html", None), wire_log)
        opened.callback(html.discard)        # (no temporary wire log left behind)
        log_stream = _open_for_writing(html.wire_log, "--wire-log", opened)
        timeline_stream = _open_for_writing(args.timeline, "--timeline", opened)
        metrics_path = getattr(args, "metrics", None)
        metrics_file = MetricsFile(metrics_path) if metrics_path is not None else None
        if metrics_file is not None:
            opened.callback(metrics_file.close)
        timeline = Timeline() if timeline_stream is not None else None
        options = options_from_args(args, timeline, log_stream,
                                    lambda *waiting: announce(args, workload, *waiting), name,
                                    {**(made or {}), "operator": server.desk})
        options.check()
        if server.wanted:
            server.start(html.wire_log, name)
        opened.pop_all()                     # the run starts: they stay open until it ends
    metrics = None

    def metrics_document(problem, escaping) -> dict:
        """What there is, and what ended the run (a failure, an output the machine refused,
        an interrupt on its way out)."""
        ended = failure or problem
        error = (ended.to_json() if ended is not None else None if escaping is None
                 else error_object(escaping, engine.step_id if engine is not None else None))
        if metrics is None:
            return empty_document(name, error)
        arrivals = None
        if group is not None:
            run_seconds = time.monotonic() - ran[1] if len(ran) > 1 else None
            arrivals = group.recorder.arrivals.to_json(run_seconds)
        return metrics.document(group.totals if group is not None else None, error, arrivals)

    total = len(workload.requests)
    progress = render.Progress(sys.stderr, total)
    try:
        with launch(workload, options=options) as engine:
            group = engine.group
            if metrics_file is not None or not as_json:   # the file, or the summary's lines
                metrics = Metrics(engine, name, keep_steps=metrics_file is not None)
            if not as_json:
                out.write(render.header(workload, name) + "\n")
                out.write(style.dim(f"{'':>{render.STEP_WIDTH}}  {members_line(group, started)}") + "\n")
            ran.append(time.monotonic())              # the run's steps begin: start-up is over
            for trace, wall_s in timed(engine.run()):
                num_steps += 1
                if metrics is not None:
                    metrics.step(trace, wall_s)
                rtt = group.last_record.rtt if group.last_record is not None else {}
                extra = (f" · rtt {1000 * sorted(rtt.values())[len(rtt) // 2]:.2f} ms" if rtt else "")
                if as_json:
                    engine.take_recoveries()      # not shown with --json: not kept either
                    out.write(engine.json_line(trace) + "\n")
                    progress.update(trace.step, total - engine.num_unfinished, extra)
                    continue
                progress.clear()
                print_step(out, style, printer, engine, trace)
                progress.update(trace.step, total - engine.num_unfinished, extra)
            progress.clear()
            if not as_json:
                printer.flush()
                write_boundary(out, style, group.world_size, [], engine.take_recoveries())
                out.write(style.dim(f"{'':>{render.STEP_WIDTH}}  audit: all {group.world_size} shards "
                                    f"hold every slot the pool holds") + "\n")
    except (EngineError, OSError, zmq.ZMQError) as err:
        progress.clear()
        if not isinstance(err, EngineError):     # the machine said no: still the error object
            err = machine_failure(err, step=engine.step_id if engine is not None else None)
        status = EXIT_FAILED
        failure = err
        if as_json:
            out.write(json.dumps(err.to_json()) + "\n")
        else:
            printer.flush()
            if group is not None:
                print_failure(out, style, group, engine, err)
    except (KeyboardInterrupt, Terminated) as stop:   # every worker is stopped by now
        progress.clear()
        interrupted = stop
        if not as_json:
            printer.flush()
            if group is not None:                 # what crossed so far, then the summary: said
                write_boundary(out, style, group.world_size, group.take_attempts(),
                               engine.take_recoveries() if engine is not None else [])
    finally:
        ran.append(time.monotonic())
        progress.clear()
        escaping = sys.exc_info()[1] or interrupted   # an interrupt (or a bug) on its way out
        closing = _finish_outputs(log_stream, timeline_stream, timeline, args, metrics_file,
                                  lambda problem: metrics_document(problem, escaping), html.wire_log)
        closing = html.write(name, closing)
    _say_unfired(group, engine, ended_well=failure is None and interrupted is None)
    lost_log = group.wire_log.broken if group is not None and group.wire_log else None
    server.log_ok = lost_log is None and closing is None
    if lost_log is not None and closing is None:     # the run went on without its wire log
        closing = machine_failure(lost_log, _log_flag(args, html))
        closing.message += " (the run went on without the rest of its wire log)"
    output_failed = closing is not None and failure is None   # an output file, not the run
    if output_failed and closing.step is None and engine is not None and engine.step_id:
        closing.step = engine.step_id - 1                     # said after the run's last step
    if output_failed:
        status = EXIT_FAILED
    elif closing is not None:            # the run failed, and an output file too: say both
        render.write_error(closing, sys.stderr, render.Style.for_stream(sys.stderr))
    if interrupted is not None:
        if not as_json:
            print_end(out, style, engine, group, num_steps, metrics, ran)
        out.flush()
        raise interrupted              # main says so, and exits 130 (Ctrl-C) or 143 (SIGTERM)
    if as_json:
        if failure is None and engine is not None:     # a finished run's summary stands
            out.write(json.dumps({"summary": engine.summary()}) + "\n")
        if output_failed:
            out.flush()
            render.write_error(closing, sys.stderr, render.Style.for_stream(sys.stderr))
        return status
    if output_failed:
        failure = closing
    print_end(out, style, engine, group, num_steps, metrics, ran)
    if status != EXIT_OK:
        out.flush()
        render.write_error(failure, sys.stderr, render.Style.for_stream(sys.stderr))
    return status


def time_line(engine, num_steps: int, ran: list[float]) -> str:
    """How long the steps took (start-up apart), and at overlap how much of the scheduler's own
    work ran while a plan was in flight, hidden behind the ranks' time."""
    start, first, end = ran
    took = end - first
    rate = f" ({num_steps / took:,.0f} steps a second)" if took > 0 and num_steps else ""
    line = f"{num_steps:,} steps in {took:.2f} s{rate}, after {first - start:.2f} s of start-up"
    if engine.rung.overlap and engine.scheduler_s > 0:
        line += (f"; {100 * engine.hidden_s / engine.scheduler_s:.0f}% of the scheduler's work ran "
                 f"while a plan was in flight")
    return line


def print_step(out, style, printer, engine, trace) -> None:
    """A committed step: its line, and unless nothing happened, each attempt's wire line and
    what was done about each failure (a failure found by the audit before it comes first)."""
    group = engine.group
    unshown = engine.recoveries_unshown
    attempts, recoveries = group.take_attempts(), engine.take_recoveries()
    if unshown:
        printer.flush()
        out.write(style.dim(f"{'':>{render.STEP_WIDTH}}  ({unshown} earlier recoveries of this step not "
                            f"shown: the last {len(recoveries)} follow)") + "\n")
    audited = [r for r in recoveries if r.in_audit]     # the audit before this step
    recoveries = [r for r in recoveries if not r.in_audit]
    if audited:
        printer.flush()
        write_boundary(out, style, group.world_size, [], audited)
    quiet = trace.is_empty and len(attempts) == 1 and not attempts[0].notes and not recoveries
    printer.step(trace)
    if not quiet:
        write_boundary(out, style, group.world_size, attempts, recoveries, trace.step)


def print_failure(out, style, group, engine, err) -> None:
    """The step that failed (its number, its wire lines, then the diagnosis)."""
    attempts = group.take_attempts()
    unshown = engine.recoveries_unshown if engine is not None else 0
    recoveries = engine.take_recoveries() if engine is not None else []
    if unshown:
        out.write(style.dim(f"{'':>{render.STEP_WIDTH}}  ({unshown} earlier recoveries of this step not "
                            f"shown: the last {len(recoveries)} follow)") + "\n")
    failed_here = err.step is not None and any(a.step == err.step for a in attempts)
    if failed_here:
        head, why = render.failed_step_lines(err, style)
        out.write(head + "\n")
    write_boundary(out, style, group.world_size, attempts, recoveries, err.step)
    if failed_here:
        out.write(why + "\n")


def print_end(out, style, engine, group, num_steps: int, metrics, ran: list[float]) -> None:
    """The requests, the run's totals and time, and each rank's."""
    if engine is not None:
        out.write(render.request_table(engine.summary(), style) + "\n")
        out.write(render.closing_line(num_steps, engine.summary()) + "\n")
        for line in metrics.summary_lines() if metrics is not None else ():
            out.write(line + "\n")
        if len(ran) == 3:
            out.write(time_line(engine, num_steps, ran) + "\n")
    if group is not None:
        out.write(render.rank_table(group.totals, group.rank_pids, style, group.member_hosts()) + "\n")
        run_seconds = ran[2] - ran[1] if len(ran) == 3 else None
        for line in render.arrivals_lines(group.recorder.arrivals, run_seconds, style):
            out.write(line + "\n")
        out.write(workers_line(group) + "\n")


def _say_unfired(group, engine=None, ended_well: bool = False) -> None:
    """A fault that never fired is named (stderr: --json stays clean; the exit status is the
    run's): a typo'd step must not pass for a run that survived it. So is one that fired with
    nothing seen of it (`ended_well`: the run ended with no failure and no interrupt)."""
    if group is None:
        return
    if ended_well and engine is not None:
        _say_unseen(group, engine)
    if not group.unfired:
        return
    last = group.last_planned
    reached = "no plan was sent" if last is None else f"the last plan was for step {last}"
    for fault in group.unfired:
        sys.stderr.write(f"inferris-dist: fault {render.shown(fault.text)} never fired "
                         f"(no plan reached step {fault.step}; {reached})\n")


# faults.md: the run is unaffected by these, by design
TOLERATED = frozenset({"delay", "duplicate", "stale"}) | TIME_KINDS


def _say_unseen(group, engine) -> None:
    """A one-shot rank fault a worker said it acted out (FIRED), of a kind a check should catch,
    in a run that recovered from nothing and ended without a failure: nothing saw its effect."""
    if engine.num_restarts:
        return                    # a recovery: which fault it answered is not ours to guess
    oneshots = group.channel.oneshots
    said = set().union(*oneshots.fired.values()) if oneshots is not None else set()
    for fault in group.faults:
        if fault.repeat or fault.on_link or fault.kind in TOLERATED or fault.text not in said:
            continue
        why = ""
        if fault.kind == "drop-write" and engine.audit_every != 1:
            when = f"every {engine.audit_every} steps and at the end" if engine.audit_every else "at the end"
            why = (f" (if it dropped a write, the page was freed before the audit, {when}, could see it; "
                   f"--audit-every 1 checks every step)")
        sys.stderr.write(f"inferris-dist: fault {render.shown(fault.text)} fired; no check saw its "
                         f"effect{why}\n")


def announce(args, workload, address: str, ranks: list[int], timeout: float, rejoin: bool) -> None:
    """The one line saying where we listen and how to start the ranks (stderr: --json stays clean)."""
    n = workload.config.world_size
    keys = f" --keys {Path(args.keys).resolve()}" if args.keys else ""
    rank_flag = f"--rank {ranks[0]}" if len(ranks) == 1 else "--rank R"
    if rejoin:
        who = f"a replacement for rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
    else:
        who = f"{n} rank{'s' * (n > 1)}"
    how = f"CURVE, keys in {args.keys}" if args.keys else "plaintext, loopback only"
    sys.stderr.write(f"inferris-dist: listening at {address} ({how}); waiting up to {timeout:g} s "
                     f"for {who}: inferris-dist worker --connect {address}{keys} {rank_flag} "
                     f"--world-size {n}\n")
    sys.stderr.flush()


def members_line(group, started: float) -> str:
    took = time.monotonic() - started
    if not group.external:
        pids = " ".join(str(w.pid) for w in group.workers.values())
        return f"{group.world_size} rank workers up in {took:.2f} s at {group.address}, pids {pids}"
    who = ", ".join(f"{r}: pid {pid} at {host}" for r, pid, host in group.joined())
    how = "CURVE-authenticated" if group.curve else "plaintext"
    return f"{group.world_size} ranks joined in {took:.2f} s at {group.address} ({how}): {who}"


def workers_line(group) -> str:
    away = group.turned_away_summary()
    return _workers_line(group) + (f"\nturned away: {away}" if away else "")


def _workers_line(group) -> str:
    if group.external:
        n = sum(len(p) for p in group.rank_pids.values())
        return f"workers: {n} joined from outside (we started none), every member told to stop"
    left = group.still_running()
    return (f"workers: {len(group.pids_started)} started, "
            f"{'none left running' if not left else 'STILL RUNNING: ' + ' '.join(map(str, left))}")


def _log_flag(args, html) -> str:
    """How to name the wire log in a message: the flag and file, or the page's own log."""
    if args.wire_log is not None:
        return f"--wire-log {args.wire_log}"
    if getattr(args, "html", None) is None:
        return f"--serve's wire log {html.wire_log}"
    return f"--html's wire log {html.wire_log}"


def _finish_outputs(log_stream, timeline_stream, timeline, args, metrics_file=None,
                    metrics_document=None, wire_log_path: str | None = None) -> EngineError | None:
    """Close the wire log, write the timeline, then the --metrics document
    (`metrics_document(problem)` makes it, told what failed here so far); a failure names
    the file (never a traceback)."""
    problem = None
    for stream, flag, path in ((log_stream, "--wire-log", wire_log_path or args.wire_log),
                               (timeline_stream, "--timeline", args.timeline)):
        if stream is None:
            continue
        try:
            if stream is timeline_stream:
                timeline.write(stream)
            stream.close()
        except OSError as e:
            problem = problem or machine_failure(e, f"{flag} {path}")
            try:
                stream.close()
            except OSError:
                pass
    if metrics_file is not None:
        from inferris_dist.observe.metrics import MetricsNotWritten
        try:
            metrics_file.write(metrics_document(problem))
        except MetricsNotWritten as e:
            problem = problem or e
    return problem


class HtmlPage:
    """`launch --html FILE`: the page built from the run's wire log when the run is over (also
    one that failed). Without `--wire-log` the log goes to a private run directory of its own
    (locked while the run lives, removed after; a run killed outright leaves it to the next
    run's sweep, as a group's run directory). The page's file is opened at the start, so a path
    that cannot be written is bad input before any worker starts."""

    def __init__(self, path: str | None, wire_log: str | None):
        self.path = path
        self.wire_log = wire_log
        self._temp: str | None = None
        self._dir = None
        if path is None:
            return
        _open_for_writing(path, "--html").close()
        if wire_log is None:
            from inferris_dist.launcher.rundir import make_run_dir
            self._dir = make_run_dir()
            self._temp = self.wire_log = str(self._dir / "wire.jsonl")

    def write(self, title: str, problem: EngineError | None) -> EngineError | None:
        """Build the page (after the wire log is closed); a failure names the flag and file."""
        if self.path is None:
            return problem
        try:
            if problem is None or self._temp is None or os.path.getsize(self._temp):
                from inferris_dist.page import write_page
                write_page(self.wire_log, self.path, title)
        except OSError as e:
            problem = problem or machine_failure(e, f"--html {self.path}")
        except WorkloadError as e:       # the log it is built from cannot be read back
            problem = problem or MachineFailure(f"--html {self.path}: {e}", None)
        finally:
            self.discard()
        return problem

    def discard(self) -> None:
        if self._dir is not None:
            from inferris_dist.launcher.rundir import remove_run_dir
            remove_run_dir(self._dir)
            self._dir = self._temp = None


def _open_for_writing(path: str | None, flag: str, opened: ExitStack | None = None):
    """`path` opened for writing (closed by `opened` if the run does not start), or bad input."""
    if path is None:
        return None
    try:
        stream = open(path, "w")
    except OSError as e:
        raise WorkloadError(f"{flag} {path}: {e.strerror or e}") from None
    if opened is not None:
        opened.callback(stream.close)
    return stream


def write_boundary(out, style, world_size: int, attempts, recoveries, step: int | None = None) -> None:
    """Each attempt's wire line, and after each failed one what was done about it. An attempt
    at another step than the line's (overlap: the plan sent ahead) names its step."""
    recoveries = list(recoveries)
    for record in attempts:
        out.write(render.boundary_line(record, record.world_size or world_size, style,
                                       shown_step=record.step if step is not None and record.step != step
                                       else None) + "\n")
        for line in render.note_lines(record, style):
            out.write(line + "\n")
        failed = record.verdict not in ("joined", "") and not record.verdict.startswith("void")
        if failed and recoveries:
            out.write(render.recovery_lines(recoveries.pop(0), style) + "\n")
    for recovery in recoveries:
        out.write(render.recovery_lines(recovery, style) + "\n")


def distributed_lines(workload, options: LaunchOptions) -> list[dict]:
    """The run on processes as trace lines; a fault that never fired is named on stderr."""
    try:
        with launch(workload, options=options) as engine:
            lines = trace_dicts(engine)
        _say_unfired(engine.group)
        return lines
    except EngineError as e:        # the workers did not start
        return [e.to_json()]


def run_compare(workload, name: str, args, made: dict | None = None) -> int:
    """The workload in process and on processes (with the launch's faults and policy), judged
    by what the policy promises: the same trace (no policy needed, abort, restore) or, under
    recompute, the same summary (its recovery replans: the steps may differ, the tokens
    every request generates and how it finishes may not). When a side failed: which, how, where."""
    options = LaunchOptions(step_timeout=args.step_timeout, faults=args.fault,
                            audit_every=args.audit_every, on_rank_loss=args.on_rank_loss,
                            max_restarts=args.max_restarts, rung=args.rung, exec_cost=args.exec_cost,
                            worker=args.worker, min_world_size=args.min_world_size, regrow=args.regrow,
                            **(made or {}))
    options.check()
    remote = distributed_lines(workload, options)     # first: its workers were forked ahead
    local = trace_dicts(Engine(workload, rung=args.rung))
    from inferris_dist.judge.promise import judge, verdict_text  # compare's own: launch has no use for it
    verdict = judge(local, remote, args.on_rank_loss)
    n = workload.config.world_size
    verdict = {"workload": name, "world_size": n, "rung": args.rung, "policy": args.on_rank_loss,
               "faults": list(workload.faults) + list(args.fault), **verdict}
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(verdict) + "\n")
    else:
        sys.stdout.write(verdict_text(verdict) + "\n")
    return EXIT_OK if verdict["holds"] else EXIT_FAILED

