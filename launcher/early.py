"""The worker template a command that spawns workers makes as it starts, and its run directory.

A command line that will start rank workers (`inferris-dist launch`, `compare`) makes this
first, before it parses its flags, reads its workload or imports the control plane: it forks
itself into the template (template.fork_template: one thread, no ZeroMQ yet, nothing to
inherit but its own code), whose imports then run meanwhile, on a core of their own where
there is one. Once the workload is read the template forks the run's workers ahead, with the
run secret made here, while the control plane is imported: they connect to the run's socket
and wait for the scheduler to bind it (the group's first start takes them; any it does not ask
for are killed). Only the standard library is imported here before the fork.
"""
from __future__ import annotations

import os
import signal
import sys

AHEAD_PER_CORE = 4    # workers forked ahead at most, per core: more only compete with the
                      # scheduler's imports for the cores (a bigger run forks its own when it starts)


class WorkerTemplate:
    """The run directory, the template the run's workers fork from, and the run secret, made as
    the command starts; gone when it ends (close). Without a template when none can be made
    (each worker then starts afresh)."""

    def __init__(self, run_dir, template, secret: bytes, cores: int):
        self.run_dir, self.template, self.secret, self.cores = run_dir, template, secret, cores

    @classmethod
    def begin(cls, cores: int) -> WorkerTemplate:
        """Make the run directory and the template: this process forked into it when it may be
        (`forkable`), else a fresh interpreter started. `cores`: those this process may run on
        (protocol.limits.usable_cores; launcher imports nothing of ours), which bound the
        workers forked ahead."""
        from inferris_dist.launcher.rundir import make_run_dir, remove_run_dir
        from inferris_dist.launcher.template import WORKER_MODULE, fork_template
        run_dir = make_run_dir()             # the run's: the group's workers log in it too
        secret = os.urandom(32)
        pid = sock = template = None
        try:
            if forkable():
                try:
                    pid, sock = fork_template(WORKER_MODULE, str(run_dir / "template.log"))
                except OSError:
                    pass
            from inferris_dist.launcher.process import Template
            if sock is not None:
                template = Template.of_fork(pid, sock, run_dir)
                return cls(run_dir, template, secret, cores)
            template = Template(log_dir=run_dir)        # a fresh interpreter, then
            try:
                template.begin()
            except OSError:
                template.close()
                template = None
            return cls(run_dir, template, secret, cores)
        except BaseException:       # interrupted before the caller holds what was made: undone
            if template is not None:
                template.close()
            elif pid is not None:
                sock.close()                              # the template sees its end and goes
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            remove_run_dir(run_dir)
            raise

    @property
    def max_ahead(self) -> int:
        """Workers forked ahead at most: as many as the cores can start while the control plane
        is imported."""
        return AHEAD_PER_CORE * self.cores

    def fork_ahead(self, world_size: int) -> None:
        """Ask the template for the run's first workers now, as the group's first start will
        ask for them (the same arguments), unless there are more than max_ahead."""
        if self.template is None or not 1 <= world_size <= self.max_ahead:
            return
        try:
            self.template.fork_ahead_for(self.run_dir, world_size, self.secret)
        except OSError:
            pass                             # the group asks again, the usual way, and says why

    def options(self, step_timeout: float) -> dict:
        """As LaunchOptions fields; a fork not answered within the step timeout gives it up."""
        if self.template is not None:
            self.template.answer_timeout = min(self.template.start_timeout, step_timeout)
        return {"template": self.template, "run_dir": self.run_dir, "secret": self.secret}

    def close(self) -> None:
        from inferris_dist.launcher.rundir import remove_run_dir
        if self.template is not None:
            self.template.close()
        remove_run_dir(self.run_dir)


def forkable() -> bool:
    """May this process fork itself into a template: one thread, and no ZeroMQ loaded (no
    context, no I/O thread). A command line as it starts; not a library caller's process,
    which may hold threads (and their locks) a fork would copy stopped."""
    threading = sys.modules.get("threading")
    return "zmq" not in sys.modules and (threading is None or threading.active_count() == 1)
