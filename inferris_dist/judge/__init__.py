"""Judging a run: what each recovery policy promises and the words of a difference (promise),
a recorded run's history judged from its wire log (check), the control plane's bookkeeping
after a committed step (invariants). Used by `compare`, `check`, chaos and the testing
library alike; reads the wire log, imports the protocol and the engine, runs nothing.
"""
