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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    address: str
    said: str            # where each value came from, for the worker's one line

    def line(self) -> str:
        return f"rank {self.rank} of {self.world_size}, scheduler at {self.address} ({self.said})"


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise PlacementError(f"{what} is {text!r}, not an integer") from None


def place(rank: int | None, world_size: int | None, connect: str | None,
          environ: Mapping[str, str]) -> Placement:
    said = []
    if rank is not None:
        said.append("rank from --rank")
    else:
        for rank_var, _, who in LAUNCHERS:
            if environ.get(rank_var, "") != "":
                rank = _int(environ[rank_var], rank_var)
                said.append(f"rank from {rank_var} ({who})")
                break
        else:
            raise PlacementError("no rank: pass --rank R, or start the worker under a launcher that "
                                 "sets one of " + ", ".join(v for v, _, _ in LAUNCHERS))
    if world_size is not None:
        said.append("world size from --world-size")
    else:
        for _, size_var, who in LAUNCHERS:
            if size_var is not None and environ.get(size_var, "") != "":
                world_size = _int(environ[size_var], size_var)
                if said[-1].endswith(f"({who})"):      # the same launcher said both
                    said[-1] = said[-1].replace(" (", f" and world size from {size_var} (")
                else:
                    said.append(f"world size from {size_var} ({who})")
                break
        else:
            raise PlacementError("no world size: pass --world-size N (a Kubernetes indexed Job "
                                 "does not say it)")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise PlacementError(f"world size {world_size} is outside 1..{MAX_WORLD_SIZE}")
    if not 0 <= rank < world_size:
        raise PlacementError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
    if connect:
        address = connect
        said.append("address from --connect")
    elif environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        host, port = environ["MASTER_ADDR"], _int(environ["MASTER_PORT"], "MASTER_PORT")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"                       # an IPv6 address
        address = f"tcp://{host}:{port}"
        said.append("address from MASTER_ADDR/MASTER_PORT")
    else:
        raise PlacementError("no scheduler address: pass --connect tcp://HOST:PORT, or set "
                             "MASTER_ADDR and MASTER_PORT")
    check_address(address, "--connect", can_bind_any=False)
    return Placement(rank, world_size, address, ", ".join(said))


def check_address(address: str, flag: str, can_bind_any: bool = True) -> None:
    """A ZeroMQ TCP endpoint tcp://HOST:PORT with a numeric port (0, any free port, only to bind)."""
    if not address.startswith("tcp://"):
        raise PlacementError(f"{flag} {address!r}: want tcp://HOST:PORT")
    host, sep, port = address[len("tcp://"):].rpartition(":")
    low = 0 if can_bind_any else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        raise PlacementError(f"{flag} {address!r}: want tcp://HOST:PORT with a port in {low}..65535")
    if " " in host or host.strip("[]") == "":
        raise PlacementError(f"{flag} {address!r}: {host!r} is not a host name or address")
