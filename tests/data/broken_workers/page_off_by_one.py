"""Reports every write one page past where it wrote it."""
import sys

from _base import main
from _outcomes import EditsOutcomes


class PageOff(EditsOutcomes):
    def edit(self, step, outcomes):
        return tuple(o._replace(writes=tuple(p + 1 for p in o.writes)) for o in outcomes)


sys.exit(main(PageOff))
