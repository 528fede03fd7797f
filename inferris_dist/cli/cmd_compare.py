"""`inferris-dist compare`: a workload run in process and on worker processes, and the policy's
promise checked (the run on processes is launching.py's, imported once the workload is read)."""
from __future__ import annotations

from inferris_dist.cli.flags import add_fault_flags, add_rung_flag, add_workload_flags, made_for, workload_of


def add_arguments(co) -> None:
    add_workload_flags(co)
    add_rung_flag(co)
    add_fault_flags(co)
    co.add_argument("--json", action="store_true",
                    help="one JSON object: what was compared, the verdict, the first difference")


def main(args) -> int:
    workload, name = workload_of(args)
    made = made_for(args, workload)
    from inferris_dist.cli import launching
    return launching.run_compare(workload, name, args, made)
