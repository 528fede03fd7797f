"""No output ever overwrites an input or another output: the files a command is asked to read
and to write, checked before anything runs.

Two outputs on one file, or an output on an input, is bad input (one line, exit 2). Files are
compared by what they are, not how they are spelled: an existing file by its device and inode
(a hard link or `./x` is the same file), one still to be made by its resolved path (a symlinked
directory is followed). A device or a pipe (`/dev/null`, `/dev/stdout`) is no file to clobber.
"""
from __future__ import annotations

import os
import stat

from inferris_dist.engine import WorkloadError

INPUTS = (("spec", "--spec"), ("wirelog", "WIRELOG"))
OUTPUTS = (("wire_log", "--wire-log"), ("metrics", "--metrics"), ("timeline", "--timeline"),
           ("html", "--html"), ("output", "--output"))


def identity(path: str) -> tuple | None:
    """What `path` is, to compare with another: (device, inode) of an existing regular file, the
    resolved path of one to be made, None for what no output can clobber (a device, a pipe,
    stdin's `-`)."""
    if path == "-":
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    if not stat.S_ISREG(st.st_mode):
        return None
    return ("file", st.st_dev, st.st_ino)


def check_paths(args) -> None:
    """Refuse (WorkloadError) two outputs on one file, or an output on an input."""
    seen: dict[tuple, str] = {}
    for attr, flag in INPUTS:
        path = getattr(args, attr, None)
        key = identity(path) if isinstance(path, str) else None
        if key is not None:
            seen.setdefault(key, f"{flag} {path}")
    inputs = set(seen)
    for attr, flag in OUTPUTS:
        path = getattr(args, attr, None)
        key = identity(path) if isinstance(path, str) else None
        if key is None:
            continue
        if key in seen:
            what = "the input" if key in inputs else "the output"
            raise WorkloadError(f"{flag} {path} is {what} {seen[key]}: it would be overwritten "
                                f"(give each output a file of its own)")
        seen[key] = f"{flag} {path}"
