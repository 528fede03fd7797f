"""Ignores STOP and SIGTERM: only SIGKILL ends it."""
import signal
import sys

from _base import MsgType, Worker, main, wire


class Deaf(Worker):
    def serve(self):
        while True:
            header, body = self.recv()
            self.epoch = header.epoch
            if header.type is MsgType.PLAN:
                self.answer(body)
            elif header.type is MsgType.AUDIT:
                self.send(MsgType.SHARD, header.step,
                          wire.encode_body(MsgType.SHARD, self.executor.shard.snapshot()))


signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(main(Deaf))
