"""Implements none of protocol.md's faults profile (§11): acts out no fault its CONFIG gives it
and says no FIRED. Not a break of the required cases: the kit grades each acted-out kind
INFORMATIONAL under --profile faults."""
import sys

from _base import Worker, main


class NoFaults(Worker):
    def serve(self) -> None:
        self.faults.faults = []        # what CONFIG gave is set aside: nothing fires
        super().serve()


sys.exit(main(NoFaults))
