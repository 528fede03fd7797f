"""CURVE keys for a run across hosts: one pair for the scheduler, one per rank.

`inferris-dist keys DIR --world-size N` writes them as ZeroMQ certificate
files (`zmq.auth` format): `scheduler.key` / `scheduler.key_secret` and
`rank-R.key` / `rank-R.key_secret`. A secret file is mode 0600 from the
moment it exists (written in a private temporary folder, then moved in).

Loading is as wary as ssh: every key file is read through one descriptor, at
most KEY_FILE_MAX bytes (a bigger one is refused unread), and a secret whose
owner is someone else, or whose mode lets anyone else in, is refused with the
command that fixes it. Each refusal is one line naming the file (KeyFileError).

The scheduler needs its own pair and every rank's public key; a worker needs
the scheduler's public key and its own pair. Whoever holds
`rank-R.key_secret` is rank R: the scheduler's ZAP handler names each
connection by the key it proved, and a HELLO must claim that rank.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from inferris_dist.engine.errors import WorkloadError

SCHEDULER = "scheduler"


class KeyFileError(WorkloadError):
    """A key directory or file that cannot be used (bad input: exit status 2)."""


def rank_name(rank: int) -> str:
    return f"rank-{rank}"


def key_files(name: str) -> tuple[str, str]:
    return f"{name}.key", f"{name}.key_secret"


def write_keys(directory: str | Path, world_size: int, force: bool = False) -> list[Path]:
    """Write the scheduler's pair and one per rank into `directory`; returns the files written."""
    directory = Path(directory)
    names = [SCHEDULER] + [rank_name(r) for r in range(world_size)]
    files = [directory / f for name in names for f in key_files(name)]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KeyFileError(f"cannot make the key directory {directory}: {e.strerror or e}") from None
    existing = [f for f in files if f.exists()]
    if existing and not force:
        raise KeyFileError(f"{existing[0]} already exists ({len(existing)} key file(s) in {directory}); "
                           f"pass --force to replace them")
    try:
        private = Path(tempfile.mkdtemp(prefix=".keys-", dir=directory))   # mode 0700
    except OSError as e:
        raise KeyFileError(f"cannot write into the key directory {directory}: {e.strerror or e}") from None
    import zmq.auth  # not at import: a worker needs only load_certificate's format
    try:
        for name in names:
            public, secret = (Path(p) for p in zmq.auth.create_certificates(private, name))
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
        for f in files:
            os.replace(private / f.name, f)
    except OSError as e:
        raise KeyFileError(f"cannot write keys into {directory}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return files


# A certificate from `inferris-dist keys` is about 350 bytes; a few kB leaves room for comments
# and metadata, and a file past it is refused unread (a 2 GB "key" must not cost 2 GB).
KEY_FILE_MAX = 4096


def _load(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    return _parse(path, _read(path, want_secret), want_secret)


def _read(path: Path, secret: bool) -> bytes:
    """At most KEY_FILE_MAX bytes of a regular key file; a secret's owner and mode are checked
    on the file opened (fstat), so what is checked is what is read."""
    try:
        # O_NONBLOCK: a FIFO put in a key's place must not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyFileError(f"no key file {path} (make keys with `inferris-dist keys DIR "
                           f"--world-size N`)") from None
    except OSError as e:
        raise KeyFileError(f"cannot open key file {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path} is not a regular file (make keys with `inferris-dist keys "
                               f"DIR --world-size N`)")
        if st.st_size > KEY_FILE_MAX:
            raise KeyFileError(_too_big(path, f"{st.st_size} bytes"))
        if secret:
            _check_private(path, st)
        data = b""
        while len(data) <= KEY_FILE_MAX:          # the size may change under us: read cap + 1 at most
            chunk = os.read(fd, KEY_FILE_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > KEY_FILE_MAX:
        raise KeyFileError(_too_big(path, f"more than {KEY_FILE_MAX} bytes"))
    return data


def _too_big(path: Path, size: str) -> str:
    return f"{path} is too big for a key file ({size}; a key file holds at most {KEY_FILE_MAX} bytes)"


def _check_private(path: Path, st: os.stat_result) -> None:
    """A secret key must be ours and open to nobody else (as ssh requires of a private key)."""
    me = os.geteuid()
    if st.st_uid != me:
        raise KeyFileError(f"{path} is owned by {_user(st.st_uid)}, not by you (uid {me}): a secret "
                           f"key file must be yours, so that nobody else can read or replace it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise KeyFileError(f"{path} is open to others (mode {mode:04o}); a secret key file must be "
                           f"readable by you alone: chmod 600 {_quoted(path)}")


def _user(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid without a name."""
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _quoted(path: Path) -> str:
    """The path as a shell word (escaped if it holds what a terminal would act on)."""
    import shlex
    text = shlex.quote(str(path))
    return text if text.isprintable() else repr(str(path))


def _parse(path: Path, data: bytes, want_secret: bool) -> tuple[bytes, bytes | None]:
    """A ZeroMQ certificate file's keys (the format zmq.auth.load_certificate reads)."""
    public = secret = None
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"#"):
            continue
        if line.startswith(b"public-key") and b"=" in line:
            public = line.split(b"=", 1)[1].strip(b" \t'\"")
        if line.startswith(b"secret-key") and b"=" in line:
            secret = line.split(b"=", 1)[1].strip(b" \t'\"")
        if public and secret:
            break
    if public is None:
        raise KeyFileError(f"{path} is not a ZeroMQ certificate file: no public key found in it")
    if not _z85_key(public) or (want_secret and not _z85_key(secret)):
        raise KeyFileError(f"{path} holds no usable CURVE {'secret' if want_secret else 'public'} key")
    return public, secret


def _z85_key(key: bytes | None) -> bool:
    """A 32-byte key in Z85 (40 characters of its alphabet)."""
    if key is None or len(key) != 40:
        return False
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError):
        return False


@dataclass(frozen=True)
class ServerKeys:
    """What the scheduler holds: its own pair, and which public key is which rank."""
    public: bytes
    secret: bytes
    rank_of_key: dict[bytes, int]       # z85 public key -> rank

    @classmethod
    def load(cls, directory: str | Path, world_size: int) -> "ServerKeys":
        directory = Path(directory)
        public, secret = _load(directory / key_files(SCHEDULER)[1], want_secret=True)
        rank_of_key: dict[bytes, int] = {}
        for rank in range(world_size):
            key, _ = _load(directory / key_files(rank_name(rank))[0], want_secret=False)
            if key in rank_of_key:
                raise KeyFileError(f"ranks {rank_of_key[key]} and {rank} have the same key in {directory}")
            rank_of_key[key] = rank
        return cls(public, secret, rank_of_key)


@dataclass(frozen=True)
class ClientKeys:
    """What a worker holds: the scheduler's public key and its own pair."""
    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, directory: str | Path, rank: int) -> "ClientKeys":
        directory = Path(directory)
        server_public, _ = _load(directory / key_files(SCHEDULER)[0], want_secret=False)
        public, secret = _load(directory / key_files(rank_name(rank))[1], want_secret=True)
        return cls(server_public, public, secret)

    @classmethod
    def ephemeral(cls, server_public: bytes) -> "ClientKeys":
        public, secret = zmq.curve_keypair()
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
