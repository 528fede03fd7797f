"""Carries out a plan delivered twice twice: it keeps no record of the plans it answered."""
import sys

from _base import MsgType, Worker, main, wire


class Twice(Worker):
    def serve(self):
        while True:
            header, body = self.recv()
            self.epoch = header.epoch
            if header.type is MsgType.PLAN:
                self.answer(body)
            elif header.type is MsgType.AUDIT:
                snapshot = self.executor.shard.snapshot()
                self.send(MsgType.SHARD, header.step, wire.encode_body(MsgType.SHARD, snapshot))
            elif header.type is MsgType.STOP:
                return


sys.exit(main(Twice))
