"""The flags several commands share, each defined once: where the workload comes from, the
rung, the output, and how a run on processes is broken and recovered. A launch-like flag's
default is LaunchOptions' (scheduler/options.py), read from there, not written again. And
what launch and compare hand their run from the worker template made as they started.

A command's own module (cli/cmd_NAME.py) adds these to its parser; what a flag needs is
imported when its parser is built, not when the command line starts.
"""
from __future__ import annotations

import argparse
import math

from inferris_dist.cli.args import MAX_SECONDS, int_arg, seconds_arg

KNOBS = ("max-step-tokens", "page-size", "num-pages", "spec-len", "world-size")   # engine values


def launch_default(field: str):
    """The default of a LaunchOptions field: what a launch gets when the flag is not given."""
    from inferris_dist.scheduler.options import LaunchOptions
    return LaunchOptions._field_defaults[field]


def described(p, epilog: str) -> None:
    """A command whose help ends with a text laid out by hand (the workload's keys, --json's shapes)."""
    p.epilog = epilog
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def add_workload_flags(p, knobs=KNOBS, title: str = "workload (default: the built-in demo)"):
    """--spec, --request and the engine values a command line overrides; the group, for a
    command to add its own to."""
    from inferris_dist.cli.workload_source import REQUEST_FORMAT
    g = p.add_argument_group(title)
    g.add_argument("--spec", metavar="FILE", help="workload JSON file, or - for stdin")
    g.add_argument("--request", action="append", metavar=REQUEST_FORMAT,
                   help="add a request (repeatable; exclusive with --spec)")
    add_knob_flags(g, knobs)
    return g


def add_knob_flags(g, knobs=KNOBS) -> None:
    """An engine value of the workload's, overridden: --max-step-tokens N and the like."""
    for knob in knobs:
        g.add_argument(f"--{knob}", type=int_arg, metavar="N", help="override the workload's engine value")


def knobs_of(args, knobs=KNOBS) -> dict:
    """The engine values given on the command line (None: the workload's own)."""
    return {k.replace("-", "_"): getattr(args, k.replace("-", "_")) for k in knobs}


def workload_of(args, **default) -> tuple:
    """The workload the flags of add_workload_flags name, and its name (workload_source)."""
    from inferris_dist.cli.workload_source import workload_from_flags
    return workload_from_flags(args.spec, args.request, knobs_of(args), **default)


def add_output_flags(p) -> None:
    p.add_argument("--json", action="store_true", help="SPEC §4 JSON lines")
    p.add_argument("--verbose", action="store_true",
                   help="name every request on a step's line (default: big batches are summarised "
                        "to fit the terminal)")


def add_rung_flag(p) -> None:
    from inferris_dist.engine.rungs import NAMES as RUNG_NAMES
    p.add_argument("--rung", choices=RUNG_NAMES, default="full", metavar="RUNG",
                   help=f"the engine as it stands at this rung of the mechanism ladder "
                        f"({', '.join(RUNG_NAMES)}; default full)")


def add_metrics_flag(p) -> None:
    p.add_argument("--metrics", metavar="FILE",
                   help="write the run's numbers as one JSON document: counters per step, "
                        "each request's steps to first token and to finish, prefix hit rate, "
                        "acceptance, batch sizes (launch: also wall time per step, rtt per rank)")


def add_step_timeout(p, default: float | None = None, why: str = "", derived: str | None = None) -> None:
    """--step-timeout, LaunchOptions' default unless the command has its own (`why` says what
    it costs); `derived`: no default value, the command derives it as this says."""
    if derived is not None:
        p.add_argument("--step-timeout", type=seconds_arg, metavar="SECONDS",
                       help=f"a rank that has not answered by then is lost (default: {derived}{why})")
        return
    default = launch_default("step_timeout") if default is None else default
    p.add_argument("--step-timeout", type=seconds_arg, default=default, metavar="SECONDS",
                   help=f"a rank that has not answered by then is lost (default {default:g}{why})")


def add_max_restarts(p) -> None:
    default = launch_default("max_restarts")
    p.add_argument("--max-restarts", type=int_arg, default=default, metavar="N",
                   help=f"recoveries allowed in one run (default {default})")


def add_fault_flags(p) -> None:
    """How the run on processes is broken and what follows: launch's and compare's."""
    from inferris_dist.protocol.faults import POLICIES
    from inferris_dist.protocol.limits import exec_cost_arg
    add_step_timeout(p)
    cost = launch_default("exec_cost")
    p.add_argument("--exec-cost", type=exec_cost_arg, default=cost, metavar="COST",
                   help=f"each rank takes this long to execute a step, as a model on a GPU would "
                        f"(it waits, without spinning): 1ms, 500us, 1ms+2us/token (default {cost})")
    p.add_argument("--worker", metavar="'COMMAND'",
                   help="start each rank as COMMAND, any executor that speaks docs/protocol.md: "
                        "{connect}, {rank} and {world_size} are filled in, the run secret comes on "
                        "stdin (default: the project's own worker)")
    p.add_argument("--fault", action="append", default=[], metavar="RANK:KIND@STEP[+][:ARG]",
                   help="inject a fault (repeatable), e.g. 1:crash@3, all:delay@2+:0.5")
    p.add_argument("--audit-every", type=int, default=launch_default("audit_every"), metavar="K",
                   help="audit every rank's shard every K steps (always at the end)")
    policy = launch_default("on_rank_loss")
    p.add_argument("--on-rank-loss", choices=POLICIES, default=policy,
                   help=f"when a step fails on the ranks: stop (abort), restart the rank from the "
                        f"pool's pages (restore), restart it empty and recompute, go on without "
                        f"it (shrink), or wait for an operator's instruction (pause, with --serve) "
                        f"(default {policy})")
    add_max_restarts(p)
    floor = launch_default("min_world_size")
    p.add_argument("--min-world-size", type=int_arg, default=floor, metavar="N",
                   help=f"shrink: the fewest ranks the run goes on with; below it the run fails "
                        f"(default {floor})")
    p.add_argument("--regrow", action="store_true",
                   help="shrink: start replacements in the background and admit them, between two "
                        "steps, when they are ready: back to the requested world size")


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


def made_for(args, workload) -> dict:
    """What a command that spawns workers hands the group (LaunchOptions fields): the template
    it forked as it started (launcher.early), asked now for the workload's workers, forked while
    the control plane is imported. Nothing when it made none (--listen; a library caller)."""
    early = getattr(args, "early", None)
    if early is None:
        return {}
    early.fork_ahead(workload.config.world_size)
    return early.options(args.step_timeout)
