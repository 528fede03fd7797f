"""The one reader of wire logs: a file from outside, read line by line within bounds.

Every tool that reads a wire log (`inspect`, the page, anything later) reads it here, in one
of two modes:

- strict (`inspect`): a bad line is bad input. The first line that is not a record refuses
  the log, one line naming the file and the line (WorkloadError); a consumer that finds a
  record malformed refuses it the same way (`reader.refused(why)`). A last line cut short (a
  full disk, a killed run) is left out and said (`cut_short`), the rest stands.
- lenient (the page): a bad line is skipped and counted, a line too long skipped unread, and
  `notes` says what was; a file none of whose first lines is a record is not a wire log.

A log still being written (`serve WIRELOG`, `launch --serve`) is followed by `LogFollower`,
as `tail -f` follows a file: the same decoding and bounds, lenient, a line taken only once
its newline has come.

Either way the file must be a regular file (a fifo would block the open or the read for ever,
a device never ends: refused before a byte is read); no line is read whole beyond the line
bound; a line holds at most MAX_NESTED objects and arrays (what parsing it may cost); at most
`max_read` bytes are read in all (lenient: the rest is left, and said; strict: refused). The
bytes are decoded as UTF-8 with stray bytes replaced (a writer's log is ASCII: json.dumps
escapes the rest), so a stray byte is never a traceback.

A record is an object of one of the schema's two shapes (`schema.record_kind`); the reader
does not check it further: the schema is the writer's contract, and a reader tolerates an
older or a newer writer's log (`schema.check_record` checks one against today's writer).
"""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, BinaryIO, Iterator

from inferris_dist.engine import WorkloadError
from inferris_dist.wirelog.schema import record_kind
from inferris_dist.words import shown

MAX_LINE = 16 << 20          # bytes of one line; a longer one is refused (strict) or skipped
MAX_READ = 1 << 30           # bytes read from one log in all
MAX_NESTED = 1 << 20         # objects and arrays in one line
PROBE_LINES = 1000           # lenient: none of the first lines (or bytes) a record: not a wire log
PROBE_BYTES = 64 << 20


class Malformed(Exception):
    """What is wrong with one record, in a few words; whoever reads the log names the file and
    the line (strict) or counts it (lenient)."""


def open_log(path: str, command: str = "inspect") -> BinaryIO:
    """A wire log, opened for reading only if it is a regular file. Bad input (no such file, a
    directory, a fifo, a device) raises WorkloadError naming `command` and the file."""
    name = shown(str(path))
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise WorkloadError(f"{command} {name}: not a regular file ({_kind(st.st_mode)})")
        # O_NONBLOCK: a fifo swapped in after the stat must not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:                                   # swapped between the stat and the open?
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WorkloadError(f"{command} {name}: not a regular file ({_kind(st.st_mode)})")
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
    except OSError as e:
        raise WorkloadError(f"{command} {name}: {e.strerror or e}") from None


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a fifo" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a file")


_raw_decode = json.JSONDecoder().raw_decode


def decode_line(line: bytes) -> Any:
    """One JSON value filling the line (json.loads, a little faster: a log has many lines)."""
    text = line.decode("utf-8", "replace")     # stray bytes replaced, never a traceback
    if text[:1] in (" ", "\t", "\r", "\n"):
        text = text.strip()
    obj, end = _raw_decode(text)
    if end != len(text) and text[end:].strip():
        raise ValueError("extra data")
    return obj


class LogReader:
    """The records of one wire log, one dict per line, in order: iterate it once.

    `strict`: bad input raises WorkloadError (see the module's docstring); else it is skipped
    and counted. `command` names the tool in errors about the file ("inspect FILE: ...").
    `max_line`: bytes of one line at most; `max_read`: bytes read in all (None: no bound, for
    a strict reader whose memory does not grow with the log). During the iteration `line` is
    the number of the line last given; afterwards `cut_short` is the number of the last line
    if it was cut short (and left out), and `notes` says in words what was left out."""

    def __init__(self, path: str, *, strict: bool, command: str, max_line: int = MAX_LINE,
                 max_read: int | None = MAX_READ):
        self.path, self.strict, self.command = path, strict, command
        self.max_line, self.max_read = max_line, max_read
        self.name = shown(str(path))
        self.line = 0
        self.records = 0            # records given
        self.skipped = 0            # lenient: lines that are not a record
        self.too_long = 0           # lenient: lines longer than max_line
        self.cut_short: int | None = None      # the last line, cut short: its number
        self.stopped_at: int | None = None     # lenient: bytes read when max_read stopped it

    @property
    def notes(self) -> list[str]:
        """What was left out, one sentence each (the page puts them at its top)."""
        notes = []
        if self.skipped:
            notes.append(f"{self.skipped} line(s) of the log are not JSON objects: skipped")
        if self.too_long:
            notes.append(f"{self.too_long} line(s) longer than {self.max_line >> 20} MiB: skipped")
        if self.cut_short is not None:
            notes.append("the log's last line is cut short (the run may have been killed while "
                         "writing it): skipped")
        if self.stopped_at is not None:
            notes.append(f"only the first {self.stopped_at >> 20} MiB of the log were read")
        return notes

    def refused(self, why: str) -> WorkloadError:
        """Bad input naming the file and the line last given: `raise reader.refused(why)`."""
        return WorkloadError(f"{self.name} line {self.line}: {why}")

    def __iter__(self) -> Iterator[dict]:
        with open_log(self.path, self.command) as f:
            yield from self._records(f)
        if not self.strict and not self.records:
            raise WorkloadError(f"{self.name}: not a wire log (no message or event in it)")

    def _bad(self, n: int, why: str) -> None:
        """Line `n` is no record: refused (strict), or counted."""
        if self.strict:
            self.line = n
            raise self.refused(why)
        self.skipped += 1

    def _records(self, f: BinaryIO) -> Iterator[dict]:
        total = n = 0
        max_line, max_read = self.max_line, self.max_read
        while True:
            if not self.strict and not self.records and (n >= PROBE_LINES or total >= PROBE_BYTES):
                raise WorkloadError(f"{self.name}: not a wire log (none of its first {n} lines is a "
                                    f"wire message or event)")
            try:
                line = f.readline(max_line + 1)         # never more than one line's worth
            except OSError as e:
                raise WorkloadError(f"{self.command} {self.name}: {e.strerror or e}") from None
            if not line:
                return
            n += 1
            total += len(line)
            if max_read is not None and total > max_read:
                if self.strict:
                    self.line = n
                    raise self.refused(f"the log goes on past {max_read >> 20} MiB: not read further")
                self.stopped_at = total - len(line)
                return
            whole = line.endswith(b"\n")
            if line[:1] not in (b"{", b"["):           # (a writer's lines all begin so: no copy)
                head = line.lstrip()[:1]
                if not head:                            # a blank line
                    continue
                # Checked before the length: what is not JSON is said so without reading on.
                if head not in (b"{", b"["):
                    self._bad(n, "not JSON")
                    total = self._skip_rest(f, line, total)
                    continue
            if not whole and len(line) > max_line:
                if self.strict:
                    self.line = n
                    raise self.refused(f"longer than {max_line >> 20} MB")
                self.too_long += 1
                total = self._skip_rest(f, line, total)
                continue
            if len(line) > MAX_NESTED and line.count(b"{") + line.count(b"[") > MAX_NESTED:
                self._bad(n, f"more than {MAX_NESTED} objects and arrays")
                continue
            try:
                obj = decode_line(line)
            except (ValueError, RecursionError):
                if not whole and not f.peek(1):    # the last line, cut short: the rest stands
                    self.cut_short = n
                    return
                self._bad(n, "not JSON")
                continue
            except MemoryError:                    # what is left of a small address space, say
                self._bad(n, "too large to read in this much memory")
                continue
            del line
            if record_kind(obj) is None:
                self._bad(n, "neither a wire message nor an event")
                continue
            self.line = n
            self.records += 1
            yield obj

    def _skip_rest(self, f: BinaryIO, line: bytes, total: int) -> int:
        """The rest of a line not read whole, read in pieces and dropped (within max_read);
        the bytes read so far."""
        while line and not line.endswith(b"\n") and (self.max_read is None or total <= self.max_read):
            try:
                line = f.readline(self.max_line)
            except OSError as e:
                raise WorkloadError(f"{self.command} {self.name}: {e.strerror or e}") from None
            total += len(line)
        return total


class LogFollower:
    """A wire log still being written, read as `tail -f` reads it: `poll()` gives the records
    of the lines completed since the last call, and never a line still being written (a
    line is taken when its newline has come). Bounded like the lenient reader: a line
    longer than `max_line` is skipped unread (counted in `too_long`), a line that is not a
    record is skipped (counted in `skipped`), and one call reads at most `chunk` bytes. The
    file must be a regular file (open_log). `truncated()` says whether the file has become
    shorter than what was read of it (replaced or cut: what was read no longer stands)."""

    def __init__(self, path: str, command: str = "serve", max_line: int = MAX_LINE,
                 chunk: int = 4 << 20):
        self.path, self.command, self.max_line, self.chunk = path, command, max_line, chunk
        self.name = shown(str(path))
        self.file = open_log(path, command)
        self.position = 0            # bytes read
        self.line = 0                # lines completed
        self.records = 0
        self.skipped = 0
        self.too_long = 0
        self._partial = b""          # the line being written, so far
        self._skipping = False       # inside a line too long to keep: dropped up to its newline

    def close(self) -> None:
        self.file.close()

    def truncated(self) -> bool:
        try:
            return os.fstat(self.file.fileno()).st_size < self.position
        except OSError:
            return True

    def poll(self) -> list[dict]:
        """The records completed since the last call (an empty list: nothing new)."""
        try:
            data = self.file.raw.read(self.chunk)
        except OSError as e:
            raise WorkloadError(f"{self.command} {self.name}: {e.strerror or e}") from None
        if not data:
            return []
        self.position += len(data)
        out = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            piece = data[start:end + 1]
            start = end + 1
            self.line += 1
            if self._skipping:
                self._skipping = False
                continue
            line = self._partial + piece if self._partial else piece
            self._partial = b""
            if len(line) > self.max_line:
                self.too_long += 1
                continue
            self._take(line, out)
        rest = data[start:]
        if self._skipping:
            return out
        if len(self._partial) + len(rest) > self.max_line:
            self._partial = b""
            self._skipping = True
            self.too_long += 1
        else:
            self._partial += rest
        return out

    def _take(self, line: bytes, out: list) -> None:
        if not line.strip():
            return
        try:
            if len(line) > MAX_NESTED and line.count(b"{") + line.count(b"[") > MAX_NESTED:
                raise ValueError("too deep")
            obj = decode_line(line)
        except (ValueError, RecursionError, MemoryError):
            self.skipped += 1
            return
        if record_kind(obj) is None:
            self.skipped += 1
            return
        self.records += 1
        out.append(obj)
