"""The rank worker's command line: `inferris-dist worker` / `python -m inferris_dist.rank`.

Three ways to start one: forked or spawned by `inferris-dist launch` on this host
(`--parent-pid`: the run secret on stdin); by a scheduler as a worker command (`--connect`,
`--rank`, `--world-size`, the run secret on stdin: the form any worker in any language is started
in); or by anyone else (a cluster's launcher) for a `launch --listen` scheduler: rank, world size
and address from flags or the launcher's environment (placement), CURVE keys from `--keys DIR`.
The argument types are the ones the scheduler's command line uses.

The run secret is read from stdin when stdin is not a terminal and no `--keys` is given, as
docs/protocol.md §3.2 says: one line of lowercase hex, waited for at most SECRET_WAIT_S; an empty
stdin (EOF, /dev/null) or nothing within that time means no secret (a `--listen` scheduler
without keys). Any byte read makes it a worker a scheduler started: the line must then be the
secret (an empty line or one that is not hex is exit 3), and the worker leaves when its parent,
that scheduler, is gone.
"""
from __future__ import annotations

import argparse
import functools
import os
import select
import signal
import sys

from inferris_dist.protocol.limits import int_arg, seconds_arg
from inferris_dist.protocol.placement import PlacementError, digits_arg, place
from inferris_dist.rank.worker import EXIT_PROTOCOL, EXIT_USAGE, Worker, die_with_parent, fail

SECRET_WAIT_S = 2.0     # a scheduler writes the secret as it starts us; a launcher's stdin may stay silent
MAX_SECRET_LINE = 1024
HEX_DIGITS = frozenset(b"0123456789abcdef")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        fail(f"inferris-dist worker: {message}", EXIT_USAGE)


@functools.lru_cache(maxsize=1)
def parser() -> argparse.ArgumentParser:
    """The worker's parser, built once (a template builds it before it forks: a forked worker
    then parses its arguments without building one, which costs it most of its start)."""
    ap = _Parser(prog="inferris-dist worker",
                 description="A rank worker. Started by `inferris-dist launch` on this host, or "
                             "by anyone (a cluster launcher: mpiexec, srun, torchrun, a Kubernetes "
                             "indexed Job) for a scheduler started with `launch --listen`. "
                             "The run secret (one line of hex) is read from stdin when stdin is not a "
                             "terminal and no --keys is given: how a scheduler starts a worker command "
                             "(`--worker 'python -m inferris_dist.rank --connect {connect} --rank {rank} "
                             "--world-size {world_size}'`); an empty stdin, or none within "
                             f"{SECRET_WAIT_S:g} s, means no secret.")
    ap.add_argument("--rank", type=digits_arg, help="this worker's rank (default: from the launcher's "
                    "environment: RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, "
                    "JOB_COMPLETION_INDEX)")
    ap.add_argument("--world-size", type=digits_arg, help="number of ranks (default: WORLD_SIZE, "
                    "SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE)")
    ap.add_argument("--connect", metavar="tcp://HOST:PORT",
                    help="the scheduler's address (default: tcp://$MASTER_ADDR:$MASTER_PORT)")
    ap.add_argument("--keys", metavar="DIR", help="CURVE key directory (from `inferris-dist keys`): "
                    "scheduler.key and this rank's rank-R.key_secret")
    ap.add_argument("--join-timeout", type=seconds_arg, default=60.0, metavar="SECONDS",
                    help="how long to wait for the scheduler to take us in (default 60)")
    ap.add_argument("--parent-pid", type=int_arg, help=argparse.SUPPRESS)     # spawned by launch
    ap.add_argument("--death-signal", action="store_true", help=argparse.SUPPRESS)
    return ap


def prepare() -> None:
    """What every forked worker would do first, done once in its template."""
    parser().format_usage()      # argparse's formatter imports what it needs at its first use


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN if args.parent_pid else signal.SIG_DFL)
    if args.parent_pid is not None:
        return _spawned(args)
    from inferris_dist.protocol.keys import ClientKeys, KeyFileError  # a member from elsewhere
    try:
        where = place(args.rank, args.world_size, args.connect, os.environ)
        keys = ClientKeys.load(args.keys, where.rank) if args.keys else None
    except (PlacementError, KeyFileError) as e:
        fail(f"inferris-dist worker: {e}", EXIT_USAGE)
    parent = os.getppid()                # before the secret is read: a parent gone meanwhile is seen
    secret = b"" if keys is not None else secret_from_stdin()
    if secret:      # a scheduler started us: gone with it (§3.5), connected or not; its closing
        die_with_parent(parent, death_signal=True)    # connection still ends us, as any worker
    proof = (', CURVE keys from ' + args.keys if keys else ', the run secret from stdin' if secret
             else ', no keys (plaintext)')
    sys.stderr.write(f"inferris-dist worker: {where.line()}{proof}\n")
    sys.stderr.flush()
    worker = Worker(where.rank, where.world_size, where.address, None, secret=secret, keys=keys)
    try:
        worker.handshake(args.join_timeout)
        worker.serve()
    finally:
        worker.close()
    return 0


def secret_from_stdin() -> bytes:
    """The run secret a scheduler wrote to our stdin (see the module's docstring for the rule)."""
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return b""
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return b""
    line = b""
    deadline = SECRET_WAIT_S
    while not line.endswith(b"\n") and len(line) <= MAX_SECRET_LINE:
        ready, _, _ = select.select([fd], [], [], deadline)
        if not ready:
            break
        chunk = os.read(fd, MAX_SECRET_LINE)
        if not chunk:
            break
        line += chunk
        deadline = 0.5
    if not line:
        return b""                       # nothing came: no secret
    text = line.removesuffix(b"\n")
    if not text or len(text) % 2 or not all(c in HEX_DIGITS for c in text):
        fail("inferris-dist worker: stdin holds no run secret (one line of lowercase hex expected)",
             EXIT_PROTOCOL)
    return bytes.fromhex(text.decode("ascii"))


def _spawned(args) -> int:
    if args.rank is None or args.world_size is None or not args.connect:
        fail("inferris-dist worker: --parent-pid needs --rank, --world-size and --connect", EXIT_USAGE)
    die_with_parent(args.parent_pid, args.death_signal)
    line = sys.stdin.readline().strip()
    try:
        secret = bytes.fromhex(line)
    except ValueError:
        secret = b""
    if not secret:
        fail(f"rank {args.rank}: no run secret on stdin")
    worker = Worker(args.rank, args.world_size, args.connect, args.parent_pid, secret)
    try:
        worker.handshake()
        worker.serve()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
