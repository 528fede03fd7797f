"""Dies (exit 1, no word on the wire) when the plan of step 2 comes."""
import os
import sys

from _base import Worker, main


class Dies(Worker):
    def answer(self, plan):
        if plan.step == 2:
            os._exit(1)
        super().answer(plan)


sys.exit(main(Dies))
