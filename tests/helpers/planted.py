"""Deliberately broken recoveries and executors, planted in the engine that drives real workers, for
the tests that show `inferris-dist chaos` finds and shrinks a break (tests/test_chaos_planted.py).
Each is a DistributedEngine subclass, handed to the runs as `engine_class`."""
from __future__ import annotations

from inferris_dist.scheduler.recovery import DistributedEngine


class ShortRestore(DistributedEngine):
    """restore rebuilds the new rank's shard one page short (the last page the pool holds)."""

    def _restore(self, ranks, step: int, prepared):
        shard = self.engine.pool.slots.snapshot()[:-1]
        ranks, pids = self.group.restart(ranks, shard, step, "restore")
        return prepared, ranks, pids, len(shard), []


class LiesWhenTwoFaultsMeet(DistributedEngine):
    """Reports one token fewer for the step's first request whenever two faults fire at that
    step (whatever they are, on whichever ranks)."""

    def run(self):
        for trace in super().run():
            meeting = [f for f in self.group.faults if f.fires(trace.step)]
            if len(meeting) >= 2 and trace.executed:
                first = next(iter(trace.executed))
                executed = dict(trace.executed)
                executed[first] -= 1
                trace = trace._replace(executed=executed)
            yield trace


class BlamesTheNeighbour(DistributedEngine):
    """abort names the rank after the one that failed."""

    def _recover(self, err, prepared, in_audit: bool = False):
        if self.policy == "abort" and err.rank is not None:
            err.rank = (err.rank + 1) % self.group.world_size
            err.ranks = (err.rank,)
        return super()._recover(err, prepared, in_audit)
