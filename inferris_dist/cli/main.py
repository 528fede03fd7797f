"""The `inferris-dist` command line.

Exit status: 0 done, 1 the engine or a rank failed (diagnosis printed),
2 bad input (one line on stderr), 130 interrupted, 143 terminated. No
traceback reaches a user.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys

from inferris_dist.cli.args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    MAX_SECONDS,
    Commands,
    Parser,
    Terminated,
    UsageError,
    int_arg,
    seconds_arg,
)
from inferris_dist.engine.errors import WorkloadError

TYPE_CHECKING = False      # typing.TYPE_CHECKING, without loading typing at every start

if TYPE_CHECKING:
    from inferris_dist.observe.metrics import Metrics, MetricsFile


# The modules a command needs are imported where it is built or run: saying the version or the
# commands costs an interpreter and argparse, not the engine.

def add_workload_flags(p: argparse.ArgumentParser) -> None:
    from inferris_dist.cli.workload_source import REQUEST_FORMAT
    g = p.add_argument_group("workload (default: the built-in demo)")
    g.add_argument("--spec", metavar="FILE", help="workload JSON file, or - for stdin")
    g.add_argument("--request", action="append", metavar=REQUEST_FORMAT,
                   help="add a request (repeatable; exclusive with --spec)")
    for knob in ("max-step-tokens", "page-size", "num-pages", "spec-len", "world-size"):
        g.add_argument(f"--{knob}", type=int_arg, metavar="N",
                       help="override the workload's engine value")


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="SPEC §4 JSON lines")
    p.add_argument("--verbose", action="store_true",
                   help="name every request on a step's line (default: big batches are summarised "
                        "to fit the terminal)")


def add_rung_flag(p: argparse.ArgumentParser) -> None:
    from inferris_dist.engine.rungs import NAMES as RUNG_NAMES
    p.add_argument("--rung", choices=RUNG_NAMES, default="full", metavar="RUNG",
                   help=f"the engine as it stands at this rung of the mechanism ladder "
                        f"({', '.join(RUNG_NAMES)}; default full)")


def knobs_of(args) -> dict:
    return {k: getattr(args, k) for k in
            ("max_step_tokens", "page_size", "num_pages", "spec_len", "world_size")}


def add_fault_flags(p) -> None:
    """How the run on processes is broken and what follows: launch's and compare's."""
    from inferris_dist.protocol.faults import POLICIES
    from inferris_dist.protocol.limits import NO_EXEC_COST, exec_cost_arg
    p.add_argument("--step-timeout", type=seconds_arg, default=10.0, metavar="SECONDS",
                   help="a rank that has not answered by then is lost (default 10)")
    p.add_argument("--exec-cost", type=exec_cost_arg, default=NO_EXEC_COST, metavar="COST",
                   help="each rank takes this long to execute a step, as a model on a GPU would "
                        "(it waits, without spinning): 1ms, 500us, 1ms+2us/token (default 0)")
    p.add_argument("--fault", action="append", default=[], metavar="RANK:KIND@STEP[+][:ARG]",
                   help="inject a fault (repeatable), e.g. 1:crash@3, all:delay@2+:0.5")
    p.add_argument("--audit-every", type=int, default=0, metavar="K",
                   help="audit every rank's shard every K steps (always at the end)")
    p.add_argument("--on-rank-loss", choices=POLICIES, default="abort",
                   help="when a step fails on the ranks: stop (abort), restart the rank from the "
                        "pool's pages (restore), or restart it empty and recompute (default abort)")
    p.add_argument("--max-restarts", type=int, default=3, metavar="N",
                   help="restarts allowed in one run before giving up (default 3)")


def add_metrics_flag(p) -> None:
    p.add_argument("--metrics", metavar="FILE",
                   help="write the run's numbers as one JSON document: counters per step, "
                        "each request's steps to first token and to finish, prefix hit rate, "
                        "acceptance, batch sizes (launch: also wall time per step, rtt per rank)")


def add_launch_flags(p) -> None:
    """launch's own flags (the module that runs it is imported only when it runs)."""
    add_fault_flags(p)
    add_metrics_flag(p)
    p.add_argument("--html", metavar="FILE",
                   help="write one self-contained page of the run (opens offline in any browser): "
                        "lanes for the scheduler, every rank and request, each step's plan and "
                        "results, losses and restarts; also `inferris-dist html WIRELOG -o FILE`")
    p.add_argument("--timeline", metavar="FILE",
                   help="write a Chrome trace (open it at ui.perfetto.dev, online; offline, use "
                        "--html): scheduler phases, each rank's round trips and what it did inside them")
    h = p.add_argument_group("ranks on other hosts (the scheduler spawns nothing)")
    h.add_argument("--listen", metavar="tcp://ADDR:PORT",
                   help="bind here and wait for `inferris-dist worker` ranks started by others "
                        "(port 0: any free port)")
    h.add_argument("--keys", metavar="DIR",
                   help="CURVE keys from `inferris-dist keys`: every message encrypted, every rank "
                        "proven by its own key (required unless --listen is on loopback)")
    h.add_argument("--join-timeout", type=seconds_arg, default=60.0, metavar="SECONDS",
                   help="how long to wait for all ranks to join (default 60)")
    h.add_argument("--rejoin-timeout", type=seconds_arg, default=30.0, metavar="SECONDS",
                   help="with restore or recompute: how long to wait for a lost rank's "
                        "replacement to join (default 30)")


def linger_arg(text: str) -> float:
    """--serve-linger: seconds >= 0 (0: the server stops as the run ends)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(f"want a number of seconds >= 0 and <= {MAX_SECONDS:g}, "
                                         f"got {text!r}")
    return value


def add_serve_flags(p) -> None:
    """launch's --serve and --serve-linger."""
    g = p.add_argument_group("watching the run live")
    g.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve the live page, /metrics (Prometheus), /health and /status while the run "
                        "runs (HOST default 127.0.0.1; PORT 0: any free one; the URL goes to stderr)")
    g.add_argument("--serve-linger", type=linger_arg, default=0.0, metavar="SECONDS",
                   help="keep serving this long after the run ends (default 0: stop once the open "
                        "pages were told the end)")


def build_parser() -> Parser:
    """The whole command line; a command's own flags are added only when it is the one used
    (`--version` and `--help` build none of them, and import nothing they need)."""
    from inferris_dist import __version__
    p = Parser(prog="inferris-dist", description="See, test and break the executor boundary "
               "of an LLM serving engine.")
    p.add_argument("--version", action="version", version=f"inferris-dist {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser, action=Commands)
    sub.required = True
    for name, (help_line, build, _) in COMMANDS.items():
        sub.add_command(name, help_line, build)
    return p


def build_run(run) -> None:
    from inferris_dist.cli.workload_source import WORKLOAD_HELP
    described(run, epilog=WORKLOAD_HELP)
    add_workload_flags(run)
    add_rung_flag(run)
    add_output_flags(run)
    add_metrics_flag(run)


def build_demo(demo) -> None:
    demo.add_argument("--json", action="store_true", help="SPEC §4 JSON lines")


def build_inspect(ins) -> None:
    from inferris_dist.cli.cmd_inspect import JSON_HELP
    described(ins, epilog=JSON_HELP)
    ins.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    ins.add_argument("--step", type=int_arg, metavar="K", help="show step K in full")
    ins.add_argument("--json", action="store_true", help="one JSON object per line (shapes below)")


def build_check(chk) -> None:
    from inferris_dist.cli.cmd_check import JSON_HELP
    described(chk, epilog=JSON_HELP)
    chk.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    chk.add_argument("--spec", metavar="FILE", help="the run's workload (or - for stdin), for a log that "
                     "does not record it whole; refused unless it is the run's")
    chk.add_argument("--json", action="store_true", help="one JSON object (its shape below)")


def build_html(htm) -> None:
    htm.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    htm.add_argument("-o", "--output", required=True, metavar="FILE", help="the page to write")
    htm.add_argument("--title", help="the page's title (default: the run's name)")


def build_serve(srv) -> None:
    srv.add_argument("wirelog", metavar="WIRELOG", help="a wire log being written (launch --wire-log, "
                     "the library's wire_log=), or one already written")
    srv.add_argument("--address", default="127.0.0.1:0", metavar="[HOST:]PORT",
                     help="where to serve (default 127.0.0.1:0: loopback, any free port; the URL goes "
                          "to stderr)")
    srv.add_argument("--serve-linger", type=linger_arg, default=None, metavar="SECONDS",
                     help="stop this long after the run's end record (default: keep serving until Ctrl-C)")
    srv.add_argument("--title", help="the page's title (default: the run's name)")
    srv.add_argument("--fd", type=int, help=argparse.SUPPRESS)        # launch --serve: its bound socket
    srv.add_argument("--parent", type=int, help=argparse.SUPPRESS)    # launch --serve: die with it


def build_ladder(lad) -> None:
    add_workload_flags(lad)
    lad.add_argument("--json", action="store_true", help="one JSON object per rung")


def build_mechs(me) -> None:
    me.add_argument("name", nargs="?", metavar="NAME", help="a mechanism: number, slug or name")


def build_launch(la) -> None:
    from inferris_dist.cli.workload_source import WORKLOAD_HELP
    described(la, epilog=WORKLOAD_HELP)
    add_workload_flags(la)
    add_rung_flag(la)
    add_output_flags(la)
    la.add_argument("--wire-log", metavar="FILE", help="write every message that crossed as JSON lines")
    add_launch_flags(la)
    add_serve_flags(la)


def build_compare(co) -> None:
    add_workload_flags(co)
    add_rung_flag(co)
    add_fault_flags(co)
    co.add_argument("--json", action="store_true",
                    help="one JSON object: what was compared, the verdict, the first difference")


def build_chaos(p) -> None:
    from inferris_dist.cli.cmd_chaos import build_chaos_parser
    build_chaos_parser(p)


def build_worker(wo) -> None:
    wo.add_argument("worker_args", nargs="*", help="--connect tcp://HOST:PORT --keys DIR [--rank R] "
                    "[--world-size N]")


def build_keys(ke) -> None:
    ke.add_argument("dir", metavar="DIR", help="directory to write scheduler.key[_secret] and "
                    "rank-R.key[_secret] into")
    ke.add_argument("--world-size", type=int_arg, required=True, metavar="N")
    ke.add_argument("--force", action="store_true", help="replace keys already there")


def described(p, epilog: str) -> None:
    """A command whose help ends with a text laid out by hand (the workload's keys, --json's shapes)."""
    p.epilog = epilog
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def cmd_run(args) -> int:
    from inferris_dist.cli.workload_source import workload_from_flags
    workload, name = workload_from_flags(args.spec, args.request, knobs_of(args))
    return run_in_process(workload, name, args.json, args.rung, args.verbose, args.metrics)


def cmd_demo(args) -> int:
    from inferris_dist.cli.workload_source import workload_from_flags
    workload, name = workload_from_flags(None, None, {})
    return run_in_process(workload, name, args.json)


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


def cmd_mechs(args) -> int:
    from inferris_dist.cli.mechanisms import MECHANISMS
    from inferris_dist.cli.mechanisms import find as find_mechanism
    if args.name is not None:
        m = find_mechanism(args.name)
        if m is None:
            raise UsageError(f"inferris-dist mechs: no mechanism {args.name!r}; one of "
                             f"{', '.join(x.slug for x in MECHANISMS)}")
        try:
            sys.stdout.write(m.note.read_text())
        except OSError as e:
            raise UsageError(f"inferris-dist mechs: cannot read the note {m.note}: "
                             f"{e.strerror or e}") from None
        return EXIT_OK
    rows = [("#", "mechanism", "key question", "rung", "module", "tests")] + [
        (m.number, m.name + (" *" if m.beyond else ""), m.question, m.rung, m.module, m.tests)
        for m in MECHANISMS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
    sys.stdout.write("* beyond the original design: the original ladder ends at 12\n")
    sys.stdout.write("inferris-dist mechs NAME prints a mechanism's note (docs/mechanisms/)\n")
    return EXIT_OK


def cmd_launch(args) -> int:
    import time

    from inferris_dist.cli.workload_source import workload_from_flags
    started = time.monotonic()               # the run's start-up counts from here
    workload, name = workload_from_flags(args.spec, args.request, knobs_of(args))
    made = made_for(args, workload)          # the workers forked ahead, while we import
    from inferris_dist.cli import cmd_launch as launching  # the executor on processes: when used
    return launching.run_launch(workload, name, args, made, started)


AHEAD_PER_CORE = 4    # workers forked ahead at most, per core: more only compete with the
                      # scheduler's imports for the cores (a bigger run forks its own when it starts)


def max_ahead() -> int:
    from inferris_dist.protocol.limits import usable_cores
    return AHEAD_PER_CORE * usable_cores()


class WorkerTemplate:
    """The run directory and the template a launch's (or compare's) workers fork from, made as
    the command starts, before its flags are parsed, its workload read and the control plane
    imported: the command forks itself into the template (one thread, no ZeroMQ yet: nothing
    to inherit but its own code), whose imports run meanwhile, on a core of their own where
    there is one. Once the workload is read, the template forks the run's workers ahead, with
    the run secret made here, while the control plane is imported: they connect to the run's
    socket and wait for the scheduler to bind it (the group's first start takes them; any it
    does not ask for are killed). Gone when the command ends. None for a command that spawns
    no workers (every other command, and --listen); no template when one cannot be made (each
    worker then starts afresh)."""

    def __init__(self, run_dir, template, secret: bytes):
        self.run_dir, self.template, self.secret = run_dir, template, secret

    @classmethod
    def for_argv(cls, argv: list[str]) -> WorkerTemplate | None:
        if argv[:1] not in (["launch"], ["compare"]) or any(
                a == "--listen" or a.startswith("--listen=") for a in argv):
            return None
        from inferris_dist.launcher.rundir import make_run_dir, remove_run_dir
        from inferris_dist.launcher.template import WORKER_MODULE, fork_template
        run_dir = make_run_dir()             # the run's: the group's workers log in it too
        secret = os.urandom(32)
        pid = sock = template = None
        try:
            if _forkable():
                try:
                    pid, sock = fork_template(WORKER_MODULE, str(run_dir / "template.log"))
                except OSError:
                    pass
            from inferris_dist.launcher.process import Template
            if sock is not None:
                template = Template.of_fork(pid, sock, run_dir)
                return cls(run_dir, template, secret)
            template = Template(log_dir=run_dir)        # a fresh interpreter, then
            try:
                template.begin()
            except OSError:
                template.close()
                template = None
            return cls(run_dir, template, secret)
        except BaseException:       # interrupted before the command holds what it made: undone
            if template is not None:
                template.close()
            elif pid is not None:
                sock.close()                              # the template sees its end and goes
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            remove_run_dir(run_dir)
            raise

    def fork_ahead(self, world_size: int) -> None:
        """Ask the template for the run's first workers now, as the group's first start will
        ask for them (the same arguments), as many as the cores can start while the control
        plane is imported (max_ahead)."""
        if self.template is None or not 1 <= world_size <= max_ahead():
            return
        try:
            self.template.fork_ahead_for(self.run_dir, world_size, self.secret)
        except OSError:
            pass                             # the group asks again, the usual way, and says why

    def options(self, step_timeout: float) -> dict:
        """As LaunchOptions fields; a fork not answered within the step timeout gives it up."""
        if self.template is not None:
            self.template.answer_timeout = min(self.template.start_timeout, step_timeout)
        return {"template": self.template, "run_dir": self.run_dir, "secret": self.secret}

    def close(self) -> None:
        from inferris_dist.launcher import remove_run_dir
        if self.template is not None:
            self.template.close()
        remove_run_dir(self.run_dir)


def _forkable() -> bool:
    """May this process fork itself into a template: one thread, and no ZeroMQ loaded (no
    context, no I/O thread). The command line as it starts; not a library caller's process,
    which may hold threads (and their locks) a fork would copy stopped."""
    threading = sys.modules.get("threading")
    return "zmq" not in sys.modules and (threading is None or threading.active_count() == 1)


def made_for(args, workload) -> dict:
    """What launch and compare hand the group: the template forked as the command started,
    asked now for the workload's workers, forked while the control plane is imported (both
    start their run on processes as soon as it is)."""
    early = getattr(args, "early", None)
    if early is None:
        return {}
    early.fork_ahead(workload.config.world_size)
    return early.options(args.step_timeout)


def cmd_keys(args) -> int:
    if not 1 <= args.world_size <= 4096:
        raise UsageError(f"inferris-dist keys: --world-size {args.world_size} is outside 1..4096")
    from inferris_dist.protocol.keys import write_keys
    files = write_keys(args.dir, args.world_size, args.force)
    sys.stdout.write(f"wrote {len(files)} key files into {args.dir}: scheduler.key, "
                     f"rank-0.key .. rank-{args.world_size - 1}.key and their *.key_secret (mode 0600)\n"
                     f"the scheduler needs scheduler.key_secret and every rank-R.key; rank R needs "
                     f"scheduler.key and rank-R.key_secret\n")
    return EXIT_OK


def cmd_ladder(args) -> int:
    from inferris_dist.cli.cmd_ladder import run_ladder
    from inferris_dist.cli.workload_source import LADDER_DEMO, workload_from_flags
    workload, name = workload_from_flags(args.spec, args.request, knobs_of(args),
                                         default=LADDER_DEMO, default_name="ladder demo")
    return run_ladder(workload, name, args.json)


def cmd_inspect(args) -> int:
    from inferris_dist.cli import render
    from inferris_dist.cli.cmd_inspect import run_inspect
    return run_inspect(args.wirelog, args.step, sys.stdout, render.Style.for_stream(sys.stdout), args.json)


def cmd_check(args) -> int:
    from inferris_dist.cli.cmd_check import run_check
    return run_check(args.wirelog, args.spec, sys.stdout, args.json)


def cmd_html(args) -> int:
    from inferris_dist.page import write_page
    write_page(args.wirelog, args.output, args.title)
    return EXIT_OK


def cmd_serve(args) -> int:
    from inferris_dist.cli.cmd_serve import run_serve
    return run_serve(args)


def cmd_chaos(args) -> int:
    from inferris_dist.cli.cmd_chaos import run_chaos
    return run_chaos(args)


def cmd_compare(args) -> int:
    from inferris_dist.cli.workload_source import workload_from_flags
    workload, name = workload_from_flags(args.spec, args.request, knobs_of(args))
    made = made_for(args, workload)
    from inferris_dist.cli import cmd_launch as launching
    return launching.run_compare(workload, name, args, made)


# name: (its line in `inferris-dist --help`, what adds its flags, what runs it), in --help's order
COMMANDS = {
    "run": ("run a workload in one process", build_run, cmd_run),
    "demo": ("run the built-in three-request demo in one process", build_demo, cmd_demo),
    "inspect": ("read a --wire-log: a line per step, or one step's plan, each rank's result and the join",
                build_inspect, cmd_inspect),
    "check": ("judge a --wire-log afterwards: every committed step joined from its epoch's results and "
              "following from its plan; the policy's promise", build_check, cmd_check),
    "html": ("write a --wire-log as one self-contained page: lanes for the scheduler, every rank and "
             "request; click a step for its plan and results", build_html, cmd_html),
    "serve": ("follow a wire log as it is written (tail -f) and serve the live page, /metrics, /health "
              "and /status until Ctrl-C", build_serve, cmd_serve),
    "ladder": ("run a workload at every rung of the mechanism ladder; one table of what each mechanism "
               "buys", build_ladder, cmd_ladder),
    "mechs": ("the mechanisms (twelve, and one beyond the original), where they live; `mechs NAME` "
              "prints one's note", build_mechs, cmd_mechs),
    "launch": ("run a workload with its ranks on real worker processes", build_launch, cmd_launch),
    "compare": ("run in process and on worker processes; check the policy's promise (the same trace; "
                "under recompute, the same summary)", build_compare, cmd_compare),
    "chaos": ("explore fault schedules drawn from a seed on real processes; each run judged by its "
              "policy's promise, a break shrunk to a reproducer", build_chaos, cmd_chaos),
    "worker": ("a rank worker, for a scheduler started with `launch --listen` (`inferris-dist worker "
               "--help` for its flags)", build_worker, None),
    "keys": ("write CURVE keys for a run across hosts: the scheduler's and one per rank", build_keys,
             cmd_keys),
}


def _attach_dashed_values(argv: list[str]) -> list[str]:
    """`--fault -1:crash@3` is a value, not an option: attach it (`--fault=-1:...`) so argparse
    hands it to the fault parser, which says what is wrong with it."""
    out = []
    it = iter(range(len(argv)))
    for i in it:
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] == "--fault" and value[:1] == "-" and value[1:2].isdigit():
            out.append(f"--fault={argv[i + 1]}")
            next(it, None)
        else:
            out.append(argv[i])
    return out


def shown(text: str) -> str:
    """A message made safe for a terminal (inferris_dist.words, imported when there is one to show)."""
    from inferris_dist.words import shown as safe
    return safe(text)


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        from inferris_dist.rank.cli import main as worker_main
        return worker_main(argv[1:])
    signal.signal(signal.SIGTERM, _on_sigterm)
    argv = _attach_dashed_values(argv)
    early = None
    try:
        early = WorkerTemplate.for_argv(argv)
        args = build_parser().parse_args(argv)
        args.early = early
        from inferris_dist.cli.paths import check_paths
        check_paths(args)                    # no output on an input or another output
        status = COMMANDS[args.command][2](args)
    except (UsageError, WorkloadError) as e:
        sys.stdout.flush()
        text = shown(str(e))
        sys.stderr.write(f"{text}\n" if isinstance(e, UsageError) else f"inferris-dist: {text}\n")
        status = EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("inferris-dist: interrupted\n")
        status = EXIT_INTERRUPTED
    except Terminated:
        sys.stderr.write("inferris-dist: terminated\n")
        status = EXIT_TERMINATED
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, without a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_OK
    except OSError as e:
        # the machine said no (no port to bind, no process to start): one line, not a traceback
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        sys.stderr.write(shown(f"inferris-dist: {where}{getattr(e, 'strerror', None) or e}") + "\n")
        status = EXIT_FAILED
    except Exception as e:  # a bug of ours: still one line, the traceback only on request
        zmq = sys.modules.get("zmq")
        if zmq is not None and isinstance(e, zmq.ZMQError):   # the machine said no, via ZeroMQ
            sys.stderr.write(shown(f"inferris-dist: {e}") + "\n")
        elif os.environ.get("INFERRIS_DEBUG"):
            raise
        else:
            sys.stderr.write(shown(f"inferris-dist: internal error: {type(e).__name__}: {e} "
                                          f"(INFERRIS_DEBUG=1 shows the traceback)") + "\n")
        status = EXIT_FAILED
    finally:
        if early is not None:
            early.close()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return status


def entry() -> None:
    """What the console script (cli/console.py) runs once this module is loaded: `main()`,
    then out as soon as its outputs are flushed and the exit
    handlers have run, without the interpreter freeing every object of the run one by one
    (about 20 ms after a 300-request run, paid by every command). Every file of ours is
    closed by then; a library caller of `main()` keeps the usual exit."""
    try:
        status = main()
    except SystemExit as e:                   # --help, --version
        if e.code is not None and not isinstance(e.code, int):
            raise
        status = e.code or 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):         # a reader gone (| head), or closed
            pass
    import atexit
    atexit._run_exitfuncs()
    os._exit(status)


if __name__ == "__main__":
    entry()
