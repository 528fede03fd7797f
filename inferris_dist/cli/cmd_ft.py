"""`inferris-dist ft URL status|apply INSTRUCTION`: the operator of a paused run.

A run launched with `--on-rank-loss pause --serve` stops on a loss and waits for an
instruction at URL/fault-tolerance/apply; its status is at URL/fault-tolerance/status. Both
need the run's bearer token, which the launch printed once and wrote (mode 0600) into its run
directory: given by `--token-file FILE`, or in the environment as INFERRIS_DIST_TOKEN (never
on the command line, where other users' `ps` would see it).

`apply` names the epoch the run paused in (`--epoch`; default: the one the status says now)
and an id (`--id`; default: a fresh one): the same id applied twice acts once. The answer is
printed as JSON. Exit status: 0 when it was carried out (or the status read), 1 when the run
refused it (409: stale epoch, nothing paused, not possible now) or is gone, 2 for bad input
(no token, a wrong one, a malformed URL).
"""
from __future__ import annotations

import json
import os
import secrets
import sys
import urllib.error
import urllib.request

from inferris_dist.cli.args import EXIT_FAILED, EXIT_OK, UsageError

INSTRUCTIONS = ("retry", "scale-down", "scale-up", "abort")
MAX_ANSWER = 1 << 16          # bytes read of an answer
TIMEOUT_S = 75.0              # the desk waits up to a minute for the scheduler to carry it out
TOKEN_ENV = "INFERRIS_DIST_TOKEN"


def add_arguments(p) -> None:
    p.add_argument("url", metavar="URL", help="the run's server, as `launch --serve` printed it")
    p.add_argument("what", choices=("status", "apply"), help="read the status, or apply an instruction")
    p.add_argument("instruction", nargs="?", choices=INSTRUCTIONS, help="apply: what the run does")
    p.add_argument("--epoch", type=int, metavar="E", help="apply: the epoch the run paused in (default: "
                   "the status's)")
    p.add_argument("--id", metavar="ID", help="apply: the instruction's id (default: a fresh one)")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"the run's bearer token (default: ${TOKEN_ENV})")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON line")


def main(args) -> int:
    token = _token(args)
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")) or len(base) > 2048:
        raise UsageError(f"inferris-dist ft: {args.url[:80]!r} is not an http:// URL")
    if args.what == "status":
        code, body = _call(base + "/fault-tolerance/status", token)
    else:
        if args.instruction is None:
            raise UsageError("inferris-dist ft: apply needs an instruction: " + ", ".join(INSTRUCTIONS))
        epoch = args.epoch
        if epoch is None:
            code, status = _call(base + "/fault-tolerance/status", token)
            if code != 200 or not isinstance(status.get("epoch"), int):
                return _said(code, status, args.json)
            epoch = status["epoch"]
        ident = args.id if args.id is not None else "ft-" + secrets.token_hex(8)
        code, body = _call(base + "/fault-tolerance/apply", token,
                           {"id": ident, "instruction": args.instruction, "epoch": epoch})
    return _said(code, body, args.json)


def _token(args) -> str:
    if args.token_file is not None:
        try:
            with open(args.token_file, "rb") as f:
                raw = f.read(257)
        except OSError as e:
            raise UsageError(f"inferris-dist ft: --token-file {args.token_file}: {e.strerror or e}") from None
        token = raw.decode("ascii", "replace").strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token or len(token) > 256 or not token.isprintable() or " " in token:
        raise UsageError(f"inferris-dist ft: no token: give --token-file FILE (the launch wrote it into its "
                         f"run directory) or set {TOKEN_ENV}")
    return token


def _call(url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Authorization": f"Bearer {token}",
                                          **({"Content-Type": "application/json"} if body else {})})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            code, raw = r.status, r.read(MAX_ANSWER)
    except urllib.error.HTTPError as e:
        code, raw = e.code, e.read(MAX_ANSWER)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return 0, {"error": f"cannot reach {url}: {reason}"}
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = {"error": raw.decode("utf-8", "replace")[:200].strip()}
    return code, answer if isinstance(answer, dict) else {"answer": answer}


def _said(code: int, body: dict, as_json: bool) -> int:
    if as_json:
        sys.stdout.write(json.dumps({"code": code, **body}) + "\n")
    else:
        sys.stdout.write((f"{code} " if code else "") + json.dumps(body, indent=2) + "\n")
    if 200 <= code < 300:
        return EXIT_OK
    if code in (400, 401, 404, 405, 415):
        if not as_json:
            sys.stderr.write(f"inferris-dist ft: {body.get('error', 'refused')}\n")
        return 2
    return EXIT_FAILED
