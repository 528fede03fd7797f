"""inferris_dist: the engine's executor on real processes, and the command line.

    import inferris_dist
    with inferris_dist.launch(workload, world_size=4, faults=["1:crash@2"],
                              on_rank_loss="restore") as engine:
        for trace in engine.run():
            ...
        engine.take_recoveries()        # what failed, and what was done about it

`inferris_dist.testing` runs and judges such runs for your own tests (docs/library.md).
"""
import importlib

__version__ = "0.1.0"      # the one place the version is written (pyproject.toml reads it)

# Imported on first use: a rank worker (inferris_dist.rank) must not load the control plane.
_LAZY = {"ProcessGroup": "scheduler.group", "LaunchOptions": "scheduler.entry",
         "launch": "scheduler.entry", "DistributedEngine": "scheduler.recovery",
         "Recovery": "scheduler.recovery",
         "Fault": "protocol.faults", "KINDS": "protocol.faults", "POLICIES": "protocol.faults",
         "EngineError": "engine.errors", "WorkloadError": "engine.errors", "RankLost": "engine.errors",
         "GroupViolation": "engine.errors", "BoundaryViolation": "engine.errors",
         "ShardDivergence": "engine.errors", "MachineFailure": "engine.errors"}
_MODULES = {"testing", "engine"}


def __getattr__(name: str):
    if name in _MODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'inferris_dist' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["BoundaryViolation", "DistributedEngine", "EngineError", "Fault", "GroupViolation", "KINDS",
           "LaunchOptions", "MachineFailure", "POLICIES", "ProcessGroup", "RankLost", "Recovery",
           "ShardDivergence", "WorkloadError", "launch", "testing"]
