"""`inferris-dist keys DIR --world-size N`: CURVE keys for a run across hosts (protocol/keys)."""
from __future__ import annotations

import sys

from inferris_dist.cli.args import EXIT_OK, UsageError, int_arg


def add_arguments(ke) -> None:
    ke.add_argument("dir", metavar="DIR", help="directory to write scheduler.key[_secret] and "
                    "rank-R.key[_secret] into")
    ke.add_argument("--world-size", type=int_arg, required=True, metavar="N")
    ke.add_argument("--force", action="store_true", help="replace keys already there")


def main(args) -> int:
    if not 1 <= args.world_size <= 4096:
        raise UsageError(f"inferris-dist keys: --world-size {args.world_size} is outside 1..4096")
    from inferris_dist.protocol.keys import write_keys
    files = write_keys(args.dir, args.world_size, args.force)
    sys.stdout.write(f"wrote {len(files)} key files into {args.dir}: scheduler.key, "
                     f"rank-0.key .. rank-{args.world_size - 1}.key and their *.key_secret (mode 0600)\n"
                     f"the scheduler needs scheduler.key_secret and every rank-R.key; rank R needs "
                     f"scheduler.key and rank-R.key_secret\n")
    return EXIT_OK
