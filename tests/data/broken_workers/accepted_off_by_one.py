"""Reports one draft more accepted on its first item, at step 3 only."""
import sys

from _base import main
from _outcomes import EditsOutcomes


class AcceptedOff(EditsOutcomes):
    def edit(self, step, outcomes):
        if step != 3 or not outcomes:
            return outcomes
        return (outcomes[0]._replace(accepted=outcomes[0].accepted + 1),) + outcomes[1:]


sys.exit(main(AcceptedOff))
