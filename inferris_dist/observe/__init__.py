"""What crossed the boundary, recorded while the run runs: the recorder the scheduler writes
to (recorder), its per-step records and per-rank totals (records), the Chrome trace
(timeline) and the numbers a serving engineer reads (metrics). Writes the wire log through
its writer (wirelog); imports the wire log, the protocol and the engine only.
"""
