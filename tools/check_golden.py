#!/usr/bin/env python3
"""Check a command's JSON traces against the golden ones (docs/SPEC.md §4 and §6).

    python tools/check_golden.py [OPTIONS] -- CMD ARG ... {} ...
    python tools/check_golden.py --ladder [OPTIONS] -- CMD ... --rung {rung} ... {} ...

Without --ladder, CMD runs once per golden workload GOLDEN/CASE.spec.json,
with every argument `{}` replaced by the workload's path, and its stdout is
compared with GOLDEN/CASE.trace.jsonl. With --ladder, CMD runs once per
GOLDEN/ladder/CASE.RUNG.trace.jsonl, `{}` being GOLDEN/CASE.spec.json and
`{rung}` the RUNG, and its stdout is compared with that trace.

Lines are compared as parsed JSON, key order included (SPEC §4 fixes it);
blank lines are ignored, and an error object is compared by its `error` and
`step` only (its message is free: `inferris_dist.testing.comparable`, so run
this with the project's python, `.venv/bin/python`). The exit status must be 1 when the golden
trace ends in an error and 0 otherwise.

Prints one line per failing case (with the first difference), then
`N passed, M failed`. Exit status: 0 all passed, 1 some failed, 2 bad usage.
GOLDEN defaults to this repository's tests/data/golden.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

try:
    from inferris_dist.testing import comparable  # how every check compares lines: one rule
except ImportError:
    sys.exit("check_golden.py: inferris_dist is not installed here: run it with the project's "
             "python (make test creates it: .venv/bin/python tools/check_golden.py ...)")

DEFAULT_GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden"
SPEC_SUFFIX = ".spec.json"
TRACE_SUFFIX = ".trace.jsonl"
SHOWN = 240          # characters of a JSON line shown in a failure


@dataclass(frozen=True)
class Case:
    name: str            # "demo", or "demo at rung 08a"
    spec: Path           # substituted for {}
    trace: Path          # the golden trace
    rung: str | None     # substituted for {rung} (--ladder only)


# -- finding the cases ------------------------------------------------------------------------


def main_cases(golden: Path) -> list[Case]:
    return [Case(spec.name[:-len(SPEC_SUFFIX)], spec,
                 spec.with_name(spec.name[:-len(SPEC_SUFFIX)] + TRACE_SUFFIX), None)
            for spec in sorted(golden.glob("*" + SPEC_SUFFIX))]


def ladder_cases(golden: Path) -> list[Case]:
    cases = []
    for trace in sorted((golden / "ladder").glob("*" + TRACE_SUFFIX)):
        stem = trace.name[:-len(TRACE_SUFFIX)]
        if "." not in stem:
            continue                        # not CASE.RUNG
        case, rung = stem.rsplit(".", 1)
        cases.append(Case(f"{case} at rung {rung}", golden / (case + SPEC_SUFFIX), trace, rung))
    return cases


# -- comparing --------------------------------------------------------------------------------


def parse_lines(text: str) -> list:
    """JSON lines as ordered objects (so key order counts); an error object keeps error and step."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=OrderedDict)
        except ValueError as e:
            raise ValueError(f"line {number} is not JSON ({e}): {line[:SHOWN]}") from None
        out.append(obj)
    return comparable(out)


def _show(obj) -> str:
    text = json.dumps(obj)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def first_difference(got: list, want: list) -> str | None:
    """The first line where `got` differs from `want`, said in one line; None if they agree."""
    for number, (g, w) in enumerate(zip(got, want), 1):
        if g == w:
            continue
        where = ""
        if isinstance(g, dict) and isinstance(w, dict):
            keys = [k for k in dict.fromkeys([*w, *g]) if g.get(k, KeyError) != w.get(k, KeyError)]
            where = f" in {', '.join(keys)}" if keys else " in key order"
        return f"line {number} differs{where}: got {_show(g)} want {_show(w)}"
    if len(got) != len(want):
        extra = (f"first missing: {_show(want[len(got)])}" if len(got) < len(want)
                 else f"first extra: {_show(got[len(want)])}")
        return f"got {len(got)} lines, want {len(want)}; {extra}"
    return None


# -- running ----------------------------------------------------------------------------------


def command_for(cmd: list[str], case: Case) -> list[str]:
    out = []
    for part in cmd:
        if part == "{}":
            out.append(str(case.spec))
        elif part == "{rung}" and case.rung is not None:
            out.append(case.rung)
        else:
            out.append(part)
    return out


def run(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run argv in its own process group; on timeout kill that group. (status or None, out, err)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out, err


def check(case: Case, cmd: list[str], timeout: float) -> str | None:
    """None if the case passes, else what is wrong (one line)."""
    try:
        want = parse_lines(case.trace.read_text())
    except OSError as e:
        return f"cannot read the golden trace {case.trace}: {e.strerror or e}"
    except ValueError as e:
        return f"the golden trace {case.trace} is broken: {e}"
    if not case.spec.is_file():
        return f"no workload {case.spec}"
    argv = command_for(cmd, case)
    try:
        status, out, err = run(argv, timeout)
    except OSError as e:
        return f"cannot run {argv[0]}: {e.strerror or e}"
    if status is None:
        return f"no answer in {timeout:g} s"
    try:
        got = parse_lines(out)
    except ValueError as e:
        return f"output {e}{_stderr_tail(err)}"
    problem = first_difference(got, want)
    if problem is not None:
        return problem + (_stderr_tail(err) if not got else "")
    ends_in_error = bool(want) and isinstance(want[-1], dict) and "error" in want[-1]
    expected = 1 if ends_in_error else 0
    if status != expected:
        return f"exit status {status}, want {expected}{_stderr_tail(err)}"
    return None


def _stderr_tail(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return f" (stderr: {lines[-1][:SHOWN]})" if lines else ""


# -- the command line -------------------------------------------------------------------------


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="check_golden.py",
        usage="%(prog)s [--golden DIR] [--ladder] [--only TEXT] [-j N] [--timeout S] -- CMD ...",
        description="Run CMD on every golden workload ({} is its path; with --ladder, {rung} the "
                    "rung) and compare its stdout with the golden trace.")
    parser.add_argument("--golden", metavar="DIR", default=str(DEFAULT_GOLDEN),
                        help="the golden directory (default: this repository's tests/data/golden)")
    parser.add_argument("--ladder", action="store_true",
                        help="check DIR/ladder/CASE.RUNG.trace.jsonl, with {rung} in CMD")
    parser.add_argument("--only", metavar="TEXT", default="",
                        help="only the cases whose name contains TEXT (e.g. 'demo', 'rung 08a')")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="run N commands at once (default 1)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds one command may take (default 120)")
    if "--" in argv:
        cut = argv.index("--")
        own, cmd = argv[:cut], argv[cut + 1:]
    else:
        own, cmd = argv, []
    args = parser.parse_args(own)           # exits 2 on a bad option
    if not cmd:
        parser.error("give the command after --, with {} where the workload's path goes")
    if "{}" not in cmd:
        parser.error("the command has no {} argument for the workload's path")
    if args.ladder and "{rung}" not in cmd:
        parser.error("--ladder needs a {rung} argument in the command")
    if not args.ladder and "{rung}" in cmd:
        parser.error("{rung} is only replaced with --ladder")
    if args.jobs < 1:
        parser.error(f"-j must be at least 1, got {args.jobs}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    return args, cmd


def main(argv: list[str] | None = None) -> int:
    args, cmd = parse_args(sys.argv[1:] if argv is None else argv)
    golden = Path(args.golden)
    if not golden.is_dir():
        print(f"check_golden.py: no golden directory {golden}", file=sys.stderr)
        return 2
    cases = ladder_cases(golden) if args.ladder else main_cases(golden)
    where = golden / "ladder" if args.ladder else golden
    if not cases:
        print(f"check_golden.py: no golden traces in {where}", file=sys.stderr)
        return 2
    cases = [c for c in cases if args.only in c.name]
    if not cases:
        print(f"check_golden.py: no case in {where} matches --only {args.only!r}", file=sys.stderr)
        return 2
    passed = failed = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # map yields in case order, so the report is the same whatever -j is
        for case, problem in zip(cases, pool.map(lambda c: check(c, cmd, args.timeout), cases)):
            if problem is None:
                passed += 1
            else:
                failed += 1
                print(f"FAIL {case.name}: {problem}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
