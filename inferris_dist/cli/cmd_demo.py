"""`inferris-dist demo`: `run` of the built-in three-request workload."""
from __future__ import annotations


def add_arguments(demo) -> None:
    demo.add_argument("--json", action="store_true", help="SPEC §4 JSON lines")


def main(args) -> int:
    from inferris_dist.cli.cmd_run import run_in_process
    from inferris_dist.cli.workload_source import workload_from_flags
    workload, name = workload_from_flags(None, None, {})
    return run_in_process(workload, name, args.json)
