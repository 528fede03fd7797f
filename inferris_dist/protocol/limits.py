"""Limits and argument types both sides apply alike: a number of seconds a socket can wait, an
integer from the command line. (The rank's and the scheduler's command lines use the same.)"""
from __future__ import annotations

import argparse
import math
import os
from collections import namedtuple


def usable_cores() -> int:
    """The cores this process may run on (its affinity), or the machine's where that is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def plain(text: str) -> str:
    """`text` if it is written as a number on a command line is: ASCII, no digit separator, no
    sign before it, no space around it; else ValueError (Python's int() and float() would take
    '１', '١', '1_0', '+2' or ' 2')."""
    if not text.isascii() or "_" in text or text != text.strip() or text.startswith("+"):
        raise ValueError(f"not a plain number: {text!r}")
    return text


def int_arg(text: str) -> int:
    try:
        return int(plain(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want an integer, got {text!r}") from None


# The longest wait the code can carry out: socket timeouts and polls take milliseconds as a
# C int (2**31 ms is 24.8 days); a day is more than any run needs.
MAX_SECONDS = 86400.0


def seconds_arg(text: str) -> float:
    try:
        value = float(plain(text))
    except ValueError:
        value = math.nan
    if not valid_seconds(value):
        raise argparse.ArgumentTypeError(f"want a number of seconds > 0 and <= {MAX_SECONDS:g}, "
                                         f"got {text!r}")
    return value


def valid_seconds(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= MAX_SECONDS)


# -- the rank's stand-in for a model's execution time (launch --exec-cost) ------------------

class ExecCost(namedtuple("ExecCost", ("per_step_ns", "per_token_ns"), defaults=(0, 0))):
    """How long a rank takes to execute one step, as a GPU would: a fixed part per step plus a
    part per scheduled token, in nanoseconds. The rank waits it out without spinning. (A
    collections.namedtuple: every command reads this module, and typing costs 4 ms to load.)"""
    __slots__ = ()

    def __bool__(self) -> bool:
        return bool(self.per_step_ns or self.per_token_ns)

    def seconds(self, num_tokens: int) -> float:
        return (self.per_step_ns + self.per_token_ns * num_tokens) / 1e9

    def __str__(self) -> str:
        parts = [_duration(self.per_step_ns)] if self.per_step_ns or not self.per_token_ns else []
        if self.per_token_ns:
            parts.append(_duration(self.per_token_ns) + "/token")
        return "+".join(parts)


NO_EXEC_COST = ExecCost()
MAX_STEP_COST_NS = 10 * 10**9       # 10 s per step
MAX_TOKEN_COST_NS = 10 * 10**6      # 10 ms per token
_UNITS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}


def parse_exec_cost(text: str) -> ExecCost:
    """`1ms`, `500us`, `1ms+2us/token` (or `/tok`), `2us/token`, `0`: ValueError with the reason
    otherwise."""
    per_step = per_token = None
    for term in text.strip().split("+"):
        term = term.strip()
        per = term.endswith(("/token", "/tok"))
        if per:
            term = term[:term.rindex("/")]
        value = _ns(term)
        if per:
            if per_token is not None:
                raise ValueError("two per-token parts")
            per_token = value
        else:
            if per_step is not None:
                raise ValueError("two per-step parts")
            per_step = value
    cost = ExecCost(per_step or 0, per_token or 0)
    if cost.per_step_ns > MAX_STEP_COST_NS or cost.per_token_ns > MAX_TOKEN_COST_NS:
        raise ValueError("at most 10s per step and 10ms per token")
    return cost


def exec_cost_arg(text: str) -> ExecCost:
    try:
        return parse_exec_cost(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"want a time per step, per token or both, e.g. 1ms, 500us, "
                                         f"1ms+2us/token ({e}); got {text!r}") from None


def _ns(term: str) -> int:
    if term == "0":
        return 0
    for unit in ("ns", "us", "ms", "s"):
        if term.endswith(unit):
            number = term[:-len(unit)]
            break
    else:
        raise ValueError(f"no unit (ns, us, ms, s) in {term!r}")
    try:
        value = float(plain(number))
    except ValueError:
        raise ValueError(f"not a number: {number!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {term!r}")
    return round(value * _UNITS[unit])


def _duration(ns: int) -> str:
    if ns == 0:
        return "0"
    for unit in ("s", "ms", "us"):
        if ns >= _UNITS[unit] and ns % _UNITS[unit] == 0:
            return f"{ns // _UNITS[unit]}{unit}"
    return f"{ns}ns"
