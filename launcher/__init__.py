"""launcher: start, watch and stop rank worker processes. Imports nothing of ours.

    workers = spawn_workers(argv_for_rank, world_size, secret)
    ...                       # poll each worker's `sentinel` fd to see it die
    stop_workers(workers, polite=send_stop)
"""
from .process import WORKER_MODULE, Template, WorkerProcess, fork_workers, spawn_workers, stop_workers
from .rundir import make_run_dir, remove_run_dir, sweep_stale

__all__ = ["WORKER_MODULE", "Template", "WorkerProcess", "fork_workers", "make_run_dir", "remove_run_dir",
           "spawn_workers", "stop_workers", "sweep_stale"]
