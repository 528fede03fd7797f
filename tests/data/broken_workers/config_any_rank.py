"""Takes a CONFIG whatever rank and world size it is headed with."""
import sys

from _base import MsgType, Worker, main


class AnyRank(Worker):
    def recv(self, timeout_s=None):
        got = super().recv(timeout_s)
        if got is not None and got[0].type is MsgType.CONFIG:
            got = (got[0]._replace(rank=self.rank, world_size=self.world_size), got[1])
        return got


sys.exit(main(AnyRank))
