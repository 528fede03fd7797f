"""The one-shot faults' bookkeeping: what each rank's members said fired, and the garbled
replies they announced.

A one-shot fault fires once in the run: a worker says FIRED (its fault texts) before it acts
one out, even one that kills it. What each rank's members said fired is kept, from members
and retired ones alike, whenever it comes: those faults are spent, and a replacement is not
configured with them. A garble fault's FIRED also announces a reply that will not decode:
the (epoch, step) of each such plan is kept in order, and the next reply of that member that
does not decode is taken for the oldest (a member answers its plans in order).

Made only for a run with rank faults: a FIRED can come only then, and a run without them
calls nothing of this.
"""
from __future__ import annotations

from collections import deque

from inferris_dist.observe.recorder import Recorder
from inferris_dist.protocol import wire
from inferris_dist.protocol.faults import kind_of
from inferris_dist.protocol.wire import MsgType

FIRED_HEAD = bytes([0x96, wire.PROTOCOL_VERSION, int(MsgType.FIRED)])   # how a FIRED's header begins
MAX_FIRED_KEPT = 1024     # fault texts kept per rank (a run's faults for it, generously)
MAX_GARBLES_OWED = 64     # garbled replies a member announced and the channel has not read yet


class OneShots:
    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.fired: dict[int, set[str]] = {}     # rank -> its one-shot faults a member said fired
        self.garbling: dict[int, deque] = {}      # rank -> (epoch, step) of each plan whose reply its
                                                  # member said it garbles, not read yet, oldest first

    def heard(self, frames: list[bytes], rank_of: dict[bytes, int], retired: dict) -> bool:
        """A FIRED from a member (or one retired since: a worker says it just before a fault
        kills it) is kept, whenever it comes: those faults are spent, and no replacement gets
        them. Peeked at by its header's first bytes (a fixarray of six, the version, the type):
        the other messages pay a slice and a compare."""
        if len(frames) != 3 or frames[1][:3] != FIRED_HEAD:
            return False
        rank = rank_of.get(frames[0])
        if rank is None and frames[0] in retired:
            rank = retired[frames[0]][0]
        if rank is None:
            return False
        try:
            header = wire.decode_header(frames[1])
            texts = wire.decode_body(MsgType.FIRED, frames[2])
        except wire.WireError:
            return False                  # not one after all: read as any other message
        if header.rank != rank:
            return False
        spent = self.fired.setdefault(rank, set())
        if len(spent) < MAX_FIRED_KEPT:
            spent.update(texts)
        if any(kind_of(text) == "garble" for text in texts):
            self.garbling.setdefault(rank, deque(maxlen=MAX_GARBLES_OWED)).append(
                (header.epoch, header.step))    # its reply to that plan will not decode
        self.recorder.totals[rank].bytes_received += len(frames[1]) + len(frames[2])
        self.recorder.received(rank, header.epoch, header.step, MsgType.FIRED, len(frames[2]), list(texts))
        return True

    def owed(self, rank: int) -> tuple[int, int] | None:
        """The oldest garbled reply `rank`'s member announced and the channel has not read: (epoch,
        step), taken; a member answers its plans in order, so the next that does not decode is it."""
        owed = self.garbling.get(rank)
        return owed.popleft() if owed else None

    def forget(self, rank: int) -> None:
        """A new member holds `rank`: it has announced nothing."""
        self.garbling.pop(rank, None)

    def drop_announced_garble(self, rank: int, frames: list[bytes], why: str, epoch: int) -> bool:
        """Whether `rank`'s message, which does not decode (`why`), is the garbled reply its
        member announced (FIRED) in an epoch gone by (the run is in `epoch`): a kept member's,
        read only after the restore began (while its step is awaited again, or while the ranks
        replaced are admitted). Then it is dropped and said, logged as a stale RESULT (a garble
        is a reply to a plan) of the epoch and step it was announced for (it names none itself);
        else nothing is done."""
        owed = self.garbling.get(rank)
        if not owed or owed[0][0] >= epoch:
            return False
        announced, answers = self.owed(rank)
        self.recorder.broken(rank, announced, answers, MsgType.RESULT, sum(map(len, frames[1:])), why,
                             dropped="stale")
        self.recorder.note(rank, epoch, f"dropped rank {rank}'s garbled reply of epoch {announced} "
                                        f"(announced then, read only now)")
        return True
