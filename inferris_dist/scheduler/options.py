"""LaunchOptions: everything about a launch but the workload, built once (by the library or the
command line), checked once, and handed whole to the process group and the engine."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, TextIO

from inferris_dist.engine import WorkloadError
from inferris_dist.engine.rungs import rung as rung_named
from inferris_dist.launcher.command import CommandError, command_words
from inferris_dist.protocol.faults import POLICIES
from inferris_dist.protocol.limits import MAX_SECONDS, NO_EXEC_COST, ExecCost, parse_exec_cost, valid_seconds
from inferris_dist.protocol.placement import PlacementError, check_address, is_loopback_host

if TYPE_CHECKING:       # annotations only: the command line reads the defaults as it builds a parser
    from inferris_dist.launcher import Template
    from inferris_dist.observe.timeline import Timeline
    from inferris_dist.scheduler.operator import Desk
    from inferris_dist.scheduler.world import World


MAX_RESTARTS = 100_000     # recoveries one run may spend, at most (a budget like every other flag's)


class LaunchOptions(NamedTuple):
    """Everything about a launch but the workload: one set, for the library and the CLI."""
    world_size: int | None = None
    step_timeout: float = 10.0
    faults: Sequence[str] = ()
    audit_every: int = 0
    on_rank_loss: str = "abort"
    max_restarts: int = 3
    wire_log: str | Path | TextIO | None = None
    timeline: Timeline | None = None
    listen: str | None = None           # bind here and wait for workers someone else starts
    keys: str | Path | None = None      # CURVE key directory (inferris-dist keys)
    join_timeout: float = 60.0
    rejoin_timeout: float = 30.0
    # told (address, ranks, timeout, rejoin) when the group waits for members to join
    on_waiting: Callable[[str, list[int], float, bool], None] | None = None
    rung: str = "full"                  # the mechanism ladder's rung (SPEC §6)
    name: str = ""                      # the workload's name, for the wire log and the page
    start_timeout: float = 20.0         # a worker we start must finish its handshake by then
    use_template: bool = True           # fork workers from a template (else a fresh interpreter each)
    template: Template | None = None    # a started template shared between runs: forked from, left
                                        # running (its starter closes it); None: the group's own
    run_dir: Path | None = None         # a run directory made already (make_run_dir), the workers'
                                        # logs and socket go in it; its maker removes it. None: the
                                        # group's own
    secret: bytes | None = None         # the run secret spawned workers prove they hold; None: a
                                        # fresh one (the command line makes it as it starts, to
                                        # have the template fork the workers ahead with it)
    spin_us: int | None = None          # spin before sleeping in a gather; None: 2000 while the
                                        # ranks leave a core free for the scheduler, else 0
    bind: str = "local"                 # where spawned workers connect: "local" (a private unix
                                        # socket) or tcp://ADDR (port 0 picked)
    exec_cost: ExecCost | str = NO_EXEC_COST   # each rank takes this long to execute a step (a
                                        # model's time); text as --exec-cost takes it ("1ms"): see read

    min_world_size: int = 1             # shrink: the fewest ranks the run goes on with (mechanism 14)
    regrow: bool = False                # shrink: start replacements in the background, admit them
                                        # when ready, back to the requested world size
    operator: Desk | None = None        # pause: the desk instructions come to (operator.py)
    world: World | None = None          # a warm world (world.py): workers a run before left running,
                                        # configured again; handed back if the run ends whole
    worker: str | None = None           # a worker command to start each rank with (launcher/command.py:
                                        # "{connect}", "{rank}", "{world_size}" filled in, the run
                                        # secret on its stdin); None: the project's own worker

    def read(self) -> "LaunchOptions":
        """These options with what was given as text read: `exec_cost` (WorkloadError when it
        does not parse). `launch` reads them before it checks them."""
        if not isinstance(self.exec_cost, str):
            return self
        try:
            return self._replace(exec_cost=parse_exec_cost(self.exec_cost))
        except ValueError as e:
            raise WorkloadError(f"exec_cost {self.exec_cost!r}: {e}") from None

    def check(self) -> None:
        """Refuse, as bad input (WorkloadError), options that cannot work together."""
        for name in ("audit_every", "max_restarts", "min_world_size"):
            if type(getattr(self, name)) is not int:
                raise WorkloadError(f"{name} must be an int, got {getattr(self, name)!r}")
        if not isinstance(self.exec_cost, ExecCost):
            raise WorkloadError(f"exec_cost must be an ExecCost or its text (\"1ms+2us/token\"), "
                                f"got {self.exec_cost!r}")
        for name in ("step_timeout", "join_timeout", "rejoin_timeout"):
            if not valid_seconds(getattr(self, name)):
                raise WorkloadError(f"{name} must be a number of seconds > 0 and <= {MAX_SECONDS:g}, "
                                    f"got {getattr(self, name)!r}")
        rung_named(self.rung)
        if self.on_rank_loss not in POLICIES:
            raise WorkloadError(f"unknown --on-rank-loss {self.on_rank_loss!r}; one of {', '.join(POLICIES)}")
        if self.on_rank_loss == "pause" and self.operator is None:
            raise WorkloadError("--on-rank-loss pause waits for an operator's instruction: it needs "
                                "--serve (the operator's API is served there)")
        if self.min_world_size < 1:
            raise WorkloadError("--min-world-size must be >= 1")
        if self.regrow and self.on_rank_loss != "shrink":
            raise WorkloadError("--regrow grows back a world that shrank: it needs --on-rank-loss shrink")
        if self.regrow and self.listen is not None:
            raise WorkloadError("--regrow starts replacements here; with --listen nobody here starts "
                                "workers")
        if self.audit_every < 0:
            raise WorkloadError("--audit-every must be >= 0")
        if self.max_restarts < 0:
            raise WorkloadError("--max-restarts must be >= 0")
        if self.max_restarts > MAX_RESTARTS:
            raise WorkloadError(f"--max-restarts {self.max_restarts}: at most {MAX_RESTARTS} (each restart "
                                f"starts processes and replays a step: a run that needs more is not "
                                f"recovering)")
        if self.worker is not None:
            if self.listen is not None:
                raise WorkloadError("--worker starts the workers here; --listen waits for workers "
                                    "someone else starts: give one or the other")
            try:
                command_words(self.worker)
            except CommandError as e:
                raise WorkloadError(str(e)) from None
        if self.keys is not None and self.listen is None:
            raise WorkloadError("--keys needs --listen (ranks spawned here use a fresh run secret)")
        if self.listen is not None:
            try:
                check_address(self.listen, "--listen")
            except PlacementError as e:
                raise WorkloadError(str(e)) from None
            if self.keys is None and not is_loopback(self.listen):
                raise WorkloadError(f"--listen {self.listen} is not a loopback address: pass --keys DIR "
                                    f"(make them with `inferris-dist keys DIR --world-size N`); "
                                    f"nothing crosses a network in plaintext")


    def check_for(self, workload) -> None:
        """Refuse options that cannot work with this workload: a model time (`exec_cost`) that
        does not fit the step timeout at the workload's largest step would have a healthy rank
        reported as giving no answer."""
        if self.min_world_size > workload.config.world_size:
            raise WorkloadError(f"--min-world-size {self.min_world_size} is above the world size "
                                f"{workload.config.world_size}: the run could never start")
        largest = workload.config.max_step_tokens
        cost = self.exec_cost.seconds(largest) if self.exec_cost else 0.0
        if cost >= self.step_timeout:
            raise WorkloadError(f"--exec-cost {self.exec_cost} takes {cost:g} s at the workload's largest "
                                f"step ({largest} tokens), not within --step-timeout {self.step_timeout:g}: "
                                f"a healthy rank would be reported as giving no answer")


def is_loopback(address: str) -> bool:
    return is_loopback_host(address[len("tcp://"):].rpartition(":")[0].strip("[]"))
