"""inferris_dist: the engine's executor on real processes, and the command line.

    with inferris_dist.launch(workload, world_size=4) as engine:
        for trace in engine.run():
            ...
"""
from .group import ProcessGroup
from .launch import LaunchOptions, launch
from .recovery import DistributedEngine

__all__ = ["DistributedEngine", "LaunchOptions", "ProcessGroup", "launch"]
