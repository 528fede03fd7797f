"""The `inferris-dist` command line.

Exit status: 0 done, 1 the engine or a rank failed (diagnosis printed),
2 bad input (one line on stderr), 130 interrupted, 143 terminated. No
traceback reaches a user.
"""
from __future__ import annotations

import os
import signal
import sys

from inferris_dist.cli.args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Commands,
    Parser,
    Terminated,
    UsageError,
)
from inferris_dist.engine.errors import WorkloadError

# A command is a module of its own, cli/cmd_NAME.py: `add_arguments(parser)` adds its flags (the
# shared ones from cli/flags.py), `main(args)` runs it and returns the exit status. The module is
# imported only when its command is the one used: saying the version or the commands costs an
# interpreter and argparse, not the engine. Adding a command: its module, and its line here.
# name: its line in `inferris-dist --help`, in --help's order
COMMANDS = {
    "run": "run a workload in one process",
    "demo": "run the built-in three-request demo in one process",
    "inspect": "read a --wire-log: a line per step, or one step's plan, each rank's result and the join",
    "check": "judge a --wire-log afterwards: every committed step joined from its epoch's results and "
             "following from its plan; the policy's promise",
    "whatif": "replay a --wire-log with one rank as fast as the others: what its requests would cost",
    "html": "write a --wire-log as one self-contained page: lanes for the scheduler, every rank and "
            "request; click a step for its plan and results",
    "serve": "follow a wire log as it is written (tail -f) and serve the live page, /metrics, /health "
             "and /status until Ctrl-C",
    "ladder": "run a workload at every rung of the mechanism ladder; one table of what each mechanism "
              "buys",
    "mechs": "the mechanisms (twelve, and two beyond the original), where they live; `mechs NAME` "
             "prints one's note",
    "launch": "run a workload with its ranks on real worker processes",
    "compare": "run in process and on worker processes; check the policy's promise (the same trace; "
               "under recompute, the same summary)",
    "chaos": "explore fault schedules drawn from a seed on real processes; each run judged by its "
             "policy's promise, a break shrunk to a reproducer",
    "worker": "a rank worker, for a scheduler started with `launch --listen` (`inferris-dist worker "
              "--help` for its flags)",
    "conform": "try a rank worker, ours or any command's, against the wire's promises (docs/protocol.md)",
    "keys": "write CURVE keys for a run across hosts: the scheduler's and one per rank",
    "ft": "the operator of a paused run (launch --on-rank-loss pause --serve): its status, or an "
          "instruction (retry, scale-down, scale-up, abort)",
}
SPAWN_WORKERS = ("launch", "compare")   # make their worker template as they start (launcher.early)
UNPARSED = ("worker",)                  # handed the rest of the command line as it is (cmd_worker)


def command(name: str):
    """The module of a command: its flags and its run."""
    from importlib import import_module
    return import_module(f"inferris_dist.cli.cmd_{name}")


def build_parser() -> Parser:
    """The whole command line; a command's own flags are added only when it is the one used
    (`--version` and `--help` build none of them, and import nothing they need)."""
    from inferris_dist import __version__
    p = Parser(prog="inferris-dist", description="See, test and break the executor boundary "
               "of an LLM serving engine.")
    p.add_argument("--version", action="version", version=f"inferris-dist {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser, action=Commands)
    sub.required = True
    for name, help_line in COMMANDS.items():
        sub.add_command(name, help_line, lambda parser, name=name: command(name).add_arguments(parser))
    return p


def worker_template(argv: list[str]):
    """The run directory and worker template of a command that spawns workers (launcher.early),
    made as it starts, before its flags are parsed, its workload read and the control plane
    imported; gone when the command ends. None for a command that spawns none (every other
    command, --listen, and --worker: the ranks are not ours to fork)."""
    if argv[:1] not in ([name] for name in SPAWN_WORKERS) or any(
            a in ("--listen", "--worker") or a.startswith(("--listen=", "--worker=")) for a in argv):
        return None
    from inferris_dist.launcher.early import WorkerTemplate
    from inferris_dist.protocol.limits import usable_cores
    return WorkerTemplate.begin(usable_cores())


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
    if argv[:1] and argv[0] in UNPARSED:
        return command(argv[0]).main(argv[1:])
    signal.signal(signal.SIGTERM, _on_sigterm)
    argv = _attach_dashed_values(argv)
    early = None
    try:
        early = worker_template(argv)
        args = build_parser().parse_args(argv)
        args.early = early
        from inferris_dist.cli.paths import check_paths
        check_paths(args)                    # no output on an input or another output
        status = command(args.command).main(args)
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
