"""What every broken worker here shares: our worker's command line (`--connect`, `--rank`,
`--world-size`, the run secret on stdin), run with a Worker class that breaks one promise of
the wire. Each script in this directory is one such worker, for tests/test_conform.py: the
conformance kit must catch each by a named case. With CONFORM_PIDS set, each writes its pid
there, so a test can see that nothing it started is left running."""
from __future__ import annotations

import argparse
import os
import sys

from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.rank.cli import secret_from_stdin
from inferris_dist.rank.worker import Worker

__all__ = ["MsgType", "Worker", "main", "wire"]


def main(worker_class: type[Worker] = Worker) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    args = ap.parse_args()
    note_pid()
    worker = worker_class(args.rank, args.world_size, args.connect, None, secret=secret_from_stdin())
    try:
        worker.handshake(30.0)
        worker.serve()
    finally:
        worker.close()
    return 0


def note_pid() -> None:
    where = os.environ.get("CONFORM_PIDS")
    if where:
        with open(os.path.join(where, str(os.getpid())), "w"):
            pass


if __name__ == "__main__":
    sys.exit(main())
