"""launcher: start, watch and stop rank worker processes. Imports nothing of ours.

    workers = spawn_workers(argv_for_rank, world_size, secret)
    ...                       # poll each worker's `sentinel` fd to see it die
    stop_workers(workers, polite=send_stop)

Its names are loaded when first used: a command that forks its worker template as it starts
(launcher.template) does so before it pays for the rest (subprocess, threading, pathlib).
"""
from importlib import import_module

_WHERE = {"WORKER_MODULE": "process", "Template": "process", "WorkerProcess": "process",
          "fork_workers": "process", "spawn_workers": "process", "stop_workers": "process",
          "worker_args": "process", "make_run_dir": "rundir", "remove_run_dir": "rundir",
          "sweep_stale": "rundir",
          "CommandError": "command", "CommandProcess": "command", "command_argv": "command",
          "command_words": "command", "spawn_command": "command",
          "WorkerTemplate": "early"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
