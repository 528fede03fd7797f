"""Workers started by a command (`--worker 'COMMAND'`): any executable, in any language.

The command is a template split as a shell would (`shlex.split`, no shell run) whose words may
hold the placeholders `{connect}`, `{rank}` and `{world_size}`; the run secret goes to its stdin
as one line of hex. Each instance runs in a process group of its own (`start_new_session`), so
that stopping it reaches whatever it started too: SIGTERM, then SIGKILL, to the whole group.
Its stdout and stderr go through a pipe to a file under a byte budget: the first `budget` bytes
are kept, then only the last few KiB (its last words), so a worker that floods its output costs
bounded memory and disk.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import string
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence

from .process import WorkerProcess, exited_within

PLACEHOLDERS = ("connect", "rank", "world_size")
OUTPUT_BUDGET = 1 << 20          # bytes of a worker's output kept from its start
TAIL_BYTES = 4096                # and of its end, past the budget
CHUNK = 1 << 16


class CommandError(ValueError):
    """A worker command that cannot be run as given: bad input."""


def command_words(template: str) -> list[str]:
    """The template's words, checked: it splits, it names a program that can be run (on PATH, or
    a path to an executable), and it uses no placeholder but PLACEHOLDERS (CommandError
    otherwise)."""
    try:
        words = shlex.split(template)
    except ValueError as e:
        raise CommandError(f"worker command {template!r} does not split: {e}") from None
    if not words:
        raise CommandError("the worker command is empty")
    if shutil.which(words[0]) is None:
        raise CommandError(f"worker command {template!r}: no such command {words[0]!r}")
    for word in words:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
        except ValueError as e:
            raise CommandError(f"worker command word {word!r}: {e}") from None
        for field in fields:
            if field not in PLACEHOLDERS:
                raise CommandError(f"worker command: unknown placeholder {{{field}}} in {word!r}; "
                                   f"the placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    return words


def command_argv(template: str, connect: str, rank: int, world_size: int) -> list[str]:
    """One instance's argv: the template's words with the placeholders filled in."""
    values = {"connect": connect, "rank": str(rank), "world_size": str(world_size)}
    return [word.format(**values) for word in command_words(template)]


class CommandProcess(WorkerProcess):
    """A worker started by a command: the leader of its own process group. It counts as alive
    while anything of its group runs, and signals go to the whole group."""

    def __init__(self, rank: int, proc: subprocess.Popen, log_path: Path, drain: "OutputDrain"):
        super().__init__(rank, proc, log_path)
        self.drain = drain

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None or self.group_alive()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not exited_within(self.proc, timeout, self._pidfd):
            return False
        while self.group_alive():          # the leader is gone; what it started may linger
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.group_alive():             # never leave anything of it behind
            self.signal(signal.SIGKILL)
        super().close()
        self.drain.join(1.0)


class OutputDrain(threading.Thread):
    """Reads a worker's output pipe to its end, keeping `budget` bytes of its start and
    TAIL_BYTES of its end in `path`; the rest is counted, not kept."""

    def __init__(self, fd: int, path: Path, budget: int = OUTPUT_BUDGET):
        super().__init__(name=f"output of {path.name}", daemon=True)
        self.fd = fd
        self.path = path
        self.budget = budget

    def run(self) -> None:
        kept, dropped, tail = 0, 0, b""
        try:
            with open(self.path, "ab") as out:
                while chunk := os.read(self.fd, CHUNK):
                    room = self.budget - kept
                    if room > 0:
                        out.write(chunk[:room])
                        out.flush()
                        kept += min(room, len(chunk))
                        chunk = chunk[room:]
                    if chunk:
                        dropped += len(chunk)
                        tail = (tail + chunk)[-TAIL_BYTES:]
                if dropped:
                    dropped -= len(tail)
                    out.write(f"\n[... {dropped} bytes of output not kept (budget {self.budget}) ...]\n"
                              .encode() + tail)
        except OSError:
            pass
        finally:
            os.close(self.fd)


def spawn_command(argv: Sequence[str], rank: int, secret: bytes, log_path: Path,
                  budget: int = OUTPUT_BUDGET) -> CommandProcess:
    """Start one instance of a worker command in its own process group, the secret on its
    stdin, its output drained to `log_path` under `budget`. OSError when it cannot start
    (no such program)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=write_end, stderr=write_end,
                                close_fds=True, start_new_session=True)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    drain = OutputDrain(read_end, log_path, budget)
    drain.start()
    try:
        proc.stdin.write(secret.hex().encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass     # it died at once; the handshake will say so
    return CommandProcess(rank, proc, log_path, drain)
