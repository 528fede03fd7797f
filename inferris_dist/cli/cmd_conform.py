"""`inferris-dist conform`: a rank worker, ours or anyone's, tried against the wire's promises
(docs/conform.md). The kit is inferris_dist/conform; this is its command line."""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from inferris_dist.cli.args import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from inferris_dist.protocol.limits import seconds_arg

OWN_WORKER = ("{python} -m inferris_dist.rank --connect {{connect}} --rank {{rank}} "
              "--world-size {{world_size}}")
PROFILES = ("faults",)


def own_worker() -> str:
    return OWN_WORKER.format(python=shlex.quote(sys.executable))


def add_arguments(p) -> None:
    p.add_argument("--worker", metavar="'COMMAND'",
                   help="the worker to try: a command with {connect}, {rank} and {world_size} in it, the "
                        "run secret on its stdin as one line of hex (default: ours, "
                        "'python -m inferris_dist.rank --connect {connect} --rank {rank} "
                        "--world-size {world_size}')")
    p.add_argument("--full", action="store_true",
                   help="every case: all 72 golden traces, every rung, every link fault (default: a sample)")
    p.add_argument("--profile", action="append", choices=PROFILES, default=[],
                   help="also the fault kinds a worker acts out (graded INFORMATIONAL where it does not)")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="only the cases whose id matches (a glob; repeatable), whatever their tier")
    p.add_argument("--json", action="store_true", help="the results as one JSON document on stdout")
    p.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")
    p.add_argument("--start-timeout", type=seconds_arg, default=10.0, metavar="S",
                   help="seconds a worker has to connect and say HELLO (default 10)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep every case's wire log and worker output under DIR (default: a temporary "
                        "directory, kept and named only when a case fails)")


def main(args) -> int:
    from inferris_dist.conform.cases import FAIL, Kit, Missing, all_cases
    from inferris_dist.conform.report import as_json, junit, row
    from inferris_dist.conform.runner import exit_status, run_cases, summary
    from inferris_dist.launcher.command import CommandError, command_words

    own = args.worker is None
    command = own_worker() if own else args.worker
    try:
        words = command_words(command)
    except CommandError as e:
        raise UsageError(f"inferris-dist conform: {e}") from None
    if args.junit is not None:
        _check_output(args.junit, words)
    keep, temporary = _keep_dir(args.keep)
    golden = _golden()
    kit = Kit(command, args.start_timeout, golden if golden is not None else Missing())
    cases = all_cases(golden)
    if args.case and not any(_matches(c.id, args.case) for c in cases):
        raise UsageError(f"inferris-dist conform: --case {' '.join(args.case)}: no such case")
    out = sys.stdout
    if not args.json:
        out.write(f"inferris-dist conform: {command}\n")
        if golden is None:
            out.write("  (no golden traces here: they are in the source tree's tests/data/golden; "
                      "the cases that need them say so)\n")
        out.flush()
    started = time.monotonic()

    def told(result) -> None:
        if not args.json and result.grade != "SKIPPED":
            out.write(row(result) + "\n")
            out.flush()

    try:
        results = run_cases(kit, cases, keep, full=args.full, profiles=args.profile, patterns=args.case,
                            own_worker=own, told=told)
    except KeyboardInterrupt:
        if temporary:
            shutil.rmtree(keep, ignore_errors=True)
            sys.stderr.write("inferris-dist conform: interrupted; every worker stopped\n")
        else:
            sys.stderr.write(f"inferris-dist conform: interrupted; every worker stopped; kept: {keep}\n")
        return EXIT_INTERRUPTED
    seconds = time.monotonic() - started
    status = exit_status(results)
    failed = any(r.grade == FAIL for r in results)
    if temporary and not failed:
        shutil.rmtree(keep, ignore_errors=True)
    if args.json:
        out.write(as_json(results, seconds, str(keep) if keep.exists() else "") + "\n")
    else:
        out.write(f"{summary(results)} in {seconds:.1f} s\n")
        if failed:
            out.write(f"wire logs and worker output kept in {keep}\n")
    out.flush()
    if args.junit is not None:             # after the results are said: a full disk loses no verdict
        try:
            Path(args.junit).write_bytes(junit(results, seconds))
        except OSError as e:
            sys.stderr.write(f"inferris-dist conform: cannot write --junit {args.junit}: {e.strerror or e}\n")
            return max(status, EXIT_FAILED)
    return status


def _matches(case_id: str, patterns) -> bool:
    import fnmatch
    return any(fnmatch.fnmatchcase(case_id, p) for p in patterns)


def _golden() -> Path | None:
    root = Path(__file__).resolve().parents[2] / "tests" / "data" / "golden"
    return root if (root / "demo.spec.json").exists() else None


def _keep_dir(keep: str | None) -> tuple[Path, bool]:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="inferris-conform-")), True
    path = Path(keep)
    if path.exists() and not path.is_dir():
        raise UsageError(f"inferris-dist conform: --keep {keep}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"inferris-dist conform: --keep {keep}: {e.strerror}") from None
    return path.resolve(), False


def _check_output(path: str, words: list[str]) -> None:
    """--junit: never a directory, never a file the worker command names (an input)."""
    if os.path.isdir(path):
        raise UsageError(f"inferris-dist conform: --junit {path}: is a directory")
    if os.path.exists(path):
        target = os.stat(path)
        for word in words:
            for candidate in (word, shutil.which(word) or ""):
                try:
                    st = os.stat(candidate)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    raise UsageError(f"inferris-dist conform: --junit {path} is an input of the worker "
                                     f"command: it would be overwritten")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"inferris-dist conform: --junit {path}: no such directory {parent}")


__all__ = ["EXIT_USAGE", "add_arguments", "main"]
