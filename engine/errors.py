"""The ways a step can fail (SPEC §4), and the one way a workload can be refused (SPEC §1).

Each engine error carries its SPEC kind (the `error` field of the JSON error
object) and the step it happened in. The engine sets `step` when it raises;
nothing of a failed step has been committed by then.
"""


class WorkloadError(ValueError):
    """Bad input: one line naming the key, the request or the value (exit status 2)."""


class EngineError(Exception):
    """A step failed; the run stops here (exit status 1)."""

    kind = "EngineError"

    def __init__(self, message: str, step: int | None = None, rank: int | None = None,
                 epoch: int | None = None, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.message = message
        self.step = step
        self.rank = rank        # the rank it is blamed on, when one can be blamed
        self.ranks = ranks or (() if rank is None else (rank,))   # every rank involved
        self.epoch = epoch      # the executor group's epoch, on real processes

    def to_json(self) -> dict:
        out = {"error": self.kind, "message": self.message, "step": self.step}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.ranks and self.ranks != (self.rank,):
            out["ranks"] = list(self.ranks)
        if self.epoch is not None:
            out["epoch"] = self.epoch
        return out


class Irreducible(EngineError):
    """The anchor alone needs more pages than the pool has (phase 5)."""

    kind = "Irreducible"


class NeverFits(EngineError):
    """A RUNNING request owes more than the whole budget and no step can take it (the
    ladder's rungs 02 and 03, before chunked prefill)."""

    kind = "NeverFits"


class OutOfPages(EngineError):
    """No preemption victim is left while pages are short: an internal error (phase 5)."""

    kind = "OutOfPages"


class GroupViolation(EngineError):
    """The rank results do not agree exactly, or do not cover the group (phase 8). When they
    disagree, `where` (the first item and field they differ on) and `sides` (each value
    reported there, with the ranks that reported it) say what each rank reported."""

    kind = "GroupViolation"
    where: str | None = None
    sides: list | None = None

    def to_json(self) -> dict:
        out = super().to_json()
        if self.sides is not None:
            out["where"], out["sides"] = self.where, self.sides
        return out


class BoundaryViolation(EngineError):
    """The joined result does not fit the plan (phase 9)."""

    kind = "BoundaryViolation"


class ShardDivergence(EngineError):
    """A rank's page shard does not hold what the control plane's pool holds (the audit)."""

    kind = "ShardDivergence"


class RankLost(EngineError):
    """A rank died, hung past the deadline, or broke the protocol (the distributed executor)."""

    kind = "RankLost"

    def __init__(self, message: str, step: int | None = None, rank: int | None = None,
                 epoch: int | None = None, reason: str = "lost", ranks: tuple[int, ...] = ()):
        super().__init__(message, step, rank, epoch, ranks)
        self.reason = reason    # died, timeout, protocol, unreachable
        self.wavefront: list[str] = []   # at a deadline: where every rank was, a line each

    def to_json(self) -> dict:
        out = super().to_json()
        out["reason"] = self.reason
        return out


class MachineFailure(EngineError):
    """The machine said no (out of file descriptors, a full disk, a process limit): not the
    engine's fault nor a rank's. The run ends cleanly, with the error object, every worker
    stopped; or, when only an output file failed, after the run's own output."""

    kind = "MachineFailure"
