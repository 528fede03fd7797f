"""CURVE keys for a run across hosts: one pair for the scheduler, one per rank.

`inferris-dist keys DIR --world-size N` writes them as ZeroMQ certificate
files (`zmq.auth` format): `scheduler.key` / `scheduler.key_secret` and
`rank-R.key` / `rank-R.key_secret`. A secret file is mode 0600 from the
moment it exists (written in a private temporary folder, then moved in).

The scheduler needs its own pair and every rank's public key; a worker needs
the scheduler's public key and its own pair. Whoever holds
`rank-R.key_secret` is rank R: the scheduler's ZAP handler names each
connection by the key it proved, and a HELLO must claim that rank.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from engine.errors import WorkloadError

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


def _load(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"no key file {path} (make keys with `inferris-dist keys DIR --world-size N`)")
    import zmq.auth
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise KeyFileError(f"{path} is not a ZeroMQ certificate file: {e}") from None
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
