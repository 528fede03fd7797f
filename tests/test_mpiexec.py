"""A real cluster launcher: MPICH's mpiexec (Hydra, from the `mpich` package of the test
extra) starts `inferris-dist worker` N times; each takes its rank and the world size from
PMI_RANK / PMI_SIZE; the trace is the one of `run --json`.

Skipped with the reason where no mpiexec is installed.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferris_dist.protocol.keys import write_keys

from tests.helpers.external import CLI, ENV, REPO, Scheduler, run_json, stop_all

pytestmark = [pytest.mark.timeout(90), pytest.mark.procs]

PREEMPTION = REPO / "tests" / "data" / "golden" / "preemption.spec.json"
_BESIDE = Path(sys.executable).with_name("mpiexec")
MPIEXEC = str(_BESIDE) if _BESIDE.is_file() else shutil.which("mpiexec")


def _is_mpich(path: str | None) -> bool:
    if path is None:
        return False
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in done.stdout


needs_mpich = pytest.mark.skipif(not _is_mpich(MPIEXEC),
                                 reason="no MPICH mpiexec (pip install mpich, the test extra)")


def mpiexec(n: int, address: str, keys: Path) -> subprocess.Popen:
    """`mpiexec -n N inferris-dist worker` for a `--listen` scheduler at `address`."""
    argv = [MPIEXEC, "-n", str(n), *CLI, "worker", "--connect", address, "--keys", str(keys)]
    return subprocess.Popen(argv, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@needs_mpich
@pytest.mark.parametrize("n", [2, 4])
def test_mpiexec_starts_the_ranks(tmp_path, n):
    keys = tmp_path / "keys"
    write_keys(keys, n)
    want = run_json(PREEMPTION, "--world-size", n)
    procs = []
    try:
        sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", PREEMPTION,
                           "--world-size", n, "--json"])
        procs.append(sched.proc)
        address = sched.listening()
        mpi = mpiexec(n, address, keys)
        procs.append(mpi)
        status, out, err = sched.finish()
        assert status == 0, err
        assert out == want
        said, _ = mpi.communicate(timeout=20)
        assert mpi.returncode == 0, said
        for r in range(n):
            assert f"rank {r} of {n}" in said and "PMI_RANK" in said, said
    finally:
        stop_all(procs)


@needs_mpich
def test_a_crash_under_mpiexec_is_replaced_in_one_window_by_a_second_mpiexec(tmp_path):
    """Rank 1 crashes and Hydra kills every rank of its launch.
    The scheduler waits one rejoin window for all of them (each loss seen while it waits),
    spends one restart, names the first cause; a second mpiexec brings four ranks back and
    the run ends with the fault-free trace."""
    n = 4
    keys = tmp_path / "keys"
    write_keys(keys, n)
    want = run_json(PREEMPTION, "--world-size", n)
    procs = []
    try:
        sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", PREEMPTION,
                           "--world-size", n, "--json", "--on-rank-loss", "restore", "--max-restarts", 1,
                           "--fault", "1:crash@3", "--rejoin-timeout", 40])
        procs.append(sched.proc)
        address = sched.listening()
        first = mpiexec(n, address, keys)
        procs.append(first)
        sched.err.until("replacement for rank", 30)
        first.communicate(timeout=30)                     # Hydra takes the whole launch down
        for r in range(n):
            sched.err.until(f"replacement for ranks? .*{r}", 30)
        second = mpiexec(n, address, keys)
        procs.append(second)
        status, out, err = sched.finish(60)
        assert status == 0, err[-6:]
        assert out == want
        said, _ = second.communicate(timeout=20)
        assert second.returncode == 0, said
    finally:
        stop_all(procs)
