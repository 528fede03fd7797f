"""inferris_dist: the engine's executor on real processes, and the command line.

    with inferris_dist.launch(workload, world_size=4) as engine:
        for trace in engine.run():
            ...
"""
import importlib

# Imported on first use: a rank worker (inferris_dist.rank) must not load the control plane.
_LAZY = {"ProcessGroup": "scheduler.group", "LaunchOptions": "scheduler.entry",
         "launch": "scheduler.entry", "DistributedEngine": "scheduler.recovery"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferris_dist' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = ["DistributedEngine", "LaunchOptions", "ProcessGroup", "launch"]
