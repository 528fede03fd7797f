"""`inferris-dist worker`: a rank worker for a scheduler started with `launch --listen`. Its
flags are the rank's own (rank/cli.py): the command line hands it the arguments unparsed, before
it does anything else (main.main); the flag below is what `--help` and a misplaced flag show."""
from __future__ import annotations


def add_arguments(wo) -> None:
    wo.add_argument("worker_args", nargs="*", help="--connect tcp://HOST:PORT --keys DIR [--rank R] "
                    "[--world-size N]")


def main(argv: list[str]) -> int:
    """The rank worker, given the arguments after `worker` as they are."""
    from inferris_dist.rank.cli import main as worker_main
    return worker_main(argv)
