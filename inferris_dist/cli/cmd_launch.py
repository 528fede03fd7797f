"""`inferris-dist launch`: a workload run with its ranks on real worker processes.

Its flags and its start; the run itself is launching.py's, imported once the workload is read
and the worker template (launcher.early, made as the command started) asked for its workers.
"""
from __future__ import annotations

from inferris_dist.cli.args import seconds_arg
from inferris_dist.cli.flags import (
    add_fault_flags,
    add_metrics_flag,
    add_output_flags,
    add_rung_flag,
    add_workload_flags,
    described,
    launch_default,
    linger_arg,
    made_for,
    workload_of,
)

PAUSE_TIMEOUT = 300.0   # --on-rank-loss pause: seconds a paused run waits for an operator
LAUNCH_LINGER = 0.0     # --serve's server stops as the run ends (once its open pages were told)


def add_arguments(la) -> None:
    from inferris_dist.cli.workload_source import WORKLOAD_HELP
    described(la, epilog=WORKLOAD_HELP)
    add_workload_flags(la)
    add_rung_flag(la)
    add_output_flags(la)
    la.add_argument("--wire-log", metavar="FILE", help="write every message that crossed as JSON lines")
    add_fault_flags(la)
    add_metrics_flag(la)
    la.add_argument("--html", metavar="FILE",
                    help="write one self-contained page of the run (opens offline in any browser): "
                         "lanes for the scheduler, every rank and request, each step's plan and "
                         "results, losses and restarts; also `inferris-dist html WIRELOG -o FILE`")
    la.add_argument("--timeline", metavar="FILE",
                    help="write a Chrome trace (open it at ui.perfetto.dev, online; offline, use "
                         "--html): scheduler phases, each rank's round trips and what it did inside them")
    add_host_flags(la)
    add_serve_flags(la)


def add_host_flags(la) -> None:
    """--listen and what goes with it: ranks that others start, on any host (docs/hosts.md)."""
    h = la.add_argument_group("ranks on other hosts (the scheduler spawns nothing)")
    h.add_argument("--listen", metavar="tcp://ADDR:PORT",
                   help="bind here and wait for `inferris-dist worker` ranks started by others "
                        "(port 0: any free port)")
    h.add_argument("--keys", metavar="DIR",
                   help="CURVE keys from `inferris-dist keys`: every message encrypted, every rank "
                        "proven by its own key (required unless --listen is on loopback)")
    join, rejoin = launch_default("join_timeout"), launch_default("rejoin_timeout")
    h.add_argument("--join-timeout", type=seconds_arg, default=join, metavar="SECONDS",
                   help=f"how long to wait for all ranks to join (default {join:g})")
    h.add_argument("--rejoin-timeout", type=seconds_arg, default=rejoin, metavar="SECONDS",
                   help=f"with restore or recompute: how long to wait for a lost rank's "
                        f"replacement to join (default {rejoin:g})")


def add_serve_flags(la) -> None:
    """--serve and --serve-linger: the run watched live (cmd_serve)."""
    g = la.add_argument_group("watching the run live")
    g.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve the live page, /metrics (Prometheus), /health and /status while the run "
                        "runs (HOST default 127.0.0.1; PORT 0: any free one; the URL goes to stderr)")
    g.add_argument("--serve-linger", type=linger_arg, default=LAUNCH_LINGER, metavar="SECONDS",
                   help=f"keep serving this long after the run ends (default {LAUNCH_LINGER:g}: stop once "
                        f"the open pages were told the end)")
    g.add_argument("--pause-timeout", type=seconds_arg, default=PAUSE_TIMEOUT, metavar="SECONDS",
                   help=f"--on-rank-loss pause: how long a paused run waits for an instruction before it "
                        f"applies --pause-default (default {PAUSE_TIMEOUT:g})")
    g.add_argument("--pause-default", choices=("abort", "retry", "scale-down"), default="abort",
                   help="--on-rank-loss pause: what the pause timeout does (default abort)")


def main(args) -> int:
    import time
    started = time.monotonic()               # the run's start-up counts from here
    workload, name = workload_of(args)
    made = made_for(args, workload)          # the workers forked ahead, while we import
    from inferris_dist.cli import launching  # the executor on processes: when used
    return launching.run_launch(workload, name, args, made, started)
