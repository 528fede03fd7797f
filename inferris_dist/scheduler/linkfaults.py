"""The link faults as a layer around the transport: what the link (`link.py`) does to each
message, carried out on the socket and said with the message.

Made only for a run with link faults; a run without them sends and reads through the
transport alone. Sends: a plan the link loses is never sent, a delayed one is held and sent
when it comes due, a duplicated one is sent twice, a reordered one is held until the next
message to its rank has gone, and a partition is noted when it begins. Receipts: a result
the link loses is logged and never read, a delayed one is held and handed over when it comes
due (marked LINK_DONE: the link acted on it already), a duplicated one is read twice. Whatever
the link did is told to the recorder with the message (`link`: lost, delayed, duplicated,
reordered) and noted with the attempt it did it to.
"""
from __future__ import annotations

import zmq

from inferris_dist.observe.recorder import Recorder
from inferris_dist.observe.records import StepRecord
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType
from inferris_dist.scheduler.link import Link
from inferris_dist.scheduler.transport import LINK_DONE, Transport


class LinkFaults:
    def __init__(self, link: Link, transport: Transport, recorder: Recorder):
        self.link = link
        self.transport = transport
        self.recorder = recorder
        self.next_due = link.next_due       # when the first message it holds comes due
        self.forget = link.forget           # a member retired: what the link held for it goes

    def send(self, rank: int, kind: MsgType, step: int, epoch: int, member, header: bytes, body: bytes,
             decoded, extra: tuple[bytes, ...], flags: int, record: StepRecord | None) -> None:
        """A message to `rank` through the link: it crosses, or is lost, held (delayed, reordered)
        or duplicated. Raises what the transport raises when it cannot be sent (AttributeError:
        `rank` has no member), as a send without the link does."""
        what, seconds = self.link.outgoing(rank, kind, step)
        frames = [member.identity, header, body, *extra]
        if what is None or what == "duplicated":
            self.transport.send(frames, flags)
        if what is None:
            self.recorder.sent(rank, epoch, step, kind, len(header), len(body), decoded)
            self._release_reordered(rank)
            return
        for cut_rank, cut_step, cut_s in self.link.partitions:
            self.recorder.partition(cut_rank, cut_step, epoch, cut_s)
            self.recorder.link_note(record, cut_rank, epoch, f"the link cut rank {cut_rank} off for "
                                    f"{cut_s:g} s (everything to and from it lost)")
        self.link.partitions.clear()
        if what == "delayed" and not self.link.hold_out(rank, frames, seconds):
            what = "lost"                      # the link holds no more: it loses the message
        elif what == "reordered":
            self.link.reorder(rank, frames)
        self.recorder.sent(rank, epoch, step, kind, len(header), len(body), decoded, link=what)
        self.recorder.link_note(record, rank, epoch, _did(what, seconds, f"the {kind.name} of step "
                                                                    f"{step} to rank {rank}"))
        if what == "duplicated":
            try:
                self.transport.send(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            self.recorder.sent(rank, epoch, step, kind, len(header), len(body), decoded, link=what)
            self._release_reordered(rank)

    def _release_reordered(self, rank: int) -> None:
        """A message to `rank` crossed: the plans the link held back for it cross after it."""
        for frames in self.link.after_next(rank):
            try:
                self.transport.send(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def due(self) -> list:
        """What the link delays and is due now: sends go out, receipts are handed over as if
        they came now (marked: the link acted on them already)."""
        for held in self.link.due_out():
            try:
                self.transport.send(held.frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                continue                       # its member is gone: lost with it
            self._release_reordered(held.rank)
        return [(held.frames, LINK_DONE) for held in self.link.due_in()]

    def received(self, rank: int, header: wire.Header, came: list[bytes], body: bytes,
                 epoch: int) -> str | None:
        """What the link does to a message from `rank` (`came`: as it came, `body`: its body)
        that the transport read: None (it is read now), "lost" or "delayed" (not read now: it
        is logged here, and a delayed one is handed over when due) or "duplicated" (read twice)."""
        what, seconds = self.link.incoming(rank, header.type, header.step)
        if what is None:
            return None
        if what == "delayed" and not self.link.hold_in(rank, came, None, seconds):
            what = "lost"
        said = f"the {header.type.name} of step {header.step} from rank {rank}"
        self.recorder.link_note(None, rank, epoch, _did(what, seconds, said))
        if what != "duplicated":
            self.recorder.link_in(rank, header, body, what)
        return what


def _did(what: str, seconds: float, message: str) -> str:
    """What the link did to `message`, in words."""
    if what == "delayed":
        return f"the link delayed {message} by {seconds:g} s"
    if what == "reordered":
        return f"the link held back {message} until after the next message to it"
    return f"the link {what} {message}"
