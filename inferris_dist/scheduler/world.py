"""A warm world: workers kept between runs, still connected and READY.

Runs one after another (chaos's schedules) need not start their workers each time. A `World`
is lent to each run (`LaunchOptions.world`); it holds the socket the workers are connected to,
the run directory they write their logs in, the run secret they proved, and the members the
run before handed back. A run that takes it:

- configures each kept member again, in its own first epoch (CONFIG between runs, protocol
  §8.6): the shard, scripts, faults and model time of a run before are gone, the rank and
  world size are the header's;
- starts only the ranks it lacks (a kept member that does not say READY is replaced, not
  blamed: the run has not begun), and stops the members it has no rank for;
- at its end hands back the members it still trusts: only after a run that ended whole (the
  last audit joined, no plan in flight), and only those alive, never blamed for a failure,
  none of whose replies was dropped (a stale or duplicate reply is a member that misbehaved).

Whatever else the run started, it stops as any run does; its wire log, recoveries and leftover
checks are its own. The workers it starts are forked from a template that outlives the runs:
the one the runs share (`LaunchOptions.template`), or the world's own. The world's lender
closes it: its members are asked to stop (STOP, then a signal after a second), the socket and
its template closed and the run directory removed.
"""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import zmq

from inferris_dist.launcher import Template, make_run_dir, remove_run_dir, stop_workers
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType

if TYPE_CHECKING:
    from inferris_dist.launcher import WorkerProcess
    from inferris_dist.scheduler.channel import Member
    from inferris_dist.scheduler.transport import Transport


class Kept(NamedTuple):
    """A member a run handed back: its connection and proof, and its process."""
    member: Member
    worker: WorkerProcess


class World:
    """Workers kept between runs (see above). A context manager; `close` is idempotent."""

    def __init__(self, run_dir: Path | None = None):
        self.run_dir = run_dir if run_dir is not None else make_run_dir()
        self.secret = secrets.token_bytes(32)
        self.transport: Transport | None = None     # open, with the kept members connected
        self.kept: list[Kept] = []                  # by rank in the run that handed them back
        self.runs = 0            # runs that took members from it
        self.reused = 0          # members those runs took instead of starting a worker
        self.template: Template | None = None       # the world's own, when no shared one is lent

    def template_for(self, start_timeout: float, answer_timeout: float) -> Template | None:
        """The template the world's workers are forked from, started at the first ask: it must
        outlive every run (a forked worker dies with its template). None if it cannot start."""
        if self.template is not None and not self.template.alive():
            self.template.close()
            self.template = None
        if self.template is None:
            template = Template(log_dir=self.run_dir, start_timeout=start_timeout,
                                answer_timeout=answer_timeout)
            try:
                template.start()
            except OSError:
                template.close()
                return None
            self.template = template
        return self.template

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The kept workers' pids: running on purpose between runs."""
        return [k.worker.pid for k in self.kept]

    def take(self) -> tuple[Transport | None, list[Kept]]:
        """What a run starts from: the open socket (None: the run opens its own) and the members
        kept on it. The world holds nothing until the run hands something back."""
        transport, kept = self.transport, self.kept
        self.transport, self.kept = None, []
        if transport is not None:
            self.runs += 1
        return transport, kept

    def give(self, transport: Transport, kept: list[Kept]) -> None:
        """A run that ended whole hands back its socket and the members it trusts."""
        self.transport, self.kept = transport, kept

    def close(self) -> None:
        kept, transport = self.kept, self.transport
        self.kept, self.transport = [], None
        if kept:
            def polite() -> None:          # one that cannot be told gets the signal that follows
                stop = wire.encode_body(MsgType.STOP, ())
                for k in kept:
                    header = wire.encode_header(MsgType.STOP, 0, 0, k.member.rank, len(kept))
                    transport.send([k.member.identity, header, stop], zmq.NOBLOCK)
            stop_workers([k.worker for k in kept], polite=polite if transport is not None else None,
                         grace=1.0, term_wait=1.0)
        if transport is not None:
            transport.close()
        if self.template is not None:
            self.template.close()
            self.template = None
        if self.run_dir is not None:
            remove_run_dir(self.run_dir)
            self.run_dir = None
