"""Leaves five seconds after STOP."""
import sys
import time

from _base import Worker, main


class Late(Worker):
    def serve(self):
        super().serve()
        time.sleep(5.0)


sys.exit(main(Late))
