"""Which rank am I, of how many, and where is the scheduler: for a worker someone else started.

Each comes from the worker's flags, or else from the environment its
launcher set, in this order of launchers:

    RANK / WORLD_SIZE                          torchrun
    SLURM_PROCID / SLURM_NTASKS                Slurm's srun
    OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE  Open MPI's mpirun
    PMI_RANK / PMI_SIZE                        MPICH's mpiexec (Hydra)
    JOB_COMPLETION_INDEX                       a Kubernetes indexed Job (world size: the flag)

and the address from `--connect`, or else `MASTER_ADDR` and `MASTER_PORT`.
The worker says in one line where each value came from.

The rank and the world size come from one launcher: a rank from SLURM_PROCID
beside only torchrun's WORLD_SIZE is an error (unless --world-size is given:
flags always win). A rank, size or port is the digits 0-9 and nothing else.
"""
from __future__ import annotations

import re
from typing import Mapping, NamedTuple

MAX_WORLD_SIZE = 4096

# (rank variable, world size variable or None, who sets them)
LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm's srun"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_RANK", "PMI_SIZE", "MPICH's mpiexec"),
    ("JOB_COMPLETION_INDEX", None, "a Kubernetes indexed Job"),
)


class PlacementError(ValueError):
    """No rank, world size or address could be found, or one is out of range (exit status 2)."""


class Placement(NamedTuple):
    rank: int
    world_size: int
    address: str
    said: str            # where each value came from, for the worker's one line

    def line(self) -> str:
        return f"rank {self.rank} of {self.world_size}, scheduler at {self.address} ({self.said})"


_DIGITS = re.compile(r"[0-9]+")
_LONGEST = 18          # digits: far past any rank, size or port, and short of a slow int()


def number(text: str, what: str) -> int:
    """A rank, world size or port as written in a variable or flag `what`: the digits 0-9 and
    nothing else (int() would also take " +1_0 " and other scripts' digits, such as "\u0661")."""
    if not _DIGITS.fullmatch(text):
        raise PlacementError(f"{what} is {_shown(text)}, not an integer of the digits 0-9 alone")
    if len(text) > _LONGEST:
        raise PlacementError(f"{what} is a number of {len(text)} digits: far out of range")
    return int(text)


def digits_arg(text: str) -> int:
    """argparse type for --rank and --world-size: the digits 0-9 only, as `number`."""
    if not _DIGITS.fullmatch(text) or len(text) > _LONGEST:
        import argparse
        raise argparse.ArgumentTypeError(f"want an integer of the digits 0-9 alone, got {_shown(text)}")
    return int(text)


def _shown(text: str) -> str:
    """A value from outside, escaped for a terminal (repr) and cut to a readable length."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def _set(environ: Mapping[str, str], var: str | None) -> bool:
    return var is not None and environ.get(var, "") != ""


def place(rank: int | None, world_size: int | None, connect: str | None,
          environ: Mapping[str, str]) -> Placement:
    """Flags first; else the first launcher (in LAUNCHERS' order) that set a rank gives the rank
    and the world size both: a rank from one launcher and a size from another is refused."""
    said = []
    launcher = None                                   # the launcher the rank came from
    if rank is not None:
        said.append("rank from --rank")
    else:
        launcher = next((entry for entry in LAUNCHERS if _set(environ, entry[0])), None)
        if launcher is None:
            raise PlacementError("no rank: pass --rank R, or start the worker under a launcher that "
                                 "sets one of " + ", ".join(v for v, _, _ in LAUNCHERS))
        rank_var, _, who = launcher
        rank = number(environ[rank_var], rank_var)
        said.append(f"rank from {rank_var} ({who})")
    if world_size is not None:
        said.append("world size from --world-size")
    elif launcher is not None:
        rank_var, size_var, who = launcher
        if _set(environ, size_var):
            world_size = number(environ[size_var], size_var)
            said[-1] = f"rank from {rank_var} and world size from {size_var} ({who})"
        else:
            other = next((entry for entry in LAUNCHERS if _set(environ, entry[1])), None)
            head = (f"rank from {rank_var} ({who}) without {size_var}" if size_var else
                    f"rank from {rank_var} ({who}, which gives no world size)")
            if other is not None:
                raise PlacementError(f"{head}, but a world size only from {other[1]} ({other[2]}): "
                                     f"one launcher must give both; pass --world-size N")
            raise PlacementError(f"no world size: {head}; pass --world-size N")
    else:                                             # --rank: the size from any launcher
        other = next((entry for entry in LAUNCHERS if _set(environ, entry[1])), None)
        if other is None:
            raise PlacementError("no world size: pass --world-size N, or start the worker under a "
                                 "launcher that sets one of " +
                                 ", ".join(v for _, v, _ in LAUNCHERS if v))
        _, size_var, who = other
        world_size = number(environ[size_var], size_var)
        said.append(f"world size from {size_var} ({who})")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise PlacementError(f"world size {world_size} is outside 1..{MAX_WORLD_SIZE}")
    if not 0 <= rank < world_size:
        raise PlacementError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
    if connect:
        address = connect
        said.append("address from --connect")
    elif environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        host, port = environ["MASTER_ADDR"], number(environ["MASTER_PORT"], "MASTER_PORT")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"                       # an IPv6 address
        address = f"tcp://{host}:{port}"
        said.append("address from MASTER_ADDR/MASTER_PORT")
    else:
        raise PlacementError("no scheduler address: pass --connect tcp://HOST:PORT (or ipc://PATH), or set "
                             "MASTER_ADDR and MASTER_PORT")
    if not (address.startswith("ipc://") and len(address) > len("ipc://")):   # a local scheduler's socket
        check_address(address, "--connect", can_bind_any=False)
    return Placement(rank, world_size, address, ", ".join(said))


def check_address(address: str, flag: str, can_bind_any: bool = True) -> None:
    """A ZeroMQ TCP endpoint tcp://HOST:PORT with a numeric port (0, any free port, only to bind)."""
    if not address.startswith("tcp://"):
        raise PlacementError(f"{flag} {address!r}: want tcp://HOST:PORT")
    host, sep, port = address[len("tcp://"):].rpartition(":")
    low = 0 if can_bind_any else 1
    if (not sep or not host or not _DIGITS.fullmatch(port) or len(port) > _LONGEST
            or not low <= int(port) <= 65535):     # digits 0-9 only: not "+80" nor "\u0668\u0660"
        raise PlacementError(f"{flag} {address!r}: want tcp://HOST:PORT with a port in {low}..65535")
    if " " in host or host.strip("[]") == "":
        raise PlacementError(f"{flag} {address!r}: {host!r} is not a host name or address")


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an IP address, or localhost) is this machine only: 127.0.0.0/8, ::1, and
    the same addresses written as IPv4 mapped into IPv6 (::ffff:127.0.0.1). A name or an
    interface may reach the network: not loopback."""
    if host == "localhost":
        return True
    import ipaddress  # only where an address is judged: not loaded where flags' defaults are read
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
