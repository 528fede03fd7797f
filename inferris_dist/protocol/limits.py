"""Limits and argument types both sides apply alike: a number of seconds a socket can wait, an
integer from the command line. (The rank's and the scheduler's command lines use the same.)"""
from __future__ import annotations

import argparse
import math


def int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want an integer, got {text!r}") from None


# The longest wait the code can carry out: socket timeouts and polls take milliseconds as a
# C int (2**31 ms is 24.8 days); a day is more than any run needs.
MAX_SECONDS = 86400.0


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not valid_seconds(value):
        raise argparse.ArgumentTypeError(f"want a number of seconds > 0 and <= {MAX_SECONDS:g}, "
                                         f"got {text!r}")
    return value


def valid_seconds(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= MAX_SECONDS)
