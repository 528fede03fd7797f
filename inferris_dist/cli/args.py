"""What every command shares: exit statuses, a one-line usage error, argument types."""
from __future__ import annotations

import argparse

from inferris_dist.protocol.limits import MAX_SECONDS, int_arg, seconds_arg, valid_seconds

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "MAX_SECONDS",
           "Parser", "UsageError", "int_arg", "seconds_arg", "valid_seconds"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit status 2."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")

